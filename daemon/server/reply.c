/*
 * reply.c: answers to a connection (conn.h). A reply is queued on the
 * connection and sent as far as the socket takes it; the rest goes when
 * the socket is writable. A client that stops reading is dropped past
 * MAX_OUT_PENDING; a reply the client's reader would refuse (over
 * max_frame_bytes) becomes an Error that says so.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "conn.h"
#include "log.h"
#include "reply.h"

/* A client that stops reading its replies is dropped past this. */
#define MAX_OUT_PENDING (64u << 20)

bool ovld_reply(ovld_conn_t *c, Ovl__Response *resp, const int *fds, unsigned nfds)
{
    uint32_t max = c->d->cfg.max_frame_bytes;
    size_t len = ovl__response__get_packed_size(resp);
    if (len > max && resp->body_case != OVL__RESPONSE__BODY_ERROR) {
        /* The client's reader would refuse it: say so instead (an Error is
         * short, and its message says which limit). */
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
        return ovld_reply_error(c, resp->id, OVL_ERR_LIMIT,
                                "the reply would be %zu bytes, over max_frame_bytes (%u)", len,
                                max);
    }
    ovl_status_t st = ovl_wire_out_append(&c->out, &resp->base, max, fds, nfds);
    if (st != OVL_OK) {
        log_error("client %" PRIu64 " (pid %d): cannot queue a reply: %s", c->id, (int)c->pid,
                  ovl_strerror(st));
        ovld_conn_close(c, "reply failed");
        return false;
    }
    st = ovl_wire_flush(c->fd, &c->out);
    if (st == OVL_ERR_AGAIN) {
        if (ovl_wire_out_pending(&c->out) > MAX_OUT_PENDING) {
            ovld_conn_close(c, "client does not read its replies");
            return false;
        }
        ovld_conn_update_poll(c);
        return true;
    }
    if (st != OVL_OK) {
        ovld_conn_close(c, st == OVL_ERR_CLOSED ? "client went away" : strerror(errno));
        return false;
    }
    ovld_conn_update_poll(c);
    return true;
}

bool ovld_reply_error(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *fmt, ...)
{
    char msg[512];
    ovld_count_error(&c->d->counters, status);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    Ovl__Error e = OVL__ERROR__INIT;
    e.status = status;
    e.message = msg;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_ERROR;
    r.error = &e;
    return ovld_reply(c, &r, NULL, 0);
}

/* Logs, sends an Error where it can, and closes the connection. */
void ovld_conn_fail(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *what)
{
    log_warn("client %" PRIu64 " (pid %d, uid %u): %s; closing the connection", c->id, (int)c->pid,
             (unsigned)c->uid, what);
    if (ovld_reply_error(c, id, status, "%s", what))
        ovld_conn_close(c, what);
}

bool ovld_reply_ok(ovld_conn_t *c, uint64_t id)
{
    Ovl__Ok ok = OVL__OK__INIT;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_OK;
    r.ok = &ok;
    return ovld_reply(c, &r, NULL, 0);
}

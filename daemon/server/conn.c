/*
 * conn.c: connections. One libuv loop; every socket is ours (accept4,
 * recvmsg, sendmsg), libuv only polls it, because libuv will not hand over
 * passed descriptors other than sockets (API-NOTES section 5) and the host
 * backend receives memfds.
 *
 * A connection's life: accepted (listen.c, SO_PEERCRED taken), Hello first
 * (version check), then requests in order, each answered in order
 * (reply.c) except an Op, which is answered through the doorbell. A
 * malformed, oversized or out-of-order frame gets an Error (where it can
 * still be sent) and closes that connection only.
 *
 * Here: accepting a descriptor into a connection (with the limits on
 * connections, per uid and in all), reading its frames, watching it for
 * what it waits for, closing it. What a frame asks is not this file's: each
 * complete frame goes up through d->conn_calls.frame (dispatch.c), and a
 * failure through d->conn_calls.fail (reply.c's ovld_conn_fail), both set
 * by ovld_server_start; nothing here names the files above.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buffers.h"
#include "conn.h"
#include "job.h"
#include "log.h"

/* Logs, sends an Error where it can, and closes the connection: reply.c's
 * ovld_conn_fail, through the call the server set (ovld.h). */
static void conn_fail(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *what)
{
    c->d->conn_calls.fail(c, id, status, what);
}

/* ------------------------------------------------- what a uid holds */

/* uid's usage, and the buffers mapped for everyone (*ret_all). A scan of
 * the connections: at most max_connections, and only on a connect or a
 * registration, which are rare next to ops. */
void ovld_conn_uid_usage(const ovld_t *d, uid_t uid, ovld_uid_usage_t *u, uint64_t *ret_all)
{
    *u = (ovld_uid_usage_t){0};
    uint64_t all = 0;
    for (const ovld_conn_t *k = d->conns; k; k = k->next) {
        all += k->reg.count;
        if (k->uid != uid)
            continue;
        u->conns++;
        u->regs += k->reg.count;
        u->bytes += k->reg.mapped_bytes;
    }
    if (ret_all)
        *ret_all = all;
}

/* --------------------------------------------------------- connections */

/* c leaves one of its comms. */
void ovld_conn_leave(ovld_conn_t *c, ovld_conn_comm_t *k, const char *why)
{
    for (ovld_conn_comm_t **pp = &c->comms; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    ovld_member_t *m = k->m;
    free(k);
    ovld_job_leave(&c->d->jobs, m, why);
}

static void on_conn_closed(uv_handle_t *h)
{
    ovld_conn_t *c = h->data;
    close(c->fd);
    c->closed = true;
    if (c->refs == 0)
        free(c);
}

/* A work item is done with the connection. */
void ovld_conn_put(ovld_conn_t *c)
{
    if (--c->refs == 0 && c->closed)
        free(c);
}

static void drop_reg(ovld_reg_t *reg, void *arg)
{
    ovld_conn_t *c = arg;
    if (ovld_buf_has_waiter(reg)) { /* a deregistration waiting for ops: nobody to answer now */
        free(ovld_buf_cancel_wait(reg));
        c->busy = false;
        c->refs--;
    }
    ovld_buf_unregister(&c->reg, reg);
}

void ovld_conn_close(ovld_conn_t *c, const char *why)
{
    if (c->closing)
        return;
    ovld_t *d = c->d;
    c->closing = true;
    log_debug("client %" PRIu64 " (pid %d): closed: %s", c->id, (int)c->pid, why);
    while (c->comms)
        ovld_conn_leave(c, c->comms, "its client closed the connection");
    ovld_registry_foreach(&c->reg, drop_reg, c);
    ovld_registry_fini(&c->reg);
    ovl_fdq_close_all(&c->fdq);
    ovl_wire_reader_free(&c->rd);
    ovl_wire_out_free(&c->out);
    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->nconns--;
    uv_poll_stop(&c->poll);
    uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

static void on_conn_io(uv_poll_t *h, int status, int events)
{
    ovld_conn_t *c = h->data;
    if (status < 0) {
        ovld_conn_close(c, uv_strerror(status));
        return;
    }
    if (events & UV_WRITABLE) {
        ovl_status_t st = ovl_wire_flush(c->fd, &c->out);
        if (st != OVL_OK && st != OVL_ERR_AGAIN) {
            ovld_conn_close(c, "write failed");
            return;
        }
        ovld_conn_update_poll(c);
    }
    if (!(events & (UV_READABLE | UV_DISCONNECT)))
        return;
    /* One recvmsg per wakeup: poll is level-triggered, so the rest comes on
     * the next round, and one busy client cannot starve the others. */
    size_t n = 0;
    ovl_status_t st = ovl_wire_recv(c->fd, &c->rd, &c->fdq, &n);
    if (st == OVL_ERR_AGAIN)
        return;
    if (st == OVL_ERR_CLOSED) {
        ovld_conn_close(c, "client closed the connection");
        return;
    }
    if (st == OVL_ERR_LIMIT && c->rd.fd_overflow) {
        char what[160];
        snprintf(what, sizeof(what),
                 "more than %u file descriptors were passed ahead of the requests that take "
                 "them (at most %u may wait)",
                 OVL_WIRE_MAX_FDS, OVL_WIRE_MAX_FDS);
        conn_fail(c, 0, OVL_ERR_LIMIT, what);
        return;
    }
    if (st == OVL_ERR_LIMIT && c->rd.failed == OVL_ERR_LIMIT) {
        char what[128];
        snprintf(what, sizeof(what), "frame larger than max_frame_bytes (%u)",
                 c->d->cfg.max_frame_bytes);
        conn_fail(c, 0, OVL_ERR_LIMIT, what);
        return;
    }
    if (st != OVL_OK) {
        char what[128];
        snprintf(what, sizeof(what), "receive failed: %s%s%s", ovl_strerror(st),
                 st == OVL_ERR_SYSTEM ? ": " : "", st == OVL_ERR_SYSTEM ? strerror(errno) : "");
        conn_fail(c, 0, st == OVL_ERR_LIMIT ? OVL_ERR_LIMIT : OVL_ERR_PROTOCOL, what);
        return;
    }
    ovld_conn_process_frames(c);
}

/* Handles the frames received, in order, until none is complete, the
 * connection closes or a request goes off the loop (busy). */
void ovld_conn_process_frames(ovld_conn_t *c)
{
    while (!c->closing && !c->busy) {
        const uint8_t *body;
        uint32_t len;
        ovl_status_t st = ovl_wire_reader_next(&c->rd, &body, &len);
        if (st == OVL_ERR_AGAIN)
            return;
        if (st == OVL_ERR_LIMIT) {
            char what[128];
            snprintf(what, sizeof(what), "frame larger than max_frame_bytes (%u)",
                     c->d->cfg.max_frame_bytes);
            conn_fail(c, 0, OVL_ERR_LIMIT, what);
            return;
        }
        if (st != OVL_OK) {
            conn_fail(c, 0, OVL_ERR_PROTOCOL, "bad frame header (magic)");
            return;
        }
        if (!c->d->conn_calls.frame(c, body, len))
            return;
    }
}

void ovld_conn_update_poll(ovld_conn_t *c)
{
    if (c->closing)
        return;
    /* While a request is served off the loop, later ones wait unread; a
     * client that hangs up is still noticed. */
    int ev = c->busy ? UV_DISCONNECT : UV_READABLE | UV_DISCONNECT;
    if (ovl_wire_out_pending(&c->out) > 0)
        ev |= UV_WRITABLE;
    if (ev != c->poll_events) {
        c->poll_events = ev;
        int e = ev ? uv_poll_start(&c->poll, ev, on_conn_io) : uv_poll_stop(&c->poll);
        if (e != 0) { /* unwatched, it would hang its client: close it */
            log_error("client %" PRIu64 " (pid %d): uv_poll_start: %s", c->id, (int)c->pid,
                      uv_strerror(e));
            ovld_conn_close(c, "cannot watch the connection");
        }
    }
}

/* Closes the connections whose Hello is overdue, and arms the timer for the
 * next deadline. */
static void on_hello_timer(uv_timer_t *t)
{
    ovld_t *d = t->data;
    uint64_t now = uv_now(d->loop), next = 0;
    ovld_conn_t *c = d->conns;
    while (c) {
        ovld_conn_t *k = c;
        c = c->next;
        if (k->hello_done || k->closing)
            continue;
        if (k->hello_deadline <= now) {
            char what[96];
            snprintf(what, sizeof(what), "no Hello within %u ms (hello_timeout_ms)",
                     d->cfg.hello_timeout_ms);
            conn_fail(k, 0, OVL_ERR_TIMEOUT, what);
        } else if (!next || k->hello_deadline < next) {
            next = k->hello_deadline;
        }
    }
    if (next)
        uv_timer_start(&d->hello_timer, on_hello_timer, next - now, 0);
}

/* Connections beyond max_connections that only root and ovld's own user
 * may take: the operator's way in while users fill max_connections. */
#define OVLD_CONNS_RESERVED 8

void ovld_conn_accept(ovld_t *d, int fd, const struct ucred *peer)
{
    struct ucred uc = *peer;
    ovld_uid_usage_t u;
    ovld_conn_uid_usage(d, uc.uid, &u, NULL);
    char why[160] = "";
    ovl_status_t refuse = OVL_OK;
    /* Root and ovld's own user may go OVLD_CONNS_RESERVED past
     * max_connections, so that users filling it cannot keep the operator
     * from `ovlctl status` and the like. */
    bool privileged = uc.uid == 0 || uc.uid == getuid();
    if (d->stopping) {
        refuse = OVL_ERR_SHUTDOWN;
        snprintf(why, sizeof(why), "ovld is shutting down");
    } else if (d->nconns >= d->cfg.max_connections &&
               (!privileged || d->nconns - d->cfg.max_connections >= OVLD_CONNS_RESERVED)) {
        refuse = OVL_ERR_LIMIT;
        if (privileged)
            snprintf(why, sizeof(why),
                     "too many connections (max_connections = %u, and the %d beyond it kept "
                     "for root and ovld's own user are taken)",
                     d->cfg.max_connections, OVLD_CONNS_RESERVED);
        else
            snprintf(why, sizeof(why),
                     "too many connections (max_connections = %u; %d more are kept for root and "
                     "ovld's own user)",
                     d->cfg.max_connections, OVLD_CONNS_RESERVED);
    } else if (u.conns >= d->cfg.max_connections_per_uid) {
        refuse = OVL_ERR_LIMIT;
        snprintf(why, sizeof(why),
                 "too many connections: uid %u has %u (max_connections_per_uid = %u)",
                 (unsigned)uc.uid, u.conns, d->cfg.max_connections_per_uid);
    }
    if (refuse != OVL_OK) {
        OVLD_COUNT(&d->counters, conns_refused, 1);
        log_warn("refused a connection from pid %d, uid %u: %s", (int)uc.pid, (unsigned)uc.uid,
                 why);
        ovld_refuse_fd(fd, refuse, why);
        return;
    }
    ovld_conn_t *c = calloc(1, sizeof(*c));
    if (!c || ovld_registry_init(&c->reg) != OVL_OK) {
        free(c);
        log_error("out of memory accepting a connection");
        close(fd);
        return;
    }
    c->d = d;
    c->fd = fd;
    c->id = ++d->next_conn_id;
    c->pid = uc.pid;
    c->uid = uc.uid;
    c->gid = uc.gid;
    snprintf(c->name, sizeof(c->name), "pid %d", (int)uc.pid);
    ovl_wire_reader_init(&c->rd, d->cfg.max_frame_bytes);
    ovl_fdq_init(&c->fdq);
    ovl_wire_out_init(&c->out);
    int rc = uv_poll_init(d->loop, &c->poll, fd);
    if (rc != 0) {
        log_error("uv_poll_init: %s", uv_strerror(rc));
        ovld_registry_fini(&c->reg);
        ovl_wire_reader_free(&c->rd);
        free(c);
        close(fd);
        return;
    }
    c->poll.data = c;
    c->hello_deadline = uv_now(d->loop) + d->cfg.hello_timeout_ms;
    if (!uv_is_active((uv_handle_t *)&d->hello_timer) ||
        uv_timer_get_due_in(&d->hello_timer) > d->cfg.hello_timeout_ms)
        uv_timer_start(&d->hello_timer, on_hello_timer, d->cfg.hello_timeout_ms, 0);
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    OVLD_COUNT(&d->counters, conns_accepted, 1);
    c->poll_events = 0;
    ovld_conn_update_poll(c);
    log_debug("client %" PRIu64 ": connected (pid %d, uid %u, gid %u)", c->id, (int)c->pid,
              (unsigned)c->uid, (unsigned)c->gid);
}

/* Answers a connection that is refused at once with an Error, and closes it. */
void ovld_refuse_fd(int fd, ovl_status_t status, const char *msg)
{
    ovl_wire_out_t o;
    ovl_wire_out_init(&o);
    Ovl__Error e = OVL__ERROR__INIT;
    e.status = status;
    e.message = (char *)msg;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.body_case = OVL__RESPONSE__BODY_ERROR;
    r.error = &e;
    if (ovl_wire_out_append(&o, &r.base, 0, NULL, 0) == OVL_OK)
        (void)ovl_wire_flush(fd, &o);
    ovl_wire_out_free(&o);
    close(fd);
}

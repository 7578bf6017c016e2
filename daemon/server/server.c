/*
 * server.c: the server's start and stop. It wires what connections hand
 * up (conn.h: each frame to dispatch.c, a failure to reply.c), starts the
 * handles the server keeps past any connection (the Hello timer, the idle
 * check), listens (listen.c), and at the end closes every connection.
 *
 * The server's files, top first (a file calls those below it, never one
 * above): server.c > dispatch.c, listen.c > info.c > reply.c > conn.c.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "buffers.h"
#include "conn.h"
#include "dispatch.h"
#include "listen.h"
#include "log.h"
#include "reply.h"

/* Answers the deregistrations whose buffers went idle during this loop
 * round (buffers.h). */
static void on_idle_check(uv_check_t *h)
{
    ovld_t *d = h->data;
    ovld_buffers_run_idle(&d->buffers);
}

ovl_status_t ovld_server_start(ovld_t *d, char *err, size_t errlen)
{
    /* What connections hand up (conn.h), before any is accepted: each
     * frame to dispatch.c, a failure to reply.c. */
    d->conn_calls = (ovld_conn_calls_t){.frame = ovld_dispatch_frame, .fail = ovld_conn_fail};
    ovld_buffers_init(&d->buffers, d->backend);
    int rc = uv_timer_init(d->loop, &d->hello_timer);
    if (rc == 0)
        rc = uv_check_init(d->loop, &d->idle_check);
    if (rc == 0) {
        d->idle_check.data = d;
        rc = uv_check_start(&d->idle_check, on_idle_check);
        uv_unref((uv_handle_t *)&d->idle_check); /* it keeps no loop alive */
    }
    if (rc != 0) {
        snprintf(err, errlen, "the server's handles: %s", uv_strerror(rc));
        return OVL_ERR_SYSTEM;
    }
    d->hello_timer.data = d;
    ovl_status_t st = ovld_listen_start(d, err, errlen);
    if (st != OVL_OK)
        return st;
    d->self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (d->self_pidfd < 0)
        log_warn("pidfd_open: %s: clients will not see when ovld exits, and give it up as soon "
                 "as its connection closes",
                 strerror(errno));
    return OVL_OK;
}

void ovld_server_stop_listening(ovld_t *d)
{
    if (!d->listening)
        return;
    ovld_listen_stop(d);
    uv_timer_stop(&d->hello_timer);
    uv_close((uv_handle_t *)&d->hello_timer, NULL);
}

void ovld_server_close(ovld_t *d)
{
    while (d->conns)
        ovld_conn_close(d->conns, "daemon shutting down");
    if (uv_is_closing((uv_handle_t *)&d->idle_check) || !d->idle_check.loop)
        return;
    uv_check_stop(&d->idle_check);
    uv_close((uv_handle_t *)&d->idle_check, NULL);
}

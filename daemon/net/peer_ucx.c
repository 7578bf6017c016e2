/*
 * peer_ucx.c: the UCX runtime of the peer transport (peer_internal.h): UCX's
 * log, the context and the worker, endpoints, active messages out, and the
 * progress driven from the loop. It calls nothing of the files above it by
 * name: what it hears goes up through the peer_ucx_cb_t it is given at its
 * start (on_am, the session's messages: peer_link.c; reap: peer.c).
 *
 * UCX in a libuv loop (API-NOTES section 4): the worker is
 * UCS_THREAD_MODE_SINGLE and only this loop thread touches it; its event fd
 * is watched with a uv_poll, and peer_ucx_drain() progresses the worker
 * until ucp_worker_arm says nothing is left. peer_ucx_drain() also runs
 * from a uv_prepare when something was posted outside a drain (the event fd
 * only wakes for new events), and from a 100 ms timer (peer.c's tick),
 * since UCX can miss a wakeup; the timer also keeps the deadlines
 * (handshakes, heartbeats, pings).
 *
 * UCX calls back from inside ucp_worker_progress (active messages, error
 * handlers, send completions); those callbacks change state and post
 * sends only. Closing links, freeing them and the calls into the rest of
 * ovld (on_down, ping completions) wait for reap() (peer.c), which runs
 * outside progress, before each progress (so that a peer's down reaches the
 * caller before a message of its next episode) and after it.
 */
#include "peer_internal.h"

#include <poll.h>
#include <stdlib.h>

#include <ucm/api/ucm.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>
#include <ucs/debug/log_def.h>

#include "clock.h"

#if defined(__SANITIZE_ADDRESS__)
#define OVLD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OVLD_ASAN 1
#endif
#endif

#define DRAIN_ROUNDS 64 /* progress/arm rounds per drain before the loop gets a turn */

/* ------------------------------------------------------------ UCX's log */

/* UCX's log handler takes no argument, so where its lines go is the one
 * piece of process state here: the reporter of the first transport that
 * runs (ovld has one; a test may have several), and how many run. Loop
 * thread only, as every call here. Lines go through it so that they reach
 * ovld's log at their level, in ovld's format, instead of UCX's own lines
 * on stderr. */
static const ovld_reporter_t *ucx_log_to;
static unsigned ucx_log_users;

static ucs_log_func_rc_t ucx_log(const char *file, unsigned line, const char *function,
                                 ucs_log_level_t level, const ucs_log_component_config_t *comp_conf,
                                 const char *fmt, va_list ap)
{
    (void)function;
    (void)comp_conf;
    const ovld_reporter_t *r = __atomic_load_n(&ucx_log_to, __ATOMIC_ACQUIRE);
    if (!r)
        return UCS_LOG_FUNC_RC_CONTINUE;
    char msg[512];
    va_list cp;
    va_copy(cp, ap);
    vsnprintf(msg, sizeof(msg), fmt, cp);
    va_end(cp);
    ovld_report_level_t lv = level <= UCS_LOG_LEVEL_ERROR  ? OVLD_REPORT_ERROR
                             : level == UCS_LOG_LEVEL_WARN ? OVLD_REPORT_WARN
                             : level <= UCS_LOG_LEVEL_INFO ? OVLD_REPORT_INFO
                                                           : OVLD_REPORT_DEBUG;
    const char *base = strrchr(file, '/');
    ovld_report(r, lv, "UCX: %s (%s:%u)", msg, base ? base + 1 : file, line);
    return UCS_LOG_FUNC_RC_STOP;
}

void ovld_peers_process_init(void)
{
    /* libucs installed these when it loaded (ucs_debug_init), the error
     * signals only when its error handling is on, and recorded what it
     * replaced: ucs_debug_disable_signal puts that back. */
    if (ucs_global_opts.handle_errors) {
        for (unsigned i = 0; i < ucs_global_opts.error_signals.count; i++)
            ucs_debug_disable_signal(ucs_global_opts.error_signals.signals[i]);
    }
    if (ucs_global_opts.debug_signo > 0)
        ucs_debug_disable_signal((int)ucs_global_opts.debug_signo);
    /* Nothing may take them again. */
    (void)ucs_global_opts_set_value("ERROR_SIGNALS", "");
#ifdef OVLD_ASAN
    /* UCX's malloc hooks replace malloc through the relocation tables;
     * AddressSanitizer then sees frees of memory it never gave out. The
     * environment (UCX_MEM_MALLOC_HOOKS) was read when libucs loaded,
     * before main: set the options themselves, before ucp_init installs
     * the hooks. */
    ucm_global_config_t mo = ucm_global_opts;
    mo.enable_malloc_hooks = 0;
    mo.enable_malloc_reloc = 0;
    ucm_set_global_opts(&mo);
#endif
}

/* -------------------------------------------------------- sending: UCX */

static void count_out(ovld_peers_t *ps, ovld_peer_t *p, size_t bytes)
{
    OVLD_COUNT(ps->counters, peer_msgs_out, 1);
    OVLD_COUNT(ps->counters, peer_bytes_out, bytes);
    if (p) {
        p->msgs_out++;
        p->bytes_out += bytes;
    }
}

sbuf_t *peer_ucx_sbuf_new(uint32_t type, const void *body, size_t len)
{
    sbuf_t *sb = malloc(sizeof(*sb) + len);
    if (!sb)
        return NULL;
    sb->next = NULL;
    sb->peer = NULL;
    sb->link = NULL;
    sb->type = type;
    sb->len = len;
    if (len)
        memcpy(sb->body, body, len);
    return sb;
}

/* UCX is done with sb (sent, or failed with its endpoint), or it was
 * never posted. */
void peer_ucx_sbuf_done(sbuf_t *sb)
{
    if (sb->peer)
        sb->peer->q_bytes -= OVLD_PEER_AM_HDR + sb->len;
    if (sb->link)
        sb->link->sends--;
    free(sb);
}

static void on_sent(void *req, ucs_status_t status, void *user_data)
{
    sbuf_t *sb = user_data;
    ovld_peers_t *ps = sb->link->ps;
    /* a failed send fails its endpoint, which its error handler says */
    if (status != UCS_OK && status != UCS_ERR_CANCELED && !sb->link->ep_failed) {
        sb->link->ep_failed = true;
        sb->link->fail_st = status;
    }
    peer_ucx_sbuf_done(sb);
    ucp_request_free(req);
    kick(ps);
}

/* Posts sb on l's UCX endpoint, in the session's name. A send UCX refuses
 * at once fails the link (reap says why). */
void peer_ucx_post(link_t *l, sbuf_t *sb)
{
    ovld_peers_t *ps = l->ps;
    ovld_peer_am_header(sb->hdr, sb->type, (uint32_t)sb->len, l->session);
    ucp_request_param_t rp = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = on_sent,
        .user_data = sb,
        /* never rendezvous: its data arrives after later eager messages,
         * and the receiver refuses it */
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    sb->link = l;
    l->sends++;
    count_out(ps, l->state == L_UP ? l->peer : NULL, OVLD_PEER_AM_HDR + sb->len);
    ucs_status_ptr_t r =
        ucp_am_send_nbx(l->ep, OVLD_PEER_AM_ID, sb->hdr, OVLD_PEER_AM_HDR, sb->body, sb->len, &rp);
    kick(ps);
    if (r == NULL) {
        peer_ucx_sbuf_done(sb);
    } else if (UCS_PTR_IS_ERR(r)) {
        if (!l->ep_failed) {
            l->ep_failed = true;
            l->fail_st = UCS_PTR_STATUS(r);
        }
        peer_ucx_sbuf_done(sb);
    }
}

/* Sends one of the transport's messages on l over UCX. */
void peer_ucx_send_msg(link_t *l, const ovld_peer_msg_t *m)
{
    uint8_t *body;
    size_t len;
    if (!l->ep || l->ep_failed)
        return;
    sbuf_t *sb = NULL;
    if (ovld_peer_encode(m, &body, &len) == OVL_OK) {
        sb = peer_ucx_sbuf_new(m->type, body, len);
        free(body);
    }
    if (!sb) {
        l->ep_failed = true;
        l->fail_st = UCS_ERR_NO_MEMORY;
        kick(l->ps);
        return;
    }
    peer_ucx_post(l, sb);
}

void peer_ucx_send_ping(link_t *l, uint64_t seq)
{
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = OVLD_PEER_PING;
    m.seq = seq;
    peer_ucx_send_msg(l, &m);
}

/* ------------------------------------------------------------ endpoints */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    link_t *l = arg;
    (void)ep;
    /* inside progress: noted here, acted on in reap */
    if (!l->ep_failed) {
        l->ep_failed = true;
        l->fail_st = status;
    }
    kick(l->ps);
}

static void on_ep_closed(void *req, ucs_status_t status, void *user_data)
{
    link_t *l = user_data;
    (void)status;
    l->ep_close_done = true;
    ucp_request_free(req);
    kick(l->ps);
}

ucs_status_t peer_ucx_ep_create(link_t *l)
{
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)l->ucx_remote,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = l},
    };
    ucs_status_t us = ucp_ep_create(l->ps->worker, &ep, &l->ep);
    if (us != UCS_OK)
        l->ep = NULL;
    return us;
}

/* Closes l's UCX endpoint (outside progress), if it has one, forced (what
 * is queued on it is given up; its sends complete with an error). */
void peer_ucx_ep_close(link_t *l)
{
    ovld_peers_t *ps = l->ps;
    if (!l->ep)
        return;
    ucp_request_param_t p = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = on_ep_closed,
        .user_data = l,
    };
    ucs_status_ptr_t r = ucp_ep_close_nbx(l->ep, &p);
    if (r == NULL) {
        l->ep_close_done = true;
    } else if (UCS_PTR_IS_ERR(r)) {
        say(ps, OVLD_REPORT_DEBUG, "peers: closing an endpoint: %s",
            ucs_status_string(UCS_PTR_STATUS(r)));
        l->ep_close_done = true;
    }
    kick(ps);
}

/* What UCX's error handler said, in words. */
void peer_ucx_failure(const link_t *l, char *why, size_t len)
{
    if (l->got_am)
        snprintf(why, len, "connection lost (UCX: %s)", ucs_status_string(l->fail_st));
    else
        /* authenticated over TCP, but nothing ever came over UCX */
        snprintf(why, len,
                 "no UCX connection (UCX: %s): can the nodes reach each other's UCX ports "
                 "(docs/multinode.md, UCX_NET_DEVICES, UCX_TCP_PORT_RANGE)?",
                 ucs_status_string(l->fail_st));
}

/* ------------------------------------------------------------- progress */

static void on_idle(uv_idle_t *h)
{
    ovld_peers_t *ps = h->data;
    uv_idle_stop(h);
    peer_ucx_drain(ps);
}

/* Progress until UCX has nothing left and the worker is armed (the event
 * fd will wake the loop), reaping around it. */
void peer_ucx_drain(ovld_peers_t *ps)
{
    if (ps->in_drain || !ps->worker)
        return;
    ps->in_drain = true;
    ps->kick = false;
    ps->ucx_cb.reap(ps);
    for (int round = 0;; round++) {
        while (ucp_worker_progress(ps->worker) != 0)
            ;
        ps->ucx_cb.reap(ps);
        if (ps->kick && round < DRAIN_ROUNDS) {
            /* posted since: progress them before arming */
            ps->kick = false;
            continue;
        }
        if (round >= DRAIN_ROUNDS) {
            /* Busy: give the loop a turn and come back without sleeping
             * (an active idle handle makes the loop poll without waiting). */
            ps->kick = true;
            uv_idle_start(&ps->idle, on_idle);
            break;
        }
        ucs_status_t st = ucp_worker_arm(ps->worker);
        if (st == UCS_OK)
            break;
        if (st != UCS_ERR_BUSY) {
            /* the timer still progresses; said once */
            if (!ps->arm_reported)
                say(ps, OVLD_REPORT_ERROR, "peers: ucp_worker_arm: %s; progressing every %d ms",
                    ucs_status_string(st), TICK_MS);
            ps->arm_reported = true;
            break;
        }
    }
    ps->in_drain = false;
}

/* The loop's handles that drive UCX (peer.c starts them): the worker's
 * event fd, and a drain before the loop sleeps when something was posted. */

void peer_ucx_on_efd(uv_poll_t *h, int status, int events)
{
    (void)status; /* an error on an epoll fd: progress anyway */
    (void)events;
    peer_ucx_drain(h->data);
}

void peer_ucx_on_prepare(uv_prepare_t *h)
{
    ovld_peers_t *ps = h->data;
    if (ps->kick)
        peer_ucx_drain(ps);
}

/* Progresses until done(ps) or ms have passed, sleeping on the event fd
 * in between: for shutdown only, when the loop has nothing else to do. */
void peer_ucx_progress_until(ovld_peers_t *ps, bool (*done)(const ovld_peers_t *), unsigned ms)
{
    uint64_t end = ovl_mono_ms() + ms;
    for (;;) {
        while (ucp_worker_progress(ps->worker) != 0)
            ;
        if (done(ps))
            return;
        uint64_t now = ovl_mono_ms();
        if (now >= end)
            return;
        if (ucp_worker_arm(ps->worker) == UCS_OK) {
            struct pollfd pfd = {.fd = ps->efd, .events = POLLIN};
            uint64_t left = end - now;
            (void)poll(&pfd, 1, left < 10 ? (int)left : 10);
        }
    }
}

/* ---------------------------------------------------------------- start */

/* UCX's own resources, in reverse order of creation (any may be absent). */
void peer_ucx_release(ovld_peers_t *ps)
{
    free(ps->ucx_addr);
    ps->ucx_addr = NULL;
    if (ps->worker)
        ucp_worker_destroy(ps->worker);
    ps->worker = NULL;
    if (ps->ctx)
        ucp_cleanup(ps->ctx);
    ps->ctx = NULL;
    if (ps->log_pushed && --ucx_log_users == 0) {
        ucs_log_pop_handler();
        __atomic_store_n(&ucx_log_to, NULL, __ATOMIC_RELEASE);
    }
    ps->log_pushed = false;
}

ovl_status_t peer_ucx_start(ovld_peers_t *ps, const peer_ucx_cb_t *cb, char *err, size_t errlen)
{
    ucs_status_t st;
    ucp_config_t *uc = NULL;
    ps->ucx_cb = *cb;
    if (ucx_log_users++ == 0) {
        __atomic_store_n(&ucx_log_to, ps->report, __ATOMIC_RELEASE);
        ucs_log_push_handler(ucx_log);
    }
    ps->log_pushed = true;
    if ((st = ucp_config_read(NULL, NULL, &uc)) != UCS_OK) {
        set_err(err, errlen, "UCX: cannot read its configuration: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    ucp_params_t up = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        /* RMA: the host backend will move data between nodes with it */
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA,
        .name = "ovld",
    };
    st = ucp_init(&up, uc, &ps->ctx);
    ucp_config_release(uc);
    if (st != UCS_OK) {
        ps->ctx = NULL;
        set_err(err, errlen, "UCX: ucp_init: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE, /* the loop thread's alone */
    };
    if ((st = ucp_worker_create(ps->ctx, &wp, &ps->worker)) != UCS_OK) {
        ps->worker = NULL;
        set_err(err, errlen, "UCX: ucp_worker_create: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    if ((st = ucp_worker_query(ps->worker, &wa)) != UCS_OK) {
        set_err(err, errlen, "UCX: ucp_worker_query: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    if (wa.max_am_header < OVLD_PEER_AM_HDR) {
        set_err(err, errlen, "UCX: active message headers of %zu bytes, ovld needs %d",
                wa.max_am_header, OVLD_PEER_AM_HDR);
        return OVL_ERR_UNSUPPORTED;
    }
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = OVLD_PEER_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = cb->on_am,
        .arg = ps,
    };
    if ((st = ucp_worker_set_am_recv_handler(ps->worker, &hp)) != UCS_OK) {
        set_err(err, errlen, "UCX: ucp_worker_set_am_recv_handler: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    if ((st = ucp_worker_get_efd(ps->worker, &ps->efd)) != UCS_OK) {
        set_err(err, errlen, "UCX: ucp_worker_get_efd: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    ucp_address_t *addr;
    size_t alen;
    if ((st = ucp_worker_get_address(ps->worker, &addr, &alen)) != UCS_OK) {
        set_err(err, errlen, "UCX: ucp_worker_get_address: %s", ucs_status_string(st));
        return OVL_ERR_SYSTEM;
    }
    if (alen == 0 || alen > OVLD_PEER_UCX_ADDR_MAX || !(ps->ucx_addr = malloc(alen))) {
        ucp_worker_release_address(ps->worker, addr);
        set_err(err, errlen, "UCX: a worker address of %zu bytes (ovld takes 1 to %u)", alen,
                OVLD_PEER_UCX_ADDR_MAX);
        return OVL_ERR_UNSUPPORTED;
    }
    memcpy(ps->ucx_addr, addr, alen);
    ps->ucx_len = alen;
    ucp_worker_release_address(ps->worker, addr);
    return OVL_OK;
}

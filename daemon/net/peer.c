/*
 * peer.c: see peer.h; the protocol is in docs/multinode.md, the files of
 * the transport in peer_internal.h. This one is the transport itself: its
 * start and close, the API of peer.h (but the remote reads: peer_rma.c),
 * the tick that keeps the deadlines and heartbeats, and reap, where what
 * happened inside UCX's progress is acted on.
 */
#include "peer_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "clock.h"

#define CLOSE_WAIT_MS 1000 /* ovld_peers_close waits this long for UCX at most */

/* ------------------------------------------------------------- reaping */

/* What happened inside UCX's progress, acted on outside it (the UCX
 * runtime calls it from drain, before each progress and after it): links
 * failed and closed, freed, and the rest of ovld told. */
static void reap(ovld_peers_t *ps)
{
    if (ps->in_reap)
        return;
    ps->in_reap = true;
    char why[WHY_MAX];
    /* links whose UCX endpoint failed */
    for (link_t *l = ps->links; l; l = l->next) {
        if (!l->ep_failed || l->state >= L_CLOSING)
            continue;
        peer_ucx_failure(l, why, sizeof(why));
        peer_link_fail(l, OVL_ERR_CLOSED, why, NULL);
    }
    /* closes due, frees done */
    uint64_t now = now_ms(ps);
    for (link_t *l = ps->links, *next; l; l = next) {
        next = l->next;
        if (l->state == L_CLOSING &&
            ((l->writes == 0 && l->sends == 0) || l->ep_failed || now >= l->deadline))
            peer_link_close(l);
        if (l->state == L_CLOSED && !l->tcp_open && l->writes == 0 &&
            (!l->ep || l->ep_close_done) && l->sends == 0) {
            peer_link_unlink(l);
            peer_link_release(l);
        }
    }
    /* the rest of ovld hears of it */
    for (ovld_peer_t *p = ps->peers; p; p = p->next) {
        if (!p->down_pending)
            continue;
        p->down_pending = false;
        if (ps->cb.on_down)
            ps->cb.on_down(ps->cb.arg, p, p->down_st, p->down_why);
    }
    for (pingw_t **pp = &ps->pings; *pp;) {
        pingw_t *w = *pp;
        if (!w->finished) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->done(w->arg, w->st, w->rtt_s, w->st == OVL_OK ? w->inst : NULL, w->why);
        free(w);
        pp = &ps->pings; /* the callback may have added pings: from the start */
    }
    peer_rma_reap(ps);
    ps->in_reap = false;
}

/* ------------------------------------------------------ loop handles */

/* Every TICK_MS: the deadlines, the heartbeats, and a progress in case
 * UCX missed a wakeup. */
static void on_tick(uv_timer_t *h)
{
    ovld_peers_t *ps = h->data;
    uint64_t now = now_ms(ps);
    uint32_t beat = ps->timeout_ms / 4;
    char why[WHY_MAX];
    peer_ucx_drain(ps);
    for (link_t *l = ps->links; l; l = l->next) {
        switch (l->state) {
        case L_CONNECTING:
            if (now >= l->deadline) {
                snprintf(why, sizeof(why),
                         "timeout: no TCP connection to %s within %" PRIu32
                         " ms (peer_timeout_ms): is the host up and the port open?",
                         l->peer->name, ps->timeout_ms);
                peer_link_fail(l, OVL_ERR_TIMEOUT, why, NULL);
            }
            break;
        case L_HELLO:
        case L_ACCEPTED:
        case L_PROVING:
            if (now >= l->deadline) {
                snprintf(why, sizeof(why),
                         "timeout: not authenticated within %" PRIu32 " ms (peer_timeout_ms)",
                         ps->timeout_ms);
                peer_link_fail(l, OVL_ERR_TIMEOUT, why, why);
            }
            break;
        case L_UP:
            if (l->tcp_open && now >= l->deadline)
                peer_tcp_close(l); /* the connector's, kept for a late Refuse */
            if (now - l->heard >= ps->timeout_ms) {
                snprintf(why, sizeof(why),
                         "timeout: not heard from for %" PRIu64 " ms (peer_timeout_ms %" PRIu32 ")",
                         now - l->heard, ps->timeout_ms);
                peer_link_fail(l, OVL_ERR_TIMEOUT, why, why);
            } else if (now - l->ping_at >= beat) {
                l->ping_at = now;
                l->ping_seq = ++ps->seq;
                l->ping_ns = ovl_mono_ns();
                peer_ucx_send_ping(l, l->ping_seq);
            }
            break;
        default:
            break;
        }
    }
    for (pingw_t *w = ps->pings; w; w = w->next) {
        if (w->finished || now < w->deadline)
            continue;
        if (w->seq)
            snprintf(why, sizeof(why), "timeout: %s did not answer within %" PRIu32 " ms",
                     w->peer->name, ps->timeout_ms);
        else
            snprintf(why, sizeof(why),
                     "timeout: no authenticated session with %s within %" PRIu32
                     " ms (peer_timeout_ms)",
                     w->peer->name, ps->timeout_ms);
        peer_ping_finish(w, OVL_ERR_TIMEOUT, 0, NULL, why);
    }
    peer_ucx_drain(ps);
}

static void on_handle_closed(uv_handle_t *h)
{
    peer_handle_gone(h->data);
}

/* ---------------------------------------------------------------- start */

ovl_status_t ovld_peers_start(uv_loop_t *loop, const ovld_config_t *cfg, const ovld_peers_cb_t *cb,
                              const ovld_reporter_t *report, ovld_counters_t *counters,
                              ovld_peers_t **ret, char *err, size_t errlen)
{
    ovl_status_t st;
    struct sockaddr_storage listen_ss, adv_ss;
    char why[200], listen_text[OVLD_ADDR_TEXT_MAX];
    if (!cfg->peer_listen[0]) {
        set_err(err, errlen, "peer_listen is not set");
        return OVL_ERR_INVALID;
    }
    if (ovld_config_addr_parse(cfg->peer_listen, &listen_ss, why, sizeof(why)) != OVL_OK) {
        set_err(err, errlen, "peer_listen %s: %s", cfg->peer_listen, why);
        return OVL_ERR_CONFIG;
    }
    ovld_peer_addr_format(&listen_ss, listen_text, sizeof(listen_text));
    const char *adv = cfg->peer_advertise[0] ? cfg->peer_advertise : cfg->peer_listen;
    ovld_peers_t *ps = calloc(1, sizeof(*ps));
    if (!ps) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    ps->loop = loop;
    ps->cb = *cb;
    ps->report = report;
    ps->counters = counters;
    ps->timeout_ms = cfg->peer_timeout_ms;
    ps->efd = -1;
    if (ovld_peer_addr_parse(adv, &adv_ss, ps->self, why, sizeof(why)) != OVL_OK) {
        set_err(err, errlen, "peer_advertise %s: %s", adv, why);
        free(ps);
        return OVL_ERR_CONFIG;
    }
    if ((st = ovld_peer_key_load(cfg->peer_key_file, &ps->key, err, errlen)) != OVL_OK) {
        free(ps);
        return st;
    }
    if (!fill_random(ps->instance, sizeof(ps->instance))) {
        set_err(err, errlen, "getrandom: %s", strerror(errno));
        sodium_memzero(&ps->key, sizeof(ps->key));
        free(ps);
        return OVL_ERR_SYSTEM;
    }
    peer_ucx_cb_t ucb = {.on_am = peer_on_am, .reap = reap};
    if ((st = peer_ucx_start(ps, &ucb, err, errlen)) != OVL_OK) {
        peer_ucx_release(ps);
        sodium_memzero(&ps->key, sizeof(ps->key));
        free(ps);
        return st;
    }
    /* The handles: from here a failure closes those that exist, and ps
     * goes with the last one. */
    uv_handle_t *hs[5] = {(uv_handle_t *)&ps->tick, (uv_handle_t *)&ps->prep,
                          (uv_handle_t *)&ps->idle, (uv_handle_t *)&ps->listener,
                          (uv_handle_t *)&ps->poll};
    int uerr;
    const char *what = "initializing the peers' loop handles";
    int made = 0;
    if ((uerr = uv_timer_init(loop, &ps->tick)) == 0 && ++made &&
        (uerr = uv_prepare_init(loop, &ps->prep)) == 0 && ++made &&
        (uerr = uv_idle_init(loop, &ps->idle)) == 0 && ++made &&
        (uerr = uv_tcp_init(loop, &ps->listener)) == 0 && ++made &&
        (uerr = uv_poll_init(loop, &ps->poll, ps->efd)) == 0 && ++made) {
        what = "listening";
        if ((uerr = uv_tcp_bind(&ps->listener, (const struct sockaddr *)&listen_ss, 0)) == 0 &&
            (uerr = uv_listen((uv_stream_t *)&ps->listener, 128, peer_on_accept)) == 0) {
            what = "starting the peers' loop handles";
            if ((uerr = uv_poll_start(&ps->poll, UV_READABLE, peer_ucx_on_efd)) == 0 &&
                (uerr = uv_timer_start(&ps->tick, on_tick, TICK_MS, TICK_MS)) == 0)
                uerr = uv_prepare_start(&ps->prep, peer_ucx_on_prepare);
        }
    }
    for (int i = 0; i < made; i++)
        hs[i]->data = ps;
    ps->handles = (unsigned)made;
    if (uerr != 0) {
        if (strcmp(what, "listening") == 0)
            set_err(err, errlen, "cannot listen for peers on %s (peer_listen): %s", listen_text,
                    uv_strerror(uerr));
        else
            set_err(err, errlen, "%s: %s", what, uv_strerror(uerr));
        ps->closing = true;
        /* the poll handle before the worker closes its event fd */
        for (int i = made - 1; i >= 0; i--)
            uv_close(hs[i], on_handle_closed);
        peer_ucx_release(ps);
        sodium_memzero(&ps->key, sizeof(ps->key));
        if (made == 0)
            free(ps);
        return uerr == UV_EADDRINUSE ? OVL_ERR_CONFIG : OVL_ERR_SYSTEM;
    }
    char inst[9];
    hex8(ps->instance, inst);
    say(ps, OVLD_REPORT_INFO,
        "peers: listening on %s, advertised as %s, instance %s, peer_timeout_ms %" PRIu32,
        listen_text, ps->self, inst, ps->timeout_ms);
    peer_ucx_drain(ps);
    *ret = ps;
    return OVL_OK;
}

/* ---------------------------------------------------------------- close */

static bool sends_done(const ovld_peers_t *ps)
{
    for (const link_t *l = ps->links; l; l = l->next)
        if (l->sends)
            return false;
    return true;
}

static bool closes_done(const ovld_peers_t *ps)
{
    for (const link_t *l = ps->links; l; l = l->next)
        if (l->sends || (l->ep && !l->ep_close_done))
            return false;
    return true;
}

void ovld_peers_close(ovld_peers_t *ps)
{
    if (!ps || ps->closing)
        return;
    ps->closing = true;
    /* Pings first: their callbacks release what waits on them. */
    while (ps->pings) {
        pingw_t *w = ps->pings;
        ps->pings = w->next;
        w->done(w->arg, OVL_ERR_SHUTDOWN, 0, NULL, "ovld is shutting down");
        free(w);
    }
    uv_close((uv_handle_t *)&ps->listener, on_handle_closed);
    char why[WHY_MAX];
    snprintf(why, sizeof(why), "ovld at %s is shutting down", ps->self);
    ovld_peer_msg_t bye = reason_msg(OVLD_PEER_BYE, OVL_ERR_SHUTDOWN, why);
    for (link_t *l = ps->links; l; l = l->next)
        if (l->state == L_UP)
            peer_ucx_send_msg(l, &bye);
    peer_ucx_progress_until(ps, sends_done, LINGER_MS);
    for (link_t *l = ps->links; l; l = l->next)
        peer_link_close(l);
    peer_ucx_progress_until(ps, closes_done, CLOSE_WAIT_MS);
    if (!closes_done(ps))
        say(ps, OVLD_REPORT_WARN, "peers: UCX did not finish closing within %d ms", CLOSE_WAIT_MS);
    /* Reads UCX has not completed: their keys go before the worker. */
    peer_rma_shutdown(ps);
    /* The poll handle goes before the worker closes its event fd; the
     * worker before what its callbacks could reach. */
    uv_close((uv_handle_t *)&ps->poll, on_handle_closed);
    peer_ucx_release(ps);
    /* With the worker gone nothing writes into the reads' buffers any
     * more: their owners hear of them now. */
    peer_rma_finish(ps);
    sodium_memzero(&ps->key, sizeof(ps->key));
    for (ovld_peer_t *p = ps->peers, *next; p; p = next) {
        next = p->next;
        peer_drop_queue(p);
        free(p);
    }
    ps->peers = NULL;
    while (ps->links) {
        link_t *l = ps->links;
        peer_link_unlink(l);
        l->sends = 0; /* a send UCX never completed went with the worker */
        if (l->tcp_open)
            l->orphan = true; /* its handle's close callback frees it */
        else
            peer_link_release(l);
    }
    free(ps->map.slot);
    ps->map.slot = NULL;
    uv_close((uv_handle_t *)&ps->tick, on_handle_closed);
    uv_close((uv_handle_t *)&ps->prep, on_handle_closed);
    uv_close((uv_handle_t *)&ps->idle, on_handle_closed);
}

/* ------------------------------------------------------------ the API */

const char *ovld_peers_self(const ovld_peers_t *ps)
{
    return ps->self;
}

const uint8_t *ovld_peers_instance(const ovld_peers_t *ps)
{
    return ps->instance;
}

bool ovld_peers_is_up_at(const ovld_peers_t *ps, const struct sockaddr_storage *addr)
{
    char name[OVLD_ADDR_TEXT_MAX];
    ovld_peer_addr_format(addr, name, sizeof(name));
    const ovld_peer_t *p = peer_find(ps, name);
    return p && p->state == PEER_UP;
}

ovl_status_t ovld_peers_get(ovld_peers_t *ps, const struct sockaddr_storage *addr,
                            ovld_peer_t **ret, char *err, size_t errlen)
{
    char name[OVLD_ADDR_TEXT_MAX];
    if (ps->closing) {
        set_err(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    if ((addr->ss_family != AF_INET && addr->ss_family != AF_INET6) ||
        ovld_config_addr_is_any(addr)) {
        set_err(err, errlen, "not a peer address: the wildcard address names no one node");
        return OVL_ERR_INVALID;
    }
    ovld_peer_addr_format(addr, name, sizeof(name));
    if (strcmp(name, ps->self) == 0) {
        set_err(err, errlen, "%s is this ovld's own address", name);
        return OVL_ERR_INVALID;
    }
    ovld_peer_t *p = peer_find(ps, name);
    if (!p) {
        if (ps->npeers >= OVLD_PEERS_MAX) {
            set_err(err, errlen, "ovld has %d peers already (OVLD_PEERS_MAX)", OVLD_PEERS_MAX);
            return OVL_ERR_LIMIT;
        }
        if (!(p = peer_new(ps, name, addr))) {
            set_err(err, errlen, "out of memory");
            return OVL_ERR_NOMEM;
        }
    }
    if (p->state == PEER_UP || p->state == PEER_CONNECTING) {
        *ret = p;
        return OVL_OK;
    }
    link_t *l = peer_link_new(ps, true);
    if (!l) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    l->peer = p;
    l->state = L_CONNECTING;
    l->creq.data = l;
    int r = 0;
    if (!fill_random(l->nonce_c, sizeof(l->nonce_c)) ||
        (r = uv_tcp_connect(&l->creq, &l->tcp, (const struct sockaddr *)&p->addr,
                            peer_on_connected)) != 0) {
        if (r)
            set_err(err, errlen, "unreachable: cannot connect to %s: %s", name, uv_strerror(r));
        else
            set_err(err, errlen, "getrandom: %s", strerror(errno));
        peer_link_close(l); /* reap frees it */
        kick(ps);
        return r ? OVL_ERR_CONNECT : OVL_ERR_SYSTEM;
    }
    p->state = PEER_CONNECTING;
    p->own = l;
    p->theirs = p->tx = NULL;
    say(ps, OVLD_REPORT_DEBUG, "peer %s: connecting", p->name);
    *ret = p;
    return OVL_OK;
}

ovl_status_t ovld_peer_send(ovld_peer_t *p, uint32_t type, const void *body, size_t len)
{
    ovld_peers_t *ps = p->ps;
    if (type < OVLD_PEER_TYPE_USER)
        return OVL_ERR_INVALID;
    if (len > OVLD_PEER_MAX_BODY)
        return OVL_ERR_LIMIT;
    if (ps->closing || (p->state != PEER_UP && p->state != PEER_CONNECTING))
        return OVL_ERR_CLOSED;
    size_t bytes = OVLD_PEER_AM_HDR + len;
    if (p->q_bytes + bytes > OVLD_PEER_QUEUE_MAX) {
        OVLD_COUNT(ps->counters, peer_dropped, 1);
        p->errors++;
        snprintf(p->last_error, sizeof(p->last_error),
                 "a message refused: %zu bytes queued or in flight, the limit is %u "
                 "(OVLD_PEER_QUEUE_MAX)",
                 p->q_bytes, OVLD_PEER_QUEUE_MAX);
        return OVL_ERR_LIMIT;
    }
    sbuf_t *sb = peer_ucx_sbuf_new(type, body, len);
    if (!sb)
        return OVL_ERR_NOMEM;
    sb->peer = p;
    p->q_bytes += bytes;
    if (p->state == PEER_UP && p->tx) {
        peer_ucx_post(p->tx, sb);
        return OVL_OK;
    }
    if (p->q_tail)
        p->q_tail->next = sb;
    else
        p->q_head = sb;
    p->q_tail = sb;
    return OVL_OK;
}

bool ovld_peer_is_up(const ovld_peer_t *p)
{
    return p->state == PEER_UP;
}

const char *ovld_peer_name(const ovld_peer_t *p)
{
    return p->name;
}

const uint8_t *ovld_peer_instance(const ovld_peer_t *p)
{
    return p->state == PEER_UP ? p->instance : NULL;
}

void ovld_peers_foreach(const ovld_peers_t *ps, void (*fn)(const ovld_peer_info_t *, void *),
                        void *arg)
{
    for (const ovld_peer_t *p = ps->peers; p; p = p->next) {
        ovld_peer_info_t i = {
            .name = p->name,
            .state = peer_state_names[p->state],
            .rtt_s = p->rtt_s,
            .msgs_in = p->msgs_in,
            .msgs_out = p->msgs_out,
            .bytes_in = p->bytes_in,
            .bytes_out = p->bytes_out,
            .errors = p->errors,
            .last_error = p->last_error,
        };
        fn(&i, arg);
    }
}

ovl_status_t ovld_peers_ping(ovld_peers_t *ps, const struct sockaddr_storage *addr,
                             ovld_peers_ping_fn done, void *arg, char *err, size_t errlen)
{
    ovld_peer_t *p;
    ovl_status_t st = ovld_peers_get(ps, addr, &p, err, errlen);
    if (st != OVL_OK)
        return st;
    pingw_t *w = calloc(1, sizeof(*w));
    if (!w) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    w->peer = p;
    w->done = done;
    w->arg = arg;
    w->deadline = now_ms(ps) + ps->timeout_ms;
    w->next = ps->pings;
    ps->pings = w;
    if (p->state == PEER_UP && p->tx) {
        w->seq = ++ps->seq;
        w->sent_ns = ovl_mono_ns();
        peer_ucx_send_ping(p->tx, w->seq);
    }
    kick(ps);
    return OVL_OK;
}

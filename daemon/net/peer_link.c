/*
 * peer_link.c: links and peers (peer_internal.h): a link's life (its TCP
 * connection, its UCX endpoint, closing, freeing), the session map, the
 * handshake's frames out, episodes (a link up, a peer down), the messages of
 * an up link, and a session's messages as UCX hands them in. The handshake
 * (peer_handshake.c) and the transport (peer.c) call it; it calls the UCX
 * runtime (peer_ucx.c) and, up, only the callbacks of peer.h.
 */
#include "peer_internal.h"

#include <stdlib.h>

#include "clock.h"

/* How a link is named in messages: its peer, else where it came from and
 * what it claims to be. */
static const char *link_label(const link_t *l, char *buf, size_t len)
{
    if (l->peer)
        snprintf(buf, len, "peer %s", l->peer->name);
    else if (l->claimed[0])
        snprintf(buf, len, "peer connection from %s (claims to be %s)", l->from, l->claimed);
    else
        snprintf(buf, len, "peer connection from %s", l->from);
    return buf;
}

/* ------------------------------------------------------------- sessmap */

static size_t sess_hash(const uint8_t *s, size_t cap)
{
    uint64_t x;
    memcpy(&x, s, sizeof(x));
    return (size_t)x & (cap - 1);
}

link_t *peer_sessmap_get(const sessmap_t *m, const uint8_t *s)
{
    if (!m->cap)
        return NULL;
    for (size_t i = sess_hash(s, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slot[i])
            return NULL;
        if (sodium_memcmp(m->slot[i]->session, s, OVLD_PEER_SESSION_LEN) == 0) /* a secret */
            return m->slot[i];
    }
}

bool peer_sessmap_put(sessmap_t *m, link_t *l)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        link_t **s = calloc(cap, sizeof(*s));
        if (!s)
            return false;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slot[i])
                continue;
            size_t j = sess_hash(m->slot[i]->session, cap);
            while (s[j])
                j = (j + 1) & (cap - 1);
            s[j] = m->slot[i];
        }
        free(m->slot);
        m->slot = s;
        m->cap = cap;
    }
    size_t i = sess_hash(l->session, m->cap);
    while (m->slot[i])
        i = (i + 1) & (m->cap - 1);
    m->slot[i] = l;
    m->n++;
    l->in_map = true;
    return true;
}

static void sessmap_del(sessmap_t *m, link_t *l)
{
    if (!l->in_map)
        return;
    l->in_map = false;
    size_t i = sess_hash(l->session, m->cap);
    while (m->slot[i] != l)
        i = (i + 1) & (m->cap - 1);
    m->slot[i] = NULL;
    m->n--;
    /* backward shift: the entries after it that probed past it move up */
    for (size_t j = (i + 1) & (m->cap - 1); m->slot[j]; j = (j + 1) & (m->cap - 1)) {
        size_t h = sess_hash(m->slot[j]->session, m->cap);
        /* j's entry may stay if its home h lies cyclically in (i, j] */
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            m->slot[i] = m->slot[j];
            m->slot[j] = NULL;
            i = j;
        }
    }
}

/* -------------------------------------------------------- sending: TCP */

static void on_written(uv_write_t *req, int status)
{
    wbuf_t *wb = req->data;
    link_t *l = wb->link;
    l->writes--;
    free(wb);
    if (status < 0 && status != UV_ECANCELED && l->state < L_CLOSING && !l->ps->closing) {
        char why[WHY_MAX];
        snprintf(why, sizeof(why), "connection closed during the handshake (write: %s)",
                 uv_strerror(status));
        peer_link_fail(l, OVL_ERR_CLOSED, why, NULL);
    }
    kick(l->ps);
}

/* Sends a handshake frame on l's TCP connection. */
void peer_frame_send(link_t *l, const ovld_peer_msg_t *m)
{
    uint8_t *body;
    size_t len;
    if (!l->tcp_open || uv_is_closing((uv_handle_t *)&l->tcp))
        return;
    if (ovld_peer_encode(m, &body, &len) != OVL_OK) {
        peer_link_fail(l, OVL_ERR_NOMEM, "out of memory", NULL);
        return;
    }
    wbuf_t *wb = malloc(sizeof(*wb) + OVLD_PEER_FRAME_HDR + len);
    if (!wb) {
        free(body);
        peer_link_fail(l, OVL_ERR_NOMEM, "out of memory", NULL);
        return;
    }
    wb->link = l;
    wb->len = OVLD_PEER_FRAME_HDR + len;
    wb->req.data = wb;
    ovld_peer_frame_header(wb->data, m->type, (uint32_t)len);
    if (len)
        memcpy(wb->data + OVLD_PEER_FRAME_HDR, body, len);
    free(body);
    uv_buf_t b = uv_buf_init((char *)wb->data, (unsigned)wb->len);
    int r = uv_write(&wb->req, (uv_stream_t *)&l->tcp, &b, 1, on_written);
    if (r != 0) {
        free(wb);
        char why[WHY_MAX];
        snprintf(why, sizeof(why), "connection closed during the handshake (write: %s)",
                 uv_strerror(r));
        peer_link_fail(l, OVL_ERR_CLOSED, why, NULL);
        return;
    }
    l->writes++;
}

/* --------------------------------------------------------------- links */

void peer_handle_gone(ovld_peers_t *ps)
{
    if (--ps->handles == 0 && ps->closing)
        free(ps);
}

void peer_link_release(link_t *l)
{
    for (held_t *h = l->held_head, *next; h; h = next) {
        next = h->next;
        free(h);
    }
    free(l->rbuf);
    free(l->ucx_remote);
    sodium_memzero(l->nonce_c, sizeof(l->nonce_c));
    sodium_memzero(l->nonce_s, sizeof(l->nonce_s));
    sodium_memzero(l->session, sizeof(l->session));
    free(l);
}

static void on_tcp_closed(uv_handle_t *h)
{
    link_t *l = h->data;
    ovld_peers_t *ps = l->ps;
    l->tcp_open = false;
    free(l->rbuf);
    l->rbuf = NULL;
    l->rlen = l->rcap = 0;
    if (l->orphan)
        peer_link_release(l);
    else
        kick(ps);
    peer_handle_gone(ps);
}

void peer_tcp_close(link_t *l)
{
    if (l->tcp_open && !uv_is_closing((uv_handle_t *)&l->tcp))
        uv_close((uv_handle_t *)&l->tcp, on_tcp_closed);
}

link_t *peer_link_new(ovld_peers_t *ps, bool outgoing)
{
    link_t *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->ps = ps;
    l->outgoing = outgoing;
    if (uv_tcp_init(ps->loop, &l->tcp) != 0) {
        free(l);
        return NULL;
    }
    l->tcp.data = l;
    l->tcp_open = true;
    ps->handles++;
    l->next = ps->links;
    if (ps->links)
        ps->links->prev = l;
    ps->links = l;
    l->deadline = now_ms(ps) + ps->timeout_ms;
    return l;
}

void peer_link_unlink(link_t *l)
{
    ovld_peers_t *ps = l->ps;
    sessmap_del(&ps->map, l);
    if (l->prev)
        l->prev->next = l->next;
    else
        ps->links = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* Closes l (outside progress): its TCP connection, and its UCX endpoint,
 * forced (what is queued on it is given up; its sends complete with an
 * error). */
void peer_link_close(link_t *l)
{
    ovld_peers_t *ps = l->ps;
    if (l->state == L_CLOSED)
        return;
    if (l->unauth) {
        l->unauth = false;
        ps->n_unauth--;
    }
    l->state = L_CLOSED;
    peer_tcp_close(l);
    peer_ucx_ep_close(l);
}

/* l leaves, with a last message if one is given: a Refuse on TCP during
 * the handshake, a Bye on UCX once up. It gets LINGER_MS to go. */
static void link_leave(link_t *l, const ovld_peer_msg_t *last)
{
    ovld_peers_t *ps = l->ps;
    if (l->state >= L_CLOSING)
        return;
    bool up = l->state == L_UP;
    if (l->unauth) {
        l->unauth = false;
        ps->n_unauth--;
    }
    l->state = L_CLOSING;
    l->deadline = now_ms(ps) + LINGER_MS;
    if (l->tcp_open && !uv_is_closing((uv_handle_t *)&l->tcp))
        uv_read_stop((uv_stream_t *)&l->tcp);
    if (last) {
        if (up)
            peer_ucx_send_msg(l, last);
        else
            peer_frame_send(l, last);
    }
    kick(ps);
}

/* ------------------------------------------------------------- peers */

ovld_peer_t *peer_find(const ovld_peers_t *ps, const char *name)
{
    for (ovld_peer_t *p = ps->peers; p; p = p->next)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

ovld_peer_t *peer_new(ovld_peers_t *ps, const char *name, const struct sockaddr_storage *addr)
{
    ovld_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->ps = ps;
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->addr = *addr;
    p->state = PEER_IDLE;
    p->next = ps->peers;
    ps->peers = p;
    ps->npeers++;
    return p;
}

void peer_ping_finish(pingw_t *w, ovl_status_t st, double rtt, const uint8_t *inst, const char *why)
{
    if (w->finished)
        return;
    w->finished = true;
    w->st = st;
    w->rtt_s = rtt;
    if (inst)
        memcpy(w->inst, inst, sizeof(w->inst));
    snprintf(w->why, sizeof(w->why), "%s", why ? why : "");
    kick(w->peer->ps);
}

/* Drops what waited for p to come up (counted). */
void peer_drop_queue(ovld_peer_t *p)
{
    ovld_peers_t *ps = p->ps;
    uint64_t n = 0;
    while (p->q_head) {
        sbuf_t *sb = p->q_head;
        p->q_head = sb->next;
        peer_ucx_sbuf_done(sb);
        n++;
    }
    p->q_tail = NULL;
    if (n) {
        OVLD_COUNT(ps->counters, peer_dropped, n);
        p->errors += n;
    }
}

/*
 * The episode of p ends: it is down, its links but cause leave (with a
 * Bye saying why, where they are up), what waited for it is dropped, its
 * pings fail, and on_down is called from reap. The caller has said why in
 * the log. Nothing for a peer that is not in an episode.
 */
static void peer_down(ovld_peer_t *p, ovl_status_t st, const char *why, link_t *cause)
{
    ovld_peers_t *ps = p->ps;
    if (p->state != PEER_CONNECTING && p->state != PEER_UP)
        return;
    p->state = PEER_DOWN;
    p->errors++;
    snprintf(p->last_error, sizeof(p->last_error), "%s", why);
    p->down_pending = true;
    p->down_st = st;
    snprintf(p->down_why, sizeof(p->down_why), "%s", why);
    char bye_why[WHY_MAX + 32];
    snprintf(bye_why, sizeof(bye_why), "down on its side: %s", why);
    ovld_peer_msg_t bye = reason_msg(OVLD_PEER_BYE, st, bye_why);
    link_t *ls[2] = {p->own, p->theirs};
    p->own = p->theirs = p->tx = NULL;
    for (int i = 0; i < 2; i++)
        if (ls[i] && ls[i] != cause)
            link_leave(ls[i], &bye);
    peer_drop_queue(p);
    for (pingw_t *w = ps->pings; w; w = w->next)
        if (w->peer == p)
            peer_ping_finish(w, st, 0, NULL, why);
    kick(ps);
}

/* p came up (tx its first link): what waited goes, in order. */
static void peer_flush(ovld_peer_t *p)
{
    ovld_peers_t *ps = p->ps;
    while (p->q_head) {
        sbuf_t *sb = p->q_head;
        p->q_head = sb->next;
        sb->next = NULL;
        peer_ucx_post(p->tx, sb);
    }
    p->q_tail = NULL;
    for (pingw_t *w = ps->pings; w; w = w->next) {
        if (w->peer != p || w->finished || w->seq)
            continue;
        w->seq = ++ps->seq;
        w->sent_ns = ovl_mono_ns();
        peer_ucx_send_ping(p->tx, w->seq);
    }
}

/*
 * l failed or was refused. One line in the log, naming the address and the
 * reason; counted. Before authentication that is a refusal, and the other
 * side is told why (refuse, if not NULL) where it can still hear it; a
 * link of an episode takes its peer down.
 */
void peer_link_fail(link_t *l, ovl_status_t st, const char *why, const char *refuse)
{
    ovld_peers_t *ps = l->ps;
    if (l->state >= L_CLOSING)
        return;
    char label[160], full[WHY_MAX + 32];
    ovld_peer_t *p = l->peer;
    bool in_episode = p && (p->own == l || p->theirs == l);
    if (l->state == L_UP) {
        say(ps, OVLD_REPORT_WARN, "peer %s: down: %s", p->name, why);
        OVLD_COUNT(ps->counters, peer_errors, 1);
    } else if (st == OVL_ERR_CONNECT || l->state == L_CONNECTING) {
        say(ps, OVLD_REPORT_WARN, "%s: could not connect: %s", link_label(l, label, sizeof(label)),
            why);
        OVLD_COUNT(ps->counters, peer_errors, 1);
    } else {
        say(ps, OVLD_REPORT_WARN, "%s: authentication refused: %s",
            link_label(l, label, sizeof(label)), why);
        OVLD_COUNT(ps->counters, peer_auth_refused, 1);
        snprintf(full, sizeof(full), "authentication refused: %s", why);
        why = full;
    }
    ovld_peer_msg_t m =
        reason_msg(l->state == L_UP ? OVLD_PEER_BYE : OVLD_PEER_REFUSE, st, refuse ? refuse : "");
    if (in_episode) {
        if (p->own == l)
            p->own = NULL;
        if (p->theirs == l)
            p->theirs = NULL;
        if (p->tx == l)
            p->tx = NULL;
        peer_down(p, st, why, l);
    }
    link_leave(l, refuse ? &m : NULL);
}

/* A message of an up link: the transport's, or the rest of ovld's. */
static void on_up_msg(link_t *l, uint32_t type, const ovld_peer_msg_t *m)
{
    ovld_peers_t *ps = l->ps;
    ovld_peer_t *p = l->peer;
    char why[WHY_MAX];
    if (type >= OVLD_PEER_TYPE_USER) {
        if (ps->cb.on_message)
            ps->cb.on_message(ps->cb.arg, p, type, m->body, m->len);
        return;
    }
    switch (type) {
    case OVLD_PEER_PING: {
        ovld_peer_msg_t r;
        memset(&r, 0, sizeof(r));
        r.type = OVLD_PEER_PONG;
        r.seq = m->seq;
        peer_ucx_send_msg(l, &r);
        return;
    }
    case OVLD_PEER_PONG: {
        uint64_t now = ovl_mono_ns();
        if (m->seq == l->ping_seq && l->ping_ns) {
            p->rtt_s = (double)(now - l->ping_ns) / 1e9;
            l->ping_ns = 0;
        }
        for (pingw_t *w = ps->pings; w; w = w->next) {
            if (w->peer != p || w->seq != m->seq || w->finished)
                continue;
            double rtt = (double)(now - w->sent_ns) / 1e9;
            p->rtt_s = rtt;
            peer_ping_finish(w, OVL_OK, rtt, p->instance, NULL);
        }
        return;
    }
    case OVLD_PEER_BYE:
        snprintf(why, sizeof(why), "it ended the session%s%s", m->reason[0] ? ": " : "", m->reason);
        peer_link_fail(l, m->status, why, NULL);
        return;
    }
}

/* Delivers what l's session sent while its Auth was on its way. */
static void deliver_held(link_t *l)
{
    while (l->held_head && l->state == L_UP) {
        held_t *h = l->held_head;
        l->held_head = h->next;
        l->held_bytes -= h->len;
        ovld_peer_msg_t m;
        char why[WHY_MAX];
        if (ovld_peer_decode(h->type, h->body, h->len, &m, why, sizeof(why)) == OVL_OK)
            on_up_msg(l, h->type, &m);
        else
            peer_link_fail(l, OVL_ERR_PROTOCOL, why, why);
        ovld_peer_msg_clear(&m);
        free(h);
    }
    l->held_tail = NULL;
}

/*
 * l authenticated (the connector's with its peer, the acceptor's as the
 * peer named name): its UCX endpoint is created, and it joins its peer's
 * episode or starts one.
 */
void peer_link_up(link_t *l, const char *name, const struct sockaddr_storage *addr)
{
    ovld_peers_t *ps = l->ps;
    char why[WHY_MAX];
    ucs_status_t us = peer_ucx_ep_create(l);
    if (us != UCS_OK) {
        snprintf(why, sizeof(why), "cannot create a UCX endpoint to %s: %s", name,
                 ucs_status_string(us));
        peer_link_fail(l, OVL_ERR_SYSTEM, why, why);
        return;
    }
    if (!l->in_map && !peer_sessmap_put(&ps->map, l)) {
        peer_link_fail(l, OVL_ERR_NOMEM, "out of memory", "out of memory");
        return;
    }
    ovld_peer_t *p = l->peer;
    if (!p) {
        p = peer_find(ps, name);
        if (!p && ps->npeers >= OVLD_PEERS_MAX) {
            snprintf(why, sizeof(why), "ovld at %s has %d peers already (OVLD_PEERS_MAX)", ps->self,
                     OVLD_PEERS_MAX);
            peer_link_fail(l, OVL_ERR_LIMIT, why, why);
            return;
        }
        if (!p && !(p = peer_new(ps, name, addr))) {
            peer_link_fail(l, OVL_ERR_NOMEM, "out of memory", "out of memory");
            return;
        }
        l->peer = p;
    }
    if (l->unauth) {
        l->unauth = false;
        ps->n_unauth--;
    }
    l->state = L_UP;
    l->heard = l->ping_at = now_ms(ps);
    /* The acceptor is done with TCP; the connector reads on until the
     * acceptor closes it (or refuses its Auth), at most peer_timeout_ms. */
    if (l->outgoing)
        l->deadline = now_ms(ps) + ps->timeout_ms;
    else
        peer_tcp_close(l);
    if (p->state == PEER_UP) {
        bool same = memcmp(p->instance, l->inst, sizeof(l->inst)) == 0;
        bool again = l->outgoing ? (p->own && p->own != l) : p->theirs != NULL;
        if (same && !again) {
            /* the other direction of the same episode */
            if (l->outgoing)
                p->own = l;
            else
                p->theirs = l;
            say(ps, OVLD_REPORT_DEBUG, "peer %s: second session up (%s)", p->name,
                l->outgoing ? "ours" : "its");
            deliver_held(l);
            return;
        }
        /* A new instance is a new ovld; the same one opening a second
         * session of the same direction gave the first up on its side. */
        snprintf(why, sizeof(why), "%s",
                 same ? "it connected again (it gave the old session up)"
                      : "it restarted (a new instance)");
        say(ps, OVLD_REPORT_WARN, "peer %s: down: %s", p->name, why);
        OVLD_COUNT(ps->counters, peer_errors, 1);
        if (p->own == l)
            p->own = NULL; /* l is the new episode's, not the old one's */
        peer_down(p, OVL_ERR_CLOSED, why, l);
    }
    if (p->state != PEER_CONNECTING)
        p->own = p->theirs = NULL;
    if (l->outgoing)
        p->own = l;
    else
        p->theirs = l;
    p->state = PEER_UP;
    p->tx = l;
    memcpy(p->instance, l->inst, sizeof(p->instance));
    char inst[9];
    hex8(p->instance, inst);
    say(ps, OVLD_REPORT_INFO, "peer %s: up (instance %s, %s session)", p->name, inst,
        l->outgoing ? "our" : "its");
    peer_flush(p);
    deliver_held(l);
}

/* --------------------------------------------------------- UCX receive */

ucs_status_t peer_on_am(void *arg, const void *header, size_t header_length, void *data,
                        size_t length, const ucp_am_recv_param_t *param)
{
    ovld_peers_t *ps = arg;
    char why[WHY_MAX];
    uint32_t type;
    uint8_t session[OVLD_PEER_SESSION_LEN];
    if (ps->closing)
        return UCS_OK;
    ovl_status_t st =
        ovld_peer_am_check(header, header_length, length, &type, session, why, sizeof(why));
    if (header_length != OVLD_PEER_AM_HDR) {
        /* nothing says whose it is */
        OVLD_COUNT(ps->counters, peer_errors, 1);
        say(ps, OVLD_REPORT_DEBUG, "peers: dropped a message of no session: %s", why);
        return UCS_OK;
    }
    link_t *l = peer_sessmap_get(&ps->map, session);
    if (!l || (l->state != L_UP && l->state != L_PROVING)) {
        /* a session that ended (its messages may still arrive), or none */
        say(ps, OVLD_REPORT_DEBUG, "peers: dropped a message of an unknown session");
        return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* returning UCS_OK without receiving drops it (ucp.h) */
        st = OVL_ERR_PROTOCOL;
        snprintf(why, sizeof(why),
                 "protocol error: a message sent by rendezvous, which ovld never uses");
    }
    OVLD_COUNT(ps->counters, peer_msgs_in, 1);
    OVLD_COUNT(ps->counters, peer_bytes_in, header_length + length);
    if (l->state == L_UP) {
        l->peer->msgs_in++;
        l->peer->bytes_in += header_length + length;
    }
    if (st != OVL_OK) {
        peer_link_fail(l, st, why, why);
        return UCS_OK;
    }
    l->heard = now_ms(ps);
    l->got_am = true;
    if (l->state == L_PROVING) {
        /* sent right after the Auth, which is still on its way over TCP */
        if (l->held_bytes + length > OVLD_PEER_QUEUE_MAX) {
            snprintf(why, sizeof(why),
                     "more than %u bytes sent before its Auth came (OVLD_PEER_QUEUE_MAX)",
                     OVLD_PEER_QUEUE_MAX);
            peer_link_fail(l, OVL_ERR_LIMIT, why, why);
            return UCS_OK;
        }
        held_t *h = malloc(sizeof(*h) + length);
        if (!h) {
            peer_link_fail(l, OVL_ERR_NOMEM, "out of memory", "out of memory");
            return UCS_OK;
        }
        h->next = NULL;
        h->type = type;
        h->len = length;
        if (length)
            memcpy(h->body, data, length);
        if (l->held_tail)
            l->held_tail->next = h;
        else
            l->held_head = h;
        l->held_tail = h;
        l->held_bytes += length;
        return UCS_OK;
    }
    ovld_peer_msg_t m;
    st = ovld_peer_decode(type, data, length, &m, why, sizeof(why));
    if (st != OVL_OK)
        peer_link_fail(l, st, why, why);
    else
        on_up_msg(l, type, &m);
    ovld_peer_msg_clear(&m);
    return UCS_OK;
}

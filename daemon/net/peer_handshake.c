/*
 * peer_handshake.c: the handshake of a link on TCP (peer_internal.h):
 * accepting a connection on peer_listen within the limits per source,
 * connecting, and the Hello, Challenge and Auth that prove the cluster key
 * (peer_auth.h) both ways, read as frames (peer_wire.h). A link that proves
 * it goes up (peer_link.c); one that does not fails, saying why.
 */
#include "peer_internal.h"

#include <stdlib.h>

#define RBUF_MIN 4096 /* first size of a handshake's read buffer */

/* ---------------------------------------------------- the handshake */

/* The transcript both proofs cover, from l's side. */
static ovld_peer_transcript_t transcript(const link_t *l, const char *peer_addr)
{
    const ovld_peers_t *ps = l->ps;
    ovld_peer_transcript_t t = {
        .nonce_c = l->nonce_c,
        .nonce_s = l->nonce_s,
        .inst_c = l->outgoing ? ps->instance : l->inst,
        .inst_s = l->outgoing ? l->inst : ps->instance,
        .addr_c = l->outgoing ? ps->self : peer_addr,
        .addr_s = l->outgoing ? peer_addr : ps->self,
        .ucx_c = l->outgoing ? ps->ucx_addr : l->ucx_remote,
        .ucx_c_len = l->outgoing ? ps->ucx_len : l->ucx_remote_len,
        .ucx_s = l->outgoing ? l->ucx_remote : ps->ucx_addr,
        .ucx_s_len = l->outgoing ? l->ucx_remote_len : ps->ucx_len,
    };
    return t;
}

/* The handshake message of type (Hello or Challenge) that says who this
 * ovld is: its nonce for the link, its instance, its address and its UCX
 * worker's address. */
static ovld_peer_msg_t self_msg(const ovld_peers_t *ps, ovld_peer_type_t type,
                                const uint8_t nonce[OVLD_PEER_NONCE_LEN])
{
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    memcpy(m.nonce, nonce, sizeof(m.nonce));
    memcpy(m.instance, ps->instance, sizeof(m.instance));
    snprintf(m.address, sizeof(m.address), "%s", ps->self);
    m.ucx_addr = ps->ucx_addr;
    m.ucx_len = ps->ucx_len;
    return m;
}

/* Takes the other side's UCX address out of m. */
static void take_ucx(link_t *l, ovld_peer_msg_t *m)
{
    free(l->ucx_remote);
    l->ucx_remote = m->ucx_addr;
    l->ucx_remote_len = m->ucx_len;
    m->ucx_addr = NULL;
    m->ucx_len = 0;
}

/* acceptor: the Hello; the Challenge goes back. */
static void on_hello(link_t *l, ovld_peer_msg_t *m)
{
    ovld_peers_t *ps = l->ps;
    memcpy(l->nonce_c, m->nonce, sizeof(l->nonce_c));
    memcpy(l->inst, m->instance, sizeof(l->inst));
    snprintf(l->claimed, sizeof(l->claimed), "%s", m->address);
    take_ucx(l, m);
    if (memcmp(l->inst, ps->instance, sizeof(l->inst)) == 0) {
        peer_link_fail(l, OVL_ERR_INVALID, "it is this ovld itself", "you connected to yourself");
        return;
    }
    if (!fill_random(l->nonce_s, sizeof(l->nonce_s))) {
        peer_link_fail(l, OVL_ERR_SYSTEM, "getrandom failed", "the acceptor has no random bytes");
        return;
    }
    ovld_peer_msg_t c = self_msg(ps, OVLD_PEER_CHALLENGE, l->nonce_s);
    ovld_peer_transcript_t t = transcript(l, l->claimed);
    ovld_peer_mac(&ps->key, OVLD_PEER_ACCEPTOR, &t, c.mac);
    /* The session is known now: what the connector sends over UCX right
     * after its Auth is held until the Auth is checked. */
    ovld_peer_session(&ps->key, &t, l->session);
    if (peer_sessmap_get(&ps->map, l->session) || !peer_sessmap_put(&ps->map, l)) {
        peer_link_fail(l, OVL_ERR_PROTOCOL, "a session that exists already", "session exists");
        return;
    }
    l->state = L_PROVING;
    peer_frame_send(l, &c);
}

/* connector: the Challenge; the Auth goes back, and the link is up. */
static void on_challenge(link_t *l, ovld_peer_msg_t *m)
{
    ovld_peers_t *ps = l->ps;
    ovld_peer_t *p = l->peer;
    char why[WHY_MAX], refuse[WHY_MAX];
    memcpy(l->nonce_s, m->nonce, sizeof(l->nonce_s));
    memcpy(l->inst, m->instance, sizeof(l->inst));
    take_ucx(l, m);
    ovld_peer_transcript_t t = transcript(l, m->address);
    uint8_t want[OVLD_PEER_MAC_LEN];
    ovld_peer_mac(&ps->key, OVLD_PEER_ACCEPTOR, &t, want);
    bool ok = sodium_memcmp(want, m->mac, sizeof(want)) == 0; /* constant time */
    sodium_memzero(want, sizeof(want));
    if (!ok) {
        snprintf(why, sizeof(why),
                 "wrong cluster key: the proof of %s does not match this node's key "
                 "(peer_key_file differs between the nodes)",
                 p->name);
        snprintf(refuse, sizeof(refuse),
                 "wrong cluster key: your proof does not match the key of %s (peer_key_file "
                 "differs between the nodes)",
                 ps->self);
        peer_link_fail(l, OVL_ERR_PERMISSION, why, refuse);
        return;
    }
    if (memcmp(l->inst, ps->instance, sizeof(l->inst)) == 0) {
        snprintf(why, sizeof(why), "%s is this ovld itself", p->name);
        peer_link_fail(l, OVL_ERR_INVALID, why, "you connected to yourself");
        return;
    }
    if (strcmp(m->address, p->name) != 0) {
        snprintf(why, sizeof(why),
                 "the ovld at %s advertises itself as %s: a node is named by the address it "
                 "advertises (peer_advertise)",
                 p->name, m->address);
        snprintf(refuse, sizeof(refuse), "you advertise %s but were reached at %s", m->address,
                 p->name);
        peer_link_fail(l, OVL_ERR_INVALID, why, refuse);
        return;
    }
    ovld_peer_msg_t a;
    memset(&a, 0, sizeof(a));
    a.type = OVLD_PEER_AUTH;
    ovld_peer_mac(&ps->key, OVLD_PEER_CONNECTOR, &t, a.mac);
    ovld_peer_session(&ps->key, &t, l->session);
    if (peer_sessmap_get(&ps->map, l->session)) {
        peer_link_fail(l, OVL_ERR_PROTOCOL, "a session that exists already", "session exists");
        return;
    }
    peer_frame_send(l, &a);
    peer_link_up(l, p->name, &p->addr);
}

/* acceptor: the Auth; the link is up. */
static void on_auth(link_t *l, const ovld_peer_msg_t *m)
{
    ovld_peers_t *ps = l->ps;
    ovld_peer_transcript_t t = transcript(l, l->claimed);
    uint8_t want[OVLD_PEER_MAC_LEN];
    ovld_peer_mac(&ps->key, OVLD_PEER_CONNECTOR, &t, want);
    bool ok = sodium_memcmp(want, m->mac, sizeof(want)) == 0; /* constant time */
    sodium_memzero(want, sizeof(want));
    if (!ok) {
        /* It proved nothing: a node with another key stops at the
         * Challenge, so this one did not play by the protocol. */
        peer_link_fail(l, OVL_ERR_PERMISSION,
                       "wrong cluster key: its proof does not match this node's key",
                       "wrong cluster key: your proof does not match");
        return;
    }
    struct sockaddr_storage ss;
    char name[OVLD_ADDR_TEXT_MAX];
    if (ovld_peer_addr_parse(l->claimed, &ss, name, NULL, 0) != OVL_OK) {
        peer_link_fail(l, OVL_ERR_PROTOCOL, "a bad address", "a bad address");
        return;
    }
    peer_link_up(l, name, &ss);
}

/* One handshake frame, checked and decoded, in l's state. */
static void handle_frame(link_t *l, uint32_t type, const uint8_t *body, size_t len)
{
    char why[WHY_MAX], tb[32];
    ovld_peer_msg_t m;
    ovl_status_t st = ovld_peer_decode(type, body, len, &m, why, sizeof(why));
    if (st != OVL_OK) {
        peer_link_fail(l, st, why, why);
        return;
    }
    l->heard = now_ms(l->ps);
    if (type == OVLD_PEER_REFUSE) {
        snprintf(why, sizeof(why), "the other side refused: %s", m.reason);
        peer_link_fail(l, m.status, why, NULL);
    } else if (l->state == L_ACCEPTED && type == OVLD_PEER_HELLO) {
        on_hello(l, &m);
    } else if (l->state == L_HELLO && type == OVLD_PEER_CHALLENGE) {
        on_challenge(l, &m);
    } else if (l->state == L_PROVING && type == OVLD_PEER_AUTH) {
        on_auth(l, &m);
    } else {
        snprintf(why, sizeof(why), "protocol error: a %s in the handshake's state %s",
                 ovld_peer_type_name(type, tb, sizeof(tb)), link_state_names[l->state]);
        peer_link_fail(l, OVL_ERR_PROTOCOL, why, why);
    }
    ovld_peer_msg_clear(&m);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    link_t *l = h->data;
    (void)suggested;
    /* grown as frames need, never past the largest frame */
    size_t max = OVLD_PEER_FRAME_HDR + OVLD_PEER_MAX_FRAME;
    if (l->rcap - l->rlen < RBUF_MIN && l->rcap < max) {
        size_t cap = l->rcap ? l->rcap * 2 : RBUF_MIN;
        if (cap > max)
            cap = max;
        uint8_t *nb = realloc(l->rbuf, cap);
        if (nb) {
            l->rbuf = nb;
            l->rcap = cap;
        }
    }
    *buf = uv_buf_init((char *)l->rbuf + l->rlen, (unsigned)(l->rcap - l->rlen));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    link_t *l = s->data;
    ovld_peers_t *ps = l->ps;
    char why[WHY_MAX];
    (void)buf;
    if (l->state >= L_CLOSING || ps->closing)
        return;
    if (n < 0) {
        if (l->state == L_UP) {
            /* the acceptor is done with it */
            peer_tcp_close(l);
        } else if (n == UV_EOF) {
            peer_link_fail(l, OVL_ERR_CLOSED,
                           "the other side closed the connection during the handshake", NULL);
        } else {
            snprintf(why, sizeof(why), "connection lost during the handshake (%s)",
                     uv_strerror((int)n));
            peer_link_fail(l, n == UV_ENOBUFS ? OVL_ERR_NOMEM : OVL_ERR_CLOSED, why, NULL);
        }
        kick(ps);
        return;
    }
    l->rlen += (size_t)n;
    size_t off = 0;
    while (l->state < L_CLOSING && !uv_is_closing((uv_handle_t *)&l->tcp) &&
           l->rlen - off >= OVLD_PEER_FRAME_HDR) {
        uint32_t type, len;
        ovl_status_t st = ovld_peer_frame_check(l->rbuf + off, &type, &len, why, sizeof(why));
        if (st != OVL_OK) {
            peer_link_fail(l, st, why, why);
            break;
        }
        if (l->rlen - off - OVLD_PEER_FRAME_HDR < len)
            break;
        handle_frame(l, type, l->rbuf + off + OVLD_PEER_FRAME_HDR, len);
        off += OVLD_PEER_FRAME_HDR + len;
    }
    if (l->rbuf && off) {
        memmove(l->rbuf, l->rbuf + off, l->rlen - off);
        l->rlen -= off;
    }
    kick(ps);
}

void peer_on_connected(uv_connect_t *req, int status)
{
    link_t *l = req->data;
    ovld_peers_t *ps = l->ps;
    char why[WHY_MAX];
    if (l->state != L_CONNECTING || ps->closing)
        return;
    if (status < 0) {
        snprintf(why, sizeof(why),
                 "unreachable: cannot connect to %s: %s (is an ovld listening there, with "
                 "peer_listen, and is the port open?)",
                 l->peer->name, uv_strerror(status));
        peer_link_fail(l, OVL_ERR_CONNECT, why, NULL);
        kick(ps);
        return;
    }
    (void)uv_tcp_nodelay(&l->tcp, 1);
    int r = uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
    if (r != 0) {
        snprintf(why, sizeof(why), "cannot read from the connection: %s", uv_strerror(r));
        peer_link_fail(l, OVL_ERR_SYSTEM, why, NULL);
        kick(ps);
        return;
    }
    ovld_peer_msg_t h = self_msg(ps, OVLD_PEER_HELLO, l->nonce_c);
    l->state = L_HELLO;
    peer_frame_send(l, &h);
    kick(ps);
}

/* ------------------------------------------- accepting, limits per source */

/* The source an address counts under for the handshake limits: an IPv4
 * address (an IPv4-mapped IPv6 one folded into it, as a dual-stack listener
 * sees IPv4 peers), or an IPv6 address's /64, which one host usually holds
 * whole (counting its addresses one by one would let it take every slot).
 * Unknown families (0: the peer's name could not be read) count together. */
typedef struct source {
    int family;
    uint8_t bytes[8];
} source_t;

static source_t source_of(const struct sockaddr_storage *a)
{
    source_t k = {.family = 0};
    if (a->ss_family == AF_INET) {
        k.family = AF_INET;
        memcpy(k.bytes, &((const struct sockaddr_in *)a)->sin_addr, 4);
    } else if (a->ss_family == AF_INET6) {
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(v6)) {
            k.family = AF_INET;
            memcpy(k.bytes, v6->s6_addr + 12, 4);
        } else {
            k.family = AF_INET6;
            memcpy(k.bytes, v6->s6_addr, 8);
        }
    }
    return k;
}

/* Whether a and b count as the same source (source_of). */
static bool same_source(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    source_t x = source_of(a), y = source_of(b);
    return x.family == y.family && memcmp(x.bytes, y.bytes, sizeof(x.bytes)) == 0;
}

/* Refuses an accepted connection before its handshake: says which limit
 * (n connections `where`, the limit's name), counts it, closes it. */
static void refuse_handshake(ovld_peers_t *ps, link_t *l, int n, const char *where,
                             const char *limit)
{
    say(ps, OVLD_REPORT_WARN,
        "peer connection from %s: refused: %d connections %sare authenticating already (%s)",
        l->from, n, where, limit);
    OVLD_COUNT(ps->counters, peer_auth_refused, 1);
    peer_link_close(l);
}

/* Accepted connections from the host of from still authenticating. */
static unsigned unauth_from(const ovld_peers_t *ps, const struct sockaddr_storage *from)
{
    unsigned n = 0;
    for (const link_t *l = ps->links; l; l = l->next)
        if (l->unauth && same_source(&l->from_ss, from))
            n++;
    return n;
}

/* Refuses the oldest handshake of the sources that hold the most
 * (OVLD_PEERS_MAX_UNAUTH reached), which frees its slot at once: a flood
 * loses its own, a node with one connection keeps it. At most
 * OVLD_PEERS_MAX_UNAUTH links are counted, so the quadratic walk is small. */
static void unauth_evict(ovld_peers_t *ps)
{
    link_t *victim = NULL;
    unsigned most = 0;
    for (link_t *l = ps->links; l; l = l->next) {
        if (!l->unauth)
            continue;
        unsigned n = unauth_from(ps, &l->from_ss);
        /* of the sources holding the most, the oldest connection (links
         * are newest first, so a later one of as many is as old or older) */
        if (n > most || (n == most && victim && l->deadline <= victim->deadline)) {
            most = n;
            victim = l;
        }
    }
    if (!victim)
        return;
    char why[WHY_MAX];
    snprintf(why, sizeof(why),
             "evicted: %d connections were authenticating (OVLD_PEERS_MAX_UNAUTH), and this was "
             "the oldest of the address holding the most (%u)",
             OVLD_PEERS_MAX_UNAUTH, most);
    peer_link_fail(victim, OVL_ERR_LIMIT, why, why);
}

void peer_on_accept(uv_stream_t *server, int status)
{
    ovld_peers_t *ps = server->data;
    if (status < 0) {
        say(ps, OVLD_REPORT_WARN, "peers: accepting a connection: %s", uv_strerror(status));
        return;
    }
    link_t *l = peer_link_new(ps, false);
    if (!l) {
        say(ps, OVLD_REPORT_WARN, "peers: out of memory accepting a connection");
        return;
    }
    l->state = L_ACCEPTED;
    int r = uv_accept(server, (uv_stream_t *)&l->tcp);
    if (r != 0) {
        say(ps, OVLD_REPORT_DEBUG, "peers: accept: %s", uv_strerror(r));
        peer_link_close(l);
        return;
    }
    struct sockaddr_storage from = {0};
    int flen = sizeof(from);
    snprintf(l->from, sizeof(l->from), "?");
    bool named = uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&from, &flen) == 0;
    if (named)
        ovld_peer_addr_format(&from, l->from, sizeof(l->from));
    if (ps->closing) {
        peer_link_close(l);
        return;
    }
    if (named && flen > 0 && (size_t)flen <= sizeof(from))
        l->from_ss = from;
    /* One source may hold only a few handshakes at once, so that a flood
     * of half-open connections from one host cannot take every slot. */
    if (unauth_from(ps, &l->from_ss) >= OVLD_PEERS_MAX_UNAUTH_SOURCE) {
        refuse_handshake(ps, l, OVLD_PEERS_MAX_UNAUTH_SOURCE, "from this source ",
                         "OVLD_PEERS_MAX_UNAUTH_SOURCE");
        return;
    }
    /* Full (many sources): the newcomer gets the slot of the oldest
     * handshake of the source holding the most, so that a node that holds
     * the key still gets in while strangers keep the slots filled; theirs
     * are the ones that wait, and lose them. */
    if (ps->n_unauth >= OVLD_PEERS_MAX_UNAUTH)
        unauth_evict(ps);
    if (ps->n_unauth >= OVLD_PEERS_MAX_UNAUTH) {
        refuse_handshake(ps, l, OVLD_PEERS_MAX_UNAUTH, "", "OVLD_PEERS_MAX_UNAUTH");
        return;
    }
    l->unauth = true;
    ps->n_unauth++;
    (void)uv_tcp_nodelay(&l->tcp, 1);
    if ((r = uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read)) != 0) {
        say(ps, OVLD_REPORT_WARN, "peer connection from %s: cannot read: %s", l->from,
            uv_strerror(r));
        peer_link_close(l);
        return;
    }
    say(ps, OVLD_REPORT_DEBUG, "peer connection from %s: accepted, authenticating", l->from);
    kick(ps);
}

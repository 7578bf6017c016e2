/*
 * peer_internal.h: what the files of the peer transport (peer.h) share, and
 * nothing else includes: the records of the transport, its peers, links
 * and messages, the small helpers, and the functions one file calls in
 * another. The files, each calling only those below it by name (what a
 * lower one must tell a higher one goes through a callback it is given:
 * peer_ucx_cb_t):
 *
 *   peer.c            the transport: start and close, the API of peer.h
 *                     (but the reads, and ovld_peers_process_init: UCX's),
 *                     the tick (deadlines, heartbeats, pings), reap (what
 *                     waits for outside UCX's progress)
 *   peer_handshake.c  the handshake on TCP: accepting (the limits per
 *                     source), connecting, Hello, Challenge, Auth
 *   peer_link.c       links and peers: a link's life, the session map,
 *                     handshake frames out, episodes (up, down), the
 *                     messages of an up link, a session's messages in
 *   peer_rma.c        remote reads: mapped memory, its keys, ovld_peer_get
 *   peer_ucx.c        the UCX runtime: UCX's log, the context and worker,
 *                     endpoints, active messages out, the progress driven
 *                     from the loop
 *
 * The protocol is in docs/multinode.md. A link (one session with another
 * ovld) starts as a TCP connection to the acceptor's peer_listen, on which
 * the handshake runs as frames that ovld reads itself (peer_wire.h), with
 * limits on every size. UCX's own sockaddr listener is not used: in UCX
 * 1.13.1 a few bytes of garbage sent to it abort the process (an assertion
 * in uct/tcp/tcp_sockcm_ep.c), and the listener is the one port every
 * stranger can reach. Once both sides have proven that they hold the
 * cluster key, each creates a UCX endpoint to the UCX worker address the
 * other gave in the handshake (covered by both proofs), and the session's
 * messages go as UCX active messages whose header carries the session id
 * both derived from the key: that id is how a message is charged to its
 * link.
 *
 * Lifetimes. A peer record lives until ovld_peers_close. A link lives
 * until its TCP handle is closed, its UCX endpoint closed, and every write,
 * send and read posted on it completed (UCP_ERR_HANDLING_MODE_PEER
 * guarantees that they complete, with an error once the endpoint fails or
 * is closed by force). A send buffer lives until UCX is done with it. A
 * read's remote key is unpacked on the endpoint it goes on, for it alone,
 * and destroyed as it completes, while that endpoint still exists (ucp.h
 * wants it so); no key outlives its endpoint, so reconnects need no care.
 */
#ifndef OVLD_PEER_INTERNAL_H
#define OVLD_PEER_INTERNAL_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <ucp/api/ucp.h>

#include "peer.h"
#include "text.h"

#define TICK_MS   100 /* the timer that catches missed wakeups and keeps deadlines */
#define LINGER_MS 500 /* a last message (Refuse, Bye) gets this long to leave */
#define WHY_MAX   320

typedef enum link_state {
    L_CONNECTING, /* connector: TCP connect in progress */
    L_HELLO,      /* connector: Hello sent, waiting for the Challenge */
    L_ACCEPTED,   /* acceptor: waiting for the Hello */
    L_PROVING,    /* acceptor: Challenge sent, waiting for the Auth */
    L_UP,         /* authenticated; messages over UCX */
    L_CLOSING,    /* a last message is leaving; closed once sent, or at its deadline */
    L_CLOSED,     /* handles closing; freed once everything posted on it is done */
} link_state_t;

static const char *const link_state_names[] = {"connecting", "hello",   "accepted", "proving",
                                               "up",         "closing", "closed"};

/* A message of a session, held while its acceptor has not read the Auth
 * that comes on TCP (the connector may send as soon as it sent the Auth,
 * and UCX may be faster). */
typedef struct held {
    struct held *next;
    uint32_t type;
    size_t len;
    uint8_t body[];
} held_t;

typedef struct link {
    ovld_peers_t *ps;
    ovld_peer_t *peer; /* the connector's from the start; the acceptor's once up */
    bool outgoing;
    link_state_t state;
    bool unauth; /* counted in ps->n_unauth */
    bool orphan; /* ovld_peers_close let it go: freed when its handle closes */
    /* the handshake's TCP connection */
    uv_tcp_t tcp;
    bool tcp_open; /* initialized and not yet closed (a handle of ps) */
    uv_connect_t creq;
    uint8_t *rbuf;
    size_t rlen, rcap;
    unsigned writes; /* uv_write requests not completed */
    /* UCX, from up */
    ucp_ep_h ep;
    bool ep_failed; /* its error handler fired (fail_st), or a send was refused */
    ucs_status_t fail_st;
    bool ep_close_done;
    unsigned sends; /* sends posted, not completed */
    uint8_t session[OVLD_PEER_SESSION_LEN];
    bool in_map; /* its session is in ps->map */
    held_t *held_head, *held_tail;
    size_t held_bytes;
    /* the handshake */
    uint8_t nonce_c[OVLD_PEER_NONCE_LEN], nonce_s[OVLD_PEER_NONCE_LEN];
    uint8_t inst[OVLD_PEER_INSTANCE_LEN]; /* the other side's */
    char claimed[OVLD_ADDR_TEXT_MAX];     /* the address its Hello gave (acceptor) */
    char from[OVLD_ADDR_TEXT_MAX];        /* the address it came from (acceptor) */
    struct sockaddr_storage from_ss; /* the same, for the per-source count; family 0: unknown */
    uint8_t *ucx_remote;             /* the other side's UCX worker address */
    size_t ucx_remote_len;
    uint64_t deadline; /* loop ms: up by (handshake); closed by (closing); TCP closed by (up) */
    uint64_t heard;    /* loop ms of its last message */
    uint64_t ping_at;  /* loop ms of its last heartbeat */
    uint64_t ping_seq, ping_ns;
    bool got_am; /* a message of its session came over UCX */
    struct link *prev, *next;
} link_t;

/* One message for UCX: queued on a peer until it is up, then posted. */
typedef struct sbuf {
    struct sbuf *next;
    ovld_peer_t *peer; /* whose queue it counts in; NULL for the transport's own */
    link_t *link;      /* posted on */
    uint32_t type;
    size_t len;
    uint8_t hdr[OVLD_PEER_AM_HDR];
    uint8_t body[];
} sbuf_t;

/* One handshake frame on its way to the TCP socket. */
typedef struct wbuf {
    uv_write_t req;
    link_t *link;
    size_t len;
    uint8_t data[];
} wbuf_t;

typedef enum peer_state { PEER_IDLE, PEER_CONNECTING, PEER_UP, PEER_DOWN } peer_state_t;

static const char *const peer_state_names[] = {"down", "connecting", "up", "down"};

struct ovld_peer {
    ovld_peers_t *ps;
    char name[OVLD_ADDR_TEXT_MAX];
    struct sockaddr_storage addr;
    peer_state_t state;
    link_t *own, *theirs; /* this episode's links: the one we opened, the one it did */
    link_t *tx;           /* the one this episode's messages go on */
    uint8_t instance[OVLD_PEER_INSTANCE_LEN];
    sbuf_t *q_head, *q_tail; /* waiting for the peer to come up */
    size_t q_bytes;          /* queued and in flight */
    bool down_pending;       /* on_down to call from reap */
    ovl_status_t down_st;
    char down_why[WHY_MAX];
    double rtt_s;
    uint64_t msgs_in, msgs_out, bytes_in, bytes_out, errors;
    char last_error[WHY_MAX];
    struct ovld_peer *next;
};

/* A ping of ovld_peers_ping. */
typedef struct pingw {
    struct pingw *next;
    ovld_peer_t *peer;
    uint64_t seq; /* 0 until sent */
    uint64_t sent_ns;
    uint64_t deadline; /* loop ms */
    ovld_peers_ping_fn done;
    void *arg;
    bool finished;
    ovl_status_t st;
    double rtt_s;
    uint8_t inst[OVLD_PEER_INSTANCE_LEN];
    char why[WHY_MAX];
} pingw_t;

/* session id -> link. Open addressing, linear probing, grown at half
 * full; the ids are HMAC output, so their first bytes hash well. */
typedef struct sessmap {
    link_t **slot;
    size_t cap, n;
} sessmap_t;

/* What the UCX runtime (peer_ucx.c) calls up into, given at its start:
 * on_am is the handler of OVLD_PEER_AM_ID's active messages (its arg: ps),
 * called from inside ucp_worker_progress; reap is called by drain, outside
 * progress, before each progress and after it. */
typedef struct peer_ucx_cb {
    ucp_am_recv_callback_t on_am;
    void (*reap)(ovld_peers_t *ps);
} peer_ucx_cb_t;

struct ovld_peers {
    uv_loop_t *loop;
    ovld_peers_cb_t cb;
    const ovld_reporter_t *report;
    ovld_counters_t *counters;
    uint32_t timeout_ms;
    ovld_peer_key_t key;
    char self[OVLD_ADDR_TEXT_MAX];
    uint8_t instance[OVLD_PEER_INSTANCE_LEN];
    ucp_context_h ctx;
    ucp_worker_h worker;
    peer_ucx_cb_t ucx_cb; /* what the UCX runtime calls up into */
    uint8_t *ucx_addr;    /* this worker's address, as peers get it */
    size_t ucx_len;
    int efd;
    uv_tcp_t listener;
    uv_poll_t poll;
    uv_timer_t tick;
    uv_prepare_t prep;
    uv_idle_t idle;
    unsigned handles; /* handles open: ps is freed when the last one has closed */
    bool kick;        /* something was posted: drain before the loop sleeps */
    bool in_drain, in_reap, closing, arm_reported, log_pushed;
    link_t *links;
    sessmap_t map;
    unsigned n_unauth;
    ovld_peer_t *peers;
    unsigned npeers;
    pingw_t *pings;
    struct getw *gets; /* the reads of ovld_peer_get (peer_rma.c) */
    uint64_t seq;      /* of Pings */
};

/* ----------------------------------------------------------- small parts */

static inline void say(ovld_peers_t *ps, ovld_report_level_t lv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void say(ovld_peers_t *ps, ovld_report_level_t lv, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ovld_report(ps->report, lv, "%s", msg);
}

static inline void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static inline uint64_t now_ms(const ovld_peers_t *ps)
{
    return uv_now(ps->loop);
}

static inline void kick(ovld_peers_t *ps)
{
    ps->kick = true;
}

/* n random bytes; false if the kernel gives none. */
static inline bool fill_random(uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static inline void hex8(const uint8_t *b, char out[9])
{
    for (int i = 0; i < 4; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* A Refuse or a Bye saying why. */
static inline ovld_peer_msg_t reason_msg(ovld_peer_type_t type, ovl_status_t st, const char *reason)
{
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.status = st;
    ovl_text_sanitize(m.reason, sizeof(m.reason), (const uint8_t *)reason, strlen(reason));
    return m;
}

/* ------------------------------------------------------------- peer_link.c */

/* One of the handles of ps closed (a link's TCP connection, or one of the
 * transport's): ps is freed with the last one once closing. */
void peer_handle_gone(ovld_peers_t *ps);
/* A new link, on ps's list, its TCP handle initialized, its deadline
 * peer_timeout_ms away; NULL: out of memory, or libuv refused the handle. */
link_t *peer_link_new(ovld_peers_t *ps, bool outgoing);
void peer_link_unlink(link_t *l);  /* off ps's list and the session map */
void peer_link_release(link_t *l); /* frees l, its secrets wiped */
void peer_tcp_close(link_t *l);
void peer_link_close(link_t *l);
void peer_link_fail(link_t *l, ovl_status_t st, const char *why, const char *refuse);
void peer_link_up(link_t *l, const char *name, const struct sockaddr_storage *addr);
void peer_frame_send(link_t *l, const ovld_peer_msg_t *m);
link_t *peer_sessmap_get(const sessmap_t *m, const uint8_t *s);
bool peer_sessmap_put(sessmap_t *m, link_t *l);
ovld_peer_t *peer_find(const ovld_peers_t *ps, const char *name);
ovld_peer_t *peer_new(ovld_peers_t *ps, const char *name, const struct sockaddr_storage *addr);
void peer_drop_queue(ovld_peer_t *p);
void peer_ping_finish(pingw_t *w, ovl_status_t st, double rtt, const uint8_t *inst,
                      const char *why);
/* UCX's handler of the session's active messages (peer_ucx_cb_t's on_am). */
ucs_status_t peer_on_am(void *arg, const void *header, size_t header_length, void *data,
                        size_t length, const ucp_am_recv_param_t *param);

/* -------------------------------------------------------- peer_handshake.c */

/* libuv's callbacks of the listener (uv_listen) and of a connector's
 * connect (uv_tcp_connect): where the handshake of a link starts. */
void peer_on_accept(uv_stream_t *server, int status);
void peer_on_connected(uv_connect_t *req, int status);

/* -------------------------------------------------------------- peer_rma.c */

/* In reap: posts the next pieces of the reads that may, and calls done of
 * those that are over. */
void peer_rma_reap(ovld_peers_t *ps);
/* In ovld_peers_close, before the worker goes: the reads UCX has not
 * completed end (OVL_ERR_SHUTDOWN), their keys destroyed. */
void peer_rma_shutdown(ovld_peers_t *ps);
/* In ovld_peers_close, once the worker is gone: every read's owner hears. */
void peer_rma_finish(ovld_peers_t *ps);

/* -------------------------------------------------------------- peer_ucx.c */

ovl_status_t peer_ucx_start(ovld_peers_t *ps, const peer_ucx_cb_t *cb, char *err, size_t errlen);
void peer_ucx_release(ovld_peers_t *ps);
void peer_ucx_drain(ovld_peers_t *ps);
void peer_ucx_progress_until(ovld_peers_t *ps, bool (*done)(const ovld_peers_t *), unsigned ms);
void peer_ucx_on_efd(uv_poll_t *h, int status, int events);
void peer_ucx_on_prepare(uv_prepare_t *h);
/* Creates l's UCX endpoint, to the worker address its handshake gave;
 * its error handler notes a failure in l->ep_failed (reap acts on it).
 * Not UCS_OK: UCX refused it, and l->ep is NULL. */
ucs_status_t peer_ucx_ep_create(link_t *l);
void peer_ucx_ep_close(link_t *l);
void peer_ucx_failure(const link_t *l, char *why, size_t len);
sbuf_t *peer_ucx_sbuf_new(uint32_t type, const void *body, size_t len);
void peer_ucx_sbuf_done(sbuf_t *sb);
void peer_ucx_post(link_t *l, sbuf_t *sb);
void peer_ucx_send_msg(link_t *l, const ovld_peer_msg_t *m);
void peer_ucx_send_ping(link_t *l, uint64_t seq);

#endif /* OVLD_PEER_INTERNAL_H */

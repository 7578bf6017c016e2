/*
 * peer.c: see peer.h; the protocol is in docs/multinode.md.
 *
 * A link (one session with another ovld) starts as a TCP connection to the
 * acceptor's peer_listen, on which the handshake runs as frames that ovld
 * reads itself (peer_wire.h), with limits on every size. UCX's own
 * sockaddr listener is not used: in UCX 1.13.1 a few bytes of garbage sent
 * to it abort the process (an assertion in uct/tcp/tcp_sockcm_ep.c), and
 * the listener is the one port every stranger can reach. Once both sides
 * have proven that they hold the cluster key, each creates a UCX endpoint
 * to the UCX worker address the other gave in the handshake (covered by
 * both proofs), and the session's messages go as UCX active messages whose
 * header carries the session id both derived from the key: that id is how
 * a message is charged to its link.
 *
 * UCX in a libuv loop (API-NOTES section 4): the worker is
 * UCS_THREAD_MODE_SINGLE and only this loop thread touches it; its event fd
 * is watched with a uv_poll, and drain() progresses the worker until
 * ucp_worker_arm says nothing is left. drain() also runs from a uv_prepare
 * when something was posted outside a drain (the event fd only wakes for
 * new events), and from a 100 ms timer, since UCX can miss a wakeup; the
 * timer also keeps the deadlines (handshakes, heartbeats, pings).
 *
 * UCX calls back from inside ucp_worker_progress (active messages, error
 * handlers, send completions); those callbacks change state and post
 * sends only. Closing links, freeing them and the calls into the rest of
 * ovld (on_down, ping completions) wait for reap(), which runs outside
 * progress, before each progress (so that a peer's down reaches the caller
 * before a message of its next episode) and after it.
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
#include "peer.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <ucm/api/ucm.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>
#include <ucs/debug/log_def.h>

#include "clock.h"
#include "text.h"

#if defined(__SANITIZE_ADDRESS__)
#define OVLD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OVLD_ASAN 1
#endif
#endif

#define TICK_MS       100  /* the timer that catches missed wakeups and keeps deadlines */
#define DRAIN_ROUNDS  64   /* progress/arm rounds per drain before the loop gets a turn */
#define LINGER_MS     500  /* a last message (Refuse, Bye) gets this long to leave */
#define CLOSE_WAIT_MS 1000 /* ovld_peers_close waits this long for UCX at most */
#define RBUF_MIN      4096 /* first size of a handshake's read buffer */
#define WHY_MAX       320

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

/*
 * A read of ovld_peer_get, in pieces of at most GET_PIECE bytes, at most
 * GET_WINDOW of them in flight. One read of hundreds of MiB would hold the
 * peer's other messages (heartbeats) behind it on a stream transport (TCP)
 * for longer than peer_timeout_ms, and the link would be declared dead
 * while it carried data (2 daemons, 256 MiB rows, UCX 1.13 over TCP: "not
 * heard from for 1089 ms"). In pieces, each completed piece is heard from
 * the peer (it is up: its memory was served), and the peer's messages pass
 * between pieces.
 */
#define GET_PIECE  (4u << 20)
#define GET_WINDOW 4u
typedef struct getw {
    struct getw *next;
    ovld_peer_t *peer;
    link_t *link;    /* posted on (counted in its sends); NULL once completed */
    ucp_rkey_h rkey; /* unpacked on link's endpoint; destroyed when the read completes */
    uint64_t raddr;  /* the whole read: from raddr into dst, len bytes */
    char *dst;
    size_t len;
    size_t posted;     /* bytes posted so far, from the start */
    unsigned inflight; /* pieces posted, not completed */
    bool failed;       /* a piece failed (st, why say how): no more are posted */
    bool more;         /* a piece completed: reap posts the next ones */
    ovld_peer_get_fn done;
    void *arg;
    bool finished;
    ovl_status_t st;
    char why[WHY_MAX];
} getw_t;

/* A range mapped for peers to read. */
struct ovld_peer_mem {
    ucp_mem_h memh;
    void *rkey; /* ucp_rkey_pack's */
    size_t rkey_len;
};

/* session id -> link. Open addressing, linear probing, grown at half
 * full; the ids are HMAC output, so their first bytes hash well. */
typedef struct sessmap {
    link_t **slot;
    size_t cap, n;
} sessmap_t;

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
    uint8_t *ucx_addr; /* this worker's address, as peers get it */
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
    getw_t *gets;
    uint64_t seq; /* of Pings */
};

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

/* ----------------------------------------------------------- small parts */

static void say(ovld_peers_t *ps, ovld_report_level_t lv, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(ovld_peers_t *ps, ovld_report_level_t lv, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ovld_report(ps->report, lv, "%s", msg);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t now_ms(const ovld_peers_t *ps)
{
    return uv_now(ps->loop);
}

static void kick(ovld_peers_t *ps)
{
    ps->kick = true;
}

/* n random bytes; false if the kernel gives none. */
static bool fill_random(uint8_t *p, size_t n)
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

static void hex8(const uint8_t *b, char out[9])
{
    for (int i = 0; i < 4; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

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

static ovld_peer_msg_t reason_msg(ovld_peer_type_t type, ovl_status_t st, const char *reason)
{
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.status = st;
    ovl_text_sanitize(m.reason, sizeof(m.reason), (const uint8_t *)reason, strlen(reason));
    return m;
}

/* ------------------------------------------------------------- sessmap */

static size_t sess_hash(const uint8_t *s, size_t cap)
{
    uint64_t x;
    memcpy(&x, s, sizeof(x));
    return (size_t)x & (cap - 1);
}

static link_t *sessmap_get(const sessmap_t *m, const uint8_t *s)
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

static bool sessmap_put(sessmap_t *m, link_t *l)
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

static sbuf_t *sbuf_new(uint32_t type, const void *body, size_t len)
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
static void sbuf_done(sbuf_t *sb)
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
    sbuf_done(sb);
    ucp_request_free(req);
    kick(ps);
}

/* Posts sb on l's UCX endpoint, in the session's name. A send UCX refuses
 * at once fails the link (reap says why). */
static void post(link_t *l, sbuf_t *sb)
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
        sbuf_done(sb);
    } else if (UCS_PTR_IS_ERR(r)) {
        if (!l->ep_failed) {
            l->ep_failed = true;
            l->fail_st = UCS_PTR_STATUS(r);
        }
        sbuf_done(sb);
    }
}

/* Sends one of the transport's messages on l over UCX. */
static void send_msg(link_t *l, const ovld_peer_msg_t *m)
{
    uint8_t *body;
    size_t len;
    if (!l->ep || l->ep_failed)
        return;
    sbuf_t *sb = NULL;
    if (ovld_peer_encode(m, &body, &len) == OVL_OK) {
        sb = sbuf_new(m->type, body, len);
        free(body);
    }
    if (!sb) {
        l->ep_failed = true;
        l->fail_st = UCS_ERR_NO_MEMORY;
        kick(l->ps);
        return;
    }
    post(l, sb);
}

static void send_ping(link_t *l, uint64_t seq)
{
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = OVLD_PEER_PING;
    m.seq = seq;
    send_msg(l, &m);
}

/* -------------------------------------------------------- sending: TCP */

static void link_fail(link_t *l, ovl_status_t st, const char *why, const char *refuse);

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
        link_fail(l, OVL_ERR_CLOSED, why, NULL);
    }
    kick(l->ps);
}

/* Sends a handshake frame on l's TCP connection. */
static void frame_send(link_t *l, const ovld_peer_msg_t *m)
{
    uint8_t *body;
    size_t len;
    if (!l->tcp_open || uv_is_closing((uv_handle_t *)&l->tcp))
        return;
    if (ovld_peer_encode(m, &body, &len) != OVL_OK) {
        link_fail(l, OVL_ERR_NOMEM, "out of memory", NULL);
        return;
    }
    wbuf_t *wb = malloc(sizeof(*wb) + OVLD_PEER_FRAME_HDR + len);
    if (!wb) {
        free(body);
        link_fail(l, OVL_ERR_NOMEM, "out of memory", NULL);
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
        link_fail(l, OVL_ERR_CLOSED, why, NULL);
        return;
    }
    l->writes++;
}

/* --------------------------------------------------------------- links */

static void handle_gone(ovld_peers_t *ps)
{
    if (--ps->handles == 0 && ps->closing)
        free(ps);
}

static void link_release(link_t *l)
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
        link_release(l);
    else
        kick(ps);
    handle_gone(ps);
}

static void tcp_close(link_t *l)
{
    if (l->tcp_open && !uv_is_closing((uv_handle_t *)&l->tcp))
        uv_close((uv_handle_t *)&l->tcp, on_tcp_closed);
}

static link_t *link_new(ovld_peers_t *ps, bool outgoing)
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

static void link_unlink(link_t *l)
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

/* Closes l (outside progress): its TCP connection, and its UCX endpoint,
 * forced (what is queued on it is given up; its sends complete with an
 * error). */
static void link_close(link_t *l)
{
    ovld_peers_t *ps = l->ps;
    if (l->state == L_CLOSED)
        return;
    if (l->unauth) {
        l->unauth = false;
        ps->n_unauth--;
    }
    l->state = L_CLOSED;
    tcp_close(l);
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
            send_msg(l, last);
        else
            frame_send(l, last);
    }
    kick(ps);
}

/* ------------------------------------------------------------- peers */

static ovld_peer_t *peer_find(const ovld_peers_t *ps, const char *name)
{
    for (ovld_peer_t *p = ps->peers; p; p = p->next)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

static ovld_peer_t *peer_new(ovld_peers_t *ps, const char *name,
                             const struct sockaddr_storage *addr)
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

static void ping_finish(pingw_t *w, ovl_status_t st, double rtt, const uint8_t *inst,
                        const char *why)
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
static void peer_drop_queue(ovld_peer_t *p)
{
    ovld_peers_t *ps = p->ps;
    uint64_t n = 0;
    while (p->q_head) {
        sbuf_t *sb = p->q_head;
        p->q_head = sb->next;
        sbuf_done(sb);
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
            ping_finish(w, st, 0, NULL, why);
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
        post(p->tx, sb);
    }
    p->q_tail = NULL;
    for (pingw_t *w = ps->pings; w; w = w->next) {
        if (w->peer != p || w->finished || w->seq)
            continue;
        w->seq = ++ps->seq;
        w->sent_ns = ovl_mono_ns();
        send_ping(p->tx, w->seq);
    }
}

/*
 * l failed or was refused. One line in the log, naming the address and the
 * reason; counted. Before authentication that is a refusal, and the other
 * side is told why (refuse, if not NULL) where it can still hear it; a
 * link of an episode takes its peer down.
 */
static void link_fail(link_t *l, ovl_status_t st, const char *why, const char *refuse)
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

/* What UCX's error handler said, in words. */
static void ucx_failure(const link_t *l, char *why, size_t len)
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
        send_msg(l, &r);
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
            ping_finish(w, OVL_OK, rtt, p->instance, NULL);
        }
        return;
    }
    case OVLD_PEER_BYE:
        snprintf(why, sizeof(why), "it ended the session%s%s", m->reason[0] ? ": " : "", m->reason);
        link_fail(l, m->status, why, NULL);
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
            link_fail(l, OVL_ERR_PROTOCOL, why, why);
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
static void link_up(link_t *l, const char *name, const struct sockaddr_storage *addr)
{
    ovld_peers_t *ps = l->ps;
    char why[WHY_MAX];
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)l->ucx_remote,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = l},
    };
    ucs_status_t us = ucp_ep_create(ps->worker, &ep, &l->ep);
    if (us != UCS_OK) {
        l->ep = NULL;
        snprintf(why, sizeof(why), "cannot create a UCX endpoint to %s: %s", name,
                 ucs_status_string(us));
        link_fail(l, OVL_ERR_SYSTEM, why, why);
        return;
    }
    if (!l->in_map && !sessmap_put(&ps->map, l)) {
        link_fail(l, OVL_ERR_NOMEM, "out of memory", "out of memory");
        return;
    }
    ovld_peer_t *p = l->peer;
    if (!p) {
        p = peer_find(ps, name);
        if (!p && ps->npeers >= OVLD_PEERS_MAX) {
            snprintf(why, sizeof(why), "ovld at %s has %d peers already (OVLD_PEERS_MAX)", ps->self,
                     OVLD_PEERS_MAX);
            link_fail(l, OVL_ERR_LIMIT, why, why);
            return;
        }
        if (!p && !(p = peer_new(ps, name, addr))) {
            link_fail(l, OVL_ERR_NOMEM, "out of memory", "out of memory");
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
        tcp_close(l);
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

/* Takes the other side's UCX address out of m. */
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
        link_fail(l, OVL_ERR_INVALID, "it is this ovld itself", "you connected to yourself");
        return;
    }
    if (!fill_random(l->nonce_s, sizeof(l->nonce_s))) {
        link_fail(l, OVL_ERR_SYSTEM, "getrandom failed", "the acceptor has no random bytes");
        return;
    }
    ovld_peer_msg_t c = self_msg(ps, OVLD_PEER_CHALLENGE, l->nonce_s);
    ovld_peer_transcript_t t = transcript(l, l->claimed);
    ovld_peer_mac(&ps->key, OVLD_PEER_ACCEPTOR, &t, c.mac);
    /* The session is known now: what the connector sends over UCX right
     * after its Auth is held until the Auth is checked. */
    ovld_peer_session(&ps->key, &t, l->session);
    if (sessmap_get(&ps->map, l->session) || !sessmap_put(&ps->map, l)) {
        link_fail(l, OVL_ERR_PROTOCOL, "a session that exists already", "session exists");
        return;
    }
    l->state = L_PROVING;
    frame_send(l, &c);
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
        link_fail(l, OVL_ERR_PERMISSION, why, refuse);
        return;
    }
    if (memcmp(l->inst, ps->instance, sizeof(l->inst)) == 0) {
        snprintf(why, sizeof(why), "%s is this ovld itself", p->name);
        link_fail(l, OVL_ERR_INVALID, why, "you connected to yourself");
        return;
    }
    if (strcmp(m->address, p->name) != 0) {
        snprintf(why, sizeof(why),
                 "the ovld at %s advertises itself as %s: a node is named by the address it "
                 "advertises (peer_advertise)",
                 p->name, m->address);
        snprintf(refuse, sizeof(refuse), "you advertise %s but were reached at %s", m->address,
                 p->name);
        link_fail(l, OVL_ERR_INVALID, why, refuse);
        return;
    }
    ovld_peer_msg_t a;
    memset(&a, 0, sizeof(a));
    a.type = OVLD_PEER_AUTH;
    ovld_peer_mac(&ps->key, OVLD_PEER_CONNECTOR, &t, a.mac);
    ovld_peer_session(&ps->key, &t, l->session);
    if (sessmap_get(&ps->map, l->session)) {
        link_fail(l, OVL_ERR_PROTOCOL, "a session that exists already", "session exists");
        return;
    }
    frame_send(l, &a);
    link_up(l, p->name, &p->addr);
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
        link_fail(l, OVL_ERR_PERMISSION,
                  "wrong cluster key: its proof does not match this node's key",
                  "wrong cluster key: your proof does not match");
        return;
    }
    struct sockaddr_storage ss;
    char name[OVLD_ADDR_TEXT_MAX];
    if (ovld_peer_addr_parse(l->claimed, &ss, name, NULL, 0) != OVL_OK) {
        link_fail(l, OVL_ERR_PROTOCOL, "a bad address", "a bad address");
        return;
    }
    link_up(l, name, &ss);
}

/* One handshake frame, checked and decoded, in l's state. */
static void handle_frame(link_t *l, uint32_t type, const uint8_t *body, size_t len)
{
    char why[WHY_MAX], tb[32];
    ovld_peer_msg_t m;
    ovl_status_t st = ovld_peer_decode(type, body, len, &m, why, sizeof(why));
    if (st != OVL_OK) {
        link_fail(l, st, why, why);
        return;
    }
    l->heard = now_ms(l->ps);
    if (type == OVLD_PEER_REFUSE) {
        snprintf(why, sizeof(why), "the other side refused: %s", m.reason);
        link_fail(l, m.status, why, NULL);
    } else if (l->state == L_ACCEPTED && type == OVLD_PEER_HELLO) {
        on_hello(l, &m);
    } else if (l->state == L_HELLO && type == OVLD_PEER_CHALLENGE) {
        on_challenge(l, &m);
    } else if (l->state == L_PROVING && type == OVLD_PEER_AUTH) {
        on_auth(l, &m);
    } else {
        snprintf(why, sizeof(why), "protocol error: a %s in the handshake's state %s",
                 ovld_peer_type_name(type, tb, sizeof(tb)), link_state_names[l->state]);
        link_fail(l, OVL_ERR_PROTOCOL, why, why);
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
            tcp_close(l);
        } else if (n == UV_EOF) {
            link_fail(l, OVL_ERR_CLOSED,
                      "the other side closed the connection during the handshake", NULL);
        } else {
            snprintf(why, sizeof(why), "connection lost during the handshake (%s)",
                     uv_strerror((int)n));
            link_fail(l, n == UV_ENOBUFS ? OVL_ERR_NOMEM : OVL_ERR_CLOSED, why, NULL);
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
            link_fail(l, st, why, why);
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

static void on_connected(uv_connect_t *req, int status)
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
        link_fail(l, OVL_ERR_CONNECT, why, NULL);
        kick(ps);
        return;
    }
    (void)uv_tcp_nodelay(&l->tcp, 1);
    int r = uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
    if (r != 0) {
        snprintf(why, sizeof(why), "cannot read from the connection: %s", uv_strerror(r));
        link_fail(l, OVL_ERR_SYSTEM, why, NULL);
        kick(ps);
        return;
    }
    ovld_peer_msg_t h = self_msg(ps, OVLD_PEER_HELLO, l->nonce_c);
    l->state = L_HELLO;
    frame_send(l, &h);
    kick(ps);
}

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
    link_close(l);
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
    link_fail(victim, OVL_ERR_LIMIT, why, why);
}

static void on_accept(uv_stream_t *server, int status)
{
    ovld_peers_t *ps = server->data;
    if (status < 0) {
        say(ps, OVLD_REPORT_WARN, "peers: accepting a connection: %s", uv_strerror(status));
        return;
    }
    link_t *l = link_new(ps, false);
    if (!l) {
        say(ps, OVLD_REPORT_WARN, "peers: out of memory accepting a connection");
        return;
    }
    l->state = L_ACCEPTED;
    int r = uv_accept(server, (uv_stream_t *)&l->tcp);
    if (r != 0) {
        say(ps, OVLD_REPORT_DEBUG, "peers: accept: %s", uv_strerror(r));
        link_close(l);
        return;
    }
    struct sockaddr_storage from = {0};
    int flen = sizeof(from);
    snprintf(l->from, sizeof(l->from), "?");
    bool named = uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&from, &flen) == 0;
    if (named)
        ovld_peer_addr_format(&from, l->from, sizeof(l->from));
    if (ps->closing) {
        link_close(l);
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
        link_close(l);
        return;
    }
    say(ps, OVLD_REPORT_DEBUG, "peer connection from %s: accepted, authenticating", l->from);
    kick(ps);
}

/* --------------------------------------------------------- UCX receive */

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
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
    link_t *l = sessmap_get(&ps->map, session);
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
        link_fail(l, st, why, why);
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
            link_fail(l, OVL_ERR_LIMIT, why, why);
            return UCS_OK;
        }
        held_t *h = malloc(sizeof(*h) + length);
        if (!h) {
            link_fail(l, OVL_ERR_NOMEM, "out of memory", "out of memory");
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
        link_fail(l, st, why, why);
    else
        on_up_msg(l, type, &m);
    ovld_peer_msg_clear(&m);
    return UCS_OK;
}

/* ------------------------------------------------------------- reaping */

static void get_post(struct getw *g);

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
        ucx_failure(l, why, sizeof(why));
        link_fail(l, OVL_ERR_CLOSED, why, NULL);
    }
    /* closes due, frees done */
    uint64_t now = now_ms(ps);
    for (link_t *l = ps->links, *next; l; l = next) {
        next = l->next;
        if (l->state == L_CLOSING &&
            ((l->writes == 0 && l->sends == 0) || l->ep_failed || now >= l->deadline))
            link_close(l);
        if (l->state == L_CLOSED && !l->tcp_open && l->writes == 0 &&
            (!l->ep || l->ep_close_done) && l->sends == 0) {
            link_unlink(l);
            link_release(l);
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
    for (getw_t *g = ps->gets; g; g = g->next)
        if (g->more && !g->finished)
            get_post(g);
    for (getw_t **gp = &ps->gets; *gp;) {
        getw_t *g = *gp;
        if (!g->finished) {
            gp = &g->next;
            continue;
        }
        *gp = g->next;
        g->done(g->arg, g->st, g->why);
        free(g);
        gp = &ps->gets; /* the callback may have added reads: from the start */
    }
    ps->in_reap = false;
}

static void drain(ovld_peers_t *ps);

static void on_idle(uv_idle_t *h)
{
    ovld_peers_t *ps = h->data;
    uv_idle_stop(h);
    drain(ps);
}

/* Progress until UCX has nothing left and the worker is armed (the event
 * fd will wake the loop), reaping around it. */
static void drain(ovld_peers_t *ps)
{
    if (ps->in_drain || !ps->worker)
        return;
    ps->in_drain = true;
    ps->kick = false;
    reap(ps);
    for (int round = 0;; round++) {
        while (ucp_worker_progress(ps->worker) != 0)
            ;
        reap(ps);
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

/* ------------------------------------------------------ loop handles */

static void on_efd(uv_poll_t *h, int status, int events)
{
    (void)status; /* an error on an epoll fd: progress anyway */
    (void)events;
    drain(h->data);
}

static void on_prepare(uv_prepare_t *h)
{
    ovld_peers_t *ps = h->data;
    if (ps->kick)
        drain(ps);
}

/* Every TICK_MS: the deadlines, the heartbeats, and a progress in case
 * UCX missed a wakeup. */
static void on_tick(uv_timer_t *h)
{
    ovld_peers_t *ps = h->data;
    uint64_t now = now_ms(ps);
    uint32_t beat = ps->timeout_ms / 4;
    char why[WHY_MAX];
    drain(ps);
    for (link_t *l = ps->links; l; l = l->next) {
        switch (l->state) {
        case L_CONNECTING:
            if (now >= l->deadline) {
                snprintf(why, sizeof(why),
                         "timeout: no TCP connection to %s within %" PRIu32
                         " ms (peer_timeout_ms): is the host up and the port open?",
                         l->peer->name, ps->timeout_ms);
                link_fail(l, OVL_ERR_TIMEOUT, why, NULL);
            }
            break;
        case L_HELLO:
        case L_ACCEPTED:
        case L_PROVING:
            if (now >= l->deadline) {
                snprintf(why, sizeof(why),
                         "timeout: not authenticated within %" PRIu32 " ms (peer_timeout_ms)",
                         ps->timeout_ms);
                link_fail(l, OVL_ERR_TIMEOUT, why, why);
            }
            break;
        case L_UP:
            if (l->tcp_open && now >= l->deadline)
                tcp_close(l); /* the connector's, kept for a late Refuse */
            if (now - l->heard >= ps->timeout_ms) {
                snprintf(why, sizeof(why),
                         "timeout: not heard from for %" PRIu64 " ms (peer_timeout_ms %" PRIu32 ")",
                         now - l->heard, ps->timeout_ms);
                link_fail(l, OVL_ERR_TIMEOUT, why, why);
            } else if (now - l->ping_at >= beat) {
                l->ping_at = now;
                l->ping_seq = ++ps->seq;
                l->ping_ns = ovl_mono_ns();
                send_ping(l, l->ping_seq);
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
        ping_finish(w, OVL_ERR_TIMEOUT, 0, NULL, why);
    }
    drain(ps);
}

static void on_handle_closed(uv_handle_t *h)
{
    handle_gone(h->data);
}

/* ---------------------------------------------------------------- start */

/* UCX's own resources, in reverse order of creation (any may be absent). */
static void ucx_release(ovld_peers_t *ps)
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

static ovl_status_t ucx_start(ovld_peers_t *ps, char *err, size_t errlen)
{
    ucs_status_t st;
    ucp_config_t *uc = NULL;
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
        .cb = on_am,
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
    if ((st = ucx_start(ps, err, errlen)) != OVL_OK) {
        ucx_release(ps);
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
            (uerr = uv_listen((uv_stream_t *)&ps->listener, 128, on_accept)) == 0) {
            what = "starting the peers' loop handles";
            if ((uerr = uv_poll_start(&ps->poll, UV_READABLE, on_efd)) == 0 &&
                (uerr = uv_timer_start(&ps->tick, on_tick, TICK_MS, TICK_MS)) == 0)
                uerr = uv_prepare_start(&ps->prep, on_prepare);
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
        ucx_release(ps);
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
    drain(ps);
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

/* Progresses until done(ps) or ms have passed, sleeping on the event fd
 * in between: for shutdown only, when the loop has nothing else to do. */
static void progress_until(ovld_peers_t *ps, bool (*done)(const ovld_peers_t *), unsigned ms)
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
            send_msg(l, &bye);
    progress_until(ps, sends_done, LINGER_MS);
    for (link_t *l = ps->links; l; l = l->next)
        link_close(l);
    progress_until(ps, closes_done, CLOSE_WAIT_MS);
    if (!closes_done(ps))
        say(ps, OVLD_REPORT_WARN, "peers: UCX did not finish closing within %d ms", CLOSE_WAIT_MS);
    /* Reads UCX has not completed: their keys go before the worker. */
    for (getw_t *g = ps->gets; g; g = g->next) {
        if (g->finished)
            continue;
        ucp_rkey_destroy(g->rkey);
        g->rkey = NULL;
        g->link = NULL;
        g->finished = true;
        g->st = OVL_ERR_SHUTDOWN;
        snprintf(g->why, sizeof(g->why), "reading from peer %s: ovld is shutting down",
                 g->peer->name);
    }
    /* The poll handle goes before the worker closes its event fd; the
     * worker before what its callbacks could reach. */
    uv_close((uv_handle_t *)&ps->poll, on_handle_closed);
    ucx_release(ps);
    /* With the worker gone nothing writes into the reads' buffers any
     * more: their owners hear of them now. */
    while (ps->gets) {
        getw_t *g = ps->gets;
        ps->gets = g->next;
        g->done(g->arg, g->st, g->why);
        free(g);
    }
    sodium_memzero(&ps->key, sizeof(ps->key));
    for (ovld_peer_t *p = ps->peers, *next; p; p = next) {
        next = p->next;
        peer_drop_queue(p);
        free(p);
    }
    ps->peers = NULL;
    while (ps->links) {
        link_t *l = ps->links;
        link_unlink(l);
        l->sends = 0; /* a send UCX never completed went with the worker */
        if (l->tcp_open)
            l->orphan = true; /* its handle's close callback frees it */
        else
            link_release(l);
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
    link_t *l = link_new(ps, true);
    if (!l) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    l->peer = p;
    l->state = L_CONNECTING;
    l->creq.data = l;
    int r = 0;
    if (!fill_random(l->nonce_c, sizeof(l->nonce_c)) ||
        (r = uv_tcp_connect(&l->creq, &l->tcp, (const struct sockaddr *)&p->addr, on_connected)) !=
            0) {
        if (r)
            set_err(err, errlen, "unreachable: cannot connect to %s: %s", name, uv_strerror(r));
        else
            set_err(err, errlen, "getrandom: %s", strerror(errno));
        link_close(l); /* reap frees it */
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
    sbuf_t *sb = sbuf_new(type, body, len);
    if (!sb)
        return OVL_ERR_NOMEM;
    sb->peer = p;
    p->q_bytes += bytes;
    if (p->state == PEER_UP && p->tx) {
        post(p->tx, sb);
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
        send_ping(p->tx, w->seq);
    }
    kick(ps);
    return OVL_OK;
}

/* ------------------------------------------------------- remote reads */

ovl_status_t ovld_peers_mem_map(ovld_peers_t *ps, void *addr, size_t len, ovld_peer_mem_t **ret,
                                char *err, size_t errlen)
{
    if (ps->closing || !ps->ctx) {
        set_err(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    if (!addr || len == 0) {
        set_err(err, errlen, "nothing to map (%zu bytes at %p)", len, addr);
        return OVL_ERR_INVALID;
    }
    ovld_peer_mem_t *m = calloc(1, sizeof(*m));
    if (!m) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    /* Peers read it, and nothing more: no remote write access. */
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT,
        .address = addr,
        .length = len,
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ,
    };
    ucs_status_t us = ucp_mem_map(ps->ctx, &mp, &m->memh);
    if (us != UCS_OK) {
        free(m);
        set_err(err, errlen, "UCX: ucp_mem_map of %zu bytes: %s", len, ucs_status_string(us));
        return OVL_ERR_SYSTEM;
    }
    us = ucp_rkey_pack(ps->ctx, m->memh, &m->rkey, &m->rkey_len);
    if (us != UCS_OK) {
        (void)ucp_mem_unmap(ps->ctx, m->memh);
        free(m);
        set_err(err, errlen, "UCX: ucp_rkey_pack: %s", ucs_status_string(us));
        return OVL_ERR_SYSTEM;
    }
    *ret = m;
    return OVL_OK;
}

const void *ovld_peer_mem_rkey(const ovld_peer_mem_t *m, size_t *ret_len)
{
    *ret_len = m->rkey_len;
    return m->rkey;
}

void ovld_peers_mem_unmap(ovld_peers_t *ps, ovld_peer_mem_t *m)
{
    if (!m)
        return;
    ucp_rkey_buffer_release(m->rkey);
    /* Without a context (closed), the mapping went with it. */
    if (ps->ctx) {
        ucs_status_t us = ucp_mem_unmap(ps->ctx, m->memh);
        if (us != UCS_OK)
            say(ps, OVLD_REPORT_WARN, "peers: ucp_mem_unmap: %s", ucs_status_string(us));
    }
    free(m);
}

/* The whole read is over (its pieces completed, or one failed and the
 * rest completed): its key goes now, while the endpoint it was unpacked on
 * exists; reap calls done. */
static void get_finish(getw_t *g)
{
    ucp_rkey_destroy(g->rkey);
    g->rkey = NULL;
    g->link->sends--;
    g->link = NULL;
    g->finished = true;
    if (!g->failed)
        g->st = OVL_OK;
    kick(g->peer->ps);
}

/* One piece completed (inside progress, or at once when posted): a piece
 * served is the peer heard from, on every link of it. */
static void get_piece_done(getw_t *g, ucs_status_t status)
{
    if (g->finished)
        return; /* the transport closed under it (ovld_peers_close) */
    g->inflight--;
    if (status == UCS_OK) {
        ovld_peers_t *ps = g->peer->ps;
        uint64_t now = now_ms(ps);
        for (link_t *l = ps->links; l; l = l->next)
            if (l->peer == g->peer && l->state == L_UP)
                l->heard = now;
    } else if (!g->failed) {
        g->failed = true;
        g->st = OVL_ERR_CLOSED;
        snprintf(g->why, sizeof(g->why), "reading from peer %s: UCX: %s", g->peer->name,
                 ucs_status_string(status));
    }
    if (g->inflight == 0 && (g->failed || g->posted == g->len))
        get_finish(g);
    else
        g->more = true;
    kick(g->peer->ps);
}

static void on_got(void *req, ucs_status_t status, void *user_data)
{
    get_piece_done(user_data, status);
    ucp_request_free(req);
}

/* Posts the read's next pieces, up to GET_WINDOW in flight (outside UCX's
 * progress: ovld_peer_get, reap). A post refused fails the read. */
static void get_post(getw_t *g)
{
    g->more = false;
    while (!g->finished && !g->failed && g->posted < g->len && g->inflight < GET_WINDOW) {
        size_t n = g->len - g->posted < GET_PIECE ? g->len - g->posted : GET_PIECE;
        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = on_got,
            .user_data = g,
        };
        ucs_status_ptr_t r =
            ucp_get_nbx(g->link->ep, g->dst + g->posted, n, g->raddr + g->posted, g->rkey, &rp);
        g->posted += n;
        g->inflight++;
        if (UCS_PTR_IS_ERR(r))
            get_piece_done(g, UCS_PTR_STATUS(r));
        else if (r == NULL)
            get_piece_done(g, UCS_OK);
    }
    kick(g->peer->ps);
}

ovl_status_t ovld_peer_get(ovld_peer_t *p, uint64_t remote_addr, const void *rkey, size_t rkey_len,
                           void *dst, size_t len, ovld_peer_get_fn done, void *arg, char *err,
                           size_t errlen)
{
    ovld_peers_t *ps = p->ps;
    if (ps->closing) {
        set_err(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    if (!dst || len == 0 || !rkey || rkey_len == 0) {
        set_err(err, errlen, "reading from peer %s: nothing to read (%zu bytes, a key of %zu)",
                p->name, len, rkey_len);
        return OVL_ERR_INVALID;
    }
    link_t *l = p->tx;
    if (p->state != PEER_UP || !l || !l->ep || l->ep_failed) {
        set_err(err, errlen, "reading from peer %s: it is not up", p->name);
        return OVL_ERR_CLOSED;
    }
    getw_t *g = calloc(1, sizeof(*g));
    if (!g) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    /* UCX parses the key without its length (ucp.h): keys come from
     * authenticated peers only. */
    ucs_status_t us = ucp_ep_rkey_unpack(l->ep, rkey, &g->rkey);
    if (us != UCS_OK) {
        free(g);
        set_err(err, errlen, "reading from peer %s: its memory key is refused (%s)", p->name,
                ucs_status_string(us));
        return OVL_ERR_PROTOCOL;
    }
    g->peer = p;
    g->link = l;
    g->raddr = remote_addr;
    g->dst = dst;
    g->len = len;
    g->done = done;
    g->arg = arg;
    l->sends++; /* the link stays until the read completed */
    g->next = ps->gets;
    ps->gets = g;
    get_post(g);
    if (g->finished && g->failed) { /* refused at once, every piece: said here */
        ps->gets = g->next;
        set_err(err, errlen, "%s", g->why);
        free(g);
        return OVL_ERR_CLOSED;
    }
    return OVL_OK;
}

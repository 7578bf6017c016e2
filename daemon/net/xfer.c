/*
 * xfer.c: see xfer.h; the protocol is in docs/multinode.md ("Rows between
 * nodes").
 *
 * A transfer is one entry in its job's table, keyed by (tag, from, to),
 * from the moment the loop takes it in until it is finished:
 *   SEND   posted here: src mapped and announced (RowsReady), until the
 *          receiver's daemon answers (RowsTaken) or its peer goes down;
 *   RECV   posted here: waits for its RowsReady, then reads (ovld_peer_get)
 *          straight into dst, then answers RowsTaken;
 *   READY  a RowsReady with no receive posted yet (or one its sender
 *          withdrew, kept so that the receive fails with its words).
 * A send and a receive posted here cannot share a key (one rank of each
 * is served here), so a key has at most one entry.
 *
 * Memory comes first: a send's rows stay mapped, and its done waits, until
 * the receiver said it will not read them any more (or its peer is down);
 * a receive's done waits until its read completed. So an abort withdraws
 * what was announced (RowsWithdrawn) and waits for the answer, and the
 * buffers of a transfer whose done ran are nobody's any more. Every
 * RowsReady a known job gets is answered once: by the read's outcome, a
 * refusal (limit, mismatch, an aborted job), or its job's abort.
 *
 * Threads: ovld_xfer_send and _recv run on any thread. They check what is
 * fixed (the ranks' nodes), then under mu what changes (shutdown, abort, a
 * node down), and queue the entry for the loop (uv_async). All else is the
 * loop thread's. Done callbacks are called from the async callback, never
 * from inside a caller's call nor from inside UCX's progress; once the
 * mover is destroyed (no async any more), at the end of the call that
 * finished them (destroy itself, a read's completion, a release).
 */
#include "xfer.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "xfer_wire.h"

#define BUCKETS 256 /* per job; OVLD_XFER_MAX_PENDING entries make chains of 16 */
#define WHY_MAX 256

typedef enum xkind { X_SEND, X_RECV, X_READY } xkind_t;

typedef struct xent {
    struct xent *next, *prev; /* in its job's bucket, or in a list of the mover's */
    ovld_xfer_job_t *xj;
    xkind_t kind;
    bool in_table;
    uint64_t seq;
    uint32_t index, from, to;
    size_t bytes;
    void *buf; /* send: src; receive: dst */
    ovld_xfer_done_fn done;
    void *arg;
    ovld_peer_mem_t *mem; /* send: src, mapped */
    bool withdrawn;       /* send: told not to read; READY: its sender said so */
    bool reading;         /* receive: its read is in flight */
    uint64_t raddr;       /* READY: where the rows are, and their key */
    uint8_t *rkey;
    size_t rkey_len;
    ovl_status_t st; /* the outcome; a withdrawn READY's sender's status */
    char why[WHY_MAX];
} xent_t;

struct ovld_xfer_job {
    ovld_xfer_t *x;
    struct ovld_xfer_job *next, *prev; /* x->jobs */
    uint8_t key[OVLD_JOB_NONCE_LEN];
    char name[24]; /* "job x-0123456789abcdef", for words */
    uint32_t world, self_node, nnodes;
    uint32_t *node_of;
    ovld_peer_t **peers;
    /* under x->mu: the posting threads read them */
    ovl_status_t abort_st; /* OVL_OK until aborted */
    char abort_why[WHY_MAX];
    char *down;    /* nnodes strings of WHY_MAX: why the node is down, "" while it is not */
    unsigned owed; /* done calls owed: posted and not called */
    bool released;
    /* the loop's */
    unsigned n; /* entries in the table */
    xent_t *bucket[BUCKETS];
};

struct ovld_xfer {
    uv_loop_t *loop;
    ovld_peers_t *ps;
    ovld_counters_t *counters;
    uv_async_t async;
    pthread_mutex_t mu;
    /* under mu */
    xent_t *posted_head, *posted_tail;
    bool closing;
    /* the loop's */
    bool async_open; /* until destroy: finished transfers wait for the async */
    bool async_gone; /* its close callback ran */
    bool flushing;
    xent_t *fin_head, *fin_tail; /* finished: done to call */
    ovld_xfer_job_t *jobs;
    unsigned reads; /* ovld_peer_get in flight */
};

/* ------------------------------------------------------------- helpers */

static const char *peer_of(const ovld_xfer_job_t *xj, uint32_t rank)
{
    ovld_peer_t *p = xj->peers[xj->node_of[rank]];
    return p ? ovld_peer_name(p) : "this node";
}

/* "rows of rank F for rank T (op S, call I)": names a transfer. */
static void xfer_label(const ovld_xfer_job_t *xj, uint64_t seq, uint32_t index, uint32_t from,
                       uint32_t to, char *buf, size_t len)
{
    snprintf(buf, len,
             "%s: rows of rank %" PRIu32 " for rank %" PRIu32 " (op %" PRIu64 ", call %" PRIu32 ")",
             xj->name, from, to, seq, index);
}

static void list_push(xent_t **head, xent_t **tail, xent_t *e)
{
    e->next = NULL;
    e->prev = *tail;
    if (*tail)
        (*tail)->next = e;
    else
        *head = e;
    *tail = e;
}

static size_t bucket_of(uint64_t seq, uint32_t index, uint32_t from, uint32_t to)
{
    uint64_t h = seq * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)index << 40) ^ ((uint64_t)from << 20) ^ to;
    h *= 0xff51afd7ed558ccdull;
    return (size_t)(h >> 56) % BUCKETS;
}

static xent_t *table_find(const ovld_xfer_job_t *xj, uint64_t seq, uint32_t index, uint32_t from,
                          uint32_t to)
{
    for (xent_t *e = xj->bucket[bucket_of(seq, index, from, to)]; e; e = e->next)
        if (e->seq == seq && e->index == index && e->from == from && e->to == to)
            return e;
    return NULL;
}

static void table_put(ovld_xfer_job_t *xj, xent_t *e)
{
    xent_t **b = &xj->bucket[bucket_of(e->seq, e->index, e->from, e->to)];
    e->prev = NULL;
    e->next = *b;
    if (*b)
        (*b)->prev = e;
    *b = e;
    e->in_table = true;
    xj->n++;
}

static void table_del(ovld_xfer_job_t *xj, xent_t *e)
{
    if (!e->in_table)
        return;
    if (e->prev)
        e->prev->next = e->next;
    else
        xj->bucket[bucket_of(e->seq, e->index, e->from, e->to)] = e->next;
    if (e->next)
        e->next->prev = e->prev;
    e->next = e->prev = NULL;
    e->in_table = false;
    xj->n--;
}

static void ent_free(xent_t *e)
{
    free(e->rkey);
    free(e);
}

/* Sends a message about e's transfer to the peer of `rank`; a failure (the
 * peer down, its queue full) is the caller's to handle, or nothing to do
 * when the message was only an answer. */
static ovl_status_t tell(ovld_xfer_job_t *xj, uint32_t rank, ovld_xfer_msg_t *m)
{
    ovld_peer_t *p = xj->peers[xj->node_of[rank]];
    uint8_t *body;
    size_t len;
    memcpy(m->job, xj->key, sizeof(m->job));
    ovl_status_t st = ovld_xfer_encode(m, &body, &len);
    if (st != OVL_OK)
        return st;
    st = ovld_peer_send(p, m->type, body, len);
    free(body);
    return st;
}

static ovld_xfer_msg_t msg_of(uint32_t type, const xent_t *e, ovl_status_t st, const char *why)
{
    ovld_xfer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.seq = e->seq;
    m.index = e->index;
    m.from = e->from;
    m.to = e->to;
    m.status = st;
    if (why)
        snprintf(m.reason, sizeof(m.reason), "%s", why);
    return m;
}

/* The receiver's answer to a RowsReady (to its sender's peer). */
static void answer_taken(ovld_xfer_job_t *xj, const xent_t *e, ovl_status_t st, const char *why)
{
    ovld_xfer_msg_t m = msg_of(OVLD_XFER_ROWS_TAKEN, e, st, why);
    (void)tell(xj, e->from, &m);
}

/* ------------------------------------------------------ finishing */

/* Queues e's done for the loop (or frees an entry nobody waits on). A
 * send's rows are unmapped here: every path that finishes one knows that
 * nobody reads them any more. Calls nothing: settle() or the async does. */
static void finish(xent_t *e, ovl_status_t st, const char *why)
{
    ovld_xfer_job_t *xj = e->xj;
    ovld_xfer_t *x = xj->x;
    table_del(xj, e);
    if (e->mem) {
        ovld_peers_mem_unmap(x->ps, e->mem);
        e->mem = NULL;
    }
    if (!e->done) {
        ent_free(e);
        return;
    }
    if (st == OVL_OK) {
        if (e->kind == X_SEND) {
            OVLD_COUNT(x->counters, xfer_sends, 1);
            OVLD_COUNT(x->counters, xfer_bytes_out, e->bytes);
        } else {
            OVLD_COUNT(x->counters, xfer_recvs, 1);
            OVLD_COUNT(x->counters, xfer_bytes_in, e->bytes);
        }
    } else {
        OVLD_COUNT(x->counters, xfer_errors, 1);
    }
    e->st = st;
    snprintf(e->why, sizeof(e->why), "%s", st == OVL_OK ? "" : why);
    list_push(&x->fin_head, &x->fin_tail, e);
    if (x->async_open)
        uv_async_send(&x->async);
}

/* Calls the done of every finished transfer. */
static void flush(ovld_xfer_t *x)
{
    if (x->flushing)
        return;
    x->flushing = true;
    while (x->fin_head) {
        xent_t *e = x->fin_head;
        x->fin_head = e->next;
        if (!x->fin_head)
            x->fin_tail = NULL;
        e->done(e->arg, e->st, e->why);
        pthread_mutex_lock(&x->mu);
        e->xj->owed--;
        pthread_mutex_unlock(&x->mu);
        ent_free(e);
    }
    x->flushing = false;
}

/* Frees the released jobs that nothing is left of, then the mover if it
 * was destroyed and nothing is left of it; the caller touches neither
 * after. */
static void collect(ovld_xfer_t *x)
{
    if (x->flushing)
        return; /* the outer flush's caller collects */
    pthread_mutex_lock(&x->mu);
    for (ovld_xfer_job_t *xj = x->jobs, *next; xj; xj = next) {
        next = xj->next;
        if (!xj->released || xj->owed || xj->n)
            continue;
        if (xj->prev)
            xj->prev->next = xj->next;
        else
            x->jobs = xj->next;
        if (xj->next)
            xj->next->prev = xj->prev;
        free(xj->node_of);
        free(xj->peers);
        free(xj->down);
        free(xj);
    }
    bool gone = x->closing && x->async_gone && !x->jobs && !x->reads && !x->fin_head;
    pthread_mutex_unlock(&x->mu);
    if (gone) {
        pthread_mutex_destroy(&x->mu);
        free(x);
    }
}

/* The end of every entry point on the loop thread: once destroyed, nothing
 * waits for the async, so the dones run now; then what is dead goes. */
static void settle(ovld_xfer_t *x)
{
    if (!x->async_open)
        flush(x);
    collect(x);
}

/* --------------------------------------------------------- the moves */

/* Reads e's rows (e a receive that met its RowsReady). */
static void on_read(void *arg, ovl_status_t st, const char *why);

static void start_read(xent_t *e)
{
    ovld_xfer_job_t *xj = e->xj;
    char err[WHY_MAX], label[128], words[WHY_MAX + 160];
    ovld_peer_t *p = xj->peers[xj->node_of[e->from]];
    ovl_status_t st = ovld_peer_get(p, e->raddr, e->rkey, e->rkey_len, e->buf, e->bytes, on_read, e,
                                    err, sizeof(err));
    free(e->rkey);
    e->rkey = NULL;
    if (st != OVL_OK) {
        xfer_label(xj, e->seq, e->index, e->from, e->to, label, sizeof(label));
        snprintf(words, sizeof(words), "%s: %s", label, err);
        answer_taken(xj, e, st, err);
        finish(e, st, words);
        return;
    }
    e->reading = true;
    xj->x->reads++;
    if (!e->in_table)
        table_put(xj, e);
}

static void on_read(void *arg, ovl_status_t st, const char *why)
{
    xent_t *e = arg;
    ovld_xfer_job_t *xj = e->xj;
    ovld_xfer_t *x = xj->x;
    char label[128], words[WHY_MAX + 160];
    x->reads--;
    e->reading = false;
    xfer_label(xj, e->seq, e->index, e->from, e->to, label, sizeof(label));
    snprintf(words, sizeof(words), "%s: %s", label, why);
    /* The sender waits for this either way (also after a RowsWithdrawn). */
    answer_taken(xj, e, st, st == OVL_OK ? NULL : why);
    pthread_mutex_lock(&x->mu);
    ovl_status_t ast = xj->abort_st;
    char awhy[WHY_MAX];
    snprintf(awhy, sizeof(awhy), "%s", xj->abort_why);
    pthread_mutex_unlock(&x->mu);
    if (ast != OVL_OK)
        finish(e, ast, awhy);
    else
        finish(e, st, words);
    settle(x);
}

/* Receive r meets its sender's RowsReady (bytes at raddr under rkey):
 * sizes checked, then read. */
static void meet(xent_t *r, uint64_t bytes, uint64_t raddr, uint8_t *rkey, size_t rkey_len)
{
    ovld_xfer_job_t *xj = r->xj;
    char label[128], detail[160], words[WHY_MAX + 160];
    if (bytes != r->bytes) {
        xfer_label(xj, r->seq, r->index, r->from, r->to, label, sizeof(label));
        snprintf(detail, sizeof(detail),
                 "rank %" PRIu32 " sends %" PRIu64 " bytes, rank %" PRIu32 " receives %zu", r->from,
                 bytes, r->to, r->bytes);
        snprintf(words, sizeof(words), "%s: %s", label, detail);
        free(rkey);
        answer_taken(xj, r, OVL_ERR_MISMATCH, detail);
        finish(r, OVL_ERR_MISMATCH, words);
        return;
    }
    r->raddr = raddr;
    r->rkey = rkey;
    r->rkey_len = rkey_len;
    start_read(r);
}

/* A send: maps src and announces it. */
static void announce(xent_t *e)
{
    ovld_xfer_job_t *xj = e->xj;
    ovld_xfer_t *x = xj->x;
    char err[WHY_MAX], label[128], words[WHY_MAX + 160];
    xfer_label(xj, e->seq, e->index, e->from, e->to, label, sizeof(label));
    ovl_status_t st = ovld_peers_mem_map(x->ps, e->buf, e->bytes, &e->mem, err, sizeof(err));
    if (st != OVL_OK) {
        snprintf(words, sizeof(words), "%s: mapping them: %s", label, err);
        finish(e, st, words);
        return;
    }
    ovld_xfer_msg_t m = msg_of(OVLD_XFER_ROWS_READY, e, OVL_OK, NULL);
    m.addr = (uintptr_t)e->buf;
    m.bytes = e->bytes;
    const void *k = ovld_peer_mem_rkey(e->mem, &m.rkey_len);
    m.rkey = (uint8_t *)k;
    if (m.rkey_len > OVLD_XFER_RKEY_MAX) {
        snprintf(words, sizeof(words),
                 "%s: UCX packed a memory key of %zu bytes, over %u (OVLD_XFER_RKEY_MAX)", label,
                 m.rkey_len, OVLD_XFER_RKEY_MAX);
        finish(e, OVL_ERR_LIMIT, words);
        return;
    }
    st = tell(xj, e->to, &m);
    if (st != OVL_OK) {
        snprintf(words, sizeof(words), "%s: telling peer %s: %s%s", label, peer_of(xj, e->to),
                 ovl_strerror(st),
                 st == OVL_ERR_LIMIT ? " (its queue is full, OVLD_PEER_QUEUE_MAX)" : "");
        finish(e, st, words);
        return;
    }
    table_put(xj, e);
}

/* A refusal of the limit, in words. */
static void limit_words(const ovld_xfer_job_t *xj, char *buf, size_t len)
{
    snprintf(buf, len, "%s has %u transfers pending on %s already (OVLD_XFER_MAX_PENDING)",
             xj->name, OVLD_XFER_MAX_PENDING, ovld_peers_self(xj->x->ps));
}

/* What the loop does with a posted transfer. */
static void take_posted(xent_t *e)
{
    ovld_xfer_job_t *xj = e->xj;
    char label[128], words[WHY_MAX + 160];
    uint32_t other = e->kind == X_SEND ? e->to : e->from;
    xfer_label(xj, e->seq, e->index, e->from, e->to, label, sizeof(label));
    /* abort_st and down change on this thread only: read without mu */
    if (xj->abort_st != OVL_OK) {
        finish(e, xj->abort_st, xj->abort_why);
        return;
    }
    const char *down = xj->down + (size_t)xj->node_of[other] * WHY_MAX;
    if (down[0]) {
        finish(e, OVL_ERR_ABORTED, down);
        return;
    }
    xent_t *old = table_find(xj, e->seq, e->index, e->from, e->to);
    if (old && !(e->kind == X_RECV && old->kind == X_READY)) {
        snprintf(words, sizeof(words), "%s: posted twice", label);
        finish(e, OVL_ERR_INVALID, words);
        return;
    }
    if (old) {
        /* its RowsReady came first */
        table_del(xj, old);
        if (old->withdrawn) {
            finish(e, old->st, old->why);
        } else {
            uint8_t *rkey = old->rkey;
            old->rkey = NULL;
            meet(e, old->bytes, old->raddr, rkey, old->rkey_len);
        }
        ent_free(old);
        return;
    }
    if (xj->n >= OVLD_XFER_MAX_PENDING) {
        char detail[160];
        limit_words(xj, detail, sizeof(detail));
        snprintf(words, sizeof(words), "%s: %s", label, detail);
        finish(e, OVL_ERR_LIMIT, words);
        return;
    }
    if (e->kind == X_SEND)
        announce(e);
    else
        table_put(xj, e);
}

static void on_async(uv_async_t *h)
{
    ovld_xfer_t *x = h->data;
    pthread_mutex_lock(&x->mu);
    xent_t *e = x->posted_head;
    x->posted_head = x->posted_tail = NULL;
    pthread_mutex_unlock(&x->mu);
    while (e) {
        xent_t *next = e->next;
        take_posted(e);
        e = next;
    }
    flush(x);
    collect(x);
}

/* ------------------------------------------------------------ the API */

ovl_status_t ovld_xfer_create(uv_loop_t *loop, ovld_peers_t *ps, ovld_counters_t *counters,
                              ovld_xfer_t **ret, char *err, size_t errlen)
{
    ovld_xfer_t *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    x->loop = loop;
    x->ps = ps;
    x->counters = counters;
    int rc = pthread_mutex_init(&x->mu, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(rc));
        free(x);
        return OVL_ERR_SYSTEM;
    }
    if ((rc = uv_async_init(loop, &x->async, on_async)) != 0) {
        snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
        pthread_mutex_destroy(&x->mu);
        free(x);
        return OVL_ERR_SYSTEM;
    }
    x->async.data = x;
    x->async_open = true;
    *ret = x;
    return OVL_OK;
}

static void on_async_closed(uv_handle_t *h)
{
    ovld_xfer_t *x = h->data;
    x->async_gone = true;
    settle(x);
}

/* Takes e's transfer out of its job for good (abort, peer down, shutdown):
 * what waits for a peer's answer or a read keeps waiting, what does not
 * finishes with st and why; a send gets withdrawn when `withdraw`. */
static void drop_ent(xent_t *e, ovl_status_t st, const char *why, bool withdraw)
{
    ovld_xfer_job_t *xj = e->xj;
    switch (e->kind) {
    case X_SEND:
        if (withdraw && !e->withdrawn) {
            /* Its receiver may be reading: it answers once it is not.
             * Only a peer down (nobody reads) finishes it now; a full
             * queue leaves it to the answer its RowsReady is owed. */
            ovld_xfer_msg_t m = msg_of(OVLD_XFER_ROWS_WITHDRAWN, e, st, why);
            e->withdrawn = true;
            if (tell(xj, e->to, &m) != OVL_ERR_CLOSED)
                return;
        } else if (withdraw) {
            return; /* withdrawn already: the answer is on its way */
        }
        finish(e, st, why);
        return;
    case X_RECV:
        if (!e->reading)
            finish(e, st, why);
        return; /* on_read finishes it */
    case X_READY:
        if (withdraw && !e->withdrawn)
            answer_taken(xj, e, st, why);
        table_del(xj, e);
        ent_free(e);
        return;
    }
}

/* Applies fn to every entry of xj (fn may take the entry out). */
static void each_ent(ovld_xfer_job_t *xj, bool (*pick)(const xent_t *, const void *),
                     const void *arg, ovl_status_t st, const char *why, bool withdraw)
{
    for (size_t b = 0; b < BUCKETS; b++) {
        for (xent_t *e = xj->bucket[b], *next; e; e = next) {
            next = e->next;
            if (!pick || pick(e, arg))
                drop_ent(e, st, why, withdraw);
        }
    }
}

void ovld_xfer_destroy(ovld_xfer_t *x)
{
    if (!x)
        return;
    const char *why = "ovld is shutting down";
    pthread_mutex_lock(&x->mu);
    x->closing = true; /* no post reaches the async from here */
    x->async_open = false;
    xent_t *e = x->posted_head;
    x->posted_head = x->posted_tail = NULL;
    for (ovld_xfer_job_t *xj = x->jobs; xj; xj = xj->next) {
        if (xj->abort_st == OVL_OK) {
            xj->abort_st = OVL_ERR_SHUTDOWN;
            snprintf(xj->abort_why, sizeof(xj->abort_why), "%s", why);
        }
    }
    pthread_mutex_unlock(&x->mu);
    while (e) {
        xent_t *next = e->next;
        finish(e, OVL_ERR_SHUTDOWN, why);
        e = next;
    }
    /* The peers stop with ovld: nobody answers any more, nobody reads. */
    for (ovld_xfer_job_t *xj = x->jobs; xj; xj = xj->next)
        each_ent(xj, NULL, NULL, OVL_ERR_SHUTDOWN, why, false);
    uv_close((uv_handle_t *)&x->async, on_async_closed);
    flush(x); /* x stays until the handle is closed */
}

ovl_status_t ovld_xfer_job_create(ovld_xfer_t *x, const uint8_t key[OVLD_JOB_NONCE_LEN],
                                  uint32_t world, const uint32_t *node_of, uint32_t self_node,
                                  ovld_peer_t *const *peers, uint32_t nnodes, ovld_xfer_job_t **ret,
                                  char *err, size_t errlen)
{
    pthread_mutex_lock(&x->mu);
    bool closing = x->closing;
    pthread_mutex_unlock(&x->mu);
    if (closing) {
        snprintf(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    if (world == 0 || nnodes == 0 || self_node >= nnodes) {
        snprintf(err, errlen, "a job of %" PRIu32 " ranks on %" PRIu32 " nodes, this one %" PRIu32,
                 world, nnodes, self_node);
        return OVL_ERR_INVALID;
    }
    for (uint32_t q = 0; q < world; q++)
        if (node_of[q] >= nnodes) {
            snprintf(err, errlen, "rank %" PRIu32 " on node %" PRIu32 " of %" PRIu32, q, node_of[q],
                     nnodes);
            return OVL_ERR_INVALID;
        }
    for (uint32_t n = 0; n < nnodes; n++)
        if ((n == self_node) != (peers[n] == NULL)) {
            snprintf(err, errlen, "node %" PRIu32 ": %s", n,
                     n == self_node ? "this node's has a peer" : "no peer");
            return OVL_ERR_INVALID;
        }
    for (ovld_xfer_job_t *o = x->jobs; o; o = o->next)
        if (memcmp(o->key, key, OVLD_JOB_NONCE_LEN) == 0) {
            snprintf(err, errlen, "%s has a mover already", o->name);
            return OVL_ERR_EXISTS;
        }
    ovld_xfer_job_t *xj = calloc(1, sizeof(*xj));
    if (xj) {
        xj->node_of = malloc((size_t)world * sizeof(*xj->node_of));
        xj->peers = malloc((size_t)nnodes * sizeof(*xj->peers));
        xj->down = calloc(nnodes, WHY_MAX);
    }
    if (!xj || !xj->node_of || !xj->peers || !xj->down) {
        if (xj) {
            free(xj->node_of);
            free(xj->peers);
            free(xj->down);
        }
        free(xj);
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    xj->x = x;
    memcpy(xj->key, key, OVLD_JOB_NONCE_LEN);
    int at = snprintf(xj->name, sizeof(xj->name), "job x-");
    for (int i = 0; i < 8; i++)
        at += snprintf(xj->name + at, sizeof(xj->name) - (size_t)at, "%02x", key[i]);
    xj->world = world;
    xj->self_node = self_node;
    xj->nnodes = nnodes;
    memcpy(xj->node_of, node_of, (size_t)world * sizeof(*node_of));
    memcpy(xj->peers, peers, (size_t)nnodes * sizeof(*peers));
    xj->next = x->jobs;
    if (x->jobs)
        x->jobs->prev = xj;
    x->jobs = xj;
    *ret = xj;
    return OVL_OK;
}

/* The first abort of xj sets its words; what is pending fails (sends
 * withdrawn and waiting for their answers). */
static void job_abort(ovld_xfer_job_t *xj, ovl_status_t status, const char *why)
{
    ovld_xfer_t *x = xj->x;
    pthread_mutex_lock(&x->mu);
    bool first = xj->abort_st == OVL_OK;
    if (first) {
        xj->abort_st = status != OVL_OK ? status : OVL_ERR_ABORTED;
        snprintf(xj->abort_why, sizeof(xj->abort_why), "%s: %s", xj->name, why);
    }
    pthread_mutex_unlock(&x->mu);
    if (first)
        each_ent(xj, NULL, NULL, xj->abort_st, xj->abort_why, true);
}

void ovld_xfer_job_abort(ovld_xfer_job_t *xj, ovl_status_t status, const char *why)
{
    job_abort(xj, status, why);
    settle(xj->x);
}

void ovld_xfer_job_release(ovld_xfer_job_t *xj)
{
    ovld_xfer_t *x = xj->x;
    job_abort(xj, OVL_ERR_ABORTED, "the job ended here");
    pthread_mutex_lock(&x->mu);
    xj->released = true;
    pthread_mutex_unlock(&x->mu);
    settle(x);
}

/* Checks and queues a send or a receive (any thread). */
static ovl_status_t post(ovld_xfer_job_t *xj, xkind_t kind, ovld_coll_tag_t tag, uint32_t from,
                         uint32_t to, void *buf, size_t bytes, ovld_xfer_done_fn done, void *arg,
                         char *why, size_t whylen)
{
    ovld_xfer_t *x = xj->x;
    uint32_t here = kind == X_SEND ? from : to, there = kind == X_SEND ? to : from;
    if (from >= xj->world || to >= xj->world) {
        snprintf(why, whylen,
                 "%s: rank %" PRIu32 " to rank %" PRIu32 ": out of its %" PRIu32 " ranks", xj->name,
                 from, to, xj->world);
        return OVL_ERR_INVALID;
    }
    if (xj->node_of[here] != xj->self_node || xj->node_of[there] == xj->self_node) {
        snprintf(why, whylen,
                 "%s: a %s of rank %" PRIu32 " to rank %" PRIu32 " between nodes %" PRIu32
                 " and %" PRIu32 ", this is node %" PRIu32,
                 xj->name, kind == X_SEND ? "send" : "receive", from, to, xj->node_of[from],
                 xj->node_of[to], xj->self_node);
        return OVL_ERR_INVALID;
    }
    if (!buf || bytes == 0 || bytes > OVLD_XFER_MAX_BYTES || !done) {
        snprintf(why, whylen, "%s: a transfer of %zu bytes (1 to %llu, OVLD_XFER_MAX_BYTES)",
                 xj->name, bytes, (unsigned long long)OVLD_XFER_MAX_BYTES);
        return OVL_ERR_INVALID;
    }
    xent_t *e = calloc(1, sizeof(*e));
    if (!e) {
        snprintf(why, whylen, "%s: out of memory", xj->name);
        return OVL_ERR_NOMEM;
    }
    *e = (xent_t){.xj = xj,
                  .kind = kind,
                  .seq = tag.seq,
                  .index = tag.index,
                  .from = from,
                  .to = to,
                  .bytes = bytes,
                  .buf = buf,
                  .done = done,
                  .arg = arg};
    ovl_status_t st = OVL_OK;
    const char *down = xj->down + (size_t)xj->node_of[there] * WHY_MAX;
    pthread_mutex_lock(&x->mu);
    if (x->closing) {
        st = OVL_ERR_SHUTDOWN;
        snprintf(why, whylen, "ovld is shutting down");
    } else if (xj->abort_st != OVL_OK) {
        st = xj->abort_st;
        snprintf(why, whylen, "%s", xj->abort_why);
    } else if (down[0]) {
        st = OVL_ERR_ABORTED;
        snprintf(why, whylen, "%s", down);
    } else if (xj->released) {
        st = OVL_ERR_INVALID;
        snprintf(why, whylen, "%s: released", xj->name);
    } else {
        list_push(&x->posted_head, &x->posted_tail, e);
        xj->owed++;
        uv_async_send(&x->async);
    }
    pthread_mutex_unlock(&x->mu);
    if (st != OVL_OK)
        free(e);
    return st;
}

ovl_status_t ovld_xfer_send(ovld_xfer_job_t *xj, ovld_coll_tag_t tag, uint32_t from, uint32_t to,
                            const void *src, size_t bytes, ovld_xfer_done_fn done, void *arg,
                            char *why, size_t whylen)
{
    /* src is only read: mapped for remote reads and nothing else */
    return post(xj, X_SEND, tag, from, to, (void *)src, bytes, done, arg, why, whylen);
}

ovl_status_t ovld_xfer_recv(ovld_xfer_job_t *xj, ovld_coll_tag_t tag, uint32_t from, uint32_t to,
                            void *dst, size_t bytes, ovld_xfer_done_fn done, void *arg, char *why,
                            size_t whylen)
{
    return post(xj, X_RECV, tag, from, to, dst, bytes, done, arg, why, whylen);
}

/* ----------------------------------------------------- peers' messages */

static bool on_node(const xent_t *e, const void *arg)
{
    const ovld_xfer_job_t *xj = e->xj;
    uint32_t n = *(const uint32_t *)arg;
    return xj->node_of[e->from] == n || xj->node_of[e->to] == n;
}

void ovld_xfer_on_down(ovld_xfer_t *x, ovld_peer_t *p, const char *why)
{
    for (ovld_xfer_job_t *xj = x->jobs; xj; xj = xj->next) {
        for (uint32_t n = 0; n < xj->nnodes; n++) {
            if (xj->peers[n] != p)
                continue;
            char *down = xj->down + (size_t)n * WHY_MAX;
            pthread_mutex_lock(&x->mu);
            bool first = !down[0];
            if (first)
                snprintf(down, WHY_MAX, "%s: peer %s (node %" PRIu32 ") is down: %s", xj->name,
                         ovld_peer_name(p), n, why);
            pthread_mutex_unlock(&x->mu);
            if (first)
                each_ent(xj, on_node, &n, OVL_ERR_ABORTED, down, false);
        }
    }
    settle(x);
}

/* A peer's message that names what it may not, or is not one: dropped,
 * counted, said. */
static void drop(ovld_xfer_t *x, ovld_peer_t *p, const char *what)
{
    OVLD_COUNT(x->counters, xfer_dropped, 1);
    log_warn("peer %s: a rows message dropped: %s", ovld_peer_name(p), what);
}

static void on_ready(ovld_xfer_job_t *xj, ovld_xfer_msg_t *m, const char *label)
{
    char words[WHY_MAX + 160];
    xent_t probe = {.seq = m->seq, .index = m->index, .from = m->from, .to = m->to};
    if (xj->abort_st != OVL_OK) {
        answer_taken(xj, &probe, xj->abort_st, xj->abort_why);
        return;
    }
    const char *down = xj->down + (size_t)xj->node_of[m->from] * WHY_MAX;
    if (down[0]) {
        /* a later episode of a peer this job lost: its transfers are over */
        answer_taken(xj, &probe, OVL_ERR_ABORTED, down);
        return;
    }
    xent_t *e = table_find(xj, m->seq, m->index, m->from, m->to);
    if (e && e->kind == X_RECV && !e->reading) {
        uint8_t *rkey = m->rkey;
        m->rkey = NULL;
        meet(e, m->bytes, m->addr, rkey, m->rkey_len);
        return;
    }
    if (e) {
        snprintf(words, sizeof(words), "%s: announced twice", label);
        drop(xj->x, xj->peers[xj->node_of[m->from]], words);
        return;
    }
    if (xj->n >= OVLD_XFER_MAX_PENDING) {
        limit_words(xj, words, sizeof(words));
        answer_taken(xj, &probe, OVL_ERR_LIMIT, words);
        return;
    }
    if (!(e = calloc(1, sizeof(*e)))) {
        answer_taken(xj, &probe, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    *e = (xent_t){.xj = xj,
                  .kind = X_READY,
                  .seq = m->seq,
                  .index = m->index,
                  .from = m->from,
                  .to = m->to,
                  .bytes = m->bytes,
                  .raddr = m->addr,
                  .rkey = m->rkey,
                  .rkey_len = m->rkey_len};
    m->rkey = NULL;
    table_put(xj, e);
}

static void on_taken(ovld_xfer_job_t *xj, const ovld_xfer_msg_t *m, const char *label)
{
    ovld_xfer_t *x = xj->x;
    char words[WHY_MAX + 160];
    xent_t *e = table_find(xj, m->seq, m->index, m->from, m->to);
    if (!e || e->kind != X_SEND) {
        snprintf(words, sizeof(words), "%s: an answer to no send", label);
        drop(x, xj->peers[xj->node_of[m->to]], words);
        return;
    }
    if (e->withdrawn) {
        finish(e, xj->abort_st, xj->abort_why);
    } else if (m->status == OVL_OK) {
        finish(e, OVL_OK, NULL);
    } else {
        snprintf(words, sizeof(words), "%s: not taken by %s: %s", label, peer_of(xj, m->to),
                 m->reason[0] ? m->reason : ovl_strerror(m->status));
        finish(e, m->status, words);
    }
}

static void on_withdrawn(ovld_xfer_job_t *xj, const ovld_xfer_msg_t *m, const char *label)
{
    xent_t *e = table_find(xj, m->seq, m->index, m->from, m->to);
    char words[WHY_MAX + 160];
    snprintf(words, sizeof(words), "%s: withdrawn by %s: %s", label, peer_of(xj, m->from),
             m->reason[0] ? m->reason : ovl_strerror(m->status));
    if (!e || e->kind == X_SEND || (e->kind == X_READY && e->withdrawn))
        return; /* answered already (or never announced) */
    if (e->kind == X_RECV) {
        /* A read in flight answers as it ends; a receive still waiting
         * had its RowsReady refused (and answered). */
        if (!e->reading)
            finish(e, m->status, words);
        return;
    }
    /* a RowsReady no receive met yet: the receive will fail with this */
    free(e->rkey);
    e->rkey = NULL;
    e->withdrawn = true;
    e->st = m->status;
    snprintf(e->why, sizeof(e->why), "%s", words);
    answer_taken(xj, e, m->status, "withdrawn before it was read");
}

void ovld_xfer_on_message(ovld_xfer_t *x, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                          size_t len)
{
    char why[WHY_MAX], label[128], words[WHY_MAX + 160];
    pthread_mutex_lock(&x->mu);
    bool closing = x->closing;
    pthread_mutex_unlock(&x->mu);
    if (closing)
        return;
    ovld_xfer_msg_t m;
    if (ovld_xfer_decode(type, body, len, &m, why, sizeof(why)) != OVL_OK) {
        drop(x, p, why);
        return;
    }
    char tb[32];
    const char *name = ovld_xfer_type_name(type, tb, sizeof(tb));
    ovld_xfer_job_t *xj = x->jobs;
    while (xj && memcmp(xj->key, m.job, OVLD_JOB_NONCE_LEN) != 0)
        xj = xj->next;
    if (!xj) {
        /* A job may have ended here first: nothing to say, but that
         * nobody will read what its sender withdraws. */
        OVLD_COUNT(x->counters, xfer_dropped, 1);
        log_debug("peer %s: a %s of a job this node does not have", ovld_peer_name(p), name);
        if (type == OVLD_XFER_ROWS_WITHDRAWN) {
            ovld_xfer_msg_t t = m;
            t.type = OVLD_XFER_ROWS_TAKEN;
            t.rkey = NULL;
            t.rkey_len = 0;
            t.status = OVL_ERR_NOT_FOUND;
            snprintf(t.reason, sizeof(t.reason), "no such job on %s", ovld_peers_self(x->ps));
            uint8_t *tbody;
            size_t tlen;
            if (ovld_xfer_encode(&t, &tbody, &tlen) == OVL_OK) {
                (void)ovld_peer_send(p, t.type, tbody, tlen);
                free(tbody);
            }
        }
        ovld_xfer_msg_clear(&m);
        return;
    }
    /* The ranks: in the world, the sender's served by p, the receiver's
     * here (a RowsTaken goes the other way). */
    bool to_us = type != OVLD_XFER_ROWS_TAKEN;
    uint32_t theirs = to_us ? m.from : m.to, ours = to_us ? m.to : m.from;
    if (m.from >= xj->world || m.to >= xj->world) {
        snprintf(words, sizeof(words),
                 "a %s of %s for ranks %" PRIu32 " and %" PRIu32 ", of its %" PRIu32, name,
                 xj->name, m.from, m.to, xj->world);
        drop(x, p, words);
    } else if (xj->peers[xj->node_of[theirs]] != p) {
        snprintf(words, sizeof(words),
                 "a %s of %s from rank %" PRIu32 " to rank %" PRIu32 ": rank %" PRIu32
                 " is not served by %s",
                 name, xj->name, m.from, m.to, theirs, ovld_peer_name(p));
        drop(x, p, words);
    } else if (xj->node_of[ours] != xj->self_node) {
        snprintf(words, sizeof(words),
                 "a %s of %s from rank %" PRIu32 " to rank %" PRIu32 ": rank %" PRIu32
                 " is not served here",
                 name, xj->name, m.from, m.to, ours);
        drop(x, p, words);
    } else {
        xfer_label(xj, m.seq, m.index, m.from, m.to, label, sizeof(label));
        if (type == OVLD_XFER_ROWS_READY)
            on_ready(xj, &m, label);
        else if (type == OVLD_XFER_ROWS_TAKEN)
            on_taken(xj, &m, label);
        else
            on_withdrawn(xj, &m, label);
    }
    ovld_xfer_msg_clear(&m);
    settle(x);
}

const ovld_rows_mover_t ovld_xfer_mover = {.send = ovld_xfer_send, .recv = ovld_xfer_recv};

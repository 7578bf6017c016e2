/*
 * host_coll.c: data movement in the host backend: an all-gather is a
 * barrier plus memcpy between the ranks' buffers, on each part's stream
 * thread, standing in for both NCCL methods (it moves what they move and
 * refuses what they cannot, so that a plan the CUDA backend would refuse
 * fails here too); a rail is the same barrier plus memcpy from each sender
 * to its receivers, standing in for grouped ncclSend/ncclRecv; a
 * reduce-scatter is the same barrier, then each part sums its block of
 * every part's rows in fp32, standing in for ncclReduceScatter; a pull
 * (copy) is a memcpy of rows; a reduction (REDUCE) sums a rank's own rows.
 *
 * In a job across nodes the parts are this daemon's ranks only: their
 * rows move among them as above, and to and from the ranks other daemons
 * serve through the job's mover (backend.h), under the call's tag, as point
 * to point sends and receives of dense blocks (a reduce-scatter sends each
 * other rank its block of the partials and sums, in rank order, the blocks
 * it received with those of the parts here). Each part posts its own
 * from its stream thread once its stream reaches the call (its src and
 * dst are then what the plan says), and waits for them before it leaves.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "host_internal.h"

/* Shared by the parts of one all-gather, rail or reduce-scatter. */
struct host_coll {
    uint32_t nparts, arrived, departed, refs;
    uint32_t world; /* the job's ranks (a reduce-scatter's avg divides by it) */
    ovl_dtype_t dtype;
    uint64_t rows, cols, stride;
    bool reduce, avg; /* a reduce-scatter (avg: the sum divided by nparts) */
    /* A rail: part i receives from the parts from[first[i] .. first[i] +
     * nfrom[i]) (indices into parts). NULL for an all-gather: every part
     * from every part. Part b's rows land parts[b].global * stride rows
     * into the receiver's dst. */
    uint32_t *first, *nfrom, *from;
    /* A job across nodes (else NULL): part i sends its rows to the ranks
     * xs[xs_at[i] .. xs_at[i] + xs_n[i]) and receives the rows of the
     * ranks xr[xr_at[i] .. + xr_n[i]) (ranks of the job, served by other
     * daemons), through xfer under tag. One block, xs_at first. */
    struct ovld_xfer_job *xfer;
    const ovld_rows_mover_t *mover; /* its calls on xfer (backend.h) */
    ovld_coll_tag_t tag;
    uint32_t *xs_at, *xs_n, *xr_at, *xr_n, *xs, *xr;
    ovld_allgather_part_t parts[];
};

/* One part's transfers to and from other nodes, on its stream thread:
 * the thread waits (hb->cv) until every done ran. Freed by the last of the
 * thread and the dones (the thread stops waiting at shutdown). */
typedef struct host_xwait {
    host_backend_t *hb;
    uint32_t left; /* posted, done not run */
    uint32_t refs; /* the thread, and each done owed */
    ovl_status_t st;
    char why[200]; /* the first failure's words */
    /* A reduce-scatter's: the other nodes' ranks' partials of this part's
     * block, one dense block each in rank order; freed with the wait, so
     * that a receive still posted at shutdown never writes freed memory. */
    unsigned char *recv;
} host_xwait_t;

static void xwait_free(host_xwait_t *w)
{
    free(w->recv);
    free(w);
}

/* rows x cols elements from src to dst, row by row (a stream thread). */
static void copy_rows(ovld_view_t dst, ovld_view_t src, uint64_t rows, uint64_t cols, size_t elem)
{
    size_t row_bytes = (size_t)cols * elem;
    for (uint64_t i = 0; i < rows; i++)
        memcpy((char *)dst.ptr + i * dst.ld * elem, (const char *)src.ptr + i * src.ld * elem,
               row_bytes);
}

/* Under hb->mu: the first failure of w, kept. */
static void xwait_fail(host_xwait_t *w, ovl_status_t st, const char *why)
{
    if (w->st != OVL_OK)
        return;
    w->st = st;
    snprintf(w->why, sizeof(w->why), "%s", why);
}

/* A transfer's done, on the loop thread. */
static void on_xfer_done(void *arg, ovl_status_t st, const char *why)
{
    host_xwait_t *w = arg;
    host_backend_t *hb = w->hb;
    pthread_mutex_lock(&hb->mu);
    if (st != OVL_OK)
        xwait_fail(w, st, why);
    w->left--;
    bool last = --w->refs == 0;
    pthread_cond_broadcast(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
    if (last)
        xwait_free(w);
}

/* Posts one transfer of w: a send of buf to rank `other`, or a receive
 * from it into buf. */
static void xfer_post(host_xwait_t *w, const host_coll_t *c, uint32_t me, uint32_t other, bool send,
                      void *buf, size_t bytes)
{
    host_backend_t *hb = w->hb;
    char why[200];
    /* counted first: its done may run before the post returns */
    pthread_mutex_lock(&hb->mu);
    w->left++;
    w->refs++;
    pthread_mutex_unlock(&hb->mu);
    ovl_status_t st = send ? c->mover->send(c->xfer, c->tag, me, other, buf, bytes, on_xfer_done, w,
                                            why, sizeof(why))
                           : c->mover->recv(c->xfer, c->tag, other, me, buf, bytes, on_xfer_done, w,
                                            why, sizeof(why));
    if (st == OVL_OK)
        return;
    pthread_mutex_lock(&hb->mu);
    w->left--;
    w->refs--;
    xwait_fail(w, st, why);
    pthread_mutex_unlock(&hb->mu);
}

/* The call's name in words. */
static const char *coll_what(const host_coll_t *c)
{
    return c->reduce ? "reduce-scatter" : c->from ? "rail" : "all-gather";
}

/* Part index's rows to and from other nodes: posted now, while the other
 * parts gather here. An all-gather or a rail sends its rows and receives
 * the others' into their blocks of its dst; a reduce-scatter sends each
 * other rank's block of its partials to it and receives every other rank's
 * partials of its own block into w->recv. NULL (and the failure on the
 * rank) where nothing can be posted. */
static host_xwait_t *xfer_start(host_backend_t *hb, host_coll_t *c, uint32_t index)
{
    const ovld_allgather_part_t *me = &c->parts[index];
    size_t elem = ovl_dtype_size(c->dtype);
    size_t bytes = (size_t)(c->rows * c->cols) * elem; /* dense: checked at the call */
    if (bytes == 0 || c->xs_n[index] + c->xr_n[index] == 0)
        return NULL;
    host_xwait_t *w = calloc(1, sizeof(*w));
    size_t nrecv = c->xr_n[index];
    if (w && c->reduce && !(w->recv = malloc(nrecv * bytes))) { /* nrecv * bytes checked */
        free(w);
        w = NULL;
    }
    if (!w) {
        host_rank_fail(me->rank, OVL_ERR_NOMEM, "%s: rows to and from other nodes: out of memory",
                       coll_what(c));
        return NULL;
    }
    w->hb = hb;
    w->refs = 1;
    for (uint32_t k = 0; k < nrecv; k++) {
        uint32_t q = c->xr[c->xr_at[index] + k];
        void *at = c->reduce ? (void *)(w->recv + k * bytes)
                             : ovld_view_rows(me->dst, q * c->stride, elem).ptr;
        xfer_post(w, c, me->global, q, false, at, bytes);
    }
    for (uint32_t k = 0; k < c->xs_n[index]; k++) {
        uint32_t q = c->xs[c->xs_at[index] + k];
        const void *rows =
            c->reduce ? ovld_view_rows(me->src, q * c->stride, elem).ptr : me->src.ptr;
        xfer_post(w, c, me->global, q, true, (void *)(uintptr_t)rows, bytes);
    }
    return w;
}

/* Waits for w's transfers (or shutdown): their status, with words in why
 * (whylen bytes). The caller still holds its reference. */
static ovl_status_t xfer_settle(host_backend_t *hb, host_xwait_t *w, char *why, size_t whylen)
{
    pthread_mutex_lock(&hb->mu);
    while (w->left > 0 && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    ovl_status_t st = w->left > 0 ? OVL_ERR_SHUTDOWN : w->st;
    snprintf(why, whylen, "%s", w->left > 0 ? "ovld is shutting down" : w->why);
    pthread_mutex_unlock(&hb->mu);
    return st;
}

/* The caller's reference to w, dropped. */
static void xfer_release(host_backend_t *hb, host_xwait_t *w)
{
    pthread_mutex_lock(&hb->mu);
    bool last = --w->refs == 0;
    pthread_mutex_unlock(&hb->mu);
    if (last)
        xwait_free(w);
}

/* Waits for w's transfers (or shutdown); a failure fails the rank's op
 * with the transfer's words. */
static void xfer_wait(host_backend_t *hb, const host_coll_t *c, uint32_t index, host_xwait_t *w)
{
    char why[200];
    ovl_status_t st = xfer_settle(hb, w, why, sizeof(why));
    xfer_release(hb, w);
    if (st != OVL_OK)
        host_rank_fail(c->parts[index].rank, st, "%s: %s", coll_what(c), why);
}

/* One row of a reduction, every reduction of this backend's (the
 * reduce-scatter's and REDUCE's): each of the cols elements of out the sum
 * of the n rows ins[0..n) in that order, in fp32 as NCCL's reduction of
 * these dtypes is, divided by div (1: the sum), stored in the dtype once. */
static void sum_row(ovl_dtype_t dtype, void *out, const void *const *ins, uint32_t n, uint64_t cols,
                    uint32_t div)
{
    for (uint64_t j = 0; j < cols; j++) {
        float sum = 0.0f;
        for (uint32_t b = 0; b < n; b++)
            sum += ovl_load_elem(dtype, ins[b], j);
        sum /= (float)div;
        ovl_store_elem(dtype, out, j, sum);
    }
}

/* Part index's block of a reduce-scatter: row by row, the sum over every
 * rank of the job in rank order (divided by the world for avg): the parts
 * here from their partials, the ranks of other nodes from recv (their
 * blocks in rank order, as xfer_start received them; NULL in a job of
 * one daemon). */
static void reduce_rows(const host_coll_t *c, uint32_t index, const unsigned char *recv)
{
    const ovld_allgather_part_t *me = &c->parts[index];
    size_t elem = ovl_dtype_size(c->dtype);
    size_t bytes = (size_t)(c->rows * c->cols) * elem, row_bytes = (size_t)c->cols * elem;
    const void *ins[OVL_PLAN_MAX_WORLD]; /* world <= the planner's maximum (host_reduce_scatter) */
    for (uint64_t i = 0; i < c->rows; i++) {
        /* the parts and the other nodes' ranks, merged in rank order (both
         * lists are in it) */
        for (uint32_t q = 0, b = 0, k = 0; q < c->world; q++) {
            if (b < c->nparts && c->parts[b].global == q)
                ins[q] = ovld_view_rows(c->parts[b++].src, me->global * c->stride + i, elem).ptr;
            else
                ins[q] = recv + (k++) * bytes + i * row_bytes;
        }
        sum_row(c->dtype, ovld_view_rows(me->dst, i, elem).ptr, ins, c->world, c->cols,
                c->avg ? c->world : 1);
    }
}

/* Part index of the all-gather or rail c, on its stream's thread: waits
 * for every part, gathers (a rail: from its senders), waits until every
 * part has read; frees c after the last. */
static void coll_run(host_backend_t *hb, host_coll_t *c, uint32_t index)
{
    host_xwait_t *w = c->xfer ? xfer_start(hb, c, index) : NULL;
    pthread_mutex_lock(&hb->mu);
    c->arrived++;
    pthread_cond_broadcast(&hb->cv);
    while (c->arrived < c->nparts && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    pthread_mutex_unlock(&hb->mu);

    /* Every rank's inputs are ready: gather them all into this rank's G
     * (a rail: those of the ranks it receives from), or sum this rank's
     * block of them all into its rows (a reduce-scatter, once the other
     * nodes' partials are in). */
    size_t elem = ovl_dtype_size(c->dtype);
    const ovld_allgather_part_t *me = &c->parts[index];
    uint32_t n = c->reduce ? 0 : c->from ? c->nfrom[index] : c->nparts;
    if (c->reduce && w) {
        char why[200];
        ovl_status_t st = xfer_settle(hb, w, why, sizeof(why));
        if (st == OVL_OK)
            reduce_rows(c, index, w->recv);
        xfer_release(hb, w);
        w = NULL;
        if (st != OVL_OK)
            host_rank_fail(me->rank, st, "reduce-scatter: %s", why);
    } else if (c->reduce && c->world == c->nparts) {
        reduce_rows(c, index, NULL);
    } /* else the other nodes' partials could not be received: xfer_start
       * failed the rank's op (and its job across nodes aborts) */
    for (uint32_t x = 0; x < n; x++) {
        uint32_t b = c->from ? c->from[c->first[index] + x] : x;
        copy_rows(ovld_view_rows(me->dst, c->parts[b].global * c->stride, elem), c->parts[b].src,
                  c->rows, c->cols, elem);
    }
    /* Its rows from other nodes are in, and its own were read there. */
    if (w)
        xfer_wait(hb, c, index, w);

    /* Nobody completes before everybody has read: a shard may be reused by
     * its owner once its all-gather is done, as with NCCL. */
    pthread_mutex_lock(&hb->mu);
    c->departed++;
    pthread_cond_broadcast(&hb->cv);
    while (c->departed < c->nparts && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&hb->mu);
    if (last) {
        free(c->first); /* a rail's lists, one block */
        free(c->xs_at); /* the lists of other nodes' ranks, one block */
        free(c);
    }
}

/* Queues part i of c on each part's stream (c->parts[i].rank and stream);
 * frees c (and a rail's lists) where that cannot be done whole, since a
 * collective queued on some ranks only would leave them waiting for
 * ever. */
/* A part's work item, as the stream engine runs it (W_RUN). */
static void coll_part_run(struct ovld_rank *r, host_work_t *w)
{
    coll_run(r->hb, w->u.ag.coll, w->u.ag.index);
}

static ovl_status_t coll_queue(host_coll_t *c, const char *what)
{
    uint32_t n = c->nparts;
    host_work_t **ws = calloc(n, sizeof(*ws));
    host_stream_t **ss = calloc(n, sizeof(*ss));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (!ws || !ss) {
        host_fail(st, "%s: out of memory", what);
        goto fail;
    }
    /* Prepare everything first. */
    for (uint32_t i = 0; i < n; i++) {
        st = host_stream_get(c->parts[i].rank, c->parts[i].stream, &ss[i]);
        if (st != OVL_OK)
            goto fail;
        ws[i] = host_work_new(W_RUN);
        if (!ws[i]) {
            st = host_fail(OVL_ERR_NOMEM, "%s: out of memory", what);
            goto fail;
        }
        ws[i]->run = coll_part_run;
        ws[i]->u.ag.coll = c;
        ws[i]->u.ag.index = i;
    }
    for (uint32_t i = 0; i < n; i++)
        host_stream_push(ss[i], ws[i]);
    free(ws);
    free(ss);
    return OVL_OK;
fail:
    if (ws)
        for (uint32_t i = 0; i < n; i++)
            free(ws[i]);
    free(ws);
    free(ss);
    free(c->first);
    free(c->xs_at);
    free(c);
    return st;
}

/* Part i of a call in a job across nodes, whose mover is xfer: its rank
 * says what job_setup gave it (this job, this world, this rank), and the
 * parts come in rank order. */
static ovl_status_t net_part_check(const char *what, uint32_t i, const struct ovld_rank *r,
                                   uint32_t global, int64_t prev, const struct ovld_xfer_job *xfer,
                                   uint32_t world)
{
    if (r->xfer != xfer || r->world != world || r->global != global)
        return host_fail(OVL_ERR_INVALID,
                         "%s: part %u is rank %u of %u, but its rank is rank %u of %u%s", what, i,
                         global, world, r->global, r->world,
                         r->xfer != xfer ? " of another job (or of one on this daemon)" : "");
    if (global >= world || (int64_t)global <= prev)
        return host_fail(OVL_ERR_INVALID, "%s: part %u is rank %u of %u, out of rank order", what,
                         i, global, world);
    return OVL_OK;
}

/* The lists of other nodes' ranks: 4 * nparts counts and offsets, then
 * nsend + nrecv ranks (c->xs_at owns the block). */
static ovl_status_t xlists_new(host_coll_t *c, size_t nsend, size_t nrecv, const char *what)
{
    size_t n = c->nparts;
    uint32_t *block = calloc(4 * n + nsend + nrecv + 1, sizeof(*block));
    if (!block)
        return host_fail(OVL_ERR_NOMEM, "%s: out of memory", what);
    c->xs_at = block;
    c->xs_n = block + n;
    c->xr_at = block + 2 * n;
    c->xr_n = block + 3 * n;
    c->xs = block + 4 * n;
    c->xr = c->xs + nsend;
    return OVL_OK;
}

/* An all-gather's or a reduce-scatter's lists in a job across nodes: every
 * part sends to and receives from every rank not served here, one list in
 * rank order (the parts are in it too). */
static ovl_status_t xlists_remote(host_coll_t *c, uint32_t world, const char *what)
{
    uint32_t nremote = world - c->nparts;
    if (xlists_new(c, nremote, 0, what) != OVL_OK)
        return OVL_ERR_NOMEM;
    c->xr = c->xs;
    for (uint32_t q = 0, i = 0, k = 0; q < world; q++) {
        if (i < c->nparts && c->parts[i].global == q)
            i++;
        else
            c->xs[k++] = q;
    }
    for (uint32_t i = 0; i < c->nparts; i++)
        c->xs_n[i] = c->xr_n[i] = nremote;
    return OVL_OK;
}

ovl_status_t host_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                            const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                            ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    struct ovld_xfer_job *xfer = nparts ? parts[0].rank->xfer : NULL;
    if (!xfer && nparts != world)
        return host_fail(OVL_ERR_UNSUPPORTED,
                         "all-gather: %u of the job's %u ranks are served here; the host backend "
                         "gathers between its own ranks only",
                         nparts, world);
    for (uint32_t i = 0; i < nparts; i++) {
        if (xfer) {
            ovl_status_t st = net_part_check("all-gather", i, parts[i].rank, parts[i].global,
                                             i ? (int64_t)parts[i - 1].global : -1, xfer, world);
            if (st != OVL_OK)
                return st;
        } else if (parts[i].global != i) {
            return host_fail(OVL_ERR_INVALID, "all-gather: part %u is rank %u's", i,
                             parts[i].global);
        }
    }
    /* What NCCL can move, and nothing else (cuda_nccl.c refuses the same). */
    if (method != OVL_AG_NCCL_ALLGATHER && method != OVL_AG_NCCL_SENDRECV)
        return host_fail(OVL_ERR_UNSUPPORTED, "all-gather method %d: not one the host backend has",
                         (int)method);
    if (method == OVL_AG_NCCL_ALLGATHER && stride != rows)
        return host_fail(OVL_ERR_INVALID,
                         "nccl-allgather places shards back to back: stride %llu, rows %llu",
                         (unsigned long long)stride, (unsigned long long)rows);
    if (stride < rows)
        return host_fail(OVL_ERR_INVALID, "all-gather blocks overlap: stride %llu, rows %llu",
                         (unsigned long long)stride, (unsigned long long)rows);
    for (uint32_t i = 0; i < nparts; i++)
        if (parts[i].src.ld != cols || parts[i].dst.ld != cols)
            return host_fail(OVL_ERR_INVALID,
                             "%s moves dense rows only: part %u has ld %llu and %llu, %llu "
                             "columns",
                             ovl_ag_method_name(method), i, (unsigned long long)parts[i].src.ld,
                             (unsigned long long)parts[i].dst.ld, (unsigned long long)cols);
    host_coll_t *c = calloc(1, sizeof(*c) + nparts * sizeof(parts[0]));
    if (!c)
        return host_fail(OVL_ERR_NOMEM, "all-gather: out of memory");
    *c = (host_coll_t){.nparts = nparts,
                       .refs = nparts,
                       .world = world,
                       .dtype = dtype,
                       .rows = rows,
                       .cols = cols,
                       .stride = stride,
                       .xfer = xfer,
                       .mover = nparts ? parts[0].rank->mover : NULL,
                       .tag = tag};
    memcpy(c->parts, parts, nparts * sizeof(parts[0]));
    if (xfer && xlists_remote(c, world, "all-gather") != OVL_OK) {
        free(c);
        return OVL_ERR_NOMEM;
    }
    return coll_queue(c, "all-gather");
}

/* The part whose job rank is `global`, or -1 (a rank this daemon does not
 * serve). */
static int64_t part_of(const ovld_rail_part_t *parts, uint32_t n, uint32_t global)
{
    for (uint32_t i = 0; i < n; i++)
        if (parts[i].global == global)
            return i;
    return -1;
}

static uint32_t count_of(const uint32_t *v, uint32_t n, uint32_t x)
{
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++)
        c += v[i] == x;
    return c;
}

/* Refuses, with words, a rail NCCL could not complete: a part's sends and
 * receives must match exactly (a send without its receive, or the
 * converse, waits for ever). Between the parts given that is checked both
 * ways; a rank other daemons serve (a job across nodes, across only) is
 * sent to and received from at most once, and its daemon checks its own
 * side. */
static ovl_status_t rail_check(const ovld_rail_part_t *parts, uint32_t n, bool across,
                               uint32_t world)
{
    for (uint32_t i = 0; i < n; i++) {
        const ovld_rail_part_t *x = &parts[i];
        if (part_of(parts, n, x->global) != i)
            return host_fail(OVL_ERR_INVALID, "rail: rank %u has two parts", x->global);
        for (uint32_t k = 0; k < x->nsend + x->nrecv; k++) {
            bool sends = k < x->nsend;
            uint32_t peer = sends ? x->send[k] : x->recv[k - x->nsend];
            int64_t j = part_of(parts, n, peer);
            if (peer == x->global)
                return host_fail(OVL_ERR_INVALID, "rail: rank %u %s itself", x->global,
                                 sends ? "sends to" : "receives from");
            if (j < 0 && !across)
                return host_fail(OVL_ERR_UNSUPPORTED,
                                 "rail: rank %u %s rank %u, which this daemon does not serve (the "
                                 "host backend moves rows between its own ranks only)",
                                 x->global, sends ? "sends to" : "receives from", peer);
            if (j < 0) {
                if (peer >= world ||
                    count_of(sends ? x->send : x->recv, sends ? x->nsend : x->nrecv, peer) != 1)
                    return host_fail(OVL_ERR_INVALID, "rail: rank %u %s rank %u %s", x->global,
                                     sends ? "sends to" : "receives from", peer,
                                     peer >= world ? "past the job's ranks" : "twice");
                continue;
            }
            const ovld_rail_part_t *y = &parts[j];
            if (sends ? count_of(x->send, x->nsend, peer) != 1 ||
                            count_of(y->recv, y->nrecv, x->global) != 1
                      : count_of(x->recv, x->nrecv, peer) != 1 ||
                            count_of(y->send, y->nsend, x->global) != 1)
                return host_fail(OVL_ERR_INVALID,
                                 "rail: rank %u %s rank %u, which does not %s it once (NCCL "
                                 "would wait for ever)",
                                 x->global, sends ? "sends to" : "receives from", peer,
                                 sends ? "receive from" : "send to");
        }
    }
    return OVL_OK;
}

ovl_status_t host_rail(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                       const ovld_rail_part_t *parts, uint32_t nparts, uint32_t world,
                       ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    struct ovld_xfer_job *xfer = nparts ? parts[0].rank->xfer : NULL;
    /* What grouped ncclSend/ncclRecv can move, and nothing else
     * (cuda_nccl.c refuses the same). */
    if (method != OVL_AG_NCCL_RAIL)
        return host_fail(OVL_ERR_UNSUPPORTED, "rail method %d: not one the host backend has",
                         (int)method);
    if (stride < rows)
        return host_fail(OVL_ERR_INVALID, "rail blocks overlap: stride %llu, rows %llu",
                         (unsigned long long)stride, (unsigned long long)rows);
    for (uint32_t i = 0; i < nparts; i++) {
        if (parts[i].src.ld != cols || parts[i].dst.ld != cols)
            return host_fail(OVL_ERR_INVALID,
                             "nccl-rail moves dense rows only: rank %u has ld %llu and %llu, %llu "
                             "columns",
                             parts[i].global, (unsigned long long)parts[i].src.ld,
                             (unsigned long long)parts[i].dst.ld, (unsigned long long)cols);
        ovl_status_t st = xfer ? net_part_check("rail", i, parts[i].rank, parts[i].global,
                                                i ? (int64_t)parts[i - 1].global : -1, xfer, world)
                               : OVL_OK;
        if (st != OVL_OK)
            return st;
    }
    ovl_status_t st = rail_check(parts, nparts, xfer != NULL, world);
    if (st != OVL_OK)
        return st;
    /* the plan's lists live only during the call: the parts' receives from
     * parts here, as part indices, go into one block, and those from and to
     * other nodes' ranks into another */
    size_t local = 0, xsend = 0, xrecv = 0;
    for (uint32_t i = 0; i < nparts; i++) {
        for (uint32_t k = 0; k < parts[i].nrecv; k++) {
            bool here = part_of(parts, nparts, parts[i].recv[k]) >= 0;
            local += here;
            xrecv += !here;
        }
        for (uint32_t k = 0; k < parts[i].nsend; k++)
            xsend += part_of(parts, nparts, parts[i].send[k]) < 0;
    }
    host_coll_t *c = calloc(1, sizeof(*c) + nparts * sizeof(c->parts[0]));
    uint32_t *block = calloc(2 * (size_t)nparts + local + 1, sizeof(*block));
    if (!c || !block) {
        free(c);
        free(block);
        return host_fail(OVL_ERR_NOMEM, "rail: out of memory");
    }
    *c = (host_coll_t){.nparts = nparts,
                       .refs = nparts,
                       .dtype = dtype,
                       .rows = rows,
                       .cols = cols,
                       .stride = stride,
                       .first = block,
                       .nfrom = block + nparts,
                       .from = block + 2 * (size_t)nparts,
                       .xfer = xfer,
                       .mover = nparts ? parts[0].rank->mover : NULL,
                       .tag = tag};
    if (xfer && xlists_new(c, xsend, xrecv, "rail") != OVL_OK) {
        free(c);
        free(block);
        return OVL_ERR_NOMEM;
    }
    for (uint32_t i = 0, at = 0, xs = 0, xr = 0; i < nparts; i++) {
        c->parts[i] = (ovld_allgather_part_t){.rank = parts[i].rank,
                                              .global = parts[i].global,
                                              .stream = parts[i].stream,
                                              .src = parts[i].src,
                                              .dst = parts[i].dst};
        c->first[i] = at;
        if (xfer) {
            c->xs_at[i] = xs;
            c->xr_at[i] = xr;
        }
        for (uint32_t k = 0; k < parts[i].nrecv; k++) {
            int64_t j = part_of(parts, nparts, parts[i].recv[k]);
            if (j >= 0)
                c->from[at++] = (uint32_t)j;
            else /* across nodes: rail_check */
                c->xr[xr++] = parts[i].recv[k];
        }
        for (uint32_t k = 0; xfer && k < parts[i].nsend; k++)
            if (part_of(parts, nparts, parts[i].send[k]) < 0)
                c->xs[xs++] = parts[i].send[k];
        c->nfrom[i] = at - c->first[i];
        if (xfer) {
            c->xs_n[i] = xs - c->xs_at[i];
            c->xr_n[i] = xr - c->xr_at[i];
        }
    }
    return coll_queue(c, "rail");
}

ovl_status_t host_reduce_scatter(ovld_backend_t *b, ovld_coll_tag_t tag,
                                 const ovld_allgather_part_t *parts, uint32_t nparts,
                                 uint32_t world, ovl_dtype_t dtype, uint64_t rows, uint64_t cols,
                                 uint64_t stride, bool avg)
{
    (void)b;
    struct ovld_xfer_job *xfer = nparts ? parts[0].rank->xfer : NULL;
    if (!xfer && nparts != world)
        return host_fail(OVL_ERR_UNSUPPORTED,
                         "reduce-scatter: %u of the job's %u ranks are served here; the host "
                         "backend reduces between its own ranks only",
                         nparts, world);
    if (world > OVL_PLAN_MAX_WORLD || nparts > world)
        return host_fail(OVL_ERR_INVALID, "reduce-scatter: %u parts, world %u (at most %u)", nparts,
                         world, OVL_PLAN_MAX_WORLD);
    for (uint32_t i = 0; i < nparts; i++) {
        if (xfer) {
            ovl_status_t st = net_part_check("reduce-scatter", i, parts[i].rank, parts[i].global,
                                             i ? (int64_t)parts[i - 1].global : -1, xfer, world);
            if (st != OVL_OK)
                return st;
        } else if (parts[i].global != i) {
            return host_fail(OVL_ERR_INVALID, "reduce-scatter: part %u is rank %u's", i,
                             parts[i].global);
        }
    }
    /* a part's receives from the other nodes, a block each: in memory */
    size_t block, recv_bytes;
    if (__builtin_mul_overflow((size_t)rows, (size_t)cols, &block) ||
        __builtin_mul_overflow(block, ovl_dtype_size(dtype), &block) ||
        __builtin_mul_overflow(block, (size_t)(world - nparts), &recv_bytes))
        return host_fail(OVL_ERR_LIMIT, "reduce-scatter: the other nodes' partials overflow");
    (void)recv_bytes; /* each part's, which xfer_start allocates: it fits */
    if (stride < rows)
        return host_fail(OVL_ERR_INVALID, "reduce-scatter blocks overlap: stride %llu, rows %llu",
                         (unsigned long long)stride, (unsigned long long)rows);
    /* What ncclReduceScatter reads: dense rows of partials, the blocks
     * back to back or, for a chunk, stride apart in one dense matrix. Its
     * output may be strided (a row at a time here, as the CUDA backend
     * will through a dense staging buffer). */
    for (uint32_t i = 0; i < nparts; i++)
        if (parts[i].src.ld != cols)
            return host_fail(OVL_ERR_INVALID,
                             "reduce-scatter reads dense rows only: part %u's partials have ld "
                             "%llu, %llu columns",
                             i, (unsigned long long)parts[i].src.ld, (unsigned long long)cols);
    host_coll_t *c = calloc(1, sizeof(*c) + nparts * sizeof(parts[0]));
    if (!c)
        return host_fail(OVL_ERR_NOMEM, "reduce-scatter: out of memory");
    *c = (host_coll_t){.nparts = nparts,
                       .refs = nparts,
                       .world = world,
                       .dtype = dtype,
                       .rows = rows,
                       .cols = cols,
                       .stride = stride,
                       .reduce = true,
                       .avg = avg,
                       .xfer = xfer,
                       .mover = nparts ? parts[0].rank->mover : NULL,
                       .tag = tag};
    memcpy(c->parts, parts, nparts * sizeof(parts[0]));
    if (xfer && xlists_remote(c, world, "reduce-scatter") != OVL_OK) {
        free(c);
        return OVL_ERR_NOMEM;
    }
    return coll_queue(c, "reduce-scatter");
}

static void reduce_run(struct ovld_rank *r, host_work_t *w)
{
    (void)r;
    const void *ins[OVL_PLAN_MAX_WORLD];
    size_t elem = ovl_dtype_size(w->u.reduce.dtype);
    for (uint64_t i = 0; i < w->u.reduce.rows; i++) {
        for (uint32_t b = 0; b < w->u.reduce.nblocks; b++)
            ins[b] = ovld_view_rows(w->u.reduce.src, b * w->u.reduce.stride + i, elem).ptr;
        sum_row(w->u.reduce.dtype, ovld_view_rows(w->u.reduce.dst, i, elem).ptr, ins,
                w->u.reduce.nblocks, w->u.reduce.cols, w->u.reduce.div);
    }
}

ovl_status_t host_reduce(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                         uint64_t rows, uint64_t cols, uint32_t nblocks, uint64_t stride,
                         ovl_dtype_t dtype, uint32_t div)
{
    if (nblocks == 0 || nblocks > OVL_PLAN_MAX_WORLD || div == 0 || ovl_dtype_size(dtype) == 0)
        return host_fail(OVL_ERR_INVALID, "reduce: %u blocks, divisor %u, dtype %d", nblocks, div,
                         (int)dtype);
    if (nblocks > 1 && stride < rows)
        return host_fail(OVL_ERR_INVALID, "reduce: blocks overlap: stride %llu, rows %llu",
                         (unsigned long long)stride, (unsigned long long)rows);
    host_work_t *w = host_work_new(W_RUN);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "reduce: out of memory");
    w->run = reduce_run;
    w->u.reduce.dst = dst;
    w->u.reduce.src = src;
    w->u.reduce.rows = rows;
    w->u.reduce.cols = cols;
    w->u.reduce.stride = stride;
    w->u.reduce.nblocks = nblocks;
    w->u.reduce.div = div;
    w->u.reduce.dtype = dtype;
    return host_enqueue(r, stream, w);
}

static void copy_run(struct ovld_rank *r, host_work_t *w)
{
    (void)r;
    copy_rows(w->u.copy.dst, w->u.copy.src, w->u.copy.rows, w->u.copy.cols, w->u.copy.elem);
}

ovl_status_t host_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                       uint64_t rows, uint64_t cols, size_t elem)
{
    host_work_t *w = host_work_new(W_RUN);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "copy: out of memory");
    w->run = copy_run;
    w->u.copy.dst = dst;
    w->u.copy.src = src;
    w->u.copy.rows = rows;
    w->u.copy.cols = cols;
    w->u.copy.elem = elem;
    return host_enqueue(r, stream, w);
}

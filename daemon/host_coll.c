/*
 * host_coll.c: data movement in the host backend: an all-gather is a
 * barrier plus memcpy between the ranks' buffers, on each part's stream
 * thread, standing in for both NCCL methods (it moves what they move and
 * refuses what they cannot, so that a plan the CUDA backend would refuse
 * fails here too); a rail is the same barrier plus memcpy from each sender
 * to its receivers, standing in for grouped ncclSend/ncclRecv between the
 * ranks of one daemon (a topology simulated inside one node); a pull
 * (copy) is a memcpy of rows.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

/* Shared by the parts of one all-gather or rail. */
struct host_coll {
    uint32_t nparts, arrived, departed, refs;
    ovl_dtype_t dtype;
    uint64_t rows, cols, stride;
    /* A rail: part i receives from the parts from[first[i] .. first[i] +
     * nfrom[i]) (indices into parts), each sender's rows landing
     * global[sender] * stride rows into i's dst. NULL for an all-gather:
     * every part from every part, part b's rows b * stride rows in. */
    uint32_t *first, *nfrom, *from, *global;
    ovld_allgather_part_t parts[];
};

void host_copy_rows(ovld_view_t dst, ovld_view_t src, uint64_t rows, uint64_t cols, size_t elem)
{
    size_t row_bytes = (size_t)cols * elem;
    for (uint64_t i = 0; i < rows; i++)
        memcpy((char *)dst.ptr + i * dst.ld * elem, (const char *)src.ptr + i * src.ld * elem,
               row_bytes);
}

void host_coll_run(host_backend_t *hb, host_coll_t *c, uint32_t index)
{
    pthread_mutex_lock(&hb->mu);
    c->arrived++;
    pthread_cond_broadcast(&hb->cv);
    while (c->arrived < c->nparts && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    pthread_mutex_unlock(&hb->mu);

    /* Every rank's inputs are ready: gather them all into this rank's G
     * (a rail: those of the ranks it receives from). */
    size_t elem = ovl_dtype_size(c->dtype);
    const ovld_allgather_part_t *me = &c->parts[index];
    uint32_t n = c->from ? c->nfrom[index] : c->nparts;
    for (uint32_t x = 0; x < n; x++) {
        uint32_t b = c->from ? c->from[c->first[index] + x] : x;
        uint64_t at = c->from ? c->global[b] : b;
        host_copy_rows(ovld_view_rows(me->dst, at * c->stride, elem), c->parts[b].src, c->rows,
                       c->cols, elem);
    }

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
        free(c);
    }
}

/* Queues part i of c on each part's stream (c->parts[i].rank and stream);
 * frees c (and a rail's lists) where that cannot be done whole, since a
 * collective queued on some ranks only would leave them waiting for
 * ever. */
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
        ws[i] = host_work_new(W_ALLGATHER);
        if (!ws[i]) {
            st = host_fail(OVL_ERR_NOMEM, "%s: out of memory", what);
            goto fail;
        }
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
    free(c);
    return st;
}

ovl_status_t host_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                            const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                            ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag;
    if (nparts != world)
        return host_fail(OVL_ERR_UNSUPPORTED,
                         "all-gather: %u of the job's %u ranks are served here; the host backend "
                         "gathers between its own ranks only",
                         nparts, world);
    for (uint32_t i = 0; i < nparts; i++)
        if (parts[i].global != i)
            return host_fail(OVL_ERR_INVALID, "all-gather: part %u is rank %u's", i,
                             parts[i].global);
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
                       .dtype = dtype,
                       .rows = rows,
                       .cols = cols,
                       .stride = stride};
    memcpy(c->parts, parts, nparts * sizeof(parts[0]));
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
 * converse, waits for ever), within the parts given: the host backend
 * moves rows between the ranks of this daemon only. */
static ovl_status_t rail_check(const ovld_rail_part_t *parts, uint32_t n)
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
            if (j < 0)
                return host_fail(OVL_ERR_UNSUPPORTED,
                                 "rail: rank %u %s rank %u, which this daemon does not serve (the "
                                 "host backend moves rows between its own ranks only)",
                                 x->global, sends ? "sends to" : "receives from", peer);
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
    (void)tag;
    (void)world;
    (void)b;
    /* What grouped ncclSend/ncclRecv can move, and nothing else
     * (cuda_nccl.c refuses the same). */
    if (method != OVL_AG_NCCL_RAIL)
        return host_fail(OVL_ERR_UNSUPPORTED, "rail method %d: not one the host backend has",
                         (int)method);
    if (stride < rows)
        return host_fail(OVL_ERR_INVALID, "rail blocks overlap: stride %llu, rows %llu",
                         (unsigned long long)stride, (unsigned long long)rows);
    for (uint32_t i = 0; i < nparts; i++)
        if (parts[i].src.ld != cols || parts[i].dst.ld != cols)
            return host_fail(OVL_ERR_INVALID,
                             "nccl-rail moves dense rows only: rank %u has ld %llu and %llu, %llu "
                             "columns",
                             parts[i].global, (unsigned long long)parts[i].src.ld,
                             (unsigned long long)parts[i].dst.ld, (unsigned long long)cols);
    ovl_status_t st = rail_check(parts, nparts);
    if (st != OVL_OK)
        return st;
    /* the plan's lists live only during the call: the parts' receives, as
     * part indices, go into one block with the other lists */
    size_t total = 0;
    for (uint32_t i = 0; i < nparts; i++)
        total += parts[i].nrecv;
    host_coll_t *c = calloc(1, sizeof(*c) + nparts * sizeof(c->parts[0]));
    uint32_t *block = calloc(3 * (size_t)nparts + total + 1, sizeof(*block));
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
                       .global = block + 2 * (size_t)nparts,
                       .from = block + 3 * (size_t)nparts};
    for (uint32_t i = 0, at = 0; i < nparts; i++) {
        c->parts[i] = (ovld_allgather_part_t){.rank = parts[i].rank,
                                              .stream = parts[i].stream,
                                              .src = parts[i].src,
                                              .dst = parts[i].dst};
        c->global[i] = parts[i].global;
        c->first[i] = at;
        c->nfrom[i] = parts[i].nrecv;
        for (uint32_t k = 0; k < parts[i].nrecv; k++) /* found: rail_check */
            c->from[at++] = (uint32_t)part_of(parts, nparts, parts[i].recv[k]);
    }
    return coll_queue(c, "rail");
}

ovl_status_t host_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                       uint64_t rows, uint64_t cols, size_t elem)
{
    host_work_t *w = host_work_new(W_COPY);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "copy: out of memory");
    w->u.copy.dst = dst;
    w->u.copy.src = src;
    w->u.copy.rows = rows;
    w->u.copy.cols = cols;
    w->u.copy.elem = elem;
    return host_enqueue(r, stream, w);
}

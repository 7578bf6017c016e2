/*
 * host_coll.c: data movement in the host backend: an all-gather is a
 * barrier plus memcpy between the ranks' buffers, on each part's stream
 * thread, standing in for both NCCL methods (it moves what they move and
 * refuses what they cannot, so that a plan the CUDA backend would refuse
 * fails here too); a pull (copy) is a memcpy of rows.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

/* Shared by the parts of one all-gather. */
struct host_coll {
    uint32_t nparts, arrived, departed, refs;
    ovl_dtype_t dtype;
    uint64_t rows, cols, stride;
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

    /* Every rank's inputs are ready: gather them all into this rank's G. */
    size_t elem = ovl_dtype_size(c->dtype);
    const ovld_allgather_part_t *me = &c->parts[index];
    for (uint32_t b = 0; b < c->nparts; b++)
        host_copy_rows(ovld_view_rows(me->dst, (uint64_t)b * c->stride, elem), c->parts[b].src,
                       c->rows, c->cols, elem);

    /* Nobody completes before everybody has read: a shard may be reused by
     * its owner once its all-gather is done, as with NCCL. */
    pthread_mutex_lock(&hb->mu);
    c->departed++;
    pthread_cond_broadcast(&hb->cv);
    while (c->departed < c->nparts && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&hb->mu);
    if (last)
        free(c);
}

ovl_status_t host_allgather(ovld_backend_t *b, ovl_ag_method_t method,
                            const ovld_allgather_part_t *parts, uint32_t nparts, ovl_dtype_t dtype,
                            uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
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
    host_work_t **ws = calloc(nparts, sizeof(*ws));
    host_stream_t **ss = calloc(nparts, sizeof(*ss));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (!c || !ws || !ss) {
        host_fail(st, "all-gather: out of memory");
        goto fail;
    }
    *c = (host_coll_t){.nparts = nparts,
                       .refs = nparts,
                       .dtype = dtype,
                       .rows = rows,
                       .cols = cols,
                       .stride = stride};
    memcpy(c->parts, parts, nparts * sizeof(parts[0]));
    /* Prepare everything first: a collective queued on some ranks only
     * would leave them waiting forever. */
    for (uint32_t i = 0; i < nparts; i++) {
        st = host_stream_get(parts[i].rank, parts[i].stream, &ss[i]);
        if (st != OVL_OK)
            goto fail;
        ws[i] = host_work_new(W_ALLGATHER);
        if (!ws[i]) {
            st = host_fail(OVL_ERR_NOMEM, "all-gather: out of memory");
            goto fail;
        }
        ws[i]->u.ag.coll = c;
        ws[i]->u.ag.index = i;
    }
    for (uint32_t i = 0; i < nparts; i++)
        host_stream_push(ss[i], ws[i]);
    free(ws);
    free(ss);
    return OVL_OK;
fail:
    if (ws)
        for (uint32_t i = 0; i < nparts; i++)
            free(ws[i]);
    free(ws);
    free(ss);
    free(c);
    return st;
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

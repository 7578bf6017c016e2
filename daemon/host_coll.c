/*
 * host_coll.c: data movement in the host backend: an all-gather is a
 * barrier plus memcpy between the ranks' buffers, on each part's stream
 * thread; a pull (copy) is a memcpy of rows.
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
    uint64_t m, k, row0, rows;
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
        host_copy_rows(ovld_view_rows(me->g, (uint64_t)b * c->m + c->row0, elem),
                       ovld_view_rows(c->parts[b].src, c->row0, elem), c->rows, c->k, elem);

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

ovl_status_t host_allgather(ovld_backend_t *b, const ovld_allgather_part_t *parts, uint32_t nparts,
                            ovl_dtype_t dtype, uint64_t m, uint64_t k, uint64_t row0, uint64_t rows)
{
    (void)b;
    host_coll_t *c = calloc(1, sizeof(*c) + nparts * sizeof(parts[0]));
    host_work_t **ws = calloc(nparts, sizeof(*ws));
    host_stream_t **ss = calloc(nparts, sizeof(*ss));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (!c || !ws || !ss)
        goto fail;
    *c = (host_coll_t){.nparts = nparts,
                       .refs = nparts,
                       .dtype = dtype,
                       .m = m,
                       .k = k,
                       .row0 = row0,
                       .rows = rows};
    memcpy(c->parts, parts, nparts * sizeof(parts[0]));
    /* Prepare everything first: a collective queued on some ranks only
     * would leave them waiting forever. */
    for (uint32_t i = 0; i < nparts; i++) {
        st = host_stream_get(parts[i].rank, parts[i].stream, &ss[i]);
        if (st != OVL_OK)
            goto fail;
        ws[i] = host_work_new(W_ALLGATHER);
        if (!ws[i]) {
            st = OVL_ERR_NOMEM;
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
        return OVL_ERR_NOMEM;
    w->u.copy.dst = dst;
    w->u.copy.src = src;
    w->u.copy.rows = rows;
    w->u.copy.cols = cols;
    w->u.copy.elem = elem;
    return host_enqueue(r, stream, w);
}

/*
 * cuda_nccl.c: communication in the CUDA backend: per job one NCCL
 * communicator per local rank, created nonblocking in one group off the loop
 * thread (job_setup) and finalized the same way (job_teardown); the
 * all-gather, by exactly the NCCL method the plan names (strided layouts
 * and jobs without NCCL are gathered by the plans' own pulls, never here);
 * the rail between nodes (grouped ncclSend/ncclRecv between the ranks the
 * plan names, on the job's communicator); and the pulls
 * (cudaMemcpy(2D)Async from a peer's mapping).
 */
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "clock.h"

#define NCCL_LAUNCH_LIMIT_NS (5000ull * 1000 * 1000) /* a grouped launch on the loop thread */
#define NCCL_WAIT_BATCH      64 /* communicators whose launch one nccl_wait call polls */

/* --------------------------------------------------------------- NCCL */

typedef struct setup_work {
    uv_work_t req;
    cuda_backend_t *cb;
    struct ovld_rank **ranks;
    uint32_t n;
    ovld_setup_cb done;
    void *arg;
    ovl_status_t st;
    char msg[256];
    bool teardown;
    bool no_comms; /* setup: the job's plans never use the collective */
} setup_work_t;

/* Waits for nonblocking communicators to leave ncclInProgress, until
 * deadline_ns (CLOCK_MONOTONIC; 0: no limit), after which it returns
 * ncclInProgress. */
static ncclResult_t nccl_wait(struct ovld_rank **ranks, uint32_t n, uint64_t deadline_ns)
{
    for (;;) {
        bool busy = false;
        for (uint32_t i = 0; i < n; i++) {
            ncclResult_t r = ncclSuccess;
            ncclResult_t q = ncclCommGetAsyncError(ranks[i]->nccl, &r);
            if (q != ncclSuccess)
                return q;
            if (r == ncclInProgress)
                busy = true;
            else if (r != ncclSuccess)
                return r;
        }
        if (!busy)
            return ncclSuccess;
        if (deadline_ns && ovl_mono_ns() > deadline_ns)
            return ncclInProgress;
        sched_yield();
    }
}

static void setup_run(uv_work_t *req)
{
    setup_work_t *w = req->data;
    if (w->no_comms)
        return; /* the plans will not ask for the collective (backend.h) */
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        w->st = OVL_ERR_BACKEND;
        snprintf(w->msg, sizeof(w->msg), "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* so that a fault can be detected and aborted */
    /* Not ncclCommInitAll, which takes no config (API-NOTES 0.3). */
    r = ncclGroupStart();
    for (uint32_t i = 0; r == ncclSuccess && i < w->n; i++) {
        if (cudaSetDevice(w->ranks[i]->dev->ordinal) != cudaSuccess) {
            r = ncclUnhandledCudaError;
            break;
        }
        r = ncclCommInitRankConfig(&w->ranks[i]->nccl, (int)w->n, id, (int)i, &cfg);
        if (r == ncclInProgress)
            r = ncclSuccess;
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess && e != ncclSuccess && e != ncclInProgress)
        r = e;
    if (r == ncclSuccess)
        r = nccl_wait(w->ranks, w->n, 0); /* a worker: setup takes what it takes */
    if (r != ncclSuccess) {
        w->st = OVL_ERR_BACKEND;
        snprintf(w->msg, sizeof(w->msg), "NCCL communicator setup for %u ranks: %s", w->n,
                 ncclGetErrorString(r));
        for (uint32_t i = 0; i < w->n; i++)
            if (w->ranks[i]->nccl) {
                ncclCommAbort(w->ranks[i]->nccl);
                w->ranks[i]->nccl = NULL;
            }
    }
}

static void setup_after(uv_work_t *req, int status)
{
    setup_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    if (!w->teardown)
        for (uint32_t i = 0; i < w->n; i++)
            w->ranks[i]->setup_pending = false;
    if (status == UV_ECANCELED && w->st == OVL_OK) {
        w->st = OVL_ERR_SHUTDOWN;
        snprintf(w->msg, sizeof(w->msg), "cancelled");
    }
    if (w->done)
        w->done(w->arg, w->st, w->msg);
    free(w->ranks);
    free(w);
    cuda_work_done(cb);
}

ovl_status_t cuda_job_setup(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                            const ovld_job_net_t *net, bool collective, ovld_setup_cb cb, void *arg)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
    if (net)
        return OVL_ERR_UNSUPPORTED; /* jobs across nodes: not yet */
    setup_work_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->ranks = calloc(n, sizeof(*w->ranks)))) {
        free(w);
        return OVL_ERR_NOMEM;
    }
    memcpy(w->ranks, ranks, n * sizeof(*ranks));
    w->req.data = w;
    w->cb = be;
    w->n = n;
    w->done = cb;
    w->arg = arg;
    w->no_comms = !collective;
    for (uint32_t i = 0; i < n; i++)
        ranks[i]->setup_pending = true;
    atomic_fetch_add(&be->works, 1);
    int rc = uv_queue_work(be->loop, &w->req, setup_run, setup_after);
    if (rc != 0) {
        atomic_fetch_sub(&be->works, 1);
        for (uint32_t i = 0; i < n; i++)
            ranks[i]->setup_pending = false;
        free(w->ranks);
        free(w);
        return OVL_ERR_SYSTEM;
    }
    return OVL_OK;
}

static void teardown_run(uv_work_t *req)
{
    setup_work_t *w = req->data;
    /* ncclCommDestroy is collective within the node: finalize all, then
     * destroy all (NCCL's own single-process example). A communicator that
     * failed is aborted instead, as NCCL asks. */
    for (uint32_t i = 0; i < w->n; i++) {
        struct ovld_rank *rk = w->ranks[i];
        if (!rk->nccl)
            continue;
        ncclResult_t e = cudaSetDevice(rk->dev->ordinal) == cudaSuccess ? ncclCommFinalize(rk->nccl)
                                                                        : ncclUnhandledCudaError;
        if (e != ncclSuccess && e != ncclInProgress)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN, "device %d: ncclCommFinalize: %s",
                        rk->dev->ordinal, ncclGetErrorString(e));
    }
    for (uint32_t i = 0; i < w->n; i++) {
        struct ovld_rank *rk = w->ranks[i];
        if (!rk->nccl)
            continue;
        ncclResult_t r = ncclSuccess, q;
        while ((q = ncclCommGetAsyncError(rk->nccl, &r)) == ncclSuccess && r == ncclInProgress)
            sched_yield();
        if (q != ncclSuccess)
            r = q;
        ncclResult_t e = r == ncclSuccess ? ncclCommDestroy(rk->nccl) : ncclCommAbort(rk->nccl);
        if (r != ncclSuccess)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN,
                        "device %d: the job's communicator failed (%s): aborted", rk->dev->ordinal,
                        ncclGetErrorString(r));
        if (e != ncclSuccess)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN, "device %d: %s: %s",
                        rk->dev->ordinal, r == ncclSuccess ? "ncclCommDestroy" : "ncclCommAbort",
                        ncclGetErrorString(e));
        rk->nccl = NULL;
    }
    for (uint32_t i = 0; i < w->n; i++) {
        cuda_rank_free_resources(w->ranks[i]);
        free(w->ranks[i]);
    }
}

void cuda_job_teardown(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
    setup_work_t *w = calloc(1, sizeof(*w));
    struct ovld_rank **copy = calloc(n ? n : 1, sizeof(*copy));
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (ranks[i]) {
            cuda_rank_unlink(ranks[i]);
            if (copy)
                copy[k++] = ranks[i];
        }
    if (!w || !copy) {
        free(w);
        free(copy);
        return; /* out of memory: leak rather than block the loop */
    }
    w->req.data = w;
    w->cb = be;
    w->ranks = copy;
    w->n = k;
    w->teardown = true;
    atomic_fetch_add(&be->works, 1);
    if (uv_queue_work(be->loop, &w->req, teardown_run, setup_after) != 0) {
        atomic_fetch_sub(&be->works, 1);
        teardown_run(&w->req);
        free(copy);
        free(w);
    }
}

/* ------------------------------------------------- all-gather and pulls */

static ncclDataType_t nccl_type(ovl_dtype_t dt)
{
    switch (dt) {
    case OVL_DTYPE_BF16:
        return ncclBfloat16;
    case OVL_DTYPE_FP16:
        return ncclFloat16;
    case OVL_DTYPE_FP32:
        return ncclFloat32;
    }
    return ncclFloat32;
}

static ovl_status_t copy_rows(struct ovld_rank *r, cudaStream_t s, ovld_view_t dst, ovld_view_t src,
                              uint64_t rows, uint64_t cols, size_t elem)
{
    if (rows == 0 || cols == 0)
        return OVL_OK;
    if (dst.ld == cols && src.ld == cols)
        CUDA_TRY(r->cb, cudaMemcpyAsync(dst.ptr, src.ptr, rows * cols * elem, cudaMemcpyDefault, s),
                 "copy");
    else
        CUDA_TRY(r->cb,
                 cudaMemcpy2DAsync(dst.ptr, dst.ld * elem, src.ptr, src.ld * elem, cols * elem,
                                   rows, cudaMemcpyDefault, s),
                 "copy (2D)");
    (void)r;
    return OVL_OK;
}

/* Refuses, with words, an all-gather NCCL cannot do as asked: its rows
 * must be dense (one piece per rank), ncclAllGather's shards back to back,
 * and part i the communicator's rank i of n. */
static ovl_status_t allgather_check(ovl_ag_method_t method, const ovld_allgather_part_t *parts,
                                    uint32_t n, size_t elem, uint64_t rows, uint64_t cols,
                                    uint64_t stride)
{
    const char *name = ovl_ag_method_name(method);
#define REFUSE(st, ...)                                                                            \
    do {                                                                                           \
        snprintf(cuda_last_err, sizeof(cuda_last_err), __VA_ARGS__);                               \
        return (st);                                                                               \
    } while (0)
    if (!name || method == OVL_AG_NCCL_RAIL)
        REFUSE(OVL_ERR_UNSUPPORTED, "all-gather method %d: not one the CUDA backend has",
               (int)method);
    if (elem == 0)
        REFUSE(OVL_ERR_INVALID, "%s: unknown dtype", name);
    if (method == OVL_AG_NCCL_ALLGATHER && stride != rows)
        REFUSE(OVL_ERR_INVALID, "%s places shards back to back: stride %" PRIu64 ", rows %" PRIu64,
               name, stride, rows);
    if (stride < rows)
        REFUSE(OVL_ERR_INVALID, "%s: blocks overlap: stride %" PRIu64 ", rows %" PRIu64, name,
               stride, rows);
    if (cols != 0 && rows > SIZE_MAX / cols / elem)
        REFUSE(OVL_ERR_LIMIT, "%s: %" PRIu64 " x %" PRIu64 " elements do not fit in memory", name,
               rows, cols);
    for (uint32_t i = 0; i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        int count = 0, rank = -1;
        if (x->src.ld != cols || x->dst.ld != cols)
            REFUSE(OVL_ERR_INVALID,
                   "%s moves dense rows only: rank %u has ld %" PRIu64 " and %" PRIu64
                   " for %" PRIu64 " columns",
                   name, i, x->src.ld, x->dst.ld, cols);
        if (!x->rank->nccl)
            REFUSE(OVL_ERR_UNSUPPORTED, "%s: rank %u has no NCCL communicator", name, i);
        ncclResult_t r = ncclCommCount(x->rank->nccl, &count);
        if (r == ncclSuccess)
            r = ncclCommUserRank(x->rank->nccl, &rank);
        if (r != ncclSuccess)
            REFUSE(OVL_ERR_BACKEND, "%s: rank %u's communicator: %s", name, i,
                   ncclGetErrorString(r));
        if (count != (int)n || rank != (int)i)
            REFUSE(OVL_ERR_INTERNAL, "%s: part %u of %u is rank %d of a communicator of %d", name,
                   i, n, rank, count);
        if (!cuda_stream(x->rank, x->stream))
            return OVL_ERR_INVALID; /* cuda_stream said why */
    }
#undef REFUSE
    return OVL_OK;
}

/* Part i's rank, whatever the parts' type (launch_wait). */
typedef struct ovld_rank *(*part_rank_fn)(const void *parts, uint32_t i);

static struct ovld_rank *allgather_rank(const void *parts, uint32_t i)
{
    return ((const ovld_allgather_part_t *)parts)[i].rank;
}

static struct ovld_rank *rail_rank(const void *parts, uint32_t i)
{
    return ((const ovld_rail_part_t *)parts)[i].rank;
}

/*
 * After a grouped launch that said ncclInProgress: nonblocking comms take
 * nothing else on their streams before the launch is complete (API-NOTES
 * 1.3), so this waits for every part's communicator. It runs on the loop
 * thread: a launch that is not complete within NCCL_LAUNCH_LIMIT_NS (a GPU
 * that no longer moves) fails the op rather than hold every client up for
 * ever (ncclInProgress then).
 */
static ncclResult_t launch_wait(const void *parts, uint32_t n, part_rank_fn rank_of)
{
    uint64_t deadline = ovl_mono_ns() + NCCL_LAUNCH_LIMIT_NS;
    struct ovld_rank *rk[NCCL_WAIT_BATCH];
    uint32_t done = 0;
    ncclResult_t r = ncclSuccess;
    while (done < n) {
        uint32_t c = 0;
        for (; c < NCCL_WAIT_BATCH && done + c < n; c++)
            rk[c] = rank_of(parts, done + c);
        r = nccl_wait(rk, c, deadline);
        if (r != ncclSuccess)
            break;
        done += c;
    }
    return r;
}

ovl_status_t cuda_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                            const ovld_allgather_part_t *parts, uint32_t n, uint32_t world,
                            ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)tag;
    if (n != world) {
        snprintf(cuda_last_err, sizeof(cuda_last_err), "all-gather across daemons: not yet");
        return OVL_ERR_UNSUPPORTED;
    }
    (void)b;
    size_t elem = ovl_dtype_size(dtype);
    ovl_status_t st = allgather_check(method, parts, n, elem, rows, cols, stride);
    if (st != OVL_OK)
        return st;
    const char *name = ovl_ag_method_name(method);
    size_t count = (size_t)(rows * cols);
    ncclDataType_t t = nccl_type(dtype);
    cudaError_t ce = cudaSuccess; /* the own chunk's copy, inside the group */
    ncclResult_t r = ncclGroupStart();
    for (uint32_t i = 0; r == ncclSuccess && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        cudaStream_t s = cuda_stream(x->rank, x->stream); /* checked above */
        if (method == OVL_AG_NCCL_ALLGATHER) {
            r = ncclAllGather(x->src.ptr, x->dst.ptr, count, t, x->rank->nccl, s);
            continue;
        }
        /* send/recv: rank p's rows land stride*p rows into dst */
        for (uint32_t p = 0; r == ncclSuccess && p < n; p++) {
            void *dst = ovld_view_rows(x->dst, p * stride, elem).ptr;
            if (p == i) {
                ce = cudaSetDevice(x->rank->dev->ordinal);
                if (ce == cudaSuccess)
                    ce =
                        cudaMemcpyAsync(dst, x->src.ptr, count * elem, cudaMemcpyDeviceToDevice, s);
                if (ce != cudaSuccess)
                    r = ncclUnhandledCudaError;
                continue;
            }
            r = ncclSend(x->src.ptr, count, t, (int)p, x->rank->nccl, s);
            if (r == ncclSuccess)
                r = ncclRecv(dst, count, t, (int)p, x->rank->nccl, s);
        }
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess)
        r = e;
    if (r == ncclInProgress)
        r = launch_wait(parts, n, allgather_rank);
    if (r != ncclSuccess) {
        if (ce != cudaSuccess)
            snprintf(cuda_last_err, sizeof(cuda_last_err), "%s: the own rows' copy: %s", name,
                     cudaGetErrorString(ce));
        else
            snprintf(cuda_last_err, sizeof(cuda_last_err), "%s of %" PRIu64 " rows: %s", name, rows,
                     r == ncclInProgress ? "launch not complete after 5 s (is the GPU stalled?)"
                                         : ncclGetErrorString(r));
        return OVL_ERR_BACKEND;
    }
    return OVL_OK;
}

/* Refuses, with words, a rail NCCL cannot do as asked: dense rows (one
 * piece per peer), blocks that do not overlap, and every part on a
 * communicator of the job whose rank is the part's job rank, its peers
 * ranks of that communicator other than its own. Matching sends with
 * receives is the plans' (the checker proves it): NCCL cannot tell a
 * missing one from a late one. */
static ovl_status_t rail_check(ovl_ag_method_t method, const ovld_rail_part_t *parts, uint32_t n,
                               size_t elem, uint64_t rows, uint64_t cols, uint64_t stride)
{
#define REFUSE(st, ...)                                                                            \
    do {                                                                                           \
        snprintf(cuda_last_err, sizeof(cuda_last_err), __VA_ARGS__);                               \
        return (st);                                                                               \
    } while (0)
    if (method != OVL_AG_NCCL_RAIL)
        REFUSE(OVL_ERR_UNSUPPORTED, "rail method %d: not one the CUDA backend has", (int)method);
    if (elem == 0)
        REFUSE(OVL_ERR_INVALID, "nccl-rail: unknown dtype");
    if (stride < rows)
        REFUSE(OVL_ERR_INVALID, "nccl-rail: blocks overlap: stride %" PRIu64 ", rows %" PRIu64,
               stride, rows);
    if (cols != 0 && rows > SIZE_MAX / cols / elem)
        REFUSE(OVL_ERR_LIMIT, "nccl-rail: %" PRIu64 " x %" PRIu64 " elements do not fit in memory",
               rows, cols);
    for (uint32_t i = 0; i < n; i++) {
        const ovld_rail_part_t *x = &parts[i];
        int count = 0, rank = -1;
        if (x->src.ld != cols || x->dst.ld != cols)
            REFUSE(OVL_ERR_INVALID,
                   "nccl-rail moves dense rows only: rank %u has ld %" PRIu64 " and %" PRIu64
                   " for %" PRIu64 " columns",
                   x->global, x->src.ld, x->dst.ld, cols);
        if (!x->rank->nccl)
            REFUSE(OVL_ERR_UNSUPPORTED, "nccl-rail: rank %u has no NCCL communicator", x->global);
        ncclResult_t r = ncclCommCount(x->rank->nccl, &count);
        if (r == ncclSuccess)
            r = ncclCommUserRank(x->rank->nccl, &rank);
        if (r != ncclSuccess)
            REFUSE(OVL_ERR_BACKEND, "nccl-rail: rank %u's communicator: %s", x->global,
                   ncclGetErrorString(r));
        if (rank < 0 || (uint32_t)rank != x->global)
            REFUSE(OVL_ERR_INTERNAL, "nccl-rail: part of rank %u is rank %d of its communicator",
                   x->global, rank);
        for (uint32_t k = 0; k < x->nsend + x->nrecv; k++) {
            uint32_t peer = k < x->nsend ? x->send[k] : x->recv[k - x->nsend];
            if (peer == x->global || peer >= (uint32_t)count)
                REFUSE(OVL_ERR_INTERNAL, "nccl-rail: rank %u names rank %u of a communicator of %d",
                       x->global, peer, count);
        }
        if (!cuda_stream(x->rank, x->stream))
            return OVL_ERR_INVALID; /* cuda_stream said why */
    }
#undef REFUSE
    return OVL_OK;
}

ovl_status_t cuda_rail(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                       const ovld_rail_part_t *parts, uint32_t n, uint32_t world, ovl_dtype_t dtype,
                       uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag;
    (void)world;
    size_t elem = ovl_dtype_size(dtype);
    ovl_status_t st = rail_check(method, parts, n, elem, rows, cols, stride);
    if (st != OVL_OK)
        return st;
    size_t count = (size_t)(rows * cols);
    ncclDataType_t t = nccl_type(dtype);
    /* Every local part's sends and receives in one group: NCCL matches
     * them with each other and with other processes' (other nodes') in
     * any order, and a rank that sends to a peer which receives later in
     * the group does not wait for it. */
    ncclResult_t r = ncclGroupStart();
    for (uint32_t i = 0; r == ncclSuccess && i < n; i++) {
        const ovld_rail_part_t *x = &parts[i];
        cudaStream_t s = cuda_stream(x->rank, x->stream); /* checked above */
        for (uint32_t k = 0; r == ncclSuccess && k < x->nsend; k++)
            r = ncclSend(x->src.ptr, count, t, (int)x->send[k], x->rank->nccl, s);
        for (uint32_t k = 0; r == ncclSuccess && k < x->nrecv; k++) {
            /* rank q's rows land stride*q rows into dst */
            void *dst = ovld_view_rows(x->dst, (uint64_t)x->recv[k] * stride, elem).ptr;
            r = ncclRecv(dst, count, t, (int)x->recv[k], x->rank->nccl, s);
        }
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess)
        r = e;
    if (r == ncclInProgress)
        r = launch_wait(parts, n, rail_rank);
    if (r != ncclSuccess) {
        snprintf(cuda_last_err, sizeof(cuda_last_err), "nccl-rail of %" PRIu64 " rows: %s", rows,
                 r == ncclInProgress ? "launch not complete after 5 s (is the GPU stalled?)"
                                     : ncclGetErrorString(r));
        return OVL_ERR_BACKEND;
    }
    return OVL_OK;
}

ovl_status_t cuda_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                       uint64_t rows, uint64_t cols, size_t elem)
{
    USE_DEVICE(r);
    cudaStream_t s = cuda_stream(r, stream);
    if (!s)
        return OVL_ERR_INVALID; /* cuda_stream said why */
    return copy_rows(r, s, dst, src, rows, cols, elem);
}

/*
 * backend_cuda.c: the CUDA backend. One process drives every GPU of the
 * node: per rank non-blocking streams at the priorities of the roles the
 * plans give them (the doorbell's, communication and copies highest, GEMMs
 * lowest), events, a doorbell (a host page the two share, whose slots both
 * processes' streams wait on; proto/doorbell.h), a cuBLASLt workspace per
 * stream index; per job one NCCL communicator per local rank, created
 * nonblocking in one group off the loop thread; for a job across nodes
 * the communicators span every node (the id from the coordinating
 * daemon's job_key, each local rank at its job rank), and job_abort ends
 * them (ncclCommAbort, off the loop thread) when the job loses a node. Client
 * buffers arrive as CUDA IPC handles, opened once per (device, handle) and
 * kept in a reference-counted cache.
 *
 * What the primitives become:
 *   WAIT_READY  cuStreamWaitValue64(ready_slot[seq % slots] >= seq) on the
 *               rank's stream 0, the slots being in the shared host page:
 *               the client's stream writes them, and when the client is
 *               gone ovld releases the waits with CPU stores
 *               (cuda_rank_release; proto/doorbell.h says why slots)
 *   RECORD/WAIT cudaEventRecord / cudaStreamWaitEvent (across devices too)
 *   ALLGATHER   exactly the method the plan names: ncclAllGather (whole
 *               dense shards) or grouped ncclSend/ncclRecv with every other
 *               rank of the job (dense chunks), the parts of all local
 *               ranks in one NCCL group (across nodes the other daemons
 *               issue the others'); anything else is refused (plans gather
 *               strided layouts by PULLs)
 *   RAIL        grouped ncclSend/ncclRecv between the ranks the plan names
 *               (job ranks of the job's communicator), all local ranks'
 *               in one NCCL group; dense rows only
 *   PULL        cudaMemcpy(2D)Async from the peer's mapping (copy engine)
 *   GEMM        cuBLASLt (cuda_gemm.c)
 *   SLEEP       kernels.cu
 *   DONE        error word (if failed), then done_slot[seq % slots] = seq
 *               and done = seq in the shared page, then seq in the
 *               ringing rank's own counter (the origin's, for every rank
 *               of a replayed op), in one batch of stream memory operations;
 *               the poller thread reports the completion to the loop once
 *               the counter reached it, and a watchdog timer catches what
 *               the GPU will never write (a context error).
 *   replay      an op's body captured once into a CUDA graph (stream
 *               capture of the primitives above), launched for later ops
 *               of the same key between the eager WAIT_READY and DONE
 *
 * The backend is split by subsystem, each file with its part: backend_cuda.c
 * (the vtable, create/destroy, devices), cuda_rank.c, cuda_mem.c,
 * cuda_nccl.c, cuda_done.c, cuda_graph.c and cuda_gemm.c; cuda_internal.h
 * is what they share.
 *
 * Device memory is taken when ranks are created (workspaces, events) or when scratch grows between
 * ops, never between the launches of one collective: cudaMalloc and cudaFree may synchronize every
 * GPU.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "heap.h"

#define WATCHDOG_MS 100

/* ------------------------------------------------- errors, in one place */

static const char *cuda_last_error(ovld_backend_t *b)
{
    (void)b;
    return cuda_last_err;
}

/* ------------------------------------------------------------- devices */

static void cuda_destroy(ovld_backend_t *b);

static uint32_t cuda_device_count(ovld_backend_t *b)
{
    return ((cuda_backend_t *)b)->ndev;
}

static void cuda_device_info(ovld_backend_t *b, uint32_t index, ovld_device_info_t *ret)
{
    *ret = ((cuda_backend_t *)b)->devs[index].info;
}

static void cuda_device_usage(ovld_backend_t *b, uint32_t index, uint32_t *streams, uint64_t *bytes)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    *streams = 0;
    *bytes = 0;
    for (struct ovld_rank *r = cb->ranks; r; r = r->next) {
        if (r->dev != &cb->devs[index])
            continue;
        *bytes += r->scratch_bytes; /* the doorbell is host memory */
        for (uint32_t i = 0; i < r->nslots; i++)
            for (int c = 0; c < CUDA_PRIO_COUNT; c++)
                *streams += r->slots[i].s[c] != NULL;
        for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++)
            *streams += r->cap_pool[i] != NULL;
        for (uint32_t i = 0; i < CUDA_WORKSPACES; i++)
            *bytes += r->workspace[i] ? OVLD_LT_WORKSPACE : 0;
    }
}

/* -------------------------------------------------------------- lifetime */

/* ------------------------------------------------------------ create */

static const ovld_backend_ops_t cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .device_count = cuda_device_count,
    .device_info = cuda_device_info,
    .device_usage = cuda_device_usage,
    .import_blocking = true,
    .mem_import = cuda_mem_import,
    .mem_release = cuda_mem_release,
    .rank_create = cuda_rank_create,
    .rank_destroy = cuda_rank_destroy,
    .rank_release = cuda_rank_release,
    .rank_fail = cuda_rank_fail_op,
    .job_setup = cuda_job_setup,
    .job_key = cuda_job_key,
    .job_abort = cuda_job_abort,
    .job_teardown = cuda_job_teardown,
    .rank_scratch = cuda_rank_scratch,
    .wait_ready = cuda_wait_ready,
    .time_start = cuda_time_start,
    .ready_seen = cuda_ready_seen,
    .record = cuda_record,
    .wait = cuda_wait,
    .allgather = cuda_allgather,
    .rail = cuda_rail,
    .reduce_scatter = cuda_reduce_scatter,
    .copy = cuda_copy,
    .gemm = cuda_gemm,
    .sleep = cuda_sleep,
    .reduce = cuda_reduce,
    .done = cuda_done,
    .last_error = cuda_last_error,
    .issue_parallel = true,
    .reserve_events = cuda_reserve_events,
    .set_streams = cuda_set_streams,
    .graph_capture = cuda_graph_capture,
    .graph_end = cuda_graph_end,
    .graph_run = cuda_graph_run,
    .graph_free = cuda_graph_free,
    .mem_cache_stats = cuda_mem_cache_stats,
};

static void on_cq_closed(ovld_cq_t *q)
{
    cuda_backend_t *cb = (cuda_backend_t *)((char *)q - offsetof(cuda_backend_t, cq));
    cb->cq_closed = true;
    if (atomic_load(&cb->works) == 0)
        cuda_backend_free(cb); /* else the last work item does */
}

static void cuda_destroy(ovld_backend_t *b)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    uv_timer_stop(&cb->watchdog);
    uv_close((uv_handle_t *)&cb->watchdog, NULL);
    cuda_poller_stop(cb); /* before the queue it pushes to closes */
    ovld_cq_close(&cb->cq, on_cq_closed);
}

/* How much the host heap grew since *mark, which moves to now: a part of
 * the start's cost. Other threads (the driver's) move the same counter, so
 * a figure for operators, not an account; a shrink counts as 0. */
static uint64_t heap_grew(uint64_t *mark)
{
    uint64_t now = ovld_heap_bytes(), d = now > *mark ? now - *mark : 0;
    *mark = now;
    return d;
}

ovl_status_t ovld_backend_cuda_create(uv_loop_t *loop, const ovld_config_t *cfg,
                                      ovld_done_cb done_cb, void *done_arg,
                                      const ovld_reporter_t *report, ovld_backend_t **ret,
                                      char *err, size_t errlen)
{
    uint64_t heap_mark = ovld_heap_bytes(), heap_ctx = 0, heap_lt = 0, heap_peer = 0;
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "cudaGetDeviceCount: %s", ovl_cuda_why(ce));
        return OVL_ERR_UNSUPPORTED;
    }
    if (n == 0) {
        snprintf(err, errlen, "no CUDA device");
        return OVL_ERR_UNSUPPORTED;
    }
    cuda_backend_t *cb = calloc(1, sizeof(*cb));
    if (!cb || !(cb->devs = calloc((size_t)n, sizeof(*cb->devs)))) {
        free(cb);
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    cb->base.ops = &cuda_ops;
    if (report)
        cb->base.report = *report;
    cb->loop = loop;
    cb->cap_streams = cfg ? cfg->capture_streams : 0;
    pthread_mutex_init(&cb->ipc_mu, NULL);
    pthread_mutex_init(&cb->ranks_mu, NULL);
    pthread_mutex_init(&cb->poll_mu, NULL);
    pthread_cond_init(&cb->poll_cv, NULL);
    if (ovl_cudrv_load(&cb->drv, err, errlen) != 0)
        goto fail;
    uint64_t heap_drv = heap_grew(&heap_mark);
    for (int i = 0; i < n; i++) {
        cuda_dev_t *dev = &cb->devs[i];
        struct cudaDeviceProp prop;
        dev->ordinal = i;
        if ((ce = cudaGetDeviceProperties(&prop, i)) != cudaSuccess ||
            (ce = cudaSetDevice(i)) != cudaSuccess ||
            (ce = cudaDeviceGetStreamPriorityRange(&dev->prio_lo, &dev->prio_hi)) != cudaSuccess) {
            snprintf(err, errlen, "device %d: %s", i, cudaGetErrorString(ce));
            goto fail;
        }
        memcpy(dev->info.uuid, prop.uuid.bytes, OVLD_UUID_LEN);
        snprintf(dev->info.name, sizeof(dev->info.name), "%s", prop.name);
        dev->info.total_memory = prop.totalGlobalMem;
        int drv = 0;
        if (cudaDriverGetVersion(&drv) == cudaSuccess)
            snprintf(dev->info.driver, sizeof(dev->info.driver), "cuda %d", drv);
        int mps = 0;
        if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, i) != cudaSuccess)
            mps = 0;
        dev->info.mps = mps != 0;
        if (!mps)
            ovld_report(&cb->base.report, OVLD_REPORT_WARN,
                        "device %d (%s): MPS is not running: the GPU will time-slice between "
                        "ovld's context and every client's, and each op will wait for a time "
                        "slice (about 2 ms); start nvidia-cuda-mps-control (docs/performance.md)",
                        i, prop.name);
        heap_ctx += heap_grew(&heap_mark);
        if (ovld_lt_create(&dev->lt, err, errlen) != OVL_OK)
            goto fail;
        heap_lt += heap_grew(&heap_mark);
        cb->ndev++;
        /* Peer access both ways wherever the hardware allows: pulls and NCCL
         * go over NVLink. */
        for (int p = 0; p < n; p++) {
            int can = 0;
            if (p == i || cudaDeviceCanAccessPeer(&can, i, p) != cudaSuccess || !can)
                continue;
            ce = cudaDeviceEnablePeerAccess(p, 0);
            if (ce != cudaSuccess && ce != cudaErrorPeerAccessAlreadyEnabled)
                ovld_report(&cb->base.report, OVLD_REPORT_WARN, "peer access %d -> %d: %s", i, p,
                            cudaGetErrorString(ce));
            (void)cudaGetLastError();
        }
        heap_peer += heap_grew(&heap_mark);
    }
    if (ovld_cq_init(&cb->cq, loop, done_cb, done_arg) != 0) {
        snprintf(err, errlen, "completion queue");
        goto fail;
    }
    if (cuda_poller_start(cb, err, errlen) != OVL_OK) {
        ovld_cq_close(&cb->cq, on_cq_closed); /* frees the backend once closed */
        return OVL_ERR_SYSTEM;
    }
    uv_timer_init(loop, &cb->watchdog);
    cb->watchdog.data = cb;
    uv_timer_start(&cb->watchdog, cuda_on_watchdog, WATCHDOG_MS, WATCHDOG_MS);
    ovld_report(&cb->base.report, OVLD_REPORT_INFO,
                "CUDA backend: %u device%s; host heap %.1f MiB, grown by %.1f MiB with the "
                "driver, %.1f MiB with the contexts, %.1f MiB with cuBLASLt, %.1f MiB with peer "
                "access",
                cb->ndev, cb->ndev == 1 ? "" : "s", ovld_heap_bytes() / 1048576.0,
                heap_drv / 1048576.0, heap_ctx / 1048576.0, heap_lt / 1048576.0,
                heap_peer / 1048576.0);
    *ret = &cb->base;
    return OVL_OK;
fail:
    cuda_backend_free(cb);
    return OVL_ERR_BACKEND;
}

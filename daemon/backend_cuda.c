/*
 * backend_cuda.c: the CUDA backend. One process drives every GPU of the
 * node: per rank a set of non-blocking streams (communication streams at the
 * highest priority), events, a doorbell (a host page the two share, whose
 * slots both processes' streams wait on; proto/doorbell.h), a cuBLASLt
 * workspace per stream; per job one NCCL communicator per
 * local rank, created nonblocking in one group off the loop thread. Client
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
 *   ALLGATHER   NCCL: ncclAllGather for whole contiguous shards, grouped
 *               ncclSend/ncclRecv for contiguous chunks; copy-engine pulls
 *               for strided layouts. All local ranks in one NCCL group.
 *   PULL        cudaMemcpy(2D)Async from the peer's mapping (copy engine)
 *   GEMM        cuBLASLt (cuda_gemm.c)
 *   SLEEP       kernels.cu
 *   DONE        error word (if failed), then done_slot[seq % slots] = seq
 *               and done = seq in the shared page, by stream memory
 *               operations; a host function then reports the completion
 *               to the loop, and a watchdog timer catches what host
 *               functions cannot (they never run after a context error).
 *
 * Device memory is taken when ranks are created (workspaces, events) or when scratch grows between
 * ops, never between the launches of one collective: cudaMalloc and cudaFree may synchronize every
 * GPU.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend.h"
#include "completion.h"
#include "cuda_gemm.h"
#include "cudrv.h"
#include "doorbell.h"
#include "kernels.h"
#include "log.h"
#include "plan.h"
#include "clock.h"

#define WATCHDOG_MS          100
#define STUCK_CHECK_NS       (1000ull * 1000 * 1000) /* look closer at ops older than 1 s */
#define NCCL_LAUNCH_LIMIT_NS (5000ull * 1000 * 1000) /* a grouped launch on the loop thread */
#define STUCK_WARN_NS        (5000ull * 1000 * 1000) /* and say so for ops older than 5 s */

typedef struct cuda_backend cuda_backend_t;

typedef struct cuda_dev {
    int ordinal;
    ovld_device_info_t info;
    int prio_hi, prio_lo;
    ovld_lt_t *lt;
} cuda_dev_t;

/* One opened IPC handle on one device. */
typedef struct ipc_entry {
    int device;
    uint8_t handle[sizeof(cudaIpcMemHandle_t)];
    void *ptr;
    size_t size; /* of the allocation behind the handle */
    uint32_t refs;
    struct ipc_entry *next;
} ipc_entry_t;

struct ovld_bmem {
    ipc_entry_t *entry;
};

/* A completion on its way: the host function pushes it; the watchdog may
 * deliver it instead if the stream died. */
typedef struct cuda_done {
    ovld_cq_node_t node; /* first */
    struct ovld_rank *rank;
    cudaEvent_t ev;
    uint64_t issued_ns;
    _Atomic int state; /* 0 waiting, 1 pushed by the host function, 2 by the watchdog */
    _Atomic int refs;  /* the delivery, and the host function while it is queued */
    bool warned;       /* logged as slow (loop thread) */
    struct cuda_done *prev, *next;
} cuda_done_t;

struct ovld_rank {
    cuda_backend_t *cb;
    cuda_dev_t *dev;
    cudaStream_t streams[OVL_PLAN_MAX_STREAMS];
    void *workspace[OVL_PLAN_MAX_STREAMS];
    cudaEvent_t *events;
    uint32_t nevents;
    cudaEvent_t ag_ev[2]; /* the copy-engine all-gather's own: ready, read */
    /* The doorbell: a memfd page mapped by both processes and registered
     * with CUDA in both, so that stream memory operations reach it. The
     * streams' waits are on its slots (the client's stream writes ready
     * slots that stream 0 waits on, and waits on done slots that stream 0
     * writes), so ovld can end either side's wait with a CPU store, which
     * no stalled GPU queue can hold up. done and the error word are what
     * the client's host-side waits (throttle, synchronize, check) read. */
    struct ovl_doorbell *db;     /* as the host sees it */
    struct ovl_doorbell *db_dev; /* as the GPU sees it */
    int db_fd;
    cudaStream_t cstream; /* completions: host functions wait here, off stream 0 */
    cudaEvent_t *free_ev; /* done events to reuse (loop thread) */
    uint32_t nfree_ev, cap_free_ev;
    bool error_written;
    bool setup_pending; /* its communicator is being made on a worker (loop thread) */
    ncclComm_t nccl;
    void *scratch;
    size_t scratch_bytes;
    cuda_done_t *inflight; /* loop thread only */
    /* Released (its client gone): the value every slot must hold, kept in
     * ovld's memory, since the page is the client's to write too. */
    uint64_t release_value; /* 0: not released */
    bool release_undone;    /* a slot was found written after the release (logged once) */
    struct ovld_rank *next;
};

struct cuda_backend {
    ovld_backend_t base;
    uv_loop_t *loop;
    ovl_cudrv_t drv;
    uint32_t ndev;
    cuda_dev_t *devs;
    ovld_cq_t cq;
    uv_timer_t watchdog;
    struct ovld_rank *ranks;
    pthread_mutex_t ipc_mu;
    ipc_entry_t *ipc;
    uint64_t ipc_hits, ipc_misses; /* under ipc_mu */
    _Atomic uint32_t works;        /* uv_work items in flight */
    bool cq_closed;                /* destroyed: freed when the last work is done */
};

/* ------------------------------------------------- errors, in one place */

/* The last enqueue failure of this thread, in words: exec.c asks for it
 * (last_error) on the thread that issued the failed call. */
static _Thread_local char cuda_last_err[256];

/* Logs a failed CUDA call and keeps its words for the op's error message
 * (exec.c asks through last_error), then returns OVL_ERR_BACKEND. */
#define CUDA_TRY(cb, call, what)                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (void)(cb);                                                                            \
            snprintf(cuda_last_err, sizeof(cuda_last_err), "%s: %s: %s", (what), #call,            \
                     cudaGetErrorString(e_));                                                      \
            log_error("%s", cuda_last_err);                                                        \
            return OVL_ERR_BACKEND;                                                                \
        }                                                                                          \
    } while (0)

static ovl_status_t set_device(cuda_backend_t *cb, cuda_dev_t *dev)
{
    CUDA_TRY(cb, cudaSetDevice(dev->ordinal), "device");
    return OVL_OK;
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
        for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++) {
            *streams += r->streams[i] != NULL;
            *bytes += r->workspace[i] ? OVLD_LT_WORKSPACE : 0;
        }
    }
}

/* ---------------------------------------------------------------- memory */

static void cuda_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block);

static ovl_status_t cuda_mem_import(ovld_backend_t *b, const ovld_mem_import_t *imp,
                                    ovld_bmem_t **ret_mem, void **ret_ptr)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    if (imp->fd >= 0)
        close(imp->fd); /* CUDA buffers come as IPC handles, never as fds */
    if (imp->fd >= 0 || !imp->ipc || imp->ipc_len != sizeof(cudaIpcMemHandle_t) ||
        imp->device < 0 || (uint32_t)imp->device >= cb->ndev)
        return OVL_ERR_INVALID;
    ovld_bmem_t *m = calloc(1, sizeof(*m));
    if (!m)
        return OVL_ERR_NOMEM;
    ovl_status_t st = OVL_OK;
    pthread_mutex_lock(&cb->ipc_mu);
    ipc_entry_t *e = cb->ipc;
    while (e && !(e->device == imp->device && memcmp(e->handle, imp->ipc, imp->ipc_len) == 0))
        e = e->next;
    if (e) {
        e->refs++;
        cb->ipc_hits++;
    }
    pthread_mutex_unlock(&cb->ipc_mu);
    if (!e) {
        /* Opened without the lock: it takes up to 2 ms, and the loop thread
         * takes the lock to release and count. */
        ipc_entry_t *ne = calloc(1, sizeof(*ne));
        if (!ne) {
            free(m);
            return OVL_ERR_NOMEM;
        }
        cudaIpcMemHandle_t h;
        memcpy(&h, imp->ipc, sizeof(h));
        /* In the context of the GPU that reads it (API-NOTES 3.1). */
        cudaError_t ce = cudaSetDevice(cb->devs[imp->device].ordinal);
        if (ce == cudaSuccess)
            ce = cudaIpcOpenMemHandle(&ne->ptr, h, cudaIpcMemLazyEnablePeerAccess);
        CUdeviceptr base = 0;
        size_t size = 0;
        if (ce == cudaSuccess &&
            cb->drv.mem_get_address_range(&base, &size, (CUdeviceptr)ne->ptr) != CUDA_SUCCESS)
            size = 0;
        if (ce != cudaSuccess) {
            log_warn("cudaIpcOpenMemHandle on device %d: %s", imp->device, cudaGetErrorString(ce));
            free(ne);
            free(m);
            return OVL_ERR_BACKEND;
        }
        ne->device = imp->device;
        memcpy(ne->handle, imp->ipc, imp->ipc_len);
        ne->size = size;
        ne->refs = 1;
        pthread_mutex_lock(&cb->ipc_mu);
        /* Another connection may have opened the same handle meanwhile: the
         * driver counted both opens, so keep one entry and close the other. */
        e = cb->ipc;
        while (e && !(e->device == imp->device && memcmp(e->handle, imp->ipc, imp->ipc_len) == 0))
            e = e->next;
        if (e) {
            e->refs++;
            cb->ipc_hits++;
        } else {
            cb->ipc_misses++;
            ne->next = cb->ipc;
            cb->ipc = ne;
            e = ne;
            ne = NULL;
        }
        pthread_mutex_unlock(&cb->ipc_mu);
        if (ne) {
            cudaIpcCloseMemHandle(ne->ptr);
            free(ne);
        }
    }
    /* What the client says it registered must lie inside the allocation the
     * handle names: ovld's own copies and GEMMs are bounded by this. */
    uint64_t end;
    if (__builtin_add_overflow(imp->ipc_offset, imp->bytes, &end) || end > e->size) {
        log_warn("device %d: registration of %" PRIu64 " bytes at offset %" PRIu64
                 " exceeds its allocation of %zu bytes",
                 imp->device, imp->bytes, imp->ipc_offset, e->size);
        m->entry = e;
        cuda_mem_release(b, m, true);
        return OVL_ERR_RANGE;
    }
    m->entry = e;
    *ret_mem = m;
    *ret_ptr = (char *)e->ptr + imp->ipc_offset;
    (void)st;
    return OVL_OK;
}

typedef struct release_work {
    uv_work_t req;
    cuda_backend_t *cb;
    ipc_entry_t *entry;
} release_work_t;

static void release_run(uv_work_t *req)
{
    release_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    if (cudaSetDevice(cb->devs[w->entry->device].ordinal) == cudaSuccess) {
        cudaError_t ce = cudaIpcCloseMemHandle(w->entry->ptr);
        if (ce != cudaSuccess)
            log_warn("cudaIpcCloseMemHandle: %s", cudaGetErrorString(ce));
    }
    free(w->entry);
}

static void free_backend(cuda_backend_t *cb);

/* After a work item: the backend may have been destroyed meanwhile. */
static void work_done(cuda_backend_t *cb)
{
    if (atomic_fetch_sub(&cb->works, 1) == 1 && cb->cq_closed)
        free_backend(cb);
}

static void release_after(uv_work_t *req, int status)
{
    (void)status;
    release_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    free(w);
    work_done(cb);
}

static void cuda_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    if (!m)
        return;
    ipc_entry_t *dead = NULL;
    pthread_mutex_lock(&cb->ipc_mu);
    if (--m->entry->refs == 0) {
        for (ipc_entry_t **pp = &cb->ipc; *pp; pp = &(*pp)->next)
            if (*pp == m->entry) {
                *pp = m->entry->next;
                break;
            }
        dead = m->entry;
    }
    pthread_mutex_unlock(&cb->ipc_mu);
    free(m);
    if (!dead)
        return;
    if (may_block) {
        release_work_t now = {.cb = cb, .entry = dead};
        release_run(&(uv_work_t){.data = &now});
        return;
    }
    /* Closing costs 0.1 ms and may synchronize: not on the loop thread. */
    release_work_t *w = calloc(1, sizeof(*w));
    if (w) {
        w->req.data = w;
        w->cb = cb;
        w->entry = dead;
        atomic_fetch_add(&cb->works, 1);
        if (uv_queue_work(cb->loop, &w->req, release_run, release_after) == 0)
            return;
        atomic_fetch_sub(&cb->works, 1);
        free(w);
    }
    w = &(release_work_t){.cb = cb, .entry = dead};
    release_run(&(uv_work_t){.data = w});
}

/* ----------------------------------------------------------------- ranks */

/* Frees what a rank holds. Teardown goes on past a failed CUDA call (a
 * stream that failed still has memory to give back); the first failure is
 * logged with the call's name. Host memory is always freed; without the
 * device's context, what lives there (and the host page's registration,
 * with its mapping) is left rather than half-freed. */
static void rank_free_resources(struct ovld_rank *r)
{
    const char *what = NULL;
    cudaError_t first = cudaSuccess;
#define FREE_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess && !what) {                                                          \
            what = #call;                                                                          \
            first = e_;                                                                            \
        }                                                                                          \
    } while (0)
    FREE_TRY(cudaSetDevice(r->dev->ordinal));
    bool dev = what == NULL;
    if (dev) {
        for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++) {
            if (r->streams[i]) {
                FREE_TRY(cudaStreamSynchronize(r->streams[i]));
                FREE_TRY(cudaStreamDestroy(r->streams[i]));
            }
            if (r->workspace[i])
                FREE_TRY(cudaFree(r->workspace[i]));
        }
        for (uint32_t i = 0; i < r->nevents; i++)
            FREE_TRY(cudaEventDestroy(r->events[i]));
        for (int i = 0; i < 2; i++)
            if (r->ag_ev[i])
                FREE_TRY(cudaEventDestroy(r->ag_ev[i]));
        for (uint32_t i = 0; i < r->nfree_ev; i++)
            FREE_TRY(cudaEventDestroy(r->free_ev[i]));
        if (r->cstream) {
            FREE_TRY(cudaStreamSynchronize(r->cstream));
            FREE_TRY(cudaStreamDestroy(r->cstream));
        }
        if (r->db) {
            FREE_TRY(cudaHostUnregister(r->db));
            ovl_doorbell_destroy(r->db, -1); /* the fd: below */
        }
        if (r->scratch)
            FREE_TRY(cudaFree(r->scratch));
    }
#undef FREE_TRY
    free(r->free_ev);
    free(r->events);
    if (r->db_fd >= 0)
        close(r->db_fd);
    if (what)
        log_warn("device %d: releasing a rank: %s: %s%s", r->dev->ordinal, what,
                 cudaGetErrorString(first), dev ? "" : " (its device memory is left)");
}

static ovl_status_t cuda_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                                     ovld_doorbell_export_t *ret_db)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    if (device >= cb->ndev)
        return OVL_ERR_NOT_FOUND;
    struct ovld_rank *r = calloc(1, sizeof(*r));
    if (!r)
        return OVL_ERR_NOMEM;
    r->cb = cb;
    r->dev = &cb->devs[device];
    r->db_fd = -1;
    ovl_status_t st = OVL_ERR_BACKEND;
    cudaError_t ce = cudaSetDevice(r->dev->ordinal);
    const char *what = "cudaSetDevice";
    /* Streams 0 and 1 carry the doorbells and the pulls: highest priority;
     * the GEMM streams the lowest, so that communication is never queued
     * behind a GEMM's blocks. */
    for (uint32_t i = 0; ce == cudaSuccess && i < OVL_PLAN_MAX_STREAMS; i++) {
        what = "cudaStreamCreateWithPriority";
        ce = cudaStreamCreateWithPriority(&r->streams[i], cudaStreamNonBlocking,
                                          i <= 1 ? r->dev->prio_hi : r->dev->prio_lo);
    }
    for (int i = 0; ce == cudaSuccess && i < 2; i++) {
        what = "cudaEventCreateWithFlags";
        ce = cudaEventCreateWithFlags(&r->ag_ev[i], cudaEventDisableTiming);
    }
    /* A workspace for every stream a plan may run GEMMs on (collective
     * spreads them over all of its streams), taken now: none is allocated
     * between the launches of an op (API-NOTES 0). */
    for (uint32_t i = 0; ce == cudaSuccess && i < OVL_PLAN_MAX_STREAMS; i++) {
        what = "cudaMalloc (GEMM workspace)";
        ce = cudaMalloc(&r->workspace[i], OVLD_LT_WORKSPACE);
    }
    if (ce == cudaSuccess) {
        what = "cudaStreamCreateWithPriority (completions)";
        ce = cudaStreamCreateWithPriority(&r->cstream, cudaStreamNonBlocking, r->dev->prio_lo);
    }
    if (ce == cudaSuccess) {
        what = "the doorbell (memfd)";
        struct ovl_doorbell *p = NULL;
        if (ovl_doorbell_create(&p, &r->db_fd) != OVL_OK) {
            ce = cudaErrorMemoryAllocation;
        } else {
            what = "cudaHostRegister (doorbell)";
            ce = cudaHostRegister(p, OVL_DOORBELL_SIZE,
                                  cudaHostRegisterMapped | cudaHostRegisterPortable);
            if (ce == cudaSuccess) {
                r->db = p;
                what = "cudaHostGetDevicePointer (doorbell)";
                ce = cudaHostGetDevicePointer((void **)&r->db_dev, p, 0);
            } else {
                ovl_doorbell_destroy(p, -1); /* the fd goes with the rank */
            }
        }
    }
    if (ce != cudaSuccess) {
        log_error("device %u: %s: %s", device, what, cudaGetErrorString(ce));
        rank_free_resources(r);
        free(r);
        return st;
    }
    memset(ret_db, 0, sizeof(*ret_db));
    ret_db->fd = fcntl(r->db_fd, F_DUPFD_CLOEXEC, 0);
    if (ret_db->fd < 0) {
        log_error("device %u: dup of the doorbell: %s", device, strerror(errno));
        rank_free_resources(r);
        free(r);
        return OVL_ERR_SYSTEM;
    }
    ret_db->offset = 0;
    r->next = cb->ranks;
    cb->ranks = r;
    *ret_rank = r;
    return OVL_OK;
}

static void rank_unlink(struct ovld_rank *r)
{
    for (struct ovld_rank **pp = &r->cb->ranks; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            return;
        }
}

static void cuda_rank_destroy(ovld_backend_t *b, ovld_rank_t *r)
{
    (void)b;
    if (!r)
        return;
    rank_unlink(r);
    while (r->inflight) { /* cannot happen: jobs end when their ops are done */
        cuda_done_t *d = r->inflight;
        r->inflight = d->next;
        log_error("rank destroyed with op %" PRIu64 " in flight", d->node.seq);
    }
    rank_free_resources(r);
    free(r);
}

static void cuda_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi)
{
    (void)b;
    /* CPU stores, not stream work: a release written by a stream (as it
     * once was) can sit behind the very wait it is meant to end, in the
     * same hardware queue, and that is how ovld hung when a client died.
     * Every slot: late writes of the dying client's stream land only in
     * slots whose waits they satisfy (proto/doorbell.h). The done slots
     * too: the dying client's stream, blocked waiting for done, is let go.
     * Not UINT64_MAX: the GPU compares cyclically (proto/doorbell.h). */
    r->release_value = ovl_doorbell_release_slots(r->db, seq_hi);
}

static ovl_status_t cuda_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes,
                                      void **ret_ptr)
{
    (void)b;
    if (bytes > r->scratch_bytes) {
        if (set_device(r->cb, r->dev) != OVL_OK)
            return OVL_ERR_BACKEND;
        /* Between ops of this rank (the job grows scratch only once its ops
         * are done), and before any launch of the op that needs it. Freed
         * only when nothing of the rank is left on the GPU: with an op in
         * flight (a bug above) the growth is refused, rather than wait on
         * the loop thread for a stream that may wait on a client's ready
         * for ever (cudaStreamSynchronize did), or free what it uses. */
        if (r->scratch) {
            /* Records stay on the list until the loop is done delivering
             * them: this call may come from the very completion that let
             * the job grow scratch. Delivered means the GPU is past it. */
            for (cuda_done_t *dn = r->inflight; dn; dn = dn->next)
                if (atomic_load(&dn->state) == 0) {
                    log_error("device %d: scratch cannot grow while ops are in flight",
                              r->dev->ordinal);
                    return OVL_ERR_INTERNAL;
                }
            for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++) {
                if (!r->streams[i])
                    continue;
                cudaError_t q = cudaStreamQuery(r->streams[i]);
                if (q == cudaErrorNotReady) {
                    log_error("device %d: scratch cannot grow while stream %u is busy",
                              r->dev->ordinal, i);
                    return OVL_ERR_INTERNAL;
                }
                CUDA_TRY(r->cb, q, "scratch");
            }
            CUDA_TRY(r->cb, cudaFree(r->scratch), "scratch");
            r->scratch = NULL;
            r->scratch_bytes = 0;
        }
        void *p;
        cudaError_t ce = cudaMalloc(&p, bytes);
        if (ce != cudaSuccess) {
            log_error("scratch of %" PRIu64 " bytes: %s", bytes, cudaGetErrorString(ce));
            return ce == cudaErrorMemoryAllocation ? OVL_ERR_NOMEM : OVL_ERR_BACKEND;
        }
        r->scratch = p;
        r->scratch_bytes = bytes;
    }
    *ret_ptr = r->scratch;
    return OVL_OK;
}

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
    work_done(cb);
}

static ovl_status_t cuda_job_setup(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                                   ovld_setup_cb cb, void *arg)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
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
            log_warn("device %d: ncclCommFinalize: %s", rk->dev->ordinal, ncclGetErrorString(e));
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
            log_warn("device %d: the job's communicator failed (%s): aborted", rk->dev->ordinal,
                     ncclGetErrorString(r));
        if (e != ncclSuccess)
            log_warn("device %d: %s: %s", rk->dev->ordinal,
                     r == ncclSuccess ? "ncclCommDestroy" : "ncclCommAbort", ncclGetErrorString(e));
        rk->nccl = NULL;
    }
    for (uint32_t i = 0; i < w->n; i++) {
        rank_free_resources(w->ranks[i]);
        free(w->ranks[i]);
    }
}

static void cuda_job_teardown(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
    setup_work_t *w = calloc(1, sizeof(*w));
    struct ovld_rank **copy = calloc(n ? n : 1, sizeof(*copy));
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (ranks[i]) {
            rank_unlink(ranks[i]);
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

/* ------------------------------------------------------------- enqueue */

static ovl_status_t event_get(struct ovld_rank *r, uint32_t event, cudaEvent_t *ret)
{
    if (event >= r->nevents) {
        uint32_t n = r->nevents ? r->nevents : 16;
        while (n <= event)
            n *= 2;
        if (n > 65536)
            return OVL_ERR_LIMIT;
        cudaEvent_t *ne = realloc(r->events, n * sizeof(*ne));
        if (!ne)
            return OVL_ERR_NOMEM;
        r->events = ne;
        if (set_device(r->cb, r->dev) != OVL_OK)
            return OVL_ERR_BACKEND;
        for (uint32_t i = r->nevents; i < n; i++) {
            cudaError_t ce = cudaEventCreateWithFlags(&r->events[i], cudaEventDisableTiming);
            if (ce != cudaSuccess) {
                r->nevents = i;
                log_error("cudaEventCreateWithFlags: %s", cudaGetErrorString(ce));
                return OVL_ERR_BACKEND;
            }
        }
        r->nevents = n;
    }
    *ret = r->events[event];
    return OVL_OK;
}

static ovl_status_t drv_check(struct ovld_rank *r, CUresult cr, const char *what)
{
    if (cr == CUDA_SUCCESS)
        return OVL_OK;
    snprintf(cuda_last_err, sizeof(cuda_last_err), "%s: %s", what,
             ovl_cudrv_strerror(&r->cb->drv, cr));
    log_error("%s", cuda_last_err);
    return OVL_ERR_BACKEND;
}

/* Every enqueue makes the rank's device current first: the loop thread
 * drives all GPUs, and cuBLASLt, kernel launches and copies use the
 * current device's context (cudaSetDevice costs well under a microsecond
 * when nothing changes). */
#define USE_DEVICE(r)                                                                              \
    do {                                                                                           \
        if (set_device((r)->cb, (r)->dev) != OVL_OK)                                               \
            return OVL_ERR_BACKEND;                                                                \
    } while (0)

static ovl_status_t cuda_reserve_events(ovld_rank_t *r, uint32_t n)
{
    cudaEvent_t ev;
    return n ? event_get(r, n - 1, &ev) : OVL_OK;
}

static ovl_status_t cuda_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    USE_DEVICE(r);
    return drv_check(
        r,
        r->cb->drv.stream_wait_value64((CUstream)r->streams[stream],
                                       (CUdeviceptr)&r->db_dev->ready_slot[seq % OVL_READY_SLOTS],
                                       seq, CU_STREAM_WAIT_VALUE_GEQ),
        "cuStreamWaitValue64 (doorbell ready)");
}

static ovl_status_t cuda_record(ovld_rank_t *r, uint32_t stream, uint32_t event)
{
    USE_DEVICE(r);
    cudaEvent_t ev;
    ovl_status_t st = event_get(r, event, &ev);
    if (st != OVL_OK)
        return st;
    CUDA_TRY(r->cb, cudaEventRecord(ev, r->streams[stream]), "record");
    return OVL_OK;
}

static ovl_status_t cuda_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event)
{
    USE_DEVICE(r);
    cudaEvent_t ev;
    ovl_status_t st = event_get(owner, event, &ev);
    if (st != OVL_OK)
        return st;
    CUDA_TRY(r->cb, cudaStreamWaitEvent(r->streams[stream], ev, 0), "wait");
    return OVL_OK;
}

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

static ovl_status_t cuda_allgather(ovld_backend_t *b, const ovld_allgather_part_t *parts,
                                   uint32_t n, ovl_dtype_t dtype, uint64_t m, uint64_t k,
                                   uint64_t row0, uint64_t rows)
{
    (void)b;
    size_t elem = ovl_dtype_size(dtype);
    bool contiguous = true, comms = true;
    for (uint32_t i = 0; i < n; i++) {
        contiguous = contiguous && parts[i].src.ld == k && parts[i].g.ld == k;
        comms = comms && parts[i].rank->nccl != NULL;
    }
    if (!contiguous || !comms || n == 1) {
        /* Strided layouts: every rank pulls every shard by copy engine. All
         * sources are ready: the plans wait on every rank's READY before an
         * all-gather only implicitly (NCCL's own synchronization), so here
         * each rank's stream waits on the others' stream position first. */
        for (uint32_t i = 0; i < n; i++) {
            struct ovld_rank *r = parts[i].rank;
            USE_DEVICE(r);
            for (uint32_t p = 0; p < n; p++) {
                if (p != i) {
                    cudaEvent_t ev = parts[p].rank->ag_ev[0];
                    CUDA_TRY(r->cb, cudaEventRecord(ev, parts[p].rank->streams[parts[p].stream]),
                             "all-gather (record)");
                    CUDA_TRY(r->cb, cudaStreamWaitEvent(r->streams[parts[i].stream], ev, 0),
                             "all-gather (wait)");
                }
                ovl_status_t st = copy_rows(
                    r, r->streams[parts[i].stream], ovld_view_rows(parts[i].g, p * m + row0, elem),
                    ovld_view_rows(parts[p].src, row0, elem), rows, k, elem);
                if (st != OVL_OK)
                    return st;
            }
        }
        /* ...and no rank goes on before every rank has read its shard. */
        for (uint32_t i = 0; i < n; i++) {
            USE_DEVICE(parts[i].rank);
            cudaEvent_t ev = parts[i].rank->ag_ev[1];
            CUDA_TRY(parts[i].rank->cb,
                     cudaEventRecord(ev, parts[i].rank->streams[parts[i].stream]),
                     "all-gather (record)");
            for (uint32_t p = 0; p < n; p++)
                if (p != i)
                    CUDA_TRY(parts[i].rank->cb,
                             cudaStreamWaitEvent(parts[p].rank->streams[parts[p].stream], ev, 0),
                             "all-gather (wait)");
        }
        return OVL_OK;
    }
    size_t count = (size_t)(rows * k);
    ncclDataType_t t = nccl_type(dtype);
    ncclResult_t r = ncclGroupStart();
    for (uint32_t i = 0; r == ncclSuccess && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        cudaStream_t s = x->rank->streams[x->stream];
        const void *send = ovld_view_rows(x->src, row0, elem).ptr;
        if (row0 == 0 && rows == m) {
            /* whole shards land in G exactly as NCCL lays them out */
            r = ncclAllGather(send, x->g.ptr, count, t, x->rank->nccl, s);
            continue;
        }
        /* Chunks: rank p's rows go to G rows p*m + row0, which NCCL's
         * all-gather layout cannot express; grouped send/recv can. */
        for (uint32_t p = 0; r == ncclSuccess && p < n; p++) {
            void *dst = ovld_view_rows(x->g, p * m + row0, elem).ptr;
            if (p == i) {
                if (cudaSetDevice(x->rank->dev->ordinal) != cudaSuccess) {
                    r = ncclUnhandledCudaError;
                    break;
                }
                if (cudaMemcpyAsync(dst, send, count * elem, cudaMemcpyDeviceToDevice, s) !=
                    cudaSuccess)
                    r = ncclUnhandledCudaError;
                continue;
            }
            r = ncclSend(send, count, t, (int)p, x->rank->nccl, s);
            if (r == ncclSuccess)
                r = ncclRecv(dst, count, t, (int)p, x->rank->nccl, s);
        }
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess)
        r = e;
    if (r == ncclInProgress) {
        /* Nonblocking comms: nothing else goes on their streams before the
         * launch is complete (API-NOTES 1.3). This runs on the loop thread:
         * a launch that is not complete within NCCL_LAUNCH_LIMIT_NS (a GPU
         * that no longer moves) fails the op rather than hold every client
         * up for ever. */
        uint64_t deadline = ovl_mono_ns() + NCCL_LAUNCH_LIMIT_NS;
        struct ovld_rank *rk[OVL_PLAN_MAX_WORLD > 64 ? 64 : OVL_PLAN_MAX_WORLD];
        uint32_t done = 0;
        while (done < n) {
            uint32_t c = 0;
            for (; c < 64 && done + c < n; c++)
                rk[c] = parts[done + c].rank;
            r = nccl_wait(rk, c, deadline);
            if (r != ncclSuccess)
                break;
            done += c;
        }
    }
    if (r != ncclSuccess) {
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "NCCL all-gather rows %" PRIu64 "+%" PRIu64 ": %s", row0, rows,
                 r == ncclInProgress ? "launch not complete after 5 s (is the GPU stalled?)"
                                     : ncclGetErrorString(r));
        log_error("%s", cuda_last_err);
        return OVL_ERR_BACKEND;
    }
    return OVL_OK;
}

static ovl_status_t cuda_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                              uint64_t rows, uint64_t cols, size_t elem)
{
    USE_DEVICE(r);
    return copy_rows(r, r->streams[stream], dst, src, rows, cols, elem);
}

static ovl_status_t cuda_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args)
{
    USE_DEVICE(r);
    ovl_status_t st = ovld_lt_gemm(r->dev->lt, r->streams[stream], r->workspace[stream],
                                   OVLD_LT_WORKSPACE, args, cuda_last_err, sizeof(cuda_last_err));
    if (st != OVL_OK)
        log_error("device %d: %s", r->dev->ordinal, cuda_last_err);
    return st;
}

static ovl_status_t cuda_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns)
{
    USE_DEVICE(r);
    CUDA_TRY(r->cb, ovld_launch_sleep(r->streams[stream], ns), "sleep kernel");
    return OVL_OK;
}

/* ---------------------------------------------------------- completion */

static void CUDART_CB host_done(void *arg)
{
    cuda_done_t *d = arg;
    int expect = 0;
    /* No CUDA call here: a queue push and uv_async_send. */
    if (atomic_compare_exchange_strong(&d->state, &expect, 1)) {
        ovld_cq_t *q = &d->rank->cb->cq;
        atomic_fetch_sub(&d->refs, 1); /* the delivery's reference remains */
        ovld_cq_push(q, &d->node);
    } else if (atomic_fetch_sub(&d->refs, 1) == 1) {
        free(d); /* the watchdog delivered it, and the delivery is done */
    }
}

static void done_release(ovld_cq_node_t *node)
{
    cuda_done_t *d = (cuda_done_t *)node;
    struct ovld_rank *r = d->rank;
    if (d->prev)
        d->prev->next = d->next;
    else if (r->inflight == d)
        r->inflight = d->next;
    if (d->next)
        d->next->prev = d->prev;
    if (d->ev) {
        /* Back to the pool: its last record is complete (or the stream is
         * dead and the rank goes away anyway). */
        if (r->nfree_ev == r->cap_free_ev) {
            uint32_t cap = r->cap_free_ev ? 2 * r->cap_free_ev : 16;
            cudaEvent_t *ne = realloc(r->free_ev, cap * sizeof(*ne));
            if (ne) {
                r->free_ev = ne;
                r->cap_free_ev = cap;
            }
        }
        if (r->nfree_ev < r->cap_free_ev)
            r->free_ev[r->nfree_ev++] = d->ev;
        else
            cudaEventDestroy(d->ev);
        d->ev = NULL;
    }
    d->prev = d->next = NULL;
    /* A host function still queued (the watchdog delivered) frees it. */
    if (atomic_fetch_sub(&d->refs, 1) == 1)
        free(d);
}

static void cuda_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
                      const char *message, void *cookie)
{
    cuda_backend_t *cb = r->cb;
    cudaStream_t s = r->streams[stream];
    CUresult cr = CUDA_SUCCESS;
    if (set_device(r->cb, r->dev) != OVL_OK)
        cr = CUDA_ERROR_INVALID_CONTEXT;
    /* The first failure's status and op; later failures leave them be. */
    if (cr == CUDA_SUCCESS && status != OVL_OK && !r->error_written) {
        cr = cb->drv.stream_write_value64((CUstream)s, (CUdeviceptr)&r->db_dev->error_seq, seq,
                                          CU_STREAM_WRITE_VALUE_DEFAULT);
        if (cr == CUDA_SUCCESS)
            cr = cb->drv.stream_write_value32((CUstream)s, (CUdeviceptr)&r->db_dev->error,
                                              (cuuint32_t)(int32_t)status,
                                              CU_STREAM_WRITE_VALUE_DEFAULT);
    }
    if (status != OVL_OK)
        r->error_written = true;
    /* The default flag orders each write after all prior work's memory
     * writes: the client sees C before it sees done. First the slot that the
     * client's stream waits on (proto/doorbell.h), then done, which host-side
     * waits read: once libovl sees done, the slot is written too, and the
     * page may be unregistered (ovl_comm_destroy). */
    if (cr == CUDA_SUCCESS)
        cr = cb->drv.stream_write_value64((CUstream)s,
                                          (CUdeviceptr)&r->db_dev->done_slot[seq % OVL_READY_SLOTS],
                                          seq, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (cr == CUDA_SUCCESS)
        cr = cb->drv.stream_write_value64((CUstream)s, (CUdeviceptr)&r->db_dev->done, seq,
                                          CU_STREAM_WRITE_VALUE_DEFAULT);
    cuda_done_t *d = calloc(1, sizeof(*d));
    if (!d) {
        log_error("out of memory tracking op %" PRIu64, seq);
        cb->cq.cb(cb->cq.arg, cookie, seq, OVL_ERR_NOMEM, "ovld: out of memory");
        return;
    }
    d->rank = r;
    atomic_init(&d->refs, 1);
    d->node.cookie = cookie;
    d->node.seq = seq;
    d->node.status = status;
    d->node.release = done_release;
    d->issued_ns = ovl_mono_ns();
    snprintf(d->node.message, sizeof(d->node.message), "%s", message ? message : "");
    if (cr != CUDA_SUCCESS) {
        d->node.status = OVL_ERR_BACKEND;
        snprintf(d->node.message, sizeof(d->node.message),
                 "cannot ring the doorbell (cuStreamWriteValue64): %s",
                 ovl_cudrv_strerror(&cb->drv, cr));
        /* The GPU cannot ring: the CPU does, so that the client's waits
         * end and report the error. */
        if (r->db) {
            if (__atomic_load_n(&r->db->error, __ATOMIC_RELAXED) == 0) {
                __atomic_store_n(&r->db->error_seq, seq, __ATOMIC_RELAXED);
                __atomic_store_n(&r->db->error, (int32_t)OVL_ERR_BACKEND, __ATOMIC_RELEASE);
            }
            /* the slot first, then done, as the stream writes them */
            uint64_t *slot = &r->db->done_slot[seq % OVL_READY_SLOTS];
            if (__atomic_load_n(slot, __ATOMIC_RELAXED) < seq)
                __atomic_store_n(slot, seq, __ATOMIC_RELEASE);
            if (__atomic_load_n(&r->db->done, __ATOMIC_RELAXED) < seq)
                __atomic_store_n(&r->db->done, seq, __ATOMIC_RELEASE);
        }
        atomic_store(&d->state, 2);
        ovld_cq_push(&cb->cq, &d->node);
        return;
    }
    d->next = r->inflight;
    if (r->inflight)
        r->inflight->prev = d;
    r->inflight = d;
    if (r->nfree_ev > 0)
        d->ev = r->free_ev[--r->nfree_ev];
    else if (cudaEventCreateWithFlags(&d->ev, cudaEventDisableTiming) != cudaSuccess)
        d->ev = NULL;
    /* The host function goes on the completion stream, behind the event:
     * on stream 0 it would hold up the next op's start until the callback
     * thread ran it. */
    cudaStream_t hs = s;
    if (d->ev && cudaEventRecord(d->ev, s) == cudaSuccess &&
        cudaStreamWaitEvent(r->cstream, d->ev, 0) == cudaSuccess)
        hs = r->cstream;
    atomic_store(&d->refs, 2); /* before the launch: it may run at once */
    cudaError_t ce = cudaLaunchHostFunc(hs, host_done, d);
    if (ce != cudaSuccess) {
        atomic_store(&d->refs, 1);
        int expect = 0;
        if (atomic_compare_exchange_strong(&d->state, &expect, 2)) {
            d->node.status = OVL_ERR_BACKEND;
            snprintf(d->node.message, sizeof(d->node.message), "cudaLaunchHostFunc: %s",
                     cudaGetErrorString(ce));
            ovld_cq_push(&cb->cq, &d->node);
        }
    }
}

static void cuda_mem_cache_stats(ovld_backend_t *b, uint64_t *hits, uint64_t *misses)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    pthread_mutex_lock(&cb->ipc_mu);
    *hits = cb->ipc_hits;
    *misses = cb->ipc_misses;
    pthread_mutex_unlock(&cb->ipc_mu);
}

static const char *cuda_last_error(ovld_backend_t *b)
{
    (void)b;
    return cuda_last_err;
}

/* A released rank's GPU waits read the shared page, which a client that
 * left but kept its mapping can still write: a ready slot set back below
 * the release would hold ovld's stream for ever (found by reading, with
 * tests/fuzz/fuzz_doorbell.c's model of the host backend). Every
 * watchdog tick, the slot of each op still in flight on such a rank gets
 * the release value again if it holds less than the op. A client that
 * overwrites it in a tight loop can still delay its own rank's ops; only
 * its own job waits on them. */
static void restore_release(struct ovld_rank *r)
{
    if (!r->release_value)
        return;
    for (cuda_done_t *d = r->inflight; d; d = d->next) {
        if (atomic_load(&d->state) != 0)
            continue;
        /* The dying client's stream may still write n there for its op n,
         * which satisfies the wait: only a value below it (compared as the
         * GPU does, cyclically) is undone. */
        uint64_t *slot = &r->db->ready_slot[d->node.seq % OVL_READY_SLOTS];
        if ((int64_t)(__atomic_load_n(slot, __ATOMIC_RELAXED) - d->node.seq) >= 0)
            continue;
        __atomic_store_n(slot, r->release_value, __ATOMIC_RELEASE);
        if (!r->release_undone) {
            r->release_undone = true;
            log_warn("device %d: a released rank's doorbell was written below op %" PRIu64
                     " after its client left (a process keeps the page mapped); ovld "
                     "releases it again",
                     r->dev->ordinal, d->node.seq);
        }
    }
}

/* Host functions never run after a context error: look at old ops' events
 * and at NCCL's asynchronous errors, and report the failure ourselves. */
static void on_watchdog(uv_timer_t *t)
{
    cuda_backend_t *cb = t->data;
    uint64_t now = ovl_mono_ns();
    for (struct ovld_rank *r = cb->ranks; r; r = r->next) {
        restore_release(r);
        ncclResult_t nr = ncclSuccess;
        /* A worker may be creating or aborting the communicator right now. */
        if (r->nccl && !r->setup_pending)
            ncclCommGetAsyncError(r->nccl, &nr);
        for (cuda_done_t *d = r->inflight; d; d = d->next) {
            if (atomic_load(&d->state) != 0 || now - d->issued_ns < STUCK_CHECK_NS)
                continue;
            const char *why = NULL;
            char buf[200];
            if (nr != ncclSuccess && nr != ncclInProgress) {
                snprintf(buf, sizeof(buf), "NCCL: %s", ncclGetErrorString(nr));
                why = buf;
            } else if (d->ev) {
                cudaError_t ce = cudaEventQuery(d->ev);
                if (ce != cudaSuccess && ce != cudaErrorNotReady) {
                    snprintf(buf, sizeof(buf), "CUDA: %s", cudaGetErrorString(ce));
                    why = buf;
                }
            }
            int expect = 0;
            if (!why && !d->warned && now - d->issued_ns >= STUCK_WARN_NS) {
                /* Not an error yet: a client may hold its stream on purpose.
                 * But a stream that never moves again is worth a line. */
                d->warned = true;
                log_warn("device %d: op %" PRIu64 " not done after %" PRIu64
                         " s (its event: %s; its ready slot holds %" PRIu64
                         "): it waits for its client's ready, or for a peer",
                         r->dev->ordinal, d->node.seq,
                         (uint64_t)((now - d->issued_ns) / 1000000000u),
                         d->ev ? cudaGetErrorString(cudaEventQuery(d->ev)) : "none",
                         __atomic_load_n(&r->db->ready_slot[d->node.seq % OVL_READY_SLOTS],
                                         __ATOMIC_RELAXED));
            }
            if (why && atomic_compare_exchange_strong(&d->state, &expect, 2)) {
                d->node.status = OVL_ERR_BACKEND;
                snprintf(d->node.message, sizeof(d->node.message), "%s", why);
                log_error("device %d: op %" PRIu64 " failed: %s", r->dev->ordinal, d->node.seq,
                          why);
                ovld_cq_push(&cb->cq, &d->node);
            }
        }
    }
}

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
    .job_setup = cuda_job_setup,
    .job_teardown = cuda_job_teardown,
    .rank_scratch = cuda_rank_scratch,
    .wait_ready = cuda_wait_ready,
    .record = cuda_record,
    .wait = cuda_wait,
    .allgather = cuda_allgather,
    .copy = cuda_copy,
    .gemm = cuda_gemm,
    .sleep = cuda_sleep,
    .done = cuda_done,
    .last_error = cuda_last_error,
    .issue_parallel = true,
    .reserve_events = cuda_reserve_events,
    .mem_cache_stats = cuda_mem_cache_stats,
};

static void free_backend(cuda_backend_t *cb)
{
    for (uint32_t i = 0; i < cb->ndev; i++)
        if (cb->devs[i].lt) {
            cudaSetDevice(cb->devs[i].ordinal);
            ovld_lt_destroy(cb->devs[i].lt);
        }
    free(cb->devs);
    pthread_mutex_destroy(&cb->ipc_mu);
    free(cb);
}

static void on_cq_closed(ovld_cq_t *q)
{
    cuda_backend_t *cb = (cuda_backend_t *)((char *)q - offsetof(cuda_backend_t, cq));
    cb->cq_closed = true;
    if (atomic_load(&cb->works) == 0)
        free_backend(cb); /* else the last work item does */
}

static void cuda_destroy(ovld_backend_t *b)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    uv_timer_stop(&cb->watchdog);
    uv_close((uv_handle_t *)&cb->watchdog, NULL);
    ovld_cq_close(&cb->cq, on_cq_closed);
}

ovl_status_t ovld_backend_cuda_create(uv_loop_t *loop, const ovld_config_t *cfg,
                                      ovld_done_cb done_cb, void *done_arg, ovld_backend_t **ret,
                                      char *err, size_t errlen)
{
    (void)cfg;
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "cudaGetDeviceCount: %s", cudaGetErrorString(ce));
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
    cb->loop = loop;
    pthread_mutex_init(&cb->ipc_mu, NULL);
    if (ovl_cudrv_load(&cb->drv, err, errlen) != 0)
        goto fail;
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
        int mps = 0;
        if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, i) != cudaSuccess)
            mps = 0;
        dev->info.mps = mps != 0;
        if (!mps)
            log_warn("device %d (%s): MPS is not running: the GPU will time-slice between "
                     "ovld's context and every client's, and each op will wait for a time "
                     "slice (about 2 ms); start nvidia-cuda-mps-control (docs/performance.md)",
                     i, prop.name);
        if (ovld_lt_create(&dev->lt, err, errlen) != OVL_OK)
            goto fail;
        cb->ndev++;
        /* Peer access both ways wherever the hardware allows: pulls and NCCL
         * go over NVLink. */
        for (int p = 0; p < n; p++) {
            int can = 0;
            if (p == i || cudaDeviceCanAccessPeer(&can, i, p) != cudaSuccess || !can)
                continue;
            ce = cudaDeviceEnablePeerAccess(p, 0);
            if (ce != cudaSuccess && ce != cudaErrorPeerAccessAlreadyEnabled)
                log_warn("peer access %d -> %d: %s", i, p, cudaGetErrorString(ce));
            (void)cudaGetLastError();
        }
    }
    if (ovld_cq_init(&cb->cq, loop, done_cb, done_arg) != 0) {
        snprintf(err, errlen, "completion queue");
        goto fail;
    }
    uv_timer_init(loop, &cb->watchdog);
    cb->watchdog.data = cb;
    uv_timer_start(&cb->watchdog, on_watchdog, WATCHDOG_MS, WATCHDOG_MS);
    log_info("CUDA backend: %u device%s", cb->ndev, cb->ndev == 1 ? "" : "s");
    *ret = &cb->base;
    return OVL_OK;
fail:
    free_backend(cb);
    return OVL_ERR_BACKEND;
}

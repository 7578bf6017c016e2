/*
 * cuda_rank.c: the ranks of the CUDA backend: per rank non-blocking streams
 * by index, each at the priority of the role the plan gives it (the
 * doorbell's, communication and copies highest, GEMMs lowest), events, a
 * cuBLASLt workspace per stream index, a doorbell (a host page registered with
 * CUDA, proto/doorbell.h), scratch for the gathered A, and the release of a
 * rank whose client is gone. The rank's own primitives too: the streams'
 * roles, WAIT_READY, RECORD/WAIT, GEMM and SLEEP.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_internal.h"
#include "doorbell.h"
#include "kernels.h"

/* ----------------------------------------------------------------- ranks */

/* Frees what a rank holds. Teardown goes on past a failed CUDA call (a
 * stream that failed still has memory to give back); the first failure is
 * reported (no request waits for it) with the call's name. Host memory is
 * always freed; without the device's context, what lives there (and the
 * host page's registration, with its mapping) is left rather than
 * half-freed. */
void cuda_rank_free_resources(struct ovld_rank *r)
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
        for (uint32_t i = 0; i < r->nslots; i++)
            for (int c = 0; c < CUDA_PRIO_COUNT; c++)
                if (r->slots[i].s[c]) {
                    FREE_TRY(cudaStreamSynchronize(r->slots[i].s[c]));
                    FREE_TRY(cudaStreamDestroy(r->slots[i].s[c]));
                }
        for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++)
            if (r->cap_pool[i]) /* (only captured on: nothing runs there) */
                FREE_TRY(cudaStreamDestroy(r->cap_pool[i]));
        for (uint32_t i = 0; i < CUDA_WORKSPACES; i++)
            if (r->workspace[i])
                FREE_TRY(cudaFree(r->workspace[i]));
        for (uint32_t i = 0; i < r->nevents; i++)
            FREE_TRY(cudaEventDestroy(r->events[i]));
        for (uint32_t i = 0; i < CUDA_TIMERS; i++) {
            if (r->t_start[i])
                FREE_TRY(cudaEventDestroy(r->t_start[i]));
            if (r->t_end[i])
                FREE_TRY(cudaEventDestroy(r->t_end[i]));
        }
        if (r->chain_ev)
            FREE_TRY(cudaEventDestroy(r->chain_ev));
        if (r->join_ev)
            FREE_TRY(cudaEventDestroy(r->join_ev));
        if (r->fork_ev)
            FREE_TRY(cudaEventDestroy(r->fork_ev));
        if (r->run_ev)
            FREE_TRY(cudaEventDestroy(r->run_ev));
        for (cuda_done_ev_t *e = r->free_ev; e; e = e->next)
            FREE_TRY(cudaEventDestroy(e->ev));
        if (r->done_own)
            FREE_TRY(cudaFreeHost(r->done_own));
        if (r->ring)
            FREE_TRY(cudaFreeHost(r->ring));
        if (r->db) {
            FREE_TRY(cudaHostUnregister(r->db));
            ovl_doorbell_destroy(r->db, -1); /* the fd: below */
        }
        if (r->scratch)
            FREE_TRY(cudaFree(r->scratch));
    }
#undef FREE_TRY
    free(r->slots);
    while (r->free_ev) {
        cuda_done_ev_t *e = r->free_ev;
        r->free_ev = e->next;
        free(e);
    }
    while (r->free_done) {
        cuda_done_t *d = r->free_done;
        r->free_done = d->next;
        free(d);
    }
    free(r->events);
    free(r->comm_rank_of);
    if (r->db_fd >= 0)
        close(r->db_fd);
    if (what)
        ovld_report(&r->cb->base.report, OVLD_REPORT_WARN, "device %d: releasing a rank: %s: %s%s",
                    r->dev->ordinal, what, cudaGetErrorString(first),
                    dev ? "" : " (its device memory is left)");
}

ovl_status_t cuda_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                              ovld_doorbell_export_t *ret_db, char *err, size_t errlen)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    if (device >= cb->ndev) {
        snprintf(err, errlen, "no such device (the CUDA backend has %u)", cb->ndev);
        return OVL_ERR_NOT_FOUND;
    }
    struct ovld_rank *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    atomic_init(&r->error_written, false);
    static const pthread_mutex_t unlocked = PTHREAD_MUTEX_INITIALIZER;
    r->mu = unlocked;
    r->nccl_mu = unlocked;
    r->cb = cb;
    r->dev = &cb->devs[device];
    r->db_fd = -1;
    ovl_status_t st = OVL_ERR_BACKEND;
    cudaError_t ce = cudaSetDevice(r->dev->ordinal);
    const char *what = "cudaSetDevice";
    /* Stream 0 from the start, with the client's role: a failed op's done
     * goes there before any plan gave the streams roles. The others are
     * made as plans first use them (cuda_set_streams). */
    if (ce == cudaSuccess) {
        what = "the streams (out of memory)";
        r->slots = calloc(1, sizeof(*r->slots));
        ce = r->slots ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    if (ce == cudaSuccess) {
        r->nslots = 1;
        r->nstreams = 1;
        r->slots[0].cur = CUDA_PRIO_HI;
        what = "cudaStreamCreateWithPriority";
        ce = cudaStreamCreateWithPriority(&r->slots[0].s[CUDA_PRIO_HI], cudaStreamNonBlocking,
                                          r->dev->prio_hi);
    }
    if (ce == cudaSuccess) {
        what = "cudaEventCreateWithFlags";
        ce = cudaEventCreateWithFlags(&r->chain_ev, cudaEventDisableTiming);
    }
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&r->join_ev, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&r->fork_ev, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&r->run_ev, cudaEventDisableTiming);
    /* A workspace for every stream a plan may run GEMMs on (collective
     * spreads them over all of its streams), taken now: none is allocated
     * between the launches of an op (API-NOTES 0). */
    for (uint32_t i = 0; ce == cudaSuccess && i < CUDA_WORKSPACES; i++) {
        what = "cudaMalloc (GEMM workspace)";
        ce = cudaMalloc(&r->workspace[i], OVLD_LT_WORKSPACE);
    }
    if (ce == cudaSuccess) {
        what = "cudaHostAlloc (completion counter)";
        ce = cudaHostAlloc((void **)&r->done_own, CUDA_DONE_GROUPS * sizeof(*r->done_own),
                           cudaHostAllocMapped | cudaHostAllocPortable);
    }
    if (ce == cudaSuccess) {
        memset(r->done_own, 0, CUDA_DONE_GROUPS * sizeof(*r->done_own));
        ce = cudaHostGetDevicePointer((void **)&r->done_own_dev, r->done_own, 0);
    }
    if (ce == cudaSuccess) {
        what = "cudaHostAlloc (replay's seqs)";
        ce = cudaHostAlloc((void **)&r->ring, sizeof(*r->ring),
                           cudaHostAllocMapped | cudaHostAllocPortable);
    }
    if (ce == cudaSuccess) {
        memset(r->ring, 0, sizeof(*r->ring));
        ce = cudaHostGetDevicePointer((void **)&r->ring_dev, r->ring, 0);
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
        snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(ce));
        cuda_rank_free_resources(r);
        free(r);
        return st;
    }
    memset(ret_db, 0, sizeof(*ret_db));
    ret_db->fd = fcntl(r->db_fd, F_DUPFD_CLOEXEC, 0);
    if (ret_db->fd < 0) {
        snprintf(err, errlen, "dup of the doorbell: %s", strerror(errno));
        cuda_rank_free_resources(r);
        free(r);
        return OVL_ERR_SYSTEM;
    }
    ret_db->offset = 0;
    pthread_mutex_lock(&cb->ranks_mu);
    r->next = cb->ranks;
    cb->ranks = r;
    pthread_mutex_unlock(&cb->ranks_mu);
    *ret_rank = r;
    return OVL_OK;
}

void cuda_rank_unlink(struct ovld_rank *r)
{
    pthread_mutex_lock(&r->cb->ranks_mu);
    for (struct ovld_rank **pp = &r->cb->ranks; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&r->cb->ranks_mu);
}

void cuda_rank_destroy(ovld_backend_t *b, ovld_rank_t *r)
{
    (void)b;
    if (!r)
        return;
    cuda_rank_unlink(r);
    while (r->inflight) { /* cannot happen: jobs end when their ops are done */
        cuda_done_t *d = r->inflight;
        r->inflight = d->next;
        ovld_report(&r->cb->base.report, OVLD_REPORT_ERROR,
                    "rank destroyed with op %" PRIu64 " in flight", d->node.seq);
    }
    cuda_rank_free_resources(r);
    free(r);
}

void cuda_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi)
{
    (void)b;
    /* CPU stores, not stream work: a release written by a stream (as it
     * once was) can sit behind the very wait it is meant to end, in the
     * same hardware queue, and that is how ovld hung when a client died.
     * Every slot: late writes of the dying client's stream land only in
     * slots whose waits they satisfy (proto/doorbell.h). The done slots
     * too: the dying client's stream, blocked waiting for done, is let go.
     * Not UINT64_MAX: the GPU compares cyclically (proto/doorbell.h). */
    /* read by the issuer's gates (cuda_ready_seen) on other threads */
    __atomic_store_n(&r->release_value, ovl_doorbell_release_slots(r->db, seq_hi),
                     __ATOMIC_RELEASE);
}

void cuda_rank_fail_op(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq, ovl_status_t status)
{
    (void)b;
    if (r->db && cuda_claim_error(r))
        ovl_doorbell_set_error(r->db, seq, (int32_t)status);
}

ovl_status_t cuda_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes, void **ret_ptr,
                               char *err, size_t errlen)
{
    (void)b;
    if (bytes > r->scratch_bytes) {
        if (cuda_set_device(r->cb, r->dev) != OVL_OK) {
            snprintf(err, errlen, "%s", cuda_last_err);
            return OVL_ERR_BACKEND;
        }
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
            bool busy = false;
            pthread_mutex_lock(&r->mu);
            for (cuda_done_t *dn = r->inflight; dn && !busy; dn = dn->next)
                busy = atomic_load(&dn->state) == 0;
            pthread_mutex_unlock(&r->mu);
            if (busy) {
                snprintf(err, errlen, "device %d: scratch cannot grow while ops are in flight",
                         r->dev->ordinal);
                return OVL_ERR_INTERNAL;
            }
            for (uint32_t i = 0; i < r->nslots; i++)
                for (int c = 0; c < CUDA_PRIO_COUNT; c++) {
                    if (!r->slots[i].s[c])
                        continue;
                    cudaError_t q = cudaStreamQuery(r->slots[i].s[c]);
                    if (q == cudaErrorNotReady) {
                        snprintf(err, errlen,
                                 "device %d: scratch cannot grow while stream %u is busy",
                                 r->dev->ordinal, i);
                        return OVL_ERR_INTERNAL;
                    }
                    if (q != cudaSuccess) {
                        snprintf(err, errlen, "device %d: cudaStreamQuery (stream %u): %s",
                                 r->dev->ordinal, i, cudaGetErrorString(q));
                        return OVL_ERR_BACKEND;
                    }
                }
            cudaError_t ce = cudaFree(r->scratch);
            if (ce != cudaSuccess) {
                snprintf(err, errlen, "device %d: cudaFree (the smaller scratch): %s",
                         r->dev->ordinal, cudaGetErrorString(ce));
                return OVL_ERR_BACKEND;
            }
            r->scratch = NULL;
            r->scratch_bytes = 0;
        }
        void *p;
        cudaError_t ce = cudaMalloc(&p, bytes);
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "device %d: cudaMalloc: %s", r->dev->ordinal,
                     cudaGetErrorString(ce));
            return ce == cudaErrorMemoryAllocation ? OVL_ERR_NOMEM : OVL_ERR_BACKEND;
        }
        r->scratch = p;
        r->scratch_bytes = bytes;
    }
    *ret_ptr = r->scratch;
    return OVL_OK;
}

/* ------------------------------------------------------------- enqueue */

static ovl_status_t event_get(struct ovld_rank *r, uint32_t event, cudaEvent_t *ret)
{
    if (event >= r->nevents) {
        uint32_t n = r->nevents ? r->nevents : 16;
        while (n <= event)
            n *= 2;
        if (n > 65536) {
            snprintf(cuda_last_err, sizeof(cuda_last_err),
                     "event %u: past the 65536 events of a rank", event);
            return OVL_ERR_LIMIT;
        }
        cudaEvent_t *ne = realloc(r->events, n * sizeof(*ne));
        if (!ne) {
            snprintf(cuda_last_err, sizeof(cuda_last_err), "events: out of memory");
            return OVL_ERR_NOMEM;
        }
        r->events = ne;
        if (cuda_set_device(r->cb, r->dev) != OVL_OK)
            return OVL_ERR_BACKEND;
        for (uint32_t i = r->nevents; i < n; i++) {
            cudaError_t ce = cudaEventCreateWithFlags(&r->events[i], cudaEventDisableTiming);
            if (ce != cudaSuccess) {
                r->nevents = i;
                snprintf(cuda_last_err, sizeof(cuda_last_err), "cudaEventCreateWithFlags: %s",
                         cudaGetErrorString(ce));
                return OVL_ERR_BACKEND;
            }
        }
        r->nevents = n;
    }
    *ret = r->events[event];
    return OVL_OK;
}

/* Puts the device before the words of cuda_last_err (cuBLASLt's do not
 * name it). */
static void last_err_on_device(const struct ovld_rank *r)
{
    char words[sizeof(cuda_last_err)];
    memcpy(words, cuda_last_err, sizeof(words));
    snprintf(cuda_last_err, sizeof(cuda_last_err), "device %d: %s", r->dev->ordinal, words);
}

static ovl_status_t drv_check(struct ovld_rank *r, CUresult cr, const char *what)
{
    if (cr == CUDA_SUCCESS)
        return OVL_OK;
    snprintf(cuda_last_err, sizeof(cuda_last_err), "%s: %s", what,
             ovl_cudrv_strerror(&r->cb->drv, cr));
    return OVL_ERR_BACKEND;
}

ovl_status_t cuda_reserve_events(ovld_rank_t *r, uint32_t n)
{
    cudaEvent_t ev;
    return n ? event_get(r, n - 1, &ev) : OVL_OK;
}

cudaStream_t cuda_s0(struct ovld_rank *r)
{
    cudaStream_t s = cuda_s0_stream(r);
    struct ovld_rank *o = r->lag;
    if (o) {
        /* After the origin's last replayed op (its run_ev, recorded at
         * the end of each; an event of another device is fine to wait on). */
        cudaError_t ce = cudaStreamWaitEvent(s, o->run_ev, 0);
        if (ce != cudaSuccess) {
            snprintf(cuda_last_err, sizeof(cuda_last_err),
                     "stream 0: catching up with the replayed ops: cudaStreamWaitEvent: %s",
                     cudaGetErrorString(ce));
            return NULL;
        }
        r->lag = NULL;
    }
    r->s0_ahead = true;
    return s;
}

/* The stream the current op calls `stream`, captured or not: a wait is how
 * a stream joins a capture, so a wait takes its stream from here. Eager
 * work on stream 0 goes after a replayed op's (cuda_s0). */
static cudaStream_t slot_stream(struct ovld_rank *r, uint32_t stream)
{
    if (stream >= r->nslots || r->slots[stream].cur < 0) {
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "stream %u: no role given (set_streams made %u)", stream, r->nslots);
        return NULL;
    }
    if (cuda_capturing)
        return cuda_captured_stream(r, stream);
    return stream == 0 ? cuda_s0(r) : r->slots[stream].s[r->slots[stream].cur];
}

cudaStream_t cuda_stream(struct ovld_rank *r, uint32_t stream)
{
    cudaStream_t s = slot_stream(r, stream);
    if (s && cuda_capturing && !cuda_in_capture(s)) {
        /* what is enqueued on it would run now, not when the graph does */
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "stream %u: not part of the capture (its first call is no wait on a captured "
                 "event)",
                 stream);
        return NULL;
    }
    return s;
}

/* Gets a stream of the rank that the current op names, or fails the
 * primitive (the words are in cuda_last_err). */
#define GET_STREAM(r, stream, s)                                                                   \
    do {                                                                                           \
        if (!((s) = cuda_stream((r), (stream))))                                                   \
            return OVL_ERR_INVALID;                                                                \
    } while (0)

ovl_status_t cuda_set_streams(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n)
{
    USE_DEVICE(r);
    if (n > r->nslots) {
        cuda_stream_slot_t *ns = realloc(r->slots, n * sizeof(*ns));
        if (!ns) {
            snprintf(cuda_last_err, sizeof(cuda_last_err), "streams: out of memory");
            return OVL_ERR_NOMEM;
        }
        for (uint32_t i = r->nslots; i < n; i++)
            ns[i] = (cuda_stream_slot_t){.cur = -1};
        r->slots = ns;
        r->nslots = n;
    }
    for (uint32_t i = 0; i < n; i++) {
        if ((unsigned)roles[i] >= OVL_ROLE_COUNT) {
            snprintf(cuda_last_err, sizeof(cuda_last_err), "stream %u: unknown role %d", i,
                     (int)roles[i]);
            return OVL_ERR_INVALID;
        }
        int c = roles[i] == OVL_ROLE_COMPUTE ? CUDA_PRIO_LO : CUDA_PRIO_HI;
        cuda_stream_slot_t *slot = &r->slots[i];
        if (slot->cur == c)
            continue;
        /* Not a synchronizing call: made here, before the op's launches. */
        if (!slot->s[c])
            CUDA_TRY(
                r->cb,
                cudaStreamCreateWithPriority(&slot->s[c], cudaStreamNonBlocking,
                                             c == CUDA_PRIO_HI ? r->dev->prio_hi : r->dev->prio_lo),
                "stream");
        /* The index's earlier work stays ahead of its later work whatever
         * the roles: the new stream waits for the old one's last work (the
         * plans order ops through stream 0 anyway; this keeps the backend
         * from relying on it, and lets the two share the index's GEMM
         * workspace). A wait captures the event's state when it is issued,
         * so the one event serves every change. */
        if (slot->cur >= 0) {
            CUDA_TRY(r->cb, cudaEventRecord(r->chain_ev, slot->s[slot->cur]), "stream role");
            CUDA_TRY(r->cb, cudaStreamWaitEvent(slot->s[c], r->chain_ev, 0), "stream role");
        }
        slot->cur = c;
    }
    r->nstreams = n;
    return OVL_OK;
}

ovl_status_t cuda_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    /* Ready already (a gated op always is, cuda_ready_seen): nothing to
     * wait for. The client's stream wrote the slot after its own work,
     * behind a system-wide barrier, so what ovld enqueues from now on sees
     * that work; a client that stores the slot early by CPU fools the GPU's
     * wait just as well. */
    if (cuda_ready_seen(r, seq))
        return OVL_OK;
    USE_DEVICE(r);
    cudaStream_t s;
    GET_STREAM(r, stream, s);
    return drv_check(r,
                     r->cb->drv.stream_wait_value64(
                         (CUstream)s, (CUdeviceptr)&r->db_dev->ready_slot[seq % OVL_READY_SLOTS],
                         seq, CU_STREAM_WAIT_VALUE_GEQ),
                     "cuStreamWaitValue64 (doorbell ready)");
}

ovl_status_t cuda_time_start(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    USE_DEVICE(r);
    cudaStream_t s;
    GET_STREAM(r, stream, s);
    uint32_t slot = (uint32_t)(seq % CUDA_TIMERS);
    /* events with timing (the done path's have none), made once a slot */
    if (!r->t_start[slot])
        CUDA_TRY(r->cb, cudaEventCreate(&r->t_start[slot]), "timer");
    if (!r->t_end[slot])
        CUDA_TRY(r->cb, cudaEventCreate(&r->t_end[slot]), "timer");
    r->t_seq[slot] = 0;
    CUDA_TRY(r->cb, cudaEventRecord(r->t_start[slot], s), "timer");
    r->t_seq[slot] = seq;
    return OVL_OK;
}

bool cuda_ready_seen(ovld_rank_t *r, uint64_t seq)
{
    /* The client's stream writes the slot; a release stores past it
     * (proto/doorbell.h). Compared as the GPU's GEQ wait compares. A
     * released rank is ready whatever its page says: a process that keeps
     * the page mapped may write a slot below the release again (the
     * watchdog restores those of ops on the GPU; restore_release). */
    uint64_t rel = __atomic_load_n(&r->release_value, __ATOMIC_ACQUIRE);
    if (rel && (int64_t)(rel - seq) >= 0)
        return true;
    uint64_t v = __atomic_load_n(&r->db->ready_slot[seq % OVL_READY_SLOTS], __ATOMIC_ACQUIRE);
    return (int64_t)(v - seq) >= 0;
}

ovl_status_t cuda_record(ovld_rank_t *r, uint32_t stream, uint32_t event)
{
    USE_DEVICE(r);
    cudaStream_t s;
    GET_STREAM(r, stream, s);
    cudaEvent_t ev;
    ovl_status_t st = event_get(r, event, &ev);
    if (st != OVL_OK)
        return st;
    CUDA_TRY(r->cb, cudaEventRecord(ev, s), "record");
    return OVL_OK;
}

ovl_status_t cuda_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event)
{
    USE_DEVICE(r);
    cudaStream_t s = slot_stream(r, stream);
    if (!s)
        return OVL_ERR_INVALID;
    cudaEvent_t ev;
    ovl_status_t st = event_get(owner, event, &ev);
    if (st != OVL_OK)
        return st;
    CUDA_TRY(r->cb, cudaStreamWaitEvent(s, ev, 0), "wait");
    return OVL_OK;
}

ovl_status_t cuda_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args)
{
    USE_DEVICE(r);
    cudaStream_t s;
    GET_STREAM(r, stream, s);
    if (stream >= CUDA_WORKSPACES) {
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "stream %u: no GEMM workspace (a rank has %u)", stream, CUDA_WORKSPACES);
        return OVL_ERR_LIMIT;
    }
    ovl_status_t st = ovld_lt_gemm(r->dev->lt, s, r->workspace[stream], OVLD_LT_WORKSPACE, args,
                                   cuda_last_err, sizeof(cuda_last_err));
    if (st != OVL_OK)
        last_err_on_device(r);
    return st;
}

ovl_status_t cuda_reduce(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                         uint64_t rows, uint64_t cols, uint32_t nblocks, uint64_t stride,
                         ovl_dtype_t dtype, uint32_t div)
{
    USE_DEVICE(r);
    cudaStream_t s;
    GET_STREAM(r, stream, s);
    if (nblocks == 0 || div == 0 || (nblocks > 1 && stride < rows) || dst.ld < cols ||
        src.ld < cols) {
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "reduce: %u blocks %llu rows apart, %llu x %llu, ld %llu and %llu, divisor %u",
                 nblocks, (unsigned long long)stride, (unsigned long long)rows,
                 (unsigned long long)cols, (unsigned long long)dst.ld, (unsigned long long)src.ld,
                 div);
        return OVL_ERR_INVALID;
    }
    CUDA_TRY(r->cb,
             ovld_launch_reduce(s, dtype, dst.ptr, dst.ld, src.ptr, src.ld, rows, cols, nblocks,
                                stride, div),
             "reduce kernel");
    return OVL_OK;
}

ovl_status_t cuda_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns)
{
    USE_DEVICE(r);
    cudaStream_t s;
    GET_STREAM(r, stream, s);
    CUDA_TRY(r->cb, ovld_launch_sleep(s, ns), "sleep kernel");
    return OVL_OK;
}

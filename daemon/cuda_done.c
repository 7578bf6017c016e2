/*
 * cuda_done.c: completions in the CUDA backend. DONE writes the error word
 * (if failed), then done_slot[seq % slots] = seq and done = seq in the
 * shared page by stream memory operations; a host function then reports the
 * completion to the loop, and a watchdog timer catches what host functions
 * cannot (they never run after a context error) and restores a released
 * rank's ready slots.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cuda_internal.h"
#include "doorbell.h"
#include "clock.h"

#define STUCK_CHECK_NS (1000ull * 1000 * 1000) /* look closer at ops older than 1 s */
#define STUCK_WARN_NS  (5000ull * 1000 * 1000) /* and say so for ops older than 5 s */

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
    pthread_mutex_lock(&r->mu);
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
    pthread_mutex_unlock(&r->mu);
    /* A host function still queued (the watchdog delivered) frees it. */
    if (atomic_fetch_sub(&d->refs, 1) == 1)
        free(d);
}

void cuda_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
               const char *message, void *cookie)
{
    cuda_backend_t *cb = r->cb;
    cudaStream_t s = cuda_stream(r, stream);
    if (!s) {
        /* done must ring: on stream 0, which every rank has from its
         * creation, and as the failure it is (a caller's bug). */
        s = r->slots[0].s[r->slots[0].cur];
        if (status == OVL_OK) {
            status = OVL_ERR_INTERNAL;
            message = cuda_last_err;
        }
    }
    CUresult cr = CUDA_SUCCESS;
    bool nodev = cuda_set_device(r->cb, r->dev) != OVL_OK; /* its words: cuda_last_err */
    if (nodev)
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
        /* the completion, from the issuing thread to the loop, without a
         * node of its own */
        if (!ovld_cq_push_nomem(&cb->cq, cookie, seq))
            ovld_report(&cb->base.report, OVLD_REPORT_ERROR,
                        "device %d: out of memory tracking op %" PRIu64
                        ", and for its completion: its job never ends",
                        r->dev->ordinal, seq);
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
        if (nodev)
            snprintf(d->node.message, sizeof(d->node.message), "cannot ring the doorbell: %s",
                     cuda_last_err);
        else
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
    pthread_mutex_lock(&r->mu);
    d->next = r->inflight;
    if (r->inflight)
        r->inflight->prev = d;
    r->inflight = d;
    if (r->nfree_ev > 0)
        d->ev = r->free_ev[--r->nfree_ev];
    pthread_mutex_unlock(&r->mu);
    if (!d->ev && cudaEventCreateWithFlags(&d->ev, cudaEventDisableTiming) != cudaSuccess)
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

/* ------------------------------------------------------------ watchdog */

/* A released rank's GPU waits read the shared page, which a client that
 * left but kept its mapping can still write: a ready slot set back below
 * the release would hold ovld's stream for ever (found by reading, with
 * tests/fuzz/fuzz_doorbell.c's model of the host backend). Every
 * watchdog tick, the slot of each op still in flight on such a rank gets
 * the release value again if it holds less than the op. A client that
 * overwrites it in a tight loop can still delay its own rank's ops; only
 * its own job waits on them. */
static void restore_release(struct ovld_rank *r) /* under r->mu */
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
            ovld_report(&r->cb->base.report, OVLD_REPORT_WARN,
                        "device %d: a released rank's doorbell was written below op %" PRIu64
                        " after its client left (a process keeps the page mapped); ovld "
                        "releases it again",
                        r->dev->ordinal, d->node.seq);
        }
    }
}

/* Host functions never run after a context error: look at old ops' events
 * and at NCCL's asynchronous errors, and report the failure ourselves. */
void cuda_on_watchdog(uv_timer_t *t)
{
    cuda_backend_t *cb = t->data;
    uint64_t now = ovl_mono_ns();
    for (struct ovld_rank *r = cb->ranks; r; r = r->next) {
        ncclResult_t nr = ncclSuccess;
        /* A worker may be creating the communicator right now; an aborted
         * rank's is a worker's, or gone; an issuing thread inside NCCL on
         * it holds nccl_mu, and polls its errors itself (cuda_nccl.c says
         * who may use it). A failing query is an error of the
         * communicator too. */
        if (!r->setup_pending && !r->aborted && pthread_mutex_trylock(&r->nccl_mu) == 0) {
            if (r->nccl) {
                ncclResult_t q = ncclCommGetAsyncError(r->nccl, &nr);
                if (q != ncclSuccess)
                    nr = q;
            }
            pthread_mutex_unlock(&r->nccl_mu);
        }
        pthread_mutex_lock(&r->mu);
        restore_release(r);
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
                ovld_report(&cb->base.report, OVLD_REPORT_WARN,
                            "device %d: op %" PRIu64 " not done after %" PRIu64
                            " s (its event: %s; its ready slot holds %" PRIu64
                            "): it waits for its client's ready, or for a peer",
                            r->dev->ordinal, d->node.seq,
                            (uint64_t)((now - d->issued_ns) / 1000000000u),
                            d->ev ? cudaGetErrorString(cudaEventQuery(d->ev)) : "none",
                            __atomic_load_n(&r->db->ready_slot[d->node.seq % OVL_READY_SLOTS],
                                            __ATOMIC_RELAXED));
            }
            if (why && atomic_compare_exchange_strong(&d->state, &expect, 2)) {
                /* The op's completion carries it: job.c logs it once, with
                 * what the client gets. */
                d->node.status = OVL_ERR_BACKEND;
                snprintf(d->node.message, sizeof(d->node.message), "device %d: %s", r->dev->ordinal,
                         why);
                ovld_cq_push(&cb->cq, &d->node);
            }
        }
        pthread_mutex_unlock(&r->mu);
    }
}

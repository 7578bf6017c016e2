/*
 * cuda_done.c: completions in the CUDA backend. A done batch, on the
 * ringing rank's stream 0, rings one rank (its DONE) or every rank of a
 * replayed op: for each, the error word (if failed), then
 * done_slot[seq % slots] = seq and done = seq in the shared page; then seq
 * into the ringing rank's own counter (ovld's memory, which no client can
 * write), all in one batch of stream memory operations, and one event
 * behind it. A replayed op's graph writes the same itself, in the same
 * order (cuda_graph.c's ring kernel): then only the event and the
 * tracking are done here (cuda_done_track). The backend's poller thread
 * watches the counters of the completions in flight and reports each to
 * the loop once its counter has reached it; a watchdog timer asks the
 * events about what the GPU will never write (a context error) and
 * restores a released rank's ready slots.
 *
 * Polling, not a host function per op: cudaLaunchHostFunc with its event
 * and stream wait cost 5 to 6 us of the issuing thread per op (measured in
 * ovld on one H100 under MPS), a look at a counter nothing. The poller
 * looks every POLL_NS while anything is in flight (backing off to
 * POLL_MAX_NS while nothing of it ends) or was until POLL_LINGER ago, and
 * sleeps on a condition variable after that. Records and
 * events are kept for reuse: nothing is allocated per op once warm.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "doorbell.h"
#include "clock.h"
#include "op_age.h"

/* ---------------------------------------------------------- completion */

#define FREE_DONE_MAX 64 /* completion records a rank keeps for reuse */

/* Drops a reference to e: the last puts it back into its device's pool
 * (home's), its record complete (or the stream dead, and the rank going
 * away anyway). */
static void done_ev_put(cuda_done_ev_t *e)
{
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    struct ovld_rank *h = e->home;
    pthread_mutex_lock(&h->mu);
    e->next = h->free_ev;
    h->free_ev = e;
    pthread_mutex_unlock(&h->mu);
}

/* An event recorded on o's stream s behind the batch just issued, with one
 * reference (the caller's); NULL where none could be had (the watchdog
 * then has no event to ask: the op is still delivered by its counter). */
static cuda_done_ev_t *done_ev_record(struct ovld_rank *o, cudaStream_t s)
{
    pthread_mutex_lock(&o->mu);
    cuda_done_ev_t *e = o->free_ev;
    if (e)
        o->free_ev = e->next;
    pthread_mutex_unlock(&o->mu);
    if (!e) {
        if (!(e = malloc(sizeof(*e))))
            return NULL;
        e->home = o;
        if (cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            free(e);
            return NULL;
        }
    }
    e->next = NULL;
    atomic_init(&e->refs, 1);
    if (cudaEventRecord(e->ev, s) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaEventDestroy(e->ev); /* never recorded: no use to the watchdog */
        free(e);
        return NULL;
    }
    return e;
}

static void done_release(ovld_cq_node_t *node)
{
    cuda_done_t *d = (cuda_done_t *)node;
    struct ovld_rank *r = d->rank;
    cuda_done_ev_t *ev = d->ev;
    pthread_mutex_lock(&r->mu);
    if (d->prev)
        d->prev->next = d->next;
    else if (r->inflight == d)
        r->inflight = d->next;
    if (d->next)
        d->next->prev = d->prev;
    d->prev = NULL;
    bool kept = r->nfree_done < FREE_DONE_MAX;
    if (kept) {
        d->next = r->free_done;
        r->free_done = d;
        r->nfree_done++;
    }
    pthread_mutex_unlock(&r->mu);
    if (!kept)
        free(d);
    done_ev_put(ev);
}

/* A completion record for op seq of r, with cookie, status and message
 * (NULL: none), on nothing's list yet: one of r's kept ones, else a new
 * one; NULL without memory. Field by field, not zeroed whole: a kept
 * record's lines were last written by the loop thread, and the message's
 * 256 bytes need only their first. */
static cuda_done_t *done_get(struct ovld_rank *r, const uint64_t *counter, void *cookie,
                             uint64_t seq, ovl_status_t status, const char *message, uint64_t now)
{
    pthread_mutex_lock(&r->mu);
    cuda_done_t *d = r->free_done;
    if (d) {
        r->free_done = d->next;
        r->nfree_done--;
    }
    pthread_mutex_unlock(&r->mu);
    if (!d && !(d = malloc(sizeof(*d))))
        return NULL;
    d->node.next = NULL;
    d->node.cookie = cookie;
    d->node.seq = seq;
    d->node.status = status;
    d->node.release = done_release;
    if (message)
        snprintf(d->node.message, sizeof(d->node.message), "%s", message);
    else
        d->node.message[0] = '\0';
    d->rank = r;
    d->counter = counter;
    d->ev = NULL;
    d->timer = 0;
    d->node.ns = 0;
    d->issued_ns = now;
    atomic_init(&d->state, 0);
    d->warned = false;
    d->prev = d->next = NULL;
    return d;
}

/* The GPU cannot ring r's done: the CPU does, so that the client's waits
 * end and report the error. d (NULL without memory) carries the failure. */
static void ring_by_cpu(struct ovld_rank *r, cuda_done_t *d, void *cookie, uint64_t seq,
                        const char *why)
{
    cuda_backend_t *cb = r->cb;
    if (r->db) {
        if (cuda_claim_error(r))
            ovl_doorbell_set_error(r->db, seq, (int32_t)OVL_ERR_BACKEND);
        /* the slot first, then done, as the stream writes them */
        ovl_doorbell_ring_slot(r->db, seq);
        if (__atomic_load_n(&r->db->done, __ATOMIC_RELAXED) < seq)
            __atomic_store_n(&r->db->done, seq, __ATOMIC_RELEASE);
    }
    if (!d) {
        if (!ovld_cq_push_nomem(&cb->cq, cookie, seq))
            ovld_report(&cb->base.report, OVLD_REPORT_ERROR,
                        "device %d: out of memory tracking op %" PRIu64
                        ", and for its completion: its job never ends",
                        r->dev->ordinal, seq);
        return;
    }
    d->node.status = OVL_ERR_BACKEND;
    snprintf(d->node.message, sizeof(d->node.message), "%s", why);
    atomic_store(&d->state, 2);
    ovld_cq_push(&cb->cq, &d->node);
}

/* A write of the done batch: after all prior work's memory writes, so
 * that the client sees C before it sees done (ovl_cudrv_op_write). */
static CUstreamBatchMemOpParams write_op(void *addr, uint64_t v, bool wide)
{
    return ovl_cudrv_op_write((CUdeviceptr)addr, v, wide);
}

/* Wakes the poller: completions are in flight. */
static void poke_poller(cuda_backend_t *cb)
{
    pthread_mutex_lock(&cb->poll_mu);
    cb->poll_gen++;
    if (cb->poll_idle)
        pthread_cond_signal(&cb->poll_cv);
    pthread_mutex_unlock(&cb->poll_mu);
}

/* ring, with `gpu_why` set where the GPU cannot be asked at all, and
 * `rung` where the GPU rings already (a graph's ring kernel, enqueued on s
 * just before): then only the event and the tracking. */
static void ring(struct ovld_rank *o, cudaStream_t s, ovld_rank_t *const *ranks,
                 void *const *cookies, uint32_t n, uint64_t seq, ovl_status_t status,
                 const char *message, const char *gpu_why, bool rung, uint32_t timer)
{
    cuda_backend_t *cb = o->cb;
    CUstreamBatchMemOpParams ops[4 * CUDA_RING_RANKS + 1];
    bool tracked = false;
    for (uint32_t i0 = 0; i0 < n; i0 += CUDA_RING_RANKS) {
        uint32_t i1 = n - i0 < CUDA_RING_RANKS ? n : i0 + CUDA_RING_RANKS, k = 0;
        CUresult cr = rung ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
        if (!gpu_why && !rung) {
            for (uint32_t i = i0; i < i1; i++) {
                struct ovld_rank *r = ranks[i];
                /* The first failure's status and op; later failures leave
                 * them be. */
                if (status != OVL_OK && cuda_claim_error(r)) {
                    ops[k++] = write_op(&r->db_dev->error_seq, seq, true);
                    ops[k++] = write_op(&r->db_dev->error, (uint32_t)(int32_t)status, false);
                }
                /* First the slot that the client's stream waits on
                 * (proto/doorbell.h), then done, which host-side waits
                 * read: once libovl sees done, the slot is written too, and
                 * the page may be unregistered (ovl_comm_destroy). */
                ops[k++] = write_op(&r->db_dev->done_slot[seq % OVL_READY_SLOTS], seq, true);
                ops[k++] = write_op(&r->db_dev->done, seq, true);
            }
            /* Then the ringing rank's own counter, which the poller reads
             * for every completion of the batch. */
            ops[k++] = write_op(&o->done_own_dev[i0 / CUDA_RING_RANKS], seq, true);
            cr = cb->drv.stream_batch_mem_op((CUstream)s, k, ops, 0);
        }
        /* one event behind the batch, for all its completions, recorded
         * before the poller may see any of them */
        cuda_done_ev_t *ev = cr == CUDA_SUCCESS ? done_ev_record(o, s) : NULL;
        uint64_t now = ovl_mono_ns();
        for (uint32_t i = i0; i < i1; i++) {
            struct ovld_rank *r = ranks[i];
            cuda_done_t *d = done_get(r, &o->done_own[i0 / CUDA_RING_RANKS], cookies[i], seq,
                                      status, message, now);
            if (cr != CUDA_SUCCESS) {
                char why[256];
                if (gpu_why)
                    snprintf(why, sizeof(why), "cannot ring the doorbell: %s", gpu_why);
                else
                    snprintf(why, sizeof(why), "cannot ring the doorbell (cuStreamBatchMemOp): %s",
                             ovl_cudrv_strerror(&cb->drv, cr));
                ring_by_cpu(r, d, cookies[i], seq, why);
                continue;
            }
            if (!d) {
                /* the completion, from the issuing thread to the loop,
                 * without a node of its own */
                if (!ovld_cq_push_nomem(&cb->cq, cookies[i], seq))
                    ovld_report(&cb->base.report, OVLD_REPORT_ERROR,
                                "device %d: out of memory tracking op %" PRIu64
                                ", and for its completion: its job never ends",
                                r->dev->ordinal, seq);
                continue;
            }
            if (ev) {
                atomic_fetch_add(&ev->refs, 1);
                d->ev = ev;
            }
            d->timer = n == 1 ? timer : 0;
            pthread_mutex_lock(&r->mu);
            d->next = r->inflight;
            if (r->inflight)
                r->inflight->prev = d;
            r->inflight = d;
            pthread_mutex_unlock(&r->mu);
            tracked = true;
        }
        done_ev_put(ev); /* the batch's own reference */
    }
    if (tracked)
        poke_poller(cb);
}

void cuda_done_ring(struct ovld_rank *o, cudaStream_t s, ovld_rank_t *const *ranks,
                    void *const *cookies, uint32_t n, uint64_t seq, ovl_status_t status,
                    const char *message)
{
    ring(o, s, ranks, cookies, n, seq, status, message, NULL, false, 0);
}

void cuda_done_track(struct ovld_rank *o, cudaStream_t s, ovld_rank_t *const *ranks,
                     void *const *cookies, uint32_t n, uint64_t seq)
{
    ring(o, s, ranks, cookies, n, seq, OVL_OK, NULL, NULL, true, 0);
}

void cuda_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
               const char *message, void *cookie)
{
    /* its words: cuda_last_err */
    bool nodev = cuda_set_device(r->cb, r->dev) != OVL_OK;
    cudaStream_t s = nodev ? NULL : cuda_stream(r, stream);
    if (!s && !nodev) {
        /* done must ring: on stream 0, which every rank has from its
         * creation, and as the failure it is (a caller's bug). */
        s = cuda_s0(r);
        if (status == OVL_OK) {
            status = OVL_ERR_INTERNAL;
            message = cuda_last_err;
        }
        if (!s) /* it could not catch up with a replay's origin */
            s = cuda_s0_stream(r);
    }
    char why[sizeof(cuda_last_err)];
    snprintf(why, sizeof(why), "%s", cuda_last_err);
    /* a timed op's end, before the batch: complete once its counter is */
    uint32_t slot = (uint32_t)(seq % CUDA_TIMERS), timer = 0;
    if (!nodev && s && r->t_seq[slot] == seq && cudaEventRecord(r->t_end[slot], s) == cudaSuccess)
        timer = slot + 1;
    if (r->t_seq[slot] == seq)
        r->t_seq[slot] = 0;
    ring(r, s, &r, &cookie, 1, seq, status, message, nodev ? why : NULL, false, timer);
}

/* A timed op's device time, in ns (0: none to be had), asked once its
 * counter shows the end event complete (poller thread). */
static uint64_t timer_ns(cuda_done_t *d)
{
    struct ovld_rank *r = d->rank;
    uint32_t slot = d->timer - 1;
    float ms = 0.0f;
    if (cudaSetDevice(r->dev->ordinal) != cudaSuccess)
        return 0;
    cudaError_t ce = cudaEventElapsedTime(&ms, r->t_start[slot], r->t_end[slot]);
    /* the counter follows the end event on its stream, so the event is
     * done; should the runtime not say so yet, the wait is short */
    if (ce == cudaErrorNotReady && cudaEventSynchronize(r->t_end[slot]) == cudaSuccess)
        ce = cudaEventElapsedTime(&ms, r->t_start[slot], r->t_end[slot]);
    if (ce != cudaSuccess || !(ms > 0.0f))
        return 0;
    double ns = (double)ms * 1e6;
    return ns >= 1.8e19 ? UINT64_MAX : (uint64_t)ns; /* +inf too */
}

/* ------------------------------------------------------------- poller */

#define POLL_NS     10000ull   /* between looks while completions come */
#define POLL_MAX_NS 100000ull  /* at most, backing off while none does */
#define POLL_LINGER 1000000ull /* looks on this long after the last work, before it sleeps */
#define POLL_BATCH  64         /* completions of a rank delivered per look */

/* Delivers the completions that the ranks' own counters have reached,
 * oldest first; *ret_waiting: those still in flight. Returns how many it
 * delivered. */
static uint32_t poll_once(cuda_backend_t *cb, uint32_t *ret_waiting)
{
    uint32_t delivered = 0, waiting = 0;
    /* what it takes, oldest first per rank, pushed once the locks are let
     * go: a timed op's time asks the driver, which must not happen under
     * them (an enqueue blocked in the driver would stop every
     * completion) */
    cuda_done_t *take = NULL, **tail = &take;
    pthread_mutex_lock(&cb->ranks_mu);
    for (struct ovld_rank *r = cb->ranks; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        cuda_done_t *ready[POLL_BATCH];
        uint32_t n = 0;
        for (cuda_done_t *d = r->inflight; d; d = d->next) {
            if (atomic_load(&d->state) != 0)
                continue; /* delivered, by this thread or the watchdog */
            if (d->node.seq <= __atomic_load_n(d->counter, __ATOMIC_ACQUIRE) && n < POLL_BATCH)
                ready[n++] = d;
            else
                waiting++;
        }
        /* the list is newest first */
        while (n > 0) {
            cuda_done_t *d = ready[--n];
            int expect = 0;
            if (atomic_compare_exchange_strong(&d->state, &expect, 1)) {
                d->ready_next = NULL;
                *tail = d;
                tail = &d->ready_next;
            }
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&cb->ranks_mu);
    /* The records are the poller's now (state 1: the watchdog leaves them),
     * and their ranks stay until their completions are delivered. */
    while (take) {
        cuda_done_t *d = take;
        take = d->ready_next;
        if (d->timer)
            d->node.ns = timer_ns(d);
        ovld_cq_push(&cb->cq, &d->node);
        delivered++;
    }
    *ret_waiting = waiting;
    return delivered;
}

/*
 * Looks while anything is in flight, and for POLL_LINGER after the last
 * completion or ring, then sleeps on poll_cv until the next ring. The
 * lingering keeps the wake-up (a futex call, microseconds) off the issuing
 * thread for ops that come one after another rather than back to back:
 * the ring finds the poller awake and only counts (poke_poller).
 */
static void *poll_main(void *arg)
{
    cuda_backend_t *cb = arg;
    /* sleeps of POLL_NS, not the default 50 us of slack on top */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    uint64_t sleep_ns = POLL_NS, busy_ns = ovl_mono_ns();
    pthread_mutex_lock(&cb->poll_mu);
    while (!cb->poll_stop) {
        uint64_t gen = cb->poll_gen;
        pthread_mutex_unlock(&cb->poll_mu);
        uint32_t waiting;
        if (poll_once(cb, &waiting) > 0) {
            sleep_ns = POLL_NS;
            busy_ns = ovl_mono_ns();
        }
        bool linger = waiting == 0 && ovl_mono_ns() - busy_ns < POLL_LINGER;
        if (waiting > 0) {
            struct timespec ts = {0, (long)sleep_ns};
            nanosleep(&ts, NULL);
            /* an op that does not end (a client holding its stream): look
             * less often, not less surely */
            sleep_ns = sleep_ns * 2 > POLL_MAX_NS ? POLL_MAX_NS : sleep_ns * 2;
        } else if (linger) {
            /* at the first pace: the next op may come at any time */
            struct timespec ts = {0, (long)POLL_NS};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&cb->poll_mu);
        if (cb->poll_gen != gen) {
            sleep_ns = POLL_NS; /* new ops: they may end soon */
            busy_ns = ovl_mono_ns();
        } else if (waiting == 0 && !linger) {
            cb->poll_idle = true;
            while (cb->poll_gen == gen && !cb->poll_stop)
                pthread_cond_wait(&cb->poll_cv, &cb->poll_mu);
            cb->poll_idle = false;
            sleep_ns = POLL_NS;
            busy_ns = ovl_mono_ns();
        }
    }
    pthread_mutex_unlock(&cb->poll_mu);
    return NULL;
}

ovl_status_t cuda_poller_start(cuda_backend_t *cb, char *err, size_t errlen)
{
    int e = pthread_create(&cb->poller, NULL, poll_main, cb);
    if (e != 0) {
        snprintf(err, errlen, "the completions' thread: %s", strerror(e));
        return OVL_ERR_SYSTEM;
    }
    cb->poller_started = true;
    return OVL_OK;
}

void cuda_poller_stop(cuda_backend_t *cb)
{
    if (!cb->poller_started)
        return;
    pthread_mutex_lock(&cb->poll_mu);
    cb->poll_stop = true;
    pthread_cond_signal(&cb->poll_cv);
    pthread_mutex_unlock(&cb->poll_mu);
    pthread_join(cb->poller, NULL);
    cb->poller_started = false;
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
    uint64_t release = __atomic_load_n(&r->release_value, __ATOMIC_ACQUIRE);
    if (!release)
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
        __atomic_store_n(slot, release, __ATOMIC_RELEASE);
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
        /* Read under the lock that ring() puts ops on r->inflight under:
         * every op found there had its issued_ns read before this (and
         * ovld_op_age would judge a later one young all the same). */
        uint64_t now = ovl_mono_ns();
        restore_release(r);
        for (cuda_done_t *d = r->inflight; d; d = d->next) {
            ovld_op_age_t age = ovld_op_age(now, d->issued_ns);
            if (atomic_load(&d->state) != 0 || age == OVLD_OP_FRESH)
                continue;
            const char *why = NULL;
            char buf[200];
            if (nr != ncclSuccess && nr != ncclInProgress) {
                snprintf(buf, sizeof(buf), "NCCL: %s", ncclGetErrorString(nr));
                why = buf;
            } else if (d->ev) {
                cudaError_t ce = cudaEventQuery(d->ev->ev);
                if (ce != cudaSuccess && ce != cudaErrorNotReady) {
                    snprintf(buf, sizeof(buf), "CUDA: %s", cudaGetErrorString(ce));
                    why = buf;
                }
            }
            int expect = 0;
            if (!why && !d->warned && age == OVLD_OP_WARN) {
                /* Not an error yet: a client may hold its stream on purpose.
                 * But a stream that never moves again is worth a line. */
                d->warned = true;
                ovld_report(&cb->base.report, OVLD_REPORT_WARN,
                            "device %d: op %" PRIu64 " not done after %" PRIu64
                            " s (its event: %s; its ready slot holds %" PRIu64
                            "): it waits for its client's ready, or for a peer",
                            r->dev->ordinal, d->node.seq,
                            ovld_op_age_ns(now, d->issued_ns) / 1000000000u,
                            d->ev ? cudaGetErrorString(cudaEventQuery(d->ev->ev)) : "none",
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

/*
 * cuda_graph.c: replay in the CUDA backend (backend.h, graph_*). An op's
 * body is captured from its ranks' streams by thread-local stream capture:
 * the origin rank's stream 0 begins it, the other ranks' stream 0 join it
 * by waiting on the origin's fork event, their other streams by the plan's
 * own waits, and everything joins the origin's stream 0 again before the
 * capture ends. The graph is instantiated once; each replayed op is then,
 * all on the origin's stream 0: one batch of the doorbell waits of the
 * ranks whose ready ovld does not see yet (cuda_wait_ready), then the
 * launch. The graph's last node rings every rank's done itself
 * (ring_capture: a kernel reading the op's seq from the origin's ring,
 * which graph_run fills), so that no batch of done writes follows the
 * launch: that batch cost the issuing thread 3.7 us at world 1 and 6.5 us
 * at world 8 (a timed copy of ovld on one H100 under MPS); an op of one
 * rank, or of more than a kernel rings, keeps it (cuda_done.c). The other
 * ranks' stream 0 wait for the origin's only when they next have eager
 * work (cuda_s0), and the origin's for theirs only when they had some
 * (s0_ahead), so that a run of replayed ops costs the same few calls at
 * any world. Measured on one H100
 * under MPS (bench/issue_lab.c): a launch of the record and two GEMMs of a
 * world-1 op costs 1.2 us of host time, issuing them call by call 19 us.
 *
 * A launch costs about 1.5 us of host time for every stream its graph
 * forks to, whatever runs there (issue_lab, "graph w8": eight ranks' body
 * on 8 streams 11-12 us, on 4 streams 6 us, on 2 3 us, on 1 2-3 us). So
 * where the config asks it (capture_streams, cb->cap_streams) and ranks of
 * an op share the origin's GPU, their streams are captured on that many of
 * the origin's (cap_pool; index 0 is its stream 0), or on as many as one
 * rank's plan has streams where that is more: stream s of the L-th such
 * rank goes to pool stream (L x its streams + s) mod that width, so that a
 * rank's own streams never share one, the ranks spread over the pool, and
 * where the width is a multiple of the plan's streams (ring's 4 with a
 * width of 4 or 8) the ranks' same-role streams (ring's copies, its GEMMs)
 * share pool streams rather than queue behind each other's other work
 * (measured: mixing them, (L + s) mod 4, was slower still). The pool's
 * streams are of one priority: a graph is instantiated without
 * cudaGraphInstantiateFlagUseNodePriority, so all of it runs at the
 * priority of the stream it is launched into anyway. Sharing a stream only adds
 * order between work that may run in any order, and every wait of a
 * capture is on work captured before it, so no mapping can deadlock; but
 * it takes concurrency from the GPU: on one H100, eight ranks' tiny ops on
 * 4 streams were issued in 20-29 us rather than 25-66, but ran 10-40%
 * slower; ring's on 8 streams rather than 32 were issued in 20-29 us
 * rather than 41-82, and ran as fast or faster (docs/history/
 * performance-journal.md, "Issue 15, step 10"). The
 * default is 8. Ranks on other GPUs keep their own streams.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "doorbell.h"
#include "kernels.h"

struct ovld_graph {
    cudaGraphExec_t exec;
    bool rings; /* its last node rings the op's done (ring_capture) */
};

_Static_assert(OVLD_RING_MAX_RANKS <= CUDA_RING_RANKS, "a ring kernel writes done_own[0] alone");
_Static_assert(OVLD_RING_MAX_RANKS < OVLD_RING_SEQS, "a thread per slot rings a rank");

/* Captures the ring kernel (kernels.h) on the origin's stream 0, after
 * everything else of the body: every rank's done slot and done, then the
 * origin's own counter, as cuda_done_ring's batch writes them, with the
 * seq the host leaves in the origin's ring before each launch. Where the
 * op has one rank, or more than one kernel rings, nothing: its done is
 * rung by a batch after each launch, as without. A batch's host time
 * grows with the ranks (two writes each), the kernel's GPU time does not:
 * from two ranks on it made back-to-back ops faster (one H100 under MPS,
 * bench/results/2026-11-25-done-ring-ab-9c4bf08-h100.md), while at world 1, where the GPU sets their pace, it
 * was not shown to help. */
static cudaError_t ring_capture(ovld_rank_t *const *ranks, uint32_t n, bool *rings)
{
    struct ovld_rank *o = ranks[0];
    *rings = false;
    if (n < 2 || n > OVLD_RING_MAX_RANKS)
        return cudaSuccess;
    ovld_ring_args_t a;
    memset(&a, 0, sizeof(a));
    a.seqs = o->ring_dev->seq;
    a.ran = &o->ring_dev->ran;
    a.own = &o->done_own_dev[0];
    a.n = n;
    a.slot_off = (uint32_t)offsetof(struct ovl_doorbell, done_slot);
    a.done_off = (uint32_t)offsetof(struct ovl_doorbell, done);
    a.db_slots = OVL_READY_SLOTS;
    for (uint32_t i = 0; i < n; i++)
        a.db[i] = ranks[i]->db_dev;
    cudaError_t ce = ovld_launch_ring(cuda_s0_stream(o), &a);
    *rings = ce == cudaSuccess;
    return ce;
}

/* Keeps the words of a failed call of the capture; clears the thread's
 * CUDA error, which a failed capture may leave (none of it is sticky). */
static ovl_status_t graph_fail(cudaError_t ce, const char *what)
{
    snprintf(cuda_last_err, sizeof(cuda_last_err), "replay: %s: %s", what, cudaGetErrorString(ce));
    (void)cudaGetLastError();
    return OVL_ERR_BACKEND;
}

/* Every rank's streams back to its own for eager work. */
static void pool_clear(ovld_rank_t *const *ranks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t s = 0; s < ranks[i]->nslots; s++)
            ranks[i]->slots[s].cap = NULL;
}

/* Ends the capture on the origin's stream 0, whatever state it is in, and
 * drops what it made. */
static void abandon(ovld_rank_t *const *ranks, uint32_t n)
{
    struct ovld_rank *o = ranks[0];
    cudaGraph_t g = NULL;
    if (cudaSetDevice(o->dev->ordinal) == cudaSuccess &&
        cudaStreamEndCapture(cuda_s0_stream(o), &g) == cudaSuccess && g)
        cudaGraphDestroy(g);
    (void)cudaGetLastError();
    cuda_capturing = false;
    pool_clear(ranks, n);
}

/* The origin's pool stream k, made where it is not yet (the current
 * device is the origin's). */
static cudaStream_t pool_stream(struct ovld_rank *o, uint32_t k, cudaError_t *ce)
{
    if (k == 0)
        return cuda_s0_stream(o);
    cudaStream_t *s = &o->cap_pool[k];
    if (!*s) {
        *ce = cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, o->dev->prio_hi);
        if (*ce != cudaSuccess) {
            *s = NULL;
            return NULL;
        }
    }
    return *s;
}

/* Gives every stream of the ranks that share the origin's GPU, where
 * there are two or more and the config asks it, its pool stream for this
 * capture (above). */
static cudaError_t pool_assign(ovld_rank_t *const *ranks, uint32_t n)
{
    struct ovld_rank *o = ranks[0];
    uint32_t shared = 0, width = o->cb->cap_streams;
    if (width == 0)
        return cudaSuccess;
    for (uint32_t i = 0; i < n; i++)
        if (ranks[i]->dev == o->dev) {
            shared++;
            if (ranks[i]->nstreams > width)
                width = ranks[i]->nstreams;
        }
    if (shared < 2)
        return cudaSuccess;
    if (width > OVL_PLAN_MAX_STREAMS)
        width = OVL_PLAN_MAX_STREAMS; /* (the executor refuses more) */
    uint32_t lane = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ovld_rank *r = ranks[i];
        if (r->dev != o->dev)
            continue;
        for (uint32_t s = 0; s < r->nstreams && s < r->nslots; s++) {
            if (r->slots[s].cur < 0)
                continue; /* no role: its first use fails (cuda_stream) */
            cudaError_t ce = cudaSuccess;
            r->slots[s].cap = pool_stream(o, (lane * r->nstreams + s) % width, &ce);
            if (!r->slots[s].cap)
                return ce;
        }
        lane++;
    }
    return cudaSuccess;
}

ovl_status_t cuda_graph_capture(ovld_rank_t *const *ranks, uint32_t n)
{
    struct ovld_rank *o = ranks[0];
    cudaError_t ce = cudaSetDevice(o->dev->ordinal);
    if (ce != cudaSuccess)
        return graph_fail(ce, "cudaSetDevice");
    ce = pool_assign(ranks, n);
    if (ce != cudaSuccess) {
        pool_clear(ranks, n);
        return graph_fail(ce, "cudaStreamCreateWithPriority (capture pool)");
    }
    ce = cudaStreamBeginCapture(cuda_s0_stream(o), cudaStreamCaptureModeThreadLocal);
    if (ce != cudaSuccess) {
        pool_clear(ranks, n);
        return graph_fail(ce, "cudaStreamBeginCapture");
    }
    cuda_capturing = true;
    const char *what = "cudaEventRecord (fork)";
    if (n > 1)
        ce = cudaEventRecord(o->fork_ev, cuda_s0_stream(o));
    for (uint32_t i = 1; i < n && ce == cudaSuccess; i++) {
        cudaStream_t s = cuda_captured_stream(ranks[i], 0);
        if (ranks[i]->slots[0].cap && cuda_in_capture(s))
            continue; /* the origin's, or a pool stream already forked to */
        what = "cudaSetDevice";
        ce = cudaSetDevice(ranks[i]->dev->ordinal);
        if (ce == cudaSuccess) {
            what = "cudaStreamWaitEvent (fork)";
            ce = cudaStreamWaitEvent(s, o->fork_ev, 0);
        }
    }
    if (ce != cudaSuccess) {
        ovl_status_t st = graph_fail(ce, what);
        abandon(ranks, n);
        return st;
    }
    return OVL_OK;
}

ovl_status_t cuda_graph_end(ovld_rank_t *const *ranks, uint32_t n, ovld_graph_t **ret)
{
    struct ovld_rank *o = ranks[0];
    if (!ret) {
        abandon(ranks, n);
        return OVL_OK;
    }
    cudaError_t ce = cudaSuccess;
    const char *what = "";
    for (uint32_t i = 1; i < n && ce == cudaSuccess; i++) {
        if (ranks[i]->slots[0].cap)
            continue; /* joined with the pool, below */
        what = "cudaSetDevice";
        ce = cudaSetDevice(ranks[i]->dev->ordinal);
        if (ce == cudaSuccess) {
            what = "cudaEventRecord (join)";
            ce = cudaEventRecord(ranks[i]->join_ev, cuda_s0_stream(ranks[i]));
        }
        if (ce == cudaSuccess) {
            what = "cudaSetDevice";
            ce = cudaSetDevice(o->dev->ordinal);
        }
        if (ce == cudaSuccess) {
            what = "cudaStreamWaitEvent (join)";
            ce = cudaStreamWaitEvent(cuda_s0_stream(o), ranks[i]->join_ev, 0);
        }
    }
    if (ce == cudaSuccess) {
        what = "cudaSetDevice";
        ce = cudaSetDevice(o->dev->ordinal);
    }
    /* Every pool stream the capture used, once (the origin's join_ev: a
     * wait takes the event's state when it is issued). */
    for (uint32_t k = 1; k < OVL_PLAN_MAX_STREAMS && ce == cudaSuccess; k++) {
        cudaStream_t s = o->cap_pool[k];
        if (!s || !cuda_in_capture(s))
            continue;
        what = "cudaEventRecord (join)";
        ce = cudaEventRecord(o->join_ev, s);
        if (ce == cudaSuccess) {
            what = "cudaStreamWaitEvent (join)";
            ce = cudaStreamWaitEvent(cuda_s0_stream(o), o->join_ev, 0);
        }
    }
    bool rings = false;
    if (ce == cudaSuccess) {
        what = "the ring kernel";
        ce = ring_capture(ranks, n, &rings);
    }
    if (ce != cudaSuccess) {
        ovl_status_t st = graph_fail(ce, what);
        abandon(ranks, n);
        return st;
    }
    cudaGraph_t g = NULL;
    ce = cudaStreamEndCapture(cuda_s0_stream(o), &g);
    cuda_capturing = false;
    pool_clear(ranks, n);
    if (ce != cudaSuccess || !g) {
        if (g)
            cudaGraphDestroy(g);
        return graph_fail(ce != cudaSuccess ? ce : cudaErrorStreamCaptureInvalidated,
                          "cudaStreamEndCapture");
    }
    ovld_graph_t *og = calloc(1, sizeof(*og));
    if (!og) {
        cudaGraphDestroy(g);
        snprintf(cuda_last_err, sizeof(cuda_last_err), "replay: out of memory");
        return OVL_ERR_NOMEM;
    }
    ce = cudaGraphInstantiateWithFlags(&og->exec, g, 0);
    cudaGraphDestroy(g);
    if (ce != cudaSuccess) {
        free(og);
        return graph_fail(ce, "cudaGraphInstantiateWithFlags");
    }
    og->rings = rings;
    *ret = og;
    return OVL_OK;
}

#define WAIT_RANKS 64 /* waits per batch call, under the driver's 256 */

ovl_status_t cuda_graph_run(ovld_graph_t *g, ovld_rank_t *const *ranks, void *const *cookies,
                            uint32_t n, uint64_t seq)
{
    struct ovld_rank *o = ranks[0];
    /* The slot this launch's ring kernel will read must not be one that a
     * kernel still to run reads: checked before anything is enqueued. At
     * most OVLD_MAX_ISSUED ops of a job are issued at once, so this holds
     * but for a bug. */
    if (g->rings &&
        o->ring_next - __atomic_load_n(&o->ring->ran, __ATOMIC_ACQUIRE) >= OVLD_RING_SEQS) {
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "replay: %d replayed ops of this origin have not rung yet (internal error)",
                 OVLD_RING_SEQS);
        return OVL_ERR_INTERNAL;
    }
    /* After the work on every rank's stream 0 that the origin's has not
     * waited for yet (eager ops since the last replay). */
    for (uint32_t i = 1; i < n; i++) {
        if (!ranks[i]->s0_ahead) /* (then its lag is NULL: cuda_s0) */
            continue;
        USE_DEVICE(ranks[i]);
        CUDA_TRY(o->cb, cudaEventRecord(ranks[i]->join_ev, cuda_s0_stream(ranks[i])), "replay");
        USE_DEVICE(o);
        CUDA_TRY(o->cb, cudaStreamWaitEvent(cuda_s0_stream(o), ranks[i]->join_ev, 0), "replay");
        ranks[i]->s0_ahead = false;
    }
    USE_DEVICE(o);
    cudaStream_t s = cuda_s0(o);
    if (!s)
        return OVL_ERR_BACKEND;
    /* Every rank's doorbell wait, in batches (the pages are mapped on
     * every device: cudaHostRegisterPortable), but for the ranks already
     * ready (cuda_wait_ready says why none is needed then). */
    CUstreamBatchMemOpParams w[WAIT_RANKS];
    for (uint32_t i = 0; i < n;) {
        uint32_t k = 0;
        for (; i < n && k < WAIT_RANKS; i++)
            if (!cuda_ready_seen(ranks[i], seq))
                w[k++] = ovl_cudrv_op_wait_geq(
                    (CUdeviceptr)&ranks[i]->db_dev->ready_slot[seq % OVL_READY_SLOTS], seq);
        if (k == 0)
            continue;
        CUresult cr = o->cb->drv.stream_batch_mem_op((CUstream)s, k, w, 0);
        if (cr != CUDA_SUCCESS) {
            snprintf(cuda_last_err, sizeof(cuda_last_err),
                     "replay: cuStreamBatchMemOp (doorbell ready): %s",
                     ovl_cudrv_strerror(&o->cb->drv, cr));
            return OVL_ERR_BACKEND;
        }
    }
    if (g->rings)
        __atomic_store_n(&o->ring->seq[o->ring_next % OVLD_RING_SEQS], seq, __ATOMIC_RELEASE);
    CUDA_TRY(o->cb, cudaGraphLaunch(g->exec, s), "replay");
    /* From here on it rings, whatever fails. The other ranks' stream 0 go
     * on after the origin's (cuda_s0, at their next eager work). */
    if (g->rings) {
        o->ring_next++;
        cuda_done_track(o, s, ranks, cookies, n, seq);
    } else {
        cuda_done_ring(o, s, ranks, cookies, n, seq, OVL_OK, NULL);
    }
    if (n == 1)
        return OVL_OK;
    cudaError_t ce = cudaEventRecord(o->run_ev, s);
    if (ce == cudaSuccess) {
        for (uint32_t i = 1; i < n; i++)
            ranks[i]->lag = o;
        return OVL_OK;
    }
    /* No point for the others to wait on: the op is waited for here, on
     * this device's issuing thread (a stream that never ends holds it, and
     * only it). With a broken context this returns at once, as does all. */
    ovld_report(&o->cb->base.report, OVLD_REPORT_WARN,
                "device %d: op %" PRIu64 ": replay: cudaEventRecord: %s; the op is waited for "
                "before the next is issued",
                o->dev->ordinal, seq, cudaGetErrorString(ce));
    (void)cudaStreamSynchronize(s);
    (void)cudaGetLastError();
    return OVL_OK;
}

void cuda_graph_free(ovld_backend_t *b, ovld_graph_t *g)
{
    (void)b;
    if (!g)
        return;
    /* one still running is freed once it ends (cuGraphExecDestroy) */
    (void)cudaGraphExecDestroy(g->exec);
    free(g);
}

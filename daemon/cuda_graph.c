/*
 * cuda_graph.c: replay in the CUDA backend (backend.h, graph_*). An op's
 * body is captured from its ranks' streams by thread-local stream capture:
 * the origin rank's stream 0 begins it, the other ranks' stream 0 join it
 * by waiting on the origin's fork event, their other streams by the plan's
 * own waits, and everything joins the origin's stream 0 again before the
 * capture ends. The graph is instantiated once; each replayed op is then,
 * all on the origin's stream 0: one batch of every rank's doorbell wait,
 * the launch, one batch of every rank's done writes (cuda_done.c). The other ranks' stream 0 wait
 * for the origin's only when they next have eager work (cuda_s0), and the
 * origin's for theirs only when they had some (s0_ahead), so that a run of
 * replayed ops costs the same few calls at any world. Measured on one H100
 * under MPS (bench/issue_lab.c): a launch of the record and two GEMMs of a
 * world-1 op costs 1.2 us of host time, issuing them call by call 19 us.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "cuda_internal.h"
#include "doorbell.h"

struct ovld_graph {
    cudaGraphExec_t exec;
};

_Thread_local bool cuda_capturing;

bool cuda_in_capture(cudaStream_t s)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive;
}

/* Keeps the words of a failed call of the capture; clears the thread's
 * CUDA error, which a failed capture may leave (none of it is sticky). */
static ovl_status_t graph_fail(cudaError_t ce, const char *what)
{
    snprintf(cuda_last_err, sizeof(cuda_last_err), "replay: %s: %s", what, cudaGetErrorString(ce));
    (void)cudaGetLastError();
    return OVL_ERR_BACKEND;
}

/* Ends the capture on the origin's stream 0, whatever state it is in, and
 * drops what it made. */
static void abandon(struct ovld_rank *o)
{
    cudaGraph_t g = NULL;
    if (cudaSetDevice(o->dev->ordinal) == cudaSuccess &&
        cudaStreamEndCapture(cuda_s0_stream(o), &g) == cudaSuccess && g)
        cudaGraphDestroy(g);
    (void)cudaGetLastError();
    cuda_capturing = false;
}

ovl_status_t cuda_graph_capture(ovld_rank_t *const *ranks, uint32_t n)
{
    struct ovld_rank *o = ranks[0];
    cudaError_t ce = cudaSetDevice(o->dev->ordinal);
    if (ce != cudaSuccess)
        return graph_fail(ce, "cudaSetDevice");
    ce = cudaStreamBeginCapture(cuda_s0_stream(o), cudaStreamCaptureModeThreadLocal);
    if (ce != cudaSuccess)
        return graph_fail(ce, "cudaStreamBeginCapture");
    cuda_capturing = true;
    const char *what = "cudaEventRecord (fork)";
    if (n > 1)
        ce = cudaEventRecord(o->fork_ev, cuda_s0_stream(o));
    for (uint32_t i = 1; i < n && ce == cudaSuccess; i++) {
        what = "cudaSetDevice";
        ce = cudaSetDevice(ranks[i]->dev->ordinal);
        if (ce == cudaSuccess) {
            what = "cudaStreamWaitEvent (fork)";
            ce = cudaStreamWaitEvent(cuda_s0_stream(ranks[i]), o->fork_ev, 0);
        }
    }
    if (ce != cudaSuccess) {
        ovl_status_t st = graph_fail(ce, what);
        abandon(o);
        return st;
    }
    return OVL_OK;
}

ovl_status_t cuda_graph_end(ovld_rank_t *const *ranks, uint32_t n, ovld_graph_t **ret)
{
    struct ovld_rank *o = ranks[0];
    if (!ret) {
        abandon(o);
        return OVL_OK;
    }
    cudaError_t ce = cudaSuccess;
    const char *what = "";
    for (uint32_t i = 1; i < n && ce == cudaSuccess; i++) {
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
    if (ce != cudaSuccess) {
        ovl_status_t st = graph_fail(ce, what);
        abandon(o);
        return st;
    }
    cudaGraph_t g = NULL;
    ce = cudaStreamEndCapture(cuda_s0_stream(o), &g);
    cuda_capturing = false;
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
    *ret = og;
    return OVL_OK;
}

#define WAIT_RANKS 64 /* waits per batch call, under the driver's 256 */

ovl_status_t cuda_graph_run(ovld_graph_t *g, ovld_rank_t *const *ranks, void *const *cookies,
                            uint32_t n, uint64_t seq)
{
    struct ovld_rank *o = ranks[0];
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
     * every device: cudaHostRegisterPortable). */
    CUstreamBatchMemOpParams w[WAIT_RANKS];
    for (uint32_t i0 = 0; i0 < n; i0 += WAIT_RANKS) {
        uint32_t k = 0;
        for (uint32_t i = i0; i < n && k < WAIT_RANKS; i++, k++)
            w[k] = ovl_cudrv_op_wait_geq(
                (CUdeviceptr)&ranks[i]->db_dev->ready_slot[seq % OVL_READY_SLOTS], seq);
        CUresult cr = o->cb->drv.stream_batch_mem_op((CUstream)s, k, w, 0);
        if (cr != CUDA_SUCCESS) {
            snprintf(cuda_last_err, sizeof(cuda_last_err),
                     "replay: cuStreamBatchMemOp (doorbell ready): %s",
                     ovl_cudrv_strerror(&o->cb->drv, cr));
            return OVL_ERR_BACKEND;
        }
    }
    CUDA_TRY(o->cb, cudaGraphLaunch(g->exec, s), "replay");
    /* From here on it rings, whatever fails. The other ranks' stream 0 go
     * on after the origin's (cuda_s0, at their next eager work). */
    cuda_done_ring(o, s, ranks, cookies, n, seq, OVL_OK, NULL);
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

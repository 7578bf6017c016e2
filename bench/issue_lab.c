/*
 * issue_lab.c: ovl-issue-lab, what the host calls behind one op cost on
 * this machine, without ovld: each CUDA runtime, driver and cuBLASLt call
 * that libovl's submit and ovld's issue make per op, one at a time, and the
 * world-1 ring op (docs/plans.md: WAIT_READY, RECORD, two GEMMs, DONE) as
 * ovld issues it today, eagerly, against the same op replayed from a CUDA
 * graph with the doorbell's wait and writes eager around the launch (issue
 * 15: "replay, not rebuild"). Then what a graph's launch pays for: the
 * body of a world-8 naive op with every rank on this GPU as ovld captures
 * it, and variants of it (copy nodes or one copy kernel a rank, all-to-all
 * waits, one barrier, none, one stream), and the doorbell's round trip
 * around a GEMM issued eagerly or launched as a graph. Also the wake-up of a sleeping
 * thread, which every hand-over between ovld's loop and its issuing
 * threads pays.
 *
 * Each row: the host time of one call (ns; p50, p99 over many calls, the
 * stream drained every DRAIN calls so that no queue fills, outside the
 * timed calls), under MPS where MPS runs. The sequences' rows also give the
 * GPU-bound rate: ops back to back with no drain, per op.
 *
 * Usage: ovl-issue-lab [ITERS]   (default 4000). Exit 0, 1 on a CUDA or
 * cuBLASLt error, 2 for bad arguments, 77 without a GPU.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "cudrv.h"
#include "issue_lab_copies.h"

#define DRAIN 32 /* calls between drains of the stream */
#define DIM   128

static int iters = 4000;
static ovl_cudrv_t drv;

#define LAB_WHO "issue-lab"
#include "lab_check.h"
/* a CUDA driver call */
#define DK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS)                                                                    \
            lab_fail(LAB_WHO, #x, __LINE__, ovl_cudrv_strerror(&drv, r_));                         \
    } while (0)

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void row(const char *what, uint64_t *ns, int n, double per_op_us)
{
    qsort(ns, (size_t)n, sizeof(*ns), cmp_u64);
    printf("%-34s %9.2f %9.2f", what, ns[(n - 1) / 2] / 1e3, ns[(size_t)((n - 1) * 0.99)] / 1e3);
    if (per_op_us > 0)
        printf(" %12.2f", per_op_us);
    printf("\n");
}

/* ------------------------------------------------------------ the state */

static cudaStream_t s0, s1, cs; /* the op's stream, another, the completion stream */
static cudaEvent_t ev_a, ev_b, ev_done;
static ovld_lt_t *lt;
static void *ws, *a, *b, *c;
static uint64_t *page;    /* a host page mapped for the GPU (the doorbell) */
static CUdeviceptr dpage; /* as the GPU sees it */
static uint64_t seq;

static void CUDART_CB noop(void *arg)
{
    (void)arg;
}

static void gemm(cudaStream_t s, uint64_t row0)
{
    ovld_gemm_args_t g = {
        .dtype = OVL_DTYPE_BF16,
        .rows = DIM / 2,
        .n = DIM,
        .k = DIM,
        .nblocks = 1,
        .a = {(char *)a + row0 * DIM * 2, DIM},
        .b = {b, DIM},
        .c = {(char *)c + row0 * DIM * 2, DIM},
    };
    char err[256];
    if (ovld_lt_gemm(lt, s, ws, OVLD_LT_WORKSPACE, &g, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "issue-lab: gemm: %s\n", err);
        exit(1);
    }
}

/* A 2048^3 bf16 GEMM (about 25 us): the doorbell's round trip between
 * GEMMs that fill the GPU, as in ovl-bench. */
#define BIG 2048
static void *ba, *bb, *bc;
static void gemm_big(cudaStream_t s)
{
    ovld_gemm_args_t g = {
        .dtype = OVL_DTYPE_BF16,
        .rows = BIG,
        .n = BIG,
        .k = BIG,
        .nblocks = 1,
        .a = {ba, BIG},
        .b = {bb, BIG},
        .c = {bc, BIG},
    };
    char err[256];
    if (ovld_lt_gemm(lt, s, ws, OVLD_LT_WORKSPACE, &g, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "issue-lab: gemm: %s\n", err);
        exit(1);
    }
}
static void gemm_small(cudaStream_t s)
{
    gemm(s, 0);
}
/* Ends the capture that began on s, and instantiates and uploads what it
 * made. */
static cudaGraphExec_t end_capture(cudaStream_t s)
{
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphUpload(x, s));
    CK(cudaGraphDestroy(g));
    return x;
}

/* The 2048^3 GEMM as ovld replays a world-1 op's body: a graph of an event
 * record and the GEMM, launched on the stream. */
static cudaGraphExec_t g_big;
static void gemm_big_graph(cudaStream_t s)
{
    CK(cudaGraphLaunch(g_big, s));
}
static void capture_big(void)
{
    CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    CK(cudaEventRecord(ev_b, s1));
    gemm_big(s1);
    g_big = end_capture(s1);
}

/* ovld's DONE: the slot and done written, an event, the host function
 * behind it on the completion stream. */
static void done_eager(uint64_t n)
{
    CK(cudaSetDevice(0));
    DK(drv.stream_write_value64(s0, dpage + 8 * (1 + n % 8), n, CU_STREAM_WRITE_VALUE_DEFAULT));
    DK(drv.stream_write_value64(s0, dpage, n, CU_STREAM_WRITE_VALUE_DEFAULT));
    CK(cudaEventRecord(ev_done, s0));
    CK(cudaStreamWaitEvent(cs, ev_done, 0));
    CK(cudaLaunchHostFunc(cs, noop, NULL));
}

/* The world-1 ring op as ovld issues it now. */
static void op_eager(void)
{
    uint64_t n = ++seq;
    page[16] = n; /* ready: the client's doorbell, already rung */
    CK(cudaSetDevice(0));
    DK(drv.stream_wait_value64(s0, dpage + 8 * 16, n, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaEventRecord(ev_a, s0));
    gemm(s0, 0);
    gemm(s0, DIM / 2);
    done_eager(n);
}

static cudaGraphExec_t gexec;

/* The same op replayed: the wait and the writes eager, the rest a graph. */
static void op_graph(void)
{
    uint64_t n = ++seq;
    page[16] = n;
    CK(cudaSetDevice(0));
    DK(drv.stream_wait_value64(s0, dpage + 8 * 16, n, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaGraphLaunch(gexec, s0));
    done_eager(n);
}

/* The replayed op without the host function: completion seen by polling
 * the done word the stream writes (no CUDA call). */
static void op_graph_poll(void)
{
    uint64_t n = ++seq;
    page[16] = n;
    CK(cudaSetDevice(0));
    DK(drv.stream_wait_value64(s0, dpage + 8 * 16, n, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaGraphLaunch(gexec, s0));
    DK(drv.stream_write_value64(s0, dpage + 8 * (1 + n % 8), n, CU_STREAM_WRITE_VALUE_DEFAULT));
    DK(drv.stream_write_value64(s0, dpage, n, CU_STREAM_WRITE_VALUE_DEFAULT));
}

static void capture(void)
{
    CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
    CK(cudaEventRecord(ev_a, s0));
    gemm(s0, 0);
    gemm(s0, DIM / 2);
    gexec = end_capture(s0);
}

/* The body of a world-8 naive op of DIM rows a rank with every rank on
 * this GPU, as ovld captures it (ovlctl plan --algo naive --world 8
 * --shared-gpu): each rank's stream records its start and waits for every
 * other's, pulls the 8 shards into its G, records, runs its GEMM and waits
 * for every other rank's pulls before it joins. Variants, to see what a
 * launch pays for: the pulls as 8 copies each (cudaMemcpy2DAsync: copy
 * nodes) or as one lab_launch_copies kernel; the all-to-all waits as they
 * are (56 edges each time), through one barrier node on the origin's
 * stream (16), or none (the ranks independent, forked and joined); or the
 * ranks' bodies (kernels) spread round-robin over 4 or 2 streams, the
 * all-to-all waits between those streams only; or the whole body on one
 * stream. */
#define W8 8
typedef enum w8_shape {
    W8_COPIES,
    W8_KERNEL,
    W8_BARRIER,
    W8_NO_WAITS,
    W8_FOUR_STREAMS,
    W8_TWO_STREAMS,
    W8_ONE_STREAM
} w8_shape_t;
static cudaStream_t rs[W8];
static cudaEvent_t ev_start[W8], ev_pulled[W8], ev_join[W8], ev_fork, ev_bar;
static void *w8_a[W8], *w8_g[W8];
static cudaGraphExec_t g8[W8_ONE_STREAM + 1];

static void w8_pulls(cudaStream_t s, int r, bool kernel)
{
    if (kernel) {
        lab_copies_t c = {.n = W8};
        for (int q = 0; q < W8; q++)
            c.p[q] = (lab_copy_piece_t){.src = w8_a[q],
                                        .dst = (char *)w8_g[r] + (size_t)q * DIM * DIM * 2,
                                        .src_ld = DIM * 2,
                                        .dst_ld = DIM * 2,
                                        .rows = DIM,
                                        .width = DIM * 2};
        CK(lab_launch_copies(s, &c));
        return;
    }
    for (int q = 0; q < W8; q++)
        CK(cudaMemcpy2DAsync((char *)w8_g[r] + (size_t)q * DIM * DIM * 2, DIM * 2, w8_a[q], DIM * 2,
                             DIM * 2, DIM, cudaMemcpyDeviceToDevice, s));
}

/* Each of the first k streams waits for every other's ev[] (all-to-all),
 * or for one barrier on s0 behind all of them. */
static void w8_sync(cudaEvent_t *ev, w8_shape_t shape, int k)
{
    if (shape == W8_NO_WAITS)
        return;
    if (shape == W8_BARRIER) {
        for (int q = 0; q < k; q++)
            CK(cudaStreamWaitEvent(s0, ev[q], 0));
        CK(cudaEventRecord(ev_bar, s0));
        for (int r = 0; r < k; r++)
            CK(cudaStreamWaitEvent(rs[r], ev_bar, 0));
        return;
    }
    for (int r = 0; r < k; r++)
        for (int q = 0; q < k; q++)
            if (q != r)
                CK(cudaStreamWaitEvent(rs[r], ev[q], 0));
}

static cudaGraphExec_t capture_w8(w8_shape_t shape)
{
    CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
    if (shape == W8_ONE_STREAM) {
        for (int r = 0; r < W8; r++) {
            w8_pulls(s0, r, true);
            gemm(s0, 0);
        }
    } else {
        /* the streams rank r's body goes on: rs[r % k] */
        int k = shape == W8_FOUR_STREAMS ? 4 : shape == W8_TWO_STREAMS ? 2 : W8;
        CK(cudaEventRecord(ev_fork, s0));
        for (int q = 0; q < k; q++) {
            CK(cudaStreamWaitEvent(rs[q], ev_fork, 0));
            CK(cudaEventRecord(ev_start[q], rs[q]));
        }
        w8_sync(ev_start, shape, k);
        for (int r = 0; r < W8; r++) {
            w8_pulls(rs[r % k], r, shape != W8_COPIES);
            if (k == W8) /* a stream a rank: its pulls are done here */
                CK(cudaEventRecord(ev_pulled[r], rs[r]));
            gemm(rs[r % k], 0);
        }
        for (int q = 0; k < W8 && q < k; q++) /* after every rank's body */
            CK(cudaEventRecord(ev_pulled[q], rs[q]));
        w8_sync(ev_pulled, shape, k);
        for (int q = 0; q < k; q++) {
            CK(cudaEventRecord(ev_join[q], rs[q]));
            CK(cudaStreamWaitEvent(s0, ev_join[q], 0));
        }
    }
    return end_capture(s0);
}

static void setup_w8(void)
{
    for (int r = 0; r < W8; r++) {
        CK(cudaStreamCreateWithFlags(&rs[r], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&ev_start[r], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&ev_pulled[r], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&ev_join[r], cudaEventDisableTiming));
        CK(cudaMalloc(&w8_a[r], DIM * DIM * 2));
        CK(cudaMalloc(&w8_g[r], (size_t)W8 * DIM * DIM * 2));
        CK(cudaMemset(w8_a[r], r + 1, DIM * DIM * 2));
    }
    CK(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&ev_bar, cudaEventDisableTiming));
    for (int v = 0; v <= W8_ONE_STREAM; v++)
        g8[v] = capture_w8((w8_shape_t)v);
    /* every variant gathers what the copies do */
    size_t bytes = (size_t)W8 * DIM * DIM * 2;
    unsigned char *want = malloc(bytes), *got = malloc(bytes);
    CK(cudaGraphLaunch(g8[W8_COPIES], s0));
    CK(cudaStreamSynchronize(s0));
    CK(cudaMemcpy(want, w8_g[3], bytes, cudaMemcpyDeviceToHost));
    if (want[0] != 1 || want[(size_t)7 * DIM * DIM * 2] != 8) {
        fprintf(stderr, "issue-lab: the copies gathered other bytes than the shards\n");
        exit(1);
    }
    for (int v = W8_KERNEL; v <= W8_ONE_STREAM; v++) {
        CK(cudaMemset(w8_g[3], 0, bytes));
        CK(cudaGraphLaunch(g8[v], s0));
        CK(cudaStreamSynchronize(s0));
        CK(cudaMemcpy(got, w8_g[3], bytes, cudaMemcpyDeviceToHost));
        if (memcmp(want, got, bytes) != 0) {
            fprintf(stderr, "issue-lab: world-8 variant %d gathered other bytes\n", v);
            exit(1);
        }
    }
    free(want);
    free(got);
}

static w8_shape_t w8_now;
static void c_graph_w8(void)
{
    CK(cudaGraphLaunch(g8[w8_now], s0));
}

/* Launches from several threads at once: 8 graphs of one rank's body
 * each (one stream: the rank's copy kernel and a GEMM), each launched on
 * that rank's stream, by one thread one after another, or by 8 threads at
 * once (spinning on a start word, so that no wake-up is timed): the span
 * from the first launch's start to the last one's end. Whether the driver
 * lets launches into one context go in parallel, which a graph per rank
 * launched from the ranks' own threads would need. */
static cudaGraphExec_t g1[W8];
static _Atomic uint64_t par_go; /* the round; UINT64_MAX: stop */
static _Atomic int par_done;
static uint64_t par_t0[W8], par_t1[W8];

static void *par_main(void *arg)
{
    int r = (int)(intptr_t)arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        while ((g = atomic_load_explicit(&par_go, memory_order_acquire)) == seen)
            ;
        if (g == UINT64_MAX)
            return NULL;
        seen = g;
        par_t0[r] = now_ns();
        CK(cudaGraphLaunch(g1[r], rs[r]));
        par_t1[r] = now_ns();
        atomic_fetch_add_explicit(&par_done, 1, memory_order_release);
    }
}

static void setup_par(void)
{
    for (int r = 0; r < W8; r++) {
        CK(cudaStreamBeginCapture(rs[r], cudaStreamCaptureModeThreadLocal));
        w8_pulls(rs[r], r, true);
        gemm(rs[r], 0);
        g1[r] = end_capture(rs[r]);
    }
}

static void c_par_serial(void)
{
    for (int r = 0; r < W8; r++)
        CK(cudaGraphLaunch(g1[r], rs[r]));
}

static void time_par_threads(const char *what)
{
    pthread_t t[W8];
    for (int r = 0; r < W8; r++)
        if (pthread_create(&t[r], NULL, par_main, (void *)(intptr_t)r) != 0) {
            fprintf(stderr, "issue-lab: pthread_create failed\n");
            exit(1);
        }
    uint64_t *ns = malloc((size_t)iters * sizeof(*ns));
    for (int i = -50; i < iters; i++) {
        if (i % DRAIN == 0)
            CK(cudaDeviceSynchronize());
        atomic_store(&par_done, 0);
        atomic_store_explicit(&par_go, (uint64_t)(i + 51), memory_order_release);
        while (atomic_load_explicit(&par_done, memory_order_acquire) < W8)
            ;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int r = 0; r < W8; r++) {
            lo = par_t0[r] < lo ? par_t0[r] : lo;
            hi = par_t1[r] > hi ? par_t1[r] : hi;
        }
        if (i >= 0)
            ns[i] = hi - lo;
    }
    atomic_store(&par_go, UINT64_MAX);
    for (int r = 0; r < W8; r++)
        pthread_join(t[r], NULL);
    CK(cudaDeviceSynchronize());
    row(what, ns, iters, 0);
    free(ns);
}

/* Times fn() iters times, draining the streams every DRAIN calls. */
static void time_calls(const char *what, void (*fn)(void))
{
    uint64_t *ns = malloc((size_t)iters * sizeof(*ns));
    for (int i = 0; i < 50; i++)
        fn();
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < iters; i++) {
        if (i % DRAIN == 0)
            CK(cudaDeviceSynchronize());
        uint64_t t0 = now_ns();
        fn();
        ns[i] = now_ns() - t0;
    }
    CK(cudaDeviceSynchronize());
    /* back to back: the rate the GPU and the host together allow */
    uint64_t t0 = now_ns();
    for (int i = 0; i < iters; i++) {
        fn();
        if (i % 256 == 255)
            CK(cudaStreamSynchronize(s0)); /* keep the queue bounded */
    }
    CK(cudaDeviceSynchronize());
    double per = (now_ns() - t0) / 1e3 / iters;
    row(what, ns, iters, per);
    free(ns);
}

/* ------------------------------------------------------ single calls */

static int devnum;
static void c_get_device(void)
{
    CK(cudaGetDevice(&devnum));
}
static void c_set_device(void)
{
    CK(cudaSetDevice(0));
}
static void c_record(void)
{
    CK(cudaEventRecord(ev_a, s0));
}
static void c_wait_event(void)
{
    CK(cudaEventRecord(ev_b, s1));
    CK(cudaStreamWaitEvent(s0, ev_b, 0));
}
static void c_wait_value(void)
{
    page[16] = ++seq;
    DK(drv.stream_wait_value64(s0, dpage + 8 * 16, seq, CU_STREAM_WAIT_VALUE_GEQ));
}
/* A world-8 op's doorbells on one stream: 8 waits, then 16 writes (slot
 * and done of each rank), each set in one call (daemon/backend/cuda/cuda_graph.c). */
static void c_batch_wait8(void)
{
    CUstreamBatchMemOpParams w[8];
    page[16] = ++seq;
    for (int i = 0; i < 8; i++)
        w[i] = ovl_cudrv_op_wait_geq(dpage + 8 * 16, seq);
    DK(drv.stream_batch_mem_op(s0, 8, w, 0));
}
static void c_batch_write16(void)
{
    CUstreamBatchMemOpParams w[16];
    ++seq;
    for (int i = 0; i < 16; i++)
        w[i] = ovl_cudrv_op_write(dpage + 8 * (1 + i % 8), seq, true);
    DK(drv.stream_batch_mem_op(s0, 16, w, 0));
}
/* libovl's submit as one call: the ready write, then the wait for done. */
static void c_batch_submit(void)
{
    ++seq;
    page[1 + seq % 8] = seq; /* done: already rung */
    CUstreamBatchMemOpParams w[2] = {
        ovl_cudrv_op_write(dpage + 8 * 16, seq, true),
        ovl_cudrv_op_wait_geq(dpage + 8 * (1 + seq % 8), seq),
    };
    DK(drv.stream_batch_mem_op(s0, 2, w, 0));
}
static void c_write_value(void)
{
    DK(drv.stream_write_value64(s0, dpage, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT));
}
static void c_host_func(void)
{
    CK(cudaLaunchHostFunc(cs, noop, NULL));
}
static void c_gemm(void)
{
    gemm(s0, 0);
}
static void c_copy(void)
{
    CK(cudaMemcpy2DAsync(c, DIM * 2, a, DIM * 2, DIM * 2, DIM / 2, cudaMemcpyDeviceToDevice, s0));
}
static void c_graph_launch(void)
{
    CK(cudaGraphLaunch(gexec, s0));
}
static void c_buffer_id(void)
{
    unsigned long long id;
    DK(drv.pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)(uintptr_t)a));
}
static void c_addr_range(void)
{
    CUdeviceptr base;
    size_t size;
    DK(drv.mem_get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)a));
}
static void c_ipc_handle(void)
{
    cudaIpcMemHandle_t h;
    CK(cudaIpcGetMemHandle(&h, a));
}
static void c_event_query(void)
{
    (void)cudaEventQuery(ev_done);
}

/* ------------------------------------------------------- host only */

static int sv[2];
static void *drain_main(void *arg)
{
    (void)arg;
    char buf[4096];
    while (read(sv[1], buf, sizeof(buf)) > 0) {
    }
    return NULL;
}
static void c_sock_write(void)
{
    char msg[256] = {0};
    if (write(sv[0], msg, sizeof(msg)) != (ssize_t)sizeof(msg)) {
        fprintf(stderr, "issue-lab: write: %s\n", strerror(errno));
        exit(1);
    }
}

/* A ping-pong through a mutex and condition variable: what handing an item
 * to a sleeping thread and getting it back costs (two wake-ups). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int turn; /* 0: main's, 1: the other's, 2: stop */
static void *pong_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (turn == 0)
            pthread_cond_wait(&cv, &mu);
        if (turn == 2)
            break;
        turn = 0;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}
static void c_ping(void)
{
    pthread_mutex_lock(&mu);
    turn = 1;
    pthread_cond_broadcast(&cv);
    while (turn != 0)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void time_host(const char *what, void (*fn)(void))
{
    uint64_t *ns = malloc((size_t)iters * sizeof(*ns));
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        fn();
        ns[i] = now_ns() - t0;
    }
    row(what, ns, iters, 0);
    free(ns);
}

static float elapsed_ms(cudaEvent_t t0, cudaEvent_t t1)
{
    float ms;
    CK(cudaEventSynchronize(t1));
    CK(cudaEventElapsedTime(&ms, t0, t1));
    return ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/*
 * The doorbell's round trip on the GPU: a "client" stream writes ready = i
 * and waits done >= i, an "ovld" stream waits ready >= i and writes done =
 * i (with work, that work between: a GEMM), i = 1..n back to back, timed by events
 * on the client's stream: what every op of a stream-ordered submit pays
 * between one op's last kernel and the next op's first, with the counters
 * in a host page mapped for the GPU (ovl today) or in device memory.
 */
static void time_round_trip(const char *what, CUdeviceptr ready, CUdeviceptr done,
                            void (*work)(cudaStream_t))
{
    enum { N = 2000, WARM = 100, ROUNDS = 7 };
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    double extra[ROUNDS], alone[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        alone[round] = 0;
        if (work) { /* the work alone, back to back, just before */
            CK(cudaEventRecord(t0, s1));
            for (int i = 0; i < N; i++)
                work(s1);
            CK(cudaEventRecord(t1, s1));
            alone[round] = elapsed_ms(t0, t1) * 1e3 / N;
        }
        CK(cudaMemset((void *)(uintptr_t)ready, 0, 8));
        CK(cudaMemset((void *)(uintptr_t)done, 0, 8));
        CK(cudaDeviceSynchronize());
        for (int i = 1; i <= WARM + N; i++) {
            if (i == WARM + 1)
                CK(cudaEventRecord(t0, s0));
            DK(drv.stream_wait_value64(s1, ready, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ));
            if (work)
                work(s1);
            DK(drv.stream_write_value64(s1, done, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT));
            DK(drv.stream_write_value64(s0, ready, (uint64_t)i, CU_STREAM_WRITE_VALUE_DEFAULT));
            DK(drv.stream_wait_value64(s0, done, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ));
        }
        CK(cudaEventRecord(t1, s0));
        extra[round] = elapsed_ms(t0, t1) * 1e3 / N - alone[round];
    }
    qsort(extra, ROUNDS, sizeof(double), cmp_double);
    qsort(alone, ROUNDS, sizeof(double), cmp_double);
    printf("%-34s %9.2f %9.2f %12.2f", what, extra[0], extra[ROUNDS - 1], extra[ROUNDS / 2]);
    if (work)
        printf("   (work alone %.2f us)", alone[ROUNDS / 2]);
    printf("\n");
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
}

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && (iters = atoi(argv[1])) < 100)) {
        fprintf(stderr, "usage: ovl-issue-lab [ITERS >= 100]\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "issue-lab: no GPU\n");
        return 77;
    }
    char why[256];
    if (ovl_cudrv_load(&drv, why, sizeof(why)) != 0) {
        fprintf(stderr, "issue-lab: %s\n", why);
        return 1;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev_a, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&ev_b, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&ev_done, cudaEventDisableTiming));
    CK(cudaMalloc(&ws, OVLD_LT_WORKSPACE));
    CK(cudaMalloc(&a, DIM * DIM * 2));
    CK(cudaMalloc(&b, DIM * DIM * 2));
    CK(cudaMalloc(&c, DIM * DIM * 2));
    CK(cudaMemset(a, 0, DIM * DIM * 2));
    CK(cudaMemset(b, 0, DIM * DIM * 2));
    CK(cudaHostAlloc((void **)&page, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(page, 0, 4096);
    void *dp;
    CK(cudaHostGetDevicePointer(&dp, page, 0));
    dpage = (CUdeviceptr)(uintptr_t)dp;
    if (ovld_lt_create(&lt, why, sizeof(why)) != OVL_OK) {
        fprintf(stderr, "issue-lab: %s\n", why);
        return 1;
    }
    gemm(s0, 0); /* the descriptors and the heuristic, cached */
    gemm(s0, DIM / 2);
    CK(cudaDeviceSynchronize());
    capture();

    printf("ovl-issue-lab: %s, %d calls per row, the stream drained every %d; bf16 GEMMs of "
           "%dx%dx%d\n",
           prop.name, iters, DRAIN, DIM / 2, DIM, DIM);
    printf("%-34s %9s %9s %12s\n", "call", "p50 us", "p99 us", "b2b us/call");
    time_calls("cudaGetDevice", c_get_device);
    time_calls("cudaSetDevice (current)", c_set_device);
    time_calls("cudaEventRecord", c_record);
    time_calls("record + cudaStreamWaitEvent", c_wait_event);
    time_calls("cuStreamWaitValue64 (host page)", c_wait_value);
    time_calls("cuStreamWriteValue64 (host page)", c_write_value);
    time_calls("cuStreamBatchMemOp 8 waits", c_batch_wait8);
    time_calls("cuStreamBatchMemOp 16 writes", c_batch_write16);
    time_calls("cuStreamBatchMemOp write + wait", c_batch_submit);
    time_calls("cudaLaunchHostFunc", c_host_func);
    time_calls("cudaEventQuery", c_event_query);
    time_calls("cublasLtMatmul 64x128x128 (cached)", c_gemm);
    time_calls("cudaMemcpy2DAsync 64 rows", c_copy);
    time_calls("cudaGraphLaunch (record, 2 GEMMs)", c_graph_launch);
    setup_w8();
    static const char *w8_rows[] = {
        [W8_COPIES] = "graph w8 naive: 64 copy nodes",
        [W8_KERNEL] = "graph w8 naive: 8 copy kernels",
        [W8_BARRIER] = "graph w8, kernels: barrier node",
        [W8_NO_WAITS] = "graph w8, kernels: no cross waits",
        [W8_FOUR_STREAMS] = "graph w8, kernels: 4 streams",
        [W8_TWO_STREAMS] = "graph w8, kernels: 2 streams",
        [W8_ONE_STREAM] = "graph w8, kernels: one stream",
    };
    for (int v = 0; v <= W8_ONE_STREAM; v++) {
        w8_now = (w8_shape_t)v;
        time_calls(w8_rows[v], c_graph_w8);
    }
    setup_par();
    time_calls("8 rank graphs, one thread", c_par_serial);
    time_par_threads("8 rank graphs, 8 threads at once");
    time_calls("cuPointerGetAttribute BUFFER_ID", c_buffer_id);
    time_calls("cuMemGetAddressRange", c_addr_range);
    time_calls("cudaIpcGetMemHandle", c_ipc_handle);
    time_calls("op: eager (ovld today)", op_eager);
    time_calls("op: graph + eager doorbell", op_graph);
    time_calls("op: graph, no host function", op_graph_poll);

    /* GPU time per round trip, us: min and max of 7 rounds, then the median */
    void *dm;
    CK(cudaMalloc(&dm, 4096));
    CUdeviceptr dmem = (CUdeviceptr)(uintptr_t)dm;
    CK(cudaMalloc(&ba, (size_t)BIG * BIG * 2));
    CK(cudaMalloc(&bb, (size_t)BIG * BIG * 2));
    CK(cudaMalloc(&bc, (size_t)BIG * BIG * 2));
    CK(cudaMemset(ba, 0, (size_t)BIG * BIG * 2));
    CK(cudaMemset(bb, 0, (size_t)BIG * BIG * 2));
    time_round_trip("round trip, host page", dpage + 1024, dpage + 2048, NULL);
    time_round_trip("round trip, device memory", dmem + 1024, dmem + 2048, NULL);
    time_round_trip("round trip + small GEMM, host page", dpage + 1024, dpage + 2048, gemm_small);
    time_round_trip("round trip + small GEMM, device", dmem + 1024, dmem + 2048, gemm_small);
    time_round_trip("round trip + 2048^3 GEMM, host page", dpage + 1024, dpage + 2048, gemm_big);
    time_round_trip("round trip + 2048^3 GEMM, device", dmem + 1024, dmem + 2048, gemm_big);
    capture_big();
    time_round_trip("round trip + 2048^3 graph, host page", dpage + 1024, dpage + 2048,
                    gemm_big_graph);
    CK(cudaGraphExecDestroy(g_big));
    CK(cudaFree(ba));
    CK(cudaFree(bb));
    CK(cudaFree(bc));
    CK(cudaFree(dm));

    pthread_t t;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 ||
        pthread_create(&t, NULL, drain_main, NULL) != 0) {
        fprintf(stderr, "issue-lab: socketpair: %s\n", strerror(errno));
        return 1;
    }
    time_host("write 256 B to a unix socket", c_sock_write);
    close(sv[0]);
    pthread_join(t, NULL);
    close(sv[1]);
    if (pthread_create(&t, NULL, pong_main, NULL) != 0)
        return 1;
    time_host("thread ping-pong (2 wake-ups)", c_ping);
    pthread_mutex_lock(&mu);
    turn = 2;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(t, NULL);

    CK(cudaGraphExecDestroy(gexec));
    ovld_lt_destroy(lt);
    CK(cudaFreeHost(page));
    return 0;
}

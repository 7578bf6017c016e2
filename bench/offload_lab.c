/*
 * offload_lab.c: ovl-offload-lab, where the world-1 offload's cost goes,
 * without ovld. Two processes on GPU 0, as ovld and an application are: a
 * client (the parent) owns A, B and C and hands them over as CUDA IPC
 * handles; a server (a child forked before either touches CUDA) runs the
 * GEMM on them with the cuBLASLt call and workspace ovld uses
 * (cuda_gemm.h). Each variant runs `iters` ops back to back, timed with
 * CUDA events between ops on the stream that issues them (the client's for
 * the round trips: the application's view), median per op:
 *
 *   gemm client        the GEMM in the client, on its own memory (ovl-bench's
 *                      "gemm" at world 1: what the application does alone)
 *   gemm server own    the GEMM in the server, on memory it allocated
 *   gemm server ipc    the GEMM in the server, on the client's memory
 *   gemm waited        the same, each after a stream wait that always holds
 *   gemm rung          the same, each followed by ovld's done batch (three
 *                      writes to the host page) and an event, without waits
 *   gemm k-waited      "gemm waited" with the wait done by a one-thread
 *                      kernel that polls the word (offload_lab_kernels.cu)
 *   gemm k-rung        "gemm rung" with the writes done by a one-thread
 *                      kernel after a system-wide fence
 *   round trip         the doorbells alone: the client's stream writes ready
 *                      and waits done (one batch, as libovl), the server's
 *                      waits ready, writes done, its slot and a counter (one
 *                      batch, as ovld) and records an event (ovld's watchdog)
 *   offload            the round trip around the server's GEMM on the
 *                      client's memory: ovl's world-1 op issued call by call,
 *                      without ovld's host side
 *   offload dev        the same with both doorbell words in the server's
 *                      device memory (IPC) instead of a host page
 *   offload k          "offload" with the server's wait and writes by kernels
 *   offload kk         and the client's as well
 *
 * The variants take turns, shape by shape, in `rounds` rounds (each round
 * in another order, so that no variant always follows the same one), each after
 * its own untimed ops for about --settle-ms (the GPU's clock follows its
 * load: bench/README.md, "Settling"); a row gives the median over the
 * rounds of each round's median, its spread, and the median over rounds of
 * the difference to "gemm client" of the same round, in us and as a ratio.
 *
 * Then, with --algos N, the client times the first N algorithms that
 * cuBLASLt's heuristic offers for each shape (the same preferences as
 * cuda_gemm.c, which takes the first) and ovld_lt_gemm itself, taking
 * turns in rounds the same way: how far the heuristic's pick is from the
 * fastest on this GPU. Timing only; the outputs are not compared.
 *
 * Usage: ovl-offload-lab [--shapes MxKxN,...] [--iters N] [--rounds R]
 *                        [--settle-ms T] [--dtype T] [--algos N]
 * Exit 0, 1 on a CUDA or cuBLASLt error, 2 for bad arguments, 77 without a
 * GPU.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "cudrv.h"
#include "demo_cuda.h"
#include "offload_lab_kernels.h"
#include "ovl.h"

#define MAX_SHAPES 8
#define MAX_ITERS  2000
#define MAX_ROUNDS 32
#define MAX_ALGOS  32

enum {
    V_GEMM_CLIENT,
    V_GEMM_OWN,
    V_GEMM_IPC,
    V_GEMM_WAITED,
    V_GEMM_RUNG,
    V_GEMM_KWAITED,
    V_GEMM_KRUNG,
    V_RT,
    V_OFFLOAD,
    V_OFFLOAD_DEV,
    V_OFFLOAD_K,
    V_OFFLOAD_KK,
    NVAR
};

/* How a step is done: not at all, by stream memory operations, or by a
 * one-thread kernel (offload_lab_kernels.h). */
enum { BY_NONE, BY_MEMOP, BY_KERNEL };

/* What each side of a variant enqueues per op. The client: its GEMM
 * (client_gemm), or its doorbell (write ready, wait done) `client` ways,
 * or nothing (BY_NONE: the server times the variant). The server: a wait
 * (for ready, else on a word that always holds), its GEMM on its own
 * memory or the client's, then ovld's done batch and an event. */
static const struct variant {
    const char *name;
    int client;
    bool client_gemm;
    int wait;
    bool wait_ready;
    int gemm; /* 0: none, 1: on its own memory, 2: on the client's */
    int ring;
    bool dev_page; /* the doorbell words in the server's device memory */
} var[NVAR] = {
    [V_GEMM_CLIENT] = {"gemm client", BY_NONE, true, BY_NONE, false, 0, BY_NONE, false},
    [V_GEMM_OWN] = {"gemm server own", BY_NONE, false, BY_NONE, false, 1, BY_NONE, false},
    [V_GEMM_IPC] = {"gemm server ipc", BY_NONE, false, BY_NONE, false, 2, BY_NONE, false},
    [V_GEMM_WAITED] = {"gemm waited", BY_NONE, false, BY_MEMOP, false, 2, BY_NONE, false},
    [V_GEMM_RUNG] = {"gemm rung", BY_NONE, false, BY_NONE, false, 2, BY_MEMOP, false},
    [V_GEMM_KWAITED] = {"gemm k-waited", BY_NONE, false, BY_KERNEL, false, 2, BY_NONE, false},
    [V_GEMM_KRUNG] = {"gemm k-rung", BY_NONE, false, BY_NONE, false, 2, BY_KERNEL, false},
    [V_RT] = {"round trip", BY_MEMOP, false, BY_MEMOP, true, 0, BY_MEMOP, false},
    [V_OFFLOAD] = {"offload", BY_MEMOP, false, BY_MEMOP, true, 2, BY_MEMOP, false},
    [V_OFFLOAD_DEV] = {"offload dev", BY_MEMOP, false, BY_MEMOP, true, 2, BY_MEMOP, true},
    [V_OFFLOAD_K] = {"offload k", BY_MEMOP, false, BY_KERNEL, true, 2, BY_KERNEL, false},
    [V_OFFLOAD_KK] = {"offload kk", BY_KERNEL, false, BY_KERNEL, true, 2, BY_KERNEL, false},
};

typedef struct {
    uint64_t m, k, n;
} shape_t;

static struct {
    shape_t shapes[MAX_SHAPES];
    int nshapes, iters, rounds, settle_ms, algos;
    ovl_dtype_t dtype;
} opt = {.iters = 100, .rounds = 5, .settle_ms = 100, .algos = 8, .dtype = OVL_DTYPE_BF16};

static const char *who = "offload-lab";
static ovl_cudrv_t drv;

#define LAB_WHO who
#include "lab_check.h"
/* a CUDA driver call */
#define DK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS)                                                                    \
            lab_fail(LAB_WHO, #x, __LINE__, ovl_cudrv_strerror(&drv, r_));                         \
    } while (0)
/* a cuBLAS call */
#define LK(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            char why_[32];                                                                         \
            snprintf(why_, sizeof(why_), "cuBLAS status %d", (int)s_);                             \
            lab_fail(LAB_WHO, #x, __LINE__, why_);                                                 \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------ the wire */

/* What the client asks of the server, and the answer. Both ends are this
 * program; a short or failed transfer ends it. */
typedef struct {
    int32_t cmd; /* CMD_* */
    int32_t shape, variant, n;
    uint64_t seq0; /* ops seq0 + 1 .. seq0 + n */
} req_t;

enum { CMD_RUN = 1, CMD_SYNC, CMD_QUIT };

static void xfer(int fd, void *p, size_t len, bool out)
{
    char *c = p;
    while (len) {
        ssize_t r = out ? write(fd, c, len) : read(fd, c, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fprintf(stderr, "%s: the other process is gone (%s)\n", who,
                    r < 0 ? strerror(errno) : "end of stream");
            exit(1);
        }
        c += r;
        len -= (size_t)r;
    }
}
#define SEND(fd, x) xfer((fd), &(x), sizeof(x), true)
#define RECV(fd, x) xfer((fd), &(x), sizeof(x), false)

/* --------------------------------------------------------- the doorbell */

/* Words of the shared host page, and of the server's device page (each on
 * its own 128 bytes). */
enum { W_READY = 0, W_DONE = 16, W_SLOT = 32, W_OWN = 48, W_ZERO = 64, PAGE = 4096 };

static CUdeviceptr word(CUdeviceptr page, int w)
{
    return page + (CUdeviceptr)w * 8;
}

/* The same word, as a kernel takes it. */
static uint64_t *kword(CUdeviceptr page, int w)
{
    return (uint64_t *)(uintptr_t)word(page, w);
}

/* -------------------------------------------------------------- timing */

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of the n per-op times between events e[0..n], in ms. */
static float median_ms(cudaEvent_t *e, int n)
{
    static float t[MAX_ITERS];
    for (int i = 0; i < n; i++)
        CK(cudaEventElapsedTime(&t[i], e[i], e[i + 1]));
    qsort(t, (size_t)n, sizeof(float), cmp_f);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static double median_d(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---------------------------------------------------------- both sides */

typedef struct {
    void *a, *b, *c;    /* the client's buffers (imported, in the server) */
    void *oa, *ob, *oc; /* the server's own copies */
} bufs_t;

static size_t esize(void)
{
    return ovl_dtype_size(opt.dtype);
}

static ovld_gemm_args_t gemm_args(shape_t sh, void *a, void *b, void *c)
{
    return (ovld_gemm_args_t){.dtype = opt.dtype,
                              .rows = sh.m,
                              .n = sh.n,
                              .k = sh.k,
                              .nblocks = 1,
                              .a = {a, sh.k},
                              .b = {b, sh.n},
                              .c = {c, sh.n},
                              .transb = false};
}

static void gemm(ovld_lt_t *lt, cudaStream_t s, void *ws, shape_t sh, void *a, void *b, void *c)
{
    char err[256];
    ovld_gemm_args_t g = gemm_args(sh, a, b, c);
    ovl_status_t st = ovld_lt_gemm(lt, s, ws, OVLD_LT_WORKSPACE, &g, err, sizeof(err));
    if (st != OVL_OK) {
        fprintf(stderr, "%s: ovld_lt_gemm: %s: %s\n", who, ovl_strerror(st), err);
        exit(1);
    }
}

/* ------------------------------------------------------------- server */

/* The variants the server times on its own stream (the client idle). */
static bool server_timed(int v)
{
    return var[v].client == BY_NONE && !var[v].client_gemm;
}

/* The server's part of op seq of variant vr, on stream s: the doorbell
 * words on page pg. */
static void server_op(const struct variant *vr, cudaStream_t s, ovld_lt_t *lt, void *ws, shape_t sh,
                      const bufs_t *b, CUdeviceptr pg, cudaEvent_t watch, uint64_t seq)
{
    int w = vr->wait_ready ? W_READY : W_ZERO; /* W_ZERO is never written: >= 0 holds */
    uint64_t v = vr->wait_ready ? seq : 0;
    if (vr->wait == BY_MEMOP)
        DK(drv.stream_wait_value64((CUstream)s, word(pg, w), v, CU_STREAM_WAIT_VALUE_GEQ));
    else if (vr->wait == BY_KERNEL)
        CK(lab_launch_wait(s, kword(pg, w), v));
    if (vr->gemm == 1)
        gemm(lt, s, ws, sh, b->oa, b->ob, b->oc);
    else if (vr->gemm == 2)
        gemm(lt, s, ws, sh, b->a, b->b, b->c);
    if (vr->ring == BY_MEMOP) {
        CUstreamBatchMemOpParams op[3] = {
            ovl_cudrv_op_write(word(pg, W_SLOT), seq, true),
            ovl_cudrv_op_write(word(pg, W_DONE), seq, true),
            ovl_cudrv_op_write(word(pg, W_OWN), seq, true),
        };
        DK(drv.stream_batch_mem_op((CUstream)s, 3, op, 0));
    } else if (vr->ring == BY_KERNEL) {
        CK(lab_launch_write3(s, kword(pg, W_SLOT), kword(pg, W_DONE), kword(pg, W_OWN), seq));
    }
    if (vr->ring != BY_NONE)
        CK(cudaEventRecord(watch, s));
}

static void server(int fd, volatile uint64_t *hpage)
{
    who = "offload-lab server";
    char why[256];
    if (ovl_cudrv_load(&drv, why, sizeof(why)) != 0) {
        fprintf(stderr, "%s: %s\n", who, why);
        exit(1);
    }
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ovld_lt_t *lt = NULL;
    if (ovld_lt_create(&lt, why, sizeof(why)) != OVL_OK) {
        fprintf(stderr, "%s: ovld_lt_create: %s\n", who, why);
        exit(1);
    }
    void *ws;
    CK(cudaMalloc(&ws, OVLD_LT_WORKSPACE));
    CK(cudaHostRegister((void *)hpage, PAGE, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void *hdev;
    CK(cudaHostGetDevicePointer(&hdev, (void *)hpage, 0));
    CUdeviceptr hdev_w = (CUdeviceptr)(uintptr_t)hdev;
    void *dpage;
    CK(cudaMalloc(&dpage, PAGE));
    CK(cudaMemset(dpage, 0, PAGE));
    cudaIpcMemHandle_t dh;
    CK(cudaIpcGetMemHandle(&dh, dpage));
    SEND(fd, dh);

    static bufs_t bufs[MAX_SHAPES];
    for (int i = 0; i < opt.nshapes; i++) {
        shape_t sh = opt.shapes[i];
        cudaIpcMemHandle_t h[3];
        RECV(fd, h);
        CK(cudaIpcOpenMemHandle(&bufs[i].a, h[0], cudaIpcMemLazyEnablePeerAccess));
        CK(cudaIpcOpenMemHandle(&bufs[i].b, h[1], cudaIpcMemLazyEnablePeerAccess));
        CK(cudaIpcOpenMemHandle(&bufs[i].c, h[2], cudaIpcMemLazyEnablePeerAccess));
        size_t la = sh.m * sh.k * esize(), lb = sh.k * sh.n * esize(), lc = sh.m * sh.n * esize();
        CK(cudaMalloc(&bufs[i].oa, la));
        CK(cudaMalloc(&bufs[i].ob, lb));
        CK(cudaMalloc(&bufs[i].oc, lc));
        CK(cudaMemcpy(bufs[i].oa, bufs[i].a, la, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(bufs[i].ob, bufs[i].b, lb, cudaMemcpyDeviceToDevice));
    }
    static cudaEvent_t ev[MAX_ITERS + 1];
    for (int i = 0; i <= opt.iters; i++)
        CK(cudaEventCreate(&ev[i]));
    cudaEvent_t watch; /* ovld's per-op event, recorded after the done batch */
    CK(cudaEventCreateWithFlags(&watch, cudaEventDisableTiming));
    int32_t ok = 1;
    SEND(fd, ok);

    for (;;) {
        req_t q;
        RECV(fd, q);
        if (q.cmd == CMD_QUIT)
            break;
        if (q.cmd == CMD_SYNC) {
            CK(cudaStreamSynchronize(s));
            float ms = q.n > 0 ? median_ms(ev, q.n) : 0;
            SEND(fd, ms);
            continue;
        }
        shape_t sh = opt.shapes[q.shape];
        bufs_t *b = &bufs[q.shape];
        bool timed = q.n <= opt.iters && server_timed(q.variant);
        CUdeviceptr pg = var[q.variant].dev_page ? (CUdeviceptr)(uintptr_t)dpage : hdev_w;
        /* Answered before enqueueing: with long runs both processes' queues
         * fill, and each side's ops must be coming while the other's wait. */
        SEND(fd, ok);
        for (int i = 0; i < q.n; i++) {
            uint64_t seq = q.seq0 + 1 + (uint64_t)i;
            if (timed)
                CK(cudaEventRecord(ev[i], s));
            server_op(&var[q.variant], s, lt, ws, sh, b, pg, watch, seq);
        }
        if (timed)
            CK(cudaEventRecord(ev[q.n], s));
    }
    (void)hpage;
    exit(0);
}

/* ------------------------------------------------------------- client */

static int sfd;
static uint64_t seq_next;
static cudaStream_t cs;
static ovld_lt_t *clt;
static void *cws;
static cudaEvent_t cev[MAX_ITERS + 1];
static void *ca[MAX_SHAPES], *cb[MAX_SHAPES], *cc[MAX_SHAPES];
static CUdeviceptr chpage, cdpage;

/* Runs n ops of variant v on shape si; the per-op median in ms when timed
 * (n <= iters), else 0. */
static float run(int si, int v, int n)
{
    bool timed = n <= opt.iters;
    shape_t sh = opt.shapes[si];
    req_t q = {.cmd = CMD_RUN, .shape = si, .variant = v, .n = n, .seq0 = seq_next};
    seq_next += (uint64_t)n;
    bool server_works = !var[v].client_gemm; /* the client's GEMM alone needs no server */
    if (server_works) {
        SEND(sfd, q);
        int32_t ok;
        RECV(sfd, ok);
    }
    bool client_timed = !server_timed(v);
    CUdeviceptr pg = var[v].dev_page ? cdpage : chpage;
    for (int i = 0; i < n && client_timed; i++) {
        uint64_t seq = q.seq0 + 1 + (uint64_t)i;
        if (timed)
            CK(cudaEventRecord(cev[i], cs));
        if (var[v].client_gemm) {
            gemm(clt, cs, cws, sh, ca[si], cb[si], cc[si]);
            continue;
        }
        if (var[v].client == BY_KERNEL) {
            uint64_t *r = kword(pg, W_READY);
            CK(lab_launch_write3(cs, r, r, r, seq));
            CK(lab_launch_wait(cs, kword(pg, W_DONE), seq));
            continue;
        }
        CUstreamBatchMemOpParams w[2] = {
            ovl_cudrv_op_write(word(pg, W_READY), seq, true),
            ovl_cudrv_op_wait_geq(word(pg, W_DONE), seq),
        };
        DK(drv.stream_batch_mem_op((CUstream)cs, 2, w, 0));
    }
    if (timed && client_timed)
        CK(cudaEventRecord(cev[n], cs));
    CK(cudaStreamSynchronize(cs));
    float ms = 0;
    if (server_works) {
        req_t y = {.cmd = CMD_SYNC, .n = timed && !client_timed ? n : 0};
        SEND(sfd, y);
        RECV(sfd, ms);
    }
    if (timed && client_timed)
        ms = median_ms(cev, n);
    return ms;
}

/* The untimed ops before a measurement: about settle_ms of them. */
static int settle_ops(double op_ms)
{
    double n = op_ms > 0 ? ceil(opt.settle_ms / op_ms) : 10;
    if (n < 5)
        n = 5;
    return n > 20000 ? 20000 : (int)n;
}

static cudaDataType_t lt_type(void)
{
    return opt.dtype == OVL_DTYPE_FP32   ? CUDA_R_32F
           : opt.dtype == OVL_DTYPE_FP16 ? CUDA_R_16F
                                         : CUDA_R_16BF;
}

/* One shape's candidates: cuda_gemm.c's descriptors for a dense row-major
 * A @ B (cuBLASLt's A is our B, its B our A) and the heuristic's first
 * `algos` algorithms that fit the workspace. */
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo[MAX_ALGOS];
    int idx[MAX_ALGOS]; /* each one's place in the heuristic's list */
    int n;
} cands_t;

static void cands_make(cublasLtHandle_t h, int si, cands_t *c)
{
    shape_t sh = opt.shapes[si];
    cudaDataType_t dt = lt_type();
    LK(cublasLtMatmulDescCreate(&c->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LK(cublasLtMatrixLayoutCreate(&c->la, dt, sh.n, sh.k, (int64_t)sh.n));
    LK(cublasLtMatrixLayoutCreate(&c->lb, dt, sh.k, sh.m, (int64_t)sh.k));
    LK(cublasLtMatrixLayoutCreate(&c->lc, dt, sh.n, sh.m, (int64_t)sh.n));
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = OVLD_LT_WORKSPACE;
    uint32_t al = 256;
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                            sizeof al));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                            sizeof al));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                            sizeof al));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                            sizeof al));
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int nres = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(h, c->desc, c->la, c->lb, c->lc, c->lc, pref, opt.algos, res,
                                      &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    c->n = 0;
    for (int i = 0; i < nres && i < MAX_ALGOS; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= OVLD_LT_WORKSPACE) {
            c->algo[c->n] = res[i].algo;
            c->idx[c->n++] = i;
        }
}

/* n ops of candidate j of shape si (j == c->n: ovld_lt_gemm, ovld's own
 * call); the median per op in ms when timed (n <= iters), -1 if cuBLASLt
 * refused to run it. */
static float cand_run(cublasLtHandle_t h, const cands_t *c, int si, int j, int n)
{
    bool timed = n <= opt.iters;
    float alpha = 1, beta = 0;
    for (int i = 0; i < n; i++) {
        if (timed)
            CK(cudaEventRecord(cev[i], cs));
        if (j == c->n) {
            gemm(clt, cs, cws, opt.shapes[si], ca[si], cb[si], cc[si]);
            continue;
        }
        cublasStatus_t st =
            cublasLtMatmul(h, c->desc, &alpha, cb[si], c->la, ca[si], c->lb, &beta, cc[si], c->lc,
                           cc[si], c->lc, &c->algo[j], cws, OVLD_LT_WORKSPACE, cs);
        if (st != CUBLAS_STATUS_SUCCESS) {
            CK(cudaStreamSynchronize(cs));
            return -1;
        }
    }
    if (timed)
        CK(cudaEventRecord(cev[n], cs));
    CK(cudaStreamSynchronize(cs));
    return timed ? median_ms(cev, n) : 0;
}

/* Every shape's candidates and ovld's own call, taking turns in rounds as
 * the variants do; per candidate the median over rounds of its time and of
 * its ratio to the heuristic's first in the same round. */
static void survey(const double *est)
{
    cublasLtHandle_t h;
    LK(cublasLtCreate(&h));
    static cands_t c[MAX_SHAPES];
    static double t[MAX_ROUNDS][MAX_SHAPES][MAX_ALGOS + 1];
    for (int si = 0; si < opt.nshapes; si++)
        cands_make(h, si, &c[si]);
    for (int r = 0; r < opt.rounds; r++)
        for (int si = 0; si < opt.nshapes; si++)
            for (int j0 = 0; j0 <= c[si].n; j0++) {
                int j = (j0 + r) % (c[si].n + 1);
                if (cand_run(h, &c[si], si, j, settle_ops(est[si])) < 0)
                    t[r][si][j] = -1;
                else
                    t[r][si][j] = cand_run(h, &c[si], si, j, opt.iters);
            }
    printf("\ncuBLASLt's first %d algorithms for each shape, in the client, taking turns in %d "
           "rounds (median ms of %d ops after about %d ms of their own; median over rounds)\n",
           opt.algos, opt.rounds, opt.iters, opt.settle_ms);
    for (int si = 0; si < opt.nshapes; si++) {
        shape_t sh = opt.shapes[si];
        printf("  %" PRIu64 "x%" PRIu64 "x%" PRIu64 ": %d fit the workspace\n", sh.m, sh.k, sh.n,
               c[si].n);
        for (int j = 0; j <= c[si].n; j++) {
            double m[MAX_ROUNDS], x[MAX_ROUNDS];
            int ok = 0;
            for (int r = 0; r < opt.rounds; r++)
                if (t[r][si][j] > 0 && c[si].n > 0 && t[r][si][0] > 0) {
                    m[ok] = t[r][si][j];
                    x[ok++] = t[r][si][j] / t[r][si][0];
                }
            if (j == c[si].n)
                printf("    ovld_lt_gemm (ovld's call)");
            else
                printf("    heuristic #%-2d            ", c[si].idx[j]);
            if (ok == 0)
                printf("  refused\n");
            else
                printf("  %.4f ms  %.3fx #0\n", median_d(m, ok), median_d(x, ok));
        }
        cublasLtMatrixLayoutDestroy(c[si].la);
        cublasLtMatrixLayoutDestroy(c[si].lb);
        cublasLtMatrixLayoutDestroy(c[si].lc);
        cublasLtMatmulDescDestroy(c[si].desc);
    }
    cublasLtDestroy(h);
}

static int client(int fd, volatile uint64_t *hpage)
{
    sfd = fd;
    char why[256];
    if (ovl_cudrv_load(&drv, why, sizeof(why)) != 0) {
        fprintf(stderr, "%s: %s\n", who, why);
        return 1;
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    if (ovld_lt_create(&clt, why, sizeof(why)) != OVL_OK) {
        fprintf(stderr, "%s: ovld_lt_create: %s\n", who, why);
        return 1;
    }
    CK(cudaMalloc(&cws, OVLD_LT_WORKSPACE));
    CK(cudaHostRegister((void *)hpage, PAGE, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void *hdev, *dp;
    CK(cudaHostGetDevicePointer(&hdev, (void *)hpage, 0));
    chpage = (CUdeviceptr)(uintptr_t)hdev;
    cudaIpcMemHandle_t dh;
    RECV(fd, dh);
    CK(cudaIpcOpenMemHandle(&dp, dh, cudaIpcMemLazyEnablePeerAccess));
    cdpage = (CUdeviceptr)(uintptr_t)dp;
    for (int i = 0; i < opt.nshapes; i++) {
        shape_t sh = opt.shapes[i];
        CK(cudaMalloc(&ca[i], sh.m * sh.k * esize()));
        CK(cudaMalloc(&cb[i], sh.k * sh.n * esize()));
        CK(cudaMalloc(&cc[i], sh.m * sh.n * esize()));
        CK(ovl_demo_fill(opt.dtype, ca[i], sh.m, sh.k, sh.k, 1234, 0, 0, cs));
        CK(ovl_demo_fill(opt.dtype, cb[i], sh.k, sh.n, sh.n, 1234, 0, 1, cs));
        CK(cudaStreamSynchronize(cs));
        cudaIpcMemHandle_t h[3];
        CK(cudaIpcGetMemHandle(&h[0], ca[i]));
        CK(cudaIpcGetMemHandle(&h[1], cb[i]));
        CK(cudaIpcGetMemHandle(&h[2], cc[i]));
        SEND(fd, h);
    }
    for (int i = 0; i <= opt.iters; i++)
        CK(cudaEventCreate(&cev[i]));
    int32_t ok;
    RECV(fd, ok);

    int dev = 0;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("ovl-offload-lab: %s, %s, %d shape%s x %d variants, %d rounds, %d ops timed (median), "
           "settle %d ms\n",
           prop.name, ovl_dtype_name(opt.dtype), opt.nshapes, opt.nshapes == 1 ? "" : "s", NVAR,
           opt.rounds, opt.iters, opt.settle_ms);

    /* A first look at each shape's GEMM, for the settling counts. */
    static double est[MAX_SHAPES];
    for (int si = 0; si < opt.nshapes; si++) {
        run(si, V_GEMM_CLIENT, 10);
        est[si] = run(si, V_GEMM_CLIENT, opt.iters < 20 ? opt.iters : 20);
    }
    static double med[MAX_ROUNDS][MAX_SHAPES][NVAR];
    for (int r = 0; r < opt.rounds; r++)
        for (int si = 0; si < opt.nshapes; si++)
            for (int v0 = 0; v0 < NVAR; v0++) {
                int v = (v0 + r) % NVAR; /* each round in another order */
                double op = v == V_RT ? 0.01 : est[si];
                run(si, v, settle_ops(op));
                med[r][si][v] = run(si, v, opt.iters);
            }

    for (int si = 0; si < opt.nshapes; si++) {
        shape_t sh = opt.shapes[si];
        printf("\n%" PRIu64 "x%" PRIu64 "x%" PRIu64 " (MxKxN)   median ms [min, max] over rounds"
               "   minus gemm client, us   x gemm client\n",
               sh.m, sh.k, sh.n);
        for (int v = 0; v < NVAR; v++) {
            double m[MAX_ROUNDS], d[MAX_ROUNDS], x[MAX_ROUNDS], lo = INFINITY, hi = 0;
            for (int r = 0; r < opt.rounds; r++) {
                m[r] = med[r][si][v];
                d[r] = (med[r][si][v] - med[r][si][V_GEMM_CLIENT]) * 1000;
                x[r] = med[r][si][v] / med[r][si][V_GEMM_CLIENT];
                lo = m[r] < lo ? m[r] : lo;
                hi = m[r] > hi ? m[r] : hi;
            }
            printf("  %-16s %8.4f [%.4f, %.4f]   %+7.1f   %6.3fx\n", var[v].name,
                   median_d(m, opt.rounds), lo, hi, median_d(d, opt.rounds),
                   median_d(x, opt.rounds));
        }
    }
    req_t q = {.cmd = CMD_QUIT};
    SEND(fd, q);

    if (opt.algos > 0)
        survey(est);
    return 0;
}

/* --------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ovl-offload-lab [OPTION]...\n"
            "Where the world-1 offload's time goes: the GEMM in the client, in a second\n"
            "process on its own and on the client's memory (CUDA IPC), the doorbells'\n"
            "round trip alone and around that GEMM (host page, device memory); then\n"
            "the times of cuBLASLt's first algorithms for each shape. GPU 0, without\n"
            "ovld (run it under MPS, as ovld runs).\n"
            "  --shapes LIST    MxKxN,... (default 4096x4096x4096,65536x1024x1024,\n"
            "                   2048x8192x8192,8192x8192x8192; up to %d)\n"
            "  --iters N        ops timed per measurement, median (default 100; 5..%d)\n"
            "  --rounds R       rounds of every variant (default 5; 1..%d)\n"
            "  --settle-ms T    untimed ops first, about T ms (default 100; 0..10000)\n"
            "  --dtype T        bf16, fp16 or fp32 (default bf16)\n"
            "  --algos N        cuBLASLt algorithms to time per shape (default 8; 0..%d,\n"
            "                   0: none)\n"
            "  -h, --help       this help\n"
            "Exit 0, 1 on a CUDA or cuBLASLt error, 2 for bad arguments, 77 without a GPU.\n",
            MAX_SHAPES, MAX_ITERS, MAX_ROUNDS, MAX_ALGOS);
}

static bool parse_int(const char *s, long lo, long hi, int *ret)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *ret = (int)v;
    return true;
}

static bool parse_shapes(const char *s)
{
    opt.nshapes = 0;
    while (*s) {
        unsigned long long m, k, n;
        int used = 0;
        if (opt.nshapes == MAX_SHAPES || sscanf(s, "%llux%llux%llu%n", &m, &k, &n, &used) != 3 ||
            m == 0 || k == 0 || n == 0 || m > (1u << 20) || k > (1u << 20) || n > (1u << 20) ||
            m * k > (1ull << 31) || k * n > (1ull << 31) || m * n > (1ull << 31))
            return false;
        opt.shapes[opt.nshapes++] = (shape_t){m, k, n};
        s += used;
        if (*s == ',')
            s++;
        else if (*s)
            return false;
    }
    return opt.nshapes > 0;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"shapes", required_argument, NULL, 's'}, {"iters", required_argument, NULL, 'i'},
        {"rounds", required_argument, NULL, 'r'}, {"settle-ms", required_argument, NULL, 't'},
        {"dtype", required_argument, NULL, 'd'},  {"algos", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    parse_shapes("4096x4096x4096,65536x1024x1024,2048x8192x8192,8192x8192x8192");
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        bool good = true;
        switch (c) {
        case 's':
            good = parse_shapes(optarg);
            break;
        case 'i':
            good = parse_int(optarg, 5, MAX_ITERS, &opt.iters);
            break;
        case 'r':
            good = parse_int(optarg, 1, MAX_ROUNDS, &opt.rounds);
            break;
        case 't':
            good = parse_int(optarg, 0, 10000, &opt.settle_ms);
            break;
        case 'd':
            good = ovl_dtype_parse(optarg, &opt.dtype) == OVL_OK;
            break;
        case 'a':
            good = parse_int(optarg, 0, MAX_ALGOS, &opt.algos);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!good) {
            fprintf(stderr, "ovl-offload-lab: --%s '%s': bad value (see --help)\n",
                    c == 's'   ? "shapes"
                    : c == 'i' ? "iters"
                    : c == 'r' ? "rounds"
                    : c == 't' ? "settle-ms"
                    : c == 'd' ? "dtype"
                               : "algos",
                    optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ovl-offload-lab: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    /* Both processes are forked from here before either touches CUDA (a
     * child of a process that did cannot use it); the probe is a child too. */
    pid_t probe = fork();
    if (probe == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 77);
    }
    int pst = 0;
    if (probe < 0 || waitpid(probe, &pst, 0) != probe || !WIFEXITED(pst)) {
        fprintf(stderr, "ovl-offload-lab: the GPU probe failed\n");
        return 1;
    }
    if (WEXITSTATUS(pst) == 77) {
        printf("ovl-offload-lab: no GPU, nothing to measure\n");
        return 77;
    }
    volatile uint64_t *hpage =
        mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int sv[2];
    if (hpage == MAP_FAILED || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        fprintf(stderr, "ovl-offload-lab: mmap or socketpair: %s\n", strerror(errno));
        return 1;
    }
    pid_t srv = fork();
    if (srv < 0) {
        fprintf(stderr, "ovl-offload-lab: fork: %s\n", strerror(errno));
        return 1;
    }
    if (srv == 0) {
        close(sv[0]);
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(1);
        server(sv[1], hpage);
        _exit(0);
    }
    close(sv[1]);
    signal(SIGPIPE, SIG_IGN);
    int rc = client(sv[0], hpage);
    close(sv[0]);
    int st = 0;
    if (waitpid(srv, &st, 0) != srv || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "ovl-offload-lab: the server process failed\n");
        rc = 1;
    }
    return rc;
}

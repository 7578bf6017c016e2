/*
 * ring_lab.c: ovl-ring-lab, ring schedules of world 2 in one process on two
 * GPUs, without ovld: what the GPUs allow, apart from ovld's per-op cost.
 *
 * For each shape M x K x N (M the gathered rows, m = M/2 per GPU) it times,
 * as ovl-bench does (back-to-back iterations, a CUDA event after each on the
 * GPU's main stream, the median, the maximum over the two GPUs):
 *
 *   gemm   one cuBLASLt GEMM of all M rows (the same wrapper ovld uses);
 *   pull   the copy engine pulling the peer's shard (one copy; and split in
 *          two copies on two streams);
 *   ring   ovld's ring schedule as daemon/plan/plan.c emits it for world 2, with
 *          its cross-GPU order (each iteration starts after the peer's
 *          previous one; its end waits for the peer's pulls): the own
 *          shard's GEMMs on one GEMM stream while the copy stream pulls the
 *          peer's shard in c chunks, each chunk's GEMM after its pull; and
 *          variants of it:
 *            cur       own shard in c GEMMs, the peer's chunk GEMMs on
 *                      alternating GEMM streams (ovld's ring);
 *            own1-alt  own shard in one GEMM, chunks alternating;
 *            own1-one  own shard in one GEMM, every GEMM on one stream;
 *            cur-one   own shard in c GEMMs, every GEMM on one stream;
 *          each with one copy stream, then with the chunks' pulls on two.
 *
 * Ratios are to the floor max(gemm, pull). The data are ovl-bench's random
 * data (ovl_demo_fill, the same seed): a GEMM's time depends on its data
 * (constant data made 16384x8192x2048 20% faster). docs/performance.md
 * reads it.
 *
 * Usage: ovl-ring-lab [MxKxN ...]   (M a multiple of 32; default 65536x1024x1024
 * 16384x8192x2048 4096x4096x4096). Exit 0, 1 on a CUDA or cuBLASLt error,
 * 2 for bad arguments, 77 with fewer than two GPUs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "demo_cuda.h"
#define LAB_WHO "ovl-ring-lab"
#include "lab_check.h"

#define SEED 0x6f766c62656e6368ull /* ovl-bench's */

#define NR    4
#define MAXC  16
#define ITERS 60
#define WARM  10

typedef struct {
    int dev;
    cudaStream_t main, copy, copy2, g[2];
    ovld_lt_t *lt;
    void *ws[3];
    void *a, *gb, *b, *c;
    cudaEvent_t start[NR], rel[NR], rel2[NR], done[NR], ev[MAXC], j0, j1, c2;
    cudaEvent_t t[ITERS + 1];
} gpu_t;

static gpu_t G[2];
static size_t M, K, N, m;
static int ncopy = 1;

static void gemm(gpu_t *g, int si, void *a, size_t row0, size_t rows, size_t crow0)
{
    char err[256];
    ovld_gemm_args_t x = {.dtype = OVL_DTYPE_BF16,
                          .rows = rows,
                          .n = N,
                          .k = K,
                          .nblocks = 1,
                          .a = {(char *)a + row0 * K * 2, K},
                          .b = {g->b, N},
                          .c = {(char *)g->c + crow0 * N * 2, N}};
    cudaStream_t s = si < 0 ? g->main : g->g[si];
    void *ws = si < 0 ? g->ws[2] : g->ws[si];
    if (ovld_lt_gemm(g->lt, s, ws, OVLD_LT_WORKSPACE, &x, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "ovl-ring-lab: GEMM of %zu rows: %s\n", rows, err);
        exit(1);
    }
}

/* One ring iteration on both GPUs: the own shard in oc GEMMs, the peer's in
 * rc chunks; mode 0: GEMMs alternate between the two GEMM streams (as
 * ovld's ring), 1: all on one. slot >= 0: the timing event to record. */
static void iter(int i, int oc, int rc, int mode, int slot)
{
    int r = i % NR, pr = (i + NR - 1) % NR;
    for (int d = 0; d < 2; d++) {
        gpu_t *g = &G[d], *p = &G[1 - d];
        CK(cudaSetDevice(g->dev));
        if (i > 0)
            CK(cudaStreamWaitEvent(g->main, p->done[pr], 0)); /* mimic the doorbell order */
        CK(cudaEventRecord(g->start[r], g->main));
    }
    for (int d = 0; d < 2; d++) {
        gpu_t *g = &G[d], *p = &G[1 - d];
        CK(cudaSetDevice(g->dev));
        CK(cudaStreamWaitEvent(g->copy, g->start[r], 0));
        CK(cudaStreamWaitEvent(g->copy2, g->start[r], 0));
        CK(cudaStreamWaitEvent(g->g[0], g->start[r], 0));
        CK(cudaStreamWaitEvent(g->g[1], g->start[r], 0));
        int gemms = 0;
        size_t cr = (m + oc - 1) / oc;
        for (int j = 0; j < oc; j++, gemms++) {
            size_t r0 = j * cr, rows = r0 + cr > m ? m - r0 : cr;
            gemm(g, 0, g->a, r0, rows, d * m + r0);
        }
        CK(cudaStreamWaitEvent(g->copy, p->start[r], 0));
        CK(cudaStreamWaitEvent(g->copy2, p->start[r], 0));
        size_t rcr = (m + rc - 1) / rc;
        for (int j = 0; j < rc; j++, gemms++) {
            size_t r0 = j * rcr, rows = r0 + rcr > m ? m - r0 : rcr;
            int pd = 1 - d;
            cudaStream_t cs = ncopy == 2 && j % 2 ? g->copy2 : g->copy;
            CK(cudaMemcpyAsync((char *)g->gb + (pd * m + r0) * K * 2, (char *)p->a + r0 * K * 2,
                               rows * K * 2, cudaMemcpyDefault, cs));
            CK(cudaEventRecord(g->ev[j], cs));
            int s = mode == 1 ? 0 : gemms % 2;
            CK(cudaStreamWaitEvent(g->g[s], g->ev[j], 0));
            gemm(g, s, g->gb, pd * m + r0, rows, pd * m + r0);
        }
        CK(cudaEventRecord(g->rel2[r], g->copy2));
        CK(cudaStreamWaitEvent(g->copy, g->rel2[r], 0));
        CK(cudaEventRecord(g->rel[r], g->copy));
        CK(cudaEventRecord(g->j0, g->g[0]));
        CK(cudaEventRecord(g->j1, g->g[1]));
        CK(cudaStreamWaitEvent(g->main, g->j0, 0));
        CK(cudaStreamWaitEvent(g->main, g->j1, 0));
        CK(cudaStreamWaitEvent(g->main, g->rel[r], 0));
    }
    for (int d = 0; d < 2; d++) {
        gpu_t *g = &G[d], *p = &G[1 - d];
        CK(cudaSetDevice(g->dev));
        CK(cudaStreamWaitEvent(g->main, p->rel[r], 0));
        CK(cudaEventRecord(g->done[r], g->main));
        if (slot >= 0)
            CK(cudaEventRecord(g->t[slot], g->main));
    }
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double measure(void (*fn)(int, int, int, int, int), int oc, int rc, int mode)
{
    for (int i = 0; i < WARM; i++)
        fn(i, oc, rc, mode, -1);
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(G[d].dev));
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(G[d].t[0], G[d].main));
    }
    for (int i = 0; i < ITERS; i++)
        fn(WARM + i, oc, rc, mode, i + 1);
    double worst = 0;
    for (int d = 0; d < 2; d++) {
        float ts[ITERS];
        CK(cudaSetDevice(G[d].dev));
        CK(cudaDeviceSynchronize());
        for (int i = 0; i < ITERS; i++)
            CK(cudaEventElapsedTime(&ts[i], G[d].t[i], G[d].t[i + 1]));
        qsort(ts, ITERS, sizeof(float), cmpf);
        worst = fmax(worst, ts[ITERS / 2]);
    }
    return worst;
}

/* the floor's parts: one full GEMM on main; ce pull alone */
static void full_gemm(int i, int oc, int rc, int mode, int slot)
{
    (void)i, (void)oc, (void)rc, (void)mode;
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(G[d].dev));
        gemm(&G[d], -1, G[d].gb, 0, M, 0);
        if (slot >= 0)
            CK(cudaEventRecord(G[d].t[slot], G[d].main));
    }
}

static void pull_only(int i, int oc, int rc, int mode, int slot)
{
    (void)i, (void)oc, (void)rc, (void)mode;
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(G[d].dev));
        int pd = 1 - d;
        if (ncopy == 1) {
            CK(cudaMemcpyAsync((char *)G[d].gb + pd * m * K * 2, G[pd].a, m * K * 2,
                               cudaMemcpyDefault, G[d].main));
        } else {
            size_t h = m / 2 * K * 2;
            CK(cudaEventRecord(G[d].c2, G[d].main));
            CK(cudaStreamWaitEvent(G[d].copy2, G[d].c2, 0));
            CK(cudaMemcpyAsync((char *)G[d].gb + pd * m * K * 2, G[pd].a, h, cudaMemcpyDefault,
                               G[d].main));
            CK(cudaMemcpyAsync((char *)G[d].gb + pd * m * K * 2 + h, (char *)G[pd].a + h, h,
                               cudaMemcpyDefault, G[d].copy2));
            CK(cudaEventRecord(G[d].c2, G[d].copy2));
            CK(cudaStreamWaitEvent(G[d].main, G[d].c2, 0));
        }
        if (slot >= 0)
            CK(cudaEventRecord(G[d].t[slot], G[d].main));
    }
}

int main(int argc, char **argv)
{
    const char *defaults[] = {"65536x1024x1024", "16384x8192x2048", "4096x4096x4096"};
    const char **shapes = defaults;
    int nsh = 3, ngpu = 0;
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf(
            "Usage: ovl-ring-lab [MxKxN ...]\n"
            "Times ovld's ring schedule of world 2 and variants of it in one process on\n"
            "two GPUs (no ovld), against max(GEMM, copy-engine pull). M is the gathered\n"
            "rows, a multiple of 32. Default: 65536x1024x1024 16384x8192x2048 4096x4096x4096.\n");
        return 0;
    }
    if (argc > 1) {
        shapes = (const char **)(argv + 1);
        nsh = argc - 1;
    }
    for (int si = 0; si < nsh; si++) {
        size_t a, b, c;
        int used = 0;
        if (sscanf(shapes[si], "%zux%zux%zu%n", &a, &b, &c, &used) != 3 || shapes[si][used] ||
            a == 0 || a % 32 || b == 0 || c == 0) {
            fprintf(
                stderr,
                "ovl-ring-lab: bad shape '%s' (MxKxN, M a multiple of 32: 16 chunks per shard)\n",
                shapes[si]);
            return 2;
        }
    }
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
        printf("ovl-ring-lab: needs two GPUs (%d here)\n", ngpu);
        return 77;
    }
    for (int d = 0; d < 2; d++) {
        gpu_t *g = &G[d];
        char err[256];
        g->dev = d;
        CK(cudaSetDevice(d));
        cudaError_t pe = cudaDeviceEnablePeerAccess(1 - d, 0);
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled)
            CK(pe);
        (void)cudaGetLastError();
        CK(cudaStreamCreateWithFlags(&g->main, cudaStreamNonBlocking));
        int lo, hi;
        CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        CK(cudaStreamCreateWithPriority(&g->copy, cudaStreamNonBlocking, hi));
        CK(cudaStreamCreateWithPriority(&g->copy2, cudaStreamNonBlocking, hi));
        CK(cudaEventCreateWithFlags(&g->c2, cudaEventDisableTiming));
        CK(cudaStreamCreateWithFlags(&g->g[0], cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&g->g[1], cudaStreamNonBlocking));
        if (ovld_lt_create(&g->lt, err, sizeof(err)) != OVL_OK) {
            fprintf(stderr, "ovl-ring-lab: cuBLASLt: %s\n", err);
            return 1;
        }
        for (int w = 0; w < 3; w++)
            CK(cudaMalloc(&g->ws[w], OVLD_LT_WORKSPACE));
        for (int r = 0; r < NR; r++) {
            CK(cudaEventCreateWithFlags(&g->start[r], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->rel[r], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->rel2[r], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->done[r], cudaEventDisableTiming));
        }
        for (int j = 0; j < MAXC; j++)
            CK(cudaEventCreateWithFlags(&g->ev[j], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&g->j0, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&g->j1, cudaEventDisableTiming));
        for (int i = 0; i <= ITERS; i++)
            CK(cudaEventCreate(&g->t[i]));
    }
    for (int si = 0; si < nsh; si++) {
        sscanf(shapes[si], "%zux%zux%zu", &M, &K, &N);
        m = M / 2;
        for (int d = 0; d < 2; d++) {
            gpu_t *g = &G[d];
            CK(cudaSetDevice(d));
            CK(cudaMalloc(&g->a, m * K * 2));
            CK(cudaMalloc(&g->gb, M * K * 2));
            CK(cudaMalloc(&g->b, K * N * 2));
            CK(cudaMalloc(&g->c, M * N * 2));
            /* ovl-bench's random data: GEMM times depend on them */
            CK(ovl_demo_fill(OVL_DTYPE_BF16, g->a, m, K, K, SEED, d, 0, g->main));
            CK(ovl_demo_fill(OVL_DTYPE_BF16, g->b, K, N, N, SEED, d, 1, g->main));
            for (int r = 0; r < 2; r++) /* G as gathered: both shards */
                CK(ovl_demo_fill(OVL_DTYPE_BF16, (char *)g->gb + (size_t)r * m * K * 2, m, K, K,
                                 SEED, r, 0, g->main));
            CK(cudaStreamSynchronize(g->main));
        }
        ncopy = 1;
        double fg = measure(full_gemm, 0, 0, 0), pl = measure(pull_only, 0, 0, 0);
        ncopy = 2;
        double pl2 = measure(pull_only, 0, 0, 0);
        printf("%s: gemm %.3f pull %.3f pull on 2 copy streams %.3f floor %.3f\n", shapes[si], fg,
               pl, pl2, fmax(fg, pl));
        const int cs[] = {1, 2, 4, 8, 16};
        for (int ci = 0; ci < 10; ci++) {
            ncopy = ci < 5 ? 1 : 2;
            if (ci == 5)
                printf(" two copy streams (chunks alternate):\n");
            int c = cs[ci % 5];
            double p0 = measure(iter, c, c, 0), p1 = measure(iter, 1, c, 0),
                   p2 = measure(iter, 1, c, 1), p3 = measure(iter, c, c, 1);
            printf("  c=%d  cur %.3f (%.2fx)  own1-alt %.3f (%.2fx)  own1-one %.3f (%.2fx)  "
                   "cur-one %.3f (%.2fx)\n",
                   c, p0, p0 / fmax(fg, pl), p1, p1 / fmax(fg, pl), p2, p2 / fmax(fg, pl), p3,
                   p3 / fmax(fg, pl));
        }
        fflush(stdout);
        for (int d = 0; d < 2; d++) {
            CK(cudaSetDevice(d));
            CK(cudaDeviceSynchronize());
            CK(cudaFree(G[d].a));
            CK(cudaFree(G[d].gb));
            CK(cudaFree(G[d].b));
            CK(cudaFree(G[d].c));
        }
    }
    return 0;
}

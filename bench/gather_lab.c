/*
 * gather_lab.c: ovl-gather-lab, how W GPUs of one process gather A's shards
 * fastest, and what that does to ring's overlap, without ovld.
 *
 * For each shape M x K x N (M the gathered rows, m = M/W per GPU) it times,
 * as ovl-bench does (back-to-back iterations, a CUDA event after each on the
 * GPU's main stream, the median, the maximum over the GPUs; every iteration
 * starts once every GPU has ended the one before, and a GPU's iteration ends
 * once no peer reads its shard any more, as ovld's DONE waits for RELEASE):
 *
 *   the gather alone, every GPU receiving the W-1 other shards into its G:
 *     pull-seq   one copy stream pulling the peers in ring order (r+1, r+2,
 *                ...): ovld's ring and ovl-bench's ce-gather today;
 *     pull-par   one copy stream per peer, all pulls at once;
 *     pull-par2  two copy streams per peer, each a half of the shard;
 *     push-seq   one copy stream writing the own shard into the peers' G, in
 *                ring order;
 *     push-par   one copy stream per peer, all writes at once;
 *     batch      the W-1 pulls as one cudaMemcpyBatchAsync on one stream;
 *     nccl       ncclAllGather over the W GPUs (one communicator each, made
 *                by ncclCommInitAll);
 *   the GEMM of all M rows (the same cuBLASLt wrapper ovld uses);
 *   ring as ovld runs it and with concurrent pulls, c chunks per shard:
 *     ring-seq   the own shard's GEMMs first on one GEMM stream, one copy
 *                stream pulling the peers chunk by chunk in ring order, each
 *                chunk's GEMM after its pull, GEMM streams alternating
 *                (daemon/plan/plan.c's ring);
 *     ring-par   the same GEMMs, the pulls on one copy stream per peer
 *                (chunk j of every peer before chunk j+1 of any), the
 *                peers' GEMMs in chunk-major, ring order;
 *     ring-push  the same GEMMs, but each GPU writes its own shard into the
 *                peers' G (r+1, r+2, ...: at each step every GPU is
 *                written by one peer), chunk by chunk on one copy stream,
 *                and a GEMM waits for the sender's event;
 *     unfused    ncclAllGather, then the GEMM.
 *
 * GB/s is what one GPU receives, (W-1) m K bytes, per second. The data are
 * ovl-bench's random data (ovl_demo_fill, its seed): a GEMM's time depends
 * on its data. docs/performance.md reads it.
 *
 * Usage: ovl-gather-lab [--world W] [--chunks LIST] [MxKxN ...]
 * (W: 2..8, default every GPU up to 8; M a multiple of 64 W). Exit 0, 1 on
 * a CUDA, NCCL or cuBLASLt error, 2 for bad arguments, 77 with fewer than
 * two GPUs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda_gemm.h"
#include "demo_cuda.h"
#define LAB_WHO "ovl-gather-lab"
#include "lab_check.h"

#define SEED 0x6f766c62656e6368ull /* ovl-bench's */

/* an NCCL call */
#define NK(x)                                                                                      \
    do {                                                                                           \
        ncclResult_t e_ = (x);                                                                     \
        if (e_ != ncclSuccess)                                                                     \
            lab_fail(LAB_WHO, #x, __LINE__, ncclGetErrorString(e_));                               \
    } while (0)

#define MAXW  8
#define NCS   (2 * (MAXW - 1)) /* copy streams: two per peer at most */
#define NR    4                /* iterations whose events may be in flight */
#define MAXC  8
#define ITERS 50
#define WARM  8

typedef struct {
    int dev;
    cudaStream_t main, cs[NCS], g[2];
    ncclComm_t comm;
    ovld_lt_t *lt;
    void *ws[3];
    void *a, *gb, *b, *c;
    cudaEvent_t start[NR], rel[NR], done[NR], ev[MAXW * MAXC], join[NCS + 2];
    cudaEvent_t t[ITERS + 1];
} gpu_t;

static gpu_t G[MAXW];
static int W;
static size_t M, K, N, m;

typedef enum { V_PULL_SEQ, V_PULL_PAR, V_PULL_PAR2, V_PUSH_SEQ, V_PUSH_PAR, V_BATCH, V_NCCL } gv_t;
static const char *const gv_names[] = {"pull-seq", "pull-par", "pull-par2", "push-seq",
                                       "push-par", "batch",    "nccl"};
#define NGV 7

static size_t shard_bytes(void)
{
    return m * K * 2;
}

static char *g_rows(int d, int q)
{
    return (char *)G[d].gb + (size_t)q * shard_bytes();
}

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
        fprintf(stderr, "ovl-gather-lab: GEMM of %zu rows: %s\n", rows, err);
        exit(1);
    }
}

/* An iteration's head on every GPU: main waits for every GPU's end of the
 * iteration before (ovld's op n+1 starts once the ranks' op n is done, as
 * the clients' streams order them), then records start. */
static void head(int i)
{
    int r = i % NR, pr = (i + NR - 1) % NR;
    for (int d = 0; d < W; d++) {
        CK(cudaSetDevice(G[d].dev));
        if (i > 0)
            for (int q = 0; q < W; q++)
                if (q != d)
                    CK(cudaStreamWaitEvent(G[d].main, G[q].done[pr], 0));
        CK(cudaEventRecord(G[d].start[r], G[d].main));
    }
}

/* stream s of GPU d waits for the start of GPU q's iteration (q's shard is
 * ready: READY) */
static void wait_start(int d, cudaStream_t s, int q, int i)
{
    CK(cudaStreamWaitEvent(s, G[q].start[i % NR], 0));
    (void)d;
}

/* An iteration's tail: main joins the n used side streams (their last work
 * recorded in join[]), records rel (this GPU no longer reads or writes the
 * peers' memory), then waits for every peer's rel (no peer reads its shard
 * any more: ovld's RELEASE) and records done and the timing event. */
static void tail(int i, int nside, const cudaStream_t *side, int slot)
{
    int r = i % NR;
    for (int d = 0; d < W; d++) {
        gpu_t *g = &G[d];
        CK(cudaSetDevice(g->dev));
        for (int s = 0; s < nside; s++) {
            cudaStream_t st = side == NULL ? g->cs[s] : (s < 2 ? g->g[s] : g->cs[s - 2]);
            CK(cudaEventRecord(g->join[s], st));
            CK(cudaStreamWaitEvent(g->main, g->join[s], 0));
        }
        CK(cudaEventRecord(g->rel[r], g->main));
    }
    for (int d = 0; d < W; d++) {
        gpu_t *g = &G[d];
        CK(cudaSetDevice(g->dev));
        for (int q = 0; q < W; q++)
            if (q != d)
                CK(cudaStreamWaitEvent(g->main, G[q].rel[r], 0));
        CK(cudaEventRecord(g->done[r], g->main));
        if (slot >= 0)
            CK(cudaEventRecord(g->t[slot], g->main));
    }
}

/* ------------------------------------------------------------ variants */

static int g_variant, g_chunks;

static void gather_iter(int i, int slot)
{
    gv_t v = (gv_t)g_variant;
    size_t sb = shard_bytes();
    int nside = 0;

    head(i);
    if (v == V_NCCL) {
        NK(ncclGroupStart());
        for (int d = 0; d < W; d++) {
            CK(cudaSetDevice(G[d].dev));
            NK(ncclAllGather(G[d].a, G[d].gb, m * K, ncclBfloat16, G[d].comm, G[d].main));
        }
        NK(ncclGroupEnd());
        tail(i, 0, NULL, slot);
        return;
    }
    for (int d = 0; d < W; d++) {
        gpu_t *g = &G[d];
        CK(cudaSetDevice(g->dev));
        switch (v) {
        case V_PULL_SEQ:
        case V_PUSH_SEQ:
            nside = 1;
            for (int t = 1; t < W; t++) {
                int q = (d + t) % W;
                wait_start(d, g->cs[0], q, i);
                if (v == V_PULL_SEQ)
                    CK(cudaMemcpyAsync(g_rows(d, q), G[q].a, sb, cudaMemcpyDefault, g->cs[0]));
                else
                    CK(cudaMemcpyAsync(g_rows(q, d), g->a, sb, cudaMemcpyDefault, g->cs[0]));
            }
            break;
        case V_PULL_PAR:
        case V_PUSH_PAR:
            nside = W - 1;
            for (int t = 1; t < W; t++) {
                int q = (d + t) % W;
                cudaStream_t s = g->cs[t - 1];
                wait_start(d, s, q, i);
                wait_start(d, s, d, i);
                if (v == V_PULL_PAR)
                    CK(cudaMemcpyAsync(g_rows(d, q), G[q].a, sb, cudaMemcpyDefault, s));
                else
                    CK(cudaMemcpyAsync(g_rows(q, d), g->a, sb, cudaMemcpyDefault, s));
            }
            break;
        case V_PULL_PAR2:
            nside = 2 * (W - 1);
            for (int t = 1; t < W; t++) {
                int q = (d + t) % W;
                for (int h = 0; h < 2; h++) {
                    cudaStream_t s = g->cs[2 * (t - 1) + h];
                    size_t off = h ? sb / 2 : 0, len = h ? sb - sb / 2 : sb / 2;
                    wait_start(d, s, q, i);
                    CK(cudaMemcpyAsync(g_rows(d, q) + off, (char *)G[q].a + off, len,
                                       cudaMemcpyDefault, s));
                }
            }
            break;
        case V_BATCH: {
            void *dst[MAXW];
            const void *src[MAXW];
            size_t sz[MAXW], idx = 0;
            struct cudaMemcpyAttributes at;
            memset(&at, 0, sizeof(at));
            at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            at.srcLocHint.type = cudaMemLocationTypeDevice;
            at.dstLocHint.type = cudaMemLocationTypeDevice;
            at.dstLocHint.id = g->dev;
            nside = 1;
            for (int t = 1; t < W; t++) {
                int q = (d + t) % W;
                wait_start(d, g->cs[0], q, i);
                dst[t - 1] = g_rows(d, q);
                src[t - 1] = G[q].a;
                sz[t - 1] = sb;
            }
            CK(cudaMemcpyBatchAsync(dst, src, sz, (size_t)(W - 1), &at, &idx, 1, g->cs[0]));
            break;
        }
        default:
            break;
        }
    }
    tail(i, nside, NULL, slot);
}

static void gemm_iter(int i, int slot)
{
    for (int d = 0; d < W; d++) {
        CK(cudaSetDevice(G[d].dev));
        gemm(&G[d], -1, G[d].gb, 0, M, 0);
        if (slot >= 0)
            CK(cudaEventRecord(G[d].t[slot], G[d].main));
    }
    (void)i;
}

static void unfused_iter(int i, int slot)
{
    head(i);
    NK(ncclGroupStart());
    for (int d = 0; d < W; d++) {
        CK(cudaSetDevice(G[d].dev));
        NK(ncclAllGather(G[d].a, G[d].gb, m * K, ncclBfloat16, G[d].comm, G[d].main));
    }
    NK(ncclGroupEnd());
    for (int d = 0; d < W; d++) {
        CK(cudaSetDevice(G[d].dev));
        gemm(&G[d], -1, G[d].gb, 0, M, 0);
    }
    tail(i, 0, NULL, slot);
}

/* ring: g_variant 0 pull-seq (ovld's), 1 pull-par (a copy stream per
 * peer), 2 push-seq (each GPU writes its own shard into the peers' G in
 * ring order, chunk by chunk, on one copy stream; a GEMM waits for the
 * sender's event). Two passes: every GPU's copies and their events first,
 * then the GEMMs that wait for them (a wait on an event not yet recorded
 * would wait for nothing). */
static void ring_iter(int i, int slot)
{
    int c = g_chunks, mode = g_variant, par = mode == 1;
    size_t cr = (m + c - 1) / c;
    static const cudaStream_t side_tag[1];
    head(i);
    for (int d = 0; d < W; d++) {
        gpu_t *g = &G[d];
        int ncs = par ? W - 1 : 1;
        CK(cudaSetDevice(g->dev));
        CK(cudaStreamWaitEvent(g->g[0], g->start[i % NR], 0));
        CK(cudaStreamWaitEvent(g->g[1], g->start[i % NR], 0));
        for (int s = 0; s < ncs; s++)
            CK(cudaStreamWaitEvent(g->cs[s], g->start[i % NR], 0));
        for (int j = 0; j < c; j++) {
            size_t r0 = j * cr, rows = r0 + cr > m ? m - r0 : cr;
            gemm(g, 0, g->a, r0, rows, d * m + r0);
        }
        /* pull-seq and push-seq: by peer, then chunk, on one stream;
         * pull-par: chunk-major, peer t on its own stream. A pull waits
         * for its source's start (its A is ready), a push for its
         * destination's (its G is free). */
        for (int t = 1; t < W; t++)
            wait_start(d, g->cs[par ? t - 1 : 0], (d + t) % W, i);
        for (int o = 0; o < (W - 1) * c; o++) {
            int t = par ? o % (W - 1) + 1 : o / c + 1, j = par ? o / (W - 1) : o % c;
            int q = (d + t) % W;
            size_t r0 = j * cr, rows = r0 + cr > m ? m - r0 : cr;
            cudaStream_t s = g->cs[par ? t - 1 : 0];
            if (mode == 2)
                CK(cudaMemcpyAsync(g_rows(q, d) + r0 * K * 2, (char *)g->a + r0 * K * 2,
                                   rows * K * 2, cudaMemcpyDefault, s));
            else
                CK(cudaMemcpyAsync(g_rows(d, q) + r0 * K * 2, (char *)G[q].a + r0 * K * 2,
                                   rows * K * 2, cudaMemcpyDefault, s));
            CK(cudaEventRecord(g->ev[o], s));
        }
    }
    /* GEMMs in the copies' order, streams alternating; the own shard's c
     * GEMMs came first. Pushed rows: block p = r - t arrives t-th. */
    for (int d = 0; d < W; d++) {
        gpu_t *g = &G[d];
        int gemms = c;
        CK(cudaSetDevice(g->dev));
        for (int o = 0; o < (W - 1) * c; o++, gemms++) {
            int t = par ? o % (W - 1) + 1 : o / c + 1, j = par ? o / (W - 1) : o % c;
            int q = mode == 2 ? (d + W - t) % W : (d + t) % W, s = gemms % 2;
            size_t r0 = j * cr, rows = r0 + cr > m ? m - r0 : cr;
            CK(cudaStreamWaitEvent(g->g[s], mode == 2 ? G[q].ev[o] : g->ev[o], 0));
            gemm(g, s, g->gb, q * m + r0, rows, q * m + r0);
        }
    }
    tail(i, 2 + (par ? W - 1 : 1), side_tag, slot);
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double measure(void (*fn)(int, int))
{
    for (int i = 0; i < WARM; i++)
        fn(i, -1);
    for (int d = 0; d < W; d++) {
        CK(cudaSetDevice(G[d].dev));
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(G[d].t[0], G[d].main));
    }
    for (int i = 0; i < ITERS; i++)
        fn(WARM + i, i + 1);
    double worst = 0;
    for (int d = 0; d < W; d++) {
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

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ovl-gather-lab [--world W] [--chunks LIST] [MxKxN ...]\n"
            "Times ways for W GPUs of one process to gather A's shards (pulls and pushes\n"
            "by the copy engines, one stream or one per peer, a batch, NCCL's all-gather)\n"
            "and ring's schedule with its pulls on one copy stream and on one per peer,\n"
            "against the GEMM and NCCL + GEMM, without ovld. M is the gathered rows.\n"
            "  --world W      GPUs used, 2..8 (default: every GPU here, at most 8)\n"
            "  --chunks LIST  ring's chunks per shard, comma separated (default 1,2,4;\n"
            "                 at most %d)\n"
            "Default shapes: 16384x8192x2048 65536x1024x1024 8192x8192x8192 4096x4096x4096.\n"
            "Exit 0; 1 on a CUDA, NCCL or cuBLASLt error; 2 for bad arguments; 77 with\n"
            "fewer than two GPUs.\n",
            MAXC);
}

int main(int argc, char **argv)
{
    const char *defaults[] = {"16384x8192x2048", "65536x1024x1024", "8192x8192x8192",
                              "4096x4096x4096"};
    const char *shapes[32];
    int nsh = 0, ngpu = 0, want = 0, chunks[MAXC], nch = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            char *end;
            long w = strtol(argv[++i], &end, 10);
            if (*end || w < 2 || w > MAXW) {
                fprintf(stderr, "ovl-gather-lab: --world takes 2..%d, not '%s'\n", MAXW, argv[i]);
                return 2;
            }
            want = (int)w;
        } else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) {
            char *p = argv[++i], *end;
            nch = 0;
            for (;;) {
                long c = strtol(p, &end, 10);
                if (end == p || c < 1 || c > MAXC || nch == MAXC) {
                    fprintf(stderr, "ovl-gather-lab: --chunks takes 1..%d, comma separated\n",
                            MAXC);
                    return 2;
                }
                chunks[nch++] = (int)c;
                if (*end == 0)
                    break;
                if (*end != ',') {
                    fprintf(stderr, "ovl-gather-lab: --chunks takes 1..%d, comma separated\n",
                            MAXC);
                    return 2;
                }
                p = end + 1;
            }
        } else if (argv[i][0] == '-') {
            usage(stderr);
            return 2;
        } else if (nsh < 32) {
            shapes[nsh++] = argv[i];
        } else {
            fprintf(stderr, "ovl-gather-lab: at most 32 shapes\n");
            return 2;
        }
    }
    if (nch == 0) {
        chunks[0] = 1, chunks[1] = 2, chunks[2] = 4;
        nch = 3;
    }
    if (nsh == 0)
        for (nsh = 0; nsh < 4; nsh++)
            shapes[nsh] = defaults[nsh];
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
        printf("ovl-gather-lab: needs two GPUs (%d here)\n", ngpu);
        return 77;
    }
    W = want ? want : (ngpu < MAXW ? ngpu : MAXW);
    if (W > ngpu) {
        fprintf(stderr, "ovl-gather-lab: --world %d with %d GPUs here\n", W, ngpu);
        return 2;
    }
    for (int si = 0; si < nsh; si++) {
        size_t a, b, c;
        int used = 0;
        if (sscanf(shapes[si], "%zux%zux%zu%n", &a, &b, &c, &used) != 3 || shapes[si][used] ||
            a == 0 || a % (64 * (size_t)W) || b == 0 || c == 0) {
            fprintf(stderr, "ovl-gather-lab: bad shape '%s' (MxKxN, M a multiple of %d)\n",
                    shapes[si], 64 * W);
            return 2;
        }
    }

    int devs[MAXW];
    ncclComm_t comms[MAXW];
    for (int d = 0; d < W; d++)
        devs[d] = d;
    printf("ovl-gather-lab: world %d, one GPU each; the links (CUDA's P2P performance rank, "
           "0 best):\n",
           W);
    for (int d = 0; d < W; d++) {
        printf("  GPU %d:", d);
        for (int q = 0; q < W; q++) {
            int access = 0, rank = -1;
            if (q == d) {
                printf("   -");
                continue;
            }
            CK(cudaDeviceCanAccessPeer(&access, d, q));
            if (access)
                CK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, d, q));
            printf(" %3s", access ? (rank == 0 ? "0" : rank == 1 ? "1" : "2+") : "no");
        }
        printf("\n");
    }
    for (int d = 0; d < W; d++) {
        gpu_t *g = &G[d];
        char err[256];
        int lo, hi;
        g->dev = d;
        CK(cudaSetDevice(d));
        for (int q = 0; q < W; q++) {
            int access = 0;
            if (q == d)
                continue;
            CK(cudaDeviceCanAccessPeer(&access, d, q));
            if (!access)
                continue; /* cudaMemcpyAsync then stages through the host */
            cudaError_t pe = cudaDeviceEnablePeerAccess(q, 0);
            if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled)
                CK(pe);
            (void)cudaGetLastError();
        }
        CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        CK(cudaStreamCreateWithFlags(&g->main, cudaStreamNonBlocking));
        for (int s = 0; s < NCS; s++) /* as ovld's copy streams: high priority */
            CK(cudaStreamCreateWithPriority(&g->cs[s], cudaStreamNonBlocking, hi));
        CK(cudaStreamCreateWithFlags(&g->g[0], cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&g->g[1], cudaStreamNonBlocking));
        if (ovld_lt_create(&g->lt, err, sizeof(err)) != OVL_OK) {
            fprintf(stderr, "ovl-gather-lab: cuBLASLt: %s\n", err);
            return 1;
        }
        for (int w = 0; w < 3; w++)
            CK(cudaMalloc(&g->ws[w], OVLD_LT_WORKSPACE));
        for (int r = 0; r < NR; r++) {
            CK(cudaEventCreateWithFlags(&g->start[r], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->rel[r], cudaEventDisableTiming));
            CK(cudaEventCreateWithFlags(&g->done[r], cudaEventDisableTiming));
        }
        for (int j = 0; j < MAXW * MAXC; j++)
            CK(cudaEventCreateWithFlags(&g->ev[j], cudaEventDisableTiming));
        for (int j = 0; j < NCS + 2; j++)
            CK(cudaEventCreateWithFlags(&g->join[j], cudaEventDisableTiming));
        for (int i = 0; i <= ITERS; i++)
            CK(cudaEventCreate(&g->t[i]));
    }
    NK(ncclCommInitAll(comms, W, devs));
    for (int d = 0; d < W; d++)
        G[d].comm = comms[d];

    for (int si = 0; si < nsh; si++) {
        sscanf(shapes[si], "%zux%zux%zu", &M, &K, &N);
        m = M / (size_t)W;
        for (int d = 0; d < W; d++) {
            gpu_t *g = &G[d];
            CK(cudaSetDevice(d));
            CK(cudaMalloc(&g->a, m * K * 2));
            CK(cudaMalloc(&g->gb, M * K * 2));
            CK(cudaMalloc(&g->b, K * N * 2));
            CK(cudaMalloc(&g->c, M * N * 2));
            CK(ovl_demo_fill(OVL_DTYPE_BF16, g->a, m, K, K, SEED, (uint32_t)d, 0, g->main));
            CK(ovl_demo_fill(OVL_DTYPE_BF16, g->b, K, N, N, SEED, (uint32_t)d, 1, g->main));
            for (int q = 0; q < W; q++) /* G as gathered */
                CK(ovl_demo_fill(OVL_DTYPE_BF16, g_rows(d, q), m, K, K, SEED, (uint32_t)q, 0,
                                 g->main));
            CK(cudaStreamSynchronize(g->main));
        }
        double gb = (double)(W - 1) * (double)shard_bytes() / 1e9, best = 1e30, nccl = 0;
        printf("%s, world %d (m %zu, a shard %.1f MB): the gather alone, ms (GB/s into each "
               "GPU)\n",
               shapes[si], W, m, (double)shard_bytes() / 1e6);
        for (int v = 0; v < NGV; v++) {
            g_variant = v;
            double t = measure(gather_iter);
            printf("  %-9s %.3f (%.0f)\n", gv_names[v], t, gb / (t * 1e-3));
            if (v == V_NCCL)
                nccl = t;
            else if (t < best)
                best = t;
        }
        double fg = measure(gemm_iter), un = measure(unfused_iter);
        double floor_ce = fmax(fg, best), floor_all = fmax(fg, fmin(best, nccl));
        printf("  gemm %.3f  unfused %.3f  floor max(gemm, best copy gather) %.3f  "
               "floor max(gemm, faster of nccl and copies) %.3f\n",
               fg, un, floor_ce, floor_all);
        for (int ci = 0; ci < nch; ci++) {
            g_chunks = chunks[ci];
            if ((size_t)g_chunks > m)
                continue;
            g_variant = 0;
            double s = measure(ring_iter);
            g_variant = 1;
            double p = measure(ring_iter);
            g_variant = 2;
            double u = measure(ring_iter);
            printf("  c=%d  ring-seq %.3f (%.2fx)  ring-par %.3f (%.2fx)  ring-push %.3f (%.2fx)\n",
                   g_chunks, s, s / floor_all, p, p / floor_all, u, u / floor_all);
        }
        fflush(stdout);
        for (int d = 0; d < W; d++) {
            CK(cudaSetDevice(d));
            CK(cudaDeviceSynchronize());
            CK(cudaFree(G[d].a));
            CK(cudaFree(G[d].gb));
            CK(cudaFree(G[d].b));
            CK(cudaFree(G[d].c));
        }
    }
    for (int d = 0; d < W; d++)
        NK(ncclCommDestroy(G[d].comm));
    return 0;
}

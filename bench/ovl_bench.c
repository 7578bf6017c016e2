/*
 * ovl_bench.c: ovl-bench, the benchmark of ovl on the CUDA backend.
 *
 * For each shape (M x K x N, M the gathered row count) it times
 * C = allgather(A) @ B three ways on the same GPUs, in one run:
 *
 *   - through ovld: W forked rank processes (rank r on GPU r mod G, G the
 *     GPUs here) join one job and submit ovl_allgather_gemm back to back on
 *     their own stream, for every algorithm and chunk count asked for;
 *   - with --torch-peer, PyTorch's own fused op
 *     (torch.ops.symm_mem.fused_all_gather_matmul) and its unfused
 *     all-gather + mm, timed the same way by bench/torch_peer.py, run from
 *     here once the ranks have exited (one rank per GPU only);
 *   - the baselines, in this process after those: NCCL's all-gather alone,
 *     the copy engines' gather alone (each GPU writes its shard into the
 *     other ranks' G, "ce-gather"), the cuBLASLt GEMM alone (the same
 *     wrapper ovld uses), and NCCL's all-gather then the GEMM ("unfused").
 *     The floor is max(GEMM, the faster of ce-gather and all-gather), the
 *     best an overlapped op could do; "floor ce" is max(ce-gather, GEMM),
 *     "floor nccl" max(all-gather, GEMM).
 *
 * With --bs N every op has N Bs of the shape's N columns each, C_i =
 * allgather(A) @ B_i, A gathered once: ovld gets one op of N Bs; the
 * baselines' GEMM is then the N GEMMs, one after the other, and unfused
 * the all-gather followed by them.
 *
 * With more ranks than GPUs (W > G) ranks share GPUs: ovld gathers by the
 * copy engine there, and so do the baselines (NCCL cannot put two ranks on
 * one GPU): each rank's copies of every shard, "copy-gather". A time
 * measured so includes the other ranks' work on the same GPU: it is no
 * overlap figure, and the table and the summary say so.
 *
 * The summary gives, per shape, the best ovl config against unfused, both
 * floors and PyTorch's fused op, then the targets: at most 1.10x the floor
 * on every shape, never slower than unfused, 25% faster than PyTorch's
 * fused op by geometric mean over the shapes.
 *
 * Every time is the median of `iters` back-to-back ops measured with CUDA
 * events on the stream that issues them (the application's view of one op in
 * steady state), taken as the maximum over GPUs: the slowest rank bounds the
 * pipeline. With --check every ovl config's C is compared with a cuBLASLt
 * fp32 product of the same inputs.
 *
 * CUDA cannot be used in a child forked after the parent initialized it, so
 * the parent touches CUDA only after every child is gone: a first child
 * probes the GPUs and the daemon, the rank children run the ovl part, and
 * only then does the parent time the baselines.
 *
 * With --op rs it times GEMM + reduce-scatter instead (ovl_gemm_reduce_scatter;
 * M x K x N with K the whole inner dimension: each rank holds A M x K/W and
 * B K/W x N, and keeps its M/W rows of the sum): through ovld as above,
 * and the baselines: the rank's GEMM alone (M x N x K/W), NCCL's
 * reduce-scatter of its M x N partials alone, the copy engines' (the
 * partials copied into their owners' receive slots, summed there by ovld's
 * own reduction kernel), and the GEMM then NCCL's reduce-scatter
 * ("unfused"); the floor is max(GEMM, the faster reduce-scatter). Each
 * rank's C is checked against an fp32 product of every rank's A and B side
 * by side (the sum of the products). With --torch-peer, PyTorch's
 * fused_matmul_reduce_scatter and its mm + reduce-scatter are timed the same
 * way (bench/torch_peer.py --op rs).
 *
 * With an fp8 --dtype (fp8e4m3, fp8e5m2: A's) either kind is scaled
 * (ovl.h, ovl_scaling_t): B in --b-dtype, given transposed (N x k, the one
 * layout of cuBLASLt's fp8 GEMM), fp32 scales by --scale on both sides (or
 * --a-scale and --b-scale apart: tensor, row, or the block scales 1x128 and
 * 128x128, B's only), C (and rs's partials) in --out-dtype, no bias. The data are ovl-demo's
 * (client/demo_scaled.h: the values of ovl_demo_fill rounded to fp8, scales
 * in [0.5, 1)), made on the host, by threads, and copied. Each baseline
 * has its fp8 twin: the GEMM is the scaled cuBLASLt GEMM (ovld_lt_gemm
 * with scaled args, the call ovld makes); all-gather + GEMM's gathers move
 * A's fp8 bytes and, by row or 1x128, each row's scales too (as ovld's
 * plans do, so the floors include them; "allgather+scales",
 * "ce-gather+scales"),
 * unfused is that gather, then the GEMM; GEMM + reduce-scatter's GEMM
 * writes the partials in --out-dtype, which the reduce-scatters move and
 * sum, unfused being the GEMM, then NCCL's reduce-scatter. Every C is
 * checked against a cuBLASLt fp32 product of the dequantized inputs (A
 * and B times their scales, each element its own block's with block
 * scales, rounded to fp32 on the host), to
 * ovl_demo_scaled_tolerance (bf16 1e-2, fp16 2e-3, fp32 5e-4, twice that
 * with --fast-accum). --torch-peer then times PyTorch's scaled fused ops
 * (fused_all_gather_scaled_matmul, fused_scaled_matmul_reduce_scatter)
 * and their unfused torch._scaled_mm equivalents.
 *
 * Exit status: 0 if everything ran and every check passed, 1 on any failure
 * or failed check, 2 for bad arguments, 77 when there is no GPU.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda_gemm.h"
#include "cudrv.h"
#include "demo_cuda.h"
#include "demo_rnd.h"
#include "demo_scaled.h" /* an fp8 run's data model, tolerance and words: ovl-demo's */
#include "kernels.h" /* ovld_launch_reduce: ovld's reduction, for --op rs's copy-engine baseline */
#include "num.h"
#include "ovl.h"
#include "clock.h"

#define MAX_SHAPES 32
#define MAX_ALGOS  4
#define MAX_CHUNKS 16
#define MAX_CFGS   (MAX_ALGOS * MAX_CHUNKS)
#define MAX_WORLD  16
#define MAX_ITERS  10000

/* The data are the same in every run, so that runs compare; never zeros,
 * whose products would flatter the GPU's power draw. */
#define SEED 0x6f766c62656e6368ull

/* Ops a rank may have submitted beyond its last completed one. ovld takes at
 * most max_ops_in_flight (64 by default) per rank, and libovl throttles there
 * by polling the doorbell; waiting here on our own event for the op 32 behind
 * keeps well inside that, costs no polling copies during the timing, and
 * leaves the stream full, so the ops stay back to back. */
#define SUBMIT_WINDOW 32

/* The client's timeout for blocking calls: the first op of a config may wait
 * for ovld to set up (NCCL communicators, IPC imports). */
#define CLIENT_TIMEOUT_MS 120000

/* ------------------------------------------------------------ options */

typedef struct shape {
    uint64_t M, K, N;
} shape_t;

typedef struct cfg {
    ovl_algo_t algo;
    uint32_t chunks;
} cfg_t;

typedef struct bopts {
    const char *socket;
    uint32_t world; /* 0 until known: the number of GPUs */
    uint32_t ngpu;  /* the GPUs here (the probe's count): rank r is on GPU r % ngpu */
    ovl_dtype_t dtype;
    shape_t shapes[MAX_SHAPES];
    int nshapes;
    ovl_algo_t algos[MAX_ALGOS];
    int nalgos;
    bool algos_given; /* --algos: run them as asked, even where they cannot run */
    uint32_t chunks[MAX_CHUNKS];
    int nchunks;
    cfg_t cfgs[MAX_CFGS];
    int ncfgs;
    int warmup, iters;
    int tune_ops;  /* auto configs: at least this many untimed ops (ovld measures) */
    int settle_ms; /* each measurement's own untimed load first (settle_ops) */
    uint32_t nb;   /* Bs of every op, 1..OVL_MAX_BS, each K x N */
    const char *results;
    bool check;
    const char *label;
    int timeout_s;
    const char *torch_peer; /* bench/torch_peer.py, or NULL: PyTorch's fused op not timed */
    const char *python;     /* what runs it */
    char job[64];
    /* --op: OVL_OP_AG_GEMM, or OVL_OP_GEMM_RS (the file's comment) */
    ovl_op_kind_t op;
    /* an fp8 --dtype: the op is scaled (sc.on) with --b-dtype, --out-dtype,
     * --scale (both sides), --a-scale, --b-scale and --fast-accum; no bias.
     * Zero otherwise. */
    ovl_demo_scaled_t sc;
} bopts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ovl-bench [OPTIONS]\n"
            "\n"
            "Times C = allgather(A) @ B through ovld against NCCL all-gather + cuBLASLt GEMM\n"
            "(unfused), the floor max(GEMM, the faster of the copy engines' and NCCL's\n"
            "gather) and each of those two, and with --torch-peer PyTorch's fused op,\n"
            "on the same GPUs.\n"
            "ovld must be running with the CUDA backend.\n"
            "\n"
            "  --socket PATH     ovld's socket (default $OVL_SOCKET, else %s)\n"
            "  --world W         ranks (default: every GPU, one rank each); rank r runs on\n"
            "                    GPU r mod G, so with more ranks than GPUs ranks share GPUs\n"
            "                    (the baselines then gather by copies, not NCCL) and the\n"
            "                    times are no overlap figures (at most %d ranks)\n"
            "  --dtype T         bf16, fp16 or fp32 (default bf16); fp8e4m3 or fp8e5m2: A's,\n"
            "                    and the ops are scaled (below)\n"
            "  --shapes LIST     MxKxN,... with M the gathered rows, divisible by W (default\n"
            "                    4096x4096x4096,8192x8192x8192,16384x8192x14336,\n"
            "                    16384x8192x2048,65536x1024x1024; fp8: 4096x4096x4096,\n"
            "                    8192x8192x8192,16384x8192x14336,8192x8192x28672 and\n"
            "                    16384x8192x2048,2048x8192x8192, with --op rs\n"
            "                    16384x14336x8192,8192x28672x8192)\n"
            "  --algos LIST      naive,collective,ring,auto (default naive,collective,ring)\n"
            "  --chunks LIST     chunk counts, 0 = the daemon's default (default 0,2,4);\n"
            "                    naive runs once\n"
            "  --bs N            Bs of every op, each K x N: C_i = allgather(A) @ B_i with A\n"
            "                    gathered once; the baselines' GEMM is the N GEMMs (default\n"
            "                    1, at most %d)\n"
            "  --warmup N        untimed ops per config, at least (default 10)\n"
            "  --settle-ms T     and at least about T ms of them, estimated from the\n"
            "                    shape's flop, so that every measurement (ovl's and the\n"
            "                    baselines') starts on a GPU already at its sustained\n"
            "                    clock (default 300; 0: --warmup alone)\n"
            "  --iters N         timed ops per config (default 100)\n"
            "  --tune-ops N      auto configs: at least N untimed ops first (default 120:\n"
            "                    ovld measures the plans worth trying for a new shape,\n"
            "                    at most 16 of them x (1 + tune_samples, default 5)), so\n"
            "                    that the timed ops run ovld's measured choice, which\n"
            "                    it keeps: --algos auto --shapes LIST fills ovld's table\n"
            "                    for those shapes ahead of time (ovlctl tune shows it)\n"
            "  --results FILE    append the table as markdown to FILE (default -: none;\n"
            "                    a run kept goes to bench/results/, one file a run)\n"
            "  --check           check every ovl result (default)\n"
            "  --no-check        do not\n"
            "  --label TEXT      free text for the results header (e.g. a git commit)\n"
            "  --timeout S       seconds a shape may take before everything is stopped\n"
            "                    (default 300)\n"
            "  --torch-peer FILE also time PyTorch's fused_all_gather_matmul and its unfused\n"
            "                    all-gather + mm on the same GPUs with this script\n"
            "                    (bench/torch_peer.py; one rank per GPU only)\n"
            "  --python EXE      the Python with torch that runs it (default $OVL_PYTHON,\n"
            "                    else python3)\n"
            "  --op ag|rs        all-gather + GEMM (default), or GEMM + reduce-scatter: K\n"
            "                    the whole inner dimension, each rank's A M x K/W, M and\n"
            "                    K divisible by W; algorithms naive, collective, ring\n"
            "                    and push (all four by default), one B; --torch-peer\n"
            "                    times PyTorch's fused_matmul_reduce_scatter; where\n"
            "                    ranks share GPUs ring and push only (no NCCL), and\n"
            "                    no NCCL baselines\n"
            "  -h, --help        show this help\n"
            "\n"
            "Scaled (fp8) ops, with --dtype fp8e4m3 or fp8e5m2 (either --op, one B, K and N\n"
            "multiples of 16, with --op rs K/W too):\n"
            "  --b-dtype T       B's: fp8e4m3 (default) or fp8e5m2 (not with A e5m2); B is\n"
            "                    given transposed (N x K), as cuBLASLt's fp8 GEMM takes it\n"
            "  --out-dtype T     C's (and --op rs's partials'): bf16 (default), fp16, fp32\n"
            "  --scale S         fp32 scales on both sides: row (default: A one a row, B\n"
            "                    one a column of op(B)), tensor (one each), 1x128 (one a\n"
            "                    row and 128 of K) or 128x128 (one a 128 x 128 tile, B only)\n"
            "  --a-scale S       A's alone (over --scale): tensor, row or 1x128\n"
            "  --b-scale S       B's alone (over --scale): tensor, row, 1x128 or 128x128;\n"
            "                    block scales go with block scales, so DeepSeek-V3's pair is\n"
            "                    --a-scale 1x128 --b-scale 128x128; A 1x128 needs M/W, B\n"
            "                    1x128 N, in multiples of 4\n"
            "  --fast-accum      cuBLASLt's fast fp8 accumulation\n"
            "Their baselines are the bf16 ones' fp8 twins: gemm is the scaled cuBLASLt GEMM\n"
            "that ovld calls; the gathers move A's fp8 rows and, by row or 1x128, their\n"
            "scales\n"
            "(allgather+scales, ce-gather+scales: the floors include them); --op rs's\n"
            "reduce-scatters move the partials in --out-dtype. Every C is checked against\n"
            "an fp32 cuBLASLt product of the dequantized inputs, tolerance by output dtype:\n"
            "bf16 1e-2, fp16 2e-3, fp32 5e-4, twice that with --fast-accum. --torch-peer\n"
            "times PyTorch's fused_all_gather_scaled_matmul (--op rs:\n"
            "fused_scaled_matmul_reduce_scatter) and all-gather + torch._scaled_mm\n"
            "(torch._scaled_mm + reduce-scatter).\n",
            OVL_DEFAULT_SOCKET, MAX_WORLD, OVL_MAX_BS);
}

/* Splits a comma-separated list in place; calls one(item) for each. */
static int parse_list(char *s, int (*one)(bopts_t *, const char *), bopts_t *o)
{
    for (char *save = NULL, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (one(o, t) != 0)
            return -1;
    return 0;
}

static int add_shape(bopts_t *o, const char *t)
{
    unsigned long long M, K, N;
    int used = 0;
    if (o->nshapes == MAX_SHAPES ||
        sscanf(t, "%llu%*[xX]%llu%*[xX]%llu%n", &M, &K, &N, &used) != 3 || t[used] || M == 0 ||
        K == 0 || N == 0) {
        fprintf(stderr, "ovl-bench: bad shape '%s' (MxKxN, at most %d shapes)\n", t, MAX_SHAPES);
        return -1;
    }
    o->shapes[o->nshapes++] = (shape_t){M, K, N};
    return 0;
}

static int add_algo(bopts_t *o, const char *t)
{
    if (o->nalgos == MAX_ALGOS || ovl_algo_parse(t, &o->algos[o->nalgos]) != OVL_OK) {
        fprintf(stderr, "ovl-bench: bad algorithm '%s' (naive, collective, ring, push, auto)\n", t);
        return -1;
    }
    o->nalgos++;
    return 0;
}

static int add_chunks(bopts_t *o, const char *t)
{
    uint64_t v;
    if (o->nchunks == MAX_CHUNKS || ovl_parse_u64(t, &v) != 0 || v > 64) {
        fprintf(stderr, "ovl-bench: bad chunk count '%s' (0..64, at most %d)\n", t, MAX_CHUNKS);
        return -1;
    }
    o->chunks[o->nchunks++] = (uint32_t)v;
    return 0;
}

/*
 * The scaled options into o->sc, after the loop: with an fp8 --dtype, B's
 * dtype (default fp8e4m3, not e5m2 with an e5m2 A), C's (default bf16),
 * the scale modes (--scale both sides, default row; --a-scale and
 * --b-scale one each, over it) and fast accumulation; with another dtype
 * none of them may be given. Modes that the rule of a scaling refuses
 * (common/scaling.h: block with block, A never 128x128) are refused here
 * in its words; the shapes' part of it once the world is known (main).
 * 0, or -1 after saying why.
 */
static int parse_scaled(bopts_t *o, const char *b_arg, const char *out_arg,
                        const char *const scale_args[3], bool fast_accum)
{
    static const char *const names[3] = {"--scale", "--a-scale", "--b-scale"};
    bool scale_given = scale_args[0] || scale_args[1] || scale_args[2];
    if (!ovl_dtype_is_fp8(o->dtype)) {
        if (b_arg || out_arg || scale_given || fast_accum) {
            fprintf(stderr, "ovl-bench: --b-dtype, --out-dtype, --scale, --a-scale, --b-scale and "
                            "--fast-accum are for an fp8 --dtype (fp8e4m3 or fp8e5m2)\n");
            return -1;
        }
        return 0;
    }
    ovl_demo_scaled_t sc = {.on = true,
                            .b_dtype = OVL_DTYPE_FP8_E4M3,
                            .out_dtype = OVL_DTYPE_BF16,
                            .a_mode = OVL_SCALE_ROW,
                            .b_mode = OVL_SCALE_ROW,
                            .bias = false,
                            .fast_accum = fast_accum};
    if (b_arg && (ovl_dtype_parse(b_arg, &sc.b_dtype) != OVL_OK || !ovl_dtype_is_fp8(sc.b_dtype))) {
        fprintf(stderr, "ovl-bench: --b-dtype '%s': fp8e4m3 or fp8e5m2\n", b_arg);
        return -1;
    }
    if (out_arg &&
        (ovl_dtype_parse(out_arg, &sc.out_dtype) != OVL_OK || ovl_dtype_is_fp8(sc.out_dtype))) {
        fprintf(stderr, "ovl-bench: --out-dtype '%s': bf16, fp16 or fp32\n", out_arg);
        return -1;
    }
    ovl_scale_mode_t modes[3] = {OVL_SCALE_ROW, OVL_SCALE_ROW, OVL_SCALE_ROW};
    for (int i = 0; i < 3; i++)
        if (scale_args[i] && ovl_scale_mode_parse(scale_args[i], &modes[i]) != OVL_OK) {
            fprintf(stderr, "ovl-bench: %s '%s': tensor, row, 1x128 or 128x128\n", names[i],
                    scale_args[i]);
            return -1;
        }
    sc.a_mode = scale_args[1] ? modes[1] : modes[0];
    sc.b_mode = scale_args[2] ? modes[2] : modes[0];
    if (o->dtype == OVL_DTYPE_FP8_E5M2 && sc.b_dtype == OVL_DTYPE_FP8_E5M2) {
        fprintf(stderr, "ovl-bench: --dtype fp8e5m2 with --b-dtype fp8e5m2: cuBLASLt has no fp8 "
                        "GEMM of e5m2 by e5m2\n");
        return -1;
    }
    const char *why =
        ovl_scaling_refusal(o->dtype, sc.b_dtype, sc.out_dtype, sc.a_mode, sc.b_mode, true);
    if (why) {
        fprintf(stderr, "ovl-bench: scales %s/%s: %s%s\n", ovl_scale_mode_name(sc.a_mode),
                ovl_scale_mode_name(sc.b_mode), why,
                sc.a_mode == OVL_SCALE_BLOCK_128X128 && !scale_args[1]
                    ? " (--scale sets both sides: --a-scale 1x128 --b-scale 128x128)"
                    : "");
        return -1;
    }
    o->sc = sc;
    return 0;
}

static int parse_args(int argc, char **argv, bopts_t *o)
{
    enum {
        O_SOCKET = 1,
        O_WORLD,
        O_DTYPE,
        O_SHAPES,
        O_ALGOS,
        O_CHUNKS,
        O_WARMUP,
        O_TUNE_OPS,
        O_ITERS,
        O_RESULTS,
        O_CHECK,
        O_NOCHECK,
        O_LABEL,
        O_TIMEOUT,
        O_BS,
        O_TORCH,
        O_PYTHON,
        O_SETTLE,
        O_OP,
        O_BDTYPE,
        O_OUTDTYPE,
        O_SCALE,
        O_ASCALE,
        O_BSCALE,
        O_FASTACC
    };
    static const struct option lo[] = {
        {"socket", required_argument, NULL, O_SOCKET},
        {"world", required_argument, NULL, O_WORLD},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"shapes", required_argument, NULL, O_SHAPES},
        {"algos", required_argument, NULL, O_ALGOS},
        {"chunks", required_argument, NULL, O_CHUNKS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"tune-ops", required_argument, NULL, O_TUNE_OPS},
        {"settle-ms", required_argument, NULL, O_SETTLE},
        {"iters", required_argument, NULL, O_ITERS},
        {"results", required_argument, NULL, O_RESULTS},
        {"check", no_argument, NULL, O_CHECK},
        {"no-check", no_argument, NULL, O_NOCHECK},
        {"label", required_argument, NULL, O_LABEL},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"bs", required_argument, NULL, O_BS},
        {"torch-peer", required_argument, NULL, O_TORCH},
        {"python", required_argument, NULL, O_PYTHON},
        {"op", required_argument, NULL, O_OP},
        {"b-dtype", required_argument, NULL, O_BDTYPE},
        {"out-dtype", required_argument, NULL, O_OUTDTYPE},
        {"scale", required_argument, NULL, O_SCALE},
        {"a-scale", required_argument, NULL, O_ASCALE},
        {"b-scale", required_argument, NULL, O_BSCALE},
        {"fast-accum", no_argument, NULL, O_FASTACC},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char shapes[] = "4096x4096x4096,8192x8192x8192,16384x8192x14336,16384x8192x2048,"
                    "65536x1024x1024";
    char algos[] = "naive,collective,ring", chunks[] = "0,2,4";
    /* fp8's: the issue's four (36) and two of each kind's own */
    char fp8_shapes[] = "4096x4096x4096,8192x8192x8192,16384x8192x14336,8192x8192x28672,"
                        "16384x8192x2048,2048x8192x8192";
    char fp8_rs_shapes[] = "4096x4096x4096,8192x8192x8192,16384x8192x14336,8192x8192x28672,"
                           "16384x14336x8192,8192x28672x8192";
    char *shapes_arg = NULL, *algos_arg = NULL, *chunks_arg = NULL;
    /* the scaled options, as given (NULL, false: not) */
    const char *b_dtype_arg = NULL, *out_dtype_arg = NULL;
    const char *scale_args[3] = {NULL, NULL, NULL}; /* --scale, --a-scale, --b-scale */
    bool fast_accum = false;
    uint64_t v;
    int ch;

    *o = (bopts_t){.op = OVL_OP_AG_GEMM,
                   .dtype = OVL_DTYPE_BF16,
                   .warmup = 10,
                   .tune_ops = 120,
                   .settle_ms = 300,
                   .iters = 100,
                   .nb = 1,
                   .results = "-",
                   .check = true,
                   .label = "",
                   .timeout_s = 300,
                   .python = getenv("OVL_PYTHON") && *getenv("OVL_PYTHON") ? getenv("OVL_PYTHON")
                                                                           : "python3"};
    snprintf(o->job, sizeof(o->job), "bench-%d", (int)getpid());
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case O_SOCKET:
            o->socket = optarg;
            break;
        case O_DTYPE:
            if (ovl_dtype_parse(optarg, &o->dtype) != OVL_OK) {
                fprintf(stderr, "ovl-bench: unknown dtype '%s'\n", optarg);
                return -1;
            }
            break;
        case O_SHAPES:
            shapes_arg = optarg;
            break;
        case O_ALGOS:
            algos_arg = optarg;
            o->algos_given = true;
            break;
        case O_CHUNKS:
            chunks_arg = optarg;
            break;
        case O_RESULTS:
            o->results = optarg;
            break;
        case O_CHECK:
            o->check = true;
            break;
        case O_NOCHECK:
            o->check = false;
            break;
        case O_LABEL:
            o->label = optarg;
            break;
        case O_TORCH:
            if (access(optarg, R_OK) != 0) {
                fprintf(stderr, "ovl-bench: --torch-peer %s: %s\n", optarg, strerror(errno));
                return -1;
            }
            o->torch_peer = optarg;
            break;
        case O_PYTHON:
            o->python = optarg;
            break;
        case O_BDTYPE:
            b_dtype_arg = optarg;
            break;
        case O_OUTDTYPE:
            out_dtype_arg = optarg;
            break;
        case O_SCALE:
        case O_ASCALE:
        case O_BSCALE:
            scale_args[ch - O_SCALE] = optarg;
            break;
        case O_FASTACC:
            fast_accum = true;
            break;
        case O_OP:
            if (strcmp(optarg, "ag") != 0 && strcmp(optarg, "rs") != 0) {
                fprintf(stderr, "ovl-bench: --op '%s': ag or rs\n", optarg);
                return -1;
            }
            o->op = optarg[0] == 'r' ? OVL_OP_GEMM_RS : OVL_OP_AG_GEMM;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case O_BS:
            if (ovl_parse_u64(optarg, &v) != 0 || v < 1 || v > OVL_MAX_BS) {
                fprintf(stderr, "ovl-bench: --bs '%s': 1 to %d Bs per op\n", optarg, OVL_MAX_BS);
                return -1;
            }
            o->nb = (uint32_t)v;
            break;
        case O_SETTLE:
            if (ovl_parse_u64(optarg, &v) != 0 || v > 60000) {
                fprintf(stderr, "ovl-bench: --settle-ms '%s': 0 to 60000\n", optarg);
                return -1;
            }
            o->settle_ms = (int)v;
            break;
        case O_WORLD:
        case O_WARMUP:
        case O_TUNE_OPS:
        case O_ITERS:
        case O_TIMEOUT:
            if (ovl_parse_u64(optarg, &v) != 0 || v > 1000000) {
                fprintf(stderr, "ovl-bench: '%s' is not a number\n", optarg);
                return -1;
            }
            if (ch == O_WORLD)
                o->world = (uint32_t)v;
            else if (ch == O_WARMUP)
                o->warmup = (int)v;
            else if (ch == O_TUNE_OPS)
                o->tune_ops = (int)v;
            else if (ch == O_ITERS)
                o->iters = (int)v;
            else
                o->timeout_s = (int)v;
            break;
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ovl-bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    char rs_algos[] = "naive,collective,ring,push";
    bool rs = o->op == OVL_OP_GEMM_RS;
    if (parse_scaled(o, b_dtype_arg, out_dtype_arg, scale_args, fast_accum) != 0)
        return -1;
    if (!shapes_arg && o->sc.on)
        shapes_arg = rs ? fp8_rs_shapes : fp8_shapes;
    if (parse_list(shapes_arg ? shapes_arg : shapes, add_shape, o) != 0 ||
        parse_list(algos_arg ? algos_arg
                   : rs      ? rs_algos
                             : algos,
                   add_algo, o) != 0 ||
        parse_list(chunks_arg ? chunks_arg : chunks, add_chunks, o) != 0)
        return -1;
    if (o->nshapes == 0 || o->nalgos == 0 || o->nchunks == 0) {
        fprintf(stderr, "ovl-bench: empty --shapes, --algos or --chunks\n");
        return -1;
    }
    for (int a = 0; a < o->nalgos; a++) {
        ovl_op_kind_t kind = rs ? OVL_OP_GEMM_RS : OVL_OP_AG_GEMM;
        if (!ovl_op_kind_takes_algo(kind, o->algos[a])) {
            fprintf(stderr, "ovl-bench: algorithm %s: --op %s has %s\n", ovl_algo_name(o->algos[a]),
                    rs ? "rs" : "ag", ovl_op_kind_algos(kind));
            return -1;
        }
    }
    if (rs && o->nb != 1) {
        fprintf(stderr, "ovl-bench: --op rs takes one B\n");
        return -1;
    }
    if (o->sc.on && o->nb != 1) {
        fprintf(stderr, "ovl-bench: --bs %u: ovl-bench times scaled (fp8) ops of one B\n", o->nb);
        return -1;
    }
    for (int si = 0; si < o->nshapes && o->sc.on; si++) {
        /* cuBLASLt's fp8 GEMM: k and the rows of B and C in 16-byte
         * multiples (--op rs's K/W: main, once W is known) */
        if (o->shapes[si].K % 16 || o->shapes[si].N % 16) {
            char shp[64];
            snprintf(shp, sizeof(shp), "%" PRIu64 "x%" PRIu64 "x%" PRIu64, o->shapes[si].M,
                     o->shapes[si].K, o->shapes[si].N);
            fprintf(stderr,
                    "ovl-bench: shape %s: an fp8 GEMM needs K and N multiples of 16 (cuBLASLt's "
                    "fp8 layouts)\n",
                    shp);
            return -1;
        }
    }
    if (o->iters < 1 || o->iters > MAX_ITERS || o->warmup > MAX_ITERS || o->tune_ops > MAX_ITERS ||
        o->timeout_s < 1) {
        fprintf(stderr,
                "ovl-bench: --iters 1..%d, --warmup 0..%d, --tune-ops 0..%d, --timeout >= 1\n",
                MAX_ITERS, MAX_ITERS, MAX_ITERS);
        return -1;
    }
    /* The same configs in the same order on every rank: ovld matches ops by
     * their number, and ranks that disagree fail the job. */
    for (int a = 0; a < o->nalgos; a++) {
        if (o->algos[a] == OVL_ALGO_NAIVE) { /* one gather, one GEMM: no chunks */
            o->cfgs[o->ncfgs++] = (cfg_t){OVL_ALGO_NAIVE, 0};
            continue;
        }
        for (int c = 0; c < o->nchunks; c++)
            o->cfgs[o->ncfgs++] = (cfg_t){o->algos[a], o->chunks[c]};
    }
    return 0;
}

/* ------------------------------------------------------------ small helpers */

static void shape_str(char *buf, size_t len, shape_t s)
{
    snprintf(buf, len, "%" PRIu64 "x%" PRIu64 "x%" PRIu64, s.M, s.K, s.N);
}

static void cfg_str(char *buf, size_t len, cfg_t c)
{
    if (c.algo == OVL_ALGO_NAIVE)
        snprintf(buf, len, "%s", ovl_algo_name(c.algo));
    else
        snprintf(buf, len, "%s chunks %u", ovl_algo_name(c.algo), c.chunks);
}

/* The GPU of rank r: round-robin over the GPUs here. */
static int rank_device(const bopts_t *o, uint32_t r)
{
    return (int)(r % o->ngpu);
}

/* The GPUs the ranks use. */
static uint32_t gpus_used(const bopts_t *o)
{
    return o->world < o->ngpu ? o->world : o->ngpu;
}

/* Some GPU holds more than one rank. */
static bool ranks_share(const bopts_t *o)
{
    return o->world > o->ngpu;
}

/* How many ranks each GPU holds, in words: "1 rank per GPU", "2 ranks per
 * GPU, shared", "1 to 2 ranks per GPU, shared". */
static void share_str(char *buf, size_t len, const bopts_t *o)
{
    uint32_t lo = o->world / gpus_used(o), hi = (o->world + gpus_used(o) - 1) / gpus_used(o);
    if (lo == hi)
        snprintf(buf, len, "%u rank%s per GPU%s", lo, lo == 1 ? "" : "s",
                 ranks_share(o) ? ", shared" : "");
    else
        snprintf(buf, len, "%u to %u ranks per GPU, shared", lo, hi);
}

/* ", 3 Bs per op" where ops have several Bs, else "". */
static void bs_str(char *buf, size_t len, const bopts_t *o)
{
    if (o->nb > 1)
        snprintf(buf, len, ", %u Bs per op", o->nb);
    else if (len > 0)
        buf[0] = '\0';
}

/* The GEMM baseline's name: "gemm", or "gemm x3" for the GEMMs of 3 Bs. */
static void gemm_str(char *buf, size_t len, const bopts_t *o)
{
    if (o->nb > 1)
        snprintf(buf, len, "gemm x%u", o->nb);
    else
        snprintf(buf, len, "gemm");
}

static int cmp_float(const void *pa, const void *pb)
{
    float a = *(const float *)pa, b = *(const float *)pb;
    return (a > b) - (a < b);
}

/* Median, min and max of t[0..n) (n >= 1); sorts t. */
static void summarize(float *t, int n, double *med, double *mn, double *mx)
{
    qsort(t, (size_t)n, sizeof(*t), cmp_float);
    *med = n % 2 ? t[n / 2] : 0.5 * ((double)t[n / 2 - 1] + (double)t[n / 2]);
    *mn = t[0];
    *mx = t[n - 1];
}

/*
 * Per-op times from events e[0..n] recorded around n back-to-back ops on one
 * stream (the stream must be done): t_i = e[i+1] - e[i]. tmp holds n floats.
 */
static cudaError_t op_times(cudaEvent_t *e, int n, float *tmp, double *med, double *mn, double *mx)
{
    for (int i = 0; i < n; i++) {
        cudaError_t ce = cudaEventElapsedTime(&tmp[i], e[i], e[i + 1]);
        if (ce != cudaSuccess)
            return ce;
    }
    summarize(tmp, n, med, mn, mx);
    return cudaSuccess;
}

/*
 * Untimed ops before a measurement: --warmup, raised to about --settle-ms
 * of work at SETTLE_TFLOPS. A GPU under a sustained GEMM load does not keep
 * its first clock: on one H100 the SM clock fell from 1980 MHz to 1470-1600
 * within a fraction of a second of a 4096^3 bf16 loop and swung between the
 * two (bench/results/2026-11-24-offload-configs-798e606-h100.md), so a 20 ms measurement taken
 * first (the in-process GEMM) and one taken after 100 ms of load (an ovl config) compared two
 * clocks. Every measurement of a shape, ovl's configs and the baselines alike, settles for the same
 * count, which depends on the options and the shape only, so that every rank submits the same ops
 * (ovld matches them by number).
 */
#define SETTLE_TFLOPS  800.0
#define SETTLE_MAX_OPS 5000
static int settle_ops(const bopts_t *o, shape_t sh)
{
    double flop = 2.0 * (double)sh.M * (double)sh.N * (double)sh.K * (double)o->nb;
    /* fp8's tensor cores run twice bf16's rate: twice the ops for the same
     * time (bench/torch_peer.py settles so too) */
    double op_ms = flop / (SETTLE_TFLOPS * (o->sc.on ? 2 : 1) * 1e12) * 1e3;
    double n = op_ms > 0 ? ceil((double)o->settle_ms / op_ms) : 0;
    if (n > SETTLE_MAX_OPS)
        n = SETTLE_MAX_OPS;
    return (int)n > o->warmup ? (int)n : o->warmup;
}

/* C's dtype (and --op rs's partials'): --out-dtype when scaled, else the op's. */
static ovl_dtype_t c_dtype(const bopts_t *o)
{
    return ovl_demo_c_dtype(&o->sc, o->dtype);
}

/* The gather moves scales with A's rows: all-gather + GEMM scaled by row
 * or by 1x128 (by tensor every gathered row takes the rank's own one
 * scale). */
static bool gathers_scales(const bopts_t *o)
{
    return o->sc.on && o->op == OVL_OP_AG_GEMM && o->sc.a_mode != OVL_SCALE_TENSOR;
}

/* ------------------------------------------------------------ fp8 data, on the host */

/*
 * Part of one matrix of ovl-demo's data model (client/demo_scaled.h), made
 * on the host for a scaled op: element (i, j), i < rows, j < cols, is
 * element (row0 + i) * cols + j of matrix `which` of `rank`
 * (ovl_demo_value, numbered as ovl_demo_fill_host numbers a matrix of cols
 * columns) rounded to dt; stored into q (dt, at ldq) unless q is NULL, and
 * into f (fp32, at ldf) unless f is NULL, dequantized and times its scale
 * by `mode` (scale NULL: none): scale[0] by tensor, scale[i] by row, by
 * 1x128 scale[i * ceil(cols/128) + j/128], by 128x128 scale[(i/128) *
 * ceil(cols/128) + j/128] (i counted from scale's first row, as the
 * rows': 128x128 is B's, whose rows start at 0). The fp32 copy is the
 * reference's input: a row of A times its scales, a row of the transposed
 * B (a column of op(B)) times its; with block scales the fp32 product of
 * them is the block-scaled one (each 128 of k times its own scales).
 */
typedef struct hmat {
    ovl_dtype_t dt;
    void *q;
    uint64_t ldq;
    float *f;
    uint64_t ldf;
    uint64_t rows, cols, row0;
    uint32_t rank;
    int which;
    const float *scale;
    ovl_scale_mode_t mode;
} hmat_t;

typedef struct hpart {
    const hmat_t *m;
    uint64_t lo, hi; /* rows [lo, hi) */
} hpart_t;

static void *hmat_part(void *arg)
{
    const hpart_t *p = arg;
    const hmat_t *m = p->m;
    uint64_t kq = ovl_scale_blocks(m->cols);
    for (uint64_t i = p->lo; i < p->hi; i++) {
        const float *srow = !m->scale                     ? NULL
                            : m->mode == OVL_SCALE_TENSOR ? m->scale
                            : m->mode == OVL_SCALE_ROW    ? m->scale + i
                            : m->mode == OVL_SCALE_BLOCK_1X128
                                ? m->scale + i * kq
                                : m->scale + i / OVL_SCALE_BLOCK * kq;
        bool blocks = ovl_scale_mode_is_block(m->mode);
        for (uint64_t j = 0; j < m->cols; j++) {
            float s = !srow ? 1.0f : srow[blocks ? j / OVL_SCALE_BLOCK : 0];
            unsigned char e[4];
            float v = ovl_demo_value(SEED, m->rank, m->which, (m->row0 + i) * m->cols + j);
            ovl_store_elem(m->dt, e, 0, v);
            if (m->q)
                memcpy((char *)m->q + (i * m->ldq + j) * ovl_dtype_size(m->dt), e,
                       ovl_dtype_size(m->dt));
            if (m->f)
                m->f[i * m->ldf + j] = ovl_load_elem(m->dt, e, 0) * s;
        }
    }
    return NULL;
}

#define HMAT_MAX_THREADS 64

/* Makes m with up to nthreads threads, each a band of rows (the rest
 * inline where a thread cannot be had); returns when all is made. */
static void hmat_make(const hmat_t *m, int nthreads)
{
    pthread_t th[HMAT_MAX_THREADS];
    hpart_t part[HMAT_MAX_THREADS];
    uint64_t n = (uint64_t)(nthreads < 1                  ? 1
                            : nthreads > HMAT_MAX_THREADS ? HMAT_MAX_THREADS
                                                          : nthreads);
    if (n > m->rows)
        n = m->rows ? m->rows : 1;
    bool started[HMAT_MAX_THREADS] = {false};
    for (uint64_t t = 0; t < n; t++) {
        part[t] = (hpart_t){m, m->rows * t / n, m->rows * (t + 1) / n};
        if (t > 0)
            started[t] = pthread_create(&th[t], NULL, hmat_part, &part[t]) == 0;
    }
    hmat_part(&part[0]);
    for (uint64_t t = 1; t < n; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            hmat_part(&part[t]);
    }
}

/* Threads for making data on the host: the CPUs here, shared by the
 * processes that make data at once (the W ranks; the parent alone). */
static int host_threads(uint32_t procs)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    long t = n > 0 ? n / (long)(procs ? procs : 1) : 1;
    return t < 1 ? 1 : t > HMAT_MAX_THREADS ? HMAT_MAX_THREADS : (int)t;
}

/* cudaMalloc'ed *dst of bytes, filled from the host's src. */
static cudaError_t to_gpu(void **dst, const void *src, size_t bytes)
{
    cudaError_t ce = cudaMalloc(dst, bytes);
    return ce != cudaSuccess ? ce : cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice);
}

/* ------------------------------------------------------------ child -> parent */

enum { REC_CONFIG = 1, REC_FATAL = 2 };
enum { CHECK_NONE = 0, CHECK_OK = 1, CHECK_FAIL = 2 };

/* One record per (shape, config) and rank, in order; or one fatal record.
 * Smaller than PIPE_BUF, so that each write arrives whole. */
typedef struct rec {
    int32_t kind;
    int32_t shape, cfg;
    int32_t check;
    double med, min, max; /* ms per op */
    double rel_err;
    char msg[400];
} rec_t;

_Static_assert(sizeof(rec_t) <= 4096, "a record must fit one atomic pipe write");

/* What the probe child finds out before anything else touches CUDA. */
typedef struct probe {
    int ngpu;              /* 0: no GPU (reason in err) */
    int driver, runtime;   /* cudaDriverGetVersion, cudaRuntimeGetVersion */
    char gpu[256];         /* the name of GPU 0 */
    uint32_t ovld_devices; /* 0: ovld unusable (reason in daemon_err) */
    char ovld_version[32];
    char err[256];
    char daemon_err[400];
} probe_t;

static void write_all(int fd, const void *p, size_t len)
{
    /* A parent that is gone has nothing to read: the child just ends. */
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(1);
        p = (const char *)p + w;
        len -= (size_t)w;
    }
}

/* The children die with the parent, whatever kills it. */
static void die_with_parent(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
}

/* The probe child: GPUs, versions and ovld, reported through fd. */
static int probe_main(const bopts_t *o, int fd)
{
    probe_t p;
    memset(&p, 0, sizeof(p));
    cudaError_t ce = cudaGetDeviceCount(&p.ngpu);
    if (ce != cudaSuccess) {
        snprintf(p.err, sizeof(p.err), "cudaGetDeviceCount: %s", ovl_cuda_why(ce));
        p.ngpu = 0;
    } else if (p.ngpu == 0) {
        snprintf(p.err, sizeof(p.err), "cudaGetDeviceCount found no device");
    }
    if (p.ngpu > 0) {
        struct cudaDeviceProp prop;
        if ((ce = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
            snprintf(p.gpu, sizeof(p.gpu), "GPU (cudaGetDeviceProperties: %s)",
                     cudaGetErrorString(ce));
        else
            snprintf(p.gpu, sizeof(p.gpu), "%s", prop.name);
        if ((ce = cudaDriverGetVersion(&p.driver)) != cudaSuccess ||
            (ce = cudaRuntimeGetVersion(&p.runtime)) != cudaSuccess)
            snprintf(p.err, sizeof(p.err), "CUDA version: %s", cudaGetErrorString(ce));
        ovl_client_t *cl = NULL;
        ovl_daemon_info_t info;
        ovl_status_t st;
        if ((st = ovl_connect(o->socket, &cl)) != OVL_OK) {
            snprintf(p.daemon_err, sizeof(p.daemon_err), "ovl_connect: %s: %s", ovl_strerror(st),
                     ovl_connect_error());
        } else if ((st = ovl_daemon_info(cl, &info)) != OVL_OK) {
            snprintf(p.daemon_err, sizeof(p.daemon_err), "ovl_daemon_info: %s: %s",
                     ovl_strerror(st), ovl_last_error(cl));
        } else if (strcmp(info.backend, "cuda") != 0) {
            snprintf(p.daemon_err, sizeof(p.daemon_err),
                     "ovld (pid %d) runs the '%s' backend, not 'cuda'", (int)info.pid,
                     info.backend);
        } else if (info.ndevices == 0) {
            snprintf(p.daemon_err, sizeof(p.daemon_err), "ovld has no devices");
        } else {
            p.ovld_devices = info.ndevices;
            snprintf(p.ovld_version, sizeof(p.ovld_version), "%s", info.version);
        }
        ovl_disconnect(cl);
    }
    write_all(fd, &p, sizeof(p));
    return 0;
}

/* ------------------------------------------------------------ a rank */

typedef struct rank_ctx {
    const bopts_t *o;
    uint32_t rank;
    int fd;
    ovl_client_t *cl;
    ovl_comm_t *comm;
    cudaStream_t s;
    cudaEvent_t *ev; /* iters + 1 */
    float *tmp;      /* iters */
    ovld_lt_t *lt;   /* the reference GEMM */
    void *ws;
    double *acc; /* the error accumulator, 3 doubles on the GPU */
    int shape, cfg;
    char where[160]; /* the shape and config at hand, for messages */
    bool failed;     /* a fatal record was sent */
} rank_ctx_t;

/* Sends the fatal record (once) naming the rank, what it was doing and why. */
static void rank_fail(rank_ctx_t *x, const char *fmt, ...)
{
    if (x->failed)
        return;
    x->failed = true;
    rec_t r;
    memset(&r, 0, sizeof(r));
    r.kind = REC_FATAL;
    r.shape = x->shape;
    r.cfg = x->cfg;
    int n = snprintf(r.msg, sizeof(r.msg), "rank %u, %s: ", x->rank, x->where);
    if (n < 0 || (size_t)n >= sizeof(r.msg))
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.msg + n, sizeof(r.msg) - (size_t)n, fmt, ap);
    va_end(ap);
    write_all(x->fd, &r, sizeof(r));
}

#define RCUDA(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rank_fail(x, "%s: %s", #call, cudaGetErrorString(e_));                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define ROVL(call)                                                                                 \
    do {                                                                                           \
        ovl_status_t s_ = (call);                                                                  \
        if (s_ != OVL_OK) {                                                                        \
            rank_fail(x, "%s: %s: %s", #call, ovl_strerror(s_), ovl_last_error(x->cl));            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/*
 * Makes ovld forget a buffer before it is freed (freeing memory ovld still
 * maps is undefined): registering one byte of it returns the registration
 * ops made, and deregistering that waits for ovld's unmap. The comm's ops
 * must be done. NULL is a no-op.
 */
static ovl_status_t forget(rank_ctx_t *x, void *p)
{
    ovl_mem_t *mem;
    if (!p)
        return OVL_OK;
    ovl_status_t st = ovl_mem_register(x->cl, p, 1, &mem);
    return st != OVL_OK ? st : ovl_mem_deregister(x->cl, mem);
}

/* A shape's device buffers once its ops are done: ovld forgets each (it
 * unmaps them), then they are freed; the first failure of either is this
 * rank's (*rc -1 after rank_fail, where *rc was 0). NULLs are skipped. */
static void forget_free(rank_ctx_t *x, void *const *bufs, int n, int *rc)
{
    for (int i = 0; i < n; i++) {
        ovl_status_t st = forget(x, bufs[i]);
        if (st != OVL_OK && *rc == 0) {
            rank_fail(x, "ovl_mem_register/ovl_mem_deregister: %s: %s", ovl_strerror(st),
                      ovl_last_error(x->cl));
            *rc = -1;
        }
        cudaError_t ce = cudaFree(bufs[i]);
        if (ce != cudaSuccess && *rc == 0) {
            rank_fail(x, "cudaFree: %s", cudaGetErrorString(ce));
            *rc = -1;
        }
    }
}

/*
 * The fp32 reference of one shape on this rank (ovl_demo_reference), with
 * this rank's B (b, of dtype). On success *ret_ref is M x N fp32 (caller
 * frees); the temporaries are freed here.
 */
static int make_reference(rank_ctx_t *x, shape_t sh, const void *b, float **ret_ref)
{
    const bopts_t *o = x->o;
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t M = sh.M, K = sh.K, N = sh.N, m = M / o->world;
    char *ga = NULL;
    float *ga32 = NULL, *b32 = NULL, *ref = NULL;
    int rc = -1;
    char err[256];

    RCUDA(cudaMalloc((void **)&ga, M * K * es));
    RCUDA(cudaMalloc((void **)&ga32, M * K * sizeof(float)));
    RCUDA(cudaMalloc((void **)&b32, K * N * sizeof(float)));
    RCUDA(cudaMalloc((void **)&ref, M * N * sizeof(float)));
    RCUDA(ovl_demo_to_f32(dt, b, K, N, N, b32, x->s));
    if (ovl_demo_reference(x->lt, x->ws, dt, o->world, m, N, K, SEED, b32, false, ga, ga32, ref,
                           x->s, err, sizeof(err)) != OVL_OK) {
        rank_fail(x, "%s", err);
        goto out;
    }
    RCUDA(cudaStreamSynchronize(x->s));
    RCUDA(cudaFree(ga));
    ga = NULL;
    RCUDA(cudaFree(ga32));
    ga32 = NULL;
    RCUDA(cudaFree(b32));
    b32 = NULL;
    *ret_ref = ref;
    ref = NULL;
    rc = 0;
out:
    if (rc != 0 && x->s)
        cudaStreamSynchronize(x->s);
    cudaFree(ga);
    cudaFree(ga32);
    cudaFree(b32);
    cudaFree(ref);
    return rc;
}

/* C i of an op and its leading dimension (i < the op's nb). */
static void *desc_c(const ovl_ag_gemm_desc_t *d, uint32_t i, size_t *ret_ldc)
{
    *ret_ldc = i == 0 ? d->ldc : d->more_bs[i - 1].ldc;
    return i == 0 ? d->c : d->more_bs[i - 1].c;
}

/* One op of the config at hand: an all-gather + GEMM (d), or a GEMM +
 * reduce-scatter (rs) where d is NULL. */
static ovl_status_t submit(rank_ctx_t *x, const ovl_ag_gemm_desc_t *d, const ovl_gemm_rs_desc_t *rs)
{
    return d ? ovl_allgather_gemm(x->comm, d, x->s) : ovl_gemm_reduce_scatter(x->comm, rs, x->s);
}

/*
 * One config on one shape: warmup (settle_ops), then iters ops back to back with an event
 * before the first and after each, then the check of every C i against
 * ref[i] (the op's nb of them; the error is the worst). Fills *r. The op
 * is d's all-gather + GEMM, or where d is NULL rs's GEMM + reduce-scatter
 * (its one C, M/W x N, against ref[0]). A scaled op's C is in --out-dtype,
 * checked to ovl_demo_scaled_tolerance.
 */
static int run_config(rank_ctx_t *x, const ovl_ag_gemm_desc_t *d, const ovl_gemm_rs_desc_t *rs,
                      float *const *ref, rec_t *r)
{
    const bopts_t *o = x->o;
    /* the rows of every C and their count; an RS op's one C is its block */
    uint64_t M = d ? d->m * o->world : rs->m / o->world;
    uint32_t nb = d && d->nb ? d->nb : 1;
    ovl_dtype_t dt = ovl_demo_c_dtype(&o->sc, d ? d->dtype : rs->dtype); /* C's */
    uint64_t n = d ? d->n : rs->n;
    size_t ldc;
    int rc = -1;

    for (uint32_t i = 0; i < nb; i++) { /* NaN: an unwritten C shows */
        void *c = d ? desc_c(d, i, &ldc) : (ldc = rs->ldc, rs->c);
        RCUDA(cudaMemsetAsync(c, 0xff, M * ldc * ovl_dtype_size(dt), x->s));
    }
    int nwarm = settle_ops(o, o->shapes[x->shape]);
    /* auto: ovld measures the first ops of a new shape; the timed ones
     * must be its choice's (the same count on every rank) */
    if ((d ? d->algo : rs->algo) == OVL_ALGO_AUTO && nwarm < o->tune_ops)
        nwarm = o->tune_ops;
    for (int i = 0; i < nwarm; i++) {
        if (i > 0 && i % SUBMIT_WINDOW == 0)
            RCUDA(cudaStreamSynchronize(x->s));
        ROVL(submit(x, d, rs));
    }
    /* The timed ops start on an idle stream; the ranks leave this wait at
     * slightly different times, which only the first op can see. */
    RCUDA(cudaStreamSynchronize(x->s));
    ROVL(ovl_comm_check(x->comm));

    RCUDA(cudaEventRecord(x->ev[0], x->s));
    for (int i = 0; i < o->iters; i++) {
        if (i >= SUBMIT_WINDOW)
            RCUDA(cudaEventSynchronize(x->ev[i - SUBMIT_WINDOW + 1]));
        ROVL(submit(x, d, rs));
        RCUDA(cudaEventRecord(x->ev[i + 1], x->s));
    }
    /* A failed op still rings its doorbell, so the stream never waits
     * forever on ovld's account; the parent's timeout covers the rest. */
    RCUDA(cudaStreamSynchronize(x->s));
    ROVL(ovl_comm_synchronize(x->comm));
    RCUDA(op_times(x->ev, o->iters, x->tmp, &r->med, &r->min, &r->max));

    r->check = CHECK_NONE;
    r->rel_err = NAN;
    if (o->check) {
        double h[3];
        r->rel_err = 0;
        for (uint32_t i = 0; i < nb; i++) { /* every B has the shape's N */
            void *c = d ? desc_c(d, i, &ldc) : (ldc = rs->ldc, rs->c);
            RCUDA(cudaMemsetAsync(x->acc, 0, sizeof(h), x->s));
            RCUDA(ovl_demo_error_acc(dt, c, ldc, ref[i], M, n, x->acc, x->s));
            RCUDA(cudaMemcpyAsync(h, x->acc, sizeof(h), cudaMemcpyDeviceToHost, x->s));
            RCUDA(cudaStreamSynchronize(x->s));
            double e = ovl_demo_rel_error(h);
            if (!(e <= r->rel_err)) /* NaN counts as worse */
                r->rel_err = e;
        }
        r->check = r->rel_err < ovl_demo_scaled_tolerance(&o->sc, o->dtype) ? CHECK_OK : CHECK_FAIL;
    }
    rc = 0;
out:
    return rc;
}

/*
 * One shape on this rank: buffers (allocated once for all its configs: A,
 * and o->nb Bs and Cs), the references, every config in order, one record
 * each; then ovld forgets the buffers and they are freed.
 */
static int rank_shape(rank_ctx_t *x, int si)
{
    const bopts_t *o = x->o;
    shape_t sh = o->shapes[si];
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t M = sh.M, K = sh.K, N = sh.N, m = M / o->world;
    void *a = NULL, *b[OVL_MAX_BS] = {NULL}, *c[OVL_MAX_BS] = {NULL};
    float *ref[OVL_MAX_BS] = {NULL};
    ovl_ag_gemm_b_t more[OVL_MAX_BS - 1]; /* B 1 .. of the op */
    char shp[64], cs[48];
    int rc = -1;

    shape_str(shp, sizeof(shp), sh);
    x->shape = si;
    x->cfg = -1;
    snprintf(x->where, sizeof(x->where), "shape %s, setup", shp);
    RCUDA(cudaMalloc(&a, m * K * es));
    RCUDA(ovl_demo_fill(dt, a, m, K, K, SEED, x->rank, 0, x->s));
    /* B i is matrix 1 + i of the rank (B 0 the one B of a single-B run) */
    for (uint32_t i = 0; i < o->nb; i++) {
        RCUDA(cudaMalloc(&b[i], K * N * es));
        RCUDA(cudaMalloc(&c[i], M * N * es));
        RCUDA(ovl_demo_fill(dt, b[i], K, N, N, SEED, x->rank, 1 + (int)i, x->s));
        if (i > 0)
            more[i - 1] = (ovl_ag_gemm_b_t){.b = b[i], .ldb = N, .c = c[i], .ldc = N, .n = N};
    }
    if (o->check) {
        snprintf(x->where, sizeof(x->where), "shape %s, reference", shp);
        for (uint32_t i = 0; i < o->nb; i++)
            if (make_reference(x, sh, b[i], &ref[i]) != 0)
                goto out;
    }
    RCUDA(cudaStreamSynchronize(x->s));

    for (int ci = 0; ci < o->ncfgs; ci++) {
        cfg_str(cs, sizeof(cs), o->cfgs[ci]);
        x->cfg = ci;
        snprintf(x->where, sizeof(x->where), "shape %s, %s", shp, cs);
        ovl_ag_gemm_desc_t d = {.a = a,
                                .lda = K,
                                .b = b[0],
                                .ldb = N,
                                .transb = 0,
                                .c = c[0],
                                .ldc = N,
                                .a_out = NULL,
                                .lda_out = 0,
                                .m = m,
                                .n = N,
                                .k = K,
                                .dtype = dt,
                                .algo = o->cfgs[ci].algo,
                                .chunks = o->cfgs[ci].chunks,
                                .streams = 0,
                                .nb = o->nb,
                                .more_bs = o->nb > 1 ? more : NULL};
        rec_t r;
        memset(&r, 0, sizeof(r));
        r.kind = REC_CONFIG;
        r.shape = si;
        r.cfg = ci;
        if (run_config(x, &d, NULL, ref, &r) != 0)
            goto out;
        write_all(x->fd, &r, sizeof(r));
    }
    x->cfg = -1;
    snprintf(x->where, sizeof(x->where), "shape %s, cleanup", shp);
    rc = 0;
out:
    if (x->s)
        cudaStreamSynchronize(x->s);
    /* ovld unmaps the buffers before they are freed: first its ops, then them. */
    if (x->comm)
        (void)ovl_comm_synchronize(x->comm); /* an op's error was reported above */
    void *bufs[1 + 2 * OVL_MAX_BS] = {a};
    for (uint32_t i = 0; i < OVL_MAX_BS; i++) {
        bufs[1 + 2 * i] = b[i];
        bufs[2 + 2 * i] = c[i];
    }
    forget_free(x, bufs, 1 + 2 * OVL_MAX_BS, &rc);
    for (uint32_t i = 0; i < OVL_MAX_BS; i++) {
        cudaError_t ce = cudaFree(ref[i]);
        if (ce != cudaSuccess && rc == 0) {
            rank_fail(x, "cudaFree (reference): %s", cudaGetErrorString(ce));
            rc = -1;
        }
    }
    return rc;
}

/*
 * The references' product: ref (rows x n, fp32) = a32 (rows x k) @ op(b32)
 * (k x n, or n x k with transb), by cuBLASLt in plain fp32 on this rank's
 * stream, waited for. 0, or -1 after rank_fail.
 */
static int ref_gemm_f32(rank_ctx_t *x, const float *a32, const float *b32, uint64_t rows,
                        uint64_t n, uint64_t k, bool transb, float *ref)
{
    char err[256];
    ovld_gemm_args_t g = {.dtype = OVL_DTYPE_FP32,
                          .rows = rows,
                          .n = n,
                          .k = k,
                          .nblocks = 1,
                          .block_stride = 0,
                          .a = {(void *)a32, k},
                          .b = {(void *)b32, transb ? k : n},
                          .c = {ref, n},
                          .transb = transb};
    ovl_status_t st = ovld_lt_gemm(x->lt, x->s, x->ws, OVLD_LT_WORKSPACE, &g, err, sizeof(err));
    if (st != OVL_OK) {
        rank_fail(x, "the reference GEMM (fp32): %s: %s", ovl_strerror(st), err);
        return -1;
    }
    cudaError_t ce = cudaStreamSynchronize(x->s);
    if (ce != cudaSuccess) {
        rank_fail(x, "the reference GEMM (fp32): cudaStreamSynchronize: %s",
                  cudaGetErrorString(ce));
        return -1;
    }
    return 0;
}

/*
 * GEMM + reduce-scatter's reference on this rank (--op rs): the sum over
 * the ranks q of A_q @ B_q, the rows of this rank's block, as ONE fp32
 * product of every rank's A side by side (its block's rows: M/W x K) and
 * every rank's B stacked (K x N). On success *ret_ref is M/W x N fp32
 * (caller frees); the temporaries are freed here.
 */
static int make_reference_rs(rank_ctx_t *x, shape_t sh, float **ret_ref)
{
    const bopts_t *o = x->o;
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t M = sh.M, K = sh.K, N = sh.N, W = o->world, kq = K / W, mb = M / W;
    char *tmp = NULL, *acat = NULL, *bcat = NULL;
    float *a32 = NULL, *b32 = NULL, *ref = NULL;
    int rc = -1;

    RCUDA(cudaMalloc((void **)&tmp, M * kq * es));
    RCUDA(cudaMalloc((void **)&acat, mb * K * es));
    RCUDA(cudaMalloc((void **)&bcat, K * N * es));
    RCUDA(cudaMalloc((void **)&a32, mb * K * sizeof(float)));
    RCUDA(cudaMalloc((void **)&b32, K * N * sizeof(float)));
    RCUDA(cudaMalloc((void **)&ref, mb * N * sizeof(float)));
    for (uint64_t q = 0; q < W; q++) {
        /* rank q's A (matrix 0) whole, then its rows of this rank's block
         * into columns [q kq, (q+1) kq); its B (matrix 1) into rows there */
        RCUDA(ovl_demo_fill(dt, tmp, M, kq, kq, SEED, (uint32_t)q, 0, x->s));
        RCUDA(cudaMemcpy2DAsync(acat + q * kq * es, K * es, tmp + x->rank * mb * kq * es, kq * es,
                                kq * es, mb, cudaMemcpyDeviceToDevice, x->s));
        RCUDA(ovl_demo_fill(dt, bcat + q * kq * N * es, kq, N, N, SEED, (uint32_t)q, 1, x->s));
    }
    RCUDA(ovl_demo_to_f32(dt, acat, mb, K, K, a32, x->s));
    RCUDA(ovl_demo_to_f32(dt, bcat, K, N, N, b32, x->s));
    if (ref_gemm_f32(x, a32, b32, mb, N, K, false, ref) != 0)
        goto out;
    *ret_ref = ref;
    ref = NULL;
    rc = 0;
out:
    if (x->s)
        cudaStreamSynchronize(x->s);
    cudaFree(tmp);
    cudaFree(acat);
    cudaFree(bcat);
    cudaFree(a32);
    cudaFree(b32);
    cudaFree(ref);
    return rc;
}

/*
 * One shape of --op rs on this rank: A (M x K/W, matrix 0 of the rank), B
 * (K/W x N, matrix 1), C (M/W x N), the reference, every config in order,
 * one record each; then ovld forgets the buffers and they are freed.
 */
static int rank_shape_rs(rank_ctx_t *x, int si)
{
    const bopts_t *o = x->o;
    shape_t sh = o->shapes[si];
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t M = sh.M, K = sh.K, N = sh.N, W = o->world, kq = K / W, mb = M / W;
    void *a = NULL, *b = NULL, *c = NULL;
    float *ref[1] = {NULL};
    char shp[64], cs[48];
    int rc = -1;

    shape_str(shp, sizeof(shp), sh);
    x->shape = si;
    x->cfg = -1;
    snprintf(x->where, sizeof(x->where), "shape %s, setup", shp);
    if (M % W || K % W) {
        rank_fail(x, "M and K must be multiples of the world %" PRIu64, W);
        goto out;
    }
    RCUDA(cudaMalloc(&a, M * kq * es));
    RCUDA(cudaMalloc(&b, kq * N * es));
    RCUDA(cudaMalloc(&c, mb * N * es));
    RCUDA(ovl_demo_fill(dt, a, M, kq, kq, SEED, x->rank, 0, x->s));
    RCUDA(ovl_demo_fill(dt, b, kq, N, N, SEED, x->rank, 1, x->s));
    if (o->check) {
        snprintf(x->where, sizeof(x->where), "shape %s, reference", shp);
        if (make_reference_rs(x, sh, &ref[0]) != 0)
            goto out;
    }
    RCUDA(cudaStreamSynchronize(x->s));
    for (int ci = 0; ci < o->ncfgs; ci++) {
        cfg_str(cs, sizeof(cs), o->cfgs[ci]);
        x->cfg = ci;
        snprintf(x->where, sizeof(x->where), "shape %s, %s", shp, cs);
        ovl_gemm_rs_desc_t d = {.a = a,
                                .lda = kq,
                                .b = b,
                                .ldb = N,
                                .transb = 0,
                                .c = c,
                                .ldc = N,
                                .m = M,
                                .n = N,
                                .k = kq,
                                .dtype = dt,
                                .reduce_op = OVL_REDUCE_SUM,
                                .algo = o->cfgs[ci].algo,
                                .chunks = o->cfgs[ci].chunks,
                                .streams = 0};
        rec_t r;
        memset(&r, 0, sizeof(r));
        r.kind = REC_CONFIG;
        r.shape = si;
        r.cfg = ci;
        if (run_config(x, NULL, &d, ref, &r) != 0)
            goto out;
        write_all(x->fd, &r, sizeof(r));
    }
    x->cfg = -1;
    snprintf(x->where, sizeof(x->where), "shape %s, cleanup", shp);
    rc = 0;
out:
    if (x->s)
        cudaStreamSynchronize(x->s);
    if (x->comm)
        (void)ovl_comm_synchronize(x->comm); /* an op's error was reported above */
    void *bufs[3] = {a, b, c};
    forget_free(x, bufs, 3, &rc);
    cudaFree(ref[0]);
    return rc;
}

/*
 * The host half of make_reference_scaled (host memory only, so that it can
 * be checked without a GPU): the dequantized inputs of rank's reference in
 * fp32, each fp8 value times its scale (its row's, or its block's: with
 * block scales the fp32 product of the two is the sum over the blocks of
 * 128 of each rank's k, each block scaled by its own, as ovld's GEMM
 * takes it). All-gather + GEMM: ha, M x
 * K, every rank's shard stacked; hb, N x K, rank's B. GEMM + reduce-scatter:
 * ha, M/W x K, every rank q's rows of rank's block in columns [q K/W, (q+1)
 * K/W); hb, N x K, every rank's B in the same columns. 0, or -1 (out of
 * memory).
 */
static int scaled_ref_inputs(const bopts_t *o, shape_t sh, uint32_t rank, float *ha, float *hb)
{
    const ovl_demo_scaled_t *sc = &o->sc;
    bool rs = o->op == OVL_OP_GEMM_RS, one = sc->a_mode == OVL_SCALE_TENSOR;
    uint64_t M = sh.M, K = sh.K, N = sh.N, W = o->world, m = M / W, kq = rs ? K / W : K;
    uint64_t arows = rs ? M : m; /* a rank's A, whose scales are made whole */
    uint64_t na = ovl_demo_a_scales(sc, arows, kq), nb = ovl_demo_b_scales(sc, N, kq);
    int nthr = host_threads(o->world);
    float *sq = malloc((na > nb ? na : nb) * sizeof(float) + 1); /* one rank's scales */
    if (!sq)
        return -1;
    for (uint32_t q = 0; q < o->world; q++) {
        hmat_t a = {.dt = o->dtype,
                    .ldf = K,
                    .rows = m,
                    .cols = kq,
                    .rank = q,
                    .which = 0,
                    .scale = sq,
                    .mode = sc->a_mode};
        ovl_demo_fill_a_scale(sc, sq, arows, kq, SEED, q);
        if (rs) { /* q's rows of this block, into columns [q kq, (q+1) kq) */
            a.f = ha + q * kq;
            a.row0 = (uint64_t)rank * m;
            if (!one) /* the block's rows' scales (by 1x128 a row of them each) */
                a.scale = sq + rank * m * ovl_demo_a_scale_cols(&o->sc, kq);
        } else { /* q's shard, rows [q m, (q+1) m) */
            a.f = ha + q * m * K;
        }
        hmat_make(&a, nthr);
        if (!rs && q != rank)
            continue; /* all-gather + GEMM: this rank's B only */
        ovl_demo_fill_b_scale(sc, sq, N, kq, SEED, q);
        hmat_t b = {.dt = sc->b_dtype,
                    .f = hb + (rs ? q * kq : 0),
                    .ldf = K,
                    .rows = N,
                    .cols = kq,
                    .rank = q,
                    .which = 1,
                    .scale = sq,
                    .mode = sc->b_mode};
        hmat_make(&b, nthr);
    }
    free(sq);
    return 0;
}

/*
 * A scaled op's reference on this rank (either kind): the cuBLASLt fp32
 * product of the dequantized inputs, every input rebuilt on the host from
 * the seed (hmat_t: each fp8 value times its row's scale, in fp32), copied
 * to the GPU and multiplied there (transb). All-gather + GEMM: every
 * rank's A (m x K) stacked, M x K, by this rank's B (N x K); C is M x N.
 * GEMM + reduce-scatter: the sum over the ranks q of A_q @ op(B_q) as one
 * product, every rank's rows of this rank's block side by side (M/W x K,
 * A_q's columns in block q) by every rank's B side by side (N x K); C is
 * M/W x N. On success *ret_ref is that C, fp32 (caller frees).
 */
static int make_reference_scaled(rank_ctx_t *x, shape_t sh, float **ret_ref)
{
    const bopts_t *o = x->o;
    bool rs = o->op == OVL_OP_GEMM_RS;
    uint64_t M = sh.M, K = sh.K, N = sh.N, m = M / o->world;
    uint64_t rrows = rs ? m : M; /* the reference's rows; rs: the block's (M/W) */
    float *ha = malloc(rrows * K * sizeof(float) + 1), *hb = malloc(N * K * sizeof(float) + 1);
    float *a32 = NULL, *b32 = NULL, *ref = NULL;
    int rc = -1;

    if (!ha || !hb || scaled_ref_inputs(o, sh, x->rank, ha, hb) != 0) {
        rank_fail(x, "out of memory for the reference");
        goto out;
    }
    RCUDA(to_gpu((void **)&a32, ha, rrows * K * sizeof(float)));
    RCUDA(to_gpu((void **)&b32, hb, N * K * sizeof(float)));
    RCUDA(cudaMalloc((void **)&ref, rrows * N * sizeof(float)));
    if (ref_gemm_f32(x, a32, b32, rrows, N, K, true, ref) != 0)
        goto out;
    *ret_ref = ref;
    ref = NULL;
    rc = 0;
out:
    if (x->s)
        cudaStreamSynchronize(x->s);
    cudaFree(a32);
    cudaFree(b32);
    cudaFree(ref);
    free(ha);
    free(hb);
    return rc;
}

/*
 * One shape of a scaled (fp8) op on this rank, either kind. All-gather +
 * GEMM: A m x K (matrix 0 of the rank), B N x K transposed (matrix 1), C
 * M x N, A's scales (ovl_demo_a_scales of m rows) and B's
 * (ovl_demo_b_scales); GEMM + reduce-scatter: A M x K/W, B N x K/W, C M/W
 * x N, A's scales (of M rows and K/W) and B's. The
 * data are made on the host (ovl-demo's model: hmat_t, demo_scaled.h's
 * scales) and copied; then the reference, every config in order, one
 * record each; then ovld forgets the buffers and they are freed.
 */
static int rank_shape_scaled(rank_ctx_t *x, int si)
{
    const bopts_t *o = x->o;
    const ovl_demo_scaled_t *sc = &o->sc;
    shape_t sh = o->shapes[si];
    bool rs = o->op == OVL_OP_GEMM_RS;
    ovl_dtype_t dt = o->dtype;
    size_t bes = ovl_dtype_size(sc->b_dtype), ces = ovl_dtype_size(sc->out_dtype);
    uint64_t M = sh.M, K = sh.K, N = sh.N, W = o->world, m = M / W;
    uint64_t arows = rs ? M : m, k = rs ? K / W : K, crows = rs ? m : M;
    size_t sa_bytes = ovl_demo_a_scales(sc, arows, k) * sizeof(float);
    size_t sb_bytes = ovl_demo_b_scales(sc, N, k) * sizeof(float);
    void *a = NULL, *b = NULL, *c = NULL, *ha = NULL, *hb = NULL;
    float *sa = NULL, *sb = NULL, *hsa = NULL, *hsb = NULL;
    float *ref[1] = {NULL};
    char shp[64], cs[48];
    int rc = -1;

    shape_str(shp, sizeof(shp), sh);
    x->shape = si;
    x->cfg = -1;
    snprintf(x->where, sizeof(x->where), "shape %s, setup", shp);
    if (M % W || (rs && K % W)) {
        rank_fail(x, "M%s must be multiples of the world %" PRIu64, rs ? " and K" : "", W);
        goto out;
    }
    ha = malloc(arows * k + 1);
    hb = malloc(N * k * bes + 1);
    hsa = malloc(sa_bytes + 1);
    hsb = malloc(sb_bytes + 1);
    if (!ha || !hb || !hsa || !hsb) {
        rank_fail(x, "out of memory");
        goto out;
    }
    int nthr = host_threads(o->world);
    hmat_t ma = {.dt = dt, .q = ha, .ldq = k, .rows = arows, .cols = k, .rank = x->rank};
    hmat_t mb = {
        .dt = sc->b_dtype, .q = hb, .ldq = k, .rows = N, .cols = k, .rank = x->rank, .which = 1};
    hmat_make(&ma, nthr);
    hmat_make(&mb, nthr);
    ovl_demo_fill_a_scale(sc, hsa, arows, k, SEED, x->rank);
    ovl_demo_fill_b_scale(sc, hsb, N, k, SEED, x->rank);
    RCUDA(to_gpu(&a, ha, arows * k));
    RCUDA(to_gpu(&b, hb, N * k * bes));
    RCUDA(to_gpu((void **)&sa, hsa, sa_bytes));
    RCUDA(to_gpu((void **)&sb, hsb, sb_bytes));
    RCUDA(cudaMalloc(&c, crows * N * ces));
    free(ha);
    free(hb);
    ha = hb = NULL;
    if (o->check) {
        snprintf(x->where, sizeof(x->where), "shape %s, reference", shp);
        if (make_reference_scaled(x, sh, &ref[0]) != 0)
            goto out;
    }
    RCUDA(cudaStreamSynchronize(x->s));
    ovl_scaling_t scaling = ovl_demo_scaling(sc, sa, sb, NULL);
    for (int ci = 0; ci < o->ncfgs; ci++) {
        cfg_str(cs, sizeof(cs), o->cfgs[ci]);
        x->cfg = ci;
        snprintf(x->where, sizeof(x->where), "shape %s, %s", shp, cs);
        rec_t r;
        memset(&r, 0, sizeof(r));
        r.kind = REC_CONFIG;
        r.shape = si;
        r.cfg = ci;
        if (rs) {
            ovl_gemm_rs_desc_t d = {.a = a,
                                    .lda = k,
                                    .b = b,
                                    .ldb = k,
                                    .transb = 1,
                                    .c = c,
                                    .ldc = N,
                                    .m = M,
                                    .n = N,
                                    .k = k,
                                    .dtype = dt,
                                    .reduce_op = OVL_REDUCE_SUM,
                                    .algo = o->cfgs[ci].algo,
                                    .chunks = o->cfgs[ci].chunks,
                                    .streams = 0,
                                    .scaling = &scaling};
            if (run_config(x, NULL, &d, ref, &r) != 0)
                goto out;
        } else {
            ovl_ag_gemm_desc_t d = {.a = a,
                                    .lda = K,
                                    .b = b,
                                    .ldb = K,
                                    .transb = 1,
                                    .c = c,
                                    .ldc = N,
                                    .a_out = NULL,
                                    .lda_out = 0,
                                    .m = m,
                                    .n = N,
                                    .k = K,
                                    .dtype = dt,
                                    .algo = o->cfgs[ci].algo,
                                    .chunks = o->cfgs[ci].chunks,
                                    .streams = 0,
                                    .nb = 1,
                                    .more_bs = NULL,
                                    .scaling = &scaling};
            if (run_config(x, &d, NULL, ref, &r) != 0)
                goto out;
        }
        write_all(x->fd, &r, sizeof(r));
    }
    x->cfg = -1;
    snprintf(x->where, sizeof(x->where), "shape %s, cleanup", shp);
    rc = 0;
out:
    if (x->s)
        cudaStreamSynchronize(x->s);
    if (x->comm)
        (void)ovl_comm_synchronize(x->comm); /* an op's error was reported above */
    void *bufs[5] = {a, b, c, sa, sb};
    forget_free(x, bufs, 5, &rc);
    cudaFree(ref[0]);
    free(ha);
    free(hb);
    free(hsa);
    free(hsb);
    return rc;
}

/* A rank process: joins the job on GPU rank_device(rank), runs every
 * shape, reports through fd. Returns the exit status. */
static int rank_main(const bopts_t *o, uint32_t rank, int fd)
{
    rank_ctx_t ctx = {.o = o, .rank = rank, .fd = fd, .shape = -1, .cfg = -1};
    rank_ctx_t *x = &ctx;
    int rc = 1;
    char err[256];
    ovl_status_t st;

    int dev = rank_device(o, rank);
    snprintf(x->where, sizeof(x->where), "setup (GPU %d)", dev);
    /* The device first, so that nothing makes a context on another GPU. */
    RCUDA(cudaSetDevice(dev));
    if ((st = ovl_connect(o->socket, &x->cl)) != OVL_OK) {
        rank_fail(x, "ovl_connect: %s: %s", ovl_strerror(st), ovl_connect_error());
        goto out;
    }
    ovl_set_timeout(x->cl, CLIENT_TIMEOUT_MS);
    ROVL(ovl_comm_init(x->cl, o->job, o->world, rank, dev, &x->comm));
    RCUDA(cudaStreamCreateWithFlags(&x->s, cudaStreamNonBlocking));
    x->ev = calloc((size_t)o->iters + 1, sizeof(*x->ev));
    x->tmp = calloc((size_t)o->iters, sizeof(*x->tmp));
    if (!x->ev || !x->tmp) {
        rank_fail(x, "out of memory");
        goto out;
    }
    for (int i = 0; i <= o->iters; i++)
        RCUDA(cudaEventCreate(&x->ev[i]));
    if (o->check) {
        if ((st = ovld_lt_create(&x->lt, err, sizeof(err))) != OVL_OK) {
            rank_fail(x, "ovld_lt_create: %s: %s", ovl_strerror(st), err);
            goto out;
        }
        RCUDA(cudaMalloc(&x->ws, OVLD_LT_WORKSPACE));
        RCUDA(cudaMalloc((void **)&x->acc, 3 * sizeof(double)));
    }
    for (int si = 0; si < o->nshapes; si++)
        if ((o->sc.on                  ? rank_shape_scaled(x, si)
             : o->op == OVL_OP_GEMM_RS ? rank_shape_rs(x, si)
                                       : rank_shape(x, si)) != 0)
            goto out;
    snprintf(x->where, sizeof(x->where), "teardown");
    st = ovl_comm_destroy(x->comm);
    x->comm = NULL;
    if (st != OVL_OK) {
        rank_fail(x, "ovl_comm_destroy: %s: %s", ovl_strerror(st), ovl_last_error(x->cl));
        goto out;
    }
    /* Checked here; on a failure the process ends and takes the rest along. */
    RCUDA(cudaFree(x->ws));
    x->ws = NULL;
    RCUDA(cudaFree(x->acc));
    x->acc = NULL;
    for (int i = 0; i <= o->iters; i++) {
        RCUDA(cudaEventDestroy(x->ev[i]));
        x->ev[i] = NULL;
    }
    RCUDA(cudaStreamDestroy(x->s));
    x->s = NULL;
    rc = 0;
out:
    if (x->comm)
        ovl_comm_destroy(x->comm);
    ovl_disconnect(x->cl);
    if (x->lt)
        ovld_lt_destroy(x->lt);
    cudaFree(x->ws);
    cudaFree(x->acc);
    if (x->ev)
        for (int i = 0; i <= o->iters; i++)
            if (x->ev[i])
                cudaEventDestroy(x->ev[i]);
    if (x->s)
        cudaStreamDestroy(x->s);
    free(x->ev);
    free(x->tmp);
    return rc;
}

/* ------------------------------------------------------------ the parent: ovl part */

/* One ovl config of one shape, over the ranks. */
typedef struct cell {
    int nranks;           /* ranks that reported */
    double med, min, max; /* max of medians, min of mins, max of maxes */
    double rel_err;       /* the worst */
    int check;            /* CHECK_FAIL if any rank failed */
} cell_t;

static cell_t g_cells[MAX_SHAPES][MAX_CFGS];

/* Baselines per shape (ms, NAN until measured): NCCL's all-gather (none
 * where ranks share GPUs), the copy engine's gather of the other ranks'
 * shards, the GEMM, unfused (the gather, then the GEMM), and PyTorch's
 * fused op and its unfused all-gather + mm (the --torch-peer script's). */
enum { BL_AG, BL_CE, BL_GEMM, BL_UNFUSED, BL_TORCH, BL_TORCH_UNF, BL_N };
/* The baselines this process times itself: BL_AG to BL_UNFUSED. */
#define BL_OWN (BL_UNFUSED + 1)
static double g_bl[MAX_SHAPES][BL_N];

static pid_t g_pids[MAX_WORLD];
static int g_nchildren;

/* Ends the children still running: TERM, a grace period, then KILL; reaps. */
static void kill_children(void)
{
    for (int r = 0; r < g_nchildren; r++)
        if (g_pids[r] > 0)
            kill(g_pids[r], SIGTERM);
    double until = ovl_mono_s() + 3;
    for (;;) {
        bool left = false;
        for (int r = 0; r < g_nchildren; r++)
            if (g_pids[r] > 0) {
                if (waitpid(g_pids[r], NULL, WNOHANG) == g_pids[r])
                    g_pids[r] = 0;
                else
                    left = true;
            }
        if (!left)
            return;
        if (ovl_mono_s() > until)
            break;
        usleep(20000);
    }
    for (int r = 0; r < g_nchildren; r++)
        if (g_pids[r] > 0) {
            kill(g_pids[r], SIGKILL);
            waitpid(g_pids[r], NULL, 0);
            g_pids[r] = 0;
        }
}

/* Reaps the children, waiting until `until`; false (with why) if one failed
 * or did not end in time. */
static bool reap_children(double until, char *why, size_t whylen)
{
    bool ok = true;
    for (;;) {
        bool left = false;
        for (int r = 0; r < g_nchildren; r++) {
            if (g_pids[r] <= 0)
                continue;
            int ws;
            pid_t p = waitpid(g_pids[r], &ws, WNOHANG);
            if (p != g_pids[r]) {
                left = true;
                continue;
            }
            g_pids[r] = 0;
            if (!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) && ok) {
                ok = false;
                if (WIFSIGNALED(ws))
                    snprintf(why, whylen, "rank %d died of signal %d", r, WTERMSIG(ws));
                else
                    snprintf(why, whylen, "rank %d exited with status %d", r, WEXITSTATUS(ws));
            }
        }
        if (!left)
            return ok;
        if (ovl_mono_s() > until) {
            snprintf(why, whylen, "the ranks did not exit in time");
            kill_children();
            return false;
        }
        usleep(20000);
    }
}

static void print_cell(const bopts_t *o, int si, int ci)
{
    char shp[64], cs[48];
    const cell_t *c = &g_cells[si][ci];
    shape_str(shp, sizeof(shp), o->shapes[si]);
    cfg_str(cs, sizeof(cs), o->cfgs[ci]);
    printf("  %-18s ovl %-22s %9.3f ms  (min %.3f, max %.3f)", shp, cs, c->med, c->min, c->max);
    if (c->check != CHECK_NONE)
        printf("  rel err %.2e %s", c->rel_err, c->check == CHECK_OK ? "OK" : "FAIL");
    printf("\n");
    fflush(stdout);
}

/* Takes one record from rank r, which has sent nrec before it. */
static bool take_record(const bopts_t *o, int r, int nrec, const rec_t *rec, char *why,
                        size_t whylen)
{
    if (rec->kind == REC_FATAL) {
        snprintf(why, whylen, "%.*s", (int)sizeof(rec->msg), rec->msg);
        return false;
    }
    int si = nrec / o->ncfgs, ci = nrec % o->ncfgs;
    if (rec->kind != REC_CONFIG || rec->shape != si || rec->cfg != ci) {
        snprintf(why, whylen, "rank %d sent a record out of order", r);
        return false;
    }
    cell_t *c = &g_cells[si][ci];
    if (c->nranks == 0) {
        c->med = rec->med;
        c->min = rec->min;
        c->max = rec->max;
        c->rel_err = rec->rel_err;
        c->check = rec->check;
    } else {
        c->med = fmax(c->med, rec->med);
        c->min = fmin(c->min, rec->min);
        c->max = fmax(c->max, rec->max);
        if (!(rec->rel_err <= c->rel_err)) /* NaN counts as worse */
            c->rel_err = rec->rel_err;
        if (rec->check == CHECK_FAIL)
            c->check = CHECK_FAIL;
    }
    if (++c->nranks == (int)o->world)
        print_cell(o, si, ci);
    return true;
}

/*
 * The ovl part: forks the W ranks, collects their records into g_cells until
 * every pipe is closed, reaps them. A rank's failure, an early exit or a
 * shape that takes longer than the timeout ends every rank; false then, with
 * the reason in why.
 */
static bool ovl_phase(const bopts_t *o, char *why, size_t whylen)
{
    int W = (int)o->world, total = o->nshapes * o->ncfgs;
    int fds[MAX_WORLD], nrec[MAX_WORLD];
    size_t have[MAX_WORLD];
    rec_t buf[MAX_WORLD];
    pid_t parent = getpid();

    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < W; r++) {
        int p[2];
        if (pipe(p) != 0) {
            snprintf(why, whylen, "pipe: %s", strerror(errno));
            kill_children();
            return false;
        }
        pid_t pid = fork();
        if (pid < 0) {
            snprintf(why, whylen, "fork: %s", strerror(errno));
            kill_children();
            return false;
        }
        if (pid == 0) {
            die_with_parent(parent);
            for (int q = 0; q < r; q++)
                close(fds[q]);
            close(p[0]);
            _exit(rank_main(o, (uint32_t)r, p[1]));
        }
        close(p[1]);
        fds[r] = p[0];
        nrec[r] = 0;
        have[r] = 0;
        g_pids[r] = pid;
        g_nchildren = r + 1;
    }

    bool ok = true;
    int open = W, done_shapes = 0;
    double deadline = ovl_mono_s() + o->timeout_s;
    while (open > 0 && ok) {
        struct pollfd pf[MAX_WORLD];
        int idx[MAX_WORLD], n = 0;
        for (int r = 0; r < W; r++)
            if (fds[r] >= 0) {
                pf[n] = (struct pollfd){.fd = fds[r], .events = POLLIN};
                idx[n++] = r;
            }
        double left = deadline - ovl_mono_s();
        if (left <= 0) {
            snprintf(why, whylen, "shape %d of %d did not finish within %d s (--timeout)",
                     done_shapes + 1, o->nshapes, o->timeout_s);
            ok = false;
            break;
        }
        int pr = poll(pf, (nfds_t)n, (int)(left * 1000) + 1);
        if (pr < 0 && errno != EINTR) {
            snprintf(why, whylen, "poll: %s", strerror(errno));
            ok = false;
            break;
        }
        for (int i = 0; i < n && pr > 0 && ok; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int r = idx[i];
            ssize_t got = read(fds[r], (char *)&buf[r] + have[r], sizeof(rec_t) - have[r]);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                close(fds[r]);
                fds[r] = -1;
                open--;
                if (nrec[r] < total) {
                    snprintf(why, whylen, "rank %d ended before it reported every config", r);
                    ok = false;
                }
                continue;
            }
            have[r] += (size_t)got;
            if (have[r] < sizeof(rec_t))
                continue;
            have[r] = 0;
            ok = take_record(o, r, nrec[r], &buf[r], why, whylen);
            nrec[r]++;
        }
        /* The timeout is per shape: it starts over when every rank is past one. */
        int low = total;
        for (int r = 0; r < W; r++)
            low = nrec[r] < low ? nrec[r] : low;
        if (low / o->ncfgs > done_shapes) {
            done_shapes = low / o->ncfgs;
            deadline = ovl_mono_s() + o->timeout_s;
        }
    }
    for (int r = 0; r < W; r++)
        if (fds[r] >= 0)
            close(fds[r]);
    if (!ok) {
        kill_children();
        return false;
    }
    return reap_children(ovl_mono_s() + o->timeout_s, why, whylen);
}

/* ------------------------------------------------------------ the parent: baselines */

/* One rank's part of the baselines: on GPU rank_device(rank), its own
 * stream and buffers (ranks that share a GPU have one each there). */
typedef struct bgpu {
    int dev;
    cudaStream_t s;
    ncclComm_t comm; /* NULL where ranks share GPUs (copy-gather) */
    ovld_lt_t *lt;
    void *ws;
    cudaEvent_t *ev; /* iters + 1 */
    /* --op rs, the copy engines' reduce-scatter: this rank's copies out
     * are done; its reduction is done (the senders' next copies wait) */
    cudaEvent_t cp_ev, red_ev;
    void *a, *g;
    void *b[OVL_MAX_BS], *c[OVL_MAX_BS]; /* B i and C i, i < nb */
    /* scaled (fp8): A's scales (its rows', or one), the gathered rows'
     * (all-gather + GEMM by row or 1x128: M rows of them), B's */
    float *sa, *sg, *sb;
} bgpu_t;

static char g_where[192]; /* what the baselines are doing, for messages and the watchdog */
static char g_err[512];

static void on_alarm(int sig)
{
    (void)sig;
    static const char pre[] = "ovl-bench: FAILED: the baselines did not finish in time: ";
    ssize_t w = write(2, pre, sizeof(pre) - 1);
    w = write(2, g_where, strnlen(g_where, sizeof(g_where)));
    w = write(2, "\n", 1);
    (void)w;
    _exit(1);
}

static void bl_fail(const char *fmt, ...)
{
    int n = snprintf(g_err, sizeof(g_err), "baseline %s: ", g_where);
    if (n < 0 || (size_t)n >= sizeof(g_err))
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err + n, sizeof(g_err) - (size_t)n, fmt, ap);
    va_end(ap);
}

#define PCUDA(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            bl_fail("%s: %s", #call, cudaGetErrorString(e_));                                      \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define PNCCL(call)                                                                                \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            bl_fail("%s: %s (%s)", #call, ncclGetErrorString(r_), ncclGetLastError(NULL));         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static ncclDataType_t nccl_type(ovl_dtype_t dt)
{
    if (ovl_dtype_is_fp8(dt)) /* gathered, never summed: bytes */
        return ncclUint8;
    return dt == OVL_DTYPE_FP32 ? ncclFloat32 : dt == OVL_DTYPE_FP16 ? ncclFloat16 : ncclBfloat16;
}

/* A gather by the copy engine. Across GPUs (own false: the floor's) each
 * rank's stream writes its shard into the other ranks' G, the next rank's
 * first (so that at a time every GPU is written by a different peer): as
 * ovld's ring moves A, and the fastest way measured (4 x H200: 331 to 362
 * GB/s into each GPU against 109 to 122 pulling, the same at world 2;
 * ovl-gather-lab). With own (ranks sharing GPUs), each rank's stream copies
 * every rank's shard, its own too, into its G. The shards do not change
 * while they are timed. Scaled by row or 1x128 (gathers_scales), each
 * shard's scount scales (its rows' by row, ceil(K/128) a row by 1x128)
 * follow it, from its sa into the same rows of sg, as ovld's plans move
 * them (a copy after the rows'). */
static int bl_copy_gather(const bopts_t *o, bgpu_t *gp, size_t count, uint64_t scount, bool own)
{
    int rc = -1;
    size_t bytes = count * ovl_dtype_size(o->dtype), sbytes = scount * sizeof(float);
    bool scales = gathers_scales(o);
    for (uint32_t i = 0; i < o->world; i++) {
        PCUDA(cudaSetDevice(gp[i].dev));
        for (uint32_t d = own ? 0 : 1; d < o->world; d++) {
            uint32_t j = (i + d) % o->world;
            if (own)
                PCUDA(cudaMemcpyAsync((char *)gp[i].g + (size_t)j * bytes, gp[j].a, bytes,
                                      cudaMemcpyDefault, gp[i].s));
            else
                PCUDA(cudaMemcpyAsync((char *)gp[j].g + (size_t)i * bytes, gp[i].a, bytes,
                                      cudaMemcpyDefault, gp[i].s));
            if (scales && own)
                PCUDA(cudaMemcpyAsync((char *)gp[i].sg + (size_t)j * sbytes, gp[j].sa, sbytes,
                                      cudaMemcpyDefault, gp[i].s));
            else if (scales)
                PCUDA(cudaMemcpyAsync((char *)gp[j].sg + (size_t)i * sbytes, gp[i].sa, sbytes,
                                      cudaMemcpyDefault, gp[i].s));
        }
    }
    rc = 0;
out:
    return rc;
}

/* One gather of the shards into G on every rank. BL_CE: the other ranks'
 * shards by the copy engine (the floor's gather: a GEMM reads its own
 * shard where it is). Otherwise the whole of G: NCCL's all-gather, as one
 * group, or copies where ranks share GPUs (NCCL refuses two ranks on one
 * GPU). count: the elements of a shard, scount its scales; scaled by row
 * or 1x128 (gathers_scales) the rows' scales are gathered too, in the same
 * group. */
static int bl_gather(const bopts_t *o, bgpu_t *gp, size_t count, uint64_t scount, int what)
{
    int rc = -1;
    if (what == BL_CE || ranks_share(o))
        return bl_copy_gather(o, gp, count, scount, what != BL_CE);
    PNCCL(ncclGroupStart());
    for (uint32_t i = 0; i < o->world; i++) {
        ncclResult_t r =
            ncclAllGather(gp[i].a, gp[i].g, count, nccl_type(o->dtype), gp[i].comm, gp[i].s);
        if (r == ncclSuccess && gathers_scales(o))
            r = ncclAllGather(gp[i].sa, gp[i].sg, scount, ncclFloat32, gp[i].comm, gp[i].s);
        if (r != ncclSuccess) {
            bl_fail("ncclAllGather (GPU %u): %s (%s)", i, ncclGetErrorString(r),
                    ncclGetLastError(gp[i].comm));
            ncclGroupEnd();
            goto out;
        }
    }
    PNCCL(ncclGroupEnd());
    rc = 0;
out:
    return rc;
}

/* --op rs, the copy engines' reduce-scatter (the floor's other way, and
 * ovld's push without its GEMMs): each rank copies its partials of every
 * other rank's block (C 0, M x N) into that rank's receive slots (C 1,
 * slot i for rank i; the own block sits in its slot from the setup), the
 * next rank's first; each rank then sums its W slots into its block (a)
 * with ovld's own reduction kernel (kernels.cu), in fp32. Copies into a
 * rank wait for its previous reduction; its reduction for every copy into
 * it. The partials are in C's dtype (scaled: --out-dtype). */
static int bl_ce_reduce_scatter(const bopts_t *o, bgpu_t *gp, uint64_t mb, uint64_t n)
{
    int rc = -1;
    size_t es = ovl_dtype_size(c_dtype(o)), blk = (size_t)(mb * n) * es;
    for (uint32_t i = 0; i < o->world; i++) {
        PCUDA(cudaSetDevice(gp[i].dev));
        for (uint32_t d = 1; d < o->world; d++) {
            uint32_t j = (i + d) % o->world;
            PCUDA(cudaStreamWaitEvent(gp[i].s, gp[j].red_ev, 0));
            PCUDA(cudaMemcpyAsync((char *)gp[j].c[1] + (size_t)i * blk,
                                  (char *)gp[i].c[0] + (size_t)j * blk, blk, cudaMemcpyDefault,
                                  gp[i].s));
        }
        PCUDA(cudaEventRecord(gp[i].cp_ev, gp[i].s));
    }
    for (uint32_t j = 0; j < o->world; j++) {
        PCUDA(cudaSetDevice(gp[j].dev));
        for (uint32_t i = 0; i < o->world; i++)
            if (i != j)
                PCUDA(cudaStreamWaitEvent(gp[j].s, gp[i].cp_ev, 0));
        PCUDA(ovld_launch_reduce(gp[j].s, c_dtype(o), gp[j].a, n, gp[j].c[1], n, mb, n, o->world,
                                 mb, 1));
        PCUDA(cudaEventRecord(gp[j].red_ev, gp[j].s));
    }
    rc = 0;
out:
    return rc;
}

/* --op rs: NCCL's reduce-scatter of every rank's partials (C 0, M x N, in
 * C's dtype) into its block (a, M/W x N, count elements), as one group. */
static int bl_reduce_scatter(const bopts_t *o, bgpu_t *gp, size_t count)
{
    int rc = -1;
    PNCCL(ncclGroupStart());
    for (uint32_t i = 0; i < o->world; i++) {
        ncclResult_t r = ncclReduceScatter(gp[i].c[0], gp[i].a, count, nccl_type(c_dtype(o)),
                                           ncclSum, gp[i].comm, gp[i].s);
        if (r != ncclSuccess) {
            bl_fail("ncclReduceScatter (GPU %u): %s (%s)", i, ncclGetErrorString(r),
                    ncclGetLastError(gp[i].comm));
            ncclGroupEnd();
            goto out;
        }
    }
    PNCCL(ncclGroupEnd());
    rc = 0;
out:
    return rc;
}

/* G @ B_i -> C_i on one GPU (made current here), on its stream: the GEMM
 * of every B of an op (o->nb of them), one after the other. Scaled: the
 * one B, transposed (N x K), with the scales (A's: the gathered rows' by
 * row, else sa), C in --out-dtype: the scaled cuBLASLt GEMM, as ovld
 * calls it (with --op rs, sh is the rank's GEMM: M x N x K/W). */
static int bl_gemm(const bopts_t *o, bgpu_t *g, shape_t sh)
{
    char err[256];
    int rc = -1;
    PCUDA(cudaSetDevice(g->dev));
    if (o->sc.on) {
        const ovl_demo_scaled_t *sc = &o->sc;
        ovld_gemm_args_t a = {.dtype = o->dtype,
                              .rows = sh.M,
                              .n = sh.N,
                              .k = sh.K,
                              .nblocks = 1,
                              .block_stride = 0,
                              .a = {g->g, sh.K},
                              .b = {g->b[0], sh.K},
                              .c = {g->c[0], sh.N},
                              .transb = true,
                              .scaled = true,
                              .b_dtype = sc->b_dtype,
                              .c_dtype = sc->out_dtype,
                              .a_mode = sc->a_mode,
                              .b_mode = sc->b_mode,
                              .a_scale = gathers_scales(o) ? g->sg : g->sa,
                              .b_scale = g->sb,
                              .bias = NULL,
                              .fast_accum = sc->fast_accum};
        ovl_status_t st = ovld_lt_gemm(g->lt, g->s, g->ws, OVLD_LT_WORKSPACE, &a, err, sizeof(err));
        if (st != OVL_OK) {
            bl_fail("ovld_lt_gemm (GPU %d, scaled): %s: %s", g->dev, ovl_strerror(st), err);
            goto out;
        }
        return 0;
    }
    for (uint32_t i = 0; i < o->nb; i++) {
        ovld_gemm_args_t a = {.dtype = o->dtype,
                              .rows = sh.M,
                              .n = sh.N,
                              .k = sh.K,
                              .nblocks = 1,
                              .block_stride = 0,
                              .a = {g->g, sh.K},
                              .b = {g->b[i], sh.N},
                              .c = {g->c[i], sh.N},
                              .transb = false};
        ovl_status_t st = ovld_lt_gemm(g->lt, g->s, g->ws, OVLD_LT_WORKSPACE, &a, err, sizeof(err));
        if (st != OVL_OK) {
            bl_fail("ovld_lt_gemm (GPU %d, B %u): %s: %s", g->dev, i, ovl_strerror(st), err);
            goto out;
        }
    }
    rc = 0;
out:
    return rc;
}

/* Waits for every rank's stream and asks NCCL (if used) for late errors. */
static int bl_sync(const bopts_t *o, bgpu_t *gp)
{
    int rc = -1;
    for (uint32_t i = 0; i < o->world; i++) {
        ncclResult_t ae = ncclSuccess;
        PCUDA(cudaSetDevice(gp[i].dev));
        PCUDA(cudaStreamSynchronize(gp[i].s));
        if (!gp[i].comm)
            continue;
        PNCCL(ncclCommGetAsyncError(gp[i].comm, &ae));
        if (ae != ncclSuccess) {
            bl_fail("NCCL on GPU %u: %s (%s)", i, ncclGetErrorString(ae),
                    ncclGetLastError(gp[i].comm));
            goto out;
        }
    }
    rc = 0;
out:
    return rc;
}

/* One iteration of a baseline on every GPU (not the GEMM alone, which is
 * issued GPU by GPU); records event e[slot] after it when slot >= 0. */
static int bl_iter(const bopts_t *o, bgpu_t *gp, shape_t sh, int what, int slot)
{
    int rc = -1;
    if (o->op == OVL_OP_GEMM_RS) {
        /* sh is the rank's GEMM (M x N x K/W): unfused is it, then the
         * reduce-scatter; BL_AG the reduce-scatter alone; BL_CE the copy
         * engines' alone */
        for (uint32_t i = 0; what == BL_UNFUSED && i < o->world; i++)
            if (bl_gemm(o, &gp[i], sh) != 0)
                goto out;
        if (what == BL_CE ? bl_ce_reduce_scatter(o, gp, sh.M / o->world, sh.N) != 0
                          : bl_reduce_scatter(o, gp, (size_t)(sh.M / o->world * sh.N)) != 0)
            goto out;
        for (uint32_t i = 0; slot >= 0 && i < o->world; i++) {
            PCUDA(cudaSetDevice(gp[i].dev));
            PCUDA(cudaEventRecord(gp[i].ev[slot], gp[i].s));
        }
        return 0;
    }
    if (bl_gather(o, gp, (size_t)(sh.M / o->world * sh.K),
                  sh.M / o->world * ovl_demo_a_scale_cols(&o->sc, sh.K), what) != 0)
        goto out;
    for (uint32_t i = 0; i < o->world; i++) {
        if (what == BL_UNFUSED && bl_gemm(o, &gp[i], sh) != 0)
            goto out;
        if (slot >= 0) {
            PCUDA(cudaSetDevice(gp[i].dev));
            PCUDA(cudaEventRecord(gp[i].ev[slot], gp[i].s));
        }
    }
    rc = 0;
out:
    return rc;
}

/*
 * Times one baseline (BL_AG, BL_CE, BL_GEMM or BL_UNFUSED) on one shape: warmup,
 * then iters back to back with events around each on every GPU; *ret_ms is
 * the max over ranks of the median per-op time.
 */
static int bl_time(const bopts_t *o, bgpu_t *gp, shape_t sh, int what, float *tmp, double *ret_ms)
{
    int rc = -1, nwarm = settle_ops(o, sh);
    if (what == BL_GEMM) {
        for (uint32_t i = 0; i < o->world; i++)
            for (int w = 0; w < nwarm; w++)
                if (bl_gemm(o, &gp[i], sh) != 0)
                    goto out;
    } else {
        for (int w = 0; w < nwarm; w++)
            if (bl_iter(o, gp, sh, what, -1) != 0)
                goto out;
    }
    if (bl_sync(o, gp) != 0)
        goto out;

    if (what == BL_GEMM) {
        for (uint32_t i = 0; i < o->world; i++) {
            PCUDA(cudaSetDevice(gp[i].dev));
            PCUDA(cudaEventRecord(gp[i].ev[0], gp[i].s));
            for (int it = 0; it < o->iters; it++) {
                if (bl_gemm(o, &gp[i], sh) != 0)
                    goto out;
                PCUDA(cudaEventRecord(gp[i].ev[it + 1], gp[i].s));
            }
        }
    } else {
        for (uint32_t i = 0; i < o->world; i++) {
            PCUDA(cudaSetDevice(gp[i].dev));
            PCUDA(cudaEventRecord(gp[i].ev[0], gp[i].s));
        }
        for (int it = 0; it < o->iters; it++)
            if (bl_iter(o, gp, sh, what, it + 1) != 0)
                goto out;
    }
    if (bl_sync(o, gp) != 0)
        goto out;

    double worst = 0, med, mn, mx;
    for (uint32_t i = 0; i < o->world; i++) {
        PCUDA(cudaSetDevice(gp[i].dev));
        PCUDA(op_times(gp[i].ev, o->iters, tmp, &med, &mn, &mx));
        worst = fmax(worst, med);
    }
    *ret_ms = worst;
    rc = 0;
out:
    return rc;
}

/* Frees one shape's buffers on every GPU (streams must be idle). */
static int bl_free(const bopts_t *o, bgpu_t *gp)
{
    int rc = -1;
    for (uint32_t i = 0; i < o->world; i++) {
        PCUDA(cudaSetDevice(gp[i].dev));
        void **bufs[2 + 2 * OVL_MAX_BS] = {&gp[i].a, &gp[i].g};
        for (int k = 0; k < OVL_MAX_BS; k++) {
            bufs[2 + 2 * k] = &gp[i].b[k];
            bufs[3 + 2 * k] = &gp[i].c[k];
        }
        for (int k = 0; k < 2 + 2 * OVL_MAX_BS; k++) {
            PCUDA(cudaFree(*bufs[k]));
            *bufs[k] = NULL;
        }
        float **scales[3] = {&gp[i].sa, &gp[i].sg, &gp[i].sb};
        for (int k = 0; k < 3; k++) {
            PCUDA(cudaFree(*scales[k]));
            *scales[k] = NULL;
        }
    }
    rc = 0;
out:
    return rc;
}

/*
 * A scaled op's baseline buffers of rank i on its GPU (current), its data
 * made on the host as the rank's own (ovl-demo's model, hmat_t) and
 * copied. All-gather + GEMM (sh the op's): a the shard (m x K), g the
 * gathered A (M x K), b[0] B (N x K, transposed), c[0] C (M x N of
 * --out-dtype), sa the shard's scales (ovl_demo_a_scales of m rows), sg
 * the gathered rows' (by row and 1x128: M rows of them), sb B's
 * (ovl_demo_b_scales). GEMM + reduce-scatter (sh the rank's
 * GEMM, M x N x K/W): g the rank's A (M x K/W), b[0] its B (N x K/W), c[0]
 * its partials (M x N), a its block of the sum (M/W x N) and c[1] the
 * receive slots (M x N, the own block in its slot), all three of
 * --out-dtype, sa A's scales (of M rows), sb B's.
 */
static int bl_setup_scaled(const bopts_t *o, bgpu_t *g, uint32_t i, shape_t sh)
{
    const ovl_demo_scaled_t *sc = &o->sc;
    bool rs = o->op == OVL_OP_GEMM_RS;
    size_t bes = ovl_dtype_size(sc->b_dtype), ces = ovl_dtype_size(sc->out_dtype);
    uint64_t M = sh.M, K = sh.K, N = sh.N, m = M / o->world, arows = rs ? M : m;
    size_t sa_bytes = ovl_demo_a_scales(sc, arows, K) * sizeof(float);
    size_t sb_bytes = ovl_demo_b_scales(sc, N, K) * sizeof(float);
    int nthr = host_threads(1), rc = -1;
    void *ha = malloc(arows * K + 1), *hb = malloc(N * K * bes + 1);
    float *hsa = malloc(sa_bytes + 1), *hsb = malloc(sb_bytes + 1);
    if (!ha || !hb || !hsa || !hsb) {
        bl_fail("out of memory");
        goto out;
    }
    hmat_t ma = {.dt = o->dtype, .q = ha, .ldq = K, .rows = arows, .cols = K, .rank = i};
    hmat_t mb = {.dt = sc->b_dtype, .q = hb, .ldq = K, .rows = N, .cols = K, .rank = i, .which = 1};
    hmat_make(&ma, nthr);
    hmat_make(&mb, nthr);
    ovl_demo_fill_a_scale(sc, hsa, arows, K, SEED, i);
    ovl_demo_fill_b_scale(sc, hsb, N, K, SEED, i);
    PCUDA(to_gpu(rs ? &g->g : &g->a, ha, arows * K));
    PCUDA(to_gpu(&g->b[0], hb, N * K * bes));
    PCUDA(to_gpu((void **)&g->sa, hsa, sa_bytes));
    PCUDA(to_gpu((void **)&g->sb, hsb, sb_bytes));
    PCUDA(cudaMalloc(&g->c[0], M * N * ces));
    if (rs) {
        PCUDA(cudaMalloc(&g->a, m * N * ces));
        PCUDA(cudaMalloc(&g->c[1], M * N * ces)); /* the receive slots */
        PCUDA(cudaMemsetAsync(g->c[0], 0, M * N * ces, g->s));
        /* the own block in its slot, once: the copy engines' reduce-scatter
         * moves the others' only */
        PCUDA(cudaMemcpyAsync((char *)g->c[1] + i * m * N * ces, (char *)g->c[0] + i * m * N * ces,
                              m * N * ces, cudaMemcpyDefault, g->s));
    } else {
        PCUDA(cudaMalloc(&g->g, M * K));
        if (gathers_scales(o)) /* M rows of scales, ovl_demo_a_scale_cols a row */
            PCUDA(
                cudaMalloc((void **)&g->sg, M * ovl_demo_a_scale_cols(&o->sc, K) * sizeof(float)));
    }
    rc = 0;
out:
    free(ha);
    free(hb);
    free(hsa);
    free(hsb);
    return rc;
}

/* One NCCL communicator per rank (one rank per GPU), from this one thread:
 * the inits must be one group. */
static int bl_comms(const bopts_t *o, bgpu_t *gp)
{
    int rc = -1;
    ncclUniqueId id;
    PNCCL(ncclGetUniqueId(&id));
    PNCCL(ncclGroupStart());
    for (uint32_t i = 0; i < o->world; i++) {
        cudaError_t ce = cudaSetDevice(gp[i].dev);
        ncclResult_t r = ncclSuccess;
        if (ce == cudaSuccess)
            r = ncclCommInitRank(&gp[i].comm, (int)o->world, id, (int)i);
        if (ce != cudaSuccess)
            bl_fail("cudaSetDevice(%d): %s", gp[i].dev, cudaGetErrorString(ce));
        else if (r != ncclSuccess)
            bl_fail("ncclCommInitRank (GPU %d): %s (%s)", gp[i].dev, ncclGetErrorString(r),
                    ncclGetLastError(NULL));
        if (ce != cudaSuccess || r != ncclSuccess) {
            ncclGroupEnd(); /* closes the group; the failure is already named */
            goto out;
        }
    }
    PNCCL(ncclGroupEnd());
    rc = 0;
out:
    return rc;
}

/* Peer access between the GPUs used, where it can be had, so that the
 * copy-engine gathers' copies across GPUs go directly. */
static int bl_peers(const bopts_t *o)
{
    int rc = -1;
    for (uint32_t a = 0; a < gpus_used(o); a++)
        for (uint32_t b = 0; b < gpus_used(o); b++) {
            int can = 0;
            if (a == b)
                continue;
            PCUDA(cudaDeviceCanAccessPeer(&can, (int)a, (int)b));
            if (!can)
                continue; /* cudaMemcpyAsync stages such copies through the host */
            PCUDA(cudaSetDevice((int)a));
            cudaError_t ce = cudaDeviceEnablePeerAccess((int)b, 0);
            /* enabled already: fine, and not left behind as the last error */
            if (ce == cudaErrorPeerAccessAlreadyEnabled)
                (void)cudaGetLastError();
            else
                PCUDA(ce);
        }
    rc = 0;
out:
    return rc;
}

/*
 * The baselines of every shape into g_bl: peer access between the GPUs
 * used and NCCL communicators for the W local GPUs from this one thread
 * (where ranks share GPUs, none), then per shape the buffers, the data (the
 * ranks' A and B, from the same seed), and the timings of BL_AG (not where
 * ranks share GPUs) to BL_UNFUSED. 0 on success; -1 with the reason in
 * g_err. A watchdog bounds each step.
 */
static int bl_phase(const bopts_t *o)
{
    bgpu_t gp[MAX_WORLD];
    int rc = -1;
    float *tmp = calloc((size_t)o->iters, sizeof(float));
    char err[256], shp[64];
    size_t es = ovl_dtype_size(o->dtype);

    memset(gp, 0, sizeof(gp));
    snprintf(g_where, sizeof(g_where), "setup");
    if (!tmp) {
        bl_fail("out of memory");
        goto out;
    }
    alarm((unsigned)o->timeout_s);
    for (uint32_t i = 0; i < o->world; i++)
        gp[i].dev = rank_device(o, i);
    /* peer access for the copy-engine gathers; NCCL where it can be had */
    if (bl_peers(o) != 0 || (!ranks_share(o) && bl_comms(o, gp) != 0))
        goto out;
    for (uint32_t i = 0; i < o->world; i++) {
        bgpu_t *g = &gp[i];
        PCUDA(cudaSetDevice(g->dev));
        PCUDA(cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking));
        ovl_status_t st = ovld_lt_create(&g->lt, err, sizeof(err));
        if (st != OVL_OK) {
            bl_fail("ovld_lt_create (rank %u, GPU %d): %s: %s", i, g->dev, ovl_strerror(st), err);
            goto out;
        }
        PCUDA(cudaMalloc(&g->ws, OVLD_LT_WORKSPACE));
        g->ev = calloc((size_t)o->iters + 1, sizeof(*g->ev));
        if (!g->ev) {
            bl_fail("out of memory");
            goto out;
        }
        for (int e = 0; e <= o->iters; e++)
            PCUDA(cudaEventCreate(&g->ev[e]));
        PCUDA(cudaEventCreateWithFlags(&g->cp_ev, cudaEventDisableTiming));
        PCUDA(cudaEventCreateWithFlags(&g->red_ev, cudaEventDisableTiming));
    }

    /* --op rs where ranks share a GPU: no NCCL between them, so neither its
     * reduce-scatter nor unfused: the GEMM and the copy engines'
     * reduce-scatter (the floor then) */
    bool rs_nccl = !ranks_share(o);
    for (int si = 0; si < o->nshapes && o->op == OVL_OP_GEMM_RS; si++) {
        shape_t sh = o->shapes[si];
        /* the rank's GEMM: M x N x K/W, its partials reduce-scattered */
        shape_t loc = {sh.M, sh.K / o->world, sh.N};
        uint64_t mb = sh.M / o->world;
        shape_str(shp, sizeof(shp), sh);
        alarm((unsigned)o->timeout_s);
        snprintf(g_where, sizeof(g_where), "shape %s, setup", shp);
        for (uint32_t i = 0; i < o->world; i++) {
            bgpu_t *g = &gp[i];
            PCUDA(cudaSetDevice(g->dev));
            if (o->sc.on) { /* fp8: made on the host, the partials in --out-dtype */
                if (bl_setup_scaled(o, g, i, loc) != 0)
                    goto out;
                continue;
            }
            PCUDA(cudaMalloc(&g->g, loc.M * loc.K * es));
            PCUDA(cudaMalloc(&g->b[0], loc.K * loc.N * es));
            PCUDA(cudaMalloc(&g->c[0], loc.M * loc.N * es));
            PCUDA(cudaMalloc(&g->a, mb * loc.N * es));
            PCUDA(cudaMalloc(&g->c[1], loc.M * loc.N * es)); /* the receive slots */
            PCUDA(ovl_demo_fill(o->dtype, g->g, loc.M, loc.K, loc.K, SEED, i, 0, g->s));
            PCUDA(ovl_demo_fill(o->dtype, g->b[0], loc.K, loc.N, loc.N, SEED, i, 1, g->s));
            PCUDA(cudaMemsetAsync(g->c[0], 0, loc.M * loc.N * es, g->s));
            /* the own block in its slot, once: the copy engines' reduce-scatter
             * moves the others' only */
            PCUDA(cudaMemcpyAsync((char *)g->c[1] + i * mb * loc.N * es,
                                  (char *)g->c[0] + i * mb * loc.N * es, mb * loc.N * es,
                                  cudaMemcpyDefault, g->s));
        }
        if (bl_sync(o, gp) != 0)
            goto out;
        const char *names[BL_OWN] = {"reduce-scatter", "ce reduce-scatter", "GEMM", "unfused"};
        for (int what = 0; what < BL_OWN; what++) {
            g_bl[si][what] = NAN;
            if (!rs_nccl && (what == BL_AG || what == BL_UNFUSED))
                continue; /* no NCCL on shared GPUs */
            snprintf(g_where, sizeof(g_where), "shape %s, %s", shp, names[what]);
            if (bl_time(o, gp, loc, what, tmp, &g_bl[si][what]) != 0)
                goto out;
        }
        printf("  %-18s reduce-scatter %.3f ms, by copies %.3f ms, GEMM (M x N x K/W) %.3f ms, "
               "unfused %.3f ms\n",
               shp, g_bl[si][BL_AG], g_bl[si][BL_CE], g_bl[si][BL_GEMM], g_bl[si][BL_UNFUSED]);
        fflush(stdout);
        snprintf(g_where, sizeof(g_where), "shape %s, cleanup", shp);
        if (bl_free(o, gp) != 0)
            goto out;
    }
    for (int si = 0; si < o->nshapes && o->op != OVL_OP_GEMM_RS; si++) {
        shape_t sh = o->shapes[si];
        uint64_t m = sh.M / o->world;
        shape_str(shp, sizeof(shp), sh);
        alarm((unsigned)o->timeout_s);
        snprintf(g_where, sizeof(g_where), "shape %s, setup", shp);
        for (uint32_t i = 0; i < o->world; i++) {
            bgpu_t *g = &gp[i];
            PCUDA(cudaSetDevice(g->dev));
            if (o->sc.on) { /* fp8: made on the host */
                if (bl_setup_scaled(o, g, i, sh) != 0)
                    goto out;
                continue;
            }
            PCUDA(cudaMalloc(&g->a, m * sh.K * es));
            PCUDA(cudaMalloc(&g->g, sh.M * sh.K * es));
            PCUDA(ovl_demo_fill(o->dtype, g->a, m, sh.K, sh.K, SEED, i, 0, g->s));
            for (uint32_t j = 0; j < o->nb; j++) { /* the ranks' B j, as theirs */
                PCUDA(cudaMalloc(&g->b[j], sh.K * sh.N * es));
                PCUDA(cudaMalloc(&g->c[j], sh.M * sh.N * es));
                PCUDA(
                    ovl_demo_fill(o->dtype, g->b[j], sh.K, sh.N, sh.N, SEED, i, 1 + (int)j, g->s));
            }
        }
        /* G whole (and by row its scales) before anything is timed: the GEMM
         * alone reads it */
        if (bl_gather(o, gp, (size_t)(m * sh.K), m * ovl_demo_a_scale_cols(&o->sc, sh.K),
                      BL_UNFUSED) != 0 ||
            bl_sync(o, gp) != 0)
            goto out;
        char gemm[32];
        gemm_str(gemm, sizeof(gemm), o);
        const char *names[BL_OWN] = {gathers_scales(o) ? "all-gather+scales" : "all-gather",
                                     gathers_scales(o) ? "ce-gather+scales" : "ce-gather", gemm,
                                     "unfused"};
        for (int what = 0; what < BL_OWN; what++) {
            if (what == BL_AG && ranks_share(o))
                continue; /* NCCL cannot put two ranks on one GPU */
            snprintf(g_where, sizeof(g_where), "shape %s, %s", shp, names[what]);
            if (bl_time(o, gp, sh, what, tmp, &g_bl[si][what]) != 0)
                goto out;
        }
        char agms[24] = "-";
        if (isfinite(g_bl[si][BL_AG])) /* none where ranks share GPUs */
            snprintf(agms, sizeof(agms), "%.3f", g_bl[si][BL_AG]);
        printf("  %-18s %s %s ms, %s %.3f ms, %s %.3f ms, unfused %.3f ms\n", shp, names[BL_AG],
               agms, names[BL_CE], g_bl[si][BL_CE], gemm, g_bl[si][BL_GEMM], g_bl[si][BL_UNFUSED]);
        fflush(stdout);
        snprintf(g_where, sizeof(g_where), "shape %s, cleanup", shp);
        if (bl_free(o, gp) != 0)
            goto out;
    }
    snprintf(g_where, sizeof(g_where), "teardown");
    for (uint32_t i = 0; i < o->world; i++) {
        bgpu_t *g = &gp[i];
        PCUDA(cudaSetDevice(g->dev));
        if (g->comm) {
            PNCCL(ncclCommFinalize(g->comm));
            PNCCL(ncclCommDestroy(g->comm));
        }
        ovld_lt_destroy(g->lt);
        PCUDA(cudaFree(g->ws));
        for (int e = 0; e <= o->iters; e++)
            PCUDA(cudaEventDestroy(g->ev[e]));
        PCUDA(cudaEventDestroy(g->cp_ev));
        PCUDA(cudaEventDestroy(g->red_ev));
        free(g->ev);
        PCUDA(cudaStreamDestroy(g->s));
    }
    rc = 0;
out:
    /* On a failure what is left goes with the process, which ends soon. */
    free(tmp);
    alarm(0);
    return rc;
}

/* ------------------------------------------------------------ PyTorch's fused op */

/* What became of the PyTorch peer: why it has no figures, or what failed. */
static char g_torch_note[512];
static bool g_torch_failed;

static void torch_note(bool failed, const char *fmt, ...)
{
    va_list ap;
    if (g_torch_failed)
        return; /* the first failure's words stay */
    g_torch_failed |= failed;
    va_start(ap, fmt);
    vsnprintf(g_torch_note, sizeof(g_torch_note), fmt, ap);
    va_end(ap);
}

/* One line of the peer's output (bench/torch_peer.py says its format). */
static void torch_line(const bopts_t *o, const char *line)
{
    static const char pre[] = "torch-peer: ";
    char shp[64], name[64];
    double f, u, e;
    int used = 0;
    if (strncmp(line, pre, sizeof(pre) - 1) != 0)
        return;
    line += sizeof(pre) - 1;
    if (strncmp(line, "skip: ", 6) == 0) {
        torch_note(false, "PyTorch's fused op not run: %s", line + 6);
        return;
    }
    if (strncmp(line, "FAILED: ", 8) == 0) {
        torch_note(true, "PyTorch's peer failed: %s", line + 8);
        return;
    }
    /* its fused op does not take the run's scales (block scales): the
     * unfused op alone is timed, the fused figure is nan */
    if (strncmp(line, "note: fused not run: ", 21) == 0) {
        torch_note(false, "PyTorch's fused op not run: %s", line + 21);
        return;
    }
    if (sscanf(line, "shape %63s fused %lf unfused %lf rel_err %lf%n", shp, &f, &u, &e, &used) !=
        4) {
        if (strncmp(line, "shape ", 6) == 0)
            torch_note(true, "PyTorch's peer: %s", line);
        return;
    }
    bool fail = strstr(line + used, "FAIL") != NULL;
    for (int si = 0; si < o->nshapes; si++) {
        shape_str(name, sizeof(name), o->shapes[si]);
        if (strcmp(name, shp) != 0)
            continue;
        g_bl[si][BL_TORCH] = fail || !(f > 0) ? NAN : f;
        g_bl[si][BL_TORCH_UNF] = u > 0 ? u : NAN;
    }
    if (fail)
        torch_note(true, "PyTorch's fused op failed its check at %s (rel. err %.2e)", shp, e);
}

/*
 * Runs the --torch-peer script (o->python SCRIPT --world W --shapes ...
 * --dtype --warmup --settle-ms --iters --op, and for fp8 --b-dtype
 * --out-dtype --a-scale --b-scale [--fast-accum]: PyTorch's scaled fused
 * ops) in a
 * process group of its own, its output
 * echoed and read into g_bl[][BL_TORCH, BL_TORCH_UNF]; bounded by the
 * shapes' timeouts. Not where ranks share GPUs: PyTorch's op needs a GPU
 * per rank. Its failure or skip is said in g_torch_note.
 */
static void torch_phase(const bopts_t *o)
{
    char shapes[MAX_SHAPES * 64] = "", world[16], warmup[16], settle[16], iters[16], shp[64];
    if (ranks_share(o)) {
        torch_note(false, "PyTorch's fused op not run: ranks share GPUs (it needs one per rank)");
        return;
    }
    if (o->nb > 1) { /* the script times one B per op */
        torch_note(false, "PyTorch's fused op not run: --bs %u (its script times one B)", o->nb);
        return;
    }
    for (int si = 0; si < o->nshapes; si++) {
        shape_str(shp, sizeof(shp), o->shapes[si]);
        size_t n = strlen(shapes);
        snprintf(shapes + n, sizeof(shapes) - n, "%s%s", si ? "," : "", shp);
    }
    snprintf(world, sizeof(world), "%u", o->world);
    snprintf(warmup, sizeof(warmup), "%d", o->warmup);
    snprintf(settle, sizeof(settle), "%d", o->settle_ms);
    snprintf(iters, sizeof(iters), "%d", o->iters);
    char *argv[] = {(char *)o->python,
                    (char *)o->torch_peer,
                    "--world",
                    world,
                    "--shapes",
                    shapes,
                    "--dtype",
                    (char *)ovl_dtype_name(o->dtype),
                    "--warmup",
                    warmup,
                    "--settle-ms",
                    settle,
                    "--iters",
                    iters,
                    "--op",
                    o->op == OVL_OP_GEMM_RS ? "rs" : "ag",
                    NULL, /* fp8: the scaled options, below */
                    NULL,
                    NULL,
                    NULL,
                    NULL,
                    NULL,
                    NULL,
                    NULL,
                    NULL,
                    NULL};
    if (o->sc.on) {
        int at = 16; /* the first NULL above */
        argv[at++] = "--b-dtype";
        argv[at++] = (char *)ovl_dtype_name(o->sc.b_dtype);
        argv[at++] = "--out-dtype";
        argv[at++] = (char *)ovl_dtype_name(o->sc.out_dtype);
        argv[at++] = "--a-scale";
        argv[at++] = (char *)ovl_scale_mode_name(o->sc.a_mode);
        argv[at++] = "--b-scale";
        argv[at++] = (char *)ovl_scale_mode_name(o->sc.b_mode);
        if (o->sc.fast_accum)
            argv[at++] = "--fast-accum";
    }
    int fd[2];
    if (pipe(fd) != 0) {
        torch_note(true, "PyTorch's peer: pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        torch_note(true, "PyTorch's peer: fork: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return;
    }
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a timeout ends the ranks it spawns too */
        die_with_parent(parent);
        close(fd[0]);
        if (dup2(fd[1], 1) < 0)
            _exit(127);
        close(fd[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "ovl-bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* either side may win the race; both ask for the same */
    close(fd[1]);
    double until = ovl_mono_s() + (double)o->timeout_s * o->nshapes + 120;
    char buf[4096];
    size_t have = 0;
    bool timed_out = false, skip_rest = false; /* skip_rest: the tail of a line too long */
    for (;;) {
        double left = until - ovl_mono_s();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pf = {.fd = fd[0], .events = POLLIN};
        int pr = poll(&pf, 1, (int)fmin(left * 1000, 1000));
        if (pr < 0 && errno != EINTR)
            break;
        if (pr <= 0)
            continue;
        ssize_t got = read(fd[0], buf + have, sizeof(buf) - 1 - have);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        have += (size_t)got;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = '\0';
            if (skip_rest) {
                skip_rest = false;
            } else {
                printf("  %s\n", line);
                torch_line(o, line);
            }
            line = nl + 1;
        }
        have = strlen(line);
        memmove(buf, line, have + 1);
        if (have == sizeof(buf) - 1) { /* a line longer than buf: said, not read */
            printf("  %s...\n", buf);
            have = 0;
            skip_rest = true;
        }
    }
    if (have > 0 && !skip_rest) { /* a last line without its newline */
        printf("  %s\n", buf);
        torch_line(o, buf);
    }
    fflush(stdout);
    close(fd[0]);
    /* its end, bounded like its output: the pipe may close (or fail)
     * before the process ends */
    int ws = 0;
    pid_t w = 0;
    while (!timed_out && (w = waitpid(pid, &ws, WNOHANG)) == 0) {
        if (ovl_mono_s() > until)
            timed_out = true;
        else
            usleep(20000);
    }
    if (timed_out) {
        kill(-pid, SIGKILL);
        torch_note(true, "PyTorch's peer did not finish in %.0f s",
                   (double)o->timeout_s * o->nshapes + 120);
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
            ;
    } else if (w < 0) {
        torch_note(true, "PyTorch's peer: waitpid: %s", strerror(errno));
    }
    kill(-pid, SIGKILL); /* its ranks, should any outlive it */
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77) {
        if (!g_torch_note[0])
            torch_note(false, "PyTorch's fused op not run (its script exited 77)");
    } else if (!timed_out && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0)) {
        if (!g_torch_failed) {
            if (WIFSIGNALED(ws))
                torch_note(true, "PyTorch's peer died of signal %d", WTERMSIG(ws));
            else
                torch_note(true, "PyTorch's peer exited with status %d", WEXITSTATUS(ws));
        }
    }
    for (int si = 0; si < o->nshapes; si++)
        if (!g_torch_failed && !g_torch_note[0] && !isfinite(g_bl[si][BL_TORCH])) {
            shape_str(shp, sizeof(shp), o->shapes[si]);
            torch_note(true, "PyTorch's peer gave no figure for %s", shp);
        }
}

/* ------------------------------------------------------------ the table */

typedef struct row {
    char shape[48], what[32], chunks[8], tput[24], check[8];
    double ms, xfloor, xunf, xtorch;
} row_t;

static void fmt_num(char *buf, size_t len, const char *fmt, double v)
{
    if (isfinite(v))
        snprintf(buf, len, fmt, v);
    else
        snprintf(buf, len, "-");
}

/* max(a, b), NAN unless both are measured. */
static double max_of(double a, double b)
{
    return isfinite(a) && isfinite(b) ? fmax(a, b) : NAN;
}

/* The floors of shape si: max(GEMM, the faster of the copy engines' and
 * NCCL's gather), what ovl measures itself against; max(GEMM, the copy
 * engines' gather); max(GEMM, NCCL's all-gather). Where NCCL was not timed
 * (ranks sharing GPUs), the copy engines' alone. */
static double floor_ce(int si)
{
    return max_of(g_bl[si][BL_CE], g_bl[si][BL_GEMM]);
}

static double floor_best(int si)
{
    double ag = g_bl[si][BL_AG], ce = g_bl[si][BL_CE];
    /* the faster measured (--op rs on shared GPUs: the copy engines') */
    return max_of(isfinite(ag) && (ag < ce || !isfinite(ce)) ? ag : ce, g_bl[si][BL_GEMM]);
}

static double floor_nccl(int si)
{
    return max_of(g_bl[si][BL_AG], g_bl[si][BL_GEMM]);
}

/* The baseline rows of each shape, in table order. */
#define NBROWS 9

/* Builds the table's rows in rows (room for nshapes * (NBROWS + ncfgs));
 * returns how many. */
static int build_rows(const bopts_t *o, row_t *rows)
{
    int n = 0;
    /* A's, and what rs's collectives move: C's (the partials) */
    size_t es = ovl_dtype_size(o->dtype), ces = ovl_dtype_size(c_dtype(o));
    char gemm_name[32];
    gemm_str(gemm_name, sizeof(gemm_name), o);
    for (int si = 0; si < o->nshapes; si++) {
        shape_t sh = o->shapes[si];
        /* every B's GEMM: the work of one op on one rank; --op rs: the
         * rank's GEMM, M x N x K/W, and the collective moves its M x N
         * partials (not G) */
        bool rs = o->op == OVL_OP_GEMM_RS;
        double flop = 2.0 * (double)sh.M * (double)sh.N * (double)sh.K * (double)o->nb /
                      (rs ? (double)o->world : 1.0);
        double gbytes = rs ? (double)sh.M * (double)sh.N * (double)ces / 1e9
                           : (double)sh.M * (double)sh.K * (double)es / 1e9;
        if (gathers_scales(o)) /* and the rows' fp32 scales, which it moves too */
            gbytes +=
                (double)sh.M * (double)ovl_demo_a_scale_cols(&o->sc, sh.K) * sizeof(float) / 1e9;
        const double *bl = g_bl[si];
        bool gs = gathers_scales(o);
        const char *names[NBROWS] = {rs   ? "reduce-scatter"
                                     : gs ? "allgather+scales"
                                          : "allgather",
                                     rs   ? "ce-reduce-scatter"
                                     : gs ? "ce-gather+scales"
                                          : "ce-gather",
                                     gemm_name,
                                     "unfused",
                                     "floor",
                                     "floor ce",
                                     "floor nccl",
                                     "torch fused",
                                     "torch unfused"};
        double t[NBROWS] = {bl[BL_AG],      bl[BL_CE],      bl[BL_GEMM],
                            bl[BL_UNFUSED], floor_best(si), floor_ce(si),
                            floor_nccl(si), bl[BL_TORCH],   bl[BL_TORCH_UNF]};
        for (int k = 0; k < NBROWS + o->ncfgs; k++) {
            row_t *r = &rows[n++];
            memset(r, 0, sizeof(*r));
            shape_str(r->shape, sizeof(r->shape), sh);
            if (k < NBROWS) {
                snprintf(r->what, sizeof(r->what), "%s", names[k]);
                snprintf(r->chunks, sizeof(r->chunks), "-");
                snprintf(r->check, sizeof(r->check), "-");
                r->ms = t[k];
            } else {
                const cfg_t *c = &o->cfgs[k - NBROWS];
                const cell_t *cell = &g_cells[si][k - NBROWS];
                snprintf(r->what, sizeof(r->what), "ovl %s", ovl_algo_name(c->algo));
                if (c->algo == OVL_ALGO_NAIVE)
                    snprintf(r->chunks, sizeof(r->chunks), "-");
                else if (c->chunks == 0)
                    snprintf(r->chunks, sizeof(r->chunks), "auto");
                else
                    snprintf(r->chunks, sizeof(r->chunks), "%u", c->chunks);
                bool have = cell->nranks == (int)o->world;
                r->ms = have ? cell->med : NAN;
                snprintf(r->check, sizeof(r->check), "%s",
                         !have                       ? "-"
                         : cell->check == CHECK_OK   ? "OK"
                         : cell->check == CHECK_FAIL ? "FAIL"
                                                     : "-");
            }
            if (k == BL_AG || k == BL_CE) /* a gather: the bytes of G it makes per second */
                fmt_num(r->tput, sizeof(r->tput), "%.0f GB/s", gbytes / (r->ms * 1e-3));
            else
                fmt_num(r->tput, sizeof(r->tput), "%.1f", flop / (r->ms * 1e-3) / 1e12);
            r->xfloor = r->ms / floor_best(si);
            r->xunf = r->ms / bl[BL_UNFUSED];
            r->xtorch = r->ms / bl[BL_TORCH];
        }
    }
    return n;
}

static void print_row(FILE *f, const row_t *r, bool md)
{
    char ms[24], xf[24], xu[24], xt[24];
    fmt_num(ms, sizeof(ms), "%.3f", r->ms);
    fmt_num(xf, sizeof(xf), "%.2f", r->xfloor);
    fmt_num(xu, sizeof(xu), "%.2f", r->xunf);
    fmt_num(xt, sizeof(xt), "%.2f", r->xtorch);
    if (md)
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r->shape, r->what, r->chunks,
                ms, r->tput, xf, xu, xt, r->check);
    else
        fprintf(f, "%-18s %-16s %6s %10s %10s %8s %9s %7s  %s\n", r->shape, r->what, r->chunks, ms,
                r->tput, xf, xu, xt, r->check);
}

static void print_table(FILE *f, const row_t *rows, int n, bool md)
{
    if (md) {
        fprintf(f, "| shape (MxKxN) | what | chunks | median ms | TFLOP/s | x floor | x unfused "
                   "| x torch | check |\n|---|---|---|---|---|---|---|---|---|\n");
    } else {
        fprintf(f, "%-18s %-16s %6s %10s %10s %8s %9s %7s  %s\n", "shape (MxKxN)", "what", "chunks",
                "median ms", "TFLOP/s", "x floor", "x unfused", "x torch", "check");
    }
    for (int i = 0; i < n; i++)
        print_row(f, &rows[i], md);
}

/* The fastest ovl config of shape si that ran on every rank and did not
 * fail its check, or -1. */
static int best_cfg(const bopts_t *o, int si)
{
    int best = -1;
    for (int ci = 0; ci < o->ncfgs; ci++) {
        const cell_t *c = &g_cells[si][ci];
        if (c->nranks == (int)o->world && c->check != CHECK_FAIL &&
            (best < 0 || c->med < g_cells[si][best].med))
            best = ci;
    }
    return best;
}

/* The summary: per shape, the fastest ovl config that did not fail its
 * check, against unfused, both floors and PyTorch's fused op. md: as a
 * markdown list. */
static void print_summary(FILE *f, const bopts_t *o, bool md)
{
    for (int si = 0; si < o->nshapes; si++) {
        char shp[64], cs[48];
        shape_str(shp, sizeof(shp), o->shapes[si]);
        int best = best_cfg(o, si);
        fprintf(f, "%s%-18s ", md ? "- " : "  ", shp);
        if (best < 0) {
            fprintf(f, "no ovl config both ran and passed its check\n");
            continue;
        }
        const cell_t *c = &g_cells[si][best];
        double unf = g_bl[si][BL_UNFUSED], tf = g_bl[si][BL_TORCH];
        char xu[24], sp[24], xf[24], xc[24], xn[24], xt[24];
        fmt_num(xu, sizeof(xu), "%.2fx", c->med / unf);
        fmt_num(sp, sizeof(sp), "%+.1f%%", (unf / c->med - 1) * 100);
        fmt_num(xf, sizeof(xf), "%.2fx", c->med / floor_best(si));
        fmt_num(xc, sizeof(xc), "%.2fx", c->med / floor_ce(si));
        fmt_num(xn, sizeof(xn), "%.2fx", c->med / floor_nccl(si));
        fmt_num(xt, sizeof(xt), "%.2fx", c->med / tf);
        cfg_str(cs, sizeof(cs), o->cfgs[best]);
        fprintf(f,
                "best ovl %-20s %8.3f ms  %s unfused (%s speedup)  %s floor  %s floor ce  %s "
                "floor nccl  %s torch fused\n",
                cs, c->med, xu, sp, xf, xc, xn, xt);
    }
}

/* The targets, over the shapes, for a run with a GPU per rank and more
 * than one rank (a shared GPU's times are no overlap figures): the best
 * ovl at most 1.10x the floor on every shape, never slower
 * than unfused, and 25% faster than PyTorch's fused op by geometric mean.
 * Says each as MET, MISS (naming the shapes) or not measured. */
/* One "at most limit" target over the shapes: the shapes judged, the
 * worst ratio, the shapes over the limit (named with their ratio). */
typedef struct target {
    int n, nmiss;
    double worst;
    char miss[512];
} target_t;

/* Judges one shape's ratio x against limit; NAN: the shape has no valid
 * ovl config, a miss. */
static void target_judge(target_t *t, const char *shp, double x, double limit)
{
    size_t len = strlen(t->miss);
    t->n++;
    if (isfinite(x)) {
        t->worst = fmax(t->worst, x);
        if (x <= limit)
            return;
        snprintf(t->miss + len, sizeof(t->miss) - len, "%s%s %.2fx", t->nmiss ? ", " : "", shp, x);
    } else {
        snprintf(t->miss + len, sizeof(t->miss) - len, "%s%s no valid ovl config",
                 t->nmiss ? ", " : "", shp);
    }
    t->nmiss++;
}

#define TARGET_XFLOOR 1.10
#define TARGET_TORCH  1.25
static void print_targets(FILE *f, const bopts_t *o, bool md)
{
    const char *pre = md ? "- " : "  ";
    /* GEMM + reduce-scatter's own targets (issue 34): 1.15x the floor, 20%
     * over PyTorch's fused op */
    double xfloor = o->op == OVL_OP_GEMM_RS ? 1.15 : TARGET_XFLOOR;
    double xtorch = o->op == OVL_OP_GEMM_RS ? 1.20 : TARGET_TORCH;
    if (ranks_share(o) || o->world < 2) {
        fprintf(f, "%stargets: not judged (%s)\n", pre,
                o->world < 2 ? "world 1: nothing to gather" : "ranks share GPUs");
        return;
    }
    target_t fl = {0}, un = {0};
    char shp[64];
    double logsum = 0;
    int nt = 0;
    for (int si = 0; si < o->nshapes; si++) {
        int best = best_cfg(o, si);
        shape_str(shp, sizeof(shp), o->shapes[si]);
        if (best < 0) { /* a miss of the first two targets, whatever the others did */
            target_judge(&fl, shp, NAN, xfloor);
            target_judge(&un, shp, NAN, 1.0);
            continue;
        }
        double ms = g_cells[si][best].med;
        double xt = g_bl[si][BL_TORCH] / ms;
        if (isfinite(floor_best(si)))
            target_judge(&fl, shp, ms / floor_best(si), xfloor);
        if (isfinite(g_bl[si][BL_UNFUSED]))
            target_judge(&un, shp, ms / g_bl[si][BL_UNFUSED], 1.0);
        if (isfinite(xt)) {
            nt++;
            logsum += log(xt);
        }
    }
    if (fl.n)
        fprintf(f, "%starget best ovl <= %.2fx the floor: %s (worst %.2fx%s%s%s)\n", pre, xfloor,
                fl.nmiss ? "MISS" : "MET", fl.worst, fl.nmiss ? "; over it: " : "", fl.miss,
                fl.n < o->nshapes ? "; some shapes have no floor" : "");
    else
        fprintf(f, "%starget best ovl <= %.2fx the floor: not measured\n", pre, xfloor);
    if (un.n)
        fprintf(f, "%starget never slower than unfused: %s (worst %.2fx%s%s)\n", pre,
                un.nmiss ? "MISS" : "MET", un.worst, un.nmiss ? "; slower: " : "", un.miss);
    else
        fprintf(f, "%starget never slower than unfused: not measured\n", pre);
    if (nt) {
        double g = exp(logsum / nt);
        fprintf(f,
                "%starget >= %.0f%% faster than PyTorch's fused op by geometric mean: %s "
                "(%.2fx, %+.1f%%, over %d of %d shapes)\n",
                pre, (xtorch - 1) * 100, g >= xtorch ? "MET" : "MISS", g, (g - 1) * 100, nt,
                o->nshapes);
    } else {
        fprintf(f,
                "%starget >= %.0f%% faster than PyTorch's fused op by geometric mean: not "
                "measured (%s)\n",
                pre, (xtorch - 1) * 100, g_torch_note[0] ? g_torch_note : "no --torch-peer");
    }
}

/* ------------------------------------------------------------ main */

/* Said with every table and summary of a run whose ranks share GPUs. */
#define SHARED_NOTE                                                                                \
    "ranks share GPUs: each time includes the other ranks' work on the same GPU, so it is no "     \
    "overlap figure; ovld and the baselines gather by copies there (NCCL cannot put two ranks "    \
    "on one GPU: no allgather and floor nccl figures; unfused gathers by copies), and x floor / "  \
    "x unfused compare with those baselines."

static void version_str(char *buf, size_t len, int v)
{
    snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
}

int main(int argc, char **argv)
{
    bopts_t o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    /* NVLink multicast stays off: on shared machines it can take the GPUs
     * out of service (see the GPU machine's notes). */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    signal(SIGPIPE, SIG_IGN);

    /* Probe in a child: CUDA must not be initialized in this process before
     * the ranks are forked. */
    probe_t p;
    memset(&p, 0, sizeof(p));
    {
        int fd[2];
        if (pipe(fd) != 0) {
            perror("ovl-bench: pipe");
            return 1;
        }
        fflush(stdout);
        pid_t parent = getpid(), pid = fork();
        if (pid < 0) {
            perror("ovl-bench: fork");
            return 1;
        }
        if (pid == 0) {
            die_with_parent(parent);
            close(fd[0]);
            _exit(probe_main(&o, fd[1]));
        }
        close(fd[1]);
        g_pids[0] = pid;
        g_nchildren = 1;
        struct pollfd pf = {.fd = fd[0], .events = POLLIN};
        ssize_t got = -1;
        if (poll(&pf, 1, 120000) == 1)
            got = read(fd[0], &p, sizeof(p));
        close(fd[0]);
        if (got != (ssize_t)sizeof(p)) {
            kill_children();
            fprintf(stderr, "ovl-bench: the GPU probe failed or did not answer in 120 s\n");
            return 1;
        }
        char why[128];
        (void)reap_children(ovl_mono_s() + 30, why, sizeof(why));
        g_nchildren = 0;
    }
    if (p.ngpu <= 0) {
        printf("ovl-bench: no GPU: %s\n", p.err);
        return 77;
    }
    o.ngpu = (uint32_t)p.ngpu;
    if (o.world == 0)
        o.world = o.ngpu < MAX_WORLD ? o.ngpu : MAX_WORLD;
    if (o.world > MAX_WORLD) {
        fprintf(stderr, "ovl-bench: --world %u: at most %d ranks\n", o.world, MAX_WORLD);
        return 2;
    }
    for (int si = 0; si < o.nshapes; si++)
        if (o.shapes[si].M % o.world != 0) {
            char shp[64];
            shape_str(shp, sizeof(shp), o.shapes[si]);
            fprintf(stderr, "ovl-bench: shape %s: M is not divisible by the world (%u)\n", shp,
                    o.world);
            return 2;
        }
    /* the rule's shapes (common/scaling.h): each GEMM's A has M/W rows
     * (all-gather + GEMM: a rank's shard; GEMM + reduce-scatter: a block of
     * C), in fours with A 1x128, and N in fours with B 1x128 */
    for (int si = 0; si < o.nshapes && o.sc.on; si++) {
        const char *why = ovl_scaling_shape_refusal(o.sc.a_mode, o.sc.b_mode,
                                                    o.shapes[si].M / o.world, o.shapes[si].N);
        if (why) {
            char shp[64];
            shape_str(shp, sizeof(shp), o.shapes[si]);
            fprintf(stderr, "ovl-bench: shape %s (M/W %" PRIu64 ", W %u), scales %s/%s: %s\n", shp,
                    o.shapes[si].M / o.world, o.world, ovl_scale_mode_name(o.sc.a_mode),
                    ovl_scale_mode_name(o.sc.b_mode), why);
            return 2;
        }
    }
    for (int si = 0; si < o.nshapes && o.sc.on && o.op == OVL_OP_GEMM_RS; si++)
        if (o.shapes[si].K % o.world != 0 || o.shapes[si].K / o.world % 16 != 0) {
            char shp[64];
            shape_str(shp, sizeof(shp), o.shapes[si]);
            fprintf(stderr,
                    "ovl-bench: shape %s: --op rs in fp8 needs K/W (W %u) a multiple of 16 "
                    "(cuBLASLt's fp8 layouts)\n",
                    shp, o.world);
            return 2;
        }
    if (p.err[0]) {
        fprintf(stderr, "ovl-bench: %s\n", p.err);
        return 1;
    }
    if (p.ovld_devices == 0) {
        fprintf(stderr, "ovl-bench: ovld (socket %s): %s\n",
                o.socket               ? o.socket
                : getenv("OVL_SOCKET") ? getenv("OVL_SOCKET")
                                       : OVL_DEFAULT_SOCKET,
                p.daemon_err);
        return 1;
    }
    if (o.op == OVL_OP_GEMM_RS && ranks_share(&o) && !o.algos_given) {
        /* naive's and collective's reduce-scatter is NCCL's, which takes no
         * two ranks of one GPU: the default configs keep push's and
         * ring's, whose copies need none */
        int n = 0;
        for (int c = 0; c < o.ncfgs; c++)
            if (o.cfgs[c].algo == OVL_ALGO_PUSH || o.cfgs[c].algo == OVL_ALGO_RING)
                o.cfgs[n++] = o.cfgs[c];
        o.ncfgs = n;
        printf("ovl-bench: ranks share GPUs: GEMM + reduce-scatter runs ring and push only "
               "(naive and collective need NCCL between the ranks)\n");
    }
    if (p.ovld_devices < gpus_used(&o)) {
        fprintf(stderr, "ovl-bench: ovld has %u device%s, the ranks use %u GPU%s\n", p.ovld_devices,
                p.ovld_devices == 1 ? "" : "s", gpus_used(&o), gpus_used(&o) == 1 ? "" : "s");
        return 2;
    }
    FILE *res = NULL;
    if (strcmp(o.results, "-") != 0 && !(res = fopen(o.results, "ae"))) {
        fprintf(stderr, "ovl-bench: cannot append to %s: %s (--results - for none)\n", o.results,
                strerror(errno));
        return 2;
    }
    for (int si = 0; si < MAX_SHAPES; si++)
        for (int b = 0; b < BL_N; b++)
            g_bl[si][b] = NAN;

    char drv[16], rt[16], nccl[24];
    int nv = 0;
    version_str(drv, sizeof(drv), p.driver);
    version_str(rt, sizeof(rt), p.runtime);
    if (ncclGetVersion(&nv) == ncclSuccess)
        snprintf(nccl, sizeof(nccl), "%d.%d.%d", nv / 10000, nv % 10000 / 100, nv % 100);
    else
        snprintf(nccl, sizeof(nccl), "?");
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    gmtime_r(&now, &tm);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
    char share[64], bs[48], bs_note[256] = "", dts[96], fp8_note[1024] = "";
    share_str(share, sizeof(share), &o);
    /* the dtype in words: "bf16"; fp8: "fp8e4m3 x fp8e4m3 -> bf16, scales
     * row/row" */
    ovl_demo_scaled_describe(&o.sc, o.dtype, dts, sizeof(dts));
    double tolerance = ovl_demo_scaled_tolerance(&o.sc, o.dtype);
    if (o.sc.on && o.op == OVL_OP_GEMM_RS)
        snprintf(fp8_note, sizeof(fp8_note),
                 "fp8 (scaled): each rank's A %s (M x K/W) and B %s given transposed (N x "
                 "K/W), fp32 scales by %s (A) and %s (B), partials and C in %s, no bias%s. "
                 "gemm is the rank's scaled cuBLASLt GEMM (ovld_lt_gemm, the call ovld makes) "
                 "into its %s partials; reduce-scatter and ce-reduce-scatter move and sum them "
                 "in %s; unfused is the GEMM, then NCCL's reduce-scatter. Every C is checked "
                 "against a cuBLASLt fp32 product of the dequantized inputs (tolerance %.0e).",
                 ovl_dtype_name(o.dtype), ovl_dtype_name(o.sc.b_dtype),
                 ovl_scale_mode_name(o.sc.a_mode), ovl_scale_mode_name(o.sc.b_mode),
                 ovl_dtype_name(o.sc.out_dtype), o.sc.fast_accum ? ", fast accumulation" : "",
                 ovl_dtype_name(o.sc.out_dtype), ovl_dtype_name(o.sc.out_dtype), tolerance);
    else if (o.sc.on)
        snprintf(fp8_note, sizeof(fp8_note),
                 "fp8 (scaled): A %s (m x K a rank) and B %s given transposed (N x K), fp32 "
                 "scales by %s (A) and %s (B), C in %s, no bias%s. gemm is the scaled cuBLASLt "
                 "GEMM (ovld_lt_gemm, the call ovld makes); %s; unfused is that all-gather, "
                 "then the GEMM. Every C is checked against a cuBLASLt fp32 product of the "
                 "dequantized inputs (tolerance %.0e).",
                 ovl_dtype_name(o.dtype), ovl_dtype_name(o.sc.b_dtype),
                 ovl_scale_mode_name(o.sc.a_mode), ovl_scale_mode_name(o.sc.b_mode),
                 ovl_dtype_name(o.sc.out_dtype), o.sc.fast_accum ? ", fast accumulation" : "",
                 gathers_scales(&o) && o.sc.a_mode == OVL_SCALE_BLOCK_1X128
                     ? "allgather+scales and ce-gather+scales move A's fp8 rows and each row's "
                       "ceil(K/128) fp32 scales (M x ceil(K/128) x 4 bytes more, in GB/s too), "
                       "as ovld's plans do: the floors include the scales"
                 : gathers_scales(&o)
                     ? "allgather+scales and ce-gather+scales move A's fp8 rows and each row's "
                       "fp32 scale (M x 4 bytes more, in GB/s too), as ovld's plans do: the "
                       "floors include the scales"
                     : "the gathers move A's fp8 rows only: by tensor every gathered row is "
                       "scaled by the rank's own A scale, as in ovld and PyTorch's fused op",
                 tolerance);
    bs_str(bs, sizeof(bs), &o);
    if (o.op == OVL_OP_GEMM_RS) /* the op, in every header and the table's title */
        snprintf(bs, sizeof(bs), ", GEMM + reduce-scatter (gemm_rs)");
    if (o.nb > 1)
        snprintf(bs_note, sizeof(bs_note),
                 "every op has %u Bs of N columns each, C_i = allgather(A) @ B_i with A gathered "
                 "once; gemm x%u is their %u GEMMs in a row, unfused the all-gather and then "
                 "them; TFLOP/s counts every B.",
                 o.nb, o.nb, o.nb);
    printf("ovl-bench: %s x %u, world %u (%s), %s%s; ovld %s; driver (CUDA) %s, runtime %s, "
           "NCCL %s\n",
           p.gpu, gpus_used(&o), o.world, share, dts, bs, p.ovld_version, drv, rt, nccl);
    if (ranks_share(&o))
        printf("ovl-bench: %s\n", SHARED_NOTE);
    if (o.nb > 1)
        printf("ovl-bench: %s\n", bs_note);
    if (o.sc.on)
        printf("ovl-bench: %s\n", fp8_note);
    printf("ovl-bench: %d shape%s x %d config%s, warmup %d (settle %d ms), iters %d, check "
           "%s%s%s\n",
           o.nshapes, o.nshapes == 1 ? "" : "s", o.ncfgs, o.ncfgs == 1 ? "" : "s", o.warmup,
           o.settle_ms, o.iters, o.check ? "on" : "off", o.label[0] ? ", label " : "", o.label);
    printf("\novl (job %s, one process per rank):\n", o.job);
    fflush(stdout);

    char why[512] = "";
    double t0 = ovl_mono_s();
    bool ovl_ok = ovl_phase(&o, why, sizeof(why));
    if (!ovl_ok)
        fprintf(stderr, "ovl-bench: ovl part failed: %s\n", why);
    printf("  (%.1f s)\n\n", ovl_mono_s() - t0);
    if (o.torch_peer) { /* before the baselines: this process has no CUDA yet */
        printf("PyTorch's fused op (%s %s):\n", o.python, o.torch_peer);
        t0 = ovl_mono_s();
        torch_phase(&o);
        printf("  (%.1f s)%s%s\n\n", ovl_mono_s() - t0, g_torch_note[0] ? "\n  " : "",
               g_torch_note);
    }
    printf("baselines (this process, NCCL + cuBLASLt + copy engine):\n");
    fflush(stdout);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    t0 = ovl_mono_s();
    bool bl_ok = bl_phase(&o) == 0;
    if (!bl_ok)
        fprintf(stderr, "ovl-bench: %s\n", g_err);
    printf("  (%.1f s)\n\n", ovl_mono_s() - t0);

    int nrows_max = o.nshapes * (NBROWS + o.ncfgs);
    row_t *rows = calloc((size_t)nrows_max, sizeof(*rows));
    if (!rows) {
        fprintf(stderr, "ovl-bench: out of memory\n");
        return 1;
    }
    int nrows = build_rows(&o, rows);
    printf("world %u on %u GPU%s (%s)%s%s\n", o.world, gpus_used(&o), gpus_used(&o) == 1 ? "" : "s",
           share, bs,
           ranks_share(&o) ? ": ranks share GPUs, no overlap figure (see the summary)" : "");
    print_table(stdout, rows, nrows, false);

    int nchecked = 0, nfailed = 0;
    for (int si = 0; si < o.nshapes; si++)
        for (int ci = 0; ci < o.ncfgs; ci++) {
            nchecked += g_cells[si][ci].check != CHECK_NONE;
            nfailed += g_cells[si][ci].check == CHECK_FAIL;
        }
    bool complete = ovl_ok && bl_ok;
    if (res && complete) {
        fprintf(res, "\n## %s — %s x %u, world %u (%s), %s%s\n\n", when, p.gpu, gpus_used(&o),
                o.world, share, dts, bs);
        if (ranks_share(&o))
            fprintf(res, "%s\n\n", SHARED_NOTE);
        if (o.nb > 1)
            fprintf(res, "%s\n\n", bs_note);
        if (o.sc.on)
            fprintf(res, "%s\n\n", fp8_note);
        fprintf(res,
                "Driver (CUDA) %s, CUDA runtime %s, NCCL %s, ovld %s; warmup %d (settle %d "
                "ms), iters %d; check %s%s%s.\n\n",
                drv, rt, nccl, p.ovld_version, o.warmup, o.settle_ms, o.iters,
                o.check ? "on" : "off", o.label[0] ? "; label: " : "", o.label);
        print_table(res, rows, nrows, true);
        fprintf(res, "\n");
        print_summary(res, &o, true);
        print_targets(res, &o, true);
        if (g_torch_note[0])
            fprintf(res, "\n%s\n", g_torch_note);
    }
    if (res && fclose(res) != 0) {
        fprintf(stderr, "ovl-bench: writing %s: %s\n", o.results, strerror(errno));
        complete = false;
    }
    free(rows);
    if (res && complete)
        printf("\n(table appended to %s)\n", o.results);
    else if (res)
        printf("\n(incomplete run: nothing appended to %s)\n", o.results);

    printf("\nsummary (%s x %u, world %u (%s), %s%s; median of %d back-to-back ops, max over "
           "ranks):\n",
           p.gpu, gpus_used(&o), o.world, share, dts, bs, o.iters);
    if (ranks_share(&o))
        printf("  %s\n", SHARED_NOTE);
    print_summary(stdout, &o, false);
    print_targets(stdout, &o, false);
    if (g_torch_note[0])
        printf("  %s\n", g_torch_note);
    if (!complete)
        printf("ovl-bench: FAILED: %s\n", !ovl_ok ? why : g_err);
    else if (nfailed)
        printf("ovl-bench: %d of %d checks FAILED (tolerance %.0e)\n", nfailed, nchecked,
               tolerance);
    else if (g_torch_failed)
        printf("ovl-bench: FAILED: %s\n", g_torch_note);
    else if (o.check)
        printf("ovl-bench: all %d checks passed (tolerance %.0e)\n", nchecked, tolerance);
    else
        printf("ovl-bench: results not checked (--no-check)\n");
    return complete && nfailed == 0 && !g_torch_failed ? 0 : 1;
}

/*
 * test_scratch_growth.c: ovld's gathered-A scratch grows only while nothing
 * of the job runs, and growing it never blocks ovld's event loop. One GPU
 * (device 0), one rank (world 1), one stream.
 *
 * The bug this guards against: a world-1 `ring` op (which gathers nothing)
 * raised the job's recorded scratch size, so that the next larger `naive` op
 * was not held back, and issuing it reallocated the rank's scratch (cudaFree
 * + cudaMalloc) while a queued naive op was about to gather into it. The
 * CUDA backend also synchronized its streams on the loop thread first, so
 * the loop stood still while queued ops waited on the client's stream. Now
 * the job holds such an op back until nothing runs, and the backend refuses
 * (OVL_ERR_INTERNAL, the op fails) to free scratch under ops in flight.
 *
 * The test starts its own ovld ($OVLD_BIN, CUDA backend, a socket in a
 * temporary directory: gpu_daemon.h) and forks one rank process. The rank
 * first runs every op below once, ungated, on a warm-up job (CUDA loads
 * kernels lazily, and loading one blocks ovld's loop while a stream waits:
 * measured on H100, a hazard of its own that this test leaves out). On a
 * fresh job it then closes a gate on its stream (a host function that waits
 * for the rank's main thread), and enqueues 20 rounds of three ops behind
 * it, with no host synchronization:
 *
 *   ring   m = 2048, k = 2048    (gathers nothing at world 1; the old code
 *                                 recorded 8 MiB of scratch for it)
 *   naive  m = 64, k = 64        (a size seen before: runs back to back)
 *   naive  m = k = 128 + 96 * r  (more scratch than ever, every round: must
 *                                 wait until nothing runs)
 *
 * n = 256, bf16; before each op A is filled (a kernel) for a seed of its own,
 * and each op writes a C slot of its own, poisoned (NaN) beforehand. With the
 * gate closed every op is queued at ovld, waiting on the client's stream:
 * then ovld must answer a second client (ovl_connect + a Status call) within
 * 1 s, again and again, until it has all 60 ops (the old code blocked its
 * loop in cudaStreamSynchronize here, until the gate gave up after 5 s). The
 * gate then opens; one cudaStreamSynchronize; ovl_comm_check must be OVL_OK
 * (an op refused with "scratch cannot grow" or "scratch would grow under
 * running ops" means the hold-back failed); every slot is checked against a
 * cuBLASLt fp32 product of its A and B: relative error below 1e-2 and no
 * non-finite element. Last, ovld's log must not name a refused growth or a
 * stalled loop, and ovld must stop cleanly.
 *
 * It prints "N passed, N failed" and exits 0 only if all checks pass; it
 * kills the rank and fails after 120 s. It exits 77 (ctest's skip code) when
 * ovld cannot start the CUDA backend or there is no GPU. The parent itself
 * never touches CUDA (it forks ovld and the rank).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "demo_cuda.h"
#include "libovl_internal.h"
#include "ovl.h"
#include "clock.h"
#include "gpu_daemon.h"

#define ROUNDS         20
#define OPS_PER_ROUND  3
#define NOPS           (ROUNDS * OPS_PER_ROUND)
#define WINDOW         64 /* max_ops_in_flight: every op is submitted without a host wait */
#define SEED_BASE      20250301u
#define N              256
#define RING_M         2048
#define RING_K         2048
#define SMALL_MK       64
#define GROW_BASE      128
#define GROW_STEP      96
#define DTYPE          OVL_DTYPE_BF16
#define TOLERANCE      1e-2
#define PROBE_LIMIT_S  1.0 /* a Status round trip, connect included */
#define PROBE_WINDOW_S 2.0 /* probing goes on until ovld has every op, or this long */
#define GATE_LIMIT_S   5.0 /* the gate opens by itself after this long */
#define TEST_LIMIT_S   120.0
#define JOB_ID         "scratch-growth"

_Static_assert(NOPS <= WINDOW, "libovl must not wait on the host for a gated stream");
/* The old code's recorded size (the ring op's m * k) covered every growing
 * op, so none of them was held back: the test reproduces the bug. */
_Static_assert((uint64_t)(GROW_BASE + GROW_STEP * (ROUNDS - 1)) *
                       (GROW_BASE + GROW_STEP * (ROUNDS - 1)) <=
                   (uint64_t)RING_M * RING_K,
               "the ring op must record more scratch than the largest growing op needs");
_Static_assert(GROW_BASE > SMALL_MK, "the growing op must need more scratch than the small one");

/* ------------------------------------------------------------ ops */

typedef struct op {
    const char *what;
    ovl_algo_t algo;
    uint64_t m, k;
    uint64_t seed;
    size_t c_off; /* this op's C slot in the arena */
} op_t;

static op_t op_shape(int i)
{
    int r = i / OPS_PER_ROUND;
    op_t o = {.seed = SEED_BASE + (uint64_t)i};
    switch (i % OPS_PER_ROUND) {
    case 0:
        o.what = "large ring";
        o.algo = OVL_ALGO_RING;
        o.m = RING_M;
        o.k = RING_K;
        break;
    case 1:
        o.what = "small naive";
        o.algo = OVL_ALGO_NAIVE;
        o.m = o.k = SMALL_MK;
        break;
    default:
        o.what = "growing naive";
        o.algo = OVL_ALGO_NAIVE;
        o.m = o.k = GROW_BASE + (uint64_t)GROW_STEP * (uint64_t)r;
        break;
    }
    return o;
}

static size_t place(size_t *cursor, size_t bytes)
{
    size_t at = (*cursor + 255) / 256 * 256;
    *cursor = at + bytes;
    return at;
}

/* The descriptor of op o: A (its first m x k, leading dimension k) at a, B
 * (its first k rows of N) at b, its C slot in the arena; no transpose. */
static ovl_ag_gemm_desc_t op_desc(const op_t *o, void *a, void *b, char *arena)
{
    return (ovl_ag_gemm_desc_t){.a = a,
                                .lda = o->k,
                                .b = b,
                                .ldb = N,
                                .transb = 0,
                                .c = arena + o->c_off,
                                .ldc = N,
                                .m = o->m,
                                .n = N,
                                .k = o->k,
                                .dtype = DTYPE,
                                .algo = o->algo};
}

/* ------------------------------------------------------------ the gate */

/* A host function on the rank's stream: the work behind it (every op's
 * ready) waits until the main thread opens it, or GATE_LIMIT_S passes. */
static atomic_int gate_open;
static atomic_int gate_timed_out;

static void CUDART_CB gate_wait(void *arg)
{
    (void)arg;
    double deadline = ovl_mono_s() + GATE_LIMIT_S;
    while (!atomic_load(&gate_open)) {
        if (ovl_mono_s() > deadline) {
            atomic_store(&gate_timed_out, 1);
            return;
        }
        gpu_sleep_ms(1);
    }
}

/* ------------------------------------------------------------ the probe */

/* Status round trips on a second client while the rank's ops are queued at
 * ovld: the first right away (connect included), then until ovld reports
 * all NOPS ops of the job or PROBE_WINDOW_S passes. Each must answer within
 * PROBE_LIMIT_S. Returns true if all did. */
static bool probe_loop(void)
{
    double t_start = ovl_mono_s(), worst = 0;
    int probes = 0;
    uint32_t in_flight = 0;
    uint64_t done = 0;
    bool ok = true;
    ovl_client_t *cl = NULL;

    double t0 = ovl_mono_s();
    if (ovl_connect(NULL, &cl) != OVL_OK) {
        fprintf(stderr, "FAIL: the probe's ovl_connect: %s (after %.0f ms)\n", ovl_connect_error(),
                (ovl_mono_s() - t0) * 1e3);
        return false;
    }
    ovl_set_timeout(cl, (int)(GATE_LIMIT_S * 2000));
    for (;;) {
        Ovl__Response *r = NULL;
        ovl_status_t st = libovl_status(cl, &r);
        double took = ovl_mono_s() - t0; /* the first includes the connect */
        probes++;
        if (took > worst)
            worst = took;
        if (st != OVL_OK) {
            fprintf(stderr, "FAIL: probe %d: Status: %s: %s\n", probes, ovl_strerror(st),
                    ovl_last_error(cl));
            ok = false;
            break;
        }
        in_flight = 0;
        done = 0;
        if (r->body_case == OVL__RESPONSE__BODY_STATUS && r->status)
            for (size_t i = 0; i < r->status->n_jobs; i++)
                if (strcmp(r->status->jobs[i]->id, JOB_ID) == 0) {
                    in_flight = r->status->jobs[i]->ops_in_flight;
                    done = r->status->jobs[i]->ops_done;
                }
        libovl_response_free(r);
        if (took > PROBE_LIMIT_S) {
            fprintf(stderr,
                    "FAIL: probe %d: ovld answered Status after %.0f ms (limit %.0f ms): its loop "
                    "was blocked while %u ops were queued\n",
                    probes, took * 1e3, PROBE_LIMIT_S * 1e3, in_flight);
            ok = false;
            break;
        }
        if (in_flight >= NOPS || ovl_mono_s() - t_start > PROBE_WINDOW_S)
            break;
        gpu_sleep_ms(20);
        t0 = ovl_mono_s();
    }
    ovl_disconnect(cl);
    printf("probe: %d Status round trips while the stream was gated, the slowest %.1f ms; ovld "
           "then had %u ops of the job in flight, %" PRIu64 " done (1 before the gate)\n",
           probes, worst * 1e3, in_flight, done);
    if (ok && done > 1) {
        /* nothing can be done before the gate opens (but the fresh job's
         * first ring op, waited for before the gate closed) */
        fprintf(stderr, "FAIL: %" PRIu64 " ops done while the stream was gated\n", done);
        ok = false;
    }
    return ok;
}

/* ------------------------------------------------------------ the rank */

static int passed, failed;

static void check(bool ok)
{
    if (ok)
        passed++;
    else
        failed++;
}

/* The rank's process: returns 0, 1 or GPU_SKIP_CODE; its counts go to rfd. */
static int rank_main(int rfd)
{
    const uint32_t rank = 0; /* for OVL_DEMO_CK */
    int rc = 1, ndev = 0;
    const size_t es = ovl_dtype_size(DTYPE);
    ovl_client_t *cl = NULL;
    ovl_comm_t *comm = NULL;
    cudaStream_t s = NULL;
    char *arena = NULL, *ga = NULL;
    float *ga32 = NULL, *b32 = NULL, *ref = NULL;
    double *acc = NULL;
    void *ws = NULL;
    ovld_lt_t *lt = NULL;
    char err[256];
    op_t ops[NOPS];

    if (ovl_connect(NULL, &cl) != OVL_OK) {
        fprintf(stderr, "ovl_connect: %s\n", ovl_connect_error());
        goto out;
    }
    ovl_set_timeout(cl, 60000);
    ovl_daemon_info_t info;
    if (ovl_daemon_info(cl, &info) != OVL_OK || strcmp(info.backend, "cuda") != 0) {
        fprintf(stderr, "ovld does not run the cuda backend\n");
        goto out;
    }
    if (info.ndevices < 1) {
        printf("SKIP: ovld has no GPU\n");
        rc = GPU_SKIP_CODE;
        goto out;
    }
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1) {
        printf("SKIP: no GPU visible to the test (%s)\n",
               ce != cudaSuccess ? cudaGetErrorName(ce) : "0 devices");
        rc = GPU_SKIP_CODE;
        goto out;
    }
    OVL_DEMO_CK(cudaSetDevice(0));
    if (ovl_comm_init(cl, JOB_ID "-warm-up", 1, 0, 0, &comm) != OVL_OK) {
        fprintf(stderr, "ovl_comm_init: %s\n", ovl_last_error(cl));
        goto out;
    }
    OVL_DEMO_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* A (the largest op's), B (the largest k's rows; an op uses its first k)
     * and one C slot per op, in one allocation: the only memory ovld maps,
     * registered by the first op, so that no later op needs a round trip. */
    uint64_t max_mk = 0, max_m = 0, max_k = 0;
    for (int i = 0; i < NOPS; i++) {
        ops[i] = op_shape(i);
        if (ops[i].m * ops[i].k > max_mk)
            max_mk = ops[i].m * ops[i].k;
        if (ops[i].m > max_m)
            max_m = ops[i].m;
        if (ops[i].k > max_k)
            max_k = ops[i].k;
    }
    size_t cur = 0;
    size_t off_a = place(&cur, max_mk * es);
    size_t off_b = place(&cur, max_k * N * es);
    size_t c_from = cur;
    for (int i = 0; i < NOPS; i++)
        ops[i].c_off = place(&cur, ops[i].m * N * es);
    OVL_DEMO_CK(cudaMalloc((void **)&arena, cur));
    void *a = arena + off_a, *b = arena + off_b;
    OVL_DEMO_CK(ovl_demo_fill(DTYPE, b, max_k, N, N, SEED_BASE, 0, 1, s));

    /* A warm-up pass, ungated and waited for, on a job of its own: every
     * op's shape once, so that CUDA's lazy loading has loaded every kernel
     * cuBLASLt picks (loading a kernel blocks the calling thread, ovld's
     * loop, while a stream waits: another hazard than this test's). Then a
     * fresh job, whose rank has no scratch yet, for the gated pass; its
     * arena stays registered on the connection. */
    for (int i = 0; i < NOPS; i++) {
        const op_t *o = &ops[i];
        OVL_DEMO_CK(ovl_demo_fill(DTYPE, a, o->m, o->k, o->k, o->seed, 0, 0, s));
        ovl_ag_gemm_desc_t w = op_desc(o, a, b, arena);
        if (ovl_allgather_gemm(comm, &w, s) != OVL_OK) {
            fprintf(stderr, "warm-up op %d: %s\n", i, ovl_last_error(cl));
            goto out;
        }
    }
    OVL_DEMO_CK(cudaStreamSynchronize(s));
    if (ovl_comm_check(comm) != OVL_OK || ovl_comm_destroy(comm) != OVL_OK) {
        fprintf(stderr, "the warm-up pass: %s\n", ovl_last_error(cl));
        goto out;
    }
    comm = NULL;
    if (ovl_comm_init(cl, JOB_ID, 1, 0, 0, &comm) != OVL_OK) {
        fprintf(stderr, "ovl_comm_init: %s\n", ovl_last_error(cl));
        goto out;
    }
    /* One ring op (it takes no scratch), waited for: the fresh job is
     * ready, its communicator made, so that the gated ops are issued while
     * the gate holds, not queued until it opened. */
    {
        const op_t *o = &ops[0];
        ovl_ag_gemm_desc_t w = op_desc(o, a, b, arena);
        if (o->algo != OVL_ALGO_RING || ovl_allgather_gemm(comm, &w, s) != OVL_OK) {
            fprintf(stderr, "the fresh job's ring op: %s\n", ovl_last_error(cl));
            goto out;
        }
        OVL_DEMO_CK(cudaStreamSynchronize(s));
        if (ovl_comm_check(comm) != OVL_OK) {
            fprintf(stderr, "the fresh job's ring op: %s\n", ovl_last_error(cl));
            goto out;
        }
    }
    OVL_DEMO_CK(cudaMemsetAsync(arena + c_from, 0xff, cur - c_from, s)); /* NaN in bf16 */
    OVL_DEMO_CK(cudaStreamSynchronize(s));

    /* The gate, then every op behind it: one stream, no host synchronization. */
    atomic_store(&gate_open, 0);
    atomic_store(&gate_timed_out, 0);
    OVL_DEMO_CK(cudaLaunchHostFunc(s, gate_wait, NULL));
    double t0 = ovl_mono_s();
    for (int i = 0; i < NOPS; i++) {
        const op_t *o = &ops[i];
        OVL_DEMO_CK(ovl_demo_fill(DTYPE, a, o->m, o->k, o->k, o->seed, 0, 0, s));
        ovl_ag_gemm_desc_t d = op_desc(o, a, b, arena);
        if (ovl_allgather_gemm(comm, &d, s) != OVL_OK) {
            fprintf(stderr, "ovl_allgather_gemm %d (%s, m=%" PRIu64 " k=%" PRIu64 "): %s\n", i,
                    o->what, o->m, o->k, ovl_last_error(cl));
            goto out;
        }
    }
    double t_sub = ovl_mono_s() - t0;

    /* ovld's loop must answer while its ops wait on this stream. */
    bool probe_ok = probe_loop();
    atomic_store(&gate_open, 1);
    if (atomic_load(&gate_timed_out)) {
        fprintf(stderr, "FAIL: the gate opened by itself after %.0f s (the probe was stuck)\n",
                GATE_LIMIT_S);
        probe_ok = false;
    }
    check(probe_ok);

    OVL_DEMO_CK(cudaStreamSynchronize(s));
    double t_all = ovl_mono_s() - t0;
    ovl_status_t st = ovl_comm_check(comm);
    if (st != OVL_OK)
        fprintf(stderr, "FAIL: ovl_comm_check: %s: %s\n", ovl_strerror(st), ovl_last_error(cl));
    check(st == OVL_OK);
    printf("%d ops enqueued in %.1f ms, all done after %.1f ms\n", NOPS, t_sub * 1e3, t_all * 1e3);

    /* Every slot against the reference from its seed's A and B. */
    OVL_DEMO_CK(cudaMalloc((void **)&ga, max_mk * es));
    OVL_DEMO_CK(cudaMalloc((void **)&ga32, max_mk * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&b32, max_k * N * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&ref, max_m * N * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&acc, 3 * sizeof(double)));
    OVL_DEMO_CK(cudaMalloc(&ws, OVLD_LT_WORKSPACE));
    if (ovld_lt_create(&lt, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "%s\n", err);
        goto out;
    }
    OVL_DEMO_CK(ovl_demo_to_f32(DTYPE, b, max_k, N, N, b32, s));
    int bad = 0;
    for (int i = 0; i < NOPS; i++) {
        const op_t *o = &ops[i];
        if (ovl_demo_reference(lt, ws, DTYPE, 1, o->m, N, o->k, o->seed, b32, false, ga, ga32, ref,
                               s, err, sizeof(err)) != OVL_OK) {
            fprintf(stderr, "%s\n", err);
            goto out;
        }
        double h[3];
        OVL_DEMO_CK(cudaMemsetAsync(acc, 0, sizeof(h), s));
        OVL_DEMO_CK(ovl_demo_error_acc(DTYPE, arena + o->c_off, N, ref, o->m, N, acc, s));
        OVL_DEMO_CK(cudaMemcpyAsync(h, acc, sizeof(h), cudaMemcpyDeviceToHost, s));
        OVL_DEMO_CK(cudaStreamSynchronize(s));
        double e = ovl_demo_rel_error(h);
        bool ok = e < TOLERANCE && h[2] == 0;
        check(ok);
        if (!ok) {
            bad++;
            fprintf(stderr,
                    "FAIL: op %d (round %d, %s, m=%" PRIu64 " k=%" PRIu64
                    "): rel. error %.3e, %.0f non-finite\n",
                    i, i / OPS_PER_ROUND, o->what, o->m, o->k, e, h[2]);
        }
    }
    printf("%d of %d results wrong (tolerance %.0e)\n", bad, NOPS, TOLERANCE);
    rc = failed == 0 ? 0 : 1;
out:
    atomic_store(&gate_open, 1);
    if (s)
        cudaStreamSynchronize(s);
    /* ovld must forget the arena before it is freed: first its ops, then it. */
    if (comm)
        (void)ovl_comm_synchronize(comm);
    ovl_mem_t *mem;
    if (arena && cl && ovl_mem_register(cl, arena, 1, &mem) == OVL_OK)
        (void)ovl_mem_deregister(cl, mem);
    if (comm && ovl_comm_destroy(comm) != OVL_OK) {
        fprintf(stderr, "FAIL: ovl_comm_destroy: %s\n", ovl_last_error(cl));
        failed++;
        rc = 1;
    }
    ovl_disconnect(cl);
    if (lt)
        ovld_lt_destroy(lt);
    cudaFree(ws);
    cudaFree(acc);
    cudaFree(ref);
    cudaFree(b32);
    cudaFree(ga32);
    cudaFree(ga);
    cudaFree(arena);
    if (s)
        cudaStreamDestroy(s);
    return gpu_rank_report(rfd, rc, passed, failed);
}

/* ------------------------------------------------------------ main */

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    /* Room for every op at once: libovl must not wait on the host for an
     * op behind the gate. */
    char conf[64];
    snprintf(conf, sizeof(conf), "max_ops_in_flight = %d\n", WINDOW);
    gpu_daemon_t d;
    int st = gpu_daemon_start(&d, "scratch", conf, GPU_LOG_NO_DEBUG);
    if (st != 0) {
        gpu_daemon_cleanup(&d);
        return st;
    }
    setenv("OVL_SOCKET", d.sock, 1);

    double t0 = ovl_mono_s();
    gpu_rank_result_t rr;
    if (gpu_run_rank(rank_main, TEST_LIMIT_S, &rr) != 0) {
        gpu_daemon_cleanup(&d);
        return 1;
    }
    int code = rr.code;
    bool timed_out = rr.timed_out;

    bool stopped = gpu_daemon_stop(&d);
    if (code == GPU_SKIP_CODE && stopped) {
        gpu_daemon_cleanup(&d);
        return GPU_SKIP_CODE; /* the rank said why */
    }

    passed = rr.passed;
    failed = rr.failed;
    if (!rr.counted || code != 0) {
        if (!rr.counted || rr.failed == 0)
            failed++; /* the rank died, timed out or skipped alone */
        fprintf(stderr, "FAIL: the rank exited %d\n", code);
    }
    static const char *const refusals[] = {
        "scratch cannot grow",          /* cuda_rank.c: freed under ops in flight */
        "scratch would grow under",     /* job.c: issued past the hold-back */
        "the event loop has not turned" /* stall.c: the loop stood still */
    };
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        bool seen = gpu_daemon_log_has(&d, refusals[i]);
        if (seen)
            fprintf(stderr, "FAIL: ovld's log says \"%s\"\n", refusals[i]);
        check(!seen);
    }
    check(stopped);
    if (failed || timed_out)
        gpu_daemon_print_log(&d, GPU_LOG_NO_DEBUG);
    printf("scratch growth: %.1f s\n", ovl_mono_s() - t0);
    printf("%d passed, %d failed\n", passed, failed);
    gpu_daemon_cleanup(&d);
    return failed == 0 && !timed_out ? 0 : 1;
}

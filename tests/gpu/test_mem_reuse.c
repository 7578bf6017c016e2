/*
 * test_mem_reuse.c: libovl notices device memory that the application freed
 * and whose address cudaMalloc handed out again, and registers the new
 * allocation. One GPU (device 0), one rank (world 1), one stream.
 *
 * The bug this guards against: libovl registers the memory an op names by
 * CUDA IPC (ovld maps it) and caches the registration by address. An
 * application that frees a buffer it gave to ovl, without deregistering it,
 * and allocates again of the same size usually gets the same address back
 * from cudaMalloc, but another allocation. A cache that looked at the
 * address alone kept the old registration, and ovld went on reading the
 * freed allocation through its stale IPC mapping (which keeps that memory
 * alive, holding the previous op's data): the op computed the previous
 * round's product, with no error anywhere.
 *
 * The test starts its own ovld ($OVLD_BIN, CUDA backend, a socket in a
 * temporary directory: gpu_daemon.h) and forks one rank process. The rank
 * allocates B (filled once) and C once, then runs ROUNDS rounds of
 *
 *   cudaMalloc A (an allocation of its own, of 2 MiB: A_BYTES says why;
 *   the op's m x k at its start), fill it for a seed of the round's own;
 *   poison C (NaN); one naive AG-GEMM (bf16, m = n = k = 256, no
 *   transpose); cudaStreamSynchronize; ovl_comm_check must be OVL_OK; C
 *   against a cuBLASLt fp32 product of the round's A and B:
 *   relative error below 1e-2 and no non-finite element (a stale mapping
 *   gives the previous round's product, far off); cudaFree A, WITHOUT
 *   deregistering it (the case under test; ovld still maps it, which is
 *   fine for CUDA).
 *
 * It counts the rounds whose A lay at an address an earlier round's A had:
 * if none did, cudaMalloc never handed an address out again, nothing was
 * tested, and the test skips (77) rather than pass. Then, through the
 * public API only: A is allocated again and registered (ovl_mem_register),
 * freed, and allocated again; if the address came back, registering it must
 * make a new registration: ovld's counters (ovl_stats_json) must show one
 * registration more and one deregistration more (the stale one dropped).
 * (The two ovl_mem_t pointers are not compared: libovl frees the stale one
 * before it makes the new one, and malloc may well return the same memory.)
 * Last, what is still registered is deregistered before it is freed, and
 * ovld must stop cleanly.
 *
 * It prints "N passed, N failed" and exits 0 only if all checks pass; it
 * kills the rank and fails after 60 s. It exits 77 (ctest's skip code) when
 * ovld cannot start the CUDA backend, there is no GPU, or no address was
 * handed out again. The parent itself never touches CUDA (it forks ovld and
 * the rank).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
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
#include "ovl.h"
#include "clock.h"
#include "gpu_daemon.h"

#define ROUNDS       8
#define SEED_BASE    20250611u
#define SEED_B       20250612u
#define M            256
#define N            256
#define K            256
#define DTYPE        OVL_DTYPE_BF16
#define TOLERANCE    1e-2
#define TEST_LIMIT_S 60.0
#define JOB_ID       "mem-reuse"
/* A's allocation: its m x k elements, rounded up to 2 MiB. cudaMalloc
 * sub-allocates smaller sizes from larger blocks, and CUDA IPC then shares
 * the whole block (the CUDA Programming Guide, "Interprocess
 * Communication"): a small A freed and allocated again at its address would
 * likely be the same memory of the same block, which ovld's stale mapping
 * reads correctly, and the rounds would not see the bug. */
#define A_GRAIN ((size_t)2 << 20)
#define A_BYTES (((size_t)M * K * 2 /* bf16 */ + A_GRAIN - 1) / A_GRAIN * A_GRAIN)

/* ------------------------------------------------------------ helpers */

static int passed, failed;

static void check(bool ok)
{
    if (ok)
        passed++;
    else
        failed++;
}

/* Makes ovld forget the memory holding p (if libovl registered it) before
 * it is freed: the registration of its allocation, then its deregistration. */
static void forget(ovl_client_t *cl, void *p)
{
    ovl_mem_t *mem;
    if (p && cl && ovl_mem_register(cl, p, 1, &mem) == OVL_OK)
        (void)ovl_mem_deregister(cl, mem);
}

/* The value of "key": in the "total" block of ovld's counters (ovl_stats_json:
 * docs/ovlctl.md). */
static bool total_counter(const char *json, const char *key, uint64_t *ret)
{
    const char *total = strstr(json, "\"total\":{");
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *at = total ? strstr(total, pat) : NULL;
    if (!at)
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(at + strlen(pat), &end, 10);
    if (errno != 0 || end == at + strlen(pat))
        return false;
    *ret = v;
    return true;
}

/* ovld's registrations and deregistrations since it started. */
static bool reg_counters(ovl_client_t *cl, uint64_t *regs, uint64_t *deregs)
{
    char *json = NULL;
    ovl_status_t st = ovl_stats_json(cl, 0, &json);
    if (st != OVL_OK) {
        fprintf(stderr, "ovl_stats_json: %s: %s\n", ovl_strerror(st), ovl_last_error(cl));
        return false;
    }
    bool ok = total_counter(json, "registrations", regs) &&
              total_counter(json, "deregistrations", deregs);
    if (!ok)
        fprintf(stderr, "no registration counters in ovld's stats: %.200s\n", json);
    ovl_free(json);
    return ok;
}

/* ------------------------------------------------------------ the rank */

/* The rank's process: returns 0, 1 or GPU_SKIP_CODE; its counts go to rfd. */
static int rank_main(int rfd)
{
    const uint32_t rank = 0; /* for OVL_DEMO_CK */
    int rc = 1, ndev = 0;
    const size_t es = ovl_dtype_size(DTYPE);
    const size_t a_bytes = A_BYTES;
    ovl_client_t *cl = NULL;
    ovl_comm_t *comm = NULL;
    cudaStream_t s = NULL;
    void *a = NULL, *b = NULL, *c = NULL, *ga = NULL;
    float *ga32 = NULL, *b32 = NULL, *ref = NULL;
    double *acc = NULL;
    void *ws = NULL;
    ovld_lt_t *lt = NULL;
    char err[256];
    void *addrs[ROUNDS];
    int reused = 0;

    if (ovl_connect(NULL, &cl) != OVL_OK) {
        fprintf(stderr, "ovl_connect: %s\n", ovl_connect_error());
        goto out;
    }
    ovl_set_timeout(cl, 30000);
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
    if (ovl_comm_init(cl, JOB_ID, 1, 0, 0, &comm) != OVL_OK) {
        fprintf(stderr, "ovl_comm_init: %s\n", ovl_last_error(cl));
        goto out;
    }
    OVL_DEMO_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    /* Everything but A first, so that nothing is allocated between a
     * round's cudaFree and the next round's cudaMalloc. */
    OVL_DEMO_CK(cudaMalloc(&b, (size_t)K * N * es));
    OVL_DEMO_CK(cudaMalloc(&c, (size_t)M * N * es));
    OVL_DEMO_CK(cudaMalloc(&ga, (size_t)M * K * es));
    OVL_DEMO_CK(cudaMalloc((void **)&ga32, (size_t)M * K * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&b32, (size_t)K * N * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&ref, (size_t)M * N * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&acc, 3 * sizeof(double)));
    OVL_DEMO_CK(cudaMalloc(&ws, OVLD_LT_WORKSPACE));
    if (ovld_lt_create(&lt, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "%s\n", err);
        goto out;
    }
    OVL_DEMO_CK(ovl_demo_fill(DTYPE, b, K, N, N, SEED_B, 0, 1, s));
    OVL_DEMO_CK(ovl_demo_to_f32(DTYPE, b, K, N, N, b32, s));
    OVL_DEMO_CK(cudaStreamSynchronize(s));

    /* The rounds: A allocated, used once, freed without deregistering. */
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t seed = SEED_BASE + (uint64_t)r;
        OVL_DEMO_CK(cudaMalloc(&a, a_bytes));
        addrs[r] = a;
        bool again = false;
        for (int i = 0; i < r; i++)
            if (addrs[i] == a)
                again = true;
        if (again)
            reused++;
        OVL_DEMO_CK(ovl_demo_fill(DTYPE, a, M, K, K, seed, 0, 0, s));
        OVL_DEMO_CK(cudaMemsetAsync(c, 0xff, (size_t)M * N * es, s)); /* NaN in bf16 */
        ovl_ag_gemm_desc_t d = {.a = a,
                                .lda = K,
                                .b = b,
                                .ldb = N,
                                .transb = 0,
                                .c = c,
                                .ldc = N,
                                .m = M,
                                .n = N,
                                .k = K,
                                .dtype = DTYPE,
                                .algo = OVL_ALGO_NAIVE};
        if (ovl_allgather_gemm(comm, &d, s) != OVL_OK) {
            fprintf(stderr, "FAIL: round %d: ovl_allgather_gemm: %s\n", r, ovl_last_error(cl));
            failed++;
            goto out;
        }
        OVL_DEMO_CK(cudaStreamSynchronize(s));
        ovl_status_t st = ovl_comm_check(comm);
        check(st == OVL_OK);
        if (st != OVL_OK) {
            /* sticky: every later round would say the same */
            fprintf(stderr, "FAIL: round %d: ovl_comm_check: %s: %s\n", r, ovl_strerror(st),
                    ovl_last_error(cl));
            goto out;
        }
        if (ovl_demo_reference(lt, ws, DTYPE, 1, M, N, K, seed, b32, false, ga, ga32, ref, s, err,
                               sizeof(err)) != OVL_OK) {
            fprintf(stderr, "%s\n", err);
            goto out;
        }
        double h[3];
        OVL_DEMO_CK(cudaMemsetAsync(acc, 0, sizeof(h), s));
        OVL_DEMO_CK(ovl_demo_error_acc(DTYPE, c, N, ref, M, N, acc, s));
        OVL_DEMO_CK(cudaMemcpyAsync(h, acc, sizeof(h), cudaMemcpyDeviceToHost, s));
        OVL_DEMO_CK(cudaStreamSynchronize(s));
        double e = ovl_demo_rel_error(h);
        bool ok = e < TOLERANCE && h[2] == 0;
        check(ok);
        printf("round %d: A at %p (reused: %s), rel. error %.3e\n", r, a, again ? "yes" : "no", e);
        if (!ok) {
            bad++;
            fprintf(stderr, "FAIL: round %d: rel. error %.3e, %.0f non-finite (tolerance %.0e)%s\n",
                    r, e, h[2], TOLERANCE,
                    again ? ": ovld read another allocation at this address" : "");
        }
        /* Freed as it is, still registered: the case under test. */
        OVL_DEMO_CK(cudaFree(a));
        a = NULL;
    }
    printf("%d of %d rounds got an address an earlier round had; %d results wrong\n", reused,
           ROUNDS, bad);
    if (reused == 0 && failed == 0) {
        printf("SKIP: cudaMalloc never handed an address out again\n");
        rc = GPU_SKIP_CODE;
        goto out;
    }

    /* The same through the public API: a registration of a freed
     * allocation must not stand for the next one at its address. */
    {
        void *a2 = NULL;
        ovl_mem_t *m1 = NULL, *m2 = NULL;
        OVL_DEMO_CK(cudaMalloc(&a, a_bytes));
        ovl_status_t st = ovl_mem_register(cl, a, a_bytes, &m1);
        if (st != OVL_OK)
            fprintf(stderr, "FAIL: ovl_mem_register(%p): %s: %s\n", a, ovl_strerror(st),
                    ovl_last_error(cl));
        check(st == OVL_OK);
        OVL_DEMO_CK(cudaFree(a)); /* still registered */
        void *freed = a;
        a = NULL;
        OVL_DEMO_CK(cudaMalloc(&a2, a_bytes));
        a = a2; /* out: frees it */
        if (a2 != freed) {
            printf("the registration check did not run: cudaMalloc returned %p, not %p again\n", a2,
                   freed);
            if (m1) {
                st = ovl_mem_deregister(cl, m1);
                if (st != OVL_OK)
                    fprintf(stderr, "FAIL: ovl_mem_deregister: %s: %s\n", ovl_strerror(st),
                            ovl_last_error(cl));
                check(st == OVL_OK);
            }
        } else {
            uint64_t r0 = 0, d0 = 0, r1 = 0, d1 = 0;
            if (!reg_counters(cl, &r0, &d0))
                goto out;
            st = ovl_mem_register(cl, a2, a_bytes, &m2);
            m1 = NULL; /* libovl may have freed it: not to be touched again */
            if (st != OVL_OK)
                fprintf(stderr, "FAIL: ovl_mem_register(%p) again: %s: %s\n", a2, ovl_strerror(st),
                        ovl_last_error(cl));
            check(st == OVL_OK);
            if (!reg_counters(cl, &r1, &d1))
                goto out;
            bool fresh = r1 == r0 + 1 && d1 == d0 + 1;
            printf("registration check: %p registered, freed, allocated again at the same "
                   "address, registered: %" PRIu64 " registration(s) and %" PRIu64
                   " deregistration(s) at ovld (want 1 and 1)\n",
                   a2, r1 - r0, d1 - d0);
            if (!fresh)
                fprintf(stderr,
                        "FAIL: registering the new allocation at %p made %" PRIu64
                        " registration(s) and dropped %" PRIu64
                        " (want 1 and 1: the stale registration stood for it)\n",
                        a2, r1 - r0, d1 - d0);
            check(fresh);
            if (st == OVL_OK) {
                st = ovl_mem_deregister(cl, m2);
                if (st != OVL_OK)
                    fprintf(stderr, "FAIL: ovl_mem_deregister: %s: %s\n", ovl_strerror(st),
                            ovl_last_error(cl));
                check(st == OVL_OK);
            }
        }
        OVL_DEMO_CK(cudaFree(a));
        a = NULL;
    }
    rc = failed == 0 ? 0 : 1;
out:
    if (s)
        cudaStreamSynchronize(s);
    /* ovld must forget the memory before it is freed: first its ops, then it. */
    if (comm)
        (void)ovl_comm_synchronize(comm);
    forget(cl, a);
    forget(cl, b);
    forget(cl, c);
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
    cudaFree(c);
    cudaFree(b);
    cudaFree(a);
    if (s)
        cudaStreamDestroy(s);
    return gpu_rank_report(rfd, rc, passed, failed);
}

/* ------------------------------------------------------------ main */

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    gpu_daemon_t d;
    int st = gpu_daemon_start(&d, "mem-reuse", "# ovld's defaults\n", GPU_LOG_NO_DEBUG);
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
    check(stopped);
    if (failed || timed_out)
        gpu_daemon_print_log(&d, GPU_LOG_NO_DEBUG);
    printf("memory reuse: %.1f s\n", ovl_mono_s() - t0);
    printf("%d passed, %d failed\n", passed, failed);
    gpu_daemon_cleanup(&d);
    return failed == 0 && !timed_out ? 0 : 1;
}

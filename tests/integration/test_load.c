/*
 * test_load.c: the good path of a real ovld (host backend) under load: ops
 * back to back on one job, two jobs at once sharing devices, a world-1 job
 * whose scratch grows while ops are queued, and strided layouts (gathered
 * by pulls); every result checked exactly (fp32 with small integers).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cmocka_fixture.h"
#include "daemon_fixture.h"
#include "libovl_internal.h"
#include "ops_fixture.h"

/* Fixtures: cmocka_fixture.h; ranks, Status and raw helpers: ops_fixture.h. */

/* Ten ops on a world-2 job, submitted back to back by each rank (rank 0's
 * ten before rank 1's first), one synchronize each; every op has its own
 * buffers and data, a different algorithm, transb, a_out and chunks. */
static void test_back_to_back_ops(void **state)
{
    test_daemon_t *d = *state;
    enum { NOPS = 10 };
    rank_t rk[2];
    rank_open(d, &rk[0], "b2b", 2, 0, 0, NOPS);
    rank_open(d, &rk[1], "b2b", 2, 1, 1, NOPS);
    opspec_t spec[NOPS];
    for (unsigned i = 0; i < NOPS; i++) {
        spec[i] =
            (opspec_t){.m = 8,
                       .n = 12,
                       .k = 16,
                       .transb = (int)(i % 2),
                       .aout = i % 3 == 0,
                       .dtype = OVL_DTYPE_FP32,
                       .algo = (ovl_algo_t)(i % (OVL_ALGO_RING + 1)) /* all-gather + GEMM's */,
                       .chunks = i % 5 == 2 ? 4 : 0,
                       .streams = i % 7 == 3 ? 2 : 0,
                       .salt = i};
        for (int r = 0; r < 2; r++)
            rank_fill(&rk[r], i, &spec[i]);
    }
    for (int r = 0; r < 2; r++)
        for (unsigned i = 0; i < NOPS; i++)
            assert_status(rank_submit(&rk[r], i, &spec[i]), OVL_OK);
    for (int r = 0; r < 2; r++)
        rank_sync_ok(&rk[r]);
    for (int r = 0; r < 2; r++)
        for (unsigned i = 0; i < NOPS; i++)
            rank_check(&rk[r], i, &spec[i]);
    wait_job_ops_done(rk[0].cl, "b2b", NOPS);
    wait_job_in_flight(rk[0].cl, "b2b", 0);
    Ovl__Response *resp = status_call(rk[0].cl);
    const Ovl__JobInfo *j = find_job(resp, "b2b");
    assert_non_null(j);
    assert_string_equal(j->state, "ready");
    libovl_response_free(resp);
    for (int r = 0; r < 2; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* Ops whose A and a_out have a leading dimension larger than k (NaN in the
 * padding), on a world-3 job: NCCL cannot move such rows in one piece, so
 * ovld's plans gather them by copy-engine pulls ordered by events (the
 * host backend's collective refuses them as NCCL would). Every algorithm,
 * with and without a_out, chunked or not, back to back; every result
 * checked exactly. */
static void test_strided_layouts(void **state)
{
    test_daemon_t *d = *state;
    enum { NOPS = 6, W = 3 };
    rank_t rk[W];
    for (uint32_t r = 0; r < W; r++)
        rank_open(d, &rk[r], "strided", W, r, (int)r, NOPS);
    opspec_t spec[NOPS];
    for (unsigned i = 0; i < NOPS; i++) {
        spec[i] = (opspec_t){.m = 5,
                             .n = 7,
                             .k = 6,
                             .transb = (int)(i % 2),
                             .aout = i % 3 != 2,
                             .dtype = OVL_DTYPE_FP32,
                             .algo = (ovl_algo_t)(OVL_ALGO_NAIVE + i % 3),
                             .chunks = i < 3 ? 0 : 2,
                             .salt = i,
                             .pad = 1 + i % 4};
        for (uint32_t r = 0; r < W; r++)
            rank_fill(&rk[r], i, &spec[i]);
    }
    for (uint32_t r = 0; r < W; r++)
        for (unsigned i = 0; i < NOPS; i++)
            assert_status(rank_submit(&rk[r], i, &spec[i]), OVL_OK);
    for (uint32_t r = 0; r < W; r++)
        rank_sync_ok(&rk[r]);
    for (uint32_t r = 0; r < W; r++)
        for (unsigned i = 0; i < NOPS; i++)
            rank_check(&rk[r], i, &spec[i]);
    for (uint32_t r = 0; r < W; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* A world-1 ring op gathers nothing, yet it used to raise the job's scratch
 * size, so that the next naive op larger than the scratch the ranks held
 * was not held back: its issue reallocated scratch that a queued op was
 * about to gather into (heap-use-after-free in ovld under ASan, a crash or
 * a hang without). One client alternates a large ring op with small and
 * growing naive ops, unsynchronised; every result is checked. */
static void test_scratch_growth_world1(void **state)
{
    test_daemon_t *d = *state;
    enum { ROUNDS = 20, OPS = 3 * ROUNDS };
    rank_t rk;
    rank_open(d, &rk, "scratch-growth", 1, 0, 0, OPS);
    opspec_t specs[OPS];
    for (unsigned r = 0; r < ROUNDS; r++) {
        opspec_t ring = base_spec, small = base_spec, medium = base_spec;
        ring.algo = OVL_ALGO_RING;
        ring.m = MAXDIM;
        ring.k = MAXDIM;
        small.algo = OVL_ALGO_NAIVE;
        small.m = 2;
        small.k = 2;
        medium.algo = OVL_ALGO_NAIVE;
        medium.m = 3 + r % (MAXDIM - 3); /* its scratch grows, round after round */
        medium.k = 3 + r % (MAXDIM - 3);
        specs[3 * r] = ring;
        specs[3 * r + 1] = small;
        specs[3 * r + 2] = medium;
    }
    for (unsigned i = 0; i < OPS; i++) {
        specs[i].salt = i;
        rank_fill(&rk, i, &specs[i]);
    }
    for (unsigned i = 0; i < OPS; i++)
        assert_status(rank_submit(&rk, i, &specs[i]), OVL_OK);
    rank_sync_ok(&rk);
    for (unsigned i = 0; i < OPS; i++)
        rank_check(&rk, i, &specs[i]);
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    assert_status(rank_close(&rk), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* Two jobs on one daemon at once (sharing devices), their submissions
 * interleaved: both correct. */
static void test_two_jobs_interleaved(void **state)
{
    test_daemon_t *d = *state;
    enum { NOPS = 4 };
    rank_t x[2], y[3];
    for (uint32_t r = 0; r < 2; r++)
        rank_open(d, &x[r], "job-x", 2, r, (int)r, NOPS);
    for (uint32_t r = 0; r < 3; r++)
        rank_open(d, &y[r], "job-y", 3, r, (int)(2 - r), NOPS);
    opspec_t sx[NOPS], sy[NOPS];
    for (unsigned i = 0; i < NOPS; i++) {
        sx[i] = (opspec_t){.m = 4,
                           .n = 6,
                           .k = 5,
                           .dtype = OVL_DTYPE_FP32,
                           .algo = (ovl_algo_t)(i % 4),
                           .salt = 20 + i};
        sy[i] = (opspec_t){.m = 3,
                           .n = 7,
                           .k = 9,
                           .transb = 1,
                           .aout = i % 2 == 1,
                           .dtype = OVL_DTYPE_FP32,
                           .algo = (ovl_algo_t)(3 - i % 4),
                           .salt = 40 + i};
        for (uint32_t r = 0; r < 2; r++)
            rank_fill(&x[r], i, &sx[i]);
        for (uint32_t r = 0; r < 3; r++)
            rank_fill(&y[r], i, &sy[i]);
    }
    for (unsigned i = 0; i < NOPS; i++) {
        assert_status(rank_submit(&x[0], i, &sx[i]), OVL_OK);
        assert_status(rank_submit(&y[2], i, &sy[i]), OVL_OK);
        assert_status(rank_submit(&y[0], i, &sy[i]), OVL_OK);
        if (i % 2 == 1) { /* x1 and y1 lag one op behind, then catch up */
            assert_status(rank_submit(&x[1], i - 1, &sx[i - 1]), OVL_OK);
            assert_status(rank_submit(&y[1], i - 1, &sy[i - 1]), OVL_OK);
            assert_status(rank_submit(&x[1], i, &sx[i]), OVL_OK);
            assert_status(rank_submit(&y[1], i, &sy[i]), OVL_OK);
        }
    }
    for (uint32_t r = 0; r < 3; r++)
        rank_sync_ok(&y[r]);
    for (uint32_t r = 0; r < 2; r++)
        rank_sync_ok(&x[r]);
    for (unsigned i = 0; i < NOPS; i++) {
        for (uint32_t r = 0; r < 2; r++)
            rank_check(&x[r], i, &sx[i]);
        for (uint32_t r = 0; r < 3; r++)
            rank_check(&y[r], i, &sy[i]);
    }
    for (uint32_t r = 0; r < 2; r++)
        assert_status(rank_close(&x[r]), OVL_OK);
    for (uint32_t r = 0; r < 3; r++)
        assert_status(rank_close(&y[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* B i's values (i >= 1): small integers, exact in fp32, other than B 0's. */
static float more_b_val(uint32_t r, uint64_t row, uint64_t col, uint32_t i, unsigned salt)
{
    return (float)((int)((r * 3u + row * 5u + col * 2u + i * 7u + salt * 11u) % 5u) - 2);
}

/* Ops of 3 Bs, each its own n (B 0 the fixture's, n 6; B 1 n 3, B 2 n 9):
 * every algorithm, transb and not, a_out and not, worlds 1 to 4. A is
 * gathered once; C 0 (and a_out) checked by the fixture, C 1 and C 2 here
 * against every rank's A, exactly. */
static void test_multi_b(void **state)
{
    test_daemon_t *d = *state;
    static const uint64_t more_n[2] = {3, 9};
    for (uint32_t world = 1; world <= MAXW; world++) {
        char job[32];
        snprintf(job, sizeof(job), "multi-b-%u", world);
        rank_t rk[MAXW];
        float *xb[MAXW][2], *xc[MAXW][2];
        for (uint32_t r = 0; r < world; r++) {
            rank_open(d, &rk[r], job, world, r, (int)r, 1);
            for (int i = 0; i < 2; i++) {
                xb[r][i] = ovl_host_alloc(rk[r].cl, SLOT_B * sizeof(float));
                xc[r][i] = ovl_host_alloc(rk[r].cl, SLOT_C * sizeof(float));
                assert_non_null(xb[r][i]);
                assert_non_null(xc[r][i]);
            }
        }
        unsigned salt = 0;
        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++)
            for (int transb = 0; transb <= 1; transb++)
                for (int aout = 0; aout <= 1; aout++) {
                    opspec_t s = base_spec;
                    s.algo = (ovl_algo_t)a;
                    s.transb = transb;
                    s.aout = aout;
                    s.chunks = aout ? 2 : 0;
                    s.salt = salt++;
                    for (uint32_t r = 0; r < world; r++) {
                        rank_fill(&rk[r], 0, &s);
                        ovl_ag_gemm_b_t more[2];
                        for (uint32_t i = 0; i < 2; i++) {
                            uint64_t n = more_n[i];
                            uint64_t rows = transb ? n : s.k, cols = transb ? s.k : n;
                            for (uint64_t x = 0; x < rows; x++)
                                for (uint64_t y = 0; y < cols; y++)
                                    xb[r][i][x * cols + y] = more_b_val(r, x, y, i + 1, s.salt);
                            memset(xc[r][i], 0xff, SLOT_C * sizeof(float)); /* NaN */
                            more[i] = (ovl_ag_gemm_b_t){
                                .b = xb[r][i], .ldb = cols, .c = xc[r][i], .ldc = n, .n = n};
                        }
                        ovl_ag_gemm_desc_t desc = rank_desc(&rk[r], 0, &s);
                        desc.nb = 3;
                        desc.more_bs = more;
                        assert_status(ovl_allgather_gemm(rk[r].comm, &desc, NULL), OVL_OK);
                    }
                    for (uint32_t r = 0; r < world; r++)
                        rank_sync_ok(&rk[r]);
                    for (uint32_t r = 0; r < world; r++) {
                        rank_check(&rk[r], 0, &s);
                        for (uint32_t i = 0; i < 2; i++) {
                            uint64_t n = more_n[i];
                            for (uint32_t q = 0; q < world; q++)
                                for (uint64_t x = 0; x < s.m; x++)
                                    for (uint64_t y = 0; y < n; y++) {
                                        float want = 0;
                                        for (uint64_t l = 0; l < s.k; l++) {
                                            float av = rk[q].a[x * (s.k + s.pad) + l];
                                            float bv = transb ? more_b_val(r, y, l, i + 1, s.salt)
                                                              : more_b_val(r, l, y, i + 1, s.salt);
                                            want += av * bv;
                                        }
                                        float got = xc[r][i][(q * s.m + x) * n + y];
                                        if (got != want)
                                            fail_msg("world %u rank %u %s transb %d a_out %d: "
                                                     "C%u[%llu][%llu] = %g, expected %g",
                                                     world, r, ovl_algo_name(s.algo), transb, aout,
                                                     i + 1, (unsigned long long)(q * s.m + x),
                                                     (unsigned long long)y, (double)got,
                                                     (double)want);
                                    }
                        }
                    }
                }
        for (uint32_t r = 0; r < world; r++)
            assert_status(rank_close(&rk[r]), OVL_OK);
    }
    assert_alive(d);
    TEST_PASSED();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_back_to_back_ops),
        T(test_two_jobs_interleaved),
        T(test_scratch_growth_world1),
        T(test_strided_layouts),
        T(test_multi_b),
    };
    return RUN_TESTS("load", tests, argc, argv);
}

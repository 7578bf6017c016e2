/*
 * test_ops.c: how a real ovld (host backend) and libovl refuse an op that
 * is wrong, and that the daemon goes on serving afterwards:
 *
 *  - what libovl refuses before sending: ranges against its own
 *    registrations, a stream with the host backend, memory not from
 *    ovl_host_alloc, ovl_mem_register's own checks;
 *  - what the daemon refuses on its side, on a raw connection: Op
 *    requests with bad ranges, ids or fields (failed through the doorbell,
 *    the words in CommCheck), MemRegister and MemDeregister refusals, an op
 *    number out of order (a protocol error);
 *  - ranks that disagree on an op: a sticky OVL_ERR_MISMATCH naming the
 *    field, one test per field.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cmocka_fixture.h"
#include "daemon_fixture.h"
#include "doorbell.h"
#include "half.h"
#include "hostgemm.h"
#include "libovl_internal.h"
#include "ops_fixture.h"

/* Fixtures: cmocka_fixture.h; ranks, Status and raw helpers: ops_fixture.h. */

/* ============================================================ client side */

/* What libovl refuses of a GEMM + reduce-scatter before anything is sent
 * (its own rules, then the checks it shares with all-gather + GEMM): an m
 * that is not a multiple of the world, ring, an unknown reduction, a C
 * past its allocation; then a good op runs, as op 1. World 1 keeps the
 * job to this rank; the world's rule is checked on a second comm of
 * world 2 that never forms (its refusals send nothing either). */
static void test_rs_client_checks(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk;
    rank_open(d, &rk, "rs-checks", 1, 0, 0, 1);
    enum { M = 6, N = 4, K = 5 };
    float *a = rk.a, *b = rk.b, *c = rk.c;
    for (int i = 0; i < M * K; i++)
        a[i] = (float)(i % 7) - 3;
    for (int i = 0; i < K * N; i++)
        b[i] = (float)(i % 5) - 2;
    ovl_gemm_rs_desc_t good = {.a = a,
                               .lda = K,
                               .b = b,
                               .ldb = N,
                               .c = c,
                               .ldc = N,
                               .m = M,
                               .n = N,
                               .k = K,
                               .dtype = OVL_DTYPE_FP32,
                               .reduce_op = OVL_REDUCE_SUM,
                               .algo = OVL_ALGO_COLLECTIVE},
                       bad;
    bad = good;
    bad.algo = (ovl_algo_t)OVL_ALGO_COUNT;
    assert_status(ovl_gemm_reduce_scatter(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "unknown algorithm");
    bad = good;
    bad.reduce_op = (ovl_reduce_op_t)7;
    assert_status(ovl_gemm_reduce_scatter(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "unknown reduce_op 7");
    bad = good;
    bad.c = (char *)rk.c + 4096 * 4 - 8; /* C's rows run past its allocation */
    assert_status(ovl_gemm_reduce_scatter(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "c: ");
    bad = good;
    bad.k = 0;
    assert_status(ovl_gemm_reduce_scatter(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "must be positive");
    assert_status(ovl_gemm_reduce_scatter(rk.comm, NULL, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "ovl_gemm_reduce_scatter: desc is NULL");
    {
        /* a comm of world 2: m 5 is not a multiple */
        rank_t r2;
        rank_open(d, &r2, "rs-checks-2", 2, 0, 0, 1);
        ovl_gemm_rs_desc_t odd = good;
        odd.a = r2.a;
        odd.b = r2.b;
        odd.c = r2.c;
        odd.m = 5;
        assert_status(ovl_gemm_reduce_scatter(r2.comm, &odd, NULL), OVL_ERR_INVALID);
        assert_contains(ovl_last_error(r2.cl),
                        "m 5 is not a multiple of the world 2: each rank keeps m / world rows");
        assert_status(ovl_comm_check(r2.comm), OVL_OK); /* nothing was sent */
        (void)rank_close(&r2);
    }
    /* none reached the daemon: op 1 is the good one, C = A @ B exactly */
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    assert_status(ovl_gemm_reduce_scatter(rk.comm, &good, NULL), OVL_OK);
    assert_status(ovl_comm_synchronize(rk.comm), OVL_OK);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float want = 0;
            for (int l = 0; l < K; l++)
                want += a[i * K + l] * b[l * N + j];
            if (c[i * N + j] != want)
                fail_msg("C[%d][%d] is %g, not %g", i, j, c[i * N + j], want);
        }
    assert_status(rank_close(&rk), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* A scaled (fp8) all-gather + GEMM of three Bs, each with its own scales
 * and bias, at world 1 on the host backend: each C i is, bit for bit, the
 * host GEMM of B i with B i's scales and bias (libovl sends B i's in slots
 * of their own; the plan names SB i and BIAS i). Then what libovl refuses:
 * a bias on some Bs only. */
static void test_scaled_several_bs(void **state)
{
    test_daemon_t *d = *state;
    enum { M = 6, K = 32, NB = 3 };
    static const uint64_t ns[NB] = {8, 16, 24};
    rank_t rk;
    rank_open(d, &rk, "scaled-bs", 1, 0, 0, 1);
    uint8_t *a = ovl_host_alloc(rk.cl, M * K);
    float *sa = ovl_host_alloc(rk.cl, M * sizeof(float));
    assert_non_null(a);
    assert_non_null(sa);
    for (int i = 0; i < M * K; i++)
        a[i] = ovl_fp8_from_float(OVL_FP8_E4M3, (float)((i * 7) % 23 - 11) / 8.0f, 0);
    for (int i = 0; i < M; i++)
        sa[i] = 0.5f + 0.125f * (float)i;
    uint8_t *b[NB];
    float *sb[NB], *bias[NB], *c[NB];
    ovl_ag_gemm_b_t more[NB - 1];
    for (int j = 0; j < NB; j++) {
        uint64_t n = ns[j];
        b[j] = ovl_host_alloc(rk.cl, n * K);
        sb[j] = ovl_host_alloc(rk.cl, n * sizeof(float));
        bias[j] = ovl_host_alloc(rk.cl, n * sizeof(float));
        c[j] = ovl_host_alloc(rk.cl, M * n * sizeof(float));
        assert_true(b[j] && sb[j] && bias[j] && c[j]);
        for (uint64_t i = 0; i < n * K; i++)
            b[j][i] =
                ovl_fp8_from_float(OVL_FP8_E5M2, (float)((i * 5 + (uint64_t)j) % 17) - 8.0f, 0);
        for (uint64_t i = 0; i < n; i++) {
            sb[j][i] = 0.25f * (float)(1 + (i + (uint64_t)j) % 4);
            bias[j][i] = (float)j - 0.5f * (float)i;
        }
        memset(c[j], 0xff, M * n * sizeof(float));
        if (j > 0)
            more[j - 1] = (ovl_ag_gemm_b_t){.b = b[j],
                                            .ldb = K,
                                            .c = c[j],
                                            .ldc = n,
                                            .n = n,
                                            .b_scale = sb[j],
                                            .bias = bias[j]};
    }
    ovl_scaling_t sc = {.b_dtype = OVL_DTYPE_FP8_E5M2,
                        .out_dtype = OVL_DTYPE_FP32,
                        .a_mode = OVL_SCALE_ROW,
                        .b_mode = OVL_SCALE_ROW,
                        .a_scale = sa,
                        .b_scale = sb[0],
                        .bias = bias[0]};
    ovl_ag_gemm_desc_t desc = {.a = a,
                               .lda = K,
                               .b = b[0],
                               .ldb = K,
                               .transb = 1,
                               .c = c[0],
                               .ldc = ns[0],
                               .m = M,
                               .n = ns[0],
                               .k = K,
                               .dtype = OVL_DTYPE_FP8_E4M3,
                               .algo = OVL_ALGO_NAIVE,
                               .nb = NB,
                               .more_bs = more,
                               .scaling = &sc};
    assert_status(ovl_allgather_gemm(rk.comm, &desc, NULL), OVL_OK);
    assert_status(ovl_comm_synchronize(rk.comm), OVL_OK);
    for (int j = 0; j < NB; j++) {
        float want[M * 24];
        ovld_gemm_args_t g = {.dtype = OVL_DTYPE_FP8_E4M3,
                              .rows = M,
                              .n = ns[j],
                              .k = K,
                              .nblocks = 1,
                              .a = {.ptr = a, .ld = K},
                              .b = {.ptr = b[j], .ld = K},
                              .c = {.ptr = want, .ld = ns[j]},
                              .transb = true,
                              .scaled = true,
                              .b_dtype = OVL_DTYPE_FP8_E5M2,
                              .c_dtype = OVL_DTYPE_FP32,
                              .a_mode = OVL_SCALE_ROW,
                              .b_mode = OVL_SCALE_ROW,
                              .a_scale = sa,
                              .b_scale = sb[j],
                              .bias = bias[j]};
        assert_status(ovl_host_gemm_args(&g), OVL_OK);
        if (memcmp(c[j], want, M * ns[j] * sizeof(float)) != 0)
            fail_msg("C %d is not B %d's scaled product with its own scales and bias", j, j);
    }
    /* a bias on B 0 but not on B 2: refused before anything is sent */
    more[1].bias = NULL;
    assert_status(ovl_allgather_gemm(rk.comm, &desc, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "B 2 has no bias and B 0 has one");
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    /* fp8e5m2 twice: libovl refuses it as ovld would, and the comm stays
     * usable (ovld's refusal would fail it) */
    more[1].bias = bias[2];
    desc.dtype = OVL_DTYPE_FP8_E5M2;
    assert_status(ovl_allgather_gemm(rk.comm, &desc, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "fp8e5m2 times fp8e5m2");
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    desc.dtype = OVL_DTYPE_FP8_E4M3;
    assert_status(ovl_allgather_gemm(rk.comm, &desc, NULL), OVL_OK);
    assert_status(ovl_comm_synchronize(rk.comm), OVL_OK);
    assert_status(rank_close(&rk), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* What libovl refuses before anything is sent: no op number is used up, so
 * the next good op is op 1 and works. */
static void test_op_client_checks(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk;
    rank_open(d, &rk, "client-checks", 1, 0, 0, 1);
    opspec_t s = base_spec;
    rank_fill(&rk, 0, &s);
    ovl_ag_gemm_desc_t good = rank_desc(&rk, 0, &s), bad;

    /* lda too large for A's allocation (one page): outside every registration. */
    bad = good;
    bad.lda = 4096;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "not inside memory from ovl_host_alloc");
    char lda_msg[512]; /* checked last: see below */
    snprintf(lda_msg, sizeof(lda_msg), "%s", ovl_last_error(rk.cl));
    /* c one row short of the end of its allocation: ldc pushes it past. */
    bad = good;
    bad.c = (char *)rk.c + 4096 * 4 - 8;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "c: ");
    /* lda below k */
    bad = good;
    bad.lda = s.k - 1;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "a: leading dimension 4 is less than 5 columns");
    /* ldb below n (B is k x n) and, transposed, below k */
    bad = good;
    bad.ldb = s.n - 1;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "b: leading dimension");
    /* a NULL buffer */
    bad = good;
    bad.b = NULL;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "b is NULL");
    /* memory from malloc */
    float *heap = calloc(SLOT_C, sizeof(float));
    assert_non_null(heap);
    bad = good;
    bad.c = heap;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "c: ");
    free(heap);
    /* sizes, dtype, algorithm */
    bad = good;
    bad.m = 0;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "must be positive");
    bad = good;
    bad.dtype = (ovl_dtype_t)9;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "unknown dtype 9");
    bad = good;
    bad.algo = (ovl_algo_t)9;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "unknown algorithm 9");
    bad = good;
    bad.algo = OVL_ALGO_PUSH; /* GEMM + reduce-scatter's */
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl),
                    "algorithm push: ag_gemm has auto, naive, collective and ring");
    bad = good;
    bad.m = UINT64_MAX / 2; /* A's extent overflows */
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_RANGE);
    assert_contains(ovl_last_error(rk.cl), "a: 9223372036854775807 x 5 matrix overflows");
    /* a stream with the host backend */
    int fake_stream;
    assert_status(ovl_allgather_gemm(rk.comm, &good, &fake_stream), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "takes no stream");
    assert_status(ovl_allgather_gemm(rk.comm, NULL, NULL), OVL_ERR_INVALID);
    assert_status(ovl_allgather_gemm(NULL, &good, NULL), OVL_ERR_INVALID);
    /* several Bs: at most OVL_MAX_BS, each B and C checked as B and C are,
     * each in memory of this client's (not another connection's) */
    ovl_ag_gemm_b_t more[OVL_MAX_BS];
    for (int i = 0; i < OVL_MAX_BS; i++)
        more[i] = (ovl_ag_gemm_b_t){
            .b = good.b, .ldb = good.ldb, .c = good.c, .ldc = good.ldc, .n = good.n};
    bad = good;
    bad.nb = OVL_MAX_BS + 1;
    bad.more_bs = more;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "nb 9: an op takes at most 8 Bs");
    bad.nb = 3;
    bad.more_bs = NULL;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "more_bs is NULL");
    bad.more_bs = more;
    more[1].n = 0;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "n of B 2 must be positive");
    more[1].n = good.n;
    more[1].ldc = good.n - 1;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "c2: leading dimension");
    more[1].ldc = good.ldc;
    more[0].b = NULL;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "b1 is NULL");
    {
        /* B1 in memory another connection allocated */
        ovl_client_t *other = connect_ok(d);
        float *ob = ovl_host_alloc(other, SLOT_B * sizeof(float));
        assert_non_null(ob);
        more[0].b = ob;
        assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
        assert_contains(ovl_last_error(rk.cl), "b1: ");
        assert_contains(ovl_last_error(rk.cl), "not inside memory from ovl_host_alloc");
        assert_status(ovl_host_free(other, ob), OVL_OK);
        ovl_disconnect(other);
        more[0].b = good.b;
    }

    /* None of these reached the daemon: op 1 is the good one. */
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    assert_status(ovl_allgather_gemm(rk.comm, &good, NULL), OVL_OK);
    rank_sync_ok(&rk);
    rank_check(&rk, 0, &s);
    wait_job_ops_done(rk.cl, "client-checks", 1);
    Ovl__Response *r = status_call(rk.cl);
    const Ovl__JobInfo *j = find_job(r, "client-checks");
    assert_non_null(j);
    assert_string_equal(j->last_error, "");
    libovl_response_free(r);
    assert_status(rank_close(&rk), OVL_OK);
    assert_alive(d);

    /* The message of a buffer outside every registration names the buffer,
     * then gives ovl_mem_register's words, pointer first, intact. */
    char want[64];
    snprintf(want, sizeof(want), "a: %p (", (void *)rk.a);
    if (strncmp(lda_msg, want, strlen(want)) != 0)
        fail_msg("ovl_last_error after a range outside A's registration is \"%s\"; expected it "
                 "to start with \"%s\"",
                 lda_msg, want);
    TEST_PASSED();
}

static void test_mem_register_checks(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_mem_t *m = NULL, *m2 = NULL;
    char *heap = malloc(4096);
    assert_non_null(heap);
    assert_status(ovl_mem_register(cl, heap, 4096, &m), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "not inside memory from ovl_host_alloc");
    assert_null(m);
    free(heap);

    char *p = ovl_host_alloc(cl, 10000); /* three pages */
    assert_non_null(p);
    assert_status(ovl_mem_register(cl, p, 10000, &m), OVL_OK);
    assert_status(ovl_mem_register(cl, p + 100, 200, &m2), OVL_OK);
    assert_ptr_equal(m, m2); /* inside: the same registration */
    assert_status(ovl_mem_register(cl, p + 3 * 4096 - 8, 8, &m2), OVL_OK);
    assert_status(ovl_mem_register(cl, p + 3 * 4096 - 8, 9, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, p - 1, 2, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, p, 0, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, NULL, 8, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, p, 8, NULL), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(NULL, p, 8, &m2), OVL_ERR_INVALID);
    /* Host allocations are released with ovl_host_free only. */
    assert_status(ovl_mem_deregister(cl, m), OVL_ERR_INVALID);
    assert_null(ovl_host_alloc(cl, 0));
    assert_status(ovl_host_free(cl, p + 8), OVL_ERR_NOT_FOUND);
    assert_status(ovl_host_free(cl, NULL), OVL_ERR_INVALID);

    Ovl__Response *r = status_call(cl);
    uint32_t before = 0;
    for (size_t i = 0; i < r->status->n_clients; i++)
        if (r->status->clients[i]->buffers > 0) {
            before = r->status->clients[i]->buffers;
            assert_int_equal(r->status->clients[i]->mapped_bytes, 3 * 4096);
        }
    assert_int_equal(before, 1);
    libovl_response_free(r);
    assert_status(ovl_host_free(cl, p), OVL_OK);
    r = status_call(cl);
    for (size_t i = 0; i < r->status->n_clients; i++)
        assert_int_equal(r->status->clients[i]->buffers, 0);
    libovl_response_free(r);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

/* ================================================== the daemon's op checks */

static void raw_expect_error(Ovl__Response *r, raw_result_t res, ovl_status_t status,
                             const char *needle)
{
    assert_int_equal(res, RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_ERROR)
        fail_msg("expected an Error (%s), got body %d", ovl_strerror(status), (int)r->body_case);
    if (r->error->status != status)
        fail_msg("Error %s, not %s: %s", ovl_strerror((ovl_status_t)r->error->status),
                 ovl_strerror(status), r->error->message);
    assert_contains(r->error->message, needle);
    ovl__response__free_unpacked(r, NULL);
}

/* CommCheck: status, seq and the message must say `needle`. */
static void raw_check_comm(raw_conn_t *rc, const raw_comm_t *c, ovl_status_t status, uint64_t seq,
                           const char *needle)
{
    Ovl__CommCheck cc = OVL__COMM_CHECK__INIT;
    cc.comm_id = c->id;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_CHECK;
    q.comm_check = &cc;
    Ovl__Response *r = NULL;
    assert_int_equal(raw_call(rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_COMM_CHECK);
    if (r->comm_check->status != status)
        fail_msg("CommCheck: %s, not %s (%s)", ovl_strerror((ovl_status_t)r->comm_check->status),
                 ovl_strerror(status), r->comm_check->message);
    assert_int_equal(r->comm_check->seq, seq);
    assert_contains(r->comm_check->message, needle);
    ovl__response__free_unpacked(r, NULL);
    /* The doorbell says the same. */
    assert_int_equal(__atomic_load_n(&c->db->error, __ATOMIC_ACQUIRE), status);
    if (status != OVL_OK)
        assert_int_equal(__atomic_load_n(&c->db->error_seq, __ATOMIC_ACQUIRE), seq);
}

typedef enum raw_case {
    RC_C_OUT_OF_RANGE,
    RC_A_OFFSET_PAST_END,
    RC_LDA_BELOW_K,
    RC_B_NOT_REGISTERED,
    RC_BAD_DTYPE,
    RC_BAD_ALGO,
    RC_ZERO_M,
    RC_TOO_MANY_CHUNKS,
    RC_NO_A,
    RC_HUGE_M,
    RC_WIDE_DTYPE,
    RC_WIDE_CHUNKS,
    RC_NINE_BS,
    RC_B1_ZERO_N,
    RC_B1_NOT_REGISTERED,
    RC_C2_MISSING,
    RC_C1_OUT_OF_RANGE,
    RC_UNKNOWN_KIND,
    RC_SLOT_TWICE,
    RC_SLOT_OUT_OF_RANGE,
    RC_SCALE_NOT_DENSE,
    RC_SCALE_SLOT_UNSCALED,
    RC_COUNT
} raw_case_t;

static const struct {
    ovl_status_t status;
    const char *needle;
} raw_case_want[RC_COUNT] = {
    [RC_C_OUT_OF_RANGE] = {OVL_ERR_RANGE, "c: 2 x 3 (ld 3) at offset 4080 lies outside its "
                                          "registration of 4096 bytes"},
    [RC_A_OFFSET_PAST_END] = {OVL_ERR_RANGE, "a: 2 x 4 (ld 4) at offset 1048576 lies outside"},
    [RC_LDA_BELOW_K] = {OVL_ERR_INVALID, "a: leading dimension 3 is less than its 4 columns"},
    [RC_B_NOT_REGISTERED] = {OVL_ERR_NOT_FOUND, "b: buffer 999 is not registered"},
    [RC_BAD_DTYPE] = {OVL_ERR_INVALID, "unknown dtype 7"},
    [RC_BAD_ALGO] = {OVL_ERR_INVALID, "unknown algorithm 9"},
    [RC_ZERO_M] = {OVL_ERR_INVALID, "must be positive"},
    [RC_TOO_MANY_CHUNKS] = {OVL_ERR_INVALID, "chunks 65"},
    [RC_NO_A] = {OVL_ERR_INVALID, "a: no buffer given"},
    [RC_HUGE_M] = {OVL_ERR_RANGE, "a: 2305843009213693951 x 4 (ld 4) at offset 0 lies outside"},
    /* 2^32 + 2 would be fp32 in 32 bits, and 2^32 + 1 chunks one chunk */
    [RC_WIDE_DTYPE] = {OVL_ERR_INVALID, "unknown dtype 4294967298"},
    [RC_WIDE_CHUNKS] = {OVL_ERR_INVALID, "chunks 4294967297 out of range 0..64"},
    /* several Bs: checked at the boundary, then each resolved as B and C */
    [RC_NINE_BS] = {OVL_ERR_INVALID, "9 Bs: an op takes at most 8"},
    [RC_B1_ZERO_N] = {OVL_ERR_INVALID, "n of B 1 must be positive"},
    [RC_B1_NOT_REGISTERED] = {OVL_ERR_NOT_FOUND, "b1: buffer 999 is not registered"},
    [RC_C2_MISSING] = {OVL_ERR_INVALID, "c2: no buffer given"},
    [RC_C1_OUT_OF_RANGE] = {OVL_ERR_RANGE, "c1: 2 x 5 (ld 5) at offset 4080 lies outside"},
    /* the op message's own form (protocol 5): its kind and slots */
    [RC_UNKNOWN_KIND] = {OVL_ERR_INVALID, "unknown op kind 3"},
    [RC_SLOT_TWICE] = {OVL_ERR_INVALID, "buffer slot 0 (a) given twice"},
    [RC_SLOT_OUT_OF_RANGE] = {OVL_ERR_INVALID, "buffer slot 35 out of range (0 to 34)"},
    /* a scaled op's scales are read as one piece: a strided vector is
     * refused, not read wrong */
    [RC_SCALE_NOT_DENSE] = {OVL_ERR_INVALID, "a_scale: leading dimension 2: a vector of scales "
                                             "or a bias is dense (ld 1)"},
    /* a scaled op's slot given to an op that is not scaled */
    [RC_SCALE_SLOT_UNSCALED] = {OVL_ERR_INVALID, "buffer slot 20 (bias) is a scaled op's"},
};

/*
 * The daemon's own checks of an op, which libovl never lets through: raw
 * Op requests on a raw connection, one world-1 comm per case (a comm's
 * first error is sticky). Each fails through the doorbell (done rung, error
 * word and error_seq set) and CommCheck has the words. On the first comm a
 * good op afterwards still runs, correctly, with the error kept.
 */
static void test_raw_op_checks(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);

    void *map;
    int fd = sealed_memfd(4096, true, &map);
    uint64_t mem = raw_mem_register_ok(&rc, fd, 4096);
    close(fd);
    float *fa = map, *fb = (float *)((char *)map + 256), *fc = (float *)((char *)map + 512);
    for (int i = 0; i < RAW_M * RAW_K; i++)
        fa[i] = (float)(i % 5 - 2);
    for (int i = 0; i < RAW_K * RAW_N; i++)
        fb[i] = (float)(i % 3 - 1);

    raw_comm_t comms[RC_COUNT];
    for (int c = 0; c < RC_COUNT; c++) {
        char job[32];
        snprintf(job, sizeof(job), "raw-%d", c);
        raw_join(&rc, hello->hello, job, (uint32_t)c % 8, &comms[c]);
        raw_op_t o;
        raw_op_init(&o, comms[c].id, 1, mem);
        uint64_t seq = 1;
        switch ((raw_case_t)c) {
        case RC_C_OUT_OF_RANGE:
            o.refs[2].offset = 4096 - 16;
            break;
        case RC_A_OFFSET_PAST_END:
            o.refs[0].offset = 1u << 20;
            break;
        case RC_LDA_BELOW_K:
            o.by_slot[0]->ld = RAW_K - 1;
            break;
        case RC_B_NOT_REGISTERED:
            o.refs[1].mem_id = 999;
            break;
        case RC_BAD_DTYPE:
            o.g.dtype = 7;
            break;
        case RC_BAD_ALGO:
            o.g.algo = 9;
            break;
        case RC_ZERO_M:
            o.g.m = 0;
            break;
        case RC_TOO_MANY_CHUNKS:
            o.g.chunks = 65;
            break;
        case RC_NO_A:
            raw_op_drop(&o, 0);
            break;
        case RC_HUGE_M:
            o.g.m = UINT64_MAX / 8;
            break;
        case RC_WIDE_DTYPE:
            o.g.dtype = (UINT64_C(1) << 32) + 2;
            break;
        case RC_WIDE_CHUNKS:
            o.g.chunks = (UINT64_C(1) << 32) + 1;
            break;
        case RC_NINE_BS:
            raw_op_more(&o, 8, mem);
            break;
        case RC_B1_ZERO_N:
            raw_op_more(&o, 2, mem);
            o.more_n[0] = 0;
            break;
        case RC_B1_NOT_REGISTERED:
            raw_op_more(&o, 1, mem);
            o.refs[4].mem_id = 999;
            break;
        case RC_C2_MISSING:
            raw_op_more(&o, 2, mem);
            raw_op_drop(&o, 12);
            break;
        case RC_C1_OUT_OF_RANGE:
            raw_op_more(&o, 1, mem);
            o.more_n[0] = o.by_slot[4]->ld = o.by_slot[11]->ld = 5; /* B1 4 x 5 fits where B is */
            o.refs[11].offset = 4096 - 16;
            break;
        case RC_UNKNOWN_KIND:
            o.op.kind = OVL_OP_KIND_COUNT; /* past the last kind */
            break;
        case RC_SLOT_TWICE:
            o.op.n_bufs = 4;
            o.pbufs[3] = o.pbufs[0];
            break;
        case RC_SLOT_OUT_OF_RANGE:
            o.by_slot[2]->slot = RAW_SLOTS;
            break;
        case RC_SCALE_NOT_DENSE: {
            /* fp8 A and B (B n x k), fp32 C; A's scales by row at ld 2 */
            static Ovl__Scaling sc = OVL__SCALING__INIT;
            sc.b_dtype = OVL_DTYPE_FP8_E4M3;
            sc.out_dtype = OVL_DTYPE_FP32;
            sc.a_mode = OVL_SCALE_ROW;
            o.g.dtype = OVL_DTYPE_FP8_E4M3;
            o.g.transb = true;
            o.g.scaling = &sc;
            o.by_slot[1]->ld = RAW_K;
            raw_op_buf(&o, 18, mem, 1024, 2);
            raw_op_buf(&o, 19, mem, 1536, 1);
            break;
        }
        case RC_SCALE_SLOT_UNSCALED:
            raw_op_buf(&o, 20, mem, 1024, RAW_N);
            break;
        case RC_COUNT:
            break;
        }
        raw_submit(&rc, &comms[c], &o.op);
        raw_wait_done(&comms[c], seq);
        raw_check_comm(&rc, &comms[c], raw_case_want[c].status, seq, raw_case_want[c].needle);
    }

    /* Comm 0 failed op 1; op 2 is good: it runs, the first error stays. */
    memset(fc, 0xff, RAW_M * RAW_N * sizeof(float));
    raw_op_t o;
    raw_op_init(&o, comms[0].id, 2, mem);
    raw_submit(&rc, &comms[0], &o.op);
    raw_wait_done(&comms[0], 2);
    raw_check_comm(&rc, &comms[0], OVL_ERR_RANGE, 1, "outside its registration");
    for (int i = 0; i < RAW_M; i++)
        for (int j = 0; j < RAW_N; j++) {
            float want = 0;
            for (int l = 0; l < RAW_K; l++)
                want += fa[i * RAW_K + l] * fb[l * RAW_N + j];
            assert_true(fc[i * RAW_N + j] == want);
        }

    /* An op for a comm that is not there: an Error with id 0, and the
     * connection goes on. */
    raw_op_init(&o, 424242, 1, mem);
    raw_submit(&rc, NULL, &o.op);
    Ovl__Response *r = NULL;
    assert_int_equal(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->id, 0);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
    assert_int_equal(r->error->status, OVL_ERR_NOT_FOUND);
    assert_contains(r->error->message, "op 1 names unknown comm 424242");
    ovl__response__free_unpacked(r, NULL);

    /* Other requests about unknown things: refused, connection kept. */
    Ovl__CommCheck cc = OVL__COMM_CHECK__INIT;
    cc.comm_id = 424242;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_CHECK;
    q.comm_check = &cc;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "no comm 424242");
    Ovl__CommDestroy cd = OVL__COMM_DESTROY__INIT;
    cd.comm_id = 424242;
    Ovl__Request qd = OVL__REQUEST__INIT;
    qd.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
    qd.comm_destroy = &cd;
    assert_int_equal(raw_call(&rc, &qd, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "no comm 424242");

    /* Leaving properly: CommDestroy answers Ok, then the comm is unknown. */
    cd.comm_id = comms[0].id;
    qd.id = 0;
    assert_int_equal(raw_call(&rc, &qd, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
    ovl__response__free_unpacked(r, NULL);
    cc.comm_id = comms[0].id;
    q.id = 0;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "no comm");

    for (int c = 0; c < RC_COUNT; c++)
        raw_comm_unmap(&comms[c]);
    munmap(map, 4096);
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/* MemRegister and MemDeregister refusals on a raw connection. */
static void test_raw_mem_checks(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    raw_result_t res;
    void *map, *map2;

    int unsealed = sealed_memfd(4096, false, &map);
    Ovl__Response *r = raw_mem_register(&rc, unsealed, 4096, 0, &res);
    raw_expect_error(r, res, OVL_ERR_PERMISSION, "sealed memfd");
    close(unsealed);
    munmap(map, 4096);

    int fd = sealed_memfd(4096, true, &map2);
    r = raw_mem_register(&rc, fd, 0, 0, &res);
    raw_expect_error(r, res, OVL_ERR_INVALID, "zero bytes");
    r = raw_mem_register(&rc, fd, 8192, 0, &res);
    raw_expect_error(r, res, OVL_ERR_RANGE, "lies outside");
    r = raw_mem_register(&rc, fd, 4096, 4096, &res);
    raw_expect_error(r, res, OVL_ERR_RANGE, "lies outside");
    r = raw_mem_register(&rc, fd, 16, UINT64_MAX - 8, &res);
    raw_expect_error(r, res, OVL_ERR_RANGE, "lies outside");
    r = raw_mem_register(&rc, -1, 4096, 0, &res); /* no descriptor at all */
    raw_expect_error(r, res, OVL_ERR_INVALID, "cannot register 4096 bytes");

    Ovl__MemDeregister md = OVL__MEM_DEREGISTER__INIT;
    md.mem_id = 31337;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_DEREGISTER;
    q.mem_deregister = &md;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "buffer 31337 is not registered");

    /* A good one, released twice. */
    md.mem_id = raw_mem_register_ok(&rc, fd, 4096);
    q.id = 0;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
    ovl__response__free_unpacked(r, NULL);
    q.id = 0;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "is not registered");
    raw_close(&rc);

    /* A MemRegister announcing a descriptor that does not come: the
     * stream no longer matches descriptors to frames, so it is closed. */
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    Ovl__MemRegister mr = OVL__MEM_REGISTER__INIT;
    mr.bytes = 4096;
    mr.fd_count = 1;
    Ovl__Request qm = OVL__REQUEST__INIT;
    qm.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    qm.mem_register = &mr;
    assert_int_equal(raw_call(&rc, &qm, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_PROTOCOL, "did not come");
    assert_int_equal(raw_expect_closed(&rc, TIMEOUT_MS), RAW_CLOSED);
    raw_close(&rc);

    /* Two descriptors announced: the same. */
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    mr.fd_count = 2;
    int two[2] = {fd, fd};
    qm.id = 0;
    assert_int_equal(raw_call(&rc, &qm, two, 2, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_PROTOCOL, "at most one descriptor");
    assert_int_equal(raw_expect_closed(&rc, TIMEOUT_MS), RAW_CLOSED);
    raw_close(&rc);

    close(fd);
    munmap(map2, 4096);
    assert_alive(d);
    TEST_PASSED();
}

/*
 * An op number out of order is a protocol error: libovl never sends one, so
 * the client is broken or hostile, and ringing its doorbell out of order
 * would move `done` backwards. The connection is closed with an Error that
 * says so; the daemon goes on serving.
 */
static void test_raw_op_out_of_order(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);
    raw_comm_t c;
    raw_join(&rc, hello->hello, "out-of-order", 0, &c);
    Ovl__Op g = OVL__OP__INIT;
    g.comm_id = c.id;
    g.seq = 5; /* expected: 1 */
    Ovl__Request qg = OVL__REQUEST__INIT;
    qg.body_case = OVL__REQUEST__BODY_OP;
    qg.op = &g;
    uint8_t buf[512];
    size_t len = pack_frame(buf, &qg);
    assert_int_equal(raw_send(rc.fd, buf, len), 0);
    Ovl__Response *r = NULL;
    assert_int_equal(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_PROTOCOL, "op number 5 out of order");
    assert_true(raw_expect_closed(&rc, TIMEOUT_MS) != RAW_TIMEOUT);
    raw_comm_unmap(&c);
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/* ============================================================ mismatches */

typedef enum field {
    F_M,
    F_N,
    F_K,
    F_DTYPE,
    F_ALGO,
    F_TRANSB,
    F_CHUNKS,
    F_STREAMS,
    F_AOUT,
    F_NB,
    F_B1_N,
} field_t;

static const char *const field_names[] = {
    [F_M] = "m",
    [F_N] = "n",
    [F_K] = "k",
    [F_DTYPE] = "dtype",
    [F_ALGO] = "algo",
    [F_TRANSB] = "transb",
    [F_CHUNKS] = "chunks",
    [F_STREAMS] = "streams",
    [F_AOUT] = "a_out (given or not)",
    [F_NB] = "nb",
    [F_B1_N] = "n of B 1",
};

/* Two ranks submit op 1 disagreeing on one field: both see MISMATCH naming
 * it; the error stays (a good op 2 does not clear it); the job lives on. */
static void mismatch_case(test_daemon_t *d, field_t f)
{
    const char *name = field_names[f];
    char job[32], needle[80];
    snprintf(job, sizeof(job), "mismatch-%d", (int)f);
    snprintf(needle, sizeof(needle), "ranks disagree on %s:", name);
    rank_t rk[2];
    rank_open(d, &rk[0], job, 2, 0, 0, 2);
    rank_open(d, &rk[1], job, 2, 1, 1, 2);
    opspec_t s0 = base_spec, s1 = base_spec;
    switch (f) {
    case F_M:
        s1.m = 5;
        break;
    case F_N:
        s1.n = 7;
        break;
    case F_K:
        s1.k = 6;
        break;
    case F_DTYPE:
        s1.dtype = OVL_DTYPE_FP16;
        break;
    case F_ALGO:
        s0.algo = OVL_ALGO_NAIVE, s1.algo = OVL_ALGO_RING;
        break;
    case F_TRANSB:
        s1.transb = 1;
        break;
    case F_CHUNKS:
        s0.chunks = 2, s1.chunks = 4;
        break;
    case F_STREAMS:
        s0.streams = 1, s1.streams = 2;
        break;
    case F_AOUT:
        s0.aout = true;
        break;
    case F_NB:
    case F_B1_N:
        break;
    }
    /* several Bs: B 1 and C 1 in slot 1's B and C (op 2 refills them) */
    uint32_t nb[2] = {f == F_NB ? 2 : f == F_B1_N ? 2 : 0, f == F_NB ? 3 : f == F_B1_N ? 2 : 0};
    uint64_t b1_n[2] = {3, f == F_B1_N ? 4 : 3};
    rank_fill(&rk[0], 0, &s0);
    rank_fill(&rk[1], 0, &s1);
    for (int r = 0; r < 2; r++) {
        const opspec_t *s = r ? &s1 : &s0;
        ovl_ag_gemm_desc_t desc = rank_desc(&rk[r], 0, s);
        ovl_ag_gemm_b_t more[2];
        for (int i = 0; i < 2; i++)
            more[i] = (ovl_ag_gemm_b_t){.b = rk[r].b + SLOT_B,
                                        .ldb = b1_n[r],
                                        .c = rk[r].c + SLOT_C,
                                        .ldc = b1_n[r],
                                        .n = b1_n[r]};
        desc.nb = nb[r];
        desc.more_bs = more;
        assert_status(ovl_allgather_gemm(rk[r].comm, &desc, NULL), OVL_OK);
    }
    for (int r = 0; r < 2; r++) {
        ovl_status_t st = ovl_comm_synchronize(rk[r].comm);
        if (st != OVL_ERR_MISMATCH)
            fail_msg("rank %d, ranks disagreeing on %s: %s (%s), not OVL_ERR_MISMATCH", r, name,
                     ovl_strerror(st), ovl_last_error(rk[r].cl));
        assert_contains(ovl_last_error(rk[r].cl), needle);
        assert_contains(ovl_last_error(rk[r].cl), "op 1");
        assert_status(ovl_comm_check(rk[r].comm), OVL_ERR_MISMATCH);
    }
    /* Nothing was written to C. */
    uint32_t nan_bits = 0xffffffffu, c0;
    memcpy(&c0, rk[0].c, sizeof(c0));
    assert_int_equal(c0, nan_bits);

    wait_job_in_flight(rk[0].cl, job, 0); /* op 1's completions are in */
    Ovl__Response *resp = status_call(rk[0].cl);
    const Ovl__JobInfo *j = find_job(resp, job);
    assert_non_null(j);
    uint64_t ops_done = j->ops_done;
    libovl_response_free(resp);

    /* Sticky: a good op 2 on both ranks is not submitted; the call says the
     * mismatch, and so does every wait after it. */
    opspec_t good = base_spec;
    good.salt = 1;
    for (int r = 0; r < 2; r++) {
        rank_fill(&rk[r], 1, &good);
        assert_status(rank_submit(&rk[r], 1, &good), OVL_ERR_MISMATCH);
        assert_contains(ovl_last_error(rk[r].cl), needle);
    }
    for (int r = 0; r < 2; r++) {
        assert_status(ovl_comm_synchronize(rk[r].comm), OVL_ERR_MISMATCH);
        assert_contains(ovl_last_error(rk[r].cl), needle);
    }
    resp = status_call(rk[0].cl);
    j = find_job(resp, job);
    assert_non_null(j);
    assert_string_equal(j->state, "ready"); /* a refused op does not end the job */
    assert_contains(j->last_error, needle);
    /* op 2 never reached ovld (this status request would come after it) */
    assert_int_equal(j->ops_done, ops_done);
    assert_int_equal(j->ops_in_flight, 0);
    libovl_response_free(resp);
    assert_status(rank_close(&rk[0]), OVL_ERR_MISMATCH);
    assert_status(rank_close(&rk[1]), OVL_ERR_MISMATCH);
    assert_alive(d);
    fresh_job_works(d, job, 2); /* the id is free again, and ops work */
}

#define MISMATCH_TEST(fname, field)                                                                \
    static void fname(void **state)                                                                \
    {                                                                                              \
        mismatch_case(*state, field);                                                              \
        TEST_PASSED();                                                                             \
    }
MISMATCH_TEST(test_mismatch_m, F_M)
MISMATCH_TEST(test_mismatch_n, F_N)
MISMATCH_TEST(test_mismatch_k, F_K)
MISMATCH_TEST(test_mismatch_dtype, F_DTYPE)
MISMATCH_TEST(test_mismatch_algo, F_ALGO)
MISMATCH_TEST(test_mismatch_transb, F_TRANSB)
MISMATCH_TEST(test_mismatch_chunks, F_CHUNKS)
MISMATCH_TEST(test_mismatch_streams, F_STREAMS)
MISMATCH_TEST(test_mismatch_a_out, F_AOUT)
MISMATCH_TEST(test_mismatch_nb, F_NB)
MISMATCH_TEST(test_mismatch_b1_n, F_B1_N)

/* Two ranks of a GEMM + reduce-scatter disagreeing on the reduction: the op
 * fails on both with OVL_ERR_MISMATCH naming reduce_op, C is not written,
 * and the job goes on refusing (as for an all-gather + GEMM). */
static void test_rs_mismatch_reduce_op(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[2];
    for (uint32_t r = 0; r < 2; r++)
        rank_open(d, &rk[r], "rs-mismatch", 2, r, 0, 1);
    for (int r = 0; r < 2; r++) {
        memset(rk[r].c, 0xff, 4 * 4 * sizeof(float));
        ovl_gemm_rs_desc_t d2 = {.a = rk[r].a,
                                 .lda = 4,
                                 .b = rk[r].b,
                                 .ldb = 4,
                                 .c = rk[r].c,
                                 .ldc = 4,
                                 .m = 8,
                                 .n = 4,
                                 .k = 4,
                                 .dtype = OVL_DTYPE_FP32,
                                 .reduce_op = r ? OVL_REDUCE_AVG : OVL_REDUCE_SUM,
                                 .algo = OVL_ALGO_NAIVE};
        assert_status(ovl_gemm_reduce_scatter(rk[r].comm, &d2, NULL), OVL_OK);
    }
    for (int r = 0; r < 2; r++) {
        ovl_status_t st = ovl_comm_synchronize(rk[r].comm);
        if (st != OVL_ERR_MISMATCH)
            fail_msg("rank %d: %s (%s), not OVL_ERR_MISMATCH", r, ovl_strerror(st),
                     ovl_last_error(rk[r].cl));
        assert_contains(ovl_last_error(rk[r].cl), "reduce_op");
        uint32_t c0;
        memcpy(&c0, rk[r].c, sizeof(c0));
        assert_int_equal(c0, 0xffffffffu); /* nothing written */
    }
    for (int r = 0; r < 2; r++)
        (void)rank_close(&rk[r]);
    assert_alive(d);
    TEST_PASSED();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        /* client side */
        T(test_op_client_checks),
        T(test_scaled_several_bs),
        T(test_rs_client_checks),
        T(test_rs_mismatch_reduce_op),
        T(test_mem_register_checks),
        /* the daemon's side */
        T(test_raw_op_checks),
        T(test_raw_mem_checks),
        T(test_raw_op_out_of_order),
        /* mismatches */
        T(test_mismatch_m),
        T(test_mismatch_n),
        T(test_mismatch_k),
        T(test_mismatch_dtype),
        T(test_mismatch_algo),
        T(test_mismatch_transb),
        T(test_mismatch_chunks),
        T(test_mismatch_streams),
        T(test_mismatch_a_out),
        T(test_mismatch_nb),
        T(test_mismatch_b1_n),
    };
    return RUN_TESTS("ops", tests, argc, argv);
}

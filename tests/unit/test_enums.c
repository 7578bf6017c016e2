/*
 * test_enums.c: every enum whose values index a table or bound a loop ends
 * in a count, and everything sized or bounded by it agrees: every value
 * below a count has a name (and parses back), the count itself has none
 * (a value added past it without moving it fails here), the wire's enums
 * have as many values, the request checks accept exactly the values below
 * the counts, and the stats count an op of every kind, algorithm and dtype
 * in exactly its own cell.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "config.h"
#include "ovl.h"
#include "ovl.pb-c.h"
#include "plan.h"
#include "kind.h"
#include "request.h"
#include "stats.h"

static void test_algo_names(void **state)
{
    (void)state;
    for (int a = 0; a < OVL_ALGO_COUNT; a++) {
        const char *name = ovl_algo_name((ovl_algo_t)a);
        ovl_algo_t back = OVL_ALGO_COUNT;
        if (!name)
            fail_msg("algorithm %d has no name", a);
        assert_true(name[0] != '\0');
        assert_int_equal(ovl_algo_parse(name, &back), OVL_OK);
        assert_int_equal(back, a);
    }
    assert_null(ovl_algo_name(OVL_ALGO_COUNT));
    assert_null(ovl_algo_name((ovl_algo_t)-1));
    /* The wire's enum has the same values. */
    assert_int_equal(ovl__algo__descriptor.n_values, OVL_ALGO_COUNT);
    for (unsigned i = 0; i < ovl__algo__descriptor.n_values; i++)
        assert_int_equal(ovl__algo__descriptor.values[i].value, (int)i);
}

static void test_op_kind_names(void **state)
{
    (void)state;
    assert_null(ovl_op_kind_name((ovl_op_kind_t)0)); /* none */
    for (int k = 1; k < OVL_OP_KIND_COUNT; k++) {
        const char *name = ovl_op_kind_name((ovl_op_kind_t)k);
        ovl_op_kind_t back = (ovl_op_kind_t)0;
        if (!name)
            fail_msg("op kind %d has no name", k);
        assert_int_equal(ovl_op_kind_parse(name, &back), OVL_OK);
        assert_int_equal(back, k);
    }
    assert_null(ovl_op_kind_name(OVL_OP_KIND_COUNT));
    assert_null(ovl_op_kind_name((ovl_op_kind_t)-1));
    ovl_op_kind_t back;
    assert_int_equal(ovl_op_kind_parse("", &back), OVL_ERR_INVALID);
    assert_int_equal(ovl_op_kind_parse(NULL, &back), OVL_ERR_INVALID);
    /* The wire's enum has the same values, none (0) included. */
    assert_int_equal(ovl__op_kind__descriptor.n_values, OVL_OP_KIND_COUNT);
    for (unsigned i = 0; i < ovl__op_kind__descriptor.n_values; i++)
        assert_int_equal(ovl__op_kind__descriptor.values[i].value, (int)i);
}

static void test_dtype_names(void **state)
{
    (void)state;
    for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
        const char *name = ovl_dtype_name((ovl_dtype_t)t);
        ovl_dtype_t back = OVL_DTYPE_COUNT;
        if (!name)
            fail_msg("dtype %d has no name", t);
        assert_true(name[0] != '\0');
        assert_int_equal(ovl_dtype_parse(name, &back), OVL_OK);
        assert_int_equal(back, t);
        assert_true(ovl_dtype_size((ovl_dtype_t)t) > 0);
    }
    assert_null(ovl_dtype_name(OVL_DTYPE_COUNT));
    assert_int_equal(ovl_dtype_size(OVL_DTYPE_COUNT), 0);
    assert_int_equal(ovl__dtype__descriptor.n_values, OVL_DTYPE_COUNT);
    for (unsigned i = 0; i < ovl__dtype__descriptor.n_values; i++)
        assert_int_equal(ovl__dtype__descriptor.values[i].value, (int)i);
}

/* Scale modes: each has a name that parses back, as the wire numbers them. */
static void test_scale_mode_names(void **state)
{
    (void)state;
    for (int m = 0; m < OVL_SCALE_MODE_COUNT; m++) {
        ovl_scale_mode_t back = OVL_SCALE_MODE_COUNT;
        const char *name = ovl_scale_mode_name((ovl_scale_mode_t)m);
        assert_non_null(name);
        assert_int_equal(ovl_scale_mode_parse(name, &back), OVL_OK);
        assert_int_equal(back, m);
        static const char *const wire[] = {"TENSOR", "ROW", "BLOCK_1X128", "BLOCK_128X128"};
        _Static_assert(sizeof(wire) / sizeof(wire[0]) == OVL_SCALE_MODE_COUNT, "each mode");
        assert_int_equal(ovl__scale_mode__descriptor.values[m].value, m);
        assert_string_equal(ovl__scale_mode__descriptor.values[m].name + strlen("SCALE_"), wire[m]);
    }
    assert_int_equal(ovl__scale_mode__descriptor.n_values, OVL_SCALE_MODE_COUNT);
    assert_null(ovl_scale_mode_name(OVL_SCALE_MODE_COUNT));
    ovl_scale_mode_t back;
    assert_string_equal(ovl_scale_mode_name(OVL_SCALE_BLOCK_1X128), "1x128");
    assert_string_equal(ovl_scale_mode_name(OVL_SCALE_BLOCK_128X128), "128x128");
    assert_int_equal(ovl_scale_mode_parse("block", &back), OVL_ERR_INVALID);
    assert_int_equal(ovl_scale_mode_parse("1X128", &back), OVL_ERR_INVALID);
    assert_int_equal(ovl_scale_mode_parse(NULL, &back), OVL_ERR_INVALID);
}

static void test_status_names(void **state)
{
    (void)state;
    const char *unknown = ovl_strerror((ovl_status_t)1);
    assert_string_equal(unknown, "unknown status");
    /* errors[] holds every status: OVL_OK down to the last code, and no
     * code lies past it. */
    for (int k = 0; k < OVLD_STATUS_KINDS; k++)
        if (strcmp(ovl_strerror((ovl_status_t)-k), unknown) == 0)
            fail_msg("status %d has no name", -k);
    assert_string_equal(ovl_strerror((ovl_status_t)-OVLD_STATUS_KINDS), unknown);
    ovld_stats_t s;
    assert_int_equal(sizeof(s.errors) / sizeof(s.errors[0]), OVLD_STATUS_KINDS);
}

static void test_instr_names(void **state)
{
    (void)state;
    for (int i = 0; i < OVL_I_COUNT; i++) {
        const char *name = ovl_instr_name((ovl_instr_kind_t)i);
        if (strcmp(name, "UNKNOWN") == 0)
            fail_msg("instruction kind %d has no name", i);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(name, ovl_instr_name((ovl_instr_kind_t)j));
    }
    assert_string_equal(ovl_instr_name((ovl_instr_kind_t)OVL_I_COUNT), "UNKNOWN");
}

/* The plan's tables: buffers, all-gather methods, stream roles and the
 * daemon's gather preferences each have a distinct name below their count
 * and none at it; the preferences parse back, in the config too, whose
 * refusal lists them all. */
typedef const char *(*name_fn)(int);

static const char *buf_name(int v)
{
    return ovl_buf_name((ovl_buf_t)v);
}

static const char *method_name(int v)
{
    return ovl_ag_method_name((ovl_ag_method_t)v);
}

static const char *role_name(int v)
{
    return ovl_stream_role_name((ovl_stream_role_t)v);
}

static const char *pref_name(int v)
{
    return ovl_ag_pref_name((ovl_ag_pref_t)v);
}

static void check_names(name_fn name, int count, const char *what)
{
    for (int v = 0; v < count; v++) {
        if (!name(v) || !name(v)[0])
            fail_msg("%s %d has no name", what, v);
        for (int w = 0; w < v; w++)
            assert_string_not_equal(name(v), name(w));
    }
    assert_null(name(count));
    assert_null(name(-1));
}

static void test_plan_tables(void **state)
{
    (void)state;
    check_names(buf_name, OVL_BUF_COUNT, "buffer");
    check_names(method_name, OVL_AG_METHOD_COUNT, "all-gather method");
    check_names(role_name, OVL_ROLE_COUNT, "stream role");
    check_names(pref_name, OVL_AG_PREF_COUNT, "all-gather preference");
    char text[64], err[512];
    for (int v = 0; v < OVL_AG_PREF_COUNT; v++) {
        ovl_ag_pref_t back = OVL_AG_PREF_COUNT;
        assert_int_equal(ovl_ag_pref_parse(pref_name(v), &back), OVL_OK);
        assert_int_equal(back, v);
        ovld_config_t cfg;
        ovld_config_defaults(&cfg);
        snprintf(text, sizeof text, "allgather = %s\n", pref_name(v));
        assert_int_equal(ovld_config_parse(&cfg, "t.conf", text, err, sizeof err), OVL_OK);
        assert_int_equal(cfg.allgather, v);
    }
    ovl_ag_pref_t back;
    assert_int_equal(ovl_ag_pref_parse("mpi", &back), OVL_ERR_INVALID);
    assert_int_equal(ovl_ag_pref_parse(NULL, &back), OVL_ERR_INVALID);
    ovld_config_t cfg;
    ovld_config_defaults(&cfg);
    assert_int_equal(ovld_config_parse(&cfg, "t.conf", "allgather = x\n", err, sizeof err),
                     OVL_ERR_CONFIG);
    for (int v = 0; v < OVL_AG_PREF_COUNT; v++)
        if (!strstr(err, pref_name(v)))
            fail_msg("'%s' does not list %s", err, pref_name(v));
}

/* An op of kind with dtype, algo, reduce_op, transb and scaling sc (NULL:
 * none), as ovld_request_check judges it. */
static ovl_status_t check_op_sc(uint64_t kind, uint64_t dtype, uint64_t algo, uint64_t reduce_op,
                                bool transb, Ovl__Scaling *sc)
{
    Ovl__AgGemmParams g;
    Ovl__GemmRsParams rs;
    Ovl__Op op;
    Ovl__Request q;
    char err[256];
    ovl__ag_gemm_params__init(&g);
    ovl__gemm_rs_params__init(&rs);
    ovl__op__init(&op);
    ovl__request__init(&q);
    g.m = g.n = g.k = 1;
    g.dtype = dtype;
    g.algo = algo;
    rs.m = rs.n = rs.k = 1;
    rs.dtype = dtype;
    rs.algo = algo;
    rs.reduce_op = reduce_op;
    g.transb = rs.transb = transb;
    g.scaling = rs.scaling = sc;
    op.kind = kind;
    /* each kind's parameters where it takes them */
    if (kind == OVL__OP_KIND__OP_KIND_GEMM_RS)
        op.gemm_rs = &rs;
    else
        op.ag_gemm = &g;
    q.body_case = OVL__REQUEST__BODY_OP;
    q.op = &op;
    return ovld_request_check(&q, err, sizeof(err));
}

/* The request checks take exactly the values below the counts: dtypes,
 * algorithms, op kinds (an fp8 dtype with the scaling it needs). */
static ovl_status_t check_op_rs(uint64_t kind, uint64_t dtype, uint64_t algo, uint64_t reduce_op)
{
    Ovl__Scaling sc;
    ovl__scaling__init(&sc);
    sc.b_dtype = OVL_DTYPE_FP8_E4M3;
    bool fp8 = ovl_dtype_is_fp8((ovl_dtype_t)dtype);
    return check_op_sc(kind, dtype, algo, reduce_op, fp8, fp8 ? &sc : NULL);
}

static ovl_status_t check_op_kind(uint64_t kind, uint64_t dtype, uint64_t algo)
{
    return check_op_rs(kind, dtype, algo, OVL_REDUCE_SUM);
}

static ovl_status_t check_op(uint64_t dtype, uint64_t algo)
{
    return check_op_kind(OVL__OP_KIND__OP_KIND_AG_GEMM, dtype, algo);
}

static void test_request_ranges(void **state)
{
    (void)state;
    /* ag_gemm: every dtype, every algorithm but push (gemm_rs's) */
    for (int t = 0; t < OVL_DTYPE_COUNT; t++)
        for (int a = 0; a < OVL_ALGO_COUNT; a++)
            assert_int_equal(check_op((uint64_t)t, (uint64_t)a),
                             a == OVL_ALGO_PUSH ? OVL_ERR_INVALID : OVL_OK);
    assert_int_equal(check_op(OVL_DTYPE_COUNT, OVL_ALGO_AUTO), OVL_ERR_INVALID);
    assert_int_equal(check_op(OVL_DTYPE_BF16, OVL_ALGO_COUNT), OVL_ERR_INVALID);
    /* the wire's kinds are the core's: each one the table has, and no other */
    assert_int_equal(OVL__OP_KIND__OP_KIND_AG_GEMM, OVLD_KIND_AG_GEMM);
    assert_int_equal(OVL__OP_KIND__OP_KIND_GEMM_RS, OVLD_KIND_GEMM_RS);
    assert_int_equal(check_op_kind(OVL__OP_KIND__OP_KIND_NONE, 0, 0), OVL_ERR_INVALID);
    assert_int_equal(check_op_kind(OVL_OP_KIND_COUNT, 0, 0), OVL_ERR_INVALID);
    /* gemm_rs: every dtype, reduction and algorithm */
    for (int t = 0; t < OVL_DTYPE_COUNT; t++)
        for (int a = 0; a < OVL_ALGO_COUNT; a++)
            for (int r = 0; r < OVL_REDUCE_OP_COUNT; r++)
                assert_int_equal(check_op_rs(OVL__OP_KIND__OP_KIND_GEMM_RS, (uint64_t)t,
                                             (uint64_t)a, (uint64_t)r),
                                 OVL_OK);
    assert_int_equal(
        check_op_rs(OVL__OP_KIND__OP_KIND_GEMM_RS, 0, OVL_ALGO_NAIVE, OVL_REDUCE_OP_COUNT),
        OVL_ERR_INVALID);
    assert_int_equal(check_op_rs(OVL__OP_KIND__OP_KIND_GEMM_RS, 0, OVL_ALGO_COUNT, OVL_REDUCE_SUM),
                     OVL_ERR_INVALID);
    /* the kinds' algorithms in words, as the refusals name them, and the
     * same rule as ovl_op_kind_takes_algo */
    for (int a = 0; a < OVL_ALGO_COUNT; a++) {
        assert_int_equal(ovl_op_kind_takes_algo(OVL_OP_AG_GEMM, (ovl_algo_t)a), a != OVL_ALGO_PUSH);
        assert_int_equal(ovl_op_kind_takes_algo(OVL_OP_GEMM_RS, (ovl_algo_t)a), 1);
        for (int k = OVL_OP_AG_GEMM; k < OVL_OP_KIND_COUNT; k++)
            assert_int_equal(
                strstr(ovl_op_kind_algos((ovl_op_kind_t)k), ovl_algo_name((ovl_algo_t)a)) != NULL,
                ovl_op_kind_takes_algo((ovl_op_kind_t)k, (ovl_algo_t)a));
    }
    assert_false(ovl_op_kind_takes_algo((ovl_op_kind_t)0, OVL_ALGO_AUTO));
    assert_false(ovl_op_kind_takes_algo(OVL_OP_GEMM_RS, OVL_ALGO_COUNT));
    assert_null(ovl_op_kind_algos((ovl_op_kind_t)0));
    /* the wire's reductions are the public ones */
    assert_int_equal(ovl__reduce_op__descriptor.n_values, OVL_REDUCE_OP_COUNT);
    assert_int_equal(OVL__REDUCE_OP__REDUCE_AVG, OVL_REDUCE_AVG);
    for (uint32_t k = 0; k < 64; k++)
        assert_int_equal(check_op_kind(k, 0, 0) == OVL_OK, ovld_kind(k) != NULL);
}

/* A scaled op's checks (request.c, check_scaling), for both kinds: the
 * wire's dtypes and modes are the public ones; an fp8 dtype needs a
 * scaling and no other takes one; B fp8, not e5m2 twice; an output of 16
 * or 32 bits; known modes; B transposed. */
static void test_request_scaling(void **state)
{
    (void)state;
    assert_int_equal(ovl__scale_mode__descriptor.n_values, OVL_SCALE_MODE_COUNT);
    assert_int_equal(OVL__DTYPE__DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E4M3);
    assert_int_equal(OVL__DTYPE__DTYPE_FP8_E5M2, OVL_DTYPE_FP8_E5M2);
    assert_int_equal(OVL__SCALE_MODE__SCALE_ROW, OVL_SCALE_ROW);
    const uint64_t kinds[] = {OVL__OP_KIND__OP_KIND_AG_GEMM, OVL__OP_KIND__OP_KIND_GEMM_RS};
    for (size_t i = 0; i < 2; i++) {
        uint64_t k = kinds[i];
        Ovl__Scaling sc;
        ovl__scaling__init(&sc);
        sc.b_dtype = OVL_DTYPE_FP8_E5M2;
        sc.out_dtype = OVL_DTYPE_FP32;
        sc.a_mode = OVL_SCALE_ROW;
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc), OVL_OK);
        /* fp8 without scaling, and scaling without fp8 */
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, NULL), OVL_ERR_INVALID);
        assert_int_equal(check_op_sc(k, OVL_DTYPE_BF16, 0, 0, true, &sc), OVL_ERR_INVALID);
        /* B's dtype: fp8, and not e5m2 twice */
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E5M2, 0, 0, true, &sc), OVL_ERR_INVALID);
        sc.b_dtype = OVL_DTYPE_FP8_E4M3;
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E5M2, 0, 0, true, &sc), OVL_OK);
        sc.b_dtype = OVL_DTYPE_BF16;
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc), OVL_ERR_INVALID);
        sc.b_dtype = UINT64_MAX;
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc), OVL_ERR_INVALID);
        sc.b_dtype = OVL_DTYPE_FP8_E4M3;
        /* the output: bf16, fp16, fp32 */
        for (uint64_t t = 0; t <= OVL_DTYPE_COUNT; t++) {
            sc.out_dtype = t;
            assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc),
                             t <= OVL_DTYPE_FP32 ? OVL_OK : OVL_ERR_INVALID);
        }
        sc.out_dtype = OVL_DTYPE_BF16;
        /* modes */
        sc.b_mode = OVL_SCALE_MODE_COUNT;
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc), OVL_ERR_INVALID);
        sc.b_mode = OVL_SCALE_ROW;
        sc.a_mode = OVL_SCALE_MODE_COUNT;
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc), OVL_ERR_INVALID);
        sc.a_mode = OVL_SCALE_TENSOR;
        /* B as k x n: not cuBLASLt's fp8 layout */
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, false, &sc), OVL_ERR_INVALID);
        assert_int_equal(check_op_sc(k, OVL_DTYPE_FP8_E4M3, 0, 0, true, &sc), OVL_OK);
    }
}

/* Every algorithm a config names parses, and the refusal lists them all. */
static void test_config_algos(void **state)
{
    (void)state;
    char text[64], err[512];
    for (int a = 0; a < OVL_ALGO_COUNT; a++) {
        ovld_config_t cfg;
        ovld_config_defaults(&cfg);
        snprintf(text, sizeof text, "default_algo = %s\n", ovl_algo_name((ovl_algo_t)a));
        assert_int_equal(ovld_config_parse(&cfg, "t.conf", text, err, sizeof err), OVL_OK);
        assert_int_equal(cfg.default_algo, a);
    }
    ovld_config_t cfg;
    ovld_config_defaults(&cfg);
    assert_int_equal(ovld_config_parse(&cfg, "t.conf", "default_algo = x\n", err, sizeof err),
                     OVL_ERR_CONFIG);
    for (int a = 0; a < OVL_ALGO_COUNT; a++)
        if (!strstr(err, ovl_algo_name((ovl_algo_t)a)))
            fail_msg("'%s' does not list %s", err, ovl_algo_name((ovl_algo_t)a));
}

/* An op of each kind, algorithm and dtype lands in exactly its own cell:
 * none goes uncounted. */
static void test_stats_every_cell(void **state)
{
    (void)state;
    ovld_stats_t s;
    ovld_stats_reset(&s, 0);
    assert_int_equal(sizeof(s.ops) / sizeof(s.ops[0]), OVL_OP_KIND_COUNT);
    assert_int_equal(sizeof(s.ops[0]) / sizeof(s.ops[0][0]), OVL_ALGO_COUNT);
    assert_int_equal(sizeof(s.ops[0][0]) / sizeof(s.ops[0][0][0]), OVL_DTYPE_COUNT);
    uint64_t ops = 0;
    for (int k = 1; k < OVL_OP_KIND_COUNT; k++)
        for (int a = 0; a < OVL_ALGO_COUNT; a++)
            for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
                ovld_stats_t before = s;
                ovld_stats_op(&s, (ovl_op_kind_t)k, (ovl_algo_t)a, (ovl_dtype_t)t, 960.0, 384.0,
                              1000, OVL_OK);
                ops++;
                for (int k2 = 0; k2 < OVL_OP_KIND_COUNT; k2++)
                    for (int a2 = 0; a2 < OVL_ALGO_COUNT; a2++)
                        for (int t2 = 0; t2 < OVL_DTYPE_COUNT; t2++)
                            assert_int_equal(s.ops[k2][a2][t2],
                                             before.ops[k2][a2][t2] +
                                                 (k2 == k && a2 == a && t2 == t ? 1 : 0));
                assert_int_equal(s.latency.count, ops);
            }
    /* A kind out of range is done but in no cell. */
    ovld_stats_t out = s;
    ovld_stats_op(&s, OVL_OP_KIND_COUNT, OVL_ALGO_RING, OVL_DTYPE_FP32, 960.0, 384.0, 1000, OVL_OK);
    assert_memory_equal(s.ops, out.ops, sizeof(s.ops));
    assert_int_equal(s.latency.count, ops + 1);
    /* A failed op counts as failed, in no cell, and by its status. */
    ovld_stats_t before = s;
    ovld_stats_op(&s, OVL_OP_AG_GEMM, OVL_ALGO_RING, OVL_DTYPE_FP32, 960.0, 384.0, 1000,
                  OVL_ERR_INTERNAL);
    assert_memory_equal(s.ops, before.ops, sizeof(s.ops));
    assert_int_equal(s.ops_failed, 1);
    assert_int_equal(s.errors[-OVL_ERR_INTERNAL], 1);
    /* Every status is counted in its own slot. */
    ovld_stats_reset(&s, 0);
    for (int k = 1; k < OVLD_STATUS_KINDS; k++) {
        ovld_stats_error(&s, (ovl_status_t)-k);
        assert_int_equal(s.errors[k], 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_algo_names),       cmocka_unit_test(test_op_kind_names),
        cmocka_unit_test(test_dtype_names),      cmocka_unit_test(test_scale_mode_names),
        cmocka_unit_test(test_status_names),     cmocka_unit_test(test_instr_names),
        cmocka_unit_test(test_request_ranges),   cmocka_unit_test(test_config_algos),
        cmocka_unit_test(test_stats_every_cell), cmocka_unit_test(test_plan_tables),
        cmocka_unit_test(test_request_scaling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

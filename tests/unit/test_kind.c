/*
 * test_kind.c: the table of op kinds (daemon/core/kind.h) and its one
 * entry so far, all-gather + GEMM: ids that name no kind, every slot's
 * shape (with transb, several Bs, and an m * world that overflows), the
 * names the messages use, what ranks must agree on (the kind first), the
 * planner's buffers and parameters, the layouts that force the copy
 * engine, and what an op counts in the statistics.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kind.h"
#include "scaling.h"

static const ovld_kind_t *ag(void)
{
    const ovld_kind_t *k = ovld_kind(OVLD_KIND_AG_GEMM);
    assert_non_null(k);
    return k;
}

static void test_table(void **state)
{
    (void)state;
    assert_null(ovld_kind(OVLD_KIND_NONE));
    assert_null(ovld_kind(OVL_OP_KIND_COUNT));
    assert_null(ovld_kind(UINT32_MAX));
    assert_ptr_equal(ag(), &ovld_kind_ag_gemm);
    assert_int_equal(ag()->id, OVLD_KIND_AG_GEMM);
    assert_string_equal(ovl_op_kind_name((ovl_op_kind_t)ag()->id), "ag_gemm");
    /* every public kind has its entry, and every entry is a public kind */
    for (uint32_t id = 0; id < OVL_OP_KIND_COUNT + 4; id++)
        assert_int_equal(ovld_kind(id) != NULL, ovl_op_kind_name((ovl_op_kind_t)id) != NULL);
    /* names: the kind's own, "?" for what it does not have */
    assert_string_equal(ovld_buf_name(OVLD_KIND_AG_GEMM, OVLD_BUF_A), "a");
    assert_string_equal(ovld_buf_name(OVLD_KIND_AG_GEMM, OVLD_BUF_AOUT), "a_out");
    assert_string_equal(ovld_buf_name(OVLD_KIND_AG_GEMM, ovld_buf_b(7)), "b7");
    assert_string_equal(ovld_buf_name(OVLD_KIND_AG_GEMM, ovld_buf_c(1)), "c1");
    assert_string_equal(ovld_buf_name(OVLD_KIND_AG_GEMM, OVLD_BUF_COUNT), "?");
    assert_string_equal(ovld_buf_name(OVLD_KIND_AG_GEMM, -1), "?");
    assert_string_equal(ovld_buf_name(OVLD_KIND_NONE, OVLD_BUF_A), "?");
}

static ovld_op_desc_t op(uint64_t m, uint64_t n, uint64_t k, bool transb, uint32_t nb)
{
    ovld_op_desc_t q = {.kind = OVLD_KIND_AG_GEMM,
                        .ag = {.m = m,
                               .n = n,
                               .k = k,
                               .dtype = OVL_DTYPE_BF16,
                               .algo = OVL_ALGO_RING,
                               .transb = transb,
                               .nb = nb}};
    for (uint32_t i = 1; i < nb; i++)
        q.ag.n_more[i - 1] = 100 * i;
    return q;
}

static void expect_shape(const ovld_buf_shape_t *s, uint64_t rows, uint64_t cols, bool required,
                         bool optional)
{
    assert_int_equal(s->rows, rows);
    assert_int_equal(s->cols, cols);
    assert_int_equal(s->required, required);
    assert_int_equal(s->optional, optional);
}

static void test_shapes(void **state)
{
    (void)state;
    ovld_buf_shape_t sh[OVLD_BUF_COUNT];
    char msg[128] = "";
    ovld_op_desc_t q = op(4, 5, 6, false, 2);
    assert_int_equal(ag()->buf_shapes(&q, 3, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_A], 4, 6, true, false);
    expect_shape(&sh[OVLD_BUF_AOUT], 12, 6, false, true);
    expect_shape(&sh[OVLD_BUF_B], 6, 5, true, false);
    expect_shape(&sh[OVLD_BUF_C], 12, 5, true, false);
    expect_shape(&sh[ovld_buf_b(1)], 6, 100, true, false);
    expect_shape(&sh[ovld_buf_c(1)], 12, 100, true, false);
    for (uint32_t i = 2; i < OVLD_MAX_BS; i++) { /* past nb: not the op's */
        expect_shape(&sh[ovld_buf_b(i)], 0, 0, false, false);
        expect_shape(&sh[ovld_buf_c(i)], 0, 0, false, false);
    }
    /* transb: B is n x k; nb 0 reads as one B */
    q = op(4, 5, 6, true, 0);
    assert_int_equal(ag()->buf_shapes(&q, 1, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_B], 5, 6, true, false);
    expect_shape(&sh[OVLD_BUF_C], 4, 5, true, false);
    expect_shape(&sh[ovld_buf_b(1)], 0, 0, false, false);
    /* every slot the kind uses has a name */
    q = op(4, 5, 6, false, OVLD_MAX_BS);
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    for (int b = 0; b < OVLD_BUF_COUNT; b++) {
        /* a scaled op's slots: the op is not one */
        bool scaled_slot = b >= OVLD_BUF_A_SCALE;
        assert_true(scaled_slot != (sh[b].required || sh[b].optional));
        assert_non_null(ag()->buf_name(b));
    }
    /* scaled (one B, transb): fp8 A and B of a byte, C of the output's
     * dtype; scales of fp32, by row (A: m x 1) or one; the bias optional */
    q = op(4, 5, 6, true, 1);
    q.ag.dtype = OVL_DTYPE_FP8_E4M3;
    q.ag.sc = (ovld_scaling_desc_t){.scaled = true,
                                    .b_dtype = OVL_DTYPE_FP8_E5M2,
                                    .out_dtype = OVL_DTYPE_FP32,
                                    .a_mode = OVL_SCALE_ROW,
                                    .b_mode = OVL_SCALE_TENSOR};
    assert_int_equal(ag()->buf_shapes(&q, 3, sh, msg, sizeof(msg)), OVL_OK);
    assert_int_equal(sh[OVLD_BUF_A].elem, 1);
    assert_int_equal(sh[OVLD_BUF_B].elem, 1);
    assert_int_equal(sh[OVLD_BUF_C].elem, 4);
    expect_shape(&sh[OVLD_BUF_A_SCALE], 4, 1, true, false);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 1, 1, true, false);
    expect_shape(&sh[OVLD_BUF_BIAS], 1, 5, false, true);
    assert_int_equal(sh[OVLD_BUF_A_SCALE].elem, 4);
    assert_int_equal(sh[OVLD_BUF_BIAS].elem, 4);
    assert_string_equal(ag()->buf_name(OVLD_BUF_A_SCALE), "a_scale");
    assert_string_equal(ag()->buf_name(OVLD_BUF_BIAS), "bias");
    expect_shape(&sh[ovld_buf_b_scale(1)], 0, 0, false, false); /* one B */
    /* three Bs: each B i its own scales (1 x n_i by row) and bias */
    q = op(4, 5, 6, true, 3);
    q.ag.dtype = OVL_DTYPE_FP8_E4M3;
    q.ag.sc = (ovld_scaling_desc_t){.scaled = true,
                                    .b_dtype = OVL_DTYPE_FP8_E4M3,
                                    .out_dtype = OVL_DTYPE_BF16,
                                    .a_mode = OVL_SCALE_TENSOR,
                                    .b_mode = OVL_SCALE_ROW};
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 1, 5, true, false);
    for (uint32_t i = 1; i < 3; i++) {
        expect_shape(&sh[ovld_buf_b_scale(i)], 1, q.ag.n_more[i - 1], true, false);
        expect_shape(&sh[ovld_buf_bias(i)], 1, q.ag.n_more[i - 1], false, true);
        assert_int_equal(sh[ovld_buf_bias(i)].elem, 2);
        assert_true(sh[ovld_buf_b_scale(i)].dense);
        assert_int_equal(ag()->plan_buf(ovld_buf_b_scale(i)), ovl_buf_sb(i));
        assert_int_equal(ag()->plan_buf(ovld_buf_bias(i)), ovl_buf_bias(i));
    }
    expect_shape(&sh[ovld_buf_b_scale(3)], 0, 0, false, false);
    assert_string_equal(ag()->buf_name(ovld_buf_b_scale(2)), "b_scale2");
    assert_string_equal(ag()->buf_name(ovld_buf_bias(7)), "bias7");
    /* m * world past 64 bits: refused with words, not wrapped */
    q = op(UINT64_MAX / 2 + 1, 5, 6, false, 1);
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_ERR_RANGE);
    assert_non_null(strstr(msg, "overflows"));
}

static void test_fields_and_agreement(void **state)
{
    (void)state;
    ovld_op_desc_t q = op(4, 5, 6, true, 3);
    q.buf[OVLD_BUF_AOUT].given = true;
    ovld_op_fields_t a, b;
    ag()->fields(&q, true, &a);
    assert_int_equal(a.kind, OVLD_KIND_AG_GEMM);
    assert_int_equal(a.ag.dtype, OVL_DTYPE_BF16);
    assert_true(a.ag.has_aout);
    assert_int_equal(a.ag.nb, 3);
    assert_int_equal(a.ag.n_more[1], 200);
    /* an invalid op's enumerations match nothing */
    ag()->fields(&q, false, &b);
    assert_int_equal(b.ag.dtype, UINT32_MAX);
    assert_int_equal(b.ag.algo, UINT32_MAX);
    char what[64];
    uint64_t va, vb;
    b = a;
    assert_false(ovld_op_fields_differ(&a, &b, what, sizeof(what), &va, &vb));
    b.ag.n_more[1] = 201;
    assert_true(ovld_op_fields_differ(&a, &b, what, sizeof(what), &va, &vb));
    assert_string_equal(what, "n of B 2");
    assert_int_equal(va, 200);
    assert_int_equal(vb, 201);
    b = a;
    b.ag.has_aout = false;
    assert_true(ovld_op_fields_differ(&a, &b, what, sizeof(what), &va, &vb));
    assert_string_equal(what, "a_out (given or not)");
    /* a scaled op's agreement: every field of the scaling, and the bias
     * given or not, which counts only for a scaled op (the slot is not read
     * otherwise) */
    q.buf[OVLD_BUF_BIAS].given = true;
    ag()->fields(&q, true, &b);
    assert_false(b.ag.has_bias);
    q.ag.dtype = OVL_DTYPE_FP8_E4M3;
    q.ag.transb = true;
    q.ag.sc = (ovld_scaling_desc_t){.scaled = true,
                                    .b_dtype = OVL_DTYPE_FP8_E4M3,
                                    .out_dtype = OVL_DTYPE_BF16,
                                    .a_mode = OVL_SCALE_ROW,
                                    .b_mode = OVL_SCALE_ROW};
    ovld_op_fields_t s0, s1;
    ag()->fields(&q, true, &s0);
    assert_true(s0.ag.has_bias);
    static const char *const names[] = {"b_dtype",      "out_dtype",  "a_scale mode",
                                        "b_scale mode", "fast_accum", "bias (given or not)"};
    for (int f = 0; f < 6; f++) {
        s1 = s0;
        switch (f) {
        case 0:
            s1.ag.sc.b_dtype = OVL_DTYPE_FP8_E5M2;
            break;
        case 1:
            s1.ag.sc.out_dtype = OVL_DTYPE_FP32;
            break;
        case 2:
            s1.ag.sc.a_mode = OVL_SCALE_TENSOR;
            break;
        case 3:
            s1.ag.sc.b_mode = OVL_SCALE_TENSOR;
            break;
        case 4:
            s1.ag.sc.fast_accum = true;
            break;
        case 5:
            s1.ag.has_bias = false;
            break;
        }
        assert_true(ovld_op_fields_differ(&s0, &s1, what, sizeof(what), &va, &vb));
        assert_string_equal(what, names[f]);
    }
    q.buf[OVLD_BUF_BIAS].given = false;
    q.ag.dtype = OVL_DTYPE_BF16;
    q.ag.transb = false;
    q.ag.sc = (ovld_scaling_desc_t){.scaled = false};
    /* the kind is compared first, before any field of either */
    b = a;
    b.kind = OVLD_KIND_NONE;
    b.ag.m = 99;
    assert_true(ovld_op_fields_differ(&a, &b, what, sizeof(what), &va, &vb));
    assert_string_equal(what, "kind");
    assert_int_equal(va, OVLD_KIND_AG_GEMM);
    assert_int_equal(vb, OVLD_KIND_NONE);
}

/* The one rule of a scaling, for clients and peers (ovl_scaling_refusal):
 * each way to break it refused in its words, values past 32 bits included,
 * and the ones an op may have taken. */
static void test_scaling_refusal(void **state)
{
    (void)state;
    const uint64_t e4 = OVL_DTYPE_FP8_E4M3, e5 = OVL_DTYPE_FP8_E5M2, bf = OVL_DTYPE_BF16;
    assert_null(ovl_scaling_refusal(e4, e4, bf, OVL_SCALE_ROW, OVL_SCALE_TENSOR, true));
    assert_null(ovl_scaling_refusal(e5, e4, OVL_DTYPE_FP32, 0, 0, true));
    assert_null(ovl_scaling_refusal(e4, e5, OVL_DTYPE_FP16, 1, 1, true));
    static const struct {
        uint64_t dt, b, out, am, bm;
        bool transb;
        const char *words;
    } bad[] = {
        {bf, e4, bf, 0, 0, true, "A is fp8"},
        {UINT64_MAX, e4, bf, 0, 0, true, "A is fp8"},
        {e4, bf, bf, 0, 0, true, "B is fp8"},
        {e4, (UINT64_C(1) << 32) + e4, bf, 0, 0, true, "B is fp8"},
        {e5, e5, bf, 0, 0, true, "fp8e5m2 times fp8e5m2"},
        {e4, e4, e4, 0, 0, true, "writes bf16, fp16 or fp32"},
        {e4, e4, OVL_DTYPE_COUNT, 0, 0, true, "writes bf16, fp16 or fp32"},
        {e4, e4, bf, OVL_SCALE_MODE_COUNT, 0, true, "unknown scale mode"},
        {e4, e4, bf, 0, UINT64_MAX, true, "unknown scale mode"},
        {e4, e4, bf, 0, 0, false, "B transposed"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *why = ovl_scaling_refusal(bad[i].dt, bad[i].b, bad[i].out, bad[i].am, bad[i].bm,
                                              bad[i].transb);
        if (!why || !strstr(why, bad[i].words))
            fail_msg("case %zu: '%s' does not say '%s'", i, why ? why : "(taken)", bad[i].words);
    }
}

static void test_plan(void **state)
{
    (void)state;
    assert_int_equal(ag()->plan_buf(OVLD_BUF_A), OVL_BUF_A);
    assert_int_equal(ag()->plan_buf(OVLD_BUF_AOUT), OVL_BUF_G);
    for (uint32_t i = 0; i < OVLD_MAX_BS; i++) {
        assert_int_equal(ag()->plan_buf(ovld_buf_b(i)), ovl_buf_b(i));
        assert_int_equal(ag()->plan_buf(ovld_buf_c(i)), ovl_buf_c(i));
    }
    assert_int_equal(ag()->plan_buf(OVLD_BUF_COUNT), -1);
    ovld_op_desc_t q = op(4, 5, 6, true, 2);
    q.ag.chunks = 3;
    q.ag.streams = 2;
    ovld_op_fields_t f;
    ag()->fields(&q, true, &f);
    ovl_plan_params_t pp;
    ag()->plan_params(&f, 4, &pp);
    assert_int_equal(pp.world, 4);
    assert_int_equal(pp.m, 4);
    assert_int_equal(pp.n, 5);
    assert_int_equal(pp.k, 6);
    assert_int_equal(pp.algo, OVL_ALGO_RING);
    assert_int_equal(pp.chunks, 3);
    assert_int_equal(pp.streams, 2);
    assert_true(pp.transb);
    assert_false(pp.want_gathered);
    assert_int_equal(pp.nb, 2);
    assert_int_equal(pp.n_more[0], 100);
    /* a dense A is NCCL's; a strided A or a_out is the copy engine's */
    ovld_buf_use_t use[OVLD_BUF_COUNT] = {0};
    static int reg; /* any non-NULL hold */
    use[OVLD_BUF_A] = (ovld_buf_use_t){.hold = (struct ovld_reg *)&reg, .view = {.ld = 6}};
    assert_false(ag()->strided(&f, use));
    use[OVLD_BUF_AOUT] = (ovld_buf_use_t){.hold = (struct ovld_reg *)&reg, .view = {.ld = 7}};
    assert_true(ag()->strided(&f, use));
    use[OVLD_BUF_AOUT].hold = NULL; /* not given: its ld means nothing */
    assert_false(ag()->strided(&f, use));
}

static void test_count(void **state)
{
    (void)state;
    /* world 2, m 4, Bs of 5 and 100 columns, k 6, bf16: on every rank
     * 2 * 8 * 105 * 6 flop and 8 * 6 * 2 bytes gathered, times 2 ranks */
    ovld_op_desc_t q = op(4, 5, 6, false, 2);
    ovld_op_fields_t f;
    ag()->fields(&q, true, &f);
    ovld_op_count_t c = ag()->count(&f, 2);
    assert_true(c.flop == 2.0 * 8 * 105 * 6 * 2);
    assert_true(c.bytes == 8.0 * 6 * 2 * 2);
    assert_int_equal(c.dtype, OVL_DTYPE_BF16);
    char text[64];
    ag()->describe(&f, text, sizeof(text));
    assert_string_equal(text, "m=4 n=5 k=6 several Bs");
    ag()->describe(&f, text, 6); /* cut to fit, terminated */
    assert_string_equal(text, "m=4 n");
}

/* GEMM + reduce-scatter's entry: its three buffers, m a multiple of the
 * world (refused with words otherwise), every field agreed on, its plan
 * parameters and counts, and that it runs across nodes (naive and
 * collective: NCCL's reduce-scatter spans the job). */
static void test_gemm_rs(void **state)
{
    (void)state;
    const ovld_kind_t *k = ovld_kind(OVLD_KIND_GEMM_RS);
    assert_ptr_equal(k, &ovld_kind_gemm_rs);
    assert_string_equal(ovl_op_kind_name((ovl_op_kind_t)k->id), "gemm_rs");
    assert_true(k->across);
    assert_true(ovld_kind(OVLD_KIND_AG_GEMM)->across);
    assert_string_equal(ovld_buf_name(OVLD_KIND_GEMM_RS, OVLD_BUF_C), "c");
    assert_string_equal(ovld_buf_name(OVLD_KIND_GEMM_RS, OVLD_BUF_AOUT), "?");
    ovld_op_desc_t q = {.kind = OVLD_KIND_GEMM_RS,
                        .rs = {.m = 12,
                               .n = 5,
                               .k = 7,
                               .dtype = OVL_DTYPE_FP32,
                               .algo = OVL_ALGO_COLLECTIVE,
                               .reduce_op = OVL_REDUCE_AVG}};
    ovld_buf_shape_t sh[OVLD_BUF_COUNT];
    char msg[160] = "";
    assert_int_equal(k->buf_shapes(&q, 3, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_A], 12, 7, true, false);
    expect_shape(&sh[OVLD_BUF_B], 7, 5, true, false);
    expect_shape(&sh[OVLD_BUF_C], 4, 5, true, false);
    for (int b = OVLD_BUF_AOUT; b < OVLD_BUF_COUNT; b++)
        expect_shape(&sh[b], 0, 0, false, false);
    q.rs.transb = true;
    assert_int_equal(k->buf_shapes(&q, 1, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_B], 5, 7, true, false);
    expect_shape(&sh[OVLD_BUF_C], 12, 5, true, false);
    assert_int_equal(k->buf_shapes(&q, 5, sh, msg, sizeof(msg)), OVL_ERR_INVALID);
    assert_non_null(strstr(msg, "m 12 is not a multiple of the world 5"));
    /* fields: every one agreed on, the reduction included */
    ovld_op_fields_t a, b;
    k->fields(&q, true, &a);
    assert_int_equal(a.kind, OVLD_KIND_GEMM_RS);
    b = a;
    char what[64];
    uint64_t va, vb;
    assert_false(ovld_op_fields_differ(&a, &b, what, sizeof(what), &va, &vb));
    b.rs.reduce_op = OVL_REDUCE_SUM;
    assert_true(ovld_op_fields_differ(&a, &b, what, sizeof(what), &va, &vb));
    assert_string_equal(what, "reduce_op");
    k->fields(&q, false, &b);
    assert_int_equal(b.rs.dtype, UINT32_MAX);
    /* an all-gather and a reduce-scatter of one shape differ by kind */
    ovld_op_fields_t g = {.kind = OVLD_KIND_AG_GEMM};
    assert_true(ovld_op_fields_differ(&a, &g, what, sizeof(what), &va, &vb));
    assert_string_equal(what, "kind");
    /* the planner's parameters: its kind and reduction */
    ovl_plan_params_t pp;
    k->plan_params(&a, 3, &pp);
    assert_int_equal(pp.kind, OVL_OP_GEMM_RS);
    assert_int_equal(pp.reduce_op, OVL_REDUCE_AVG);
    assert_int_equal(pp.m, 12);
    assert_int_equal(pp.world, 3);
    assert_true(pp.transb);
    /* counts on every rank: 2 m n k flop, m n partials */
    ovld_op_count_t c = k->count(&a, 3);
    assert_true(c.flop == 2.0 * 12 * 5 * 7 * 3);
    assert_true(c.bytes == 12.0 * 5 * 4 * 3);
    assert_int_equal(c.dtype, OVL_DTYPE_FP32);
    k->describe(&a, msg, sizeof(msg));
    assert_string_equal(msg, "m=12 n=5 k=7 avg transb");
    /* a strided output says so */
    ovld_buf_use_t use[OVLD_BUF_COUNT] = {0};
    int dummy;
    use[OVLD_BUF_C] = (ovld_buf_use_t){.hold = (struct ovld_reg *)&dummy, .view = {.ld = 5}};
    assert_false(k->strided(&a, use));
    use[OVLD_BUF_C].view.ld = 8;
    assert_true(k->strided(&a, use));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_gemm_rs),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_fields_and_agreement),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_scaling_refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

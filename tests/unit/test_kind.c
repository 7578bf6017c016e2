/*
 * test_kind.c: the table of op kinds (daemon/core/kind.h) and its one
 * entry so far, all-gather + GEMM: ids that name no kind, every slot's
 * shape (with transb, several Bs, and an m * world that overflows), the
 * names the messages use, what ranks must agree on (the kind first), the
 * planner's buffers and parameters, the layouts that force the copy
 * engine, and what an op counts in the statistics; the one rule of a
 * scaled op's scaling (common/scaling.h) and the scale slots' shapes,
 * block scales (1x128, 128x128) included, for both kinds.
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
    /* block scales: A 1x128 with B 1x128 or 128x128 */
    assert_null(
        ovl_scaling_refusal(e4, e4, bf, OVL_SCALE_BLOCK_1X128, OVL_SCALE_BLOCK_1X128, true));
    assert_null(ovl_scaling_refusal(e5, e4, OVL_DTYPE_FP32, OVL_SCALE_BLOCK_1X128,
                                    OVL_SCALE_BLOCK_128X128, true));
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
        /* block scales: A never by 128x128, whatever B's */
        {e4, e4, bf, OVL_SCALE_BLOCK_128X128, OVL_SCALE_BLOCK_128X128, true,
         "A's scales by 128x128 tile: not taken"},
        {e4, e4, bf, OVL_SCALE_BLOCK_128X128, OVL_SCALE_BLOCK_1X128, true, "A takes 1x128"},
        {e4, e4, bf, OVL_SCALE_BLOCK_128X128, OVL_SCALE_ROW, true, "A's scales by 128x128"},
        {e4, e4, bf, OVL_SCALE_BLOCK_128X128, OVL_SCALE_TENSOR, true, "A's scales by 128x128"},
        /* block with block: mixed either way */
        {e4, e4, bf, OVL_SCALE_BLOCK_1X128, OVL_SCALE_ROW, true, "go with block scales"},
        {e4, e4, bf, OVL_SCALE_BLOCK_1X128, OVL_SCALE_TENSOR, true, "go with block scales"},
        {e4, e4, bf, OVL_SCALE_ROW, OVL_SCALE_BLOCK_1X128, true, "go with block scales"},
        {e4, e4, bf, OVL_SCALE_TENSOR, OVL_SCALE_BLOCK_128X128, true, "go with block scales"},
        {e4, e4, bf, OVL_SCALE_ROW, OVL_SCALE_BLOCK_128X128, true, "go with block scales"},
        /* unknown mode 4, on either side; it names the modes there are */
        {e4, e4, bf, 4, OVL_SCALE_BLOCK_1X128, true, "unknown scale mode"},
        {e4, e4, bf, OVL_SCALE_BLOCK_1X128, 4, true, "1x128 2, 128x128 3"},
        /* block scales do not lift the rule's other parts */
        {e4, e4, bf, OVL_SCALE_BLOCK_1X128, OVL_SCALE_BLOCK_1X128, false, "B transposed"},
        {e5, e5, bf, OVL_SCALE_BLOCK_1X128, OVL_SCALE_BLOCK_128X128, true, "fp8e5m2 times fp8e5m2"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *why = ovl_scaling_refusal(bad[i].dt, bad[i].b, bad[i].out, bad[i].am, bad[i].bm,
                                              bad[i].transb);
        if (!why || !strstr(why, bad[i].words))
            fail_msg("case %zu: '%s' does not say '%s'", i, why ? why : "(taken)", bad[i].words);
    }
}

/* The shapes' rule of block scales (ovl_scaling_shape_refusal): A 1x128
 * needs the GEMM's rows in fours, B 1x128 n in fours; 128x128, row and
 * tensor need neither; and the row granule chunks are cut in. */
static void test_scaling_shape_refusal(void **state)
{
    (void)state;
    const uint64_t t = OVL_SCALE_TENSOR, r = OVL_SCALE_ROW, b1 = OVL_SCALE_BLOCK_1X128,
                   b2 = OVL_SCALE_BLOCK_128X128;
    assert_null(ovl_scaling_shape_refusal(b1, b1, 4, 8));
    assert_null(ovl_scaling_shape_refusal(b1, b2, 8, 6)); /* 128x128: any n */
    assert_null(ovl_scaling_shape_refusal(b1, b2, 8, 1));
    assert_null(ovl_scaling_shape_refusal(r, r, 6, 6)); /* not block: any */
    assert_null(ovl_scaling_shape_refusal(t, t, 1, 1));
    assert_null(ovl_scaling_shape_refusal(b1, b1, 0, 0));
    const char *why = ovl_scaling_shape_refusal(b1, b1, 6, 8);
    assert_non_null(why);
    assert_non_null(strstr(why, "A's 1x128 scales need its rows in multiples of 4"));
    why = ovl_scaling_shape_refusal(b1, b2, 2, 6);
    assert_non_null(why);
    assert_non_null(strstr(why, "A's 1x128 scales need its rows in multiples of 4"));
    why = ovl_scaling_shape_refusal(b1, b1, 4, 6);
    assert_non_null(why);
    assert_non_null(strstr(why, "B's 1x128 scales need n in multiples of 4"));
    why = ovl_scaling_shape_refusal(b1, b1, UINT64_MAX - 3, (UINT64_C(1) << 32) + 2);
    assert_non_null(why);
    assert_non_null(strstr(why, "B's 1x128"));
    assert_int_equal(ovl_scaling_row_granule(b1), 4);
    assert_int_equal(ovl_scaling_row_granule(b2), 1);
    assert_int_equal(ovl_scaling_row_granule(r), 1);
    assert_int_equal(ovl_scaling_row_granule(t), 1);
}

/* A scaling of A's scales by 1x128 and B's by b_mode. */
static ovld_scaling_desc_t block_sc(ovl_scale_mode_t b_mode)
{
    return (ovld_scaling_desc_t){.scaled = true,
                                 .b_dtype = OVL_DTYPE_FP8_E4M3,
                                 .out_dtype = OVL_DTYPE_BF16,
                                 .a_mode = OVL_SCALE_BLOCK_1X128,
                                 .b_mode = b_mode};
}

/* A scaled op's slots by block scales (ovld_scaling_shapes, through each
 * kind's buf_shapes): A's scales m x ceil(k/128) by 1x128, B i's n_i x
 * ceil(k/128) by 1x128 and ceil(n_i/128) x ceil(k/128) by 128x128, k a
 * multiple of 128 or not; refused with words where a GEMM's rows (a
 * rank's m; gemm_rs's m / world) or, by B 1x128, an n (a second B's too)
 * are not in fours; B 128x128 takes any n. */
static void test_block_shapes(void **state)
{
    (void)state;
    ovld_buf_shape_t sh[OVLD_BUF_COUNT];
    char msg[256] = "";
    /* all-gather + GEMM: m 8, k 300 (3 blocks, the last partial), Bs of
     * 12, 100 and 200 columns */
    ovld_op_desc_t q = op(8, 12, 300, true, 3);
    q.ag.dtype = OVL_DTYPE_FP8_E4M3;
    q.ag.sc = block_sc(OVL_SCALE_BLOCK_1X128);
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_A_SCALE], 8, 3, true, false);
    assert_int_equal(sh[OVLD_BUF_A_SCALE].elem, 4);
    assert_true(sh[OVLD_BUF_A_SCALE].dense);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 12, 3, true, false);
    expect_shape(&sh[ovld_buf_b_scale(1)], 100, 3, true, false);
    expect_shape(&sh[ovld_buf_b_scale(2)], 200, 3, true, false);
    expect_shape(&sh[ovld_buf_bias(2)], 1, 200, false, true);
    assert_true(sh[ovld_buf_b_scale(2)].dense);
    assert_int_equal(sh[ovld_buf_b_scale(2)].elem, 4);
    expect_shape(&sh[ovld_buf_b_scale(3)], 0, 0, false, false);
    /* 128x128: ceil(n_i / 128) rows; k 256, whole blocks */
    q.ag.k = 256;
    q.ag.sc = block_sc(OVL_SCALE_BLOCK_128X128);
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_A_SCALE], 8, 2, true, false);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 1, 2, true, false);
    expect_shape(&sh[ovld_buf_b_scale(1)], 1, 2, true, false);
    expect_shape(&sh[ovld_buf_b_scale(2)], 2, 2, true, false);
    /* k of one partial block, and 129: two */
    q.ag.k = 1;
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_A_SCALE], 8, 1, true, false);
    q.ag.k = 129;
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_A_SCALE], 8, 2, true, false);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 1, 2, true, false);
    /* 128x128 takes n not in fours, a second B's too */
    q.ag.n = 6;
    q.ag.n_more[0] = 130;
    assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 1, 2, true, false);
    expect_shape(&sh[ovld_buf_b_scale(1)], 2, 2, true, false);
    /* refused: m 6 (whatever B's mode), n 6 by B 1x128, a second B's 130 */
    static const struct {
        uint64_t m, n, n1;
        ovl_scale_mode_t b_mode;
        const char *words;
    } bad[] = {
        {6, 12, 100, OVL_SCALE_BLOCK_1X128,
         "A's 1x128 scales need its rows in multiples of 4 (cuBLASLt lays each 128 of k's scales "
         "out by rows, 16-byte aligned) (rows 6, n 12)"},
        {6, 12, 100, OVL_SCALE_BLOCK_128X128, "rows in multiples of 4"},
        {8, 6, 100, OVL_SCALE_BLOCK_1X128, "B's 1x128 scales need n in multiples of 4"},
        {8, 12, 130, OVL_SCALE_BLOCK_1X128,
         "B's 1x128 scales need n in multiples of 4 (cuBLASLt lays each 128 of k's scales out by "
         "columns of op(B), 16-byte aligned) (rows 8, n 130)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        q = op(bad[i].m, bad[i].n, 300, true, 2);
        q.ag.dtype = OVL_DTYPE_FP8_E4M3;
        q.ag.n_more[0] = bad[i].n1;
        q.ag.sc = block_sc(bad[i].b_mode);
        msg[0] = '\0';
        assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_ERR_INVALID);
        if (!strstr(msg, bad[i].words))
            fail_msg("ag_gemm case %zu: '%s' does not say '%s'", i, msg, bad[i].words);
        /* by row the same shapes are taken */
        q.ag.sc.a_mode = q.ag.sc.b_mode = OVL_SCALE_ROW;
        assert_int_equal(ag()->buf_shapes(&q, 2, sh, msg, sizeof(msg)), OVL_OK);
    }

    /* GEMM + reduce-scatter: a GEMM's rows are a block's, m / world */
    const ovld_kind_t *rs = ovld_kind(OVLD_KIND_GEMM_RS);
    assert_non_null(rs);
    q = (ovld_op_desc_t){.kind = OVLD_KIND_GEMM_RS,
                         .rs = {.m = 24,
                                .n = 20,
                                .k = 300,
                                .dtype = OVL_DTYPE_FP8_E4M3,
                                .algo = OVL_ALGO_PUSH,
                                .transb = true,
                                .sc = block_sc(OVL_SCALE_BLOCK_1X128)}};
    assert_int_equal(rs->buf_shapes(&q, 3, sh, msg, sizeof(msg)), OVL_OK); /* 8 a block */
    expect_shape(&sh[OVLD_BUF_A_SCALE], 24, 3, true, false);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 20, 3, true, false);
    expect_shape(&sh[OVLD_BUF_BIAS], 1, 20, false, true);
    expect_shape(&sh[OVLD_BUF_C], 8, 20, true, false);
    q.rs.sc.b_mode = OVL_SCALE_BLOCK_128X128;
    q.rs.n = 130;
    assert_int_equal(rs->buf_shapes(&q, 3, sh, msg, sizeof(msg)), OVL_OK);
    expect_shape(&sh[OVLD_BUF_B_SCALE], 2, 3, true, false);
    /* m 24 in fours, but a block of 6 at world 4: refused */
    assert_int_equal(rs->buf_shapes(&q, 4, sh, msg, sizeof(msg)), OVL_ERR_INVALID);
    assert_non_null(strstr(msg, "A's 1x128 scales need its rows in multiples of 4"));
    assert_non_null(strstr(msg, "(rows 6, n 130)"));
    /* B 1x128 with n 130 */
    q.rs.sc.b_mode = OVL_SCALE_BLOCK_1X128;
    assert_int_equal(rs->buf_shapes(&q, 3, sh, msg, sizeof(msg)), OVL_ERR_INVALID);
    assert_non_null(strstr(msg, "B's 1x128 scales need n in multiples of 4"));
    assert_non_null(strstr(msg, "(rows 8, n 130)"));

    /* ovld_scaling_shapes itself: nothing for an op not scaled; A by
     * 128x128 (which ovl_scaling_refusal refuses first) refused, not
     * shaped */
    ovld_scaling_desc_t none = {.scaled = false};
    uint64_t ns[1] = {6};
    for (int b = 0; b < OVLD_BUF_COUNT; b++)
        sh[b] = (ovld_buf_shape_t){.rows = 77};
    assert_int_equal(ovld_scaling_shapes(&none, 6, 300, 6, 1, ns, sh, msg, sizeof(msg)), OVL_OK);
    for (int b = 0; b < OVLD_BUF_COUNT; b++)
        assert_int_equal(sh[b].rows, 77);
    ovld_scaling_desc_t a128 = block_sc(OVL_SCALE_BLOCK_128X128);
    a128.a_mode = OVL_SCALE_BLOCK_128X128;
    ns[0] = 8;
    assert_int_equal(ovld_scaling_shapes(&a128, 8, 300, 8, 1, ns, sh, msg, sizeof(msg)),
                     OVL_ERR_INVALID);
    assert_non_null(strstr(msg, "a_scale: mode 3 is not one of A's"));
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
        cmocka_unit_test(test_scaling_shape_refusal),
        cmocka_unit_test(test_block_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * kind_gemm_rs.c: the GEMM + reduce-scatter op kind, C = reduce_scatter(A @
 * B) (kind.h). Rank q gives A_q (m x k: its share of the inner dimension)
 * and B_q (k x n; n x k with transb); rank r gets C_r ((m / world) x n),
 * rows [r * m/world, (r+1) * m/world) of the sum over q of A_q @ op(B_q),
 * or of its average (reduce_op). m must be a multiple of the world.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kind.h"

static const char *buf_name(int which)
{
    static const char *const names[] = {"a", "b", "c"};
    switch (which) {
    case OVLD_BUF_A_SCALE:
        return "a_scale";
    case OVLD_BUF_B_SCALE:
        return "b_scale";
    case OVLD_BUF_BIAS:
        return "bias";
    default:
        return which >= 0 && which < 3 ? names[which] : NULL;
    }
}

static ovl_status_t buf_shapes(const ovld_op_desc_t *op, uint32_t world,
                               ovld_buf_shape_t shape[OVLD_BUF_COUNT], char *msg, size_t len)
{
    const ovld_gemm_rs_desc_t *q = &op->rs;
    for (int b = 0; b < OVLD_BUF_COUNT; b++)
        shape[b] = (ovld_buf_shape_t){0};
    if (world == 0 || q->m % world != 0) {
        snprintf(msg, len,
                 "m %" PRIu64 " is not a multiple of the world %u: each rank keeps m / world "
                 "rows of the sum",
                 q->m, world);
        return OVL_ERR_INVALID;
    }
    /* A's; B's and C's (scaled: b_dtype and out_dtype) */
    size_t elem = ovl_dtype_size((ovl_dtype_t)q->dtype);
    size_t belem = q->sc.scaled ? ovl_dtype_size((ovl_dtype_t)q->sc.b_dtype) : elem;
    size_t celem = q->sc.scaled ? ovl_dtype_size((ovl_dtype_t)q->sc.out_dtype) : elem;
    shape[OVLD_BUF_A] =
        (ovld_buf_shape_t){.rows = q->m, .cols = q->k, .elem = elem, .required = true};
    shape[OVLD_BUF_B] = (ovld_buf_shape_t){.rows = q->transb ? q->n : q->k,
                                           .cols = q->transb ? q->k : q->n,
                                           .elem = belem,
                                           .required = true};
    shape[OVLD_BUF_C] =
        (ovld_buf_shape_t){.rows = q->m / world, .cols = q->n, .elem = celem, .required = true};
    /* a GEMM's rows: a block of the output's (C's rows) */
    return ovld_scaling_shapes(&q->sc, q->m, q->k, q->m / world, 1, &q->n, shape, msg, len);
}

static void fields(const ovld_op_desc_t *op, bool valid, ovld_op_fields_t *f)
{
    const ovld_gemm_rs_desc_t *q = &op->rs;
    *f = (ovld_op_fields_t){.kind = OVLD_KIND_GEMM_RS, .rs = *q};
    f->rs.has_bias = q->sc.scaled && op->buf[OVLD_BUF_BIAS].given;
    if (!valid) {
        f->rs.dtype = f->rs.algo = f->rs.reduce_op = UINT32_MAX;
        f->rs.sc.b_dtype = f->rs.sc.out_dtype = f->rs.sc.a_mode = f->rs.sc.b_mode = UINT32_MAX;
    }
}

static bool fields_differ(const ovld_op_fields_t *a, const ovld_op_fields_t *b, char *what,
                          size_t whatlen, uint64_t *ret_a, uint64_t *ret_b)
{
    const ovld_field_pair_t f[] = {
        {"m", a->rs.m, b->rs.m},
        {"n", a->rs.n, b->rs.n},
        {"k", a->rs.k, b->rs.k},
        {"dtype", a->rs.dtype, b->rs.dtype},
        {"transb", a->rs.transb, b->rs.transb},
        {"reduce_op", a->rs.reduce_op, b->rs.reduce_op},
        {"algo", a->rs.algo, b->rs.algo},
        {"chunks", a->rs.chunks, b->rs.chunks},
        {"streams", a->rs.streams, b->rs.streams},
    };
    ovld_field_pair_t sc[OVLD_SCALING_PAIRS];
    ovld_scaling_pairs(&a->rs.sc, a->rs.has_bias, &b->rs.sc, b->rs.has_bias, sc);
    return ovld_fields_first_differ(f, sizeof(f) / sizeof(f[0]), what, whatlen, ret_a, ret_b) ||
           ovld_fields_first_differ(sc, OVLD_SCALING_PAIRS, what, whatlen, ret_a, ret_b);
}

static int plan_buf(int which)
{
    switch (which) {
    case OVLD_BUF_A:
        return OVL_BUF_A;
    case OVLD_BUF_B:
        return OVL_BUF_B;
    case OVLD_BUF_C:
        return OVL_BUF_C;
    default:
        return ovld_scaling_plan_buf(which);
    }
}

static void plan_params(const ovld_op_fields_t *f, uint32_t world, ovl_plan_params_t *pp)
{
    *pp = (ovl_plan_params_t){
        .kind = OVL_OP_GEMM_RS,
        .reduce_op = (ovl_reduce_op_t)f->rs.reduce_op,
        .algo = (ovl_algo_t)f->rs.algo,
        .world = world,
        .m = f->rs.m,
        .n = f->rs.n,
        .k = f->rs.k,
        .dtype = (ovl_dtype_t)f->rs.dtype,
        .chunks = f->rs.chunks,
        .streams = f->rs.streams,
        .transb = f->rs.transb,
    };
    ovld_scaling_plan(&f->rs.sc, f->rs.has_bias, &pp->sc);
}

/* An output whose leading dimension is not n: the plans say so (the CUDA
 * backend's reduce-scatter writes dense rows, then copies). */
static bool strided(const ovld_op_fields_t *f, const ovld_buf_use_t use[OVLD_BUF_COUNT])
{
    return use[OVLD_BUF_C].hold && use[OVLD_BUF_C].view.ld != f->rs.n;
}

/* On every rank: its GEMM, 2 m n k flop, and the partials its
 * reduce-scatter reduces, m n elements. Doubles: no overflow in between. */
static ovld_op_count_t count(const ovld_op_fields_t *f, uint32_t world)
{
    double mn = (double)f->rs.m * (double)f->rs.n;
    ovl_dtype_t pdt = (ovl_dtype_t)(f->rs.sc.scaled ? f->rs.sc.out_dtype : f->rs.dtype);
    return (ovld_op_count_t){.flop = 2.0 * mn * (double)f->rs.k * world,
                             .bytes = mn * (double)ovl_dtype_size(pdt) * world,
                             .dtype = f->rs.dtype};
}

static void describe(const ovld_op_fields_t *f, char *out, size_t len)
{
    snprintf(out, len, "m=%" PRIu64 " n=%" PRIu64 " k=%" PRIu64 " %s%s%s", f->rs.m, f->rs.n,
             f->rs.k, f->rs.reduce_op == OVL_REDUCE_AVG ? "avg" : "sum",
             f->rs.transb ? " transb" : "", f->rs.sc.scaled ? " scaled" : "");
}

const ovld_kind_t ovld_kind_gemm_rs = {
    .id = OVLD_KIND_GEMM_RS,
    .buf_name = buf_name,
    .buf_shapes = buf_shapes,
    .fields = fields,
    .fields_differ = fields_differ,
    .plan_buf = plan_buf,
    .plan_params = plan_params,
    .strided = strided,
    .count = count,
    .describe = describe,
    .across = true, /* naive and collective: NCCL's reduce-scatter spans the nodes */
};

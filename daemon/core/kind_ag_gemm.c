/*
 * kind_ag_gemm.c: the all-gather + GEMM op kind, C = allgather(A) @ B
 * (kind.h). Rank r gives its shard A (m x k) and B (k x n; n x k with
 * transb) and gets C ((world*m) x n); with several Bs, each B i with its
 * own n multiplies the same gathered A into its own C i; the gathered A
 * itself (a_out, (world*m) x k) when the client wants it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kind.h"

static const char *buf_name(int which)
{
    static const char *const names[] = {
        "a",        "b",        "c",        "a_out",    "b1",       "b2",       "b3",
        "b4",       "b5",       "b6",       "b7",       "c1",       "c2",       "c3",
        "c4",       "c5",       "c6",       "c7",       "a_scale",  "b_scale",  "bias",
        "b_scale1", "b_scale2", "b_scale3", "b_scale4", "b_scale5", "b_scale6", "b_scale7",
        "bias1",    "bias2",    "bias3",    "bias4",    "bias5",    "bias6",    "bias7"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == OVLD_BUF_COUNT, "a name for every buffer");
    return which >= 0 && which < OVLD_BUF_COUNT ? names[which] : NULL;
}

static ovl_status_t buf_shapes(const ovld_op_desc_t *op, uint32_t world,
                               ovld_buf_shape_t shape[OVLD_BUF_COUNT], char *msg, size_t len)
{
    const ovld_ag_gemm_desc_t *q = &op->ag;
    for (int b = 0; b < OVLD_BUF_COUNT; b++)
        shape[b] = (ovld_buf_shape_t){0};
    uint64_t rows_all;
    if (__builtin_mul_overflow(q->m, (uint64_t)world, &rows_all)) {
        snprintf(msg, len, "m * world overflows");
        return OVL_ERR_RANGE;
    }
    /* A's, a_out's; B's and C's (scaled: b_dtype and out_dtype) */
    size_t elem = ovl_dtype_size((ovl_dtype_t)q->dtype);
    size_t belem = q->sc.scaled ? ovl_dtype_size((ovl_dtype_t)q->sc.b_dtype) : elem;
    size_t celem = q->sc.scaled ? ovl_dtype_size((ovl_dtype_t)q->sc.out_dtype) : elem;
    shape[OVLD_BUF_A] =
        (ovld_buf_shape_t){.rows = q->m, .cols = q->k, .elem = elem, .required = true};
    uint64_t ns[OVLD_MAX_BS] = {q->n};
    for (uint32_t i = 1; i < q->nb && i < OVLD_MAX_BS; i++)
        ns[i] = q->n_more[i - 1];
    ovl_status_t st =
        ovld_scaling_shapes(&q->sc, q->m, q->k, q->m, q->nb ? q->nb : 1, ns, shape, msg, len);
    if (st != OVL_OK)
        return st;
    /* optional: ovld gathers into its scratch */
    shape[OVLD_BUF_AOUT] =
        (ovld_buf_shape_t){.rows = rows_all, .cols = q->k, .elem = elem, .optional = true};
    uint32_t nb = q->nb ? q->nb : 1; /* 1..OVLD_MAX_BS: request.c checked */
    for (uint32_t i = 0; i < nb && i < OVLD_MAX_BS; i++) {
        uint64_t n = i == 0 ? q->n : q->n_more[i - 1];
        shape[ovld_buf_b(i)] = (ovld_buf_shape_t){.rows = q->transb ? n : q->k,
                                                  .cols = q->transb ? q->k : n,
                                                  .elem = belem,
                                                  .required = true};
        shape[ovld_buf_c(i)] =
            (ovld_buf_shape_t){.rows = rows_all, .cols = n, .elem = celem, .required = true};
    }
    return OVL_OK;
}

static void fields(const ovld_op_desc_t *op, bool valid, ovld_op_fields_t *f)
{
    const ovld_ag_gemm_desc_t *q = &op->ag;
    *f = (ovld_op_fields_t){.kind = OVLD_KIND_AG_GEMM,
                            .ag = {.m = q->m,
                                   .n = q->n,
                                   .k = q->k,
                                   .dtype = valid ? q->dtype : UINT32_MAX,
                                   .algo = valid ? q->algo : UINT32_MAX,
                                   .chunks = q->chunks,
                                   .streams = q->streams,
                                   .transb = q->transb,
                                   .has_aout = op->buf[OVLD_BUF_AOUT].given,
                                   /* a scaled op's (else the slot is not read) */
                                   .has_bias = q->sc.scaled && op->buf[OVLD_BUF_BIAS].given,
                                   .sc = q->sc,
                                   .nb = q->nb ? q->nb : 1}};
    if (!valid)
        f->ag.sc.b_dtype = f->ag.sc.out_dtype = f->ag.sc.a_mode = f->ag.sc.b_mode = UINT32_MAX;
    memcpy(f->ag.n_more, q->n_more, sizeof(f->ag.n_more));
}

static bool fields_differ(const ovld_op_fields_t *a, const ovld_op_fields_t *b, char *what,
                          size_t whatlen, uint64_t *ret_a, uint64_t *ret_b)
{
    const ovld_field_pair_t f[] = {
        {"m", a->ag.m, b->ag.m},
        {"n", a->ag.n, b->ag.n},
        {"k", a->ag.k, b->ag.k},
        {"dtype", a->ag.dtype, b->ag.dtype},
        {"transb", a->ag.transb, b->ag.transb},
        {"algo", a->ag.algo, b->ag.algo},
        {"chunks", a->ag.chunks, b->ag.chunks},
        {"streams", a->ag.streams, b->ag.streams},
        {"a_out (given or not)", a->ag.has_aout, b->ag.has_aout},
        {"nb", a->ag.nb, b->ag.nb},
    };
    ovld_field_pair_t sc[OVLD_SCALING_PAIRS];
    ovld_scaling_pairs(&a->ag.sc, a->ag.has_bias, &b->ag.sc, b->ag.has_bias, sc);
    if (ovld_fields_first_differ(f, sizeof(f) / sizeof(f[0]), what, whatlen, ret_a, ret_b) ||
        ovld_fields_first_differ(sc, OVLD_SCALING_PAIRS, what, whatlen, ret_a, ret_b))
        return true;
    for (uint32_t i = 1; i < a->ag.nb && i < OVLD_MAX_BS; i++)
        if (a->ag.n_more[i - 1] != b->ag.n_more[i - 1]) {
            snprintf(what, whatlen, "n of B %u", i);
            *ret_a = a->ag.n_more[i - 1];
            *ret_b = b->ag.n_more[i - 1];
            return true;
        }
    return false;
}

static int plan_buf(int which)
{
    if (which == OVLD_BUF_A)
        return OVL_BUF_A;
    if (which == OVLD_BUF_AOUT)
        return OVL_BUF_G;
    for (uint32_t i = 0; i < OVLD_MAX_BS; i++) {
        if (which == ovld_buf_b(i))
            return ovl_buf_b(i);
        if (which == ovld_buf_c(i))
            return ovl_buf_c(i);
    }
    return ovld_scaling_plan_buf(which);
}

static void plan_params(const ovld_op_fields_t *f, uint32_t world, ovl_plan_params_t *pp)
{
    *pp = (ovl_plan_params_t){
        .kind = OVL_OP_AG_GEMM,
        .algo = (ovl_algo_t)f->ag.algo,
        .world = world,
        .m = f->ag.m,
        .n = f->ag.n,
        .k = f->ag.k,
        .dtype = (ovl_dtype_t)f->ag.dtype,
        .chunks = f->ag.chunks,
        .streams = f->ag.streams,
        .want_gathered = f->ag.has_aout,
        .transb = f->ag.transb,
        .nb = f->ag.nb,
    };
    _Static_assert(OVLD_MAX_BS == OVL_PLAN_MAX_BS, "the op's Bs are the plan's");
    memcpy(pp->n_more, f->ag.n_more, sizeof(pp->n_more));
    ovld_scaling_plan(&f->ag.sc, f->ag.has_bias, &pp->sc);
}

/* NCCL moves a rank's rows only as one dense piece: an A or a_out whose
 * leading dimension is not k makes the plans gather by the copy engine. */
static bool strided(const ovld_op_fields_t *f, const ovld_buf_use_t use[OVLD_BUF_COUNT])
{
    return (use[OVLD_BUF_A].hold && use[OVLD_BUF_A].view.ld != f->ag.k) ||
           (use[OVLD_BUF_AOUT].hold && use[OVLD_BUF_AOUT].view.ld != f->ag.k);
}

/* On every rank: the GEMMs of every B over the gathered A, 2 (world*m) n
 * k flop each (n: the Bs' columns together), and the gathered A, (world*m)
 * k elements. Doubles: no overflow in between (the counters saturate). */
static ovld_op_count_t count(const ovld_op_fields_t *f, uint32_t world)
{
    double n = (double)f->ag.n;
    for (uint32_t i = 1; i < f->ag.nb && i < OVLD_MAX_BS; i++)
        n += (double)f->ag.n_more[i - 1];
    double rows = (double)world * (double)f->ag.m;
    return (ovld_op_count_t){.flop = 2.0 * rows * n * (double)f->ag.k * world,
                             .bytes = rows * (double)f->ag.k *
                                      (double)ovl_dtype_size((ovl_dtype_t)f->ag.dtype) * world,
                             .dtype = f->ag.dtype};
}

static void describe(const ovld_op_fields_t *f, char *out, size_t len)
{
    snprintf(out, len, "m=%" PRIu64 " n=%" PRIu64 " k=%" PRIu64 "%s%s%s", f->ag.m, f->ag.n, f->ag.k,
             f->ag.transb ? " transb" : "", f->ag.nb > 1 ? " several Bs" : "",
             f->ag.sc.scaled ? " scaled" : "");
}

const ovld_kind_t ovld_kind_ag_gemm = {
    .id = OVLD_KIND_AG_GEMM,
    .buf_name = buf_name,
    .buf_shapes = buf_shapes,
    .fields = fields,
    .fields_differ = fields_differ,
    .plan_buf = plan_buf,
    .plan_params = plan_params,
    .strided = strided,
    .count = count,
    .describe = describe,
    .across = true,
};

/*
 * kind.c: the table of op kinds (kind.h).
 */
#include <inttypes.h>
#include <stdio.h>

#include "kind.h"
#include "scaling.h"

const ovld_kind_t *ovld_kind(uint32_t id)
{
    static const ovld_kind_t *const kinds[] = {
        [OVLD_KIND_AG_GEMM] = &ovld_kind_ag_gemm,
        [OVLD_KIND_GEMM_RS] = &ovld_kind_gemm_rs,
    };
    return id < sizeof(kinds) / sizeof(kinds[0]) ? kinds[id] : NULL;
}

const ovld_kind_t *ovld_kind_shapes(const ovld_op_desc_t *q, uint32_t world,
                                    ovld_buf_shape_t shape[OVLD_BUF_COUNT], ovl_status_t *st,
                                    char *msg, size_t len)
{
    const ovld_kind_t *k = ovld_kind(q->kind);
    if (!k) {
        snprintf(msg, len, "unknown op kind %u", q->kind);
        *st = OVL_ERR_INVALID;
        return NULL;
    }
    *st = k->buf_shapes(q, world, shape, msg, len);
    return *st == OVL_OK ? k : NULL;
}

bool ovld_fields_first_differ(const ovld_field_pair_t *f, size_t n, char *what, size_t whatlen,
                              uint64_t *ret_a, uint64_t *ret_b)
{
    for (size_t i = 0; i < n; i++)
        if (f[i].a != f[i].b) {
            snprintf(what, whatlen, "%s", f[i].name);
            *ret_a = f[i].a;
            *ret_b = f[i].b;
            return true;
        }
    return false;
}

ovl_status_t ovld_scaling_shapes(const ovld_scaling_desc_t *sc, uint64_t m, uint64_t k,
                                 uint64_t block_rows, uint32_t nb, const uint64_t *ns,
                                 ovld_buf_shape_t shape[OVLD_BUF_COUNT], char *msg, size_t len)
{
    if (!sc->scaled)
        return OVL_OK;
    /* the modes are known (ovl_scaling_refusal ran first) */
    ovl_scale_mode_t am = (ovl_scale_mode_t)sc->a_mode, bm = (ovl_scale_mode_t)sc->b_mode;
    uint64_t r, c;
    if (ovl_scale_shape(am, 0, m, k, &r, &c) != OVL_OK) {
        snprintf(msg, len, "a_scale: mode %u is not one of A's", sc->a_mode);
        return OVL_ERR_INVALID;
    }
    shape[OVLD_BUF_A_SCALE] =
        (ovld_buf_shape_t){.rows = r, .cols = c, .elem = 4, .required = true, .dense = true};
    /* each B's scales and its bias */
    for (uint32_t i = 0; i < nb && i < OVLD_MAX_BS; i++) {
        const char *why = ovl_scaling_shape_refusal(am, bm, block_rows, ns[i]);
        if (why) {
            snprintf(msg, len, "%s (rows %" PRIu64 ", n %" PRIu64 ")", why, block_rows, ns[i]);
            return OVL_ERR_INVALID;
        }
        if (ovl_scale_shape(bm, 1, ns[i], k, &r, &c) != OVL_OK) {
            snprintf(msg, len, "b_scale: mode %u is not one of B's", sc->b_mode);
            return OVL_ERR_INVALID;
        }
        shape[ovld_buf_b_scale(i)] =
            (ovld_buf_shape_t){.rows = r, .cols = c, .elem = 4, .required = true, .dense = true};
        shape[ovld_buf_bias(i)] = (ovld_buf_shape_t){
            .rows = 1,
            .cols = ns[i],
            .elem = ovl_dtype_size((ovl_dtype_t)sc->out_dtype),
            .optional = true,
            .dense = true,
        };
    }
    return OVL_OK;
}

void ovld_scaling_pairs(const ovld_scaling_desc_t *a, bool a_bias, const ovld_scaling_desc_t *b,
                        bool b_bias, ovld_field_pair_t f[OVLD_SCALING_PAIRS])
{
    f[0] = (ovld_field_pair_t){"scaled", a->scaled, b->scaled};
    f[1] = (ovld_field_pair_t){"b_dtype", a->b_dtype, b->b_dtype};
    f[2] = (ovld_field_pair_t){"out_dtype", a->out_dtype, b->out_dtype};
    f[3] = (ovld_field_pair_t){"a_scale mode", a->a_mode, b->a_mode};
    f[4] = (ovld_field_pair_t){"b_scale mode", a->b_mode, b->b_mode};
    f[5] = (ovld_field_pair_t){"fast_accum", a->fast_accum, b->fast_accum};
    f[6] = (ovld_field_pair_t){"bias (given or not)", a_bias, b_bias};
}

void ovld_scaling_plan(const ovld_scaling_desc_t *sc, bool bias, ovl_plan_scaling_t *ret)
{
    if (!sc->scaled) {
        *ret = (ovl_plan_scaling_t){0};
        return;
    }
    *ret = (ovl_plan_scaling_t){.scaled = true,
                                .b_dtype = (ovl_dtype_t)sc->b_dtype,
                                .out_dtype = (ovl_dtype_t)sc->out_dtype,
                                .a_mode = (ovl_scale_mode_t)sc->a_mode,
                                .b_mode = (ovl_scale_mode_t)sc->b_mode,
                                .fast_accum = sc->fast_accum,
                                .bias = bias};
}

int ovld_scaling_plan_buf(int which)
{
    if (which == OVLD_BUF_A_SCALE)
        return OVL_BUF_SA;
    for (uint32_t i = 0; i < OVLD_MAX_BS; i++) {
        if (which == ovld_buf_b_scale(i))
            return ovl_buf_sb(i);
        if (which == ovld_buf_bias(i))
            return ovl_buf_bias(i);
    }
    return -1;
}

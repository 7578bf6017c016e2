/*
 * kind.c: the table of op kinds (kind.h).
 */
#include <stdio.h>

#include "kind.h"

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

/*
 * desc.c: what desc.h says of an op beyond its fields, whatever its kind:
 * its buffers' names, where two ranks' ops differ and the plan parameters
 * of a Plan request's op (each from the kind's entry, kind.h), and the
 * configuration's defaults of plan parameters. The server, the op queue
 * and the cluster (matching ranks on one node, and nodes at the
 * coordinator) call these.
 */
#include <stdio.h>

#include "desc.h"
#include "kind.h"

const char *ovld_buf_name(uint32_t kind, int which)
{
    const ovld_kind_t *k = ovld_kind(kind);
    const char *name = k ? k->buf_name(which) : NULL;
    return name ? name : "?";
}

bool ovld_op_fields_differ(const ovld_op_fields_t *a, const ovld_op_fields_t *b, char *what,
                           size_t whatlen, uint64_t *ret_a, uint64_t *ret_b)
{
    const ovld_kind_t *k = ovld_kind(a->kind);
    if (a->kind != b->kind || !k) {
        snprintf(what, whatlen, "kind");
        *ret_a = a->kind;
        *ret_b = b->kind;
        return a->kind != b->kind;
    }
    return k->fields_differ(a, b, what, whatlen, ret_a, ret_b);
}

void ovld_plan_resolve(const ovld_config_t *cfg, bool have_collective, ovl_plan_params_t *p)
{
    /* How A is gathered: the operator's preference; a backend without a
     * collective gathers by pulls. */
    if (p->allgather == OVL_AG_AUTO)
        p->allgather = cfg->allgather;
    if (!have_collective)
        p->allgather = OVL_AG_COPY;
    if (!p->chunks)
        p->chunks = cfg->default_chunks;
    if (!p->streams)
        p->streams = cfg->default_streams;
    /* the operator's default where it can run this op (ring is all-gather
     * + GEMM's, push GEMM + reduce-scatter's and of one node only; naive
     * and collective GEMM + reduce-scatter need a GPU per rank) */
    if (p->algo == OVL_ALGO_AUTO && ovl_plan_takes_default(p, cfg->default_algo)) {
        p->algo = cfg->default_algo;
        p->chosen = OVL_CHOSEN_DEFAULT;
    }
    if (p->algo == OVL_ALGO_AUTO) {
        p->algo = ovl_plan_choose(p);
        p->chosen = OVL_CHOSEN_RULE;
    }
}

ovl_status_t ovld_op_plan_params(const ovld_config_t *cfg, bool have_collective,
                                 const ovld_op_desc_t *q, uint32_t world, uint32_t rank,
                                 ovl_plan_params_t *pp, char *msg, size_t len)
{
    ovld_buf_shape_t shape[OVLD_BUF_COUNT];
    ovl_status_t st;
    const ovld_kind_t *k = ovld_kind_shapes(q, world, shape, &st, msg, len);
    if (!k)
        return st;
    /* a plan is of the buffers an op may leave out: the others it must
     * give, or cannot */
    for (int i = 0; i < OVLD_BUF_COUNT; i++)
        if (q->buf[i].given && !shape[i].optional) {
            snprintf(msg, len, "buffer slot %d (%s) is not one an op of kind %s may leave out", i,
                     ovld_buf_name(q->kind, i), ovl_op_kind_name((ovl_op_kind_t)q->kind));
            return OVL_ERR_INVALID;
        }
    ovld_op_fields_t f;
    k->fields(q, true, &f);
    k->plan_params(&f, world, pp);
    pp->rank = rank;
    ovld_plan_resolve(cfg, have_collective, pp);
    return OVL_OK;
}

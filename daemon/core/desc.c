/*
 * desc.c: what desc.h says of an op beyond its fields, whatever its kind:
 * its buffers' names and where two ranks' ops differ (each from the kind's
 * entry, kind.h), and the configuration's defaults of plan parameters.
 * The server, the op queue and the cluster (matching ranks on one node,
 * and nodes at the coordinator) call these.
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
    if (p->algo == OVL_ALGO_AUTO)
        p->algo = cfg->default_algo;
    if (p->algo == OVL_ALGO_AUTO)
        p->algo = ovl_plan_choose(p);
}

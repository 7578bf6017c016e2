/*
 * desc.c: what desc.h says of an op beyond its fields: its buffers' names,
 * where two ranks' ops differ, and the plan parameters it becomes. The one
 * place each is done: the server, the op queue and the cluster (matching
 * ranks on one node, and nodes at the coordinator) call these.
 */
#include <stdio.h>

#include "desc.h"

const char *ovld_buf_name(int which)
{
    static const char *const names[] = {"a",  "b",  "c",  "a_out", "b1", "b2", "b3", "b4", "b5",
                                        "b6", "b7", "c1", "c2",    "c3", "c4", "c5", "c6", "c7"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == OVLD_BUF_COUNT, "a name for every buffer");
    return which >= 0 && which < OVLD_BUF_COUNT ? names[which] : "?";
}

bool ovld_op_fields_differ(const ovld_op_fields_t *a, const ovld_op_fields_t *b, char *what,
                           size_t whatlen, uint64_t *ret_a, uint64_t *ret_b)
{
    const struct {
        const char *name;
        uint64_t a, b;
    } f[] = {
        {"m", a->m, b->m},
        {"n", a->n, b->n},
        {"k", a->k, b->k},
        {"dtype", a->dtype, b->dtype},
        {"transb", a->transb, b->transb},
        {"algo", a->algo, b->algo},
        {"chunks", a->chunks, b->chunks},
        {"streams", a->streams, b->streams},
        {"a_out (given or not)", a->has_aout, b->has_aout},
        {"nb", a->nb, b->nb},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].a != f[i].b) {
            snprintf(what, whatlen, "%s", f[i].name);
            *ret_a = f[i].a;
            *ret_b = f[i].b;
            return true;
        }
    for (uint32_t i = 1; i < a->nb && i < OVLD_MAX_BS; i++)
        if (a->n_more[i - 1] != b->n_more[i - 1]) {
            snprintf(what, whatlen, "n of B %u", i);
            *ret_a = a->n_more[i - 1];
            *ret_b = b->n_more[i - 1];
            return true;
        }
    return false;
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

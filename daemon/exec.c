/*
 * exec.c: see exec.h.
 */
#include "exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Issues one instruction of rank r (not an ALLGATHER). */
static ovl_status_t issue(ovld_backend_t *b, const ovld_exec_op_t *op, uint32_t r,
                          const ovl_instr_t *in)
{
    const ovld_backend_ops_t *ops = b->ops;
    const ovld_exec_rank_t *x = &op->ranks[r];
    size_t elem = ovl_dtype_size(op->dtype);
    switch (in->kind) {
    case OVL_I_WAIT_READY:
        return ops->wait_ready(x->rank, in->stream, op->seq);
    case OVL_I_RECORD:
        return ops->record(x->rank, in->stream, in->event);
    case OVL_I_WAIT:
        return ops->wait(x->rank, in->stream, op->ranks[in->peer].rank, in->event);
    case OVL_I_PULL:
        return ops->copy(
            x->rank, in->stream, ovld_view_rows(x->g, in->peer * op->m + in->row0, elem),
            ovld_view_rows(op->ranks[in->peer].a, in->row0, elem), in->rows, op->k, elem);
    case OVL_I_GEMM: {
        ovld_gemm_args_t g = {.dtype = op->dtype,
                              .rows = in->rows,
                              .n = op->n,
                              .k = op->k,
                              .nblocks = in->nblocks,
                              .block_stride = op->m,
                              .b = x->b,
                              .transb = op->transb};
        uint64_t crow = (uint64_t)in->block0 * op->m + in->row0;
        g.c = ovld_view_rows(x->c, crow, elem);
        if (in->src == OVL_SRC_LOCAL)
            g.a = ovld_view_rows(x->a, in->row0, elem);
        else
            g.a = ovld_view_rows(x->g, crow, elem);
        /* Whole consecutive blocks are one taller GEMM. */
        if (in->row0 == 0 && in->rows == op->m && in->nblocks > 1) {
            g.rows = op->m * in->nblocks;
            g.nblocks = 1;
        }
        return ops->gemm(x->rank, in->stream, &g);
    }
    case OVL_I_SLEEP:
        return ops->sleep(x->rank, in->stream, in->sleep_ns);
    case OVL_I_DONE:
        ops->done(x->rank, in->stream, op->seq, OVL_OK, NULL, x->cookie);
        return OVL_OK;
    case OVL_I_ALLGATHER:
        break;
    }
    return OVL_ERR_INTERNAL;
}

/* Failure half-way: join what each rank issued into stream 0 (events past
 * the plan's own) and ring done with the error on ranks not yet done. */
static void fail_rest(ovld_backend_t *b, const ovld_exec_op_t *op, const size_t *pc,
                      ovl_status_t status, const char *msg)
{
    const ovld_backend_ops_t *ops = b->ops;
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (pc[r] == p->ninstr)
            continue; /* its DONE was issued */
        for (uint32_t s = 1; s < p->nstreams; s++) {
            if (ops->record(op->ranks[r].rank, s, p->nevents + s) == OVL_OK)
                (void)ops->wait(op->ranks[r].rank, 0, op->ranks[r].rank, p->nevents + s);
        }
        ops->done(op->ranks[r].rank, 0, op->seq, status, msg, op->ranks[r].cookie);
    }
}

ovl_status_t ovld_exec_run(ovld_backend_t *b, const ovld_exec_op_t *op, char *err, size_t errlen)
{
    uint32_t w = op->world;
    ovl_status_t st = OVL_OK;
    uint32_t maxev = 0;
    for (uint32_t r = 0; r < w; r++)
        if (op->ranks[r].plan->nevents > maxev)
            maxev = op->ranks[r].plan->nevents;
    size_t *pc = calloc(w, sizeof(*pc));
    bool *recorded = calloc((size_t)w * (maxev ? maxev : 1), sizeof(*recorded));
    ovld_allgather_part_t *parts = calloc(w, sizeof(*parts));
    if (!pc || !recorded || !parts) {
        st = OVL_ERR_NOMEM;
        snprintf(err, errlen, "executor: out of memory");
        goto fail;
    }

    for (;;) {
        bool progress = false, finished = true;
        uint32_t at_gather = 0;
        for (uint32_t r = 0; r < w; r++) {
            const ovl_plan_t *p = op->ranks[r].plan;
            while (pc[r] < p->ninstr) {
                const ovl_instr_t *in = &p->instr[pc[r]];
                if (in->kind == OVL_I_ALLGATHER) {
                    at_gather++;
                    break;
                }
                if ((in->kind == OVL_I_WAIT || in->kind == OVL_I_RECORD) &&
                    (in->event >= maxev || (in->kind == OVL_I_WAIT && in->peer >= w))) {
                    st = OVL_ERR_INTERNAL;
                    snprintf(err, errlen, "rank %u, instruction %zu: event or peer out of range", r,
                             pc[r]);
                    goto fail;
                }
                if (in->kind == OVL_I_WAIT && in->peer != r &&
                    !recorded[(size_t)in->peer * maxev + in->event])
                    break;
                st = issue(b, op, r, in);
                if (st != OVL_OK) {
                    const char *why = b->ops->last_error ? b->ops->last_error(b) : NULL;
                    snprintf(err, errlen, "rank %u, instruction %zu (%s): %s", r, pc[r],
                             ovl_instr_name(in->kind), why && why[0] ? why : ovl_strerror(st));
                    goto fail;
                }
                if (in->kind == OVL_I_RECORD)
                    recorded[(size_t)r * maxev + in->event] = true;
                pc[r]++;
                progress = true;
            }
            if (pc[r] < p->ninstr)
                finished = false;
        }
        if (finished)
            break;
        if (at_gather == w) {
            const ovl_instr_t *first = &op->ranks[0].plan->instr[pc[0]];
            for (uint32_t r = 0; r < w; r++) {
                const ovl_instr_t *in = &op->ranks[r].plan->instr[pc[r]];
                if (in->row0 != first->row0 || in->rows != first->rows) {
                    st = OVL_ERR_INTERNAL;
                    snprintf(err, errlen, "plans disagree on all-gather %zu of rank %u", pc[r], r);
                    goto fail;
                }
                parts[r] = (ovld_allgather_part_t){.rank = op->ranks[r].rank,
                                                   .stream = in->stream,
                                                   .src = op->ranks[r].a,
                                                   .g = op->ranks[r].g};
            }
            st = b->ops->allgather(b, parts, w, op->dtype, op->m, op->k, first->row0, first->rows);
            if (st != OVL_OK) {
                const char *why = b->ops->last_error ? b->ops->last_error(b) : NULL;
                snprintf(err, errlen, "all-gather rows %llu+%llu: %s",
                         (unsigned long long)first->row0, (unsigned long long)first->rows,
                         why && why[0] ? why : ovl_strerror(st));
                goto fail;
            }
            for (uint32_t r = 0; r < w; r++)
                pc[r]++;
            progress = true;
        }
        if (!progress) {
            st = OVL_ERR_INTERNAL;
            snprintf(err, errlen, "plans cannot be issued in any order (deadlock)");
            goto fail;
        }
    }
    free(pc);
    free(recorded);
    free(parts);
    return OVL_OK;

fail:
    if (pc)
        fail_rest(b, op, pc, st, err);
    else
        for (uint32_t r = 0; r < w; r++)
            b->ops->done(op->ranks[r].rank, 0, op->seq, st, err, op->ranks[r].cookie);
    free(pc);
    free(recorded);
    free(parts);
    return st;
}

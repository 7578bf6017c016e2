/*
 * exec.c: see exec.h.
 */
#include "exec.h"
#include "threads.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* An op whose threads have not issued it after this long is reported (the
 * pool's reporter: no request waits for the words, the op goes on), with
 * the stacks of the threads still at it (SIGUSR2, daemon/util/stall.c). */
#define EXEC_SLOW_MS 3000

/* The view of `ref` (a row of a named buffer of some rank) for rank r's
 * instruction; OVL_ERR_INTERNAL, with words in why, for a name the op does
 * not have. own: the buffer must be rank r's own (every write is). */
static ovl_status_t resolve(const ovld_exec_op_t *op, uint32_t r, ovl_ref_t ref, bool own,
                            ovld_view_t *ret, char *why, size_t whylen)
{
    const char *name = ovl_buf_name(ref.buf);
    if (!name || ref.rank >= op->world || (own && ref.rank != r)) {
        snprintf(why, whylen, "names buffer %d of rank %u, which it may not", (int)ref.buf,
                 ref.rank);
        return OVL_ERR_INTERNAL;
    }
    if (!op->ranks[ref.rank].plan) {
        snprintf(why, whylen, "names buffer %s of rank %u, which another daemon serves", name,
                 ref.rank);
        return OVL_ERR_INTERNAL;
    }
    ovld_view_t v = op->ranks[ref.rank].buf[ref.buf];
    if (!v.ptr) {
        snprintf(why, whylen, "names buffer %s of rank %u, which the op does not have", name,
                 ref.rank);
        return OVL_ERR_INTERNAL;
    }
    /* the buffer's elements are of its plan's dtype for it */
    *ret =
        ovld_view_rows(v, ref.row, ovl_dtype_size(op->ranks[ref.rank].plan->bufs[ref.buf].dtype));
    return OVL_OK;
}

/* Rank r's buffer buf from its first row: what an instruction reads whole. */
static ovl_ref_t whole(uint32_t r, ovl_buf_t buf)
{
    return (ovl_ref_t){.buf = buf, .rank = r, .row = 0};
}

/* The dtype of the own buffer buf in rank r's plan. */
static ovl_dtype_t buf_dtype(const ovld_exec_op_t *op, uint32_t r, ovl_buf_t buf)
{
    return op->ranks[r].plan->bufs[buf].dtype;
}

/* Issues one instruction of rank r (not a collective call: is_coll). A failure of the
 * executor's own (a name it cannot resolve) leaves words in why; a
 * backend's leaves why empty (its last_error has them). */
static ovl_status_t issue(ovld_backend_t *b, const ovld_exec_op_t *op, uint32_t r,
                          const ovl_instr_t *in, char *why, size_t whylen)
{
    const ovld_backend_ops_t *ops = b->ops;
    const ovld_exec_rank_t *x = &op->ranks[r];
    const ovl_plan_params_t *pp = &x->plan->params;
    ovl_status_t st;
    why[0] = '\0';
    switch (in->kind) {
    case OVL_I_WAIT_READY:
        st = ops->wait_ready(x->rank, in->stream, op->seq);
        /* a timer that cannot start costs the measurement, not the op: its
         * done then reports no time */
        if (st == OVL_OK && op->timed && ops->time_start)
            (void)ops->time_start(x->rank, in->stream, op->seq);
        return st;
    case OVL_I_RECORD:
        return ops->record(x->rank, in->stream, in->event);
    case OVL_I_WAIT:
        return ops->wait(x->rank, in->stream, op->ranks[in->peer].rank, in->event);
    case OVL_I_PULL:
    case OVL_I_PUSH: {
        /* the peer's side: a PULL's source, a PUSH's destination */
        bool push = in->kind == OVL_I_PUSH;
        ovld_view_t dst, src;
        if ((st = resolve(op, r, in->dst, !push, &dst, why, whylen)) != OVL_OK ||
            (st = resolve(op, r, in->src, push, &src, why, whylen)) != OVL_OK)
            return st;
        return ops->copy(x->rank, in->stream, dst, src, in->rows, in->cols,
                         ovl_dtype_size(buf_dtype(op, r, in->src.buf)));
    }
    case OVL_I_GEMM: {
        ovld_gemm_args_t g = {.dtype = pp->dtype,
                              .rows = in->rows,
                              .n = in->n,
                              .k = in->k,
                              .nblocks = in->nblocks,
                              .block_stride = in->stride,
                              .transb = in->transb};
        if ((st = resolve(op, r, in->src, true, &g.a, why, whylen)) != OVL_OK ||
            (st = resolve(op, r, in->b, true, &g.b, why, whylen)) != OVL_OK ||
            (st = resolve(op, r, in->dst, true, &g.c, why, whylen)) != OVL_OK ||
            (in->accumulate && (st = resolve(op, r, in->acc, true, &g.acc, why, whylen)) != OVL_OK))
            return st;
        g.div = in->avg ? op->world : 1;
        if (pp->sc.scaled) {
            /* B i's scales and bias, i the B the GEMM multiplies by */
            uint32_t i = ovl_gemm_b(in);
            ovld_view_t sa, sb, bias = {0};
            if ((st = resolve(op, r, in->sa, true, &sa, why, whylen)) != OVL_OK ||
                (st = resolve(op, r, whole(r, ovl_buf_sb(i)), true, &sb, why, whylen)) != OVL_OK ||
                (pp->sc.bias && (st = resolve(op, r, whole(r, ovl_buf_bias(i)), true, &bias, why,
                                              whylen)) != OVL_OK))
                return st;
            g.scaled = true;
            g.b_dtype = pp->sc.b_dtype;
            g.c_dtype = pp->sc.out_dtype;
            g.a_mode = pp->sc.a_mode;
            g.b_mode = pp->sc.b_mode;
            g.a_scale = sa.ptr;
            g.b_scale = sb.ptr;
            g.bias = bias.ptr;
            g.fast_accum = pp->sc.fast_accum;
        }
        return ops->gemm(x->rank, in->stream, &g);
    }
    case OVL_I_SLEEP:
        return ops->sleep(x->rank, in->stream, in->sleep_ns);
    case OVL_I_REDUCE: {
        ovld_view_t dst, src;
        if ((st = resolve(op, r, in->dst, true, &dst, why, whylen)) != OVL_OK ||
            (st = resolve(op, r, in->src, true, &src, why, whylen)) != OVL_OK)
            return st;
        if (!ops->reduce) {
            snprintf(why, whylen, "the %s backend has no reduction", ops->name);
            return OVL_ERR_UNSUPPORTED;
        }
        return ops->reduce(x->rank, in->stream, dst, src, in->rows, in->cols, in->nblocks,
                           in->stride, buf_dtype(op, r, in->dst.buf), in->avg ? op->world : 1);
    }
    case OVL_I_DONE:
        ops->done(x->rank, in->stream, op->seq, OVL_OK, NULL, x->cookie);
        return OVL_OK;
    case OVL_I_ALLGATHER:
    case OVL_I_RAIL:
    case OVL_I_REDUCE_SCATTER:
        break;
    }
    snprintf(why, whylen, "not an instruction this call issues");
    return OVL_ERR_INTERNAL;
}

/* The words for a failed issue: the executor's own, else the backend's
 * (kept per thread: asked on the thread that made the call), else the
 * status's. */
static const char *why_failed(ovld_backend_t *b, const char *own, ovl_status_t st)
{
    const char *why = own[0] ? own : b->ops->last_error ? b->ops->last_error(b) : NULL;
    return why && why[0] ? why : ovl_strerror(st);
}

/* Whether in is the collective transfer first is, of the given kind:
 * every rank issues the same one (method, rows, layout). */
static bool same_transfer(const ovl_instr_t *in, const ovl_instr_t *first, ovl_instr_kind_t kind)
{
    return in->kind == kind && in->method == first->method && in->avg == first->avg &&
           in->rows == first->rows && in->cols == first->cols && in->stride == first->stride &&
           in->src.buf == first->src.buf && in->src.row == first->src.row &&
           in->dst.buf == first->dst.buf && in->dst.row == first->dst.row;
}

/* The first rank of the op this daemon serves (ovld_exec_run checked that
 * there is one). */
static uint32_t first_local(const ovld_exec_op_t *op)
{
    uint32_t r = 0;
    while (r < op->world && !op->ranks[r].plan)
        r++;
    return r;
}

/* Rank r's part of a collective transfer (instruction pc): the views of
 * its src and dst. */
static ovl_status_t resolve_ends(const ovld_exec_op_t *op, uint32_t r, size_t pc,
                                 const ovl_instr_t *in, ovld_view_t *src, ovld_view_t *dst,
                                 char *err, size_t errlen)
{
    char why[160];
    ovl_status_t st = resolve(op, r, in->src, true, src, why, sizeof(why));
    if (st == OVL_OK)
        st = resolve(op, r, in->dst, true, dst, why, sizeof(why));
    if (st != OVL_OK)
        snprintf(err, errlen, "rank %u, instruction %zu (%s): %s", r, pc, ovl_instr_name(in->kind),
                 why);
    return st;
}

/* Whether in is a collective call: one backend call for every local
 * rank's part, issued once every local rank stands at it. */
static bool is_coll(ovl_instr_kind_t kind)
{
    return kind == OVL_I_ALLGATHER || kind == OVL_I_RAIL || kind == OVL_I_REDUCE_SCATTER;
}

/* A collective call's name in words. */
static const char *coll_what(ovl_instr_kind_t kind)
{
    return kind == OVL_I_RAIL             ? "rail"
           : kind == OVL_I_REDUCE_SCATTER ? "reduce-scatter"
                                          : "all-gather";
}

/* A collective call that every local rank stands at, as walk_parts found
 * it: the first local rank's instruction, whose rows and method every part
 * shares, and the parts' count. */
typedef struct coll_call {
    const ovl_instr_t *first;
    const char *method; /* first's method's name, for words */
    ovl_dtype_t dtype;
    uint32_t n;
} coll_call_t;

/* Walks the local ranks' parts of the collective call of `kind` every rank
 * stands at (pc): a RAIL's into rail, an ALLGATHER's or a
 * REDUCE_SCATTER's into ag (the same form: a rank's src rows and its dst),
 * one per rank this daemon serves. OVL_ERR_INTERNAL, with words in err,
 * where plans disagree on its rows or name what the op does not have (a
 * buffer, and for a rail a rank past the world or a list past the plan's). */
static ovl_status_t walk_parts(const ovld_exec_op_t *op, const size_t *pc, ovl_instr_kind_t kind,
                               ovld_allgather_part_t *ag, ovld_rail_part_t *rail, coll_call_t *ret,
                               char *err, size_t errlen)
{
    bool is_rail = kind == OVL_I_RAIL;
    uint32_t r0 = first_local(op), n = 0;
    const ovl_instr_t *first = &op->ranks[r0].plan->instr[pc[r0]];
    /* what moves is of the source buffer's dtype (A, SA, P) */
    ovl_dtype_t dtype = buf_dtype(op, r0, first->src.buf);
    for (uint32_t r = r0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p)
            continue; /* another daemon's */
        const ovl_instr_t *in = &p->instr[pc[r]];
        if (!same_transfer(in, first, kind) || p->bufs[in->src.buf].dtype != dtype) {
            snprintf(err, errlen, "plans disagree on %s %zu of rank %u", coll_what(kind), pc[r], r);
            return OVL_ERR_INTERNAL;
        }
        ovld_view_t *src, *dst;
        if (is_rail) {
            /* the lists lie in the plan's, and name ranks of the job */
            uint64_t end = (uint64_t)in->peers + in->nsend + in->nrecv;
            bool ok = end <= p->npeers;
            for (uint64_t i = in->peers; ok && i < end; i++)
                ok = p->peers[i] < op->world;
            if (!ok) {
                snprintf(err, errlen, "rank %u, instruction %zu (RAIL): names ranks it may not", r,
                         pc[r]);
                return OVL_ERR_INTERNAL;
            }
            rail[n] = (ovld_rail_part_t){.rank = op->ranks[r].rank,
                                         .global = r,
                                         .stream = in->stream,
                                         .send = p->peers + in->peers,
                                         .nsend = in->nsend,
                                         .recv = p->peers + in->peers + in->nsend,
                                         .nrecv = in->nrecv};
            src = &rail[n].src;
            dst = &rail[n].dst;
        } else {
            ag[n] = (ovld_allgather_part_t){
                .rank = op->ranks[r].rank, .global = r, .stream = in->stream};
            src = &ag[n].src;
            dst = &ag[n].dst;
        }
        ovl_status_t st = resolve_ends(op, r, pc[r], in, src, dst, err, errlen);
        if (st != OVL_OK)
            return st;
        n++;
    }
    const char *method = kind == OVL_I_REDUCE_SCATTER ? (first->avg ? "avg" : "sum")
                                                      : ovl_ag_method_name(first->method);
    /* an unknown method: the backend refuses it */
    *ret = (coll_call_t){
        .first = first, .method = method ? method : "an unknown method", .dtype = dtype, .n = n};
    return OVL_OK;
}

/* Issues the collective call of `kind` every rank stands at (pc) as one
 * backend call: an ALLGATHER or a REDUCE_SCATTER with its parts in ag, or a
 * RAIL (one NCCL group for every rank's sends and receives) with its parts
 * in rail. OVL_ERR_INTERNAL, with words in err, where plans disagree or
 * name what the op does not have; OVL_ERR_UNSUPPORTED where the backend
 * has no such call. */
static ovl_status_t issue_coll(ovld_backend_t *b, const ovld_exec_op_t *op, const size_t *pc,
                               ovl_instr_kind_t kind, ovld_coll_tag_t tag,
                               ovld_allgather_part_t *ag, ovld_rail_part_t *rail, char *err,
                               size_t errlen)
{
    const ovld_backend_ops_t *ops = b->ops;
    const char *what = coll_what(kind);
    coll_call_t c;
    ovl_status_t st = walk_parts(op, pc, kind, ag, rail, &c, err, errlen);
    if (st != OVL_OK)
        return st;
    bool have = kind == OVL_I_RAIL             ? ops->rail != NULL
                : kind == OVL_I_REDUCE_SCATTER ? ops->reduce_scatter != NULL
                                               : ops->allgather != NULL;
    if (!have) {
        snprintf(err, errlen, "%s (%s): the %s backend %s", what, c.method, ops->name,
                 kind == OVL_I_RAIL             ? "cannot move rows between nodes"
                 : kind == OVL_I_REDUCE_SCATTER ? "has no reduce-scatter"
                                                : "has no collective");
        return OVL_ERR_UNSUPPORTED;
    }
    const ovl_instr_t *f = c.first;
    if (kind == OVL_I_RAIL)
        st = ops->rail(b, f->method, tag, rail, c.n, op->world, c.dtype, f->rows, f->cols,
                       f->stride);
    else if (kind == OVL_I_REDUCE_SCATTER)
        st = ops->reduce_scatter(b, tag, ag, c.n, op->world, c.dtype, f->rows, f->cols, f->stride,
                                 f->avg);
    else
        st = ops->allgather(b, f->method, tag, ag, c.n, op->world, c.dtype, f->rows, f->cols,
                            f->stride);
    if (st != OVL_OK)
        snprintf(err, errlen, "%s %s rows %llu+%llu: %s", what, c.method,
                 (unsigned long long)f->src.row, (unsigned long long)f->rows,
                 why_failed(b, "", st));
    return st;
}

/* Failure half-way: join what every local rank issued into the stream 0
 * of each rank not yet done (events past the plan's own) and ring done
 * with the error there. A rank's DONE waits for its peers' side streams
 * too, not only its own: a PUSH writes the rank's G from a peer's copy
 * stream, and those writes must end before the client is told the op did
 * (or the rank's G is used again or freed). */
static void failing(const ovld_exec_op_t *op, ovl_status_t status, const char *msg)
{
    if (op->failing)
        op->failing(op->failing_arg, status, msg);
}

/* Without memory for fail_rest's bookkeeping: each rank not yet done joins
 * its own streams only, as far as it can, and rings done. */
static void fail_rest_own(ovld_backend_t *b, const ovld_exec_op_t *op, const size_t *pc,
                          ovl_status_t status, const char *msg)
{
    const ovld_backend_ops_t *ops = b->ops;
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p || pc[r] == p->ninstr)
            continue; /* another daemon's, or its DONE was issued */
        for (uint32_t s = 1; s < p->nstreams; s++)
            if (ops->record(op->ranks[r].rank, s, p->nevents + s) == OVL_OK)
                (void)ops->wait(op->ranks[r].rank, 0, op->ranks[r].rank, p->nevents + s);
        ops->done(op->ranks[r].rank, 0, op->seq, status, msg, op->ranks[r].cookie);
    }
}

static void fail_rest(ovld_backend_t *b, const ovld_exec_op_t *op, const size_t *pc,
                      ovl_status_t status, const char *msg)
{
    const ovld_backend_ops_t *ops = b->ops;
    failing(op, status, msg);
    /* recorded[q * MAX_STREAMS + s]: rank q's join event of stream s; all
     * recorded before any is waited for (a wait on an event not yet
     * recorded waits for nothing). */
    bool *recorded = calloc((size_t)op->world * OVL_PLAN_MAX_STREAMS, sizeof(*recorded));
    if (!recorded) {
        fail_rest_own(b, op, pc, status, msg);
        return;
    }
    for (uint32_t q = 0; q < op->world; q++) {
        const ovl_plan_t *p = op->ranks[q].plan;
        if (!p)
            continue; /* another daemon's */
        for (uint32_t s = 1; s < p->nstreams; s++) {
            recorded[(size_t)q * OVL_PLAN_MAX_STREAMS + s] =
                ops->record(op->ranks[q].rank, s, p->nevents + s) == OVL_OK;
        }
    }
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p || pc[r] == p->ninstr)
            continue; /* another daemon's, or its DONE was issued */
        for (uint32_t q = 0; q < op->world; q++) {
            const ovl_plan_t *pq = op->ranks[q].plan;
            if (!pq)
                continue;
            for (uint32_t s = 1; s < pq->nstreams; s++)
                if (recorded[(size_t)q * OVL_PLAN_MAX_STREAMS + s])
                    (void)ops->wait(op->ranks[r].rank, 0, op->ranks[q].rank, pq->nevents + s);
        }
        ops->done(op->ranks[r].rank, 0, op->seq, status, msg, op->ranks[r].cookie);
    }
    free(recorded);
}

/* What a walk of the op's programs needs, per rank: where each stands,
 * the events recorded so far in this op, the parts of a collective call,
 * and the backend ranks in rank order (replay). */
typedef struct walk {
    size_t *pc;
    bool *recorded; /* [rank * maxev + event] */
    ovld_allgather_part_t *parts;
    ovld_rail_part_t *rparts;
    ovld_rank_t **ranks;
    void **cookies; /* replay: the ranks' completion cookies, in rank order */
} walk_t;

static void walk_free(walk_t *w)
{
    free(w->pc);
    free(w->recorded);
    free(w->parts);
    free(w->rparts);
    free(w->ranks);
    free(w->cookies);
}

static bool walk_alloc(walk_t *w, const ovld_exec_op_t *op, uint32_t maxev)
{
    uint32_t n = op->world;
    *w = (walk_t){.pc = calloc(n, sizeof(*w->pc)),
                  .recorded = calloc((size_t)n * (maxev ? maxev : 1), sizeof(*w->recorded)),
                  .parts = calloc(n, sizeof(*w->parts)),
                  .rparts = calloc(n, sizeof(*w->rparts)),
                  .ranks = calloc(n, sizeof(*w->ranks)),
                  .cookies = calloc(n, sizeof(*w->cookies))};
    if (w->pc && w->recorded && w->parts && w->rparts && w->ranks && w->cookies)
        return true;
    walk_free(w);
    return false;
}

/*
 * Issues every local rank's program from w->pc on (advanced as it goes)
 * until each rank has issued all of it, or, with before_done, all but its
 * last instruction (its DONE). w->recorded holds what this op recorded so
 * far. A failure returns its status with words in err and rings nothing
 * (the caller does: fail_rest with w->pc).
 */
static ovl_status_t walk(ovld_backend_t *b, const ovld_exec_op_t *op, uint32_t maxev, walk_t *wk,
                         bool before_done, char *err, size_t errlen)
{
    uint32_t w = op->world;
    size_t *pc = wk->pc;
    uint32_t nlocal = 0, r0 = first_local(op);
    for (uint32_t r = 0; r < w; r++)
        nlocal += op->ranks[r].plan != NULL;
    ovld_coll_tag_t tag = {.seq = op->seq, .index = 0};
    for (;;) {
        bool progress = false, finished = true;
        uint32_t at_gather = 0; /* ranks standing at a collective call (is_coll) */
        for (uint32_t r = 0; r < w; r++) {
            const ovl_plan_t *p = op->ranks[r].plan;
            size_t end = p ? p->ninstr - (before_done && p->ninstr > 0) : 0;
            while (p && pc[r] < end) {
                const ovl_instr_t *in = &p->instr[pc[r]];
                if (is_coll(in->kind)) {
                    at_gather++;
                    break;
                }
                if ((in->kind == OVL_I_WAIT || in->kind == OVL_I_RECORD) &&
                    (in->event >= maxev || (in->kind == OVL_I_WAIT && in->peer >= w))) {
                    snprintf(err, errlen, "rank %u, instruction %zu: event or peer out of range", r,
                             pc[r]);
                    return OVL_ERR_INTERNAL;
                }
                if (in->kind == OVL_I_WAIT && in->peer != r &&
                    !wk->recorded[(size_t)in->peer * maxev + in->event])
                    break;
                char why[160];
                ovl_status_t st = issue(b, op, r, in, why, sizeof(why));
                if (st != OVL_OK) {
                    snprintf(err, errlen, "rank %u, instruction %zu (%s): %s", r, pc[r],
                             ovl_instr_name(in->kind), why_failed(b, why, st));
                    return st;
                }
                if (in->kind == OVL_I_RECORD)
                    wk->recorded[(size_t)r * maxev + in->event] = true;
                pc[r]++;
                progress = true;
            }
            if (p && pc[r] < end)
                finished = false;
        }
        if (finished)
            return OVL_OK;
        if (at_gather == nlocal) {
            /* walk_parts refuses ranks that stand at different kinds */
            ovl_instr_kind_t kind = op->ranks[r0].plan->instr[pc[r0]].kind;
            ovl_status_t st = issue_coll(b, op, pc, kind, tag, wk->parts, wk->rparts, err, errlen);
            if (st != OVL_OK)
                return st;
            tag.index++;
            for (uint32_t r = 0; r < w; r++)
                pc[r] += op->ranks[r].plan != NULL;
            progress = true;
        }
        if (!progress) {
            snprintf(err, errlen, "plans cannot be issued in any order (deadlock)");
            return OVL_ERR_INTERNAL;
        }
    }
}

/* Every local rank's done rung with the error, nothing of the op issued. */
static ovl_status_t fail_all(ovld_backend_t *b, const ovld_exec_op_t *op, ovl_status_t st,
                             const char *err)
{
    failing(op, st, err);
    for (uint32_t q = 0; q < op->world; q++) {
        if (!op->ranks[q].plan)
            continue;
        ovld_exec_ring_t ring = {.rank = op->ranks[q].rank, .cookie = op->ranks[q].cookie};
        ovld_exec_fail(b, &ring, 1, op->seq, st, err);
    }
    return st;
}

/* maxev: the most events any rank's plan uses (ovld_exec_run). */
static ovl_status_t exec_serial(ovld_backend_t *b, const ovld_exec_op_t *op, uint32_t maxev,
                                char *err, size_t errlen)
{
    walk_t wk;
    if (!walk_alloc(&wk, op, maxev)) {
        snprintf(err, errlen, "executor: out of memory");
        return fail_all(b, op, OVL_ERR_NOMEM, err);
    }
    ovl_status_t st = walk(b, op, maxev, &wk, false, err, errlen);
    if (st != OVL_OK)
        fail_rest(b, op, wk.pc, st, err);
    walk_free(&wk);
    return st;
}

/* ------------------------------------------------------ parallel issue */

/*
 * With a backend that allows it (issue_parallel), more than one rank and
 * plans without an ALLGATHER or a RAIL (ring inside a node, and gathers by
 * the copy engine), each rank's program is issued by a thread of its own:
 * the calling thread takes rank 0, a pool of threads the others. Plans with
 * ALLGATHERs stay serial: every rank meets the others at each of them and
 * one thread issues the NCCL group for all, so threads bought nothing there
 * (measured on 2 x H200, docs/performance.md); so do plans with RAILs (a
 * ring across nodes), for the same reason, unmeasured. What the serial walk gets from its order,
 * the threads get from one mutex and condition:
 *  - a wait on a peer's event waits until the peer's thread has issued that
 *    record in this op;
 *  - every rank stops at its DONE, which the calling thread (the loop
 *    thread) rings for each rank once all threads stopped, as it does
 *    fail_rest after a failure: done may report a completion at once, which
 *    only the loop thread may do.
 * A thread that would wait while every other thread still issuing waits
 * too, each having looked at the latest state (gen), has found plans that
 * cannot be issued: the run fails, as the serial walk does.
 */
typedef struct xrun {
    ovld_backend_t *b;
    const ovld_exec_op_t *op;
    uint32_t maxev;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t *pc;     /* per rank: the next instruction; its own thread's */
    bool *recorded; /* [rank * maxev + event], under mu */
    uint64_t gen;   /* bumped at every change a waiting thread may wait for */
    bool *stopped;  /* per rank: its thread stopped issuing */
    bool *sleeping; /* per rank: waits on the condition */
    uint64_t *seen; /* per rank: the gen its wait condition was last false at */
    long *tid;      /* per rank: its issuing thread (for a stall report) */
    bool failed;
    ovl_status_t st;
    char err[256];
    uint32_t pending; /* pool tasks not finished */
} xrun_t;

/* First failure wins; everyone is woken to stop. Under mu. */
static void xfail(xrun_t *x, ovl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void xfail(xrun_t *x, ovl_status_t st, const char *fmt, ...)
{
    if (!x->failed) {
        x->failed = true;
        x->st = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->err, sizeof(x->err), fmt, ap);
        va_end(ap);
    }
    x->gen++;
    pthread_cond_broadcast(&x->cv);
}

/* A change others may wait for. Under mu. */
static void xchanged(xrun_t *x)
{
    x->gen++;
    pthread_cond_broadcast(&x->cv);
}

/* Rank r's wait condition is false at the current state: sleeps until a
 * change, unless every thread still issuing is in the same case (then the
 * plans deadlock). Under mu. */
static void xwait(xrun_t *x, uint32_t r)
{
    x->sleeping[r] = true;
    x->seen[r] = x->gen;
    bool stuck = true;
    for (uint32_t q = 0; q < x->op->world && stuck; q++)
        stuck = x->stopped[q] || (x->sleeping[q] && x->seen[q] == x->gen);
    if (stuck)
        xfail(x, OVL_ERR_INTERNAL, "plans cannot be issued in any order (deadlock)");
    else
        pthread_cond_wait(&x->cv, &x->mu);
    x->sleeping[r] = false;
}

/* The issuing thread's words for a failed call (a backend keeps them per
 * thread). */
static void xfail_call(xrun_t *x, ovl_status_t st, uint32_t r, const ovl_instr_t *in,
                       const char *own)
{
    const char *why = why_failed(x->b, own, st);
    pthread_mutex_lock(&x->mu);
    xfail(x, st, "rank %u, instruction %zu (%s): %s", r, x->pc[r], ovl_instr_name(in->kind), why);
    pthread_mutex_unlock(&x->mu);
}

/* Issues rank r's program up to its DONE (or a failure anywhere). */
static void xrank(xrun_t *x, uint32_t r)
{
    const ovld_exec_op_t *op = x->op;
    const ovl_plan_t *p = op->ranks[r].plan;
    pthread_mutex_lock(&x->mu);
    x->tid[r] = (long)syscall(SYS_gettid);
    while (!x->failed && x->pc[r] < p->ninstr) {
        const ovl_instr_t *in = &p->instr[x->pc[r]];
        if (in->kind == OVL_I_DONE)
            break; /* the loop thread rings it */
        if ((in->kind == OVL_I_WAIT || in->kind == OVL_I_RECORD) &&
            (in->event >= x->maxev || (in->kind == OVL_I_WAIT && in->peer >= op->world))) {
            xfail(x, OVL_ERR_INTERNAL, "rank %u, instruction %zu: event or peer out of range", r,
                  x->pc[r]);
            break;
        }
        if (in->kind == OVL_I_WAIT && in->peer != r) {
            while (!x->failed && !x->recorded[(size_t)in->peer * x->maxev + in->event])
                xwait(x, r);
            if (x->failed)
                break;
        }
        pthread_mutex_unlock(&x->mu);
        char why[160];
        ovl_status_t st = issue(x->b, op, r, in, why, sizeof(why));
        if (st != OVL_OK) {
            xfail_call(x, st, r, in, why);
            pthread_mutex_lock(&x->mu);
            break;
        }
        pthread_mutex_lock(&x->mu);
        if (in->kind == OVL_I_RECORD) {
            x->recorded[(size_t)r * x->maxev + in->event] = true;
            xchanged(x);
        }
        x->pc[r]++;
    }
    /* stopped: the others must not count on this thread any more */
    x->stopped[r] = true;
    xchanged(x);
    pthread_mutex_unlock(&x->mu);
}

/* The pool: threads that take (run, rank) tasks, made as needed and kept.
 * Every task must have a thread of its own (a rank's thread may wait for
 * another's), so `free` counts the threads not promised to a task: a task
 * queued takes one at once, a thread that finished one gives it back. */
typedef struct xtask {
    xrun_t *x;
    uint32_t rank;
    struct xtask *next;
} xtask_t;

struct ovld_exec_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    xtask_t *head, *tail;
    uint32_t free;
    bool stopping;
    pthread_t *threads; /* every thread made, joined by ovld_exec_pool_destroy */
    uint32_t nthreads, cap;
    ovld_reporter_t report; /* read-only */
};

static void *pool_main(void *arg)
{
    ovld_exec_pool_t *pool = arg;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->head && !pool->stopping)
            pthread_cond_wait(&pool->cv, &pool->mu);
        if (!pool->head) /* stopping, and nothing left to issue */
            break;
        xtask_t *t = pool->head;
        pool->head = t->next;
        if (!pool->head)
            pool->tail = NULL;
        pthread_mutex_unlock(&pool->mu);
        xrun_t *x = t->x;
        xrank(x, t->rank);
        /* Free again before the op hears that this rank is issued: its
         * caller may submit the next op at once, which must find this
         * thread free rather than start another (the pool grew past its
         * need under churn, and ovld's thread count with it). */
        pthread_mutex_lock(&pool->mu);
        pool->free++;
        pthread_mutex_unlock(&pool->mu);
        pthread_mutex_lock(&x->mu);
        if (--x->pending == 0)
            pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

ovl_status_t ovld_exec_pool_create(const ovld_reporter_t *report, ovld_exec_pool_t **ret_pool)
{
    ovld_exec_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return OVL_ERR_NOMEM;
    if (report)
        pool->report = *report;
    if (pthread_mutex_init(&pool->mu, NULL) != 0) {
        free(pool);
        return OVL_ERR_SYSTEM;
    }
    if (pthread_cond_init(&pool->cv, NULL) != 0) {
        pthread_mutex_destroy(&pool->mu);
        free(pool);
        return OVL_ERR_SYSTEM;
    }
    *ret_pool = pool;
    return OVL_OK;
}

void ovld_exec_pool_destroy(ovld_exec_pool_t *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stopping = true;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 0; i < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* Queues n tasks, each with a thread; false if threads could not be made
 * (nothing is queued then). */
static bool pool_submit(ovld_exec_pool_t *pool, xtask_t *tasks, uint32_t n)
{
    pthread_mutex_lock(&pool->mu);
    while (pool->free < n) {
        if (pool->nthreads == pool->cap) {
            uint32_t cap = pool->cap ? 2 * pool->cap : 8;
            pthread_t *nt = realloc(pool->threads, cap * sizeof(*nt));
            if (!nt) {
                pthread_mutex_unlock(&pool->mu);
                return false;
            }
            pool->threads = nt;
            pool->cap = cap;
        }
        if (ovl_thread_start(&pool->threads[pool->nthreads], pool_main, pool) != 0) {
            pthread_mutex_unlock(&pool->mu);
            return false;
        }
        pool->nthreads++;
        pool->free++;
    }
    pool->free -= n;
    for (uint32_t i = 0; i < n; i++) {
        tasks[i].next = NULL;
        if (pool->tail)
            pool->tail->next = &tasks[i];
        else
            pool->head = &tasks[i];
        pool->tail = &tasks[i];
    }
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    return true;
}

/* Whether the threads can take the op: every rank's program ends with its
 * one DONE (the loop thread rings it after the threads), has no ALLGATHER
 * or RAIL (see above) and records each event at most once. */
static bool parallel_fits(const ovld_exec_op_t *op)
{
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p || p->ninstr == 0 || p->instr[p->ninstr - 1].kind != OVL_I_DONE)
            return false;
        for (size_t i = 0; i + 1 < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];
            if (in->kind == OVL_I_DONE || is_coll(in->kind))
                return false;
            /* an event recorded twice: a peer's wait would race the second
             * record (the planner never does it) */
            for (size_t j = 0; in->kind == OVL_I_RECORD && j < i; j++)
                if (p->instr[j].kind == OVL_I_RECORD && p->instr[j].event == in->event)
                    return false;
        }
    }
    return true;
}

/* Waits (under mu) until the pool's threads are done with the run; one that
 * takes longer than EXEC_SLOW_MS is said, with where each rank stands, and
 * the stacks of the threads still issuing are asked for. */
static void exec_wait_pool(xrun_t *x, const ovld_reporter_t *report)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += EXEC_SLOW_MS / 1000;
    bool said = false;
    while (x->pending > 0) {
        if (said) {
            pthread_cond_wait(&x->cv, &x->mu);
            continue;
        }
        if (pthread_cond_timedwait(&x->cv, &x->mu, &until) == 0 || x->pending == 0)
            continue;
        said = true;
        for (uint32_t r = 0; r < x->op->world; r++) {
            if (x->stopped[r])
                continue;
            const ovl_plan_t *p = x->op->ranks[r].plan;
            ovld_report(report, OVLD_REPORT_WARN,
                        "op %llu: rank %u still issuing instruction %zu (%s) after %d ms%s",
                        (unsigned long long)x->op->seq, r, x->pc[r],
                        x->pc[r] < p->ninstr ? ovl_instr_name(p->instr[x->pc[r]].kind) : "-",
                        EXEC_SLOW_MS, x->sleeping[r] ? ", waiting for another rank" : "");
            if (x->tid[r] > 0)
                syscall(SYS_tgkill, (long)getpid(), x->tid[r], SIGUSR2);
        }
    }
}

static ovl_status_t exec_parallel(ovld_exec_pool_t *pool, ovld_backend_t *b,
                                  const ovld_exec_op_t *op, uint32_t maxev, char *err,
                                  size_t errlen)
{
    uint32_t w = op->world;
    xrun_t x = {.b = b, .op = op, .maxev = maxev, .st = OVL_OK};
    xtask_t *tasks = calloc(w, sizeof(*tasks));
    x.pc = calloc(w, sizeof(*x.pc));
    x.recorded = calloc((size_t)w * (maxev ? maxev : 1), sizeof(*x.recorded));
    x.stopped = calloc(w, sizeof(*x.stopped));
    x.sleeping = calloc(w, sizeof(*x.sleeping));
    x.seen = calloc(w, sizeof(*x.seen));
    x.tid = calloc(w, sizeof(*x.tid));
    ovl_status_t st = OVL_OK;
    if (!tasks || !x.pc || !x.recorded || !x.stopped || !x.sleeping || !x.seen || !x.tid) {
        st = OVL_ERR_NOMEM;
        snprintf(err, errlen, "executor: out of memory");
        fail_all(b, op, st, err);
        goto out;
    }
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    x.pending = w - 1;
    for (uint32_t r = 1; r < w; r++)
        tasks[r - 1] = (xtask_t){.x = &x, .rank = r};
    if (!pool_submit(pool, tasks, w - 1)) {
        /* no threads to be had: this thread walks every rank */
        pthread_mutex_destroy(&x.mu);
        pthread_cond_destroy(&x.cv);
        st = exec_serial(b, op, maxev, err, errlen);
        goto out;
    }
    xrank(&x, 0);
    pthread_mutex_lock(&x.mu);
    exec_wait_pool(&x, &pool->report);
    pthread_mutex_unlock(&x.mu);
    pthread_mutex_destroy(&x.mu);
    pthread_cond_destroy(&x.cv);
    if (x.failed) {
        st = x.st;
        snprintf(err, errlen, "%s", x.err);
        fail_rest(b, op, x.pc, st, err);
        goto out;
    }
    for (uint32_t r = 0; r < w; r++) /* every rank stands at its DONE */
        b->ops->done(op->ranks[r].rank, op->ranks[r].plan->instr[x.pc[r]].stream, op->seq, OVL_OK,
                     NULL, op->ranks[r].cookie);
out:
    free(tasks);
    free(x.pc);
    free(x.recorded);
    free(x.stopped);
    free(x.sleeping);
    free(x.seen);
    free(x.tid);
    return st;
}

/* ------------------------------------------------------------- replay */

/* Whether op's body may be captured (exec.h, ovld_exec_op_t.replay): every
 * rank served here, with a plan worth replaying (ovl_plan_t.replay), each
 * program WAIT_READY on stream 0, a body of neither doorbell instructions
 * nor NCCL calls, DONE on stream 0. */
static bool replay_fits(ovld_backend_t *b, const ovld_exec_op_t *op)
{
    if (!op->replay || op->timed || !b->ops->graph_capture || !b->ops->graph_end ||
        !b->ops->graph_run || !b->ops->graph_free)
        return false;
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p || !p->replay || p->ninstr < 2 || p->instr[0].kind != OVL_I_WAIT_READY ||
            p->instr[0].stream != 0 || p->instr[p->ninstr - 1].kind != OVL_I_DONE ||
            p->instr[p->ninstr - 1].stream != 0)
            return false;
        for (size_t i = 1; i + 1 < p->ninstr; i++) {
            ovl_instr_kind_t k = p->instr[i].kind;
            if (k == OVL_I_WAIT_READY || k == OVL_I_DONE || is_coll(k))
                return false;
        }
    }
    return true;
}

/* The words of op's replay key: what its plans are (every field of the
 * parameters they were built from: plans are a pure function of them),
 * which backend rank runs each, and every view they name. Two ops of one
 * key issue the same calls with the same arguments, but for the doorbell's
 * values. */
#define KEY_WORDS_PER_RANK (27 + OVL_PLAN_MAX_BS - 1 + 2 * OVL_BUF_COUNT)
#define KEY_STACK_WORLD    8 /* keys of up to this many ranks are built on the stack */

static size_t replay_key(const ovld_exec_op_t *op, uint64_t *key)
{
    size_t n = 0;
    key[n++] = op->world;
    for (uint32_t r = 0; r < op->world; r++) {
        const ovld_exec_rank_t *x = &op->ranks[r];
        const ovl_plan_params_t *p = &x->plan->params;
        size_t at = n;
        key[n++] = (uint64_t)(uintptr_t)x->rank;
        key[n++] = (uint64_t)p->algo;
        key[n++] = p->world;
        key[n++] = p->rank;
        key[n++] = p->m;
        key[n++] = p->n;
        key[n++] = p->k;
        key[n++] = (uint64_t)p->dtype;
        key[n++] = p->chunks;
        key[n++] = p->streams;
        key[n++] = p->want_gathered;
        key[n++] = p->transb;
        key[n++] = p->strided;
        key[n++] = p->shared_gpu;
        key[n++] = (uint64_t)p->allgather;
        key[n++] = p->nb;
        for (uint32_t i = 0; i < OVL_PLAN_MAX_BS - 1; i++)
            key[n++] = p->n_more[i];
        key[n++] = (uint64_t)(uintptr_t)p->node_of; /* NULL: one node */
        key[n++] = p->sc.scaled;
        key[n++] = (uint64_t)p->sc.b_dtype;
        key[n++] = (uint64_t)p->sc.out_dtype;
        key[n++] = (uint64_t)p->sc.a_mode;
        key[n++] = (uint64_t)p->sc.b_mode;
        key[n++] = p->sc.fast_accum;
        key[n++] = p->sc.bias;
        for (uint32_t i = 0; i < OVL_BUF_COUNT; i++) {
            key[n++] = (uint64_t)(uintptr_t)x->buf[i].ptr;
            key[n++] = x->buf[i].ld;
        }
        while (n < at + KEY_WORDS_PER_RANK)
            key[n++] = 0;
    }
    return n;
}

/* Captures op's body into a graph, for the key ovld_replay_find asked
 * about: every rank's program from wk->pc 1 to before its DONE. NULL if
 * the capture failed, with words in err (nothing of it ran). */
static ovld_graph_t *capture(ovld_backend_t *b, const ovld_exec_op_t *op, uint32_t maxev,
                             walk_t *wk, char *err, size_t errlen)
{
    const ovld_backend_ops_t *ops = b->ops;
    ovld_graph_t *g = NULL;
    ovl_status_t st = OVL_OK;
    /* every event the body records, made now: nothing but its calls
     * inside the capture */
    for (uint32_t r = 0; ops->reserve_events && r < op->world && st == OVL_OK; r++)
        st = ops->reserve_events(wk->ranks[r], maxev + OVL_PLAN_MAX_STREAMS);
    if (st == OVL_OK)
        st = ops->graph_capture(wk->ranks, op->world);
    if (st != OVL_OK) {
        snprintf(err, errlen, "%s", why_failed(b, "", st));
        return NULL;
    }
    st = walk(b, op, maxev, wk, true, err, errlen);
    if (st != OVL_OK) {
        (void)ops->graph_end(wk->ranks, op->world, NULL);
        return NULL;
    }
    st = ops->graph_end(wk->ranks, op->world, &g);
    if (st != OVL_OK) {
        snprintf(err, errlen, "%s", why_failed(b, "", st));
        return NULL;
    }
    return g;
}

/*
 * Issues a replayable op (replay_fits) as ovld_replay_find says: the whole
 * op by graph_run, its body from the key's graph (captured first where
 * asked). A capture that fails leaves the key to be issued call by call,
 * and so is this op, whole.
 */
static ovl_status_t exec_replayed(ovld_exec_pool_t *pool, ovld_backend_t *b,
                                  const ovld_exec_op_t *op, uint32_t maxev, ovld_replay_how_t how,
                                  ovld_graph_t *g, ovld_replay_how_t *ret_how, char *err,
                                  size_t errlen)
{
    walk_t wk;
    if (!walk_alloc(&wk, op, maxev)) {
        if (how == OVLD_REPLAY_CAPTURE)
            ovld_replay_refused(op->replay);
        snprintf(err, errlen, "executor: out of memory");
        return fail_all(b, op, OVL_ERR_NOMEM, err);
    }
    ovl_status_t st = OVL_OK;
    for (uint32_t r = 0; r < op->world; r++) {
        wk.ranks[r] = op->ranks[r].rank;
        wk.cookies[r] = op->ranks[r].cookie;
    }
    if (how == OVLD_REPLAY_CAPTURE) {
        char why[256];
        for (uint32_t r = 0; r < op->world; r++)
            wk.pc[r] = 1; /* the body: after WAIT_READY */
        g = capture(b, op, maxev, &wk, why, sizeof(why));
        for (uint32_t r = 0; r < op->world; r++)
            wk.pc[r] = 0;
        if (!g) {
            ovld_replay_refused(op->replay);
            if (pool)
                ovld_report(&pool->report, OVLD_REPORT_WARN,
                            "op %llu: its body could not be captured for replay (%s): ops "
                            "like it are issued call by call",
                            (unsigned long long)op->seq, why);
            /* nothing of the capture ran: the op, call by call */
            memset(wk.recorded, 0, (size_t)op->world * (maxev ? maxev : 1) * sizeof(bool));
            how = OVLD_REPLAY_EAGER;
            st = walk(b, op, maxev, &wk, false, err, errlen);
            if (st != OVL_OK)
                goto fail;
            goto out;
        }
        ovld_replay_captured(op->replay, g);
    }
    st = b->ops->graph_run(g, wk.ranks, wk.cookies, op->world, op->seq);
    if (st != OVL_OK) {
        snprintf(err, errlen, "replay: %s", why_failed(b, "", st));
        goto fail;
    }
    for (uint32_t r = 0; r < op->world; r++)
        wk.pc[r] = op->ranks[r].plan->ninstr; /* every DONE rung */
out:
    *ret_how = how;
    walk_free(&wk);
    return OVL_OK;
fail:
    *ret_how = how;
    fail_rest(b, op, wk.pc, st, err);
    walk_free(&wk);
    return st;
}

bool ovld_exec_ready(ovld_backend_t *b, const ovld_exec_op_t *op)
{
    if (!b->ops->ready_seen)
        return true;
    for (uint32_t r = 0; r < op->world; r++)
        if (op->ranks[r].plan && !b->ops->ready_seen(op->ranks[r].rank, op->seq))
            return false;
    return true;
}

/* Fails the whole op before anything of it was issued: every rank's done
 * rings with the error, on stream 0 (which every rank has). */
void ovld_exec_fail(ovld_backend_t *b, const ovld_exec_ring_t *rings, uint32_t n, uint64_t seq,
                    ovl_status_t status, const char *message)
{
    for (uint32_t i = 0; i < n; i++)
        b->ops->done(rings[i].rank, 0, seq, status, message, rings[i].cookie);
}

ovl_status_t ovld_exec_run(ovld_exec_pool_t *pool, ovld_backend_t *b, const ovld_exec_op_t *op,
                           ovld_replay_how_t *ret_how, char *err, size_t errlen)
{
    ovld_replay_how_t how_unused;
    if (!ret_how)
        ret_how = &how_unused;
    *ret_how = OVLD_REPLAY_EAGER;
    uint32_t maxev = 0, r0 = first_local(op);
    if (r0 == op->world) {
        snprintf(err, errlen, "executor: the op has no rank served here");
        return OVL_ERR_INTERNAL; /* no doorbell to ring */
    }
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p)
            continue; /* another daemon's */
        if (p->params.world != op->world || p->params.rank != r ||
            p->params.dtype != op->ranks[r0].plan->params.dtype ||
            p->nstreams > OVL_PLAN_MAX_STREAMS) {
            snprintf(err, errlen, "executor: rank %u's plan is not for this op", r);
            return fail_all(b, op, OVL_ERR_INTERNAL, err);
        }
        if (p->nevents > maxev)
            maxev = p->nevents;
    }
    /* How its body goes: a replayed op is one launch on the origin's
     * stream 0, and needs no other stream. */
    ovld_replay_how_t how = OVLD_REPLAY_EAGER;
    ovld_graph_t *g = NULL;
    if (replay_fits(b, op)) {
        /* on the stack up to world KEY_STACK_WORLD */
        uint64_t stack[1 + KEY_STACK_WORLD * KEY_WORDS_PER_RANK];
        uint64_t *key = op->world <= KEY_STACK_WORLD
                            ? stack
                            : malloc((1 + (size_t)op->world * KEY_WORDS_PER_RANK) * sizeof(*key));
        if (key) {
            size_t n = replay_key(op, key);
            how = ovld_replay_find(op->replay, key, n * sizeof(*key), op->mem_gen, &g);
            if (key != stack)
                free(key);
        }
    }
    if (how == OVLD_REPLAY_LAUNCH)
        return exec_replayed(pool, b, op, maxev, how, g, ret_how, err, errlen);
    /* Streams the backend is told of (set_streams) and no others: checked
     * for every op issued call by call or captured (a key's plans are a
     * pure function of its parameters, so a launch's were checked at its
     * capture). */
    for (uint32_t r = 0; r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        for (size_t i = 0; p && i < p->ninstr; i++)
            if (p->instr[i].stream >= p->nstreams) {
                snprintf(err, errlen, "executor: rank %u, instruction %zu: stream %u of %u", r, i,
                         p->instr[i].stream, p->nstreams);
                return fail_all(b, op, OVL_ERR_INTERNAL, err);
            }
    }
    /* The streams' roles, before anything of the op is issued (a capture
     * records them): the backend takes their priorities from them. */
    for (uint32_t r = 0; b->ops->set_streams && r < op->world; r++) {
        const ovl_plan_t *p = op->ranks[r].plan;
        if (!p)
            continue;
        ovl_status_t st = b->ops->set_streams(op->ranks[r].rank, p->roles, p->nstreams);
        if (st != OVL_OK) {
            char why[160] = "";
            snprintf(err, errlen, "rank %u: streams: %s", r, why_failed(b, why, st));
            return fail_all(b, op, st, err);
        }
    }
    if (how == OVLD_REPLAY_CAPTURE)
        return exec_replayed(pool, b, op, maxev, how, g, ret_how, err, errlen);
    if (!pool || op->serial || op->world < 2 || !b->ops->issue_parallel ||
        !b->ops->reserve_events || !parallel_fits(op))
        return exec_serial(b, op, maxev, err, errlen);
    /* Every event a thread may look up, fail_rest's joins included. */
    for (uint32_t r = 0; r < op->world; r++) {
        ovl_status_t st = b->ops->reserve_events(op->ranks[r].rank, maxev + OVL_PLAN_MAX_STREAMS);
        if (st != OVL_OK) {
            const char *why = b->ops->last_error ? b->ops->last_error(b) : NULL;
            snprintf(err, errlen, "executor: events: %s", why && why[0] ? why : ovl_strerror(st));
            return fail_all(b, op, st, err);
        }
    }
    return exec_parallel(pool, b, op, maxev, err, errlen);
}

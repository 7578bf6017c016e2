/*
 * plan_rs.c: the planner's emitter of GEMM + reduce-scatter (plan.h,
 * docs/plans.md "GEMM + reduce-scatter"), on the builder of plan.c
 * (plan_internal.h). Pure code: no I/O, no logging.
 */
#include <stdlib.h>

#include "plan.h"
#include "plan_internal.h"

/*
 * GEMM + reduce-scatter (docs/plans.md, "GEMM + reduce-scatter"): each rank
 * holds A (m x k, its share of the inner dimension) and B (k x n); the
 * partial product P = A @ op(B) (m x n) is summed over the ranks, and rank
 * r keeps rows [r * m/W, (r+1) * m/W) of the sum in C. A chunk is a range
 * of rows of one rank's block, taken in every block: its GEMM covers those
 * rows of all W blocks (W blocks, m/W apart), and its REDUCE_SCATTER sums
 * them into each rank's C.
 */

/* Rows of one rank's block of the product. */
static uint64_t rs_block(const ovl_plan_params_t *p)
{
    return p->m / p->world;
}

bool pb_rs_valid(const ovl_plan_params_t *p)
{
    if (p->world == 0 || p->world > OVL_PLAN_MAX_WORLD || p->rank >= p->world)
        return false;
    if (p->m == 0 || p->n == 0 || p->k == 0 || p->m % p->world != 0)
        return false;
    /* one B, no gathered A, one node: what this kind's plans are */
    if (ovl_plan_nb(p) != 1 || p->want_gathered || pb_count_nodes(p) != 1)
        return false;
    if (p->algo != OVL_ALGO_NAIVE && p->algo != OVL_ALGO_COLLECTIVE)
        return false;
    if (ovl_dtype_size(p->dtype) == 0 || (unsigned)p->allgather >= OVL_AG_PREF_COUNT ||
        (unsigned)p->reduce_op >= OVL_REDUCE_OP_COUNT)
        return false;
    return p->chunks <= OVL_PLAN_MAX_CHUNKS && p->streams <= OVL_PLAN_MAX_STREAMS;
}

/* P's bytes: m x n elements (OVL_ERR_LIMIT rather than a wrapped size). */
ovl_status_t pb_rs_scratch(const ovl_plan_params_t *p, uint64_t *ret)
{
    uint64_t row;

    *ret = 0;
    if (__builtin_mul_overflow(p->n, (uint64_t)ovl_dtype_size(p->dtype), &row) ||
        __builtin_mul_overflow(p->m, row, ret))
        return OVL_ERR_LIMIT;
    return OVL_OK;
}

static void rs_buf_shapes(const ovl_plan_params_t *p, ovl_plan_buf_t *bufs)
{
    bufs[OVL_BUF_A] = (ovl_plan_buf_t){.rows = p->m, .cols = p->k};
    bufs[OVL_BUF_B] = p->transb ? (ovl_plan_buf_t){.rows = p->n, .cols = p->k}
                                : (ovl_plan_buf_t){.rows = p->k, .cols = p->n};
    bufs[OVL_BUF_C] = (ovl_plan_buf_t){.rows = rs_block(p), .cols = p->n};
    bufs[OVL_BUF_P] = (ovl_plan_buf_t){.rows = p->m, .cols = p->n};
}

/* Chunks of a block's rows and streams (docs/plans.md): collective's
 * defaults as all-gather + GEMM's, its chunks clamped to the block and
 * evened out, a stream per chunk at most; naive one chunk on stream 0. */
static void rs_plan_shape(ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint64_t mb = rs_block(p);
    uint32_t c = 1, s = NAIVE_STREAMS;

    if (p->algo == OVL_ALGO_COLLECTIVE) {
        /* default_chunks reads m as a rank's rows: a block's here */
        ovl_plan_params_t q = *p;

        q.m = mb;
        c = p->chunks ? p->chunks : pb_default_chunks(&q, COLLECTIVE_CHUNKS, p->world);
        s = p->streams ? p->streams : COLLECTIVE_STREAMS;
    }
    if (c > mb)
        c = (uint32_t)mb;
    plan->chunk_rows = mb / c + (mb % c != 0);
    plan->chunks = (uint32_t)(mb / plan->chunk_rows + (mb % plan->chunk_rows != 0));
    if (s > plan->chunks)
        s = plan->chunks;
    plan->nstreams = s;
    plan->roles[0] = OVL_ROLE_CLIENT;
    for (uint32_t i = 1; i < s; i++)
        plan->roles[i] = OVL_ROLE_COMM; /* each side stream reduces its chunks */
}

/* A chunk's GEMM (rows [row0, row0+rows) of every block of P) and then its
 * REDUCE_SCATTER, on stream st. */
static ovl_status_t rs_emit_chunk(builder_t *b, uint32_t st, uint64_t row0, uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    uint64_t mb = rs_block(p);
    /* every row of every block, or one block: one GEMM of a block */
    bool one = (row0 == 0 && rows == mb) || p->world == 1;
    ovl_instr_t gemm = {
        .kind = OVL_I_GEMM,
        .stream = st,
        .src = pb_own(b, OVL_BUF_A, row0),
        .dst = pb_own(b, OVL_BUF_P, row0),
        .b = pb_own(b, OVL_BUF_B, 0),
        .rows = one && rows == mb ? p->m : rows,
        .n = p->n,
        .k = p->k,
        .nblocks = one ? 1 : p->world,
        .stride = one ? 0 : mb,
        .transb = p->transb,
    };
    ovl_instr_t rs = {
        .kind = OVL_I_REDUCE_SCATTER,
        .stream = st,
        .src = pb_own(b, OVL_BUF_P, row0),
        .dst = pb_own(b, OVL_BUF_C, row0),
        .rows = rows,
        .cols = p->n,
        .stride = mb,
        .avg = p->reduce_op == OVL_REDUCE_AVG,
    };
    ovl_status_t r = pb_emit(b, &gemm);

    return r == OVL_OK ? pb_emit(b, &rs) : r;
}

/*
 * naive (one chunk on stream 0) and collective (nvFuser's pattern for this
 * direction): chunk j's GEMM and then its reduce-scatter on stream j % k,
 * so that chunk j+1's GEMM overlaps chunk j's reduce-scatter. The side
 * streams' waits on READY form a loop of their own ahead of the first
 * chunk, as in all-gather + GEMM's collective. A REDUCE_SCATTER reads only
 * the rank's own P (NCCL moves the rows between the ranks), so no rank
 * waits on a peer's events.
 */
static ovl_status_t rs_emit(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t k = plan->nstreams;
    uint64_t mb = rs_block(p);
    ovl_status_t r = pb_emit_prologue(b);

    for (uint32_t s = 1; r == OVL_OK && s < k; s++)
        r = pb_emit_wait(b, s, p->rank, OVL_EV_READY);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0 = (uint64_t)j * plan->chunk_rows;
        uint64_t rows = mb - row0 < plan->chunk_rows ? mb - row0 : plan->chunk_rows;

        r = rs_emit_chunk(b, j % k, row0, rows);
    }
    if (r == OVL_OK && k > 1)
        r = pb_emit_joins(b, p->rank, 1, k - 1);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

ovl_status_t pb_rs_build(const ovl_plan_params_t *params, ovl_plan_t *ret_plan)
{
    builder_t b = {.next_event = OVL_EV_FIRST_FREE};
    ovl_plan_t plan = {0};
    topo_t topo = {0};
    ovl_status_t r;

    plan.params = *params;
    plan.params.kind = OVL_OP_GEMM_RS;
    plan.params.node_of = NULL; /* one node (rs_params_valid) */
    plan.nnodes = 1;
    plan.scratch_buf = OVL_BUF_P;
    r = pb_rs_scratch(params, &plan.scratch_bytes);
    if (r != OVL_OK)
        return r;
    rs_plan_shape(&plan);
    rs_buf_shapes(params, plan.bufs);
    b.plan = &plan;
    b.topo = &topo;
    r = rs_emit(&b, &plan);
    if (r == OVL_OK && b.max_stream + 1 != plan.nstreams)
        r = OVL_ERR_INTERNAL; /* rs_plan_shape and rs_emit disagree: a planner bug */
    if (r != OVL_OK) {
        free(b.instr);
        return r;
    }
    plan.nevents = b.max_event + 1;
    plan.ninstr = b.n;
    plan.instr = b.instr;
    pb_mark_used(&plan);
    /* a REDUCE_SCATTER is a collective call, which the executor never
     * captures (exec.c, replay_fits) */
    plan.replay = false;
    *ret_plan = plan;
    return OVL_OK;
}

/*
 * plan_rs.c: the planner's emitter of GEMM + reduce-scatter (plan.h,
 * docs/plans.md "GEMM + reduce-scatter"), on the builder of plan.c
 * (plan_internal.h). Pure code: no I/O, no logging.
 */
#include <stdlib.h>
#include <string.h>

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

/*
 * push's fixed streams (world 2 and up): 0 the client's, which reduces; 1
 * the copy engine's pushes; 2 and 3 the GEMMs, alternating, the second
 * headed by a short sleep (as ring's: plan.c, RING_SLEEP_NS), so that the
 * GEMM of the first destination starts first on every rank and the ranks
 * stay in step. At world 1 push is one GEMM and the reduction, on stream 0.
 */
#define PUSH_COPY_STREAM  1
#define PUSH_GEMM_STREAM0 2
#define PUSH_GEMM_STREAM1 3
#define PUSH_STREAMS      4
#define PUSH_SLEEP_NS     2000u
#define PUSH_CHUNKS       1 /* chunks of a block by default: a block a push */

/* Rows of one rank's block of the product. */
static uint64_t rs_block(const ovl_plan_params_t *p)
{
    return p->m / p->world;
}

/* push: P's rows, the receive slots (m) and the partials sent (one block
 * for each of the world - 1 peers): 2m - m/W (false where that wraps). */
static bool push_p_rows(const ovl_plan_params_t *p, uint64_t *ret)
{
    return !__builtin_add_overflow(p->m, p->m - rs_block(p), ret);
}

/* push: the event rank q records once its push of step t (to rank q + t),
 * chunk j, has left: numbered alike on every rank, so that the receiver
 * can name it. */
static uint32_t push_arrival_event(const ovl_plan_t *plan, uint32_t t, uint32_t j)
{
    return OVL_EV_FIRST_FREE + (t - 1) * plan->chunks + j;
}

const char *pb_rs_refusal(const ovl_plan_params_t *p)
{
    if (p->world == 0 || p->world > OVL_PLAN_MAX_WORLD || p->rank >= p->world)
        return "world or rank out of range";
    if (p->m == 0 || p->n == 0 || p->k == 0)
        return "m, n and k must be positive";
    if (p->m % p->world != 0)
        return "m is not a multiple of the world";
    /* one B, no gathered A: what this kind's plans are */
    if (ovl_plan_nb(p) != 1 || p->want_gathered)
        return "gemm_rs takes one B and no a_out";
    uint32_t nodes = pb_count_nodes(p);
    if (nodes == 0)
        return "node ids out of range or not dense";
    if (p->algo == OVL_ALGO_AUTO || !ovl_op_kind_takes_algo(OVL_OP_GEMM_RS, p->algo))
        return "an algorithm gemm_rs does not have (or auto, unresolved)";
    /* Across nodes, naive's and collective's REDUCE_SCATTERs are NCCL's
     * over the whole job, which moves the rows between nodes; push's
     * PUSHes are copies inside a node. */
    if (nodes > 1 && p->algo == OVL_ALGO_PUSH)
        return "push moves partials inside a node only: across nodes gemm_rs runs naive or "
               "collective (NCCL's reduce-scatter over the job)";
    if (nodes > 1 && p->shared_gpu)
        return "ranks share a GPU in a job across nodes: gemm_rs has no plan for that (naive "
               "and collective reduce by NCCL over every rank, which takes no two ranks of one "
               "GPU; push stays inside a node)";
    if (ovl_dtype_size(p->dtype) == 0 || (unsigned)p->allgather >= OVL_AG_PREF_COUNT ||
        (unsigned)p->reduce_op >= OVL_REDUCE_OP_COUNT)
        return "unknown dtype, all-gather preference or reduce_op";
    if (p->chunks > OVL_PLAN_MAX_CHUNKS || p->streams > OVL_PLAN_MAX_STREAMS)
        return "chunks or streams out of range";
    return NULL;
}

/* P's rows: m, or push's receive slots and the partials it sends (false
 * where that wraps). */
static bool rs_p_rows(const ovl_plan_params_t *p, uint64_t *ret)
{
    *ret = p->m;
    return p->algo == OVL_ALGO_PUSH ? push_p_rows(p, ret) : true;
}

/* P's bytes: its rows x n elements (OVL_ERR_LIMIT rather than a wrapped
 * size; once they fit, so does every row the emitters name). */
ovl_status_t pb_rs_scratch(const ovl_plan_params_t *p, uint64_t *ret)
{
    uint64_t row, rows;

    *ret = 0;
    if (!rs_p_rows(p, &rows) ||
        __builtin_mul_overflow(p->n, (uint64_t)ovl_dtype_size(p->dtype), &row) ||
        __builtin_mul_overflow(rows, row, ret))
        return OVL_ERR_LIMIT;
    return OVL_OK;
}

static void rs_buf_shapes(const ovl_plan_params_t *p, ovl_plan_buf_t *bufs)
{
    bufs[OVL_BUF_A] = (ovl_plan_buf_t){.rows = p->m, .cols = p->k};
    bufs[OVL_BUF_B] = p->transb ? (ovl_plan_buf_t){.rows = p->n, .cols = p->k}
                                : (ovl_plan_buf_t){.rows = p->k, .cols = p->n};
    bufs[OVL_BUF_C] = (ovl_plan_buf_t){.rows = rs_block(p), .cols = p->n};
    bufs[OVL_BUF_P] = (ovl_plan_buf_t){.cols = p->n};
    (void)rs_p_rows(p, &bufs[OVL_BUF_P].rows); /* pb_rs_scratch checked it */
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
    } else if (p->algo == OVL_ALGO_PUSH) {
        /* its streams are fixed (streams is not read) */
        c = p->chunks ? p->chunks : PUSH_CHUNKS;
        s = p->world > 1 ? PUSH_STREAMS : 1;
    }
    if (c > mb)
        c = (uint32_t)mb;
    plan->chunk_rows = mb / c + (mb % c != 0);
    plan->chunks = (uint32_t)(mb / plan->chunk_rows + (mb % plan->chunk_rows != 0));
    if (p->algo != OVL_ALGO_PUSH && s > plan->chunks)
        s = plan->chunks;
    plan->nstreams = s;
    plan->roles[0] = OVL_ROLE_CLIENT;
    for (uint32_t i = 1; i < s; i++)
        /* collective: each side stream reduces its chunks */
        plan->roles[i] = p->algo != OVL_ALGO_PUSH ? OVL_ROLE_COMM
                         : i == PUSH_COPY_STREAM  ? OVL_ROLE_COPY
                                                  : OVL_ROLE_COMPUTE;
}

/* Rows [row0, row0+rows) of chunk j of a block. */
static void rs_chunk(const ovl_plan_t *plan, uint32_t j, uint64_t *row0, uint64_t *rows)
{
    uint64_t mb = rs_block(&plan->params);

    *row0 = (uint64_t)j * plan->chunk_rows;
    *rows = mb - *row0 < plan->chunk_rows ? mb - *row0 : plan->chunk_rows;
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
    ovl_status_t r = pb_emit_prologue(b);

    for (uint32_t s = 1; r == OVL_OK && s < k; s++)
        r = pb_emit_wait(b, s, p->rank, OVL_EV_READY);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0, rows;

        rs_chunk(plan, j, &row0, &rows);
        r = rs_emit_chunk(b, j % k, row0, rows);
    }
    if (r == OVL_OK && k > 1)
        r = pb_emit_joins(b, p->rank, 1, k - 1);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/* push: GEMM rows [row0, row0+rows) of block d (the rows of A that make
 * it) into P at row `to`, on stream st. */
static ovl_status_t push_gemm(builder_t *b, uint32_t st, uint32_t d, uint64_t row0, uint64_t rows,
                              uint64_t to)
{
    const ovl_plan_params_t *p = &b->plan->params;
    ovl_instr_t gemm = {
        .kind = OVL_I_GEMM,
        .stream = st,
        .src = pb_own(b, OVL_BUF_A, (uint64_t)d * rs_block(p) + row0),
        .dst = pb_own(b, OVL_BUF_P, to),
        .b = pb_own(b, OVL_BUF_B, 0),
        .rows = rows,
        .n = p->n,
        .k = p->k,
        .nblocks = 1,
        .transb = p->transb,
    };

    return pb_emit(b, &gemm);
}

/*
 * push (produce-and-push, PyTorch's _pipelined_produce_and_all2all for this
 * direction; docs/plans.md): at step t = 1 .. W-1 rank r makes the partial
 * of block d = r + t (mod W), chunk by chunk, on the two GEMM streams in
 * turn, into its P at the step's rows; the copy stream pushes each chunk
 * into rank d's receive slot r once its GEMM is done and d is ready, and
 * records the chunk's arrival event (push_arrival_event(t, j)): at each
 * step every rank is written by one peer. Last, the own block's partial
 * goes straight into the own slot. Stream 0 then reduces chunk by chunk,
 * each after the own GEMM of the chunk and the pushes of it from every peer
 * (rank r - t at step t), summing the W slots in fp32 into C. Nobody reads
 * a peer's buffer, so no RELEASE: a rank's DONE follows its own pushes (the
 * copy stream's join), and a peer's DONE follows its reduction, which
 * follows every push into it.
 */
static ovl_status_t push_emit(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t w = p->world, me = p->rank, gemms = 0;
    uint64_t mb = rs_block(p), m = p->m;
    uint32_t own_ev[OVL_PLAN_MAX_CHUNKS];
    ovl_status_t r = pb_emit_prologue(b);

    /* events: the arrivals (numbered alike on every rank) come first */
    b->next_event += (w - 1) * plan->chunks;
    if (w > 1) {
        for (uint32_t s = PUSH_COPY_STREAM; r == OVL_OK && s <= PUSH_GEMM_STREAM1; s++)
            r = pb_emit_wait(b, s, me, OVL_EV_READY);
        if (r == OVL_OK)
            r = pb_emit_sleep(b, PUSH_GEMM_STREAM1, PUSH_SLEEP_NS);
    }
    for (uint32_t t = 1; r == OVL_OK && t < w; t++) {
        uint32_t d = (me + t) % w;

        r = pb_emit_wait(b, PUSH_COPY_STREAM, d, OVL_EV_READY);
        for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
            uint32_t gs = gemms % 2 ? PUSH_GEMM_STREAM1 : PUSH_GEMM_STREAM0;
            uint32_t ev = b->next_event++;
            uint64_t row0, rows, at;

            rs_chunk(plan, j, &row0, &rows);
            at = m + (uint64_t)(t - 1) * mb + row0;
            r = push_gemm(b, gs, d, row0, rows, at);
            if (r == OVL_OK)
                r = pb_emit_record(b, gs, ev);
            if (r == OVL_OK)
                r = pb_emit_wait(b, PUSH_COPY_STREAM, me, ev);
            if (r == OVL_OK) {
                ovl_instr_t push = {
                    .kind = OVL_I_PUSH,
                    .stream = PUSH_COPY_STREAM,
                    .src = pb_own(b, OVL_BUF_P, at),
                    .dst = {.buf = OVL_BUF_P, .rank = d, .row = (uint64_t)me * mb + row0},
                    .rows = rows,
                    .cols = p->n,
                };
                r = pb_emit(b, &push);
            }
            if (r == OVL_OK)
                r = pb_emit_record(b, PUSH_COPY_STREAM, push_arrival_event(plan, t, j));
        }
    }
    /* the own block, into the own slot */
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
        uint32_t gs = w == 1 ? 0 : gemms % 2 ? PUSH_GEMM_STREAM1 : PUSH_GEMM_STREAM0;
        uint64_t row0, rows;

        rs_chunk(plan, j, &row0, &rows);
        r = push_gemm(b, gs, me, row0, rows, (uint64_t)me * mb + row0);
        own_ev[j] = b->next_event++;
        if (r == OVL_OK && w > 1)
            r = pb_emit_record(b, gs, own_ev[j]);
    }
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0, rows;

        rs_chunk(plan, j, &row0, &rows);
        if (w > 1)
            r = pb_emit_wait(b, 0, me, own_ev[j]);
        for (uint32_t t = 1; r == OVL_OK && t < w; t++)
            r = pb_emit_wait(b, 0, (me + w - t) % w, push_arrival_event(plan, t, j));
        if (r == OVL_OK) {
            ovl_instr_t red = {
                .kind = OVL_I_REDUCE,
                .stream = 0,
                .src = pb_own(b, OVL_BUF_P, row0),
                .dst = pb_own(b, OVL_BUF_C, row0),
                .rows = rows,
                .cols = p->n,
                .nblocks = w,
                .stride = mb,
                .avg = p->reduce_op == OVL_REDUCE_AVG,
            };
            r = pb_emit(b, &red);
        }
    }
    if (r == OVL_OK && w > 1)
        r = pb_emit_joins(b, me, 1, plan->nstreams - 1);
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
    plan.scratch_buf = OVL_BUF_P;
    r = pb_rs_scratch(params, &plan.scratch_bytes);
    if (r != OVL_OK)
        return r;
    /* Across nodes the plan keeps its own copy of the topology, as
     * all-gather + GEMM's does; its instructions are those of one node
     * (the REDUCE_SCATTERs span the job). One node is NULL however it was
     * given. */
    plan.nnodes = pb_count_nodes(params);
    plan.params.node_of = NULL;
    if (plan.nnodes > 1) {
        uint32_t *copy = malloc((size_t)params->world * sizeof(*copy));

        if (!copy)
            return OVL_ERR_NOMEM;
        memcpy(copy, params->node_of, (size_t)params->world * sizeof(*copy));
        plan.params.node_of = copy;
    }
    rs_plan_shape(&plan);
    rs_buf_shapes(params, plan.bufs);
    b.plan = &plan;
    b.topo = &topo;
    r = params->algo == OVL_ALGO_PUSH ? push_emit(&b, &plan) : rs_emit(&b, &plan);
    if (r == OVL_OK && b.max_stream + 1 != plan.nstreams)
        r = OVL_ERR_INTERNAL; /* rs_plan_shape and rs_emit disagree: a planner bug */
    if (r != OVL_OK) {
        free(b.instr);
        free((void *)(uintptr_t)plan.params.node_of);
        return r;
    }
    plan.nevents = b.max_event + 1;
    plan.ninstr = b.n;
    plan.instr = b.instr;
    pb_mark_used(&plan);
    /* a REDUCE_SCATTER is a collective call, which the executor never
     * captures (exec.c, replay_fits); push's replay is not measured yet */
    plan.replay = false;
    *ret_plan = plan;
    return OVL_OK;
}

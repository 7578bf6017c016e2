/*
 * plan_rs.c: the planner's emitter of GEMM + reduce-scatter (plan.h,
 * docs/plans.md "GEMM + reduce-scatter"), on the builder of plan.c
 * (plan_build.h). Pure code: no I/O, no logging.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_build.h"
#include "plan_rs.h"

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
#define PUSH_CHUNKS       2 /* chunks of a block by default (docs/performance.md) */
/* ring (GEMM + reduce-scatter's, with accumulation): push's client and
 * copy streams and one GEMM stream, whose order is the ring's (each chunk
 * done before the next starts, so that its push leaves as early as it
 * can; two GEMM streams ran chunks side by side and held every push back:
 * docs/performance.md); its chunks of a block by default */
#define RING_GEMM_STREAM 2
#define RING_STREAMS     3
#define RING_CHUNKS      2
/* ... and 4 where the rank's inner dimension is at most RING_COMM_HEAVY_K
 * (a partial's copy then outlasts its GEMM, and smaller chunks hide more
 * of it) while a chunk's GEMM keeps RING_MIN_CHUNK_FLOP. On H200
 * (docs/performance.md): 16384x2048x8192 and 65536x1024x1024 at world 2
 * (k 1024 and 512; chunk GEMMs of 2^35 and 2^33 flop) ran 1.05x and 0.90x
 * the floor with 4 chunks, 1.14x and 1.00x with 2; at world 4 65536x1024x1024
 * (k 256, 2^31 flop) took 0.48 ms with 4 and 0.33 with 2; 4096^3 and
 * 8192^3 (k 2048 and 4096) lose with 4 */
#define RING_AUTO_MAX_WORLD 4 /* the largest world auto gives ring: measured */
#define RING_COMM_HEAVY_K   1024
#define RING_MIN_CHUNK_FLOP (1ull << 33)
#define RING_CHUNKS_COMM    4

/* Rows of one rank's block of the product. */
static uint64_t rs_block(const ovl_plan_params_t *p)
{
    return p->m / p->world;
}

/*
 * push across nodes (the rail scheme for this direction; docs/plans.md):
 * nodes of L ranks each, the ranks of each local index evenly spaced over
 * the nodes (node-major: L apart; round robin: 1). Its streams: push's, and
 * 4 for the node partials' reductions and the RAILs.
 */
#define RAILPUSH_COMM_STREAM 4
#define RAILPUSH_STREAMS     5

/* Whether push can run across the nodes p names (nnodes > 1): every node
 * has world/nnodes ranks, and rank q of local index l on node n is
 * rank_at(0, l) + n * step for one step (nonzero, maybe negative) for all l;
 * *ret_step. No allocation: arrays of the planner's largest world. */
static bool railpush_shape(const ovl_plan_params_t *p, uint32_t nnodes, int64_t *ret_step)
{
    uint32_t w = p->world, L = w / nnodes;
    uint32_t size[OVL_PLAN_MAX_WORLD] = {0}, base[OVL_PLAN_MAX_WORLD] = {0};
    int64_t first1 = -1;

    if (nnodes < 2 || w % nnodes != 0)
        return false;
    for (uint32_t q = 0; q < w; q++) {
        uint32_t n = p->node_of[q], l = size[n]++;

        if (l >= L)
            return false; /* a node of more than L ranks */
        if (n == 0)
            base[l] = q;
        if (n == 1 && l == 0)
            first1 = q;
    }
    int64_t step = first1 - (int64_t)base[0];
    if (step == 0)
        return false;
    for (uint32_t q = 0, seen[OVL_PLAN_MAX_WORLD] = {0}; q < w; q++) {
        uint32_t n = p->node_of[q], l = seen[n]++;

        if ((int64_t)q != (int64_t)base[l] + (int64_t)n * step)
            return false;
    }
    *ret_step = step;
    return true;
}

/* push: P's rows (false where they wrap). On one node the receive slots
 * (m) and the partials sent (one block for each of the world - 1 peers):
 * 2m - m/W. Across nodes (railpush_emit) the slots of the blocks this rank
 * reduces for its node (m), the partials it pushes to its node's peers
 * (W - nnodes blocks), the node partials it sends (nnodes - 1) and the
 * landing slots of the RAILs (W): (3W - 1) blocks. */
static bool push_p_rows(const ovl_plan_params_t *p, uint64_t *ret)
{
    uint64_t mb = rs_block(p);

    if (pb_count_nodes(p) > 1)
        return !__builtin_mul_overflow(3 * (uint64_t)p->world - 1, mb, ret);
    return !__builtin_add_overflow(p->m, p->m - mb, ret);
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
     * over the whole job, which moves the rows between nodes; push moves
     * them by the rail scheme, which takes even nodes. */
    int64_t step;
    if (nodes > 1 && p->algo == OVL_ALGO_PUSH && !railpush_shape(p, nodes, &step))
        return p->shared_gpu
                   ? "push across nodes takes nodes of equal size whose ranks of each local "
                     "index are evenly spaced (node-major, or round robin), and ranks share a "
                     "GPU, where naive and collective cannot run: gemm_rs has no plan for this "
                     "job"
                   : "push across nodes takes nodes of equal size whose ranks of each local "
                     "index are evenly spaced (node-major, or round robin): naive or collective "
                     "run on any";
    if (nodes > 1 && p->algo == OVL_ALGO_RING)
        return p->shared_gpu
                   ? "ring (of gemm_rs) runs in one node, its partials passed on by the copy "
                     "engine: across nodes where ranks share a GPU, push (the rail scheme)"
                   : "ring (of gemm_rs) runs in one node, its partials passed on by the copy "
                     "engine: across nodes push (the rail scheme, on even nodes), naive or "
                     "collective";
    if (nodes > 1 && p->shared_gpu && p->algo != OVL_ALGO_PUSH)
        return "ranks share a GPU in a job across nodes: naive and collective reduce by NCCL "
               "over every rank, which takes no two ranks of one GPU (push runs, by rail groups)";
    if (ovl_dtype_size(p->dtype) == 0 || (unsigned)p->allgather >= OVL_AG_PREF_COUNT ||
        (unsigned)p->reduce_op >= OVL_REDUCE_OP_COUNT)
        return "unknown dtype, all-gather preference or reduce_op";
    if (p->chunks > OVL_PLAN_MAX_CHUNKS || p->streams > OVL_PLAN_MAX_STREAMS)
        return "chunks or streams out of range";
    const char *why = pb_scaling_refusal(p);
    if (why)
        return why;
    /* ring's avg scales each product by 1/world at its GEMM, and a GEMM
     * adds its bias unscaled: the average would hold the sum of biases */
    if (p->sc.bias && p->algo == OVL_ALGO_RING && p->reduce_op == OVL_REDUCE_AVG && p->world > 1)
        return "ring adds each rank's bias at its GEMM, which avg does not divide: with a bias "
               "and avg, naive, collective or push";
    return NULL;
}

/* ring: the W - 1 receive slots (the partial that arrives at step t,
 * rows (t-1) mb) and the W - 1 partials it sends (step t's at (W-1+t) mb):
 * 2 (W - 1) mb rows, none at world 1 (one GEMM into C). */
static bool ring_p_rows(const ovl_plan_params_t *p, uint64_t *ret)
{
    return !__builtin_mul_overflow(2 * (uint64_t)(p->world - 1), rs_block(p), ret);
}

/* P's rows: m, or push's receive slots and the partials it sends, or
 * ring's (false where that wraps). */
static bool rs_p_rows(const ovl_plan_params_t *p, uint64_t *ret)
{
    *ret = p->m;
    return p->algo == OVL_ALGO_PUSH   ? push_p_rows(p, ret)
           : p->algo == OVL_ALGO_RING ? ring_p_rows(p, ret)
                                      : true;
}

/* P's bytes: its rows x n elements (OVL_ERR_LIMIT rather than a wrapped
 * size; once they fit, so does every row the emitters name). */
ovl_status_t pb_rs_scratch(const ovl_plan_params_t *p, uint64_t *ret)
{
    uint64_t row, rows;

    *ret = 0;
    if (!rs_p_rows(p, &rows) ||
        __builtin_mul_overflow(p->n, (uint64_t)ovl_dtype_size(ovl_plan_out_dtype(p)), &row) ||
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
    bufs[OVL_BUF_P] = (ovl_plan_buf_t){.cols = p->n, .scratch = true};
    (void)rs_p_rows(p, &bufs[OVL_BUF_P].rows); /* pb_rs_scratch checked it */
    pb_buf_types(p, bufs);
}

/* ring's chunks of a block by default (RING_CHUNKS, above). */
static uint32_t ring_chunks(const ovl_plan_params_t *p)
{
    uint64_t chunk_rows = rs_block(p) / RING_CHUNKS_COMM, flop;

    if (p->k > RING_COMM_HEAVY_K || __builtin_mul_overflow(2 * chunk_rows, p->n, &flop) ||
        __builtin_mul_overflow(flop, p->k, &flop))
        return RING_CHUNKS;
    return flop >= RING_MIN_CHUNK_FLOP ? RING_CHUNKS_COMM : RING_CHUNKS;
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
    } else if (p->algo == OVL_ALGO_PUSH && pb_count_nodes(p) > 1) {
        /* across nodes: a block a push, fixed streams */
        c = 1;
        s = RAILPUSH_STREAMS;
    } else if (p->algo == OVL_ALGO_PUSH || p->algo == OVL_ALGO_RING) {
        /* push's streams are fixed, and ring's (streams is not read) */
        c = p->chunks ? p->chunks : p->algo == OVL_ALGO_PUSH ? PUSH_CHUNKS : ring_chunks(p);
        s = p->world == 1 ? 1 : p->algo == OVL_ALGO_PUSH ? PUSH_STREAMS : RING_STREAMS;
    }
    pb_chunk_rows(p, mb, c, &plan->chunk_rows, &plan->chunks);
    bool pushlike = p->algo == OVL_ALGO_PUSH || p->algo == OVL_ALGO_RING;
    if (!pushlike && s > plan->chunks)
        s = plan->chunks;
    plan->nstreams = s;
    plan->roles[0] = OVL_ROLE_CLIENT;
    for (uint32_t i = 1; i < s; i++)
        /* collective: each side stream reduces its chunks; push and ring:
         * stream 1 copies, the others multiply (push 2 and 3, ring 2);
         * push across nodes: stream 4 the node partials and the RAILs */
        plan->roles[i] = !pushlike || i == RAILPUSH_COMM_STREAM ? OVL_ROLE_COMM
                         : i == PUSH_COPY_STREAM                ? OVL_ROLE_COPY
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
    return r == OVL_OK ? pb_emit_epilogue(b, p->rank, k) : r;
}

/* push and ring: GEMM rows [row0, row0+rows) of block d (the rows of A
 * that make it) into dst, on stream st; ring's: with avg the product
 * scaled by 1/world, with acc P's rows from row *acc added. */
static ovl_status_t rs_gemm(builder_t *b, uint32_t st, uint32_t d, uint64_t row0, uint64_t rows,
                            ovl_ref_t dst, const uint64_t *acc, bool avg)
{
    const ovl_plan_params_t *p = &b->plan->params;
    ovl_instr_t gemm = {
        .kind = OVL_I_GEMM,
        .stream = st,
        .src = pb_own(b, OVL_BUF_A, (uint64_t)d * rs_block(p) + row0),
        .dst = dst,
        .b = pb_own(b, OVL_BUF_B, 0),
        .rows = rows,
        .n = p->n,
        .k = p->k,
        .nblocks = 1,
        .transb = p->transb,
        .accumulate = acc != NULL,
        .acc = acc ? pb_own(b, OVL_BUF_P, *acc) : (ovl_ref_t){0},
        .avg = avg,
    };

    return pb_emit(b, &gemm);
}

/* push: the GEMM of rows [row0, +rows) of block d into P at row `to`. */
static ovl_status_t push_gemm(builder_t *b, uint32_t st, uint32_t d, uint64_t row0, uint64_t rows,
                              uint64_t to)
{
    return rs_gemm(b, st, d, row0, rows, pb_own(b, OVL_BUF_P, to), NULL, false);
}

/* push and ring: rows [row0, +rows) of block blk's partial made on GEMM
 * stream gs into the own P at row `at` (ring: with P's rows from *acc
 * added), then copied by the copy stream, once the GEMM is done, into
 * peer's P at peer_row. */
static ovl_status_t produce_and_push(builder_t *b, uint32_t gs, uint32_t blk, uint64_t row0,
                                     uint64_t rows, uint64_t at, const uint64_t *acc, bool avg,
                                     uint32_t peer, uint64_t peer_row)
{
    uint32_t ev = b->next_event++;
    ovl_status_t r = rs_gemm(b, gs, blk, row0, rows, pb_own(b, OVL_BUF_P, at), acc, avg);

    if (r == OVL_OK)
        r = pb_emit_record(b, gs, ev);
    if (r == OVL_OK)
        r = pb_emit_wait(b, PUSH_COPY_STREAM, b->plan->params.rank, ev);
    if (r == OVL_OK) {
        ovl_instr_t push = {
            .kind = OVL_I_PUSH,
            .stream = PUSH_COPY_STREAM,
            .src = pb_own(b, OVL_BUF_P, at),
            .dst = {.buf = OVL_BUF_P, .rank = peer, .row = peer_row},
            .rows = rows,
            .cols = b->plan->params.n,
        };
        r = pb_emit(b, &push);
    }
    return r;
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
            uint64_t row0, rows;

            rs_chunk(plan, j, &row0, &rows);
            r = produce_and_push(b, gs, d, row0, rows, m + (uint64_t)(t - 1) * mb + row0, NULL,
                                 false, d, (uint64_t)me * mb + row0);
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
    return r == OVL_OK ? pb_emit_epilogue(b, me, plan->nstreams) : r;
}

/*
 * ring (GEMM + reduce-scatter with accumulation; docs/plans.md): the
 * partial of a block travels round the ring and each rank adds its product
 * to it, so nothing is stacked and no reduction runs. At step t = 0 .. W-1
 * rank r works on block d = r - 1 - t (mod W), chunk by chunk on its one
 * GEMM stream (RING_GEMM_STREAM): at step 0 it
 * makes its partial of d; at step t > 0, once rank r - 1's push of that
 * chunk has arrived (arrival event (t, j), numbered as push's), it adds
 * its product to the partial received (a GEMM with beta 1, summing in
 * fp32); before the last step the sum goes into P's send rows and the copy
 * stream pushes it into rank r + 1's receive slot t + 1 (once r + 1 is
 * ready); at the last step d is r and the sum goes into C. With avg every
 * product is scaled by 1/W as it is made (alpha), so the stored sums stay
 * within the average's range. P (2 (W-1) mb rows): receive slot t at (t-1) mb, step t's
 * sum sent at (W-1+t) mb. Each partial is rounded to the dtype at every
 * hop (W - 1 roundings before C's; docs/plans.md, "Numbers").
 */
static ovl_status_t ringrs_emit(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t w = p->world, me = p->rank, gs = w == 1 ? 0 : RING_GEMM_STREAM;
    uint32_t next = (me + 1) % w, prev = (me + w - 1) % w;
    uint64_t mb = rs_block(p);
    /* avg: every product scaled by 1/W before it joins the running sum
     * (as NCCL's pre-multiplied average), so that the sums the hops store
     * stay within the average's range */
    bool avg = p->reduce_op == OVL_REDUCE_AVG && w > 1;
    ovl_status_t r = pb_emit_prologue(b);

    /* events: the arrivals (numbered alike on every rank) come first */
    b->next_event += (w - 1) * plan->chunks;
    if (w > 1) {
        for (uint32_t s = PUSH_COPY_STREAM; r == OVL_OK && s <= RING_GEMM_STREAM; s++)
            r = pb_emit_wait(b, s, me, OVL_EV_READY);
        if (r == OVL_OK)
            r = pb_emit_wait(b, PUSH_COPY_STREAM, next, OVL_EV_READY);
    }
    for (uint32_t t = 0; r == OVL_OK && t < w; t++) {
        uint32_t d = (me + 2 * w - 1 - t) % w;

        for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
            uint64_t row0, rows, acc;

            rs_chunk(plan, j, &row0, &rows);
            acc = (uint64_t)(t ? t - 1 : 0) * mb + row0;
            if (t > 0)
                r = pb_emit_wait(b, gs, prev, push_arrival_event(plan, t, j));
            if (r == OVL_OK && t + 1 < w) {
                r = produce_and_push(b, gs, d, row0, rows, (uint64_t)(w - 1 + t) * mb + row0,
                                     t ? &acc : NULL, avg, next, (uint64_t)t * mb + row0);
                if (r == OVL_OK)
                    r = pb_emit_record(b, PUSH_COPY_STREAM, push_arrival_event(plan, t + 1, j));
            } else if (r == OVL_OK) {
                r = rs_gemm(b, gs, d, row0, rows, pb_own(b, OVL_BUF_C, row0), t ? &acc : NULL, avg);
            }
        }
    }
    return r == OVL_OK ? pb_emit_epilogue(b, me, plan->nstreams) : r;
}

/*
 * push across nodes (the rail scheme for this direction; docs/plans.md):
 * rank r = (node N, local index l), L ranks a node, NN nodes. Each block b
 * has an aggregator on every node, the rank of b's local index there. At
 * step t = 1 .. L-1 rank r makes its partials of the NN blocks of local
 * index l + t (mod L), one per node, and pushes them into their
 * aggregator's slots (rank (N, l+t)); last it makes those of its own local
 * index into its own slots. Stream 4 then sums, for every node M, the L
 * slots of block (M, l) into that node's partial (N's own block into the
 * landing slot of r), and exchanges the others over the rail: RAIL i
 * sends the partial of node N + i to rank (N + i, l) and receives node
 * N - i's partial of r's block from rank (N - i, l), which lands in the
 * slot of that rank. Stream 0 sums the NN landing slots into C. P:
 *   [0, m)                       slot (M L + j): rank (N, j)'s partial of block (M, l)
 *   [m, + (W - NN) mb)           the partial pushed at step t for node M, at (t-1) NN + M
 *   [.., + (NN - 1) mb)          node N + i's partial, at i - 1
 *   [.., + W mb)                 landing slot q (the RAIL from rank q; r's own)
 * The node partials are rounded to the dtype once more than push's on one
 * node (docs/plans.md, "Numbers").
 */
static ovl_status_t railpush_emit(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    const topo_t *t = b->topo;
    uint32_t me = p->rank, N = p->node_of[me], l = t->local[me], L = t->size[N];
    uint32_t NN = t->nnodes, W = p->world, gemms = 0;
    uint64_t mb = rs_block(p), m = p->m;
    uint64_t o_base = m, s_base = m + (uint64_t)(W - NN) * mb, r2_base = s_base + (NN - 1) * mb;
    uint32_t own_ev[OVL_PLAN_MAX_WORLD];
    int64_t step = 0;
    ovl_status_t r = pb_emit_prologue(b);

    (void)railpush_shape(p, NN, &step); /* pb_rs_refusal took it */
    b->next_event += L - 1;             /* the arrivals, numbered alike on every rank */
    for (uint32_t st = PUSH_COPY_STREAM; r == OVL_OK && st < RAILPUSH_STREAMS; st++)
        r = pb_emit_wait(b, st, me, OVL_EV_READY);
    if (r == OVL_OK)
        r = pb_emit_sleep(b, PUSH_GEMM_STREAM1, PUSH_SLEEP_NS);
    for (uint32_t ts = 1; r == OVL_OK && ts < L; ts++) {
        uint32_t lp = (l + ts) % L, peer = pb_rank_at(t, N, lp);

        r = pb_emit_wait(b, PUSH_COPY_STREAM, peer, OVL_EV_READY);
        for (uint32_t M = 0; r == OVL_OK && M < NN; M++, gemms++) {
            uint32_t gs = gemms % 2 ? PUSH_GEMM_STREAM1 : PUSH_GEMM_STREAM0;

            r = produce_and_push(b, gs, pb_rank_at(t, M, lp), 0, mb,
                                 o_base + ((uint64_t)(ts - 1) * NN + M) * mb, NULL, false, peer,
                                 ((uint64_t)M * L + l) * mb);
        }
        if (r == OVL_OK)
            r = pb_emit_record(b, PUSH_COPY_STREAM, OVL_EV_FIRST_FREE + ts - 1);
    }
    /* the own local index's blocks, into the own slots */
    for (uint32_t M = 0; r == OVL_OK && M < NN; M++, gemms++) {
        uint32_t gs = gemms % 2 ? PUSH_GEMM_STREAM1 : PUSH_GEMM_STREAM0;

        r = push_gemm(b, gs, pb_rank_at(t, M, l), 0, mb, ((uint64_t)M * L + l) * mb);
        own_ev[M] = b->next_event++;
        if (r == OVL_OK)
            r = pb_emit_record(b, gs, own_ev[M]);
    }
    for (uint32_t M = 0; r == OVL_OK && M < NN; M++)
        r = pb_emit_wait(b, RAILPUSH_COMM_STREAM, me, own_ev[M]);
    for (uint32_t ts = 1; r == OVL_OK && ts < L; ts++)
        r = pb_emit_wait(b, RAILPUSH_COMM_STREAM, pb_rank_at(t, N, (l + L - ts) % L),
                         OVL_EV_FIRST_FREE + ts - 1);
    /* the node partials: the own block's into its landing slot, node N+i's
     * to send at i-1 */
    for (uint32_t i = 0; r == OVL_OK && i < NN; i++) {
        uint32_t M = (N + i) % NN;
        ovl_instr_t red = {
            .kind = OVL_I_REDUCE,
            .stream = RAILPUSH_COMM_STREAM,
            .src = pb_own(b, OVL_BUF_P, (uint64_t)M * L * mb),
            .dst = pb_own(b, OVL_BUF_P, i == 0 ? r2_base + me * mb : s_base + (i - 1) * mb),
            .rows = mb,
            .cols = p->n,
            .nblocks = L,
            .stride = mb,
        };
        r = pb_emit(b, &red);
    }
    for (uint32_t i = 1; r == OVL_OK && i < NN; i++) {
        uint32_t pair[2] = {pb_rank_at(t, (N + i) % NN, l), pb_rank_at(t, (N + NN - i) % NN, l)};
        uint32_t at = b->npeers;

        r = pb_add_peers(b, pair, 2);
        if (r == OVL_OK) {
            ovl_instr_t rail = {
                .kind = OVL_I_RAIL,
                .stream = RAILPUSH_COMM_STREAM,
                .method = OVL_AG_NCCL_RAIL,
                .src = pb_own(b, OVL_BUF_P, s_base + (i - 1) * mb),
                .dst = pb_own(b, OVL_BUF_P, r2_base),
                .rows = mb,
                .cols = p->n,
                .stride = mb,
                .peers = at,
                .nsend = 1,
                .nrecv = 1,
            };
            r = pb_emit(b, &rail);
        }
    }
    if (r == OVL_OK)
        r = pb_emit_joins(b, me, 1, RAILPUSH_STREAMS - 1);
    if (r == OVL_OK) {
        /* the NN landing slots of this local index, evenly spaced */
        uint32_t lo = step > 0 ? pb_rank_at(t, 0, l) : pb_rank_at(t, NN - 1, l);
        uint64_t gap = (uint64_t)(step > 0 ? step : -step);
        ovl_instr_t red = {
            .kind = OVL_I_REDUCE,
            .stream = 0,
            .src = pb_own(b, OVL_BUF_P, r2_base + (uint64_t)lo * mb),
            .dst = pb_own(b, OVL_BUF_C, 0),
            .rows = mb,
            .cols = p->n,
            .nblocks = NN,
            .stride = gap * mb,
            .avg = p->reduce_op == OVL_REDUCE_AVG,
        };
        r = pb_emit(b, &red);
    }
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/*
 * auto (docs/plans.md, "auto"; the figures: docs/performance.md). On one
 * node with a GPU per rank, ring in bf16 and fp32 up to world 4: on 2 and 4
 * H200 it was the best or within 3% of the best on every measured shape,
 * and it stacks nothing; push in fp16 (ring's running sums are stored in
 * the dtype between hops, and fp16's range is small) and above world 4
 * (not measured).
 * Where ranks share a GPU push (world 4 on 2 GPUs ran push in 0.46 ms and
 * ring in 0.68 ms; naive and collective cannot run there, no NCCL between
 * the ranks). Across nodes push by the rail scheme where the nodes are
 * even, else naive (and push where ranks share a GPU, which the planner
 * then refuses in words).
 */
ovl_algo_t pb_rs_choose(const ovl_plan_params_t *p, const char **why)
{
    uint32_t nodes = pb_count_nodes(p);
    int64_t step;

    if (nodes > 1) {
        if (railpush_shape(p, nodes, &step)) {
            *why = "across even nodes: push, by the rail scheme";
            return OVL_ALGO_PUSH;
        }
        if (p->shared_gpu) {
            *why = "ranks share a GPU across nodes: push is the one that could run";
            return OVL_ALGO_PUSH;
        }
        *why = "across uneven nodes: naive (push's rail scheme takes even nodes)";
        return OVL_ALGO_NAIVE;
    }
    if (p->shared_gpu) {
        *why = "ranks share a GPU: push, whose copies need no NCCL and run side by side";
        return OVL_ALGO_PUSH;
    }
    if (ovl_plan_out_dtype(p) == OVL_DTYPE_FP16) {
        *why = "fp16: push, which sums the partials in fp32 (ring stores its running sums in "
               "fp16 between hops, whose range a sum may pass)";
        return OVL_ALGO_PUSH;
    }
    if (p->sc.bias && p->reduce_op == OVL_REDUCE_AVG) {
        *why = "a bias with avg: push (ring adds each rank's bias undivided)";
        return OVL_ALGO_PUSH;
    }
    if (p->world > RING_AUTO_MAX_WORLD) {
        *why = "over 4 ranks: push (ring is measured up to world 4)";
        return OVL_ALGO_PUSH;
    }
    *why = "one node, a GPU per rank: ring, the fastest measured (docs/performance.md)";
    return OVL_ALGO_RING;
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
    r = pb_keep_topology(&plan, params, pb_count_nodes(params));
    if (r != OVL_OK)
        return r;
    rs_plan_shape(&plan);
    rs_buf_shapes(params, plan.bufs);
    b.plan = &plan;
    b.topo = &topo;
    if (params->algo == OVL_ALGO_PUSH && plan.nnodes > 1) {
        r = pb_topo_make(params, &topo);
        if (r == OVL_OK)
            r = railpush_emit(&b, &plan);
    } else {
        r = params->algo == OVL_ALGO_PUSH   ? push_emit(&b, &plan)
            : params->algo == OVL_ALGO_RING ? ringrs_emit(&b, &plan)
                                            : rs_emit(&b, &plan);
    }
    if (r == OVL_OK && b.max_stream + 1 != plan.nstreams)
        r = OVL_ERR_INTERNAL; /* rs_plan_shape and the emitter disagree: a planner bug */
    pb_topo_free(&topo);
    if (r != OVL_OK) {
        free(b.instr);
        free(b.peers);
        free((void *)(uintptr_t)plan.params.node_of);
        return r;
    }
    pb_finish(&b, &plan);
    /* a REDUCE_SCATTER is a collective call, which the executor never
     * captures (exec.c, replay_fits); push's replay is not measured yet */
    plan.replay = false;
    *ret_plan = plan;
    return OVL_OK;
}

/*
 * plan.c: the planner (see plan.h and docs/plans.md): all-gather + GEMM's
 * emitters, the entry points that pick a kind's (GEMM + reduce-scatter's
 * are in plan_rs.c; the builder both use in plan_build.c), and the dump
 * format. Every algorithm is one emit_* function
 * that appends instructions to a growing array; the rules they share
 * (chunking, the prologue, joins, the epilogue, how A is gathered, where
 * each row lives) live in helpers so that every program has the same
 * shape. Pure code: no I/O, no logging.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_build.h"
#include "plan_rs.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Chunks and streams when the caller asks for 0 (docs/plans.md); naive's
 * and collective's are plan_build.h's, shared with plan_rs.c. */
#define RING_CHUNKS   1
#define RING_NARROW_N 1024 /* n at or under which ring pulls in two chunks */
/*
 * An op is worth replaying from a graph (ovl_plan_t.replay) while its GEMMs
 * on one rank (all its gathered rows, every B) do less than this: about
 * 100 us on an H100. Replay saves host time per op (its issue, 8 to 12 us
 * at world 1 against 20 to 25 called one by one, and more at larger
 * worlds) and costs GPU time: at world 1 on one H100 under MPS a replayed
 * op took 9 to 12 us more than the same op issued call by call (4096^3:
 * 0.206 to 0.209 ms against 0.197; 2048 x 8192 x 8192: 0.409 to 0.410
 * against 0.395 to 0.403; bench/results/2026-11-24-replay-ab-2f49a51-h100.md).
 * Below it, ovld's
 * issue would set the pace of ops issued call by call; above it, the GPU
 * does.
 */
#define REPLAY_MAX_GEMM_FLOP (1ull << 36)
/* ring's fixed streams: 0 client, 1 copy engine, 2 and 3 GEMMs; across
 * nodes 4 the RAILs (1 where the rank pulls nothing: ring_comm_stream) */
#define RING_COPY_STREAM  1
#define RING_GEMM_STREAM0 2
#define RING_GEMM_STREAM1 3
#define RING_STREAMS      4
#define RING_COMM_STREAM  4
/*
 * ring's head-of-stream sleep on the second GEMM stream. It only has to last
 * longer than the host takes to enqueue the first own-shard GEMM on the other
 * stream, so that the GPU starts the two streams in program order on every
 * rank (PyTorch PR 137836); a few microseconds cost nothing next to a GEMM.
 */
#define RING_SLEEP_NS 2000u
/*
 * From this world on, ring's copy engine pushes (each rank writes its shard
 * into the peers' G) instead of pulling (each rank reads the peers'). On
 * 4 x H200 (NVLink, every pair NV18) a gather by pulls in ring order moved
 * 109 to 122 GB/s into each GPU and by pushes 331 to 362; ring with pulls
 * took 2.7x the floor at 16384x8192x2048, with pushes 1.18x. At world 2
 * both move about 362 GB/s and ring is as fast either way (ovl-gather-lab,
 * bench/results/2026-11-28-gather-lab-h200x4.md), so world 2 keeps pulls.
 */
#define RING_PUSH_MIN_WORLD 3u

/* AUTO's thresholds (docs/plans.md): below them overlap cannot pay off. */
#define AUTO_MIN_ROWS  512u
#define AUTO_MIN_FLOPS (UINT64_C(1) << 27)

/* ------------------------------------------------------------ topology */

/*
 * The rail scheme (docs/plans.md, "ring across nodes"): rank x (node N,
 * local index l) sends its shard to the rank of local index l mod L' of
 * every other node (L' its ranks), so each remote shard reaches every node
 * once. rail_send writes into out the ranks x sends to (node order);
 * rail_recv the ranks x receives from, those whose local index is l modulo
 * N's ranks (node order, then local order: the order of arrival the GEMMs
 * keep). Both return the count.
 */
static uint32_t rail_send(const topo_t *t, uint32_t x, uint32_t *out)
{
    uint32_t n = 0;

    for (uint32_t nd = 0; nd < t->nnodes; nd++)
        if (nd != pb_node_of(t, x))
            out[n++] = pb_rank_at(t, nd, t->local[x] % t->size[nd]);
    return n;
}

static uint32_t rail_recv(const topo_t *t, uint32_t x, uint32_t *out)
{
    uint32_t n = 0, own = pb_node_of(t, x);

    for (uint32_t nd = 0; nd < t->nnodes; nd++)
        for (uint32_t i = 0; nd != own && i < t->size[nd]; i++)
            if (i % t->size[own] == t->local[x])
                out[n++] = pb_rank_at(t, nd, i);
    return n;
}

/* The root of q in a union-find forest over parent (path halving). */
static uint32_t uf_root(uint32_t *parent, uint32_t q)
{
    while (parent[q] != q) {
        parent[q] = parent[parent[q]];
        q = parent[q];
    }
    return q;
}

ovl_status_t ovl_plan_rail_groups(uint32_t world, const uint32_t *node_of, uint32_t *group_of,
                                  uint32_t *pos, uint32_t *ret_ngroups)
{
    ovl_plan_params_t p = {.world = world, .node_of = node_of};
    uint32_t *parent, *list, *count, ngroups = 0;
    topo_t t;
    ovl_status_t st;

    if (world == 0 || world > OVL_PLAN_MAX_WORLD || !node_of || !group_of || !pos || !ret_ngroups ||
        pb_count_nodes(&p) == 0)
        return OVL_ERR_INVALID;
    st = pb_topo_make(&p, &t);
    if (st != OVL_OK)
        return st;
    parent = calloc(3 * (size_t)world, sizeof(*parent));
    if (!parent) {
        pb_topo_free(&t);
        return OVL_ERR_NOMEM;
    }
    list = parent + world;
    count = list + world;
    for (uint32_t q = 0; q < world; q++)
        parent[q] = q;
    /* an edge for every send: its receive is the other side of the rule */
    for (uint32_t q = 0; q < world; q++) {
        uint32_t n = rail_send(&t, q, list);

        for (uint32_t i = 0; i < n; i++) {
            uint32_t a = uf_root(parent, q), b = uf_root(parent, list[i]);

            if (a != b)
                parent[a > b ? a : b] = a < b ? a : b; /* the lower rank roots it */
        }
    }
    /* groups numbered in the order of their lowest ranks; each rank's place
     * in its group in rank order */
    for (uint32_t q = 0; q < world; q++) {
        uint32_t root = uf_root(parent, q);

        if (root == q)
            group_of[q] = ngroups++;
        else
            group_of[q] = group_of[root]; /* root < q: numbered already */
        pos[q] = count[group_of[q]]++;
    }
    *ret_ngroups = ngroups;
    free(parent);
    pb_topo_free(&t);
    return OVL_OK;
}

/* ------------------------------------------------------------ builder */

/* All-gathers shard rows [row0, row0+rows) of every rank into G. NCCL's
 * all-gather lays whole shards out back to back, as G holds them; a chunk
 * of each lands in its own block, which grouped send/recv can express and
 * an all-gather cannot. */
static ovl_status_t emit_allgather(builder_t *b, uint32_t stream, uint64_t row0, uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    bool whole = row0 == 0 && rows == p->m;
    ovl_instr_t in = {
        .kind = OVL_I_ALLGATHER,
        .stream = stream,
        .method = whole ? OVL_AG_NCCL_ALLGATHER : OVL_AG_NCCL_SENDRECV,
        .src = pb_own(b, OVL_BUF_A, row0),
        .dst = pb_own(b, OVL_BUF_G, row0),
        .rows = rows,
        .cols = p->k,
        .stride = p->m,
    };

    return pb_emit(b, &in);
}

/* Copies rank peer's shard rows [row0, row0+rows) into its block of G. */
static ovl_status_t emit_pull(builder_t *b, uint32_t stream, uint32_t peer, uint64_t row0,
                              uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    ovl_instr_t in = {
        .kind = OVL_I_PULL,
        .stream = stream,
        .src = {.buf = OVL_BUF_A, .rank = peer, .row = row0},
        .dst = pb_own(b, OVL_BUF_G, (uint64_t)peer * p->m + row0),
        .rows = rows,
        .cols = p->k,
    };

    return pb_emit(b, &in);
}

/* Copies the own shard's rows [row0, row0+rows) into the own block of
 * peer's G. */
static ovl_status_t emit_push(builder_t *b, uint32_t stream, uint32_t peer, uint64_t row0,
                              uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    ovl_instr_t in = {
        .kind = OVL_I_PUSH,
        .stream = stream,
        .src = pb_own(b, OVL_BUF_A, row0),
        .dst = {.buf = OVL_BUF_G, .rank = peer, .row = (uint64_t)p->rank * p->m + row0},
        .rows = rows,
        .cols = p->k,
    };

    return pb_emit(b, &in);
}

/* Copies block q's rows [row0, row0+rows) of peer's G (rows peer received
 * from rank q on another node) into the same rows of the own G. */
static ovl_status_t emit_pull_g(builder_t *b, uint32_t stream, uint32_t peer, uint32_t q,
                                uint64_t row0, uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    uint64_t row = (uint64_t)q * p->m + row0;
    ovl_instr_t in = {
        .kind = OVL_I_PULL,
        .stream = stream,
        .src = {.buf = OVL_BUF_G, .rank = peer, .row = row},
        .dst = pb_own(b, OVL_BUF_G, row),
        .rows = rows,
        .cols = p->k,
    };

    return pb_emit(b, &in);
}

/* Chunk rows [row0, row0+rows) of the own shard go to the nsend ranks
 * listed at plan->peers[peers], and those of the nrecv ranks listed after
 * them land in their blocks of G: one RAIL (every rank issues the same). */
static ovl_status_t emit_rail(builder_t *b, uint32_t stream, uint32_t peers, uint32_t nsend,
                              uint32_t nrecv, uint64_t row0, uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    ovl_instr_t in = {
        .kind = OVL_I_RAIL,
        .stream = stream,
        .method = OVL_AG_NCCL_RAIL,
        .src = pb_own(b, OVL_BUF_A, row0),
        .dst = pb_own(b, OVL_BUF_G, row0),
        .rows = rows,
        .cols = p->k,
        .stride = p->m,
        .peers = peers,
        .nsend = nsend,
        .nrecv = nrecv,
    };

    return pb_emit(b, &in);
}

/*
 * C rows of blocks [block0, block0+nblocks), shard rows [row0, row0+rows),
 * from `from`: G, or A (the own shard, block0 being the rank). Whole
 * consecutive blocks are rows in a row, so they are one taller GEMM; other
 * multi-block ranges are nblocks GEMMs m rows apart.
 */
static ovl_status_t emit_gemm(builder_t *b, uint32_t stream, ovl_buf_t from, uint32_t block0,
                              uint32_t nblocks, uint64_t row0, uint64_t rows)
{
    const ovl_plan_params_t *p = &b->plan->params;
    uint64_t crow = (uint64_t)block0 * p->m + row0; /* <= world*m: no wrap (params_valid) */
    ovl_status_t r = OVL_OK;

    /* one GEMM per B, in B order, on the same stream: the rows are read
     * once gathered, whatever B multiplies them */
    for (uint32_t i = 0; r == OVL_OK && i < ovl_plan_nb(p); i++) {
        ovl_instr_t in = {
            .kind = OVL_I_GEMM,
            .stream = stream,
            .src = pb_own(b, from, from == OVL_BUF_A ? row0 : crow),
            .dst = pb_own(b, ovl_buf_c(i), crow),
            .b = pb_own(b, ovl_buf_b(i), 0),
            .rows = rows,
            .n = ovl_plan_bn(p, i),
            .k = p->k,
            .nblocks = nblocks,
            .stride = nblocks > 1 ? p->m : 0,
            .transb = p->transb,
        };

        if (nblocks > 1 && row0 == 0 && rows == p->m) {
            in.rows = p->m * nblocks;
            in.nblocks = 1;
            in.stride = 0;
        }
        r = pb_emit(b, &in);
    }
    return r;
}

/* Rows of chunk j: every chunk has chunk_rows rows but the last, which has
 * what is left. */
static void chunk_range(const ovl_plan_t *plan, uint32_t j, uint64_t *row0, uint64_t *rows)
{
    uint64_t m = plan->params.m;

    *row0 = (uint64_t)j * plan->chunk_rows;
    *rows = m - *row0 < plan->chunk_rows ? m - *row0 : plan->chunk_rows;
}

/*
 * Whether A is gathered by NCCL collectives (ALLGATHER) rather than by
 * copy-engine pulls (docs/plans.md, "How A is gathered"). NCCL moves rows
 * only as one dense piece; with one rank there is nobody to talk to, and a
 * local copy does as well.
 */
static bool gather_by_nccl(const ovl_plan_params_t *p)
{
    if (p->strided || p->shared_gpu)
        return false;
    switch (p->allgather) {
    case OVL_AG_NCCL:
        return true;
    case OVL_AG_COPY:
        return false;
    default:
        return p->world > 1;
    }
}

/* Whether the plan for p reads or writes G: every algorithm but ring alone,
 * which multiplies the shard in place, gathers A (ring alone with a_out
 * still copies the shard there). */
static bool uses_gathered(const ovl_plan_params_t *p)
{
    return p->algo != OVL_ALGO_RING || p->world > 1 || p->want_gathered;
}

/*
 * naive and collective (nvFuser host-IR overlap): chunk j is gathered and
 * then multiplied on stream j % k, so chunk j+1's gather overlaps chunk j's
 * GEMM (naive is the case of one chunk on one stream). The side streams'
 * waits on READY form a loop of their own ahead of the first transfer:
 * interleaved with the transfers they serialize the streams and the overlap
 * is lost (nvFuser PR 4217).
 *
 * A chunk is gathered by one ALLGATHER (NCCL), or by the copy engine: a
 * PULL of every rank's rows (the own first, then in ring order, so that at
 * each step the ranks read from different peers). That gather says its
 * ordering itself: each pulling stream first waits for every peer's READY,
 * records a release event after its last pull, and stream 0 waits for
 * every peer's release events before DONE, since a rank's client may
 * overwrite A as soon as DONE rings.
 */
static ovl_status_t emit_chunked(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t k = plan->nstreams, w = p->world;
    bool nccl = gather_by_nccl(p);
    bool peers = !nccl && w > 1; /* pulls from other ranks */
    uint32_t rel_more = 0;       /* release event of stream 1; stream s's is rel_more + s - 1 */
    ovl_status_t r;

    r = pb_emit_prologue(b);
    for (uint32_t s = 1; r == OVL_OK && s < k; s++)
        r = pb_emit_wait(b, s, p->rank, OVL_EV_READY);
    if (peers) {
        for (uint32_t s = 0; s < k; s++)
            for (uint32_t t = 1; r == OVL_OK && t < w; t++)
                r = pb_emit_wait(b, s, (p->rank + t) % w, OVL_EV_READY);
        rel_more = b->next_event;
        b->next_event += k - 1;
    }
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint32_t s = j % k;
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        if (nccl) {
            r = emit_allgather(b, s, row0, rows);
        } else {
            for (uint32_t t = 0; r == OVL_OK && t < w; t++)
                r = emit_pull(b, s, (p->rank + t) % w, row0, rows);
            /* the last chunk on stream s: s reads no shard after it */
            if (r == OVL_OK && peers && j + k >= plan->chunks)
                r = pb_emit_record(b, s, s == 0 ? OVL_EV_RELEASE : rel_more + s - 1);
        }
        if (r == OVL_OK)
            r = emit_gemm(b, s, OVL_BUF_G, 0, w, row0, rows);
    }
    if (r == OVL_OK && k > 1)
        r = pb_emit_joins(b, p->rank, 1, k - 1);
    for (uint32_t t = 1; r == OVL_OK && peers && t < w; t++)
        for (uint32_t s = 0; r == OVL_OK && s < k; s++)
            r = pb_emit_wait(b, 0, (p->rank + t) % w, s == 0 ? OVL_EV_RELEASE : rel_more + s - 1);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/* ring on one rank: no peers, so no side streams; the own shard's GEMMs and
 * (for a_out) its local copy run on the client's stream. */
static ovl_status_t emit_ring_single(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    ovl_status_t r;

    r = pb_emit_prologue(b);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_gemm(b, 0, OVL_BUF_A, p->rank, 1, row0, rows);
    }
    if (r == OVL_OK && p->want_gathered)
        r = emit_pull(b, 0, p->rank, 0, p->m);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/* Ring across nodes: whether the rank pulls anything (its node has other
 * ranks, or the client wants the own block of a_out), and so has a copy
 * stream; the stream of its RAILs, 4 after the copy stream and the GEMM
 * streams, else 1. */
static bool ring_pulls(const ovl_plan_params_t *p, const topo_t *t)
{
    return t->size[pb_node_of(t, p->rank)] > 1 || p->want_gathered;
}

static uint32_t ring_comm_stream(const ovl_plan_params_t *p, const topo_t *t)
{
    return ring_pulls(p, t) ? RING_COMM_STREAM : RING_COPY_STREAM;
}

/*
 * ring across nodes: the rail scheme of ByteDance Flux's inter-node AG-GEMM
 * (docs/plans.md, "ring across nodes"). Rank r (node N, local index l, L
 * ranks on N) multiplies its own shard first, straight from A. Its comm
 * stream issues one RAIL per chunk: the chunk of A_r to the rank of local
 * index l mod L' of every other node, and the chunks of the remote ranks
 * assigned to r (local index = l mod L) into their blocks of G; after each
 * RAIL it records that chunk's arrival event (ovl_plan_arrival_event), so
 * each remote shard crosses the network once per node. The copy stream
 * pulls the node's shards from the peers' A in ring order, as the ring
 * inside a node does, and then, chunk by chunk, the rows each peer
 * received from its G once the peer's arrival event says they are there.
 * GEMMs run in that order, own, the node's, then the remote shards in
 * order of arrival (those r received first, then those pulled), each as
 * soon as its rows are there, alternating on the two GEMM streams behind
 * the head-of-stream sleep. RELEASE (recorded after the last pull) tells
 * the node's peers that r reads neither their A nor their G any more; DONE
 * waits for every peer's RELEASE and, through the joins, for r's own RAILs:
 * its sends have left A and its receives have landed.
 */
static ovl_status_t emit_ring_nodes(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    const topo_t *t = b->topo;
    uint32_t me = p->rank, nd = pb_node_of(t, me), L = t->size[nd], l = t->local[me];
    uint32_t comm = ring_comm_stream(p, t), nsend, nrecv, *list = t->scratch;
    bool pulls = ring_pulls(p, t);
    uint32_t gemms = 0; /* GEMMs issued: picks the GEMM stream */
    ovl_status_t r;

    r = pb_emit_prologue(b);
    /* every side stream waits for READY (stream 1 is the comm stream where
     * the rank pulls nothing) */
    for (uint32_t s = 1; r == OVL_OK && s <= RING_GEMM_STREAM1; s++)
        r = pb_emit_wait(b, s, me, OVL_EV_READY);
    if (r == OVL_OK && pulls)
        r = pb_emit_wait(b, comm, me, OVL_EV_READY);
    if (r == OVL_OK)
        r = pb_emit_sleep(b, RING_GEMM_STREAM1, RING_SLEEP_NS);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_gemm(b, RING_GEMM_STREAM0, OVL_BUF_A, me, 1, row0, rows);
    }
    if (r == OVL_OK && p->want_gathered)
        r = emit_pull(b, RING_COPY_STREAM, me, 0, p->m);

    /* The rail: every rank issues one RAIL per chunk, all of them ahead of
     * anything that waits on a peer, so that no rank's issue waits on
     * another's across them. The arrival events are numbered alike on
     * every rank (the peers name them); a rank that receives nothing
     * records none. */
    nsend = rail_send(t, me, list);
    if (r == OVL_OK)
        r = pb_add_peers(b, list, nsend);
    nrecv = rail_recv(t, me, list);
    if (r == OVL_OK)
        r = pb_add_peers(b, list, nrecv);
    b->next_event += plan->chunks;
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_rail(b, comm, 0, nsend, nrecv, row0, rows);
        if (r == OVL_OK && nrecv > 0)
            r = pb_emit_record(b, comm, ovl_plan_arrival_event(j));
    }

    /* the node's shards, pulled from the peers' A in ring order */
    for (uint32_t i = 1; r == OVL_OK && i < L; i++) {
        uint32_t peer = pb_rank_at(t, nd, (l + i) % L);

        r = pb_emit_wait(b, RING_COPY_STREAM, peer, OVL_EV_READY);
        for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
            uint32_t gs = gemms % 2 ? RING_GEMM_STREAM1 : RING_GEMM_STREAM0;
            uint32_t ev = b->next_event++;
            uint64_t row0, rows;

            chunk_range(plan, j, &row0, &rows);
            r = emit_pull(b, RING_COPY_STREAM, peer, row0, rows);
            if (r == OVL_OK)
                r = pb_emit_record(b, RING_COPY_STREAM, ev);
            if (r == OVL_OK)
                r = pb_emit_wait(b, gs, me, ev);
            if (r == OVL_OK)
                r = emit_gemm(b, gs, OVL_BUF_G, peer, 1, row0, rows);
        }
    }

    /* the remote shards, chunk by chunk in order of arrival: those this
     * rank received (after its own arrival event), then those each peer
     * received, pulled from the peer's G after the peer's arrival event */
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        bool waited[2] = {false, false}; /* a GEMM stream waited for the arrival */
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        for (uint32_t i = 0; r == OVL_OK && i < nrecv; i++, gemms++) {
            uint32_t gs = gemms % 2 ? RING_GEMM_STREAM1 : RING_GEMM_STREAM0;
            uint32_t q = b->peers[nsend + i]; /* this rank's receive list */

            if (!waited[gs - RING_GEMM_STREAM0])
                r = pb_emit_wait(b, gs, me, ovl_plan_arrival_event(j));
            waited[gs - RING_GEMM_STREAM0] = true;
            if (r == OVL_OK)
                r = emit_gemm(b, gs, OVL_BUF_G, q, 1, row0, rows);
        }
        for (uint32_t i = 1; r == OVL_OK && i < L; i++) {
            uint32_t peer = pb_rank_at(t, nd, (l + i) % L);
            uint32_t n = rail_recv(t, peer, list);

            if (n > 0)
                r = pb_emit_wait(b, RING_COPY_STREAM, peer, ovl_plan_arrival_event(j));
            for (uint32_t x = 0; r == OVL_OK && x < n; x++, gemms++) {
                uint32_t gs = gemms % 2 ? RING_GEMM_STREAM1 : RING_GEMM_STREAM0;
                uint32_t ev = b->next_event++;

                r = emit_pull_g(b, RING_COPY_STREAM, peer, list[x], row0, rows);
                if (r == OVL_OK)
                    r = pb_emit_record(b, RING_COPY_STREAM, ev);
                if (r == OVL_OK)
                    r = pb_emit_wait(b, gs, me, ev);
                if (r == OVL_OK)
                    r = emit_gemm(b, gs, OVL_BUF_G, list[x], 1, row0, rows);
            }
        }
    }
    if (r == OVL_OK && L > 1)
        r = pb_emit_record(b, RING_COPY_STREAM, OVL_EV_RELEASE);
    if (r == OVL_OK)
        r = pb_emit_joins(b, me, 1, plan->nstreams - 1);
    for (uint32_t i = 1; r == OVL_OK && i < L; i++)
        r = pb_emit_wait(b, 0, pb_rank_at(t, nd, (l + i) % L), OVL_EV_RELEASE);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/* The head of ring in one node, pulling or pushing: the side streams wait
 * for the own READY, the SLEEP heads GEMM stream 1, the own shard's GEMMs go
 * on GEMM stream 0 (counted in *gemms), and with a_out the copy stream
 * copies the own block. */
static ovl_status_t emit_ring_head(builder_t *b, const ovl_plan_t *plan, uint32_t *gemms)
{
    const ovl_plan_params_t *p = &plan->params;
    ovl_status_t r = pb_emit_prologue(b);

    for (uint32_t s = RING_COPY_STREAM; r == OVL_OK && s <= RING_GEMM_STREAM1; s++)
        r = pb_emit_wait(b, s, p->rank, OVL_EV_READY);
    if (r == OVL_OK)
        r = pb_emit_sleep(b, RING_GEMM_STREAM1, RING_SLEEP_NS);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, (*gemms)++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_gemm(b, RING_GEMM_STREAM0, OVL_BUF_A, p->rank, 1, row0, rows);
    }
    if (r == OVL_OK && p->want_gathered)
        r = emit_pull(b, RING_COPY_STREAM, p->rank, 0, p->m);
    return r;
}

/*
 * ring of one node from RING_PUSH_MIN_WORLD ranks on: as emit_ring, but the
 * copy stream writes the own shard into the peers' G in ring order (r+1,
 * r+2, ...: at each step every rank is written by one peer), chunk by
 * chunk, each PUSH followed by its arrival event, numbered
 * first + (t-1)*S + j on every rank for step t and chunk j. A rank's GEMM of
 * the rows rank q = r-t pushed at step t waits for q's event. A PUSH into a
 * peer waits for the peer's READY (its G is free: its previous op is done
 * and its client ready). Nobody reads a peer's A, so no RELEASE: DONE
 * follows the own pushes (the copy stream's join) and every push into the
 * own G (the GEMMs that waited for them).
 */
static ovl_status_t emit_ring_push(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t gemms = 0, first = b->next_event, nc = plan->chunks;
    ovl_status_t r;

    /* the arrival events: the same numbers on every rank */
    b->next_event += (p->world - 1) * nc;
    r = emit_ring_head(b, plan, &gemms);
    for (uint32_t t = 1; r == OVL_OK && t < p->world; t++) {
        uint32_t peer = (p->rank + t) % p->world;

        r = pb_emit_wait(b, RING_COPY_STREAM, peer, OVL_EV_READY);
        for (uint32_t j = 0; r == OVL_OK && j < nc; j++) {
            uint64_t row0, rows;

            chunk_range(plan, j, &row0, &rows);
            r = emit_push(b, RING_COPY_STREAM, peer, row0, rows);
            if (r == OVL_OK)
                r = pb_emit_record(b, RING_COPY_STREAM, first + (t - 1) * nc + j);
        }
    }
    for (uint32_t t = 1; r == OVL_OK && t < p->world; t++) {
        uint32_t from = (p->rank + p->world - t) % p->world;

        for (uint32_t j = 0; r == OVL_OK && j < nc; j++, gemms++) {
            uint32_t gs = gemms % 2 ? RING_GEMM_STREAM1 : RING_GEMM_STREAM0;
            uint64_t row0, rows;

            chunk_range(plan, j, &row0, &rows);
            r = pb_emit_wait(b, gs, from, first + (t - 1) * nc + j);
            if (r == OVL_OK)
                r = emit_gemm(b, gs, OVL_BUF_G, from, 1, row0, rows);
        }
    }
    if (r == OVL_OK)
        r = pb_emit_joins(b, p->rank, RING_COPY_STREAM, RING_GEMM_STREAM1);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/*
 * ring (PyTorch async-TP, TransformerEngine P2P): the own shard is multiplied
 * first, straight from the client's A, while the copy stream pulls the peers'
 * shards in ring order (r+1, r+2, ...: at every step each rank reads from a
 * different peer). Each pulled chunk's GEMM waits only for that pull, on a
 * GEMM stream that alternates with every GEMM issued, so one GEMM's tail
 * overlaps the next one's head. RELEASE then tells the peers that this rank
 * no longer reads their shards; DONE waits for every peer's RELEASE, since the
 * client may overwrite A as soon as DONE rings.
 */
static ovl_status_t emit_ring(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t gemms = 0; /* GEMMs issued: picks the GEMM stream */
    ovl_status_t r;

    if (p->world == 1)
        return emit_ring_single(b, plan);
    if (b->topo->nnodes > 1)
        return emit_ring_nodes(b, plan);
    if (p->world >= RING_PUSH_MIN_WORLD)
        return emit_ring_push(b, plan);

    r = emit_ring_head(b, plan, &gemms);
    for (uint32_t t = 1; r == OVL_OK && t < p->world; t++) {
        uint32_t peer = (p->rank + t) % p->world;

        r = pb_emit_wait(b, RING_COPY_STREAM, peer, OVL_EV_READY);
        for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
            uint32_t gs = gemms % 2 ? RING_GEMM_STREAM1 : RING_GEMM_STREAM0;
            uint32_t ev = b->next_event++;
            uint64_t row0, rows;

            chunk_range(plan, j, &row0, &rows);
            r = emit_pull(b, RING_COPY_STREAM, peer, row0, rows);
            if (r == OVL_OK)
                r = pb_emit_record(b, RING_COPY_STREAM, ev);
            if (r == OVL_OK)
                r = pb_emit_wait(b, gs, p->rank, ev);
            if (r == OVL_OK)
                r = emit_gemm(b, gs, OVL_BUF_G, peer, 1, row0, rows);
        }
    }
    if (r == OVL_OK)
        r = pb_emit_record(b, RING_COPY_STREAM, OVL_EV_RELEASE);
    if (r == OVL_OK)
        r = pb_emit_joins(b, p->rank, RING_COPY_STREAM, RING_GEMM_STREAM1);
    for (uint32_t t = 1; r == OVL_OK && t < p->world; t++)
        r = pb_emit_wait(b, 0, (p->rank + t) % p->world, OVL_EV_RELEASE);
    if (r == OVL_OK)
        r = pb_emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/* a * b, saturating at UINT64_MAX: AUTO and replay compare sizes, they
 * never need more. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/* The flop of one rank's GEMMs in an op (saturating): every gathered row
 * (m of each of the world's ranks) times every B's columns times k, twice. */
static uint64_t gemm_flop(const ovl_plan_params_t *p)
{
    return mul_sat(mul_sat(mul_sat(2, mul_sat(p->m, p->world)), pb_total_n(p)), p->k);
}

/* p's kind, 0 read as all-gather + GEMM (plan.h). */
static ovl_op_kind_t kind_of(const ovl_plan_params_t *p)
{
    return p->kind ? p->kind : OVL_OP_AG_GEMM;
}

static bool params_valid(const ovl_plan_params_t *p)
{
    /* every kind has its emitter: GEMM + reduce-scatter's in its section
     * below, all-gather + GEMM's above */
    if (kind_of(p) == OVL_OP_GEMM_RS)
        return pb_rs_refusal(p) == NULL;
    if (kind_of(p) != OVL_OP_AG_GEMM)
        return false;
    if (p->world == 0 || p->world > OVL_PLAN_MAX_WORLD || p->rank >= p->world)
        return false;
    if (p->m == 0 || p->n == 0 || p->k == 0 || p->nb > OVL_PLAN_MAX_BS)
        return false;
    for (uint32_t i = 1; i < ovl_plan_nb(p); i++)
        if (p->n_more[i - 1] == 0)
            return false;
    /* G has world*m rows; row arithmetic must not wrap */
    if (p->m > UINT64_MAX / p->world)
        return false;
    /* AUTO is resolved before building; an algorithm without an emitter
     * fails in ovl_plan_build's switch */
    if (p->algo == OVL_ALGO_AUTO || !ovl_op_kind_takes_algo(OVL_OP_AG_GEMM, p->algo))
        return false;
    if (ovl_dtype_size(p->dtype) == 0 || (unsigned)p->allgather >= OVL_AG_PREF_COUNT)
        return false;
    if (p->chunks > OVL_PLAN_MAX_CHUNKS || p->streams > OVL_PLAN_MAX_STREAMS)
        return false;
    if (pb_scaling_refusal(p))
        return false;
    switch (pb_count_nodes(p)) {
    case 0:
        return false; /* node ids out of range or not dense */
    case 1:
        return true;
    default:
        /* Across nodes only NCCL moves shards, and only dense rows: what
         * the copy engine alone can gather cannot be planned. Ranks that
         * share a GPU cannot be in one communicator: naive's and
         * collective's all-gather over the job cannot run, ring's RAILs
         * can, on a communicator per rail group (ovl_plan_rail_groups;
         * docs/plans.md, "Several nodes"). */
        return !p->strided && p->allgather != OVL_AG_COPY &&
               (!p->shared_gpu || p->algo == OVL_ALGO_RING);
    }
}

/* The shapes of the buffers (plan.h), whether used or not. */
static void buf_shapes(const ovl_plan_params_t *p, ovl_plan_buf_t *bufs)
{
    uint64_t rows = p->m * p->world; /* no wrap: params_valid */

    bufs[OVL_BUF_A] = (ovl_plan_buf_t){.rows = p->m, .cols = p->k};
    for (uint32_t i = 0; i < ovl_plan_nb(p); i++) {
        uint64_t n = ovl_plan_bn(p, i);

        bufs[ovl_buf_b(i)] = p->transb ? (ovl_plan_buf_t){.rows = n, .cols = p->k}
                                       : (ovl_plan_buf_t){.rows = p->k, .cols = n};
        bufs[ovl_buf_c(i)] = (ovl_plan_buf_t){.rows = rows, .cols = n};
    }
    bufs[OVL_BUF_G] = (ovl_plan_buf_t){.rows = rows, .cols = p->k};
    pb_buf_types(p, bufs);
}

/* Whether the plan for p gathers A's scales with its rows into SG: scaled
 * by row or 1x128, where G is used (pb_emit moves them). */
static bool uses_sg(const ovl_plan_params_t *p)
{
    return ovl_plan_scales_per_row(p) && uses_gathered(p);
}

/* The scratch of valid params: G's bytes when G is used and is not the
 * client's, then SG's (where it starts: *ret_sg); OVL_ERR_LIMIT rather
 * than a wrapped size. */
static ovl_status_t scratch_of(const ovl_plan_params_t *p, uint64_t *ret, uint64_t *ret_sg)
{
    uint64_t row, bytes = 0, sg = 0;

    *ret = 0;
    if (uses_gathered(p) && !p->want_gathered &&
        (__builtin_mul_overflow(p->k, (uint64_t)ovl_dtype_size(p->dtype), &row) ||
         __builtin_mul_overflow(p->m * p->world, row, &bytes)))
        return OVL_ERR_LIMIT;
    if (uses_sg(p) &&
        (__builtin_mul_overflow(p->m * p->world, ovl_plan_scale_cols(p) * sizeof(float), &row) ||
         pb_scratch_after(&bytes, row, &sg) != OVL_OK))
        return OVL_ERR_LIMIT;
    *ret = bytes;
    if (ret_sg)
        *ret_sg = sg;
    return OVL_OK;
}

const char *ovl_plan_refusal(const ovl_plan_params_t *params)
{
    if (!params || params_valid(params))
        return NULL;
    return kind_of(params) == OVL_OP_GEMM_RS ? pb_rs_refusal(params) : pb_scaling_refusal(params);
}

ovl_status_t ovl_plan_scratch_bytes(const ovl_plan_params_t *params, uint64_t *ret_bytes)
{
    if (!params || !ret_bytes || !params_valid(params))
        return OVL_ERR_INVALID;
    if (kind_of(params) == OVL_OP_GEMM_RS)
        return pb_rs_scratch(params, ret_bytes);
    return scratch_of(params, ret_bytes, NULL);
}

/*
 * Fills the plan's chunking, stream count and roles from the params (the
 * rules of docs/plans.md): chunks are clamped to m and evened out so that
 * none is empty; streams are what the algorithm actually uses.
 */
static void plan_shape(ovl_plan_t *plan, const topo_t *t)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t c = p->chunks, s = p->streams, comm = 0;

    switch (p->algo) {
    case OVL_ALGO_COLLECTIVE:
        /* a chunk's GEMM covers its rows of every rank */
        c = c ? c : pb_default_chunks(p, COLLECTIVE_CHUNKS, p->world);
        s = s ? s : COLLECTIVE_STREAMS;
        break;
    case OVL_ALGO_RING:
        /* Narrow outputs make each peer's GEMM short next to its pull: two
         * chunks let the first half's GEMM run while the second arrives
         * (2 x H200: 65536x1024x1024 about 13% faster with two; the wider
         * shapes as fast or faster with one; docs/plans.md). A chunk's
         * GEMM covers its rows of one rank. Alone, ring pulls nothing: its
         * chunks would only cut the GEMM (one H100, 65536x1024x1024: 0.231
         * ms in two GEMMs, 0.226 to 0.227 in one); naive and collective
         * alone still copy A into G, which their chunks overlap. */
        if (!c)
            c = p->world == 1
                    ? 1
                    : pb_default_chunks(p, pb_total_n(p) <= RING_NARROW_N ? 2 : RING_CHUNKS, 1);
        /* ring's streams are fixed by its structure: the request is ignored */
        s = p->world > 1 ? RING_STREAMS : 1;
        if (t->nnodes > 1) {
            /* and a stream for the RAILs; without pulls it takes the copy
             * stream's number, so that no stream stands idle */
            comm = ring_comm_stream(p, t);
            s = comm == RING_COMM_STREAM ? RING_COMM_STREAM + 1 : RING_STREAMS;
        }
        break;
    default:
        c = 1;
        s = NAIVE_STREAMS;
        break;
    }
    pb_chunk_rows(p, p->m, c, &plan->chunk_rows, &plan->chunks);
    /* a collective stream without a chunk would only wait and join */
    if (p->algo == OVL_ALGO_COLLECTIVE && s > plan->chunks)
        s = plan->chunks;
    plan->nstreams = s;

    /* Roles: what each stream carries. Ring's copy stream pulls and its
     * GEMM streams only multiply; a collective side stream carries its
     * chunks' transfers (and their GEMMs, which wait for them anyway). */
    plan->roles[0] = OVL_ROLE_CLIENT;
    for (uint32_t i = 1; i < s; i++) {
        if (p->algo == OVL_ALGO_RING && comm && i == comm)
            plan->roles[i] = OVL_ROLE_COMM;
        else if (p->algo == OVL_ALGO_RING)
            plan->roles[i] = i == RING_COPY_STREAM ? OVL_ROLE_COPY : OVL_ROLE_COMPUTE;
        else
            plan->roles[i] = gather_by_nccl(p) ? OVL_ROLE_COMM : OVL_ROLE_COPY;
    }
}

ovl_status_t ovl_plan_build(const ovl_plan_params_t *params, ovl_plan_t *ret_plan)
{
    builder_t b = {.next_event = OVL_EV_FIRST_FREE};
    ovl_plan_t plan = {0};
    topo_t topo = {0};
    ovl_status_t r;

    if (!params || !ret_plan || !params_valid(params))
        return OVL_ERR_INVALID;
    if (kind_of(params) == OVL_OP_GEMM_RS)
        return pb_rs_build(params, ret_plan);

    plan.params = *params;
    plan.params.kind = kind_of(params);
    plan.scratch_buf = OVL_BUF_G;
    uint64_t sg_at;
    r = scratch_of(params, &plan.scratch_bytes, &sg_at);
    if (r != OVL_OK)
        return r;
    r = pb_topo_make(params, &topo);
    if (r != OVL_OK)
        return r;
    /* the plan's own copy of a topology of several nodes */
    r = pb_keep_topology(&plan, params, topo.nnodes);
    if (r != OVL_OK)
        goto fail;
    plan_shape(&plan, &topo);
    buf_shapes(params, plan.bufs);
    plan.bufs[OVL_BUF_G].scratch = uses_gathered(params) && !params->want_gathered;
    plan.bufs[OVL_BUF_SG].scratch = uses_sg(params);
    plan.bufs[OVL_BUF_SG].scratch_offset = sg_at;
    b.plan = &plan;
    b.topo = &topo;
    switch (params->algo) {
    case OVL_ALGO_NAIVE:
    case OVL_ALGO_COLLECTIVE:
        r = emit_chunked(&b, &plan);
        break;
    case OVL_ALGO_RING:
        r = emit_ring(&b, &plan);
        break;
    default:
        r = OVL_ERR_INVALID;
        break;
    }
    if (r != OVL_OK)
        goto fail;
    pb_finish(&b, &plan);
    plan.replay = gemm_flop(params) < REPLAY_MAX_GEMM_FLOP;
    /* plan_shape (and scratch_of) and the emitter disagree: a planner bug */
    if (b.max_stream + 1 != plan.nstreams || plan.bufs[OVL_BUF_G].used != uses_gathered(params) ||
        plan.bufs[OVL_BUF_SG].used != uses_sg(params)) {
        r = OVL_ERR_INTERNAL;
        goto fail; /* the program is still the builder's to free */
    }
    pb_topo_free(&topo);
    *ret_plan = plan;
    return OVL_OK;

fail:
    pb_topo_free(&topo);
    free((void *)(uintptr_t)plan.params.node_of);
    free(b.instr);
    free(b.peers);
    return r;
}

void ovl_plan_free(ovl_plan_t *plan)
{
    if (!plan)
        return;
    free(plan->instr);
    free(plan->peers);
    /* the plan's own copy (ovl_plan_build), const only to its readers */
    free((void *)(uintptr_t)plan->params.node_of);
    memset(plan, 0, sizeof(*plan));
}

bool ovl_plan_params_equal(const ovl_plan_params_t *a, const ovl_plan_params_t *b)
{
    if (kind_of(a) != kind_of(b) || a->algo != b->algo || a->world != b->world ||
        a->rank != b->rank || a->m != b->m || a->n != b->n || a->k != b->k ||
        a->dtype != b->dtype || a->chunks != b->chunks || a->streams != b->streams ||
        a->want_gathered != b->want_gathered || a->transb != b->transb ||
        a->strided != b->strided || a->shared_gpu != b->shared_gpu ||
        a->allgather != b->allgather || a->nb != b->nb || a->reduce_op != b->reduce_op ||
        a->chosen != b->chosen)
        return false;
    const ovl_plan_scaling_t *x = &a->sc, *y = &b->sc;
    if (x->scaled != y->scaled || x->b_dtype != y->b_dtype || x->out_dtype != y->out_dtype ||
        x->a_mode != y->a_mode || x->b_mode != y->b_mode || x->fast_accum != y->fast_accum ||
        x->bias != y->bias)
        return false;
    for (uint32_t i = 0; i < OVL_PLAN_MAX_BS - 1; i++)
        if (a->n_more[i] != b->n_more[i])
            return false;
    if (a->node_of != b->node_of)
        for (uint32_t q = 0; q < a->world; q++)
            if (pb_node_at(a->node_of, q) != pb_node_at(b->node_of, q))
                return false;
    return true;
}

/* The rule behind OVL_ALGO_AUTO, and its reason in words (*why). */
static ovl_algo_t choose(const ovl_plan_params_t *params, const char **why)
{
    /* GEMM + reduce-scatter: its own rule (plan_rs.c) */
    if (params && kind_of(params) == OVL_OP_GEMM_RS && params->world > 1 &&
        params->world <= OVL_PLAN_MAX_WORLD)
        return pb_rs_choose(params, why);
    if (!params || params->world <= 1) {
        *why = "one rank: nothing to move";
        return OVL_ALGO_NAIVE;
    }
    if (kind_of(params) == OVL_OP_GEMM_RS) {
        *why = "a world over the planner's largest: naive";
        return OVL_ALGO_NAIVE;
    }
    /* across nodes with ranks sharing a GPU, ring is the one that runs */
    if (params->shared_gpu && params->world <= OVL_PLAN_MAX_WORLD && pb_count_nodes(params) > 1) {
        *why = "ranks share a GPU across nodes: ring is the one that runs";
        return OVL_ALGO_RING;
    }
    if (mul_sat(params->m, params->world) < AUTO_MIN_ROWS || gemm_flop(params) < AUTO_MIN_FLOPS) {
        *why = "under 512 gathered rows or 2^27 flop: too small for overlap to pay";
        return OVL_ALGO_NAIVE;
    }
    *why = "512 gathered rows and 2^27 flop or more: ring";
    return OVL_ALGO_RING;
}

ovl_algo_t ovl_plan_choose(const ovl_plan_params_t *params)
{
    const char *why;
    return choose(params, &why);
}

bool ovl_plan_takes_default(const ovl_plan_params_t *params, ovl_algo_t algo)
{
    ovl_plan_params_t p;

    if (!params || algo == OVL_ALGO_AUTO)
        return false;
    p = *params;
    p.algo = algo;
    if (!params_valid(&p))
        return false;
    /* GEMM + reduce-scatter where ranks share a GPU: naive's and
     * collective's REDUCE_SCATTERs need NCCL between them, which the CUDA
     * backend cannot make there (ring and push copy; the rule picks one) */
    return !(kind_of(&p) == OVL_OP_GEMM_RS && p.shared_gpu &&
             (algo == OVL_ALGO_NAIVE || algo == OVL_ALGO_COLLECTIVE));
}

const char *ovl_plan_choose_why(const ovl_plan_params_t *params)
{
    const char *why;
    (void)choose(params, &why);
    return why;
}

/* The shape of params's plan that tells candidates apart: its chunks and
 * streams; false where it cannot be built. */
static bool cand_shape(const ovl_plan_params_t *p, uint32_t *chunks, uint32_t *streams, bool *nccl)
{
    ovl_plan_t plan;

    if (ovl_plan_build(p, &plan) != OVL_OK)
        return false;
    *chunks = plan.chunks;
    *streams = plan.nstreams;
    *nccl = false;
    for (size_t i = 0; i < plan.ninstr && !*nccl; i++)
        *nccl = plan.instr[i].kind == OVL_I_ALLGATHER;
    ovl_plan_free(&plan);
    return true;
}

uint32_t ovl_plan_candidates(const ovl_plan_params_t *params,
                             ovl_plan_cand_t out[OVL_PLAN_MAX_CANDS])
{
    static const uint32_t chunk_reqs[] = {0, 1, 2, 4};
    uint32_t n = 0, seen_chunks[OVL_PLAN_MAX_CANDS], seen_streams[OVL_PLAN_MAX_CANDS];
    bool seen_nccl[OVL_PLAN_MAX_CANDS];
    ovl_algo_t algos[OVL_ALGO_COUNT];
    uint32_t nalgo = 0;
    ovl_plan_params_t p;

    if (!params)
        return 0;
    p = *params;
    p.streams = 0;
    p.chosen = OVL_CHOSEN_GIVEN;
    /* how A may be gathered: as the params say, and by the copy engine
     * where they leave it to ovld */
    const ovl_ag_pref_t gathers[] = {OVL_AG_AUTO, OVL_AG_COPY};
    size_t ngather = params->allgather == OVL_AG_AUTO ? NELEM(gathers) : 1;
    /* the rule's choice first, then the kind's other algorithms in order */
    algos[nalgo++] = ovl_plan_choose(params);
    for (int a = OVL_ALGO_AUTO + 1; a < OVL_ALGO_COUNT; a++)
        if ((ovl_algo_t)a != algos[0])
            algos[nalgo++] = (ovl_algo_t)a;
    for (uint32_t i = 0; i < nalgo; i++) {
        if (!ovl_plan_takes_default(params, algos[i]))
            continue;
        for (size_t c = 0; c < NELEM(chunk_reqs); c++) {
            for (size_t g = 0; g < ngather && n < OVL_PLAN_MAX_CANDS; g++) {
                uint32_t ch, st;
                bool nccl, dup = false;

                p.algo = algos[i];
                p.chunks = chunk_reqs[c];
                p.allgather = gathers[g] == OVL_AG_AUTO ? params->allgather : gathers[g];
                if (!cand_shape(&p, &ch, &st, &nccl))
                    continue;
                for (uint32_t j = 0; j < n && !dup; j++)
                    dup = out[j].algo == p.algo && seen_chunks[j] == ch && seen_streams[j] == st &&
                          seen_nccl[j] == nccl;
                if (dup)
                    continue;
                out[n] =
                    (ovl_plan_cand_t){.algo = p.algo, .chunks = p.chunks, .allgather = gathers[g]};
                seen_chunks[n] = ch;
                seen_streams[n] = st;
                seen_nccl[n] = nccl;
                n++;
            }
        }
    }
    return n;
}

/* ---------------------------------------------------------------- names */

const char *ovl_instr_name(ovl_instr_kind_t kind)
{
    switch (kind) {
    case OVL_I_WAIT_READY:
        return "WAIT_READY";
    case OVL_I_RECORD:
        return "RECORD";
    case OVL_I_WAIT:
        return "WAIT";
    case OVL_I_ALLGATHER:
        return "ALLGATHER";
    case OVL_I_PULL:
        return "PULL";
    case OVL_I_GEMM:
        return "GEMM";
    case OVL_I_SLEEP:
        return "SLEEP";
    case OVL_I_DONE:
        return "DONE";
    case OVL_I_RAIL:
        return "RAIL";
    case OVL_I_PUSH:
        return "PUSH";
    case OVL_I_REDUCE_SCATTER:
        return "REDUCE_SCATTER";
    case OVL_I_REDUCE:
        return "REDUCE";
    }
    return "UNKNOWN";
}

static const char *const buf_names[] = {
    "A",     "B",     "C",     "G",     "B1",    "B2",    "B3",   "B4",  "B5",  "B6",
    "B7",    "C1",    "C2",    "C3",    "C4",    "C5",    "C6",   "C7",  "P",   "SA",
    "SB",    "BIAS",  "SG",    "SB1",   "SB2",   "SB3",   "SB4",  "SB5", "SB6", "SB7",
    "BIAS1", "BIAS2", "BIAS3", "BIAS4", "BIAS5", "BIAS6", "BIAS7"};
_Static_assert(NELEM(buf_names) == OVL_BUF_COUNT, "every buffer has a name");

static const char *const method_names[] = {"nccl-allgather", "nccl-sendrecv", "nccl-rail"};
_Static_assert(NELEM(method_names) == OVL_AG_METHOD_COUNT, "every method has a name");

static const char *const role_names[] = {"client", "comm", "copy", "compute"};
_Static_assert(NELEM(role_names) == OVL_ROLE_COUNT, "every role has a name");

static const char *const pref_names[] = {"auto", "nccl", "copy"};
_Static_assert(NELEM(pref_names) == OVL_AG_PREF_COUNT, "every preference has a name");

const char *ovl_buf_name(ovl_buf_t buf)
{
    return (unsigned)buf < OVL_BUF_COUNT ? buf_names[buf] : NULL;
}

const char *ovl_ag_method_name(ovl_ag_method_t method)
{
    return (unsigned)method < OVL_AG_METHOD_COUNT ? method_names[method] : NULL;
}

const char *ovl_stream_role_name(ovl_stream_role_t role)
{
    return (unsigned)role < OVL_ROLE_COUNT ? role_names[role] : NULL;
}

const char *ovl_ag_pref_name(ovl_ag_pref_t pref)
{
    return (unsigned)pref < OVL_AG_PREF_COUNT ? pref_names[pref] : NULL;
}

ovl_status_t ovl_ag_pref_parse(const char *name, ovl_ag_pref_t *ret)
{
    for (unsigned i = 0; name && i < OVL_AG_PREF_COUNT; i++)
        if (strcmp(name, pref_names[i]) == 0) {
            *ret = (ovl_ag_pref_t)i;
            return OVL_OK;
        }
    return OVL_ERR_INVALID;
}

/* --------------------------------------------------------------- format */

typedef struct out {
    char *buf;
    size_t len;
    size_t need; /* bytes the whole text needs so far */
} out_t;

/* Appends like snprintf, keeping count of the full length once buf is full;
 * vsnprintf leaves the truncated text NUL-terminated. */
static void out_printf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void out_printf(out_t *o, const char *fmt, ...)
{
    char *dst = NULL;
    size_t room = 0;
    va_list ap;
    int n;

    if (o->need < o->len) {
        dst = o->buf + o->need;
        room = o->len - o->need;
    }
    va_start(ap, fmt);
    n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->need += (size_t)n;
}

static const char *name_or(const char *name)
{
    return name ? name : "?";
}

/* A reference: "G[2048]"; with rows, a range "A[0+256]"; with the rank
 * (a PULL's source), "r2:A[0+256]". */
static void out_ref(out_t *o, ovl_ref_t ref, bool with_rank, bool with_rows, uint64_t rows)
{
    if (with_rank)
        out_printf(o, "r%" PRIu32 ":", ref.rank);
    out_printf(o, "%s[%" PRIu64, name_or(ovl_buf_name(ref.buf)), ref.row);
    if (with_rows)
        out_printf(o, "+%" PRIu64, rows);
    out_printf(o, "]");
}

/* A RAIL's list of n ranks at plan->peers[at]: " r2,r5", or " -" when
 * empty ("?" for a range the plan does not have). */
static void out_ranks(out_t *o, const ovl_plan_t *plan, uint64_t at, uint32_t n)
{
    if (at > plan->npeers || n > plan->npeers - at) {
        out_printf(o, " ?");
        return;
    }
    if (n == 0)
        out_printf(o, " -");
    for (uint32_t i = 0; i < n; i++)
        out_printf(o, "%sr%" PRIu32, i ? "," : " ", plan->peers[at + i]);
}

static void format_instr(out_t *o, const ovl_plan_t *plan, size_t i, const ovl_instr_t *in)
{
    out_printf(o, "%4zu  s%" PRIu32 "  %s", i, in->stream, ovl_instr_name(in->kind));
    switch (in->kind) {
    case OVL_I_RECORD:
        out_printf(o, " ev%" PRIu32, in->event);
        break;
    case OVL_I_WAIT:
        out_printf(o, " ev%" PRIu32 "@r%" PRIu32, in->event, in->peer);
        break;
    case OVL_I_ALLGATHER:
        out_printf(o, " %s ", name_or(ovl_ag_method_name(in->method)));
        out_ref(o, in->dst, false, false, 0);
        out_printf(o, " <- ");
        out_ref(o, in->src, false, true, in->rows);
        out_printf(o, " stride %" PRIu64 " cols %" PRIu64, in->stride, in->cols);
        break;
    case OVL_I_PULL:
    case OVL_I_PUSH:
        /* the peer's side carries its rank: a PULL's source, a PUSH's
         * destination */
        out_printf(o, " ");
        out_ref(o, in->dst, in->kind == OVL_I_PUSH, false, 0);
        out_printf(o, " <- ");
        out_ref(o, in->src, in->kind == OVL_I_PULL, true, in->rows);
        out_printf(o, " cols %" PRIu64, in->cols);
        break;
    case OVL_I_GEMM:
        out_printf(o, " ");
        out_ref(o, in->dst, false, false, 0);
        out_printf(o, " <- ");
        out_ref(o, in->src, false, true, in->rows);
        out_printf(o, " @ %s%s n %" PRIu64 " k %" PRIu64, name_or(ovl_buf_name(in->b.buf)),
                   in->transb ? "^T" : "", in->n, in->k);
        if (in->nblocks != 1)
            out_printf(o, " blocks %" PRIu32 " stride %" PRIu64, in->nblocks, in->stride);
        if (plan->params.sc.scaled) {
            /* the scales of A's rows (one scale: row 0 of SA), then B's
             * and the bias, read whole */
            out_printf(o, " scaled ");
            out_ref(o, in->sa, false, ovl_plan_scales_per_row(&plan->params), in->rows);
            uint32_t i = ovl_gemm_b(in);
            out_printf(o, " %s", name_or(ovl_buf_name(ovl_buf_sb(i))));
            if (plan->params.sc.bias)
                out_printf(o, " + %s", name_or(ovl_buf_name(ovl_buf_bias(i))));
        }
        if (in->avg)
            out_printf(o, " /W");
        if (in->accumulate) {
            out_printf(o, " + ");
            out_ref(o, in->acc, false, true, in->rows);
        }
        break;
    case OVL_I_SLEEP:
        out_printf(o, " %" PRIu32 "ns", in->sleep_ns);
        break;
    case OVL_I_RAIL:
        out_printf(o, " %s ", name_or(ovl_ag_method_name(in->method)));
        out_ref(o, in->dst, false, false, 0);
        out_printf(o, " <- ");
        out_ref(o, in->src, false, true, in->rows);
        out_printf(o, " stride %" PRIu64 " cols %" PRIu64 " send", in->stride, in->cols);
        out_ranks(o, plan, in->peers, in->nsend);
        out_printf(o, " recv");
        /* no wrap: out_ranks checks the range against npeers */
        out_ranks(o, plan, in->peers + (uint64_t)in->nsend, in->nrecv);
        break;
    case OVL_I_REDUCE_SCATTER:
        out_printf(o, " %s ", in->avg ? "avg" : "sum");
        out_ref(o, in->dst, false, false, 0);
        out_printf(o, " <- ");
        out_ref(o, in->src, false, true, in->rows);
        out_printf(o, " stride %" PRIu64 " cols %" PRIu64, in->stride, in->cols);
        break;
    case OVL_I_REDUCE:
        out_printf(o, " %s ", in->avg ? "avg" : "sum");
        out_ref(o, in->dst, false, false, 0);
        out_printf(o, " <- ");
        out_ref(o, in->src, false, true, in->rows);
        out_printf(o, " blocks %" PRIu32 " stride %" PRIu64 " cols %" PRIu64, in->nblocks,
                   in->stride, in->cols);
        break;
    case OVL_I_WAIT_READY:
    case OVL_I_DONE:
        break;
    }
    out_printf(o, "\n");
}

size_t ovl_plan_format(const ovl_plan_t *plan, char *buf, size_t len)
{
    out_t o = {.buf = buf, .len = len};
    const ovl_plan_params_t *p;

    if (len > 0)
        buf[0] = '\0';
    if (!plan)
        return 0;
    p = &plan->params;
    /* Format 5 (docs/plans.md, "Format history"): the kind, second in the
     * header, tells a reader how to read the rest; a "chosen by" line
     * follows where the op said auto. */
    if (kind_of(p) == OVL_OP_GEMM_RS)
        out_printf(&o,
                   "plan format=5 kind=%s algo=%s world=%" PRIu32 " rank=%" PRIu32 " m=%" PRIu64
                   " n=%" PRIu64 " k=%" PRIu64 " dtype=%s transb=%s reduce=%s chunks=%" PRIu32
                   " chunk_rows=%" PRIu64 " streams=%" PRIu32 " events=%" PRIu32
                   " strided=%s shared_gpu=%s\n",
                   name_or(ovl_op_kind_name(kind_of(p))), name_or(ovl_algo_name(p->algo)), p->world,
                   p->rank, p->m, p->n, p->k, name_or(ovl_dtype_name(p->dtype)),
                   p->transb ? "yes" : "no", p->reduce_op == OVL_REDUCE_AVG ? "avg" : "sum",
                   plan->chunks, plan->chunk_rows, plan->nstreams, plan->nevents,
                   p->strided ? "yes" : "no", p->shared_gpu ? "yes" : "no");
    else
        out_printf(&o,
                   "plan format=5 kind=%s algo=%s world=%" PRIu32 " rank=%" PRIu32 " m=%" PRIu64
                   " n=%" PRIu64 " k=%" PRIu64 " dtype=%s transb=%s chunks=%" PRIu32
                   " chunk_rows=%" PRIu64 " streams=%" PRIu32 " events=%" PRIu32
                   " a_out=%s strided=%s shared_gpu=%s allgather=%s\n",
                   name_or(ovl_op_kind_name(kind_of(p))), name_or(ovl_algo_name(p->algo)), p->world,
                   p->rank, p->m, p->n, p->k, name_or(ovl_dtype_name(p->dtype)),
                   p->transb ? "yes" : "no", plan->chunks, plan->chunk_rows, plan->nstreams,
                   plan->nevents, p->want_gathered ? "yes" : "no", p->strided ? "yes" : "no",
                   p->shared_gpu ? "yes" : "no", name_or(ovl_ag_pref_name(p->allgather)));
    if (p->chosen == OVL_CHOSEN_RULE)
        out_printf(&o, "chosen by auto: %s\n", ovl_plan_choose_why(p));
    else if (p->chosen == OVL_CHOSEN_DEFAULT)
        out_printf(&o, "chosen by the daemon's default_algo\n");
    else if (p->chosen == OVL_CHOSEN_MEASURED)
        out_printf(&o, "chosen by auto: the fastest plan measured (ovlctl tune)\n");
    else if (p->chosen == OVL_CHOSEN_TRYING)
        out_printf(&o, "chosen by auto: a plan being measured (ovlctl tune)\n");
    if (plan->nnodes > 1 && p->node_of) {
        /* the topology: each node's ranks, and each rank's node */
        uint32_t size[OVL_PLAN_MAX_WORLD] = {0};

        for (uint32_t q = 0; q < p->world && q < OVL_PLAN_MAX_WORLD; q++)
            if (p->node_of[q] < OVL_PLAN_MAX_WORLD)
                size[p->node_of[q]]++;
        out_printf(&o, "topology nodes=%" PRIu32 " sizes=", plan->nnodes);
        for (uint32_t n = 0; n < plan->nnodes && n < OVL_PLAN_MAX_WORLD; n++)
            out_printf(&o, "%s%" PRIu32, n ? "," : "", size[n]);
        out_printf(&o, " node_of=");
        for (uint32_t q = 0; q < p->world && q < OVL_PLAN_MAX_WORLD; q++)
            out_printf(&o, "%s%" PRIu32, q ? "," : "", p->node_of[q]);
        out_printf(&o, "\n");
    }
    if (ovl_plan_nb(p) > 1) {
        /* several Bs: their count and each one's n, on a line of their own
         * (one B's plan has none: its text is what it always was) */
        out_printf(&o, "bs nb=%" PRIu32 " n=", ovl_plan_nb(p));
        for (uint32_t i = 0; i < ovl_plan_nb(p) && i < OVL_PLAN_MAX_BS; i++)
            out_printf(&o, "%s%" PRIu64, i ? "," : "", ovl_plan_bn(p, i));
        out_printf(&o, "\n");
    }
    if (p->sc.scaled) {
        /* a scaled op: B's and C's dtypes, the scale modes, bias and fast
         * accumulation, on a line of their own */
        out_printf(
            &o, "scaled b_dtype=%s out_dtype=%s a_scale=%s b_scale=%s bias=%s fast_accum=%s\n",
            name_or(ovl_dtype_name(p->sc.b_dtype)), name_or(ovl_dtype_name(p->sc.out_dtype)),
            name_or(ovl_scale_mode_name(p->sc.a_mode)), name_or(ovl_scale_mode_name(p->sc.b_mode)),
            p->sc.bias ? "yes" : "no", p->sc.fast_accum ? "yes" : "no");
    }
    out_printf(&o, "buffers");
    for (int b = 0; b < OVL_BUF_COUNT; b++) {
        const ovl_plan_buf_t *pb = &plan->bufs[b];

        if (b >= OVL_BUF_B1 && !pb->used)
            continue; /* B i and C i of i >= 1, P, only where the op has them */
        if (b == OVL_BUF_G && kind_of(p) == OVL_OP_GEMM_RS)
            continue; /* its kind has none */

        out_printf(&o, " %s=", name_or(ovl_buf_name((ovl_buf_t)b)));
        if (!pb->used) {
            out_printf(&o, "-");
            continue;
        }
        out_printf(&o, "%" PRIu64 "x%" PRIu64, pb->rows, pb->cols);
        if (b == OVL_BUF_G)
            out_printf(&o, "(%s)", p->want_gathered ? "a_out" : "scratch");
        if (b == OVL_BUF_P || b == OVL_BUF_SG)
            out_printf(&o, "(scratch)");
    }
    out_printf(&o, " scratch=%" PRIu64 "\n", plan->scratch_bytes);
    out_printf(&o, "roles");
    for (uint32_t s = 0; s < plan->nstreams && s < OVL_PLAN_MAX_STREAMS; s++)
        out_printf(&o, " s%" PRIu32 "=%s", s, name_or(ovl_stream_role_name(plan->roles[s])));
    out_printf(&o, "\n");
    for (size_t i = 0; i < plan->ninstr; i++)
        format_instr(&o, plan, i, &plan->instr[i]);
    return o.need;
}

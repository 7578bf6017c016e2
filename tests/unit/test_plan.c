/*
 * test_plan.c: the planner. Golden dumps pin the text format and three
 * programs; a checker builds the plans of every rank of a job and simulates
 * them together, as the executor issues them, to prove the properties every
 * program must have (docs/plans.md, "What the checker proves") over many
 * shapes; negative tests show the checker catches broken programs.
 *
 * Scaled (fp8) ops are checked alike, their scales followed as their rows
 * are (the checker's comment, "Scaled ops"): A's by row or by 1x128 (a row
 * of ceil(k/128) scales per row of A, and GEMMs of rows in fours).
 *
 * Set OVL_UPDATE_GOLDEN=1 to rewrite the golden files instead of comparing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#ifndef OVL_GOLDEN_DIR
#error "OVL_GOLDEN_DIR must name the tests/golden directory"
#endif

/* ------------------------------------------------------------ helpers */

/* How the ops of a job are laid out, and what the daemon prefers for the
 * gather: the plan params strided and allgather. */
typedef enum layout {
    L_DENSE,   /* every A and a_out dense, preference auto */
    L_STRIDED, /* some A or a_out with ld != k: gathered by pulls */
    L_COPY,    /* dense, the daemon asks for the copy engine */
    L_NCCL,    /* dense, NCCL even for one rank */
    L_SHARED,  /* dense, NCCL asked for, but ranks share a GPU: pulls */
    L_COUNT,
} layout_t;

static ovl_plan_params_t params_of(ovl_algo_t algo, uint32_t world, uint32_t rank, uint64_t m,
                                   uint32_t chunks, uint32_t streams, bool want_gathered)
{
    ovl_plan_params_t p = {
        .algo = algo,
        .world = world,
        .rank = rank,
        .m = m,
        .n = 256,
        .k = 512,
        .dtype = OVL_DTYPE_BF16,
        .chunks = chunks,
        .streams = streams,
        .want_gathered = want_gathered,
    };
    return p;
}

static void set_layout(ovl_plan_params_t *p, layout_t layout)
{
    p->strided = layout == L_STRIDED;
    p->shared_gpu = layout == L_SHARED;
    p->allgather = layout == L_COPY                         ? OVL_AG_COPY
                   : layout == L_NCCL || layout == L_SHARED ? OVL_AG_NCCL
                                                            : OVL_AG_AUTO;
}

/* The Bs the jobs the tests build have (1 but in the tests of several
 * Bs), and the n of each: B 0's is params_of's, the others their own. */
static uint32_t build_nb = 1;
static const uint64_t build_n[OVL_PLAN_MAX_BS] = {256, 64, 96, 8, 16, 24, 32, 40};

static void set_bs(ovl_plan_params_t *p, uint32_t nb)
{
    p->nb = nb;
    for (uint32_t i = 1; i < nb; i++)
        p->n_more[i - 1] = build_n[i];
}

/* The k of the jobs the tests build (0: params_of's, but in the tests of
 * block scales, whose scales have ceil(k / 128) columns). */
static uint64_t build_k = 0;

/* The topology of the jobs the tests build (NULL: one node, but in the
 * tests across nodes): node_of of world entries. */
static const uint32_t *build_topo = NULL;

/* The scaling of the jobs the tests build (not scaled, but in the tests
 * of scaled ops), and their fp8 dtype of A: a scaled job takes it, and B
 * transposed (the one layout a scaled op has). */
static ovl_plan_scaling_t build_sc = {.scaled = false};
static ovl_dtype_t build_sc_dtype = OVL_DTYPE_FP8_E4M3;

static void set_sc(ovl_plan_params_t *p)
{
    if (!build_sc.scaled)
        return;
    p->sc = build_sc;
    p->dtype = build_sc_dtype;
    p->transb = true;
}

/* A scaling: B's fp8 (A's is the op's dtype), C's dtype, the modes, a
 * bias or not; fast accumulation where there is a bias and the modes
 * agree (so that the tests cycling through scalings see it both ways). */
static ovl_plan_scaling_t scaling(ovl_dtype_t b_dtype, ovl_dtype_t out_dtype,
                                  ovl_scale_mode_t a_mode, ovl_scale_mode_t b_mode, bool bias)
{
    return (ovl_plan_scaling_t){.scaled = true,
                                .b_dtype = b_dtype,
                                .out_dtype = out_dtype,
                                .a_mode = a_mode,
                                .b_mode = b_mode,
                                .fast_accum = bias && a_mode == b_mode,
                                .bias = bias};
}

/* Builds every rank's plan of one job into plans[0..world). */
static void build_job_as(ovl_plan_t *plans, ovl_algo_t algo, uint32_t world, uint64_t m,
                         uint32_t chunks, uint32_t streams, bool want_gathered, layout_t layout,
                         bool transb)
{
    for (uint32_t r = 0; r < world; r++) {
        ovl_plan_params_t p = params_of(algo, world, r, m, chunks, streams, want_gathered);
        set_layout(&p, layout);
        set_bs(&p, build_nb);
        p.transb = transb;
        p.node_of = build_topo;
        if (build_k)
            p.k = build_k;
        set_sc(&p);
        ovl_status_t st = ovl_plan_build(&p, &plans[r]);
        if (st != OVL_OK)
            fail_msg("ovl_plan_build: %s for %s world=%u rank=%u m=%llu k=%llu chunks=%u "
                     "streams=%u layout=%d%s%s",
                     ovl_strerror(st), ovl_algo_name(algo), world, r, (unsigned long long)m,
                     (unsigned long long)p.k, chunks, streams, (int)layout,
                     p.sc.scaled ? " scaled, A's scales by " : "",
                     p.sc.scaled ? ovl_scale_mode_name(p.sc.a_mode) : "");
    }
}

static void build_job(ovl_plan_t *plans, ovl_algo_t algo, uint32_t world, uint64_t m,
                      uint32_t chunks, uint32_t streams, bool want_gathered)
{
    build_job_as(plans, algo, world, m, chunks, streams, want_gathered, L_DENSE, false);
}

static void free_job(ovl_plan_t *plans, uint32_t world)
{
    for (uint32_t r = 0; r < world; r++)
        ovl_plan_free(&plans[r]);
}

static void remove_instr(ovl_plan_t *plan, size_t i)
{
    assert_true(i < plan->ninstr);
    memmove(&plan->instr[i], &plan->instr[i + 1], (plan->ninstr - i - 1) * sizeof(plan->instr[0]));
    plan->ninstr--;
}

/* Index of the n-th (0-based) instruction of `kind` whose source is
 * buffer src (-1: any). */
static size_t find_instr(const ovl_plan_t *plan, ovl_instr_kind_t kind, int src, unsigned n)
{
    for (size_t i = 0; i < plan->ninstr; i++) {
        const ovl_instr_t *in = &plan->instr[i];

        if (in->kind == kind && (src < 0 || (int)in->src.buf == src) && n-- == 0)
            return i;
    }
    fail_msg("no such instruction");
    return 0;
}

/* Whether a job's params make the planner gather A by NCCL collectives
 * (docs/plans.md, "How A is gathered"), said here independently. */
static bool nccl_gather(const ovl_plan_params_t *p)
{
    if (p->strided || p->shared_gpu || p->allgather == OVL_AG_COPY)
        return false;
    return p->allgather == OVL_AG_NCCL || p->world > 1;
}

/* ------------------------------------------------------------ checker */

/* Rows [row0, row0+rows) of one block of C or G, written by instruction
 * `instr` of rank `rank` (a PUSH writes a peer's G). */
typedef struct span {
    uint32_t block;
    uint64_t row0, rows;
    size_t instr;
    uint32_t rank;
} span_t;

/*
 * The simulation. Every (rank, stream) is a sequential thread; happens-before
 * between instructions is tracked with vector clocks over those threads.
 * Instruction X on (r, s) happens before Y iff X's own component is <= the
 * same component of Y's clock.
 *
 * Ranks are advanced round-robin as the executor issues them: each rank runs
 * until it reaches a WAIT on a peer event the peer has not recorded yet, or an
 * ALLGATHER, which completes once every rank has reached its matching one (a
 * full barrier: NCCL's all-gather completes on a rank only once every rank
 * contributed and every rank's shard was read). A WAIT joins the clock of the
 * latest RECORD of its event issued so far. The checker requires every event
 * to be recorded at most once per program; then the RECORD a WAIT sees is the
 * only one, whatever the interleaving, so the result holds for every order
 * of issue the executor's blocking rule allows, not just round-robin.
 *
 * What is proved, by function (letters as in docs/plans.md):
 *   check_fields       indices in range; ranks agree on the job; every
 *                      instruction names the right buffers, of the right
 *                      rank, in bounds, with the op's geometry
 *   check_shape        WAIT_READY, RECORD READY first; one DONE last; nstreams
 *                      and nevents exact
 *   check_bufs         buffers' shapes and used flags exact; the scratch is
 *                      G's bytes iff G is used without a_out, and what
 *                      ovl_plan_scratch_bytes says before building
 *   check_transfers    ALLGATHERs iff the params say NCCL (never in ring),
 *                      each by the method for its rows; streams' roles are
 *                      what they carry
 *   simulate           no deadlock; ALLGATHERs match; events recorded once;
 *                      no wait on an own event before its record
 *   check_bracketed    (c) everything after WAIT_READY and before DONE
 *   check_shard_reads  (e) shard reads after the owner's READY, before its DONE
 *   check_rows         (a) C rows once, (b) G read after its write, (f) G full
 *   check_collective   (d) initial waits before the first transfer
 *   check_ring         (g) own shard first, two GEMM streams, the SLEEP
 *
 * Scaled ops (params.sc; both kinds), beside the above. A's scales by row
 * and by 1x128 are "per row" (scales_per_row): they go with A's rows, a
 * row of ceil(k/128) of them by 1x128 (scale_cols), of one by row:
 *   check_gemm_scale   (s1) every GEMM's sa names the scales of exactly its A
 *                      rows: per row SA[src.row] for the own shard's rows,
 *                      SG[src.row] for gathered ones, of the own rank, its
 *                      blocks within a scale buffer of a row of scales
 *                      (scale_cols wide) per row of the A rows' buffer;
 *                      one scale: SA[0]; unscaled: none
 *                      (s6) by 1x128 every GEMM's rows, and its blocks'
 *                      stride where it has several, are a multiple of 4
 *                      (cuBLASLt lays 1x128 scales out by rows, 16-byte
 *                      aligned: common/scaling.h)
 *   check_fields /     (s2) all-gather + GEMM per row: every transfer that
 *   check_scale_transfer writes G rows (ALLGATHER, PULL, PUSH, RAIL) is
 *                      followed at once by the same transfer (kind, stream,
 *                      ranks, rows, stride, method, peers) of their scales
 *                      (SA, or a peer's SG, into SG, scale_cols columns),
 *                      and every transfer of scales is such a follower, of
 *                      the geometry its rows' transfer must have; other
 *                      plans (one scale for A, gemm_rs, unscaled) move no
 *                      scales
 *   check_rows         (s3) SG as G: each SG row written at most once
 *                      (every one with a_out), every SG row a GEMM reads
 *                      (by its sa) written before it in happens-before
 *                      order, a peer's SG pulled after its write; (c) no
 *                      SG written, read or marked used where the plan
 *                      gathers no scales
 *   check_shard_reads  (s4) a peer's SA read (pulled, gathered, pushed by
 *                      its owner) only between its owner's READY and DONE,
 *                      as its A; a peer's SG as its G
 *   check_bufs,        (s5) shapes and used flags of SA, SB, BIAS (SG):
 *   check_rs_bufs      SA m x 1 by row, m x ceil(k/128) by 1x128, 1 x 1;
 *                      SB i 1 x n_i by row, n_i x ceil(k/128) by 1x128,
 *                      ceil(n_i/128) x ceil(k/128) by 128x128, 1 x 1; SG
 *                      (W m) x scale_cols; dtypes: A and G the op's, B i
 *                      b_dtype, C i, P and BIAS out_dtype, SA, SB, SG
 *                      fp32; the scratch flags and offsets (G at 0, SG
 *                      256-aligned past G's bytes, at 0 with a_out, of W m
 *                      scale_cols floats; P at 0) and scratch_bytes those
 *                      buffers' end, as ovl_plan_scratch_bytes says
 */
typedef struct sim {
    uint32_t world;
    const ovl_plan_t *plans;
    uint32_t ns;        /* streams per rank (the widest plan's) */
    uint32_t ncomp;     /* world * ns clock components */
    uint32_t **clock;   /* per rank: ninstr clocks */
    uint32_t *sclock;   /* per (rank, stream): the stream's clock so far */
    uint32_t **evclock; /* per rank: nevents clocks of the RECORD */
    bool **evrec;       /* per rank: event recorded yet */
    size_t *pc;         /* per rank: next instruction to issue */
    size_t *wait_ready; /* per rank: index of WAIT_READY */
    size_t *rec_ready;  /* per rank: index of RECORD READY */
    size_t *done;       /* per rank: index of DONE */
    uint32_t *joint;    /* ncomp: scratch for an ALLGATHER */
    span_t *cspans;     /* maxspans: scratch for C row spans */
    span_t *gspans;     /* maxspans: scratch for G row spans */
    span_t *sgspans;    /* maxspans: scratch for SG row spans (scaled per row) */
    span_t *pspans;     /* maxspans: a peer's G (or SG) row spans (pulls of a peer's G) */
    size_t npspans;
    uint32_t pspans_of;   /* whose spans pspans holds (UINT32_MAX: none yet) */
    ovl_buf_t pspans_buf; /* of which buffer, G or SG */
    size_t maxspans;
    /* The topology, derived here from rank 0's params.node_of on its own:
     * each rank's node and local index, each node's ranks. */
    uint32_t nnodes;
    uint32_t *node;       /* world */
    uint32_t *local;      /* world */
    uint32_t *size;       /* world (nnodes used) */
    uint32_t *rail_issue; /* world * ncomp: each rank's clock as it issues a RAIL */
    uint32_t *rail_hits;  /* world: receptions of one shard by one node (step_rail) */
    char *why;
    size_t whylen;
    bool failed;
} sim_t;

/* Records the first violation; returns false so callers can `return violation(..)`. */
static bool violation(sim_t *s, const char *fmt, ...)
{
    va_list ap;

    if (!s->failed && s->whylen > 0) {
        va_start(ap, fmt);
        vsnprintf(s->why, s->whylen, fmt, ap);
        va_end(ap);
    }
    s->failed = true;
    return false;
}

static uint32_t comp(const sim_t *s, uint32_t rank, uint32_t stream)
{
    return rank * s->ns + stream;
}

static uint32_t *node_clock(const sim_t *s, uint32_t rank, size_t i)
{
    return s->clock[rank] + i * s->ncomp;
}

static uint32_t *stream_clock(const sim_t *s, uint32_t rank, uint32_t stream)
{
    return s->sclock + (size_t)comp(s, rank, stream) * s->ncomp;
}

/* Instruction (ra, ia) happens before (or is) (rb, ib). */
static bool hb(const sim_t *s, uint32_t ra, size_t ia, uint32_t rb, size_t ib)
{
    uint32_t c = comp(s, ra, s->plans[ra].instr[ia].stream);

    return node_clock(s, ra, ia)[c] <= node_clock(s, rb, ib)[c];
}

static void join(const sim_t *s, uint32_t *dst, const uint32_t *src)
{
    for (uint32_t c = 0; c < s->ncomp; c++)
        if (src[c] > dst[c])
            dst[c] = src[c];
}

/* rows > 0 rows from row `row` lie within `limit` rows. */
static bool rows_within(uint64_t row, uint64_t rows, uint64_t limit)
{
    return rows > 0 && row < limit && rows <= limit - row;
}

/* Whether ref is row `row` of buffer buf of rank `rank`. */
static bool ref_is(ovl_ref_t ref, ovl_buf_t buf, uint32_t rank)
{
    return ref.buf == buf && ref.rank == rank;
}

/* ------------------------------------------------------- scaled ops */

/* check_scale_transfer and check_fields leave the scale transfers'
 * adjacency to their rows' transfers unproved (test_scaled_checker_catches:
 * what the simulation alone then catches). */
static bool g_mirror_off = false;

/* Whether a scaled op's A scales are a row of scales per row of A (by row,
 * or by 1x128), and how many floats that row has: one by row, ceil(k/128)
 * by 1x128 (ovl.h); derived here from the modes, not asked of plan.h. */
static bool scales_per_row(const ovl_plan_params_t *pp)
{
    return pp->sc.scaled &&
           (pp->sc.a_mode == OVL_SCALE_ROW || pp->sc.a_mode == OVL_SCALE_BLOCK_1X128);
}

static uint64_t scale_cols(const ovl_plan_params_t *pp)
{
    return pp->sc.scaled && pp->sc.a_mode == OVL_SCALE_BLOCK_1X128 ? (pp->k + 127) / 128 : 1;
}

/* All-gather + GEMM scaled per row: A's scales travel with A's rows, from
 * SA (or a peer's SG) into SG. */
static bool gathers_scales(const ovl_plan_params_t *pp)
{
    return pp->kind != OVL_OP_GEMM_RS && scales_per_row(pp);
}

static bool moves_rows(ovl_instr_kind_t kind)
{
    return kind == OVL_I_ALLGATHER || kind == OVL_I_PULL || kind == OVL_I_PUSH ||
           kind == OVL_I_RAIL;
}

/* A transfer of scales: one from SA or SG, or into SG. */
static bool moves_scales(const ovl_instr_t *in)
{
    return moves_rows(in->kind) &&
           (in->dst.buf == OVL_BUF_SG || in->src.buf == OVL_BUF_SA || in->src.buf == OVL_BUF_SG);
}

/* Where the scales of rows of buf lie: SA for A's, SG for G's. */
static ovl_buf_t scales_of(ovl_buf_t buf)
{
    return buf == OVL_BUF_G ? OVL_BUF_SG : OVL_BUF_SA;
}

/* How sc (the instruction after `rows`, a transfer into G; NULL: none)
 * fails to be the same transfer of those rows' scales, of pp's scale_cols
 * columns; NULL where it is. */
static const char *mirror_diff(const ovl_plan_params_t *pp, const ovl_instr_t *rows,
                               const ovl_instr_t *sc)
{
    if (!sc || !moves_scales(sc))
        return "none follows";
    if (sc->kind != rows->kind)
        return "another kind";
    if (sc->stream != rows->stream)
        return "another stream";
    if (sc->src.buf != scales_of(rows->src.buf) || sc->dst.buf != OVL_BUF_SG)
        return "other buffers";
    if (sc->src.rank != rows->src.rank || sc->dst.rank != rows->dst.rank ||
        sc->src.row != rows->src.row || sc->dst.row != rows->dst.row || sc->rows != rows->rows ||
        sc->stride != rows->stride)
        return "other rows";
    if (sc->cols != scale_cols(pp))
        return "other columns";
    if (sc->method != rows->method || sc->peers != rows->peers || sc->nsend != rows->nsend ||
        sc->nrecv != rows->nrecv)
        return "another method or peers";
    return NULL;
}

/*
 * (s1) What a GEMM of a scaled op names for A's scales: per row (by row or
 * 1x128), the scales of its first A row, in SA for the own shard's rows
 * and in SG for gathered ones, at the same row, its blocks within that
 * buffer, which has a row of scale_cols scales for each row of the A rows'
 * buffer; by tensor, row 0 of SA, whatever rows it multiplies. A GEMM of
 * an op that is not scaled names none. (Its A rows themselves
 * check_operands has proved.) (s6) By 1x128, its rows and its blocks'
 * stride in fours.
 */
static bool check_gemm_scale(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_t *p = &s->plans[r];
    const ovl_plan_params_t *pp = &p->params;
    ovl_ref_t want = {.buf = OVL_BUF_SA, .rank = r, .row = 0};
    bool by_row = scales_per_row(pp);

    if (!pp->sc.scaled) {
        if (in->sa.buf != OVL_BUF_A || in->sa.rank != 0 || in->sa.row != 0)
            return violation(s, "r%u #%zu: GEMM of an op not scaled names scales", r, i);
        return true;
    }
    if (pp->sc.a_mode == OVL_SCALE_BLOCK_1X128 &&
        (in->rows % 4 != 0 || (in->nblocks > 1 && in->stride % 4 != 0)))
        return violation(s,
                         "r%u #%zu: GEMM of %llu rows (%u blocks, stride %llu) with A's 1x128 "
                         "scales: not in fours",
                         r, i, (unsigned long long)in->rows, in->nblocks,
                         (unsigned long long)in->stride);
    if (by_row)
        want = (ovl_ref_t){.buf = scales_of(in->src.buf), .rank = r, .row = in->src.row};
    if (in->sa.buf != want.buf || in->sa.rank != want.rank || in->sa.row != want.row)
        return violation(
            s, "r%u #%zu: GEMM of %s[%llu] names the scales r%u:%s[%llu], not r%u:%s[%llu]", r, i,
            ovl_buf_name(in->src.buf), (unsigned long long)in->src.row, in->sa.rank,
            ovl_buf_name(in->sa.buf), (unsigned long long)in->sa.row, want.rank,
            ovl_buf_name(want.buf), (unsigned long long)want.row);
    if (by_row && (p->bufs[in->sa.buf].rows != p->bufs[in->src.buf].rows ||
                   p->bufs[in->sa.buf].cols != scale_cols(pp) ||
                   !rows_within(in->sa.row, (in->nblocks - 1) * in->stride + in->rows,
                                p->bufs[in->sa.buf].rows)))
        return violation(s,
                         "r%u #%zu: GEMM's scales %s[%llu], %u blocks of %llu: not in rows of "
                         "%llu, one for each row of %s",
                         r, i, ovl_buf_name(in->sa.buf), (unsigned long long)in->sa.row,
                         in->nblocks, (unsigned long long)in->rows,
                         (unsigned long long)scale_cols(pp), ovl_buf_name(in->src.buf));
    return true;
}

/* What one instruction names, on its own: buffers, ranks, bounds and the
 * op's geometry. Rank r's A_b lands in G block b at the same shard row, and
 * C block b comes from A_b, so transfers and GEMMs keep rows in place. */
static bool check_rs_operands(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in);

static bool check_operands(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_params_t *pp = &s->plans[r].params;
    uint64_t m = pp->m, big = m * s->world;

    if (pp->kind == OVL_OP_GEMM_RS)
        return check_rs_operands(s, r, i, in);
    if (in->kind == OVL_I_REDUCE_SCATTER || in->kind == OVL_I_REDUCE)
        return violation(s, "r%u #%zu: %s in an all-gather + GEMM", r, i, ovl_instr_name(in->kind));

    switch (in->kind) {
    case OVL_I_PULL:
        if (in->src.rank >= s->world || !ref_is(in->dst, OVL_BUF_G, r))
            return violation(s, "r%u #%zu: PULL of no rank or into other than G", r, i);
        /* the copy engine moves rows inside a node only */
        if (s->node[in->src.rank] != s->node[r])
            return violation(s, "r%u #%zu: PULL crosses nodes (from r%u)", r, i, in->src.rank);
        if (ref_is(in->src, OVL_BUF_G, in->src.rank)) {
            /* rows a peer received from a rank of another node: that
             * rank's block, at the same rows of the own G */
            uint64_t blk = in->src.row / m;

            if (in->src.rank == r || !rows_within(in->src.row, in->rows, big) ||
                in->src.row % m + in->rows > m || s->node[blk] == s->node[r] || in->cols != pp->k ||
                in->dst.row != in->src.row)
                return violation(s, "r%u #%zu: PULL of a peer's G: geometry", r, i);
            break;
        }
        if (!ref_is(in->src, OVL_BUF_A, in->src.rank))
            return violation(s, "r%u #%zu: PULL from other than a shard or into other than G", r,
                             i);
        if (!rows_within(in->src.row, in->rows, m) || in->cols != pp->k ||
            in->dst.row != (uint64_t)in->src.rank * m + in->src.row)
            return violation(s, "r%u #%zu: PULL geometry", r, i);
        break;
    case OVL_I_PUSH:
        /* the own shard's rows into the own block of a peer's G, on the node */
        if (!ref_is(in->src, OVL_BUF_A, r) || in->dst.buf != OVL_BUF_G ||
            in->dst.rank >= s->world || in->dst.rank == r)
            return violation(s, "r%u #%zu: PUSH from other than A or into other than a peer's G", r,
                             i);
        if (s->node[in->dst.rank] != s->node[r])
            return violation(s, "r%u #%zu: PUSH crosses nodes (to r%u)", r, i, in->dst.rank);
        if (!rows_within(in->src.row, in->rows, m) || in->cols != pp->k ||
            in->dst.row != (uint64_t)r * m + in->src.row)
            return violation(s, "r%u #%zu: PUSH geometry", r, i);
        break;
    case OVL_I_RAIL: {
        const ovl_plan_t *p = &s->plans[r];

        if (in->method != OVL_AG_NCCL_RAIL)
            return violation(s, "r%u #%zu: RAIL method %d", r, i, (int)in->method);
        if (!ref_is(in->src, OVL_BUF_A, r) || !ref_is(in->dst, OVL_BUF_G, r))
            return violation(s, "r%u #%zu: RAIL from other than A or into other than G", r, i);
        if (!rows_within(in->src.row, in->rows, m) || in->cols != pp->k || in->stride != m ||
            in->dst.row != in->src.row)
            return violation(s, "r%u #%zu: RAIL geometry", r, i);
        if (in->peers > p->npeers || in->nsend > p->npeers - in->peers ||
            in->nrecv > p->npeers - in->peers - in->nsend)
            return violation(s, "r%u #%zu: RAIL peers out of the plan's list", r, i);
        for (uint32_t x = 0; x < in->nsend + in->nrecv; x++) {
            uint32_t q = p->peers[in->peers + x];

            /* NCCL moves between nodes; inside one the copy engine does */
            if (q >= s->world || s->node[q] == s->node[r])
                return violation(s, "r%u #%zu: RAIL %s r%u of its own node or none", r, i,
                                 x < in->nsend ? "sends to" : "receives from", q);
        }
        break;
    }
    case OVL_I_ALLGATHER:
        if ((unsigned)in->method >= OVL_AG_METHOD_COUNT)
            return violation(s, "r%u #%zu: unknown ALLGATHER method", r, i);
        if (!ref_is(in->src, OVL_BUF_A, r) || !ref_is(in->dst, OVL_BUF_G, r))
            return violation(s, "r%u #%zu: ALLGATHER from other than A or into other than G", r, i);
        if (!rows_within(in->src.row, in->rows, m) || in->cols != pp->k || in->stride != m ||
            in->dst.row != in->src.row)
            return violation(s, "r%u #%zu: ALLGATHER geometry", r, i);
        break;
    case OVL_I_GEMM: {
        /* B i into C i, for one of the op's Bs */
        int bi = ovl_buf_b_index(in->b.buf);

        if (!(ref_is(in->src, OVL_BUF_A, r) || ref_is(in->src, OVL_BUF_G, r)) || bi < 0 ||
            (uint32_t)bi >= ovl_plan_nb(pp) || in->b.rank != r || in->b.row != 0 ||
            in->accumulate || !ref_is(in->dst, ovl_buf_c((uint32_t)bi), r))
            return violation(s, "r%u #%zu: GEMM names buffers it may not", r, i);
        if (in->n != ovl_plan_bn(pp, (uint32_t)bi) || in->k != pp->k || in->transb != pp->transb ||
            in->nblocks == 0 || (in->nblocks == 1 && in->stride != 0) ||
            (in->nblocks > 1 && (in->stride != m || in->rows > m)))
            return violation(s, "r%u #%zu: GEMM geometry", r, i);
        if (in->src.buf == OVL_BUF_A) {
            if (in->nblocks != 1 || !rows_within(in->src.row, in->rows, m) ||
                in->dst.row != (uint64_t)r * m + in->src.row)
                return violation(s, "r%u #%zu: local GEMM of another rank's block", r, i);
        } else if (in->dst.row != in->src.row ||
                   !rows_within(in->dst.row, (in->nblocks - 1) * in->stride + in->rows, big)) {
            return violation(s, "r%u #%zu: GEMM range out of bounds", r, i);
        }
        break;
    }
    default:
        break;
    }
    return true;
}

/* (s2) A transfer of scales: only where all-gather + GEMM gathers them
 * (scaled per row); from SA (or a peer's SG) into SG, scale_cols columns
 * (one by row, ceil(k/128) by 1x128); on its
 * own the geometry a transfer of the same rows of A (or G) into G must
 * have; and right after that transfer of their rows, the same in all but
 * the buffers and columns (mirror_diff), which check_fields proves from
 * the rows' side too: every write of G rows is followed by the write of
 * their scales, and every write of scales follows the write of their rows. */
static bool check_scale_transfer(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_t *p = &s->plans[r];
    const ovl_plan_params_t *pp = &p->params;
    const ovl_instr_t *prev = i > 0 ? &p->instr[i - 1] : NULL;
    const char *name = ovl_instr_name(in->kind);
    ovl_instr_t as_rows = *in;

    if (!gathers_scales(pp))
        return violation(s, "r%u #%zu: %s of scales in a plan that gathers none (%s)", r, i, name,
                         pp->kind == OVL_OP_GEMM_RS ? "gemm_rs"
                         : pp->sc.scaled            ? "one scale for A"
                                                    : "not scaled");
    if (in->dst.buf != OVL_BUF_SG || (in->src.buf != OVL_BUF_SA && in->src.buf != OVL_BUF_SG) ||
        (in->src.buf == OVL_BUF_SG && in->kind != OVL_I_PULL) || in->cols != scale_cols(pp))
        return violation(s, "r%u #%zu: %s of scales from %s into %s, %llu columns", r, i, name,
                         ovl_buf_name(in->src.buf), ovl_buf_name(in->dst.buf),
                         (unsigned long long)in->cols);
    as_rows.src.buf = in->src.buf == OVL_BUF_SG ? OVL_BUF_G : OVL_BUF_A;
    as_rows.dst.buf = OVL_BUF_G;
    as_rows.cols = pp->k;
    if (!check_operands(s, r, i, &as_rows))
        return false;
    if (!g_mirror_off && (!prev || !moves_rows(prev->kind) || prev->dst.buf != OVL_BUF_G ||
                          mirror_diff(pp, prev, in)))
        return violation(s, "r%u #%zu: %s of scales not right after the same %s of their rows", r,
                         i, name, name);
    return true;
}

/* Whether two ops' scalings are the same. */
static bool sc_equal(const ovl_plan_scaling_t *a, const ovl_plan_scaling_t *b)
{
    return a->scaled == b->scaled && a->b_dtype == b->b_dtype && a->out_dtype == b->out_dtype &&
           a->a_mode == b->a_mode && a->b_mode == b->b_mode && a->fast_accum == b->fast_accum &&
           a->bias == b->bias;
}

/* Checks what each instruction says on its own: indices in range. */
static bool check_fields(sim_t *s)
{
    const ovl_plan_t *p0 = &s->plans[0];

    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];

        if (p->params.rank != r || p->params.world != s->world || p->params.m != p0->params.m ||
            p->params.kind != p0->params.kind || p->params.reduce_op != p0->params.reduce_op ||
            p->params.algo != p0->params.algo || p->chunks != p0->chunks ||
            p->params.want_gathered != p0->params.want_gathered ||
            p->params.strided != p0->params.strided ||
            p->params.allgather != p0->params.allgather || p->params.dtype != p0->params.dtype ||
            !sc_equal(&p->params.sc, &p0->params.sc) ||
            ovl_plan_nb(&p->params) != ovl_plan_nb(&p0->params))
            return violation(s, "r%u: params differ from rank 0's", r);
        /* one topology, as the checker reads it (a plan of one node keeps
         * none, however it was given) */
        if (p->nnodes != s->nnodes || (s->nnodes > 1) != (p->params.node_of != NULL))
            return violation(s, "r%u: %u nodes, the topology says %u", r, p->nnodes, s->nnodes);
        for (uint32_t q = 0; s->nnodes > 1 && q < s->world; q++)
            if (p->params.node_of[q] != s->node[q])
                return violation(s, "r%u: topology differs from rank 0's", r);
        if (p->nstreams == 0 || p->nstreams > OVL_PLAN_MAX_STREAMS)
            return violation(s, "r%u: nstreams %u", r, p->nstreams);
        for (size_t i = 0; i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if (in->stream >= p->nstreams)
                return violation(s, "r%u #%zu: stream %u >= nstreams", r, i, in->stream);
            switch (in->kind) {
            case OVL_I_RECORD:
            case OVL_I_WAIT:
                if (in->event >= p->nevents)
                    return violation(s, "r%u #%zu: event %u >= nevents", r, i, in->event);
                if (in->kind == OVL_I_WAIT && in->peer >= s->world)
                    return violation(s, "r%u #%zu: peer %u", r, i, in->peer);
                /* events are a node's: GPUs of other nodes cannot wait on them */
                if (in->kind == OVL_I_WAIT && s->node[in->peer] != s->node[r])
                    return violation(s, "r%u #%zu: waits on r%u of another node", r, i, in->peer);
                break;
            case OVL_I_PULL:
            case OVL_I_PUSH:
            case OVL_I_ALLGATHER:
            case OVL_I_GEMM:
            case OVL_I_RAIL:
            case OVL_I_REDUCE_SCATTER:
            case OVL_I_REDUCE:
                if (moves_scales(in)) {
                    if (!check_scale_transfer(s, r, i, in))
                        return false;
                    break;
                }
                if (!check_operands(s, r, i, in))
                    return false;
                if (in->kind == OVL_I_GEMM && !check_gemm_scale(s, r, i, in))
                    return false;
                /* rows into G, scaled per row: their scales follow */
                if (!g_mirror_off && gathers_scales(&p->params) && moves_rows(in->kind) &&
                    in->dst.buf == OVL_BUF_G) {
                    const char *d =
                        mirror_diff(&p->params, in, i + 1 < p->ninstr ? &p->instr[i + 1] : NULL);

                    if (d)
                        return violation(s,
                                         "r%u #%zu: %s of G rows %llu+%llu: the next instruction "
                                         "is not the same %s of their scales (%s)",
                                         r, i, ovl_instr_name(in->kind),
                                         (unsigned long long)in->dst.row,
                                         (unsigned long long)in->rows, ovl_instr_name(in->kind), d);
                }
                break;
            case OVL_I_WAIT_READY:
            case OVL_I_SLEEP:
            case OVL_I_DONE:
                break;
            default:
                return violation(s, "r%u #%zu: unknown kind", r, i);
            }
        }
    }
    return true;
}

/* Issues the next instruction of rank r: 1 issued, 0 blocked or finished,
 * -1 violation. */
static int step(sim_t *s, uint32_t r)
{
    const ovl_plan_t *p = &s->plans[r];
    const ovl_instr_t *in;
    uint32_t *sc;

    if (s->pc[r] == p->ninstr)
        return 0;
    in = &p->instr[s->pc[r]];
    sc = stream_clock(s, r, in->stream);
    if (in->kind == OVL_I_ALLGATHER || in->kind == OVL_I_RAIL || in->kind == OVL_I_REDUCE_SCATTER)
        return 0;
    if (in->kind == OVL_I_WAIT) {
        if (!s->evrec[in->peer][in->event]) {
            if (in->peer != r)
                return 0;
            violation(s, "r%u #%zu: waits on own ev%u before recording it", r, s->pc[r], in->event);
            return -1;
        }
        join(s, sc, s->evclock[in->peer] + (size_t)in->event * s->ncomp);
    }
    sc[comp(s, r, in->stream)]++;
    memcpy(node_clock(s, r, s->pc[r]), sc, s->ncomp * sizeof(*sc));
    if (in->kind == OVL_I_RECORD) {
        if (s->evrec[r][in->event]) {
            violation(s, "r%u #%zu: ev%u recorded twice", r, s->pc[r], in->event);
            return -1;
        }
        s->evrec[r][in->event] = true;
        memcpy(s->evclock[r] + (size_t)in->event * s->ncomp, sc, s->ncomp * sizeof(*sc));
    }
    s->pc[r]++;
    return 1;
}

/* Completes one collective call of `kind` (ALLGATHER or REDUCE_SCATTER,
 * NCCL's: a full barrier) on every rank once all stand at theirs. */
static int step_coll(sim_t *s, ovl_instr_kind_t kind)
{
    uint32_t *joint = s->joint;
    const ovl_instr_t *first = NULL;

    memset(joint, 0, s->ncomp * sizeof(*joint));
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        const ovl_instr_t *in;

        if (s->pc[r] == p->ninstr || p->instr[s->pc[r]].kind != kind)
            return 0;
        in = &p->instr[s->pc[r]];
        if (!first)
            first = in;
        if (in->src.row != first->src.row || in->rows != first->rows || in->cols != first->cols ||
            in->stride != first->stride || in->dst.row != first->dst.row) {
            violation(s, "r%u #%zu: %s rows differ from rank 0's", r, s->pc[r],
                      ovl_instr_name(kind));
            return -1;
        }
        if (in->method != first->method || in->avg != first->avg) {
            violation(s, "r%u #%zu: %s method differs from rank 0's", r, s->pc[r],
                      ovl_instr_name(kind));
            return -1;
        }
        join(s, joint, stream_clock(s, r, in->stream));
    }
    for (uint32_t r = 0; r < s->world; r++)
        joint[comp(s, r, s->plans[r].instr[s->pc[r]].stream)]++;
    for (uint32_t r = 0; r < s->world; r++) {
        uint32_t *sc = stream_clock(s, r, s->plans[r].instr[s->pc[r]].stream);

        memcpy(sc, joint, s->ncomp * sizeof(*sc));
        memcpy(node_clock(s, r, s->pc[r]), joint, s->ncomp * sizeof(*sc));
        s->pc[r]++;
    }
    return 1;
}

/* Rank r's RAIL `in`: the ranks it sends to, and those it receives from. */
static const uint32_t *rail_sends(const sim_t *s, uint32_t r, const ovl_instr_t *in)
{
    return s->plans[r].peers + in->peers;
}

static const uint32_t *rail_recvs(const sim_t *s, uint32_t r, const ovl_instr_t *in)
{
    return s->plans[r].peers + in->peers + in->nsend;
}

static uint32_t count_of(const uint32_t *v, uint32_t n, uint32_t x)
{
    uint32_t c = 0;

    for (uint32_t i = 0; i < n; i++)
        c += v[i] == x;
    return c;
}

/*
 * Completes one RAIL on every rank once all stand at theirs (the
 * executor's rule: one backend call, one NCCL group, for every rank it
 * serves). It proves that the ranks move the same rows, that sends and
 * receives match exactly (every send has its one receive, every receive
 * its one send), and that each remote shard's chunk reaches every other
 * node exactly once, at the rank the rail scheme names there (local index
 * = the sender's modulo the node's ranks). Happens-before: NCCL completes
 * a receive only once its sender has posted the matching send, which its
 * stream orders after everything before the sender's RAIL (its READY wait
 * included); so a RAIL's clock joins the issue clocks of the RAILs it
 * receives from, and nothing else: a send that completes promises nothing
 * of its receiver.
 */
static int step_rail(sim_t *s)
{
    const ovl_instr_t *first = NULL;

    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];

        if (s->pc[r] == p->ninstr || p->instr[s->pc[r]].kind != OVL_I_RAIL)
            return 0;
    }
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_instr_t *in = &s->plans[r].instr[s->pc[r]];
        uint32_t *issue = s->rail_issue + (size_t)r * s->ncomp;

        if (!first)
            first = in;
        if (in->src.row != first->src.row || in->rows != first->rows || in->cols != first->cols ||
            in->stride != first->stride || in->dst.row != first->dst.row) {
            violation(s, "r%u #%zu: RAIL rows differ from rank 0's", r, s->pc[r]);
            return -1;
        }
        memcpy(issue, stream_clock(s, r, in->stream), s->ncomp * sizeof(*issue));
        issue[comp(s, r, in->stream)]++;
    }
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_instr_t *in = &s->plans[r].instr[s->pc[r]];

        for (uint32_t x = 0; x < in->nsend; x++) {
            uint32_t t = rail_sends(s, r, in)[x];
            const ovl_instr_t *tin = &s->plans[t].instr[s->pc[t]];

            if (count_of(rail_sends(s, r, in), in->nsend, t) != 1 ||
                count_of(rail_recvs(s, t, tin), tin->nrecv, r) != 1) {
                violation(s, "r%u #%zu: RAIL sends to r%u, which does not receive from it once", r,
                          s->pc[r], t);
                return -1;
            }
        }
        for (uint32_t x = 0; x < in->nrecv; x++) {
            uint32_t q = rail_recvs(s, r, in)[x];
            const ovl_instr_t *qin = &s->plans[q].instr[s->pc[q]];

            if (count_of(rail_sends(s, q, qin), qin->nsend, r) != 1) {
                violation(s, "r%u #%zu: RAIL receives from r%u, which does not send to it", r,
                          s->pc[r], q);
                return -1;
            }
        }
    }
    /* all-gather + GEMM: each shard's chunk once at every other node, at
     * the right rank (GEMM + reduce-scatter's RAILs carry node partials:
     * check_rs_dataflow follows them) */
    for (uint32_t q = 0; s->plans[0].params.kind != OVL_OP_GEMM_RS && q < s->world; q++) {
        memset(s->rail_hits, 0, s->world * sizeof(*s->rail_hits));
        for (uint32_t r = 0; r < s->world; r++) {
            const ovl_instr_t *in = &s->plans[r].instr[s->pc[r]];
            uint32_t c = count_of(rail_recvs(s, r, in), in->nrecv, q);
            uint32_t nd = s->node[r];

            s->rail_hits[nd] += c;
            if (c > 0 && s->local[r] != s->local[q] % s->size[nd]) {
                violation(s,
                          "r%u #%zu: RAIL receives r%u's rows, which the rail sends node %u's "
                          "local rank %u",
                          r, s->pc[r], q, nd, s->local[q] % s->size[nd]);
                return -1;
            }
        }
        for (uint32_t nd = 0; nd < s->nnodes; nd++)
            if (nd != s->node[q] && s->rail_hits[nd] != 1) {
                violation(s, "RAIL at r%u #%zu: r%u's rows reach node %u %u times", q, s->pc[q], q,
                          nd, s->rail_hits[nd]);
                return -1;
            }
    }
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_instr_t *in = &s->plans[r].instr[s->pc[r]];
        uint32_t *sc = stream_clock(s, r, in->stream);

        memcpy(sc, s->rail_issue + (size_t)r * s->ncomp, s->ncomp * sizeof(*sc));
        for (uint32_t x = 0; x < in->nrecv; x++)
            join(s, sc, s->rail_issue + (size_t)rail_recvs(s, r, in)[x] * s->ncomp);
        memcpy(node_clock(s, r, s->pc[r]), sc, s->ncomp * sizeof(*sc));
    }
    for (uint32_t r = 0; r < s->world; r++)
        s->pc[r]++;
    return 1;
}

static bool simulate(sim_t *s)
{
    bool progress = true;

    while (progress) {
        progress = false;
        for (uint32_t r = 0; r < s->world; r++) {
            int st;

            while ((st = step(s, r)) == 1)
                progress = true;
            if (st < 0)
                return false;
        }
        switch (step_coll(s, OVL_I_ALLGATHER)) {
        case 1:
            progress = true;
            break;
        case -1:
            return false;
        }
        switch (step_coll(s, OVL_I_REDUCE_SCATTER)) {
        case 1:
            progress = true;
            break;
        case -1:
            return false;
        }
        switch (step_rail(s)) {
        case 1:
            progress = true;
            break;
        case -1:
            return false;
        }
    }
    for (uint32_t r = 0; r < s->world; r++)
        if (s->pc[r] != s->plans[r].ninstr)
            return violation(s, "deadlock: r%u stuck at #%zu (%s)", r, s->pc[r],
                             ovl_instr_name(s->plans[r].instr[s->pc[r]].kind));
    return true;
}

/* Program shape: WAIT_READY first, RECORD READY next, one DONE last, all on
 * stream 0; every stream and every event index accounted for. */
static bool check_shape(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        bool used[OVL_PLAN_MAX_STREAMS] = {false};
        uint32_t nready = 0, ndone = 0, max_event = 0;

        if (p->ninstr < 3)
            return violation(s, "r%u: too short", r);
        for (size_t i = 0; i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            used[in->stream] = true;
            nready += in->kind == OVL_I_WAIT_READY;
            ndone += in->kind == OVL_I_DONE;
            if ((in->kind == OVL_I_RECORD || in->kind == OVL_I_WAIT) && in->event > max_event)
                max_event = in->event;
            if (in->kind == OVL_I_RECORD && in->event == OVL_EV_READY && i != 1)
                return violation(s, "r%u #%zu: READY recorded late", r, i);
        }
        if (p->instr[0].kind != OVL_I_WAIT_READY || p->instr[0].stream != 0 || nready != 1)
            return violation(s, "r%u: must start with one WAIT_READY on s0", r);
        if (p->instr[1].kind != OVL_I_RECORD || p->instr[1].event != OVL_EV_READY ||
            p->instr[1].stream != 0)
            return violation(s, "r%u: READY must be recorded on s0 right after WAIT_READY", r);
        if (p->instr[p->ninstr - 1].kind != OVL_I_DONE || p->instr[p->ninstr - 1].stream != 0 ||
            ndone != 1)
            return violation(s, "r%u: must end with one DONE on s0", r);
        for (uint32_t st = 0; st < p->nstreams; st++)
            if (!used[st])
                return violation(s, "r%u: stream %u counted but unused", r, st);
        if (p->nevents != max_event + 1)
            return violation(s, "r%u: nevents %u, highest event %u", r, p->nevents, max_event);
        s->wait_ready[r] = 0;
        s->rec_ready[r] = 1;
        s->done[r] = p->ninstr - 1;
    }
    return true;
}

/* (c) and the client's view: everything runs after the rank's WAIT_READY and
 * before its DONE, so every stream was joined back into stream 0. */
static bool check_bracketed(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++)
        for (size_t i = 0; i < s->plans[r].ninstr; i++) {
            if (!hb(s, r, s->wait_ready[r], r, i))
                return violation(s, "r%u #%zu: not ordered after WAIT_READY", r, i);
            if (!hb(s, r, i, r, s->done[r]))
                return violation(s, "r%u #%zu (s%u): not joined before DONE", r, i,
                                 s->plans[r].instr[i].stream);
        }
    return true;
}

/* (e) Every read of rank b's shard A_b (a PULL of b, any rank's ALLGATHER,
 * b's own RAIL, which sends it, b's own PUSH) comes after b recorded READY
 * and before b's DONE: b's client may overwrite A_b once DONE rings. Every
 * read of a peer's G (a PULL of rows the peer received from another node)
 * comes before the peer's DONE, after which its next op may write G; that
 * it comes after the rows were written, check_rows proves. Every write of
 * a peer's G (a PUSH) comes after the peer's READY (its previous op is
 * done, its client ready: G, or its a_out, is free) and before its DONE
 * (its client reads a_out then). A scaled op's scales are read and written
 * as their rows: rank b's SA like A_b, a peer's SG like its G. */
static bool check_shard_reads(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++)
        for (size_t i = 0; i < s->plans[r].ninstr; i++) {
            const ovl_instr_t *in = &s->plans[r].instr[i];
            uint32_t b0 = 0, b1 = 0;

            if (in->kind == OVL_I_PULL && (in->src.buf == OVL_BUF_G || in->src.buf == OVL_BUF_SG)) {
                if (!hb(s, r, i, in->src.rank, s->done[in->src.rank]))
                    return violation(s, "r%u #%zu: r%u may complete while its %s is read", r, i,
                                     in->src.rank, ovl_buf_name(in->src.buf));
            } else if (in->kind == OVL_I_PULL) {
                b0 = in->src.rank;
                b1 = in->src.rank + 1;
            } else if (in->kind == OVL_I_ALLGATHER) {
                b1 = s->world;
            } else if (in->kind == OVL_I_RAIL || in->kind == OVL_I_PUSH) {
                b0 = r;
                b1 = r + 1;
            }
            if (in->kind == OVL_I_PUSH) {
                uint32_t q = in->dst.rank;

                if (!hb(s, q, s->rec_ready[q], r, i))
                    return violation(s, "r%u #%zu: writes r%u's %s before its READY", r, i, q,
                                     ovl_buf_name(in->dst.buf));
                if (!hb(s, r, i, q, s->done[q]))
                    return violation(s, "r%u #%zu: r%u may complete while its %s is written", r, i,
                                     q, ovl_buf_name(in->dst.buf));
            }
            for (uint32_t b = b0; b < b1; b++) {
                const char *what = in->src.buf == OVL_BUF_SA ? "SA" : "shard";

                if (!hb(s, b, s->rec_ready[b], r, i))
                    return violation(s, "r%u #%zu: reads r%u's %s before its READY", r, i, b, what);
                if (!hb(s, r, i, b, s->done[b]))
                    return violation(s, "r%u #%zu: r%u may complete while its %s is read", r, i, b,
                                     what);
            }
        }
    return true;
}

static int span_cmp(const void *a, const void *b)
{
    const span_t *x = a, *y = b;

    if (x->block != y->block)
        return x->block < y->block ? -1 : 1;
    if (x->row0 != y->row0)
        return x->row0 < y->row0 ? -1 : 1;
    return 0;
}

/* Appends to v[n..] the spans of rows [row, row+rows) of a (world*m)-row
 * buffer (C or G), cut at its blocks' bounds; returns the new count. */
static size_t add_spans(const sim_t *s, uint64_t m, uint64_t row, uint64_t rows, uint32_t rank,
                        size_t instr, span_t *v, size_t n)
{
    while (rows > 0) {
        uint64_t at = row % m, len = m - at < rows ? m - at : rows;

        assert_true(n < s->maxspans);
        v[n++] = (span_t){
            .block = (uint32_t)(row / m), .row0 = at, .rows = len, .instr = instr, .rank = rank};
        row += len;
        rows -= len;
    }
    return n;
}

/* Collects into v the row spans written into rank r's C i (c >= 0) or
 * gbuf (c < 0: G, or SG, whose rows are G's rows' scales), sorted by block
 * and row: by r's instructions, and into G (SG) by the peers' PUSHes too. */
static size_t collect_spans(const sim_t *s, uint32_t r, int c, ovl_buf_t gbuf, span_t *v)
{
    const ovl_plan_t *p = &s->plans[r];
    uint64_t m = p->params.m;
    bool gemm = c >= 0;
    size_t n = 0;

    for (size_t i = 0; i < p->ninstr; i++) {
        const ovl_instr_t *in = &p->instr[i];

        if (gemm && in->kind == OVL_I_GEMM && ovl_buf_c_index(in->dst.buf) == c) {
            for (uint32_t b = 0; b < in->nblocks; b++)
                n = add_spans(s, m, in->dst.row + b * in->stride, in->rows, r, i, v, n);
        } else if (gemm || in->dst.buf != gbuf) {
            continue;
        } else if (in->kind == OVL_I_ALLGATHER) {
            for (uint32_t b = 0; b < s->world; b++)
                n = add_spans(s, m, in->dst.row + b * in->stride, in->rows, r, i, v, n);
        } else if (in->kind == OVL_I_PULL) {
            n = add_spans(s, m, in->dst.row, in->rows, r, i, v, n);
        } else if (in->kind == OVL_I_RAIL) {
            /* what it receives: each sender's rows into the sender's block */
            for (uint32_t x = 0; x < in->nrecv; x++)
                n = add_spans(s, m, in->dst.row + rail_recvs(s, r, in)[x] * in->stride, in->rows, r,
                              i, v, n);
        }
    }
    for (uint32_t q = 0; !gemm && q < s->world; q++)
        for (size_t i = 0; i < s->plans[q].ninstr; i++) {
            const ovl_instr_t *in = &s->plans[q].instr[i];

            if (in->kind == OVL_I_PUSH && in->dst.rank == r && in->dst.buf == gbuf)
                n = add_spans(s, m, in->dst.row, in->rows, q, i, v, n);
        }
    qsort(v, n, sizeof(*v), span_cmp);
    return n;
}

/* Sorted spans of one rank: no row twice; with `whole`, every row of every
 * block exactly once. */
static bool check_tiling(sim_t *s, uint32_t r, const span_t *v, size_t n, bool whole,
                         const char *what)
{
    uint64_t m = s->plans[r].params.m;
    size_t i = 0;

    for (uint32_t b = 0; b < s->world; b++) {
        uint64_t next = 0;

        for (; i < n && v[i].block == b; i++) {
            if (v[i].row0 < next)
                return violation(s, "r%u: %s block %u row %llu written twice", r, what, b,
                                 (unsigned long long)v[i].row0);
            if (whole && v[i].row0 > next)
                return violation(s, "r%u: %s block %u row %llu never written", r, what, b,
                                 (unsigned long long)next);
            next = v[i].row0 + v[i].rows;
        }
        if (whole && next != m)
            return violation(s, "r%u: %s block %u row %llu never written", r, what, b,
                             (unsigned long long)next);
    }
    return true;
}

/* (b) for one block's rows [row0, end) of owner's G (or SG: gbuf) that
 * instruction #i of rank r reads (a GEMM its own, a PULL a peer's):
 * written by instructions of owner (spans g) ordered before it. */
static bool g_rows_ready(sim_t *s, uint32_t owner, uint32_t r, size_t i, ovl_buf_t gbuf,
                         const span_t *g, size_t ng, uint32_t b, uint64_t row0, uint64_t end)
{
    const char *what = ovl_instr_name(s->plans[r].instr[i].kind);
    uint64_t next = row0;

    for (size_t w = 0; w < ng && next < end; w++) {
        if (g[w].block != b || g[w].row0 + g[w].rows <= next || g[w].row0 >= end)
            continue;
        if (g[w].row0 > next)
            break; /* a gap: reported below */
        if (!hb(s, g[w].rank, g[w].instr, r, i))
            return violation(s,
                             "r%u #%zu: %s reads r%u's %s block %u rows %llu+ before r%u #%zu "
                             "writes them",
                             r, i, what, owner, ovl_buf_name(gbuf), b, (unsigned long long)next,
                             g[w].rank, g[w].instr);
        next = g[w].row0 + g[w].rows;
    }
    if (next < end)
        return violation(s, "r%u #%zu: %s reads r%u's %s block %u row %llu, never written", r, i,
                         what, owner, ovl_buf_name(gbuf), b, (unsigned long long)next);
    return true;
}

/* (b) across ranks: a PULL of rank r (#i) reads rows of a peer's G (or
 * their scales in its SG), which the peer wrote (received from another
 * node) before it. */
static bool peer_g_ready(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    uint64_t m = s->plans[r].params.m;
    uint32_t owner = in->src.rank;

    if (s->pspans_of != owner || s->pspans_buf != in->src.buf) {
        s->npspans = collect_spans(s, owner, -1, in->src.buf, s->pspans);
        s->pspans_of = owner;
        s->pspans_buf = in->src.buf;
    }
    /* one block: check_operands proved it */
    return g_rows_ready(s, owner, r, i, in->src.buf, s->pspans, s->npspans,
                        (uint32_t)(in->src.row / m), in->src.row % m, in->src.row % m + in->rows);
}

/* (b) the rows [row, +rows) of rank r's G (or SG: gbuf, spans g) that
 * GEMM #i reads, for each of its nblocks blocks stride rows apart, cut at
 * the bounds of G's blocks: each written before the GEMM. */
static bool gemm_rows_ready(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in, uint64_t first,
                            ovl_buf_t gbuf, const span_t *g, size_t ng)
{
    uint64_t m = s->plans[r].params.m;
    bool ok = true;

    for (uint32_t blk = 0; ok && blk < in->nblocks; blk++) {
        uint64_t row = first + blk * in->stride, rows = in->rows;

        while (ok && rows > 0) {
            uint64_t at = row % m, len = m - at < rows ? m - at : rows;

            ok = g_rows_ready(s, r, r, i, gbuf, g, ng, (uint32_t)(row / m), at, at + len);
            row += len;
            rows -= len;
        }
    }
    return ok;
}

/* (a), (b), (f): C rows written exactly once; G rows at most once (exactly
 * once with a_out); every G row a GEMM reads was written by an instruction
 * ordered before it; G is marked used iff it is touched. Scaled per row,
 * SG as G: its rows at most once (exactly once with a_out), every SG row a
 * GEMM reads (its sa's) written before it; SG marked used iff touched, and
 * neither where the plan gathers no scales. */
static bool check_rows(sim_t *s)
{
    bool ok = true;

    for (uint32_t r = 0; ok && r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        bool by_row = gathers_scales(&p->params);
        span_t *c = s->cspans, *g = s->gspans, *sg = s->sgspans;
        size_t ng = collect_spans(s, r, -1, OVL_BUF_G, g);
        size_t nsg = collect_spans(s, r, -1, OVL_BUF_SG, sg);
        bool reads_g = false, reads_sg = false;

        ok = check_tiling(s, r, g, ng, p->params.want_gathered, "G");
        if (ok && by_row)
            ok = check_tiling(s, r, sg, nsg, p->params.want_gathered, "SG");
        else if (ok && nsg > 0)
            ok = violation(s, "r%u: SG written in a plan that gathers no scales", r);
        /* every C i: each row once */
        for (uint32_t ci = 0; ok && ci < ovl_plan_nb(&p->params); ci++) {
            size_t nc = collect_spans(s, r, (int)ci, OVL_BUF_G, c);

            ok = check_tiling(s, r, c, nc, true, ovl_buf_name(ovl_buf_c(ci)));
        }
        for (size_t i = 0; ok && i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if (in->kind == OVL_I_PULL && (in->src.buf == OVL_BUF_G || in->src.buf == OVL_BUF_SG))
                ok = peer_g_ready(s, r, i, in);
            if (in->kind != OVL_I_GEMM)
                continue;
            if (in->src.buf == OVL_BUF_G) {
                reads_g = true;
                ok = gemm_rows_ready(s, r, i, in, in->src.row, OVL_BUF_G, g, ng);
            }
            if (ok && p->params.sc.scaled && in->sa.buf == OVL_BUF_SG) {
                reads_sg = true;
                ok = by_row ? gemm_rows_ready(s, r, i, in, in->sa.row, OVL_BUF_SG, sg, nsg)
                            : violation(s,
                                        "r%u #%zu: GEMM reads SG, which the plan does not "
                                        "gather",
                                        r, i);
            }
        }
        if (ok && p->bufs[OVL_BUF_G].used != (reads_g || ng > 0))
            ok = violation(s, "r%u: G used is %d but G is %s", r, p->bufs[OVL_BUF_G].used,
                           reads_g || ng > 0 ? "used" : "unused");
        if (ok && p->bufs[OVL_BUF_SG].used != (reads_sg || nsg > 0))
            ok = violation(s, "r%u: SG used is %d but SG is %s", r, p->bufs[OVL_BUF_SG].used,
                           reads_sg || nsg > 0 ? "used" : "unused");
        /* (c) scales by tensor: no SG */
        if (ok && !by_row && p->bufs[OVL_BUF_SG].used)
            ok = violation(s, "r%u: SG used in a plan that gathers no scales", r);
    }
    return ok;
}

/* (d) Every buffer the op has is of the dtype its role says, whatever
 * the planner's helpers say: A and G the op's; B i the scaling's b_dtype
 * (the op's unscaled); C i, P and BIAS the out_dtype (the op's
 * unscaled); SA, SB and SG fp32. */
static bool check_dtypes(sim_t *s, uint32_t r)
{
    const ovl_plan_t *p = &s->plans[r];
    const ovl_plan_params_t *pp = &p->params;
    bool rs = pp->kind == OVL_OP_GEMM_RS, scaled = pp->sc.scaled;
    ovl_dtype_t bdt = scaled ? pp->sc.b_dtype : pp->dtype;
    ovl_dtype_t out = scaled ? pp->sc.out_dtype : pp->dtype;
    ovl_dtype_t want[OVL_BUF_COUNT];
    bool has[OVL_BUF_COUNT] = {false};

    has[OVL_BUF_A] = true, want[OVL_BUF_A] = pp->dtype;
    has[OVL_BUF_G] = !rs, want[OVL_BUF_G] = pp->dtype;
    has[OVL_BUF_P] = rs, want[OVL_BUF_P] = out;
    for (uint32_t bi = 0; bi < ovl_plan_nb(pp); bi++) {
        has[ovl_buf_b(bi)] = has[ovl_buf_c(bi)] = true;
        want[ovl_buf_b(bi)] = bdt;
        want[ovl_buf_c(bi)] = out;
    }
    has[OVL_BUF_SA] = scaled;
    has[OVL_BUF_SG] = scaled && !rs;
    want[OVL_BUF_SA] = want[OVL_BUF_SG] = OVL_DTYPE_FP32;
    for (uint32_t bi = 0; bi < ovl_plan_nb(pp); bi++) {
        has[ovl_buf_sb(bi)] = has[ovl_buf_bias(bi)] = scaled;
        want[ovl_buf_sb(bi)] = OVL_DTYPE_FP32;
        want[ovl_buf_bias(bi)] = out;
    }
    for (int b = 0; b < OVL_BUF_COUNT; b++)
        if (has[b] && p->bufs[b].dtype != want[b])
            return violation(s, "r%u: buffer %s in %s, not %s", r, ovl_buf_name((ovl_buf_t)b),
                             ovl_dtype_name(p->bufs[b].dtype), ovl_dtype_name(want[b]));
    return true;
}

/* A scaled op's own buffers' shapes (ovl.h's table, written out here):
 * SA m x 1 by row, m x ceil(k/128) by 1x128 (1 x 1 by tensor); for each
 * B i (n_i x k), SB i 1 x n_i by row, n_i x ceil(k/128) by 1x128,
 * ceil(n_i/128) x ceil(k/128) by 128x128 (1 x 1), BIAS i 1 x n_i. */
static void scaled_shapes(const ovl_plan_params_t *pp, ovl_plan_buf_t *shape)
{
    uint64_t kq = (pp->k + 127) / 128;

    if (!pp->sc.scaled)
        return;
    shape[OVL_BUF_SA] =
        (ovl_plan_buf_t){.rows = scales_per_row(pp) ? pp->m : 1, .cols = scale_cols(pp)};
    for (uint32_t bi = 0; bi < ovl_plan_nb(pp); bi++) {
        uint64_t n = ovl_plan_bn(pp, bi);
        ovl_plan_buf_t sb = {.rows = 1, .cols = 1};

        if (pp->sc.b_mode == OVL_SCALE_ROW)
            sb.cols = n;
        else if (pp->sc.b_mode == OVL_SCALE_BLOCK_1X128)
            sb = (ovl_plan_buf_t){.rows = n, .cols = kq};
        else if (pp->sc.b_mode == OVL_SCALE_BLOCK_128X128)
            sb = (ovl_plan_buf_t){.rows = (n + 127) / 128, .cols = kq};
        shape[ovl_buf_sb(bi)] = sb;
        shape[ovl_buf_bias(bi)] = (ovl_plan_buf_t){.rows = 1, .cols = n};
    }
}

/* (d) Which buffers lie in ovld's scratch (want[b]) and where: the scratch
 * flags exact, and each buffer in the scratch at its offset. */
static bool check_scratch_flags(sim_t *s, uint32_t r, const bool *want, const uint64_t *offset)
{
    const ovl_plan_t *p = &s->plans[r];

    for (int b = 0; b < OVL_BUF_COUNT; b++) {
        if (p->bufs[b].scratch != want[b])
            return violation(s, "r%u: buffer %s in the scratch is %d, want %d", r,
                             ovl_buf_name((ovl_buf_t)b), p->bufs[b].scratch, want[b]);
        if (want[b] && p->bufs[b].scratch_offset != offset[b])
            return violation(
                s, "r%u: buffer %s's scratch_offset %llu, want %llu", r, ovl_buf_name((ovl_buf_t)b),
                (unsigned long long)p->bufs[b].scratch_offset, (unsigned long long)offset[b]);
    }
    return true;
}

/* The buffers' shapes, dtypes and used flags, and the scratch: G's bytes
 * exactly when G is used and is not the client's a_out, then (256-byte
 * aligned) SG's where the plan gathers scales, as the pure function says
 * before building. */
static bool check_bufs(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        const ovl_plan_params_t *pp = &p->params;
        uint64_t rows = pp->m * s->world, scratch = 0, want = 0;
        bool used[OVL_BUF_COUNT] = {false};
        ovl_plan_buf_t shape[OVL_BUF_COUNT] = {
            [OVL_BUF_A] = {.rows = pp->m, .cols = pp->k},
            [OVL_BUF_G] = {.rows = rows, .cols = pp->k},
        };

        for (uint32_t bi = 0; bi < ovl_plan_nb(pp); bi++) {
            uint64_t n = ovl_plan_bn(pp, bi);

            shape[ovl_buf_b(bi)] =
                (ovl_plan_buf_t){.rows = pp->transb ? n : pp->k, .cols = pp->transb ? pp->k : n};
            shape[ovl_buf_c(bi)] = (ovl_plan_buf_t){.rows = rows, .cols = n};
        }
        scaled_shapes(pp, shape);
        if (pp->sc.scaled)
            shape[OVL_BUF_SG] = (ovl_plan_buf_t){.rows = rows, .cols = scale_cols(pp)};

        for (size_t i = 0; i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if (in->kind == OVL_I_GEMM)
                used[in->b.buf] = true;
            if (in->kind == OVL_I_GEMM && pp->sc.scaled) {
                /* B i's scales and bias, i the GEMM's B */
                uint32_t i = ovl_gemm_b(in);

                used[in->sa.buf] = used[ovl_buf_sb(i)] = true;
                used[ovl_buf_bias(i)] |= pp->sc.bias;
            }
            if (in->kind == OVL_I_GEMM || in->kind == OVL_I_PULL || in->kind == OVL_I_PUSH ||
                in->kind == OVL_I_ALLGATHER || in->kind == OVL_I_RAIL)
                used[in->src.buf] = used[in->dst.buf] = true;
        }
        for (int b = 0; b < OVL_BUF_COUNT; b++) {
            if (p->bufs[b].used != used[b])
                return violation(s, "r%u: buffer %s used is %d, instructions say %d", r,
                                 ovl_buf_name((ovl_buf_t)b), p->bufs[b].used, used[b]);
            if (p->bufs[b].rows != shape[b].rows || p->bufs[b].cols != shape[b].cols)
                return violation(s, "r%u: buffer %s shape", r, ovl_buf_name((ovl_buf_t)b));
        }
        if (!check_dtypes(s, r))
            return false;
        {
            bool in_scratch[OVL_BUF_COUNT] = {false};
            uint64_t offset[OVL_BUF_COUNT] = {0};

            in_scratch[OVL_BUF_G] = used[OVL_BUF_G] && !pp->want_gathered;
            if (in_scratch[OVL_BUF_G])
                want = rows * pp->k * ovl_dtype_size(pp->dtype);
            /* SG after G, at a multiple of 256 bytes (at 0 with a_out):
             * a row of scale_cols floats per row of G */
            in_scratch[OVL_BUF_SG] = used[OVL_BUF_SG];
            if (used[OVL_BUF_SG]) {
                offset[OVL_BUF_SG] = (want + 255) / 256 * 256;
                want = offset[OVL_BUF_SG] + rows * scale_cols(pp) * sizeof(float);
            }
            if (!check_scratch_flags(s, r, in_scratch, offset))
                return false;
        }
        if (ovl_plan_scratch_bytes(pp, &scratch) != OVL_OK || scratch != want ||
            p->scratch_bytes != want)
            return violation(s, "r%u: scratch %llu (before building %llu), G and SG need %llu", r,
                             (unsigned long long)p->scratch_bytes, (unsigned long long)scratch,
                             (unsigned long long)want);
    }
    return true;
}

/* How A moves and what each stream is for. naive and collective gather by
 * ALLGATHERs exactly when the params say NCCL, by PULLs otherwise; ring
 * moves A by the copy engine, in one node by PULLs at world 2 and by
 * PUSHes from world 3 on, and across nodes issues one RAIL per chunk (and
 * only there). An ALLGATHER of whole shards is NCCL's all-gather, of chunks
 * send/recv. Stream 0 is the client's; another stream is for
 * communication if it carries ALLGATHERs or RAILs, for copies if it
 * carries PULLs, for compute if it carries GEMMs only. */
static bool check_transfers(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        bool nccl = p->params.algo != OVL_ALGO_RING && nccl_gather(&p->params);
        bool rails = p->params.algo == OVL_ALGO_RING && s->nnodes > 1;
        bool ag[OVL_PLAN_MAX_STREAMS] = {false}, pull[OVL_PLAN_MAX_STREAMS] = {false};
        bool gemm[OVL_PLAN_MAX_STREAMS] = {false};
        uint32_t nrail = 0;

        for (size_t i = 0; i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];
            bool whole = in->src.row == 0 && in->rows == p->params.m;

            if (in->kind == OVL_I_RAIL) {
                if (!rails)
                    return violation(s, "r%u #%zu: RAIL in a plan of one node or not ring", r, i);
                ag[in->stream] = true;
                nrail += in->dst.buf == OVL_BUF_G; /* not the scales' */
            }
            if (in->kind == OVL_I_ALLGATHER) {
                if (!nccl)
                    return violation(s, "r%u #%zu: ALLGATHER where the params say pulls", r, i);
                if (in->method != (whole ? OVL_AG_NCCL_ALLGATHER : OVL_AG_NCCL_SENDRECV))
                    return violation(s, "r%u #%zu: ALLGATHER method %s for rows %llu+%llu", r, i,
                                     ovl_ag_method_name(in->method),
                                     (unsigned long long)in->src.row, (unsigned long long)in->rows);
                ag[in->stream] = true;
            }
            if (in->kind == OVL_I_PULL || in->kind == OVL_I_PUSH) {
                /* NCCL gathers every block, a_out's own included */
                if (nccl)
                    return violation(s, "r%u #%zu: %s where the params say NCCL", r, i,
                                     ovl_instr_name(in->kind));
                /* ring of one node: pulls below RING_PUSH_MIN_WORLD (3), pushes from it
                 * on; the own block of a_out is pulled from the own A either way */
                if (p->params.algo == OVL_ALGO_RING && s->nnodes == 1 &&
                    (in->kind == OVL_I_PUSH ? s->world < 3 : s->world >= 3 && in->src.rank != r))
                    return violation(s, "r%u #%zu: ring at world %u moves A by %s", r, i, s->world,
                                     ovl_instr_name(in->kind));
                pull[in->stream] = true;
            }
            if (in->kind == OVL_I_GEMM)
                gemm[in->stream] = true;
        }
        if (rails && nrail != p->chunks)
            return violation(s, "r%u: %u RAILs for %u chunks", r, nrail, p->chunks);
        if (p->roles[0] != OVL_ROLE_CLIENT)
            return violation(s, "r%u: s0's role is %s", r, ovl_stream_role_name(p->roles[0]));
        for (uint32_t st = 1; st < p->nstreams; st++) {
            ovl_stream_role_t want = ag[st]     ? OVL_ROLE_COMM
                                     : pull[st] ? OVL_ROLE_COPY
                                                : OVL_ROLE_COMPUTE;

            if ((ag[st] && pull[st]) || (want == OVL_ROLE_COMPUTE && !gemm[st]))
                return violation(s, "r%u: s%u carries no one kind of work", r, st);
            if (p->roles[st] != want)
                return violation(s, "r%u: s%u's role is %s, its work says %s", r, st,
                                 ovl_stream_role_name(p->roles[st]), ovl_stream_role_name(want));
        }
    }
    return true;
}

/* (d) collective: the streams' initial waits (on the own READY, and with
 * the copy-engine gather on the peers' too) form their own loop ahead of
 * the first transfer (ALLGATHER or PULL). */
static bool check_collective(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        size_t first = p->ninstr;

        for (size_t i = 0; i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if ((in->kind == OVL_I_ALLGATHER || in->kind == OVL_I_PULL || in->kind == OVL_I_PUSH ||
                 in->kind == OVL_I_REDUCE_SCATTER) &&
                first == p->ninstr)
                first = i;
            if (in->kind == OVL_I_WAIT && in->event == OVL_EV_READY && i > first)
                return violation(s, "r%u #%zu: initial wait after the first transfer", r, i);
        }
        if (first == p->ninstr)
            return violation(s, "r%u: no transfer", r);
    }
    return true;
}

/* (g) ring: own shard first (every LOCAL GEMM issued before any GATHERED
 * one), then across nodes the node's shards, then the remote ones; with
 * peers, exactly two GEMM streams, and the one whose first GEMM is issued
 * later starts with a SLEEP. Streams: 4 in one node; across nodes 5, the
 * fifth for the RAILs, or 4 where the rank pulls nothing (no peer on its
 * node, no a_out), the RAILs on stream 1. */
static bool check_ring(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        size_t first_gemm[OVL_PLAN_MAX_STREAMS];
        bool slept[OVL_PLAN_MAX_STREAMS] = {false};
        bool seen_gathered = false;
        uint32_t gemm_streams = 0, second = 0, want_streams = 4, stage = 0;
        size_t second_at = 0;

        if (s->nnodes > 1 && (s->size[s->node[r]] > 1 || p->params.want_gathered))
            want_streams = 5;
        for (uint32_t st = 0; st < OVL_PLAN_MAX_STREAMS; st++)
            first_gemm[st] = SIZE_MAX;
        for (size_t i = 0; i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if (in->kind == OVL_I_SLEEP && first_gemm[in->stream] == SIZE_MAX)
                slept[in->stream] = true;
            if (in->kind != OVL_I_GEMM)
                continue;
            if (in->src.buf == OVL_BUF_G)
                seen_gathered = true;
            else if (seen_gathered)
                return violation(s, "r%u #%zu: own-shard GEMM after a peer's", r, i);
            if (in->src.buf == OVL_BUF_G) {
                /* 1: a shard of the node, 2: of another node */
                uint32_t blk = (uint32_t)(in->dst.row / p->params.m);
                uint32_t st = s->node[blk] == s->node[r] ? 1 : 2;

                if (st < stage)
                    return violation(s, "r%u #%zu: GEMM of the node's shard after a remote one", r,
                                     i);
                stage = st;
            }
            if (first_gemm[in->stream] == SIZE_MAX) {
                first_gemm[in->stream] = i;
                gemm_streams++;
                if (gemm_streams == 2) {
                    second = in->stream;
                    second_at = i;
                }
            }
        }
        if (s->world == 1)
            continue;
        if (gemm_streams != 2 || p->nstreams != want_streams)
            return violation(s, "r%u: %u GEMM streams of %u streams, want 2 of %u", r, gemm_streams,
                             p->nstreams, want_streams);
        if (!slept[second])
            return violation(s, "r%u #%zu: no SLEEP ahead of the first GEMM on s%u", r, second_at,
                             second);
    }
    return true;
}

/* ------------------------------------------- GEMM + reduce-scatter */

/*
 * GEMM + reduce-scatter's plans (docs/plans.md): every rank's P is its
 * partial product, m x n, and rank b's block is rows [b mb, (b+1) mb) of
 * every P (mb = m / world), summed into b's C by REDUCE_SCATTERs. What is
 * proved, beyond the shared checks (fields, shape, simulation with the
 * REDUCE_SCATTER as a full barrier, bracketing):
 *   check_rs_operands  a GEMM multiplies the own A into the own P at the
 *                      same rows (one block, or blocks mb apart); a
 *                      REDUCE_SCATTER reads the own P (rank 0's block of
 *                      its rows) and writes the own C at the block row,
 *                      with the op's geometry and reduction
 *   check_rs_bufs      shapes, used flags, the scratch is P's bytes
 *   check_rs_rows      every row of P written by one GEMM, which happens
 *                      before the REDUCE_SCATTER that reads it (each rank
 *                      contributes its own P); every row of every block
 *                      read by exactly one REDUCE_SCATTER; every row of C
 *                      written by exactly one
 *   check_collective   (d) as all-gather + GEMM's, the first transfer
 *                      being a REDUCE_SCATTER
 *   check_rs_dataflow  end to end, whatever the plan: what every row holds,
 *                      followed through GEMMs, PUSHes, REDUCEs and
 *                      REDUCE_SCATTERs: every row x of rank r's C is row x
 *                      of block r summed over every rank, each once
 */
/*
 * push (docs/plans.md): rank r's P is W receive slots (slot q, rows q*mb,
 * rank q's partial of r's block), then the partials r sends, step t's at
 * rows m + (t-1)*mb, being the partial of block (r + t) mod W. A GEMM
 * multiplies the rows of A of one block into the own slot (the own block)
 * or into its step's rows (a peer's); a PUSH copies a step's rows into
 * slot r of that step's peer, at the same rows of the block; a REDUCE sums
 * the W slots' rows into the same rows of C.
 */
/*
 * push across nodes (docs/plans.md; plan_rs.c, railpush_emit): what each
 * instruction names on its own, its buffers, ranks and bounds; what the
 * rows hold, and that every row of C is the sum it must be, is
 * check_rs_dataflow's proof.
 */
static bool check_railpush_operands(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_t *p = &s->plans[r];
    const ovl_plan_params_t *pp = &p->params;
    uint64_t m = pp->m, mb = m / s->world, prows = p->bufs[OVL_BUF_P].rows;

    switch (in->kind) {
    case OVL_I_GEMM:
        if (!ref_is(in->src, OVL_BUF_A, r) || !ref_is(in->dst, OVL_BUF_P, r) ||
            !ref_is(in->b, OVL_BUF_B, r) || in->b.row != 0 || in->nblocks != 1 || in->stride != 0 ||
            in->accumulate || in->rows != mb || in->src.row % mb != 0 ||
            !rows_within(in->src.row, mb, m) || !rows_within(in->dst.row, mb, prows) ||
            in->n != pp->n || in->k != pp->k || in->transb != pp->transb)
            return violation(s, "r%u #%zu: GEMM of push across nodes: geometry", r, i);
        return true;
    case OVL_I_PUSH:
        if (!ref_is(in->src, OVL_BUF_P, r) || in->dst.buf != OVL_BUF_P ||
            in->dst.rank >= s->world || in->dst.rank == r || s->node[in->dst.rank] != s->node[r] ||
            in->rows != mb || in->cols != pp->n || !rows_within(in->src.row, mb, prows) ||
            !rows_within(in->dst.row, mb, m))
            return violation(s, "r%u #%zu: PUSH of push across nodes: geometry", r, i);
        return true;
    case OVL_I_REDUCE:
        if (!ref_is(in->src, OVL_BUF_P, r) || in->dst.rank != r || in->rows != mb ||
            in->cols != pp->n || in->nblocks == 0 || in->stride < mb ||
            !rows_within(in->src.row, (in->nblocks - 1) * in->stride + mb, prows) ||
            (in->dst.buf == OVL_BUF_C
                 ? in->dst.row != 0 || in->avg != (pp->reduce_op == OVL_REDUCE_AVG)
                 : in->dst.buf != OVL_BUF_P || in->avg || !rows_within(in->dst.row, mb, prows)))
            return violation(s, "r%u #%zu: REDUCE of push across nodes: geometry", r, i);
        return true;
    case OVL_I_RAIL:
        if (in->method != OVL_AG_NCCL_RAIL || !ref_is(in->src, OVL_BUF_P, r) ||
            !ref_is(in->dst, OVL_BUF_P, r) || in->rows != mb || in->cols != pp->n ||
            in->stride != mb || !rows_within(in->src.row, mb, prows) || in->peers > p->npeers ||
            in->nsend > p->npeers - in->peers || in->nrecv > p->npeers - in->peers - in->nsend)
            return violation(s, "r%u #%zu: RAIL of push across nodes: geometry", r, i);
        for (uint32_t k = 0; k < in->nsend + in->nrecv; k++) {
            uint32_t q = p->peers[in->peers + k];

            if (q >= s->world || s->node[q] == s->node[r])
                return violation(s, "r%u #%zu: RAIL with r%u of its own node or none", r, i, q);
            if (k >= in->nsend && !rows_within(in->dst.row + q * mb, mb, prows))
                return violation(s, "r%u #%zu: RAIL lands past P", r, i);
        }
        return true;
    default:
        return violation(s, "r%u #%zu: %s in push across nodes", r, i, ovl_instr_name(in->kind));
    }
}

static bool check_push_operands(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_params_t *pp = &s->plans[r].params;
    uint32_t w = s->world;
    uint64_t m = pp->m, mb = m / w, prows = 2 * m - mb;

    switch (in->kind) {
    case OVL_I_GEMM: {
        uint64_t off = in->src.row % mb, d = in->src.row / mb, want;

        if (!ref_is(in->src, OVL_BUF_A, r) || !ref_is(in->dst, OVL_BUF_P, r) ||
            !ref_is(in->b, OVL_BUF_B, r) || in->b.row != 0 || in->accumulate)
            return violation(s, "r%u #%zu: GEMM names buffers it may not", r, i);
        if (in->n != pp->n || in->k != pp->k || in->transb != pp->transb || in->nblocks != 1 ||
            in->stride != 0 || !rows_within(in->src.row, in->rows, m) || off + in->rows > mb)
            return violation(s, "r%u #%zu: GEMM geometry", r, i);
        /* the own block into the own slot, a peer's into its step's rows */
        want = d == r ? r * mb + off : m + ((d + w - r) % w - 1) * mb + off;
        if (in->dst.row != want)
            return violation(s, "r%u #%zu: GEMM of block %llu into P row %llu, not %llu", r, i,
                             (unsigned long long)d, (unsigned long long)in->dst.row,
                             (unsigned long long)want);
        return true;
    }
    case OVL_I_PUSH: {
        uint64_t t, off, d;

        if (!ref_is(in->src, OVL_BUF_P, r) || in->dst.buf != OVL_BUF_P || in->dst.rank >= w ||
            in->dst.rank == r)
            return violation(s,
                             "r%u #%zu: PUSH from other than the own P or into other than a "
                             "peer's P",
                             r, i);
        if (in->src.row < m || !rows_within(in->src.row, in->rows, prows) || in->cols != pp->n)
            return violation(s, "r%u #%zu: PUSH geometry", r, i);
        t = (in->src.row - m) / mb + 1;
        off = (in->src.row - m) % mb;
        d = (r + t) % w;
        if (off + in->rows > mb || in->dst.rank != d || in->dst.row != r * mb + off)
            return violation(s,
                             "r%u #%zu: PUSH of step %llu's rows into r%u:P[%llu], not "
                             "r%llu:P[%llu]",
                             r, i, (unsigned long long)t, in->dst.rank,
                             (unsigned long long)in->dst.row, (unsigned long long)d,
                             (unsigned long long)(r * mb + off));
        return true;
    }
    case OVL_I_REDUCE:
        if (!ref_is(in->src, OVL_BUF_P, r) || !ref_is(in->dst, OVL_BUF_C, r))
            return violation(s, "r%u #%zu: REDUCE from other than P or into other than C", r, i);
        if (!rows_within(in->src.row, in->rows, mb) || in->dst.row != in->src.row ||
            in->nblocks != w || in->stride != mb || in->cols != pp->n ||
            in->avg != (pp->reduce_op == OVL_REDUCE_AVG))
            return violation(s, "r%u #%zu: REDUCE geometry", r, i);
        return true;
    default:
        return violation(s, "r%u #%zu: %s in push", r, i, ovl_instr_name(in->kind));
    }
}

/*
 * ring (docs/plans.md; plan_rs.c, ringrs_emit): rank r's P is W - 1
 * receive slots (the partial arriving at step t at rows (t-1) mb), then the
 * sums it sends (step t's at (W-1+t) mb). At step t the rank works on
 * block d = r - 1 - t (mod W): a GEMM multiplies rows of A of block d into
 * the same rows of step t's send rows, adding those of receive slot t from
 * step 1 on, and the last step's (d = r) goes into C (with avg every GEMM
 * scales its product by 1/W); a PUSH copies step t's send rows into
 * receive slot t + 1 of rank r + 1, at the same rows of the block.
 */
static bool check_ringrs_operands(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_params_t *pp = &s->plans[r].params;
    uint32_t w = s->world;
    uint64_t m = pp->m, mb = m / w, sent0 = (uint64_t)(w - 1) * mb;

    switch (in->kind) {
    case OVL_I_GEMM: {
        uint64_t off = in->src.row % mb, d = in->src.row / mb, t;
        bool last, avg;

        if (!ref_is(in->src, OVL_BUF_A, r) || !ref_is(in->b, OVL_BUF_B, r) || in->b.row != 0 ||
            (in->accumulate && !ref_is(in->acc, OVL_BUF_P, r)))
            return violation(s, "r%u #%zu: GEMM names buffers it may not", r, i);
        if (in->n != pp->n || in->k != pp->k || in->transb != pp->transb || in->nblocks != 1 ||
            in->stride != 0 || !rows_within(in->src.row, in->rows, m) || off + in->rows > mb)
            return violation(s, "r%u #%zu: GEMM geometry", r, i);
        t = (r + 2 * (uint64_t)w - 1 - d) % w;
        last = t == w - 1;
        avg = w > 1 && pp->reduce_op == OVL_REDUCE_AVG; /* every product scaled */
        if (!ref_is(in->dst, last ? OVL_BUF_C : OVL_BUF_P, r) ||
            in->dst.row != (last ? off : sent0 + t * mb + off))
            return violation(s, "r%u #%zu: GEMM of block %llu (step %llu) into %s row %llu", r, i,
                             (unsigned long long)d, (unsigned long long)t,
                             ovl_buf_name(in->dst.buf), (unsigned long long)in->dst.row);
        if (in->accumulate != (t > 0) || (t > 0 && in->acc.row != (t - 1) * mb + off) ||
            in->avg != avg)
            return violation(s, "r%u #%zu: GEMM of step %llu adds %s%s", r, i,
                             (unsigned long long)t,
                             in->accumulate ? "rows other than its receive slot's" : "nothing",
                             in->avg != avg ? ", avg wrong" : "");
        return true;
    }
    case OVL_I_PUSH: {
        uint64_t t = (in->src.row - sent0) / mb, off = (in->src.row - sent0) % mb;

        if (!ref_is(in->src, OVL_BUF_P, r) || in->dst.buf != OVL_BUF_P ||
            in->dst.rank != (r + 1) % w || w == 1 || in->src.row < sent0 || t + 1 >= w ||
            off + in->rows > mb || in->cols != pp->n || in->dst.row != t * mb + off)
            return violation(s, "r%u #%zu: PUSH other than of a step's sum into r%u's next slot", r,
                             i, (r + 1) % w);
        return true;
    }
    default:
        return violation(s, "r%u #%zu: %s in ring (gemm_rs)", r, i, ovl_instr_name(in->kind));
    }
}

static bool check_rs_operands(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    const ovl_plan_params_t *pp = &s->plans[r].params;
    uint64_t m = pp->m, mb = m / s->world;

    if (pp->algo == OVL_ALGO_PUSH && s->nnodes > 1)
        return check_railpush_operands(s, r, i, in);
    if (pp->algo == OVL_ALGO_PUSH)
        return check_push_operands(s, r, i, in);
    if (pp->algo == OVL_ALGO_RING)
        return check_ringrs_operands(s, r, i, in);
    switch (in->kind) {
    case OVL_I_GEMM:
        if (!ref_is(in->src, OVL_BUF_A, r) || !ref_is(in->dst, OVL_BUF_P, r) ||
            !ref_is(in->b, OVL_BUF_B, r) || in->b.row != 0 || in->accumulate)
            return violation(s, "r%u #%zu: GEMM names buffers it may not", r, i);
        if (in->n != pp->n || in->k != pp->k || in->transb != pp->transb || in->nblocks == 0 ||
            in->src.row != in->dst.row ||
            (in->nblocks == 1 ? in->stride != 0 || !rows_within(in->dst.row, in->rows, m)
                              : in->nblocks != s->world || in->stride != mb ||
                                    !rows_within(in->dst.row, in->rows, mb)))
            return violation(s, "r%u #%zu: GEMM geometry", r, i);
        return true;
    case OVL_I_REDUCE_SCATTER:
        if (!ref_is(in->src, OVL_BUF_P, r) || !ref_is(in->dst, OVL_BUF_C, r))
            return violation(s, "r%u #%zu: REDUCE_SCATTER from other than P or into other than C",
                             r, i);
        if (!rows_within(in->src.row, in->rows, mb) || in->dst.row != in->src.row ||
            in->stride != mb || in->cols != pp->n || in->avg != (pp->reduce_op == OVL_REDUCE_AVG))
            return violation(s, "r%u #%zu: REDUCE_SCATTER geometry", r, i);
        return true;
    default:
        return violation(s, "r%u #%zu: %s in a GEMM + reduce-scatter", r, i,
                         ovl_instr_name(in->kind));
    }
}

static bool check_rs_bufs(sim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        const ovl_plan_params_t *pp = &p->params;
        bool ring = pp->algo == OVL_ALGO_RING;
        bool push = pp->algo == OVL_ALGO_PUSH || ring, rail = push && s->nnodes > 1;
        uint64_t mb = pp->m / s->world;
        uint64_t prows = ring   ? 2 * (uint64_t)(s->world - 1) * mb
                         : rail ? (3 * (uint64_t)s->world - 1) * mb
                         : push ? 2 * pp->m - mb
                                : pp->m;
        uint64_t scratch = 0, want = prows * pp->n * ovl_dtype_size(ovl_plan_out_dtype(pp));
        ovl_plan_buf_t shape[OVL_BUF_COUNT] = {
            [OVL_BUF_A] = {.used = true, .rows = pp->m, .cols = pp->k},
            [OVL_BUF_B] = {.used = true,
                           .rows = pp->transb ? pp->n : pp->k,
                           .cols = pp->transb ? pp->k : pp->n},
            [OVL_BUF_C] = {.used = true, .rows = pp->m / s->world, .cols = pp->n},
            /* ring at world 1: one GEMM into C, no P */
            [OVL_BUF_P] = {.used = prows > 0, .rows = prows, .cols = pp->n},
        };
        bool in_scratch[OVL_BUF_COUNT] = {[OVL_BUF_P] = prows > 0};
        uint64_t offset[OVL_BUF_COUNT] = {0};

        /* scaled: SA, SB (and BIAS) read by every GEMM; (c) no SG, which
         * only all-gather + GEMM gathers (its shape is not this kind's) */
        scaled_shapes(pp, shape);
        shape[OVL_BUF_SA].used = shape[OVL_BUF_SB].used = pp->sc.scaled;
        shape[OVL_BUF_BIAS].used = pp->sc.scaled && pp->sc.bias;
        shape[OVL_BUF_SG] = p->bufs[OVL_BUF_SG];
        shape[OVL_BUF_SG].used = false;
        for (int b = 0; b < OVL_BUF_COUNT; b++)
            if (p->bufs[b].used != shape[b].used || p->bufs[b].rows != shape[b].rows ||
                p->bufs[b].cols != shape[b].cols)
                return violation(s, "r%u: buffer %s: used %d %llux%llu", r,
                                 ovl_buf_name((ovl_buf_t)b), p->bufs[b].used,
                                 (unsigned long long)p->bufs[b].rows,
                                 (unsigned long long)p->bufs[b].cols);
        if (!check_dtypes(s, r))
            return false;
        /* P alone, at 0 (ring at world 1 has no P: its flag says nothing) */
        if (prows == 0)
            in_scratch[OVL_BUF_P] = p->bufs[OVL_BUF_P].scratch;
        if (!check_scratch_flags(s, r, in_scratch, offset))
            return false;
        if (p->scratch_buf != OVL_BUF_P || ovl_plan_scratch_bytes(pp, &scratch) != OVL_OK ||
            scratch != want || p->scratch_bytes != want)
            return violation(s, "r%u: scratch %llu in %s, P needs %llu", r,
                             (unsigned long long)p->scratch_bytes, ovl_buf_name(p->scratch_buf),
                             (unsigned long long)want);
        if (p->replay)
            return violation(s, "r%u: a plan with a collective call marked for replay", r);
        /* collective's side streams reduce; push's and ring's copy (1) and
         * multiply, and push across nodes reduces the node partials and
         * rails them (4) */
        for (uint32_t st = 0; st < p->nstreams; st++)
            if (p->roles[st] != (st == 0            ? OVL_ROLE_CLIENT
                                 : !push || st == 4 ? OVL_ROLE_COMM
                                 : st == 1          ? OVL_ROLE_COPY
                                                    : OVL_ROLE_COMPUTE))
                return violation(s, "r%u: stream %u's role", r, st);
        if (push && p->nstreams != (rail ? 5u : s->world == 1 ? 1u : ring ? 3u : 4u))
            return violation(s, "r%u: %s on %u streams", r, ovl_algo_name(pp->algo), p->nstreams);
    }
    return true;
}

/*
 * push's and ring's rows: every row of every rank's P is written exactly
 * once (push: a slot by the GEMM of the own block or by the PUSH of its
 * peer, a step's rows by that step's GEMM; ring: a receive slot by the
 * PUSH of the previous rank, a step's sum by its GEMM) and read exactly
 * once after its write (a step's rows by their PUSH; a slot by a REDUCE,
 * or in ring by the GEMM that adds it); a PUSH writes a peer's P after the
 * peer's READY (its previous op is done, its slots free) and before its
 * DONE; every row of C is written by exactly one REDUCE (ring: GEMM).
 */
static bool check_push_rows(sim_t *s)
{
    uint32_t w = s->world;
    uint64_t m = s->plans[0].params.m, mb = m / w, prows = s->plans[0].bufs[OVL_BUF_P].rows;
    /* across nodes the RAILs land in a slot per rank of the job, of which
     * a rank uses one per node: the others are neither written nor read */
    bool across = s->nnodes > 1;
    uint32_t **wr_rank = calloc(w, sizeof(*wr_rank));
    size_t **wr_i = calloc(w, sizeof(*wr_i)); /* instruction + 1; 0: none */
    uint8_t **reads = calloc(w, sizeof(*reads));
    bool ok = true;

    assert_true(wr_rank && wr_i && reads);
    for (uint32_t r = 0; r < w; r++) {
        wr_rank[r] = calloc(prows, sizeof(**wr_rank));
        wr_i[r] = calloc(prows, sizeof(**wr_i));
        reads[r] = calloc(prows, 1);
        assert_true(wr_rank[r] && wr_i[r] && reads[r]);
    }
    for (uint32_t r = 0; ok && r < w; r++)
        for (size_t i = 0; ok && i < s->plans[r].ninstr; i++) {
            const ovl_instr_t *in = &s->plans[r].instr[i];
            uint32_t q = in->kind == OVL_I_PUSH ? in->dst.rank : r;
            /* a RAIL writes the slot of each rank it receives from (at its
             * own instruction, which the senders' RAILs happen before) */
            uint32_t nw = in->kind == OVL_I_RAIL ? in->nrecv : 1;

            if (!(in->kind == OVL_I_GEMM && in->dst.buf == OVL_BUF_P) && in->kind != OVL_I_PUSH &&
                in->kind != OVL_I_RAIL && !(in->kind == OVL_I_REDUCE && in->dst.buf == OVL_BUF_P))
                continue;
            for (uint32_t k = 0; ok && k < nw; k++)
                for (uint64_t x = 0; ok && x < in->rows; x++) {
                    uint64_t row =
                        in->dst.row + x +
                        (in->kind == OVL_I_RAIL ? rail_recvs(s, r, in)[k] * in->stride : 0);

                    if (wr_i[q][row])
                        ok = violation(s, "r%u #%zu: r%u's P row %llu written twice", r, i, q,
                                       (unsigned long long)row);
                    wr_rank[q][row] = r;
                    wr_i[q][row] = i + 1;
                }
            if (ok && in->kind == OVL_I_PUSH) {
                if (!hb(s, q, s->rec_ready[q], r, i))
                    ok = violation(s, "r%u #%zu: writes r%u's P before its READY", r, i, q);
                else if (!hb(s, r, i, q, s->done[q]))
                    ok = violation(s, "r%u #%zu: r%u may complete while its P is written", r, i, q);
            }
        }
    for (uint32_t r = 0; ok && r < w; r++) {
        const ovl_plan_t *p = &s->plans[r];
        uint8_t *cw = calloc(mb, 1);

        assert_non_null(cw);
        for (size_t i = 0; ok && i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];
            uint32_t nb = in->kind == OVL_I_REDUCE ? in->nblocks : 1;
            bool acc = in->kind == OVL_I_GEMM && in->accumulate;
            /* the rows read: a GEMM's added rows (ring), else src's */
            uint64_t from = acc ? in->acc.row : in->src.row;

            if (in->kind != OVL_I_PUSH && in->kind != OVL_I_REDUCE && in->kind != OVL_I_RAIL &&
                in->kind != OVL_I_GEMM)
                continue;
            for (uint32_t b = 0; ok && b < nb && (in->kind != OVL_I_GEMM || acc); b++)
                for (uint64_t x = 0; ok && x < in->rows; x++) {
                    uint64_t row = from + b * in->stride + x;

                    if (!wr_i[r][row] || !hb(s, wr_rank[r][row], wr_i[r][row] - 1, r, i))
                        ok = violation(s, "r%u #%zu: reads P row %llu before it is written", r, i,
                                       (unsigned long long)row);
                    else if (reads[r][row]++)
                        ok = violation(s, "r%u #%zu: P row %llu read twice", r, i,
                                       (unsigned long long)row);
                }
            for (uint64_t x = 0; ok && (in->kind == OVL_I_REDUCE || in->kind == OVL_I_GEMM) &&
                                 in->dst.buf == OVL_BUF_C && x < in->rows;
                 x++)
                if (cw[in->dst.row + x]++)
                    ok = violation(s, "r%u #%zu: C row %llu written twice", r, i,
                                   (unsigned long long)(in->dst.row + x));
        }
        for (uint64_t row = 0; ok && row < prows; row++)
            if ((!wr_i[r][row] || !reads[r][row]) && !(across && !wr_i[r][row] && !reads[r][row]))
                ok = violation(s, "r%u: P row %llu %s", r, (unsigned long long)row,
                               wr_i[r][row] ? "never read" : "never written");
        for (uint64_t row = 0; ok && row < mb; row++)
            if (!cw[row])
                ok = violation(s, "r%u: C row %llu never written", r, (unsigned long long)row);
        free(cw);
    }
    for (uint32_t r = 0; r < w; r++) {
        free(wr_rank[r]);
        free(wr_i[r]);
        free(reads[r]);
    }
    free(wr_rank);
    free(wr_i);
    free(reads);
    return ok;
}

static bool check_rs_rows(sim_t *s)
{
    if (s->plans[0].params.algo == OVL_ALGO_PUSH || s->plans[0].params.algo == OVL_ALGO_RING)
        return check_push_rows(s);

    bool ok = true;

    for (uint32_t r = 0; ok && r < s->world; r++) {
        const ovl_plan_t *p = &s->plans[r];
        uint64_t m = p->params.m, mb = m / s->world;
        size_t *writer = calloc(m, sizeof(*writer)); /* P row's GEMM + 1 */
        uint8_t *reads = calloc(m, 1), *cw = calloc(mb, 1);

        assert_true(writer && reads && cw);
        for (size_t i = 0; ok && i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if (in->kind != OVL_I_GEMM)
                continue;
            for (uint32_t blk = 0; ok && blk < in->nblocks; blk++)
                for (uint64_t x = 0; ok && x < in->rows; x++) {
                    uint64_t row = in->dst.row + blk * in->stride + x;

                    if (writer[row])
                        ok = violation(s, "r%u #%zu: P row %llu written twice", r, i,
                                       (unsigned long long)row);
                    writer[row] = i + 1;
                }
        }
        for (size_t i = 0; ok && i < p->ninstr; i++) {
            const ovl_instr_t *in = &p->instr[i];

            if (in->kind != OVL_I_REDUCE_SCATTER)
                continue;
            for (uint32_t b = 0; ok && b < s->world; b++)
                for (uint64_t x = 0; ok && x < in->rows; x++) {
                    uint64_t row = in->src.row + b * mb + x;

                    if (!writer[row] || !hb(s, r, writer[row] - 1, r, i))
                        ok = violation(s, "r%u #%zu: reads P row %llu before its GEMM", r, i,
                                       (unsigned long long)row);
                    else if (reads[row]++)
                        ok = violation(s, "r%u #%zu: P row %llu reduced twice", r, i,
                                       (unsigned long long)row);
                }
            for (uint64_t x = 0; ok && x < in->rows; x++)
                if (cw[in->dst.row + x]++)
                    ok = violation(s, "r%u #%zu: C row %llu written twice", r, i,
                                   (unsigned long long)(in->dst.row + x));
        }
        for (uint64_t row = 0; ok && row < m; row++)
            if (!writer[row] || !reads[row])
                ok = violation(s, "r%u: P row %llu %s", r, (unsigned long long)row,
                               writer[row] ? "never reduced" : "never written");
        for (uint64_t row = 0; ok && row < mb; row++)
            if (!cw[row])
                ok = violation(s, "r%u: C row %llu never written", r, (unsigned long long)row);
        free(writer);
        free(reads);
        free(cw);
    }
    return ok;
}

/*
 * GEMM + reduce-scatter end to end, whatever the plan (naive, collective,
 * push): what each row holds, followed through every instruction. A row of
 * P or C holds the partial sums of one row of the product (its block and
 * the row in the block) over a set of ranks: a GEMM of rank r makes rank
 * r's partial of the rows of A it multiplies, a PUSH copies rows to a
 * peer, a REDUCE sums blocks of rows of the own P, a REDUCE_SCATTER every
 * rank's; a sum takes rows of the same product row only, each rank's
 * partial once. At the end every row x of rank r's C must hold row x of
 * block r summed over every rank. Rows are computed once their inputs are
 * (the other checks prove each is written once and read after it is
 * written), to a fixpoint. Worlds up to 64 (a bit per rank).
 */
typedef struct rowval {
    bool set;
    uint32_t block;
    uint64_t off;
    uint64_t ranks; /* bit q: rank q's partial is in the sum */
} rowval_t;

/* The union of the rows ins[0..n) into *out; false (with words) where they
 * are of different product rows or a rank's partial comes twice. */
static bool rowval_sum(sim_t *s, uint32_t r, size_t i, const rowval_t *const *ins, uint32_t n,
                       rowval_t *out)
{
    *out = (rowval_t){.set = true, .block = ins[0]->block, .off = ins[0]->off};
    for (uint32_t q = 0; q < n; q++) {
        if (ins[q]->block != out->block || ins[q]->off != out->off)
            return violation(s, "r%u #%zu: sums rows of block %u row %llu and block %u row %llu", r,
                             i, out->block, (unsigned long long)out->off, ins[q]->block,
                             (unsigned long long)ins[q]->off);
        if (ins[q]->ranks & out->ranks)
            return violation(s, "r%u #%zu: a rank's partial summed twice (block %u row %llu)", r, i,
                             out->block, (unsigned long long)out->off);
        out->ranks |= ins[q]->ranks;
    }
    return true;
}

/* nblocks blocks of rows rows, stride apart from row, lie within limit
 * rows (no wrap). */
static bool span_ok(uint64_t row, uint32_t nblocks, uint64_t stride, uint64_t rows, uint64_t limit)
{
    uint64_t end;

    if (nblocks == 0 || rows == 0)
        return false;
    return !__builtin_mul_overflow((uint64_t)(nblocks - 1), stride, &end) &&
           !__builtin_add_overflow(end, row, &end) && !__builtin_add_overflow(end, rows, &end) &&
           end <= limit;
}

/* check_rs_dataflow's own bounds (it may run without check_fields): every
 * row an instruction of rank r names lies in its buffer, of a rank of the
 * job. */
static bool dataflow_bounds(sim_t *s, uint32_t r, size_t i, const ovl_instr_t *in)
{
    uint32_t w = s->world;
    uint64_t m = s->plans[r].params.m, mb = m / w;
    uint64_t prows = s->plans[r].bufs[OVL_BUF_P].rows;
    bool ok = true;

    switch (in->kind) {
    case OVL_I_GEMM:
        ok = in->src.buf == OVL_BUF_A &&
             span_ok(in->src.row, in->nblocks, in->stride, in->rows, m) &&
             (in->dst.buf == OVL_BUF_P
                  ? span_ok(in->dst.row, in->nblocks, in->stride, in->rows, prows)
                  : in->dst.buf == OVL_BUF_C &&
                        span_ok(in->dst.row, in->nblocks, in->stride, in->rows, mb)) &&
             (!in->accumulate || (in->acc.buf == OVL_BUF_P && in->nblocks == 1 &&
                                  span_ok(in->acc.row, 1, 0, in->rows, prows)));
        break;
    case OVL_I_PUSH:
        ok = in->src.buf == OVL_BUF_P && in->dst.buf == OVL_BUF_P && in->dst.rank < w &&
             span_ok(in->src.row, 1, 0, in->rows, prows) &&
             span_ok(in->dst.row, 1, 0, in->rows, s->plans[in->dst.rank].bufs[OVL_BUF_P].rows);
        break;
    case OVL_I_REDUCE:
        ok = in->src.buf == OVL_BUF_P && in->nblocks <= 64 &&
             span_ok(in->src.row, in->nblocks, in->stride, in->rows, prows) &&
             (in->dst.buf == OVL_BUF_P
                  ? span_ok(in->dst.row, 1, 0, in->rows, prows)
                  : in->dst.buf == OVL_BUF_C && span_ok(in->dst.row, 1, 0, in->rows, mb));
        break;
    case OVL_I_REDUCE_SCATTER:
        ok = in->src.buf == OVL_BUF_P && in->dst.buf == OVL_BUF_C &&
             span_ok(in->dst.row, 1, 0, in->rows, mb);
        for (uint32_t q = 0; ok && q < w; q++)
            ok = span_ok(in->src.row, w, in->stride, in->rows, s->plans[q].bufs[OVL_BUF_P].rows);
        break;
    case OVL_I_RAIL:
        ok = in->src.buf == OVL_BUF_P && in->dst.buf == OVL_BUF_P &&
             (uint64_t)in->peers + in->nsend + in->nrecv <= s->plans[r].npeers &&
             span_ok(in->src.row, 1, 0, in->rows, prows);
        for (uint32_t k = 0; ok && k < in->nrecv; k++) {
            uint32_t q = rail_recvs(s, r, in)[k];

            ok = q < w && span_ok(in->dst.row, q + 1, in->stride, in->rows, prows) &&
                 span_ok(in->src.row, 1, 0, in->rows, s->plans[q].bufs[OVL_BUF_P].rows);
        }
        break;
    default:
        break;
    }
    return ok ? true
              : violation(s, "r%u #%zu: %s names rows past its buffers", r, i,
                          ovl_instr_name(in->kind));
}

static bool check_rs_dataflow(sim_t *s)
{
    uint32_t w = s->world;
    uint64_t m = s->plans[0].params.m, mb = m / w;
    rowval_t **pv = calloc(w, sizeof(*pv)), **cv = calloc(w, sizeof(*cv));
    bool **done = calloc(w, sizeof(*done));
    bool ok = w <= 64, progress = true;

    assert_true(pv && cv && done);
    for (uint32_t r = 0; r < w; r++) {
        pv[r] = calloc(s->plans[r].bufs[OVL_BUF_P].rows, sizeof(**pv));
        cv[r] = calloc(mb, sizeof(**cv));
        done[r] = calloc(s->plans[r].ninstr, sizeof(**done));
        assert_true(pv[r] && cv[r] && done[r]);
    }
    for (uint32_t r = 0; ok && r < w; r++)
        for (size_t i = 0; ok && i < s->plans[r].ninstr; i++)
            ok = dataflow_bounds(s, r, i, &s->plans[r].instr[i]);
    while (ok && progress) {
        progress = false;
        for (uint32_t r = 0; ok && r < w; r++) {
            const ovl_plan_t *p = &s->plans[r];

            for (size_t i = 0; ok && i < p->ninstr; i++) {
                const ovl_instr_t *in = &p->instr[i];
                const rowval_t *ins[64];
                bool ready = true;

                if (done[r][i])
                    continue;
                switch (in->kind) {
                case OVL_I_GEMM: /* rank r's partial of the rows of A it multiplies,
                                    added to the rows acc names (ring) */
                    for (uint64_t x = 0; in->accumulate && ready && x < in->rows; x++)
                        ready = pv[r][in->acc.row + x].set;
                    for (uint32_t b = 0; ok && ready && b < in->nblocks; b++)
                        for (uint64_t x = 0; ok && x < in->rows; x++) {
                            uint64_t arow = in->src.row + b * in->stride + x;
                            uint64_t drow = in->dst.row + b * in->stride + x;
                            rowval_t mine = {.set = true,
                                             .block = (uint32_t)(arow / mb),
                                             .off = arow % mb,
                                             .ranks = UINT64_C(1) << r};
                            rowval_t *out = in->dst.buf == OVL_BUF_C ? &cv[r][drow] : &pv[r][drow];

                            if (in->accumulate) {
                                const rowval_t *two[2] = {&pv[r][in->acc.row + x], &mine};

                                ok = rowval_sum(s, r, i, two, 2, out);
                            } else {
                                *out = mine;
                            }
                        }
                    break;
                case OVL_I_PUSH:
                    for (uint64_t x = 0; x < in->rows && ready; x++)
                        ready = pv[r][in->src.row + x].set;
                    for (uint64_t x = 0; ready && x < in->rows; x++)
                        pv[in->dst.rank][in->dst.row + x] = pv[r][in->src.row + x];
                    break;
                case OVL_I_REDUCE:
                    for (uint64_t x = 0; ok && ready && x < in->rows; x++) {
                        for (uint32_t b = 0; ready && b < in->nblocks; b++) {
                            ins[b] = &pv[r][in->src.row + b * in->stride + x];
                            ready = ins[b]->set;
                        }
                        if (ready)
                            ok = rowval_sum(s, r, i, ins, in->nblocks,
                                            in->dst.buf == OVL_BUF_P ? &pv[r][in->dst.row + x]
                                                                     : &cv[r][in->dst.row + x]);
                    }
                    break;
                case OVL_I_RAIL: /* each sender's rows into its slot here */
                    for (uint32_t k = 0; ready && k < in->nrecv; k++) {
                        uint32_t q = rail_recvs(s, r, in)[k];

                        for (uint64_t x = 0; ready && x < in->rows; x++)
                            ready = pv[q][in->src.row + x].set;
                        for (uint64_t x = 0; ready && x < in->rows; x++)
                            pv[r][in->dst.row + q * in->stride + x] = pv[q][in->src.row + x];
                    }
                    break;
                case OVL_I_REDUCE_SCATTER: /* this rank's block of every rank's P */
                    for (uint64_t x = 0; ok && ready && x < in->rows; x++) {
                        for (uint32_t q = 0; ready && q < w; q++) {
                            ins[q] = &pv[q][in->src.row + r * in->stride + x];
                            ready = ins[q]->set;
                        }
                        if (ready)
                            ok = rowval_sum(s, r, i, ins, w, &cv[r][in->dst.row + x]);
                    }
                    break;
                default:
                    break; /* moves nothing */
                }
                if (ok && ready) {
                    done[r][i] = true;
                    progress = true;
                }
            }
        }
    }
    for (uint32_t r = 0; ok && r < w; r++) {
        for (size_t i = 0; ok && i < s->plans[r].ninstr; i++)
            if (!done[r][i])
                ok = violation(s, "r%u #%zu: its inputs are never made", r, i);
        for (uint64_t x = 0; ok && x < mb; x++) {
            const rowval_t *c = &cv[r][x];
            uint64_t all = w == 64 ? UINT64_MAX : (UINT64_C(1) << w) - 1;

            if (!c->set || c->block != r || c->off != x || c->ranks != all)
                ok = violation(s,
                               "r%u: C row %llu holds block %u row %llu of ranks %#llx, not "
                               "block %u row %llu of every rank",
                               r, (unsigned long long)x, c->block, (unsigned long long)c->off,
                               (unsigned long long)c->ranks, r, (unsigned long long)x);
        }
    }
    for (uint32_t r = 0; r < w; r++) {
        free(pv[r]);
        free(cv[r]);
        free(done[r]);
    }
    free(pv);
    free(cv);
    free(done);
    return ok || s->failed ? ok : violation(s, "a world over 64 ranks");
}

/* Carves n objects of `size` bytes at *off (16-byte aligned) out of base;
 * with base NULL it only counts. */
static void *carve(char *base, size_t *off, size_t n, size_t size)
{
    void *p = base ? base + *off : NULL;

    *off += (n * size + 15) & ~(size_t)15;
    return p;
}

/* Lays the simulation's arrays out in base (NULL: just size them); returns
 * the bytes needed. Needs world, plans, ns, ncomp and maxspans set. */
static size_t sim_layout(sim_t *s, char *base)
{
    uint32_t w = s->world;
    size_t off = 0;

    s->clock = carve(base, &off, w, sizeof(*s->clock));
    s->evclock = carve(base, &off, w, sizeof(*s->evclock));
    s->evrec = carve(base, &off, w, sizeof(*s->evrec));
    s->sclock = carve(base, &off, (size_t)s->ncomp * s->ncomp, sizeof(*s->sclock));
    s->pc = carve(base, &off, w, sizeof(*s->pc));
    s->wait_ready = carve(base, &off, w, sizeof(*s->wait_ready));
    s->rec_ready = carve(base, &off, w, sizeof(*s->rec_ready));
    s->done = carve(base, &off, w, sizeof(*s->done));
    s->joint = carve(base, &off, s->ncomp, sizeof(*s->joint));
    s->cspans = carve(base, &off, s->maxspans, sizeof(*s->cspans));
    s->gspans = carve(base, &off, s->maxspans, sizeof(*s->gspans));
    s->sgspans = carve(base, &off, s->maxspans, sizeof(*s->sgspans));
    s->pspans = carve(base, &off, s->maxspans, sizeof(*s->pspans));
    s->node = carve(base, &off, w, sizeof(*s->node));
    s->local = carve(base, &off, w, sizeof(*s->local));
    s->size = carve(base, &off, w, sizeof(*s->size));
    s->rail_issue = carve(base, &off, (size_t)w * s->ncomp, sizeof(*s->rail_issue));
    s->rail_hits = carve(base, &off, w, sizeof(*s->rail_hits));
    for (uint32_t r = 0; r < w; r++) {
        uint32_t *clock = carve(base, &off, s->plans[r].ninstr * s->ncomp, sizeof(uint32_t));
        uint32_t *evclock =
            carve(base, &off, (size_t)s->plans[r].nevents * s->ncomp, sizeof(uint32_t));
        bool *evrec = carve(base, &off, s->plans[r].nevents, sizeof(bool));

        if (base) {
            s->clock[r] = clock;
            s->evclock[r] = evclock;
            s->evrec[r] = evrec;
        }
    }
    return off;
}

/* The checker's state across jobs: the first violation's words, and the
 * simulation's memory, kept and reused: the test checks some 20000 jobs, and
 * memory freed and allocated anew per job is what makes it slow under ASan
 * (its quarantine hands out fresh pages every time). */
typedef struct checker {
    char why[256];
    char *arena;
    size_t arena_size;
} checker_t;

static void checker_free(checker_t *ck)
{
    free(ck->arena);
    ck->arena = NULL;
    ck->arena_size = 0;
}

/* GEMM + reduce-scatter: check_job runs only the simulation and the data
 * flow (test_rs_dataflow_catches: the flow's own failures, which the other
 * checks would name first). */
static bool g_dataflow_only = false;

/*
 * Checks the plans of all ranks of one job (plans[r] is rank r's). Returns
 * true if every property holds, else false with the first violation in
 * ck->why.
 */
static bool check_job(checker_t *ck, const ovl_plan_t *plans, uint32_t world)
{
    sim_t s = {.world = world, .plans = plans, .why = ck->why, .whylen = sizeof(ck->why)};
    size_t need;
    bool ok;

    ck->why[0] = '\0';
    for (uint32_t r = 0; r < world; r++) {
        if (plans[r].nstreams > s.ns)
            s.ns = plans[r].nstreams;
        if (plans[r].ninstr * world > s.maxspans)
            s.maxspans = plans[r].ninstr * world;
    }
    s.ncomp = world * s.ns;
    need = sim_layout(&s, NULL);
    if (need > ck->arena_size) {
        free(ck->arena);
        ck->arena = malloc(need);
        assert_non_null(ck->arena);
        ck->arena_size = need;
    }
    sim_layout(&s, ck->arena);
    /* only what is read before written starts zeroed: clearing the node
     * clocks too would double the test's time */
    memset(s.sclock, 0, (size_t)s.ncomp * s.ncomp * sizeof(*s.sclock));
    memset(s.pc, 0, world * sizeof(*s.pc));
    for (uint32_t r = 0; r < world; r++)
        memset(s.evrec[r], 0, plans[r].nevents * sizeof(bool));
    s.pspans_of = UINT32_MAX;
    /* the topology, from rank 0's params (check_fields holds every rank to
     * it): nodes, each rank's node and its index among the node's ranks */
    memset(s.size, 0, world * sizeof(*s.size));
    s.nnodes = 1;
    for (uint32_t q = 0; q < world; q++) {
        uint32_t nd = plans[0].params.node_of ? plans[0].params.node_of[q] : 0;

        assert_true(nd < world);
        s.node[q] = nd;
        s.local[q] = s.size[nd]++;
        if (nd + 1 > s.nnodes)
            s.nnodes = nd + 1;
    }

    if (plans[0].params.kind == OVL_OP_GEMM_RS && g_dataflow_only)
        return simulate(&s) && check_rs_dataflow(&s);
    if (plans[0].params.kind == OVL_OP_GEMM_RS) {
        ok = check_fields(&s) && check_shape(&s) && check_rs_bufs(&s) && simulate(&s) &&
             check_bracketed(&s) && check_rs_rows(&s) && check_rs_dataflow(&s);
        if (ok && plans[0].params.algo == OVL_ALGO_COLLECTIVE)
            ok = check_collective(&s);
        return ok;
    }
    ok = check_fields(&s) && check_shape(&s) && check_bufs(&s) && check_transfers(&s) &&
         simulate(&s) && check_bracketed(&s) && check_shard_reads(&s) && check_rows(&s);
    if (ok && plans[0].params.algo == OVL_ALGO_COLLECTIVE)
        ok = check_collective(&s);
    if (ok && plans[0].params.algo == OVL_ALGO_RING)
        ok = check_ring(&s);
    return ok;
}

/* -------------------------------------------------------------- tests */

static void test_checker_all_shapes(void **state)
{
    static const uint64_t ms[] = {1, 2, 3, 7, 64, 100, 1000};
    ovl_plan_t plans[8];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0;

    (void)state;
    for (uint32_t world = 1; world <= 8; world++)
        for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
            for (uint32_t chunks = 0; chunks <= 9; chunks++)
                for (uint32_t streams = 0; streams <= 5; streams++)
                    for (int wg = 0; wg <= 1; wg++)
                        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++)
                            /* every way of gathering (ring has one); nccl
                             * differs from dense at one rank only, and
                             * strided is copy with another reason: a few
                             * worlds of each */
                            for (int l = 0; l < (a == OVL_ALGO_RING ? 1 : L_COUNT); l++) {
                                bool transb = (chunks + streams) % 2 == 1;

                                if ((l == L_NCCL && world > 1) || (l == L_STRIDED && world > 2) ||
                                    (l == L_SHARED && (world < 2 || world > 4)))
                                    continue;

                                build_job_as(plans, (ovl_algo_t)a, world, ms[mi], chunks, streams,
                                             wg, (layout_t)l, transb);
                                if (!check_job(&ck, plans, world))
                                    fail_msg("%s world=%u m=%llu chunks=%u streams=%u a_out=%d "
                                             "layout=%d: %s",
                                             ovl_algo_name((ovl_algo_t)a), world,
                                             (unsigned long long)ms[mi], chunks, streams, wg, l,
                                             ck.why);
                                free_job(plans, world);
                                jobs++;
                            }
    /* ring, and naive and collective each dense and copy at every world,
     * nccl at world 1, strided at worlds 1 and 2, shared at worlds 2 to 4 */
    assert_int_equal(jobs, 7 * 10 * 6 * 2 * (8 * 3 + 8 * 2 + 1 * 2 + 2 * 2 + 3 * 2));
    checker_free(&ck);
}

/* Ops with several Bs: nb 1 to 3 (each B its own n), every algorithm and
 * way of gathering, worlds 1 to 4; every C i tiled once, every GEMM after
 * the rows it reads, no DONE before the peers' reads. */
static void test_checker_multi_b(void **state)
{
    static const uint64_t ms[] = {1, 3, 64, 100};
    ovl_plan_t plans[4];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0, expect = 0;

    (void)state;
    for (uint32_t nb = 1; nb <= 3; nb++)
        for (uint32_t world = 1; world <= 4; world++)
            for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
                for (uint32_t chunks = 0; chunks <= 5; chunks++)
                    for (uint32_t streams = 0; streams <= 3; streams++)
                        for (int wg = 0; wg <= 1; wg++)
                            for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++)
                                for (int l = 0; l < (a == OVL_ALGO_RING ? 1 : L_COUNT); l++) {
                                    bool transb = (chunks + streams + nb) % 2 == 1;

                                    if ((l == L_NCCL && world > 1) ||
                                        (l == L_STRIDED && world > 2) ||
                                        (l == L_SHARED && world < 2))
                                        continue;
                                    build_nb = nb;
                                    build_job_as(plans, (ovl_algo_t)a, world, ms[mi], chunks,
                                                 streams, wg, (layout_t)l, transb);
                                    build_nb = 1;
                                    for (uint32_t r = 0; r < world; r++)
                                        assert_int_equal(ovl_plan_nb(&plans[r].params), nb);
                                    if (!check_job(&ck, plans, world))
                                        fail_msg("nb=%u %s world=%u m=%llu chunks=%u "
                                                 "streams=%u a_out=%d layout=%d: %s",
                                                 nb, ovl_algo_name((ovl_algo_t)a), world,
                                                 (unsigned long long)ms[mi], chunks, streams, wg, l,
                                                 ck.why);
                                    free_job(plans, world);
                                    jobs++;
                                }
    /* per world: ring 1, dense 2, copy 2, nccl 2 at world 1, strided 2 at
     * worlds 1 and 2, shared 2 at worlds 2 to 4 */
    for (uint32_t world = 1; world <= 4; world++)
        expect += 1 + 2 + 2 + (world == 1) * 2 + (world <= 2) * 2 + (world >= 2) * 2;
    assert_int_equal(jobs, 3 * 4 * 6 * 4 * 2 * expect);
    checker_free(&ck);
}

/* Large jobs too: many ranks, the maximum chunks (and streams), each way
 * of gathering. */
static void test_checker_large(void **state)
{
    enum { W = 16 };
    ovl_plan_t plans[W];
    checker_t ck = {.arena = NULL};

    (void)state;
    build_job(plans, OVL_ALGO_RING, W, 4096, OVL_PLAN_MAX_CHUNKS, 0, true);
    if (!check_job(&ck, plans, W))
        fail_msg("%s", ck.why);
    free_job(plans, W);
    for (int l = 0; l < L_COUNT; l++) {
        build_job_as(plans, OVL_ALGO_COLLECTIVE, W, 4096, OVL_PLAN_MAX_CHUNKS, OVL_PLAN_MAX_STREAMS,
                     l % 2 == 1, (layout_t)l, false);
        if (!check_job(&ck, plans, W))
            fail_msg("layout %d: %s", l, ck.why);
        free_job(plans, W);
    }
    checker_free(&ck);
}

/* Corrupts one rank of a valid job (laid out as `layout`) with `corrupt`
 * and expects the checker to name a violation containing `expect`. */
static void expect_violation_as(ovl_algo_t algo, uint32_t world, uint32_t chunks, uint32_t streams,
                                layout_t layout, void (*corrupt)(ovl_plan_t *plans),
                                const char *expect)
{
    ovl_plan_t plans[4];
    checker_t ck = {.arena = NULL};

    assert_true(world <= 4);
    build_job_as(plans, algo, world, 64, chunks, streams, false, layout, false);
    if (!check_job(&ck, plans, world))
        fail_msg("before corruption: %s", ck.why);
    corrupt(plans);
    assert_false(check_job(&ck, plans, world));
    if (!strstr(ck.why, expect))
        fail_msg("violation \"%s\" does not mention \"%s\"", ck.why, expect);
    free_job(plans, world);
    checker_free(&ck);
}

static void expect_violation(ovl_algo_t algo, uint32_t world, uint32_t chunks, uint32_t streams,
                             void (*corrupt)(ovl_plan_t *plans), const char *expect)
{
    expect_violation_as(algo, world, chunks, streams, L_DENSE, corrupt, expect);
}

/* Index of rank r's WAIT on (peer, event) on stream st. */
static size_t find_wait(const ovl_plan_t *plan, uint32_t st, uint32_t peer, uint32_t event)
{
    for (size_t i = 0; i < plan->ninstr; i++) {
        const ovl_instr_t *in = &plan->instr[i];

        if (in->kind == OVL_I_WAIT && in->stream == st && in->peer == peer && in->event == event)
            return i;
    }
    fail_msg("no WAIT ev%u@r%u on s%u", event, peer, st);
    return 0;
}

/* copy-engine gather: rank 1's stream 1 pulls rank 2's rows without
 * waiting for rank 2's READY */
static void copy_drop_ready_wait(ovl_plan_t *plans)
{
    remove_instr(&plans[1], find_wait(&plans[1], 1, 2, OVL_EV_READY));
}

/* copy-engine gather: rank 0 stops waiting for rank 2's release of
 * stream 0 */
static void copy_drop_release_wait(ovl_plan_t *plans)
{
    remove_instr(&plans[0], find_wait(&plans[0], 0, 2, OVL_EV_RELEASE));
}

/* copy-engine gather: rank 2's stream 1 never records its release, which
 * its peers wait for */
static void copy_drop_release_record(ovl_plan_t *plans)
{
    size_t last_pull = find_instr(&plans[2], OVL_I_PULL, -1, 0);

    for (size_t i = 0; i < plans[2].ninstr; i++)
        if (plans[2].instr[i].kind == OVL_I_PULL && plans[2].instr[i].stream == 1)
            last_pull = i;
    assert_int_equal(plans[2].instr[last_pull + 1].kind, OVL_I_RECORD);
    remove_instr(&plans[2], last_pull + 1);
}

/* copy-engine gather: a pull lands in the wrong block of G */
static void pull_wrong_block(ovl_plan_t *plans)
{
    plans[1].instr[find_instr(&plans[1], OVL_I_PULL, -1, 1)].dst.row += plans[1].params.m;
}

/* collective: a communication stream said to compute */
static void wrong_role(ovl_plan_t *plans)
{
    plans[1].roles[1] = OVL_ROLE_COMPUTE;
}

/* naive: whole shards sent by send/recv on every rank */
static void wrong_method(ovl_plan_t *plans)
{
    for (uint32_t r = 0; r < 2; r++)
        plans[r].instr[find_instr(&plans[r], OVL_I_ALLGATHER, -1, 0)].method = OVL_AG_NCCL_SENDRECV;
}

/* naive: the daemon asked for the copy engine, the plans use NCCL */
static void allgather_despite_copy(ovl_plan_t *plans)
{
    for (uint32_t r = 0; r < 2; r++)
        plans[r].params.allgather = OVL_AG_COPY;
}

/* ring: a GEMM with the wrong width */
static void wrong_gemm_n(ovl_plan_t *plans)
{
    plans[0].instr[find_instr(&plans[0], OVL_I_GEMM, OVL_BUF_G, 0)].n++;
}

/* ring: a GEMM that writes G */
static void gemm_into_g(ovl_plan_t *plans)
{
    plans[0].instr[find_instr(&plans[0], OVL_I_GEMM, OVL_BUF_G, 0)].dst.buf = OVL_BUF_G;
}

/* collective: the scratch is a byte short */
static void wrong_scratch(ovl_plan_t *plans)
{
    plans[1].scratch_bytes--;
}

/* ring: B said unused */
static void wrong_used(ovl_plan_t *plans)
{
    plans[1].bufs[OVL_BUF_B].used = false;
}

/* ring: drop the wait that orders a peer GEMM after its pull */
static void drop_gemm_wait(ovl_plan_t *plans)
{
    size_t g = find_instr(&plans[1], OVL_I_GEMM, OVL_BUF_G, 0);

    assert_int_equal(plans[1].instr[g - 1].kind, OVL_I_WAIT);
    remove_instr(&plans[1], g - 1);
}

/* collective: the second GEMM multiplies the first chunk again */
static void duplicate_gemm(ovl_plan_t *plans)
{
    size_t g0 = find_instr(&plans[0], OVL_I_GEMM, -1, 0);
    size_t g1 = find_instr(&plans[0], OVL_I_GEMM, -1, 1);

    plans[0].instr[g1].src.row = plans[0].instr[g0].src.row;
    plans[0].instr[g1].dst.row = plans[0].instr[g0].dst.row;
}

/* ring (world 2, which pulls): rank 0 stops waiting for rank 1's RELEASE */
static void drop_release_wait(ovl_plan_t *plans)
{
    for (size_t i = 0; i < plans[0].ninstr; i++)
        if (plans[0].instr[i].kind == OVL_I_WAIT && plans[0].instr[i].event == OVL_EV_RELEASE &&
            plans[0].instr[i].peer == 1) {
            remove_instr(&plans[0], i);
            return;
        }
    fail_msg("no RELEASE wait");
}

/* ring pushing (world 3 and up): rank 1 pushes into rank 2 without waiting
 * for rank 2's READY */
static void push_drop_ready_wait(ovl_plan_t *plans)
{
    size_t at = find_instr(&plans[1], OVL_I_PUSH, -1, 0);

    assert_int_equal(plans[1].instr[at - 1].kind, OVL_I_WAIT);
    assert_int_equal(plans[1].instr[at - 1].event, OVL_EV_READY);
    remove_instr(&plans[1], at - 1);
}

/* ring pushing: rank 1's first push lands in its block's next rows */
static void push_wrong_block(ovl_plan_t *plans)
{
    plans[1].instr[find_instr(&plans[1], OVL_I_PUSH, -1, 0)].dst.row += 1;
}

/* ring pushing: rank 1 never records its first push's arrival, which a
 * peer's GEMM waits for */
static void push_drop_arrival_record(ovl_plan_t *plans)
{
    size_t at = find_instr(&plans[1], OVL_I_PUSH, -1, 0);

    assert_int_equal(plans[1].instr[at + 1].kind, OVL_I_RECORD);
    remove_instr(&plans[1], at + 1);
}

/* ring pushing: rank 1's pushes go into its peers' G after the pushes of
 * rank 1 were recorded as arrived (the record moved ahead of the push) */
static void push_record_early(ovl_plan_t *plans)
{
    size_t at = find_instr(&plans[1], OVL_I_PUSH, -1, 0);
    ovl_instr_t push = plans[1].instr[at];

    plans[1].instr[at] = plans[1].instr[at + 1];
    plans[1].instr[at + 1] = push;
}

/* ring at world 2 pulls: a pull turned into a push of the own rows there */
static void push_at_world2(ovl_plan_t *plans)
{
    ovl_instr_t *in = &plans[0].instr[find_instr(&plans[0], OVL_I_PULL, OVL_BUF_A, 0)];

    in->kind = OVL_I_PUSH;
    in->src = (ovl_ref_t){.buf = OVL_BUF_A, .rank = 0, .row = in->src.row};
    in->dst = (ovl_ref_t){.buf = OVL_BUF_G, .rank = 1, .row = in->src.row};
}

/* collective: stream 1 is never joined into stream 0 */
static void drop_join(ovl_plan_t *plans)
{
    size_t d = plans[0].ninstr - 1;

    assert_int_equal(plans[0].instr[d - 1].kind, OVL_I_WAIT);
    remove_instr(&plans[0], d - 1);
}

/* collective: an initial wait moved behind the first ALLGATHER */
static void late_initial_wait(ovl_plan_t *plans)
{
    ovl_instr_t tmp = plans[1].instr[2];

    assert_int_equal(tmp.kind, OVL_I_WAIT);
    assert_int_equal(plans[1].instr[3].kind, OVL_I_ALLGATHER);
    plans[1].instr[2] = plans[1].instr[3];
    plans[1].instr[3] = tmp;
}

/* ring: the head-of-stream sleep is gone */
static void drop_sleep(ovl_plan_t *plans)
{
    remove_instr(&plans[2], find_instr(&plans[2], OVL_I_SLEEP, -1, 0));
}

/* ring: a pull of rank 2 before the wait on rank 2's READY */
static void drop_ready_wait(ovl_plan_t *plans)
{
    for (size_t i = 0; i < plans[1].ninstr; i++)
        if (plans[1].instr[i].kind == OVL_I_WAIT && plans[1].instr[i].peer == 2) {
            remove_instr(&plans[1], i);
            return;
        }
    fail_msg("no wait on r2");
}

/* naive: ranks disagree on the all-gather (rank 1's, a chunk now, by the
 * method for chunks, so that only the disagreement is wrong) */
static void mismatched_allgather(ovl_plan_t *plans)
{
    ovl_instr_t *in = &plans[1].instr[find_instr(&plans[1], OVL_I_ALLGATHER, -1, 0)];

    in->rows--;
    in->method = OVL_AG_NCCL_SENDRECV;
}

/* ring (world 2, which pulls): rank 1 waits on its own event before
 * recording it (a deadlock) */
static void wait_before_record(ovl_plan_t *plans)
{
    size_t g = find_instr(&plans[1], OVL_I_GEMM, OVL_BUF_G, 0);
    ovl_instr_t wait = plans[1].instr[g - 1];

    /* move the wait ahead of the pull and record it follows */
    plans[1].instr[g - 1] = plans[1].instr[g - 2];
    plans[1].instr[g - 2] = plans[1].instr[g - 3];
    plans[1].instr[g - 3] = wait;
}

/* Rank 0's first GEMM of B b (or SIZE_MAX). */
static size_t find_gemm_of(const ovl_plan_t *plan, uint32_t b)
{
    for (size_t i = 0; i < plan->ninstr; i++)
        if (plan->instr[i].kind == OVL_I_GEMM && plan->instr[i].b.buf == ovl_buf_b(b))
            return i;
    return SIZE_MAX;
}

static void b1_into_c0(ovl_plan_t *plans)
{
    plans[0].instr[find_gemm_of(&plans[0], 1)].dst.buf = OVL_BUF_C;
}

static void drop_b2_gemm(ovl_plan_t *plans)
{
    remove_instr(&plans[1], find_gemm_of(&plans[1], 2));
}

static void wrong_b1_n(ovl_plan_t *plans)
{
    plans[0].instr[find_gemm_of(&plans[0], 1)].n = build_n[0];
}

static void b2_of_b1(ovl_plan_t *plans)
{
    plans[0].instr[find_gemm_of(&plans[0], 2)].b.buf = ovl_buf_b(1);
}

/* A B1 GEMM of gathered rows moved ahead of the wait that orders it after
 * their arrival: it reads G too early. */
static void early_b1_gemm(ovl_plan_t *plans)
{
    size_t g = find_instr(&plans[1], OVL_I_GEMM, OVL_BUF_G, 0);
    size_t g1 = g + 1; /* B1's GEMM of the same rows follows B0's */
    ovl_instr_t in = plans[1].instr[g1];

    assert_int_equal(in.b.buf, ovl_buf_b(1));
    assert_int_equal(plans[1].instr[g - 1].kind, OVL_I_WAIT);
    plans[1].instr[g1] = plans[1].instr[g];
    plans[1].instr[g] = plans[1].instr[g - 1];
    plans[1].instr[g - 1] = in;
}

static void test_checker_catches_multi_b(void **state)
{
    (void)state;
    build_nb = 3;
    expect_violation(OVL_ALGO_RING, 2, 2, 0, b1_into_c0, "names buffers it may not");
    expect_violation(OVL_ALGO_COLLECTIVE, 3, 4, 2, drop_b2_gemm, "C2 block");
    expect_violation(OVL_ALGO_NAIVE, 2, 0, 0, wrong_b1_n, "GEMM geometry");
    expect_violation(OVL_ALGO_RING, 2, 2, 0, b2_of_b1, "names buffers it may not");
    expect_violation(OVL_ALGO_RING, 4, 4, 0, early_b1_gemm, "before");
    build_nb = 1;
}

static char *format_plan(const ovl_plan_t *plan);

/* The text of a plan with several Bs: a bs line, B i and C i among the
 * buffers, each GEMM naming its B and C. */
static void test_format_multi_b(void **state)
{
    ovl_plan_params_t p = params_of(OVL_ALGO_NAIVE, 2, 1, 4, 0, 0, false);
    ovl_plan_t plan;

    (void)state;
    set_bs(&p, 3);
    p.allgather = OVL_AG_COPY;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    char *text = format_plan(&plan);
    assert_non_null(strstr(text, "\nbs nb=3 n=256,64,96\nbuffers A=4x512 B=512x256 C=8x256 "
                                 "G=8x512(scratch) B1=512x64 B2=512x96 C1=8x64 C2=8x96 "
                                 "scratch="));
    assert_non_null(strstr(text, "GEMM C1[0] <- G[0+8] @ B1 n 64 k 512\n"));
    assert_non_null(strstr(text, "GEMM C2[0] <- G[0+8] @ B2 n 96 k 512\n"));
    free(text);
    ovl_plan_free(&plan);
    /* nb over the limit, or a B of no columns, is refused */
    set_bs(&p, OVL_PLAN_MAX_BS);
    p.nb = OVL_PLAN_MAX_BS + 1;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    set_bs(&p, 2);
    p.n_more[0] = 0;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
}

static void test_checker_catches(void **state)
{
    (void)state;
    expect_violation(OVL_ALGO_RING, 4, 4, 0, drop_gemm_wait, "before");
    expect_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, duplicate_gemm, "C block 0 row 0 written twice");
    expect_violation(OVL_ALGO_RING, 2, 2, 0, drop_release_wait, "may complete");
    expect_violation(OVL_ALGO_RING, 3, 2, 0, push_drop_ready_wait, "before its READY");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, push_wrong_block, "PUSH geometry");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, push_drop_arrival_record, "deadlock");
    expect_violation(OVL_ALGO_RING, 3, 1, 0, push_record_early,
                     "may complete while its G is written");
    expect_violation(OVL_ALGO_RING, 2, 1, 0, push_at_world2, "ring at world 2 moves A by PUSH");
    expect_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, drop_join, "not joined before DONE");
    expect_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, late_initial_wait, "initial wait");
    expect_violation(OVL_ALGO_RING, 4, 1, 0, drop_sleep, "no SLEEP");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, drop_ready_wait, "before its READY");
    expect_violation(OVL_ALGO_NAIVE, 2, 0, 0, mismatched_allgather, "ALLGATHER rows differ");
    expect_violation(OVL_ALGO_RING, 2, 2, 0, wait_before_record, "before recording");
    expect_violation_as(OVL_ALGO_COLLECTIVE, 3, 4, 2, L_COPY, copy_drop_ready_wait,
                        "before its READY");
    expect_violation_as(OVL_ALGO_COLLECTIVE, 3, 4, 2, L_STRIDED, copy_drop_release_wait,
                        "may complete");
    expect_violation_as(OVL_ALGO_COLLECTIVE, 3, 4, 2, L_COPY, copy_drop_release_record, "deadlock");
    expect_violation_as(OVL_ALGO_NAIVE, 3, 0, 0, L_COPY, pull_wrong_block, "PULL geometry");
    expect_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, wrong_role, "role is compute");
    expect_violation(OVL_ALGO_NAIVE, 2, 0, 0, wrong_method, "ALLGATHER method");
    expect_violation(OVL_ALGO_NAIVE, 2, 0, 0, allgather_despite_copy, "params say pulls");
    expect_violation(OVL_ALGO_RING, 2, 2, 0, wrong_gemm_n, "GEMM geometry");
    expect_violation(OVL_ALGO_RING, 2, 2, 0, gemm_into_g, "names buffers it may not");
    expect_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, wrong_scratch, "scratch");
    expect_violation(OVL_ALGO_RING, 2, 2, 0, wrong_used, "buffer B used is 0");
}

static void expect_invalid(const ovl_plan_params_t *p);

/* ------------------------------------------------------------ nodes */

/* The topologies the tests across nodes build, world ranks on `nodes`
 * nodes (2 <= nodes <= world), into node_of:
 *   0 node-major, as even as can be (uneven where nodes does not divide)
 *   1 node-major, skewed: one rank on each node but the last
 *   2 node-major, growing: 1, 2, 3, ... ranks, the last node the rest
 *     (as 0 where they do not fit)
 *   3 interleaved: rank r on node r % nodes
 *   4 scrambled: ranks 0.. nodes-1 on nodes nodes-1 .. 0, then (7 r) % nodes */
enum { TOPO_KINDS = 5 };

static void make_topo(uint32_t world, uint32_t nodes, int kind, uint32_t *node_of)
{
    uint32_t size[8] = {0}, q = 0;

    assert_true(nodes >= 2 && nodes <= world && nodes <= 8);
    if (kind == 2 && nodes * (nodes - 1) / 2 >= world)
        kind = 0;
    for (uint32_t n = 0; n < nodes; n++)
        size[n] = kind == 0   ? world / nodes + (n < world % nodes)
                  : kind == 1 ? (n + 1 < nodes ? 1 : world - nodes + 1)
                  : kind == 2 ? (n + 1 < nodes ? n + 1 : world - nodes * (nodes - 1) / 2)
                              : 0;
    for (uint32_t n = 0; kind <= 2 && n < nodes; n++)
        for (uint32_t i = 0; i < size[n]; i++)
            node_of[q++] = n;
    for (uint32_t r = 0; kind == 3 && r < world; r++)
        node_of[r] = r % nodes;
    for (uint32_t r = 0; kind == 4 && r < world; r++)
        node_of[r] = r < nodes ? nodes - 1 - r : (7 * r) % nodes;
}

/* Jobs across nodes: worlds 2 to 8 on 2 to 4 nodes, each topology kind
 * (even, uneven, not node-major), every algorithm (naive and collective
 * by NCCL, the only way across nodes; ring by the rail), chunks 1 to 4, m
 * 3 and 64, with and without a_out, one B and three. */
static void test_checker_nodes(void **state)
{
    static const uint64_t ms[] = {3, 64};
    uint32_t node_of[8];
    ovl_plan_t plans[8];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0;

    (void)state;
    for (uint32_t world = 2; world <= 8; world++)
        for (uint32_t nodes = 2; nodes <= 4 && nodes <= world; nodes++)
            for (int kind = 0; kind < TOPO_KINDS; kind++)
                for (uint32_t chunks = 1; chunks <= 4; chunks++)
                    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
                        for (int wg = 0; wg <= 1; wg++)
                            for (uint32_t nb = 1; nb <= 3; nb += 2)
                                for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++) {
                                    bool transb = (chunks + nb + (uint32_t)kind) % 2 == 1;

                                    make_topo(world, nodes, kind, node_of);
                                    build_topo = node_of;
                                    build_nb = nb;
                                    build_job_as(plans, (ovl_algo_t)a, world, ms[mi], chunks, 2, wg,
                                                 L_DENSE, transb);
                                    build_nb = 1;
                                    build_topo = NULL;
                                    for (uint32_t r = 0; r < world; r++)
                                        assert_int_equal(plans[r].nnodes, nodes);
                                    if (!check_job(&ck, plans, world))
                                        fail_msg("%s world=%u nodes=%u topology=%d chunks=%u "
                                                 "m=%llu a_out=%d nb=%u: %s",
                                                 ovl_algo_name((ovl_algo_t)a), world, nodes, kind,
                                                 chunks, (unsigned long long)ms[mi], wg, nb,
                                                 ck.why);
                                    free_job(plans, world);
                                    jobs++;
                                }
    /* 18 (world, nodes) pairs */
    assert_int_equal(jobs, 18 * TOPO_KINDS * 4 * 2 * 2 * 2 * 3);
    checker_free(&ck);
}

/* Replaces every RAIL's peer lists of plan with send[0..ns), recv[0..nr). */
static void set_rail(ovl_plan_t *plan, const uint32_t *send, uint32_t ns, const uint32_t *recv,
                     uint32_t nr)
{
    free(plan->peers);
    plan->peers = calloc(ns + nr + 1, sizeof(*plan->peers));
    assert_non_null(plan->peers);
    for (uint32_t i = 0; i < ns; i++)
        plan->peers[i] = send[i];
    for (uint32_t i = 0; i < nr; i++)
        plan->peers[ns + i] = recv[i];
    plan->npeers = ns + nr;
    for (size_t i = 0; i < plan->ninstr; i++)
        if (plan->instr[i].kind == OVL_I_RAIL) {
            plan->instr[i].peers = 0;
            plan->instr[i].nsend = ns;
            plan->instr[i].nrecv = nr;
        }
}

static void insert_instr(ovl_plan_t *plan, size_t at, const ovl_instr_t *in)
{
    ovl_instr_t *v = realloc(plan->instr, (plan->ninstr + 1) * sizeof(*v));

    assert_non_null(v);
    memmove(&v[at + 1], &v[at], (plan->ninstr - at) * sizeof(*v));
    v[at] = *in;
    plan->instr = v;
    plan->ninstr++;
}

/* The corruptions below are of a ring of 2 nodes x 2 ranks (r0 r1 | r2
 * r3): r0 and r2 exchange, r1 and r3; r1 pulls r2's rows from r0's G. */

/* r1 pulls from r0's G without waiting for r0's arrival event */
static void drop_arrival_wait(ovl_plan_t *plans)
{
    remove_instr(&plans[1], find_wait(&plans[1], 1, 0, ovl_plan_arrival_event(0)));
}

/* r3, not r2, receives r0's rows (matched: r0 sends there) */
static void wrong_receiver(ovl_plan_t *plans)
{
    static const uint32_t r0_send[] = {3}, r0_recv[] = {2}, r2_send[] = {0}, r3_send[] = {1},
                          r3_recv[] = {1, 0};

    set_rail(&plans[0], r0_send, 1, r0_recv, 1);
    set_rail(&plans[2], r2_send, 1, NULL, 0);
    set_rail(&plans[3], r3_send, 1, r3_recv, 2);
}

/* r0 sends nothing; r2 still receives from it */
static void missing_send(ovl_plan_t *plans)
{
    static const uint32_t r0_recv[] = {2};

    set_rail(&plans[0], NULL, 0, r0_recv, 1);
}

/* r1 pulls r2's shard from r2's A by the copy engine, across nodes */
static void pull_across_nodes(ovl_plan_t *plans)
{
    ovl_instr_t *in = &plans[1].instr[find_instr(&plans[1], OVL_I_PULL, OVL_BUF_A, 0)];

    in->src.rank = 2;
    in->dst.row = 2 * plans[1].params.m + in->src.row;
}

/* r1 releases after its pulls of the node's A, before those of r0's G */
static void release_before_g_pulls(ovl_plan_t *plans)
{
    ovl_plan_t *p = &plans[1];
    size_t rel = 0, last_a = 0;

    for (size_t i = 0; i < p->ninstr; i++) {
        const ovl_instr_t *in = &p->instr[i];

        if (in->kind == OVL_I_RECORD && in->event == OVL_EV_RELEASE)
            rel = i;
        if (in->kind == OVL_I_PULL && in->src.buf == OVL_BUF_A)
            last_a = i;
    }
    assert_true(rel > last_a);
    ovl_instr_t in = p->instr[rel];
    remove_instr(p, rel);
    insert_instr(p, last_a + 1, &in);
}

/* r2's first RAIL moves a row fewer */
static void rail_rows_differ(ovl_plan_t *plans)
{
    plans[2].instr[find_instr(&plans[2], OVL_I_RAIL, -1, 0)].rows--;
}

/* r3 waits on an event of r1, on another node */
static void wait_across_nodes(ovl_plan_t *plans)
{
    plans[3].instr[find_wait(&plans[3], 1, 2, OVL_EV_READY)].peer = 1;
}

/* r1's first GEMM of rows r1 received itself (remote), with its wait for
 * their arrival, moved ahead of the node's pulls and GEMMs: still ordered
 * after the rows arrive, but out of the order own, node, remote */
static void remote_gemm_first(ovl_plan_t *plans)
{
    ovl_plan_t *p = &plans[1];
    size_t g = SIZE_MAX, at = find_instr(p, OVL_I_PULL, OVL_BUF_A, 0) - 1;

    for (size_t i = 0; i < p->ninstr && g == SIZE_MAX; i++)
        if (p->instr[i].kind == OVL_I_GEMM && p->instr[i].src.buf == OVL_BUF_G &&
            p->instr[i].dst.row / p->params.m >= 2)
            g = i;
    assert_true(g != SIZE_MAX && g > at);
    assert_int_equal(p->instr[g - 1].kind, OVL_I_WAIT); /* its arrival */
    assert_int_equal(p->instr[at].kind, OVL_I_WAIT);    /* the peer's READY */
    ovl_instr_t wait = p->instr[g - 1], gemm = p->instr[g];
    remove_instr(p, g);
    remove_instr(p, g - 1);
    insert_instr(p, at, &gemm);
    insert_instr(p, at, &wait);
}

/* r3 drops its RAILs: r1 would wait for ever for what r3 sends */
static void drop_rails(ovl_plan_t *plans)
{
    ovl_plan_t *p = &plans[3];

    for (size_t i = p->ninstr; i-- > 0;)
        if (p->instr[i].kind == OVL_I_RAIL)
            remove_instr(p, i);
}

static void test_checker_catches_nodes(void **state)
{
    static const uint32_t two_by_two[] = {0, 0, 1, 1};

    (void)state;
    build_topo = two_by_two;
    expect_violation(OVL_ALGO_RING, 4, 2, 0, drop_arrival_wait, "PULL reads r0's G block");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, wrong_receiver, "which the rail sends node 1's");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, missing_send, "which does not send to it");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, pull_across_nodes, "PULL crosses nodes");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, release_before_g_pulls,
                     "may complete while its G is read");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, rail_rows_differ, "RAIL rows differ");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, wait_across_nodes, "of another node");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, remote_gemm_first, "after a remote one");
    expect_violation(OVL_ALGO_RING, 4, 2, 0, drop_rails, "0 RAILs for 2 chunks");
    build_topo = NULL;
}

/* A topology is checked (ids dense, below the world), one node given as
 * node_of plans exactly what no node_of plans, and what only the copy
 * engine can gather is refused across nodes. */
static void test_topology_params(void **state)
{
    static const uint32_t zeros[4] = {0}, gap[4] = {0, 0, 2, 2}, big[4] = {0, 4, 1, 1},
                          two[4] = {0, 1, 1, 0};
    ovl_plan_params_t p = params_of(OVL_ALGO_RING, 4, 1, 64, 2, 0, false);
    ovl_plan_t plan, one;
    char *a, *b;

    (void)state;
    p.node_of = gap;
    expect_invalid(&p);
    p.node_of = big;
    expect_invalid(&p);
    for (int a_ = OVL_ALGO_NAIVE; a_ <= OVL_ALGO_RING; a_++) {
        p.algo = (ovl_algo_t)a_;
        p.node_of = two;
        for (int l = L_STRIDED; l < L_COUNT; l++) {
            set_layout(&p, (layout_t)l);
            if (l == L_STRIDED || l == L_COPY || (l == L_SHARED && a_ != OVL_ALGO_RING)) {
                expect_invalid(&p);
                continue;
            }
            assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
            if (l == L_SHARED) {
                /* ring's plan across nodes is the same whether ranks
                 * share GPUs or not: only its header says it */
                set_layout(&p, L_NCCL);
                assert_int_equal(ovl_plan_build(&p, &one), OVL_OK);
                assert_true(plan.params.shared_gpu && !one.params.shared_gpu);
                a = format_plan(&plan);
                b = format_plan(&one);
                assert_non_null(strstr(a, " shared_gpu=yes "));
                assert_string_equal(strchr(a, '\n'), strchr(b, '\n'));
                free(a);
                free(b);
                ovl_plan_free(&one);
            }
            ovl_plan_free(&plan);
        }
        set_layout(&p, L_DENSE);
        /* every rank on node 0 is one node: byte for byte */
        p.node_of = zeros;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        p.node_of = NULL;
        assert_int_equal(ovl_plan_build(&p, &one), OVL_OK);
        a = format_plan(&plan);
        b = format_plan(&one);
        assert_string_equal(a, b);
        assert_null(plan.params.node_of);
        assert_int_equal(plan.nnodes, 1);
        free(a);
        free(b);
        ovl_plan_free(&plan);
        ovl_plan_free(&one);
    }
    /* the plan keeps its own copy of the topology */
    {
        uint32_t mine[4] = {0, 1, 1, 0};

        p.algo = OVL_ALGO_RING;
        p.node_of = mine;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        mine[1] = 0;
        assert_true(plan.params.node_of != mine);
        assert_int_equal(plan.params.node_of[1], 1);
        a = format_plan(&plan);
        assert_non_null(strstr(a, "plan format=5 kind=ag_gemm algo=ring "));
        assert_non_null(strstr(a, "\ntopology nodes=2 sizes=2,2 node_of=0,1,1,0\n"));
        free(a);
        ovl_plan_free(&plan);
    }
}

/* ovl_plan_rail_groups: three topologies by hand, then every topology the
 * tests across nodes build, against the plans' own RAILs: each names only
 * ranks of its rank's group, every group is connected by them, groups are
 * numbered by their lowest ranks, places run in rank order, and where
 * nodes are even there is one group per local index, with one rank of
 * each node. (Uneven nodes of 2 and 3 ranks make 2 groups, of 3 and 2
 * ranks: no formula simpler than the search.) */
static void test_rail_groups(void **state)
{
    static const uint32_t two_by_two[] = {0, 0, 1, 1}, uneven[] = {0, 1, 1, 2, 2, 2},
                          two_four[] = {1, 0, 1, 0, 1, 1}, gap[] = {0, 2, 2, 0};
    uint32_t group[8], pos[8], n = 0, node_of[8], reach[8];
    ovl_plan_t plans[8];

    (void)state;
    assert_int_equal(ovl_plan_rail_groups(4, two_by_two, group, pos, &n), OVL_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(group, ((uint32_t[]){0, 1, 0, 1}), sizeof(uint32_t) * 4);
    assert_memory_equal(pos, ((uint32_t[]){0, 0, 1, 1}), sizeof(uint32_t) * 4);
    assert_int_equal(ovl_plan_rail_groups(6, uneven, group, pos, &n), OVL_OK);
    assert_int_equal(n, 1);
    assert_memory_equal(pos, ((uint32_t[]){0, 1, 2, 3, 4, 5}), sizeof(uint32_t) * 6);
    /* 2 ranks on node 1 (r1 r3), 4 on node 0 (r0 r2 r4 r5): r1 with r0
     * and r4, r3 with r2 and r5 */
    assert_int_equal(ovl_plan_rail_groups(6, two_four, group, pos, &n), OVL_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(group, ((uint32_t[]){0, 0, 1, 1, 0, 1}), sizeof(uint32_t) * 6);
    assert_memory_equal(pos, ((uint32_t[]){0, 1, 0, 1, 2, 2}), sizeof(uint32_t) * 6);
    /* one node: every rank alone (no RAIL connects anything) */
    assert_int_equal(ovl_plan_rail_groups(3, (uint32_t[]){0, 0, 0}, group, pos, &n), OVL_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ovl_plan_rail_groups(4, gap, group, pos, &n), OVL_ERR_INVALID);
    assert_int_equal(ovl_plan_rail_groups(0, two_by_two, group, pos, &n), OVL_ERR_INVALID);
    assert_int_equal(ovl_plan_rail_groups(4, NULL, group, pos, &n), OVL_ERR_INVALID);
    assert_int_equal(ovl_plan_rail_groups(OVL_PLAN_MAX_WORLD + 1, two_by_two, group, pos, &n),
                     OVL_ERR_INVALID);

    for (uint32_t world = 2; world <= 8; world++)
        for (uint32_t nodes = 2; nodes <= 4 && nodes <= world; nodes++)
            for (int kind = 0; kind < TOPO_KINDS; kind++) {
                uint32_t size[8] = {0}, seen = 0;
                bool even = true;

                make_topo(world, nodes, kind, node_of);
                assert_int_equal(ovl_plan_rail_groups(world, node_of, group, pos, &n), OVL_OK);
                for (uint32_t q = 0; q < world; q++)
                    size[node_of[q]]++;
                for (uint32_t d = 1; d < nodes; d++)
                    even &= size[d] == size[0];
                /* even nodes: one group per local index, one rank of each
                 * node in it */
                if (even) {
                    uint32_t per[8][8] = {{0}}; /* [group][node] */

                    assert_int_equal(n, size[0]);
                    for (uint32_t q = 0; q < world; q++)
                        per[group[q]][node_of[q]]++;
                    for (uint32_t x = 0; x < n; x++)
                        for (uint32_t d = 0; d < nodes; d++)
                            assert_int_equal(per[x][d], 1);
                }
                build_topo = node_of;
                build_job_as(plans, OVL_ALGO_RING, world, 8, 2, 0, false, L_DENSE, false);
                build_topo = NULL;
                /* reach[q]: the ranks q's group has reached by RAILs, as
                 * a mask; union over the plans until it settles */
                for (uint32_t q = 0; q < world; q++)
                    reach[q] = 1u << q;
                for (int round = 0; round < 8; round++)
                    for (uint32_t q = 0; q < world; q++)
                        for (uint32_t i = 0; i < plans[q].npeers; i++) {
                            uint32_t x = plans[q].peers[i];

                            assert_int_equal(group[x], group[q]);
                            reach[q] |= reach[x];
                            reach[x] |= reach[q];
                        }
                for (uint32_t q = 0; q < world; q++) {
                    uint32_t same = 0, before = 0;

                    for (uint32_t x = 0; x < world; x++) {
                        same |= (uint32_t)(group[x] == group[q]) << x;
                        before += x < q && group[x] == group[q];
                    }
                    assert_int_equal(reach[q], same); /* connected, and nothing more */
                    assert_int_equal(pos[q], before);
                    /* numbered in the order of the groups' lowest ranks */
                    if (before == 0)
                        assert_int_equal(group[q], seen++);
                }
                free_job(plans, world);
            }
}

/* AUTO across nodes with ranks sharing a GPU: ring, the one that runs,
 * even where one node would take naive. */
static void test_choose_shared_across_nodes(void **state)
{
    static const uint32_t two_by_two[] = {0, 0, 1, 1};
    ovl_plan_params_t p = params_of(OVL_ALGO_AUTO, 4, 0, 4, 0, 0, false);

    (void)state;
    p.n = p.k = 8;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE);
    p.node_of = two_by_two;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE);
    p.shared_gpu = true;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING);
    p.node_of = NULL;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE);
}

static char *format_plan(const ovl_plan_t *plan)
{
    size_t need = ovl_plan_format(plan, NULL, 0);
    char *text = malloc(need + 1);

    assert_non_null(text);
    assert_int_equal(ovl_plan_format(plan, text, need + 1), need);
    assert_int_equal(strlen(text), need);
    return text;
}

static void check_golden_full(ovl_algo_t algo, layout_t layout, uint32_t world, uint32_t rank,
                              uint32_t chunks, const char *name)
{
    ovl_plan_params_t p = params_of(algo, world, rank, 1024, chunks, 2, false);
    const char *update = getenv("OVL_UPDATE_GOLDEN");
    char path[4096];
    ovl_plan_t plan;
    char *text, *want;
    long size;
    FILE *f;

    set_layout(&p, layout);
    p.node_of = build_topo;
    if (build_k)
        p.k = build_k;
    set_sc(&p);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    text = format_plan(&plan);
    snprintf(path, sizeof(path), "%s/%s", OVL_GOLDEN_DIR, name);

    if (update && strcmp(update, "1") == 0) {
        f = fopen(path, "w");
        if (!f)
            fail_msg("cannot write %s", path);
        assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
        assert_int_equal(fclose(f), 0);
    } else {
        f = fopen(path, "r");
        if (!f)
            fail_msg("cannot read %s (OVL_UPDATE_GOLDEN=1 writes it)", path);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        size = ftell(f);
        assert_true(size >= 0);
        rewind(f);
        want = calloc((size_t)size + 1, 1);
        assert_non_null(want);
        assert_int_equal(fread(want, 1, (size_t)size, f), (size_t)size);
        fclose(f);
        /* assert_string_equal prints both texts on a mismatch */
        assert_string_equal(text, want);
        free(want);
    }
    free(text);
    ovl_plan_free(&plan);
}

static void check_golden_as(ovl_algo_t algo, layout_t layout, const char *name)
{
    check_golden_full(algo, layout, 4, 1, 4, name);
}

static void check_golden_shape(ovl_algo_t algo, uint32_t world, uint32_t rank, uint32_t chunks,
                               const char *name)
{
    check_golden_full(algo, L_DENSE, world, rank, chunks, name);
}

static void check_golden(ovl_algo_t algo, const char *name)
{
    check_golden_as(algo, L_DENSE, name);
}

/* Goldens across nodes: the standard shape but for the world, the rank,
 * the chunks and the topology (ovlctl plan --nodes / --local-ranks). */
static void check_golden_nodes(ovl_algo_t algo, uint32_t world, uint32_t rank, uint32_t chunks,
                               const uint32_t *node_of, const char *name)
{
    build_topo = node_of;
    check_golden_shape(algo, world, rank, chunks, name);
    build_topo = NULL;
}

static void test_golden_nodes(void **state)
{
    static const uint32_t two_by_two[] = {0, 0, 1, 1}, uneven[] = {0, 1, 1, 2, 2, 2};

    (void)state;
    check_golden_nodes(OVL_ALGO_RING, 4, 1, 4, two_by_two, "plan_ring_2x2.txt");
    check_golden_nodes(OVL_ALGO_RING, 6, 1, 2, uneven, "plan_ring_1+2+3.txt");
    check_golden_nodes(OVL_ALGO_COLLECTIVE, 4, 1, 4, two_by_two, "plan_collective_2x2.txt");
}

static void test_golden_naive(void **state)
{
    (void)state;
    check_golden(OVL_ALGO_NAIVE, "plan_naive.txt");
}

static void test_golden_collective(void **state)
{
    (void)state;
    check_golden(OVL_ALGO_COLLECTIVE, "plan_collective.txt");
}

static void test_golden_ring(void **state)
{
    (void)state;
    check_golden(OVL_ALGO_RING, "plan_ring.txt");
}

/* The copy-engine gather, as the daemon's allgather = copy asks (ovlctl
 * plan --allgather copy prints the same). */
static void test_golden_copy(void **state)
{
    (void)state;
    check_golden_as(OVL_ALGO_NAIVE, L_COPY, "plan_naive_copy.txt");
    check_golden_as(OVL_ALGO_COLLECTIVE, L_COPY, "plan_collective_copy.txt");
    /* ranks that share a GPU: pulls though NCCL is asked for */
    check_golden_as(OVL_ALGO_NAIVE, L_SHARED, "plan_naive_shared.txt");
}

static void expect_invalid(const ovl_plan_params_t *p)
{
    ovl_plan_t plan, zero;

    memset(&plan, 0xa5, sizeof(plan));
    memcpy(&zero, &plan, sizeof(plan));
    assert_int_equal(ovl_plan_build(p, &plan), OVL_ERR_INVALID);
    /* ret_plan is set only on success */
    assert_memory_equal(&plan, &zero, sizeof(plan));
}

static void test_invalid_params(void **state)
{
    ovl_plan_params_t good = params_of(OVL_ALGO_RING, 4, 1, 64, 0, 0, false), p;
    ovl_plan_t plan;

    (void)state;
    p = good, p.world = 0;
    expect_invalid(&p);
    p = good, p.world = OVL_PLAN_MAX_WORLD + 1, p.rank = 0;
    expect_invalid(&p);
    p = good, p.rank = 4;
    expect_invalid(&p);
    p = good, p.m = 0;
    expect_invalid(&p);
    p = good, p.n = 0;
    expect_invalid(&p);
    p = good, p.k = 0;
    expect_invalid(&p);
    p = good, p.m = UINT64_MAX / 2; /* world*m rows would wrap */
    expect_invalid(&p);
    p = good, p.algo = OVL_ALGO_AUTO;
    expect_invalid(&p);
    p = good, p.algo = (ovl_algo_t)4;
    expect_invalid(&p);
    p = good, p.dtype = (ovl_dtype_t)3;
    expect_invalid(&p);
    p = good, p.chunks = OVL_PLAN_MAX_CHUNKS + 1;
    expect_invalid(&p);
    p = good, p.streams = OVL_PLAN_MAX_STREAMS + 1;
    expect_invalid(&p);
    p = good, p.allgather = OVL_AG_PREF_COUNT;
    expect_invalid(&p);
    assert_int_equal(ovl_plan_build(NULL, &plan), OVL_ERR_INVALID);
    assert_int_equal(ovl_plan_build(&good, NULL), OVL_ERR_INVALID);

    /* the limits themselves are fine */
    p = good, p.chunks = OVL_PLAN_MAX_CHUNKS, p.streams = OVL_PLAN_MAX_STREAMS;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    ovl_plan_free(&plan);
}

/* The scratch is known before building, and a size past 64 bits is
 * refused, never wrapped. */
static void test_scratch(void **state)
{
    ovl_plan_params_t p = params_of(OVL_ALGO_NAIVE, 4, 1, 1024, 0, 0, false);
    ovl_plan_t plan, zero;
    uint64_t bytes = 1;

    (void)state;
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, 4 * 1024 * 512 * 2);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.scratch_bytes, bytes);
    ovl_plan_free(&plan);

    /* a_out is G: no scratch */
    p.want_gathered = true;
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, 0);
    /* ring alone without a_out gathers nothing */
    p = params_of(OVL_ALGO_RING, 1, 0, 1024, 0, 0, false);
    bytes = 1;
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, 0);

    /* world*m fits, world*m*k*2 bytes does not */
    p = params_of(OVL_ALGO_COLLECTIVE, 1024, 0, UINT64_C(1) << 40, 0, 0, false);
    p.k = UINT64_C(1) << 20;
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_ERR_LIMIT);
    memset(&plan, 0xa5, sizeof(plan));
    memcpy(&zero, &plan, sizeof(plan));
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_LIMIT);
    assert_memory_equal(&plan, &zero, sizeof(plan));
    /* ... unless the client's a_out holds G */
    p.want_gathered = true;
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, 0);

    /* what the planner refuses has no scratch either */
    p = params_of(OVL_ALGO_AUTO, 4, 1, 1024, 0, 0, false);
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_ERR_INVALID);
    assert_int_equal(ovl_plan_scratch_bytes(NULL, &bytes), OVL_ERR_INVALID);
    assert_int_equal(ovl_plan_scratch_bytes(&p, NULL), OVL_ERR_INVALID);
}

static void test_format_truncation(void **state)
{
    ovl_plan_params_t p = params_of(OVL_ALGO_NAIVE, 2, 0, 8, 0, 0, false);
    ovl_plan_t plan;
    char *full, small[16];
    size_t need;

    (void)state;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    full = format_plan(&plan);
    need = strlen(full);
    assert_true(need > sizeof(small));

    memset(small, 'x', sizeof(small));
    assert_int_equal(ovl_plan_format(&plan, small, sizeof(small)), need);
    assert_int_equal(small[sizeof(small) - 1], '\0');
    assert_memory_equal(small, full, sizeof(small) - 1);

    /* len 1: just the NUL; len 0: buf untouched */
    small[0] = 'x';
    assert_int_equal(ovl_plan_format(&plan, small, 1), need);
    assert_int_equal(small[0], '\0');
    small[0] = 'x';
    assert_int_equal(ovl_plan_format(&plan, small, 0), need);
    assert_int_equal(small[0], 'x');

    /* exactly need bytes: all but the last character */
    {
        char *buf = malloc(need);

        assert_non_null(buf);
        assert_int_equal(ovl_plan_format(&plan, buf, need), need);
        assert_int_equal(buf[need - 1], '\0');
        assert_memory_equal(buf, full, need - 1);
        free(buf);
    }
    free(full);
    ovl_plan_free(&plan);
}

static void test_uneven_chunks(void **state)
{
    ovl_plan_params_t p = params_of(OVL_ALGO_COLLECTIVE, 2, 0, 10, 4, 2, false);
    ovl_plan_t plan;
    size_t g;

    (void)state;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunk_rows, 3);
    assert_int_equal(plan.chunks, 4);
    g = find_instr(&plan, OVL_I_GEMM, -1, 3);
    assert_int_equal(plan.instr[g].src.row, 9);
    assert_int_equal(plan.instr[g].rows, 1);
    ovl_plan_free(&plan);

    /* m 9, 4 chunks: 3 rows each, so only 3 chunks and none empty */
    p.m = 9;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunk_rows, 3);
    assert_int_equal(plan.chunks, 3);
    g = find_instr(&plan, OVL_I_GEMM, -1, 2);
    assert_int_equal(plan.instr[g].src.row, 6);
    assert_int_equal(plan.instr[g].rows, 3);
    ovl_plan_free(&plan);

    /* more chunks than rows: one row each */
    p.m = 3, p.chunks = 9;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunk_rows, 1);
    assert_int_equal(plan.chunks, 3);
    ovl_plan_free(&plan);
}

/* Replay is for ops whose GEMMs on one rank (every gathered row, every B)
 * do under 2^36 flop, whatever the algorithm; at 2^36 and above they are
 * issued call by call (plan.c, REPLAY_MAX_GEMM_FLOP). */
static void test_replay_rule(void **state)
{
    static const ovl_algo_t algos[] = {OVL_ALGO_NAIVE, OVL_ALGO_COLLECTIVE, OVL_ALGO_RING};
    ovl_plan_t plan;
    ovl_plan_params_t p;

    (void)state;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
        /* world 1, 2 x 2048 x 4096 x 4096 = 2^36: not replayed */
        p = params_of(algos[a], 1, 0, 2048, 0, 0, false);
        p.n = 4096, p.k = 4096;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        assert_false(plan.replay);
        ovl_plan_free(&plan);
        p.m = 2047; /* just under */
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        assert_true(plan.replay);
        ovl_plan_free(&plan);
        /* world 4: the gathered rows count, 4 x 512 = 2048 */
        p = params_of(algos[a], 4, 1, 512, 0, 0, false);
        p.n = 4096, p.k = 4096;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        assert_false(plan.replay);
        ovl_plan_free(&plan);
        /* every B's columns: 2048 + 2048 = 4096 */
        p.n = 2048, p.nb = 2, p.n_more[0] = 2048;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        assert_false(plan.replay);
        ovl_plan_free(&plan);
        p.n_more[0] = 2047;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        assert_true(plan.replay);
        ovl_plan_free(&plan);
    }
}

static void test_defaults(void **state)
{
    ovl_plan_t plan;
    ovl_plan_params_t p;

    (void)state;
    p = params_of(OVL_ALGO_NAIVE, 4, 0, 1024, 8, 4, false);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 1); /* naive ignores chunks and streams */
    assert_int_equal(plan.nstreams, 1);
    assert_int_equal(plan.nevents, 1);
    assert_true(plan.bufs[OVL_BUF_G].used);
    ovl_plan_free(&plan);

    /* collective: 4 chunks while each chunk's GEMM (256 rows of 4 ranks
     * here) keeps 2^30 flop, halved below that */
    p = params_of(OVL_ALGO_COLLECTIVE, 4, 0, 1024, 0, 0, false);
    p.k = 8192;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 4);
    assert_int_equal(plan.chunk_rows, 256);
    assert_int_equal(plan.nstreams, 2);
    ovl_plan_free(&plan);
    p.k = 2048; /* 2 x 1024 x 256 x 2048: 2^30 exactly, still 4 */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 4);
    ovl_plan_free(&plan);
    p.k = 1024; /* half that: 2 chunks of 512 rows */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2);
    assert_int_equal(plan.chunk_rows, 512);
    ovl_plan_free(&plan);
    p.k = 512; /* a quarter: one chunk, and no stream without a chunk */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 1);
    assert_int_equal(plan.nstreams, 1);
    ovl_plan_free(&plan);
    p.k = 512, p.chunks = 4; /* asked for: as asked */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 4);
    ovl_plan_free(&plan);

    /* collective: no more streams than chunks */
    p = params_of(OVL_ALGO_COLLECTIVE, 4, 0, 1024, 3, 5, false);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.nstreams, 3);
    ovl_plan_free(&plan);

    p = params_of(OVL_ALGO_RING, 4, 0, 1024, 0, 1, false);
    p.k = 8192;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2); /* n 256: narrow, two chunks */
    ovl_plan_free(&plan);
    p.k = 512; /* a chunk's GEMM of 512 x 256 x 512: too short to split */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 1);
    ovl_plan_free(&plan);
    p.chunks = 2; /* asked for: as asked */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2);
    ovl_plan_free(&plan);
    p = params_of(OVL_ALGO_RING, 4, 0, 1024, 0, 1, false);
    p.n = 1025;
    p.k = 8192;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 1);   /* wide: one pull per peer */
    assert_int_equal(plan.nstreams, 4); /* fixed: client, copy, two GEMM streams */
    assert_true(plan.bufs[OVL_BUF_G].used);
    ovl_plan_free(&plan);

    /* ring alone: one chunk by default (it pulls nothing, so chunks would
     * only cut its GEMM); chunks asked for as asked. collective alone
     * still copies A into G, which its chunks overlap: its default. */
    p = params_of(OVL_ALGO_RING, 1, 0, 65536, 0, 0, false);
    p.n = 1024, p.k = 1024;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 1);
    ovl_plan_free(&plan);
    p.chunks = 2;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2);
    ovl_plan_free(&plan);
    p.algo = OVL_ALGO_COLLECTIVE, p.chunks = 0;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 4);
    ovl_plan_free(&plan);

    /* ring alone: the own shard straight from A, G untouched */
    p = params_of(OVL_ALGO_RING, 1, 0, 1024, 2, 3, false);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.nstreams, 1);
    assert_int_equal(plan.nevents, 1);
    assert_false(plan.bufs[OVL_BUF_G].used);
    assert_int_equal(plan.scratch_bytes, 0);
    assert_int_equal(plan.ninstr, 5);
    ovl_plan_free(&plan);
}

static void test_choose(void **state)
{
    static const uint32_t worlds[] = {0, 1, 2, 8, 1024};
    static const uint64_t sizes[] = {0, 1, 7, 64, 511, 512, 4096, UINT64_MAX};
    ovl_plan_params_t p;

    (void)state;
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++)
        for (size_t a = 0; a < sizeof(sizes) / sizeof(sizes[0]); a++)
            for (size_t b = 0; b < sizeof(sizes) / sizeof(sizes[0]); b++) {
                ovl_algo_t algo;

                p = params_of(OVL_ALGO_AUTO, worlds[w], 0, sizes[a], 0, 0, false);
                p.n = p.k = sizes[b];
                algo = ovl_plan_choose(&p);
                assert_true(algo > OVL_ALGO_AUTO && algo < OVL_ALGO_COUNT);
            }
    assert_int_equal(ovl_plan_choose(NULL), OVL_ALGO_NAIVE);

    /* the documented rule */
    p = params_of(OVL_ALGO_AUTO, 1, 0, 8192, 0, 0, false);
    p.n = p.k = 8192;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE); /* one rank */
    p.world = 8, p.m = 63;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE); /* 504 rows */
    p.m = 64;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING); /* 512 rows */
    p.n = 256, p.k = 512;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING); /* 2*512*256*512 = 2^27 flops */
    p.k = 511;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE);
}

static void test_free_and_names(void **state)
{
    ovl_plan_t plan = {0};

    (void)state;
    ovl_plan_free(&plan);
    ovl_plan_free(NULL);
    assert_string_equal(ovl_instr_name(OVL_I_WAIT_READY), "WAIT_READY");
    assert_string_equal(ovl_instr_name(OVL_I_DONE), "DONE");
    assert_string_equal(ovl_instr_name((ovl_instr_kind_t)99), "UNKNOWN");
}

/* GEMM + reduce-scatter: every rank's plan of jobs of worlds 1 to 8, block
 * rows 1 to 100, chunks 0 to 9 and streams 0 to 5, every algorithm,
 * sum and avg, with and without transb, checked together; and what the
 * planner refuses of this kind. */
static ovl_plan_params_t rs_params(ovl_algo_t algo, uint32_t world, uint32_t rank, uint64_t mb,
                                   uint32_t chunks, uint32_t streams, bool transb, bool avg)
{
    return (ovl_plan_params_t){.kind = OVL_OP_GEMM_RS,
                               .reduce_op = avg ? OVL_REDUCE_AVG : OVL_REDUCE_SUM,
                               .algo = algo,
                               .world = world,
                               .rank = rank,
                               .m = mb * world,
                               .n = 48,
                               .k = 40,
                               .dtype = OVL_DTYPE_BF16,
                               .chunks = chunks,
                               .streams = streams,
                               .transb = transb};
}

static void test_rs_checker_all_shapes(void **state)
{
    static const uint64_t mbs[] = {1, 2, 3, 7, 64, 100};
    ovl_plan_t plans[8];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0;

    (void)state;
    for (uint32_t world = 1; world <= 8; world++)
        for (size_t mi = 0; mi < sizeof(mbs) / sizeof(mbs[0]); mi++)
            for (uint32_t chunks = 0; chunks <= 9; chunks++)
                for (uint32_t streams = 0; streams <= 5; streams++)
                    for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_PUSH; a++) {
                        bool odd = (chunks + streams) % 2 == 1;

                        for (uint32_t r = 0; r < world; r++) {
                            ovl_plan_params_t p = rs_params((ovl_algo_t)a, world, r, mbs[mi],
                                                            chunks, streams, odd, !odd);

                            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                        }
                        if (!check_job(&ck, plans, world))
                            fail_msg("gemm_rs %s world=%u mb=%llu chunks=%u streams=%u: %s",
                                     ovl_algo_name((ovl_algo_t)a), world,
                                     (unsigned long long)mbs[mi], chunks, streams, ck.why);
                        free_job(plans, world);
                        jobs++;
                    }
    checker_free(&ck);
    assert_true(jobs > 1000);
}

/* The nodes node_of names (world entries, dense). */
static uint32_t pb_nodes(const uint32_t *node_of, uint32_t world)
{
    uint32_t n = 0;

    for (uint32_t q = 0; q < world; q++)
        if (node_of[q] + 1 > n)
            n = node_of[q] + 1;
    return n;
}

/* GEMM + reduce-scatter across nodes: naive and collective, the plans of
 * one node with the topology kept (the REDUCE_SCATTERs span the job), on
 * even, uneven and interleaved topologies, checked together. */
static void test_rs_checker_nodes(void **state)
{
    static const uint32_t t22[] = {0, 0, 1, 1}, t123[] = {0, 1, 1, 2, 2, 2}, tmix[] = {1, 0, 1, 0},
                          t11[] = {0, 1};
    static const struct {
        const uint32_t *node_of;
        uint32_t world, nnodes;
    } jobs[] = {{t22, 4, 2}, {t123, 6, 3}, {tmix, 4, 2}, {t11, 2, 2}};
    ovl_plan_t plans[6], one[6];
    checker_t ck = {.arena = NULL};

    (void)state;
    for (size_t t = 0; t < sizeof(jobs) / sizeof(jobs[0]); t++)
        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_COLLECTIVE; a++)
            for (uint32_t chunks = 0; chunks <= 3; chunks++) {
                uint32_t w = jobs[t].world;

                for (uint32_t r = 0; r < w; r++) {
                    ovl_plan_params_t p =
                        rs_params((ovl_algo_t)a, w, r, 12, chunks, 2, chunks == 1, chunks == 2);

                    assert_int_equal(ovl_plan_build(&p, &one[r]), OVL_OK);
                    p.node_of = jobs[t].node_of;
                    assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                    assert_int_equal(plans[r].nnodes, jobs[t].nnodes);
                    /* the instructions are one node's: the texts agree
                     * from the roles on (the header and the topology
                     * line differ) */
                    assert_int_equal(plans[r].ninstr, one[r].ninstr);
                    char ta[8192], tb[8192];
                    ovl_plan_format(&plans[r], ta, sizeof(ta));
                    ovl_plan_format(&one[r], tb, sizeof(tb));
                    assert_non_null(strstr(ta, "\nroles"));
                    assert_string_equal(strstr(ta, "\nroles"), strstr(tb, "\nroles"));
                    assert_non_null(strstr(ta, "\ntopology nodes="));
                }
                if (!check_job(&ck, plans, w))
                    fail_msg("gemm_rs %s across nodes (job %zu) chunks=%u: %s",
                             ovl_algo_name((ovl_algo_t)a), t, chunks, ck.why);
                free_job(plans, w);
                free_job(one, w);
            }
    /* push across nodes (the rail scheme): nodes of equal size whose ranks
     * of a local index are evenly spaced, node-major, round robin, counting
     * down; checked whole, its data flow included, with sum and avg and B
     * transposed or not */
    static const uint32_t e22[] = {0, 0, 1, 1}, e2rr[] = {0, 1, 0, 1}, e2dn[] = {1, 0, 1, 0},
                          e32[] = {0, 0, 1, 1, 2, 2}, e3rr[] = {0, 1, 2, 0, 1, 2},
                          e41[] = {0, 1, 2, 3}, e24[] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const struct {
        const uint32_t *node_of;
        uint32_t world;
    } even[] = {{e22, 4}, {e2rr, 4}, {e2dn, 4}, {e32, 6}, {e3rr, 6}, {e41, 4}, {e24, 8}, {t11, 2}};
    ovl_plan_t pp8[8];
    for (size_t t = 0; t < sizeof(even) / sizeof(even[0]); t++)
        for (uint32_t v = 0; v < 4; v++) {
            uint32_t w = even[t].world;

            for (uint32_t r = 0; r < w; r++) {
                ovl_plan_params_t p =
                    rs_params(OVL_ALGO_PUSH, w, r, 1 + 5 * v, v, 0, v % 2 == 1, v >= 2);

                p.node_of = even[t].node_of;
                assert_int_equal(ovl_plan_build(&p, &pp8[r]), OVL_OK);
                assert_int_equal(pp8[r].nnodes, pb_nodes(even[t].node_of, w));
            }
            if (!check_job(&ck, pp8, w))
                fail_msg("gemm_rs push across nodes (job %zu, variant %u): %s", t, v, ck.why);
            free_job(pp8, w);
        }
    /* and not on uneven nodes, nor where a local index's ranks are not
     * evenly spaced */
    static const uint32_t odd[] = {0, 0, 1, 1, 0, 1};
    const uint32_t *bad[] = {t123, odd};
    for (size_t t = 0; t < 2; t++) {
        ovl_plan_params_t p = rs_params(OVL_ALGO_PUSH, 6, 0, 4, 0, 0, false, false);
        ovl_plan_t plan;

        p.node_of = bad[t];
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
        assert_non_null(
            strstr(ovl_plan_refusal(&p), "push across nodes takes nodes of equal size"));
    }
    checker_free(&ck);
}

/* The checker catches what a wrong GEMM + reduce-scatter plan does: a
 * REDUCE_SCATTER before its rows' GEMM, a chunk's rows reduced twice or
 * never, a C row written twice, a P row of another block. */
static void test_rs_checker_catches(void **state)
{
    ovl_plan_t plans[2];
    checker_t ck = {.arena = NULL};
    static const char *const want[] = {"rows differ", "before its GEMM", "written twice",
                                       "never reduced", "REDUCE_SCATTER geometry"};

    (void)state;
    for (int how = 0; how < 5; how++) {
        for (uint32_t r = 0; r < 2; r++) {
            ovl_plan_params_t p = rs_params(OVL_ALGO_COLLECTIVE, 2, r, 8, 2, 2, false, false);

            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        size_t at = find_instr(&plans[1], OVL_I_REDUCE_SCATTER, -1, 0);
        ovl_instr_t *in = &plans[1].instr[at];
        switch (how) {
        case 0: /* rank 1 skips its first REDUCE_SCATTER: the ranks meet at different ones */
            remove_instr(&plans[1], at);
            break;
        case 1: /* the reduce-scatter on the other stream, ahead of its GEMM */
            in->stream = 1;
            plans[1].instr[at + 2].stream = 0; /* keep the stream counts honest */
            break;
        case 2: /* chunk 0's GEMM again over chunk 1's rows */
            plans[1].instr[at - 1].dst.row = plans[1].instr[at - 1].src.row = 4;
            break;
        case 3: /* chunk 1's reduce-scatter covers half its rows, on both ranks */
            for (uint32_t r = 0; r < 2; r++)
                plans[r].instr[find_instr(&plans[r], OVL_I_REDUCE_SCATTER, -1, 1)].rows = 2;
            break;
        case 4: /* a sum where the op averages */
            for (uint32_t r = 0; r < 2; r++)
                plans[r].instr[find_instr(&plans[r], OVL_I_REDUCE_SCATTER, -1, 1)].avg = true;
            break;
        }
        if (check_job(&ck, plans, 2))
            fail_msg("case %d passed the checker", how);
        if (!strstr(ck.why, want[how]))
            fail_msg("case %d: '%s' does not say '%s'", how, ck.why, want[how]);
        free_job(plans, 2);
    }
    checker_free(&ck);
}

/* The checker catches what a wrong push plan does (world 3, 2 chunks): a
 * reduction that does not wait for a peer's push, a push that does not
 * wait for its GEMM or for the peer's READY, a push into the wrong slot or
 * to the wrong peer, a step's partial of the wrong block, a reduction of
 * too few slots, a push that never comes. */
static void test_push_checker_catches(void **state)
{
    enum { W = 3 };
    ovl_plan_t plans[W];
    checker_t ck = {.arena = NULL};
    static const char *const want[] = {
        "before it is written", "before it is written", "before its READY", "PUSH of step",
        "PUSH of step",         "GEMM of block",        "REDUCE geometry",  "deadlock"};

    (void)state;
    for (int how = 0; how < (int)(sizeof(want) / sizeof(want[0])); how++) {
        for (uint32_t r = 0; r < W; r++) {
            ovl_plan_params_t p = rs_params(OVL_ALGO_PUSH, W, r, 8, 2, 0, false, false);

            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        ovl_plan_t *p1 = &plans[1];
        size_t push = find_instr(p1, OVL_I_PUSH, -1, 0);
        size_t red = find_instr(p1, OVL_I_REDUCE, -1, 0);
        switch (how) {
        case 0: /* rank 1's first reduction does not wait for rank 0's push (step 1) */
            remove_instr(p1, find_wait(p1, 0, 0, OVL_EV_FIRST_FREE + 0));
            break;
        case 1: /* rank 1's first push does not wait for its GEMM */
            remove_instr(p1, push - 1);
            break;
        case 2: /* rank 1's copy stream does not wait for rank 2's READY */
            remove_instr(p1, find_wait(p1, 1, 2, OVL_EV_READY));
            break;
        case 3: /* the push lands in the peer's slot 0, not 1 */
            p1->instr[push].dst.row -= 8;
            break;
        case 4: /* the push goes to rank 0 (rank 1's step 1 is to rank 2) */
            p1->instr[push].dst.rank = 0;
            break;
        case 5: /* step 1's partial made of block 0's rows */
            p1->instr[push - 3].src.row -= 16;
            break;
        case 6: /* the reduction sums two of the three slots */
            p1->instr[red].nblocks = 2;
            break;
        case 7: /* the last push is dropped, with the record after it: its peer
                 * waits for ever */
            push = find_instr(p1, OVL_I_PUSH, -1, 3);
            remove_instr(p1, push + 1);
            remove_instr(p1, push);
            break;
        }
        if (check_job(&ck, plans, W))
            fail_msg("case %d passed the checker", how);
        if (!strstr(ck.why, want[how]))
            fail_msg("case %d: '%s' does not say '%s'", how, ck.why, want[how]);
        free_job(plans, W);
    }
    checker_free(&ck);
}

/* The data flow alone catches what makes a wrong sum, whatever else a
 * plan gets right: a GEMM of another block's rows, a reduction of two of
 * three slots, a push into the slot of another rank (the own slot then
 * never made), a reduce-scatter of the wrong rows; and rows past a buffer
 * (it runs without check_fields here). */
static void test_rs_dataflow_catches(void **state)
{
    enum { W = 3 };
    ovl_plan_t plans[W];
    checker_t ck = {.arena = NULL};
    static const char *const want[] = {"sums rows of block 2 row 0 and block 0", "of ranks 0x3",
                                       "inputs are never made", "C row 0 holds block 0 row 4",
                                       "names rows past its buffers"};

    (void)state;
    g_dataflow_only = true;
    for (int how = 0; how < 5; how++) {
        for (uint32_t r = 0; r < W; r++) {
            ovl_plan_params_t p = how < 3
                                      ? rs_params(OVL_ALGO_PUSH, W, r, 8, 1, 0, false, false)
                                      : rs_params(OVL_ALGO_COLLECTIVE, W, r, 8, 2, 1, false, false);

            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        /* the checks of check_job pass them all but the data flow's */
        ovl_plan_t *p0 = &plans[0];
        switch (how) {
        case 0: /* rank 0's own block made of block 2's rows of A */
            p0->instr[find_instr(p0, OVL_I_GEMM, -1, 2)].src.row = 16;
            break;
        case 1: /* rank 0 sums two of its three slots */
            p0->instr[find_instr(p0, OVL_I_REDUCE, -1, 0)].nblocks = 2;
            break;
        case 2: /* rank 1 pushes into rank 2's slot 0 (rank 0's), not its own */
            plans[1].instr[find_instr(&plans[1], OVL_I_PUSH, -1, 0)].dst.row = 0;
            break;
        case 3: /* every rank's first reduce-scatter sums the second chunk's rows */
            for (uint32_t r = 0; r < W; r++)
                plans[r].instr[find_instr(&plans[r], OVL_I_REDUCE_SCATTER, -1, 0)].src.row = 4;
            break;
        case 4: /* and one past P: refused before it is read */
            for (uint32_t r = 0; r < W; r++)
                plans[r].instr[find_instr(&plans[r], OVL_I_REDUCE_SCATTER, -1, 0)].src.row = 8;
            break;
        }
        bool passed = check_job(&ck, plans, W);
        if (passed || !strstr(ck.why, want[how])) {
            g_dataflow_only = false;
            fail_msg("case %d: %s, '%s' does not say '%s'", how, passed ? "passed" : "failed",
                     ck.why, want[how]);
        }
        free_job(plans, W);
    }
    g_dataflow_only = false;
    /* and a good job passes it */
    for (uint32_t r = 0; r < W; r++) {
        ovl_plan_params_t p = rs_params(OVL_ALGO_COLLECTIVE, W, r, 8, 3, 2, true, true);

        assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
    }
    g_dataflow_only = true;
    bool ok = check_job(&ck, plans, W);
    g_dataflow_only = false;
    if (!ok)
        fail_msg("a good collective job: %s", ck.why);
    free_job(plans, W);
    checker_free(&ck);
}

/* The checker catches what a wrong push across nodes does (3 nodes of 2,
 * node-major): the two RAILs' node partials swapped (each reaches the
 * wrong node), a node partial of one slot short, a RAIL that lands one row
 * off, a final reduction of two of the three landing slots, a node
 * partial's wait on a peer's arrival dropped, RAIL peers swapped. */
static void test_railpush_checker_catches(void **state)
{
    enum { W = 6 };
    static const uint32_t n3[] = {0, 0, 1, 1, 2, 2};
    ovl_plan_t plans[W];
    checker_t ck = {.arena = NULL};
    static const char *const want[] = {"sums rows of block",
                                       "never read",
                                       "RAIL",
                                       "never read",
                                       "may complete while its P is written",
                                       "written twice"};

    (void)state;
    for (int how = 0; how < 6; how++) {
        for (uint32_t r = 0; r < W; r++) {
            ovl_plan_params_t p = rs_params(OVL_ALGO_PUSH, W, r, 4, 0, 0, false, false);

            p.node_of = n3;
            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        ovl_plan_t *p1 = &plans[1];
        size_t rail = find_instr(p1, OVL_I_RAIL, -1, 0);
        switch (how) {
        case 0: /* every rank's two RAILs send each other's node partial: every
                 * row moves once, after its write, but the sums mix blocks (the
                 * data flow's catch) */
            for (uint32_t r = 0; r < W; r++) {
                ovl_plan_t *p = &plans[r];
                ovl_instr_t *a = &p->instr[find_instr(p, OVL_I_RAIL, -1, 0)];
                ovl_instr_t *b = &p->instr[find_instr(p, OVL_I_RAIL, -1, 1)];
                uint64_t t = a->src.row;

                a->src.row = b->src.row;
                b->src.row = t;
            }
            break;
        case 5: /* every rank's first RAIL sends to where it should receive from */
            for (uint32_t r = 0; r < W; r++) {
                ovl_plan_t *p = &plans[r];
                ovl_instr_t *in = &p->instr[find_instr(p, OVL_I_RAIL, -1, 0)];
                uint32_t t = p->peers[in->peers];

                p->peers[in->peers] = p->peers[in->peers + 1];
                p->peers[in->peers + 1] = t;
            }
            break;
        case 1: /* rank 1's first node partial sums one of its two slots */
            p1->instr[find_instr(p1, OVL_I_REDUCE, -1, 0)].nblocks = 1;
            break;
        case 2: /* rank 1's first RAIL lands one block off */
            p1->instr[rail].dst.row += 1;
            break;
        case 3: /* rank 1's last reduction sums two of its three landing slots */
            p1->instr[find_instr(p1, OVL_I_REDUCE, -1, 3)].nblocks = 2;
            break;
        case 4: /* rank 1's stream 4 no longer waits for rank 0's arrival */
            remove_instr(p1, find_wait(p1, 4, 0, OVL_EV_FIRST_FREE));
            break;
        }
        if (check_job(&ck, plans, W))
            fail_msg("case %d passed the checker", how);
        if (!strstr(ck.why, want[how]))
            fail_msg("case %d: '%s' does not say '%s'", how, ck.why, want[how]);
        free_job(plans, W);
    }
    checker_free(&ck);
}

/* ring (gemm_rs): the checker catches a missing arrival wait, a wrong added
 * slot, a push to the wrong rank, a last step that adds nothing, a push
 * before the receiver is ready, avg where the op sums, and (the data
 * flow's own catch) a step that multiplies another block than the partial
 * it adds to. */
static void test_ringrs_checker_catches(void **state)
{
    enum { W = 3, MB = 4 };
    ovl_plan_t plans[W];
    checker_t ck = {.arena = NULL};
    static const char *const want[] = {"before it is written", "rows other than its receive slot's",
                                       "PUSH other than",      "adds nothing",
                                       "before its READY",     "avg wrong",
                                       "sums rows of block"};

    (void)state;
    for (int how = 0; how < 7; how++) {
        for (uint32_t r = 0; r < W; r++) {
            ovl_plan_params_t p = rs_params(OVL_ALGO_RING, W, r, MB, 1, 0, false, false);

            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        if (how == 0 && !check_job(&ck, plans, W)) /* whole, it passes */
            fail_msg("ring world %d: %s", W, ck.why);
        ovl_plan_t *p1 = &plans[1];
        size_t last = find_instr(p1, OVL_I_GEMM, -1, 2), mid = find_instr(p1, OVL_I_GEMM, -1, 1);
        switch (how) {
        case 0: /* rank 1 adds rank 0's first partial without waiting for it */
            remove_instr(p1, find_wait(p1, p1->instr[mid].stream, 0, OVL_EV_FIRST_FREE));
            break;
        case 1: /* the last step adds step 1's slot (read already) */
            p1->instr[last].acc.row = 0;
            break;
        case 2: /* the first push goes back to rank 0 */
            p1->instr[find_instr(p1, OVL_I_PUSH, -1, 0)].dst.rank = 0;
            break;
        case 3: /* the last step forgets what it received */
            p1->instr[last].accumulate = false;
            break;
        case 4: /* the copy stream no longer waits for rank 2's READY */
            remove_instr(p1, find_wait(p1, 1, 2, OVL_EV_READY));
            break;
        case 5: /* the op sums, the last step divides */
            p1->instr[last].avg = true;
            break;
        case 6: /* step 1 multiplies rank 1's own block into the partial of block 2 */
            p1->instr[mid].src.row = 1 * MB;
            g_dataflow_only = true;
            break;
        }
        bool passed = check_job(&ck, plans, W);
        g_dataflow_only = false;
        if (passed)
            fail_msg("case %d passed the checker", how);
        if (!strstr(ck.why, want[how]))
            fail_msg("case %d: '%s' does not say '%s'", how, ck.why, want[how]);
        free_job(plans, W);
    }
    checker_free(&ck);
}

static void test_rs_refused(void **state)
{
    ovl_plan_params_t p = rs_params(OVL_ALGO_NAIVE, 4, 0, 8, 0, 0, false, false);
    ovl_plan_t plan;
    uint64_t bytes;
    static const uint32_t two_nodes[] = {0, 0, 1, 1};

    (void)state;
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, 32ull * 48 * 2);
    p.m = 30; /* not a multiple of the world */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    assert_non_null(strstr(ovl_plan_refusal(&p), "not a multiple of the world"));
    p.m = 32;
    p.algo = OVL_ALGO_RING;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    /* ring's P: the 3 receive slots of 8 rows and the 3 sums it sends */
    assert_int_equal(plan.scratch_bytes, 48ull * 48 * 2);
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, plan.scratch_bytes);
    ovl_plan_free(&plan);
    p.algo = (ovl_algo_t)OVL_ALGO_COUNT;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    assert_non_null(strstr(ovl_plan_refusal(&p), "an algorithm gemm_rs does not have"));
    /* ranks sharing a GPU: auto picks push (the CUDA backend has no NCCL
     * between them for naive's and collective's REDUCE_SCATTERs; the host
     * backend runs those anyway, so the planner takes them) */
    p.shared_gpu = true;
    for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_COLLECTIVE; a++) {
        p.algo = (ovl_algo_t)a;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        ovl_plan_free(&plan);
    }
    p.algo = OVL_ALGO_AUTO;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    p.algo = OVL_ALGO_PUSH;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_null(ovl_plan_refusal(&p));
    /* push's P: the 4 slots of 8 rows and the 3 partials it sends */
    assert_int_equal(plan.scratch_bytes, (32ull + 24) * 48 * 2);
    assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_OK);
    assert_int_equal(bytes, plan.scratch_bytes);
    ovl_plan_free(&plan);
    /* push's P past 2^64 bytes, or its rows past 2^64: a limit */
    p.m = UINT64_MAX / 4 * 4;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_LIMIT);
    p.m = 32;
    p.shared_gpu = false;
    /* push is not all-gather + GEMM's; ring not this kind's */
    ovl_plan_params_t agp = p;
    agp.kind = OVL_OP_AG_GEMM;
    agp.m = 8;
    assert_int_equal(ovl_plan_build(&agp, &plan), OVL_ERR_INVALID);
    assert_null(ovl_plan_refusal(&agp)); /* the planner has no words for that kind's */
    p.algo = OVL_ALGO_NAIVE;
    p.want_gathered = true;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    p.want_gathered = false;
    p.nb = 2;
    p.n_more[0] = 8;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    p.nb = 1;
    /* across nodes: naive and collective (NCCL's reduce-scatter spans the
     * job), push by the rail scheme (even nodes: test_rs_checker_nodes);
     * where ranks share a GPU push only, which auto picks there, naive
     * elsewhere */
    p.node_of = two_nodes;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.nnodes, 2);
    assert_true(plan.params.node_of != two_nodes && plan.params.node_of[2] == 1);
    ovl_plan_free(&plan);
    /* ring passes its partials on by the copy engine: one node only */
    p.algo = OVL_ALGO_RING;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    assert_non_null(strstr(ovl_plan_refusal(&p), "ring (of gemm_rs) runs in one node"));
    p.algo = OVL_ALGO_PUSH;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.nstreams, 5);
    assert_true(plan.npeers > 0 && plan.peers);
    ovl_plan_free(&plan);
    p.algo = OVL_ALGO_COLLECTIVE;
    p.shared_gpu = true;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    assert_non_null(strstr(ovl_plan_refusal(&p), "ranks share a GPU in a job across nodes"));
    p.algo = OVL_ALGO_AUTO;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    /* an operator's default_algo stands for auto only where it runs */
    assert_false(ovl_plan_takes_default(&p, OVL_ALGO_NAIVE)); /* shared GPUs */
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_PUSH));
    p.shared_gpu = false;
    /* auto across even nodes: push's rail scheme; uneven: naive */
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    assert_non_null(strstr(ovl_plan_choose_why(&p), "rail scheme"));
    static const uint32_t uneven[] = {0, 0, 0, 1};
    p.node_of = uneven;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_NAIVE);
    assert_non_null(strstr(ovl_plan_choose_why(&p), "uneven nodes"));
    p.node_of = two_nodes;
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_COLLECTIVE));
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_PUSH));
    assert_false(ovl_plan_takes_default(&p, OVL_ALGO_RING)); /* one node only */
    assert_false(ovl_plan_takes_default(&p, OVL_ALGO_AUTO));
    p.node_of = NULL;
    /* one node: ring with a GPU per rank, push where ranks share a GPU */
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING);
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_PUSH));
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_RING));
    p.shared_gpu = true;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_PUSH));
    assert_true(ovl_plan_takes_default(&p, OVL_ALGO_RING));
    assert_false(ovl_plan_takes_default(&p, OVL_ALGO_NAIVE));
    p.world = 2;
    p.m = 16;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    p.shared_gpu = false;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING);
    assert_non_null(strstr(ovl_plan_choose_why(&p), "one node, a GPU per rank: ring"));
    p.world = 4;
    p.m = 32;
    ovl_plan_params_t agd = p;
    agd.kind = OVL_OP_AG_GEMM;
    agd.m = 8;
    assert_true(ovl_plan_takes_default(&agd, OVL_ALGO_RING));
    assert_false(ovl_plan_takes_default(&agd, OVL_ALGO_PUSH));
    agd.shared_gpu = true; /* all-gather + GEMM gathers by copies there */
    assert_true(ovl_plan_takes_default(&agd, OVL_ALGO_NAIVE));
    assert_false(ovl_plan_takes_default(NULL, OVL_ALGO_NAIVE));
    p.algo = OVL_ALGO_NAIVE;
    p.reduce_op = OVL_REDUCE_OP_COUNT;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_INVALID);
    p.reduce_op = OVL_REDUCE_SUM;
    /* P past 2^64 bytes: a limit, not a wrapped size */
    p.m = UINT64_MAX / 4 * 4;
    p.n = 1ull << 40;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_ERR_LIMIT);
    /* auto at world 4 on one node is ring; plans of one kind are not
     * another's in the cache's eyes */
    p = rs_params(OVL_ALGO_AUTO, 4, 0, 1024, 0, 0, false, false);
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING);
    /* but push in fp16 (ring stores its running sums in the dtype) and
     * above world 4 (ring not measured there) */
    p.dtype = OVL_DTYPE_FP16;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    assert_non_null(strstr(ovl_plan_choose_why(&p), "fp16: push"));
    p.dtype = OVL_DTYPE_BF16;
    p.world = 8;
    p.m = 8 * 1024;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    p = rs_params(OVL_ALGO_AUTO, 4, 0, 1024, 0, 0, false, false);
    /* ring's chunks by default: 4 where the rank's k is at most 1024 (its
     * copies outlast its GEMMs) and a chunk's GEMM keeps 2^33 flop, else
     * 2; push's 2. 65536 x 1024 x 1024 at world 2 (k 512) and 4 (k 256): */
    p.algo = OVL_ALGO_RING;
    p.m = 65536;
    p.n = 1024;
    p.k = 512;
    p.world = 2;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 4);
    ovl_plan_free(&plan);
    p.k = 256;
    p.world = 4;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2);
    ovl_plan_free(&plan);
    p.world = 2;
    p.k = 1025; /* compute-heavy */
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2);
    ovl_plan_free(&plan);
    p = rs_params(OVL_ALGO_RING, 4, 0, 1024, 0, 0, false, false);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2); /* k 40, but chunks of 2 * 256 * 48 * 40 flop */
    ovl_plan_free(&plan);
    p.algo = OVL_ALGO_PUSH;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(plan.chunks, 2);
    ovl_plan_free(&plan);
    p = rs_params(OVL_ALGO_AUTO, 4, 0, 1024, 0, 0, false, false);
    ovl_plan_params_t ag = p;
    ag.kind = OVL_OP_AG_GEMM;
    assert_false(ovl_plan_params_equal(&p, &ag));
    ovl_plan_params_t avg = p;
    avg.reduce_op = OVL_REDUCE_AVG;
    assert_false(ovl_plan_params_equal(&p, &avg));
}

/* The standard gemm_rs golden's shape but for the world and the rank,
 * scaled as build_sc says. */
static void check_golden_rs_as(ovl_algo_t algo, uint32_t world, uint32_t rank, const char *name)
{
    ovl_plan_params_t p = rs_params(algo, world, rank, 256, 4, 2, false, false);
    const char *update = getenv("OVL_UPDATE_GOLDEN");
    char path[4096];
    ovl_plan_t plan;

    p.n = 256;
    p.k = 512;
    set_sc(&p);
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    char *text = format_plan(&plan);
    snprintf(path, sizeof(path), "%s/%s", OVL_GOLDEN_DIR, name);
    FILE *f = fopen(path, update && strcmp(update, "1") == 0 ? "w" : "r");
    if (!f)
        fail_msg("cannot open %s (OVL_UPDATE_GOLDEN=1 writes it)", path);
    if (update && strcmp(update, "1") == 0) {
        assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    } else {
        char want[8192] = "";
        size_t got = fread(want, 1, sizeof(want) - 1, f);
        want[got] = '\0';
        assert_string_equal(text, want);
    }
    fclose(f);
    free(text);
    ovl_plan_free(&plan);
}

static void check_golden_rs(ovl_algo_t algo, const char *name)
{
    check_golden_rs_as(algo, 4, 1, name);
}

static void test_golden_rs(void **state)
{
    (void)state;
    check_golden_rs(OVL_ALGO_NAIVE, "plan_rs_naive.txt");
    check_golden_rs(OVL_ALGO_COLLECTIVE, "plan_rs_collective.txt");
    check_golden_rs(OVL_ALGO_PUSH, "plan_rs_push.txt");
    check_golden_rs(OVL_ALGO_RING, "plan_rs_ring.txt");
}

/* ------------------------------------------------------- scaled ops */

/* Every test of scaled ops leaves the builders' globals as it found them,
 * even where it fails half way. */
static int reset_builds(void **state)
{
    (void)state;
    build_sc = (ovl_plan_scaling_t){.scaled = false};
    build_sc_dtype = OVL_DTYPE_FP8_E4M3;
    build_topo = NULL;
    build_nb = 1;
    build_k = 0;
    g_mirror_off = false;
    g_dataflow_only = false;
    return 0;
}

/* The v-th of the scalings the tests cycle through beside A's scale mode
 * (each test's own axis): A's and B's fp8 (e4m3 both, or one e5m2), C's
 * dtype, B's scale mode (of those that go with A's: tensor and row, or by
 * A 1x128 the block modes 1x128 and 128x128), a bias or not. */
static ovl_plan_scaling_t cycle_sc(unsigned v, ovl_scale_mode_t a_mode, ovl_dtype_t *ret_dtype)
{
    static const ovl_dtype_t ab[3][2] = {{OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E4M3},
                                         {OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E5M2},
                                         {OVL_DTYPE_FP8_E5M2, OVL_DTYPE_FP8_E4M3}};
    static const ovl_dtype_t out[3] = {OVL_DTYPE_BF16, OVL_DTYPE_FP16, OVL_DTYPE_FP32};
    bool block = a_mode == OVL_SCALE_BLOCK_1X128;
    ovl_scale_mode_t b_mode = (v / 2) % 2 ? (block ? OVL_SCALE_BLOCK_128X128 : OVL_SCALE_ROW)
                                          : (block ? OVL_SCALE_BLOCK_1X128 : OVL_SCALE_TENSOR);

    *ret_dtype = ab[v % 3][0];
    return scaling(ab[v % 3][1], out[(v / 3) % 3], a_mode, b_mode, v % 2 == 1);
}

/* The k the tests of block scales cycle through: a partial last block of
 * 128 (300: 3 blocks, the last of 44; 100: one, partial) and whole blocks
 * (512: 4). */
static uint64_t cycle_k(unsigned v)
{
    static const uint64_t ks[] = {300, 512, 100};

    return ks[(v / 4) % 3];
}

static const char *mode_name(ovl_scale_mode_t mode)
{
    const char *name = ovl_scale_mode_name(mode);

    return name ? name : "?";
}

/*
 * All-gather + GEMM scaled, A's scales by a_mode: every algorithm and way
 * of gathering (shared GPUs included) at worlds 1 to 5 (1 to 4 by 1x128),
 * m in {1, 3, 64, 100} (by 1x128, which needs m in fours: {4, 12, 64,
 * 100}, whose chunks of 1 to 5 are cut in fours: 12 in 2 is 8 + 4, in 5
 * is 4 + 4 + 4), chunks 0 to 5, streams 0, 2 and 3, with and without
 * a_out, the dtypes, B's mode, the bias and 1 to 3 Bs cycling (by 1x128 k
 * too: cycle_k); then across nodes (worlds 2 to 8 on 2 to 4 nodes, every
 * topology kind, every algorithm, ring also where ranks share GPUs, chunks
 * 1 and 3, m 3 and 64, 12 and 64 by 1x128, with and without a_out); per
 * row also 16 ranks at 64 chunks.
 */
static void checker_scaled(ovl_scale_mode_t a_mode)
{
    bool block = a_mode == OVL_SCALE_BLOCK_1X128;
    static const uint64_t ms_of[2][4] = {{1, 3, 64, 100}, {4, 12, 64, 100}};
    static const uint32_t streams_of[] = {0, 2, 3};
    static const uint64_t node_ms_of[2][2] = {{3, 64}, {12, 64}};
    const uint64_t *ms = ms_of[block], *node_ms = node_ms_of[block];
    uint32_t worlds = block ? 4 : 5;
    uint32_t node_of[8];
    ovl_plan_t plans[16];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0, expect = 0;

    for (uint32_t world = 1; world <= worlds; world++)
        for (size_t mi = 0; mi < 4; mi++)
            for (uint32_t chunks = 0; chunks <= 5; chunks++)
                for (size_t si = 0; si < sizeof(streams_of) / sizeof(streams_of[0]); si++)
                    for (int wg = 0; wg <= 1; wg++)
                        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++)
                            for (int l = 0; l < (a == OVL_ALGO_RING ? 1 : L_COUNT); l++) {
                                if ((l == L_NCCL && world > 1) || (l == L_STRIDED && world > 2) ||
                                    (l == L_SHARED && world < 2))
                                    continue;
                                build_sc = cycle_sc(jobs, a_mode, &build_sc_dtype);
                                build_nb = 1 + jobs % 3; /* B i's own scales and bias */
                                build_k = block ? cycle_k(jobs) : 0;
                                build_job_as(plans, (ovl_algo_t)a, world, ms[mi], chunks,
                                             streams_of[si], wg, (layout_t)l, false);
                                assert_true(plans[0].params.sc.scaled &&
                                            ovl_dtype_is_fp8(plans[0].params.dtype));
                                if (!check_job(&ck, plans, world))
                                    fail_msg("scaled (A by %s, B by %s, bias %d, out %s, k %llu) "
                                             "%s world=%u m=%llu chunks=%u streams=%u a_out=%d "
                                             "layout=%d: %s",
                                             mode_name(a_mode), mode_name(build_sc.b_mode),
                                             build_sc.bias, ovl_dtype_name(build_sc.out_dtype),
                                             (unsigned long long)plans[0].params.k,
                                             ovl_algo_name((ovl_algo_t)a), world,
                                             (unsigned long long)ms[mi], chunks, streams_of[si], wg,
                                             l, ck.why);
                                free_job(plans, world);
                                jobs++;
                            }
    /* per world: ring 1, dense 2, copy 2, nccl 2 at world 1, strided 2 at
     * worlds 1 and 2, shared 2 from world 2 on */
    for (uint32_t world = 1; world <= worlds; world++)
        expect += 1 + 2 + 2 + (world == 1) * 2 + (world <= 2) * 2 + (world >= 2) * 2;
    assert_int_equal(jobs, 4 * 6 * 3 * 2 * expect);

    jobs = 0;
    for (uint32_t world = 2; world <= 8; world++)
        for (uint32_t nodes = 2; nodes <= 4 && nodes <= world; nodes++)
            for (int kind = 0; kind < TOPO_KINDS; kind++)
                for (uint32_t chunks = 1; chunks <= 3; chunks += 2)
                    for (size_t mi = 0; mi < 2; mi++)
                        for (int wg = 0; wg <= 1; wg++)
                            for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++) {
                                /* ring runs where ranks share GPUs too */
                                layout_t l = a == OVL_ALGO_RING && (world + (uint32_t)kind) % 2
                                                 ? L_SHARED
                                                 : L_DENSE;

                                make_topo(world, nodes, kind, node_of);
                                build_topo = node_of;
                                build_sc = cycle_sc(jobs, a_mode, &build_sc_dtype);
                                build_nb = 1 + jobs % 3;
                                build_k = block ? cycle_k(jobs) : 0;
                                build_job_as(plans, (ovl_algo_t)a, world, node_ms[mi], chunks, 2,
                                             wg, l, false);
                                build_topo = NULL;
                                if (!check_job(&ck, plans, world))
                                    fail_msg("scaled (A by %s) %s world=%u nodes=%u topology=%d "
                                             "chunks=%u m=%llu a_out=%d layout=%d: %s",
                                             mode_name(a_mode), ovl_algo_name((ovl_algo_t)a), world,
                                             nodes, kind, chunks, (unsigned long long)node_ms[mi],
                                             wg, l, ck.why);
                                free_job(plans, world);
                                jobs++;
                            }
    assert_int_equal(jobs, 18 * TOPO_KINDS * 2 * 2 * 2 * 3);

    if (a_mode != OVL_SCALE_TENSOR) {
        build_nb = 1;
        build_k = block ? 300 : 0;
        build_sc = cycle_sc(1, a_mode, &build_sc_dtype);
        build_job_as(plans, OVL_ALGO_RING, 16, 4096, OVL_PLAN_MAX_CHUNKS, 0, true, L_DENSE, false);
        if (!check_job(&ck, plans, 16))
            fail_msg("scaled ring of 16: %s", ck.why);
        free_job(plans, 16);
        build_job_as(plans, OVL_ALGO_COLLECTIVE, 16, 4096, OVL_PLAN_MAX_CHUNKS,
                     OVL_PLAN_MAX_STREAMS, false, L_COPY, false);
        if (!check_job(&ck, plans, 16))
            fail_msg("scaled collective of 16: %s", ck.why);
        free_job(plans, 16);
    }
    reset_builds(NULL);
    checker_free(&ck);
}

static void test_checker_scaled_row(void **state)
{
    (void)state;
    checker_scaled(OVL_SCALE_ROW);
}

/* (c) one scale for A: no SG anywhere, every GEMM reads SA[0]. */
static void test_checker_scaled_tensor(void **state)
{
    (void)state;
    checker_scaled(OVL_SCALE_TENSOR);
}

/* A's scales by 1x128 (B's by 1x128 and 128x128 taking turns), checked as
 * by row: SG of ceil(k/128) columns, gathered with the rows; (s6) every
 * GEMM's rows in fours. */
static void test_checker_scaled_block(void **state)
{
    (void)state;
    checker_scaled(OVL_SCALE_BLOCK_1X128);
}

/* GEMM + reduce-scatter scaled: every algorithm at worlds 1 to 5 (in one
 * node, ranks sharing GPUs or not), block rows 1, 3 and 64, chunks 0 to 5,
 * streams 0 and 2, sum and avg, A's scales by row and by tensor, the
 * dtypes, B's mode and the bias cycling (ring takes no bias with avg: the
 * refusal test_scaled_refused shows); then across nodes naive and
 * collective (2x2, 1+2+3) and push's rail scheme (2x2, 3x2, round robin,
 * 2x4). (c) no SG in any of them. */
static void test_rs_checker_scaled(void **state)
{
    static const uint64_t mbs[] = {1, 3, 64};
    static const uint32_t t22[] = {0, 0, 1, 1}, t123[] = {0, 1, 1, 2, 2, 2},
                          e32[] = {0, 0, 1, 1, 2, 2}, e3rr[] = {0, 1, 2, 0, 1, 2},
                          e24[] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const struct {
        const uint32_t *node_of;
        uint32_t world;
        bool push; /* even nodes: push's rail scheme too */
    } topos[] = {{t22, 4, true}, {t123, 6, false}, {e32, 6, true}, {e3rr, 6, true}, {e24, 8, true}};
    ovl_plan_t plans[8];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0;

    (void)state;
    for (uint32_t world = 1; world <= 5; world++)
        for (size_t mi = 0; mi < sizeof(mbs) / sizeof(mbs[0]); mi++)
            for (uint32_t chunks = 0; chunks <= 5; chunks++)
                for (uint32_t streams = 0; streams <= 2; streams += 2)
                    for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_PUSH; a++)
                        for (int avg = 0; avg <= 1; avg++)
                            for (int mode = OVL_SCALE_TENSOR; mode <= OVL_SCALE_ROW; mode++) {
                                ovl_dtype_t dt;
                                ovl_plan_scaling_t sc = cycle_sc(jobs, (ovl_scale_mode_t)mode, &dt);

                                if (a == OVL_ALGO_RING && avg && world > 1)
                                    sc.bias = false;
                                for (uint32_t r = 0; r < world; r++) {
                                    ovl_plan_params_t p =
                                        rs_params((ovl_algo_t)a, world, r, mbs[mi], chunks, streams,
                                                  true, avg);

                                    p.sc = sc;
                                    p.dtype = dt;
                                    p.shared_gpu = (chunks + world) % 2 == 1;
                                    assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                                }
                                if (!check_job(&ck, plans, world))
                                    fail_msg("scaled gemm_rs (A by %s, bias %d) %s world=%u "
                                             "mb=%llu chunks=%u streams=%u avg=%d: %s",
                                             mode_name((ovl_scale_mode_t)mode), sc.bias,
                                             ovl_algo_name((ovl_algo_t)a), world,
                                             (unsigned long long)mbs[mi], chunks, streams, avg,
                                             ck.why);
                                free_job(plans, world);
                                jobs++;
                            }
    assert_int_equal(jobs, 5 * 3 * 6 * 2 * 4 * 2 * 2);
    for (size_t t = 0; t < sizeof(topos) / sizeof(topos[0]); t++)
        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_PUSH; a++)
            for (uint32_t v = 0; v < 4; v++) {
                uint32_t w = topos[t].world;
                ovl_dtype_t dt;
                ovl_plan_scaling_t sc = cycle_sc(v + (uint32_t)a, (ovl_scale_mode_t)(v % 2), &dt);

                if (a == OVL_ALGO_RING || (a == OVL_ALGO_PUSH && !topos[t].push))
                    continue;
                for (uint32_t r = 0; r < w; r++) {
                    ovl_plan_params_t p =
                        rs_params((ovl_algo_t)a, w, r, 1 + 5 * v, v, 2, true, v >= 2);

                    p.sc = sc;
                    p.dtype = dt;
                    p.node_of = topos[t].node_of;
                    assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                }
                if (!check_job(&ck, plans, w))
                    fail_msg("scaled gemm_rs %s across nodes (job %zu, variant %u): %s",
                             ovl_algo_name((ovl_algo_t)a), t, v, ck.why);
                free_job(plans, w);
            }
    checker_free(&ck);
}

/* GEMM + reduce-scatter with A's scales by 1x128, B's by 1x128 and
 * 128x128 taking turns with the dtypes, the bias and k (cycle_sc, cycle_k;
 * both reductions see each): every algorithm at worlds 1 to 4, in one node
 * (ranks sharing GPUs or not), block rows 4, 12 (whose chunks of 2 and 5
 * are cut in fours: 8 + 4, 4 + 4 + 4) and 64, chunks 0 to 5, streams 0 and
 * 2, sum and avg; then across nodes naive and collective (2x2, 1+2+3) and
 * push's rail scheme (2x2, 3x2, round robin, 2x4), block rows 4 to 16.
 * (s1) every GEMM names SA[its row], SA m x ceil(k/128); (s6) its rows and
 * stride in fours; no SG. */
static void test_rs_checker_block(void **state)
{
    static const uint64_t mbs[] = {4, 12, 64};
    static const uint32_t t22[] = {0, 0, 1, 1}, t123[] = {0, 1, 1, 2, 2, 2},
                          e32[] = {0, 0, 1, 1, 2, 2}, e3rr[] = {0, 1, 2, 0, 1, 2},
                          e24[] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const struct {
        const uint32_t *node_of;
        uint32_t world;
        bool push; /* even nodes: push's rail scheme too */
    } topos[] = {{t22, 4, true}, {t123, 6, false}, {e32, 6, true}, {e3rr, 6, true}, {e24, 8, true}};
    ovl_plan_t plans[8];
    checker_t ck = {.arena = NULL};
    unsigned jobs = 0, node_jobs = 0;

    (void)state;
    for (uint32_t world = 1; world <= 4; world++)
        for (size_t mi = 0; mi < sizeof(mbs) / sizeof(mbs[0]); mi++)
            for (uint32_t chunks = 0; chunks <= 5; chunks++)
                for (uint32_t streams = 0; streams <= 2; streams += 2)
                    for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_PUSH; a++)
                        for (int avg = 0; avg <= 1; avg++) {
                            ovl_dtype_t dt;
                            ovl_plan_scaling_t sc = cycle_sc(jobs / 2, OVL_SCALE_BLOCK_1X128, &dt);
                            uint64_t k = cycle_k(jobs / 2);

                            if (a == OVL_ALGO_RING && avg && world > 1)
                                sc.bias = false;
                            for (uint32_t r = 0; r < world; r++) {
                                ovl_plan_params_t p = rs_params((ovl_algo_t)a, world, r, mbs[mi],
                                                                chunks, streams, true, avg);

                                p.sc = sc;
                                p.dtype = dt;
                                p.k = k;
                                p.shared_gpu = (chunks + world) % 2 == 1;
                                assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                            }
                            assert_int_equal(plans[0].chunk_rows % 4, 0);
                            assert_int_equal(plans[0].bufs[OVL_BUF_SA].cols, (k + 127) / 128);
                            if (!check_job(&ck, plans, world))
                                fail_msg("block-scaled gemm_rs (B by %s, bias %d, k %llu) %s "
                                         "world=%u mb=%llu chunks=%u streams=%u avg=%d: %s",
                                         mode_name(sc.b_mode), sc.bias, (unsigned long long)k,
                                         ovl_algo_name((ovl_algo_t)a), world,
                                         (unsigned long long)mbs[mi], chunks, streams, avg, ck.why);
                            free_job(plans, world);
                            jobs++;
                        }
    assert_int_equal(jobs, 4 * 3 * 6 * 2 * 4 * 2);
    for (size_t t = 0; t < sizeof(topos) / sizeof(topos[0]); t++)
        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_PUSH; a++)
            for (uint32_t v = 0; v < 4; v++) {
                uint32_t w = topos[t].world;
                ovl_dtype_t dt;
                ovl_plan_scaling_t sc = cycle_sc(v + (uint32_t)a, OVL_SCALE_BLOCK_1X128, &dt);

                if (a == OVL_ALGO_RING || (a == OVL_ALGO_PUSH && !topos[t].push))
                    continue;
                for (uint32_t r = 0; r < w; r++) {
                    ovl_plan_params_t p =
                        rs_params((ovl_algo_t)a, w, r, 4 * (1 + v), v, 2, true, v >= 2);

                    p.sc = sc;
                    p.dtype = dt;
                    p.k = cycle_k(4 * v);
                    p.node_of = topos[t].node_of;
                    assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                }
                if (!check_job(&ck, plans, w))
                    fail_msg("block-scaled gemm_rs %s across nodes (job %zu, variant %u): %s",
                             ovl_algo_name((ovl_algo_t)a), t, v, ck.why);
                free_job(plans, w);
                node_jobs++;
            }
    /* naive and collective on every topology, push on four */
    assert_int_equal(node_jobs, (5 * 2 + 4) * 4);
    checker_free(&ck);
}

/* Scaled by row: the corruptions below break how A's scales go with their
 * rows (ring of 2, which pulls: r1 pulls r0's rows and their scales, chunk
 * by chunk; rank 0's first GEMM of gathered rows is of G[64+32]). */

/* r0's GEMM of G[64..] reads the scales of the rows after */
static void sc_sa_wrong_row(ovl_plan_t *plans)
{
    plans[0].instr[find_instr(&plans[0], OVL_I_GEMM, OVL_BUF_G, 0)].sa.row++;
}

/* r0's GEMM of gathered rows reads its own shard's scales (SA) */
static void sc_sa_of_own_shard(ovl_plan_t *plans)
{
    plans[0].instr[find_instr(&plans[0], OVL_I_GEMM, OVL_BUF_G, 0)].sa.buf = OVL_BUF_SA;
}

/* r1 pulls r0's first chunk but not its scales */
static void sc_drop_scale_pull(ovl_plan_t *plans)
{
    remove_instr(&plans[1], find_instr(&plans[1], OVL_I_PULL, OVL_BUF_SA, 0));
}

/* r1 pulls the scales of its first chunk's rows but the last */
static void sc_scale_pull_short(ovl_plan_t *plans)
{
    plans[1].instr[find_instr(&plans[1], OVL_I_PULL, OVL_BUF_SA, 0)].rows--;
}

/* r1 pulls the scales of its second chunk after it released r0 */
static void sc_scale_pull_after_release(ovl_plan_t *plans)
{
    ovl_plan_t *p = &plans[1];
    size_t at = find_instr(p, OVL_I_PULL, OVL_BUF_SA, 1), rel = SIZE_MAX;
    ovl_instr_t in = p->instr[at];

    remove_instr(p, at);
    for (size_t i = 0; i < p->ninstr; i++)
        if (p->instr[i].kind == OVL_I_RECORD && p->instr[i].event == OVL_EV_RELEASE)
            rel = i;
    assert_true(rel != SIZE_MAX && rel >= at);
    insert_instr(p, rel + 1, &in);
}

/* collective of 2 by pulls (chunk 0 on s0, chunk 1 on s1): r1 pulls the
 * scales of chunk 0's rows of r0 on s1, beside the next chunk's pulls,
 * which nothing orders before chunk 0's GEMM on s0 */
static void sc_scale_pull_other_stream(ovl_plan_t *plans)
{
    ovl_instr_t *in = &plans[1].instr[find_instr(&plans[1], OVL_I_PULL, OVL_BUF_SA, 1)];

    assert_int_equal(in->src.rank, 0);
    assert_int_equal(in->stream, 0);
    in->stream = 1;
}

/* ring of 3 pushes: r1's first push of scales lands a row off */
static void sc_scale_push_off(ovl_plan_t *plans)
{
    plans[1].instr[find_instr(&plans[1], OVL_I_PUSH, OVL_BUF_SA, 0)].dst.row++;
}

/* naive by NCCL: every rank gathers its rows' scales into SG one block
 * off */
static void sc_allgather_off(ovl_plan_t *plans)
{
    for (uint32_t r = 0; r < 2; r++)
        plans[r].instr[find_instr(&plans[r], OVL_I_ALLGATHER, OVL_BUF_SA, 0)].dst.row += 1;
}

/* ring across nodes (2x2): every rank drops its first RAIL of scales (the
 * ranks still meet at every RAIL) */
static void sc_drop_scale_rails(ovl_plan_t *plans)
{
    for (uint32_t r = 0; r < 4; r++)
        remove_instr(&plans[r], find_instr(&plans[r], OVL_I_RAIL, OVL_BUF_SA, 0));
}

/* (d): r1's C said to be of A's fp8, SG's start off the 256-byte grid */
static void sc_c_dtype(ovl_plan_t *plans)
{
    plans[1].bufs[OVL_BUF_C].dtype = plans[1].params.dtype;
}

static void sc_sg_offset(ovl_plan_t *plans)
{
    plans[1].bufs[OVL_BUF_SG].scratch_offset += 16;
}

/* one scale for A (ring alone): r0's GEMM reads SG */
static void sc_tensor_reads_sg(ovl_plan_t *plans)
{
    plans[0].instr[find_instr(&plans[0], OVL_I_GEMM, -1, 0)].sa.buf = OVL_BUF_SG;
}

/* not scaled: a GEMM names scales */
static void unscaled_names_sa(ovl_plan_t *plans)
{
    plans[0].instr[find_instr(&plans[0], OVL_I_GEMM, -1, 0)].sa.row = 1;
}

/* Expects the corruption caught, by check_job as it is (naming
 * `expect`) and with the scale transfers' adjacency to their rows'
 * transfers unproved (naming `expect_off`: what the simulation alone
 * catches; NULL: not tried). */
static void expect_scaled_violation(ovl_algo_t algo, uint32_t world, uint32_t chunks,
                                    uint32_t streams, layout_t layout,
                                    void (*corrupt)(ovl_plan_t *plans), const char *expect,
                                    const char *expect_off)
{
    expect_violation_as(algo, world, chunks, streams, layout, corrupt, expect);
    if (!expect_off)
        return;
    g_mirror_off = true;
    expect_violation_as(algo, world, chunks, streams, layout, corrupt, expect_off);
    g_mirror_off = false;
}

static void test_scaled_checker_catches(void **state)
{
    static const uint32_t two_by_two[] = {0, 0, 1, 1};

    (void)state;
    build_sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_ROW, OVL_SCALE_ROW, true);
    /* (a) what a GEMM names */
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, sc_sa_wrong_row,
                            "GEMM of G[64] names the scales r0:SG[65], not r0:SG[64]", NULL);
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, sc_sa_of_own_shard,
                            "GEMM of G[64] names the scales r0:SA[64], not r0:SG[64]", NULL);
    /* (b) the scale transfers: each right after its rows', the same
     * transfer, and the gathered scales read after their write, their
     * owner's SA within its READY and DONE */
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, sc_drop_scale_pull,
                            "PULL of G rows 0+32: the next instruction is not the same PULL of "
                            "their scales (none follows)",
                            "GEMM reads r1's SG block 0 row 0, never written");
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, sc_scale_pull_short,
                            "not the same PULL of their scales (other rows)",
                            "GEMM reads r1's SG block 0 row 31, never written");
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, sc_scale_pull_after_release,
                            "PULL of G rows 32+32: the next instruction is not the same PULL of "
                            "their scales (none follows)",
                            "r0 may complete while its SA is read");
    expect_scaled_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, L_COPY, sc_scale_pull_other_stream,
                            "PULL of G rows 0+16: the next instruction is not the same PULL of "
                            "their scales (another stream)",
                            "GEMM reads r1's SG block 0 rows 0+ before r1 #8 writes them");
    expect_scaled_violation(OVL_ALGO_RING, 3, 2, 0, L_DENSE, sc_scale_push_off,
                            "the same PUSH of their scales (other rows)", "PUSH geometry");
    expect_scaled_violation(OVL_ALGO_NAIVE, 2, 0, 0, L_NCCL, sc_allgather_off,
                            "the same ALLGATHER of their scales (other rows)",
                            "ALLGATHER geometry");
    build_topo = two_by_two;
    expect_scaled_violation(OVL_ALGO_RING, 4, 2, 0, L_DENSE, sc_drop_scale_rails,
                            "RAIL of G rows 0+32: the next instruction is not the same RAIL of "
                            "their scales (none follows)",
                            "SG block 2 row 0, never written");
    build_topo = NULL;
    /* (d) dtypes and the scratch */
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, sc_c_dtype,
                            "r1: buffer C in fp8e4m3, not bf16", NULL);
    expect_scaled_violation(OVL_ALGO_COLLECTIVE, 2, 4, 2, L_DENSE, sc_sg_offset,
                            "r1: buffer SG's scratch_offset 65552, want 65536", NULL);
    /* (c) one scale for A: SA[0], never SG (ring alone reads A only) */
    build_sc.a_mode = OVL_SCALE_TENSOR;
    expect_scaled_violation(OVL_ALGO_RING, 1, 2, 0, L_DENSE, sc_tensor_reads_sg,
                            "GEMM of A[0] names the scales r0:SG[0], not r0:SA[0]", NULL);
    build_sc.scaled = false;
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, unscaled_names_sa,
                            "GEMM of an op not scaled names scales", NULL);
    reset_builds(NULL);
}

/* GEMM + reduce-scatter scaled (push of 3, A's scales by row): a GEMM
 * names another row's scales, a transfer of scales appears (c: this kind
 * gathers none), SG said used, P said of the op's fp8. */
static void test_rs_scaled_checker_catches(void **state)
{
    enum { W = 3 };
    ovl_plan_t plans[W];
    checker_t ck = {.arena = NULL};
    static const char *const want[] = {"GEMM of A[16] names the scales r1:SA[17], not r1:SA[16]",
                                       "PUSH of scales in a plan that gathers none (gemm_rs)",
                                       "buffer SG: used 1", "r1: buffer P in fp8e4m3, not fp16"};

    (void)state;
    for (int how = 0; how < (int)(sizeof(want) / sizeof(want[0])); how++) {
        for (uint32_t r = 0; r < W; r++) {
            ovl_plan_params_t p = rs_params(OVL_ALGO_PUSH, W, r, 8, 1, 0, true, false);

            p.dtype = OVL_DTYPE_FP8_E4M3;
            p.sc =
                scaling(OVL_DTYPE_FP8_E5M2, OVL_DTYPE_FP16, OVL_SCALE_ROW, OVL_SCALE_TENSOR, true);
            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        if (how == 0 && !check_job(&ck, plans, W))
            fail_msg("scaled push of %d: %s", W, ck.why);
        ovl_plan_t *p1 = &plans[1];
        size_t push = find_instr(p1, OVL_I_PUSH, -1, 0);
        ovl_instr_t sc = p1->instr[push];
        switch (how) {
        case 0: /* rank 1's first GEMM (of block 2, its step 1) reads the next row's scales */
            p1->instr[find_instr(p1, OVL_I_GEMM, -1, 0)].sa.row++;
            break;
        case 1: /* its first push followed by a push of scales, as all-gather + GEMM's */
            sc.src.buf = OVL_BUF_SA;
            sc.dst.buf = OVL_BUF_SG;
            sc.cols = 1;
            insert_instr(p1, push + 1, &sc);
            break;
        case 2:
            p1->bufs[OVL_BUF_SG].used = true;
            break;
        case 3:
            p1->bufs[OVL_BUF_P].dtype = p1->params.dtype;
            break;
        }
        if (check_job(&ck, plans, W))
            fail_msg("case %d passed the checker", how);
        if (!strstr(ck.why, want[how]))
            fail_msg("case %d: '%s' does not say '%s'", how, ck.why, want[how]);
        free_job(plans, W);
    }
    checker_free(&ck);
}

/* A's scales by 1x128 (k 300: three scales a row): the corruptions below
 * are of a ring of 2 (r1 pulls r0's rows and their scales, 32 rows a
 * chunk; G is 128 x 300 fp8, 38400 bytes, and SG 128 x 3 floats right
 * after it). */

/* r1's first pull of scales moves one column, as by row */
static void blk_scale_pull_one_col(ovl_plan_t *plans)
{
    plans[1].instr[find_instr(&plans[1], OVL_I_PULL, OVL_BUF_SA, 0)].cols = 1;
}

/* r1's SG said one column wide, as by row */
static void blk_sg_one_col(ovl_plan_t *plans)
{
    plans[1].bufs[OVL_BUF_SG].cols = 1;
}

/* r1's scratch sized for SG of one float a row */
static void blk_sg_bytes_by_row(ovl_plan_t *plans)
{
    plans[1].scratch_bytes = 38400 + 128 * sizeof(float);
}

/* Splits GEMM #at of plan into two of the same rows, the second of its
 * last `tail` rows (their A, C and scales rows: a plan that is right in
 * all but the rows' count). */
static void split_gemm(ovl_plan_t *plan, size_t at, uint64_t tail)
{
    ovl_instr_t second = plan->instr[at];
    ovl_instr_t *first = &plan->instr[at];

    assert_int_equal(first->kind, OVL_I_GEMM);
    assert_true(first->rows > tail);
    first->rows -= tail;
    second.rows = tail;
    second.src.row += first->rows;
    second.dst.row += first->rows;
    if (scales_per_row(&plan->params))
        second.sa.row += first->rows;
    if (second.accumulate)
        second.acc.row += first->rows;
    insert_instr(plan, at + 1, &second);
}

/* r0's first GEMM (A[0+32]) as two, of 30 rows and 2 */
static void blk_split_gemm(ovl_plan_t *plans)
{
    split_gemm(&plans[0], find_instr(&plans[0], OVL_I_GEMM, -1, 0), 2);
}

/* The checker holds plans of A's 1x128 scales to their own columns and to
 * GEMMs in fours: a scale transfer of one column (s2, also with the
 * adjacency of the transfers unproved), SG of one column (s5, named first
 * by the GEMM that reads it: s1), the scratch of SG of a float a row (s5);
 * a GEMM cut into 30 + 2 rows (s6), which the same plan by row takes (no
 * other rule catches it), in either kind (gemm_rs: collective of 2). */
static void test_block_checker_catches(void **state)
{
    ovl_plan_t plans[2];
    checker_t ck = {.arena = NULL};

    (void)state;
    build_sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_BLOCK_1X128,
                       OVL_SCALE_BLOCK_1X128, true);
    build_k = 300;
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, blk_scale_pull_one_col,
                            "PULL of G rows 0+32: the next instruction is not the same PULL of "
                            "their scales (other columns)",
                            "PULL of scales from SA into SG, 1 columns");
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, blk_sg_one_col,
                            "GEMM's scales SG[0], 1 blocks of 32: not in rows of 3, one for each "
                            "row of G",
                            NULL);
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, blk_sg_bytes_by_row,
                            "r1: scratch 38912 (before building 39936), G and SG need 39936", NULL);
    expect_scaled_violation(OVL_ALGO_RING, 2, 2, 0, L_DENSE, blk_split_gemm,
                            "r0 #6: GEMM of 30 rows (1 blocks, stride 0) with A's 1x128 scales: "
                            "not in fours",
                            NULL);
    /* the same cut by row: a right plan */
    build_sc.a_mode = OVL_SCALE_ROW;
    build_sc.b_mode = OVL_SCALE_ROW;
    build_job_as(plans, OVL_ALGO_RING, 2, 64, 2, 0, false, L_DENSE, false);
    blk_split_gemm(plans);
    if (!check_job(&ck, plans, 2))
        fail_msg("a GEMM of 30 rows by row: %s", ck.why);
    free_job(plans, 2);
    /* gemm_rs: collective of 2 in chunks of 8 (a GEMM of 8 rows of each
     * block, 16 apart), its first cut into 6 + 2: refused by 1x128, taken
     * by row */
    static const ovl_scale_mode_t modes[] = {OVL_SCALE_ROW, OVL_SCALE_BLOCK_1X128};
    for (size_t mi = 0; mi < 2; mi++) {
        bool block = modes[mi] == OVL_SCALE_BLOCK_1X128;

        for (uint32_t r = 0; r < 2; r++) {
            ovl_plan_params_t p = rs_params(OVL_ALGO_COLLECTIVE, 2, r, 16, 2, 2, true, false);

            p.dtype = OVL_DTYPE_FP8_E4M3;
            p.k = 300;
            p.sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP32, modes[mi],
                           block ? OVL_SCALE_BLOCK_128X128 : OVL_SCALE_ROW, false);
            assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        }
        if (!check_job(&ck, plans, 2))
            fail_msg("gemm_rs collective by %s: %s", mode_name(modes[mi]), ck.why);
        split_gemm(&plans[1], find_instr(&plans[1], OVL_I_GEMM, -1, 0), 2);
        if (check_job(&ck, plans, 2) == block)
            fail_msg("gemm_rs collective by %s, a GEMM of 6 rows: %s", mode_name(modes[mi]),
                     block ? "taken" : ck.why);
        if (block && !strstr(ck.why, "GEMM of 6 rows (2 blocks, stride 16) with A's 1x128 "
                                     "scales: not in fours"))
            fail_msg("gemm_rs: '%s' does not name the GEMM of 6 rows", ck.why);
        free_job(plans, 2);
    }
    checker_free(&ck);
}

/* What the planner refuses of scaled ops, of either kind: a scaled op of
 * a dtype not fp8, fp8 unscaled, A and B both e5m2 (or B not fp8), C in
 * fp8 (or no dtype), B not transposed, several Bs, an unknown scale mode;
 * gemm_rs's ring with a bias and avg (whose average would hold every
 * rank's bias summed), which auto then avoids for push. */
static void test_scaled_refused(void **state)
{
    ovl_plan_params_t good[2], p;
    ovl_plan_t plan;
    uint64_t bytes;

    (void)state;
    good[0] = params_of(OVL_ALGO_RING, 2, 0, 8, 0, 0, false);
    good[1] = rs_params(OVL_ALGO_PUSH, 2, 0, 8, 0, 0, true, false);
    for (int kind = 0; kind < 2; kind++) {
        bool rs = kind == 1;

        good[kind].dtype = OVL_DTYPE_FP8_E4M3;
        good[kind].transb = true;
        good[kind].sc =
            scaling(OVL_DTYPE_FP8_E5M2, OVL_DTYPE_BF16, OVL_SCALE_ROW, OVL_SCALE_ROW, true);
        assert_int_equal(ovl_plan_build(&good[kind], &plan), OVL_OK);
        ovl_plan_free(&plan);
        assert_null(ovl_plan_refusal(&good[kind]));
        /* e5m2 A with e4m3 B is fine too */
        p = good[kind], p.dtype = OVL_DTYPE_FP8_E5M2, p.sc.b_dtype = OVL_DTYPE_FP8_E4M3;
        assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
        ovl_plan_free(&plan);

        /* the words gemm_rs's refusal has for each case below */
        static const char *const why[] = {"fp8",
                                          "needs scaling",
                                          "fp8e5m2 times fp8e5m2",
                                          "fp8",
                                          "writes",
                                          "writes",
                                          "transposed",
                                          "one B",
                                          "unknown scale mode",
                                          "unknown scale mode"};
        for (size_t c = 0; c < sizeof(why) / sizeof(why[0]); c++) {
            p = good[kind];
            switch (c) {
            case 0: /* scaled, of bf16 */
                p.dtype = OVL_DTYPE_BF16;
                break;
            case 1: /* fp8, not scaled */
                p.sc = (ovl_plan_scaling_t){.scaled = false};
                break;
            case 2: /* both e5m2 */
                p.dtype = p.sc.b_dtype = OVL_DTYPE_FP8_E5M2;
                break;
            case 3: /* B not fp8 */
                p.sc.b_dtype = OVL_DTYPE_BF16;
                break;
            case 4: /* C in fp8 */
                p.sc.out_dtype = OVL_DTYPE_FP8_E4M3;
                break;
            case 5: /* C of no dtype */
                p.sc.out_dtype = (ovl_dtype_t)OVL_DTYPE_COUNT;
                break;
            case 6:
                p.transb = false;
                break;
            case 7: /* two Bs: all-gather + GEMM's scaled ops take them, each
                     * B with its own scales and bias; gemm_rs has one B */
                set_bs(&p, 2);
                if (!rs) {
                    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
                    ovl_plan_free(&plan);
                    continue;
                }
                break;
            case 8:
                p.sc.a_mode = (ovl_scale_mode_t)OVL_SCALE_MODE_COUNT;
                break;
            case 9:
                p.sc.b_mode = (ovl_scale_mode_t)OVL_SCALE_MODE_COUNT;
                break;
            }
            expect_invalid(&p);
            assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_ERR_INVALID);
            if (rs) {
                const char *words = ovl_plan_refusal(&p);

                if (!words || !strstr(words, why[c]))
                    fail_msg("gemm_rs case %zu: refusal '%s' does not say '%s'", c,
                             words ? words : "(none)", why[c]);
            }
        }
    }
    /* ring (gemm_rs) with a bias and avg: refused, with words; alone, or
     * with sum, or without a bias, it plans */
    p = good[1];
    p.algo = OVL_ALGO_RING;
    p.world = 4, p.m = 32;
    p.reduce_op = OVL_REDUCE_AVG;
    expect_invalid(&p);
    assert_non_null(ovl_plan_refusal(&p));
    assert_non_null(strstr(ovl_plan_refusal(&p), "bias"));
    p.sc.bias = false;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    ovl_plan_free(&plan);
    p.sc.bias = true;
    p.reduce_op = OVL_REDUCE_SUM;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    ovl_plan_free(&plan);
    p.reduce_op = OVL_REDUCE_AVG;
    p.world = 1, p.m = 8;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    ovl_plan_free(&plan);
    /* auto: ring at world 4 in bf16 out, but push with a bias and avg */
    p.world = 4, p.m = 4 * 1024;
    p.algo = OVL_ALGO_AUTO;
    p.sc.bias = false;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_RING);
    p.sc.bias = true;
    assert_int_equal(ovl_plan_choose(&p), OVL_ALGO_PUSH);
    assert_non_null(strstr(ovl_plan_choose_why(&p), "bias"));
    assert_false(ovl_plan_takes_default(&p, OVL_ALGO_RING));
    p.algo = OVL_ALGO_PUSH;
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    ovl_plan_free(&plan);
}

/* Chunks by A's 1x128 scales are cut in fours (the planner's row granule),
 * where by row the same chunks are not: all-gather + GEMM's collective and
 * ring of 2 (m in the table: m 12 in 2 chunks is 8 + 4, by row 6 + 6; in
 * 5, 4 + 4 + 4, by row 3 x 4; ...), gemm_rs's collective, push and ring
 * (a block's rows, mb, cut alike); every plan checked whole. */
static void test_block_chunks(void **state)
{
    static const struct {
        uint64_t m;
        uint32_t chunks;
        uint64_t rows_block;
        uint32_t chunks_block;
        uint64_t rows_row;
        uint32_t chunks_row;
    } cut[] = {{12, 2, 8, 2, 6, 2},   {12, 5, 4, 3, 3, 4}, {100, 3, 36, 3, 34, 3},
               {64, 5, 16, 4, 13, 5}, {4, 3, 4, 1, 2, 2},  {20, 3, 8, 3, 7, 3}};
    static const ovl_algo_t ag_algos[] = {OVL_ALGO_COLLECTIVE, OVL_ALGO_RING},
                            rs_algos[] = {OVL_ALGO_COLLECTIVE, OVL_ALGO_PUSH, OVL_ALGO_RING};
    ovl_plan_t plans[2];
    checker_t ck = {.arena = NULL};

    (void)state;
    for (size_t c = 0; c < sizeof(cut) / sizeof(cut[0]); c++)
        for (int block = 0; block <= 1; block++) {
            ovl_scale_mode_t am = block ? OVL_SCALE_BLOCK_1X128 : OVL_SCALE_ROW;
            ovl_scale_mode_t bm = block ? OVL_SCALE_BLOCK_128X128 : OVL_SCALE_ROW;
            uint64_t want_rows = block ? cut[c].rows_block : cut[c].rows_row;
            uint32_t want_chunks = block ? cut[c].chunks_block : cut[c].chunks_row;

            for (int kind = 0; kind < 2; kind++) {
                size_t na = kind ? sizeof(rs_algos) / sizeof(rs_algos[0]) : 2;

                for (size_t a = 0; a < na; a++) {
                    ovl_algo_t algo = kind ? rs_algos[a] : ag_algos[a];

                    for (uint32_t r = 0; r < 2; r++) {
                        ovl_plan_params_t p =
                            kind ? rs_params(algo, 2, r, cut[c].m, cut[c].chunks, 2, true, false)
                                 : params_of(algo, 2, r, cut[c].m, cut[c].chunks, 2, false);

                        p.dtype = OVL_DTYPE_FP8_E4M3;
                        p.transb = true;
                        p.k = 300;
                        p.sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, am, bm, true);
                        assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
                    }
                    if (plans[0].chunk_rows != want_rows || plans[0].chunks != want_chunks)
                        fail_msg("%s %s by %s, %s %llu in %u chunks: %u of %llu rows, not %u of "
                                 "%llu",
                                 kind ? "gemm_rs" : "ag_gemm", ovl_algo_name(algo), mode_name(am),
                                 kind ? "mb" : "m", (unsigned long long)cut[c].m, cut[c].chunks,
                                 plans[0].chunks, (unsigned long long)plans[0].chunk_rows,
                                 want_chunks, (unsigned long long)want_rows);
                    if (!check_job(&ck, plans, 2))
                        fail_msg("%s %s by %s, %s %llu in %u chunks: %s",
                                 kind ? "gemm_rs" : "ag_gemm", ovl_algo_name(algo), mode_name(am),
                                 kind ? "mb" : "m", (unsigned long long)cut[c].m, cut[c].chunks,
                                 ck.why);
                    free_job(plans, 2);
                }
            }
        }
    checker_free(&ck);
}

/* What the planner refuses of block scales, of either kind, with words
 * (ovl_plan_refusal: common/scaling.c's): A by 128x128 (whatever B's);
 * block scales on one side only, either way; A 1x128 where a GEMM's rows
 * are not in fours (all-gather + GEMM: m 6, though by row it plans;
 * gemm_rs: a block's rows, m / world, 6 of m 12 at world 2, and of m 24
 * at world 4, m in fours); B 1x128 with n not in fours (all-gather +
 * GEMM: a second B's too). B 128x128 takes n not in fours (6, and a
 * second B of 6), and A 1x128 any k (1): planned and checked. */
static void test_block_refused(void **state)
{
    ovl_plan_params_t good[2], p;
    ovl_plan_t plan, plans[2];
    checker_t ck = {.arena = NULL};
    uint64_t bytes;
    static const char *const why[] = {
        "A's scales by 128x128 tile",
        "A's scales by 128x128 tile",
        "block scales (1x128, 128x128) go with block scales on the other operand",
        "block scales (1x128, 128x128) go with block scales on the other operand",
        "block scales (1x128, 128x128) go with block scales on the other operand",
        "block scales (1x128, 128x128) go with block scales on the other operand",
        "A's 1x128 scales need its rows in multiples of 4",
        "A's 1x128 scales need its rows in multiples of 4",
        "B's 1x128 scales need n in multiples of 4",
        "B's 1x128 scales need n in multiples of 4",
    };

    (void)state;
    good[0] = params_of(OVL_ALGO_RING, 2, 0, 8, 0, 0, false);
    good[1] = rs_params(OVL_ALGO_PUSH, 2, 0, 8, 0, 0, true, false);
    for (int kind = 0; kind < 2; kind++) {
        bool rs = kind == 1;

        good[kind].dtype = OVL_DTYPE_FP8_E4M3;
        good[kind].transb = true;
        good[kind].k = 300;
        good[kind].sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_BLOCK_1X128,
                                OVL_SCALE_BLOCK_1X128, true);
        assert_int_equal(ovl_plan_build(&good[kind], &plan), OVL_OK);
        ovl_plan_free(&plan);
        assert_null(ovl_plan_refusal(&good[kind]));
        assert_int_equal(ovl_plan_scratch_bytes(&good[kind], &bytes), OVL_OK);
        /* B's block mode is the plan cache's to tell apart too */
        p = good[kind];
        p.sc.b_mode = OVL_SCALE_BLOCK_128X128;
        assert_false(ovl_plan_params_equal(&good[kind], &p));

        for (size_t c = 0; c < sizeof(why) / sizeof(why[0]); c++) {
            p = good[kind];
            switch (c) {
            case 0:
                p.sc.a_mode = p.sc.b_mode = OVL_SCALE_BLOCK_128X128;
                break;
            case 1:
                p.sc.a_mode = OVL_SCALE_BLOCK_128X128;
                break;
            case 2:
                p.sc.b_mode = OVL_SCALE_ROW;
                break;
            case 3:
                p.sc.b_mode = OVL_SCALE_TENSOR;
                break;
            case 4:
                p.sc.a_mode = OVL_SCALE_ROW;
                p.sc.b_mode = OVL_SCALE_BLOCK_128X128;
                break;
            case 5:
                p.sc.a_mode = OVL_SCALE_TENSOR;
                break;
            case 6: /* a GEMM's rows 6: all-gather + GEMM's m, gemm_rs's m / world */
                p.m = rs ? 12 : 6;
                p.sc.b_mode = OVL_SCALE_BLOCK_128X128;
                break;
            case 7: /* gemm_rs: m in fours, m / world not; all-gather + GEMM: m 10 */
                if (rs)
                    p.world = 4, p.m = 24;
                else
                    p.m = 10;
                break;
            case 8:
                p.n = 6;
                break;
            case 9: /* all-gather + GEMM: a second B's n; gemm_rs: n 10 */
                if (rs) {
                    p.n = 10;
                } else {
                    set_bs(&p, 2);
                    p.n_more[0] = 6;
                }
                break;
            }
            expect_invalid(&p);
            assert_int_equal(ovl_plan_scratch_bytes(&p, &bytes), OVL_ERR_INVALID);
            const char *words = ovl_plan_refusal(&p);
            if (!words || !strstr(words, why[c]))
                fail_msg("%s case %zu: refusal '%s' does not say '%s'", rs ? "gemm_rs" : "ag_gemm",
                         c, words ? words : "(none)", why[c]);
            /* rows not in fours plan by row */
            if (c == 6 || c == 7) {
                p.sc.a_mode = p.sc.b_mode = OVL_SCALE_ROW;
                assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
                ovl_plan_free(&plan);
            }
        }

        /* taken: B 128x128 with n 6 (and a second B of 6), A 1x128 with k 1;
         * each job checked */
        for (int c = 0; c < 3; c++) {
            if (rs && c == 1)
                continue;
            for (uint32_t r = 0; r < 2; r++) {
                p = good[kind];
                p.rank = r;
                p.sc.b_mode = OVL_SCALE_BLOCK_128X128;
                if (c == 0) {
                    p.n = 6;
                } else if (c == 1) {
                    set_bs(&p, 2);
                    p.n_more[0] = 6;
                } else {
                    p.k = 1;
                }
                assert_null(ovl_plan_refusal(&p));
                assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
            }
            if (!check_job(&ck, plans, 2))
                fail_msg("%s case %d taken: %s", rs ? "gemm_rs" : "ag_gemm", c, ck.why);
            /* SB i: ceil(n_i / 128) x ceil(k / 128) */
            assert_int_equal(plans[0].bufs[OVL_BUF_SB].rows, (plans[0].params.n + 127) / 128);
            assert_int_equal(plans[0].bufs[OVL_BUF_SB].cols, c == 2 ? 1 : 3);
            if (c == 1)
                assert_int_equal(plans[0].bufs[ovl_buf_sb(1)].rows, 1);
            free_job(plans, 2);
        }
    }
    checker_free(&ck);
}

/* Ops that differ only in their scaling plan different programs (SG's
 * transfers or none, the bias, C's and P's dtype, cuBLASLt's fast
 * accumulation): ovl_plan_params_equal, by which ovld's plan cache finds
 * a job's plans, must tell them apart, of either kind. */
static void test_scaled_params_equal(void **state)
{
    static const char *const field[] = {"b_dtype",    "out_dtype", "a_mode", "b_mode",
                                        "fast_accum", "bias",      "scaled"};
    ovl_plan_params_t base[2], a, b;

    (void)state;
    base[0] = params_of(OVL_ALGO_RING, 2, 0, 8, 0, 0, false);
    base[1] = rs_params(OVL_ALGO_PUSH, 2, 0, 8, 0, 0, true, false);
    for (int kind = 0; kind < 2; kind++) {
        a = base[kind];
        a.dtype = OVL_DTYPE_FP8_E4M3;
        a.transb = true;
        a.sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_ROW, OVL_SCALE_ROW, true);
        b = a;
        assert_true(ovl_plan_params_equal(&a, &b));
        for (size_t c = 0; c < sizeof(field) / sizeof(field[0]); c++) {
            b = a;
            switch (c) {
            case 0:
                b.sc.b_dtype = OVL_DTYPE_FP8_E5M2;
                break;
            case 1:
                b.sc.out_dtype = OVL_DTYPE_FP16;
                break;
            case 2:
                b.sc.a_mode = OVL_SCALE_TENSOR;
                break;
            case 3:
                b.sc.b_mode = OVL_SCALE_TENSOR;
                break;
            case 4:
                b.sc.fast_accum = !b.sc.fast_accum;
                break;
            case 5:
                b.sc.bias = false;
                break;
            case 6:
                b.sc = (ovl_plan_scaling_t){.scaled = false};
                break;
            }
            if (ovl_plan_params_equal(&a, &b) || ovl_plan_params_equal(&b, &a))
                fail_msg("%s: params that differ in sc.%s compare equal (plan.c, "
                         "ovl_plan_params_equal, compares no field of sc)",
                         kind ? "gemm_rs" : "ag_gemm", field[c]);
        }
    }
}

/* Goldens of scaled ops: all-gather + GEMM's ring of 2 (rank 0, 2
 * chunks), A's and B's scales by row and a bias (ovlctl plan --world 2
 * --rank 0 -m 1024 -n 256 -k 512 --dtype fp8e4m3 --algo ring --chunks 2
 * --bias prints the same); GEMM + reduce-scatter's push of 2 (rank 0),
 * one scale for A, B's by row, fast accumulation, no bias (ovlctl plan
 * --op rs --world 2 --rank 0 -m 512 -n 256 -k 512 --dtype fp8e4m3 --algo
 * push --chunks 4 --a-scale tensor --fast-accum); and all-gather + GEMM's
 * ring of 2 by block scales, A's 1x128 and B's 128x128, k 300 (a partial
 * last block: 3 scales a row, SG 2048 x 3 after G), 3 chunks of 344 rows
 * (1024 / 3 rounded up to fours; by row 342) and a bias (ovlctl plan
 * --world 2 --rank 0 -m 1024 -n 256 -k 300 --dtype fp8e4m3 --algo ring
 * --chunks 3 --a-scale 1x128 --b-scale 128x128 --bias prints the same). */
static void test_golden_scaled(void **state)
{
    (void)state;
    build_sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_ROW, OVL_SCALE_ROW, true);
    build_sc.fast_accum = false;
    check_golden_shape(OVL_ALGO_RING, 2, 0, 2, "plan_ag_ring_fp8.txt");
    build_sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_BLOCK_1X128,
                       OVL_SCALE_BLOCK_128X128, true);
    build_sc.fast_accum = false;
    build_k = 300;
    check_golden_shape(OVL_ALGO_RING, 2, 0, 3, "plan_ag_ring_fp8_block.txt");
    build_k = 0;
    build_sc = scaling(OVL_DTYPE_FP8_E4M3, OVL_DTYPE_BF16, OVL_SCALE_TENSOR, OVL_SCALE_ROW, false);
    build_sc.fast_accum = true;
    check_golden_rs_as(OVL_ALGO_PUSH, 2, 0, "plan_rs_push_fp8.txt");
    reset_builds(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_naive),
        cmocka_unit_test(test_golden_collective),
        cmocka_unit_test(test_golden_ring),
        cmocka_unit_test(test_golden_copy),
        cmocka_unit_test(test_checker_all_shapes),
        cmocka_unit_test(test_scratch),
        cmocka_unit_test(test_checker_large),
        cmocka_unit_test(test_checker_catches),
        cmocka_unit_test(test_checker_multi_b),
        cmocka_unit_test(test_checker_catches_multi_b),
        cmocka_unit_test(test_format_multi_b),
        cmocka_unit_test(test_invalid_params),
        cmocka_unit_test(test_format_truncation),
        cmocka_unit_test(test_uneven_chunks),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_replay_rule),
        cmocka_unit_test(test_choose),
        cmocka_unit_test(test_free_and_names),
        cmocka_unit_test(test_checker_nodes),
        cmocka_unit_test(test_checker_catches_nodes),
        cmocka_unit_test(test_topology_params),
        cmocka_unit_test(test_rail_groups),
        cmocka_unit_test(test_choose_shared_across_nodes),
        cmocka_unit_test(test_golden_nodes),
        cmocka_unit_test(test_rs_checker_all_shapes),
        cmocka_unit_test(test_rs_checker_catches),
        cmocka_unit_test(test_rs_refused),
        cmocka_unit_test(test_push_checker_catches),
        cmocka_unit_test(test_rs_checker_nodes),
        cmocka_unit_test(test_railpush_checker_catches),
        cmocka_unit_test(test_ringrs_checker_catches),
        cmocka_unit_test(test_rs_dataflow_catches),
        cmocka_unit_test(test_golden_rs),
        cmocka_unit_test_teardown(test_checker_scaled_row, reset_builds),
        cmocka_unit_test_teardown(test_checker_scaled_tensor, reset_builds),
        cmocka_unit_test_teardown(test_checker_scaled_block, reset_builds),
        cmocka_unit_test_teardown(test_rs_checker_scaled, reset_builds),
        cmocka_unit_test_teardown(test_rs_checker_block, reset_builds),
        cmocka_unit_test_teardown(test_scaled_checker_catches, reset_builds),
        cmocka_unit_test_teardown(test_rs_scaled_checker_catches, reset_builds),
        cmocka_unit_test_teardown(test_block_checker_catches, reset_builds),
        cmocka_unit_test_teardown(test_scaled_refused, reset_builds),
        cmocka_unit_test_teardown(test_block_chunks, reset_builds),
        cmocka_unit_test_teardown(test_block_refused, reset_builds),
        cmocka_unit_test(test_scaled_params_equal),
        cmocka_unit_test_teardown(test_golden_scaled, reset_builds),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

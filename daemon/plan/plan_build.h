/*
 * plan_build.h: what the planner's emitters share and nothing outside
 * daemon/plan/ sees: the builder of a program and its helpers
 * (plan_build.c), and the defaults of naive's and collective's chunks and
 * streams. The order: plan.c > plan_rs.c (plan_rs.h) > plan_build.c; none
 * calls back up.
 */
#ifndef OVL_PLAN_BUILD_H
#define OVL_PLAN_BUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* Chunks and streams when the caller asks for 0 (docs/plans.md). */
#define NAIVE_STREAMS      1
#define COLLECTIVE_CHUNKS  4
#define COLLECTIVE_STREAMS 2

/*
 * Where the job's ranks are, derived from params.node_of (one node where it
 * is NULL). A rank's local index is its place among its node's ranks in
 * rank order; by_node lists the ranks node by node, each node's in rank
 * order, so that node N's local index i is by_node[first[N] + i].
 */
typedef struct topo {
    uint32_t nnodes;
    const uint32_t *node_of; /* NULL: one node */
    uint32_t *size;          /* per node: its ranks */
    uint32_t *first;         /* per node: where its ranks start in by_node */
    uint32_t *by_node;       /* world entries */
    uint32_t *local;         /* per rank: its local index */
    uint32_t *scratch;       /* world entries, for a peer's receive list */
} topo_t;

typedef struct builder {
    const ovl_plan_t *plan; /* params and shape: where rows live */
    const topo_t *topo;
    ovl_instr_t *instr;
    size_t n;
    size_t cap;
    uint32_t max_stream; /* highest stream used */
    uint32_t max_event;  /* highest event used */
    uint32_t next_event; /* next fresh event */
    uint32_t *peers;     /* the plan's RAIL peer lists */
    uint32_t npeers, cap_peers;
} builder_t;

/* node_of[q], NULL being node 0 for every rank; the node of rank q. */
static inline uint32_t pb_node_at(const uint32_t *node_of, uint32_t q)
{
    return node_of ? node_of[q] : 0;
}
static inline uint32_t pb_node_of(const topo_t *t, uint32_t q)
{
    return pb_node_at(t->node_of, q);
}

/* The topology of valid params (pb_count_nodes > 0), and its end; local
 * index i of node n; the ranks a RAIL names, appended to the plan's list
 * (plan_build.c, as everything below but the emitters' entry points). */
ovl_status_t pb_topo_make(const ovl_plan_params_t *p, topo_t *t);
void pb_topo_free(topo_t *t);
uint32_t pb_rank_at(const topo_t *t, uint32_t n, uint32_t i);
ovl_status_t pb_add_peers(builder_t *b, const uint32_t *ranks, uint32_t n);

/* The builder. */
ovl_status_t pb_emit(builder_t *b, const ovl_instr_t *in);
ovl_status_t pb_emit_simple(builder_t *b, ovl_instr_kind_t kind, uint32_t stream);
ovl_status_t pb_emit_record(builder_t *b, uint32_t stream, uint32_t event);
ovl_status_t pb_emit_wait(builder_t *b, uint32_t stream, uint32_t peer, uint32_t event);
/* A short sleep kernel on stream (ring's and push's head-of-stream sleep). */
ovl_status_t pb_emit_sleep(builder_t *b, uint32_t stream, uint32_t ns);
/* A row of one of this rank's buffers. */
ovl_ref_t pb_own(const builder_t *b, ovl_buf_t buf, uint64_t row);
/* WAIT_READY on stream 0, then RECORD READY. */
ovl_status_t pb_emit_prologue(builder_t *b);
/* Streams [first, last] joined into stream 0, each through a fresh event. */
ovl_status_t pb_emit_joins(builder_t *b, uint32_t rank, uint32_t first, uint32_t last);
/* The plan's own copy of params' topology of nnodes nodes (more than one;
 * one node keeps node_of NULL however it was given, so that its plans are
 * what they were): plan->nnodes and plan->params.node_of, which
 * ovl_plan_free frees. OVL_ERR_NOMEM leaves node_of NULL. */
ovl_status_t pb_keep_topology(ovl_plan_t *plan, const ovl_plan_params_t *params, uint32_t nnodes);
/* Hands the builder's program to the plan (instructions, events, peers)
 * and marks the buffers it names. */
void pb_finish(builder_t *b, ovl_plan_t *plan);
/* The end of a program whose streams need nothing more: streams [1,
 * nstreams) joined into stream 0, then DONE on it. */
ovl_status_t pb_emit_epilogue(builder_t *b, uint32_t rank, uint32_t nstreams);
/* The nodes of p's topology (0: node ids out of range or not dense). */
uint32_t pb_count_nodes(const ovl_plan_params_t *p);
/* An algorithm's default chunk count c, halved while a chunk's GEMM (its
 * ceil(m / c) rows of `ranks` ranks) would do too little. */
uint32_t pb_default_chunks(const ovl_plan_params_t *p, uint32_t c, uint32_t ranks);
/* Marks the buffers the instructions name. */
void pb_mark_used(ovl_plan_t *plan);
/* The Bs' columns together (saturating): a GEMM's width per gathered row. */
uint64_t pb_total_n(const ovl_plan_params_t *p);
/* Every buffer's dtype (B's b_dtype, C's and P's the output's when
 * scaled), and a scaled op's SA, SB, BIAS and SG shapes; the others'
 * shapes are the emitters'. */
void pb_buf_types(const ovl_plan_params_t *p, ovl_plan_buf_t *bufs);
/* Why a scaled op's params (p->sc, and an fp8 dtype without it) cannot be
 * planned, in words; NULL where they can (common/scaling.h's rules). */
const char *pb_scaling_refusal(const ovl_plan_params_t *p);
/* Chunks of rows > 0 rows, about c of them (c clamped to 1..rows): every
 * chunk *ret_rows rows but the last, which has what is left, *ret_chunks
 * in all. The chunk's rows are a multiple of a scaled op's row granule
 * (common/scaling.h: 4 with A's scales 1x128), so that every GEMM's rows
 * are where rows are. */
void pb_chunk_rows(const ovl_plan_params_t *p, uint64_t rows, uint32_t c, uint64_t *ret_rows,
                   uint32_t *ret_chunks);
/* Scratch buffers lie one after the other, each at a multiple of
 * PB_SCRATCH_ALIGN bytes: bytes more after *total, which grows; where they
 * start in *ret_offset. OVL_ERR_LIMIT past 2^64 - 1. */
#define PB_SCRATCH_ALIGN 256u
ovl_status_t pb_scratch_after(uint64_t *total, uint64_t bytes, uint64_t *ret_offset);

#endif /* OVL_PLAN_BUILD_H */

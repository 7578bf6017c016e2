/*
 * plan.h: the planner. It turns one AG-GEMM (shape, world, rank, algorithm,
 * chunks, streams) into a *host program* for one rank: a flat, deterministic
 * list of instructions over numbered streams. Stream 0 stands for the
 * client's stream. Both backends run the same program (exec.c walks it); a new
 * algorithm touches only this module. Pure code: no I/O, no logging.
 *
 * Rows. Rank b's shard A_b has m rows. The gathered matrix G (the client's
 * a_out, or ovld's scratch) has world*m rows; rank b's shard lands at rows
 * [b*m, (b+1)*m). Row ranges in instructions are *shard rows* [row0,
 * row0+rows) and apply to one or more rank blocks.
 *
 * Events. Each rank has plan->nevents events, named by small integers. An
 * event is recorded by its own rank and may be waited on by any rank of the
 * job (cross-rank waits order pulls after the owner's data is ready, and the
 * owner's completion after every peer has finished reading its shard). Two
 * events have fixed meanings in every plan:
 *   OVL_EV_READY    recorded on stream 0 right after WAIT_READY: this rank's
 *                   inputs are ready.
 *   OVL_EV_RELEASE  (ring only) recorded after this rank's last read of any
 *                   peer's shard: peers may then complete.
 *
 * Semantics of a wait: as with cudaStreamWaitEvent, a WAIT orders the stream
 * after the most recent RECORD of that event issued before it. The executor
 * issues instructions so that every RECORD a WAIT refers to is issued first.
 */
#ifndef OVL_PLAN_H
#define OVL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ovl.h"

#define OVL_PLAN_MAX_WORLD   1024
#define OVL_PLAN_MAX_CHUNKS  64
#define OVL_PLAN_MAX_STREAMS 8

enum {
    OVL_EV_READY = 0,
    OVL_EV_RELEASE = 1,
    OVL_EV_FIRST_FREE = 2, /* other events are numbered from here */
};

typedef enum ovl_instr_kind {
    /* stream waits until the rank's client doorbell says ready >= op seq */
    OVL_I_WAIT_READY = 0,
    /* record this rank's event `event` on `stream` */
    OVL_I_RECORD,
    /* `stream` waits for event `event` of rank `peer` (peer may be own rank) */
    OVL_I_WAIT,
    /* collective over all ranks: shard rows [row0, row0+rows) of every rank b
     * land in G rows [b*m+row0, ...). Every rank issues the same ALLGATHERs in
     * the same order; one completes on a rank only once every rank has
     * contributed and finished reading (as an NCCL all-gather). */
    OVL_I_ALLGATHER,
    /* copy rank `peer`'s shard rows [row0, row0+rows) into G rows
     * [peer*m+row0, ...) (copy engine; peer == own rank: a local copy that
     * fills a_out). Must follow a WAIT on (peer, OVL_EV_READY) for a peer. */
    OVL_I_PULL,
    /* C rows [b*m+row0, +rows) = A_b rows [row0, +rows) @ op(B) for every
     * block b in [block0, block0+nblocks). src OVL_SRC_GATHERED reads G;
     * OVL_SRC_LOCAL reads this rank's own shard (block0 == rank, nblocks 1). */
    OVL_I_GEMM,
    /* a short sleep kernel of sleep_ns on `stream` */
    OVL_I_SLEEP,
    /* stream (0) writes done = op seq to the client's doorbell */
    OVL_I_DONE,
} ovl_instr_kind_t;

/* Not a kind: the number of kinds (one past the last, OVL_I_DONE). Kept out
 * of the enum so that switches over the kinds stay exhaustive; a new kind
 * moves it. */
#define OVL_I_COUNT (OVL_I_DONE + 1)

typedef enum ovl_gemm_src {
    OVL_SRC_GATHERED = 0,
    OVL_SRC_LOCAL = 1,
} ovl_gemm_src_t;

typedef struct ovl_instr {
    ovl_instr_kind_t kind;
    uint32_t stream;
    uint32_t event;     /* RECORD, WAIT */
    uint32_t peer;      /* WAIT, PULL */
    uint32_t block0;    /* GEMM */
    uint32_t nblocks;   /* GEMM */
    ovl_gemm_src_t src; /* GEMM */
    uint64_t row0;      /* ALLGATHER, PULL, GEMM: shard rows */
    uint64_t rows;
    uint32_t sleep_ns; /* SLEEP */
} ovl_instr_t;

typedef struct ovl_plan_params {
    ovl_algo_t algo; /* AUTO is resolved by ovl_plan_choose before building */
    uint32_t world;
    uint32_t rank;
    uint64_t m, n, k;
    ovl_dtype_t dtype;
    uint32_t chunks;    /* 0: the planner's default for the algorithm */
    uint32_t streams;   /* 0: the planner's default for the algorithm */
    bool want_gathered; /* the client gave a_out: G must hold every block */
} ovl_plan_params_t;

typedef struct ovl_plan {
    ovl_plan_params_t params; /* as given, with algo resolved */
    uint32_t chunks;          /* effective chunk count (<= requested, <= m) */
    uint64_t chunk_rows;      /* rows of every chunk but maybe the last */
    uint32_t nstreams;        /* streams used, stream 0 included */
    uint32_t nevents;         /* events used per rank */
    bool uses_gathered;       /* G (a_out or scratch) is read or written */
    size_t ninstr;
    ovl_instr_t *instr;
} ovl_plan_t;

/*
 * Builds rank params->rank's program into *ret_plan (which the caller frees
 * with ovl_plan_free). Returns OVL_OK, OVL_ERR_INVALID for bad parameters
 * (world 0 or over OVL_PLAN_MAX_WORLD, rank >= world, m/n/k 0, algo AUTO or
 * unknown, chunks over OVL_PLAN_MAX_CHUNKS, streams over
 * OVL_PLAN_MAX_STREAMS), or OVL_ERR_NOMEM.
 */
ovl_status_t ovl_plan_build(const ovl_plan_params_t *params, ovl_plan_t *ret_plan);

/*
 * Whether the plan for params (algo resolved) reads or writes G, the
 * gathered A: what ovl_plan_build puts in uses_gathered, known before
 * building (a job sizes and grows its scratch by it).
 */
bool ovl_plan_uses_gathered(const ovl_plan_params_t *params);

/* Frees what ovl_plan_build allocated; accepts a zeroed plan. */
void ovl_plan_free(ovl_plan_t *plan);

/*
 * The documented rule behind OVL_ALGO_AUTO (see docs/plans.md). Returns a
 * concrete algorithm; never AUTO.
 */
ovl_algo_t ovl_plan_choose(const ovl_plan_params_t *params);

/*
 * Formats the plan in the stable text format (docs/plans.md) into buf, like
 * snprintf: returns the length the whole text needs, excluding the NUL;
 * writes at most len bytes, NUL-terminated when len > 0.
 */
size_t ovl_plan_format(const ovl_plan_t *plan, char *buf, size_t len);

/* Name of an instruction kind, for the dump ("WAIT_READY", ...). */
const char *ovl_instr_name(ovl_instr_kind_t kind);

#endif /* OVL_PLAN_H */

/*
 * plan.h: the planner. It turns one AG-GEMM (shape, world, rank, algorithm,
 * chunks, streams, and how the daemon can move data) into a *host program*
 * for one rank: a flat, deterministic list of instructions over numbered
 * streams. Stream 0 stands for the client's stream. Both backends run the
 * same program (exec.c walks it); a new algorithm touches only this module.
 * Pure code: no I/O, no logging.
 *
 * A plan says everything that is policy, so that the executor only resolves
 * names and the backends only execute primitives:
 *  - buffers: instructions name the matrices they read and write (A, B, C,
 *    G), a row in each, and their full geometry; the plan reports each
 *    buffer's shape and whether it is used, and the scratch ovld must
 *    provide for G (ovl_plan_scratch_bytes gives it before building);
 *  - transfers: an ALLGATHER names its method (NCCL all-gather or NCCL
 *    send/recv), a RAIL (between nodes) its method and every rank it sends
 *    to and receives from; inside a node the gather is explicit PULLs
 *    (copy engine) ordered by RECORD/WAIT, so that every ordering shows;
 *  - streams: each has a role (client, communication, copy, compute) from
 *    which the backend takes its priority.
 *
 * Rows. Rank b's shard A_b has m rows. The gathered matrix G (the client's
 * a_out, or ovld's scratch) has world*m rows; rank b's shard lands at rows
 * [b*m, (b+1)*m) (block b). C has world*m rows in blocks the same way.
 * Instructions name rows of these buffers directly.
 *
 * Events. Each rank has plan->nevents events, named by small integers. An
 * event is recorded by its own rank and may be waited on by any rank of the
 * job (cross-rank waits order pulls after the owner's data is ready, and the
 * owner's completion after every peer has finished reading its shard). Two
 * events have fixed meanings in every plan:
 *   OVL_EV_READY    recorded on stream 0 right after WAIT_READY: this rank's
 *                   inputs are ready.
 *   OVL_EV_RELEASE  (plans that pull from peers) recorded after this rank's
 *                   last read of any peer's shard (or, across nodes, of the
 *                   rows a peer received into its G) on the first stream
 *                   that reads them; peers may then complete. A plan that
 *                   pulls on several streams records one more fresh release
 *                   event per further stream.
 * A ring across nodes gives chunk j's arrival event the number
 * OVL_EV_FIRST_FREE + j on every rank (ovl_plan_arrival_event): a rank that
 * receives records it right after its RAIL of chunk j, and the node's peers
 * wait on it before they pull those rows from its G.
 *
 * Semantics of a wait: as with cudaStreamWaitEvent, a WAIT orders the stream
 * after the most recent RECORD of that event issued before it. The executor
 * issues instructions so that every RECORD a WAIT refers to is issued first.
 *
 * Nodes. A job may span nodes (params.node_of says which rank is where;
 * docs/plans.md, "Several nodes"). Events, PULLs and PUSHes never cross a
 * node: a WAIT names a rank of the own node, a PULL reads a buffer of one,
 * a PUSH writes one. Data
 * crosses nodes only by NCCL: ALLGATHERs and REDUCE_SCATTERs (naive,
 * collective) and RAILs (ring; GEMM + reduce-scatter's push), whose
 * completion orders the receiving rank after the sending ranks' matching
 * instruction.
 */
#ifndef OVL_PLAN_H
#define OVL_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ovl.h"
#include "scaling.h"

#define OVL_PLAN_MAX_WORLD   1024
#define OVL_PLAN_MAX_CHUNKS  64
#define OVL_PLAN_MAX_STREAMS 8
#define OVL_PLAN_MAX_BS      8 /* Bs of one op (OVL_MAX_BS) */

enum {
    OVL_EV_READY = 0,
    OVL_EV_RELEASE = 1,
    OVL_EV_FIRST_FREE = 2, /* other events are numbered from here */
};

/* The buffers a plan names; the executor holds one view of each per rank. */
typedef enum ovl_buf {
    OVL_BUF_A, /* a rank's shard, m x k (a PULL reads a peer's) */
    OVL_BUF_B, /* k x n, or n x k with transb */
    OVL_BUF_C, /* (world*m) x n */
    OVL_BUF_G, /* (world*m) x k, the gathered A: the client's a_out or ovld's scratch */
    /* An op with several Bs (nb > 1): B i and C i for i = 1 .. nb-1, shaped
     * as B and C with B i's own n; B 0 and C 0 are B and C. Named "B1".."B7"
     * and "C1".."C7". */
    OVL_BUF_B1,
    OVL_BUF_C1 = OVL_BUF_B1 + OVL_PLAN_MAX_BS - 1,
    /* GEMM + reduce-scatter: partial products in the op's dtype (out_dtype when scaled; ovld's
     * scratch). naive and collective: this rank's, m x n. push: first the
     * receive slots, slot q (rows [q*m/W, (q+1)*m/W)) holding rank q's
     * partial of this rank's block, then the partials this rank sends, one
     * block per step (rows m + (t-1)*m/W for step t): (2m - m/W) x n.
     * push across nodes: (3W - 1) blocks of m/W rows (plan_rs.c,
     * railpush_emit, says which). ring: the W - 1 receive slots (the sum
     * arriving at step t at rows (t-1)*m/W), then the sums it sends (step
     * t's at (W-1+t)*m/W): 2(W-1)*m/W x n, none at W = 1. */
    OVL_BUF_P = OVL_BUF_C1 + OVL_PLAN_MAX_BS - 1,
    /* A scaled op's (params.sc): A's fp32 scales (1 x 1, or m x 1 by row:
     * row i's scale at row i), B's (1 x 1, or 1 x n), the bias (1 x n, in
     * the output dtype), and the gathered A's scales by row ((world*m) x
     * 1, ovld's scratch after G or P: rank b's at rows [b*m, (b+1)*m)). */
    OVL_BUF_SA,
    OVL_BUF_SB,
    OVL_BUF_BIAS,
    OVL_BUF_SG,
    /* with several Bs, B i's scales and bias (i = 1 .. nb-1), shaped as
     * SB and BIAS with B i's n; "SB1".."SB7", "BIAS1".."BIAS7" */
    OVL_BUF_SB1,
    OVL_BUF_BIAS1 = OVL_BUF_SB1 + OVL_PLAN_MAX_BS - 1,
    OVL_BUF_COUNT = OVL_BUF_BIAS1 + OVL_PLAN_MAX_BS - 1,
} ovl_buf_t;

/* B i and C i of an op (i < OVL_PLAN_MAX_BS). */
static inline ovl_buf_t ovl_buf_b(uint32_t i)
{
    return i == 0 ? OVL_BUF_B : (ovl_buf_t)(OVL_BUF_B1 + i - 1);
}
static inline ovl_buf_t ovl_buf_c(uint32_t i)
{
    return i == 0 ? OVL_BUF_C : (ovl_buf_t)(OVL_BUF_C1 + i - 1);
}
/* A scaled op's B i's scales and bias (i < OVL_PLAN_MAX_BS). */
static inline ovl_buf_t ovl_buf_sb(uint32_t i)
{
    return i == 0 ? OVL_BUF_SB : (ovl_buf_t)(OVL_BUF_SB1 + i - 1);
}
static inline ovl_buf_t ovl_buf_bias(uint32_t i)
{
    return i == 0 ? OVL_BUF_BIAS : (ovl_buf_t)(OVL_BUF_BIAS1 + i - 1);
}
/* Which B (or C) buf is: its index, or -1 for another buffer. */
static inline int ovl_buf_b_index(ovl_buf_t buf)
{
    return buf == OVL_BUF_B                        ? 0
           : buf >= OVL_BUF_B1 && buf < OVL_BUF_C1 ? (int)(buf - OVL_BUF_B1) + 1
                                                   : -1;
}
static inline int ovl_buf_c_index(ovl_buf_t buf)
{
    return buf == OVL_BUF_C                       ? 0
           : buf >= OVL_BUF_C1 && buf < OVL_BUF_P ? (int)(buf - OVL_BUF_C1) + 1
                                                  : -1;
}

/* How an ALLGATHER or a RAIL moves rows. The first two are NCCL-style
 * collectives of ALLGATHER: every rank issues the same one, and it
 * completes on a rank only once every rank has contributed and every rank's
 * rows were read. The third is RAIL's. */
typedef enum ovl_ag_method {
    /* ncclAllGather: whole shards, which land back to back (block stride ==
     * rows) in dense rows (ld == cols) */
    OVL_AG_NCCL_ALLGATHER,
    /* grouped ncclSend/ncclRecv to and from every peer (the own rows by a
     * local copy): chunks, each landing in its rank's block, in dense rows */
    OVL_AG_NCCL_SENDRECV,
    /* RAIL only: grouped ncclSend/ncclRecv to and from the ranks the
     * instruction names (global ranks of the job's communicator), every
     * local rank's sends and receives of one RAIL in one group; dense rows */
    OVL_AG_NCCL_RAIL,
    OVL_AG_METHOD_COUNT,
} ovl_ag_method_t;

/* What the daemon prefers for gathering A (ovl_plan_params_t.allgather). */
typedef enum ovl_ag_pref {
    /* NCCL methods where the job has several ranks and every layout is
     * dense, the copy-engine gather otherwise */
    OVL_AG_AUTO,
    /* NCCL methods wherever every layout is dense, one rank included */
    OVL_AG_NCCL,
    /* the copy-engine gather always: PULLs ordered by events */
    OVL_AG_COPY,
    OVL_AG_PREF_COUNT,
} ovl_ag_pref_t;

/* What a stream is for; the backend takes its priority from this. */
typedef enum ovl_stream_role {
    /* stream 0: the client's doorbell (WAIT_READY, DONE), the joins, and
     * whatever of the algorithm the plan puts there */
    OVL_ROLE_CLIENT,
    /* NCCL collectives (in collective, with the GEMMs of their chunks), or
     * the RAILs of a ring across nodes */
    OVL_ROLE_COMM,
    /* copy-engine pulls (in collective, with the GEMMs of their chunks) */
    OVL_ROLE_COPY,
    /* GEMMs only */
    OVL_ROLE_COMPUTE,
    OVL_ROLE_COUNT,
} ovl_stream_role_t;

typedef enum ovl_instr_kind {
    /* stream waits until the rank's client doorbell says ready >= op seq */
    OVL_I_WAIT_READY = 0,
    /* record this rank's event `event` on `stream` */
    OVL_I_RECORD,
    /* `stream` waits for event `event` of rank `peer` (peer may be own rank) */
    OVL_I_WAIT,
    /* collective over all ranks by `method`: every rank b's rows x cols
     * from its own src land in every rank's dst, b*stride rows past
     * dst.row. Every rank issues the same ALLGATHERs in the same order. */
    OVL_I_ALLGATHER,
    /* copy engine: rows x cols from src (src.rank: whose buffer, a peer's
     * or the own) to the own dst. Reading a peer's buffer must follow a
     * WAIT on (peer, OVL_EV_READY). */
    OVL_I_PULL,
    /* for each block i in [0, nblocks): dst rows [dst.row + i*stride, +rows)
     * = src rows [src.row + i*stride, +rows) @ op(b), op(B) being k x n
     * (B^T with transb). All three are the own rank's buffers; b is B i and
     * dst C i for one i < nb, n that B's. GEMM + reduce-scatter's ring
     * (nblocks 1): with avg the product is scaled by 1/world (alpha), and
     * with `accumulate` the own acc rows [acc.row, +rows) (P) are added to
     * it in fp32 before dst's one rounding (beta 1). */
    OVL_I_GEMM,
    /* a short sleep kernel of sleep_ns on `stream` */
    OVL_I_SLEEP,
    /* stream (0) writes done = op seq to the client's doorbell */
    OVL_I_DONE,
    /* across nodes, by `method` (OVL_AG_NCCL_RAIL): rows x cols of the own
     * src go to each rank of the send list (plan->peers[peers ..
     * +nsend)), and each rank q of the receive list (plan->peers[peers +
     * nsend .. +nrecv)) sends its rows, which land in the own dst, q*stride
     * rows past dst.row. Every rank of the job issues the same RAILs (rows)
     * in the same order; a RAIL completes on a rank once its receives have
     * arrived and its sends have left its buffer: each receive only after
     * its sender issued the matching RAIL. */
    OVL_I_RAIL,
    /* copy engine: rows x cols of the own src (A; in GEMM +
     * reduce-scatter's push, P) into dst, a peer's buffer on the same node
     * (G; P). Writing a peer's buffer must follow a WAIT on (peer,
     * OVL_EV_READY) (its previous op is done and its client ready), and the
     * peer reads those rows only after a WAIT on the event this rank records
     * after the PUSH. */
    OVL_I_PUSH,
    /* collective over all ranks (ncclReduceScatter): for every rank b, the
     * rows [src.row + b*stride, +rows) x cols of every rank's src (P) are
     * summed (avg: and divided by the world), accumulating in fp32, into
     * rank b's dst rows [dst.row, +rows) (C). Every rank issues the same
     * REDUCE_SCATTERs in the same order; one completes on a rank once every
     * rank contributed and every rank's src was read. */
    OVL_I_REDUCE_SCATTER,
    /* on the own rank, no communication: dst rows [dst.row, +rows) x cols
     * (C) = the sum over i in [0, nblocks) of src rows [src.row +
     * i*stride, +rows) (P), accumulated in fp32 in order of i (avg: divided
     * by the world), stored in the dtype once */
    OVL_I_REDUCE,
} ovl_instr_kind_t;

/* Not a kind: the number of kinds (one past the last, OVL_I_REDUCE). Kept
 * out of the enum so that switches over the kinds stay exhaustive; a new
 * kind moves it. */
#define OVL_I_COUNT (OVL_I_REDUCE + 1)

/* A row of a named buffer of one rank. */
typedef struct ovl_ref {
    ovl_buf_t buf;
    uint32_t
        rank; /* whose buffer: the own rank's, but for a PULL's source and a PUSH's destination */
    uint64_t row;
} ovl_ref_t;

typedef struct ovl_instr {
    ovl_instr_kind_t kind;
    uint32_t stream;
    uint32_t event;         /* RECORD, WAIT */
    uint32_t peer;          /* WAIT: the event's rank */
    ovl_ag_method_t method; /* ALLGATHER, RAIL */
    ovl_ref_t src;          /* PULL, PUSH, ALLGATHER, RAIL: the rows moved (sent); GEMM: A;
                               REDUCE_SCATTER: rank 0's block of the summed rows (P);
                               REDUCE: the first block's rows (P) */
    ovl_ref_t dst;          /* PULL, PUSH, ALLGATHER, RAIL: where they land; GEMM: C (or P);
                               REDUCE_SCATTER, REDUCE: where the sum lands (C) */
    ovl_ref_t b;            /* GEMM: the B operand (row 0 of B) */
    ovl_ref_t acc;          /* GEMM with accumulate: the rows added (P) */
    ovl_ref_t sa;           /* GEMM of a scaled op: the scale of src's first row (SA, or SG
                               for gathered rows; row 0 of SA for one scale); B i's scales
                               (SB i) and bias (BIAS i, when params.sc.bias) are read whole */
    bool accumulate;        /* GEMM: dst = src @ op(b) + acc */
    uint64_t rows;          /* PULL, PUSH, ALLGATHER, RAIL, REDUCE_SCATTER: rows moved (per rank);
                               GEMM, REDUCE: rows per block */
    uint64_t cols;          /* PULL, PUSH, ALLGATHER, RAIL, REDUCE_SCATTER, REDUCE: elements per
                               row */
    uint64_t n, k;          /* GEMM: C's columns, the inner dimension */
    uint32_t nblocks;       /* GEMM: blocks, stride rows apart in src and dst; REDUCE: blocks
                               summed, stride rows apart in src */
    uint64_t stride;        /* GEMM with nblocks > 1; ALLGATHER, RAIL, REDUCE_SCATTER, REDUCE: rows
                               between ranks' blocks */
    bool avg;               /* REDUCE_SCATTER, REDUCE: divide the sum by the world; GEMM
                               (ring's): scale the product by 1/world */
    bool transb;            /* GEMM: op(B) = B^T */
    uint32_t sleep_ns;      /* SLEEP */
    uint32_t peers;         /* RAIL: where its send list starts in plan->peers */
    uint32_t nsend, nrecv;  /* RAIL: its sends, then its receives, in plan->peers */
} ovl_instr_t;

/* Which B a GEMM multiplies by: i of B i (0 for B, and for a GEMM that
 * names none). A scaled op's GEMM reads that B's scales and bias. */
static inline uint32_t ovl_gemm_b(const ovl_instr_t *in)
{
    int i = ovl_buf_b_index(in->b.buf);
    return i > 0 ? (uint32_t)i : 0;
}

/* What makes an op scaled (fp8; ovl.h's ovl_scaling_t): A in the op's
 * dtype, B in b_dtype, both fp8; C (and GEMM + reduce-scatter's partials
 * P) in out_dtype; A's scales (buffer SA; gathered with A's rows into SG
 * where they are per row and another rank's rows are multiplied), B's
 * (SB), and the bias (BIAS) when `bias`. The zero value is not scaled:
 * every buffer in the op's dtype, as was always planned. */
typedef struct ovl_plan_scaling {
    bool scaled;
    ovl_dtype_t b_dtype, out_dtype;
    ovl_scale_mode_t a_mode, b_mode;
    bool fast_accum;
    bool bias; /* every B has its bias (several Bs: all or none) */
} ovl_plan_scaling_t;

/* Who chose a plan's algorithm (ovl_plan_params_t.chosen), which its text
 * says (the zero value, the caller, says nothing). */
typedef enum ovl_choice {
    OVL_CHOSEN_GIVEN = 0, /* the op named it */
    OVL_CHOSEN_DEFAULT,   /* the daemon's default_algo, for an op that said auto */
    OVL_CHOSEN_RULE,      /* ovl_plan_choose's rule, for an op that said auto */
    OVL_CHOSEN_MEASURED,  /* the fastest candidate ovld measured (daemon/core/tune.h) */
    OVL_CHOSEN_TRYING,    /* a candidate ovld is measuring */
} ovl_choice_t;

typedef struct ovl_plan_params {
    /* The op's kind: its emitter. 0 (the zero value) reads as
     * OVL_OP_AG_GEMM, so that params zeroed where they are not set plan
     * what they always planned. For OVL_OP_GEMM_RS the fields below read
     * (docs/plans.md, "GEMM + reduce-scatter"): m the rows of A and of the
     * product (a multiple of world; each rank keeps m / world of them), k
     * this rank's inner dimension, n, dtype, transb, algo (naive,
     * collective, ring or push), chunks (of the rows of one rank's block) and
     * streams (collective's), reduce_op, and the layout flags; one B, no
     * a_out, one node. */
    ovl_op_kind_t kind;
    ovl_reduce_op_t reduce_op; /* gemm_rs: how the partials are combined */
    ovl_algo_t algo;           /* AUTO is resolved by ovl_plan_choose before building */
    ovl_choice_t chosen;       /* who chose algo: the plan's text says why */
    uint32_t world;
    uint32_t rank;
    uint64_t m, n, k;
    ovl_dtype_t dtype;
    uint32_t chunks;    /* 0: the planner's default for the algorithm */
    uint32_t streams;   /* 0: the planner's default for the algorithm */
    bool want_gathered; /* the client gave a_out: G must hold every block */
    bool transb;        /* B is n x k (a Linear weight's layout) */
    /* Some rank's A or a_out has a leading dimension other than k: NCCL
     * cannot move its rows in one piece, so A is gathered by the copy
     * engine. (The zero value is the common dense case.) */
    bool strided;
    /* Some ranks of the job share a GPU: NCCL cannot make a communicator
     * of them (it refuses duplicate GPUs), so A is gathered by the copy
     * engine whatever the preference. */
    bool shared_gpu;
    ovl_ag_pref_t allgather; /* AUTO unless the daemon says otherwise */
    /* Several Bs: nb of them (0 or 1: one, B of n columns), C i = G @ op(B i),
     * B i (i >= 1) having n_more[i-1] columns. G is gathered once; every
     * chunk's GEMM is issued once per B. (The zero value is one B.) */
    uint32_t nb;
    uint64_t n_more[OVL_PLAN_MAX_BS - 1];
    /*
     * The topology: node_of[q] is the node of rank q (world entries, read
     * while building only; the plan keeps a copy). Nodes are numbered
     * densely from 0; ranks need not be node-major and nodes may differ in
     * size. A rank's local index is its place among its node's ranks in
     * rank order. NULL (or every rank on node 0) is one node: the zero
     * value plans what was always planned, byte for byte. Across nodes the
     * copy engine cannot move shards, so a strided layout or allgather =
     * copy cannot be planned (OVL_ERR_INVALID), and ranks sharing a GPU
     * only by ring (its RAILs need no communicator over the whole job).
     */
    const uint32_t *node_of;
    /* Scaled (fp8): its dtypes, scales and bias. (The zero value: not.) */
    ovl_plan_scaling_t sc;
} ovl_plan_params_t;

/* The dtype of C (and of P): out_dtype when scaled, else the op's. */
static inline ovl_dtype_t ovl_plan_out_dtype(const ovl_plan_params_t *p)
{
    return p->sc.scaled ? p->sc.out_dtype : p->dtype;
}

/* Whether a scaled op's A scales are per row of A (by row, or 1x128), so
 * that they go with its rows (gathered with them into SG, cut with them),
 * and their floats per row of A: 1 by row, ceil(k / 128) by 1x128 (ovl.h's
 * ovl_scale_shape). */
static inline bool ovl_plan_scales_per_row(const ovl_plan_params_t *p)
{
    return p->sc.scaled && (p->sc.a_mode == OVL_SCALE_ROW || p->sc.a_mode == OVL_SCALE_BLOCK_1X128);
}
static inline uint64_t ovl_plan_scale_cols(const ovl_plan_params_t *p)
{
    return p->sc.scaled && p->sc.a_mode == OVL_SCALE_BLOCK_1X128 ? ovl_scale_blocks(p->k) : 1;
}

/* Ring across nodes: the event a rank records once chunk j's RAIL has
 * arrived (the same number on every rank, so that peers can name it). */
static inline uint32_t ovl_plan_arrival_event(uint32_t j)
{
    return OVL_EV_FIRST_FREE + j;
}

/* The Bs of params (1 for nb 0), and B i's n. */
static inline uint32_t ovl_plan_nb(const ovl_plan_params_t *p)
{
    return p->nb ? p->nb : 1;
}
static inline uint64_t ovl_plan_bn(const ovl_plan_params_t *p, uint32_t i)
{
    return i == 0 ? p->n : p->n_more[i - 1];
}

/* What the plan says of one of its buffers. */
typedef struct ovl_plan_buf {
    bool used;           /* some instruction reads or writes it */
    uint64_t rows, cols; /* its shape; its leading dimension may be larger */
    ovl_dtype_t dtype;   /* its elements' (scales: fp32) */
    /* In ovld's scratch (G without a_out, P, SG): where it starts there,
     * in bytes (a multiple of 256), dense (ld == cols). */
    bool scratch;
    uint64_t scratch_offset;
} ovl_plan_buf_t;

typedef struct ovl_plan {
    /* as given, with algo resolved; node_of is the plan's own copy, NULL
     * for one node however it was given */
    ovl_plan_params_t params;
    uint32_t nnodes;     /* nodes the job spans (1: one node) */
    uint32_t chunks;     /* effective chunk count (<= requested, <= m) */
    uint64_t chunk_rows; /* rows of every chunk but maybe the last */
    uint32_t nstreams;   /* streams used, stream 0 included */
    uint32_t nevents;    /* events used per rank */
    /* Worth replaying from a graph once seen (exec.c): the rank's GEMMs
     * are short enough that issuing them call by call would set the op's
     * pace, where a graph's launch costs the GPU some microseconds more
     * than the same work issued call by call (plan.c says how much). */
    bool replay;
    /* What streams [0, nstreams) are for: the backend's priorities. */
    ovl_stream_role_t roles[OVL_PLAN_MAX_STREAMS];
    ovl_plan_buf_t bufs[OVL_BUF_COUNT];
    /* Bytes ovld provides for scratch_buf: rows x cols of G when G is used
     * and the client gave no a_out (all-gather + GEMM), of P (GEMM +
     * reduce-scatter), else 0. The scratch is dense (ld == cols). */
    uint64_t scratch_bytes;
    ovl_buf_t scratch_buf;
    size_t ninstr;
    ovl_instr_t *instr;
    /* The ranks RAILs send to and receive from (global ranks), which each
     * RAIL names by a range (ovl_instr_t.peers, nsend, nrecv). */
    uint32_t npeers;
    uint32_t *peers;
} ovl_plan_t;

/*
 * Builds rank params->rank's program into *ret_plan (which the caller frees
 * with ovl_plan_free). Returns OVL_OK, OVL_ERR_INVALID for bad parameters
 * (world 0 or over OVL_PLAN_MAX_WORLD, rank >= world, m/n/k 0, nb over
 * OVL_PLAN_MAX_BS or an n of B i 0, algo AUTO or
 * unknown, an unknown dtype or allgather preference, chunks over
 * OVL_PLAN_MAX_CHUNKS, streams over OVL_PLAN_MAX_STREAMS; a node_of with
 * a node id >= world or a gap in its ids, or several nodes with strided or
 * allgather = copy, or with shared_gpu but for ring), OVL_ERR_LIMIT when the scratch the plan
 * needs is over 2^64-1 bytes, or OVL_ERR_NOMEM.
 */
ovl_status_t ovl_plan_build(const ovl_plan_params_t *params, ovl_plan_t *ret_plan);

/*
 * Why ovl_plan_build refuses params with OVL_ERR_INVALID, in words, where
 * the planner has words for it (GEMM + reduce-scatter's parameters, and a
 * scaled op's of either kind); NULL for params it takes, and for the
 * others.
 */
const char *ovl_plan_refusal(const ovl_plan_params_t *params);

/*
 * The scratch the plan for params (algo resolved) needs, known before
 * building: what ovl_plan_build puts in scratch_bytes (a job sizes and grows
 * its scratch by it). Returns OVL_OK, OVL_ERR_INVALID for parameters
 * ovl_plan_build refuses, or OVL_ERR_LIMIT when the size is over 2^64-1
 * bytes (never a wrapped value).
 */
ovl_status_t ovl_plan_scratch_bytes(const ovl_plan_params_t *params, uint64_t *ret_bytes);

/*
 * The rail groups of a job across nodes (docs/plans.md, "ring across
 * nodes"): the sets of ranks that ring's RAILs connect, directly or through
 * each other. A RAIL of a rank only ever names ranks of its own group, so
 * each group can have a communicator of its own, which a job whose ranks
 * share a GPU needs (NCCL takes no two ranks of one GPU in one
 * communicator; those ranks are in different groups where nodes are of
 * equal size). node_of is as in ovl_plan_params_t (world entries, dense).
 * Writes group_of[q] (groups numbered 0.. in the order of their lowest
 * ranks) and pos[q] (q's place in its group, in rank order) for every rank
 * q, and the number of groups. Returns OVL_OK, OVL_ERR_INVALID (world 0 or
 * over OVL_PLAN_MAX_WORLD, a NULL argument, node_of not dense), or
 * OVL_ERR_NOMEM.
 */
ovl_status_t ovl_plan_rail_groups(uint32_t world, const uint32_t *node_of, uint32_t *group_of,
                                  uint32_t *pos, uint32_t *ret_ngroups);

/* Frees what ovl_plan_build allocated; accepts a zeroed plan. */
void ovl_plan_free(ovl_plan_t *plan);

/* Whether a and b plan the same program: every field equal (node_of by
 * its world entries, NULL being every rank on node 0). */
bool ovl_plan_params_equal(const ovl_plan_params_t *a, const ovl_plan_params_t *b);

/*
 * The documented rule behind OVL_ALGO_AUTO (see docs/plans.md). Returns a
 * concrete algorithm; never AUTO.
 */
ovl_algo_t ovl_plan_choose(const ovl_plan_params_t *params);
/* Whether an operator's default algorithm (config default_algo) may stand
 * for auto in params: the op's kind has it, the planner takes it for these
 * params, and it runs wherever they say the ranks are (not naive or
 * collective for GEMM + reduce-scatter where ranks share a GPU). Else the
 * rule (ovl_plan_choose) chooses. */
bool ovl_plan_takes_default(const ovl_plan_params_t *params, ovl_algo_t algo);

/* Why ovl_plan_choose chooses what it does for params, in words (a static
 * string): the plan text's "chosen by auto" line. */
const char *ovl_plan_choose_why(const ovl_plan_params_t *params);

/* A plan that `auto` may measure (ovld's tuner, daemon/core/tune.h): an
 * algorithm, a chunk request (0: the planner's default) and how A is
 * gathered (OVL_AG_AUTO: as the params say; OVL_AG_COPY: by the copy
 * engine, where the params leave it to ovld). */
typedef struct ovl_plan_cand {
    ovl_algo_t algo;
    uint32_t chunks;
    ovl_ag_pref_t allgather;
} ovl_plan_cand_t;
#define OVL_PLAN_MAX_CANDS 16

/*
 * The plans worth measuring for params (its algo, chunks, streams and
 * chosen ignored): every algorithm of its kind that runs where the params
 * say the ranks are (as ovl_plan_takes_default judges), each at its
 * default chunks and at 1, 2 and 4 chunks, and where params->allgather is
 * OVL_AG_AUTO each also gathering A by the copy engine; none planning the
 * same program as one before it (equal algorithm, chunk count, streams
 * and gather by NCCL or not, once the planner has clamped them), the
 * rule's choice at its default first. Returns how many went into out (at
 * most OVL_PLAN_MAX_CANDS; 0 for params the planner refuses whatever the
 * algorithm). Builds plans to compare them: for a new shape, not per op.
 */
uint32_t ovl_plan_candidates(const ovl_plan_params_t *params,
                             ovl_plan_cand_t out[OVL_PLAN_MAX_CANDS]);

/*
 * Formats the plan in the stable text format (docs/plans.md) into buf, like
 * snprintf: returns the length the whole text needs, excluding the NUL;
 * writes at most len bytes, NUL-terminated when len > 0.
 */
size_t ovl_plan_format(const ovl_plan_t *plan, char *buf, size_t len);

/* Name of an instruction kind, for the dump ("WAIT_READY", ...). */
const char *ovl_instr_name(ovl_instr_kind_t kind);

/* Names for the dump and the config; NULL for a value out of range. */
const char *ovl_buf_name(ovl_buf_t buf); /* "A", "B", "C", "G", "B1".."B7", "C1".."C7" */
const char *ovl_ag_method_name(ovl_ag_method_t method);   /* "nccl-allgather", ... */
const char *ovl_stream_role_name(ovl_stream_role_t role); /* "client", ... */
const char *ovl_ag_pref_name(ovl_ag_pref_t pref);         /* "auto", "nccl", "copy" */
/* Parses a preference's name; OVL_ERR_INVALID for an unknown one. */
ovl_status_t ovl_ag_pref_parse(const char *name, ovl_ag_pref_t *ret);

#endif /* OVL_PLAN_H */

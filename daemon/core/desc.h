/*
 * desc.h: requests as the core sees them. The server turns each request
 * into one of these plain descriptors at the boundary (request.c); jobs,
 * the op queue and everything below never see wire types.
 */
#ifndef OVLD_DESC_H
#define OVLD_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/types.h>

#include "config.h"
#include "gemm_args.h" /* ovld_view_t */
#include "jobid.h"
#include "plan.h"
#include "uuid.h"

#define OVLD_JOB_ID_MAX 63

/* The kinds of op (kind.h: each one's entry), numbered as the public
 * ovl_op_kind_t (whose names, ovl_op_kind_name, are theirs). 0 names none:
 * a descriptor of kind 0 is refused. */
typedef enum ovld_kind_id {
    OVLD_KIND_NONE = 0,
    OVLD_KIND_AG_GEMM = OVL_OP_AG_GEMM, /* C = allgather(A) @ B */
    OVLD_KIND_GEMM_RS = OVL_OP_GEMM_RS, /* C = reduce_scatter(A @ B) */
} ovld_kind_id_t;

/* Bs of one op at most (OVL_MAX_BS). */
#define OVLD_MAX_BS 8

/* The slots of the buffers an op names. All-gather + GEMM: its shard, the
 * weight, the output, and the gathered A when the client wants it (a_out);
 * with several Bs, B i and C i for i = 1 .. nb-1 (B 0 and C 0 are B and
 * C). Each kind names the slots it uses (kind.h). */
enum {
    OVLD_BUF_A,
    OVLD_BUF_B,
    OVLD_BUF_C,
    OVLD_BUF_AOUT,
    OVLD_BUF_B1,
    OVLD_BUF_C1 = OVLD_BUF_B1 + OVLD_MAX_BS - 1,
    /* A scaled op's (either kind): A's scales, B's, and the bias; with
     * several Bs, B i's scales and bias for i = 1 .. nb-1 */
    OVLD_BUF_A_SCALE = OVLD_BUF_C1 + OVLD_MAX_BS - 1,
    OVLD_BUF_B_SCALE,
    OVLD_BUF_BIAS,
    OVLD_BUF_B_SCALE1,
    OVLD_BUF_BIAS1 = OVLD_BUF_B_SCALE1 + OVLD_MAX_BS - 1,
    OVLD_BUF_COUNT = OVLD_BUF_BIAS1 + OVLD_MAX_BS - 1,
};

/* B i and C i (i < OVLD_MAX_BS). */
static inline int ovld_buf_b(uint32_t i)
{
    return i == 0 ? OVLD_BUF_B : OVLD_BUF_B1 + (int)i - 1;
}
static inline int ovld_buf_c(uint32_t i)
{
    return i == 0 ? OVLD_BUF_C : OVLD_BUF_C1 + (int)i - 1;
}
/* A scaled op's B i's scales and bias (i < OVLD_MAX_BS). */
static inline int ovld_buf_b_scale(uint32_t i)
{
    return i == 0 ? OVLD_BUF_B_SCALE : OVLD_BUF_B_SCALE1 + (int)i - 1;
}
static inline int ovld_buf_bias(uint32_t i)
{
    return i == 0 ? OVLD_BUF_BIAS : OVLD_BUF_BIAS1 + (int)i - 1;
}

/* Slot which's name in messages for ops of kind (all-gather + GEMM: "a",
 * "b", "c", "a_out", "b1".."b7", "c1".."c7"); "?" where the kind has none
 * (desc.c). */
const char *ovld_buf_name(uint32_t kind, int which);

/* One of them: a registration of the client's connection, the offset of
 * the matrix in it, and its leading dimension (elements). */
struct ovld_reg;

/* A buffer an op uses, once resolved: the reference it holds (buffers.h)
 * and the matrix in ovld's address space. */
typedef struct ovld_buf_use {
    struct ovld_reg *hold;
    ovld_view_t view;
    uint64_t rows, cols;
} ovld_buf_use_t;

typedef struct ovld_buf_ref {
    bool given;
    uint64_t mem_id;
    uint64_t offset;
    uint64_t ld;
} ovld_buf_ref_t;

/* What makes an op scaled (ovl_scaling_t; either kind): scaled false for
 * bf16, fp16 and fp32, when the rest is 0. b_dtype and out_dtype are
 * ovl_dtype_t, the modes ovl_scale_mode_t. Whether a bias is given is the
 * slot's (OVLD_BUF_BIAS). */
typedef struct ovld_scaling_desc {
    bool scaled;
    uint32_t b_dtype, out_dtype, a_mode, b_mode;
    bool fast_accum;
} ovld_scaling_desc_t;

/* All-gather + GEMM's own fields (kind_ag_gemm.c): the shard's rows m,
 * the columns n and inner dimension k, the dtype, the algorithm and its
 * split; Bs: nb (1 .. OVLD_MAX_BS once checked; B 0's n is n), B i's n
 * n_more[i-1]. */
typedef struct ovld_ag_gemm_desc {
    uint64_t m, n, k;
    uint32_t dtype, algo, chunks, streams;
    bool transb;
    uint32_t nb;
    uint64_t n_more[OVLD_MAX_BS - 1];
    ovld_scaling_desc_t sc;
} ovld_ag_gemm_desc_t;

/* GEMM + reduce-scatter's own fields (kind_gemm_rs.c): the rows m of A
 * and of the summed product (each rank keeps m / world of them), the
 * columns n, this rank's inner dimension k, the dtype, the algorithm and
 * its split, transb, and how the ranks' partials combine (an
 * ovl_reduce_op_t). Its buffers: a (slot 0), b (1), c (2). */
typedef struct ovld_gemm_rs_desc {
    uint64_t m, n, k;
    uint32_t dtype, algo, chunks, streams, reduce_op;
    bool transb;
    ovld_scaling_desc_t sc;
    bool has_bias; /* in the fields ranks agree on: the bias slot given */
} ovld_gemm_rs_desc_t;

/* An op: its kind, what every op has (comm, number, buffers by slot) and
 * its kind's own fields. After ovld_request_check said OVL_OK every field
 * is in its range; after a refusal only comm_id and seq mean anything (the
 * rest is narrowed with saturation, so nothing wraps into a valid value). */
typedef struct ovld_op_desc {
    uint32_t kind; /* an ovld_kind_id_t: which member below holds its fields */
    uint64_t comm_id;
    uint64_t seq;
    union {
        ovld_ag_gemm_desc_t ag; /* OVLD_KIND_AG_GEMM */
        ovld_gemm_rs_desc_t rs; /* OVLD_KIND_GEMM_RS */
    };
    ovld_buf_ref_t buf[OVLD_BUF_COUNT];
    /* The buffers resolved against the connection's registrations by the
     * server (buffers.h): a reference held and the view; hold is NULL for
     * a buffer not given or not resolved. */
    ovld_buf_use_t use[OVLD_BUF_COUNT];
} ovld_op_desc_t;

/* What every rank of a job must submit alike for an op to run: matched
 * between the ranks of a daemon (opq.c) and between the nodes of a job
 * (cluster/cluster_coord.c). */
typedef struct ovld_ag_gemm_fields {
    uint64_t m, n, k;
    uint32_t dtype, algo, chunks, streams;
    bool transb, has_aout, has_bias;
    ovld_scaling_desc_t sc;
    uint32_t nb;                      /* Bs, 1..OVLD_MAX_BS; B 0's n is n */
    uint64_t n_more[OVLD_MAX_BS - 1]; /* B i's n, i >= 1 */
} ovld_ag_gemm_fields_t;

typedef struct ovld_op_fields {
    uint32_t kind; /* an ovld_kind_id_t: compared first; which member below */
    union {
        ovld_ag_gemm_fields_t ag; /* OVLD_KIND_AG_GEMM */
        ovld_gemm_rs_desc_t rs;   /* OVLD_KIND_GEMM_RS: every field is agreed on */
    };
} ovld_op_fields_t;

/* The first field in which a and b differ, in the order ranks are told of
 * it: false if none; else its name ("m", ..., "a_out (given or not)", "n
 * of B 2") in what and a's and b's values. (desc.c) */
bool ovld_op_fields_differ(const ovld_op_fields_t *a, const ovld_op_fields_t *b, char *what,
                           size_t whatlen, uint64_t *ret_a, uint64_t *ret_b);

/* What the boundary found wrong with an op: its fields (request.c; then
 * nothing else of it is compared), or its buffers (server/dispatch.c, against the
 * registrations; the fields are sound). OVL_OK where nothing. Either fails
 * the op on every rank. */
typedef struct ovld_op_verdict {
    ovl_status_t fields;
    const char *fields_msg;
    ovl_status_t bufs;
    const char *bufs_msg;
} ovld_op_verdict_t;

/* A CommInit that passed ovld_request_check. */
typedef struct ovld_join_desc {
    /* clean text, NUL-terminated; a job across nodes: its name (x-...) */
    char job_id[OVLD_JOB_ID_MAX + 1];
    bool across; /* a job across nodes, known by blob.nonce */
    ovld_job_blob_t blob;
    uint32_t world, rank;
    uint8_t device_uuid[OVLD_UUID_LEN];
    uid_t uid; /* who asks: the connection's peer (server/dispatch.c fills these) */
    pid_t pid;
} ovld_join_desc_t;

/* Fills in what an op or a Plan request left to ovld: how A is gathered
 * (the config's allgather; by pulls where the backend has no collective),
 * chunks and streams from the config when 0, AUTO from default_algo, then
 * the planner's choice. The one place these defaults are applied. */
/* (desc.c) */
void ovld_plan_resolve(const ovld_config_t *cfg, bool have_collective, ovl_plan_params_t *p);

/* The plan parameters of a Plan request's op q (fields checked at the
 * boundary; buf[i].given for each slot it gives, which must be one its
 * kind makes optional) for rank of a dense job of world ranks on GPUs of
 * their own, resolved with cfg as an op's are. OVL_OK, or OVL_ERR_INVALID
 * (or a shape's range error) with words in msg. (desc.c) */
ovl_status_t ovld_op_plan_params(const ovld_config_t *cfg, bool have_collective,
                                 const ovld_op_desc_t *q, uint32_t world, uint32_t rank,
                                 ovl_plan_params_t *pp, char *msg, size_t len);

#endif /* OVLD_DESC_H */

/*
 * kind.h: op kinds as data. Each kind of op ovld runs is one entry of a
 * table: its name, its named buffers and their shapes as functions of the
 * op's fields and the job's world, what every rank must submit alike, how
 * the op becomes the planner's parameters and buffers, and what it counts
 * in the statistics. Above the planner, the core reaches a kind only
 * through its entry (buffers.c resolves an op's buffers, opq.c matches,
 * plans and counts ops, the cluster compares nodes' fields); below it the
 * instruction IR and the backends' primitives are shared by every kind.
 *
 * Adding a kind is: its descriptor module (kind_<name>.c: one
 * ovld_kind_t), its entry in kind.c, a planner emitter with the
 * instructions it needs (plan/), and the backend primitives those need.
 *
 * Every function of an entry is pure: no state, any thread.
 */
#ifndef OVLD_KIND_H
#define OVLD_KIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "desc.h"
#include "plan.h"

/* The shape one buffer of an op must have, and whether the op must give
 * it (required), may give it (optional: the plans do without), or does
 * not use it (neither: a buffer given there is ignored). */
typedef struct ovld_buf_shape {
    uint64_t rows, cols;
    size_t elem; /* bytes of an element */
    bool required, optional;
    /* its leading dimension must be its columns: a vector that the GEMMs
     * and transfers read as one piece (a scaled op's scales and bias) */
    bool dense;
} ovld_buf_shape_t;

/* What one op adds to the statistics, on every rank of its job. */
typedef struct ovld_op_count {
    double flop;    /* its GEMMs' floating-point operations */
    double bytes;   /* what its communication moves into ranks */
    uint32_t dtype; /* the ovl_dtype_t its cell of the table of ops is */
} ovld_op_count_t;

typedef struct ovld_kind {
    ovld_kind_id_t id; /* its name is ovl_op_kind_name(id): "ag_gemm" */
    /* Buffer slot which's name in messages; NULL where the kind has none. */
    const char *(*buf_name)(int which);
    /* The shapes of every slot (OVLD_BUF_COUNT entries) of op q in a job
     * of world ranks. q's fields passed the boundary's checks. OVL_OK, or
     * a range error with words in msg (a shape that overflows). */
    ovl_status_t (*buf_shapes)(const ovld_op_desc_t *q, uint32_t world,
                               ovld_buf_shape_t shape[OVLD_BUF_COUNT], char *msg, size_t len);
    /* What every rank of the job must submit alike, from q (valid: q
     * passed the boundary's checks; else its enumerations read as
     * UINT32_MAX, so that nothing compares equal by accident). */
    void (*fields)(const ovld_op_desc_t *q, bool valid, ovld_op_fields_t *f);
    /* The first of a's and b's fields (of this kind) that differ: false
     * if none; else its name in what and a's and b's values. */
    bool (*fields_differ)(const ovld_op_fields_t *a, const ovld_op_fields_t *b, char *what,
                          size_t whatlen, uint64_t *ret_a, uint64_t *ret_b);
    /* The planner's buffer that slot which is; -1 where the kind has none. */
    int (*plan_buf)(int which);
    /* The planner's parameters for f in a job of world ranks, before the
     * configuration's defaults (ovld_plan_resolve) and before what the
     * job knows of its ranks (shared_gpu, strided). */
    void (*plan_params)(const ovld_op_fields_t *f, uint32_t world, ovl_plan_params_t *pp);
    /* Whether one rank's buffers (its resolved slots) force the copy
     * engine: a layout NCCL cannot move as one dense piece. */
    bool (*strided)(const ovld_op_fields_t *f, const ovld_buf_use_t use[OVLD_BUF_COUNT]);
    /* What one op of f adds to the statistics, in a job of world ranks. */
    ovld_op_count_t (*count)(const ovld_op_fields_t *f, uint32_t world);
    /* f's shape for a log line, NUL-terminated in out ("m=16 n=64 k=64"). */
    void (*describe)(const ovld_op_fields_t *f, char *out, size_t len);
    /* Whether its plans span nodes (a job across nodes runs it); an op of
     * a kind whose plans do not is refused there, with words. */
    bool across;
} ovld_kind_t;

/* One field of two ranks' ops, by name, for fields_differ. */
typedef struct ovld_field_pair {
    const char *name;
    uint64_t a, b;
} ovld_field_pair_t;

/* The first of f[0..n) whose a and b differ: true, with its name in what
 * and its values in ret_a and ret_b; false if none (kind.c). */
bool ovld_fields_first_differ(const ovld_field_pair_t *f, size_t n, char *what, size_t whatlen,
                              uint64_t *ret_a, uint64_t *ret_b);

/* What a scaled op adds to either kind (kind.c): the shapes of its scale
 * and bias slots for an A of m rows and k columns and nb Bs of ns[i]
 * columns (required but the biases; nothing when not scaled; ovl.h's
 * ovl_scale_shape), refusing with msg what the shapes cannot take
 * (common/scaling.h's ovl_scaling_shape_refusal, for GEMMs of block_rows
 * rows: a rank's, or a block of the output's); its fields as pairs for
 * fields_differ (SCALING_PAIRS of them into f); and the planner's view of
 * them. The rule of the values themselves is common/scaling.h's
 * ovl_scaling_refusal, which a client's request (server/request.c) and a
 * peer's (cluster/cluster_wire.c) both ask before these. */
ovl_status_t ovld_scaling_shapes(const ovld_scaling_desc_t *sc, uint64_t m, uint64_t k,
                                 uint64_t block_rows, uint32_t nb, const uint64_t *ns,
                                 ovld_buf_shape_t shape[OVLD_BUF_COUNT], char *msg, size_t len);
#define OVLD_SCALING_PAIRS 7
void ovld_scaling_pairs(const ovld_scaling_desc_t *a, bool a_bias, const ovld_scaling_desc_t *b,
                        bool b_bias, ovld_field_pair_t f[OVLD_SCALING_PAIRS]);
void ovld_scaling_plan(const ovld_scaling_desc_t *sc, bool bias, ovl_plan_scaling_t *ret);
/* The planner's buffer for a scaled op's slots (SA, SB, BIAS); -1 for
 * another slot. */
int ovld_scaling_plan_buf(int which);

/* The entry of kind id; NULL for an id that names no kind. */
const ovld_kind_t *ovld_kind(uint32_t id);

/* q's entry, with the shapes of its slots in a job of world ranks: NULL
 * with *st and words in msg where q's kind is none (OVL_ERR_INVALID,
 * "unknown op kind K") or a shape does not fit (buf_shapes' error). */
const ovld_kind_t *ovld_kind_shapes(const ovld_op_desc_t *q, uint32_t world,
                                    ovld_buf_shape_t shape[OVLD_BUF_COUNT], ovl_status_t *st,
                                    char *msg, size_t len);

/* The kinds (kind_<name>.c). */
extern const ovld_kind_t ovld_kind_ag_gemm;
extern const ovld_kind_t ovld_kind_gemm_rs;

#endif /* OVLD_KIND_H */

/*
 * across.h: what the jobs layer (job.h) and the cluster layer
 * (cluster/cluster.h) say to each other about a job across nodes. The
 * cluster sits above the core: it calls the jobs layer's ends
 * (ovld_jobs_on_start, ovld_jobs_on_go, ovld_jobs_on_end), and the jobs
 * layer calls it back only through ovld_across_t, which main fills in
 * (ovld_cluster_across). Loop thread only.
 */
#ifndef OVLD_ACROSS_H
#define OVLD_ACROSS_H

#include <stdbool.h>
#include <stdint.h>

#include "desc.h"
#include "jobid.h"
#include "ovl.h"

struct ovld_xfer_job;

/* A job starts on this node: where its ranks are. Valid during the call;
 * xfer (host backend: the job's rows to and from other nodes; NULL
 * without) is the callee's from then on (ovld_xfer_job_release). */
typedef struct ovld_cluster_start {
    uint32_t world;
    const uint32_t *node_of; /* world entries */
    uint32_t nnodes, self_node;
    const char *const *nodes; /* nnodes advertised addresses */
    const uint8_t *key;       /* OVLD_NCCL_ID_LEN bytes, or NULL */
    /* Ranks of a node share a GPU and the backend makes keys: instead of
     * key, one per rail group (nrail_keys of OVLD_NCCL_ID_LEN bytes, back
     * to back), each rank's group and its place in it (world entries,
     * ovl_plan_rail_groups); NULL and 0 otherwise. */
    const uint8_t *rail_keys;
    uint32_t nrail_keys;
    const uint32_t *rail_group, *rail_pos;
    struct ovld_xfer_job *xfer;
} ovld_cluster_start_t;

/* An op's fate, the same on every node: status OVL_OK and the parameters
 * the coordinator resolved, or the failure's status and words. */
typedef struct ovld_cluster_go {
    ovl_status_t status;
    const char *reason;
    uint32_t algo, chunks, streams, allgather;
    bool strided, shared_gpu;
    /* the coordinator measures the op's plan (core/tune.h): time it, and
     * say the node's time once its ranks are done (ovld_across_t.op_time) */
    bool timed;
} ovld_cluster_go_t;

/* What a node says of op seq once each of its ranks submitted it. */
typedef struct ovld_cluster_ready {
    ovl_status_t status; /* OVL_OK, or why the op fails on this node */
    const char *reason;
    uint32_t first_rank; /* the node's lowest rank */
    ovld_op_fields_t f;
    bool strided, shared_gpu;
} ovld_cluster_ready_t;

/* The cluster's calls, as the jobs layer makes them; ctx NULL: this
 * daemon has no cluster (no job across nodes), and none is called. */
typedef struct ovld_across {
    void *ctx;
    /* op seq of the job is in on this node (ops in order) */
    void (*op_ready)(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                     const ovld_cluster_ready_t *r);
    /* a rank of the job left this node (abort: with ops pending), or, with
     * rank UINT32_MAX, this node aborts the job */
    void (*leave)(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint32_t rank, bool abort,
                  const char *why);
    /* the job is gone on this node */
    void (*forget)(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN]);
    /* a timed op (its go's timed) is done on this node: how it ended
     * (tune.h's ovld_tune_outcome_t) and its device time, the slowest
     * local rank's (0: none came) */
    void (*op_time)(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                    uint32_t outcome, uint64_t ns);
    /* the job's nodes as this node knows them; 0 before its start */
    uint32_t (*job_nodes)(const void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                          const char *const **ret_nodes);
} ovld_across_t;

#endif /* OVLD_ACROSS_H */

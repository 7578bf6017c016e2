/*
 * job.h: jobs, their ranks, and the ops they run. Ranks join by (owner uid,
 * job id, world, rank); every rank submits op n (numbered by the client, 1,
 * 2, ...); once every rank's op n is in and they agree, the op's plans are
 * run; a disagreement or a bad op fails op n on every rank. A rank that
 * leaves aborts the job: its pending ops fail on every rank, and later ops
 * fail at once.
 *
 * The core below the boundary: it takes descriptors (desc.h) and never
 * sees wire types, connections or registrations; the buffers of an op come
 * resolved, with a reference each that the job lets go when the op is done.
 * Members are opaque to callers. Loop thread only; logs the life of jobs
 * (joins, leaves, failures of ops), each once.
 *
 * job.c holds the jobs and their ranks, opq.c each job's op queue.
 */
#ifndef OVLD_JOB_H
#define OVLD_JOB_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "across.h"
#include "backend.h"
#include "buffers.h"
#include "config.h"
#include "desc.h"
#include "exec.h"
#include "issuer.h"
#include "plan.h"
#include "stats.h"

#define OVLD_MAX_ISSUED 4 /* ops of one job issued to the backend and not yet done */

typedef struct ovld_member ovld_member_t; /* one rank of a job, as joined */
struct ovld_job;

/* Every job of the daemon, and what they run on. */
typedef struct ovld_jobs {
    ovld_backend_t *backend;
    ovld_across_t across;     /* jobs across nodes (across.h); .ctx NULL: none */
    const ovld_config_t *cfg; /* read at each use: a reload changes it */
    ovld_counters_t *counters;
    ovld_exec_pool_t *pool;  /* NULL: every rank is issued from one thread */
    ovld_issuer_t *issuer;   /* NULL: ops are issued on the loop thread (unit tests) */
    ovld_buffers_t *buffers; /* the memory generation (replay); NULL: never changes */
    /* `auto` that measures (tune.h), owned by the caller; NULL: auto
     * chooses by the rule alone (config tune off, or a backend without a
     * timer). */
    struct ovld_tune *tune;
    struct ovld_job *live; /* by id, for joining and status */
    struct ovld_job *dead; /* ranks all gone, completions outstanding */
    uint32_t njobs;        /* on live */
    uint64_t next_comm_id;
} ovld_jobs_t;

void ovld_jobs_init(ovld_jobs_t *js, ovld_backend_t *backend, const ovld_config_t *cfg,
                    ovld_counters_t *counters, ovld_exec_pool_t *pool, ovld_issuer_t *issuer,
                    ovld_buffers_t *buffers);

/* Whether no job is left, ended ones waiting for completions included. */
bool ovld_jobs_empty(const ovld_jobs_t *js);

/* Joins; on success *ret_member is the rank and *ret_db says how the
 * client opens its doorbell (its fd, if any, is the caller's). Refusals
 * name the limit or the conflict in err. */
ovl_status_t ovld_job_join(ovld_jobs_t *js, const ovld_join_desc_t *req, ovld_member_t **ret_member,
                           ovld_doorbell_export_t *ret_db, char *err, size_t errlen);

/* What ovld_job_join would refuse before anything is made (the device, the
 * limits, the job's state here), for a join across nodes to ask before it
 * asks the coordinator; *ret_dev: the device it would join on. */
ovl_status_t ovld_job_join_check(ovld_jobs_t *js, const ovld_join_desc_t *req, uint32_t *ret_dev,
                                 char *err, size_t errlen);

/* The cluster's callbacks (cluster.h): a job across nodes starts, an op of
 * it may run (or fails) on every node, the job ends. arg is the
 * ovld_jobs_t. */
void ovld_jobs_on_start(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                        const ovld_cluster_start_t *s);
void ovld_jobs_on_go(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                     const ovld_cluster_go_t *go);
void ovld_jobs_on_end(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN], bool abort,
                      ovl_status_t status, const char *why);

/* The issuer's on_hold (issuer.h, "Holds"; arg is the ovld_jobs_t, owner
 * the job): op seq of the job, issued while it had its GPUs to itself, has
 * waited held_ms for its clients' doorbells since another job came to
 * share one, holding that job's work up. The job is aborted
 * (OVL_ERR_LIMIT, naming hold_limit_ms) and its doorbells released, so
 * that the wait ends; its ranks' clients see the failure. */
void ovld_jobs_on_hold(void *arg, void *owner, uint64_t seq, uint64_t held_ms);
/* The issuer's owner_busy: whether the job (owner) has ops in flight or
 * pending. */
bool ovld_jobs_owner_busy(void *owner);

/* Leaves (CommDestroy, or the connection closed: why says which). The
 * member is the job's from now on: the caller forgets it. */
void ovld_job_leave(ovld_jobs_t *js, ovld_member_t *m, const char *why);

/*
 * Takes one rank's op, and the references of q->use (on every path).
 * Failures of the op ring its doorbell (OVL_OK is returned); an error
 * return (an op number out of order: a protocol error) is the
 * connection's, with a message in err. v says what the boundary found
 * wrong with the op, which fails op n on every rank as a disagreement does.
 */
ovl_status_t ovld_job_submit(ovld_jobs_t *js, ovld_member_t *m, const ovld_op_desc_t *q,
                             const ovld_op_verdict_t *v, char *err, size_t errlen);

/* Fails every op not yet running, in every job (shutdown). */
void ovld_job_fail_pending(ovld_jobs_t *js, ovl_status_t status, const char *why);

/* Ops issued and not yet done (and setups running), in all jobs. */
uint32_t ovld_job_running(const ovld_jobs_t *js);

/* The backend's completion callback (arg is the ovld_jobs_t). */
void ovld_job_on_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status,
                      const char *message, uint64_t ns);

/* ----------------------------------------------------- what callers see */

/* A member's comm id (unique in the daemon), rank, device and world. */
uint64_t ovld_member_comm_id(const ovld_member_t *m);
uint32_t ovld_member_rank(const ovld_member_t *m);
uint32_t ovld_member_device(const ovld_member_t *m);
uint32_t ovld_member_world(const ovld_member_t *m);
const char *ovld_member_job_id(const ovld_member_t *m);
/* The member's first failure, for CommCheck (OVL_OK, 0, "" if none). */
void ovld_member_error(const ovld_member_t *m, ovl_status_t *ret_status, uint64_t *ret_seq,
                       const char **ret_msg);

typedef enum ovld_job_state {
    OVLD_JOB_FORMING, /* not every rank has joined */
    OVLD_JOB_SETUP,   /* all in; the backend prepares (NCCL communicators) */
    OVLD_JOB_READY,
    OVLD_JOB_ENDING,  /* a rank left with nothing pending: no more ops */
    OVLD_JOB_ABORTED, /* a rank left or failed with ops pending */
} ovld_job_state_t;

const char *ovld_job_state_name(ovld_job_state_t s);

/* A live job as status shows it; the strings live as long as the job. */
typedef struct ovld_job_info {
    const char *id;
    uid_t owner;
    uint32_t world, joined;
    ovld_job_state_t state;
    uint64_t ops_done;
    uint32_t in_flight;
    const char *last_error;
    const int32_t *rank_devices; /* world entries: each rank's device, -1 if not joined */
    /* a job across nodes: its nodes (addresses) once started, this one's
     * index among them; nnodes 0 for a job of this node alone */
    uint32_t nnodes, self_node;
    const char *const *nodes;
} ovld_job_info_t;

/* Calls fn for every live job, in the order status lists them; info lives
 * only during the call. */
void ovld_jobs_foreach(const ovld_jobs_t *js, void (*fn)(const ovld_job_info_t *info, void *arg),
                       void *arg);

#endif /* OVLD_JOB_H */

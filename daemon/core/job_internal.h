/*
 * job_internal.h: what job.c (jobs and ranks) and opq.c (a job's op queue)
 * share. Nothing else includes it.
 */
#ifndef OVLD_JOB_INTERNAL_H
#define OVLD_JOB_INTERNAL_H

#include "job.h"
#include "plancache.h"
#include "replay.h"

struct ovld_member {
    struct ovld_job *job;
    bool attached; /* its client is still there (left: false) */
    pid_t pid;     /* the client's, for messages */
    uint32_t rank;
    uint32_t device;
    uint64_t comm_id;
    ovld_rank_t *brank;
    uint64_t next_seq; /* the op number expected next from the client */
    uint32_t window;   /* max_ops_in_flight as told to the client at join */
    ovl_status_t err;  /* the first failure, for CommCheck */
    uint64_t err_seq;
    char err_msg[256];
};

typedef struct ovld_job {
    char id[OVLD_JOB_ID_MAX + 1];
    uid_t owner;
    uint32_t world;
    uint32_t joined;
    ovld_job_state_t state;
    ovld_member_t **members; /* world entries, by rank; NULL until joined */
    bool shared_gpu;         /* some ranks share a device (known once all joined) */
    /* The op queue (opq.c). */
    struct ovld_op *ops; /* in seq order, oldest first */
    struct ovld_op *ops_tail;
    uint32_t in_flight;     /* op records whose completions are not all in */
    uint32_t running;       /* of those, on the streams (OVLD_MAX_ISSUED) */
    uint64_t ops_done;      /* completed without error */
    uint64_t scratch_bytes; /* gathered-A scratch every rank holds */
    bool setup_pending;     /* job_setup's callback has not run yet */
    uint32_t pins;          /* callers on the stack that still use the job */
    ovld_lane_t *lane;      /* where its ops and failures are issued, in order */
    /* Its captured ops (replay.h), the lane's to use; NULL: none (no
     * memory for it, or a backend that cannot capture). */
    ovld_replay_t *replay;
    /* Its ops' plans by their parameters (plancache.h); NULL: planned
     * anew for every op (replay_cache 0, or no memory for it). */
    ovld_plancache_t *plans;
    bool detached; /* every rank left; on dead until its ops are done */
    char last_error[256];
    /* A job across nodes (cluster.h): known by its nonce; this daemon runs
     * the ranks of its own node (nlocal of world, known at the start). */
    bool across;
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    bool started;      /* the coordinator's start came */
    uint32_t nlocal;   /* ranks served here */
    uint32_t *node_of; /* world entries, from the start */
    uint32_t nnodes, self_node;
    struct ovld_xfer_job *xfer; /* the host backend's rows to other nodes */
    struct ovld_job *next;
} ovld_job_t;

/* jobrec.c: a job's record, below job.c and opq.c */

/* Records m's first failure (for CommCheck). */
void ovld_member_fail(ovld_member_t *m, uint64_t seq, ovl_status_t st, const char *msg);
/* Whether any rank's client is still there. */
bool ovld_job_has_clients(const ovld_job_t *j);
/* A job with nobody in it and nothing running goes away. */
void ovld_job_maybe_free(ovld_jobs_t *js, ovld_job_t *j);
/* Ends the job for new ops (state ENDING or ABORTED) with why as its last
 * error. */
void ovld_job_end(ovld_job_t *j, ovld_job_state_t state, const char *why);
/* Frees j and what it holds (its lane, replays, plans, ranks, rows to
 * other nodes), now: nothing may run of it. */
void ovld_job_free(ovld_jobs_t *js, ovld_job_t *j);

/* opq.c */

/* Fails every op of j not yet issued ("what: why") and lets the queue
 * ring them; j may be freed after (ovld_job_maybe_free). */
void ovld_job_fail_rest(ovld_jobs_t *js, ovld_job_t *j, ovl_status_t status, const char *what,
                        const char *why);
/* A job across nodes cannot go on (a node lost, an op failed here after
 * its go, which would leave the other nodes waiting for this one): aborts
 * it here (pending ops fail, the backend's and xfer's waits on other nodes
 * end) and, with tell, on every node through the coordinator. */
void ovld_job_abort_across(ovld_jobs_t *js, ovld_job_t *j, ovl_status_t status, const char *why,
                           bool tell);

/* A job across nodes: the coordinator gave op seq its go (or its failure). */
void ovld_opq_go(ovld_jobs_t *js, ovld_job_t *j, uint64_t seq, const ovld_cluster_go_t *go);

/* Runs (or fails) every op at the head of j's queue that can go. */
void ovld_opq_progress(ovld_jobs_t *js, ovld_job_t *j);
/* Whether j has ops waiting for ranks or their turn. */
bool ovld_opq_pending(const ovld_job_t *j);
/* Fails every op of j not yet issued with status and message (the ops
 * ring in order as the window lets them: ovld_opq_progress). */
void ovld_opq_fail_waiting(ovld_job_t *j, ovl_status_t status, const char *msg);

#endif /* OVLD_JOB_INTERNAL_H */

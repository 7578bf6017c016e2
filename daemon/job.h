/*
 * job.h: jobs, their ranks, and op matching. Ranks join by (job id, world,
 * rank); every rank submits op n (numbered by the client, 1, 2, ...); once
 * every rank's op n is in and they agree, the op's plans are run; a
 * disagreement or a bad range fails op n on every rank. A rank that leaves
 * aborts the job: its pending ops fail on every rank, and later ops fail at
 * once. Loop thread only; logs at this boundary.
 */
#ifndef OVLD_JOB_H
#define OVLD_JOB_H

#include "ovld.h"
#include "plan.h"
#include "desc.h"

#define OVLD_MAX_ISSUED 4 /* ops of one job issued to the backend and not yet done */

typedef struct ovld_member {
    struct ovld_job *job;
    ovld_conn_t *conn; /* NULL once the client left */
    uint32_t rank;
    uint32_t device;
    uint64_t comm_id;
    ovld_rank_t *brank;
    uint64_t next_seq; /* the op number expected next from the client */
    uint32_t window;   /* max_ops_in_flight as told to the client at join */
    ovl_status_t err;  /* the first failure, for CommCheck */
    uint64_t err_seq;
    char err_msg[256];
    struct ovld_member *conn_next;
} ovld_member_t;

typedef enum ovld_job_state {
    OVLD_JOB_FORMING, /* not every rank has joined */
    OVLD_JOB_SETUP,   /* all in; the backend prepares (NCCL communicators) */
    OVLD_JOB_READY,
    OVLD_JOB_ENDING,  /* a rank left with nothing pending: no more ops */
    OVLD_JOB_ABORTED, /* a rank left or failed with ops pending */
} ovld_job_state_t;

typedef struct ovld_job {
    char id[OVLD_JOB_ID_MAX + 1];
    uid_t owner;
    uint32_t world;
    uint32_t joined;
    ovld_job_state_t state;
    ovld_member_t **members; /* world entries, by rank; NULL until joined */
    struct ovld_op *ops;     /* in seq order, oldest first */
    struct ovld_op *ops_tail;
    uint32_t in_flight;
    uint32_t running;
    uint64_t ops_done;
    uint64_t scratch_bytes; /* gathered-A scratch every rank holds */
    bool setup_pending;     /* job_setup's callback has not run yet */
    uint32_t pins;          /* callers on the stack that still use the job */
    bool detached;          /* every rank left; on ovld.dead_jobs until its ops are done */
    char last_error[256];
    struct ovld_job *next;
} ovld_job_t;

/* Joins; on success *ret_member is linked to the connection and *ret_db says
 * how the client opens its doorbell (its fd, if any, is the caller's). */
ovl_status_t ovld_job_join(ovld_t *d, ovld_conn_t *c, const ovld_join_desc_t *req,
                           ovld_member_t **ret_member, ovld_doorbell_export_t *ret_db, char *err,
                           size_t errlen);

/* The member of connection c with this comm id, or NULL. */
ovld_member_t *ovld_job_member(ovld_conn_t *c, uint64_t comm_id);

/* Fills in what an op or a Plan request left to ovld: chunks and streams
 * from the config when 0, AUTO from default_algo, then the planner's choice.
 * The one place these defaults are applied. */
void ovld_plan_resolve(const ovld_t *d, ovl_plan_params_t *p);

/* Leaves (CommDestroy, or the connection closed: why says which). */
void ovld_job_leave(ovld_t *d, ovld_member_t *m, const char *why);

/* Takes one rank's op. Failures of the op ring the doorbell (OVL_OK is
 * returned); an error return (an op number out of order: a protocol error)
 * is the connection's, with a message in err. invalid: what the boundary
 * found wrong with the op (OVL_OK if nothing; request.h), which fails op n
 * on every rank, as a disagreement does. */
ovl_status_t ovld_job_submit(ovld_t *d, ovld_member_t *m, const ovld_op_desc_t *req,
                             ovl_status_t invalid, const char *invalid_msg, char *err,
                             size_t errlen);

/* Fails every op not yet running, in every job (shutdown). */
void ovld_job_fail_pending(ovld_t *d, ovl_status_t status, const char *why);

/* Ops issued and not yet done, in all jobs. */
uint32_t ovld_job_running(const ovld_t *d);

/* The backend's completion callback (arg is the ovld_t). */
void ovld_job_on_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status,
                      const char *message);

const char *ovld_job_state_name(ovld_job_state_t s);

#endif /* OVLD_JOB_H */

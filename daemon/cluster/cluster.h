/*
 * cluster.h: jobs across nodes, between the ovld of their nodes
 * (docs/multinode.md, "Jobs across nodes"). One module, two roles:
 *
 *  - the coordinator: the ovld that made a job's id (ovld_cluster_job_id_
 *    create) admits its ranks, whichever node they join on; once every
 *    rank is in, it numbers the nodes, makes the backend's job key (CUDA:
 *    the ncclUniqueId) and starts the job on every node (JobStart); it
 *    matches each op across the nodes (every node's OpReady in, the same
 *    fields everywhere: OpGo, with the parameters resolved once, or the
 *    op's failure, naming the field and the ranks); it ends or aborts the
 *    job everywhere when a rank leaves or a node goes down;
 *  - a node (the coordinator's own included): asks the coordinator to
 *    admit its ranks, and hands what it hears (start, go, end) to the jobs
 *    layer through callbacks.
 *
 * Messages go over the peers' links (peer.h), types 16..31
 * (proto/cluster.proto); the coordinator's messages to itself take the
 * same path through a local queue, so that every callback runs from the
 * loop, never from inside a call of this module. Every field of a peer's
 * message is checked before use; a message that does not check out is
 * dropped, counted and logged, and aborts the job it names when its sender
 * is one of the job's nodes.
 *
 * Limits, each named in its refusal: ids made and not yet complete per
 * uid (max_jobs_per_uid) and in all (max_jobs); an id nobody joins expires
 * after OVLD_JOB_ID_TTL_MS; ops matched at once per job
 * (OVLD_CLUSTER_MAX_TALLIES). Loop thread only.
 */
#ifndef OVLD_CLUSTER_H
#define OVLD_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "across.h"
#include "backend.h"
#include "config.h"
#include "desc.h"
#include "jobid.h"
#include "peer.h"
#include "stats.h"

struct ovld_tune; /* core/tune.h */

#define OVLD_CLUSTER_TYPE_FIRST  16
#define OVLD_CLUSTER_TYPE_LAST   31
#define OVLD_JOB_ID_TTL_MS       (10 * 60 * 1000) /* an id nobody joined expires */
#define OVLD_CLUSTER_MAX_TALLIES 1024             /* ops of one job being matched */

typedef struct ovld_cluster ovld_cluster_t;
struct ovld_xfer;
struct ovld_xfer_job;

/* The jobs layer's ends (job.h), called from the loop. */
typedef struct ovld_cluster_cb {
    void (*on_start)(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                     const ovld_cluster_start_t *s);
    void (*on_go)(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                  const ovld_cluster_go_t *go);
    /* abort: fail what is pending and stop (a node or a rank was lost);
     * else only take no more ops */
    void (*on_end)(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN], bool abort,
                   ovl_status_t status, const char *why);
    void *arg;
} ovld_cluster_cb_t;

/* ps, x (NULL: no host rows between nodes), backend, cfg and counters
 * outlive the module. */
ovl_status_t ovld_cluster_create(uv_loop_t *loop, ovld_peers_t *ps, struct ovld_xfer *x,
                                 ovld_backend_t *backend, const ovld_config_t *cfg,
                                 ovld_counters_t *counters, const ovld_cluster_cb_t *cb,
                                 ovld_cluster_t **ret);
/* Fails admissions still waiting (OVL_ERR_SHUTDOWN) and frees everything
 * once libuv closed its handles; before ovld_peers_close. */
void ovld_cluster_close(ovld_cluster_t *cl);

/* The peers' on_message for types 16..31, and their on_down. */
void ovld_cluster_on_message(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                             size_t len);
void ovld_cluster_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *why);

/* A new job's id, coordinated here, for uid. */
ovl_status_t ovld_cluster_job_id_create(ovld_cluster_t *cl, uid_t uid,
                                        uint8_t out[OVLD_JOB_BLOB_LEN], char *err, size_t errlen);

/*
 * Asks the job's coordinator to admit rank of world for uid, joining on
 * this node on device (this ovld's numbering: the coordinator learns from
 * it which ranks of a node share a GPU). done runs once, from the loop, never inside this call:
 * OVL_OK, or the refusal in words (an id not made there or by an earlier
 * run: OVL_ERR_NOT_FOUND; another uid's job: OVL_ERR_PERMISSION; world:
 * OVL_ERR_MISMATCH; rank taken: OVL_ERR_EXISTS; coordinator unreachable or
 * down: OVL_ERR_CONNECT, OVL_ERR_ABORTED; no answer: OVL_ERR_TIMEOUT). An
 * error return (no peers, a limit) means done will not run. After OVL_OK
 * the caller joins the rank locally, or says it left (ovld_cluster_leave).
 */
typedef void (*ovld_cluster_admit_fn)(void *arg, ovl_status_t status, const char *why);
ovl_status_t ovld_cluster_admit(ovld_cluster_t *cl, const ovld_job_blob_t *blob, uint32_t world,
                                uint32_t rank, uint32_t device, uid_t uid,
                                ovld_cluster_admit_fn done, void *arg, char *err, size_t errlen);

/* Op seq of the job is in on this node (ops in order). */
void ovld_cluster_op_ready(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                           uint64_t seq, const ovld_cluster_ready_t *r);
/* A rank of the job left this node (abort: with ops pending), or, with
 * rank UINT32_MAX, this node aborts the job (an op failed here after its
 * go). */
void ovld_cluster_leave(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint32_t rank,
                        bool abort, const char *why);
/* The job is gone on this node: forget its record here. */
void ovld_cluster_forget(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN]);
/* A timed op (its go said timed) is done on this node: how it ended
 * (tune.h's ovld_tune_outcome_t) and its device time (0: none), to the
 * coordinator, whose tuning table it is for. */
void ovld_cluster_op_time(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                          uint32_t outcome, uint64_t ns);
/* The tuning table (core/tune.h) this ovld measures the ops of the jobs
 * it coordinates with (NULL: auto chooses by the rule for them); it must
 * outlive the module. */
void ovld_cluster_set_tune(ovld_cluster_t *cl, struct ovld_tune *tune);

/* The job's nodes as this node knows them (addresses, from its start on);
 * 0 before. */
uint32_t ovld_cluster_job_nodes(const ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                                const char *const **ret_nodes);

/* The calls above as the jobs layer takes them (across.h): what main
 * gives ovld_jobs_t once the module exists. */
ovld_across_t ovld_cluster_across(ovld_cluster_t *cl);

#endif /* OVLD_CLUSTER_H */

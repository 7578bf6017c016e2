/*
 * cluster_internal.h: what the files of the cluster module (cluster.h)
 * share. Nothing else includes it.
 *
 *  - cluster.c: the module's life (create, close), the messages in (each
 *    decoded by cluster_wire.c, then handed to its role), a peer down, the
 *    tick, and the table the jobs layer calls (ovld_cluster_across);
 *  - cluster_coord.c: the coordinator: ids, admission, JobStart, each op
 *    matched across the nodes (OpReady, OpGo), the end everywhere;
 *  - cluster_node.c: a node's part: asking to be admitted, handing start,
 *    go and end to the jobs layer, and the way out for both roles
 *    (ovld_cluster_send: to a peer, or to this ovld through the local
 *    queue).
 *
 * Calls go one way: cluster.c to both roles, the coordinator to the node's
 * ovld_cluster_send, both to cluster_wire.c; the local queue reaches the
 * dispatcher of cluster.c through the function it is drained with. Each
 * role keeps its records private (cluster_coord.c: cjob_t; cluster_node.c:
 * admit_t, mjob_t, the queue's messages). Loop thread only.
 */
#ifndef OVLD_CLUSTER_INTERNAL_H
#define OVLD_CLUSTER_INTERNAL_H

#include <string.h>

#include "cluster.h"
#include "cluster_wire.h"

_Static_assert(OVLD_CLUSTER_KEY_LEN == OVLD_NCCL_ID_LEN, "a job key on the wire is an NCCL id");

struct cl_admit;
struct cl_mjob;
struct cl_cjob;
struct cl_selfmsg;

struct ovld_cluster {
    uv_loop_t *loop;
    ovld_peers_t *ps;
    struct ovld_xfer *xfer;
    ovld_backend_t *backend;
    const ovld_config_t *cfg;
    ovld_counters_t *counters;
    ovld_cluster_cb_t cb;
    uv_async_t wake; /* the local queue is not empty */
    uv_timer_t tick;
    int handles_open;
    bool closing;
    /* cluster_node.c's */
    struct cl_selfmsg *self_head, *self_tail; /* the local queue */
    struct cl_admit *admits;
    uint64_t next_req;
    struct cl_mjob *mjobs;
    /* cluster_coord.c's */
    struct cl_cjob *cjobs;
    struct ovld_tune *tune; /* auto that measures (core/tune.h); NULL: the rule */
};

static inline void ovld_cluster_count_drop(ovld_cluster_t *cl)
{
    OVLD_COUNT(cl->counters, peer_errors, 1);
}

static inline bool ovld_cluster_nonce_eq(const uint8_t *a, const uint8_t *b)
{
    return memcmp(a, b, OVLD_JOB_NONCE_LEN) == 0;
}

static inline void ovld_cluster_job_name(const uint8_t *nonce, char out[19])
{
    ovld_job_blob_t b = {0};
    memcpy(b.nonce, nonce, OVLD_JOB_NONCE_LEN);
    ovld_job_blob_name(&b, out);
}

/* A node's name for messages: the peer's, or this ovld's (p NULL). */
static inline const char *ovld_cluster_node_name(const ovld_cluster_t *cl, const ovld_peer_t *p)
{
    return p ? ovld_peer_name(p) : ovld_peers_self(cl->ps);
}

/*
 * The handlers of the messages in, one per type, each in its role's file:
 * from the sender (NULL: this ovld), m decoded, st the decoder's verdict
 * (OVL_OK, or a refusal of a message that unpacked, err its words: what of
 * m is known then is in cluster_wire.h). A refusal is the handler's to
 * count, answer or charge to its job, as each message's rules say.
 */
typedef void (*ovld_cluster_handler_fn)(ovld_cluster_t *cl, ovld_peer_t *from,
                                        const ovld_cluster_msg_t *m, ovl_status_t st,
                                        const char *err);
/* a node's (cluster_node.c): JobJoinReply, JobStart, OpGo, JobEnd */
void ovld_cluster_node_on_join_reply(ovld_cluster_t *cl, ovld_peer_t *from,
                                     const ovld_cluster_msg_t *m, ovl_status_t st, const char *err);
void ovld_cluster_node_on_start(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                                ovl_status_t st, const char *err);
void ovld_cluster_node_on_go(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                             ovl_status_t st, const char *err);
void ovld_cluster_node_on_end(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                              ovl_status_t st, const char *err);
/* the coordinator's (cluster_coord.c): JobJoin, OpReady, JobLeave, OpTime */
void ovld_cluster_coord_on_join(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                                ovl_status_t st, const char *err);
void ovld_cluster_coord_on_ready(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                                 ovl_status_t st, const char *err);
void ovld_cluster_coord_on_leave(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                                 ovl_status_t st, const char *err);
void ovld_cluster_coord_on_time(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *m,
                                ovl_status_t st, const char *err);

/* ------------------------------------------------ cluster_node.c */

/* Encodes m and sends it to p (NULL: to this ovld, through the local
 * queue, delivered from the loop). A failure is the link's (peer down: its
 * on_down follows) or a limit: the caller's job sees it through on_down,
 * or a lost message is logged. */
ovl_status_t ovld_cluster_send(ovld_cluster_t *cl, ovld_peer_t *p, const ovld_cluster_msg_t *m);

/* Hands every message of the local queue to deliver (not those deliver
 * sends itself: they wait for the next round), unless the module is
 * closing, and frees them. */
typedef void (*ovld_cluster_deliver_fn)(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type,
                                        const uint8_t *body, size_t len);
void ovld_cluster_node_drain(ovld_cluster_t *cl, ovld_cluster_deliver_fn deliver);

/* Peer p is down (msg: "node P is down: WHY"): joins waiting for it fail,
 * jobs of this node it coordinates or serves abort. */
void ovld_cluster_node_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *why,
                               const char *msg);
/* Joins that waited past their deadline fail (OVL_ERR_TIMEOUT). */
void ovld_cluster_node_tick(ovld_cluster_t *cl, uint64_t now);
/* Fails the joins still waiting (OVL_ERR_SHUTDOWN), drops the local queue,
 * frees the node's records. */
void ovld_cluster_node_close(ovld_cluster_t *cl);

/* ----------------------------------------------- cluster_coord.c */

/* Peer p is down (msg as above): jobs coordinated here with ranks on it
 * free their places (forming) or abort. */
void ovld_cluster_coord_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *msg);
/* Ids nobody joined within OVLD_JOB_ID_TTL_MS expire. */
void ovld_cluster_coord_tick(ovld_cluster_t *cl, uint64_t now);
/* Frees the coordinator's records. */
void ovld_cluster_coord_close(ovld_cluster_t *cl);

#endif /* OVLD_CLUSTER_INTERNAL_H */

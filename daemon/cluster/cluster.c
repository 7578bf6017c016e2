/*
 * cluster.c: jobs across nodes (cluster.h): the module's life, the
 * messages in (decoded by cluster_wire.c, then handed to the coordinator,
 * cluster_coord.c, or to the node's part, cluster_node.c), a peer that
 * goes down, the tick, and the calls the jobs layer makes
 * (ovld_cluster_across). What the files share: cluster_internal.h.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cluster_internal.h"
#include "log.h"

#define TICK_MS 250

/* ------------------------------------------------------ messages in */

/* Each message type's handler, in its role's file. */
static const ovld_cluster_handler_fn handlers[] = {
    [OVLD_CLUSTER_JOB_JOIN - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_coord_on_join,
    [OVLD_CLUSTER_JOB_JOIN_REPLY - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_node_on_join_reply,
    [OVLD_CLUSTER_JOB_START - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_node_on_start,
    [OVLD_CLUSTER_OP_READY - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_coord_on_ready,
    [OVLD_CLUSTER_OP_GO - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_node_on_go,
    [OVLD_CLUSTER_JOB_LEAVE - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_coord_on_leave,
    [OVLD_CLUSTER_JOB_END - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_node_on_end,
    [OVLD_CLUSTER_OP_TIME - OVLD_CLUSTER_JOB_JOIN] = ovld_cluster_coord_on_time,
};

/* A message from p (NULL: this ovld): decoded, then its role's. One that
 * does not unpack is dropped here; a refusal of one that did is its
 * handler's (cluster_internal.h). */
static void dispatch(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                     size_t len)
{
    ovld_cluster_msg_t m;
    char err[256] = "";
    ovl_status_t st = ovld_cluster_decode(type, body, len, &m, err, sizeof(err));
    if (st != OVL_OK && !m.unpacked) {
        log_warn("cluster: %s message %u from %s; dropped",
                 ovld_cluster_type_known(type) ? "a malformed" : "an unknown", type,
                 ovld_cluster_node_name(cl, p));
        ovld_cluster_count_drop(cl);
        return;
    }
    if (st != OVL_OK)
        log_debug("cluster: from %s: %s", ovld_cluster_node_name(cl, p), err);
    handlers[type - OVLD_CLUSTER_JOB_JOIN](cl, p, &m, st, err);
    ovld_cluster_msg_clear(&m);
}

void ovld_cluster_on_message(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                             size_t len)
{
    if (!cl->closing)
        dispatch(cl, p, type, body, len);
}

/* The local queue: this ovld's messages to itself. */
static void on_wake(uv_async_t *h)
{
    ovld_cluster_node_drain(h->data, dispatch);
}

void ovld_cluster_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *why)
{
    char msg[OVLD_CLUSTER_REASON_MAX + 96];
    snprintf(msg, sizeof(msg), "node %s is down: %s", ovld_peer_name(p), why);
    /* joins waiting for that coordinator, jobs of this node it coordinates
     * or serves; then jobs coordinated here with ranks on that node */
    ovld_cluster_node_on_down(cl, p, why, msg);
    ovld_cluster_coord_on_down(cl, p, msg);
}

/* Joins that waited too long, and expired ids. */
static void on_tick(uv_timer_t *t)
{
    ovld_cluster_t *cl = t->data;
    uint64_t now = uv_now(cl->loop);
    ovld_cluster_node_tick(cl, now);
    ovld_cluster_coord_tick(cl, now);
}

/* -------------------------------------------------------- lifetime */

static void on_handle_closed(uv_handle_t *h)
{
    ovld_cluster_t *cl = h->data;
    if (--cl->handles_open == 0)
        free(cl);
}

ovl_status_t ovld_cluster_create(uv_loop_t *loop, ovld_peers_t *ps, struct ovld_xfer *x,
                                 ovld_backend_t *backend, const ovld_config_t *cfg,
                                 ovld_counters_t *counters, const ovld_cluster_cb_t *cb,
                                 ovld_cluster_t **ret)
{
    ovld_cluster_t *cl = calloc(1, sizeof(*cl));
    if (!cl)
        return OVL_ERR_NOMEM;
    *cl = (ovld_cluster_t){.loop = loop,
                           .ps = ps,
                           .xfer = x,
                           .backend = backend,
                           .cfg = cfg,
                           .counters = counters,
                           .cb = *cb};
    if (uv_async_init(loop, &cl->wake, on_wake) != 0) {
        free(cl);
        return OVL_ERR_SYSTEM;
    }
    cl->wake.data = cl;
    cl->handles_open = 1;
    if (uv_timer_init(loop, &cl->tick) != 0) {
        cl->closing = true;
        uv_close((uv_handle_t *)&cl->wake, on_handle_closed); /* frees cl */
        return OVL_ERR_SYSTEM;
    }
    cl->tick.data = cl;
    cl->handles_open = 2;
    uv_timer_start(&cl->tick, on_tick, TICK_MS, TICK_MS);
    uv_unref((uv_handle_t *)&cl->tick);
    *ret = cl;
    return OVL_OK;
}

void ovld_cluster_set_tune(ovld_cluster_t *cl, struct ovld_tune *tune)
{
    if (cl)
        cl->tune = tune;
}

void ovld_cluster_close(ovld_cluster_t *cl)
{
    if (!cl)
        return;
    cl->closing = true;
    ovld_cluster_node_close(cl);
    ovld_cluster_coord_close(cl);
    uv_timer_stop(&cl->tick);
    uv_close((uv_handle_t *)&cl->wake, on_handle_closed);
    uv_close((uv_handle_t *)&cl->tick, on_handle_closed);
}

/* ------------------------------------------------- the jobs layer */

static void across_op_ready(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                            const ovld_cluster_ready_t *r)
{
    ovld_cluster_op_ready(ctx, nonce, seq, r);
}

static void across_leave(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint32_t rank,
                         bool abort, const char *why)
{
    ovld_cluster_leave(ctx, nonce, rank, abort, why);
}

static void across_forget(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN])
{
    ovld_cluster_forget(ctx, nonce);
}

static void across_op_time(void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                           uint32_t outcome, uint64_t ns)
{
    ovld_cluster_op_time(ctx, nonce, seq, outcome, ns);
}

static uint32_t across_job_nodes(const void *ctx, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                                 const char *const **ret_nodes)
{
    return ovld_cluster_job_nodes(ctx, nonce, ret_nodes);
}

ovld_across_t ovld_cluster_across(ovld_cluster_t *cl)
{
    return (ovld_across_t){.ctx = cl,
                           .op_ready = across_op_ready,
                           .leave = across_leave,
                           .forget = across_forget,
                           .op_time = across_op_time,
                           .job_nodes = across_job_nodes};
}

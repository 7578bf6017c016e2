/*
 * cluster_node.c: a node's part of jobs across nodes (cluster.h; the
 * coordinator's own node included): asking the job's coordinator to admit
 * its ranks, the jobs as this node knows them, handing start, go and end
 * to the jobs layer through its callbacks, telling the coordinator of ops
 * and ranks that leave; and the way out for both roles
 * (ovld_cluster_send), with the local queue of this ovld's messages to
 * itself.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_internal.h"
#include "log.h"
#include "xfer.h"

/* A join this node asked the coordinator about. */
typedef struct cl_admit {
    uint64_t req;
    uint32_t rank;
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    ovld_peer_t *coord; /* NULL: the coordinator is this ovld */
    uint64_t deadline_ms;
    ovld_cluster_admit_fn done;
    void *arg;
    struct cl_admit *next;
} admit_t;

/* A job as a node knows it: where its coordinator is, and (once started)
 * its nodes. */
typedef struct cl_mjob {
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    ovld_peer_t *coord; /* NULL: this ovld */
    bool started, ended;
    uint32_t nnodes, self_node;
    ovld_peer_t **peers; /* per node; NULL for this one */
    char **names;        /* per node: its address */
    struct cl_mjob *next;
} mjob_t;

/* A message to this ovld itself, delivered from the loop. */
typedef struct cl_selfmsg {
    uint32_t type;
    size_t len;
    uint8_t *body; /* the encoder's */
    struct cl_selfmsg *next;
} selfmsg_t;

/* A text into a message's buffer, cut to fit. */
static void set_text(char *dst, size_t len, const char *s)
{
    snprintf(dst, len, "%s", s ? s : "");
}

/* ---------------------------------------------------------- sending */

ovl_status_t ovld_cluster_send(ovld_cluster_t *cl, ovld_peer_t *p, const ovld_cluster_msg_t *m)
{
    uint8_t *body;
    size_t len;
    if (ovld_cluster_encode(m, &body, &len) != OVL_OK) {
        log_error("cluster: out of memory for a message to %s",
                  p ? ovld_peer_name(p) : "this ovld");
        return OVL_ERR_NOMEM;
    }
    if (!p) {
        selfmsg_t *s = malloc(sizeof(*s));
        if (!s) {
            free(body);
            log_error("cluster: out of memory for a message to this ovld");
            return OVL_ERR_NOMEM;
        }
        *s = (selfmsg_t){.type = m->type, .len = len, .body = body};
        if (cl->self_tail)
            cl->self_tail->next = s;
        else
            cl->self_head = s;
        cl->self_tail = s;
        uv_async_send(&cl->wake);
        return OVL_OK;
    }
    ovl_status_t st = ovld_peer_send(p, m->type, body, len);
    free(body);
    if (st != OVL_OK)
        log_warn("cluster: message %u to %s not sent: %s", m->type, ovld_peer_name(p),
                 ovl_strerror(st));
    return st;
}

void ovld_cluster_node_drain(ovld_cluster_t *cl, ovld_cluster_deliver_fn deliver)
{
    /* Messages deliver sends to this ovld wait for the next round. */
    selfmsg_t *m = cl->self_head;
    cl->self_head = cl->self_tail = NULL;
    while (m) {
        selfmsg_t *next = m->next;
        if (!cl->closing)
            deliver(cl, NULL, m->type, m->body, m->len);
        free(m->body);
        free(m);
        m = next;
    }
}

/* ------------------------------------------------------------ jobs */

static mjob_t *mjob_find(ovld_cluster_t *cl, const uint8_t *nonce)
{
    for (mjob_t *m = cl->mjobs; m; m = m->next)
        if (ovld_cluster_nonce_eq(m->nonce, nonce))
            return m;
    return NULL;
}

/* Forgets the job's nodes (their names and links). */
static void mjob_clear_nodes(mjob_t *m)
{
    for (uint32_t i = 0; m->names && i < m->nnodes; i++)
        free(m->names[i]);
    free(m->names);
    free(m->peers);
    m->names = NULL;
    m->peers = NULL;
    m->nnodes = 0;
}

static void mjob_free(mjob_t *m)
{
    mjob_clear_nodes(m);
    free(m);
}

static mjob_t *mjob_get(ovld_cluster_t *cl, const uint8_t *nonce, ovld_peer_t *coord)
{
    mjob_t *m = mjob_find(cl, nonce);
    if (m)
        return m;
    m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    memcpy(m->nonce, nonce, OVLD_JOB_NONCE_LEN);
    m->coord = coord;
    m->next = cl->mjobs;
    cl->mjobs = m;
    return m;
}

void ovld_cluster_forget(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN])
{
    if (!cl)
        return;
    for (mjob_t **pp = &cl->mjobs; *pp; pp = &(*pp)->next)
        if (ovld_cluster_nonce_eq((*pp)->nonce, nonce)) {
            mjob_t *m = *pp;
            *pp = m->next;
            mjob_free(m);
            return;
        }
}

uint32_t ovld_cluster_job_nodes(const ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                                const char *const **ret_nodes)
{
    for (const mjob_t *m = cl ? cl->mjobs : NULL; m; m = m->next)
        if (ovld_cluster_nonce_eq(m->nonce, nonce) && m->started) {
            *ret_nodes = (const char *const *)m->names;
            return m->nnodes;
        }
    return 0;
}

/* Ends a job on this node (once): the jobs layer hears it. */
static void mjob_end(ovld_cluster_t *cl, mjob_t *m, bool abort, ovl_status_t st, const char *why)
{
    if (m->ended && !abort)
        return;
    m->ended = true;
    cl->cb.on_end(cl->cb.arg, m->nonce, abort, st, why);
}

/* ------------------------------------------------------- admission */

/*
 * Whether a job id of uid's may make this ovld connect to its coordinator
 * at a (addr in words; the job's name): a job id is the application's
 * input, and without this any user could have ovld open connections to any
 * address and port, which is what `ovlctl peer ping` keeps to root and
 * ovld's own user. With peer_allow set, the coordinator must be in one of
 * its networks, whoever asks; unset, root and ovld's own user may name any
 * node, others only one linked already (it proved it holds the key).
 * OVL_ERR_PERMISSION with err naming the rule.
 */
static ovl_status_t coordinator_allowed(const ovld_cluster_t *cl, const struct sockaddr_storage *a,
                                        const char *addr, const char *name, uid_t uid, char *err,
                                        size_t errlen)
{
    if (cl->cfg->n_peer_allow > 0) {
        if (ovld_config_peer_allowed(cl->cfg, a))
            return OVL_OK;
        snprintf(err, errlen,
                 "job %s: its coordinator %s is in no network of peer_allow: ovld connects only "
                 "to the nodes its configuration allows (docs/config.md)",
                 name, addr);
        return OVL_ERR_PERMISSION;
    }
    if (uid == 0 || uid == getuid() || ovld_peers_is_up_at(cl->ps, a))
        return OVL_OK;
    snprintf(err, errlen,
             "job %s: its coordinator %s is not linked to this node, and with peer_allow unset "
             "only root or ovld's own user (uid %u) may make ovld connect to a new node "
             "(docs/config.md, peer_allow)",
             name, addr, (unsigned)getuid());
    return OVL_ERR_PERMISSION;
}

ovl_status_t ovld_cluster_admit(ovld_cluster_t *cl, const ovld_job_blob_t *blob, uint32_t world,
                                uint32_t rank, uint32_t device, uid_t uid,
                                ovld_cluster_admit_fn done, void *arg, char *err, size_t errlen)
{
    if (cl->closing) {
        snprintf(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    char addr[OVLD_ADDR_TEXT_MAX], name[19];
    ovld_peer_addr_format(&blob->coordinator, addr, sizeof(addr));
    ovld_job_blob_name(blob, name);
    ovld_peer_t *coord = NULL;
    if (strcmp(addr, ovld_peers_self(cl->ps)) != 0) {
        ovl_status_t st = coordinator_allowed(cl, &blob->coordinator, addr, name, uid, err, errlen);
        if (st != OVL_OK)
            return st;
        st = ovld_peers_get(cl->ps, &blob->coordinator, &coord, err, errlen);
        if (st != OVL_OK)
            return st;
    } else if (memcmp(blob->instance, ovld_peers_instance(cl->ps), OVLD_INSTANCE_LEN) != 0) {
        snprintf(err, errlen,
                 "job id %s was made by an earlier run of this ovld (%s), which restarted since: "
                 "make a new id",
                 name, addr);
        return OVL_ERR_NOT_FOUND;
    }
    mjob_t *mj = mjob_find(cl, blob->nonce);
    if (mj && mj->coord != coord) {
        snprintf(err, errlen, "job %s: its id names another coordinator than this node's ranks had",
                 name);
        return OVL_ERR_MISMATCH;
    }
    admit_t *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    a->req = ++cl->next_req;
    a->rank = rank;
    memcpy(a->nonce, blob->nonce, OVLD_JOB_NONCE_LEN);
    a->coord = coord;
    a->deadline_ms = uv_now(cl->loop) + 2ull * cl->cfg->peer_timeout_ms + 1000;
    a->done = done;
    a->arg = arg;
    ovld_cluster_msg_t q = {.type = OVLD_CLUSTER_JOB_JOIN};
    memcpy(q.nonce, blob->nonce, OVLD_JOB_NONCE_LEN);
    q.join.req = a->req;
    memcpy(q.join.instance, blob->instance, OVLD_INSTANCE_LEN);
    q.join.world = world;
    q.join.rank = rank;
    q.join.uid = (uint32_t)uid;
    set_text(q.join.backend, sizeof(q.join.backend), cl->backend->ops->name);
    q.join.device = device;
    ovl_status_t st = ovld_cluster_send(cl, coord, &q);
    if (st != OVL_OK) {
        free(a);
        snprintf(err, errlen, "cannot reach the job's coordinator %s: %s", addr, ovl_strerror(st));
        return st == OVL_ERR_CLOSED ? OVL_ERR_CONNECT : st;
    }
    a->next = cl->admits;
    cl->admits = a;
    return OVL_OK;
}

/* Takes admission req off the list (NULL if it is not there). */
static admit_t *admit_take(ovld_cluster_t *cl, uint64_t req, ovld_peer_t *from)
{
    for (admit_t **pp = &cl->admits; *pp; pp = &(*pp)->next)
        if ((*pp)->req == req && (*pp)->coord == from) {
            admit_t *a = *pp;
            *pp = a->next;
            return a;
        }
    return NULL;
}

void ovld_cluster_node_on_join_reply(ovld_cluster_t *cl, ovld_peer_t *from,
                                     const ovld_cluster_msg_t *msg, ovl_status_t st,
                                     const char *err)
{
    (void)err;
    const ovld_cluster_join_reply_msg_t *r = &msg->join_reply;
    /* (a reply that unpacked is never refused: its status is checked) */
    admit_t *a = st == OVL_OK ? admit_take(cl, r->req, from) : NULL;
    if (!a) {
        log_debug("cluster: an answer from %s to no join of ours (%" PRIu64 ")",
                  ovld_cluster_node_name(cl, from), r->req);
        ovld_cluster_count_drop(cl);
        return;
    }
    char why[OVLD_CLUSTER_REASON_MAX + 1];
    set_text(why, sizeof(why), r->reason);
    ovl_status_t rst = r->status;
    if (rst == OVL_OK && !mjob_get(cl, a->nonce, a->coord)) {
        rst = OVL_ERR_NOMEM;
        snprintf(why, sizeof(why), "out of memory");
        /* the coordinator counts the rank in: say it left */
        ovld_cluster_msg_t q = {.type = OVLD_CLUSTER_JOB_LEAVE};
        memcpy(q.nonce, a->nonce, OVLD_JOB_NONCE_LEN);
        q.leave.rank = a->rank;
        set_text(q.leave.reason, sizeof(q.leave.reason), "its node ran out of memory");
        (void)ovld_cluster_send(cl, a->coord, &q);
    }
    a->done(a->arg, rst, why);
    free(a);
}

/* ----------------------------------------------------------- start */

/* The start fails on this node: the coordinator and the jobs layer hear
 * why. */
static void start_fail(ovld_cluster_t *cl, mjob_t *m, const char *name, ovl_status_t st,
                       const char *err)
{
    char why[320];
    snprintf(why, sizeof(why), "cannot start on this node: %s", err[0] ? err : ovl_strerror(st));
    log_error("cluster: job %s: %s", name, why);
    ovld_cluster_leave(cl, m->nonce, UINT32_MAX, true, why);
    mjob_end(cl, m, true, st, why);
}

/* Starts job m from the coordinator's checked start s: its nodes' links,
 * its rail groups, its rows between nodes, then the jobs layer's start. */
static void start_job(ovld_cluster_t *cl, mjob_t *m, const char *name,
                      const ovld_cluster_start_msg_t *s)
{
    uint32_t world = s->world, nn = s->nnodes, nrail = s->nrail_keys;
    /* with rail keys: each rank's rail group and place in it */
    uint32_t *rail = nrail ? calloc(2 * (size_t)world, sizeof(*rail)) : NULL;
    mjob_clear_nodes(m); /* (a start that failed before) */
    m->peers = calloc(nn, sizeof(*m->peers));
    m->names = calloc(nn, sizeof(*m->names));
    char err[256] = "";
    ovl_status_t st = m->peers && m->names && (!nrail || rail) ? OVL_OK : OVL_ERR_NOMEM;
    if (st == OVL_OK)
        m->nnodes = nn;
    for (uint32_t n = 0; st == OVL_OK && n < nn; n++) {
        const char *text = s->nodes[n];
        if (!(m->names[n] = strdup(text))) {
            st = OVL_ERR_NOMEM;
            break;
        }
        if (n == s->self_node)
            continue;
        struct sockaddr_storage ss;
        char canon[OVLD_ADDR_TEXT_MAX];
        st = ovld_peer_addr_parse(text, &ss, canon, err, sizeof(err));
        if (st == OVL_OK)
            st = ovld_peers_get(cl->ps, &ss, &m->peers[n], err, sizeof(err));
    }
    if (st == OVL_OK && nrail)
        st = ovld_cluster_start_rails(s, rail, rail + world, err, sizeof(err));
    struct ovld_xfer_job *xj = NULL;
    if (st == OVL_OK && cl->xfer)
        st = ovld_xfer_job_create(cl->xfer, m->nonce, world, s->node_of, s->self_node, m->peers, nn,
                                  &xj, err, sizeof(err));
    if (st != OVL_OK) {
        free(rail);
        start_fail(cl, m, name, st, err);
        return;
    }
    m->started = true;
    m->self_node = s->self_node;
    ovld_cluster_start_t start = {.world = world,
                                  .node_of = s->node_of,
                                  .nnodes = nn,
                                  .self_node = m->self_node,
                                  .nodes = (const char *const *)m->names,
                                  .key = s->has_key ? s->key : NULL,
                                  .rail_keys = s->rail_keys,
                                  .nrail_keys = nrail,
                                  .rail_group = rail,
                                  .rail_pos = rail ? rail + world : NULL,
                                  .xfer = xj};
    cl->cb.on_start(cl->cb.arg, m->nonce, &start);
    free(rail);
}

void ovld_cluster_node_on_start(ovld_cluster_t *cl, ovld_peer_t *from,
                                const ovld_cluster_msg_t *msg, ovl_status_t st, const char *err)
{
    (void)err;
    char name[19];
    if (!msg->named) {
        ovld_cluster_count_drop(cl);
        return;
    }
    ovld_cluster_job_name(msg->nonce, name);
    mjob_t *m = mjob_find(cl, msg->nonce);
    if (!m || m->coord != from || m->started) {
        log_warn("cluster: job %s: a start from %s %s; dropped", name,
                 ovld_cluster_node_name(cl, from),
                 !m           ? "for a job with no rank here"
                 : m->started ? "again"
                              : "not its coordinator");
        ovld_cluster_count_drop(cl);
        return;
    }
    if (st == OVL_ERR_NOMEM) {
        /* the start checked out; this node has no memory for it */
        start_fail(cl, m, name, st, "");
        return;
    }
    if (st != OVL_OK) {
        log_warn("cluster: job %s: a malformed start from %s; the job aborts", name,
                 ovld_cluster_node_name(cl, from));
        ovld_cluster_count_drop(cl);
        mjob_end(cl, m, true, OVL_ERR_PROTOCOL, "the coordinator's start was malformed");
        return;
    }
    start_job(cl, m, name, &msg->start);
}

/* ------------------------------------------------------ go and end */

void ovld_cluster_node_on_go(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *msg,
                             ovl_status_t st, const char *err)
{
    if (!msg->named) {
        ovld_cluster_count_drop(cl);
        return;
    }
    mjob_t *m = mjob_find(cl, msg->nonce);
    if (!m || m->coord != from || !m->started) {
        ovld_cluster_count_drop(cl);
        return;
    }
    const ovld_cluster_go_msg_t *g = &msg->go;
    ovld_cluster_go_t go = {
        .status = g->status,
        .reason = g->reason,
        .algo = g->algo,
        .chunks = g->chunks,
        .streams = g->streams,
        .allgather = g->allgather,
        .strided = g->strided,
        .shared_gpu = g->shared_gpu,
        .timed = g->timed,
    };
    if (st != OVL_OK) {
        /* parameters out of their fields' range (cluster_wire.h): the op
         * fails, in the decoder's words */
        go.status = OVL_ERR_PROTOCOL;
        go.reason = err;
    }
    cl->cb.on_go(cl->cb.arg, m->nonce, g->seq, &go);
}

void ovld_cluster_node_on_end(ovld_cluster_t *cl, ovld_peer_t *from, const ovld_cluster_msg_t *msg,
                              ovl_status_t st, const char *err)
{
    (void)err;
    if (st != OVL_OK || !msg->named) {
        ovld_cluster_count_drop(cl);
        return;
    }
    mjob_t *m = mjob_find(cl, msg->nonce);
    if (!m || m->coord != from) {
        ovld_cluster_count_drop(cl);
        return;
    }
    mjob_end(cl, m, msg->end.abort, msg->end.status, msg->end.reason);
}

/* ---------------------------------------- to the coordinator */

void ovld_cluster_op_ready(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                           uint64_t seq, const ovld_cluster_ready_t *r)
{
    mjob_t *m = mjob_find(cl, nonce);
    if (!m)
        return;
    ovld_cluster_msg_t q = {.type = OVLD_CLUSTER_OP_READY};
    memcpy(q.nonce, nonce, OVLD_JOB_NONCE_LEN);
    q.ready.seq = seq;
    q.ready.status = r->status;
    set_text(q.ready.reason, sizeof(q.ready.reason), r->reason);
    q.ready.first_rank = r->first_rank;
    q.ready.f = r->f;
    q.ready.strided = r->strided;
    q.ready.shared_gpu = r->shared_gpu;
    if (ovld_cluster_send(cl, m->coord, &q) != OVL_OK)
        mjob_end(cl, m, true, OVL_ERR_ABORTED, "the job's coordinator cannot be reached");
}

void ovld_cluster_op_time(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                          uint32_t outcome, uint64_t ns)
{
    mjob_t *m = mjob_find(cl, nonce);
    if (!m)
        return;
    ovld_cluster_msg_t q = {.type = OVLD_CLUSTER_OP_TIME};
    memcpy(q.nonce, nonce, OVLD_JOB_NONCE_LEN);
    q.time.seq = seq;
    q.time.ns = ns;
    q.time.outcome = outcome;
    (void)ovld_cluster_send(cl, m->coord, &q); /* a time lost costs a sample, nothing more */
}

void ovld_cluster_leave(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint32_t rank,
                        bool abort, const char *why)
{
    mjob_t *m = mjob_find(cl, nonce);
    if (!m)
        return; /* no rank of the job was admitted here */
    ovld_cluster_msg_t q = {.type = OVLD_CLUSTER_JOB_LEAVE};
    memcpy(q.nonce, nonce, OVLD_JOB_NONCE_LEN);
    q.leave.rank = rank;
    q.leave.abort = abort;
    set_text(q.leave.reason, sizeof(q.leave.reason), why);
    (void)ovld_cluster_send(cl, m->coord, &q);
}

/* -------------------------------------------------------- the loop */

void ovld_cluster_node_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *why, const char *msg)
{
    /* Joins waiting for that coordinator. */
    for (admit_t **pp = &cl->admits; *pp;) {
        admit_t *a = *pp;
        if (a->coord != p) {
            pp = &a->next;
            continue;
        }
        *pp = a->next;
        char w[OVLD_CLUSTER_REASON_MAX + 96];
        snprintf(w, sizeof(w), "the job's coordinator %s: %s", ovld_peer_name(p), why);
        a->done(a->arg, OVL_ERR_CONNECT, w);
        free(a);
    }
    /* Jobs of this node that the peer coordinates or serves. */
    for (mjob_t *m = cl->mjobs; m; m = m->next) {
        bool theirs = m->coord == p;
        for (uint32_t i = 0; !theirs && i < m->nnodes; i++)
            theirs = m->peers[i] == p;
        if (theirs)
            mjob_end(cl, m, true, OVL_ERR_ABORTED, msg);
    }
}

void ovld_cluster_node_tick(ovld_cluster_t *cl, uint64_t now)
{
    for (admit_t **pp = &cl->admits; *pp;) {
        admit_t *a = *pp;
        if (now < a->deadline_ms) {
            pp = &a->next;
            continue;
        }
        *pp = a->next;
        char w[160], name[19];
        ovld_cluster_job_name(a->nonce, name);
        snprintf(w, sizeof(w), "job %s: no answer from its coordinator %s", name,
                 ovld_cluster_node_name(cl, a->coord));
        a->done(a->arg, OVL_ERR_TIMEOUT, w);
        free(a);
    }
}

void ovld_cluster_node_close(ovld_cluster_t *cl)
{
    while (cl->admits) {
        admit_t *a = cl->admits;
        cl->admits = a->next;
        a->done(a->arg, OVL_ERR_SHUTDOWN, "ovld is shutting down");
        free(a);
    }
    while (cl->self_head) {
        selfmsg_t *m = cl->self_head;
        cl->self_head = m->next;
        free(m->body);
        free(m);
    }
    cl->self_tail = NULL;
    while (cl->mjobs) {
        mjob_t *m = cl->mjobs;
        cl->mjobs = m->next;
        mjob_free(m);
    }
}

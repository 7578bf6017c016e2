/*
 * cluster_coord.c: the coordinator of jobs across nodes (cluster.h): the
 * ids it made, the admission of their ranks, the start on every node
 * (JobStart), each op matched across the nodes (OpReady in, OpGo out), and
 * the end everywhere (JobEnd). Its messages go out through the node's
 * ovld_cluster_send, to this ovld's own node through the local queue.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cluster_internal.h"
#include "kind.h"
#include "desc.h" /* ovld_plan_resolve */
#include "log.h"
#include "plan.h"
#include "tune.h"

/* Timed ops of a job at once (auto measuring across nodes): more than a
 * job has issued together; past it an op runs the rule's plan, untimed. */
#define COORD_TIMED_MAX 16

/* One node of a job, at its coordinator. */
typedef struct cnode {
    ovld_peer_t *peer; /* NULL: the coordinator's own node */
    char name[OVLD_ADDR_TEXT_MAX];
    uint32_t first_rank;
    uint32_t ranks; /* admitted and not left */
    uint64_t last_seq;
    uint64_t last_time_seq; /* its last OpTime's op: they come in op order */
    bool down;
} cnode_t;

/* A timed op (its go said timed) whose nodes' times are coming: each
 * node's OpTime counted once; the op's outcome the worst of theirs (a
 * failure of the plan's, then one of another's), its time the slowest
 * node's, none if a node's is none. */
typedef struct timed {
    uint64_t seq; /* 0: a free slot */
    ovld_tune_ticket_t ticket;
    uint32_t nin;
    uint64_t ns;
    bool none;
    ovld_tune_outcome_t how;
} timed_t;

/* One op being matched across the nodes. */
typedef struct tally {
    uint64_t seq;
    uint32_t nin;
    bool *in; /* per node */
    ovl_status_t st;
    char reason[OVLD_CLUSTER_REASON_MAX + 1];
    uint32_t first_node; /* whose fields the others are compared with */
    ovld_op_fields_t f;
    bool strided, shared_gpu;
    struct tally *next;
} tally_t;

typedef enum { C_FORMING, C_STARTED, C_ENDED, C_ABORTED } cstate_t;

/* A job at its coordinator. */
typedef struct cl_cjob {
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    uid_t owner;
    uint64_t created_ms;
    char name[19];
    char backend[OVLD_CLUSTER_BACKEND_MAX];
    uint32_t world;     /* 0 until the first join */
    int32_t *rank_node; /* world entries: the node of each rank, -1 if not in */
    uint32_t *rank_dev; /* world entries: each rank's device on its node (as joined) */
    bool *rank_left;    /* world entries */
    uint32_t admitted, left;
    cnode_t *nodes;
    uint32_t nnodes;
    cstate_t state;
    tally_t *tallies, *tallies_tail;
    uint32_t ntallies;
    timed_t timed[COORD_TIMED_MAX];
    struct cl_cjob *next;
} cjob_t;

/* A text into a message's buffer, cut to fit. */
static void set_text(char *dst, size_t len, const char *s)
{
    snprintf(dst, len, "%s", s ? s : "");
}

static cjob_t *cjob_find(ovld_cluster_t *cl, const uint8_t *nonce)
{
    for (cjob_t *c = cl->cjobs; c; c = c->next)
        if (ovld_cluster_nonce_eq(c->nonce, nonce))
            return c;
    return NULL;
}

static void tally_free(tally_t *t)
{
    free(t->in);
    free(t);
}

static void cjob_free(ovld_cluster_t *cl, cjob_t *c)
{
    for (cjob_t **pp = &cl->cjobs; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    while (c->tallies) {
        tally_t *t = c->tallies;
        c->tallies = t->next;
        tally_free(t);
    }
    free(c->rank_node);
    free(c->rank_dev);
    free(c->rank_left);
    free(c->nodes);
    free(c);
}

ovl_status_t ovld_cluster_job_id_create(ovld_cluster_t *cl, uid_t uid,
                                        uint8_t out[OVLD_JOB_BLOB_LEN], char *err, size_t errlen)
{
    uint32_t all = 0, mine = 0;
    for (cjob_t *c = cl->cjobs; c; c = c->next) {
        all++;
        mine += c->owner == uid;
    }
    if (all >= cl->cfg->max_jobs) {
        snprintf(err, errlen, "this ovld coordinates %u jobs across nodes (max_jobs = %u)", all,
                 cl->cfg->max_jobs);
        return OVL_ERR_LIMIT;
    }
    if (mine >= cl->cfg->max_jobs_per_uid) {
        snprintf(err, errlen,
                 "uid %u has %u jobs across nodes coordinated here (max_jobs_per_uid = %u; an id "
                 "nobody joins expires after %d s)",
                 (unsigned)uid, mine, cl->cfg->max_jobs_per_uid, OVLD_JOB_ID_TTL_MS / 1000);
        return OVL_ERR_LIMIT;
    }
    ovld_job_blob_t b = {0};
    struct sockaddr_storage ss;
    char canon[OVLD_ADDR_TEXT_MAX];
    ovl_status_t st = ovld_peer_addr_parse(ovld_peers_self(cl->ps), &ss, canon, err, errlen);
    if (st != OVL_OK)
        return st;
    b.coordinator = ss;
    memcpy(b.instance, ovld_peers_instance(cl->ps), OVLD_INSTANCE_LEN);
    for (size_t got = 0; got < OVLD_JOB_NONCE_LEN;) {
        ssize_t k = getrandom(b.nonce + got, OVLD_JOB_NONCE_LEN - got, 0);
        if (k < 0 && errno != EINTR) {
            snprintf(err, errlen, "getrandom: %s", strerror(errno));
            return OVL_ERR_SYSTEM;
        }
        got += k > 0 ? (size_t)k : 0;
    }
    cjob_t *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    st = ovld_job_blob_encode(&b, out);
    if (st != OVL_OK) {
        free(c);
        snprintf(err, errlen, "cannot encode this ovld's address %s in a job id", canon);
        return st;
    }
    memcpy(c->nonce, b.nonce, OVLD_JOB_NONCE_LEN);
    c->owner = uid;
    c->created_ms = uv_now(cl->loop);
    ovld_job_blob_name(&b, c->name);
    c->next = cl->cjobs;
    cl->cjobs = c;
    log_info("job %s: id made for uid %u; this ovld coordinates it", c->name, (unsigned)uid);
    return OVL_OK;
}

static void reply_join(ovld_cluster_t *cl, ovld_peer_t *to, uint64_t req, ovl_status_t st,
                       const char *why)
{
    ovld_cluster_msg_t r = {.type = OVLD_CLUSTER_JOB_JOIN_REPLY};
    r.join_reply.req = req;
    r.join_reply.status = st;
    set_text(r.join_reply.reason, sizeof(r.join_reply.reason), why);
    (void)ovld_cluster_send(cl, to, &r);
}

/* The index of from among c's nodes, or -1. */
static int32_t cnode_of(const cjob_t *c, const ovld_peer_t *from)
{
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (c->nodes[i].peer == from)
            return (int32_t)i;
    return -1;
}

/* Says the end to every node still there (the coordinator's own
 * included) and marks the job. */
static void cjob_end(ovld_cluster_t *cl, cjob_t *c, bool abort, ovl_status_t st, const char *why)
{
    if (c->state == C_ABORTED || (c->state == C_ENDED && !abort))
        return;
    bool started = c->state == C_STARTED || c->state == C_ENDED;
    c->state = abort ? C_ABORTED : C_ENDED;
    log_info("job %s: %s across its nodes: %s", c->name, abort ? "aborted" : "ended", why);
    ovld_cluster_msg_t e = {.type = OVLD_CLUSTER_JOB_END};
    memcpy(e.nonce, c->nonce, OVLD_JOB_NONCE_LEN);
    e.end.abort = abort;
    e.end.status = st;
    set_text(e.end.reason, sizeof(e.end.reason), why);
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].down && (started || c->nodes[i].ranks > 0))
            (void)ovld_cluster_send(cl, c->nodes[i].peer, &e);
    while (c->tallies) {
        tally_t *t = c->tallies;
        c->tallies = t->next;
        tally_free(t);
    }
    c->tallies_tail = NULL;
    c->ntallies = 0;
}

/* A job whose ranks all left, or whose every node is gone, is forgotten. */
static void cjob_maybe_free(ovld_cluster_t *cl, cjob_t *c)
{
    uint32_t live = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        live += !c->nodes[i].down && c->nodes[i].ranks > 0;
    if (c->world && c->admitted > 0 && live == 0) {
        log_debug("job %s: forgotten by its coordinator", c->name);
        cjob_free(cl, c);
    }
}

/* ----------------------------------------------------------- start */

/* The first two ranks of c on one node and one device (*a < *b), if
 * any: ranks that share a GPU. With groups (world entries), only two of one
 * group count. */
static bool cjob_shared_pair(const cjob_t *c, const uint32_t *groups, uint32_t *a, uint32_t *b)
{
    for (uint32_t r = 0; r < c->world; r++)
        for (uint32_t q = 0; q < r; q++)
            if (c->rank_node[q] == c->rank_node[r] && c->rank_dev[q] == c->rank_dev[r] &&
                (!groups || groups[q] == groups[r])) {
                *a = q;
                *b = r;
                return true;
            }
    return false;
}

/*
 * The keys of a job whose backend makes them (CUDA: ncclUniqueIds) into
 * *ret_keys (*ret_n of OVLD_NCCL_ID_LEN bytes each; the caller frees): one
 * for the job's communicator, or, where ranks of a node share a GPU and no
 * communicator can span the job, one per rail group (ovl_plan_rail_groups;
 * docs/multinode.md, "Ranks that share a GPU"), *ret_rail set. Two ranks of
 * one node on one GPU in one rail group (nodes of uneven size) cannot be
 * served: refused with words naming them. node_of: the started job's
 * numbering (world entries).
 */
static ovl_status_t cjob_keys(ovld_cluster_t *cl, const cjob_t *c, const uint32_t *node_of,
                              uint8_t **ret_keys, uint32_t *ret_n, bool *ret_rail, char *err,
                              size_t errlen)
{
    uint32_t a, b, n = 1;
    uint32_t *group = NULL, *pos = NULL;
    bool rail = cjob_shared_pair(c, NULL, &a, &b);
    ovl_status_t st = OVL_OK;
    if (rail) {
        group = calloc(c->world, sizeof(*group));
        pos = calloc(c->world, sizeof(*pos));
        st = group && pos ? OVL_OK : OVL_ERR_NOMEM;
        if (st == OVL_OK)
            st = ovl_plan_rail_groups(c->world, node_of, group, pos, &n);
        if (st == OVL_OK && cjob_shared_pair(c, group, &a, &b)) {
            st = OVL_ERR_UNSUPPORTED;
            snprintf(err, errlen,
                     "ranks %u and %u share device %u on %s and exchange rows with the same "
                     "ranks (uneven nodes): NCCL takes no two ranks of one GPU in one "
                     "communicator",
                     a, b, c->rank_dev[a], c->nodes[c->rank_node[a]].name);
        }
    }
    uint8_t *keys = st == OVL_OK ? calloc(n, OVLD_NCCL_ID_LEN) : NULL;
    if (st == OVL_OK && !keys)
        st = OVL_ERR_NOMEM;
    for (uint32_t i = 0; st == OVL_OK && i < n; i++)
        st = cl->backend->ops->job_key(cl->backend, keys + (size_t)i * OVLD_NCCL_ID_LEN, err,
                                       errlen);
    free(group);
    free(pos);
    if (st != OVL_OK) {
        free(keys);
        return st;
    }
    *ret_keys = keys;
    *ret_n = n;
    *ret_rail = rail;
    return OVL_OK;
}

/* Says the start to each of the nn nodes of c, in the started job's
 * numbering (order: c's node of each; node_of: each rank's). */
static void cjob_send_start(ovld_cluster_t *cl, cjob_t *c, const uint32_t *order, uint32_t nn,
                            uint32_t *node_of, char (*names)[OVLD_ADDR_TEXT_MAX], uint8_t *keys,
                            uint32_t nkeys, bool rail)
{
    ovld_cluster_msg_t s = {.type = OVLD_CLUSTER_JOB_START};
    memcpy(s.nonce, c->nonce, OVLD_JOB_NONCE_LEN);
    s.start.world = c->world;
    s.start.node_of = node_of;
    s.start.nnodes = nn;
    s.start.nodes = names;
    s.start.has_key = keys && !rail;
    if (s.start.has_key)
        memcpy(s.start.key, keys, OVLD_NCCL_ID_LEN);
    s.start.nrail_keys = rail ? nkeys : 0;
    s.start.rail_keys = rail ? keys : NULL;
    for (uint32_t i = 0; i < nn; i++) {
        s.start.self_node = i;
        (void)ovld_cluster_send(cl, c->nodes[order[i]].peer, &s);
    }
}

static void cjob_start(ovld_cluster_t *cl, cjob_t *c)
{
    /* Nodes are numbered by their lowest rank, so that every node reads
     * the same numbers. */
    uint32_t *order = calloc(c->nnodes, sizeof(*order));
    int32_t *renum = calloc(c->nnodes, sizeof(*renum));
    uint32_t *node_of = calloc(c->world, sizeof(*node_of));
    char(*names)[OVLD_ADDR_TEXT_MAX] = calloc(c->nnodes, sizeof(*names));
    uint8_t *keys = NULL;
    uint32_t nkeys = 0;
    bool rail = false;
    char err[320] = "";
    ovl_status_t st = order && renum && node_of && names ? OVL_OK : OVL_ERR_NOMEM;
    uint32_t nn = 0;
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (renum)
            renum[i] = -1;
    for (uint32_t q = 0; st == OVL_OK && q < c->world; q++) {
        uint32_t n = (uint32_t)c->rank_node[q];
        if (renum[n] < 0) {
            renum[n] = (int32_t)nn;
            order[nn++] = n;
        }
        node_of[q] = (uint32_t)renum[n];
    }
    /* (node_of is the started job's numbering from here; c's nodes are
     * renumbered below) */
    if (st == OVL_OK && cl->backend->ops->job_key)
        st = cjob_keys(cl, c, node_of, &keys, &nkeys, &rail, err, sizeof(err));
    if (st != OVL_OK) {
        char why[400];
        snprintf(why, sizeof(why), "the coordinator cannot start the job: %s",
                 err[0] ? err : ovl_strerror(st));
        cjob_end(cl, c, true, st, why);
        goto out;
    }
    for (uint32_t i = 0; i < nn; i++)
        memcpy(names[i], c->nodes[order[i]].name, sizeof(names[i]));
    c->state = C_STARTED;
    log_info("job %s: all %u ranks in, on %u nodes; starting%s", c->name, c->world, nn,
             rail ? " (ranks share GPUs: a communicator per rail group)" : "");
    cjob_send_start(cl, c, order, nn, node_of, names, keys, nkeys, rail);
    /* Node indices from here on are the started job's. */
    cnode_t *sorted = calloc(c->nnodes, sizeof(*sorted));
    if (sorted) {
        for (uint32_t i = 0; i < nn; i++)
            sorted[i] = c->nodes[order[i]];
        for (uint32_t q = 0; q < c->world; q++)
            c->rank_node[q] = (int32_t)node_of[q];
        free(c->nodes);
        c->nodes = sorted;
        c->nnodes = nn;
    } else {
        cjob_end(cl, c, true, OVL_ERR_NOMEM, "the coordinator ran out of memory");
    }
out:
    free(order);
    free(renum);
    free(node_of);
    free(names);
    free(keys);
}

/* ------------------------------------------------------- admission */

/* Whether rank q of c may join from fromname, with backend: OVL_OK, or the
 * refusal and why. */
static ovl_status_t join_allowed(const cjob_t *c, const ovld_cluster_join_msg_t *q,
                                 const char *name, const char *fromname, char *why, size_t len)
{
    if ((uid_t)q->uid != c->owner) {
        snprintf(why, len, "job %s belongs to uid %u; rank %u joins as uid %u", name,
                 (unsigned)c->owner, q->rank, (unsigned)q->uid);
        return OVL_ERR_PERMISSION;
    }
    if (c->world && q->world == c->world && c->rank_node[q->rank] >= 0) {
        snprintf(why, len, "rank %u of job %s already joined, on %s", q->rank, name,
                 c->nodes[c->rank_node[q->rank]].name);
        return OVL_ERR_EXISTS;
    }
    if (c->state != C_FORMING) {
        snprintf(why, len, "job %s is %s", name,
                 c->state == C_STARTED ? "running: every rank joined" : "over");
        return OVL_ERR_ABORTED;
    }
    if (c->world && q->world != c->world) {
        snprintf(why, len, "job %s has world %u, not %u", name, c->world, q->world);
        return OVL_ERR_MISMATCH;
    }
    if (c->backend[0] && strcmp(q->backend, c->backend) != 0) {
        snprintf(why, len, "job %s runs on the %s backend; %s has %s", name, c->backend, fromname,
                 q->backend);
        return OVL_ERR_MISMATCH;
    }
    return OVL_OK;
}

/* The first join of c sizes it to world ranks on backend. */
static ovl_status_t cjob_size(cjob_t *c, uint32_t world, const char *backend, char *why, size_t len)
{
    c->rank_node = malloc(world * sizeof(*c->rank_node));
    c->rank_dev = calloc(world, sizeof(*c->rank_dev));
    c->rank_left = calloc(world, sizeof(*c->rank_left));
    c->nodes = calloc(world, sizeof(*c->nodes));
    if (!c->rank_node || !c->rank_dev || !c->rank_left || !c->nodes) {
        free(c->rank_node);
        free(c->rank_dev);
        free(c->rank_left);
        free(c->nodes);
        c->rank_node = NULL;
        c->rank_dev = NULL;
        c->rank_left = NULL;
        c->nodes = NULL;
        snprintf(why, len, "the coordinator is out of memory");
        return OVL_ERR_NOMEM;
    }
    for (uint32_t r = 0; r < world; r++)
        c->rank_node[r] = -1;
    c->world = world;
    snprintf(c->backend, sizeof(c->backend), "%s", backend);
    return OVL_OK;
}

void ovld_cluster_coord_on_join(ovld_cluster_t *cl, ovld_peer_t *from,
                                const ovld_cluster_msg_t *msg, ovl_status_t st, const char *err)
{
    (void)err;
    char name[19] = "?", why[OVLD_CLUSTER_REASON_MAX + 1];
    const char *fromname = ovld_cluster_node_name(cl, from);
    const ovld_cluster_join_msg_t *q = &msg->join;
    if (st != OVL_OK) {
        ovld_cluster_count_drop(cl);
        reply_join(cl, from, q->req, OVL_ERR_PROTOCOL, "malformed join");
        return;
    }
    ovld_cluster_job_name(msg->nonce, name);
    cjob_t *c = cjob_find(cl, msg->nonce);
    if (memcmp(q->instance, ovld_peers_instance(cl->ps), OVLD_INSTANCE_LEN) != 0) {
        snprintf(why, sizeof(why),
                 "job %s: its id was made by an earlier run of the ovld at %s, which restarted "
                 "since: make a new id",
                 name, ovld_peers_self(cl->ps));
        reply_join(cl, from, q->req, OVL_ERR_NOT_FOUND, why);
        return;
    }
    if (!c) {
        snprintf(why, sizeof(why),
                 "job %s: no such job at its coordinator %s (an id it did not make, or one that "
                 "expired or ended)",
                 name, ovld_peers_self(cl->ps));
        log_warn("cluster: join of rank %u from %s refused: %s", q->rank, fromname, why);
        reply_join(cl, from, q->req, OVL_ERR_NOT_FOUND, why);
        return;
    }
    st = join_allowed(c, q, name, fromname, why, sizeof(why));
    if (st == OVL_OK && !c->world)
        st = cjob_size(c, q->world, q->backend, why, sizeof(why));
    if (st != OVL_OK) {
        log_info("cluster: job %s: join of rank %u from %s refused: %s", name, q->rank, fromname,
                 why);
        reply_join(cl, from, q->req, st, why);
        return;
    }
    int32_t n = cnode_of(c, from);
    if (n < 0) {
        n = (int32_t)c->nnodes++; /* at most world nodes: each has a rank */
        c->nodes[n] = (cnode_t){.peer = from, .first_rank = q->rank};
        snprintf(c->nodes[n].name, sizeof(c->nodes[n].name), "%s", fromname);
    }
    cnode_t *nd = &c->nodes[n];
    if (q->rank < nd->first_rank || nd->ranks == 0)
        nd->first_rank = q->rank;
    nd->ranks++;
    c->rank_node[q->rank] = n;
    c->rank_dev[q->rank] = q->device;
    c->admitted++;
    log_info("job %s: rank %u/%u admitted, on %s", name, q->rank, c->world, fromname);
    reply_join(cl, from, q->req, OVL_OK, "");
    if (c->admitted == c->world)
        cjob_start(cl, c);
}

/* -------------------------------------------------------------- ops */

static void send_go(ovld_cluster_t *cl, cjob_t *c, const tally_t *t, ovl_status_t st,
                    const char *why, const ovl_plan_params_t *pp, bool timed)
{
    ovld_cluster_msg_t g = {.type = OVLD_CLUSTER_OP_GO};
    memcpy(g.nonce, c->nonce, OVLD_JOB_NONCE_LEN);
    g.go.seq = t->seq;
    g.go.status = st;
    set_text(g.go.reason, sizeof(g.go.reason), why);
    if (pp) {
        g.go.algo = (uint32_t)pp->algo;
        g.go.chunks = pp->chunks;
        g.go.streams = pp->streams;
        g.go.allgather = (uint32_t)pp->allgather;
        g.go.strided = pp->strided;
        g.go.shared_gpu = pp->shared_gpu;
        g.go.timed = timed;
    }
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].down)
            (void)ovld_cluster_send(cl, c->nodes[i].peer, &g);
}

/* Every node's OpReady for the oldest tally is in: its verdict. */
static void tally_decide(ovld_cluster_t *cl, cjob_t *c, tally_t *t)
{
    char why[OVLD_CLUSTER_REASON_MAX + 1];
    if (t->st != OVL_OK) {
        send_go(cl, c, t, t->st, t->reason, NULL, false);
        return;
    }
    uint32_t *node_of = calloc(c->world, sizeof(*node_of));
    if (!node_of) {
        send_go(cl, c, t, OVL_ERR_NOMEM, "the coordinator is out of memory", NULL, false);
        return;
    }
    for (uint32_t q = 0; q < c->world; q++)
        node_of[q] = (uint32_t)c->rank_node[q];
    /* the op's kind makes its parameters (kind.h), as on every node;
     * decoded OpReadys have a kind of the table (cluster_wire.c), and so
     * do this node's own (opq.c) */
    const ovld_kind_t *kind = ovld_kind(t->f.kind);
    if (!kind) {
        free(node_of);
        send_go(cl, c, t, OVL_ERR_INTERNAL, "an op of no kind reached the coordinator", NULL,
                false);
        return;
    }
    ovl_plan_params_t pp;
    kind->plan_params(&t->f, c->world, &pp);
    pp.shared_gpu = t->shared_gpu;
    pp.strided = t->strided;
    pp.node_of = node_of;
    /* The one place of the defaults (job.h), with this ovld's config: the
     * same parameters go to every node. */
    ovld_plan_resolve(cl->cfg, cl->backend->ops->allgather != NULL, &pp);
    /* auto measuring (core/tune.h): a candidate to time on every node, or
     * the measured choice; the rule's plan where no slot is free */
    ovld_tune_ticket_t ticket = {0};
    timed_t *slot = NULL;
    for (uint32_t i = 0; cl->tune && i < COORD_TIMED_MAX && !slot; i++)
        if (c->timed[i].seq == 0)
            slot = &c->timed[i];
    if (slot)
        ovld_tune_pick(cl->tune, (uint32_t)c->owner, &pp, &ticket);
    else
        (void)ovld_tune_peek(cl->tune, &pp);
    if (ticket.entry)
        *slot = (timed_t){.seq = t->seq, .ticket = ticket, .how = OVLD_TUNE_TIMED};
    uint32_t a, b;
    uint64_t scratch;
    bool refused =
        pp.shared_gpu && c->nnodes > 1 && ovl_plan_scratch_bytes(&pp, &scratch) == OVL_ERR_INVALID;
    const char *words = refused ? ovl_plan_refusal(&pp) : NULL;
    if (refused && (words || pp.algo != OVL_ALGO_RING)) {
        /* the planner refuses it on every node too; here once, with the
         * ranks that share a device and the planner's words (the kind's),
         * or, where it has none, all-gather + GEMM's rule */
        if (cjob_shared_pair(c, NULL, &a, &b))
            snprintf(why, sizeof(why), "ranks %u and %u share device %u on %s", a, b,
                     c->rank_dev[a], c->nodes[c->rank_node[a]].name);
        else
            snprintf(why, sizeof(why), "ranks share a GPU");
        size_t len = strlen(why);
        if (words)
            snprintf(why + len, sizeof(why) - len, ": %s", words);
        else
            snprintf(why + len, sizeof(why) - len,
                     ": across nodes only ring runs then (%s gathers by NCCL over every rank, "
                     "and NCCL takes no two ranks of one GPU in one communicator)",
                     ovl_algo_name(pp.algo));
        send_go(cl, c, t, OVL_ERR_UNSUPPORTED, why, NULL, false);
        if (ticket.entry) {
            ovld_tune_record(cl->tune, ticket, OVLD_TUNE_FAILED, 0); /* the planner's */
            *slot = (timed_t){0};
        }
    } else {
        send_go(cl, c, t, OVL_OK, "", &pp, ticket.entry != 0);
    }
    free(node_of);
}

/* The tally of op seq of c, made if it is not there yet (NULL: the job
 * ended, for want of memory or past OVLD_CLUSTER_MAX_TALLIES). */
static tally_t *tally_get(ovld_cluster_t *cl, cjob_t *c, uint64_t seq)
{
    tally_t *t = c->tallies;
    while (t && t->seq != seq)
        t = t->next;
    if (t)
        return t;
    if (c->ntallies >= OVLD_CLUSTER_MAX_TALLIES) {
        char why[160];
        snprintf(why, sizeof(why),
                 "ops of the job's nodes are more than %d apart (OVLD_CLUSTER_MAX_TALLIES)",
                 OVLD_CLUSTER_MAX_TALLIES);
        cjob_end(cl, c, true, OVL_ERR_LIMIT, why);
        return NULL;
    }
    t = calloc(1, sizeof(*t));
    if (t && !(t->in = calloc(c->nnodes, sizeof(*t->in)))) {
        free(t);
        t = NULL;
    }
    if (!t) {
        cjob_end(cl, c, true, OVL_ERR_NOMEM, "the coordinator is out of memory");
        return NULL;
    }
    t->seq = seq;
    t->first_node = UINT32_MAX;
    if (c->tallies_tail)
        c->tallies_tail->next = t;
    else
        c->tallies = t;
    c->tallies_tail = t;
    c->ntallies++;
    return t;
}

/* Node n's OpReady r counted into t: the op's failure (the node with the
 * lowest ranks names it), or its fields compared with the first node's. */
static void tally_add(cjob_t *c, tally_t *t, uint32_t n, const ovld_cluster_ready_msg_t *r)
{
    t->in[n] = true;
    t->nin++;
    t->strided |= r->strided;
    t->shared_gpu |= r->shared_gpu;
    if (r->status != OVL_OK && (t->st == OVL_OK || n < t->first_node)) {
        /* The failure of the node with the lowest ranks is the op's. */
        t->st = r->status;
        set_text(t->reason, sizeof(t->reason), r->reason);
        t->first_node = n;
    } else if (r->status == OVL_OK && t->st == OVL_OK) {
        if (t->nin == 1) {
            t->f = r->f;
            t->first_node = n;
        } else {
            char what[32];
            uint64_t a, b;
            if (ovld_op_fields_differ(&r->f, &t->f, what, sizeof(what), &a, &b)) {
                t->st = OVL_ERR_MISMATCH;
                snprintf(t->reason, sizeof(t->reason),
                         "ranks disagree on %s: rank %u (on %s) has %" PRIu64
                         ", rank %u (on %s) has %" PRIu64,
                         what, r->first_rank, c->nodes[n].name, a,
                         c->nodes[t->first_node].first_rank, c->nodes[t->first_node].name, b);
            }
        }
    }
}

void ovld_cluster_coord_on_ready(ovld_cluster_t *cl, ovld_peer_t *from,
                                 const ovld_cluster_msg_t *msg, ovl_status_t st, const char *err)
{
    (void)err;
    if (!msg->named) {
        ovld_cluster_count_drop(cl);
        return;
    }
    const ovld_cluster_ready_msg_t *r = &msg->ready;
    cjob_t *c = cjob_find(cl, msg->nonce);
    int32_t n = c ? cnode_of(c, from) : -1;
    if (!c || n < 0 || c->state == C_FORMING) {
        ovld_cluster_count_drop(cl);
        return;
    }
    if (c->state != C_STARTED)
        return; /* ended: the nodes fail their ops themselves */
    cnode_t *nd = &c->nodes[n];
    /* what the decoder cannot know: the node's last op, the job's world */
    bool ok = st == OVL_OK && r->seq > nd->last_seq && r->first_rank < c->world;
    if (ok && !c->tallies_tail && c->ntallies >= OVLD_CLUSTER_MAX_TALLIES)
        ok = false;
    if (!ok) {
        char why[160];
        snprintf(why, sizeof(why), "node %s sent a malformed or out-of-order op %" PRIu64, nd->name,
                 r->seq);
        log_warn("job %s: %s", c->name, why);
        ovld_cluster_count_drop(cl);
        cjob_end(cl, c, true, OVL_ERR_PROTOCOL, why);
        return;
    }
    nd->last_seq = r->seq;
    tally_t *t = tally_get(cl, c, r->seq);
    if (!t)
        return;
    if (t->in[n])
        return; /* cannot happen: seq only grows per node */
    tally_add(c, t, (uint32_t)n, r);
    /* Nodes send in order, so tallies complete in order. */
    while (c->tallies && c->tallies->nin == c->nnodes) {
        tally_t *done = c->tallies;
        c->tallies = done->next;
        if (!c->tallies)
            c->tallies_tail = NULL;
        c->ntallies--;
        tally_decide(cl, c, done);
        tally_free(done);
    }
}

/* A node's time for a timed op: counted once per node, in op order; once
 * every node's is in, the op's (its slowest node's, none if a node has
 * none) goes to the tuning table. A time for no timed op, or out of
 * order, is dropped and counted: a node's ovld does not send one. */
void ovld_cluster_coord_on_time(ovld_cluster_t *cl, ovld_peer_t *from,
                                const ovld_cluster_msg_t *msg, ovl_status_t st, const char *err)
{
    (void)err;
    if (st != OVL_OK || !msg->named) {
        ovld_cluster_count_drop(cl);
        return;
    }
    cjob_t *c = cjob_find(cl, msg->nonce);
    int32_t n = c ? cnode_of(c, from) : -1;
    if (!c || n < 0 || c->state == C_FORMING) {
        ovld_cluster_count_drop(cl);
        return;
    }
    cnode_t *nd = &c->nodes[n];
    timed_t *tm = NULL;
    for (uint32_t i = 0; i < COORD_TIMED_MAX && !tm; i++)
        if (c->timed[i].seq != 0 && c->timed[i].seq == msg->time.seq)
            tm = &c->timed[i];
    if (!tm || msg->time.seq <= nd->last_time_seq) {
        log_debug("job %s: node %s sent a time for op %" PRIu64 ", which is not timed or not next",
                  c->name, nd->name, msg->time.seq);
        ovld_cluster_count_drop(cl);
        return;
    }
    nd->last_time_seq = msg->time.seq;
    ovld_tune_outcome_t how = (ovld_tune_outcome_t)msg->time.outcome; /* 0..2: decoded */
    if (how == OVLD_TUNE_FAILED || (how == OVLD_TUNE_NONE && tm->how != OVLD_TUNE_FAILED))
        tm->how = how;
    if (msg->time.ns == 0)
        tm->none = true;
    else if (msg->time.ns > tm->ns)
        tm->ns = msg->time.ns;
    if (++tm->nin < c->nnodes)
        return;
    ovld_tune_record(cl->tune, tm->ticket, tm->how, tm->none ? 0 : tm->ns);
    *tm = (timed_t){0};
}

/* ------------------------------------------------------------ leave */

void ovld_cluster_coord_on_leave(ovld_cluster_t *cl, ovld_peer_t *from,
                                 const ovld_cluster_msg_t *msg, ovl_status_t st, const char *err)
{
    (void)err;
    if (!msg->named) {
        ovld_cluster_count_drop(cl);
        return;
    }
    const ovld_cluster_leave_msg_t *l = &msg->leave;
    cjob_t *c = cjob_find(cl, msg->nonce);
    int32_t n = c ? cnode_of(c, from) : -1;
    if (!c || n < 0 || st != OVL_OK) { /* (refused: a rank past 32 bits, none of the job's) */
        ovld_cluster_count_drop(cl);
        return;
    }
    cnode_t *nd = &c->nodes[n];
    char msgtext[OVLD_CLUSTER_REASON_MAX + 96];
    if (l->rank == OVLD_CLUSTER_NO_RANK) {
        /* the node gives up the job: it aborts everywhere */
        snprintf(msgtext, sizeof(msgtext), "node %s: %s", nd->name, l->reason);
        nd->ranks = 0;
        cjob_end(cl, c, true, OVL_ERR_ABORTED, msgtext);
        cjob_maybe_free(cl, c);
        return;
    }
    if (l->rank >= c->world || c->rank_node[l->rank] != n || c->rank_left[l->rank]) {
        ovld_cluster_count_drop(cl);
        return;
    }
    uint32_t rank = l->rank;
    nd->ranks--;
    if (c->state == C_FORMING) {
        /* not started: the place is free again */
        c->rank_node[rank] = -1;
        c->admitted--;
        log_info("job %s: rank %u left before the job started (%s)", c->name, rank, l->reason);
    } else {
        c->rank_left[rank] = true;
        c->left++;
        snprintf(msgtext, sizeof(msgtext), "rank %u left the job (%s)", rank, l->reason);
        cjob_end(cl, c, l->abort, OVL_ERR_ABORTED, msgtext);
    }
    cjob_maybe_free(cl, c);
}

/* --------------------------------------------------------- the loop */

void ovld_cluster_coord_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *msg)
{
    for (cjob_t *c = cl->cjobs, *next; c; c = next) {
        next = c->next;
        int32_t n = cnode_of(c, p);
        if (n < 0 || c->nodes[n].down)
            continue;
        c->nodes[n].down = true;
        if (c->state == C_FORMING && c->nodes[n].ranks > 0) {
            /* its ranks' places are free again */
            for (uint32_t q = 0; q < c->world; q++)
                if (c->rank_node[q] == n) {
                    c->rank_node[q] = -1;
                    c->admitted--;
                }
            c->nodes[n].ranks = 0;
            c->nodes[n].peer = NULL; /* never matched again */
            c->nodes[n].down = false;
            snprintf(c->nodes[n].name, sizeof(c->nodes[n].name), "(gone)");
            continue;
        }
        c->nodes[n].ranks = 0;
        cjob_end(cl, c, true, OVL_ERR_ABORTED, msg);
        cjob_maybe_free(cl, c);
    }
}

void ovld_cluster_coord_tick(ovld_cluster_t *cl, uint64_t now)
{
    for (cjob_t *c = cl->cjobs, *next; c; c = next) {
        next = c->next;
        if (c->admitted == 0 && c->state == C_FORMING &&
            now - c->created_ms >= OVLD_JOB_ID_TTL_MS) {
            log_info("job %s: nobody joined within %d s; its id expired", c->name,
                     OVLD_JOB_ID_TTL_MS / 1000);
            cjob_free(cl, c);
        }
    }
}

void ovld_cluster_coord_close(ovld_cluster_t *cl)
{
    while (cl->cjobs)
        cjob_free(cl, cl->cjobs);
}

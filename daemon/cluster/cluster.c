/*
 * cluster.c: jobs across nodes (cluster.h): the coordinator's records and
 * a node's, and the messages between them (proto/cluster.proto).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cluster.h"
#include "cluster.pb-c.h"
#include "job.h" /* ovld_plan_resolve */
#include "log.h"
#include "plan.h"
#include "text.h"
#include "xfer.h"

enum {
    T_JOIN = 16,
    T_JOIN_REPLY = 17,
    T_START = 18,
    T_READY = 19,
    T_GO = 20,
    T_LEAVE = 21,
    T_END = 22,
};

#define REASON_MAX       200
#define TICK_MS          250
#define CL_NO_RANK       UINT32_MAX
#define BACKEND_NAME_MAX 16

/* ----------------------------------------------------------- records */

/* A join this node asked the coordinator about. */
typedef struct admit {
    uint64_t req;
    uint32_t rank;
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    ovld_peer_t *coord; /* NULL: the coordinator is this ovld */
    uint64_t deadline_ms;
    ovld_cluster_admit_fn done;
    void *arg;
    struct admit *next;
} admit_t;

/* A job as a node knows it: where its coordinator is, and (once started)
 * its nodes. */
typedef struct mjob {
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    ovld_peer_t *coord; /* NULL: this ovld */
    bool started, ended;
    uint32_t nnodes, self_node;
    ovld_peer_t **peers; /* per node; NULL for this one */
    char **names;        /* per node: its address */
    struct mjob *next;
} mjob_t;

/* One node of a job, at its coordinator. */
typedef struct cnode {
    ovld_peer_t *peer; /* NULL: the coordinator's own node */
    char name[OVLD_ADDR_TEXT_MAX];
    uint32_t first_rank;
    uint32_t ranks; /* admitted and not left */
    uint64_t last_seq;
    bool down;
} cnode_t;

/* One op being matched across the nodes. */
typedef struct tally {
    uint64_t seq;
    uint32_t nin;
    bool *in; /* per node */
    ovl_status_t st;
    char reason[REASON_MAX + 1];
    uint32_t first_node; /* whose fields the others are compared with */
    ovld_op_fields_t f;
    bool strided, shared_gpu;
    struct tally *next;
} tally_t;

typedef enum { C_FORMING, C_STARTED, C_ENDED, C_ABORTED } cstate_t;

/* A job at its coordinator. */
typedef struct cjob {
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    uid_t owner;
    uint64_t created_ms;
    char name[19];
    char backend[BACKEND_NAME_MAX];
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
    struct cjob *next;
} cjob_t;

/* A message to this ovld itself, delivered from the loop. */
typedef struct selfmsg {
    uint32_t type;
    size_t len;
    struct selfmsg *next;
    uint8_t body[];
} selfmsg_t;

struct ovld_cluster {
    uv_loop_t *loop;
    ovld_peers_t *ps;
    struct ovld_xfer *xfer;
    ovld_backend_t *backend;
    const ovld_config_t *cfg;
    ovld_counters_t *counters;
    ovld_cluster_cb_t cb;
    uv_async_t wake;
    uv_timer_t tick;
    int handles_open;
    bool closing;
    selfmsg_t *self_head, *self_tail;
    admit_t *admits;
    uint64_t next_req;
    mjob_t *mjobs;
    cjob_t *cjobs;
};

static void count_drop(ovld_cluster_t *cl)
{
    OVLD_COUNT(cl->counters, peer_errors, 1);
}

/* A peer's status code, if it is one (stats.h: the last is
 * OVL_ERR_INTERNAL); else bad. */
static ovl_status_t status_of(int64_t v, ovl_status_t bad)
{
    return v <= 0 && v >= OVL_ERR_INTERNAL ? (ovl_status_t)v : bad;
}

static bool nonce_eq(const uint8_t *a, const uint8_t *b)
{
    return memcmp(a, b, OVLD_JOB_NONCE_LEN) == 0;
}

static void job_name(const uint8_t *nonce, char out[19])
{
    ovld_job_blob_t b = {0};
    memcpy(b.nonce, nonce, OVLD_JOB_NONCE_LEN);
    ovld_job_blob_name(&b, out);
}

static const char *node_name(const ovld_cluster_t *cl, const ovld_peer_t *p)
{
    return p ? ovld_peer_name(p) : ovld_peers_self(cl->ps);
}

/* Text of a peer's bytes, cleaned (common/text.h). */
static void text_of(const ProtobufCBinaryData *b, char *out, size_t outlen)
{
    ovl_text_sanitize(out, outlen, b->data, b->len);
}

/* ---------------------------------------------------------- sending */

/* Packs msg and sends it to p (NULL: to this ovld, through the loop). A
 * failure is the link's (peer down: its on_down follows) or a limit: the
 * caller's job sees it through on_down, or a lost message is logged. */
static ovl_status_t cl_send(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type,
                            const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (!p) {
        selfmsg_t *m = malloc(sizeof(*m) + len);
        if (!m) {
            log_error("cluster: out of memory for a message to this ovld");
            return OVL_ERR_NOMEM;
        }
        m->type = type;
        m->len = len;
        m->next = NULL;
        protobuf_c_message_pack(msg, m->body);
        if (cl->self_tail)
            cl->self_tail->next = m;
        else
            cl->self_head = m;
        cl->self_tail = m;
        uv_async_send(&cl->wake);
        return OVL_OK;
    }
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        log_error("cluster: out of memory for a message to %s", ovld_peer_name(p));
        return OVL_ERR_NOMEM;
    }
    protobuf_c_message_pack(msg, buf);
    ovl_status_t st = ovld_peer_send(p, type, buf, len);
    free(buf);
    if (st != OVL_OK)
        log_warn("cluster: message %u to %s not sent: %s", type, ovld_peer_name(p),
                 ovl_strerror(st));
    return st;
}

static ProtobufCBinaryData bin(const void *p, size_t n)
{
    return (ProtobufCBinaryData){.data = (uint8_t *)(uintptr_t)p, .len = n};
}

static ProtobufCBinaryData bin_str(const char *s)
{
    size_t n = strlen(s);
    return bin(s, n > REASON_MAX ? REASON_MAX : n);
}

/* ------------------------------------------------------- node side */

static mjob_t *mjob_find(ovld_cluster_t *cl, const uint8_t *nonce)
{
    for (mjob_t *m = cl->mjobs; m; m = m->next)
        if (nonce_eq(m->nonce, nonce))
            return m;
    return NULL;
}

static void mjob_free(mjob_t *m)
{
    for (uint32_t i = 0; m->names && i < m->nnodes; i++)
        free(m->names[i]);
    free(m->names);
    free(m->peers);
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
        if (nonce_eq((*pp)->nonce, nonce)) {
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
        if (nonce_eq(m->nonce, nonce) && m->started) {
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
    Ovlcl__JobJoin q = OVLCL__JOB_JOIN__INIT;
    q.req = a->req;
    q.nonce = bin(blob->nonce, OVLD_JOB_NONCE_LEN);
    q.instance = bin(blob->instance, OVLD_INSTANCE_LEN);
    q.world = world;
    q.rank = rank;
    q.uid = uid;
    q.backend = bin_str(cl->backend->ops->name);
    q.device = device;
    ovl_status_t st = cl_send(cl, coord, T_JOIN, &q.base);
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

static void on_join_reply(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__JobJoinReply *r)
{
    admit_t *a = admit_take(cl, r->req, from);
    if (!a) {
        log_debug("cluster: an answer from %s to no join of ours (%" PRIu64 ")",
                  node_name(cl, from), r->req);
        count_drop(cl);
        return;
    }
    char why[REASON_MAX + 1];
    text_of(&r->reason, why, sizeof(why));
    ovl_status_t st = status_of(r->status, OVL_ERR_PROTOCOL);
    if (st == OVL_OK && !mjob_get(cl, a->nonce, a->coord)) {
        st = OVL_ERR_NOMEM;
        snprintf(why, sizeof(why), "out of memory");
        /* the coordinator counts the rank in: say it left */
        Ovlcl__JobLeave q = OVLCL__JOB_LEAVE__INIT;
        q.nonce = bin(a->nonce, OVLD_JOB_NONCE_LEN);
        q.rank = a->rank;
        q.reason = bin_str("its node ran out of memory");
        (void)cl_send(cl, a->coord, T_LEAVE, &q.base);
    }
    a->done(a->arg, st, why);
    free(a);
}

static void on_start(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__JobStart *s)
{
    char name[19];
    if (s->nonce.len != OVLD_JOB_NONCE_LEN) {
        count_drop(cl);
        return;
    }
    job_name(s->nonce.data, name);
    mjob_t *m = mjob_find(cl, s->nonce.data);
    if (!m || m->coord != from || m->started) {
        log_warn("cluster: job %s: a start from %s %s; dropped", name, node_name(cl, from),
                 !m           ? "for a job with no rank here"
                 : m->started ? "again"
                              : "not its coordinator");
        count_drop(cl);
        return;
    }
    /* Every count and index within bounds before anything is kept. */
    uint64_t world = s->world;
    bool ok = world >= 1 && world <= OVL_PLAN_MAX_WORLD && s->n_node_of == world &&
              s->n_nodes >= 1 && s->n_nodes <= world && s->self_node < s->n_nodes &&
              (s->key.len == 0 || s->key.len == OVLD_NCCL_ID_LEN) &&
              (s->n_rail_keys == 0 || (s->key.len == 0 && s->n_rail_keys <= world));
    for (size_t i = 0; ok && i < s->n_rail_keys; i++)
        ok = s->rail_keys[i].len == OVLD_NCCL_ID_LEN;
    bool *seen = ok ? calloc(s->n_nodes, sizeof(*seen)) : NULL;
    for (size_t q = 0; ok && q < world; q++) {
        ok = s->node_of[q] < s->n_nodes;
        if (ok)
            seen[s->node_of[q]] = true;
    }
    for (size_t n = 0; ok && n < s->n_nodes; n++)
        ok = seen[n] && s->nodes[n].len > 0 && s->nodes[n].len < OVLD_ADDR_TEXT_MAX;
    free(seen);
    if (!ok) {
        log_warn("cluster: job %s: a malformed start from %s; the job aborts", name,
                 node_name(cl, from));
        count_drop(cl);
        mjob_end(cl, m, true, OVL_ERR_PROTOCOL, "the coordinator's start was malformed");
        return;
    }
    uint32_t nn = (uint32_t)s->n_nodes;
    uint32_t nrail = (uint32_t)s->n_rail_keys;
    uint32_t *node_of = calloc(world, sizeof(*node_of));
    /* with rail keys: each rank's rail group and place in it, the keys */
    uint32_t *rail = nrail ? calloc(2 * world, sizeof(*rail)) : NULL;
    uint8_t *rail_keys = nrail ? calloc(nrail, OVLD_NCCL_ID_LEN) : NULL;
    m->peers = calloc(nn, sizeof(*m->peers));
    m->names = calloc(nn, sizeof(*m->names));
    char err[256] = "";
    ovl_status_t st =
        node_of && m->peers && m->names && (!nrail || (rail && rail_keys)) ? OVL_OK : OVL_ERR_NOMEM;
    if (st == OVL_OK)
        m->nnodes = nn;
    for (uint32_t n = 0; st == OVL_OK && n < nn; n++) {
        char text[OVLD_ADDR_TEXT_MAX];
        text_of(&s->nodes[n], text, sizeof(text));
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
    struct ovld_xfer_job *xj = NULL;
    if (st == OVL_OK) {
        for (uint64_t q = 0; q < world; q++)
            node_of[q] = (uint32_t)s->node_of[q];
    }
    if (st == OVL_OK && nrail) {
        /* one key per rail group, as this node counts them too */
        uint32_t ngroups = 0;
        st = ovl_plan_rail_groups((uint32_t)world, node_of, rail, rail + world, &ngroups);
        if (st == OVL_OK && ngroups != nrail) {
            st = OVL_ERR_PROTOCOL;
            snprintf(err, sizeof(err), "the coordinator sent %u rail keys for %u rail groups",
                     nrail, ngroups);
        }
        for (uint32_t i = 0; st == OVL_OK && i < nrail; i++)
            memcpy(rail_keys + (size_t)i * OVLD_NCCL_ID_LEN, s->rail_keys[i].data,
                   OVLD_NCCL_ID_LEN);
    }
    if (st == OVL_OK) {
        if (cl->xfer)
            st = ovld_xfer_job_create(cl->xfer, m->nonce, (uint32_t)world, node_of,
                                      (uint32_t)s->self_node, m->peers, nn, &xj, err, sizeof(err));
    }
    if (st != OVL_OK) {
        free(node_of);
        free(rail);
        free(rail_keys);
        char why[320];
        snprintf(why, sizeof(why), "cannot start on this node: %s",
                 err[0] ? err : ovl_strerror(st));
        log_error("cluster: job %s: %s", name, why);
        ovld_cluster_leave(cl, m->nonce, UINT32_MAX, true, why);
        mjob_end(cl, m, true, st, why);
        return;
    }
    m->started = true;
    m->self_node = (uint32_t)s->self_node;
    ovld_cluster_start_t start = {.world = (uint32_t)world,
                                  .node_of = node_of,
                                  .nnodes = nn,
                                  .self_node = m->self_node,
                                  .nodes = (const char *const *)m->names,
                                  .key = s->key.len ? s->key.data : NULL,
                                  .rail_keys = rail_keys,
                                  .nrail_keys = nrail,
                                  .rail_group = rail,
                                  .rail_pos = rail ? rail + world : NULL,
                                  .xfer = xj};
    cl->cb.on_start(cl->cb.arg, m->nonce, &start);
    free(node_of);
    free(rail);
    free(rail_keys);
}

static void on_go(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__OpGo *g)
{
    if (g->nonce.len != OVLD_JOB_NONCE_LEN) {
        count_drop(cl);
        return;
    }
    mjob_t *m = mjob_find(cl, g->nonce.data);
    if (!m || m->coord != from || !m->started) {
        count_drop(cl);
        return;
    }
    char why[REASON_MAX + 1];
    text_of(&g->reason, why, sizeof(why));
    ovld_cluster_go_t go = {
        .status = status_of(g->status, OVL_ERR_PROTOCOL),
        .reason = why,
        .strided = g->strided,
        .shared_gpu = g->shared_gpu,
    };
    if (go.status == OVL_OK) {
        /* the parameters are checked again by the planner, which refuses
         * what it cannot plan: here only that they fit their fields */
        if (g->algo >= OVL_ALGO_COUNT || g->algo == OVL_ALGO_AUTO ||
            g->chunks > OVL_PLAN_MAX_CHUNKS || g->streams > OVL_PLAN_MAX_STREAMS ||
            g->allgather >= OVL_AG_PREF_COUNT) {
            go.status = OVL_ERR_PROTOCOL;
            snprintf(why, sizeof(why),
                     "the coordinator's parameters for op %" PRIu64 " are out of range", g->seq);
        }
        go.algo = (uint32_t)g->algo;
        go.chunks = (uint32_t)g->chunks;
        go.streams = (uint32_t)g->streams;
        go.allgather = (uint32_t)g->allgather;
    }
    cl->cb.on_go(cl->cb.arg, m->nonce, g->seq, &go);
}

static void on_end(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__JobEnd *e)
{
    if (e->nonce.len != OVLD_JOB_NONCE_LEN) {
        count_drop(cl);
        return;
    }
    mjob_t *m = mjob_find(cl, e->nonce.data);
    if (!m || m->coord != from) {
        count_drop(cl);
        return;
    }
    char why[REASON_MAX + 1];
    text_of(&e->reason, why, sizeof(why));
    ovl_status_t st = status_of(e->status, OVL_ERR_ABORTED);
    if (st == OVL_OK)
        st = OVL_ERR_ABORTED;
    mjob_end(cl, m, e->abort, st, why);
}

void ovld_cluster_op_ready(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                           uint64_t seq, const ovld_cluster_ready_t *r)
{
    mjob_t *m = mjob_find(cl, nonce);
    if (!m)
        return;
    Ovlcl__OpReady q = OVLCL__OP_READY__INIT;
    q.nonce = bin(nonce, OVLD_JOB_NONCE_LEN);
    q.seq = seq;
    q.status = r->status;
    q.reason = bin_str(r->reason ? r->reason : "");
    q.first_rank = r->first_rank;
    q.m = r->f.m;
    q.n = r->f.n;
    q.k = r->f.k;
    q.dtype = r->f.dtype;
    q.algo = r->f.algo;
    q.chunks = r->f.chunks;
    q.streams = r->f.streams;
    q.transb = r->f.transb;
    q.has_aout = r->f.has_aout;
    q.nb = r->f.nb;
    uint64_t more[OVLD_MAX_BS - 1];
    q.n_n_more = r->f.nb > 1 && r->f.nb <= OVLD_MAX_BS ? r->f.nb - 1 : 0;
    memcpy(more, r->f.n_more, sizeof(more));
    q.n_more = more;
    q.strided = r->strided;
    q.shared_gpu = r->shared_gpu;
    if (cl_send(cl, m->coord, T_READY, &q.base) != OVL_OK)
        mjob_end(cl, m, true, OVL_ERR_ABORTED, "the job's coordinator cannot be reached");
}

void ovld_cluster_leave(ovld_cluster_t *cl, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint32_t rank,
                        bool abort, const char *why)
{
    mjob_t *m = mjob_find(cl, nonce);
    if (!m)
        return; /* no rank of the job was admitted here */
    Ovlcl__JobLeave q = OVLCL__JOB_LEAVE__INIT;
    q.nonce = bin(nonce, OVLD_JOB_NONCE_LEN);
    q.rank = rank;
    q.abort = abort;
    q.reason = bin_str(why);
    (void)cl_send(cl, m->coord, T_LEAVE, &q.base);
}

/* ---------------------------------------------------- coordinator */

static cjob_t *cjob_find(ovld_cluster_t *cl, const uint8_t *nonce)
{
    for (cjob_t *c = cl->cjobs; c; c = c->next)
        if (nonce_eq(c->nonce, nonce))
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
    Ovlcl__JobJoinReply r = OVLCL__JOB_JOIN_REPLY__INIT;
    r.req = req;
    r.status = st;
    r.reason = bin_str(why);
    (void)cl_send(cl, to, T_JOIN_REPLY, &r.base);
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
    Ovlcl__JobEnd e = OVLCL__JOB_END__INIT;
    e.nonce = bin(c->nonce, OVLD_JOB_NONCE_LEN);
    e.abort = abort;
    e.status = st;
    e.reason = bin_str(why);
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].down && (started || c->nodes[i].ranks > 0))
            (void)cl_send(cl, c->nodes[i].peer, T_END, &e.base);
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
 * served: refused with words naming them.
 */
static ovl_status_t cjob_keys(ovld_cluster_t *cl, const cjob_t *c, const uint64_t *node_of,
                              uint8_t **ret_keys, uint32_t *ret_n, bool *ret_rail, char *err,
                              size_t errlen)
{
    uint32_t a, b, n = 1;
    uint32_t *node32 = NULL, *group = NULL, *pos = NULL;
    bool rail = cjob_shared_pair(c, NULL, &a, &b);
    ovl_status_t st = OVL_OK;
    if (rail) {
        node32 = calloc(c->world, sizeof(*node32));
        group = calloc(c->world, sizeof(*group));
        pos = calloc(c->world, sizeof(*pos));
        st = node32 && group && pos ? OVL_OK : OVL_ERR_NOMEM;
        for (uint32_t q = 0; st == OVL_OK && q < c->world; q++)
            node32[q] = (uint32_t)node_of[q];
        if (st == OVL_OK)
            st = ovl_plan_rail_groups(c->world, node32, group, pos, &n);
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
    free(node32);
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

static void cjob_start(ovld_cluster_t *cl, cjob_t *c)
{
    /* Nodes are numbered by their lowest rank, so that every node reads
     * the same numbers. */
    uint32_t *order = calloc(c->nnodes, sizeof(*order));
    int32_t *renum = calloc(c->nnodes, sizeof(*renum));
    uint64_t *node_of = calloc(c->world, sizeof(*node_of));
    ProtobufCBinaryData *names = calloc(c->nnodes, sizeof(*names));
    ProtobufCBinaryData *rail_keys = NULL;
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
        node_of[q] = (uint64_t)renum[n];
    }
    /* (node_of is the started job's numbering from here; c's nodes are
     * renumbered below) */
    if (st == OVL_OK && cl->backend->ops->job_key)
        st = cjob_keys(cl, c, node_of, &keys, &nkeys, &rail, err, sizeof(err));
    if (st == OVL_OK && rail && !(rail_keys = calloc(nkeys, sizeof(*rail_keys))))
        st = OVL_ERR_NOMEM;
    if (st != OVL_OK) {
        char why[400];
        snprintf(why, sizeof(why), "the coordinator cannot start the job: %s",
                 err[0] ? err : ovl_strerror(st));
        cjob_end(cl, c, true, st, why);
        goto out;
    }
    for (uint32_t i = 0; rail && i < nkeys; i++)
        rail_keys[i] = bin(keys + (size_t)i * OVLD_NCCL_ID_LEN, OVLD_NCCL_ID_LEN);
    for (uint32_t i = 0; i < nn; i++)
        names[i] = bin_str(c->nodes[order[i]].name);
    c->state = C_STARTED;
    log_info("job %s: all %u ranks in, on %u nodes; starting%s", c->name, c->world, nn,
             rail ? " (ranks share GPUs: a communicator per rail group)" : "");
    for (uint32_t i = 0; i < nn; i++) {
        Ovlcl__JobStart s = OVLCL__JOB_START__INIT;
        s.nonce = bin(c->nonce, OVLD_JOB_NONCE_LEN);
        s.world = c->world;
        s.n_node_of = c->world;
        s.node_of = node_of;
        s.n_nodes = nn;
        s.nodes = names;
        s.self_node = i;
        s.key = keys && !rail ? bin(keys, OVLD_NCCL_ID_LEN) : bin(NULL, 0);
        s.n_rail_keys = rail ? nkeys : 0;
        s.rail_keys = rail_keys;
        (void)cl_send(cl, c->nodes[order[i]].peer, T_START, &s.base);
    }
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
    free(rail_keys);
    free(keys);
}

static void on_join(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__JobJoin *q)
{
    char name[19] = "?", why[REASON_MAX + 1];
    const char *fromname = node_name(cl, from);
    if (q->nonce.len != OVLD_JOB_NONCE_LEN || q->instance.len != OVLD_INSTANCE_LEN ||
        q->world == 0 || q->world > OVL_PLAN_MAX_WORLD || q->rank >= q->world ||
        q->uid > UINT32_MAX || q->backend.len == 0 || q->backend.len >= BACKEND_NAME_MAX ||
        q->device > UINT32_MAX) {
        count_drop(cl);
        reply_join(cl, from, q->req, OVL_ERR_PROTOCOL, "malformed join");
        return;
    }
    job_name(q->nonce.data, name);
    cjob_t *c = cjob_find(cl, q->nonce.data);
    if (memcmp(q->instance.data, ovld_peers_instance(cl->ps), OVLD_INSTANCE_LEN) != 0) {
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
        log_warn("cluster: join of rank %" PRIu64 " from %s refused: %s", q->rank, fromname, why);
        reply_join(cl, from, q->req, OVL_ERR_NOT_FOUND, why);
        return;
    }
    char backend[BACKEND_NAME_MAX];
    text_of(&q->backend, backend, sizeof(backend));
    ovl_status_t st = OVL_OK;
    if ((uid_t)q->uid != c->owner) {
        st = OVL_ERR_PERMISSION;
        snprintf(why, sizeof(why), "job %s belongs to uid %u; rank %" PRIu64 " joins as uid %u",
                 name, (unsigned)c->owner, q->rank, (unsigned)q->uid);
    } else if (c->world && q->world == c->world && c->rank_node[q->rank] >= 0) {
        st = OVL_ERR_EXISTS;
        snprintf(why, sizeof(why), "rank %" PRIu64 " of job %s already joined, on %s", q->rank,
                 name, c->nodes[c->rank_node[q->rank]].name);
    } else if (c->state != C_FORMING) {
        st = OVL_ERR_ABORTED;
        snprintf(why, sizeof(why), "job %s is %s", name,
                 c->state == C_STARTED ? "running: every rank joined" : "over");
    } else if (c->world && q->world != c->world) {
        st = OVL_ERR_MISMATCH;
        snprintf(why, sizeof(why), "job %s has world %u, not %" PRIu64, name, c->world, q->world);
    } else if (c->backend[0] && strcmp(backend, c->backend) != 0) {
        st = OVL_ERR_MISMATCH;
        snprintf(why, sizeof(why), "job %s runs on the %s backend; %s has %s", name, c->backend,
                 fromname, backend);
    }
    if (st == OVL_OK && !c->world) {
        c->rank_node = malloc(q->world * sizeof(*c->rank_node));
        c->rank_dev = calloc(q->world, sizeof(*c->rank_dev));
        c->rank_left = calloc(q->world, sizeof(*c->rank_left));
        c->nodes = calloc(q->world, sizeof(*c->nodes));
        if (!c->rank_node || !c->rank_dev || !c->rank_left || !c->nodes) {
            free(c->rank_node);
            free(c->rank_dev);
            free(c->rank_left);
            free(c->nodes);
            c->rank_node = NULL;
            c->rank_dev = NULL;
            c->rank_left = NULL;
            c->nodes = NULL;
            st = OVL_ERR_NOMEM;
            snprintf(why, sizeof(why), "the coordinator is out of memory");
        } else {
            for (uint32_t r = 0; r < q->world; r++)
                c->rank_node[r] = -1;
            c->world = (uint32_t)q->world;
            snprintf(c->backend, sizeof(c->backend), "%s", backend);
        }
    }
    if (st != OVL_OK) {
        log_info("cluster: job %s: join of rank %" PRIu64 " from %s refused: %s", name, q->rank,
                 fromname, why);
        reply_join(cl, from, q->req, st, why);
        return;
    }
    int32_t n = cnode_of(c, from);
    if (n < 0) {
        n = (int32_t)c->nnodes++; /* at most world nodes: each has a rank */
        c->nodes[n] = (cnode_t){.peer = from, .first_rank = (uint32_t)q->rank};
        snprintf(c->nodes[n].name, sizeof(c->nodes[n].name), "%s", fromname);
    }
    cnode_t *nd = &c->nodes[n];
    if (q->rank < nd->first_rank || nd->ranks == 0)
        nd->first_rank = (uint32_t)q->rank;
    nd->ranks++;
    c->rank_node[q->rank] = n;
    c->rank_dev[q->rank] = (uint32_t)q->device;
    c->admitted++;
    log_info("job %s: rank %" PRIu64 "/%u admitted, on %s", name, q->rank, c->world, fromname);
    reply_join(cl, from, q->req, OVL_OK, "");
    if (c->admitted == c->world)
        cjob_start(cl, c);
}

static void send_go(ovld_cluster_t *cl, cjob_t *c, const tally_t *t, ovl_status_t st,
                    const char *why, const ovl_plan_params_t *pp)
{
    Ovlcl__OpGo g = OVLCL__OP_GO__INIT;
    g.nonce = bin(c->nonce, OVLD_JOB_NONCE_LEN);
    g.seq = t->seq;
    g.status = st;
    g.reason = bin_str(why);
    if (pp) {
        g.algo = pp->algo;
        g.chunks = pp->chunks;
        g.streams = pp->streams;
        g.allgather = pp->allgather;
        g.strided = pp->strided;
        g.shared_gpu = pp->shared_gpu;
    }
    for (uint32_t i = 0; i < c->nnodes; i++)
        if (!c->nodes[i].down)
            (void)cl_send(cl, c->nodes[i].peer, T_GO, &g.base);
}

/* Every node's OpReady for the oldest tally is in: its verdict. */
static void tally_decide(ovld_cluster_t *cl, cjob_t *c, tally_t *t)
{
    char why[REASON_MAX + 1];
    if (t->st != OVL_OK) {
        send_go(cl, c, t, t->st, t->reason, NULL);
        return;
    }
    uint32_t *node_of = calloc(c->world, sizeof(*node_of));
    if (!node_of) {
        send_go(cl, c, t, OVL_ERR_NOMEM, "the coordinator is out of memory", NULL);
        return;
    }
    for (uint32_t q = 0; q < c->world; q++)
        node_of[q] = (uint32_t)c->rank_node[q];
    ovl_plan_params_t pp = {
        .algo = (ovl_algo_t)t->f.algo,
        .world = c->world,
        .m = t->f.m,
        .n = t->f.n,
        .k = t->f.k,
        .dtype = (ovl_dtype_t)t->f.dtype,
        .chunks = t->f.chunks,
        .streams = t->f.streams,
        .want_gathered = t->f.has_aout,
        .transb = t->f.transb,
        .shared_gpu = t->shared_gpu,
        .strided = t->strided,
        .nb = t->f.nb,
        .node_of = node_of,
    };
    memcpy(pp.n_more, t->f.n_more, sizeof(pp.n_more));
    /* The one place of the defaults (job.h), with this ovld's config: the
     * same parameters go to every node. */
    ovld_plan_resolve(cl->cfg, cl->backend->ops->allgather != NULL, &pp);
    uint32_t a, b;
    if (pp.shared_gpu && c->nnodes > 1 && pp.algo != OVL_ALGO_RING) {
        /* the planner refuses it too; here with words */
        if (cjob_shared_pair(c, NULL, &a, &b))
            snprintf(why, sizeof(why), "ranks %u and %u share device %u on %s", a, b,
                     c->rank_dev[a], c->nodes[c->rank_node[a]].name);
        else
            snprintf(why, sizeof(why), "ranks share a GPU");
        size_t len = strlen(why);
        snprintf(why + len, sizeof(why) - len,
                 ": across nodes only ring runs then (%s gathers by NCCL over every rank, and "
                 "NCCL takes no two ranks of one GPU in one communicator)",
                 ovl_algo_name(pp.algo));
        send_go(cl, c, t, OVL_ERR_UNSUPPORTED, why, NULL);
    } else {
        send_go(cl, c, t, OVL_OK, "", &pp);
    }
    free(node_of);
}

static void on_ready(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__OpReady *r)
{
    if (r->nonce.len != OVLD_JOB_NONCE_LEN) {
        count_drop(cl);
        return;
    }
    cjob_t *c = cjob_find(cl, r->nonce.data);
    int32_t n = c ? cnode_of(c, from) : -1;
    if (!c || n < 0 || c->state == C_FORMING) {
        count_drop(cl);
        return;
    }
    if (c->state != C_STARTED)
        return; /* ended: the nodes fail their ops themselves */
    cnode_t *nd = &c->nodes[n];
    bool ok = r->seq > nd->last_seq && r->nb >= 1 && r->nb <= OVLD_MAX_BS &&
              r->n_n_more == r->nb - 1 && r->first_rank < c->world && r->dtype <= UINT32_MAX &&
              r->algo <= UINT32_MAX && r->chunks <= UINT32_MAX && r->streams <= UINT32_MAX &&
              status_of(r->status, OVL_ERR_PROTOCOL) == r->status;
    if (ok && !c->tallies_tail && c->ntallies >= OVLD_CLUSTER_MAX_TALLIES)
        ok = false;
    if (!ok) {
        char why[160];
        snprintf(why, sizeof(why), "node %s sent a malformed or out-of-order op %" PRIu64, nd->name,
                 r->seq);
        log_warn("job %s: %s", c->name, why);
        count_drop(cl);
        cjob_end(cl, c, true, OVL_ERR_PROTOCOL, why);
        return;
    }
    nd->last_seq = r->seq;
    tally_t *t = c->tallies;
    while (t && t->seq != r->seq)
        t = t->next;
    if (!t) {
        if (c->ntallies >= OVLD_CLUSTER_MAX_TALLIES) {
            char why[160];
            snprintf(why, sizeof(why),
                     "ops of the job's nodes are more than %d apart (OVLD_CLUSTER_MAX_TALLIES)",
                     OVLD_CLUSTER_MAX_TALLIES);
            cjob_end(cl, c, true, OVL_ERR_LIMIT, why);
            return;
        }
        t = calloc(1, sizeof(*t));
        if (t && !(t->in = calloc(c->nnodes, sizeof(*t->in)))) {
            free(t);
            t = NULL;
        }
        if (!t) {
            cjob_end(cl, c, true, OVL_ERR_NOMEM, "the coordinator is out of memory");
            return;
        }
        t->seq = r->seq;
        t->first_node = UINT32_MAX;
        if (c->tallies_tail)
            c->tallies_tail->next = t;
        else
            c->tallies = t;
        c->tallies_tail = t;
        c->ntallies++;
    }
    if (t->in[n])
        return; /* cannot happen: seq only grows per node */
    t->in[n] = true;
    t->nin++;
    ovld_op_fields_t f = {.m = r->m,
                          .n = r->n,
                          .k = r->k,
                          .dtype = (uint32_t)r->dtype,
                          .algo = (uint32_t)r->algo,
                          .chunks = (uint32_t)r->chunks,
                          .streams = (uint32_t)r->streams,
                          .transb = r->transb,
                          .has_aout = r->has_aout,
                          .nb = (uint32_t)r->nb};
    for (size_t i = 0; i < r->n_n_more; i++)
        f.n_more[i] = r->n_more[i];
    t->strided |= r->strided;
    t->shared_gpu |= r->shared_gpu;
    if (r->status != OVL_OK && (t->st == OVL_OK || (uint32_t)n < t->first_node)) {
        /* The failure of the node with the lowest ranks is the op's. */
        t->st = (ovl_status_t)r->status;
        text_of(&r->reason, t->reason, sizeof(t->reason));
        t->first_node = (uint32_t)n;
    } else if (r->status == OVL_OK && t->st == OVL_OK) {
        if (t->nin == 1) {
            t->f = f;
            t->first_node = (uint32_t)n;
        } else {
            char what[32];
            uint64_t a, b;
            if (ovld_op_fields_differ(&f, &t->f, what, sizeof(what), &a, &b)) {
                t->st = OVL_ERR_MISMATCH;
                snprintf(t->reason, sizeof(t->reason),
                         "ranks disagree on %s: rank %" PRIu64 " (on %s) has %" PRIu64
                         ", rank %u (on %s) has %" PRIu64,
                         what, r->first_rank, nd->name, a, c->nodes[t->first_node].first_rank,
                         c->nodes[t->first_node].name, b);
            }
        }
    }
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

static void on_leave(ovld_cluster_t *cl, ovld_peer_t *from, const Ovlcl__JobLeave *l)
{
    if (l->nonce.len != OVLD_JOB_NONCE_LEN) {
        count_drop(cl);
        return;
    }
    cjob_t *c = cjob_find(cl, l->nonce.data);
    int32_t n = c ? cnode_of(c, from) : -1;
    if (!c || n < 0) {
        count_drop(cl);
        return;
    }
    cnode_t *nd = &c->nodes[n];
    char why[REASON_MAX + 1], msg[REASON_MAX + 96];
    text_of(&l->reason, why, sizeof(why));
    if (l->rank == CL_NO_RANK) {
        /* the node gives up the job: it aborts everywhere */
        snprintf(msg, sizeof(msg), "node %s: %s", nd->name, why);
        nd->ranks = 0;
        cjob_end(cl, c, true, OVL_ERR_ABORTED, msg);
        cjob_maybe_free(cl, c);
        return;
    }
    if (l->rank >= c->world || c->rank_node[l->rank] != n || c->rank_left[l->rank]) {
        count_drop(cl);
        return;
    }
    uint32_t rank = (uint32_t)l->rank;
    nd->ranks--;
    if (c->state == C_FORMING) {
        /* not started: the place is free again */
        c->rank_node[rank] = -1;
        c->admitted--;
        log_info("job %s: rank %u left before the job started (%s)", c->name, rank, why);
    } else {
        c->rank_left[rank] = true;
        c->left++;
        snprintf(msg, sizeof(msg), "rank %u left the job (%s)", rank, why);
        cjob_end(cl, c, l->abort, OVL_ERR_ABORTED, msg);
    }
    cjob_maybe_free(cl, c);
}

/* -------------------------------------------------------- dispatch */

static void dispatch(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                     size_t len)
{
    const ProtobufCMessageDescriptor *d = NULL;
    switch (type) {
    case T_JOIN:
        d = &ovlcl__job_join__descriptor;
        break;
    case T_JOIN_REPLY:
        d = &ovlcl__job_join_reply__descriptor;
        break;
    case T_START:
        d = &ovlcl__job_start__descriptor;
        break;
    case T_READY:
        d = &ovlcl__op_ready__descriptor;
        break;
    case T_GO:
        d = &ovlcl__op_go__descriptor;
        break;
    case T_LEAVE:
        d = &ovlcl__job_leave__descriptor;
        break;
    case T_END:
        d = &ovlcl__job_end__descriptor;
        break;
    }
    ProtobufCMessage *m = d ? protobuf_c_message_unpack(d, NULL, len, body) : NULL;
    if (!m) {
        log_warn("cluster: %s message %u from %s; dropped", d ? "a malformed" : "an unknown", type,
                 node_name(cl, p));
        count_drop(cl);
        return;
    }
    switch (type) {
    case T_JOIN:
        on_join(cl, p, (const Ovlcl__JobJoin *)m);
        break;
    case T_JOIN_REPLY:
        on_join_reply(cl, p, (const Ovlcl__JobJoinReply *)m);
        break;
    case T_START:
        on_start(cl, p, (const Ovlcl__JobStart *)m);
        break;
    case T_READY:
        on_ready(cl, p, (const Ovlcl__OpReady *)m);
        break;
    case T_GO:
        on_go(cl, p, (const Ovlcl__OpGo *)m);
        break;
    case T_LEAVE:
        on_leave(cl, p, (const Ovlcl__JobLeave *)m);
        break;
    case T_END:
        on_end(cl, p, (const Ovlcl__JobEnd *)m);
        break;
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

void ovld_cluster_on_message(ovld_cluster_t *cl, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                             size_t len)
{
    if (!cl->closing)
        dispatch(cl, p, type, body, len);
}

static void on_wake(uv_async_t *h)
{
    ovld_cluster_t *cl = h->data;
    /* Messages this handler sends to itself wait for the next round. */
    selfmsg_t *m = cl->self_head;
    cl->self_head = cl->self_tail = NULL;
    while (m) {
        selfmsg_t *next = m->next;
        if (!cl->closing)
            dispatch(cl, NULL, m->type, m->body, m->len);
        free(m);
        m = next;
    }
}

void ovld_cluster_on_down(ovld_cluster_t *cl, ovld_peer_t *p, const char *why)
{
    char msg[REASON_MAX + 96];
    snprintf(msg, sizeof(msg), "node %s is down: %s", ovld_peer_name(p), why);
    /* Joins waiting for that coordinator. */
    for (admit_t **pp = &cl->admits; *pp;) {
        admit_t *a = *pp;
        if (a->coord != p) {
            pp = &a->next;
            continue;
        }
        *pp = a->next;
        char w[REASON_MAX + 96];
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
    /* Jobs coordinated here with ranks on that node. */
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

/* Expired ids, and joins that waited too long. */
static void on_tick(uv_timer_t *t)
{
    ovld_cluster_t *cl = t->data;
    uint64_t now = uv_now(cl->loop);
    for (admit_t **pp = &cl->admits; *pp;) {
        admit_t *a = *pp;
        if (now < a->deadline_ms) {
            pp = &a->next;
            continue;
        }
        *pp = a->next;
        char w[160], name[19];
        job_name(a->nonce, name);
        snprintf(w, sizeof(w), "job %s: no answer from its coordinator %s", name,
                 node_name(cl, a->coord));
        a->done(a->arg, OVL_ERR_TIMEOUT, w);
        free(a);
    }
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

void ovld_cluster_close(ovld_cluster_t *cl)
{
    if (!cl)
        return;
    cl->closing = true;
    while (cl->admits) {
        admit_t *a = cl->admits;
        cl->admits = a->next;
        a->done(a->arg, OVL_ERR_SHUTDOWN, "ovld is shutting down");
        free(a);
    }
    while (cl->self_head) {
        selfmsg_t *m = cl->self_head;
        cl->self_head = m->next;
        free(m);
    }
    cl->self_tail = NULL;
    while (cl->mjobs) {
        mjob_t *m = cl->mjobs;
        cl->mjobs = m->next;
        mjob_free(m);
    }
    while (cl->cjobs)
        cjob_free(cl, cl->cjobs);
    uv_timer_stop(&cl->tick);
    uv_close((uv_handle_t *)&cl->wake, on_handle_closed);
    uv_close((uv_handle_t *)&cl->tick, on_handle_closed);
}

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
                           .job_nodes = across_job_nodes};
}

/*
 * cluster_wire.c: see cluster_wire.h.
 */
#include "cluster_wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.pb-c.h"
#include "errf.h"
#include "kind.h"
#include "scaling.h"
#include "plan.h"
#include "text.h"
#include "wire.h"

const char *ovld_cluster_type_name(uint32_t type, char *buf, size_t len)
{
    static const char *names[] = {"JobJoin", "JobJoinReply", "JobStart", "OpReady",
                                  "OpGo",    "JobLeave",     "JobEnd",   "OpTime"};
    if (ovld_cluster_type_known(type))
        return names[type - OVLD_CLUSTER_JOB_JOIN];
    snprintf(buf, len, "message type %" PRIu32, type);
    return buf;
}

bool ovld_cluster_type_known(uint32_t type)
{
    return type >= OVLD_CLUSTER_JOB_JOIN && type <= OVLD_CLUSTER_OP_TIME;
}

void ovld_cluster_msg_clear(ovld_cluster_msg_t *m)
{
    if (m->type != OVLD_CLUSTER_JOB_START)
        return;
    free(m->start.node_of);
    free(m->start.nodes);
    free(m->start.rail_keys);
    m->start.node_of = NULL;
    m->start.nodes = NULL;
    m->start.rail_keys = NULL;
}

/* ------------------------------------------------------------ fields */

/* A peer's status code, if it is one (ovl.h: the last is
 * OVL_ERR_INTERNAL); else bad. */
static ovl_status_t status_of(int64_t v, ovl_status_t bad)
{
    return v <= 0 && v >= OVL_ERR_INTERNAL ? (ovl_status_t)v : bad;
}

/* Text of a peer's bytes, cleaned (common/text.h). */
static void text_of(const ProtobufCBinaryData *b, char *out, size_t outlen)
{
    ovl_text_sanitize(out, outlen, b->data, b->len);
}

/* A value of at most 32 bits. */
static ovl_status_t take_u32(uint64_t v, uint32_t *out, const char *msg, const char *field,
                             char *err, size_t errlen)
{
    if (v > UINT32_MAX)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: %s %" PRIu64 " (32 bits)", msg, field, v);
    *out = (uint32_t)v;
    return OVL_OK;
}

/* The job's nonce: 16 bytes, then ret is named. */
static ovl_status_t take_nonce(const ProtobufCBinaryData *b, ovld_cluster_msg_t *ret,
                               const char *msg, char *err, size_t errlen)
{
    if (b->len != OVLD_JOB_NONCE_LEN)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: a job nonce of %zu bytes, not %d", msg, b->len,
                        OVLD_JOB_NONCE_LEN);
    memcpy(ret->nonce, b->data, OVLD_JOB_NONCE_LEN);
    ret->named = true;
    return OVL_OK;
}

/* A world of 1..OVL_PLAN_MAX_WORLD ranks. */
static ovl_status_t check_world(uint64_t world, const char *msg, char *err, size_t errlen)
{
    if (world == 0 || world > OVL_PLAN_MAX_WORLD)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: world %" PRIu64 " (1 to %d)", msg, world,
                        OVL_PLAN_MAX_WORLD);
    return OVL_OK;
}

/* ---------------------------------------------------------- messages */

static ovl_status_t take_join(const Ovlcl__JobJoin *q, ovld_cluster_msg_t *ret, const char *msg,
                              char *err, size_t errlen)
{
    ovld_cluster_join_msg_t *j = &ret->join;
    ovl_status_t st;
    j->req = q->req;
    if ((st = take_nonce(&q->nonce, ret, msg, err, errlen)) != OVL_OK)
        return st;
    if (q->instance.len != OVLD_INSTANCE_LEN)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: a coordinator instance of %zu bytes, not %d", msg,
                        q->instance.len, OVLD_INSTANCE_LEN);
    if ((st = check_world(q->world, msg, err, errlen)) != OVL_OK)
        return st;
    if (q->rank >= q->world)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: rank %" PRIu64 " in a world of %" PRIu64, msg, q->rank,
                        q->world);
    if ((st = take_u32(q->uid, &j->uid, msg, "uid", err, errlen)) != OVL_OK)
        return st;
    if (q->backend.len == 0 || q->backend.len >= OVLD_CLUSTER_BACKEND_MAX)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: a backend name of %zu bytes (1 to %d)", msg,
                        q->backend.len, OVLD_CLUSTER_BACKEND_MAX - 1);
    if ((st = take_u32(q->device, &j->device, msg, "device", err, errlen)) != OVL_OK)
        return st;
    memcpy(j->instance, q->instance.data, OVLD_INSTANCE_LEN);
    j->world = (uint32_t)q->world;
    j->rank = (uint32_t)q->rank;
    text_of(&q->backend, j->backend, sizeof(j->backend));
    return OVL_OK;
}

static void take_join_reply(const Ovlcl__JobJoinReply *r, ovld_cluster_msg_t *ret)
{
    ret->join_reply.req = r->req;
    ret->join_reply.status = status_of(r->status, OVL_ERR_PROTOCOL);
    text_of(&r->reason, ret->join_reply.reason, sizeof(ret->join_reply.reason));
}

/* A JobStart's counts and sizes, before anything is kept: every count and
 * index within bounds. */
static ovl_status_t check_start(const Ovlcl__JobStart *s, const char *msg, char *err, size_t errlen)
{
    ovl_status_t st = check_world(s->world, msg, err, errlen);
    if (st != OVL_OK)
        return st;
    uint64_t world = s->world;
    if (s->n_node_of != world)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: world %" PRIu64 " but the node of %zu ranks", msg,
                        world, s->n_node_of);
    if (s->n_nodes < 1 || s->n_nodes > world)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: world %" PRIu64 " on %zu nodes", msg, world,
                        s->n_nodes);
    if (s->self_node >= s->n_nodes)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: sent to node %" PRIu64 " of %zu", msg, s->self_node,
                        s->n_nodes);
    if (s->key.len != 0 && s->key.len != OVLD_CLUSTER_KEY_LEN)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: a job key of %zu bytes, not %d", msg, s->key.len,
                        OVLD_CLUSTER_KEY_LEN);
    if (s->n_rail_keys != 0 && (s->key.len != 0 || s->n_rail_keys > world))
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: %s: %zu rail keys%s", msg,
                        s->n_rail_keys, s->key.len ? " and a job key" : ", more than its world");
    for (size_t i = 0; i < s->n_rail_keys; i++)
        if (s->rail_keys[i].len != OVLD_CLUSTER_KEY_LEN)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: rail key %zu of %zu bytes, not %d", msg, i,
                            s->rail_keys[i].len, OVLD_CLUSTER_KEY_LEN);
    bool seen[OVL_PLAN_MAX_WORLD] = {false};
    for (size_t q = 0; q < world; q++) {
        if (s->node_of[q] >= s->n_nodes)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: rank %zu on node %" PRIu64 " of %zu", msg, q,
                            s->node_of[q], s->n_nodes);
        seen[s->node_of[q]] = true;
    }
    for (size_t n = 0; n < s->n_nodes; n++) {
        if (!seen[n])
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: node %zu has no rank", msg, n);
        if (s->nodes[n].len == 0 || s->nodes[n].len >= OVLD_ADDR_TEXT_MAX)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: node %zu has an address of %zu bytes (1 to %d)",
                            msg, n, s->nodes[n].len, OVLD_ADDR_TEXT_MAX - 1);
    }
    return OVL_OK;
}

static ovl_status_t take_start(const Ovlcl__JobStart *s, ovld_cluster_msg_t *ret, const char *msg,
                               char *err, size_t errlen)
{
    ovld_cluster_start_msg_t *o = &ret->start;
    ovl_status_t st = take_nonce(&s->nonce, ret, msg, err, errlen);
    if (st == OVL_OK)
        st = check_start(s, msg, err, errlen);
    if (st != OVL_OK)
        return st;
    o->world = (uint32_t)s->world;
    o->nnodes = (uint32_t)s->n_nodes;
    o->self_node = (uint32_t)s->self_node;
    o->nrail_keys = (uint32_t)s->n_rail_keys;
    o->node_of = calloc(o->world, sizeof(*o->node_of));
    o->nodes = calloc(o->nnodes, sizeof(*o->nodes));
    o->rail_keys = o->nrail_keys ? calloc(o->nrail_keys, OVLD_CLUSTER_KEY_LEN) : NULL;
    if (!o->node_of || !o->nodes || (o->nrail_keys && !o->rail_keys))
        return ovl_errf(OVL_ERR_NOMEM, err, errlen, "out of memory");
    for (uint32_t q = 0; q < o->world; q++)
        o->node_of[q] = (uint32_t)s->node_of[q];
    for (uint32_t n = 0; n < o->nnodes; n++)
        text_of(&s->nodes[n], o->nodes[n], sizeof(o->nodes[n]));
    o->has_key = s->key.len != 0;
    if (o->has_key)
        memcpy(o->key, s->key.data, OVLD_CLUSTER_KEY_LEN);
    for (uint32_t i = 0; i < o->nrail_keys; i++)
        memcpy(o->rail_keys + (size_t)i * OVLD_CLUSTER_KEY_LEN, s->rail_keys[i].data,
               OVLD_CLUSTER_KEY_LEN);
    return OVL_OK;
}

/* An OpReady's scaling, checked as ovld checks a client's (request.c): a
 * peer's words are no more trusted. */
static ovl_status_t take_scaling(const Ovlcl__OpReady *r, uint32_t dtype, ovld_scaling_desc_t *sc,
                                 bool *has_bias, const char *msg, char *err, size_t errlen)
{
    bool fp8 = ovl_dtype_is_fp8((ovl_dtype_t)dtype);
    *sc = (ovld_scaling_desc_t){.scaled = false};
    *has_bias = false;
    if (!r->scaled) {
        if (fp8 || r->b_dtype || r->out_dtype || r->a_mode || r->b_mode || r->fast_accum ||
            r->has_bias)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: %s without its scaling", msg,
                            fp8 ? "an fp8 op" : "an op's scaling fields");
        return OVL_OK;
    }
    const char *why =
        ovl_scaling_refusal(dtype, r->b_dtype, r->out_dtype, r->a_mode, r->b_mode, r->transb);
    if (why)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: a scaling no op may "
                        "have: %s",
                        msg, why);
    *sc = (ovld_scaling_desc_t){.scaled = true,
                                .b_dtype = (uint32_t)r->b_dtype,
                                .out_dtype = (uint32_t)r->out_dtype,
                                .a_mode = (uint32_t)r->a_mode,
                                .b_mode = (uint32_t)r->b_mode,
                                .fast_accum = r->fast_accum};
    *has_bias = r->has_bias;
    return OVL_OK;
}

static ovl_status_t take_ready(const Ovlcl__OpReady *r, ovld_cluster_msg_t *ret, const char *msg,
                               char *err, size_t errlen)
{
    ovld_cluster_ready_msg_t *o = &ret->ready;
    ovl_status_t st;
    o->seq = r->seq;
    if ((st = take_nonce(&r->nonce, ret, msg, err, errlen)) != OVL_OK)
        return st;
    if (r->nb < 1 || r->nb > OVLD_MAX_BS)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: %" PRIu64 " Bs (1 to %d)", msg, r->nb, OVLD_MAX_BS);
    if (r->n_n_more != r->nb - 1)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: %" PRIu64 " Bs with %zu more n", msg, r->nb,
                        r->n_n_more);
    uint32_t dtype = 0, algo = 0, chunks = 0, streams = 0; /* set by take_u32 below */
    if ((st = take_u32(r->first_rank, &o->first_rank, msg, "first rank", err, errlen)) != OVL_OK ||
        (st = take_u32(r->dtype, &dtype, msg, "dtype", err, errlen)) != OVL_OK ||
        (st = take_u32(r->algo, &algo, msg, "algo", err, errlen)) != OVL_OK ||
        (st = take_u32(r->chunks, &chunks, msg, "chunks", err, errlen)) != OVL_OK ||
        (st = take_u32(r->streams, &streams, msg, "streams", err, errlen)) != OVL_OK)
        return st;
    if (status_of(r->status, OVL_ERR_PROTOCOL) != r->status)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: status %" PRId64 ", not a status", msg, r->status);
    o->status = (ovl_status_t)r->status;
    text_of(&r->reason, o->reason, sizeof(o->reason));
    /* absent: an ovld before the field, whose one kind was all-gather + GEMM */
    uint64_t kind = r->kind ? r->kind : OVLD_KIND_AG_GEMM;
    if (kind > UINT32_MAX || !ovld_kind((uint32_t)kind))
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: unknown op kind %" PRIu64, msg, kind);
    o->f.kind = (uint32_t)kind;
    if (kind == OVLD_KIND_GEMM_RS) {
        /* its own fields: one B, no a_out, a reduction */
        if (r->nb != 1 || r->has_aout || r->reduce_op >= OVL_REDUCE_OP_COUNT)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: a gemm_rs op with %" PRIu64
                            " Bs, %s a_out, reduce_op %" PRIu64 " (one B, no a_out, 0 or 1)",
                            msg, r->nb, r->has_aout ? "an" : "no", r->reduce_op);
        o->f.rs = (ovld_gemm_rs_desc_t){.m = r->m,
                                        .n = r->n,
                                        .k = r->k,
                                        .dtype = dtype,
                                        .algo = algo,
                                        .chunks = chunks,
                                        .streams = streams,
                                        .reduce_op = (uint32_t)r->reduce_op,
                                        .transb = r->transb};
        if ((st = take_scaling(r, dtype, &o->f.rs.sc, &o->f.rs.has_bias, msg, err, errlen)) !=
            OVL_OK)
            return st;
    } else {
        if (r->reduce_op != 0)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                            "protocol error: %s: an ag_gemm op with reduce_op %" PRIu64, msg,
                            r->reduce_op);
        o->f.ag.m = r->m;
        o->f.ag.n = r->n;
        o->f.ag.k = r->k;
        o->f.ag.dtype = dtype;
        o->f.ag.algo = algo;
        o->f.ag.chunks = chunks;
        o->f.ag.streams = streams;
        o->f.ag.transb = r->transb;
        o->f.ag.has_aout = r->has_aout;
        o->f.ag.nb = (uint32_t)r->nb;
        for (size_t i = 0; i < r->n_n_more; i++)
            o->f.ag.n_more[i] = r->n_more[i];
        if ((st = take_scaling(r, dtype, &o->f.ag.sc, &o->f.ag.has_bias, msg, err, errlen)) !=
            OVL_OK)
            return st;
    }
    o->strided = r->strided;
    o->shared_gpu = r->shared_gpu;
    return OVL_OK;
}

static ovl_status_t take_go(const Ovlcl__OpGo *g, ovld_cluster_msg_t *ret, const char *msg,
                            char *err, size_t errlen)
{
    ovld_cluster_go_msg_t *o = &ret->go;
    o->seq = g->seq;
    ovl_status_t st = take_nonce(&g->nonce, ret, msg, err, errlen);
    if (st != OVL_OK)
        return st;
    o->status = status_of(g->status, OVL_ERR_PROTOCOL);
    text_of(&g->reason, o->reason, sizeof(o->reason));
    o->strided = g->strided;
    o->shared_gpu = g->shared_gpu;
    if (o->status != OVL_OK)
        return OVL_OK;
    o->timed = g->timed;
    /* the parameters are checked again by the planner, which refuses what
     * it cannot plan: here only that they fit their fields */
    if (g->algo >= OVL_ALGO_COUNT || g->algo == OVL_ALGO_AUTO || g->chunks > OVL_PLAN_MAX_CHUNKS ||
        g->streams > OVL_PLAN_MAX_STREAMS || g->allgather >= OVL_AG_PREF_COUNT)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "the coordinator's parameters for op %" PRIu64 " are out of range", g->seq);
    o->algo = (uint32_t)g->algo;
    o->chunks = (uint32_t)g->chunks;
    o->streams = (uint32_t)g->streams;
    o->allgather = (uint32_t)g->allgather;
    return OVL_OK;
}

static ovl_status_t take_time(const Ovlcl__OpTime *t, ovld_cluster_msg_t *ret, const char *msg,
                              char *err, size_t errlen)
{
    ret->time.seq = t->seq;
    ret->time.ns = t->ns; /* any: a time is a measurement, not an index */
    ovl_status_t st = take_nonce(&t->nonce, ret, msg, err, errlen);
    if (st != OVL_OK)
        return st;
    if (t->outcome > 2)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "%s: outcome %" PRIu64 " is not 0, 1 or 2",
                        msg, t->outcome);
    ret->time.outcome = (uint32_t)t->outcome;
    return OVL_OK;
}

static ovl_status_t take_leave(const Ovlcl__JobLeave *l, ovld_cluster_msg_t *ret, const char *msg,
                               char *err, size_t errlen)
{
    ovl_status_t st = take_nonce(&l->nonce, ret, msg, err, errlen);
    if (st == OVL_OK)
        st = take_u32(l->rank, &ret->leave.rank, msg, "rank", err, errlen);
    if (st != OVL_OK)
        return st;
    ret->leave.abort = l->abort;
    text_of(&l->reason, ret->leave.reason, sizeof(ret->leave.reason));
    return OVL_OK;
}

static ovl_status_t take_end(const Ovlcl__JobEnd *e, ovld_cluster_msg_t *ret, const char *msg,
                             char *err, size_t errlen)
{
    ovl_status_t st = take_nonce(&e->nonce, ret, msg, err, errlen);
    if (st != OVL_OK)
        return st;
    ret->end.abort = e->abort;
    /* an end is never a success */
    ret->end.status = status_of(e->status, OVL_ERR_ABORTED);
    if (ret->end.status == OVL_OK)
        ret->end.status = OVL_ERR_ABORTED;
    text_of(&e->reason, ret->end.reason, sizeof(ret->end.reason));
    return OVL_OK;
}

/* The descriptor of type's message; NULL for a type not of the eight. */
static const ProtobufCMessageDescriptor *descriptor_of(uint32_t type)
{
    switch (type) {
    case OVLD_CLUSTER_JOB_JOIN:
        return &ovlcl__job_join__descriptor;
    case OVLD_CLUSTER_JOB_JOIN_REPLY:
        return &ovlcl__job_join_reply__descriptor;
    case OVLD_CLUSTER_JOB_START:
        return &ovlcl__job_start__descriptor;
    case OVLD_CLUSTER_OP_READY:
        return &ovlcl__op_ready__descriptor;
    case OVLD_CLUSTER_OP_GO:
        return &ovlcl__op_go__descriptor;
    case OVLD_CLUSTER_JOB_LEAVE:
        return &ovlcl__job_leave__descriptor;
    case OVLD_CLUSTER_JOB_END:
        return &ovlcl__job_end__descriptor;
    case OVLD_CLUSTER_OP_TIME:
        return &ovlcl__op_time__descriptor;
    }
    return NULL;
}

ovl_status_t ovld_cluster_decode(uint32_t type, const void *body, size_t len,
                                 ovld_cluster_msg_t *ret, char *err, size_t errlen)
{
    memset(ret, 0, sizeof(*ret));
    ret->type = type;
    char tb[32];
    const char *name = ovld_cluster_type_name(type, tb, sizeof(tb));
    const ProtobufCMessageDescriptor *d = descriptor_of(type);
    if (!d)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: a %s, not one of jobs across nodes", name);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, body);
    if (!m)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed %s", name);
    ret->unpacked = true;
    ovl_status_t st = OVL_OK;
    switch (type) {
    case OVLD_CLUSTER_JOB_JOIN:
        st = take_join((const Ovlcl__JobJoin *)m, ret, name, err, errlen);
        break;
    case OVLD_CLUSTER_JOB_JOIN_REPLY:
        take_join_reply((const Ovlcl__JobJoinReply *)m, ret);
        break;
    case OVLD_CLUSTER_JOB_START:
        st = take_start((const Ovlcl__JobStart *)m, ret, name, err, errlen);
        break;
    case OVLD_CLUSTER_OP_READY:
        st = take_ready((const Ovlcl__OpReady *)m, ret, name, err, errlen);
        break;
    case OVLD_CLUSTER_OP_GO:
        st = take_go((const Ovlcl__OpGo *)m, ret, name, err, errlen);
        break;
    case OVLD_CLUSTER_JOB_LEAVE:
        st = take_leave((const Ovlcl__JobLeave *)m, ret, name, err, errlen);
        break;
    case OVLD_CLUSTER_JOB_END:
        st = take_end((const Ovlcl__JobEnd *)m, ret, name, err, errlen);
        break;
    case OVLD_CLUSTER_OP_TIME:
        st = take_time((const Ovlcl__OpTime *)m, ret, name, err, errlen);
        break;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    if (st != OVL_OK)
        ovld_cluster_msg_clear(ret);
    return st;
}

/* ----------------------------------------------------------- encoding */

static ProtobufCBinaryData bin(const void *p, size_t n)
{
    return (ProtobufCBinaryData){.data = (uint8_t *)(uintptr_t)p, .len = n};
}

/* A text up to its NUL, at most max bytes. */
static ProtobufCBinaryData bin_text(const char *s, size_t max)
{
    return bin(s, strnlen(s, max));
}

static ovl_status_t encode_start(const ovld_cluster_msg_t *m, uint8_t **ret_body, size_t *ret_len)
{
    const ovld_cluster_start_msg_t *o = &m->start;
    Ovlcl__JobStart s = OVLCL__JOB_START__INIT;
    uint64_t *node_of = calloc(o->world ? o->world : 1, sizeof(*node_of));
    ProtobufCBinaryData *nodes = calloc(o->nnodes ? o->nnodes : 1, sizeof(*nodes));
    ProtobufCBinaryData *rail = calloc(o->nrail_keys ? o->nrail_keys : 1, sizeof(*rail));
    ovl_status_t st = node_of && nodes && rail ? OVL_OK : OVL_ERR_NOMEM;
    if (st == OVL_OK) {
        for (uint32_t q = 0; q < o->world; q++)
            node_of[q] = o->node_of[q];
        for (uint32_t n = 0; n < o->nnodes; n++)
            nodes[n] = bin_text(o->nodes[n], OVLD_ADDR_TEXT_MAX - 1);
        for (uint32_t i = 0; i < o->nrail_keys; i++)
            rail[i] = bin(o->rail_keys + (size_t)i * OVLD_CLUSTER_KEY_LEN, OVLD_CLUSTER_KEY_LEN);
        s.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
        s.world = o->world;
        s.n_node_of = o->world;
        s.node_of = node_of;
        s.n_nodes = o->nnodes;
        s.nodes = nodes;
        s.self_node = o->self_node;
        s.key = o->has_key ? bin(o->key, OVLD_CLUSTER_KEY_LEN) : bin(NULL, 0);
        s.n_rail_keys = o->nrail_keys;
        s.rail_keys = rail;
        st = ovl_wire_pack(&s.base, ret_body, ret_len);
    }
    free(node_of);
    free(nodes);
    free(rail);
    return st;
}

static ovl_status_t encode_ready(const ovld_cluster_msg_t *m, uint8_t **ret_body, size_t *ret_len)
{
    const ovld_cluster_ready_msg_t *o = &m->ready;
    Ovlcl__OpReady q = OVLCL__OP_READY__INIT;
    q.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
    q.seq = o->seq;
    q.status = o->status;
    q.reason = bin_text(o->reason, OVLD_CLUSTER_REASON_MAX);
    q.first_rank = o->first_rank;
    q.kind = o->f.kind;
    uint64_t more[OVLD_MAX_BS - 1];
    /* the scaling the node's ranks agree on (either kind's) */
    const ovld_scaling_desc_t *sc = o->f.kind == OVLD_KIND_GEMM_RS ? &o->f.rs.sc : &o->f.ag.sc;
    if (sc->scaled) {
        q.scaled = true;
        q.b_dtype = sc->b_dtype;
        q.out_dtype = sc->out_dtype;
        q.a_mode = sc->a_mode;
        q.b_mode = sc->b_mode;
        q.fast_accum = sc->fast_accum;
        q.has_bias = o->f.kind == OVLD_KIND_GEMM_RS ? o->f.rs.has_bias : o->f.ag.has_bias;
    }
    if (o->f.kind == OVLD_KIND_GEMM_RS) {
        const ovld_gemm_rs_desc_t *rs = &o->f.rs;
        q.m = rs->m;
        q.n = rs->n;
        q.k = rs->k;
        q.dtype = rs->dtype;
        q.algo = rs->algo;
        q.chunks = rs->chunks;
        q.streams = rs->streams;
        q.transb = rs->transb;
        q.nb = 1;
        q.reduce_op = rs->reduce_op;
    } else {
        q.m = o->f.ag.m;
        q.n = o->f.ag.n;
        q.k = o->f.ag.k;
        q.dtype = o->f.ag.dtype;
        q.algo = o->f.ag.algo;
        q.chunks = o->f.ag.chunks;
        q.streams = o->f.ag.streams;
        q.transb = o->f.ag.transb;
        q.has_aout = o->f.ag.has_aout;
        q.nb = o->f.ag.nb;
        q.n_n_more = o->f.ag.nb > 1 && o->f.ag.nb <= OVLD_MAX_BS ? o->f.ag.nb - 1 : 0;
        memcpy(more, o->f.ag.n_more, sizeof(more));
        q.n_more = more;
    }
    q.strided = o->strided;
    q.shared_gpu = o->shared_gpu;
    return ovl_wire_pack(&q.base, ret_body, ret_len);
}

ovl_status_t ovld_cluster_encode(const ovld_cluster_msg_t *m, uint8_t **ret_body, size_t *ret_len)
{
    *ret_body = NULL;
    *ret_len = 0;
    switch (m->type) {
    case OVLD_CLUSTER_JOB_JOIN: {
        Ovlcl__JobJoin q = OVLCL__JOB_JOIN__INIT;
        q.req = m->join.req;
        q.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
        q.instance = bin(m->join.instance, OVLD_INSTANCE_LEN);
        q.world = m->join.world;
        q.rank = m->join.rank;
        q.uid = m->join.uid;
        q.backend = bin_text(m->join.backend, OVLD_CLUSTER_BACKEND_MAX - 1);
        q.device = m->join.device;
        return ovl_wire_pack(&q.base, ret_body, ret_len);
    }
    case OVLD_CLUSTER_JOB_JOIN_REPLY: {
        Ovlcl__JobJoinReply r = OVLCL__JOB_JOIN_REPLY__INIT;
        r.req = m->join_reply.req;
        r.status = m->join_reply.status;
        r.reason = bin_text(m->join_reply.reason, OVLD_CLUSTER_REASON_MAX);
        return ovl_wire_pack(&r.base, ret_body, ret_len);
    }
    case OVLD_CLUSTER_JOB_START:
        return encode_start(m, ret_body, ret_len);
    case OVLD_CLUSTER_OP_READY:
        return encode_ready(m, ret_body, ret_len);
    case OVLD_CLUSTER_OP_GO: {
        Ovlcl__OpGo g = OVLCL__OP_GO__INIT;
        g.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
        g.seq = m->go.seq;
        g.status = m->go.status;
        g.reason = bin_text(m->go.reason, OVLD_CLUSTER_REASON_MAX);
        g.algo = m->go.algo;
        g.chunks = m->go.chunks;
        g.streams = m->go.streams;
        g.allgather = m->go.allgather;
        g.strided = m->go.strided;
        g.shared_gpu = m->go.shared_gpu;
        g.timed = m->go.timed;
        return ovl_wire_pack(&g.base, ret_body, ret_len);
    }
    case OVLD_CLUSTER_OP_TIME: {
        Ovlcl__OpTime t = OVLCL__OP_TIME__INIT;
        t.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
        t.seq = m->time.seq;
        t.ns = m->time.ns;
        t.outcome = m->time.outcome;
        return ovl_wire_pack(&t.base, ret_body, ret_len);
    }
    case OVLD_CLUSTER_JOB_LEAVE: {
        Ovlcl__JobLeave l = OVLCL__JOB_LEAVE__INIT;
        l.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
        l.rank = m->leave.rank;
        l.abort = m->leave.abort;
        l.reason = bin_text(m->leave.reason, OVLD_CLUSTER_REASON_MAX);
        return ovl_wire_pack(&l.base, ret_body, ret_len);
    }
    case OVLD_CLUSTER_JOB_END: {
        Ovlcl__JobEnd e = OVLCL__JOB_END__INIT;
        e.nonce = bin(m->nonce, OVLD_JOB_NONCE_LEN);
        e.abort = m->end.abort;
        e.status = m->end.status;
        e.reason = bin_text(m->end.reason, OVLD_CLUSTER_REASON_MAX);
        return ovl_wire_pack(&e.base, ret_body, ret_len);
    }
    }
    return OVL_ERR_INVALID;
}

/* ---------------------------------------------------------- the start */

ovl_status_t ovld_cluster_start_rails(const ovld_cluster_start_msg_t *s, uint32_t *group_of,
                                      uint32_t *pos, char *err, size_t errlen)
{
    /* one key per rail group, as this node counts them too */
    uint32_t ngroups = 0;
    ovl_status_t st = ovl_plan_rail_groups(s->world, s->node_of, group_of, pos, &ngroups);
    if (st == OVL_OK && ngroups != s->nrail_keys)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "the coordinator sent %u rail keys for %u rail groups", s->nrail_keys,
                        ngroups);
    return st;
}

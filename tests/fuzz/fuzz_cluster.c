/*
 * fuzz_cluster.c: libFuzzer target for the messages the ovld of a job
 * across nodes send each other (daemon/cluster/cluster_wire.h,
 * proto/cluster.proto), decoded as daemon/cluster/cluster.c decodes a
 * peer's message.
 *
 * Input: byte 0 chooses the message type (16 + byte % 16: the eight of
 * the module, JobJoin to OpTime, and the rest of its range), the rest is
 * the body.
 *
 * Properties (any failure aborts):
 * - only types 16 to 23 decode;
 * - a decoded message holds what the coordinator and the nodes rely on: a
 *   JobJoin of world 1 to OVL_PLAN_MAX_WORLD, a rank under it, a backend
 *   name of 1 to 15 bytes; a JobStart of world 1 to OVL_PLAN_MAX_WORLD on
 *   1 to world nodes, its own node one of them, every rank on a node and
 *   every node with a rank, addresses of 1 to OVLD_ADDR_TEXT_MAX - 1
 *   bytes, a key or rail keys (at most world) or neither; an OpReady of 1
 *   to OVLD_MAX_BS Bs whose n past them are 0, and a status; an OpGo whose
 *   parameters, with status 0, are an algorithm (not auto), chunks and
 *   streams within the planner's limits and an all-gather preference,
 *   and 0 (and not timed) otherwise; a JobEnd of an error status; an
 *   OpTime of any time and an outcome of 0 to 2, named; statuses that are
 *   statuses; every text clean (common/text.h), NUL-terminated, a reason
 *   of at most OVLD_CLUSTER_REASON_MAX bytes;
 * - a decoded JobStart with rail keys: ovld_cluster_start_rails says
 *   OVL_OK with each rank in a group under the keys' count, the groups
 *   numbered in the order of their lowest ranks and each rank's place its
 *   rank order in its group; or OVL_ERR_PROTOCOL with words;
 * - a decoded message encodes again and decodes to the same fields, and
 *   that encodes to the same bytes;
 * - a refusal is PROTOCOL, or NOMEM for a named JobStart; it has a
 *   non-empty message and holds no memory; a type not of the eight did not
 *   unpack, a named one unpacked; a JobJoinReply that unpacked, and a
 *   JobEnd that is named, are never refused; an OpGo refused once named
 *   says that its parameters are out of range; the verdict, and what is
 *   known of the message (unpacked, named, its req, seq and nonce), are
 *   the same with a shorter message buffer (the message cut), and errlen 0
 *   writes nothing;
 * - no read outside the input, no leak, no undefined behaviour (ASan,
 *   UBSan).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_wire.h"
#include "kind.h"
#include "plan.h"
#include "text.h"

#define FUZZ_NAME "fuzz_cluster"
#include "fuzz_main.h"

static bool is_status(ovl_status_t st)
{
    return st <= OVL_OK && st >= OVL_ERR_INTERNAL;
}

/* A text field: clean, NUL-terminated inside its buffer, of min..max
 * bytes. */
static void check_text(const char *s, size_t size, size_t min, size_t max)
{
    size_t n = strnlen(s, size);
    CHECK(n < size && n >= min && n <= max);
    CHECK(ovl_text_is_clean((const uint8_t *)s, n));
}

static void check_start(const ovld_cluster_start_msg_t *s)
{
    CHECK(s->world >= 1 && s->world <= OVL_PLAN_MAX_WORLD);
    CHECK(s->nnodes >= 1 && s->nnodes <= s->world && s->self_node < s->nnodes);
    CHECK(s->node_of != NULL && s->nodes != NULL);
    bool seen[OVL_PLAN_MAX_WORLD] = {false};
    for (uint32_t q = 0; q < s->world; q++) {
        CHECK(s->node_of[q] < s->nnodes);
        seen[s->node_of[q]] = true;
    }
    for (uint32_t n = 0; n < s->nnodes; n++) {
        CHECK(seen[n]);
        check_text(s->nodes[n], sizeof(s->nodes[n]), 1, OVLD_ADDR_TEXT_MAX - 1);
    }
    CHECK(s->nrail_keys <= s->world);
    CHECK(s->nrail_keys == 0 || !s->has_key);
    CHECK((s->nrail_keys == 0) == (s->rail_keys == NULL));
    if (s->nrail_keys == 0)
        return;
    uint32_t *group = malloc(2 * sizeof(*group) * s->world);
    CHECK(group != NULL);
    uint32_t *pos = group + s->world;
    char err[256] = "";
    ovl_status_t st = ovld_cluster_start_rails(s, group, pos, err, sizeof(err));
    if (st == OVL_OK) {
        uint32_t size[OVL_PLAN_MAX_WORLD] = {0}, next = 0;
        for (uint32_t q = 0; q < s->world; q++) {
            CHECK(group[q] < s->nrail_keys);
            CHECK(group[q] <= next); /* numbered by their lowest ranks */
            if (group[q] == next)
                next++;
            CHECK(pos[q] == size[group[q]]++);
        }
        CHECK(next == s->nrail_keys);
    } else {
        CHECK(st == OVL_ERR_PROTOCOL || st == OVL_ERR_NOMEM);
        CHECK(st != OVL_ERR_PROTOCOL || strstr(err, "rail keys for") != NULL);
    }
    free(group);
}

static void check_fields(const ovld_cluster_msg_t *m, uint32_t type)
{
    CHECK(m->type == type && ovld_cluster_type_known(type));
    CHECK(m->unpacked && m->named == (type != OVLD_CLUSTER_JOB_JOIN_REPLY));
    switch (type) {
    case OVLD_CLUSTER_JOB_JOIN:
        CHECK(m->join.world >= 1 && m->join.world <= OVL_PLAN_MAX_WORLD);
        CHECK(m->join.rank < m->join.world);
        check_text(m->join.backend, sizeof(m->join.backend), 1, OVLD_CLUSTER_BACKEND_MAX - 1);
        break;
    case OVLD_CLUSTER_JOB_JOIN_REPLY:
        CHECK(is_status(m->join_reply.status));
        check_text(m->join_reply.reason, sizeof(m->join_reply.reason), 0, OVLD_CLUSTER_REASON_MAX);
        break;
    case OVLD_CLUSTER_JOB_START:
        check_start(&m->start);
        break;
    case OVLD_CLUSTER_OP_READY: {
        const ovld_cluster_ready_msg_t *r = &m->ready;
        CHECK(is_status(r->status));
        check_text(r->reason, sizeof(r->reason), 0, OVLD_CLUSTER_REASON_MAX);
        CHECK(ovld_kind(r->f.kind) != NULL); /* a kind of the table: absent reads as ag_gemm */
        /* a scaling exactly for an fp8 dtype, one an op may have */
        bool rs = r->f.kind == OVLD_KIND_GEMM_RS;
        const ovld_scaling_desc_t *sc = rs ? &r->f.rs.sc : &r->f.ag.sc;
        uint32_t dt = rs ? r->f.rs.dtype : r->f.ag.dtype;
        bool bias = rs ? r->f.rs.has_bias : r->f.ag.has_bias;
        CHECK(sc->scaled == ovl_dtype_is_fp8((ovl_dtype_t)dt));
        if (sc->scaled) {
            CHECK(ovl_dtype_is_fp8((ovl_dtype_t)sc->b_dtype));
            CHECK(!(dt == OVL_DTYPE_FP8_E5M2 && sc->b_dtype == OVL_DTYPE_FP8_E5M2));
            CHECK(sc->out_dtype < OVL_DTYPE_COUNT && !ovl_dtype_is_fp8((ovl_dtype_t)sc->out_dtype));
            CHECK(sc->a_mode < OVL_SCALE_MODE_COUNT && sc->b_mode < OVL_SCALE_MODE_COUNT);
            CHECK(rs ? r->f.rs.transb : r->f.ag.transb);
        } else {
            CHECK(!bias && sc->b_dtype == 0 && sc->out_dtype == 0 && sc->a_mode == 0 &&
                  sc->b_mode == 0 && !sc->fast_accum);
        }
        if (r->f.kind == OVLD_KIND_GEMM_RS) { /* one B, no a_out: its own fields */
            CHECK(r->f.rs.reduce_op < OVL_REDUCE_OP_COUNT);
        } else {
            CHECK(r->f.ag.nb >= 1 && r->f.ag.nb <= OVLD_MAX_BS);
            for (uint32_t i = r->f.ag.nb - 1; i < OVLD_MAX_BS - 1; i++)
                CHECK(r->f.ag.n_more[i] == 0);
        }
        break;
    }
    case OVLD_CLUSTER_OP_GO: {
        const ovld_cluster_go_msg_t *g = &m->go;
        CHECK(is_status(g->status));
        check_text(g->reason, sizeof(g->reason), 0, OVLD_CLUSTER_REASON_MAX);
        if (g->status == OVL_OK) {
            CHECK(g->algo != OVL_ALGO_AUTO && g->algo < OVL_ALGO_COUNT);
            CHECK(g->chunks <= OVL_PLAN_MAX_CHUNKS && g->streams <= OVL_PLAN_MAX_STREAMS);
            CHECK(g->allgather < OVL_AG_PREF_COUNT);
        } else {
            CHECK(g->algo == 0 && g->chunks == 0 && g->streams == 0 && g->allgather == 0);
            CHECK(!g->timed);
        }
        break;
    }
    case OVLD_CLUSTER_OP_TIME:
        CHECK(m->named && m->time.outcome <= 2);
        break;
    case OVLD_CLUSTER_JOB_LEAVE:
        check_text(m->leave.reason, sizeof(m->leave.reason), 0, OVLD_CLUSTER_REASON_MAX);
        break;
    case OVLD_CLUSTER_JOB_END:
        CHECK(is_status(m->end.status) && m->end.status != OVL_OK);
        check_text(m->end.reason, sizeof(m->end.reason), 0, OVLD_CLUSTER_REASON_MAX);
        break;
    }
}

static void check_same_start(const ovld_cluster_start_msg_t *a, const ovld_cluster_start_msg_t *b)
{
    CHECK(a->world == b->world && a->nnodes == b->nnodes && a->self_node == b->self_node);
    CHECK(memcmp(a->node_of, b->node_of, a->world * sizeof(*a->node_of)) == 0);
    for (uint32_t n = 0; n < a->nnodes; n++)
        CHECK(strcmp(a->nodes[n], b->nodes[n]) == 0);
    CHECK(a->has_key == b->has_key);
    CHECK(!a->has_key || memcmp(a->key, b->key, sizeof(a->key)) == 0);
    CHECK(a->nrail_keys == b->nrail_keys);
    CHECK(a->nrail_keys == 0 ||
          memcmp(a->rail_keys, b->rail_keys, (size_t)a->nrail_keys * OVLD_CLUSTER_KEY_LEN) == 0);
}

static void check_same_ready(const ovld_cluster_ready_msg_t *a, const ovld_cluster_ready_msg_t *b)
{
    CHECK(a->seq == b->seq && a->status == b->status && strcmp(a->reason, b->reason) == 0);
    CHECK(a->first_rank == b->first_rank && a->f.kind == b->f.kind);
    CHECK(a->strided == b->strided && a->shared_gpu == b->shared_gpu);
    if (a->f.kind == OVLD_KIND_GEMM_RS) {
        const ovld_gemm_rs_desc_t *x = &a->f.rs, *y = &b->f.rs;
        CHECK(x->m == y->m && x->n == y->n && x->k == y->k && x->dtype == y->dtype &&
              x->algo == y->algo && x->chunks == y->chunks && x->streams == y->streams &&
              x->reduce_op == y->reduce_op && x->transb == y->transb);
        CHECK(memcmp(&x->sc, &y->sc, sizeof(x->sc)) == 0 && x->has_bias == y->has_bias);
        return;
    }
    CHECK(memcmp(&a->f.ag.sc, &b->f.ag.sc, sizeof(a->f.ag.sc)) == 0 &&
          a->f.ag.has_bias == b->f.ag.has_bias);
    CHECK(a->f.ag.m == b->f.ag.m && a->f.ag.n == b->f.ag.n && a->f.ag.k == b->f.ag.k);
    CHECK(a->f.ag.dtype == b->f.ag.dtype && a->f.ag.algo == b->f.ag.algo &&
          a->f.ag.chunks == b->f.ag.chunks && a->f.ag.streams == b->f.ag.streams);
    CHECK(a->f.ag.transb == b->f.ag.transb && a->f.ag.has_aout == b->f.ag.has_aout &&
          a->f.ag.nb == b->f.ag.nb);
    CHECK(memcmp(a->f.ag.n_more, b->f.ag.n_more, sizeof(a->f.ag.n_more)) == 0);
    CHECK(a->strided == b->strided && a->shared_gpu == b->shared_gpu);
}

/* a and b hold the same message. */
static void check_same(const ovld_cluster_msg_t *a, const ovld_cluster_msg_t *b)
{
    CHECK(a->type == b->type && a->unpacked == b->unpacked && a->named == b->named);
    CHECK(!a->named || memcmp(a->nonce, b->nonce, sizeof(a->nonce)) == 0);
    switch (a->type) {
    case OVLD_CLUSTER_JOB_JOIN: {
        const ovld_cluster_join_msg_t *x = &a->join, *y = &b->join;
        CHECK(x->req == y->req && memcmp(x->instance, y->instance, sizeof(x->instance)) == 0);
        CHECK(x->world == y->world && x->rank == y->rank && x->uid == y->uid &&
              x->device == y->device);
        CHECK(strcmp(x->backend, y->backend) == 0);
        break;
    }
    case OVLD_CLUSTER_JOB_JOIN_REPLY:
        CHECK(a->join_reply.req == b->join_reply.req);
        CHECK(a->join_reply.status == b->join_reply.status);
        CHECK(strcmp(a->join_reply.reason, b->join_reply.reason) == 0);
        break;
    case OVLD_CLUSTER_JOB_START:
        check_same_start(&a->start, &b->start);
        break;
    case OVLD_CLUSTER_OP_READY:
        check_same_ready(&a->ready, &b->ready);
        break;
    case OVLD_CLUSTER_OP_GO: {
        const ovld_cluster_go_msg_t *x = &a->go, *y = &b->go;
        CHECK(x->seq == y->seq && x->status == y->status && strcmp(x->reason, y->reason) == 0);
        CHECK(x->algo == y->algo && x->chunks == y->chunks && x->streams == y->streams &&
              x->allgather == y->allgather);
        CHECK(x->strided == y->strided && x->shared_gpu == y->shared_gpu && x->timed == y->timed);
        break;
    }
    case OVLD_CLUSTER_OP_TIME:
        CHECK(a->time.seq == b->time.seq && a->time.ns == b->time.ns &&
              a->time.outcome == b->time.outcome);
        break;
    case OVLD_CLUSTER_JOB_LEAVE:
        CHECK(a->leave.rank == b->leave.rank && a->leave.abort == b->leave.abort);
        CHECK(strcmp(a->leave.reason, b->leave.reason) == 0);
        break;
    case OVLD_CLUSTER_JOB_END:
        CHECK(a->end.abort == b->end.abort && a->end.status == b->end.status);
        CHECK(strcmp(a->end.reason, b->end.reason) == 0);
        break;
    }
}

/* Encoding a decoded message and decoding it again gives the same, and
 * encoding that gives the same bytes. */
static void check_roundtrip(const ovld_cluster_msg_t *m)
{
    uint8_t *b, *b2;
    size_t len, len2;
    CHECK(ovld_cluster_encode(m, &b, &len) == OVL_OK && b != NULL);
    ovld_cluster_msg_t m2;
    char err[256];
    CHECK(ovld_cluster_decode(m->type, b, len, &m2, err, sizeof(err)) == OVL_OK);
    check_same(m, &m2);
    CHECK(ovld_cluster_encode(&m2, &b2, &len2) == OVL_OK);
    CHECK(len2 == len && memcmp(b, b2, len) == 0);
    ovld_cluster_msg_clear(&m2);
    free(b);
    free(b2);
}

/* What is known of a refused message: the same however long the buffer
 * for the words. */
static void check_same_refusal(const ovld_cluster_msg_t *a, const ovld_cluster_msg_t *b)
{
    CHECK(a->type == b->type && a->unpacked == b->unpacked && a->named == b->named);
    CHECK(!a->named || memcmp(a->nonce, b->nonce, sizeof(a->nonce)) == 0);
    if (a->type == OVLD_CLUSTER_JOB_JOIN)
        CHECK(a->join.req == b->join.req);
    if (a->type == OVLD_CLUSTER_OP_READY)
        CHECK(a->ready.seq == b->ready.seq);
    if (a->type == OVLD_CLUSTER_OP_GO)
        CHECK(a->go.seq == b->go.seq);
    if (a->type == OVLD_CLUSTER_OP_TIME)
        CHECK(a->time.seq == b->time.seq);
}

static void check_refusal(uint32_t type, const uint8_t *body, size_t len, ovl_status_t st,
                          const ovld_cluster_msg_t *m, const char *err, size_t errsize)
{
    CHECK(st == OVL_ERR_PROTOCOL || st == OVL_ERR_NOMEM);
    CHECK(err[0] != '\0' && strnlen(err, errsize) < errsize);
    CHECK(m->type == type);
    CHECK(ovld_cluster_type_known(type) || !m->unpacked);
    CHECK(!m->named || m->unpacked);
    CHECK(st != OVL_ERR_NOMEM || (type == OVLD_CLUSTER_JOB_START && m->named));
    CHECK(!(type == OVLD_CLUSTER_JOB_JOIN_REPLY && m->unpacked));
    CHECK(!(type == OVLD_CLUSTER_JOB_END && m->named));
    if (type == OVLD_CLUSTER_OP_GO && m->named)
        CHECK(strncmp(err, "the coordinator's parameters for op", 35) == 0);
    if (type == OVLD_CLUSTER_JOB_START)
        CHECK(m->start.node_of == NULL && m->start.nodes == NULL && m->start.rail_keys == NULL);
    /* a shorter buffer: the same verdict, the message cut */
    ovld_cluster_msg_t m2;
    char small[16];
    CHECK(ovld_cluster_decode(type, body, len, &m2, small, sizeof(small)) == st);
    CHECK(strncmp(small, err, sizeof(small) - 1) == 0);
    check_same_refusal(m, &m2);
    char none[2] = "x";
    CHECK(ovld_cluster_decode(type, body, len, &m2, none, 0) == st);
    CHECK(none[0] == 'x');
    check_same_refusal(m, &m2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t type = OVLD_CLUSTER_JOB_JOIN + data[0] % 16;
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    ovld_cluster_msg_t m;
    char err[512];
    err[0] = '\0';
    ovl_status_t st = ovld_cluster_decode(type, body, len, &m, err, sizeof(err));
    if (st != OVL_OK) {
        check_refusal(type, body, len, st, &m, err, sizeof(err));
        ovld_cluster_msg_clear(&m); /* (nothing to free: allowed all the same) */
        return 0;
    }
    check_fields(&m, type);
    check_roundtrip(&m);
    ovld_cluster_msg_clear(&m);
    return 0;
}

#ifdef OVL_FUZZ_STANDALONE

static uint8_t in[4096], mut[4096];

/* m built by the encoder, read as every type, then mutated bit by bit and
 * cut at every length. */
static void run_message(const ovld_cluster_msg_t *m)
{
    uint8_t *b;
    size_t len;
    CHECK(ovld_cluster_encode(m, &b, &len) == OVL_OK);
    CHECK(len + 1 <= sizeof(in));
    memcpy(in + 1, b, len);
    free(b);
    size_t n = len + 1;
    for (uint8_t as = 0; as < 16; as++) {
        in[0] = as;
        fuzz_run(in, n);
    }
    in[0] = (uint8_t)(m->type - OVLD_CLUSTER_JOB_JOIN);
    for (size_t i = 1; i < n; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(mut, in, n);
            mut[i] ^= (uint8_t)(1u << bit);
            fuzz_run(mut, n);
        }
        fuzz_run(in, i); /* every prefix */
    }
}

/* One message of each type, with its fields at values a sender uses and
 * at the edges of their ranges. */
static void fuzz_builtin(void)
{
    ovld_cluster_msg_t m;
    memset(&m, 0, sizeof(m));
    memcpy(m.nonce, "0123456789abcdef", sizeof(m.nonce));

    m.type = OVLD_CLUSTER_JOB_JOIN;
    m.join.req = 7;
    memcpy(m.join.instance, "instance-instanc", sizeof(m.join.instance));
    m.join.world = 4;
    m.join.rank = 3;
    m.join.uid = 1000;
    m.join.device = 1;
    snprintf(m.join.backend, sizeof(m.join.backend), "host");
    run_message(&m);
    m.join.world = OVL_PLAN_MAX_WORLD;
    m.join.rank = OVL_PLAN_MAX_WORLD - 1;
    m.join.uid = UINT32_MAX;
    snprintf(m.join.backend, sizeof(m.join.backend), "fifteen-bytes-x");
    run_message(&m);

    memset(&m.join, 0, sizeof(m.join));
    m.type = OVLD_CLUSTER_JOB_JOIN_REPLY;
    m.join_reply.req = 7;
    m.join_reply.status = OVL_ERR_MISMATCH;
    snprintf(m.join_reply.reason, sizeof(m.join_reply.reason), "job 0123: world 4, not 2");
    run_message(&m);

    memset(&m.join_reply, 0, sizeof(m.join_reply));
    uint32_t node_of[6] = {0, 0, 0, 1, 1, 1};
    char nodes[2][OVLD_ADDR_TEXT_MAX] = {"10.0.0.5:7411", "[fd00::6]:7411"};
    static uint8_t keys[3 * OVLD_CLUSTER_KEY_LEN];
    for (size_t i = 0; i < sizeof(keys); i++)
        keys[i] = (uint8_t)(i * 13);
    m.type = OVLD_CLUSTER_JOB_START;
    m.start.world = 6;
    m.start.nnodes = 2;
    m.start.self_node = 1;
    m.start.node_of = node_of;
    m.start.nodes = nodes;
    run_message(&m); /* no key (host) */
    m.start.has_key = true;
    memcpy(m.start.key, keys, OVLD_CLUSTER_KEY_LEN);
    run_message(&m);
    m.start.has_key = false;
    m.start.nrail_keys = 3; /* ranks sharing GPUs: a key per rail group */
    m.start.rail_keys = keys;
    run_message(&m);

    memset(&m.start, 0, sizeof(m.start));
    m.type = OVLD_CLUSTER_OP_READY;
    m.ready.seq = 42;
    m.ready.first_rank = 2;
    m.ready.f = (ovld_op_fields_t){.kind = OVLD_KIND_AG_GEMM,
                                   .ag = {.m = 1024,
                                          .n = 256,
                                          .k = 512,
                                          .dtype = 1,
                                          .algo = 3,
                                          .chunks = 4,
                                          .streams = 2,
                                          .has_aout = true,
                                          .nb = 3,
                                          .n_more = {64, 96}}};
    m.ready.strided = true;
    run_message(&m);
    m.ready.status = OVL_ERR_RANGE;
    snprintf(m.ready.reason, sizeof(m.ready.reason), "rank 2: B 1 lies outside its buffer");
    m.ready.f.ag.nb = OVLD_MAX_BS;
    for (int i = 0; i < OVLD_MAX_BS - 1; i++)
        m.ready.f.ag.n_more[i] = UINT64_MAX - (uint64_t)i;
    run_message(&m);

    /* the kind: absent (an older ovld's) reads as ag_gemm, one the table
     * does not have is refused */
    m.ready.f.kind = OVLD_KIND_NONE;
    run_message(&m);
    m.ready.f.kind = 7;
    run_message(&m);
    m.ready.f.kind = UINT32_MAX;
    run_message(&m);
    /* GEMM + reduce-scatter's: its reduction travels, and its one B */
    m.ready.status = OVL_OK;
    m.ready.reason[0] = '\0';
    m.ready.f = (ovld_op_fields_t){.kind = OVLD_KIND_GEMM_RS,
                                   .rs = {.m = 4096,
                                          .n = 1024,
                                          .k = 2048,
                                          .dtype = 0,
                                          .algo = 2,
                                          .chunks = 3,
                                          .streams = 2,
                                          .reduce_op = OVL_REDUCE_AVG,
                                          .transb = true}};
    run_message(&m);
    /* a scaled op's agreement travels (either kind), checked as a
     * client's: fp8e5m2 twice, or a scaling on bf16, is refused */
    m.ready.f.rs.dtype = OVL_DTYPE_FP8_E4M3;
    m.ready.f.rs.sc = (ovld_scaling_desc_t){.scaled = true,
                                            .b_dtype = OVL_DTYPE_FP8_E5M2,
                                            .out_dtype = OVL_DTYPE_FP32,
                                            .a_mode = OVL_SCALE_ROW,
                                            .b_mode = OVL_SCALE_TENSOR,
                                            .fast_accum = true};
    m.ready.f.rs.has_bias = true;
    run_message(&m);
    m.ready.f.rs.dtype = OVL_DTYPE_FP8_E5M2;
    run_message(&m);
    m.ready.f.rs.dtype = OVL_DTYPE_BF16;
    run_message(&m);
    m.ready.f = (ovld_op_fields_t){.kind = OVLD_KIND_AG_GEMM,
                                   .ag = {.m = 64,
                                          .n = 32,
                                          .k = 64,
                                          .dtype = OVL_DTYPE_FP8_E5M2,
                                          .transb = true,
                                          .nb = 2,
                                          .n_more = {48},
                                          .sc = {.scaled = true,
                                                 .b_dtype = OVL_DTYPE_FP8_E4M3,
                                                 .out_dtype = OVL_DTYPE_BF16,
                                                 .a_mode = OVL_SCALE_TENSOR,
                                                 .b_mode = OVL_SCALE_ROW}}};
    run_message(&m);

    memset(&m.ready, 0, sizeof(m.ready));
    m.type = OVLD_CLUSTER_OP_GO;
    m.go.seq = 42;
    m.go.algo = OVL_ALGO_RING;
    m.go.chunks = OVL_PLAN_MAX_CHUNKS;
    m.go.streams = OVL_PLAN_MAX_STREAMS;
    m.go.allgather = OVL_AG_PREF_COUNT - 1;
    m.go.shared_gpu = true;
    m.go.timed = true;
    run_message(&m);
    m.go.timed = false;
    m.go.algo = m.go.chunks = m.go.streams = m.go.allgather = 0;
    m.go.status = OVL_ERR_UNSUPPORTED;
    snprintf(m.go.reason, sizeof(m.go.reason), "ranks 0 and 1 share device 0 on 10.0.0.5:7411");
    run_message(&m);

    memset(&m.go, 0, sizeof(m.go));
    m.type = OVLD_CLUSTER_OP_TIME;
    m.time.seq = 7;
    m.time.ns = UINT64_MAX;
    run_message(&m);
    m.time.ns = 0;
    m.time.outcome = 2;
    run_message(&m);

    memset(&m.time, 0, sizeof(m.time));
    m.type = OVLD_CLUSTER_JOB_LEAVE;
    m.leave.rank = OVLD_CLUSTER_NO_RANK;
    m.leave.abort = true;
    memset(m.leave.reason, 'r', OVLD_CLUSTER_REASON_MAX); /* the longest */
    run_message(&m);

    memset(&m.leave, 0, sizeof(m.leave));
    m.type = OVLD_CLUSTER_JOB_END;
    m.end.abort = true;
    m.end.status = OVL_ERR_ABORTED;
    snprintf(m.end.reason, sizeof(m.end.reason), "node 10.0.0.6:7411 is down: \xc3\xa9t\xc3\xa9");
    run_message(&m);

    for (int k = 0; k < 20000; k++) {
        size_t len = 1 + fuzz_prng() % 200;
        for (size_t i = 0; i < len; i++)
            in[i] = (uint8_t)fuzz_prng();
        fuzz_run(in, len);
    }
}

#endif

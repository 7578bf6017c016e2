/*
 * request.c: see request.h.
 */
#include "request.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "config.h" /* OVLD_ADDR_TEXT_MAX */
#include "kind.h"
#include "scaling.h" /* ovl_scaling_refusal */
#include "plan.h"
#include "text.h"

static ovl_status_t bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ovl_status_t bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return OVL_ERR_INVALID;
}

/* A field's value against lo..hi, 64-bit, before anything narrows it. */
static bool in_range(uint64_t v, uint64_t lo, uint64_t hi)
{
    return v >= lo && v <= hi;
}

#define RANGE(field, v, lo, hi)                                                                    \
    do {                                                                                           \
        if (!in_range((v), (lo), (hi)))                                                            \
            return bad(err, errlen, "%s %" PRIu64 " out of range %" PRIu64 "..%" PRIu64, field,    \
                       (uint64_t)(v), (uint64_t)(lo), (uint64_t)(hi));                             \
    } while (0)

static ovl_status_t check_hello(const Ovl__Hello *h, char *err, size_t errlen)
{
    /* A version over 32 bits is still a version: the handler answers it
     * with a mismatch naming both, as it does any other. wants is a bit
     * set whose unknown bits are ignored. The name is cleaned, not refused
     * (dispatch.c): it is only shown. */
    (void)h;
    (void)err;
    (void)errlen;
    return OVL_OK;
}

static ovl_status_t check_job_id(const ProtobufCBinaryData *id, char *err, size_t errlen)
{
    if (id->len == 0 || id->len > OVLD_JOB_ID_MAX)
        return bad(err, errlen, "job id must be 1 to %d bytes, not %zu", OVLD_JOB_ID_MAX, id->len);
    for (size_t i = 0; i < id->len; i++)
        if (id->data[i] == 0)
            return bad(err, errlen, "job id holds a NUL byte at %zu", i);
    if (!ovl_text_is_clean(id->data, id->len))
        return bad(err, errlen,
                   "job id must be UTF-8 text without control characters (ids are shown to "
                   "operators)");
    return OVL_OK;
}

static ovl_status_t check_comm_init(const Ovl__CommInit *q, char *err, size_t errlen)
{
    ovl_status_t st;
    if (q->job_blob.len > 0) {
        /* a job across nodes: its id, and not a name besides */
        if (q->job_id.len > 0)
            return bad(err, errlen, "CommInit names a job by id and by job id bytes: one only");
        ovld_job_blob_t b;
        char why[160];
        if (ovld_job_blob_decode(q->job_blob.data, q->job_blob.len, &b, why, sizeof(why)) != OVL_OK)
            return bad(err, errlen, "not a job id of ovl_job_id_create: %s", why);
    } else if ((st = check_job_id(&q->job_id, err, errlen)) != OVL_OK) {
        return st;
    }
    RANGE("world", q->world, 1, OVL_PLAN_MAX_WORLD);
    if (q->rank >= q->world)
        return bad(err, errlen, "rank %" PRIu64 " out of range for world %" PRIu64, q->rank,
                   q->world);
    if (q->device_uuid.len != OVLD_UUID_LEN)
        return bad(err, errlen, "device UUID must be %d bytes, not %zu", OVLD_UUID_LEN,
                   q->device_uuid.len);
    return OVL_OK;
}

static ovl_status_t check_mem_register(const Ovl__MemRegister *q, char *err, size_t errlen)
{
    if (q->fd_count > 1) {
        /* the descriptors queued no longer match the requests: the stream
         * is out of step, and the caller closes it */
        snprintf(err, errlen, "MemRegister carries at most one descriptor, not %" PRIu64,
                 q->fd_count);
        return OVL_ERR_PROTOCOL;
    }
    if (q->bytes == 0)
        return bad(err, errlen, "cannot register zero bytes");
    if (q->ipc_handle.len > OVLD_IPC_HANDLE_MAX)
        return bad(err, errlen, "IPC handle too long: %zu bytes (at most %d)", q->ipc_handle.len,
                   OVLD_IPC_HANDLE_MAX);
    if (q->device_uuid.len != 0 && q->device_uuid.len != OVLD_UUID_LEN)
        return bad(err, errlen, "device UUID must be %d bytes, not %zu", OVLD_UUID_LEN,
                   q->device_uuid.len);
    return OVL_OK;
}

/* An all-gather + GEMM's type, algorithm, shape and split. */
static ovl_status_t check_op_shape(uint64_t dtype, uint64_t algo, uint64_t m, uint64_t n,
                                   uint64_t k, uint64_t chunks, uint64_t streams, char *err,
                                   size_t errlen)
{
    if (dtype >= OVL_DTYPE_COUNT)
        return bad(err, errlen, "unknown dtype %" PRIu64, dtype);
    if (algo >= OVL_ALGO_COUNT)
        return bad(err, errlen, "unknown algorithm %" PRIu64, algo);
    if (m == 0 || n == 0 || k == 0)
        return bad(err, errlen,
                   "m, n and k must be positive (m=%" PRIu64 " n=%" PRIu64 " k=%" PRIu64 ")", m, n,
                   k);
    RANGE("chunks", chunks, 0, OVL_PLAN_MAX_CHUNKS);
    RANGE("streams", streams, 0, OVL_PLAN_MAX_STREAMS);
    return OVL_OK;
}

/* Whether an op of dtype is scaled as it must be (Scaling: an fp8 dtype
 * needs it, no other takes it), and the scaling itself (the core's rule,
 * ovl_scaling_refusal), the values named. */
static ovl_status_t check_scaling(uint64_t dtype, const Ovl__Scaling *sc, bool transb, char *err,
                                  size_t errlen)
{
    bool fp8 = ovl_dtype_is_fp8((ovl_dtype_t)dtype);
    if (!sc)
        return fp8 ? bad(err, errlen,
                         "dtype %s needs scaling: the scales and the output dtype of an fp8 op",
                         ovl_dtype_name((ovl_dtype_t)dtype))
                   : OVL_OK;
    if (!fp8)
        return bad(err, errlen, "scaling is for the fp8 dtypes; dtype %s is not one",
                   ovl_dtype_name((ovl_dtype_t)dtype));
    const char *why =
        ovl_scaling_refusal(dtype, sc->b_dtype, sc->out_dtype, sc->a_mode, sc->b_mode, transb);
    if (why)
        return bad(err, errlen,
                   "%s (b_dtype %" PRIu64 ", out_dtype %" PRIu64 ", scale modes %" PRIu64
                   "/%" PRIu64 ")",
                   why, sc->b_dtype, sc->out_dtype, sc->a_mode, sc->b_mode);
    return OVL_OK;
}

/*
 * The Bs after B 0 (whose n check_op_shape checks), as an op (more_bs) and
 * a Plan request (more_n) carry them: count of them, at most OVLD_MAX_BS - 1,
 * B i's n being n_of(q, i - 1), each positive.
 */
static ovl_status_t check_more_bs(size_t count, uint64_t (*n_of)(const void *q, size_t i),
                                  const void *q, char *err, size_t errlen)
{
    if (count > OVLD_MAX_BS - 1)
        return bad(err, errlen, "%zu Bs: an op takes at most %d", count + 1, OVLD_MAX_BS);
    for (size_t i = 0; i < count; i++)
        if (n_of(q, i) == 0)
            return bad(err, errlen, "n of B %zu must be positive", i + 1);
    return OVL_OK;
}

static uint64_t ag_gemm_more_n(const void *q, size_t i)
{
    return ((const Ovl__AgGemmParams *)q)->more_n[i];
}

static ovl_status_t check_ag_gemm(const Ovl__AgGemmParams *q, char *err, size_t errlen)
{
    ovl_status_t st =
        check_op_shape(q->dtype, q->algo, q->m, q->n, q->k, q->chunks, q->streams, err, errlen);
    if (st != OVL_OK)
        return st;
    if (!ovl_op_kind_takes_algo(OVL_OP_AG_GEMM, (ovl_algo_t)q->algo))
        return bad(err, errlen, "algorithm %s: ag_gemm has %s", ovl_algo_name((ovl_algo_t)q->algo),
                   ovl_op_kind_algos(OVL_OP_AG_GEMM));
    /* B 0's n is the op's own; the others' come in more_n */
    if ((st = check_more_bs(q->n_more_n, ag_gemm_more_n, q, err, errlen)) != OVL_OK)
        return st;
    return check_scaling(q->dtype, q->scaling, q->transb, err, errlen);
}

/* GEMM + reduce-scatter's parameters: its algorithms (naive, collective,
 * push or auto); a reduce_op of ReduceOp. */
static ovl_status_t check_gemm_rs(const Ovl__GemmRsParams *q, char *err, size_t errlen)
{
    ovl_status_t st =
        check_op_shape(q->dtype, q->algo, q->m, q->n, q->k, q->chunks, q->streams, err, errlen);
    if (st != OVL_OK)
        return st;
    if (!ovl_op_kind_takes_algo(OVL_OP_GEMM_RS, (ovl_algo_t)q->algo))
        return bad(err, errlen, "algorithm %s: gemm_rs has %s", ovl_algo_name((ovl_algo_t)q->algo),
                   ovl_op_kind_algos(OVL_OP_GEMM_RS));
    if (q->reduce_op >= OVL_REDUCE_OP_COUNT)
        return bad(err, errlen, "unknown reduce_op %" PRIu64 " (sum 0, avg 1)", q->reduce_op);
    return check_scaling(q->dtype, q->scaling, q->transb, err, errlen);
}

/* An op's kind and its parameters, as an Op and a Plan request carry them:
 * a kind this ovld runs, its parameters in the field it names (and no
 * other kind's), and that kind's checks. */
static ovl_status_t check_kind_params(uint64_t kind, const Ovl__AgGemmParams *ag,
                                      const Ovl__GemmRsParams *rs, char *err, size_t errlen)
{
    switch (kind) {
    case OVL__OP_KIND__OP_KIND_AG_GEMM:
        if (!ag || rs)
            return bad(err, errlen,
                       "an op of kind ag_gemm carries its parameters in ag_gemm, and only there");
        return check_ag_gemm(ag, err, errlen);
    case OVL__OP_KIND__OP_KIND_GEMM_RS:
        if (!rs || ag)
            return bad(err, errlen,
                       "an op of kind gemm_rs carries its parameters in gemm_rs, and only there");
        return check_gemm_rs(rs, err, errlen);
    default:
        return bad(err, errlen, "unknown op kind %" PRIu64, kind);
    }
}

/* The slots a scaled op has (a_scale, b_scale and bias, and B i's: 18 to
 * 34) given (seen) to an op or a Plan request of kind with these (checked)
 * parameters: none unless the op is scaled, and a scaled op of several Bs
 * gives a bias for every B or for none. */
static ovl_status_t check_scaled_slots(uint64_t kind, const Ovl__AgGemmParams *ag,
                                       const Ovl__GemmRsParams *rs, const bool *seen, char *err,
                                       size_t errlen)
{
    bool scaled = kind == OVL__OP_KIND__OP_KIND_AG_GEMM ? ag->scaling != NULL : rs->scaling != NULL;
    if (!scaled) {
        for (int s = OVLD_BUF_A_SCALE; s < OVLD_BUF_COUNT; s++)
            if (seen[s])
                return bad(err, errlen,
                           "buffer slot %d (%s) is a scaled op's, and this op is "
                           "not scaled",
                           s, ovld_buf_name((uint32_t)kind, s));
        return OVL_OK;
    }
    size_t nb = kind == OVL__OP_KIND__OP_KIND_AG_GEMM ? ag->n_more_n + 1 : 1, biases = 0;
    for (size_t i = 0; i < nb; i++)
        biases += seen[ovld_buf_bias((uint32_t)i)];
    if (biases != 0 && biases != nb)
        return bad(err, errlen,
                   "a scaled op of %zu Bs gives a bias for every B or for none, not for %zu", nb,
                   biases);
    return OVL_OK;
}

/* An op: its kind and parameters, then its buffers each in a slot of the
 * kind's, once. */
static ovl_status_t check_op(const Ovl__Op *q, char *err, size_t errlen)
{
    ovl_status_t st = check_kind_params(q->kind, q->ag_gemm, q->gemm_rs, err, errlen);
    if (st != OVL_OK)
        return st;
    if (q->n_bufs > OVLD_BUF_COUNT)
        return bad(err, errlen, "%zu buffers: an op names at most %d", q->n_bufs, OVLD_BUF_COUNT);
    bool seen[OVLD_BUF_COUNT] = {false};
    for (size_t i = 0; i < q->n_bufs; i++) {
        const Ovl__OpBuf *b = q->bufs[i];
        if (b->slot >= OVLD_BUF_COUNT)
            return bad(err, errlen, "buffer slot %" PRIu64 " out of range (0 to %d)", b->slot,
                       OVLD_BUF_COUNT - 1);
        if (seen[b->slot])
            return bad(err, errlen, "buffer slot %" PRIu64 " (%s) given twice", b->slot,
                       ovld_buf_name((uint32_t)q->kind, (int)b->slot));
        if (!b->ref)
            return bad(err, errlen, "buffer slot %" PRIu64 " (%s) without a buffer", b->slot,
                       ovld_buf_name((uint32_t)q->kind, (int)b->slot));
        seen[b->slot] = true;
    }
    return check_scaled_slots(q->kind, q->ag_gemm, q->gemm_rs, seen, err, errlen);
}

/* A Plan request: the job's world and the rank, the op as an Op has it,
 * and the slots it gives, each in range and once (whether the kind makes
 * them optional, the core says: ovld_op_plan_params). */
static ovl_status_t check_plan(const Ovl__PlanRequest *q, char *err, size_t errlen)
{
    RANGE("world", q->world, 1, OVL_PLAN_MAX_WORLD);
    if (q->rank >= q->world)
        return bad(err, errlen, "rank %" PRIu64 " out of range for world %" PRIu64, q->rank,
                   q->world);
    ovl_status_t st = check_kind_params(q->kind, q->ag_gemm, q->gemm_rs, err, errlen);
    if (st != OVL_OK)
        return st;
    if (q->n_given > OVLD_BUF_COUNT)
        return bad(err, errlen, "%zu buffers given: an op names at most %d", q->n_given,
                   OVLD_BUF_COUNT);
    bool seen[OVLD_BUF_COUNT] = {false};
    for (size_t i = 0; i < q->n_given; i++) {
        uint64_t slot = q->given[i];
        if (slot >= OVLD_BUF_COUNT)
            return bad(err, errlen, "buffer slot %" PRIu64 " out of range (0 to %d)", slot,
                       OVLD_BUF_COUNT - 1);
        if (seen[slot])
            return bad(err, errlen, "buffer slot %" PRIu64 " (%s) given twice", slot,
                       ovld_buf_name((uint32_t)q->kind, (int)slot));
        seen[slot] = true;
    }
    return check_scaled_slots(q->kind, q->ag_gemm, q->gemm_rs, seen, err, errlen);
}

static ovl_status_t check_peer_ping(const Ovl__PeerPing *q, char *err, size_t errlen)
{
    /* the form here; what address it is, the handler says (peer_wire.h) */
    if (q->address.len == 0 || q->address.len >= OVLD_ADDR_TEXT_MAX)
        return bad(err, errlen, "peer address must be 1 to %d bytes, not %zu",
                   OVLD_ADDR_TEXT_MAX - 1, q->address.len);
    if (memchr(q->address.data, 0, q->address.len) ||
        !ovl_text_is_clean(q->address.data, q->address.len))
        return bad(err, errlen, "peer address must be text without control characters");
    return OVL_OK;
}

ovl_status_t ovld_request_check(const Ovl__Request *q, char *err, size_t errlen)
{
    if (errlen)
        err[0] = '\0';
    switch (q->body_case) {
    case OVL__REQUEST__BODY_HELLO:
        return check_hello(q->hello, err, errlen);
    case OVL__REQUEST__BODY_COMM_INIT:
        return check_comm_init(q->comm_init, err, errlen);
    case OVL__REQUEST__BODY_MEM_REGISTER:
        return check_mem_register(q->mem_register, err, errlen);
    case OVL__REQUEST__BODY_OP:
        return check_op(q->op, err, errlen);
    case OVL__REQUEST__BODY_PLAN:
        return check_plan(q->plan, err, errlen);
    case OVL__REQUEST__BODY_PEER_PING:
        return check_peer_ping(q->peer_ping, err, errlen);
    case OVL__REQUEST__BODY_STATUS:
    case OVL__REQUEST__BODY_JOB_ID_CREATE:
    case OVL__REQUEST__BODY_COMM_DESTROY:
    case OVL__REQUEST__BODY_COMM_CHECK:
    case OVL__REQUEST__BODY_MEM_DEREGISTER:
    case OVL__REQUEST__BODY_STATS:
    case OVL__REQUEST__BODY_TUNE:
        return OVL_OK; /* ids only: looked up by the handlers */
    default:
        snprintf(err, errlen, "unknown request (body %d)", (int)q->body_case);
        return OVL_ERR_PROTOCOL;
    }
}

static uint32_t narrow(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* A scaling's fields (checked, or narrowed with saturation). */
static ovld_scaling_desc_t scaling_desc(const Ovl__Scaling *sc)
{
    if (!sc)
        return (ovld_scaling_desc_t){.scaled = false};
    return (ovld_scaling_desc_t){.scaled = true,
                                 .b_dtype = narrow(sc->b_dtype),
                                 .out_dtype = narrow(sc->out_dtype),
                                 .a_mode = narrow(sc->a_mode),
                                 .b_mode = narrow(sc->b_mode),
                                 .fast_accum = sc->fast_accum};
}

static ovld_buf_ref_t buf_ref(const Ovl__BufRef *r, uint64_t ld)
{
    if (!r)
        return (ovld_buf_ref_t){.given = false};
    return (ovld_buf_ref_t){.given = true, .mem_id = r->mem_id, .offset = r->offset, .ld = ld};
}

/* The kind's own fields of a descriptor from the parameters the request
 * carries for it; nothing for a kind ovld does not run. */
static void kind_desc(uint32_t kind, const Ovl__AgGemmParams *g, const Ovl__GemmRsParams *rs,
                      ovld_op_desc_t *ret)
{
    if (rs && kind == OVLD_KIND_GEMM_RS) {
        ret->rs = (ovld_gemm_rs_desc_t){.m = rs->m,
                                        .n = rs->n,
                                        .k = rs->k,
                                        .dtype = narrow(rs->dtype),
                                        .algo = narrow(rs->algo),
                                        .chunks = narrow(rs->chunks),
                                        .streams = narrow(rs->streams),
                                        .reduce_op = narrow(rs->reduce_op),
                                        .transb = rs->transb,
                                        .sc = scaling_desc(rs->scaling)};
        return;
    }
    if (!g || kind != OVLD_KIND_AG_GEMM)
        return;
    ovld_ag_gemm_desc_t *a = &ret->ag;
    a->m = g->m;
    a->n = g->n;
    a->k = g->k;
    a->dtype = narrow(g->dtype);
    a->algo = narrow(g->algo);
    a->chunks = narrow(g->chunks);
    a->streams = narrow(g->streams);
    a->transb = g->transb;
    a->sc = scaling_desc(g->scaling);
    size_t more = g->n_more_n < OVLD_MAX_BS - 1 ? g->n_more_n : OVLD_MAX_BS - 1;
    a->nb = 1 + (uint32_t)more;
    for (size_t i = 0; i < more; i++)
        a->n_more[i] = g->more_n[i];
}

static uint32_t kind_id(uint64_t kind)
{
    switch (kind) {
    case OVL__OP_KIND__OP_KIND_AG_GEMM:
        return OVLD_KIND_AG_GEMM;
    case OVL__OP_KIND__OP_KIND_GEMM_RS:
        return OVLD_KIND_GEMM_RS;
    default:
        return OVLD_KIND_NONE;
    }
}

void ovld_request_op_desc(const Ovl__Op *q, ovld_op_desc_t *ret)
{
    *ret = (ovld_op_desc_t){
        .kind = kind_id(q->kind),
        .comm_id = q->comm_id,
        .seq = q->seq,
    };
    /* a refused op keeps what fits: only comm_id and seq of it mean
     * anything (a slot out of range or given twice: the first in range) */
    for (size_t i = 0; i < q->n_bufs; i++) {
        const Ovl__OpBuf *b = q->bufs[i];
        if (b->slot < OVLD_BUF_COUNT && b->ref && !ret->buf[b->slot].given)
            ret->buf[b->slot] = buf_ref(b->ref, b->ld);
    }
    kind_desc(ret->kind, q->ag_gemm, q->gemm_rs, ret);
}

void ovld_request_plan_desc(const Ovl__PlanRequest *q, ovld_op_desc_t *ret, uint32_t *world,
                            uint32_t *rank)
{
    *ret = (ovld_op_desc_t){.kind = kind_id(q->kind)};
    for (size_t i = 0; i < q->n_given; i++)
        ret->buf[q->given[i]].given = true; /* in range, checked */
    kind_desc(ret->kind, q->ag_gemm, q->gemm_rs, ret);
    *world = (uint32_t)q->world; /* 1..OVL_PLAN_MAX_WORLD, checked */
    *rank = (uint32_t)q->rank;
}

void ovld_request_join_desc(const Ovl__CommInit *q, ovld_join_desc_t *ret)
{
    *ret = (ovld_join_desc_t){.world = (uint32_t)q->world, .rank = (uint32_t)q->rank};
    if (q->job_blob.len > 0) {
        char why[160];
        ret->across = ovld_job_blob_decode(q->job_blob.data, q->job_blob.len, &ret->blob, why,
                                           sizeof(why)) == OVL_OK; /* checked */
        ovld_job_blob_name(&ret->blob, ret->job_id);
    } else {
        memcpy(ret->job_id, q->job_id.data, q->job_id.len); /* 1..63 bytes, checked */
        ret->job_id[q->job_id.len] = '\0';
    }
    memcpy(ret->device_uuid, q->device_uuid.data, OVLD_UUID_LEN);
}

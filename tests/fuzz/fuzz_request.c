/*
 * fuzz_request.c: libFuzzer target for ovld's request boundary: the frame
 * reader (proto/wire.c), the protobuf decoding (ovl__request__unpack) and
 * the boundary's checks (ovld_request_check, daemon/server/request.c), in the
 * order dispatch.c's ovld_dispatch_frame runs them.
 *
 * Input: one byte choosing how the rest is cut into pieces (as in
 * fuzz_wire.c: whole, byte by byte, fixed or pseudo-random sizes, through
 * feed or through the socket path's space/commit), then the byte stream.
 * Every complete frame is unpacked as a Request; one that does not unpack,
 * or that the check refuses with OVL_ERR_PROTOCOL, ends the stream, as it
 * ends ovld's connection.
 *
 * Properties (any failure aborts):
 * - OVL_OK means every field the handlers narrow or trust fits: CommInit's
 *   job id is 1..63 bytes, no NUL, clean UTF-8 (common/text.h), world is
 *   1..1024 and rank < world, the device UUID 16 bytes; MemRegister
 *   carries at most one fd, a nonzero size, an IPC handle of at most 64
 *   bytes and a UUID of 0 or 16 bytes; an Op is of kind ag_gemm or gemm_rs
 *   with its parameters (and not the other kind's; ag_gemm: no push (4);
 *   gemm_rs: a reduce_op of 0 or 1), names at most 35 buffers, each in a slot below
 * 35, once, each with a BufRef; a PlanRequest is of kind ag_gemm or gemm_rs with its parameters
 * (and not the other kind's), gives at most 35 slots, each below 35, once, with a world 1..1024 and
 * rank < world; their parameters have dtype <= 4 (3, 4: fp8, with a Scaling; no other with one),
 * algo <= 4 (each with a name), m, n, k > 0, chunks
 * <= 64, streams <= 8, at most 7 Bs after the first (more_n), each with n > 0; a PeerPing's address
 * is 1..63 bytes of clean text without NUL (the handler copies it into a 64-byte buffer);
 * - the verdict is the one the specification gives (a reference check
 *   written here from request.h and ovl.proto): OK, OVL_ERR_INVALID, or
 *   OVL_ERR_PROTOCOL for a request without a body and a MemRegister
 *   announcing more than one fd (which ovld must not answer as a mere
 *   refusal: the fd queue would be out of step);
 * - on a refusal err is a non-empty NUL-terminated string inside the
 *   buffer; with a shorter buffer the verdict is the same and the message
 *   its prefix; with no buffer (errlen 0) nothing is written;
 * - common/text.h's ovl_text_is_clean agrees with an independent UTF-8
 *   validator here on every job id;
 * - what on_hello makes of an accepted Hello's library version and client
 *   name (ovl_text_sanitize into its 32- and 64-byte buffers) is clean text
 *   inside the buffer, no longer than the input, and the input itself when
 *   that is clean and fits.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "config.h" /* OVLD_ADDR_TEXT_MAX */
#include "jobid.h"
#include "ovl.h"
#include "ovl.pb-c.h"
#include "plan.h"
#include "kind.h"
#include "request.h"
#include "text.h"
#include "wire.h"

#define FUZZ_NAME "fuzz_request"
#include "fuzz_main.h"
#include "fuzz_split.h"

#define FUZZ_MAX_BODY (64u * 1024u)
#define ERR_LEN       256u /* as dispatch.c */
#define UUID_LEN      16u
#define IPC_MAX       64u

/* ----------------------------------------------------- reference checks */

/* Clean text per RFC 3629 and text.h, written independently of text.c:
 * shortest forms only, no surrogates, nothing past U+10FFFF, no C0, DEL or
 * C1 control character, and no bidirectional control. */
static bool ref_clean(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        uint32_t cp;
        size_t len;
        if (b <= 0x7f) {
            cp = b;
            len = 1;
        } else if (b >= 0xc2 && b <= 0xdf) {
            len = 2;
        } else if (b >= 0xe0 && b <= 0xef) {
            len = 3;
        } else if (b >= 0xf0 && b <= 0xf4) {
            len = 4;
        } else {
            return false; /* continuation byte, C0/C1 lead (overlong), F5..FF */
        }
        if (len > 1) {
            if (n - i < len)
                return false;
            cp = b & (0xffu >> (len + 1));
            for (size_t j = 1; j < len; j++) {
                if ((s[i + j] & 0xc0) != 0x80)
                    return false;
                cp = cp << 6 | (s[i + j] & 0x3fu);
            }
            if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
                return false;
            if (cp >= 0xd800 && cp <= 0xdfff)
                return false;
        }
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
            return false;
        /* bidirectional controls (Trojan Source): ALM, LRM, RLM, the
         * embeddings and overrides, the isolates */
        if (cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
            (cp >= 0x2066 && cp <= 0x2069))
            return false;
        i += len;
    }
    return true;
}

static ovl_status_t ref_shape(uint64_t dtype, uint64_t algo, uint64_t m, uint64_t n, uint64_t k,
                              uint64_t chunks, uint64_t streams)
{
    if (dtype > 4 || algo > 4 || m == 0 || n == 0 || k == 0 || chunks > 64 || streams > 8)
        return OVL_ERR_INVALID;
    return OVL_OK;
}

/* A scaling (ovl.proto's Scaling): present exactly for the fp8 dtypes (3,
 * 4); B fp8, not e5m2 (4) twice; out_dtype 0 to 2; A's mode 0 to 2 (3, by
 * 128x128, is B's only), B's 0 to 3, a block mode (2, 3) on both sides or
 * on neither; transb. */
static ovl_status_t ref_scaling(uint64_t dtype, const Ovl__Scaling *sc, bool transb)
{
    bool fp8 = dtype == 3 || dtype == 4;
    if (!sc)
        return fp8 ? OVL_ERR_INVALID : OVL_OK;
    bool a_block = sc->a_mode == 2 || sc->a_mode == 3, b_block = sc->b_mode == 2 || sc->b_mode == 3;
    if (!fp8 || (sc->b_dtype != 3 && sc->b_dtype != 4) || (dtype == 4 && sc->b_dtype == 4) ||
        sc->out_dtype > 2 || sc->a_mode > 2 || sc->b_mode > 3 || a_block != b_block || !transb)
        return OVL_ERR_INVALID;
    return OVL_OK;
}

/* An op's kind and parameters: kind 1 (ag_gemm) with ag_gemm alone, its
 * shape, an algorithm other than push (4), at most 7 more Bs each with
 * n > 0; kind 2 (gemm_rs) with gemm_rs alone, its shape, an algorithm other
 * than ring (3), reduce_op 0 or 1;
 * each with its scaling (ref_scaling). */
static ovl_status_t ref_kind(uint64_t kind, const Ovl__AgGemmParams *g, const Ovl__GemmRsParams *rs)
{
    if (kind == 1) {
        if (!g || rs ||
            ref_shape(g->dtype, g->algo, g->m, g->n, g->k, g->chunks, g->streams) != OVL_OK ||
            g->algo == 4 || g->n_more_n > 7)
            return OVL_ERR_INVALID;
        for (size_t i = 0; i < g->n_more_n; i++)
            if (g->more_n[i] == 0)
                return OVL_ERR_INVALID;
        return ref_scaling(g->dtype, g->scaling, g->transb);
    }
    if (kind == 2) {
        if (!rs || g ||
            ref_shape(rs->dtype, rs->algo, rs->m, rs->n, rs->k, rs->chunks, rs->streams) !=
                OVL_OK ||
            rs->reduce_op > 1)
            return OVL_ERR_INVALID;
        return ref_scaling(rs->dtype, rs->scaling, rs->transb);
    }
    return OVL_ERR_INVALID;
}

/* The slots 18 to 34 (a scaled op's scales and biases) given (seen) to an
 * op of kind with these parameters: none for an op not scaled; for a
 * scaled one, a bias (slot 20, then 27 + i for B i) on every B or on none. */
static ovl_status_t ref_scaled_slots(uint64_t kind, const Ovl__AgGemmParams *g,
                                     const Ovl__GemmRsParams *rs, const bool *seen)
{
    bool scaled = kind == 1 ? g->scaling != NULL : rs->scaling != NULL;
    if (!scaled) {
        for (int s = 18; s < 35; s++)
            if (seen[s])
                return OVL_ERR_INVALID;
        return OVL_OK;
    }
    size_t nb = kind == 1 ? g->n_more_n + 1 : 1, biases = seen[20];
    for (size_t i = 1; i < nb; i++)
        biases += seen[27 + i];
    return biases == 0 || biases == nb ? OVL_OK : OVL_ERR_INVALID;
}

/* The verdict request.h and ovl.proto give for q. */
static ovl_status_t ref_verdict(const Ovl__Request *q)
{
    switch (q->body_case) {
    case OVL__REQUEST__BODY_HELLO:
    case OVL__REQUEST__BODY_STATUS:
    case OVL__REQUEST__BODY_COMM_DESTROY:
    case OVL__REQUEST__BODY_COMM_CHECK:
    case OVL__REQUEST__BODY_MEM_DEREGISTER:
    case OVL__REQUEST__BODY_STATS:
    case OVL__REQUEST__BODY_JOB_ID_CREATE:
    case OVL__REQUEST__BODY_TUNE:
        return OVL_OK;
    case OVL__REQUEST__BODY_COMM_INIT: {
        const Ovl__CommInit *c = q->comm_init;
        const ProtobufCBinaryData *id = &c->job_id;
        if (c->job_blob.len > 0) {
            /* a job across nodes: its id alone, well formed (test_jobid
             * checks the blob's own rules) */
            ovld_job_blob_t b;
            char why[160];
            if (id->len > 0 || ovld_job_blob_decode(c->job_blob.data, c->job_blob.len, &b, why,
                                                    sizeof(why)) != OVL_OK)
                return OVL_ERR_INVALID;
        } else if (id->len < 1 || id->len > 63 || memchr(id->data, 0, id->len) ||
                   !ref_clean(id->data, id->len)) {
            return OVL_ERR_INVALID;
        }
        if (c->world < 1 || c->world > 1024 || c->rank >= c->world)
            return OVL_ERR_INVALID;
        if (c->device_uuid.len != UUID_LEN)
            return OVL_ERR_INVALID;
        return OVL_OK;
    }
    case OVL__REQUEST__BODY_MEM_REGISTER: {
        const Ovl__MemRegister *r = q->mem_register;
        if (r->fd_count > 1)
            return OVL_ERR_PROTOCOL;
        if (r->bytes == 0 || r->ipc_handle.len > IPC_MAX ||
            (r->device_uuid.len != 0 && r->device_uuid.len != UUID_LEN))
            return OVL_ERR_INVALID;
        return OVL_OK;
    }
    case OVL__REQUEST__BODY_OP: {
        const Ovl__Op *o = q->op;
        if (ref_kind(o->kind, o->ag_gemm, o->gemm_rs) != OVL_OK || o->n_bufs > 35)
            return OVL_ERR_INVALID;
        bool seen[35] = {false};
        for (size_t i = 0; i < o->n_bufs; i++) {
            if (o->bufs[i]->slot >= 35 || seen[o->bufs[i]->slot] || !o->bufs[i]->ref)
                return OVL_ERR_INVALID;
            seen[o->bufs[i]->slot] = true;
        }
        return ref_scaled_slots(o->kind, o->ag_gemm, o->gemm_rs, seen);
    }
    case OVL__REQUEST__BODY_PLAN: {
        const Ovl__PlanRequest *p = q->plan;
        if (p->world < 1 || p->world > 1024 || p->rank >= p->world)
            return OVL_ERR_INVALID;
        if (ref_kind(p->kind, p->ag_gemm, p->gemm_rs) != OVL_OK || p->n_given > 35)
            return OVL_ERR_INVALID;
        bool seen[35] = {false};
        for (size_t i = 0; i < p->n_given; i++) {
            if (p->given[i] >= 35 || seen[p->given[i]])
                return OVL_ERR_INVALID;
            seen[p->given[i]] = true;
        }
        return ref_scaled_slots(p->kind, p->ag_gemm, p->gemm_rs, seen);
    }
    case OVL__REQUEST__BODY_PEER_PING: {
        const ProtobufCBinaryData *a = &q->peer_ping->address;
        if (a->len < 1 || a->len > 63 || memchr(a->data, 0, a->len) || !ref_clean(a->data, a->len))
            return OVL_ERR_INVALID;
        return OVL_OK;
    }
    default:
        return OVL_ERR_PROTOCOL;
    }
}

/* ----------------------------------------------------------- properties */

/* What the handlers rely on once the check said OVL_OK. */
static void check_accepted(const Ovl__Request *q)
{
    switch (q->body_case) {
    case OVL__REQUEST__BODY_COMM_INIT: {
        const Ovl__CommInit *c = q->comm_init;
        if (c->job_blob.len > 0) {
            CHECK(c->job_id.len == 0 && c->job_blob.len == OVLD_JOB_BLOB_LEN);
        } else {
            CHECK(c->job_id.len >= 1 && c->job_id.len <= OVLD_JOB_ID_MAX);
            CHECK(memchr(c->job_id.data, 0, c->job_id.len) == NULL);
            CHECK(ovl_text_is_clean(c->job_id.data, c->job_id.len));
        }
        CHECK(c->world >= 1 && c->world <= OVL_PLAN_MAX_WORLD);
        CHECK(c->rank < c->world);
        CHECK((uint64_t)(uint32_t)c->world == c->world && (uint64_t)(uint32_t)c->rank == c->rank);
        CHECK(c->device_uuid.len == UUID_LEN);
        break;
    }
    case OVL__REQUEST__BODY_MEM_REGISTER: {
        const Ovl__MemRegister *r = q->mem_register;
        CHECK(r->fd_count <= 1);
        CHECK(r->bytes > 0);
        CHECK(r->ipc_handle.len <= IPC_MAX);
        CHECK(r->device_uuid.len == 0 || r->device_uuid.len == UUID_LEN);
        break;
    }
    case OVL__REQUEST__BODY_OP:
    case OVL__REQUEST__BODY_PLAN: {
        uint64_t kind;
        const Ovl__AgGemmParams *g;
        const Ovl__GemmRsParams *rs;
        if (q->body_case == OVL__REQUEST__BODY_OP) {
            const Ovl__Op *o = q->op;
            kind = o->kind, g = o->ag_gemm, rs = o->gemm_rs;
            CHECK(o->n_bufs <= OVLD_BUF_COUNT);
            for (size_t i = 0; i < o->n_bufs; i++)
                CHECK(o->bufs[i]->slot < OVLD_BUF_COUNT && o->bufs[i]->ref != NULL);
        } else {
            /* ovld_request_plan_desc indexes buf[] by each slot given */
            const Ovl__PlanRequest *p = q->plan;
            kind = p->kind, g = p->ag_gemm, rs = p->gemm_rs;
            CHECK(p->world >= 1 && p->world <= OVL_PLAN_MAX_WORLD);
            CHECK(p->rank < p->world);
            CHECK(p->n_given <= OVLD_BUF_COUNT);
            for (size_t i = 0; i < p->n_given; i++)
                CHECK(p->given[i] < OVLD_BUF_COUNT);
        }
        /* a kind of the table, its parameters alone */
        CHECK(kind < UINT32_MAX && ovld_kind((uint32_t)kind) != NULL);
        CHECK(kind == OVLD_KIND_AG_GEMM ? g != NULL && rs == NULL : rs != NULL && g == NULL);
        uint64_t dtype, algo, m, n, k, chunks, streams;
        if (g) {
            dtype = g->dtype, algo = g->algo, m = g->m, n = g->n, k = g->k;
            chunks = g->chunks, streams = g->streams;
            CHECK(g->n_more_n <= OVLD_MAX_BS - 1 && algo != OVL_ALGO_PUSH);
            for (size_t i = 0; i < g->n_more_n; i++)
                CHECK(g->more_n[i] > 0);
        } else {
            dtype = rs->dtype, algo = rs->algo, m = rs->m, n = rs->n, k = rs->k;
            chunks = rs->chunks, streams = rs->streams;
            CHECK(rs->reduce_op < OVL_REDUCE_OP_COUNT);
        }
        CHECK(dtype < OVL_DTYPE_COUNT);
        CHECK(algo < OVL_ALGO_COUNT);
        CHECK(ovl_dtype_name((ovl_dtype_t)dtype) != NULL && ovl_dtype_size((ovl_dtype_t)dtype) > 0);
        CHECK(ovl_algo_name((ovl_algo_t)algo) != NULL);
        CHECK(m > 0 && n > 0 && k > 0);
        CHECK(chunks <= OVL_PLAN_MAX_CHUNKS);
        CHECK(streams <= OVL_PLAN_MAX_STREAMS);
        break;
    }
    case OVL__REQUEST__BODY_PEER_PING: {
        /* on_peer_ping copies it into a buffer of OVLD_ADDR_TEXT_MAX bytes */
        const ProtobufCBinaryData *a = &q->peer_ping->address;
        CHECK(a->len >= 1 && a->len < OVLD_ADDR_TEXT_MAX);
        CHECK(memchr(a->data, 0, a->len) == NULL);
        CHECK(ovl_text_is_clean(a->data, a->len));
        break;
    }
    case OVL__REQUEST__BODY_HELLO:
    case OVL__REQUEST__BODY_STATUS:
    case OVL__REQUEST__BODY_COMM_DESTROY:
    case OVL__REQUEST__BODY_COMM_CHECK:
    case OVL__REQUEST__BODY_MEM_DEREGISTER:
    case OVL__REQUEST__BODY_STATS:
    case OVL__REQUEST__BODY_JOB_ID_CREATE:
    case OVL__REQUEST__BODY_TUNE:
        break;
    default:
        CHECK(!"an unknown body passed the check");
    }
}

/* What on_hello does with the two strings of an accepted Hello, which end
 * up in the log and in `ovlctl status`: ovl_text_sanitize into its buffers
 * (32 bytes for the library version, 64 for the client name). The result
 * is clean text inside the buffer, no longer than the input (each bad
 * byte is one '?'), and the input itself when that is clean and fits. */
static void check_sanitize(const uint8_t *s, size_t n, size_t cap)
{
    char dst[64 + 8];
    CHECK(cap + 8 <= sizeof(dst));
    memset(dst, 0x55, sizeof(dst));
    size_t w = ovl_text_sanitize(dst, cap, s, n);
    CHECK(w < cap && dst[w] == '\0' && strlen(dst) == w);
    CHECK(dst[cap] == 0x55);
    CHECK(ref_clean((const uint8_t *)dst, w));
    CHECK(w <= n);
    if (ref_clean(s, n) && n < cap)
        CHECK(w == n && memcmp(dst, s, n) == 0);
}

static void check_hello_text(const Ovl__Hello *h)
{
    if (h->library_version && h->library_version[0])
        check_sanitize((const uint8_t *)h->library_version, strlen(h->library_version), 32);
    if (h->client_name.len)
        check_sanitize(h->client_name.data, h->client_name.len, 64);
}

/* ovld_request_check as dispatch.c calls it, then again with short buffers:
 * returns the verdict. */
static ovl_status_t check_request(const Ovl__Request *q)
{
    char err[ERR_LEN];
    memset(err, 0xaa, sizeof(err));
    ovl_status_t st = ovld_request_check(q, err, sizeof(err));
    CHECK(st == OVL_OK || st == OVL_ERR_INVALID || st == OVL_ERR_PROTOCOL);
    CHECK(st == ref_verdict(q));
    if (st == OVL_OK) {
        check_accepted(q);
    } else {
        CHECK(memchr(err, '\0', sizeof(err)) != NULL);
        CHECK(err[0] != '\0');
    }
    if (st == OVL_OK && q->body_case == OVL__REQUEST__BODY_HELLO)
        check_hello_text(q->hello);
    if (q->body_case == OVL__REQUEST__BODY_OP) {
        /* the descriptor, of any op (a refused one fails as an op): its
         * kind the table's or none, its Bs within the arrays, each B's n
         * the request's, each buffer the first in its slot */
        const Ovl__Op *o = q->op;
        ovld_op_desc_t d;
        ovld_request_op_desc(o, &d);
        CHECK(d.kind == OVLD_KIND_NONE || ovld_kind(d.kind) != NULL);
        CHECK(d.kind != OVLD_KIND_NONE || o->kind != OVLD_KIND_AG_GEMM);
        const Ovl__AgGemmParams *g = o->ag_gemm;
        if (g && d.kind == OVLD_KIND_AG_GEMM) {
            CHECK(d.ag.nb >= 1 && d.ag.nb <= OVLD_MAX_BS);
            if (st == OVL_OK)
                CHECK(d.ag.nb == 1 + g->n_more_n);
            for (uint32_t i = 1; i < d.ag.nb; i++)
                CHECK(d.ag.n_more[i - 1] == g->more_n[i - 1]);
        }
        bool first[OVLD_BUF_COUNT] = {false};
        for (size_t i = 0; i < o->n_bufs; i++) {
            const Ovl__OpBuf *b = o->bufs[i];
            if (b->slot >= OVLD_BUF_COUNT || !b->ref || first[b->slot])
                continue;
            first[b->slot] = true;
            CHECK(d.buf[b->slot].given && d.buf[b->slot].mem_id == b->ref->mem_id &&
                  d.buf[b->slot].offset == b->ref->offset && d.buf[b->slot].ld == b->ld);
        }
        for (int b = 0; b < OVLD_BUF_COUNT; b++)
            CHECK(first[b] == d.buf[b].given);
    }
    if (q->body_case == OVL__REQUEST__BODY_COMM_INIT) {
        const ProtobufCBinaryData *id = &q->comm_init->job_id;
        CHECK(ovl_text_is_clean(id->data, id->len) == ref_clean(id->data, id->len));
    }

    /* The same verdict whatever the buffer; the message cut to fit. */
    char small[17];
    for (size_t len = 1; len <= sizeof(small) - 1; len += 5) {
        memset(small, 0x55, sizeof(small));
        CHECK(ovld_request_check(q, small, len) == st);
        CHECK(small[len] == 0x55); /* nothing past the buffer */
        CHECK(memchr(small, '\0', len) != NULL);
        if (st != OVL_OK)
            CHECK(strncmp(small, err, len - 1) == 0 && strlen(small) == strnlen(err, len - 1));
    }
    char none = 0x55;
    CHECK(ovld_request_check(q, &none, 0) == st);
    CHECK(none == 0x55);
    return st;
}

/* --------------------------------------------------------------- stream */

/* One frame as ovld_dispatch_frame takes it; false when ovld would close. */
static bool handle_frame(const uint8_t *body, uint32_t len)
{
    Ovl__Request *q = ovl__request__unpack(NULL, len, body);
    if (!q)
        return false; /* "malformed request" */
    ovl_status_t st = check_request(q);
    ovl__request__free_unpacked(q, NULL);
    return st != OVL_ERR_PROTOCOL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    splitter_t sp = {.mode = data[0], .rng = 0x9e3779b9u ^ data[0]};
    bool socket_like = (data[0] & 0x80) != 0;
    const uint8_t *s = data + 1;
    size_t n = size - 1, off = 0;

    ovl_wire_reader_t r;
    ovl_wire_reader_init(&r, FUZZ_MAX_BODY);
    bool open = true;
    while (open && off < n) {
        size_t taken = 0;
        if (put(&r, socket_like, s + off, next_piece(&sp, n - off), &taken) != OVL_OK)
            break; /* a bad header: ovld closes */
        off += taken;
        for (;;) {
            const uint8_t *body;
            uint32_t len;
            ovl_status_t st = ovl_wire_reader_next(&r, &body, &len);
            if (st != OVL_OK) {
                open = st == OVL_ERR_AGAIN;
                break;
            }
            CHECK(len <= FUZZ_MAX_BODY);
            if (!handle_frame(body, len)) {
                open = false;
                break;
            }
        }
    }
    ovl_wire_reader_free(&r);
    return 0;
}

/* ------------------------------------------------------------- standalone */

#ifdef OVL_FUZZ_STANDALONE

/* a UUID, and room for the longer ones tried */
static uint8_t uuid[UUID_LEN + 8] = "ovl-host\0\0\0\0\0\0\0\1";

/* Frames q behind a mode byte and runs it under a few split modes. */
static void run_request(const Ovl__Request *q)
{
    static const uint8_t modes[] = {0x00, 0x01, 0x83, 0x7e};
    size_t body = ovl__request__get_packed_size(q);
    uint8_t *in = malloc(1 + OVL_WIRE_HEADER_SIZE + body);
    CHECK(in != NULL);
    ovl_wire_header_encode(in + 1, (uint32_t)body);
    CHECK(ovl__request__pack(q, in + 1 + OVL_WIRE_HEADER_SIZE) == body);
    for (size_t i = 0; i < sizeof(modes); i++) {
        in[0] = modes[i];
        fuzz_run(in, 1 + OVL_WIRE_HEADER_SIZE + body);
    }
    /* and every byte of the body changed once, whole */
    in[0] = 0;
    for (size_t i = 0; i < body; i++) {
        uint8_t keep = in[1 + OVL_WIRE_HEADER_SIZE + i];
        in[1 + OVL_WIRE_HEADER_SIZE + i] = (uint8_t)fuzz_prng();
        fuzz_run(in, 1 + OVL_WIRE_HEADER_SIZE + body);
        in[1 + OVL_WIRE_HEADER_SIZE + i] = keep;
    }
    free(in);
}

/* clang-format off */
static const uint64_t edge[] = {0, 1, 2, 3, 4, 8, 9, 63, 64, 65, 1023, 1024, 1025, UINT32_MAX,
                                (uint64_t)UINT32_MAX + 1, (uint64_t)UINT32_MAX + 3, UINT64_MAX};
/* clang-format on */
#define NEDGE (sizeof(edge) / sizeof(edge[0]))

static void comm_inits(void)
{
    static const char *const ids[] = {
        "train",
        "",
        "a",
        "job-\xc3\xa9t\xc3\xa9", /* é */
        "\xf0\x9f\x9a\x80",      /* U+1F680 */
        "\xf4\x8f\xbf\xbf",      /* U+10FFFF */
        "\xf4\x90\x80\x80",      /* past U+10FFFF */
        "x\x1b[31mred",          /* ESC */
        "x\xc2\x9b\x33\x31m",    /* C1 CSI, then "31m" */
        "del\x7f",               /* DEL */
        "\xc0\xaf",              /* overlong / */
        "\xe0\x80\xaf",          /* overlong / */
        "\xed\xa0\x80",          /* surrogate */
        "\xc3",                  /* cut short */
        "\x80",                  /* stray continuation */
        "\xfe\xff",              /* not UTF-8 at all */
        "tab\there",             /* C0 */
    };
    Ovl__CommInit c = OVL__COMM_INIT__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = 7;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = &c;
    c.device_uuid.data = uuid;
    c.device_uuid.len = UUID_LEN;
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        c.job_id.data = (uint8_t *)ids[i];
        c.job_id.len = strlen(ids[i]);
        c.world = 4;
        c.rank = 1;
        run_request(&q);
    }
    /* NUL inside, and lengths around the limit */
    uint8_t id[80];
    memset(id, 'j', sizeof(id));
    c.job_id.data = id;
    for (size_t len = 61; len <= 66; len++) {
        c.job_id.len = len;
        run_request(&q);
    }
    id[3] = 0;
    c.job_id.len = 10;
    run_request(&q);
    id[3] = 'j';
    /* world and rank at their edges */
    c.job_id.len = 5;
    for (size_t w = 0; w < NEDGE; w++)
        for (size_t r = 0; r < NEDGE; r += 3) {
            c.world = edge[w];
            c.rank = edge[r];
            run_request(&q);
            c.rank = edge[w] - 1;
            run_request(&q);
        }
    c.world = 2;
    c.rank = 0;
    for (size_t len = 0; len <= 17; len++) {
        c.device_uuid.len = len;
        run_request(&q);
    }
    c.device_uuid.len = UUID_LEN;
    /* a job across nodes: a well-formed id, with a name besides, cut
     * short, one bit flipped in each byte */
    ovld_job_blob_t jb = {0};
    struct sockaddr_in *sin = (struct sockaddr_in *)&jb.coordinator;
    sin->sin_family = AF_INET;
    sin->sin_port = htons(7411);
    sin->sin_addr.s_addr = htonl(0x7f000001);
    memset(jb.nonce, 0xa5, sizeof(jb.nonce));
    uint8_t blob[OVLD_JOB_BLOB_LEN];
    CHECK(ovld_job_blob_encode(&jb, blob) == OVL_OK);
    c.job_blob.data = blob;
    c.job_id.len = 0;
    for (size_t len = OVLD_JOB_BLOB_LEN - 1; len <= OVLD_JOB_BLOB_LEN; len++) {
        c.job_blob.len = len;
        run_request(&q);
    }
    c.job_id.len = 5;
    run_request(&q);
    c.job_id.len = 0;
    for (size_t i = 0; i < OVLD_JOB_BLOB_LEN; i++) {
        blob[i] ^= 0x10;
        run_request(&q);
        blob[i] ^= 0x10;
    }
    c.job_blob.len = 0;
    Ovl__Request jq = OVL__REQUEST__INIT;
    Ovl__JobIdCreate jc = OVL__JOB_ID_CREATE__INIT;
    jq.body_case = OVL__REQUEST__BODY_JOB_ID_CREATE;
    jq.job_id_create = &jc;
    run_request(&jq);
}

static void mem_registers(void)
{
    uint8_t ipc[66] = {0};
    Ovl__MemRegister m = OVL__MEM_REGISTER__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = 9;
    q.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    q.mem_register = &m;
    m.client_addr = 0x7f0000001000;
    for (size_t f = 0; f < NEDGE; f += 2)
        for (size_t b = 0; b < NEDGE; b += 4) {
            m.fd_count = edge[f];
            m.bytes = edge[b];
            m.fd_offset = edge[(f + b) % NEDGE];
            run_request(&q);
        }
    m.fd_count = 1;
    m.bytes = 4096;
    for (size_t len = 62; len <= 66; len++) {
        m.ipc_handle.data = ipc;
        m.ipc_handle.len = len;
        run_request(&q);
    }
    m.ipc_handle.len = 0;
    m.device_uuid.data = uuid;
    for (size_t len = 0; len <= 17; len++) {
        m.device_uuid.len = len;
        run_request(&q);
    }
}

static void ops(void)
{
    Ovl__BufRef a = OVL__BUF_REF__INIT, b = OVL__BUF_REF__INIT, c = OVL__BUF_REF__INIT;
    a.mem_id = 1, b.mem_id = 2, c.mem_id = 3;
    Ovl__OpBuf ob[4], *pob[4];
    Ovl__BufRef *refs[4] = {&a, &b, &c, &a};
    for (int i = 0; i < 4; i++) {
        ovl__op_buf__init(&ob[i]);
        ob[i].slot = (uint64_t)i;
        ob[i].ref = refs[i];
        ob[i].ld = 64;
        pob[i] = &ob[i];
    }
    Ovl__AgGemmParams g = OVL__AG_GEMM_PARAMS__INIT;
    g.m = 16, g.n = 64, g.k = 64;
    Ovl__Op op = OVL__OP__INIT;
    op.comm_id = 1, op.seq = 1, op.kind = 1, op.n_bufs = 3, op.bufs = pob, op.ag_gemm = &g;
    Ovl__AgGemmParams pg = OVL__AG_GEMM_PARAMS__INIT;
    pg.m = 1024, pg.n = 256, pg.k = 512;
    Ovl__PlanRequest p = OVL__PLAN_REQUEST__INIT;
    p.world = 4, p.rank = 3, p.kind = 1, p.ag_gemm = &pg;
    Ovl__Request q = OVL__REQUEST__INIT;
    uint64_t *gf[] = {&g.dtype, &g.algo, &g.m, &g.n, &g.k, &g.chunks, &g.streams};
    uint64_t *pf[] = {&pg.dtype,  &pg.algo,    &pg.m,    &pg.n,   &pg.k,
                      &pg.chunks, &pg.streams, &p.world, &p.rank, &p.kind};
    q.body_case = OVL__REQUEST__BODY_OP;
    q.op = &op;
    for (size_t f = 0; f < sizeof(gf) / sizeof(gf[0]); f++) {
        uint64_t keep = *gf[f];
        for (size_t e = 0; e < NEDGE; e++) {
            *gf[f] = edge[e];
            run_request(&q);
        }
        *gf[f] = keep;
    }
    op.n_bufs = 4; /* a_out */
    run_request(&q);
    /* the op's own form: kinds, slots given twice or out of range, a slot
     * without a buffer, no parameters */
    uint64_t kinds[] = {0, 2, UINT64_MAX};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        op.kind = kinds[i];
        run_request(&q);
    }
    op.kind = 1;
    ob[3].slot = 0;
    run_request(&q);
    ob[3].slot = 18;
    run_request(&q);
    ob[3].slot = UINT64_MAX;
    run_request(&q);
    ob[3].slot = 3;
    ob[3].ref = NULL;
    run_request(&q);
    ob[3].ref = &a;
    op.ag_gemm = NULL;
    run_request(&q);
    op.ag_gemm = &g;
    q.id = 3;
    q.body_case = OVL__REQUEST__BODY_PLAN;
    q.plan = &p;
    for (size_t f = 0; f < sizeof(pf) / sizeof(pf[0]); f++) {
        uint64_t keep = *pf[f];
        for (size_t e = 0; e < NEDGE; e++) {
            *pf[f] = edge[e];
            run_request(&q);
        }
        *pf[f] = keep;
    }
    /* a plan's Bs after the first: 0 to 9 of them, the last one's n each
     * edge value, with and without transb */
    uint64_t more[9];
    pg.more_n = more;
    for (size_t count = 0; count <= 9; count++)
        for (size_t e = 0; e < NEDGE; e++) {
            for (size_t i = 0; i < count; i++)
                more[i] = i + 1 == count ? edge[e] : 64;
            pg.n_more_n = count;
            pg.transb = e % 2;
            run_request(&q);
        }
    pg.n_more_n = 0;
    /* the slots a plan gives: none, a_out, each edge slot, one twice, more
     * than there are slots; and no parameters */
    uint64_t given[OVLD_BUF_COUNT + 1];
    p.given = given;
    for (size_t e = 0; e < NEDGE; e++) {
        given[0] = 3, given[1] = edge[e];
        p.n_given = 2;
        run_request(&q);
        p.n_given = 1;
        given[0] = edge[e];
        run_request(&q);
    }
    for (size_t i = 0; i <= OVLD_BUF_COUNT; i++)
        given[i] = i % OVLD_BUF_COUNT;
    p.n_given = OVLD_BUF_COUNT + 1;
    run_request(&q);
    p.n_given = 0;
    p.ag_gemm = NULL;
    run_request(&q);
    /* GEMM + reduce-scatter: every field at its edges, as an op and as a
     * plan; both kinds' parameters at once; the other kind's alone */
    Ovl__GemmRsParams rs = OVL__GEMM_RS_PARAMS__INIT;
    rs.m = 1024, rs.n = 256, rs.k = 512, rs.algo = 2;
    uint64_t *rf[] = {&rs.dtype, &rs.algo,   &rs.m,       &rs.n,
                      &rs.k,     &rs.chunks, &rs.streams, &rs.reduce_op};
    op.kind = 2, op.ag_gemm = NULL, op.gemm_rs = &rs;
    p.kind = 2, p.gemm_rs = &rs;
    for (int body = 0; body < 2; body++) {
        q.body_case = body ? OVL__REQUEST__BODY_PLAN : OVL__REQUEST__BODY_OP;
        for (size_t f = 0; f < sizeof(rf) / sizeof(rf[0]); f++) {
            uint64_t keep = *rf[f];
            for (size_t e = 0; e < NEDGE; e++) {
                *rf[f] = edge[e];
                run_request(&q);
            }
            *rf[f] = keep;
        }
    }
    q.body_case = OVL__REQUEST__BODY_OP;
    op.ag_gemm = &g;
    run_request(&q); /* both */
    op.gemm_rs = NULL;
    run_request(&q); /* kind 2 with ag_gemm's */
    op.kind = 1, op.gemm_rs = &rs;
    run_request(&q); /* kind 1 with both */
}

static void others(void)
{
    Ovl__Request q = OVL__REQUEST__INIT;
    run_request(&q); /* no body: a protocol error */
    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = OVL_PROTOCOL_VERSION;
    h.library_version = (char *)OVL_VERSION_STRING;
    h.client_name.data = (uint8_t *)"fuzz_request";
    h.client_name.len = 12;
    q.id = 1;
    q.body_case = OVL__REQUEST__BODY_HELLO;
    q.hello = &h;
    run_request(&q);
    /* names that need cleaning, cut inside a sequence, at the buffer's size */
    static const char *const names[] = {
        "x\x1b[2Jy",
        "\xc2\x9b",
        "\xff\xfe",
        "\xe2\x82",
        "tab\tname",
        "\xf0\x9f\x9a\x80",
        "0123456789012345678901234567890123456789012345678901234567890\xc3\xa9",
        "01234567890123456789012345678901234567890123456789012345678901\xc3\xa9",
        "0123456789012345678901234567890123456789012345678901234567890123456789"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        h.client_name.data = (uint8_t *)names[i];
        h.client_name.len = strlen(names[i]);
        h.library_version = (char *)names[i];
        run_request(&q);
    }
    h.library_version = (char *)OVL_VERSION_STRING;
    h.protocol_version = (uint64_t)UINT32_MAX + 1 + OVL_PROTOCOL_VERSION;
    h.wants = UINT64_MAX;
    run_request(&q);
    Ovl__StatusRequest st = OVL__STATUS_REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_STATUS;
    q.status = &st;
    run_request(&q);
    Ovl__CommDestroy cd = OVL__COMM_DESTROY__INIT;
    cd.comm_id = UINT64_MAX;
    q.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
    q.comm_destroy = &cd;
    run_request(&q);
    Ovl__CommCheck cc = OVL__COMM_CHECK__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_CHECK;
    q.comm_check = &cc;
    run_request(&q);
    Ovl__MemDeregister md = OVL__MEM_DEREGISTER__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_DEREGISTER;
    q.mem_deregister = &md;
    run_request(&q);
    Ovl__StatsRequest sr = OVL__STATS_REQUEST__INIT;
    sr.reset = true;
    q.body_case = OVL__REQUEST__BODY_STATS;
    q.stats = &sr;
    run_request(&q);
    /* peer addresses: the form here, the address itself in the handler */
    static const char *const addrs[] = {
        "",
        "10.0.0.5:7411",
        "[fd00::5]:7411",
        "0.0.0.0:1",
        "x\x1b[2J:1",
        "\xff:1",
        "012345678901234567890123456789012345678901234567890123456789012",
        "0123456789012345678901234567890123456789012345678901234567890123"};
    Ovl__PeerPing pp = OVL__PEER_PING__INIT;
    q.body_case = OVL__REQUEST__BODY_PEER_PING;
    q.peer_ping = &pp;
    for (size_t i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
        pp.address.data = (uint8_t *)addrs[i];
        pp.address.len = strlen(addrs[i]);
        run_request(&q);
    }
    pp.address.data = (uint8_t *)"1.2.3.4\0:5";
    pp.address.len = 11;
    run_request(&q);
}

/* Protobuf-ish noise in well-formed frames: field tags of Request and its
 * messages, varints, lengths. */
static void noise(int count)
{
    uint8_t in[1 + OVL_WIRE_HEADER_SIZE + 256];
    for (int i = 0; i < count; i++) {
        size_t body = fuzz_prng() % 257;
        in[0] = (uint8_t)fuzz_prng();
        ovl_wire_header_encode(in + 1, (uint32_t)body);
        uint8_t *p = in + 1 + OVL_WIRE_HEADER_SIZE;
        if (body >= 2) {
            /* a body message in front, holding the rest */
            p[0] = (uint8_t)((2 + fuzz_prng() % 10) << 3 | 2);
            p[1] = (uint8_t)(body - 2 < 0x80 ? body - 2 : 0x7f);
        }
        for (size_t j = body >= 2 ? 2 : 0; j < body; j++) {
            uint32_t x = fuzz_prng();
            p[j] = (uint8_t)((x & 3) ? x % 0x98 : x >> 8);
        }
        fuzz_run(in, 1 + OVL_WIRE_HEADER_SIZE + body);
    }
}

static void fuzz_builtin(void)
{
    others();
    comm_inits();
    mem_registers();
    ops();
    noise(20000);
    fuzz_run(NULL, 0);
}

#endif /* OVL_FUZZ_STANDALONE */

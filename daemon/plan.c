/*
 * plan.c: the planner (see plan.h and docs/plans.md). Every algorithm is one
 * emit_* function that appends instructions to a growing array; the rules
 * they share (chunking, the prologue, joins, the epilogue) live in helpers so
 * that every program has the same shape. Pure code: no I/O, no logging.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* Chunks and streams when the caller asks for 0 (docs/plans.md). */
#define NAIVE_STREAMS      1
#define COLLECTIVE_CHUNKS  4
#define COLLECTIVE_STREAMS 2
#define RING_CHUNKS        1
#define RING_NARROW_N      1024 /* n at or under which ring pulls in two chunks */
/* ring's fixed streams: 0 client, 1 copy engine, 2 and 3 GEMMs */
#define RING_COPY_STREAM  1
#define RING_GEMM_STREAM0 2
#define RING_GEMM_STREAM1 3
#define RING_STREAMS      4
/*
 * ring's head-of-stream sleep on the second GEMM stream. It only has to last
 * longer than the host takes to enqueue the first own-shard GEMM on the other
 * stream, so that the GPU starts the two streams in program order on every
 * rank (PyTorch PR 137836); a few microseconds cost nothing next to a GEMM.
 */
#define RING_SLEEP_NS 2000u

/* AUTO's thresholds (docs/plans.md): below them overlap cannot pay off. */
#define AUTO_MIN_ROWS  512u
#define AUTO_MIN_FLOPS (UINT64_C(1) << 27)

#define INSTR_INITIAL_CAP 32

typedef struct builder {
    ovl_instr_t *instr;
    size_t n;
    size_t cap;
    uint32_t max_stream; /* highest stream used */
    uint32_t max_event;  /* highest event used */
    uint32_t next_event; /* next fresh event */
} builder_t;

/* Appends one instruction, growing the array geometrically. */
static ovl_status_t emit(builder_t *b, const ovl_instr_t *in)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : INSTR_INITIAL_CAP;
        ovl_instr_t *instr;

        if (cap < b->cap || cap > SIZE_MAX / sizeof(*instr))
            return OVL_ERR_NOMEM;
        instr = realloc(b->instr, cap * sizeof(*instr));
        if (!instr)
            return OVL_ERR_NOMEM;
        b->instr = instr;
        b->cap = cap;
    }
    b->instr[b->n++] = *in;
    if (in->stream > b->max_stream)
        b->max_stream = in->stream;
    if ((in->kind == OVL_I_RECORD || in->kind == OVL_I_WAIT) && in->event > b->max_event)
        b->max_event = in->event;
    return OVL_OK;
}

static ovl_status_t emit_simple(builder_t *b, ovl_instr_kind_t kind, uint32_t stream)
{
    ovl_instr_t in = {.kind = kind, .stream = stream};

    return emit(b, &in);
}

static ovl_status_t emit_record(builder_t *b, uint32_t stream, uint32_t event)
{
    ovl_instr_t in = {.kind = OVL_I_RECORD, .stream = stream, .event = event};

    return emit(b, &in);
}

static ovl_status_t emit_wait(builder_t *b, uint32_t stream, uint32_t peer, uint32_t event)
{
    ovl_instr_t in = {.kind = OVL_I_WAIT, .stream = stream, .event = event, .peer = peer};

    return emit(b, &in);
}

static ovl_status_t emit_allgather(builder_t *b, uint32_t stream, uint64_t row0, uint64_t rows)
{
    ovl_instr_t in = {.kind = OVL_I_ALLGATHER, .stream = stream, .row0 = row0, .rows = rows};

    return emit(b, &in);
}

static ovl_status_t emit_pull(builder_t *b, uint32_t stream, uint32_t peer, uint64_t row0,
                              uint64_t rows)
{
    ovl_instr_t in = {
        .kind = OVL_I_PULL, .stream = stream, .peer = peer, .row0 = row0, .rows = rows};

    return emit(b, &in);
}

static ovl_status_t emit_gemm(builder_t *b, uint32_t stream, ovl_gemm_src_t src, uint32_t block0,
                              uint32_t nblocks, uint64_t row0, uint64_t rows)
{
    ovl_instr_t in = {
        .kind = OVL_I_GEMM,
        .stream = stream,
        .src = src,
        .block0 = block0,
        .nblocks = nblocks,
        .row0 = row0,
        .rows = rows,
    };

    return emit(b, &in);
}

static ovl_status_t emit_sleep(builder_t *b, uint32_t stream, uint32_t ns)
{
    ovl_instr_t in = {.kind = OVL_I_SLEEP, .stream = stream, .sleep_ns = ns};

    return emit(b, &in);
}

/* Every program starts so: stream 0 waits for the client, then tells every
 * stream of every rank that this rank's inputs are ready. */
static ovl_status_t emit_prologue(builder_t *b)
{
    ovl_status_t r = emit_simple(b, OVL_I_WAIT_READY, 0);

    if (r == OVL_OK)
        r = emit_record(b, 0, OVL_EV_READY);
    return r;
}

/* Joins streams [first, last] into stream 0, each through a fresh event: the
 * client's stream must not see DONE before the work of any stream is done. */
static ovl_status_t emit_joins(builder_t *b, uint32_t rank, uint32_t first, uint32_t last)
{
    for (uint32_t s = first; s <= last; s++) {
        uint32_t ev = b->next_event++;
        ovl_status_t r = emit_record(b, s, ev);

        if (r == OVL_OK)
            r = emit_wait(b, 0, rank, ev);
        if (r != OVL_OK)
            return r;
    }
    return OVL_OK;
}

/* Rows of chunk j: every chunk has chunk_rows rows but the last, which has
 * what is left. */
static void chunk_range(const ovl_plan_t *plan, uint32_t j, uint64_t *row0, uint64_t *rows)
{
    uint64_t m = plan->params.m;

    *row0 = (uint64_t)j * plan->chunk_rows;
    *rows = m - *row0 < plan->chunk_rows ? m - *row0 : plan->chunk_rows;
}

/* naive: one all-gather, then one GEMM over every block. */
static ovl_status_t emit_naive(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    ovl_status_t r;

    r = emit_prologue(b);
    if (r == OVL_OK)
        r = emit_allgather(b, 0, 0, p->m);
    if (r == OVL_OK)
        r = emit_gemm(b, 0, OVL_SRC_GATHERED, 0, p->world, 0, p->m);
    if (r == OVL_OK)
        r = emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/*
 * collective (nvFuser host-IR overlap): chunk j is all-gathered and then
 * multiplied on stream j % k, so chunk j+1's all-gather overlaps chunk j's
 * GEMM. The side streams' waits on READY form a loop of their own ahead of
 * the first all-gather: interleaved with the all-gathers they serialize the
 * streams and the overlap is lost (nvFuser PR 4217).
 */
static ovl_status_t emit_collective(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t k = plan->nstreams;
    ovl_status_t r;

    r = emit_prologue(b);
    for (uint32_t s = 1; r == OVL_OK && s < k; s++)
        r = emit_wait(b, s, p->rank, OVL_EV_READY);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_allgather(b, j % k, row0, rows);
        if (r == OVL_OK)
            r = emit_gemm(b, j % k, OVL_SRC_GATHERED, 0, p->world, row0, rows);
    }
    if (r == OVL_OK && k > 1)
        r = emit_joins(b, p->rank, 1, k - 1);
    if (r == OVL_OK)
        r = emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/* ring on one rank: no peers, so no side streams; the own shard's GEMMs and
 * (for a_out) its local copy run on the client's stream. */
static ovl_status_t emit_ring_single(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    ovl_status_t r;

    r = emit_prologue(b);
    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_gemm(b, 0, OVL_SRC_LOCAL, p->rank, 1, row0, rows);
    }
    if (r == OVL_OK && p->want_gathered)
        r = emit_pull(b, 0, p->rank, 0, p->m);
    if (r == OVL_OK)
        r = emit_simple(b, OVL_I_DONE, 0);
    return r;
}

/*
 * ring (PyTorch async-TP, TransformerEngine P2P): the own shard is multiplied
 * first, straight from the client's A, while the copy stream pulls the peers'
 * shards in ring order (r+1, r+2, ...: at every step each rank reads from a
 * different peer). Each pulled chunk's GEMM waits only for that pull, on a
 * GEMM stream that alternates with every GEMM issued, so one GEMM's tail
 * overlaps the next one's head. RELEASE then tells the peers that this rank
 * no longer reads their shards; DONE waits for every peer's RELEASE, since the
 * client may overwrite A as soon as DONE rings.
 */
static ovl_status_t emit_ring(builder_t *b, const ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t gemms = 0; /* GEMMs issued: picks the GEMM stream */
    ovl_status_t r;

    if (p->world == 1)
        return emit_ring_single(b, plan);

    r = emit_prologue(b);
    for (uint32_t s = RING_COPY_STREAM; r == OVL_OK && s <= RING_GEMM_STREAM1; s++)
        r = emit_wait(b, s, p->rank, OVL_EV_READY);
    if (r == OVL_OK)
        r = emit_sleep(b, RING_GEMM_STREAM1, RING_SLEEP_NS);

    for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
        uint64_t row0, rows;

        chunk_range(plan, j, &row0, &rows);
        r = emit_gemm(b, RING_GEMM_STREAM0, OVL_SRC_LOCAL, p->rank, 1, row0, rows);
    }
    if (r == OVL_OK && p->want_gathered)
        r = emit_pull(b, RING_COPY_STREAM, p->rank, 0, p->m);

    for (uint32_t t = 1; r == OVL_OK && t < p->world; t++) {
        uint32_t peer = (p->rank + t) % p->world;

        r = emit_wait(b, RING_COPY_STREAM, peer, OVL_EV_READY);
        for (uint32_t j = 0; r == OVL_OK && j < plan->chunks; j++, gemms++) {
            uint32_t gs = gemms % 2 ? RING_GEMM_STREAM1 : RING_GEMM_STREAM0;
            uint32_t ev = b->next_event++;
            uint64_t row0, rows;

            chunk_range(plan, j, &row0, &rows);
            r = emit_pull(b, RING_COPY_STREAM, peer, row0, rows);
            if (r == OVL_OK)
                r = emit_record(b, RING_COPY_STREAM, ev);
            if (r == OVL_OK)
                r = emit_wait(b, gs, p->rank, ev);
            if (r == OVL_OK)
                r = emit_gemm(b, gs, OVL_SRC_GATHERED, peer, 1, row0, rows);
        }
    }
    if (r == OVL_OK)
        r = emit_record(b, RING_COPY_STREAM, OVL_EV_RELEASE);
    if (r == OVL_OK)
        r = emit_joins(b, p->rank, RING_COPY_STREAM, RING_GEMM_STREAM1);
    for (uint32_t t = 1; r == OVL_OK && t < p->world; t++)
        r = emit_wait(b, 0, (p->rank + t) % p->world, OVL_EV_RELEASE);
    if (r == OVL_OK)
        r = emit_simple(b, OVL_I_DONE, 0);
    return r;
}

static bool params_valid(const ovl_plan_params_t *p)
{
    if (p->world == 0 || p->world > OVL_PLAN_MAX_WORLD || p->rank >= p->world)
        return false;
    if (p->m == 0 || p->n == 0 || p->k == 0)
        return false;
    /* G has world*m rows; row arithmetic must not wrap */
    if (p->m > UINT64_MAX / p->world)
        return false;
    /* AUTO is resolved before building; an algorithm without an emitter
     * fails in ovl_plan_build's switch */
    if (p->algo == OVL_ALGO_AUTO || (unsigned)p->algo >= OVL_ALGO_COUNT)
        return false;
    if (ovl_dtype_size(p->dtype) == 0)
        return false;
    return p->chunks <= OVL_PLAN_MAX_CHUNKS && p->streams <= OVL_PLAN_MAX_STREAMS;
}

/*
 * Fills the plan's chunking and stream count from the params (the rules of
 * docs/plans.md): chunks are clamped to m and evened out so that none is
 * empty; streams are what the algorithm actually uses.
 */
static void plan_shape(ovl_plan_t *plan)
{
    const ovl_plan_params_t *p = &plan->params;
    uint32_t c = p->chunks, s = p->streams;

    switch (p->algo) {
    case OVL_ALGO_COLLECTIVE:
        c = c ? c : COLLECTIVE_CHUNKS;
        s = s ? s : COLLECTIVE_STREAMS;
        break;
    case OVL_ALGO_RING:
        /* Narrow outputs make each peer's GEMM short next to its pull: two
         * chunks let the first half's GEMM run while the second arrives
         * (2 x H200: 65536x1024x1024 about 13% faster with two; the wider
         * shapes as fast or faster with one; docs/plans.md). */
        c = c ? c : p->n <= RING_NARROW_N ? 2 : RING_CHUNKS;
        /* ring's streams are fixed by its structure: the request is ignored */
        s = p->world > 1 ? RING_STREAMS : 1;
        break;
    default:
        c = 1;
        s = NAIVE_STREAMS;
        break;
    }
    if (c > p->m)
        c = (uint32_t)p->m;
    plan->chunk_rows = p->m / c + (p->m % c != 0);
    plan->chunks = (uint32_t)(p->m / plan->chunk_rows + (p->m % plan->chunk_rows != 0));
    /* a collective stream without a chunk would only wait and join */
    if (p->algo == OVL_ALGO_COLLECTIVE && s > plan->chunks)
        s = plan->chunks;
    plan->nstreams = s;
    plan->uses_gathered = ovl_plan_uses_gathered(p);
}

bool ovl_plan_uses_gathered(const ovl_plan_params_t *p)
{
    /* ring at world 1 multiplies the shard in place: nothing to gather */
    return p->algo != OVL_ALGO_RING || p->world > 1 || p->want_gathered;
}

ovl_status_t ovl_plan_build(const ovl_plan_params_t *params, ovl_plan_t *ret_plan)
{
    builder_t b = {.next_event = OVL_EV_FIRST_FREE};
    ovl_plan_t plan = {0};
    ovl_status_t r;

    if (!params || !ret_plan || !params_valid(params))
        return OVL_ERR_INVALID;

    plan.params = *params;
    plan_shape(&plan);
    switch (params->algo) {
    case OVL_ALGO_NAIVE:
        r = emit_naive(&b, &plan);
        break;
    case OVL_ALGO_COLLECTIVE:
        r = emit_collective(&b, &plan);
        break;
    case OVL_ALGO_RING:
        r = emit_ring(&b, &plan);
        break;
    default:
        r = OVL_ERR_INVALID;
        break;
    }
    if (r != OVL_OK)
        goto fail;
    if (b.max_stream + 1 != plan.nstreams) {
        /* plan_shape and the emitter disagree: a planner bug */
        r = OVL_ERR_INTERNAL;
        goto fail;
    }

    plan.nevents = b.max_event + 1;
    plan.ninstr = b.n;
    plan.instr = b.instr;
    *ret_plan = plan;
    return OVL_OK;

fail:
    free(b.instr);
    return r;
}

void ovl_plan_free(ovl_plan_t *plan)
{
    if (!plan)
        return;
    free(plan->instr);
    memset(plan, 0, sizeof(*plan));
}

/* a * b, saturating at UINT64_MAX: AUTO compares sizes, it never needs more. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

ovl_algo_t ovl_plan_choose(const ovl_plan_params_t *params)
{
    uint64_t rows, flops;

    if (!params || params->world <= 1)
        return OVL_ALGO_NAIVE;
    rows = mul_sat(params->m, params->world);
    flops = mul_sat(mul_sat(mul_sat(2, rows), params->n), params->k);
    if (rows < AUTO_MIN_ROWS || flops < AUTO_MIN_FLOPS)
        return OVL_ALGO_NAIVE;
    return OVL_ALGO_RING;
}

const char *ovl_instr_name(ovl_instr_kind_t kind)
{
    switch (kind) {
    case OVL_I_WAIT_READY:
        return "WAIT_READY";
    case OVL_I_RECORD:
        return "RECORD";
    case OVL_I_WAIT:
        return "WAIT";
    case OVL_I_ALLGATHER:
        return "ALLGATHER";
    case OVL_I_PULL:
        return "PULL";
    case OVL_I_GEMM:
        return "GEMM";
    case OVL_I_SLEEP:
        return "SLEEP";
    case OVL_I_DONE:
        return "DONE";
    }
    return "UNKNOWN";
}

typedef struct out {
    char *buf;
    size_t len;
    size_t need; /* bytes the whole text needs so far */
} out_t;

/* Appends like snprintf, keeping count of the full length once buf is full;
 * vsnprintf leaves the truncated text NUL-terminated. */
static void out_printf(out_t *o, const char *fmt, ...)
{
    char *dst = NULL;
    size_t room = 0;
    va_list ap;
    int n;

    if (o->need < o->len) {
        dst = o->buf + o->need;
        room = o->len - o->need;
    }
    va_start(ap, fmt);
    n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->need += (size_t)n;
}

static void format_instr(out_t *o, size_t i, const ovl_instr_t *in)
{
    out_printf(o, "%4zu  s%" PRIu32 "  %s", i, in->stream, ovl_instr_name(in->kind));
    switch (in->kind) {
    case OVL_I_RECORD:
        out_printf(o, " ev%" PRIu32, in->event);
        break;
    case OVL_I_WAIT:
        out_printf(o, " ev%" PRIu32 "@r%" PRIu32, in->event, in->peer);
        break;
    case OVL_I_ALLGATHER:
        out_printf(o, " rows %" PRIu64 "+%" PRIu64, in->row0, in->rows);
        break;
    case OVL_I_PULL:
        out_printf(o, " r%" PRIu32 " rows %" PRIu64 "+%" PRIu64, in->peer, in->row0, in->rows);
        break;
    case OVL_I_GEMM:
        out_printf(o, " %s blocks %" PRIu32 "+%" PRIu32 " rows %" PRIu64 "+%" PRIu64,
                   in->src == OVL_SRC_LOCAL ? "local" : "gathered", in->block0, in->nblocks,
                   in->row0, in->rows);
        break;
    case OVL_I_SLEEP:
        out_printf(o, " %" PRIu32 "ns", in->sleep_ns);
        break;
    case OVL_I_WAIT_READY:
    case OVL_I_DONE:
        break;
    }
    out_printf(o, "\n");
}

size_t ovl_plan_format(const ovl_plan_t *plan, char *buf, size_t len)
{
    out_t o = {.buf = buf, .len = len};
    const ovl_plan_params_t *p;
    const char *algo, *dtype;

    if (len > 0)
        buf[0] = '\0';
    if (!plan)
        return 0;
    p = &plan->params;
    algo = ovl_algo_name(p->algo);
    dtype = ovl_dtype_name(p->dtype);
    out_printf(&o,
               "plan algo=%s world=%" PRIu32 " rank=%" PRIu32 " m=%" PRIu64 " n=%" PRIu64
               " k=%" PRIu64 " dtype=%s chunks=%" PRIu32 " chunk_rows=%" PRIu64 " streams=%" PRIu32
               " events=%" PRIu32 " gathered=%s a_out=%s\n",
               algo ? algo : "?", p->world, p->rank, p->m, p->n, p->k, dtype ? dtype : "?",
               plan->chunks, plan->chunk_rows, plan->nstreams, plan->nevents,
               plan->uses_gathered ? "yes" : "no", p->want_gathered ? "yes" : "no");
    for (size_t i = 0; i < plan->ninstr; i++)
        format_instr(&o, i, &plan->instr[i]);
    return o.need;
}

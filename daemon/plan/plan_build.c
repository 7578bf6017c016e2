/*
 * plan_build.c: what every emitter of the planner builds with
 * (plan_build.h): the topology of a job's ranks, the growing program
 * (instructions, events, streams, the RAILs' peer lists) and the pieces
 * every program shares (the prologue, the joins, a head-of-stream sleep),
 * the default chunk count and the buffers' used flags. plan.c's and
 * plan_rs.c's emitters sit above it; it calls neither. Pure code: no I/O,
 * no logging.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "plan_build.h"
#include "scaling.h"

/*
 * The default chunks split an op's GEMMs only while each chunk's GEMM keeps
 * at least this much work (2 x rows x n x k): about 1.5 us on an H100 or
 * H200. Below it, a chunk's GEMM is as short as the launches and waits that
 * each chunk adds (a few us of host and GPU time), so overlap cannot repay
 * them; tiny ops are issued whole (issue 15: at world 8, 128^3 ring went
 * from 240 to 120 GEMMs and pulls per op).
 */
#define MIN_CHUNK_GEMM_FLOP (1ull << 30)

#define INSTR_INITIAL_CAP 32

/* The nodes params.node_of names (1 for NULL), or 0 where it is not dense
 * (a node id >= world, or an id unused below the highest). */
uint32_t pb_count_nodes(const ovl_plan_params_t *p)
{
    bool seen[OVL_PLAN_MAX_WORLD] = {false};
    uint32_t max = 0;

    if (!p->node_of)
        return 1;
    for (uint32_t q = 0; q < p->world; q++) {
        if (p->node_of[q] >= p->world)
            return 0;
        seen[p->node_of[q]] = true;
        if (p->node_of[q] > max)
            max = p->node_of[q];
    }
    for (uint32_t n = 0; n <= max; n++)
        if (!seen[n])
            return 0;
    return max + 1;
}

void pb_topo_free(topo_t *t)
{
    free(t->size); /* the one block of every array */
    memset(t, 0, sizeof(*t));
}

/* Derives the topology of valid params (count_nodes > 0). */
ovl_status_t pb_topo_make(const ovl_plan_params_t *p, topo_t *t)
{
    uint32_t w = p->world, k = pb_count_nodes(p);
    uint32_t *block = calloc(2 * (size_t)k + 3 * (size_t)w, sizeof(*block));

    memset(t, 0, sizeof(*t));
    if (!block)
        return OVL_ERR_NOMEM;
    t->nnodes = k;
    t->node_of = k > 1 ? p->node_of : NULL;
    t->size = block;
    t->first = block + k;
    t->by_node = t->first + k;
    t->local = t->by_node + w;
    t->scratch = t->local + w;
    for (uint32_t q = 0; q < w; q++)
        t->local[q] = t->size[pb_node_of(t, q)]++;
    for (uint32_t n = 1; n < k; n++)
        t->first[n] = t->first[n - 1] + t->size[n - 1];
    for (uint32_t q = 0; q < w; q++)
        t->by_node[t->first[pb_node_of(t, q)] + t->local[q]] = q;
    return OVL_OK;
}

/* Local index i of node n. */
uint32_t pb_rank_at(const topo_t *t, uint32_t n, uint32_t i)
{
    return t->by_node[t->first[n] + i];
}

/* The scale buffer of A's rows in buf (A or G): SA, or SG. */
static ovl_buf_t scale_of(ovl_buf_t buf)
{
    return buf == OVL_BUF_G ? OVL_BUF_SG : OVL_BUF_SA;
}

/* Appends one instruction, growing the array geometrically. */
static ovl_status_t emit_one(builder_t *b, const ovl_instr_t *in)
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

/*
 * Every instruction goes through here, so that a scaled op's scales follow
 * their rows in every algorithm alike: a GEMM names the scales of its A
 * rows (SA's, or SG's for gathered rows); a transfer of A's rows into G is
 * followed, on the same stream, by the same transfer of their scales from
 * SA into SG (ovl_plan_scale_cols fp32 a row: by row one, by 1x128 one per
 * 128 of k), so that whatever orders the rows (the events and waits the
 * emitter places after it) orders their scales too.
 */
ovl_status_t pb_emit(builder_t *b, const ovl_instr_t *in)
{
    const ovl_plan_params_t *p = &b->plan->params;
    ovl_instr_t x = *in;

    if (!p->sc.scaled)
        return emit_one(b, in);
    if (x.kind == OVL_I_GEMM) {
        x.sa = (ovl_ref_t){.buf = ovl_plan_scales_per_row(p) ? scale_of(x.src.buf) : OVL_BUF_SA,
                           .rank = p->rank,
                           .row = ovl_plan_scales_per_row(p) ? x.src.row : 0};
        return emit_one(b, &x);
    }
    ovl_status_t r = emit_one(b, &x);
    bool moves_a = x.kind == OVL_I_ALLGATHER || x.kind == OVL_I_PULL || x.kind == OVL_I_PUSH ||
                   x.kind == OVL_I_RAIL;
    if (r != OVL_OK || !moves_a || x.dst.buf != OVL_BUF_G || !ovl_plan_scales_per_row(p))
        return r;
    x.src.buf = scale_of(x.src.buf);
    x.dst.buf = OVL_BUF_SG;
    x.cols = ovl_plan_scale_cols(p);
    return emit_one(b, &x);
}

/* Appends n ranks to the plan's peer lists. */
ovl_status_t pb_add_peers(builder_t *b, const uint32_t *ranks, uint32_t n)
{
    if (n > b->cap_peers - b->npeers) {
        uint32_t cap = b->cap_peers ? b->cap_peers : 16;
        uint32_t *peers;

        while (cap - b->npeers < n) {
            if (cap > UINT32_MAX / 2)
                return OVL_ERR_NOMEM;
            cap *= 2;
        }
        peers = realloc(b->peers, (size_t)cap * sizeof(*peers));
        if (!peers)
            return OVL_ERR_NOMEM;
        b->peers = peers;
        b->cap_peers = cap;
    }
    memcpy(b->peers + b->npeers, ranks, (size_t)n * sizeof(*ranks));
    b->npeers += n;
    return OVL_OK;
}

ovl_status_t pb_emit_simple(builder_t *b, ovl_instr_kind_t kind, uint32_t stream)
{
    ovl_instr_t in = {.kind = kind, .stream = stream};

    return pb_emit(b, &in);
}

ovl_status_t pb_emit_record(builder_t *b, uint32_t stream, uint32_t event)
{
    ovl_instr_t in = {.kind = OVL_I_RECORD, .stream = stream, .event = event};

    return pb_emit(b, &in);
}

ovl_status_t pb_emit_wait(builder_t *b, uint32_t stream, uint32_t peer, uint32_t event)
{
    ovl_instr_t in = {.kind = OVL_I_WAIT, .stream = stream, .event = event, .peer = peer};

    return pb_emit(b, &in);
}

/* A row of one of this rank's buffers. */
ovl_ref_t pb_own(const builder_t *b, ovl_buf_t buf, uint64_t row)
{
    return (ovl_ref_t){.buf = buf, .rank = b->plan->params.rank, .row = row};
}

ovl_status_t pb_emit_sleep(builder_t *b, uint32_t stream, uint32_t ns)
{
    ovl_instr_t in = {.kind = OVL_I_SLEEP, .stream = stream, .sleep_ns = ns};

    return pb_emit(b, &in);
}

/* Every program starts so: stream 0 waits for the client, then tells every
 * stream of every rank that this rank's inputs are ready. */
ovl_status_t pb_emit_prologue(builder_t *b)
{
    ovl_status_t r = pb_emit_simple(b, OVL_I_WAIT_READY, 0);

    if (r == OVL_OK)
        r = pb_emit_record(b, 0, OVL_EV_READY);
    return r;
}

/* Joins streams [first, last] into stream 0, each through a fresh event: the
 * client's stream must not see DONE before the work of any stream is done. */
ovl_status_t pb_emit_joins(builder_t *b, uint32_t rank, uint32_t first, uint32_t last)
{
    for (uint32_t s = first; s <= last; s++) {
        uint32_t ev = b->next_event++;
        ovl_status_t r = pb_emit_record(b, s, ev);

        if (r == OVL_OK)
            r = pb_emit_wait(b, 0, rank, ev);
        if (r != OVL_OK)
            return r;
    }
    return OVL_OK;
}

ovl_status_t pb_keep_topology(ovl_plan_t *plan, const ovl_plan_params_t *params, uint32_t nnodes)
{
    plan->nnodes = nnodes;
    plan->params.node_of = NULL;
    if (nnodes > 1) {
        uint32_t *copy = malloc((size_t)params->world * sizeof(*copy));

        if (!copy)
            return OVL_ERR_NOMEM;
        memcpy(copy, params->node_of, (size_t)params->world * sizeof(*copy));
        plan->params.node_of = copy;
    }
    return OVL_OK;
}

void pb_finish(builder_t *b, ovl_plan_t *plan)
{
    plan->nevents = b->max_event + 1;
    plan->ninstr = b->n;
    plan->instr = b->instr;
    plan->npeers = b->npeers;
    plan->peers = b->peers;
    pb_mark_used(plan);
}

ovl_status_t pb_emit_epilogue(builder_t *b, uint32_t rank, uint32_t nstreams)
{
    ovl_status_t r = pb_emit_joins(b, rank, 1, nstreams - 1);

    return r == OVL_OK ? pb_emit_simple(b, OVL_I_DONE, 0) : r;
}

/*
 * An algorithm's default chunk count c, halved while a chunk's GEMM (its
 * ceil(m / c) rows of `ranks` ranks, all the Bs' columns) would do less
 * than MIN_CHUNK_GEMM_FLOP.
 */
uint32_t pb_default_chunks(const ovl_plan_params_t *p, uint32_t c, uint32_t ranks)
{
    double per_row = 2.0 * (double)ranks * (double)pb_total_n(p) * (double)p->k;
    while (c > 1 && (double)((p->m + c - 1) / c) * per_row < (double)MIN_CHUNK_GEMM_FLOP)
        c /= 2;
    return c;
}

/* Marks the buffers the instructions name. */
void pb_mark_used(ovl_plan_t *plan)
{
    for (size_t i = 0; i < plan->ninstr; i++) {
        const ovl_instr_t *in = &plan->instr[i];

        switch (in->kind) {
        case OVL_I_GEMM:
            plan->bufs[in->b.buf].used = true;
            if (in->accumulate)
                plan->bufs[in->acc.buf].used = true;
            if (plan->params.sc.scaled) {
                uint32_t i = ovl_gemm_b(in);
                plan->bufs[in->sa.buf].used = true;
                plan->bufs[ovl_buf_sb(i)].used = true;
                plan->bufs[ovl_buf_bias(i)].used = plan->params.sc.bias;
            }
            /* fall through */
        case OVL_I_ALLGATHER:
        case OVL_I_PULL:
        case OVL_I_PUSH:
        case OVL_I_RAIL:
        case OVL_I_REDUCE_SCATTER:
        case OVL_I_REDUCE:
            plan->bufs[in->src.buf].used = true;
            plan->bufs[in->dst.buf].used = true;
            break;
        case OVL_I_WAIT_READY:
        case OVL_I_RECORD:
        case OVL_I_WAIT:
        case OVL_I_SLEEP:
        case OVL_I_DONE:
            break;
        }
    }
}

/* The Bs' columns together (saturating): a GEMM's width per gathered row. */
uint64_t pb_total_n(const ovl_plan_params_t *p)
{
    uint64_t n = 0;

    for (uint32_t i = 0; i < ovl_plan_nb(p) && i < OVL_PLAN_MAX_BS; i++)
        n = ovl_plan_bn(p, i) > UINT64_MAX - n ? UINT64_MAX : n + ovl_plan_bn(p, i);
    return n;
}

void pb_buf_types(const ovl_plan_params_t *p, ovl_plan_buf_t *bufs)
{
    ovl_dtype_t bdt = p->sc.scaled ? p->sc.b_dtype : p->dtype, cdt = ovl_plan_out_dtype(p);

    for (int i = 0; i < OVL_BUF_COUNT; i++) {
        ovl_buf_t buf = (ovl_buf_t)i;

        bufs[i].dtype = ovl_buf_b_index(buf) >= 0                       ? bdt
                        : ovl_buf_c_index(buf) >= 0 || buf == OVL_BUF_P ? cdt
                                                                        : p->dtype;
    }
    if (!p->sc.scaled)
        return;
    uint64_t r, c;
    (void)ovl_scale_shape(p->sc.a_mode, 0, p->m, p->k, &r, &c); /* valid: params_valid */
    bufs[OVL_BUF_SA] = (ovl_plan_buf_t){.rows = r, .cols = c, .dtype = OVL_DTYPE_FP32};
    for (uint32_t i = 0; i < ovl_plan_nb(p) && i < OVL_PLAN_MAX_BS; i++) {
        uint64_t n = ovl_plan_bn(p, i);

        (void)ovl_scale_shape(p->sc.b_mode, 1, n, p->k, &r, &c);
        bufs[ovl_buf_sb(i)] = (ovl_plan_buf_t){.rows = r, .cols = c, .dtype = OVL_DTYPE_FP32};
        bufs[ovl_buf_bias(i)] = (ovl_plan_buf_t){.rows = 1, .cols = n, .dtype = cdt};
    }
    /* all-gather + GEMM's gathered scales (GEMM + reduce-scatter has none) */
    if (p->kind != OVL_OP_GEMM_RS)
        bufs[OVL_BUF_SG] = (ovl_plan_buf_t){
            .rows = p->m * p->world, .cols = ovl_plan_scale_cols(p), .dtype = OVL_DTYPE_FP32};
}

ovl_status_t pb_scratch_after(uint64_t *total, uint64_t bytes, uint64_t *ret_offset)
{
    uint64_t at = *total;

    if (at % PB_SCRATCH_ALIGN &&
        __builtin_add_overflow(at, PB_SCRATCH_ALIGN - at % PB_SCRATCH_ALIGN, &at))
        return OVL_ERR_LIMIT;
    if (__builtin_add_overflow(at, bytes, total))
        return OVL_ERR_LIMIT;
    *ret_offset = at;
    return OVL_OK;
}

const char *pb_scaling_refusal(const ovl_plan_params_t *p)
{
    const ovl_plan_scaling_t *sc = &p->sc;

    if (!sc->scaled)
        return ovl_dtype_is_fp8(p->dtype) ? "an fp8 dtype needs scaling" : NULL;
    /* unsigned: an enum may be signed, and a negative value is unknown */
    const char *why =
        ovl_scaling_refusal((unsigned)p->dtype, (unsigned)sc->b_dtype, (unsigned)sc->out_dtype,
                            (unsigned)sc->a_mode, (unsigned)sc->b_mode, p->transb);
    /* a GEMM's rows: a rank's (all-gather), a block of the output's */
    uint64_t rows = p->kind == OVL_OP_GEMM_RS && p->world ? p->m / p->world : p->m;
    for (uint32_t i = 0; !why && i < ovl_plan_nb(p) && i < OVL_PLAN_MAX_BS; i++)
        why = ovl_scaling_shape_refusal(sc->a_mode, sc->b_mode, rows, ovl_plan_bn(p, i));
    return why;
}

void pb_chunk_rows(const ovl_plan_params_t *p, uint64_t rows, uint32_t c, uint64_t *ret_rows,
                   uint32_t *ret_chunks)
{
    uint64_t g = p->sc.scaled ? ovl_scaling_row_granule(p->sc.a_mode) : 1, cr;

    if (c == 0)
        c = 1;
    if (c > rows)
        c = (uint32_t)rows;
    cr = rows / c + (rows % c != 0);
    if (cr % g)
        cr += g - cr % g;
    *ret_rows = cr;
    *ret_chunks = (uint32_t)(rows / cr + (rows % cr != 0));
}

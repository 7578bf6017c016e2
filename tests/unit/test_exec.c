/*
 * test_exec.c: unit test of the executor (daemon/issue/exec.c) against a backend
 * that only records what it is asked to do, in order, and can be told to
 * fail its Nth call.
 *
 * For every algorithm, world 1 to 4, chunk counts 0 to 3 and with and
 * without a_out, the planner's programs are run and the log must show what
 * exec.h promises:
 *  - every rank's first call is WAIT_READY for the op, and its last is one
 *    DONE with OVL_OK, rung exactly once;
 *  - a wait on a peer's event comes after that peer recorded it in this op
 *    (what cudaStreamWaitEvent needs), a wait on the rank's own event after
 *    its own record;
 *  - each ALLGATHER is one call for every rank, by the method and with the
 *    rows the plans name; so is each RAIL (a ring across nodes), whose
 *    parts carry exactly the plan's send and receive lists;
 *  - every rank's calls other than ALLGATHER follow its program in order;
 *  - before any of them, each rank's streams get exactly its plan's roles
 *    (set_streams), and no call names a stream beyond them;
 *  - every primitive gets exactly the views the plan's names resolve to:
 *    each rank's buffers have distinct fake base pointers and leading
 *    dimensions, and the pointer and ld of every operand, with the
 *    geometry (rows, cols, n, k, blocks, stride, transb, element size),
 *    must be what the instruction names; buffers a plan does not use are
 *    NULL, and never reach the backend.
 * Layouts vary: dense (NCCL methods across ranks), strided (A and a_out
 * with ld > k: gathered by pulls), and the daemon's preferences copy and
 * nccl (an ALLGATHER at world 1 too); and topologies: one node, and jobs
 * across nodes (even, uneven, not node-major; dense layouts only, what
 * crosses nodes is NCCL's).
 * Then each call in turn is made to fail: the executor must return that
 * status with a message naming the failed instruction (or the all-gather),
 * ring every rank's done exactly once (OK only for a rank whose program
 * ran to its DONE, the error for the others), and after the failure issue
 * only joins and doorbells, besides (with threads) what other ranks' threads
 * had under way.
 *
 * All of it twice: the backend issued serially, and with issue_parallel
 * (a thread per rank for plans without ALLGATHER or RAIL, i.e. ring in one
 * node; done rung by the calling thread).
 *
 * Last, a ring across nodes runs whole on the real host backend, every
 * rank of a simulated topology served here, its results checked against a
 * reference GEMM (test_host_rail_ring).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "doorbell.h"
#include "exec.h"
#include "plan.h"

#define MAXW     4
#define MAXLOG   4096
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

typedef enum {
    C_STREAMS,
    C_WAIT_READY,
    C_RECORD,
    C_WAIT,
    C_ALLGATHER,
    C_COPY,
    C_GEMM,
    C_SLEEP,
    C_DONE,
    C_RAIL,
    C_REDUCE_SCATTER, /* the mock has none: test_host_reduce_scatter runs the host's */
    C_REDUCE
} call_t;

/* One part of a RAIL call, with copies of its lists (the plan's). */
typedef struct rail_log {
    int rank;
    uint32_t global, stream, nsend, nrecv;
    ovld_view_t src, dst;
    uint32_t send[MAXW], recv[MAXW];
} rail_log_t;

typedef struct entry {
    pthread_t thread; /* the thread that made the call */
    call_t call;
    int rank;  /* -1 for ALLGATHER */
    int owner; /* WAIT: the event's rank */
    uint32_t stream, event;
    uint64_t seq, rows, cols, stride;
    uint32_t nparts;
    ovl_status_t status;                               /* DONE */
    ovl_ag_method_t method;                            /* ALLGATHER */
    ovld_allgather_part_t parts[MAXW];                 /* ALLGATHER */
    ovld_view_t dst, src;                              /* COPY */
    size_t elem;                                       /* COPY */
    uint32_t nblocks, div;                             /* REDUCE */
    ovl_dtype_t dtype;                                 /* REDUCE */
    ovld_gemm_args_t gemm;                             /* GEMM */
    ovl_stream_role_t roles[OVL_PLAN_MAX_STREAMS + 1]; /* STREAMS */
    uint32_t nroles;                                   /* STREAMS */
    rail_log_t rail[MAXW];                             /* RAIL */
} entry_t;

struct ovld_rank {
    int id;
};

static ovld_exec_pool_t *g_pool; /* pool_setup */
static struct {
    pthread_mutex_t mu; /* issuing threads log at once */
    entry_t log[MAXLOG];
    size_t n;
    size_t fail_at; /* 1-based index of the call to fail; 0: none */
    ovl_status_t fail_status;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Logs a call; its status (the injected failure, or OVL_OK). DONE never
 * fails (backends must ring). No cmocka assertion here: issuing threads
 * call it. */
/* What the mock says of its last failure, per thread as a backend must. */
static _Thread_local char m_err[64];

static ovl_status_t logc(entry_t e)
{
    e.thread = pthread_self();
    pthread_mutex_lock(&M.mu);
    ovl_status_t st = OVL_OK;
    if (M.n >= MAXLOG) {
        st = OVL_ERR_LIMIT;
    } else {
        M.log[M.n++] = e;
        if (e.call != C_DONE && M.fail_at == M.n) {
            st = M.fail_status;
            snprintf(m_err, sizeof(m_err), "the mock was told to fail call %zu", M.n);
        }
    }
    pthread_mutex_unlock(&M.mu);
    return st;
}

static ovl_status_t m_wait_ready(ovld_rank_t *r, uint32_t s, uint64_t seq)
{
    return logc((entry_t){.call = C_WAIT_READY, .rank = r->id, .stream = s, .seq = seq});
}

static ovl_status_t m_record(ovld_rank_t *r, uint32_t s, uint32_t ev)
{
    return logc((entry_t){.call = C_RECORD, .rank = r->id, .stream = s, .event = ev});
}

static ovl_status_t m_wait(ovld_rank_t *r, uint32_t s, ovld_rank_t *owner, uint32_t ev)
{
    return logc(
        (entry_t){.call = C_WAIT, .rank = r->id, .owner = owner->id, .stream = s, .event = ev});
}

static ovl_status_t m_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                                const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                                ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag;
    assert_int_equal(nparts, world);
    entry_t e = {.call = C_ALLGATHER,
                 .rank = -1,
                 .method = method,
                 .rows = rows,
                 .cols = cols,
                 .stride = stride,
                 .nparts = nparts,
                 .elem = ovl_dtype_size(dtype)};
    /* the loop thread alone calls it: assertions are safe */
    assert_true(nparts <= MAXW);
    for (uint32_t i = 0; i < nparts; i++) {
        assert_int_equal(parts[i].rank->id, (int)i); /* in rank order */
        e.parts[i] = parts[i];
    }
    return logc(e);
}

static ovl_status_t m_rail(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                           const ovld_rail_part_t *parts, uint32_t nparts, uint32_t world,
                           ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag;
    assert_int_equal(nparts, world);
    entry_t e = {.call = C_RAIL,
                 .rank = -1,
                 .method = method,
                 .rows = rows,
                 .cols = cols,
                 .stride = stride,
                 .nparts = nparts,
                 .elem = ovl_dtype_size(dtype)};
    /* the loop thread alone calls it: assertions are safe */
    assert_true(nparts <= MAXW);
    for (uint32_t i = 0; i < nparts; i++) {
        const ovld_rail_part_t *x = &parts[i];
        assert_int_equal(x->rank->id, (int)i); /* in rank order */
        assert_true(x->nsend <= MAXW && x->nrecv <= MAXW);
        e.rail[i] = (rail_log_t){.rank = x->rank->id,
                                 .global = x->global,
                                 .stream = x->stream,
                                 .nsend = x->nsend,
                                 .nrecv = x->nrecv,
                                 .src = x->src,
                                 .dst = x->dst};
        for (uint32_t k = 0; k < x->nsend; k++)
            e.rail[i].send[k] = x->send[k];
        for (uint32_t k = 0; k < x->nrecv; k++)
            e.rail[i].recv[k] = x->recv[k];
    }
    return logc(e);
}

static ovl_status_t m_copy(ovld_rank_t *r, uint32_t s, ovld_view_t dst, ovld_view_t src,
                           uint64_t rows, uint64_t cols, size_t elem)
{
    return logc((entry_t){.call = C_COPY,
                          .rank = r->id,
                          .stream = s,
                          .dst = dst,
                          .src = src,
                          .rows = rows,
                          .cols = cols,
                          .elem = elem});
}

static ovl_status_t m_reduce(ovld_rank_t *r, uint32_t s, ovld_view_t dst, ovld_view_t src,
                             uint64_t rows, uint64_t cols, uint32_t nblocks, uint64_t stride,
                             ovl_dtype_t dtype, uint32_t div)
{
    return logc((entry_t){.call = C_REDUCE,
                          .rank = r->id,
                          .stream = s,
                          .dst = dst,
                          .src = src,
                          .rows = rows,
                          .cols = cols,
                          .stride = stride,
                          .nblocks = nblocks,
                          .div = div,
                          .dtype = dtype});
}

static ovl_status_t m_gemm(ovld_rank_t *r, uint32_t s, const ovld_gemm_args_t *g)
{
    return logc((entry_t){.call = C_GEMM, .rank = r->id, .stream = s, .rows = g->rows, .gemm = *g});
}

static ovl_status_t m_set_streams(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n)
{
    entry_t e = {.call = C_STREAMS, .rank = r->id, .nroles = n};
    if (n <= OVL_PLAN_MAX_STREAMS)
        memcpy(e.roles, roles, n * sizeof(*roles));
    return logc(e);
}

static ovl_status_t m_sleep(ovld_rank_t *r, uint32_t s, uint32_t ns)
{
    (void)ns;
    return logc((entry_t){.call = C_SLEEP, .rank = r->id, .stream = s});
}

static void m_done(ovld_rank_t *r, uint32_t s, uint64_t seq, ovl_status_t status, const char *msg,
                   void *cookie)
{
    (void)msg;
    /* the rank's own cookie comes back (owner -1 marks a wrong one) */
    logc((entry_t){.call = C_DONE,
                   .rank = r->id,
                   .owner = cookie == r ? r->id : -1,
                   .stream = s,
                   .seq = seq,
                   .status = status});
}

static const char *m_last_error(ovld_backend_t *b)
{
    (void)b;
    return m_err;
}

static ovl_status_t m_reserve_events(ovld_rank_t *r, uint32_t n)
{
    (void)r;
    (void)n;
    return OVL_OK;
}

static ovld_backend_ops_t mock_ops = {
    .name = "mock",
    .reserve_events = m_reserve_events,
    .set_streams = m_set_streams,
    .wait_ready = m_wait_ready,
    .record = m_record,
    .wait = m_wait,
    .allgather = m_allgather,
    .rail = m_rail,
    .copy = m_copy,
    .gemm = m_gemm,
    .reduce = m_reduce,
    .sleep = m_sleep,
    .done = m_done,
    .last_error = m_last_error,
};
static ovld_backend_t mock = {.ops = &mock_ops};

/* How an op's buffers are laid out, and what the daemon prefers for the
 * gather (the plan params strided and allgather). */
typedef enum layout {
    L_DENSE,   /* ld == cols for A and G: NCCL methods across ranks */
    L_STRIDED, /* A and a_out with ld > k: gathered by pulls */
    L_COPY,    /* dense, but the daemon asks for the copy engine */
    L_NCCL,    /* dense, and NCCL even for one rank */
    L_COUNT,
} layout_t;

/* One op's setting: plans for every rank, the executor's input. */
typedef struct setup {
    struct ovld_rank ranks[MAXW];
    ovl_plan_t plans[MAXW];
    ovld_exec_rank_t xr[MAXW];
    ovld_exec_op_t op;
} setup_t;

/* A fake base address for buffer b of rank r: distinct for every (r, b),
 * far apart, and never dereferenced (the mock only compares them). */
static void *fake_base(uint32_t r, int b)
{
    return (void *)(uintptr_t)((UINT64_C(1) << 36) *
                               (uint64_t)(r * OVL_BUF_COUNT + (uint32_t)b + 1));
}

/* The leading dimension the setup gives buffer b of rank r: larger than
 * its columns (and different per rank and buffer) wherever the layout
 * allows, so that a view resolved with the wrong ld or base shows. */
static uint64_t fake_ld(const ovl_plan_t *p, uint32_t r, int b, layout_t layout)
{
    uint64_t cols = p->bufs[b].cols;
    bool gathered_side = b == OVL_BUF_A || (b == OVL_BUF_G && p->params.want_gathered);
    if (p->bufs[b].scratch || b == OVL_BUF_SA || b == OVL_BUF_SB || b == OVL_BUF_BIAS ||
        (b >= OVL_BUF_SB1 && b < OVL_BUF_COUNT))
        return cols; /* ovld's scratch is dense, and so are a scaled op's vectors */
    if (gathered_side && layout != L_STRIDED)
        return cols;
    return cols + 1 + r + 2 * (uint64_t)b;
}

/* The Bs of the op setup_make makes (1 but where a shape says more): B 0
 * of n 48, B 1 of 16, B 2 of 24, each B i and C i a buffer of its own. */
static uint32_t setup_nb = 1;

/* The topology of the op setup_make makes (NULL: one node). */
static const uint32_t *setup_topo = NULL;

/* The kind of the op setup_make makes (0: all-gather + GEMM), and for GEMM
 * + reduce-scatter whether it averages: m is then 16 rows a rank (a
 * multiple of the world), and setup_make's aout and layout are not read. */
static ovl_op_kind_t setup_kind = 0;
static bool setup_avg = false;

/* Whether the op setup_make makes is scaled (fp8 A x fp8 B into bf16, B
 * transposed, one B): 0 not, 1 by row with a bias (but with avg, which
 * ring refuses), 2 by tensor. */
static int setup_scaled = 0;

static void setup_make(setup_t *s, ovl_algo_t algo, uint32_t world, uint32_t chunks, bool aout,
                       layout_t layout, bool transb)
{
    memset(s, 0, sizeof(*s));
    for (uint32_t r = 0; r < world; r++) {
        bool rs = setup_kind == OVL_OP_GEMM_RS;
        ovl_plan_params_t p = {.kind = setup_kind,
                               .reduce_op = setup_avg ? OVL_REDUCE_AVG : OVL_REDUCE_SUM,
                               .algo = algo,
                               .world = world,
                               .rank = r,
                               .m = rs ? 16 * (uint64_t)world : 64,
                               .n = 48,
                               .k = 32,
                               .dtype = OVL_DTYPE_FP32,
                               .chunks = chunks,
                               .want_gathered = aout && !rs,
                               .transb = transb,
                               .strided = layout == L_STRIDED,
                               .allgather = layout == L_COPY   ? OVL_AG_COPY
                                            : layout == L_NCCL ? OVL_AG_NCCL
                                                               : OVL_AG_AUTO,
                               .nb = rs ? 1 : setup_nb,
                               .n_more = {16, 24},
                               .node_of = setup_topo};
        if (setup_scaled) {
            ovl_scale_mode_t mode = setup_scaled == 1 ? OVL_SCALE_ROW : OVL_SCALE_TENSOR;
            p.dtype = OVL_DTYPE_FP8_E4M3;
            p.transb = true;
            p.sc = (ovl_plan_scaling_t){.scaled = true,
                                        .b_dtype = OVL_DTYPE_FP8_E5M2,
                                        .out_dtype = OVL_DTYPE_BF16,
                                        .a_mode = mode,
                                        .b_mode = mode,
                                        .fast_accum = setup_scaled == 2,
                                        .bias = setup_scaled == 1 && !setup_avg};
        }
        assert_int_equal(ovl_plan_build(&p, &s->plans[r]), OVL_OK);
        s->ranks[r].id = (int)r;
        s->xr[r] =
            (ovld_exec_rank_t){.rank = &s->ranks[r], .plan = &s->plans[r], .cookie = &s->ranks[r]};
        /* a buffer the plan does not use is not there: it must not be named */
        for (int b = 0; b < OVL_BUF_COUNT; b++)
            if (s->plans[r].bufs[b].used)
                s->xr[r].buf[b] = (ovld_view_t){.ptr = fake_base(r, b),
                                                .ld = fake_ld(&s->plans[r], r, b, layout)};
    }
    s->op = (ovld_exec_op_t){.seq = 7, .world = world, .ranks = s->xr};
}

/* The view rank r's instruction names: what the mock must have been given. */
static ovld_view_t named_view(const setup_t *s, ovl_ref_t ref)
{
    assert_true(ref.rank < s->op.world);
    assert_true((unsigned)ref.buf < OVL_BUF_COUNT);
    ovld_view_t v = s->xr[ref.rank].buf[ref.buf];
    assert_non_null(v.ptr); /* the plan uses it, so the setup gave it */
    size_t elem = ovl_dtype_size(s->plans[ref.rank].bufs[ref.buf].dtype);
    return (ovld_view_t){.ptr = (char *)v.ptr + ref.row * v.ld * elem, .ld = v.ld};
}

static void assert_view(ovld_view_t got, ovld_view_t want, size_t call, const char *what)
{
    if (got.ptr != want.ptr || got.ld != want.ld)
        fail_msg("call %zu: %s is %p ld %llu, the plan names %p ld %llu", call, what, got.ptr,
                 (unsigned long long)got.ld, want.ptr, (unsigned long long)want.ld);
}

/* The views and geometry of a program call are exactly the instruction's. */
static void check_operands(const setup_t *s, uint32_t r, const ovl_instr_t *in, const entry_t *e,
                           size_t call)
{
    const ovl_plan_t *p = &s->plans[r];
    switch (e->call) {
    case C_COPY:
        /* a pull writes the own buffer, a push reads it */
        assert_int_equal(in->kind == OVL_I_PUSH ? in->src.rank : in->dst.rank, r);
        assert_view(e->dst, named_view(s, in->dst), call, "the copy's destination");
        assert_view(e->src, named_view(s, in->src), call, "the copy's source");
        assert_int_equal(e->rows, in->rows);
        assert_int_equal(e->cols, in->cols);
        assert_int_equal(e->elem, ovl_dtype_size(p->bufs[in->src.buf].dtype));
        break;
    case C_GEMM:
        assert_view(e->gemm.a, named_view(s, in->src), call, "the GEMM's A");
        assert_view(e->gemm.b, named_view(s, in->b), call, "the GEMM's B");
        assert_view(e->gemm.c, named_view(s, in->dst), call, "the GEMM's C");
        assert_int_equal(e->gemm.dtype, p->params.dtype);
        /* a scaled op's GEMM: its dtypes, modes, and the scales and bias
         * its names resolve to (B's and the bias whole, from row 0) */
        assert_int_equal(e->gemm.scaled, p->params.sc.scaled);
        if (p->params.sc.scaled) {
            /* B i's, i the GEMM's B */
            uint32_t bx = ovl_gemm_b(in);
            ovl_ref_t sb = {.buf = ovl_buf_sb(bx), .rank = r},
                      bias = {.buf = ovl_buf_bias(bx), .rank = r};
            assert_int_equal(e->gemm.b_dtype, p->params.sc.b_dtype);
            assert_int_equal(e->gemm.c_dtype, p->params.sc.out_dtype);
            assert_int_equal(e->gemm.a_mode, p->params.sc.a_mode);
            assert_int_equal(e->gemm.b_mode, p->params.sc.b_mode);
            assert_int_equal(e->gemm.fast_accum, p->params.sc.fast_accum);
            assert_ptr_equal(e->gemm.a_scale, named_view(s, in->sa).ptr);
            assert_ptr_equal(e->gemm.b_scale, named_view(s, sb).ptr);
            if (p->params.sc.bias)
                assert_ptr_equal(e->gemm.bias, named_view(s, bias).ptr);
            else
                assert_null(e->gemm.bias);
        }
        assert_int_equal(e->gemm.rows, in->rows);
        assert_int_equal(e->gemm.n, in->n);
        assert_int_equal(e->gemm.k, in->k);
        assert_int_equal(e->gemm.nblocks, in->nblocks);
        assert_int_equal(e->gemm.block_stride, in->stride);
        assert_int_equal(e->gemm.transb, in->transb);
        break;
    case C_REDUCE:
        assert_view(e->dst, named_view(s, in->dst), call, "the reduction's destination");
        assert_view(e->src, named_view(s, in->src), call, "the reduction's source");
        assert_int_equal(e->rows, in->rows);
        assert_int_equal(e->cols, in->cols);
        assert_int_equal(e->stride, in->stride);
        assert_int_equal(e->nblocks, in->nblocks);
        assert_int_equal(e->dtype, p->bufs[in->dst.buf].dtype);
        assert_int_equal(e->div, in->avg ? s->op.world : 1);
        break;
    default:
        break;
    }
}

static void setup_free(setup_t *s)
{
    for (uint32_t r = 0; r < s->op.world; r++)
        ovl_plan_free(&s->plans[r]);
}

static call_t call_of(ovl_instr_kind_t k)
{
    switch (k) {
    case OVL_I_WAIT_READY:
        return C_WAIT_READY;
    case OVL_I_RECORD:
        return C_RECORD;
    case OVL_I_WAIT:
        return C_WAIT;
    case OVL_I_ALLGATHER:
        return C_ALLGATHER;
    case OVL_I_PULL:
    case OVL_I_PUSH:
        return C_COPY;
    case OVL_I_GEMM:
        return C_GEMM;
    case OVL_I_SLEEP:
        return C_SLEEP;
    case OVL_I_DONE:
        return C_DONE;
    case OVL_I_RAIL:
        return C_RAIL;
    case OVL_I_REDUCE_SCATTER:
        return C_REDUCE_SCATTER;
    case OVL_I_REDUCE:
        return C_REDUCE;
    }
    fail_msg("unknown instruction kind %d", (int)k);
    return C_DONE;
}

/* An ALLGATHER call: one for every rank, each standing at its ALLGATHER,
 * by the method, with the geometry and the views its instruction names,
 * in dense rows (what NCCL can move). */
static void check_allgather(const setup_t *s, const size_t *pc, const entry_t *e, size_t call)
{
    uint32_t w = s->op.world;
    assert_int_equal(e->nparts, w); /* all ranks, in rank order */
    for (uint32_t r = 0; r < w; r++) {
        assert_true(pc[r] < s->plans[r].ninstr);
        const ovl_instr_t *in = &s->plans[r].instr[pc[r]];
        assert_int_equal(in->kind, OVL_I_ALLGATHER);
        assert_int_equal(in->method, e->method);
        assert_int_equal(in->rows, e->rows);
        assert_int_equal(in->cols, e->cols);
        assert_int_equal(in->stride, e->stride);
        assert_int_equal(e->elem, ovl_dtype_size(s->plans[r].bufs[in->src.buf].dtype));
        assert_int_equal(e->parts[r].stream, in->stream);
        assert_view(e->parts[r].src, named_view(s, in->src), call, "an all-gather's source");
        assert_view(e->parts[r].dst, named_view(s, in->dst), call, "an all-gather's destination");
        assert_int_equal(e->parts[r].src.ld, e->cols);
        assert_int_equal(e->parts[r].dst.ld, e->cols);
    }
}

/* A RAIL call: one for every rank, each standing at its RAIL, by the
 * method, with the geometry, the views and exactly the send and receive
 * lists (job ranks) its instruction names, in dense rows. */
static void check_rail(const setup_t *s, const size_t *pc, const entry_t *e, size_t call)
{
    uint32_t w = s->op.world;
    assert_int_equal(e->nparts, w); /* all ranks, in rank order */
    for (uint32_t r = 0; r < w; r++) {
        const ovl_plan_t *p = &s->plans[r];
        const rail_log_t *x = &e->rail[r];
        assert_true(pc[r] < p->ninstr);
        const ovl_instr_t *in = &p->instr[pc[r]];
        assert_int_equal(in->kind, OVL_I_RAIL);
        assert_int_equal(in->method, e->method);
        assert_int_equal(in->rows, e->rows);
        assert_int_equal(in->cols, e->cols);
        assert_int_equal(in->stride, e->stride);
        assert_int_equal(e->elem, ovl_dtype_size(p->bufs[in->src.buf].dtype));
        assert_int_equal(x->global, r);
        assert_int_equal(x->stream, in->stream);
        assert_view(x->src, named_view(s, in->src), call, "a rail's source");
        assert_view(x->dst, named_view(s, in->dst), call, "a rail's destination");
        assert_int_equal(x->src.ld, e->cols);
        assert_int_equal(x->dst.ld, e->cols);
        assert_int_equal(x->nsend, in->nsend);
        assert_int_equal(x->nrecv, in->nrecv);
        for (uint32_t k = 0; k < in->nsend; k++)
            assert_int_equal(x->send[k], p->peers[in->peers + k]);
        for (uint32_t k = 0; k < in->nrecv; k++)
            assert_int_equal(x->recv[k], p->peers[in->peers + in->nsend + k]);
    }
}

/*
 * Checks the whole log. failed: 1-based index of the call that failed, 0
 * if none. Each rank's streams get its plan's roles before any other call
 * of the rank (but the done of an op that failed before); no call names a
 * stream beyond them. Per rank, calls follow its program (a wait on a
 * peer's event after that peer's record), with the views and geometry the
 * instructions name; after the failure a rank's program may go on only
 * with threads (what was under way), then come the joins (a record of each
 * side stream of every rank, done or not; waits of a failing rank's stream
 * 0 on those records, its own and its peers', each after its record; on
 * events past the plans') and one done with the error. Each rank rings done once: OK as its
 * program's DONE in a good run or before the failure.
 */
static void check_log(const setup_t *s, size_t failed, bool threads)
{
    uint32_t w = s->op.world;
    size_t pc[MAXW] = {0};
    bool joining[MAXW] = {false};
    bool joinrec[MAXW * OVL_PLAN_MAX_STREAMS] = {false}; /* after a failure: joins recorded */
    /* waited[r][q * MAX_STREAMS + s]: rank r's stream 0 waited for rank q's
     * join of stream s */
    static bool waited[MAXW][MAXW * OVL_PLAN_MAX_STREAMS];
    memset(waited, 0, sizeof(waited));
    int dones[MAXW] = {0};
    uint32_t nstreams[MAXW] = {0}; /* set_streams' n; 0: not called yet */
    uint32_t maxev = 0;
    for (uint32_t r = 0; r < w; r++)
        maxev = s->plans[r].nevents > maxev ? s->plans[r].nevents : maxev;
    bool *rec = calloc((size_t)w * maxev, sizeof(*rec));
    assert_non_null(rec);
    for (size_t i = 0; i < M.n; i++) {
        const entry_t *e = &M.log[i];
        bool after = failed && i >= failed; /* past the failed call */
        if (e->call == C_ALLGATHER || e->call == C_RAIL) {
            if (after)
                assert_true(threads); /* a serial walk stops at the failure */
            for (uint32_t r = 0; r < w; r++) {
                assert_false(joining[r]);
                assert_true(nstreams[r] > 0);
            }
            if (e->call == C_RAIL)
                check_rail(s, pc, e, i);
            else
                check_allgather(s, pc, e, i);
            for (uint32_t r = 0; r < w; r++)
                pc[r]++;
            continue;
        }
        int r = e->rank;
        assert_true(r >= 0 && (uint32_t)r < w);
        /* nothing for a rank after its done, but, after a failure, the
         * records that join its side streams into the peers' failing done
         * (a PUSH of it writes their G) */
        if (!(after && e->call == C_RECORD && e->stream > 0 && e->event >= s->plans[r].nevents))
            assert_int_equal(dones[r], 0);
        const ovl_plan_t *p = &s->plans[r];
        if (e->call == C_STREAMS) {
            /* once, first, with exactly the plan's roles */
            assert_int_equal(nstreams[r], 0);
            assert_int_equal(pc[r], 0);
            assert_int_equal(e->nroles, p->nstreams);
            for (uint32_t st = 0; st < p->nstreams; st++)
                assert_int_equal(e->roles[st], p->roles[st]);
            nstreams[r] = e->nroles;
            continue;
        }
        if (e->call != C_DONE || e->status == OVL_OK)
            assert_true(e->stream < nstreams[r]); /* a stream the backend was told of */
        else
            assert_true(e->stream == 0 || e->stream < nstreams[r]);
        const ovl_instr_t *in = pc[r] < p->ninstr ? &p->instr[pc[r]] : NULL;
        bool program = !joining[r] && in && call_of(in->kind) == e->call &&
                       in->stream == e->stream &&
                       (e->call != C_RECORD && e->call != C_WAIT ? true : in->event == e->event) &&
                       (e->call != C_DONE || e->status == OVL_OK);
        if (failed && i > failed - 1 && program && !threads && e->call != C_DONE)
            program = false; /* a serial walk issues no more of a program */
        if (program) {
            if (e->call == C_WAIT_READY || e->call == C_DONE)
                assert_int_equal(e->seq, s->op.seq);
            if (e->call == C_RECORD)
                rec[(size_t)r * maxev + e->event] = true;
            if (e->call == C_WAIT) {
                assert_int_equal((int)in->peer, e->owner);
                if (!rec[(size_t)e->owner * maxev + e->event])
                    fail_msg("call %zu: rank %d waits on rank %d's event %u before it was "
                             "recorded",
                             i, r, e->owner, e->event);
            }
            if (e->call == C_DONE) {
                assert_int_equal(e->owner, r);
                /* a program's DONE: in a good run, or before the failure */
                assert_true(!failed || i < failed - 1);
                dones[r]++;
            }
            check_operands(s, (uint32_t)r, in, e, i);
            pc[r]++;
            continue;
        }
        /* not the program: only joins and the error's done, after a failure */
        if (!after)
            fail_msg("call %zu (%d of rank %d) is not rank %d's instruction %zu (%s)", i,
                     (int)e->call, r, r, pc[r], in ? ovl_instr_name(in->kind) : "none");
        joining[r] = true;
        if (e->call == C_DONE) {
            assert_int_equal(e->owner, r);
            assert_int_equal(e->status, M.fail_status);
            assert_int_equal(e->seq, s->op.seq);
            /* after every side stream of every rank recorded so far: a
             * peer's PUSH writes this rank's G */
            for (size_t k = 0; k < (size_t)w * OVL_PLAN_MAX_STREAMS; k++)
                if (joinrec[k] && !waited[r][k])
                    fail_msg("call %zu: rank %d's failing done does not wait for rank %zu's "
                             "stream %zu",
                             i, r, k / OVL_PLAN_MAX_STREAMS, k % OVL_PLAN_MAX_STREAMS);
            dones[r]++;
        } else if (e->call == C_RECORD) {
            assert_true(e->stream > 0 && e->event >= p->nevents);
            assert_true(e->event - p->nevents < OVL_PLAN_MAX_STREAMS);
            joinrec[(size_t)r * OVL_PLAN_MAX_STREAMS + (e->event - p->nevents)] = true;
        } else {
            /* stream 0 waits for a join of its own streams or of a peer's
             * (a peer's PUSH writes this rank's G), recorded before */
            assert_int_equal(e->call, C_WAIT);
            assert_int_equal(e->stream, 0);
            assert_true(e->owner >= 0 && (uint32_t)e->owner < w);
            const ovl_plan_t *po = &s->plans[e->owner];
            assert_true(e->event >= po->nevents && e->event - po->nevents < OVL_PLAN_MAX_STREAMS);
            size_t k = (size_t)e->owner * OVL_PLAN_MAX_STREAMS + (e->event - po->nevents);
            if (!joinrec[k])
                fail_msg("call %zu: rank %d waits on rank %d's join event %u before it was "
                         "recorded",
                         i, r, e->owner, e->event);
            waited[r][k] = true;
        }
    }
    for (uint32_t r = 0; r < w; r++) {
        assert_int_equal(dones[r], 1);
        if (!failed)
            assert_int_equal(pc[r], s->plans[r].ninstr); /* the whole program */
    }
    free(rec);
}

/* One op's shape in the runs below. */
typedef struct shape {
    ovl_algo_t algo;
    uint32_t world, chunks;
    bool aout;
    layout_t layout;
    bool transb;
    uint32_t nb;             /* 0: one B */
    const uint32_t *node_of; /* NULL: one node */
    ovl_op_kind_t kind;      /* 0: all-gather + GEMM; GEMM + reduce-scatter: aout is avg */
    int scaled;              /* setup_scaled's */
} shape_t;

/* One run; fail_at: 1-based call to fail (0: none). The log's length. */
static size_t run(const shape_t *sh, size_t fail_at, bool threads)
{
    setup_t s;
    setup_nb = sh->nb;
    setup_topo = sh->node_of;
    setup_kind = sh->kind;
    setup_avg = sh->kind == OVL_OP_GEMM_RS && sh->aout;
    setup_scaled = sh->scaled;
    setup_make(&s, sh->algo, sh->world, sh->chunks, sh->aout, sh->layout, sh->transb);
    setup_nb = 1;
    setup_topo = NULL;
    setup_kind = 0;
    setup_avg = false;
    setup_scaled = 0;
    mock_ops.issue_parallel = threads;
    M.n = 0;
    M.fail_at = fail_at;
    M.fail_status = OVL_ERR_BACKEND;
    char err[256] = "";
    ovl_status_t st = ovld_exec_run(g_pool, &mock, &s.op, NULL, err, sizeof(err));
    size_t failed = 0;
    if (fail_at && fail_at <= M.n && M.log[fail_at - 1].call != C_DONE)
        failed = fail_at; /* a DONE cannot fail: then the run is good */
    if (!failed) {
        if (st != OVL_OK)
            fail_msg("a good run returned %s: %s", ovl_strerror(st), err);
    } else {
        assert_int_equal(st, OVL_ERR_BACKEND);
        call_t c = M.log[failed - 1].call;
        assert_non_null(strstr(err, c == C_ALLGATHER ? "all-gather"
                                    : c == C_RAIL    ? "rail"
                                    : c == C_STREAMS ? "streams"
                                                     : "instruction"));
        /* the failing thread's own words */
        char want[64];
        snprintf(want, sizeof(want), "the mock was told to fail call %zu", failed);
        if (!strstr(err, want))
            fail_msg("\"%s\" does not contain \"%s\"", err, want);
    }
    check_log(&s, failed, threads);
    /* a good ring across nodes moves rows between them by RAILs */
    if (!failed && sh->node_of && sh->algo == OVL_ALGO_RING) {
        bool rail = false;
        for (size_t i = 0; i < M.n; i++)
            rail |= M.log[i].call == C_RAIL;
        assert_true(rail);
    }
    /* a good ring op of several ranks is issued by a thread per rank (in
     * one node: across nodes its RAILs keep it serial) */
    if (threads && !failed && sh->algo == OVL_ALGO_RING && sh->world > 1 && !sh->node_of) {
        bool off_caller = false;
        for (size_t i = 0; i < M.n; i++)
            off_caller |= M.log[i].rank > 0 && !pthread_equal(M.log[i].thread, pthread_self());
        assert_true(off_caller);
    }
    setup_free(&s);
    return M.n;
}

/* The topologies of jobs across nodes the runs use, by world (NULL ends
 * a world's list): two nodes of one rank; 1+2 and 2+1; 2+2, 1+3, and two
 * nodes not node-major (0 1 0 1); three nodes of 1+1+2. */
static const uint32_t topo2a[] = {0, 1}, topo3a[] = {0, 1, 1}, topo3b[] = {0, 0, 1},
                      topo4a[] = {0, 0, 1, 1}, topo4b[] = {0, 1, 1, 1}, topo4c[] = {0, 1, 0, 1},
                      topo4d[] = {0, 1, 2, 2};
static const uint32_t *const topos[MAXW + 1][5] = {
    [2] = {topo2a, NULL},
    [3] = {topo3a, topo3b, NULL},
    [4] = {topo4a, topo4b, topo4c, topo4d, NULL},
};

/* Whether layout l can be planned across nodes (only what NCCL moves). */
static bool layout_crosses(int l)
{
    return l == L_DENSE || l == L_NCCL;
}

/* GEMM + reduce-scatter's push (the plans of that kind without a
 * collective call, which the mock does not have): worlds 1 to MAXW,
 * chunks 0 to 3, sum and avg, B transposed or not; every call failing in
 * turn with fail_each. */
static void push_runs(bool threads, bool fail_each)
{
    /* across nodes (the rail scheme: nodes of equal size, RAILs between
     * them): 1 + 1, 2 + 2 node-major and round robin */
    static const uint32_t *const even[] = {topo2a, topo4a, topo4c};
    static const uint32_t even_w[] = {2, 4, 4};
    for (size_t t = 0; t < sizeof(even) / sizeof(even[0]); t++)
        for (int avg = 0; avg < 2; avg++) {
            shape_t sh = {.algo = OVL_ALGO_PUSH,
                          .world = even_w[t],
                          .aout = avg,
                          .transb = avg == 1,
                          .node_of = even[t],
                          .kind = OVL_OP_GEMM_RS};
            size_t n = run(&sh, 0, threads);
            for (size_t at = 1; fail_each && at <= n; at++)
                run(&sh, at, threads);
        }
    for (uint32_t w = 1; w <= MAXW; w++)
        for (uint32_t c = 0; c <= 3; c++)
            for (int avg = 0; avg < 2; avg++) {
                shape_t sh = {.algo = OVL_ALGO_PUSH,
                              .world = w,
                              .chunks = c,
                              .aout = avg,
                              .transb = (c + (uint32_t)avg) % 2 == 1,
                              .kind = OVL_OP_GEMM_RS};
                size_t n = run(&sh, 0, threads);
                for (size_t at = 1; fail_each && at <= n; at++)
                    run(&sh, at, threads);
            }
}

static void good_runs(bool threads)
{
    push_runs(threads, false);
    for (int a = OVL_ALGO_NAIVE; a < OVL_ALGO_COUNT; a++)
        for (uint32_t w = 1; a != OVL_ALGO_PUSH && w <= MAXW; w++)
            for (int t = -1; t < 0 || (w <= MAXW && topos[w][t]); t++)
                for (uint32_t c = 0; c <= 3; c++)
                    for (int aout = 0; aout < 2; aout++)
                        for (int l = 0; l < L_COUNT; l++) {
                            /* one B, or 2 or 3: every GEMM's B and C views
                             * are those its names resolve to */
                            shape_t sh = {(ovl_algo_t)a,
                                          w,
                                          c,
                                          aout,
                                          (layout_t)l,
                                          (c + l) % 2 == 1,
                                          (c + aout + l) % 3 + 1,
                                          t < 0 ? NULL : topos[w][t],
                                          OVL_OP_AG_GEMM,
                                          0};
                            if (t >= 0 && !layout_crosses(l))
                                continue;
                            run(&sh, 0, threads);
                        }
}

static void every_call_failing(bool threads)
{
    push_runs(threads, true);
    for (int a = OVL_ALGO_NAIVE; a < OVL_ALGO_COUNT; a++)
        for (uint32_t w = 1; a != OVL_ALGO_PUSH && w <= MAXW; w++)
            for (int t = -1; t < 0 || (w <= MAXW && topos[w][t]); t++)
                for (uint32_t c = 0; c <= 2; c++)
                    for (int l = 0; l < L_COUNT; l += L_STRIDED) {
                        /* dense (NCCL) and strided (pulls): the good run's
                         * length bounds the calls to fail; across nodes
                         * dense only, every rail call failing in turn */
                        shape_t sh = {(ovl_algo_t)a,
                                      w,
                                      c,
                                      false,
                                      (layout_t)l,
                                      false,
                                      c % 2 ? 2 : 1,
                                      t < 0 ? NULL : topos[w][t],
                                      OVL_OP_AG_GEMM,
                                      0};
                        if (t >= 0 && !layout_crosses(l))
                            continue;
                        size_t n = run(&sh, 0, threads);
                        for (size_t at = 1; at <= n; at++)
                            run(&sh, at, threads);
                    }
}

/* Scaled ops (fp8): every algorithm of both kinds that the mock runs
 * (all-gather + GEMM's, and GEMM + reduce-scatter's push), the scales by
 * row (gathered with the rows, a bias) and by tensor, worlds 1 to MAXW,
 * one node and across, every layout; each GEMM gets the scales and the
 * bias its names resolve to, each copy of scales their element size; a
 * few shapes with every call failing in turn. */
static void scaled_runs(bool threads)
{
    for (int sc = 1; sc <= 2; sc++) {
        for (uint32_t w = 1; w <= MAXW; w++)
            for (int avg = 0; avg < 2; avg++) {
                shape_t sh = {.algo = OVL_ALGO_PUSH,
                              .world = w,
                              .chunks = w % 3,
                              .aout = avg,
                              .transb = true,
                              .kind = OVL_OP_GEMM_RS,
                              .scaled = sc};
                run(&sh, 0, threads);
            }
        for (int a = OVL_ALGO_NAIVE; a <= OVL_ALGO_RING; a++)
            for (uint32_t w = 1; w <= MAXW; w++)
                for (int t = -1; t < 0 || (w <= MAXW && topos[w][t]); t++)
                    for (uint32_t c = 0; c <= 2; c++)
                        for (int l = 0; l < L_COUNT; l++) {
                            shape_t sh = {(ovl_algo_t)a,
                                          w,
                                          c,
                                          (c + (uint32_t)l) % 2 == 1,
                                          (layout_t)l,
                                          true,
                                          (c + (uint32_t)l) % 3 + 1,
                                          t < 0 ? NULL : topos[w][t],
                                          OVL_OP_AG_GEMM,
                                          sc};
                            if (t >= 0 && !layout_crosses(l))
                                continue;
                            size_t n = run(&sh, 0, threads);
                            for (size_t at = 1; w == 2 && c == 1 && t < 0 && at <= n; at++)
                                run(&sh, at, threads);
                        }
    }
}

static void test_scaled_runs(void **state)
{
    (void)state;
    scaled_runs(false);
    scaled_runs(true);
}

static void test_good_runs(void **state)
{
    (void)state;
    good_runs(false);
}

static void test_every_call_failing(void **state)
{
    (void)state;
    every_call_failing(false);
}

static void test_good_runs_threads(void **state)
{
    (void)state;
    for (int i = 0; i < 20; i++) /* orders vary from run to run */
        good_runs(true);
}

static void test_every_call_failing_threads(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        every_call_failing(true);
}

/* Two ranks whose programs each wait on the other's event before recording
 * their own: no order issues them. Rank r: WAIT_READY, WAIT ev 2 of the
 * peer, RECORD ev 2, DONE. bad: rank 1 records an event past the plan's. */
static void run_handmade(bool threads, bool bad)
{
    setup_t s;
    setup_make(&s, OVL_ALGO_RING, 2, 0, false, L_DENSE, false);
    for (uint32_t r = 0; r < 2; r++) {
        ovl_plan_t *p = &s.plans[r];
        p->nevents = 3;
        p->ninstr = 4;
        p->instr[0] = (ovl_instr_t){.kind = OVL_I_WAIT_READY};
        p->instr[1] = (ovl_instr_t){.kind = OVL_I_WAIT, .event = 2, .peer = 1 - r};
        p->instr[2] = (ovl_instr_t){.kind = OVL_I_RECORD, .event = bad && r == 1 ? 7 : 2};
        p->instr[3] = (ovl_instr_t){.kind = OVL_I_DONE};
        if (bad) /* then rank 0 does not wait: rank 1 reaches its record */
            p->instr[1] = (ovl_instr_t){.kind = OVL_I_SLEEP, .sleep_ns = 1};
    }
    mock_ops.issue_parallel = threads;
    M.n = 0;
    M.fail_at = 0;
    char err[256] = "";
    ovl_status_t st = ovld_exec_run(g_pool, &mock, &s.op, NULL, err, sizeof(err));
    if (st != OVL_ERR_INTERNAL || !strstr(err, bad ? "out of range" : "deadlock"))
        fail_msg("threads %d, bad %d: %s: %s", threads, bad, ovl_strerror(st), err);
    int dones[2] = {0};
    for (size_t i = 0; i < M.n; i++)
        if (M.log[i].call == C_DONE) {
            /* rank 0 of the bad pair may finish first in a serial walk */
            if (!(bad && M.log[i].rank == 0 && M.log[i].status == OVL_OK))
                assert_int_equal(M.log[i].status, OVL_ERR_INTERNAL);
            dones[M.log[i].rank]++;
        }
    assert_int_equal(dones[0], 1);
    assert_int_equal(dones[1], 1);
    setup_free(&s);
}

static void test_handmade_plans(void **state)
{
    (void)state;
    for (int i = 0; i < 200; i++) { /* the threads meet in varying orders */
        run_handmade(false, false);
        run_handmade(true, false);
        run_handmade(false, true);
        run_handmade(true, true);
    }
}

/* The log rang the done of each of the op's world ranks exactly once. */
static void assert_done_once(uint32_t world)
{
    int dones[MAXW] = {0};
    assert_true(world <= MAXW);
    for (size_t i = 0; i < M.n; i++)
        if (M.log[i].call == C_DONE)
            dones[M.log[i].rank]++;
    for (uint32_t r = 0; r < world; r++)
        if (dones[r] != 1)
            fail_msg("rank %u's done rang %d times", r, dones[r]);
}

/* A plan that names what the op does not have (a buffer, a peer's buffer
 * to write, a buffer or a stream that does not exist, a RAIL peer past the
 * world): the executor refuses
 * to issue it (OVL_ERR_INTERNAL, saying what), never hands the backend a
 * NULL view, a peer's buffer to write or an unknown stream, and rings
 * every rank's done once. */
static void run_bad_names(bool threads, int how)
{
    setup_t s;
    setup_topo = how == 5 ? topo2a : NULL; /* 5: a ring across two nodes */
    setup_make(&s, OVL_ALGO_RING, 2, 0, false, L_DENSE, false);
    setup_topo = NULL;
    size_t at = 0;
    while (how != 5 && s.plans[1].instr[at].kind != OVL_I_PULL)
        at++;
    const char *want = "which the op does not have";
    if (how == 0)
        s.xr[1].buf[OVL_BUF_G] = (ovld_view_t){NULL, 0}; /* G missing */
    else if (how == 1)
        s.plans[1].instr[at].dst.rank = 0; /* a pull into rank 0's G */
    else if (how == 2)
        s.plans[1].instr[at].src.buf = (ovl_buf_t)OVL_BUF_COUNT; /* no such buffer */
    else if (how == 3)
        s.plans[1].instr[at].stream = 9; /* a stream the plan does not have */
    if (how == 4) {
        /* a GEMM of a B the op (of one B) has not: no view, so refused */
        at = 0;
        while (s.plans[1].instr[at].kind != OVL_I_GEMM)
            at++;
        s.plans[1].instr[at].b.buf = ovl_buf_b(1);
        want = "names buffer B1 of rank 1, which the op does not have";
    }
    if (how == 1 || how == 2)
        want = "which it may not";
    if (how == 3)
        want = "stream 9 of 4";
    if (how == 5) {
        /* a RAIL that sends to a rank past the world */
        s.plans[1].peers[0] = 9;
        want = "(RAIL): names ranks it may not";
    }
    mock_ops.issue_parallel = threads;
    M.n = 0;
    M.fail_at = 0;
    char err[256] = "";
    ovl_status_t st = ovld_exec_run(g_pool, &mock, &s.op, NULL, err, sizeof(err));
    if (st != OVL_ERR_INTERNAL || !strstr(err, want) || !strstr(err, "rank 1"))
        fail_msg("threads %d, case %d: %s: %s", threads, how, ovl_strerror(st), err);
    for (size_t i = 0; i < M.n; i++) {
        /* nothing of rank 1 past its bad pull */
        if (M.log[i].call == C_RAIL ||
            (M.log[i].rank == 1 && M.log[i].call == (how == 4 ? C_GEMM : C_COPY)))
            fail_msg("threads %d, case %d: rank 1's bad pull reached the backend", threads, how);
    }
    assert_done_once(2);
    setup_free(&s);
}

static void test_bad_names(void **state)
{
    (void)state;
    for (int how = 0; how < 6; how++) {
        run_bad_names(false, how);
        run_bad_names(true, how);
    }
}

/* The words of a collective call the executor refuses: a backend without
 * the call (OVL_ERR_UNSUPPORTED), plans that disagree on its rows
 * (OVL_ERR_INTERNAL); nothing reaches the backend's collective and every
 * rank's done rings once. how: 0 an all-gather without the backend's, 1 a
 * rail without it, 2 and 3 an all-gather and a rail whose rank 1 has other
 * rows. */
static void run_coll_words(int how)
{
    bool rail = how % 2 == 1;
    setup_t s;
    setup_topo = rail ? topo2a : NULL; /* a ring across two nodes: RAILs */
    setup_make(&s, rail ? OVL_ALGO_RING : OVL_ALGO_NAIVE, 2, 0, false, L_NCCL, false);
    setup_topo = NULL;
    ovl_instr_kind_t kind = rail ? OVL_I_RAIL : OVL_I_ALLGATHER;
    size_t at = 0;
    while (s.plans[1].instr[at].kind != kind)
        at++;
    const char *method = ovl_ag_method_name(s.plans[1].instr[at].method);
    assert_non_null(method);
    char want[200];
    ovl_status_t want_st = OVL_ERR_INTERNAL;
    if (how == 0) {
        mock_ops.allgather = NULL;
        want_st = OVL_ERR_UNSUPPORTED;
        snprintf(want, sizeof(want), "all-gather (%s): the mock backend has no collective", method);
    } else if (how == 1) {
        mock_ops.rail = NULL;
        want_st = OVL_ERR_UNSUPPORTED;
        snprintf(want, sizeof(want), "rail (%s): the mock backend cannot move rows between nodes",
                 method);
    } else {
        s.plans[1].instr[at].rows++;
        snprintf(want, sizeof(want), "plans disagree on %s %zu of rank 1",
                 rail ? "rail" : "all-gather", at);
    }
    mock_ops.issue_parallel = false;
    M.n = 0;
    M.fail_at = 0;
    char err[256] = "";
    ovl_status_t st = ovld_exec_run(g_pool, &mock, &s.op, NULL, err, sizeof(err));
    mock_ops.allgather = m_allgather;
    mock_ops.rail = m_rail;
    if (st != want_st || strcmp(err, want) != 0)
        fail_msg("case %d: %s: \"%s\", not %s: \"%s\"", how, ovl_strerror(st), err,
                 ovl_strerror(want_st), want);
    for (size_t i = 0; i < M.n; i++)
        if (M.log[i].call == C_ALLGATHER || M.log[i].call == C_RAIL)
            fail_msg("case %d: the refused call reached the backend", how);
    assert_done_once(2);
    setup_free(&s);
}

static void test_coll_words(void **state)
{
    (void)state;
    for (int how = 0; how < 4; how++)
        run_coll_words(how);
}

/* ------------------------------------ a ring across nodes, for real */

#define HMAX 8 /* ranks of the host runs */

/* The completions of the host runs (the loop thread delivers them). */
typedef struct host_dones {
    uint32_t n;
    ovl_status_t st[HMAX];
    char msg[HMAX][200];
    uint64_t ns[HMAX]; /* the device times the backend reported (timed ops) */
} host_dones_t;

static void host_done_cb(void *arg, void *cookie, uint64_t seq, ovl_status_t status,
                         const char *message, uint64_t ns)
{
    host_dones_t *h = arg;
    h->ns[(uintptr_t)cookie - 1 < HMAX ? (uintptr_t)cookie - 1 : 0] = ns;
    uint32_t r = (uint32_t)((uintptr_t)cookie - 1);
    (void)seq;
    assert_true(r < HMAX);
    h->st[r] = status;
    snprintf(h->msg[r], sizeof(h->msg[r]), "%s", message ? message : "");
    h->n++;
}

/* Small integers, exact in fp32 products and sums: A_q of op seq, B i of
 * rank r. */
static float a_val(uint64_t seq, uint32_t q, uint64_t i, uint64_t l)
{
    return (float)((int)((seq * 5 + q * 3 + i * 2 + l) % 7) - 3);
}

static float b_val(uint32_t bi, uint32_t r, uint64_t l, uint64_t j)
{
    return (float)((int)((bi * 2 + r + l * 3 + j) % 5) - 2);
}

/*
 * One job of `world` ranks laid out as node_of, every rank served by one
 * host backend (the topology simulated inside one daemon): two ops in a
 * row, each checked against a reference GEMM on every rank (every C i,
 * and a_out where given). m 5 and chunks up to 3 make uneven chunks; B is
 * stored transposed where transb; nb Bs.
 */
static void host_job(ovl_algo_t algo, const uint32_t *node_of, uint32_t world, uint32_t chunks,
                     bool aout, bool transb, uint32_t nb)
{
    enum { M = 5, K = 4 };
    static const uint64_t ns[3] = {6, 3, 5};
    uv_loop_t loop;
    ovld_config_t cfg;
    ovld_backend_t *b = NULL;
    host_dones_t h = {0};
    char err[256] = "";
    ovld_rank_t *rk[HMAX];
    struct ovl_doorbell *db[HMAX];
    ovl_plan_t plans[HMAX];
    ovld_exec_rank_t xr[HMAX];
    float *a[HMAX], *g[HMAX], *bm[HMAX][3], *c[HMAX][3];

    assert_true(world <= HMAX && nb >= 1 && nb <= 3);
    assert_int_equal(uv_loop_init(&loop), 0);
    ovld_config_defaults(&cfg);
    cfg.host_devices = world;
    ovl_status_t st =
        ovld_backend_host_create(&loop, &cfg, host_done_cb, &h, NULL, &b, err, sizeof(err));
    if (st != OVL_OK)
        fail_msg("host backend: %s", err);
    for (uint32_t r = 0; r < world; r++) {
        ovld_doorbell_export_t dx = {.fd = -1};
        ovl_plan_params_t p = {.algo = algo,
                               .world = world,
                               .rank = r,
                               .m = M,
                               .n = ns[0],
                               .k = K,
                               .dtype = OVL_DTYPE_FP32,
                               .chunks = chunks,
                               .want_gathered = aout,
                               .transb = transb,
                               .nb = nb,
                               .n_more = {ns[1], ns[2]},
                               .node_of = node_of};
        assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        assert_int_equal(plans[r].nnodes > 1, node_of != NULL);
        st = b->ops->rank_create(b, r, &rk[r], &dx, err, sizeof(err));
        if (st != OVL_OK)
            fail_msg("rank %u: %s", r, err);
        /* the client's side of the doorbell: this test writes ready */
        db[r] = mmap(NULL, OVL_DOORBELL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, dx.fd,
                     (off_t)dx.offset);
        assert_true(db[r] != MAP_FAILED);
        close(dx.fd);
        a[r] = calloc(M * K, sizeof(float));
        assert_non_null(a[r]);
        xr[r] = (ovld_exec_rank_t){
            .rank = rk[r], .plan = &plans[r], .cookie = (void *)(uintptr_t)(r + 1)};
        xr[r].buf[OVL_BUF_A] = (ovld_view_t){a[r], K};
        for (uint32_t bi = 0; bi < nb; bi++) {
            bm[r][bi] = calloc(K * ns[bi], sizeof(float));
            c[r][bi] = calloc((size_t)world * M * ns[bi], sizeof(float));
            assert_non_null(bm[r][bi]);
            assert_non_null(c[r][bi]);
            for (uint64_t l = 0; l < K; l++)
                for (uint64_t j = 0; j < ns[bi]; j++)
                    bm[r][bi][transb ? j * K + l : l * ns[bi] + j] = b_val(bi, r, l, j);
            xr[r].buf[ovl_buf_b(bi)] = (ovld_view_t){bm[r][bi], transb ? K : ns[bi]};
            xr[r].buf[ovl_buf_c(bi)] = (ovld_view_t){c[r][bi], ns[bi]};
        }
        g[r] = NULL;
        if (aout) {
            g[r] = calloc((size_t)world * M * K, sizeof(float));
            assert_non_null(g[r]);
        } else if (plans[r].scratch_bytes) {
            void *ptr = NULL;
            st = b->ops->rank_scratch(b, rk[r], plans[r].scratch_bytes, &ptr, err, sizeof(err));
            if (st != OVL_OK)
                fail_msg("scratch: %s", err);
            g[r] = ptr;
        }
        if (g[r])
            xr[r].buf[OVL_BUF_G] = (ovld_view_t){g[r], K};
    }
    for (uint64_t seq = 1; seq <= 2; seq++) {
        ovld_exec_op_t op = {.seq = seq, .world = world, .ranks = xr};
        for (uint32_t r = 0; r < world; r++) {
            for (uint64_t i = 0; i < M; i++)
                for (uint64_t l = 0; l < K; l++)
                    a[r][i * K + l] = a_val(seq, r, i, l);
            for (uint32_t bi = 0; bi < nb; bi++)
                for (uint64_t x = 0; x < world * M * ns[bi]; x++)
                    c[r][bi][x] = NAN; /* a row no GEMM writes shows */
            __atomic_store_n(&db[r]->ready, seq, __ATOMIC_RELEASE);
        }
        h.n = 0;
        st = ovld_exec_run(NULL, b, &op, NULL, err, sizeof(err));
        if (st != OVL_OK)
            fail_msg("op %llu: %s: %s", (unsigned long long)seq, ovl_strerror(st), err);
        while (h.n < world)
            uv_run(&loop, UV_RUN_ONCE);
        for (uint32_t r = 0; r < world; r++) {
            if (h.st[r] != OVL_OK)
                fail_msg("op %llu, rank %u: %s: %s", (unsigned long long)seq, r,
                         ovl_strerror(h.st[r]), h.msg[r]);
            for (uint32_t bi = 0; bi < nb; bi++)
                for (uint32_t q = 0; q < world; q++)
                    for (uint64_t i = 0; i < M; i++)
                        for (uint64_t j = 0; j < ns[bi]; j++) {
                            float want = 0;
                            for (uint64_t l = 0; l < K; l++)
                                want += a_val(seq, q, i, l) * b_val(bi, r, l, j);
                            float got = c[r][bi][(q * M + i) * ns[bi] + j];
                            if (got != want)
                                fail_msg("%s op %llu: rank %u's C%u[%llu][%llu] (shard %u) is %g, "
                                         "not %g",
                                         ovl_algo_name(algo), (unsigned long long)seq, r, bi,
                                         (unsigned long long)(q * M + i), (unsigned long long)j, q,
                                         got, want);
                        }
            for (uint32_t q = 0; aout && q < world; q++)
                for (uint64_t i = 0; i < M; i++)
                    for (uint64_t l = 0; l < K; l++)
                        if (g[r][(q * M + i) * K + l] != a_val(seq, q, i, l))
                            fail_msg("op %llu: rank %u's a_out row %llu is not shard %u's",
                                     (unsigned long long)seq, r, (unsigned long long)(q * M + i),
                                     q);
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        b->ops->rank_destroy(b, rk[r]);
        munmap(db[r], OVL_DOORBELL_SIZE);
        ovl_plan_free(&plans[r]);
        free(a[r]);
        if (aout)
            free(g[r]);
        for (uint32_t bi = 0; bi < nb; bi++) {
            free(bm[r][bi]);
            free(c[r][bi]);
        }
    }
    b->ops->destroy(b);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/*
 * GEMM + reduce-scatter through the executor on the real host backend:
 * world ranks, each with its A (WM x K, WM = world * M) and B (of its own
 * values), two ops in a row; each rank's C (M x N) checked exactly against
 * the sum (or, for avg, the average: sums of small integers over a power of
 * two worlds stay exact) of every rank's product of its block's rows.
 */
/* The topology of the job host_rs_job runs (NULL: one node); every rank
 * served here, its RAILs between local ranks. */
static const uint32_t *rs_topo = NULL;

static void host_rs_job(ovl_algo_t algo, uint32_t world, uint32_t chunks, bool transb, bool avg)
{
    enum { M = 5, K = 4, N = 6 };
    uv_loop_t loop;
    ovld_config_t cfg;
    ovld_backend_t *b = NULL;
    host_dones_t h = {0};
    char err[256] = "";
    ovld_rank_t *rk[HMAX];
    struct ovl_doorbell *db[HMAX];
    ovl_plan_t plans[HMAX];
    ovld_exec_rank_t xr[HMAX];
    float *a[HMAX], *bm[HMAX], *c[HMAX];
    uint64_t wm = (uint64_t)world * M;

    assert_true(world <= HMAX);
    assert_int_equal(uv_loop_init(&loop), 0);
    ovld_config_defaults(&cfg);
    cfg.host_devices = world;
    ovl_status_t st =
        ovld_backend_host_create(&loop, &cfg, host_done_cb, &h, NULL, &b, err, sizeof(err));
    if (st != OVL_OK)
        fail_msg("host backend: %s", err);
    for (uint32_t r = 0; r < world; r++) {
        ovld_doorbell_export_t dx = {.fd = -1};
        ovl_plan_params_t p = {.kind = OVL_OP_GEMM_RS,
                               .reduce_op = avg ? OVL_REDUCE_AVG : OVL_REDUCE_SUM,
                               .algo = algo,
                               .world = world,
                               .rank = r,
                               .m = wm,
                               .n = N,
                               .k = K,
                               .dtype = OVL_DTYPE_FP32,
                               .chunks = chunks,
                               .streams = 2,
                               .transb = transb,
                               .node_of = rs_topo};
        assert_int_equal(ovl_plan_build(&p, &plans[r]), OVL_OK);
        st = b->ops->rank_create(b, r, &rk[r], &dx, err, sizeof(err));
        if (st != OVL_OK)
            fail_msg("rank %u: %s", r, err);
        db[r] = mmap(NULL, OVL_DOORBELL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, dx.fd,
                     (off_t)dx.offset);
        assert_true(db[r] != MAP_FAILED);
        close(dx.fd);
        a[r] = calloc(wm * K, sizeof(float));
        bm[r] = calloc(K * N, sizeof(float));
        c[r] = calloc(M * N, sizeof(float));
        assert_true(a[r] && bm[r] && c[r]);
        for (uint64_t l = 0; l < K; l++)
            for (uint64_t j = 0; j < N; j++)
                bm[r][transb ? j * K + l : l * N + j] = b_val(0, r, l, j);
        xr[r] = (ovld_exec_rank_t){
            .rank = rk[r], .plan = &plans[r], .cookie = (void *)(uintptr_t)(r + 1)};
        xr[r].buf[OVL_BUF_A] = (ovld_view_t){a[r], K};
        xr[r].buf[OVL_BUF_B] = (ovld_view_t){bm[r], transb ? K : N};
        xr[r].buf[OVL_BUF_C] = (ovld_view_t){c[r], N};
        void *ptr = NULL;
        assert_int_equal(plans[r].scratch_buf, OVL_BUF_P);
        st = b->ops->rank_scratch(b, rk[r], plans[r].scratch_bytes, &ptr, err, sizeof(err));
        if (st != OVL_OK)
            fail_msg("scratch: %s", err);
        xr[r].buf[OVL_BUF_P] = (ovld_view_t){ptr, N};
    }
    for (uint64_t seq = 1; seq <= 2; seq++) {
        ovld_exec_op_t op = {.seq = seq, .world = world, .ranks = xr};
        for (uint32_t r = 0; r < world; r++) {
            for (uint64_t i = 0; i < wm; i++)
                for (uint64_t l = 0; l < K; l++)
                    a[r][i * K + l] = a_val(seq, r, i, l);
            for (uint64_t x = 0; x < M * N; x++)
                c[r][x] = NAN; /* a row no reduction writes shows */
            __atomic_store_n(&db[r]->ready, seq, __ATOMIC_RELEASE);
        }
        h.n = 0;
        st = ovld_exec_run(NULL, b, &op, NULL, err, sizeof(err));
        if (st != OVL_OK)
            fail_msg("op %llu: %s: %s", (unsigned long long)seq, ovl_strerror(st), err);
        while (h.n < world)
            uv_run(&loop, UV_RUN_ONCE);
        for (uint32_t r = 0; r < world; r++) {
            if (h.st[r] != OVL_OK)
                fail_msg("op %llu, rank %u: %s: %s", (unsigned long long)seq, r,
                         ovl_strerror(h.st[r]), h.msg[r]);
            for (uint64_t i = 0; i < M; i++)
                for (uint64_t j = 0; j < N; j++) {
                    float want = 0;
                    for (uint32_t q = 0; q < world; q++)
                        for (uint64_t l = 0; l < K; l++)
                            want += a_val(seq, q, r * M + i, l) * b_val(0, q, l, j);
                    if (avg)
                        want /= (float)world;
                    float got = c[r][i * N + j];
                    if (got != want)
                        fail_msg("gemm_rs %s op %llu world %u: rank %u's C[%llu][%llu] is %g, "
                                 "not %g",
                                 ovl_algo_name(algo), (unsigned long long)seq, world, r,
                                 (unsigned long long)i, (unsigned long long)j, got, want);
                }
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        b->ops->rank_destroy(b, rk[r]);
        munmap(db[r], OVL_DOORBELL_SIZE);
        ovl_plan_free(&plans[r]);
        free(a[r]);
        free(bm[r]);
        free(c[r]);
    }
    b->ops->destroy(b);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* Every world to 8: naive, collective with chunks 1 to 3 (uneven chunks of
 * 5 rows), push and ring with chunks 0 to 3; transb, sum and avg (avg at
 * worlds 1, 2, 4 and 8, where the average of integers is exact); and jobs
 * across nodes (naive, collective, push by the rail scheme). */
static void test_host_reduce_scatter(void **state)
{
    (void)state;
    for (uint32_t world = 1; world <= HMAX; world++) {
        bool pow2 = (world & (world - 1)) == 0;
        host_rs_job(OVL_ALGO_NAIVE, world, 0, false, false);
        for (uint32_t chunks = 1; chunks <= 3; chunks++)
            host_rs_job(OVL_ALGO_COLLECTIVE, world, chunks, chunks == 2, pow2 && chunks == 3);
        /* push: its own pushes into the peers' P and its own reduction */
        for (uint32_t chunks = 0; chunks <= 3; chunks++)
            host_rs_job(OVL_ALGO_PUSH, world, chunks, chunks % 2 == 1, pow2 && chunks >= 2);
        /* ring: each step's sum pushed on, the last GEMM into C (avg: each
         * product scaled by 1/W, exact at powers of two) */
        for (uint32_t chunks = 0; chunks <= 3; chunks++)
            host_rs_job(OVL_ALGO_RING, world, chunks, chunks % 2 == 0, pow2 && chunks >= 2);
    }
    /* across nodes (every rank served here): naive and collective, and push
     * by the rail scheme (node partials over RAILs between local ranks) */
    static const uint32_t t22[] = {0, 0, 1, 1}, trr[] = {0, 1, 0, 1},
                          t24[] = {0, 0, 0, 0, 1, 1, 1, 1}, t3[] = {0, 1, 2, 0, 1, 2};
    static const struct {
        const uint32_t *node_of;
        uint32_t world;
    } jobs[] = {{t22, 4}, {trr, 4}, {t24, 8}, {t3, 6}};
    for (size_t t = 0; t < sizeof(jobs) / sizeof(jobs[0]); t++) {
        rs_topo = jobs[t].node_of;
        host_rs_job(OVL_ALGO_NAIVE, jobs[t].world, 0, false, false);
        host_rs_job(OVL_ALGO_COLLECTIVE, jobs[t].world, 2, true, false);
        host_rs_job(OVL_ALGO_PUSH, jobs[t].world, 0, t % 2 == 1, jobs[t].world % 4 == 0);
        rs_topo = NULL;
    }
}

/* A ring across nodes on the real host backend (its rail standing in for
 * NCCL's send/recv between nodes): 2 x 2, the uneven 1+2+3, 3 nodes not
 * node-major, 2 nodes of one rank; chunks 1 to 3, with and without a_out,
 * one B and three; and collective across nodes (NCCL's all-gather, the
 * host's) for comparison. Every C row against the reference. */
static void test_host_rail_ring(void **state)
{
    static const uint32_t t22[] = {0, 0, 1, 1}, t123[] = {0, 1, 1, 2, 2, 2},
                          tmix[] = {2, 0, 1, 0, 2}, t11[] = {1, 0};
    static const struct {
        const uint32_t *node_of;
        uint32_t world;
    } jobs[] = {{t22, 4}, {t123, 6}, {tmix, 5}, {t11, 2}};

    (void)state;
    for (size_t t = 0; t < sizeof(jobs) / sizeof(jobs[0]); t++)
        for (uint32_t chunks = 1; chunks <= 3; chunks++)
            for (int aout = 0; aout <= 1; aout++)
                host_job(OVL_ALGO_RING, jobs[t].node_of, jobs[t].world, chunks, aout,
                         (chunks + (uint32_t)aout) % 2 == 1, aout ? 3 : 1);
    host_job(OVL_ALGO_COLLECTIVE, t123, 6, 2, true, false, 1);
    host_job(OVL_ALGO_NAIVE, t22, 4, 0, false, true, 3);
    /* and the ring inside one node, the same way, as the reference point */
    host_job(OVL_ALGO_RING, NULL, 4, 2, true, false, 1);
}

/* The issuing threads, as ovld's context owns them: made once, joined at
 * the end (a thread left behind would show under ASan's leak check). */
static int pool_setup(void **state)
{
    (void)state;
    return ovld_exec_pool_create(NULL, &g_pool) == OVL_OK ? 0 : -1;
}

static int pool_teardown(void **state)
{
    (void)state;
    ovld_exec_pool_destroy(g_pool);
    g_pool = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_runs),
        cmocka_unit_test(test_scaled_runs),
        cmocka_unit_test(test_every_call_failing),
        cmocka_unit_test(test_good_runs_threads),
        cmocka_unit_test(test_every_call_failing_threads),
        cmocka_unit_test(test_handmade_plans),
        cmocka_unit_test(test_bad_names),
        cmocka_unit_test(test_host_rail_ring),
        cmocka_unit_test(test_coll_words),
        cmocka_unit_test(test_host_reduce_scatter),
    };
    return cmocka_run_group_tests_name("exec", tests, pool_setup, pool_teardown);
}

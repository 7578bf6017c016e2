/*
 * test_exec.c: unit test of the executor (daemon/exec.c) against a backend
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
 *  - each ALLGATHER is one call for every rank, with the rows the plans name;
 *  - every rank's calls other than ALLGATHER follow its program in order.
 * Then each call in turn is made to fail: the executor must return that
 * status with a message naming the failed instruction (or the all-gather),
 * ring every rank's done exactly once (OK for ranks already done, the error
 * for the others), and issue nothing after the failure but the joins and
 * the doorbells of the ranks not yet done.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "plan.h"

#define MAXW   4
#define MAXLOG 4096

typedef enum {
    C_WAIT_READY,
    C_RECORD,
    C_WAIT,
    C_ALLGATHER,
    C_COPY,
    C_GEMM,
    C_SLEEP,
    C_DONE
} call_t;

typedef struct entry {
    call_t call;
    int rank;  /* -1 for ALLGATHER */
    int owner; /* WAIT: the event's rank */
    uint32_t stream, event;
    uint64_t seq, row0, rows;
    uint32_t nparts;
    ovl_status_t status; /* DONE */
} entry_t;

struct ovld_rank {
    int id;
};

static struct {
    entry_t log[MAXLOG];
    size_t n;
    size_t fail_at; /* 1-based index of the call to fail; 0: none */
    ovl_status_t fail_status;
} M;

/* Logs a call; its status (the injected failure, or OVL_OK). DONE never
 * fails (backends must ring). */
static ovl_status_t logc(entry_t e)
{
    assert_true(M.n < MAXLOG);
    M.log[M.n++] = e;
    if (e.call != C_DONE && M.fail_at == M.n)
        return M.fail_status;
    return OVL_OK;
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

static ovl_status_t m_allgather(ovld_backend_t *b, const ovld_allgather_part_t *parts,
                                uint32_t nparts, ovl_dtype_t dtype, uint64_t m, uint64_t k,
                                uint64_t row0, uint64_t rows)
{
    (void)b;
    (void)dtype;
    (void)m;
    (void)k;
    for (uint32_t i = 0; i < nparts; i++)
        assert_int_equal(parts[i].rank->id, (int)i); /* in rank order */
    return logc(
        (entry_t){.call = C_ALLGATHER, .rank = -1, .row0 = row0, .rows = rows, .nparts = nparts});
}

static ovl_status_t m_copy(ovld_rank_t *r, uint32_t s, ovld_view_t dst, ovld_view_t src,
                           uint64_t rows, uint64_t cols, size_t elem)
{
    (void)dst;
    (void)src;
    (void)cols;
    (void)elem;
    return logc((entry_t){.call = C_COPY, .rank = r->id, .stream = s, .rows = rows});
}

static ovl_status_t m_gemm(ovld_rank_t *r, uint32_t s, const ovld_gemm_args_t *g)
{
    return logc((entry_t){.call = C_GEMM, .rank = r->id, .stream = s, .rows = g->rows});
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
    assert_ptr_equal(cookie, r); /* the rank's own cookie comes back */
    logc((entry_t){.call = C_DONE, .rank = r->id, .stream = s, .seq = seq, .status = status});
}

static const char *m_last_error(ovld_backend_t *b)
{
    (void)b;
    return "the mock was told to fail";
}

static const ovld_backend_ops_t mock_ops = {
    .name = "mock",
    .wait_ready = m_wait_ready,
    .record = m_record,
    .wait = m_wait,
    .allgather = m_allgather,
    .copy = m_copy,
    .gemm = m_gemm,
    .sleep = m_sleep,
    .done = m_done,
    .last_error = m_last_error,
};
static ovld_backend_t mock = {.ops = &mock_ops};

/* One op's setting: plans for every rank, the executor's input. */
typedef struct setup {
    struct ovld_rank ranks[MAXW];
    ovl_plan_t plans[MAXW];
    ovld_exec_rank_t xr[MAXW];
    ovld_exec_op_t op;
    float mem[64]; /* views point here; nothing is read */
} setup_t;

static void setup_make(setup_t *s, ovl_algo_t algo, uint32_t world, uint32_t chunks, bool aout)
{
    memset(s, 0, sizeof(*s));
    for (uint32_t r = 0; r < world; r++) {
        ovl_plan_params_t p = {.algo = algo,
                               .world = world,
                               .rank = r,
                               .m = 64,
                               .n = 48,
                               .k = 32,
                               .dtype = OVL_DTYPE_FP32,
                               .chunks = chunks,
                               .want_gathered = aout};
        assert_int_equal(ovl_plan_build(&p, &s->plans[r]), OVL_OK);
        s->ranks[r].id = (int)r;
        ovld_view_t v = {.ptr = s->mem, .ld = 1};
        s->xr[r] = (ovld_exec_rank_t){.rank = &s->ranks[r],
                                      .plan = &s->plans[r],
                                      .a = v,
                                      .b = v,
                                      .c = v,
                                      .g = v,
                                      .cookie = &s->ranks[r]};
    }
    s->op = (ovld_exec_op_t){.seq = 7,
                             .m = 64,
                             .n = 48,
                             .k = 32,
                             .dtype = OVL_DTYPE_FP32,
                             .world = world,
                             .ranks = s->xr};
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
        return C_COPY;
    case OVL_I_GEMM:
        return C_GEMM;
    case OVL_I_SLEEP:
        return C_SLEEP;
    case OVL_I_DONE:
        return C_DONE;
    }
    fail_msg("unknown instruction kind %d", (int)k);
    return C_DONE;
}

/* Checks the log of a run that failed nowhere (or, with upto < M.n, its
 * first upto calls): per rank the program in order, cross-rank order. */
static void check_order(const setup_t *s, size_t upto, size_t *ret_pc)
{
    uint32_t w = s->op.world;
    size_t pc[MAXW] = {0};
    uint32_t maxev = 0;
    for (uint32_t r = 0; r < w; r++)
        maxev = s->plans[r].nevents > maxev ? s->plans[r].nevents : maxev;
    bool *rec = calloc((size_t)w * maxev, sizeof(*rec));
    assert_non_null(rec);
    for (size_t i = 0; i < upto; i++) {
        const entry_t *e = &M.log[i];
        if (e->call == C_ALLGATHER) {
            /* every rank stands at an ALLGATHER of these rows */
            assert_int_equal(e->nparts, w);
            for (uint32_t r = 0; r < w; r++) {
                assert_true(pc[r] < s->plans[r].ninstr);
                const ovl_instr_t *in = &s->plans[r].instr[pc[r]];
                assert_int_equal(in->kind, OVL_I_ALLGATHER);
                assert_int_equal(in->row0, e->row0);
                assert_int_equal(in->rows, e->rows);
                pc[r]++;
            }
            continue;
        }
        int r = e->rank;
        assert_true(r >= 0 && (uint32_t)r < w);
        assert_true(pc[r] < s->plans[r].ninstr);
        const ovl_instr_t *in = &s->plans[r].instr[pc[r]];
        if (call_of(in->kind) != e->call)
            fail_msg("call %zu: rank %d's instruction %zu is %s, the executor called %d", i, r,
                     pc[r], ovl_instr_name(in->kind), (int)e->call);
        assert_int_equal(in->stream, e->stream);
        switch (e->call) {
        case C_WAIT_READY:
        case C_DONE:
            assert_int_equal(e->seq, s->op.seq);
            break;
        case C_RECORD:
            assert_int_equal(in->event, e->event);
            rec[(size_t)r * maxev + e->event] = true;
            break;
        case C_WAIT:
            assert_int_equal(in->event, e->event);
            assert_int_equal((int)in->peer, e->owner);
            if (!rec[(size_t)e->owner * maxev + e->event])
                fail_msg("call %zu: rank %d waits on rank %d's event %u before it was recorded", i,
                         r, e->owner, e->event);
            break;
        default:
            break;
        }
        pc[r]++;
    }
    free(rec);
    if (ret_pc)
        memcpy(ret_pc, pc, sizeof(pc));
}

static void run_ok(ovl_algo_t algo, uint32_t world, uint32_t chunks, bool aout)
{
    setup_t s;
    setup_make(&s, algo, world, chunks, aout);
    M.n = 0;
    M.fail_at = 0;
    char err[256] = "";
    assert_int_equal(ovld_exec_run(&mock, &s.op, err, sizeof(err)), OVL_OK);
    size_t pc[MAXW];
    check_order(&s, M.n, pc);
    for (uint32_t r = 0; r < world; r++) {
        assert_int_equal(pc[r], s.plans[r].ninstr); /* the whole program */
        int dones = 0;
        for (size_t i = 0; i < M.n; i++)
            if (M.log[i].call == C_DONE && M.log[i].rank == (int)r) {
                dones++;
                assert_int_equal(M.log[i].status, OVL_OK);
            }
        assert_int_equal(dones, 1);
    }
    setup_free(&s);
}

/* Fails call number at (1-based) of a run whose good log has n calls. */
static void run_fail(ovl_algo_t algo, uint32_t world, uint32_t chunks, bool aout, size_t at)
{
    setup_t s;
    setup_make(&s, algo, world, chunks, aout);
    M.n = 0;
    M.fail_at = at;
    M.fail_status = OVL_ERR_BACKEND;
    char err[256] = "";
    ovl_status_t st = ovld_exec_run(&mock, &s.op, err, sizeof(err));
    const entry_t failed = M.log[at - 1];
    if (failed.call == C_DONE) { /* DONE cannot fail: the run is good */
        assert_int_equal(st, OVL_OK);
        setup_free(&s);
        return;
    }
    assert_int_equal(st, OVL_ERR_BACKEND);
    assert_non_null(strstr(err, failed.call == C_ALLGATHER ? "all-gather" : "instruction"));
    assert_non_null(strstr(err, "the mock was told to fail"));
    /* Up to the failure, a good order; what was issued by then per rank. */
    size_t pc[MAXW];
    check_order(&s, at - 1, pc);
    /* After it: per rank not done, joins (RECORD on a side stream, WAIT on
     * stream 0 for its own event) and one DONE with the error. */
    int dones[MAXW] = {0};
    ovl_status_t done_st[MAXW];
    for (size_t i = 0; i < at - 1; i++)
        if (M.log[i].call == C_DONE) {
            dones[M.log[i].rank]++;
            done_st[M.log[i].rank] = M.log[i].status;
        }
    for (size_t i = at; i < M.n; i++) {
        const entry_t *e = &M.log[i];
        assert_true(e->rank >= 0 && (uint32_t)e->rank < world);
        assert_int_equal(dones[e->rank], 0); /* nothing for a rank already done */
        if (e->call == C_DONE) {
            dones[e->rank]++;
            done_st[e->rank] = e->status;
        } else if (e->call == C_RECORD) {
            assert_true(e->stream > 0 && e->event >= s.plans[e->rank].nevents);
        } else {
            assert_int_equal(e->call, C_WAIT);
            assert_int_equal(e->stream, 0);
            assert_int_equal(e->owner, e->rank);
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        assert_int_equal(dones[r], 1);
        bool finished = pc[r] == s.plans[r].ninstr;
        assert_int_equal(done_st[r], finished ? OVL_OK : OVL_ERR_BACKEND);
    }
    setup_free(&s);
}

static const ovl_algo_t algos[] = {OVL_ALGO_NAIVE, OVL_ALGO_COLLECTIVE, OVL_ALGO_RING};

static void test_good_runs(void **state)
{
    (void)state;
    for (size_t a = 0; a < 3; a++)
        for (uint32_t w = 1; w <= MAXW; w++)
            for (uint32_t c = 0; c <= 3; c++)
                for (int aout = 0; aout < 2; aout++)
                    run_ok(algos[a], w, c, aout);
}

static void test_every_call_failing(void **state)
{
    (void)state;
    for (size_t a = 0; a < 3; a++)
        for (uint32_t w = 1; w <= MAXW; w++)
            for (uint32_t c = 0; c <= 2; c++) {
                /* the good run's length bounds the calls to fail */
                run_ok(algos[a], w, c, false);
                size_t n = M.n;
                for (size_t at = 1; at <= n; at++)
                    run_fail(algos[a], w, c, false, at);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_runs),
        cmocka_unit_test(test_every_call_failing),
    };
    return cmocka_run_group_tests_name("exec", tests, NULL, NULL);
}

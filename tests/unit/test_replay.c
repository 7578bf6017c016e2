/*
 * test_replay.c: unit test of replay (daemon/issue/replay.c, and the executor's
 * use of it in daemon/issue/exec.c) against a backend that records what it is
 * asked, marks what it was asked while capturing, and can be told to fail
 * a capture, a call inside one, or a launch.
 *
 * What must hold (exec.h, replay.h):
 *  - an op is issued call by call the first time its key is seen, captured
 *    (and run) the second, replayed from then on: a replayed op is one
 *    graph_run (every rank's WAIT_READY, one launch, every rank's DONE)
 *    and nothing else; a captured op's body calls are exactly the eager
 *    op's, all of them inside the capture, before the run;
 *  - a different view or shape is another key; a change of the memory
 *    generation drops every key (and frees their graphs);
 *  - a capture that fails (at its end, or a call inside it) leaves nothing
 *    captured: the body is issued again call by call, the op succeeds, the
 *    failure is reported, and the key stays call by call;
 *  - a launch that fails rings every rank's done once, with the error;
 *  - plans with an ALLGATHER (NCCL) never replay, nor ops of a job without
 *    a cache or on a backend that cannot capture;
 *  - the cache keeps at most its capacity, the least recently used out
 *    first, its graph freed.
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
#include "replay.h"

#define MAXW   2
#define MAXLOG 512

typedef enum {
    C_WAIT_READY,
    C_RECORD,
    C_WAIT,
    C_COPY,
    C_GEMM,
    C_SLEEP,
    C_DONE,
    C_ALLGATHER,
    C_CAPTURE,
    C_END,
    C_LAUNCH,
} call_t;

typedef struct entry {
    call_t call;
    int rank;
    bool captured; /* made between graph_capture and graph_end */
    uint64_t seq;
    ovl_status_t status; /* DONE */
    uint32_t n;          /* CAPTURE, END, LAUNCH: ranks */
} entry_t;

struct ovld_rank {
    int id;
};

struct ovld_graph {
    int id;
};

static struct {
    entry_t log[MAXLOG];
    size_t n;
    bool capturing;
    int graphs_made, graphs_freed;
    bool fail_end, fail_launch, fail_captured_gemm;
} M;

static ovl_status_t logc(entry_t e)
{
    assert_true(M.n < MAXLOG);
    e.captured = M.capturing && e.call != C_CAPTURE && e.call != C_END && e.call != C_LAUNCH;
    M.log[M.n++] = e;
    return OVL_OK;
}

static ovl_status_t m_wait_ready(ovld_rank_t *r, uint32_t s, uint64_t seq)
{
    (void)s;
    return logc((entry_t){.call = C_WAIT_READY, .rank = r->id, .seq = seq});
}
static ovl_status_t m_record(ovld_rank_t *r, uint32_t s, uint32_t ev)
{
    (void)s;
    (void)ev;
    return logc((entry_t){.call = C_RECORD, .rank = r->id});
}
static ovl_status_t m_wait(ovld_rank_t *r, uint32_t s, ovld_rank_t *owner, uint32_t ev)
{
    (void)s;
    (void)owner;
    (void)ev;
    return logc((entry_t){.call = C_WAIT, .rank = r->id});
}
static ovl_status_t m_copy(ovld_rank_t *r, uint32_t s, ovld_view_t dst, ovld_view_t src,
                           uint64_t rows, uint64_t cols, size_t elem)
{
    (void)s, (void)dst, (void)src, (void)rows, (void)cols, (void)elem;
    return logc((entry_t){.call = C_COPY, .rank = r->id});
}
static ovl_status_t m_gemm(ovld_rank_t *r, uint32_t s, const ovld_gemm_args_t *g)
{
    (void)s;
    (void)g;
    ovl_status_t st = logc((entry_t){.call = C_GEMM, .rank = r->id});
    return M.capturing && M.fail_captured_gemm ? OVL_ERR_BACKEND : st;
}
static ovl_status_t m_sleep(ovld_rank_t *r, uint32_t s, uint32_t ns)
{
    (void)s;
    (void)ns;
    return logc((entry_t){.call = C_SLEEP, .rank = r->id});
}
static void m_done(ovld_rank_t *r, uint32_t s, uint64_t seq, ovl_status_t status, const char *msg,
                   void *cookie)
{
    (void)s;
    (void)msg;
    (void)cookie;
    assert_false(M.capturing); /* a doorbell is never captured */
    logc((entry_t){.call = C_DONE, .rank = r->id, .seq = seq, .status = status});
}
static ovl_status_t m_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                                const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                                ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b, (void)method, (void)tag, (void)parts, (void)world, (void)dtype, (void)rows, (void)cols,
        (void)stride;
    return logc((entry_t){.call = C_ALLGATHER, .rank = -1, .n = nparts});
}
static const char *m_last_error(ovld_backend_t *b)
{
    (void)b;
    return "the mock was told to fail";
}
static ovl_status_t m_reserve_events(ovld_rank_t *r, uint32_t n)
{
    (void)r;
    (void)n;
    return OVL_OK;
}
static ovl_status_t m_capture(ovld_rank_t *const *ranks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(ranks[i]->id, (int)i); /* in rank order */
    logc((entry_t){.call = C_CAPTURE, .rank = ranks[0]->id, .n = n});
    M.capturing = true;
    return OVL_OK;
}
static ovl_status_t m_end(ovld_rank_t *const *ranks, uint32_t n, ovld_graph_t **ret)
{
    assert_true(M.capturing);
    M.capturing = false;
    logc((entry_t){.call = C_END, .rank = ranks[0]->id, .n = n, .status = ret ? 0 : 1});
    if (!ret)
        return OVL_OK; /* abandoned */
    if (M.fail_end)
        return OVL_ERR_BACKEND;
    ovld_graph_t *g = calloc(1, sizeof(*g));
    assert_non_null(g);
    g->id = ++M.graphs_made;
    *ret = g;
    return OVL_OK;
}
/* The op whole, as a backend's graph_run does it: every rank's wait, the
 * launch, every rank's done (none of them if the launch fails). */
static ovl_status_t m_run(ovld_graph_t *g, ovld_rank_t *const *ranks, void *const *cookies,
                          uint32_t n, uint64_t seq)
{
    assert_false(M.capturing);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(ranks[i]->id, (int)i); /* in rank order */
        assert_ptr_equal(cookies[i], ranks[i]); /* each rank's own cookie (setup_make) */
        logc((entry_t){.call = C_WAIT_READY, .rank = ranks[i]->id, .seq = seq});
    }
    logc((entry_t){.call = C_LAUNCH, .rank = ranks[0]->id, .n = n, .seq = (uint64_t)g->id});
    if (M.fail_launch)
        return OVL_ERR_BACKEND;
    for (uint32_t i = 0; i < n; i++)
        logc((entry_t){.call = C_DONE, .rank = ranks[i]->id, .seq = seq, .status = OVL_OK});
    return OVL_OK;
}
static void m_free(ovld_backend_t *b, ovld_graph_t *g)
{
    (void)b;
    M.graphs_freed++;
    free(g);
}

static ovld_backend_ops_t mock_ops = {
    .name = "mock",
    .reserve_events = m_reserve_events,
    .wait_ready = m_wait_ready,
    .record = m_record,
    .wait = m_wait,
    .allgather = m_allgather,
    .copy = m_copy,
    .gemm = m_gemm,
    .sleep = m_sleep,
    .done = m_done,
    .last_error = m_last_error,
    .graph_capture = m_capture,
    .graph_end = m_end,
    .graph_run = m_run,
    .graph_free = m_free,
};
static ovld_backend_t mock = {.ops = &mock_ops};

/* ------------------------------------------------------------ the setting */

typedef struct setup {
    struct ovld_rank ranks[MAXW];
    ovl_plan_t plans[MAXW];
    ovld_exec_rank_t xr[MAXW];
    ovld_exec_op_t op;
    char bufs[MAXW][OVL_BUF_COUNT][64]; /* what the views point at (never read) */
} setup_t;

/* Plans of world ranks for algo (m = 64, n = 48, k = 32), ranks sharing a
 * GPU where world > 1 unless nccl (dense, gathered by NCCL), and views of
 * distinct buffers, moved by `shift` bytes. */
static void setup_make(setup_t *s, ovl_algo_t algo, uint32_t world, bool nccl, size_t shift,
                       ovld_replay_t *rp)
{
    for (uint32_t r = 0; r < MAXW; r++)
        ovl_plan_free(&s->plans[r]);
    memset(s->plans, 0, sizeof(s->plans));
    for (uint32_t r = 0; r < world; r++) {
        ovl_plan_params_t p = {.algo = algo,
                               .world = world,
                               .rank = r,
                               .m = 64,
                               .n = 48,
                               .k = 32,
                               .dtype = OVL_DTYPE_FP32,
                               .shared_gpu = world > 1 && !nccl,
                               .allgather = nccl ? OVL_AG_NCCL : OVL_AG_AUTO};
        assert_int_equal(ovl_plan_build(&p, &s->plans[r]), OVL_OK);
        s->ranks[r].id = (int)r;
        s->xr[r] =
            (ovld_exec_rank_t){.rank = &s->ranks[r], .plan = &s->plans[r], .cookie = &s->ranks[r]};
        for (int b = 0; b < OVL_BUF_COUNT; b++)
            s->xr[r].buf[b] = s->plans[r].bufs[b].used
                                  ? (ovld_view_t){.ptr = &s->bufs[r][b][shift % 8],
                                                  .ld = s->plans[r].bufs[b].cols}
                                  : (ovld_view_t){0};
    }
    s->op = (ovld_exec_op_t){.world = world, .ranks = s->xr, .replay = rp};
}

static void setup_free(setup_t *s)
{
    for (uint32_t r = 0; r < MAXW; r++)
        ovl_plan_free(&s->plans[r]);
}

static int reports;
static char last_report[512];
static void on_report(void *arg, ovld_report_level_t level, const char *msg)
{
    (void)arg;
    (void)level;
    reports++;
    snprintf(last_report, sizeof(last_report), "%s", msg);
}

static ovld_exec_pool_t *pool;

static int setup(void **state)
{
    (void)state;
    memset(&M, 0, sizeof(M));
    reports = 0;
    last_report[0] = '\0';
    ovld_reporter_t rep = {.fn = on_report};
    return ovld_exec_pool_create(&rep, &pool) == OVL_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    ovld_exec_pool_destroy(pool);
    return 0;
}

/* Runs op seq; returns how its body was issued. The log holds its calls. */
static ovld_replay_how_t run(setup_t *s, uint64_t seq, ovl_status_t want)
{
    M.n = 0;
    s->op.seq = seq;
    char err[256] = "";
    ovld_replay_how_t how = (ovld_replay_how_t)-1;
    ovl_status_t st = ovld_exec_run(pool, &mock, &s->op, &how, err, sizeof(err));
    if (st != want)
        fail_msg("op %llu: status %d, want %d (%s)", (unsigned long long)seq, st, want, err);
    /* every rank's done, exactly once, last of its calls, with the status */
    for (uint32_t r = 0; r < s->op.world; r++) {
        int dones = 0;
        size_t last = 0;
        for (size_t i = 0; i < M.n; i++)
            if (M.log[i].rank == (int)r && M.log[i].call != C_CAPTURE && M.log[i].call != C_END &&
                M.log[i].call != C_LAUNCH) {
                last = i;
                if (M.log[i].call == C_DONE) {
                    dones++;
                    assert_int_equal(M.log[i].seq, seq);
                    assert_int_equal(M.log[i].status, want);
                }
            }
        assert_int_equal(dones, 1);
        assert_int_equal(M.log[last].call, C_DONE);
    }
    return how;
}

/* Calls of the log of a kind, and how many of them were captured. */
static size_t count(call_t c, size_t *captured)
{
    size_t n = 0, k = 0;
    for (size_t i = 0; i < M.n; i++)
        if (M.log[i].call == c) {
            n++;
            k += M.log[i].captured;
        }
    if (captured)
        *captured = k;
    return n;
}

/* The body calls of the log (neither doorbell nor graph calls), and how
 * many of them were captured. */
static size_t body_calls(size_t *captured)
{
    size_t n = 0, k = 0;
    for (size_t i = 0; i < M.n; i++) {
        call_t c = M.log[i].call;
        if (c == C_WAIT_READY || c == C_DONE || c == C_CAPTURE || c == C_END || c == C_LAUNCH)
            continue;
        n++;
        k += M.log[i].captured;
    }
    if (captured)
        *captured = k;
    return n;
}

/* ------------------------------------------------------------- the tests */

/* Seen once: call by call; twice: captured and launched; then replayed. */
static void test_replay_cycle(void **state)
{
    (void)state;
    for (uint32_t world = 1; world <= MAXW; world++) {
        ovld_replay_t *rp = ovld_replay_create(&mock, 16);
        assert_non_null(rp);
        setup_t s = {0};
        setup_make(&s, OVL_ALGO_RING, world, false, 0, rp);

        assert_int_equal(run(&s, 1, OVL_OK), OVLD_REPLAY_EAGER);
        size_t cap, body = body_calls(&cap);
        assert_true(body > 0);
        assert_int_equal(cap, 0);
        assert_int_equal(count(C_CAPTURE, NULL), 0);
        assert_int_equal(count(C_LAUNCH, NULL), 0);

        assert_int_equal(run(&s, 2, OVL_OK), OVLD_REPLAY_CAPTURE);
        assert_int_equal(body_calls(&cap), body); /* the same calls, */
        assert_int_equal(cap, body);              /* every one captured */
        assert_int_equal(count(C_CAPTURE, NULL), 1);
        assert_int_equal(count(C_END, NULL), 1);
        assert_int_equal(count(C_LAUNCH, NULL), 1);
        assert_int_equal(count(C_WAIT_READY, &cap), world);
        assert_int_equal(cap, 0);
        for (size_t i = 0; i < M.n; i++)
            if (M.log[i].call == C_CAPTURE || M.log[i].call == C_LAUNCH)
                assert_int_equal(M.log[i].n, world);
        /* the order: capture, body, end, then the run: waits, launch, dones */
        assert_int_equal(M.log[0].call, C_CAPTURE);
        assert_int_equal(M.log[M.n - 2 * world - 2].call, C_END);
        for (uint32_t r = 0; r < world; r++) {
            assert_int_equal(M.log[M.n - 2 * world - 1 + r].call, C_WAIT_READY);
            assert_int_equal(M.log[M.n - 1 - r].call, C_DONE);
        }
        assert_int_equal(M.log[M.n - world - 1].call, C_LAUNCH);

        for (uint64_t seq = 3; seq < 6; seq++) {
            assert_int_equal(run(&s, seq, OVL_OK), OVLD_REPLAY_LAUNCH);
            assert_int_equal(body_calls(NULL), 0);
            assert_int_equal(count(C_CAPTURE, NULL), 0);
            assert_int_equal(count(C_LAUNCH, NULL), 1);
            assert_int_equal(count(C_WAIT_READY, NULL), world);
            assert_int_equal(M.n, 2 * world + 1);
            assert_int_equal(M.log[world].call, C_LAUNCH);
            assert_int_equal(M.log[world].seq, (uint64_t)M.graphs_made); /* the one graph */
        }
        assert_int_equal(ovld_replay_size(rp), 1);
        int made = M.graphs_made;
        ovld_replay_destroy(rp);
        assert_int_equal(M.graphs_freed, made);
        setup_free(&s);
    }
}

/* Another view or shape is another key; the first stays. */
static void test_replay_keys(void **state)
{
    (void)state;
    ovld_replay_t *rp = ovld_replay_create(&mock, 16);
    setup_t s = {0};
    setup_make(&s, OVL_ALGO_RING, 1, false, 0, rp);
    run(&s, 1, OVL_OK);
    assert_int_equal(run(&s, 2, OVL_OK), OVLD_REPLAY_CAPTURE);
    setup_make(&s, OVL_ALGO_RING, 1, false, 4, rp); /* views moved by 4 bytes */
    assert_int_equal(run(&s, 3, OVL_OK), OVLD_REPLAY_EAGER);
    assert_int_equal(run(&s, 4, OVL_OK), OVLD_REPLAY_CAPTURE);
    setup_make(&s, OVL_ALGO_NAIVE, 1, false, 4, rp); /* another plan, same views */
    assert_int_equal(run(&s, 5, OVL_OK), OVLD_REPLAY_EAGER);
    setup_make(&s, OVL_ALGO_RING, 1, false, 0, rp); /* the first again */
    assert_int_equal(run(&s, 6, OVL_OK), OVLD_REPLAY_LAUNCH);
    assert_int_equal(M.log[1].seq, 1); /* the first graph */
    assert_int_equal(ovld_replay_size(rp), 3);
    ovld_replay_destroy(rp);
    assert_int_equal(M.graphs_freed, 2);
    setup_free(&s);
}

/* An unmapping (a new memory generation) drops every key. */
static void test_replay_generation(void **state)
{
    (void)state;
    ovld_replay_t *rp = ovld_replay_create(&mock, 16);
    setup_t s = {0};
    setup_make(&s, OVL_ALGO_RING, 1, false, 0, rp);
    run(&s, 1, OVL_OK);
    run(&s, 2, OVL_OK);
    assert_int_equal(run(&s, 3, OVL_OK), OVLD_REPLAY_LAUNCH);
    s.op.mem_gen = 1;
    assert_int_equal(run(&s, 4, OVL_OK), OVLD_REPLAY_EAGER);
    assert_int_equal(M.graphs_freed, 1);
    assert_int_equal(run(&s, 5, OVL_OK), OVLD_REPLAY_CAPTURE);
    assert_int_equal(run(&s, 6, OVL_OK), OVLD_REPLAY_LAUNCH);
    ovld_replay_destroy(rp);
    setup_free(&s);
}

/* A capture that fails: the body again, call by call; reported; the key
 * stays call by call. */
static void capture_fails(bool at_end)
{
    ovld_replay_t *rp = ovld_replay_create(&mock, 16);
    setup_t s = {0};
    setup_make(&s, OVL_ALGO_RING, 2, false, 0, rp);
    run(&s, 1, OVL_OK);
    size_t body = body_calls(NULL);
    M.fail_end = at_end;
    M.fail_captured_gemm = !at_end;
    reports = 0;
    assert_int_equal(run(&s, 2, OVL_OK), OVLD_REPLAY_EAGER);
    assert_int_equal(count(C_CAPTURE, NULL), 1);
    assert_int_equal(count(C_LAUNCH, NULL), 0);
    size_t cap, all = body_calls(&cap);
    assert_int_equal(all - cap, body); /* the whole body, not captured */
    if (at_end)
        assert_int_equal(cap, body); /* after the whole body was captured */
    else
        assert_true(cap >= 1 && cap <= body);       /* up to the failed GEMM */
    assert_int_equal(count(C_WAIT_READY, NULL), 2); /* once: nothing of it ran twice */
    assert_int_equal(reports, 1);
    assert_non_null(strstr(last_report, "could not be captured"));
    M.fail_end = M.fail_captured_gemm = false;
    assert_int_equal(run(&s, 3, OVL_OK), OVLD_REPLAY_EAGER); /* refused: no new try */
    assert_int_equal(count(C_CAPTURE, NULL), 0);
    assert_int_equal(M.graphs_made - M.graphs_freed, 0);
    ovld_replay_destroy(rp);
    setup_free(&s);
}

static void test_replay_capture_fails(void **state)
{
    (void)state;
    capture_fails(true);
    capture_fails(false);
}

/* A launch that fails: every rank's done, once, with the error. */
static void test_replay_launch_fails(void **state)
{
    (void)state;
    ovld_replay_t *rp = ovld_replay_create(&mock, 16);
    setup_t s = {0};
    setup_make(&s, OVL_ALGO_RING, 2, false, 0, rp);
    run(&s, 1, OVL_OK);
    run(&s, 2, OVL_OK);
    M.fail_launch = true;
    run(&s, 3, OVL_ERR_BACKEND); /* run() checks the dones */
    M.fail_launch = false;
    assert_int_equal(run(&s, 4, OVL_OK), OVLD_REPLAY_LAUNCH); /* the graph stays */
    ovld_replay_destroy(rp);
    setup_free(&s);
}

/* NCCL collectives stay outside graphs; no cache, no replay. */
static void test_replay_not_replayable(void **state)
{
    (void)state;
    ovld_replay_t *rp = ovld_replay_create(&mock, 16);
    setup_t s = {0};
    setup_make(&s, OVL_ALGO_NAIVE, 2, true, 0, rp);
    for (uint64_t seq = 1; seq < 4; seq++) {
        assert_int_equal(run(&s, seq, OVL_OK), OVLD_REPLAY_EAGER);
        assert_int_equal(count(C_ALLGATHER, NULL), 1);
        assert_int_equal(count(C_CAPTURE, NULL), 0);
    }
    assert_int_equal(ovld_replay_size(rp), 0);
    setup_make(&s, OVL_ALGO_RING, 1, false, 0, NULL); /* a job without a cache */
    for (uint64_t seq = 4; seq < 7; seq++)
        assert_int_equal(run(&s, seq, OVL_OK), OVLD_REPLAY_EAGER);
    /* a backend that cannot capture */
    ovld_backend_ops_t plain = mock_ops;
    plain.graph_capture = NULL;
    plain.graph_end = NULL;
    plain.graph_run = NULL;
    plain.graph_free = NULL;
    ovld_backend_t pb = {.ops = &plain};
    setup_make(&s, OVL_ALGO_RING, 1, false, 0, rp);
    for (uint64_t seq = 7; seq < 10; seq++) {
        char err[256];
        ovld_replay_how_t how;
        s.op.seq = seq;
        assert_int_equal(ovld_exec_run(pool, &pb, &s.op, &how, err, sizeof(err)), OVL_OK);
        assert_int_equal(how, OVLD_REPLAY_EAGER);
    }
    assert_int_equal(M.graphs_made, 0);
    ovld_replay_destroy(rp);
    setup_free(&s);
}

/* The cache alone: at most cap keys, the least recently used out first. */
static void test_replay_lru(void **state)
{
    (void)state;
    ovld_replay_t *rp = ovld_replay_create(&mock, 2);
    ovld_graph_t *g;
    uint64_t a = 1, b = 2, c = 3;
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_EAGER);
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_CAPTURE);
    ovld_graph_t *ga = calloc(1, sizeof(*ga));
    ovld_replay_captured(rp, ga);
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_LAUNCH);
    assert_ptr_equal(g, ga);
    assert_int_equal(ovld_replay_find(rp, &b, sizeof(b), 0, &g), OVLD_REPLAY_EAGER);
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_LAUNCH); /* a newer */
    assert_int_equal(ovld_replay_find(rp, &c, sizeof(c), 0, &g), OVLD_REPLAY_EAGER);  /* b out */
    assert_int_equal(ovld_replay_size(rp), 2);
    assert_int_equal(M.graphs_freed, 0);
    assert_int_equal(ovld_replay_find(rp, &b, sizeof(b), 0, &g), OVLD_REPLAY_EAGER); /* a out */
    assert_int_equal(M.graphs_freed, 1);
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_EAGER);
    /* a refused key stays call by call */
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_CAPTURE);
    ovld_replay_refused(rp);
    assert_int_equal(ovld_replay_find(rp, &a, sizeof(a), 0, &g), OVLD_REPLAY_EAGER);
    assert_int_equal(ovld_replay_size(rp), 2);
    ovld_replay_destroy(rp);
    assert_null(ovld_replay_create(&mock, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_replay_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_generation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_capture_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_launch_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_not_replayable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_lru, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

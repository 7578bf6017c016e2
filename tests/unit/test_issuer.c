/*
 * test_issuer.c: unit test of the issuer's gates (daemon/issue/issuer.h,
 * "Gates"), on a real issuer with two threads and a mock backend whose
 * clients' doorbells the test sets (ready_seen reads them) and which logs
 * every rank's WAIT_READY and DONE. Each op is a real plan of world 1.
 *
 *  - a lane alone on its device issues an op whose client has not said
 *    ready (its WAIT_READY is enqueued ahead, as before gates);
 *  - two lanes on one device: an op not ready waits in the issuer (nothing
 *    of it reaches the backend) while the other lane's ready op is issued;
 *    it is issued once its doorbell says ready, its lane's next op stays
 *    behind it until that one's ready too, and op order holds;
 *  - a failure to ring (a fail item) is not gated;
 *  - a lane freed, or its last rank on the device gone, leaves the device
 *    to the other: its waiting op goes at once, ready or not;
 *  - an issuer closed with an op at its gate issues it (its threads end);
 *  - a lane on two devices, one of which another lane shares, is gated;
 *  - a gate that opens after the poller slowed down (gate_spin_ms without
 *    a gate opening) is still seen within a bound;
 *  - with gate_spin_ms 0 (a reload) the poller keeps the CPU mostly free
 *    while an op waits at its gate, and still sees the gate open soon;
 *  - a lane that outlives the issuer's close frees it (ASan sees a leak or
 *    a use after free otherwise);
 *  - holds: an op issued ahead while its lane was alone, still not ready
 *    HOLD_LIMIT_MS after another lane came to share its device, is
 *    reported once to its lane's owner (on_hold) with its seq; not where
 *    its client rings in time, not while its lane is alone, not while the
 *    newcomer has no work (owner_busy), not with the limit 0, and the limit
 *    set anew (a reload) applies.
 * Every wait is bounded (WAIT_MS); the loop thread is this one.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <uv.h>

#include "clock.h"
#include "exec.h"
#include "issuer.h"
#include "plan.h"

#define NRANKS  4
#define MAXLOG  256
#define WAIT_MS 5000 /* the bound on every wait for an issue */
#define HOLD_MS 100  /* how long an op that must wait is watched */

struct ovld_rank {
    int id;
};

/* The clients' doorbells: rank r said ready up to ready[r]. */
static _Atomic uint64_t ready[NRANKS];

/* What the backend was asked: (rank, seq) of every WAIT_READY and DONE. */
typedef struct call {
    int rank;
    bool done;
    uint64_t seq;
} call_t;

static struct {
    pthread_mutex_t mu;
    call_t log[MAXLOG];
    size_t n;
} B = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void logc(ovld_rank_t *r, bool done, uint64_t seq)
{
    pthread_mutex_lock(&B.mu);
    if (B.n < MAXLOG)
        B.log[B.n++] = (call_t){r->id, done, seq};
    pthread_mutex_unlock(&B.mu);
}

/* Whether the backend was asked for rank's WAIT_READY (done false) or
 * DONE (done true) of op seq. */
static bool called(int rank, bool done, uint64_t seq)
{
    bool found = false;
    pthread_mutex_lock(&B.mu);
    for (size_t i = 0; i < B.n && !found; i++)
        found = B.log[i].rank == rank && B.log[i].done == done && B.log[i].seq == seq;
    pthread_mutex_unlock(&B.mu);
    return found;
}

static ovl_status_t m_reserve_events(ovld_rank_t *r, uint32_t n)
{
    (void)r;
    (void)n;
    return OVL_OK;
}

static ovl_status_t m_set_streams(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n)
{
    (void)r;
    (void)roles;
    (void)n;
    return OVL_OK;
}

static ovl_status_t m_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    (void)stream;
    logc(r, false, seq);
    return OVL_OK;
}

static bool m_ready_seen(ovld_rank_t *r, uint64_t seq)
{
    return atomic_load(&ready[r->id]) >= seq;
}

static ovl_status_t m_record(ovld_rank_t *r, uint32_t stream, uint32_t event)
{
    (void)r;
    (void)stream;
    (void)event;
    return OVL_OK;
}

static ovl_status_t m_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event)
{
    (void)r;
    (void)stream;
    (void)owner;
    (void)event;
    return OVL_OK;
}

static ovl_status_t m_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                                const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                                ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b, (void)method, (void)tag, (void)parts, (void)nparts, (void)world, (void)dtype;
    (void)rows, (void)cols, (void)stride;
    return OVL_OK;
}

static ovl_status_t m_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                           uint64_t rows, uint64_t cols, size_t elem)
{
    (void)r, (void)stream, (void)dst, (void)src, (void)rows, (void)cols, (void)elem;
    return OVL_OK;
}

static ovl_status_t m_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args)
{
    (void)r, (void)stream, (void)args;
    return OVL_OK;
}

static ovl_status_t m_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns)
{
    (void)r, (void)stream, (void)ns;
    return OVL_OK;
}

static void m_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
                   const char *message, void *cookie)
{
    (void)stream, (void)status, (void)message, (void)cookie;
    logc(r, true, seq);
}

static const char *m_last_error(ovld_backend_t *b)
{
    (void)b;
    return NULL;
}

static ovld_backend_ops_t mock_ops = {
    .name = "mock",
    .reserve_events = m_reserve_events,
    .set_streams = m_set_streams,
    .wait_ready = m_wait_ready,
    .ready_seen = m_ready_seen,
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

/* ------------------------------------------------------------- the ops */

static struct ovld_rank ranks[NRANKS];
static ovl_plan_t plan; /* world 1: every rank's op uses it */

/* One op of rank `rank` (its own job: world 1) and its item. Tests keep
 * theirs static: a failed assertion leaves the test with items queued,
 * which the teardown (the issuer's close) then issues. */
typedef struct op {
    ovld_exec_rank_t xr;
    ovld_issue_t it;
    bool issued; /* its callback ran (loop thread) */
} op_t;

static void on_issued(ovld_issue_t *it)
{
    op_t *o = it->arg;
    assert_int_equal(it->st, OVL_OK);
    o->issued = true;
}

static void op_init(op_t *o, int rank, uint64_t seq)
{
    memset(o, 0, sizeof(*o));
    o->xr = (ovld_exec_rank_t){.rank = &ranks[rank], .plan = &plan};
    /* the mock dereferences no buffer: any distinct non-NULL pointers */
    for (int b = 0; b < OVL_BUF_COUNT; b++)
        if (plan.bufs[b].used)
            o->xr.buf[b] = (ovld_view_t){.ptr = (void *)(uintptr_t)(0x1000 * (b + 1)),
                                         .ld = plan.bufs[b].cols};
    o->it.op = (ovld_exec_op_t){.seq = seq, .world = 1, .ranks = &o->xr};
    o->it.cb = on_issued;
    o->it.arg = o;
}

/* An op that fails without running: its ring only. Its op is filled in
 * too (rank's, not ready), so that a gate on it would hold it. */
static void fail_init(op_t *o, int rank, uint64_t seq)
{
    op_init(o, rank, seq);
    static ovld_exec_ring_t rings[NRANKS];
    rings[rank] = (ovld_exec_ring_t){.rank = &ranks[rank]};
    o->it.fail = true;
    o->it.rings = &rings[rank];
    o->it.nrings = 1;
    o->it.seq = seq;
    o->it.status = OVL_ERR_ABORTED;
    o->it.message = "the test fails it";
    o->it.cb = on_issued;
    o->it.arg = o;
}

/* --------------------------------------------------------------- setup */

static uv_loop_t loop;
static ovld_issuer_t *is;

#define HOLD_LIMIT_MS 50

/* on_hold's calls */
static struct {
    int calls;
    void *owner;
    uint64_t seq, held_ms;
    bool seen;
} H;

static void rec_hold(void *arg, void *owner, uint64_t seq, uint64_t held_ms)
{
    assert_ptr_equal(arg, &H);
    H.calls++;
    H.owner = owner;
    H.seq = seq;
    H.held_ms = held_ms;
    H.seen = true;
}

static uint32_t setup_hold_ms; /* the hold limit setup gives the issuer */

/* owner_busy: every owner has ops in flight, or none */
static bool owners_busy;

static bool owner_busy(void *owner)
{
    (void)owner;
    return owners_busy;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Turns the loop (delivering callbacks) until *flag or ms passed. */
static bool wait_for(const bool *flag, int ms)
{
    uint64_t until = ovl_mono_ns() + (uint64_t)ms * 1000000;
    for (;;) {
        uv_run(&loop, UV_RUN_NOWAIT);
        if (*flag)
            return true;
        if (ovl_mono_ns() >= until)
            return false;
        sleep_ms(1);
    }
}

static int setup(void **state)
{
    (void)state;
    for (int r = 0; r < NRANKS; r++) {
        ranks[r].id = r;
        atomic_store(&ready[r], 0);
    }
    B.n = 0;
    ovl_plan_params_t p = {.algo = OVL_ALGO_NAIVE,
                           .world = 1,
                           .rank = 0,
                           .m = 64,
                           .n = 48,
                           .k = 32,
                           .dtype = OVL_DTYPE_FP32,
                           .nb = 1};
    assert_int_equal(ovl_plan_build(&p, &plan), OVL_OK);
    assert_int_equal(uv_loop_init(&loop), 0);
    memset(&H, 0, sizeof(H));
    owners_busy = true;
    ovld_issuer_cfg_t cfg = {.nthreads = 2,
                             .hold_ms = setup_hold_ms,
                             .gate_spin_ms = 1000, /* ovld's default */
                             .on_hold = rec_hold,
                             .hold_arg = &H,
                             .owner_busy = owner_busy};
    char err[256];
    assert_int_equal(ovld_issuer_create(&loop, &mock, &cfg, NULL, &is, err, sizeof(err)), OVL_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ovld_issuer_close(is);
    is = NULL;
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    ovl_plan_free(&plan);
    return 0;
}

static int setup_hold(void **state)
{
    setup_hold_ms = HOLD_LIMIT_MS;
    int rc = setup(state);
    setup_hold_ms = 0;
    return rc;
}

static int owners[4]; /* lane owners: distinct addresses */

static ovld_lane_t *lane_of(uint32_t dev, void *owner)
{
    ovld_lane_t *l = NULL;
    assert_int_equal(ovld_lane_new(is, owner, &l), OVL_OK);
    assert_non_null(l);
    ovld_lane_add_device(l, dev);
    return l;
}

static ovld_lane_t *lane_on(uint32_t dev)
{
    ovld_lane_t *l = NULL;
    assert_int_equal(ovld_lane_new(is, NULL, &l), OVL_OK);
    assert_non_null(l);
    ovld_lane_add_device(l, dev);
    return l;
}

/* --------------------------------------------------------------- tests */

/* Alone on its device, a lane's op goes ahead of its doorbell. */
static void test_alone_issues_ahead(void **state)
{
    (void)state;
    ovld_lane_t *l = lane_on(0);
    static op_t a;
    op_init(&a, 0, 1);
    ovld_lane_submit(l, &mock, NULL, &a.it);
    assert_true(wait_for(&a.issued, WAIT_MS));
    assert_true(called(0, false, 1)); /* its WAIT_READY is on the stream */
    assert_true(called(0, true, 1));
    assert_int_equal(atomic_load(&ready[0]), 0);
    ovld_lane_free(l);
}

/* Two lanes on one device: an op waits for its doorbell, in the issuer. */
static void test_shared_waits_for_ready(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    static op_t a1, a2, b1;
    op_init(&a1, 0, 1);
    op_init(&a2, 0, 2);
    op_init(&b1, 1, 1);
    atomic_store(&ready[1], 1);
    ovld_lane_submit(l0, &mock, NULL, &a1.it);
    ovld_lane_submit(l0, &mock, NULL, &a2.it);
    ovld_lane_submit(l1, &mock, NULL, &b1.it);
    /* the other lane's op, ready, is not held up by the waiting one */
    assert_true(wait_for(&b1.issued, WAIT_MS));
    assert_false(wait_for(&a1.issued, HOLD_MS));
    assert_false(called(0, false, 1)); /* nothing of a1 reached the backend */
    assert_int_equal(ovld_issuer_busy(is), 2);
    /* a1's client says ready: a1 goes, a2 (not ready) stays behind */
    atomic_store(&ready[0], 1);
    assert_true(wait_for(&a1.issued, WAIT_MS));
    assert_true(called(0, true, 1));
    assert_false(wait_for(&a2.issued, HOLD_MS));
    assert_false(called(0, false, 2));
    atomic_store(&ready[0], 2);
    assert_true(wait_for(&a2.issued, WAIT_MS));
    assert_true(called(0, true, 2));
    assert_int_equal(ovld_issuer_busy(is), 0);
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* A failure's ring needs no ready. */
static void test_fail_not_gated(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    static op_t f;
    fail_init(&f, 0, 1);
    ovld_lane_submit(l0, &mock, NULL, &f.it);
    assert_true(wait_for(&f.issued, WAIT_MS));
    assert_true(called(0, true, 1));
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* Rank 0's op 1, not ready, on lane l of a shared device: it stays at its
 * gate (HOLD_MS). */
static void submit_gated(op_t *a, ovld_lane_t *l)
{
    op_init(a, 0, 1);
    ovld_lane_submit(l, &mock, NULL, &a->it);
    assert_false(wait_for(&a->issued, HOLD_MS));
}

/* The other lane gone, the device is the waiting lane's alone: its op goes. */
static void test_lane_freed_ungates(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    static op_t a;
    submit_gated(&a, l0);
    ovld_lane_free(l1);
    assert_true(wait_for(&a.issued, WAIT_MS));
    assert_true(called(0, false, 1));
    ovld_lane_free(l0);
}

/* The other lane's last rank on the device left: its op goes, ready or
 * not. */
static void test_device_removed_ungates(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    ovld_lane_add_device(l1, 1);
    static op_t a;
    submit_gated(&a, l0);
    ovld_lane_remove_device(l1, 0);
    assert_true(wait_for(&a.issued, WAIT_MS));
    assert_true(called(0, false, 1));
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* ovld closes the issuer only when nothing is left to issue; should an op
 * still wait for its gate then, it is issued (the connections' close
 * releases its waits) rather than keep the threads from ending. */
static void test_close_opens_gates(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    static op_t a;
    submit_gated(&a, l0);
    ovld_issuer_close(is); /* its callbacks are delivered before it returns */
    is = NULL;
    assert_true(a.issued);
    assert_true(called(0, true, 1));
    uv_run(&loop, UV_RUN_DEFAULT);
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* A lane on devices 0 and 1 is gated where another lane has device 1; a
 * lane on device 2 alone is not. */
static void test_any_shared_device_gates(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(1), *l2 = lane_on(2);
    ovld_lane_add_device(l0, 1);
    ovld_lane_add_device(l0, 1); /* twice: counted once */
    static op_t a, c;
    op_init(&a, 0, 1);
    op_init(&c, 2, 1);
    ovld_lane_submit(l0, &mock, NULL, &a.it);
    ovld_lane_submit(l2, &mock, NULL, &c.it);
    assert_true(wait_for(&c.issued, WAIT_MS));
    assert_false(wait_for(&a.issued, HOLD_MS));
    atomic_store(&ready[0], 1);
    assert_true(wait_for(&a.issued, WAIT_MS));
    ovld_lane_free(l0);
    ovld_lane_free(l1);
    ovld_lane_free(l2);
}

/* Rank 0 says ready for op a (op 1, at its gate): a is issued; returns
 * how many ms that took. */
static uint64_t open_gate_ms(op_t *a)
{
    uint64_t t0 = ovl_mono_ns();
    atomic_store(&ready[0], 1);
    assert_true(wait_for(&a->issued, WAIT_MS));
    return (ovl_mono_ns() - t0) / 1000000;
}

/* After gate_spin_ms (1 s) without a gate opening the poller sleeps
 * between polls; a gate that opens then is still seen soon. */
static void test_slow_gate_still_seen(void **state)
{
    (void)state;
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    static op_t a;
    op_init(&a, 0, 1);
    ovld_lane_submit(l0, &mock, NULL, &a.it);
    assert_false(wait_for(&a.issued, 1300));
    uint64_t took_ms = open_gate_ms(&a);
    if (took_ms > 500)
        fail_msg("a gate that opened after the spin was seen after %llu ms",
                 (unsigned long long)took_ms);
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* gate_spin_ms 0: an op waits at its gate for 300 ms while the process
 * uses under half of that in CPU time (a spinning poller uses all of it),
 * and its gate is still seen open within 250 ms (a poll every 100 us, and
 * this thread's look every 1 ms, on a loaded machine). */
static void test_gate_spin_zero(void **state)
{
    (void)state;
    ovld_issuer_set_gate_spin(is, 0);
    ovld_lane_t *l0 = lane_on(0), *l1 = lane_on(0);
    static op_t a;
    op_init(&a, 0, 1);
    ovld_lane_submit(l0, &mock, NULL, &a.it);
    uint64_t c0 = cpu_ns();
    assert_false(wait_for(&a.issued, 300));
    uint64_t used_ms = (cpu_ns() - c0) / 1000000;
    if (used_ms >= 150)
        fail_msg("with gate_spin_ms 0 the gate's 300 ms wait used %llu ms of CPU",
                 (unsigned long long)used_ms);
    uint64_t took_ms = open_gate_ms(&a);
    if (took_ms > 250)
        fail_msg("with gate_spin_ms 0 an open gate was seen after %llu ms",
                 (unsigned long long)took_ms);
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* A job may free its lane after ovld closed the issuer (shutdown): the
 * issuer's memory goes with the last lane. */
static void test_lane_outlives_close(void **state)
{
    (void)state;
    ovld_lane_t *l = lane_on(0);
    ovld_issuer_close(is);
    is = NULL;
    uv_run(&loop, UV_RUN_DEFAULT); /* the close completes */
    ovld_lane_free(l);
}

/* A lane of owners[0] alone on device 0, which issues rank 0's op 1, not
 * ready, ahead. */
static ovld_lane_t *issue_ahead(op_t *a)
{
    ovld_lane_t *l = lane_of(0, &owners[0]);
    op_init(a, 0, 1);
    ovld_lane_submit(l, &mock, NULL, &a->it);
    assert_true(wait_for(&a->issued, WAIT_MS));
    return l;
}

/* Alone, lane 0 issues op 1 ahead; lane 1 comes to its device; op 1's
 * client does not ring: reported once, after the limit, to lane 0's owner. */
static void test_hold_reported(void **state)
{
    (void)state;
    static op_t a;
    ovld_lane_t *l0 = issue_ahead(&a);
    assert_false(wait_for(&H.seen, 2 * HOLD_LIMIT_MS)); /* alone: no hold */
    uint64_t t0 = ovl_mono_ns();
    ovld_lane_t *l1 = lane_of(0, &owners[1]);
    assert_true(wait_for(&H.seen, WAIT_MS));
    uint64_t took_ms = (ovl_mono_ns() - t0) / 1000000;
    assert_true(took_ms >= HOLD_LIMIT_MS);
    assert_int_equal(H.calls, 1);
    assert_ptr_equal(H.owner, &owners[0]);
    assert_int_equal(H.seq, 1);
    assert_true(H.held_ms >= HOLD_LIMIT_MS);
    H.seen = false;
    assert_false(wait_for(&H.seen, 4 * HOLD_LIMIT_MS)); /* once */
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* The client rings before the limit: no report. */
static void test_hold_cleared(void **state)
{
    (void)state;
    static op_t a;
    ovld_lane_t *l0 = issue_ahead(&a);
    ovld_lane_t *l1 = lane_of(0, &owners[1]);
    atomic_store(&ready[0], 1);
    assert_false(wait_for(&H.seen, 6 * HOLD_LIMIT_MS));
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* A limit of 0 never reports; set to HOLD_LIMIT_MS (a reload), it does. */
static void test_hold_limit_zero_then_set(void **state)
{
    (void)state;
    ovld_issuer_set_hold(is, 0);
    static op_t a;
    ovld_lane_t *l0 = issue_ahead(&a);
    ovld_lane_t *l1 = lane_of(0, &owners[1]);
    assert_false(wait_for(&H.seen, 6 * HOLD_LIMIT_MS));
    ovld_issuer_set_hold(is, HOLD_LIMIT_MS);
    assert_true(wait_for(&H.seen, WAIT_MS));
    assert_int_equal(H.seq, 1);
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

/* The newcomer only joined (no work queued, running or in flight): it is
 * held up by nothing, and the clock starts once it has work. */
static void test_hold_needs_a_busy_newcomer(void **state)
{
    (void)state;
    owners_busy = false;
    static op_t a;
    ovld_lane_t *l0 = issue_ahead(&a);
    ovld_lane_t *l1 = lane_of(0, &owners[1]);
    assert_false(wait_for(&H.seen, 6 * HOLD_LIMIT_MS));
    uint64_t t0 = ovl_mono_ns();
    owners_busy = true;
    assert_true(wait_for(&H.seen, WAIT_MS));
    assert_true((ovl_mono_ns() - t0) / 1000000 >= HOLD_LIMIT_MS);
    assert_ptr_equal(H.owner, &owners[0]);
    ovld_lane_free(l0);
    ovld_lane_free(l1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_alone_issues_ahead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_waits_for_ready, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_not_gated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lane_freed_ungates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_removed_ungates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_opens_gates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_any_shared_device_gates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_gate_still_seen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_spin_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lane_outlives_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hold_reported, setup_hold, teardown),
        cmocka_unit_test_setup_teardown(test_hold_cleared, setup_hold, teardown),
        cmocka_unit_test_setup_teardown(test_hold_limit_zero_then_set, setup_hold, teardown),
        cmocka_unit_test_setup_teardown(test_hold_needs_a_busy_newcomer, setup_hold, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

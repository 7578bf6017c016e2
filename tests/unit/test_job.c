/*
 * test_job.c: unit test of jobs and their op queues (daemon/core/job.c,
 * daemon/core/opq.c) against a backend that only records what it is asked to
 * do and completes nothing by itself: the test delivers every completion
 * (ovld_job_on_done) when it wants and in the order it wants, decides when
 * and how a job's setup ends, and can make the Nth primitive fail.
 *
 * Buffers are real (buffers.c, registry.c): each client registers its A, B,
 * C and a_out in a table of its own and ops resolve them as server/dispatch.c does,
 * so every reference an op takes is counted, and the test checks that each
 * mapping is released exactly once, and only once nothing holds it.
 *
 * After every test (finish()): every rank leaves, every completion comes
 * back, and then no job is left, every backend rank was destroyed exactly
 * once, every buffer was released exactly once, and each rank's doorbell
 * was rung with strictly increasing op numbers (each op once, in order).
 *
 * Serial issue only (no pool), no threads, no sleeps: deterministic.
 *
 * test_abort_messages_nest_max_ops, test_abort_messages_nest_setup and
 * test_backend_failure_last_error found bugs of opq.c when they were
 * written; they hold the fixes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffers.h"
#include "config.h"
#include "job.h"
#include "tune.h"
#include "log.h"
#include "registry.h"
#include "stats.h"

#define NDEV    4    /* devices of the mock backend */
#define MAXCL   8    /* clients (ranks) a test uses */
#define MAXMADE 64   /* backend ranks made in one test */
#define MAXDONE 1024 /* doorbell rings in one test */
#define MEMF    4096 /* floats of each client buffer */
#define UID     1000

/* ------------------------------------------------------------ the mock */

struct ovld_rank {
    int serial; /* creation order, from 1 */
    uint32_t device;
    uint32_t rank; /* the job rank the test joined it as */
    bool destroyed;
};

typedef enum { P_WAIT_READY, P_RECORD, P_WAIT, P_ALLGATHER, P_COPY, P_GEMM, P_SLEEP } prim_t;

/* One ring of a doorbell (backend done), and whether the test delivered
 * its completion yet. */
typedef struct done_rec {
    struct ovld_rank *r;
    uint32_t stream;
    uint64_t seq;
    ovl_status_t status;
    bool has_msg;
    char msg[256];
    void *cookie;
    bool delivered;
    uint64_t ns; /* the device time it reports (a timed op's) */
} done_rec_t;

static struct mock {
    /* timing (time_start): the op being timed, and the copies and
     * all-gathers issued since its start (what its time is made of) */
    uint64_t timed_seq;
    int time_starts, copies_timed, allgathers_timed;
    struct ovld_rank *made[MAXMADE];
    int nmade, nlive;
    ovl_status_t create_status; /* rank_create fails with it (and create_errno) */
    int create_errno;
    int destroy_calls;

    int setup_calls;
    ovl_status_t setup_status; /* job_setup fails at once with it */
    bool setup_collective;     /* what the last job_setup was asked */
    ovld_setup_cb setup_cb;    /* a setup under way: the test ends it */
    void *setup_arg;
    struct ovld_rank *setup_ranks[MAXCL];
    uint32_t setup_n;

    int teardown_calls;
    struct ovld_rank *teardown_ranks[MAXCL];
    uint32_t teardown_n;
    int teardown_outstanding; /* rings not yet delivered at the teardown */

    int release_calls;
    struct ovld_rank *release_rank[MAXMADE];
    uint64_t release_seq[MAXMADE];

    int scratch_calls;
    ovl_status_t scratch_status;
    struct {
        int serial;
        uint64_t bytes;
    } scratch_log[64];
    uint64_t scratch_have[MAXMADE + 1]; /* by serial: the largest given */
    int scratch_grown_under_work;       /* growths while rings were outstanding */

    int prim_calls;
    int fail_at; /* 1-based primitive call to fail; 0: none */
    ovl_status_t fail_status;
    char last_err[128];
    prim_t prims[4096];
    int prim_serial[4096];

    done_rec_t dones[MAXDONE];
    int ndone;
    bool deliver_now; /* done completes at once, under the call */

    int mem_releases;
    uint64_t gemm_n[64]; /* each GEMM's n, in issue order */
    int ngemm;
} M;

static ovld_backend_t mock;
static char scratch_mem[1 << 12];
static bool trace;

/* The buffers every client registers: a one-B op's (a, b, c, a_out); an
 * op's further Bs and Cs are views of its b and c. */
#define TBUF OVLD_BUF_B1

/* The test's world: config, counters, jobs, buffers, clients. */
typedef struct client {
    ovld_member_t *m;
    struct ovld_rank *br;
    uint32_t rank, device;
    bool joined; /* m is ours (not yet left) */
    bool open;   /* its table holds its buffers */
    bool opened; /* it registered buffers in this test */
    ovld_registry_t table;
    ovld_reg_t *reg[TBUF];
    int released[TBUF]; /* mem_release of each buffer */
    float mem[TBUF][MEMF];
} client_t;

static struct fixture {
    ovld_config_t cfg;
    ovld_counters_t counters;
    ovld_jobs_t jobs;
    ovld_buffers_t bs;
    client_t cl[MAXCL];
} F;

static int outstanding(void)
{
    int n = 0;
    for (int i = 0; i < M.ndone; i++)
        n += !M.dones[i].delivered;
    return n;
}

static uint32_t m_device_count(ovld_backend_t *b)
{
    (void)b;
    return NDEV;
}

static void dev_uuid(uint32_t i, uint8_t *uuid)
{
    memset(uuid, 0, OVLD_UUID_LEN);
    uuid[0] = 0xa0;
    uuid[15] = (uint8_t)(i + 1);
}

static void m_device_info(ovld_backend_t *b, uint32_t i, ovld_device_info_t *ret)
{
    (void)b;
    memset(ret, 0, sizeof(*ret));
    dev_uuid(i, ret->uuid);
    snprintf(ret->name, sizeof(ret->name), "mock %u", i);
}

static void m_mem_release(ovld_backend_t *b, ovld_bmem_t *mem, bool may_block)
{
    (void)b;
    assert_false(may_block);
    int *count = (int *)(void *)mem; /* the client's released[] entry */
    (*count)++;
    M.mem_releases++;
}

static ovl_status_t m_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret,
                                  ovld_doorbell_export_t *db, char *err, size_t errlen)
{
    (void)b;
    (void)err; /* no words: the job's message falls back on the status and errno */
    (void)errlen;
    assert_true(device < NDEV);
    if (M.create_status != OVL_OK) {
        errno = M.create_errno;
        return M.create_status;
    }
    assert_true(M.nmade < MAXMADE);
    struct ovld_rank *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    r->serial = ++M.nmade;
    r->device = device;
    M.made[r->serial - 1] = r;
    M.nlive++;
    *db = (ovld_doorbell_export_t){.fd = -1, .offset = (uint64_t)r->serial * 64};
    *ret = r;
    return OVL_OK;
}

static void rank_gone(struct ovld_rank *r)
{
    if (!r)
        return;
    if (r->destroyed)
        fail_msg("backend rank %d destroyed twice", r->serial);
    r->destroyed = true;
    M.nlive--;
}

static void m_rank_destroy(ovld_backend_t *b, ovld_rank_t *r)
{
    (void)b;
    M.destroy_calls++;
    rank_gone(r);
}

static ovl_status_t m_job_setup(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                                const ovld_job_net_t *net, bool collective, ovld_setup_cb cb,
                                void *arg)
{
    (void)b;
    assert_null(net);
    M.setup_calls++;
    assert_true(n <= MAXCL);
    M.setup_n = n;
    M.setup_collective = collective;
    for (uint32_t i = 0; i < n; i++)
        M.setup_ranks[i] = ranks[i];
    if (M.setup_status != OVL_OK)
        return M.setup_status;
    assert_null(M.setup_cb); /* one setup at a time in these tests */
    M.setup_cb = cb;
    M.setup_arg = arg;
    return OVL_OK;
}

static void m_job_teardown(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n)
{
    (void)b;
    M.teardown_calls++;
    assert_true(n <= MAXCL);
    M.teardown_n = n;
    M.teardown_outstanding = outstanding();
    for (uint32_t i = 0; i < n; i++) {
        M.teardown_ranks[i] = ranks[i];
        rank_gone(ranks[i]);
    }
}

static void m_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi)
{
    (void)b;
    M.release_rank[M.release_calls] = r;
    M.release_seq[M.release_calls] = seq_hi;
    M.release_calls++;
}

static ovl_status_t m_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes, void **ret,
                                   char *err, size_t errlen)
{
    (void)b;
    (void)err; /* no words: the job's message falls back on the status */
    (void)errlen;
    assert_true(M.scratch_calls < 64);
    M.scratch_log[M.scratch_calls].serial = r->serial;
    M.scratch_log[M.scratch_calls].bytes = bytes;
    M.scratch_calls++;
    if (M.scratch_status != OVL_OK)
        return M.scratch_status;
    if (bytes > M.scratch_have[r->serial]) {
        /* the backend frees the old scratch: nothing issued may use it */
        if (outstanding() > 0)
            M.scratch_grown_under_work++;
        M.scratch_have[r->serial] = bytes;
    }
    *ret = scratch_mem;
    return OVL_OK;
}

static ovl_status_t prim(prim_t kind, const ovld_rank_t *r)
{
    int i = M.prim_calls++;
    assert_true(i < 4096);
    M.prims[i] = kind;
    M.prim_serial[i] = r ? r->serial : -1;
    if (trace)
        fprintf(stderr, "  prim %d: kind %d rank serial %d\n", i + 1, (int)kind, M.prim_serial[i]);
    if (M.fail_at == M.prim_calls) {
        snprintf(M.last_err, sizeof(M.last_err), "mock: call %d failed", M.prim_calls);
        return M.fail_status;
    }
    return OVL_OK;
}

static ovl_status_t m_reserve_events(ovld_rank_t *r, uint32_t n)
{
    (void)r;
    (void)n;
    return OVL_OK;
}

static ovl_status_t m_wait_ready(ovld_rank_t *r, uint32_t s, uint64_t seq)
{
    (void)s;
    (void)seq;
    return prim(P_WAIT_READY, r);
}

static ovl_status_t m_record(ovld_rank_t *r, uint32_t s, uint32_t ev)
{
    (void)s;
    (void)ev;
    return prim(P_RECORD, r);
}

static ovl_status_t m_wait(ovld_rank_t *r, uint32_t s, ovld_rank_t *owner, uint32_t ev)
{
    (void)s;
    (void)owner;
    (void)ev;
    return prim(P_WAIT, r);
}

static ovl_status_t m_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                                const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                                ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag;
    assert_int_equal(nparts, world);
    (void)method;
    (void)dtype;
    (void)rows;
    (void)cols;
    (void)stride;
    for (uint32_t i = 0; i < nparts; i++)
        assert_int_equal(parts[i].rank->rank, i); /* in rank order */
    M.allgathers_timed++;
    return prim(P_ALLGATHER, NULL);
}

static ovl_status_t m_copy(ovld_rank_t *r, uint32_t s, ovld_view_t dst, ovld_view_t src,
                           uint64_t rows, uint64_t cols, size_t elem)
{
    (void)s;
    (void)dst;
    (void)src;
    (void)rows;
    (void)cols;
    (void)elem;
    M.copies_timed++;
    return prim(P_COPY, r);
}

static ovl_status_t m_time_start(ovld_rank_t *r, uint32_t s, uint64_t seq)
{
    (void)r;
    (void)s;
    M.time_starts++;
    if (M.timed_seq != seq) {
        M.timed_seq = seq;
        M.copies_timed = M.allgathers_timed = 0;
    }
    return OVL_OK;
}

static ovl_status_t m_gemm(ovld_rank_t *r, uint32_t s, const ovld_gemm_args_t *g)
{
    (void)s;
    if (M.ngemm < 64)
        M.gemm_n[M.ngemm++] = g->n;
    return prim(P_GEMM, r);
}

static ovl_status_t m_sleep(ovld_rank_t *r, uint32_t s, uint32_t ns)
{
    (void)s;
    (void)ns;
    return prim(P_SLEEP, r);
}

static void deliver(int i);

static void m_done(ovld_rank_t *r, uint32_t s, uint64_t seq, ovl_status_t status,
                   const char *message, void *cookie)
{
    if (M.ndone >= MAXDONE)
        fail_msg("more than %d rings", MAXDONE);
    done_rec_t *d = &M.dones[M.ndone++];
    *d = (done_rec_t){.r = r, .stream = s, .seq = seq, .status = status, .cookie = cookie};
    /* a timed op's device time: plans that copy are made fast here */
    if (M.timed_seq == seq)
        d->ns = M.copies_timed ? 100 + M.copies_timed : 900 + M.allgathers_timed;
    d->has_msg = message != NULL;
    snprintf(d->msg, sizeof(d->msg), "%s", message ? message : "");
    if (trace)
        fprintf(stderr, "  done %d: rank %u (serial %d) seq %" PRIu64 " %s \"%s\"\n", M.ndone - 1,
                r->rank, r->serial, seq, ovl_strerror(status), d->msg);
    if (M.deliver_now)
        deliver(M.ndone - 1);
}

static const char *m_last_error(ovld_backend_t *b)
{
    (void)b;
    return M.last_err;
}

static const ovld_backend_ops_t mock_ops_full = {
    .name = "mock",
    .device_count = m_device_count,
    .device_info = m_device_info,
    .mem_release = m_mem_release,
    .rank_create = m_rank_create,
    .rank_destroy = m_rank_destroy,
    .job_setup = m_job_setup,
    .rank_release = m_rank_release,
    .job_teardown = m_job_teardown,
    .rank_scratch = m_rank_scratch,
    .reserve_events = m_reserve_events,
    .wait_ready = m_wait_ready,
    .time_start = m_time_start,
    .record = m_record,
    .wait = m_wait,
    .allgather = m_allgather,
    .copy = m_copy,
    .gemm = m_gemm,
    .sleep = m_sleep,
    .done = m_done,
    .last_error = m_last_error,
};
static ovld_backend_ops_t mock_ops;
static ovld_backend_t mock = {.ops = &mock_ops};

/* ------------------------------------------------------------- helpers */

/* Delivers ring i's completion as the backend reports it (its own status
 * and message). */
static void deliver_as(int i, ovl_status_t st, const char *msg)
{
    assert_true(i >= 0 && i < M.ndone);
    done_rec_t *d = &M.dones[i];
    if (d->delivered)
        fail_msg("ring %d delivered twice", i);
    d->delivered = true;
    ovld_job_on_done(&F.jobs, d->cookie, d->seq, st, msg, d->ns);
}

static void deliver(int i)
{
    deliver_as(i, M.dones[i].status, M.dones[i].has_msg ? M.dones[i].msg : NULL);
}

/* The ring of c's doorbell for op seq, or -1. */
static int ring_of(const client_t *c, uint64_t seq)
{
    for (int i = 0; i < M.ndone; i++)
        if (M.dones[i].r == c->br && M.dones[i].seq == seq)
            return i;
    return -1;
}

static void deliver_op(const client_t *c, uint64_t seq)
{
    int i = ring_of(c, seq);
    if (i < 0)
        fail_msg("rank %u's doorbell was not rung for op %" PRIu64, c->rank, seq);
    deliver(i);
}

static void deliver_all(void)
{
    for (int i = 0; i < M.ndone; i++) /* deliveries may ring more: M.ndone grows */
        if (!M.dones[i].delivered)
            deliver(i);
}

/* Ring i is c's, for op seq, with st and msg (NULL: none given). */
static void expect_ring(int i, const client_t *c, uint64_t seq, ovl_status_t st, const char *msg)
{
    if (i >= M.ndone)
        fail_msg("ring %d expected (rank %u, op %" PRIu64 "), only %d rung", i, c->rank, seq,
                 M.ndone);
    const done_rec_t *d = &M.dones[i];
    bool msg_ok = msg ? d->has_msg && strcmp(d->msg, msg) == 0 : !d->has_msg;
    if (d->r != c->br || d->seq != seq || d->status != st || !msg_ok)
        fail_msg("ring %d: rank %u op %" PRIu64 " %s \"%s\"; expected rank %u op %" PRIu64
                 " %s \"%s\"",
                 i, d->r->rank, d->seq, ovl_strerror(d->status), d->has_msg ? d->msg : "(none)",
                 c->rank, seq, ovl_strerror(st), msg ? msg : "(none)");
}

static void expect_str(const char *got, const char *want)
{
    if (strcmp(got, want) != 0)
        fail_msg("got \"%s\"\n  expected \"%s\"", got, want);
}

static void client_open(client_t *c, uint32_t device)
{
    assert_int_equal(ovld_registry_init(&c->table), OVL_OK);
    for (int b = 0; b < TBUF; b++) {
        ovld_reg_t *reg = ovld_buf_new(&F.bs);
        assert_non_null(reg);
        reg->ptr = c->mem[b];
        reg->bytes = sizeof(c->mem[b]);
        reg->client_addr = 0x7f0000000000u + (uint64_t)b * 0x100000u;
        reg->device = (int)device;
        reg->bmem = &c->released[b];
        assert_int_equal(ovld_buf_register(&c->table, reg), OVL_OK);
        c->reg[b] = reg;
    }
    c->open = c->opened = true;
}

/* The connection goes: its table lets go of its buffers (ops may still
 * hold them). */
static void client_close(client_t *c)
{
    for (int b = 0; b < TBUF; b++) {
        ovld_buf_unregister(&c->table, c->reg[b]);
        c->reg[b] = NULL;
    }
    ovld_registry_fini(&c->table);
    c->open = false;
}

/* References of each of c's buffers (the table's and the ops'). */
static void expect_refs(const client_t *c, uint32_t refs)
{
    for (int b = 0; b < TBUF; b++)
        if (c->reg[b]->refs != refs)
            fail_msg("rank %u's %s has %u references, expected %u", c->rank,
                     ovld_buf_name(OVLD_KIND_AG_GEMM, b), c->reg[b]->refs, refs);
}

static ovl_status_t join_as(client_t *c, const char *job, uint32_t world, uint32_t rank,
                            uint32_t dev, uid_t uid, char *err, size_t errlen)
{
    ovld_join_desc_t d = {.world = world, .rank = rank, .uid = uid, .pid = (pid_t)(100 + rank)};
    snprintf(d.job_id, sizeof(d.job_id), "%s", job);
    dev_uuid(dev, d.device_uuid);
    ovld_doorbell_export_t db = {.fd = -1};
    ovld_member_t *m = NULL;
    int made = M.nmade;
    err[0] = '\0';
    ovl_status_t st = ovld_job_join(&F.jobs, &d, &m, &db, err, errlen);
    if (st != OVL_OK) {
        assert_int_equal(M.nmade, made); /* no backend rank is left behind */
        return st;
    }
    assert_non_null(m);
    assert_int_equal(M.nmade, made + 1);
    c->m = m;
    c->br = M.made[M.nmade - 1];
    c->br->rank = rank;
    c->rank = rank;
    c->device = dev;
    c->joined = true;
    assert_int_equal(c->br->device, dev);
    assert_int_equal(db.offset, (uint64_t)c->br->serial * 64);
    if (!c->open)
        client_open(c, dev);
    return OVL_OK;
}

/* Joins rank `rank` of job on device dev, as UID. */
static void join_ok(client_t *c, const char *job, uint32_t world, uint32_t rank, uint32_t dev)
{
    char err[256];
    ovl_status_t st = join_as(c, job, world, rank, dev, UID, err, sizeof(err));
    if (st != OVL_OK)
        fail_msg("join %s rank %u: %s: %s", job, rank, ovl_strerror(st), err);
}

static void join_fails(client_t *c, const char *job, uint32_t world, uint32_t rank, uint32_t dev,
                       uid_t uid, ovl_status_t want, const char *want_msg)
{
    char err[256];
    ovl_status_t st = join_as(c, job, world, rank, dev, uid, err, sizeof(err));
    if (st != want)
        fail_msg("join %s rank %u: %s (%s), expected %s", job, rank, ovl_strerror(st), err,
                 ovl_strerror(want));
    expect_str(err, want_msg);
}

static void leave(client_t *c, const char *why)
{
    assert_true(c->joined);
    c->joined = false;
    ovld_job_leave(&F.jobs, c->m, why);
    c->m = NULL;
}

/* Ends the setup under way. */
static void setup_finish(ovl_status_t st, const char *msg)
{
    assert_non_null(M.setup_cb);
    ovld_setup_cb cb = M.setup_cb;
    void *arg = M.setup_arg;
    M.setup_cb = NULL;
    M.setup_arg = NULL;
    cb(arg, st, msg);
}

/* cl[0] and cl[1] as ranks 0 and 1 of job "train" on devices 0 and 1,
 * set up. */
static void ready2(void)
{
    join_ok(&F.cl[0], "train", 2, 0, 0);
    join_ok(&F.cl[1], "train", 2, 1, 1);
    setup_finish(OVL_OK, NULL);
}

typedef struct opspec {
    uint64_t m, n, k;
    uint32_t nb;                      /* 0: one B */
    uint64_t n_more[OVLD_MAX_BS - 1]; /* B i's n (B i and C i live in B's and C's buffers) */
    uint32_t dtype, algo, chunks, streams;
    bool transb;
    bool no_aout;        /* gather into ovld's scratch */
    bool no_resolve;     /* hand the op over without buffers (shapes no buffer holds) */
    uint64_t b_id;       /* B names this buffer id instead of the client's */
    ovl_status_t fields; /* the boundary's verdict on the fields */
    const char *fields_msg;
} opspec_t;

/* A small op that gathers into a_out: no scratch. */
static opspec_t base(void)
{
    return (opspec_t){.m = 4, .n = 4, .k = 4, .dtype = OVL_DTYPE_FP32, .algo = OVL_ALGO_NAIVE};
}

/* Submits op seq of c as dispatch.c's on_op does. */
static ovl_status_t submit_as(client_t *c, uint64_t seq, opspec_t s, char *err, size_t errlen)
{
    ovld_op_desc_t q = {.kind = OVLD_KIND_AG_GEMM,
                        .comm_id = ovld_member_comm_id(c->m),
                        .seq = seq,
                        .ag = {.m = s.m,
                               .n = s.n,
                               .k = s.k,
                               .dtype = s.dtype,
                               .algo = s.algo,
                               .chunks = s.chunks,
                               .streams = s.streams,
                               .transb = s.transb}};
    const uint64_t ld[TBUF] = {s.k, s.transb ? s.k : s.n, s.n, s.k};
    for (int b = 0; b < TBUF; b++)
        q.buf[b] = (ovld_buf_ref_t){
            .given = !(b == OVLD_BUF_AOUT && s.no_aout), .mem_id = c->reg[b]->id, .ld = ld[b]};
    q.ag.nb = s.nb;
    for (uint32_t i = 1; i < s.nb; i++) {
        uint64_t n = s.n_more[i - 1];
        q.ag.n_more[i - 1] = n;
        q.buf[ovld_buf_b(i)] = (ovld_buf_ref_t){
            .given = true, .mem_id = c->reg[OVLD_BUF_B]->id, .ld = s.transb ? s.k : n};
        q.buf[ovld_buf_c(i)] =
            (ovld_buf_ref_t){.given = true, .mem_id = c->reg[OVLD_BUF_C]->id, .ld = n};
    }
    if (s.b_id)
        q.buf[OVLD_BUF_B].mem_id = s.b_id;
    char bufs_msg[256] = "";
    ovld_op_verdict_t v = {.fields = s.fields, .fields_msg = s.fields_msg, .bufs = OVL_OK};
    if (s.fields == OVL_OK && !s.no_resolve) {
        v.bufs = ovld_buf_resolve_op(&c->table, ovld_member_world(c->m), ovld_member_device(c->m),
                                     &q, bufs_msg, sizeof(bufs_msg));
        v.bufs_msg = bufs_msg;
    }
    err[0] = '\0';
    return ovld_job_submit(&F.jobs, c->m, &q, &v, err, errlen);
}

static void submit(client_t *c, uint64_t seq, opspec_t s)
{
    char err[256];
    ovl_status_t st = submit_as(c, seq, s, err, sizeof(err));
    if (st != OVL_OK)
        fail_msg("rank %u op %" PRIu64 ": %s: %s", c->rank, seq, ovl_strerror(st), err);
}

/* Both ranks of ready2()'s job submit op seq. */
static void submit2(uint64_t seq, opspec_t s)
{
    submit(&F.cl[0], seq, s);
    submit(&F.cl[1], seq, s);
}

/* A live job as ovld_jobs_foreach reports it. */
typedef struct jinfo {
    char id[OVLD_JOB_ID_MAX + 1];
    uid_t owner;
    uint32_t world, joined;
    ovld_job_state_t state;
    uint64_t ops_done;
    uint32_t in_flight;
    char last_error[256];
} jinfo_t;

static jinfo_t JI[8];
static int NJI;

static void collect(const ovld_job_info_t *info, void *arg)
{
    (void)arg;
    assert_true(NJI < 8);
    jinfo_t *ji = &JI[NJI++];
    snprintf(ji->id, sizeof(ji->id), "%s", info->id);
    ji->owner = info->owner;
    ji->world = info->world;
    ji->joined = info->joined;
    ji->state = info->state;
    ji->ops_done = info->ops_done;
    ji->in_flight = info->in_flight;
    snprintf(ji->last_error, sizeof(ji->last_error), "%s", info->last_error);
}

static int list_jobs(void)
{
    NJI = 0;
    ovld_jobs_foreach(&F.jobs, collect, NULL);
    return NJI;
}

/* The live job `id` (fails if there is none). */
static const jinfo_t *job_info(const char *id)
{
    list_jobs();
    for (int i = 0; i < NJI; i++)
        if (strcmp(JI[i].id, id) == 0)
            return &JI[i];
    fail_msg("no live job '%s'", id);
    return NULL;
}

static void expect_state(const char *id, ovld_job_state_t st)
{
    const jinfo_t *ji = job_info(id);
    if (ji->state != st)
        fail_msg("job '%s' is %s, expected %s", id, ovld_job_state_name(ji->state),
                 ovld_job_state_name(st));
}

static void expect_member_error(const client_t *c, ovl_status_t st, uint64_t seq, const char *msg)
{
    ovl_status_t got;
    uint64_t got_seq;
    const char *got_msg;
    ovld_member_error(c->m, &got, &got_seq, &got_msg);
    if (got != st || got_seq != seq || strcmp(got_msg, msg) != 0)
        fail_msg("rank %u's error: %s op %" PRIu64 " \"%s\"; expected %s op %" PRIu64 " \"%s\"",
                 c->rank, ovl_strerror(got), got_seq, got_msg, ovl_strerror(st), seq, msg);
}

static uint64_t errors(ovl_status_t st)
{
    assert_int_equal(F.counters.total.errors[-st], F.counters.window.errors[-st]);
    return F.counters.total.errors[-st];
}

static uint64_t ops_failed(void)
{
    assert_int_equal(F.counters.total.ops_failed, F.counters.window.ops_failed);
    return F.counters.total.ops_failed;
}

/* Ops done of (algo, dtype): every op here is an all-gather + GEMM, and
 * counts in that kind's cells. */
static uint64_t ops_ok(ovl_algo_t algo, ovl_dtype_t dtype)
{
    const ovld_stats_t *t = &F.counters.total, *w = &F.counters.window;
    assert_int_equal(t->ops[OVL_OP_AG_GEMM][algo][dtype], w->ops[OVL_OP_AG_GEMM][algo][dtype]);
    assert_int_equal(t->ops[0][algo][dtype], 0); /* kind none */
    return t->ops[OVL_OP_AG_GEMM][algo][dtype];
}

/* Each backend rank's doorbell rung with strictly increasing op numbers:
 * every op once, in order. */
static void check_doorbells(void)
{
    for (int s = 1; s <= M.nmade; s++) {
        uint64_t last = 0;
        for (int i = 0; i < M.ndone; i++) {
            if (M.dones[i].r->serial != s)
                continue;
            if (M.dones[i].seq <= last)
                fail_msg("rank serial %d rung op %" PRIu64 " after op %" PRIu64, s, M.dones[i].seq,
                         last);
            last = M.dones[i].seq;
        }
    }
}

/* The end of every test: every rank leaves and every completion comes
 * back; then nothing is left anywhere. */
static void finish(void)
{
    for (int c = 0; c < MAXCL; c++)
        if (F.cl[c].joined)
            leave(&F.cl[c], "test over");
    while (outstanding() > 0 || M.setup_cb) {
        deliver_all();
        if (M.setup_cb)
            setup_finish(OVL_OK, NULL);
    }
    assert_true(ovld_jobs_empty(&F.jobs));
    assert_int_equal(ovld_job_running(&F.jobs), 0);
    assert_int_equal(list_jobs(), 0);
    assert_int_equal(M.nlive, 0); /* every backend rank destroyed, once */
    for (int c = 0; c < MAXCL; c++)
        if (F.cl[c].open)
            client_close(&F.cl[c]);
    for (int c = 0; c < MAXCL; c++)
        for (int b = 0; b < TBUF; b++)
            if (F.cl[c].released[b] != (F.cl[c].opened ? 1 : 0))
                fail_msg("client %d's %s released %d times", c, ovld_buf_name(OVLD_KIND_AG_GEMM, b),
                         F.cl[c].released[b]);
    check_doorbells();
    assert_int_equal(M.scratch_grown_under_work, 0);
}

static int setup(void **state)
{
    (void)state;
    memset(&M, 0, sizeof(M));
    mock_ops = mock_ops_full;
    memset(&F, 0, sizeof(F));
    ovld_config_defaults(&F.cfg);
    ovld_jobs_init(&F.jobs, &mock, &F.cfg, &F.counters, NULL, NULL, NULL);
    ovld_buffers_init(&F.bs, &mock);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < M.nmade; i++)
        free(M.made[i]);
    M.nmade = 0;
    return 0;
}

/* ---------------------------------------------------------------- join */

/* World 2: the job forms, then its setup gets both ranks in rank order
 * (whatever order they joined in), and the job is ready when it ends. */
static void test_join_forms_job(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    join_ok(c1, "train", 2, 1, 1);
    assert_int_equal(M.setup_calls, 0);
    const jinfo_t *ji = job_info("train");
    assert_int_equal(ji->owner, UID);
    assert_int_equal(ji->world, 2);
    assert_int_equal(ji->joined, 1);
    assert_int_equal(ji->state, OVLD_JOB_FORMING);
    assert_int_equal(ovld_job_running(&F.jobs), 0);

    join_ok(c0, "train", 2, 0, 0);
    assert_int_equal(M.setup_calls, 1);
    assert_int_equal(M.setup_n, 2);
    assert_ptr_equal(M.setup_ranks[0], c0->br);
    assert_ptr_equal(M.setup_ranks[1], c1->br);
    expect_state("train", OVLD_JOB_SETUP);
    assert_int_equal(job_info("train")->joined, 2);
    assert_int_equal(ovld_job_running(&F.jobs), 1); /* the setup */
    assert_false(ovld_jobs_empty(&F.jobs));

    setup_finish(OVL_OK, NULL);
    expect_state("train", OVLD_JOB_READY);
    assert_int_equal(ovld_job_running(&F.jobs), 0);
    assert_int_equal(M.setup_calls, 1);

    /* what callers see of a member */
    assert_int_equal(ovld_member_comm_id(c1->m), 1);
    assert_int_equal(ovld_member_comm_id(c0->m), 2);
    assert_int_equal(ovld_member_rank(c0->m), 0);
    assert_int_equal(ovld_member_rank(c1->m), 1);
    assert_int_equal(ovld_member_device(c0->m), 0);
    assert_int_equal(ovld_member_device(c1->m), 1);
    assert_int_equal(ovld_member_world(c0->m), 2);
    assert_string_equal(ovld_member_job_id(c1->m), "train");
    expect_member_error(c0, OVL_OK, 0, "");
    assert_string_equal(job_info("train")->last_error, "");
    finish();
    assert_int_equal(M.teardown_calls, 1);
    assert_int_equal(M.destroy_calls, 0); /* job_teardown destroys them */
}

static void test_join_refusals(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *x = &F.cl[5];
    join_ok(c0, "train", 2, 0, 0);
    join_fails(x, "train", 2, 0, 1, UID, OVL_ERR_EXISTS,
               "rank 0 of job 'train' already joined (pid 100)");
    join_fails(x, "train", 3, 1, 1, UID, OVL_ERR_MISMATCH, "job 'train' has world 2, not 3");

    /* a device this node does not have */
    ovld_join_desc_t d = {.world = 2, .rank = 1, .uid = UID, .pid = 7};
    snprintf(d.job_id, sizeof(d.job_id), "train");
    dev_uuid(NDEV, d.device_uuid);
    char u[64], want[256], err[256];
    ovld_uuid_format(d.device_uuid, "", u, sizeof(u));
    snprintf(want, sizeof(want), "no device with UUID %s on this node", u);
    ovld_member_t *m = NULL;
    ovld_doorbell_export_t db;
    assert_int_equal(ovld_job_join(&F.jobs, &d, &m, &db, err, sizeof(err)), OVL_ERR_NOT_FOUND);
    expect_str(err, want);

    /* what the boundary should have refused */
    const char *unchecked = "internal error: CommInit not checked at the boundary";
    join_fails(x, "train", 0, 0, 1, UID, OVL_ERR_INTERNAL, unchecked);
    join_fails(x, "train", 2, 2, 1, UID, OVL_ERR_INTERNAL, unchecked);
    join_fails(x, "", 2, 1, 1, UID, OVL_ERR_INTERNAL, unchecked);
    join_fails(x, "train", OVL_PLAN_MAX_WORLD + 1, 1, 1, UID, OVL_ERR_INTERNAL, unchecked);

    /* the backend cannot make the rank: errno says why for a system error */
    M.create_status = OVL_ERR_SYSTEM;
    M.create_errno = ENOMEM;
    snprintf(want, sizeof(want),
             "device 1: cannot set up the rank: %s: %s (out of memory maps? see "
             "vm.max_map_count and max_mappings)",
             ovl_strerror(OVL_ERR_SYSTEM), strerror(ENOMEM));
    join_fails(x, "train", 2, 1, 1, UID, OVL_ERR_SYSTEM, want);
    M.create_errno = EIO;
    snprintf(want, sizeof(want), "device 1: cannot set up the rank: %s: %s",
             ovl_strerror(OVL_ERR_SYSTEM), strerror(EIO));
    join_fails(x, "train", 2, 1, 1, UID, OVL_ERR_SYSTEM, want);
    /* a job made for the rank goes with it */
    M.create_status = OVL_ERR_BACKEND;
    snprintf(want, sizeof(want), "device 2: cannot set up the rank: %s",
             ovl_strerror(OVL_ERR_BACKEND));
    join_fails(x, "other", 2, 0, 2, UID, OVL_ERR_BACKEND, want);
    assert_int_equal(list_jobs(), 1);
    assert_int_equal(M.teardown_calls, 1); /* of the job that never had a rank */
    assert_int_equal(M.teardown_n, 2);
    assert_null(M.teardown_ranks[0]);
    assert_null(M.teardown_ranks[1]);
    M.create_status = OVL_OK;

    /* none of it touched the job */
    const jinfo_t *ji = job_info("train");
    assert_int_equal(ji->joined, 1);
    assert_int_equal(ji->state, OVLD_JOB_FORMING);
    assert_int_equal(M.setup_calls, 0);
    join_ok(&F.cl[1], "train", 2, 1, 1);
    assert_int_equal(M.setup_calls, 1);
    finish();
}

static void test_join_limits(void **state)
{
    (void)state;
    char err[256];
    F.cfg.max_jobs = 2;
    F.cfg.max_jobs_per_uid = 1;
    F.cfg.max_ranks_per_uid = 2;
    client_t *a0 = &F.cl[0], *a1 = &F.cl[1], *b0 = &F.cl[2], *x = &F.cl[5];
    join_ok(a0, "a", 2, 0, 0);
    join_fails(x, "b", 2, 0, 1, UID, OVL_ERR_LIMIT, "uid 1000 has 1 jobs (max_jobs_per_uid = 1)");
    /* another user's job of the same name is another job */
    assert_int_equal(join_as(b0, "a", 2, 0, 2, UID + 1, err, sizeof(err)), OVL_OK);
    assert_int_equal(list_jobs(), 2);
    join_fails(x, "c", 2, 0, 3, UID + 2, OVL_ERR_LIMIT, "too many jobs (max_jobs = 2)");

    join_ok(a1, "a", 2, 1, 1);
    setup_finish(OVL_OK, NULL);
    join_fails(x, "a", 2, 1, 3, UID, OVL_ERR_LIMIT,
               "uid 1000 holds 2 ranks (max_ranks_per_uid = 2)");

    /* uid 1000's job ends with an op still completing: its ranks still
     * count, its id and its place among max_jobs do not */
    submit(a0, 1, base());
    submit(a1, 1, base());
    assert_int_equal(M.ndone, 2);
    leave(a0, "CommDestroy");
    leave(a1, "CommDestroy");
    assert_int_equal(list_jobs(), 1);
    assert_int_equal(ovld_job_running(&F.jobs), 1);
    join_fails(x, "a", 2, 0, 3, UID, OVL_ERR_LIMIT,
               "uid 1000 holds 2 ranks (max_ranks_per_uid = 2)");
    assert_int_equal(join_as(x, "c", 2, 0, 3, UID + 2, err, sizeof(err)), OVL_OK);
    assert_int_equal(list_jobs(), 2);
    deliver_all();
    assert_int_equal(M.teardown_calls, 1);
    leave(x, "CommDestroy"); /* "c" forms no more: a place among max_jobs */
    assert_int_equal(M.teardown_calls, 2);
    /* now uid 1000 may join "a" again: a new job */
    client_t *n0 = &F.cl[6];
    join_ok(n0, "a", 2, 0, 1);
    const jinfo_t *ji = job_info("a");
    assert_int_equal(ji->state, OVLD_JOB_FORMING);
    assert_int_equal(ji->ops_done, 0);
    finish();
}

/* ------------------------------------------------------- setup failures */

static void test_setup_fails_at_once(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    M.setup_status = OVL_ERR_BACKEND;
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 1);
    assert_int_equal(M.setup_calls, 1);
    char why[256], msg[300];
    snprintf(why, sizeof(why), "backend setup failed: %s", ovl_strerror(OVL_ERR_BACKEND));
    expect_state("train", OVLD_JOB_ABORTED);
    expect_str(job_info("train")->last_error, why);
    assert_int_equal(ovld_job_running(&F.jobs), 0);

    /* ops are refused on the rank's doorbell, not the connection */
    submit(c0, 1, base());
    snprintf(msg, sizeof(msg), "job aborted: %s", why);
    assert_int_equal(M.ndone, 1);
    expect_ring(0, c0, 1, OVL_ERR_ABORTED, msg);
    expect_refs(c0, 1); /* a refused op holds nothing */
    expect_member_error(c0, OVL_ERR_ABORTED, 1, msg);
    expect_member_error(c1, OVL_OK, 0, "");
    assert_int_equal(errors(OVL_ERR_ABORTED), 1);
    assert_int_equal(ops_failed(), 0); /* a refusal is not an op */
    assert_int_equal(M.prim_calls, 0);
    assert_int_equal(ovld_job_running(&F.jobs), 1);
    deliver(0);
    assert_int_equal(ovld_job_running(&F.jobs), 0);
    submit(c1, 1, base());
    expect_ring(1, c1, 1, OVL_ERR_ABORTED, msg);
    submit(c0, 2, base());
    expect_ring(2, c0, 2, OVL_ERR_ABORTED, msg);
    assert_int_equal(errors(OVL_ERR_ABORTED), 3);
    /* the job still holds its ranks until they leave */
    char want[512];
    snprintf(want, sizeof(want), "job 'train' is aborted (%s); it ends when its ranks leave", why);
    join_fails(&F.cl[5], "train", 2, 1, 2, UID, OVL_ERR_ABORTED, want);
    finish();
}

static void test_setup_fails_later(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 1);
    /* ops submitted during the setup wait for it */
    submit2(1, base());
    assert_int_equal(M.ndone, 0);
    assert_int_equal(M.prim_calls, 0);
    assert_int_equal(ovld_job_running(&F.jobs), 2); /* the op and the setup */
    expect_refs(c0, 2);

    setup_finish(OVL_ERR_BACKEND, "ncclCommInitRank: unhandled system error");
    const char *why = "backend setup failed: ncclCommInitRank: unhandled system error";
    char msg[300], last[300];
    snprintf(msg, sizeof(msg), "job aborted: %s", why);
    expect_state("train", OVLD_JOB_ABORTED);
    /* the waiting op fails on both ranks */
    assert_int_equal(M.ndone, 2);
    expect_ring(0, c0, 1, OVL_ERR_ABORTED, msg);
    expect_ring(1, c1, 1, OVL_ERR_ABORTED, msg);
    assert_int_equal(M.prim_calls, 0);
    /* the job's last error stays the reason it ended: the ops it fails
     * do not nest their words in it */
    snprintf(last, sizeof(last), "%s", why);
    expect_str(job_info("train")->last_error, last);
    expect_member_error(c0, OVL_ERR_ABORTED, 1, msg);
    expect_member_error(c1, OVL_ERR_ABORTED, 1, msg);
    deliver_all();
    expect_refs(c0, 1);
    expect_refs(c1, 1);
    assert_int_equal(ops_failed(), 1);
    assert_int_equal(errors(OVL_ERR_ABORTED), 1);

    /* later ops are refused */
    submit(c1, 2, base());
    char msg2[600];
    snprintf(msg2, sizeof(msg2), "job aborted: %s", last);
    expect_ring(2, c1, 2, OVL_ERR_ABORTED, msg2);
    expect_refs(c1, 1);
    finish();
}

static void test_setup_ok_runs_waiting_ops(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 1);
    submit2(1, base());
    submit(c0, 2, base());
    assert_int_equal(M.ndone, 0);
    setup_finish(OVL_OK, NULL);
    assert_int_equal(M.ndone, 2);
    expect_ring(0, c0, 1, OVL_OK, NULL);
    expect_ring(1, c1, 1, OVL_OK, NULL);
    submit(c1, 2, base());
    expect_ring(2, c0, 2, OVL_OK, NULL);
    expect_ring(3, c1, 2, OVL_OK, NULL);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 2);
    finish();
}

/* ------------------------------------------------------------ matching */

/* Ranks of one job on one device (several ranks on one GPU): they join,
 * the backend is told to make no collective, and ops gather by the copy
 * engine (no ALLGATHER primitive is asked for, whatever the allgather
 * setting), every rank's done rung once. */
static void test_ranks_share_a_device(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    F.cfg.allgather = OVL_AG_NCCL; /* a preference NCCL cannot serve here */
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 0);
    assert_int_equal(M.setup_calls, 1);
    assert_false(M.setup_collective);
    setup_finish(OVL_OK, NULL);
    expect_state("train", OVLD_JOB_READY);
    submit2(1, base());
    assert_true(M.prim_calls > 0);
    int copies = 0;
    for (int i = 0; i < M.prim_calls; i++) {
        assert_int_not_equal(M.prims[i], P_ALLGATHER);
        copies += M.prims[i] == P_COPY;
    }
    assert_true(copies >= 2); /* each rank pulls its peer's shard */
    assert_int_equal(M.ndone, 2);
    expect_ring(0, c0, 1, OVL_OK, NULL);
    expect_ring(1, c1, 1, OVL_OK, NULL);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 1);
    finish();
}

/* Ranks on distinct devices: the backend makes its collective. */
static void test_distinct_devices_collective(void **state)
{
    (void)state;
    ready2();
    assert_true(M.setup_collective);
    finish();
}

static void test_op_waits_for_every_rank(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    expect_refs(c0, 1);
    submit(c0, 1, base());
    assert_int_equal(M.ndone, 0);
    assert_int_equal(M.prim_calls, 0);
    expect_refs(c0, 2); /* the op holds rank 0's buffers */
    expect_refs(c1, 1);
    assert_int_equal(job_info("train")->in_flight, 1);
    assert_int_equal(ovld_job_running(&F.jobs), 1);

    submit(c1, 1, base());
    assert_true(M.prim_calls > 0);
    assert_int_equal(M.prims[0], P_WAIT_READY);
    assert_int_equal(M.prim_serial[0], c0->br->serial);
    assert_int_equal(M.ndone, 2);
    expect_ring(0, c0, 1, OVL_OK, NULL);
    expect_ring(1, c1, 1, OVL_OK, NULL);
    expect_refs(c0, 2);
    expect_refs(c1, 2);
    assert_int_equal(M.scratch_calls, 0); /* a_out given */

    deliver(0);
    expect_refs(c0, 2); /* the op holds both ranks' until it is done */
    assert_int_equal(job_info("train")->ops_done, 0);
    deliver(1);
    expect_refs(c0, 1);
    expect_refs(c1, 1);
    const jinfo_t *ji = job_info("train");
    assert_int_equal(ji->ops_done, 1);
    assert_int_equal(ji->in_flight, 0);
    assert_int_equal(ops_ok(OVL_ALGO_NAIVE, OVL_DTYPE_FP32), 1);
    assert_int_equal(ops_failed(), 0);
    assert_int_equal(F.counters.total.latency.count, 1);
    assert_int_equal(F.counters.total.issue.count, 1);
    expect_member_error(c0, OVL_OK, 0, "");

    /* rank 1 first this time; AUTO runs the config's default */
    F.cfg.default_algo = OVL_ALGO_RING;
    opspec_t s = base();
    s.algo = OVL_ALGO_AUTO;
    submit(c1, 2, s);
    assert_int_equal(M.ndone, 2);
    submit(c0, 2, s);
    expect_ring(2, c0, 2, OVL_OK, NULL);
    expect_ring(3, c1, 2, OVL_OK, NULL);
    deliver(3);
    deliver(2);
    assert_int_equal(ops_ok(OVL_ALGO_RING, OVL_DTYPE_FP32), 1);
    assert_int_equal(job_info("train")->ops_done, 2);
    finish();
}

/* Op i disagrees on field i: it fails on both ranks, and the job goes on. */
/* An op of 3 Bs runs: the planner gets every B's n, one GEMM per B per
 * rank (naive), each into its own C; the references go when it is done. */
static void test_multi_b_runs(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    opspec_t b3 = base();
    b3.nb = 3;
    b3.n_more[0] = 2;
    b3.n_more[1] = 3;
    submit2(1, b3);
    assert_int_equal(M.ngemm, 6);
    static const uint64_t want[6] = {4, 2, 3, 4, 2, 3};
    for (int i = 0; i < 6; i++)
        assert_int_equal(M.gemm_n[i], want[i]);
    deliver_all();
    expect_refs(c0, 1);
    expect_refs(c1, 1);
    expect_state("train", OVLD_JOB_READY);
    finish();
}

static void test_mismatch(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    typedef struct {
        const char *msg;
        opspec_t theirs; /* rank 1's */
    } case_t;
    opspec_t b = base();
    case_t cs[11];
    for (int i = 0; i < 11; i++)
        cs[i].theirs = b;
    cs[0].theirs.m = 8;
    cs[0].msg = "ranks disagree on m: rank 1 has 8, rank 0 has 4";
    cs[1].theirs.n = 8;
    cs[1].msg = "ranks disagree on n: rank 1 has 8, rank 0 has 4";
    cs[2].theirs.k = 8;
    cs[2].msg = "ranks disagree on k: rank 1 has 8, rank 0 has 4";
    cs[3].theirs.dtype = OVL_DTYPE_FP16;
    cs[3].msg = "ranks disagree on dtype: rank 1 has 1, rank 0 has 2";
    cs[4].theirs.transb = true;
    cs[4].msg = "ranks disagree on transb: rank 1 has 1, rank 0 has 0";
    cs[5].theirs.algo = OVL_ALGO_RING;
    cs[5].msg = "ranks disagree on algo: rank 1 has 3, rank 0 has 1";
    cs[6].theirs.chunks = 2;
    cs[6].msg = "ranks disagree on chunks: rank 1 has 2, rank 0 has 0";
    cs[7].theirs.streams = 2;
    cs[7].msg = "ranks disagree on streams: rank 1 has 2, rank 0 has 0";
    cs[8].theirs.no_aout = true;
    cs[8].msg = "ranks disagree on a_out (given or not): rank 1 has 0, rank 0 has 1";
    /* several Bs: rank 0 has B0..B2 of n 4, 2 and 3 */
    opspec_t b3 = b;
    b3.nb = 3;
    b3.n_more[0] = 2;
    b3.n_more[1] = 3;
    cs[9].theirs = b3;
    cs[9].theirs.nb = 2;
    cs[9].msg = "ranks disagree on nb: rank 1 has 2, rank 0 has 3";
    cs[10].theirs = b3;
    cs[10].theirs.n_more[1] = 1;
    cs[10].msg = "ranks disagree on n of B 2: rank 1 has 1, rank 0 has 3";
    uint64_t seq = 0;
    for (int i = 0; i < 11; i++) {
        seq++;
        int n = M.ndone, p = M.prim_calls;
        submit(c0, seq, i >= 9 ? b3 : b);
        submit(c1, seq, cs[i].theirs);
        assert_int_equal(M.ndone, n + 2);
        expect_ring(n, c0, seq, OVL_ERR_MISMATCH, cs[i].msg);
        expect_ring(n + 1, c1, seq, OVL_ERR_MISMATCH, cs[i].msg);
        assert_int_equal(M.prim_calls, p); /* nothing issued */
        expect_refs(c1, 1);                /* rank 1's were let go at once */
        if (i < 9)
            expect_refs(c0, 2); /* rank 0's until the op is done (b and c thrice with 3 Bs) */
        char last[300];
        snprintf(last, sizeof(last), "op %" PRIu64 ": %s", seq, cs[i].msg);
        expect_str(job_info("train")->last_error, last);
        expect_state("train", OVLD_JOB_READY);
        deliver(n + 1);
        deliver(n);
        expect_refs(c0, 1);
    }
    /* the second rank to submit is named first; only the first field that
     * differs is said */
    seq++;
    opspec_t big = b;
    big.m = 8;
    big.k = 8;
    int n = M.ndone;
    submit(c1, seq, big);
    submit(c0, seq, b);
    expect_ring(n, c0, seq, OVL_ERR_MISMATCH, "ranks disagree on m: rank 0 has 4, rank 1 has 8");
    expect_ring(n + 1, c1, seq, OVL_ERR_MISMATCH,
                "ranks disagree on m: rank 0 has 4, rank 1 has 8");
    deliver_all();
    /* an op they agree on runs */
    seq++;
    submit2(seq, b);
    expect_ring(M.ndone - 2, c0, seq, OVL_OK, NULL);
    expect_ring(M.ndone - 1, c1, seq, OVL_OK, NULL);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 1);
    assert_int_equal(ops_failed(), 12);
    assert_int_equal(errors(OVL_ERR_MISMATCH), 12);
    expect_member_error(c0, OVL_ERR_MISMATCH, 1, cs[0].msg); /* the first failure */
    expect_member_error(c1, OVL_ERR_MISMATCH, 1, cs[0].msg);
    finish();
}

static void test_out_of_order(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    char err[256];
    assert_int_equal(submit_as(c0, 2, base(), err, sizeof(err)), OVL_ERR_PROTOCOL);
    expect_str(err, "op number 2 out of order on comm 1: expected 1");
    expect_refs(c0, 1); /* let go */
    assert_int_equal(M.ndone, 0);
    assert_int_equal(job_info("train")->in_flight, 0);
    assert_int_equal(errors(OVL_ERR_PROTOCOL), 0); /* the connection's to count */
    expect_member_error(c0, OVL_OK, 0, "");
    /* the expected number did not move */
    submit(c0, 1, base());
    assert_int_equal(submit_as(c0, 1, base(), err, sizeof(err)), OVL_ERR_PROTOCOL);
    expect_str(err, "op number 1 out of order on comm 1: expected 2");
    assert_int_equal(submit_as(c1, 0, base(), err, sizeof(err)), OVL_ERR_PROTOCOL);
    expect_str(err, "op number 0 out of order on comm 2: expected 1");
    expect_refs(c0, 2);
    expect_refs(c1, 1);
    submit(c1, 1, base());
    assert_int_equal(M.ndone, 2);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 1);
    finish();
}

/* What the boundary found wrong with one rank's op fails it on every rank. */
static void test_verdicts(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    opspec_t bad = base();
    bad.fields = OVL_ERR_INVALID;
    bad.fields_msg = "dtype 9 is not a dtype";
    bad.dtype = 9;
    /* the second rank's fields */
    submit(c0, 1, base());
    submit(c1, 1, bad);
    expect_ring(0, c0, 1, OVL_ERR_INVALID, "rank 1: dtype 9 is not a dtype");
    expect_ring(1, c1, 1, OVL_ERR_INVALID, "rank 1: dtype 9 is not a dtype");
    deliver_all();
    /* the first rank's fields: nothing of it is compared */
    submit(c0, 2, bad);
    opspec_t other = base();
    other.m = 8;
    submit(c1, 2, other);
    expect_ring(2, c0, 2, OVL_ERR_INVALID, "rank 0: dtype 9 is not a dtype");
    expect_ring(3, c1, 2, OVL_ERR_INVALID, "rank 0: dtype 9 is not a dtype");
    expect_refs(c1, 1);
    deliver_all();
    /* a buffer that is not there */
    opspec_t nob = base();
    nob.b_id = 99;
    submit(c0, 3, nob);
    expect_refs(c0, 1); /* dispatch.c let go of what it had resolved */
    submit(c1, 3, base());
    expect_refs(c1, 1); /* the op failed: nothing is held */
    const char *msg = "rank 0: b: buffer 99 is not registered on this connection";
    expect_ring(4, c0, 3, OVL_ERR_NOT_FOUND, msg);
    expect_ring(5, c1, 3, OVL_ERR_NOT_FOUND, msg);
    deliver_all();
    /* a buffer too small for the op, on the second rank */
    opspec_t huge = base();
    huge.m = MEMF;
    submit(c0, 4, huge);
    submit(c1, 4, huge);
    char want[256];
    snprintf(want, sizeof(want),
             "rank 0: a: %d x 4 (ld 4) at offset 0 lies outside its registration of %zu bytes",
             MEMF, sizeof(c0->mem[0]));
    expect_ring(6, c0, 4, OVL_ERR_RANGE, want);
    expect_ring(7, c1, 4, OVL_ERR_RANGE, want);
    deliver_all();
    assert_int_equal(M.prim_calls, 0);
    /* the job goes on */
    submit2(5, base());
    expect_ring(8, c0, 5, OVL_OK, NULL);
    deliver_all();
    const jinfo_t *ji = job_info("train");
    assert_int_equal(ji->ops_done, 1);
    expect_str(ji->last_error, "op 4: rank 0: a: 4096 x 4 (ld 4) at offset 0 lies outside its "
                               "registration of 16384 bytes");
    assert_int_equal(errors(OVL_ERR_INVALID), 2);
    assert_int_equal(errors(OVL_ERR_NOT_FOUND), 1);
    assert_int_equal(errors(OVL_ERR_RANGE), 1);
    assert_int_equal(ops_failed(), 4);
    expect_member_error(c1, OVL_ERR_INVALID, 1, "rank 1: dtype 9 is not a dtype");
    finish();
}

/* ------------------------------------------------------------- window */

static void test_issue_window(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    assert_int_equal(OVLD_MAX_ISSUED, 4);
    for (uint64_t seq = 1; seq <= 7; seq++)
        submit2(seq, base());
    /* ops 1 to 4 issued, in order, rank 0 then rank 1 */
    assert_int_equal(M.ndone, 8);
    for (int i = 0; i < 8; i++)
        expect_ring(i, i % 2 ? c1 : c0, (uint64_t)(i / 2 + 1), OVL_OK, NULL);
    assert_int_equal(job_info("train")->in_flight, 7);
    assert_int_equal(ovld_job_running(&F.jobs), 7);
    int prims = M.prim_calls;

    /* one rank's completion frees nothing */
    deliver_op(c0, 2);
    assert_int_equal(M.ndone, 8);
    assert_int_equal(M.prim_calls, prims);
    /* op 2 done, out of order: op 5 goes */
    deliver_op(c1, 2);
    assert_int_equal(M.ndone, 10);
    expect_ring(8, c0, 5, OVL_OK, NULL);
    expect_ring(9, c1, 5, OVL_OK, NULL);
    assert_int_equal(job_info("train")->ops_done, 1);
    /* op 5 done before op 1: op 6 */
    deliver_op(c1, 5);
    deliver_op(c0, 5);
    assert_int_equal(M.ndone, 12);
    expect_ring(10, c0, 6, OVL_OK, NULL);
    expect_ring(11, c1, 6, OVL_OK, NULL);
    /* then op 7 */
    deliver_op(c0, 1);
    deliver_op(c1, 1);
    assert_int_equal(M.ndone, 14);
    expect_ring(12, c0, 7, OVL_OK, NULL);
    expect_ring(13, c1, 7, OVL_OK, NULL);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 7);
    assert_int_equal(job_info("train")->in_flight, 0);
    assert_int_equal(ops_ok(OVL_ALGO_NAIVE, OVL_DTYPE_FP32), 7);
    expect_refs(c0, 1);
    expect_refs(c1, 1);
    finish();
}

/* A rank more than max_ops_in_flight ahead aborts the job. The window is
 * the one the client was told at join: a reload that lowers the setting
 * does not shrink it. */
static void test_max_ops_in_flight(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    F.cfg.max_ops_in_flight = 4;
    ready2();
    F.cfg.max_ops_in_flight = 2; /* a reload */
    for (uint64_t seq = 1; seq <= 4; seq++)
        submit(c0, seq, base());
    assert_int_equal(M.ndone, 0);
    expect_state("train", OVLD_JOB_READY);
    submit(c0, 5, base());
    const char *why = "rank 0 is more than 4 ops ahead of the others (max_ops_in_flight)";
    char msg[300];
    snprintf(msg, sizeof(msg), "job aborted: %s", why);
    expect_state("train", OVLD_JOB_ABORTED);
    /* rank 0's pending ops fail first, in order; they fill the window, so
     * op 5's refusal waits for a completion */
    assert_int_equal(M.ndone, 4);
    expect_ring(0, c0, 1, OVL_ERR_ABORTED, msg);
    for (int i = 1; i < 4; i++) /* the same words: nothing nests */
        expect_ring(i, c0, (uint64_t)i + 1, OVL_ERR_ABORTED, msg);
    expect_refs(c0, 5); /* ops 1 to 4 hold them until their completions; op 5 not */
    assert_int_equal(errors(OVL_ERR_LIMIT), 1);
    deliver(2);
    assert_int_equal(M.ndone, 5);
    expect_ring(4, c0, 5, OVL_ERR_LIMIT, why);
    expect_member_error(c0, OVL_ERR_ABORTED, 1, msg);
    char last[300];
    snprintf(last, sizeof(last), "%s", why);
    expect_str(job_info("train")->last_error, last);
    deliver_all();
    expect_refs(c0, 1);
    assert_int_equal(ops_failed(), 4);
    assert_int_equal(errors(OVL_ERR_ABORTED), 4);
    /* the other rank's ops are refused now */
    submit(c1, 1, base());
    char refused[600];
    snprintf(refused, sizeof(refused), "job aborted: %s", last);
    expect_ring(5, c1, 1, OVL_ERR_ABORTED, refused);
    expect_refs(c1, 1);
    finish();
}

/*
 * When a job is aborted without its pending ops being given a status first
 * (the max_ops_in_flight abort, a failed backend setup), each op is worded
 * "job aborted: <the job's last error>". op_fail used to overwrite the
 * job's last error with "op N: <that message>", so op N+1 said "job
 * aborted: op N: job aborted: ...", and with the default max_ops_in_flight
 * (64) the reason was cut off the 256-byte messages. Every op must say the
 * same, and the job's last error stay the reason.
 */
static bool abort_messages_ok(int from, int to, const char *want, char *bad, size_t badlen)
{
    for (int i = from; i < to; i++)
        if (strcmp(M.dones[i].msg, want) != 0) {
            snprintf(bad, badlen, "op %" PRIu64 " rang \"%s\"", M.dones[i].seq, M.dones[i].msg);
            return false;
        }
    return true;
}

static void test_abort_messages_nest_max_ops(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0];
    ready2();
    uint32_t w = F.cfg.max_ops_in_flight;
    assert_int_equal(w, 64);
    for (uint64_t seq = 1; seq <= w + 1; seq++)
        submit(c0, seq, base());
    /* every pending op fails, then the refusal: in order, through the
     * window */
    deliver_all();
    assert_int_equal(M.ndone, (int)w + 1);
    for (int i = 0; i <= (int)w; i++) {
        assert_ptr_equal(M.dones[i].r, c0->br);
        assert_int_equal(M.dones[i].seq, (uint64_t)i + 1);
        assert_int_equal(M.dones[i].status, i < (int)w ? OVL_ERR_ABORTED : OVL_ERR_LIMIT);
    }
    const char *why = "rank 0 is more than 64 ops ahead of the others (max_ops_in_flight)";
    /* bounded where GCC 12 at -O2 sees it (else -Wstringop-overread) */
    assert_true(w < MAXDONE);
    expect_str(M.dones[w < MAXDONE ? w : 0].msg, why);
    char want[300], bad[600] = "";
    snprintf(want, sizeof(want), "job aborted: %s", why);
    bool ok = abort_messages_ok(0, (int)w, want, bad, sizeof(bad));
    char last[300];
    snprintf(last, sizeof(last), "%s", job_info("train")->last_error);
    finish();
    if (!ok)
        fail_msg("messages of ops failed by a max_ops_in_flight abort nest the previous op's: "
                 "%s (expected \"%s\")",
                 bad, want);
    assert_string_equal(last, why); /* the job's last error is the reason, whole */
}

static void test_abort_messages_nest_setup(void **state)
{
    (void)state;
    join_ok(&F.cl[0], "train", 2, 0, 0);
    join_ok(&F.cl[1], "train", 2, 1, 1);
    submit2(1, base());
    submit2(2, base());
    submit2(3, base());
    setup_finish(OVL_ERR_BACKEND, "ncclCommInitRank: unhandled system error");
    deliver_all();
    assert_int_equal(M.ndone, 6);
    for (int i = 0; i < 6; i++) {
        assert_ptr_equal(M.dones[i].r, F.cl[i % 2].br);
        assert_int_equal(M.dones[i].seq, (uint64_t)i / 2 + 1);
        assert_int_equal(M.dones[i].status, OVL_ERR_ABORTED);
    }
    const char *want =
        "job aborted: backend setup failed: ncclCommInitRank: unhandled system error";
    expect_str(M.dones[0].msg, want);
    char bad[600] = "";
    bool ok = abort_messages_ok(0, 6, want, bad, sizeof(bad));
    finish();
    if (!ok)
        fail_msg("messages of ops failed by a backend setup failure nest the previous op's: %s "
                 "(expected \"%s\")",
                 bad, want);
}

/* ----------------------------------------------------- backend failures */

static void test_backend_failure_mid_op(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    /* a good run first: its primitive calls */
    submit2(1, base());
    int good = M.prim_calls;
    assert_true(good >= 3);
    deliver_all();
    /* then each call of the same op fails in turn */
    uint64_t seq = 1;
    uint64_t failed = 0;
    for (int at = 1; at <= good; at++) {
        seq++;
        M.prim_calls = 0;
        M.fail_at = at;
        M.fail_status = OVL_ERR_BACKEND;
        int n = M.ndone;
        submit2(seq, base());
        assert_int_equal(M.ndone, n + 2); /* each rank rung once */
        const done_rec_t *d0 = &M.dones[n], *d1 = &M.dones[n + 1];
        assert_int_equal(d0->seq, seq);
        assert_int_equal(d1->seq, seq);
        assert_true(d0->r != d1->r);
        char want[160];
        snprintf(want, sizeof(want), "mock: call %d failed", at);
        for (int i = n; i < n + 2; i++) {
            const done_rec_t *d = &M.dones[i];
            if (d->status == OVL_OK)
                continue; /* a rank whose program had rung its done */
            assert_int_equal(d->status, OVL_ERR_BACKEND);
            if (!strstr(d->msg, want))
                fail_msg("\"%s\" does not hold \"%s\"", d->msg, want);
            if (M.prims[at - 1] == P_ALLGATHER)
                assert_non_null(strstr(d->msg, "all-gather nccl-allgather rows "));
            else
                assert_non_null(strstr(d->msg, "instruction"));
        }
        bool any = d0->status != OVL_OK || d1->status != OVL_OK;
        assert_true(any);
        failed++;
        expect_state("train", OVLD_JOB_READY); /* a failed op does not end the job */
        deliver(n + 1);
        deliver(n);
        assert_int_equal(job_info("train")->ops_done, 1);
        assert_int_equal(ops_failed(), failed);
        assert_int_equal(errors(OVL_ERR_BACKEND), failed);
        expect_refs(c0, 1);
        expect_refs(c1, 1);
    }
    M.fail_at = 0;

    /* the all-gather (naive, world 2: WAIT_READY and RECORD of each rank,
     * then the one all-gather call for both): both ranks rung with the
     * executor's exact words */
    seq++;
    M.prim_calls = 0;
    M.fail_at = 5;
    int n5 = M.ndone;
    submit2(seq, base());
    assert_int_equal(M.prims[4], P_ALLGATHER);
    assert_int_equal(M.prim_calls, 5); /* nothing issued after it */
    assert_int_equal(M.ndone, n5 + 2);
    expect_ring(n5, c0, seq, OVL_ERR_BACKEND,
                "all-gather nccl-allgather rows 0+4: mock: call 5 failed");
    expect_ring(n5 + 1, c1, seq, OVL_ERR_BACKEND,
                "all-gather nccl-allgather rows 0+4: mock: call 5 failed");
    deliver_all();

    /* the first call: rank 0's WAIT_READY, with the executor's exact words */
    seq++;
    M.prim_calls = 0;
    M.fail_at = 1;
    int n = M.ndone;
    submit2(seq, base());
    char want[200];
    snprintf(want, sizeof(want), "rank 0, instruction 0 (WAIT_READY): mock: call 1 failed");
    expect_ring(n, c0, seq, OVL_ERR_BACKEND, want);
    expect_ring(n + 1, c1, seq, OVL_ERR_BACKEND, want);
    M.fail_at = 0;
    deliver_all();
    /* CommCheck: each member's first failure, as its completion said */
    expect_member_error(c0, OVL_ERR_BACKEND, 2, M.dones[2].msg);
    /* the job goes on */
    seq++;
    submit2(seq, base());
    expect_ring(M.ndone - 1, c1, seq, OVL_OK, NULL);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 2);
    finish();
}

/* An op whose issue fails in the executor (a primitive fails mid-op) is
 * the job's last error, whether the backend delivers the failed dones at
 * once, under the call, or later, as every real backend does. (It used to
 * be recorded only in the first case.) */
static void test_backend_failure_last_error(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0];
    ready2();
    M.fail_at = 1;
    M.fail_status = OVL_ERR_BACKEND;
    const char *msg = "rank 0, instruction 0 (WAIT_READY): mock: call 1 failed";
    char last[300];
    snprintf(last, sizeof(last), "op 1: %s", msg);

    /* completions under the call: recorded */
    M.deliver_now = true;
    submit2(1, base());
    expect_ring(0, c0, 1, OVL_ERR_BACKEND, msg);
    expect_str(job_info("train")->last_error, last);
    M.deliver_now = false;
    /* the member's error is right either way */
    expect_member_error(c0, OVL_ERR_BACKEND, 1, msg);

    /* completions later, as real backends deliver them */
    M.prim_calls = 0;
    snprintf(last, sizeof(last), "op 2: %s", msg);
    submit2(2, base());
    expect_ring(2, c0, 2, OVL_ERR_BACKEND, msg);
    deliver_all();
    assert_int_equal(ops_failed(), 2);
    char got[256];
    snprintf(got, sizeof(got), "%s", job_info("train")->last_error);
    M.fail_at = 0;
    finish();
    /* A mid-op backend failure is the job's last error, also when its
     * completions come back later (as from every real backend). */
    assert_string_equal(got, last);
}

/* A completion that comes back with an error fails the op. */
static void test_completion_error(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    submit2(1, base());
    deliver_as(0, OVL_ERR_BACKEND, "cuBLASLt: CUBLAS_STATUS_EXECUTION_FAILED");
    expect_member_error(c0, OVL_ERR_BACKEND, 1, "cuBLASLt: CUBLAS_STATUS_EXECUTION_FAILED");
    expect_member_error(c1, OVL_OK, 0, "");
    expect_str(job_info("train")->last_error, "op 1: cuBLASLt: CUBLAS_STATUS_EXECUTION_FAILED");
    assert_int_equal(ops_failed(), 0); /* not done yet */
    deliver(1);
    const jinfo_t *ji = job_info("train");
    assert_int_equal(ji->ops_done, 0);
    assert_int_equal(ji->in_flight, 0);
    assert_int_equal(ops_failed(), 1);
    assert_int_equal(errors(OVL_ERR_BACKEND), 1);
    assert_int_equal(ops_ok(OVL_ALGO_NAIVE, OVL_DTYPE_FP32), 0);
    assert_int_equal(F.counters.total.latency.count, 0);
    expect_refs(c0, 1);
    /* a second error on the same op keeps the first */
    submit2(2, base());
    deliver_as(2, OVL_ERR_BACKEND, "first");
    deliver_as(3, OVL_ERR_TIMEOUT, "second");
    expect_str(job_info("train")->last_error, "op 2: first");
    expect_member_error(c1, OVL_ERR_TIMEOUT, 2, "second");
    assert_int_equal(ops_failed(), 2);
    assert_int_equal(errors(OVL_ERR_BACKEND), 2);
    assert_int_equal(errors(OVL_ERR_TIMEOUT), 0);
    expect_state("train", OVLD_JOB_READY);
    finish();
}

/* ------------------------------------------------------------- scratch */

/* world 2, m rows of k fp32 each: the gathered A */
#define SCRATCH(m, k) ((uint64_t)2 * (m) * (k)*4)

static void test_scratch_hold_back(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    opspec_t small = base(), big = base(), mine = base();
    small.no_aout = true;
    big.no_aout = true;
    big.m = 8;
    /* op 1 gathers into scratch: every rank gets it */
    submit2(1, small);
    assert_int_equal(M.scratch_calls, 2);
    assert_int_equal(M.scratch_log[0].serial, c0->br->serial);
    assert_int_equal(M.scratch_log[0].bytes, SCRATCH(4, 4));
    assert_int_equal(M.scratch_log[1].serial, c1->br->serial);
    assert_int_equal(M.scratch_log[1].bytes, SCRATCH(4, 4));
    assert_int_equal(M.ndone, 2);
    /* op 2 needs more: it waits while op 1 runs; op 3, smaller, and op 4,
     * with a_out, wait behind it */
    submit2(2, big);
    submit2(3, small);
    submit2(4, mine);
    assert_int_equal(M.scratch_calls, 2);
    assert_int_equal(M.ndone, 2);
    assert_int_equal(job_info("train")->in_flight, 4);
    deliver(0);
    assert_int_equal(M.ndone, 2);
    deliver(1);
    /* nothing runs: op 2 grows the scratch, then ops 3 and 4 go behind it */
    assert_int_equal(M.ndone, 8);
    expect_ring(2, c0, 2, OVL_OK, NULL);
    expect_ring(3, c1, 2, OVL_OK, NULL);
    expect_ring(4, c0, 3, OVL_OK, NULL);
    expect_ring(6, c0, 4, OVL_OK, NULL);
    assert_int_equal(M.scratch_calls, 6);
    assert_int_equal(M.scratch_log[2].bytes, SCRATCH(8, 4));
    assert_int_equal(M.scratch_log[3].bytes, SCRATCH(8, 4));
    assert_int_equal(M.scratch_log[4].bytes, SCRATCH(4, 4)); /* fits: no growth */
    assert_int_equal(M.scratch_grown_under_work, 0);
    /* the same size again runs back to back */
    submit2(5, big);
    assert_int_equal(M.ndone, 10);
    assert_int_equal(M.scratch_calls, 8);
    assert_int_equal(M.scratch_grown_under_work, 0);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 5);
    finish();
}

static void test_scratch_world1_ring(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0];
    join_ok(c0, "solo", 1, 0, 0);
    assert_int_equal(M.setup_calls, 1);
    assert_int_equal(M.setup_n, 1);
    setup_finish(OVL_OK, NULL);
    opspec_t ring = base();
    ring.algo = OVL_ALGO_RING;
    ring.no_aout = true;
    submit(c0, 1, ring);
    assert_int_equal(M.scratch_calls, 0); /* multiplies its shard in place */
    expect_ring(0, c0, 1, OVL_OK, NULL);
    /* a naive op gathers: it waits for the ring op, then grows the scratch */
    opspec_t naive = base();
    naive.no_aout = true;
    naive.m = 2;
    submit(c0, 2, naive);
    assert_int_equal(M.ndone, 1);
    assert_int_equal(M.scratch_calls, 0);
    deliver(0);
    assert_int_equal(M.scratch_calls, 1);
    assert_int_equal(M.scratch_log[0].bytes, (uint64_t)1 * 2 * 4 * 4);
    expect_ring(1, c0, 2, OVL_OK, NULL);
    finish();
}

static void test_scratch_failures(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    opspec_t s = base();
    s.no_aout = true;
    /* the backend has no memory for it */
    M.scratch_status = OVL_ERR_NOMEM;
    submit2(1, s);
    char want[200];
    snprintf(want, sizeof(want), "rank 0: scratch of %" PRIu64 " bytes: %s", SCRATCH(4, 4),
             ovl_strerror(OVL_ERR_NOMEM));
    expect_ring(0, c0, 1, OVL_ERR_NOMEM, want);
    expect_ring(1, c1, 1, OVL_ERR_NOMEM, want);
    assert_int_equal(M.prim_calls, 0);
    deliver_all();
    M.scratch_status = OVL_OK;
    /* so the next op asks again */
    submit2(2, s);
    expect_ring(2, c0, 2, OVL_OK, NULL);
    assert_int_equal(M.scratch_calls, 1 + 2);
    deliver_all();

    /* a gathered A whose size overflows */
    opspec_t huge = s;
    huge.m = (uint64_t)1 << 62;
    huge.no_resolve = true; /* no buffer holds it: the boundary's business */
    submit2(3, huge);
    expect_ring(4, c0, 3, OVL_ERR_LIMIT, "gathered A does not fit in memory");
    expect_ring(5, c1, 3, OVL_ERR_LIMIT, "gathered A does not fit in memory");
    deliver_all();

    /* a shape the planner refuses (the boundary would have) */
    opspec_t many = base();
    many.chunks = OVL_PLAN_MAX_CHUNKS + 1;
    submit2(4, many);
    snprintf(want, sizeof(want), "planner refused rank 0: %s", ovl_strerror(OVL_ERR_INVALID));
    expect_ring(6, c0, 4, OVL_ERR_INVALID, want);
    expect_ring(7, c1, 4, OVL_ERR_INVALID, want);
    deliver_all();
    assert_int_equal(ops_failed(), 3);
    assert_int_equal(job_info("train")->ops_done, 1);
    finish();
}

/* ----------------------------------------------------- leave, teardown */

static void test_leave_nothing_pending(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    submit2(1, base());
    deliver_all();
    leave(c1, "CommDestroy");
    assert_int_equal(M.release_calls, 1);
    assert_ptr_equal(M.release_rank[0], c1->br);
    assert_int_equal(M.release_seq[0], 1);
    expect_state("train", OVLD_JOB_ENDING);
    expect_str(job_info("train")->last_error, "rank 1 left the job (CommDestroy)");
    assert_int_equal(M.teardown_calls, 0);
    /* its place is not free again */
    join_fails(&F.cl[5], "train", 2, 1, 2, UID, OVL_ERR_ABORTED,
               "job 'train' is ending (rank 1 left the job (CommDestroy)); it ends when its "
               "ranks leave");
    /* later ops are refused on the rank's doorbell */
    submit(c0, 2, base());
    expect_ring(2, c0, 2, OVL_ERR_ABORTED, "job ending: rank 1 left the job (CommDestroy)");
    expect_refs(c0, 1);
    expect_member_error(c0, OVL_ERR_ABORTED, 2, "job ending: rank 1 left the job (CommDestroy)");
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 1);
    leave(c0, "connection closed");
    assert_int_equal(M.release_calls, 2);
    assert_ptr_equal(M.release_rank[1], c0->br);
    assert_int_equal(M.release_seq[1], 2);
    /* gone at once: nothing was outstanding */
    assert_true(ovld_jobs_empty(&F.jobs));
    assert_int_equal(M.teardown_calls, 1);
    assert_int_equal(M.teardown_n, 2);
    assert_ptr_equal(M.teardown_ranks[0], c0->br);
    assert_ptr_equal(M.teardown_ranks[1], c1->br);
    finish();
}

/* A refusal is stream work like an op: it rings within the window, after
 * the rank's earlier ops. */
static void test_refusal_waits_for_window(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    for (uint64_t seq = 1; seq <= 4; seq++)
        submit2(seq, base());
    assert_int_equal(M.ndone, 8);
    leave(c1, "CommDestroy");
    expect_state("train", OVLD_JOB_ENDING);
    assert_int_equal(M.release_seq[0], 4);
    submit(c0, 5, base());
    assert_int_equal(M.ndone, 8);
    assert_int_equal(errors(OVL_ERR_ABORTED), 1); /* counted when refused */
    expect_refs(c0, 5);                           /* ops 1 to 4 hold them, op 5 not */
    deliver_op(c1, 3);
    assert_int_equal(M.ndone, 8);
    deliver_op(c0, 3);
    assert_int_equal(M.ndone, 9);
    expect_ring(8, c0, 5, OVL_ERR_ABORTED, "job ending: rank 1 left the job (CommDestroy)");
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 4);
    finish();
}

static void test_leave_with_ops_pending(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    submit2(1, base());
    submit(c0, 2, base());
    submit(c0, 3, base());
    assert_int_equal(M.ndone, 2);
    leave(c1, "connection closed");
    assert_int_equal(M.release_seq[0], 1);
    expect_state("train", OVLD_JOB_ABORTED);
    /* ops 2 and 3 fail where they were submitted: rank 0 */
    const char *msg = "job aborted: rank 1 left (connection closed)";
    assert_int_equal(M.ndone, 4);
    expect_ring(2, c0, 2, OVL_ERR_ABORTED, msg);
    expect_ring(3, c0, 3, OVL_ERR_ABORTED, msg);
    assert_int_equal(ring_of(c1, 2), -1);
    expect_member_error(c0, OVL_ERR_ABORTED, 2, msg);
    char last[200];
    snprintf(last, sizeof(last), "rank 1 left the job (connection closed)");
    expect_str(job_info("train")->last_error, last);
    expect_refs(c0, 4); /* ops 1, 2, 3 until their completions */
    deliver(2);
    deliver(3);
    expect_refs(c0, 2);
    /* op 1 was issued: it completes */
    deliver(0);
    deliver(1);
    expect_refs(c0, 1);
    expect_refs(c1, 1);
    assert_int_equal(job_info("train")->ops_done, 1);
    assert_int_equal(ops_failed(), 2);
    assert_int_equal(errors(OVL_ERR_ABORTED), 2);
    /* later ops are refused */
    submit(c0, 4, base());
    char refused[300];
    snprintf(refused, sizeof(refused), "job aborted: %s", last);
    expect_ring(4, c0, 4, OVL_ERR_ABORTED, refused);
    finish();
}

/* Ops matched but waiting for the window fail when a rank leaves, on every
 * rank that submitted them (the one that left too: its doorbell), in order
 * as the window lets them ring. */
static void test_leave_pending_window_full(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    for (uint64_t seq = 1; seq <= 6; seq++)
        submit2(seq, base());
    assert_int_equal(M.ndone, 8);
    leave(c1, "connection closed");
    expect_state("train", OVLD_JOB_ABORTED);
    assert_int_equal(M.ndone, 8);
    const char *msg = "job aborted: rank 1 left (connection closed)";
    deliver_op(c0, 1);
    deliver_op(c1, 1);
    assert_int_equal(M.ndone, 10);
    expect_ring(8, c0, 5, OVL_ERR_ABORTED, msg);
    expect_ring(9, c1, 5, OVL_ERR_ABORTED, msg);
    deliver_op(c0, 2);
    deliver_op(c1, 2);
    assert_int_equal(M.ndone, 12);
    expect_ring(10, c0, 6, OVL_ERR_ABORTED, msg);
    expect_ring(11, c1, 6, OVL_ERR_ABORTED, msg);
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 4);
    assert_int_equal(ops_failed(), 2);
    finish();
}

/* Every rank left with completions outstanding: the job waits for them,
 * then goes once, and the buffers after it. */
static void test_all_leave_completions_outstanding(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    submit2(1, base());
    submit2(2, base());
    assert_int_equal(M.ndone, 4);
    leave(c0, "connection closed");
    leave(c1, "connection closed");
    assert_int_equal(M.release_calls, 2);
    assert_int_equal(M.release_seq[0], 2);
    assert_int_equal(M.release_seq[1], 2);
    assert_int_equal(ovld_job_running(&F.jobs), 2);
    assert_false(ovld_jobs_empty(&F.jobs));
    assert_int_equal(list_jobs(), 0); /* off the live list */
    assert_int_equal(M.teardown_calls, 0);
    assert_int_equal(M.destroy_calls, 0);
    /* the connections go: the ops still hold the buffers */
    client_close(c0);
    client_close(c1);
    assert_int_equal(M.mem_releases, 0);
    deliver(0);
    deliver(1);
    deliver(3);
    assert_int_equal(ovld_job_running(&F.jobs), 1);
    assert_int_equal(M.teardown_calls, 0);
    assert_int_equal(M.mem_releases, 0);
    deliver(2);
    assert_int_equal(M.teardown_calls, 1);
    assert_int_equal(M.teardown_outstanding, 0);
    assert_int_equal(M.nlive, 0);
    assert_int_equal(M.mem_releases, 2 * TBUF);
    assert_true(ovld_jobs_empty(&F.jobs));
    assert_int_equal(ovld_job_running(&F.jobs), 0);
    assert_int_equal(M.ndone, 4); /* nothing more was rung */
    finish();
    assert_int_equal(M.teardown_calls, 1);
    assert_int_equal(M.mem_releases, 2 * TBUF);
}

/* Both ranks leave while ops are pending (failed, not yet rung for want of
 * window) and others are issued: the failed ops still ring, the job goes
 * after the last completion, the buffers with it. */
static void test_all_leave_ops_pending(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    for (uint64_t seq = 1; seq <= 5; seq++)
        submit2(seq, base());
    submit(c0, 6, base());
    leave(c0, "killed");
    leave(c1, "killed");
    client_close(c0);
    client_close(c1);
    assert_int_equal(M.ndone, 8);
    assert_int_equal(list_jobs(), 0);
    assert_int_equal(ovld_job_running(&F.jobs), 6);
    /* completions in ring order; rank 1's buffers go with its last op
     * (op 5), rank 0's with op 6, the job after that */
    while (outstanding() > 1) {
        for (int i = 0; i < M.ndone; i++)
            if (!M.dones[i].delivered) {
                deliver(i);
                break;
            }
        assert_int_equal(M.teardown_calls, 0);
        bool op5_done = M.ndone >= 10 && M.dones[8].delivered && M.dones[9].delivered;
        assert_int_equal(M.mem_releases, op5_done ? TBUF : 0);
        for (int b = 0; b < TBUF; b++) {
            assert_int_equal(c1->released[b], op5_done ? 1 : 0);
            assert_int_equal(c0->released[b], 0);
        }
    }
    /* ops 5 and 6 failed on the ranks that submitted them */
    expect_ring(8, c0, 5, OVL_ERR_ABORTED, "job aborted: rank 0 left (killed)");
    expect_ring(9, c1, 5, OVL_ERR_ABORTED, "job aborted: rank 0 left (killed)");
    expect_ring(10, c0, 6, OVL_ERR_ABORTED, "job aborted: rank 0 left (killed)");
    assert_int_equal(M.ndone, 11);
    assert_int_equal(M.mem_releases, TBUF);
    deliver_all();
    assert_int_equal(M.teardown_calls, 1);
    assert_int_equal(M.teardown_outstanding, 0);
    assert_int_equal(M.mem_releases, 2 * TBUF);
    for (int b = 0; b < TBUF; b++)
        assert_int_equal(c0->released[b], 1);
    finish();
}

static void test_leave_during_setup(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 1);
    leave(c0, "CommDestroy");
    expect_state("train", OVLD_JOB_ENDING);
    leave(c1, "CommDestroy");
    /* the setup still has the ranks: the job waits for it */
    assert_int_equal(list_jobs(), 0);
    assert_false(ovld_jobs_empty(&F.jobs));
    assert_int_equal(ovld_job_running(&F.jobs), 1);
    assert_int_equal(M.teardown_calls, 0);
    setup_finish(OVL_OK, NULL);
    assert_int_equal(M.teardown_calls, 1);
    assert_true(ovld_jobs_empty(&F.jobs));
    finish();
}

static void test_leave_during_setup_ops_pending(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 1);
    submit2(1, base());
    leave(c0, "connection closed");
    expect_state("train", OVLD_JOB_ABORTED);
    const char *msg = "job aborted: rank 0 left (connection closed)";
    expect_ring(0, c0, 1, OVL_ERR_ABORTED, msg);
    expect_ring(1, c1, 1, OVL_ERR_ABORTED, msg);
    deliver_all();
    /* the setup ends well, too late: the job stays aborted */
    setup_finish(OVL_OK, NULL);
    expect_state("train", OVLD_JOB_ABORTED);
    assert_int_equal(M.prim_calls, 0);
    finish();
}

/* A forming job whose only rank leaves goes at once. */
static void test_leave_forming(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0];
    join_ok(c0, "train", 2, 0, 0);
    submit(c0, 1, base());
    assert_int_equal(M.ndone, 0);
    leave(c0, "CommDestroy");
    /* its op fails: it would wait for ever */
    expect_ring(0, c0, 1, OVL_ERR_ABORTED, "job aborted: rank 0 left (CommDestroy)");
    assert_int_equal(M.teardown_calls, 0);
    deliver(0);
    assert_int_equal(M.teardown_calls, 1);
    assert_int_equal(M.teardown_n, 2);
    assert_ptr_equal(M.teardown_ranks[0], c0->br);
    assert_null(M.teardown_ranks[1]);
    assert_int_equal(M.setup_calls, 0);
    finish();
}

/* A backend with nothing to set up, tear down or release. */
static void test_no_setup_no_teardown(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    mock_ops.job_setup = NULL;
    mock_ops.job_teardown = NULL;
    mock_ops.rank_release = NULL;
    join_ok(c0, "train", 2, 0, 0);
    join_ok(c1, "train", 2, 1, 1);
    expect_state("train", OVLD_JOB_READY);
    assert_int_equal(ovld_job_running(&F.jobs), 0);
    submit2(1, base());
    expect_ring(1, c1, 1, OVL_OK, NULL);
    leave(c0, "CommDestroy");
    leave(c1, "CommDestroy");
    assert_int_equal(M.destroy_calls, 0);
    deliver_all();
    assert_int_equal(M.destroy_calls, 2);
    assert_int_equal(M.teardown_calls, 0);
    assert_int_equal(M.release_calls, 0);
    finish();
}

/* ------------------------------------------------------------ shutdown */

static void test_fail_pending(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1], *b0 = &F.cl[2], *b1 = &F.cl[3];
    ready2();
    submit2(1, base());
    submit(c0, 2, base());
    /* another job, aborted already */
    M.setup_status = OVL_ERR_BACKEND;
    join_ok(b0, "other", 2, 0, 2);
    join_ok(b1, "other", 2, 1, 3);
    M.setup_status = OVL_OK;
    char other_why[200];
    snprintf(other_why, sizeof(other_why), "backend setup failed: %s",
             ovl_strerror(OVL_ERR_BACKEND));
    expect_str(job_info("other")->last_error, other_why);

    ovld_job_fail_pending(&F.jobs, OVL_ERR_SHUTDOWN, "ovld is shutting down");
    expect_state("train", OVLD_JOB_ABORTED);
    assert_int_equal(M.ndone, 3);
    expect_ring(2, c0, 2, OVL_ERR_SHUTDOWN, "ovld is shutting down");
    expect_str(job_info("train")->last_error, "ovld is shutting down");
    expect_str(job_info("other")->last_error, other_why); /* kept */
    expect_member_error(c0, OVL_ERR_SHUTDOWN, 2, "ovld is shutting down");
    /* the op already issued runs to its end */
    deliver_all();
    assert_int_equal(job_info("train")->ops_done, 1);
    assert_int_equal(errors(OVL_ERR_SHUTDOWN), 1);
    submit(c1, 2, base());
    expect_ring(3, c1, 2, OVL_ERR_ABORTED, "job aborted: ovld is shutting down");
    finish();
}

/* ------------------------------------------------------- what status sees */

static void test_jobs_foreach(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1], *b0 = &F.cl[2];
    assert_int_equal(list_jobs(), 0);
    ready2();
    submit2(1, base());
    submit2(2, base());
    deliver_op(c0, 1);
    deliver_op(c1, 1);
    submit(c0, 3, base());
    char err[256];
    assert_int_equal(join_as(b0, "eval", 2, 1, 2, UID + 1, err, sizeof(err)), OVL_OK);
    /* newest first */
    assert_int_equal(list_jobs(), 2);
    assert_string_equal(JI[0].id, "eval");
    assert_int_equal(JI[0].owner, UID + 1);
    assert_int_equal(JI[0].world, 2);
    assert_int_equal(JI[0].joined, 1);
    assert_int_equal(JI[0].state, OVLD_JOB_FORMING);
    assert_int_equal(JI[0].ops_done, 0);
    assert_int_equal(JI[0].in_flight, 0);
    assert_string_equal(JI[0].last_error, "");
    assert_string_equal(JI[1].id, "train");
    assert_int_equal(JI[1].owner, UID);
    assert_int_equal(JI[1].world, 2);
    assert_int_equal(JI[1].joined, 2);
    assert_int_equal(JI[1].state, OVLD_JOB_READY);
    assert_int_equal(JI[1].ops_done, 1);
    assert_int_equal(JI[1].in_flight, 2); /* op 2 issued, op 3 waiting */
    assert_string_equal(JI[1].last_error, "");
    leave(c1, "CommDestroy");
    list_jobs();
    assert_int_equal(JI[1].state, OVLD_JOB_ABORTED);
    assert_string_equal(JI[1].last_error, "rank 1 left the job (CommDestroy)");
    assert_int_equal(JI[1].joined, 2); /* joined counts ranks ever in */

    assert_string_equal(ovld_job_state_name(OVLD_JOB_FORMING), "forming");
    assert_string_equal(ovld_job_state_name(OVLD_JOB_SETUP), "setup");
    assert_string_equal(ovld_job_state_name(OVLD_JOB_READY), "ready");
    assert_string_equal(ovld_job_state_name(OVLD_JOB_ENDING), "ending");
    assert_string_equal(ovld_job_state_name(OVLD_JOB_ABORTED), "aborted");
    assert_string_equal(ovld_job_state_name((ovld_job_state_t)99), "?");
    finish();
}

static void test_plan_resolve(void **state)
{
    (void)state;
    F.cfg.default_chunks = 3;
    F.cfg.default_streams = 2;
    F.cfg.default_algo = OVL_ALGO_COLLECTIVE;
    F.cfg.allgather = OVL_AG_NCCL;
    ovl_plan_params_t p = {.world = 2, .m = 64, .n = 64, .k = 64, .dtype = OVL_DTYPE_FP16};
    ovld_plan_resolve(&F.cfg, true, &p);
    assert_int_equal(p.allgather, OVL_AG_NCCL); /* the config's */
    assert_int_equal(p.chunks, 3);
    assert_int_equal(p.streams, 2);
    assert_int_equal(p.algo, OVL_ALGO_COLLECTIVE);
    p = (ovl_plan_params_t){
        .algo = OVL_ALGO_RING, .world = 2, .m = 64, .n = 64, .k = 64, .chunks = 5, .streams = 1};
    ovld_plan_resolve(&F.cfg, false, &p);
    assert_int_equal(p.allgather, OVL_AG_COPY); /* no collective: by pulls, whatever asked */
    assert_int_equal(p.chunks, 5);
    assert_int_equal(p.streams, 1);
    assert_int_equal(p.algo, OVL_ALGO_RING);
    F.cfg.default_algo = OVL_ALGO_AUTO;
    p = (ovl_plan_params_t){.world = 4, .m = 1024, .n = 1024, .k = 1024, .dtype = OVL_DTYPE_BF16};
    ovld_plan_resolve(&F.cfg, true, &p);
    ovl_plan_params_t q = p;
    q.algo = OVL_ALGO_AUTO;
    assert_int_not_equal(p.algo, OVL_ALGO_AUTO);
    assert_int_equal(p.algo, ovl_plan_choose(&q));
    finish();
}

/* ------------------------------------------------------ auto that measures */

/* Ops that say auto, with the tuning table on: the first ones run the
 * candidates in turn, timed (time_start after each rank's WAIT_READY, the
 * op's time its slowest rank's), then the fastest for every later op; ops
 * that name an algorithm are neither measured nor timed. The mock makes
 * plans that gather by the copy engine fastest (ring, or naive and
 * collective told to). */
static void test_auto_measures(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 8, 0);
    assert_non_null(t);
    F.jobs.tune = t;
    ready2();
    opspec_t s = base();
    s.algo = OVL_ALGO_AUTO;
    ovl_plan_params_t key = {.kind = OVL_OP_AG_GEMM,
                             .world = 2,
                             .m = 4,
                             .n = 4,
                             .k = 4,
                             .dtype = OVL_DTYPE_FP32,
                             .want_gathered = true,
                             .allgather = F.cfg.allgather};
    ovl_plan_cand_t cand[OVL_PLAN_MAX_CANDS];
    uint32_t ncand = ovl_plan_candidates(&key, cand);
    assert_true(ncand >= 3);
    /* a warm-up and one sample each, one op at a time */
    uint64_t seq = 1;
    for (uint32_t i = 0; i < 2 * ncand; i++, seq++) {
        int starts = M.time_starts;
        submit2(seq, s);
        assert_int_equal(M.time_starts, starts + 2); /* each rank's */
        deliver_all();
    }
    assert_int_equal(ovld_tune_chosen(t), 1);
    char text[2048];
    ovld_tune_format(t, "mock", false, text, sizeof(text));
    /* a plan that gathers by the copy engine: ring, or naive or
     * collective told to (ALGO/CHUNKS/copy) */
    const char *chose = strstr(text, " chose=");
    assert_non_null(chose);
    char algo_name[16] = "";
    assert_int_equal(sscanf(chose, " chose=%15[a-z]/", algo_name), 1);
    ovl_algo_t chosen;
    assert_int_equal(ovl_algo_parse(algo_name, &chosen), OVL_OK);
    const char *sp = strchr(chose + 1, ' ');
    assert_non_null(sp);
    if (chosen != OVL_ALGO_RING)
        assert_memory_equal(sp - 5, "/copy", 5);
    /* from now on the choice, untimed */
    uint64_t before = ops_ok(chosen, OVL_DTYPE_FP32);
    int starts = M.time_starts;
    for (int i = 0; i < 3; i++, seq++) {
        submit2(seq, s);
        deliver_all();
    }
    assert_int_equal(M.time_starts, starts);
    assert_int_equal(ops_ok(chosen, OVL_DTYPE_FP32), before + 3);
    /* an op that names its algorithm: as named, untimed */
    opspec_t named = s;
    named.algo = OVL_ALGO_NAIVE;
    uint64_t naive = ops_ok(OVL_ALGO_NAIVE, OVL_DTYPE_FP32);
    submit2(seq++, named);
    deliver_all();
    assert_int_equal(M.time_starts, starts);
    assert_int_equal(ops_ok(OVL_ALGO_NAIVE, OVL_DTYPE_FP32), naive + 1);
    finish();
    F.jobs.tune = NULL;
    ovld_tune_destroy(t);
}

/* A timed op that fails counts nothing for its candidate but a failure;
 * ops in flight together each carry their own candidate. */
static void test_auto_measures_failures(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 8, 0);
    F.jobs.tune = t;
    ready2();
    opspec_t s = base();
    s.algo = OVL_ALGO_AUTO;
    /* two ops in flight, completions back in reverse */
    submit2(1, s);
    submit2(2, s);
    int n = M.ndone;
    for (int i = n; i-- > 0;)
        deliver(i);
    /* op 3 fails on rank 1: its time is none */
    submit2(3, s);
    assert_true(M.ndone >= n + 2);
    deliver_as(M.ndone - 1, OVL_ERR_BACKEND, "mock: failed on the device");
    deliver_all();
    char text[2048];
    ovld_tune_format(t, "mock", false, text, sizeof(text));
    assert_non_null(strstr(text, " measuring"));
    assert_int_equal(ovld_tune_chosen(t), 0);
    finish();
    F.jobs.tune = NULL;
    ovld_tune_destroy(t);
}

/* --------------------------------------------- completions under the call */

/* A backend that completes under its done call (out of memory for the
 * completion's record, say): ops end while they are being rung. */
static void test_completions_at_once(void **state)
{
    (void)state;
    client_t *c0 = &F.cl[0], *c1 = &F.cl[1];
    ready2();
    M.deliver_now = true;
    for (uint64_t seq = 1; seq <= 6; seq++) {
        submit2(seq, base());
        assert_int_equal(job_info("train")->in_flight, 0);
    }
    assert_int_equal(job_info("train")->ops_done, 6);
    expect_refs(c0, 1);
    /* a failed op too */
    opspec_t other = base();
    other.n = 8;
    submit(c0, 7, base());
    submit(c1, 7, other);
    expect_ring(M.ndone - 1, c1, 7, OVL_ERR_MISMATCH,
                "ranks disagree on n: rank 1 has 8, rank 0 has 4");
    assert_int_equal(job_info("train")->in_flight, 0);
    expect_refs(c0, 1);
    /* a refusal */
    leave(c1, "CommDestroy");
    submit(c0, 8, base());
    expect_ring(M.ndone - 1, c0, 8, OVL_ERR_ABORTED,
                "job ending: rank 1 left the job (CommDestroy)");
    assert_int_equal(ovld_job_running(&F.jobs), 0);
    leave(c0, "CommDestroy");
    assert_int_equal(M.teardown_calls, 1);
    M.deliver_now = false;
    finish();
}

int main(void)
{
    trace = getenv("OVL_TEST_TRACE") != NULL;
    /* the job's log says what the assertions check; quiet unless asked */
    if (!getenv("OVL_TEST_LOG"))
        ovld_log_set_level((ovld_log_level_t)0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_join_forms_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_setup_fails_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_setup_fails_later, setup, teardown),
        cmocka_unit_test_setup_teardown(test_setup_ok_runs_waiting_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ranks_share_a_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_distinct_devices_collective, setup, teardown),
        cmocka_unit_test_setup_teardown(test_op_waits_for_every_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multi_b_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verdicts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_issue_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_ops_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_messages_nest_max_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_messages_nest_setup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backend_failure_mid_op, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backend_failure_last_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_completion_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scratch_hold_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scratch_world1_ring, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scratch_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_nothing_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusal_waits_for_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_with_ops_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_pending_window_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_leave_completions_outstanding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_leave_ops_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_during_setup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_during_setup_ops_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leave_forming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_setup_no_teardown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_jobs_foreach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plan_resolve, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_measures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_measures_failures, setup, teardown),
        cmocka_unit_test_setup_teardown(test_completions_at_once, setup, teardown),
    };
    return cmocka_run_group_tests_name("job", tests, NULL, NULL);
}

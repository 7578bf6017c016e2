/*
 * test_errors.c: how a real ovld (host backend) and libovl refuse what is
 * wrong, and that the daemon goes on serving afterwards.
 *
 *  - joins: a rank twice, a rank out of range, a world that disagrees, bad
 *    job ids, unknown devices, one device for two ranks, another user's job;
 *  - ops: what libovl refuses before sending (ranges against its own
 *    registrations, a stream with the host backend, memory not from
 *    ovl_host_alloc), what the daemon refuses on its side (raw AgGemm
 *    requests on a raw connection: bad ranges, ids, order), ranks that
 *    disagree on an op (sticky OVL_ERR_MISMATCH naming the field), ranks
 *    that leave or die while the others wait (OVL_ERR_ABORTED), a rank that
 *    leaves with nothing pending (the job ends), a rank leaving right after
 *    an op refused on the spot, max_ops_in_flight (libovl's throttle and
 *    the daemon's own limit);
 *  - and the good path under load: ops back to back, two jobs at once, each
 *    result checked exactly (fp32 with small integers).
 *
 * Ranks of one job mostly live in this one process, one ovl_client_t (one
 * connection) each: submission is asynchronous, so one thread can submit for
 * every rank and then wait. Where a separate process matters (another uid,
 * a rank killed) a forked child joins; children never use cmocka.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmocka_fixture.h"
#include "daemon_fixture.h"
#include "doorbell.h"
#include "libovl_internal.h"

#define TIMEOUT_MS 10000
#define MAXW       4
#define MAXDIM     16 /* m, n, k of every op here are at most this */
#define SLOT_A     (MAXDIM * MAXDIM)
#define SLOT_B     (MAXDIM * MAXDIM)
#define SLOT_C     (MAXW * MAXDIM * MAXDIM)
#define NOBODY     65534

#define assert_status(expr, want)                                                                  \
    do {                                                                                           \
        ovl_status_t got_ = (expr);                                                                \
        if (got_ != (want))                                                                        \
            fail_msg("%s returned %s, not %s", #expr, ovl_strerror(got_), ovl_strerror(want));     \
    } while (0)

/* Fixtures: cmocka_fixture.h. */

/* ------------------------------------------------------------ data */

/* Small integers: every product and sum is exact in fp32, so results are
 * compared for equality. */
static float a_val(uint32_t r, uint64_t i, uint64_t l, unsigned salt)
{
    return (float)((int)((r * 7u + i * 3u + l * 5u + salt * 11u) % 9u) - 4);
}

static float b_val(uint32_t r, uint64_t row, uint64_t col, unsigned salt)
{
    return (float)((int)((r * 5u + row * 2u + col * 3u + salt * 13u) % 7u) - 3);
}

typedef struct opspec {
    uint64_t m, n, k;
    int transb;
    bool aout;
    ovl_dtype_t dtype;
    ovl_algo_t algo;
    uint32_t chunks, streams;
    unsigned salt;
} opspec_t;

static const opspec_t base_spec = {
    .m = 4, .n = 6, .k = 5, .dtype = OVL_DTYPE_FP32, .algo = OVL_ALGO_AUTO};

/* One rank of a job, with nslots slots of buffers (one per op in flight). */
typedef struct rank {
    ovl_client_t *cl;
    ovl_comm_t *comm;
    uint32_t world, rank;
    float *a, *b, *c, *g;
    unsigned nslots;
} rank_t;

/* Connects, joins and allocates; no assertions (children use it too). */
static ovl_status_t rank_open_st(test_daemon_t *d, rank_t *rk, const char *job, uint32_t world,
                                 uint32_t rank, int device, unsigned nslots, char *msg,
                                 size_t msglen)
{
    memset(rk, 0, sizeof(*rk));
    rk->world = world;
    rk->rank = rank;
    rk->nslots = nslots;
    ovl_status_t st = ovl_connect(d->sock, &rk->cl);
    if (st != OVL_OK) {
        snprintf(msg, msglen, "ovl_connect: %s", ovl_connect_error());
        return st;
    }
    ovl_set_timeout(rk->cl, TIMEOUT_MS);
    st = ovl_comm_init(rk->cl, job, world, rank, device, &rk->comm);
    if (st != OVL_OK) {
        snprintf(msg, msglen, "ovl_comm_init(%s, %u, %u, %d): %s", job, world, rank, device,
                 ovl_last_error(rk->cl));
        return st;
    }
    if (nslots == 0)
        return OVL_OK;
    rk->a = ovl_host_alloc(rk->cl, nslots * SLOT_A * sizeof(float));
    rk->b = ovl_host_alloc(rk->cl, nslots * SLOT_B * sizeof(float));
    rk->c = ovl_host_alloc(rk->cl, nslots * SLOT_C * sizeof(float));
    rk->g = ovl_host_alloc(rk->cl, nslots * SLOT_C * sizeof(float));
    if (!rk->a || !rk->b || !rk->c || !rk->g) {
        snprintf(msg, msglen, "ovl_host_alloc: %s", ovl_last_error(rk->cl));
        return OVL_ERR_NOMEM;
    }
    return OVL_OK;
}

static void rank_open(test_daemon_t *d, rank_t *rk, const char *job, uint32_t world, uint32_t rank,
                      int device, unsigned nslots)
{
    char msg[600];
    ovl_status_t st = rank_open_st(d, rk, job, world, rank, device, nslots, msg, sizeof(msg));
    if (st != OVL_OK)
        fail_msg("rank %u of '%s': %s: %s", rank, job, ovl_strerror(st), msg);
}

/* Leaves (ovl_comm_destroy's status is returned) and disconnects. */
static ovl_status_t rank_close(rank_t *rk)
{
    ovl_status_t st = OVL_OK;
    if (rk->comm)
        st = ovl_comm_destroy(rk->comm);
    rk->comm = NULL;
    ovl_disconnect(rk->cl);
    rk->cl = NULL;
    return st;
}

static void rank_fill(rank_t *rk, unsigned slot, const opspec_t *s)
{
    float *a = rk->a + slot * SLOT_A, *b = rk->b + slot * SLOT_B;
    for (uint64_t i = 0; i < s->m; i++)
        for (uint64_t l = 0; l < s->k; l++)
            a[i * s->k + l] = a_val(rk->rank, i, l, s->salt);
    uint64_t rows = s->transb ? s->n : s->k, cols = s->transb ? s->k : s->n;
    for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < cols; j++)
            b[i * cols + j] = b_val(rk->rank, i, j, s->salt);
    memset(rk->c + slot * SLOT_C, 0xff, SLOT_C * sizeof(float)); /* NaN: unwritten shows */
    memset(rk->g + slot * SLOT_C, 0xff, SLOT_C * sizeof(float));
}

static ovl_ag_gemm_desc_t rank_desc(rank_t *rk, unsigned slot, const opspec_t *s)
{
    ovl_ag_gemm_desc_t d = {
        .a = rk->a + slot * SLOT_A,
        .lda = s->k,
        .b = rk->b + slot * SLOT_B,
        .ldb = s->transb ? s->k : s->n,
        .transb = s->transb,
        .c = rk->c + slot * SLOT_C,
        .ldc = s->n,
        .a_out = s->aout ? rk->g + slot * SLOT_C : NULL,
        .lda_out = s->k,
        .m = s->m,
        .n = s->n,
        .k = s->k,
        .dtype = s->dtype,
        .algo = s->algo,
        .chunks = s->chunks,
        .streams = s->streams,
    };
    return d;
}

static ovl_status_t rank_submit(rank_t *rk, unsigned slot, const opspec_t *s)
{
    ovl_ag_gemm_desc_t d = rank_desc(rk, slot, s);
    return ovl_allgather_gemm(rk->comm, &d, NULL);
}

/* Compares C (and the gathered A) of one op with the exact result; 0 if
 * equal, else -1 with the first difference in msg. */
static int rank_verify(const rank_t *rk, unsigned slot, const opspec_t *s, char *msg, size_t msglen)
{
    const float *c = rk->c + slot * SLOT_C, *g = rk->g + slot * SLOT_C;
    for (uint32_t q = 0; q < rk->world; q++)
        for (uint64_t i = 0; i < s->m; i++) {
            for (uint64_t j = 0; j < s->n; j++) {
                float want = 0;
                for (uint64_t l = 0; l < s->k; l++) {
                    float bv =
                        s->transb ? b_val(rk->rank, j, l, s->salt) : b_val(rk->rank, l, j, s->salt);
                    want += a_val(q, i, l, s->salt) * bv;
                }
                float got = c[(q * s->m + i) * s->n + j];
                if (got != want) {
                    snprintf(msg, msglen,
                             "rank %u, op salt %u: C[%" PRIu64 "][%" PRIu64 "] = %g, expected %g",
                             rk->rank, s->salt, q * s->m + i, j, (double)got, (double)want);
                    return -1;
                }
            }
            for (uint64_t l = 0; s->aout && l < s->k; l++) {
                float got = g[(q * s->m + i) * s->k + l], want = a_val(q, i, l, s->salt);
                if (got != want) {
                    snprintf(msg, msglen,
                             "rank %u, op salt %u: a_out[%" PRIu64 "][%" PRIu64
                             "] = %g, expected %g",
                             rk->rank, s->salt, q * s->m + i, l, (double)got, (double)want);
                    return -1;
                }
            }
        }
    return 0;
}

static void rank_check(const rank_t *rk, unsigned slot, const opspec_t *s)
{
    char msg[256];
    if (rank_verify(rk, slot, s, msg, sizeof(msg)) != 0)
        fail_msg("%s", msg);
}

static void rank_sync_ok(rank_t *rk)
{
    ovl_status_t st = ovl_comm_synchronize(rk->comm);
    if (st != OVL_OK)
        fail_msg("rank %u: ovl_comm_synchronize: %s: %s", rk->rank, ovl_strerror(st),
                 ovl_last_error(rk->cl));
}

/* Runs one op on every rank of an in-process job and checks every C. */
static void job_run_check(rank_t *rk, uint32_t world, unsigned slot, const opspec_t *s)
{
    for (uint32_t r = 0; r < world; r++) {
        rank_fill(&rk[r], slot, s);
        assert_status(rank_submit(&rk[r], slot, s), OVL_OK);
    }
    for (uint32_t r = 0; r < world; r++)
        rank_sync_ok(&rk[r]);
    for (uint32_t r = 0; r < world; r++)
        rank_check(&rk[r], slot, s);
}

static void wait_job_gone(ovl_client_t *cl, const char *id);

/* A fresh job of `world` ranks in this process runs one op correctly. The
 * id may be one whose ranks just left: the daemon forgets a job only once
 * the completions of its last ops came back, which a client cannot see,
 * so wait for that first. */
static void fresh_job_works(test_daemon_t *d, const char *job, uint32_t world)
{
    ovl_client_t *cl = NULL;
    assert_status(ovl_connect(d->sock, &cl), OVL_OK);
    ovl_set_timeout(cl, TIMEOUT_MS);
    wait_job_gone(cl, job);
    ovl_disconnect(cl);
    rank_t rk[MAXW];
    for (uint32_t r = 0; r < world; r++)
        rank_open(d, &rk[r], job, world, r, (int)r, 1);
    opspec_t s = base_spec;
    s.salt = 3;
    job_run_check(rk, world, 0, &s);
    for (uint32_t r = 0; r < world; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
}

/* ------------------------------------------------------------ status */

static Ovl__Response *status_call(ovl_client_t *cl)
{
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_status(cl, &r);
    if (st != OVL_OK)
        fail_msg("Status: %s: %s", ovl_strerror(st), ovl_last_error(cl));
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
    return r;
}

static const Ovl__JobInfo *find_job(const Ovl__Response *r, const char *id)
{
    for (size_t i = 0; i < r->status->n_jobs; i++)
        if (strcmp(r->status->jobs[i]->id, id) == 0)
            return r->status->jobs[i];
    return NULL;
}

/* Job ids are a namespace per uid: the job `id` of `owner`. */
static const Ovl__JobInfo *find_job_of(const Ovl__Response *r, const char *id, uint32_t owner)
{
    for (size_t i = 0; i < r->status->n_jobs; i++)
        if (strcmp(r->status->jobs[i]->id, id) == 0 && r->status->jobs[i]->owner_uid == owner)
            return r->status->jobs[i];
    return NULL;
}

/* Waits (bounded) until job `id` is gone from the daemon's status. */
static void wait_job_gone(ovl_client_t *cl, const char *id)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = status_call(cl);
        bool there = find_job(r, id) != NULL;
        libovl_response_free(r);
        if (!there)
            return;
        if (fixture_now_ms() >= deadline)
            fail_msg("job '%s' is still there after %d ms", id, TIMEOUT_MS);
        fixture_sleep_ms(5);
    }
}

/* Waits (bounded) until job `id` has `n` ops in flight. */
static void wait_job_in_flight(ovl_client_t *cl, const char *id, uint32_t n)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = status_call(cl);
        const Ovl__JobInfo *j = find_job(r, id);
        uint32_t have = j ? j->ops_in_flight : UINT32_MAX;
        libovl_response_free(r);
        if (have == n)
            return;
        if (fixture_now_ms() >= deadline)
            fail_msg("job '%s' has %d ops in flight, not %u", id, (int)have, n);
        fixture_sleep_ms(5);
    }
}

/* A job of two ranks (one slot each) in which rank 0 has submitted op 1 of
 * spec s and ovld holds it, waiting for rank 1, which submits nothing. */
static void open_pair_rank0_waiting(test_daemon_t *d, rank_t rk[2], const char *job,
                                    const opspec_t *s)
{
    rank_open(d, &rk[0], job, 2, 0, 0, 1);
    rank_open(d, &rk[1], job, 2, 1, 1, 1);
    rank_fill(&rk[0], 0, s);
    assert_status(rank_submit(&rk[0], 0, s), OVL_OK);
    wait_job_in_flight(rk[0].cl, job, 1);
}

/* Waits (bounded) until job `id` counts `n` ops done. The count is kept by
 * the daemon's loop thread, which may learn of a completion after the
 * client saw its doorbell rung: hence the wait. */
static void wait_job_ops_done(ovl_client_t *cl, const char *id, uint64_t n)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = status_call(cl);
        const Ovl__JobInfo *j = find_job(r, id);
        uint64_t have = j ? j->ops_done : UINT64_MAX;
        libovl_response_free(r);
        if (have == n)
            return;
        if (fixture_now_ms() >= deadline)
            fail_msg("job '%s' counts %" PRIu64 " ops done, not %" PRIu64, id, have, n);
        fixture_sleep_ms(5);
    }
}

static ovl_client_t *connect_ok(test_daemon_t *d)
{
    ovl_client_t *cl = NULL;
    ovl_status_t st = ovl_connect(d->sock, &cl);
    if (st != OVL_OK)
        fail_msg("ovl_connect: %s: %s", ovl_strerror(st), ovl_connect_error());
    ovl_set_timeout(cl, TIMEOUT_MS);
    return cl;
}

/* Bounded wait for a forked child; its exit status, or -1. */
static int wait_child(pid_t pid, int timeout_ms)
{
    uint64_t deadline = fixture_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int ws;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid)
            return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (fixture_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            return -1;
        }
        fixture_sleep_ms(5);
    }
}

/* Reads exactly len bytes from fd within timeout_ms; 0 or -1. */
static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = fixture_now_ms() + (uint64_t)timeout_ms;
    char *p = buf;
    while (len > 0) {
        uint64_t now = fixture_now_ms();
        if (now >= deadline)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int n = poll(&pf, 1, (int)(deadline - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        ssize_t got = read(fd, p, len);
        if (got <= 0) {
            if (got < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += got;
        len -= (size_t)got;
    }
    return 0;
}

/* ================================================================ joins */

static void test_join_same_rank_twice(void **state)
{
    test_daemon_t *d = *state;
    rank_t r0;
    rank_open(d, &r0, "dup", 2, 0, 0, 0);
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "dup", 2, 0, 1, &comm), OVL_ERR_EXISTS);
    assert_contains(ovl_last_error(cl), "rank 0 of job 'dup' already joined");
    assert_null(comm);
    /* The same connection asking again for its own rank. */
    assert_status(ovl_comm_init(r0.cl, "dup", 2, 0, 2, &comm), OVL_ERR_EXISTS);
    assert_contains(ovl_last_error(r0.cl), "already joined");
    ovl_disconnect(cl);
    assert_status(rank_close(&r0), OVL_OK);
    /* The refusals left nothing behind: a complete job works. */
    fresh_job_works(d, "dup", 2);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_rank_out_of_range(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "range", 2, 2, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "rank 2 out of range for world 2");
    assert_status(ovl_comm_init(cl, "range", 2, 7, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, "range", 0, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "world 0 out of range");
    assert_status(ovl_comm_init(cl, "range", 1025, 0, 0, &comm), OVL_ERR_INVALID);
    assert_null(comm);
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0); /* no job was made on the way */
    libovl_response_free(r);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_world_mismatch(void **state)
{
    test_daemon_t *d = *state;
    rank_t r0;
    rank_open(d, &r0, "worlds", 2, 0, 0, 0);
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "worlds", 3, 1, 1, &comm), OVL_ERR_MISMATCH);
    assert_contains(ovl_last_error(cl), "job 'worlds' has world 2, not 3");
    assert_status(ovl_comm_init(cl, "worlds", 1, 0, 1, &comm), OVL_ERR_MISMATCH);
    assert_null(comm);
    ovl_disconnect(cl);
    assert_status(rank_close(&r0), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_bad_job_id(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    char id[80];

    assert_status(ovl_comm_init(cl, "", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id must be 1 to 63 bytes");
    memset(id, 'j', 64);
    id[64] = '\0';
    assert_status(ovl_comm_init(cl, id, 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id must be 1 to 63 bytes");
    memset(id, 'j', 79);
    id[79] = '\0';
    assert_status(ovl_comm_init(cl, id, 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, "tab\there", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "control character");
    assert_status(ovl_comm_init(cl, "del\x7f", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, NULL, 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, "x", 1, 0, 0, NULL), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(NULL, "x", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_null(comm);

    /* 63 bytes is the longest id, and it works. */
    memset(id, 'j', 63);
    id[63] = '\0';
    assert_status(ovl_comm_init(cl, id, 1, 0, 0, &comm), OVL_OK);
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 1);
    assert_string_equal(r->status->jobs[0]->id, id);
    libovl_response_free(r);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

/* A raw CommInit through libovl's internal call: any id bytes, world, rank
 * and device UUID. */
static ovl_status_t raw_comm_init_full(ovl_client_t *cl, const void *job, size_t job_len,
                                       uint64_t world, uint64_t rank, const uint8_t *uuid,
                                       size_t uuid_len)
{
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_id.data = (uint8_t *)job;
    ci.job_id.len = job_len;
    ci.world = world;
    ci.rank = rank;
    ci.device_uuid.data = (uint8_t *)uuid;
    ci.device_uuid.len = uuid_len;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = &ci;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, &q, NULL, 0, &r);
    if (st == OVL_OK)
        libovl_response_free(r); /* not expected here: the doorbell fd stays queued */
    return st;
}

static ovl_status_t raw_comm_init(ovl_client_t *cl, const char *job, const uint8_t *uuid,
                                  size_t uuid_len)
{
    return raw_comm_init_full(cl, job, strlen(job), 1, 0, uuid, uuid_len);
}

/* What protobuf would pass and ovld must not: bytes after a NUL, text that
 * is not UTF-8, integers wider than the fields ovld keeps (a varint world
 * of 2^32 + 2 was taken as world 2). Nothing joins; nothing is created. */
static void test_join_hostile_fields(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    uint8_t uuid[16];
    Ovl__Response *r = status_call(cl);
    memcpy(uuid, r->status->devices[0]->uuid.data, 16);
    libovl_response_free(r);

    assert_status(raw_comm_init_full(cl, "nul\0tail", 8, 1, 0, uuid, 16), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id holds a NUL byte at 3");
    char long_id[85];
    memset(long_id, 'x', sizeof(long_id));
    long_id[4] = '\0';
    assert_status(raw_comm_init_full(cl, long_id, sizeof(long_id), 1, 0, uuid, 16),
                  OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id must be 1 to 63 bytes, not 85");
    assert_status(raw_comm_init_full(cl, "\xff\xfe", 2, 1, 0, uuid, 16), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "UTF-8");
    assert_status(raw_comm_init_full(cl, "esc\x1b[2J", 7, 1, 0, uuid, 16), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "control character");
    assert_status(raw_comm_init_full(cl, "c1\xc2\x9b", 4, 1, 0, uuid, 16), OVL_ERR_INVALID);
    /* a character cut short at the end */
    assert_status(raw_comm_init_full(cl, "cut\xc3", 4, 1, 0, uuid, 16), OVL_ERR_INVALID);

    assert_status(raw_comm_init_full(cl, "wide", 4, (UINT64_C(1) << 32) + 2, 0, uuid, 16),
                  OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "world 4294967298 out of range 1..1024");
    assert_status(raw_comm_init_full(cl, "wide", 4, 2, (UINT64_C(1) << 32) + 1, uuid, 16),
                  OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "rank 4294967297 out of range for world 2");
    assert_status(raw_comm_init_full(cl, "wide", 4, UINT64_MAX, 0, uuid, 16), OVL_ERR_INVALID);

    r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0);
    libovl_response_free(r);
    /* UTF-8 that is text is an id like any other */
    ovl_comm_t *comm;
    assert_status(ovl_comm_init(cl, "jöb-ü", 1, 0, 0, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_bad_device(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    /* libovl refuses an index it has no UUID for. */
    assert_status(ovl_comm_init(cl, "dev", 1, 0, 8, &comm), OVL_ERR_NOT_FOUND);
    assert_contains(ovl_last_error(cl), "no host device 8 (ovld has 8)");
    assert_status(ovl_comm_init(cl, "dev", 1, 0, -1, &comm), OVL_ERR_NOT_FOUND);
    assert_status(ovl_comm_init(cl, "dev", 1, 0, 1000000, &comm), OVL_ERR_NOT_FOUND);
    assert_null(comm);
    /* The daemon refuses a UUID it does not have, or one of the wrong size. */
    uint8_t uuid[17];
    memset(uuid, 0xab, sizeof(uuid));
    assert_status(raw_comm_init(cl, "dev", uuid, 16), OVL_ERR_NOT_FOUND);
    assert_contains(ovl_last_error(cl), "no device with UUID");
    assert_status(raw_comm_init(cl, "dev", uuid, 15), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "must be 16 bytes, not 15");
    assert_status(raw_comm_init(cl, "dev", uuid, 17), OVL_ERR_INVALID);
    assert_status(raw_comm_init(cl, "dev", uuid, 0), OVL_ERR_INVALID);
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0);
    libovl_response_free(r);
    /* The client still works after the refusals. */
    assert_status(ovl_comm_init(cl, "dev", 1, 0, 7, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_same_device_twice(void **state)
{
    test_daemon_t *d = *state;
    rank_t r0;
    rank_open(d, &r0, "gpu", 2, 0, 3, 0);
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "gpu", 2, 1, 3, &comm), OVL_ERR_EXISTS);
    assert_contains(ovl_last_error(cl), "device 3 is already used by rank 0 of job 'gpu'");
    /* Another job may use the device. */
    assert_status(ovl_comm_init(cl, "other-gpu", 1, 0, 3, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    /* And rank 1 on another device completes the job. */
    assert_status(ovl_comm_init(cl, "gpu", 2, 1, 4, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    rank_close(&r0); /* rank 1 left first: an aborted job is fine here */
    assert_alive(d);
    TEST_PASSED();
}

/* What the nobody child reports. */
typedef struct perm_report {
    int stage; /* 0: all done; else where it stopped */
    int join_root_job;
    char msg_root_job[256];
    int create_own_job;
    char msg_own_job[256];
} perm_report_t;

static void perm_child(test_daemon_t *d, int out, int go)
{
    perm_report_t rep;
    memset(&rep, 0, sizeof(rep));
    alarm(20); /* whatever happens, this child ends */
    rep.stage = 1;
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        goto out;
    rep.stage = 2;
    ovl_client_t *cl = NULL;
    if (ovl_connect(d->sock, &cl) != OVL_OK) {
        snprintf(rep.msg_root_job, sizeof(rep.msg_root_job), "%s", ovl_connect_error());
        goto out;
    }
    ovl_set_timeout(cl, TIMEOUT_MS);
    ovl_comm_t *c1 = NULL, *c2 = NULL;
    rep.join_root_job = ovl_comm_init(cl, "owned-by-root", 2, 1, 1, &c1);
    snprintf(rep.msg_root_job, sizeof(rep.msg_root_job), "%s", ovl_last_error(cl));
    rep.create_own_job = ovl_comm_init(cl, "owned-by-nobody", 2, 0, 2, &c2);
    snprintf(rep.msg_own_job, sizeof(rep.msg_own_job), "%s", ovl_last_error(cl));
    rep.stage = 0;
    if (write(out, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(3);
    char c;
    while (read(go, &c, 1) < 0 && errno == EINTR) /* until the parent is done */
        ;
    _exit(0);
out:
    if (write(out, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(3);
    _exit(2);
}

/* Another uid cannot join a job (either way round): job ids are a
 * namespace per uid, so the same id names another job of its own, and
 * nobody can claim an id before its owner does. Root only: the child
 * becomes nobody; the socket is opened to all with socket_mode = 0666. */
static void test_join_other_uid(void **state)
{
    test_daemon_t *d = *state;
    if (geteuid() != 0) {
        TEST_PASSED();
        skip();
    }
    assert_int_equal(chmod(d->dir, 0711), 0); /* nobody must reach the socket */
    rank_t r0;
    rank_open(d, &r0, "owned-by-root", 2, 0, 0, 0);

    int out, go;
    pid_t pid = fixture_fork_child(d, perm_child, &out, &go);
    assert_true(pid > 0);
    perm_report_t rep;
    int got = read_full(out, &rep, sizeof(rep), TIMEOUT_MS);
    close(out);
    if (got != 0) {
        close(go);
        wait_child(pid, TIMEOUT_MS);
        fail_msg("no report from the child");
    }
    if (rep.stage != 0) {
        close(go);
        wait_child(pid, TIMEOUT_MS);
        rank_close(&r0);
        if (rep.stage == 1) { /* root without CAP_SETUID (a container) */
            TEST_PASSED();
            skip();
        }
        fail_msg("the child stopped at stage %d: %s", rep.stage, rep.msg_root_job);
    }
    /* nobody's "owned-by-root" is a job of its own, not root's */
    assert_status((ovl_status_t)rep.join_root_job, OVL_OK);
    assert_status((ovl_status_t)rep.create_own_job, OVL_OK);

    /* The converse: root's "owned-by-nobody" is root's own job too. */
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(r0.cl, "owned-by-nobody", 2, 1, 3, &comm), OVL_OK);
    Ovl__Response *r = status_call(r0.cl);
    const Ovl__JobInfo *j = find_job_of(r, "owned-by-root", 0);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1); /* rank 0 alone: nobody's rank 1 is elsewhere */
    assert_string_equal(j->state, "forming");
    j = find_job_of(r, "owned-by-root", NOBODY);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1);
    j = find_job_of(r, "owned-by-nobody", NOBODY);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1);
    j = find_job_of(r, "owned-by-nobody", 0);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1);
    libovl_response_free(r);
    assert_status(ovl_comm_destroy(comm), OVL_OK);

    close(go);
    assert_int_equal(wait_child(pid, TIMEOUT_MS), 0);
    wait_job_gone(r0.cl, "owned-by-nobody"); /* root's and nobody's */
    assert_status(rank_close(&r0), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* ============================================================ client side */

/* What libovl refuses before anything is sent: no op number is used up, so
 * the next good op is op 1 and works. */
static void test_op_client_checks(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk;
    rank_open(d, &rk, "client-checks", 1, 0, 0, 1);
    opspec_t s = base_spec;
    rank_fill(&rk, 0, &s);
    ovl_ag_gemm_desc_t good = rank_desc(&rk, 0, &s), bad;

    /* lda too large for A's allocation (one page): outside every registration. */
    bad = good;
    bad.lda = 4096;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "not inside memory from ovl_host_alloc");
    char lda_msg[512]; /* checked last: see below */
    snprintf(lda_msg, sizeof(lda_msg), "%s", ovl_last_error(rk.cl));
    /* c one row short of the end of its allocation: ldc pushes it past. */
    bad = good;
    bad.c = (char *)rk.c + 4096 * 4 - 8;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "c: ");
    /* lda below k */
    bad = good;
    bad.lda = s.k - 1;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "a: leading dimension 4 is less than 5 columns");
    /* ldb below n (B is k x n) and, transposed, below k */
    bad = good;
    bad.ldb = s.n - 1;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "b: leading dimension");
    /* a NULL buffer */
    bad = good;
    bad.b = NULL;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "b is NULL");
    /* memory from malloc */
    float *heap = calloc(SLOT_C, sizeof(float));
    assert_non_null(heap);
    bad = good;
    bad.c = heap;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "c: ");
    free(heap);
    /* sizes, dtype, algorithm */
    bad = good;
    bad.m = 0;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "must be positive");
    bad = good;
    bad.dtype = (ovl_dtype_t)9;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "unknown dtype 9");
    bad = good;
    bad.algo = (ovl_algo_t)9;
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "unknown algorithm 9");
    bad = good;
    bad.m = UINT64_MAX / 2; /* A's extent overflows */
    assert_status(ovl_allgather_gemm(rk.comm, &bad, NULL), OVL_ERR_RANGE);
    assert_contains(ovl_last_error(rk.cl), "a: 9223372036854775807 x 5 matrix overflows");
    /* a stream with the host backend */
    int fake_stream;
    assert_status(ovl_allgather_gemm(rk.comm, &good, &fake_stream), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(rk.cl), "takes no stream");
    assert_status(ovl_allgather_gemm(rk.comm, NULL, NULL), OVL_ERR_INVALID);
    assert_status(ovl_allgather_gemm(NULL, &good, NULL), OVL_ERR_INVALID);

    /* None of these reached the daemon: op 1 is the good one. */
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    assert_status(ovl_allgather_gemm(rk.comm, &good, NULL), OVL_OK);
    rank_sync_ok(&rk);
    rank_check(&rk, 0, &s);
    wait_job_ops_done(rk.cl, "client-checks", 1);
    Ovl__Response *r = status_call(rk.cl);
    const Ovl__JobInfo *j = find_job(r, "client-checks");
    assert_non_null(j);
    assert_string_equal(j->last_error, "");
    libovl_response_free(r);
    assert_status(rank_close(&rk), OVL_OK);
    assert_alive(d);

    /* The message of a buffer outside every registration names the buffer,
     * then gives ovl_mem_register's words, pointer first, intact. */
    char want[64];
    snprintf(want, sizeof(want), "a: %p (", (void *)rk.a);
    if (strncmp(lda_msg, want, strlen(want)) != 0)
        fail_msg("ovl_last_error after a range outside A's registration is \"%s\"; expected it "
                 "to start with \"%s\"",
                 lda_msg, want);
    TEST_PASSED();
}

static void test_mem_register_checks(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_mem_t *m = NULL, *m2 = NULL;
    char *heap = malloc(4096);
    assert_non_null(heap);
    assert_status(ovl_mem_register(cl, heap, 4096, &m), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "not inside memory from ovl_host_alloc");
    assert_null(m);
    free(heap);

    char *p = ovl_host_alloc(cl, 10000); /* three pages */
    assert_non_null(p);
    assert_status(ovl_mem_register(cl, p, 10000, &m), OVL_OK);
    assert_status(ovl_mem_register(cl, p + 100, 200, &m2), OVL_OK);
    assert_ptr_equal(m, m2); /* inside: the same registration */
    assert_status(ovl_mem_register(cl, p + 3 * 4096 - 8, 8, &m2), OVL_OK);
    assert_status(ovl_mem_register(cl, p + 3 * 4096 - 8, 9, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, p - 1, 2, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, p, 0, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, NULL, 8, &m2), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(cl, p, 8, NULL), OVL_ERR_INVALID);
    assert_status(ovl_mem_register(NULL, p, 8, &m2), OVL_ERR_INVALID);
    /* Host allocations are released with ovl_host_free only. */
    assert_status(ovl_mem_deregister(cl, m), OVL_ERR_INVALID);
    assert_null(ovl_host_alloc(cl, 0));
    assert_status(ovl_host_free(cl, p + 8), OVL_ERR_NOT_FOUND);
    assert_status(ovl_host_free(cl, NULL), OVL_ERR_INVALID);

    Ovl__Response *r = status_call(cl);
    uint32_t before = 0;
    for (size_t i = 0; i < r->status->n_clients; i++)
        if (r->status->clients[i]->buffers > 0) {
            before = r->status->clients[i]->buffers;
            assert_int_equal(r->status->clients[i]->mapped_bytes, 3 * 4096);
        }
    assert_int_equal(before, 1);
    libovl_response_free(r);
    assert_status(ovl_host_free(cl, p), OVL_OK);
    r = status_call(cl);
    for (size_t i = 0; i < r->status->n_clients; i++)
        assert_int_equal(r->status->clients[i]->buffers, 0);
    libovl_response_free(r);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

/* ================================================== the daemon's op checks */

/* A sealed memfd of `bytes`, mapped here too. */
static int sealed_memfd(size_t bytes, bool seal, void **ret_map)
{
    int fd = memfd_create("ovl-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    if (seal)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    *ret_map = p;
    return fd;
}

/* MemRegister on a raw connection; the response (free it) is returned. */
static Ovl__Response *raw_mem_register(raw_conn_t *rc, int fd, uint64_t bytes, uint64_t fd_offset,
                                       raw_result_t *ret_res)
{
    Ovl__MemRegister mr = OVL__MEM_REGISTER__INIT;
    mr.client_addr = 0x1000;
    mr.bytes = bytes;
    mr.fd_count = fd >= 0 ? 1 : 0;
    mr.fd_offset = fd_offset;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    q.mem_register = &mr;
    Ovl__Response *r = NULL;
    *ret_res = raw_call(rc, &q, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, &r);
    return r;
}

static uint64_t raw_mem_register_ok(raw_conn_t *rc, int fd, uint64_t bytes)
{
    raw_result_t res;
    Ovl__Response *r = raw_mem_register(rc, fd, bytes, 0, &res);
    assert_int_equal(res, RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_MEM_REGISTER)
        fail_msg("MemRegister refused: %s",
                 r->body_case == OVL__RESPONSE__BODY_ERROR ? r->error->message : "?");
    uint64_t id = r->mem_register->mem_id;
    ovl__response__free_unpacked(r, NULL);
    return id;
}

static void raw_expect_error(Ovl__Response *r, raw_result_t res, ovl_status_t status,
                             const char *needle)
{
    assert_int_equal(res, RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_ERROR)
        fail_msg("expected an Error (%s), got body %d", ovl_strerror(status), (int)r->body_case);
    if (r->error->status != status)
        fail_msg("Error %s, not %s: %s", ovl_strerror((ovl_status_t)r->error->status),
                 ovl_strerror(status), r->error->message);
    assert_contains(r->error->message, needle);
    ovl__response__free_unpacked(r, NULL);
}

/* A raw comm: its id and its mapped doorbell. */
typedef struct raw_comm {
    uint64_t id;
    struct ovl_doorbell *db;
    void *map;
    size_t map_len;
} raw_comm_t;

static void raw_join2(raw_conn_t *rc, const Ovl__HelloReply *h, const char *job, uint32_t world,
                      uint32_t rank, uint32_t device, raw_comm_t *out)
{
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_id.data = (uint8_t *)job;
    ci.job_id.len = strlen(job);
    ci.world = world;
    ci.rank = rank;
    ci.device_uuid = h->devices[device]->uuid;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = &ci;
    Ovl__Response *r = NULL;
    assert_int_equal(raw_call(rc, &q, NULL, 0, &r), RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_COMM_INIT)
        fail_msg("CommInit refused: %s",
                 r->body_case == OVL__RESPONSE__BODY_ERROR ? r->error->message : "?");
    assert_int_equal(r->comm_init->fd_count, 1);
    int fd = ovl_fdq_pop(&rc->fdq);
    assert_true(fd >= 0);
    out->id = r->comm_init->comm_id;
    out->map_len = (size_t)r->comm_init->doorbell_offset + OVL_DOORBELL_SIZE;
    out->map = mmap(NULL, out->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(out->map != MAP_FAILED);
    out->db = (struct ovl_doorbell *)((char *)out->map + r->comm_init->doorbell_offset);
    close(fd);
    ovl__response__free_unpacked(r, NULL);
}

static void raw_join(raw_conn_t *rc, const Ovl__HelloReply *h, const char *job, uint32_t device,
                     raw_comm_t *out)
{
    raw_join2(rc, h, job, 1, 0, device, out);
}

static void raw_comm_unmap(raw_comm_t *c)
{
    munmap(c->map, c->map_len);
}

static void raw_wait_done(const raw_comm_t *c, uint64_t seq)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    while (__atomic_load_n(&c->db->done, __ATOMIC_ACQUIRE) < seq) {
        if (fixture_now_ms() >= deadline)
            fail_msg("op %" PRIu64 " not done within %d ms (done %" PRIu64 ")", seq, TIMEOUT_MS,
                     __atomic_load_n(&c->db->done, __ATOMIC_ACQUIRE));
        fixture_sleep_ms(1);
    }
}

/* CommCheck: status, seq and the message must say `needle`. */
static void raw_check_comm(raw_conn_t *rc, const raw_comm_t *c, ovl_status_t status, uint64_t seq,
                           const char *needle)
{
    Ovl__CommCheck cc = OVL__COMM_CHECK__INIT;
    cc.comm_id = c->id;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_CHECK;
    q.comm_check = &cc;
    Ovl__Response *r = NULL;
    assert_int_equal(raw_call(rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_COMM_CHECK);
    if (r->comm_check->status != status)
        fail_msg("CommCheck: %s, not %s (%s)", ovl_strerror((ovl_status_t)r->comm_check->status),
                 ovl_strerror(status), r->comm_check->message);
    assert_int_equal(r->comm_check->seq, seq);
    assert_contains(r->comm_check->message, needle);
    ovl__response__free_unpacked(r, NULL);
    /* The doorbell says the same. */
    assert_int_equal(__atomic_load_n(&c->db->error, __ATOMIC_ACQUIRE), status);
    if (status != OVL_OK)
        assert_int_equal(__atomic_load_n(&c->db->error_seq, __ATOMIC_ACQUIRE), seq);
}

/* Layout in the one registration: A (m x k) at 0, B (k x n) at 256, C at 512. */
#define RAW_M 2
#define RAW_N 3
#define RAW_K 4

static void raw_gemm_init(Ovl__AgGemm *g, Ovl__BufRef refs[3], uint64_t comm, uint64_t seq,
                          uint64_t mem)
{
    ovl__ag_gemm__init(g);
    for (int i = 0; i < 3; i++) {
        ovl__buf_ref__init(&refs[i]);
        refs[i].mem_id = mem;
        refs[i].offset = (uint64_t)i * 256;
    }
    g->comm_id = comm;
    g->seq = seq;
    g->a = &refs[0];
    g->lda = RAW_K;
    g->b = &refs[1];
    g->ldb = RAW_N;
    g->c = &refs[2];
    g->ldc = RAW_N;
    g->m = RAW_M;
    g->n = RAW_N;
    g->k = RAW_K;
    g->dtype = OVL__DTYPE__DTYPE_FP32;
    g->algo = OVL__ALGO__ALGO_NAIVE;
}

static void raw_submit(raw_conn_t *rc, const raw_comm_t *c, Ovl__AgGemm *g)
{
    /* Host mode: the client is the stream; its data is ready when sent. */
    if (c)
        __atomic_store_n(&c->db->ready, g->seq, __ATOMIC_RELEASE);
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_AG_GEMM;
    q.ag_gemm = g;
    assert_int_equal(raw_send_request(rc, &q, NULL, 0), 0);
}

typedef enum raw_case {
    RC_C_OUT_OF_RANGE,
    RC_A_OFFSET_PAST_END,
    RC_LDA_BELOW_K,
    RC_B_NOT_REGISTERED,
    RC_BAD_DTYPE,
    RC_BAD_ALGO,
    RC_ZERO_M,
    RC_TOO_MANY_CHUNKS,
    RC_NO_A,
    RC_HUGE_M,
    RC_WIDE_DTYPE,
    RC_WIDE_CHUNKS,
    RC_COUNT
} raw_case_t;

static const struct {
    ovl_status_t status;
    const char *needle;
} raw_case_want[RC_COUNT] = {
    [RC_C_OUT_OF_RANGE] = {OVL_ERR_RANGE, "c: 2 x 3 (ld 3) at offset 4080 lies outside its "
                                          "registration of 4096 bytes"},
    [RC_A_OFFSET_PAST_END] = {OVL_ERR_RANGE, "a: 2 x 4 (ld 4) at offset 1048576 lies outside"},
    [RC_LDA_BELOW_K] = {OVL_ERR_INVALID, "a: leading dimension 3 is less than its 4 columns"},
    [RC_B_NOT_REGISTERED] = {OVL_ERR_NOT_FOUND, "b: buffer 999 is not registered"},
    [RC_BAD_DTYPE] = {OVL_ERR_INVALID, "unknown dtype 7"},
    [RC_BAD_ALGO] = {OVL_ERR_INVALID, "unknown algorithm 9"},
    [RC_ZERO_M] = {OVL_ERR_INVALID, "must be positive"},
    [RC_TOO_MANY_CHUNKS] = {OVL_ERR_INVALID, "chunks 65"},
    [RC_NO_A] = {OVL_ERR_INVALID, "a: no buffer given"},
    [RC_HUGE_M] = {OVL_ERR_RANGE, "a: 2305843009213693951 x 4 (ld 4) at offset 0 lies outside"},
    /* 2^32 + 2 would be fp32 in 32 bits, and 2^32 + 1 chunks one chunk */
    [RC_WIDE_DTYPE] = {OVL_ERR_INVALID, "unknown dtype 4294967298"},
    [RC_WIDE_CHUNKS] = {OVL_ERR_INVALID, "chunks 4294967297 out of range 0..64"},
};

/*
 * The daemon's own checks of an op, which libovl never lets through: raw
 * AgGemm requests on a raw connection, one world-1 comm per case (a comm's
 * first error is sticky). Each fails through the doorbell (done rung, error
 * word and error_seq set) and CommCheck has the words. On the first comm a
 * good op afterwards still runs, correctly, with the error kept.
 */
static void test_raw_op_checks(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);

    void *map;
    int fd = sealed_memfd(4096, true, &map);
    uint64_t mem = raw_mem_register_ok(&rc, fd, 4096);
    close(fd);
    float *fa = map, *fb = (float *)((char *)map + 256), *fc = (float *)((char *)map + 512);
    for (int i = 0; i < RAW_M * RAW_K; i++)
        fa[i] = (float)(i % 5 - 2);
    for (int i = 0; i < RAW_K * RAW_N; i++)
        fb[i] = (float)(i % 3 - 1);

    raw_comm_t comms[RC_COUNT];
    for (int c = 0; c < RC_COUNT; c++) {
        char job[32];
        snprintf(job, sizeof(job), "raw-%d", c);
        raw_join(&rc, hello->hello, job, (uint32_t)c % 8, &comms[c]);
        Ovl__AgGemm g;
        Ovl__BufRef refs[3];
        raw_gemm_init(&g, refs, comms[c].id, 1, mem);
        uint64_t seq = 1;
        switch ((raw_case_t)c) {
        case RC_C_OUT_OF_RANGE:
            refs[2].offset = 4096 - 16;
            break;
        case RC_A_OFFSET_PAST_END:
            refs[0].offset = 1u << 20;
            break;
        case RC_LDA_BELOW_K:
            g.lda = RAW_K - 1;
            break;
        case RC_B_NOT_REGISTERED:
            refs[1].mem_id = 999;
            break;
        case RC_BAD_DTYPE:
            g.dtype = (Ovl__DType)7;
            break;
        case RC_BAD_ALGO:
            g.algo = (Ovl__Algo)9;
            break;
        case RC_ZERO_M:
            g.m = 0;
            break;
        case RC_TOO_MANY_CHUNKS:
            g.chunks = 65;
            break;
        case RC_NO_A:
            g.a = NULL;
            break;
        case RC_HUGE_M:
            g.m = UINT64_MAX / 8;
            break;
        case RC_WIDE_DTYPE:
            g.dtype = (UINT64_C(1) << 32) + 2;
            break;
        case RC_WIDE_CHUNKS:
            g.chunks = (UINT64_C(1) << 32) + 1;
            break;
        case RC_COUNT:
            break;
        }
        raw_submit(&rc, &comms[c], &g);
        raw_wait_done(&comms[c], seq);
        raw_check_comm(&rc, &comms[c], raw_case_want[c].status, seq, raw_case_want[c].needle);
    }

    /* Comm 0 failed op 1; op 2 is good: it runs, the first error stays. */
    memset(fc, 0xff, RAW_M * RAW_N * sizeof(float));
    Ovl__AgGemm g;
    Ovl__BufRef refs[3];
    raw_gemm_init(&g, refs, comms[0].id, 2, mem);
    raw_submit(&rc, &comms[0], &g);
    raw_wait_done(&comms[0], 2);
    raw_check_comm(&rc, &comms[0], OVL_ERR_RANGE, 1, "outside its registration");
    for (int i = 0; i < RAW_M; i++)
        for (int j = 0; j < RAW_N; j++) {
            float want = 0;
            for (int l = 0; l < RAW_K; l++)
                want += fa[i * RAW_K + l] * fb[l * RAW_N + j];
            assert_true(fc[i * RAW_N + j] == want);
        }

    /* An op for a comm that is not there: an Error with id 0, and the
     * connection goes on. */
    raw_gemm_init(&g, refs, 424242, 1, mem);
    raw_submit(&rc, NULL, &g);
    Ovl__Response *r = NULL;
    assert_int_equal(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->id, 0);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
    assert_int_equal(r->error->status, OVL_ERR_NOT_FOUND);
    assert_contains(r->error->message, "op 1 names unknown comm 424242");
    ovl__response__free_unpacked(r, NULL);

    /* Other requests about unknown things: refused, connection kept. */
    Ovl__CommCheck cc = OVL__COMM_CHECK__INIT;
    cc.comm_id = 424242;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_CHECK;
    q.comm_check = &cc;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "no comm 424242");
    Ovl__CommDestroy cd = OVL__COMM_DESTROY__INIT;
    cd.comm_id = 424242;
    Ovl__Request qd = OVL__REQUEST__INIT;
    qd.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
    qd.comm_destroy = &cd;
    assert_int_equal(raw_call(&rc, &qd, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "no comm 424242");

    /* Leaving properly: CommDestroy answers Ok, then the comm is unknown. */
    cd.comm_id = comms[0].id;
    qd.id = 0;
    assert_int_equal(raw_call(&rc, &qd, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
    ovl__response__free_unpacked(r, NULL);
    cc.comm_id = comms[0].id;
    q.id = 0;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "no comm");

    for (int c = 0; c < RC_COUNT; c++)
        raw_comm_unmap(&comms[c]);
    munmap(map, 4096);
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/* MemRegister and MemDeregister refusals on a raw connection. */
static void test_raw_mem_checks(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    raw_result_t res;
    void *map, *map2;

    int unsealed = sealed_memfd(4096, false, &map);
    Ovl__Response *r = raw_mem_register(&rc, unsealed, 4096, 0, &res);
    raw_expect_error(r, res, OVL_ERR_PERMISSION, "sealed memfd");
    close(unsealed);
    munmap(map, 4096);

    int fd = sealed_memfd(4096, true, &map2);
    r = raw_mem_register(&rc, fd, 0, 0, &res);
    raw_expect_error(r, res, OVL_ERR_INVALID, "zero bytes");
    r = raw_mem_register(&rc, fd, 8192, 0, &res);
    raw_expect_error(r, res, OVL_ERR_RANGE, "lies outside");
    r = raw_mem_register(&rc, fd, 4096, 4096, &res);
    raw_expect_error(r, res, OVL_ERR_RANGE, "lies outside");
    r = raw_mem_register(&rc, fd, 16, UINT64_MAX - 8, &res);
    raw_expect_error(r, res, OVL_ERR_RANGE, "lies outside");
    r = raw_mem_register(&rc, -1, 4096, 0, &res); /* no descriptor at all */
    raw_expect_error(r, res, OVL_ERR_INVALID, "cannot register 4096 bytes");

    Ovl__MemDeregister md = OVL__MEM_DEREGISTER__INIT;
    md.mem_id = 31337;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_DEREGISTER;
    q.mem_deregister = &md;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "buffer 31337 is not registered");

    /* A good one, released twice. */
    md.mem_id = raw_mem_register_ok(&rc, fd, 4096);
    q.id = 0;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
    ovl__response__free_unpacked(r, NULL);
    q.id = 0;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_NOT_FOUND, "is not registered");
    raw_close(&rc);

    /* A MemRegister announcing a descriptor that does not come: the
     * stream no longer matches descriptors to frames, so it is closed. */
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    Ovl__MemRegister mr = OVL__MEM_REGISTER__INIT;
    mr.bytes = 4096;
    mr.fd_count = 1;
    Ovl__Request qm = OVL__REQUEST__INIT;
    qm.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    qm.mem_register = &mr;
    assert_int_equal(raw_call(&rc, &qm, NULL, 0, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_PROTOCOL, "did not come");
    assert_int_equal(raw_expect_closed(&rc, TIMEOUT_MS), RAW_CLOSED);
    raw_close(&rc);

    /* Two descriptors announced: the same. */
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    mr.fd_count = 2;
    int two[2] = {fd, fd};
    qm.id = 0;
    assert_int_equal(raw_call(&rc, &qm, two, 2, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_PROTOCOL, "at most one descriptor");
    assert_int_equal(raw_expect_closed(&rc, TIMEOUT_MS), RAW_CLOSED);
    raw_close(&rc);

    close(fd);
    munmap(map2, 4096);
    assert_alive(d);
    TEST_PASSED();
}

/* Packs q as one frame at out; returns its length. */
static size_t pack_frame(uint8_t *out, Ovl__Request *q)
{
    size_t n = ovl__request__pack(q, out + OVL_WIRE_HEADER_SIZE);
    ovl_wire_header_encode(out, (uint32_t)n);
    return OVL_WIRE_HEADER_SIZE + n;
}

/*
 * An op number out of order is a protocol error: libovl never sends one, so
 * the client is broken or hostile, and ringing its doorbell out of order
 * would move `done` backwards. The connection is closed with an Error that
 * says so; the daemon goes on serving.
 */
static void test_raw_op_out_of_order(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);
    raw_comm_t c;
    raw_join(&rc, hello->hello, "out-of-order", 0, &c);
    Ovl__AgGemm g = OVL__AG_GEMM__INIT;
    g.comm_id = c.id;
    g.seq = 5; /* expected: 1 */
    Ovl__Request qg = OVL__REQUEST__INIT;
    qg.body_case = OVL__REQUEST__BODY_AG_GEMM;
    qg.ag_gemm = &g;
    uint8_t buf[512];
    size_t len = pack_frame(buf, &qg);
    assert_int_equal(raw_send(rc.fd, buf, len), 0);
    Ovl__Response *r = NULL;
    assert_int_equal(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    raw_expect_error(r, RAW_OK, OVL_ERR_PROTOCOL, "op number 5 out of order");
    assert_true(raw_expect_closed(&rc, TIMEOUT_MS) != RAW_TIMEOUT);
    raw_comm_unmap(&c);
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/*
 * An op refused by the daemon on the spot (here: its job has ended, since
 * the other rank left) still rings the rank's doorbell, through the
 * backend's stream and the completion queue. A CommDestroy right behind it
 * (same write, so the daemon handles both in one pass) ends the job at
 * once: the completion must not reach a member that is gone. Repeated, on
 * fresh jobs; the daemon must still serve.
 */
static void test_leave_right_after_refused_op(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);
    for (int i = 0; i < 20; i++) {
        char job[32];
        snprintf(job, sizeof(job), "gone-%d", i);
        raw_comm_t c0, c1;
        raw_join2(&rc, hello->hello, job, 2, 0, 0, &c0);
        raw_join2(&rc, hello->hello, job, 2, 1, 1, &c1);

        /* rank 1 leaves: the job takes no more ops */
        Ovl__CommDestroy cd1 = OVL__COMM_DESTROY__INIT;
        cd1.comm_id = c1.id;
        Ovl__Request q1 = OVL__REQUEST__INIT;
        q1.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
        q1.comm_destroy = &cd1;
        Ovl__Response *r = NULL;
        assert_int_equal(raw_call(&rc, &q1, NULL, 0, &r), RAW_OK);
        assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
        ovl__response__free_unpacked(r, NULL);
        raw_comm_unmap(&c1);

        Ovl__AgGemm g = OVL__AG_GEMM__INIT;
        g.comm_id = c0.id;
        g.seq = 1;
        Ovl__Request qg = OVL__REQUEST__INIT;
        qg.body_case = OVL__REQUEST__BODY_AG_GEMM;
        qg.ag_gemm = &g;
        Ovl__CommDestroy cd = OVL__COMM_DESTROY__INIT;
        cd.comm_id = c0.id;
        Ovl__Request qd = OVL__REQUEST__INIT;
        qd.id = ++rc.next_id;
        qd.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
        qd.comm_destroy = &cd;
        uint8_t buf[512];
        size_t len = pack_frame(buf, &qg);
        len += pack_frame(buf + len, &qd);
        assert_int_equal(raw_send(rc.fd, buf, len), 0);

        raw_result_t res = raw_read_response(&rc, TIMEOUT_MS, &r);
        if (res != RAW_OK)
            fail_msg("round %d: no answer to CommDestroy (%s): ovld %s", i, raw_result_name(res),
                     daemon_running(d) ? "runs" : "is gone");
        assert_int_equal(r->id, qd.id);
        assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
        ovl__response__free_unpacked(r, NULL);
        /* the refused op still rang, with its reason */
        raw_wait_done(&c0, 1);
        assert_int_equal(__atomic_load_n(&c0.db->error, __ATOMIC_ACQUIRE), OVL_ERR_ABORTED);
        raw_comm_unmap(&c0);
        fixture_sleep_ms(2);
        if (!daemon_running(d))
            fail_msg("round %d: ovld died (status %d) after a CommDestroy that followed a "
                     "refused op",
                     i, d->exit_status);
    }
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/*
 * A deregistration that waits for a running op is answered from inside that
 * op's completion; the connection's next request, sent in the same write, is
 * a CommDestroy that ends the job there and then (and, in the second round,
 * the client hangs up instead). The daemon must neither touch the freed job
 * nor crash (ASan builds catch the use after free).
 */
static void test_deregister_then_leave_during_op(void **state)
{
    test_daemon_t *d = *state;
    enum { BIG = 768 }; /* a host GEMM long enough to still run when the rest arrives */
    size_t mat = (size_t)BIG * BIG * sizeof(float);
    for (int round = 0; round < 2; round++) {
        raw_conn_t rc;
        assert_int_equal(raw_open(&rc, d->sock), 0);
        Ovl__Response *hello = NULL;
        assert_int_equal(raw_hello(&rc, &hello), RAW_OK);
        void *map;
        int fd = sealed_memfd(3 * mat, true, &map);
        uint64_t mem = raw_mem_register_ok(&rc, fd, 3 * mat);
        close(fd);
        memset(map, 0, 3 * mat);
        char job[32];
        snprintf(job, sizeof(job), "dereg-leave-%d", round);
        raw_comm_t c;
        raw_join(&rc, hello->hello, job, 0, &c);

        Ovl__AgGemm g;
        Ovl__BufRef refs[3];
        raw_gemm_init(&g, refs, c.id, 1, mem);
        for (int i = 0; i < 3; i++)
            refs[i].offset = (uint64_t)i * mat;
        g.m = g.n = g.k = BIG;
        g.lda = g.ldb = g.ldc = BIG;
        __atomic_store_n(&c.db->ready, 1, __ATOMIC_RELEASE);
        Ovl__Request qg = OVL__REQUEST__INIT;
        qg.body_case = OVL__REQUEST__BODY_AG_GEMM;
        qg.ag_gemm = &g;
        Ovl__MemDeregister md = OVL__MEM_DEREGISTER__INIT;
        md.mem_id = mem;
        Ovl__Request qm = OVL__REQUEST__INIT;
        qm.id = ++rc.next_id;
        qm.body_case = OVL__REQUEST__BODY_MEM_DEREGISTER;
        qm.mem_deregister = &md;
        Ovl__CommDestroy cd = OVL__COMM_DESTROY__INIT;
        cd.comm_id = c.id;
        Ovl__Request qd = OVL__REQUEST__INIT;
        qd.id = ++rc.next_id;
        qd.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
        qd.comm_destroy = &cd;
        uint8_t buf[1024];
        size_t len = pack_frame(buf, &qg);
        len += pack_frame(buf + len, &qm);
        if (round == 0)
            len += pack_frame(buf + len, &qd);
        assert_int_equal(raw_send(rc.fd, buf, len), 0);
        if (round == 0) {
            /* both answered, in order, once the op is done */
            for (int i = 0; i < 2; i++) {
                Ovl__Response *r = NULL;
                assert_int_equal(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
                assert_int_equal(r->id, i == 0 ? qm.id : qd.id);
                assert_int_equal(r->body_case, OVL__RESPONSE__BODY_OK);
                ovl__response__free_unpacked(r, NULL);
            }
        }
        raw_comm_unmap(&c);
        munmap(map, 3 * mat);
        ovl__response__free_unpacked(hello, NULL);
        raw_close(&rc); /* round 1: hangs up with the deregistration waiting */
        fixture_sleep_ms(round == 1 ? 500 : 0);
        if (!daemon_running(d))
            fail_msg("round %d: ovld died (status %d)", round, d->exit_status);
    }
    assert_alive(d);
    TEST_PASSED();
}

/*
 * The only connected rank of a job still forming leaves with an op pending:
 * the op fails, and the job with its rank and buffers goes away at once
 * (it used to stay on the side for ever, and SIGTERM then waited 30 s).
 */
static void test_last_rank_leaves_with_op_pending(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);
    void *map;
    int fd = sealed_memfd(4096, true, &map);
    uint64_t mem = raw_mem_register_ok(&rc, fd, 4096);
    close(fd);
    raw_comm_t c;
    raw_join2(&rc, hello->hello, "forming-leaver", 2, 0, 0, &c);
    Ovl__AgGemm g;
    Ovl__BufRef refs[3];
    raw_gemm_init(&g, refs, c.id, 1, mem);
    raw_submit(&rc, &c, &g);
    /* a request after the op: the op is in before the hang-up */
    assert_alive(d);
    raw_comm_unmap(&c);
    munmap(map, 4096);
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    ovl_client_t *cl = NULL;
    assert_int_equal(ovl_connect(d->sock, &cl), OVL_OK);
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = NULL;
        assert_int_equal(libovl_status(cl, &r), OVL_OK);
        size_t jobs = r->status->n_jobs;
        uint64_t held = 0;
        for (size_t i = 0; i < r->status->n_devices; i++)
            held += r->status->devices[i]->held_bytes;
        libovl_response_free(r);
        if (jobs == 0 && held == 0)
            break;
        if (fixture_now_ms() >= deadline)
            fail_msg("the job is still there (%zu jobs, %" PRIu64 " bytes held)", jobs, held);
        fixture_sleep_ms(10);
    }
    ovl_disconnect(cl);
    uint64_t t0 = fixture_now_ms();
    assert_int_equal(daemon_stop(d), 0);
    if (fixture_now_ms() - t0 > 5000)
        fail_msg("SIGTERM took %" PRIu64 " ms: something was still in flight",
                 fixture_now_ms() - t0);
    TEST_PASSED();
}

/* ============================================================ mismatches */

typedef enum field {
    F_M,
    F_N,
    F_K,
    F_DTYPE,
    F_ALGO,
    F_TRANSB,
    F_CHUNKS,
    F_STREAMS,
    F_AOUT,
} field_t;

static const char *const field_names[] = {
    [F_M] = "m",
    [F_N] = "n",
    [F_K] = "k",
    [F_DTYPE] = "dtype",
    [F_ALGO] = "algo",
    [F_TRANSB] = "transb",
    [F_CHUNKS] = "chunks",
    [F_STREAMS] = "streams",
    [F_AOUT] = "a_out (given or not)",
};

/* Two ranks submit op 1 disagreeing on one field: both see MISMATCH naming
 * it; the error stays (a good op 2 does not clear it); the job lives on. */
static void mismatch_case(test_daemon_t *d, field_t f)
{
    const char *name = field_names[f];
    char job[32], needle[80];
    snprintf(job, sizeof(job), "mismatch-%d", (int)f);
    snprintf(needle, sizeof(needle), "ranks disagree on %s:", name);
    rank_t rk[2];
    rank_open(d, &rk[0], job, 2, 0, 0, 2);
    rank_open(d, &rk[1], job, 2, 1, 1, 2);
    opspec_t s0 = base_spec, s1 = base_spec;
    switch (f) {
    case F_M:
        s1.m = 5;
        break;
    case F_N:
        s1.n = 7;
        break;
    case F_K:
        s1.k = 6;
        break;
    case F_DTYPE:
        s1.dtype = OVL_DTYPE_FP16;
        break;
    case F_ALGO:
        s0.algo = OVL_ALGO_NAIVE, s1.algo = OVL_ALGO_RING;
        break;
    case F_TRANSB:
        s1.transb = 1;
        break;
    case F_CHUNKS:
        s0.chunks = 2, s1.chunks = 4;
        break;
    case F_STREAMS:
        s0.streams = 1, s1.streams = 2;
        break;
    case F_AOUT:
        s0.aout = true;
        break;
    }
    rank_fill(&rk[0], 0, &s0);
    rank_fill(&rk[1], 0, &s1);
    assert_status(rank_submit(&rk[0], 0, &s0), OVL_OK);
    assert_status(rank_submit(&rk[1], 0, &s1), OVL_OK);
    for (int r = 0; r < 2; r++) {
        ovl_status_t st = ovl_comm_synchronize(rk[r].comm);
        if (st != OVL_ERR_MISMATCH)
            fail_msg("rank %d, ranks disagreeing on %s: %s (%s), not OVL_ERR_MISMATCH", r, name,
                     ovl_strerror(st), ovl_last_error(rk[r].cl));
        assert_contains(ovl_last_error(rk[r].cl), needle);
        assert_contains(ovl_last_error(rk[r].cl), "op 1");
        assert_status(ovl_comm_check(rk[r].comm), OVL_ERR_MISMATCH);
    }
    /* Nothing was written to C. */
    uint32_t nan_bits = 0xffffffffu, c0;
    memcpy(&c0, rk[0].c, sizeof(c0));
    assert_int_equal(c0, nan_bits);

    /* Sticky: a good op 2 on both ranks still reports the mismatch. */
    opspec_t good = base_spec;
    good.salt = 1;
    for (int r = 0; r < 2; r++) {
        rank_fill(&rk[r], 1, &good);
        assert_status(rank_submit(&rk[r], 1, &good), OVL_OK);
    }
    for (int r = 0; r < 2; r++) {
        assert_status(ovl_comm_synchronize(rk[r].comm), OVL_ERR_MISMATCH);
        assert_contains(ovl_last_error(rk[r].cl), needle);
    }
    Ovl__Response *resp = status_call(rk[0].cl);
    const Ovl__JobInfo *j = find_job(resp, job);
    assert_non_null(j);
    assert_string_equal(j->state, "ready"); /* a refused op does not end the job */
    assert_contains(j->last_error, needle);
    libovl_response_free(resp);
    assert_status(rank_close(&rk[0]), OVL_ERR_MISMATCH);
    assert_status(rank_close(&rk[1]), OVL_ERR_MISMATCH);
    assert_alive(d);
    fresh_job_works(d, job, 2); /* the id is free again, and ops work */
}

#define MISMATCH_TEST(fname, field)                                                                \
    static void fname(void **state)                                                                \
    {                                                                                              \
        mismatch_case(*state, field);                                                              \
        TEST_PASSED();                                                                             \
    }
MISMATCH_TEST(test_mismatch_m, F_M)
MISMATCH_TEST(test_mismatch_n, F_N)
MISMATCH_TEST(test_mismatch_k, F_K)
MISMATCH_TEST(test_mismatch_dtype, F_DTYPE)
MISMATCH_TEST(test_mismatch_algo, F_ALGO)
MISMATCH_TEST(test_mismatch_transb, F_TRANSB)
MISMATCH_TEST(test_mismatch_chunks, F_CHUNKS)
MISMATCH_TEST(test_mismatch_streams, F_STREAMS)
MISMATCH_TEST(test_mismatch_a_out, F_AOUT)

/* ======================================================= ranks that leave */

/* What the killed child reports after op 1. */
typedef struct kill_report {
    int status;
    char msg[256];
} kill_report_t;

static void killed_child(test_daemon_t *d, const char *job, int out)
{
    kill_report_t rep = {0};
    alarm(20);
    rank_t rk;
    opspec_t s = base_spec;
    s.salt = 5;
    rep.status = rank_open_st(d, &rk, job, 2, 1, 1, 1, rep.msg, sizeof(rep.msg));
    if (rep.status == OVL_OK) {
        char joined = 'j';
        if (write(out, &joined, 1) != 1)
            _exit(3);
        rank_fill(&rk, 0, &s);
        rep.status = rank_submit(&rk, 0, &s);
        if (rep.status == OVL_OK)
            rep.status = ovl_comm_synchronize(rk.comm);
        if (rep.status != OVL_OK)
            snprintf(rep.msg, sizeof(rep.msg), "%s", ovl_last_error(rk.cl));
        else if (rank_verify(&rk, 0, &s, rep.msg, sizeof(rep.msg)) != 0)
            rep.status = OVL_ERR_INTERNAL;
    }
    if (write(out, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(3);
    for (;;)
        pause(); /* until SIGKILL (or the alarm) */
}

/*
 * A rank process dies (SIGKILL) while the other rank waits on op 2: the
 * survivor's ovl_comm_synchronize returns OVL_ERR_ABORTED within its
 * timeout, saying who left; the job is "aborted" and refuses new ranks; once
 * the survivor leaves the job ends, and a new job with the same id works.
 */
static void test_rank_killed_aborts_job(void **state)
{
    test_daemon_t *d = *state;
    const char *job = "killed";
    int out[2];
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(out[0]);
        killed_child(d, job, out[1]);
    }
    close(out[1]);
    rank_t r0;
    rank_open(d, &r0, job, 2, 0, 0, 2);
    char joined = 0;
    kill_report_t rep;
    if (read_full(out[0], &joined, 1, TIMEOUT_MS) != 0) {
        /* it reported a failure instead of joining */
        memset(&rep, 0, sizeof(rep));
        (void)read_full(out[0], (char *)&rep + 1, sizeof(rep) - 1, 100);
        kill(pid, SIGKILL);
        wait_child(pid, TIMEOUT_MS);
        fail_msg("the child did not join");
    }
    assert_int_equal(joined, 'j');

    /* Op 1, both ranks: fine. */
    opspec_t s = base_spec;
    s.salt = 5;
    rank_fill(&r0, 0, &s);
    assert_status(rank_submit(&r0, 0, &s), OVL_OK);
    rank_sync_ok(&r0);
    rank_check(&r0, 0, &s);
    if (read_full(out[0], &rep, sizeof(rep), TIMEOUT_MS) != 0) {
        kill(pid, SIGKILL);
        wait_child(pid, TIMEOUT_MS);
        fail_msg("no report from the child");
    }
    close(out[0]);
    if (rep.status != OVL_OK) {
        kill(pid, SIGKILL);
        wait_child(pid, TIMEOUT_MS);
        fail_msg("the child's op 1: %s: %s", ovl_strerror((ovl_status_t)rep.status), rep.msg);
    }

    /* Op 2 from rank 0 only; once the daemon holds it, rank 1 dies. */
    opspec_t s2 = base_spec;
    s2.salt = 6;
    rank_fill(&r0, 1, &s2);
    assert_status(rank_submit(&r0, 1, &s2), OVL_OK);
    wait_job_in_flight(r0.cl, job, 1);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(wait_child(pid, TIMEOUT_MS), -1); /* killed */

    uint64_t t0 = fixture_now_ms();
    ovl_status_t st = ovl_comm_synchronize(r0.comm);
    if (st != OVL_ERR_ABORTED)
        fail_msg("the survivor's synchronize: %s (%s), not OVL_ERR_ABORTED", ovl_strerror(st),
                 ovl_last_error(r0.cl));
    assert_true(fixture_now_ms() - t0 < TIMEOUT_MS);
    assert_contains(ovl_last_error(r0.cl), "op 2");
    assert_contains(ovl_last_error(r0.cl), "rank 1 left");
    assert_status(ovl_comm_check(r0.comm), OVL_ERR_ABORTED);

    wait_job_ops_done(r0.cl, job, 1);
    Ovl__Response *resp = status_call(r0.cl);
    const Ovl__JobInfo *j = find_job(resp, job);
    assert_non_null(j);
    assert_string_equal(j->state, "aborted");
    assert_contains(j->last_error, "rank 1 left");
    libovl_response_free(resp);

    /* The aborted job takes no new rank while the survivor is in it. */
    ovl_client_t *late = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(late, job, 2, 1, 1, &comm), OVL_ERR_ABORTED);
    assert_contains(ovl_last_error(late), "job 'killed' is aborted");
    /* Ops on the aborted job fail at once. */
    assert_status(rank_submit(&r0, 0, &s), OVL_OK);
    assert_status(ovl_comm_synchronize(r0.comm), OVL_ERR_ABORTED);

    assert_status(rank_close(&r0), OVL_ERR_ABORTED);
    wait_job_gone(late, job);
    ovl_disconnect(late);
    assert_alive(d);
    fresh_job_works(d, job, 2);
    TEST_PASSED();
}

/* Kills the test's ovld (SIGKILL) and reaps it; its pid. */
static pid_t kill_daemon(test_daemon_t *d)
{
    pid_t pid = d->pid;
    assert_int_equal(kill(pid, SIGKILL), 0);
    uint64_t t0 = fixture_now_ms();
    while (daemon_running(d) && fixture_now_ms() - t0 < TIMEOUT_MS)
        fixture_sleep_ms(5);
    assert_false(daemon_running(d));
    return pid;
}

/* ovl_comm_check says that rk's comm was given up for ovld (pid), which is
 * gone; and so it was: OVL_ERR_CLOSED in the error word, done and every done
 * slot past op 1. */
static void assert_released(rank_t *rk, pid_t pid)
{
    char pidtext[32];
    snprintf(pidtext, sizeof(pidtext), "ovld (pid %d) went away", (int)pid);
    assert_status(ovl_comm_check(rk->comm), OVL_ERR_CLOSED);
    assert_contains(ovl_last_error(rk->cl), pidtext);
    /* ovld sends its pidfd where the kernel has pidfd_open */
    assert_contains(ovl_last_error(rk->cl),
                    fixture_has_pidfd() ? "and it exited" : "cannot be seen from here");
    assert_contains(ovl_last_error(rk->cl), "op 1:");
    const struct ovl_doorbell *db = libovl_comm_doorbell(rk->comm);
    assert_int_equal(__atomic_load_n(&db->error, __ATOMIC_ACQUIRE), OVL_ERR_CLOSED);
    assert_true(__atomic_load_n(&db->done, __ATOMIC_ACQUIRE) > 1);
    for (uint32_t i = 0; i < OVL_READY_SLOTS; i++)
        assert_true((int64_t)(__atomic_load_n(&db->done_slot[i], __ATOMIC_ACQUIRE) - 1) >= 0);
}

/*
 * ovld killed while ranks wait: libovl's watcher notices the hangup and
 * that the process is gone (the pidfd ovld sent), and releases every wait
 * of the client's comms by itself (on a GPU, the streams'), with
 * OVL_ERR_CLOSED in the error word. The doorbells are watched without a
 * call into libovl, whose calls would also do it: that is the watcher
 * alone. Then the calls report it.
 */
static void test_daemon_killed_releases_waits(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[2];
    opspec_t s = base_spec;
    open_pair_rank0_waiting(d, rk, "orphans", &s);
    assert_status(ovl_comm_check(rk[0].comm), OVL_OK);

    uint64_t t0 = fixture_now_ms();
    pid_t pid = kill_daemon(d);
    for (uint32_t r = 0; r < 2; r++) {
        /* done is what the watcher stores last */
        const struct ovl_doorbell *db = libovl_comm_doorbell(rk[r].comm);
        while (__atomic_load_n(&db->done, __ATOMIC_ACQUIRE) <= 1 && fixture_now_ms() - t0 < 5000)
            fixture_sleep_ms(5);
        if (__atomic_load_n(&db->done, __ATOMIC_ACQUIRE) <= 1)
            fail_msg("rank %u: no release by the watcher %llu ms after the kill", r,
                     (unsigned long long)(fixture_now_ms() - t0));
        assert_released(&rk[r], pid);
    }
    /* The op that was pending ends at once, failed. */
    uint64_t t1 = fixture_now_ms();
    assert_status(ovl_comm_synchronize(rk[0].comm), OVL_ERR_CLOSED);
    assert_true(fixture_now_ms() - t1 < 1000);
    /* and new ones are refused */
    assert_status(rank_submit(&rk[0], 0, &s), OVL_ERR_CLOSED);
    for (uint32_t r = 0; r < 2; r++)
        assert_status(rank_close(&rk[r]), OVL_ERR_CLOSED);
    TEST_PASSED();
}

/*
 * The same without the watcher (OVL_WATCHER=0): nothing is released until
 * a libovl call finds ovld gone. Then that call does it on the caller's
 * thread: rank 0's ovl_comm_synchronize (a wait for its op), rank 1's
 * ovl_comm_check (no op).
 */
static void test_daemon_killed_calls_release_waits(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[2];
    opspec_t s = base_spec;
    assert_int_equal(setenv("OVL_WATCHER", "0", 1), 0);
    open_pair_rank0_waiting(d, rk, "no-watcher", &s);
    assert_int_equal(unsetenv("OVL_WATCHER"), 0);

    pid_t pid = kill_daemon(d);
    fixture_sleep_ms(200);
    for (uint32_t r = 0; r < 2; r++) /* no thread did it */
        assert_int_equal(__atomic_load_n(&libovl_comm_doorbell(rk[r].comm)->error, __ATOMIC_ACQUIRE),
                         0);
    uint64_t t1 = fixture_now_ms();
    assert_status(ovl_comm_synchronize(rk[0].comm), OVL_ERR_CLOSED);
    assert_true(fixture_now_ms() - t1 < 1000);
    assert_released(&rk[0], pid);
    assert_released(&rk[1], pid);
    for (uint32_t r = 0; r < 2; r++)
        assert_status(rank_close(&rk[r]), OVL_ERR_CLOSED);
    TEST_PASSED();
}

/* World 3 in this process: ranks 0 and 1 submit op 1, rank 2 disconnects
 * without a word: both get OVL_ERR_ABORTED. */
static void test_rank_disconnect_aborts_job(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[3];
    for (uint32_t r = 0; r < 3; r++)
        rank_open(d, &rk[r], "three", 3, r, (int)r, 1);
    opspec_t s = base_spec;
    for (uint32_t r = 0; r < 2; r++) {
        rank_fill(&rk[r], 0, &s);
        assert_status(rank_submit(&rk[r], 0, &s), OVL_OK);
    }
    wait_job_in_flight(rk[0].cl, "three", 1);
    ovl_disconnect(rk[2].cl);
    rk[2].cl = NULL;
    rk[2].comm = NULL;
    for (uint32_t r = 0; r < 2; r++) {
        ovl_status_t st = ovl_comm_synchronize(rk[r].comm);
        if (st != OVL_ERR_ABORTED)
            fail_msg("rank %u: %s (%s), not OVL_ERR_ABORTED", r, ovl_strerror(st),
                     ovl_last_error(rk[r].cl));
        assert_contains(ovl_last_error(rk[r].cl), "rank 2 left");
    }
    for (uint32_t r = 0; r < 2; r++)
        assert_status(rank_close(&rk[r]), OVL_ERR_ABORTED);
    assert_alive(d);
    fresh_job_works(d, "three", 3);
    TEST_PASSED();
}

/* A rank that leaves properly (ovl_comm_destroy) while the other waits on
 * an op it will never submit: the other gets OVL_ERR_ABORTED too. */
static void test_comm_destroy_aborts_waiting_rank(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[2];
    opspec_t s = base_spec;
    open_pair_rank0_waiting(d, rk, "leaver", &s);
    assert_status(ovl_comm_destroy(rk[1].comm), OVL_OK); /* it had no op of its own */
    rk[1].comm = NULL;
    assert_status(ovl_comm_synchronize(rk[0].comm), OVL_ERR_ABORTED);
    assert_contains(ovl_last_error(rk[0].cl), "rank 1 left");
    assert_contains(ovl_last_error(rk[0].cl), "comm destroyed");
    rank_close(&rk[1]);
    rank_close(&rk[0]);
    assert_alive(d);
    TEST_PASSED();
}

/*
 * A rank that leaves with nothing pending ends its job quietly: the job is
 * "ending", the other rank's later ops fail with OVL_ERR_ABORTED, nobody may
 * join; once everyone left the id is free again.
 */
static void test_idle_rank_leaves_job_ends(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[2];
    rank_open(d, &rk[0], "quiet", 2, 0, 0, 2);
    rank_open(d, &rk[1], "quiet", 2, 1, 1, 2);
    opspec_t s = base_spec;
    job_run_check(rk, 2, 0, &s);
    assert_status(ovl_comm_destroy(rk[1].comm), OVL_OK);
    rk[1].comm = NULL;
    assert_status(ovl_comm_check(rk[0].comm), OVL_OK); /* its op 1 stays good */

    Ovl__Response *resp = status_call(rk[0].cl);
    const Ovl__JobInfo *j = find_job(resp, "quiet");
    assert_non_null(j);
    assert_string_equal(j->state, "ending");
    assert_contains(j->last_error, "rank 1 left");
    libovl_response_free(resp);

    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(rk[1].cl, "quiet", 2, 1, 1, &comm), OVL_ERR_ABORTED);
    assert_contains(ovl_last_error(rk[1].cl), "job 'quiet' is ending");
    rank_fill(&rk[0], 1, &s);
    assert_status(rank_submit(&rk[0], 1, &s), OVL_OK);
    assert_status(ovl_comm_synchronize(rk[0].comm), OVL_ERR_ABORTED);
    assert_contains(ovl_last_error(rk[0].cl), "op 2");
    assert_contains(ovl_last_error(rk[0].cl), "rank 1 left");
    assert_status(rank_close(&rk[0]), OVL_ERR_ABORTED);
    wait_job_gone(rk[1].cl, "quiet");
    rank_close(&rk[1]);
    fresh_job_works(d, "quiet", 2);
    assert_alive(d);
    TEST_PASSED();
}

/*
 * max_ops_in_flight = 2, told to libovl at CommInit: a rank two ops ahead
 * of its doorbell waits in ovl_allgather_gemm for its first op (bounded by
 * its timeout: OVL_ERR_TIMEOUT, nothing sent), and goes on once the other
 * rank catches up. Every result is right.
 */
static void test_client_throttle(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[2];
    rank_open(d, &rk[0], "throttle", 2, 0, 0, 3);
    rank_open(d, &rk[1], "throttle", 2, 1, 1, 3);
    opspec_t s[3];
    for (unsigned i = 0; i < 3; i++) {
        s[i] = base_spec;
        s[i].salt = 60 + i;
        for (int r = 0; r < 2; r++)
            rank_fill(&rk[r], i, &s[i]);
    }
    assert_status(rank_submit(&rk[0], 0, &s[0]), OVL_OK);
    assert_status(rank_submit(&rk[0], 1, &s[1]), OVL_OK);
    ovl_set_timeout(rk[0].cl, 300);
    uint64_t t0 = fixture_now_ms();
    assert_status(rank_submit(&rk[0], 2, &s[2]), OVL_ERR_TIMEOUT);
    uint64_t waited = fixture_now_ms() - t0;
    assert_true(waited >= 250 && waited < 5000);
    assert_contains(ovl_last_error(rk[0].cl), "op 1 not done");
    ovl_set_timeout(rk[0].cl, TIMEOUT_MS);

    /* Rank 1 catches up; rank 0's third op now goes (it was not sent). */
    assert_status(rank_submit(&rk[1], 0, &s[0]), OVL_OK);
    assert_status(rank_submit(&rk[1], 1, &s[1]), OVL_OK);
    assert_status(rank_submit(&rk[0], 2, &s[2]), OVL_OK);
    assert_status(rank_submit(&rk[1], 2, &s[2]), OVL_OK);
    for (int r = 0; r < 2; r++)
        rank_sync_ok(&rk[r]);
    for (int r = 0; r < 2; r++)
        for (unsigned i = 0; i < 3; i++)
            rank_check(&rk[r], i, &s[i]);
    wait_job_ops_done(rk[0].cl, "throttle", 3);
    for (int r = 0; r < 2; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/*
 * max_ops_in_flight = 2 and a rank that ignores the throttle (raw AgGemm
 * requests): its third op, with two still waiting for rank 1, is refused
 * with OVL_ERR_LIMIT and the job is aborted. Its doorbell must end with
 * done = 3 (counters only grow: a waiter for op 3 must not miss it) and an
 * error; rank 1's next op fails with OVL_ERR_ABORTED.
 */
static void test_daemon_ops_limit(void **state)
{
    test_daemon_t *d = *state;
    rank_t r1;
    rank_open(d, &r1, "flood", 2, 1, 1, 1);
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    Ovl__Response *hello = NULL;
    assert_int_equal(raw_hello(&rc, &hello), RAW_OK);
    void *map;
    int fd = sealed_memfd(4096, true, &map);
    uint64_t mem = raw_mem_register_ok(&rc, fd, 4096);
    close(fd);
    raw_comm_t c0;
    raw_join2(&rc, hello->hello, "flood", 2, 0, 0, &c0);

    for (uint64_t seq = 1; seq <= 3; seq++) {
        Ovl__AgGemm g;
        Ovl__BufRef refs[3];
        raw_gemm_init(&g, refs, c0.id, seq, mem);
        raw_submit(&rc, &c0, &g);
    }
    /* Settled: the daemon holds no op record of the job any more. */
    wait_job_in_flight(r1.cl, "flood", 0);
    Ovl__Response *resp = status_call(r1.cl);
    const Ovl__JobInfo *j = find_job(resp, "flood");
    assert_non_null(j);
    char state_s[32], last[256];
    snprintf(state_s, sizeof(state_s), "%s", j->state);
    snprintf(last, sizeof(last), "%s", j->last_error);
    uint64_t ops_done = j->ops_done;
    libovl_response_free(resp);
    uint64_t done = __atomic_load_n(&c0.db->done, __ATOMIC_ACQUIRE);
    int32_t err = __atomic_load_n(&c0.db->error, __ATOMIC_ACQUIRE);
    uint64_t err_seq = __atomic_load_n(&c0.db->error_seq, __ATOMIC_ACQUIRE);

    rank_fill(&r1, 0, &base_spec);
    assert_status(rank_submit(&r1, 0, &base_spec), OVL_OK);
    assert_status(ovl_comm_synchronize(r1.comm), OVL_ERR_ABORTED);
    assert_contains(ovl_last_error(r1.cl), "max_ops_in_flight");

    assert_string_equal(state_s, "aborted");
    assert_contains(last, "max_ops_in_flight");
    assert_int_equal(ops_done, 0);
    if (err != OVL_ERR_LIMIT && err != OVL_ERR_ABORTED)
        fail_msg("rank 0's doorbell error is %d (%s) for op %" PRIu64, err,
                 ovl_strerror((ovl_status_t)err), err_seq);
    if (done != 3)
        fail_msg("rank 0 submitted ops 1 to 3 and all were rung, but its doorbell ends with "
                 "done = %" PRIu64 " (error %s at op %" PRIu64 "): a waiter for op 3 "
                 "(ovl_comm_synchronize) would hang",
                 done, ovl_strerror((ovl_status_t)err), err_seq);
    raw_comm_unmap(&c0);
    munmap(map, 4096);
    ovl__response__free_unpacked(hello, NULL);
    raw_close(&rc);
    rank_close(&r1);
    assert_alive(d);
    TEST_PASSED();
}

/* ====================================================== the good path */

/* Ten ops on a world-2 job, submitted back to back by each rank (rank 0's
 * ten before rank 1's first), one synchronize each; every op has its own
 * buffers and data, a different algorithm, transb, a_out and chunks. */
static void test_back_to_back_ops(void **state)
{
    test_daemon_t *d = *state;
    enum { NOPS = 10 };
    rank_t rk[2];
    rank_open(d, &rk[0], "b2b", 2, 0, 0, NOPS);
    rank_open(d, &rk[1], "b2b", 2, 1, 1, NOPS);
    opspec_t spec[NOPS];
    for (unsigned i = 0; i < NOPS; i++) {
        spec[i] = (opspec_t){.m = 8,
                             .n = 12,
                             .k = 16,
                             .transb = (int)(i % 2),
                             .aout = i % 3 == 0,
                             .dtype = OVL_DTYPE_FP32,
                             .algo = (ovl_algo_t)(i % OVL_ALGO_COUNT),
                             .chunks = i % 5 == 2 ? 4 : 0,
                             .streams = i % 7 == 3 ? 2 : 0,
                             .salt = i};
        for (int r = 0; r < 2; r++)
            rank_fill(&rk[r], i, &spec[i]);
    }
    for (int r = 0; r < 2; r++)
        for (unsigned i = 0; i < NOPS; i++)
            assert_status(rank_submit(&rk[r], i, &spec[i]), OVL_OK);
    for (int r = 0; r < 2; r++)
        rank_sync_ok(&rk[r]);
    for (int r = 0; r < 2; r++)
        for (unsigned i = 0; i < NOPS; i++)
            rank_check(&rk[r], i, &spec[i]);
    wait_job_ops_done(rk[0].cl, "b2b", NOPS);
    wait_job_in_flight(rk[0].cl, "b2b", 0);
    Ovl__Response *resp = status_call(rk[0].cl);
    const Ovl__JobInfo *j = find_job(resp, "b2b");
    assert_non_null(j);
    assert_string_equal(j->state, "ready");
    libovl_response_free(resp);
    for (int r = 0; r < 2; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* Two jobs on one daemon at once (sharing devices), their submissions
 * interleaved: both correct. */
/* A world-1 ring op gathers nothing, yet it used to raise the job's scratch
 * size, so that the next naive op larger than the scratch the ranks held
 * was not held back: its issue reallocated scratch that a queued op was
 * about to gather into (heap-use-after-free in ovld under ASan, a crash or
 * a hang without). One client alternates a large ring op with small and
 * growing naive ops, unsynchronised; every result is checked. */
static void test_scratch_growth_world1(void **state)
{
    test_daemon_t *d = *state;
    enum { ROUNDS = 20, OPS = 3 * ROUNDS };
    rank_t rk;
    rank_open(d, &rk, "scratch-growth", 1, 0, 0, OPS);
    opspec_t specs[OPS];
    for (unsigned r = 0; r < ROUNDS; r++) {
        opspec_t ring = base_spec, small = base_spec, medium = base_spec;
        ring.algo = OVL_ALGO_RING;
        ring.m = MAXDIM;
        ring.k = MAXDIM;
        small.algo = OVL_ALGO_NAIVE;
        small.m = 2;
        small.k = 2;
        medium.algo = OVL_ALGO_NAIVE;
        medium.m = 3 + r % (MAXDIM - 3); /* its scratch grows, round after round */
        medium.k = 3 + r % (MAXDIM - 3);
        specs[3 * r] = ring;
        specs[3 * r + 1] = small;
        specs[3 * r + 2] = medium;
    }
    for (unsigned i = 0; i < OPS; i++) {
        specs[i].salt = i;
        rank_fill(&rk, i, &specs[i]);
    }
    for (unsigned i = 0; i < OPS; i++)
        assert_status(rank_submit(&rk, i, &specs[i]), OVL_OK);
    rank_sync_ok(&rk);
    for (unsigned i = 0; i < OPS; i++)
        rank_check(&rk, i, &specs[i]);
    assert_status(ovl_comm_check(rk.comm), OVL_OK);
    assert_status(rank_close(&rk), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

static void test_two_jobs_interleaved(void **state)
{
    test_daemon_t *d = *state;
    enum { NOPS = 4 };
    rank_t x[2], y[3];
    for (uint32_t r = 0; r < 2; r++)
        rank_open(d, &x[r], "job-x", 2, r, (int)r, NOPS);
    for (uint32_t r = 0; r < 3; r++)
        rank_open(d, &y[r], "job-y", 3, r, (int)(2 - r), NOPS);
    opspec_t sx[NOPS], sy[NOPS];
    for (unsigned i = 0; i < NOPS; i++) {
        sx[i] = (opspec_t){.m = 4,
                           .n = 6,
                           .k = 5,
                           .dtype = OVL_DTYPE_FP32,
                           .algo = (ovl_algo_t)(i % 4),
                           .salt = 20 + i};
        sy[i] = (opspec_t){.m = 3,
                           .n = 7,
                           .k = 9,
                           .transb = 1,
                           .aout = i % 2 == 1,
                           .dtype = OVL_DTYPE_FP32,
                           .algo = (ovl_algo_t)(3 - i % 4),
                           .salt = 40 + i};
        for (uint32_t r = 0; r < 2; r++)
            rank_fill(&x[r], i, &sx[i]);
        for (uint32_t r = 0; r < 3; r++)
            rank_fill(&y[r], i, &sy[i]);
    }
    for (unsigned i = 0; i < NOPS; i++) {
        assert_status(rank_submit(&x[0], i, &sx[i]), OVL_OK);
        assert_status(rank_submit(&y[2], i, &sy[i]), OVL_OK);
        assert_status(rank_submit(&y[0], i, &sy[i]), OVL_OK);
        if (i % 2 == 1) { /* x1 and y1 lag one op behind, then catch up */
            assert_status(rank_submit(&x[1], i - 1, &sx[i - 1]), OVL_OK);
            assert_status(rank_submit(&y[1], i - 1, &sy[i - 1]), OVL_OK);
            assert_status(rank_submit(&x[1], i, &sx[i]), OVL_OK);
            assert_status(rank_submit(&y[1], i, &sy[i]), OVL_OK);
        }
    }
    for (uint32_t r = 0; r < 3; r++)
        rank_sync_ok(&y[r]);
    for (uint32_t r = 0; r < 2; r++)
        rank_sync_ok(&x[r]);
    for (unsigned i = 0; i < NOPS; i++) {
        for (uint32_t r = 0; r < 2; r++)
            rank_check(&x[r], i, &sx[i]);
        for (uint32_t r = 0; r < 3; r++)
            rank_check(&y[r], i, &sy[i]);
    }
    for (uint32_t r = 0; r < 2; r++)
        assert_status(rank_close(&x[r]), OVL_OK);
    for (uint32_t r = 0; r < 3; r++)
        assert_status(rank_close(&y[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

#define T(f)        cmocka_unit_test_setup_teardown(f, setup, teardown)
#define TC(f, conf) cmocka_unit_test_prestate_setup_teardown(f, setup, teardown, (void *)(conf))

/* An argument, if given, is a cmocka test filter (a pattern of test names). */
int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_join_same_rank_twice),
        T(test_join_rank_out_of_range),
        T(test_join_world_mismatch),
        T(test_join_bad_job_id),
        T(test_join_bad_device),
        T(test_join_hostile_fields),
        T(test_join_same_device_twice),
        TC(test_join_other_uid, "socket_mode = 0666\n"),
        T(test_op_client_checks),
        T(test_mem_register_checks),
        T(test_raw_op_checks),
        T(test_raw_mem_checks),
        T(test_raw_op_out_of_order),
        T(test_leave_right_after_refused_op),
        T(test_deregister_then_leave_during_op),
        T(test_last_rank_leaves_with_op_pending),
        T(test_mismatch_m),
        T(test_mismatch_n),
        T(test_mismatch_k),
        T(test_mismatch_dtype),
        T(test_mismatch_algo),
        T(test_mismatch_transb),
        T(test_mismatch_chunks),
        T(test_mismatch_streams),
        T(test_mismatch_a_out),
        T(test_rank_killed_aborts_job),
        T(test_rank_disconnect_aborts_job),
        T(test_comm_destroy_aborts_waiting_rank),
        T(test_daemon_killed_releases_waits),
        T(test_daemon_killed_calls_release_waits),
        T(test_idle_rank_leaves_job_ends),
        TC(test_client_throttle, "max_ops_in_flight = 2\n"),
        TC(test_daemon_ops_limit, "max_ops_in_flight = 2\n"),
        T(test_back_to_back_ops),
        T(test_two_jobs_interleaved),
        T(test_scratch_growth_world1),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}

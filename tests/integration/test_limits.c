/*
 * test_limits.c: what one user can take from ovld, and what ovld does when
 * a resource runs out, against a real ovld (host backend):
 *
 *  - per-uid quotas: connections, jobs, ranks, registrations, mapped bytes, and the
 *    daemon-wide mapping budget (max_mappings); each refusal names the
 *    limit and its value;
 *  - a connection that never says Hello is closed at hello_timeout_ms;
 *  - out of file descriptors, ovld neither spins nor floods its log, and
 *    serves again once descriptors are back;
 *  - a full listen backlog: ovl_connect retries within its timeout;
 *  - a reply larger than max_frame_bytes is an Error naming the limit;
 *  - a Plan request's Bs are held to an op's limits (at most 8, each n
 *    positive), the refusal naming the limit;
 *  - descriptors passed ahead of their requests are refused as such;
 *  - what a user other than root sees in Status;
 *  - users filling max_connections leave root a few connections more.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cmocka_fixture.h"
#include "libovl_internal.h"
#include "ops_fixture.h"

/* Fixtures: cmocka_fixture.h; connect_ok, status_call, assert_status,
 * TIMEOUT_MS and NOBODY: ops_fixture.h. */

/* Counts the lines of the daemon's log that contain needle. */
static int log_count(const test_daemon_t *d, const char *needle)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* ------------------------------------------------------------ quotas */

static void test_uid_connections(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl[3];
    for (int i = 0; i < 3; i++)
        cl[i] = connect_ok(d);
    ovl_client_t *extra = NULL;
    assert_status(ovl_connect(d->sock, &extra), OVL_ERR_LIMIT);
    assert_contains(ovl_connect_error(), "max_connections_per_uid = 3");
    ovl_disconnect(cl[0]);
    /* its closing reaches ovld a moment later */
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    while (ovl_connect(d->sock, &cl[0]) != OVL_OK) {
        if (fixture_now_ms() > deadline)
            fail_msg("no connection after one closed: %s", ovl_connect_error());
        fixture_sleep_ms(10);
    }
    for (int i = 0; i < 3; i++)
        ovl_disconnect(cl[i]);
    TEST_PASSED();
}

static void test_uid_jobs(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *c1, *c2, *c3 = NULL;
    assert_status(ovl_comm_init(cl, "quota-1", 2, 0, 0, &c1), OVL_OK);
    assert_status(ovl_comm_init(cl, "quota-2", 2, 0, 1, &c2), OVL_OK);
    assert_status(ovl_comm_init(cl, "quota-3", 2, 0, 2, &c3), OVL_ERR_LIMIT);
    assert_contains(ovl_last_error(cl), "max_jobs_per_uid = 2");
    /* joining one of its own jobs is no new job */
    ovl_client_t *cl2 = connect_ok(d);
    ovl_comm_t *c4;
    assert_status(ovl_comm_init(cl2, "quota-1", 2, 1, 3, &c4), OVL_OK);
    assert_status(ovl_comm_destroy(c4), OVL_OK);
    assert_status(ovl_comm_destroy(c1), OVL_OK);
    assert_status(ovl_comm_destroy(c2), OVL_OK);
    ovl_disconnect(cl2);
    ovl_disconnect(cl);
    TEST_PASSED();
}

static void test_uid_ranks(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *a = connect_ok(d), *b = connect_ok(d);
    ovl_comm_t *c[3], *extra = NULL;
    assert_status(ovl_comm_init(a, "ranks-1", 2, 0, 0, &c[0]), OVL_OK);
    assert_status(ovl_comm_init(b, "ranks-1", 2, 1, 1, &c[1]), OVL_OK);
    assert_status(ovl_comm_init(b, "ranks-2", 1, 0, 2, &c[2]), OVL_OK);
    /* a fourth rank, in a job of its own or one that exists */
    assert_status(ovl_comm_init(a, "ranks-3", 1, 0, 3, &extra), OVL_ERR_LIMIT);
    assert_contains(ovl_last_error(a), "uid 0 holds 3 ranks (max_ranks_per_uid = 3)");
    assert_status(ovl_comm_destroy(c[2]), OVL_OK); /* gives one back */
    assert_status(ovl_comm_init(a, "ranks-3", 1, 0, 3, &extra), OVL_OK);
    assert_status(ovl_comm_destroy(extra), OVL_OK);
    assert_status(ovl_comm_destroy(c[0]), OVL_OK);
    assert_status(ovl_comm_destroy(c[1]), OVL_OK);
    ovl_disconnect(a);
    ovl_disconnect(b);
    TEST_PASSED();
}

static void test_uid_registrations(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *a = connect_ok(d), *b = connect_ok(d);
    assert_non_null(ovl_host_alloc(a, 4096));
    assert_non_null(ovl_host_alloc(a, 4096));
    assert_non_null(ovl_host_alloc(b, 4096));
    assert_null(ovl_host_alloc(b, 4096));
    assert_contains(ovl_last_error(b), "uid 0 has 3 buffers registered");
    assert_contains(ovl_last_error(b), "max_registrations_per_uid = 3");
    ovl_disconnect(a); /* gives its two back */
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    while (!ovl_host_alloc(b, 4096)) {
        if (fixture_now_ms() > deadline)
            fail_msg("registrations not given back: %s", ovl_last_error(b));
        fixture_sleep_ms(10);
    }
    ovl_disconnect(b);
    TEST_PASSED();
}

static void test_uid_mapped_bytes(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *a = connect_ok(d), *b = connect_ok(d);
    assert_non_null(ovl_host_alloc(a, 48 << 10));
    assert_null(ovl_host_alloc(b, 32 << 10));
    assert_contains(ovl_last_error(b), "max_mapped_bytes_per_uid = 65536");
    assert_non_null(ovl_host_alloc(b, 16 << 10));
    ovl_disconnect(a);
    ovl_disconnect(b);
    TEST_PASSED();
}

static void test_max_mappings(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *a = connect_ok(d), *b = connect_ok(d);
    for (int i = 0; i < 3; i++)
        assert_non_null(ovl_host_alloc(a, 4096));
    assert_non_null(ovl_host_alloc(b, 4096));
    assert_null(ovl_host_alloc(b, 4096));
    assert_contains(ovl_last_error(b),
                    "ovld has 4 buffers mapped for all users (max_mappings = 4)");
    ovl_disconnect(a);
    ovl_disconnect(b);
    assert_alive(d);
    TEST_PASSED();
}

/* ------------------------------------------------------ Hello deadline */

static void test_hello_deadline(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t silent, polite;
    assert_int_equal(raw_open(&silent, d->sock), 0);
    assert_int_equal(raw_open(&polite, d->sock), 0);
    assert_int_equal(raw_hello(&polite, NULL), RAW_OK);
    uint64_t t0 = fixture_now_ms();
    Ovl__Response *r = NULL;
    assert_int_equal(raw_read_response(&silent, 5000, &r), RAW_OK);
    uint64_t waited = fixture_now_ms() - t0;
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
    assert_int_equal(r->error->status, OVL_ERR_TIMEOUT);
    assert_contains(r->error->message, "no Hello within 300 ms (hello_timeout_ms)");
    ovl__response__free_unpacked(r, NULL);
    assert_true(waited >= 200 && waited < 3000);
    assert_int_equal(raw_expect_closed(&silent, 2000), RAW_CLOSED);
    /* the one that said Hello stays, idle as it is */
    fixture_sleep_ms(400);
    Ovl__StatusRequest sq = OVL__STATUS_REQUEST__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_STATUS;
    q.status = &sq;
    assert_int_equal(raw_call(&polite, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
    ovl__response__free_unpacked(r, NULL);
    raw_close(&silent);
    raw_close(&polite);
    TEST_PASSED();
}

/* ------------------------------------------------ out of descriptors */

/* utime + stime of pid, in clock ticks. */
static long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the name may hold spaces */
    if (!p)
        return -1;
    unsigned long ut = 0, st = 0;
    /* fields after the name: state (3) ... utime (14), stime (15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

static void test_out_of_descriptors(void **state)
{
    test_daemon_t *d = *state;
    /* this test's own ovld: 64 descriptors */
    assert_int_equal(daemon_stop(d), 0);
    daemon_cleanup(d);
    setenv("OVL_TEST_NOFILE", "64", 1);
    int rc = daemon_start(d, NULL, NULL);
    unsetenv("OVL_TEST_NOFILE");
    assert_int_equal(rc, 0);

    enum { N = 80 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(d->sock);
        assert_true(fds[i] >= 0);
    }
    fixture_sleep_ms(300); /* ovld takes what it can */
    long t0 = cpu_ticks(d->pid);
    fixture_sleep_ms(1000);
    long t1 = cpu_ticks(d->pid);
    assert_true(t0 >= 0 && t1 >= t0);
    long hz = sysconf(_SC_CLK_TCK);
    /* spinning in accept took the whole second */
    if (t1 - t0 > hz / 4)
        fail_msg("ovld used %ld ticks of %ld in a second while out of descriptors", t1 - t0, hz);
    int lines = log_count(d, "Too many open files");
    if (lines != 1)
        fail_msg("%d log lines about running out of descriptors, not 1", lines);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    /* descriptors are back: ovld serves again, and says so once */
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    while (daemon_check_alive(d) != 0) {
        if (fixture_now_ms() > deadline)
            fail_msg("ovld does not serve again after its descriptors came back");
        fixture_sleep_ms(50);
    }
    assert_int_equal(log_count(d, "accepting connections again"), 1);
    TEST_PASSED();
}

/* ------------------------------------------------------ full backlog */

typedef struct connect_job {
    const char *path;
    ovl_status_t st;
    char err[256];
    ovl_client_t *cl;
} connect_job_t;

static void *connect_thread(void *arg)
{
    connect_job_t *j = arg;
    j->st = ovl_connect(j->path, &j->cl);
    snprintf(j->err, sizeof(j->err), "%s", ovl_connect_error());
    return NULL;
}

static void test_connect_full_backlog(void **state)
{
    test_daemon_t *d = *state;
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    /* fill the listen backlog while nobody accepts */
    enum { MAXFILL = 1024 };
    static int fill[MAXFILL];
    int n = 0;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
    for (; n < MAXFILL; n++) {
        fill[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        assert_true(fill[n] >= 0);
        if (connect(fill[n], (struct sockaddr *)&sa, sizeof(sa)) != 0) {
            assert_int_equal(errno, EAGAIN);
            close(fill[n]);
            break;
        }
    }
    assert_true(n > 0 && n < MAXFILL);
    connect_job_t j = {.path = d->sock};
    pthread_t t;
    uint64_t t0 = fixture_now_ms();
    assert_int_equal(pthread_create(&t, NULL, connect_thread, &j), 0);
    fixture_sleep_ms(300);
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    pthread_join(t, NULL);
    uint64_t took = fixture_now_ms() - t0;
    if (j.st != OVL_OK)
        fail_msg("ovl_connect with a full backlog: %s: %s", ovl_strerror(j.st), j.err);
    assert_true(took >= 250);
    ovl_disconnect(j.cl);
    for (int i = 0; i < n; i++)
        close(fill[i]);
    assert_alive(d);
    TEST_PASSED();
}

/* ------------------------------------------------- replies and frames */

static void test_plan_reply_too_large(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    Ovl__PlanRequest p = OVL__PLAN_REQUEST__INIT;
    Ovl__AgGemmParams g = OVL__AG_GEMM_PARAMS__INIT;
    p.kind = OVL__OP_KIND__OP_KIND_AG_GEMM;
    p.ag_gemm = &g;
    g.algo = OVL_ALGO_RING;
    p.world = 1024;
    p.rank = 3;
    g.m = 4096;
    g.n = 64;
    g.k = 64;
    g.dtype = OVL_DTYPE_BF16;
    g.chunks = 64;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_PLAN;
    q.plan = &p;
    Ovl__Response *r = NULL;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
    assert_int_equal(r->error->status, OVL_ERR_LIMIT);
    assert_contains(r->error->message, "over max_frame_bytes (1048576)");
    ovl__response__free_unpacked(r, NULL);
    /* the connection goes on: a small plan is answered */
    p.world = 2;
    p.rank = 1;
    g.chunks = 2;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_PLAN);
    ovl__response__free_unpacked(r, NULL);
    raw_close(&rc);
    TEST_PASSED();
}

/* The Bs of a Plan request (more_n) are checked as an op's (more_bs): at
 * most OVL_MAX_BS in all, each n positive; the refusal names the limit, and
 * the connection goes on. Within them ovld plans every B, whatever its n. */
static void test_plan_bs_refused(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    uint64_t more[OVL_MAX_BS] = {1, 2, 3, 4, 5, 6, 7, 8};
    Ovl__PlanRequest p = OVL__PLAN_REQUEST__INIT;
    Ovl__AgGemmParams g = OVL__AG_GEMM_PARAMS__INIT;
    p.kind = OVL__OP_KIND__OP_KIND_AG_GEMM;
    p.ag_gemm = &g;
    g.algo = OVL_ALGO_COLLECTIVE;
    p.world = 2;
    p.rank = 1;
    g.m = 64;
    g.n = 32;
    g.k = 16;
    g.transb = true;
    g.more_n = more;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_PLAN;
    q.plan = &p;
    static const struct {
        size_t count;
        uint64_t n1; /* B 2's n */
        const char *want;
    } refused[] = {
        {OVL_MAX_BS, 2, "cannot plan: 9 Bs: an op takes at most 8"},
        {2, 0, "cannot plan: n of B 2 must be positive"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        g.n_more_n = refused[i].count;
        more[1] = refused[i].n1;
        Ovl__Response *r = NULL;
        assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
        assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
        assert_int_equal(r->error->status, OVL_ERR_INVALID);
        assert_string_equal(r->error->message, refused[i].want);
        ovl__response__free_unpacked(r, NULL);
    }
    /* 8 Bs, the widest n there is among them: planned, every B named */
    g.n_more_n = OVL_MAX_BS - 1;
    more[1] = UINT64_MAX;
    Ovl__Response *r = NULL;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_PLAN);
    assert_string_equal(r->plan->algo, "collective");
    assert_string_equal(r->plan->kind, "ag_gemm");
    assert_contains(r->plan->text, "plan format=5 kind=ag_gemm algo=collective ");
    assert_contains(r->plan->text, " transb=yes ");
    assert_contains(r->plan->text, "\nbs nb=8 n=32,1,18446744073709551615,3,4,5,6,7\n");
    assert_contains(r->plan->text, " B7=7x16 ");
    ovl__response__free_unpacked(r, NULL);
    raw_close(&rc);
    TEST_PASSED();
}

/* A Plan request's op is an Op's: a kind ovld runs, with its parameters,
 * and of its buffers only those the kind makes optional, each in range and
 * once; each refusal says which, and the connection goes on. The gathered
 * A given (slot 3) is planned into a_out. */
static void test_plan_kind_and_slots(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    Ovl__AgGemmParams g = OVL__AG_GEMM_PARAMS__INIT;
    g.algo = OVL_ALGO_RING;
    g.m = 8;
    g.n = 8;
    g.k = 8;
    uint64_t given[2];
    static const struct {
        uint64_t kind;
        bool params;
        size_t ngiven;
        uint64_t given[2];
        const char *want;
    } refused[] = {
        {0, true, 0, {0}, "unknown op kind 0"},
        {OVL__OP_KIND__OP_KIND_GEMM_RS + 1, true, 0, {0}, "unknown op kind 3"},
        {OVL__OP_KIND__OP_KIND_GEMM_RS, true, 0, {0}, "carries its parameters in gemm_rs"},
        {OVL__OP_KIND__OP_KIND_AG_GEMM,
         false,
         0,
         {0},
         "carries its parameters in ag_gemm, and only there"},
        {OVL__OP_KIND__OP_KIND_AG_GEMM, true, 1, {99}, "buffer slot 99 out of range"},
        {OVL__OP_KIND__OP_KIND_AG_GEMM, true, 2, {3, 3}, "buffer slot 3 (a_out) given twice"},
        {OVL__OP_KIND__OP_KIND_AG_GEMM,
         true,
         1,
         {0},
         "cannot plan: buffer slot 0 (a) is not one an op of kind ag_gemm may leave out"},
        {OVL__OP_KIND__OP_KIND_AG_GEMM,
         true,
         1,
         {5},
         "cannot plan: buffer slot 5 (b2) is not one an op of kind ag_gemm may leave out"},
    };
    Ovl__PlanRequest p = OVL__PLAN_REQUEST__INIT;
    p.world = 2;
    p.rank = 0;
    p.given = given;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_PLAN;
    q.plan = &p;
    Ovl__Response *r = NULL;
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        p.kind = refused[i].kind;
        p.ag_gemm = refused[i].params ? &g : NULL;
        p.n_given = refused[i].ngiven;
        memcpy(given, refused[i].given, sizeof(given));
        assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
        assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
        assert_int_equal(r->error->status, OVL_ERR_INVALID);
        assert_contains(r->error->message, refused[i].want);
        ovl__response__free_unpacked(r, NULL);
    }
    p.kind = OVL__OP_KIND__OP_KIND_AG_GEMM;
    p.ag_gemm = &g;
    p.n_given = 1;
    given[0] = 3;
    assert_int_equal(raw_call(&rc, &q, NULL, 0, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_PLAN);
    assert_string_equal(r->plan->kind, "ag_gemm");
    assert_contains(r->plan->text, " a_out=yes ");
    assert_contains(r->plan->text, "(a_out)");
    ovl__response__free_unpacked(r, NULL);
    raw_close(&rc);
    TEST_PASSED();
}

/* Sends one byte with one descriptor. */
static int send_byte_fd(int sock, uint8_t byte, int fd)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &mh, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static void test_fds_ahead_of_frames(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    assert_int_equal(raw_open(&rc, d->sock), 0);
    assert_int_equal(raw_hello(&rc, NULL), RAW_OK);
    /* the start of a frame, a byte and a descriptor at a time: 17 fds
     * queue up ahead of any request that could take them */
    uint8_t frame[32] = {'O', 'V', 'L', '1', 24, 0, 0, 0};
    int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(nul >= 0);
    for (int i = 0; i < 17; i++) {
        assert_int_equal(send_byte_fd(rc.fd, frame[i], nul), 0);
        fixture_sleep_ms(2); /* one recvmsg each */
    }
    close(nul);
    Ovl__Response *r = NULL;
    assert_int_equal(raw_read_response(&rc, 5000, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
    assert_int_equal(r->error->status, OVL_ERR_LIMIT);
    assert_contains(r->error->message,
                    "more than 16 file descriptors were passed ahead of the requests");
    ovl__response__free_unpacked(r, NULL);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/* ------------------------------------------------------------ Status */

typedef struct view {
    int stage; /* 0: done */
    int restricted;
    uint32_t jobs, clients, other_jobs, other_clients;
    uint32_t foreign; /* jobs or clients of another uid that it was shown */
} view_t;

static void view_child(test_daemon_t *d, int out, int go)
{
    view_t v = {.stage = 1};
    alarm(20);
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        goto out;
    v.stage = 2;
    ovl_client_t *cl = NULL;
    if (ovl_connect(d->sock, &cl) != OVL_OK)
        goto out;
    ovl_comm_t *comm;
    if (ovl_comm_init(cl, "nobody-job", 2, 0, 1, &comm) != OVL_OK)
        goto out;
    v.stage = 3;
    Ovl__Response *r = NULL;
    if (libovl_status(cl, &r) != OVL_OK)
        goto out;
    v.stage = 0;
    v.restricted = r->status->restricted;
    v.jobs = (uint32_t)r->status->n_jobs;
    v.clients = (uint32_t)r->status->n_clients;
    v.other_jobs = r->status->other_jobs;
    v.other_clients = r->status->other_clients;
    for (size_t i = 0; i < r->status->n_jobs; i++)
        v.foreign += r->status->jobs[i]->owner_uid != NOBODY;
    for (size_t i = 0; i < r->status->n_clients; i++)
        v.foreign += r->status->clients[i]->uid != NOBODY;
    libovl_response_free(r);
out:
    if (write(out, &v, sizeof(v)) != (ssize_t)sizeof(v))
        _exit(3);
    char c;
    while (read(go, &c, 1) < 0 && errno == EINTR)
        ;
    _exit(0);
}

static void test_status_restricted(void **state)
{
    test_daemon_t *d = *state;
    if (geteuid() != 0) {
        TEST_PASSED();
        skip();
    }
    assert_int_equal(chmod(d->dir, 0711), 0);
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm;
    assert_status(ovl_comm_init(cl, "root-job", 2, 0, 0, &comm), OVL_OK);
    int out, go;
    pid_t pid = fixture_fork_child(d, view_child, &out, &go);
    assert_true(pid > 0);
    view_t v;
    ssize_t got = read(out, &v, sizeof(v));
    close(out);
    if (got == (ssize_t)sizeof(v) && v.stage == 1) { /* no CAP_SETUID (a container) */
        close(go);
        waitpid(pid, NULL, 0);
        TEST_PASSED();
        skip();
    }
    assert_int_equal(got, sizeof(v));
    assert_int_equal(v.stage, 0);
    assert_true(v.restricted);
    assert_int_equal(v.foreign, 0);
    assert_int_equal(v.jobs, 1);
    assert_int_equal(v.clients, 1);
    assert_int_equal(v.other_jobs, 1);
    assert_int_equal(v.other_clients, 1);

    /* root sees everything */
    Ovl__Response *r = status_call(cl);
    assert_false(r->status->restricted);
    assert_int_equal(r->status->n_jobs, 2);
    assert_int_equal(r->status->n_clients, 2);
    assert_int_equal(r->status->other_jobs, 0);
    libovl_response_free(r);
    close(go);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    TEST_PASSED();
}

/* ------------------------------------------------ the operator's reserve */

typedef struct fill {
    int stage; /* 0: done; 1: no CAP_SETUID */
    int extra_st;
    char extra_err[256];
} fill_t;

/* As nobody: takes every connection of max_connections (3), then asks for
 * one more; holds them until told to go. */
static void fill_child(test_daemon_t *d, int out, int go)
{
    fill_t v = {.stage = 1};
    ovl_client_t *cl[3] = {0};
    alarm(20);
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        goto out;
    v.stage = 2;
    for (int i = 0; i < 3; i++)
        if (ovl_connect(d->sock, &cl[i]) != OVL_OK)
            goto out;
    v.stage = 0;
    ovl_client_t *extra = NULL;
    v.extra_st = ovl_connect(d->sock, &extra);
    snprintf(v.extra_err, sizeof(v.extra_err), "%s", ovl_connect_error());
out:
    if (write(out, &v, sizeof(v)) != (ssize_t)sizeof(v))
        _exit(3);
    char c;
    while (read(go, &c, 1) < 0 && errno == EINTR)
        ;
    _exit(0);
}

/* Users filling max_connections do not lock root out: 8 more
 * (OVLD_CONNS_RESERVED, server/conn.c) are root's and ovld's own user's; each
 * refusal names the limit. */
static void test_connections_reserved(void **state)
{
    test_daemon_t *d = *state;
    if (geteuid() != 0) {
        TEST_PASSED();
        skip();
    }
    assert_int_equal(chmod(d->dir, 0711), 0);
    int out, go;
    pid_t pid = fixture_fork_child(d, fill_child, &out, &go);
    assert_true(pid > 0);
    fill_t v;
    ssize_t got = read(out, &v, sizeof(v));
    close(out);
    if (got == (ssize_t)sizeof(v) && v.stage == 1) { /* no CAP_SETUID (a container) */
        close(go);
        waitpid(pid, NULL, 0);
        TEST_PASSED();
        skip();
    }
    assert_int_equal(got, sizeof(v));
    assert_int_equal(v.stage, 0);
    assert_int_equal(v.extra_st, OVL_ERR_LIMIT);
    assert_contains(v.extra_err, "too many connections (max_connections = 3");
    /* root: status still answers, on up to 8 connections past the limit */
    ovl_client_t *cl[8];
    for (int i = 0; i < 8; i++)
        cl[i] = connect_ok(d);
    assert_contains(v.extra_err, "too many connections (max_connections = 3; 8 more are kept "
                                 "for root and ovld's own user)");
    Ovl__Response *r = status_call(cl[7]);
    assert_true(r->status->n_clients >= 11);
    libovl_response_free(r);
    ovl_client_t *extra = NULL;
    assert_status(ovl_connect(d->sock, &extra), OVL_ERR_LIMIT);
    assert_contains(ovl_connect_error(), "max_connections = 3, and the 8 beyond it kept for "
                                         "root and ovld's own user are taken");
    for (int i = 0; i < 8; i++)
        ovl_disconnect(cl[i]);
    close(go);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    TEST_PASSED();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        TC(test_uid_connections, "max_connections_per_uid = 3\n"),
        TC(test_uid_jobs, "max_jobs_per_uid = 2\n"),
        TC(test_uid_ranks, "max_ranks_per_uid = 3\n"),
        TC(test_uid_registrations, "max_registrations_per_uid = 3\n"),
        TC(test_uid_mapped_bytes, "max_mapped_bytes_per_uid = 64K\n"),
        TC(test_max_mappings, "max_mappings = 4\n"),
        TC(test_hello_deadline, "hello_timeout_ms = 300\n"),
        TC(test_out_of_descriptors, NULL),
        TC(test_connect_full_backlog, "max_connections_per_uid = 4096\nmax_connections = 4096\n"),
        TC(test_plan_reply_too_large, NULL),
        TC(test_plan_bs_refused, NULL),
        TC(test_plan_kind_and_slots, NULL),
        TC(test_fds_ahead_of_frames, NULL),
        TC(test_status_restricted, "socket_mode = 0666\n"),
        TC(test_connections_reserved, "socket_mode = 0666\nmax_connections = 3\n"),
    };
    return RUN_TESTS("limits", tests, argc, argv);
}

/*
 * test_report.c: unit test of the reports of ovld's silent modules
 * (daemon/util/report.c) and of their way into the log (ovld_log_report,
 * daemon/util/log.c): a report reaches its function once, formatted, at its
 * level, from any thread; a NULL reporter drops it; a long one is cut, not
 * overrun; every level becomes a log line at its own priority, and the log
 * level still filters them. The executor's slow-issue warning goes to its
 * pool's reporter, and nothing to the log. The host backend's failures
 * come back to the caller as words (err; last_error where it has one), and
 * neither the log nor the reporter hears of them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "exec.h"
#include "log.h"
#include "plan.h"
#include "report.h"

/* What a reporter was handed. */
#define MAXREP 64
typedef struct {
    pthread_mutex_t mu; /* reports come from several threads */
    unsigned n;
    ovld_report_level_t level[MAXREP];
    char msg[MAXREP][1100];
} reports_t;

static void on_report(void *arg, ovld_report_level_t level, const char *msg)
{
    reports_t *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->n < MAXREP) {
        r->level[r->n] = level;
        snprintf(r->msg[r->n], sizeof(r->msg[r->n]), "%s", msg);
    }
    r->n++;
    pthread_mutex_unlock(&r->mu);
}

static reports_t *reports_new(void)
{
    reports_t *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void reports_free(reports_t *r)
{
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* stderr goes to a temporary file from capture_begin to capture_end, which
 * returns what was written there (the caller frees it). */
typedef struct {
    int fd, saved;
} capture_t;

static void capture_begin(capture_t *c)
{
    char path[] = "/tmp/ovl-test-report.XXXXXX";
    c->fd = mkstemp(path);
    assert_true(c->fd >= 0);
    unlink(path);
    fflush(stderr);
    c->saved = dup(STDERR_FILENO);
    assert_true(c->saved >= 0);
    assert_int_equal(dup2(c->fd, STDERR_FILENO), STDERR_FILENO);
}

static char *capture_end(capture_t *c)
{
    fflush(stderr);
    assert_int_equal(dup2(c->saved, STDERR_FILENO), STDERR_FILENO);
    close(c->saved);
    off_t len = lseek(c->fd, 0, SEEK_END);
    assert_true(len >= 0);
    char *text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(pread(c->fd, text, (size_t)len, 0), len);
    close(c->fd);
    return text;
}

static void test_report_formats_and_calls(void **state)
{
    (void)state;
    reports_t *r = reports_new();
    ovld_reporter_t rep = {.fn = on_report, .arg = r};
    ovld_report(&rep, OVLD_REPORT_WARN, "device %d: op %u not done after %s", 3, 17u, "5 s");
    ovld_report(&rep, OVLD_REPORT_INFO, "plain");
    assert_int_equal(r->n, 2);
    assert_int_equal(r->level[0], OVLD_REPORT_WARN);
    assert_string_equal(r->msg[0], "device 3: op 17 not done after 5 s");
    assert_int_equal(r->level[1], OVLD_REPORT_INFO);
    assert_string_equal(r->msg[1], "plain");
    reports_free(r);
}

static void test_report_dropped_without_function(void **state)
{
    (void)state;
    /* No reporter, or one without a function: nothing happens (a module
     * made without one, as the unit tests' mocks are). */
    ovld_report(NULL, OVLD_REPORT_ERROR, "lost %d", 1);
    ovld_reporter_t none = {.fn = NULL, .arg = NULL};
    ovld_report(&none, OVLD_REPORT_ERROR, "lost %d", 2);
}

static void test_report_long_is_cut(void **state)
{
    (void)state;
    reports_t *r = reports_new();
    ovld_reporter_t rep = {.fn = on_report, .arg = r};
    char big[3000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ovld_report(&rep, OVLD_REPORT_ERROR, "%s", big);
    assert_int_equal(r->n, 1);
    size_t len = strlen(r->msg[0]);
    assert_true(len > 0 && len < 1024); /* cut at the helper's buffer */
    reports_free(r);
}

typedef struct {
    const ovld_reporter_t *rep;
    int id;
} thread_arg_t;

static void *report_from_thread(void *arg)
{
    thread_arg_t *t = arg;
    for (int i = 0; i < 8; i++)
        ovld_report(t->rep, OVLD_REPORT_DEBUG, "thread %d report %d", t->id, i);
    return NULL;
}

static void test_report_from_threads(void **state)
{
    (void)state;
    /* The watchdog, stream threads and workers report at once: each report
     * arrives whole (the helper formats on the caller's stack). */
    reports_t *r = reports_new();
    ovld_reporter_t rep = {.fn = on_report, .arg = r};
    pthread_t th[4];
    thread_arg_t args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg_t){.rep = &rep, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, report_from_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(r->n, 32);
    unsigned seen[4] = {0};
    for (unsigned i = 0; i < r->n; i++) {
        int id = -1, k = -1;
        assert_int_equal(sscanf(r->msg[i], "thread %d report %d", &id, &k), 2);
        assert_true(id >= 0 && id < 4 && k >= 0 && k < 8);
        assert_int_equal(seen[id] & (1u << k), 0);
        seen[id] |= 1u << k;
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(seen[i], 0xffu);
    reports_free(r);
}

static void test_log_report_levels(void **state)
{
    (void)state;
    /* Under systemd each line starts with its priority: the level shows. */
    setenv("JOURNAL_STREAM", "0:0", 1);
    ovld_log_init(OVLD_LOG_DEBUG);
    ovld_reporter_t rep = {.fn = ovld_log_report, .arg = NULL};
    capture_t c;
    capture_begin(&c);
    ovld_report(&rep, OVLD_REPORT_ERROR, "e %d", 1);
    ovld_report(&rep, OVLD_REPORT_WARN, "w %d", 2);
    ovld_report(&rep, OVLD_REPORT_INFO, "i %d", 3);
    ovld_report(&rep, OVLD_REPORT_DEBUG, "d %d", 4);
    ovld_log_report(NULL, OVLD_REPORT_COUNT, "out of range"); /* a bug: still a line */
    ovld_log_set_level(OVLD_LOG_WARN);
    ovld_report(&rep, OVLD_REPORT_INFO, "filtered");
    char *text = capture_end(&c);
    ovld_log_init(OVLD_LOG_INFO);
    unsetenv("JOURNAL_STREAM");
    assert_string_equal(text, "<3>e 1\n<4>w 2\n<6>i 3\n<7>d 4\n<3>out of range\n");
    free(text);
}

/* ------------------------------------------ the executor's slow issue */

/* A backend whose rank 1 takes longer to queue its WAIT_READY than the
 * executor waits before it says so (EXEC_SLOW_MS, 3 s). */
struct ovld_rank {
    int id;
};

static _Atomic int g_dones;

static ovl_status_t slow_reserve_events(ovld_rank_t *r, uint32_t n)
{
    (void)r;
    (void)n;
    return OVL_OK;
}

static ovl_status_t slow_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    (void)stream;
    (void)seq;
    if (r->id == 1) {
        /* 1.5 s past the executor's wait: margin for a loaded machine. A
         * signal (the stall report's) may cut the sleep short. */
        struct timespec ts = {4, 500 * 1000000};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    return OVL_OK;
}

static void slow_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
                      const char *message, void *cookie)
{
    (void)r;
    (void)stream;
    (void)seq;
    (void)message;
    (void)cookie;
    if (status == OVL_OK)
        g_dones++;
}

static void test_exec_slow_issue_reported(void **state)
{
    (void)state;
    /* The executor asks for the slow thread's stack (SIGUSR2), which ovld's
     * stall report handles; here it must not end the test. */
    struct sigaction sa = {.sa_handler = SIG_IGN}, old;
    assert_int_equal(sigaction(SIGUSR2, &sa, &old), 0);
    static const ovld_backend_ops_t ops = {
        .name = "slow",
        .issue_parallel = true,
        .reserve_events = slow_reserve_events,
        .wait_ready = slow_wait_ready,
        .done = slow_done,
    };
    ovld_backend_t b = {.ops = &ops};
    struct ovld_rank ranks[2] = {{.id = 0}, {.id = 1}};
    ovl_instr_t instr[2][2];
    ovl_plan_t plans[2];
    ovld_exec_rank_t xr[2];
    for (int r = 0; r < 2; r++) {
        instr[r][0] = (ovl_instr_t){.kind = OVL_I_WAIT_READY};
        instr[r][1] = (ovl_instr_t){.kind = OVL_I_DONE};
        plans[r] = (ovl_plan_t){.params = {.world = 2, .rank = (uint32_t)r},
                                .nstreams = 1,
                                .ninstr = 2,
                                .instr = instr[r]};
        xr[r] = (ovld_exec_rank_t){.rank = &ranks[r], .plan = &plans[r]};
    }
    ovld_exec_op_t op = {.seq = 7, .world = 2, .ranks = xr};

    reports_t *r = reports_new();
    ovld_reporter_t rep = {.fn = on_report, .arg = r};
    ovld_exec_pool_t *pool = NULL;
    assert_int_equal(ovld_exec_pool_create(&rep, &pool), OVL_OK);
    unsetenv("JOURNAL_STREAM");
    ovld_log_init(OVLD_LOG_DEBUG); /* a log line, had there been one, would show */
    g_dones = 0;
    capture_t c;
    capture_begin(&c);
    char err[256] = "";
    ovl_status_t st = ovld_exec_run(pool, &b, &op, NULL, err, sizeof(err));
    char *text = capture_end(&c);
    ovld_log_init(OVLD_LOG_INFO);
    ovld_exec_pool_destroy(pool);
    assert_int_equal(sigaction(SIGUSR2, &old, NULL), 0);

    if (st != OVL_OK)
        fail_msg("%s: %s", ovl_strerror(st), err);
    assert_int_equal(g_dones, 2);
    assert_string_equal(text, "");
    assert_int_equal(r->n, 1);
    assert_int_equal(r->level[0], OVLD_REPORT_WARN);
    assert_string_equal(r->msg[0],
                        "op 7: rank 1 still issuing instruction 0 (WAIT_READY) after 3000 ms");
    free(text);
    reports_free(r);
}

/* --------------------------------------- the host backend's failures */

static void no_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status, const char *message,
                    uint64_t ns)
{
    (void)ns;
    (void)arg;
    (void)cookie;
    (void)seq;
    (void)status;
    (void)message;
}

/* A memfd of `bytes`, sealed against shrinking or not. */
static int memfd(uint64_t bytes, bool sealed)
{
    int fd = memfd_create("ovl-test-report", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    if (sealed)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    return fd;
}

/* Imports imp, which must fail with want; returns the words (static). */
static const char *import_fails(ovld_backend_t *b, ovld_mem_import_t imp, ovl_status_t want)
{
    static char why[200];
    why[0] = '\0';
    ovld_bmem_t *mem = NULL;
    void *ptr = NULL;
    ovl_status_t st = b->ops->mem_import(b, &imp, &mem, &ptr, why, sizeof(why));
    if (st != want)
        fail_msg("import: %s, not %s (%s)", ovl_strerror(st), ovl_strerror(want), why);
    assert_null(mem);
    return why;
}

static void test_host_failures_are_words(void **state)
{
    (void)state;
    unsetenv("JOURNAL_STREAM");
    ovld_log_init(OVLD_LOG_DEBUG); /* a log line, had there been one, would show */
    reports_t *r = reports_new();
    ovld_reporter_t rep = {.fn = on_report, .arg = r};
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    ovld_config_t cfg;
    ovld_config_defaults(&cfg);
    cfg.host_devices = 2;
    capture_t c;
    capture_begin(&c);

    ovld_backend_t *b = NULL;
    char err[256] = "";
    ovl_status_t st =
        ovld_backend_host_create(&loop, &cfg, no_done, NULL, &rep, &b, err, sizeof(err));
    assert_int_equal(st, OVL_OK);

    /* Imports: what was wrong with the memory, in the client's words (the
     * backend owns and closes every descriptor it is given). */
    ovld_mem_import_t imp = {.fd = -1, .bytes = 4096, .device = 0};
    const char *why = import_fails(b, imp, OVL_ERR_INVALID);
    char no_fd[200];
    snprintf(no_fd, sizeof(no_fd), "%s", why);
    imp.fd = memfd(4096, false);
    char unsealed[200];
    snprintf(unsealed, sizeof(unsealed), "%s", import_fails(b, imp, OVL_ERR_PERMISSION));
    imp.fd = memfd(4096, true);
    imp.bytes = 8192;
    char outside[200];
    snprintf(outside, sizeof(outside), "%s", import_fails(b, imp, OVL_ERR_RANGE));
    int p[2];
    assert_int_equal(pipe(p), 0);
    close(p[1]);
    imp.fd = p[0];
    imp.bytes = 4096;
    char pipe_words[200];
    snprintf(pipe_words, sizeof(pipe_words), "%s", import_fails(b, imp, OVL_ERR_INVALID));

    /* Ranks: a device that is not there. */
    ovld_rank_t *rk = NULL;
    ovld_doorbell_export_t db = {.fd = -1};
    char rank_words[200] = "";
    assert_int_equal(b->ops->rank_create(b, 5, &rk, &db, rank_words, sizeof(rank_words)),
                     OVL_ERR_NOT_FOUND);
    assert_null(rk);

    /* Enqueue failures: the status, and last_error's words on the thread
     * that made the call, where the backend keeps them (the host backend's
     * come with the rewrite of its streams). */
    char none[200] = "";
    assert_int_equal(b->ops->rank_create(b, 0, &rk, &db, none, sizeof(none)), OVL_OK);
    close(db.fd);
    assert_int_equal(b->ops->record(rk, 0, 1u << 20), OVL_ERR_LIMIT);
    char event_words[200] = "";
    if (b->ops->last_error)
        snprintf(event_words, sizeof(event_words), "%s", b->ops->last_error(b));
    void *scratch = NULL;
    assert_int_equal(b->ops->rank_scratch(b, rk, 4096, &scratch, none, sizeof(none)), OVL_OK);
    assert_non_null(scratch);
    b->ops->rank_destroy(b, rk);
    bool b_had_last_error = b->ops->last_error != NULL;
    b->ops->destroy(b);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0);
    char *text = capture_end(&c);
    ovld_log_init(OVLD_LOG_INFO);

    print_message("import without a memfd: %s\n", no_fd);
    print_message("unsealed: %s\nout of range: %s\n", unsealed, outside);
    print_message("a pipe: %s\nno device: %s\n", pipe_words, rank_words);
    print_message("event: %s\n", event_words);
    assert_true(no_fd[0] != '\0');
    assert_non_null(strstr(unsealed, "sealed memfd"));
    assert_non_null(strstr(outside, "lies outside"));
    assert_non_null(strstr(pipe_words, "not a regular file"));
    assert_non_null(strstr(rank_words, "no such device"));
    if (b_had_last_error)
        assert_true(event_words[0] != '\0');
    /* Said once, to the caller: not to the log, not as a report. */
    assert_string_equal(text, "");
    assert_int_equal(r->n, 0);
    free(text);
    reports_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_formats_and_calls),
        cmocka_unit_test(test_report_dropped_without_function),
        cmocka_unit_test(test_report_long_is_cut),
        cmocka_unit_test(test_report_from_threads),
        cmocka_unit_test(test_log_report_levels),
        cmocka_unit_test(test_exec_slow_issue_reported),
        cmocka_unit_test(test_host_failures_are_words),
    };
    return cmocka_run_group_tests_name("report", tests, NULL, NULL);
}

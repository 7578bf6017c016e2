/*
 * test_stall.c: unit test of ovld's stall report (daemon/util/stall.c). A timer
 * callback blocks the loop thread well past the threshold; the report must
 * say so, carry the loop thread's own stack (this file's stuck_in_callback
 * frame, named because the test is linked with exported symbols), and say
 * when the loop turns again. A loop that keeps turning reports nothing, and
 * the heartbeat neither keeps the loop alive nor leaks its handle.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "stall.h"
#include "clock.h"

#define THRESHOLD_MS 200

/* Exported (not static) so that backtrace_symbols names it. */
__attribute__((noinline)) void stuck_in_callback(unsigned ms)
{
    uint64_t end = ovl_mono_ms() + ms;
    while (ovl_mono_ms() < end) {
        struct timespec ts = {0, 10 * 1000000}; /* the signal cuts a sleep short */
        nanosleep(&ts, NULL);
    }
}

typedef struct {
    ovld_stall_t *stall;
    unsigned block_ms;
    uv_timer_t block, end;
} run_t;

static void on_block(uv_timer_t *t)
{
    run_t *r = t->data;
    stuck_in_callback(r->block_ms);
}

static void on_end(uv_timer_t *t)
{
    run_t *r = t->data;
    ovld_stall_stop(r->stall);
    r->stall = NULL;
    uv_close((uv_handle_t *)&r->block, NULL);
    uv_close((uv_handle_t *)&r->end, NULL);
}

/* Runs a loop that blocks for block_ms after 20 ms and ends at end_ms;
 * returns what went to stderr meanwhile. */
static char *run_loop(unsigned block_ms, unsigned end_ms)
{
    char path[] = "/tmp/ovl-test-stall.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);

    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    run_t r = {.block_ms = block_ms};
    assert_int_equal(ovld_stall_start(&r.stall, &loop, THRESHOLD_MS), 0);
    assert_non_null(r.stall);
    assert_int_equal(uv_timer_init(&loop, &r.block), 0);
    assert_int_equal(uv_timer_init(&loop, &r.end), 0);
    r.block.data = r.end.data = &r;
    if (block_ms)
        assert_int_equal(uv_timer_start(&r.block, on_block, 20, 0), 0);
    assert_int_equal(uv_timer_start(&r.end, on_end, end_ms, 0), 0);
    /* Returns once on_end closed the last referenced handles: the unref'd
     * heartbeat does not hold the loop. */
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&loop), 0); /* every handle closed */

    fflush(stderr);
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    assert_true(len >= 0);
    char *text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)len, 0), len);
    close(fd);
    return text;
}

static void test_stall_reported_with_stack(void **state)
{
    (void)state;
    /* blocked 6x the threshold, then a second of turning loop */
    char *text = run_loop(6 * THRESHOLD_MS, 6 * THRESHOLD_MS + 1000);
    print_message("%s", text);
    assert_non_null(strstr(text, "the event loop has not turned for"));
    assert_non_null(strstr(text, "ovld: stack of thread "));
    assert_non_null(strstr(text, "stuck_in_callback"));
    assert_non_null(strstr(text, "the event loop turned again after a stall of"));
    /* once per stall */
    const char *first = strstr(text, "has not turned");
    assert_null(strstr(first + 1, "has not turned"));
    free(text);
}

static void test_turning_loop_is_quiet(void **state)
{
    (void)state;
    char *text = run_loop(0, 5 * THRESHOLD_MS);
    assert_string_equal(text, "");
    free(text);
}

static void test_bad_threshold(void **state)
{
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    ovld_stall_t *s = (ovld_stall_t *)&loop;
    assert_int_not_equal(ovld_stall_start(&s, &loop, 0), 0);
    assert_null(s);
    ovld_stall_stop(NULL);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    ovld_log_init(OVLD_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stall_reported_with_stack),
        cmocka_unit_test(test_turning_loop_is_quiet),
        cmocka_unit_test(test_bad_threshold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

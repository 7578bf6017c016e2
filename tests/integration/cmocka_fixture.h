/*
 * cmocka_fixture.h: what the cmocka integration tests share on top of
 * daemon_fixture.h: one ovld per test (setup/teardown, the prestate being
 * the configuration file's text; T and TC make the entries of main's
 * array, RUN_TESTS runs it), its log printed when a test failed, and a few
 * assertions. Include after cmocka.h; static, one copy per test file.
 */
#ifndef OVL_CMOCKA_FIXTURE_H
#define OVL_CMOCKA_FIXTURE_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_fixture.h"

/* Set by each test as its last step: a teardown that finds it false prints
 * the daemon's log, which the failed assertion did not show. */
static bool g_passed;
#define TEST_PASSED() (g_passed = true)

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        const char *h_ = (hay);                                                                    \
        if (!h_ || !strstr(h_, (needle)))                                                          \
            fail_msg("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", (needle));              \
    } while (0)

static int setup(void **state)
{
    const char *config = *state;
    g_passed = false;
    unsetenv("OVL_WATCHER"); /* a test that set it and failed must not pass it on */
    test_daemon_t *d = calloc(1, sizeof(*d));
    if (!d)
        return -1;
    if (daemon_start(d, config, NULL) != 0) {
        free(d);
        return -1;
    }
    *state = d;
    return 0;
}

/* A test that stopped the daemon itself (d->pid 0) is not held to an exit
 * status here. */
static int teardown(void **state)
{
    test_daemon_t *d = *state;
    bool was_running = d->pid > 0;
    int st = daemon_stop(d);
    if (!g_passed && st == 0)
        daemon_print_log(d);
    daemon_cleanup(d);
    free(d);
    if (was_running && st != 0) {
        fprintf(stderr, "teardown: ovld exited with status %d after SIGTERM\n", st);
        return -1;
    }
    return 0;
}

static void assert_alive(test_daemon_t *d)
{
    assert_int_equal(daemon_check_alive(d), 0);
}

/* A test with a daemon of its own, started without a configuration file
 * (T) or with conf as the file's text (TC). */
#define T(f)        cmocka_unit_test_setup_teardown(f, setup, teardown)
#define TC(f, conf) cmocka_unit_test_prestate_setup_teardown(f, setup, teardown, (void *)(conf))

/* main's last step: runs its array `tests` as the group `name`; a first
 * argument, if given, is a cmocka test filter (a pattern of test names). */
#define RUN_TESTS(name, tests, argc, argv)                                                         \
    ((argc) > 1 ? cmocka_set_test_filter((argv)[1]) : (void)0,                                     \
     cmocka_run_group_tests_name(name, tests, NULL, NULL))

#endif /* OVL_CMOCKA_FIXTURE_H */

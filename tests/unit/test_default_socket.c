/*
 * test_default_socket.c: ovl_default_socket (client/libovl.c), the rule by
 * which libovl, ovlctl and ovl-demo find ovld when given no socket:
 * $OVL_SOCKET, then /run/ovl/UID/ovld.sock (ovld@UID.service), then
 * $XDG_RUNTIME_DIR/ovl/ovld.sock (ovld-user.service), then
 * /run/ovl/ovld.sock. A temporary directory stands in for /run/ovl through
 * $OVL_RUNTIME_DIR (meant for tests only), another for $XDG_RUNTIME_DIR.
 * Sockets are bound here, with nobody accepting: the rule looks at the file
 * system only, never connects. tests/integration/test_peruser.py checks the
 * same rules with real ovlds, ovlctl and ovl-demo.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ovl.h"

typedef struct fixture {
    char top[64];       /* mkdtemp */
    char run[96];       /* top/run: $OVL_RUNTIME_DIR */
    char xdg[96];       /* top/xdg: $XDG_RUNTIME_DIR */
    char per_user[160]; /* run/UID/ovld.sock */
    char user_mgr[160]; /* xdg/ovl/ovld.sock */
    char node[160];     /* run/ovld.sock */
    int fds[8];
    int nfds;
} fixture_t;

static void mkdir_ok(const char *path)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", path, strerror(errno));
}

/* A socket file at path (its directory made first), bound and left open. */
static void make_socket(fixture_t *f, const char *path)
{
    char dir[160];
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = '\0';
    mkdir_ok(dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_true(f->nfds < 8);
    f->fds[f->nfds++] = fd;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    const char *tmp = getenv("TMPDIR");
    snprintf(f->top, sizeof(f->top), "%s/ovl-defsock-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    assert_non_null(mkdtemp(f->top));
    snprintf(f->run, sizeof(f->run), "%s/run", f->top);
    snprintf(f->xdg, sizeof(f->xdg), "%s/xdg", f->top);
    mkdir_ok(f->run);
    mkdir_ok(f->xdg);
    snprintf(f->per_user, sizeof(f->per_user), "%s/%u/ovld.sock", f->run, (unsigned)geteuid());
    snprintf(f->user_mgr, sizeof(f->user_mgr), "%s/ovl/ovld.sock", f->xdg);
    snprintf(f->node, sizeof(f->node), "%s/ovld.sock", f->run);
    unsetenv("OVL_SOCKET");
    setenv("OVL_RUNTIME_DIR", f->run, 1);
    setenv("XDG_RUNTIME_DIR", f->xdg, 1);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    for (int i = 0; i < f->nfds; i++)
        close(f->fds[i]);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->top);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", f->top);
    unsetenv("OVL_RUNTIME_DIR");
    unsetenv("XDG_RUNTIME_DIR");
    unsetenv("OVL_SOCKET");
    free(f);
    return 0;
}

/* The default now, with its rule. */
static ovl_socket_rule_t pick(char *buf, size_t len)
{
    ovl_socket_rule_t rule = 0;
    assert_int_equal(ovl_default_socket(buf, len, &rule), OVL_OK);
    return rule;
}

/* Each rule in order: every candidate present, then one taken away at a
 * time, and $OVL_SOCKET over all of them. */
static void test_order(void **state)
{
    fixture_t *f = *state;
    char buf[256];
    /* nothing there: the node-wide default (under OVL_RUNTIME_DIR) */
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    assert_string_equal(buf, f->node);

    make_socket(f, f->node);
    make_socket(f, f->user_mgr);
    make_socket(f, f->per_user);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_PER_USER);
    assert_string_equal(buf, f->per_user);

    /* $OVL_SOCKET wins, whether or not it exists */
    setenv("OVL_SOCKET", "/nonexistent/env.sock", 1);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_ENV);
    assert_string_equal(buf, "/nonexistent/env.sock");
    /* empty is unset */
    setenv("OVL_SOCKET", "", 1);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_PER_USER);
    unsetenv("OVL_SOCKET");

    assert_int_equal(unlink(f->per_user), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_USER_MANAGER);
    assert_string_equal(buf, f->user_mgr);

    /* without $XDG_RUNTIME_DIR, or with a relative one, no such candidate */
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    assert_string_equal(buf, f->node);
    setenv("XDG_RUNTIME_DIR", "xdg", 1);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    setenv("XDG_RUNTIME_DIR", f->xdg, 1);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_USER_MANAGER);

    assert_int_equal(unlink(f->user_mgr), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    assert_string_equal(buf, f->node);

    /* the node-wide default is chosen whether or not it exists */
    assert_int_equal(unlink(f->node), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    assert_string_equal(buf, f->node);

    /* without the override: the real paths (a per-user ovld may run here) */
    unsetenv("OVL_RUNTIME_DIR");
    unsetenv("XDG_RUNTIME_DIR");
    char want[64];
    snprintf(want, sizeof(want), "/run/ovl/%u/ovld.sock", (unsigned)geteuid());
    ovl_socket_rule_t r = pick(buf, sizeof(buf));
    if (r == OVL_SOCKET_RULE_PER_USER) {
        assert_string_equal(buf, want);
    } else {
        assert_int_equal(r, OVL_SOCKET_RULE_NODE);
        assert_string_equal(buf, OVL_DEFAULT_SOCKET);
    }
}

/* A per-user path that is not a socket, or a directory without one, is
 * passed over; so is one that belongs to another user (checked as root,
 * who can give a file away). */
static void test_passed_over(void **state)
{
    fixture_t *f = *state;
    char buf[256];
    char dir[160];
    snprintf(dir, sizeof(dir), "%s/%u", f->run, (unsigned)geteuid());
    mkdir_ok(dir);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE); /* an empty directory */
    int fd = open(f->per_user, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE); /* a plain file */
    assert_int_equal(unlink(f->per_user), 0);
    make_socket(f, f->per_user);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_PER_USER);
    if (geteuid() != 0) {
        print_message("not root: the ownership checks are left out\n");
        return;
    }
    /* root's candidates must be root's: give the socket, then its directory
     * away */
    assert_int_equal(chown(f->per_user, 4242, 4242), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    assert_int_equal(chown(f->per_user, 0, 0), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_PER_USER);
    assert_int_equal(chown(dir, 4242, 4242), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
    assert_int_equal(chown(dir, 0, 0), 0);
    make_socket(f, f->user_mgr);
    assert_int_equal(chown(f->user_mgr, 4242, 4242), 0);
    assert_int_equal(unlink(f->per_user), 0);
    assert_int_equal(pick(buf, sizeof(buf)), OVL_SOCKET_RULE_NODE);
}

/* The buffer: NULL or too small is OVL_ERR_INVALID (with "" where there is
 * room for it), exact fit is fine, and the rule is still said. */
static void test_buffer(void **state)
{
    fixture_t *f = *state;
    char buf[256];
    ovl_socket_rule_t rule = 0;
    assert_int_equal(ovl_default_socket(NULL, 0, &rule), OVL_ERR_INVALID);
    assert_int_equal(rule, OVL_SOCKET_RULE_NODE);
    size_t need = strlen(f->node) + 1;
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(ovl_default_socket(buf, need - 1, NULL), OVL_ERR_INVALID);
    assert_string_equal(buf, "");
    assert_int_equal(ovl_default_socket(buf, need, NULL), OVL_OK);
    assert_string_equal(buf, f->node);
    /* a long $OVL_SOCKET does not fit a small buffer, but a large one */
    char longp[300];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[0] = '/';
    longp[sizeof(longp) - 1] = '\0';
    setenv("OVL_SOCKET", longp, 1);
    assert_int_equal(ovl_default_socket(buf, sizeof(buf), &rule), OVL_ERR_INVALID);
    assert_int_equal(rule, OVL_SOCKET_RULE_ENV);
    char big[512];
    assert_int_equal(ovl_default_socket(big, sizeof(big), NULL), OVL_OK);
    assert_string_equal(big, longp);
    /* ovl_connect refuses it as too long for a socket address */
    ovl_client_t *cl = NULL;
    assert_int_equal(ovl_connect(NULL, &cl), OVL_ERR_INVALID);
    assert_non_null(strstr(ovl_connect_error(), "too long"));
    unsetenv("OVL_SOCKET");
}

/* ovl_connect names the path tried and the rule that chose it. */
static void test_connect_message(void **state)
{
    fixture_t *f = *state;
    ovl_client_t *cl = NULL;
    assert_int_equal(ovl_connect(NULL, &cl), OVL_ERR_CONNECT);
    const char *e = ovl_connect_error();
    assert_non_null(strstr(e, f->node));
    assert_non_null(strstr(e, "node-wide default"));
    assert_non_null(strstr(e, f->per_user)); /* and what it looked for first */
    assert_non_null(strstr(e, f->user_mgr));
    /* a per-user socket that nobody accepts on is still the choice */
    make_socket(f, f->per_user);
    close(f->fds[--f->nfds]); /* the file stays, nobody listens */
    assert_int_equal(ovl_connect(NULL, &cl), OVL_ERR_CONNECT);
    e = ovl_connect_error();
    char want[200];
    snprintf(want, sizeof(want), "cannot connect to %s (the per-user socket of ovld@%u.service)",
             f->per_user, (unsigned)geteuid());
    assert_non_null(strstr(e, want));
    setenv("OVL_SOCKET", "/nonexistent/env.sock", 1);
    assert_int_equal(ovl_connect(NULL, &cl), OVL_ERR_CONNECT);
    assert_non_null(strstr(ovl_connect_error(), "/nonexistent/env.sock (from $OVL_SOCKET)"));
    /* an explicit path is tried as given */
    assert_int_equal(ovl_connect("/nonexistent/given.sock", &cl), OVL_ERR_CONNECT);
    assert_non_null(strstr(ovl_connect_error(), "cannot connect to /nonexistent/given.sock: "));
    unsetenv("OVL_SOCKET");
    assert_null(cl);
}

static void test_rule_names(void **state)
{
    (void)state;
    for (int r = 0; r <= 5; r++)
        assert_non_null(ovl_socket_rule_name((ovl_socket_rule_t)r));
    assert_string_equal(ovl_socket_rule_name(OVL_SOCKET_RULE_ENV), "$OVL_SOCKET");
    assert_string_equal(ovl_socket_rule_name(OVL_SOCKET_RULE_NODE), "node-wide default");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_passed_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_message, setup, teardown),
        cmocka_unit_test(test_rule_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

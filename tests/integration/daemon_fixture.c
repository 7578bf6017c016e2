/*
 * daemon_fixture.c: see daemon_fixture.h.
 */
#include "daemon_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/close_range.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libovl_internal.h"

#ifndef OVLD_BIN_DEFAULT
#error "OVLD_BIN_DEFAULT must be defined (-DOVLD_BIN_DEFAULT=\"/path/to/ovld\")"
#endif

#define MAX_EXTRA_ARGS 16
#define MAX_LIVE       16

/* Daemons still running, killed at exit if a failed test left one behind. */
static test_daemon_t *live[MAX_LIVE];
static bool atexit_done;

uint64_t fixture_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool fixture_has_pidfd(void)
{
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

void fixture_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void kill_leftovers(void)
{
    for (size_t i = 0; i < MAX_LIVE; i++) {
        test_daemon_t *d = live[i];
        /* A forked test child runs these handlers too if it calls exit():
         * only the test process that started a daemon may end it. */
        if (d && d->owner == getpid()) {
            fprintf(stderr, "daemon_fixture: ovld (pid %d) left running; killing it\n",
                    (int)d->pid);
            daemon_print_log(d);
            daemon_cleanup(d);
        }
    }
}

static void track(test_daemon_t *d, bool on)
{
    if (on && !atexit_done) {
        atexit(kill_leftovers);
        atexit_done = true;
    }
    for (size_t i = 0; i < MAX_LIVE; i++) {
        if (on && !live[i]) {
            live[i] = d;
            return;
        }
        if (!on && live[i] == d) {
            live[i] = NULL;
            return;
        }
    }
}

void daemon_print_log(const test_daemon_t *d)
{
    if (!d->log[0])
        return;
    FILE *f = fopen(d->log, "r");
    fprintf(stderr, "----- ovld log (%s) -----\n", d->log);
    if (!f) {
        fprintf(stderr, "(cannot open: %s)\n", strerror(errno));
    } else {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
            fwrite(buf, 1, n, stderr);
        fclose(f);
    }
    fprintf(stderr, "----- end of ovld log -----\n");
}

int daemon_write_file(const test_daemon_t *d, const char *name, const char *text, char *ret_path,
                      size_t pathlen)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", d->dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "daemon_fixture: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t len = strlen(text);
    bool ok = fwrite(text, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        fprintf(stderr, "daemon_fixture: writing %s failed\n", path);
        return -1;
    }
    if (ret_path)
        snprintf(ret_path, pathlen, "%s", path);
    return 0;
}

/* Removes the directory and the files in it (the fixture makes no
 * subdirectories). */
static void remove_dir(test_daemon_t *d)
{
    if (!d->dir[0])
        return;
    DIR *dir = opendir(d->dir);
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof(p), "%s/%s", d->dir, e->d_name);
            if (unlink(p) != 0)
                fprintf(stderr, "daemon_fixture: cannot remove %s: %s\n", p, strerror(errno));
        }
        closedir(dir);
    }
    if (rmdir(d->dir) != 0)
        fprintf(stderr, "daemon_fixture: cannot remove %s: %s\n", d->dir, strerror(errno));
    d->dir[0] = '\0';
    d->log[0] = '\0';
}

/* Reaps the child if it ended; true if it did (or was reaped before). */
static bool reap(test_daemon_t *d, int options)
{
    if (d->pid <= 0)
        return true;
    int ws;
    pid_t r;
    do
        r = waitpid(d->pid, &ws, options);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        return false;
    if (r < 0) {
        fprintf(stderr, "daemon_fixture: waitpid %d: %s\n", (int)d->pid, strerror(errno));
        d->exit_status = -1;
    } else if (WIFEXITED(ws)) {
        d->exit_status = WEXITSTATUS(ws);
    } else {
        if (WIFSIGNALED(ws))
            fprintf(stderr, "daemon_fixture: ovld (pid %d) died of signal %d (%s)\n", (int)d->pid,
                    WTERMSIG(ws), strsignal(WTERMSIG(ws)));
        d->exit_status = -1;
    }
    d->pid = 0;
    track(d, false);
    return true;
}

bool daemon_running(test_daemon_t *d)
{
    return !reap(d, WNOHANG);
}

static void child_exec(const test_daemon_t *d, const char *const *argv)
{
    int log = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log < 0 || nul < 0)
        _exit(126);
    if (dup2(nul, STDIN_FILENO) < 0 || dup2(log, STDOUT_FILENO) < 0 || dup2(log, STDERR_FILENO) < 0)
        _exit(126);
    /* Whatever the test runner has, ovld must not think it runs under
     * systemd: no passed socket, no notify socket, no journal. */
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDNAMES");
    unsetenv("NOTIFY_SOCKET");
    unsetenv("JOURNAL_STREAM");
    /* Sanitizer options meant for the test process are not for ovld. */
    unsetenv("ASAN_OPTIONS");
    unsetenv("UBSAN_OPTIONS");
    /* Nothing of the test runner's goes to ovld: what ctest left open
     * without FD_CLOEXEC would count against its descriptors. */
    (void)syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
    /* A test that starves ovld of descriptors sets its limit here. */
    const char *nofile = getenv("OVL_TEST_NOFILE");
    if (nofile && *nofile) {
        struct rlimit rl = {.rlim_cur = strtoul(nofile, NULL, 10)};
        rl.rlim_max = rl.rlim_cur;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(126);
        unsetenv("OVL_TEST_NOFILE");
    }
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "daemon_fixture: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int daemon_start(test_daemon_t *d, const char *config_text, const char *const *extra)
{
    memset(d, 0, sizeof(*d));
    d->owner = getpid();
    snprintf(d->dir, sizeof(d->dir), "/tmp/ovl-it-XXXXXX");
    if (!mkdtemp(d->dir)) {
        fprintf(stderr, "daemon_fixture: mkdtemp: %s\n", strerror(errno));
        d->dir[0] = '\0';
        return -1;
    }
    snprintf(d->sock, sizeof(d->sock), "%s/ovld.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/ovld.log", d->dir);
    if (config_text &&
        daemon_write_file(d, "ovld.conf", config_text, d->config, sizeof(d->config)) != 0) {
        remove_dir(d);
        return -1;
    }
    const char *bin = getenv("OVLD_BIN");
    if (!bin || !bin[0])
        bin = OVLD_BIN_DEFAULT;

    const char *argv[16 + MAX_EXTRA_ARGS];
    size_t n = 0;
    argv[n++] = bin;
    argv[n++] = "--foreground";
    argv[n++] = "--backend";
    argv[n++] = "host";
    argv[n++] = "--socket";
    argv[n++] = d->sock;
    argv[n++] = "--log-level";
    argv[n++] = "debug";
    if (config_text) {
        argv[n++] = "--config";
        argv[n++] = d->config;
    }
    for (size_t i = 0; extra && extra[i]; i++) {
        if (i == MAX_EXTRA_ARGS) {
            fprintf(stderr, "daemon_fixture: too many extra arguments\n");
            remove_dir(d);
            return -1;
        }
        argv[n++] = extra[i];
    }
    argv[n] = NULL;

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "daemon_fixture: fork: %s\n", strerror(errno));
        remove_dir(d);
        return -1;
    }
    if (pid == 0)
        child_exec(d, argv);
    d->pid = pid;
    track(d, true);

    uint64_t deadline = fixture_now_ms() + FIXTURE_START_TIMEOUT_MS;
    for (;;) {
        if (!daemon_running(d)) {
            fprintf(stderr, "daemon_fixture: ovld exited during start-up (status %d)\n",
                    d->exit_status);
            break;
        }
        int fd = raw_connect(d->sock);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (fixture_now_ms() >= deadline) {
            fprintf(stderr, "daemon_fixture: %s does not accept within %d ms\n", d->sock,
                    FIXTURE_START_TIMEOUT_MS);
            break;
        }
        fixture_sleep_ms(10);
    }
    daemon_print_log(d);
    daemon_cleanup(d);
    return -1;
}

int daemon_stop(test_daemon_t *d)
{
    if (d->pid <= 0)
        return d->exit_status;
    if (kill(d->pid, SIGTERM) != 0 && errno != ESRCH)
        fprintf(stderr, "daemon_fixture: kill %d: %s\n", (int)d->pid, strerror(errno));
    uint64_t deadline = fixture_now_ms() + FIXTURE_STOP_TIMEOUT_MS;
    while (!reap(d, WNOHANG)) {
        if (fixture_now_ms() >= deadline) {
            fprintf(stderr,
                    "daemon_fixture: ovld (pid %d) still runs %d ms after SIGTERM; "
                    "killing it\n",
                    (int)d->pid, FIXTURE_STOP_TIMEOUT_MS);
            kill(d->pid, SIGKILL);
            reap(d, 0);
            d->exit_status = -1;
            break;
        }
        fixture_sleep_ms(5);
    }
    if (d->exit_status != 0) {
        fprintf(stderr, "daemon_fixture: ovld ended with status %d\n", d->exit_status);
        daemon_print_log(d);
    }
    return d->exit_status;
}

void daemon_cleanup(test_daemon_t *d)
{
    if (d->pid > 0 && d->owner == getpid()) {
        kill(d->pid, SIGKILL);
        reap(d, 0);
    }
    track(d, false);
    remove_dir(d);
}

int daemon_check_alive(test_daemon_t *d)
{
    if (!daemon_running(d)) {
        fprintf(stderr, "daemon_fixture: ovld is gone (status %d)\n", d->exit_status);
        daemon_print_log(d);
        return -1;
    }
    ovl_client_t *cl = NULL;
    ovl_status_t st = ovl_connect(d->sock, &cl);
    if (st != OVL_OK) {
        fprintf(stderr, "daemon_fixture: ovl_connect: %s: %s\n", ovl_strerror(st),
                ovl_connect_error());
        daemon_print_log(d);
        return -1;
    }
    ovl_set_timeout(cl, FIXTURE_REPLY_TIMEOUT_MS);
    int rc = 0;
    ovl_daemon_info_t info;
    if (ovl_daemon_info(cl, &info) != OVL_OK || info.pid != d->pid) {
        fprintf(stderr, "daemon_fixture: the daemon on %s is pid %d, not %d\n", d->sock,
                (int)info.pid, (int)d->pid);
        rc = -1;
    }
    Ovl__StatusRequest sq = OVL__STATUS_REQUEST__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_STATUS;
    q.status = &sq;
    Ovl__Response *r = NULL;
    st = libovl_call(cl, &q, NULL, 0, &r);
    if (st != OVL_OK) {
        fprintf(stderr, "daemon_fixture: Status: %s: %s\n", ovl_strerror(st), ovl_last_error(cl));
        rc = -1;
    } else {
        if (r->status->pid != d->pid) {
            fprintf(stderr, "daemon_fixture: Status names pid %d, not ovld's %d\n",
                    (int)r->status->pid, (int)d->pid);
            rc = -1;
        }
        libovl_response_free(r);
    }
    ovl_disconnect(cl);
    if (rc != 0)
        daemon_print_log(d);
    return rc;
}

/* ------------------------------------------------------- raw connections */

const char *raw_result_name(raw_result_t r)
{
    switch (r) {
    case RAW_OK:
        return "RAW_OK";
    case RAW_CLOSED:
        return "RAW_CLOSED";
    case RAW_RESET:
        return "RAW_RESET";
    case RAW_TIMEOUT:
        return "RAW_TIMEOUT";
    case RAW_BAD:
        return "RAW_BAD";
    case RAW_ERROR:
        return "RAW_ERROR";
    }
    return "?";
}

int raw_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -1;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int raw_open(raw_conn_t *rc, const char *path)
{
    memset(rc, 0, sizeof(*rc));
    ovl_wire_reader_init(&rc->rd, OVL_WIRE_DEFAULT_MAX);
    ovl_fdq_init(&rc->fdq);
    rc->fd = raw_connect(path);
    if (rc->fd < 0) {
        fprintf(stderr, "daemon_fixture: connect %s: %s\n", path, strerror(errno));
        ovl_wire_reader_free(&rc->rd);
        return -1;
    }
    return 0;
}

void raw_close(raw_conn_t *rc)
{
    if (rc->fd >= 0)
        close(rc->fd);
    rc->fd = -1;
    ovl_wire_reader_free(&rc->rd);
    ovl_fdq_close_all(&rc->fdq);
}

int raw_send(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int raw_send_frame(int fd, uint32_t announced, const void *body, size_t len)
{
    uint8_t hdr[OVL_WIRE_HEADER_SIZE];
    ovl_wire_header_encode(hdr, announced);
    if (raw_send(fd, hdr, sizeof(hdr)) != 0)
        return -1;
    return body && len ? raw_send(fd, body, len) : 0;
}

int raw_send_request(raw_conn_t *rc, Ovl__Request *q, const int *fds, unsigned nfds)
{
    if (q->id == 0 && q->body_case != OVL__REQUEST__BODY_OP)
        q->id = ++rc->next_id;
    /* The writer takes ownership of the descriptors: give it copies. */
    int dups[OVL_WIRE_MAX_ATTACHED];
    if (nfds > OVL_WIRE_MAX_ATTACHED)
        return -1;
    for (unsigned i = 0; i < nfds; i++) {
        dups[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
        if (dups[i] < 0) {
            for (unsigned j = 0; j < i; j++)
                close(dups[j]);
            return -1;
        }
    }
    ovl_wire_out_t o;
    ovl_wire_out_init(&o);
    /* No limit of our own: tests send what they like. */
    ovl_status_t st = ovl_wire_out_append(&o, &q->base, UINT32_MAX, dups, nfds);
    int rcode = -1;
    if (st == OVL_OK) {
        uint64_t deadline = fixture_now_ms() + FIXTURE_REPLY_TIMEOUT_MS;
        for (;;) {
            st = ovl_wire_flush(rc->fd, &o);
            if (st == OVL_OK) {
                rcode = 0;
                break;
            }
            if (st != OVL_ERR_AGAIN || fixture_now_ms() >= deadline)
                break;
            struct pollfd p = {.fd = rc->fd, .events = POLLOUT};
            poll(&p, 1, 10);
        }
    }
    if (rcode != 0)
        fprintf(stderr, "daemon_fixture: sending a request failed: %s\n", ovl_strerror(st));
    ovl_wire_out_free(&o);
    return rcode;
}

raw_result_t raw_read_response(raw_conn_t *rc, int timeout_ms, Ovl__Response **ret)
{
    if (timeout_ms <= 0)
        timeout_ms = FIXTURE_REPLY_TIMEOUT_MS;
    uint64_t deadline = fixture_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        const uint8_t *body;
        uint32_t len;
        ovl_status_t st = ovl_wire_reader_next(&rc->rd, &body, &len);
        if (st == OVL_OK) {
            Ovl__Response *r = ovl__response__unpack(NULL, len, body);
            if (!r)
                return RAW_BAD;
            *ret = r;
            return RAW_OK;
        }
        if (st != OVL_ERR_AGAIN)
            return RAW_BAD;
        uint64_t now = fixture_now_ms();
        if (now >= deadline)
            return RAW_TIMEOUT;
        struct pollfd p = {.fd = rc->fd, .events = POLLIN};
        int n = poll(&p, 1, (int)(deadline - now));
        if (n < 0 && errno != EINTR)
            return RAW_ERROR;
        if (n <= 0)
            continue;
        size_t got = 0;
        errno = 0;
        st = ovl_wire_recv(rc->fd, &rc->rd, &rc->fdq, &got);
        if (st == OVL_ERR_CLOSED) {
            /* ovl_wire_recv says CLOSED for ECONNRESET too: tell them apart
             * by errno, which a 0-byte read leaves at 0. */
            return errno == ECONNRESET ? RAW_RESET : RAW_CLOSED;
        }
        if (st == OVL_ERR_SYSTEM)
            return errno == ECONNRESET ? RAW_RESET : RAW_ERROR;
        if (st != OVL_OK && st != OVL_ERR_AGAIN)
            return RAW_BAD;
    }
}

raw_result_t raw_expect_closed(raw_conn_t *rc, int timeout_ms)
{
    Ovl__Response *r = NULL;
    raw_result_t res = raw_read_response(rc, timeout_ms, &r);
    if (res == RAW_OK) {
        fprintf(stderr,
                "daemon_fixture: a frame came where the end of the stream was "
                "expected (body %d)\n",
                (int)r->body_case);
        ovl__response__free_unpacked(r, NULL);
    }
    return res;
}

raw_result_t raw_call(raw_conn_t *rc, Ovl__Request *q, const int *fds, unsigned nfds,
                      Ovl__Response **ret)
{
    if (raw_send_request(rc, q, fds, nfds) != 0)
        return RAW_ERROR;
    raw_result_t res = raw_read_response(rc, 0, ret);
    if (res == RAW_OK && (*ret)->id != q->id) {
        fprintf(stderr, "daemon_fixture: response id %llu to request %llu\n",
                (unsigned long long)(*ret)->id, (unsigned long long)q->id);
        ovl__response__free_unpacked(*ret, NULL);
        *ret = NULL;
        return RAW_BAD;
    }
    return res;
}

raw_result_t raw_hello(raw_conn_t *rc, Ovl__Response **ret)
{
    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = OVL_PROTOCOL_VERSION;
    h.library_version = (char *)OVL_VERSION_STRING;
    h.pid = (int32_t)getpid();
    h.client_name.data = (uint8_t *)"raw-test";
    h.client_name.len = 8;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_HELLO;
    q.hello = &h;
    Ovl__Response *r = NULL;
    raw_result_t res = raw_call(rc, &q, NULL, 0, &r);
    if (res != RAW_OK)
        return res;
    if (r->body_case != OVL__RESPONSE__BODY_HELLO) {
        fprintf(stderr, "daemon_fixture: Hello answered with body %d%s%s\n", (int)r->body_case,
                r->body_case == OVL__RESPONSE__BODY_ERROR ? ": " : "",
                r->body_case == OVL__RESPONSE__BODY_ERROR ? r->error->message : "");
        ovl__response__free_unpacked(r, NULL);
        return RAW_BAD;
    }
    /* ovld's pidfd: taken here, so that a later reply's fd is not mistaken */
    if (r->hello->fd_count == 1) {
        int fd = ovl_fdq_pop(&rc->fdq);
        if (fd < 0) {
            fprintf(stderr, "daemon_fixture: HelloReply announced a pidfd and came without\n");
            ovl__response__free_unpacked(r, NULL);
            return RAW_BAD;
        }
        close(fd);
    }
    if (ret)
        *ret = r;
    else
        ovl__response__free_unpacked(r, NULL);
    return RAW_OK;
}

pid_t fixture_fork_child(test_daemon_t *d, void (*fn)(test_daemon_t *d, int out, int go),
                         int *ret_out, int *ret_go)
{
    int out[2], go[2];
    if (pipe2(out, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(go, O_CLOEXEC) != 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(out[0]);
        close(go[1]);
        fn(d, out[1], go[0]);
        _exit(1); /* fn does not return */
    }
    close(out[1]);
    close(go[0]);
    if (pid < 0) {
        close(out[0]);
        close(go[1]);
        return -1;
    }
    *ret_out = out[0];
    *ret_go = go[1];
    return pid;
}

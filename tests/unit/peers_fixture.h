/*
 * peers_fixture.h: what the unit tests of the links between daemons share
 * (test_peer_api.c, test_xfer.c): several transports in this process on
 * one libuv loop, on 127.0.0.1 with UCX_TLS=tcp,self (as the integration
 * tests and docs/multinode.md run them on one host), a key file in a
 * temporary directory, and waits that are always bounded. Header only,
 * included once by each test after cmocka.h.
 */
#ifndef OVL_PEERS_FIXTURE_H
#define OVL_PEERS_FIXTURE_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "config.h"
#include "peer.h"
#include "stats.h"

static uv_loop_t loop; /* every transport of the test runs on it */
static char dir[64];   /* the test's files: key files */
static pthread_t loop_thread;

/* The first port of the kernel's ephemeral range (Linux's default when
 * /proc does not say). */
static unsigned ephemeral_low(void)
{
    unsigned lo = 32768, hi;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2 || lo > 65535)
            lo = 32768;
        fclose(f);
    }
    return lo;
}

/* A free port on 127.0.0.1 for a transport's listener, as ovltest.py's
 * free_port draws them: never one of bind(port 0)'s, which come from the
 * ephemeral range where an outgoing connection of a test running beside
 * this one (UCX over TCP makes many) can take the port before the listener
 * binds it (CI saw "address already in use"); at random below that range,
 * checked with bind. */
static uint16_t free_port(void)
{
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    unsigned hi = ephemeral_low();
    unsigned lo = hi > 21000 ? 20000 : 1024;
    for (int tries = 0; tries < 200; tries++) {
        unsigned port = lo + (unsigned)rand_r(&seed) % (hi - lo);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int rc = bind(fd, (struct sockaddr *)&a, sizeof(a));
        close(fd);
        if (rc == 0)
            return (uint16_t)port;
    }
    fail_msg("no free port in %u..%u on 127.0.0.1", lo, hi - 1);
    return 0;
}

/* A key file of that text in dir; the path stays valid until the next call
 * but one. */
static const char *write_key(const char *name, const char *text)
{
    static char path[2][128];
    static int next;
    char *p = path[next++ % 2];
    snprintf(p, sizeof(path[0]), "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return p;
}

/* A transport's settings: peer_listen 127.0.0.1:port (also in *addr, as
 * others reach it), the key file, peer_timeout_ms; its counters zeroed. */
static void peer_side_config(ovld_config_t *cfg, struct sockaddr_storage *addr,
                             ovld_counters_t *counters, const char *key, uint16_t port,
                             uint32_t timeout_ms)
{
    ovld_config_defaults(cfg);
    snprintf(cfg->peer_listen, sizeof(cfg->peer_listen), "127.0.0.1:%u", port);
    snprintf(cfg->peer_key_file, sizeof(cfg->peer_key_file), "%s", key);
    cfg->peer_timeout_ms = timeout_ms;
    ovld_stats_reset(&counters->total, 0);
    ovld_stats_reset(&counters->window, 0);
    struct sockaddr_in *a = (struct sockaddr_in *)addr;
    memset(addr, 0, sizeof(*addr));
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

static void on_cap(uv_timer_t *t)
{
    *(bool *)t->data = true;
}

/* Turns the loop until cond(arg) or ms pass; returns cond's last value. */
static bool run_until(bool (*cond)(void *), void *arg, unsigned ms)
{
    bool expired = false;
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    t.data = &expired;
    uv_timer_start(&t, on_cap, ms, 0);
    bool ok;
    while (!(ok = cond(arg)) && !expired)
        uv_run(&loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
    return ok;
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

static bool is_up(void *arg)
{
    return ovld_peer_is_up(arg);
}

/* The end of an operation with a done(arg, status, why) callback (a
 * remote read, a transfer), as the callback saw it. */
typedef struct res {
    unsigned calls;
    bool on_loop; /* called on the loop's thread */
    ovl_status_t st;
    char why[400];
} res_t;

static void res_done(void *arg, ovl_status_t st, const char *why)
{
    res_t *r = arg;
    r->calls++;
    r->on_loop = pthread_equal(pthread_self(), loop_thread);
    r->st = st;
    snprintf(r->why, sizeof(r->why), "%s", why ? why : "");
}

static bool res_finished(void *arg)
{
    return ((res_t *)arg)->calls > 0;
}

static int peers_fixture_setup(const char *name)
{
    setenv("UCX_TLS", "tcp,self", 1);
    ovld_peers_process_init();
    loop_thread = pthread_self();
    snprintf(dir, sizeof(dir), "/tmp/ovl-%s-XXXXXX", name);
    if (!mkdtemp(dir))
        return -1;
    return uv_loop_init(&loop);
}

/* The transports' handles close; bounded, since a test that failed
 * before closing its transports leaves them open and the loop would then
 * run for ever (CI saw test_xfer time out so). */
static int peers_fixture_teardown(void)
{
    uv_update_time(&loop);
    uint64_t end = uv_now(&loop) + 5000;
    while (uv_loop_alive(&loop) && uv_now(&loop) < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(1000);
        uv_update_time(&loop);
    }
    if (uv_loop_alive(&loop)) {
        fprintf(stderr, "teardown: the loop still has handles after 5 s (a test failed "
                        "before closing its transports?)\n");
        return -1;
    }
    int rc = uv_loop_close(&loop);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return rc == 0 && system(cmd) == 0 ? 0 : -1;
}

#endif /* OVL_PEERS_FIXTURE_H */

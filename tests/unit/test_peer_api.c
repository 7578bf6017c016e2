/*
 * test_peer_api.c: the transport between daemons (daemon/net/peer.c) through its
 * API, as the jobs across nodes will use it: two or three transports in
 * this process on one libuv loop, on 127.0.0.1 (UCX_TLS=tcp,self, as the
 * integration tests run it). What ovlctl cannot show: on_message with its
 * bodies in order (up to OVLD_PEER_MAX_BODY), sends queued while
 * connecting, the limits of ovld_peer_send, on_down once per episode,
 * sends failing once down, a get that reconnects, a peer that comes back
 * as a new instance, a wrong key refused on both sides, remote reads of
 * mapped memory; and that UCX's signal handlers are gone after
 * ovld_peers_process_init.
 *
 * Every wait is bounded (run_until); the test takes a few seconds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <signal.h>

#include "peers_fixture.h"

#define TIMEOUT_MS 1000 /* peer_timeout_ms of every transport here */
#define NMSG       64
#define KEY_MAX    (16u << 10) /* bytes of a packed key (xfer.h, OVLD_XFER_RKEY_MAX) */

/* What one transport saw. */
typedef struct side {
    const char *name;
    ovld_peers_t *ps;
    ovld_counters_t counters;
    ovld_config_t cfg;
    struct sockaddr_storage addr;
    unsigned nmsg;
    uint32_t types[NMSG * 2];
    size_t lens[NMSG * 2];
    bool bodies_ok;
    unsigned downs;
    ovl_status_t down_st;
    char down_why[400];
    char log[8192]; /* the reports, one per line */
} side_t;

static side_t A = {.name = "A"}, B = {.name = "B"}, C = {.name = "C"};

static void report(void *arg, ovld_report_level_t level, const char *msg)
{
    side_t *s = arg;
    (void)level;
    size_t n = strlen(s->log);
    snprintf(s->log + n, sizeof(s->log) - n, "%s\n", msg);
    if (getenv("TEST_PEERS_VERBOSE"))
        fprintf(stderr, "%s: %s\n", s->name, msg);
}

static const ovld_reporter_t rep_a = {report, &A}, rep_b = {report, &B}, rep_c = {report, &C};

/* The body of message i: its length and bytes follow from i. */
static size_t body_len(unsigned i)
{
    if (i == 7)
        return OVLD_PEER_MAX_BODY;
    if (i == 8)
        return 0;
    return (i * 977u) % 5000u;
}

static void on_message(void *arg, ovld_peer_t *p, uint32_t type, const uint8_t *body, size_t len)
{
    side_t *s = arg;
    (void)p;
    if (s->nmsg >= NMSG * 2)
        return;
    s->types[s->nmsg] = type;
    s->lens[s->nmsg] = len;
    unsigned i = type - OVLD_PEER_TYPE_USER;
    if (len != body_len(i))
        s->bodies_ok = false;
    for (size_t k = 0; k < len; k++)
        if (body[k] != (uint8_t)(i + k))
            s->bodies_ok = false;
    s->nmsg++;
}

static void on_down(void *arg, ovld_peer_t *p, ovl_status_t st, const char *why)
{
    side_t *s = arg;
    (void)p;
    s->downs++;
    s->down_st = st;
    snprintf(s->down_why, sizeof(s->down_why), "%s", why);
}

static void start(side_t *s, const ovld_reporter_t *rep, const char *key, uint16_t port)
{
    char err[512];
    peer_side_config(&s->cfg, &s->addr, &s->counters, key, port, TIMEOUT_MS);
    s->nmsg = 0;
    s->bodies_ok = true;
    s->downs = 0;
    s->log[0] = '\0';
    ovld_peers_cb_t cb = {.on_message = on_message, .on_down = on_down, .arg = s};
    ovl_status_t st =
        ovld_peers_start(&loop, &s->cfg, &cb, rep, &s->counters, &s->ps, err, sizeof(err));
    if (st != OVL_OK)
        fail_msg("%s: ovld_peers_start: %s", s->name, err);
}

static void stop(side_t *s)
{
    ovld_peers_close(s->ps);
    s->ps = NULL;
}

static bool got_n(void *arg)
{
    return ((side_t *)arg)->nmsg >= NMSG;
}

static bool got_down(void *arg)
{
    return ((side_t *)arg)->downs > 0;
}

typedef struct ping_res {
    bool done;
    ovl_status_t st;
    double rtt;
    uint8_t inst[16];
    char why[400];
} ping_res_t;

static void ping_done(void *arg, ovl_status_t st, double rtt, const uint8_t *inst, const char *why)
{
    ping_res_t *r = arg;
    r->done = true;
    r->st = st;
    r->rtt = rtt;
    if (inst)
        memcpy(r->inst, inst, 16);
    snprintf(r->why, sizeof(r->why), "%s", why ? why : "");
}

static bool ping_finished(void *arg)
{
    return ((ping_res_t *)arg)->done;
}

static ping_res_t ping(side_t *from, side_t *to)
{
    ping_res_t r = {0};
    char err[256];
    assert_int_equal(ovld_peers_ping(from->ps, &to->addr, ping_done, &r, err, sizeof(err)), OVL_OK);
    assert_false(r.done); /* never from inside the call */
    assert_true(run_until(ping_finished, &r, 3 * TIMEOUT_MS));
    return r;
}

/* Sends messages 0..NMSG-1 of the test's shapes to p. */
static void send_all(ovld_peer_t *p)
{
    static uint8_t buf[OVLD_PEER_MAX_BODY];
    for (unsigned i = 0; i < NMSG; i++) {
        size_t len = body_len(i);
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)(i + k);
        assert_int_equal(ovld_peer_send(p, OVLD_PEER_TYPE_USER + i, buf, len), OVL_OK);
    }
}

static void check_all(const side_t *s)
{
    assert_int_equal(s->nmsg, NMSG);
    assert_true(s->bodies_ok);
    for (unsigned i = 0; i < NMSG; i++) /* in order */
        assert_int_equal(s->types[i], OVLD_PEER_TYPE_USER + i);
}

static void test_messages(void **state)
{
    (void)state;
    const char *key = write_key("key", "0123456789abcdef0123456789abcdef-cluster\n");
    start(&A, &rep_a, key, free_port());
    start(&B, &rep_b, key, free_port());
    /* sent while connecting: queued, then in order */
    ovld_peer_t *pb;
    char err[256];
    assert_int_equal(ovld_peers_get(A.ps, &B.addr, &pb, err, sizeof(err)), OVL_OK);
    assert_false(ovld_peer_is_up(pb));
    assert_null(ovld_peer_instance(pb));
    send_all(pb);
    assert_true(run_until(got_n, &B, 5000));
    check_all(&B);
    assert_true(ovld_peer_is_up(pb));
    assert_memory_equal(ovld_peer_instance(pb), ovld_peers_instance(B.ps), 16);
    assert_string_equal(ovld_peer_name(pb), ovld_peers_self(B.ps));
    /* the way back: B's get finds A up (A's session) and sends on it */
    ovld_peer_t *pa;
    assert_int_equal(ovld_peers_get(B.ps, &A.addr, &pa, err, sizeof(err)), OVL_OK);
    assert_true(ovld_peer_is_up(pa));
    send_all(pa);
    assert_true(run_until(got_n, &A, 5000));
    check_all(&A);
    /* pings both ways */
    ping_res_t r = ping(&A, &B);
    assert_int_equal(r.st, OVL_OK);
    assert_true(r.rtt > 0 && r.rtt < 1.0);
    assert_memory_equal(r.inst, ovld_peers_instance(B.ps), 16);
    r = ping(&B, &A);
    assert_int_equal(r.st, OVL_OK);
    /* the limits of a send, each refused without harm */
    static uint8_t big[OVLD_PEER_MAX_BODY + 1];
    assert_int_equal(ovld_peer_send(pb, OVLD_PEER_TYPE_USER, big, sizeof(big)), OVL_ERR_LIMIT);
    assert_int_equal(ovld_peer_send(pb, OVLD_PEER_PING, big, 1), OVL_ERR_INVALID);
    assert_int_equal(ovld_peer_send(pb, 0, big, 1), OVL_ERR_INVALID);
    /* the wildcard and oneself are no peers */
    struct sockaddr_storage any = A.addr;
    ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
    assert_int_equal(ovld_peers_get(A.ps, &any, &pb, err, sizeof(err)), OVL_ERR_INVALID);
    assert_int_equal(ovld_peers_get(A.ps, &A.addr, &pb, err, sizeof(err)), OVL_ERR_INVALID);
    assert_non_null(strstr(err, "own address"));
    /* heartbeats for a while: still up, an RTT measured, counted */
    run_until(never, NULL, TIMEOUT_MS);
    assert_true(ovld_peer_is_up(pb) && ovld_peer_is_up(pa));
    assert_int_equal(A.downs + B.downs, 0);
    assert_true(A.counters.total.peer_msgs_in > NMSG && A.counters.total.peer_msgs_out > NMSG);
    assert_true(B.counters.total.peer_bytes_in > 60 * 2500);
    assert_int_equal(A.counters.total.peer_auth_refused + B.counters.total.peer_auth_refused, 0);
    /* B shuts down: A hears it once (a Bye), and sends fail */
    stop(&B);
    assert_true(run_until(got_down, &A, 2 * TIMEOUT_MS));
    run_until(never, NULL, 300);
    assert_int_equal(A.downs, 1);
    assert_non_null(strstr(A.down_why, "shutting down"));
    assert_false(ovld_peer_is_up(pb));
    assert_int_equal(ovld_peer_send(pb, OVLD_PEER_TYPE_USER, big, 1), OVL_ERR_CLOSED);
    /* a get tries again; nobody listens: down again, once ("never came up") */
    assert_int_equal(ovld_peers_get(A.ps, &B.addr, &pb, err, sizeof(err)), OVL_OK);
    assert_int_equal(ovld_peer_send(pb, OVLD_PEER_TYPE_USER, big, 1), OVL_OK); /* queued */
    A.downs = 0;
    assert_true(run_until(got_down, &A, 2 * TIMEOUT_MS));
    assert_int_equal(A.down_st, OVL_ERR_CONNECT);
    assert_non_null(strstr(A.down_why, "unreachable"));
    assert_true(A.counters.total.peer_dropped >= 1); /* the queued one */
    /* B comes back, a new instance on the same port: a new episode */
    start(&B, &rep_b, key, ntohs(((struct sockaddr_in *)&B.addr)->sin_port));
    A.nmsg = 0;
    assert_int_equal(ovld_peers_get(A.ps, &B.addr, &pb, err, sizeof(err)), OVL_OK);
    assert_true(run_until(is_up, pb, 3 * TIMEOUT_MS));
    assert_memory_equal(ovld_peer_instance(pb), ovld_peers_instance(B.ps), 16);
    send_all(pb);
    assert_true(run_until(got_n, &B, 5000));
    check_all(&B);
    stop(&A);
    stop(&B);
    run_until(never, NULL, 200);
}

/* A full queue while connecting: refused, naming the limit. */
static void test_queue_limit(void **state)
{
    (void)state;
    const char *key = write_key("key", "0123456789abcdef0123456789abcdef-cluster\n");
    start(&A, &rep_a, key, free_port());
    struct sockaddr_storage nobody = A.addr;
    ((struct sockaddr_in *)&nobody)->sin_port = htons(free_port());
    ovld_peer_t *p;
    char err[256];
    assert_int_equal(ovld_peers_get(A.ps, &nobody, &p, err, sizeof(err)), OVL_OK);
    static uint8_t buf[OVLD_PEER_MAX_BODY];
    unsigned ok = 0;
    ovl_status_t st;
    while ((st = ovld_peer_send(p, OVLD_PEER_TYPE_USER, buf, sizeof(buf))) == OVL_OK)
        ok++;
    assert_int_equal(st, OVL_ERR_LIMIT);
    assert_int_equal(ok, OVLD_PEER_QUEUE_MAX / (OVLD_PEER_MAX_BODY + OVLD_PEER_AM_HDR));
    A.downs = 0;
    assert_true(run_until(got_down, &A, 2 * TIMEOUT_MS));
    assert_int_equal(A.counters.total.peer_dropped, ok + 1); /* the queue, and the refused one */
    stop(&A);
    run_until(never, NULL, 200);
}

/* Different keys: refused on both sides, said in both logs, nothing up. */
static void test_wrong_key(void **state)
{
    (void)state;
    start(&A, &rep_a, write_key("ka", "0123456789abcdef0123456789abcdef-one\n"), free_port());
    start(&C, &rep_c, write_key("kc", "0123456789abcdef0123456789abcdef-two\n"), free_port());
    ping_res_t r = ping(&A, &C);
    assert_int_equal(r.st, OVL_ERR_PERMISSION);
    assert_non_null(strstr(r.why, "wrong cluster key"));
    run_until(never, NULL, 200);
    assert_non_null(strstr(A.log, "authentication refused: wrong cluster key"));
    assert_non_null(strstr(C.log, "authentication refused: the other side refused: wrong cluster"));
    assert_int_equal(A.counters.total.peer_auth_refused, 1);
    assert_int_equal(C.counters.total.peer_auth_refused, 1);
    assert_int_equal(A.downs, 1); /* the get's episode: never came up */
    assert_int_equal(C.downs, 0); /* no peer there: it never proved itself */
    stop(&A);
    stop(&C);
    run_until(never, NULL, 200);
}

/* Remote reads: B maps a buffer, A reads it (large, and a piece of it),
 * with the key B packed; a read of a peer not up (yet, or any more) is
 * refused at once, and its done never called. */
static void test_remote_read(void **state)
{
    (void)state;
    const char *key = write_key("key", "0123456789abcdef0123456789abcdef-cluster\n");
    start(&A, &rep_a, key, free_port());
    start(&B, &rep_b, key, free_port());
    size_t len = 8u << 20;
    uint8_t *src = malloc(len), *dst = calloc(1, len);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    char err[256];
    ovld_peer_mem_t *m;
    assert_int_equal(ovld_peers_mem_map(B.ps, src, 0, &m, err, sizeof(err)), OVL_ERR_INVALID);
    assert_int_equal(ovld_peers_mem_map(B.ps, src, len, &m, err, sizeof(err)), OVL_OK);
    size_t klen;
    const void *packed = ovld_peer_mem_rkey(m, &klen);
    static uint8_t k[KEY_MAX];
    assert_true(klen > 0 && klen <= sizeof(k));
    memcpy(k, packed, klen); /* what a message would carry */
    ovld_peer_t *pb;
    assert_int_equal(ovld_peers_get(A.ps, &B.addr, &pb, err, sizeof(err)), OVL_OK);
    res_t r = {0};
    /* not up yet: refused, done never called */
    assert_int_equal(
        ovld_peer_get(pb, (uintptr_t)src, k, klen, dst, len, res_done, &r, err, sizeof(err)),
        OVL_ERR_CLOSED);
    assert_non_null(strstr(err, "not up"));
    assert_true(run_until(is_up, pb, 3 * TIMEOUT_MS));
    assert_int_equal(
        ovld_peer_get(pb, (uintptr_t)src, k, klen, dst, 0, res_done, &r, err, sizeof(err)),
        OVL_ERR_INVALID);
    assert_int_equal(
        ovld_peer_get(pb, (uintptr_t)src, k, klen, dst, len, res_done, &r, err, sizeof(err)),
        OVL_OK);
    assert_int_equal(r.calls, 0); /* never from inside the call */
    assert_true(run_until(res_finished, &r, 5000));
    assert_int_equal(r.st, OVL_OK);
    assert_memory_equal(src, dst, len);
    /* a piece from the middle */
    memset(dst, 0, len);
    r = (res_t){0};
    assert_int_equal(ovld_peer_get(pb, (uintptr_t)(src + 1000), k, klen, dst, 333, res_done, &r,
                                   err, sizeof(err)),
                     OVL_OK);
    assert_true(run_until(res_finished, &r, 5000));
    assert_int_equal(r.st, OVL_OK);
    assert_memory_equal(src + 1000, dst, 333);
    /* B goes: later reads are refused at once. (Not tested: a read in
     * flight as a side closes. In one process the other side's worker
     * cannot answer while this one closes, and UCX 1.13 aborts a process
     * whose software RMA reply finds its endpoint failed: ucp_request.inl,
     * "unexpected error"; docs/multinode.md.) */
    ovld_peers_mem_unmap(B.ps, m);
    stop(&B);
    A.downs = 0;
    assert_true(run_until(got_down, &A, 2 * TIMEOUT_MS));
    r = (res_t){0};
    assert_int_equal(
        ovld_peer_get(pb, (uintptr_t)src, k, klen, dst, len, res_done, &r, err, sizeof(err)),
        OVL_ERR_CLOSED);
    assert_int_equal(r.calls, 0);
    stop(&A);
    run_until(never, NULL, 200);
    free(src);
    free(dst);
}

/* libucs put its own handlers in when it loaded; ovld_peers_process_init
 * (run by setup) put back what was there: the default, or the sanitizer's,
 * never libucs's. */
static void test_signals_are_ours(void **state)
{
    (void)state;
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGHUP};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction sa;
        assert_int_equal(sigaction(sigs[i], NULL, &sa), 0);
        void *h = (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
        if (h == (void *)SIG_DFL || h == (void *)SIG_IGN)
            continue;
        Dl_info di;
        if (dladdr(h, &di) && di.dli_fname)
            if (strstr(di.dli_fname, "libucs"))
                fail_msg("signal %d is handled by %s", sigs[i], di.dli_fname);
    }
    struct sigaction sa;
    assert_int_equal(sigaction(SIGHUP, NULL, &sa), 0);
    assert_true(sa.sa_handler == SIG_DFL); /* nobody else here takes it */
}

static int setup(void **state)
{
    (void)state;
    return peers_fixture_setup("test-peers");
}

static int teardown(void **state)
{
    (void)state;
    return peers_fixture_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signals_are_ours), cmocka_unit_test(test_messages),
        cmocka_unit_test(test_queue_limit),      cmocka_unit_test(test_remote_read),
        cmocka_unit_test(test_wrong_key),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

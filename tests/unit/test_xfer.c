/*
 * test_xfer.c: the host backend's rows between nodes (daemon/net/xfer.c)
 * through its API: two daemons' transports and movers in this process on
 * one libuv loop, on 127.0.0.1 (UCX_TLS=tcp,self, as test_peer_api), wired
 * as main.c wires them (peer messages of types 32 to 47 to the mover, every
 * down to it). A job of two ranks, rank 0 on A (node 0), rank 1 on B (node
 * 1). What the host backend relies on: rows arrive whole, whichever side
 * posts first, under several tags at once, from any thread; each done once,
 * on the loop; a size mismatch fails both sides; an abort and a peer down
 * fail what is pending and what is posted later, with words; the pending
 * limit; shutdown; and forged or stray messages dropped and counted.
 *
 * Then whole ops across the two daemons on the real host backend (one
 * backend each, serving its node's ranks, ops issued by the executor on
 * each side): ring (rails), collective and naive (all-gathers), every C row
 * against a reference GEMM; and an abort that fails the next op on every
 * rank with its words.
 *
 * Every wait is bounded (run_until); the test takes a few seconds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sys/mman.h>

#include "backend.h"
#include "doorbell.h"
#include "exec.h"
#include "peers_fixture.h"
#include "plan.h"
#include "xfer.h"
#include "xfer_wire.h"

#define TIMEOUT_MS 1000 /* peer_timeout_ms of both transports */
#define NTAGS      8

/* One daemon: its transport, its mover, its job's mover, its peer. */
typedef struct side {
    const char *name;
    ovld_peers_t *ps;
    ovld_xfer_t *x;
    ovld_xfer_job_t *xj;
    ovld_peer_t *other; /* its record of the other daemon */
    ovld_counters_t counters;
    ovld_config_t cfg;
    struct sockaddr_storage addr;
    unsigned downs;
} side_t;

static side_t A = {.name = "A"}, B = {.name = "B"};
static const uint8_t job_key[OVLD_JOB_NONCE_LEN] = "0123456789abcdef";

static void report(void *arg, ovld_report_level_t level, const char *msg)
{
    (void)level;
    if (getenv("TEST_XFER_VERBOSE"))
        fprintf(stderr, "%s: %s\n", ((side_t *)arg)->name, msg);
}

static const ovld_reporter_t rep_a = {report, &A}, rep_b = {report, &B};

/* As main.c: this module's types to the mover, every down too. */
static void on_message(void *arg, ovld_peer_t *p, uint32_t type, const uint8_t *body, size_t len)
{
    side_t *s = arg;
    if (type >= OVLD_XFER_TYPE_FIRST && type <= OVLD_XFER_TYPE_LAST && s->x)
        ovld_xfer_on_message(s->x, p, type, body, len);
}

static void on_down(void *arg, ovld_peer_t *p, ovl_status_t st, const char *why)
{
    side_t *s = arg;
    (void)st;
    s->downs++;
    if (s->x)
        ovld_xfer_on_down(s->x, p, why);
}

static void start_side(side_t *s, const ovld_reporter_t *rep, const char *key, uint16_t port)
{
    char err[512];
    peer_side_config(&s->cfg, &s->addr, &s->counters, key, port, TIMEOUT_MS);
    s->downs = 0;
    s->x = NULL;
    s->xj = NULL;
    ovld_peers_cb_t cb = {.on_message = on_message, .on_down = on_down, .arg = s};
    if (ovld_peers_start(&loop, &s->cfg, &cb, rep, &s->counters, &s->ps, err, sizeof(err)) !=
        OVL_OK)
        fail_msg("%s: ovld_peers_start: %s", s->name, err);
    if (ovld_xfer_create(&loop, s->ps, &s->counters, &s->x, err, sizeof(err)) != OVL_OK)
        fail_msg("%s: ovld_xfer_create: %s", s->name, err);
}

/* Both daemons up, linked, each with the job (rank 0 on A, rank 1 on B). */
static void start_both(void)
{
    char err[256];
    const char *path = write_key("key", "0123456789abcdef0123456789abcdef-cluster\n");
    start_side(&A, &rep_a, path, free_port());
    start_side(&B, &rep_b, path, free_port());
    assert_int_equal(ovld_peers_get(A.ps, &B.addr, &A.other, err, sizeof(err)), OVL_OK);
    assert_true(run_until(is_up, A.other, 3 * TIMEOUT_MS));
    assert_int_equal(ovld_peers_get(B.ps, &A.addr, &B.other, err, sizeof(err)), OVL_OK);
    assert_true(ovld_peer_is_up(B.other));
    const uint32_t node_of[2] = {0, 1};
    ovld_peer_t *pa[2] = {NULL, A.other}, *pb[2] = {B.other, NULL};
    assert_int_equal(
        ovld_xfer_job_create(A.x, job_key, 2, node_of, 0, pa, 2, &A.xj, err, sizeof(err)), OVL_OK);
    assert_int_equal(
        ovld_xfer_job_create(B.x, job_key, 2, node_of, 1, pb, 2, &B.xj, err, sizeof(err)), OVL_OK);
    /* one job per key */
    ovld_xfer_job_t *dup;
    assert_int_equal(
        ovld_xfer_job_create(A.x, job_key, 2, node_of, 0, pa, 2, &dup, err, sizeof(err)),
        OVL_ERR_EXISTS);
}

/* The movers go first, then the transports (xfer.h). */
static void stop_side(side_t *s)
{
    if (s->xj)
        ovld_xfer_job_release(s->xj);
    s->xj = NULL;
    ovld_xfer_destroy(s->x);
    s->x = NULL;
    ovld_peers_close(s->ps);
    s->ps = NULL;
}

static void stop_both(void)
{
    stop_side(&A);
    stop_side(&B);
    run_until(never, NULL, 200);
}

typedef struct wait_for {
    res_t *r;
    unsigned n;
} wait_for_t;

static bool all_done(void *arg)
{
    wait_for_t *w = arg;
    for (unsigned i = 0; i < w->n; i++)
        if (!res_finished(&w->r[i]))
            return false;
    return true;
}

static void wait_done(res_t *r, unsigned n)
{
    wait_for_t w = {r, n};
    assert_true(run_until(all_done, &w, 5000));
}

/* A refused post's words. */
static char post_why[256];

/* Posts a send (a receive) on s's job, its done into r. */
static ovl_status_t xsend(side_t *s, ovld_coll_tag_t t, uint32_t from, uint32_t to, void *buf,
                          size_t len, res_t *r)
{
    return ovld_xfer_send(s->xj, t, from, to, buf, len, res_done, r, post_why, sizeof(post_why));
}

static ovl_status_t xrecv(side_t *s, ovld_coll_tag_t t, uint32_t from, uint32_t to, void *buf,
                          size_t len, res_t *r)
{
    return ovld_xfer_recv(s->xj, t, from, to, buf, len, res_done, r, post_why, sizeof(post_why));
}

static ovld_coll_tag_t tag_of(unsigned i)
{
    return (ovld_coll_tag_t){.seq = 100 + i / 3, .index = i % 3};
}

static size_t len_of(unsigned i)
{
    return 1 + (i * 104729u) % (300u << 10);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (uint8_t)(k * 31 + seed);
}

/* Rows both ways, under several tags at once, in either order: all
 * arrive, each done once, on the loop, OK. */
static void test_rows(void **state)
{
    (void)state;
    start_both();
    static uint8_t src[2][NTAGS][300u << 10], dst[2][NTAGS][300u << 10];
    res_t sr[2][NTAGS], rr[2][NTAGS];
    memset(sr, 0, sizeof(sr));
    memset(rr, 0, sizeof(rr));
    for (unsigned i = 0; i < NTAGS; i++) {
        fill(src[0][i], len_of(i), i);
        fill(src[1][i], len_of(i), 100 + i);
    }
    /* odd tags: receives first; even: sends first, the receives a moment
     * later (their RowsReady waits) */
    for (unsigned i = 1; i < NTAGS; i += 2) {
        assert_int_equal(xrecv(&B, tag_of(i), 0, 1, dst[0][i], len_of(i), &rr[0][i]), OVL_OK);
        assert_int_equal(xrecv(&A, tag_of(i), 1, 0, dst[1][i], len_of(i), &rr[1][i]), OVL_OK);
    }
    for (unsigned i = 0; i < NTAGS; i++) {
        assert_int_equal(xsend(&A, tag_of(i), 0, 1, src[0][i], len_of(i), &sr[0][i]), OVL_OK);
        assert_int_equal(xsend(&B, tag_of(i), 1, 0, src[1][i], len_of(i), &sr[1][i]), OVL_OK);
    }
    assert_int_equal(sr[0][0].calls, 0); /* never from inside the call */
    run_until(never, NULL, 200);
    for (unsigned i = 0; i < NTAGS; i += 2)
        assert_int_equal(sr[0][i].calls + sr[1][i].calls, 0); /* nobody took them yet */
    for (unsigned i = 0; i < NTAGS; i += 2) {
        assert_int_equal(xrecv(&B, tag_of(i), 0, 1, dst[0][i], len_of(i), &rr[0][i]), OVL_OK);
        assert_int_equal(xrecv(&A, tag_of(i), 1, 0, dst[1][i], len_of(i), &rr[1][i]), OVL_OK);
    }
    wait_done(&sr[0][0], 2 * NTAGS);
    wait_done(&rr[0][0], 2 * NTAGS);
    run_until(never, NULL, 100);
    uint64_t bytes = 0;
    for (unsigned d = 0; d < 2; d++)
        for (unsigned i = 0; i < NTAGS; i++) {
            assert_int_equal(sr[d][i].calls, 1);
            assert_int_equal(rr[d][i].calls, 1);
            assert_true(sr[d][i].on_loop && rr[d][i].on_loop);
            assert_int_equal(sr[d][i].st, OVL_OK);
            assert_int_equal(rr[d][i].st, OVL_OK);
            assert_memory_equal(src[d][i], dst[d][i], len_of(i));
            bytes += d == 0 ? len_of(i) : 0;
        }
    assert_int_equal(A.counters.total.xfer_sends, NTAGS);
    assert_int_equal(B.counters.total.xfer_recvs, NTAGS);
    assert_int_equal(B.counters.total.xfer_bytes_in, bytes);
    assert_int_equal(A.counters.total.xfer_errors + B.counters.total.xfer_errors, 0);
    assert_int_equal(A.counters.total.xfer_dropped + B.counters.total.xfer_dropped, 0);
    stop_both();
}

/* Posts from threads that are not the loop's, as the host backend's
 * stream threads post. */
typedef struct poster {
    side_t *s;
    bool send;
    uint8_t *buf;
    size_t len;
    res_t *r;
    ovl_status_t st;
} poster_t;

static void *post_main(void *arg)
{
    poster_t *p = arg;
    char why[256]; /* its own: the two threads post at once */
    for (unsigned i = 0; i < NTAGS; i++) {
        ovld_coll_tag_t t = {.seq = 7, .index = i};
        p->st = p->send ? ovld_xfer_send(p->s->xj, t, 0, 1, p->buf + i * p->len, p->len, res_done,
                                         &p->r[i], why, sizeof(why))
                        : ovld_xfer_recv(p->s->xj, t, 0, 1, p->buf + i * p->len, p->len, res_done,
                                         &p->r[i], why, sizeof(why));
        if (p->st != OVL_OK)
            break;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    start_both();
    enum { LEN = 4096 };
    static uint8_t src[NTAGS * LEN], dst[NTAGS * LEN];
    fill(src, sizeof(src), 9);
    res_t sr[NTAGS], rr[NTAGS];
    memset(sr, 0, sizeof(sr));
    memset(rr, 0, sizeof(rr));
    poster_t ps = {&A, true, src, LEN, sr, OVL_OK}, pr = {&B, false, dst, LEN, rr, OVL_OK};
    pthread_t ts, tr;
    assert_int_equal(pthread_create(&ts, NULL, post_main, &ps), 0);
    assert_int_equal(pthread_create(&tr, NULL, post_main, &pr), 0);
    assert_int_equal(pthread_join(ts, NULL), 0);
    assert_int_equal(pthread_join(tr, NULL), 0);
    assert_int_equal(ps.st, OVL_OK);
    assert_int_equal(pr.st, OVL_OK);
    wait_done(sr, NTAGS);
    wait_done(rr, NTAGS);
    for (unsigned i = 0; i < NTAGS; i++) {
        assert_true(sr[i].on_loop && rr[i].on_loop);
        assert_int_equal(sr[i].st, OVL_OK);
        assert_int_equal(rr[i].st, OVL_OK);
    }
    assert_memory_equal(src, dst, sizeof(src));
    stop_both();
}

/* Sizes that disagree fail both sides, with words naming both. A rank not
 * where the call says it is, or no bytes, is refused at once. */
static void test_mismatch(void **state)
{
    (void)state;
    start_both();
    static uint8_t buf[2][1000];
    res_t s = {0}, r = {0};
    ovld_coll_tag_t t = {.seq = 1, .index = 0};
    assert_int_equal(xsend(&A, t, 0, 1, buf[0], 100, &s), OVL_OK);
    assert_int_equal(xrecv(&B, t, 0, 1, buf[1], 200, &r), OVL_OK);
    wait_done(&s, 1);
    wait_done(&r, 1);
    assert_int_equal(s.st, OVL_ERR_MISMATCH);
    assert_int_equal(r.st, OVL_ERR_MISMATCH);
    assert_non_null(strstr(r.why, "rank 0 sends 100 bytes, rank 1 receives 200"));
    assert_non_null(strstr(s.why, "rank 0 sends 100 bytes, rank 1 receives 200"));
    assert_non_null(strstr(s.why, "op 1, call 0"));
    /* refused here: the ranks of a send are this node's and another's */
    assert_int_equal(xsend(&B, t, 0, 1, buf[0], 100, &s), OVL_ERR_INVALID);
    assert_non_null(strstr(post_why, "this is node 1"));
    assert_int_equal(xrecv(&A, t, 0, 1, buf[0], 100, &s), OVL_ERR_INVALID);
    assert_int_equal(xsend(&A, t, 0, 2, buf[0], 100, &s), OVL_ERR_INVALID);
    assert_non_null(strstr(post_why, "out of its 2 ranks"));
    assert_int_equal(xsend(&A, t, 0, 1, buf[0], 0, &s), OVL_ERR_INVALID);
    /* the same transfer posted twice: the second fails, the first goes on */
    res_t s1 = {0}, s2 = {0}, r1 = {0};
    t.seq = 2;
    assert_int_equal(xsend(&A, t, 0, 1, buf[0], 10, &s1), OVL_OK);
    assert_int_equal(xsend(&A, t, 0, 1, buf[0], 10, &s2), OVL_OK);
    wait_done(&s2, 1);
    assert_int_equal(s2.st, OVL_ERR_INVALID);
    assert_non_null(strstr(s2.why, "posted twice"));
    assert_int_equal(xrecv(&B, t, 0, 1, buf[1], 10, &r1), OVL_OK);
    wait_done(&s1, 1);
    wait_done(&r1, 1);
    assert_int_equal(s1.st, OVL_OK);
    assert_int_equal(r1.st, OVL_OK);
    stop_both();
}

/* An abort fails what is pending and what comes later, with its words; a
 * send whose receiver has not read it is withdrawn, and the receive posted
 * after that fails with the sender's words. */
static void test_abort(void **state)
{
    (void)state;
    start_both();
    static uint8_t buf[2][64];
    res_t s = {0}, r = {0}, r2 = {0}, late = {0};
    /* B waits for rows that never come; its job aborts */
    ovld_coll_tag_t t1 = {.seq = 1, .index = 0}, t2 = {.seq = 2, .index = 0};
    assert_int_equal(xrecv(&B, t1, 0, 1, buf[1], 64, &r), OVL_OK);
    /* A announces rows B does not take yet; A's job aborts */
    assert_int_equal(xsend(&A, t2, 0, 1, buf[0], 64, &s), OVL_OK);
    run_until(never, NULL, 100);
    ovld_xfer_job_abort(B.xj, OVL_ERR_ABORTED, "rank 3 left");
    wait_done(&r, 1);
    assert_int_equal(r.st, OVL_ERR_ABORTED);
    assert_non_null(strstr(r.why, "rank 3 left"));
    /* later posts fail at once, with the same words */
    assert_int_equal(xrecv(&B, t2, 0, 1, buf[1], 64, &late), OVL_ERR_ABORTED);
    assert_non_null(strstr(post_why, "rank 3 left"));
    assert_int_equal(late.calls, 0);
    /* B's abort answered A's announcement: A's send fails with B's words */
    wait_done(&s, 1);
    assert_int_equal(s.st, OVL_ERR_ABORTED);
    assert_non_null(strstr(s.why, "rank 3 left"));
    /* Now A withdraws: a send announced, then A's job aborts; B (a fresh
     * job under another key) has not posted its receive: the receive
     * posted after fails with A's words. */
    ovld_xfer_job_release(A.xj);
    ovld_xfer_job_release(B.xj);
    char err[256];
    const uint8_t key2[OVLD_JOB_NONCE_LEN] = "another job key!";
    const uint32_t node_of[2] = {0, 1};
    ovld_peer_t *pa[2] = {NULL, A.other}, *pb[2] = {B.other, NULL};
    assert_int_equal(ovld_xfer_job_create(A.x, key2, 2, node_of, 0, pa, 2, &A.xj, err, sizeof(err)),
                     OVL_OK);
    assert_int_equal(ovld_xfer_job_create(B.x, key2, 2, node_of, 1, pb, 2, &B.xj, err, sizeof(err)),
                     OVL_OK);
    s = (res_t){0};
    assert_int_equal(xsend(&A, t1, 0, 1, buf[0], 64, &s), OVL_OK);
    run_until(never, NULL, 100);
    ovld_xfer_job_abort(A.xj, OVL_ERR_ABORTED, "rank 0's client died");
    wait_done(&s, 1);
    assert_int_equal(s.st, OVL_ERR_ABORTED);
    assert_non_null(strstr(s.why, "rank 0's client died"));
    assert_int_equal(xrecv(&B, t1, 0, 1, buf[1], 64, &r2), OVL_OK);
    wait_done(&r2, 1);
    assert_int_equal(r2.st, OVL_ERR_ABORTED);
    assert_non_null(strstr(r2.why, "withdrawn by 127.0.0.1"));
    assert_non_null(strstr(r2.why, "rank 0's client died"));
    stop_both();
}

/* A peer down fails every transfer with it, naming it, and later posts. */
static void test_peer_down(void **state)
{
    (void)state;
    start_both();
    static uint8_t buf[2][64];
    res_t s = {0}, r = {0};
    ovld_coll_tag_t t = {.seq = 5, .index = 1};
    assert_int_equal(xsend(&A, t, 0, 1, buf[0], 64, &s), OVL_OK);
    assert_int_equal(xrecv(&A, t, 1, 0, buf[1], 64, &r), OVL_OK);
    run_until(never, NULL, 100);
    const char *bname = ovld_peers_self(B.ps);
    char bn[64];
    snprintf(bn, sizeof(bn), "%s", bname);
    stop_side(&B); /* its pending RowsReady goes with it: nobody reads */
    wait_done(&s, 1);
    wait_done(&r, 1);
    assert_int_equal(s.st, OVL_ERR_ABORTED);
    assert_int_equal(r.st, OVL_ERR_ABORTED);
    assert_non_null(strstr(s.why, bn));
    assert_non_null(strstr(r.why, "is down"));
    res_t late = {0};
    assert_int_equal(xsend(&A, t, 0, 1, buf[0], 64, &late), OVL_ERR_ABORTED);
    assert_non_null(strstr(post_why, bn));
    stop_side(&A);
    run_until(never, NULL, 200);
}

/* OVLD_XFER_MAX_PENDING transfers of a job wait at most; the next post
 * fails naming the limit, and so does a peer's RowsReady past it (its
 * sender hears it). */
static void test_limit(void **state)
{
    (void)state;
    start_both();
    static uint8_t buf[64];
    static res_t r[OVLD_XFER_MAX_PENDING + 1];
    memset(r, 0, sizeof(r));
    for (unsigned i = 0; i <= OVLD_XFER_MAX_PENDING; i++) {
        ovld_coll_tag_t t = {.seq = 1000 + i, .index = 0};
        assert_int_equal(xrecv(&B, t, 0, 1, buf, sizeof(buf), &r[i]), OVL_OK);
    }
    wait_done(&r[OVLD_XFER_MAX_PENDING], 1);
    assert_int_equal(r[OVLD_XFER_MAX_PENDING].st, OVL_ERR_LIMIT);
    assert_non_null(strstr(r[OVLD_XFER_MAX_PENDING].why, "OVLD_XFER_MAX_PENDING"));
    assert_int_equal(r[0].calls, 0);
    res_t s = {0};
    ovld_coll_tag_t t = {.seq = 1, .index = 0};
    assert_int_equal(xsend(&A, t, 0, 1, buf, sizeof(buf), &s), OVL_OK);
    wait_done(&s, 1);
    assert_int_equal(s.st, OVL_ERR_LIMIT);
    assert_non_null(strstr(s.why, "OVLD_XFER_MAX_PENDING"));
    /* the release fails them all, once each */
    ovld_xfer_job_release(B.xj);
    B.xj = NULL;
    wait_done(r, OVLD_XFER_MAX_PENDING);
    for (unsigned i = 0; i <= OVLD_XFER_MAX_PENDING; i++)
        assert_int_equal(r[i].calls, 1);
    assert_int_equal(r[0].st, OVL_ERR_ABORTED);
    stop_both();
}

/* Shutdown fails what is pending (before destroy returns) and what is
 * posted after; a job released after it goes too. */
static void test_shutdown(void **state)
{
    (void)state;
    start_both();
    static uint8_t buf[64];
    res_t r = {0}, s = {0}, late = {0};
    ovld_coll_tag_t t = {.seq = 9, .index = 0};
    assert_int_equal(xrecv(&B, t, 0, 1, buf, sizeof(buf), &r), OVL_OK);
    assert_int_equal(xsend(&B, t, 1, 0, buf, sizeof(buf), &s), OVL_OK);
    run_until(never, NULL, 50);
    ovld_xfer_destroy(B.x);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.st, OVL_ERR_SHUTDOWN);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.st, OVL_ERR_SHUTDOWN);
    assert_int_equal(xrecv(&B, t, 0, 1, buf, sizeof(buf), &late), OVL_ERR_SHUTDOWN);
    ovld_xfer_job_release(B.xj);
    B.xj = NULL;
    B.x = NULL;
    stop_both();
}

/* A peer's messages are checked: what names another job, ranks its
 * sender does not serve, or is malformed is dropped and counted, and
 * changes nothing (a real transfer of the same names goes through). */
static void forge(side_t *to, uint32_t type, const ovld_xfer_msg_t *m)
{
    uint8_t *body;
    size_t len;
    assert_int_equal(ovld_xfer_encode(m, &body, &len), OVL_OK);
    ovld_xfer_on_message(to->x, to->other, type, body, len);
    free(body);
}

static void test_forged(void **state)
{
    (void)state;
    start_both();
    static uint8_t src[64], dst[64], key[8] = "rkey!!!!";
    ovld_xfer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = OVLD_XFER_ROWS_READY;
    memcpy(m.job, job_key, sizeof(m.job));
    m.seq = 3;
    m.from = 0;
    m.to = 1;
    m.addr = 4096;
    m.bytes = sizeof(src);
    m.rkey = key;
    m.rkey_len = sizeof(key);
    uint64_t d0 = B.counters.total.xfer_dropped;
    /* another job */
    ovld_xfer_msg_t o = m;
    o.job[0] ^= 1;
    forge(&B, o.type, &o);
    /* rank 1 is B's own: A does not serve it */
    o = m;
    o.from = 1;
    forge(&B, o.type, &o);
    /* rank 0 is not B's to receive for */
    o = m;
    o.to = 0;
    forge(&B, o.type, &o);
    /* past the world */
    o = m;
    o.to = 7;
    forge(&B, o.type, &o);
    /* a RowsTaken of no send; a type of the range that is no message */
    o = m;
    o.type = OVLD_XFER_ROWS_TAKEN;
    forge(&A, o.type, &o);
    ovld_xfer_on_message(B.x, B.other, OVLD_XFER_TYPE_LAST, (const uint8_t *)"junk", 4);
    /* decoded and refused: a key over the limit, 0 bytes, garbage */
    static uint8_t big[OVLD_XFER_RKEY_MAX + 1];
    o = m;
    o.bytes = 0;
    forge(&B, o.type, &o);
    ovld_xfer_on_message(B.x, B.other, OVLD_XFER_ROWS_READY, big, sizeof(big));
    assert_int_equal(B.counters.total.xfer_dropped - d0, 7);
    assert_int_equal(A.counters.total.xfer_dropped, 1);
    /* nothing was left behind under those names: the real ones go */
    res_t s = {0}, r = {0};
    ovld_coll_tag_t t = {.seq = 3, .index = 0};
    fill(src, sizeof(src), 5);
    assert_int_equal(xrecv(&B, t, 0, 1, dst, sizeof(dst), &r), OVL_OK);
    assert_int_equal(xsend(&A, t, 0, 1, src, sizeof(src), &s), OVL_OK);
    wait_done(&s, 1);
    wait_done(&r, 1);
    assert_int_equal(s.st, OVL_OK);
    assert_int_equal(r.st, OVL_OK);
    assert_memory_equal(src, dst, sizeof(src));
    stop_both();
}

/* The decoder alone: every field checked. */
static void test_wire(void **state)
{
    (void)state;
    uint8_t key[4] = {1, 2, 3, 4};
    ovld_xfer_msg_t m, d;
    memset(&m, 0, sizeof(m));
    m.type = OVLD_XFER_ROWS_READY;
    memset(m.job, 7, sizeof(m.job));
    m.seq = UINT64_MAX;
    m.index = UINT32_MAX;
    m.from = 3;
    m.to = 4;
    m.addr = 1u << 20;
    m.bytes = 77;
    m.rkey = key;
    m.rkey_len = sizeof(key);
    uint8_t *body;
    size_t len;
    char err[256];
    assert_int_equal(ovld_xfer_encode(&m, &body, &len), OVL_OK);
    assert_int_equal(ovld_xfer_decode(m.type, body, len, &d, err, sizeof(err)), OVL_OK);
    assert_memory_equal(d.job, m.job, sizeof(m.job));
    assert_true(d.seq == m.seq && d.index == m.index && d.from == 3 && d.to == 4);
    assert_true(d.addr == m.addr && d.bytes == 77 && d.rkey_len == 4);
    assert_memory_equal(d.rkey, key, 4);
    ovld_xfer_msg_clear(&d);
    /* the same body read as another type: a RowsTaken has no such fields
     * and reads as status 0; a RowsWithdrawn of status 0 is refused */
    assert_int_equal(ovld_xfer_decode(OVLD_XFER_ROWS_WITHDRAWN, body, len, &d, err, sizeof(err)),
                     OVL_ERR_PROTOCOL);
    assert_int_equal(ovld_xfer_decode(35, body, len, &d, err, sizeof(err)), OVL_ERR_PROTOCOL);
    free(body);
    ovld_xfer_msg_t o = m;
    o.bytes = OVLD_XFER_MAX_BYTES + 1;
    assert_int_equal(ovld_xfer_encode(&o, &body, &len), OVL_OK);
    assert_int_equal(ovld_xfer_decode(o.type, body, len, &d, err, sizeof(err)), OVL_ERR_LIMIT);
    assert_non_null(strstr(err, "OVLD_XFER_MAX_BYTES"));
    free(body);
    o = m;
    o.addr = UINT64_MAX - 10;
    assert_int_equal(ovld_xfer_encode(&o, &body, &len), OVL_OK);
    assert_int_equal(ovld_xfer_decode(o.type, body, len, &d, err, sizeof(err)), OVL_ERR_PROTOCOL);
    assert_non_null(strstr(err, "wrap around"));
    free(body);
    o = m;
    o.rkey_len = 0;
    assert_int_equal(ovld_xfer_encode(&o, &body, &len), OVL_OK);
    assert_int_equal(ovld_xfer_decode(o.type, body, len, &d, err, sizeof(err)), OVL_ERR_LIMIT);
    free(body);
    /* a status this ovld does not know, and a long reason */
    o = m;
    o.type = OVLD_XFER_ROWS_TAKEN;
    o.status = (ovl_status_t)-1000;
    snprintf(o.reason, sizeof(o.reason), "bad\x01thing");
    assert_int_equal(ovld_xfer_encode(&o, &body, &len), OVL_OK);
    assert_int_equal(ovld_xfer_decode(o.type, body, len, &d, err, sizeof(err)), OVL_OK);
    assert_int_equal(d.status, OVL_ERR_PROTOCOL);
    assert_null(strchr(d.reason, '\x01'));
    free(body);
    assert_int_equal(ovld_xfer_decode(OVLD_XFER_ROWS_TAKEN, (const uint8_t *)"\xff\xff", 2, &d, err,
                                      sizeof(err)),
                     OVL_ERR_PROTOCOL);
}

/* ------------------------------------------ ops across the two daemons */

enum { HW = 4, HM = 5, HK = 4, HN = 6 };

/* One daemon's host backend, serving the ranks of its node. */
typedef struct hside {
    side_t *s;
    uint32_t node;
    ovld_backend_t *b;
    uint32_t ndone;
    ovl_status_t st[HW];
    char msg[HW][256];
    ovld_exec_rank_t xr[HW]; /* every rank; another node's have no plan */
    ovl_plan_t plans[HW];
    struct ovl_doorbell *db[HW];
    float a[HW][HM * HK], bm[HW][HK * HN], c[HW][HW * HM * HN];
} hside_t;

static void h_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status, const char *message,
                   uint64_t ns)
{
    hside_t *h = arg;
    (void)ns;
    uint32_t r = (uint32_t)((uintptr_t)cookie - 1);
    (void)seq;
    assert_true(r < HW);
    h->st[r] = status;
    snprintf(h->msg[r], sizeof(h->msg[r]), "%s", message ? message : "");
    h->ndone++;
}

static void h_setup_done(void *arg, ovl_status_t st, const char *msg)
{
    ovl_status_t *ret = arg;
    *ret = st;
    (void)msg;
}

/* Small integers, exact in fp32: A_q of op seq, B of rank r. */
static float ha(uint64_t seq, uint32_t q, uint64_t i, uint64_t l)
{
    return (float)((int)((seq * 5 + q * 3 + i * 2 + l) % 7) - 3);
}

static float hb(uint32_t r, uint64_t l, uint64_t j)
{
    return (float)((int)((r + l * 3 + j) % 5) - 2);
}

static void hside_start(hside_t *h, side_t *s, uint32_t node, const uint32_t *node_of)
{
    char err[256];
    ovld_config_t cfg;
    ovld_config_defaults(&cfg);
    cfg.host_devices = HW;
    memset(h, 0, sizeof(*h));
    h->s = s;
    h->node = node;
    if (ovld_backend_host_create(&loop, &cfg, h_done, h, NULL, &h->b, err, sizeof(err)) != OVL_OK)
        fail_msg("host backend: %s", err);
    ovld_rank_t *local[HW];
    uint32_t global[HW], n = 0;
    for (uint32_t r = 0; r < HW; r++) {
        h->xr[r].cookie = (void *)(uintptr_t)(r + 1);
        if (node_of[r] != node)
            continue;
        ovld_doorbell_export_t dx = {.fd = -1};
        if (h->b->ops->rank_create(h->b, r, &h->xr[r].rank, &dx, err, sizeof(err)) != OVL_OK)
            fail_msg("rank %u: %s", r, err);
        h->db[r] = mmap(NULL, OVL_DOORBELL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, dx.fd,
                        (off_t)dx.offset);
        assert_true(h->db[r] != MAP_FAILED);
        close(dx.fd);
        for (uint64_t l = 0; l < HK; l++)
            for (uint64_t j = 0; j < HN; j++)
                h->bm[r][l * HN + j] = hb(r, l, j);
        h->xr[r].buf[OVL_BUF_A] = (ovld_view_t){h->a[r], HK};
        h->xr[r].buf[ovl_buf_b(0)] = (ovld_view_t){h->bm[r], HN};
        h->xr[r].buf[ovl_buf_c(0)] = (ovld_view_t){h->c[r], HN};
        local[n] = h->xr[r].rank;
        global[n++] = r;
    }
    ovld_job_net_t net = {.world = HW,
                          .global = global,
                          .node_of = node_of,
                          .self_node = node,
                          .nnodes = 2,
                          .xfer = s->xj,
                          .mover = &ovld_xfer_mover};
    ovl_status_t st = OVL_ERR_AGAIN;
    assert_int_equal(h->b->ops->job_setup(h->b, local, n, &net, true, h_setup_done, &st), OVL_OK);
    assert_int_equal(st, OVL_ERR_AGAIN); /* never from inside the call */
    while (st == OVL_ERR_AGAIN)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(st, OVL_OK);
}

/* Plans op seq of algo on h's ranks, with A and a fresh C. */
static void hside_plan(hside_t *h, ovl_algo_t algo, uint64_t seq, const uint32_t *node_of)
{
    char err[256];
    for (uint32_t r = 0; r < HW; r++) {
        if (!h->xr[r].rank)
            continue;
        if (h->xr[r].plan)
            ovl_plan_free(&h->plans[r]);
        ovl_plan_params_t p = {.algo = algo,
                               .world = HW,
                               .rank = r,
                               .m = HM,
                               .n = HN,
                               .k = HK,
                               .dtype = OVL_DTYPE_FP32,
                               .chunks = 2,
                               .nb = 1,
                               .node_of = node_of};
        assert_int_equal(ovl_plan_build(&p, &h->plans[r]), OVL_OK);
        h->xr[r].plan = &h->plans[r];
        if (h->plans[r].scratch_bytes) {
            void *ptr;
            if (h->b->ops->rank_scratch(h->b, h->xr[r].rank, h->plans[r].scratch_bytes, &ptr, err,
                                        sizeof(err)) != OVL_OK)
                fail_msg("scratch: %s", err);
            h->xr[r].buf[OVL_BUF_G] = (ovld_view_t){ptr, HK};
        }
        for (uint64_t i = 0; i < HM; i++)
            for (uint64_t l = 0; l < HK; l++)
                h->a[r][i * HK + l] = ha(seq, r, i, l);
        for (size_t x = 0; x < HW * HM * HN; x++)
            h->c[r][x] = NAN;
        __atomic_store_n(&h->db[r]->ready, seq, __ATOMIC_RELEASE);
    }
}

static uint32_t hside_nlocal(const hside_t *h)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < HW; r++)
        n += h->xr[r].rank != NULL;
    return n;
}

typedef struct hpair {
    hside_t *h[2];
} hpair_t;

static bool hpair_done(void *arg)
{
    hpair_t *p = arg;
    return p->h[0]->ndone == hside_nlocal(p->h[0]) && p->h[1]->ndone == hside_nlocal(p->h[1]);
}

/* Runs op seq on both sides (each issues its own ranks) until every rank
 * is done. */
static void hpair_run(hpair_t *p, ovl_algo_t algo, uint64_t seq, const uint32_t *node_of)
{
    char err[256];
    for (int i = 0; i < 2; i++) {
        hside_plan(p->h[i], algo, seq, node_of);
        p->h[i]->ndone = 0;
    }
    for (int i = 0; i < 2; i++) {
        ovld_exec_op_t op = {.seq = seq, .world = HW, .ranks = p->h[i]->xr};
        ovl_status_t st = ovld_exec_run(NULL, p->h[i]->b, &op, NULL, err, sizeof(err));
        if (st != OVL_OK)
            fail_msg("%s op %llu on side %d: %s", ovl_algo_name(algo), (unsigned long long)seq, i,
                     err);
    }
    assert_true(run_until(hpair_done, p, 10000));
}

static void hside_check(const hside_t *h, ovl_algo_t algo, uint64_t seq)
{
    for (uint32_t r = 0; r < HW; r++) {
        if (!h->xr[r].rank)
            continue;
        if (h->st[r] != OVL_OK)
            fail_msg("%s op %llu, rank %u: %s: %s", ovl_algo_name(algo), (unsigned long long)seq, r,
                     ovl_strerror(h->st[r]), h->msg[r]);
        for (uint32_t q = 0; q < HW; q++)
            for (uint64_t i = 0; i < HM; i++)
                for (uint64_t j = 0; j < HN; j++) {
                    float want = 0;
                    for (uint64_t l = 0; l < HK; l++)
                        want += ha(seq, q, i, l) * hb(r, l, j);
                    float got = h->c[r][(q * HM + i) * HN + j];
                    if (got != want)
                        fail_msg("%s op %llu: rank %u's C[%llu][%llu] (shard %u) is %g, not %g",
                                 ovl_algo_name(algo), (unsigned long long)seq, r,
                                 (unsigned long long)(q * HM + i), (unsigned long long)j, q, got,
                                 want);
                }
    }
}

static void hside_stop(hside_t *h)
{
    for (uint32_t r = 0; r < HW; r++) {
        if (!h->xr[r].rank)
            continue;
        h->b->ops->rank_destroy(h->b, h->xr[r].rank);
        munmap(h->db[r], OVL_DOORBELL_SIZE);
        if (h->xr[r].plan)
            ovl_plan_free(&h->plans[r]);
    }
    h->b->ops->destroy(h->b);
}

/* Whole ops of a job of 4 ranks on the two daemons, laid out node-major
 * and not: each algorithm twice, results checked; then both jobs abort
 * (as the coordinator would on a node's loss) and the next op fails on
 * every rank, saying why. */
static void test_host_across(void **state)
{
    (void)state;
    static const uint32_t layouts[2][HW] = {{0, 0, 1, 1}, {1, 0, 0, 1}};
    static const ovl_algo_t algos[] = {OVL_ALGO_RING, OVL_ALGO_COLLECTIVE, OVL_ALGO_NAIVE};
    static hside_t ha_, hb_;
    for (int t = 0; t < 2; t++) {
        const uint32_t *node_of = layouts[t];
        char err[256];
        start_both();
        /* the job of this test: 4 ranks, not start_both's 2 */
        ovld_xfer_job_release(A.xj);
        ovld_xfer_job_release(B.xj);
        const uint8_t key[OVLD_JOB_NONCE_LEN] = "four ranks, two.";
        ovld_peer_t *pa[2] = {NULL, A.other}, *pb[2] = {B.other, NULL};
        assert_int_equal(
            ovld_xfer_job_create(A.x, key, HW, node_of, 0, pa, 2, &A.xj, err, sizeof(err)), OVL_OK);
        assert_int_equal(
            ovld_xfer_job_create(B.x, key, HW, node_of, 1, pb, 2, &B.xj, err, sizeof(err)), OVL_OK);
        hside_start(&ha_, &A, 0, node_of);
        hside_start(&hb_, &B, 1, node_of);
        hpair_t p = {{&ha_, &hb_}};
        uint64_t seq = 1;
        for (size_t k = 0; k < sizeof(algos) / sizeof(algos[0]); k++)
            for (int twice = 0; twice < 2; twice++, seq++) {
                hpair_run(&p, algos[k], seq, node_of);
                hside_check(&ha_, algos[k], seq);
                hside_check(&hb_, algos[k], seq);
            }
        assert_true(A.counters.total.xfer_sends > 0 && B.counters.total.xfer_recvs > 0);
        assert_int_equal(A.counters.total.xfer_errors + B.counters.total.xfer_errors, 0);
        ovld_xfer_job_abort(A.xj, OVL_ERR_ABORTED, "node 1 lost rank 3");
        ovld_xfer_job_abort(B.xj, OVL_ERR_ABORTED, "node 1 lost rank 3");
        hpair_run(&p, OVL_ALGO_COLLECTIVE, seq, node_of);
        for (int i = 0; i < 2; i++)
            for (uint32_t r = 0; r < HW; r++) {
                if (!p.h[i]->xr[r].rank)
                    continue;
                assert_int_equal(p.h[i]->st[r], OVL_ERR_ABORTED);
                assert_non_null(strstr(p.h[i]->msg[r], "node 1 lost rank 3"));
                assert_non_null(strstr(p.h[i]->msg[r], "host backend: all-gather"));
            }
        hside_stop(&ha_);
        hside_stop(&hb_);
        stop_both();
    }
}

/* A job on one daemon: its setup changes nothing and answers on the
 * loop's next turn; an all-gather of fewer parts than ranks is refused as
 * before. */
static void test_host_one_daemon(void **state)
{
    (void)state;
    char err[256];
    ovld_config_t cfg;
    ovld_config_defaults(&cfg);
    cfg.host_devices = 2;
    hside_t *h = calloc(1, sizeof(*h));
    assert_non_null(h);
    assert_int_equal(
        ovld_backend_host_create(&loop, &cfg, h_done, h, NULL, &h->b, err, sizeof(err)), OVL_OK);
    ovld_rank_t *rk[2];
    for (uint32_t r = 0; r < 2; r++) {
        ovld_doorbell_export_t dx = {.fd = -1};
        assert_int_equal(h->b->ops->rank_create(h->b, r, &rk[r], &dx, err, sizeof(err)), OVL_OK);
        close(dx.fd);
    }
    ovl_status_t st = OVL_ERR_AGAIN;
    assert_int_equal(h->b->ops->job_setup(h->b, rk, 2, NULL, true, h_setup_done, &st), OVL_OK);
    assert_int_equal(st, OVL_ERR_AGAIN);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(st, OVL_OK);
    /* a job across nodes without a mover: refused, on the next turn */
    uint32_t global[2] = {0, 1}, node_of[3] = {0, 0, 1};
    ovld_job_net_t net = {.world = 3, .global = global, .node_of = node_of, .nnodes = 2};
    st = OVL_ERR_AGAIN;
    assert_int_equal(h->b->ops->job_setup(h->b, rk, 2, &net, true, h_setup_done, &st), OVL_OK);
    uv_run(&loop, UV_RUN_NOWAIT);
    assert_int_equal(st, OVL_ERR_INVALID);
    float buf[2][8];
    ovld_allgather_part_t parts[1] = {
        {.rank = rk[0], .global = 0, .src = {buf[0], 2}, .dst = {buf[1], 2}}};
    assert_int_equal(h->b->ops->allgather(h->b, OVL_AG_NCCL_ALLGATHER, (ovld_coll_tag_t){1, 0},
                                          parts, 1, 2, OVL_DTYPE_FP32, 2, 2, 2),
                     OVL_ERR_UNSUPPORTED);
    assert_non_null(strstr(h->b->ops->last_error(h->b), "gathers between its own ranks only"));
    for (uint32_t r = 0; r < 2; r++)
        h->b->ops->rank_destroy(h->b, rk[r]);
    h->b->ops->destroy(h->b);
    uv_run(&loop, UV_RUN_NOWAIT);
    free(h);
}

static int setup(void **state)
{
    (void)state;
    return peers_fixture_setup("test-xfer");
}

static int teardown(void **state)
{
    (void)state;
    return peers_fixture_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire),        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_threads),     cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_abort),       cmocka_unit_test(test_peer_down),
        cmocka_unit_test(test_limit),       cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_forged),      cmocka_unit_test(test_host_one_daemon),
        cmocka_unit_test(test_host_across),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

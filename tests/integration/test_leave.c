/*
 * test_leave.c: what a real ovld (host backend) and libovl do when a rank
 * goes away or too much is in flight, and that the daemon goes on serving:
 *
 *  - ranks that leave, die or disconnect while the others wait
 *    (OVL_ERR_ABORTED, saying who left), a rank that leaves with nothing
 *    pending (the job ends), the only rank of a forming job leaving with an
 *    op pending, a rank leaving right after an op refused on the spot or
 *    during a deregistration that waits for a running op (raw connections);
 *  - the daemon killed while ranks wait: libovl's watcher, or else the
 *    next call, releases every wait with OVL_ERR_CLOSED;
 *  - max_ops_in_flight: libovl's throttle and the daemon's own limit.
 *
 * Ranks of one job mostly live in this one process, one ovl_client_t (one
 * connection) each. Where a separate process matters (a rank killed) a
 * forked child joins; children never use cmocka.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cmocka_fixture.h"
#include "daemon_fixture.h"
#include "doorbell.h"
#include "libovl_internal.h"
#include "ops_fixture.h"

/* Fixtures: cmocka_fixture.h; ranks, Status and raw helpers: ops_fixture.h. */

/* ======================================================= ranks that leave */

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

        Ovl__Op g = OVL__OP__INIT;
        g.comm_id = c0.id;
        g.seq = 1;
        Ovl__Request qg = OVL__REQUEST__INIT;
        qg.body_case = OVL__REQUEST__BODY_OP;
        qg.op = &g;
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
 * A deregistration that waits for a running op is answered once that op's
 * completion let the buffer go (by the loop, right after the completion);
 * the connection's next request, sent in the same write, is a CommDestroy
 * that ends the job there and then (and, in the second round, the client
 * hangs up instead, with the buffer posted idle or about to be). The
 * daemon must neither touch the freed job or buffer nor crash (ASan builds
 * catch a use after free).
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

        raw_op_t o;
        raw_op_init(&o, c.id, 1, mem);
        for (int i = 0; i < 3; i++) {
            o.refs[i].offset = (uint64_t)i * mat;
            o.by_slot[i]->ld = BIG;
        }
        o.g.m = o.g.n = o.g.k = BIG;
        __atomic_store_n(&c.db->ready, 1, __ATOMIC_RELEASE);
        Ovl__Request qg = OVL__REQUEST__INIT;
        qg.body_case = OVL__REQUEST__BODY_OP;
        qg.op = &o.op;
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
    raw_op_t o;
    raw_op_init(&o, c.id, 1, mem);
    raw_submit(&rc, &c, &o.op);
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
    /* Ops on the aborted job fail at once: the call itself, with the
     * comm's error. */
    assert_status(rank_submit(&r0, 0, &s), OVL_ERR_ABORTED);
    assert_contains(ovl_last_error(r0.cl), "rank 1 left");
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
        assert_int_equal(
            __atomic_load_n(&libovl_comm_doorbell(rk[r].comm)->error, __ATOMIC_ACQUIRE), 0);
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
 * max_ops_in_flight = 2 and a rank that ignores the throttle (raw Op
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
        raw_op_t o;
        raw_op_init(&o, c0.id, seq, mem);
        raw_submit(&rc, &c0, &o.op);
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

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_leave_right_after_refused_op),
        T(test_deregister_then_leave_during_op),
        T(test_last_rank_leaves_with_op_pending),
        T(test_rank_killed_aborts_job),
        T(test_rank_disconnect_aborts_job),
        T(test_comm_destroy_aborts_waiting_rank),
        T(test_daemon_killed_releases_waits),
        T(test_daemon_killed_calls_release_waits),
        T(test_idle_rank_leaves_job_ends),
        /* max_ops_in_flight */
        TC(test_client_throttle, "max_ops_in_flight = 2\n"),
        TC(test_daemon_ops_limit, "max_ops_in_flight = 2\n"),
    };
    return RUN_TESTS("leave", tests, argc, argv);
}

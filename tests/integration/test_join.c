/*
 * test_join.c: how a real ovld (host backend) and libovl refuse a join
 * that is wrong, and that the daemon goes on serving afterwards: a rank
 * twice, a rank out of range, a world that disagrees, bad job ids (through
 * libovl, and hostile bytes and integers on a raw CommInit), unknown
 * devices, one device for two ranks, another user's job (job ids are a
 * namespace per uid); libovl's own refusals of the arguments of a join by
 * a job id across nodes.
 *
 * Ranks of one job mostly live in this one process, one ovl_client_t (one
 * connection) each. Where another uid matters a forked child joins; children
 * never use cmocka.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <grp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmocka_fixture.h"
#include "daemon_fixture.h"
#include "libovl_internal.h"
#include "ops_fixture.h"

/* Fixtures: cmocka_fixture.h; ranks, Status and raw helpers: ops_fixture.h. */

/* ================================================================ joins */

static void test_join_same_rank_twice(void **state)
{
    test_daemon_t *d = *state;
    rank_t r0;
    rank_open(d, &r0, "dup", 2, 0, 0, 0);
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "dup", 2, 0, 1, &comm), OVL_ERR_EXISTS);
    assert_contains(ovl_last_error(cl), "rank 0 of job 'dup' already joined");
    assert_null(comm);
    /* The same connection asking again for its own rank. */
    assert_status(ovl_comm_init(r0.cl, "dup", 2, 0, 2, &comm), OVL_ERR_EXISTS);
    assert_contains(ovl_last_error(r0.cl), "already joined");
    ovl_disconnect(cl);
    assert_status(rank_close(&r0), OVL_OK);
    /* The refusals left nothing behind: a complete job works. */
    fresh_job_works(d, "dup", 2);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_rank_out_of_range(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "range", 2, 2, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "rank 2 out of range for world 2");
    assert_status(ovl_comm_init(cl, "range", 2, 7, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, "range", 0, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "world 0 out of range");
    assert_status(ovl_comm_init(cl, "range", 1025, 0, 0, &comm), OVL_ERR_INVALID);
    assert_null(comm);
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0); /* no job was made on the way */
    libovl_response_free(r);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_world_mismatch(void **state)
{
    test_daemon_t *d = *state;
    rank_t r0;
    rank_open(d, &r0, "worlds", 2, 0, 0, 0);
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "worlds", 3, 1, 1, &comm), OVL_ERR_MISMATCH);
    assert_contains(ovl_last_error(cl), "job 'worlds' has world 2, not 3");
    assert_status(ovl_comm_init(cl, "worlds", 1, 0, 1, &comm), OVL_ERR_MISMATCH);
    assert_null(comm);
    ovl_disconnect(cl);
    assert_status(rank_close(&r0), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_bad_job_id(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    char id[80];

    assert_status(ovl_comm_init(cl, "", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id must be 1 to 63 bytes");
    memset(id, 'j', 64);
    id[64] = '\0';
    assert_status(ovl_comm_init(cl, id, 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id must be 1 to 63 bytes");
    memset(id, 'j', 79);
    id[79] = '\0';
    assert_status(ovl_comm_init(cl, id, 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, "tab\there", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "control character");
    assert_status(ovl_comm_init(cl, "del\x7f", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, NULL, 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(cl, "x", 1, 0, 0, NULL), OVL_ERR_INVALID);
    assert_status(ovl_comm_init(NULL, "x", 1, 0, 0, &comm), OVL_ERR_INVALID);
    assert_null(comm);

    /* 63 bytes is the longest id, and it works. */
    memset(id, 'j', 63);
    id[63] = '\0';
    assert_status(ovl_comm_init(cl, id, 1, 0, 0, &comm), OVL_OK);
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 1);
    assert_string_equal(r->status->jobs[0]->id, id);
    libovl_response_free(r);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

/* A raw CommInit through libovl's internal call: any id bytes, world, rank
 * and device UUID. */
static ovl_status_t raw_comm_init_full(ovl_client_t *cl, const void *job, size_t job_len,
                                       uint64_t world, uint64_t rank, const uint8_t *uuid,
                                       size_t uuid_len)
{
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_id.data = (uint8_t *)job;
    ci.job_id.len = job_len;
    ci.world = world;
    ci.rank = rank;
    ci.device_uuid.data = (uint8_t *)uuid;
    ci.device_uuid.len = uuid_len;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = &ci;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, &q, NULL, 0, &r);
    if (st == OVL_OK)
        libovl_response_free(r); /* not expected here: the doorbell fd stays queued */
    return st;
}

static ovl_status_t raw_comm_init(ovl_client_t *cl, const char *job, const uint8_t *uuid,
                                  size_t uuid_len)
{
    return raw_comm_init_full(cl, job, strlen(job), 1, 0, uuid, uuid_len);
}

/* What protobuf would pass and ovld must not: bytes after a NUL, text that
 * is not UTF-8, integers wider than the fields ovld keeps (a varint world
 * of 2^32 + 2 was taken as world 2). Nothing joins; nothing is created. */
static void test_join_hostile_fields(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    uint8_t uuid[16];
    Ovl__Response *r = status_call(cl);
    memcpy(uuid, r->status->devices[0]->uuid.data, 16);
    libovl_response_free(r);

    assert_status(raw_comm_init_full(cl, "nul\0tail", 8, 1, 0, uuid, 16), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id holds a NUL byte at 3");
    char long_id[85];
    memset(long_id, 'x', sizeof(long_id));
    long_id[4] = '\0';
    assert_status(raw_comm_init_full(cl, long_id, sizeof(long_id), 1, 0, uuid, 16),
                  OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "job id must be 1 to 63 bytes, not 85");
    assert_status(raw_comm_init_full(cl, "\xff\xfe", 2, 1, 0, uuid, 16), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "UTF-8");
    assert_status(raw_comm_init_full(cl, "esc\x1b[2J", 7, 1, 0, uuid, 16), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "control character");
    assert_status(raw_comm_init_full(cl, "c1\xc2\x9b", 4, 1, 0, uuid, 16), OVL_ERR_INVALID);
    /* a character cut short at the end */
    assert_status(raw_comm_init_full(cl, "cut\xc3", 4, 1, 0, uuid, 16), OVL_ERR_INVALID);

    assert_status(raw_comm_init_full(cl, "wide", 4, (UINT64_C(1) << 32) + 2, 0, uuid, 16),
                  OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "world 4294967298 out of range 1..1024");
    assert_status(raw_comm_init_full(cl, "wide", 4, 2, (UINT64_C(1) << 32) + 1, uuid, 16),
                  OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "rank 4294967297 out of range for world 2");
    assert_status(raw_comm_init_full(cl, "wide", 4, UINT64_MAX, 0, uuid, 16), OVL_ERR_INVALID);

    r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0);
    libovl_response_free(r);
    /* UTF-8 that is text is an id like any other */
    ovl_comm_t *comm;
    assert_status(ovl_comm_init(cl, "jöb-ü", 1, 0, 0, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

/* Jobs across nodes (ovl_job_id_create, ovl_comm_init_id): libovl refuses
 * bad arguments itself, with words, before anything is sent, so that the
 * connection goes on and nothing was made. What ovld answers to the id is
 * docs/protocol.md's (peer_listen), not tested here. */
static void test_join_id_arguments(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_job_id_t id;
    memset(&id, 0x5a, sizeof(id));
    ovl_comm_t *comm = NULL;
    assert_int_equal(sizeof(id.bytes), OVL_JOB_ID_BYTES);
    assert_status(ovl_job_id_create(NULL, &id), OVL_ERR_INVALID);
    assert_status(ovl_job_id_create(cl, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "ovl_job_id_create: ret_id is required");
    assert_status(ovl_comm_init_id(NULL, &id, 2, 0, 0, &comm), OVL_ERR_INVALID);
    assert_status(ovl_comm_init_id(cl, NULL, 2, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "ovl_comm_init_id: id and ret_comm are required");
    assert_status(ovl_comm_init_id(cl, &id, 2, 0, 0, NULL), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "id and ret_comm are required");
    assert_status(ovl_comm_init_id(cl, &id, 0, 0, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "ovl_comm_init_id: world 0 out of range");
    assert_status(ovl_comm_init_id(cl, &id, 2, 2, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "ovl_comm_init_id: rank 2 out of range for world 2");
    assert_status(ovl_comm_init_id(cl, &id, 3, UINT32_MAX, 0, &comm), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "rank 4294967295 out of range for world 3");
    assert_null(comm);
    /* nothing went to ovld: the connection is in step, and no job exists */
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0);
    libovl_response_free(r);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

static void test_join_bad_device(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    /* libovl refuses an index it has no UUID for. */
    assert_status(ovl_comm_init(cl, "dev", 1, 0, 8, &comm), OVL_ERR_NOT_FOUND);
    assert_contains(ovl_last_error(cl), "no host device 8 (ovld has 8)");
    assert_status(ovl_comm_init(cl, "dev", 1, 0, -1, &comm), OVL_ERR_NOT_FOUND);
    assert_status(ovl_comm_init(cl, "dev", 1, 0, 1000000, &comm), OVL_ERR_NOT_FOUND);
    assert_null(comm);
    /* The daemon refuses a UUID it does not have, or one of the wrong size. */
    uint8_t uuid[17];
    memset(uuid, 0xab, sizeof(uuid));
    assert_status(raw_comm_init(cl, "dev", uuid, 16), OVL_ERR_NOT_FOUND);
    assert_contains(ovl_last_error(cl), "no device with UUID");
    assert_status(raw_comm_init(cl, "dev", uuid, 15), OVL_ERR_INVALID);
    assert_contains(ovl_last_error(cl), "must be 16 bytes, not 15");
    assert_status(raw_comm_init(cl, "dev", uuid, 17), OVL_ERR_INVALID);
    assert_status(raw_comm_init(cl, "dev", uuid, 0), OVL_ERR_INVALID);
    Ovl__Response *r = status_call(cl);
    assert_int_equal(r->status->n_jobs, 0);
    libovl_response_free(r);
    /* The client still works after the refusals. */
    assert_status(ovl_comm_init(cl, "dev", 1, 0, 7, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

/* Ranks of one job may share a device, as ranks of different jobs do
 * (several ranks on one GPU): every algorithm runs, with a_out and
 * without, with the exact results; whatever allgather setting (the plans
 * gather by the copy engine where ranks share a device). */
static void test_join_same_device_shared(void **state)
{
    test_daemon_t *d = *state;
    rank_t rk[4];
    for (uint32_t r = 0; r < 4; r++)
        rank_open(d, &rk[r], "gpu", 4, r, r < 2 ? 3 : 4, 1); /* two ranks each on 3 and 4 */
    /* Status says which ranks share a device. */
    Ovl__Response *st = status_call(rk[0].cl);
    const Ovl__JobInfo *ji = find_job(st, "gpu");
    assert_non_null(ji);
    assert_int_equal(ji->n_rank_devices, 4);
    static const int32_t want_devs[4] = {3, 3, 4, 4};
    for (int r = 0; r < 4; r++)
        assert_int_equal(ji->rank_devices[r], want_devs[r]);
    libovl_response_free(st);
    static const ovl_algo_t algos[] = {OVL_ALGO_NAIVE, OVL_ALGO_COLLECTIVE, OVL_ALGO_RING};
    for (unsigned a = 0; a < sizeof(algos) / sizeof(algos[0]); a++)
        for (int aout = 0; aout < 2; aout++) {
            opspec_t s = base_spec;
            s.algo = algos[a];
            s.aout = aout;
            s.salt = 10 + a * 2 + (unsigned)aout;
            job_run_check(rk, 4, 0, &s);
        }
    /* Another job may use the device too. */
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(cl, "other-gpu", 1, 0, 3, &comm), OVL_OK);
    assert_status(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    for (uint32_t r = 0; r < 4; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

/* What the nobody child reports. */
typedef struct perm_report {
    int stage; /* 0: all done; else where it stopped */
    int join_root_job;
    char msg_root_job[256];
    int create_own_job;
    char msg_own_job[256];
} perm_report_t;

static void perm_child(test_daemon_t *d, int out, int go)
{
    perm_report_t rep;
    memset(&rep, 0, sizeof(rep));
    alarm(20); /* whatever happens, this child ends */
    rep.stage = 1;
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        goto out;
    rep.stage = 2;
    ovl_client_t *cl = NULL;
    if (ovl_connect(d->sock, &cl) != OVL_OK) {
        snprintf(rep.msg_root_job, sizeof(rep.msg_root_job), "%s", ovl_connect_error());
        goto out;
    }
    ovl_set_timeout(cl, TIMEOUT_MS);
    ovl_comm_t *c1 = NULL, *c2 = NULL;
    rep.join_root_job = ovl_comm_init(cl, "owned-by-root", 2, 1, 1, &c1);
    snprintf(rep.msg_root_job, sizeof(rep.msg_root_job), "%s", ovl_last_error(cl));
    rep.create_own_job = ovl_comm_init(cl, "owned-by-nobody", 2, 0, 2, &c2);
    snprintf(rep.msg_own_job, sizeof(rep.msg_own_job), "%s", ovl_last_error(cl));
    rep.stage = 0;
    if (write(out, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(3);
    char c;
    while (read(go, &c, 1) < 0 && errno == EINTR) /* until the parent is done */
        ;
    _exit(0);
out:
    if (write(out, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(3);
    _exit(2);
}

/* Another uid cannot join a job (either way round): job ids are a
 * namespace per uid, so the same id names another job of its own, and
 * nobody can claim an id before its owner does. Root only: the child
 * becomes nobody; the socket is opened to all with socket_mode = 0666. */
static void test_join_other_uid(void **state)
{
    test_daemon_t *d = *state;
    if (geteuid() != 0) {
        TEST_PASSED();
        skip();
    }
    assert_int_equal(chmod(d->dir, 0711), 0); /* nobody must reach the socket */
    rank_t r0;
    rank_open(d, &r0, "owned-by-root", 2, 0, 0, 0);

    int out, go;
    pid_t pid = fixture_fork_child(d, perm_child, &out, &go);
    assert_true(pid > 0);
    perm_report_t rep;
    int got = read_full(out, &rep, sizeof(rep), TIMEOUT_MS);
    close(out);
    if (got != 0) {
        close(go);
        wait_child(pid, TIMEOUT_MS);
        fail_msg("no report from the child");
    }
    if (rep.stage != 0) {
        close(go);
        wait_child(pid, TIMEOUT_MS);
        rank_close(&r0);
        if (rep.stage == 1) { /* root without CAP_SETUID (a container) */
            TEST_PASSED();
            skip();
        }
        fail_msg("the child stopped at stage %d: %s", rep.stage, rep.msg_root_job);
    }
    /* nobody's "owned-by-root" is a job of its own, not root's */
    assert_status((ovl_status_t)rep.join_root_job, OVL_OK);
    assert_status((ovl_status_t)rep.create_own_job, OVL_OK);

    /* The converse: root's "owned-by-nobody" is root's own job too. */
    ovl_comm_t *comm = NULL;
    assert_status(ovl_comm_init(r0.cl, "owned-by-nobody", 2, 1, 3, &comm), OVL_OK);
    Ovl__Response *r = status_call(r0.cl);
    const Ovl__JobInfo *j = find_job_of(r, "owned-by-root", 0);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1); /* rank 0 alone: nobody's rank 1 is elsewhere */
    assert_string_equal(j->state, "forming");
    j = find_job_of(r, "owned-by-root", NOBODY);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1);
    j = find_job_of(r, "owned-by-nobody", NOBODY);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1);
    j = find_job_of(r, "owned-by-nobody", 0);
    assert_non_null(j);
    assert_int_equal(j->local_ranks, 1);
    libovl_response_free(r);
    assert_status(ovl_comm_destroy(comm), OVL_OK);

    close(go);
    assert_int_equal(wait_child(pid, TIMEOUT_MS), 0);
    wait_job_gone(r0.cl, "owned-by-nobody"); /* root's and nobody's */
    assert_status(rank_close(&r0), OVL_OK);
    assert_alive(d);
    TEST_PASSED();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_join_same_rank_twice),
        T(test_join_rank_out_of_range),
        T(test_join_world_mismatch),
        T(test_join_bad_job_id),
        T(test_join_bad_device),
        T(test_join_hostile_fields),
        T(test_join_id_arguments),
        T(test_join_same_device_shared),
        /* root only (skipped otherwise): a child becomes nobody */
        TC(test_join_other_uid, "socket_mode = 0666\n"),
    };
    return RUN_TESTS("join", tests, argc, argv);
}

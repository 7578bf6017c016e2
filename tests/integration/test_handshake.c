/*
 * test_handshake.c: the connection's first steps against a real ovld (host
 * backend): the Hello exchange through libovl and on raw sockets, what the
 * daemon answers to out-of-order, malformed and oversized frames (an Error
 * where one can be sent, then the end of that connection only), and how
 * ovl_connect finds and reports the socket. Every test starts its own
 * daemon and, at teardown, stops it with SIGTERM and wants exit status 0.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <unistd.h>

#include "cmocka_fixture.h"
#include "daemon_fixture.h"
#include "libovl_internal.h"

#define TIMEOUT_MS 5000

#define assert_raw(expr, want)                                                                     \
    do {                                                                                           \
        raw_result_t got_ = (expr);                                                                \
        if (got_ != (want))                                                                        \
            fail_msg("%s is %s, not %s", #expr, raw_result_name(got_), raw_result_name(want));     \
    } while (0)

/* Fixtures: cmocka_fixture.h. */

/* ------------------------------------------------------------ helpers */

static ovl_client_t *connect_ok(test_daemon_t *d)
{
    ovl_client_t *cl = NULL;
    ovl_status_t st = ovl_connect(d->sock, &cl);
    if (st != OVL_OK)
        fail_msg("ovl_connect(%s): %s: %s", d->sock, ovl_strerror(st), ovl_connect_error());
    ovl_set_timeout(cl, TIMEOUT_MS);
    return cl;
}

/* A Status request through libovl's raw call; free with libovl_response_free. */
static Ovl__StatusReply *status_of(ovl_client_t *cl, Ovl__Response **ret_resp)
{
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_status(cl, &r);
    if (st != OVL_OK)
        fail_msg("Status: %s: %s", ovl_strerror(st), ovl_last_error(cl));
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
    *ret_resp = r;
    return r->status;
}

/* With max_connections reached, daemon_check_alive cannot connect: ask
 * through a client already connected instead. */
static void assert_alive_with(test_daemon_t *d, ovl_client_t *cl)
{
    assert_true(daemon_running(d));
    Ovl__Response *r;
    assert_int_equal(status_of(cl, &r)->pid, d->pid);
    libovl_response_free(r);
}

/* Waits (bounded) until the daemon counts `want` connections. */
static void wait_connections(ovl_client_t *cl, uint32_t want)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    uint32_t have;
    for (;;) {
        Ovl__Response *r;
        have = status_of(cl, &r)->connections;
        libovl_response_free(r);
        if (have == want)
            return;
        if (fixture_now_ms() >= deadline)
            break;
        fixture_sleep_ms(5);
    }
    fail_msg("ovld counts %u connections, not %u", have, want);
}

static void open_raw(test_daemon_t *d, raw_conn_t *rc)
{
    assert_int_equal(raw_open(rc, d->sock), 0);
}

/* Reads one response: an Error with this id, status and words in it. */
static void expect_error(raw_conn_t *rc, uint64_t id, ovl_status_t status, const char *needle)
{
    Ovl__Response *r = NULL;
    assert_raw(raw_read_response(rc, TIMEOUT_MS, &r), RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_ERROR)
        fail_msg("expected an Error, got response body %d", (int)r->body_case);
    assert_int_equal(r->id, id);
    if (r->error->status != status)
        fail_msg("Error status %d (%s), not %d (%s): %s", r->error->status,
                 ovl_strerror((ovl_status_t)r->error->status), status, ovl_strerror(status),
                 r->error->message);
    assert_contains(r->error->message, needle);
    ovl__response__free_unpacked(r, NULL);
}

static void expect_closed(raw_conn_t *rc)
{
    assert_raw(raw_expect_closed(rc, TIMEOUT_MS), RAW_CLOSED);
}

static void send_status(raw_conn_t *rc, uint64_t id)
{
    Ovl__StatusRequest sq = OVL__STATUS_REQUEST__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = id;
    q.body_case = OVL__REQUEST__BODY_STATUS;
    q.status = &sq;
    assert_int_equal(raw_send_request(rc, &q, NULL, 0), 0);
}

/* --------------------------------------------------------- the good path */

static void test_good_handshake(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_daemon_info_t info;
    memset(&info, 0x5a, sizeof(info));
    assert_int_equal(ovl_daemon_info(cl, &info), OVL_OK);
    assert_int_equal(info.protocol_version, OVL_PROTOCOL_VERSION);
    assert_string_equal(info.version, OVL_VERSION_STRING);
    assert_string_equal(info.backend, "host");
    assert_int_equal(info.pid, d->pid);
    assert_int_equal(info.ndevices, 8);
    assert_string_equal(ovl_last_error(cl), "");
    assert_int_equal(ovl_daemon_info(cl, NULL), OVL_ERR_INVALID);
    assert_int_equal(ovl_daemon_info(NULL, &info), OVL_ERR_INVALID);

    /* The daemon's view of this client: SO_PEERCRED and the Hello's name. */
    Ovl__Response *r;
    Ovl__StatusReply *s = status_of(cl, &r);
    assert_string_equal(s->version, OVL_VERSION_STRING);
    assert_int_equal(s->protocol_version, OVL_PROTOCOL_VERSION);
    assert_int_equal(s->pid, d->pid);
    assert_string_equal(s->backend, "host");
    assert_string_equal(s->socket, d->sock);
    assert_string_equal(s->config_file, "");
    assert_int_equal(s->n_devices, 8);
    assert_int_equal(s->n_jobs, 0);
    bool me = false;
    for (size_t i = 0; i < s->n_clients; i++) {
        const Ovl__ClientInfo *ci = s->clients[i];
        if (ci->pid != getpid())
            continue;
        me = true;
        assert_int_equal(ci->uid, getuid());
        assert_int_equal(ci->gid, getgid());
        assert_string_equal(ci->name, program_invocation_short_name);
        assert_string_equal(ci->job, "");
        assert_int_equal(ci->rank, -1);
    }
    assert_true(me);
    libovl_response_free(r);

    /* A second client is a second connection of its own. */
    ovl_client_t *cl2 = connect_ok(d);
    ovl_daemon_info_t info2;
    assert_int_equal(ovl_daemon_info(cl2, &info2), OVL_OK);
    assert_memory_equal(&info, &info2, sizeof(info));
    wait_connections(cl, 2);
    ovl_disconnect(cl2);
    wait_connections(cl, 1);
    ovl_disconnect(cl);
    ovl_disconnect(NULL); /* accepted */
    TEST_PASSED();
}

static void test_raw_hello_reply(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t a, b;
    open_raw(d, &a);
    open_raw(d, &b);
    Ovl__Response *ra = NULL, *rb = NULL;
    assert_raw(raw_hello(&a, &ra), RAW_OK);
    assert_raw(raw_hello(&b, &rb), RAW_OK);
    const Ovl__HelloReply *h = ra->hello;
    assert_int_equal(h->protocol_version, OVL_PROTOCOL_VERSION);
    assert_string_equal(h->daemon_version, OVL_VERSION_STRING);
    assert_string_equal(h->backend, "host");
    assert_int_equal(h->daemon_pid, d->pid);
    /* ovld's pidfd (raw_hello took and closed it), where pidfd_open exists */
    assert_int_equal(h->fd_count, fixture_has_pidfd() ? 1 : 0);
    assert_int_not_equal(h->client_id, 0);
    assert_int_not_equal(h->client_id, rb->hello->client_id);
    assert_int_equal(h->n_devices, 8);
    for (size_t i = 0; i < h->n_devices; i++) {
        assert_int_equal(h->devices[i]->index, i);
        assert_int_equal(h->devices[i]->uuid.len, 16);
        assert_true(h->devices[i]->name && h->devices[i]->name[0]);
        for (size_t j = 0; j < i; j++)
            assert_memory_not_equal(h->devices[i]->uuid.data, h->devices[j]->uuid.data, 16);
    }
    ovl__response__free_unpacked(ra, NULL);
    ovl__response__free_unpacked(rb, NULL);
    /* After Hello, requests are answered in order, ids echoed. */
    send_status(&a, 41);
    Ovl__Response *r = NULL;
    assert_raw(raw_read_response(&a, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->id, 41);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
    ovl__response__free_unpacked(r, NULL);
    raw_close(&a);
    raw_close(&b);
    assert_alive(d);
    TEST_PASSED();
}

static void test_config_host_devices(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_daemon_info_t info;
    assert_int_equal(ovl_daemon_info(cl, &info), OVL_OK);
    assert_int_equal(info.ndevices, 3);
    assert_int_equal(info.pid, d->pid);
    assert_string_equal(info.backend, "host");

    Ovl__Response *r;
    Ovl__StatusReply *s = status_of(cl, &r);
    char real[PATH_MAX];
    assert_non_null(realpath(d->config, real));
    assert_string_equal(s->config_file, real);
    assert_int_equal(s->n_devices, 3);
    libovl_response_free(r);

    /* The devices are usable, up to the configured count only. */
    ovl_comm_t *comm = NULL;
    assert_int_equal(ovl_comm_init(cl, "three", 1, 0, 3, &comm), OVL_ERR_NOT_FOUND);
    assert_contains(ovl_last_error(cl), "no host device 3");
    assert_null(comm);
    assert_int_equal(ovl_comm_init(cl, "three", 1, 0, 2, &comm), OVL_OK);
    assert_int_equal(ovl_comm_destroy(comm), OVL_OK);
    ovl_disconnect(cl);
    TEST_PASSED();
}

/* ----------------------------------------------------- refused handshakes */

static void test_version_mismatch(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    open_raw(d, &rc);
    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = 99;
    h.library_version = (char *)"9.9.9";
    h.client_name.data = (uint8_t *)"from-the-future";
    h.client_name.len = 15;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = 7;
    q.body_case = OVL__REQUEST__BODY_HELLO;
    q.hello = &h;
    assert_int_equal(raw_send_request(&rc, &q, NULL, 0), 0);
    Ovl__Response *r = NULL;
    assert_raw(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->id, 7);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_ERROR);
    assert_int_equal(r->error->status, OVL_ERR_VERSION);
    /* Both versions named, and both programs' versions too. */
    assert_contains(r->error->message, "version 99");
    char ours[32];
    snprintf(ours, sizeof(ours), "version %d", OVL_PROTOCOL_VERSION);
    assert_contains(r->error->message, ours);
    assert_contains(r->error->message, "9.9.9");
    assert_contains(r->error->message, OVL_VERSION_STRING);
    ovl__response__free_unpacked(r, NULL);
    expect_closed(&rc);
    raw_close(&rc);

    /* Version 0 (an empty Hello) is refused the same way. */
    open_raw(d, &rc);
    Ovl__Hello h0 = OVL__HELLO__INIT;
    q.id = 8;
    q.hello = &h0;
    assert_int_equal(raw_send_request(&rc, &q, NULL, 0), 0);
    expect_error(&rc, 8, OVL_ERR_VERSION, "version 0");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

static void test_request_before_hello(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;

    open_raw(d, &rc);
    send_status(&rc, 3);
    expect_error(&rc, 3, OVL_ERR_PROTOCOL, "expected Hello first");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);

    /* A join before Hello: refused, no job made. */
    open_raw(d, &rc);
    uint8_t uuid[16] = {0};
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_id.data = (uint8_t *)"early";
    ci.job_id.len = 5;
    ci.world = 1;
    ci.device_uuid.data = uuid;
    ci.device_uuid.len = sizeof(uuid);
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = 4;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = &ci;
    assert_int_equal(raw_send_request(&rc, &q, NULL, 0), 0);
    expect_error(&rc, 4, OVL_ERR_PROTOCOL, "expected Hello first");
    expect_closed(&rc);
    raw_close(&rc);

    /* An op before Hello (it has no id: the Error carries 0). */
    open_raw(d, &rc);
    Ovl__Op g = OVL__OP__INIT;
    g.comm_id = 1;
    g.seq = 1;
    Ovl__Request qg = OVL__REQUEST__INIT;
    qg.body_case = OVL__REQUEST__BODY_OP;
    qg.op = &g;
    assert_int_equal(raw_send_request(&rc, &qg, NULL, 0), 0);
    expect_error(&rc, 0, OVL_ERR_PROTOCOL, "expected Hello first");
    expect_closed(&rc);
    raw_close(&rc);

    /* An empty Request (no body) before Hello. */
    open_raw(d, &rc);
    Ovl__Request qe = OVL__REQUEST__INIT;
    qe.id = 5;
    assert_int_equal(raw_send_request(&rc, &qe, NULL, 0), 0);
    expect_error(&rc, 5, OVL_ERR_PROTOCOL, "expected Hello first");
    expect_closed(&rc);
    raw_close(&rc);

    ovl_client_t *cl = connect_ok(d);
    Ovl__Response *r;
    assert_int_equal(status_of(cl, &r)->n_jobs, 0);
    libovl_response_free(r);
    ovl_disconnect(cl);
    assert_alive(d);
    TEST_PASSED();
}

static void test_hello_twice(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    open_raw(d, &rc);
    assert_raw(raw_hello(&rc, NULL), RAW_OK);
    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = OVL_PROTOCOL_VERSION;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = 77;
    q.body_case = OVL__REQUEST__BODY_HELLO;
    q.hello = &h;
    assert_int_equal(raw_send_request(&rc, &q, NULL, 0), 0);
    expect_error(&rc, 77, OVL_ERR_PROTOCOL, "Hello sent twice");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

static void test_unknown_request_after_hello(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    open_raw(d, &rc);
    assert_raw(raw_hello(&rc, NULL), RAW_OK);
    Ovl__Request q = OVL__REQUEST__INIT; /* no body */
    q.id = 9;
    assert_int_equal(raw_send_request(&rc, &q, NULL, 0), 0);
    expect_error(&rc, 9, OVL_ERR_PROTOCOL, "unknown request");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/* ------------------------------------------------------------ bad frames */

static void test_bad_magic(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;

    /* A whole frame's worth of garbage. */
    open_raw(d, &rc);
    static const char garbage[] = "GET / HTTP/1.1\r\nHost: ovld\r\n\r\n";
    assert_int_equal(raw_send(rc.fd, garbage, sizeof(garbage) - 1), 0);
    expect_error(&rc, 0, OVL_ERR_PROTOCOL, "magic");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);

    /* One wrong byte is enough: refused without waiting for a header. */
    open_raw(d, &rc);
    assert_int_equal(raw_send(rc.fd, "X", 1), 0);
    expect_error(&rc, 0, OVL_ERR_PROTOCOL, "magic");
    expect_closed(&rc);
    raw_close(&rc);

    /* A good Hello, then a bad header: the same, on a live connection. */
    open_raw(d, &rc);
    assert_raw(raw_hello(&rc, NULL), RAW_OK);
    static const uint8_t bad[8] = {'O', 'V', 'L', '2', 0, 0, 0, 0};
    assert_int_equal(raw_send(rc.fd, bad, sizeof(bad)), 0);
    expect_error(&rc, 0, OVL_ERR_PROTOCOL, "magic");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

static void test_malformed_body(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    open_raw(d, &rc);
    static const uint8_t junk[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                     0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(raw_send_frame(rc.fd, sizeof(junk), junk, sizeof(junk)), 0);
    expect_error(&rc, 0, OVL_ERR_PROTOCOL, "malformed request");
    expect_closed(&rc);
    raw_close(&rc);

    /* The same after a good Hello. */
    open_raw(d, &rc);
    assert_raw(raw_hello(&rc, NULL), RAW_OK);
    assert_int_equal(raw_send_frame(rc.fd, sizeof(junk), junk, sizeof(junk)), 0);
    expect_error(&rc, 0, OVL_ERR_PROTOCOL, "malformed request");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

static void oversized(test_daemon_t *d, uint32_t len, bool hello_first)
{
    raw_conn_t rc;
    open_raw(d, &rc);
    if (hello_first)
        assert_raw(raw_hello(&rc, NULL), RAW_OK);
    /* Only the header: the daemon must refuse it from the header alone. */
    assert_int_equal(raw_send_frame(rc.fd, len, NULL, 0), 0);
    expect_error(&rc, 0, OVL_ERR_LIMIT, "max_frame_bytes");
    expect_closed(&rc);
    raw_close(&rc);
    assert_alive(d);
}

static void test_oversized_length(void **state)
{
    test_daemon_t *d = *state;
    oversized(d, 0xFFFFFFFFu, false);
    oversized(d, OVL_WIRE_DEFAULT_MAX + 1, false); /* the default max_frame_bytes, plus one */
    oversized(d, 0xFFFFFFFFu, true);
    oversized(d, OVL_WIRE_DEFAULT_MAX + 1, true);
    TEST_PASSED();
}

/* A Hello request packed to exactly `size` bytes, padded in client_name;
 * returns the packed length (size unless no padding reaches it). */
static size_t hello_of_size(size_t size, uint8_t *out, char *name)
{
    for (size_t pad = size > 64 ? size - 64 : 0; pad < size; pad++) {
        memset(name, 'n', pad);
        name[pad] = '\0';
        Ovl__Hello h = OVL__HELLO__INIT;
        h.protocol_version = OVL_PROTOCOL_VERSION;
        h.client_name.data = (uint8_t *)name;
        h.client_name.len = pad;
        Ovl__Request q = OVL__REQUEST__INIT;
        q.id = 1;
        q.body_case = OVL__REQUEST__BODY_HELLO;
        q.hello = &h;
        size_t n = ovl__request__get_packed_size(&q);
        if (n == size)
            return ovl__request__pack(&q, out);
        if (n > size)
            break;
    }
    return 0;
}

/* With max_frame_bytes = 4096: a 4096-byte body passes, 4097 does not. */
static void test_frame_limit_boundary(void **state)
{
    test_daemon_t *d = *state;
    static uint8_t body[4096 + 16], frame[4096 + 32];
    static char name[4096 + 16];
    raw_conn_t rc;

    open_raw(d, &rc);
    size_t n = hello_of_size(4096, body, name);
    assert_int_equal(n, 4096);
    assert_int_equal(raw_send_frame(rc.fd, (uint32_t)n, body, n), 0);
    Ovl__Response *r = NULL;
    assert_raw(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_HELLO);
    assert_int_equal(r->id, 1);
    ovl__response__free_unpacked(r, NULL);
    send_status(&rc, 2);
    assert_raw(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
    ovl__response__free_unpacked(r, NULL);
    raw_close(&rc);

    /* A whole 4097-byte frame in one write: the daemon refuses it from the
     * header and closes, possibly before reading (or our sending) the rest;
     * so the send may fail and the end may come as a reset. */
    open_raw(d, &rc);
    n = hello_of_size(4097, frame + 8, name);
    assert_int_equal(n, 4097);
    ovl_wire_header_encode(frame, (uint32_t)n);
    (void)raw_send(rc.fd, frame, n + 8);
    expect_error(&rc, 0, OVL_ERR_LIMIT, "max_frame_bytes (4096)");
    raw_result_t end = raw_expect_closed(&rc, TIMEOUT_MS);
    if (end != RAW_CLOSED && end != RAW_RESET)
        fail_msg("after the refusal: %s, not the end of the stream", raw_result_name(end));
    raw_close(&rc);

    oversized(d, 4097, false);
    oversized(d, 4097, true);
    TEST_PASSED();
}

/* The reader takes frames in any pieces: a Hello byte by byte, then two
 * requests in one write, answered in order. */
static void test_split_and_batched_frames(void **state)
{
    test_daemon_t *d = *state;
    raw_conn_t rc;
    open_raw(d, &rc);

    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = OVL_PROTOCOL_VERSION;
    h.client_name.data = (uint8_t *)"slow";
    h.client_name.len = 4;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.id = 1;
    q.body_case = OVL__REQUEST__BODY_HELLO;
    q.hello = &h;
    uint8_t buf[256];
    size_t n = ovl__request__pack(&q, buf + 8);
    ovl_wire_header_encode(buf, (uint32_t)n);
    for (size_t i = 0; i < n + 8; i++) {
        assert_int_equal(raw_send(rc.fd, buf + i, 1), 0);
        if (i % 4 == 0)
            fixture_sleep_ms(1);
    }
    Ovl__Response *r = NULL;
    assert_raw(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
    assert_int_equal(r->id, 1);
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_HELLO);
    ovl__response__free_unpacked(r, NULL);

    Ovl__StatusRequest sq = OVL__STATUS_REQUEST__INIT;
    Ovl__Request s = OVL__REQUEST__INIT;
    s.body_case = OVL__REQUEST__BODY_STATUS;
    s.status = &sq;
    size_t off = 0;
    for (uint64_t id = 10; id < 13; id++) {
        s.id = id;
        size_t len = ovl__request__pack(&s, buf + off + 8);
        ovl_wire_header_encode(buf + off, (uint32_t)len);
        off += 8 + len;
    }
    assert_int_equal(raw_send(rc.fd, buf, off), 0);
    for (uint64_t id = 10; id < 13; id++) {
        assert_raw(raw_read_response(&rc, TIMEOUT_MS, &r), RAW_OK);
        assert_int_equal(r->id, id);
        assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
        ovl__response__free_unpacked(r, NULL);
    }
    raw_close(&rc);
    assert_alive(d);
    TEST_PASSED();
}

/* ------------------------------------------------------ finding the socket */

static void test_connect_missing_socket(void **state)
{
    test_daemon_t *d = *state;
    char path[160];
    snprintf(path, sizeof(path), "%s/absent.sock", d->dir);
    static int sentinel;
    ovl_client_t *cl = (ovl_client_t *)&sentinel;
    assert_int_equal(ovl_connect(path, &cl), OVL_ERR_CONNECT);
    assert_ptr_equal(cl, &sentinel); /* left untouched */
    assert_contains(ovl_connect_error(), path);

    /* A socket file nobody listens on. */
    char dead[160];
    snprintf(dead, sizeof(dead), "%s/dead.sock", d->dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, dead, strlen(dead) + 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd); /* bound, never listening: connect is refused */
    assert_int_equal(ovl_connect(dead, &cl), OVL_ERR_CONNECT);
    assert_contains(ovl_connect_error(), dead);

    /* A path longer than sun_path. */
    char longp[300];
    memset(longp, 'x', sizeof(longp) - 1);
    longp[0] = '/';
    longp[sizeof(longp) - 1] = '\0';
    assert_int_equal(ovl_connect(longp, &cl), OVL_ERR_INVALID);
    assert_contains(ovl_connect_error(), "too long");
    assert_int_equal(ovl_connect(d->sock, NULL), OVL_ERR_INVALID);

    /* A good connect clears the message. */
    ovl_client_t *ok = connect_ok(d);
    assert_string_equal(ovl_connect_error(), "");
    ovl_disconnect(ok);
    TEST_PASSED();
}

static void test_connect_env_socket(void **state)
{
    test_daemon_t *d = *state;
    const char *old = getenv("OVL_SOCKET");
    char *saved = old ? strdup(old) : NULL;

    assert_int_equal(setenv("OVL_SOCKET", d->sock, 1), 0);
    ovl_client_t *cl = NULL;
    assert_int_equal(ovl_connect(NULL, &cl), OVL_OK);
    ovl_daemon_info_t info;
    assert_int_equal(ovl_daemon_info(cl, &info), OVL_OK);
    assert_int_equal(info.pid, d->pid);
    ovl_disconnect(cl);
    cl = NULL;
    assert_int_equal(ovl_connect("", &cl), OVL_OK); /* "" means the same as NULL */
    ovl_disconnect(cl);

    /* The variable is what is tried (and named when it fails). */
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/env-missing.sock", d->dir);
    assert_int_equal(setenv("OVL_SOCKET", missing, 1), 0);
    cl = NULL;
    assert_int_equal(ovl_connect(NULL, &cl), OVL_ERR_CONNECT);
    assert_null(cl);
    assert_contains(ovl_connect_error(), missing);

    /* An explicit path wins over the variable. */
    assert_int_equal(ovl_connect(d->sock, &cl), OVL_OK);
    ovl_disconnect(cl);

    if (saved) {
        setenv("OVL_SOCKET", saved, 1);
        free(saved);
    } else {
        unsetenv("OVL_SOCKET");
    }
    TEST_PASSED();
}

/* Connections past max_connections that root and ovld's own user may take
 * (server/conn.c); this test runs as ovld's own user. */
#define CONNS_RESERVED 8

/* max_connections = 2: past it and the reserve of ovld's own user, a
 * connection is refused with an Error that names the limit (then closed),
 * a slot freed is usable again, and ovl_connect reports the refusal as
 * OVL_ERR_LIMIT with the daemon's words. */
static void test_connection_limit(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *c1 = connect_ok(d);
    wait_connections(c1, 1); /* the fixture's start-up probe is gone */
    ovl_client_t *c2 = connect_ok(d);
    ovl_client_t *reserve[CONNS_RESERVED];
    for (int i = 0; i < CONNS_RESERVED; i++)
        reserve[i] = connect_ok(d);

    raw_conn_t rc;
    open_raw(d, &rc);
    expect_error(&rc, 0, OVL_ERR_LIMIT,
                 "too many connections (max_connections = 2, and the 8 beyond it kept for root "
                 "and ovld's own user are taken)");
    expect_closed(&rc);
    raw_close(&rc);

    for (int i = 0; i < CONNS_RESERVED; i++)
        ovl_disconnect(reserve[i]);
    ovl_disconnect(c2);
    wait_connections(c1, 1);
    c2 = connect_ok(d);
    assert_alive_with(d, c1);

    for (int i = 0; i < CONNS_RESERVED; i++)
        reserve[i] = connect_ok(d);
    ovl_client_t *c3 = NULL;
    ovl_status_t st = ovl_connect(d->sock, &c3);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", ovl_connect_error());
    if (st == OVL_OK)
        ovl_disconnect(c3);
    for (int i = 0; i < CONNS_RESERVED; i++)
        ovl_disconnect(reserve[i]);
    ovl_disconnect(c2);
    ovl_disconnect(c1);
    if (st != OVL_ERR_LIMIT || !strstr(msg, "too many connections"))
        fail_msg("a connection over max_connections: ovl_connect returned %s (\"%s\"), "
                 "expected OVL_ERR_LIMIT with the daemon's \"too many connections\"",
                 ovl_strerror(st), msg);
    TEST_PASSED();
}

/* A fake ovld (a child process) that answers Hello with a Status reply:
 * libovl refuses any answer whose body is not the one its request asks for. */
static void fake_reply_wrong_body(int lfd)
{
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        _exit(2);
    ovl_wire_reader_t rd;
    ovl_fdq_t fdq;
    ovl_wire_reader_init(&rd, OVL_WIRE_DEFAULT_MAX);
    ovl_fdq_init(&fdq);
    const uint8_t *body = NULL;
    uint32_t len = 0;
    ovl_status_t st;
    while ((st = ovl_wire_reader_next(&rd, &body, &len)) == OVL_ERR_AGAIN) {
        size_t n = 0;
        if (ovl_wire_recv(fd, &rd, &fdq, &n) != OVL_OK || n == 0)
            _exit(3);
    }
    Ovl__Request *q = st == OVL_OK ? ovl__request__unpack(NULL, len, body) : NULL;
    if (!q || q->body_case != OVL__REQUEST__BODY_HELLO)
        _exit(4);
    Ovl__StatusReply sr = OVL__STATUS_REPLY__INIT;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = q->id;
    r.body_case = OVL__RESPONSE__BODY_STATUS;
    r.status = &sr;
    ovl_wire_out_t out;
    ovl_wire_out_init(&out);
    if (ovl_wire_out_append(&out, &r.base, OVL_WIRE_DEFAULT_MAX, NULL, 0) != OVL_OK ||
        ovl_wire_flush(fd, &out) != OVL_OK)
        _exit(5);
    char c;
    while (read(fd, &c, 1) > 0) /* until libovl hangs up */
        ;
    _exit(0);
}

static void test_reply_of_wrong_kind(void **state)
{
    test_daemon_t *d = *state;
    char path[160];
    snprintf(path, sizeof(path), "%s/fake.sock", d->dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(lfd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 1), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        fake_reply_wrong_body(lfd);
    close(lfd);
    ovl_client_t *cl = NULL;
    ovl_status_t st = ovl_connect(path, &cl);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", ovl_connect_error());
    if (st == OVL_OK)
        ovl_disconnect(cl); /* lets the fake finish before the test fails */
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    if (st != OVL_ERR_PROTOCOL)
        fail_msg("Hello answered by a Status reply: ovl_connect returned %s (\"%s\"), "
                 "expected OVL_ERR_PROTOCOL",
                 ovl_strerror(st), msg);
    assert_contains(msg, "unexpected answer");
    assert_true(WIFEXITED(wst));
    assert_int_equal(WEXITSTATUS(wst), 0); /* the fake saw a Hello and replied */
    TEST_PASSED();
}

/* SIGTERM: exit status 0, the socket removed, connections closed. */
static void test_sigterm_stops_cleanly(void **state)
{
    test_daemon_t *d = *state;
    ovl_client_t *cl = connect_ok(d);
    ovl_comm_t *comm = NULL;
    assert_int_equal(ovl_comm_init(cl, "stopping", 2, 0, 0, &comm), OVL_OK);
    assert_int_equal(daemon_stop(d), 0);
    assert_int_equal(access(d->sock, F_OK), -1);
    assert_int_equal(errno, ENOENT);
    ovl_client_t *cl2 = NULL;
    assert_int_equal(ovl_connect(d->sock, &cl2), OVL_ERR_CONNECT);
    ovl_disconnect(cl); /* the daemon is gone; this must not hang or crash */
    TEST_PASSED();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_good_handshake),
        T(test_raw_hello_reply),
        TC(test_config_host_devices, "host_devices = 3\n"),
        T(test_version_mismatch),
        T(test_request_before_hello),
        T(test_hello_twice),
        T(test_unknown_request_after_hello),
        T(test_bad_magic),
        T(test_malformed_body),
        T(test_oversized_length),
        TC(test_frame_limit_boundary, "max_frame_bytes = 4096\n"),
        T(test_split_and_batched_frames),
        T(test_connect_missing_socket),
        T(test_connect_env_socket),
        T(test_reply_of_wrong_kind),
        TC(test_connection_limit, "max_connections = 2\n"),
        T(test_sigterm_stops_cleanly),
    };
    return RUN_TESTS("handshake", tests, argc, argv);
}

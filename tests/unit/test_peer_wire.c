/*
 * test_peer_wire.c: unit tests of daemon/net/peer_wire.c, the checks and the
 * decoder of what another ovld (or anyone who reaches peer_listen) sends:
 * handshake frame headers, active message headers, and each message's
 * body: every message encoded and decoded back, then truncated, oversized,
 * of the wrong version, of unknown types, with fields of the wrong size,
 * bad addresses, and protobuf that does not unpack. Each refusal's status
 * and the words that name the limit.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer_wire.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static char err[512];

static ovl_status_t decode(uint32_t type, const uint8_t *b, size_t len, ovld_peer_msg_t *m)
{
    err[0] = '\0';
    ovl_status_t st = ovld_peer_decode(type, b, len, m, err, sizeof(err));
    if (st != OVL_OK) {
        assert_true(err[0] != '\0');
        assert_null(m->ucx_addr);
    }
    return st;
}

static uint8_t ucx[100];

/* A message of each transport type, as the transport fills them. */
static ovld_peer_msg_t sample(uint32_t type)
{
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    memset(m.nonce, 0x11, sizeof(m.nonce));
    memset(m.instance, 0x22, sizeof(m.instance));
    snprintf(m.address, sizeof(m.address), "10.0.0.5:7411");
    memset(m.mac, 0x33, sizeof(m.mac));
    memset(ucx, 0x44, sizeof(ucx));
    m.ucx_addr = ucx;
    m.ucx_len = sizeof(ucx);
    m.seq = 0x0123456789abcdefull;
    m.status = OVL_ERR_PERMISSION;
    snprintf(m.reason, sizeof(m.reason), "wrong cluster key");
    return m;
}

static void encode(const ovld_peer_msg_t *m, uint8_t **b, size_t *len)
{
    assert_int_equal(ovld_peer_encode(m, b, len), OVL_OK);
}

static void test_roundtrip(void **state)
{
    (void)state;
    for (uint32_t t = OVLD_PEER_HELLO; t <= OVLD_PEER_BYE; t++) {
        ovld_peer_msg_t in = sample(t), out;
        uint8_t *b;
        size_t len;
        encode(&in, &b, &len);
        assert_int_equal(decode(t, b, len, &out), OVL_OK);
        assert_int_equal(out.type, t);
        switch (t) {
        case OVLD_PEER_HELLO:
        case OVLD_PEER_CHALLENGE:
            assert_memory_equal(out.nonce, in.nonce, sizeof(in.nonce));
            assert_memory_equal(out.instance, in.instance, sizeof(in.instance));
            assert_string_equal(out.address, "10.0.0.5:7411");
            assert_int_equal(out.ucx_len, sizeof(ucx));
            assert_memory_equal(out.ucx_addr, ucx, sizeof(ucx));
            if (t == OVLD_PEER_CHALLENGE)
                assert_memory_equal(out.mac, in.mac, sizeof(in.mac));
            break;
        case OVLD_PEER_AUTH:
            assert_memory_equal(out.mac, in.mac, sizeof(in.mac));
            break;
        case OVLD_PEER_PING:
        case OVLD_PEER_PONG:
            assert_int_equal(out.seq, in.seq);
            break;
        case OVLD_PEER_REFUSE:
        case OVLD_PEER_BYE:
            assert_int_equal(out.status, OVL_ERR_PERMISSION);
            assert_string_equal(out.reason, "wrong cluster key");
            break;
        }
        ovld_peer_msg_clear(&out);
        assert_null(out.ucx_addr);
        free(b);
    }
    /* other types: the encoder refuses them; the decoder hands user types
     * through untouched */
    ovld_peer_msg_t m = sample(OVLD_PEER_TYPE_USER);
    uint8_t *b;
    size_t len;
    assert_int_equal(ovld_peer_encode(&m, &b, &len), OVL_ERR_INVALID);
    static const uint8_t any[] = {0xff, 0x00, 0x13};
    ovld_peer_msg_t out;
    assert_int_equal(decode(OVLD_PEER_TYPE_USER, any, sizeof(any), &out), OVL_OK);
    assert_ptr_equal(out.body, any);
    assert_int_equal(out.len, sizeof(any));
    assert_int_equal(decode(UINT32_MAX, NULL, 0, &out), OVL_OK);
}

/* Every proper prefix of every handshake message is refused (truncated
 * protobuf, or a field cut to the wrong size); nothing reads past it. */
static void test_truncated(void **state)
{
    (void)state;
    for (uint32_t t = OVLD_PEER_HELLO; t <= OVLD_PEER_AUTH; t++) {
        ovld_peer_msg_t in = sample(t), out;
        uint8_t *b;
        size_t len;
        encode(&in, &b, &len);
        for (size_t n = 0; n < len; n++) {
            uint8_t *cut = malloc(n ? n : 1); /* exactly n bytes: ASan sees overreads */
            memcpy(cut, b, n);
            ovl_status_t st = decode(t, cut, n, &out);
            assert_true(st == OVL_ERR_PROTOCOL || st == OVL_ERR_VERSION);
            ovld_peer_msg_clear(&out);
            free(cut);
        }
        free(b);
    }
    /* an empty Ping is seq 0 (proto3 defaults): fine; an empty Bye too */
    ovld_peer_msg_t out;
    assert_int_equal(decode(OVLD_PEER_PING, NULL, 0, &out), OVL_OK);
    assert_int_equal(out.seq, 0);
    assert_int_equal(decode(OVLD_PEER_BYE, NULL, 0, &out), OVL_OK);
    assert_int_equal(out.status, OVL_ERR_PROTOCOL); /* not a status: refused as one */
}

static void test_fields(void **state)
{
    (void)state;
    ovld_peer_msg_t out;
    uint8_t *b;
    size_t len;
    /* wrong version */
    ovld_peer_msg_t m = sample(OVLD_PEER_HELLO);
    encode(&m, &b, &len);
    b[1] = 3; /* field 1 (version), varint: 2 -> 3 */
    assert_int_equal(decode(OVLD_PEER_HELLO, b, len, &out), OVL_ERR_VERSION);
    assert_non_null(strstr(err, "version 3, this ovld speaks version 2"));
    free(b);
    /* addresses: wildcard, names, not text, too long, empty */
    static const char *const bad_addrs[] = {
        "0.0.0.0:7411", "[::]:7411",      "node1:7411", "10.0.0.5",
        "10.0.0.5:0",   "10.0.0.5:65536", "\x1b[2J:1",  ""};
    for (size_t i = 0; i < NELEM(bad_addrs); i++) {
        m = sample(OVLD_PEER_CHALLENGE);
        snprintf(m.address, sizeof(m.address), "%s", bad_addrs[i]);
        encode(&m, &b, &len);
        assert_int_equal(decode(OVLD_PEER_CHALLENGE, b, len, &out), OVL_ERR_PROTOCOL);
        free(b);
    }
    /* IPv6, canonicalized */
    m = sample(OVLD_PEER_HELLO);
    snprintf(m.address, sizeof(m.address), "[fd00:0::5]:7411");
    encode(&m, &b, &len);
    assert_int_equal(decode(OVLD_PEER_HELLO, b, len, &out), OVL_OK);
    assert_string_equal(out.address, "[fd00::5]:7411");
    ovld_peer_msg_clear(&out);
    free(b);
    /* UCX address: empty refused, over the limit refused naming it */
    m = sample(OVLD_PEER_HELLO);
    m.ucx_len = 0;
    encode(&m, &b, &len);
    assert_int_equal(decode(OVLD_PEER_HELLO, b, len, &out), OVL_ERR_PROTOCOL);
    assert_non_null(strstr(err, "no UCX address"));
    free(b);
    uint8_t *big = calloc(1, OVLD_PEER_UCX_ADDR_MAX + 1);
    m.ucx_addr = big;
    m.ucx_len = OVLD_PEER_UCX_ADDR_MAX + 1;
    assert_int_equal(ovld_peer_encode(&m, &b, &len), OVL_ERR_INVALID);
    /* the encoder will not; by hand: a good Hello, then field 5 again
     * (the last one wins) of 32769 bytes */
    m = sample(OVLD_PEER_HELLO);
    encode(&m, &b, &len);
    uint8_t *raw = malloc(len + OVLD_PEER_UCX_ADDR_MAX + 16);
    memcpy(raw, b, len);
    size_t n = len;
    free(b);
    raw[n++] = 5 << 3 | 2;
    raw[n++] = 0x81, raw[n++] = 0x80, raw[n++] = 0x02; /* 32769 */
    memset(raw + n, 7, OVLD_PEER_UCX_ADDR_MAX + 1);
    n += OVLD_PEER_UCX_ADDR_MAX + 1;
    assert_int_equal(decode(OVLD_PEER_HELLO, raw, n, &out), OVL_ERR_LIMIT);
    assert_non_null(strstr(err, "over the limit of 32768 (OVLD_PEER_UCX_ADDR_MAX)"));
    free(raw);
    free(big);
    /* wrong sizes of the fixed fields: a nonce of 31 and 33 bytes, an
     * instance of 15, a MAC of 31 */
    m = sample(OVLD_PEER_AUTH);
    encode(&m, &b, &len);
    assert_int_equal(len, 34); /* tag, length 32, 32 bytes */
    b[1] = 31;
    assert_int_equal(decode(OVLD_PEER_AUTH, b, len - 1, &out), OVL_ERR_PROTOCOL);
    assert_non_null(strstr(err, "MAC of 31 bytes, not 32"));
    free(b);
    /* reasons: at the limit, over it */
    uint8_t r[3 + OVLD_PEER_REASON_MAX + 1];
    r[0] = 2 << 3 | 2;
    r[1] = 0x80 | ((OVLD_PEER_REASON_MAX + 1) & 0x7f);
    r[2] = (OVLD_PEER_REASON_MAX + 1) >> 7;
    memset(r + 3, 'a', OVLD_PEER_REASON_MAX + 1);
    assert_int_equal(decode(OVLD_PEER_REFUSE, r, sizeof(r), &out), OVL_ERR_LIMIT);
    assert_non_null(strstr(err, "over the limit of 200 (OVLD_PEER_REASON_MAX)"));
    r[1] = 0x80 | (OVLD_PEER_REASON_MAX & 0x7f);
    r[2] = OVLD_PEER_REASON_MAX >> 7;
    assert_int_equal(decode(OVLD_PEER_REFUSE, r, sizeof(r) - 1, &out), OVL_OK);
    assert_int_equal(strlen(out.reason), OVLD_PEER_REASON_MAX);
    /* a reason is cleaned, not refused: control characters become '?' */
    uint8_t rc[] = {1 << 3 | 2, 4, 'a', 0x1b, '[', 'b'}; /* Bye's reason is field 1 */
    assert_int_equal(decode(OVLD_PEER_BYE, rc, sizeof(rc), &out), OVL_OK);
    assert_string_equal(out.reason, "a?[b");
    /* a status that is not one becomes OVL_ERR_PROTOCOL */
    uint8_t st[] = {1 << 3, 5};
    assert_int_equal(decode(OVLD_PEER_REFUSE, st, sizeof(st), &out), OVL_OK);
    assert_int_equal(out.status, OVL_ERR_PROTOCOL);
    /* protobuf that does not unpack: a bad wire type, a length past the end */
    static const uint8_t junk1[] = {0x0f, 0x01};
    static const uint8_t junk2[] = {0x12, 0x7f, 0x00};
    for (uint32_t t = OVLD_PEER_HELLO; t <= OVLD_PEER_BYE; t++) {
        assert_int_equal(decode(t, junk1, sizeof(junk1), &out), OVL_ERR_PROTOCOL);
        assert_int_equal(decode(t, junk2, sizeof(junk2), &out), OVL_ERR_PROTOCOL);
    }
    /* unknown fields are skipped */
    static const uint8_t extra[] = {1 << 3, 42, 0x98, 0x06, 7}; /* field 99, varint 7 */
    assert_int_equal(decode(OVLD_PEER_PONG, extra, sizeof(extra), &out), OVL_OK);
    assert_int_equal(out.seq, 42);
}

static void test_unknown_types(void **state)
{
    (void)state;
    ovld_peer_msg_t out;
    static const uint32_t bad[] = {0, 8, 9, 15};
    for (size_t i = 0; i < NELEM(bad); i++) {
        assert_int_equal(decode(bad[i], NULL, 0, &out), OVL_ERR_PROTOCOL);
        assert_non_null(strstr(err, "unknown transport message type"));
    }
}

static void test_frame_check(void **state)
{
    (void)state;
    uint8_t h[OVLD_PEER_FRAME_HDR];
    uint32_t type, len;
    for (uint32_t t = 0; t < 40; t++) {
        ovld_peer_frame_header(h, t, 100);
        ovl_status_t st = ovld_peer_frame_check(h, &type, &len, err, sizeof(err));
        if (t >= OVLD_PEER_HELLO && t <= OVLD_PEER_REFUSE) {
            assert_int_equal(st, OVL_OK);
            assert_int_equal(type, t);
            assert_int_equal(len, 100);
        } else {
            assert_int_equal(st, OVL_ERR_PROTOCOL);
            assert_non_null(strstr(err, "where a handshake message was expected"));
        }
    }
    ovld_peer_frame_header(h, OVLD_PEER_HELLO, OVLD_PEER_MAX_FRAME);
    assert_int_equal(ovld_peer_frame_check(h, &type, &len, err, sizeof(err)), OVL_OK);
    ovld_peer_frame_header(h, OVLD_PEER_HELLO, OVLD_PEER_MAX_FRAME + 1);
    assert_int_equal(ovld_peer_frame_check(h, &type, &len, err, sizeof(err)), OVL_ERR_LIMIT);
    assert_non_null(strstr(err, "over the limit of 65536 bytes (OVLD_PEER_MAX_FRAME)"));
    ovld_peer_frame_header(h, OVLD_PEER_AUTH, UINT32_MAX);
    assert_int_equal(ovld_peer_frame_check(h, &type, &len, err, sizeof(err)), OVL_ERR_LIMIT);
    /* little-endian on the wire */
    static const uint8_t le[] = {3, 0, 0, 0, 0x22, 0, 0, 0};
    assert_int_equal(ovld_peer_frame_check(le, &type, &len, err, sizeof(err)), OVL_OK);
    assert_int_equal(type, 3);
    assert_int_equal(len, 0x22);
}

static void test_am_check(void **state)
{
    (void)state;
    uint8_t h[OVLD_PEER_AM_HDR + 1], sess[OVLD_PEER_SESSION_LEN], got[OVLD_PEER_SESSION_LEN];
    uint32_t type;
    for (size_t i = 0; i < sizeof(sess); i++)
        sess[i] = (uint8_t)(0xa0 + i);
    /* the types that travel over UCX */
    for (uint32_t t = 0; t < 20; t++) {
        ovld_peer_am_header(h, t, 10, sess);
        ovl_status_t st = ovld_peer_am_check(h, OVLD_PEER_AM_HDR, 10, &type, got, err, sizeof(err));
        assert_memory_equal(got, sess, sizeof(sess)); /* always, for charging */
        if ((t >= OVLD_PEER_PING && t <= OVLD_PEER_BYE) || t >= OVLD_PEER_TYPE_USER) {
            assert_int_equal(st, OVL_OK);
            assert_int_equal(type, t);
        } else {
            assert_int_equal(st, OVL_ERR_PROTOCOL);
            assert_non_null(strstr(err, "does not travel over UCX"));
        }
    }
    /* header sizes other than 24 */
    static const size_t sizes[] = {0, 8, 23, 25};
    for (size_t i = 0; i < NELEM(sizes); i++) {
        memset(got, 0, sizeof(got));
        ovld_peer_am_header(h, OVLD_PEER_PING, 0, sess);
        assert_int_equal(ovld_peer_am_check(h, sizes[i], 0, &type, got, err, sizeof(err)),
                         OVL_ERR_PROTOCOL);
        assert_non_null(strstr(err, "not 24"));
    }
    /* the length: the payload's, and at most OVLD_PEER_MAX_BODY */
    ovld_peer_am_header(h, OVLD_PEER_TYPE_USER, 10, sess);
    assert_int_equal(ovld_peer_am_check(h, OVLD_PEER_AM_HDR, 11, &type, got, err, sizeof(err)),
                     OVL_ERR_PROTOCOL);
    assert_non_null(strstr(err, "says 10 bytes, 11 came"));
    ovld_peer_am_header(h, OVLD_PEER_TYPE_USER, OVLD_PEER_MAX_BODY, sess);
    assert_int_equal(
        ovld_peer_am_check(h, OVLD_PEER_AM_HDR, OVLD_PEER_MAX_BODY, &type, got, err, sizeof(err)),
        OVL_OK);
    ovld_peer_am_header(h, OVLD_PEER_TYPE_USER, OVLD_PEER_MAX_BODY + 1, sess);
    assert_int_equal(ovld_peer_am_check(h, OVLD_PEER_AM_HDR, OVLD_PEER_MAX_BODY + 1, &type, got,
                                        err, sizeof(err)),
                     OVL_ERR_LIMIT);
    assert_non_null(strstr(err, "over the limit of 262144 bytes (OVLD_PEER_MAX_BODY)"));
    /* the limit wins over a header that lies */
    ovld_peer_am_header(h, OVLD_PEER_TYPE_USER, 5, sess);
    assert_int_equal(ovld_peer_am_check(h, OVLD_PEER_AM_HDR, OVLD_PEER_MAX_BODY + 1, &type, got,
                                        err, sizeof(err)),
                     OVL_ERR_LIMIT);
    /* errlen 0 writes nothing, the verdict stays */
    char none[4] = "abc";
    assert_int_equal(ovld_peer_am_check(h, 7, 0, &type, got, none, 0), OVL_ERR_PROTOCOL);
    assert_string_equal(none, "abc");
}

static void test_addr(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    char name[OVLD_ADDR_TEXT_MAX];
    assert_int_equal(ovld_peer_addr_parse("127.0.0.1:7411", &ss, name, err, sizeof(err)), OVL_OK);
    assert_string_equal(name, "127.0.0.1:7411");
    assert_int_equal(ovld_peer_addr_parse("[FD00:0:0::1]:1", &ss, name, err, sizeof(err)), OVL_OK);
    assert_string_equal(name, "[fd00::1]:1");
    assert_int_equal(ovld_peer_addr_parse("0.0.0.0:7411", &ss, name, err, sizeof(err)),
                     OVL_ERR_INVALID);
    assert_non_null(strstr(err, "wildcard"));
    assert_int_equal(ovld_peer_addr_parse("localhost:7411", &ss, name, err, sizeof(err)),
                     OVL_ERR_INVALID);
    assert_non_null(strstr(err, "names are not looked up"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),   cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_fields),      cmocka_unit_test(test_unknown_types),
        cmocka_unit_test(test_frame_check), cmocka_unit_test(test_am_check),
        cmocka_unit_test(test_addr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

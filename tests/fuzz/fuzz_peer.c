/*
 * fuzz_peer.c: libFuzzer target for what another ovld, or anyone who
 * reaches peer_listen or a UCX port of ovld, sends: the handshake's frames
 * on TCP and the active messages over UCX (daemon/net/peer_wire.h), decoded
 * as daemon/net/peer.c decodes them.
 *
 * Input: byte 0 chooses what the rest is.
 * - even: a TCP byte stream, read as peer.c's on_read does: frame after
 *   frame, each header checked (ovld_peer_frame_check) before its body is
 *   taken, each body decoded (ovld_peer_decode); the first refusal ends
 *   the stream, as it ends the connection;
 * - odd: one active message: byte 1 is the header's length (mod 33),
 *   then the header, then the payload (ovld_peer_am_check, then
 *   ovld_peer_decode).
 *
 * Properties (any failure aborts):
 * - a frame header passes only with a handshake type (1 to 4) and a
 *   length of at most OVLD_PEER_MAX_FRAME; an AM header only when it is 24
 *   bytes, says the payload's length, is at most OVLD_PEER_MAX_BODY and
 *   of a type that travels over UCX (5 to 7, or 16 on); an AM header of 24
 *   bytes gives its session id even when refused;
 * - a decoded message's fields are what the transport relies on: nonce,
 *   instance and MAC of their sizes (by construction), an address that is
 *   canonical (parsing it again gives itself) and not the wildcard, a UCX
 *   address of 1..OVLD_PEER_UCX_ADDR_MAX bytes, a reason of clean text of
 *   at most OVLD_PEER_REASON_MAX bytes, a status that is an error status;
 *   a message of a user type keeps its body as given;
 * - a decoded transport message encodes again and decodes to the same
 *   fields;
 * - a refusal has a non-empty message and holds no memory; the verdict is
 *   the same with a shorter message buffer, and errlen 0 writes nothing;
 * - no read outside the input, no leak, no undefined behaviour (ASan,
 *   UBSan).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer_wire.h"
#include "text.h"

#define FUZZ_NAME "fuzz_peer"
#include "fuzz_main.h"

static void check_fields(const ovld_peer_msg_t *m, uint32_t type, const uint8_t *body, size_t len)
{
    CHECK(m->type == type);
    CHECK(m->body == body && m->len == len);
    if (type >= OVLD_PEER_TYPE_USER) {
        CHECK(m->ucx_addr == NULL);
        return;
    }
    CHECK(type >= OVLD_PEER_HELLO && type <= OVLD_PEER_BYE);
    if (type == OVLD_PEER_HELLO || type == OVLD_PEER_CHALLENGE) {
        size_t n = strnlen(m->address, sizeof(m->address));
        CHECK(n > 0 && n < sizeof(m->address));
        struct sockaddr_storage ss;
        char again[OVLD_ADDR_TEXT_MAX];
        CHECK(ovld_peer_addr_parse(m->address, &ss, again, NULL, 0) == OVL_OK);
        CHECK(strcmp(again, m->address) == 0);
        CHECK(!ovld_config_addr_is_any(&ss));
        CHECK(m->ucx_addr != NULL && m->ucx_len >= 1 && m->ucx_len <= OVLD_PEER_UCX_ADDR_MAX);
    } else {
        CHECK(m->ucx_addr == NULL && m->ucx_len == 0);
    }
    if (type == OVLD_PEER_REFUSE || type == OVLD_PEER_BYE) {
        size_t n = strnlen(m->reason, sizeof(m->reason));
        CHECK(n < sizeof(m->reason) && n <= OVLD_PEER_REASON_MAX);
        CHECK(ovl_text_is_clean((const uint8_t *)m->reason, n));
        CHECK(m->status < 0 && m->status >= OVL_ERR_INTERNAL);
    }
}

/* Encoding a decoded message and decoding it again gives the same. */
static void check_roundtrip(const ovld_peer_msg_t *m)
{
    if (m->type >= OVLD_PEER_TYPE_USER)
        return;
    uint8_t *b;
    size_t len;
    CHECK(ovld_peer_encode(m, &b, &len) == OVL_OK);
    ovld_peer_msg_t m2;
    char err[256];
    CHECK(ovld_peer_decode(m->type, b, len, &m2, err, sizeof(err)) == OVL_OK);
    switch (m->type) {
    case OVLD_PEER_HELLO:
    case OVLD_PEER_CHALLENGE:
        CHECK(memcmp(m->nonce, m2.nonce, sizeof(m->nonce)) == 0);
        CHECK(memcmp(m->instance, m2.instance, sizeof(m->instance)) == 0);
        CHECK(strcmp(m->address, m2.address) == 0);
        CHECK(m->ucx_len == m2.ucx_len && memcmp(m->ucx_addr, m2.ucx_addr, m->ucx_len) == 0);
        if (m->type == OVLD_PEER_CHALLENGE)
            CHECK(memcmp(m->mac, m2.mac, sizeof(m->mac)) == 0);
        break;
    case OVLD_PEER_AUTH:
        CHECK(memcmp(m->mac, m2.mac, sizeof(m->mac)) == 0);
        break;
    case OVLD_PEER_PING:
    case OVLD_PEER_PONG:
        CHECK(m->seq == m2.seq);
        break;
    case OVLD_PEER_REFUSE:
    case OVLD_PEER_BYE:
        CHECK(m->status == m2.status);
        CHECK(strcmp(m->reason, m2.reason) == 0);
        break;
    }
    ovld_peer_msg_clear(&m2);
    free(b);
}

/* Decodes one body with the checks above; false if refused. */
static bool decode_one(uint32_t type, const uint8_t *body, size_t len)
{
    ovld_peer_msg_t m;
    char err[512];
    err[0] = '\0';
    ovl_status_t st = ovld_peer_decode(type, body, len, &m, err, sizeof(err));
    if (st != OVL_OK) {
        CHECK(st == OVL_ERR_PROTOCOL || st == OVL_ERR_LIMIT || st == OVL_ERR_VERSION ||
              st == OVL_ERR_NOMEM);
        CHECK(err[0] != '\0' && strnlen(err, sizeof(err)) < sizeof(err));
        CHECK(m.ucx_addr == NULL);
        /* a shorter buffer: the same verdict, the message cut */
        char small[16];
        CHECK(ovld_peer_decode(type, body, len, &m, small, sizeof(small)) == st);
        CHECK(strncmp(small, err, sizeof(small) - 1) == 0);
        char none[2] = "x";
        CHECK(ovld_peer_decode(type, body, len, &m, none, 0) == st);
        CHECK(none[0] == 'x');
        return false;
    }
    check_fields(&m, type, body, len);
    check_roundtrip(&m);
    ovld_peer_msg_clear(&m);
    return true;
}

static void tcp_stream(const uint8_t *p, size_t n)
{
    char err[256];
    while (n >= OVLD_PEER_FRAME_HDR) {
        uint32_t type = 0, len = 0;
        ovl_status_t st = ovld_peer_frame_check(p, &type, &len, err, sizeof(err));
        uint32_t t =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        uint32_t l =
            (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        bool ok = t >= 1 && t <= 4 && l <= OVLD_PEER_MAX_FRAME;
        CHECK((st == OVL_OK) == ok);
        if (!ok) {
            CHECK(st == (t >= 1 && t <= 4 ? OVL_ERR_LIMIT : OVL_ERR_PROTOCOL));
            return;
        }
        CHECK(type == t && len == l);
        if (n - OVLD_PEER_FRAME_HDR < len)
            return; /* waits for the rest */
        if (!decode_one(type, p + OVLD_PEER_FRAME_HDR, len))
            return;
        p += OVLD_PEER_FRAME_HDR + len;
        n -= OVLD_PEER_FRAME_HDR + len;
    }
}

static void am(const uint8_t *p, size_t n)
{
    if (n < 1)
        return;
    size_t hlen = p[0] % 33;
    p++, n--;
    if (hlen > n)
        hlen = n;
    const uint8_t *hdr = p, *body = p + hlen;
    size_t len = n - hlen;
    uint32_t type = 0;
    uint8_t sess[OVLD_PEER_SESSION_LEN], before[OVLD_PEER_SESSION_LEN];
    memset(sess, 0xa5, sizeof(sess));
    memcpy(before, sess, sizeof(sess));
    char err[256];
    ovl_status_t st = ovld_peer_am_check(hdr, hlen, len, &type, sess, err, sizeof(err));
    if (hlen != OVLD_PEER_AM_HDR) {
        CHECK(st == OVL_ERR_PROTOCOL);
        CHECK(memcmp(sess, before, sizeof(sess)) == 0);
        return;
    }
    CHECK(memcmp(sess, hdr + 8, sizeof(sess)) == 0);
    uint32_t t =
        (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    uint32_t l =
        (uint32_t)hdr[4] | (uint32_t)hdr[5] << 8 | (uint32_t)hdr[6] << 16 | (uint32_t)hdr[7] << 24;
    bool travels = (t >= 5 && t <= 7) || t >= 16;
    ovl_status_t want = len > OVLD_PEER_MAX_BODY ? OVL_ERR_LIMIT
                        : l != len || !travels   ? OVL_ERR_PROTOCOL
                                                 : OVL_OK;
    CHECK(st == want);
    if (st != OVL_OK)
        return;
    CHECK(type == t);
    decode_one(type, body, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        am(data + 1, size - 1);
    else
        tcp_stream(data + 1, size - 1);
    return 0;
}

#ifdef OVL_FUZZ_STANDALONE

/* A valid handshake stream and some AMs, built with the encoder, then
 * mutated byte by byte; and noise. */
static size_t frame(uint8_t *out, const ovld_peer_msg_t *m)
{
    uint8_t *b;
    size_t len;
    CHECK(ovld_peer_encode(m, &b, &len) == OVL_OK);
    ovld_peer_frame_header(out, m->type, (uint32_t)len);
    if (len)
        memcpy(out + OVLD_PEER_FRAME_HDR, b, len);
    free(b);
    return OVLD_PEER_FRAME_HDR + len;
}

static void fuzz_builtin(void)
{
    static uint8_t ucx[300];
    for (size_t i = 0; i < sizeof(ucx); i++)
        ucx[i] = (uint8_t)i;
    ovld_peer_msg_t m;
    memset(&m, 0, sizeof(m));
    memset(m.nonce, 1, sizeof(m.nonce));
    memset(m.instance, 2, sizeof(m.instance));
    memset(m.mac, 3, sizeof(m.mac));
    snprintf(m.address, sizeof(m.address), "10.0.0.5:7411");
    m.ucx_addr = ucx;
    m.ucx_len = sizeof(ucx);
    m.status = OVL_ERR_PERMISSION;
    snprintf(m.reason, sizeof(m.reason), "wrong cluster key");
    static uint8_t in[4096];
    size_t n = 1;
    in[0] = 0;
    for (uint32_t t = OVLD_PEER_HELLO; t <= OVLD_PEER_REFUSE; t++) {
        m.type = t;
        n += frame(in + n, &m);
    }
    fuzz_run(in, n);
    static uint8_t mut[sizeof(in)];
    for (size_t i = 1; i < n; i++) {
        for (int b = 0; b < 8; b++) {
            memcpy(mut, in, n);
            mut[i] ^= (uint8_t)(1u << b);
            fuzz_run(mut, n);
        }
        fuzz_run(in, i); /* every prefix */
    }
    /* AMs: every type of the transport, a user type, header sizes */
    uint8_t sess[OVLD_PEER_SESSION_LEN];
    memset(sess, 9, sizeof(sess));
    for (uint32_t t = 0; t < 20; t++) {
        uint8_t *b = NULL;
        size_t len = 0;
        m.type = t;
        m.seq = t * 1000003ull;
        if (t >= OVLD_PEER_HELLO && t <= OVLD_PEER_BYE)
            CHECK(ovld_peer_encode(&m, &b, &len) == OVL_OK);
        uint8_t am_in[2 + OVLD_PEER_AM_HDR + 1024];
        am_in[0] = 1;
        am_in[1] = OVLD_PEER_AM_HDR;
        ovld_peer_am_header(am_in + 2, t, (uint32_t)len, sess);
        if (len)
            memcpy(am_in + 2 + OVLD_PEER_AM_HDR, b, len);
        free(b);
        size_t total = 2 + OVLD_PEER_AM_HDR + len;
        fuzz_run(am_in, total);
        for (size_t i = 2; i < total; i += 3) {
            am_in[i] ^= 0x41;
            fuzz_run(am_in, total);
            am_in[i] ^= 0x41;
        }
        for (unsigned h = 0; h < 33; h += 7) {
            am_in[1] = (uint8_t)h;
            fuzz_run(am_in, total);
        }
    }
    /* noise, some of it shaped like frames */
    for (int k = 0; k < 20000; k++) {
        size_t len = 1 + fuzz_prng() % 200;
        for (size_t i = 0; i < len; i++)
            in[i] = (uint8_t)fuzz_prng();
        if (len > 9 && (k & 1)) {
            in[0] = 0;
            in[1] = (uint8_t)(1 + fuzz_prng() % 4);
            in[2] = in[3] = in[4] = 0;
            in[5] = (uint8_t)(len - 9);
            in[6] = in[7] = in[8] = 0;
        }
        fuzz_run(in, len);
    }
}

#endif /* OVL_FUZZ_STANDALONE */

/*
 * fuzz_xfer.c: libFuzzer target for the messages another ovld sends about
 * the host backend's rows between nodes (daemon/net/xfer_wire.h,
 * proto/xfer.proto), decoded as daemon/net/xfer.c decodes them.
 *
 * Input: byte 0 chooses the message type (32 + byte % 16: the three of
 * the module and the rest of its range), the rest is the body.
 *
 * Properties (any failure aborts):
 * - only types 32 to 34 decode;
 * - a decoded message's fields are what xfer.c relies on: the type as
 *   given; a RowsReady of 1 to OVLD_XFER_MAX_BYTES bytes whose range does
 *   not wrap, with a key of 1 to OVLD_XFER_RKEY_MAX bytes; no key on the
 *   others; a status that is a status (an error for a RowsWithdrawn); a
 *   reason of clean text of at most OVLD_XFER_REASON_MAX bytes;
 * - a decoded message encodes again and decodes to the same fields;
 * - a refusal is PROTOCOL, LIMIT or NOMEM, has a non-empty message and
 *   holds no memory; the verdict is the same with a shorter message
 *   buffer, and errlen 0 writes nothing;
 * - no read outside the input, no leak, no undefined behaviour (ASan,
 *   UBSan).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"
#include "xfer.h"
#include "xfer_wire.h"

#define FUZZ_NAME "fuzz_xfer"
#include "fuzz_main.h"

static void check_fields(const ovld_xfer_msg_t *m, uint32_t type)
{
    CHECK(m->type == type);
    CHECK(type >= OVLD_XFER_ROWS_READY && type <= OVLD_XFER_ROWS_WITHDRAWN);
    if (type == OVLD_XFER_ROWS_READY) {
        CHECK(m->bytes >= 1 && m->bytes <= OVLD_XFER_MAX_BYTES);
        CHECK(m->addr <= UINT64_MAX - m->bytes);
        CHECK(m->rkey != NULL && m->rkey_len >= 1 && m->rkey_len <= OVLD_XFER_RKEY_MAX);
        return;
    }
    CHECK(m->rkey == NULL && m->rkey_len == 0);
    CHECK(m->status <= 0 && m->status >= OVL_ERR_INTERNAL);
    if (type == OVLD_XFER_ROWS_WITHDRAWN)
        CHECK(m->status != OVL_OK);
    size_t n = strnlen(m->reason, sizeof(m->reason));
    CHECK(n < sizeof(m->reason) && n <= OVLD_XFER_REASON_MAX);
    CHECK(ovl_text_is_clean((const uint8_t *)m->reason, n));
}

/* Encoding a decoded message and decoding it again gives the same. */
static void check_roundtrip(const ovld_xfer_msg_t *m)
{
    uint8_t *b;
    size_t len;
    CHECK(ovld_xfer_encode(m, &b, &len) == OVL_OK);
    ovld_xfer_msg_t m2;
    char err[256];
    CHECK(ovld_xfer_decode(m->type, b, len, &m2, err, sizeof(err)) == OVL_OK);
    CHECK(memcmp(m->job, m2.job, sizeof(m->job)) == 0);
    CHECK(m->seq == m2.seq && m->index == m2.index && m->from == m2.from && m->to == m2.to);
    CHECK(m->addr == m2.addr && m->bytes == m2.bytes && m->rkey_len == m2.rkey_len);
    CHECK(m->rkey_len == 0 || memcmp(m->rkey, m2.rkey, m->rkey_len) == 0);
    CHECK(m->status == m2.status && strcmp(m->reason, m2.reason) == 0);
    ovld_xfer_msg_clear(&m2);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t type = OVLD_XFER_TYPE_FIRST + data[0] % 16;
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    ovld_xfer_msg_t m;
    char err[512];
    err[0] = '\0';
    ovl_status_t st = ovld_xfer_decode(type, body, len, &m, err, sizeof(err));
    if (st != OVL_OK) {
        CHECK(st == OVL_ERR_PROTOCOL || st == OVL_ERR_LIMIT || st == OVL_ERR_NOMEM);
        CHECK(err[0] != '\0' && strnlen(err, sizeof(err)) < sizeof(err));
        CHECK(m.rkey == NULL);
        /* a shorter buffer: the same verdict, the message cut */
        char small[16];
        CHECK(ovld_xfer_decode(type, body, len, &m, small, sizeof(small)) == st);
        CHECK(strncmp(small, err, sizeof(small) - 1) == 0);
        char none[2] = "x";
        CHECK(ovld_xfer_decode(type, body, len, &m, none, 0) == st);
        CHECK(none[0] == 'x');
        return 0;
    }
    CHECK(type <= OVLD_XFER_ROWS_WITHDRAWN);
    check_fields(&m, type);
    check_roundtrip(&m);
    ovld_xfer_msg_clear(&m);
    return 0;
}

#ifdef OVL_FUZZ_STANDALONE

/* The three messages built with the encoder, then mutated bit by bit and
 * cut at every length, each read as every type; and noise. */
static void fuzz_builtin(void)
{
    static uint8_t key[40];
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)(i * 7);
    ovld_xfer_msg_t m;
    memset(&m, 0, sizeof(m));
    memcpy(m.job, "0123456789abcdef", sizeof(m.job));
    m.seq = 1234567;
    m.index = 3;
    m.from = 1;
    m.to = 6;
    m.addr = 0x7f0000001000;
    m.bytes = 81920;
    m.rkey = key;
    m.rkey_len = sizeof(key);
    m.status = OVL_ERR_MISMATCH;
    snprintf(m.reason, sizeof(m.reason), "rank 1 sends 81920 bytes, rank 6 receives 40960");
    static uint8_t in[1024], mut[1024];
    for (uint32_t t = OVLD_XFER_ROWS_READY; t <= OVLD_XFER_ROWS_WITHDRAWN; t++) {
        uint8_t *b;
        size_t len;
        m.type = t;
        CHECK(ovld_xfer_encode(&m, &b, &len) == OVL_OK);
        CHECK(len + 1 <= sizeof(in));
        memcpy(in + 1, b, len);
        free(b);
        size_t n = len + 1;
        for (uint8_t as = 0; as < 16; as++) {
            in[0] = as;
            fuzz_run(in, n);
        }
        in[0] = (uint8_t)(t - OVLD_XFER_TYPE_FIRST);
        for (size_t i = 1; i < n; i++) {
            for (int bit = 0; bit < 8; bit++) {
                memcpy(mut, in, n);
                mut[i] ^= (uint8_t)(1u << bit);
                fuzz_run(mut, n);
            }
            fuzz_run(in, i); /* every prefix */
        }
    }
    for (int k = 0; k < 20000; k++) {
        size_t len = 1 + fuzz_prng() % 200;
        for (size_t i = 0; i < len; i++)
            in[i] = (uint8_t)fuzz_prng();
        fuzz_run(in, len);
    }
}

#endif

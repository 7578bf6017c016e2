/*
 * test_sha256.c: unit tests of common/sha256.c against published vectors:
 * SHA-256 from FIPS 180-4's examples (NIST's "SHA256.pdf" example values
 * and the long messages of the NIST CSRC example set), HMAC-SHA256 from
 * RFC 4231 section 4 (all seven test cases; case 5 truncated to 128 bits
 * as the RFC gives it). Incremental hashing is checked against one-shot
 * hashing for every way of cutting a message in two and in many pieces.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void unhex(const char *hex, uint8_t *out, size_t n)
{
    assert_int_equal(strlen(hex), 2 * n);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

static void expect_digest(const uint8_t *got, const char *hex, size_t n)
{
    uint8_t want[OVL_SHA256_LEN];
    unhex(hex, want, n);
    assert_memory_equal(got, want, n);
}

/* FIPS 180-4 / NIST example messages. */
static const struct {
    const char *msg;
    const char *digest;
} sha_vectors[] = {
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnop"
     "q"
     "rsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
};

static void test_sha256_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < NELEM(sha_vectors); i++) {
        uint8_t d[OVL_SHA256_LEN];
        ovl_sha256(sha_vectors[i].msg, strlen(sha_vectors[i].msg), d);
        expect_digest(d, sha_vectors[i].digest, OVL_SHA256_LEN);
    }
}

/* One million 'a' (FIPS 180-2 appendix B.3), fed in pieces of 997 bytes
 * so that the block buffer's edges are crossed at every offset. */
static void test_sha256_million(void **state)
{
    (void)state;
    static uint8_t piece[997];
    memset(piece, 'a', sizeof(piece));
    ovl_sha256_t c;
    ovl_sha256_init(&c);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof(piece) ? left : sizeof(piece);
        ovl_sha256_update(&c, piece, n);
        left -= n;
    }
    uint8_t d[OVL_SHA256_LEN];
    ovl_sha256_final(&c, d);
    expect_digest(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
                  OVL_SHA256_LEN);
}

/* Every length from 0 to 200 (the padding's cases: 55, 56, 63, 64 ...),
 * every cut in two and byte by byte, against one-shot hashing. */
static void test_sha256_pieces(void **state)
{
    (void)state;
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i * 131 + 7);
    for (size_t len = 0; len <= sizeof(msg); len++) {
        uint8_t whole[OVL_SHA256_LEN];
        ovl_sha256(msg, len, whole);
        for (size_t cut = 0; cut <= len; cut++) {
            ovl_sha256_t c;
            uint8_t d[OVL_SHA256_LEN];
            ovl_sha256_init(&c);
            ovl_sha256_update(&c, msg, cut);
            ovl_sha256_update(&c, msg + cut, len - cut);
            ovl_sha256_final(&c, d);
            assert_memory_equal(d, whole, OVL_SHA256_LEN);
        }
        ovl_sha256_t c;
        uint8_t d[OVL_SHA256_LEN];
        ovl_sha256_init(&c);
        for (size_t i = 0; i < len; i++)
            ovl_sha256_update(&c, msg + i, 1);
        ovl_sha256_final(&c, d);
        assert_memory_equal(d, whole, OVL_SHA256_LEN);
    }
}

/* RFC 4231 section 4. */
static void test_hmac_rfc4231(void **state)
{
    (void)state;
    uint8_t k1[20], k3[20], d3[50], k4[25], d4[50], k5[20], k6[131];
    memset(k1, 0x0b, sizeof(k1));
    memset(k3, 0xaa, sizeof(k3));
    memset(d3, 0xdd, sizeof(d3));
    for (size_t i = 0; i < sizeof(k4); i++)
        k4[i] = (uint8_t)(i + 1);
    memset(d4, 0xcd, sizeof(d4));
    memset(k5, 0x0c, sizeof(k5));
    memset(k6, 0xaa, sizeof(k6));
    static const char d6[] = "Test Using Larger Than Block-Size Key - Hash Key First";
    static const char d7[] =
        "This is a test using a larger than block-size key and a larger than block-size "
        "data. The key needs to be hashed before being used by the HMAC algorithm.";
    const struct {
        const void *key;
        size_t keylen;
        const void *data;
        size_t len;
        const char *mac;
        size_t maclen;
    } cases[] = {
        {k1, sizeof(k1), "Hi There", 8,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32},
        {"Jefe", 4, "what do ya want for nothing?", 28,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32},
        {k3, sizeof(k3), d3, sizeof(d3),
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32},
        {k4, sizeof(k4), d4, sizeof(d4),
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32},
        {k5, sizeof(k5), "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b", 16},
        {k6, sizeof(k6), d6, sizeof(d6) - 1,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32},
        {k6, sizeof(k6), d7, sizeof(d7) - 1,
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 32},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        uint8_t mac[OVL_SHA256_LEN];
        ovl_hmac_sha256(cases[i].key, cases[i].keylen, cases[i].data, cases[i].len, mac);
        expect_digest(mac, cases[i].mac, cases[i].maclen);
        /* the same in pieces */
        ovl_hmac_sha256_t c;
        ovl_hmac_sha256_init(&c, cases[i].key, cases[i].keylen);
        size_t half = cases[i].len / 2;
        ovl_hmac_sha256_update(&c, cases[i].data, half);
        ovl_hmac_sha256_update(&c, (const uint8_t *)cases[i].data + half, cases[i].len - half);
        uint8_t mac2[OVL_SHA256_LEN];
        ovl_hmac_sha256_final(&c, mac2);
        assert_memory_equal(mac, mac2, OVL_SHA256_LEN);
    }
}

static void test_ct_equal(void **state)
{
    (void)state;
    uint8_t a[32], b[32];
    for (size_t i = 0; i < sizeof(a); i++)
        a[i] = b[i] = (uint8_t)i;
    assert_true(ovl_ct_equal(a, b, sizeof(a)));
    assert_true(ovl_ct_equal(a, b, 0));
    for (size_t i = 0; i < sizeof(a); i++) {
        for (unsigned bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            assert_false(ovl_ct_equal(a, b, sizeof(a)));
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    uint8_t w[16];
    memset(w, 0xff, sizeof(w));
    ovl_wipe(w, sizeof(w));
    for (size_t i = 0; i < sizeof(w); i++)
        assert_int_equal(w[i], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors), cmocka_unit_test(test_sha256_million),
        cmocka_unit_test(test_sha256_pieces),  cmocka_unit_test(test_hmac_rfc4231),
        cmocka_unit_test(test_ct_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

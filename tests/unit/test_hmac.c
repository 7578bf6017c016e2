/*
 * test_hmac.c: the MAC the daemons prove themselves with (daemon/net/peer_auth.c:
 * libsodium's crypto_auth_hmacsha256, keys of any length) against RFC 4231
 * section 4 (all seven test cases; case 5 truncated to 128 bits as the RFC
 * gives it), in one piece and cut in two everywhere, as peer_auth.c feeds it
 * field by field; and the comparison and wiping the peer links use on secrets (net/peer_link.c,
 * net/peer_handshake.c). The
 * vectors are those the hand-written HMAC this replaced passed, so daemons
 * before and after compute the same proofs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define MAC_LEN  crypto_auth_hmacsha256_BYTES

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
    uint8_t want[MAC_LEN];
    unhex(hex, want, n);
    assert_memory_equal(got, want, n);
}

/* HMAC-SHA-256 of data under key, fed in two pieces cut at `cut` (0: one). */
static void hmac(const void *key, size_t keylen, const void *data, size_t len, size_t cut,
                 uint8_t out[MAC_LEN])
{
    crypto_auth_hmacsha256_state c;
    assert_int_equal(crypto_auth_hmacsha256_init(&c, key, keylen), 0);
    assert_int_equal(crypto_auth_hmacsha256_update(&c, data, cut), 0);
    assert_int_equal(crypto_auth_hmacsha256_update(&c, (const uint8_t *)data + cut, len - cut), 0);
    assert_int_equal(crypto_auth_hmacsha256_final(&c, out), 0);
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
        /* in one piece, and in two: peer_auth.c feeds the MAC field by field */
        uint8_t mac[MAC_LEN], mac2[MAC_LEN];
        hmac(cases[i].key, cases[i].keylen, cases[i].data, cases[i].len, 0, mac);
        expect_digest(mac, cases[i].mac, cases[i].maclen);
        for (size_t cut = 1; cut < cases[i].len; cut += 7) {
            hmac(cases[i].key, cases[i].keylen, cases[i].data, cases[i].len, cut, mac2);
            assert_memory_equal(mac, mac2, MAC_LEN);
        }
    }
}

/* sodium_memcmp as the peer links use it for MACs and session ids: 0 exactly
 * when equal, whichever bit differs; sodium_memzero wipes. */
static void test_ct_equal(void **state)
{
    (void)state;
    uint8_t a[32], b[32];
    for (size_t i = 0; i < sizeof(a); i++)
        a[i] = b[i] = (uint8_t)i;
    assert_int_equal(sodium_memcmp(a, b, sizeof(a)), 0);
    assert_int_equal(sodium_memcmp(a, b, 0), 0);
    for (size_t i = 0; i < sizeof(a); i++) {
        for (unsigned bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            assert_int_not_equal(sodium_memcmp(a, b, sizeof(a)), 0);
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    uint8_t w[16];
    memset(w, 0xff, sizeof(w));
    sodium_memzero(w, sizeof(w));
    for (size_t i = 0; i < sizeof(w); i++)
        assert_int_equal(w[i], 0);
}

int main(void)
{
    if (sodium_init() < 0) {
        fprintf(stderr, "test_hmac: sodium_init failed\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hmac_rfc4231),
        cmocka_unit_test(test_ct_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

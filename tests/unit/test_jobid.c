/*
 * test_jobid.c: the job id blob of jobs across nodes (daemon/util/jobid.c):
 * encode and decode round trips for IPv4 and IPv6, the exact layout, and
 * every malformed blob refused with its reason (the blob comes from the
 * application, so it is checked like any other input).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "jobid.h"

static ovld_job_blob_t v4_blob(void)
{
    ovld_job_blob_t b;
    memset(&b, 0, sizeof(b));
    struct sockaddr_in *a = (struct sockaddr_in *)&b.coordinator;
    a->sin_family = AF_INET;
    a->sin_port = htons(7411);
    assert_int_equal(inet_pton(AF_INET, "10.1.2.3", &a->sin_addr), 1);
    for (int i = 0; i < OVLD_JOB_NONCE_LEN; i++)
        b.nonce[i] = (uint8_t)(0xa0 + i);
    for (int i = 0; i < OVLD_INSTANCE_LEN; i++)
        b.instance[i] = (uint8_t)(0x10 + i);
    return b;
}

static void expect_refused(const uint8_t *blob, size_t len, const char *want)
{
    ovld_job_blob_t out;
    char err[128] = "";
    assert_int_equal(ovld_job_blob_decode(blob, len, &out, err, sizeof(err)), OVL_ERR_INVALID);
    if (!strstr(err, want))
        fail_msg("message \"%s\" does not hold \"%s\"", err, want);
}

static void test_v4_round_trip_and_layout(void **state)
{
    (void)state;
    ovld_job_blob_t b = v4_blob(), d;
    uint8_t raw[OVLD_JOB_BLOB_LEN];
    char err[128];

    assert_int_equal(ovld_job_blob_encode(&b, raw), OVL_OK);
    assert_memory_equal(raw, "OVLJ", 4);
    assert_int_equal(raw[4], 1);
    assert_int_equal(raw[5], 4);
    assert_int_equal(raw[6] << 8 | raw[7], 7411);
    static const uint8_t addr[4] = {10, 1, 2, 3};
    assert_memory_equal(raw + 8, addr, 4);
    assert_memory_equal(raw + 24, b.nonce, OVLD_JOB_NONCE_LEN);
    assert_memory_equal(raw + 40, b.instance, OVLD_INSTANCE_LEN);
    for (int i = 56; i < OVLD_JOB_BLOB_LEN; i++)
        assert_int_equal(raw[i], 0);

    assert_int_equal(ovld_job_blob_decode(raw, sizeof(raw), &d, err, sizeof(err)), OVL_OK);
    assert_int_equal(d.coordinator.ss_family, AF_INET);
    const struct sockaddr_in *a = (const struct sockaddr_in *)&d.coordinator;
    const struct sockaddr_in *e = (const struct sockaddr_in *)&b.coordinator;
    assert_int_equal(a->sin_port, e->sin_port);
    assert_int_equal(a->sin_addr.s_addr, e->sin_addr.s_addr);
    assert_memory_equal(d.nonce, b.nonce, OVLD_JOB_NONCE_LEN);
    assert_memory_equal(d.instance, b.instance, OVLD_INSTANCE_LEN);

    char name[19];
    ovld_job_blob_name(&d, name);
    assert_string_equal(name, "x-a0a1a2a3a4a5a6a7");
}

static void test_v6_round_trip(void **state)
{
    (void)state;
    ovld_job_blob_t b = v4_blob(), d;
    memset(&b.coordinator, 0, sizeof(b.coordinator));
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&b.coordinator;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(65535);
    assert_int_equal(inet_pton(AF_INET6, "fd00::5", &a->sin6_addr), 1);
    uint8_t raw[OVLD_JOB_BLOB_LEN];
    char err[128];

    assert_int_equal(ovld_job_blob_encode(&b, raw), OVL_OK);
    assert_int_equal(raw[5], 6);
    assert_int_equal(ovld_job_blob_decode(raw, sizeof(raw), &d, err, sizeof(err)), OVL_OK);
    const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)&d.coordinator;
    assert_int_equal(x->sin6_family, AF_INET6);
    assert_int_equal(ntohs(x->sin6_port), 65535);
    assert_memory_equal(&x->sin6_addr, &a->sin6_addr, 16);
}

static void test_encode_refuses(void **state)
{
    (void)state;
    ovld_job_blob_t b = v4_blob();
    uint8_t raw[OVLD_JOB_BLOB_LEN];
    ((struct sockaddr_in *)&b.coordinator)->sin_port = 0;
    assert_int_equal(ovld_job_blob_encode(&b, raw), OVL_ERR_INVALID);
    b = v4_blob();
    b.coordinator.ss_family = AF_UNIX;
    assert_int_equal(ovld_job_blob_encode(&b, raw), OVL_ERR_INVALID);
}

static void test_decode_refuses(void **state)
{
    (void)state;
    ovld_job_blob_t b = v4_blob();
    uint8_t good[OVLD_JOB_BLOB_LEN], raw[OVLD_JOB_BLOB_LEN + 1];
    assert_int_equal(ovld_job_blob_encode(&b, good), OVL_OK);

    expect_refused(good, 0, "a job id is 128 bytes, not 0");
    expect_refused(good, 127, "a job id is 128 bytes, not 127");
    memcpy(raw, good, sizeof(good));
    raw[128] = 0;
    expect_refused(raw, 129, "not 129");

#define MUTATE(i, v, want)                                                                         \
    do {                                                                                           \
        memcpy(raw, good, sizeof(good));                                                           \
        raw[i] = (uint8_t)(v);                                                                     \
        expect_refused(raw, OVLD_JOB_BLOB_LEN, want);                                              \
    } while (0)
    MUTATE(0, 'X', "no OVLJ magic");
    MUTATE(3, 'j', "no OVLJ magic");
    MUTATE(4, 2, "job id version 2");
    MUTATE(4, 0, "job id version 0");
    MUTATE(5, 5, "address family 5");
    MUTATE(5, 0, "address family 0");
    MUTATE(12, 1, "IPv4 address with bytes set past its 4th");
    MUTATE(23, 1, "IPv4 address with bytes set past its 4th");
    MUTATE(56, 1, "bytes set past its fields");
    MUTATE(127, 0x80, "bytes set past its fields");
    memcpy(raw, good, sizeof(good));
    raw[6] = raw[7] = 0;
    expect_refused(raw, OVLD_JOB_BLOB_LEN, "port 0");
#undef MUTATE

    /* every single-bit change of the fixed fields is either refused or
     * decodes to a different blob: nothing is ignored */
    for (int i = 0; i < 56; i++)
        for (int bit = 0; bit < 8; bit++) {
            ovld_job_blob_t d;
            char err[128];
            memcpy(raw, good, sizeof(good));
            raw[i] ^= (uint8_t)(1u << bit);
            if (ovld_job_blob_decode(raw, OVLD_JOB_BLOB_LEN, &d, err, sizeof(err)) != OVL_OK)
                continue;
            uint8_t again[OVLD_JOB_BLOB_LEN];
            assert_int_equal(ovld_job_blob_encode(&d, again), OVL_OK);
            assert_memory_equal(again, raw, OVLD_JOB_BLOB_LEN);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v4_round_trip_and_layout),
        cmocka_unit_test(test_v6_round_trip),
        cmocka_unit_test(test_encode_refuses),
        cmocka_unit_test(test_decode_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_doorbell.c: the doorbell's layout and release value (proto/doorbell.h).
 * The GPU's GEQ wait (cuStreamWaitValue64) compares cyclically,
 * (int64_t)(*addr - value) >= 0; a release value must satisfy that and the
 * host backend's plain compare for every op a departed client may have
 * submitted. UINT64_MAX, which ovld once stored, satisfies neither test for
 * the GPU: this is checked too, so that nobody brings it back.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>

#include "doorbell.h"

/* The GPU's condition for CU_STREAM_WAIT_VALUE_GEQ on 64-bit words. */
static bool gpu_geq(uint64_t word, uint64_t value)
{
    return (int64_t)(word - value) >= 0;
}

static void test_release_value_releases_every_submitted_op(void **state)
{
    (void)state;
    static const uint64_t his[] = {
        0, 1, 63, 64, 1000, UINT64_C(1) << 32, UINT64_C(1) << 40, (UINT64_C(1) << 62) + 12345};
    for (size_t i = 0; i < sizeof(his) / sizeof(his[0]); i++) {
        uint64_t hi = his[i], v = ovl_doorbell_release_value(hi);
        /* every op up to hi, and the window's worth before it */
        for (uint64_t back = 0; back < 5000 && back <= hi; back++) {
            assert_true(gpu_geq(v, hi - back));
            assert_true(v >= hi - back); /* host backend */
        }
        /* and what the old value did not do */
        assert_false(gpu_geq(UINT64_MAX, hi + 1));
    }
}

static void test_slots_fit_the_page(void **state)
{
    (void)state;
    assert_true(sizeof(struct ovl_doorbell) <= OVL_DOORBELL_SIZE);
    assert_int_equal(offsetof(struct ovl_doorbell, ready), 0);
    /* the slots are 8-byte aligned words (stream memory operations) */
    assert_int_equal(offsetof(struct ovl_doorbell, ready_slot) % 8, 0);
    assert_int_equal(offsetof(struct ovl_doorbell, done_slot) % 8, 0);
    assert_true(OVL_READY_SLOTS >= 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_value_releases_every_submitted_op),
        cmocka_unit_test(test_slots_fit_the_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

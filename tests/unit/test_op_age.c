/*
 * test_op_age.c: the age rule of the CUDA backend's watchdog
 * (daemon/util/op_age.h), on a clock the test sets. An op issued after the
 * watchdog read its clock is young (age 0: neither checked nor reported),
 * not ~2^64 ns old as the plain unsigned difference has it; each threshold
 * belongs to the older class; a long wait is reported, with its true
 * seconds; and nothing wraps near either end of the clock's range.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "op_age.h"

#define S (1000ull * 1000 * 1000)

/* A clock reading some hours after boot, as CLOCK_MONOTONIC gives it. */
#define T0 (12345ull * S + 678)

static void expect_age(uint64_t now, uint64_t issued, uint64_t age, ovld_op_age_t cls)
{
    assert_int_equal(ovld_op_age_ns(now, issued), age);
    assert_int_equal(ovld_op_age(now, issued), cls);
}

/* The case: the watchdog read `now`, then an op was issued. */
static void test_issued_after_now_is_fresh(void **state)
{
    (void)state;
    expect_age(T0, T0 + 1, 0, OVLD_OP_FRESH);
    expect_age(T0, T0 + 1000, 0, OVLD_OP_FRESH);   /* 1 us later */
    expect_age(T0, T0 + S, 0, OVLD_OP_FRESH);      /* even a second later */
    expect_age(T0, T0 + 10 * S, 0, OVLD_OP_FRESH); /* past both thresholds */
    expect_age(T0, T0, 0, OVLD_OP_FRESH);          /* the same instant */
    expect_age(0, 1, 0, OVLD_OP_FRESH);            /* at the clock's start */
    expect_age(0, UINT64_MAX, 0, OVLD_OP_FRESH);   /* the widest gap */
}

static void test_thresholds(void **state)
{
    (void)state;
    expect_age(T0, T0 - 1, 1, OVLD_OP_FRESH);
    expect_age(T0, T0 - (OVLD_OP_CHECK_NS - 1), OVLD_OP_CHECK_NS - 1, OVLD_OP_FRESH);
    expect_age(T0, T0 - OVLD_OP_CHECK_NS, OVLD_OP_CHECK_NS, OVLD_OP_CHECK);
    expect_age(T0, T0 - (OVLD_OP_CHECK_NS + 1), OVLD_OP_CHECK_NS + 1, OVLD_OP_CHECK);
    expect_age(T0, T0 - (OVLD_OP_WARN_NS - 1), OVLD_OP_WARN_NS - 1, OVLD_OP_CHECK);
    expect_age(T0, T0 - OVLD_OP_WARN_NS, OVLD_OP_WARN_NS, OVLD_OP_WARN);
    expect_age(T0, T0 - (OVLD_OP_WARN_NS + 1), OVLD_OP_WARN_NS + 1, OVLD_OP_WARN);
    /* the values the watchdog's comments and reports speak of */
    assert_int_equal(OVLD_OP_CHECK_NS, 1 * S);
    assert_int_equal(OVLD_OP_WARN_NS, 5 * S);
}

/* One op, the clock stepped past it 100 ms at a time as the watchdog's
 * timer would see it: young, checked, reported, in that order, never back. */
static void test_op_ages_as_the_clock_moves(void **state)
{
    (void)state;
    const uint64_t issued = T0;
    ovld_op_age_t last = OVLD_OP_FRESH;
    for (uint64_t now = T0 - S; now <= T0 + 7 * S; now += S / 10) {
        ovld_op_age_t cls = ovld_op_age(now, issued);
        ovld_op_age_t want = now < issued + OVLD_OP_CHECK_NS  ? OVLD_OP_FRESH
                             : now < issued + OVLD_OP_WARN_NS ? OVLD_OP_CHECK
                                                              : OVLD_OP_WARN;
        assert_int_equal(cls, want);
        assert_true(cls >= last);
        last = cls;
    }
    assert_int_equal(last, OVLD_OP_WARN);
}

/* A long wait is reported with its true age (the report says seconds). */
static void test_long_age_warns(void **state)
{
    (void)state;
    expect_age(T0 + 3600 * S, T0, 3600 * S, OVLD_OP_WARN);
    assert_int_equal(ovld_op_age_ns(T0 + 3600 * S, T0) / S, 3600);
    expect_age(T0, 0, T0, OVLD_OP_WARN);
}

static void test_no_wrap_near_the_ends(void **state)
{
    (void)state;
    const uint64_t top = UINT64_MAX;
    expect_age(top, top, 0, OVLD_OP_FRESH);
    expect_age(top - 1, top, 0, OVLD_OP_FRESH);
    expect_age(top - OVLD_OP_WARN_NS, top, 0, OVLD_OP_FRESH);
    expect_age(top, top - 1, 1, OVLD_OP_FRESH);
    expect_age(top, top - OVLD_OP_CHECK_NS, OVLD_OP_CHECK_NS, OVLD_OP_CHECK);
    expect_age(top, top - OVLD_OP_WARN_NS, OVLD_OP_WARN_NS, OVLD_OP_WARN);
    expect_age(top, 0, top, OVLD_OP_WARN);
    expect_age(top, 1, top - 1, OVLD_OP_WARN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_issued_after_now_is_fresh),  cmocka_unit_test(test_thresholds),
        cmocka_unit_test(test_op_ages_as_the_clock_moves), cmocka_unit_test(test_long_age_warns),
        cmocka_unit_test(test_no_wrap_near_the_ends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

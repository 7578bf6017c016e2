/*
 * test_hostgemm.c: the 16-bit float conversions (common/half.h) and the host
 * backend's GEMM (daemon/gemm/hostgemm.c), checked against ovl_ref_gemm.
 *
 * No timing here: the tests run under sanitizers. Sizes are kept small enough
 * to finish in a few seconds under ASan on a 2-core machine, yet large enough
 * to cross every blocking boundary of the GEMM (panels of 256 columns and
 * their narrow tails, 64-row blocks, 256-deep k blocks, the 4-way k unroll).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "hostgemm.h"
#include "ovl.h"
#include "demo_rnd.h"

#define POISON_BYTE 0xa5

/* ------------------------------------------------------------ helpers */

/* xorshift64: a fixed seed gives the same matrices on every run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Uniform in [-1, 1). */
static float rng_float(void)
{
    return (float)((double)(rng_next() >> 11) * 0x1p-52 - 1.0);
}

static float f_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of_f(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static bool fp16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* ------------------------------------------------------- conversions */

static void test_fp16_known_values(void **state)
{
    (void)state;
    assert_int_equal(ovl_fp16_from_float(1.0f), 0x3c00);
    assert_int_equal(ovl_fp16_from_float(-2.5f), 0xc100);
    assert_int_equal(ovl_fp16_from_float(0.0f), 0x0000);
    assert_int_equal(ovl_fp16_from_float(-0.0f), 0x8000);
    assert_int_equal(ovl_fp16_from_float(65504.0f), 0x7bff);
    /* 65520 is the tie between 65504 and 2^16: even is infinity. */
    assert_int_equal(ovl_fp16_from_float(65520.0f), 0x7c00);
    assert_int_equal(ovl_fp16_from_float(nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(ovl_fp16_from_float(-65520.0f), 0xfc00);
    assert_int_equal(ovl_fp16_from_float(FLT_MAX), 0x7c00);
    assert_int_equal(ovl_fp16_from_float(INFINITY), 0x7c00);
    assert_int_equal(ovl_fp16_from_float(-INFINITY), 0xfc00);
    /* Subnormals: 2^-24 is the smallest; 2^-25 ties to even (0); just over
     * it rounds up; 1.5 * 2^-24 ties to 2 * 2^-24. */
    assert_int_equal(ovl_fp16_from_float(0x1p-24f), 0x0001);
    assert_int_equal(ovl_fp16_from_float(0x1p-25f), 0x0000);
    assert_int_equal(ovl_fp16_from_float(-0x1p-25f), 0x8000);
    assert_int_equal(ovl_fp16_from_float(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(ovl_fp16_from_float(0x1.8p-24f), 0x0002);
    assert_int_equal(ovl_fp16_from_float(0x1.4p-23f), 0x0002); /* 2.5 * 2^-24 */
    assert_int_equal(ovl_fp16_from_float(0x1.cp-23f), 0x0004); /* 3.5 * 2^-24 */
    assert_int_equal(ovl_fp16_from_float(0x1p-14f), 0x0400);
    assert_int_equal(ovl_fp16_from_float(1023 * 0x1p-24f), 0x03ff);
    /* Rounding up out of the subnormals gives the smallest normal. */
    assert_int_equal(ovl_fp16_from_float(1023.5f * 0x1p-24f), 0x0400);
    assert_int_equal(ovl_fp16_from_float(FLT_MIN), 0x0000);
    /* Normal ties: 1 + 2^-11 goes down to 1, 1 + 3 * 2^-11 up to 1 + 2^-9,
     * and the tie above 0x3fff carries into the exponent (2.0). */
    assert_int_equal(ovl_fp16_from_float(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(ovl_fp16_from_float(1.0f + 0x3p-11f), 0x3c02);
    assert_int_equal(ovl_fp16_from_float(1.9990234375f + 0x1p-11f), 0x4000);

    assert_true(ovl_fp16_to_float(0x3c00) == 1.0f);
    assert_true(ovl_fp16_to_float(0xc100) == -2.5f);
    assert_true(ovl_fp16_to_float(0x7bff) == 65504.0f);
    assert_true(ovl_fp16_to_float(0x0001) == 0x1p-24f);
    assert_true(ovl_fp16_to_float(0x8001) == -0x1p-24f);
    assert_true(ovl_fp16_to_float(0x03ff) == 1023 * 0x1p-24f);
    assert_true(ovl_fp16_to_float(0x0400) == 0x1p-14f);
    assert_int_equal(bits_of_f(ovl_fp16_to_float(0x8000)), 0x80000000u);
    assert_true(isinf(ovl_fp16_to_float(0x7c00)) && ovl_fp16_to_float(0x7c00) > 0);
    assert_true(isinf(ovl_fp16_to_float(0xfc00)) && ovl_fp16_to_float(0xfc00) < 0);
    assert_true(isnan(ovl_fp16_to_float(0x7e00)));
    assert_true(isnan(ovl_fp16_to_float(0x7c01))); /* signalling */
    assert_true(isnan(ovl_fp16_to_float(0xfe00)));
}

static void test_fp16_nan(void **state)
{
    (void)state;
    uint16_t h = ovl_fp16_from_float(NAN);
    assert_true(fp16_is_nan(h));
    assert_true(h & 0x0200u); /* quiet */
    /* A signalling float NaN whose payload lies entirely in the bits fp16
     * drops must not become infinity. */
    h = ovl_fp16_from_float(f_of_bits(0x7f800001u));
    assert_true(fp16_is_nan(h));
    assert_true(h & 0x0200u);
    h = ovl_fp16_from_float(f_of_bits(0xff800001u));
    assert_true(fp16_is_nan(h));
    assert_true(h & 0x8000u);
    /* The largest NaN payload must not carry out of the NaN range. */
    assert_true(fp16_is_nan(ovl_fp16_from_float(f_of_bits(0x7fffffffu))));
}

static void test_bf16_known_values(void **state)
{
    (void)state;
    assert_int_equal(ovl_bf16_from_float(1.0f), 0x3f80);
    assert_int_equal(ovl_bf16_from_float(-2.5f), 0xc020);
    assert_int_equal(ovl_bf16_from_float(-0.0f), 0x8000);
    /* Ties to even: 0x3f80|8000 goes down, 0x3f81|8000 goes up. */
    assert_int_equal(ovl_bf16_from_float(f_of_bits(0x3f808000u)), 0x3f80);
    assert_int_equal(ovl_bf16_from_float(f_of_bits(0x3f818000u)), 0x3f82);
    assert_int_equal(ovl_bf16_from_float(f_of_bits(0x3f808001u)), 0x3f81);
    assert_int_equal(ovl_bf16_from_float(f_of_bits(0x3f807fffu)), 0x3f80);
    /* Past the largest finite bf16 rounds to infinity; infinity stays. */
    assert_int_equal(ovl_bf16_from_float(FLT_MAX), 0x7f80);
    assert_int_equal(ovl_bf16_from_float(f_of_bits(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(ovl_bf16_from_float(INFINITY), 0x7f80);
    assert_int_equal(ovl_bf16_from_float(-INFINITY), 0xff80);
    /* Subnormals round like everything else. */
    assert_int_equal(ovl_bf16_from_float(f_of_bits(0x00018000u)), 0x0002);

    assert_true(ovl_bf16_to_float(0x3f80) == 1.0f);
    assert_true(ovl_bf16_to_float(0xc020) == -2.5f);
    assert_true(isinf(ovl_bf16_to_float(0x7f80)));

    uint16_t h = ovl_bf16_from_float(NAN);
    assert_true(bf16_is_nan(h));
    assert_true(h & 0x0040u);
    /* Truncating this payload would leave 0x7f80, infinity. */
    h = ovl_bf16_from_float(f_of_bits(0x7f800001u));
    assert_true(bf16_is_nan(h));
    h = ovl_bf16_from_float(f_of_bits(0xffffffffu));
    assert_true(bf16_is_nan(h));
    assert_true(h & 0x8000u);
}

static void test_fp16_roundtrip_all(void **state)
{
    (void)state;
    for (uint32_t i = 0; i <= 0xffff; i++) {
        uint16_t h = (uint16_t)i;
        float f = ovl_fp16_to_float(h);
        if (fp16_is_nan(h)) {
            assert_true(isnan(f));
            assert_true(fp16_is_nan(ovl_fp16_from_float(f)));
            continue;
        }
        assert_int_equal(ovl_fp16_from_float(f), h);
    }
}

static void test_bf16_roundtrip_all(void **state)
{
    (void)state;
    for (uint32_t i = 0; i <= 0xffff; i++) {
        uint16_t h = (uint16_t)i;
        float f = ovl_bf16_to_float(h);
        assert_int_equal(bits_of_f(f), (uint32_t)h << 16);
        /* Signalling NaNs come back quiet; everything else bit-exact. */
        uint16_t want = bf16_is_nan(h) ? (uint16_t)(h | 0x0040u) : h;
        assert_int_equal(ovl_bf16_from_float(f), want);
    }
}

/*
 * Asserts that h is float f rounded to nearest even in a 16-bit format whose
 * largest finite magnitude has the pattern max_mag: h is no farther from f
 * than either neighbour, and even on a tie. Distances are computed in double,
 * where they are exact.
 */
static void check_rounding(float (*to_float)(uint16_t), uint16_t h, float f, uint16_t max_mag)
{
    uint16_t sign = h & 0x8000u, mag = h & 0x7fffu;
    double fd = f;
    if (isinf(to_float(h))) {
        /* Only when f lies at or past the tie above the largest finite. */
        double top = to_float(max_mag);
        double ulp = top - to_float((uint16_t)(max_mag - 1));
        assert_true(fabs(fd) >= top + ulp / 2);
        return;
    }
    assert_true(mag <= max_mag);
    assert_true(f == 0.0f || (sign != 0) == (f < 0.0f) || mag == 0);
    double d = fabs((double)to_float(h) - fd);
    if (mag < max_mag) {
        double dn = fabs((double)to_float((uint16_t)(h + 1)) - fd);
        assert_true(d < dn || (d == dn && (h & 1u) == 0));
    }
    if (mag > 0) {
        double dn = fabs((double)to_float((uint16_t)(h - 1)) - fd);
        assert_true(d < dn || (d == dn && (h & 1u) == 0));
    } else {
        /* Zero: the other side is the smallest subnormal of the other sign,
         * at the same distance as the one on this side. */
        double dn = fabs((double)to_float((uint16_t)(h + 1)));
        assert_true(d <= dn);
    }
}

static void test_rounding_random(void **state)
{
    (void)state;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_next();
        /* Half the samples near the fp16 range, where fp16 rounding is most
         * intricate (subnormals, overflow tie). */
        if (i & 1)
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (u >> 24) % 45) << 23);
        float f = f_of_bits(u);
        if (!isfinite(f))
            continue;
        check_rounding(ovl_fp16_to_float, ovl_fp16_from_float(f), f, 0x7bff);
        check_rounding(ovl_bf16_to_float, ovl_bf16_from_float(f), f, 0x7f7f);
    }
}

static void test_load_store_elem(void **state)
{
    (void)state;
    unsigned char buf[32];
    for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
        ovl_dtype_t dt = (ovl_dtype_t)t;
        size_t es = ovl_dtype_size(dt);
        memset(buf, POISON_BYTE, sizeof buf);
        ovl_store_elem(dt, buf, 3, -2.5f);
        assert_true(ovl_load_elem(dt, buf, 3) == -2.5f);
        for (size_t i = 0; i < sizeof buf; i++)
            if (i < 3 * es || i >= 4 * es)
                assert_int_equal(buf[i], POISON_BYTE);
        ovl_store_elem(dt, buf, 0, 1.0f);
        assert_true(ovl_load_elem(dt, buf, 0) == 1.0f);
        assert_true(ovl_load_elem(dt, buf, 3) == -2.5f);
    }
    /* The stores round as the conversions do. */
    ovl_store_elem(OVL_DTYPE_FP16, buf, 1, 65520.0f);
    assert_true(isinf(ovl_load_elem(OVL_DTYPE_FP16, buf, 1)));
    ovl_store_elem(OVL_DTYPE_BF16, buf, 1, f_of_bits(0x3f818000u));
    assert_int_equal(bits_of_f(ovl_load_elem(OVL_DTYPE_BF16, buf, 1)), 0x3f820000u);
    /* Unaligned bases are fine: memcpy does the access. */
    ovl_store_elem(OVL_DTYPE_FP32, buf + 1, 2, 3.25f);
    assert_true(ovl_load_elem(OVL_DTYPE_FP32, buf + 1, 2) == 3.25f);
}

/* -------------------------------------------------------------- GEMM */

/* A matrix in dtype with its allocation; elements past cols in each row are
 * padding. */
typedef struct mat {
    ovl_dtype_t dtype;
    size_t rows, cols, ld;
    unsigned char *data;
} mat_t;

/* Random elements, rounded to dtype; padding NaN so that a GEMM reading it
 * shows up in the error. */
static mat_t mat_random(ovl_dtype_t dtype, size_t rows, size_t cols, size_t ld)
{
    mat_t m = {dtype, rows, cols, ld, xmalloc(rows * ld * ovl_dtype_size(dtype))};
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < ld; j++)
            ovl_store_elem(dtype, m.data, i * ld + j, j < cols ? rng_float() : NAN);
    return m;
}

/* Every byte POISON_BYTE, to see what the GEMM writes. */
static mat_t mat_poisoned(ovl_dtype_t dtype, size_t rows, size_t cols, size_t ld)
{
    size_t bytes = rows * ld * ovl_dtype_size(dtype);
    mat_t m = {dtype, rows, cols, ld, xmalloc(bytes)};
    memset(m.data, POISON_BYTE, bytes);
    return m;
}

/* Whether the padding of every row (columns cols..ld-1) is still poison. */
static bool padding_intact(const mat_t *m)
{
    size_t es = ovl_dtype_size(m->dtype);
    for (size_t i = 0; i < m->rows; i++)
        for (size_t b = m->cols * es; b < m->ld * es; b++)
            if (m->data[i * m->ld * es + b] != POISON_BYTE)
                return false;
    return true;
}

/*
 * One random product checked against the reference; pad is added to every
 * leading dimension (A, B, C and ref).
 */
static void run_case(ovl_dtype_t dtype, size_t rows, size_t n, size_t k, int transb, size_t pad)
{
    mat_t a = mat_random(dtype, rows, k, k + pad);
    mat_t b = transb ? mat_random(dtype, n, k, k + pad) : mat_random(dtype, k, n, n + pad);
    mat_t c = mat_poisoned(dtype, rows, n, n + pad);
    size_t ldref = n + pad;
    double *ref = xmalloc(rows * ldref * sizeof(double));

    assert_int_equal(
        ovl_ref_gemm(dtype, rows, n, k, a.data, a.ld, b.data, b.ld, transb, ref, ldref), OVL_OK);
    assert_int_equal(
        ovl_host_gemm(dtype, rows, n, k, a.data, a.ld, b.data, b.ld, transb, c.data, c.ld), OVL_OK);
    double err = ovl_rel_error(dtype, rows, n, c.data, c.ld, ref, ldref);
    if (!(err < ovl_demo_tolerance(dtype)))
        fail_msg("%s rows=%zu n=%zu k=%zu transb=%d pad=%zu: rel error %g", ovl_dtype_name(dtype),
                 rows, n, k, transb, pad, err);
    assert_true(padding_intact(&c));

    free(ref);
    free(c.data);
    free(b.data);
    free(a.data);
}

static void test_gemm_odd_shapes(void **state)
{
    (void)state;
    const size_t rows_v[] = {1, 3, 17}, n_v[] = {1, 5, 33, 257}, k_v[] = {1, 7, 300};
    for (int t = 0; t < OVL_DTYPE_COUNT; t++)
        for (int transb = 0; transb < 2; transb++)
            for (size_t ri = 0; ri < 3; ri++)
                for (size_t ni = 0; ni < 4; ni++)
                    for (size_t ki = 0; ki < 3; ki++)
                        run_case((ovl_dtype_t)t, rows_v[ri], n_v[ni], k_v[ki], transb, 0);
}

static void test_gemm_padded_ld(void **state)
{
    (void)state;
    const size_t rows_v[] = {1, 17}, n_v[] = {5, 257}, k_v[] = {7, 300};
    for (int t = 0; t < OVL_DTYPE_COUNT; t++)
        for (int transb = 0; transb < 2; transb++)
            for (size_t ri = 0; ri < 2; ri++)
                for (size_t ni = 0; ni < 2; ni++)
                    for (size_t ki = 0; ki < 2; ki++)
                        run_case((ovl_dtype_t)t, rows_v[ri], n_v[ni], k_v[ki], transb, 3);
}

/* More than one block of rows (64) and of k (256, with a tail not a multiple
 * of the 4-way unroll), and n with a full panel plus narrow tail panels. */
static void test_gemm_multi_block(void **state)
{
    (void)state;
    for (int t = 0; t < OVL_DTYPE_COUNT; t++)
        run_case((ovl_dtype_t)t, 67, 301, 523, (int)(t & 1), 1);
    run_case(OVL_DTYPE_FP32, 67, 301, 523, 0, 0);
}

/* Small integers make every product and sum exact in every dtype, so the
 * GEMM must match the reference bit for bit. */
static void test_gemm_exact_integers(void **state)
{
    (void)state;
    enum { R = 9, N = 70, K = 13 };
    for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
        ovl_dtype_t dt = (ovl_dtype_t)t;
        for (int transb = 0; transb < 2; transb++) {
            mat_t a = mat_poisoned(dt, R, K, K), b = mat_poisoned(dt, K, N, N);
            mat_t c = mat_poisoned(dt, R, N, N);
            double ref[R * N];
            for (size_t i = 0; i < R * K; i++)
                ovl_store_elem(dt, a.data, i, (float)((int)(rng_next() % 5) - 2));
            for (size_t i = 0; i < K * N; i++)
                ovl_store_elem(dt, b.data, i, (float)((int)(rng_next() % 5) - 2));
            size_t ldb = transb ? K : N; /* same buffer, read as n x k */
            assert_int_equal(ovl_ref_gemm(dt, R, N, K, a.data, K, b.data, ldb, transb, ref, N),
                             OVL_OK);
            assert_int_equal(ovl_host_gemm(dt, R, N, K, a.data, K, b.data, ldb, transb, c.data, N),
                             OVL_OK);
            for (size_t i = 0; i < R * N; i++)
                assert_true(ovl_load_elem(dt, c.data, i) == (float)ref[i]);
            free(c.data);
            free(b.data);
            free(a.data);
        }
    }
}

/* Accumulation is in fp32 with one rounding at the end: in bf16,
 * 1 + 2^-8 + 2^-8 is 1 + 2^-7 (0x3f81), while rounding after each addition
 * would give 1 (each partial sum ties to even, down). */
static void test_gemm_single_rounding(void **state)
{
    (void)state;
    uint16_t a[3], b[3], c[1];
    const float av[3] = {1.0f, 0x1p-8f, 0x1p-8f};
    for (int i = 0; i < 3; i++) {
        a[i] = ovl_bf16_from_float(av[i]);
        b[i] = ovl_bf16_from_float(1.0f);
    }
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_BF16, 1, 1, 3, a, 3, b, 1, 0, c, 1), OVL_OK);
    assert_int_equal(c[0], 0x3f81);
    /* fp16: 2048 + 1 + 1 = 2050 exactly; stepwise it would stay 2048. */
    const float hv[3] = {2048.0f, 1.0f, 1.0f};
    for (int i = 0; i < 3; i++) {
        a[i] = ovl_fp16_from_float(hv[i]);
        b[i] = ovl_fp16_from_float(1.0f);
    }
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP16, 1, 1, 3, a, 3, b, 3, 1, c, 1), OVL_OK);
    assert_true(ovl_fp16_to_float(c[0]) == 2050.0f);
}

/* A NaN or infinity in A spoils its row of C and nothing else (no shortcut
 * skips zeros: 0 * inf is NaN). */
/* C = A @ B / div + ACC: small integers, so that fp32 and bf16 are
 * exact; ACC with a leading dimension of its own, ACC as C itself, k 0
 * (C = ACC), and the bad ACC refused. */
static void test_gemm_acc(void **state)
{
    (void)state;
    enum { R = 5, N = 33, K = 7, LDACC = 40 };
    float a[R * K], b[K * N], acc[R * LDACC], c[R * N];
    for (size_t i = 0; i < R * K; i++)
        a[i] = (float)((int)(i % 5) - 2);
    for (size_t i = 0; i < K * N; i++)
        b[i] = (float)((int)(i % 3) - 1);
    for (size_t i = 0; i < R * LDACC; i++)
        acc[i] = (float)(i % 7);
    for (uint32_t div = 0; div <= 2; div++) {
        assert_int_equal(
            ovl_host_gemm_acc(OVL_DTYPE_FP32, R, N, K, a, K, b, N, 0, acc, LDACC, div, c, N),
            OVL_OK);
        for (size_t i = 0; i < R; i++)
            for (size_t j = 0; j < N; j++) {
                float want = 0.0f;
                for (size_t l = 0; l < K; l++)
                    want += a[i * K + l] * b[l * N + j];
                if (div > 1)
                    want *= 1.0f / (float)div;
                want += acc[i * LDACC + j];
                assert_true(c[i * N + j] == want);
            }
    }
    /* ACC as C: C += A @ B */
    float c2[R * N], want2[R * N];
    for (size_t i = 0; i < R * N; i++)
        c2[i] = want2[i] = (float)(i % 11);
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < N; j++)
            for (size_t l = 0; l < K; l++)
                want2[i * N + j] += a[i * K + l] * b[l * N + j];
    assert_int_equal(ovl_host_gemm_acc(OVL_DTYPE_FP32, R, N, K, a, K, b, N, 0, c2, N, 1, c2, N),
                     OVL_OK);
    assert_memory_equal(c2, want2, sizeof(c2));
    /* bf16: the sum rounded once */
    uint16_t ab[R * K], bb[K * N], accb[R * N], cb[R * N];
    for (size_t i = 0; i < R * K; i++)
        ab[i] = ovl_bf16_from_float(a[i]);
    for (size_t i = 0; i < K * N; i++)
        bb[i] = ovl_bf16_from_float(b[i]);
    for (size_t i = 0; i < R * N; i++)
        accb[i] = ovl_bf16_from_float((float)(i % 7));
    assert_int_equal(ovl_host_gemm_acc(OVL_DTYPE_BF16, R, N, K, ab, K, bb, N, 0, accb, N, 2, cb, N),
                     OVL_OK);
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < N; j++) {
            float want = 0.0f;
            for (size_t l = 0; l < K; l++)
                want += a[i * K + l] * b[l * N + j];
            want = want / 2.0f + (float)((i * N + j) % 7);
            assert_true(cb[i * N + j] == ovl_bf16_from_float(want));
        }
    /* k 0: C = ACC */
    assert_int_equal(
        ovl_host_gemm_acc(OVL_DTYPE_FP32, R, N, 0, NULL, 0, NULL, N, 0, acc, LDACC, 2, c, N),
        OVL_OK);
    assert_true(c[1 * N + 3] == acc[1 * LDACC + 3]);
    /* ACC narrower than n */
    assert_int_equal(ovl_host_gemm_acc(OVL_DTYPE_FP32, R, N, K, a, K, b, N, 0, acc, N - 1, 1, c, N),
                     OVL_ERR_INVALID);
}

/* Why ring's avg scales every product by 1/W (plan_rs.c, ringrs_emit):
 * three ranks' fp16 partials of 40000 each, passed on and added as ring
 * does, stay finite with each product scaled by 1/3 and end at their
 * average; unscaled, the running sum (80000) leaves fp16's range. */
static void test_gemm_acc_ring_fp16(void **state)
{
    (void)state;
    uint16_t a = ovl_fp16_from_float(200.0f), b = ovl_fp16_from_float(200.0f);
    uint16_t p0, p1, c;

    for (int scaled = 1; scaled >= 0; scaled--) {
        uint32_t div = scaled ? 3 : 1;
        assert_int_equal(
            ovl_host_gemm_acc(OVL_DTYPE_FP16, 1, 1, 1, &a, 1, &b, 1, 0, NULL, 0, div, &p0, 1),
            OVL_OK);
        assert_int_equal(
            ovl_host_gemm_acc(OVL_DTYPE_FP16, 1, 1, 1, &a, 1, &b, 1, 0, &p0, 1, div, &p1, 1),
            OVL_OK);
        assert_int_equal(
            ovl_host_gemm_acc(OVL_DTYPE_FP16, 1, 1, 1, &a, 1, &b, 1, 0, &p1, 1, div, &c, 1),
            OVL_OK);
        float got = ovl_fp16_to_float(c);
        if (scaled)
            assert_true(fabsf(got - 40000.0f) <= 40000.0f * 2e-3f);
        else
            assert_true(isinf(got)); /* the sum of all three, 120000, and 80000 before it */
    }
}

static void test_gemm_nonfinite(void **state)
{
    (void)state;
    enum { R = 4, N = 20, K = 9 };
    float a[R * K], b[K * N], c[R * N];
    for (size_t i = 0; i < R * K; i++)
        a[i] = rng_float();
    for (size_t i = 0; i < K * N; i++)
        b[i] = 0.0f;
    a[1 * K + 2] = NAN;
    a[2 * K + 5] = INFINITY;
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, R, N, K, a, K, b, N, 0, c, N), OVL_OK);
    for (size_t j = 0; j < N; j++) {
        assert_true(c[0 * N + j] == 0.0f);
        assert_true(isnan(c[1 * N + j]));
        assert_true(isnan(c[2 * N + j]));
        assert_true(c[3 * N + j] == 0.0f);
    }
    double ref[R * N];
    assert_int_equal(ovl_ref_gemm(OVL_DTYPE_FP32, R, N, K, a, K, b, N, 0, ref, N), OVL_OK);
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, R, N, c, N, ref, N)));
}

static void test_gemm_k_zero(void **state)
{
    (void)state;
    for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
        ovl_dtype_t dt = (ovl_dtype_t)t;
        mat_t c = mat_poisoned(dt, 3, 5, 7);
        /* No element of A or B exists, so NULL is fine for both. */
        assert_int_equal(ovl_host_gemm(dt, 3, 5, 0, NULL, 0, NULL, 5, 0, c.data, c.ld), OVL_OK);
        for (size_t i = 0; i < 3; i++)
            for (size_t j = 0; j < 5; j++)
                assert_true(ovl_load_elem(dt, c.data, i * c.ld + j) == 0.0f);
        assert_true(padding_intact(&c));
        double ref[15];
        assert_int_equal(ovl_ref_gemm(dt, 3, 5, 0, NULL, 0, NULL, 0, 1, ref, 5), OVL_OK);
        assert_true(ovl_rel_error(dt, 3, 5, c.data, c.ld, ref, 5) == 0.0);
        free(c.data);
    }
}

static void test_gemm_empty(void **state)
{
    (void)state;
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    mat_t c = mat_poisoned(OVL_DTYPE_FP32, 2, 4, 4);
    /* Nothing to do: C is not touched. */
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 0, 4, 2, a, 2, b, 4, 0, c.data, 4), OVL_OK);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 0, 2, a, 2, b, 0, 0, c.data, 4), OVL_OK);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 0, 0, 0, NULL, 0, NULL, 0, 0, NULL, 0), OVL_OK);
    c.cols = 0; /* every byte is "padding" now */
    assert_true(padding_intact(&c));
    free(c.data);
}

static void test_gemm_invalid(void **state)
{
    (void)state;
    float a[64] = {0}, b[64] = {0}, c[64];
    double ref[64];
    /* A valid call first, so that each failure below is down to one change:
     * rows 2, n 5, k 7. */
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 0, c, 5), OVL_OK);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 7, 1, c, 5), OVL_OK);

    assert_int_equal(ovl_host_gemm((ovl_dtype_t)7, 2, 5, 7, a, 7, b, 5, 0, c, 5), OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, NULL, 7, b, 5, 0, c, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, NULL, 5, 0, c, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 0, NULL, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 6, b, 5, 0, c, 5), OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 4, 0, c, 5), OVL_ERR_INVALID);
    /* ldb 5 holds a row of B (k x n) but not of B stored n x k. */
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 1, c, 5), OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 0, c, 4), OVL_ERR_INVALID);
    /* Leading dimensions are checked even when a matrix is empty. */
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 0, 5, 7, a, 6, b, 5, 0, c, 5), OVL_ERR_INVALID);
    /* Extents past what size_t can address. */
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, UINT64_C(1) << 62, 5, 7, a, 7, b, 5, 0, c, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(ovl_host_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, SIZE_MAX, b, 5, 0, c, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(
        ovl_host_gemm(OVL_DTYPE_BF16, 2, UINT64_MAX, 7, a, 7, b, SIZE_MAX, 0, c, SIZE_MAX),
        OVL_ERR_INVALID);

    /* The reference checks the same things, with ref as C. */
    assert_int_equal(ovl_ref_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 0, ref, 5), OVL_OK);
    assert_int_equal(ovl_ref_gemm((ovl_dtype_t)-1, 2, 5, 7, a, 7, b, 5, 0, ref, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(ovl_ref_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 0, NULL, 5),
                     OVL_ERR_INVALID);
    assert_int_equal(ovl_ref_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 5, 0, ref, 4), OVL_ERR_INVALID);
    assert_int_equal(ovl_ref_gemm(OVL_DTYPE_FP32, 2, 5, 7, a, 7, b, 6, 1, ref, 5), OVL_ERR_INVALID);
}

static void test_rel_error(void **state)
{
    (void)state;
    float c[4] = {3.0f, 4.5f, 0.0f, 0.0f};
    double ref[4] = {3.0, 4.0, 0.0, 0.0};
    /* ||(0, 0.5)|| / ||(3, 4)|| = 0.1 */
    assert_true(fabs(ovl_rel_error(OVL_DTYPE_FP32, 1, 2, c, 2, ref, 2) - 0.1) < 1e-12);
    assert_true(ovl_rel_error(OVL_DTYPE_FP32, 1, 2, c + 2, 2, ref + 2, 2) == 0.0);
    /* ld skips the second column: rows (3) and (0), both exact. */
    assert_true(ovl_rel_error(OVL_DTYPE_FP32, 2, 1, c, 2, ref, 2) == 0.0);
    ref[3] = 0.0;
    c[3] = 1.0f;
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 1, 2, c + 2, 2, ref + 2, 2)));
    c[3] = NAN;
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 2, 2, c, 2, ref, 2)));
    c[3] = -INFINITY;
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 2, 2, c, 2, ref, 2)));
    c[3] = 0.0f;
    ref[3] = NAN;
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 2, 2, c, 2, ref, 2)));
    /* Empty: nothing differs. Invalid: never "close". */
    assert_true(ovl_rel_error(OVL_DTYPE_FP32, 0, 2, NULL, 2, NULL, 2) == 0.0);
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 1, 2, c, 1, ref, 2)));
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 1, 2, c, 2, ref, 1)));
    assert_true(isinf(ovl_rel_error(OVL_DTYPE_FP32, 1, 2, NULL, 2, ref, 2)));
    assert_true(isinf(ovl_rel_error((ovl_dtype_t)9, 1, 2, c, 2, ref, 2)));
    /* 16-bit C is read in its own format. */
    uint16_t h[2] = {ovl_bf16_from_float(3.0f), ovl_bf16_from_float(4.0f)};
    assert_true(ovl_rel_error(OVL_DTYPE_BF16, 1, 2, h, 2, (const double[]){3.0, 4.0}, 2) == 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_known_values),   cmocka_unit_test(test_fp16_nan),
        cmocka_unit_test(test_bf16_known_values),   cmocka_unit_test(test_fp16_roundtrip_all),
        cmocka_unit_test(test_bf16_roundtrip_all),  cmocka_unit_test(test_rounding_random),
        cmocka_unit_test(test_load_store_elem),     cmocka_unit_test(test_gemm_odd_shapes),
        cmocka_unit_test(test_gemm_padded_ld),      cmocka_unit_test(test_gemm_multi_block),
        cmocka_unit_test(test_gemm_exact_integers), cmocka_unit_test(test_gemm_single_rounding),
        cmocka_unit_test(test_gemm_nonfinite),      cmocka_unit_test(test_gemm_k_zero),
        cmocka_unit_test(test_gemm_empty),          cmocka_unit_test(test_gemm_invalid),
        cmocka_unit_test(test_rel_error),           cmocka_unit_test(test_gemm_acc),
        cmocka_unit_test(test_gemm_acc_ring_fp16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

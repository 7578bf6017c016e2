/*
 * test_hostgemm.c: the 16-bit float conversions (common/half.h) and the host
 * backend's GEMM (daemon/gemm/hostgemm.c), checked against ovl_ref_gemm; its
 * scaled (fp8) GEMM, checked bit for bit against gemm_args.h's definition
 * computed here in the documented order, and against ovl_ref_gemm_scaled;
 * block scales (1x128, 128x128) alike, in the order hostgemm.h documents
 * for them.
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

/* The dtypes of a plain GEMM, its inputs and its output: every dtype but the
 * fp8 ones, which are only ever inputs of a scaled GEMM. */
static const ovl_dtype_t plain_dtypes[] = {OVL_DTYPE_BF16, OVL_DTYPE_FP16, OVL_DTYPE_FP32};
#define N_PLAIN ((int)(sizeof plain_dtypes / sizeof plain_dtypes[0]))

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
    for (int t = 0; t < N_PLAIN; t++)
        for (int transb = 0; transb < 2; transb++)
            for (size_t ri = 0; ri < 3; ri++)
                for (size_t ni = 0; ni < 4; ni++)
                    for (size_t ki = 0; ki < 3; ki++)
                        run_case(plain_dtypes[t], rows_v[ri], n_v[ni], k_v[ki], transb, 0);
}

static void test_gemm_padded_ld(void **state)
{
    (void)state;
    const size_t rows_v[] = {1, 17}, n_v[] = {5, 257}, k_v[] = {7, 300};
    for (int t = 0; t < N_PLAIN; t++)
        for (int transb = 0; transb < 2; transb++)
            for (size_t ri = 0; ri < 2; ri++)
                for (size_t ni = 0; ni < 2; ni++)
                    for (size_t ki = 0; ki < 2; ki++)
                        run_case(plain_dtypes[t], rows_v[ri], n_v[ni], k_v[ki], transb, 3);
}

/* More than one block of rows (64) and of k (256, with a tail not a multiple
 * of the 4-way unroll), and n with a full panel plus narrow tail panels. */
static void test_gemm_multi_block(void **state)
{
    (void)state;
    for (int t = 0; t < N_PLAIN; t++)
        run_case(plain_dtypes[t], 67, 301, 523, (int)(t & 1), 1);
    run_case(OVL_DTYPE_FP32, 67, 301, 523, 0, 0);
}

/* Small integers make every product and sum exact in every dtype, so the
 * GEMM must match the reference bit for bit. */
static void test_gemm_exact_integers(void **state)
{
    (void)state;
    enum { R = 9, N = 70, K = 13 };
    for (int t = 0; t < N_PLAIN; t++) {
        ovl_dtype_t dt = plain_dtypes[t];
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
    for (int t = 0; t < N_PLAIN; t++) {
        ovl_dtype_t dt = plain_dtypes[t];
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

/* ------------------------------------------------ ovl_host_gemm_args */

/* fp8 is never an output, so no plain GEMM or plain reference takes it,
 * not even an empty one. */
static void test_gemm_fp8_unscaled_refused(void **state)
{
    (void)state;
    uint8_t a[64] = {0}, b[64] = {0}, c[64];
    double ref[64];
    const ovl_dtype_t fp8[] = {OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E5M2};
    for (int t = 0; t < 2; t++) {
        ovl_dtype_t dt = fp8[t];
        assert_int_equal(ovl_host_gemm(dt, 2, 5, 7, a, 7, b, 7, 1, c, 5), OVL_ERR_INVALID);
        assert_int_equal(ovl_host_gemm(dt, 0, 5, 7, a, 7, b, 7, 1, c, 5), OVL_ERR_INVALID);
        assert_int_equal(ovl_host_gemm_acc(dt, 2, 5, 7, a, 7, b, 7, 1, NULL, 0, 1, c, 5),
                         OVL_ERR_INVALID);
        assert_int_equal(ovl_ref_gemm(dt, 2, 5, 7, a, 7, b, 7, 1, ref, 5), OVL_ERR_INVALID);
        ovld_gemm_args_t g = {
            .dtype = dt,
            .rows = 2,
            .n = 5,
            .k = 7,
            .nblocks = 1,
            .transb = true,
            .a = {a, 7},
            .b = {b, 7},
            .c = {c, 5},
        };
        assert_int_equal(ovl_host_gemm_args(&g), OVL_ERR_INVALID);
    }
}

/* Unscaled, ovl_host_gemm_args is ovl_host_gemm_acc block by block, bit
 * for bit: blocks apart (the rows between them untouched), ACC apart and
 * ACC as C, div 3, k 0. */
static void test_gemm_args_unscaled(void **state)
{
    (void)state;
    enum { ROWS = 5, N = 33, K = 19, NBLK = 3, STRIDE = 7, SPAN = (NBLK - 1) * STRIDE + ROWS };
    enum { LDA = K + 2, LDB = K + 1, LDC = N + 3, LDACC = N + 1 };
    for (int t = 0; t < N_PLAIN; t++) {
        ovl_dtype_t dt = plain_dtypes[t];
        size_t es = ovl_dtype_size(dt);
        mat_t a = mat_random(dt, SPAN, K, LDA), b = mat_random(dt, N, K, LDB);
        mat_t acc = mat_random(dt, SPAN, N, LDACC);
        for (int mode = 0; mode < 3; mode++) { /* ACC apart, ACC as C, k 0 without ACC */
            uint64_t k = mode == 2 ? 0 : K;
            mat_t got = mat_poisoned(dt, SPAN, N, LDC), want = mat_poisoned(dt, SPAN, N, LDC);
            if (mode == 1)
                for (size_t i = 0; i < SPAN * LDC; i++) {
                    float v = rng_float();
                    ovl_store_elem(dt, got.data, i, v);
                    ovl_store_elem(dt, want.data, i, v);
                }
            ovld_gemm_args_t g = {
                .dtype = dt,
                .rows = ROWS,
                .n = N,
                .k = k,
                .nblocks = NBLK,
                .block_stride = STRIDE,
                .a = {a.data, LDA},
                .b = {b.data, LDB},
                .c = {got.data, LDC},
                .div = 3,
                .transb = true,
            };
            if (mode == 0)
                g.acc = (ovld_view_t){acc.data, LDACC};
            if (mode == 1)
                g.acc = g.c;
            assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);
            for (size_t blk = 0; blk < NBLK; blk++) {
                size_t r = blk * STRIDE;
                unsigned char *wc = want.data + r * LDC * es;
                const void *wacc = mode == 0   ? (const void *)(acc.data + r * LDACC * es)
                                   : mode == 1 ? (const void *)wc
                                               : NULL;
                size_t ldacc = mode == 0 ? LDACC : LDC;
                assert_int_equal(ovl_host_gemm_acc(dt, ROWS, N, k, a.data + r * LDA * es, LDA,
                                                   b.data, LDB, 1, wacc, ldacc, 3, wc, LDC),
                                 OVL_OK);
            }
            assert_memory_equal(got.data, want.data, SPAN * LDC * es);
            free(want.data);
            free(got.data);
        }
        /* No blocks: nothing written. */
        mat_t c = mat_poisoned(dt, SPAN, N, LDC);
        ovld_gemm_args_t g0 = {
            .dtype = dt,
            .rows = ROWS,
            .n = N,
            .k = K,
            .nblocks = 0,
            .block_stride = STRIDE,
            .a = {a.data, LDA},
            .b = {b.data, LDB},
            .c = {c.data, LDC},
            .transb = true,
        };
        assert_int_equal(ovl_host_gemm_args(&g0), OVL_OK);
        c.cols = 0;
        assert_true(padding_intact(&c));
        free(c.data);
        free(acc.data);
        free(b.data);
        free(a.data);
    }
}

/* ---------------------------------------------------- scaled (fp8) GEMM */

/* The fp8 NaN code both formats share (S.1111.111, S.11111.11): the
 * padding and the rows between blocks, so that a GEMM reading them shows. */
#define FP8_NAN 0x7fu

static bool fp8_finite(ovl_dtype_t dt, uint8_t code)
{
    return dt == OVL_DTYPE_FP8_E4M3 ? (code & 0x7fu) != 0x7fu : (code & 0x7cu) != 0x7cu;
}

/* A random finite code of dt, every one as likely: every exponent,
 * subnormals and both zeros included. Infinities (e5m2's) are left out with
 * the NaNs: one in a row of A makes that row of C infinite or NaN and the
 * check of it empty. */
static uint8_t rng_fp8(ovl_dtype_t dt)
{
    for (;;) {
        uint8_t code = (uint8_t)(rng_next() >> 56);
        if (fp8_finite(dt, code))
            return code;
    }
}

/* A positive scale near 2^-8 with a full mantissa, so that sa * sb rounds
 * and the order of the scaling steps shows; the products of two near 2^-16
 * keep fp16's C finite for these k. */
static float rng_scale(void)
{
    return ldexpf(1.0f + 0.5f * (rng_float() + 1.0f), -9);
}

typedef struct scaled_case {
    ovl_dtype_t a_dt, b_dt, c_dt;
    ovl_scale_mode_t a_mode, b_mode;
    bool bias;
    int epi; /* 0: no ACC, div 1; 1: ACC, div 2; 2: ACC, div 3; 3: ACC as C, div 3 */
    size_t rows, n, k, nblocks, stride, pad;
} scaled_case_t;

/*
 * The largest ||C - ref||_F / ||ref||_F a scaled case may show against
 * ovl_ref_gemm_scaled, by c_dtype, to first order:
 *   u_c + (k + 8) * 2^-24 * ||M||_F / ||ref||_F + sub / ||ref||_F
 * u_c: C's one rounding, 2^-8, 2^-11 or 2^-24 relative (bf16's, fp16's,
 * fp32's unit roundoff). Then the fp32 steps before it: at most k + 8
 * roundings of 2^-24 relative each (the sum's k - 1, the scales' product,
 * the scaling, 1/div and its product, bias, ACC), each of a partial result
 * no larger than M = |sa sb| sum_l |A op(B)| / div + |bias| + |ACC| (the
 * magnitudes: ACC or bias may cancel the product, and the roundings before
 * that do not shrink with the result). sub: fp16's subnormals round with an
 * absolute error of at most 2^-25, sqrt(count) * 2^-25 over the block (the
 * tiny products of fp8 codes reach them); bf16 and fp32 have float's
 * exponent range, far below these values. Block scales (kq blocks of 128
 * of k; 0 for the others) round 3 kq times more: each block's product of
 * scales, its sum times it, and its add to the total (M = sum_l |sa(i, l)
 * sb(j, l) A op(B)| / div + ...: no partial result is larger).
 */
static double scaled_bound(ovl_dtype_t c_dt, size_t k, size_t kq, size_t count, double refnorm,
                           double mnorm)
{
    if (refnorm == 0)
        return 0; /* ref zero: C must be zero (ovl_rel_error is 0 or infinite) */
    double u = c_dt == OVL_DTYPE_BF16 ? 0x1p-8 : c_dt == OVL_DTYPE_FP16 ? 0x1p-11 : 0x1p-24;
    double sub = c_dt == OVL_DTYPE_FP16 ? 0x1p-25 * sqrt((double)count) : 0;
    return u + ((double)(k + 8 + 3 * kq) * 0x1p-24 * mnorm + sub) / refnorm;
}

static double max_ratio[OVL_DTYPE_COUNT]; /* the largest error / bound seen, for the record */

/* The documented order of ovl_host_gemm_args's fp32 sum (hostgemm.h): groups
 * of four from l = 0, each summed left to right and then added, then the
 * rest one by one. a and b are k decoded elements each (b: a column of op(B),
 * a row of B). */
static float def_sum(const float *a, const float *b, size_t k)
{
    float s = 0.0f;
    size_t l = 0;
    for (; l + 4 <= k; l += 4)
        s = s + (((a[l] * b[l] + a[l + 1] * b[l + 1]) + a[l + 2] * b[l + 2]) + a[l + 3] * b[l + 3]);
    for (; l < k; l++)
        s = s + a[l] * b[l];
    return s;
}

static const char *mode_name(ovl_scale_mode_t m)
{
    const char *name = ovl_scale_mode_name(m);
    return name ? name : "?";
}

/* Whether m is a block mode (1x128, 128x128), written out here. */
static bool is_block(ovl_scale_mode_t m)
{
    return m == OVL_SCALE_BLOCK_1X128 || m == OVL_SCALE_BLOCK_128X128;
}

/* Block scales per row of a matrix of k columns: ceil(k / 128). */
static size_t blocks_of(size_t k)
{
    return (k + 127) / 128;
}

/* The scales a case hands over, by mode (ovl.h's table): A's from its first
 * row over span rows (tensor 1, row span, 1x128 span x ceil(k/128)); B's,
 * n x k (tensor 1, row n, 1x128 n x ceil(k/128), 128x128 ceil(n/128) x
 * ceil(k/128)). */
static size_t scales_of(ovl_scale_mode_t m, size_t rows, size_t k)
{
    switch (m) {
    case OVL_SCALE_TENSOR:
        return 1;
    case OVL_SCALE_ROW:
        return rows;
    case OVL_SCALE_BLOCK_1X128:
        return rows * blocks_of(k);
    case OVL_SCALE_BLOCK_128X128:
        return (rows + 127) / 128 * blocks_of(k);
    }
    fail_msg("scale mode %d", (int)m);
    return 0;
}

/* The scale of row i of A (or of column i of op(B), a row of B as given)
 * at column l of k, as hostgemm.h documents it: sa(i) or sa(i, q), q =
 * l / 128, from the dense row-major scales s of mode m (A's counted from
 * its first row, blocks included). */
static float scale_of(const float *s, ovl_scale_mode_t m, size_t i, size_t l, size_t k)
{
    switch (m) {
    case OVL_SCALE_TENSOR:
        return s[0];
    case OVL_SCALE_ROW:
        return s[i];
    case OVL_SCALE_BLOCK_1X128:
        return s[i * blocks_of(k) + l / 128];
    case OVL_SCALE_BLOCK_128X128:
        return s[(i / 128) * blocks_of(k) + l / 128];
    }
    return NAN;
}

/* C[i][j]'s fp32 value before the epilogue (1/div, bias, ACC), in
 * hostgemm.h's order: not block, s = the sum (def_sum), x = s * (sa(i) *
 * sb(j)); block, x = 0 and, for each block q of 128 of k, y = s(q) * (sa(i,
 * q) * sb(j, q)) (s(q) the block's sum, in groups of four from its first
 * column), x = x + y. */
static float def_scaled(const scaled_case_t *sc, const float *fa, const float *fb, const float *sa,
                        const float *sb, size_t i, size_t j)
{
    size_t k = sc->k;
    if (!is_block(sc->a_mode))
        return def_sum(fa + i * k, fb + j * k, k) *
               (scale_of(sa, sc->a_mode, i, 0, k) * scale_of(sb, sc->b_mode, j, 0, k));
    float x = 0.0f;
    for (size_t lo = 0; lo < k; lo += 128) {
        size_t len = k - lo < 128 ? k - lo : 128;
        float s = def_sum(fa + i * k + lo, fb + j * k + lo, len);
        float y = s * (scale_of(sa, sc->a_mode, i, lo, k) * scale_of(sb, sc->b_mode, j, lo, k));
        x = x + y;
    }
    return x;
}

/*
 * One scaled GEMM: C from ovl_host_gemm_args equal bit for bit to C
 * computed here from gemm_args.h's definition (every byte of C's buffer:
 * the padding and the rows between blocks stay as they were), and within
 * scaled_bound of ovl_ref_gemm_scaled.
 */
static void run_scaled(const scaled_case_t *sc)
{
    size_t span = (sc->nblocks - 1) * sc->stride + sc->rows;
    size_t n = sc->n, k = sc->k;
    size_t lda = k + sc->pad, ldb = k + 2 * sc->pad, ldc = n + sc->pad, ldacc = n + 3 * sc->pad;
    size_t ldref = n + 1;
    size_t ec = ovl_dtype_size(sc->c_dt);
    ovl_dtype_t cdt = sc->c_dt;
    bool has_acc = sc->epi > 0, acc_is_c = sc->epi == 3;
    uint32_t div = sc->epi == 0 ? 1 : sc->epi == 1 ? 2 : 3;

    uint8_t *a = xmalloc(span * lda), *b = xmalloc(n * ldb);
    memset(a, FP8_NAN, span * lda);
    memset(b, FP8_NAN, n * ldb);
    float *fa = xmalloc(span * k * sizeof(float)), *fb = xmalloc(n * k * sizeof(float));
    for (size_t blk = 0; blk < sc->nblocks; blk++)
        for (size_t i = blk * sc->stride; i < blk * sc->stride + sc->rows; i++)
            for (size_t l = 0; l < k; l++) {
                a[i * lda + l] = rng_fp8(sc->a_dt);
                fa[i * k + l] = ovl_load_elem(sc->a_dt, a, i * lda + l);
            }
    for (size_t j = 0; j < n; j++)
        for (size_t l = 0; l < k; l++) {
            b[j * ldb + l] = rng_fp8(sc->b_dt);
            fb[j * k + l] = ovl_load_elem(sc->b_dt, b, j * ldb + l);
        }
    size_t nsa = scales_of(sc->a_mode, span, k);
    size_t nsb = scales_of(sc->b_mode, n, k);
    float *sa = xmalloc(nsa * sizeof(float)), *sb = xmalloc(nsb * sizeof(float));
    for (size_t i = 0; i < nsa; i++)
        sa[i] = rng_scale();
    for (size_t j = 0; j < nsb; j++)
        sb[j] = rng_scale();
    unsigned char *bias = NULL;
    if (sc->bias) {
        bias = xmalloc(n * ec);
        for (size_t j = 0; j < n; j++)
            ovl_store_elem(cdt, bias, j, 64.0f * rng_float());
    }
    /* ACC, apart or as C; its padding NaN */
    size_t ldacc_eff = acc_is_c ? ldc : ldacc;
    unsigned char *acc = NULL;
    if (has_acc) {
        acc = xmalloc(span * ldacc_eff * ec);
        for (size_t i = 0; i < span; i++)
            for (size_t j = 0; j < ldacc_eff; j++)
                ovl_store_elem(cdt, acc, i * ldacc_eff + j, j < n ? 64.0f * rng_float() : NAN);
    }
    unsigned char *c = xmalloc(span * ldc * ec), *want = xmalloc(span * ldc * ec);
    if (acc_is_c)
        memcpy(c, acc, span * ldc * ec);
    else
        memset(c, POISON_BYTE, span * ldc * ec);
    memcpy(want, c, span * ldc * ec);

    ovld_gemm_args_t g = {
        .dtype = sc->a_dt,
        .rows = sc->rows,
        .n = n,
        .k = k,
        .nblocks = (uint32_t)sc->nblocks,
        .block_stride = sc->stride,
        .a = {a, lda},
        .b = {b, ldb},
        .c = {c, ldc},
        .acc = {has_acc ? (acc_is_c ? (void *)c : (void *)acc) : NULL, ldacc_eff},
        .div = div,
        .transb = true,
        .scaled = true,
        .b_dtype = sc->b_dt,
        .c_dtype = cdt,
        .a_mode = sc->a_mode,
        .b_mode = sc->b_mode,
        .a_scale = sa,
        .b_scale = sb,
        .bias = bias,
    };

    /* (b) first: the reference reads ACC, which C may be. */
    double *ref = xmalloc(span * ldref * sizeof(double));
    ovld_gemm_args_t gr = g;
    if (acc_is_c)
        gr.acc.ptr = acc;
    assert_int_equal(ovl_ref_gemm_scaled(&gr, ref, ldref), OVL_OK);

    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);

    /* (a): the definition, step by step in fp32 */
    for (size_t blk = 0; blk < sc->nblocks; blk++)
        for (size_t i = blk * sc->stride; i < blk * sc->stride + sc->rows; i++)
            for (size_t j = 0; j < n; j++) {
                float x = def_scaled(sc, fa, fb, sa, sb, i, j);
                if (div > 1)
                    x = x * (1.0f / (float)div);
                if (bias)
                    x = x + ovl_load_elem(cdt, bias, j);
                if (has_acc)
                    x = x + ovl_load_elem(cdt, acc, i * ldacc_eff + j);
                ovl_store_elem(cdt, want, i * ldc + j, x);
            }
    if (memcmp(c, want, span * ldc * ec) != 0) {
        size_t at = 0;
        while (c[at] == want[at])
            at++;
        fail_msg("scaled %s x %s -> %s, modes %s/%s, bias %d, epi %d, rows %zu n %zu k %zu "
                 "nblocks %zu pad %zu: first difference at byte %zu (row %zu)",
                 ovl_dtype_name(sc->a_dt), ovl_dtype_name(sc->b_dt), ovl_dtype_name(cdt),
                 mode_name(sc->a_mode), mode_name(sc->b_mode), sc->bias, sc->epi, sc->rows, n, k,
                 sc->nblocks, sc->pad, at, at / (ldc * ec));
    }

    /* (b): the double reference, block by block */
    for (size_t blk = 0; blk < sc->nblocks; blk++) {
        size_t r = blk * sc->stride;
        double err = ovl_rel_error(cdt, sc->rows, n, c + r * ldc * ec, ldc, ref + r * ldref, ldref);
        double norm2 = 0, m2 = 0;
        for (size_t i = r; i < r + sc->rows; i++)
            for (size_t j = 0; j < n; j++) {
                double mag = 0;
                if (!is_block(sc->a_mode)) {
                    for (size_t l = 0; l < k; l++)
                        mag += fabs((double)fa[i * k + l] * fb[j * k + l]);
                    mag *= fabs((double)scale_of(sa, sc->a_mode, i, 0, k) *
                                scale_of(sb, sc->b_mode, j, 0, k)) /
                           div;
                } else {
                    /* each block's products times its scales */
                    for (size_t lo = 0; lo < k; lo += 128) {
                        double part = 0;
                        for (size_t l = lo; l < k && l < lo + 128; l++)
                            part += fabs((double)fa[i * k + l] * fb[j * k + l]);
                        mag += part * fabs((double)scale_of(sa, sc->a_mode, i, lo, k) *
                                           scale_of(sb, sc->b_mode, j, lo, k));
                    }
                    mag /= div;
                }
                if (bias)
                    mag += fabs(ovl_load_elem(cdt, bias, j));
                if (has_acc)
                    mag += fabs(ovl_load_elem(cdt, acc, i * ldacc_eff + j));
                norm2 += ref[i * ldref + j] * ref[i * ldref + j];
                m2 += mag * mag;
            }
        double bound = scaled_bound(cdt, k, is_block(sc->a_mode) ? blocks_of(k) : 0, sc->rows * n,
                                    sqrt(norm2), sqrt(m2));
        if (!(err <= bound))
            fail_msg("scaled %s x %s -> %s, modes %s/%s, bias %d, epi %d, rows %zu n %zu k %zu: "
                     "rel error %g past %g",
                     ovl_dtype_name(sc->a_dt), ovl_dtype_name(sc->b_dt), ovl_dtype_name(cdt),
                     mode_name(sc->a_mode), mode_name(sc->b_mode), sc->bias, sc->epi, sc->rows, n,
                     k, err, bound);
        if (bound > 0 && err / bound > max_ratio[cdt])
            max_ratio[cdt] = err / bound;
    }

    free(ref);
    free(want);
    free(c);
    free(acc);
    free(bias);
    free(sb);
    free(sa);
    free(fb);
    free(fa);
    free(b);
    free(a);
}

/* The fp8 pairs cuBLASLt takes: all but e5m2 x e5m2. */
static const ovl_dtype_t fp8_pairs[3][2] = {
    {OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E4M3},
    {OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E5M2},
    {OVL_DTYPE_FP8_E5M2, OVL_DTYPE_FP8_E4M3},
};

/* Every pair, c_dtype, scale mode of A and of B, with and without bias,
 * over small odd shapes (one row, n 1, k 0 and 1, k short of and past a
 * group of four), each with every epilogue (ACC or not, div 2 and 3, ACC as
 * C), one block and three (block_stride past rows), tight and padded
 * leading dimensions. */
static void test_gemm_scaled_small(void **state)
{
    (void)state;
    static const size_t shapes[][3] = {{1, 1, 1},  {1, 5, 7},  {3, 1, 13},
                                       {5, 33, 1}, {4, 17, 9}, {2, 3, 0}};
    int count = 0;
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < N_PLAIN; t++)
            for (int am = 0; am < 2; am++)
                for (int bm = 0; bm < 2; bm++)
                    for (int bias = 0; bias < 2; bias++)
                        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                            for (int epi = 0; epi < 4; epi++)
                                for (size_t nblk = 1; nblk <= 3; nblk += 2) {
                                    scaled_case_t sc = {
                                        .a_dt = fp8_pairs[p][0],
                                        .b_dt = fp8_pairs[p][1],
                                        .c_dt = plain_dtypes[t],
                                        .a_mode = (ovl_scale_mode_t)am,
                                        .b_mode = (ovl_scale_mode_t)bm,
                                        .bias = bias,
                                        .epi = epi,
                                        .rows = shapes[s][0],
                                        .n = shapes[s][1],
                                        .k = shapes[s][2],
                                        .nblocks = nblk,
                                        .stride = shapes[s][0] + 2,
                                        .pad = (s + epi) % 2 ? 3 : 0,
                                    };
                                    run_scaled(&sc);
                                    count++;
                                }
    print_message("scaled small: %d cases; largest error / bound: bf16 %.3g fp16 %.3g fp32 %.3g\n",
                  count, max_ratio[OVL_DTYPE_BF16], max_ratio[OVL_DTYPE_FP16],
                  max_ratio[OVL_DTYPE_FP32]);
}

/* Past every blocking boundary of the kernel: rows past a 64-row block, n
 * past a full 256-column panel into a narrow one, k past a 256-deep block
 * with a tail not a multiple of four; each pair and c_dtype once, the modes,
 * bias, epilogue and blocks taking turns. */
static void test_gemm_scaled_blocks(void **state)
{
    (void)state;
    int i = 0;
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < N_PLAIN; t++, i++) {
            bool big = i % 3 == 0;
            scaled_case_t sc = {
                .a_dt = fp8_pairs[p][0],
                .b_dt = fp8_pairs[p][1],
                .c_dt = plain_dtypes[t],
                .a_mode = (ovl_scale_mode_t)(i & 1),
                .b_mode = (ovl_scale_mode_t)((i >> 1) & 1),
                .bias = (i % 3) != 1,
                .epi = i % 4,
                .rows = big ? 65 : 17,
                .n = big ? 259 : 40,
                .k = 263,
                .nblocks = big ? 1 : 3,
                .stride = big ? 65 : 20,
                .pad = (size_t)(i % 2) * 5,
            };
            run_scaled(&sc);
        }
    print_message("scaled blocks: largest error / bound: bf16 %.3g fp16 %.3g fp32 %.3g\n",
                  max_ratio[OVL_DTYPE_BF16], max_ratio[OVL_DTYPE_FP16], max_ratio[OVL_DTYPE_FP32]);
}

/* Block scales (A 1x128; B 1x128 and 128x128) on small shapes, rows and n
 * in fours: every pair, c_dtype and B mode, with and without bias, every
 * epilogue, one block and three (block_stride past rows: each block's
 * scales from its own rows), tight and padded leading dimensions; k 0, 1,
 * 5, a whole block (128), a block and a bit (130, 257: partial last
 * blocks, 257 of three). (n past 128, where 128x128 scales have several
 * rows: test_gemm_scaled_block_big.) */
static void test_gemm_scaled_block_small(void **state)
{
    (void)state;
    memset(max_ratio, 0, sizeof(max_ratio)); /* this test's own, printed below */
    static const size_t shapes[][3] = {{4, 4, 1}, {4, 8, 128}, {4, 12, 130},
                                       {4, 4, 0}, {4, 4, 257}, {8, 12, 5}};
    static const ovl_scale_mode_t b_modes[] = {OVL_SCALE_BLOCK_1X128, OVL_SCALE_BLOCK_128X128};
    int count = 0;
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < N_PLAIN; t++)
            for (int bm = 0; bm < 2; bm++)
                for (int bias = 0; bias < 2; bias++)
                    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                        for (int epi = 0; epi < 4; epi++)
                            for (size_t nblk = 1; nblk <= 3; nblk += 2) {
                                scaled_case_t sc = {
                                    .a_dt = fp8_pairs[p][0],
                                    .b_dt = fp8_pairs[p][1],
                                    .c_dt = plain_dtypes[t],
                                    .a_mode = OVL_SCALE_BLOCK_1X128,
                                    .b_mode = b_modes[bm],
                                    .bias = bias,
                                    .epi = epi,
                                    .rows = shapes[s][0],
                                    .n = shapes[s][1],
                                    .k = shapes[s][2],
                                    .nblocks = nblk,
                                    .stride = shapes[s][0] + (epi % 2 ? 4 : 2),
                                    .pad = (s + epi) % 2 ? 3 : 0,
                                };
                                run_scaled(&sc);
                                count++;
                            }
    assert_int_equal(count, 3 * N_PLAIN * 2 * 2 * 6 * 4 * 2);
    print_message("scaled block small: %d cases; largest error / bound: bf16 %.3g fp16 %.3g "
                  "fp32 %.3g\n",
                  count, max_ratio[OVL_DTYPE_BF16], max_ratio[OVL_DTYPE_FP16],
                  max_ratio[OVL_DTYPE_FP32]);
}

/* Block scales past every blocking boundary of the kernel: rows past a
 * 64-row block (68), n past a full 256-column panel into a narrow one (260:
 * 128x128 scales of three rows, the last for 4 columns), k past a scale
 * block (137: two, the last of 9; with block scales the kernel walks k a
 * scale block at a time), twice, once by each B mode; then three blocks of
 * 8 rows and n 132 (two rows of 128x128 scales, the second for 4 columns),
 * k of whole scale blocks past a 256-deep kernel block (384) or a block
 * and 2 (130): each pair and c_dtype once, B's mode, bias, epilogue and k
 * taking turns. */
static void test_gemm_scaled_block_big(void **state)
{
    (void)state;
    memset(max_ratio, 0, sizeof(max_ratio));
    int i = 0;
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < N_PLAIN; t++, i++) {
            bool big = i == 0 || i == 5;
            scaled_case_t sc = {
                .a_dt = fp8_pairs[p][0],
                .b_dt = fp8_pairs[p][1],
                .c_dt = plain_dtypes[t],
                .a_mode = OVL_SCALE_BLOCK_1X128,
                .b_mode = i & 1 ? OVL_SCALE_BLOCK_128X128 : OVL_SCALE_BLOCK_1X128,
                .bias = (i % 3) != 1,
                .epi = i % 4,
                .rows = big ? 68 : 8,
                .n = big ? 260 : 132,
                .k = big            ? 137
                     : (i >> 1) & 1 ? 384
                                    : 130,
                .nblocks = big ? 1 : 3,
                .stride = big ? 68 : 12,
                .pad = (size_t)(i % 2) * 5,
            };
            run_scaled(&sc);
        }
    print_message("scaled block big: largest error / bound: bf16 %.3g fp16 %.3g fp32 %.3g\n",
                  max_ratio[OVL_DTYPE_BF16], max_ratio[OVL_DTYPE_FP16], max_ratio[OVL_DTYPE_FP32]);
}

/* Every refusal of a scaled GEMM, each one change from a valid call, and the
 * same from the scaled reference. */
static void test_gemm_scaled_invalid(void **state)
{
    (void)state;
    uint8_t a[64] = {0}, b[64] = {0};
    float c[64], acc[64], sa[8] = {1, 1, 1, 1, 1, 1, 1, 1}, sb[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    double ref[64];
    const ovld_gemm_args_t ok = {
        .dtype = OVL_DTYPE_FP8_E4M3,
        .rows = 2,
        .n = 5,
        .k = 7,
        .nblocks = 1,
        .a = {a, 7},
        .b = {b, 7},
        .c = {c, 5},
        .acc = {acc, 5},
        .div = 2,
        .transb = true,
        .scaled = true,
        .b_dtype = OVL_DTYPE_FP8_E5M2,
        .c_dtype = OVL_DTYPE_FP32,
        .a_mode = OVL_SCALE_ROW,
        .b_mode = OVL_SCALE_ROW,
        .a_scale = sa,
        .b_scale = sb,
    };
    ovld_gemm_args_t g = ok;
    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);
    assert_int_equal(ovl_ref_gemm_scaled(&g, ref, 5), OVL_OK);
    assert_int_equal(ovl_host_gemm_args(NULL), OVL_ERR_INVALID);
    assert_int_equal(ovl_ref_gemm_scaled(NULL, ref, 5), OVL_ERR_INVALID);

    ovld_gemm_args_t bad[48];
    int nbad = 0;
#define BAD(field, value)                                                                          \
    do {                                                                                           \
        bad[nbad] = ok;                                                                            \
        bad[nbad++].field = (value);                                                               \
    } while (0)
    BAD(dtype, OVL_DTYPE_BF16); /* A not fp8 */
    BAD(dtype, OVL_DTYPE_FP32);
    BAD(dtype, (ovl_dtype_t)9);
    BAD(b_dtype, OVL_DTYPE_FP16); /* B not fp8 */
    BAD(b_dtype, (ovl_dtype_t)-1);
    BAD(c_dtype, OVL_DTYPE_FP8_E4M3); /* C not bf16, fp16, fp32 */
    BAD(c_dtype, OVL_DTYPE_FP8_E5M2);
    BAD(c_dtype, (ovl_dtype_t)7);
    BAD(a_mode, (ovl_scale_mode_t)2); /* block with row: mixed */
    BAD(a_mode, (ovl_scale_mode_t)-1);
    BAD(b_mode, (ovl_scale_mode_t)OVL_SCALE_MODE_COUNT);
    BAD(a_mode, (ovl_scale_mode_t)4); /* unknown */
    BAD(b_mode, (ovl_scale_mode_t)4);
    BAD(b_mode, OVL_SCALE_BLOCK_1X128); /* row with block: mixed */
    BAD(b_mode, OVL_SCALE_BLOCK_128X128);
    BAD(a_mode, OVL_SCALE_BLOCK_128X128); /* A never 128x128 */
    BAD(a_scale, NULL);
    BAD(b_scale, NULL);
    BAD(transb, false);
    BAD(c.ld, 4); /* shapes as ovl_host_gemm_acc's */
    BAD(acc.ld, 4);
    BAD(a.ld, 6);
    BAD(b.ld, 6);
    BAD(a.ptr, NULL);
    BAD(b.ptr, NULL);
    BAD(c.ptr, NULL);
    /* C's extent in c_dtype (4 bytes) overflows where 1-byte elements
     * (A's dtype) would fit; ACC's likewise. */
    BAD(c.ld, SIZE_MAX / 3);
    BAD(acc.ld, SIZE_MAX / 3);
    /* the blocks' span overflows */
    BAD(nblocks, 3);
    bad[nbad - 1].block_stride = UINT64_MAX / 2;
    bad[nbad] = ok; /* both e5m2 */
    bad[nbad].dtype = OVL_DTYPE_FP8_E5M2;
    bad[nbad++].b_dtype = OVL_DTYPE_FP8_E5M2;
#undef BAD
    for (int i = 0; i < nbad; i++) {
        if (ovl_host_gemm_args(&bad[i]) != OVL_ERR_INVALID)
            fail_msg("refusal %d accepted by ovl_host_gemm_args", i);
        /* the reference: the same, but its output is ref, not C */
        if (bad[i].c.ptr != ok.c.ptr || bad[i].c.ld != ok.c.ld)
            continue;
        if (ovl_ref_gemm_scaled(&bad[i], ref, 5) != OVL_ERR_INVALID)
            fail_msg("refusal %d accepted by ovl_ref_gemm_scaled", i);
    }
    /* Block scales: a valid call (rows 4, n 8, k 7: one partial block; A
     * 1x128 with B 1x128 and 128x128), then each refusal of the rule and
     * of the shapes: A's rows not in fours (6, in either B mode), B 1x128
     * with n 6, mixed modes either way, A 128x128, an unknown mode; B
     * 128x128 takes n 6. */
    const ovld_gemm_args_t okb = {
        .dtype = OVL_DTYPE_FP8_E4M3,
        .rows = 4,
        .n = 8,
        .k = 7,
        .nblocks = 1,
        .a = {a, 7},
        .b = {b, 7},
        .c = {c, 8},
        .acc = {acc, 8},
        .div = 2,
        .transb = true,
        .scaled = true,
        .b_dtype = OVL_DTYPE_FP8_E5M2,
        .c_dtype = OVL_DTYPE_FP32,
        .a_mode = OVL_SCALE_BLOCK_1X128,
        .b_mode = OVL_SCALE_BLOCK_1X128,
        .a_scale = sa,
        .b_scale = sb,
    };
    g = okb;
    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);
    assert_int_equal(ovl_ref_gemm_scaled(&g, ref, 8), OVL_OK);
    g.b_mode = OVL_SCALE_BLOCK_128X128;
    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);
    g.n = 6; /* 128x128: any n */
    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);
    assert_int_equal(ovl_ref_gemm_scaled(&g, ref, 8), OVL_OK);
    nbad = 0;
#define BADB(field, value)                                                                         \
    do {                                                                                           \
        bad[nbad] = okb;                                                                           \
        bad[nbad++].field = (value);                                                               \
    } while (0)
    BADB(rows, 6);
    BADB(rows, 6);
    bad[nbad - 1].b_mode = OVL_SCALE_BLOCK_128X128;
    BADB(rows, 2);
    BADB(n, 6);
    BADB(n, 1);
    BADB(b_mode, OVL_SCALE_ROW);
    BADB(b_mode, OVL_SCALE_TENSOR);
    BADB(a_mode, OVL_SCALE_ROW);
    bad[nbad - 1].b_mode = OVL_SCALE_BLOCK_128X128;
    BADB(a_mode, OVL_SCALE_TENSOR);
    BADB(a_mode, OVL_SCALE_BLOCK_128X128);
    BADB(a_mode, OVL_SCALE_BLOCK_128X128);
    bad[nbad - 1].b_mode = OVL_SCALE_BLOCK_128X128;
    BADB(a_mode, (ovl_scale_mode_t)4);
    BADB(b_mode, (ovl_scale_mode_t)4);
    BADB(a_scale, NULL);
    BADB(b_scale, NULL);
    BADB(transb, false);
#undef BADB
    for (int i = 0; i < nbad; i++) {
        if (ovl_host_gemm_args(&bad[i]) != OVL_ERR_INVALID)
            fail_msg("block refusal %d accepted by ovl_host_gemm_args", i);
        if (ovl_ref_gemm_scaled(&bad[i], ref, 8) != OVL_ERR_INVALID)
            fail_msg("block refusal %d accepted by ovl_ref_gemm_scaled", i);
    }
    /* by row the shapes block scales refuse are taken */
    g = okb;
    g.a_mode = g.b_mode = OVL_SCALE_ROW;
    g.rows = 6;
    g.n = 6;
    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);

    /* The other fp8 pairs are taken, and an empty GEMM still checks. */
    g = ok;
    g.dtype = OVL_DTYPE_FP8_E5M2;
    g.b_dtype = OVL_DTYPE_FP8_E4M3;
    assert_int_equal(ovl_host_gemm_args(&g), OVL_OK);
    g.rows = 0;
    g.transb = false;
    assert_int_equal(ovl_host_gemm_args(&g), OVL_ERR_INVALID);
    /* The scaled reference: not scaled, NULL ref, ldref short of n. */
    g = ok;
    assert_int_equal(ovl_ref_gemm_scaled(&g, ref, 4), OVL_ERR_INVALID);
    assert_int_equal(ovl_ref_gemm_scaled(&g, NULL, 5), OVL_ERR_INVALID);
    g.scaled = false;
    g.dtype = OVL_DTYPE_FP32;
    assert_int_equal(ovl_ref_gemm_scaled(&g, ref, 5), OVL_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_known_values),
        cmocka_unit_test(test_fp16_nan),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_fp16_roundtrip_all),
        cmocka_unit_test(test_bf16_roundtrip_all),
        cmocka_unit_test(test_rounding_random),
        cmocka_unit_test(test_load_store_elem),
        cmocka_unit_test(test_gemm_odd_shapes),
        cmocka_unit_test(test_gemm_padded_ld),
        cmocka_unit_test(test_gemm_multi_block),
        cmocka_unit_test(test_gemm_exact_integers),
        cmocka_unit_test(test_gemm_single_rounding),
        cmocka_unit_test(test_gemm_nonfinite),
        cmocka_unit_test(test_gemm_k_zero),
        cmocka_unit_test(test_gemm_empty),
        cmocka_unit_test(test_gemm_invalid),
        cmocka_unit_test(test_rel_error),
        cmocka_unit_test(test_gemm_acc),
        cmocka_unit_test(test_gemm_acc_ring_fp16),
        cmocka_unit_test(test_gemm_fp8_unscaled_refused),
        cmocka_unit_test(test_gemm_args_unscaled),
        cmocka_unit_test(test_gemm_scaled_small),
        cmocka_unit_test(test_gemm_scaled_blocks),
        cmocka_unit_test(test_gemm_scaled_block_small),
        cmocka_unit_test(test_gemm_scaled_block_big),
        cmocka_unit_test(test_gemm_scaled_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

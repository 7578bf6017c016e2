/*
 * demo_scaled.h: ovl-demo's scaled (fp8) ops, shared by its host and CUDA
 * paths and its references: what the options chose (ovl_demo_scaled_t),
 * the data any process rebuilds from the seed, the ovl_scaling_t of an op,
 * the tolerance, the rows of C a check covers (ovl_demo_check_rows: every
 * row, or past OVL_DEMO_CHECK_FULL_MACS a sample), and the reference of
 * all-gather + GEMM over them (GEMM + reduce-scatter's is
 * ovl_demo_rs_reference_rows', demo_rs_ref.h). Host code: the CUDA paths
 * make their data here and copy it to their GPU.
 *
 * The data of rank r (demo_rnd.h's hash of (seed, r, which, i)):
 *   A        matrix 0 in the op's fp8 dtype (ovl_demo_fill_host: [-1, 1)
 *            rounded to fp8), as for every dtype;
 *   B        matrix 1 in b_dtype, n x k (a scaled op takes B transposed);
 *   a_scale  fp32 in [0.5, 1), the dense row-major matrix of
 *            ovl_scale_shape(a_mode, 0, rows, k) for the rank's A: element
 *            e (row i of A times its scales a row, plus the column) gets
 *            ovl_demo_scale(seed, r, 10, e); by row e is i, by 1x128 i *
 *            ceil(k/128) + l/128 (l a column of k); by tensor one value,
 *            the same on every rank (r = 0 in the hash): all-gather + GEMM
 *            with a tensor scale uses each rank's own scale for every
 *            gathered row (ovl.h, ovl_scaling_t), so the ranks must agree
 *            on it (by row and 1x128 they are gathered with the rows);
 *   b_scale  fp32 in [0.5, 1), the dense matrix of ovl_scale_shape(b_mode,
 *            1, n, k): element e gets ovl_demo_scale(seed, r, 11, e) (by
 *            row n values, one per column j of op(B); by tensor one; by
 *            1x128 n x ceil(k/128); by 128x128 ceil(n/128) x ceil(k/128));
 *   bias     n values 0.5 * ovl_demo_value(seed, r, 12, j) in out_dtype.
 */
#ifndef OVL_DEMO_SCALED_H
#define OVL_DEMO_SCALED_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_rnd.h"
#include "half.h"
#include "hostgemm.h"
#include "ovl.h"
#include "scaling.h"

/* The matrices `which` of the scales and the bias (A is 0, B 1). */
#define OVL_DEMO_WHICH_A_SCALE 10
#define OVL_DEMO_WHICH_B_SCALE 11
#define OVL_DEMO_WHICH_BIAS    12

/* What makes the demo's op scaled (its dtype, A's, is fp8); zero: not
 * scaled. */
typedef struct ovl_demo_scaled {
    bool on;
    ovl_dtype_t b_dtype, out_dtype;
    ovl_scale_mode_t a_mode, b_mode;
    bool bias, fast_accum;
} ovl_demo_scaled_t;

/* Uniform in [0.5, 1): 23 random bits, exact in fp32. */
static inline float ovl_demo_scale(uint64_t seed, uint32_t r, int which, uint64_t i)
{
    return 0.5f + (float)(ovl_demo_bits(seed, r, which, i) >> 41) * 0x1p-24f;
}

/* The scales of a row of A (A's scale matrix's columns, ovl_scale_shape):
 * 1, or ceil(k/128) by 1x128; 1 by tensor (one for the whole A). */
static inline uint64_t ovl_demo_a_scale_cols(const ovl_demo_scaled_t *sc, uint64_t k)
{
    uint64_t r, c;
    return ovl_scale_shape(sc->a_mode, 0, 1, k, &r, &c) == OVL_OK ? c : 1;
}

/* How many A scales an A of `rows` rows and k columns has (1 by tensor),
 * and B's (n x k, given transposed): ovl_scale_shape's rows times its
 * columns. The modes are ones the rule takes (common/scaling.h: A is
 * never 128x128; the demo's callers refuse it first): a mode it does not
 * take counts 1. */
static inline uint64_t ovl_demo_a_scales(const ovl_demo_scaled_t *sc, uint64_t rows, uint64_t k)
{
    uint64_t r, c;
    if (ovl_scale_shape(sc->a_mode, 0, rows, k, &r, &c) != OVL_OK)
        return 1;
    return r * c;
}

static inline uint64_t ovl_demo_b_scales(const ovl_demo_scaled_t *sc, uint64_t n, uint64_t k)
{
    uint64_t r, c;
    if (ovl_scale_shape(sc->b_mode, 1, n, k, &r, &c) != OVL_OK)
        return 1;
    return r * c;
}

/* Rank r's A scales of rows [row0, row0 + rows) of its A (k columns)
 * into dst, dense (rows times ovl_demo_a_scale_cols; by tensor the one),
 * as the data model numbers them, into host memory. */
static inline void ovl_demo_fill_a_scale_rows(const ovl_demo_scaled_t *sc, float *dst,
                                              uint64_t row0, uint64_t rows, uint64_t k,
                                              uint64_t seed, uint32_t r)
{
    if (sc->a_mode == OVL_SCALE_TENSOR) {
        dst[0] = ovl_demo_scale(seed, 0, OVL_DEMO_WHICH_A_SCALE, 0); /* every rank's */
        return;
    }
    uint64_t cols = ovl_demo_a_scale_cols(sc, k);
    for (uint64_t e = 0; e < rows * cols; e++)
        dst[e] = ovl_demo_scale(seed, r, OVL_DEMO_WHICH_A_SCALE, row0 * cols + e);
}

/* Rank r's A scales of its whole A (rows x k), into dst. */
static inline void ovl_demo_fill_a_scale(const ovl_demo_scaled_t *sc, float *dst, uint64_t rows,
                                         uint64_t k, uint64_t seed, uint32_t r)
{
    ovl_demo_fill_a_scale_rows(sc, dst, 0, rows, k, seed, r);
}

/* Rank r's B scales (B n x k: ovl_demo_b_scales of them) and its bias (n
 * elements of out_dtype), into host memory. */
static inline void ovl_demo_fill_b_scale(const ovl_demo_scaled_t *sc, float *dst, uint64_t n,
                                         uint64_t k, uint64_t seed, uint32_t r)
{
    uint64_t count = ovl_demo_b_scales(sc, n, k);
    for (uint64_t e = 0; e < count; e++)
        dst[e] = ovl_demo_scale(seed, r, OVL_DEMO_WHICH_B_SCALE, e);
}

static inline void ovl_demo_fill_bias(const ovl_demo_scaled_t *sc, void *dst, uint64_t n,
                                      uint64_t seed, uint32_t r)
{
    for (uint64_t j = 0; j < n; j++)
        ovl_store_elem(sc->out_dtype, dst, j,
                       0.5f * ovl_demo_value(seed, r, OVL_DEMO_WHICH_BIAS, j));
}

/* Why the rule of a scaled op (common/scaling.h, the words libovl and
 * ovld refuse with) refuses sc's with A in dt, B transposed (as the demo
 * gives it), rows the rows of each GEMM's A (all-gather + GEMM: a rank's
 * m; GEMM + reduce-scatter: each rank's block of C, m / world) and n
 * columns of C; NULL where it takes it. */
static inline const char *ovl_demo_scaled_refusal(const ovl_demo_scaled_t *sc, ovl_dtype_t dt,
                                                  uint64_t rows, uint64_t n)
{
    const char *why =
        ovl_scaling_refusal((unsigned)dt, (unsigned)sc->b_dtype, (unsigned)sc->out_dtype,
                            (unsigned)sc->a_mode, (unsigned)sc->b_mode, true);
    return why ? why : ovl_scaling_shape_refusal(sc->a_mode, sc->b_mode, rows, n);
}

/* The op's ovl_scaling_t over buffers the caller filled (bias unread
 * without --bias). */
static inline ovl_scaling_t ovl_demo_scaling(const ovl_demo_scaled_t *sc, const float *a_scale,
                                             const float *b_scale, const void *bias)
{
    ovl_scaling_t s = {.b_dtype = sc->b_dtype,
                       .out_dtype = sc->out_dtype,
                       .a_mode = sc->a_mode,
                       .b_mode = sc->b_mode,
                       .a_scale = a_scale,
                       .b_scale = b_scale,
                       .bias = sc->bias ? bias : NULL,
                       .fast_accum = sc->fast_accum};
    return s;
}

/* C's dtype: out_dtype when scaled, else the op's. */
static inline ovl_dtype_t ovl_demo_c_dtype(const ovl_demo_scaled_t *sc, ovl_dtype_t dt)
{
    return sc->on ? sc->out_dtype : dt;
}

/* B's dtype: b_dtype when scaled, else the op's. */
static inline ovl_dtype_t ovl_demo_b_dtype(const ovl_demo_scaled_t *sc, ovl_dtype_t dt)
{
    return sc->on ? sc->b_dtype : dt;
}

/* The fp32 output's bound of a scaled op: its rounding is 2^-24, but
 * Hopper's tensor cores accumulate fp8 products in fewer bits than fp32
 * between cuBLASLt's promotions to fp32 (tests/gpu/test_cuda_gemm.c,
 * fp8_tolerance: 0.7e-4 to 1.2e-4 seen on an H200; ovl-demo saw 2.3e-4 at
 * k 512 with an e5m2 B). The host's sum is fp32 throughout (its error is
 * far below ovl_demo_tolerance's 1e-5). */
#define OVL_DEMO_FP8_FP32_TOLERANCE 5e-4

/* The error the checks accept: ovl_demo_tolerance of C's dtype (scaled
 * fp32: OVL_DEMO_FP8_FP32_TOLERANCE), twice that with fast accumulation
 * (cuBLASLt's fast fp8 accumulation is looser; the host's sum is the same
 * either way). */
static inline double ovl_demo_scaled_tolerance(const ovl_demo_scaled_t *sc, ovl_dtype_t dt)
{
    if (!sc->on)
        return ovl_demo_tolerance(dt);
    double tol = sc->out_dtype == OVL_DTYPE_FP32 ? OVL_DEMO_FP8_FP32_TOLERANCE
                                                 : ovl_demo_tolerance(sc->out_dtype);
    return sc->fast_accum ? 2 * tol : tol;
}

/* The op's dtypes in words: "fp8e4m3 x fp8e4m3 -> bf16, scales row/row,
 * bias, fast_accum" when scaled, else the dtype's name. */
static inline void ovl_demo_scaled_describe(const ovl_demo_scaled_t *sc, ovl_dtype_t dt, char *buf,
                                            size_t len)
{
    if (!sc->on) {
        snprintf(buf, len, "%s", ovl_dtype_name(dt));
        return;
    }
    snprintf(buf, len, "%s x %s -> %s, scales %s/%s%s%s", ovl_dtype_name(dt),
             ovl_dtype_name(sc->b_dtype), ovl_dtype_name(sc->out_dtype),
             ovl_scale_mode_name(sc->a_mode), ovl_scale_mode_name(sc->b_mode),
             sc->bias ? ", bias" : "", sc->fast_accum ? ", fast_accum" : "");
}

/* ------------------------------------------------ the rows checked */

/* The check covers every row of C while the reference of all of them
 * costs at most this many multiply-adds per rank, else a sample of
 * OVL_DEMO_CHECK_MIN_ROWS to OVL_DEMO_CHECK_MAX_ROWS rows
 * (ovl_demo_check_rows). */
#define OVL_DEMO_CHECK_FULL_MACS (1ull << 28)
#define OVL_DEMO_CHECK_MIN_ROWS  64
#define OVL_DEMO_CHECK_MAX_ROWS  256
/* --check-rows not given: the rule chooses */
#define OVL_DEMO_CHECK_AUTO UINT64_MAX

/* Rows of C a check covers: n of total, in ascending order; idx NULL when
 * they are all (row i is i). */
typedef struct ovl_demo_rows {
    uint64_t n, total;
    uint64_t *idx;
} ovl_demo_rows_t;

/* Row i of the rows checked (i < rows->n): its row of C. */
static inline uint64_t ovl_demo_row(const ovl_demo_rows_t *rows, uint64_t i)
{
    return rows->idx ? rows->idx[i] : i;
}

static inline void ovl_demo_rows_free(ovl_demo_rows_t *rows)
{
    free(rows->idx);
    memset(rows, 0, sizeof(*rows));
}

/* ovl_demo_check_rows' step: row r chosen (in the map), while fewer than
 * cap are. */
static inline void ovl_demo_rows_add(unsigned char *map, uint64_t r, uint64_t cap, uint64_t *n)
{
    if (*n < cap && !(map[r / 8] & (1u << (r % 8)))) {
        map[r / 8] |= (unsigned char)(1u << (r % 8));
        (*n)++;
    }
}

/*
 * The rows of C that a scaled op's check covers: the one rule of
 * ovl-demo's host and CUDA paths, for both kinds. C has nblocks blocks of
 * `block` rows (all-gather + GEMM: each rank's block of the gathered C;
 * GEMM + reduce-scatter: the rank's m rows, one block), and the reference
 * of one row costs row_macs multiply-adds. want: --check-rows, N rows (0:
 * every row) or OVL_DEMO_CHECK_AUTO: every row while all of them cost at
 * most OVL_DEMO_CHECK_FULL_MACS, else N = OVL_DEMO_CHECK_FULL_MACS /
 * row_macs, within [OVL_DEMO_CHECK_MIN_ROWS, OVL_DEMO_CHECK_MAX_ROWS].
 * chunks: the op's --chunks (0: ovld's choice).
 *
 * N at least C's rows: every row. Else a sample of at most max(N, 2
 * nblocks) rows, chosen in this order while there is room:
 *   1. every block's first and last row;
 *   2. each chunk boundary of every block (the last row of a chunk and the
 *      first of the next; boundary by boundary, each in every block), the
 *      chunks cut as ovld's planner cuts a block, ceil(block / c) rows
 *      each but the last: c the op's --chunks, or without them 2 and 4
 *      (the planner's own counts halve from 4 or 2; a configured
 *      default_chunks cannot be known here);
 *   3. rows evenly spaced over C for the room left: the middle row of
 *      each of `room` equal parts of C (row floor((2 i + 1) rows / (2
 *      room)), i < room), those not chosen yet (the count may end below
 *      the cap).
 * The same inputs give the same rows in every process. 0, or -1 (out of
 * memory).
 */
static inline int ovl_demo_check_rows(uint64_t nblocks, uint64_t block, uint64_t row_macs,
                                      uint64_t want, uint32_t chunks, ovl_demo_rows_t *rows)
{
    uint64_t total = nblocks * block, nwant = want;
    memset(rows, 0, sizeof(*rows));
    rows->n = rows->total = total;
    if (want == OVL_DEMO_CHECK_AUTO) {
        if ((double)total * (double)row_macs <= (double)OVL_DEMO_CHECK_FULL_MACS)
            return 0;
        nwant = OVL_DEMO_CHECK_FULL_MACS / (row_macs ? row_macs : 1);
        nwant = nwant < OVL_DEMO_CHECK_MIN_ROWS   ? OVL_DEMO_CHECK_MIN_ROWS
                : nwant > OVL_DEMO_CHECK_MAX_ROWS ? OVL_DEMO_CHECK_MAX_ROWS
                                                  : nwant;
    }
    if (nwant == 0 || nwant >= total)
        return 0;
    uint64_t cap = nwant > 2 * nblocks ? nwant : 2 * nblocks, n = 0;
    unsigned char *map = calloc(total / 8 + 1, 1);
    if (!map)
        return -1;
    for (uint64_t b = 0; b < nblocks; b++) { /* 1 */
        ovl_demo_rows_add(map, b * block, cap, &n);
        ovl_demo_rows_add(map, b * block + block - 1, cap, &n);
    }
    uint32_t counts[2] = {chunks ? chunks : 2, chunks ? 0 : 4}; /* 2 */
    for (int ci = 0; ci < 2 && counts[ci]; ci++) {
        uint64_t crows = block / counts[ci] + (block % counts[ci] != 0);
        for (uint64_t at = crows; at < block; at += crows)
            for (uint64_t b = 0; b < nblocks; b++) {
                ovl_demo_rows_add(map, b * block + at - 1, cap, &n);
                ovl_demo_rows_add(map, b * block + at, cap, &n);
            }
    }
    for (uint64_t i = 0, room = cap - n; i < room; i++) /* 3 */
        ovl_demo_rows_add(
            map, (uint64_t)((2.0 * (double)i + 1) * (double)total / (2.0 * (double)room)), cap, &n);
    rows->idx = malloc(n * sizeof(uint64_t));
    if (!rows->idx) {
        free(map);
        return -1;
    }
    rows->n = 0;
    for (uint64_t r = 0; r < total; r++)
        if (map[r / 8] & (1u << (r % 8)))
            rows->idx[rows->n++] = r;
    free(map);
    return 0;
}

/* ||C - ref|| / ||ref|| (Frobenius) over the rows checked: row
 * ovl_demo_row(rows, i) of C (dtype cdt, n columns at ldc) against row i
 * of ref (rows->n x n, dense); ovl_rel_error's over every row when they
 * are all, its values (INFINITY out of memory). */
static inline double ovl_demo_rows_error(ovl_dtype_t cdt, const ovl_demo_rows_t *rows, uint64_t n,
                                         const void *c, size_t ldc, const double *ref)
{
    if (!rows->idx)
        return ovl_rel_error(cdt, rows->n, n, c, ldc, ref, n);
    size_t ces = ovl_dtype_size(cdt);
    char *sel = malloc(rows->n * n * ces + 1);
    if (!sel)
        return INFINITY;
    for (uint64_t i = 0; i < rows->n; i++)
        memcpy(sel + i * n * ces, (const char *)c + rows->idx[i] * ldc * ces, n * ces);
    double err = ovl_rel_error(cdt, rows->n, n, sel, n, ref, n);
    free(sel);
    return err;
}

/* One rank's inputs of a scaled op, in host memory (ovl_demo_scaled_make):
 * A of arows x k in dt, B n x k in b_dtype, its scales and bias. */
typedef struct ovl_demo_scaled_data {
    void *a, *b, *bias;
    float *a_scale, *b_scale;
} ovl_demo_scaled_data_t;

static inline void ovl_demo_scaled_free(ovl_demo_scaled_data_t *x)
{
    free(x->a);
    free(x->b);
    free(x->bias);
    free(x->a_scale);
    free(x->b_scale);
    memset(x, 0, sizeof(*x));
}

/* x's buffers for an A of arows x k (ovl_demo_scaled_make and _rows):
 * 0, or -1 (out of memory; x freed). */
static inline int ovl_demo_scaled_alloc(const ovl_demo_scaled_t *sc, ovl_dtype_t dt, uint64_t arows,
                                        uint64_t n, uint64_t k, ovl_demo_scaled_data_t *x)
{
    memset(x, 0, sizeof(*x));
    x->a = malloc(arows * k * ovl_dtype_size(dt) + 1);
    x->b = malloc(n * k * ovl_dtype_size(sc->b_dtype) + 1);
    x->bias = malloc(n * ovl_dtype_size(sc->out_dtype) + 1);
    x->a_scale = malloc(ovl_demo_a_scales(sc, arows, k) * sizeof(float) + 1);
    x->b_scale = malloc(ovl_demo_b_scales(sc, n, k) * sizeof(float));
    if (!x->a || !x->b || !x->bias || !x->a_scale || !x->b_scale) {
        ovl_demo_scaled_free(x);
        return -1;
    }
    return 0;
}

/* Rank r's inputs rebuilt into x (malloc'ed; free with
 * ovl_demo_scaled_free): A of arows x k (dense), B, the scales of A's
 * arows rows and of B, the bias. 0, or -1 (out of memory; x freed). */
static inline int ovl_demo_scaled_make(const ovl_demo_scaled_t *sc, ovl_dtype_t dt, uint64_t arows,
                                       uint64_t n, uint64_t k, uint64_t seed, uint32_t r,
                                       ovl_demo_scaled_data_t *x)
{
    if (ovl_demo_scaled_alloc(sc, dt, arows, n, k, x) != 0)
        return -1;
    ovl_demo_fill_host(dt, x->a, arows, k, k, seed, r, 0);
    ovl_demo_fill_host(sc->b_dtype, x->b, n, k, k, seed, r, 1);
    ovl_demo_fill_a_scale(sc, x->a_scale, arows, k, seed, r);
    ovl_demo_fill_b_scale(sc, x->b_scale, n, k, seed, r);
    ovl_demo_fill_bias(sc, x->bias, n, seed, r);
    return 0;
}

/* ovl_demo_scaled_make with only some of A's rows: rows row0 +
 * ovl_demo_row(rows, i), i < rows->n, of rank r's A (of k columns, as
 * ovl_demo_fill_host numbers its elements) into x->a, dense (rows->n x
 * k), with their scales (by tensor: the one); B, its scales and the bias
 * whole. 0, or -1 (out of memory; x freed). */
static inline int ovl_demo_scaled_make_rows(const ovl_demo_scaled_t *sc, ovl_dtype_t dt,
                                            uint64_t row0, const ovl_demo_rows_t *rows, uint64_t n,
                                            uint64_t k, uint64_t seed, uint32_t r,
                                            ovl_demo_scaled_data_t *x)
{
    if (ovl_demo_scaled_alloc(sc, dt, rows->n, n, k, x) != 0)
        return -1;
    uint64_t cols = ovl_demo_a_scale_cols(sc, k);
    for (uint64_t i = 0; i < rows->n; i++) {
        uint64_t row = row0 + ovl_demo_row(rows, i);
        for (uint64_t j = 0; j < k; j++)
            ovl_store_elem(dt, x->a, i * k + j, ovl_demo_value(seed, r, 0, row * k + j));
        if (sc->a_mode != OVL_SCALE_TENSOR) /* the row's scales */
            ovl_demo_fill_a_scale_rows(sc, x->a_scale + i * cols, row, 1, k, seed, r);
    }
    if (sc->a_mode == OVL_SCALE_TENSOR)
        ovl_demo_fill_a_scale(sc, x->a_scale, 1, k, seed, r);
    ovl_demo_fill_host(sc->b_dtype, x->b, n, k, k, seed, r, 1);
    ovl_demo_fill_b_scale(sc, x->b_scale, n, k, seed, r);
    ovl_demo_fill_bias(sc, x->bias, n, seed, r);
    return 0;
}

/* The scaled GEMM of `rows` rows of A (a, dense, whose first row's
 * scales are a_scale's first, or the tensor's) by rank's B, scales and
 * bias in x, in double precision into ref (rows x n, dense):
 * ovl_ref_gemm_scaled. That takes A 1x128 in rows of fours only (the
 * rule's shapes, common/scaling.h: ovl_scaling_row_granule), which a
 * sample of rows need not be: there A is padded with zero rows (of scale
 * 1) to the next four, and the padding's rows of the product are dropped
 * (every row of ref is its own row's alone). */
static inline ovl_status_t ovl_demo_scaled_ref_gemm(const ovl_demo_scaled_t *sc, ovl_dtype_t dt,
                                                    uint64_t rows, uint64_t n, uint64_t k,
                                                    const void *a, const float *a_scale,
                                                    const ovl_demo_scaled_data_t *x, double *ref)
{
    uint64_t g = ovl_scaling_row_granule(sc->a_mode), prows = (rows + g - 1) / g * g;
    void *pa = NULL;
    float *psa = NULL;
    double *pref = NULL;
    if (prows != rows) {
        size_t es = ovl_dtype_size(dt);
        uint64_t cols = ovl_demo_a_scale_cols(sc, k);
        pa = calloc(prows * k * es + 1, 1);
        psa = malloc(prows * cols * sizeof(float));
        pref = malloc(prows * n * sizeof(double) + 1);
        if (!pa || !psa || !pref) {
            free(pa);
            free(psa);
            free(pref);
            return OVL_ERR_NOMEM;
        }
        memcpy(pa, a, rows * k * es);
        memcpy(psa, a_scale, rows * cols * sizeof(float));
        for (uint64_t e = rows * cols; e < prows * cols; e++)
            psa[e] = 1.0f;
        a = pa;
        a_scale = psa;
    }
    ovld_gemm_args_t ga = {.dtype = dt,
                           .rows = prows,
                           .n = n,
                           .k = k,
                           .nblocks = 1,
                           .a = {(void *)a, k},
                           .b = {x->b, k},
                           .transb = true,
                           .scaled = true,
                           .b_dtype = sc->b_dtype,
                           .c_dtype = sc->out_dtype,
                           .a_mode = sc->a_mode,
                           .b_mode = sc->b_mode,
                           .a_scale = a_scale,
                           .b_scale = x->b_scale,
                           .bias = sc->bias ? x->bias : NULL,
                           .fast_accum = sc->fast_accum};
    ovl_status_t st = ovl_ref_gemm_scaled(&ga, pref ? pref : ref, n);
    if (pref && st == OVL_OK)
        memcpy(ref, pref, rows * n * sizeof(double));
    free(pa);
    free(psa);
    free(pref);
    return st;
}

/*
 * All-gather + GEMM's reference on rank `rank`: every rank's A (m x k)
 * and its A scales rebuilt and gathered, the gathered A into ga (world*m x
 * k of dt, dense; the check of a_out), times this rank's B with its B
 * scales and bias, in double precision into ref: row i of ref (rows->n x
 * n, dense) is row ovl_demo_row(rows, i) of the gathered C
 * (ovl_demo_check_rows), of world*m rows:
 *   ref[i][j] = sum_q sa(r, q) * sb(j, q) * sum_{l in q} A[r][l] op(B)[l][j] + bias[j]
 * r that row, q the blocks of 128 of k (by tensor and row one block, all
 * of k), sa(r, q) the scale of gathered row r (by row and 1x128: its
 * rank's, gathered with the row; by tensor: the one every rank has),
 * sb(j, q) B's by its mode. 0, or -1 after saying why.
 */
static inline int ovl_demo_scaled_ag_reference(const ovl_demo_scaled_t *sc, ovl_dtype_t dt,
                                               uint32_t world, uint64_t m, uint64_t n, uint64_t k,
                                               uint64_t seed, uint32_t rank,
                                               const ovl_demo_rows_t *rows, void *ga, double *ref)
{
    size_t es = ovl_dtype_size(dt);
    uint64_t W = world;
    bool tensor = sc->a_mode == OVL_SCALE_TENSOR;
    uint64_t cols = ovl_demo_a_scale_cols(sc, k); /* A's scales a row */
    ovl_demo_scaled_data_t x;
    float *gsa = malloc(ovl_demo_a_scales(sc, W * m, k) * sizeof(float));
    /* a sample: its rows of the gathered A and their scales, dense */
    char *sel = rows->idx ? malloc(rows->n * k * es + 1) : NULL;
    float *ssa = rows->idx ? malloc(ovl_demo_a_scales(sc, rows->n, k) * sizeof(float) + 1) : NULL;
    if (!gsa || (rows->idx && (!sel || !ssa)) ||
        ovl_demo_scaled_make(sc, dt, m, n, k, seed, rank, &x) != 0) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        free(gsa);
        free(sel);
        free(ssa);
        return -1;
    }
    for (uint32_t q = 0; q < world; q++) {
        ovl_demo_fill_host(dt, (char *)ga + (size_t)q * m * k * es, m, k, k, seed, q, 0);
        if (!tensor || q == 0) /* by tensor the one scale, every rank's */
            ovl_demo_fill_a_scale(sc, gsa + (tensor ? 0 : q * m * cols), m, k, seed, q);
    }
    const void *a = ga;
    const float *sa = gsa;
    if (rows->idx) {
        for (uint64_t i = 0; i < rows->n; i++)
            memcpy(sel + i * k * es, (const char *)ga + rows->idx[i] * k * es, k * es);
        if (tensor)
            ssa[0] = gsa[0];
        else
            for (uint64_t i = 0; i < rows->n; i++)
                memcpy(ssa + i * cols, gsa + rows->idx[i] * cols, cols * sizeof(float));
        a = sel;
        sa = ssa;
    }
    ovl_status_t st = ovl_demo_scaled_ref_gemm(sc, dt, rows->n, n, k, a, sa, &x, ref);
    if (st != OVL_OK)
        fprintf(stderr, "rank %u: the scaled reference: %s\n", rank, ovl_strerror(st));
    free(gsa);
    free(sel);
    free(ssa);
    ovl_demo_scaled_free(&x);
    return st == OVL_OK ? 0 : -1;
}

#endif /* OVL_DEMO_SCALED_H */

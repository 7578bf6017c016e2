/*
 * demo_scaled.h: ovl-demo's scaled (fp8) ops, shared by its host and CUDA
 * paths and its references: what the options chose (ovl_demo_scaled_t),
 * the data any process rebuilds from the seed, the ovl_scaling_t of an op,
 * the tolerance, and the reference of all-gather + GEMM (GEMM +
 * reduce-scatter's is ovl_demo_rs_reference's, demo_rs_ref.h). Host code:
 * the CUDA paths make their data here and copy it to their GPU.
 *
 * The data of rank r (demo_rnd.h's hash of (seed, r, which, i)):
 *   A        matrix 0 in the op's fp8 dtype (ovl_demo_fill_host: [-1, 1)
 *            rounded to fp8), as for every dtype;
 *   B        matrix 1 in b_dtype, n x k (a scaled op takes B transposed);
 *   a_scale  fp32 in [0.5, 1): by row, row i of the rank's A gets
 *            ovl_demo_scale(seed, r, 10, i); by tensor one value, the same
 *            on every rank (r = 0 in the hash): all-gather + GEMM with a
 *            tensor scale uses each rank's own scale for every gathered
 *            row (ovl.h, ovl_scaling_t), so the ranks must agree on it;
 *   b_scale  fp32 in [0.5, 1): by row (per column j of op(B)) n values
 *            ovl_demo_scale(seed, r, 11, j), by tensor one (j = 0);
 *   bias     n values 0.5 * ovl_demo_value(seed, r, 12, j) in out_dtype.
 */
#ifndef OVL_DEMO_SCALED_H
#define OVL_DEMO_SCALED_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_rnd.h"
#include "half.h"
#include "hostgemm.h"
#include "ovl.h"

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

/* How many A scales an A of `rows` rows has (1 by tensor), and B's (of n
 * columns in op(B)). */
static inline uint64_t ovl_demo_a_scales(const ovl_demo_scaled_t *sc, uint64_t rows)
{
    return sc->a_mode == OVL_SCALE_ROW ? rows : 1;
}

static inline uint64_t ovl_demo_b_scales(const ovl_demo_scaled_t *sc, uint64_t n)
{
    return sc->b_mode == OVL_SCALE_ROW ? n : 1;
}

/* Rank r's A scales for its A of `rows` rows (ovl_demo_a_scales of them),
 * its B scales and its bias (n elements of out_dtype) into host memory. */
static inline void ovl_demo_fill_a_scale(const ovl_demo_scaled_t *sc, float *dst, uint64_t rows,
                                         uint64_t seed, uint32_t r)
{
    if (sc->a_mode != OVL_SCALE_ROW) {
        dst[0] = ovl_demo_scale(seed, 0, OVL_DEMO_WHICH_A_SCALE, 0); /* every rank's */
        return;
    }
    for (uint64_t i = 0; i < rows; i++)
        dst[i] = ovl_demo_scale(seed, r, OVL_DEMO_WHICH_A_SCALE, i);
}

static inline void ovl_demo_fill_b_scale(const ovl_demo_scaled_t *sc, float *dst, uint64_t n,
                                         uint64_t seed, uint32_t r)
{
    for (uint64_t j = 0; j < ovl_demo_b_scales(sc, n); j++)
        dst[j] = ovl_demo_scale(seed, r, OVL_DEMO_WHICH_B_SCALE, j);
}

static inline void ovl_demo_fill_bias(const ovl_demo_scaled_t *sc, void *dst, uint64_t n,
                                      uint64_t seed, uint32_t r)
{
    for (uint64_t j = 0; j < n; j++)
        ovl_store_elem(sc->out_dtype, dst, j,
                       0.5f * ovl_demo_value(seed, r, OVL_DEMO_WHICH_BIAS, j));
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

static inline const char *ovl_demo_scale_mode_name(ovl_scale_mode_t mode)
{
    return mode == OVL_SCALE_ROW ? "row" : "tensor";
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
             ovl_demo_scale_mode_name(sc->a_mode), ovl_demo_scale_mode_name(sc->b_mode),
             sc->bias ? ", bias" : "", sc->fast_accum ? ", fast_accum" : "");
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

/* Rank r's inputs rebuilt into x (malloc'ed; free with
 * ovl_demo_scaled_free): A of arows x k (dense), B, the scales of A's
 * arows rows and of B, the bias. 0, or -1 (out of memory; x freed). */
static inline int ovl_demo_scaled_make(const ovl_demo_scaled_t *sc, ovl_dtype_t dt, uint64_t arows,
                                       uint64_t n, uint64_t k, uint64_t seed, uint32_t r,
                                       ovl_demo_scaled_data_t *x)
{
    memset(x, 0, sizeof(*x));
    x->a = malloc(arows * k * ovl_dtype_size(dt) + 1);
    x->b = malloc(n * k * ovl_dtype_size(sc->b_dtype) + 1);
    x->bias = malloc(n * ovl_dtype_size(sc->out_dtype) + 1);
    x->a_scale = malloc(ovl_demo_a_scales(sc, arows) * sizeof(float));
    x->b_scale = malloc(ovl_demo_b_scales(sc, n) * sizeof(float));
    if (!x->a || !x->b || !x->bias || !x->a_scale || !x->b_scale) {
        ovl_demo_scaled_free(x);
        return -1;
    }
    ovl_demo_fill_host(dt, x->a, arows, k, k, seed, r, 0);
    ovl_demo_fill_host(sc->b_dtype, x->b, n, k, k, seed, r, 1);
    ovl_demo_fill_a_scale(sc, x->a_scale, arows, seed, r);
    ovl_demo_fill_b_scale(sc, x->b_scale, n, seed, r);
    ovl_demo_fill_bias(sc, x->bias, n, seed, r);
    return 0;
}

/* The scaled GEMM of `rows` rows of A (a, whose first row's scale is
 * a_scale's first, or the tensor's) by rank's B, scales and bias in x, in
 * double precision into ref (rows x n, dense): ovl_ref_gemm_scaled. */
static inline ovl_status_t ovl_demo_scaled_ref_gemm(const ovl_demo_scaled_t *sc, ovl_dtype_t dt,
                                                    uint64_t rows, uint64_t n, uint64_t k,
                                                    const void *a, const float *a_scale,
                                                    const ovl_demo_scaled_data_t *x, double *ref)
{
    ovld_gemm_args_t g = {.dtype = dt,
                          .rows = rows,
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
    return ovl_ref_gemm_scaled(&g, ref, n);
}

/*
 * All-gather + GEMM's reference on rank `rank`: every rank's A (m x k)
 * and its A scales rebuilt and gathered, the gathered A into ga (world*m x
 * k of dt, dense; the check of a_out), times this rank's B with its B
 * scales and bias, in double precision into ref (world*m x n, dense):
 *   ref[i][j] = sa(i) * sb(j) * sum_l A[i][l] op(B)[l][j] + bias[j]
 * sa(i) the scale of gathered row i (by row: its rank's; by tensor: the
 * one every rank has). 0, or -1 after saying why.
 */
static inline int ovl_demo_scaled_ag_reference(const ovl_demo_scaled_t *sc, ovl_dtype_t dt,
                                               uint32_t world, uint64_t m, uint64_t n, uint64_t k,
                                               uint64_t seed, uint32_t rank, void *ga, double *ref)
{
    size_t es = ovl_dtype_size(dt);
    uint64_t W = world;
    ovl_demo_scaled_data_t x;
    float *gsa = malloc(ovl_demo_a_scales(sc, W * m) * sizeof(float));
    if (!gsa || ovl_demo_scaled_make(sc, dt, m, n, k, seed, rank, &x) != 0) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        free(gsa);
        return -1;
    }
    for (uint32_t q = 0; q < world; q++) {
        ovl_demo_fill_host(dt, (char *)ga + (size_t)q * m * k * es, m, k, k, seed, q, 0);
        if (sc->a_mode == OVL_SCALE_ROW || q == 0)
            ovl_demo_fill_a_scale(sc, gsa + (sc->a_mode == OVL_SCALE_ROW ? q * m : 0), m, seed, q);
    }
    ovl_status_t st = ovl_demo_scaled_ref_gemm(sc, dt, W * m, n, k, ga, gsa, &x, ref);
    if (st != OVL_OK)
        fprintf(stderr, "rank %u: the scaled reference: %s\n", rank, ovl_strerror(st));
    free(gsa);
    ovl_demo_scaled_free(&x);
    return st == OVL_OK ? 0 : -1;
}

#endif /* OVL_DEMO_SCALED_H */

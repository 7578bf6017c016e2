/*
 * gemm_args.h: what a GEMM is given, as the backends (backend.h) and the
 * cuBLASLt wrapper (cuda_gemm.h) take it. Types only, no dependencies
 * beyond ovl.h, so that the GEMM libraries and their users (ovl-demo,
 * ovl-bench, the tests) need none of the daemon's headers.
 */
#ifndef OVLD_GEMM_ARGS_H
#define OVLD_GEMM_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ovl.h"

/* A strided row-major matrix view in the daemon's address space. */
typedef struct ovld_view {
    void *ptr;
    uint64_t ld; /* elements */
} ovld_view_t;

/* The view from row `row` of v on (elements of elem bytes). */
static inline ovld_view_t ovld_view_rows(ovld_view_t v, uint64_t row, size_t elem)
{
    return (ovld_view_t){.ptr = (char *)v.ptr + row * v.ld * elem, .ld = v.ld};
}

/* A GEMM over nblocks row blocks: for b in [0, nblocks):
 *   C[b*block_stride + i][j] = (sum_l A[b*block_stride + i][l] * op(B)[l][j]) * (1/div)
 *                              + ACC[b*block_stride + i][j]
 * for i in [0, rows); A is rows x k, op(B) k x n: alpha = 1/div, beta = 1
 * on ACC (0 without). Taken in fp32 (ACC's elements read as fp32) and
 * stored in dtype once. acc.ptr NULL: no ACC; div 0 or 1: no scaling. ACC,
 * in dtype, must not overlap C (ovl's plans never alias them; the host
 * GEMM also takes ACC == C exactly, the cuBLASLt one does not). */
typedef struct ovld_gemm_args {
    ovl_dtype_t dtype;
    uint64_t rows, n, k;
    uint32_t nblocks;
    uint64_t block_stride; /* rows between consecutive blocks, in A and C */
    ovld_view_t a, b, c;
    ovld_view_t acc; /* ptr NULL: none */
    uint32_t div;    /* 0 or 1: none */
    bool transb;
    /*
     * Scaled (fp8; ovl.h's ovl_scaling_t): A in dtype and B in b_dtype,
     * both fp8, transb; C, ACC and bias in c_dtype (bf16, fp16, fp32):
     *   C[i][j] = round_c(((sum_l A[i][l] op(B)[l][j]) * (sa(i) * sb(j))) * (1/div)
     *                     + bias[j] + ACC[i][j])
     * each step in fp32 in that order (the host GEMM's; cuBLASLt's own
     * order and accumulation differ within fp32 rounding, and more with
     * fast_accum). sa(i) = a_scale[0] (OVL_SCALE_TENSOR) or a_scale[b *
     * block_stride + i] for row i of block b (OVL_SCALE_ROW: a_scale is
     * the scale of A's first row); sb(j) = b_scale[0] or b_scale[j].
     * Block scales (ovl.h; A 1x128, B 1x128 or 128x128) scale each 128
     * of k apart: a_scale holds ceil(k/128) floats per row of A from its
     * first row on (row-major, dense), b_scale B's whole (n or ceil(n/128)
     * rows of ceil(k/128)); rows (each block's) and, with B 1x128, n
     * are multiples of 4 (common/scaling.h).
     * bias NULL: none. Not scaled: dtype is every matrix's, and the
     * fields below are unread.
     */
    bool scaled;
    ovl_dtype_t b_dtype, c_dtype;
    ovl_scale_mode_t a_mode, b_mode;
    const float *a_scale, *b_scale;
    const void *bias;
    bool fast_accum;
} ovld_gemm_args_t;

#endif /* OVLD_GEMM_ARGS_H */

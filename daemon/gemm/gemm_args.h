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
} ovld_gemm_args_t;

#endif /* OVLD_GEMM_ARGS_H */

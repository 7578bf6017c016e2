/*
 * scaling.h: the one rule of a scaled (fp8) op's scaling (ovl.h's
 * ovl_scaling_t), for every layer that takes one: libovl before it sends,
 * ovld for a client's request and a peer's, the planner, and the GEMM
 * libraries. Pure; values as they come off the wire (unchecked ranges).
 */
#ifndef OVL_SCALING_H
#define OVL_SCALING_H

#include <stdbool.h>
#include <stdint.h>

#include "ovl.h"

/*
 * Why a scaling cannot be taken, as the rule in words, or NULL when it can:
 * A (dtype) and B fp8, not both e5m2; out_dtype bf16, fp16 or fp32; modes
 * known; block scales with block scales, never A by 128x128; B transposed.
 */
const char *ovl_scaling_refusal(uint64_t dtype, uint64_t b_dtype, uint64_t out_dtype,
                                uint64_t a_mode, uint64_t b_mode, bool transb);

/*
 * Why the shapes cannot take the (known) modes, or NULL: cuBLASLt lays 1x128
 * scales out by rows, 16-byte aligned, so rows (the rows of each GEMM's A:
 * a rank's, or a block of the output's) are a multiple of 4 with A 1x128,
 * and n with B 1x128.
 */
const char *ovl_scaling_shape_refusal(uint64_t a_mode, uint64_t b_mode, uint64_t rows, uint64_t n);

/* Scale blocks along len elements: ceil(len / OVL_SCALE_BLOCK), without
 * len + 127 overflowing. */
static inline uint64_t ovl_scale_blocks(uint64_t len)
{
    return len / OVL_SCALE_BLOCK + (len % OVL_SCALE_BLOCK != 0);
}

/* The rows of A that a GEMM of a scaled op cuts in (chunks are multiples
 * of it): 4 with A 1x128 (above), else 1. */
uint64_t ovl_scaling_row_granule(uint64_t a_mode);

#endif /* OVL_SCALING_H */

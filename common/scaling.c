/*
 * scaling.c: see scaling.h; ovl_scale_shape (ovl.h).
 */
#include "scaling.h"

static bool is_fp8(uint64_t dtype)
{
    return dtype < OVL_DTYPE_COUNT && ovl_dtype_is_fp8((ovl_dtype_t)dtype);
}

static bool is_block(uint64_t mode)
{
    return mode < OVL_SCALE_MODE_COUNT && ovl_scale_mode_is_block((ovl_scale_mode_t)mode);
}

const char *ovl_scaling_refusal(uint64_t dtype, uint64_t b_dtype, uint64_t out_dtype,
                                uint64_t a_mode, uint64_t b_mode, bool transb)
{
    if (!is_fp8(dtype))
        return "a scaled op's A is fp8e4m3 or fp8e5m2";
    if (!is_fp8(b_dtype))
        return "a scaled op's B is fp8e4m3 or fp8e5m2";
    if (dtype == OVL_DTYPE_FP8_E5M2 && b_dtype == OVL_DTYPE_FP8_E5M2)
        return "fp8e5m2 times fp8e5m2: cuBLASLt has no such GEMM (one of A and B must be "
               "fp8e4m3)";
    if (out_dtype >= OVL_DTYPE_COUNT || is_fp8(out_dtype))
        return "a scaled op writes bf16, fp16 or fp32";
    if (a_mode >= OVL_SCALE_MODE_COUNT || b_mode >= OVL_SCALE_MODE_COUNT)
        return "unknown scale mode (tensor 0, row 1, 1x128 2, 128x128 3)";
    if (a_mode == OVL_SCALE_BLOCK_128X128)
        return "A's scales by 128x128 tile: not taken (ovl cuts A by rows, across ranks and "
               "chunks); A takes 1x128, one scale per row and 128 of k";
    if (is_block(a_mode) != is_block(b_mode))
        return "block scales (1x128, 128x128) go with block scales on the other operand: "
               "cuBLASLt has no GEMM that mixes them with tensor or row scales";
    if (!transb)
        return "a scaled op takes B transposed (transb: n x k, a Linear weight's layout), the "
               "one layout of cuBLASLt's fp8 GEMM";
    return NULL;
}

const char *ovl_scaling_shape_refusal(uint64_t a_mode, uint64_t b_mode, uint64_t rows, uint64_t n)
{
    if (a_mode == OVL_SCALE_BLOCK_1X128 && rows % 4)
        return "A's 1x128 scales need its rows in multiples of 4 (cuBLASLt lays each 128 of "
               "k's scales out by rows, 16-byte aligned)";
    if (b_mode == OVL_SCALE_BLOCK_1X128 && n % 4)
        return "B's 1x128 scales need n in multiples of 4 (cuBLASLt lays each 128 of k's "
               "scales out by columns of op(B), 16-byte aligned)";
    return NULL;
}

uint64_t ovl_scaling_row_granule(uint64_t a_mode)
{
    return a_mode == OVL_SCALE_BLOCK_1X128 ? 4 : 1;
}

ovl_status_t ovl_scale_shape(ovl_scale_mode_t mode, int b, uint64_t rows, uint64_t k,
                             uint64_t *ret_rows, uint64_t *ret_cols)
{
    uint64_t kq = ovl_scale_blocks(k), rq = ovl_scale_blocks(rows);

    switch (mode) {
    case OVL_SCALE_TENSOR:
        *ret_rows = *ret_cols = 1;
        return OVL_OK;
    case OVL_SCALE_ROW:
        *ret_rows = b ? 1 : rows;
        *ret_cols = b ? rows : 1;
        return OVL_OK;
    case OVL_SCALE_BLOCK_1X128:
        *ret_rows = rows;
        *ret_cols = kq;
        return OVL_OK;
    case OVL_SCALE_BLOCK_128X128:
        if (!b)
            break;
        *ret_rows = rq;
        *ret_cols = kq;
        return OVL_OK;
    }
    return OVL_ERR_INVALID;
}

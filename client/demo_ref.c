/*
 * demo_ref.c: the fp32 reference of an AG-GEMM for ovl-demo, the GPU tests
 * and ovl-bench (demo_cuda.h).
 */
#include <stdio.h>

#include "cuda_gemm.h"
#include "demo_cuda.h"

ovl_status_t ovl_demo_reference(ovld_lt_t *lt, void *ws, ovl_dtype_t dt, uint32_t world, uint64_t m,
                                uint64_t n, uint64_t k, uint64_t seed, const float *b32,
                                bool transb, void *ga, float *ga32, float *ref, cudaStream_t s,
                                char *err, size_t errlen)
{
    size_t es = ovl_dtype_size(dt);
    cudaError_t ce = cudaSuccess;
    for (uint32_t r = 0; r < world && ce == cudaSuccess; r++)
        ce = ovl_demo_fill(dt, (char *)ga + (size_t)r * m * k * es, m, k, k, seed, r, 0, s);
    if (ce == cudaSuccess)
        ce = ovl_demo_to_f32(dt, ga, (uint64_t)world * m, k, k, ga32, s);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "the reference's gathered A: %s", cudaGetErrorString(ce));
        return OVL_ERR_BACKEND;
    }
    ovld_gemm_args_t g = {.dtype = OVL_DTYPE_FP32,
                          .rows = (uint64_t)world * m,
                          .n = n,
                          .k = k,
                          .nblocks = 1,
                          .block_stride = 0,
                          .a = {ga32, k},
                          .b = {(void *)b32, transb ? k : n},
                          .c = {ref, n},
                          .transb = transb};
    char why[256];
    ovl_status_t st = ovld_lt_gemm(lt, s, ws, OVLD_LT_WORKSPACE, &g, why, sizeof(why));
    if (st != OVL_OK)
        snprintf(err, errlen, "the reference GEMM (fp32): %s: %s", ovl_strerror(st), why);
    return st;
}

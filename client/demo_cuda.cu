/*
 * demo_cuda.cu: see demo_cuda.h.
 */
#include "demo_cuda.h"
#include "demo_rnd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

__device__ static inline float load(int dt, const void *p, uint64_t i)
{
    if (dt == OVL_DTYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == OVL_DTYPE_FP16)
        return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ static inline void store(int dt, void *p, uint64_t i, float v)
{
    if (dt == OVL_DTYPE_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == OVL_DTYPE_FP16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((float *)p)[i] = v;
}

__global__ static void fill_kernel(int dt, void *p, uint64_t rows, uint64_t cols, uint64_t ld,
                                   uint64_t seed, uint32_t rank, int which)
{
    uint64_t n = rows * cols;
    for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < n;
         t += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t i = t / cols, j = t % cols;
        store(dt, p, i * ld + j, ovl_demo_value(seed, rank, which, t));
    }
}

__global__ static void to_f32_kernel(int dt, const void *src, uint64_t rows, uint64_t cols,
                                     uint64_t ld, float *dst)
{
    uint64_t n = rows * cols;
    for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < n;
         t += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t i = t / cols, j = t % cols;
        dst[t] = load(dt, src, i * ld + j);
    }
}

__global__ static void error_kernel(int dt, const void *c, uint64_t ldc, const float *ref,
                                    uint64_t rows, uint64_t cols, double *acc)
{
    double d2 = 0, r2 = 0, bad = 0;
    uint64_t n = rows * cols;
    for (uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; t < n;
         t += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t i = t / cols, j = t % cols;
        float v = load(dt, c, i * ldc + j);
        double r = ref[t];
        if (!isfinite(v))
            bad += 1;
        else
            d2 += ((double)v - r) * ((double)v - r);
        r2 += r * r;
    }
    for (int o = 16; o > 0; o >>= 1) {
        d2 += __shfl_down_sync(0xffffffffu, d2, o);
        r2 += __shfl_down_sync(0xffffffffu, r2, o);
        bad += __shfl_down_sync(0xffffffffu, bad, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&acc[0], d2);
        atomicAdd(&acc[1], r2);
        atomicAdd(&acc[2], bad);
    }
}

static unsigned blocks_for(uint64_t n)
{
    uint64_t b = (n + 255) / 256;
    return (unsigned)(b > 4096 ? 4096 : (b ? b : 1));
}

extern "C" cudaError_t ovl_demo_fill(ovl_dtype_t dt, void *p, uint64_t rows, uint64_t cols,
                                     uint64_t ld, uint64_t seed, uint32_t rank, int which,
                                     cudaStream_t s)
{
    if (ovl_dtype_is_fp8(dt)) /* load and store know 16 and 32 bits only */
        return cudaErrorInvalidValue;
    fill_kernel<<<blocks_for(rows * cols), 256, 0, s>>>((int)dt, p, rows, cols, ld, seed, rank,
                                                        which);
    return cudaGetLastError();
}

extern "C" cudaError_t ovl_demo_to_f32(ovl_dtype_t dt, const void *src, uint64_t rows,
                                       uint64_t cols, uint64_t ld, float *dst, cudaStream_t s)
{
    if (ovl_dtype_is_fp8(dt))
        return cudaErrorInvalidValue;
    to_f32_kernel<<<blocks_for(rows * cols), 256, 0, s>>>((int)dt, src, rows, cols, ld, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t ovl_demo_error_acc(ovl_dtype_t dt, const void *c, uint64_t ldc,
                                          const float *ref, uint64_t rows, uint64_t cols,
                                          double *acc, cudaStream_t s)
{
    if (ovl_dtype_is_fp8(dt))
        return cudaErrorInvalidValue;
    error_kernel<<<blocks_for(rows * cols), 256, 0, s>>>((int)dt, c, ldc, ref, rows, cols, acc);
    return cudaGetLastError();
}

extern "C" double ovl_demo_rel_error(const double acc[3])
{
    if (acc[2] > 0)
        return INFINITY;
    if (acc[1] == 0)
        return acc[0] == 0 ? 0 : INFINITY;
    return sqrt(acc[0] / acc[1]);
}

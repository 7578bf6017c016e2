/*
 * demo_rnd.h: the reproducible random numbers of ovl-demo and the GPU tests:
 * element i of matrix `which` of rank r is a hash of (seed, r, which, i), so
 * any process (and the GPU) can rebuild any rank's data. One definition, for
 * the host and for CUDA kernels; a host matrix filled with them; and the
 * error the checks accept.
 */
#ifndef OVL_DEMO_RND_H
#define OVL_DEMO_RND_H

#include <stdint.h>

#include "ovl.h"

#ifdef __CUDACC__
#define OVL_HD __host__ __device__
#else
#define OVL_HD
#endif

OVL_HD static inline uint64_t ovl_demo_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The 64 random bits of element i of matrix `which` of rank r. */
OVL_HD static inline uint64_t ovl_demo_bits(uint64_t seed, uint32_t r, int which, uint64_t i)
{
    return ovl_demo_mix(seed ^
                        ovl_demo_mix((((uint64_t)r << 8) | (uint64_t)which) ^ ovl_demo_mix(i)));
}

/* Uniform in [-1, 1). */
OVL_HD static inline float ovl_demo_value(uint64_t seed, uint32_t r, int which, uint64_t i)
{
    uint64_t x = ovl_demo_bits(seed, r, which, i);
    return (float)((double)(x >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* The largest relative error ||C - ref|| / ||ref|| the demo, the GPU tests
 * and ovl-bench accept, by dtype (fp32 accumulation throughout). */
OVL_HD static inline double ovl_demo_tolerance(ovl_dtype_t dt)
{
    return dt == OVL_DTYPE_FP32 ? 1e-5 : dt == OVL_DTYPE_FP16 ? 2e-3 : 1e-2;
}

#ifndef __CUDACC__
#include "half.h"

/* Fills rows x cols at ld (elements of dt) in host memory with
 * ovl_demo_value(seed, r, which, i * cols + j): the host's twin of
 * ovl_demo_fill (demo_cuda.h), for ovl-demo and the examples. */
static inline void ovl_demo_fill_host(ovl_dtype_t dt, void *base, uint64_t rows, uint64_t cols,
                                      uint64_t ld, uint64_t seed, uint32_t r, int which)
{
    for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < cols; j++)
            ovl_store_elem(dt, base, i * ld + j, ovl_demo_value(seed, r, which, i * cols + j));
}
#endif

#endif /* OVL_DEMO_RND_H */

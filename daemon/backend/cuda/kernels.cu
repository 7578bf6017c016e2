/*
 * kernels.cu: see kernels.h.
 */
#include "kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

__global__ void ovld_sleep_kernel(unsigned ns)
{
    /* __nanosleep takes at most ~1 ms per call; loop for longer sleeps. */
    while (ns > 1000000u) {
        __nanosleep(1000000u);
        ns -= 1000000u;
    }
    __nanosleep(ns);
}

/* The launches' errors come from cudaGetLastError, which also returns one
 * an earlier call left on the thread: cleared first, so that what they
 * report is theirs. */
extern "C" cudaError_t ovld_launch_sleep(cudaStream_t s, unsigned ns)
{
    (void)cudaGetLastError();
    ovld_sleep_kernel<<<1, 1, 0, s>>>(ns);
    return cudaGetLastError();
}

__global__ void ovld_ring_kernel(ovld_ring_args_t a)
{
    __shared__ unsigned long long seqs[OVLD_RING_SEQS], k;
    unsigned t = threadIdx.x;
    /* every slot and the count in one go: independent loads */
    if (t < OVLD_RING_SEQS)
        seqs[t] = *(volatile const unsigned long long *)&a.seqs[t];
    if (t == 0)
        k = *(volatile unsigned long long *)a.ran;
    __syncthreads();
    unsigned long long seq = seqs[k % OVLD_RING_SEQS];
    /* the op's writes (its C) before any of its doorbells */
    __threadfence_system();
    if (t < a.n) {
        char *db = (char *)a.db[t];
        *(volatile unsigned long long *)(db + a.slot_off + 8u * (unsigned)(seq % a.db_slots)) = seq;
        __threadfence_system(); /* the slot, then done: proto/doorbell.h */
        *(volatile unsigned long long *)(db + a.done_off) = seq;
    }
    __threadfence_system();
    __syncthreads();
    if (t == 0) {
        *(volatile unsigned long long *)a.own = seq;
        *(volatile unsigned long long *)a.ran = k + 1;
    }
}

extern "C" cudaError_t ovld_launch_ring(cudaStream_t s, const ovld_ring_args_t *a)
{
    /* a thread per slot, and per rank (OVLD_RING_MAX_RANKS < OVLD_RING_SEQS) */
    (void)cudaGetLastError();
    ovld_ring_kernel<<<1, OVLD_RING_SEQS, 0, s>>>(*a);
    return cudaGetLastError();
}

/* ---------------------------------------------------------- reduction */

__device__ __forceinline__ float to_f(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
__device__ __forceinline__ float to_f(__half v)
{
    return __half2float(v);
}
__device__ __forceinline__ float to_f(float v)
{
    return v;
}

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f<__half>(float v)
{
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ float from_f<float>(float v)
{
    return v;
}

/* V elements a thread: 16 bytes moved as one uint4 where V * sizeof(T)
 * is 16 (the launcher checked the alignment), else one by one. */
template <typename T, int V> struct __align__(16) vec
{
    T v[V];
};

template <typename T, int V> __device__ __forceinline__ vec<T, V> load_vec(const T *p)
{
    vec<T, V> x;
    if (V * sizeof(T) == 16) {
        *reinterpret_cast<uint4 *>(x.v) = *reinterpret_cast<const uint4 *>(p);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            x.v[k] = p[k];
    }
    return x;
}

template <typename T, int V> __device__ __forceinline__ void store_vec(T *p, const vec<T, V> &x)
{
    if (V * sizeof(T) == 16) {
        *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(x.v);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            p[k] = x.v[k];
    }
}

/* Grid-stride over the rows x (cols / V) vectors of dst. The sum starts
 * at 0 and adds block 0, 1, ... in turn, then divides: the host backend's
 * order (host_coll.c, sum_row), so that both give the same bits. */
template <typename T, int V>
__global__ void ovld_reduce_kernel(T *dst, uint64_t ldd, const T *src, uint64_t lds, uint64_t rows,
                                   uint64_t cols, uint32_t nblocks, uint64_t stride, float div)
{
    uint64_t vcols = cols / V, total = rows * vcols;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t row = i / vcols, col = (i % vcols) * V;
        float acc[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            acc[k] = 0.0f;
        for (uint32_t b = 0; b < nblocks; b++) {
            vec<T, V> x = load_vec<T, V>(src + ((uint64_t)b * stride + row) * lds + col);
#pragma unroll
            for (int k = 0; k < V; k++)
                acc[k] += to_f(x.v[k]);
        }
        vec<T, V> y;
#pragma unroll
        for (int k = 0; k < V; k++)
            y.v[k] = from_f<T>(__fdiv_rn(acc[k], div));
        store_vec<T, V>(dst + row * ldd + col, y);
    }
}

template <typename T>
static cudaError_t launch_reduce(cudaStream_t s, void *dst, uint64_t ldd, const void *src,
                                 uint64_t lds, uint64_t rows, uint64_t cols, uint32_t nblocks,
                                 uint64_t stride, uint32_t div)
{
    const int V = 16 / (int)sizeof(T);
    const unsigned threads = 256, max_blocks = 8192;
    bool wide = cols % V == 0 && ldd % V == 0 && lds % V == 0 && (uintptr_t)dst % 16 == 0 &&
                (uintptr_t)src % 16 == 0;
    uint64_t total = rows * (wide ? cols / V : cols);
    if (total == 0)
        return cudaSuccess;
    uint64_t want = (total + threads - 1) / threads;
    unsigned blocks = want < max_blocks ? (unsigned)want : max_blocks;
    (void)cudaGetLastError();
    if (wide)
        ovld_reduce_kernel<T, V><<<blocks, threads, 0, s>>>(
            (T *)dst, ldd, (const T *)src, lds, rows, cols, nblocks, stride, (float)div);
    else
        ovld_reduce_kernel<T, 1><<<blocks, threads, 0, s>>>(
            (T *)dst, ldd, (const T *)src, lds, rows, cols, nblocks, stride, (float)div);
    return cudaGetLastError();
}

extern "C" cudaError_t ovld_launch_reduce(cudaStream_t s, ovl_dtype_t dtype, void *dst,
                                          uint64_t ldd, const void *src, uint64_t lds,
                                          uint64_t rows, uint64_t cols, uint32_t nblocks,
                                          uint64_t stride, uint32_t div)
{
    switch (dtype) {
    case OVL_DTYPE_BF16:
        return launch_reduce<__nv_bfloat16>(s, dst, ldd, src, lds, rows, cols, nblocks, stride,
                                            div);
    case OVL_DTYPE_FP16:
        return launch_reduce<__half>(s, dst, ldd, src, lds, rows, cols, nblocks, stride, div);
    case OVL_DTYPE_FP32:
        return launch_reduce<float>(s, dst, ldd, src, lds, rows, cols, nblocks, stride, div);
    case OVL_DTYPE_FP8_E4M3: /* partials are never fp8 (plans sum in the output dtype) */
    case OVL_DTYPE_FP8_E5M2:
        break;
    }
    return cudaErrorInvalidValue;
}

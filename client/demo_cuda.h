/*
 * demo_cuda.h: GPU helpers for ovl-demo, the GPU tests and ovl-bench:
 * reproducible random data made on the GPU (the same values in every process
 * for a given seed, rank and matrix, so that a rank can rebuild its peers'
 * shards), a reference GEMM through cuBLASLt in fp32, and the relative error
 * of a result against it. All work goes on the given stream. The dtypes
 * are bf16, fp16 and fp32: an fp8 one is refused (cudaErrorInvalidValue,
 * nothing launched); ovl-demo makes a scaled op's fp8 data on the host
 * (demo_scaled.h) and copies it.
 */
#ifndef OVL_DEMO_CUDA_H
#define OVL_DEMO_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "ovl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills rows x cols at ld (elements of dtype) with ovl_demo_value(seed,
 * rank, which, i * cols + j) (demo_rnd.h). */
cudaError_t ovl_demo_fill(ovl_dtype_t dt, void *p, uint64_t rows, uint64_t cols, uint64_t ld,
                          uint64_t seed, uint32_t rank, int which, cudaStream_t s);

/* Converts rows x cols of dtype at ld into a dense fp32 matrix (ld = cols). */
cudaError_t ovl_demo_to_f32(ovl_dtype_t dt, const void *src, uint64_t rows, uint64_t cols,
                            uint64_t ld, float *dst, cudaStream_t s);

/*
 * acc[0] += sum over rows x cols of (c - ref)^2, acc[1] += sum of ref^2,
 * acc[2] += count of non-finite c; acc is device memory of 3 doubles (zero it
 * first). c is dtype at ldc, ref dense fp32.
 */
cudaError_t ovl_demo_error_acc(ovl_dtype_t dt, const void *c, uint64_t ldc, const float *ref,
                               uint64_t rows, uint64_t cols, double *acc, cudaStream_t s);

/* acc (host copy) -> ||c - ref|| / ||ref|| (INFINITY if any c was not finite). */
double ovl_demo_rel_error(const double acc[3]);

/*
 * The fp32 reference C = [A_0; ...; A_(world-1)] @ op(B) on stream s: every
 * rank's A shard (m x k of dt, as ovl_demo_fill makes it for seed and that
 * rank) is rebuilt into ga (world*m x k of dt) and converted into ga32, then
 * multiplied by b32 (B in fp32, dense: k x n, or n x k with transb) by
 * cuBLASLt in fp32 into ref (world*m x n, dense). Every buffer is device
 * memory of the caller's; ws is a workspace of OVLD_LT_WORKSPACE bytes.
 * A failure is said in err.
 */
struct ovld_lt;
ovl_status_t ovl_demo_reference(struct ovld_lt *lt, void *ws, ovl_dtype_t dt, uint32_t world,
                                uint64_t m, uint64_t n, uint64_t k, uint64_t seed, const float *b32,
                                bool transb, void *ga, float *ga32, float *ref, cudaStream_t s,
                                char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

/* In a rank's code (a `rank` in scope, an `out:` label for its cleanup):
 * a failed CUDA call is reported with the rank and the call, then goes to
 * out. */
#define OVL_DEMO_CK(call)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "rank %u: %s: %s\n", rank, #call, cudaGetErrorString(e_));             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#endif /* OVL_DEMO_CUDA_H */

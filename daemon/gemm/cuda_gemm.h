/*
 * cuda_gemm.h: GEMMs through cuBLASLt for the CUDA backend (and the
 * benchmark's unfused baseline, so that both time the same library call).
 *
 * Row-major, as ovl's ops: C[rows x n] = A[rows x k] @ op(B), op(B) = B
 * (k x n, ldb >= n) or B^T (B stored n x k, ldb >= k), batched over nblocks
 * row blocks block_stride rows apart in A and C (B shared). bf16 and fp16
 * with fp32 accumulation, fp32 in plain fp32 (no TF32). One matmul
 * descriptor, layouts and the heuristic's algorithm are cached per shape,
 * leading dimensions, batch and pointer alignment: a chunk of a buffer may be
 * less aligned than its base, and an algorithm chosen for 256-byte alignment
 * may not run on 16.
 */
#ifndef OVLD_CUDA_GEMM_H
#define OVLD_CUDA_GEMM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "gemm_args.h"
#include "ovl.h"

#define OVLD_LT_WORKSPACE (32u << 20) /* per stream; what cuBLAS recommends on Hopper */

typedef struct ovld_lt ovld_lt_t;

#ifdef __cplusplus
extern "C" {
#endif

/* One per device; call with that device current. */
ovl_status_t ovld_lt_create(ovld_lt_t **ret, char *err, size_t errlen);
void ovld_lt_destroy(ovld_lt_t *lt);

/*
 * Enqueues the GEMM on stream s (whose device must be current), with a
 * workspace of workspace_bytes (may be 0). Host-side only: no
 * synchronization. OVL_ERR_INVALID for bad arguments, OVL_ERR_UNSUPPORTED
 * when no algorithm fits, OVL_ERR_BACKEND naming the failed cuBLASLt call in
 * err.
 */
ovl_status_t ovld_lt_gemm(ovld_lt_t *lt, cudaStream_t s, void *workspace, size_t workspace_bytes,
                          const ovld_gemm_args_t *g, char *err, size_t errlen);

/* Entries in the cache (for stats and tests). */
size_t ovld_lt_cache_size(const ovld_lt_t *lt);

#ifdef __cplusplus
}
#endif

#endif /* OVLD_CUDA_GEMM_H */

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
 *
 * Scaled (fp8) GEMMs, as gemm_args.h defines them: A and B fp8 (e4m3 x
 * e4m3, e4m3 x e5m2 or e5m2 x e4m3; not e5m2 x e5m2), transb (B stored
 * n x k: cuBLASLt's fp8 GEMMs are "TN" only on Hopper), C, ACC and bias in
 * bf16, fp16 or fp32, tensor-wide or per-row scales on either side or
 * block scales (A 1x128 with B 1x128 or 128x128: cuBLASLt's VEC128_32F and
 * BLK128x128_32F, the scales moved into cuBLASLt's layouts in workspace
 * scratch), fp32 accumulation (with fast_accum, cuBLASLt's faster, less
 * exact one; ignored with block scales).
 * cuBLAS's documentation wants of fp8 GEMMs what it lists for tensor cores:
 * pointers (A, B, C, ACC) 16-byte aligned, leading dimensions 16-byte
 * multiples, k a multiple of 16 and C's rows (n elements) a 16-byte
 * multiple; where cuBLASLt then offers no algorithm the call answers
 * OVL_ERR_UNSUPPORTED (k 40 is refused so, for one). What cuBLASLt 13.1
 * refuses beyond that is worked around (cuda_gemm.c says how), and some of
 * the work-arounds take scratch from the end of the workspace: a
 * tensor-wide scale beside a per-row one (4 * (rows or n) bytes, and as
 * many of ones), a bias for fp32 C (4 bytes per row of the blocks' span),
 * scale or bias pointers under 16-byte aligned (copied), and block scales
 * (A's 4 * ceil(k/128) bytes per row of every block; B's 4 * n *
 * ceil(k/128) by 1x128, 4 * ceil(n/128) * (ceil(k/128) rounded up to 4)
 * by 128x128), each part rounded up to 256 bytes; without that much workspace such a call answers
 * OVL_ERR_UNSUPPORTED. They also add plain fp32 GEMMs of their own (up to
 * three cache entries for one call), and per-row scales with several blocks
 * run one matmul per block.
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
 * synchronization. OVL_ERR_INVALID for bad arguments (before any GPU work:
 * for a scaled GEMM also A or B not fp8, both e5m2, C fp8 or unknown, no
 * transb, a NULL scale, an unknown scale mode; an fp8 dtype unscaled),
 * OVL_ERR_UNSUPPORTED when no algorithm fits (or a scaled GEMM's scratch
 * does not), OVL_ERR_BACKEND naming the failed cuBLASLt or CUDA call in err.
 */
ovl_status_t ovld_lt_gemm(ovld_lt_t *lt, cudaStream_t s, void *workspace, size_t workspace_bytes,
                          const ovld_gemm_args_t *g, char *err, size_t errlen);

/* Entries in the cache (for stats and tests). */
size_t ovld_lt_cache_size(const ovld_lt_t *lt);

#ifdef __cplusplus
}
#endif

#endif /* OVLD_CUDA_GEMM_H */

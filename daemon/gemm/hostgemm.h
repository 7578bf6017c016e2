/*
 * hostgemm.h: the host backend's GEMM, and the double-precision reference
 * that tests and the demo check results against. Pure code: no I/O, no
 * logging, no global state; every function is safe to call from several
 * threads at once.
 *
 * All matrices are row-major with leading dimensions in elements:
 *   a    rows x k            (lda >= k)
 *   b    k x n, transb == 0  (ldb >= n)
 *        n x k, transb != 0  (ldb >= k), used as its transpose
 *   c    rows x n            (ldc >= n)
 */
#ifndef OVL_HOSTGEMM_H
#define OVL_HOSTGEMM_H

#include <stddef.h>
#include <stdint.h>

#include "gemm_args.h"
#include "ovl.h"

/*
 * C = A @ op(B), inputs and output in `dtype`. Products are accumulated in
 * fp32 and each element of C is rounded to dtype once, as a GPU GEMM with
 * fp32 accumulation does. Only the rows x n elements of C are written; the
 * padding of each row (columns n..ldc-1) is left as it was.
 *
 * Returns OVL_ERR_INVALID for an unknown dtype or an fp8 one (fp8 is only
 * ever an input of a scaled GEMM, ovl_host_gemm_args, never an output), a
 * leading dimension smaller than its row length (checked even when the
 * matrix is empty), a NULL matrix that has elements, or a matrix whose
 * extent overflows size_t;
 * OVL_ERR_NOMEM when scratch cannot be had. rows == 0 or n == 0: nothing to
 * do, OVL_OK. k == 0 with rows, n > 0: C is set to zero.
 *
 * Scratch is malloc'ed per call: at most 1 KiB per unit of k (a panel of B
 * packed as fp32) plus at most 65 KiB.
 */
ovl_status_t ovl_host_gemm(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k, const void *a,
                           size_t lda, const void *b, size_t ldb, int transb, void *c, size_t ldc);

/*
 * C = A @ op(B) * (1/div) + ACC: as ovl_host_gemm, the fp32 sum scaled by
 * the float 1/div (div 0 or 1: not scaled; as cuBLASLt's alpha) and ACC
 * (rows x n in dtype, ldacc >= n; NULL: none) added in fp32 before C's one
 * rounding. acc may be c itself (ldacc == ldc). ovl_host_gemm is this with
 * acc NULL and div 1. OVL_ERR_INVALID also for ldacc < n or an acc whose
 * extent overflows.
 */
ovl_status_t ovl_host_gemm_acc(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k,
                               const void *a, size_t lda, const void *b, size_t ldb, int transb,
                               const void *acc, size_t ldacc, uint32_t div, void *c, size_t ldc);

/*
 * The same product computed in double precision from the dtype inputs, into
 * ref (rows x n, ldref >= n). A plain triple loop: for checking, not speed.
 * Same argument checks and return codes as ovl_host_gemm (ref counts as C).
 */
ovl_status_t ovl_ref_gemm(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k, const void *a,
                          size_t lda, const void *b, size_t ldb, int transb, double *ref,
                          size_t ldref);

/*
 * A whole ovld_gemm_args_t, as a backend is given it (gemm_args.h has the
 * definition): its nblocks row blocks in order b = 0, 1, ..., ACC, div, and
 * scaled or not. Each panel of op(B) is packed once for all blocks.
 *
 * Not scaled: each block gives bit for bit what ovl_host_gemm_acc gives for
 * it (the same code), so an fp8 dtype is refused as there.
 *
 * Scaled: the fp8 elements are decoded to fp32 exactly and every product of
 * two of them is exact in fp32, so the sum depends only on its order, which
 * is fixed (and is what a test reproduces bit for bit): for each element of
 * C, with p(l) = A[i][l] * op(B)[l][j] in fp32,
 *   s = 0; l = 0;
 *   while (l + 4 <= k) { s = s + (((p(l) + p(l+1)) + p(l+2)) + p(l+3)); l += 4; }
 *   while (l < k) { s = s + p(l); l++; }
 * then, each a separate fp32 operation in this order (the definition's
 * steps; none is fused into an FMA: each is a statement of its own, and in
 * ISO C mode gcc contracts nothing):
 *   x = s * (sa(i) * sb(j)); x = x * (1.0f / div) (only for div > 1);
 *   x = x + bias[j] (bias given); x = x + ACC[i][j] (ACC given);
 *   C[i][j] = x rounded to c_dtype, to nearest even.
 * Block scales (ovl.h) sum each block q of 128 of k as s above, s(q) over
 * l in [128 q, min(128 q + 128, k)), and then, from x = 0, for q = 0, 1, ...
 *   y = s(q) * (sa(i, q) * sb(j, q)); x = x + y;
 * and go on from x as above without the first step. sa(i, q) =
 * a_scale[i' * ceil(k/128) + q] with i' the row counted from A's first
 * (b * block_stride + i), sb(j, q) = b_scale[j * ceil(k/128) + q] (1x128)
 * or b_scale[(j / 128) * ceil(k/128) + q] (128x128).
 * fast_accum is not read: the host has one accumulation.
 *
 * OVL_ERR_INVALID for g NULL; scaled with dtype or b_dtype not fp8, both
 * e5m2 (cuBLASLt has no e5m2 x e5m2 kernel), c_dtype not bf16, fp16 or
 * fp32, modes that common/scaling.h's ovl_scaling_refusal refuses or rows
 * and n its ovl_scaling_shape_refusal does, a NULL a_scale or b_scale, or
 * !transb (cuBLASLt's one fp8 layout: the host takes what the GPU takes, so
 * that a plan that runs here runs there); otherwise as ovl_host_gemm_acc, with each
 * matrix's own element size (A dtype's, B b_dtype's, C's and ACC's
 * c_dtype's when scaled) and the rows A, C and ACC span over all blocks
 * ((nblocks - 1) * block_stride + rows). nblocks, rows or n 0: nothing is
 * written. Scratch as ovl_host_gemm's.
 */
ovl_status_t ovl_host_gemm_args(const ovld_gemm_args_t *g);

/*
 * The scaled GEMM g describes, in double precision: for every row r =
 * b * block_stride + i of every block b and every j < n,
 *   ref[r * ldref + j] = (sum_l sa(r, l) * sb(j, l) * A[r][l] op(B)[l][j]) / div
 *                        + bias[j] + ACC[r][j]
 * (sa(r, l) the scale of A's row r at column l of k by its mode, one,
 * per row or per 128 of k; sb(j, l) B's likewise)
 * with the fp8 and c_dtype elements decoded exactly and everything else in
 * double (div 0 or 1: no division; bias or ACC NULL: not added), so that
 * what ovl_host_gemm_args differs by is its fp32 steps' rounding and C's.
 * ref takes
 * the place of C (g->c is not read; the rows between blocks are not
 * written). A plain loop: for checking, not speed. Same checks and return
 * codes as ovl_host_gemm_args with ref as C (ldref >= n), and
 * OVL_ERR_INVALID for g not scaled (ovl_ref_gemm is the unscaled
 * reference).
 */
ovl_status_t ovl_ref_gemm_scaled(const ovld_gemm_args_t *g, double *ref, size_t ldref);

/*
 * ||C - ref||_F / ||ref||_F over the rows x n elements, C in dtype.
 * Returns 0 when both are zero (and for an empty matrix), INFINITY when any
 * element of C or ref is NaN or infinite, when ref is zero but C is not, or
 * when the arguments are invalid (unknown dtype, NULL, ldc or ldref < n): a
 * caller testing `err < tolerance` then fails.
 */
double ovl_rel_error(ovl_dtype_t dtype, uint64_t rows, uint64_t n, const void *c, size_t ldc,
                     const double *ref, size_t ldref);

#endif /* OVL_HOSTGEMM_H */

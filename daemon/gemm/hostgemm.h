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

#include "ovl.h"

/*
 * C = A @ op(B), inputs and output in `dtype`. Products are accumulated in
 * fp32 and each element of C is rounded to dtype once, as a GPU GEMM with
 * fp32 accumulation does. Only the rows x n elements of C are written; the
 * padding of each row (columns n..ldc-1) is left as it was.
 *
 * Returns OVL_ERR_INVALID for an unknown dtype, a leading dimension smaller
 * than its row length (checked even when the matrix is empty), a NULL matrix
 * that has elements, or a matrix whose extent overflows size_t;
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
 * ||C - ref||_F / ||ref||_F over the rows x n elements, C in dtype.
 * Returns 0 when both are zero (and for an empty matrix), INFINITY when any
 * element of C or ref is NaN or infinite, when ref is zero but C is not, or
 * when the arguments are invalid (unknown dtype, NULL, ldc or ldref < n): a
 * caller testing `err < tolerance` then fails.
 */
double ovl_rel_error(ovl_dtype_t dtype, uint64_t rows, uint64_t n, const void *c, size_t ldc,
                     const double *ref, size_t ldref);

#endif /* OVL_HOSTGEMM_H */

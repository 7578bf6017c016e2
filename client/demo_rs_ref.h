/*
 * demo_rs_ref.h: the reference of GEMM + reduce-scatter that ovl-demo --op
 * rs and the example of a job across nodes check their C against
 * (demo_rs_ref.c), on the host for either backend.
 */
#ifndef OVL_DEMO_RS_REF_H
#define OVL_DEMO_RS_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "demo_scaled.h"
#include "ovl.h"

/* The op and its data: every rank's A is (world*m) x k (matrix 0 of the
 * rank, demo_rnd.h) and its B k x n, n x k with transb (matrix 1); each
 * rank keeps m rows of the sum. Scaled (sc.on; zero: not): dtype is A's
 * fp8, B is n x k in sc.b_dtype, and each rank's product has its scales
 * and bias (demo_scaled.h: A scales of its world*m rows). */
typedef struct ovl_demo_rs_shape {
    ovl_dtype_t dtype;
    uint32_t world;
    uint64_t m, n, k;
    bool transb;
    ovl_reduce_op_t reduce_op;
    uint64_t seed;
    ovl_demo_scaled_t sc;
} ovl_demo_rs_shape_t;

/* rank's m rows of the sum over every rank q of A_q @ op(B_q) (divided by
 * the world for avg), each rank's A and B regenerated from the seed, in
 * double precision, into ref (m x n). Scaled, each rank's term is
 * sa_q(i) * sb_q(j) * (A_q @ op(B_q))[i][j] + bias_q[j] over rows i of
 * rank's block (A_q's rows [rank m, (rank+1) m) and their scales), the
 * sum divided by the world for avg. 0, or -1 after saying why. */
int ovl_demo_rs_reference(const ovl_demo_rs_shape_t *s, uint32_t rank, double *ref);

/* ovl_demo_rs_reference over some of rank's m rows: row i of ref
 * (rows->n x n, dense) is row ovl_demo_row(rows, i) of rank's (the rows
 * ovl_demo_check_rows chose of m). rows NULL, or every row:
 * ovl_demo_rs_reference's. A sample is a scaled op's only (unscaled: -1
 * after saying so); its reference rebuilds only the sampled rows of each
 * rank's A. 0, or -1 after saying why. */
int ovl_demo_rs_reference_rows(const ovl_demo_rs_shape_t *s, uint32_t rank,
                               const ovl_demo_rows_t *rows, double *ref);

#endif /* OVL_DEMO_RS_REF_H */

/*
 * demo_rs_ref.c: see demo_rs_ref.h. Every rank's A and B regenerated from
 * the seed (demo_rnd.h), the rank's rows of the sum of their products in
 * double precision; a scaled (fp8) op's with its scales and bias
 * (demo_scaled.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_rnd.h"
#include "demo_rs_ref.h"
#include "hostgemm.h"

/* The scaled op's reference (o->sc.on) over rows of rank's m (all of
 * them, or a sample): each rank's scaled product of those rows, with its
 * bias, summed (ovl_demo_rs_reference's rules). */
static int scaled_reference(const ovl_demo_rs_shape_t *o, uint32_t rank,
                            const ovl_demo_rows_t *rows, double *ref)
{
    const ovl_demo_scaled_t *sc = &o->sc;
    ovl_dtype_t dt = o->dtype;
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k, nr = rows->n;
    double *part = malloc(nr * n * sizeof(double) + 1);
    int rc = -1;
    if (!part) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        return -1;
    }
    memset(ref, 0, nr * n * sizeof(double));
    for (uint32_t q = 0; q < W; q++) {
        ovl_demo_scaled_data_t x;
        /* rank q's product of this rank's block: its rows and their
         * scales; a sample's rows alone */
        uint64_t row0 = (uint64_t)rank * m;
        int made = rows->idx ? ovl_demo_scaled_make_rows(sc, dt, row0, rows, n, k, o->seed, q, &x)
                             : ovl_demo_scaled_make(sc, dt, W * m, n, k, o->seed, q, &x);
        if (made != 0) {
            fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
            goto out;
        }
        const void *a = x.a;
        const float *sa = x.a_scale;
        if (!rows->idx) {
            a = (char *)x.a + row0 * k * ovl_dtype_size(dt);
            /* by tensor the one; by row and 1x128 the block's rows' */
            sa += sc->a_mode == OVL_SCALE_TENSOR ? 0 : row0 * ovl_demo_a_scale_cols(sc, k);
        }
        ovl_status_t st = ovl_demo_scaled_ref_gemm(sc, dt, nr, n, k, a, sa, &x, part);
        ovl_demo_scaled_free(&x);
        if (st != OVL_OK) {
            fprintf(stderr, "rank %u: the scaled reference: %s\n", rank, ovl_strerror(st));
            goto out;
        }
        for (uint64_t i = 0; i < nr * n; i++)
            ref[i] += part[i];
    }
    if (o->reduce_op == OVL_REDUCE_AVG)
        for (uint64_t i = 0; i < nr * n; i++)
            ref[i] /= (double)W;
    rc = 0;
out:
    free(part);
    return rc;
}

int ovl_demo_rs_reference_rows(const ovl_demo_rs_shape_t *o, uint32_t rank,
                               const ovl_demo_rows_t *rows, double *ref)
{
    if (!rows || !rows->idx)
        return ovl_demo_rs_reference(o, rank, ref);
    if (!o->sc.on) {
        fprintf(stderr, "rank %u: the reference of a sample of rows is a scaled op's\n", rank);
        return -1;
    }
    return scaled_reference(o, rank, rows, ref);
}

int ovl_demo_rs_reference(const ovl_demo_rs_shape_t *o, uint32_t rank, double *ref)
{
    if (o->sc.on) {
        ovl_demo_rows_t all = {.n = o->m, .total = o->m, .idx = NULL};
        return scaled_reference(o, rank, &all, ref);
    }
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    uint64_t brows = o->transb ? n : k, bcols = o->transb ? k : n;
    void *a = malloc(W * m * k * es), *b = malloc(brows * bcols * es);
    double *part = malloc(m * n * sizeof(double));
    int rc = -1;
    if (!a || !b || !part) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        goto out;
    }
    memset(ref, 0, m * n * sizeof(double));
    for (uint32_t q = 0; q < W; q++) {
        ovl_demo_fill_host(dt, a, W * m, k, k, o->seed, q, 0);
        ovl_demo_fill_host(dt, b, brows, bcols, bcols, o->seed, q, 1);
        /* rank q's product, rows of this rank's block only */
        ovl_status_t st = ovl_ref_gemm(dt, m, n, k, (char *)a + rank * m * k * es, k, b, bcols,
                                       o->transb, part, n);
        if (st != OVL_OK) {
            fprintf(stderr, "rank %u: reference: %s\n", rank, ovl_strerror(st));
            goto out;
        }
        for (uint64_t i = 0; i < m * n; i++)
            ref[i] += part[i];
    }
    if (o->reduce_op == OVL_REDUCE_AVG)
        for (uint64_t i = 0; i < m * n; i++)
            ref[i] /= (double)W;
    rc = 0;
out:
    free(a);
    free(b);
    free(part);
    return rc;
}

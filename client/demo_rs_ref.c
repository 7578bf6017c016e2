/*
 * demo_rs_ref.c: see demo_rs_ref.h. Every rank's A and B regenerated from
 * the seed (demo_rnd.h), the rank's rows of the sum of their products in
 * double precision.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_rnd.h"
#include "demo_rs_ref.h"
#include "hostgemm.h"

int ovl_demo_rs_reference(const ovl_demo_rs_shape_t *o, uint32_t rank, double *ref)
{
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

/*
 * ovl_demo_cuda_rs.c: one rank of ovl-demo --op rs (GEMM + reduce-scatter)
 * on the CUDA backend. The rank's A and B are made on the host from the
 * shared seed (demo_rnd.h, as on the host backend) and copied to its GPU;
 * the ops run on its own stream; its C is copied back and compared with
 * ovl_demo_rs_reference_rows, the sum of every rank's product in double
 * precision (a CPU loop: the demo's shapes, not the bench's), over the
 * rows ovl_demo_rows_of chose (a scaled op's: a sample where all of them
 * would cost too much). A scaled (fp8) op's scales and bias are made on
 * the host too (demo_scaled.h) and copied into device memory of their
 * own.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "demo_cuda.h"
#include "demo_rnd.h"
#include "hostgemm.h"
#include "ovl_demo.h"

int ovl_demo_rank_cuda_rs(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t **comm,
                          result_t *res)
{
    int rc = 1, ndev = 0;
    const ovl_demo_scaled_t *sc = &o->sc;
    ovl_dtype_t dt = o->dtype, bdt = ovl_demo_b_dtype(sc, dt), cdt = ovl_demo_c_dtype(sc, dt);
    size_t es = ovl_dtype_size(dt), bes = ovl_dtype_size(bdt), ces = ovl_dtype_size(cdt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    uint64_t brows = o->transb ? n : k, bcols = o->transb ? k : n;
    /* --strided: A and C inside wider matrices, whose extra columns hold a
     * pattern that must survive */
    uint64_t lda = o->strided ? k + 3 : k, ldc = o->strided ? n + 5 : n;
    size_t a_bytes = W * m * lda * es, b_bytes = brows * bcols * bes, c_bytes = m * ldc * ces;
    /* scaled: the scales of A's world*m rows, B's, the bias */
    size_t sa_bytes = ovl_demo_a_scales(sc, W * m, k) * sizeof(float);
    size_t sb_bytes = ovl_demo_b_scales(sc, n, k) * sizeof(float), bias_bytes = n * ces;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    void *a = NULL, *b = NULL, *c = NULL, *ha = NULL, *hb = NULL, *hc = NULL;
    void *sa = NULL, *sb = NULL, *bias = NULL;
    double *ref = NULL;
    ovl_demo_rows_t rows = {0}; /* of C, checked */
    ovl_scaling_t scaling = {0};
    ovl_demo_scaled_data_t x = {0}; /* scaled: the host's scales and bias */

    OVL_DEMO_CK(cudaGetDeviceCount(&ndev));
    int dev = (int)(rank % (uint32_t)ndev);
    OVL_DEMO_CK(cudaSetDevice(dev));
    if (ovl_comm_init(cl, o->job, o->world, rank, dev, comm) != OVL_OK) {
        fprintf(stderr, "rank %u: joining job '%s' on GPU %d: %s\n", rank, o->job, dev,
                ovl_last_error(cl));
        goto out;
    }
    OVL_DEMO_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OVL_DEMO_CK(cudaEventCreate(&e0));
    OVL_DEMO_CK(cudaEventCreate(&e1));
    ha = malloc(a_bytes);
    hb = malloc(b_bytes);
    hc = malloc(c_bytes);
    ref = ovl_demo_rows_of(o, &rows) == 0 ? malloc(rows.n * n * sizeof(double)) : NULL;
    if (!ha || !hb || !hc || !ref) {
        fprintf(stderr, "rank %u: out of memory\n", rank);
        goto out;
    }
    memset(ha, 0x5a, a_bytes);
    ovl_demo_fill_host(dt, ha, W * m, k, lda, o->seed, rank, 0);
    ovl_demo_fill_host(bdt, hb, brows, bcols, bcols, o->seed, rank, 1);
    ovl_demo_rs_shape_t sh = ovl_demo_rs_shape(o);
    if (ovl_demo_rs_reference_rows(&sh, rank, &rows, ref) != 0)
        goto out;
    OVL_DEMO_CK(cudaMalloc(&a, a_bytes));
    OVL_DEMO_CK(cudaMalloc(&b, b_bytes));
    OVL_DEMO_CK(cudaMalloc(&c, c_bytes));
    OVL_DEMO_CK(cudaMemcpyAsync(a, ha, a_bytes, cudaMemcpyHostToDevice, s));
    OVL_DEMO_CK(cudaMemcpyAsync(b, hb, b_bytes, cudaMemcpyHostToDevice, s));
    OVL_DEMO_CK(cudaStreamSynchronize(s));
    if (sc->on) { /* the scales and bias: made on the host, copied */
        if (ovl_demo_scaled_make(sc, dt, W * m, n, k, o->seed, rank, &x) != 0) {
            fprintf(stderr, "rank %u: out of memory\n", rank);
            goto out;
        }
        OVL_DEMO_CK(cudaMalloc(&sa, sa_bytes));
        OVL_DEMO_CK(cudaMalloc(&sb, sb_bytes));
        if (sc->bias)
            OVL_DEMO_CK(cudaMalloc(&bias, bias_bytes));
        OVL_DEMO_CK(cudaMemcpy(sa, x.a_scale, sa_bytes, cudaMemcpyHostToDevice));
        OVL_DEMO_CK(cudaMemcpy(sb, x.b_scale, sb_bytes, cudaMemcpyHostToDevice));
        if (bias)
            OVL_DEMO_CK(cudaMemcpy(bias, x.bias, bias_bytes, cudaMemcpyHostToDevice));
        scaling = ovl_demo_scaling(sc, sa, sb, bias);
    }

    for (int ai = 0; ai < o->nalgos; ai++) {
        result_t *rs = &res[ai];
        rs->algo = o->algos[ai];
        ovl_gemm_rs_desc_t d = ovl_demo_rs_desc(o, ai, a, lda, b, c, ldc);
        d.scaling = sc->on ? &scaling : NULL;
        /* One op untimed first: plans, scratch and communicators are made
         * on first use. Then the pattern past C's columns, NaN in C, and
         * the timed ops. */
        ovl_status_t st = ovl_gemm_reduce_scatter(*comm, &d, s);
        OVL_DEMO_CK(cudaMemsetAsync(c, 0xa5, c_bytes, s));
        OVL_DEMO_CK(cudaMemset2DAsync(c, ldc * ces, 0xff, n * ces, m, s));
        OVL_DEMO_CK(cudaEventRecord(e0, s));
        if (st == OVL_OK)
            st = ovl_demo_submit_loop(*comm, (ovl_demo_op_t){.rs = &d}, s, o->iters, o->timing, rs);
        OVL_DEMO_CK(cudaEventRecord(e1, s));
        if (st == OVL_OK)
            OVL_DEMO_CK(cudaStreamSynchronize(s));
        if (st == OVL_OK)
            st = ovl_comm_check(*comm);
        rs->status = st;
        rs->a_out_ok = true;
        if (st != OVL_OK) {
            snprintf(rs->msg, sizeof(rs->msg), "%s", ovl_last_error(cl));
            rs->rel_err = rs->rel_err_b[0] = INFINITY;
            break; /* the comm's error is sticky: later runs would say the same */
        }
        float ms = 0;
        OVL_DEMO_CK(cudaEventElapsedTime(&ms, e0, e1));
        rs->ms = ms / o->iters;
        OVL_DEMO_CK(cudaMemcpy(hc, c, c_bytes, cudaMemcpyDeviceToHost));
        rs->rel_err = rs->rel_err_b[0] = ovl_demo_rows_error(cdt, &rows, n, hc, ldc, ref);
        for (uint64_t i = 0; i < m && ldc > n; i++)
            for (uint64_t j = n * ces; j < ldc * ces; j++)
                if (((unsigned char *)hc)[i * ldc * ces + j] != 0xa5) {
                    rs->a_out_ok = false; /* the row says: "wrote past C's columns" */
                    i = m;
                    break;
                }
        if (o->timing && (st = ovl_demo_paced_submits(*comm, (ovl_demo_op_t){.rs = &d}, s, o->iters,
                                                      rs)) != OVL_OK) {
            rs->status = st;
            snprintf(rs->msg, sizeof(rs->msg), "paced submits: %s", ovl_last_error(cl));
            break;
        }
    }
    rc = 0;
out:
    if (s)
        cudaStreamSynchronize(s);
    /* ovld unmaps the buffers before they are freed: first its ops, then them */
    if (*comm)
        (void)ovl_comm_synchronize(*comm);
    void *bufs[] = {a, b, c, sa, sb, bias};
    for (int i = 0; i < 6; i++) {
        ovl_mem_t *mem;
        if (bufs[i] && ovl_mem_register(cl, bufs[i], 1, &mem) == OVL_OK)
            (void)ovl_mem_deregister(cl, mem);
        cudaFree(bufs[i]);
    }
    ovl_demo_scaled_free(&x);
    ovl_demo_rows_free(&rows);
    free(ha);
    free(hb);
    free(hc);
    free(ref);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    return rc;
}

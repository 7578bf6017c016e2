/*
 * ovl_demo_cuda.c: one rank of ovl-demo on the CUDA backend. The rank's
 * data is made on its GPU (demo_cuda.cu), the ops run on its own stream, and
 * each C (one per B) is compared with a cuBLASLt fp32 product of the same
 * inputs: every rank's shard is rebuilt locally from the shared seed. A
 * scaled (fp8) op's data is made on the host (demo_scaled.h) and copied to
 * the GPU, and its C is copied back and compared with the host's
 * double-precision reference (rank_scaled) over the rows its check covers
 * (ovl_demo_rows_of: a sample where all of them would cost too much).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "cudrv.h"
#include "demo_cuda.h"
#include "ovl_demo.h"

/* 256-byte aligned offsets, plus an odd 256-byte step when asked: pointers
 * inside one allocation, as PyTorch's caching allocator hands them out. */
static size_t place(size_t *cursor, size_t bytes, bool interior)
{
    size_t at = (*cursor + 255) / 256 * 256 + (interior ? 256 * 3 : 0);
    *cursor = at + bytes;
    return at;
}

int ovl_demo_cuda_devices(uint32_t rank)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess) {
        fprintf(stderr, "rank %u: cudaGetDeviceCount: %s\n", rank, ovl_cuda_why(ce));
        return 0;
    }
    if (ndev <= 0)
        fprintf(stderr, "rank %u: ovld runs the CUDA backend, but this process sees no GPU\n",
                rank);
    return ndev > 0 ? ndev : 0;
}

/*
 * A scaled (fp8) op's algorithms on stream s, events e0 and e1 timing them:
 * A, B, C, the scales, the bias and a_out placed in one allocation
 * (*ret_arena, which the caller deregisters and frees once the comm's ops
 * are done), A, B, the scales and the bias made on the host and copied
 * there; each algorithm's C (and a_out) copied back and compared with
 * ovl_demo_scaled_ag_reference over the rows ovl_demo_rows_of chose. 0 if
 * it ran (results in res), 1 if it could not.
 */
static int rank_scaled(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t *comm,
                       cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, char **ret_arena,
                       result_t *res)
{
    const ovl_demo_scaled_t *sc = &o->sc;
    ovl_dtype_t dt = o->dtype, cdt = sc->out_dtype;
    size_t es = ovl_dtype_size(dt), bes = ovl_dtype_size(sc->b_dtype), ces = ovl_dtype_size(cdt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    size_t a_bytes = m * k * es, b_bytes = n * k * bes, c_bytes = W * m * n * ces;
    size_t o_bytes = W * m * k * es, sa_bytes = ovl_demo_a_scales(sc, m, k) * sizeof(float);
    size_t sb_bytes = ovl_demo_b_scales(sc, n, k) * sizeof(float), bias_bytes = n * ces;
    ovl_demo_scaled_data_t x;
    ovl_demo_rows_t rows = {0}; /* of C, checked */
    void *ga = NULL, *hc = NULL, *ho = NULL;
    double *ref = NULL;
    int rc = 1;

    /* A, B, C, the scales, the bias, then a_out */
    size_t cur = 0;
    size_t off_a = place(&cur, a_bytes, o->interior), off_b = place(&cur, b_bytes, o->interior);
    size_t off_c = place(&cur, c_bytes, o->interior), off_sa = place(&cur, sa_bytes, o->interior);
    size_t off_sb = place(&cur, sb_bytes, o->interior);
    size_t off_bias = place(&cur, bias_bytes, o->interior);
    size_t off_o = o->a_out ? place(&cur, o_bytes, o->interior) : 0;
    if (ovl_demo_scaled_make(sc, dt, m, n, k, o->seed, rank, &x) != 0) {
        fprintf(stderr, "rank %u: out of memory\n", rank);
        return 1;
    }
    ga = malloc(o_bytes);
    hc = malloc(c_bytes);
    ho = o->a_out ? malloc(o_bytes) : NULL;
    ref = ovl_demo_rows_of(o, &rows) == 0 ? malloc(rows.n * n * sizeof(double)) : NULL;
    if (!ga || !hc || (o->a_out && !ho) || !ref) {
        fprintf(stderr, "rank %u: out of memory\n", rank);
        goto out;
    }
    if (ovl_demo_scaled_ag_reference(sc, dt, o->world, m, n, k, o->seed, rank, &rows, ga, ref) != 0)
        goto out;
    OVL_DEMO_CK(cudaMalloc((void **)ret_arena, cur + (o->interior ? 4096 : 0)));
    char *arena = *ret_arena;
    void *a = arena + off_a, *b = arena + off_b, *c = arena + off_c;
    void *aout = o->a_out ? arena + off_o : NULL;
    float *sa = (float *)(arena + off_sa), *sb = (float *)(arena + off_sb);
    void *bias = arena + off_bias;
    OVL_DEMO_CK(cudaMemcpy(a, x.a, a_bytes, cudaMemcpyHostToDevice));
    OVL_DEMO_CK(cudaMemcpy(b, x.b, b_bytes, cudaMemcpyHostToDevice));
    OVL_DEMO_CK(cudaMemcpy(sa, x.a_scale, sa_bytes, cudaMemcpyHostToDevice));
    OVL_DEMO_CK(cudaMemcpy(sb, x.b_scale, sb_bytes, cudaMemcpyHostToDevice));
    OVL_DEMO_CK(cudaMemcpy(bias, x.bias, bias_bytes, cudaMemcpyHostToDevice));
    ovl_scaling_t scaling = ovl_demo_scaling(sc, sa, sb, bias);

    for (int ai = 0; ai < o->nalgos; ai++) {
        result_t *rs = &res[ai];
        rs->algo = o->algos[ai];
        ovl_ag_gemm_desc_t d = ovl_demo_desc(o, ai, a, b, c, aout, NULL);
        d.scaling = &scaling;
        /* one op untimed, then NaN in the outputs and the timed ops */
        ovl_status_t st = ovl_allgather_gemm(comm, &d, s);
        OVL_DEMO_CK(cudaMemsetAsync(c, 0xff, c_bytes, s));
        if (aout)
            OVL_DEMO_CK(cudaMemsetAsync(aout, 0xff, o_bytes, s));
        OVL_DEMO_CK(cudaEventRecord(e0, s));
        if (st == OVL_OK)
            st = ovl_demo_submit_loop(comm, (ovl_demo_op_t){.ag = &d}, s, o->iters, o->timing, rs);
        OVL_DEMO_CK(cudaEventRecord(e1, s));
        if (st == OVL_OK)
            OVL_DEMO_CK(cudaStreamSynchronize(s));
        if (st == OVL_OK)
            st = ovl_comm_check(comm);
        rs->status = st;
        if (st != OVL_OK) {
            snprintf(rs->msg, sizeof(rs->msg), "%s", ovl_last_error(cl));
            rs->rel_err = rs->rel_err_b[0] = INFINITY;
            break; /* the comm's error is sticky: later runs would say the same */
        }
        float ms = 0;
        OVL_DEMO_CK(cudaEventElapsedTime(&ms, e0, e1));
        rs->ms = ms / o->iters;
        OVL_DEMO_CK(cudaMemcpy(hc, c, c_bytes, cudaMemcpyDeviceToHost));
        rs->rel_err = rs->rel_err_b[0] = ovl_demo_rows_error(cdt, &rows, n, hc, n, ref);
        rs->a_out_ok = true;
        if (aout) {
            OVL_DEMO_CK(cudaMemcpy(ho, aout, o_bytes, cudaMemcpyDeviceToHost));
            rs->a_out_ok = memcmp(ho, ga, o_bytes) == 0; /* a copy: exact */
        }
        if (o->timing && (st = ovl_demo_paced_submits(comm, (ovl_demo_op_t){.ag = &d}, s, o->iters,
                                                      rs)) != OVL_OK) {
            rs->status = st;
            snprintf(rs->msg, sizeof(rs->msg), "paced submits: %s", ovl_last_error(cl));
            break;
        }
    }
    rc = 0;
out:
    ovl_demo_scaled_free(&x);
    ovl_demo_rows_free(&rows);
    free(ga);
    free(hc);
    free(ho);
    free(ref);
    return rc;
}

int ovl_demo_rank_cuda(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t **comm,
                       result_t *res)
{
    int rc = 1, ndev = 0;
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, k = o->k;
    uint64_t lda = k, ldo = k;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    char *arena = NULL, *ga = NULL;
    float *ga32 = NULL, *b32 = NULL;
    float *ref[OVL_MAX_BS] = {NULL}; /* C i's reference */
    double *acc = NULL;
    ovld_lt_t *lt = NULL;
    void *ws = NULL;

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
    if (o->sc.on) {
        rc = rank_scaled(o, rank, cl, *comm, s, e0, e1, &arena, res);
        goto out;
    }

    /* A, B 0, C 0, then B i and C i of each further B, then a_out */
    size_t cur = 0, off_b[OVL_MAX_BS], off_c[OVL_MAX_BS], b32_elems = 0;
    size_t off_a = place(&cur, m * lda * es, o->interior);
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i);
        off_b[i] = place(&cur, k * n * es, o->interior); /* k x n, or n x k: dense either way */
        off_c[i] = place(&cur, W * m * n * es, o->interior);
        b32_elems = k * n > b32_elems ? k * n : b32_elems;
    }
    size_t off_o = o->a_out ? place(&cur, W * m * ldo * es, o->interior) : 0;
    OVL_DEMO_CK(cudaMalloc((void **)&arena, cur + (o->interior ? 4096 : 0)));
    void *a = arena + off_a, *b[OVL_MAX_BS] = {NULL}, *c[OVL_MAX_BS] = {NULL};
    ovl_ag_gemm_b_t more[OVL_MAX_BS - 1]; /* B 1 .. of the op */
    for (uint32_t i = 0; i < o->nb; i++) {
        b[i] = arena + off_b[i];
        c[i] = arena + off_c[i];
        if (i > 0)
            more[i - 1] = ovl_demo_b(o, i, b[i], c[i]);
    }
    void *aout = o->a_out ? arena + off_o : NULL;
    OVL_DEMO_CK(ovl_demo_fill(dt, a, m, k, lda, o->seed, rank, 0, s));

    /* The references: C i = [A_0; ...; A_(W-1)] @ op(B i) in fp32, from the
     * same dtype values the ranks hold; B i is matrix 1 + i of the rank, as
     * on the host. b32 holds one B at a time: the stream orders its uses. */
    OVL_DEMO_CK(cudaMalloc((void **)&ga, W * m * k * es));
    OVL_DEMO_CK(cudaMalloc((void **)&ga32, W * m * k * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&b32, b32_elems * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&acc, 3 * sizeof(double)));
    OVL_DEMO_CK(cudaMalloc(&ws, OVLD_LT_WORKSPACE));
    char err[256];
    if (ovld_lt_create(&lt, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "rank %u: %s\n", rank, err);
        goto out;
    }
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i), ldb = o->transb ? k : n;
        uint64_t brows = o->transb ? n : k, bcols = o->transb ? k : n;
        OVL_DEMO_CK(cudaMalloc((void **)&ref[i], W * m * n * sizeof(float)));
        OVL_DEMO_CK(ovl_demo_fill(dt, b[i], brows, bcols, ldb, o->seed, rank, 1 + (int)i, s));
        OVL_DEMO_CK(ovl_demo_to_f32(dt, b[i], brows, bcols, ldb, b32, s));
        if (ovl_demo_reference(lt, ws, dt, W, m, n, k, o->seed, b32, o->transb, ga, ga32, ref[i], s,
                               err, sizeof(err)) != OVL_OK) {
            fprintf(stderr, "rank %u: B %u: %s\n", rank, i, err);
            goto out;
        }
    }
    OVL_DEMO_CK(cudaStreamSynchronize(s));

    for (int ai = 0; ai < o->nalgos; ai++) {
        result_t *rs = &res[ai];
        rs->algo = o->algos[ai];
        ovl_ag_gemm_desc_t d = ovl_demo_desc(o, ai, a, b[0], c[0], aout, more);
        /* One op untimed first: plans, scratch, communicators and cuBLASLt's
         * choices are made on first use. Then poison the outputs and time. */
        ovl_status_t st = ovl_allgather_gemm(*comm, &d, s);
        for (uint32_t i = 0; i < o->nb; i++) /* NaN: unwritten shows */
            OVL_DEMO_CK(cudaMemsetAsync(c[i], 0xff, W * m * ovl_demo_bn(o, i) * es, s));
        if (aout)
            OVL_DEMO_CK(cudaMemsetAsync(aout, 0xff, W * m * ldo * es, s));
        OVL_DEMO_CK(cudaEventRecord(e0, s));
        if (st == OVL_OK)
            st = ovl_demo_submit_loop(*comm, (ovl_demo_op_t){.ag = &d}, s, o->iters, o->timing, rs);
        OVL_DEMO_CK(cudaEventRecord(e1, s));
        if (st == OVL_OK)
            OVL_DEMO_CK(cudaStreamSynchronize(s));
        if (st == OVL_OK)
            st = ovl_comm_check(*comm);
        rs->status = st;
        if (st != OVL_OK) {
            snprintf(rs->msg, sizeof(rs->msg), "%s", ovl_last_error(cl));
            rs->rel_err = INFINITY;
            for (uint32_t i = 0; i < o->nb; i++)
                rs->rel_err_b[i] = INFINITY;
            break;
        }
        float ms = 0;
        OVL_DEMO_CK(cudaEventElapsedTime(&ms, e0, e1));
        rs->ms = ms / o->iters;
        double h[3];
        rs->rel_err = 0;
        for (uint32_t i = 0; i < o->nb; i++) {
            uint64_t n = ovl_demo_bn(o, i);
            OVL_DEMO_CK(cudaMemsetAsync(acc, 0, sizeof(h), s));
            OVL_DEMO_CK(ovl_demo_error_acc(dt, c[i], n, ref[i], W * m, n, acc, s));
            OVL_DEMO_CK(cudaMemcpyAsync(h, acc, sizeof(h), cudaMemcpyDeviceToHost, s));
            OVL_DEMO_CK(cudaStreamSynchronize(s));
            rs->rel_err_b[i] = ovl_demo_rel_error(h);
            if (!(rs->rel_err_b[i] <= rs->rel_err)) /* NaN counts as worse */
                rs->rel_err = rs->rel_err_b[i];
        }
        rs->a_out_ok = true;
        if (aout) {
            OVL_DEMO_CK(cudaMemsetAsync(acc, 0, sizeof(h), s));
            OVL_DEMO_CK(ovl_demo_error_acc(dt, aout, ldo, ga32, W * m, k, acc, s));
            OVL_DEMO_CK(cudaMemcpyAsync(h, acc, sizeof(h), cudaMemcpyDeviceToHost, s));
            OVL_DEMO_CK(cudaStreamSynchronize(s));
            rs->a_out_ok = ovl_demo_rel_error(h) == 0; /* a copy: exact */
        }
        if (o->timing && (st = ovl_demo_paced_submits(*comm, (ovl_demo_op_t){.ag = &d}, s, o->iters,
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
    /* ovld unmaps the arena before it is freed: first its ops, then it. */
    if (*comm)
        (void)ovl_comm_synchronize(*comm);
    ovl_mem_t *mem;
    if (arena && ovl_mem_register(cl, arena, 1, &mem) == OVL_OK)
        (void)ovl_mem_deregister(cl, mem);
    if (lt)
        ovld_lt_destroy(lt);
    cudaFree(ws);
    cudaFree(acc);
    for (uint32_t i = 0; i < OVL_MAX_BS; i++)
        cudaFree(ref[i]);
    cudaFree(b32);
    cudaFree(ga32);
    cudaFree(ga);
    cudaFree(arena); /* after the comm's ops are done: the caller destroys the comm after */
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    return rc;
}

/*
 * ovl_demo.h: what ovl-demo's host and CUDA paths share (ovl_demo.c,
 * ovl_demo_cuda.c).
 */
#ifndef OVL_DEMO_H
#define OVL_DEMO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#include "demo_rs_ref.h"
#include "ovl.h"

#define MAX_ALGOS 4

typedef struct opts {
    const char *socket;
    char job[64];
    uint32_t world;
    uint64_t m, n, k;
    ovl_dtype_t dtype;
    /* An fp8 dtype (-d fp8e4m3, fp8e5m2) makes every op scaled: B's dtype,
     * C's, the scale modes, bias and fast_accum (demo_scaled.h; transb is
     * implied) */
    ovl_demo_scaled_t sc;
    /* --check-rows: the rows of each rank's C a scaled op's check covers
     * (0: all; OVL_DEMO_CHECK_AUTO: ovl_demo_check_rows chooses) */
    uint64_t check_rows;
    ovl_algo_t algos[MAX_ALGOS + 1];
    int nalgos;
    int iters;
    uint32_t chunks, streams;
    bool transb, a_out;
    bool interior; /* CUDA: buffers inside one larger allocation, at odd offsets */
    uint64_t seed;
    /* Bs of every op: nb (1..OVL_MAX_BS), B 0 of n columns, B i (i >= 1)
     * of more_n[i-1]; C i = allgather(A) @ op(B i). */
    uint32_t nb;
    uint64_t more_n[OVL_MAX_BS - 1];
    bool timing; /* time each submit call (--timing) */
    /* --op: OVL_OP_AG_GEMM (ag), or OVL_OP_GEMM_RS (rs): every rank's A is
     * (world*m) x k and its C m x n, rows [rank m, (rank+1) m) of the sum
     * over the ranks of A @ op(B), or of its average (reduce_op). */
    ovl_op_kind_t op;
    ovl_reduce_op_t reduce_op;
    bool strided; /* rs: A and C inside wider matrices (--strided) */
    /* --idle: every rank only joins the job, stays this many seconds (or
     * until SIGTERM) and leaves; 0: a normal run. */
    uint32_t idle_s;
    pid_t parent; /* the ranks' parent (set before they are made) */
} opts_t;

/* What each rank reports for one algorithm. */
typedef struct result {
    int algo;
    int status;           /* ovl_status_t of the run */
    double ms;            /* mean per op, over iters */
    double submit_p50_us; /* --timing: the host time of one submit call, */
    double submit_p99_us; /* back to back (waits at the window included) */
    double paced_p50_us;  /* --timing: the same, never more than PACE ahead */
    double paced_p99_us;
    double rel_err;               /* the worst of rel_err_b */
    double rel_err_b[OVL_MAX_BS]; /* C i's, against its reference */
    bool a_out_ok;
    char msg[160];
} result_t;

/* B i's n. */
static inline uint64_t ovl_demo_bn(const opts_t *o, uint32_t i)
{
    return i == 0 ? o->n : o->more_n[i - 1];
}

/* B i (i >= 1) of the op: dense as B 0 (n x k with transb), its own n,
 * into C i. */
static inline ovl_ag_gemm_b_t ovl_demo_b(const opts_t *o, uint32_t i, const void *b, void *c)
{
    uint64_t n = ovl_demo_bn(o, i);
    ovl_ag_gemm_b_t mb = {.b = b, .ldb = o->transb ? o->k : n, .c = c, .ldc = n, .n = n};
    return mb;
}

/* The op descriptor of the demo's shapes: dense leading dimensions (B is
 * n x k with transb), algorithm number ai of the options; more: B 1 ..
 * B nb-1 (ovl_demo_b), unread for one B. A scaled op's caller sets
 * .scaling (ovl_demo_scaling). */
static inline ovl_ag_gemm_desc_t ovl_demo_desc(const opts_t *o, int ai, const void *a,
                                               const void *b, void *c, void *aout,
                                               const ovl_ag_gemm_b_t *more)
{
    ovl_ag_gemm_desc_t d = {.a = a,
                            .lda = o->k,
                            .b = b,
                            .ldb = o->transb ? o->k : o->n,
                            .transb = o->transb,
                            .c = c,
                            .ldc = o->n,
                            .a_out = aout,
                            .lda_out = o->k,
                            .m = o->m,
                            .n = o->n,
                            .k = o->k,
                            .dtype = o->dtype,
                            .algo = o->algos[ai],
                            .chunks = o->chunks,
                            .streams = o->streams,
                            .nb = o->nb,
                            .more_bs = o->nb > 1 ? more : NULL};
    return d;
}

/* Runs one rank on the CUDA backend: fills its data on its GPU, runs every
 * algorithm, checks against a cuBLASLt reference. 0 if it ran (results in
 * res), 1 if it could not. Without CUDA it says so and returns 1. */
int ovl_demo_rank_cuda(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t **comm,
                       result_t *res);

/* --op rs on the CUDA backend (ovl_demo_cuda_rs.c): every algorithm, each
 * rank's C checked against ovl_demo_rs_reference. 0 if it ran (results in
 * res), 1 if it could not. */
int ovl_demo_rank_cuda_rs(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t **comm,
                          result_t *res);

/* --op rs's descriptor, algorithm number ai of the options: A (world*m x
 * k, leading dimension lda) and C (m x n, ldc) as the rank laid them out,
 * B dense (n x k with transb). A scaled op's caller sets .scaling
 * (ovl_demo_scaling). */
static inline ovl_gemm_rs_desc_t ovl_demo_rs_desc(const opts_t *o, int ai, const void *a,
                                                  uint64_t lda, const void *b, void *c,
                                                  uint64_t ldc)
{
    ovl_gemm_rs_desc_t d = {.a = a,
                            .lda = lda,
                            .b = b,
                            .ldb = o->transb ? o->k : o->n,
                            .transb = o->transb,
                            .c = c,
                            .ldc = ldc,
                            .m = (uint64_t)o->world * o->m,
                            .n = o->n,
                            .k = o->k,
                            .dtype = o->dtype,
                            .reduce_op = o->reduce_op,
                            .algo = o->algos[ai],
                            .chunks = o->chunks,
                            .streams = o->streams};
    return d;
}

/* --op rs's reference (demo_rs_ref.h) for o's op. */
static inline ovl_demo_rs_shape_t ovl_demo_rs_shape(const opts_t *o)
{
    return (ovl_demo_rs_shape_t){.dtype = o->dtype,
                                 .world = o->world,
                                 .m = o->m,
                                 .n = o->n,
                                 .k = o->k,
                                 .transb = o->transb,
                                 .reduce_op = o->reduce_op,
                                 .seed = o->seed,
                                 .sc = o->sc};
}

/* The rows of each rank's C that o's check covers (ovl_demo_check_rows,
 * the one rule): a scaled op's, all-gather + GEMM's the world blocks of m
 * rows of the gathered C (each row n k multiply-adds), GEMM +
 * reduce-scatter's the rank's m rows (each the sum of world products of n
 * k); an unscaled op's every row. Free with ovl_demo_rows_free. 0, or -1
 * (out of memory). */
static inline int ovl_demo_rows_of(const opts_t *o, ovl_demo_rows_t *rows)
{
    bool rs = o->op == OVL_OP_GEMM_RS;
    uint64_t nblocks = rs ? 1 : o->world, row_macs = o->n * o->k * (rs ? o->world : 1);
    return ovl_demo_check_rows(nblocks, o->m, row_macs, o->sc.on ? o->check_rows : 0, o->chunks,
                               rows);
}

/* The GPUs this process sees (CUDA_VISIBLE_DEVICES applies): the ordinals a
 * rank on the CUDA backend names when it joins. 0 (with a message) if there
 * are none or CUDA cannot say; 0 without CUDA. */
int ovl_demo_cuda_devices(uint32_t rank);

static inline int ovl_demo_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The p50 and p99 of ns[0..n) in us, into *p50, *p99 (0 if n is 0). */
static inline void ovl_demo_percentiles(uint64_t *ns, int n, double *p50, double *p99)
{
    *p50 = *p99 = 0;
    if (n <= 0)
        return;
    qsort(ns, (size_t)n, sizeof(*ns), ovl_demo_cmp_u64);
    *p50 = (double)ns[(n - 1) / 2] / 1e3;
    *p99 = (double)ns[(size_t)((n - 1) * 0.99)] / 1e3;
}

static inline uint64_t ovl_demo_elapsed_ns(const struct timespec *t0, const struct timespec *t1)
{
    return (uint64_t)(t1->tv_sec - t0->tv_sec) * 1000000000u + (uint64_t)t1->tv_nsec -
           (uint64_t)t0->tv_nsec;
}

/* One op of either kind, as the loops below submit it: ag's descriptor,
 * or rs's (the other NULL). */
typedef struct ovl_demo_op {
    const ovl_ag_gemm_desc_t *ag;
    const ovl_gemm_rs_desc_t *rs;
} ovl_demo_op_t;

static inline ovl_status_t ovl_demo_submit(ovl_comm_t *comm, ovl_demo_op_t d, void *stream)
{
    return d.ag ? ovl_allgather_gemm(comm, d.ag, stream)
                : ovl_gemm_reduce_scatter(comm, d.rs, stream);
}

/* Submits d iters times back to back on stream (NULL: the host backend's
 * none), until the first failure. With timing, the p50 and p99 of each
 * call's host time (the submit call alone) go into rs (0 without): where
 * ovld or the GPU is slower than the calls, that includes waiting at the
 * submit window. */
static inline ovl_status_t ovl_demo_submit_loop(ovl_comm_t *comm, ovl_demo_op_t d, void *stream,
                                                int iters, bool timing, result_t *rs)
{
    uint64_t *ns = timing ? (uint64_t *)malloc((size_t)iters * sizeof(*ns)) : NULL;
    ovl_status_t st = OVL_OK;
    int done = 0;
    for (; done < iters && st == OVL_OK; done++) {
        struct timespec t0, t1;
        if (ns)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        st = ovl_demo_submit(comm, d, stream);
        if (ns) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            ns[done] = ovl_demo_elapsed_ns(&t0, &t1);
        }
    }
    ovl_demo_percentiles(ns, ns ? done : 0, &rs->submit_p50_us, &rs->submit_p99_us);
    free(ns);
    return st;
}

/* Ops submitted at most this far ahead of the done ones in the paced pass:
 * far below any submit window (ovld's max_ops_in_flight, 64 by default). */
#define OVL_DEMO_PACE 8

/*
 * The call's own cost: d submitted iters times, waiting on the host
 * (ovl_comm_synchronize, outside the timed calls) after every
 * OVL_DEMO_PACE, so that no call waits at the window; the p50 and p99 of
 * each call's host time go into rs->paced_*. Every rank runs it (the ops
 * are the job's).
 */
static inline ovl_status_t ovl_demo_paced_submits(ovl_comm_t *comm, ovl_demo_op_t d, void *stream,
                                                  int iters, result_t *rs)
{
    uint64_t *ns = (uint64_t *)malloc((size_t)iters * sizeof(*ns));
    if (!ns)
        return OVL_ERR_NOMEM;
    ovl_status_t st = OVL_OK;
    int done = 0;
    for (; done < iters && st == OVL_OK; done++) {
        if (done % OVL_DEMO_PACE == 0 && (st = ovl_comm_synchronize(comm)) != OVL_OK)
            break;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = ovl_demo_submit(comm, d, stream);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns[done] = ovl_demo_elapsed_ns(&t0, &t1);
    }
    if (st == OVL_OK)
        st = ovl_comm_synchronize(comm);
    ovl_demo_percentiles(ns, done, &rs->paced_p50_us, &rs->paced_p99_us);
    free(ns);
    return st;
}

#endif /* OVL_DEMO_H */

/*
 * test_cuda_gemm.c: ovld_lt_gemm (daemon/gemm/cuda_gemm.c) against a
 * double-precision host reference, on GPU 0.
 *
 * Every case fills A and B (padding included) with random values from a
 * fixed seed, poisons all of C's buffer with 0xFF bytes (NaN in every dtype),
 * runs the GEMM, and checks the relative Frobenius error of the computed
 * elements and that every other byte of C's buffer is still 0xFF. Each case
 * runs twice: the second call must find its cache entry (the cache does not
 * grow) and give a correct result too.
 *
 * Cases: every dtype x transb x rows {1, 3, 17, 256} x n {1, 5, 64, 333} x
 * k {1, 7, 64, 300} with tight leading dimensions; then per dtype x transb,
 * batches (3 blocks with gaps between them, and back to back), chunks at an
 * odd row of buffers with odd leading dimensions (A, B and C aligned to one
 * element only), the same at 16 bytes (rows an odd multiple of 16 bytes),
 * pointers one element into rows with aligned leading dimensions, batches
 * whose later blocks are so aligned, k == 0 (C must be zeroed) and no
 * workspace.
 * Last, argument checks that need no GPU work, and more distinct GEMMs than
 * the cache holds.
 *
 * Without a GPU it prints "SKIP: no GPU" and exits 77, ctest's skip code.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "cudrv.h"
#include "half.h"
#include "ovl.h"
#include "demo_rnd.h"

#define SKIP_CODE 77

typedef struct tcase {
    ovl_dtype_t dtype;
    int transb;
    uint64_t rows, n, k;
    uint32_t nblocks;
    uint64_t block_stride;        /* used when nblocks > 1 */
    uint64_t lda, ldb, ldc;       /* 0: tight (k, n or k, n) */
    uint64_t a_off, b_off, c_off; /* rows of the buffer before the matrix's row 0 */
    uint64_t shift;               /* then elements into that row (ld >= cols + shift) */
    bool no_ws;                   /* run without a workspace */
    const char *tag;
} tcase_t;

static int g_pass, g_fail;
static uint64_t g_rng = 0x0123456789abcdefull;
static void *g_ws; /* OVLD_LT_WORKSPACE bytes on the device */

/* xorshift64*: a fixed sequence on every machine. */
static double rnd_unit(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 0x2545f4914f6cdd1dull;
    return (double)(r >> 11) * 0x1p-53 * 2.0 - 1.0; /* [-1, 1) */
}

static uint64_t odd_ld(uint64_t x)
{
    return x % 2 ? x + 2 : x + 1;
}

/* The smallest ld >= x whose rows are an odd multiple of 16 bytes long: a
 * chunk at an odd row is then aligned to exactly 16 bytes, the least that
 * vector loads and Hopper's TMA accept. */
static uint64_t ld16(uint64_t x, ovl_dtype_t dtype)
{
    uint64_t per = 16 / ovl_dtype_size(dtype);
    uint64_t m = (x + per - 1) / per;
    return (m % 2 ? m : m + 1) * per;
}

/* An ld >= x + 1 that is a multiple of 64 elements: with shift 1, pointers
 * are misaligned (one element) while every ld is well aligned. */
static uint64_t ld64(uint64_t x)
{
    return (x + 1 + 63) / 64 * 64;
}

static void report(bool ok, const tcase_t *tc, double err, const char *why)
{
    printf("%s %-10s %s transb=%d rows=%llu n=%llu k=%llu nblocks=%u stride=%llu "
           "ld=%llu/%llu/%llu off=%llu/%llu/%llu+%llu%s err=%.3g%s%s\n",
           ok ? "PASS" : "FAIL", tc->tag, ovl_dtype_name(tc->dtype), tc->transb,
           (unsigned long long)tc->rows, (unsigned long long)tc->n, (unsigned long long)tc->k,
           tc->nblocks, (unsigned long long)tc->block_stride, (unsigned long long)tc->lda,
           (unsigned long long)tc->ldb, (unsigned long long)tc->ldc, (unsigned long long)tc->a_off,
           (unsigned long long)tc->b_off, (unsigned long long)tc->c_off,
           (unsigned long long)tc->shift, tc->no_ws ? " no-ws" : "", err, why ? ": " : "",
           why ? why : "");
    fflush(stdout);
    if (ok)
        g_pass++;
    else
        g_fail++;
}

/* The rows between consecutive blocks in A and C, also for one block. */
static uint64_t step_of(const tcase_t *tc)
{
    return tc->nblocks > 1 ? tc->block_stride : tc->rows;
}

/*
 * Checks C's buffer (host copy) against the reference: returns the relative
 * Frobenius error of the computed elements (INFINITY on NaN) and counts the
 * bytes outside them that are not 0xFF.
 */
static double check_c(const tcase_t *tc, const unsigned char *hc, uint64_t c_rows,
                      const double *ref, size_t *bad_poison)
{
    size_t es = ovl_dtype_size(tc->dtype);
    uint64_t step = step_of(tc);
    double diff2 = 0.0, ref2 = 0.0;
    bool nan = false;

    *bad_poison = 0;
    for (uint64_t r = 0; r < c_rows; r++) {
        bool row_in = false;
        uint64_t blk = 0, i = 0;
        if (r >= tc->c_off) {
            blk = (r - tc->c_off) / step;
            i = (r - tc->c_off) % step;
            row_in = blk < tc->nblocks && i < tc->rows;
        }
        for (uint64_t j = 0; j < tc->ldc; j++) {
            size_t idx = (size_t)(r * tc->ldc + j);
            if (row_in && j >= tc->shift && j - tc->shift < tc->n) {
                double v = ovl_load_elem(tc->dtype, hc, idx);
                double want = ref[(blk * tc->rows + i) * tc->n + (j - tc->shift)];
                if (isnan(v) || isinf(v))
                    nan = true;
                diff2 += (v - want) * (v - want);
                ref2 += want * want;
            } else {
                for (size_t b = 0; b < es; b++)
                    if (hc[idx * es + b] != 0xFF)
                        (*bad_poison)++;
            }
        }
    }
    if (nan)
        return INFINITY;
    if (ref2 == 0.0)
        return diff2 == 0.0 ? 0.0 : INFINITY;
    return sqrt(diff2 / ref2);
}

/* ref[(blk*rows + i)*n + j] = sum_l A[blk][i][l] * op(B)[l][j], in double. */
static void reference(const tcase_t *tc, const void *ha, const void *hb, double *ref)
{
    uint64_t step = step_of(tc);
    for (uint64_t blk = 0; blk < tc->nblocks; blk++)
        for (uint64_t i = 0; i < tc->rows; i++) {
            uint64_t ar = tc->a_off + blk * step + i;
            for (uint64_t j = 0; j < tc->n; j++) {
                double acc = 0.0;
                for (uint64_t l = 0; l < tc->k; l++) {
                    size_t bi = tc->transb ? (size_t)((tc->b_off + j) * tc->ldb + tc->shift + l)
                                           : (size_t)((tc->b_off + l) * tc->ldb + tc->shift + j);
                    size_t ai = (size_t)(ar * tc->lda + tc->shift + l);
                    acc += (double)ovl_load_elem(tc->dtype, ha, ai) *
                           (double)ovl_load_elem(tc->dtype, hb, bi);
                }
                ref[(blk * tc->rows + i) * tc->n + j] = acc;
            }
        }
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ce_ = (call);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            snprintf(why, sizeof why, "%s: %s", #call, cudaGetErrorName(ce_));                     \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void run_case(ovld_lt_t *lt, cudaStream_t s, tcase_t tc)
{
    size_t es = ovl_dtype_size(tc.dtype);
    char why[1024] = "";
    double err = NAN;
    bool ok = false;
    void *da = NULL, *db = NULL, *dc = NULL;
    unsigned char *ha = NULL, *hb = NULL, *hc = NULL;
    double *ref = NULL;

    if (tc.nblocks == 0)
        tc.nblocks = 1;
    if (tc.lda == 0)
        tc.lda = tc.k;
    if (tc.ldb == 0)
        tc.ldb = tc.transb ? tc.k : tc.n;
    if (tc.ldc == 0)
        tc.ldc = tc.n;
    if (tc.nblocks == 1)
        tc.block_stride = 0;

    uint64_t span = (tc.nblocks - 1) * step_of(&tc) + tc.rows;
    uint64_t a_rows = tc.a_off + span, c_rows = tc.c_off + span;
    uint64_t b_rows = tc.b_off + (tc.transb ? tc.n : tc.k);
    /* At least one element each, so that empty matrices still get a real
     * buffer. */
    size_t a_bytes = (size_t)(a_rows * tc.lda) * es + es;
    size_t b_bytes = (size_t)(b_rows * tc.ldb) * es + es;
    size_t c_bytes = (size_t)(c_rows * tc.ldc) * es + es;

    ha = malloc(a_bytes);
    hb = malloc(b_bytes);
    hc = malloc(c_bytes);
    ref = malloc((size_t)(tc.nblocks * tc.rows * tc.n + 1) * sizeof *ref);
    if (!ha || !hb || !hc || !ref) {
        snprintf(why, sizeof why, "out of host memory");
        goto out;
    }
    for (size_t i = 0; i < a_bytes / es; i++)
        ovl_store_elem(tc.dtype, ha, i, (float)rnd_unit());
    for (size_t i = 0; i < b_bytes / es; i++)
        ovl_store_elem(tc.dtype, hb, i, (float)rnd_unit());
    reference(&tc, ha, hb, ref);

    CU(cudaMalloc(&da, a_bytes));
    CU(cudaMalloc(&db, b_bytes));
    CU(cudaMalloc(&dc, c_bytes));
    CU(cudaMemcpy(da, ha, a_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(db, hb, b_bytes, cudaMemcpyHostToDevice));
    /* A pageable cudaMemcpy may return before its DMA lands, and s does not
     * wait for the legacy stream: wait here. */
    CU(cudaDeviceSynchronize());

    ovld_gemm_args_t g = {
        .dtype = tc.dtype,
        .rows = tc.rows,
        .n = tc.n,
        .k = tc.k,
        .nblocks = tc.nblocks,
        .block_stride = tc.block_stride,
        .a = {(char *)da + (tc.a_off * tc.lda + tc.shift) * es, tc.lda},
        .b = {(char *)db + (tc.b_off * tc.ldb + tc.shift) * es, tc.ldb},
        .c = {(char *)dc + (tc.c_off * tc.ldc + tc.shift) * es, tc.ldc},
        .transb = tc.transb != 0,
    };
    void *ws = tc.no_ws ? NULL : g_ws;
    size_t ws_bytes = tc.no_ws ? 0 : OVLD_LT_WORKSPACE;

    for (int pass = 0; pass < 2; pass++) {
        char lerr[512] = "";
        size_t before = ovld_lt_cache_size(lt);
        CU(cudaMemsetAsync(dc, 0xFF, c_bytes, s));
        ovl_status_t st = ovld_lt_gemm(lt, s, ws, ws_bytes, &g, lerr, sizeof lerr);
        if (st != OVL_OK) {
            snprintf(why, sizeof why, "pass %d: ovld_lt_gemm: %s: %s", pass, ovl_strerror(st),
                     lerr);
            goto out;
        }
        size_t after = ovld_lt_cache_size(lt);
        if (pass == 0 && after > before + 1) {
            snprintf(why, sizeof why, "cache grew by %zu entries", after - before);
            goto out;
        }
        if (pass == 1 && after != before) {
            snprintf(why, sizeof why, "repeated call missed the cache (%zu -> %zu entries)", before,
                     after);
            goto out;
        }
        CU(cudaStreamSynchronize(s));
        CU(cudaGetLastError());
        CU(cudaMemcpy(hc, dc, c_bytes, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        double e = check_c(&tc, hc, c_rows, ref, &bad);
        if (pass == 0 || !(e < err))
            err = e; /* the worse of the two passes */
        if (bad) {
            snprintf(why, sizeof why, "pass %d: %zu bytes outside C were written", pass, bad);
            goto out;
        }
        if (!(e < ovl_demo_tolerance(tc.dtype))) {
            snprintf(why, sizeof why, "pass %d: relative error %.3g over %.g", pass, e,
                     ovl_demo_tolerance(tc.dtype));
            goto out;
        }
    }
    ok = true;

out:
    report(ok, &tc, err, why[0] ? why : NULL);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    free(ha);
    free(hb);
    free(hc);
    free(ref);
}

/*
 * More distinct GEMMs than the cache holds (4096 entries): it must stay
 * bounded, empty itself when full, and keep working. rows 1..CB_ROWS of an
 * fp32 column times a 1 x 1 B, each a new key; the last call computes all
 * rows, which are then checked.
 */
#define CB_ROWS 4500u
static void run_cache_bound(ovld_lt_t *lt, cudaStream_t s)
{
    char why[1024] = "";
    float *ha = NULL, *hc = NULL, hb = 0.5f;
    void *da = NULL, *db = NULL, *dc = NULL;
    size_t peak = 0;
    bool dropped = false, ok = false;

    ha = malloc(CB_ROWS * sizeof *ha);
    hc = malloc(CB_ROWS * sizeof *hc);
    if (!ha || !hc) {
        snprintf(why, sizeof why, "out of host memory");
        goto out;
    }
    for (size_t i = 0; i < CB_ROWS; i++)
        ha[i] = (float)rnd_unit();
    CU(cudaMalloc(&da, CB_ROWS * sizeof *ha));
    CU(cudaMalloc(&db, sizeof hb));
    CU(cudaMalloc(&dc, CB_ROWS * sizeof *hc));
    CU(cudaMemcpy(da, ha, CB_ROWS * sizeof *ha, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(db, &hb, sizeof hb, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());
    for (uint64_t r = 1; r <= CB_ROWS; r++) {
        char lerr[512] = "";
        ovld_gemm_args_t g = {.dtype = OVL_DTYPE_FP32,
                              .rows = r,
                              .n = 1,
                              .k = 1,
                              .nblocks = 1,
                              .a = {da, 1},
                              .b = {db, 1},
                              .c = {dc, 1}};
        size_t before = ovld_lt_cache_size(lt);
        ovl_status_t st = ovld_lt_gemm(lt, s, g_ws, OVLD_LT_WORKSPACE, &g, lerr, sizeof lerr);
        if (st != OVL_OK) {
            snprintf(why, sizeof why, "rows %llu: %s: %s", (unsigned long long)r, ovl_strerror(st),
                     lerr);
            goto out;
        }
        size_t after = ovld_lt_cache_size(lt);
        peak = after > peak ? after : peak;
        dropped |= after < before;
    }
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(hc, dc, CB_ROWS * sizeof *hc, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < CB_ROWS; i++)
        if (hc[i] != ha[i] * hb) {
            snprintf(why, sizeof why, "C[%zu] = %g, want %g", i, hc[i], ha[i] * hb);
            goto out;
        }
    if (peak != 4096 || !dropped) {
        snprintf(why, sizeof why, "peak %zu entries (want 4096), emptied: %s", peak,
                 dropped ? "yes" : "no");
        goto out;
    }
    ok = true;

out:
    printf("%s cache-bound %u shapes: peak %zu entries, now %zu%s%s\n", ok ? "PASS" : "FAIL",
           CB_ROWS, peak, ovld_lt_cache_size(lt), why[0] ? ": " : "", why);
    if (ok)
        g_pass++;
    else
        g_fail++;
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    free(ha);
    free(hc);
}

/* Calls that must be refused (or be no-ops) before any GPU work. */
static void run_arg_checks(ovld_lt_t *lt, cudaStream_t s, void *buf)
{
    const ovl_dtype_t dt = OVL_DTYPE_BF16;
    ovld_gemm_args_t good = {
        .dtype = dt,
        .rows = 4,
        .n = 8,
        .k = 8,
        .nblocks = 1,
        .a = {buf, 8},
        .b = {buf, 8},
        .c = {buf, 8},
    };
    struct {
        const char *name;
        ovld_gemm_args_t g;
        ovl_status_t want;
    } cases[12];
    int nc = 0;

#define ARG_CASE(label, expect, ...)                                                               \
    do {                                                                                           \
        ovld_gemm_args_t g_ = good;                                                                \
        __VA_ARGS__;                                                                               \
        cases[nc].name = (label);                                                                  \
        cases[nc].g = g_;                                                                          \
        cases[nc].want = (expect);                                                                 \
        nc++;                                                                                      \
    } while (0)

    ARG_CASE("lda < k", OVL_ERR_INVALID, g_.a.ld = 7);
    ARG_CASE("ldc < n", OVL_ERR_INVALID, g_.c.ld = 7);
    ARG_CASE("ldb < n", OVL_ERR_INVALID, g_.b.ld = 7);
    ARG_CASE("ldb < k (transb)", OVL_ERR_INVALID, g_.transb = true; g_.k = 9; g_.a.ld = 9);
    ARG_CASE("NULL a", OVL_ERR_INVALID, g_.a.ptr = NULL);
    ARG_CASE("NULL b", OVL_ERR_INVALID, g_.b.ptr = NULL);
    ARG_CASE("NULL c", OVL_ERR_INVALID, g_.c.ptr = NULL);
    ARG_CASE("bad dtype", OVL_ERR_INVALID, g_.dtype = (ovl_dtype_t)7);
    ARG_CASE("overlapping blocks", OVL_ERR_INVALID, g_.nblocks = 2; g_.block_stride = 3);
    ARG_CASE("rows 0, NULL", OVL_OK, g_.rows = 0; g_.a.ptr = g_.c.ptr = NULL);
    ARG_CASE("n 0, NULL", OVL_OK, g_.n = 0; g_.b.ptr = g_.c.ptr = NULL);
    ARG_CASE("nblocks 0", OVL_OK, g_.nblocks = 0);
#undef ARG_CASE

    for (int i = 0; i < nc; i++) {
        char lerr[512] = "";
        size_t before = ovld_lt_cache_size(lt);
        ovl_status_t st =
            ovld_lt_gemm(lt, s, g_ws, OVLD_LT_WORKSPACE, &cases[i].g, lerr, sizeof lerr);
        bool ok = st == cases[i].want && ovld_lt_cache_size(lt) == before &&
                  (st == OVL_OK || lerr[0] != '\0');
        printf("%s args       %-20s -> %s%s%s\n", ok ? "PASS" : "FAIL", cases[i].name,
               ovl_strerror(st), lerr[0] ? ": " : "", lerr);
        if (ok)
            g_pass++;
        else
            g_fail++;
    }
}

/*
 * C = A @ op(B) / div + ACC (gemm_args.h; GEMM + reduce-scatter's ring):
 * ACC with a leading dimension and an alignment of its own (shift: its
 * first element `shift` elements past an aligned base), batched or not,
 * div 1 to 3; against a double-precision reference of the dtype inputs.
 */
static void run_acc_case(ovld_lt_t *lt, cudaStream_t s, ovl_dtype_t dt, int transb, uint64_t rows,
                         uint64_t n, uint64_t k, uint32_t nblocks, uint64_t stride, uint64_t ldacc,
                         uint64_t shift, uint32_t div)
{
    size_t es = ovl_dtype_size(dt);
    char why[1024] = "";
    double err = NAN, d2 = 0, r2 = 0;
    bool ok = false;
    void *da = NULL, *db = NULL, *dc = NULL, *dacc = NULL;
    unsigned char *ha = NULL, *hb = NULL, *hc = NULL, *hacc = NULL;
    uint64_t step = nblocks > 1 ? stride : rows, span = (nblocks - 1) * step + rows;
    uint64_t ldc = n + 1, ldb = transb ? k : n;
    size_t a_n = (size_t)(span * k), b_n = (size_t)((transb ? n : k) * ldb);
    size_t c_n = (size_t)(span * ldc), acc_n = (size_t)(span * ldacc + shift);
    tcase_t tc = {.dtype = dt,
                  .transb = transb,
                  .rows = rows,
                  .n = n,
                  .k = k,
                  .nblocks = nblocks,
                  .block_stride = stride,
                  .lda = k,
                  .ldb = ldb,
                  .ldc = ldc,
                  .shift = shift,
                  .tag = "acc"};

    ha = malloc(a_n * es);
    hb = malloc(b_n * es);
    hc = malloc(c_n * es);
    hacc = malloc(acc_n * es);
    if (!ha || !hb || !hc || !hacc) {
        snprintf(why, sizeof why, "out of host memory");
        goto out;
    }
    for (size_t i = 0; i < a_n; i++)
        ovl_store_elem(dt, ha, i, (float)rnd_unit());
    for (size_t i = 0; i < b_n; i++)
        ovl_store_elem(dt, hb, i, (float)rnd_unit());
    for (size_t i = 0; i < acc_n; i++)
        ovl_store_elem(dt, hacc, i, (float)(4.0 * rnd_unit()));
    CU(cudaMalloc(&da, a_n * es));
    CU(cudaMalloc(&db, b_n * es));
    CU(cudaMalloc(&dc, c_n * es));
    CU(cudaMalloc(&dacc, acc_n * es));
    CU(cudaMemcpy(da, ha, a_n * es, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(db, hb, b_n * es, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dacc, hacc, acc_n * es, cudaMemcpyHostToDevice));
    CU(cudaMemset(dc, 0xff, c_n * es));
    ovld_gemm_args_t g = {.dtype = dt,
                          .rows = rows,
                          .n = n,
                          .k = k,
                          .nblocks = nblocks,
                          .block_stride = nblocks > 1 ? stride : 0,
                          .a = {.ptr = da, .ld = k},
                          .b = {.ptr = db, .ld = ldb},
                          .c = {.ptr = dc, .ld = ldc},
                          .acc = {.ptr = (char *)dacc + shift * es, .ld = ldacc},
                          .div = div,
                          .transb = transb};
    ovl_status_t st = ovld_lt_gemm(lt, s, g_ws, OVLD_LT_WORKSPACE, &g, why, sizeof why);
    if (st != OVL_OK)
        goto out;
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(hc, dc, c_n * es, cudaMemcpyDeviceToHost));
    for (uint32_t bl = 0; bl < nblocks; bl++)
        for (uint64_t i = 0; i < rows; i++)
            for (uint64_t j = 0; j < n; j++) {
                uint64_t row = bl * step + i;
                double ab = 0.0;
                for (uint64_t l = 0; l < k; l++)
                    ab +=
                        (double)ovl_load_elem(dt, ha, (size_t)(row * k + l)) *
                        (double)ovl_load_elem(dt, hb, (size_t)(transb ? j * ldb + l : l * ldb + j));
                double want = ab / (div > 1 ? div : 1) +
                              (double)ovl_load_elem(dt, hacc, (size_t)(shift + row * ldacc + j));
                double got = (double)ovl_load_elem(dt, hc, (size_t)(row * ldc + j));
                d2 += (got - want) * (got - want);
                r2 += want * want;
            }
    err = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    ok = err < (dt == OVL_DTYPE_FP32 ? 1e-5 : dt == OVL_DTYPE_FP16 ? 2e-3 : 1e-2);
    if (!ok)
        snprintf(why, sizeof why, "relative error over the dtype's tolerance (div %u ldacc %llu)",
                 div, (unsigned long long)ldacc);
out:
    report(ok, &tc, err, why[0] ? why : NULL);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dacc);
    free(ha);
    free(hb);
    free(hc);
    free(hacc);
}

int main(void)
{
    static const uint64_t rows_set[] = {1, 3, 17, 256};
    static const uint64_t n_set[] = {1, 5, 64, 333};
    static const uint64_t k_set[] = {1, 7, 64, 300};
    static const ovl_dtype_t dtypes[] = {OVL_DTYPE_BF16, OVL_DTYPE_FP16, OVL_DTYPE_FP32};
    int count = 0;
    cudaStream_t s = NULL;
    ovld_lt_t *lt = NULL;
    char err[512] = "";
    void *scratch = NULL;
    int rc = 1;

    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0) {
        printf("SKIP: no GPU (%s)\n", ce != cudaSuccess ? ovl_cuda_why(ce) : "0 devices");
        return SKIP_CODE;
    }
    if ((ce = cudaSetDevice(0)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaMalloc(&g_ws, OVLD_LT_WORKSPACE)) != cudaSuccess ||
        (ce = cudaMalloc(&scratch, 4096)) != cudaSuccess) {
        printf("FAIL setup: %s\n", cudaGetErrorName(ce));
        goto out;
    }
    ovl_status_t st = ovld_lt_create(&lt, err, sizeof err);
    if (st != OVL_OK) {
        printf("FAIL ovld_lt_create: %s: %s\n", ovl_strerror(st), err);
        goto out;
    }

    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (int tb = 0; tb < 2; tb++) {
            const ovl_dtype_t dt = dtypes[d];
            for (size_t ri = 0; ri < 4; ri++)
                for (size_t ni = 0; ni < 4; ni++)
                    for (size_t ki = 0; ki < 4; ki++)
                        run_case(lt, s,
                                 (tcase_t){.dtype = dt,
                                           .transb = tb,
                                           .rows = rows_set[ri],
                                           .n = n_set[ni],
                                           .k = k_set[ki],
                                           .tag = "tight"});

            /* Batches with gaps between blocks: strided batch, B broadcast. */
            static const uint64_t bshapes[][3] = {{3, 5, 7}, {17, 64, 64}, {256, 333, 300}};
            for (size_t i = 0; i < 3; i++) {
                uint64_t r = bshapes[i][0], n = bshapes[i][1], k = bshapes[i][2];
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .nblocks = 3,
                                   .block_stride = r + 5,
                                   .tag = "batch"});
            }
            /* ACC added (ring's GEMM of beta 1), alpha 1/div: its own ld,
             * a misaligned ACC, batched and back-to-back blocks. */
            run_acc_case(lt, s, dt, tb, 17, 64, 64, 1, 0, 72, 0, 1);
            run_acc_case(lt, s, dt, tb, 256, 333, 300, 1, 0, 340, 1, 3);
            run_acc_case(lt, s, dt, tb, 33, 64, 48, 3, 40, 67, 0, 2);
            run_acc_case(lt, s, dt, tb, 16, 32, 32, 3, 16, 32, 0, 2);
            /* Back-to-back blocks (one taller GEMM), with padded lds. */
            run_case(lt, s,
                     (tcase_t){.dtype = dt,
                               .transb = tb,
                               .rows = 17,
                               .n = 64,
                               .k = 64,
                               .nblocks = 3,
                               .block_stride = 17,
                               .lda = 72,
                               .ldc = 80,
                               .tag = "contig"});

            /* Chunks at an odd row of buffers with odd leading dimensions:
             * every pointer is aligned to one element only. */
            static const uint64_t mshapes[][3] = {
                {1, 1, 1}, {3, 5, 7}, {17, 64, 64}, {256, 333, 300}, {64, 64, 64}};
            for (size_t i = 0; i < 5; i++) {
                uint64_t r = mshapes[i][0], n = mshapes[i][1], k = mshapes[i][2];
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .lda = odd_ld(k),
                                   .ldb = odd_ld(tb ? k : n),
                                   .ldc = odd_ld(n),
                                   .a_off = 1,
                                   .b_off = 1,
                                   .c_off = 1,
                                   .tag = "misalign"});
            }
            /* Chunks at an odd row of buffers whose rows are an odd
             * multiple of 16 bytes: aligned to 16 bytes, not 256. Alone and
             * as later blocks of a batch. */
            for (size_t i = 2; i < 5; i++) {
                uint64_t r = mshapes[i][0], n = mshapes[i][1], k = mshapes[i][2];
                uint64_t lda = ld16(k, dt), ldb = ld16(tb ? k : n, dt), ldc = ld16(n, dt);
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .lda = lda,
                                   .ldb = ldb,
                                   .ldc = ldc,
                                   .a_off = 1,
                                   .b_off = 1,
                                   .c_off = 1,
                                   .tag = "align16"});
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .nblocks = 3,
                                   .block_stride = r + 1 + r % 2,
                                   .lda = lda,
                                   .ldb = ldb,
                                   .ldc = ldc,
                                   .tag = "align16-bat"});
            }
            /* Pointers one element past an aligned row start, with aligned
             * leading dimensions: only the alignment preferences tell
             * cuBLASLt. */
            for (size_t i = 2; i < 5; i++) {
                uint64_t r = mshapes[i][0], n = mshapes[i][1], k = mshapes[i][2];
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .lda = ld64(k),
                                   .ldb = ld64(tb ? k : n),
                                   .ldc = ld64(n),
                                   .shift = 1,
                                   .tag = "shift1"});
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .nblocks = 3,
                                   .block_stride = r + 3,
                                   .lda = ld64(k),
                                   .ldb = ld64(tb ? k : n),
                                   .ldc = ld64(n),
                                   .shift = 1,
                                   .tag = "shift1-bat"});
            }

            /* Batches whose bases are 256-byte aligned but whose step
             * between blocks is an odd number of elements: the later blocks
             * are aligned to one element only. Then misaligned bases too. */
            for (size_t i = 1; i < 4; i++) {
                uint64_t r = mshapes[i][0], n = mshapes[i][1], k = mshapes[i][2];
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .nblocks = 3,
                                   .block_stride = r + 2,
                                   .lda = odd_ld(k),
                                   .ldb = odd_ld(tb ? k : n),
                                   .ldc = odd_ld(n),
                                   .tag = "batch-step"});
                run_case(lt, s,
                         (tcase_t){.dtype = dt,
                                   .transb = tb,
                                   .rows = r,
                                   .n = n,
                                   .k = k,
                                   .nblocks = 3,
                                   .block_stride = r + 2,
                                   .lda = odd_ld(k),
                                   .ldb = odd_ld(tb ? k : n),
                                   .ldc = odd_ld(n),
                                   .a_off = 1,
                                   .b_off = 1,
                                   .c_off = 1,
                                   .tag = "batch-mis"});
            }

            /* k == 0: C is zeroed, padding untouched. */
            run_case(lt, s,
                     (tcase_t){.dtype = dt, .transb = tb, .rows = 3, .n = 5, .k = 0, .tag = "k0"});
            run_case(lt, s,
                     (tcase_t){.dtype = dt,
                               .transb = tb,
                               .rows = 3,
                               .n = 5,
                               .k = 0,
                               .nblocks = 3,
                               .block_stride = 4,
                               .ldc = 7,
                               .c_off = 1,
                               .tag = "k0-batch"});

            /* No workspace: the heuristic must still find an algorithm. */
            run_case(lt, s,
                     (tcase_t){.dtype = dt,
                               .transb = tb,
                               .rows = 256,
                               .n = 333,
                               .k = 300,
                               .no_ws = true,
                               .tag = "no-ws"});
            run_case(lt, s,
                     (tcase_t){.dtype = dt,
                               .transb = tb,
                               .rows = 17,
                               .n = 64,
                               .k = 64,
                               .nblocks = 3,
                               .block_stride = 20,
                               .no_ws = true,
                               .tag = "no-ws-batch"});
        }

    run_arg_checks(lt, s, scratch);
    run_cache_bound(lt, s);

    printf("cache: %zu entries\n", ovld_lt_cache_size(lt));
    rc = g_fail ? 1 : 0;

out:
    printf("%d passed, %d failed\n", g_pass, g_fail);
    ovld_lt_destroy(lt);
    cudaFree(scratch);
    cudaFree(g_ws);
    if (s)
        cudaStreamDestroy(s);
    return rc;
}

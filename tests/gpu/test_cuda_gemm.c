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
 * Scaled (fp8) GEMMs (run_fp8_case): random fp8 codes (ovl_fp8_from_float of
 * floats in [-4, 4)), B transposed, against a double reference decoded with
 * ovl_fp8_to_float: C = sa(i) sb(j) (A @ B^T) / div + bias[j] + ACC. Every A x B
 * fp8 pair cuBLASLt takes (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3) x C in bf16,
 * fp16 and fp32 x tensor or row scales on each side x with and without bias;
 * then ACC with div 1 and 2, two blocks (batched, back to back, and one
 * matmul per block for row scales, a block's a_scale then 4, 8 or 16-byte
 * aligned), fast accumulation, rows x n x k 128 x 48 x 96, leading
 * dimensions past the row (16-byte multiples), scale and bias pointers a few
 * elements into their buffers (4 and 2-byte aligned: copied to aligned
 * scratch), no workspace (mixed tensor / row scales and an fp32 C's bias,
 * which need scratch, must then be refused with OVL_ERR_UNSUPPORTED) and a
 * k that is no multiple of 16 (which cuBLASLt may refuse:
 * OVL_ERR_UNSUPPORTED is taken there). Bounds on the relative Frobenius
 * error: fp8_tolerance(). The refusals (fp8 dtypes where they do not belong,
 * both e5m2, no transb, a NULL scale, ...) must return OVL_ERR_INVALID
 * without touching C or the cache.
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

/*
 * Scaled (fp8) GEMMs: C = sa(i) sb(j) (A @ B^T) / div + bias[j] + ACC, A in
 * a_dt and B in b_dt (fp8, B transposed: n x k), C, ACC and bias in c_dt.
 */
typedef struct f8case {
    ovl_dtype_t a_dt, b_dt, c_dt;
    ovl_scale_mode_t a_mode, b_mode;
    bool bias, acc, fast;
    uint32_t div; /* 0 or 1: none */
    uint64_t rows, n, k;
    uint32_t nblocks;
    uint64_t block_stride;         /* used when nblocks > 1 */
    uint64_t lda, ldb, ldc, ldacc; /* 0: tight (k, k, n, n) */
    bool may_refuse;               /* OVL_ERR_UNSUPPORTED passes too (cuBLASLt's limits) */
    bool no_ws;                    /* no workspace: a GEMM that needs scratch must refuse */
    uint32_t scale_off;            /* a_scale and b_scale this many floats into their buffers */
    uint32_t bias_off;             /* bias this many elements into its buffer */
    const char *tag;
} f8case_t;

static ovl_fp8_fmt_t fp8_fmt(ovl_dtype_t dt)
{
    return dt == OVL_DTYPE_FP8_E5M2 ? OVL_FP8_E5M2 : OVL_FP8_E4M3;
}

/*
 * Bounds on a scaled GEMM's relative Frobenius error against the double
 * reference of the same fp8 codes (their products are exact in fp32). bf16
 * and fp16 C: their rounding (at most 2^-9 and 2^-11 relative per element),
 * as the unscaled GEMMs' bounds; seen on an H200 (cuBLASLt 13.1): 1.7e-3
 * and 2.4e-4. fp32 C: the rounding is 2^-24, and what is left is the tensor
 * cores' fp8 accumulation, which on Hopper keeps fewer bits than fp32
 * between cuBLASLt's promotions to fp32 registers (and none at all with
 * fast_accum): seen 0.7e-4 to 1.2e-4, and 1.4e-4 with fast_accum at k 256.
 * Bounds: bf16 1e-2; fp16 2e-3 (4e-3 fast); fp32 5e-4 (2e-3 fast).
 */
static double fp8_tolerance(ovl_dtype_t c_dt, bool fast)
{
    switch (c_dt) {
    case OVL_DTYPE_BF16:
        return 1e-2;
    case OVL_DTYPE_FP16:
        return fast ? 4e-3 : 2e-3;
    default:
        return fast ? 2e-3 : 5e-4;
    }
}

static const char *mode_name(ovl_scale_mode_t m)
{
    const char *name = ovl_scale_mode_name(m);
    return name ? name : "?";
}

/* How many floats the scales of a matrix of rows x k (B: rows its n) take
 * by mode (ovl.h's ovl_scale_shape), and the scale of its element (r, l):
 * the definition, for the reference. */
static size_t scale_count(ovl_scale_mode_t m, int b, uint64_t rows, uint64_t k)
{
    uint64_t r = 0, c = 0;
    return ovl_scale_shape(m, b, rows, k, &r, &c) == OVL_OK ? (size_t)(r * c) : 0;
}

static double scale_of(const float *sc, ovl_scale_mode_t m, uint64_t r, uint64_t l, uint64_t k)
{
    uint64_t kq = (k + OVL_SCALE_BLOCK - 1) / OVL_SCALE_BLOCK;
    switch (m) {
    case OVL_SCALE_TENSOR:
        return sc[0];
    case OVL_SCALE_ROW:
        return sc[r];
    case OVL_SCALE_BLOCK_1X128:
        return sc[r * kq + l / OVL_SCALE_BLOCK];
    case OVL_SCALE_BLOCK_128X128:
        return sc[r / OVL_SCALE_BLOCK * kq + l / OVL_SCALE_BLOCK];
    }
    return NAN;
}

static void report_fp8(bool ok, const f8case_t *tc, double err, const char *why)
{
    printf("%s %-12s %s x %s -> %s sa=%s sb=%s%s%s%s%s rows=%llu n=%llu k=%llu nblocks=%u "
           "stride=%llu ld=%llu/%llu/%llu/%llu err=%.3g (bound %.g)%s%s\n",
           ok ? "PASS" : "FAIL", tc->tag, ovl_dtype_name(tc->a_dt), ovl_dtype_name(tc->b_dt),
           ovl_dtype_name(tc->c_dt), mode_name(tc->a_mode), mode_name(tc->b_mode),
           tc->bias ? " bias" : "", tc->acc ? " acc" : "", tc->fast ? " fast" : "",
           tc->no_ws ? " no-ws" : "", (unsigned long long)tc->rows, (unsigned long long)tc->n,
           (unsigned long long)tc->k, tc->nblocks, (unsigned long long)tc->block_stride,
           (unsigned long long)tc->lda, (unsigned long long)tc->ldb, (unsigned long long)tc->ldc,
           (unsigned long long)tc->ldacc, err, fp8_tolerance(tc->c_dt, tc->fast), why ? ": " : "",
           why ? why : "");
    fflush(stdout);
    if (ok)
        g_pass++;
    else
        g_fail++;
}

static void run_fp8_case(ovld_lt_t *lt, cudaStream_t s, f8case_t tc)
{
    size_t ec = ovl_dtype_size(tc.c_dt);
    char why[1024] = "";
    double err = NAN;
    bool ok = false;
    void *da = NULL, *db = NULL, *dc = NULL, *dacc = NULL, *dsa = NULL, *dsb = NULL, *dbias = NULL;
    unsigned char *ha = NULL, *hb = NULL, *hc = NULL, *hacc = NULL, *hbias = NULL;
    float *hsa = NULL, *hsb = NULL;
    double *ref = NULL;

    if (tc.nblocks == 0)
        tc.nblocks = 1;
    if (tc.nblocks == 1)
        tc.block_stride = 0;
    if (tc.lda == 0)
        tc.lda = tc.k;
    if (tc.ldb == 0)
        tc.ldb = tc.k;
    if (tc.ldc == 0)
        tc.ldc = tc.n;
    if (!tc.acc)
        tc.ldacc = 0;
    else if (tc.ldacc == 0)
        tc.ldacc = tc.n;

    /* check_c's view of C: dtype c_dt, no offsets */
    tcase_t cv = {.dtype = tc.c_dt,
                  .transb = 1,
                  .rows = tc.rows,
                  .n = tc.n,
                  .k = tc.k,
                  .nblocks = tc.nblocks,
                  .block_stride = tc.block_stride,
                  .lda = tc.lda,
                  .ldb = tc.ldb,
                  .ldc = tc.ldc,
                  .tag = tc.tag};
    uint64_t step = step_of(&cv), span = (tc.nblocks - 1) * step + tc.rows;
    size_t a_bytes = (size_t)(span * tc.lda), b_bytes = (size_t)(tc.n * tc.ldb);
    size_t c_bytes = (size_t)(span * tc.ldc) * ec;
    size_t acc_bytes = (size_t)(span * tc.ldacc) * ec + ec;
    size_t bias_bytes = (size_t)(tc.n + tc.bias_off) * ec;
    /* A's scales over every row the blocks span (by row or 1x128) */
    size_t sa_n = scale_count(tc.a_mode, 0, span, tc.k) + tc.scale_off;
    size_t sb_n = scale_count(tc.b_mode, 1, tc.n, tc.k) + tc.scale_off;

    ha = malloc(a_bytes);
    hb = malloc(b_bytes);
    hc = malloc(c_bytes);
    hacc = malloc(acc_bytes);
    hbias = malloc(bias_bytes);
    hsa = malloc(sa_n * sizeof *hsa);
    hsb = malloc(sb_n * sizeof *hsb);
    ref = malloc((size_t)(tc.nblocks * tc.rows * tc.n) * sizeof *ref);
    if (!ha || !hb || !hc || !hacc || !hbias || !hsa || !hsb || !ref) {
        snprintf(why, sizeof why, "out of host memory");
        goto out;
    }
    /* Random fp8 codes (padding too): floats in [-4, 4) rounded to the
     * format, saturating (none is past its range anyway). Scales in
     * [0.25, 1.75), bias in [-2, 2), ACC in [-4, 4), stored in c_dt (the
     * reference reads them back from there). */
    for (size_t i = 0; i < a_bytes; i++)
        ha[i] = ovl_fp8_from_float(fp8_fmt(tc.a_dt), (float)(4.0 * rnd_unit()), 1);
    for (size_t i = 0; i < b_bytes; i++)
        hb[i] = ovl_fp8_from_float(fp8_fmt(tc.b_dt), (float)(4.0 * rnd_unit()), 1);
    for (size_t i = 0; i < sa_n; i++)
        hsa[i] = (float)(1.0 + 0.75 * rnd_unit());
    for (size_t i = 0; i < sb_n; i++)
        hsb[i] = (float)(1.0 + 0.75 * rnd_unit());
    for (size_t j = 0; j < tc.n + tc.bias_off; j++)
        ovl_store_elem(tc.c_dt, hbias, j, (float)(2.0 * rnd_unit()));
    for (size_t i = 0; i < acc_bytes / ec; i++)
        ovl_store_elem(tc.c_dt, hacc, i, (float)(4.0 * rnd_unit()));

    /* The reference, in double. */
    for (uint64_t blk = 0; blk < tc.nblocks; blk++)
        for (uint64_t i = 0; i < tc.rows; i++) {
            uint64_t r = blk * step + i;
            for (uint64_t j = 0; j < tc.n; j++) {
                double v = 0.0; /* each product with its scales */
                for (uint64_t l = 0; l < tc.k; l++)
                    v += scale_of(hsa + tc.scale_off, tc.a_mode, r, l, tc.k) *
                         scale_of(hsb + tc.scale_off, tc.b_mode, j, l, tc.k) *
                         (double)ovl_fp8_to_float(fp8_fmt(tc.a_dt), ha[r * tc.lda + l]) *
                         (double)ovl_fp8_to_float(fp8_fmt(tc.b_dt), hb[j * tc.ldb + l]);
                if (tc.div > 1)
                    v /= tc.div;
                if (tc.bias)
                    v += ovl_load_elem(tc.c_dt, hbias, tc.bias_off + j);
                if (tc.acc)
                    v += ovl_load_elem(tc.c_dt, hacc, (size_t)(r * tc.ldacc + j));
                ref[(blk * tc.rows + i) * tc.n + j] = v;
            }
        }

    CU(cudaMalloc(&da, a_bytes));
    CU(cudaMalloc(&db, b_bytes));
    CU(cudaMalloc(&dc, c_bytes));
    CU(cudaMalloc(&dacc, acc_bytes));
    CU(cudaMalloc(&dbias, bias_bytes));
    CU(cudaMalloc(&dsa, sa_n * sizeof *hsa));
    CU(cudaMalloc(&dsb, sb_n * sizeof *hsb));
    CU(cudaMemcpy(da, ha, a_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(db, hb, b_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dacc, hacc, acc_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dbias, hbias, bias_bytes, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dsa, hsa, sa_n * sizeof *hsa, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dsb, hsb, sb_n * sizeof *hsb, cudaMemcpyHostToDevice));
    CU(cudaDeviceSynchronize());

    ovld_gemm_args_t g = {
        .dtype = tc.a_dt,
        .rows = tc.rows,
        .n = tc.n,
        .k = tc.k,
        .nblocks = tc.nblocks,
        .block_stride = tc.block_stride,
        .a = {da, tc.lda},
        .b = {db, tc.ldb},
        .c = {dc, tc.ldc},
        .acc = {tc.acc ? dacc : NULL, tc.ldacc},
        .div = tc.div,
        .transb = true,
        .scaled = true,
        .b_dtype = tc.b_dt,
        .c_dtype = tc.c_dt,
        .a_mode = tc.a_mode,
        .b_mode = tc.b_mode,
        .a_scale = (const float *)dsa + tc.scale_off,
        .b_scale = (const float *)dsb + tc.scale_off,
        .bias = tc.bias ? (const char *)dbias + tc.bias_off * ec : NULL,
        .fast_accum = tc.fast,
    };

    /* Mixed tensor / row scales, block scales (in cuBLASLt's layouts) and
     * an fp32 C's bias take workspace scratch; without a workspace they
     * are refused. */
    bool needs_ws = tc.a_mode != tc.b_mode || ovl_scale_mode_is_block(tc.a_mode) ||
                    (tc.bias && tc.c_dt == OVL_DTYPE_FP32);
    for (int pass = 0; pass < 2; pass++) {
        char lerr[1024] = "";
        size_t before = ovld_lt_cache_size(lt);
        CU(cudaMemsetAsync(dc, 0xFF, c_bytes, s));
        ovl_status_t st = ovld_lt_gemm(lt, s, tc.no_ws ? NULL : g_ws,
                                       tc.no_ws ? 0 : OVLD_LT_WORKSPACE, &g, lerr, sizeof lerr);
        if (st == OVL_ERR_UNSUPPORTED && (tc.may_refuse || (tc.no_ws && needs_ws)) &&
            lerr[0] != '\0' && ovld_lt_cache_size(lt) == before) {
            /* Nothing may have run: C is still all poison. */
            size_t bad = 0;
            CU(cudaStreamSynchronize(s));
            CU(cudaMemcpy(hc, dc, c_bytes, cudaMemcpyDeviceToHost));
            for (size_t b = 0; b < c_bytes; b++)
                bad += hc[b] != 0xFF;
            if (bad) {
                snprintf(why, sizeof why, "refused, but wrote %zu bytes of C: %s", bad, lerr);
                goto out;
            }
            snprintf(why, sizeof why, "refused, as it may be: %s", lerr);
            err = 0.0;
            ok = true;
            goto out;
        }
        if (st != OVL_OK) {
            snprintf(why, sizeof why, "pass %d: ovld_lt_gemm: %s: %s", pass, ovl_strerror(st),
                     lerr);
            goto out;
        }
        if (tc.no_ws && needs_ws) {
            snprintf(why, sizeof why, "ran without the workspace scratch it needs");
            goto out;
        }
        /* At most three new entries: the GEMM, and the plain fp32 GEMMs
         * that expand a tensor-wide scale and add an fp32 bias. */
        size_t after = ovld_lt_cache_size(lt);
        if (pass == 0 && after > before + 3) {
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
        double e = check_c(&cv, hc, span, ref, &bad);
        if (pass == 0 || !(e < err))
            err = e; /* the worse of the two passes */
        if (bad) {
            snprintf(why, sizeof why, "pass %d: %zu bytes outside C were written", pass, bad);
            goto out;
        }
        if (!(e < fp8_tolerance(tc.c_dt, tc.fast))) {
            snprintf(why, sizeof why, "pass %d: relative error %.3g over %.g", pass, e,
                     fp8_tolerance(tc.c_dt, tc.fast));
            goto out;
        }
    }
    ok = true;

out:
    report_fp8(ok, &tc, err, why[0] ? why : NULL);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dacc);
    cudaFree(dbias);
    cudaFree(dsa);
    cudaFree(dsb);
    free(ha);
    free(hb);
    free(hc);
    free(hacc);
    free(hbias);
    free(hsa);
    free(hsb);
    free(ref);
}

static void run_fp8_cases(ovld_lt_t *lt, cudaStream_t s)
{
    static const ovl_dtype_t pairs[3][2] = {{OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E4M3},
                                            {OVL_DTYPE_FP8_E4M3, OVL_DTYPE_FP8_E5M2},
                                            {OVL_DTYPE_FP8_E5M2, OVL_DTYPE_FP8_E4M3}};
    static const ovl_dtype_t outs[3] = {OVL_DTYPE_BF16, OVL_DTYPE_FP16, OVL_DTYPE_FP32};
    static const ovl_scale_mode_t modes[4][2] = {{OVL_SCALE_TENSOR, OVL_SCALE_TENSOR},
                                                 {OVL_SCALE_ROW, OVL_SCALE_TENSOR},
                                                 {OVL_SCALE_TENSOR, OVL_SCALE_ROW},
                                                 {OVL_SCALE_ROW, OVL_SCALE_ROW}};
    const ovl_scale_mode_t T = OVL_SCALE_TENSOR, R = OVL_SCALE_ROW;

    /* Every fp8 pair x C dtype x scale modes x bias, 64 x 128 x 256. */
    for (int p = 0; p < 3; p++)
        for (int o = 0; o < 3; o++)
            for (int m = 0; m < 4; m++)
                for (int bias = 0; bias < 2; bias++)
                    run_fp8_case(lt, s,
                                 (f8case_t){.a_dt = pairs[p][0],
                                            .b_dt = pairs[p][1],
                                            .c_dt = outs[o],
                                            .a_mode = modes[m][0],
                                            .b_mode = modes[m][1],
                                            .bias = bias != 0,
                                            .rows = 64,
                                            .n = 128,
                                            .k = 256,
                                            .tag = "f8-grid"});

    /* Per C dtype (the fp8 pair turning with it): ACC, div, blocks, fast
     * accumulation, another shape, padded leading dimensions. */
    for (int o = 0; o < 3; o++) {
        const f8case_t base = {.a_dt = pairs[o][0],
                               .b_dt = pairs[o][1],
                               .c_dt = outs[o],
                               .rows = 64,
                               .n = 128,
                               .k = 256};
        /* 16 bytes of C's elements, for padded leading dimensions */
        const uint64_t c16 = 16 / ovl_dtype_size(outs[o]);
#define F8(...)                                                                                    \
    do {                                                                                           \
        f8case_t c_ = base;                                                                        \
        __VA_ARGS__;                                                                               \
        run_fp8_case(lt, s, c_);                                                                   \
    } while (0)
        /* ACC (beta 1) with div 1 and 2, and div without ACC */
        F8(c_.a_mode = T; c_.b_mode = T; c_.acc = true; c_.div = 1; c_.tag = "f8-acc");
        F8(c_.a_mode = R; c_.b_mode = R; c_.acc = true; c_.div = 2; c_.bias = true;
           c_.tag = "f8-acc-div2");
        F8(c_.a_mode = T; c_.b_mode = R; c_.acc = true; c_.div = 2; c_.ldacc = 128 + c16;
           c_.tag = "f8-acc-ld");
        F8(c_.a_mode = R; c_.b_mode = T; c_.div = 2; c_.bias = true; c_.tag = "f8-div2");
        /* fast accumulation */
        F8(c_.a_mode = T; c_.b_mode = T; c_.fast = true; c_.tag = "f8-fast");
        F8(c_.a_mode = R; c_.b_mode = R; c_.fast = true; c_.bias = true; c_.acc = true; c_.div = 2;
           c_.tag = "f8-fast-all");
        /* rows x n x k 128 x 48 x 96, every pair of modes */
        for (int m = 0; m < 4; m++)
            F8(c_.a_mode = modes[m][0]; c_.b_mode = modes[m][1]; c_.rows = 128; c_.n = 48;
               c_.k = 96; c_.bias = m % 2 == 1; c_.acc = m >= 2; c_.tag = "f8-128x48");
        /* Two blocks with a gap: batched (a_scale tensor-wide) or one matmul
         * per block (a_scale per row), with ACC, div and bias; fast too. */
        for (int m = 0; m < 4; m++)
            F8(c_.a_mode = modes[m][0]; c_.b_mode = modes[m][1]; c_.nblocks = 2;
               c_.block_stride = 80; c_.bias = true; c_.acc = true; c_.div = 2;
               c_.tag = "f8-batch");
        F8(c_.a_mode = R; c_.b_mode = R; c_.nblocks = 2; c_.block_stride = 72; c_.fast = true;
           c_.tag = "f8-batch-fast");
        F8(c_.a_mode = T; c_.b_mode = T; c_.nblocks = 2; c_.block_stride = 70; c_.rows = 48;
           c_.n = 48; c_.k = 96; c_.tag = "f8-batch-48");
        /* Back to back: one taller GEMM, a_scale's rows back to back too. */
        F8(c_.a_mode = R; c_.b_mode = R; c_.nblocks = 2; c_.block_stride = 64; c_.bias = true;
           c_.tag = "f8-contig");
        /* The second block's a_scale 4-byte aligned only (stride 65 rows;
         * A's and C's rows stay 16-byte multiples). */
        F8(c_.a_mode = R; c_.b_mode = T; c_.nblocks = 2; c_.block_stride = 65; c_.bias = true;
           c_.acc = true; c_.tag = "f8-sa-align4");
        F8(c_.a_mode = R; c_.b_mode = R; c_.nblocks = 2; c_.block_stride = 65; c_.bias = true;
           c_.tag = "f8-sa-align4");
        F8(c_.a_mode = R; c_.b_mode = R; c_.nblocks = 2; c_.block_stride = 68; c_.acc = true;
           c_.tag = "f8-sa-align16");
        /* Scale pointers one float into their buffers: 4-byte aligned. */
        for (int m = 0; m < 4; m++)
            F8(c_.a_mode = modes[m][0]; c_.b_mode = modes[m][1]; c_.scale_off = 1; c_.bias = true;
               c_.tag = "f8-scale-off1");
        F8(c_.a_mode = R; c_.b_mode = R; c_.scale_off = 3; c_.nblocks = 2; c_.block_stride = 66;
           c_.tag = "f8-scale-off3");
        /* A bias one element into its buffer (2 or 4-byte aligned). */
        F8(c_.a_mode = R; c_.b_mode = R; c_.bias = true; c_.bias_off = 1; c_.tag = "f8-bias-off1");
        F8(c_.a_mode = T; c_.b_mode = T; c_.bias = true; c_.bias_off = 1; c_.acc = true;
           c_.tag = "f8-bias-off1");
        /* ... and four floats in: 16-byte aligned, used in place. */
        F8(c_.a_mode = T; c_.b_mode = T; c_.scale_off = 4; c_.acc = true; c_.tag = "f8-scale-off4");
        F8(c_.a_mode = R; c_.b_mode = R; c_.scale_off = 4; c_.bias = true;
           c_.tag = "f8-scale-off4");
        /* Without a workspace: plain ones run, mixed modes (and an fp32
         * C's bias) are refused. */
        F8(c_.a_mode = R; c_.b_mode = R; c_.bias = true; c_.no_ws = true; c_.tag = "f8-no-ws");
        F8(c_.a_mode = T; c_.b_mode = R; c_.no_ws = true; c_.tag = "f8-no-ws");
        /* Leading dimensions past the row, 16-byte multiples. */
        F8(c_.a_mode = R; c_.b_mode = R; c_.lda = 256 + 16; c_.ldb = 256 + 48; c_.ldc = 128 + c16;
           c_.acc = true; c_.ldacc = 128 + 2 * c16; c_.bias = true; c_.tag = "f8-ld");
        F8(c_.a_mode = R; c_.b_mode = T; c_.rows = 128; c_.n = 48; c_.k = 96; c_.lda = 128;
           c_.ldb = 112; c_.ldc = 48 + c16; c_.nblocks = 2; c_.block_stride = 130; c_.bias = true;
           c_.tag = "f8-ld-batch");
        F8(c_.a_mode = T; c_.b_mode = R; c_.rows = 128; c_.n = 48; c_.k = 96; c_.lda = 128;
           c_.ldb = 112; c_.ldc = 48 + c16; c_.nblocks = 2; c_.block_stride = 130; c_.acc = true;
           c_.div = 2; c_.tag = "f8-ld-batch");
        /* k no multiple of 16 (lds still 16-byte multiples): cuBLASLt's
         * fp8 GEMMs may refuse it. */
        F8(c_.a_mode = R; c_.b_mode = R; c_.k = 40; c_.lda = 48; c_.ldb = 48; c_.may_refuse = true;
           c_.tag = "f8-k40");
        /* Block scales (A 1x128 with B 1x128 or 128x128): every pair of
         * modes with and without bias; k with a partial last block (320)
         * and with ceil(k/128) no multiple of 4 (384: B's 128x128 rows
         * padded); B's n over two 128-row tiles; blocks batched (a matmul
         * each), back to back (one taller), with ACC and div; scales one
         * float into their buffers; no workspace (refused). */
        {
            const ovl_scale_mode_t V = OVL_SCALE_BLOCK_1X128, Q = OVL_SCALE_BLOCK_128X128;
            for (int bm = 0; bm < 2; bm++) {
                const ovl_scale_mode_t BM = bm ? Q : V;
                F8(c_.a_mode = V; c_.b_mode = BM; c_.tag = "f8-blk");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.bias = true; c_.tag = "f8-blk-bias");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.k = 320; c_.lda = 320; c_.ldb = 320;
                   c_.tag = "f8-blk-k320");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.k = 384; c_.lda = 384; c_.ldb = 384;
                   c_.n = 256; c_.bias = true; c_.tag = "f8-blk-k384");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.nblocks = 2; c_.block_stride = 80;
                   c_.acc = true; c_.div = 2; c_.bias = true; c_.tag = "f8-blk-batch");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.nblocks = 2; c_.block_stride = 64;
                   c_.tag = "f8-blk-contig");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.fast = true; c_.tag = "f8-blk-fast");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.scale_off = 1; c_.tag = "f8-blk-off1");
                F8(c_.a_mode = V; c_.b_mode = BM; c_.no_ws = true; c_.tag = "f8-blk-no-ws");
            }
        }
#undef F8
    }
}

/* Scaled GEMMs that must be refused with OVL_ERR_INVALID (or be no-ops)
 * before any GPU work: C, poisoned, stays so, and the cache does not grow. */
static void run_fp8_arg_checks(ovld_lt_t *lt, cudaStream_t s, void *buf)
{
    enum { ROWS = 4, N = 16, K = 16 };
    unsigned char hc[ROWS * N * 2] = {0};
    void *dc = NULL;
    char why[512] = "";
    ovld_gemm_args_t good = {
        .dtype = OVL_DTYPE_FP8_E4M3,
        .rows = ROWS,
        .n = N,
        .k = K,
        .nblocks = 1,
        .a = {buf, K},
        .b = {buf, K},
        .c = {NULL, N},
        .transb = true,
        .scaled = true,
        .b_dtype = OVL_DTYPE_FP8_E4M3,
        .c_dtype = OVL_DTYPE_BF16,
        .a_mode = OVL_SCALE_TENSOR,
        .b_mode = OVL_SCALE_ROW,
        .a_scale = (const float *)buf,
        .b_scale = (const float *)buf,
    };
    struct {
        const char *name;
        ovld_gemm_args_t g;
        ovl_status_t want;
    } cases[24];
    int nc = 0;

    if (cudaMalloc(&dc, sizeof hc) != cudaSuccess) {
        printf("FAIL args-fp8: cudaMalloc\n");
        g_fail++;
        return;
    }
    good.c.ptr = dc;

#define F8_ARG(label, expect, ...)                                                                 \
    do {                                                                                           \
        ovld_gemm_args_t g_ = good;                                                                \
        __VA_ARGS__;                                                                               \
        cases[nc].name = (label);                                                                  \
        cases[nc].g = g_;                                                                          \
        cases[nc].want = (expect);                                                                 \
        nc++;                                                                                      \
    } while (0)

    F8_ARG("A bf16", OVL_ERR_INVALID, g_.dtype = OVL_DTYPE_BF16);
    F8_ARG("A unknown dtype", OVL_ERR_INVALID, g_.dtype = (ovl_dtype_t)9);
    F8_ARG("B fp16", OVL_ERR_INVALID, g_.b_dtype = OVL_DTYPE_FP16);
    F8_ARG("e5m2 x e5m2", OVL_ERR_INVALID, g_.dtype = OVL_DTYPE_FP8_E5M2;
           g_.b_dtype = OVL_DTYPE_FP8_E5M2);
    F8_ARG("C fp8e4m3", OVL_ERR_INVALID, g_.c_dtype = OVL_DTYPE_FP8_E4M3);
    F8_ARG("C fp8e5m2", OVL_ERR_INVALID, g_.c_dtype = OVL_DTYPE_FP8_E5M2);
    F8_ARG("C unknown dtype", OVL_ERR_INVALID, g_.c_dtype = (ovl_dtype_t)9);
    F8_ARG("no transb", OVL_ERR_INVALID, g_.transb = false);
    F8_ARG("NULL a_scale", OVL_ERR_INVALID, g_.a_scale = NULL);
    F8_ARG("NULL b_scale", OVL_ERR_INVALID, g_.b_scale = NULL);
    F8_ARG("a_mode 1x128, b_mode row", OVL_ERR_INVALID, g_.a_mode = OVL_SCALE_BLOCK_1X128);
    F8_ARG("a_mode 128x128", OVL_ERR_INVALID, g_.a_mode = OVL_SCALE_BLOCK_128X128;
           g_.b_mode = OVL_SCALE_BLOCK_1X128);
    F8_ARG("a_mode 1x128, rows 6", OVL_ERR_INVALID, g_.a_mode = OVL_SCALE_BLOCK_1X128;
           g_.b_mode = OVL_SCALE_BLOCK_128X128; g_.rows = 6);
    F8_ARG("b_mode 1x128, n 6", OVL_ERR_INVALID, g_.a_mode = OVL_SCALE_BLOCK_1X128;
           g_.b_mode = OVL_SCALE_BLOCK_1X128; g_.n = 6);
    F8_ARG("a_mode 4", OVL_ERR_INVALID, g_.a_mode = (ovl_scale_mode_t)4);
    F8_ARG("b_mode 7", OVL_ERR_INVALID, g_.b_mode = (ovl_scale_mode_t)7);
    F8_ARG("unscaled fp8e4m3", OVL_ERR_INVALID, g_.scaled = false);
    F8_ARG("unscaled fp8e5m2", OVL_ERR_INVALID, g_.scaled = false; g_.dtype = OVL_DTYPE_FP8_E5M2);
    F8_ARG("lda < k", OVL_ERR_INVALID, g_.a.ld = K - 1);
    F8_ARG("rows 0, NULL scales", OVL_OK, g_.rows = 0; g_.a_scale = g_.b_scale = NULL);
#undef F8_ARG

    for (int i = 0; i < nc; i++) {
        char lerr[512] = "";
        size_t before = ovld_lt_cache_size(lt), bad = 0;
        cudaError_t ce;
        ovl_status_t st = OVL_OK;
        why[0] = '\0';
        if ((ce = cudaMemset(dc, 0xFF, sizeof hc)) == cudaSuccess) {
            st = ovld_lt_gemm(lt, s, g_ws, OVLD_LT_WORKSPACE, &cases[i].g, lerr, sizeof lerr);
            if ((ce = cudaStreamSynchronize(s)) == cudaSuccess)
                ce = cudaMemcpy(hc, dc, sizeof hc, cudaMemcpyDeviceToHost);
        }
        for (size_t b = 0; b < sizeof hc; b++)
            bad += hc[b] != 0xFF;
        if (ce != cudaSuccess)
            snprintf(why, sizeof why, " (%s)", cudaGetErrorName(ce));
        else if (bad)
            snprintf(why, sizeof why, " (%zu bytes of C written)", bad);
        bool ok = ce == cudaSuccess && st == cases[i].want && ovld_lt_cache_size(lt) == before &&
                  bad == 0 && (st == OVL_OK || lerr[0] != '\0');
        printf("%s args-fp8   %-20s -> %s%s%s%s\n", ok ? "PASS" : "FAIL", cases[i].name,
               ovl_strerror(st), lerr[0] ? ": " : "", lerr, why);
        if (ok)
            g_pass++;
        else
            g_fail++;
    }
    cudaFree(dc);
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

    run_fp8_cases(lt, s);
    run_fp8_arg_checks(lt, s, scratch);
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

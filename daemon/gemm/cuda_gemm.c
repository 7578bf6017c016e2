/*
 * cuda_gemm.c: ovl's GEMMs through cuBLASLt.
 *
 * Row-major to column-major. cuBLASLt's layouts are column-major, and a
 * row-major matrix of r rows and leading dimension ld is the column-major
 * matrix of its transpose with the same ld. So the row-major product
 * C = A @ op(B) is computed as the column-major C^T = op(B)^T * A^T, with the
 * operands swapped: cuBLASLt's "A" is our B and its "B" is our A.
 *   our B, transb == 0: k x n row-major = column-major n x k, ld ldb, op N
 *   our B, transb != 0: n x k row-major = column-major k x n, ld ldb, op T
 *   our A:              rows x k row-major = column-major k x rows, ld lda, op N
 *   our C (C and D):    rows x n row-major = column-major n x rows, ld ldc
 *   our ACC (C, beta 1): rows x n row-major = column-major n x rows, ld ldacc
 * C = A @ op(B) / div + ACC is alpha = 1/div and beta = 1 on ACC as
 * cuBLASLt's C (of the same type as D, as cuBLASLt wants outside fp8);
 * without ACC beta is 0 and C is D.
 * Batches of row blocks are strided batches: A and C step block_stride rows
 * (block_stride * ld elements), B steps 0 (one B broadcast to every block).
 *
 * The cache. Building descriptors and asking the heuristic costs tens of
 * microseconds, more than a small GEMM takes on the GPU, and a plan repeats a
 * handful of shapes, so each distinct GEMM keeps its matmul descriptor, four
 * layouts and chosen algorithm. The key is everything the choice depends on:
 * dtype, shape, leading dimensions, transb, batch, the real alignment of each
 * pointer (a row chunk of a buffer may be aligned to 2 bytes only, and an
 * algorithm chosen for 256 may then fault or fail) and the workspace cap.
 * Entries live in an array; an open-addressing table of LT_SLOTS indices,
 * twice the most entries, finds them with short linear probes. The cache is
 * bounded at LT_CACHE_MAX entries: inserting into a full cache first empties
 * it (no eviction order to keep, no tombstones; a working set larger than 4096
 * shapes is not a case ovl has). Emptying it is safe with GEMMs in flight:
 * cublasLtMatmul takes what it needs from the descriptors when it enqueues.
 *
 * Threads: none of this is thread-safe, and the cache is unlocked. The CUDA
 * backend has one ovld_lt_t per device, used by one thread at a time: the
 * thread issuing the ranks of an op on that device (exec.c: ranks that
 * share a device are issued from one thread, and ops one at a time).
 */
#include "cuda_gemm.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define LT_CACHE_MAX  4096u /* entries */
#define LT_SLOTS      8192u /* hash slots, a power of two; load stays <= 1/2 */
#define LT_MAX_ALIGN  256u  /* cuBLASLt's default and largest alignment preference */
#define LT_WS_ALIGN   256u  /* cublasLtMatmul wants a 256-byte aligned workspace */
#define LT_HEURISTICS 8     /* results asked of the heuristic */

/* All uint64_t, so that the struct has no padding and memcmp compares keys. */
typedef struct lt_key {
    uint64_t dtype, rows, n, k, lda, ldb, ldc, transb, nblocks, block_stride;
    uint64_t ldacc;                              /* ACC's (cuBLASLt's C); 0: no ACC, C is D */
    uint64_t align_a, align_b, align_c, align_d; /* bytes; ours: A, B, ACC (or C), C */
    uint64_t ws_cap;
} lt_key_t;

typedef struct lt_entry {
    lt_key_t key;
    uint64_t hash;
    cublasLtMatmulDesc_t desc;
    /* Named after our matrices: lay_a is cuBLASLt's B, lay_b its A. */
    cublasLtMatrixLayout_t lay_a, lay_b, lay_c, lay_d;
    cublasLtMatmulAlgo_t algo;
    size_t ws_needed;
} lt_entry_t;

struct ovld_lt {
    cublasLtHandle_t handle;
    lt_entry_t *ents;
    size_t nents, cap;
    int32_t *slots; /* LT_SLOTS indices into ents; -1: empty */
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The GEMM in words, for messages: enough to reproduce the failing call. */
static void describe(const lt_key_t *key, char *buf, size_t len)
{
    const char *dt = ovl_dtype_name((ovl_dtype_t)key->dtype);
    snprintf(buf, len,
             "%s rows %llu n %llu k %llu, lda %llu ldb %llu ldc %llu ldacc %llu, transb %d, "
             "nblocks %llu stride %llu, align a/b/acc/c %llu/%llu/%llu/%llu, workspace %llu",
             dt ? dt : "?", (unsigned long long)key->rows, (unsigned long long)key->n,
             (unsigned long long)key->k, (unsigned long long)key->lda, (unsigned long long)key->ldb,
             (unsigned long long)key->ldc, (unsigned long long)key->ldacc, (int)key->transb,
             (unsigned long long)key->nblocks, (unsigned long long)key->block_stride,
             (unsigned long long)key->align_a, (unsigned long long)key->align_b,
             (unsigned long long)key->align_c, (unsigned long long)key->align_d,
             (unsigned long long)key->ws_cap);
}

/* "CUBLAS_STATUS_NOT_SUPPORTED" and the like, never NULL. */
static const char *status_name(cublasStatus_t st)
{
    const char *name = cublasLtGetStatusName(st);
    return name ? name : "unknown cuBLAS status";
}

static ovl_status_t lt_fail(char *err, size_t errlen, const char *call, cublasStatus_t st,
                            const lt_key_t *key)
{
    char shape[256];
    describe(key, shape, sizeof shape);
    set_err(err, errlen, "%s: %s (%s)", call, status_name(st), shape);
    return OVL_ERR_BACKEND;
}

static ovl_status_t cuda_fail(char *err, size_t errlen, const char *call, cudaError_t ce,
                              const lt_key_t *key)
{
    char shape[256];
    describe(key, shape, sizeof shape);
    set_err(err, errlen, "%s: %s (%s)", call, cudaGetErrorName(ce), shape);
    return OVL_ERR_BACKEND;
}

/* The largest power of two dividing x, at most LT_MAX_ALIGN (x == 0: the cap). */
static uint64_t align_of(uint64_t x)
{
    uint64_t a = x & (~x + 1);
    return a == 0 || a > LT_MAX_ALIGN ? LT_MAX_ALIGN : a;
}

static uint64_t min_u64(uint64_t x, uint64_t y)
{
    return x < y ? x : y;
}

static cudaDataType_t cuda_type(ovl_dtype_t dtype)
{
    switch (dtype) {
    case OVL_DTYPE_BF16:
        return CUDA_R_16BF;
    case OVL_DTYPE_FP16:
        return CUDA_R_16F;
    case OVL_DTYPE_FP32:
        return CUDA_R_32F;
    }
    return CUDA_R_32F; /* not reached: dtypes are validated first */
}

/* FNV-1a over the key's bytes. */
static uint64_t key_hash(const lt_key_t *key)
{
    const unsigned char *p = (const unsigned char *)key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof *key; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Destroys what an entry holds; NULL members are skipped, so a half-built
 * entry (zeroed first) is released the same way. */
static void entry_release(lt_entry_t *e)
{
    /* Destroy calls only fail on a NULL argument, which is skipped here. */
    if (e->lay_d)
        (void)cublasLtMatrixLayoutDestroy(e->lay_d);
    if (e->lay_c)
        (void)cublasLtMatrixLayoutDestroy(e->lay_c);
    if (e->lay_b)
        (void)cublasLtMatrixLayoutDestroy(e->lay_b);
    if (e->lay_a)
        (void)cublasLtMatrixLayoutDestroy(e->lay_a);
    if (e->desc)
        (void)cublasLtMatmulDescDestroy(e->desc);
    e->lay_a = e->lay_b = e->lay_c = e->lay_d = NULL;
    e->desc = NULL;
}

static void cache_clear(ovld_lt_t *lt)
{
    for (size_t i = 0; i < lt->nents; i++)
        entry_release(&lt->ents[i]);
    lt->nents = 0;
    for (size_t i = 0; i < LT_SLOTS; i++)
        lt->slots[i] = -1;
}

static lt_entry_t *cache_find(ovld_lt_t *lt, const lt_key_t *key, uint64_t hash)
{
    for (size_t i = hash & (LT_SLOTS - 1);; i = (i + 1) & (LT_SLOTS - 1)) {
        int32_t idx = lt->slots[i];
        if (idx < 0)
            return NULL;
        lt_entry_t *e = &lt->ents[idx];
        if (e->hash == hash && memcmp(&e->key, key, sizeof *key) == 0)
            return e;
    }
}

/*
 * Moves *e into the cache and returns where it now lives, or NULL when the
 * array cannot grow (the caller keeps ownership of *e then). A full cache is
 * emptied first; the table never holds more than half its slots, so the
 * probe below ends.
 */
static lt_entry_t *cache_insert(ovld_lt_t *lt, const lt_entry_t *e)
{
    if (lt->nents == LT_CACHE_MAX)
        cache_clear(lt);
    if (lt->nents == lt->cap) {
        size_t ncap = lt->cap ? lt->cap * 2 : 16;
        if (ncap > LT_CACHE_MAX)
            ncap = LT_CACHE_MAX;
        lt_entry_t *n = realloc(lt->ents, ncap * sizeof *n);
        if (n == NULL)
            return NULL;
        lt->ents = n;
        lt->cap = ncap;
    }
    size_t idx = lt->nents++;
    lt->ents[idx] = *e;
    size_t i = e->hash & (LT_SLOTS - 1);
    while (lt->slots[i] >= 0)
        i = (i + 1) & (LT_SLOTS - 1);
    lt->slots[i] = (int32_t)idx;
    return &lt->ents[idx];
}

/* Shorthands for entry_build's checks: every call's status, one exit. */
#define LT_TRY(call, what)                                                                         \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            status = lt_fail(err, errlen, (what), st_, key);                                       \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static cublasStatus_t set_batch(cublasLtMatrixLayout_t lay, int32_t count, int64_t stride)
{
    cublasStatus_t st = cublasLtMatrixLayoutSetAttribute(lay, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof count);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    return cublasLtMatrixLayoutSetAttribute(lay, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride);
}

/*
 * Fills *e (descriptor, layouts, algorithm) for key. On failure *e holds
 * nothing. The key's values were range-checked by the caller: dimensions fit
 * int32 where cuBLASLt wants them to, leading dimensions and strides int64.
 */
static ovl_status_t entry_build(ovld_lt_t *lt, const lt_key_t *key, uint64_t hash, lt_entry_t *e,
                                char *err, size_t errlen)
{
    ovl_status_t status = OVL_OK;
    cublasLtMatmulPreference_t pref = NULL;
    cudaDataType_t dt = cuda_type((ovl_dtype_t)key->dtype);

    memset(e, 0, sizeof *e);
    e->key = *key;
    e->hash = hash;

    /* fp32 accumulation and fp32 alpha/beta for every dtype; plain
     * CUBLAS_COMPUTE_32F keeps fp32 inputs out of TF32 (that would take
     * CUBLAS_COMPUTE_32F_FAST_TF32). */
    LT_TRY(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
    int32_t opa = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N; /* attribute is int32_t */
    int32_t opb = CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
    LT_TRY(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "cublasLtMatmulDescSetAttribute(TRANSB)");

    /* cuBLASLt's A: our B as stored, column-major. */
    uint64_t brows = key->transb ? key->k : key->n;
    uint64_t bcols = key->transb ? key->n : key->k;
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_b, dt, brows, bcols, (int64_t)key->ldb),
           "cublasLtMatrixLayoutCreate(B)");
    /* cuBLASLt's B: A^T, k x rows. */
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_a, dt, key->k, key->rows, (int64_t)key->lda),
           "cublasLtMatrixLayoutCreate(A)");
    /* C and D: C^T, n x rows (cuBLASLt's C: ACC's, where there is one). */
    uint64_t ldlc = key->ldacc ? key->ldacc : key->ldc;
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_c, dt, key->n, key->rows, (int64_t)ldlc),
           "cublasLtMatrixLayoutCreate(C)");
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_d, dt, key->n, key->rows, (int64_t)key->ldc),
           "cublasLtMatrixLayoutCreate(D)");

    if (key->nblocks > 1) {
        /* Batch count and stride on every layout: cuBLASLt takes each
         * matrix's batch from its own layout and wants the counts equal. */
        int32_t count = (int32_t)key->nblocks;
        int64_t sa = (int64_t)(key->block_stride * key->lda);
        int64_t sc = (int64_t)(key->block_stride * key->ldc);
        int64_t slc = (int64_t)(key->block_stride * ldlc);
        LT_TRY(set_batch(e->lay_b, count, 0), "cublasLtMatrixLayoutSetAttribute(B batch)");
        LT_TRY(set_batch(e->lay_a, count, sa), "cublasLtMatrixLayoutSetAttribute(A batch)");
        LT_TRY(set_batch(e->lay_c, count, slc), "cublasLtMatrixLayoutSetAttribute(C batch)");
        LT_TRY(set_batch(e->lay_d, count, sc), "cublasLtMatrixLayoutSetAttribute(D batch)");
    }

    LT_TRY(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    /* The workspace preference defaults to 0, which rules out split-K and
     * most Hopper kernels; the alignments default to 256, which would choose
     * kernels that cannot run on a chunk starting at an odd row. Lt's A is
     * our B, Lt's B our A. */
    uint64_t ws = key->ws_cap;
    uint32_t al_a = (uint32_t)key->align_b, al_b = (uint32_t)key->align_a;
    uint32_t al_c = (uint32_t)key->align_c, al_d = (uint32_t)key->align_d;
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws),
           "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al_a, sizeof al_a),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al_b, sizeof al_b),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al_c, sizeof al_c),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)");
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al_d, sizeof al_d),
           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)");

    cublasLtMatmulHeuristicResult_t res[LT_HEURISTICS];
    int nres = 0;
    memset(res, 0, sizeof res);
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt->handle, e->desc, e->lay_b, e->lay_a, e->lay_c, e->lay_d,
                                       pref, LT_HEURISTICS, res, &nres);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
        /* "No heuristic function available for current configuration". */
        char shape[256];
        describe(key, shape, sizeof shape);
        set_err(err, errlen, "cublasLtMatmulAlgoGetHeuristic: %s (%s)", status_name(st), shape);
        status = OVL_ERR_UNSUPPORTED;
        goto out;
    }
    LT_TRY(st, "cublasLtMatmulAlgoGetHeuristic");
    /* Results come best first; the workspace test is a belt to the
     * preference's braces. */
    int pick = -1;
    for (int i = 0; i < nres && i < LT_HEURISTICS; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= key->ws_cap) {
            pick = i;
            break;
        }
    if (pick < 0) {
        char shape[256];
        describe(key, shape, sizeof shape);
        set_err(err, errlen, "cublasLtMatmulAlgoGetHeuristic: no algorithm (%s)", shape);
        status = OVL_ERR_UNSUPPORTED;
        goto out;
    }
    e->algo = res[pick].algo;
    e->ws_needed = res[pick].workspaceSize;

out:
    if (pref)
        (void)cublasLtMatmulPreferenceDestroy(pref);
    if (status != OVL_OK)
        entry_release(e);
    return status;
}

#undef LT_TRY

ovl_status_t ovld_lt_create(ovld_lt_t **ret, char *err, size_t errlen)
{
    ovl_status_t status = OVL_OK;
    ovld_lt_t *lt = NULL;

    if (ret == NULL) {
        set_err(err, errlen, "ovld_lt_create: NULL result pointer");
        return OVL_ERR_INVALID;
    }
    lt = calloc(1, sizeof *lt);
    if (lt == NULL || (lt->slots = malloc(LT_SLOTS * sizeof *lt->slots)) == NULL) {
        set_err(err, errlen, "ovld_lt_create: out of memory");
        status = OVL_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < LT_SLOTS; i++)
        lt->slots[i] = -1;
    cublasStatus_t st = cublasLtCreate(&lt->handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        lt->handle = NULL;
        set_err(err, errlen, "cublasLtCreate: %s", status_name(st));
        status = OVL_ERR_BACKEND;
        goto out;
    }
    *ret = lt;
    lt = NULL;

out:
    ovld_lt_destroy(lt);
    return status;
}

void ovld_lt_destroy(ovld_lt_t *lt)
{
    if (lt == NULL)
        return;
    if (lt->slots)
        cache_clear(lt);
    free(lt->ents);
    free(lt->slots);
    if (lt->handle)
        (void)cublasLtDestroy(lt->handle);
    free(lt);
}

size_t ovld_lt_cache_size(const ovld_lt_t *lt)
{
    return lt ? lt->nents : 0;
}

/* k == 0: C = A @ op(B) is all zeros, which no GEMM call writes for us. */
static ovl_status_t zero_c(cudaStream_t s, const lt_key_t *key, void *c, size_t es, char *err,
                           size_t errlen)
{
    uint64_t nb = key->nblocks;
    for (uint64_t blk = 0; blk < nb; blk++) {
        char *p = (char *)c + blk * key->block_stride * key->ldc * es;
        cudaError_t ce = cudaMemset2DAsync(p, key->ldc * es, 0, key->n * es, key->rows, s);
        if (ce != cudaSuccess)
            return cuda_fail(err, errlen, "cudaMemset2DAsync", ce, key);
    }
    return OVL_OK;
}

/* Whether x * y fits int64_t (both non-negative). */
static bool fits_i64(uint64_t x, uint64_t y)
{
    return x == 0 || y <= (uint64_t)INT64_MAX / x;
}

/*
 * Checks g and puts it in the normal form the cache is keyed on, so that
 * equal GEMMs share an entry: one block has no stride, and back-to-back
 * blocks are one taller GEMM (faster than a batch of short ones). *empty:
 * C has no elements, nothing to do.
 */
static ovl_status_t make_key(const ovld_gemm_args_t *g, uint64_t ws_cap, lt_key_t *key, bool *empty,
                             char *err, size_t errlen)
{
    size_t es = ovl_dtype_size(g->dtype);
    uint64_t rows = g->rows, n = g->n, k = g->k;
    uint64_t lda = g->a.ld, ldb = g->b.ld, ldc = g->c.ld, ldacc = g->acc.ptr ? g->acc.ld : 0;
    uint64_t nblocks = g->nblocks, stride = g->block_stride;

    *empty = false;
    if (es == 0) {
        set_err(err, errlen, "ovld_lt_gemm: unknown dtype %d", (int)g->dtype);
        return OVL_ERR_INVALID;
    }
    /* Leading dimensions are checked even for empty GEMMs, as hostgemm does:
     * a caller that gets them wrong there gets them wrong elsewhere too. */
    if (lda < k || ldc < n || ldb < (g->transb ? k : n)) {
        set_err(err, errlen,
                "ovld_lt_gemm: leading dimension too small (lda %llu ldb %llu ldc %llu for n %llu "
                "k %llu transb %d)",
                (unsigned long long)lda, (unsigned long long)ldb, (unsigned long long)ldc,
                (unsigned long long)n, (unsigned long long)k, (int)g->transb);
        return OVL_ERR_INVALID;
    }
    if (g->acc.ptr && ldacc < n) {
        set_err(err, errlen, "ovld_lt_gemm: ACC's leading dimension %llu < n %llu",
                (unsigned long long)ldacc, (unsigned long long)n);
        return OVL_ERR_INVALID;
    }
    if (rows == 0 || n == 0 || nblocks == 0) {
        *empty = true;
        return OVL_OK;
    }
    if ((g->a.ptr == NULL && k) || (g->b.ptr == NULL && k) || g->c.ptr == NULL) {
        set_err(err, errlen,
                "ovld_lt_gemm: NULL matrix (a %p b %p c %p) with rows %llu n %llu k %llu", g->a.ptr,
                g->b.ptr, g->c.ptr, (unsigned long long)rows, (unsigned long long)n,
                (unsigned long long)k);
        return OVL_ERR_INVALID;
    }
    if (nblocks > 1 && stride < rows) {
        /* Blocks of C would overlap, and batch members race on the GPU. */
        set_err(err, errlen, "ovld_lt_gemm: block_stride %llu < rows %llu with %llu blocks",
                (unsigned long long)stride, (unsigned long long)rows, (unsigned long long)nblocks);
        return OVL_ERR_INVALID;
    }

    if (nblocks > 1 && stride == rows && rows <= UINT64_MAX / nblocks) {
        /* (ACC, of the same rows, merges with them) */
        rows *= nblocks;
        nblocks = 1;
    }
    if (nblocks == 1)
        stride = 0;

    /* cuBLASLt's rows and columns are int32 in practice ("usually only values
     * that can be expressed as int32_t are supported"), the batch count is
     * int32_t, leading dimensions and batch strides (in elements) int64_t,
     * and so must be the offset of the last batch member. */
    const uint64_t i32 = INT32_MAX;
    uint64_t ldmax = lda > ldc ? lda : ldc;
    if (ldacc > ldmax)
        ldmax = ldacc;
    if (rows > i32 || n > i32 || k > i32 || nblocks > i32 || !fits_i64(1, lda) ||
        !fits_i64(1, ldb) || !fits_i64(1, ldc) || !fits_i64(1, ldacc) || !fits_i64(stride, ldmax) ||
        !fits_i64(nblocks - 1, stride * ldmax)) {
        set_err(err, errlen,
                "ovld_lt_gemm: GEMM too large for cuBLASLt (rows %llu n %llu k %llu nblocks %llu "
                "stride %llu lda %llu ldb %llu ldc %llu)",
                (unsigned long long)rows, (unsigned long long)n, (unsigned long long)k,
                (unsigned long long)nblocks, (unsigned long long)stride, (unsigned long long)lda,
                (unsigned long long)ldb, (unsigned long long)ldc);
        return OVL_ERR_UNSUPPORTED;
    }

    memset(key, 0, sizeof *key); /* no stray bytes for memcmp and the hash */
    key->dtype = (uint64_t)g->dtype;
    key->rows = rows;
    key->n = n;
    key->k = k;
    key->lda = lda;
    key->ldb = ldb;
    key->ldc = ldc;
    key->ldacc = ldacc;
    key->transb = g->transb ? 1 : 0;
    key->nblocks = nblocks;
    key->block_stride = stride;
    /* Every batch member's pointer is base + i * stride * ld elements, so its
     * alignment is at least the smaller of the base's and the step's. */
    key->align_a = align_of((uint64_t)(uintptr_t)g->a.ptr);
    key->align_b = align_of((uint64_t)(uintptr_t)g->b.ptr);
    key->align_d = align_of((uint64_t)(uintptr_t)g->c.ptr);
    key->align_c = ldacc ? align_of((uint64_t)(uintptr_t)g->acc.ptr) : key->align_d;
    if (nblocks > 1) {
        key->align_a = min_u64(key->align_a, align_of(stride * lda * es));
        key->align_d = min_u64(key->align_d, align_of(stride * ldc * es));
        key->align_c = min_u64(key->align_c, align_of(stride * (ldacc ? ldacc : ldc) * es));
    }
    key->ws_cap = ws_cap;
    return OVL_OK;
}

ovl_status_t ovld_lt_gemm(ovld_lt_t *lt, cudaStream_t s, void *workspace, size_t workspace_bytes,
                          const ovld_gemm_args_t *g, char *err, size_t errlen)
{
    /* Host pointer mode (the default): alpha and beta are read at the call.
     * Without ACC beta == 0, so C is not read and may be D. */
    float alpha = 1.0f, beta = 0.0f;
    ovl_status_t status = OVL_OK;
    lt_entry_t tmp;
    bool tmp_owned = false; /* tmp holds descriptors that the cache did not take */
    lt_entry_t *e = NULL;
    lt_key_t key;
    bool empty = false;
    uint64_t ws_skip, hash;
    cublasStatus_t st;

    memset(&tmp, 0, sizeof tmp);
    if (lt == NULL || g == NULL) {
        set_err(err, errlen, "ovld_lt_gemm: NULL %s", lt == NULL ? "handle" : "arguments");
        status = OVL_ERR_INVALID;
        goto out;
    }

    /* cublasLtMatmul wants the workspace on 256 bytes; a misaligned one
     * loses its head. */
    ws_skip = (LT_WS_ALIGN - (uint64_t)(uintptr_t)workspace % LT_WS_ALIGN) % LT_WS_ALIGN;
    if (workspace == NULL || workspace_bytes <= ws_skip) {
        workspace = NULL;
        workspace_bytes = 0;
    } else {
        workspace = (char *)workspace + ws_skip;
        workspace_bytes -= ws_skip;
    }

    status = make_key(g, workspace_bytes, &key, &empty, err, errlen);
    if (status != OVL_OK || empty)
        goto out;

    if (key.k == 0 && !key.ldacc) {
        status = zero_c(s, &key, g->c.ptr, ovl_dtype_size(g->dtype), err, errlen);
        goto out;
    }
    if (key.k == 0) {
        /* ACC / div with nothing to add: cuBLASLt wants k > 0 */
        set_err(err, errlen, "ovld_lt_gemm: k 0 with ACC");
        status = OVL_ERR_UNSUPPORTED;
        goto out;
    }
    if (g->div > 1)
        alpha = 1.0f / (float)g->div;
    if (key.ldacc)
        beta = 1.0f;

    hash = key_hash(&key);
    e = cache_find(lt, &key, hash);
    if (e == NULL) {
        status = entry_build(lt, &key, hash, &tmp, err, errlen);
        if (status != OVL_OK)
            goto out;
        e = cache_insert(lt, &tmp);
        if (e == NULL) {
            /* No room to cache it: run it once from tmp, then let it go. */
            tmp_owned = true;
            e = &tmp;
        }
    }

    /* The whole workspace is passed; the algorithm needs e->ws_needed of
     * it. */
    st = cublasLtMatmul(lt->handle, e->desc, &alpha, g->b.ptr, e->lay_b, g->a.ptr, e->lay_a, &beta,
                        key.ldacc ? g->acc.ptr : g->c.ptr, e->lay_c, g->c.ptr, e->lay_d, &e->algo,
                        workspace, workspace_bytes, s);
    if (st != CUBLAS_STATUS_SUCCESS)
        status = lt_fail(err, errlen, "cublasLtMatmul", st, &key);

out:
    if (tmp_owned)
        entry_release(&tmp);
    return status;
}

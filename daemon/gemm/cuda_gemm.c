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
 * Scaled (fp8) GEMMs (gemm_args.h): C = sa(i) sb(j) (A @ B^T) / div + bias[j]
 * + ACC, A and B fp8, C, ACC and bias in c_dtype. The same swap applies, to
 * the scales too: cuBLASLt's A scale is our b_scale, its B scale our a_scale.
 * OVL_SCALE_TENSOR is CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F (one float);
 * OVL_SCALE_ROW is OUTER_VEC_32F, whose vectors have cuBLASLt's M entries
 * for its A (our n: b_scale[j] per column of op(B)) and its N entries for its
 * B (our rows: a_scale[i] per row of A). cuBLASLt computes
 *   D = alpha * scaleA * scaleB * (op(A) op(B)) + beta * C, then + bias
 * in fp32 (CUBLAS_COMPUTE_32F, CUDA_R_32F scale type), so alpha = 1/div and
 * beta = 1 on ACC as above, and the bias epilogue (CUBLASLT_EPILOGUE_BIAS, a
 * vector of D's rows, our n, broadcast over its columns, our rows) adds
 * bias[j]. fp8 is "TN" only on Hopper: cuBLASLt's A transposed, its B not,
 * which is our transb (B stored n x k) and our A as it is. The scale and bias
 * pointers are descriptor attributes, not cublasLtMatmul arguments: the cached
 * descriptor gets each call's pointers just before its cublasLtMatmul (which
 * reads them when it enqueues), and the key holds their alignment, as it
 * holds the matrices'.
 * What cuBLASLt 13.1 refuses, seen on an H200, and what is done instead:
 *  - OUTER_VEC_32F on one side only (the heuristic: INVALID_VALUE; cuBLAS's
 *    documentation: both or neither): the tensor-wide scale becomes a vector
 *    of its value, 1.0f * scale by a plain fp32 GEMM (exact) into workspace
 *    scratch.
 *  - OUTER_VEC_32F with a strided batch (the heuristic: NOT_SUPPORTED; the
 *    vectors have no batch stride either, and each block needs its own
 *    a_scale rows): one matmul per block, a_scale offset by its first row.
 *  - a bias of fp32 for fp32 C (NOT_SUPPORTED; the fp8 GEMMs take a bf16
 *    bias only there): no epilogue; the bias is added after the GEMM by a
 *    plain fp32 rank-1 GEMM in place, C += ones x bias (exact but for C's
 *    one fp32 rounding).
 *  - a scale pointer, vector or scalar, less than 16-byte aligned
 *    (cublasLtMatmul: NOT_SUPPORTED at 4 and 8 bytes, which the heuristic
 *    cannot know), or a bias pointer so (the heuristic: NOT_SUPPORTED at 2
 *    bytes): the scale or bias is copied to 256-byte aligned scratch first.
 * Block scales (A 1x128 with B 1x128 or 128x128; ovl.h) are VEC128_32F and
 * BLK128x128_32F, which cuBLASLt offers on sm_90 from 12.9 on, in the
 * layouts PyTorch's _scaled_mm passes (its ScaledBlas.cpp checks them):
 * VEC128 k-block-major, the scale of (row, q) at q * rows + row (rows a
 * multiple of 4, so that each block of k starts 16-byte aligned), and
 * BLK128x128 row-major with each row of ceil(k/128) scales padded to a
 * multiple of 4. ovl's own layouts are row-major and dense, so they go
 * through scratch: A's transposed per matmul (its own rows; blocks of a
 * strided batch are a matmul each, as row scales are), B's 1x128 transposed
 * and B's 128x128 copied with the padding, each by one cuBLASLt transform
 * or 2D copy on the GEMM's stream: about 4 * ceil(k/128) * (every block's
 * rows + n) bytes of scratch.
 * The scratch is taken from the workspace's end (ovld_lt_gemm refuses with
 * OVL_ERR_UNSUPPORTED where the workspace is too small for it) and written
 * on the GEMM's stream, ones by byte memsets, so it is ordered with the
 * matmuls that read it.
 *
 * The cache. Building descriptors and asking the heuristic costs tens of
 * microseconds, more than a small GEMM takes on the GPU, and a plan repeats a
 * handful of shapes, so each distinct GEMM keeps its matmul descriptor, four
 * layouts and chosen algorithm. The key is everything the choice depends on:
 * dtype, shape, leading dimensions, transb, batch, the real alignment of each
 * pointer (a row chunk of a buffer may be aligned to 2 bytes only, and an
 * algorithm chosen for 256 may then fault or fail) and the workspace cap; for
 * scaled GEMMs also B's and C's dtypes, the scale modes, the bias (and its
 * dtype), fast accumulation and the alignment of the scale and bias pointers
 * (the heuristic reads the bias pointer's, cublasLt.h says).
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

#include "scaling.h"

#define LT_CACHE_MAX  4096u /* entries */
#define LT_SLOTS      8192u /* hash slots, a power of two; load stays <= 1/2 */
#define LT_MAX_ALIGN  256u  /* cuBLASLt's default and largest alignment preference */
#define LT_WS_ALIGN   256u  /* cublasLtMatmul wants a 256-byte aligned workspace */
#define LT_HEURISTICS 8     /* results asked of the heuristic */
#define LT_VEC_ALIGN  16u   /* what cublasLtMatmul wants of a scale pointer (bytes; seen) */

/* All uint64_t, so that the struct has no padding and memcmp compares keys. */
typedef struct lt_key {
    uint64_t dtype, rows, n, k, lda, ldb, ldc, transb, nblocks, block_stride;
    uint64_t ldacc;                              /* ACC's (cuBLASLt's C); 0: no ACC, C is D */
    uint64_t align_a, align_b, align_c, align_d; /* bytes; ours: A, B, ACC (or C), C */
    uint64_t ws_cap;
    /* Scaled (fp8) GEMMs. Not scaled: b_dtype and c_dtype are dtype, the
     * rest 0. */
    uint64_t scaled;
    uint64_t b_dtype, c_dtype;               /* ovl_dtype_t of B, and of C, ACC and bias */
    uint64_t a_mode, b_mode;                 /* ovl_scale_mode_t of our a_scale and b_scale */
    uint64_t bias, bias_dtype;               /* 1 and its ovl_dtype_t: the bias epilogue */
    uint64_t fast_accum;                     /* CUBLASLT_MATMUL_DESC_FAST_ACCUM */
    uint64_t align_sa, align_sb, align_bias; /* bytes; ours: a_scale, b_scale, bias */
} lt_key_t;

/* A scaled GEMM's per-call descriptor attributes, ours: a_scale (offset to
 * the matmul's first row where OVL_SCALE_ROW), b_scale, bias. */
typedef struct lt_ptrs {
    const void *sa, *sb, *bias;
} lt_ptrs_t;

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
    cublasLtMatrixTransformDesc_t transpose; /* fp32, op(A) = A^T; NULL until a block scale */
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

#define LT_DESCRIBE_LEN 512 /* describe()'s buffers */

static const char *dtype_str(uint64_t dtype)
{
    const char *name = ovl_dtype_name((ovl_dtype_t)dtype);
    return name ? name : "?";
}

static const char *mode_str(uint64_t mode)
{
    const char *name = ovl_scale_mode_name((ovl_scale_mode_t)mode);
    return name ? name : "?";
}

/* The GEMM in words, for messages: enough to reproduce the failing call. */
static void describe(const lt_key_t *key, char *buf, size_t len)
{
    int off =
        snprintf(buf, len,
                 "%s rows %llu n %llu k %llu, lda %llu ldb %llu ldc %llu ldacc %llu, "
                 "transb %d, nblocks %llu stride %llu, align a/b/acc/c %llu/%llu/%llu/%llu, "
                 "workspace %llu",
                 dtype_str(key->dtype), (unsigned long long)key->rows, (unsigned long long)key->n,
                 (unsigned long long)key->k, (unsigned long long)key->lda,
                 (unsigned long long)key->ldb, (unsigned long long)key->ldc,
                 (unsigned long long)key->ldacc, (int)key->transb, (unsigned long long)key->nblocks,
                 (unsigned long long)key->block_stride, (unsigned long long)key->align_a,
                 (unsigned long long)key->align_b, (unsigned long long)key->align_c,
                 (unsigned long long)key->align_d, (unsigned long long)key->ws_cap);
    if (!key->scaled || off < 0 || (size_t)off >= len)
        return;
    snprintf(buf + off, len - (size_t)off,
             "; scaled: B %s, C %s, a_scale %s (align %llu), b_scale %s (align %llu), bias %s "
             "(align %llu), fast_accum %d",
             dtype_str(key->b_dtype), dtype_str(key->c_dtype), mode_str(key->a_mode),
             (unsigned long long)key->align_sa, mode_str(key->b_mode),
             (unsigned long long)key->align_sb, key->bias ? dtype_str(key->bias_dtype) : "none",
             (unsigned long long)key->align_bias, (int)key->fast_accum);
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
    char shape[LT_DESCRIBE_LEN];
    describe(key, shape, sizeof shape);
    set_err(err, errlen, "%s: %s (%s)", call, status_name(st), shape);
    return OVL_ERR_BACKEND;
}

static ovl_status_t cuda_fail(char *err, size_t errlen, const char *call, cudaError_t ce,
                              const lt_key_t *key)
{
    char shape[LT_DESCRIBE_LEN];
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
    case OVL_DTYPE_FP8_E4M3:
        return CUDA_R_8F_E4M3;
    case OVL_DTYPE_FP8_E5M2:
        return CUDA_R_8F_E5M2;
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

/* What a scaled GEMM that the heuristic refuses may lack (cuBLAS's
 * cublasLtMatmul documentation on fp8; ovl checks none of it itself). */
#define FP8_HINT                                                                                   \
    "; cuBLASLt's fp8 GEMMs want 16-byte aligned pointers, leading dimensions of 16-byte "         \
    "multiples, k a multiple of 16 and C's rows (n elements) a 16-byte multiple"

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
 * A scaled GEMM's pointers, set on its descriptor: at build time (the
 * heuristic may read their values for alignment) and before every
 * cublasLtMatmul, since they change from call to call (other buffers, and
 * a_scale's row offset) while the descriptor is cached. Lt's A is our B, so
 * its A scale is our b_scale, its B scale our a_scale. Returns the first
 * failure, *what naming the attribute.
 */
static cublasStatus_t set_ptrs(cublasLtMatmulDesc_t desc, const lt_key_t *key, const lt_ptrs_t *p,
                               const char **what)
{
    cublasStatus_t st;

    if (!key->scaled)
        return CUBLAS_STATUS_SUCCESS;
    *what = "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)";
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p->sb,
                                        sizeof p->sb);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    *what = "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)";
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p->sa,
                                        sizeof p->sa);
    if (st != CUBLAS_STATUS_SUCCESS || !key->bias)
        return st;
    *what = "cublasLtMatmulDescSetAttribute(BIAS_POINTER)";
    return cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                          sizeof p->bias);
}

/* cublasLtMatmulMatrixScale_t of an ovl scale mode (int32_t, the attribute's
 * type). */
static int32_t lt_scale_mode(uint64_t mode)
{
    switch (mode) {
    case OVL_SCALE_ROW:
        return (int32_t)CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case OVL_SCALE_BLOCK_1X128:
        return (int32_t)CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case OVL_SCALE_BLOCK_128X128:
        return (int32_t)CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default:
        return (int32_t)CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    }
}

/*
 * A scaled GEMM's descriptor attributes beyond the unscaled ones: scale
 * modes, fast accumulation, the bias epilogue and the pointers.
 */
static cublasStatus_t set_scaled(cublasLtMatmulDesc_t desc, const lt_key_t *key, const lt_ptrs_t *p,
                                 const char **what)
{
    cublasStatus_t st;
    /* Lt's A is our B: its mode is our b_mode. */
    int32_t amode = lt_scale_mode(key->b_mode), bmode = lt_scale_mode(key->a_mode);
    int8_t fast = key->fast_accum ? 1 : 0; /* the attribute is int8_t */

    *what = "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)";
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode,
                                        sizeof amode);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    *what = "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)";
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode,
                                        sizeof bmode);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    *what = "cublasLtMatmulDescSetAttribute(FAST_ACCUM)";
    st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (key->bias) {
        /* Bias: a vector of D's rows (cuBLASLt's M, our n), broadcast over
         * D's columns (our rows) and every batch member (BIAS_BATCH_STRIDE
         * stays 0), added after alpha * AB + beta * C. */
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;                          /* uint32_t */
        int32_t bdt = (int32_t)cuda_type((ovl_dtype_t)key->bias_dtype); /* int32_t */
        *what = "cublasLtMatmulDescSetAttribute(EPILOGUE)";
        st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
        *what = "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)";
        st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bdt,
                                            sizeof bdt);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
    }
    return set_ptrs(desc, key, p, what);
}

/*
 * Fills *e (descriptor, layouts, algorithm) for key; p: a scaled GEMM's
 * pointers for this call. On failure *e holds nothing. The key's values were
 * range-checked by the caller: dimensions fit int32 where cuBLASLt wants them
 * to, leading dimensions and strides int64.
 */
static ovl_status_t entry_build(ovld_lt_t *lt, const lt_key_t *key, const lt_ptrs_t *p,
                                uint64_t hash, lt_entry_t *e, char *err, size_t errlen)
{
    ovl_status_t status = OVL_OK;
    cublasLtMatmulPreference_t pref = NULL;
    /* Our A, our B, and C/D (ACC's too). Not scaled: all dtype. */
    cudaDataType_t dt_a = cuda_type((ovl_dtype_t)key->dtype);
    cudaDataType_t dt_b = cuda_type((ovl_dtype_t)key->b_dtype);
    cudaDataType_t dt_c = cuda_type((ovl_dtype_t)key->c_dtype);

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
    if (key->scaled) {
        const char *what = "cublasLtMatmulDescSetAttribute";
        cublasStatus_t sst = set_scaled(e->desc, key, p, &what);
        LT_TRY(sst, what);
    }

    /* cuBLASLt's A: our B as stored, column-major. */
    uint64_t brows = key->transb ? key->k : key->n;
    uint64_t bcols = key->transb ? key->n : key->k;
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_b, dt_b, brows, bcols, (int64_t)key->ldb),
           "cublasLtMatrixLayoutCreate(B)");
    /* cuBLASLt's B: A^T, k x rows. */
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_a, dt_a, key->k, key->rows, (int64_t)key->lda),
           "cublasLtMatrixLayoutCreate(A)");
    /* C and D: C^T, n x rows (cuBLASLt's C: ACC's, where there is one); in
     * c_dtype for a scaled GEMM (cuBLASLt's fp8 GEMMs want C's type to be
     * D's for a bf16, fp16 or fp32 D). */
    uint64_t ldlc = key->ldacc ? key->ldacc : key->ldc;
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_c, dt_c, key->n, key->rows, (int64_t)ldlc),
           "cublasLtMatrixLayoutCreate(C)");
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lay_d, dt_c, key->n, key->rows, (int64_t)key->ldc),
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
        char shape[LT_DESCRIBE_LEN];
        describe(key, shape, sizeof shape);
        set_err(err, errlen, "cublasLtMatmulAlgoGetHeuristic: %s (%s)%s", status_name(st), shape,
                key->scaled ? FP8_HINT : "");
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
        char shape[LT_DESCRIBE_LEN];
        describe(key, shape, sizeof shape);
        set_err(err, errlen, "cublasLtMatmulAlgoGetHeuristic: no algorithm (%s)%s", shape,
                key->scaled ? FP8_HINT : "");
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
    if (lt->transpose)
        (void)cublasLtMatrixTransformDescDestroy(lt->transpose);
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

static bool is_out_dtype(ovl_dtype_t dt)
{
    return dt == OVL_DTYPE_BF16 || dt == OVL_DTYPE_FP16 || dt == OVL_DTYPE_FP32;
}

/*
 * A scaled GEMM's own checks (gemm_args.h, ovl.h's ovl_scaling_t): the
 * dtypes, transb and the modes. The scale pointers are checked with the
 * matrices', once the GEMM is known not to be empty.
 */
static ovl_status_t check_scaled(const ovld_gemm_args_t *g, char *err, size_t errlen)
{
    const char *a = ovl_dtype_name(g->dtype), *b = ovl_dtype_name(g->b_dtype);
    const char *c = ovl_dtype_name(g->c_dtype);

    if (!ovl_dtype_is_fp8(g->dtype) || !ovl_dtype_is_fp8(g->b_dtype)) {
        set_err(err, errlen,
                "ovld_lt_gemm: a scaled GEMM takes fp8 A and B (fp8e4m3 or fp8e5m2), not A %s "
                "and B %s",
                a ? a : "(unknown dtype)", b ? b : "(unknown dtype)");
        return OVL_ERR_INVALID;
    }
    if (g->dtype == OVL_DTYPE_FP8_E5M2 && g->b_dtype == OVL_DTYPE_FP8_E5M2) {
        set_err(err, errlen,
                "ovld_lt_gemm: a scaled GEMM of fp8e5m2 A and fp8e5m2 B is not supported (one of "
                "them must be fp8e4m3)");
        return OVL_ERR_INVALID;
    }
    if (!is_out_dtype(g->c_dtype)) {
        set_err(err, errlen, "ovld_lt_gemm: a scaled GEMM's C is bf16, fp16 or fp32, not %s",
                c ? c : "an unknown dtype");
        return OVL_ERR_INVALID;
    }
    if (!g->transb) {
        set_err(err, errlen,
                "ovld_lt_gemm: a scaled GEMM needs transb (B stored n x k, the one fp8 layout "
                "of cuBLASLt)");
        return OVL_ERR_INVALID;
    }
    /* the modes and the shapes they need (common/scaling.h); unsigned: an
     * enum may be signed, and a negative value is unknown */
    const char *why =
        ovl_scaling_refusal((unsigned)g->dtype, (unsigned)g->b_dtype, (unsigned)g->c_dtype,
                            (unsigned)g->a_mode, (unsigned)g->b_mode, g->transb);
    if (!why)
        why = ovl_scaling_shape_refusal(g->a_mode, g->b_mode, g->rows, g->n);
    if (why) {
        set_err(err, errlen, "ovld_lt_gemm: %s (a_mode %d, b_mode %d, rows %llu, n %llu)", why,
                (int)g->a_mode, (int)g->b_mode, (unsigned long long)g->rows,
                (unsigned long long)g->n);
        return OVL_ERR_INVALID;
    }
    return OVL_OK;
}

/*
 * dst = src^T in fp32 on s: src rows x cols row-major (dense), dst cols x
 * rows row-major (dense), by cublasLtMatrixTransform (no kernel of ours).
 * A row-major matrix is the column-major one of its transpose with the same
 * ld, so src is column-major cols x rows (ld cols), and dst the column-major
 * rows x cols (ld rows) op(A) = A^T of it.
 */
static ovl_status_t transpose_f32(ovld_lt_t *lt, cudaStream_t s, const float *src, uint64_t rows,
                                  uint64_t cols, float *dst, const lt_key_t *key, char *err,
                                  size_t errlen)
{
    cublasLtMatrixLayout_t la = NULL, lc = NULL;
    const float one = 1.0f, zero = 0.0f;
    const char *what = "cublasLtMatrixTransformDescCreate";
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;

    if (lt->transpose == NULL) {
        int32_t op = CUBLAS_OP_T; /* the attribute is int32_t */
        st = cublasLtMatrixTransformDescCreate(&lt->transpose, CUDA_R_32F);
        if (st != CUBLAS_STATUS_SUCCESS) {
            lt->transpose = NULL;
            goto out;
        }
        what = "cublasLtMatrixTransformDescSetAttribute(TRANSA)";
        st = cublasLtMatrixTransformDescSetAttribute(
            lt->transpose, CUBLASLT_MATRIX_TRANSFORM_DESC_TRANSA, &op, sizeof op);
        if (st != CUBLAS_STATUS_SUCCESS) {
            (void)cublasLtMatrixTransformDescDestroy(lt->transpose);
            lt->transpose = NULL;
            goto out;
        }
    }
    what = "cublasLtMatrixLayoutCreate (a block scale's transpose)";
    st = cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, cols, rows, (int64_t)cols);
    if (st != CUBLAS_STATUS_SUCCESS) {
        la = NULL;
        goto out;
    }
    st = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, rows, cols, (int64_t)rows);
    if (st != CUBLAS_STATUS_SUCCESS) {
        lc = NULL;
        goto out;
    }
    what = "cublasLtMatrixTransform (a block scale to cuBLASLt's layout)";
    st = cublasLtMatrixTransform(lt->handle, lt->transpose, &one, src, la, &zero, NULL, NULL, dst,
                                 lc, s);
out:
    if (lc)
        (void)cublasLtMatrixLayoutDestroy(lc);
    if (la)
        (void)cublasLtMatrixLayoutDestroy(la);
    return st == CUBLAS_STATUS_SUCCESS ? OVL_OK : lt_fail(err, errlen, what, st, key);
}

/*
 * Checks g and puts it in the normal form the cache is keyed on, so that
 * equal GEMMs share an entry: one block has no stride, and back-to-back
 * blocks are one taller GEMM (faster than a batch of short ones; a_scale's
 * rows are then back to back too). *empty: C has no elements, nothing to do.
 */
static ovl_status_t make_key(const ovld_gemm_args_t *g, uint64_t ws_cap, lt_key_t *key, bool *empty,
                             char *err, size_t errlen)
{
    ovl_dtype_t c_dt = g->scaled ? g->c_dtype : g->dtype;
    size_t es_a, es_c; /* bytes per element: A's, and C's (ACC's) */
    uint64_t rows = g->rows, n = g->n, k = g->k;
    uint64_t lda = g->a.ld, ldb = g->b.ld, ldc = g->c.ld, ldacc = g->acc.ptr ? g->acc.ld : 0;
    uint64_t nblocks = g->nblocks, stride = g->block_stride;

    *empty = false;
    if (g->scaled) {
        ovl_status_t st = check_scaled(g, err, errlen);
        if (st != OVL_OK)
            return st;
    } else if (ovl_dtype_is_fp8(g->dtype)) {
        set_err(err, errlen,
                "ovld_lt_gemm: dtype %s is an input of scaled GEMMs only (scaled, with its "
                "scales and an output dtype)",
                ovl_dtype_name(g->dtype));
        return OVL_ERR_INVALID;
    }
    es_a = ovl_dtype_size(g->dtype);
    es_c = ovl_dtype_size(c_dt);
    if (es_a == 0) {
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
    if (g->scaled && (g->a_scale == NULL || g->b_scale == NULL)) {
        set_err(err, errlen, "ovld_lt_gemm: scaled GEMM with a NULL scale (a_scale %p b_scale %p)",
                (const void *)g->a_scale, (const void *)g->b_scale);
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
        key->align_a = min_u64(key->align_a, align_of(stride * lda * es_a));
        key->align_d = min_u64(key->align_d, align_of(stride * ldc * es_c));
        key->align_c = min_u64(key->align_c, align_of(stride * (ldacc ? ldacc : ldc) * es_c));
    }
    key->ws_cap = ws_cap;
    key->b_dtype = (uint64_t)(g->scaled ? g->b_dtype : g->dtype);
    key->c_dtype = (uint64_t)c_dt;
    if (g->scaled) {
        key->scaled = 1;
        key->a_mode = (uint64_t)g->a_mode;
        key->b_mode = (uint64_t)g->b_mode;
        /* block scales take no fast accumulation: cuBLASLt's block-scaled
         * kernels on sm_90 promote to fp32 at every 128 of k, and PyTorch's
         * scaled_gemm and Transformer Engine refuse FAST_ACCUM with VEC128
         * and BLK128x128; the flag is ignored there (ovl.h) */
        key->fast_accum =
            g->fast_accum && !ovl_scale_mode_is_block((ovl_scale_mode_t)g->a_mode) ? 1 : 0;
        key->align_sa = align_of((uint64_t)(uintptr_t)g->a_scale);
        key->align_sb = align_of((uint64_t)(uintptr_t)g->b_scale);
        /* a row-scaled block's a_scale starts at its first row */
        if (nblocks > 1 && g->a_mode == OVL_SCALE_ROW)
            key->align_sa = min_u64(key->align_sa, align_of(stride * sizeof(float)));
        if (g->bias) {
            key->bias = 1;
            key->bias_dtype = (uint64_t)c_dt;
            key->align_bias = align_of((uint64_t)(uintptr_t)g->bias);
        }
    }
    return OVL_OK;
}

/*
 * Fills count floats at dst with 1.0f on stream s, with byte memsets (no
 * kernel of ours): 1.0f is 0x3f800000, bytes 00 00 80 3f in the GPU's
 * little-endian order.
 */
static ovl_status_t fill_ones(cudaStream_t s, void *dst, uint64_t count, const lt_key_t *key,
                              char *err, size_t errlen)
{
    char *p = dst;
    cudaError_t ce = cudaMemsetAsync(p, 0, count * sizeof(float), s);
    if (ce == cudaSuccess)
        ce = cudaMemset2DAsync(p + 2, sizeof(float), 0x80, 1, count, s);
    if (ce == cudaSuccess)
        ce = cudaMemset2DAsync(p + 3, sizeof(float), 0x3f, 1, count, s);
    if (ce != cudaSuccess)
        return cuda_fail(err, errlen, "cudaMemsetAsync (a vector of ones)", ce, key);
    return OVL_OK;
}

/* A plain fp32 GEMM that a scaled one needs (below), through ovld_lt_gemm;
 * a failure names it. */
static ovl_status_t helper_gemm(ovld_lt_t *lt, cudaStream_t s, void *ws, size_t ws_bytes,
                                const ovld_gemm_args_t *h, const char *what, char *err,
                                size_t errlen)
{
    char inner[LT_DESCRIBE_LEN + 256] = "";
    ovl_status_t st = ovld_lt_gemm(lt, s, ws, ws_bytes, h, inner, sizeof inner);
    if (st != OVL_OK)
        set_err(err, errlen, "ovld_lt_gemm: %s, for a scaled GEMM: %s", what, inner);
    return st;
}

static uint64_t round_up(uint64_t x, uint64_t to)
{
    return (x + to - 1) / to * to;
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
    lt_ptrs_t ptrs = {NULL, NULL, NULL};
    bool empty = false;
    uint64_t ws_skip, hash;
    uint64_t loops = 1, loop_rows = 0;     /* matmuls, and rows between them */
    bool sa_rows = false;                  /* a_scale per row: offset per matmul */
    bool bias_pass = false;                /* fp32 C's bias, added by a second GEMM */
    bool copy_sa = false, copy_sb = false; /* scales copied to aligned scratch */
    bool copy_bias = false;                /* the bias, likewise */
    uint64_t expand = 0;                   /* a tensor-wide scale made a vector of this length */
    uint64_t span = 0;     /* rows from the first block's first to the last's last */
    uint64_t nones = 0;    /* floats of 1.0f in scratch, for the rank-1 GEMMs */
    uint64_t sa_pitch = 0; /* bytes between blocks' a_scale copies */
    bool blocks = false;   /* block scales: both in cuBLASLt's layouts in scratch */
    uint64_t kq = 0;       /* block scales per row: ceil(k / 128) */
    uint64_t sb_ld = 0;    /* 128x128: B's scales' row pitch there, in floats */
    char *ones = NULL, *vec = NULL, *sa_copy = NULL, *sb_copy = NULL, *bias_copy = NULL;
    size_t es_a, es_c;
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
    es_a = ovl_dtype_size((ovl_dtype_t)key.dtype);
    es_c = ovl_dtype_size((ovl_dtype_t)key.c_dtype);

    if (key.k == 0 && !key.ldacc && !key.bias) {
        status = zero_c(s, &key, g->c.ptr, es_c, err, errlen);
        goto out;
    }
    if (key.k == 0) {
        /* ACC / div / bias with no product: cuBLASLt wants k > 0 */
        set_err(err, errlen, "ovld_lt_gemm: k 0 with %s", key.ldacc ? "ACC" : "a bias");
        status = OVL_ERR_UNSUPPORTED;
        goto out;
    }
    if (g->div > 1)
        alpha = 1.0f / (float)g->div;
    if (key.ldacc)
        beta = 1.0f;

    if (key.scaled) {
        ptrs.sa = g->a_scale;
        ptrs.sb = g->b_scale;
        ptrs.bias = g->bias;
        sa_rows = key.a_mode == OVL_SCALE_ROW;
        blocks = ovl_scale_mode_is_block((ovl_scale_mode_t)key.a_mode); /* and B's: the rule */
        kq = ovl_scale_blocks(key.k);
        span = (key.nblocks - 1) * key.block_stride + key.rows;
        if ((sa_rows || blocks || key.b_mode == OVL_SCALE_ROW) && key.nblocks > 1) {
            /* OUTER_VEC_32F and a strided batch: the heuristic answers
             * CUBLAS_STATUS_NOT_SUPPORTED (and the vectors have no batch
             * stride, where each block needs its own a_scale rows), so one
             * matmul per block (the key's alignments are already the worst
             * block's). */
            loops = key.nblocks;
            loop_rows = key.block_stride;
            key.nblocks = 1;
            key.block_stride = 0;
        }
        /* cuBLASLt takes OUTER_VEC_32F on both sides or on neither (its
         * heuristic answers CUBLAS_STATUS_INVALID_VALUE to one of each): a
         * tensor-wide scale beside a row one becomes a vector of its value,
         * our rows long for a_scale (cuBLASLt's N), n for b_scale (its M). */
        if (key.a_mode != key.b_mode && !blocks)
            expand = key.a_mode == OVL_SCALE_TENSOR ? key.rows : key.n;
        /* A bias for fp32 C: cuBLASLt's fp8 GEMMs take a bf16 bias only
         * there (NOT_SUPPORTED for an fp32 one), so the bias is added after
         * the GEMM, in place: C += ones(span) x bias, a rank-1 fp32 GEMM,
         * once for all blocks. */
        bias_pass = key.bias && key.c_dtype == OVL_DTYPE_FP32;
        /* A scale less than 16-byte aligned, an OUTER_VEC vector or a
         * SCALAR_32F one, makes cublasLtMatmul answer
         * CUBLAS_STATUS_NOT_SUPPORTED (4 and 8 bytes seen; the heuristic
         * cannot tell): it is copied to scratch, each block's a_scale rows
         * on 256 bytes, by one (2D) copy. A tensor-wide scale to expand
         * needs none (the expanded vector is aligned). */
        copy_sa = key.align_sa < LT_VEC_ALIGN && !(expand && !sa_rows) && !blocks;
        copy_sb = key.align_sb < LT_VEC_ALIGN && !(expand && sa_rows) && !blocks;
        /* A bias under 16-byte aligned: the heuristic (which reads the bias
         * pointer) offers nothing at 2 bytes; copied likewise. */
        copy_bias = key.bias && !bias_pass && key.align_bias < LT_VEC_ALIGN;
    }
    if (expand || bias_pass)
        nones = bias_pass && span > expand ? span : expand;
    if (nones || copy_sa || copy_sb || copy_bias || blocks) {
        /* Scratch at the workspace's end, 256-byte aligned: ones for the
         * rank-1 GEMMs, the expanded scale, the copied scales and bias. */
        uint64_t ones_bytes = round_up(nones * sizeof(float), LT_WS_ALIGN);
        uint64_t vec_bytes = round_up(expand * sizeof(float), LT_WS_ALIGN);
        uint64_t sa_bytes, sb_bytes, need;
        uint64_t bias_bytes = copy_bias ? round_up(key.n * es_c, LT_WS_ALIGN) : 0;
        sa_pitch = copy_sa ? round_up((sa_rows ? key.rows : 1) * sizeof(float), LT_WS_ALIGN) : 0;
        sa_bytes = sa_pitch * (sa_rows ? loops : 1);
        sb_bytes = copy_sb ? round_up((key.b_mode == OVL_SCALE_ROW ? key.n : 1) * sizeof(float),
                                      LT_WS_ALIGN)
                           : 0;
        if (blocks) {
            /* each matmul's A scales, kq x rows (k-block-major); B's, kq x
             * n (1x128) or ceil(n/128) rows of sb_ld floats (128x128) */
            sa_pitch = round_up(key.rows * kq * sizeof(float), LT_WS_ALIGN);
            sa_bytes = sa_pitch * loops;
            sb_ld = round_up(kq, 4);
            sb_bytes =
                round_up((key.b_mode == OVL_SCALE_BLOCK_1X128 ? key.n * kq
                                                              : ovl_scale_blocks(key.n) * sb_ld) *
                             sizeof(float),
                         LT_WS_ALIGN);
        }
        need = ones_bytes + vec_bytes + sa_bytes + sb_bytes + bias_bytes;
        if (workspace_bytes < need) {
            char shape[LT_DESCRIBE_LEN];
            describe(&key, shape, sizeof shape);
            set_err(err, errlen,
                    "ovld_lt_gemm: this scaled GEMM needs %llu bytes of workspace scratch, has %zu "
                    "(for:%s%s%s%s%s%s) (%s)",
                    (unsigned long long)need, (size_t)workspace_bytes,
                    blocks ? " block scales in cuBLASLt's layouts;" : "",
                    expand ? " a tensor-wide scale beside a row one;" : "",
                    bias_pass ? " an fp32 C's bias;" : "",
                    copy_sa ? " a_scale under 16-byte aligned;" : "",
                    copy_sb ? " b_scale under 16-byte aligned;" : "",
                    copy_bias ? " the bias under 16-byte aligned;" : "", shape);
            status = OVL_ERR_UNSUPPORTED;
            goto out;
        }
        workspace_bytes = (workspace_bytes - need) / LT_WS_ALIGN * LT_WS_ALIGN;
        ones = (char *)workspace + workspace_bytes;
        vec = ones + ones_bytes;
        sa_copy = vec + vec_bytes;
        sb_copy = sa_copy + sa_bytes;
        bias_copy = sb_copy + sb_bytes;
        if (workspace_bytes == 0)
            workspace = NULL;
        key.ws_cap = workspace_bytes;
    }
    if (nones) {
        status = fill_ones(s, ones, nones, &key, err, errlen);
        if (status != OVL_OK)
            goto out;
    }
    if (copy_sa) {
        /* per row: block b's rows from a_scale + b * loop_rows to sa_copy +
         * b * sa_pitch; tensor-wide: the one float */
        size_t width = (size_t)(sa_rows ? key.rows : 1) * sizeof(float);
        size_t spitch = sa_rows && loops > 1 ? (size_t)loop_rows * sizeof(float) : width;
        cudaError_t ce =
            cudaMemcpy2DAsync(sa_copy, (size_t)sa_pitch, g->a_scale, spitch, width,
                              (size_t)(sa_rows ? loops : 1), cudaMemcpyDeviceToDevice, s);
        if (ce != cudaSuccess) {
            status =
                cuda_fail(err, errlen, "cudaMemcpy2DAsync (a_scale to aligned scratch)", ce, &key);
            goto out;
        }
        ptrs.sa = sa_copy;
        key.align_sa = min_u64(align_of((uint64_t)(uintptr_t)sa_copy), align_of(sa_pitch));
    }
    if (copy_sb) {
        size_t bytes = (size_t)(key.b_mode == OVL_SCALE_ROW ? key.n : 1) * sizeof(float);
        cudaError_t ce = cudaMemcpyAsync(sb_copy, g->b_scale, bytes, cudaMemcpyDeviceToDevice, s);
        if (ce != cudaSuccess) {
            status =
                cuda_fail(err, errlen, "cudaMemcpyAsync (b_scale to aligned scratch)", ce, &key);
            goto out;
        }
        ptrs.sb = sb_copy;
        key.align_sb = align_of((uint64_t)(uintptr_t)sb_copy);
    }
    if (blocks) {
        /* ovl's layouts are row-major (ovl.h); cuBLASLt's (as PyTorch
         * passes them): VEC128 k-block-major, scale (row, q) at q * rows +
         * row for each matmul's own rows, so A's are transposed per matmul
         * (block b's rows from a_scale + b * loop_rows * kq) and B's 1x128
         * once; BLK128x128 row-major with rows 16-byte aligned (sb_ld). */
        for (uint64_t blk = 0; blk < loops; blk++) {
            status = transpose_f32(lt, s, g->a_scale + blk * loop_rows * kq, key.rows, kq,
                                   (float *)(sa_copy + blk * sa_pitch), &key, err, errlen);
            if (status != OVL_OK)
                goto out;
        }
        if (key.b_mode == OVL_SCALE_BLOCK_1X128) {
            status =
                transpose_f32(lt, s, g->b_scale, key.n, kq, (float *)sb_copy, &key, err, errlen);
            if (status != OVL_OK)
                goto out;
        } else {
            /* the rows' padding to sb_ld zeroed: cuBLAS asks for zeros
             * where a scale layout runs past the tensor */
            cudaError_t ce = cudaSuccess;
            if (sb_ld != kq)
                ce = cudaMemsetAsync(
                    sb_copy, 0, (size_t)ovl_scale_blocks(key.n) * (size_t)sb_ld * sizeof(float), s);
            if (ce == cudaSuccess)
                ce =
                    cudaMemcpy2DAsync(sb_copy, (size_t)(sb_ld * sizeof(float)), g->b_scale,
                                      (size_t)(kq * sizeof(float)), (size_t)(kq * sizeof(float)),
                                      (size_t)ovl_scale_blocks(key.n), cudaMemcpyDeviceToDevice, s);
            if (ce != cudaSuccess) {
                status = cuda_fail(err, errlen, "cudaMemcpy2DAsync (128x128 b_scale to scratch)",
                                   ce, &key);
                goto out;
            }
        }
        ptrs.sa = sa_copy;
        ptrs.sb = sb_copy;
        key.align_sa = min_u64(align_of((uint64_t)(uintptr_t)sa_copy), align_of(sa_pitch));
        key.align_sb = align_of((uint64_t)(uintptr_t)sb_copy);
    }
    if (copy_bias) {
        cudaError_t ce =
            cudaMemcpyAsync(bias_copy, g->bias, (size_t)key.n * es_c, cudaMemcpyDeviceToDevice, s);
        if (ce != cudaSuccess) {
            status = cuda_fail(err, errlen, "cudaMemcpyAsync (bias to aligned scratch)", ce, &key);
            goto out;
        }
        ptrs.bias = bias_copy;
        key.align_bias = align_of((uint64_t)(uintptr_t)bias_copy);
    }
    if (expand) {
        /* vec = ones (expand x 1) @ scale (1 x 1): each element 1.0f * the
         * scale, exact in fp32. Lt's scale of that side then points at it,
         * in OUTER_VEC mode as the other side's. */
        const float *tensor_scale = key.a_mode == OVL_SCALE_TENSOR ? g->a_scale : g->b_scale;
        ovld_gemm_args_t h = {.dtype = OVL_DTYPE_FP32,
                              .rows = expand,
                              .n = 1,
                              .k = 1,
                              .nblocks = 1,
                              .a = {ones, 1},
                              .b = {(void *)tensor_scale, 1},
                              .c = {vec, 1}};
        status = helper_gemm(lt, s, workspace, workspace_bytes, &h,
                             "the vector of a tensor-wide scale", err, errlen);
        if (status != OVL_OK)
            goto out;
        if (key.a_mode == OVL_SCALE_TENSOR) {
            ptrs.sa = vec;
            key.align_sa = align_of((uint64_t)(uintptr_t)vec);
        } else {
            ptrs.sb = vec;
            key.align_sb = align_of((uint64_t)(uintptr_t)vec);
        }
        key.a_mode = key.b_mode = OVL_SCALE_ROW;
    }
    if (bias_pass) {
        key.bias = 0;
        key.bias_dtype = 0;
        key.align_bias = 0;
        ptrs.bias = NULL;
    }

    /* After the helper GEMM above, which may grow (move) or empty the
     * cache, and done with e before the one below. */
    hash = key_hash(&key);
    e = cache_find(lt, &key, hash);
    if (e == NULL) {
        status = entry_build(lt, &key, &ptrs, hash, &tmp, err, errlen);
        if (status != OVL_OK)
            goto out;
        e = cache_insert(lt, &tmp);
        if (e == NULL) {
            /* No room to cache it: run it once from tmp, then let it go. */
            tmp_owned = true;
            e = &tmp;
        }
    }

    for (uint64_t blk = 0; blk < loops; blk++) {
        uint64_t r0 = blk * loop_rows; /* the block's first row */
        const char *a = (const char *)g->a.ptr + r0 * key.lda * es_a;
        char *c = (char *)g->c.ptr + r0 * key.ldc * es_c;
        const char *acc = key.ldacc ? (const char *)g->acc.ptr + r0 * key.ldacc * es_c : c;

        if (key.scaled) {
            const char *what = "cublasLtMatmulDescSetAttribute";
            if ((copy_sa && sa_rows) || blocks)
                ptrs.sa = sa_copy + blk * sa_pitch;
            else if (sa_rows)
                ptrs.sa = g->a_scale + r0;
            st = set_ptrs(e->desc, &key, &ptrs, &what);
            if (st != CUBLAS_STATUS_SUCCESS) {
                status = lt_fail(err, errlen, what, st, &key);
                goto out;
            }
        }
        /* The whole workspace is passed; the algorithm needs e->ws_needed of
         * it. Matmuls on one stream run one after the other, so they may
         * share it. */
        st = cublasLtMatmul(lt->handle, e->desc, &alpha, g->b.ptr, e->lay_b, a, e->lay_a, &beta,
                            acc, e->lay_c, c, e->lay_d, &e->algo, workspace, workspace_bytes, s);
        if (st != CUBLAS_STATUS_SUCCESS) {
            status = lt_fail(err, errlen, "cublasLtMatmul", st, &key);
            goto out;
        }
    }
    e = NULL;

    if (bias_pass) {
        /* C += ones (rows x 1) @ bias (1 x n), in place (ACC == C exactly:
         * cuBLASLt's in-place form, C and D one matrix of one layout),
         * batched over the blocks as given. */
        ovld_gemm_args_t h = {.dtype = OVL_DTYPE_FP32,
                              .rows = g->rows,
                              .n = g->n,
                              .k = 1,
                              .nblocks = g->nblocks,
                              .block_stride = g->block_stride,
                              .a = {ones, 1},
                              .b = {(void *)g->bias, g->n},
                              .c = g->c,
                              .acc = g->c};
        status = helper_gemm(lt, s, workspace, workspace_bytes, &h, "the fp32 bias", err, errlen);
    }

out:
    if (tmp_owned)
        entry_release(&tmp);
    return status;
}

/*
 * hostgemm.c: a blocked CPU GEMM for the host backend.
 *
 * Layout of the work. C is cut into panels of at most GEMM_NB columns. For
 * each panel the matching columns of op(B), all k rows of them, are converted
 * to fp32 and packed k-major (row kk of the panel is w contiguous floats,
 * zero-padded past the panel's last column), so that the inner loop reads one
 * contiguous float row whatever transb and dtype are. Rows of C are then
 * taken GEMM_MB at a time with an fp32 accumulator row each; k is walked in
 * blocks of GEMM_KB so that the packed block of B those rows reuse (at most
 * GEMM_KB x GEMM_NB floats, 256 KiB) stays in L2 while the accumulators stay
 * in L1/L2. Each stretch of a row of A is converted to fp32 just before use,
 * which costs 1/w of the multiply-adds.
 *
 * The kernel is written for gcc's auto-vectorizer at plain -O2, whose cheap
 * cost model only takes loops with a trip count known at compile time and no
 * aliasing doubt: its inner loop runs over restrict pointers exactly w times,
 * w a constant. Hence panels are padded, and their widths come from a short
 * list of powers of two (one kernel each): full panels are GEMM_NB wide and
 * the last one is cut into narrower ones, so that a narrow or ragged n
 * wastes under 16 columns rather than up to GEMM_NB - 1. No intrinsics, so
 * the x86-64 baseline (SSE2) and any other target build the same code.
 */
#include "hostgemm.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "matrix.h"

#define GEMM_NB   256 /* columns of C per full panel; the longest inner loop */
#define GEMM_NMIN 16  /* the narrowest panel */
#define GEMM_KB   256 /* k per block: a packed block of B is 256 KiB */
#define GEMM_MB   64  /* rows of C sharing a block of B: 64 KiB of accumulators */
#define GEMM_KU   4   /* rows of B per pass over an accumulator row */

static size_t min_size(size_t x, size_t y)
{
    return x < y ? x : y;
}

/*
 * Whether a rows x cols matrix with leading dimension ld (callers have
 * checked ld >= cols) and elements of esize bytes spans a byte range that
 * size_t can express, so that every index computed below is free of
 * overflow. The span is common/matrix.h's, the one definition.
 */
static bool extent_fits(uint64_t rows, uint64_t cols, size_t ld, size_t esize)
{
    uint64_t bytes;
    return ovl_matrix_extent(rows, cols, ld, esize, &bytes) == OVL_OK && bytes <= SIZE_MAX;
}

/*
 * The argument checks shared by the GEMM and the reference; out_esize is the
 * element size of the output (dtype's for C, a double's for ref).
 */
static ovl_status_t check_args(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k,
                               const void *a, size_t lda, const void *b, size_t ldb, int transb,
                               const void *c, size_t ldc, size_t out_esize)
{
    size_t es = ovl_dtype_size(dtype);
    if (es == 0)
        return OVL_ERR_INVALID;
    /* Leading dimensions are checked even for empty matrices: a caller that
     * gets them wrong there gets them wrong elsewhere too. */
    if (lda < k || ldc < n || ldb < (transb ? k : n))
        return OVL_ERR_INVALID;
    if ((a == NULL && rows && k) || (b == NULL && k && n) || (c == NULL && rows && n))
        return OVL_ERR_INVALID;
    if (!extent_fits(rows, k, lda, es) || !extent_fits(rows, n, ldc, out_esize))
        return OVL_ERR_INVALID;
    if (transb ? !extent_fits(n, k, ldb, es) : !extent_fits(k, n, ldb, es))
        return OVL_ERR_INVALID;
    return OVL_OK;
}

/* Converts count elements of dtype to fp32; the switch sits outside the loop
 * so that each loop is a simple one the compiler can vectorize. */
static void row_to_float(ovl_dtype_t dtype, const unsigned char *src, size_t count,
                         float *restrict dst)
{
    switch (dtype) {
    case OVL_DTYPE_BF16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            dst[i] = ovl_bf16_to_float(h);
        }
        return;
    case OVL_DTYPE_FP16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            dst[i] = ovl_fp16_to_float(h);
        }
        return;
    case OVL_DTYPE_FP32:
        memcpy(dst, src, count * sizeof(float));
        return;
    }
}

/* Rounds count floats to dtype; the one rounding each element of C gets. */
static void row_from_float(ovl_dtype_t dtype, const float *src, size_t count,
                           unsigned char *restrict dst)
{
    switch (dtype) {
    case OVL_DTYPE_BF16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h = ovl_bf16_from_float(src[i]);
            memcpy(dst + 2 * i, &h, sizeof h);
        }
        return;
    case OVL_DTYPE_FP16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h = ovl_fp16_from_float(src[i]);
            memcpy(dst + 2 * i, &h, sizeof h);
        }
        return;
    case OVL_DTYPE_FP32:
        memcpy(dst, src, count * sizeof(float));
        return;
    }
}

/*
 * The width of the next panel when `left` columns of C remain: GEMM_NB while
 * that many remain, then the largest power of two not above what is left
 * (GEMM_NMIN at least). It must be one of the widths kernel_row handles.
 */
static size_t panel_width(size_t left)
{
    size_t w = GEMM_NB;
    while (w > GEMM_NMIN && w > left)
        w /= 2;
    return w;
}

/*
 * Packs columns [jc, jc+nb) of op(B), all k rows, into bp: row kk at
 * bp + kk*w, columns nb..w-1 zero. tmp holds GEMM_KB floats. The padding
 * only feeds accumulator columns that are never stored, but zeros there keep
 * the kernel off the slow path garbage denormals would take, and keep
 * uninitialised reads away from memory checkers.
 */
static void pack_b(ovl_dtype_t dtype, size_t k, size_t jc, size_t nb, size_t w,
                   const unsigned char *b, size_t ldb, int transb, float *restrict bp,
                   float *restrict tmp)
{
    size_t es = ovl_dtype_size(dtype);

    if (!transb) {
        /* Row kk of op(B) is row kk of B: contiguous both sides. */
        for (size_t kk = 0; kk < k; kk++) {
            float *dst = bp + kk * w;
            row_to_float(dtype, b + (kk * ldb + jc) * es, nb, dst);
            memset(dst + nb, 0, (w - nb) * sizeof(float));
        }
        return;
    }
    /* Column j of op(B) is row jc+j of B. Transpose a GEMM_KB-long stretch
     * at a time so that the rows of bp being written (at most 256 KiB) stay
     * in cache across all nb columns. */
    for (size_t k0 = 0; k0 < k; k0 += GEMM_KB) {
        size_t kb = min_size(GEMM_KB, k - k0);
        for (size_t j = 0; j < nb; j++) {
            row_to_float(dtype, b + ((jc + j) * ldb + k0) * es, kb, tmp);
            for (size_t t = 0; t < kb; t++)
                bp[(k0 + t) * w + j] = tmp[t];
        }
        for (size_t t = 0; t < kb; t++)
            memset(bp + (k0 + t) * w + nb, 0, (w - nb) * sizeof(float));
    }
}

/*
 * kernel_row_W: acc[0..W) += sum over kk < kb of arow[kk] * bp[kk*W + j].
 * Four rows of bp per pass cut the loads and stores of acc fourfold. The
 * sums stay in source order: the loop vectorizes across j, not across the
 * reduction, so no -ffast-math is needed. A macro rather than a function with
 * a width argument, so that W is a constant in each copy whatever the
 * inliner decides.
 */
#define DEFINE_KERNEL_ROW(W)                                                                       \
    static void kernel_row_##W(size_t kb, const float *restrict arow, const float *restrict bp,    \
                               float *restrict acc)                                                \
    {                                                                                              \
        size_t kk = 0;                                                                             \
        for (; kk + GEMM_KU <= kb; kk += GEMM_KU) {                                                \
            const float a0 = arow[kk], a1 = arow[kk + 1], a2 = arow[kk + 2], a3 = arow[kk + 3];    \
            const float *restrict b0 = bp + kk * (W);                                              \
            const float *restrict b1 = b0 + (W);                                                   \
            const float *restrict b2 = b1 + (W);                                                   \
            const float *restrict b3 = b2 + (W);                                                   \
            for (size_t j = 0; j < (W); j++)                                                       \
                acc[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];                       \
        }                                                                                          \
        for (; kk < kb; kk++) {                                                                    \
            const float a0 = arow[kk];                                                             \
            const float *restrict b0 = bp + kk * (W);                                              \
            for (size_t j = 0; j < (W); j++)                                                       \
                acc[j] += a0 * b0[j];                                                              \
        }                                                                                          \
    }

DEFINE_KERNEL_ROW(16)
DEFINE_KERNEL_ROW(32)
DEFINE_KERNEL_ROW(64)
DEFINE_KERNEL_ROW(128)
DEFINE_KERNEL_ROW(256)

/* One row of a panel of width w (a value panel_width returns). */
static void kernel_row(size_t w, size_t kb, const float *arow, const float *bp, float *acc)
{
    switch (w) {
    case 16:
        kernel_row_16(kb, arow, bp, acc);
        return;
    case 32:
        kernel_row_32(kb, arow, bp, acc);
        return;
    case 64:
        kernel_row_64(kb, arow, bp, acc);
        return;
    case 128:
        kernel_row_128(kb, arow, bp, acc);
        return;
    default:
        kernel_row_256(kb, arow, bp, acc);
        return;
    }
}

/* C = 0 over rows x n, for k == 0. */
static void zero_c(ovl_dtype_t dtype, size_t rows, size_t n, unsigned char *c, size_t ldc)
{
    size_t es = ovl_dtype_size(dtype);
    /* +0.0 is all-zero bits in every dtype. */
    for (size_t i = 0; i < rows; i++)
        memset(c + i * ldc * es, 0, n * es);
}

ovl_status_t ovl_host_gemm(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k, const void *a,
                           size_t lda, const void *b, size_t ldb, int transb, void *c, size_t ldc)
{
    return ovl_host_gemm_acc(dtype, rows, n, k, a, lda, b, ldb, transb, NULL, 0, 1, c, ldc);
}

/* Scales the fp32 sums of a row by the float 1/div (cuBLASLt's alpha)
 * and adds its ACC (nb elements from column jc); tmp holds nb floats. */
static void add_acc(ovl_dtype_t dtype, const unsigned char *accrow, size_t nb, uint32_t div,
                    float *restrict sum, float *restrict tmp)
{
    if (div > 1) {
        float alpha = 1.0f / (float)div;

        for (size_t j = 0; j < nb; j++)
            sum[j] *= alpha;
    }
    if (accrow) {
        row_to_float(dtype, accrow, nb, tmp);
        for (size_t j = 0; j < nb; j++)
            sum[j] += tmp[j];
    }
}

ovl_status_t ovl_host_gemm_acc(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k,
                               const void *a, size_t lda, const void *b, size_t ldb, int transb,
                               const void *acc, size_t ldacc, uint32_t div, void *c, size_t ldc)
{
    ovl_status_t st =
        check_args(dtype, rows, n, k, a, lda, b, ldb, transb, c, ldc, ovl_dtype_size(dtype));
    if (st != OVL_OK)
        return st;
    if (acc && (ldacc < n || !extent_fits(rows, n, ldacc, ovl_dtype_size(dtype))))
        return OVL_ERR_INVALID;
    if (rows == 0 || n == 0)
        return OVL_OK;
    /* From here rows, n, k fit in size_t: check_args saw their extents. */
    size_t m_ = (size_t)rows, n_ = (size_t)n, k_ = (size_t)k;
    if (k_ == 0 && acc == NULL) {
        zero_c(dtype, m_, n_, c, ldc);
        return OVL_OK;
    }

    size_t es = ovl_dtype_size(dtype);
    const unsigned char *ab = a, *bb = b, *accb = acc;
    unsigned char *cb = c;

    /* The first panel is the widest; a narrow C needs a narrow packed B. */
    size_t wmax = panel_width(n_);
    if (k_ > SIZE_MAX / (wmax * sizeof(float)))
        return OVL_ERR_NOMEM;
    /* k == 0 with ACC: no panel of B, one row of sums */
    float *bp = malloc((k_ ? k_ : 1) * wmax * sizeof(float));
    float *sum = malloc(GEMM_MB * wmax * sizeof(float));
    float *arow = malloc((GEMM_KB > wmax ? GEMM_KB : wmax) * sizeof(float));
    if (bp == NULL || sum == NULL || arow == NULL) {
        st = OVL_ERR_NOMEM;
        goto out;
    }

    for (size_t jc = 0, w, nb; jc < n_; jc += nb) {
        w = panel_width(n_ - jc);
        nb = min_size(w, n_ - jc);
        /* arow doubles as the transpose's staging row: it is free here. */
        pack_b(dtype, k_, jc, nb, w, bb, ldb, transb, bp, arow);
        for (size_t ic = 0; ic < m_; ic += GEMM_MB) {
            size_t mb = min_size(GEMM_MB, m_ - ic);
            memset(sum, 0, mb * w * sizeof(float));
            for (size_t pc = 0; pc < k_; pc += GEMM_KB) {
                size_t kb = min_size(GEMM_KB, k_ - pc);
                for (size_t i = 0; i < mb; i++) {
                    row_to_float(dtype, ab + ((ic + i) * lda + pc) * es, kb, arow);
                    kernel_row(w, kb, arow, bp + pc * w, sum + i * w);
                }
            }
            for (size_t i = 0; i < mb; i++) {
                /* arow is free here: the staging row of ACC */
                add_acc(dtype, accb ? accb + ((ic + i) * ldacc + jc) * es : NULL, nb, div,
                        sum + i * w, arow);
                row_from_float(dtype, sum + i * w, nb, cb + ((ic + i) * ldc + jc) * es);
            }
        }
    }
    st = OVL_OK;
out:
    free(arow);
    free(sum);
    free(bp);
    return st;
}

ovl_status_t ovl_ref_gemm(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k, const void *a,
                          size_t lda, const void *b, size_t ldb, int transb, double *ref,
                          size_t ldref)
{
    ovl_status_t st =
        check_args(dtype, rows, n, k, a, lda, b, ldb, transb, ref, ldref, sizeof(double));
    if (st != OVL_OK)
        return st;
    size_t m_ = (size_t)rows, n_ = (size_t)n, k_ = (size_t)k;
    for (size_t i = 0; i < m_; i++) {
        double *r = ref + i * ldref;
        for (size_t j = 0; j < n_; j++)
            r[j] = 0.0;
        for (size_t kk = 0; kk < k_; kk++) {
            double av = ovl_load_elem(dtype, a, i * lda + kk);
            for (size_t j = 0; j < n_; j++) {
                size_t bi = transb ? j * ldb + kk : kk * ldb + j;
                r[j] += av * (double)ovl_load_elem(dtype, b, bi);
            }
        }
    }
    return OVL_OK;
}

double ovl_rel_error(ovl_dtype_t dtype, uint64_t rows, uint64_t n, const void *c, size_t ldc,
                     const double *ref, size_t ldref)
{
    size_t es = ovl_dtype_size(dtype);
    if (es == 0 || ldc < n || ldref < n)
        return INFINITY;
    if (rows == 0 || n == 0)
        return 0.0;
    if (c == NULL || ref == NULL || !extent_fits(rows, n, ldc, es) ||
        !extent_fits(rows, n, ldref, sizeof(double)))
        return INFINITY;

    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < (size_t)rows; i++) {
        for (size_t j = 0; j < (size_t)n; j++) {
            double cv = ovl_load_elem(dtype, c, i * ldc + j);
            double rv = ref[i * ldref + j];
            if (!isfinite(cv) || !isfinite(rv))
                return INFINITY;
            diff2 += (cv - rv) * (cv - rv);
            ref2 += rv * rv;
        }
    }
    if (ref2 == 0.0)
        return diff2 == 0.0 ? 0.0 : INFINITY;
    return sqrt(diff2 / ref2);
}

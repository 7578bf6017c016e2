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
 *
 * The scaled (fp8) GEMM takes the same path: A and B are decoded to fp32 as
 * any dtype is (exactly), and only the epilogue of each row differs (scales,
 * then 1/div, bias and ACC: finish_row). So does a GEMM of several row
 * blocks: each packed panel of B serves them all.
 */
#include "hostgemm.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "matrix.h"
#include "scaling.h"

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
 * The checks of the matrices' shapes shared by the GEMMs and the references,
 * each matrix with its own element size (ec a double's for a reference).
 */
static ovl_status_t check_mats(uint64_t rows, uint64_t n, uint64_t k, const void *a, size_t lda,
                               size_t ea, const void *b, size_t ldb, size_t eb, int transb,
                               const void *c, size_t ldc, size_t ec)
{
    /* Leading dimensions are checked even for empty matrices: a caller that
     * gets them wrong there gets them wrong elsewhere too. */
    if (lda < k || ldc < n || ldb < (transb ? k : n))
        return OVL_ERR_INVALID;
    if ((a == NULL && rows && k) || (b == NULL && k && n) || (c == NULL && rows && n))
        return OVL_ERR_INVALID;
    if (!extent_fits(rows, k, lda, ea) || !extent_fits(rows, n, ldc, ec))
        return OVL_ERR_INVALID;
    if (transb ? !extent_fits(n, k, ldb, eb) : !extent_fits(k, n, ldb, eb))
        return OVL_ERR_INVALID;
    return OVL_OK;
}

/*
 * The argument checks shared by the unscaled GEMM and its reference, every
 * matrix in dtype; out_esize is the element size of the output (dtype's for
 * C, a double's for ref). fp8 is refused: it is never an output, and as an
 * input it comes with scales (ovl_host_gemm_args).
 */
static ovl_status_t check_args(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k,
                               const void *a, size_t lda, const void *b, size_t ldb, int transb,
                               const void *c, size_t ldc, size_t out_esize)
{
    size_t es = ovl_dtype_size(dtype);
    if (es == 0 || ovl_dtype_is_fp8(dtype))
        return OVL_ERR_INVALID;
    return check_mats(rows, n, k, a, lda, es, b, ldb, es, transb, c, ldc, out_esize);
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
    case OVL_DTYPE_FP8_E4M3:
        for (size_t i = 0; i < count; i++)
            dst[i] = ovl_fp8_to_float(OVL_FP8_E4M3, src[i]);
        return;
    case OVL_DTYPE_FP8_E5M2:
        for (size_t i = 0; i < count; i++)
            dst[i] = ovl_fp8_to_float(OVL_FP8_E5M2, src[i]);
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
    case OVL_DTYPE_FP8_E4M3: /* not an output dtype: the GEMMs refuse it first */
    case OVL_DTYPE_FP8_E5M2:
        memset(dst, 0, count);
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

/* The order of the sum hostgemm.h documents (groups of GEMM_KU from l = 0,
 * then the rest one by one) holds across k blocks only if every k block but
 * the last is a whole number of groups. */
_Static_assert(GEMM_KB % GEMM_KU == 0, "a k block must hold whole groups of GEMM_KU");
_Static_assert(OVL_SCALE_BLOCK % GEMM_KU == 0, "a scale block must hold whole groups of GEMM_KU");

_Static_assert(GEMM_KU == 4, "hostgemm.h documents the sum in groups of 4");

/*
 * One GEMM as gemm_run takes it, checked, every size fitting in size_t: the
 * unscaled ones (every dtype the same, sa NULL) and the scaled ones alike,
 * so that both go through the one kernel and the one epilogue.
 */
typedef struct gemm_job {
    ovl_dtype_t a_dt, b_dt, c_dt; /* C's is ACC's and bias's too */
    size_t rows, n, k;
    size_t nblocks, stride; /* block b's rows start at row b * stride of A, C, ACC */
    const unsigned char *a, *b, *acc, *bias;
    unsigned char *c;
    size_t lda, ldb, ldacc, ldc;
    int transb;
    uint32_t div;
    const float *sa, *sb;    /* NULL: not scaled */
    size_t sa_step, sb_step; /* 1: a scale per row (column of op(B)); 0: one */
    /* Block scales (ovl.h): sa(r, q) = sa[r * sa_ld + q], sb(j, q) =
     * sb[(j / sb_div) * sb_ld + q], q the block of 128 of k; applied per
     * block of k (fold_block), not in finish_row. */
    bool blocks;
    size_t sa_ld, sb_ld, sb_div;
} gemm_job_t;

/*
 * Block scales: the fp32 sums of the block q of k of rows [r, r+mb) of A
 * (sum, rows w apart), columns [jc, jc+nb), each times sa(r, q) * sb(j, q)
 * and added to its total (tot, alike).
 */
static void fold_block(const gemm_job_t *jb, size_t r, size_t mb, size_t jc, size_t nb, size_t w,
                       size_t q, const float *restrict sum, float *restrict tot)
{
    for (size_t i = 0; i < mb; i++) {
        const float sa = jb->sa[(r + i) * jb->sa_ld + q];
        const float *s = sum + i * w;
        float *t = tot + i * w;
        for (size_t j = 0; j < nb; j++) {
            const float sab = sa * jb->sb[((jc + j) / jb->sb_div) * jb->sb_ld + q];
            const float x = s[j] * sab;
            t[j] = t[j] + x;
        }
    }
}

/*
 * The epilogue of row r (of A and C, blocks counted in), columns [jc,
 * jc+nb): sum holds its fp32 sums; scale, 1/div, bias and ACC are applied in
 * that order, one fp32 step each (hostgemm.h), and the row rounded to C's
 * dtype once. tmp holds nb floats.
 */
static void finish_row(const gemm_job_t *jb, size_t r, size_t jc, size_t nb, float *restrict sum,
                       float *restrict tmp)
{
    size_t ec = ovl_dtype_size(jb->c_dt);

    if (jb->sa && !jb->blocks) {
        const float sa = jb->sa[r * jb->sa_step];
        if (jb->sb_step) {
            const float *sb = jb->sb + jc;
            for (size_t j = 0; j < nb; j++)
                sum[j] *= sa * sb[j];
        } else {
            const float s = sa * jb->sb[0];
            for (size_t j = 0; j < nb; j++)
                sum[j] *= s;
        }
    }
    /* cuBLASLt's alpha: the float 1/div, not a division */
    if (jb->div > 1) {
        const float alpha = 1.0f / (float)jb->div;
        for (size_t j = 0; j < nb; j++)
            sum[j] *= alpha;
    }
    if (jb->bias) {
        row_to_float(jb->c_dt, jb->bias + jc * ec, nb, tmp);
        for (size_t j = 0; j < nb; j++)
            sum[j] += tmp[j];
    }
    if (jb->acc) {
        row_to_float(jb->c_dt, jb->acc + (r * jb->ldacc + jc) * ec, nb, tmp);
        for (size_t j = 0; j < nb; j++)
            sum[j] += tmp[j];
    }
    row_from_float(jb->c_dt, sum, nb, jb->c + (r * jb->ldc + jc) * ec);
}

/*
 * Runs a checked job with rows, n, nblocks > 0. Each panel of op(B) is
 * packed once and serves every block. Blocks run in order within a panel,
 * and panels cover disjoint columns, so that with ACC == C (or blocks that
 * overlap) every element sees the writes of the blocks before it, as a loop
 * of one GEMM per block would.
 */
static ovl_status_t gemm_run(const gemm_job_t *jb)
{
    size_t m_ = jb->rows, n_ = jb->n, k_ = jb->k;
    size_t ea = ovl_dtype_size(jb->a_dt);

    if (k_ == 0 && jb->acc == NULL && jb->sa == NULL) {
        for (size_t blk = 0; blk < jb->nblocks; blk++)
            zero_c(jb->c_dt, m_, n_, jb->c + blk * jb->stride * jb->ldc * ovl_dtype_size(jb->c_dt),
                   jb->ldc);
        return OVL_OK;
    }

    /* The first panel is the widest; a narrow C needs a narrow packed B. */
    size_t wmax = panel_width(n_);
    if (k_ > SIZE_MAX / (wmax * sizeof(float)))
        return OVL_ERR_NOMEM;
    /* k == 0 with an epilogue: no panel of B, one row of sums */
    float *bp = malloc((k_ ? k_ : 1) * wmax * sizeof(float));
    float *sum = malloc(GEMM_MB * wmax * sizeof(float));
    float *arow = malloc((GEMM_KB > wmax ? GEMM_KB : wmax) * sizeof(float));
    /* block scales: the sums of one block of k go in sum, their scaled
     * totals here; k is walked a block at a time */
    float *tot = jb->blocks ? malloc(GEMM_MB * wmax * sizeof(float)) : NULL;
    size_t kstep = jb->blocks ? OVL_SCALE_BLOCK : GEMM_KB;
    ovl_status_t st = OVL_ERR_NOMEM;
    if (bp == NULL || sum == NULL || arow == NULL || (jb->blocks && tot == NULL))
        goto out;

    for (size_t jc = 0, w, nb; jc < n_; jc += nb) {
        w = panel_width(n_ - jc);
        nb = min_size(w, n_ - jc);
        /* arow doubles as the transpose's staging row: it is free here. */
        pack_b(jb->b_dt, k_, jc, nb, w, jb->b, jb->ldb, jb->transb, bp, arow);
        for (size_t blk = 0; blk < jb->nblocks; blk++) {
            size_t r0 = blk * jb->stride;
            for (size_t ic = 0; ic < m_; ic += GEMM_MB) {
                size_t mb = min_size(GEMM_MB, m_ - ic);
                memset(jb->blocks ? tot : sum, 0, mb * w * sizeof(float));
                for (size_t pc = 0; pc < k_; pc += kstep) {
                    size_t kb = min_size(kstep, k_ - pc);
                    if (jb->blocks)
                        memset(sum, 0, mb * w * sizeof(float));
                    for (size_t i = 0; i < mb; i++) {
                        row_to_float(jb->a_dt, jb->a + ((r0 + ic + i) * jb->lda + pc) * ea, kb,
                                     arow);
                        kernel_row(w, kb, arow, bp + pc * w, sum + i * w);
                    }
                    if (jb->blocks)
                        fold_block(jb, r0 + ic, mb, jc, nb, w, pc / OVL_SCALE_BLOCK, sum, tot);
                }
                /* arow is free here: the staging row of bias and ACC */
                for (size_t i = 0; i < mb; i++)
                    finish_row(jb, r0 + ic + i, jc, nb, (jb->blocks ? tot : sum) + i * w, arow);
            }
        }
    }
    st = OVL_OK;
out:
    free(tot);
    free(arow);
    free(sum);
    free(bp);
    return st;
}

ovl_status_t ovl_host_gemm(ovl_dtype_t dtype, uint64_t rows, uint64_t n, uint64_t k, const void *a,
                           size_t lda, const void *b, size_t ldb, int transb, void *c, size_t ldc)
{
    return ovl_host_gemm_acc(dtype, rows, n, k, a, lda, b, ldb, transb, NULL, 0, 1, c, ldc);
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
    gemm_job_t jb = {
        .a_dt = dtype,
        .b_dt = dtype,
        .c_dt = dtype,
        .rows = (size_t)rows,
        .n = (size_t)n,
        .k = (size_t)k,
        .nblocks = 1,
        .stride = 0,
        .a = a,
        .b = b,
        .acc = acc,
        .c = c,
        .lda = lda,
        .ldb = ldb,
        .ldacc = ldacc,
        .ldc = ldc,
        .transb = transb,
        .div = div,
    };
    return gemm_run(&jb);
}

/*
 * The checks of ovl_host_gemm_args and ovl_ref_gemm_scaled: g's dtypes,
 * modes and scales, then every matrix's shape with its own element size
 * over the rows the blocks span (*span; 0 when there is nothing to do).
 * out (ldout, out_es bytes an element) is what is written: C, or ref.
 */
static ovl_status_t check_gemm_args(const ovld_gemm_args_t *g, const void *out, size_t ldout,
                                    size_t out_es, uint64_t *span)
{
    if (g == NULL)
        return OVL_ERR_INVALID;
    size_t ea = ovl_dtype_size(g->dtype), eb = ea, ec = ea;
    if (g->scaled) {
        /* the one rule (common/scaling.h); unsigned: an enum may be
         * signed, and a negative value is unknown */
        if (ovl_scaling_refusal((unsigned)g->dtype, (unsigned)g->b_dtype, (unsigned)g->c_dtype,
                                (unsigned)g->a_mode, (unsigned)g->b_mode, g->transb))
            return OVL_ERR_INVALID;
        if (g->a_scale == NULL || g->b_scale == NULL ||
            ovl_scaling_shape_refusal(g->a_mode, g->b_mode, g->rows, g->n))
            return OVL_ERR_INVALID;
        eb = ovl_dtype_size(g->b_dtype);
        ec = ovl_dtype_size(g->c_dtype);
    } else if (ea == 0 || ovl_dtype_is_fp8(g->dtype)) {
        return OVL_ERR_INVALID;
    }
    uint64_t rows = 0;
    if (g->nblocks > 0 && g->rows > 0 &&
        (__builtin_mul_overflow((uint64_t)(g->nblocks - 1), g->block_stride, &rows) ||
         __builtin_add_overflow(rows, g->rows, &rows)))
        return OVL_ERR_INVALID;
    ovl_status_t st = check_mats(rows, g->n, g->k, g->a.ptr, g->a.ld, ea, g->b.ptr, g->b.ld, eb,
                                 g->transb, out, ldout, out_es);
    if (st != OVL_OK)
        return st;
    if (g->acc.ptr && (g->acc.ld < g->n || !extent_fits(rows, g->n, g->acc.ld, ec)))
        return OVL_ERR_INVALID;
    *span = g->n ? rows : 0;
    return OVL_OK;
}

ovl_status_t ovl_host_gemm_args(const ovld_gemm_args_t *g)
{
    if (g == NULL)
        return OVL_ERR_INVALID;
    uint64_t span;
    size_t ec = ovl_dtype_size(g->scaled ? g->c_dtype : g->dtype);
    ovl_status_t st = check_gemm_args(g, g->c.ptr, g->c.ld, ec, &span);
    if (st != OVL_OK)
        return st;
    if (span == 0)
        return OVL_OK;
    /* From here every size fits in size_t: check_gemm_args saw the extents. */
    gemm_job_t jb = {
        .a_dt = g->dtype,
        .b_dt = g->dtype,
        .c_dt = g->dtype,
        .rows = (size_t)g->rows,
        .n = (size_t)g->n,
        .k = (size_t)g->k,
        .nblocks = g->nblocks,
        .stride = (size_t)g->block_stride,
        .a = g->a.ptr,
        .b = g->b.ptr,
        .acc = g->acc.ptr,
        .c = g->c.ptr,
        .lda = (size_t)g->a.ld,
        .ldb = (size_t)g->b.ld,
        .ldacc = (size_t)g->acc.ld,
        .ldc = (size_t)g->c.ld,
        .transb = g->transb,
        .div = g->div,
    };
    if (g->scaled) {
        jb.b_dt = g->b_dtype;
        jb.c_dt = g->c_dtype;
        jb.sa = g->a_scale;
        jb.sb = g->b_scale;
        jb.sa_step = g->a_mode == OVL_SCALE_ROW;
        jb.sb_step = g->b_mode == OVL_SCALE_ROW;
        jb.bias = g->bias;
        jb.blocks = ovl_scale_mode_is_block(g->a_mode);
        jb.sa_ld = jb.sb_ld = (size_t)ovl_scale_blocks(g->k);
        jb.sb_div = g->b_mode == OVL_SCALE_BLOCK_128X128 ? OVL_SCALE_BLOCK : 1;
    }
    return gemm_run(&jb);
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

/* The scale of row r (A's; B's: column r of op(B)) at column kk of k, by
 * mode: one, per row, per row and 128 of k, per 128 x 128 tile (ovl.h);
 * kq the scales per row of a block mode. */
static double scale_at(const float *s, ovl_scale_mode_t mode, size_t r, size_t kk, size_t kq)
{
    switch (mode) {
    case OVL_SCALE_TENSOR:
        return s[0];
    case OVL_SCALE_ROW:
        return s[r];
    case OVL_SCALE_BLOCK_1X128:
        return s[r * kq + kk / OVL_SCALE_BLOCK];
    case OVL_SCALE_BLOCK_128X128:
        return s[r / OVL_SCALE_BLOCK * kq + kk / OVL_SCALE_BLOCK];
    }
    return NAN; /* unreached: the modes were checked */
}

ovl_status_t ovl_ref_gemm_scaled(const ovld_gemm_args_t *g, double *ref, size_t ldref)
{
    if (g == NULL || !g->scaled)
        return OVL_ERR_INVALID;
    uint64_t span;
    ovl_status_t st = check_gemm_args(g, ref, ldref, sizeof(double), &span);
    if (st != OVL_OK || span == 0)
        return st;
    size_t m_ = (size_t)g->rows, n_ = (size_t)g->n, k_ = (size_t)g->k;
    size_t lda = (size_t)g->a.ld, ldb = (size_t)g->b.ld, ldacc = (size_t)g->acc.ld;
    size_t kq = (size_t)ovl_scale_blocks(g->k);
    for (size_t blk = 0; blk < g->nblocks; blk++) {
        for (size_t i = 0; i < m_; i++) {
            size_t r = blk * (size_t)g->block_stride + i;
            double *out = ref + r * ldref;
            for (size_t j = 0; j < n_; j++)
                out[j] = 0.0;
            /* each product with its scales: sa(r, q) sb(j, q), q = kk / 128
             * (per row or one: the same for every q) */
            for (size_t kk = 0; kk < k_; kk++) {
                double av = ovl_load_elem(g->dtype, g->a.ptr, r * lda + kk);
                double sa = scale_at(g->a_scale, g->a_mode, r, kk, kq);
                for (size_t j = 0; j < n_; j++) {
                    size_t bi = g->transb ? j * ldb + kk : kk * ldb + j;
                    double sb = scale_at(g->b_scale, g->b_mode, j, kk, kq);
                    out[j] += sa * sb * av * (double)ovl_load_elem(g->b_dtype, g->b.ptr, bi);
                }
            }
            for (size_t j = 0; j < n_; j++) {
                double x = out[j];
                if (g->div > 1)
                    x /= (double)g->div;
                if (g->bias)
                    x += ovl_load_elem(g->c_dtype, g->bias, j);
                if (g->acc.ptr)
                    x += ovl_load_elem(g->c_dtype, g->acc.ptr, r * ldacc + j);
                out[j] = x;
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

/*
 * test_cuda_reduce.c: the CUDA backend's reduction kernel
 * (daemon/backend/cuda/kernels.cu, ovld_launch_reduce: GEMM + reduce-scatter's
 * REDUCE) against its definition, on GPU 0, bit for bit.
 *
 * The definition (plan.h, OVL_I_REDUCE; the host backend's sum_row): each
 * element of dst is the sum over i < nblocks of src's element at row
 * i*stride + row, summed in fp32 from 0 in order of i, divided by div, and
 * rounded to the dtype (to nearest even) once. Inputs are finite, so the
 * GPU's and the host's roundings agree exactly; every byte of dst's buffer
 * outside the rows x cols it names (the padding past cols, the rows around
 * it) must keep its 0xFF poison.
 *
 * Cases, for every dtype: the 16-byte path (cols, both leading dimensions
 * and both pointers allowing it) and the element path (odd cols, odd
 * leading dimensions, pointers one element into a row), 1 to 8 blocks, back
 * to back and with gaps, divisors 1 and the block count (avg), one row and
 * many; then a large bf16 reduction timed (its GB/s printed, not judged).
 *
 * Without a GPU it prints "SKIP: no GPU" and exits 77, ctest's skip code.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "half.h"
#include "kernels.h"
#include "ovl.h"

#define SKIP_CODE 77

typedef struct rcase {
    uint64_t rows, cols;
    uint32_t nblocks;
    uint64_t stride; /* rows between blocks in src (>= rows) */
    uint64_t ldd, lds;
    uint64_t shift; /* elements into the first row of both buffers */
    uint32_t div;
} rcase_t;

static int g_pass, g_fail;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t x = g_rng * 0x2545f4914f6cdd1dull;
    return (float)((double)(x >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "FAIL: %s: %s\n", #call, cudaGetErrorString(e_));                      \
            ok = false;                                                                            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* One case: src and dst with their padding on the device, the kernel, and
 * every byte of dst's buffer against the definition (and the poison). */
static bool run_case(ovl_dtype_t dt, const rcase_t *c, cudaStream_t s)
{
    size_t es = ovl_dtype_size(dt);
    uint64_t src_rows = (uint64_t)(c->nblocks - 1) * c->stride + c->rows;
    size_t src_bytes = (size_t)((src_rows * c->lds + c->shift) * es);
    size_t dst_bytes = (size_t)((c->rows * c->ldd + c->shift) * es);
    unsigned char *hs = malloc(src_bytes), *hd = malloc(dst_bytes), *want = malloc(dst_bytes);
    void *ds = NULL, *dd = NULL;
    bool ok = hs && hd && want;
    if (!ok) {
        fprintf(stderr, "FAIL: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < src_bytes / es; i++)
        ovl_store_elem(dt, hs, i, rnd());
    memset(want, 0xff, dst_bytes);
    const unsigned char *s0 = hs + c->shift * es;
    unsigned char *w0 = want + c->shift * es;
    for (uint64_t r = 0; r < c->rows; r++)
        for (uint64_t j = 0; j < c->cols; j++) {
            float sum = 0.0f;
            for (uint32_t b = 0; b < c->nblocks; b++)
                sum += ovl_load_elem(dt, s0, (size_t)(((uint64_t)b * c->stride + r) * c->lds + j));
            sum /= (float)c->div;
            ovl_store_elem(dt, w0, (size_t)(r * c->ldd + j), sum);
        }
    CK(cudaMalloc(&ds, src_bytes));
    CK(cudaMalloc(&dd, dst_bytes));
    CK(cudaMemcpyAsync(ds, hs, src_bytes, cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(dd, 0xff, dst_bytes, s));
    CK(ovld_launch_reduce(s, dt, (char *)dd + c->shift * es, c->ldd,
                          (const char *)ds + c->shift * es, c->lds, c->rows, c->cols, c->nblocks,
                          c->stride, c->div));
    CK(cudaMemcpyAsync(hd, dd, dst_bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < dst_bytes; i++)
        if (hd[i] != want[i]) {
            size_t e = i / es - c->shift;
            fprintf(stderr,
                    "FAIL: %s rows %" PRIu64 " cols %" PRIu64 " blocks %u stride %" PRIu64
                    " ldd %" PRIu64 " lds %" PRIu64 " shift %" PRIu64 " div %u: byte %zu (row %zu, "
                    "col %zu) is %02x, not %02x\n",
                    ovl_dtype_name(dt), c->rows, c->cols, c->nblocks, c->stride, c->ldd, c->lds,
                    c->shift, c->div, i, e / c->ldd, e % c->ldd, hd[i], want[i]);
            ok = false;
            break;
        }
out:
    cudaFree(ds);
    cudaFree(dd);
    free(hs);
    free(hd);
    free(want);
    ok ? g_pass++ : g_fail++;
    return ok;
}

/* A large bf16 reduction, as push's at 8192^3 on 2 ranks (a 4096 x 8192
 * block of 2 slots): its time and the bytes it moves per second, printed. */
static void time_large(cudaStream_t s)
{
    uint64_t rows = 4096, cols = 8192;
    size_t es = 2, blk = rows * cols * es;
    void *ds = NULL, *dd = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    bool ok = true;
    CK(cudaMalloc(&ds, 2 * blk));
    CK(cudaMalloc(&dd, blk));
    CK(cudaMemsetAsync(ds, 0, 2 * blk, s));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++)
        CK(ovld_launch_reduce(s, OVL_DTYPE_BF16, dd, cols, ds, cols, rows, cols, 2, rows, 1));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 20; i++)
        CK(ovld_launch_reduce(s, OVL_DTYPE_BF16, dd, cols, ds, cols, rows, cols, 2, rows, 1));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= 20;
    printf("  large: bf16 %" PRIu64 " x %" PRIu64 ", 2 blocks: %.3f ms, %.0f GB/s (3 blocks' "
           "bytes)\n",
           rows, cols, ms, 3.0 * (double)blk / (ms * 1e-3) / 1e9);
out:
    if (!ok)
        g_fail++;
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(ds);
    cudaFree(dd);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no GPU\n");
        return SKIP_CODE;
    }
    cudaStream_t s;
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess) {
        printf("FAIL: no stream on GPU 0\n");
        return 1;
    }
    static const ovl_dtype_t dts[] = {OVL_DTYPE_BF16, OVL_DTYPE_FP16, OVL_DTYPE_FP32};
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        ovl_dtype_t dt = dts[d];
        for (uint32_t nb = 1; nb <= 8; nb = nb < 3 ? nb + 1 : nb * 2 + 2) { /* 1 2 3 8 */
            const rcase_t cases[] = {
                /* the 16-byte path: cols, leading dimensions, pointers */
                {64, 256, nb, 64, 256, 256, 0, 1},
                {1, 16, nb, 1, 16, 16, 0, nb},
                {37, 512, nb, 40, 520, 1024, 0, nb},
                /* the element path: odd cols, odd leading dimensions, a
                 * pointer one element into its row */
                {33, 13, nb, 33, 13, 13, 0, 1},
                {17, 40, nb, 20, 41, 43, 0, nb},
                {9, 64, nb, 9, 64, 64, 1, 1},
                {300, 7, nb, 301, 9, 7, 3, nb},
            };
            for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
                run_case(dt, &cases[i], s);
        }
    }
    time_large(s);
    cudaStreamDestroy(s);
    printf("%d passed, %d failed, 0 skipped\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

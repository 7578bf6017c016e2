/*
 * issue_lab_copies.cu: see issue_lab_copies.h.
 */
#include "issue_lab_copies.h"

/* The widest word (16, 8, 4, 2 or 1 bytes) that every address and stride of
 * the piece is a multiple of. */
static unsigned word_of(const lab_copy_piece_t *p)
{
    uint64_t all = (uint64_t)(uintptr_t)p->src | (uint64_t)(uintptr_t)p->dst | p->src_ld |
                   p->dst_ld | p->width;
    unsigned w = 16;
    while (w > 1 && (all & (w - 1)))
        w >>= 1;
    return w;
}

#define SEG_WORDS 256u /* words of a row a warp takes at once: 8 per lane */

template <typename T>
__device__ static void copy_piece(const lab_copy_piece_t &p, uint64_t warp, uint64_t nwarps,
                                  unsigned lane)
{
    const uint64_t words = p.width / sizeof(T);
    const uint64_t segs = (words + SEG_WORDS - 1) / SEG_WORDS;
    const uint64_t units = p.rows * segs;
    for (uint64_t u = warp; u < units; u += nwarps) {
        const uint64_t row = u / segs, w0 = (u - row * segs) * SEG_WORDS;
        const T *__restrict__ s = (const T *)((const char *)p.src + row * p.src_ld);
        T *__restrict__ d = (T *)((char *)p.dst + row * p.dst_ld);
        const uint64_t end = w0 + SEG_WORDS < words ? w0 + SEG_WORDS : words;
#pragma unroll 8
        for (uint64_t i = w0 + lane; i < end; i += 32)
            d[i] = s[i];
    }
}

/* blockIdx.y: the piece; its units (a segment of a row) go to the warps of
 * its blocks in turn, a unit's words to the lanes of the warp. words: each
 * piece's word as log2 (0 to 4), 4 bits a piece. */
__global__ void lab_copies_kernel(lab_copies_t c, unsigned long long words)
{
    const lab_copy_piece_t &p = c.p[blockIdx.y];
    const unsigned lane = threadIdx.x & 31u;
    const uint64_t nwarps = (uint64_t)gridDim.x * (blockDim.x / 32u);
    const uint64_t warp = (uint64_t)blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u;
    switch ((words >> (4u * blockIdx.y)) & 0xfu) {
    case 4:
        copy_piece<uint4>(p, warp, nwarps, lane);
        break;
    case 3:
        copy_piece<uint2>(p, warp, nwarps, lane);
        break;
    case 2:
        copy_piece<unsigned>(p, warp, nwarps, lane);
        break;
    case 1:
        copy_piece<unsigned short>(p, warp, nwarps, lane);
        break;
    default:
        copy_piece<unsigned char>(p, warp, nwarps, lane);
        break;
    }
}

#define COPY_THREADS    256u  /* 8 warps a block */
#define COPY_MAX_BLOCKS 1024u /* per piece */

extern "C" cudaError_t lab_launch_copies(cudaStream_t s, const lab_copies_t *c)
{
    if (!c || c->n == 0 || c->n > LAB_COPIES_MAX)
        return cudaErrorInvalidValue;
    unsigned long long words = 0;
    uint64_t most = 0; /* units of the largest piece: a block takes 8 */
    for (uint32_t i = 0; i < c->n; i++) {
        const lab_copy_piece_t *p = &c->p[i];
        if (p->rows == 0 || p->width == 0 || !p->src || !p->dst)
            return cudaErrorInvalidValue;
        unsigned w = word_of(p), lg = 0;
        while ((1u << lg) < w)
            lg++;
        words |= (unsigned long long)lg << (4u * i);
        uint64_t segs = (p->width / w + SEG_WORDS - 1) / SEG_WORDS;
        if (p->rows * segs > most)
            most = p->rows * segs;
    }
    uint64_t blocks = (most + COPY_THREADS / 32u - 1) / (COPY_THREADS / 32u);
    if (blocks > COPY_MAX_BLOCKS)
        blocks = COPY_MAX_BLOCKS;
    dim3 grid((unsigned)blocks, c->n);
    lab_copies_kernel<<<grid, COPY_THREADS, 0, s>>>(*c, words);
    return cudaGetLastError();
}

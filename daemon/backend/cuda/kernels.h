/*
 * kernels.h: ovl's own CUDA kernels (kernels.cu).
 */
#ifndef OVLD_KERNELS_H
#define OVLD_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "ovl.h" /* ovl_dtype_t */

#ifdef __cplusplus
extern "C" {
#endif

/* A one-thread kernel that sleeps about ns nanoseconds on stream s: the
 * ring plan puts one first on a GEMM stream, so that the two GEMM streams
 * start in the same order on every rank. Returns the launch's error. */
cudaError_t ovld_launch_sleep(cudaStream_t s, unsigned ns);

/*
 * The reduction of plan.h's OVL_I_REDUCE on stream s: rows x cols of dst
 * (leading dimension ldd, elements) = the sum over i < nblocks of the rows
 * [i*stride, +rows) of src (leading dimension lds), each element summed in
 * fp32 in order of i from 0, divided by div, rounded to dtype (to nearest
 * even) once: what the host backend computes, bit for bit for every finite
 * result (a NaN comes out as the GPU's canonical NaN). Rows of 16 bytes
 * are moved whole where cols, both leading dimensions and both pointers
 * allow. Returns the launch's error (cudaErrorInvalidValue for an unknown
 * dtype).
 */
cudaError_t ovld_launch_reduce(cudaStream_t s, ovl_dtype_t dtype, void *dst, uint64_t ldd,
                               const void *src, uint64_t lds, uint64_t rows, uint64_t cols,
                               uint32_t nblocks, uint64_t stride, uint32_t div);

/* Ranks a ring kernel rings at most (one done group: cuda_internal.h). */
#define OVLD_RING_MAX_RANKS 63

/*
 * The done ring of a replayed op, as a node of its graph (cuda_graph.c):
 * a graph's values are fixed at capture, so the op's seq comes from a
 * ring of OVLD_RING_SEQS slots in pinned memory, which the host fills
 * before each launch: seqs[k % OVLD_RING_SEQS] for the stream's k-th such
 * kernel, where *ran (pinned too) counts the kernels that ran on the stream; the kernel
 * reads every slot and the count at once (one round trip to the host's
 * memory, not two), and the host reads the count to check that it never
 * overwrites a slot not read yet. For each of the n ranks, after a
 * system-wide fence (C before done, as a stream write's default barrier):
 * the done slot (db[i] + slot_off + 8 * (seq % db_slots)), then done
 * (db[i] + done_off); then own = seq, after every rank's, and *ran + 1.
 * The same writes, in the same order, as cuda_done.c's batch of stream
 * memory operations.
 */
#define OVLD_RING_SEQS 64

typedef struct ovld_ring_args {
    const uint64_t *seqs; /* OVLD_RING_SEQS of them */
    uint64_t *ran;
    uint64_t *own;
    uint32_t n;
    uint32_t slot_off, done_off, db_slots;
    void *db[OVLD_RING_MAX_RANKS];
} ovld_ring_args_t;

/* Launches the ring kernel on s (captured there); the launch's error. */
cudaError_t ovld_launch_ring(cudaStream_t s, const ovld_ring_args_t *a);

#ifdef __cplusplus
}
#endif

#endif /* OVLD_KERNELS_H */

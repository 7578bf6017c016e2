/*
 * offload_lab_kernels.h: doorbells by kernel, for ovl-offload-lab's
 * variants (offload_lab.c): a one-thread kernel that waits until a word
 * reaches a value, and one that writes three words after a system-wide
 * fence, in place of the stream memory operations (cuStreamWaitValue64,
 * cuStreamBatchMemOp) that ovl uses. Not ovld's: a measurement of the
 * alternative.
 */
#ifndef OVL_OFFLOAD_LAB_KERNELS_H
#define OVL_OFFLOAD_LAB_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Until (int64_t)(*word - v) >= 0, as the stream wait's GEQ compares. */
cudaError_t lab_launch_wait(cudaStream_t s, const uint64_t *word, uint64_t v);

/* A system-wide fence (what the stream's earlier work wrote first), then
 * *a = *b = *c = v, in that order. */
cudaError_t lab_launch_write3(cudaStream_t s, uint64_t *a, uint64_t *b, uint64_t *c, uint64_t v);

#ifdef __cplusplus
}
#endif

#endif /* OVL_OFFLOAD_LAB_KERNELS_H */

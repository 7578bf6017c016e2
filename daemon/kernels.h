/*
 * kernels.h: ovl's own CUDA kernels (kernels.cu).
 */
#ifndef OVLD_KERNELS_H
#define OVLD_KERNELS_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A one-thread kernel that sleeps about ns nanoseconds on stream s: the
 * ring plan puts one first on a GEMM stream, so that the two GEMM streams
 * start in the same order on every rank. Returns the launch's error. */
cudaError_t ovld_launch_sleep(cudaStream_t s, unsigned ns);

#ifdef __cplusplus
}
#endif

#endif /* OVLD_KERNELS_H */

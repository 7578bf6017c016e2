/*
 * offload_lab_kernels.cu: see offload_lab_kernels.h.
 */
#include "offload_lab_kernels.h"

__global__ void lab_wait_kernel(const uint64_t *word, uint64_t v)
{
    while ((long long)(*(volatile const unsigned long long *)word - v) < 0)
        ;
    __threadfence_system(); /* what the writer wrote before the word, after it */
}

__global__ void lab_write3_kernel(uint64_t *a, uint64_t *b, uint64_t *c, uint64_t v)
{
    __threadfence_system();
    *(volatile unsigned long long *)a = v;
    __threadfence_system();
    *(volatile unsigned long long *)b = v;
    __threadfence_system();
    *(volatile unsigned long long *)c = v;
}

extern "C" cudaError_t lab_launch_wait(cudaStream_t s, const uint64_t *word, uint64_t v)
{
    (void)cudaGetLastError();
    lab_wait_kernel<<<1, 1, 0, s>>>(word, v);
    return cudaGetLastError();
}

extern "C" cudaError_t lab_launch_write3(cudaStream_t s, uint64_t *a, uint64_t *b, uint64_t *c,
                                         uint64_t v)
{
    (void)cudaGetLastError();
    lab_write3_kernel<<<1, 1, 0, s>>>(a, b, c, v);
    return cudaGetLastError();
}

/*
 * kernels.cu: see kernels.h.
 */
#include "kernels.h"

__global__ void ovld_sleep_kernel(unsigned ns)
{
    /* __nanosleep takes at most ~1 ms per call; loop for longer sleeps. */
    while (ns > 1000000u) {
        __nanosleep(1000000u);
        ns -= 1000000u;
    }
    __nanosleep(ns);
}

extern "C" cudaError_t ovld_launch_sleep(cudaStream_t s, unsigned ns)
{
    ovld_sleep_kernel<<<1, 1, 0, s>>>(ns);
    return cudaGetLastError();
}

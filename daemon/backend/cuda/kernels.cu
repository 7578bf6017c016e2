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

/* The launches' errors come from cudaGetLastError, which also returns one
 * an earlier call left on the thread: cleared first, so that what they
 * report is theirs. */
extern "C" cudaError_t ovld_launch_sleep(cudaStream_t s, unsigned ns)
{
    (void)cudaGetLastError();
    ovld_sleep_kernel<<<1, 1, 0, s>>>(ns);
    return cudaGetLastError();
}

__global__ void ovld_ring_kernel(ovld_ring_args_t a)
{
    __shared__ unsigned long long seqs[OVLD_RING_SEQS], k;
    unsigned t = threadIdx.x;
    /* every slot and the count in one go: independent loads */
    if (t < OVLD_RING_SEQS)
        seqs[t] = *(volatile const unsigned long long *)&a.seqs[t];
    if (t == 0)
        k = *(volatile unsigned long long *)a.ran;
    __syncthreads();
    unsigned long long seq = seqs[k % OVLD_RING_SEQS];
    /* the op's writes (its C) before any of its doorbells */
    __threadfence_system();
    if (t < a.n) {
        char *db = (char *)a.db[t];
        *(volatile unsigned long long *)(db + a.slot_off + 8u * (unsigned)(seq % a.db_slots)) = seq;
        __threadfence_system(); /* the slot, then done: proto/doorbell.h */
        *(volatile unsigned long long *)(db + a.done_off) = seq;
    }
    __threadfence_system();
    __syncthreads();
    if (t == 0) {
        *(volatile unsigned long long *)a.own = seq;
        *(volatile unsigned long long *)a.ran = k + 1;
    }
}

extern "C" cudaError_t ovld_launch_ring(cudaStream_t s, const ovld_ring_args_t *a)
{
    /* a thread per slot, and per rank (OVLD_RING_MAX_RANKS < OVLD_RING_SEQS) */
    (void)cudaGetLastError();
    ovld_ring_kernel<<<1, OVLD_RING_SEQS, 0, s>>>(*a);
    return cudaGetLastError();
}

/* heap.h: the allocator's live bytes, for `ovlctl stats` and for saying what a
 * part of ovld costs (the CUDA backend logs its contexts' and cuBLASLt's
 * share at start, each job its NCCL communicators'). */
#ifndef OVLD_HEAP_H
#define OVLD_HEAP_H

#include <stdint.h>

/* Bytes the allocator holds for live allocations: what a leak grows,
 * unlike RSS, which keeps the allocator's high-water mark. glibc's
 * mallinfo2 (mallinfo before glibc 2.33, which wraps past 2 GiB), or a
 * sanitizer's own count where one replaces glibc's allocator. glibc counts
 * the chunks its per-thread caches keep (up to 7 per size class and
 * thread) as in use. It walks every arena under its lock: a stats call's
 * or a job's setup's cost, never an op's. */
uint64_t ovld_heap_bytes(void);

#endif

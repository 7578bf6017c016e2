/*
 * heap.c: see heap.h.
 */
#include "heap.h"

#include <malloc.h>
#include <stddef.h>

/* Every sanitizer runtime that replaces malloc has it (compiler-rt's
 * sanitizer/allocator_interface.h, which gcc does not install); weak, so
 * that it is NULL without one. */
extern size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));

uint64_t ovld_heap_bytes(void)
{
    if (__sanitizer_get_current_allocated_bytes)
        return (uint64_t)__sanitizer_get_current_allocated_bytes();
#ifdef OVL_HAVE_MALLINFO2
    struct mallinfo2 mi = mallinfo2();
    return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#else
    struct mallinfo mi = mallinfo(); /* ints: wraps past 2 GiB */
    return (uint64_t)(unsigned)mi.uordblks + (uint64_t)(unsigned)mi.hblkhd;
#endif
}

/*
 * clock.h: CLOCK_MONOTONIC, the one clock of ovld, libovl and the programs
 * (intervals, deadlines, latencies; never the time of day).
 */
#ifndef OVL_CLOCK_H
#define OVL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ovl_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t ovl_mono_ms(void)
{
    return ovl_mono_ns() / 1000000u;
}

static inline double ovl_mono_s(void)
{
    return (double)ovl_mono_ns() * 1e-9;
}

#endif /* OVL_CLOCK_H */

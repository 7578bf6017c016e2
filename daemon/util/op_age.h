/*
 * op_age.h: how long an op in flight has been waiting, as the CUDA
 * backend's watchdog (cuda_on_watchdog) judges it: not at all while young,
 * its event and communicator asked about failures once older than
 * OVLD_OP_CHECK_NS, and one line said about it once older than
 * OVLD_OP_WARN_NS. Pure, so that a test can give it the clock.
 *
 * An op's issued_ns is read on its issuing thread, the watchdog's `now` on
 * the loop thread: an op issued after `now` was read has issued_ns > now.
 * Its age is then 0, never the unsigned difference, which wraps to about
 * 2^64 ns and would judge the freshest op the oldest ("not done after
 * 18446744073 s").
 */
#ifndef OVLD_OP_AGE_H
#define OVLD_OP_AGE_H

#include <stdint.h>

#define OVLD_OP_CHECK_NS (1000ull * 1000 * 1000) /* look closer at ops older than 1 s */
#define OVLD_OP_WARN_NS  (5000ull * 1000 * 1000) /* and say so for ops older than 5 s */

typedef enum ovld_op_age {
    OVLD_OP_FRESH, /* younger than OVLD_OP_CHECK_NS: left alone */
    OVLD_OP_CHECK, /* its event and communicator are asked whether they failed */
    OVLD_OP_WARN,  /* that, and it is reported as slow (once) */
} ovld_op_age_t;

/* Nanoseconds from issued_ns to now (both ovl_mono_ns), 0 where issued_ns
 * is later than now. */
static inline uint64_t ovld_op_age_ns(uint64_t now, uint64_t issued_ns)
{
    return issued_ns > now ? 0 : now - issued_ns;
}

/* What the watchdog does about an op issued at issued_ns, at now: each
 * threshold belongs to the older class (an op exactly OVLD_OP_CHECK_NS old
 * is checked). */
static inline ovld_op_age_t ovld_op_age(uint64_t now, uint64_t issued_ns)
{
    uint64_t age = ovld_op_age_ns(now, issued_ns);
    if (age >= OVLD_OP_WARN_NS)
        return OVLD_OP_WARN;
    return age >= OVLD_OP_CHECK_NS ? OVLD_OP_CHECK : OVLD_OP_FRESH;
}

#endif /* OVLD_OP_AGE_H */

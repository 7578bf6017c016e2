/*
 * stats.c: see stats.h.
 */
#include "stats.h"

#include <string.h>

void ovld_stats_reset(ovld_stats_t *s, uint64_t now_ns)
{
    memset(s, 0, sizeof(*s));
    s->since_ns = now_ns;
}

/* Bucket i covers (upper(i-1), upper(i)]: below 4 ns one bucket per ns;
 * above, 4 sub-buckets per power of two. */
unsigned ovld_hist_bucket_of(uint64_t ns)
{
    if (ns < OVLD_HIST_SUB)
        return (unsigned)ns;
    unsigned p = 63u - (unsigned)__builtin_clzll(ns); /* 2^p <= ns < 2^(p+1), p >= 2 */
    uint64_t base = 1ull << p;
    unsigned sub = (unsigned)((ns - base) >> (p - 2)); /* 0..3 */
    unsigned i = (p - 1) * OVLD_HIST_SUB + sub;
    return i < OVLD_HIST_BUCKETS ? i : OVLD_HIST_BUCKETS - 1;
}

uint64_t ovld_hist_bucket_upper(unsigned i)
{
    if (i < OVLD_HIST_SUB)
        return i;
    unsigned p = i / OVLD_HIST_SUB + 1, sub = i % OVLD_HIST_SUB;
    if (p >= 63)
        return UINT64_MAX;
    uint64_t base = 1ull << p;
    return base + ((uint64_t)(sub + 1) << (p - 2)) - 1;
}

void ovld_hist_add(ovld_hist_t *h, uint64_t ns)
{
    h->buckets[ovld_hist_bucket_of(ns)]++;
    h->count++;
    h->sum_ns += ns;
    if (ns > h->max_ns)
        h->max_ns = ns;
}

uint64_t ovld_hist_quantile(const ovld_hist_t *h, double q)
{
    if (h->count == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.999999);
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < OVLD_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t up = ovld_hist_bucket_upper(i);
            return up < h->max_ns ? up : h->max_ns;
        }
    }
    return h->max_ns;
}

void ovld_stats_error(ovld_stats_t *s, ovl_status_t status)
{
    unsigned k = status < 0 ? (unsigned)-status : 0;
    if (k < OVLD_STATUS_KINDS)
        s->errors[k]++;
}

void ovld_stats_op(ovld_stats_t *s, ovl_op_kind_t kind, ovl_algo_t algo, ovl_dtype_t dtype,
                   double flop, double bytes, uint64_t latency_ns, ovl_status_t status)
{
    if (status != OVL_OK) {
        s->ops_failed++;
        ovld_stats_error(s, status);
        return;
    }
    if ((unsigned)kind < OVL_OP_KIND_COUNT && (unsigned)algo < OVL_ALGO_COUNT &&
        (unsigned)dtype < OVL_DTYPE_COUNT)
        s->ops[kind][algo][dtype]++;
    /* Counters saturate rather than wrap. */
    s->comm_bytes += bytes >= 0 && bytes < 1.8e19 ? (uint64_t)bytes : 0;
    s->flops += flop >= 0 && flop < 1.8e19 ? (uint64_t)flop : 0;
    s->busy_ns += latency_ns;
    ovld_hist_add(&s->latency, latency_ns);
}

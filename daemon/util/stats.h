/*
 * stats.h: ovld's counters and the op-latency histogram behind `ovlctl
 * stats`. Pure code, loop thread only, O(1) per op: counters and a
 * log-linear histogram (4 sub-buckets per power of two of nanoseconds, so
 * any quantile is known to within 19%), never a list of samples.
 */
#ifndef OVLD_STATS_H
#define OVLD_STATS_H

#include <stdint.h>

#include "ovl.h"

#define OVLD_HIST_SUB     4 /* sub-buckets per power of two */
#define OVLD_HIST_BUCKETS (64 * OVLD_HIST_SUB)
/* errors[] is indexed by -status: OVL_OK (0, unused) down to the last
 * code, OVL_ERR_INTERNAL. A new code goes after it and moves this; the unit
 * tests (test_enums) check that -OVLD_STATUS_KINDS has no name. */
#define OVLD_STATUS_KINDS (1 - OVL_ERR_INTERNAL)

typedef struct ovld_hist {
    uint64_t buckets[OVLD_HIST_BUCKETS];
    uint64_t count;
    uint64_t sum_ns;
    uint64_t max_ns;
} ovld_hist_t;

typedef struct ovld_stats {
    uint64_t since_ns; /* monotonic time of start or last reset */
    /* done, by kind, algorithm (as run) and dtype; kind 0 (none) stays 0 */
    uint64_t ops[OVL_OP_KIND_COUNT][OVL_ALGO_COUNT][OVL_DTYPE_COUNT];
    uint64_t ops_failed;
    uint64_t comm_bytes;    /* per op: what its kind moves into ranks (ag_gemm: the gathered A) */
    uint64_t flops;         /* per op: its kind's GEMM flop (ag_gemm: 2*M*n*k, M = world*m) */
    uint64_t busy_ns;       /* sum of op latencies */
    ovld_hist_t latency;    /* all ranks in -> every rank done */
    ovld_hist_t issue;      /* the loop's time to plan and enqueue one op, all ranks */
    uint64_t ops_replayed;  /* ops whose body was a captured graph's launch (replay.h) */
    uint64_t ops_captured;  /* ops whose body was captured (and launched) */
    uint64_t registrations; /* buffers registered */
    uint64_t deregistrations;
    uint64_t errors[OVLD_STATUS_KINDS]; /* failed ops and refused requests, by status */
    uint64_t conns_accepted, conns_refused;
    /* Links to the ovld of other nodes (peer.h): messages and their bytes
     * (header and body; heartbeats too), links that failed or timed out
     * and protocol errors, messages dropped (queued for a peer that went
     * down, or refused for a full queue), handshakes refused either way. */
    uint64_t peer_msgs_in, peer_msgs_out, peer_bytes_in, peer_bytes_out;
    uint64_t peer_errors, peer_dropped, peer_auth_refused;
    /* The host backend's rows between nodes (xfer.h): transfers done each
     * way and their bytes, transfers that failed, and peers' rows messages
     * dropped (malformed, of a job this node does not have, naming ranks
     * their sender may not, answering nothing). */
    uint64_t xfer_sends, xfer_recvs, xfer_bytes_out, xfer_bytes_in;
    uint64_t xfer_errors, xfer_dropped;
} ovld_stats_t;

void ovld_stats_reset(ovld_stats_t *s, uint64_t now_ns);

void ovld_hist_add(ovld_hist_t *h, uint64_t ns);
/* The q-quantile (0 < q <= 1) in ns: the upper bound of the bucket that
 * holds it (0 if empty). */
uint64_t ovld_hist_quantile(const ovld_hist_t *h, double q);
/* The upper bound (ns) of bucket i. */
uint64_t ovld_hist_bucket_upper(unsigned i);
unsigned ovld_hist_bucket_of(uint64_t ns);

/* One op done on every rank. kind is the op's, algo the algorithm that
 * ran; flop and bytes what the kind says it did (core/kind.h). A value out
 * of its enum's range counts in no cell (the op still counts as done). */
void ovld_stats_op(ovld_stats_t *s, ovl_op_kind_t kind, ovl_algo_t algo, ovl_dtype_t dtype,
                   double flop, double bytes, uint64_t latency_ns, ovl_status_t status);

void ovld_stats_error(ovld_stats_t *s, ovl_status_t status);

/* What ovld keeps: the same counters since start and since the last reset
 * (the first feeds Prometheus, whose counters must never go back). */
typedef struct ovld_counters {
    ovld_stats_t total;
    ovld_stats_t window;
} ovld_counters_t;

#define OVLD_COUNT(c, field, n)                                                                    \
    do {                                                                                           \
        (c)->total.field += (n);                                                                   \
        (c)->window.field += (n);                                                                  \
    } while (0)

static inline void ovld_count_op(ovld_counters_t *c, ovl_op_kind_t kind, ovl_algo_t algo,
                                 ovl_dtype_t dtype, double flop, double bytes, uint64_t latency_ns,
                                 ovl_status_t status)
{
    ovld_stats_op(&c->total, kind, algo, dtype, flop, bytes, latency_ns, status);
    ovld_stats_op(&c->window, kind, algo, dtype, flop, bytes, latency_ns, status);
}

static inline void ovld_count_issue(ovld_counters_t *c, uint64_t ns)
{
    ovld_hist_add(&c->total.issue, ns);
    ovld_hist_add(&c->window.issue, ns);
}

static inline void ovld_count_error(ovld_counters_t *c, ovl_status_t status)
{
    ovld_stats_error(&c->total, status);
    ovld_stats_error(&c->window, status);
}

#endif /* OVLD_STATS_H */

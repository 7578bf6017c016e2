/*
 * exec.h: the executor. It walks the host programs of one op for every local
 * rank of a job and calls the backend's primitives. Nothing here is specific
 * to an algorithm: that is the planner's; nothing is specific to hardware:
 * that is the backend's.
 *
 * Before anything of the op, the executor tells the backend the role of
 * each stream of each rank's plan (set_streams), from which the backend
 * takes priorities; not for an op replayed from a graph, which runs on
 * stream 0 alone (ovld_exec_op_t.replay). Issue order: ranks advance round-robin; a rank stops at
 * a WAIT on a peer's event that the peer has not recorded yet in this op
 * (so that the wait refers to this op's record, as cudaStreamWaitEvent
 * requires), and at an ALLGATHER or a RAIL until every rank has reached
 * its matching one, which is then issued for all ranks in one backend call
 * (one NCCL group; a RAIL's parts carry the plan's send and receive lists).
 * Where the backend allows it and no plan has an ALLGATHER or a RAIL (ring
 * inside a node, and gathers by the copy engine), each rank is issued by a
 * thread of its own under the same rules, and the caller rings every
 * rank's DONE after them (exec.c). Either way the call returns once the
 * whole op is issued.
 *
 * A job across nodes runs its ranks on the daemon of each node: an op's
 * ranks this daemon does not serve have no plan (ovld_exec_rank_t.plan
 * NULL), and the collective calls (ALLGATHER, RAIL) are made for the local
 * ranks, tagged with the op's number and their place in the op
 * (ovld_coll_tag_t), so that the backend's parts on every node match. A
 * plan never names another node's buffers or events (plan.h).
 */
#ifndef OVLD_EXEC_H
#define OVLD_EXEC_H

#include "backend.h"
#include "plan.h"
#include "replay.h"

/*
 * One rank of the op: its backend rank, its plan, and the views of the
 * buffers its plan names (indexed by ovl_buf_t): A its shard, B, C, and G
 * the gathered A (the client's a_out, or scratch of plan->scratch_bytes
 * bytes, dense: ld = plan->bufs[OVL_BUF_G].cols). A buffer the plan does not
 * use (plan->bufs[i].used false) may be {NULL, 0}. The executor resolves
 * each instruction's names to these views and calls the backend; it knows
 * nothing of shapes beyond what the instructions carry.
 */
typedef struct ovld_exec_rank {
    ovld_rank_t *rank;
    const ovl_plan_t *plan;
    ovld_view_t buf[OVL_BUF_COUNT];
    void *cookie; /* given back with this rank's completion */
} ovld_exec_rank_t;

/* One op: its number and every rank's part, by rank. Every local rank's
 * plan is for this world and its own rank, with the same dtype; the ranks
 * of other nodes have none (plan NULL), and at least one rank is local. */
typedef struct ovld_exec_op {
    uint64_t seq;
    uint32_t world;
    ovld_exec_rank_t *ranks; /* world entries, by rank */
    bool serial; /* issue every rank from the calling thread (ranks that share a device) */
    /* Called once on the issuing thread, before any doorbell rings with a
     * failure of issuing, with the status and words that ring (so that a
     * client who sees its doorbell's error finds the words at once); NULL:
     * none. */
    void (*failing)(void *arg, ovl_status_t status, const char *message);
    void *failing_arg;
    /* The job's captured ops (replay.h), and the memory generation at the
     * op's start (buffers.h); NULL: every op is issued call by call. An op
     * replays where the backend can capture (graph_*), every rank is
     * served here, and every plan is worth replaying (ovl_plan_t.replay:
     * short GEMMs) and is WAIT_READY on stream 0, a body
     * without ALLGATHERs or RAILs (NCCL calls stay outside graphs), and
     * DONE on stream 0: the doorbell's values change with every op, so
     * its wait and done are graph_run's (backend.h), not the body's. */
    ovld_replay_t *replay;
    uint64_t mem_gen;
    /* Time the op on the device (`auto` measuring it, core/tune.h): a
     * time_start just after each rank's WAIT_READY, where the backend has
     * one; such an op is issued call by call, never replayed. */
    bool timed;
} ovld_exec_op_t;

/* The threads that issue ranks in parallel: made as needed (one per rank
 * beyond the first of the largest op), kept, and joined when the pool is
 * destroyed. Owned by the daemon's context; no hidden global. report
 * (copied; NULL: dropped) hears of an op whose threads are slow to issue
 * it (WARN, from the thread that runs ovld_exec_run). */
typedef struct ovld_exec_pool ovld_exec_pool_t;

ovl_status_t ovld_exec_pool_create(const ovld_reporter_t *report, ovld_exec_pool_t **ret_pool);
/* Stops and joins every thread. No ovld_exec_run may be in progress (it
 * returns only once its threads are done with the op). Accepts NULL. */
void ovld_exec_pool_destroy(ovld_exec_pool_t *pool);

/*
 * Issues the op on every rank. Whatever happens, every rank's done is rung
 * exactly once for op->seq (with the error if issuing failed half-way), so no
 * client waits forever. Returns the status of issuing, with a message in err.
 * pool: the threads for a parallel issue; NULL issues every rank from the
 * calling thread. ret_how (may be NULL): how the op's body was issued,
 * OVLD_REPLAY_EAGER (call by call: first seen, not replayable, or its
 * capture failed), _CAPTURE (captured and launched) or _LAUNCH (replayed).
 * A capture that fails is reported to the pool's reporter (WARN) and the
 * op issued call by call.
 */
ovl_status_t ovld_exec_run(ovld_exec_pool_t *pool, ovld_backend_t *b, const ovld_exec_op_t *op,
                           ovld_replay_how_t *ret_how, char *err, size_t errlen);

/* Whether every local rank's client has said ready for the op (the
 * backend's ready_seen; true where the backend cannot tell). Any thread. */
bool ovld_exec_ready(ovld_backend_t *b, const ovld_exec_op_t *op);

/* One rank of an op that will not run, and what its completion names. */
typedef struct ovld_exec_ring {
    ovld_rank_t *rank;
    void *cookie;
} ovld_exec_ring_t;

/*
 * Fails op seq on n ranks without running it (the job refused it, or it
 * failed before it could be issued): rings each rank's done once with
 * status and message, on stream 0. With ovld_exec_run, the only way an
 * op's doorbells ring: the executor owns "every rank's done rung exactly
 * once". Both run on an issuing thread (issuer.h), never the loop: a ring
 * is stream work, and may block where a stream is stalled.
 */
void ovld_exec_fail(ovld_backend_t *b, const ovld_exec_ring_t *rings, uint32_t n, uint64_t seq,
                    ovl_status_t status, const char *message);

#endif /* OVLD_EXEC_H */

/*
 * issuer.h: the threads that issue ops, so that the loop only passes
 * messages. Everything an op puts on a device's streams (its plans walked
 * by the executor: CUDA and NCCL calls, the host backend's queues) and
 * every doorbell rung for an op that fails runs here, never on the loop
 * thread: an enqueue that blocks in the driver (a stalled stream's full
 * queue) or an NCCL launch that waits for a stalled GPU or a late node
 * holds one issuing thread, while the loop goes on answering clients,
 * peers and `ovlctl`.
 *
 * Lanes. Each job issues through a lane of its own: the lane's items run
 * one at a time, in the order they were submitted, so that a rank's ops
 * (and the failures rung in their place) reach its streams in op order,
 * as the doorbell's monotonic done requires. A lane names the devices its
 * ranks use; items of lanes that share no device run at once on different
 * threads, items of lanes that share one wait for each other (the
 * backend's state of a device is not shared between threads, backend.h).
 * A lane's item waits for its devices in the issuer's queue, not on a
 * thread, so that a device stalled for good holds one thread, not all.
 *
 * Gates. An op begins with a wait for its clients' doorbells (WAIT_READY),
 * which a stream may hold for as long as the application's work before the
 * op takes. On a GPU, the streams of one process share a few hardware
 * queues, and such a wait holds up whatever else was put in its queue
 * behind it (measured: tests/gpu/test_gpu_isolation.py; docs/performance.md,
 * "Isolation between jobs"). So an op is issued ahead of its doorbells only
 * where its lane is the only one on each of its devices (a job alone on its
 * GPUs waits on nothing but itself); on a device that lanes share, a lane's
 * head op waits in the issuer, off every thread and queue, until the
 * backend's ready_seen says every local rank's client rang its doorbell.
 * One issuing thread at a time polls those gates: it spins (pausing the
 * CPU) while gates open within gate_spin_ms of each other (the config's
 * key; 1 s by default), and sleeps GATE_SLOW_NS (100 us) between polls
 * after that, so that an op its client never readies costs a CPU only
 * for a while (while gates keep opening, as on a busy shared GPU, that
 * thread keeps a CPU: gate_spin_ms 0 trades it for up to 100 to 150 us
 * more before each gated op is issued, the sleep and the timer slack).
 * Failures to ring (fail items) have no gate: a done needs no ready; nor
 * has a backend without ready_seen (the host backend's waits hold up nobody else), and once the
 * issuer stops, every gate is open (its threads must end).
 *
 * Holds. An op issued ahead while its lane was alone may still wait for
 * its doorbells when another lane comes to share the device: from then on
 * its wait can hold up the newcomer's work. The issuer watches such ops
 * (a timer on the loop, running only while a shared device has one): one
 * that still waits after hold_ms during which another lane on its device
 * had work (items queued or running, or, as owner_busy says, ops in
 * flight) is reported once, through on_hold, to the lane's owner (job.c
 * aborts the job, which releases its doorbells and so ends the wait). A
 * newcomer that only joined is held up by nothing. hold_ms 0: never.
 *
 * Threads: create, close, the lane calls and every callback are the loop
 * thread's. An item's done callback runs on the loop thread, once, after
 * the item ran; the callbacks of one lane in submission order.
 */
#ifndef OVLD_ISSUER_H
#define OVLD_ISSUER_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "backend.h"
#include "exec.h"
#include "report.h"

typedef struct ovld_issuer ovld_issuer_t;
typedef struct ovld_lane ovld_lane_t;
typedef struct ovld_issue ovld_issue_t;

/* An item is done: on the loop thread, with its results filled in. */
typedef void (*ovld_issued_cb)(ovld_issue_t *item);

/* A lane's op seq, issued ahead of its doorbells, has held a shared device
 * for held_ms (above, "Holds"): on the loop thread, once per op. owner:
 * the lane's (ovld_lane_new). */
typedef void (*ovld_hold_cb)(void *arg, void *owner, uint64_t seq, uint64_t held_ms);
/* Whether the lane's owner has ops in flight (on the loop thread; it must
 * not call the issuer). */
typedef bool (*ovld_owner_busy_fn)(void *owner);

/* What a lane runs: an op (run), or the rings of an op that fails without
 * running (rings: ovld_exec_fail's). The caller owns the item and whatever
 * it points to until its callback ran. */
struct ovld_issue {
    bool fail;
    ovld_exec_op_t op;             /* !fail */
    const ovld_exec_ring_t *rings; /* fail: nrings of them, rung with status */
    uint32_t nrings;
    uint64_t seq;
    ovl_status_t status;
    const char *message;
    ovld_issued_cb cb;
    void *arg;
    /* Results, for the callback: the executor's status and words, and how
     * long issuing took on its thread (not counting the wait for it). */
    ovl_status_t st;
    char err[256];
    uint64_t issue_ns;
    ovld_replay_how_t how; /* run: how its body was issued (exec.h) */
    /* the issuer's */
    struct ovld_issue *next;
    ovld_lane_t *lane;
    uint64_t devs; /* the devices it holds while it runs */
};

/* The issuer's threads: nthreads of them (at least 1; a device's items
 * run one at a time, so one per device is enough). pool: the executor's
 * threads for issuing an op's ranks in parallel (NULL: none). report
 * (copied) hears of items slow to issue. stall_ms: every item first waits
 * this long on its thread (a fault for tests that need an issue to stall,
 * OVLD_TEST_ISSUE_STALL_MS; 0 in production). */
typedef struct ovld_issuer_cfg {
    uint32_t nthreads;
    ovld_exec_pool_t *pool;
    uint32_t stall_ms;
    uint32_t hold_ms; /* above, "Holds"; 0: never (ovld_issuer_set_hold) */
    /* Gates are polled by spinning while one opened within gate_spin_ms,
     * else every 100 us; 0: never spin (ovld_issuer_set_gate_spin). */
    uint32_t gate_spin_ms;
    ovld_hold_cb on_hold;
    void *hold_arg;
    ovld_owner_busy_fn owner_busy; /* NULL: an owner counts as busy */
} ovld_issuer_cfg_t;

ovl_status_t ovld_issuer_create(uv_loop_t *loop, ovld_backend_t *b, const ovld_issuer_cfg_t *cfg,
                                const ovld_reporter_t *report, ovld_issuer_t **ret, char *err,
                                size_t errlen);
/* Stops the threads once they are idle (every lane freed) and closes the
 * issuer's handle; the memory goes when the loop closed it and the last
 * lane was freed (a lane may outlive the close). Accepts NULL. */
void ovld_issuer_close(ovld_issuer_t *is);
/* Delivers the callbacks of the items done so far (the loop does it anyway
 * on the issuer's wakeup; a caller that must see them now calls this). */
void ovld_issuer_deliver(ovld_issuer_t *is);
/* Items being issued or waiting to be, over every lane (for status). */
uint32_t ovld_issuer_busy(ovld_issuer_t *is);
/* A new hold limit (a reload), for holds not yet reported. */
void ovld_issuer_set_hold(ovld_issuer_t *is, uint32_t hold_ms);
/* A new gate_spin_ms (a reload), from the next poll on. */
void ovld_issuer_set_gate_spin(ovld_issuer_t *is, uint32_t gate_spin_ms);

/* A lane, on no device yet; owner is given to on_hold. NULL when out of
 * memory, or where is is NULL: a NULL lane issues each item at once on the
 * calling thread. */
ovl_status_t ovld_lane_new(ovld_issuer_t *is, void *owner, ovld_lane_t **ret);
/* The lane's items also use this device from now on (a device that
 * several lanes use gates their ops: above). */
void ovld_lane_add_device(ovld_lane_t *l, uint32_t device);
/* Queues the item; its callback runs once it ran. A NULL lane runs it here
 * and calls back before returning. */
void ovld_lane_submit(ovld_lane_t *l, ovld_backend_t *b, ovld_exec_pool_t *pool,
                      ovld_issue_t *item);
/* Whether the lane has items not yet called back. */
bool ovld_lane_busy(const ovld_lane_t *l);
/* The lane's items no longer use this device (its last rank there left). */
void ovld_lane_remove_device(ovld_lane_t *l, uint32_t device);
/* Frees an idle lane (ovld_lane_busy false); its devices count one lane
 * fewer. Before the ranks of its ops are destroyed: the issuer may read
 * their doorbells until then. Accepts NULL. */
void ovld_lane_free(ovld_lane_t *l);

#endif /* OVLD_ISSUER_H */

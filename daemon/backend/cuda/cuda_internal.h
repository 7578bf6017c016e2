/*
 * cuda_internal.h: what the files of the CUDA backend share, and nothing
 * else includes: the backend, device, rank and completion records, the error
 * macros, and the functions one file calls in another.
 *
 *   backend_cuda.c  the vtable, create/destroy, devices, errors
 *   cuda_rank.c     ranks: streams (by role), events, workspaces, the
 *                   doorbell registration, scratch, release; set_streams,
 *                   wait_ready, record, wait, gemm, sleep
 *   cuda_mem.c      IPC import/release and its cache
 *   cuda_nccl.c     communicators (job_key, job_setup, job_abort,
 *                   job_teardown; one per local rank, spanning every node
 *                   of a job across nodes), the all-gather (NCCL, by the
 *                   method asked, for the local ranks' parts), the rail
 *                   (grouped NCCL send/recv between nodes) and the
 *                   copy-engine pulls
 *   cuda_done.c     completions (done, the poller), the watchdog,
 *                   restore_release
 *   cuda_gemm.c     cuBLASLt (its own header, cuda_gemm.h)
 */
#ifndef OVLD_CUDA_INTERNAL_H
#define OVLD_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend.h"
#include "completion.h"
#include "cuda_gemm.h"
#include "cudrv.h"
#include "kernels.h"
#include "plan.h"

typedef struct cuda_backend cuda_backend_t;
struct cuda_setup_work; /* cuda_nccl.c: a job's setup or teardown on a worker */

typedef struct cuda_dev {
    int ordinal;
    ovld_device_info_t info;
    int prio_hi, prio_lo;
    ovld_lt_t *lt;
} cuda_dev_t;

/* One opened IPC handle on one device (cuda_mem.c). */
typedef struct ipc_entry ipc_entry_t;

/* Ranks per call of a done batch (cuda_done.c): at most 4 writes each and
 * the counter's, under the driver's 256 per cuStreamBatchMemOp; and the
 * groups a batch of the largest world takes, each with its counter. */
#define CUDA_RING_RANKS  63
#define CUDA_DONE_GROUPS ((OVL_PLAN_MAX_WORLD + CUDA_RING_RANKS - 1) / CUDA_RING_RANKS)

/* The seqs of the ring kernels of one origin's stream 0 (kernels.h): more
 * slots than ops of a job are ever issued at once (OVLD_MAX_ISSUED, 4),
 * and the host checks that it never overwrites one not read yet. */
typedef struct cuda_seq_ring {
    uint64_t seq[OVLD_RING_SEQS];
    uint64_t ran; /* ring kernels that ran, written by the last of them */
} cuda_seq_ring_t;

/* The event a done batch records behind itself, which the watchdog asks
 * whether the stream died: one for every completion of the batch (all
 * ranks of a replayed op), back to home's pool with the last of them. */
/* Timed ops of a rank at once (more than ever issued together). */
#define CUDA_TIMERS 8

typedef struct cuda_done_ev {
    cudaEvent_t ev;
    struct ovld_rank *home; /* the ringing stream's rank: events belong to a device */
    _Atomic uint32_t refs;
    struct cuda_done_ev *next; /* home's pool (free_ev) */
} cuda_done_ev_t;

/* A completion on its way: the poller pushes it; the watchdog may
 * deliver it instead if the stream died. */
typedef struct cuda_done {
    ovld_cq_node_t node; /* first */
    struct ovld_rank *rank;
    /* The counter that the batch which rang it writes last: the ringing
     * rank's own for that batch's group (done_own[g], CUDA_RING_RANKS ranks
     * a group), which only that rank's stream 0 writes (plans put DONE
     * there, and the executor's failures ring there), in op order. */
    const uint64_t *counter;
    cuda_done_ev_t *ev; /* NULL: none could be recorded */
    uint32_t timer;     /* 1 + the rank's timer slot of a timed op; 0: none */
    uint64_t issued_ns;
    _Atomic int state;            /* 0 waiting, 1 pushed by the poller, 2 by the watchdog */
    struct cuda_done *ready_next; /* the poller's list of those it took, to push */
    bool warned;                  /* reported as slow (loop thread) */
    struct cuda_done *prev, *next;
} cuda_done_t;

/* Stream priority classes, taken from the plans' stream roles: the
 * doorbell's stream, communication and copies at the highest priority,
 * GEMMs at the lowest, so that communication never queues behind a GEMM's
 * blocks. */
typedef enum cuda_prio {
    CUDA_PRIO_HI,
    CUDA_PRIO_LO,
    CUDA_PRIO_COUNT,
} cuda_prio_t;

/* One stream index of a rank: a CUDA stream per priority class, each made
 * when a plan first gives the index a role of that class, and the class
 * the op being issued uses (cur; -1 before any). cap: while an op is being
 * captured, the stream of the origin's capture pool the index's work goes
 * to (cuda_graph.c); NULL: its own. */
typedef struct cuda_stream_slot {
    cudaStream_t s[CUDA_PRIO_COUNT];
    int cur;
    cudaStream_t cap;
} cuda_stream_slot_t;

/*
 * GEMM workspaces per rank: one per stream index a plan may run GEMMs on.
 * The one bound the backend takes from the planner, because memory must be
 * taken before ops run (cudaMalloc may synchronize the device, and a
 * stream may wait on a client's doorbell for ever); a stream index past it
 * fails its GEMM with words rather than share a workspace.
 */
#define CUDA_WORKSPACES OVL_PLAN_MAX_STREAMS

struct ovld_rank {
    cuda_backend_t *cb;
    cuda_dev_t *dev;
    /* The streams by index (cuda_set_streams grows the array, loop
     * thread); stream 0 exists from the start, with the client's class. */
    cuda_stream_slot_t *slots;
    uint32_t nslots;
    uint32_t nstreams;    /* of them, those the op being issued names (cuda_set_streams) */
    cudaEvent_t chain_ev; /* orders an index's new stream after its old one */
    /* Replay (cuda_graph.c): the other ranks' stream 0 joins the origin's
     * (join_ev, each rank's own) and the origin's forks to theirs (fork_ev,
     * the origin's). */
    cudaEvent_t join_ev, fork_ev;
    /* As an origin: the streams that the ranks sharing its GPU are
     * captured on (cuda_graph.c, capture_streams), made at the first such
     * capture; index 0 is its own stream 0 (and stays NULL here). */
    cudaStream_t cap_pool[OVL_PLAN_MAX_STREAMS];
    /* A replayed op runs every rank's part on the origin's stream 0
     * (cuda_graph_run): lag is that origin while this rank's stream 0 has
     * not caught up with it (its next work waits for the origin's first),
     * s0_ahead says that this rank's stream 0 has work the origin's has
     * not waited for. The op's issuing thread only. */
    struct ovld_rank *lag;
    bool s0_ahead;
    cudaEvent_t run_ev; /* the origin's: the end of its last replayed op */
    void *workspace[CUDA_WORKSPACES];
    cudaEvent_t *events;
    uint32_t nevents;
    /* Timed ops (cuda_time_start): slot seq % CUDA_TIMERS's start and end
     * events (made with timing at first use) and the op that owns the
     * slot (0: none); the issuing thread's, read back by the poller once
     * the op's counter shows its end event complete. */
    cudaEvent_t t_start[CUDA_TIMERS], t_end[CUDA_TIMERS];
    uint64_t t_seq[CUDA_TIMERS];
    /* The doorbell: a memfd page mapped by both processes and registered
     * with CUDA in both, so that stream memory operations reach it. The
     * streams' waits are on its slots (the client's stream writes ready
     * slots that stream 0 waits on, and waits on done slots that stream 0
     * writes), so ovld can end either side's wait with a CPU store, which
     * no stalled GPU queue can hold up. done and the error word are what
     * the client's host-side waits (throttle, synchronize, check) read. */
    struct ovl_doorbell *db;     /* as the host sees it */
    struct ovl_doorbell *db_dev; /* as the GPU sees it */
    int db_fd;
    /* Its own completion counters, one per group of a done batch: seq after
     * each batch its stream 0 rings (its own DONE, group 0; or every rank's
     * of an op it replays, CUDA_RING_RANKS ranks a group), written by the
     * GPU after the doorbells of the group; ovld's pinned memory, which the
     * poller reads (cuda_done.c) and no client can write. */
    uint64_t *done_own;     /* CUDA_DONE_GROUPS entries */
    uint64_t *done_own_dev; /* as the GPU sees it */
    /* As the origin of replayed ops whose graph rings their done itself
     * (cuda_graph.c, kernels.h): the seqs the host gives the ring kernels
     * on its stream 0 and how many of them ran (pinned), and the launches
     * issued with one (the op's issuing thread). */
    cuda_seq_ring_t *ring, *ring_dev;
    uint64_t ring_next;
    /* Guards inflight and the pools: the issuing thread adds an op (DONE),
     * the loop delivers and watches them. */
    pthread_mutex_t mu;
    cuda_done_ev_t *free_ev;     /* done events of this device to reuse (under mu) */
    struct cuda_done *free_done; /* completion records to reuse (under mu) */
    uint32_t nfree_done;
    /* Whether the doorbell's error pair (error_seq, error) was claimed: by
     * the first failure, whichever thread records it (cuda_claim_error). */
    atomic_bool error_written;
    bool setup_pending;            /* its communicator is being made on a worker (loop thread) */
    struct cuda_setup_work *setup; /* that setup, while setup_pending */
    /* Its job's communicator: NULL where none was made, and from job_abort
     * on (the abort worker takes it). Who may use it when: cuda_nccl.c;
     * once the setup is over, only under nccl_mu. */
    ncclComm_t nccl;
    pthread_mutex_t nccl_mu;
    /* Its place in the job (job_setup): its job rank, which is its rank in
     * nccl, and the job's ranks on every node; the collectives check their
     * parts against these. */
    uint32_t global, world;
    /* Where ranks of the job share a GPU, nccl is its rail group's
     * communicator, not the job's: a job rank q is rank comm_rank_of[q] of
     * it (world entries; UINT32_MAX: q is of another group). NULL: nccl is
     * the job's, its ranks the job's. */
    uint32_t *comm_rank_of;
    bool across_nodes; /* the job spans nodes (for words) */
    /* The job lost a node (job_abort, loop thread): collective calls fail
     * at once, a launch waiting on the issuing thread stops; nccl is gone
     * or going. */
    atomic_bool aborted;
    uint32_t abort_pending; /* aborts of its communicator still running (loop thread) */
    void *scratch;
    size_t scratch_bytes;
    cuda_done_t *inflight; /* under mu */
    /* Released (its client gone): the value every slot must hold, kept in
     * ovld's memory, since the page is the client's to write too. */
    uint64_t release_value; /* 0: not released (atomic: the gates read it) */
    bool release_undone;    /* a slot was found written after the release (reported once) */
    struct ovld_rank *next;
};

struct cuda_backend {
    ovld_backend_t base;
    uv_loop_t *loop;
    ovl_cudrv_t drv;
    uint32_t ndev;
    cuda_dev_t *devs;
    uint32_t cap_streams; /* capture_streams (config, read at start; cuda_graph.c) */
    ovld_cq_t cq;
    uv_timer_t watchdog;
    /* Its ranks: added and taken off by the loop thread, under ranks_mu,
     * which the poller holds while it looks at them. */
    struct ovld_rank *ranks;
    pthread_mutex_t ranks_mu;
    /* The poller (cuda_done.c): poll_gen counts rings, so that it sleeps
     * on poll_cv only when nothing new came. */
    pthread_t poller;
    bool poller_started;
    pthread_mutex_t poll_mu;
    pthread_cond_t poll_cv;
    uint64_t poll_gen; /* under poll_mu, as the rest */
    bool poll_idle, poll_stop;
    pthread_mutex_t ipc_mu;
    ipc_entry_t *ipc;
    uint64_t ipc_hits, ipc_misses; /* under ipc_mu */
    _Atomic uint32_t works;        /* uv_work items in flight (and teardowns deferred) */
    /* Teardowns waiting for an abort of their ranks' communicators to end
     * (loop thread; cuda_nccl.c). */
    struct cuda_setup_work *deferred;
    bool cq_closed; /* destroyed: freed when the last work is done */
};

/* ------------------------------------------------- errors, in one place */

/* The last enqueue failure of this thread, in words (backend_cuda.c). Every
 * failure of an enqueue primitive writes it: last_error must never hand
 * back an older failure's words. */
extern _Thread_local char cuda_last_err[256];

/* Keeps the words of a failed CUDA call for the op's error message (exec.c
 * asks through last_error; job.c logs the message once), then returns
 * OVL_ERR_BACKEND. Nothing is logged here: the backend only reports what
 * answers no request (report.h). */
#define CUDA_TRY(cb, call, what)                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (void)(cb);                                                                            \
            snprintf(cuda_last_err, sizeof(cuda_last_err), "%s: %s: %s", (what), #call,            \
                     cudaGetErrorString(e_));                                                      \
            return OVL_ERR_BACKEND;                                                                \
        }                                                                                          \
    } while (0)

/* Every enqueue makes the rank's device current first: an issuing thread
 * drives whichever GPUs its job uses, and cuBLASLt, kernel launches and copies use the
 * current device's context (cudaSetDevice costs well under a microsecond
 * when nothing changes). */
#define USE_DEVICE(r)                                                                              \
    do {                                                                                           \
        if (cuda_set_device((r)->cb, (r)->dev) != OVL_OK)                                          \
            return OVL_ERR_BACKEND;                                                                \
    } while (0)

/* ------------------------------------------- calls across the backend's files */

/* The vtable's entries (backend_cuda.c's cuda_ops) have their contracts in
 * backend.h; the others have theirs here. */

/* backend_cuda.c */
/* Makes dev current on the calling thread (CUDA_TRY on failure). */
ovl_status_t cuda_set_device(cuda_backend_t *cb, cuda_dev_t *dev);
/* After a work item: the backend may have been destroyed meanwhile. */
void cuda_work_done(cuda_backend_t *cb);
/* Frees what create made, once the completion queue closed and no work
 * item is left (cuda_util.c). */
void cuda_backend_free(cuda_backend_t *cb);

/* cuda_mem.c */
ovl_status_t cuda_mem_import(ovld_backend_t *b, const ovld_mem_import_t *imp, ovld_bmem_t **ret_mem,
                             void **ret_ptr, char *err, size_t errlen);
void cuda_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block);
void cuda_mem_cache_stats(ovld_backend_t *b, uint64_t *hits, uint64_t *misses);

/* cuda_rank.c */
/* Frees what a rank holds (not the rank itself), going on past failures. */
void cuda_rank_free_resources(struct ovld_rank *r);
/* Takes the rank off its backend's list (loop thread). */
void cuda_rank_unlink(struct ovld_rank *r);
ovl_status_t cuda_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                              ovld_doorbell_export_t *ret_db, char *err, size_t errlen);
void cuda_rank_destroy(ovld_backend_t *b, ovld_rank_t *r);
void cuda_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi);
void cuda_rank_fail_op(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq, ovl_status_t status);

/* True for the one caller that may write r's doorbell error pair: the first
 * failure's, whether by a GPU write (cuda_done's ring) or a CPU store (a
 * ring by CPU, an abort, a refused op), so that the two words of the pair
 * always come from one failure. Any thread. */
static inline bool cuda_claim_error(ovld_rank_t *r)
{
    return !atomic_exchange(&r->error_written, true);
}
ovl_status_t cuda_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes, void **ret_ptr,
                               char *err, size_t errlen);
ovl_status_t cuda_reserve_events(ovld_rank_t *r, uint32_t n);
ovl_status_t cuda_set_streams(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n);
/* r's stream 0 for eager work: caught up with the origin of a replayed op
 * first (cuda_graph_run), and marked as ahead of it. NULL with words in
 * cuda_last_err if the catching up failed. */
cudaStream_t cuda_s0(struct ovld_rank *r);
/* r's stream 0 as it is (its role's stream: always the client's class),
 * without catching up: for captures, replays and rings of last resort. */
static inline cudaStream_t cuda_s0_stream(const struct ovld_rank *r)
{
    return r->slots[0].s[r->slots[0].cur];
}
/* The stream that r's stream index `stream` (given a role) is captured
 * on: the origin's pool stream it was given (cuda_graph.c), else its own. */
static inline cudaStream_t cuda_captured_stream(const struct ovld_rank *r, uint32_t stream)
{
    const cuda_stream_slot_t *slot = &r->slots[stream];
    return slot->cap ? slot->cap : slot->s[slot->cur];
}
/* The CUDA stream that the op being issued calls `stream` (the roles
 * cuda_set_streams was given), or NULL with words in cuda_last_err. */
cudaStream_t cuda_stream(struct ovld_rank *r, uint32_t stream);
ovl_status_t cuda_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq);
ovl_status_t cuda_time_start(ovld_rank_t *r, uint32_t stream, uint64_t seq);
bool cuda_ready_seen(ovld_rank_t *r, uint64_t seq);
ovl_status_t cuda_record(ovld_rank_t *r, uint32_t stream, uint32_t event);
ovl_status_t cuda_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event);
ovl_status_t cuda_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args);
ovl_status_t cuda_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns);
ovl_status_t cuda_reduce(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                         uint64_t rows, uint64_t cols, uint32_t nblocks, uint64_t stride,
                         ovl_dtype_t dtype, uint32_t div);

/* cuda_graph.c */
/* Whether this thread is capturing an op (between graph_capture and
 * graph_end): cuda_stream then hands out only streams in the capture. */
extern _Thread_local bool cuda_capturing;
bool cuda_in_capture(cudaStream_t s);
ovl_status_t cuda_graph_capture(ovld_rank_t *const *ranks, uint32_t n);
ovl_status_t cuda_graph_end(ovld_rank_t *const *ranks, uint32_t n, ovld_graph_t **ret);
ovl_status_t cuda_graph_run(ovld_graph_t *g, ovld_rank_t *const *ranks, void *const *cookies,
                            uint32_t n, uint64_t seq);
void cuda_graph_free(ovld_backend_t *b, ovld_graph_t *g);

/* cuda_nccl.c */
ovl_status_t cuda_job_setup(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                            const ovld_job_net_t *net, bool collective, ovld_setup_cb cb,
                            void *arg);
void cuda_job_teardown(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n);
ovl_status_t cuda_job_key(ovld_backend_t *b, uint8_t out[OVLD_NCCL_ID_LEN], char *err,
                          size_t errlen);
void cuda_job_abort(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n);
ovl_status_t cuda_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                            const ovld_allgather_part_t *parts, uint32_t n, uint32_t world,
                            ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride);
ovl_status_t cuda_reduce_scatter(ovld_backend_t *b, ovld_coll_tag_t tag,
                                 const ovld_allgather_part_t *parts, uint32_t n, uint32_t world,
                                 ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride,
                                 bool avg);
ovl_status_t cuda_rail(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                       const ovld_rail_part_t *parts, uint32_t n, uint32_t world, ovl_dtype_t dtype,
                       uint64_t rows, uint64_t cols, uint64_t stride);
ovl_status_t cuda_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                       uint64_t rows, uint64_t cols, size_t elem);

/* cuda_done.c */
void cuda_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
               const char *message, void *cookie);
/* Rings op seq's done on ranks[0, n) from stream s of rank o (current
 * device: o's), as cuda_done does for one, in one batch of stream writes
 * with every completion left to the poller (cookies[i]). Never
 * fails to ring: what the GPU cannot write, the CPU does. */
void cuda_done_ring(struct ovld_rank *o, cudaStream_t s, ovld_rank_t *const *ranks,
                    void *const *cookies, uint32_t n, uint64_t seq, ovl_status_t status,
                    const char *message);
/* The same completions of a replayed op (OVL_OK, n <= OVLD_RING_MAX_RANKS)
 * whose graph rings them itself, its ring kernel launched on s just
 * before, writing o's done_own[0] after every rank's done: the poller's tracking alone. */
void cuda_done_track(struct ovld_rank *o, cudaStream_t s, ovld_rank_t *const *ranks,
                     void *const *cookies, uint32_t n, uint64_t seq);
/* The poller thread: started once the completion queue exists, stopped
 * before it closes. */
ovl_status_t cuda_poller_start(cuda_backend_t *cb, char *err, size_t errlen);
void cuda_poller_stop(cuda_backend_t *cb);
/* The watchdog timer's callback (loop thread; t->data is the backend). */
void cuda_on_watchdog(uv_timer_t *t);

#endif /* OVLD_CUDA_INTERNAL_H */

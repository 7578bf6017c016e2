/*
 * backend.h: the one interface between ovld and the hardware that runs plans.
 *
 * A backend owns devices, streams, events, doorbells, client memory mappings
 * and the primitive operations a host program is made of: wait for the
 * client's doorbell, record/wait events, all-gather, rail (send/recv
 * between nodes), copy, GEMM, sleep, ring done. It knows nothing about algorithms (exec.c walks the
 * plan) nor about sockets and jobs (server/, core/job.c). Two exist: host (backend_host.c and
 * host_*.c: CPU threads and shared memory) and cuda (backend_cuda.c and cuda_*.c).
 *
 * Threads: every function is called from the loop thread, except the
 * enqueue primitives (reserve_events to done, below), which the executor
 * calls from an issuing thread (issuer.h): a rank's from one thread at a
 * time, a device's never from two threads at once. Calls that enqueue work
 * return once it is queued; the work's completion is reported by
 * ovld_backend_ops.done through the completion callback given to the
 * constructor, on the loop thread (never from the enqueueing call itself:
 * a completion that must be reported at once is pushed to the loop too).
 *
 * Words: a backend logs nothing. A call that fails returns its status and
 * says why, naming the library call and its error, where the caller gets
 * it: the err buffer of the calls that have one, last_error for the enqueue
 * primitives, the message of job_setup's callback and of a completion. The
 * caller that answers a client logs the failure once, with the client's
 * message. What answers no request (a stuck op, a failed teardown, MPS not
 * running) goes to the reporter given to the constructor (report.h), from
 * whichever thread sees it.
 */
#ifndef OVLD_BACKEND_H
#define OVLD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "gemm_args.h" /* ovld_view_t, ovld_gemm_args_t */
#include "ovl.h"
#include "plan.h" /* ovl_stream_role_t, ovl_ag_method_t */
#include "report.h"
#include "uuid.h" /* OVLD_UUID_LEN, ovld_uuid_format (proto/, shared with ovlctl) */

#define OVLD_IPC_HANDLE_MAX 64 /* bytes: cudaIpcMemHandle_t is 64 */

typedef struct ovld_device_info {
    uint8_t uuid[OVLD_UUID_LEN];
    char name[96];
    char driver[32]; /* the driver's version in words ("cuda 13000"; host: "") */
    uint64_t total_memory;
    bool mps; /* CUDA: contexts are shared through MPS */
} ovld_device_info_t;

typedef struct ovld_backend ovld_backend_t;
typedef struct ovld_rank ovld_rank_t;   /* one rank of one job on one device */
typedef struct ovld_bmem ovld_bmem_t;   /* one imported client buffer */
typedef struct ovld_graph ovld_graph_t; /* the captured body of an op (replay.h) */

/* What a client hands over to register memory. */
typedef struct ovld_mem_import {
    int fd;             /* host: memfd (the backend takes ownership), else -1 */
    uint64_t fd_offset; /* host: offset of the range in the file */
    const uint8_t *ipc; /* cuda: IPC handle bytes, else NULL */
    size_t ipc_len;
    uint64_t ipc_offset; /* cuda: ptr - allocation base */
    uint64_t bytes;
    int device; /* index into the backend's devices; -1: unknown */
} ovld_mem_import_t;

/* What a rank's client needs to open its doorbell: a page of a memfd, in
 * either backend (the CUDA one registers it with CUDA). */
typedef struct ovld_doorbell_export {
    int fd;          /* a dup of the doorbell memfd for the client (caller closes) */
    uint64_t offset; /* offset of struct ovl_doorbell in that file */
} ovld_doorbell_export_t;

/* One rank's part of an all-gather: its rows x cols from src, and where
 * every rank's rows land in its own matrix: rank b's at dst's rows
 * [b*stride, b*stride + rows) (exec.c resolves both from the plan's names).
 * A reduce-scatter's parts have the same form: src is rank 0's block of the
 * rank's partials (rank b's block b*stride rows past it), dst where the
 * rank's own block of the sum lands.
 * The parts of one call are the ranks this daemon serves; in a job across
 * nodes the others' rows come from the other daemons. */
typedef struct ovld_allgather_part {
    ovld_rank_t *rank;
    uint32_t global; /* this part's rank in the job (its block in dst) */
    uint32_t stream;
    ovld_view_t src; /* this rank's rows */
    ovld_view_t dst; /* rank 0's block of this rank's gathered matrix */
} ovld_allgather_part_t;

/* One rank's part of a rail (a ring's exchange between nodes): its rows x
 * cols from src go to each rank of send[0..nsend), and the rows of each
 * rank q of recv[0..nrecv) land in its own matrix at dst's rows
 * [q*stride, q*stride + rows). Ranks are the job's (global) ranks: the
 * ranks of the job's communicator, which may be served by other daemons
 * (exec.c resolves the views from the plan's names; the lists are the
 * plan's, valid during the call only). */
typedef struct ovld_rail_part {
    ovld_rank_t *rank;
    uint32_t global; /* this part's rank in the job */
    uint32_t stream;
    ovld_view_t src; /* this rank's rows */
    ovld_view_t dst; /* rank 0's block of this rank's gathered matrix */
    const uint32_t *send;
    uint32_t nsend;
    const uint32_t *recv;
    uint32_t nrecv;
} ovld_rail_part_t;

/* Which transfer of an op a collective call is (an all-gather or a rail):
 * the op's number and the call's place among the op's collective calls
 * (0, 1, ...), the same on every node, so that the daemons of a job across
 * nodes match their parts without talking (NCCL matches by issue order;
 * the host backend's rows between nodes by this, xfer.h). */
typedef struct ovld_coll_tag {
    uint64_t seq;
    uint32_t index;
} ovld_coll_tag_t;

#define OVLD_NCCL_ID_LEN 128 /* bytes of a job key: the size of ncclUniqueId */

struct ovld_xfer_job; /* net/xfer.h: one job's rows to and from other nodes */

/* Runs on the loop thread, once per transfer. */
typedef void (*ovld_rows_done_fn)(void *arg, ovl_status_t status, const char *why);

/* The mover of a job's rows to and from the ranks other daemons serve, for
 * a backend with no transport of its own (the host backend): the job gives
 * it (net/xfer.h's ovld_xfer_mover), so that no backend calls the daemons'
 * transport by name. send and recv: any thread; under the call's tag;
 * OVL_OK and done later, exactly once, or a failure now (words in why) and
 * no done. */
typedef struct ovld_rows_mover {
    ovl_status_t (*send)(struct ovld_xfer_job *xj, ovld_coll_tag_t tag, uint32_t from, uint32_t to,
                         const void *src, size_t bytes, ovld_rows_done_fn done, void *arg,
                         char *why, size_t whylen);
    ovl_status_t (*recv)(struct ovld_xfer_job *xj, ovld_coll_tag_t tag, uint32_t from, uint32_t to,
                         void *dst, size_t bytes, ovld_rows_done_fn done, void *arg, char *why,
                         size_t whylen);
} ovld_rows_mover_t;

/* A job across nodes, as job_setup sees it: where its ranks are. The
 * arrays are valid during the call only (the backend copies what it
 * keeps); xfer lives until job_teardown returned. */
typedef struct ovld_job_net {
    uint32_t world;          /* the job's ranks, on every node */
    const uint32_t *global;  /* n entries: each local rank's rank in the job */
    const uint32_t *node_of; /* world entries: each rank's node, dense from 0 */
    uint32_t self_node;      /* this daemon's node */
    uint32_t nnodes;
    /* the coordinator's job_key (OVLD_NCCL_ID_LEN bytes: CUDA, the
     * ncclUniqueId of the job's communicator); NULL where its backend
     * made none */
    const uint8_t *key;
    /* Instead of key where ranks of a node share a GPU (no communicator
     * can span the job, docs/multinode.md): one key per rail group
     * (nrail_keys of OVLD_NCCL_ID_LEN bytes, back to back), each rank's
     * rail group and its place in it (world entries; ovl_plan_rail_groups).
     * Every RAIL of a rank names ranks of its group only. */
    const uint8_t *rail_keys;
    uint32_t nrail_keys;
    const uint32_t *rail_group, *rail_pos;
    /* rows to and from other nodes (host backend): mover's calls on xfer */
    struct ovld_xfer_job *xfer;
    const ovld_rows_mover_t *mover;
} ovld_job_net_t;

/* End of a job_setup, on the loop thread. */
typedef void (*ovld_setup_cb)(void *arg, ovl_status_t status, const char *message);

/* Completion of an op on one rank, delivered on the loop thread; ns: the
 * op's device time on the rank, from its time_start to its done (0: the op
 * was not timed, or the time could not be had). */
typedef void (*ovld_done_cb)(void *arg, void *cookie, uint64_t seq, ovl_status_t status,
                             const char *message, uint64_t ns);

typedef struct ovld_backend_ops {
    const char *name;
    void (*destroy)(ovld_backend_t *b);

    uint32_t (*device_count)(ovld_backend_t *b);
    void (*device_info)(ovld_backend_t *b, uint32_t index, ovld_device_info_t *ret);
    /* What ovld holds on a device now: streams, and bytes of its own memory
     * (doorbells, scratch, workspaces; client buffers are counted apart). */
    void (*device_usage)(ovld_backend_t *b, uint32_t index, uint32_t *ret_streams,
                         uint64_t *ret_bytes);

    /* Memory. import may block (IPC opens): where the backend says so
     * (import_blocking) the caller runs it on a worker thread. release never
     * blocks the caller: a backend whose release blocks defers it. A failed
     * import says why in err (the client's words: what was wrong with the
     * memory, or the call that failed). */
    bool import_blocking;
    ovl_status_t (*mem_import)(ovld_backend_t *b, const ovld_mem_import_t *imp,
                               ovld_bmem_t **ret_mem, void **ret_ptr, char *err, size_t errlen);
    /* may_block: the caller is a worker thread and wants the mapping gone
     * when this returns (a client about to free the memory waits for it). */
    void (*mem_release)(ovld_backend_t *b, ovld_bmem_t *mem, bool may_block);

    /* Ranks: streams, events and the doorbell of one rank on one device.
     * A failure says why in err (the caller names the device). */
    ovl_status_t (*rank_create)(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                                ovld_doorbell_export_t *ret_db, char *err, size_t errlen);
    void (*rank_destroy)(ovld_backend_t *b, ovld_rank_t *rank);
    /* What a job's ranks need together, prepared off the loop thread; cb
     * runs on the loop thread, always after this returned. collective: the
     * plans may gather with the backend's collective (CUDA: one NCCL
     * communicator per rank, created in one group); false where they never
     * will (the job's ranks share a device, which NCCL cannot serve). The
     * ranks stay alive until cb ran. net: NULL for a job whose ranks this
     * daemon serves all (ranks[i] is rank i, n the world); else where the
     * job's ranks are (ranks are the local ones, net->global[i] their ranks
     * in the job), and the communicators span every node: the job's
     * (net->key), or one per rail group (net->rail_keys), whatever
     * collective says. NULL: nothing to
     * prepare, the job is ready at once (a backend without job_setup
     * cannot run jobs across nodes). */
    ovl_status_t (*job_setup)(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                              const ovld_job_net_t *net, bool collective, ovld_setup_cb cb,
                              void *arg);
    /* What the daemon coordinating a job across nodes hands to every node
     * for job_setup (net->key): CUDA, an ncclUniqueId (whose bootstrap
     * root this process then serves). Loop thread; fast. NULL: nothing. */
    ovl_status_t (*job_key)(ovld_backend_t *b, uint8_t out[OVLD_NCCL_ID_LEN], char *err,
                            size_t errlen);
    /* A job across nodes lost a node: make whatever of the ranks' work
     * waits on the other nodes stop waiting (CUDA: ncclCommAbort on their
     * communicators, off the loop thread), so that their issued ops
     * complete (with an error) and nothing hangs; later collective calls of
     * these ranks fail at once. Must not block the loop. NULL: nothing of
     * the backend's waits on other nodes (the host backend's transfers
     * fail through xfer). */
    void (*job_abort)(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n);
    /* The rank's client is gone: make the rank's queued work stop waiting
     * for it (its doorbell's ready), so that issued ops run to completion;
     * seq_hi is the last op the client submitted (nothing waits beyond it).
     * Must not wait for the GPU. NULL: nothing waits on a client. */
    void (*rank_release)(ovld_backend_t *b, ovld_rank_t *rank, uint64_t seq_hi);
    /* The rank's op seq failed where no stream will say so (its job was
     * aborted with the op issued, before rank_release lets it run): the
     * doorbell's error word says status, error_seq seq, unless it names a
     * failure already; CPU stores, loop thread. Only a hold (issuer.h)
     * aborts a job so, and a backend without ready_seen has none: NULL
     * there. */
    void (*rank_fail)(ovld_backend_t *b, ovld_rank_t *rank, uint64_t seq, ovl_status_t status);
    /* Destroys a job's ranks, with what job_setup made (off the loop thread
     * where that blocks). NULL: rank_destroy each. */
    void (*job_teardown)(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n);
    /* Scratch for the gathered A, grown when too small; valid until the next
     * call for a larger size or rank_destroy. Never called while the rank
     * has work queued that reads the previous scratch. A failure says why
     * in err. */
    ovl_status_t (*rank_scratch)(ovld_backend_t *b, ovld_rank_t *rank, uint64_t bytes,
                                 void **ret_ptr, char *err, size_t errlen);

    /* Enqueue primitives. They execute what they are asked and choose
     * nothing: one asked for what it cannot do (a method it does not have,
     * a layout the method cannot move) fails with words in last_error,
     * never a substitute. With issue_parallel, exec.c may call all of them
     * but set_streams, done, allgather and rail for different ranks from
     * different threads at once (each rank from one thread at a time);
     * set_streams, done, allgather and rail only from the op's issuing
     * thread (one call for every local rank's part, one NCCL group). They
     * run beside the loop thread's calls (a completion's delivery, the
     * watchdog, job_abort, rank_release), which the backend orders with
     * its own locks. Ranks of
     * one op that share a device are issued from one thread (exec.h,
     * serial), and ops are issued one at a time, so per-device state needs
     * no lock. reserve_events makes events [0, n) of a rank exist
     * beforehand, so that those threads only look them up (a wait names
     * another rank's event). */
    bool issue_parallel;
    ovl_status_t (*reserve_events)(ovld_rank_t *r, uint32_t n);
    /* The streams [0, n) of the op about to be issued on r and their roles
     * (the plan's): the backend takes each stream's priority from its role,
     * and makes what the streams need, before any primitive of the op. The
     * streams keep these roles until the next call; before the first, stream
     * 0 exists with the client's role (a failed op's done goes there). Work
     * on one stream index stays in issue order whatever its roles: across
     * ops, plans order everything through stream 0 (each op's streams wait
     * on its READY, recorded on stream 0; its DONE on stream 0 joins them
     * all). NULL: streams have no roles and exist when used. */
    ovl_status_t (*set_streams)(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n);
    ovl_status_t (*wait_ready)(ovld_rank_t *r, uint32_t stream, uint64_t seq);
    /* Op seq's device time starts here on the stream (issued just after
     * its wait_ready, on the same stream), and ends at its done, whose
     * completion reports it (ovld_done_cb's ns). A failure leaves the op
     * as it is, untimed (its done reports 0; the executor goes on). NULL:
     * the backend has no timer, and `auto` does not measure on it
     * (core/tune.h). */
    ovl_status_t (*time_start)(ovld_rank_t *r, uint32_t stream, uint64_t seq);
    /* Whether the rank's client has said ready for op seq (what wait_ready
     * waits for, read by the CPU; a released doorbell reads as ready). Any
     * thread, no lock, no driver call: the issuer asks it before it puts
     * an op on a device that other jobs share (issuer.h, "Gates"). NULL:
     * a waiting op holds up nothing but its own rank (the host backend,
     * whose streams are threads of their own), so every op is issued at
     * once and none is watched for holds. */
    bool (*ready_seen)(ovld_rank_t *r, uint64_t seq);
    ovl_status_t (*record)(ovld_rank_t *r, uint32_t stream, uint32_t event);
    ovl_status_t (*wait)(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event);
    /* Every local part in one call (one NCCL group), in rank order, of a
     * job of `world` ranks (nparts == world for a job on one daemon; fewer
     * across nodes, the others' parts issued by their daemons with the same
     * tag), by exactly `method` (plan.h says what each one can move). NULL:
     * the backend has no collective; plans then gather by pulls (the daemon
     * asks for the copy engine). */
    ovl_status_t (*allgather)(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                              const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                              ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride);
    /* The reduce-scatter (plan.h, OVL_I_REDUCE_SCATTER): every local part
     * in one call (one NCCL group), in rank order, of a job of `world`
     * ranks: for each rank b, block b (rows x cols, b*stride rows past src)
     * of every part's src, summed in fp32 (avg: divided by world) and
     * stored in dtype once, lands in part b's dst. NULL: the backend has
     * no reduce-scatter; GEMM + reduce-scatter ops fail on it. */
    ovl_status_t (*reduce_scatter)(ovld_backend_t *b, ovld_coll_tag_t tag,
                                   const ovld_allgather_part_t *parts, uint32_t nparts,
                                   uint32_t world, ovl_dtype_t dtype, uint64_t rows, uint64_t cols,
                                   uint64_t stride, bool avg);
    /* The rail (plan.h, OVL_I_RAIL): every part's sends and receives in
     * one call (one NCCL group: grouped ncclSend/ncclRecv), parts in the
     * job's rank order, by exactly `method` (OVL_AG_NCCL_RAIL), in dense
     * rows. A part's receives complete once their senders sent, wherever
     * those are served; its sends once the rows have left src. NULL: the
     * backend cannot move rows between nodes; plans across nodes fail. */
    ovl_status_t (*rail)(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                         const ovld_rail_part_t *parts, uint32_t nparts, uint32_t world,
                         ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride);
    /* rows x cols elements from src to dst (2-D, each with its own ld). */
    ovl_status_t (*copy)(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                         uint64_t rows, uint64_t cols, size_t elem);
    ovl_status_t (*gemm)(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args);
    /* The reduction of the rank's own rows (plan.h, OVL_I_REDUCE): rows x
     * cols of dst = the sum over i < nblocks of src's rows [i*stride,
     * +rows), each element accumulated in fp32 in order of i, divided by
     * div (1: the sum; the world: avg), stored in dtype once; as the host
     * backend's reduce-scatter computes it, so that plans agree bit for
     * bit there. */
    ovl_status_t (*reduce)(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                           uint64_t rows, uint64_t cols, uint32_t nblocks, uint64_t stride,
                           ovl_dtype_t dtype, uint32_t div);
    ovl_status_t (*sleep)(ovld_rank_t *r, uint32_t stream, uint32_t ns);
    /* Sets the doorbell's error word if status != OVL_OK (or if any work of
     * this op failed on the rank), then done = seq; reports the completion,
     * with cookie, through the done callback. Must not fail to ring. */
    void (*done)(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
                 const char *message, void *cookie);
    /* The words of the last enqueue call that failed on the calling thread
     * (naming the library call), for the op's error message; NULL where
     * there are none. Every failure of an enqueue primitive (and of
     * reserve_events) sets them, so that they never name an older one. */
    const char *(*last_error)(ovld_backend_t *b);
    /* Replay (replay.h): the body of an op captured once and launched
     * again for later ops, instead of every call issued anew. The ranks
     * are the op's (all local, in rank order); ranks[0] is the origin,
     * whose stream 0 the graph is captured from and launched on. Called
     * from the op's issuing thread, like the enqueue primitives. NULL (all
     * four): the backend cannot capture, every op is issued call by call.
     *  - graph_capture: every enqueue primitive this thread calls from now
     *    until graph_end is recorded into the graph, not run: the origin's
     *    stream 0 begins the capture and every other rank's stream 0 joins
     *    it (their other streams join through the plan's waits). A
     *    primitive asked for a stream that is not in the capture fails
     *    without enqueueing anything.
     *  - graph_end: every other rank's stream 0 joins the origin's again
     *    and the capture ends, made into *ret (ret NULL: the capture is
     *    abandoned, as after a failure inside it). Either way the streams
     *    are out of capture on return, and nothing of the capture ran.
     *  - graph_run: op seq whole, the graph as its body: every rank's
     *    WAIT_READY (ready >= seq), the graph, then every rank's DONE
     *    (done = seq, OVL_OK, its completion with cookies[i], as done's);
     *    after the work queued so far on every rank's stream 0, and before
     *    any later work on them. It uses stream 0 alone (the graph has the
     *    rest): no set_streams comes before it, and the streams keep the
     *    roles of the last call (a failure's joins go to those streams,
     *    which hold nothing of the op). On failure no done was rung (the caller
     *    rings them, with the error); once it returns OVL_OK every rank's
     *    completion comes.
     *  - graph_free: at once, or once its last launch ended. */
    ovl_status_t (*graph_capture)(ovld_rank_t *const *ranks, uint32_t n);
    ovl_status_t (*graph_end)(ovld_rank_t *const *ranks, uint32_t n, ovld_graph_t **ret);
    ovl_status_t (*graph_run)(ovld_graph_t *g, ovld_rank_t *const *ranks, void *const *cookies,
                              uint32_t n, uint64_t seq);
    void (*graph_free)(ovld_backend_t *b, ovld_graph_t *g);
    /* Imports that found their mapping already open (hits) and that opened
     * one (misses), since start; NULL where every import maps anew. */
    void (*mem_cache_stats)(ovld_backend_t *b, uint64_t *ret_hits, uint64_t *ret_misses);
} ovld_backend_ops_t;

struct ovld_backend {
    const ovld_backend_ops_t *ops;
    ovld_reporter_t report; /* the constructor's; reports from any thread */
};

/* Constructors. done_cb runs on the loop thread; report (copied; NULL: drop
 * reports) may be called from any thread, from the constructor on until the
 * backend is freed. */
ovl_status_t ovld_backend_host_create(uv_loop_t *loop, const ovld_config_t *cfg,
                                      ovld_done_cb done_cb, void *done_arg,
                                      const ovld_reporter_t *report, ovld_backend_t **ret,
                                      char *err, size_t errlen);
#ifdef OVL_HAVE_CUDA
ovl_status_t ovld_backend_cuda_create(uv_loop_t *loop, const ovld_config_t *cfg,
                                      ovld_done_cb done_cb, void *done_arg,
                                      const ovld_reporter_t *report, ovld_backend_t **ret,
                                      char *err, size_t errlen);
#endif

/* Picks the backend the config asks for (auto: cuda where a GPU answers;
 * why not, reported at INFO). Defined above every backend, in
 * daemon/backends.c. */
ovl_status_t ovld_backend_create(uv_loop_t *loop, const ovld_config_t *cfg, ovld_done_cb done_cb,
                                 void *done_arg, const ovld_reporter_t *report,
                                 ovld_backend_t **ret, char *err, size_t errlen);

/* The index of the device with this UUID, or -1. */
int ovld_backend_device_by_uuid(ovld_backend_t *b, const uint8_t *uuid, size_t len);

#endif /* OVLD_BACKEND_H */

/*
 * host_internal.h: what the files of the host backend share, and nothing
 * else includes: the backend, rank, stream, event and work-item records, and
 * the functions one file calls in another.
 *
 *   backend_host.c  the vtable, create/destroy, devices
 *   host_rank.c     ranks, streams and their threads (what runs a work
 *                   item), events, scratch, the doorbell; wait_ready,
 *                   record, wait, gemm, sleep, done
 *   host_mem.c      memfd import/release
 *   host_coll.c     the all-gather, the rail and the pulls (copy); rows
 *                   to and from other nodes through the job's mover (backend.h)
 *
 * Stream roles mean nothing here (threads have no priorities): a rank's
 * streams are threads made as the plans first use them.
 */
#ifndef OVLD_HOST_INTERNAL_H
#define OVLD_HOST_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "completion.h"
#include "doorbell.h"
#include "plan.h"

#define EV_BLOCK      256u
#define EV_MAX_BLOCKS 256u /* 65536 events per rank */

typedef struct host_backend host_backend_t;

typedef struct host_event {
    uint64_t enqueued;  /* by the owner rank's issuing thread; a peer's reads it
                         * only after that record (exec.c orders them) */
    uint64_t completed; /* under hb->mu */
} host_event_t;

/* Shared by the parts of one all-gather or rail (host_coll.c). */
typedef struct host_coll host_coll_t;

typedef enum work_kind {
    W_WAIT_READY,
    W_RECORD,
    W_WAIT,
    W_RUN, /* work of another file (host_coll.c): its run says what */
    W_GEMM,
    W_SLEEP,
    W_TIME, /* an op's device time starts: its seq */
    W_DONE,
    W_STOP,
} work_kind_t;

typedef struct host_work {
    ovld_cq_node_t node; /* first: the done item is handed to the completion queue */
    struct host_work *next;
    work_kind_t kind;
    /* W_RUN: called on the stream's thread with the item, whose union the
     * maker filled (ag, copy, reduce); the stream engine knows no more of it */
    void (*run)(struct ovld_rank *r, struct host_work *w);
    struct ovld_rank *reserve_of; /* a done item from its rank's reserve */
    union {
        uint64_t seq;
        struct {
            host_event_t *ev;
            uint64_t target;
        } event;
        struct {
            host_coll_t *coll;
            uint32_t index;
        } ag;
        struct {
            ovld_view_t dst, src;
            uint64_t rows, cols;
            size_t elem;
        } copy;
        struct {
            ovld_view_t dst, src;
            uint64_t rows, cols, stride;
            uint32_t nblocks, div;
            ovl_dtype_t dtype;
        } reduce;
        ovld_gemm_args_t gemm;
        uint32_t sleep_ns;
    } u;
} host_work_t;

typedef struct host_stream {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    host_work_t *head, *tail;
    struct ovld_rank *rank;
} host_stream_t;

struct ovld_rank {
    host_backend_t *hb;
    uint32_t device;
    /* Its streams, each started on first use; the array grows only on the
     * rank's issuing thread, and under hb->mu (device_usage reads it). */
    host_stream_t **streams;
    uint32_t nstreams;
    struct ovld_rank *next; /* hb->ranks, under hb->mu */
    /* Done items for when memory runs out: done must still ring, in stream
     * order (loop thread only). */
    struct host_work *reserve;
    host_event_t *ev_blocks[EV_MAX_BLOCKS];
    struct ovl_doorbell *db;
    /* The op being timed (host_time_start): its seq and the clock when its
     * W_TIME ran; read by its W_DONE (stream threads). */
    _Atomic uint64_t time_seq, time_t0;
    struct ovl_doorbell_own db_own; /* what the client cannot write; rung under err_mu */
    int db_fd;
    void *scratch;
    size_t scratch_bytes;
    /* Work items queued or running on the rank's streams; idle_cv (under
     * err_mu) is signalled when it drops to 0. Scratch is freed only at 0. */
    atomic_uint pending;
    pthread_cond_t idle_cv;
    /* the first failure of the op in progress, taken by its done */
    pthread_mutex_t err_mu;
    ovl_status_t op_error;
    char op_msg[256];
    /* A job across nodes (job_setup's net; set before its first op, read
     * by the loop and the rank's streams after): its rank in the job, the
     * job's world, and the mover of its rows to and from other nodes. xfer
     * NULL: a job whose ranks this daemon serves all. */
    uint32_t global, world;
    struct ovld_xfer_job *xfer;
    const ovld_rows_mover_t *mover; /* its calls on xfer (backend.h) */
};

struct host_backend {
    ovld_backend_t base;
    uint32_t ndevices;
    uint64_t device_memory;
    ovld_cq_t cq;
    /* one lock and condition for every event and collective: contention is
     * negligible next to the work, and one lock cannot be taken out of order */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic bool stopping;
    struct ovld_rank *ranks;
    /* job_setup's callbacks, for the loop's next turn (loop thread only) */
    uv_async_t setup_async;
    struct host_setup *setups;
    unsigned handles; /* open: hb is freed when both are closed */
};

/* ------------------------------------------- calls across the backend's files */

/* backend_host.c: the words of the last enqueue call that failed on the
 * calling thread (exec.c asks through last_error), set with host_fail. */
extern _Thread_local char host_last_err[200];
/* Keeps the words for a failure and returns st. */
ovl_status_t host_fail(ovl_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The vtable's entries (backend_host.c's host_ops) have their contracts in
 * backend.h; the others have theirs here. */

/* host_rank.c: the first failure of r's op in progress, in words
 * ("host backend: " and fmt), for its done (any thread). */
void host_rank_fail(struct ovld_rank *r, ovl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* host_rank.c: ranks */
ovl_status_t host_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                              ovld_doorbell_export_t *ret_db, char *err, size_t errlen);
void host_rank_destroy(ovld_backend_t *b, ovld_rank_t *r);
void host_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi);
ovl_status_t host_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes, void **ret_ptr,
                               char *err, size_t errlen);
/* host_rank.c: streams and their work items */
/* The rank's stream, its thread started on first use. */
ovl_status_t host_stream_get(struct ovld_rank *r, uint32_t stream, host_stream_t **ret);
/* Queues w on s (counted in the rank's pending unless a stop). */
void host_stream_push(host_stream_t *s, host_work_t *w);
/* host_stream_get, then host_stream_push; frees w if the stream cannot start. */
ovl_status_t host_enqueue(struct ovld_rank *r, uint32_t stream, host_work_t *w);
/* A zeroed work item of this kind, or NULL. */
host_work_t *host_work_new(work_kind_t kind);
/* host_rank.c: events */
ovl_status_t host_reserve_events(ovld_rank_t *r, uint32_t n);
/* host_rank.c: the streams an op uses, started before it is issued */
ovl_status_t host_set_streams(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n);
ovl_status_t host_record(ovld_rank_t *r, uint32_t stream, uint32_t event);
ovl_status_t host_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event);
/* host_rank.c: the other work on a rank's streams */
ovl_status_t host_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq);
ovl_status_t host_time_start(ovld_rank_t *r, uint32_t stream, uint64_t seq);
ovl_status_t host_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args);
ovl_status_t host_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns);
void host_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
               const char *message, void *cookie);

/* host_mem.c */
ovl_status_t host_mem_import(ovld_backend_t *b, const ovld_mem_import_t *imp, ovld_bmem_t **ret_mem,
                             void **ret_ptr, char *err, size_t errlen);
void host_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block);

/* host_coll.c */
ovl_status_t host_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                            const ovld_allgather_part_t *parts, uint32_t nparts, uint32_t world,
                            ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride);
ovl_status_t host_reduce(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                         uint64_t rows, uint64_t cols, uint32_t nblocks, uint64_t stride,
                         ovl_dtype_t dtype, uint32_t div);
ovl_status_t host_reduce_scatter(ovld_backend_t *b, ovld_coll_tag_t tag,
                                 const ovld_allgather_part_t *parts, uint32_t nparts,
                                 uint32_t world, ovl_dtype_t dtype, uint64_t rows, uint64_t cols,
                                 uint64_t stride, bool avg);
ovl_status_t host_rail(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                       const ovld_rail_part_t *parts, uint32_t nparts, uint32_t world,
                       ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride);
ovl_status_t host_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                       uint64_t rows, uint64_t cols, size_t elem);

#endif /* OVLD_HOST_INTERNAL_H */

/*
 * backend_host.c: the host backend. Every "device" is host memory; a stream
 * is a worker thread with a FIFO of work; an event is a pair of counters
 * (records enqueued, records completed); an all-gather is a barrier plus
 * memcpy between the ranks' buffers; a GEMM is hostgemm.c; the doorbell is a
 * page of a memfd that the client maps too. It runs the same plans as the
 * CUDA backend and returns real results, so that everything but the CUDA
 * calls is exercised without a GPU.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "completion.h"
#include "doorbell.h"
#include "hostgemm.h"
#include "plan.h"

#define EV_BLOCK      256u
#define EV_MAX_BLOCKS 256u /* 65536 events per rank */

typedef struct host_backend host_backend_t;

typedef struct host_event {
    uint64_t enqueued;  /* by the owner rank's issuing thread; a peer's reads it
                         * only after that record (exec.c orders them) */
    uint64_t completed; /* under hb->mu */
} host_event_t;

/* Shared by the parts of one all-gather. */
typedef struct host_coll {
    uint32_t nparts, arrived, departed, refs;
    ovl_dtype_t dtype;
    uint64_t m, k, row0, rows;
    ovld_allgather_part_t parts[];
} host_coll_t;

typedef enum work_kind {
    W_WAIT_READY,
    W_RECORD,
    W_WAIT,
    W_ALLGATHER,
    W_COPY,
    W_GEMM,
    W_SLEEP,
    W_DONE,
    W_STOP,
} work_kind_t;

typedef struct host_work {
    ovld_cq_node_t node; /* first: the done item is handed to the completion queue */
    struct host_work *next;
    work_kind_t kind;
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
    host_stream_t streams[OVL_PLAN_MAX_STREAMS];
    struct ovld_rank *next; /* hb->ranks, under hb->mu */
    /* Done items for when memory runs out: done must still ring, in stream
     * order (loop thread only). */
    struct host_work *reserve;
    host_event_t *ev_blocks[EV_MAX_BLOCKS];
    struct ovl_doorbell *db;
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
    char op_msg[200];
};

struct ovld_bmem {
    void *map;
    size_t map_len;
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
};

/* --------------------------------------------------------------- helpers */

static void futex_wake_all(uint32_t *addr)
{
    /* Not FUTEX_PRIVATE: the waiter is the client process. */
    syscall(SYS_futex, addr, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Rings done = seq (and the first failure, if status says one), then wakes
 * the client's futex waiters. Stream 0 rings in order; host_done's last
 * resort rings from the loop thread, out of order: done never goes back
 * (proto/doorbell.h), and err_mu serializes the two. */
static void db_ring(struct ovld_rank *r, uint64_t seq, ovl_status_t status)
{
    pthread_mutex_lock(&r->err_mu);
    ovl_doorbell_ring(r->db, &r->db_own, seq, (int32_t)status);
    pthread_mutex_unlock(&r->err_mu);
    futex_wake_all(&r->db->wake);
}

static void rank_fail(struct ovld_rank *r, ovl_status_t st, const char *what)
{
    pthread_mutex_lock(&r->err_mu);
    if (r->op_error == OVL_OK) {
        r->op_error = st;
        snprintf(r->op_msg, sizeof(r->op_msg), "host backend: %s: %s", what, ovl_strerror(st));
    }
    pthread_mutex_unlock(&r->err_mu);
}

static void copy_rows(ovld_view_t dst, ovld_view_t src, uint64_t rows, uint64_t cols, size_t elem)
{
    size_t row_bytes = (size_t)cols * elem;
    for (uint64_t i = 0; i < rows; i++)
        memcpy((char *)dst.ptr + i * dst.ld * elem, (const char *)src.ptr + i * src.ld * elem,
               row_bytes);
}

static void event_complete(host_backend_t *hb, host_event_t *ev, uint64_t target)
{
    pthread_mutex_lock(&hb->mu);
    if (ev->completed < target)
        ev->completed = target;
    pthread_cond_broadcast(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
}

static void event_wait(host_backend_t *hb, host_event_t *ev, uint64_t target)
{
    pthread_mutex_lock(&hb->mu);
    while (ev->completed < target && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    pthread_mutex_unlock(&hb->mu);
}

static void coll_run(host_backend_t *hb, host_coll_t *c, uint32_t index)
{
    pthread_mutex_lock(&hb->mu);
    c->arrived++;
    pthread_cond_broadcast(&hb->cv);
    while (c->arrived < c->nparts && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    pthread_mutex_unlock(&hb->mu);

    /* Every rank's inputs are ready: gather them all into this rank's G. */
    size_t elem = ovl_dtype_size(c->dtype);
    const ovld_allgather_part_t *me = &c->parts[index];
    for (uint32_t b = 0; b < c->nparts; b++)
        copy_rows(ovld_view_rows(me->g, (uint64_t)b * c->m + c->row0, elem),
                  ovld_view_rows(c->parts[b].src, c->row0, elem), c->rows, c->k, elem);

    /* Nobody completes before everybody has read: a shard may be reused by
     * its owner once its all-gather is done, as with NCCL. */
    pthread_mutex_lock(&hb->mu);
    c->departed++;
    pthread_cond_broadcast(&hb->cv);
    while (c->departed < c->nparts && !atomic_load(&hb->stopping))
        pthread_cond_wait(&hb->cv, &hb->mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&hb->mu);
    if (last)
        free(c);
}

static void work_run(struct ovld_rank *r, host_work_t *w)
{
    host_backend_t *hb = r->hb;
    ovl_status_t st;
    switch (w->kind) {
    case W_WAIT_READY:
        /* The client writes ready before it sends the op, so this is a check
         * more than a wait; it still waits, for clients that do otherwise. */
        while (!ovl_doorbell_ready(r->db, &r->db_own, w->u.seq) && !atomic_load(&hb->stopping)) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        break;
    case W_RECORD:
        event_complete(hb, w->u.event.ev, w->u.event.target);
        break;
    case W_WAIT:
        event_wait(hb, w->u.event.ev, w->u.event.target);
        break;
    case W_ALLGATHER:
        coll_run(hb, w->u.ag.coll, w->u.ag.index);
        break;
    case W_COPY:
        copy_rows(w->u.copy.dst, w->u.copy.src, w->u.copy.rows, w->u.copy.cols, w->u.copy.elem);
        break;
    case W_GEMM: {
        const ovld_gemm_args_t *g = &w->u.gemm;
        size_t elem = ovl_dtype_size(g->dtype);
        for (uint32_t blk = 0; blk < g->nblocks; blk++) {
            uint64_t row = (uint64_t)blk * g->block_stride;
            st = ovl_host_gemm(g->dtype, g->rows, g->n, g->k, ovld_view_rows(g->a, row, elem).ptr,
                               g->a.ld, g->b.ptr, g->b.ld, g->transb,
                               ovld_view_rows(g->c, row, elem).ptr, g->c.ld);
            if (st != OVL_OK) {
                rank_fail(r, st, "gemm");
                break;
            }
        }
        break;
    }
    case W_SLEEP: {
        struct timespec ts = {0, (long)w->u.sleep_ns};
        nanosleep(&ts, NULL);
        break;
    }
    case W_DONE: {
        pthread_mutex_lock(&r->err_mu);
        if (w->node.status == OVL_OK && r->op_error != OVL_OK) {
            w->node.status = r->op_error;
            snprintf(w->node.message, sizeof(w->node.message), "%s", r->op_msg);
        }
        r->op_error = OVL_OK;
        pthread_mutex_unlock(&r->err_mu);
        db_ring(r, w->u.seq, w->node.status);
        ovld_cq_push(&hb->cq, &w->node); /* the node is freed by its release */
        return;
    }
    case W_STOP:
        break;
    }
    free(w);
}

static void *stream_main(void *arg)
{
    host_stream_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head)
            pthread_cond_wait(&s->cv, &s->mu);
        host_work_t *w = s->head;
        s->head = w->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        if (w->kind == W_STOP) {
            free(w);
            return NULL;
        }
        struct ovld_rank *r = s->rank;
        work_run(r, w);
        if (atomic_fetch_sub(&r->pending, 1) == 1) {
            pthread_mutex_lock(&r->err_mu);
            pthread_cond_broadcast(&r->idle_cv);
            pthread_mutex_unlock(&r->err_mu);
        }
    }
}

#define DONE_RESERVE 8

static void release_work_node(ovld_cq_node_t *node)
{
    host_work_t *w = (host_work_t *)node; /* the node is its first member */
    if (w->reserve_of) {
        struct ovld_rank *r = w->reserve_of;
        w->next = r->reserve;
        r->reserve = w;
        return;
    }
    free(w);
}

static ovl_status_t stream_get(struct ovld_rank *r, uint32_t stream, host_stream_t **ret)
{
    if (stream >= OVL_PLAN_MAX_STREAMS)
        return OVL_ERR_INVALID;
    host_stream_t *s = &r->streams[stream];
    if (!s->started) {
        s->rank = r;
        s->head = s->tail = NULL;
        if (pthread_mutex_init(&s->mu, NULL) != 0)
            return OVL_ERR_SYSTEM;
        if (pthread_cond_init(&s->cv, NULL) != 0) {
            pthread_mutex_destroy(&s->mu);
            return OVL_ERR_SYSTEM;
        }
        if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
            pthread_cond_destroy(&s->cv);
            pthread_mutex_destroy(&s->mu);
            return OVL_ERR_SYSTEM;
        }
        s->started = true;
    }
    *ret = s;
    return OVL_OK;
}

static void stream_push(host_stream_t *s, host_work_t *w)
{
    w->next = NULL;
    if (w->kind != W_STOP)
        atomic_fetch_add(&s->rank->pending, 1);
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static ovl_status_t enqueue(struct ovld_rank *r, uint32_t stream, host_work_t *w)
{
    host_stream_t *s;
    ovl_status_t st = stream_get(r, stream, &s);
    if (st != OVL_OK) {
        free(w);
        return st;
    }
    stream_push(s, w);
    return OVL_OK;
}

static host_work_t *work_new(work_kind_t kind)
{
    host_work_t *w = calloc(1, sizeof(*w));
    if (w)
        w->kind = kind;
    return w;
}

static ovl_status_t event_get(struct ovld_rank *r, uint32_t event, host_event_t **ret)
{
    uint32_t blk = event / EV_BLOCK;
    if (blk >= EV_MAX_BLOCKS)
        return OVL_ERR_LIMIT;
    if (!r->ev_blocks[blk]) {
        r->ev_blocks[blk] = calloc(EV_BLOCK, sizeof(host_event_t));
        if (!r->ev_blocks[blk])
            return OVL_ERR_NOMEM;
    }
    *ret = &r->ev_blocks[blk][event % EV_BLOCK];
    return OVL_OK;
}

/* ------------------------------------------------------------ the ops */

static void on_cq_closed(ovld_cq_t *q)
{
    host_backend_t *hb = (host_backend_t *)((char *)q - offsetof(host_backend_t, cq));
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    free(hb);
}

static void host_destroy(ovld_backend_t *b)
{
    host_backend_t *hb = (host_backend_t *)b;
    atomic_store(&hb->stopping, true);
    /* hb is freed once the async handle is closed (on_cq_closed), which the
     * loop does before uv_run returns. */
    ovld_cq_close(&hb->cq, on_cq_closed);
}

static uint32_t host_device_count(ovld_backend_t *b)
{
    return ((host_backend_t *)b)->ndevices;
}

static void host_device_info(ovld_backend_t *b, uint32_t index, ovld_device_info_t *ret)
{
    host_backend_t *hb = (host_backend_t *)b;
    memset(ret, 0, sizeof(*ret));
    memcpy(ret->uuid, "ovl-host", 8);
    for (int i = 0; i < 8; i++)
        ret->uuid[8 + i] = (uint8_t)((uint64_t)index >> (8 * (7 - i)));
    snprintf(ret->name, sizeof(ret->name), "host-%u", index);
    ret->total_memory = hb->device_memory;
}

static void host_device_usage(ovld_backend_t *b, uint32_t index, uint32_t *streams, uint64_t *bytes)
{
    host_backend_t *hb = (host_backend_t *)b;
    *streams = 0;
    *bytes = 0;
    pthread_mutex_lock(&hb->mu);
    for (struct ovld_rank *r = hb->ranks; r; r = r->next) {
        if (r->device != index)
            continue;
        *bytes += OVL_DOORBELL_SIZE + r->scratch_bytes;
        for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++)
            *streams += r->streams[i].started;
    }
    pthread_mutex_unlock(&hb->mu);
}

static ovl_status_t host_mem_import(ovld_backend_t *b, const ovld_mem_import_t *imp,
                                    ovld_bmem_t **ret_mem, void **ret_ptr)
{
    (void)b;
    ovl_status_t st = OVL_OK;
    ovld_bmem_t *m = NULL;
    struct stat sb;
    if (imp->fd < 0 || imp->bytes == 0)
        return OVL_ERR_INVALID;
    if (fstat(imp->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = OVL_ERR_INVALID;
        goto out;
    }
    /* A client that shrank the file under our mapping would fault the
     * daemon: only sealed memory is accepted. */
    int seals = fcntl(imp->fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        st = OVL_ERR_PERMISSION;
        goto out;
    }
    uint64_t end;
    if (__builtin_add_overflow(imp->fd_offset, imp->bytes, &end) || end > (uint64_t)sb.st_size) {
        st = OVL_ERR_RANGE;
        goto out;
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t base = imp->fd_offset - imp->fd_offset % (uint64_t)page;
    m = calloc(1, sizeof(*m));
    if (!m) {
        st = OVL_ERR_NOMEM;
        goto out;
    }
    m->map_len = (size_t)(end - base);
    m->map = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, imp->fd, (off_t)base);
    if (m->map == MAP_FAILED) {
        st = errno == ENOMEM ? OVL_ERR_NOMEM : OVL_ERR_SYSTEM;
        free(m);
        m = NULL;
        goto out;
    }
    *ret_mem = m;
    *ret_ptr = (char *)m->map + (imp->fd_offset - base);
out:
    close(imp->fd);
    return st;
}

static void host_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block)
{
    (void)b;
    (void)may_block; /* munmap does not block */
    if (!m)
        return;
    munmap(m->map, m->map_len);
    free(m);
}

static void host_rank_destroy(ovld_backend_t *b, ovld_rank_t *r);

static ovl_status_t host_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                                     ovld_doorbell_export_t *ret_db)
{
    host_backend_t *hb = (host_backend_t *)b;
    if (device >= hb->ndevices)
        return OVL_ERR_NOT_FOUND;
    struct ovld_rank *r = calloc(1, sizeof(*r));
    if (!r)
        return OVL_ERR_NOMEM;
    r->hb = hb;
    r->device = device;
    r->db_fd = -1;
    ovl_status_t st = OVL_ERR_SYSTEM;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        goto fail_free;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&r->idle_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        goto fail_free;
    if (pthread_mutex_init(&r->err_mu, NULL) != 0) {
        pthread_cond_destroy(&r->idle_cv);
        goto fail_free;
    }
    if (ovl_doorbell_create(&r->db, &r->db_fd) != OVL_OK)
        goto fail;
    memset(ret_db, 0, sizeof(*ret_db));
    ret_db->fd = fcntl(r->db_fd, F_DUPFD_CLOEXEC, 0);
    if (ret_db->fd < 0)
        goto fail;
    ret_db->offset = 0;
    /* Stream 0 rings done: its thread exists from the start, and a few done
     * items wait in reserve, so that ringing never needs resources. */
    host_stream_t *s0;
    for (int i = 0; i < DONE_RESERVE; i++) {
        host_work_t *w = work_new(W_DONE);
        if (!w)
            break;
        w->reserve_of = r;
        w->next = r->reserve;
        r->reserve = w;
    }
    if (!r->reserve || stream_get(r, 0, &s0) != OVL_OK) {
        close(ret_db->fd);
        host_rank_destroy(b, r); /* undoes all of the above */
        return OVL_ERR_NOMEM;
    }
    pthread_mutex_lock(&hb->mu);
    r->next = hb->ranks;
    hb->ranks = r;
    pthread_mutex_unlock(&hb->mu);
    *ret_rank = r;
    return OVL_OK;
fail:
    ovl_doorbell_destroy(r->db, r->db_fd);
    pthread_mutex_destroy(&r->err_mu);
    pthread_cond_destroy(&r->idle_cv);
fail_free:
    free(r);
    return st;
}

static void host_rank_destroy(ovld_backend_t *b, ovld_rank_t *r)
{
    host_backend_t *hb = (host_backend_t *)b;
    if (!r)
        return;
    pthread_mutex_lock(&hb->mu);
    for (struct ovld_rank **pp = &hb->ranks; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&hb->mu);
    for (uint32_t i = 0; i < OVL_PLAN_MAX_STREAMS; i++) {
        host_stream_t *s = &r->streams[i];
        if (!s->started)
            continue;
        host_work_t *w = work_new(W_STOP);
        if (w) {
            stream_push(s, w);
            pthread_join(s->thread, NULL);
        } else {
            /* Cannot queue a stop: leave the idle thread behind rather than
             * free what it uses. */
            pthread_detach(s->thread);
            continue;
        }
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
    }
    for (uint32_t i = 0; i < EV_MAX_BLOCKS; i++)
        free(r->ev_blocks[i]);
    while (r->reserve) {
        host_work_t *w = r->reserve;
        r->reserve = w->next;
        free(w);
    }
    ovl_doorbell_destroy(r->db, r->db_fd);
    free(r->scratch);
    pthread_mutex_destroy(&r->err_mu);
    pthread_cond_destroy(&r->idle_cv);
    free(r);
}

static void host_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi)
{
    (void)b;
    ovl_doorbell_release_ready(r->db, &r->db_own, seq_hi);
}

/* Waits (bounded) until nothing is queued or running on r's streams. The
 * job grows scratch only once its ops are done, and their completions can
 * reach the loop a moment before the last item's thread is out of it: the
 * wait is that moment. Anything longer is a bug above, and the growth is
 * refused rather than free memory that queued work will touch. */
static bool rank_wait_idle(struct ovld_rank *r)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += 2;
    pthread_mutex_lock(&r->err_mu);
    int rc = 0;
    while (atomic_load(&r->pending) != 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&r->idle_cv, &r->err_mu, &until);
    bool idle = atomic_load(&r->pending) == 0;
    pthread_mutex_unlock(&r->err_mu);
    return idle;
}

static ovl_status_t host_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes,
                                      void **ret_ptr)
{
    (void)b;
    if (bytes > SIZE_MAX)
        return OVL_ERR_LIMIT;
    if (bytes > r->scratch_bytes) {
        if (r->scratch && !rank_wait_idle(r))
            return OVL_ERR_INTERNAL;
        void *p = malloc((size_t)bytes);
        if (!p)
            return OVL_ERR_NOMEM;
        free(r->scratch);
        r->scratch = p;
        r->scratch_bytes = (size_t)bytes;
    }
    *ret_ptr = r->scratch;
    return OVL_OK;
}

static ovl_status_t host_reserve_events(ovld_rank_t *r, uint32_t n)
{
    host_event_t *ev;
    for (uint32_t e = 0; e < n; e += EV_BLOCK) {
        ovl_status_t st = event_get(r, e, &ev);
        if (st != OVL_OK)
            return st;
    }
    return n ? event_get(r, n - 1, &ev) : OVL_OK;
}

static ovl_status_t host_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    host_work_t *w = work_new(W_WAIT_READY);
    if (!w)
        return OVL_ERR_NOMEM;
    w->u.seq = seq;
    return enqueue(r, stream, w);
}

static ovl_status_t host_record(ovld_rank_t *r, uint32_t stream, uint32_t event)
{
    host_event_t *ev;
    ovl_status_t st = event_get(r, event, &ev);
    if (st != OVL_OK)
        return st;
    host_work_t *w = work_new(W_RECORD);
    if (!w)
        return OVL_ERR_NOMEM;
    w->u.event.ev = ev;
    w->u.event.target = ++ev->enqueued;
    return enqueue(r, stream, w);
}

static ovl_status_t host_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event)
{
    host_event_t *ev;
    ovl_status_t st = event_get(owner, event, &ev);
    if (st != OVL_OK)
        return st;
    /* As cudaStreamWaitEvent: wait for the latest record issued so far; an
     * event never recorded is complete. */
    if (ev->enqueued == 0)
        return OVL_OK;
    host_work_t *w = work_new(W_WAIT);
    if (!w)
        return OVL_ERR_NOMEM;
    w->u.event.ev = ev;
    w->u.event.target = ev->enqueued;
    return enqueue(r, stream, w);
}

static ovl_status_t host_allgather(ovld_backend_t *b, const ovld_allgather_part_t *parts,
                                   uint32_t nparts, ovl_dtype_t dtype, uint64_t m, uint64_t k,
                                   uint64_t row0, uint64_t rows)
{
    (void)b;
    host_coll_t *c = calloc(1, sizeof(*c) + nparts * sizeof(parts[0]));
    host_work_t **ws = calloc(nparts, sizeof(*ws));
    host_stream_t **ss = calloc(nparts, sizeof(*ss));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (!c || !ws || !ss)
        goto fail;
    *c = (host_coll_t){.nparts = nparts,
                       .refs = nparts,
                       .dtype = dtype,
                       .m = m,
                       .k = k,
                       .row0 = row0,
                       .rows = rows};
    memcpy(c->parts, parts, nparts * sizeof(parts[0]));
    /* Prepare everything first: a collective queued on some ranks only
     * would leave them waiting forever. */
    for (uint32_t i = 0; i < nparts; i++) {
        st = stream_get(parts[i].rank, parts[i].stream, &ss[i]);
        if (st != OVL_OK)
            goto fail;
        ws[i] = work_new(W_ALLGATHER);
        if (!ws[i]) {
            st = OVL_ERR_NOMEM;
            goto fail;
        }
        ws[i]->u.ag.coll = c;
        ws[i]->u.ag.index = i;
    }
    for (uint32_t i = 0; i < nparts; i++)
        stream_push(ss[i], ws[i]);
    free(ws);
    free(ss);
    return OVL_OK;
fail:
    if (ws)
        for (uint32_t i = 0; i < nparts; i++)
            free(ws[i]);
    free(ws);
    free(ss);
    free(c);
    return st;
}

static ovl_status_t host_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                              uint64_t rows, uint64_t cols, size_t elem)
{
    host_work_t *w = work_new(W_COPY);
    if (!w)
        return OVL_ERR_NOMEM;
    w->u.copy.dst = dst;
    w->u.copy.src = src;
    w->u.copy.rows = rows;
    w->u.copy.cols = cols;
    w->u.copy.elem = elem;
    return enqueue(r, stream, w);
}

static ovl_status_t host_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args)
{
    host_work_t *w = work_new(W_GEMM);
    if (!w)
        return OVL_ERR_NOMEM;
    w->u.gemm = *args;
    return enqueue(r, stream, w);
}

static ovl_status_t host_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns)
{
    host_work_t *w = work_new(W_SLEEP);
    if (!w)
        return OVL_ERR_NOMEM;
    w->u.sleep_ns = ns > 999999999u ? 999999999u : ns;
    return enqueue(r, stream, w);
}

static void host_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
                      const char *message, void *cookie)
{
    host_work_t *w = work_new(W_DONE);
    if (!w && r->reserve) {
        w = r->reserve;
        r->reserve = w->next;
        struct ovld_rank *owner = w->reserve_of;
        memset(w, 0, sizeof(*w));
        w->kind = W_DONE;
        w->reserve_of = owner;
        if (status == OVL_OK) {
            status = OVL_ERR_NOMEM;
            message = "host backend: out of memory";
        }
    }
    host_stream_t *s = NULL;
    if (w && stream_get(r, stream, &s) == OVL_OK) {
        w->u.seq = seq;
        w->node.cookie = cookie;
        w->node.seq = seq;
        w->node.status = status;
        w->node.release = release_work_node;
        snprintf(w->node.message, sizeof(w->node.message), "%s", message ? message : "");
        stream_push(s, w);
        return;
    }
    if (w && w->reserve_of) {
        w->next = r->reserve;
        r->reserve = w;
    } else {
        free(w);
    }
    /* Out of memory and of reserve items: ring from here rather than leave
     * the client waiting; stream order is lost only on this path. */
    db_ring(r, seq, OVL_ERR_NOMEM);
    r->hb->cq.cb(r->hb->cq.arg, cookie, seq, OVL_ERR_NOMEM, "host backend: out of memory");
}

static const ovld_backend_ops_t host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .device_count = host_device_count,
    .device_info = host_device_info,
    .device_usage = host_device_usage,
    .import_blocking = false,
    .mem_import = host_mem_import,
    .mem_release = host_mem_release,
    .rank_create = host_rank_create,
    .rank_destroy = host_rank_destroy,
    .rank_release = host_rank_release,
    .rank_scratch = host_rank_scratch,
    .issue_parallel = true,
    .reserve_events = host_reserve_events,
    .wait_ready = host_wait_ready,
    .record = host_record,
    .wait = host_wait,
    .allgather = host_allgather,
    .copy = host_copy,
    .gemm = host_gemm,
    .sleep = host_sleep,
    .done = host_done,
};

ovl_status_t ovld_backend_host_create(uv_loop_t *loop, const ovld_config_t *cfg,
                                      ovld_done_cb done_cb, void *done_arg, ovld_backend_t **ret,
                                      char *err, size_t errlen)
{
    host_backend_t *hb = calloc(1, sizeof(*hb));
    if (!hb) {
        snprintf(err, errlen, "host backend: out of memory");
        return OVL_ERR_NOMEM;
    }
    hb->base.ops = &host_ops;
    hb->ndevices = cfg->host_devices;
    struct sysinfo si;
    hb->device_memory = sysinfo(&si) == 0 ? (uint64_t)si.totalram * si.mem_unit : 0;
    if (pthread_mutex_init(&hb->mu, NULL) != 0 || pthread_cond_init(&hb->cv, NULL) != 0) {
        snprintf(err, errlen, "host backend: cannot create locks");
        free(hb);
        return OVL_ERR_SYSTEM;
    }
    int rc = ovld_cq_init(&hb->cq, loop, done_cb, done_arg);
    if (rc != 0) {
        snprintf(err, errlen, "host backend: completion queue: %s", uv_strerror(rc));
        free(hb);
        return OVL_ERR_SYSTEM;
    }
    *ret = &hb->base;
    return OVL_OK;
}

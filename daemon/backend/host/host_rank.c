/*
 * host_rank.c: the ranks of the host backend: streams (a worker thread each
 * with a FIFO of work, and what runs a work item), events (a pair of
 * counters: records enqueued, records completed), scratch, and the doorbell
 * (a page of a memfd that the client maps too); the primitives that go on a
 * rank's own streams: wait_ready, record, wait, gemm, sleep, done.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "host_internal.h"
#include "hostgemm.h"

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

void host_rank_fail(struct ovld_rank *r, ovl_status_t st, const char *fmt, ...)
{
    pthread_mutex_lock(&r->err_mu);
    if (r->op_error == OVL_OK) {
        r->op_error = st;
        int n = snprintf(r->op_msg, sizeof(r->op_msg), "host backend: ");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->op_msg + n, sizeof(r->op_msg) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&r->err_mu);
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
    case W_RUN:
        w->run(r, w);
        break;
    case W_GEMM:
        st = ovl_host_gemm_args(&w->u.gemm);
        if (st != OVL_OK)
            host_rank_fail(r, st, "gemm: %s", ovl_strerror(st));
        break;
    case W_SLEEP: {
        struct timespec ts = {0, (long)w->u.sleep_ns};
        nanosleep(&ts, NULL);
        break;
    }
    case W_TIME:
        atomic_store(&r->time_t0, ovl_mono_ns());
        atomic_store(&r->time_seq, w->u.seq);
        break;
    case W_DONE: {
        if (w->u.seq != 0 && atomic_load(&r->time_seq) == w->u.seq) {
            uint64_t t1 = ovl_mono_ns(), t0 = atomic_load(&r->time_t0);
            w->node.ns = t1 > t0 ? t1 - t0 : 1;
            atomic_store(&r->time_seq, 0);
        }
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

/* Makes room for streams [0, n) of r. The array grows on the rank's
 * issuing thread only; under hb->mu, which device_usage holds to read it. */
static ovl_status_t streams_grow(struct ovld_rank *r, uint32_t n)
{
    if (n <= r->nstreams)
        return OVL_OK;
    host_stream_t **ns = calloc(n, sizeof(*ns));
    if (!ns)
        return host_fail(OVL_ERR_NOMEM, "streams: out of memory");
    for (uint32_t i = r->nstreams; i < n; i++) {
        ns[i] = calloc(1, sizeof(*ns[i]));
        if (!ns[i]) {
            for (uint32_t j = r->nstreams; j < i; j++)
                free(ns[j]);
            free(ns);
            return host_fail(OVL_ERR_NOMEM, "streams: out of memory");
        }
    }
    pthread_mutex_lock(&r->hb->mu);
    if (r->nstreams)
        memcpy(ns, r->streams, r->nstreams * sizeof(*ns));
    host_stream_t **old = r->streams;
    r->streams = ns;
    r->nstreams = n;
    pthread_mutex_unlock(&r->hb->mu);
    free(old);
    return OVL_OK;
}

ovl_status_t host_stream_get(struct ovld_rank *r, uint32_t stream, host_stream_t **ret)
{
    if (stream == UINT32_MAX)
        return host_fail(OVL_ERR_INVALID, "stream %u: out of range", stream);
    ovl_status_t st = streams_grow(r, stream + 1);
    if (st != OVL_OK)
        return st;
    host_stream_t *s = r->streams[stream];
    if (!s->started) {
        s->rank = r;
        s->head = s->tail = NULL;
        if (pthread_mutex_init(&s->mu, NULL) != 0)
            return host_fail(OVL_ERR_SYSTEM, "stream %u: cannot make its lock", stream);
        if (pthread_cond_init(&s->cv, NULL) != 0) {
            pthread_mutex_destroy(&s->mu);
            return host_fail(OVL_ERR_SYSTEM, "stream %u: cannot make its condition", stream);
        }
        if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
            pthread_cond_destroy(&s->cv);
            pthread_mutex_destroy(&s->mu);
            return host_fail(OVL_ERR_SYSTEM, "stream %u: cannot start its thread", stream);
        }
        s->started = true;
    }
    *ret = s;
    return OVL_OK;
}

ovl_status_t host_set_streams(ovld_rank_t *r, const ovl_stream_role_t *roles, uint32_t n)
{
    /* Threads have no priorities: the roles only have to be roles. */
    for (uint32_t i = 0; i < n; i++) {
        if ((unsigned)roles[i] >= OVL_ROLE_COUNT)
            return host_fail(OVL_ERR_INVALID, "stream %u: unknown role %d", i, (int)roles[i]);
        host_stream_t *s = NULL;
        ovl_status_t st = host_stream_get(r, i, &s);
        if (st != OVL_OK)
            return st;
    }
    return OVL_OK;
}

void host_stream_push(host_stream_t *s, host_work_t *w)
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

ovl_status_t host_enqueue(struct ovld_rank *r, uint32_t stream, host_work_t *w)
{
    host_stream_t *s = NULL;
    ovl_status_t st = host_stream_get(r, stream, &s);
    if (st != OVL_OK) {
        free(w);
        return st;
    }
    host_stream_push(s, w);
    return OVL_OK;
}

host_work_t *host_work_new(work_kind_t kind)
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
        return host_fail(OVL_ERR_LIMIT, "event %u: over the %u a rank has", event,
                         EV_BLOCK * EV_MAX_BLOCKS);
    if (!r->ev_blocks[blk]) {
        r->ev_blocks[blk] = calloc(EV_BLOCK, sizeof(host_event_t));
        if (!r->ev_blocks[blk])
            return host_fail(OVL_ERR_NOMEM, "events: out of memory");
    }
    *ret = &r->ev_blocks[blk][event % EV_BLOCK];
    return OVL_OK;
}

/* ------------------------------------------------------------ the ops */

ovl_status_t host_rank_create(ovld_backend_t *b, uint32_t device, ovld_rank_t **ret_rank,
                              ovld_doorbell_export_t *ret_db, char *err, size_t errlen)
{
    host_backend_t *hb = (host_backend_t *)b;
    if (device >= hb->ndevices) {
        snprintf(err, errlen, "no such device (the host backend has %u)", hb->ndevices);
        return OVL_ERR_NOT_FOUND;
    }
    struct ovld_rank *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    r->hb = hb;
    r->device = device;
    r->db_fd = -1;
    ovl_status_t st = OVL_ERR_SYSTEM;
    int e = 0;
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_condattr_init: %s", strerror(rc));
        goto fail_free;
    }
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&r->idle_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_cond_init: %s", strerror(rc));
        goto fail_free;
    }
    if ((rc = pthread_mutex_init(&r->err_mu, NULL)) != 0) {
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(rc));
        pthread_cond_destroy(&r->idle_cv);
        goto fail_free;
    }
    if (ovl_doorbell_create(&r->db, &r->db_fd) != OVL_OK) {
        e = errno;
        snprintf(err, errlen, "the doorbell (memfd_create, ftruncate, mmap): %s", strerror(e));
        goto fail;
    }
    memset(ret_db, 0, sizeof(*ret_db));
    ret_db->fd = fcntl(r->db_fd, F_DUPFD_CLOEXEC, 0);
    if (ret_db->fd < 0) {
        e = errno;
        snprintf(err, errlen, "dup of the doorbell: %s", strerror(e));
        goto fail;
    }
    ret_db->offset = 0;
    /* Stream 0 rings done: its thread exists from the start, and a few done
     * items wait in reserve, so that ringing never needs resources. */
    host_stream_t *s0 = NULL;
    for (int i = 0; i < DONE_RESERVE; i++) {
        host_work_t *w = host_work_new(W_DONE);
        if (!w)
            break;
        w->reserve_of = r;
        w->next = r->reserve;
        r->reserve = w;
    }
    if (!r->reserve || host_stream_get(r, 0, &s0) != OVL_OK) {
        snprintf(err, errlen, "%s", !r->reserve ? "out of memory" : "cannot start stream 0");
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
    errno = e; /* the caller may say more of a system call's errno (ENOMEM: memory maps) */
    return st;
}

void host_rank_destroy(ovld_backend_t *b, ovld_rank_t *r)
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
    for (uint32_t i = 0; i < r->nstreams; i++) {
        host_stream_t *s = r->streams[i];
        if (!s->started) {
            free(s);
            continue;
        }
        host_work_t *w = host_work_new(W_STOP);
        if (w) {
            host_stream_push(s, w);
            pthread_join(s->thread, NULL);
        } else {
            /* Cannot queue a stop: leave the idle thread behind rather than
             * free what it uses. */
            pthread_detach(s->thread);
            continue;
        }
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
    free(r->streams);
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

void host_rank_release(ovld_backend_t *b, ovld_rank_t *r, uint64_t seq_hi)
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

ovl_status_t host_rank_scratch(ovld_backend_t *b, ovld_rank_t *r, uint64_t bytes, void **ret_ptr,
                               char *err, size_t errlen)
{
    (void)b;
    if (bytes > SIZE_MAX) {
        snprintf(err, errlen, "more than this machine can address");
        return OVL_ERR_LIMIT;
    }
    if (bytes > r->scratch_bytes) {
        if (r->scratch && !rank_wait_idle(r)) {
            snprintf(err, errlen, "cannot grow while the rank's streams still run (after 2 s)");
            return OVL_ERR_INTERNAL;
        }
        void *p = malloc((size_t)bytes);
        if (!p) {
            snprintf(err, errlen, "malloc: out of memory");
            return OVL_ERR_NOMEM;
        }
        free(r->scratch);
        r->scratch = p;
        r->scratch_bytes = (size_t)bytes;
    }
    *ret_ptr = r->scratch;
    return OVL_OK;
}

ovl_status_t host_reserve_events(ovld_rank_t *r, uint32_t n)
{
    host_event_t *ev = NULL;
    for (uint32_t e = 0; e < n; e += EV_BLOCK) {
        ovl_status_t st = event_get(r, e, &ev);
        if (st != OVL_OK)
            return st;
    }
    return n ? event_get(r, n - 1, &ev) : OVL_OK;
}

ovl_status_t host_wait_ready(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    host_work_t *w = host_work_new(W_WAIT_READY);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "wait_ready: out of memory");
    w->u.seq = seq;
    return host_enqueue(r, stream, w);
}

ovl_status_t host_time_start(ovld_rank_t *r, uint32_t stream, uint64_t seq)
{
    host_work_t *w = host_work_new(W_TIME);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "time_start: out of memory");
    w->u.seq = seq;
    return host_enqueue(r, stream, w);
}

ovl_status_t host_record(ovld_rank_t *r, uint32_t stream, uint32_t event)
{
    host_event_t *ev = NULL;
    ovl_status_t st = event_get(r, event, &ev);
    if (st != OVL_OK)
        return st;
    host_work_t *w = host_work_new(W_RECORD);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "record: out of memory");
    w->u.event.ev = ev;
    w->u.event.target = ++ev->enqueued;
    return host_enqueue(r, stream, w);
}

ovl_status_t host_wait(ovld_rank_t *r, uint32_t stream, ovld_rank_t *owner, uint32_t event)
{
    host_event_t *ev = NULL;
    ovl_status_t st = event_get(owner, event, &ev);
    if (st != OVL_OK)
        return st;
    /* As cudaStreamWaitEvent: wait for the latest record issued so far; an
     * event never recorded is complete. */
    if (ev->enqueued == 0)
        return OVL_OK;
    host_work_t *w = host_work_new(W_WAIT);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "wait: out of memory");
    w->u.event.ev = ev;
    w->u.event.target = ev->enqueued;
    return host_enqueue(r, stream, w);
}

ovl_status_t host_gemm(ovld_rank_t *r, uint32_t stream, const ovld_gemm_args_t *args)
{
    host_work_t *w = host_work_new(W_GEMM);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "gemm: out of memory");
    w->u.gemm = *args;
    return host_enqueue(r, stream, w);
}

ovl_status_t host_sleep(ovld_rank_t *r, uint32_t stream, uint32_t ns)
{
    host_work_t *w = host_work_new(W_SLEEP);
    if (!w)
        return host_fail(OVL_ERR_NOMEM, "sleep: out of memory");
    w->u.sleep_ns = ns > 999999999u ? 999999999u : ns;
    return host_enqueue(r, stream, w);
}

void host_done(ovld_rank_t *r, uint32_t stream, uint64_t seq, ovl_status_t status,
               const char *message, void *cookie)
{
    host_work_t *w = host_work_new(W_DONE);
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
    if (w && host_stream_get(r, stream, &s) == OVL_OK) {
        w->u.seq = seq;
        w->node.cookie = cookie;
        w->node.seq = seq;
        w->node.status = status;
        w->node.release = release_work_node;
        snprintf(w->node.message, sizeof(w->node.message), "%s", message ? message : "");
        host_stream_push(s, w);
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
    if (!ovld_cq_push_nomem(&r->hb->cq, cookie, seq))
        ovld_report(&r->hb->base.report, OVLD_REPORT_ERROR,
                    "host backend: out of memory for op %" PRIu64
                    "'s completion, and no slot left: its job never ends",
                    seq);
}

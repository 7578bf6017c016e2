/*
 * issuer.c: see issuer.h.
 *
 * One mutex guards the queue of lanes with work, the devices held by items
 * being issued, how many lanes each device has, and the list of items
 * done. A thread takes the first lane whose devices are all free and whose
 * head item's gate is open (issuer.h), runs that item, gives the devices
 * back, and wakes the others (a lane it held back may run now) and the
 * loop. Where only gates hold items back, one thread polls them. The
 * hold timer (issuer.h, "Holds") runs on the loop thread, under the same
 * mutex.
 */
#include "issuer.h"
#include "clock.h"
#include "threads.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ISSUER_MAX_THREADS 64
#define ISSUE_SLOW_NS      (1000ull * 1000 * 1000) /* an item this slow is reported */
#define GATE_SPIN_STEP_NS  1000ull                 /* a spinning poll's pause */
#define GATE_SLOW_NS       (100ull * 1000)         /* a poll's sleep after that */
#define ISSUER_DEVS        64                      /* devices told apart (by index mod 64) */

struct ovld_lane {
    ovld_issuer_t *is;
    uint64_t devs;              /* devices its items use (bit d % 64) */
    ovld_issue_t *head, *tail;  /* waiting, in order (under mu) */
    bool queued;                /* on the issuer's list of lanes with work */
    bool running;               /* an item of it is on a thread */
    uint32_t outstanding;       /* items submitted, not called back (loop thread) */
    struct ovld_lane *next;     /* on the issuer's list */
    void *owner;                /* for on_hold */
    struct ovld_lane *all_next; /* every lane (under mu) */
    /* The last op issued ahead of its doorbells whose ready was not seen
     * since (0: none), its local ranks, and when its device was first seen
     * shared while it waited (0: not yet). Under mu. */
    uint64_t ahead_seq;
    ovld_rank_t **ahead_ranks;
    uint32_t ahead_n, ahead_cap;
    uint64_t hold_since;
    bool hold_reported;
};

struct ovld_issuer {
    uv_loop_t *loop;
    uv_async_t async;
    ovld_backend_t *b;
    ovld_exec_pool_t *pool;
    uint32_t stall_ms;
    ovld_reporter_t report;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ovld_lane_t *lanes, *lanes_tail; /* with items waiting, oldest first */
    uint64_t busy_devs;              /* devices held by items on threads */
    uint32_t dev_lanes[ISSUER_DEVS]; /* lanes on each device (bit) */
    uint32_t gated;                  /* lanes whose head waits for its gate (last full look) */
    bool polling;                    /* a thread polls the gates */
    uint64_t gate_opened_ns;         /* when a gate last opened, or gating began */
    uint64_t gate_spin_ns;           /* spin on gates while one opened this recently (mu) */
    ovld_issue_t *done_head, *done_tail;
    uint32_t waiting, running; /* items (under mu) */
    bool stopping;
    pthread_t *threads;
    uint32_t nthreads;
    uint32_t nlanes;       /* not freed yet (loop thread) */
    uint32_t handles;      /* its handles not closed yet (loop thread) */
    bool closed;           /* its handles closed: the last lane freed frees it (loop thread) */
    ovld_lane_t *all;      /* every lane (under mu) */
    uv_timer_t hold_timer; /* loop thread */
    bool hold_timer_on;
    uint32_t hold_ms;
    ovld_hold_cb on_hold;
    void *hold_arg;
    ovld_owner_busy_fn owner_busy;
};

static uint64_t dev_bit(uint32_t device)
{
    return 1ull << (device % 64);
}

/* ------------------------------------------------------------ running */

static void stall(uint32_t ms);

/* Runs the item; stall_ms: the test fault's wait first (counted as issuing). */
static void issue_run(ovld_backend_t *b, ovld_exec_pool_t *pool, ovld_issue_t *it,
                      uint32_t stall_ms)
{
    uint64_t t0 = ovl_mono_ns();
    if (stall_ms)
        stall(stall_ms);
    it->err[0] = '\0';
    if (it->fail) {
        ovld_exec_fail(b, it->rings, it->nrings, it->seq, it->status, it->message);
        it->st = OVL_OK;
    } else {
        it->st = ovld_exec_run(pool, b, &it->op, &it->how, it->err, sizeof(it->err));
    }
    it->issue_ns = ovl_mono_ns() - t0;
}

/* Whether another lane on one of the lane's devices has work: items
 * queued or running, or ops in flight (owner_busy). Under mu, on the loop
 * thread (owner_busy's). */
static bool lane_contended(const ovld_issuer_t *is, const ovld_lane_t *l)
{
    for (const ovld_lane_t *m = is->all; m; m = m->all_next)
        if (m != l && (m->devs & l->devs) &&
            (m->head || m->running || !is->owner_busy || is->owner_busy(m->owner)))
            return true;
    return false;
}

/* Whether another lane has ranks on one of the lane's devices. Under mu. */
static bool lane_shared(const ovld_issuer_t *is, const ovld_lane_t *l)
{
    for (uint64_t m = l->devs; m; m &= m - 1)
        if (is->dev_lanes[__builtin_ctzll(m)] > 1)
            return true;
    return false;
}

/* The op goes ahead of its doorbells: the hold timer watches it from when
 * its device is shared. False without memory to. Under mu. */
static bool note_ahead(ovld_lane_t *l, const ovld_exec_op_t *op)
{
    if (l->ahead_cap < op->world) {
        ovld_rank_t **p = realloc(l->ahead_ranks, op->world * sizeof(*p));
        if (!p)
            return false;
        l->ahead_ranks = p;
        l->ahead_cap = op->world;
    }
    l->ahead_n = 0;
    for (uint32_t r = 0; r < op->world; r++)
        if (op->ranks[r].plan)
            l->ahead_ranks[l->ahead_n++] = op->ranks[r].rank;
    l->ahead_seq = op->seq;
    l->hold_since = 0;
    l->hold_reported = false;
    return true;
}

/* The first lane with work whose devices are all free and whose head item
 * may be issued (its gate, issuer.h), taken off the list with that item.
 * Where there is none, is->gated says how many lanes wait only for their
 * gates. Under mu. */
static ovld_issue_t *take(ovld_issuer_t *is)
{
    ovld_lane_t *prev = NULL;
    uint32_t gated = 0;
    for (ovld_lane_t *l = is->lanes; l; prev = l, l = l->next) {
        if (l->devs & is->busy_devs)
            continue;
        if (is->stopping) {
            /* no gates: the connections' close releases their waits */
        } else if (!l->head->fail && lane_shared(is, l)) {
            if (!ovld_exec_ready(is->b, &l->head->op)) {
                gated++;
                continue;
            }
            is->gate_opened_ns = ovl_mono_ns();
        } else if (!l->head->fail && !ovld_exec_ready(is->b, &l->head->op) &&
                   !note_ahead(l, &l->head->op)) {
            gated++; /* out of memory to watch it: it waits for its gate */
            continue;
        }
        if (prev)
            prev->next = l->next;
        else
            is->lanes = l->next;
        if (is->lanes_tail == l)
            is->lanes_tail = prev;
        l->next = NULL;
        l->queued = false;
        l->running = true;
        ovld_issue_t *it = l->head;
        it->devs = l->devs; /* a rank may join elsewhere while it runs */
        is->busy_devs |= it->devs;
        l->head = it->next;
        if (!l->head)
            l->tail = NULL;
        it->next = NULL;
        is->waiting--;
        is->running++;
        return it;
    }
    if (gated && !is->gated)
        is->gate_opened_ns = ovl_mono_ns(); /* gating begins */
    is->gated = gated;
    return NULL;
}

/* A lane with items and none running goes to the back of the list. Under mu. */
static void requeue(ovld_issuer_t *is, ovld_lane_t *l)
{
    if (l->queued || l->running || !l->head)
        return;
    l->queued = true;
    l->next = NULL;
    if (is->lanes_tail)
        is->lanes_tail->next = l;
    else
        is->lanes = l;
    is->lanes_tail = l;
}

/* A pause of the CPU in a spin. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* The wait between two polls of the gates: a spin of GATE_SPIN_STEP_NS, or
 * a sleep of GATE_SLOW_NS. */
static void gate_pause(bool spin)
{
    if (spin) {
        uint64_t until = ovl_mono_ns() + GATE_SPIN_STEP_NS;
        while (ovl_mono_ns() < until)
            cpu_relax();
        return;
    }
    struct timespec ts = {0, (long)GATE_SLOW_NS};
    nanosleep(&ts, NULL);
}

static void stall(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void *issuer_main(void *arg)
{
    ovld_issuer_t *is = arg;
    pthread_mutex_lock(&is->mu);
    for (;;) {
        ovld_issue_t *it = take(is);
        if (!it) {
            if (is->stopping && is->waiting == 0)
                break;
            if (is->gated && !is->polling) {
                /* this thread polls the gates; the others sleep */
                is->polling = true;
                bool spin = ovl_mono_ns() - is->gate_opened_ns < is->gate_spin_ns;
                pthread_mutex_unlock(&is->mu);
                gate_pause(spin);
                pthread_mutex_lock(&is->mu);
                is->polling = false;
                continue;
            }
            pthread_cond_wait(&is->cv, &is->mu);
            continue;
        }
        if (is->lanes)
            pthread_cond_signal(&is->cv); /* another lane may run beside it */
        pthread_mutex_unlock(&is->mu);
        issue_run(is->b, is->pool, it, is->stall_ms);
        if (it->issue_ns >= ISSUE_SLOW_NS)
            ovld_report(&is->report, OVLD_REPORT_WARN,
                        "op %llu took %llu ms to issue (%s): a device whose queue was full, or "
                        "an NCCL launch waiting for a stalled GPU or another node",
                        (unsigned long long)(it->fail ? it->seq : it->op.seq),
                        (unsigned long long)(it->issue_ns / 1000000),
                        it->fail ? "ringing its failure" : "its plans");
        pthread_mutex_lock(&is->mu);
        ovld_lane_t *l = it->lane;
        is->busy_devs &= ~it->devs;
        l->running = false;
        is->running--;
        requeue(is, l);
        if (is->done_tail)
            is->done_tail->next = it;
        else
            is->done_head = it;
        is->done_tail = it;
        pthread_cond_broadcast(&is->cv); /* devices came free */
        uv_async_send(&is->async);
    }
    pthread_mutex_unlock(&is->mu);
    return NULL;
}

/* ------------------------------------------------------------ delivery */

void ovld_issuer_deliver(ovld_issuer_t *is)
{
    if (!is)
        return;
    for (;;) {
        pthread_mutex_lock(&is->mu);
        ovld_issue_t *it = is->done_head;
        is->done_head = is->done_tail = NULL;
        pthread_mutex_unlock(&is->mu);
        if (!it)
            return;
        while (it) {
            ovld_issue_t *next = it->next;
            it->lane->outstanding--;
            it->cb(it); /* may free the item, and its lane */
            it = next;
        }
    }
}

static void on_async(uv_async_t *h)
{
    ovld_issuer_deliver(h->data);
}

uint32_t ovld_issuer_busy(ovld_issuer_t *is)
{
    if (!is)
        return 0;
    pthread_mutex_lock(&is->mu);
    uint32_t n = is->waiting + is->running;
    pthread_mutex_unlock(&is->mu);
    return n;
}

/* --------------------------------------------------------------- holds */

#define HOLD_REPORTS_MAX 16 /* reports of one tick; more wait for the next */

static uint64_t hold_period_ms(uint32_t hold_ms)
{
    uint64_t p = hold_ms / 8;
    return p < 10 ? 10 : p > 1000 ? 1000 : p;
}

static void on_hold_timer(uv_timer_t *t)
{
    ovld_issuer_t *is = t->data;
    struct {
        void *owner;
        uint64_t seq, held_ms;
    } rep[HOLD_REPORTS_MAX];
    uint32_t n = 0;
    bool watching = false;
    pthread_mutex_lock(&is->mu);
    uint64_t now = ovl_mono_ns();
    for (ovld_lane_t *l = is->all; l; l = l->all_next) {
        if (!l->ahead_seq)
            continue;
        bool ready = true;
        for (uint32_t i = 0; i < l->ahead_n && ready; i++)
            ready = is->b->ops->ready_seen(l->ahead_ranks[i], l->ahead_seq);
        if (ready) {
            l->ahead_seq = 0;
            continue;
        }
        if (!lane_shared(is, l)) {
            l->hold_since = 0; /* holds up nobody; sharing restarts the timer */
            continue;
        }
        if (l->hold_reported)
            continue;
        watching = true;
        if (!lane_contended(is, l)) {
            l->hold_since = 0; /* the other lanes have nothing to be held up */
        } else if (!l->hold_since) {
            l->hold_since = now;
        } else if (is->hold_ms && now - l->hold_since >= (uint64_t)is->hold_ms * 1000000 &&
                   n < HOLD_REPORTS_MAX) {
            l->hold_reported = true;
            rep[n].owner = l->owner;
            rep[n].seq = l->ahead_seq;
            rep[n].held_ms = (now - l->hold_since) / 1000000;
            n++;
        }
    }
    pthread_mutex_unlock(&is->mu);
    if (!watching || !is->hold_ms) {
        uv_timer_stop(&is->hold_timer);
        is->hold_timer_on = false;
    }
    for (uint32_t i = 0; i < n; i++)
        is->on_hold(is->hold_arg, rep[i].owner, rep[i].seq, rep[i].held_ms);
}

/* Watches the holds, if there may be any to watch (loop thread). */
static void hold_watch(ovld_issuer_t *is)
{
    if (is->hold_timer_on || !is->hold_ms || !is->on_hold || is->closed || !is->b->ops->ready_seen)
        return;
    uint64_t p = hold_period_ms(is->hold_ms);
    if (uv_timer_start(&is->hold_timer, on_hold_timer, p, p) == 0)
        is->hold_timer_on = true;
}

void ovld_issuer_set_gate_spin(ovld_issuer_t *is, uint32_t gate_spin_ms)
{
    if (!is)
        return;
    pthread_mutex_lock(&is->mu);
    is->gate_spin_ns = (uint64_t)gate_spin_ms * 1000000;
    pthread_mutex_unlock(&is->mu);
}

void ovld_issuer_set_hold(ovld_issuer_t *is, uint32_t hold_ms)
{
    if (!is)
        return;
    is->hold_ms = hold_ms;
    if (is->hold_timer_on) {
        uv_timer_stop(&is->hold_timer);
        is->hold_timer_on = false;
    }
    hold_watch(is);
}

/* ---------------------------------------------------------------- life */

static void issuer_free(ovld_issuer_t *is)
{
    free(is->threads);
    pthread_cond_destroy(&is->cv);
    pthread_mutex_destroy(&is->mu);
    free(is);
}

static void stop_threads(ovld_issuer_t *is)
{
    pthread_mutex_lock(&is->mu);
    is->stopping = true;
    pthread_cond_broadcast(&is->cv);
    pthread_mutex_unlock(&is->mu);
    for (uint32_t i = 0; i < is->nthreads; i++)
        pthread_join(is->threads[i], NULL);
    is->nthreads = 0;
}

ovl_status_t ovld_issuer_create(uv_loop_t *loop, ovld_backend_t *b, const ovld_issuer_cfg_t *cfg,
                                const ovld_reporter_t *report, ovld_issuer_t **ret, char *err,
                                size_t errlen)
{
    uint32_t n = cfg->nthreads ? cfg->nthreads : 1;
    if (n > ISSUER_MAX_THREADS)
        n = ISSUER_MAX_THREADS;
    ovld_issuer_t *is = calloc(1, sizeof(*is));
    if (!is || !(is->threads = calloc(n, sizeof(*is->threads)))) {
        free(is);
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    is->loop = loop;
    is->b = b;
    is->pool = cfg->pool;
    is->stall_ms = cfg->stall_ms;
    if (report)
        is->report = *report;
    int e;
    if ((e = pthread_mutex_init(&is->mu, NULL)) != 0) {
        free(is->threads);
        free(is);
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(e));
        return OVL_ERR_SYSTEM;
    }
    if ((e = pthread_cond_init(&is->cv, NULL)) != 0) {
        pthread_mutex_destroy(&is->mu);
        free(is->threads);
        free(is);
        snprintf(err, errlen, "pthread_cond_init: %s", strerror(e));
        return OVL_ERR_SYSTEM;
    }
    if ((e = uv_async_init(loop, &is->async, on_async)) != 0) {
        issuer_free(is);
        snprintf(err, errlen, "uv_async_init: %s", uv_strerror(e));
        return OVL_ERR_SYSTEM;
    }
    is->async.data = is;
    is->handles = 1;
    if ((e = uv_timer_init(loop, &is->hold_timer)) != 0) {
        uv_close((uv_handle_t *)&is->async, NULL);
        /* the handle's memory must outlive the close: kept until exit */
        snprintf(err, errlen, "uv_timer_init: %s", uv_strerror(e));
        return OVL_ERR_SYSTEM;
    }
    is->hold_timer.data = is;
    is->handles = 2;
    is->hold_ms = cfg->hold_ms;
    is->gate_spin_ns = (uint64_t)cfg->gate_spin_ms * 1000000;
    is->on_hold = cfg->on_hold;
    is->hold_arg = cfg->hold_arg;
    is->owner_busy = cfg->owner_busy;
    for (uint32_t i = 0; i < n; i++) {
        if ((e = ovl_thread_start(&is->threads[i], issuer_main, is)) != 0) {
            stop_threads(is);
            snprintf(err, errlen, "cannot start issuing thread %u of %u: %s", i + 1, n,
                     strerror(e));
            uv_close((uv_handle_t *)&is->async, NULL);
            uv_close((uv_handle_t *)&is->hold_timer, NULL);
            /* the handle's memory must outlive the close: kept until exit */
            return OVL_ERR_SYSTEM;
        }
        is->nthreads++;
    }
    *ret = is;
    return OVL_OK;
}

static void on_closed(uv_handle_t *h)
{
    ovld_issuer_t *is = h->data;
    if (--is->handles > 0)
        return;
    if (is->nlanes == 0)
        issuer_free(is);
    else
        is->closed = true; /* a job still holds a lane: freed with the last */
}

void ovld_issuer_close(ovld_issuer_t *is)
{
    if (!is)
        return;
    stop_threads(is);
    ovld_issuer_deliver(is);
    uv_timer_stop(&is->hold_timer);
    is->hold_timer_on = false;
    is->hold_ms = 0; /* no timer again */
    uv_close((uv_handle_t *)&is->async, on_closed);
    uv_close((uv_handle_t *)&is->hold_timer, on_closed);
}

/* --------------------------------------------------------------- lanes */

ovl_status_t ovld_lane_new(ovld_issuer_t *is, void *owner, ovld_lane_t **ret)
{
    *ret = NULL;
    if (!is)
        return OVL_OK;
    ovld_lane_t *l = calloc(1, sizeof(*l));
    if (!l)
        return OVL_ERR_NOMEM;
    l->is = is;
    l->owner = owner;
    is->nlanes++;
    pthread_mutex_lock(&is->mu);
    l->all_next = is->all;
    is->all = l;
    pthread_mutex_unlock(&is->mu);
    *ret = l;
    return OVL_OK;
}

void ovld_lane_add_device(ovld_lane_t *l, uint32_t device)
{
    if (!l)
        return;
    ovld_issuer_t *is = l->is;
    bool shared = false;
    pthread_mutex_lock(&is->mu);
    if (!(l->devs & dev_bit(device))) {
        l->devs |= dev_bit(device);
        shared = ++is->dev_lanes[device % ISSUER_DEVS] > 1;
    }
    pthread_mutex_unlock(&is->mu);
    if (shared)
        hold_watch(is); /* an op issued ahead on it may hold the newcomer up */
}

void ovld_lane_submit(ovld_lane_t *l, ovld_backend_t *b, ovld_exec_pool_t *pool, ovld_issue_t *item)
{
    item->next = NULL;
    item->lane = l;
    if (!l) {
        issue_run(b, pool, item, 0);
        item->cb(item);
        return;
    }
    ovld_issuer_t *is = l->is;
    l->outstanding++;
    pthread_mutex_lock(&is->mu);
    if (l->tail)
        l->tail->next = item;
    else
        l->head = item;
    l->tail = item;
    is->waiting++;
    requeue(is, l);
    pthread_cond_signal(&is->cv);
    pthread_mutex_unlock(&is->mu);
}

bool ovld_lane_busy(const ovld_lane_t *l)
{
    return l && l->outstanding > 0;
}

void ovld_lane_remove_device(ovld_lane_t *l, uint32_t device)
{
    if (!l)
        return;
    ovld_issuer_t *is = l->is;
    pthread_mutex_lock(&is->mu);
    if (l->devs & dev_bit(device)) {
        l->devs &= ~dev_bit(device);
        is->dev_lanes[device % ISSUER_DEVS]--;
        pthread_cond_broadcast(&is->cv); /* the device may be one lane's alone now */
    }
    pthread_mutex_unlock(&is->mu);
}

void ovld_lane_free(ovld_lane_t *l)
{
    if (!l)
        return;
    ovld_issuer_t *is = l->is;
    pthread_mutex_lock(&is->mu);
    for (uint64_t m = l->devs; m; m &= m - 1)
        is->dev_lanes[__builtin_ctzll(m)]--;
    for (ovld_lane_t **pp = &is->all; *pp; pp = &(*pp)->all_next)
        if (*pp == l) {
            *pp = l->all_next;
            break;
        }
    /* a device may be one lane's alone now: its gates no longer hold */
    pthread_cond_broadcast(&is->cv);
    pthread_mutex_unlock(&is->mu);
    free(l->ahead_ranks);
    free(l);
    if (--is->nlanes == 0 && is->closed)
        issuer_free(is);
}

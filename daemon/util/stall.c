/*
 * stall.c: see stall.h.
 */
#include "stall.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "clock.h"

struct ovld_stall {
    uv_timer_t beat;
    pthread_t loop_thread, monitor;
    long loop_tid;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    bool stop;
    unsigned threshold_ms;
    _Atomic uint64_t last_ns; /* the loop's last heartbeat */
};

/* Runs on the thread the signal went to (the stalled loop thread, or any
 * thread an operator sends SIGUSR2 to with tgkill): only async-signal-safe
 * calls, and backtrace is primed in ovld_stall_start so that it does not
 * load libgcc_s here. */
static void on_sigusr2(int sig)
{
    (void)sig;
    int saved = errno;
    char head[96] = "ovld: stack of thread ";
    size_t len = strlen(head);
    char digits[24];
    size_t nd = 0;
    for (unsigned long tid = (unsigned long)syscall(SYS_gettid); nd == 0 || tid; tid /= 10)
        digits[nd++] = (char)('0' + tid % 10);
    while (nd)
        head[len++] = digits[--nd];
    static const char tail[] = " (resolve with: addr2line -f -e ovld OFFSET):\n";
    memcpy(head + len, tail, sizeof(tail) - 1);
    len += sizeof(tail) - 1;
    void *pcs[64];
    int n = backtrace(pcs, 64);
    ssize_t w = write(STDERR_FILENO, head, len);
    (void)w;
    backtrace_symbols_fd(pcs, n, STDERR_FILENO);
    errno = saved;
}

static void on_beat(uv_timer_t *t)
{
    ovld_stall_t *s = t->data;
    atomic_store(&s->last_ns, ovl_mono_ns());
}

static void *monitor_main(void *arg)
{
    ovld_stall_t *s = arg;
    uint64_t period_ns = (uint64_t)s->threshold_ms * 1000000ull / 4;
    uint64_t reported = 0; /* the heartbeat a stall was reported at */
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wake = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + period_ns;
        ts.tv_sec = (time_t)(wake / 1000000000ull);
        ts.tv_nsec = (long)(wake % 1000000000ull);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (s->stop)
            break;
        uint64_t last = atomic_load(&s->last_ns), now = ovl_mono_ns();
        if (reported && last != reported) {
            log_warn("the event loop turned again after a stall of %" PRIu64 " ms",
                     (uint64_t)((last - reported) / 1000000u));
            reported = 0;
        }
        if (!reported && now > last && now - last > (uint64_t)s->threshold_ms * 1000000ull) {
            reported = last;
            log_error("the event loop has not turned for %" PRIu64
                      " ms: clients get no answers; its stack (thread %ld) follows",
                      (uint64_t)((now - last) / 1000000u), s->loop_tid);
            pthread_kill(s->loop_thread, SIGUSR2);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void on_beat_closed(uv_handle_t *h)
{
    free(h->data);
}

int ovld_stall_start(ovld_stall_t **ret, uv_loop_t *loop, unsigned threshold_ms)
{
    *ret = NULL;
    if (threshold_ms < 4)
        return -EINVAL;
    /* The handler first, whatever else fails: SIGUSR2 must never kill ovld
     * (ovld --help offers it to operators). */
    void *prime[2];
    (void)backtrace(prime, 2);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigusr2;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR2, &sa, NULL) != 0)
        return -errno;
    ovld_stall_t *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->loop_thread = pthread_self();
    s->loop_tid = (long)syscall(SYS_gettid);
    s->threshold_ms = threshold_ms;
    atomic_init(&s->last_ns, ovl_mono_ns());
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0) {
        rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (rc == 0)
            rc = pthread_cond_init(&s->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (rc != 0) {
        free(s);
        return -rc;
    }
    if ((rc = pthread_mutex_init(&s->mu, NULL)) != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return -rc;
    }
    if ((rc = uv_timer_init(loop, &s->beat)) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return rc;
    }
    s->beat.data = s;
    uv_unref((uv_handle_t *)&s->beat); /* the heartbeat keeps no loop alive */
    if ((rc = uv_timer_start(&s->beat, on_beat, 0, threshold_ms / 4)) == 0 &&
        (rc = -pthread_create(&s->monitor, NULL, monitor_main, s)) == 0) {
        *ret = s;
        return 0;
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    uv_close((uv_handle_t *)&s->beat, on_beat_closed); /* frees s */
    return rc;
}

void ovld_stall_stop(ovld_stall_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->monitor, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    uv_timer_stop(&s->beat);
    uv_close((uv_handle_t *)&s->beat, on_beat_closed);
}

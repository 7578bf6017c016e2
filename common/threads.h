/*
 * threads.h: starting a helper thread (libovl's watcher, ovld's issuing
 * pool) with the process's asynchronous signals blocked, so that they keep
 * going to the threads that handle them. Faults (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP, SIGABRT) stay open: blocked, they would kill the process
 * without running a handler. SIGUSR2 stays open too: ovld asks threads for
 * their stacks with it (daemon/util/stall.c).
 */
#ifndef OVL_THREADS_H
#define OVL_THREADS_H

#include <pthread.h>
#include <signal.h>

static inline int ovl_thread_start(pthread_t *th, void *(*fn)(void *), void *arg)
{
    static const int async[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGCHLD,
                                SIGPIPE, SIGALRM, SIGUSR1, SIGWINCH};
    sigset_t set, old;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof(async) / sizeof(async[0]); i++)
        sigaddset(&set, async[i]);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    int e = pthread_create(th, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return e;
}

#endif /* OVL_THREADS_H */

/*
 * report.h: how ovld's silent modules (the backends, the executor) say what
 * has no request to answer: a watchdog's stuck op, MPS not running at start,
 * a failed teardown call. A failure that does answer a request is not
 * reported here: its words go back with its status (an err buffer, or the
 * backend's last_error), and the caller that talks to the client logs it
 * once, with the message the client gets. Only the boundary (main.c,
 * server/, core/job.c) logs; a module given a reporter hands it lines, and the
 * daemon decides where they go (main.c: the log).
 */
#ifndef OVLD_REPORT_H
#define OVLD_REPORT_H

/* How much a report matters, most first. */
typedef enum ovld_report_level {
    OVLD_REPORT_ERROR, /* something is broken: an op or a resource is lost */
    OVLD_REPORT_WARN,  /* something is wrong or slow, and ovld goes on */
    OVLD_REPORT_INFO,  /* what an operator wants to know once: devices at start */
    OVLD_REPORT_DEBUG,
    OVLD_REPORT_COUNT,
} ovld_report_level_t;

/*
 * Receives one report: level below OVLD_REPORT_COUNT, msg one line without
 * its newline, valid only during the call. Called from any thread: the loop
 * thread, libuv's workers, a backend's stream or callback threads, an
 * issuing thread, possibly several at once; so it must be thread-safe, must
 * not block for long (a stream thread waits on it), and must not call back
 * into the module that reports.
 */
typedef void (*ovld_report_fn)(void *arg, ovld_report_level_t level, const char *msg);

/* What a module is given to report with. fn NULL: reports are dropped.
 * Both are read-only once the module has them, and arg stays valid for as
 * long as the module may report (a backend: until it is freed, which can be
 * after destroy returns, once its worker threads are done). */
typedef struct ovld_reporter {
    ovld_report_fn fn;
    void *arg;
} ovld_reporter_t;

/* Formats one report (truncated past 1 KiB) and hands it to r's function;
 * nothing if r or its function is NULL. Any thread. */
void ovld_report(const ovld_reporter_t *r, ovld_report_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* OVLD_REPORT_H */

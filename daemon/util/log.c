/*
 * log.c: see log.h. Called from the loop thread and from backend threads, so
 * each line is formatted into one buffer and written with one write(2).
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = OVLD_LOG_INFO;
static _Atomic int log_journal = 0;
static _Atomic int log_syslog = 0;

void ovld_log_init(ovld_log_level_t level)
{
    atomic_store(&log_level, (int)level);
    atomic_store(&log_journal, getenv("JOURNAL_STREAM") != NULL);
}

void ovld_log_set_level(ovld_log_level_t level)
{
    atomic_store(&log_level, (int)level);
}

void ovld_log_to_file(void)
{
    atomic_store(&log_journal, 0);
    atomic_store(&log_syslog, 0);
}

void ovld_log_to_syslog(void)
{
    /* LOG_NDELAY: the socket to syslogd opens now, while nothing runs on
     * other threads; journald reads /dev/log too (journalctl -t ovld). */
    openlog("ovld", LOG_PID | LOG_NDELAY, LOG_DAEMON);
    atomic_store(&log_syslog, 1);
}

ovld_log_level_t ovld_log_get_level(void)
{
    return (ovld_log_level_t)atomic_load(&log_level);
}

void ovld_log(ovld_log_level_t level, const char *fmt, ...)
{
    if ((int)level > atomic_load(&log_level))
        return;
    char line[2048];
    int n;
    if (atomic_load(&log_syslog)) {
        /* the level is a syslog priority already (config.h) */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        syslog((int)level, "%s", line);
        return;
    }
    if (atomic_load(&log_journal)) {
        n = snprintf(line, sizeof(line), "<%d>", (int)level);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ ovld[%d] %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, (int)getpid(), ovld_log_level_name(level));
    }
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    /* A lost log line is not worth failing for. */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void ovld_log_report(void *arg, ovld_report_level_t level, const char *msg)
{
    (void)arg;
    static const ovld_log_level_t to_log[OVLD_REPORT_COUNT] = {
        [OVLD_REPORT_ERROR] = OVLD_LOG_ERROR,
        [OVLD_REPORT_WARN] = OVLD_LOG_WARN,
        [OVLD_REPORT_INFO] = OVLD_LOG_INFO,
        [OVLD_REPORT_DEBUG] = OVLD_LOG_DEBUG,
    };
    /* A level out of range is a bug in the reporter: still worth a line. */
    ovld_log((unsigned)level < OVLD_REPORT_COUNT ? to_log[level] : OVLD_LOG_ERROR, "%s", msg);
}

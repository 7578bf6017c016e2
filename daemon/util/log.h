/*
 * log.h: ovld's log. Lines go to stderr; under systemd (JOURNAL_STREAM set)
 * each carries its sd-daemon(3) priority prefix ("<3>") so that journald
 * files it at the right level, otherwise a timestamp and the level name.
 * A detached ovld logs to a file (--log-file: ovld_log_to_file, with stderr
 * pointed at it) or, without one, to syslog (ovld_log_to_syslog), never to
 * the terminal that started it.
 * Only the daemon's boundary logs (server, main, job); the other modules
 * return status codes and messages instead, and say what answers no request
 * through a reporter (report.h), which main.c points here.
 *
 * Thread-safe: any thread may log at any time (each line is one write(2)).
 */
#ifndef OVLD_LOG_H
#define OVLD_LOG_H

#include "config.h"
#include "report.h"

void ovld_log_init(ovld_log_level_t level);
void ovld_log_set_level(ovld_log_level_t level);
/* Lines go to stderr with a timestamp, even under systemd: the caller has
 * pointed stderr at a log file. */
void ovld_log_to_file(void);
/* Lines go to syslog (ident "ovld", facility daemon, each at its level's
 * priority) instead of stderr. */
void ovld_log_to_syslog(void);
ovld_log_level_t ovld_log_get_level(void);

void ovld_log(ovld_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An ovld_report_fn (report.h): writes msg as one line at the log level
 * of its report level (arg unused). Thread-safe, as ovld_log. */
void ovld_log_report(void *arg, ovld_report_level_t level, const char *msg);

#define log_error(...) ovld_log(OVLD_LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  ovld_log(OVLD_LOG_WARN, __VA_ARGS__)
#define log_info(...)  ovld_log(OVLD_LOG_INFO, __VA_ARGS__)
#define log_debug(...) ovld_log(OVLD_LOG_DEBUG, __VA_ARGS__)

#endif /* OVLD_LOG_H */

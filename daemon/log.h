/*
 * log.h: ovld's log. Lines go to stderr; under systemd (JOURNAL_STREAM set)
 * each carries its sd-daemon(3) priority prefix ("<3>") so that journald
 * files it at the right level, otherwise a timestamp and the level name.
 * Only the daemon's boundary logs (server, main, job); pure modules return
 * status codes and messages instead.
 */
#ifndef OVLD_LOG_H
#define OVLD_LOG_H

#include "config.h"

void ovld_log_init(ovld_log_level_t level);
void ovld_log_set_level(ovld_log_level_t level);
ovld_log_level_t ovld_log_get_level(void);

void ovld_log(ovld_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) ovld_log(OVLD_LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  ovld_log(OVLD_LOG_WARN, __VA_ARGS__)
#define log_info(...)  ovld_log(OVLD_LOG_INFO, __VA_ARGS__)
#define log_debug(...) ovld_log(OVLD_LOG_DEBUG, __VA_ARGS__)

#endif /* OVLD_LOG_H */

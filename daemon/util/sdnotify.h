/*
 * sdnotify.h: the two systemd protocols ovld speaks, in a few lines of its
 * own rather than a libsystemd dependency: sd_notify(3) (a datagram to
 * $NOTIFY_SOCKET) and sd_listen_fds(3) ($LISTEN_PID/$LISTEN_FDS, fds from 3).
 */
#ifndef OVLD_SDNOTIFY_H
#define OVLD_SDNOTIFY_H

#include <stddef.h>
#include <stdint.h>

#include "ovl.h"

/* Sends `state` (e.g. "READY=1\nSTATUS=...") if $NOTIFY_SOCKET is set.
 * Returns 1 if sent, 0 if not under systemd, negative errno on failure. */
int ovld_sd_notify(const char *state);

/* The listening socket passed by systemd, or -1 in *ret_fd when none was.
 * More than one passed socket is an error. Unsets the LISTEN_* variables. */
ovl_status_t ovld_sd_listen_fd(int *ret_fd, char *err, size_t errlen);

/* The watchdog interval asked for by $WATCHDOG_USEC (for this pid), 0 if
 * none. */
uint64_t ovld_sd_watchdog_usec(void);

#endif /* OVLD_SDNOTIFY_H */

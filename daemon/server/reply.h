/*
 * reply.h: answers to a connection (reply.c), above conn.c: each queues a
 * response and tries to send it; false if the connection had to be closed
 * (the client does not read, or went away).
 */
#ifndef OVLD_REPLY_H
#define OVLD_REPLY_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "conn.h"
#include "ovl.pb-c.h"

bool ovld_reply(ovld_conn_t *c, Ovl__Response *resp, const int *fds, unsigned nfds);
bool ovld_reply_error(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool ovld_reply_ok(ovld_conn_t *c, uint64_t id);
/* Logs, sends an Error where it can, and closes the connection. conn.c
 * reaches it through d->conn_calls.fail. */
void ovld_conn_fail(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *what);

#endif /* OVLD_REPLY_H */

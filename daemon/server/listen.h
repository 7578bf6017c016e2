/*
 * listen.h: the listening socket (listen.c), above conn.c and reply.c:
 * each connection accepted goes to ovld_conn_accept (conn.h).
 */
#ifndef OVLD_LISTEN_H
#define OVLD_LISTEN_H

#include <stddef.h>

#include "ovld.h"

/* Binds (or takes systemd's socket) and accepts; stops. */
ovl_status_t ovld_listen_start(ovld_t *d, char *err, size_t errlen);
void ovld_listen_stop(ovld_t *d);

#endif /* OVLD_LISTEN_H */

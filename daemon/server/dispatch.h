/*
 * dispatch.h: a connection's requests (dispatch.c), above info.c and
 * reply.c: each frame decoded, checked and served by its handler.
 */
#ifndef OVLD_DISPATCH_H
#define OVLD_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "conn.h"

/* One complete frame of c, in order: decodes it, checks it (request.h)
 * and serves it, or answers with an Error (a malformed or out-of-order
 * one closes c). False once c is closing. conn.c calls it through
 * d->conn_calls.frame, which ovld_server_start points here. */
bool ovld_dispatch_frame(ovld_conn_t *c, const uint8_t *body, uint32_t len);

#endif /* OVLD_DISPATCH_H */

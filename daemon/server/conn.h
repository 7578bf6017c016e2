/*
 * conn.h: a client's connection, and what conn.c does with it: accepting,
 * reading its frames, watching it, closing it. The bottom of the server's
 * files: reply.c, info.c, dispatch.c, listen.c and server.c call it, it
 * calls none of them by name (what it hands up goes through
 * d->conn_calls, ovld.h). Nothing below the server includes it: jobs and
 * buffers never see a connection.
 */
#ifndef OVLD_CONN_H
#define OVLD_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <uv.h>

#include "ovl.pb-c.h"
#include "ovld.h"
#include "registry.h"
#include "wire.h"

/* A comm the connection joined: a rank of a job (job.h). */
typedef struct ovld_conn_comm {
    ovld_member_t *m;
    uint64_t comm_id;
    struct ovld_conn_comm *next;
} ovld_conn_comm_t;

typedef struct ovld_conn {
    ovld_t *d;
    int fd;
    uv_poll_t poll;
    int poll_events;
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    char name[64];
    bool hello_done;
    uint64_t hello_deadline; /* loop time (ms) by which Hello must have come */
    bool closing;
    bool busy;     /* a request is being served off the loop: later ones wait */
    uint32_t refs; /* work items holding the connection (freed at 0 once closed) */
    bool closed;   /* its handle is closed; memory freed when refs is 0 */
    ovl_wire_reader_t rd;
    ovl_fdq_t fdq;
    ovl_wire_out_t out;
    ovld_registry_t reg;     /* its buffers (buffers.h) */
    ovld_conn_comm_t *comms; /* the comms it joined, newest first */
    struct ovld_conn *prev, *next;
} ovld_conn_t;

/* conn.c */

/* Takes an accepted connection (listen.c): refuses it, with an Error that
 * names the limit, past max_connections or max_connections_per_uid, or
 * while stopping; otherwise starts serving it. */
void ovld_conn_accept(ovld_t *d, int fd, const struct ucred *peer);
void ovld_conn_close(ovld_conn_t *c, const char *why);
/* Watches the connection for what it waits for now (reads unless busy,
 * writes while replies are queued). */
void ovld_conn_update_poll(ovld_conn_t *c);
/* Handles the frames received, in order (each through d->conn_calls.frame),
 * until none is complete, the connection closes or a request goes off the
 * loop (busy): what a request served off the loop calls once it is done
 * and the connection is not busy any more. */
void ovld_conn_process_frames(ovld_conn_t *c);
/* A work item is done with the connection (it took c->refs++). */
void ovld_conn_put(ovld_conn_t *c);
/* c leaves one of its comms (k, then freed). */
void ovld_conn_leave(ovld_conn_t *c, ovld_conn_comm_t *k, const char *why);

/* What one uid holds, over all its connections. */
typedef struct ovld_uid_usage {
    uint32_t conns;
    uint64_t regs;
    uint64_t bytes;
} ovld_uid_usage_t;

/* uid's usage, and the buffers mapped for everyone (*ret_all, unless NULL).
 * A scan of the connections: at most max_connections, and only on a
 * connect or a registration, which are rare next to ops. */
void ovld_conn_uid_usage(const ovld_t *d, uid_t uid, ovld_uid_usage_t *u, uint64_t *ret_all);

/* Answers a connection refused at accept with an Error, and closes fd. */
void ovld_refuse_fd(int fd, ovl_status_t status, const char *msg);

#endif /* OVLD_CONN_H */

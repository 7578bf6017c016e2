/*
 * conn.h: a client's connection, and what the server's files share about
 * it: server.c (connections, frames, dispatch, the requests that change
 * state), listen.c (the socket, accepting), reply.c (answers), info.c
 * (what Hello, Status and Stats report). Nothing below the server includes
 * it: jobs and buffers never see a connection.
 */
#ifndef OVLD_CONN_H
#define OVLD_CONN_H

#include <stdarg.h>
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

/* server.c */

/* Takes an accepted connection (listen.c): refuses it, with an Error that
 * names the limit, past max_connections or max_connections_per_uid, or
 * while stopping; otherwise starts serving it. */
void ovld_conn_accept(ovld_t *d, int fd, const struct ucred *peer);
void ovld_conn_close(ovld_conn_t *c, const char *why);
/* Watches the connection for what it waits for now (reads unless busy,
 * writes while replies are queued). */
void ovld_conn_update_poll(ovld_conn_t *c);

/* reply.c: each queues a response and tries to send it; false if the
 * connection had to be closed (the client does not read, or went away). */
bool ovld_reply(ovld_conn_t *c, Ovl__Response *resp, const int *fds, unsigned nfds);
bool ovld_reply_error(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool ovld_reply_ok(ovld_conn_t *c, uint64_t id);
/* Logs, sends an Error where it can, and closes the connection. */
void ovld_conn_fail(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *what);
/* Answers a connection refused at accept with an Error, and closes fd. */
void ovld_refuse_fd(int fd, ovl_status_t status, const char *msg);

/* info.c */
void ovld_info_hello(ovld_conn_t *c, uint64_t id);
void ovld_info_status(ovld_conn_t *c, uint64_t id);
void ovld_info_stats(ovld_conn_t *c, uint64_t id, const Ovl__StatsRequest *q);

/* listen.c: binds (or takes systemd's socket) and accepts; stops. */
ovl_status_t ovld_listen_start(ovld_t *d, char *err, size_t errlen);
void ovld_listen_stop(ovld_t *d);

#endif /* OVLD_CONN_H */

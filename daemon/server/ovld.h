/*
 * ovld.h: the daemon's context, the one struct that holds its state (no
 * other globals), and the entry points main.c calls. The connection type
 * is the server's own (conn.h).
 */
#ifndef OVLD_H
#define OVLD_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "backend.h"
#include "buffers.h"
#include "config.h"
#include "job.h"
#include "stats.h"

struct ovld_conn;

/* What a connection hands up (conn.c), through these and never by name:
 * ovld_server_start fills them in before anything is accepted. */
typedef struct ovld_conn_calls {
    /* One complete frame of the connection, in order (dispatch.c); false
     * once the connection is closing. */
    bool (*frame)(struct ovld_conn *c, const uint8_t *body, uint32_t len);
    /* Logs, sends an Error where it can, and closes the connection
     * (reply.c's ovld_conn_fail). */
    void (*fail)(struct ovld_conn *c, uint64_t id, ovl_status_t status, const char *what);
} ovld_conn_calls_t;

typedef struct ovld {
    uv_loop_t *loop;
    ovld_config_t cfg;
    char config_path[PATH_MAX]; /* "" if none */
    /* What the command line set (NULL: not given): it wins over the file,
     * at start and at every reload. */
    const char *arg_socket, *arg_backend, *arg_log_level;
    ovld_backend_t *backend;
    struct ovld_exec_pool *exec_pool; /* threads that issue a ring op's ranks (exec.h) */
    struct ovld_issuer *issuer;       /* threads that issue every op (issuer.h) */
    uint64_t start_ns;

    int listen_fd;
    bool listen_owned; /* we bound it (and unlink it); not systemd's */
    int self_pidfd;    /* ovld's own pidfd, a copy to every client with its HelloReply
                        * (libovl watches it to see ovld gone); -1 if none */
    uv_poll_t listen_poll;
    bool listening;
    bool listen_paused;  /* out of descriptors: accept waits for accept_timer */
    int spare_fd;        /* held open, closed to accept and drop a connection
                          * when ovld is out of descriptors (libuv's idiom) */
    bool fd_starved;     /* in an episode of EMFILE/ENFILE, logged once */
    uint64_t fd_refused; /* connections dropped in this episode */
    uv_timer_t accept_timer;
    uv_timer_t hello_timer; /* armed for the earliest hello_deadline */
    uint32_t max_mappings;  /* cfg.max_mappings with auto resolved */
    /* Every client buffer (buffers.h); the deregistrations they let go in
     * a round are answered by idle_check after its callbacks: a completion
     * never runs a connection's requests itself. */
    ovld_buffers_t buffers;
    uv_check_t idle_check;
    struct ovld_conn *conns;
    ovld_conn_calls_t conn_calls; /* set by ovld_server_start */
    uint32_t nconns;
    uint64_t next_conn_id;
    ovld_counters_t counters;
    uint64_t hits_at_reset, misses_at_reset; /* the backend's cache counts at the last reset */

    ovld_jobs_t jobs;
    /* links to the ovld of other nodes (peer.h); NULL without peer_listen */
    struct ovld_peers *peers;
    struct ovld_xfer *xfer;       /* the host backend's rows between nodes (xfer.h) */
    struct ovld_cluster *cluster; /* jobs across nodes (cluster.h); NULL without peers */
    uint32_t works;               /* requests being served on workers (imports, unmaps) */

    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t drain_timer;
    uv_timer_t sd_watchdog; /* WATCHDOG=1 at half of $WATCHDOG_USEC */
    /* `auto` that measures (core/tune.h; NULL: off), its file in the state
     * directory (main.c's tunefile.h) and the timer that writes it when
     * choices change */
    struct ovld_tune *tune;
    char tune_path[PATH_MAX]; /* "": kept nowhere */
    char tune_device[192];
    uv_timer_t tune_timer;
    bool tune_writing;        /* a write is on a worker (counted in works) */
    uint64_t tune_retry_at;   /* loop time (ms): after a failed write, not before */
    struct ovld_stall *stall; /* reports a blocked loop with its stack */
    uint64_t drain_deadline;  /* loop time (ms) */
    bool stopping;
    bool stopped;
} ovld_t;

/* server.c: listens (listen.c) and serves connections. */
ovl_status_t ovld_server_start(ovld_t *d, char *err, size_t errlen);
/* Applies what the server derives from d->cfg (at start and after a reload):
 * max_mappings = auto resolved from vm.max_map_count. */
void ovld_server_apply_config(ovld_t *d);
/* listen.c: no new connections (shutdown). */
void ovld_server_stop_listening(ovld_t *d);
/* Closes every connection and what the server keeps past listening (the
 * idle check); at the end of shutdown. */
void ovld_server_close(ovld_t *d);
/* main.c */
void ovld_shutdown(ovld_t *d);

#endif /* OVLD_H */

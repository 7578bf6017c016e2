/*
 * ovld.h: the daemon's context, the one struct that holds its state (no
 * other globals), and the connection type shared by server.c and job.c.
 */
#ifndef OVLD_H
#define OVLD_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "backend.h"
#include "config.h"
#include "registry.h"
#include "stats.h"
#include "wire.h"

struct ovld_member;
struct ovld_job;

typedef struct ovld_conn {
    struct ovld *d;
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
    ovld_registry_t reg;
    struct ovld_member *members; /* comms held, linked by conn_next */
    struct ovld_conn *prev, *next;
} ovld_conn_t;

typedef struct ovld {
    uv_loop_t *loop;
    ovld_config_t cfg;
    char config_path[PATH_MAX]; /* "" if none */
    ovld_backend_t *backend;
    struct ovld_exec_pool *exec_pool; /* threads that issue a ring op's ranks (exec.h) */
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
    /* Buffers whose deregistration waited for ops and can now be answered
     * (registry.h), taken by idle_check after the callbacks of a loop
     * round: a completion never runs a connection's requests itself. */
    ovld_reg_t *idle_regs;
    uv_check_t idle_check;
    ovld_conn_t *conns;
    uint32_t nconns;
    uint64_t next_conn_id;
    ovld_counters_t counters;
    uint64_t hits_at_reset, misses_at_reset; /* the backend's cache counts at the last reset */

    struct ovld_job *jobs;      /* by id, for joining and status */
    struct ovld_job *dead_jobs; /* ranks all gone, completions outstanding */
    uint32_t njobs;
    uint64_t next_comm_id;
    uint32_t works; /* requests being served on workers (imports, unmaps) */

    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t drain_timer;
    uv_timer_t sd_watchdog;   /* WATCHDOG=1 at half of $WATCHDOG_USEC */
    struct ovld_stall *stall; /* reports a blocked loop with its stack */
    uint64_t drain_deadline;  /* loop time (ms) */
    bool stopping;
    bool stopped;
} ovld_t;

/* server.c */
ovl_status_t ovld_server_start(ovld_t *d, char *err, size_t errlen);
/* Applies what the server derives from d->cfg (at start and after a reload):
 * max_mappings = auto resolved from vm.max_map_count. */
void ovld_server_apply_config(ovld_t *d);
void ovld_server_stop_listening(ovld_t *d);
/* Closes what the server keeps past listening (the idle check); at the end
 * of shutdown, once every connection is closed. */
void ovld_server_close(ovld_t *d);
void ovld_conn_close(ovld_conn_t *c, const char *why);
void ovld_shutdown(ovld_t *d);

#endif /* OVLD_H */

/*
 * main.c: ovld's command line, start-up, signals and shutdown.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "exec.h"
#include "job.h"
#include "log.h"
#include "ovld.h"
#include "peer.h"
#include "sdnotify.h"
#include "stall.h"
#include "tune.h"
#include "tunefile.h"
#include "xfer.h"
#include "clock.h"

#define DRAIN_POLL_MS    20
#define DRAIN_TIMEOUT_MS 30000
/* A loop that has not turned for this long is reported with its stack. */
#define STALL_REPORT_MS 3000

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ovld [OPTIONS]\n"
            "\n"
            "The ovl daemon: runs overlapped all-gather + GEMM pipelines for the processes of\n"
            "tensor-parallel jobs on this node's GPUs (or, without a GPU, on the host).\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE      read the configuration file FILE (docs/config.md)\n"
            "  -s, --socket PATH      listen on PATH (default %s; overrides the file)\n"
            "  -b, --backend NAME     auto, host or cuda (overrides the file)\n"
            "  -l, --log-level LEVEL  error, warn, info or debug (overrides the file)\n"
            "  -f, --foreground       stay in the foreground (as under systemd); otherwise\n"
            "                         ovld detaches once its socket listens, and logs to\n"
            "                         --log-file, else to syslog (ident ovld, facility\n"
            "                         daemon: journalctl -t ovld), not to the terminal\n"
            "      --log-file FILE    write the log (and stack reports) to FILE, appended,\n"
            "                         instead of stderr or syslog; kept open, not reopened\n"
            "                         on SIGHUP (rotate it with logrotate's copytruncate)\n"
            "  -h, --help             show this help\n"
            "  -V, --version          show the version\n"
            "\n"
            "Signals: SIGTERM/SIGINT stop (in-flight ops finish, the socket is removed);\n"
            "SIGHUP re-reads the configuration file. SIGUSR2 writes the stack of the\n"
            "thread that takes it to stderr (--log-file's FILE; nowhere when detached\n"
            "to syslog); ovld does so itself for its event loop\n"
            "when the loop has not turned for 3 s (a bug worth a report).\n",
            OVL_DEFAULT_SOCKET);
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Each connection holds a descriptor, and with the host backend each
 * registration one more while it is imported: the soft limit (often 1024)
 * goes up to the hard one, and a limit still short of max_connections is
 * said at start. Running out anyway is survived (server/listen.c), not prevented. */
static void raise_nofile(const ovld_t *d)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)d->cfg.max_connections + 64)
        log_warn("RLIMIT_NOFILE is %llu, short of max_connections (%u) and ovld's own "
                 "descriptors: connections past it are refused (LimitNOFILE= in the unit)",
                 (unsigned long long)rl.rlim_cur, d->cfg.max_connections);
}

/* Ops in flight, and requests being served on workers. */
static uint32_t busy(const ovld_t *d)
{
    return ovld_job_running(&d->jobs) + d->works + ovld_issuer_busy(d->issuer);
}

/* The measured choices to the state directory: their text made on the
 * loop, written on a worker (it waits for the disk); one write at a time;
 * a failed one is said once and tried again a minute later. */
#define TUNE_RETRY_MS 60000

typedef struct tune_write {
    uv_work_t req;
    ovld_t *d;
    char *text;
    size_t len;
    char path[PATH_MAX];
    ovl_status_t st;
    char err[160];
} tune_write_t;

static void tune_write_work(uv_work_t *req)
{
    tune_write_t *w = req->data;
    w->st = ovld_tunefile_write(w->path, w->text, w->len, w->err, sizeof(w->err));
}

static void tune_write_done(uv_work_t *req, int status)
{
    tune_write_t *w = req->data;
    ovld_t *d = w->d;
    d->works--;
    d->tune_writing = false;
    if (status != 0 || w->st != OVL_OK) {
        log_warn("tuning: cannot write %s (%s); the choices stay in memory, and a write is "
                 "tried again in %d s",
                 w->path, status != 0 ? uv_strerror(status) : w->err, TUNE_RETRY_MS / 1000);
        ovld_tune_set_dirty(d->tune);
        d->tune_retry_at = uv_now(d->loop) + TUNE_RETRY_MS;
    }
    free(w->text);
    free(w);
}

/* The text of the choices, if they changed, for path; NULL if not (or
 * without memory: dirty again). */
static char *tune_text(ovld_t *d, size_t *len)
{
    if (!d->tune || !d->tune_path[0] || !ovld_tune_take_dirty(d->tune))
        return NULL;
    char *text = ovld_tune_text(d->tune, d->tune_device, true, len);
    if (!text)
        ovld_tune_set_dirty(d->tune);
    return text;
}

static void on_tune_timer(uv_timer_t *t)
{
    ovld_t *d = t->data;
    if (d->tune_writing || d->stopping || uv_now(d->loop) < d->tune_retry_at)
        return;
    size_t len;
    char *text = tune_text(d, &len);
    if (!text)
        return;
    tune_write_t *w = calloc(1, sizeof(*w));
    if (!w) {
        free(text);
        ovld_tune_set_dirty(d->tune);
        return;
    }
    *w = (tune_write_t){.d = d, .text = text, .len = len};
    w->req.data = w;
    snprintf(w->path, sizeof(w->path), "%s", d->tune_path);
    if (uv_queue_work(d->loop, &w->req, tune_write_work, tune_write_done) != 0) {
        free(text);
        free(w);
        ovld_tune_set_dirty(d->tune);
        return;
    }
    d->tune_writing = true;
    d->works++;
}

/* At the end: what changed since the last write, written now (nothing
 * else runs then). */
static void tune_save_now(ovld_t *d)
{
    size_t len;
    char *text = tune_text(d, &len);
    if (!text)
        return;
    char err[160];
    if (ovld_tunefile_write(d->tune_path, text, len, err, sizeof(err)) != OVL_OK)
        log_warn("tuning: cannot write %s (%s); the choices made since the last write are lost",
                 d->tune_path, err);
    free(text);
}

/* Everything in flight is done (or waited for long enough): close down. */
static void finish_shutdown(ovld_t *d)
{
    if (d->stopped)
        return;
    d->stopped = true;
    uint32_t left = busy(d);
    if (left > 0)
        log_error("shutdown: %u ops still running after %d ms; leaving them", left,
                  DRAIN_TIMEOUT_MS);
    ovld_server_close(d);
    /* after the connections: a ping still waiting fails, and frees its
     * connection */
    ovld_cluster_close(d->cluster);
    d->cluster = NULL;
    d->jobs.across = (ovld_across_t){0};
    ovld_xfer_destroy(d->xfer);
    d->xfer = NULL;
    ovld_peers_close(d->peers);
    d->peers = NULL;
    if (left == 0) {
        /* idle: its threads end at once (else they may be stuck in a
         * stalled device's queue, and the process leaves them) */
        ovld_issuer_close(d->issuer);
        d->issuer = NULL;
        d->jobs.issuer = NULL;
    }
    if (left == 0 && ovld_jobs_empty(&d->jobs) && d->backend) {
        d->backend->ops->destroy(d->backend);
        d->backend = NULL;
    }
    uv_timer_stop(&d->drain_timer);
    close_handle((uv_handle_t *)&d->drain_timer);
    uv_timer_stop(&d->sd_watchdog);
    close_handle((uv_handle_t *)&d->sd_watchdog);
    uv_timer_stop(&d->tune_timer);
    close_handle((uv_handle_t *)&d->tune_timer);
    if (!d->tune_writing)
        tune_save_now(d);
    ovld_stall_stop(d->stall);
    d->stall = NULL;
    close_handle((uv_handle_t *)&d->sig_term);
    close_handle((uv_handle_t *)&d->sig_int);
    close_handle((uv_handle_t *)&d->sig_hup);
    if (left > 0)
        uv_stop(d->loop); /* threads still hold handles; do not wait for them */
}

/* The loop is alive if this runs: that is what systemd's watchdog asks. */
static void on_sd_watchdog(uv_timer_t *t)
{
    (void)t;
    ovld_sd_notify("WATCHDOG=1");
}

static void on_drain_tick(uv_timer_t *t)
{
    ovld_t *d = t->data;
    if (busy(d) == 0 || uv_now(d->loop) >= d->drain_deadline)
        finish_shutdown(d);
}

void ovld_shutdown(ovld_t *d)
{
    if (d->stopping)
        return;
    d->stopping = true;
    ovld_sd_notify("STOPPING=1\nSTATUS=Stopping");
    log_info("stopping: no new connections; %u ops in flight", ovld_job_running(&d->jobs));
    ovld_server_stop_listening(d);
    ovld_job_fail_pending(&d->jobs, OVL_ERR_SHUTDOWN, "ovld is shutting down");
    if (busy(d) == 0) {
        finish_shutdown(d);
        return;
    }
    d->drain_deadline = uv_now(d->loop) + DRAIN_TIMEOUT_MS;
    uv_timer_start(&d->drain_timer, on_drain_tick, DRAIN_POLL_MS, DRAIN_POLL_MS);
}

/* Applies the command line's settings to cfg. They go through the file
 * parser: one set of rules. */
static ovl_status_t apply_args(const ovld_t *d, ovld_config_t *cfg, char *err, size_t errlen)
{
    char line[OVLD_CONFIG_PATH_MAX + 32];
    const char *keys[] = {"socket", "backend", "log_level"};
    const char *vals[] = {d->arg_socket, d->arg_backend, d->arg_log_level};
    for (int i = 0; i < 3; i++) {
        if (!vals[i])
            continue;
        snprintf(line, sizeof(line), "%s = %s\n", keys[i], vals[i]);
        ovl_status_t st = ovld_config_parse(cfg, "command line", line, err, errlen);
        if (st != OVL_OK)
            return st;
    }
    return OVL_OK;
}

static void reload(ovld_t *d)
{
    ovld_sd_notify("RELOADING=1");
    if (!d->config_path[0]) {
        log_info("SIGHUP: no configuration file to re-read");
        ovld_sd_notify("READY=1");
        return;
    }
    ovld_config_t nc;
    ovld_config_defaults(&nc);
    char err[512];
    if (ovld_config_load(&nc, d->config_path, err, sizeof(err)) != OVL_OK ||
        apply_args(d, &nc, err, sizeof(err)) != OVL_OK) {
        log_error("SIGHUP: %s; keeping the running configuration", err);
        ovld_sd_notify("READY=1");
        return;
    }
    /* Settings fixed at start stay; say so rather than pretend. */
    if (strcmp(nc.socket_path, d->cfg.socket_path) != 0 ||
        strcmp(nc.socket_group, d->cfg.socket_group) != 0 || nc.socket_mode != d->cfg.socket_mode ||
        nc.backend != d->cfg.backend || nc.host_devices != d->cfg.host_devices ||
        nc.capture_streams != d->cfg.capture_streams)
        log_warn("SIGHUP: socket, socket_group, socket_mode, backend, host_devices and "
                 "capture_streams take effect only at restart");
    if (strcmp(nc.peer_listen, d->cfg.peer_listen) != 0 ||
        strcmp(nc.peer_advertise, d->cfg.peer_advertise) != 0 ||
        strcmp(nc.peer_key_file, d->cfg.peer_key_file) != 0 ||
        nc.peer_timeout_ms != d->cfg.peer_timeout_ms)
        log_warn("SIGHUP: the peer_* settings take effect only at restart");
    if (nc.tune_samples != d->cfg.tune_samples || nc.tune_entries != d->cfg.tune_entries ||
        nc.tune_entries_per_uid != d->cfg.tune_entries_per_uid ||
        strcmp(nc.state_dir, d->cfg.state_dir) != 0)
        log_warn("SIGHUP: tune_samples, tune_entries, tune_entries_per_uid and state_dir take "
                 "effect only at restart");
    ovld_config_t keep = d->cfg;
    d->cfg = nc;
    memcpy(d->cfg.socket_path, keep.socket_path, sizeof(keep.socket_path));
    memcpy(d->cfg.socket_group, keep.socket_group, sizeof(keep.socket_group));
    d->cfg.socket_mode = keep.socket_mode;
    d->cfg.backend = keep.backend;
    d->cfg.host_devices = keep.host_devices;
    d->cfg.capture_streams = keep.capture_streams;
    memcpy(d->cfg.peer_listen, keep.peer_listen, sizeof(keep.peer_listen));
    memcpy(d->cfg.peer_advertise, keep.peer_advertise, sizeof(keep.peer_advertise));
    memcpy(d->cfg.peer_key_file, keep.peer_key_file, sizeof(keep.peer_key_file));
    d->cfg.peer_timeout_ms = keep.peer_timeout_ms;
    d->cfg.tune_samples = keep.tune_samples;
    d->cfg.tune_entries = keep.tune_entries;
    d->cfg.tune_entries_per_uid = keep.tune_entries_per_uid;
    memcpy(d->cfg.state_dir, keep.state_dir, sizeof(keep.state_dir));
    ovld_log_set_level(d->cfg.log_level);
    ovld_issuer_set_hold(d->issuer, d->cfg.hold_limit_ms);
    ovld_issuer_set_gate_spin(d->issuer, d->cfg.gate_spin_ms);
    ovld_server_apply_config(d);
    log_info("configuration re-read from %s", d->config_path);
    ovld_sd_notify("READY=1");
}

static void on_signal(uv_signal_t *s, int signum)
{
    ovld_t *d = s->data;
    if (signum == SIGHUP) {
        reload(d);
        return;
    }
    log_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    ovld_shutdown(d);
}

/* What the other nodes' ovld say. Nothing runs across nodes yet: a
 * message is noted and dropped; peer.c logs a peer's going down itself. */
/* The links' messages and downs go to what runs over them: the jobs
 * across nodes (cluster.h, types 16..31) and the host backend's rows
 * between nodes (xfer.h, 32..47). */
static void on_peer_message(void *arg, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                            size_t len)
{
    ovld_t *d = arg;
    if (type >= OVLD_CLUSTER_TYPE_FIRST && type <= OVLD_CLUSTER_TYPE_LAST && d->cluster) {
        ovld_cluster_on_message(d->cluster, p, type, body, len);
    } else if (type >= OVLD_XFER_TYPE_FIRST && type <= OVLD_XFER_TYPE_LAST && d->xfer) {
        ovld_xfer_on_message(d->xfer, p, type, body, len);
    } else {
        log_warn("peer %s: message of type %u (%zu bytes) dropped: no such type", ovld_peer_name(p),
                 (unsigned)type, len);
        OVLD_COUNT(&d->counters, peer_errors, 1);
    }
}

static void on_peer_down(void *arg, ovld_peer_t *p, ovl_status_t st, const char *why)
{
    ovld_t *d = arg;
    log_debug("peer %s: down (%s): %s", ovld_peer_name(p), ovl_strerror(st), why);
    if (d->xfer)
        ovld_xfer_on_down(d->xfer, p, why);
    if (d->cluster)
        ovld_cluster_on_down(d->cluster, p, why);
}

/* Detaches: the parent exits once the child reports (through a pipe) that
 * its socket listens, with the child's start-up status as its own (and,
 * when that is a failure, says where the child's log went: `where`). The
 * child's stderr is log_fd (--log-file) or /dev/null, its log then going
 * to syslog: never the terminal that started it. */
static int daemonize(int log_fd, const char *where, int *ret_ready_fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid > 0) {
        close(p[1]);
        char status = 1;
        ssize_t n;
        do
            n = read(p[0], &status, 1);
        while (n < 0 && errno == EINTR);
        if (n != 1 || status != 0)
            fprintf(stderr, "ovld: did not start; its log: %s\n", where);
        _exit(n == 1 ? status : 1);
    }
    close(p[0]);
    if (setsid() < 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid > 0)
        _exit(0);
    if (chdir("/") != 0)
        return -1;
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0)
        return -1;
    dup2(nul, STDIN_FILENO);
    dup2(nul, STDOUT_FILENO);
    if (log_fd < 0)
        ovld_log_to_syslog();
    dup2(log_fd >= 0 ? log_fd : nul, STDERR_FILENO);
    close(nul);
    *ret_ready_fd = p[1];
    return 0;
}

static void report_ready(int *fd, char status)
{
    if (*fd < 0)
        return;
    ssize_t n = write(*fd, &status, 1);
    (void)n;
    close(*fd);
    *fd = -1;
}

/* Gives /dev/null every standard descriptor (0 to 2) that the caller
 * started ovld without, so that no file opened later (the log, the
 * socket, the event loop's epoll) takes one of their numbers and is then
 * written to as stderr or replaced by a dup2 onto it. 0, or -1 with errno. */
static int fill_std_fds(void)
{
    for (;;) {
        int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return -1;
        if (fd > STDERR_FILENO) {
            close(fd);
            return 0;
        }
        /* a standard stream: keep it, without O_CLOEXEC, as it would be */
        if (fcntl(fd, F_SETFD, 0) != 0)
            return -1;
    }
}

/* glibc's allocator, set for a daemon whose threads come and go with jobs
 * (NCCL's and the driver's make their own; each gets an arena of up to
 * 64 MiB). By default glibc raises its mmap threshold to the largest block
 * freed (up to 32 MiB) and its trim threshold to twice that: blocks of
 * megabytes then land in those arenas, and an arena's top is never given
 * back while under 64 MiB, which malloc_trim does not reach either (it
 * trims only the main arena's top). Under churn on 2 x H200 that held
 * ovld's RSS 620 MiB over idle with heap_bytes at idle
 * (bench/results/2026-11-28-soak-d267207-h200x2.md). Fixed thresholds turn
 * the adjustment off: a block of 1 MiB or more is mapped on its own and
 * unmapped when freed, and an arena's top over 4 MiB is given back on the
 * free that grows it. An operator's own MALLOC_ or GLIBC_TUNABLES settings
 * win. Nothing here is on an op's path: ops allocate no blocks that size. */
static void malloc_policy(void)
{
#ifdef __GLIBC__
    if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
        (getenv("GLIBC_TUNABLES") && strstr(getenv("GLIBC_TUNABLES"), "glibc.malloc."))) {
        log_info("malloc: the environment's settings kept");
        return;
    }
    /* mallopt returns 1 on success; a sanitizer's allocator ignores it */
    if (mallopt(M_MMAP_THRESHOLD, 1 << 20) != 1 || mallopt(M_TRIM_THRESHOLD, 4 << 20) != 1)
        log_debug("malloc: thresholds not set (not glibc's allocator)");
#endif
}

/* What the command line says; NULL or false where it says nothing. */
typedef struct ovld_args {
    const char *config, *socket, *backend, *level, *log_file;
    bool foreground;
} ovld_args_t;

/* Parses argv into a. -1: go on; else the exit status (--help, --version,
 * a bad option, said on stdout or stderr). */
static int parse_args(int argc, char **argv, ovld_args_t *a)
{
    enum { O_LOG_FILE = 256 };
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"socket", required_argument, NULL, 's'},
        {"backend", required_argument, NULL, 'b'},
        {"log-level", required_argument, NULL, 'l'},
        {"foreground", no_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"log-file", required_argument, NULL, O_LOG_FILE},
        {NULL, 0, NULL, 0},
    };
    *a = (ovld_args_t){0};
    int c;
    while ((c = getopt_long(argc, argv, "c:s:b:l:fhV", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a->config = optarg;
            break;
        case 's':
            a->socket = optarg;
            break;
        case 'b':
            a->backend = optarg;
            break;
        case 'l':
            a->level = optarg;
            break;
        case 'f':
            a->foreground = true;
            break;
        case O_LOG_FILE:
            a->log_file = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("ovld %s (protocol %d)\n", OVL_VERSION_STRING, OVL_PROTOCOL_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ovld: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The configuration: the file's, then the command line's over it. 0, or 2
 * with the reason on stderr. */
static int configure(ovld_t *d, const ovld_args_t *a)
{
    char err[512] = "";
    ovld_config_defaults(&d->cfg);
    if (a->config) {
        if (ovld_config_load(&d->cfg, a->config, err, sizeof(err)) != OVL_OK) {
            fprintf(stderr, "ovld: %s\n", err);
            return 2;
        }
        if (!realpath(a->config, d->config_path))
            snprintf(d->config_path, sizeof(d->config_path), "%s", a->config);
    }
    d->arg_socket = a->socket;
    d->arg_backend = a->backend;
    d->arg_log_level = a->level;
    if (apply_args(d, &d->cfg, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "ovld: %s\n", err);
        return 2;
    }
    return 0;
}

/* Opens --log-file (here, so that a bad path is said on the terminal) and,
 * unless in the foreground, detaches (*ready_fd: where to say whether the
 * start worked). 0, or the exit status with the reason on stderr. */
static int open_log_and_detach(const ovld_args_t *a, int *ready_fd)
{
    int log_fd = -1;
    char where[4096];
    snprintf(where, sizeof(where), "syslog (journalctl -t ovld)");
    if (a->log_file) {
        log_fd = open(a->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (log_fd < 0) {
            fprintf(stderr, "ovld: --log-file %s: %s\n", a->log_file, strerror(errno));
            return 2;
        }
        snprintf(where, sizeof(where), "%s", a->log_file);
        ovld_log_to_file();
    }
    if (!a->foreground && daemonize(log_fd, where, ready_fd) != 0) {
        fprintf(stderr, "ovld: cannot detach: %s\n", strerror(errno));
        return 1;
    }
    if (log_fd >= 0) {
        if (a->foreground)
            dup2(log_fd, STDERR_FILENO);
        close(log_fd);
    }
    return 0;
}

/* What the backend, the executor, the issuer and the peers see that
 * answers no request goes to the log. */
static const ovld_reporter_t to_log = {.fn = ovld_log_report, .arg = NULL};

/* `auto` that measures (core/tune.h), where tune_samples asks for it and
 * the backend has a timer: the table, and its file in the state directory
 * (config state_dir, else systemd's $STATE_DIRECTORY: its first entry).
 * OVL_OK (measuring off without memory for it, said), or a failure
 * logged. */
static ovl_status_t start_tune(ovld_t *d)
{
    if (d->cfg.tune_samples == 0 || !d->backend->ops->time_start) {
        log_debug("auto chooses by the planner's rule (%s)",
                  d->cfg.tune_samples ? "the backend has no timer" : "tune_samples = 0");
        return OVL_OK;
    }
    d->tune =
        ovld_tune_create(d->cfg.tune_samples, d->cfg.tune_entries, d->cfg.tune_entries_per_uid);
    if (!d->tune) {
        log_warn("out of memory for the tuning table: auto chooses by the planner's rule");
        return OVL_OK;
    }
    d->jobs.tune = d->tune;
    ovld_device_info_t dev = {0};
    if (d->backend->ops->device_count(d->backend) > 0)
        d->backend->ops->device_info(d->backend, 0, &dev);
    char dir[OVLD_CONFIG_KEYPATH_MAX] = "", err[512] = "";
    const char *env = getenv("STATE_DIRECTORY");
    if (d->cfg.state_dir[0])
        snprintf(dir, sizeof(dir), "%s", d->cfg.state_dir);
    else if (env && env[0] == '/')
        snprintf(dir, sizeof(dir), "%.*s", (int)strcspn(env, ":"), env);
    ovld_tunefile_t f;
    if (ovld_tunefile_init(&f, dir, d->backend->ops->name, &dev, err, sizeof(err)) != OVL_OK) {
        log_error("%s", err);
        return OVL_ERR_CONFIG;
    }
    snprintf(d->tune_path, sizeof(d->tune_path), "%s", f.path);
    snprintf(d->tune_device, sizeof(d->tune_device), "%s", f.device);
    (void)ovld_tunefile_load(&f, d->tune);
    log_debug("auto measures: %u samples per plan, up to %u shapes, kept in %s",
              d->cfg.tune_samples, d->cfg.tune_entries, f.path[0] ? f.path : "memory only");
    return OVL_OK;
}

/* The backend, the executor's pool and the issuing threads (one per
 * device, issuer.h), and the jobs on them. OVL_OK, or a failure logged. */
static ovl_status_t start_issue(ovld_t *d)
{
    char err[512] = "";
    ovl_status_t st = ovld_backend_create(d->loop, &d->cfg, ovld_job_on_done, &d->jobs, &to_log,
                                          &d->backend, err, sizeof(err));
    if (st != OVL_OK) {
        log_error("cannot start the %s backend: %s", ovld_backend_kind_name(d->cfg.backend), err);
        return st;
    }
    st = ovld_exec_pool_create(&to_log, &d->exec_pool);
    if (st != OVL_OK) {
        log_error("cannot set up the issuing threads: %s", ovl_strerror(st));
        return st;
    }
    /* OVLD_TEST_ISSUE_STALL_MS makes every issue wait first: a fault for
     * the tests that check the loop goes on while an issue stalls. */
    ovld_issuer_cfg_t icfg = {.nthreads = d->backend->ops->device_count(d->backend),
                              .pool = d->exec_pool,
                              .hold_ms = d->cfg.hold_limit_ms,
                              .gate_spin_ms = d->cfg.gate_spin_ms,
                              .on_hold = ovld_jobs_on_hold,
                              .hold_arg = &d->jobs,
                              .owner_busy = ovld_jobs_owner_busy};
    const char *stall_env = getenv("OVLD_TEST_ISSUE_STALL_MS");
    if (stall_env && stall_env[0]) {
        char *end;
        unsigned long v = strtoul(stall_env, &end, 10);
        if (*end || v > 600000) {
            log_error("OVLD_TEST_ISSUE_STALL_MS=%s: not a number of milliseconds up to 600000",
                      stall_env);
            return OVL_ERR_CONFIG;
        }
        icfg.stall_ms = (uint32_t)v;
        log_warn("OVLD_TEST_ISSUE_STALL_MS: every op waits %lu ms before it is issued (a fault "
                 "for tests)",
                 v);
    }
    st = ovld_issuer_create(d->loop, d->backend, &icfg, &to_log, &d->issuer, err, sizeof(err));
    if (st != OVL_OK) {
        log_error("cannot start the issuing threads: %s", err);
        return st;
    }
    ovld_jobs_init(&d->jobs, d->backend, &d->cfg, &d->counters, d->exec_pool, d->issuer,
                   &d->buffers);
    return start_tune(d);
}

/* Signals and timers first: a client may connect, and a signal come, as
 * soon as the socket listens (a SIGHUP before its handler would end ovld).
 * 0, or a libuv error logged. */
static int start_signals(ovld_t *d, uint64_t wd_usec)
{
    int uerr; /* the callbacks run from uv_run on, after the data is set below */
    if ((uerr = uv_signal_init(d->loop, &d->sig_term)) != 0 ||
        (uerr = uv_signal_init(d->loop, &d->sig_int)) != 0 ||
        (uerr = uv_signal_init(d->loop, &d->sig_hup)) != 0 ||
        (uerr = uv_signal_start(&d->sig_term, on_signal, SIGTERM)) != 0 ||
        (uerr = uv_signal_start(&d->sig_int, on_signal, SIGINT)) != 0 ||
        (uerr = uv_signal_start(&d->sig_hup, on_signal, SIGHUP)) != 0 ||
        (uerr = uv_timer_init(d->loop, &d->drain_timer)) != 0 ||
        (uerr = uv_timer_init(d->loop, &d->sd_watchdog)) != 0 ||
        (uerr = uv_timer_init(d->loop, &d->tune_timer)) != 0 ||
        (d->tune && d->tune_path[0] &&
         (uerr = uv_timer_start(&d->tune_timer, on_tune_timer, 1000, 1000)) != 0) ||
        (wd_usec >= 2000 &&
         (uerr = uv_timer_start(&d->sd_watchdog, on_sd_watchdog, 0, wd_usec / 2000)) != 0)) {
        log_error("cannot set up signal and timer handles: %s", uv_strerror(uerr));
        return uerr;
    }
    d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
    d->drain_timer.data = d;
    d->tune_timer.data = d;
    return 0;
}

/* The links to other nodes, their rows and jobs across nodes, where
 * peer_listen is set: after the fork of daemonize (UCX must not be
 * forked), before the socket listens (an ovld whose peers cannot start
 * does not start). OVL_OK, or a failure logged. */
static ovl_status_t start_peers(ovld_t *d)
{
    if (!d->cfg.peer_listen[0])
        return OVL_OK;
    char err[512] = "";
    const ovld_peers_cb_t pcb = {.on_message = on_peer_message, .on_down = on_peer_down, .arg = d};
    ovl_status_t st = ovld_peers_start(d->loop, &d->cfg, &pcb, &to_log, &d->counters, &d->peers,
                                       err, sizeof(err));
    if (st == OVL_OK)
        st = ovld_xfer_create(d->loop, d->peers, &d->counters, &d->xfer, err, sizeof(err));
    if (st == OVL_OK) {
        const ovld_cluster_cb_t ccb = {.on_start = ovld_jobs_on_start,
                                       .on_go = ovld_jobs_on_go,
                                       .on_end = ovld_jobs_on_end,
                                       .arg = &d->jobs};
        st = ovld_cluster_create(d->loop, d->peers, d->xfer, d->backend, &d->cfg, &d->counters,
                                 &ccb, &d->cluster);
        if (st != OVL_OK)
            snprintf(err, sizeof(err), "jobs across nodes: %s", ovl_strerror(st));
        else {
            d->jobs.across = ovld_cluster_across(d->cluster);
            ovld_cluster_set_tune(d->cluster, d->tune); /* the jobs it coordinates */
        }
    }
    if (st != OVL_OK)
        log_error("cannot start the links to other nodes: %s", err);
    return st;
}

/* Every module, in order, then the socket. 0, or a failure logged. */
static int start(ovld_t *d)
{
    raise_nofile(d);
    malloc_policy(); /* before any thread of ours, NCCL's or the driver's */
    d->loop = uv_default_loop();
    d->listen_fd = -1;
    d->self_pidfd = -1;
    d->spare_fd = -1;
    d->start_ns = ovl_mono_ns();
    ovld_stats_reset(&d->counters.total, d->start_ns);
    ovld_stats_reset(&d->counters.window, d->start_ns);
    uint64_t wd_usec = ovld_sd_watchdog_usec();
    if (start_issue(d) != OVL_OK || start_signals(d, wd_usec) != 0 || start_peers(d) != OVL_OK)
        return 1;
    char err[512] = "";
    if (ovld_server_start(d, err, sizeof(err)) != OVL_OK) {
        log_error("%s", err);
        return 1;
    }
    if (wd_usec >= 2000)
        log_info("systemd watchdog: WATCHDOG=1 every %" PRIu64 " ms", wd_usec / 2000);
    int uerr; /* not fatal: it only reports a loop that should never block */
    if ((uerr = ovld_stall_start(&d->stall, d->loop, STALL_REPORT_MS)) != 0)
        log_warn("cannot watch the event loop for stalls: %s", uv_strerror(uerr));
    return 0;
}

/* Serves until a signal stops the loop, then lets go of what is left. */
static void run_and_stop(ovld_t *d)
{
    uv_run(d->loop, UV_RUN_DEFAULT);
    if (!d->stopped) /* the loop ran dry without a signal: should not happen */
        log_error("event loop ended unexpectedly");
    if (d->stopped && busy(d) == 0) {
        int rc = uv_loop_close(d->loop);
        if (rc != 0)
            log_debug("uv_loop_close: %s", uv_strerror(rc));
    }
    /* The issuer's threads were joined at shutdown when nothing ran (and
     * with them every use of the pool); else they and the pool's are left
     * to the process's exit, stuck in a device. */
    if (!d->issuer) {
        ovld_exec_pool_destroy(d->exec_pool);
        d->exec_pool = NULL;
    }
    if (d->self_pidfd >= 0)
        close(d->self_pidfd);
    d->jobs.tune = NULL;
    ovld_tune_destroy(d->tune);
    d->tune = NULL;
    log_info("stopped");
}

int main(int argc, char **argv)
{
    if (fill_std_fds() != 0)
        return 1; /* nowhere to say why: stderr is what failed */
    ovld_args_t args;
    int rc = parse_args(argc, argv, &args);
    if (rc >= 0)
        return rc;
    /* Before anything installs a signal handler (UCX's own went in when
     * its library loaded: peer.h). */
    ovld_peers_process_init();

    static ovld_t daemon; /* the one context; static only to keep it off the stack */
    ovld_t *d = &daemon;
    if ((rc = configure(d, &args)) != 0)
        return rc;
    ovld_log_init(d->cfg.log_level);
    signal(SIGPIPE, SIG_IGN); /* a vanished client must not kill the daemon */
    int ready_fd = -1;
    if ((rc = open_log_and_detach(&args, &ready_fd)) != 0)
        return rc;
    if (start(d) != 0) {
        report_ready(&ready_fd, 1);
        return 1;
    }
    uint32_t ndev = d->backend->ops->device_count(d->backend);
    log_info("ovld %s ready: %s backend, %u device%s, pid %d; auto %s", OVL_VERSION_STRING,
             d->backend->ops->name, ndev, ndev == 1 ? "" : "s", (int)getpid(),
             !d->tune          ? "chooses by rule"
             : d->tune_path[0] ? "measures (choices kept in the state directory)"
                               : "measures (choices kept in memory)");
    char state[256];
    snprintf(state, sizeof(state), "READY=1\nSTATUS=Serving: %s backend, %u devices\nMAINPID=%d",
             d->backend->ops->name, ndev, (int)getpid());
    ovld_sd_notify(state);
    report_ready(&ready_fd, 0);
    run_and_stop(d);
    return 0;
}

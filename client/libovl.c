/*
 * libovl.c: the client library (ovl.h). A blocking socket with deadlines:
 * requests are answered in order, matched by id; AG-GEMM submissions get no
 * answer (the doorbell says when they are done and whether they failed).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "doorbell.h"
#include "libovl_cuda.h"
#include "libovl_internal.h"
#include "threads.h"
#include "matrix.h"
#include "scaling.h"
#include "ovl.pb-c.h"
#include "wire.h"
#include "clock.h"

#define OVL_API __attribute__((visibility("default")))

#define DEFAULT_TIMEOUT_MS 30000
#define UUID_LEN           LIBOVL_UUID_LEN

struct ovl_mem {
    ovl_client_t *cl;
    uint64_t id;
    uintptr_t base;
    size_t bytes;
    bool host_alloc; /* from ovl_host_alloc: ours to unmap */
    size_t map_len;
    uint64_t buffer_id; /* CUDA: the driver's id of the allocation (libovl_cuda_buffer_id) */
    struct ovl_mem *next;
};

struct ovl_comm {
    ovl_client_t *cl;
    uint64_t id;
    uint32_t world, rank;
    uint64_t seq;    /* the last op submitted (the watcher reads it: atomic) */
    uint32_t window; /* ops in flight that ovld accepts */
    /* The doorbell (proto/doorbell.h): a page of a memfd that ovld shares,
     * mapped here. done and the error word are what host-side waits read. */
    struct ovl_doorbell *db;
    void *db_map;
    size_t db_map_len;
    int device; /* CUDA: the comm's device */
    /* CUDA: the same page as the GPU sees it (libovl_cuda.h); NULL on the
     * host backend. */
    libovl_cuda_doorbell_t *cuda;
    ovl_status_t err; /* sticky, once seen */
    struct ovl_comm *next;
};

struct ovl_client {
    int fd;
    int timeout_ms;
    uint64_t next_id;
    ovl_wire_reader_t rd;
    ovl_fdq_t fdq;
    ovl_wire_out_t out;
    ovl_daemon_info_t info;
    uint8_t (*uuids)[UUID_LEN];
    uint32_t ndev;
    bool host;
    uint64_t features;   /* HelloReply's: OVL_FEATURE_* */
    libovl_cuda_t *cuda; /* CUDA, once device memory is first used */
    bool broken;         /* the stream is unusable: every call fails */
    ovl_status_t said;   /* an Error the daemon sent unasked (id 0), e.g. before closing */
    struct ovl_mem *mems;
    struct ovl_comm *comms; /* linked and unlinked under comms_mu: the watcher reads it */
    pthread_mutex_t comms_mu;
    /* The watcher (see "ovld's death" below), started with the first comm. */
    pthread_t watcher;
    bool watching;           /* the watcher runs (in owner_pid) */
    pid_t owner_pid;         /* the process that connected (a forked child gives nothing up) */
    int watcher_stop;        /* eventfd: ovl_disconnect wakes the watcher to end it */
    int daemon_pidfd;        /* ovld's own pidfd, from the HelloReply; -1 if it sent none */
    pthread_mutex_t lost_mu; /* one thread at a time gives ovld up (lose_daemon) */
    int lost;                /* atomic: set once every wait was released */
    char lost_msg[256];      /* why, written before lost is set */
    char err[512];
};

static _Thread_local char connect_err[1024];

static ovl_status_t mem_unregister(ovl_client_t *cl, struct ovl_mem *m);

OVL_API const char *ovl_connect_error(void)
{
    return connect_err;
}

OVL_API const char *ovl_last_error(const ovl_client_t *cl)
{
    return cl ? cl->err : "";
}

static ovl_status_t fail(ovl_client_t *cl, ovl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ovl_status_t vfail(ovl_client_t *cl, ovl_status_t st, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static ovl_status_t vfail(ovl_client_t *cl, ovl_status_t st, const char *fmt, va_list ap)
{
    vsnprintf(cl->err, sizeof(cl->err), fmt, ap);
    return st;
}

static ovl_status_t fail(ovl_client_t *cl, ovl_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st = vfail(cl, st, fmt, ap);
    va_end(ap);
    return st;
}

/* fail, for libovl_cuda.c (libovl_nocuda.c without CUDA) */
ovl_status_t libovl_fail(ovl_client_t *cl, ovl_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st = vfail(cl, st, fmt, ap);
    va_end(ap);
    return st;
}

/* Milliseconds left until deadline (0 = none: -1 for poll). */
static int left_ms(uint64_t deadline)
{
    if (deadline == 0)
        return -1;
    uint64_t now = ovl_mono_ms();
    return now >= deadline ? 0 : (int)(deadline - now);
}

static uint64_t deadline_of(const ovl_client_t *cl)
{
    return cl->timeout_ms > 0 ? ovl_mono_ms() + (uint64_t)cl->timeout_ms : 0;
}

static ovl_status_t wait_fd(ovl_client_t *cl, short events, uint64_t deadline)
{
    struct pollfd p = {.fd = cl->fd, .events = events};
    for (;;) {
        int n = poll(&p, 1, left_ms(deadline));
        if (n > 0)
            return OVL_OK;
        if (n == 0)
            return fail(cl, OVL_ERR_TIMEOUT, "no answer from ovld within %d ms", cl->timeout_ms);
        if (errno != EINTR)
            return fail(cl, OVL_ERR_SYSTEM, "poll: %s", strerror(errno));
    }
}

/* Reads what the daemon sent before it closed, for its reason. */
static void salvage(ovl_client_t *cl)
{
    for (int i = 0; i < 16 && !cl->said; i++) {
        const uint8_t *body;
        uint32_t len;
        if (ovl_wire_reader_next(&cl->rd, &body, &len) == OVL_OK) {
            Ovl__Response *r = ovl__response__unpack(NULL, len, body);
            if (r && r->body_case == OVL__RESPONSE__BODY_ERROR && r->error->status < 0 &&
                r->error->status >= OVL_ERR_INTERNAL) {
                cl->said = (ovl_status_t)r->error->status;
                fail(cl, cl->said, "%s", r->error->message ? r->error->message : "");
            }
            if (r)
                ovl__response__free_unpacked(r, NULL);
            continue;
        }
        size_t n;
        if (ovl_wire_recv(cl->fd, &cl->rd, &cl->fdq, &n) != OVL_OK)
            return;
    }
}

static void give_up_if_gone(ovl_client_t *cl);

static ovl_status_t broken(ovl_client_t *cl, ovl_status_t st, const char *what)
{
    cl->broken = true;
    if (st == OVL_ERR_CLOSED) {
        salvage(cl);
        give_up_if_gone(cl); /* nobody will ring the comms' doorbells now */
    }
    if (cl->said)
        return cl->said; /* the daemon's own reason beats "connection closed" */
    if (st == OVL_ERR_CLOSED)
        return fail(cl, st, "ovld closed the connection (%s)", what);
    return fail(cl, st, "%s: %s%s%s", what, ovl_strerror(st), st == OVL_ERR_SYSTEM ? ": " : "",
                st == OVL_ERR_SYSTEM ? strerror(errno) : "");
}

static ovl_status_t flush_all(ovl_client_t *cl, uint64_t deadline)
{
    for (;;) {
        ovl_status_t st = ovl_wire_flush(cl->fd, &cl->out);
        if (st == OVL_OK)
            return OVL_OK;
        if (st != OVL_ERR_AGAIN)
            return broken(cl, st, "sending to ovld");
        if ((st = wait_fd(cl, POLLOUT, deadline)) != OVL_OK) {
            /* Part of a frame may be out: the stream cannot go on. */
            cl->broken = true;
            return st;
        }
    }
}

static ovl_status_t send_request(ovl_client_t *cl, Ovl__Request *q, const int *fds, unsigned nfds,
                                 uint64_t deadline)
{
    if (cl->broken) {
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
        return fail(cl, OVL_ERR_CLOSED, "the connection to ovld is broken");
    }
    ovl_status_t st = ovl_wire_out_append(&cl->out, &q->base, OVL_WIRE_DEFAULT_MAX, fds, nfds);
    if (st != OVL_OK)
        return fail(cl, st, "cannot queue a request: %s", ovl_strerror(st));
    return flush_all(cl, deadline);
}

/* Reads the response with the given id. Responses with id 0 are the
 * daemon's words about fire-and-forget requests: kept as the last error. */
static ovl_status_t read_response(ovl_client_t *cl, uint64_t id, uint64_t deadline,
                                  Ovl__Response **ret)
{
    for (;;) {
        const uint8_t *body;
        uint32_t len;
        ovl_status_t st = ovl_wire_reader_next(&cl->rd, &body, &len);
        if (st == OVL_OK) {
            Ovl__Response *r = ovl__response__unpack(NULL, len, body);
            if (!r)
                return broken(cl, OVL_ERR_PROTOCOL, "malformed response from ovld");
            if (r->id == id) {
                *ret = r;
                return OVL_OK;
            }
            if (r->body_case == OVL__RESPONSE__BODY_ERROR && r->error->message) {
                fail(cl, (ovl_status_t)r->error->status, "%s", r->error->message);
                if (r->id == 0 && r->error->status < 0 && r->error->status >= OVL_ERR_INTERNAL)
                    cl->said = (ovl_status_t)r->error->status;
            }
            bool fatal = r->id == 0 && r->body_case == OVL__RESPONSE__BODY_ERROR &&
                         r->error->status == OVL_ERR_PROTOCOL;
            ovl__response__free_unpacked(r, NULL);
            if (fatal) {
                cl->broken = true;
                return OVL_ERR_PROTOCOL;
            }
            continue;
        }
        if (st != OVL_ERR_AGAIN)
            return broken(cl, st, "bad frame from ovld");
        if ((st = wait_fd(cl, POLLIN, deadline)) != OVL_OK)
            return st;
        size_t n;
        st = ovl_wire_recv(cl->fd, &cl->rd, &cl->fdq, &n);
        if (st != OVL_OK && st != OVL_ERR_AGAIN)
            return broken(cl, st, "receiving from ovld");
    }
}

/* The reply each request gets when it succeeds (an Error may answer any). */
static Ovl__Response__BodyCase reply_case(Ovl__Request__BodyCase q)
{
    switch (q) {
    case OVL__REQUEST__BODY_HELLO:
        return OVL__RESPONSE__BODY_HELLO;
    case OVL__REQUEST__BODY_STATUS:
        return OVL__RESPONSE__BODY_STATUS;
    case OVL__REQUEST__BODY_COMM_INIT:
        return OVL__RESPONSE__BODY_COMM_INIT;
    case OVL__REQUEST__BODY_COMM_CHECK:
        return OVL__RESPONSE__BODY_COMM_CHECK;
    case OVL__REQUEST__BODY_MEM_REGISTER:
        return OVL__RESPONSE__BODY_MEM_REGISTER;
    case OVL__REQUEST__BODY_PLAN:
        return OVL__RESPONSE__BODY_PLAN;
    case OVL__REQUEST__BODY_STATS:
        return OVL__RESPONSE__BODY_STATS;
    case OVL__REQUEST__BODY_PEER_PING:
        return OVL__RESPONSE__BODY_PEER_PING;
    case OVL__REQUEST__BODY_JOB_ID_CREATE:
        return OVL__RESPONSE__BODY_JOB_ID_CREATE;
    case OVL__REQUEST__BODY_TUNE:
        return OVL__RESPONSE__BODY_TUNE;
    case OVL__REQUEST__BODY_COMM_DESTROY:
    case OVL__REQUEST__BODY_MEM_DEREGISTER:
        return OVL__RESPONSE__BODY_OK;
    default: /* an Op is never answered */
        return OVL__RESPONSE__BODY__NOT_SET;
    }
}

/* Sends q and returns its reply, which has the body q asks for: an Error
 * reply becomes its status, any other body breaks the connection. */
ovl_status_t libovl_call(ovl_client_t *cl, Ovl__Request *q, const int *fds, unsigned nfds,
                         Ovl__Response **ret)
{
    uint64_t deadline = deadline_of(cl);
    q->id = ++cl->next_id;
    ovl_status_t st = send_request(cl, q, fds, nfds, deadline);
    if (st != OVL_OK)
        return st;
    Ovl__Response *r = NULL;
    if ((st = read_response(cl, q->id, deadline, &r)) != OVL_OK)
        return st;
    if (r->body_case == OVL__RESPONSE__BODY_ERROR) {
        st = (ovl_status_t)r->error->status;
        if (st >= 0 || st < OVL_ERR_INTERNAL)
            st = OVL_ERR_INTERNAL;
        fail(cl, st, "%s", r->error->message ? r->error->message : ovl_strerror(st));
        ovl__response__free_unpacked(r, NULL);
        return st;
    }
    if (r->body_case != reply_case(q->body_case)) {
        ovl__response__free_unpacked(r, NULL);
        return broken(cl, OVL_ERR_PROTOCOL, "unexpected answer from ovld");
    }
    *ret = r;
    return OVL_OK;
}

void libovl_response_free(Ovl__Response *r)
{
    if (r)
        ovl__response__free_unpacked(r, NULL);
}

ovl_status_t libovl_status(ovl_client_t *cl, Ovl__Response **ret)
{
    Ovl__StatusRequest sq = OVL__STATUS_REQUEST__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_STATUS;
    q.status = &sq;
    return libovl_call(cl, &q, NULL, 0, ret);
}

/* ---------------------------------------------------------------- connect */

/*
 * The default socket (ovl.h, ovl_default_socket): $OVL_SOCKET; else the
 * per-user socket of ovld@UID.service, RUN/UID/ovld.sock; else that of
 * ovld-user.service, $XDG_RUNTIME_DIR/ovl/ovld.sock; else the node-wide
 * OVL_DEFAULT_SOCKET. RUN is /run/ovl; $OVL_RUNTIME_DIR (for tests only)
 * stands in for it, and then RUN/ovld.sock for OVL_DEFAULT_SOCKET too.
 * A per-user socket is taken only if it exists, is a socket, and it and its
 * directory belong to this user (the effective uid, which ovld sees) or to
 * root: not to another user who could put a daemon of theirs there.
 */
#define RUN_DIR_DEFAULT "/run/ovl"

/* $OVL_RUNTIME_DIR, or NULL: tests only, and never in set-user-ID programs. */
static const char *run_dir_env(void)
{
    const char *env = secure_getenv("OVL_RUNTIME_DIR");
    return env && env[0] ? env : NULL;
}

/* Appends to note (a list for the connect message) what became of a
 * candidate. */
static void note_add(char *note, size_t notelen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void note_add(char *note, size_t notelen, const char *fmt, ...)
{
    size_t used = strlen(note);
    if (used + 3 >= notelen)
        return;
    if (used) {
        memcpy(note + used, ", ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + used, notelen - used, fmt, ap);
    va_end(ap);
}

/* True if path is a socket that, with its directory, belongs to uid or
 * root. Otherwise false, and note says why. */
static bool usable_socket(const char *path, uid_t uid, char *note, size_t notelen)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            note_add(note, notelen, "%s absent", path);
        else
            note_add(note, notelen, "%s: %s", path, strerror(errno));
        return false;
    }
    if (!S_ISSOCK(st.st_mode)) {
        note_add(note, notelen, "%s not a socket", path);
        return false;
    }
    if (st.st_uid != uid && st.st_uid != 0) {
        note_add(note, notelen, "%s belongs to uid %u", path, (unsigned)st.st_uid);
        return false;
    }
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n == 0 || n >= sizeof(dir)) {
        note_add(note, notelen, "%s too long", path);
        return false;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != uid && st.st_uid != 0)) {
        note_add(note, notelen, "%s in a directory of another user", path);
        return false;
    }
    return true;
}

/* ovl_default_socket, and in why (for messages) how the rule came to pick
 * the path. */
static ovl_status_t default_socket(char *buf, size_t len, ovl_socket_rule_t *rule, char *why,
                                   size_t whylen)
{
    char cand[4096];
    char note[384] = "";
    int n;
    ovl_socket_rule_t r;
    uid_t uid = geteuid();
    const char *env = getenv("OVL_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    bool have_xdg = xdg && xdg[0] == '/';
    if (env && env[0]) {
        r = OVL_SOCKET_RULE_ENV;
        n = snprintf(cand, sizeof(cand), "%s", env);
        snprintf(why, whylen, "from $OVL_SOCKET");
        goto found;
    }
    const char *run = run_dir_env();
    n = snprintf(cand, sizeof(cand), "%s/%u/ovld.sock", run ? run : RUN_DIR_DEFAULT, (unsigned)uid);
    if (usable_socket(cand, uid, note, sizeof(note))) {
        r = OVL_SOCKET_RULE_PER_USER;
        snprintf(why, whylen, "the per-user socket of ovld@%u.service", (unsigned)uid);
        goto found;
    }
    if (have_xdg) {
        n = snprintf(cand, sizeof(cand), "%s/ovl/ovld.sock", xdg);
        if (usable_socket(cand, uid, note, sizeof(note))) {
            r = OVL_SOCKET_RULE_USER_MANAGER;
            snprintf(why, whylen, "the per-user socket of ovld-user.service in $XDG_RUNTIME_DIR");
            goto found;
        }
    }
    r = OVL_SOCKET_RULE_NODE;
    if (run)
        n = snprintf(cand, sizeof(cand), "%s/ovld.sock", run);
    else
        n = snprintf(cand, sizeof(cand), "%s", OVL_DEFAULT_SOCKET);
    snprintf(why, whylen, "the node-wide default; $OVL_SOCKET unset, %s", note);
found:
    if (rule)
        *rule = r;
    if (!buf || len == 0)
        return OVL_ERR_INVALID;
    if (n < 0 || (size_t)n >= sizeof(cand) || (size_t)n >= len) {
        buf[0] = '\0';
        return OVL_ERR_INVALID;
    }
    memcpy(buf, cand, (size_t)n + 1);
    return OVL_OK;
}

OVL_API ovl_status_t ovl_default_socket(char *buf, size_t len, ovl_socket_rule_t *rule)
{
    char why[512];
    return default_socket(buf, len, rule, why, sizeof(why));
}

OVL_API const char *ovl_socket_rule_name(ovl_socket_rule_t rule)
{
    switch (rule) {
    case OVL_SOCKET_RULE_ENV:
        return "$OVL_SOCKET";
    case OVL_SOCKET_RULE_PER_USER:
        return "per-user (ovld@UID.service)";
    case OVL_SOCKET_RULE_USER_MANAGER:
        return "per-user (ovld-user.service, $XDG_RUNTIME_DIR)";
    case OVL_SOCKET_RULE_NODE:
        return "node-wide default";
    }
    return "unknown";
}

static ovl_status_t hello(ovl_client_t *cl)
{
    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = OVL_PROTOCOL_VERSION;
    h.library_version = (char *)OVL_VERSION_STRING;
    h.pid = (int32_t)getpid();
    h.client_name.data = (uint8_t *)program_invocation_short_name;
    h.client_name.len = strlen(program_invocation_short_name);
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_HELLO;
    q.hello = &h;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, &q, NULL, 0, &r);
    if (st != OVL_OK)
        return st;
    Ovl__HelloReply *hr = r->hello;
    if (hr->fd_count == 1) /* ovld's pidfd (see "ovld's death") */
        cl->daemon_pidfd = ovl_fdq_pop(&cl->fdq);
    cl->info.protocol_version = hr->protocol_version;
    cl->features = hr->features;
    snprintf(cl->info.version, sizeof(cl->info.version), "%s",
             hr->daemon_version ? hr->daemon_version : "");
    snprintf(cl->info.backend, sizeof(cl->info.backend), "%s", hr->backend ? hr->backend : "");
    cl->info.pid = hr->daemon_pid;
    cl->info.ndevices = (uint32_t)hr->n_devices;
    cl->host = strcmp(cl->info.backend, "host") == 0;
    cl->uuids = calloc(hr->n_devices ? hr->n_devices : 1, UUID_LEN);
    if (!cl->uuids) {
        ovl__response__free_unpacked(r, NULL);
        return fail(cl, OVL_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < hr->n_devices; i++)
        if (hr->devices[i]->uuid.len == UUID_LEN)
            memcpy(cl->uuids[i], hr->devices[i]->uuid.data, UUID_LEN);
    cl->ndev = (uint32_t)hr->n_devices;
    ovl__response__free_unpacked(r, NULL);
    /* CUDA is touched only when the client first uses device memory:
     * ovlctl and other clients that only ask must work even while the GPU
     * driver is busy or wedged, when an operator needs them most. */
    return OVL_OK;
}

/* Frees what ovl_connect set up: the socket, the framing state, the
 * client. Comms and registrations are the caller's to release first. */
static void client_free(ovl_client_t *cl)
{
    pthread_mutex_destroy(&cl->comms_mu);
    pthread_mutex_destroy(&cl->lost_mu);
    if (cl->daemon_pidfd >= 0)
        close(cl->daemon_pidfd);
    if (cl->fd >= 0)
        close(cl->fd);
    ovl_wire_reader_free(&cl->rd);
    ovl_wire_out_free(&cl->out);
    ovl_fdq_close_all(&cl->fdq);
    libovl_cuda_free(cl->cuda);
    free(cl->uuids);
    free(cl);
}

OVL_API ovl_status_t ovl_connect(const char *path, ovl_client_t **ret_client)
{
    connect_err[0] = '\0';
    if (!ret_client) {
        snprintf(connect_err, sizeof(connect_err), "ret_client is NULL");
        return OVL_ERR_INVALID;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char def[4096];
    char why[384] = ""; /* which rule picked the default, for the messages */
    const char *p = path;
    if (!p || !p[0]) {
        if (default_socket(def, sizeof(def), NULL, why, sizeof(why)) != OVL_OK) {
            snprintf(connect_err, sizeof(connect_err), "socket path too long (%s)", why);
            return OVL_ERR_INVALID;
        }
        p = def;
    }
    if (strlen(p) >= sizeof(sa.sun_path)) {
        snprintf(connect_err, sizeof(connect_err), "socket path too long: %s", p);
        return OVL_ERR_INVALID;
    }
    memcpy(sa.sun_path, p, strlen(p) + 1);
    ovl_client_t *cl = calloc(1, sizeof(*cl));
    if (!cl) {
        snprintf(connect_err, sizeof(connect_err), "out of memory");
        return OVL_ERR_NOMEM;
    }
    cl->timeout_ms = DEFAULT_TIMEOUT_MS;
    cl->watcher_stop = -1;
    cl->daemon_pidfd = -1;
    cl->owner_pid = getpid();
    pthread_mutex_init(&cl->comms_mu, NULL);
    pthread_mutex_init(&cl->lost_mu, NULL);
    ovl_wire_reader_init(&cl->rd, OVL_WIRE_DEFAULT_MAX);
    ovl_fdq_init(&cl->fdq);
    ovl_wire_out_init(&cl->out);
    ovl_status_t st;
    cl->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (cl->fd < 0) {
        snprintf(connect_err, sizeof(connect_err), "socket: %s", strerror(errno));
        st = OVL_ERR_SYSTEM;
        goto fail;
    }
    /* A full listen backlog answers a non-blocking connect with EAGAIN at
     * once (ovld is busy accepting): try again, backing off, within the
     * client's timeout. */
    uint64_t deadline = ovl_mono_ms() + (uint64_t)cl->timeout_ms;
    unsigned backoff_us = 500;
    int rc;
    while ((rc = connect(cl->fd, (struct sockaddr *)&sa, sizeof(sa))) != 0 &&
           (errno == EAGAIN || errno == EINTR) && ovl_mono_ms() < deadline) {
        if (errno == EAGAIN) {
            usleep(backoff_us);
            backoff_us = backoff_us < 50000 ? backoff_us * 2 : 50000;
        }
    }
    if (rc != 0) {
        int e = errno;
        st = e == EACCES || e == EPERM ? OVL_ERR_PERMISSION
             : e == EAGAIN             ? OVL_ERR_TIMEOUT
                                       : OVL_ERR_CONNECT;
        snprintf(connect_err, sizeof(connect_err), "cannot connect to %s%s%s%s: %s%s", p,
                 why[0] ? " (" : "", why, why[0] ? ")" : "", strerror(e),
                 e == ENOENT || e == ECONNREFUSED ? " (is ovld running?)"
                 : e == EAGAIN ? " (its listen backlog stayed full: ovld is overloaded)"
                               : "");
        goto fail;
    }
    if ((st = hello(cl)) != OVL_OK) {
        snprintf(connect_err, sizeof(connect_err), "%s", cl->err);
        goto fail;
    }
    *ret_client = cl;
    return OVL_OK;
fail:
    client_free(cl);
    return st;
}

/* ------------------------------------------------------- ovld's death */

/*
 * When ovld dies, no op of this client will ever be done, and a CUDA stream
 * that waits on a done slot would wait for ever, possibly inside a
 * cudaStreamSynchronize of the application's, where libovl never gets a say.
 * So whichever thread first sees the socket hang up gives ovld up
 * (lose_daemon): a thread per client that polls the socket (the watcher),
 * or the application's own thread in a call that finds it so. It waits, up
 * to WATCHER_EXIT_WAIT_MS, for ovld's process to be gone (ovld hands each
 * client a pidfd of its own with the HelloReply), so that none of ovld's
 * work can still write the application's buffers; then it does for every
 * comm what ovld does for a client that died (ovl_doorbell_release_value):
 * the error word says OVL_ERR_CLOSED, and done and every done slot are set
 * past the last op. The streams go on, with C not computed, and
 * ovl_comm_check says why.
 */
#define WATCHER_EXIT_WAIT_MS 10000

static void release_comm(struct ovl_comm *cm)
{
    ovl_doorbell_release_closed(cm->db, __atomic_load_n(&cm->seq, __ATOMIC_RELAXED),
                                (int32_t)OVL_ERR_CLOSED);
}

typedef enum daemon_fate {
    FATE_EXITED,  /* ovld's process is gone */
    FATE_ALIVE,   /* still there after WATCHER_EXIT_WAIT_MS */
    FATE_UNKNOWN, /* ovld sent no pidfd (Linux < 5.3) */
    FATE_STOPPED, /* ovl_disconnect wants the watcher to end */
} daemon_fate_t;

/* Waits until ovld's process is gone, or up to WATCHER_EXIT_WAIT_MS, or
 * until stop_fd (-1: none) is readable. */
static daemon_fate_t wait_daemon_exit(ovl_client_t *cl, int stop_fd)
{
    if (cl->daemon_pidfd < 0)
        return FATE_UNKNOWN;
    struct pollfd p[2] = {{.fd = cl->daemon_pidfd, .events = POLLIN},
                          {.fd = stop_fd, .events = POLLIN}};
    uint64_t deadline = ovl_mono_ms() + WATCHER_EXIT_WAIT_MS;
    int n;
    do
        n = poll(p, 2, left_ms(deadline));
    while (n < 0 && errno == EINTR);
    if (n > 0 && p[1].revents)
        return FATE_STOPPED;
    return n > 0 ? FATE_EXITED : FATE_ALIVE;
}

/* Gives ovld up (see above), once per client; a thread that comes second
 * waits for the first. Returns at once, releasing nothing, if stop_fd
 * becomes readable while ovld's exit is awaited. */
static void lose_daemon(ovl_client_t *cl, int stop_fd)
{
    if (getpid() != cl->owner_pid)
        return; /* a forked child's copy: its parent's to give up */
    pthread_mutex_lock(&cl->lost_mu);
    if (__atomic_load_n(&cl->lost, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&cl->lost_mu);
        return;
    }
    daemon_fate_t fate = wait_daemon_exit(cl, stop_fd);
    if (fate == FATE_STOPPED) {
        pthread_mutex_unlock(&cl->lost_mu);
        return;
    }
    char why[64] = " and it exited";
    if (fate == FATE_ALIVE)
        snprintf(why, sizeof(why), " (it had not exited after %d s)", WATCHER_EXIT_WAIT_MS / 1000);
    else if (fate == FATE_UNKNOWN)
        snprintf(why, sizeof(why), " (whether it exited cannot be seen from here)");
    snprintf(cl->lost_msg, sizeof(cl->lost_msg),
             "ovld (pid %d) went away: its connection closed%s; ops not done by then were not "
             "computed, and the waits on them were released",
             (int)cl->info.pid, why);
    pthread_mutex_lock(&cl->comms_mu);
    __atomic_store_n(&cl->lost, 1, __ATOMIC_RELEASE);
    for (struct ovl_comm *cm = cl->comms; cm; cm = cm->next)
        release_comm(cm);
    pthread_mutex_unlock(&cl->comms_mu);
    pthread_mutex_unlock(&cl->lost_mu);
}

/* A daemon that died will never ring: notice it. */
static bool daemon_gone(ovl_client_t *cl)
{
    struct pollfd p = {.fd = cl->fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

/* What every call that may find ovld gone does (the application's thread). */
static void give_up_if_gone(ovl_client_t *cl)
{
    if (!__atomic_load_n(&cl->lost, __ATOMIC_ACQUIRE) && cl->comms && daemon_gone(cl))
        lose_daemon(cl, -1);
}

static void *watcher_main(void *arg)
{
    ovl_client_t *cl = arg;
    struct pollfd p[2] = {{.fd = cl->fd, .events = POLLRDHUP},
                          {.fd = cl->watcher_stop, .events = POLLIN}};
    for (;;) {
        int n = poll(p, 2, -1);
        if (n < 0 && errno != EINTR)
            return NULL;
        if (n <= 0)
            continue;
        if (p[1].revents || (p[0].revents & POLLNVAL))
            return NULL;
        if (p[0].revents & (POLLHUP | POLLRDHUP | POLLERR))
            break;
    }
    lose_daemon(cl, cl->watcher_stop);
    return NULL;
}

/* Starts the watcher once per client (the application's signals blocked);
 * OVL_WATCHER=0 in the environment: none (libovl's calls still give ovld
 * up when they find it gone, but a stream nobody calls about waits). */
static ovl_status_t watcher_start(ovl_client_t *cl)
{
    if (cl->watching || getpid() != cl->owner_pid)
        return OVL_OK; /* running, or a forked child's copy: nothing to watch for */
    const char *want = getenv("OVL_WATCHER");
    if (want && strcmp(want, "0") == 0)
        return OVL_OK;
    cl->watcher_stop = eventfd(0, EFD_CLOEXEC);
    if (cl->watcher_stop < 0)
        return fail(cl, OVL_ERR_SYSTEM, "eventfd (the thread that watches ovld): %s",
                    strerror(errno));
    int e = ovl_thread_start(&cl->watcher, watcher_main, cl);
    if (e != 0) {
        close(cl->watcher_stop);
        cl->watcher_stop = -1;
        return fail(cl, OVL_ERR_SYSTEM, "cannot start the thread that watches ovld: %s",
                    strerror(e));
    }
    cl->watching = true;
    return OVL_OK;
}

/* Ends the watcher (only in the process that started it: a forked child
 * shares the eventfd but not the thread). */
static void watcher_stop(ovl_client_t *cl)
{
    if (cl->watching && getpid() == cl->owner_pid) {
        uint64_t one = 1;
        ssize_t w;
        do
            w = write(cl->watcher_stop, &one, sizeof(one));
        while (w < 0 && errno == EINTR);
        pthread_join(cl->watcher, NULL);
        cl->watching = false;
    }
    if (cl->watcher_stop >= 0) {
        close(cl->watcher_stop);
        cl->watcher_stop = -1;
    }
}

static void comm_free(struct ovl_comm *cm)
{
    bool unmap = cm->db_map != NULL;
    /* A wait that the GPU still polls must not find the page gone (that
     * would fault the caller's context): until the last one is over the
     * page stays, mapped and registered, and is leaked if it never is. */
    if (cm->cuda) {
        bool idle = libovl_cuda_doorbell_idle(cm->cuda);
        if (!idle && daemon_gone(cm->cl)) {
            /* ovld went away meanwhile: this comm is already off the
             * client's list, so release it here, once ovld is given up */
            lose_daemon(cm->cl, -1);
            if (getpid() == cm->cl->owner_pid)
                release_comm(cm);
            idle = libovl_cuda_doorbell_idle(cm->cuda);
        }
        if (!idle)
            unmap = false;
        libovl_cuda_doorbell_free(cm->cuda, idle);
    }
    if (unmap)
        munmap(cm->db_map, cm->db_map_len);
    free(cm);
}

OVL_API void ovl_disconnect(ovl_client_t *cl)
{
    if (!cl)
        return;
    watcher_stop(cl);
    /* Stopped before it released anything, and ovld is gone: do it here,
     * or the caller's streams would wait for ever on the comms freed below
     * (comm_free looks again while it waits for each). */
    give_up_if_gone(cl);
    while (cl->comms) {
        struct ovl_comm *cm = cl->comms;
        cl->comms = cm->next;
        comm_free(cm); /* closing the socket leaves the job */
    }
    /* Device memory: wait until ovld has unmapped it, since the application
     * may free it as soon as this returns (freeing memory another process
     * still maps is undefined). */
    while (cl->mems && !cl->host && !cl->broken) {
        struct ovl_mem *m = cl->mems;
        (void)mem_unregister(cl, m); /* unlinks and frees m, answered or not */
    }
    while (cl->mems) {
        struct ovl_mem *m = cl->mems;
        cl->mems = m->next;
        if (m->host_alloc)
            munmap((void *)m->base, m->map_len);
        free(m);
    }
    client_free(cl);
}

OVL_API void ovl_set_timeout(ovl_client_t *cl, int timeout_ms)
{
    if (cl)
        cl->timeout_ms = timeout_ms;
}

OVL_API ovl_status_t ovl_daemon_info(const ovl_client_t *cl, ovl_daemon_info_t *ret)
{
    if (!cl || !ret)
        return OVL_ERR_INVALID;
    *ret = cl->info;
    return OVL_OK;
}

/* ----------------------------------------------------------------- memory */

/* Whether registration m holds [p, p+bytes). */
static bool mem_holds(const struct ovl_mem *m, uintptr_t p, uint64_t bytes)
{
    return p >= m->base && p - m->base <= m->bytes && bytes <= m->bytes - (p - m->base);
}

static struct ovl_mem *mem_find(ovl_client_t *cl, uintptr_t p, uint64_t bytes)
{
    for (struct ovl_mem *m = cl->mems; m; m = m->next)
        if (mem_holds(m, p, bytes))
            return m;
    return NULL;
}

OVL_API void *ovl_host_alloc(ovl_client_t *cl, size_t bytes)
{
    if (!cl)
        return NULL;
    if (!cl->host) {
        fail(cl, OVL_ERR_UNSUPPORTED, "ovl_host_alloc needs the host backend; ovld runs %s",
             cl->info.backend);
        return NULL;
    }
    if (bytes == 0) {
        fail(cl, OVL_ERR_INVALID, "ovl_host_alloc of 0 bytes");
        return NULL;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (len < bytes) {
        fail(cl, OVL_ERR_INVALID, "ovl_host_alloc of %zu bytes overflows", bytes);
        return NULL;
    }
    struct ovl_mem *m = calloc(1, sizeof(*m));
    void *p = MAP_FAILED;
    int fd = memfd_create("ovl-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (!m || fd < 0) {
        fail(cl, m ? OVL_ERR_SYSTEM : OVL_ERR_NOMEM, "memfd_create: %s", strerror(errno));
        goto fail;
    }
    /* Sealed at its size, so that ovld can map it without fear that this
     * process shrinks it under the daemon's feet. */
    if (ftruncate(fd, (off_t)len) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        fail(cl, errno == ENOSPC || errno == EFBIG ? OVL_ERR_NOMEM : OVL_ERR_SYSTEM,
             "sizing shared memory of %zu bytes: %s", len, strerror(errno));
        goto fail;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        fail(cl, OVL_ERR_NOMEM, "mmap of %zu bytes: %s", len, strerror(errno));
        goto fail;
    }
    Ovl__MemRegister mr = OVL__MEM_REGISTER__INIT;
    mr.client_addr = (uint64_t)(uintptr_t)p;
    mr.bytes = len;
    mr.fd_count = 1;
    mr.fd_offset = 0;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    q.mem_register = &mr;
    Ovl__Response *r = NULL;
    int sfd = fd;
    fd = -1; /* the request owns it now */
    if (libovl_call(cl, &q, &sfd, 1, &r) != OVL_OK)
        goto fail;
    m->cl = cl;
    m->id = r->mem_register->mem_id;
    m->base = (uintptr_t)p;
    m->bytes = len;
    m->map_len = len;
    m->host_alloc = true;
    m->next = cl->mems;
    cl->mems = m;
    ovl__response__free_unpacked(r, NULL);
    return p;
fail:
    if (p != MAP_FAILED)
        munmap(p, len);
    if (fd >= 0)
        close(fd);
    free(m);
    return NULL;
}

static ovl_status_t mem_unregister(ovl_client_t *cl, struct ovl_mem *m)
{
    Ovl__MemDeregister md = OVL__MEM_DEREGISTER__INIT;
    md.mem_id = m->id;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_DEREGISTER;
    q.mem_deregister = &md;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, &q, NULL, 0, &r);
    if (st == OVL_OK)
        ovl__response__free_unpacked(r, NULL);
    for (struct ovl_mem **pp = &cl->mems; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    if (m->host_alloc)
        munmap((void *)m->base, m->map_len);
    free(m);
    return st;
}

OVL_API ovl_status_t ovl_host_free(ovl_client_t *cl, void *ptr)
{
    if (!cl || !ptr)
        return OVL_ERR_INVALID;
    for (struct ovl_mem *m = cl->mems; m; m = m->next)
        if (m->host_alloc && m->base == (uintptr_t)ptr)
            return mem_unregister(cl, m);
    return fail(cl, OVL_ERR_NOT_FOUND, "%p was not returned by ovl_host_alloc", ptr);
}

/*
 * Registers the whole allocation holding [ptr, ptr+bytes) (see
 * libovl_cuda_mem_alloc). The submit path registers every matrix of every
 * op, so a registration made before is found by the allocation's buffer id
 * alone, one driver call: an id is never given to a later allocation, and
 * an allocation's range does not change, so a registration of that id
 * holding [ptr, ptr+bytes) is the memory's. Otherwise the allocation is
 * looked up in full (range and IPC handle), and a registration at its base
 * of another allocation (freed, the address handed out again) is dropped
 * and made anew, as UCX's IPC cache does.
 */
static ovl_status_t cuda_register(ovl_client_t *cl, void *ptr, size_t bytes, ovl_mem_t **ret_mem)
{
    uint64_t id = libovl_cuda_buffer_id(cl->cuda, ptr);
    for (struct ovl_mem *m = id ? cl->mems : NULL; m; m = m->next)
        if (m->buffer_id == id && mem_holds(m, (uintptr_t)ptr, bytes)) {
            *ret_mem = m;
            return OVL_OK;
        }
    libovl_cuda_alloc_t a;
    ovl_status_t st = libovl_cuda_mem_alloc(cl, &cl->cuda, ptr, bytes, &a);
    if (st != OVL_OK)
        return st;
    struct ovl_mem *m = mem_find(cl, a.base, a.size);
    if (m && m->base == a.base && m->buffer_id == a.buffer_id) {
        *ret_mem = m;
        return OVL_OK;
    }
    if (m) /* stale: the address was freed and handed out again */
        (void)mem_unregister(cl, m);
    uint8_t uuid[UUID_LEN];
    if ((st = libovl_cuda_mem_device_uuid(cl, ptr, uuid)) != OVL_OK)
        return st;
    m = calloc(1, sizeof(*m));
    if (!m)
        return fail(cl, OVL_ERR_NOMEM, "out of memory");
    Ovl__MemRegister mr = OVL__MEM_REGISTER__INIT;
    mr.client_addr = (uint64_t)a.base;
    mr.bytes = a.size;
    mr.ipc_handle.data = a.handle;
    mr.ipc_handle.len = sizeof(a.handle);
    mr.ipc_offset = 0;
    mr.device_uuid.data = uuid;
    mr.device_uuid.len = UUID_LEN;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    q.mem_register = &mr;
    Ovl__Response *r = NULL;
    if ((st = libovl_call(cl, &q, NULL, 0, &r)) != OVL_OK) {
        free(m);
        return st;
    }
    m->cl = cl;
    m->id = r->mem_register->mem_id;
    m->base = a.base;
    m->bytes = a.size;
    m->buffer_id = a.buffer_id;
    m->next = cl->mems;
    cl->mems = m;
    ovl__response__free_unpacked(r, NULL);
    *ret_mem = m;
    return OVL_OK;
}

OVL_API ovl_status_t ovl_mem_register(ovl_client_t *cl, void *ptr, size_t bytes,
                                      ovl_mem_t **ret_mem)
{
    if (!cl || !ptr || bytes == 0 || !ret_mem)
        return cl ? fail(cl, OVL_ERR_INVALID, "ovl_mem_register: bad arguments") : OVL_ERR_INVALID;
    struct ovl_mem *m = cl->host ? mem_find(cl, (uintptr_t)ptr, bytes) : NULL;
    if (m) {
        *ret_mem = m;
        return OVL_OK;
    }
    if (cl->host)
        return fail(cl, OVL_ERR_INVALID,
                    "%p (%zu bytes) is not inside memory from ovl_host_alloc, which the host "
                    "backend needs",
                    ptr, bytes);
    return cuda_register(cl, ptr, bytes, ret_mem);
}

OVL_API ovl_status_t ovl_mem_deregister(ovl_client_t *cl, ovl_mem_t *mem)
{
    if (!cl || !mem || mem->cl != cl)
        return OVL_ERR_INVALID;
    if (mem->host_alloc)
        return fail(cl, OVL_ERR_INVALID, "memory from ovl_host_alloc is released by ovl_host_free");
    return mem_unregister(cl, mem);
}

/* ------------------------------------------------------------------ comms */

static ovl_status_t device_uuid(ovl_client_t *cl, int device, uint8_t uuid[UUID_LEN])
{
    if (cl->host) {
        if (device < 0 || (uint32_t)device >= cl->ndev)
            return fail(cl, OVL_ERR_NOT_FOUND, "no host device %d (ovld has %u)", device, cl->ndev);
        memcpy(uuid, cl->uuids[device], UUID_LEN);
        return OVL_OK;
    }
    /* The ordinal is this process's (its CUDA_VISIBLE_DEVICES); the UUID is
     * what the daemon knows the GPU by. */
    return libovl_cuda_device_uuid(cl, device, uuid);
}

/* Gives ovld the comm back (CommDestroy). */
static ovl_status_t comm_destroy_call(ovl_client_t *cl, uint64_t comm_id)
{
    Ovl__CommDestroy cd = OVL__COMM_DESTROY__INIT;
    cd.comm_id = comm_id;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_DESTROY;
    q.comm_destroy = &cd;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, &q, NULL, 0, &r);
    if (st == OVL_OK)
        ovl__response__free_unpacked(r, NULL);
    return st;
}

/*
 * The join, whichever way the job is named: ci holds the job's name (job_id
 * or job_blob) and the caller's world and rank; this adds the device, sends
 * CommInit with the client's timeout, and makes the comm of the reply: maps
 * its doorbell (on a GPU, registers it with CUDA) and starts the watcher. A
 * rank ovld took but that cannot be used is given back (CommDestroy), so
 * that a retry does not find it taken. *ret_comm is set only on OVL_OK.
 */
static ovl_status_t comm_join(ovl_client_t *cl, Ovl__CommInit *ci, int device,
                              ovl_comm_t **ret_comm)
{
    uint8_t uuid[UUID_LEN];
    ovl_status_t st = device_uuid(cl, device, uuid);
    if (st != OVL_OK)
        return st;
    ci->device_uuid.data = uuid;
    ci->device_uuid.len = UUID_LEN;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = ci;
    Ovl__Response *r = NULL;
    if ((st = libovl_call(cl, &q, NULL, 0, &r)) != OVL_OK)
        return st;
    struct ovl_comm *cm = NULL;
    uint64_t joined = 0; /* a comm ovld made that we must give back on failure */
    int fd = -1;
    Ovl__CommInitReply *cr = r->comm_init;
    joined = cr->comm_id;
    /* Take the reply's descriptor at once, whatever happens next, so that a
     * later reply never gets it. */
    if (cr->fd_count == 1)
        fd = ovl_fdq_pop(&cl->fdq);
    if (fd < 0) {
        st = broken(cl, OVL_ERR_PROTOCOL, "CommInit came without its doorbell");
        goto out;
    }
    cm = calloc(1, sizeof(*cm));
    if (!cm) {
        st = fail(cl, OVL_ERR_NOMEM, "out of memory");
        goto out;
    }
    cm->cl = cl;
    cm->device = device;
    cm->db_map_len = (size_t)cr->doorbell_offset + OVL_DOORBELL_SIZE;
    cm->db_map = mmap(NULL, cm->db_map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (cm->db_map == MAP_FAILED) {
        cm->db_map = NULL;
        st = fail(cl, OVL_ERR_SYSTEM, "mapping the doorbell: %s", strerror(errno));
        goto out;
    }
    cm->db = (struct ovl_doorbell *)((char *)cm->db_map + cr->doorbell_offset);
    /* On a GPU, the caller's stream writes its ready slots and waits on its
     * done slots there. */
    if (!cl->host && (st = libovl_cuda_doorbell_register(cl, cm->device, cm->db_map, cm->db_map_len,
                                                         cm->db, &cm->cuda)) != OVL_OK)
        goto out;
    if ((st = watcher_start(cl)) != OVL_OK)
        goto out;
    cm->id = cr->comm_id;
    cm->window = cr->max_in_flight ? cr->max_in_flight : 1;
    cm->world = (uint32_t)ci->world;
    cm->rank = (uint32_t)ci->rank;
    pthread_mutex_lock(&cl->comms_mu);
    cm->next = cl->comms;
    cl->comms = cm;
    pthread_mutex_unlock(&cl->comms_mu);
    *ret_comm = cm;
    cm = NULL;
    joined = 0;
    st = OVL_OK;
out:
    if (fd >= 0)
        close(fd);
    if (cm)
        comm_free(cm);
    ovl__response__free_unpacked(r, NULL);
    if (joined && !cl->broken) {
        /* ovld took the rank but we cannot use it: give it back, or a
         * retry would find the rank taken. */
        char why[sizeof(cl->err)];
        memcpy(why, cl->err, sizeof(why));
        (void)comm_destroy_call(cl, joined);
        memcpy(cl->err, why, sizeof(why));
    }
    return st;
}

OVL_API ovl_status_t ovl_comm_init(ovl_client_t *cl, const char *job_id, uint32_t world,
                                   uint32_t rank, int device, ovl_comm_t **ret_comm)
{
    if (!cl)
        return OVL_ERR_INVALID;
    if (!job_id || !ret_comm)
        return fail(cl, OVL_ERR_INVALID, "ovl_comm_init: job_id and ret_comm are required");
    /* world and rank are ovld's to check (docs/protocol.md): it answers
     * with the same words to every client, libovl or not. */
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_id.data = (uint8_t *)job_id;
    ci.job_id.len = strlen(job_id);
    ci.world = world;
    ci.rank = rank;
    return comm_join(cl, &ci, device, ret_comm);
}

OVL_API ovl_status_t ovl_job_id_create(ovl_client_t *cl, ovl_job_id_t *ret_id)
{
    if (!cl)
        return OVL_ERR_INVALID;
    if (!ret_id)
        return fail(cl, OVL_ERR_INVALID, "ovl_job_id_create: ret_id is required");
    Ovl__JobIdCreate jc = OVL__JOB_ID_CREATE__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_JOB_ID_CREATE;
    q.job_id_create = &jc;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, &q, NULL, 0, &r);
    if (st != OVL_OK)
        return st;
    /* A well-formed answer of the wrong size: the stream is fine, the id
     * is not (every rank must join with the same OVL_JOB_ID_BYTES). */
    size_t len = r->job_id_create->id.len;
    if (len != OVL_JOB_ID_BYTES)
        st = fail(cl, OVL_ERR_PROTOCOL, "ovld answered JobIdCreate with an id of %zu bytes, not %d",
                  len, OVL_JOB_ID_BYTES);
    else
        memcpy(ret_id->bytes, r->job_id_create->id.data, OVL_JOB_ID_BYTES);
    ovl__response__free_unpacked(r, NULL);
    return st;
}

OVL_API ovl_status_t ovl_comm_init_id(ovl_client_t *cl, const ovl_job_id_t *id, uint32_t world,
                                      uint32_t rank, int device, ovl_comm_t **ret_comm)
{
    if (!cl)
        return OVL_ERR_INVALID;
    if (!id || !ret_comm)
        return fail(cl, OVL_ERR_INVALID, "ovl_comm_init_id: id and ret_comm are required");
    /* Checked here too, not only by ovld: its answer to a job id may cost
     * a round trip to the coordinating ovld on another node. The words
     * are those ovld uses (daemon/server/request.c). */
    if (world == 0)
        return fail(cl, OVL_ERR_INVALID, "ovl_comm_init_id: world 0 out of range (1 or more)");
    if (rank >= world)
        return fail(cl, OVL_ERR_INVALID, "ovl_comm_init_id: rank %u out of range for world %u",
                    rank, world);
    /* The same join as ovl_comm_init's, with the id in place of the name,
     * and the same deadline (the client's timeout, ovl_set_timeout): ovld
     * answers once the coordinating ovld admitted the rank or refused it,
     * and gives up on one it cannot reach after its peer_timeout_ms (2 s by
     * default, at most 60 s) with OVL_ERR_CONNECT or OVL_ERR_TIMEOUT. */
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_blob.data = (uint8_t *)id->bytes;
    ci.job_blob.len = OVL_JOB_ID_BYTES;
    ci.world = world;
    ci.rank = rank;
    return comm_join(cl, &ci, device, ret_comm);
}

const struct ovl_doorbell *libovl_comm_doorbell(const ovl_comm_t *cm)
{
    return cm->db;
}

OVL_API ovl_status_t ovl_comm_check(ovl_comm_t *cm)
{
    if (!cm)
        return OVL_ERR_INVALID;
    ovl_client_t *cl = cm->cl;
    /* first, even with an error to report: later ops may still hold streams */
    give_up_if_gone(cl);
    if (cm->err != OVL_OK)
        return cm->err;
    const struct ovl_doorbell *db = cm->db;
    int32_t e = __atomic_load_n(&db->error, __ATOMIC_ACQUIRE);
    if (e == 0)
        return OVL_OK;
    uint64_t seq = __atomic_load_n(&db->error_seq, __ATOMIC_RELAXED);
    cm->err = (e < 0 && e >= OVL_ERR_INTERNAL) ? (ovl_status_t)e : OVL_ERR_INTERNAL;
    if (e == OVL_ERR_CLOSED && __atomic_load_n(&cl->lost, __ATOMIC_ACQUIRE)) {
        if (!cl->said)
            salvage(cl); /* ovld's last words, if it closed with an Error */
        if (!cl->said)
            return fail(cl, cm->err, "op %" PRIu64 ": %s", seq, cl->lost_msg);
        char said[sizeof(cl->err)];
        memcpy(said, cl->err, sizeof(said));
        return fail(cl, cm->err, "op %" PRIu64 ": %s (ovld said: %s)", seq, cl->lost_msg, said);
    }
    /* The doorbell holds the code; ovld holds the words. */
    Ovl__CommCheck cc = OVL__COMM_CHECK__INIT;
    cc.comm_id = cm->id;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_CHECK;
    q.comm_check = &cc;
    Ovl__Response *r = NULL;
    if (libovl_call(cl, &q, NULL, 0, &r) == OVL_OK) {
        if (r->comm_check->message)
            fail(cl, cm->err, "op %" PRIu64 ": %s", r->comm_check->seq, r->comm_check->message);
        ovl__response__free_unpacked(r, NULL);
    } else {
        fail(cl, cm->err, "op %" PRIu64 " failed: %s", seq, ovl_strerror(cm->err));
    }
    return cm->err;
}

static long futex_wait(uint32_t *addr, uint32_t val, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    return syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Waits on the host until the doorbell says done >= target. */
static ovl_status_t wait_done(ovl_comm_t *cm, uint64_t target)
{
    ovl_client_t *cl = cm->cl;
    uint64_t deadline = deadline_of(cl);
    if (!cl->host) {
        /* ovld's stream writes done, with no futex wake: poll plain memory,
         * spinning briefly, then sleeping 20 us between looks (a throttled
         * rank waits about one op). */
        unsigned spins = 0;
        while (__atomic_load_n(&cm->db->done, __ATOMIC_ACQUIRE) < target) {
            if (++spins < 64) {
                sched_yield();
                continue;
            }
            if (deadline && left_ms(deadline) == 0)
                return fail(cl, OVL_ERR_TIMEOUT,
                            "op %" PRIu64 " not done within %d ms (done: %" PRIu64 ")", target,
                            cl->timeout_ms, __atomic_load_n(&cm->db->done, __ATOMIC_RELAXED));
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            if ((spins & 1023) == 0 && daemon_gone(cl))
                return broken(cl, OVL_ERR_CLOSED, "waiting for ops"); /* gives ovld up */
        }
        return OVL_OK;
    }
    for (;;) {
        uint32_t w = __atomic_load_n(&cm->db->wake, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&cm->db->done, __ATOMIC_ACQUIRE) >= target)
            return OVL_OK;
        int slice = 100;
        if (deadline) {
            int left = left_ms(deadline);
            if (left == 0)
                return fail(cl, OVL_ERR_TIMEOUT,
                            "op %" PRIu64 " not done within %d ms (done: %" PRIu64 ")", target,
                            cl->timeout_ms, __atomic_load_n(&cm->db->done, __ATOMIC_RELAXED));
            if (left < slice)
                slice = left;
        }
        futex_wait(&cm->db->wake, w, slice);
        if (daemon_gone(cl) && __atomic_load_n(&cm->db->done, __ATOMIC_ACQUIRE) < target)
            return broken(cl, OVL_ERR_CLOSED, "waiting for ops"); /* gives ovld up */
    }
}

OVL_API ovl_status_t ovl_comm_synchronize(ovl_comm_t *cm)
{
    if (!cm)
        return OVL_ERR_INVALID;
    ovl_status_t st = wait_done(cm, __atomic_load_n(&cm->seq, __ATOMIC_RELAXED));
    return st != OVL_OK ? st : ovl_comm_check(cm);
}

OVL_API ovl_status_t ovl_comm_destroy(ovl_comm_t *cm)
{
    if (!cm)
        return OVL_OK;
    ovl_client_t *cl = cm->cl;
    ovl_status_t st = ovl_comm_synchronize(cm);
    if (!cl->broken) {
        ovl_status_t dst = comm_destroy_call(cl, cm->id);
        if (dst != OVL_OK && st == OVL_OK)
            st = dst;
    }
    give_up_if_gone(cl); /* while cm is still on the list */
    pthread_mutex_lock(&cl->comms_mu);
    for (struct ovl_comm **pp = &cl->comms; *pp; pp = &(*pp)->next)
        if (*pp == cm) {
            *pp = cm->next;
            break;
        }
    pthread_mutex_unlock(&cl->comms_mu);
    comm_free(cm);
    return st;
}

/* ------------------------------------------------------------------- ops */

static ovl_status_t bufref(ovl_client_t *cl, const char *name, const void *ptr, uint64_t rows,
                           uint64_t cols, uint64_t ld, size_t elem, Ovl__BufRef *ref)
{
    uint64_t extent;
    ovl_status_t st = ovl_matrix_extent(rows, cols, ld, elem, &extent);
    if (st == OVL_ERR_INVALID)
        return fail(cl, st, "%s: leading dimension %" PRIu64 " is less than %" PRIu64 " columns",
                    name, ld, cols);
    if (st != OVL_OK)
        return fail(cl, st, "%s: %" PRIu64 " x %" PRIu64 " matrix overflows", name, rows, cols);
    if (!ptr)
        return fail(cl, OVL_ERR_INVALID, "%s is NULL", name);
    ovl_mem_t *m;
    if ((st = ovl_mem_register(cl, (void *)ptr, extent ? extent : 1, &m)) != OVL_OK) {
        char why[sizeof(cl->err)];
        memcpy(why, cl->err, sizeof(why)); /* fail() writes cl->err */
        return fail(cl, st, "%s: %s", name, why);
    }
    ovl__buf_ref__init(ref);
    ref->mem_id = m->id;
    ref->offset = (uint64_t)((uintptr_t)ptr - m->base);
    return OVL_OK;
}

/* Every kind's submission after its own checks: the throttle, the
 * doorbell's ready on the caller's stream (or now, on the host), the
 * request, and the undo of the stream's wait when the request cannot be
 * sent. */
static ovl_status_t submit_op(ovl_comm_t *cm, Ovl__Op *op, void *stream)
{
    ovl_client_t *cl = cm->cl;
    ovl_status_t st;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_OP;
    q.op = op;
    /* Throttle: ovld takes at most `window` ops in flight per rank (on a GPU
     * this waits on the host only when the rank is that far ahead). */
    if (op->seq > cm->window && (st = wait_done(cm, op->seq - cm->window)) != OVL_OK)
        return st;
    if (!cl->host) {
        /* On the caller's stream: ready = n once the work before it is done
         * (A is written), then wait done >= n, so that work after the call
         * sees C; then the request. No host synchronization. */
        if ((st = libovl_cuda_submit(cl, &cl->cuda, cm->cuda, stream, op->seq)) != OVL_OK)
            return st;
        if ((st = send_request(cl, &q, NULL, 0, deadline_of(cl))) != OVL_OK) {
            /* The stream waits for this op already: end that wait, and
             * take no more ops (ovld may have the op or not, and op seq's
             * slots are written: a later op cannot take its number). */
            libovl_cuda_submit_undo(cm->cuda, op->seq);
            cm->err = st;
            return st;
        }
        __atomic_store_n(&cm->seq, op->seq, __ATOMIC_RELAXED);
        return OVL_OK;
    }
    /* Host mode: the caller is the stream, and its data is ready now. */
    __atomic_store_n(&cm->db->ready, op->seq, __ATOMIC_RELEASE);
    if ((st = send_request(cl, &q, NULL, 0, deadline_of(cl))) != OVL_OK)
        return st;
    __atomic_store_n(&cm->seq, op->seq, __ATOMIC_RELAXED);
    return OVL_OK;
}

/* What every op's call checks first: a comm that takes ops (one with a
 * failed op answers ovl_comm_check's error, not a queue of ops that ovld
 * fails one by one: one load of the doorbell), a descriptor, a dtype that
 * exists and an algorithm of the kind's, positive m, n and k, and a stream
 * only where there is a GPU. */
static ovl_status_t op_begin(ovl_comm_t *cm, const char *call, ovl_op_kind_t kind, const void *d,
                             ovl_dtype_t dtype, ovl_algo_t algo, uint64_t m, uint64_t n, uint64_t k,
                             void *stream)
{
    ovl_client_t *cl = cm->cl;
    if (cm->err != OVL_OK || __atomic_load_n(&cm->db->error, __ATOMIC_ACQUIRE) != 0)
        return ovl_comm_check(cm);
    if (!d)
        return fail(cl, OVL_ERR_INVALID, "%s: desc is NULL", call);
    if (ovl_dtype_size(dtype) == 0)
        return fail(cl, OVL_ERR_INVALID, "unknown dtype %d", (int)dtype);
    if (!ovl_algo_name(algo))
        return fail(cl, OVL_ERR_INVALID, "unknown algorithm %d", (int)algo);
    if (!ovl_op_kind_takes_algo(kind, algo))
        return fail(cl, OVL_ERR_INVALID, "algorithm %s: %s has %s", ovl_algo_name(algo),
                    ovl_op_kind_name(kind), ovl_op_kind_algos(kind));
    if (m == 0 || n == 0 || k == 0)
        return fail(cl, OVL_ERR_INVALID, "m, n and k must be positive");
    if (cl->host && stream)
        return fail(cl, OVL_ERR_INVALID, "the host backend takes no stream (pass NULL)");
    return cl->host ? OVL_OK : libovl_cuda_present(cl);
}

/* A scaled op's slots (proto/ovl.proto, Scaling). */
enum { SLOT_A_SCALE = 18, SLOT_B_SCALE = 19, SLOT_BIAS = 20, SLOT_B_SCALE1 = 21, SLOT_BIAS1 = 28 };

/* What a scaled op adds to either kind, checked here so that a mistake is
 * named before anything is sent (common/scaling.h's rules, which ovld
 * asks again): sc given exactly for an fp8 dtype and known to this ovld;
 * its dtypes, modes and B's layout, and the shapes its modes need (GEMMs of
 * block_rows rows: a rank's A, or a block of the output); B 0's scales and
 * bias and A's scales registered as buffers (of ovl_scale_shape's shapes
 * for A's m x k and B's n x k; bias n elements of out_dtype) into refs,
 * for the slots a_scale, b_scale and bias (scaled_add), with their leading
 * dimensions in ld; the wire's Scaling in w. *ret_belem and *ret_celem: B's
 * and C's element sizes. */
typedef struct scaled_bufs {
    Ovl__Scaling w;
    Ovl__BufRef refs[3];
    uint64_t ld[3];
    bool given[3];
} scaled_bufs_t;

/* The scales ptr of a B of n columns of op(B) (k its rows), by mode,
 * registered as name; their leading dimension (dense) in *ret_ld. */
static ovl_status_t b_scale_ref(ovl_client_t *cl, const char *name, ovl_scale_mode_t mode,
                                const float *ptr, uint64_t n, uint64_t k, Ovl__BufRef *ref,
                                uint64_t *ret_ld)
{
    uint64_t r, c;
    if (ovl_scale_shape(mode, 1, n, k, &r, &c) != OVL_OK)
        return fail(cl, OVL_ERR_INVALID, "%s: scale mode %d is not one of B's", name, (int)mode);
    *ret_ld = c;
    return bufref(cl, name, ptr, r, c, c, sizeof(float), ref);
}

static ovl_status_t scaled_begin(ovl_client_t *cl, ovl_dtype_t dtype, const ovl_scaling_t *sc,
                                 int transb, uint64_t m, uint64_t n, uint64_t k,
                                 uint64_t block_rows, scaled_bufs_t *x, size_t *ret_belem,
                                 size_t *ret_celem)
{
    ovl_status_t st;
    *ret_belem = *ret_celem = ovl_dtype_size(dtype);
    ovl__scaling__init(&x->w);
    x->given[0] = x->given[1] = x->given[2] = false;
    if (!sc)
        return ovl_dtype_is_fp8(dtype)
                   ? fail(cl, OVL_ERR_INVALID,
                          "dtype %s needs scaling (ovl_scaling_t): its scales and output dtype",
                          ovl_dtype_name(dtype))
                   : OVL_OK;
    if (!ovl_dtype_is_fp8(dtype))
        return fail(cl, OVL_ERR_INVALID, "scaling is for the fp8 dtypes; dtype %s is not one",
                    ovl_dtype_name(dtype));
    if (!(cl->features & OVL_FEATURE_FP8))
        return fail(cl, OVL_ERR_VERSION, "ovld %s runs no scaled (fp8) ops", cl->info.version);
    /* unsigned: an enum may be signed, and a negative value is unknown */
    const char *why =
        ovl_scaling_refusal((unsigned)dtype, (unsigned)sc->b_dtype, (unsigned)sc->out_dtype,
                            (unsigned)sc->a_mode, (unsigned)sc->b_mode, transb != 0);
    if (!why)
        why = ovl_scaling_shape_refusal(sc->a_mode, sc->b_mode, block_rows, n);
    if (why)
        return fail(cl, OVL_ERR_INVALID,
                    "%s (b_dtype %d, out_dtype %d, scale modes %d/%d, rows %" PRIu64 ", n %" PRIu64
                    ")",
                    why, (int)sc->b_dtype, (int)sc->out_dtype, (int)sc->a_mode, (int)sc->b_mode,
                    block_rows, n);
    uint64_t ar, ac;
    (void)ovl_scale_shape(sc->a_mode, 0, m, k, &ar, &ac); /* a mode of A's: checked above */
    if ((st = bufref(cl, "a_scale", sc->a_scale, ar, ac, ac, sizeof(float), &x->refs[0])) !=
            OVL_OK ||
        (st = b_scale_ref(cl, "b_scale", sc->b_mode, sc->b_scale, n, k, &x->refs[1], &x->ld[1])) !=
            OVL_OK ||
        (sc->bias && (st = bufref(cl, "bias", sc->bias, 1, n, n, ovl_dtype_size(sc->out_dtype),
                                  &x->refs[2])) != OVL_OK))
        return st;
    x->given[0] = x->given[1] = true;
    x->given[2] = sc->bias != NULL;
    x->ld[0] = ac; /* dense: a row of A's scales */
    x->ld[2] = n;
    x->w.b_dtype = (uint64_t)sc->b_dtype;
    x->w.out_dtype = (uint64_t)sc->out_dtype;
    x->w.a_mode = (uint64_t)sc->a_mode;
    x->w.b_mode = (uint64_t)sc->b_mode;
    x->w.fast_accum = sc->fast_accum != 0;
    *ret_belem = ovl_dtype_size(sc->b_dtype);
    *ret_celem = ovl_dtype_size(sc->out_dtype);
    return OVL_OK;
}

/* The scaled op's buffers x gave, appended to bufs/pbufs at *n. */
static void scaled_add(scaled_bufs_t *x, Ovl__OpBuf *bufs, Ovl__OpBuf **pbufs, size_t *n)
{
    static const uint64_t slots[3] = {SLOT_A_SCALE, SLOT_B_SCALE, SLOT_BIAS};
    for (int i = 0; i < 3; i++) {
        if (!x->given[i])
            continue;
        ovl__op_buf__init(&bufs[*n]);
        bufs[*n].slot = slots[i];
        bufs[*n].ref = &x->refs[i];
        bufs[*n].ld = x->ld[i];
        pbufs[*n] = &bufs[*n];
        (*n)++;
    }
}

OVL_API ovl_status_t ovl_allgather_gemm(ovl_comm_t *cm, const ovl_ag_gemm_desc_t *d, void *stream)
{
    if (!cm)
        return OVL_ERR_INVALID;
    ovl_client_t *cl = cm->cl;
    ovl_status_t st =
        op_begin(cm, "ovl_allgather_gemm", OVL_OP_AG_GEMM, d, d ? d->dtype : OVL_DTYPE_BF16,
                 d ? d->algo : OVL_ALGO_AUTO, d ? d->m : 1, d ? d->n : 1, d ? d->k : 1, stream);
    if (st != OVL_OK)
        return st;
    size_t elem = ovl_dtype_size(d->dtype);
    uint64_t rows_all;
    if (__builtin_mul_overflow(d->m, (uint64_t)cm->world, &rows_all))
        return fail(cl, OVL_ERR_INVALID, "m * world overflows");
    uint32_t nb = d->nb ? d->nb : 1;
    if (nb > OVL_MAX_BS)
        return fail(cl, OVL_ERR_INVALID, "nb %u: an op takes at most %d Bs", nb, OVL_MAX_BS);
    if (nb > 1 && !d->more_bs)
        return fail(cl, OVL_ERR_INVALID, "nb %u but more_bs is NULL", nb);
    if (nb > 1 && !(cl->features & OVL_FEATURE_MULTI_B))
        return fail(cl, OVL_ERR_VERSION, "ovld %s takes one B per op, not %u", cl->info.version,
                    nb);
    scaled_bufs_t sx;
    size_t belem, celem;
    if ((st = scaled_begin(cl, d->dtype, d->scaling, d->transb, d->m, d->n, d->k, d->m, &sx, &belem,
                           &celem)) != OVL_OK)
        return st;

    Ovl__BufRef a, b, c, aout;
    if ((st = bufref(cl, "a", d->a, d->m, d->k, d->lda, elem, &a)) != OVL_OK ||
        (st = bufref(cl, "b", d->b, d->transb ? d->n : d->k, d->transb ? d->k : d->n, d->ldb, belem,
                     &b)) != OVL_OK ||
        (st = bufref(cl, "c", d->c, rows_all, d->n, d->ldc, celem, &c)) != OVL_OK ||
        (d->a_out &&
         (st = bufref(cl, "a_out", d->a_out, rows_all, d->k, d->lda_out, elem, &aout)) != OVL_OK))
        return st;
    /* The op's buffers in their slots (proto/ovl.proto, Op): a 0, b 1, c 2,
     * a_out 3, B i 3 + i, C i 10 + i, a scaled op's a_scale 18, b_scale 19,
     * bias 20, B i's b_scale 20 + i and bias 27 + i */
    enum { SLOTS = 4 + 2 * (OVL_MAX_BS - 1) + 3 + 2 * (OVL_MAX_BS - 1) };
    Ovl__OpBuf bufs[SLOTS], *pbufs[SLOTS];
    size_t nbufs = 0;
#define ADD_BUF(slot_, ref_, ld_)                                                                  \
    do {                                                                                           \
        ovl__op_buf__init(&bufs[nbufs]);                                                           \
        bufs[nbufs].slot = (slot_);                                                                \
        bufs[nbufs].ref = (ref_);                                                                  \
        bufs[nbufs].ld = (ld_);                                                                    \
        pbufs[nbufs] = &bufs[nbufs];                                                               \
        nbufs++;                                                                                   \
    } while (0)
    ADD_BUF(0, &a, d->lda);
    ADD_BUF(1, &b, d->ldb);
    ADD_BUF(2, &c, d->ldc);
    if (d->a_out)
        ADD_BUF(3, &aout, d->lda_out);
    /* B i and C i, i >= 1: registered and checked as B and C are; a
     * scaled op's B i's scales and bias as B 0's (every B has a bias, or
     * none does) */
    Ovl__BufRef mb[OVL_MAX_BS - 1], mc[OVL_MAX_BS - 1], ms[OVL_MAX_BS - 1], mbias[OVL_MAX_BS - 1];
    uint64_t more_n[OVL_MAX_BS - 1];
    const ovl_scaling_t *sc = d->scaling;
    for (uint32_t i = 1; i < nb; i++) {
        const ovl_ag_gemm_b_t *x = &d->more_bs[i - 1];
        char bn[8], cn[8], sn[16], biasn[16];
        snprintf(bn, sizeof(bn), "b%u", i);
        snprintf(cn, sizeof(cn), "c%u", i);
        snprintf(sn, sizeof(sn), "b_scale%u", i);
        snprintf(biasn, sizeof(biasn), "bias%u", i);
        if (x->n == 0)
            return fail(cl, OVL_ERR_INVALID, "n of B %u must be positive", i);
        if ((st = bufref(cl, bn, x->b, d->transb ? x->n : d->k, d->transb ? d->k : x->n, x->ldb,
                         belem, &mb[i - 1])) != OVL_OK ||
            (st = bufref(cl, cn, x->c, rows_all, x->n, x->ldc, celem, &mc[i - 1])) != OVL_OK)
            return st;
        ADD_BUF(3 + i, &mb[i - 1], x->ldb);
        ADD_BUF(10 + i, &mc[i - 1], x->ldc);
        more_n[i - 1] = x->n;
        if (!sc)
            continue;
        uint64_t bc = 0;
        /* B i's n takes A's modes as B 0's does */
        const char *why = ovl_scaling_shape_refusal(sc->a_mode, sc->b_mode, d->m, x->n);
        if (why)
            return fail(cl, OVL_ERR_INVALID, "B %u: %s (n %" PRIu64 ")", i, why, x->n);
        if ((x->bias != NULL) != (sc->bias != NULL))
            return fail(cl, OVL_ERR_INVALID,
                        "B %u has %s bias and B 0 %s: a scaled op's Bs have a bias each, or none",
                        i, x->bias ? "a" : "no", sc->bias ? "has one" : "has none");
        if ((st = b_scale_ref(cl, sn, sc->b_mode, x->b_scale, x->n, d->k, &ms[i - 1], &bc)) !=
                OVL_OK ||
            (x->bias && (st = bufref(cl, biasn, x->bias, 1, x->n, x->n,
                                     ovl_dtype_size(sc->out_dtype), &mbias[i - 1])) != OVL_OK))
            return st;
        ADD_BUF(SLOT_B_SCALE1 + i - 1, &ms[i - 1], bc);
        if (x->bias)
            ADD_BUF(SLOT_BIAS1 + i - 1, &mbias[i - 1], x->n);
    }
#undef ADD_BUF
    scaled_add(&sx, bufs, pbufs, &nbufs);

    Ovl__AgGemmParams g = OVL__AG_GEMM_PARAMS__INIT;
    g.m = d->m;
    g.n = d->n;
    g.k = d->k;
    g.dtype = (uint64_t)d->dtype;
    g.algo = (uint64_t)d->algo;
    g.chunks = d->chunks;
    g.streams = d->streams;
    g.transb = d->transb != 0;
    g.n_more_n = nb - 1;
    g.more_n = nb > 1 ? more_n : NULL;
    g.scaling = d->scaling ? &sx.w : NULL;
    Ovl__Op op = OVL__OP__INIT;
    op.comm_id = cm->id;
    op.seq = __atomic_load_n(&cm->seq, __ATOMIC_RELAXED) + 1;
    op.kind = OVL__OP_KIND__OP_KIND_AG_GEMM;
    op.n_bufs = nbufs;
    op.bufs = pbufs;
    op.ag_gemm = &g;
    return submit_op(cm, &op, stream);
}

OVL_API ovl_status_t ovl_gemm_reduce_scatter(ovl_comm_t *cm, const ovl_gemm_rs_desc_t *d,
                                             void *stream)
{
    if (!cm)
        return OVL_ERR_INVALID;
    ovl_client_t *cl = cm->cl;
    ovl_status_t st =
        op_begin(cm, "ovl_gemm_reduce_scatter", OVL_OP_GEMM_RS, d, d ? d->dtype : OVL_DTYPE_BF16,
                 d ? d->algo : OVL_ALGO_AUTO, d ? d->m : 1, d ? d->n : 1, d ? d->k : 1, stream);
    if (st != OVL_OK)
        return st;
    if ((unsigned)d->reduce_op >= OVL_REDUCE_OP_COUNT)
        return fail(cl, OVL_ERR_INVALID, "unknown reduce_op %d", (int)d->reduce_op);
    if (d->m % cm->world != 0)
        return fail(cl, OVL_ERR_INVALID,
                    "m %llu is not a multiple of the world %u: each rank keeps m / world rows of "
                    "the sum",
                    (unsigned long long)d->m, cm->world);
    size_t elem = ovl_dtype_size(d->dtype), belem, celem;
    scaled_bufs_t sx;
    /* a GEMM's rows: a block of the output's */
    if ((st = scaled_begin(cl, d->dtype, d->scaling, d->transb, d->m, d->n, d->k, d->m / cm->world,
                           &sx, &belem, &celem)) != OVL_OK)
        return st;
    Ovl__BufRef a, b, c;
    if ((st = bufref(cl, "a", d->a, d->m, d->k, d->lda, elem, &a)) != OVL_OK ||
        (st = bufref(cl, "b", d->b, d->transb ? d->n : d->k, d->transb ? d->k : d->n, d->ldb, belem,
                     &b)) != OVL_OK ||
        (st = bufref(cl, "c", d->c, d->m / cm->world, d->n, d->ldc, celem, &c)) != OVL_OK)
        return st;
    /* its buffers in their slots (proto/ovl.proto, GemmRsParams): a 0, b 1,
     * c 2, a scaled op's a_scale 18, b_scale 19, bias 20 */
    Ovl__OpBuf bufs[6], *pbufs[6];
    size_t nbufs = 3;
    const Ovl__BufRef *refs[3] = {&a, &b, &c};
    const size_t lds[3] = {d->lda, d->ldb, d->ldc};
    for (int i = 0; i < 3; i++) {
        ovl__op_buf__init(&bufs[i]);
        bufs[i].slot = (uint64_t)i;
        bufs[i].ref = (Ovl__BufRef *)refs[i];
        bufs[i].ld = lds[i];
        pbufs[i] = &bufs[i];
    }
    Ovl__GemmRsParams g = OVL__GEMM_RS_PARAMS__INIT;
    g.m = d->m;
    g.n = d->n;
    g.k = d->k;
    g.dtype = (uint64_t)d->dtype;
    g.algo = (uint64_t)d->algo;
    g.chunks = d->chunks;
    g.streams = d->streams;
    g.transb = d->transb != 0;
    g.reduce_op = (uint64_t)d->reduce_op;
    g.scaling = d->scaling ? &sx.w : NULL;
    scaled_add(&sx, bufs, pbufs, &nbufs);
    Ovl__Op op = OVL__OP__INIT;
    op.comm_id = cm->id;
    op.seq = __atomic_load_n(&cm->seq, __ATOMIC_RELAXED) + 1;
    op.kind = OVL__OP_KIND__OP_KIND_GEMM_RS;
    op.n_bufs = nbufs;
    op.bufs = pbufs;
    op.gemm_rs = &g;
    return submit_op(cm, &op, stream);
}

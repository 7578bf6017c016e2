/*
 * listen.c: the listening socket: bound here (replacing a stale socket
 * file, never a live one) or passed by systemd, accepted from with the
 * peer's credentials, and the accept backoff when ovld runs out of
 * descriptors. What to do with a connection is conn.c's (ovld_conn_accept).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"
#include "listen.h"
#include "log.h"
#include "sdnotify.h"

static void on_accept(uv_poll_t *h, int status, int events);

static void on_accept_resume(uv_timer_t *t)
{
    ovld_t *d = t->data;
    if (!d->listening || !d->listen_paused)
        return;
    d->listen_paused = false;
    int rc = uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
    if (rc != 0)
        log_error("listening socket: uv_poll_start: %s", uv_strerror(rc));
}

/* Out of descriptors (EMFILE/ENFILE). Accepting nothing would leave the
 * socket readable and the loop spinning, so: close the spare descriptor,
 * accept the connection and close it at once (its client sees the
 * connection closed, with an Error if one fits), then take the spare again
 * (libuv's idiom). Without a spare, stop watching the socket for a moment.
 * Logged once an episode, at its start and its end. */
static void accept_starved(ovld_t *d, int err)
{
    if (!d->fd_starved) {
        d->fd_starved = true;
        d->fd_refused = 0;
        log_error("accept: %s: refusing connections until ovld has descriptors again "
                  "(LimitNOFILE, or clients holding too many connections)",
                  strerror(err));
    }
    if (d->spare_fd >= 0) {
        close(d->spare_fd);
        d->spare_fd = -1;
        int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            d->fd_refused++;
            OVLD_COUNT(&d->counters, conns_refused, 1);
            ovld_refuse_fd(fd, OVL_ERR_LIMIT, "ovld is out of file descriptors");
        }
        d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (d->spare_fd >= 0)
            return;
    }
    if (!d->listen_paused) {
        d->listen_paused = true;
        uv_poll_stop(&d->listen_poll);
        uv_timer_start(&d->accept_timer, on_accept_resume, 100, 0);
    }
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    ovld_t *d = h->data;
    (void)events;
    if (status < 0) {
        log_error("listening socket: %s", uv_strerror(status));
        return;
    }
    int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
            accept_starved(d, e);
        else if (e != EAGAIN && e != EINTR && e != ECONNABORTED)
            log_error("accept: %s", strerror(e));
        return;
    }
    if (d->fd_starved) {
        d->fd_starved = false;
        log_warn("accepting connections again (%" PRIu64 " refused for want of descriptors)",
                 d->fd_refused);
    }
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0) {
        log_error("SO_PEERCRED: %s", strerror(errno));
        close(fd);
        return;
    }
    ovld_conn_accept(d, fd, &uc);
}

/* ------------------------------------------------------------ listening */

/* Binds a fresh socket at path. A stale socket file is replaced; a live one
 * (another ovld answering) or any other file is an error. */
static ovl_status_t bind_socket(ovld_t *d, char *err, size_t errlen)
{
    const char *path = d->cfg.socket_path;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "socket path too long: %s", path);
        return OVL_ERR_CONFIG;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "%s exists and is not a socket", path);
            return OVL_ERR_EXISTS;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            close(probe);
            snprintf(err, errlen, "another daemon is listening on %s", path);
            return OVL_ERR_EXISTS;
        }
        if (probe >= 0)
            close(probe);
        if (unlink(path) != 0) {
            snprintf(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(errno));
            return OVL_ERR_SYSTEM;
        }
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return OVL_ERR_SYSTEM;
    }
    /* Create it with no access, then open it up: no window where others
     * could connect with looser permissions. */
    mode_t old = umask(0777);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int bind_errno = errno;
    umask(old);
    if (rc != 0) {
        snprintf(err, errlen, "bind %s: %s", path, strerror(bind_errno));
        close(fd);
        return OVL_ERR_SYSTEM;
    }
    if (d->cfg.socket_group[0]) {
        struct group *g = getgrnam(d->cfg.socket_group);
        if (!g) {
            snprintf(err, errlen, "socket_group '%s' does not exist", d->cfg.socket_group);
            goto fail;
        }
        if (chown(path, (uid_t)-1, g->gr_gid) != 0) {
            snprintf(err, errlen, "chown %s to group %s: %s", path, d->cfg.socket_group,
                     strerror(errno));
            goto fail;
        }
    }
    if (chmod(path, d->cfg.socket_mode) != 0) {
        snprintf(err, errlen, "chmod %s: %s", path, strerror(errno));
        goto fail;
    }
    if (listen(fd, 128) != 0) {
        snprintf(err, errlen, "listen %s: %s", path, strerror(errno));
        goto fail;
    }
    d->listen_fd = fd;
    d->listen_owned = true;
    return OVL_OK;
fail:
    close(fd);
    unlink(path);
    return OVL_ERR_SYSTEM;
}

ovl_status_t ovld_listen_start(ovld_t *d, char *err, size_t errlen)
{
    int fd = -1;
    ovl_status_t st = ovld_sd_listen_fd(&fd, err, errlen);
    if (st != OVL_OK)
        return st;
    if (fd >= 0) {
        d->listen_fd = fd;
        d->listen_owned = false;
        /* Report the path systemd listens on, not the configured one. */
        struct sockaddr_un sa;
        socklen_t sl = sizeof(sa);
        if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sun_family == AF_UNIX &&
            sl > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] != '\0') {
            size_t n = sl - offsetof(struct sockaddr_un, sun_path);
            if (n >= sizeof(d->cfg.socket_path))
                n = sizeof(d->cfg.socket_path) - 1;
            memcpy(d->cfg.socket_path, sa.sun_path, n);
            d->cfg.socket_path[n] = '\0';
        }
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
            snprintf(err, errlen, "socket from systemd: fcntl: %s", strerror(errno));
            return OVL_ERR_SYSTEM;
        }
        log_info("listening on %s, passed by systemd", d->cfg.socket_path);
    } else {
        st = bind_socket(d, err, errlen);
        if (st != OVL_OK)
            return st;
        log_info("listening on %s", d->cfg.socket_path);
    }
    ovld_server_apply_config(d);
    d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (d->spare_fd < 0)
        log_warn("cannot open a spare descriptor: %s", strerror(errno));
    int rc = uv_timer_init(d->loop, &d->accept_timer);
    if (rc == 0)
        rc = uv_poll_init(d->loop, &d->listen_poll, d->listen_fd);
    if (rc == 0)
        rc = uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
    if (rc != 0) {
        snprintf(err, errlen, "uv_poll on the socket: %s", uv_strerror(rc));
        return OVL_ERR_SYSTEM;
    }
    d->accept_timer.data = d;
    d->listen_poll.data = d;
    d->listening = true;
    return OVL_OK;
}

static void on_listen_closed(uv_handle_t *h)
{
    ovld_t *d = h->data;
    close(d->listen_fd);
    d->listen_fd = -1;
}

void ovld_server_apply_config(ovld_t *d)
{
    d->max_mappings = d->cfg.max_mappings;
    if (d->max_mappings != OVLD_MAX_MAPPINGS_AUTO)
        return;
    /* Half of the kernel's limit: the rest is ovld's own (libraries,
     * thread stacks, malloc arenas, CUDA's mappings). */
    unsigned long max = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
    if (f) {
        if (fscanf(f, "%lu", &max) != 1)
            max = 65530;
        fclose(f);
    }
    max /= 2;
    d->max_mappings = max < 1 ? 1 : max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
}

void ovld_listen_stop(ovld_t *d)
{
    if (!d->listening)
        return;
    d->listening = false;
    uv_poll_stop(&d->listen_poll);
    uv_close((uv_handle_t *)&d->listen_poll, on_listen_closed);
    uv_timer_stop(&d->accept_timer);
    uv_close((uv_handle_t *)&d->accept_timer, NULL);
    if (d->spare_fd >= 0) {
        close(d->spare_fd);
        d->spare_fd = -1;
    }
    if (d->listen_owned && unlink(d->cfg.socket_path) != 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", d->cfg.socket_path, strerror(errno));
}

/*
 * sdnotify.c: see sdnotify.h. The protocols are documented in sd_notify(3)
 * and sd_listen_fds(3); both are stable interfaces of systemd.
 *
 * Why not libsystemd's sd_notify and sd_listen_fds: systemd documents both
 * protocols for reimplementation (sd_notify(3) ships a self-contained
 * example for programs that do not link libsystemd), what ovld needs of
 * them is one datagram and two environment variables, and ovld runs where
 * libsystemd is not installed at all: under Slurm or by hand on nodes
 * without systemd, and on the GPU machines, whose builds carry every
 * library as an unpacked Debian package. Linking libsystemd would buy
 * nothing there but a dependency.
 */
#include "sdnotify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SD_LISTEN_FDS_START 3

int ovld_sd_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0])
        return 0;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
        return -EINVAL;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract namespace */
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    int e = errno;
    close(fd);
    return n < 0 ? -e : 1;
}

static int parse_pid_env(const char *name, long *ret)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0)
        return -1;
    *ret = v;
    return 1;
}

ovl_status_t ovld_sd_listen_fd(int *ret_fd, char *err, size_t errlen)
{
    long pid = 0, nfds = 0;
    *ret_fd = -1;
    int a = parse_pid_env("LISTEN_PID", &pid);
    int b = parse_pid_env("LISTEN_FDS", &nfds);
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (a <= 0 || b <= 0 || pid != (long)getpid() || nfds == 0)
        return OVL_OK; /* not for us */
    if (nfds != 1) {
        snprintf(err, errlen, "systemd passed %ld sockets; ovld takes exactly one", nfds);
        return OVL_ERR_CONFIG;
    }
    int fd = SD_LISTEN_FDS_START;
    struct stat st;
    int type = 0;
    socklen_t tl = sizeof(type);
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) {
        snprintf(err, errlen, "the descriptor passed by systemd is not a stream socket");
        return OVL_ERR_CONFIG;
    }
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
        snprintf(err, errlen, "fcntl on the passed socket: %s", strerror(errno));
        return OVL_ERR_SYSTEM;
    }
    *ret_fd = fd;
    return OVL_OK;
}

uint64_t ovld_sd_watchdog_usec(void)
{
    long pid = 0;
    if (parse_pid_env("WATCHDOG_PID", &pid) > 0 && pid != (long)getpid())
        return 0;
    const char *s = getenv("WATCHDOG_USEC");
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return 0;
    return v;
}

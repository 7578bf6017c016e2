/*
 * gpu_daemon.c: see gpu_daemon.h.
 */
#include "gpu_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

void gpu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The last 4096 bytes of the log, as they are. */
static void print_tail(FILE *f)
{
    static char buf[4097];
    long at = 0;
    if (fseek(f, 0, SEEK_END) == 0 && (at = ftell(f)) > 4096)
        at -= 4096;
    else
        at = 0;
    fseek(f, at, SEEK_SET);
    size_t got = fread(buf, 1, sizeof(buf) - 1, f);
    buf[got] = '\0';
    fprintf(stderr, "---- ovld log (last %zu bytes) ----\n%s---- end of ovld log ----\n", got, buf);
}

/* The log without its debug lines (the ops issued), at most 200 lines: what
 * a failure needs, a stall report's stack included. */
static void print_no_debug(FILE *f)
{
    char line[1024];
    int n = 0;
    fprintf(stderr, "---- ovld log (debug lines left out) ----\n");
    while (fgets(line, sizeof(line), f) && n < 200)
        if (!strstr(line, " debug: ")) {
            fputs(line, stderr);
            n++;
        }
    fprintf(stderr, "---- end of ovld log ----\n");
}

void gpu_daemon_print_log(const gpu_daemon_t *d, gpu_log_style_t style)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    if (style == GPU_LOG_NO_DEBUG)
        print_no_debug(f);
    else
        print_tail(f);
    fclose(f);
}

bool gpu_daemon_log_has(const gpu_daemon_t *d, const char *what)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

static bool can_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

int gpu_daemon_start(gpu_daemon_t *d, const char *tag, const char *config_text,
                     gpu_log_style_t log_style)
{
    memset(d, 0, sizeof(*d));
    d->log_style = log_style;
    int len = snprintf(d->dir, sizeof(d->dir), "/tmp/ovl-%s-XXXXXX", tag);
    if (len < 0 || (size_t)len >= sizeof(d->dir)) {
        fprintf(stderr, "FAIL: the directory name for \"%s\" is too long\n", tag);
        d->dir[0] = '\0';
        return 1;
    }
    if (!mkdtemp(d->dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(d->sock, sizeof(d->sock), "%s/ovld.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/ovld.log", d->dir);
    snprintf(d->conf, sizeof(d->conf), "%s/ovld.conf", d->dir);
    FILE *cf = fopen(d->conf, "w");
    bool written = cf && fputs(config_text, cf) >= 0;
    if (cf && fclose(cf) != 0)
        written = false;
    if (!written) {
        perror("writing ovld.conf");
        return 1;
    }
    const char *bin = getenv("OVLD_BIN");
    if (!bin || !*bin)
        bin = "ovld";
    int lfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (lfd < 0) {
        perror("creating ovld.log");
        return 1;
    }
    fflush(stdout);
    fflush(stderr);
    d->pid = fork();
    if (d->pid < 0) {
        perror("fork");
        d->pid = 0;
        close(lfd);
        return 1;
    }
    if (d->pid == 0) {
        dup2(lfd, STDOUT_FILENO);
        dup2(lfd, STDERR_FILENO);
        execlp(bin, bin, "--foreground", "--backend", "cuda", "--socket", d->sock, "--config",
               d->conf, "--log-level", "debug", (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(lfd);
    double deadline = ovl_mono_s() + GPU_DAEMON_START_LIMIT_S;
    while (ovl_mono_s() < deadline) {
        int ws;
        if (waitpid(d->pid, &ws, WNOHANG) == d->pid) {
            d->pid = 0;
            if (gpu_daemon_log_has(d, "cannot start the cuda backend")) {
                printf("SKIP: ovld cannot start the CUDA backend (no usable GPU)\n");
                gpu_daemon_print_log(d, d->log_style);
                return GPU_SKIP_CODE;
            }
            fprintf(stderr, "FAIL: ovld (%s) exited early (status 0x%x)\n", bin, ws);
            gpu_daemon_print_log(d, d->log_style);
            return 1;
        }
        if (can_connect(d->sock))
            return 0;
        gpu_sleep_ms(20);
    }
    fprintf(stderr, "FAIL: ovld did not listen within %.0f s\n", GPU_DAEMON_START_LIMIT_S);
    gpu_daemon_print_log(d, d->log_style);
    return 1;
}

bool gpu_daemon_stop(gpu_daemon_t *d)
{
    if (d->pid <= 0)
        return true;
    kill(d->pid, SIGTERM);
    double deadline = ovl_mono_s() + GPU_DAEMON_STOP_LIMIT_S;
    int ws = 0;
    pid_t got = 0;
    while ((got = waitpid(d->pid, &ws, WNOHANG)) == 0 && ovl_mono_s() < deadline)
        gpu_sleep_ms(20);
    if (got != d->pid) {
        fprintf(stderr, "FAIL: ovld did not stop within %.0f s of SIGTERM\n",
                GPU_DAEMON_STOP_LIMIT_S);
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &ws, 0);
        d->pid = 0;
        return false;
    }
    d->pid = 0;
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        fprintf(stderr, "FAIL: ovld ended with status 0x%x after SIGTERM (want exit 0)\n", ws);
        return false;
    }
    return true;
}

void gpu_daemon_cleanup(gpu_daemon_t *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
    if (d->dir[0] == '\0')
        return; /* nothing was made */
    unlink(d->sock);
    unlink(d->log);
    unlink(d->conf);
    rmdir(d->dir);
}

int gpu_run_rank(int (*rank_main)(int fd), double limit_s, gpu_rank_result_t *ret)
{
    *ret = (gpu_rank_result_t){.code = -1};
    int p[2]; /* the rank's counts */
    if (pipe(p) != 0) {
        perror("pipe");
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        _exit(rank_main(p[1]));
    }
    close(p[1]);

    double t0 = ovl_mono_s(), deadline = t0 + limit_s;
    for (;;) {
        int ws;
        pid_t got = waitpid(pid, &ws, WNOHANG);
        if (got < 0 && errno != EINTR) {
            perror("waitpid");
            break;
        }
        if (got == pid) {
            ret->code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
            break;
        }
        if (ovl_mono_s() > deadline) {
            fprintf(stderr, "FAIL: the rank still running after %.0f s: killed\n",
                    ovl_mono_s() - t0);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            ret->code = 128 + SIGKILL;
            ret->timed_out = true;
            break;
        }
        gpu_sleep_ms(20);
    }

    char buf[64] = "";
    ssize_t got = 0, n;
    while (got < (ssize_t)sizeof(buf) - 1 &&
           (n = read(p[0], buf + got, sizeof(buf) - 1 - (size_t)got)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        got += n;
    }
    close(p[0]);
    ret->counted = sscanf(buf, "%d %d", &ret->passed, &ret->failed) == 2;
    return 0;
}

int gpu_rank_report(int fd, int rc, int passed, int failed)
{
    if (rc == 1 && failed == 0)
        failed++; /* a setup step failed */
    if (rc != GPU_SKIP_CODE) {
        char line[64];
        int len = snprintf(line, sizeof(line), "%d %d\n", passed, failed);
        if (write(fd, line, (size_t)len) != len)
            perror("writing the counts");
    }
    fflush(stdout);
    fflush(stderr);
    return rc;
}

/*
 * gpu_daemon.h: the ovld of a GPU test (tests/gpu). The test process starts
 * a real ovld as its child, with the CUDA backend, in a temporary directory
 * of its own (mkdtemp):
 *
 *   ovld --foreground --backend cuda --socket <dir>/ovld.sock
 *        --config <dir>/ovld.conf --log-level debug
 *
 * its stdout and stderr in <dir>/ovld.log. The binary is $OVLD_BIN, else
 * "ovld" on the PATH. The host-backend equivalent, for the integration tests,
 * is tests/integration/daemon_fixture.h.
 *
 * Nothing here touches CUDA: the parent process of a GPU test, which starts
 * ovld and forks the rank processes, must never initialize CUDA (a process
 * that did must not fork children that use it). Every wait is bounded.
 * Failures are reported on stderr, as "FAIL: ..." lines or perror's.
 */
#ifndef OVL_TEST_GPU_DAEMON_H
#define OVL_TEST_GPU_DAEMON_H

#include <stdbool.h>
#include <sys/types.h>

#define GPU_SKIP_CODE            77   /* ctest's skip code (SKIP_RETURN_CODE) */
#define GPU_DAEMON_START_LIMIT_S 60.0 /* until the socket accepts */
#define GPU_DAEMON_STOP_LIMIT_S  30.0 /* after SIGTERM, before SIGKILL */

/* How ovld's log is printed (gpu_daemon_print_log). */
typedef enum gpu_log_style {
    GPU_LOG_TAIL,     /* its last 4096 bytes, as they are */
    GPU_LOG_NO_DEBUG, /* its lines without " debug: " (the ops issued), at
                         most 200: a stall report's stack included */
} gpu_log_style_t;

typedef struct gpu_daemon {
    char dir[64];              /* /tmp/ovl-<tag>-XXXXXX, made by mkdtemp */
    char sock[128];            /* <dir>/ovld.sock, for OVL_SOCKET */
    char log[128];             /* <dir>/ovld.log: ovld's stdout and stderr */
    char conf[128];            /* <dir>/ovld.conf */
    pid_t pid;                 /* the child; 0 once reaped (or never started) */
    gpu_log_style_t log_style; /* how gpu_daemon_start prints the log */
} gpu_daemon_t;

/* Sleeps ms milliseconds (nanosleep once: a signal may cut it short). */
void gpu_sleep_ms(int ms);

/*
 * Clears d, makes the directory /tmp/ovl-<tag>-XXXXXX, writes config_text
 * (not NULL) to <dir>/ovld.conf and starts ovld (above), then waits up to
 * GPU_DAEMON_START_LIMIT_S, polling every 20 ms, until its socket accepts a
 * connection. Returns
 *   0              ovld listens on d->sock;
 *   GPU_SKIP_CODE  ovld exited and its log says "cannot start the cuda
 *                  backend": "SKIP: ovld cannot start the CUDA backend (no
 *                  usable GPU)" on stdout, the log (in log_style) on stderr;
 *   1              anything else (it exited, did not listen in time, or a
 *                  step failed), with a message and, once ovld ran, its log.
 * Whatever it returns, gpu_daemon_cleanup(d) is to follow. stdout and
 * stderr are flushed before the fork.
 */
int gpu_daemon_start(gpu_daemon_t *d, const char *tag, const char *config_text,
                     gpu_log_style_t log_style);

/*
 * Stops ovld: SIGTERM, then waits up to GPU_DAEMON_STOP_LIMIT_S (polling
 * every 20 ms), SIGKILL after that. True if it exited 0 in time, or was not
 * running (d->pid 0); false, with a "FAIL: " line, if it had to be killed or
 * ended otherwise. d->pid is 0 afterwards.
 */
bool gpu_daemon_stop(gpu_daemon_t *d);

/* Kills ovld if it still runs (SIGKILL, reaped) and removes the socket, the
 * log, the configuration file and the directory. */
void gpu_daemon_cleanup(gpu_daemon_t *d);

/* Prints ovld's log on stderr, framed by "---- ovld log ... ----" lines, in
 * the given style. Prints nothing if the log cannot be opened. */
void gpu_daemon_print_log(const gpu_daemon_t *d, gpu_log_style_t style);

/* True if a line of ovld's log (lines read 1023 bytes at a time) contains
 * what; false if not, or if the log cannot be opened. */
bool gpu_daemon_log_has(const gpu_daemon_t *d, const char *what);

/* What became of a rank process that gpu_run_rank ran. */
typedef struct gpu_rank_result {
    int code;       /* its exit code (128 + the signal that ended it), -1 if unknown */
    bool timed_out; /* still running after the limit: killed */
    bool counted;   /* it wrote its counts */
    int passed, failed;
} gpu_rank_result_t;

/*
 * Forks a rank process that returns rank_main(fd) as its exit code and
 * writes "PASSED FAILED\n" to fd (GPU_SKIP_CODE: it may write nothing);
 * waits for it up to limit_s, polling every 20 ms, then kills it (SIGKILL,
 * with a "FAIL: " line); reads its counts. 0, or -1 where the pipe or the
 * fork failed (said with perror). stdout and stderr are flushed before the
 * fork.
 */
int gpu_run_rank(int (*rank_main)(int fd), double limit_s, gpu_rank_result_t *ret);

/* The end of a rank's rank_main: a failed setup (rc 1 without a failed
 * check) counts as a failure; the counts go to fd unless the rank skips
 * (rc GPU_SKIP_CODE); stdout and stderr are flushed. Returns rc. */
int gpu_rank_report(int fd, int rc, int passed, int failed);

#endif /* OVL_TEST_GPU_DAEMON_H */

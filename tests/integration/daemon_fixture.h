/*
 * daemon_fixture.h: helpers shared by the C integration tests. A real ovld
 * runs as a child of the test process, on a socket in a temporary directory
 * of its own (mkdtemp), with the host backend; raw connections speak the
 * wire protocol directly (proto/wire.h) to test what libovl never sends.
 *
 * The daemon binary is $OVLD_BIN, else OVLD_BIN_DEFAULT (set with -D).
 * Every wait is bounded. Nothing here uses cmocka's assertions, so the
 * helpers may run in forked children too; failures return -1 (or a
 * raw_result_t) with a message on stderr.
 */
#ifndef OVL_TEST_DAEMON_FIXTURE_H
#define OVL_TEST_DAEMON_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ovl.h"
#include "ovl.pb-c.h"
#include "wire.h"

#define FIXTURE_START_TIMEOUT_MS 5000  /* until the socket accepts */
#define FIXTURE_STOP_TIMEOUT_MS  10000 /* after SIGTERM, before SIGKILL */
#define FIXTURE_REPLY_TIMEOUT_MS 5000  /* default wait for one response */

/* ------------------------------------------------------------- the daemon */

typedef struct test_daemon {
    pid_t pid;        /* the child; 0 once reaped */
    pid_t owner;      /* the test process that started it */
    int exit_status;  /* set by daemon_stop: exit code, or -1 (signal/killed) */
    char dir[64];     /* mkdtemp directory, "" once removed */
    char sock[108];   /* <dir>/ovld.sock */
    char log[128];    /* <dir>/ovld.log: the daemon's stderr and stdout */
    char config[128]; /* <dir>/ovld.conf, "" if started without a file */
} test_daemon_t;

/*
 * Starts ovld --foreground --backend host --socket <dir>/ovld.sock
 * --log-level debug [--config <dir>/ovld.conf] [extra...]. config_text (may be
 * NULL) is written to the configuration file; extra is NULL-terminated (may
 * be NULL). With $OVL_TEST_NOFILE set, ovld runs with that RLIMIT_NOFILE.
 * Returns 0 once the socket accepts a connection (within
 * FIXTURE_START_TIMEOUT_MS); -1 if the daemon exited or did not come up, with
 * its log printed and everything cleaned up.
 */
int daemon_start(test_daemon_t *d, const char *config_text, const char *const *extra);

/* True while the child runs (reaps it, setting exit_status, if it ended). */
bool daemon_running(test_daemon_t *d);

/*
 * SIGTERM, then waits up to FIXTURE_STOP_TIMEOUT_MS; SIGKILL after that.
 * Returns the exit status (0..255), or -1 if it died by a signal or had to be
 * killed; the log is printed unless the status is 0. A daemon already reaped
 * returns its recorded status.
 */
int daemon_stop(test_daemon_t *d);

/* Prints the daemon's log on stderr, framed. */
void daemon_print_log(const test_daemon_t *d);

/* Kills the daemon if it still runs (SIGKILL) and removes the directory. */
void daemon_cleanup(test_daemon_t *d);

/*
 * The daemon still serves: ovl_connect works, reports this daemon's pid, and
 * a Status request is answered. Returns 0, or -1 with a message (and the log).
 */
int daemon_check_alive(test_daemon_t *d);

/* Writes text to <dir>/<name>; the path in ret_path (may be NULL). 0 or -1. */
int daemon_write_file(const test_daemon_t *d, const char *name, const char *text, char *ret_path,
                      size_t pathlen);

/* ------------------------------------------------------- raw connections */

typedef enum raw_result {
    RAW_OK = 0,      /* a response was read */
    RAW_CLOSED = 1,  /* orderly end of stream (read returned 0) */
    RAW_RESET = 2,   /* ECONNRESET */
    RAW_TIMEOUT = 3, /* nothing within the timeout */
    RAW_BAD = 4,     /* a bad frame or an unpackable response */
    RAW_ERROR = 5,   /* a system call failed */
} raw_result_t;

const char *raw_result_name(raw_result_t r);

/* A raw connection: the socket and what was received but not yet taken. */
typedef struct raw_conn {
    int fd;
    uint64_t next_id;
    ovl_wire_reader_t rd;
    ovl_fdq_t fdq; /* descriptors passed by the daemon (doorbells) */
} raw_conn_t;

/* A connected blocking socket (SOCK_CLOEXEC), or -1. */
int raw_connect(const char *path);

/* Connects rc; 0 or -1. */
int raw_open(raw_conn_t *rc, const char *path);
/* Closes the socket and any received descriptors. Accepts a closed one. */
void raw_close(raw_conn_t *rc);

/* Sends all len bytes (MSG_NOSIGNAL); 0 or -1. */
int raw_send(int fd, const void *buf, size_t len);

/* Sends a header announcing len, then body (len bytes; body may be NULL when
 * only the header is wanted: then announced != sent). 0 or -1. */
int raw_send_frame(int fd, uint32_t announced, const void *body, size_t len);

/* Packs q into one frame and sends it with nfds descriptors (not closed:
 * the caller keeps its own). If q->id is 0 and it is not an Op, the next
 * id is assigned. 0 or -1. */
int raw_send_request(raw_conn_t *rc, Ovl__Request *q, const int *fds, unsigned nfds);

/* Reads one Response within timeout_ms (FIXTURE_REPLY_TIMEOUT_MS if <= 0).
 * On RAW_OK free *ret with ovl__response__free_unpacked. */
raw_result_t raw_read_response(raw_conn_t *rc, int timeout_ms, Ovl__Response **ret);

/* Waits for the end of the stream: RAW_CLOSED (or RAW_RESET) when it came
 * with no further frame; RAW_OK if a frame arrived instead (it is dropped). */
raw_result_t raw_expect_closed(raw_conn_t *rc, int timeout_ms);

/* Sends q and reads its response, checking that the ids match. */
raw_result_t raw_call(raw_conn_t *rc, Ovl__Request *q, const int *fds, unsigned nfds,
                      Ovl__Response **ret);

/* A good Hello (protocol OVL_PROTOCOL_VERSION). On RAW_OK with ret non-NULL
 * the HelloReply's Response is returned (free it); RAW_BAD if the answer was
 * not a HelloReply, or announced ovld's pidfd and came without it. The pidfd
 * is closed. */
raw_result_t raw_hello(raw_conn_t *rc, Ovl__Response **ret);

/* ----------------------------------------------------------------- misc */

/* Milliseconds on CLOCK_MONOTONIC. */
uint64_t fixture_now_ms(void);
void fixture_sleep_ms(unsigned ms);

/* Whether this kernel has pidfd_open: ovld then sends its pidfd with the
 * HelloReply, and libovl sees it exit. */
bool fixture_has_pidfd(void);

/*
 * Forks a child that runs fn(d, out, go) and never returns from it (fn
 * ends with _exit): the child reports through out and waits on go until
 * the parent closes its end, so that what it set up stays while the parent
 * looks. In the parent: the child's pid, *ret_out (the read end of out) and
 * *ret_go (the write end of go); -1 on failure. For tests that act as
 * another user (the child drops its privileges itself).
 */
pid_t fixture_fork_child(test_daemon_t *d, void (*fn)(test_daemon_t *d, int out, int go),
                         int *ret_out, int *ret_go);

#endif /* OVL_TEST_DAEMON_FIXTURE_H */

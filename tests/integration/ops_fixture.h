/*
 * ops_fixture.h: what the cmocka tests of jobs and ops against a real ovld
 * (host backend) share (test_join.c, test_ops.c, test_leave.c, test_load.c,
 * test_limits.c): ranks of a job in this process with buffers and exactly
 * checkable data, the daemon's Status, raw connections that join and submit
 * what libovl never sends, and bounded waits. Compiled once into the
 * ovl_fixture library (ops_fixture.c), on top of daemon_fixture.h.
 *
 * Unlike daemon_fixture.h these helpers fail the running cmocka test
 * (fail_msg) where they say so; those not to be called from a forked child
 * are marked "cmocka". Include after cmocka.h.
 */
#ifndef OVL_TEST_OPS_FIXTURE_H
#define OVL_TEST_OPS_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon_fixture.h"

#define TIMEOUT_MS 10000 /* every wait of these tests, and each client's timeout */
#define MAXW       4     /* the largest world of an in-process job */
#define MAXDIM     16    /* m, n, k of every op here are at most this */
#define SLOT_A     (MAXDIM * MAXDIM)
#define SLOT_B     (MAXDIM * MAXDIM)
#define SLOT_C     (MAXW * MAXDIM * MAXDIM)
#define NOBODY     65534 /* the uid and gid a forked child takes to be another user */

#define assert_status(expr, want)                                                                  \
    do {                                                                                           \
        ovl_status_t got_ = (expr);                                                                \
        if (got_ != (want))                                                                        \
            fail_msg("%s returned %s, not %s", #expr, ovl_strerror(got_), ovl_strerror(want));     \
    } while (0)

/* ------------------------------------------------------- ranks and ops */

/* One op's shape; salt varies its data (small integers: every product and
 * sum is exact in fp32, so results are compared for equality). */
typedef struct opspec {
    uint64_t m, n, k;
    int transb;
    bool aout;
    ovl_dtype_t dtype;
    ovl_algo_t algo;
    uint32_t chunks, streams;
    unsigned salt;
    uint32_t pad; /* A's and a_out's leading dimension is k + pad */
} opspec_t;

/* m 4, n 6, k 5, fp32, OVL_ALGO_AUTO. */
extern const opspec_t base_spec;

/* One rank of a job, with nslots slots of buffers (one per op in flight). */
typedef struct rank {
    ovl_client_t *cl;
    ovl_comm_t *comm;
    uint32_t world, rank;
    float *a, *b, *c, *g;
    unsigned nslots;
} rank_t;

/* Connects, joins and allocates; no assertions (children use it too). */
ovl_status_t rank_open_st(test_daemon_t *d, rank_t *rk, const char *job, uint32_t world,
                          uint32_t rank, int device, unsigned nslots, char *msg, size_t msglen);
/* cmocka: the same, failing the test on an error. */
void rank_open(test_daemon_t *d, rank_t *rk, const char *job, uint32_t world, uint32_t rank,
               int device, unsigned nslots);
/* Leaves (ovl_comm_destroy's status is returned) and disconnects. */
ovl_status_t rank_close(rank_t *rk);

/* Fills A and B of a slot with the op's data, C and a_out with NaN. */
void rank_fill(rank_t *rk, unsigned slot, const opspec_t *s);
/* The descriptor of op s on a slot's buffers. */
ovl_ag_gemm_desc_t rank_desc(rank_t *rk, unsigned slot, const opspec_t *s);
ovl_status_t rank_submit(rank_t *rk, unsigned slot, const opspec_t *s);
/* Compares C (and the gathered A) of one op with the exact result; 0 if
 * equal, else -1 with the first difference in msg. */
int rank_verify(const rank_t *rk, unsigned slot, const opspec_t *s, char *msg, size_t msglen);
/* cmocka: rank_check fails the test where rank_verify finds a difference,
 * rank_sync_ok where ovl_comm_synchronize does not return OVL_OK. */
void rank_check(const rank_t *rk, unsigned slot, const opspec_t *s);
void rank_sync_ok(rank_t *rk);

/* cmocka: runs one op on every rank of an in-process job and checks every C. */
void job_run_check(rank_t *rk, uint32_t world, unsigned slot, const opspec_t *s);
/* cmocka: a fresh job of `world` ranks in this process runs one op
 * correctly. The id may be one whose ranks just left: the daemon forgets a
 * job only once the completions of its last ops came back, which a client
 * cannot see, so it waits for that first. */
void fresh_job_works(test_daemon_t *d, const char *job, uint32_t world);

/* ------------------------------------------------- clients and Status */

/* cmocka: a connected client with TIMEOUT_MS. */
ovl_client_t *connect_ok(test_daemon_t *d);
/* cmocka: the daemon's Status (free with libovl_response_free). */
Ovl__Response *status_call(ovl_client_t *cl);
/* Job `id` in a Status, or NULL; find_job_of: the job `id` of uid `owner`
 * (job ids are a namespace per uid). */
const Ovl__JobInfo *find_job(const Ovl__Response *r, const char *id);
const Ovl__JobInfo *find_job_of(const Ovl__Response *r, const char *id, uint32_t owner);
/* cmocka, each bounded by TIMEOUT_MS: until job `id` is gone from the
 * status, has `n` ops in flight, counts `n` ops done (a count kept by the
 * daemon's loop thread, which may learn of a completion after the client
 * saw its doorbell rung). */
void wait_job_gone(ovl_client_t *cl, const char *id);
void wait_job_in_flight(ovl_client_t *cl, const char *id, uint32_t n);
void wait_job_ops_done(ovl_client_t *cl, const char *id, uint64_t n);

/* ---------------------------------------------------- forked children */

/* Bounded wait for a forked child (SIGKILL at the end); its exit status,
 * or -1. */
int wait_child(pid_t pid, int timeout_ms);
/* Reads exactly len bytes from fd within timeout_ms; 0 or -1. */
int read_full(int fd, void *buf, size_t len, int timeout_ms);

/* --------------------------------------------------- raw connections */

/* cmocka: a memfd of `bytes` (sealed against resizing if seal), mapped
 * here too at *ret_map. */
int sealed_memfd(size_t bytes, bool seal, void **ret_map);
/* MemRegister on a raw connection; the response (free it) is returned. */
Ovl__Response *raw_mem_register(raw_conn_t *rc, int fd, uint64_t bytes, uint64_t fd_offset,
                                raw_result_t *ret_res);
/* cmocka: a MemRegister that must succeed; the buffer's id. */
uint64_t raw_mem_register_ok(raw_conn_t *rc, int fd, uint64_t bytes);

struct ovl_doorbell;

/* A raw comm: its id and its mapped doorbell. */
typedef struct raw_comm {
    uint64_t id;
    struct ovl_doorbell *db;
    void *map;
    size_t map_len;
} raw_comm_t;

/* cmocka: CommInit of rank `rank` of `world` on device index `device` of
 * the HelloReply h, which must succeed; raw_join: world 1, rank 0. */
void raw_join2(raw_conn_t *rc, const Ovl__HelloReply *h, const char *job, uint32_t world,
               uint32_t rank, uint32_t device, raw_comm_t *out);
void raw_join(raw_conn_t *rc, const Ovl__HelloReply *h, const char *job, uint32_t device,
              raw_comm_t *out);
void raw_comm_unmap(raw_comm_t *c);
/* cmocka: until the doorbell's done reaches seq (bounded). */
void raw_wait_done(const raw_comm_t *c, uint64_t seq);

/* Layout in the one registration: A (m x k) at 0, B (k x n) at 256, C at 512. */
#define RAW_M 2
#define RAW_N 3
#define RAW_K 4

/* An all-gather + GEMM Op of the wire (proto/ovl.proto) with the storage
 * of its parts: refs[slot] and by_slot[slot] are the buffer in each slot
 * (by_slot NULL: none). It points into itself: not to be copied. */
#define RAW_SLOTS 35
typedef struct raw_op {
    Ovl__Op op;
    Ovl__AgGemmParams g;
    Ovl__OpBuf bufs[RAW_SLOTS], *pbufs[RAW_SLOTS], *by_slot[RAW_SLOTS];
    Ovl__BufRef refs[RAW_SLOTS];
    uint64_t more_n[8];
} raw_op_t;

/* A good naive fp32 op `seq` of comm on buffer mem, in that layout (A in
 * slot 0, B in 1, C in 2). */
void raw_op_init(raw_op_t *o, uint64_t comm, uint64_t seq, uint64_t mem);
/* Puts a buffer in slot (replacing one there): mem at offset, ld. */
void raw_op_buf(raw_op_t *o, uint64_t slot, uint64_t mem, uint64_t offset, uint64_t ld);
/* Takes slot's buffer out. */
void raw_op_drop(raw_op_t *o, uint64_t slot);
/* count more Bs (more_n, each RAW_N) and, up to 7, B i (slot 3 + i, where
 * B is) and C i (slot 10 + i, at 1024 + (i - 1) * 256 of mem). */
void raw_op_more(raw_op_t *o, uint32_t count, uint64_t mem);
/* cmocka: sends op, its data marked ready on c's doorbell first (host
 * mode: the client is the stream) unless c is NULL. */
void raw_submit(raw_conn_t *rc, const raw_comm_t *c, Ovl__Op *op);
/* Packs q as one frame at out; returns its length. */
size_t pack_frame(uint8_t *out, Ovl__Request *q);

#endif /* OVL_TEST_OPS_FIXTURE_H */

/*
 * ovl.h: the public API of libovl, the client library of ovld.
 *
 * ovld runs overlapped all-gather + GEMM ("AG-GEMM") pipelines for the ranks of
 * a tensor-parallel job:  C_r = [A_0; A_1; ...; A_(W-1)] @ B_r.
 *
 * A process connects to the node's ovld (ovl_connect), joins a job as one rank
 * (ovl_comm_init), and submits operations (ovl_allgather_gemm). Submission is
 * asynchronous: the call returns once the request is on the socket. Ordering
 * against the caller is by doorbells: on a GPU the caller's CUDA stream waits
 * for the op's completion; with the host backend the caller waits with
 * ovl_comm_synchronize().
 *
 * Every function returns an ovl_status_t: OVL_OK (0) or a negative code.
 * ovl_strerror() names a code; ovl_last_error() gives the message of the last
 * failure on a client (the daemon's own words where the daemon refused).
 *
 * Threads: one ovl_client_t and the comms made from it may be used by one
 * thread at a time, and not in a child process after fork(). A client with
 * a comm runs one thread of its own, which watches for ovld's death (below);
 * ovl_disconnect ends it. OVL_WATCHER=0 in the environment leaves it out:
 * then only libovl's calls notice ovld's death, and a stream whose
 * application makes no call waits for ever.
 *
 * If ovld dies, no op will ever be done. libovl notices (the socket hangs
 * up: its thread, or any call that finds it so), waits for ovld's process
 * to be gone (at most 10 s), and then releases every wait on the client's
 * comms itself, the CUDA streams' included, so that the application's
 * streams go on instead of waiting for ever; ovl_comm_destroy and
 * ovl_disconnect do it before they let a comm go. The ops not done by then
 * did not compute C: ovl_comm_check says OVL_ERR_CLOSED (unless an earlier
 * op had failed already), and every later call fails.
 */
#ifndef OVL_H
#define OVL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OVL_VERSION_MAJOR  0
#define OVL_VERSION_MINOR  3
#define OVL_VERSION_PATCH  0
#define OVL_VERSION_STRING "0.3.0"

/* The wire protocol's version. A daemon and a client of different protocol
 * versions refuse each other at the handshake, naming both versions. */
#define OVL_PROTOCOL_VERSION 5

/* The node-wide ovld's socket (ovld.service): what a client uses when given
 * none, $OVL_SOCKET is unset and there is no per-user socket (see
 * ovl_default_socket). It is also ovld's own default. */
#define OVL_DEFAULT_SOCKET "/run/ovl/ovld.sock"

typedef enum ovl_status {
    OVL_OK = 0,
    OVL_ERR_INVALID = -1,      /* a bad argument */
    OVL_ERR_NOMEM = -2,        /* out of memory */
    OVL_ERR_SYSTEM = -3,       /* a system call failed (errno in the message) */
    OVL_ERR_PROTOCOL = -4,     /* a malformed, unexpected or out-of-order message */
    OVL_ERR_VERSION = -5,      /* protocol versions differ */
    OVL_ERR_TIMEOUT = -6,      /* no answer in time */
    OVL_ERR_CONNECT = -7,      /* the daemon is unreachable */
    OVL_ERR_CLOSED = -8,       /* the connection was closed */
    OVL_ERR_PERMISSION = -9,   /* not allowed for this user */
    OVL_ERR_NOT_FOUND = -10,   /* no such job, buffer, device or comm */
    OVL_ERR_EXISTS = -11,      /* already there (a rank joined twice) */
    OVL_ERR_LIMIT = -12,       /* a size or quota limit was hit */
    OVL_ERR_MISMATCH = -13,    /* the ranks of a job disagree */
    OVL_ERR_RANGE = -14,       /* a buffer range lies outside its registration */
    OVL_ERR_BACKEND = -15,     /* the backend (CUDA, NCCL, cuBLAS, host) failed */
    OVL_ERR_UNSUPPORTED = -16, /* not supported by this daemon or backend */
    OVL_ERR_ABORTED = -17,     /* the job was aborted (a rank left or failed) */
    OVL_ERR_CONFIG = -18,      /* a bad configuration file */
    OVL_ERR_SHUTDOWN = -19,    /* the daemon is shutting down */
    OVL_ERR_AGAIN = -20,       /* not complete yet; try again */
    OVL_ERR_INTERNAL = -21,    /* a bug: please report it */
} ovl_status_t;

/* The name of a status code, never NULL. */
const char *ovl_strerror(ovl_status_t status);

/* ---------------------------------------------------------------- client */

typedef struct ovl_client ovl_client_t;

/* Which rule of ovl_default_socket picked the socket. */
typedef enum ovl_socket_rule {
    OVL_SOCKET_RULE_ENV = 1,          /* $OVL_SOCKET */
    OVL_SOCKET_RULE_PER_USER = 2,     /* /run/ovl/UID/ovld.sock: ovld@UID.service */
    OVL_SOCKET_RULE_USER_MANAGER = 3, /* $XDG_RUNTIME_DIR/ovl/ovld.sock: ovld-user.service */
    OVL_SOCKET_RULE_NODE = 4,         /* OVL_DEFAULT_SOCKET: the node-wide ovld.service */
} ovl_socket_rule_t;

/*
 * The socket ovl_connect(NULL, ...) connects to: the first of
 *   1. $OVL_SOCKET, if set and not empty (whether or not it exists);
 *   2. /run/ovl/UID/ovld.sock, UID being the caller's effective uid in
 *      decimal: the socket of ovld@UID.service, one ovld per user (GPU nodes
 *      under CUDA MPS, which serves one uid at a time);
 *   3. $XDG_RUNTIME_DIR/ovl/ovld.sock: the socket of ovld-user.service, an
 *      ovld the user runs with `systemctl --user`;
 *   4. OVL_DEFAULT_SOCKET, /run/ovl/ovld.sock: the node-wide ovld.service.
 * 2 and 3 are taken only where the path exists, is a socket, and it and its
 * directory belong to the caller or to root. Nothing is connected to: a
 * socket that exists but whose ovld has died is still chosen (and
 * ovl_connect then fails, naming it and the rule), never skipped for the
 * next. /run/ovl in 2 and 4 is replaced by $OVL_RUNTIME_DIR when that is
 * set: for tests only, ignored in set-user-ID programs.
 *
 * Writes the path, NUL-terminated, to buf (len bytes) and the rule to *rule
 * (rule may be NULL). Returns OVL_OK, or OVL_ERR_INVALID if buf is NULL or
 * the path does not fit in len bytes (then buf holds "" if len > 0).
 * A path that fits in 108 bytes fits a socket address.
 */
ovl_status_t ovl_default_socket(char *buf, size_t len, ovl_socket_rule_t *rule);

/* A short description of a rule ("$OVL_SOCKET", "node-wide default", ...),
 * never NULL. */
const char *ovl_socket_rule_name(ovl_socket_rule_t rule);

/*
 * Connects to ovld and performs the version handshake.
 * path: the socket; NULL or "" means ovl_default_socket's choice.
 * On success *ret_client is set; on failure it is left untouched and
 * ovl_connect_error() says why until the next ovl_connect in this thread
 * (the daemon's words where it refused; for a socket that cannot be
 * connected to, the path tried and, when it was the default, the rule that
 * chose it).
 */
ovl_status_t ovl_connect(const char *path, ovl_client_t **ret_client);

/* The message of the last failed ovl_connect in this thread (never NULL). */
const char *ovl_connect_error(void);

/* Closes the connection; the daemon releases everything this client
 * registered and every comm it held. Accepts NULL. */
void ovl_disconnect(ovl_client_t *client);

/* Timeout in milliseconds for blocking calls on this client (default 30000;
 * 0 or negative: wait forever). */
void ovl_set_timeout(ovl_client_t *client, int timeout_ms);

/* The message of the last failure on this client ("" if none). */
const char *ovl_last_error(const ovl_client_t *client);

/* What the daemon said at the handshake. */
typedef struct ovl_daemon_info {
    uint32_t protocol_version;
    char version[32];
    char backend[16]; /* "host" or "cuda" */
    int32_t pid;
    uint32_t ndevices;
} ovl_daemon_info_t;

ovl_status_t ovl_daemon_info(const ovl_client_t *client, ovl_daemon_info_t *ret_info);

/* ----------------------------------------------------------------- memory */

typedef struct ovl_mem ovl_mem_t;

/*
 * Host backend only: allocates `bytes` of memory shared with ovld (memfd
 * backed, the host analogue of cudaMalloc) and registers it. Returns NULL on
 * failure (see ovl_last_error). Free with ovl_host_free.
 */
void *ovl_host_alloc(ovl_client_t *client, size_t bytes);
ovl_status_t ovl_host_free(ovl_client_t *client, void *ptr);

/*
 * Registers [ptr, ptr+bytes) with ovld, so that ops may name it. Optional: an
 * op registers what it is given on first use and caches it. A range inside
 * memory already registered returns that registration. With the host backend
 * ptr must lie in memory from ovl_host_alloc.
 */
ovl_status_t ovl_mem_register(ovl_client_t *client, void *ptr, size_t bytes, ovl_mem_t **ret_mem);
ovl_status_t ovl_mem_deregister(ovl_client_t *client, ovl_mem_t *mem);

/* ---------------------------------------------------------------- comms */

typedef struct ovl_comm ovl_comm_t;

/*
 * Joins job `job_id` (at most 63 bytes) as rank `rank` of `world`, bound to
 * local device `device`: a CUDA device ordinal, or with the host backend the
 * index of one of the daemon's host devices. The device travels as its UUID.
 * The first rank to join creates the job and makes the caller's uid its owner.
 */
ovl_status_t ovl_comm_init(ovl_client_t *client, const char *job_id, uint32_t world, uint32_t rank,
                           int device, ovl_comm_t **ret_comm);

/*
 * Jobs across nodes, as with NCCL's ncclUniqueId: one rank asks its ovld
 * for a job id (ovl_job_id_create), passes the bytes to the job's other
 * ranks out of band (MPI, torch.distributed, a file), and every rank, the
 * first included, joins with them (ovl_comm_init_id) through the ovld of
 * its own node. The ovld that made the id coordinates the job. Both need
 * ovld's peer_listen (docs/multinode.md). The id is opaque; an id that
 * ovld did not make, or made before it restarted, is refused at the join.
 * ovl_comm_init_id returns once the coordinator admitted the rank (not
 * once every rank joined: the first op waits for them, as with
 * ovl_comm_init).
 */
#define OVL_JOB_ID_BYTES 128

typedef struct ovl_job_id {
    unsigned char bytes[OVL_JOB_ID_BYTES];
} ovl_job_id_t;

/*
 * Asks the client's ovld for a new job id; on OVL_OK *ret_id holds its
 * OVL_JOB_ID_BYTES bytes (an answer of another size is OVL_ERR_PROTOCOL).
 * An ovld without peer_listen refuses with OVL_ERR_UNSUPPORTED.
 */
ovl_status_t ovl_job_id_create(ovl_client_t *client, ovl_job_id_t *ret_id);

/*
 * Joins the job of `id` as rank `rank` of `world`, bound to local device
 * `device` (as ovl_comm_init). libovl refuses a NULL id or ret_comm, world
 * 0 and rank >= world itself (OVL_ERR_INVALID). ovld's refusals, with its
 * words in ovl_last_error: bytes that are not an id of ovld's form:
 * OVL_ERR_INVALID; an id the coordinator did not issue (forged, or made
 * before that ovld restarted): OVL_ERR_NOT_FOUND or OVL_ERR_PERMISSION; a
 * world other than the job's: OVL_ERR_MISMATCH; a rank taken:
 * OVL_ERR_EXISTS; the coordinator not reachable: OVL_ERR_CONNECT or
 * OVL_ERR_TIMEOUT; no peer_listen: OVL_ERR_UNSUPPORTED. The call waits up
 * to the client's timeout (ovl_set_timeout), as ovl_comm_init does.
 */
ovl_status_t ovl_comm_init_id(ovl_client_t *client, const ovl_job_id_t *id, uint32_t world,
                              uint32_t rank, int device, ovl_comm_t **ret_comm);

/* Waits for the comm's ops, leaves the job and frees the comm. Accepts NULL. */
ovl_status_t ovl_comm_destroy(ovl_comm_t *comm);

/* The error of the first failed op on this comm (OVL_OK if none), like
 * ncclCommGetAsyncError; OVL_ERR_CLOSED once ovld died (see above), which
 * it may wait for (up to 10 s). The message is in ovl_last_error. */
ovl_status_t ovl_comm_check(ovl_comm_t *comm);

/* Waits on the host until every op submitted on the comm is done, then
 * returns ovl_comm_check's answer. */
ovl_status_t ovl_comm_synchronize(ovl_comm_t *comm);

/* ------------------------------------------------------------ op kinds */

/* The kinds of op ovld runs, as ovlctl (plan --kind, stats, status) and the
 * JSON of ovl_stats_json and ovl_status_json name them. 0 names none. */
typedef enum ovl_op_kind {
    OVL_OP_AG_GEMM = 1, /* "ag_gemm": C = allgather(A) @ B (ovl_allgather_gemm) */
    OVL_OP_GEMM_RS = 2, /* "gemm_rs": C = reduce_scatter(A @ B) (ovl_gemm_reduce_scatter) */
} ovl_op_kind_t;

/* Not a value: one past the last kind (kept out of the enum, as
 * OVL_DTYPE_COUNT). */
#define OVL_OP_KIND_COUNT (OVL_OP_GEMM_RS + 1)

/* How GEMM + reduce-scatter combines the ranks' partial products. */
typedef enum ovl_reduce_op {
    OVL_REDUCE_SUM = 0,
    OVL_REDUCE_AVG = 1, /* the sum divided by the world */
} ovl_reduce_op_t;
#define OVL_REDUCE_OP_COUNT (OVL_REDUCE_AVG + 1)

/* ------------------------------------------------------------ AG-GEMM */

typedef enum ovl_dtype {
    OVL_DTYPE_BF16 = 0,
    OVL_DTYPE_FP16 = 1,
    OVL_DTYPE_FP32 = 2,
    /* The OCP 8-bit floats (PyTorch's float8_e4m3fn and float8_e5m2):
     * inputs of a scaled op only (ovl_scaling_t), never an output. */
    OVL_DTYPE_FP8_E4M3 = 3, /* "fp8e4m3": 4 exponent bits, no infinities, max 448 */
    OVL_DTYPE_FP8_E5M2 = 4, /* "fp8e5m2": 5 exponent bits, max 57344 */
} ovl_dtype_t;

/* Not a value: the number of values (one past the last, OVL_DTYPE_FP8_E5M2).
 * Kept out of the enum so that switches over ovl_dtype_t stay exhaustive;
 * a new dtype moves it. */
#define OVL_DTYPE_COUNT (OVL_DTYPE_FP8_E5M2 + 1)

/* Whether dtype is one of the 8-bit floats. */
static inline int ovl_dtype_is_fp8(ovl_dtype_t dtype)
{
    return dtype == OVL_DTYPE_FP8_E4M3 || dtype == OVL_DTYPE_FP8_E5M2;
}

/*
 * How a scaled op's fp32 scales map onto its fp8 matrix (docs/plans.md,
 * "Scaled ops (fp8)"). A matrix of r rows and k columns (A: m x k, this
 * rank's; B, given transposed, n x k: r = n) has its scales as a dense
 * row-major fp32 matrix of the shape ovl_scale_shape gives:
 *   OVL_SCALE_TENSOR         1 x 1: one for the matrix
 *   OVL_SCALE_ROW            A: m x 1, one per row; B: 1 x n, one per column
 *                            of op(B) (a row of B as given)
 *   OVL_SCALE_BLOCK_1X128    r x ceil(k/128): one per row and 128 of k,
 *                            scale[i][l / 128] (DeepSeek-V3's activations)
 *   OVL_SCALE_BLOCK_128X128  ceil(r/128) x ceil(k/128): one per 128 x 128
 *                            tile, scale[i / 128][l / 128] (its weights); B
 *                            only
 * Block scales go with block scales: A 1x128 with B 1x128 or 128x128
 * (cuBLASLt's pairs on Hopper; ovl cuts A by rows, so A is never 128x128).
 * The layout is row-major whatever cuBLASLt wants (PyTorch's 1x128 scales
 * are the transpose, outer-dim-major: the Python package converts).
 */
typedef enum ovl_scale_mode {
    OVL_SCALE_TENSOR = 0,
    OVL_SCALE_ROW = 1,
    OVL_SCALE_BLOCK_1X128 = 2,
    OVL_SCALE_BLOCK_128X128 = 3,
} ovl_scale_mode_t;
#define OVL_SCALE_MODE_COUNT (OVL_SCALE_BLOCK_128X128 + 1)
#define OVL_SCALE_BLOCK      128 /* the side of a scale block, in elements */

/* Whether mode is a block scale (1x128 or 128x128). */
static inline int ovl_scale_mode_is_block(ovl_scale_mode_t mode)
{
    return mode == OVL_SCALE_BLOCK_1X128 || mode == OVL_SCALE_BLOCK_128X128;
}

/*
 * What makes an op scaled (fp8): A in the op's dtype and B in b_dtype, both
 * fp8, dequantized by their scales; C in out_dtype (bf16, fp16 or fp32):
 *   C[i][j] = round_out(sa(i) * sb(j) * sum_l A[i][l] op(B)[l][j] + bias[j])
 * sa(i) = a_scale[0] (OVL_SCALE_TENSOR) or a_scale[i] (OVL_SCALE_ROW, i a
 * row of this rank's A), sb(j) likewise with b_scale over op(B)'s n columns;
 * the sum in fp32. Block scales (both operands) scale each 128 of k apart:
 *   C[i][j] = round_out(sum_q sa(i, q) * sb(j, q) * sum_{l in q} A[i][l] op(B)[l][j]
 *                       + bias[j])
 * q the blocks of 128 of k, sa(i, q) = a_scale[i][q], sb(j, q) = b_scale[j][q]
 * (1x128) or b_scale[j / 128][q] (128x128); each block's sum in fp32. Block
 * scales need rows in fours where cuBLASLt lays them out by rows: m (this
 * rank's rows; GEMM + reduce-scatter: each rank's block of the output,
 * m / world) with A 1x128, and every n with B 1x128 (ovl_scaling_refusal).
 * Scales are fp32 in the memory of the op's device (as A);
 * bias, NULL or n elements of out_dtype, is added once per product (GEMM +
 * reduce-scatter: once per rank's partial, as PyTorch's fused scaled op).
 * B must be given transposed (transb: n x k, a Linear weight's layout), the
 * one layout of cuBLASLt's fp8 GEMM. With several Bs (all-gather + GEMM),
 * each B has its own scales and bias (ovl_ag_gemm_b_t) and shares the
 * rest. fast_accum: cuBLASLt's fast fp8
 * accumulation (faster, less accurate; the host backend's sum is the same
 * either way), ignored with block scales (cuBLASLt's block-scaled kernels
 * promote to fp32 at every 128 of k; PyTorch refuses the pair).
 * All-gather + GEMM with OVL_SCALE_TENSOR uses each rank's own a_scale for
 * every gathered row, as PyTorch's fused op does (tensor-wise recipes agree
 * on one scale across ranks); by row or 1x128 the scales are gathered with
 * the rows. Every rank must agree on b_dtype, out_dtype, the modes,
 * fast_accum and whether bias is given.
 */
typedef struct ovl_scaling {
    ovl_dtype_t b_dtype;   /* B's: OVL_DTYPE_FP8_E4M3 or _E5M2 (not both e5m2) */
    ovl_dtype_t out_dtype; /* C's: bf16, fp16 or fp32 */
    ovl_scale_mode_t a_mode, b_mode;
    const float *a_scale; /* A's scales: ovl_scale_shape(a_mode, 0, m, k) */
    const float *b_scale; /* B's: ovl_scale_shape(b_mode, 1, n, k) */
    const void *bias;     /* NULL, or n elements of out_dtype */
    int fast_accum;
} ovl_scaling_t;

typedef enum ovl_algo {
    OVL_ALGO_AUTO = 0,       /* the daemon chooses */
    OVL_ALGO_NAIVE = 1,      /* all-gather, then one GEMM */
    OVL_ALGO_COLLECTIVE = 2, /* chunked all-gather overlapped with chunk GEMMs */
    OVL_ALGO_RING = 3,       /* ag: own shard first, peers' shards by copies; rs: each block's
                                partial passed round the ranks, each adding its product */
    OVL_ALGO_PUSH = 4,       /* GEMM + reduce-scatter: each peer's partial first, pushed to it */
    OVL_ALGO_COUNT,          /* not a value: the number of values (stays last) */
} ovl_algo_t;

/* Algorithms are per kind of op (docs/plans.md): all-gather + GEMM takes
 * auto, naive, collective and ring; GEMM + reduce-scatter auto, naive,
 * collective, ring and push. Whether kind takes algo, and the list in words
 * ("auto, naive, collective and ring"; NULL for an unknown kind), for
 * refusals. */
int ovl_op_kind_takes_algo(ovl_op_kind_t kind, ovl_algo_t algo);
const char *ovl_op_kind_algos(ovl_op_kind_t kind);

/* Bs one op may take (ovl_ag_gemm_desc_t.nb). */
#define OVL_MAX_BS 8

/* A further B of an op (B i, i >= 1) and its output:
 *   b  k x n (transb == 0, ldb >= n) or n x k (transb != 0, ldb >= k)
 *   c  (world*m) x n output (ldc >= n)
 * n is this B's own (n >= 1); k and transb are the op's. */
typedef struct ovl_ag_gemm_b {
    const void *b;
    size_t ldb;
    void *c;
    size_t ldc;
    uint64_t n;
    /* A scaled op's (ovl_ag_gemm_desc_t.scaling): this B's scales (of
     * ovl_scale_shape(b_mode, 1, n, k)) and its bias (NULL, or n elements
     * of out_dtype: every B has one, or none does); unread for an op not
     * scaled. */
    const float *b_scale;
    const void *bias;
} ovl_ag_gemm_b_t;

/*
 * One AG-GEMM. Row-major matrices, leading dimensions in elements.
 *   a      m x k, this rank's shard (lda >= k)
 *   b      k x n (transb == 0, ldb >= n) or n x k (transb != 0, ldb >= k)
 *   c      (world*m) x n output (ldc >= n)
 *   a_out  optional (world*m) x k gathered A (lda_out >= k), NULL if unwanted
 * Result: c = gather(a) @ op(b), accumulated in fp32, stored in dtype.
 * algo, chunks and streams choose the pipeline; 0 lets the daemon choose.
 *
 * Several Bs (attention's Q/K/V projections, PyTorch's fused all-gather
 * matmul with several weights): nb Bs in all, 2..OVL_MAX_BS, B 0 being
 * b, ldb, c, ldc, n above and B i (i >= 1) more_bs[i-1]. A is gathered
 * once; C i = gather(a) @ op(B i) for every i. nb 0 or 1 is one B (more_bs
 * unread), so a descriptor zeroed where it is not set keeps its meaning.
 * An ovld too old for several Bs (HelloReply's features) refuses nb > 1 in
 * libovl with OVL_ERR_VERSION.
 */
typedef struct ovl_ag_gemm_desc {
    const void *a;
    size_t lda;
    const void *b;
    size_t ldb;
    int transb;
    void *c;
    size_t ldc;
    void *a_out;
    size_t lda_out;
    uint64_t m, n, k;
    ovl_dtype_t dtype;
    ovl_algo_t algo;
    uint32_t chunks;
    uint32_t streams;
    uint32_t nb;                    /* 0 or 1: one B; up to OVL_MAX_BS */
    const ovl_ag_gemm_b_t *more_bs; /* nb - 1 of them when nb > 1 */
    /* NULL: not scaled (bf16, fp16, fp32); an fp8 dtype needs it. Its
     * b_scale and bias are B 0's; B i's are more_bs[i-1]'s. An ovld
     * without fp8 (HelloReply's features) refuses it in libovl with
     * OVL_ERR_VERSION. */
    const ovl_scaling_t *scaling;
} ovl_ag_gemm_desc_t;

/*
 * Submits one AG-GEMM on `comm`. Every rank of the job must submit the same
 * ops in the same order, agreeing on m, n, k, dtype, transb, algo, chunks,
 * streams, on whether a_out is given, on nb and on each B's n.
 *
 * stream: with the CUDA backend, the caller's cudaStream_t (NULL: the legacy
 * default stream): the op starts after the work already on it and the work
 * enqueued after the call sees c complete. With the host backend it must be
 * NULL and the caller waits with ovl_comm_synchronize.
 *
 * Returns once the request is sent. A rank may run at most the daemon's
 * max_ops_in_flight ops ahead of its completed ones: past that, the call
 * first waits on the host (up to the client's timeout) for the oldest to
 * finish. Errors found later (a disagreement between ranks, a failure while
 * running) surface through ovl_comm_check; once one has (an earlier op of
 * the comm failed), the call submits nothing and returns ovl_comm_check's
 * answer. A request that cannot be sent (the connection to ovld broke)
 * fails the comm the same way: the call returns why, the stream does not
 * wait for the op, and c is not to be read.
 */
ovl_status_t ovl_allgather_gemm(ovl_comm_t *comm, const ovl_ag_gemm_desc_t *desc, void *stream);

/* ------------------------------------------------ GEMM + reduce-scatter */

/*
 * One GEMM + reduce-scatter (the row-parallel half of tensor parallelism).
 * Row-major matrices, leading dimensions in elements.
 *   a      m x k: this rank's share of the inner dimension, every row (lda >= k)
 *   b      k x n (transb == 0, ldb >= n) or n x k (transb != 0, ldb >= k)
 *   c      (m / world) x n: this rank's rows of the result (ldc >= n)
 * Result on rank r: c = rows [r m/world, (r+1) m/world) of the sum over the
 * ranks q of a_q @ op(b_q) (reduce_op OVL_REDUCE_AVG: of that sum divided
 * by the world). m must be a multiple of the world. Sums are taken in
 * fp32. naive, collective and push round each rank's partial product to
 * dtype once and the sum once; ring passes a running sum from rank to
 * rank, rounded to dtype at each of its world - 1 hops (avg: each product
 * scaled by 1/world first); docs/plans.md, "GEMM + reduce-scatter", states
 * the error. algo: OVL_ALGO_AUTO, NAIVE, COLLECTIVE, RING or PUSH; chunks
 * and streams split collective, chunks split ring's and push's blocks (0:
 * the daemon's choice).
 */
typedef struct ovl_gemm_rs_desc {
    const void *a;
    size_t lda;
    const void *b;
    size_t ldb;
    int transb;
    void *c;
    size_t ldc;
    uint64_t m, n, k;
    ovl_dtype_t dtype;
    ovl_reduce_op_t reduce_op;
    ovl_algo_t algo;
    uint32_t chunks;
    uint32_t streams;
    /* NULL: not scaled; an fp8 dtype needs it (as ovl_ag_gemm_desc_t's).
     * Partials are summed in out_dtype's fp32 sums, never in fp8. */
    const ovl_scaling_t *scaling;
} ovl_gemm_rs_desc_t;

/*
 * Submits one GEMM + reduce-scatter on `comm`, with ovl_allgather_gemm's
 * stream contract, throttle and errors. Every rank of the job must submit
 * the same ops in the same order, agreeing on m, n, k, dtype, transb,
 * reduce_op, algo, chunks and streams. On the CUDA backend naive and
 * collective need an NCCL communicator between the ranks: where ranks share
 * a GPU, such an op fails (OVL_ERR_UNSUPPORTED, through ovl_comm_check),
 * and ring and push run by the copy engine (auto picks push there).
 */
ovl_status_t ovl_gemm_reduce_scatter(ovl_comm_t *comm, const ovl_gemm_rs_desc_t *desc,
                                     void *stream);

/*
 * ovld's status and counters as JSON text, in the schemas of `ovlctl status
 * --json` and `ovlctl stats --json` (docs/ovlctl.md); reset also zeroes the
 * since_reset counters (root or ovld's own user only). On OVL_OK *ret_json
 * is a NUL-terminated string the caller frees with ovl_free.
 */
ovl_status_t ovl_status_json(ovl_client_t *client, char **ret_json);
ovl_status_t ovl_stats_json(ovl_client_t *client, int reset, char **ret_json);
/* Frees what libovl returned to be freed (ovl_status_json, ovl_stats_json). */
void ovl_free(void *p);

/* Names, for messages and command lines; NULL for an unknown value. */
const char *ovl_dtype_name(ovl_dtype_t dtype);
const char *ovl_algo_name(ovl_algo_t algo);
const char *ovl_op_kind_name(ovl_op_kind_t kind);
/* Parses a name; returns OVL_ERR_INVALID for an unknown one. */
ovl_status_t ovl_dtype_parse(const char *name, ovl_dtype_t *ret);
ovl_status_t ovl_algo_parse(const char *name, ovl_algo_t *ret);
ovl_status_t ovl_op_kind_parse(const char *name, ovl_op_kind_t *ret);
/* A scale mode's name ("tensor", "row", "1x128", "128x128"; NULL for an
 * unknown one), and the mode of a name (OVL_ERR_INVALID for an unknown
 * one). */
const char *ovl_scale_mode_name(ovl_scale_mode_t mode);
ovl_status_t ovl_scale_mode_parse(const char *name, ovl_scale_mode_t *ret);
/* The scales' shape (*ret_rows x *ret_cols fp32, dense) of B (b != 0, given
 * n x k: rows n) or A (rows m) under mode, k the matrix's columns (the
 * table above); OVL_ERR_INVALID for an unknown mode, or A by 128x128. */
ovl_status_t ovl_scale_shape(ovl_scale_mode_t mode, int b, uint64_t rows, uint64_t k,
                             uint64_t *ret_rows, uint64_t *ret_cols);
/* Bytes per element of a dtype (0 for an unknown one). */
size_t ovl_dtype_size(ovl_dtype_t dtype);

#ifdef __cplusplus
}
#endif

#endif /* OVL_H */

/*
 * two_nodes.c: one rank of a job whose ranks live on several nodes, each
 * node's ranks served by that node's ovld (docs/multinode.md), in the way
 * of NCCL's examples with ncclUniqueId:
 *
 *   rank 0         ovl_job_id_create  -> writes the id to --id-file
 *   other ranks    wait for --id-file -> read the id
 *   every rank     ovl_comm_init_id through its own node's ovld
 *                  A (m x k, its shard), B (k x n), C (world*m x n)
 *                  ovl_allgather_gemm, ovl_comm_synchronize
 *                  C checked against a reference made here from every
 *                  rank's A, which any process can rebuild (demo_rnd.h)
 *
 * Start one process per rank, each with the socket of its node's ovld:
 *
 *   node A:  ovl-example-two-nodes --rank 0 --world 2 --id-file /shared/job.id
 *   node B:  ovl-example-two-nodes --rank 1 --world 2 --id-file /shared/job.id
 *
 * The id file must be on a filesystem every rank sees (or copy it, as MPI
 * or torch.distributed would broadcast the bytes). With the host backend
 * the buffers come from ovl_host_alloc; with the CUDA backend from
 * cudaMalloc, and the reference is cuBLASLt's (ovl-demo's own helpers,
 * demo_cuda.h). Prints "rank R: OK (rel err X)" and exits 0, or says what
 * failed and exits 1; 2 for a usage error.
 *
 * With --op rs the op is GEMM + reduce-scatter (ovl_gemm_reduce_scatter):
 * every rank's A is (world*m) x k, its B k x n, its C m x n, rows [rank m,
 * (rank+1) m) of the sum over the ranks of A @ B; C is checked on the host
 * against the sum of every rank's product in double precision
 * (demo_rs_ref.h), on either backend.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "demo_rnd.h"
#include "demo_rs_ref.h"
#include "demo_scaled.h"
#include "hostgemm.h"
#include "num.h"
#include "ovl.h"

#ifdef OVL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_gemm.h"
#include "demo_cuda.h"
#endif

#define MAX_DIM   65536
#define MAX_WORLD 1024

typedef struct opts {
    uint32_t rank, world;
    const char *id_file;
    const char *socket; /* NULL: ovl_default_socket's rule ($OVL_SOCKET first) */
    uint64_t m, n, k;
    ovl_dtype_t dtype;
    ovl_algo_t algo;
    bool rs;                   /* --op rs: GEMM + reduce-scatter */
    ovl_reduce_op_t reduce_op; /* --reduce */
    int device;                /* -1: rank mod the devices of this node */
    uint64_t seed;
    uint64_t wait_s;      /* how long ranks other than 0 wait for the id file */
    uint64_t delay_ms;    /* a test's: held back this long after joining */
    uint64_t timeout_s;   /* ovl_set_timeout; 0: libovl's default */
    uint64_t iters;       /* host all-gather + GEMM: ops back to back (C checked after the last) */
    ovl_demo_scaled_t sc; /* an fp8 --dtype: a scaled op (host backend), as ovl-demo's */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ovl-example-two-nodes --rank R --world W --id-file PATH [OPTIONS]\n"
            "\n"
            "One rank of an AG-GEMM job across nodes (C = allgather(A) @ B): rank 0 asks its\n"
            "ovld for a job id (ovl_job_id_create) and writes it to PATH; the other ranks\n"
            "wait for PATH and read it; every rank joins through its own node's ovld\n"
            "(ovl_comm_init_id), runs one op and checks its C against a reference.\n"
            "\n"
            "  -r, --rank R        this process's rank, 0..W-1\n"
            "  -w, --world W       ranks in the job, over every node (1..%d)\n"
            "  -f, --id-file PATH  where rank 0 writes the job id and the others read it: on a\n"
            "                      filesystem every rank sees; must not exist when rank 0\n"
            "                      starts (rank 0 removes it when it ends)\n"
            "  -s, --socket PATH   this node's ovld; default: $OVL_SOCKET, else the per-user\n"
            "                      socket if it exists, else %s\n"
            "  -m M -n N -k K      shard rows, columns of C, inner dimension (default 256 384\n"
            "                      512; at most %d each)\n"
            "  -d, --dtype T       bf16, fp16 or fp32 (default bf16); fp8e4m3 or fp8e5m2: a\n"
            "                      scaled op (host backend; B n x k in fp8e4m3, C in bf16,\n"
            "                      scales by row, as ovl-demo's data)\n"
            "      --scale MODE    a scaled op's scales, both sides (default row): tensor,\n"
            "                      row, 1x128 or 128x128 (B only), as ovl-demo's\n"
            "      --a-scale MODE  A's alone (over --scale); --b-scale MODE: B's alone\n"
            "                      (--a-scale 1x128 --b-scale 128x128: DeepSeek-V3's pair;\n"
            "                      1x128 needs -m, on B -n, in fours)\n"
            "      --bias          a scaled op's bias\n"
            "      --iters N       host backend, all-gather + GEMM, not scaled: the op N\n"
            "                      times back to back, C checked after the last (default 1;\n"
            "                      1..100000: enough for ovld's auto to measure a shape)\n"
            "  -a, --algo A        auto, naive, collective or ring (rs: auto, naive or\n"
            "                      collective; default auto)\n"
            "      --op ag|rs      all-gather + GEMM (default), or GEMM + reduce-scatter: A\n"
            "                      (W*m) x k, C m x n, this rank's rows of the sum\n"
            "      --reduce sum|avg  rs: how the ranks' products combine (default sum)\n"
            "      --device D      the device of this node to use (default: R mod the devices)\n"
            "      --seed S        the data's seed, the same on every rank (default 1)\n"
            "      --wait S        how long ranks other than 0 wait for PATH (default 60 s)\n"
            "      --delay-op MS   wait MS ms after joining before the op (for tests of faults:\n"
            "                      the other ranks' op waits for this one's)\n"
            "      --timeout S     how long a call may wait for ovld, the op's completion\n"
            "                      included (ovl_set_timeout; default libovl's, 30 s)\n"
            "  -h, --help          show this help\n",
            MAX_WORLD, OVL_DEFAULT_SOCKET, MAX_DIM);
}

/* ----------------------------------------------------------- the job id */

/*
 * Rank 0: writes the id to path atomically, so that no rank ever reads half
 * of it: into a temporary file beside it (same directory, same
 * filesystem), flushed, then renamed over path. 0, or -1 with one line on
 * stderr.
 */
static int write_id(const char *path, const ovl_job_id_t *id)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= sizeof(tmp)) {
        fprintf(stderr, "rank 0: --id-file: the path is too long\n");
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "rank 0: creating %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    size_t done = 0;
    while (done < sizeof(id->bytes)) {
        ssize_t w = write(fd, id->bytes + done, sizeof(id->bytes) - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "rank 0: writing %s: %s\n", tmp,
                    w < 0 ? strerror(errno) : "no progress");
            goto fail;
        }
        done += (size_t)w;
    }
    /* on a network filesystem the other nodes see the bytes once they are
     * flushed: before the name appears */
    if (fsync(fd) != 0) {
        fprintf(stderr, "rank 0: fsync %s: %s\n", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        fprintf(stderr, "rank 0: closing %s: %s\n", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "rank 0: renaming %s to %s: %s\n", tmp, path, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    (void)unlink(tmp);
    return -1;
}

/*
 * Ranks other than 0: waits up to wait_s seconds for path and reads the id
 * from it. It polls, 10 times a second: inotify does not see a file that
 * another node creates on a network filesystem. 0, or -1 with one line on
 * stderr.
 */
static int read_id(const char *path, uint32_t rank, uint64_t wait_s, ovl_job_id_t *ret_id)
{
    uint64_t deadline = ovl_mono_ms() + wait_s * 1000;
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            unsigned char buf[OVL_JOB_ID_BYTES + 1]; /* one more: a longer file is not an id */
            size_t got = 0;
            ssize_t r = 0;
            while (got < sizeof(buf) && (r = read(fd, buf + got, sizeof(buf) - got)) != 0) {
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0)
                    break;
                got += (size_t)r;
            }
            int e = errno;
            close(fd);
            if (r < 0) {
                fprintf(stderr, "rank %u: reading %s: %s\n", rank, path, strerror(e));
                return -1;
            }
            if (got != OVL_JOB_ID_BYTES) {
                fprintf(stderr,
                        "rank %u: %s holds %s%zu bytes, not a job id of %d (written by rank 0 of "
                        "this example?)\n",
                        rank, path, got > OVL_JOB_ID_BYTES ? "more than " : "",
                        got > OVL_JOB_ID_BYTES ? (size_t)OVL_JOB_ID_BYTES : got, OVL_JOB_ID_BYTES);
                return -1;
            }
            memcpy(ret_id->bytes, buf, OVL_JOB_ID_BYTES);
            return 0;
        }
        if (errno != ENOENT) {
            fprintf(stderr, "rank %u: opening %s: %s\n", rank, path, strerror(errno));
            return -1;
        }
        if (ovl_mono_ms() >= deadline) {
            fprintf(stderr,
                    "rank %u: no job id in %s after %" PRIu64 " s: is rank 0 running, and does "
                    "every rank see that path?\n",
                    rank, path, wait_s);
            return -1;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
}

/* ------------------------------------------------------------- one op */

static ovl_ag_gemm_desc_t op_desc(const opts_t *o, const void *a, const void *b, void *c)
{
    ovl_ag_gemm_desc_t d = {.a = a,
                            .lda = o->k,
                            .b = b,
                            .ldb = o->n,
                            .c = c,
                            .ldc = o->n,
                            .m = o->m,
                            .n = o->n,
                            .k = o->k,
                            .dtype = o->dtype,
                            .algo = o->algo};
    return d;
}

/* --op rs: the op, and its reference (demo_rs_ref.h) */
static ovl_gemm_rs_desc_t rs_desc(const opts_t *o, const void *a, const void *b, void *c)
{
    ovl_gemm_rs_desc_t d = {.a = a,
                            .lda = o->k,
                            .b = b,
                            .ldb = o->n,
                            .c = c,
                            .ldc = o->n,
                            .m = o->world * o->m,
                            .n = o->n,
                            .k = o->k,
                            .dtype = o->dtype,
                            .reduce_op = o->reduce_op,
                            .algo = o->algo};
    return d;
}

static ovl_demo_rs_shape_t rs_shape(const opts_t *o)
{
    return (ovl_demo_rs_shape_t){.dtype = o->dtype,
                                 .world = o->world,
                                 .m = o->m,
                                 .n = o->n,
                                 .k = o->k,
                                 .reduce_op = o->reduce_op,
                                 .seed = o->seed};
}

/* ovl_host_free of each buffer given (NULL ones skipped); rc, or -1 where
 * rc was 0 and a free failed (the first failure said). */
static int host_free_all(ovl_client_t *cl, uint32_t rank, void *const *bufs, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        if (bufs[i] && ovl_host_free(cl, bufs[i]) != OVL_OK && rc == 0) {
            fprintf(stderr, "rank %u: ovl_host_free: %s\n", rank, ovl_last_error(cl));
            rc = -1;
        }
    return rc;
}

/*
 * --op rs on the host backend: A ((world*m) x k), B and C (m x n) in memory
 * shared with ovld, filled as ovl-demo fills them; the op, then C against
 * the reference. 0 with *ret_err set, or -1 with one line on stderr.
 */
static int run_host_rs(const opts_t *o, ovl_client_t *cl, ovl_comm_t *comm, double *ret_err)
{
    int rc = -1;
    uint32_t rank = o->rank;
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    void *a = ovl_host_alloc(cl, W * m * k * es);
    void *b = a ? ovl_host_alloc(cl, k * n * es) : NULL;
    void *c = b ? ovl_host_alloc(cl, m * n * es) : NULL;
    double *ref = malloc(m * n * sizeof(double));
    if (!c || !ref) {
        fprintf(stderr, "rank %u: out of memory: %s\n", rank, ovl_last_error(cl));
        goto out;
    }
    ovl_demo_fill_host(dt, a, W * m, k, k, o->seed, rank, 0);
    ovl_demo_fill_host(dt, b, k, n, n, o->seed, rank, 1);
    memset(c, 0xff, m * n * es); /* NaN in every dtype: what ovld does not write shows */
    ovl_gemm_rs_desc_t d = rs_desc(o, a, b, c);
    ovl_status_t st = ovl_gemm_reduce_scatter(comm, &d, NULL);
    if (st == OVL_OK)
        st = ovl_comm_synchronize(comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: the op: %s: %s\n", rank, ovl_strerror(st), ovl_last_error(cl));
        goto out;
    }
    ovl_demo_rs_shape_t sh = rs_shape(o);
    if (ovl_demo_rs_reference(&sh, rank, ref) != 0)
        goto out;
    *ret_err = ovl_rel_error(dt, m, n, c, n, ref, n);
    rc = 0;
out:
    free(ref);
    void *bufs[] = {c, b, a};
    return host_free_all(cl, rank, bufs, sizeof(bufs) / sizeof(bufs[0]), rc);
}

/*
 * Host backend: A, B and C in memory shared with ovld (ovl_host_alloc), A
 * matrix 0 and B matrix 1 of this rank's random numbers. Runs the op, then
 * compares C with a double-precision reference from every rank's A
 * (rebuilt) and this rank's B. 0 with *ret_err set, or -1 with one line on
 * stderr.
 */
static int run_host(const opts_t *o, ovl_client_t *cl, ovl_comm_t *comm, double *ret_err)
{
    int rc = -1;
    uint32_t rank = o->rank;
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    void *a = ovl_host_alloc(cl, m * k * es);
    void *b = a ? ovl_host_alloc(cl, k * n * es) : NULL;
    void *c = b ? ovl_host_alloc(cl, W * m * n * es) : NULL;
    void *ga = NULL;    /* every rank's A, rebuilt */
    double *ref = NULL; /* the reference C */
    if (!c) {
        fprintf(stderr, "rank %u: ovl_host_alloc: %s\n", rank, ovl_last_error(cl));
        goto out;
    }
    ovl_demo_fill_host(dt, a, m, k, k, o->seed, rank, 0);
    ovl_demo_fill_host(dt, b, k, n, n, o->seed, rank, 1);
    memset(c, 0xff, W * m * n * es); /* NaN in every dtype: what ovld does not write shows */

    ovl_ag_gemm_desc_t d = op_desc(o, a, b, c);
    ovl_status_t st = OVL_OK;
    for (uint64_t i = 0; i < (o->iters ? o->iters : 1) && st == OVL_OK; i++)
        st = ovl_allgather_gemm(comm, &d, NULL);
    if (st == OVL_OK)
        st = ovl_comm_synchronize(comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: the op: %s: %s\n", rank, ovl_strerror(st), ovl_last_error(cl));
        goto out;
    }

    ga = malloc(W * m * k * es);
    ref = malloc(W * m * n * sizeof(double));
    if (!ga || !ref) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        goto out;
    }
    for (uint32_t r = 0; r < W; r++)
        ovl_demo_fill_host(dt, (char *)ga + (size_t)r * m * k * es, m, k, k, o->seed, r, 0);
    st = ovl_ref_gemm(dt, W * m, n, k, ga, k, b, n, 0, ref, n);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: the reference: %s\n", rank, ovl_strerror(st));
        goto out;
    }
    *ret_err = ovl_rel_error(dt, W * m, n, c, n, ref, n);
    rc = 0;
out:
    free(ref);
    free(ga);
    /* after the op is done (synchronized above, or failed) */
    void *bufs[] = {c, b, a};
    return host_free_all(cl, rank, bufs, sizeof(bufs) / sizeof(bufs[0]), rc);
}

/*
 * A scaled (fp8) op of either kind on the host backend, with ovl-demo's
 * data (demo_scaled.h): A (m x k; rs: (world*m) x k) in the fp8 dtype, B n
 * x k, its scales and bias, C in the output dtype, all in memory shared
 * with ovld; C against the double-precision reference of the dequantized
 * inputs. 0 with *ret_err set, or -1 with one line on stderr.
 */
static int run_host_scaled(const opts_t *o, ovl_client_t *cl, ovl_comm_t *comm, double *ret_err)
{
    const ovl_demo_scaled_t *sc = &o->sc;
    uint32_t rank = o->rank;
    ovl_dtype_t dt = o->dtype;
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    uint64_t arows = o->rs ? W * m : m, crows = o->rs ? m : W * m;
    size_t es = ovl_dtype_size(dt), bes = ovl_dtype_size(sc->b_dtype);
    size_t ces = ovl_dtype_size(sc->out_dtype);
    uint64_t nsa = ovl_demo_a_scales(sc, arows, k), nsb = ovl_demo_b_scales(sc, n, k);
    ovl_demo_scaled_data_t x = {0};
    int rc = -1;
    void *a = ovl_host_alloc(cl, arows * k * es), *b = ovl_host_alloc(cl, n * k * bes);
    void *c = ovl_host_alloc(cl, crows * n * ces), *bias = ovl_host_alloc(cl, n * ces);
    float *sa = ovl_host_alloc(cl, nsa * sizeof(float)), *sb = ovl_host_alloc(cl, nsb * 4);
    double *ref = malloc(crows * n * sizeof(double));
    void *ga = o->rs ? NULL : malloc(W * m * k * es);
    if (!a || !b || !c || !bias || !sa || !sb || !ref || (!o->rs && !ga) ||
        ovl_demo_scaled_make(sc, dt, arows, n, k, o->seed, rank, &x) != 0) {
        fprintf(stderr, "rank %u: out of memory: %s\n", rank, ovl_last_error(cl));
        goto out;
    }
    memcpy(a, x.a, arows * k * es);
    memcpy(b, x.b, n * k * bes);
    memcpy(sa, x.a_scale, nsa * sizeof(float));
    memcpy(sb, x.b_scale, nsb * sizeof(float));
    memcpy(bias, x.bias, n * ces);
    memset(c, 0xff, crows * n * ces); /* NaN: what ovld does not write shows */
    ovl_scaling_t s = ovl_demo_scaling(sc, sa, sb, bias);
    ovl_status_t st;
    if (o->rs) {
        ovl_gemm_rs_desc_t d = rs_desc(o, a, b, c);
        d.ldb = k;
        d.transb = 1;
        d.scaling = &s;
        st = ovl_gemm_reduce_scatter(comm, &d, NULL);
    } else {
        ovl_ag_gemm_desc_t d = op_desc(o, a, b, c);
        d.ldb = k;
        d.transb = 1;
        d.scaling = &s;
        st = ovl_allgather_gemm(comm, &d, NULL);
    }
    if (st == OVL_OK)
        st = ovl_comm_synchronize(comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: the op: %s: %s\n", rank, ovl_strerror(st), ovl_last_error(cl));
        goto out;
    }
    if (o->rs) {
        ovl_demo_rs_shape_t sh = rs_shape(o);
        sh.transb = true;
        sh.sc = *sc;
        if (ovl_demo_rs_reference(&sh, rank, ref) != 0)
            goto out;
    } else {
        ovl_demo_rows_t all = {.n = W * m, .total = W * m};
        if (ovl_demo_scaled_ag_reference(sc, dt, o->world, m, n, k, o->seed, rank, &all, ga, ref) !=
            0)
            goto out;
    }
    *ret_err = ovl_rel_error(sc->out_dtype, crows, n, c, n, ref, n);
    rc = 0;
out:
    ovl_demo_scaled_free(&x);
    free(ref);
    free(ga);
    void *bufs[] = {a, b, c, bias, sa, sb};
    return host_free_all(cl, rank, bufs, sizeof(bufs) / sizeof(bufs[0]), rc);
}

#ifdef OVL_HAVE_CUDA
/*
 * CUDA backend: A, B and C in one cudaMalloc of this rank's GPU, filled
 * there; the op on a stream of ours; C compared with cuBLASLt's fp32
 * product of the same inputs (ovl-demo's helpers, demo_cuda.h). 0 with
 * *ret_err set, or -1 with one line on stderr.
 */
static int run_cuda(const opts_t *o, ovl_client_t *cl, ovl_comm_t *comm, double *ret_err)
{
    int rc = -1;
    uint32_t rank = o->rank; /* OVL_DEMO_CK names it */
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    cudaStream_t s = NULL;
    char *arena = NULL, *ga = NULL;
    float *ga32 = NULL, *b32 = NULL, *ref = NULL;
    double *acc = NULL;
    void *ws = NULL;
    ovld_lt_t *lt = NULL;
    char err[256];

    OVL_DEMO_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* A, B, C at 256-byte aligned offsets of one allocation */
    size_t off_b = (m * k * es + 255) / 256 * 256;
    size_t off_c = off_b + (k * n * es + 255) / 256 * 256;
    OVL_DEMO_CK(cudaMalloc((void **)&arena, off_c + W * m * n * es));
    void *a = arena, *b = arena + off_b, *c = arena + off_c;
    OVL_DEMO_CK(ovl_demo_fill(dt, a, m, k, k, o->seed, rank, 0, s));
    OVL_DEMO_CK(ovl_demo_fill(dt, b, k, n, n, o->seed, rank, 1, s));
    OVL_DEMO_CK(cudaMemsetAsync(c, 0xff, W * m * n * es, s)); /* NaN: unwritten shows */

    ovl_ag_gemm_desc_t d = op_desc(o, a, b, c);
    ovl_status_t st = ovl_allgather_gemm(comm, &d, s);
    if (st == OVL_OK)
        OVL_DEMO_CK(cudaStreamSynchronize(s));
    if (st == OVL_OK)
        st = ovl_comm_check(comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: the op: %s: %s\n", rank, ovl_strerror(st), ovl_last_error(cl));
        goto out;
    }

    OVL_DEMO_CK(cudaMalloc((void **)&ga, W * m * k * es));
    OVL_DEMO_CK(cudaMalloc((void **)&ga32, W * m * k * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&b32, k * n * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&ref, W * m * n * sizeof(float)));
    OVL_DEMO_CK(cudaMalloc((void **)&acc, 3 * sizeof(double)));
    OVL_DEMO_CK(cudaMalloc(&ws, OVLD_LT_WORKSPACE));
    if (ovld_lt_create(&lt, err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "rank %u: %s\n", rank, err);
        goto out;
    }
    OVL_DEMO_CK(ovl_demo_to_f32(dt, b, k, n, n, b32, s));
    if (ovl_demo_reference(lt, ws, dt, o->world, m, n, k, o->seed, b32, false, ga, ga32, ref, s,
                           err, sizeof(err)) != OVL_OK) {
        fprintf(stderr, "rank %u: %s\n", rank, err);
        goto out;
    }
    double h[3];
    OVL_DEMO_CK(cudaMemsetAsync(acc, 0, sizeof(h), s));
    OVL_DEMO_CK(ovl_demo_error_acc(dt, c, n, ref, W * m, n, acc, s));
    OVL_DEMO_CK(cudaMemcpyAsync(h, acc, sizeof(h), cudaMemcpyDeviceToHost, s));
    OVL_DEMO_CK(cudaStreamSynchronize(s));
    *ret_err = ovl_demo_rel_error(h);
    rc = 0;
out:
    if (s)
        (void)cudaStreamSynchronize(s);
    /* ovld unmaps the arena before it is freed: first the comm's ops, then
     * the registration libovl made for them (client/ovl_demo_cuda.c) */
    (void)ovl_comm_synchronize(comm);
    ovl_mem_t *mem;
    if (arena && ovl_mem_register(cl, arena, 1, &mem) == OVL_OK)
        (void)ovl_mem_deregister(cl, mem);
    if (lt)
        ovld_lt_destroy(lt);
    /* nothing to do about a failure to free */
    (void)cudaFree(ws);
    (void)cudaFree(acc);
    (void)cudaFree(ref);
    (void)cudaFree(b32);
    (void)cudaFree(ga32);
    (void)cudaFree(ga);
    (void)cudaFree(arena);
    if (s)
        (void)cudaStreamDestroy(s);
    return rc;
}

/*
 * --op rs on the CUDA backend: A, B and C in one cudaMalloc, copied from the
 * host's data (ovl-demo's); the op on a stream of ours; C copied back and
 * checked against the host reference. 0 with *ret_err set, or -1 with one
 * line on stderr.
 */
static int run_cuda_rs(const opts_t *o, ovl_client_t *cl, ovl_comm_t *comm, double *ret_err)
{
    int rc = -1;
    uint32_t rank = o->rank; /* OVL_DEMO_CK names it */
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    size_t a_bytes = W * m * k * es, b_bytes = k * n * es, c_bytes = m * n * es;
    cudaStream_t s = NULL;
    char *arena = NULL;
    void *ha = malloc(a_bytes), *hb = malloc(b_bytes), *hc = malloc(c_bytes);
    double *ref = malloc(m * n * sizeof(double));
    if (!ha || !hb || !hc || !ref) {
        fprintf(stderr, "rank %u: out of memory\n", rank);
        goto out;
    }
    ovl_demo_fill_host(dt, ha, W * m, k, k, o->seed, rank, 0);
    ovl_demo_fill_host(dt, hb, k, n, n, o->seed, rank, 1);
    OVL_DEMO_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t off_b = (a_bytes + 255) / 256 * 256, off_c = off_b + (b_bytes + 255) / 256 * 256;
    OVL_DEMO_CK(cudaMalloc((void **)&arena, off_c + c_bytes));
    OVL_DEMO_CK(cudaMemcpyAsync(arena, ha, a_bytes, cudaMemcpyHostToDevice, s));
    OVL_DEMO_CK(cudaMemcpyAsync(arena + off_b, hb, b_bytes, cudaMemcpyHostToDevice, s));
    OVL_DEMO_CK(cudaMemsetAsync(arena + off_c, 0xff, c_bytes, s)); /* NaN: unwritten shows */
    ovl_gemm_rs_desc_t d = rs_desc(o, arena, arena + off_b, arena + off_c);
    ovl_status_t st = ovl_gemm_reduce_scatter(comm, &d, s);
    if (st == OVL_OK)
        OVL_DEMO_CK(cudaMemcpyAsync(hc, arena + off_c, c_bytes, cudaMemcpyDeviceToHost, s));
    if (st == OVL_OK)
        OVL_DEMO_CK(cudaStreamSynchronize(s));
    if (st == OVL_OK)
        st = ovl_comm_check(comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: the op: %s: %s\n", rank, ovl_strerror(st), ovl_last_error(cl));
        goto out;
    }
    ovl_demo_rs_shape_t sh = rs_shape(o);
    if (ovl_demo_rs_reference(&sh, rank, ref) != 0)
        goto out;
    *ret_err = ovl_rel_error(dt, m, n, hc, n, ref, n);
    rc = 0;
out:
    if (s)
        (void)cudaStreamSynchronize(s);
    /* ovld unmaps the arena before it is freed (run_cuda says how) */
    (void)ovl_comm_synchronize(comm);
    ovl_mem_t *mem;
    if (arena && ovl_mem_register(cl, arena, 1, &mem) == OVL_OK)
        (void)ovl_mem_deregister(cl, mem);
    (void)cudaFree(arena);
    if (s)
        (void)cudaStreamDestroy(s);
    free(ref);
    free(hc);
    free(hb);
    free(ha);
    return rc;
}

/* The GPU: --device, else rank mod the GPUs this process sees. */
static int cuda_device(const opts_t *o, int *ret_dev)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "rank %u: ovld runs the CUDA backend, but this process sees no GPU: %s\n",
                o->rank, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return -1;
    }
    int dev = o->device >= 0 ? o->device : (int)(o->rank % (uint32_t)ndev);
    if ((e = cudaSetDevice(dev)) != cudaSuccess) {
        fprintf(stderr, "rank %u: cudaSetDevice(%d): %s\n", o->rank, dev, cudaGetErrorString(e));
        return -1;
    }
    *ret_dev = dev;
    return 0;
}
#endif

/* ---------------------------------------------------------------- main */

static int parse(int argc, char **argv, opts_t *o)
{
    enum {
        O_DEVICE = 1,
        O_SEED,
        O_WAIT,
        O_DELAY,
        O_TIMEOUT,
        O_OP,
        O_REDUCE,
        O_SCALE,
        O_A_SCALE,
        O_B_SCALE,
        O_BIAS,
        O_ITERS
    };
    static const struct option lo[] = {
        {"rank", required_argument, NULL, 'r'},
        {"world", required_argument, NULL, 'w'},
        {"id-file", required_argument, NULL, 'f'},
        {"socket", required_argument, NULL, 's'},
        {"dtype", required_argument, NULL, 'd'},
        {"algo", required_argument, NULL, 'a'},
        {"device", required_argument, NULL, O_DEVICE},
        {"seed", required_argument, NULL, O_SEED},
        {"wait", required_argument, NULL, O_WAIT},
        {"delay-op", required_argument, NULL, O_DELAY},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"op", required_argument, NULL, O_OP},
        {"reduce", required_argument, NULL, O_REDUCE},
        {"scale", required_argument, NULL, O_SCALE},
        {"a-scale", required_argument, NULL, O_A_SCALE},
        {"b-scale", required_argument, NULL, O_B_SCALE},
        {"bias", no_argument, NULL, O_BIAS},
        {"iters", required_argument, NULL, O_ITERS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool have_rank = false, have_world = false;
    /* --scale, --a-scale, --b-scale as given (-1: not): one side's over both */
    int scale = -1, a_scale = -1, b_scale = -1;
    int ch;
    uint64_t v;
    while ((ch = getopt_long(argc, argv, "r:w:f:s:m:n:k:d:a:h", lo, NULL)) != -1) {
        switch (ch) {
        case 'f':
            o->id_file = optarg;
            break;
        case 's':
            o->socket = optarg;
            break;
        case 'd':
            if (ovl_dtype_parse(optarg, &o->dtype) != OVL_OK) {
                fprintf(stderr,
                        "ovl-example-two-nodes: unknown dtype '%s' (bf16, fp16, fp32, fp8e4m3, "
                        "fp8e5m2)\n",
                        optarg);
                return 2;
            }
            o->sc.on = ovl_dtype_is_fp8(o->dtype);
            break;
        case O_SCALE:
        case O_A_SCALE:
        case O_B_SCALE: {
            ovl_scale_mode_t mode;
            const char *name = ch == O_SCALE     ? "--scale"
                               : ch == O_A_SCALE ? "--a-scale"
                                                 : "--b-scale";
            if (ovl_scale_mode_parse(optarg, &mode) != OVL_OK) {
                fprintf(stderr, "ovl-example-two-nodes: %s '%s': tensor, row, 1x128 or 128x128\n",
                        name, optarg);
                return 2;
            }
            *(ch == O_SCALE ? &scale : ch == O_A_SCALE ? &a_scale : &b_scale) = (int)mode;
            break;
        }
        case O_BIAS:
            o->sc.bias = true;
            break;
        case 'a':
            if (ovl_algo_parse(optarg, &o->algo) != OVL_OK) {
                fprintf(stderr,
                        "ovl-example-two-nodes: unknown algorithm '%s' (auto, naive, collective, "
                        "ring)\n",
                        optarg);
                return 2;
            }
            break;
        case O_OP:
            if (strcmp(optarg, "ag") != 0 && strcmp(optarg, "rs") != 0) {
                fprintf(stderr, "ovl-example-two-nodes: --op '%s': ag or rs\n", optarg);
                return 2;
            }
            o->rs = optarg[0] == 'r';
            break;
        case O_REDUCE:
            if (strcmp(optarg, "sum") != 0 && strcmp(optarg, "avg") != 0) {
                fprintf(stderr, "ovl-example-two-nodes: --reduce '%s': sum or avg\n", optarg);
                return 2;
            }
            o->reduce_op = optarg[0] == 'a' ? OVL_REDUCE_AVG : OVL_REDUCE_SUM;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'r':
        case 'w':
        case 'm':
        case 'n':
        case 'k':
        case O_DEVICE:
        case O_SEED:
        case O_WAIT:
        case O_DELAY:
        case O_TIMEOUT:
        case O_ITERS:
            if (ovl_parse_u64(optarg, &v) != 0) {
                fprintf(stderr, "ovl-example-two-nodes: '%s' is not a number\n", optarg);
                return 2;
            }
            if (ch == 'r') {
                o->rank = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
                have_rank = true;
            } else if (ch == 'w') {
                o->world = v > MAX_WORLD ? 0 : (uint32_t)v;
                have_world = true;
            } else if (ch == 'm') {
                o->m = v;
            } else if (ch == 'n') {
                o->n = v;
            } else if (ch == 'k') {
                o->k = v;
            } else if (ch == O_DEVICE) {
                o->device = v > 1024 ? 1024 : (int)v;
            } else if (ch == O_SEED) {
                o->seed = v;
            } else if (ch == O_DELAY) {
                o->delay_ms = v > 3600000 ? 3600000 : v;
            } else if (ch == O_TIMEOUT) {
                o->timeout_s = v > 86400 ? 86400 : v;
            } else if (ch == O_ITERS) {
                if (v < 1 || v > 100000) {
                    fprintf(stderr, "ovl-example-two-nodes: --iters %" PRIu64 ": 1..100000\n", v);
                    return 2;
                }
                o->iters = v;
            } else {
                o->wait_s = v > 86400 ? 86400 : v;
            }
            break;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ovl-example-two-nodes: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!have_rank || !have_world || !o->id_file) {
        fprintf(stderr, "ovl-example-two-nodes: --rank, --world and --id-file are required "
                        "(--help)\n");
        return 2;
    }
    if (o->world == 0 || o->rank >= o->world) {
        fprintf(stderr, "ovl-example-two-nodes: --world 1..%d, --rank 0..world-1\n", MAX_WORLD);
        return 2;
    }
    if (o->m == 0 || o->n == 0 || o->k == 0 || o->m > MAX_DIM || o->n > MAX_DIM || o->k > MAX_DIM) {
        fprintf(stderr, "ovl-example-two-nodes: -m, -n and -k: 1..%d\n", MAX_DIM);
        return 2;
    }
    if (o->iters > 1 && (o->rs || o->sc.on)) {
        fprintf(stderr, "ovl-example-two-nodes: --iters: all-gather + GEMM, not scaled, only\n");
        return 2;
    }
    if (!o->sc.on && (o->sc.bias || scale >= 0 || a_scale >= 0 || b_scale >= 0)) {
        fprintf(stderr, "ovl-example-two-nodes: --scale, --a-scale, --b-scale and --bias are for "
                        "an fp8 --dtype\n");
        return 2;
    }
    if (scale >= 0)
        o->sc.a_mode = o->sc.b_mode = (ovl_scale_mode_t)scale;
    if (a_scale >= 0)
        o->sc.a_mode = (ovl_scale_mode_t)a_scale;
    if (b_scale >= 0)
        o->sc.b_mode = (ovl_scale_mode_t)b_scale;
    /* the rule libovl and ovld apply (each GEMM's A has m rows in both
     * kinds), said before any rank joins a job that would wait for it */
    const char *why = o->sc.on ? ovl_demo_scaled_refusal(&o->sc, o->dtype, o->m, o->n) : NULL;
    if (why) {
        fprintf(stderr, "ovl-example-two-nodes: scales %s/%s, -m %" PRIu64 " -n %" PRIu64 ": %s\n",
                ovl_scale_mode_name(o->sc.a_mode), ovl_scale_mode_name(o->sc.b_mode), o->m, o->n,
                why);
        return 2;
    }
    return -1; /* go on */
}

int main(int argc, char **argv)
{
    opts_t o = {.m = 256,
                .n = 384,
                .k = 512,
                .dtype = OVL_DTYPE_BF16,
                .algo = OVL_ALGO_AUTO,
                .device = -1,
                .seed = 1,
                .wait_s = 60,
                .sc = {.b_dtype = OVL_DTYPE_FP8_E4M3,
                       .out_dtype = OVL_DTYPE_BF16,
                       .a_mode = OVL_SCALE_ROW,
                       .b_mode = OVL_SCALE_ROW}};
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    rc = 1;
    uint32_t rank = o.rank;
    ovl_client_t *cl = NULL;
    ovl_comm_t *comm = NULL;
    bool wrote_id = false;

    /* A file left by an earlier run would hand the other ranks a stale id
     * (refused by ovld, but only after they joined in vain). */
    struct stat sb;
    if (rank == 0 && lstat(o.id_file, &sb) == 0) {
        fprintf(stderr,
                "rank 0: %s exists (from an earlier run?): remove it first, or the other ranks "
                "may read a stale job id\n",
                o.id_file);
        return 1;
    }

    if (ovl_connect(o.socket, &cl) != OVL_OK) {
        fprintf(stderr, "rank %u: %s\n", rank, ovl_connect_error());
        goto out;
    }
    if (o.timeout_s)
        ovl_set_timeout(cl, (int)(o.timeout_s * 1000));
    ovl_daemon_info_t info;
    if (ovl_daemon_info(cl, &info) != OVL_OK || info.ndevices == 0) {
        fprintf(stderr, "rank %u: ovld has no devices\n", rank);
        goto out;
    }
    bool cuda = strcmp(info.backend, "cuda") == 0;
    if (o.iters > 1 && cuda) {
        fprintf(stderr, "rank %u: --iters: the host backend's all-gather + GEMM only\n", rank);
        goto out;
    }

    /* The id: made by rank 0's ovld, which coordinates the job; the same
     * 128 bytes for every rank. */
    ovl_job_id_t id;
    if (rank == 0) {
        ovl_status_t st = ovl_job_id_create(cl, &id);
        if (st != OVL_OK) {
            fprintf(stderr, "rank 0: ovl_job_id_create: %s: %s\n", ovl_strerror(st),
                    ovl_last_error(cl));
            goto out;
        }
        if (write_id(o.id_file, &id) != 0)
            goto out;
        wrote_id = true;
    } else if (read_id(o.id_file, rank, o.wait_s, &id) != 0) {
        goto out;
    }

    int device = o.device >= 0 ? o.device : (int)(rank % info.ndevices);
    if (cuda) {
#ifdef OVL_HAVE_CUDA
        if (cuda_device(&o, &device) != 0)
            goto out;
#else
        fprintf(stderr,
                "rank %u: ovld runs the CUDA backend, but this program was built "
                "without CUDA\n",
                rank);
        goto out;
#endif
    }
    /* Through this node's ovld; returns once the coordinator admitted the
     * rank. The op below waits for the other ranks. */
    ovl_status_t st = ovl_comm_init_id(cl, &id, o.world, rank, device, &comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: ovl_comm_init_id (world %u, device %d): %s: %s\n", rank, o.world,
                device, ovl_strerror(st), ovl_last_error(cl));
        goto out;
    }

    if (o.delay_ms) {
        struct timespec ts = {.tv_sec = (time_t)(o.delay_ms / 1000),
                              .tv_nsec = (long)(o.delay_ms % 1000) * 1000000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }

    double err = INFINITY;
    if (o.sc.on && cuda) {
        fprintf(stderr,
                "rank %u: a scaled (fp8) op runs here on the host backend only "
                "(ovl-demo checks it on GPUs)\n",
                rank);
        goto out;
    }
#ifdef OVL_HAVE_CUDA
    int run = o.sc.on ? run_host_scaled(&o, cl, comm, &err)
              : cuda  ? (o.rs ? run_cuda_rs : run_cuda)(&o, cl, comm, &err)
                      : (o.rs ? run_host_rs : run_host)(&o, cl, comm, &err);
#else
    int run = o.sc.on ? run_host_scaled(&o, cl, comm, &err)
                      : (o.rs ? run_host_rs : run_host)(&o, cl, comm, &err);
#endif
    if (run != 0)
        goto out;
    double tol = ovl_demo_scaled_tolerance(&o.sc, o.dtype);
    if (!(err < tol)) { /* NaN fails too */
        fprintf(stderr, "rank %u: FAIL: rel err %.3e, over the tolerance %.0e of %s\n", rank, err,
                tol, ovl_dtype_name(o.dtype));
        goto out;
    }
    printf("rank %u: OK (rel err %.3e)\n", rank, err);
    rc = 0;
out:
    if (comm && ovl_comm_destroy(comm) != OVL_OK && rc == 0) {
        fprintf(stderr, "rank %u: ovl_comm_destroy: %s\n", rank, ovl_last_error(cl));
        rc = 1;
    }
    ovl_disconnect(cl);
    /* Every rank has read the id once the op ran (it needed all of them);
     * a failed job's id is of no use to anyone. */
    if (wrote_id && unlink(o.id_file) != 0 && errno != ENOENT)
        fprintf(stderr, "rank 0: removing %s: %s\n", o.id_file, strerror(errno));
    return rc;
}

/*
 * ovl_demo.c: the main job, end to end. Starts W client processes that join
 * one job on ovld; each fills its shard A_r and weight B_r with random data,
 * runs AG-GEMMs with each algorithm, and checks its C against a reference
 * computed in double precision from every rank's inputs (regenerated from
 * the shared seed). With --more-n every op has several Bs, each with its
 * own C, and every C is checked so. Prints one row per algorithm (and one
 * per C under it); exits 1 if any check fails. The ranks end with this
 * process, however it ends (start_rank).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "demo_rnd.h"
#include "demo_scaled.h"
#include "half.h"
#include "hostgemm.h"
#include "num.h"
#include "ovl.h"
#include "ovl_demo.h"
#include "scaling.h"
#include "clock.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ovl-demo [OPTIONS]\n"
            "\n"
            "Runs W client processes that join one job on ovld and check the results of\n"
            "its ops against a double-precision reference: all-gather + GEMM\n"
            "(C = allgather(A) @ B), or with --op rs GEMM + reduce-scatter (each rank's C is\n"
            "its m rows of the sum over the ranks of A @ B).\n"
            "\n"
            "  -s, --socket PATH   ovld's socket; default: $OVL_SOCKET, else the per-user\n"
            "                      /run/ovl/UID/ovld.sock or $XDG_RUNTIME_DIR/ovl/ovld.sock if\n"
            "                      it exists, else %s (ovl_default_socket in\n"
            "                      <ovl/ovl.h>); the first line printed names the one used\n"
            "  -w, --world W       ranks (processes), default 4\n"
            "  -m M -n N -k K      rows per rank (ag: of A; rs: of C), columns of C, inner\n"
            "                      dimension (rs: each rank's) (default 256 384 512)\n"
            "      --op ag|rs      all-gather + GEMM (default) or GEMM + reduce-scatter\n"
            "      --reduce sum|avg  rs: how the ranks' products combine (default sum)\n"
            "      --strided       rs: A and C are views into wider matrices (lda k + 3,\n"
            "                      ldc n + 5); the columns past them must stay untouched\n"
            "  -d, --dtype T       bf16, fp16, fp32, or fp8e4m3 or fp8e5m2 (default bf16);\n"
            "                      an fp8 dtype (A's) makes the ops scaled (below)\n"
            "  -a, --algo A        naive, collective, ring, push (rs only), auto or all\n"
            "                      (default all: ag's three, rs's four)\n"
            "  -i, --iters I       ops per algorithm, back to back (default 3)\n"
            "      --chunks C      chunks (default 0: the daemon's choice)\n"
            "      --streams S     streams (default 0: the daemon's choice)\n"
            "      --transb        B is stored N x K (as a Linear weight)\n"
            "      --a-out         also ask for the gathered A and check it\n"
            "      --more-n N1,... several Bs in every op: the n of each B after the first\n"
            "                      (-n is the first's), up to %d; each C is checked\n"
            "      --interior      CUDA: place the buffers inside one larger allocation\n"
            "      --timing        also time each submit call: its p50 and p99 in us (the\n"
            "                      worst rank's) back to back (waits at the submit window\n"
            "                      included), then in as many more calls at most %d ahead\n"
            "                      (the call alone): four more columns\n"
            "      --idle SECONDS  no ops: every rank joins the job (rank r on device r mod\n"
            "                      the devices: this process's GPUs where ovld runs CUDA,\n"
            "                      else ovld's), stays SECONDS (1..86400; SIGTERM, or\n"
            "                      the end of the ovl-demo process, ends it sooner) and\n"
            "                      leaves, so that other jobs find the devices shared\n"
            "      --seed S        random seed (default: time)\n"
            "      --job ID        job id (default demo-PID)\n"
            "  -h, --help          show this help\n"
            "\n"
            "Scaled (fp8) ops, with -d fp8e4m3 or fp8e5m2 only: C = sa(i) * sb(j) *\n"
            "(A @ op(B))[i][j] + bias[j] (block scales: each 128 of k's sum scaled by its\n"
            "own), summed in fp32 and rounded to the output dtype; fp32 scales in\n"
            "[0.5, 1). --transb is implied (B n x k: cuBLASLt's one fp8 layout); one B\n"
            "(no --more-n).\n"
            "      --b-dtype T     B's dtype: fp8e4m3 or fp8e5m2 (default fp8e4m3; not\n"
            "                      fp8e5m2 with -d fp8e5m2)\n"
            "      --out-dtype T   C's dtype: bf16, fp16 or fp32 (default bf16); the check\n"
            "                      accepts 1e-2 (bf16), 2e-3 (fp16), 5e-4 (fp32: Hopper's\n"
            "                      tensor cores sum fp8 products in fewer bits than fp32)\n"
            "      --scale MODE    A's and B's scales (default row): tensor (one), row (A:\n"
            "                      one per row, B: one per column of op(B)), 1x128 (one per\n"
            "                      row and 128 of k) or 128x128 (one per 128 x 128 tile:\n"
            "                      B only); ag with tensor: one A scale that every rank\n"
            "                      shares; by row and 1x128 A's go with its rows\n"
            "      --a-scale MODE  A's scales alone (over --scale): tensor, row or 1x128\n"
            "      --b-scale MODE  B's scales alone (over --scale): any of the four.\n"
            "                      Modes are taken as given and checked by the rule that\n"
            "                      libovl and ovld apply (ovl-demo says its words before\n"
            "                      it connects): block scales go with block scales, A is\n"
            "                      never 128x128 (--scale 128x128 makes it so: refused), A\n"
            "                      1x128 needs -m in fours, B 1x128 -n. DeepSeek-V3's\n"
            "                      recipe (1x128 activations, 128x128 weights): --a-scale\n"
            "                      1x128 --b-scale 128x128\n"
            "      --bias          add a bias of n elements of the output dtype (rs: each\n"
            "                      rank's, once per rank's product)\n"
            "      --fast-accum    cuBLASLt's fast fp8 accumulation (the host backend's sum\n"
            "                      is the same either way); the check then accepts twice\n"
            "                      the output dtype's tolerance (not measured: a margin)\n"
            "      --check-rows N  check N rows of each rank's C against the reference (0:\n"
            "                      every row); default: every row where their reference\n"
            "                      costs at most 2^28 multiply-adds per rank, else %d to\n"
            "                      %d rows spread over C: every rank's block's first and\n"
            "                      last (ag), chunk boundaries, rows evenly spaced; the\n"
            "                      error is then over the rows checked\n",
            OVL_DEFAULT_SOCKET, OVL_MAX_BS - 1, OVL_DEMO_PACE, OVL_DEMO_CHECK_MIN_ROWS,
            OVL_DEMO_CHECK_MAX_ROWS);
}

/* ------------------------------------------------------------ a rank */

/*
 * The start of a run: each rank connects, then says so to the parent on
 * connect_fd (one byte '+', or '-', ovl_connect_error's words and a
 * newline, in one write) and waits for a byte on go_fd. The parent prints
 * its header only once every rank connected, so that where there is no
 * ovld (none started, or a stale socket) the first and only line printed
 * is why, not a table of ranks that sent no result; and no rank prints
 * before the header. ovld sees no connection but the ranks' own (its
 * counters stay those of the ranks).
 */
static int connect_fd = -1, go_fd = -1;

/* The rank's side: 0 to go on, -1 to end (no ovld, or the parent gone). */
static int rank_connected(const char *err)
{
    char msg[512];
    int len = err ? snprintf(msg, sizeof(msg), "-%.500s\n", err) : snprintf(msg, sizeof(msg), "+");
    if (write(connect_fd, msg, (size_t)len) != len)
        return -1;
    close(connect_fd);
    if (err)
        return -1;
    char go;
    ssize_t n;
    do
        n = read(go_fd, &go, 1);
    while (n < 0 && errno == EINTR);
    close(go_fd);
    return n == 1 ? 0 : -1;
}

static volatile sig_atomic_t idle_stop;

static void on_idle_term(int sig)
{
    (void)sig;
    idle_stop = 1;
}

/* --idle: joins, stays, leaves; 0 once it joined and left, 1 otherwise. */
static int rank_idle(const opts_t *o, uint32_t rank, ovl_client_t *cl, int ndevices)
{
    ovl_comm_t *comm = NULL;
    if (ovl_comm_init(cl, o->job, o->world, rank, (int)(rank % (uint32_t)ndevices), &comm) !=
        OVL_OK) {
        fprintf(stderr, "rank %u: joining job '%s': %s\n", rank, o->job, ovl_last_error(cl));
        return 1;
    }
    if (rank == 0) {
        printf("ovl-demo: job '%s' joined, idle for %u s\n", o->job, o->idle_s);
        fflush(stdout);
    }
    uint64_t until = ovl_mono_ns() + (uint64_t)o->idle_s * 1000000000u;
    /* a parent gone (killed, crashed) ends the stay too: its death's
     * SIGTERM (start_rank) sets idle_stop; getppid() where that was not
     * to be had */
    while (!idle_stop && ovl_mono_ns() < until && getppid() == o->parent) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ovl_status_t st = ovl_comm_destroy(comm);
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: leaving job '%s': %s\n", rank, o->job, ovl_strerror(st));
        return 1;
    }
    return 0;
}

/* A rank's data on the host backend (rank_host). The buffers ovld maps
 * (ovl_host_alloc, freed with the client): A, each B and its C (B i is
 * matrix 1 + i of the rank, dense), a_out with --a-out, and a scaled op's
 * scales and bias (demo_scaled.h). This process's: every rank's A,
 * regenerated (the reference's input and a_out's check), the rows of C
 * checked (ovl_demo_rows_of: a scaled op's may be a sample) and each C's
 * reference of them in double precision. */
typedef struct host_bufs {
    void *a, *aout;
    void *b[OVL_MAX_BS], *c[OVL_MAX_BS];  /* B i and C i */
    ovl_ag_gemm_b_t more[OVL_MAX_BS - 1]; /* B 1 .. of the op */
    float *a_scale, *b_scale;             /* scaled: in memory ovld maps */
    void *bias;
    ovl_scaling_t scaling; /* the op's, over them */
    void *ga;
    ovl_demo_rows_t rows;    /* of each C, checked */
    double *ref[OVL_MAX_BS]; /* C i's reference, of those rows */
} host_bufs_t;

/* hb's buffers that ovld maps, made and filled with the rank's data: 0, or
 * -1 after saying why. */
static int host_buffers(const opts_t *o, uint32_t rank, ovl_client_t *cl, host_bufs_t *hb)
{
    ovl_dtype_t dt = o->dtype, bdt = ovl_demo_b_dtype(&o->sc, dt);
    size_t es = ovl_dtype_size(dt), bes = ovl_dtype_size(bdt);
    size_t ces = ovl_dtype_size(ovl_demo_c_dtype(&o->sc, dt));
    uint64_t W = o->world, m = o->m, k = o->k;
    uint64_t lda = k, ldo = k;

    hb->a = ovl_host_alloc(cl, m * lda * es);
    if (o->a_out)
        hb->aout = ovl_host_alloc(cl, W * m * ldo * es);
    if (!hb->a || (o->a_out && !hb->aout)) {
        fprintf(stderr, "rank %u: ovl_host_alloc: %s\n", rank, ovl_last_error(cl));
        return -1;
    }
    ovl_demo_fill_host(dt, hb->a, m, k, lda, o->seed, rank, 0);
    /* B i is matrix 1 + i of the rank (B 0 the demo's one B), dense */
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i), ldb = o->transb ? k : n;
        uint64_t brows = o->transb ? n : k, bcols = o->transb ? k : n;
        hb->b[i] = ovl_host_alloc(cl, brows * ldb * bes);
        hb->c[i] = ovl_host_alloc(cl, W * m * n * ces);
        if (!hb->b[i] || !hb->c[i]) {
            fprintf(stderr, "rank %u: ovl_host_alloc (B %u): %s\n", rank, i, ovl_last_error(cl));
            return -1;
        }
        ovl_demo_fill_host(bdt, hb->b[i], brows, bcols, ldb, o->seed, rank, 1 + (int)i);
        if (i > 0)
            hb->more[i - 1] = ovl_demo_b(o, i, hb->b[i], hb->c[i]);
    }
    if (!o->sc.on)
        return 0;
    /* scaled (one B): the scales and bias, where ovld maps them */
    const ovl_demo_scaled_t *sc = &o->sc;
    hb->a_scale = ovl_host_alloc(cl, ovl_demo_a_scales(sc, m, k) * sizeof(float));
    hb->b_scale = ovl_host_alloc(cl, ovl_demo_b_scales(sc, o->n, k) * sizeof(float));
    hb->bias = sc->bias ? ovl_host_alloc(cl, o->n * ces) : NULL;
    if (!hb->a_scale || !hb->b_scale || (sc->bias && !hb->bias)) {
        fprintf(stderr, "rank %u: ovl_host_alloc (scales): %s\n", rank, ovl_last_error(cl));
        return -1;
    }
    ovl_demo_fill_a_scale(sc, hb->a_scale, m, k, o->seed, rank);
    ovl_demo_fill_b_scale(sc, hb->b_scale, o->n, k, o->seed, rank);
    if (hb->bias)
        ovl_demo_fill_bias(sc, hb->bias, o->n, o->seed, rank);
    hb->scaling = ovl_demo_scaling(sc, hb->a_scale, hb->b_scale, hb->bias);
    return 0;
}

/* Reference: every rank's shard, regenerated, times each of this rank's
 * Bs (host_buffers made them), into hb's ga, rows and ref (rank_host
 * frees them); a scaled op's over the rows its check covers. 0, or -1
 * after saying why. */
static int host_reference(const opts_t *o, uint32_t rank, host_bufs_t *hb)
{
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, k = o->k;

    hb->ga = malloc(W * m * k * es);
    if (!hb->ga || ovl_demo_rows_of(o, &hb->rows) != 0) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        return -1;
    }
    if (o->sc.on) { /* one B: every rank's A and A scales, this rank's B, scales and bias */
        hb->ref[0] = malloc(hb->rows.n * o->n * sizeof(double));
        if (!hb->ref[0]) {
            fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
            return -1;
        }
        return ovl_demo_scaled_ag_reference(&o->sc, dt, o->world, m, o->n, k, o->seed, rank,
                                            &hb->rows, hb->ga, hb->ref[0]);
    }
    for (uint32_t r = 0; r < W; r++)
        ovl_demo_fill_host(dt, (char *)hb->ga + (size_t)r * m * k * es, m, k, k, o->seed, r, 0);
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i);
        hb->ref[i] = malloc(W * m * n * sizeof(double));
        if (!hb->ref[i]) {
            fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
            return -1;
        }
        ovl_status_t st = ovl_ref_gemm(dt, W * m, n, k, hb->ga, k, hb->b[i], o->transb ? k : n,
                                       o->transb, hb->ref[i], n);
        if (st != OVL_OK) {
            fprintf(stderr, "rank %u: reference (B %u): %s\n", rank, i, ovl_strerror(st));
            return -1;
        }
    }
    return 0;
}

/* Algorithm number ai on the host backend, into rs: one op untimed, then
 * o->iters back to back, timed; every C (and a_out) checked; with --timing
 * the paced submits. false once an op failed (rs says why): the comm's
 * error is sticky, later runs would say the same. */
static bool host_run_algo(const opts_t *o, ovl_client_t *cl, ovl_comm_t *comm,
                          const host_bufs_t *hb, int ai, result_t *rs)
{
    ovl_dtype_t dt = o->dtype, cdt = ovl_demo_c_dtype(&o->sc, dt);
    size_t es = ovl_dtype_size(dt), ces = ovl_dtype_size(cdt);
    uint64_t W = o->world, m = o->m, k = o->k;
    uint64_t ldo = k;

    rs->algo = o->algos[ai];
    ovl_ag_gemm_desc_t d = ovl_demo_desc(o, ai, hb->a, hb->b[0], hb->c[0], hb->aout, hb->more);
    d.scaling = o->sc.on ? &hb->scaling : NULL;
    /* One op untimed first: plans, scratch and (on a GPU) communicators
     * are made on first use. Then poison the outputs and time. */
    ovl_status_t st = ovl_allgather_gemm(comm, &d, NULL);
    if (st == OVL_OK)
        st = ovl_comm_synchronize(comm);
    for (uint32_t i = 0; i < o->nb; i++) /* NaN in every dtype: unwritten shows */
        memset(hb->c[i], 0xff, W * m * ovl_demo_bn(o, i) * ces);
    if (hb->aout)
        memset(hb->aout, 0xff, W * m * ldo * es);
    double t0 = ovl_mono_s();
    if (st == OVL_OK)
        st = ovl_demo_submit_loop(comm, (ovl_demo_op_t){.ag = &d}, NULL, o->iters, o->timing, rs);
    if (st == OVL_OK)
        st = ovl_comm_synchronize(comm);
    rs->ms = (ovl_mono_s() - t0) * 1e3 / o->iters;
    rs->status = st;
    if (st != OVL_OK) {
        snprintf(rs->msg, sizeof(rs->msg), "%s", ovl_last_error(cl));
        rs->rel_err = INFINITY;
        for (uint32_t i = 0; i < o->nb; i++)
            rs->rel_err_b[i] = INFINITY;
        return false;
    }
    rs->rel_err = 0;
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i);
        rs->rel_err_b[i] = ovl_demo_rows_error(cdt, &hb->rows, n, hb->c[i], n, hb->ref[i]);
        if (!(rs->rel_err_b[i] <= rs->rel_err)) /* NaN counts as worse */
            rs->rel_err = rs->rel_err_b[i];
    }
    rs->a_out_ok = true;
    if (hb->aout)
        for (uint64_t i = 0; i < W * m && rs->a_out_ok; i++)
            rs->a_out_ok =
                memcmp((char *)hb->aout + i * ldo * es, (char *)hb->ga + i * k * es, k * es) == 0;
    if (o->timing && (st = ovl_demo_paced_submits(comm, (ovl_demo_op_t){.ag = &d}, NULL, o->iters,
                                                  rs)) != OVL_OK) {
        rs->status = st;
        snprintf(rs->msg, sizeof(rs->msg), "paced submits: %s", ovl_last_error(cl));
        return false;
    }
    return true;
}

/* ------------------------------------------------ GEMM + reduce-scatter */

/* Runs every algorithm of --op rs on the host backend: each rank's A is
 * (world*m) x k, its B k x n (n x k with transb), its C m x n; one op
 * untimed, then o->iters back to back, C checked against
 * ovl_demo_rs_reference_rows over the rows ovl_demo_rows_of chose. 0 if
 * it ran (results in res), 1 if it could not. */
static int rank_host_rs(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t *comm,
                        result_t *res)
{
    const ovl_demo_scaled_t *sc = &o->sc;
    ovl_dtype_t dt = o->dtype, bdt = ovl_demo_b_dtype(sc, dt), cdt = ovl_demo_c_dtype(sc, dt);
    size_t es = ovl_dtype_size(dt), bes = ovl_dtype_size(bdt), ces = ovl_dtype_size(cdt);
    uint64_t W = o->world, m = o->m, n = o->n, k = o->k;
    uint64_t brows = o->transb ? n : k, bcols = o->transb ? k : n;
    /* --strided: A and C inside wider matrices, whose extra columns hold a
     * pattern that must survive */
    uint64_t lda = o->strided ? k + 3 : k, ldc = o->strided ? n + 5 : n;
    void *a = ovl_host_alloc(cl, W * m * lda * es), *b = ovl_host_alloc(cl, brows * bcols * bes);
    void *c = ovl_host_alloc(cl, m * ldc * ces);
    /* scaled: the scales of A's world*m rows, B's, the bias */
    float *sa = sc->on ? ovl_host_alloc(cl, ovl_demo_a_scales(sc, W * m, k) * sizeof(float)) : NULL;
    float *sb = sc->on ? ovl_host_alloc(cl, ovl_demo_b_scales(sc, n, k) * sizeof(float)) : NULL;
    void *bias = sc->on && sc->bias ? ovl_host_alloc(cl, n * ces) : NULL;
    ovl_demo_rows_t rows; /* of C, checked */
    double *ref = ovl_demo_rows_of(o, &rows) == 0 ? malloc(rows.n * n * sizeof(double)) : NULL;
    if (!a || !b || !c || !ref || (sc->on && (!sa || !sb || (sc->bias && !bias)))) {
        fprintf(stderr, "rank %u: out of memory: %s\n", rank, ovl_last_error(cl));
        free(ref);
        ovl_demo_rows_free(&rows);
        return 1;
    }
    memset(a, 0x5a, W * m * lda * es);
    ovl_demo_fill_host(dt, a, W * m, k, lda, o->seed, rank, 0);
    ovl_demo_fill_host(bdt, b, brows, bcols, bcols, o->seed, rank, 1);
    ovl_scaling_t scaling = {0};
    if (sc->on) {
        ovl_demo_fill_a_scale(sc, sa, W * m, k, o->seed, rank);
        ovl_demo_fill_b_scale(sc, sb, n, k, o->seed, rank);
        if (bias)
            ovl_demo_fill_bias(sc, bias, n, o->seed, rank);
        scaling = ovl_demo_scaling(sc, sa, sb, bias);
    }
    ovl_demo_rs_shape_t sh = ovl_demo_rs_shape(o);
    if (ovl_demo_rs_reference_rows(&sh, rank, &rows, ref) != 0) {
        free(ref);
        ovl_demo_rows_free(&rows);
        return 1;
    }
    for (int ai = 0; ai < o->nalgos; ai++) {
        result_t *rs = &res[ai];
        rs->algo = o->algos[ai];
        ovl_gemm_rs_desc_t d = ovl_demo_rs_desc(o, ai, a, lda, b, c, ldc);
        d.scaling = sc->on ? &scaling : NULL;
        ovl_status_t st = ovl_gemm_reduce_scatter(comm, &d, NULL);
        if (st == OVL_OK)
            st = ovl_comm_synchronize(comm);
        memset(c, 0xff, m * ldc * ces);             /* NaN in every dtype: unwritten shows */
        for (uint64_t i = 0; i < m && ldc > n; i++) /* the columns past C's */
            memset((char *)c + (i * ldc + n) * ces, 0xa5, (ldc - n) * ces);
        double t0 = ovl_mono_s();
        if (st == OVL_OK)
            st = ovl_demo_submit_loop(comm, (ovl_demo_op_t){.rs = &d}, NULL, o->iters, o->timing,
                                      rs);
        if (st == OVL_OK)
            st = ovl_comm_synchronize(comm);
        rs->ms = (ovl_mono_s() - t0) * 1e3 / o->iters;
        if (st == OVL_OK && o->timing)
            st = ovl_demo_paced_submits(comm, (ovl_demo_op_t){.rs = &d}, NULL, o->iters, rs);
        rs->status = st;
        rs->a_out_ok = true;
        if (st != OVL_OK) {
            snprintf(rs->msg, sizeof(rs->msg), "%s", ovl_last_error(cl));
            rs->rel_err = rs->rel_err_b[0] = INFINITY;
            break; /* the comm's error is sticky: later runs would say the same */
        }
        rs->rel_err = rs->rel_err_b[0] = ovl_demo_rows_error(cdt, &rows, n, c, ldc, ref);
        for (uint64_t i = 0; i < m && ldc > n; i++)
            for (uint64_t j = n * ces; j < ldc * ces; j++)
                if (((unsigned char *)c)[i * ldc * ces + j] != 0xa5) {
                    rs->a_out_ok = false; /* the row says: "wrote past C's columns" */
                    i = m;
                    break;
                }
    }
    free(ref);
    ovl_demo_rows_free(&rows);
    return 0;
}

/* Runs one rank on the host backend (ovld's ndevices devices, rank r on
 * device r mod ndevices): joins the job, makes and fills its data, computes
 * the references, runs every algorithm. 0 if it ran (results in res), 1 if
 * it could not (having said why). *comm is the job's, for the caller to
 * destroy, as ovl_demo_rank_cuda's. */
static int rank_host(const opts_t *o, uint32_t rank, ovl_client_t *cl, uint32_t ndevices,
                     ovl_comm_t **comm, result_t *res)
{
    host_bufs_t hb;
    int rc = 1;
    memset(&hb, 0, sizeof(hb));
    if (ovl_comm_init(cl, o->job, o->world, rank, (int)(rank % ndevices), comm) != OVL_OK) {
        fprintf(stderr, "rank %u: joining job '%s': %s\n", rank, o->job, ovl_last_error(cl));
        goto out;
    }
    if (o->op == OVL_OP_GEMM_RS)
        return rank_host_rs(o, rank, cl, *comm, res);
    if (host_buffers(o, rank, cl, &hb) != 0 || host_reference(o, rank, &hb) != 0)
        goto out;
    for (int ai = 0; ai < o->nalgos; ai++)
        if (!host_run_algo(o, cl, *comm, &hb, ai, &res[ai]))
            break;
    rc = 0;
out:
    for (uint32_t i = 0; i < OVL_MAX_BS; i++)
        free(hb.ref[i]);
    free(hb.ga);
    ovl_demo_rows_free(&hb.rows);
    return rc;
}

/* A rank, from its connection to its results: these go to the parent on
 * out_fd (every algorithm's, one write) where it ran (0), none where it
 * could not (1). */
static int rank_main(const opts_t *o, uint32_t rank, int out_fd)
{
    result_t res[MAX_ALGOS + 1];
    memset(res, 0, sizeof(res));
    for (int i = 0; i <= MAX_ALGOS; i++) {
        res[i].status = OVL_ERR_AGAIN; /* not run */
        snprintf(res[i].msg, sizeof(res[i].msg), "not run");
    }
    ovl_client_t *cl = NULL;
    ovl_comm_t *comm = NULL;
    int rc = 1;

    if (ovl_connect(o->socket, &cl) != OVL_OK) {
        rank_connected(ovl_connect_error()); /* the parent says it */
        goto out;
    }
    if (rank_connected(NULL) != 0)
        goto out;
    ovl_daemon_info_t info;
    ovl_daemon_info(cl, &info);
    if (info.ndevices == 0) {
        fprintf(stderr, "rank %u: ovld has no devices\n", rank);
        goto out;
    }
    if (o->idle_s) {
        /* on CUDA a rank names its GPU as this process numbers them, which
         * CUDA_VISIBLE_DEVICES may narrow below ovld's view */
        int ndev =
            strcmp(info.backend, "cuda") == 0 ? ovl_demo_cuda_devices(rank) : (int)info.ndevices;
        rc = ndev > 0 ? rank_idle(o, rank, cl, ndev) : 1;
        ovl_disconnect(cl);
        return rc;
    }
    if (strcmp(info.backend, "cuda") == 0 && o->op == OVL_OP_GEMM_RS)
        rc = ovl_demo_rank_cuda_rs(o, rank, cl, &comm, res);
    else if (strcmp(info.backend, "cuda") == 0)
        rc = ovl_demo_rank_cuda(o, rank, cl, &comm, res);
    else
        rc = rank_host(o, rank, cl, info.ndevices, &comm, res);
out:
    if (rc == 0) {
        ssize_t w = write(out_fd, res, sizeof(res));
        (void)w;
    }
    if (comm)
        ovl_comm_destroy(comm);
    ovl_disconnect(cl);
    return rc;
}

#ifndef OVL_HAVE_CUDA
static void no_cuda(uint32_t rank)
{
    fprintf(stderr,
            "rank %u: ovld runs the CUDA backend, but this ovl-demo was built without "
            "CUDA\n",
            rank);
}

int ovl_demo_rank_cuda(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t **comm,
                       result_t *res)
{
    (void)o;
    (void)cl;
    (void)comm;
    (void)res;
    no_cuda(rank);
    return 1;
}

int ovl_demo_rank_cuda_rs(const opts_t *o, uint32_t rank, ovl_client_t *cl, ovl_comm_t **comm,
                          result_t *res)
{
    return ovl_demo_rank_cuda(o, rank, cl, comm, res);
}

int ovl_demo_cuda_devices(uint32_t rank)
{
    no_cuda(rank);
    return 0;
}
#endif

/* ------------------------------------------------------------ main */

/* The child's side of fork for rank `rank`: never returns. A rank ends
 * with its parent, however that ends (SIGKILL passes nothing on, and a
 * rank left running would go on issuing ops to ovld for nobody): the
 * parent's death sends it SIGTERM, which kills a rank that runs ops (ovld
 * treats it as any client that disappears) and ends an idle one's stay
 * (on_idle_term, inherited). A parent gone before prctl took would send
 * nothing: the rank, reparented by then, sees another parent and ends. */
static _Noreturn void start_rank(const opts_t *o, uint32_t rank, int out_fd)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != o->parent)
        _exit(1);
    _exit(rank_main(o, rank, out_fd));
}

/* --idle's parent: waits for its ranks, passing SIGTERM on to them (it
 * looks every 50 ms, so that no signal slips in between its checks); 0 if
 * every rank joined and left. */
static int idle_wait(pid_t *pids, uint32_t world)
{
    int rc = 0;
    bool passed = false;
    for (uint32_t left = world; left > 0;) {
        if (idle_stop && !passed) {
            for (uint32_t r = 0; r < world; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGTERM);
            passed = true;
        }
        int ws;
        pid_t pid = waitpid(-1, &ws, WNOHANG);
        if (pid == 0 || (pid < 0 && errno == EINTR)) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (pid < 0)
            return 1;
        for (uint32_t r = 0; r < world; r++)
            if (pids[r] == pid)
                pids[r] = 0; /* reaped: never signalled again */
        left--;
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            rc = 1;
            idle_stop = 1; /* the others leave too, as in a run */
        }
    }
    printf("ovl-demo: job left%s\n", rc ? " (a rank failed)" : "");
    return rc;
}

/* --more-n's comma-separated list into o's Bs after the first. 0, or -1
 * with one line on stderr. */
static int parse_more_n(opts_t *o, const char *arg)
{
    char *list = strdup(arg), *save = NULL;
    int rc = -1;
    if (!list) {
        fprintf(stderr, "ovl-demo: out of memory\n");
        return -1;
    }
    o->nb = 1;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (o->nb == OVL_MAX_BS) {
            fprintf(stderr, "ovl-demo: --more-n: at most %d Bs after the first (an op takes %d)\n",
                    OVL_MAX_BS - 1, OVL_MAX_BS);
            goto out;
        }
        if (ovl_parse_u64(t, &v) != 0 || v == 0) {
            fprintf(stderr, "ovl-demo: --more-n: '%s' is not a positive number\n", t);
            goto out;
        }
        o->more_n[o->nb++ - 1] = v;
    }
    if (o->nb == 1) {
        fprintf(stderr, "ovl-demo: --more-n: no n given\n");
        goto out;
    }
    rc = 0;
out:
    free(list);
    return rc;
}

/* getopt_long's values for the options of ovl-demo that have no short
 * form. */
enum {
    O_CHUNKS = 1,
    O_STREAMS,
    O_TRANSB,
    O_AOUT,
    O_SEED,
    O_JOB,
    O_INTERIOR,
    O_MORE_N,
    O_TIMING,
    O_IDLE,
    O_OP,
    O_REDUCE,
    O_STRIDED,
    O_B_DTYPE,
    O_OUT_DTYPE,
    O_SCALE,
    O_A_SCALE,
    O_B_SCALE,
    O_BIAS,
    O_FAST_ACCUM,
    O_CHECK_ROWS
};

/* What the options said that is settled once all are read (demo_options):
 * --algo's word, the first option of a scaled op given (for the refusal
 * without an fp8 dtype), and --scale, --a-scale and --b-scale (-1: not
 * given). */
typedef struct parsed {
    const char *algo;
    const char *scaled_opt;
    int scale, a_scale, b_scale;
    bool b_dtype_given, out_dtype_given;
} parsed_t;

/* --scale's, --a-scale's or --b-scale's MODE (opt names the option): the
 * mode, or -1 after saying why. */
static int parse_scale_mode(const char *opt, const char *arg)
{
    ovl_scale_mode_t mode;
    if (ovl_scale_mode_parse(arg, &mode) == OVL_OK)
        return (int)mode;
    fprintf(stderr, "ovl-demo: %s: '%s' is not tensor, row, 1x128 or 128x128\n", opt, arg);
    return -1;
}

/* The options of a scaled op: -1 to go on, else 2 after saying why. */
static int scaled_option(opts_t *o, int ch, const char *arg, parsed_t *p)
{
    static const char *const names[] = {
        [O_B_DTYPE] = "--b-dtype",       [O_OUT_DTYPE] = "--out-dtype",  [O_SCALE] = "--scale",
        [O_A_SCALE] = "--a-scale",       [O_B_SCALE] = "--b-scale",      [O_BIAS] = "--bias",
        [O_FAST_ACCUM] = "--fast-accum", [O_CHECK_ROWS] = "--check-rows"};
    if (!p->scaled_opt)
        p->scaled_opt = names[ch];
    ovl_dtype_t dt;
    switch (ch) {
    case O_B_DTYPE:
        if (ovl_dtype_parse(arg, &dt) != OVL_OK || !ovl_dtype_is_fp8(dt)) {
            fprintf(stderr, "ovl-demo: --b-dtype: '%s' is not fp8e4m3 or fp8e5m2\n", arg);
            return 2;
        }
        o->sc.b_dtype = dt;
        p->b_dtype_given = true;
        break;
    case O_OUT_DTYPE:
        if (ovl_dtype_parse(arg, &dt) != OVL_OK || ovl_dtype_is_fp8(dt)) {
            fprintf(stderr,
                    "ovl-demo: --out-dtype: '%s' is not bf16, fp16 or fp32 (a scaled op's output "
                    "is never fp8)\n",
                    arg);
            return 2;
        }
        o->sc.out_dtype = dt;
        p->out_dtype_given = true;
        break;
    case O_SCALE:
    case O_A_SCALE:
    case O_B_SCALE: {
        int mode = parse_scale_mode(names[ch], arg);
        if (mode < 0)
            return 2;
        *(ch == O_SCALE ? &p->scale : ch == O_A_SCALE ? &p->a_scale : &p->b_scale) = mode;
        break;
    }
    case O_BIAS:
        o->sc.bias = true;
        break;
    case O_CHECK_ROWS: {
        uint64_t v;
        if (ovl_parse_u64(arg, &v) != 0 || v == OVL_DEMO_CHECK_AUTO) {
            fprintf(stderr, "ovl-demo: --check-rows: '%s' is not a number of rows\n", arg);
            return 2;
        }
        o->check_rows = v;
        break;
    }
    default: /* O_FAST_ACCUM */
        o->sc.fast_accum = true;
        break;
    }
    return -1;
}

/* One option (getopt_long's ch, and arg its optarg) into o, or into p
 * what is settled once every option is read: -1 to go on, else the exit
 * status (0 after --help, 2 after saying why). */
static int demo_option(opts_t *o, int ch, const char *arg, parsed_t *p)
{
    uint64_t v;
    switch (ch) {
    case 's':
        o->socket = arg;
        break;
    case 'a':
        p->algo = arg;
        break;
    case O_B_DTYPE:
    case O_OUT_DTYPE:
    case O_SCALE:
    case O_A_SCALE:
    case O_B_SCALE:
    case O_BIAS:
    case O_FAST_ACCUM:
    case O_CHECK_ROWS:
        return scaled_option(o, ch, arg, p);
    case 'd':
        if (ovl_dtype_parse(arg, &o->dtype) != OVL_OK) {
            fprintf(stderr, "ovl-demo: unknown dtype '%s'\n", arg);
            return 2;
        }
        break;
    case O_TRANSB:
        o->transb = true;
        break;
    case O_AOUT:
        o->a_out = true;
        break;
    case O_INTERIOR:
        o->interior = true;
        break;
    case O_TIMING:
        o->timing = true;
        break;
    case O_MORE_N:
        if (parse_more_n(o, arg) != 0)
            return 2;
        break;
    case O_JOB:
        snprintf(o->job, sizeof(o->job), "%s", arg);
        break;
    case O_STRIDED:
        o->strided = true;
        break;
    case O_OP:
        if (strcmp(arg, "ag") == 0) {
            o->op = OVL_OP_AG_GEMM;
        } else if (strcmp(arg, "rs") == 0) {
            o->op = OVL_OP_GEMM_RS;
        } else {
            fprintf(stderr, "ovl-demo: --op: '%s' is not ag or rs\n", arg);
            return 2;
        }
        break;
    case O_REDUCE:
        if (strcmp(arg, "sum") == 0) {
            o->reduce_op = OVL_REDUCE_SUM;
        } else if (strcmp(arg, "avg") == 0) {
            o->reduce_op = OVL_REDUCE_AVG;
        } else {
            fprintf(stderr, "ovl-demo: --reduce: '%s' is not sum or avg\n", arg);
            return 2;
        }
        break;
    case O_IDLE:
        if (ovl_parse_u64(arg, &v) != 0 || v == 0 || v > 86400) {
            fprintf(stderr, "ovl-demo: --idle: '%s' is not a number of seconds in 1..86400\n", arg);
            return 2;
        }
        o->idle_s = (uint32_t)v;
        break;
    case 'h':
        usage(stdout);
        return 0;
    case 'w':
    case 'm':
    case 'n':
    case 'k':
    case 'i':
    case O_CHUNKS:
    case O_STREAMS:
    case O_SEED:
        if (ovl_parse_u64(arg, &v) != 0) {
            fprintf(stderr, "ovl-demo: '%s' is not a number\n", arg);
            return 2;
        }
        if (ch == 'w')
            o->world = (uint32_t)v;
        else if (ch == 'm')
            o->m = v;
        else if (ch == 'n')
            o->n = v;
        else if (ch == 'k')
            o->k = v;
        else if (ch == 'i')
            o->iters = (int)v;
        else if (ch == O_CHUNKS)
            o->chunks = (uint32_t)v;
        else if (ch == O_STREAMS)
            o->streams = (uint32_t)v;
        else
            o->seed = v;
        break;
    default:
        usage(stderr);
        return 2;
    }
    return -1;
}

/* A scaled op's options settled (an fp8 -d): o->sc filled, with its
 * defaults (B fp8e4m3, C bf16, scales by row), transb implied. 0, or -1
 * after saying why: one of them without an fp8 dtype, both fp8e5m2,
 * several Bs, or what the rule of a scaling refuses (its words: modes
 * that do not go together, m or n not in fours for 1x128). */
static int scaled_options(opts_t *o, const parsed_t *p)
{
    if (!ovl_dtype_is_fp8(o->dtype)) {
        if (p->scaled_opt) {
            fprintf(stderr, "ovl-demo: %s is a scaled op's: -d fp8e4m3 or fp8e5m2 (not %s)\n",
                    p->scaled_opt, ovl_dtype_name(o->dtype));
            return -1;
        }
        return 0;
    }
    ovl_demo_scaled_t *sc = &o->sc;
    sc->on = true;
    if (!p->b_dtype_given)
        sc->b_dtype = OVL_DTYPE_FP8_E4M3;
    if (!p->out_dtype_given)
        sc->out_dtype = OVL_DTYPE_BF16;
    int both = p->scale >= 0 ? p->scale : OVL_SCALE_ROW;
    sc->a_mode = (ovl_scale_mode_t)(p->a_scale >= 0 ? p->a_scale : both);
    sc->b_mode = (ovl_scale_mode_t)(p->b_scale >= 0 ? p->b_scale : both);
    if (o->dtype == OVL_DTYPE_FP8_E5M2 && sc->b_dtype == OVL_DTYPE_FP8_E5M2) {
        fprintf(stderr, "ovl-demo: fp8e5m2 x fp8e5m2 has no GEMM (cuBLASLt's fp8 takes e4m3 on "
                        "one side at least): --b-dtype fp8e4m3\n");
        return -1;
    }
    if (o->nb > 1) {
        fprintf(stderr, "ovl-demo: a scaled (%s) op takes one B: no --more-n\n",
                ovl_dtype_name(o->dtype));
        return -1;
    }
    o->transb = true; /* cuBLASLt's one fp8 layout: B n x k */
    /* The rule libovl and ovld apply, said here before anything connects:
     * each GEMM's A has m rows in both kinds (ag: the rank's; rs: each
     * rank's block of C). */
    const char *why = ovl_demo_scaled_refusal(sc, o->dtype, o->m, o->n);
    if (why) {
        char shape[64] = "";
        if (!ovl_scaling_refusal(o->dtype, sc->b_dtype, sc->out_dtype, sc->a_mode, sc->b_mode,
                                 true))
            snprintf(shape, sizeof(shape), ", -m %" PRIu64 " -n %" PRIu64, o->m, o->n);
        /* --scale 128x128 gives A 128x128 too: name the way to the usual pair */
        bool hint = sc->a_mode == OVL_SCALE_BLOCK_128X128 && p->a_scale < 0;
        fprintf(stderr, "ovl-demo: scales %s/%s%s: %s%s\n", ovl_scale_mode_name(sc->a_mode),
                ovl_scale_mode_name(sc->b_mode), shape, why,
                hint ? " (--scale sets both sides: --a-scale 1x128 --b-scale 128x128)" : "");
        return -1;
    }
    return 0;
}

/* ovl-demo's options into *o (its defaults: usage's), checked, with the
 * algorithms to run: -1 to go on, else the exit status (0 after --help, 2
 * after saying why). o->socket stays NULL without --socket. */
static int demo_options(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        {"socket", required_argument, NULL, 's'},
        {"world", required_argument, NULL, 'w'},
        {"dtype", required_argument, NULL, 'd'},
        {"algo", required_argument, NULL, 'a'},
        {"iters", required_argument, NULL, 'i'},
        {"chunks", required_argument, NULL, O_CHUNKS},
        {"streams", required_argument, NULL, O_STREAMS},
        {"transb", no_argument, NULL, O_TRANSB},
        {"a-out", no_argument, NULL, O_AOUT},
        {"interior", no_argument, NULL, O_INTERIOR},
        {"more-n", required_argument, NULL, O_MORE_N},
        {"timing", no_argument, NULL, O_TIMING},
        {"idle", required_argument, NULL, O_IDLE},
        {"seed", required_argument, NULL, O_SEED},
        {"job", required_argument, NULL, O_JOB},
        {"op", required_argument, NULL, O_OP},
        {"reduce", required_argument, NULL, O_REDUCE},
        {"strided", no_argument, NULL, O_STRIDED},
        {"b-dtype", required_argument, NULL, O_B_DTYPE},
        {"out-dtype", required_argument, NULL, O_OUT_DTYPE},
        {"scale", required_argument, NULL, O_SCALE},
        {"a-scale", required_argument, NULL, O_A_SCALE},
        {"b-scale", required_argument, NULL, O_B_SCALE},
        {"bias", no_argument, NULL, O_BIAS},
        {"fast-accum", no_argument, NULL, O_FAST_ACCUM},
        {"check-rows", required_argument, NULL, O_CHECK_ROWS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (opts_t){.world = 4,
                  .m = 256,
                  .n = 384,
                  .k = 512,
                  .dtype = OVL_DTYPE_BF16,
                  .iters = 3,
                  .check_rows = OVL_DEMO_CHECK_AUTO,
                  .seed = (uint64_t)time(NULL) ^ (uint64_t)getpid(),
                  .nb = 1,
                  .op = OVL_OP_AG_GEMM};
    snprintf(o->job, sizeof(o->job), "demo-%d", (int)getpid());
    parsed_t p = {.algo = "all", .scale = -1, .a_scale = -1, .b_scale = -1};
    int ch, rc;
    while ((ch = getopt_long(argc, argv, "s:w:m:n:k:d:a:i:h", lo, NULL)) != -1)
        if ((rc = demo_option(o, ch, optarg, &p)) >= 0)
            return rc;
    const char *algo = p.algo;
    if (optind < argc || o->world == 0 || o->world > 64 || o->m == 0 || o->n == 0 || o->k == 0 ||
        o->iters <= 0 || o->iters > 100000) {
        fprintf(stderr, "ovl-demo: bad arguments (world 1..64, m n k > 0, iters 1..100000)\n");
        return 2;
    }
    bool rs = o->op == OVL_OP_GEMM_RS;
    if (rs && (o->a_out || o->nb > 1 || o->interior)) {
        fprintf(stderr, "ovl-demo: --op rs takes no --a-out, --more-n or --interior\n");
        return 2;
    }
    if (!rs && o->strided) {
        fprintf(stderr, "ovl-demo: --strided is --op rs's\n");
        return 2;
    }
    if (scaled_options(o, &p) != 0)
        return 2;
    if (strcmp(algo, "all") == 0) {
        /* every algorithm of the op's kind (ovl_op_kind_takes_algo) */
        o->algos[0] = OVL_ALGO_NAIVE;
        o->algos[1] = OVL_ALGO_COLLECTIVE;
        o->algos[2] = OVL_ALGO_RING;
        o->algos[3] = OVL_ALGO_PUSH; /* GEMM + reduce-scatter's */
        o->nalgos = rs ? 4 : 3;
    } else if (ovl_algo_parse(algo, &o->algos[0]) == OVL_OK) {
        o->nalgos = 1; /* one the op's kind does not have: libovl refuses it, with words */
    } else {
        fprintf(stderr, "ovl-demo: unknown algorithm '%s'\n", algo);
        return 2;
    }
    return -1;
}

/* The socket of o: --socket's, else ovl_default_socket's, written into
 * sock (len bytes) and chosen once, here, so that every rank connects to
 * the same ovld even if a per-user socket appears while they start. *rule
 * names the rule that chose it. 0, or 2 after saying why. */
static int demo_socket(opts_t *o, char *sock, size_t len, const char **rule)
{
    *rule = "--socket";
    if (o->socket)
        return 0;
    ovl_socket_rule_t r;
    if (ovl_default_socket(sock, len, &r) != OVL_OK) {
        fprintf(stderr, "ovl-demo: the default socket's path is too long\n");
        return 2;
    }
    o->socket = sock;
    *rule = ovl_socket_rule_name(r);
    return 0;
}

/* The ranks as their parent holds them (start_ranks); main frees pipes and
 * pids. */
typedef struct ranks {
    int (*pipes)[2]; /* rank r's results: the parent reads pipes[r][0] */
    pid_t *pids;     /* 0: none (not made, or reaped by idle_wait) */
    int conn;        /* the read end of connect_fd's pipe */
    int go;          /* the write end of go_fd's pipe */
} ranks_t;

/* Makes o's ranks (start_rank), each waiting for its byte on go_fd once it
 * connected; sets o->parent, and with --idle the handler of SIGTERM and
 * SIGINT that the ranks inherit. 0, or 1 after saying why (with --idle,
 * the ranks made so far have left and been waited for). */
static int start_ranks(opts_t *o, ranks_t *rk)
{
    int conn[2], go[2];
    rk->pipes = calloc(o->world, sizeof(*rk->pipes));
    rk->pids = calloc(o->world, sizeof(*rk->pids));
    if (!rk->pipes || !rk->pids)
        return 1;
    if (pipe(conn) != 0 || pipe(go) != 0) {
        perror("pipe");
        return 1;
    }
    connect_fd = conn[1];
    go_fd = go[0];
    fflush(stdout); /* nothing buffered for the ranks to print again */
    if (o->idle_s) {
        /* the ranks inherit it: SIGTERM ends their stay, and the parent
         * passes its own on to them */
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_idle_term;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
    }
    o->parent = getpid();
    for (uint32_t r = 0; r < o->world; r++) {
        if (pipe(rk->pipes[r]) != 0 || (rk->pids[r] = fork()) < 0) {
            perror(rk->pids[r] < 0 ? "fork" : "pipe");
            if (o->idle_s) { /* the ranks made so far leave, and are waited for */
                close(go[1]);
                rk->pids[r] = 0;
                idle_stop = 1;
                idle_wait(rk->pids, r);
            }
            return 1;
        }
        if (rk->pids[r] == 0) {
            close(rk->pipes[r][0]);
            close(conn[0]);
            close(go[1]);
            start_rank(o, r, rk->pipes[r][1]);
        }
        close(rk->pipes[r][1]);
    }
    close(conn[1]);
    close(go[0]);
    rk->conn = conn[0];
    rk->go = go[1];
    return 0;
}

/* Whether every rank connected: reads their bytes (rank_connected) until
 * all have, or the first that could not says why, which goes to stderr. */
static bool ranks_connected(const opts_t *o, const ranks_t *rk)
{
    char cmsg[1024];
    bool connected = true;
    for (uint32_t nconn = 0; nconn < o->world && connected;) {
        ssize_t n;
        do
            n = read(rk->conn, cmsg, sizeof(cmsg) - 1);
        while (n < 0 && errno == EINTR);
        if (n <= 0) {
            connected = false;
            fprintf(stderr, "ovl-demo: a rank ended before it connected to ovld\n");
        }
        /* one read may hold several ranks' bytes: "++-why" */
        for (ssize_t i = 0; i < n && connected; i++) {
            if (cmsg[i] == '+') {
                nconn++;
                continue;
            }
            connected = false;
            cmsg[n] = '\0';
            char *nl = strchr(cmsg + i + 1, '\n');
            if (nl)
                *nl = '\0';
            fprintf(stderr, "ovl-demo: %s\n", cmsg + i + 1);
        }
    }
    return connected;
}

/* Ends the ranks before they run: the connected ones read EOF on go_fd and
 * end, the others are sent SIGTERM; every one is waited for. */
static void stop_ranks(const opts_t *o, const ranks_t *rk)
{
    close(rk->go);
    for (uint32_t r = 0; r < o->world; r++) {
        kill(rk->pids[r], SIGTERM);
        waitpid(rk->pids[r], NULL, 0);
    }
}

/* The run's header, once every rank connected: the job and its shapes (or
 * --idle's), then the socket and the rule that chose it. */
static void print_header(const opts_t *o, const char *rule)
{
    char bs[256] = ""; /* ", 3 Bs (n=384,64,96)": at most 8 numbers of 20 digits */
    if (o->nb > 1) {
        size_t len = (size_t)snprintf(bs, sizeof(bs), ", %u Bs (n=%" PRIu64, o->nb, o->n);
        for (uint32_t i = 1; i < o->nb && len < sizeof(bs); i++)
            len += (size_t)snprintf(bs + len, sizeof(bs) - len, ",%" PRIu64, o->more_n[i - 1]);
        if (len < sizeof(bs))
            snprintf(bs + len, sizeof(bs) - len, ")");
    }
    char dts[160]; /* "fp8e4m3 x fp8e4m3 -> bf16, scales row/row, bias", or "bf16" */
    ovl_demo_scaled_describe(&o->sc, o->dtype, dts, sizeof(dts));
    if (o->idle_s)
        printf("ovl-demo: job '%s', world %u, idle: no ops\n", o->job, o->world);
    else
        printf("ovl-demo: job '%s', world %u, %s m=%" PRIu64 " (per rank) n=%" PRIu64 " k=%" PRIu64
               "%s, %s%s%s%s, %d op%s per algorithm, seed %" PRIu64 "\n",
               o->job, o->world, ovl_op_kind_name(o->op), o->m, o->n, o->k, bs, dts,
               o->transb ? ", transb" : "", o->a_out ? ", a_out" : "",
               o->op == OVL_OP_GEMM_RS ? (o->reduce_op == OVL_REDUCE_AVG ? ", avg" : ", sum") : "",
               o->iters, o->iters == 1 ? "" : "s", o->seed);
    printf("ovl-demo: socket %s (%s)\n", o->socket, rule);
    fflush(stdout);
}

/* Lets every rank go on (a byte each on go_fd). */
static void release_ranks(const opts_t *o, const ranks_t *rk)
{
    for (uint32_t r = 0; r < o->world; r++)
        if (write(rk->go, "g", 1) != 1)
            perror("write");
    close(rk->go);
}

/* Waits for every rank and reads its results into all (a rank's that sent
 * none say so). A rank that fails early leaves the others waiting for it
 * forever (as NCCL ranks would), so the first failure ends the rest.
 * Results are small: they wait in the pipes until every rank is gone.
 * true if every rank ended well and sent its results. */
static bool collect_results(const opts_t *o, const ranks_t *rk, result_t (*all)[MAX_ALGOS + 1])
{
    memset(all, 0, 64 * sizeof(*all));
    for (uint32_t r = 0; r < 64; r++)
        for (int i = 0; i <= MAX_ALGOS; i++) {
            all[r][i].status = OVL_ERR_AGAIN; /* no result unless a rank sends one */
            snprintf(all[r][i].msg, sizeof(all[r][i].msg), "rank %u sent no result", r);
        }
    bool ok = true;
    for (uint32_t left = o->world; left > 0; left--) {
        int ws;
        pid_t pid = waitpid(-1, &ws, 0);
        if (pid < 0)
            break;
        if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
            continue;
        for (uint32_t r = 0; r < o->world; r++)
            if (rk->pids[r] == pid && ok)
                fprintf(stderr, "ovl-demo: rank %u failed; stopping the others\n", r);
        if (ok) {
            /* a moment first, so that ovld sees the failed rank's
             * connection close before the others' (its log then names
             * that rank as the one whose leaving aborted the job): closed
             * together, ovld may read them in either order */
            struct timespec pause = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
            nanosleep(&pause, NULL);
            for (uint32_t r = 0; r < o->world; r++)
                if (rk->pids[r] != pid)
                    kill(rk->pids[r], SIGTERM);
        }
        ok = false;
    }
    for (uint32_t r = 0; r < o->world; r++) {
        ssize_t got = read(rk->pipes[r][0], all[r], sizeof(all[r]));
        close(rk->pipes[r][0]);
        if (got != (ssize_t)sizeof(all[r]))
            ok = false;
    }
    return ok;
}

/* One algorithm's row of the table: the worst of every rank's results. */
typedef struct row {
    double err, ms, err_b[OVL_MAX_BS];
    double sub50, sub99, pace50, pace99; /* --timing's columns */
    bool ok;
    const char *why; /* where not ok: a rank's message, a fixed text or why_b */
    char why_b[32];
} row_t;

/* Algorithm number ai's row from every rank's results in all, checked
 * against the tolerance tol. */
static void algo_row(const opts_t *o, result_t (*all)[MAX_ALGOS + 1], int ai, double tol,
                     row_t *row)
{
    memset(row, 0, sizeof(*row));
    row->ok = true;
    row->why = "";
    for (uint32_t r = 0; r < o->world; r++) {
        const result_t *rs = &all[r][ai];
        if (rs->status != OVL_OK) {
            row->ok = false;
            row->why = rs->msg[0] ? rs->msg : "no result";
            row->err = INFINITY;
            for (uint32_t i = 0; i < o->nb; i++)
                row->err_b[i] = INFINITY;
            continue;
        }
        for (uint32_t i = 0; i < o->nb; i++)
            if (!(rs->rel_err_b[i] <= row->err_b[i])) /* NaN counts as worse */
                row->err_b[i] = rs->rel_err_b[i];
        if (!(rs->rel_err <= row->err))
            row->err = rs->rel_err;
        if ((o->a_out || o->strided) && !rs->a_out_ok) {
            row->ok = false;
            row->why = o->a_out ? "gathered A differs" : "wrote past C's columns";
        }
        if (rs->ms > row->ms)
            row->ms = rs->ms;
        if (rs->submit_p50_us > row->sub50)
            row->sub50 = rs->submit_p50_us;
        if (rs->submit_p99_us > row->sub99)
            row->sub99 = rs->submit_p99_us;
        if (rs->paced_p50_us > row->pace50)
            row->pace50 = rs->paced_p50_us;
        if (rs->paced_p99_us > row->pace99)
            row->pace99 = rs->paced_p99_us;
    }
    if (!(row->err < tol)) {
        if (row->ok && o->nb > 1) {
            /* the first C over it */
            uint32_t i = 0;
            while (i + 1 < o->nb && row->err_b[i] < tol)
                i++;
            snprintf(row->why_b, sizeof(row->why_b), "C%u's error above tolerance", i);
            row->why = row->why_b;
        } else if (row->ok) {
            row->why = "error above tolerance";
        }
        row->ok = false;
    }
}

/* Algorithm number ai's row (flop: the work of one op), and with several
 * Bs each C's under it (the row's error is the worst). */
static void print_row(const opts_t *o, int ai, const row_t *row, double flop, double tol)
{
    char sub[80] = "";
    if (o->timing)
        snprintf(sub, sizeof(sub), "%13.1f  %13.1f  %12.1f  %12.1f  ", row->sub50, row->sub99,
                 row->pace50, row->pace99);
    printf("%-12s %10.3f %10.2f %12.3e  %s%s%s%s\n", ovl_algo_name(o->algos[ai]), row->ms,
           row->ms > 0 ? flop / (row->ms * 1e-3) / 1e9 : 0.0, row->err, sub,
           row->ok ? "OK" : "FAIL", row->ok ? "" : ": ", row->why);
    for (uint32_t i = 0; i < o->nb && o->nb > 1; i++) {
        char name[48];
        snprintf(name, sizeof(name), "C%u n=%" PRIu64, i, ovl_demo_bn(o, i));
        printf("  %-21s %21s %12.3e  %s\n", name, "", row->err_b[i],
               row->err_b[i] < tol ? "OK" : "FAIL");
    }
}

/* The table of results, one row per algorithm, and the verdict; ok: the
 * ranks ended well and sent their results (collect_results). true if
 * every check passed. */
static bool print_results(const opts_t *o, result_t (*all)[MAX_ALGOS + 1], bool ok)
{
    double ntotal = 0; /* every B's columns: the work of one op */
    for (uint32_t i = 0; i < o->nb; i++)
        ntotal += (double)ovl_demo_bn(o, i);
    double flop = 2.0 * (double)o->world * (double)o->m * ntotal * (double)o->k;
    double tol = ovl_demo_scaled_tolerance(&o->sc, o->dtype);
    printf("\n%-12s %10s %10s %12s  %s%s\n", "algorithm", "ms/op", "GFLOP/s", "rel. error",
           o->timing ? "submit p50 us  submit p99 us  paced p50 us  paced p99 us  " : "", "check");
    for (int ai = 0; ai < o->nalgos; ai++) {
        row_t row;
        algo_row(o, all, ai, tol, &row);
        ok = ok && row.ok;
        print_row(o, ai, &row, flop, tol);
    }
    /* the rows each rank checked, as they chose them (ovl_demo_rows_of) */
    char checked[96] = "";
    ovl_demo_rows_t rows;
    if (ovl_demo_rows_of(o, &rows) == 0 && rows.n < rows.total)
        snprintf(checked, sizeof(checked),
                 " (checked %" PRIu64 " of %" PRIu64 " rows of each rank's C)", rows.n, rows.total);
    ovl_demo_rows_free(&rows);
    printf("\n%s (tolerance %.0e on ||C - ref|| / ||ref||%s%s, reference in double precision)%s\n",
           ok ? "all checks passed" : "CHECKS FAILED", tol, o->nb > 1 ? " of every C" : "",
           o->sc.on && o->sc.fast_accum ? ", twice the output dtype's for --fast-accum" : "",
           checked);
    return ok;
}

/* A run's end, once the ranks go on: their results, the table; the exit
 * status (0 if every check passed). */
static int run_results(const opts_t *o, const ranks_t *rk)
{
    result_t all[64][MAX_ALGOS + 1];
    bool ok = collect_results(o, rk, all);
    return print_results(o, all, ok) ? 0 : 1;
}

int main(int argc, char **argv)
{
    opts_t o;
    ranks_t rk = {NULL, NULL, -1, -1};
    char sock[4096];
    const char *rule;
    int rc = demo_options(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (demo_socket(&o, sock, sizeof(sock), &rule) != 0)
        return 2;
    rc = 1;
    if (start_ranks(&o, &rk) != 0)
        goto out;
    /* Every rank connected, or the first that could not says why. */
    bool connected = ranks_connected(&o, &rk);
    close(rk.conn);
    if (!connected) {
        stop_ranks(&o, &rk);
        goto out;
    }
    print_header(&o, rule);
    release_ranks(&o, &rk);
    if (o.idle_s) {
        for (uint32_t r = 0; r < o.world; r++)
            close(rk.pipes[r][0]);
        rc = idle_wait(rk.pids, o.world);
    } else {
        rc = run_results(&o, &rk);
    }
out:
    free(rk.pipes);
    free(rk.pids);
    return rc;
}

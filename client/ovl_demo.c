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
#include "half.h"
#include "hostgemm.h"
#include "num.h"
#include "ovl.h"
#include "ovl_demo.h"
#include "clock.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: ovl-demo [OPTIONS]\n"
        "\n"
        "Runs W client processes that join one job on ovld and check AG-GEMM results\n"
        "(C = allgather(A) @ B) against a double-precision reference.\n"
        "\n"
        "  -s, --socket PATH   ovld's socket; default: $OVL_SOCKET, else the per-user\n"
        "                      /run/ovl/UID/ovld.sock or $XDG_RUNTIME_DIR/ovl/ovld.sock if\n"
        "                      it exists, else %s (ovl_default_socket in\n"
        "                      <ovl/ovl.h>); the first line printed names the one used\n"
        "  -w, --world W       ranks (processes), default 4\n"
        "  -m M -n N -k K      shard rows, columns of C, inner dimension (default 256 384 512)\n"
        "  -d, --dtype T       bf16, fp16 or fp32 (default bf16)\n"
        "  -a, --algo A        naive, collective, ring, auto or all (default all)\n"
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
        "  -h, --help          show this help\n",
        OVL_DEFAULT_SOCKET, OVL_MAX_BS - 1, OVL_DEMO_PACE);
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
    void *a = NULL, *aout = NULL;
    void *b[OVL_MAX_BS] = {NULL}, *c[OVL_MAX_BS] = {NULL}; /* B i and C i */
    ovl_ag_gemm_b_t more[OVL_MAX_BS - 1];                  /* B 1 .. of the op */
    void *ga = NULL; /* every rank's A, regenerated: the reference's input and a_out's check */
    double *ref[OVL_MAX_BS] = {NULL}; /* C i's reference */
    int rc = 1;
    ovl_dtype_t dt = o->dtype;
    size_t es = ovl_dtype_size(dt);
    uint64_t W = o->world, m = o->m, k = o->k;
    uint64_t lda = k, ldo = k;

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
    if (strcmp(info.backend, "cuda") == 0) {
        rc = ovl_demo_rank_cuda(o, rank, cl, &comm, res);
        goto out;
    }
    if (ovl_comm_init(cl, o->job, o->world, rank, (int)(rank % info.ndevices), &comm) != OVL_OK) {
        fprintf(stderr, "rank %u: joining job '%s': %s\n", rank, o->job, ovl_last_error(cl));
        goto out;
    }
    a = ovl_host_alloc(cl, m * lda * es);
    if (o->a_out)
        aout = ovl_host_alloc(cl, W * m * ldo * es);
    if (!a || (o->a_out && !aout)) {
        fprintf(stderr, "rank %u: ovl_host_alloc: %s\n", rank, ovl_last_error(cl));
        goto out;
    }
    ovl_demo_fill_host(dt, a, m, k, lda, o->seed, rank, 0);
    /* B i is matrix 1 + i of the rank (B 0 the demo's one B), dense */
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i), ldb = o->transb ? k : n;
        uint64_t brows = o->transb ? n : k, bcols = o->transb ? k : n;
        b[i] = ovl_host_alloc(cl, brows * ldb * es);
        c[i] = ovl_host_alloc(cl, W * m * n * es);
        if (!b[i] || !c[i]) {
            fprintf(stderr, "rank %u: ovl_host_alloc (B %u): %s\n", rank, i, ovl_last_error(cl));
            goto out;
        }
        ovl_demo_fill_host(dt, b[i], brows, bcols, ldb, o->seed, rank, 1 + (int)i);
        if (i > 0)
            more[i - 1] = ovl_demo_b(o, i, b[i], c[i]);
    }

    /* Reference: every rank's shard, regenerated, times each of this rank's Bs. */
    ga = malloc(W * m * k * es);
    if (!ga) {
        fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
        goto out;
    }
    for (uint32_t r = 0; r < W; r++)
        ovl_demo_fill_host(dt, (char *)ga + (size_t)r * m * k * es, m, k, k, o->seed, r, 0);
    ovl_status_t st;
    for (uint32_t i = 0; i < o->nb; i++) {
        uint64_t n = ovl_demo_bn(o, i);
        ref[i] = malloc(W * m * n * sizeof(double));
        if (!ref[i]) {
            fprintf(stderr, "rank %u: out of memory for the reference\n", rank);
            goto out;
        }
        st = ovl_ref_gemm(dt, W * m, n, k, ga, k, b[i], o->transb ? k : n, o->transb, ref[i], n);
        if (st != OVL_OK) {
            fprintf(stderr, "rank %u: reference (B %u): %s\n", rank, i, ovl_strerror(st));
            goto out;
        }
    }

    for (int ai = 0; ai < o->nalgos; ai++) {
        result_t *rs = &res[ai];
        rs->algo = o->algos[ai];
        ovl_ag_gemm_desc_t d = ovl_demo_desc(o, ai, a, b[0], c[0], aout, more);
        /* One op untimed first: plans, scratch and (on a GPU) communicators
         * are made on first use. Then poison the outputs and time. */
        st = ovl_allgather_gemm(comm, &d, NULL);
        if (st == OVL_OK)
            st = ovl_comm_synchronize(comm);
        for (uint32_t i = 0; i < o->nb; i++) /* NaN in every dtype: unwritten shows */
            memset(c[i], 0xff, W * m * ovl_demo_bn(o, i) * es);
        if (aout)
            memset(aout, 0xff, W * m * ldo * es);
        double t0 = ovl_mono_s();
        if (st == OVL_OK)
            st = ovl_demo_submit_loop(comm, &d, NULL, o->iters, o->timing, rs);
        if (st == OVL_OK)
            st = ovl_comm_synchronize(comm);
        rs->ms = (ovl_mono_s() - t0) * 1e3 / o->iters;
        rs->status = st;
        if (st != OVL_OK) {
            snprintf(rs->msg, sizeof(rs->msg), "%s", ovl_last_error(cl));
            rs->rel_err = INFINITY;
            for (uint32_t i = 0; i < o->nb; i++)
                rs->rel_err_b[i] = INFINITY;
            break; /* the comm's error is sticky: later runs would say the same */
        }
        rs->rel_err = 0;
        for (uint32_t i = 0; i < o->nb; i++) {
            uint64_t n = ovl_demo_bn(o, i);
            rs->rel_err_b[i] = ovl_rel_error(dt, W * m, n, c[i], n, ref[i], n);
            if (!(rs->rel_err_b[i] <= rs->rel_err)) /* NaN counts as worse */
                rs->rel_err = rs->rel_err_b[i];
        }
        rs->a_out_ok = true;
        if (aout)
            for (uint64_t i = 0; i < W * m && rs->a_out_ok; i++)
                rs->a_out_ok =
                    memcmp((char *)aout + i * ldo * es, (char *)ga + i * k * es, k * es) == 0;
        if (o->timing && (st = ovl_demo_paced_submits(comm, &d, NULL, o->iters, rs)) != OVL_OK) {
            rs->status = st;
            snprintf(rs->msg, sizeof(rs->msg), "paced submits: %s", ovl_last_error(cl));
            break;
        }
    }
    rc = 0;
out:
    if (rc == 0) {
        ssize_t w = write(out_fd, res, sizeof(res));
        (void)w;
    }
    for (uint32_t i = 0; i < OVL_MAX_BS; i++)
        free(ref[i]);
    free(ga);
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

int main(int argc, char **argv)
{
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
        O_IDLE
    };
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    opts_t o = {.world = 4,
                .m = 256,
                .n = 384,
                .k = 512,
                .dtype = OVL_DTYPE_BF16,
                .iters = 3,
                .seed = (uint64_t)time(NULL) ^ (uint64_t)getpid(),
                .nb = 1};
    snprintf(o.job, sizeof(o.job), "demo-%d", (int)getpid());
    const char *algo = "all";
    int ch;
    uint64_t v;
    while ((ch = getopt_long(argc, argv, "s:w:m:n:k:d:a:i:h", lo, NULL)) != -1) {
        switch (ch) {
        case 's':
            o.socket = optarg;
            break;
        case 'a':
            algo = optarg;
            break;
        case 'd':
            if (ovl_dtype_parse(optarg, &o.dtype) != OVL_OK) {
                fprintf(stderr, "ovl-demo: unknown dtype '%s'\n", optarg);
                return 2;
            }
            break;
        case O_TRANSB:
            o.transb = true;
            break;
        case O_AOUT:
            o.a_out = true;
            break;
        case O_INTERIOR:
            o.interior = true;
            break;
        case O_TIMING:
            o.timing = true;
            break;
        case O_MORE_N:
            if (parse_more_n(&o, optarg) != 0)
                return 2;
            break;
        case O_JOB:
            snprintf(o.job, sizeof(o.job), "%s", optarg);
            break;
        case O_IDLE:
            if (ovl_parse_u64(optarg, &v) != 0 || v == 0 || v > 86400) {
                fprintf(stderr, "ovl-demo: --idle: '%s' is not a number of seconds in 1..86400\n",
                        optarg);
                return 2;
            }
            o.idle_s = (uint32_t)v;
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
            if (ovl_parse_u64(optarg, &v) != 0) {
                fprintf(stderr, "ovl-demo: '%s' is not a number\n", optarg);
                return 2;
            }
            if (ch == 'w')
                o.world = (uint32_t)v;
            else if (ch == 'm')
                o.m = v;
            else if (ch == 'n')
                o.n = v;
            else if (ch == 'k')
                o.k = v;
            else if (ch == 'i')
                o.iters = (int)v;
            else if (ch == O_CHUNKS)
                o.chunks = (uint32_t)v;
            else if (ch == O_STREAMS)
                o.streams = (uint32_t)v;
            else
                o.seed = v;
            break;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || o.world == 0 || o.world > 64 || o.m == 0 || o.n == 0 || o.k == 0 ||
        o.iters <= 0 || o.iters > 100000) {
        fprintf(stderr, "ovl-demo: bad arguments (world 1..64, m n k > 0, iters 1..100000)\n");
        return 2;
    }
    if (strcmp(algo, "all") == 0) {
        o.algos[0] = OVL_ALGO_NAIVE;
        o.algos[1] = OVL_ALGO_COLLECTIVE;
        o.algos[2] = OVL_ALGO_RING;
        o.nalgos = 3;
    } else if (ovl_algo_parse(algo, &o.algos[0]) == OVL_OK) {
        o.nalgos = 1;
    } else {
        fprintf(stderr, "ovl-demo: unknown algorithm '%s'\n", algo);
        return 2;
    }

    /* Chosen once, here, so that every rank connects to the same ovld even
     * if a per-user socket appears while they start. */
    char sock[4096];
    const char *rule = "--socket";
    if (!o.socket) {
        ovl_socket_rule_t r;
        if (ovl_default_socket(sock, sizeof(sock), &r) != OVL_OK) {
            fprintf(stderr, "ovl-demo: the default socket's path is too long\n");
            return 2;
        }
        o.socket = sock;
        rule = ovl_socket_rule_name(r);
    }

    char bs[256] = ""; /* ", 3 Bs (n=384,64,96)": at most 8 numbers of 20 digits */
    if (o.nb > 1) {
        size_t len = (size_t)snprintf(bs, sizeof(bs), ", %u Bs (n=%" PRIu64, o.nb, o.n);
        for (uint32_t i = 1; i < o.nb && len < sizeof(bs); i++)
            len += (size_t)snprintf(bs + len, sizeof(bs) - len, ",%" PRIu64, o.more_n[i - 1]);
        if (len < sizeof(bs))
            snprintf(bs + len, sizeof(bs) - len, ")");
    }
    int(*pipes)[2] = calloc(o.world, sizeof(*pipes));
    pid_t *pids = calloc(o.world, sizeof(*pids));
    int conn[2], go[2];
    if (!pipes || !pids)
        return 1;
    if (pipe(conn) != 0 || pipe(go) != 0) {
        perror("pipe");
        return 1;
    }
    connect_fd = conn[1];
    go_fd = go[0];
    fflush(stdout); /* nothing buffered for the ranks to print again */
    if (o.idle_s) {
        /* the ranks inherit it: SIGTERM ends their stay, and the parent
         * passes its own on to them */
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_idle_term;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
    }
    o.parent = getpid();
    for (uint32_t r = 0; r < o.world; r++) {
        if (pipe(pipes[r]) != 0 || (pids[r] = fork()) < 0) {
            perror(pids[r] < 0 ? "fork" : "pipe");
            if (o.idle_s) { /* the ranks made so far leave, and are waited for */
                close(go[1]);
                pids[r] = 0;
                idle_stop = 1;
                idle_wait(pids, r);
            }
            return 1;
        }
        if (pids[r] == 0) {
            close(pipes[r][0]);
            close(conn[0]);
            close(go[1]);
            start_rank(&o, r, pipes[r][1]);
        }
        close(pipes[r][1]);
    }
    close(conn[1]);
    close(go[0]);
    /* Every rank connected, or the first that could not says why. */
    char cmsg[1024];
    bool connected = true;
    for (uint32_t nconn = 0; nconn < o.world && connected;) {
        ssize_t n;
        do
            n = read(conn[0], cmsg, sizeof(cmsg) - 1);
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
    close(conn[0]);
    if (!connected) {
        close(go[1]); /* the connected ranks read EOF and end */
        for (uint32_t r = 0; r < o.world; r++) {
            kill(pids[r], SIGTERM);
            waitpid(pids[r], NULL, 0);
        }
        free(pipes);
        free(pids);
        return 1;
    }
    if (o.idle_s)
        printf("ovl-demo: job '%s', world %u, idle: no ops\n", o.job, o.world);
    else
        printf("ovl-demo: job '%s', world %u, m=%" PRIu64 " (per rank) n=%" PRIu64 " k=%" PRIu64
               "%s, %s%s%s, %d op%s per algorithm, seed %" PRIu64 "\n",
               o.job, o.world, o.m, o.n, o.k, bs, ovl_dtype_name(o.dtype),
               o.transb ? ", transb" : "", o.a_out ? ", a_out" : "", o.iters,
               o.iters == 1 ? "" : "s", o.seed);
    printf("ovl-demo: socket %s (%s)\n", o.socket, rule);
    fflush(stdout);
    for (uint32_t r = 0; r < o.world; r++)
        if (write(go[1], "g", 1) != 1)
            perror("write");
    close(go[1]);
    if (o.idle_s) {
        for (uint32_t r = 0; r < o.world; r++)
            close(pipes[r][0]);
        int rc = idle_wait(pids, o.world);
        free(pipes);
        free(pids);
        return rc;
    }
    result_t all[64][MAX_ALGOS + 1];
    memset(all, 0, sizeof(all));
    for (uint32_t r = 0; r < 64; r++)
        for (int i = 0; i <= MAX_ALGOS; i++) {
            all[r][i].status = OVL_ERR_AGAIN; /* no result unless a rank sends one */
            snprintf(all[r][i].msg, sizeof(all[r][i].msg), "rank %u sent no result", r);
        }
    bool ok = true;
    /* A rank that fails early leaves the others waiting for it forever (as
     * NCCL ranks would), so the first failure ends the rest. Results are
     * small: they wait in the pipes until every rank is gone. */
    for (uint32_t left = o.world; left > 0; left--) {
        int ws;
        pid_t pid = waitpid(-1, &ws, 0);
        if (pid < 0)
            break;
        if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
            continue;
        for (uint32_t r = 0; r < o.world; r++)
            if (pids[r] == pid && ok)
                fprintf(stderr, "ovl-demo: rank %u failed; stopping the others\n", r);
        if (ok)
            for (uint32_t r = 0; r < o.world; r++)
                if (pids[r] != pid)
                    kill(pids[r], SIGTERM);
        ok = false;
    }
    for (uint32_t r = 0; r < o.world; r++) {
        ssize_t got = read(pipes[r][0], all[r], sizeof(all[r]));
        close(pipes[r][0]);
        if (got != (ssize_t)sizeof(all[r]))
            ok = false;
    }
    double ntotal = 0; /* every B's columns: the work of one op */
    for (uint32_t i = 0; i < o.nb; i++)
        ntotal += (double)ovl_demo_bn(&o, i);
    double flop = 2.0 * (double)o.world * (double)o.m * ntotal * (double)o.k;
    double tol = ovl_demo_tolerance(o.dtype);
    printf("\n%-12s %10s %10s %12s  %s%s\n", "algorithm", "ms/op", "GFLOP/s", "rel. error",
           o.timing ? "submit p50 us  submit p99 us  paced p50 us  paced p99 us  " : "", "check");
    for (int ai = 0; ai < o.nalgos; ai++) {
        double err = 0, ms = 0, err_b[OVL_MAX_BS] = {0}, sub50 = 0, sub99 = 0, pace50 = 0,
               pace99 = 0;
        bool row_ok = true;
        const char *why = "";
        char why_b[32];
        for (uint32_t r = 0; r < o.world; r++) {
            const result_t *rs = &all[r][ai];
            if (rs->status != OVL_OK) {
                row_ok = false;
                why = rs->msg[0] ? rs->msg : "no result";
                err = INFINITY;
                for (uint32_t i = 0; i < o.nb; i++)
                    err_b[i] = INFINITY;
                continue;
            }
            for (uint32_t i = 0; i < o.nb; i++)
                if (!(rs->rel_err_b[i] <= err_b[i])) /* NaN counts as worse */
                    err_b[i] = rs->rel_err_b[i];
            if (!(rs->rel_err <= err))
                err = rs->rel_err;
            if (o.a_out && !rs->a_out_ok) {
                row_ok = false;
                why = "gathered A differs";
            }
            if (rs->ms > ms)
                ms = rs->ms;
            if (rs->submit_p50_us > sub50)
                sub50 = rs->submit_p50_us;
            if (rs->submit_p99_us > sub99)
                sub99 = rs->submit_p99_us;
            if (rs->paced_p50_us > pace50)
                pace50 = rs->paced_p50_us;
            if (rs->paced_p99_us > pace99)
                pace99 = rs->paced_p99_us;
        }
        if (!(err < tol)) {
            if (row_ok && o.nb > 1) {
                /* the first C over it */
                uint32_t i = 0;
                while (i + 1 < o.nb && err_b[i] < tol)
                    i++;
                snprintf(why_b, sizeof(why_b), "C%u's error above tolerance", i);
                why = why_b;
            } else if (row_ok) {
                why = "error above tolerance";
            }
            row_ok = false;
        }
        ok = ok && row_ok;
        char sub[80] = "";
        if (o.timing)
            snprintf(sub, sizeof(sub), "%13.1f  %13.1f  %12.1f  %12.1f  ", sub50, sub99, pace50,
                     pace99);
        printf("%-12s %10.3f %10.2f %12.3e  %s%s%s%s\n", ovl_algo_name(o.algos[ai]), ms,
               ms > 0 ? flop / (ms * 1e-3) / 1e9 : 0.0, err, sub, row_ok ? "OK" : "FAIL",
               row_ok ? "" : ": ", why);
        /* several Bs: each C under its algorithm (the row's error is the worst) */
        for (uint32_t i = 0; i < o.nb && o.nb > 1; i++) {
            char name[48];
            snprintf(name, sizeof(name), "C%u n=%" PRIu64, i, ovl_demo_bn(&o, i));
            printf("  %-21s %21s %12.3e  %s\n", name, "", err_b[i], err_b[i] < tol ? "OK" : "FAIL");
        }
    }
    printf("\n%s (tolerance %.0e on ||C - ref|| / ||ref||%s, reference in double precision)\n",
           ok ? "all checks passed" : "CHECKS FAILED", tol, o.nb > 1 ? " of every C" : "");
    free(pipes);
    free(pids);
    return ok ? 0 : 1;
}

/*
 * test_cuda_net.c: the CUDA backend's jobs across nodes, below the daemon:
 * job_key, job_setup with net, allgather/rail for the local part only,
 * job_abort and the teardown after it.
 *
 * The parent forks WORLD processes (argv[1], 2 or 4), each a "node" of one
 * rank: its own NCCL_HOSTID, so that NCCL takes them for separate hosts and
 * uses its network transport even where they share one GPU (run it under
 * MPS there: DESIGN.md, "Testing on one machine"). Rank r uses device
 * r % devices. Each child makes its own libuv loop and CUDA backend
 * (ovld_backend_cuda_create), one rank, and then, in order:
 *
 *   1. rank 0 calls job_key; the 128 bytes go to the others by pipes; every
 *      rank calls job_setup(net = {world, global = {r}, node_of[q] = q,
 *      self_node = r, nnodes = world, key}); the callback must say OVL_OK.
 *   2. a job_setup of two more ranks of this process on its GPU in one
 *      communicator, the job's (a key) or a rail group's (rail keys, nodes
 *      of 1 + 2 ranks), must be refused through the callback
 *      (OVL_ERR_UNSUPPORTED, "share device") before NCCL is called.
 *   3. allgather nccl-allgather of m = 64 rows x 32 fp32 columns from A
 *      into G (stride m): every block q of G must hold rank q's A.
 *   4. allgather nccl-sendrecv of the first m/2 rows, stride m: block q's
 *      first m/2 rows hold rank q's, the rest keep their poison.
 *   5. rail nccl-rail, sending to and receiving from every other rank:
 *      every other block holds its rank's A, the own block its poison.
 *   Then a barrier (through the parent), and the abort: rank world-1 stays
 *   out, as a lost node would; every other rank issues an nccl-allgather
 *   (which must launch, and then wait on the GPU for the missing rank) and
 *   a done (op 100); after 1.5 s with no completion it calls job_abort; the
 *   completion must come with OVL_ERR_ABORTED and words saying "aborted",
 *   the doorbell must say error OVL_ERR_ABORTED at op 100 and done 100, and
 *   a further all-gather must fail at once with OVL_ERR_ABORTED. A second
 *   barrier; rank world-1 then aborts its own communicator. Every rank
 *   tears its job down (after the abort: the teardown must not finalize
 *   the aborted communicator) and destroys the backend, whose loop must
 *   then end.
 *
 * Each child prints its checks and "rank R: N passed, N failed"; the
 * parent exits 0 only if every child passed. A child that finds no GPU or
 * cannot start the backend exits 77 (ctest's skip), and so does the parent.
 * Children give up after 150 s (SIGALRM). The parent never touches CUDA.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <uv.h>

#include "backend.h"
#include "doorbell.h"

#define MAX_WORLD 8
#define M         64u /* rows of a rank's A */
#define COLS      32u
#define ABORT_SEQ 100u

static int g_rank;
static unsigned g_passed, g_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_passed++;                                                                            \
        } else {                                                                                   \
            g_failed++;                                                                            \
            fprintf(stderr, "rank %d: FAILED %s:%d: ", g_rank, __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

typedef struct ctx {
    bool setup_done;
    ovl_status_t setup_st;
    char setup_msg[256];
    unsigned ndone;
    uint64_t done_seq;
    ovl_status_t done_st;
    char done_msg[256];
} ctx_t;

static void on_report(void *arg, ovld_report_level_t level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "rank %d: backend report (%d): %s\n", g_rank, (int)level, msg);
}

static void on_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status, const char *message,
                    uint64_t ns)
{
    ctx_t *c = arg;
    (void)ns;
    (void)cookie;
    c->ndone++;
    c->done_seq = seq;
    c->done_st = status;
    snprintf(c->done_msg, sizeof(c->done_msg), "%s", message ? message : "");
}

static void on_setup(void *arg, ovl_status_t status, const char *message)
{
    ctx_t *c = arg;
    c->setup_done = true;
    c->setup_st = status;
    snprintf(c->setup_msg, sizeof(c->setup_msg), "%s", message ? message : "");
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Runs the loop until *flag is true or ms passed (the backend's watchdog
 * timer wakes it every 100 ms); flag NULL: for ms. */
static void run_until(uv_loop_t *loop, const bool *flag, uint64_t ms)
{
    uint64_t end = now_ms() + ms;
    while ((!flag || !*flag) && now_ms() < end)
        uv_run(loop, UV_RUN_ONCE);
}

static float val(uint32_t rank, uint32_t row, uint32_t col)
{
    return (float)(rank * 65536u + row * 64u + col); /* exact in fp32 */
}

static bool is_poison(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u == 0xFFFFFFFFu;
}

static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
    size_t put = 0;
    while (put < len) {
        ssize_t n = write(fd, (const char *)buf + put, len - put);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        put += (size_t)n;
    }
    return 0;
}

/* Every child at the same point: one byte to the parent, one back. */
static void barrier(int to_parent, int from_parent)
{
    char c = 'b';
    if (write_full(to_parent, &c, 1) != 0 || read_full(from_parent, &c, 1) != 0) {
        fprintf(stderr, "rank %d: barrier: the parent is gone\n", g_rank);
        _exit(1);
    }
}

/* Copies G back and checks its blocks: block q's first `rows` rows hold
 * rank q's A where want[q] (else poison), the rest of each block poison. */
static void check_g(const float *dG, uint32_t world, uint32_t rows, const bool *want,
                    const char *what)
{
    size_t n = (size_t)world * M * COLS;
    float *g = malloc(n * sizeof(*g));
    if (!g || cudaMemcpy(g, dG, n * sizeof(*g), cudaMemcpyDeviceToHost) != cudaSuccess) {
        CHECK(false, "%s: copying G back", what);
        free(g);
        return;
    }
    unsigned bad = 0;
    for (uint32_t q = 0; q < world; q++)
        for (uint32_t i = 0; i < M; i++)
            for (uint32_t c = 0; c < COLS; c++) {
                float x = g[((size_t)q * M + i) * COLS + c];
                bool ok = want[q] && i < rows ? x == val(q, i, c) : is_poison(x);
                if (!ok && bad++ < 4)
                    fprintf(stderr, "rank %d: %s: G block %u row %u col %u = %g\n", g_rank, what, q,
                            i, c, (double)x);
            }
    CHECK(bad == 0, "%s: %u wrong elements in G", what, bad);
    free(g);
}

static int child(uint32_t r, uint32_t world, int key_in, const int *key_out, int to_parent,
                 int from_parent)
{
    char hostid[64];
    g_rank = (int)r;
    snprintf(hostid, sizeof(hostid), "ovl-test-net-%d-%u", (int)getppid(), r);
    setenv("NCCL_HOSTID", hostid, 1); /* before any CUDA or NCCL call */
    alarm(150);

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "rank %u: no GPU: skipped\n", r);
        return 77;
    }
    int dev = (int)(r % (uint32_t)ndev);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ctx_t ctx = {0};
    ovld_reporter_t rep = {on_report, NULL};
    ovld_backend_t *b = NULL;
    char err[512];
    if (ovld_backend_cuda_create(&loop, NULL, on_done, &ctx, &rep, &b, err, sizeof(err)) !=
        OVL_OK) {
        fprintf(stderr, "rank %u: no CUDA backend (%s): skipped\n", r, err);
        return 77;
    }
    const ovld_backend_ops_t *ops = b->ops;
    ovld_rank_t *rank = NULL;
    ovld_doorbell_export_t dbx;
    ovl_status_t st = ops->rank_create(b, (uint32_t)dev, &rank, &dbx, err, sizeof(err));
    if (st != OVL_OK) {
        fprintf(stderr, "rank %u: rank_create: %s\n", r, err);
        return 1;
    }
    struct ovl_doorbell *db =
        mmap(NULL, OVL_DOORBELL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, dbx.fd, 0);
    CHECK(db != MAP_FAILED, "mmap of the doorbell: %s", strerror(errno));

    /* 1. the key, and the setup */
    uint8_t key[OVLD_NCCL_ID_LEN];
    if (r == 0) {
        CHECK(ops->job_key, "the CUDA backend has job_key");
        st = ops->job_key ? ops->job_key(b, key, err, sizeof(err)) : OVL_ERR_UNSUPPORTED;
        CHECK(st == OVL_OK, "job_key: %s", err);
        for (uint32_t q = 1; q < world; q++)
            if (write_full(key_out[q], key, sizeof(key)) != 0)
                return 1;
    } else if (read_full(key_in, key, sizeof(key)) != 0) {
        fprintf(stderr, "rank %u: no key from rank 0\n", r);
        return 1;
    }
    uint32_t global = r, node_of[MAX_WORLD];
    for (uint32_t q = 0; q < world; q++)
        node_of[q] = q;
    ovld_job_net_t net = {.world = world,
                          .global = &global,
                          .node_of = node_of,
                          .self_node = r,
                          .nnodes = world,
                          .key = key};
    st = ops->job_setup(b, &rank, 1, &net, true, on_setup, &ctx);
    CHECK(st == OVL_OK, "job_setup: %s", ovl_strerror(st));
    run_until(&loop, &ctx.setup_done, 90000);
    CHECK(ctx.setup_done && ctx.setup_st == OVL_OK, "setup: %s: %s", ovl_strerror(ctx.setup_st),
          ctx.setup_msg);
    bool ready = ctx.setup_done && ctx.setup_st == OVL_OK;

    /* 2. two ranks of this node on one GPU in one communicator: the job's
     * (a job key), or one rail group's (rail keys of a job of uneven nodes,
     * 1 + 2 ranks, both of this node's in the one group): refused, with
     * words, before NCCL is asked anything (the keys are never used) */
    ovld_rank_t *pair[2] = {NULL, NULL};
    ovld_doorbell_export_t dbp[2];
    bool made = true, busy = false; /* busy: a setup of theirs never ended */
    for (int i = 0; i < 2 && made; i++)
        made = ops->rank_create(b, (uint32_t)dev, &pair[i], &dbp[i], err, sizeof(err)) == OVL_OK;
    CHECK(made, "two more ranks: %s", err);
    if (made) {
        static const uint32_t two_globals[2] = {1, 2}, uneven[3] = {0, 1, 1}, one_group[3] = {0},
                              places[3] = {0, 1, 2};
        uint8_t junk[OVLD_NCCL_ID_LEN] = {0};
        for (int rail = 0; rail < 2; rail++) {
            ovld_job_net_t n2 = {.world = 3,
                                 .global = two_globals,
                                 .node_of = uneven,
                                 .self_node = 1,
                                 .nnodes = 2,
                                 .key = rail ? NULL : junk,
                                 .rail_keys = rail ? junk : NULL,
                                 .nrail_keys = rail ? 1 : 0,
                                 .rail_group = rail ? one_group : NULL,
                                 .rail_pos = rail ? places : NULL};
            ctx_t c2 = {0};
            st = ops->job_setup(b, pair, 2, &n2, rail == 0, on_setup, &c2);
            CHECK(st == OVL_OK, "job_setup (shared GPU): %s", ovl_strerror(st));
            if (st == OVL_OK)
                run_until(&loop, &c2.setup_done, 10000);
            CHECK(c2.setup_done && c2.setup_st == OVL_ERR_UNSUPPORTED &&
                      strstr(c2.setup_msg, "job ranks 1 and 2 share device") &&
                      (!rail || strstr(c2.setup_msg, "and one rail group")),
                  "shared GPU across nodes (%s): %s: %s", rail ? "rail group" : "job key",
                  ovl_strerror(c2.setup_st), c2.setup_msg);
            if (!c2.setup_done) {
                busy = true; /* its ranks are the worker's still: leak them */
                break;
            }
        }
    }
    for (int i = 0; i < 2 && !busy; i++)
        if (pair[i]) {
            ops->rank_destroy(b, pair[i]);
            close(dbp[i].fd);
        }

    float *dA = NULL, *dG = NULL;
    size_t gbytes = (size_t)world * M * COLS * sizeof(float);
    float *hA = malloc((size_t)M * COLS * sizeof(float));
    CHECK(hA && cudaSetDevice(dev) == cudaSuccess &&
              cudaMalloc((void **)&dA, (size_t)M * COLS * sizeof(float)) == cudaSuccess &&
              cudaMalloc((void **)&dG, gbytes) == cudaSuccess,
          "buffers");
    if (!hA || !dA || !dG)
        return 1;
    for (uint32_t i = 0; i < M; i++)
        for (uint32_t c = 0; c < COLS; c++)
            hA[i * COLS + c] = val(r, i, c);
    CHECK(cudaMemcpy(dA, hA, (size_t)M * COLS * sizeof(float), cudaMemcpyHostToDevice) ==
              cudaSuccess,
          "A");
    bool all[MAX_WORLD], others[MAX_WORLD];
    for (uint32_t q = 0; q < world; q++) {
        all[q] = true;
        others[q] = q != r;
    }
    ovld_allgather_part_t ag = {
        .rank = rank, .global = r, .stream = 0, .src = {dA, COLS}, .dst = {dG, COLS}};

    /* 3. nccl-allgather of whole shards */
    if (ready) {
        CHECK(cudaMemset(dG, 0xFF, gbytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
              "poisoning G");
        st = ops->allgather(b, OVL_AG_NCCL_ALLGATHER, (ovld_coll_tag_t){1, 0}, &ag, 1, world,
                            OVL_DTYPE_FP32, M, COLS, M);
        CHECK(st == OVL_OK, "nccl-allgather: %s", ops->last_error(b));
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "synchronize after nccl-allgather");
        check_g(dG, world, M, all, "nccl-allgather");

        /* 4. nccl-sendrecv of half shards, stride m */
        CHECK(cudaMemset(dG, 0xFF, gbytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
              "poisoning G");
        st = ops->allgather(b, OVL_AG_NCCL_SENDRECV, (ovld_coll_tag_t){2, 0}, &ag, 1, world,
                            OVL_DTYPE_FP32, M / 2, COLS, M);
        CHECK(st == OVL_OK, "nccl-sendrecv: %s", ops->last_error(b));
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "synchronize after nccl-sendrecv");
        check_g(dG, world, M / 2, all, "nccl-sendrecv");

        /* 5. the rail, with every other rank */
        uint32_t peers[2 * MAX_WORLD], np = 0;
        for (uint32_t q = 0; q < world; q++)
            if (q != r)
                peers[np++] = q;
        memcpy(peers + np, peers, np * sizeof(*peers));
        ovld_rail_part_t rp = {.rank = rank,
                               .global = r,
                               .stream = 0,
                               .src = {dA, COLS},
                               .dst = {dG, COLS},
                               .send = peers,
                               .nsend = np,
                               .recv = peers + np,
                               .nrecv = np};
        CHECK(cudaMemset(dG, 0xFF, gbytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
              "poisoning G");
        st = ops->rail(b, OVL_AG_NCCL_RAIL, (ovld_coll_tag_t){3, 0}, &rp, 1, world, OVL_DTYPE_FP32,
                       M, COLS, M);
        CHECK(st == OVL_OK, "nccl-rail: %s", ops->last_error(b));
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "synchronize after nccl-rail");
        check_g(dG, world, M, others, "nccl-rail");
    }
    barrier(to_parent, from_parent);

    /* 6. the abort: rank world-1 is the lost node */
    CHECK(ops->job_abort, "the CUDA backend has job_abort");
    if (ready && ops->job_abort && r != world - 1) {
        st = ops->allgather(b, OVL_AG_NCCL_ALLGATHER, (ovld_coll_tag_t){4, 0}, &ag, 1, world,
                            OVL_DTYPE_FP32, M, COLS, M);
        CHECK(st == OVL_OK, "the all-gather that waits for the lost rank: %s", ops->last_error(b));
        ops->done(rank, 0, ABORT_SEQ, OVL_OK, NULL, &ctx);
        run_until(&loop, NULL, 1500);
        CHECK(ctx.ndone == 0, "op %u completed while a rank was missing (%s: %s)", ABORT_SEQ,
              ovl_strerror(ctx.done_st), ctx.done_msg);
        ops->job_abort(b, &rank, 1);
        bool done = false;
        for (uint64_t end = now_ms() + 60000; !done && now_ms() < end;) {
            uv_run(&loop, UV_RUN_ONCE);
            done = ctx.ndone > 0;
        }
        CHECK(done && ctx.done_seq == ABORT_SEQ && ctx.done_st == OVL_ERR_ABORTED &&
                  strstr(ctx.done_msg, "aborted"),
              "the aborted op's completion: %u completions, op %" PRIu64 ", %s: %s", ctx.ndone,
              ctx.done_seq, ovl_strerror(ctx.done_st), ctx.done_msg);
        if (db != MAP_FAILED) {
            CHECK(__atomic_load_n(&db->error, __ATOMIC_ACQUIRE) == (int32_t)OVL_ERR_ABORTED &&
                      __atomic_load_n(&db->error_seq, __ATOMIC_RELAXED) == ABORT_SEQ,
                  "doorbell error %d at op %" PRIu64, db->error, db->error_seq);
            CHECK(__atomic_load_n(&db->done, __ATOMIC_ACQUIRE) == ABORT_SEQ,
                  "doorbell done %" PRIu64, db->done);
        }
        st = ops->allgather(b, OVL_AG_NCCL_ALLGATHER, (ovld_coll_tag_t){5, 0}, &ag, 1, world,
                            OVL_DTYPE_FP32, M, COLS, M);
        CHECK(st == OVL_ERR_ABORTED && strstr(ops->last_error(b), "aborted"),
              "an all-gather after the abort: %s: %s", ovl_strerror(st), ops->last_error(b));
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "synchronize after the abort");
    }
    barrier(to_parent, from_parent);
    if (ops->job_abort && r == world - 1)
        ops->job_abort(b, &rank, 1); /* the cluster aborts the job everywhere */

    /* 7. teardown (after the abort), and the backend */
    cudaFree(dA);
    cudaFree(dG);
    free(hA);
    ops->job_teardown(b, &rank, 1);
    ops->destroy(b);
    uint64_t t0 = now_ms();
    uv_run(&loop, UV_RUN_DEFAULT); /* until the teardown's work and the handles are done */
    CHECK(now_ms() - t0 < 60000, "teardown took %" PRIu64 " ms", now_ms() - t0);
    CHECK(uv_loop_close(&loop) == 0, "the loop has handles left");
    if (db != MAP_FAILED)
        munmap(db, OVL_DOORBELL_SIZE);
    close(dbx.fd);
    fprintf(stderr, "rank %u: %u passed, %u failed\n", r, g_passed, g_failed);
    return g_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    uint32_t world = argc > 1 ? (uint32_t)atoi(argv[1]) : 2;
    if (world < 2 || world > MAX_WORLD) {
        fprintf(stderr, "usage: %s WORLD (2..%d)\n", argv[0], MAX_WORLD);
        return 2;
    }
    int keyp[MAX_WORLD][2], back[MAX_WORLD][2], up[2];
    pid_t pid[MAX_WORLD];
    if (pipe(up) != 0)
        return 1;
    for (uint32_t q = 0; q < world; q++)
        if (pipe(keyp[q]) != 0 || pipe(back[q]) != 0)
            return 1;
    for (uint32_t q = 0; q < world; q++) {
        pid[q] = fork();
        if (pid[q] < 0)
            return 1;
        if (pid[q] == 0) {
            int key_out[MAX_WORLD];
            for (uint32_t p = 0; p < world; p++) {
                key_out[p] = keyp[p][1];
                if (p != q)
                    close(keyp[p][0]);
                if (q != 0)
                    close(keyp[p][1]);
                close(back[p][1]);
                if (p != q)
                    close(back[p][0]);
            }
            close(up[0]);
            _exit(child(q, world, keyp[q][0], key_out, up[1], back[q][0]));
        }
    }
    close(up[1]);
    for (uint32_t q = 0; q < world; q++) {
        close(keyp[q][0]);
        close(keyp[q][1]);
        close(back[q][0]);
    }
    /* two barriers: every child's byte in, then one byte to each; then
     * EOF for a child still waiting (one of them gave up) */
    for (int k = 0; k < 2; k++) {
        char c = 'b';
        uint32_t in = 0;
        while (in < world && read_full(up[0], &c, 1) == 0)
            in++;
        if (in < world)
            break;
        for (uint32_t q = 0; q < world; q++)
            (void)write_full(back[q][1], &c, 1);
    }
    for (uint32_t q = 0; q < world; q++)
        close(back[q][1]);
    int rc = 0;
    bool skipped = false;
    for (uint32_t q = 0; q < world; q++) {
        int status = 0;
        while (waitpid(pid[q], &status, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            skipped = true;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rank %u: %s %d\n", q, WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            rc = 1;
        }
    }
    if (skipped) { /* the others fail for want of it: no key, no barrier */
        printf("skipped: no GPU or no CUDA backend\n");
        return 77;
    }
    printf("%s\n", rc ? "FAILED" : "passed");
    return rc;
}

/*
 * ops_fixture.c: the helpers of ops_fixture.h, shared by the cmocka tests
 * of jobs and ops (compiled once into the ovl_fixture library).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "doorbell.h"
#include "libovl_internal.h"
#include "ops_fixture.h"

/* ------------------------------------------------------------ data */

/* Small integers: every product and sum is exact in fp32, so results are
 * compared for equality. */
static float a_val(uint32_t r, uint64_t i, uint64_t l, unsigned salt)
{
    return (float)((int)((r * 7u + i * 3u + l * 5u + salt * 11u) % 9u) - 4);
}

static float b_val(uint32_t r, uint64_t row, uint64_t col, unsigned salt)
{
    return (float)((int)((r * 5u + row * 2u + col * 3u + salt * 13u) % 7u) - 3);
}

const opspec_t base_spec = {.m = 4, .n = 6, .k = 5, .dtype = OVL_DTYPE_FP32, .algo = OVL_ALGO_AUTO};

/* ------------------------------------------------------- ranks and ops */

ovl_status_t rank_open_st(test_daemon_t *d, rank_t *rk, const char *job, uint32_t world,
                          uint32_t rank, int device, unsigned nslots, char *msg, size_t msglen)
{
    memset(rk, 0, sizeof(*rk));
    rk->world = world;
    rk->rank = rank;
    rk->nslots = nslots;
    ovl_status_t st = ovl_connect(d->sock, &rk->cl);
    if (st != OVL_OK) {
        snprintf(msg, msglen, "ovl_connect: %s", ovl_connect_error());
        return st;
    }
    ovl_set_timeout(rk->cl, TIMEOUT_MS);
    st = ovl_comm_init(rk->cl, job, world, rank, device, &rk->comm);
    if (st != OVL_OK) {
        snprintf(msg, msglen, "ovl_comm_init(%s, %u, %u, %d): %s", job, world, rank, device,
                 ovl_last_error(rk->cl));
        return st;
    }
    if (nslots == 0)
        return OVL_OK;
    rk->a = ovl_host_alloc(rk->cl, nslots * SLOT_A * sizeof(float));
    rk->b = ovl_host_alloc(rk->cl, nslots * SLOT_B * sizeof(float));
    rk->c = ovl_host_alloc(rk->cl, nslots * SLOT_C * sizeof(float));
    rk->g = ovl_host_alloc(rk->cl, nslots * SLOT_C * sizeof(float));
    if (!rk->a || !rk->b || !rk->c || !rk->g) {
        snprintf(msg, msglen, "ovl_host_alloc: %s", ovl_last_error(rk->cl));
        return OVL_ERR_NOMEM;
    }
    return OVL_OK;
}

void rank_open(test_daemon_t *d, rank_t *rk, const char *job, uint32_t world, uint32_t rank,
               int device, unsigned nslots)
{
    char msg[600];
    ovl_status_t st = rank_open_st(d, rk, job, world, rank, device, nslots, msg, sizeof(msg));
    if (st != OVL_OK)
        fail_msg("rank %u of '%s': %s: %s", rank, job, ovl_strerror(st), msg);
}

ovl_status_t rank_close(rank_t *rk)
{
    ovl_status_t st = OVL_OK;
    if (rk->comm)
        st = ovl_comm_destroy(rk->comm);
    rk->comm = NULL;
    ovl_disconnect(rk->cl);
    rk->cl = NULL;
    return st;
}

void rank_fill(rank_t *rk, unsigned slot, const opspec_t *s)
{
    float *a = rk->a + slot * SLOT_A, *b = rk->b + slot * SLOT_B;
    uint64_t lda = s->k + s->pad;
    memset(a, 0xff, SLOT_A * sizeof(float)); /* NaN in the padding: a read of it shows */
    for (uint64_t i = 0; i < s->m; i++)
        for (uint64_t l = 0; l < s->k; l++)
            a[i * lda + l] = a_val(rk->rank, i, l, s->salt);
    uint64_t rows = s->transb ? s->n : s->k, cols = s->transb ? s->k : s->n;
    for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < cols; j++)
            b[i * cols + j] = b_val(rk->rank, i, j, s->salt);
    memset(rk->c + slot * SLOT_C, 0xff, SLOT_C * sizeof(float)); /* NaN: unwritten shows */
    memset(rk->g + slot * SLOT_C, 0xff, SLOT_C * sizeof(float));
}

ovl_ag_gemm_desc_t rank_desc(rank_t *rk, unsigned slot, const opspec_t *s)
{
    ovl_ag_gemm_desc_t d = {
        .a = rk->a + slot * SLOT_A,
        .lda = s->k + s->pad,
        .b = rk->b + slot * SLOT_B,
        .ldb = s->transb ? s->k : s->n,
        .transb = s->transb,
        .c = rk->c + slot * SLOT_C,
        .ldc = s->n,
        .a_out = s->aout ? rk->g + slot * SLOT_C : NULL,
        .lda_out = s->k + s->pad,
        .m = s->m,
        .n = s->n,
        .k = s->k,
        .dtype = s->dtype,
        .algo = s->algo,
        .chunks = s->chunks,
        .streams = s->streams,
    };
    return d;
}

ovl_status_t rank_submit(rank_t *rk, unsigned slot, const opspec_t *s)
{
    ovl_ag_gemm_desc_t d = rank_desc(rk, slot, s);
    return ovl_allgather_gemm(rk->comm, &d, NULL);
}

int rank_verify(const rank_t *rk, unsigned slot, const opspec_t *s, char *msg, size_t msglen)
{
    const float *c = rk->c + slot * SLOT_C, *g = rk->g + slot * SLOT_C;
    for (uint32_t q = 0; q < rk->world; q++)
        for (uint64_t i = 0; i < s->m; i++) {
            for (uint64_t j = 0; j < s->n; j++) {
                float want = 0;
                for (uint64_t l = 0; l < s->k; l++) {
                    float bv =
                        s->transb ? b_val(rk->rank, j, l, s->salt) : b_val(rk->rank, l, j, s->salt);
                    want += a_val(q, i, l, s->salt) * bv;
                }
                float got = c[(q * s->m + i) * s->n + j];
                if (got != want) {
                    snprintf(msg, msglen,
                             "rank %u, op salt %u: C[%" PRIu64 "][%" PRIu64 "] = %g, expected %g",
                             rk->rank, s->salt, q * s->m + i, j, (double)got, (double)want);
                    return -1;
                }
            }
            for (uint64_t l = 0; s->aout && l < s->k; l++) {
                float got = g[(q * s->m + i) * (s->k + s->pad) + l];
                float want = a_val(q, i, l, s->salt);
                if (got != want) {
                    snprintf(msg, msglen,
                             "rank %u, op salt %u: a_out[%" PRIu64 "][%" PRIu64
                             "] = %g, expected %g",
                             rk->rank, s->salt, q * s->m + i, l, (double)got, (double)want);
                    return -1;
                }
            }
        }
    return 0;
}

void rank_check(const rank_t *rk, unsigned slot, const opspec_t *s)
{
    char msg[256];
    if (rank_verify(rk, slot, s, msg, sizeof(msg)) != 0)
        fail_msg("%s", msg);
}

void rank_sync_ok(rank_t *rk)
{
    ovl_status_t st = ovl_comm_synchronize(rk->comm);
    if (st != OVL_OK)
        fail_msg("rank %u: ovl_comm_synchronize: %s: %s", rk->rank, ovl_strerror(st),
                 ovl_last_error(rk->cl));
}

void job_run_check(rank_t *rk, uint32_t world, unsigned slot, const opspec_t *s)
{
    for (uint32_t r = 0; r < world; r++) {
        rank_fill(&rk[r], slot, s);
        assert_status(rank_submit(&rk[r], slot, s), OVL_OK);
    }
    for (uint32_t r = 0; r < world; r++)
        rank_sync_ok(&rk[r]);
    for (uint32_t r = 0; r < world; r++)
        rank_check(&rk[r], slot, s);
}

void fresh_job_works(test_daemon_t *d, const char *job, uint32_t world)
{
    ovl_client_t *cl = NULL;
    assert_status(ovl_connect(d->sock, &cl), OVL_OK);
    ovl_set_timeout(cl, TIMEOUT_MS);
    wait_job_gone(cl, job);
    ovl_disconnect(cl);
    rank_t rk[MAXW];
    for (uint32_t r = 0; r < world; r++)
        rank_open(d, &rk[r], job, world, r, (int)r, 1);
    opspec_t s = base_spec;
    s.salt = 3;
    job_run_check(rk, world, 0, &s);
    for (uint32_t r = 0; r < world; r++)
        assert_status(rank_close(&rk[r]), OVL_OK);
}

/* ------------------------------------------------- clients and Status */

ovl_client_t *connect_ok(test_daemon_t *d)
{
    ovl_client_t *cl = NULL;
    ovl_status_t st = ovl_connect(d->sock, &cl);
    if (st != OVL_OK)
        fail_msg("ovl_connect: %s: %s", ovl_strerror(st), ovl_connect_error());
    ovl_set_timeout(cl, TIMEOUT_MS);
    return cl;
}

Ovl__Response *status_call(ovl_client_t *cl)
{
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_status(cl, &r);
    if (st != OVL_OK)
        fail_msg("Status: %s: %s", ovl_strerror(st), ovl_last_error(cl));
    assert_int_equal(r->body_case, OVL__RESPONSE__BODY_STATUS);
    return r;
}

const Ovl__JobInfo *find_job(const Ovl__Response *r, const char *id)
{
    for (size_t i = 0; i < r->status->n_jobs; i++)
        if (strcmp(r->status->jobs[i]->id, id) == 0)
            return r->status->jobs[i];
    return NULL;
}

const Ovl__JobInfo *find_job_of(const Ovl__Response *r, const char *id, uint32_t owner)
{
    for (size_t i = 0; i < r->status->n_jobs; i++)
        if (strcmp(r->status->jobs[i]->id, id) == 0 && r->status->jobs[i]->owner_uid == owner)
            return r->status->jobs[i];
    return NULL;
}

void wait_job_gone(ovl_client_t *cl, const char *id)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = status_call(cl);
        bool there = find_job(r, id) != NULL;
        libovl_response_free(r);
        if (!there)
            return;
        if (fixture_now_ms() >= deadline)
            fail_msg("job '%s' is still there after %d ms", id, TIMEOUT_MS);
        fixture_sleep_ms(5);
    }
}

void wait_job_in_flight(ovl_client_t *cl, const char *id, uint32_t n)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = status_call(cl);
        const Ovl__JobInfo *j = find_job(r, id);
        uint32_t have = j ? j->ops_in_flight : UINT32_MAX;
        libovl_response_free(r);
        if (have == n)
            return;
        if (fixture_now_ms() >= deadline)
            fail_msg("job '%s' has %d ops in flight, not %u", id, (int)have, n);
        fixture_sleep_ms(5);
    }
}

void wait_job_ops_done(ovl_client_t *cl, const char *id, uint64_t n)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    for (;;) {
        Ovl__Response *r = status_call(cl);
        const Ovl__JobInfo *j = find_job(r, id);
        uint64_t have = j ? j->ops_done : UINT64_MAX;
        libovl_response_free(r);
        if (have == n)
            return;
        if (fixture_now_ms() >= deadline)
            fail_msg("job '%s' counts %" PRIu64 " ops done, not %" PRIu64, id, have, n);
        fixture_sleep_ms(5);
    }
}

/* ---------------------------------------------------- forked children */

int wait_child(pid_t pid, int timeout_ms)
{
    uint64_t deadline = fixture_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int ws;
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid)
            return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (fixture_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            return -1;
        }
        fixture_sleep_ms(5);
    }
}

int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = fixture_now_ms() + (uint64_t)timeout_ms;
    char *p = buf;
    while (len > 0) {
        uint64_t now = fixture_now_ms();
        if (now >= deadline)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int n = poll(&pf, 1, (int)(deadline - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        ssize_t got = read(fd, p, len);
        if (got <= 0) {
            if (got < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += got;
        len -= (size_t)got;
    }
    return 0;
}

/* --------------------------------------------------- raw connections */

int sealed_memfd(size_t bytes, bool seal, void **ret_map)
{
    int fd = memfd_create("ovl-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    if (seal)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    *ret_map = p;
    return fd;
}

Ovl__Response *raw_mem_register(raw_conn_t *rc, int fd, uint64_t bytes, uint64_t fd_offset,
                                raw_result_t *ret_res)
{
    Ovl__MemRegister mr = OVL__MEM_REGISTER__INIT;
    mr.client_addr = 0x1000;
    mr.bytes = bytes;
    mr.fd_count = fd >= 0 ? 1 : 0;
    mr.fd_offset = fd_offset;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_MEM_REGISTER;
    q.mem_register = &mr;
    Ovl__Response *r = NULL;
    *ret_res = raw_call(rc, &q, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, &r);
    return r;
}

uint64_t raw_mem_register_ok(raw_conn_t *rc, int fd, uint64_t bytes)
{
    raw_result_t res;
    Ovl__Response *r = raw_mem_register(rc, fd, bytes, 0, &res);
    assert_int_equal(res, RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_MEM_REGISTER)
        fail_msg("MemRegister refused: %s",
                 r->body_case == OVL__RESPONSE__BODY_ERROR ? r->error->message : "?");
    uint64_t id = r->mem_register->mem_id;
    ovl__response__free_unpacked(r, NULL);
    return id;
}

void raw_join2(raw_conn_t *rc, const Ovl__HelloReply *h, const char *job, uint32_t world,
               uint32_t rank, uint32_t device, raw_comm_t *out)
{
    Ovl__CommInit ci = OVL__COMM_INIT__INIT;
    ci.job_id.data = (uint8_t *)job;
    ci.job_id.len = strlen(job);
    ci.world = world;
    ci.rank = rank;
    ci.device_uuid = h->devices[device]->uuid;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_COMM_INIT;
    q.comm_init = &ci;
    Ovl__Response *r = NULL;
    assert_int_equal(raw_call(rc, &q, NULL, 0, &r), RAW_OK);
    if (r->body_case != OVL__RESPONSE__BODY_COMM_INIT)
        fail_msg("CommInit refused: %s",
                 r->body_case == OVL__RESPONSE__BODY_ERROR ? r->error->message : "?");
    assert_int_equal(r->comm_init->fd_count, 1);
    int fd = ovl_fdq_pop(&rc->fdq);
    assert_true(fd >= 0);
    out->id = r->comm_init->comm_id;
    out->map_len = (size_t)r->comm_init->doorbell_offset + OVL_DOORBELL_SIZE;
    out->map = mmap(NULL, out->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(out->map != MAP_FAILED);
    out->db = (struct ovl_doorbell *)((char *)out->map + r->comm_init->doorbell_offset);
    close(fd);
    ovl__response__free_unpacked(r, NULL);
}

void raw_join(raw_conn_t *rc, const Ovl__HelloReply *h, const char *job, uint32_t device,
              raw_comm_t *out)
{
    raw_join2(rc, h, job, 1, 0, device, out);
}

void raw_comm_unmap(raw_comm_t *c)
{
    munmap(c->map, c->map_len);
}

void raw_wait_done(const raw_comm_t *c, uint64_t seq)
{
    uint64_t deadline = fixture_now_ms() + TIMEOUT_MS;
    while (__atomic_load_n(&c->db->done, __ATOMIC_ACQUIRE) < seq) {
        if (fixture_now_ms() >= deadline)
            fail_msg("op %" PRIu64 " not done within %d ms (done %" PRIu64 ")", seq, TIMEOUT_MS,
                     __atomic_load_n(&c->db->done, __ATOMIC_ACQUIRE));
        fixture_sleep_ms(1);
    }
}

static void raw_op_relink(raw_op_t *o)
{
    o->op.n_bufs = 0;
    for (int slot = 0; slot < RAW_SLOTS; slot++)
        if (o->by_slot[slot])
            o->pbufs[o->op.n_bufs++] = o->by_slot[slot];
    o->op.bufs = o->pbufs;
}

void raw_op_buf(raw_op_t *o, uint64_t slot, uint64_t mem, uint64_t offset, uint64_t ld)
{
    assert_true(slot < RAW_SLOTS);
    Ovl__OpBuf *b = &o->bufs[slot];
    ovl__op_buf__init(b);
    ovl__buf_ref__init(&o->refs[slot]);
    o->refs[slot].mem_id = mem;
    o->refs[slot].offset = offset;
    b->slot = slot;
    b->ref = &o->refs[slot];
    b->ld = ld;
    o->by_slot[slot] = b;
    raw_op_relink(o);
}

void raw_op_drop(raw_op_t *o, uint64_t slot)
{
    assert_true(slot < RAW_SLOTS);
    o->by_slot[slot] = NULL;
    raw_op_relink(o);
}

void raw_op_init(raw_op_t *o, uint64_t comm, uint64_t seq, uint64_t mem)
{
    memset(o, 0, sizeof(*o));
    ovl__op__init(&o->op);
    ovl__ag_gemm_params__init(&o->g);
    o->op.comm_id = comm;
    o->op.seq = seq;
    o->op.kind = OVL__OP_KIND__OP_KIND_AG_GEMM;
    o->op.ag_gemm = &o->g;
    raw_op_buf(o, 0, mem, 0, RAW_K);
    raw_op_buf(o, 1, mem, 256, RAW_N);
    raw_op_buf(o, 2, mem, 512, RAW_N);
    o->g.m = RAW_M;
    o->g.n = RAW_N;
    o->g.k = RAW_K;
    o->g.dtype = OVL__DTYPE__DTYPE_FP32;
    o->g.algo = OVL__ALGO__ALGO_NAIVE;
}

void raw_op_more(raw_op_t *o, uint32_t count, uint64_t mem)
{
    assert_true(count <= 8);
    for (uint32_t i = 1; i <= count; i++) {
        o->more_n[i - 1] = RAW_N;
        if (i > 7)
            continue; /* no slot for a ninth B: refused on its count */
        raw_op_buf(o, 3 + i, o->refs[1].mem_id, o->refs[1].offset, RAW_N);
        raw_op_buf(o, 10 + i, mem, 1024 + (uint64_t)(i - 1) * 256, RAW_N);
    }
    o->g.n_more_n = count;
    o->g.more_n = o->more_n;
}

void raw_submit(raw_conn_t *rc, const raw_comm_t *c, Ovl__Op *op)
{
    /* Host mode: the client is the stream; its data is ready when sent. */
    if (c)
        __atomic_store_n(&c->db->ready, op->seq, __ATOMIC_RELEASE);
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_OP;
    q.op = op;
    assert_int_equal(raw_send_request(rc, &q, NULL, 0), 0);
}

size_t pack_frame(uint8_t *out, Ovl__Request *q)
{
    size_t n = ovl__request__pack(q, out + OVL_WIRE_HEADER_SIZE);
    ovl_wire_header_encode(out, (uint32_t)n);
    return OVL_WIRE_HEADER_SIZE + n;
}

/*
 * fuzz_doorbell.c: libFuzzer target for what ovld does with a rank's
 * doorbell page (proto/doorbell.h), which the client maps too and may write
 * anything into, at any time, in any word.
 *
 * ovld reads the page in two places, both in the host backend
 * (daemon/backend/host/host_rank.c) and both through proto/doorbell.h: the ready wait
 * (ovl_doorbell_ready, polled by a stream thread) and the ring of done
 * (ovl_doorbell_ring, which reads the error word); the release
 * (ovl_doorbell_release_ready) only writes. This target runs those very
 * functions on a page-aligned 4096-byte page, the way the host backend
 * sequences them on a rank's stream 0, with client writes interleaved.
 *
 * Input: byte 0 fills the whole page (its value in every byte), then a
 * script of commands, each an opcode byte (mod 8) and its arguments:
 *   0 F V*8   the client stores the 64-bit V into field F (ready, done,
 *             error, wake, error_seq, a ready or done slot; F mod 132)
 *   1 O*2 L D the client writes L (1..16) bytes D at page offset O (mod
 *             4096), aligned or not
 *   2 S       ovld issues the next op: stream 0 gets WAIT_READY(seq) and
 *             DONE(seq, status from S: 0 = OK, else a failure code)
 *   3         ovld issues the next op, whose done item could not be had:
 *             WAIT_READY(seq) queued, done rung at once with
 *             OVL_ERR_NOMEM, out of stream order (host_done's last resort)
 *   4         stream 0 runs its head item: one poll of a ready wait, or a
 *             ring
 *   5 K       the client says ready for the K-th op from the front of the
 *             queue, as libovl does
 *   6         the client is gone: ovld releases the rank up to its last op
 *   7 N D*N   the client overwrites the start of the page with N bytes
 * A missing argument byte reads as 0.
 * The first op's seq is 1 + a base from the first byte (0, or near 2^32),
 * so that the release value and the comparisons are tried around 2^32.
 *
 * Properties (any failure aborts):
 * - the done values ovld stores never go backwards, whatever the client
 *   wrote, and the one stored for op seq is >= seq (it releases the
 *   client's wait), exactly the highest seq rung so far;
 * - a ring writes only done, wake (+1), and on the first failure error and
 *   error_seq; error stays the client's when it is not 0;
 * - before a release, a poll of op seq's wait passes iff the page's ready
 *   >= seq (the protocol's contract);
 * - after a release, every wait of an op up to the last one passes at its
 *   first poll whatever the client writes into the page afterwards (a
 *   client that closes its connection and goes on writing ready = 0 once
 *   held a stream thread, its op and its job for ever): at the end the
 *   target releases and drains the queue, one poll per wait;
 * - the release value satisfies the host's plain and the GPU's cyclic
 *   (int64_t)(word - value) >= 0 comparisons for the ops before it;
 * - no undefined behaviour (UBSan) for any page content.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doorbell.h"
#include "ovl.h"

#define FUZZ_NAME "fuzz_doorbell"
#include "fuzz_main.h"

#define QUEUE_MAX 64u /* stream 0 items at once: ovld issues a few ops at a time */

typedef struct item {
    bool done; /* DONE, else WAIT_READY */
    uint64_t seq;
    int32_t status;
} item_t;

typedef struct sim {
    struct ovl_doorbell *db;
    uint8_t *page;
    struct ovl_doorbell_own own; /* ovld's record, out of the client's reach */
    item_t q[QUEUE_MAX];
    size_t head, len;
    uint64_t base;      /* seq of the first op, less 1 */
    uint64_t last;      /* the last op issued */
    uint64_t max_rung;  /* the highest seq rung so far */
    uint64_t last_done; /* the last done value ovld stored */
    bool released;
    uint64_t seq_hi; /* of the release */
} sim_t;

typedef struct reader {
    const uint8_t *p;
    size_t n, off;
} reader_t;

static uint8_t rd8(reader_t *r)
{
    return r->off < r->n ? r->p[r->off++] : 0;
}

static uint64_t rd64(reader_t *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)rd8(r) << (8 * i);
    return v;
}

/* The GPU's CU_STREAM_WAIT_VALUE_GEQ on 64-bit words. */
static bool gpu_geq(uint64_t word, uint64_t value)
{
    return (int64_t)(word - value) >= 0;
}

/* ------------------------------------------------------------ client side */

static void client_store_field(sim_t *s, uint8_t f, uint64_t v)
{
    struct ovl_doorbell *db = s->db;
    unsigned field = f % (5u + 2u * OVL_READY_SLOTS);
    switch (field) {
    case 0:
        __atomic_store_n(&db->ready, v, __ATOMIC_RELEASE);
        break;
    case 1:
        __atomic_store_n(&db->done, v, __ATOMIC_RELEASE);
        break;
    case 2:
        __atomic_store_n(&db->error, (int32_t)(uint32_t)v, __ATOMIC_RELEASE);
        break;
    case 3:
        __atomic_store_n(&db->wake, (uint32_t)v, __ATOMIC_RELEASE);
        break;
    case 4:
        __atomic_store_n(&db->error_seq, v, __ATOMIC_RELEASE);
        break;
    default:
        field -= 5;
        if (field < OVL_READY_SLOTS)
            __atomic_store_n(&db->ready_slot[field], v, __ATOMIC_RELEASE);
        else
            __atomic_store_n(&db->done_slot[field - OVL_READY_SLOTS], v, __ATOMIC_RELEASE);
        break;
    }
}

/* ------------------------------------------------------------- ovld side */

static void push(sim_t *s, item_t it)
{
    CHECK(s->len < QUEUE_MAX);
    s->q[(s->head + s->len) % QUEUE_MAX] = it;
    s->len++;
}

/* ovl_doorbell_ring, with every property of one ring checked. */
static void ring(sim_t *s, uint64_t seq, int32_t status)
{
    static uint8_t before[OVL_DOORBELL_SIZE];
    memcpy(before, s->page, sizeof(before));
    struct ovl_doorbell oldv;
    memcpy(&oldv, s->page, sizeof(oldv));
    const struct ovl_doorbell *old = &oldv;
    bool may_set = ovl_doorbell_may_set_error(old->error);

    uint64_t v = ovl_doorbell_ring(s->db, &s->own, seq, status);

    /* done: the highest seq rung, never backwards, at least seq */
    if (seq > s->max_rung)
        s->max_rung = seq;
    CHECK(v == s->max_rung);
    CHECK(v >= seq);
    CHECK(v >= s->last_done);
    CHECK(ovl_doorbell_done_value(s->own.done, seq) == s->own.done);
    s->last_done = v;
    CHECK(s->db->done == v);
    CHECK(s->own.done == v);
    /* wake bumped by one, wrapping */
    CHECK(s->db->wake == (uint32_t)(old->wake + 1u));
    /* the error fields: the first failure only, and never over a client's */
    if (status != 0 && may_set) {
        CHECK(s->db->error == status);
        CHECK(s->db->error_seq == seq);
    } else {
        CHECK(s->db->error == old->error);
        CHECK(s->db->error_seq == old->error_seq);
    }
    /* nothing else moved: ready and the slots are the client's */
    CHECK(s->db->ready == old->ready);
    CHECK(memcmp(s->db->ready_slot, old->ready_slot, sizeof(old->ready_slot)) == 0);
    CHECK(memcmp(s->db->done_slot, old->done_slot, sizeof(old->done_slot)) == 0);
    size_t tail = offsetof(struct ovl_doorbell, done_slot) + sizeof(old->done_slot);
    CHECK(memcmp(s->page + tail, before + tail, OVL_DOORBELL_SIZE - tail) == 0);
}

static void issue(sim_t *s, bool done_queued, uint8_t status_byte)
{
    if (s->released || s->len + 2 > QUEUE_MAX)
        return; /* a gone client submits nothing; stream 0 has room for a few ops */
    uint64_t seq = ++s->last;
    push(s, (item_t){.done = false, .seq = seq});
    if (done_queued) {
        /* 0: OK; else a status ovld could fail an op with, or any word */
        int32_t st = status_byte == 0     ? 0
                     : status_byte < 0x80 ? -(int32_t)(status_byte % 21u + 1u)
                                          : (int32_t)((uint32_t)status_byte << 24 | status_byte);
        push(s, (item_t){.done = true, .seq = seq, .status = st});
    } else {
        ring(s, seq, OVL_ERR_NOMEM);
    }
}

/* One poll of a ready wait; true when it passes. */
static bool poll_ready(sim_t *s, uint64_t seq)
{
    uint64_t page_ready = s->db->ready; /* nothing writes between this and the poll */
    bool ok = ovl_doorbell_ready(s->db, &s->own, seq);
    if (s->released && seq <= s->seq_hi)
        CHECK(ok); /* whatever the client wrote since */
    if (!s->released)
        CHECK(ok == (page_ready >= seq));
    else
        CHECK(ok == (page_ready >= seq || s->own.ready_floor >= seq));
    return ok;
}

/* Runs stream 0's head item; false when it is a wait that did not pass. */
static bool step(sim_t *s)
{
    if (s->len == 0)
        return true;
    item_t *it = &s->q[s->head];
    if (it->done)
        ring(s, it->seq, it->status);
    else if (!poll_ready(s, it->seq))
        return false;
    s->head = (s->head + 1) % QUEUE_MAX;
    s->len--;
    return true;
}

static void release(sim_t *s)
{
    if (s->released)
        return;
    uint64_t v = ovl_doorbell_release_value(s->last);
    ovl_doorbell_release_ready(s->db, &s->own, s->last);
    s->released = true;
    s->seq_hi = s->last;
    CHECK(s->db->ready == v && s->own.ready_floor == v);
    /* every op the client may have submitted, host and GPU comparisons */
    for (uint64_t back = 0; back <= 2 * QUEUE_MAX && back <= s->last; back++) {
        CHECK(v >= s->last - back);
        CHECK(gpu_geq(v, s->last - back));
    }
}

/* ------------------------------------------------------------------ target */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *page;
    if (!page) {
        page = aligned_alloc(OVL_DOORBELL_SIZE, OVL_DOORBELL_SIZE);
        CHECK(page != NULL);
    }
    reader_t r = {data, size, 0};
    uint8_t fill = rd8(&r);
    memset(page, fill, OVL_DOORBELL_SIZE);

    sim_t s;
    memset(&s, 0, sizeof(s));
    s.page = page;
    s.db = (struct ovl_doorbell *)(void *)page;
    /* Ops are numbered from 1 per comm; near 2^32 for the release value's
     * sake now and then. */
    s.base = (fill & 0x40) ? (UINT64_C(1) << 32) - (fill & 0x3f) : 0;
    s.last = s.base;
    s.max_rung = 0;

    while (r.off < r.n) {
        uint8_t op = rd8(&r) % 8;
        switch (op) {
        case 0: {
            uint8_t f = rd8(&r);
            client_store_field(&s, f, rd64(&r));
            break;
        }
        case 1: {
            size_t off = ((size_t)rd8(&r) | (size_t)rd8(&r) << 8) % OVL_DOORBELL_SIZE;
            size_t len = rd8(&r) % 16u + 1;
            for (size_t i = 0; i < len && off + i < OVL_DOORBELL_SIZE; i++)
                page[off + i] = rd8(&r);
            break;
        }
        case 2:
            issue(&s, true, rd8(&r));
            break;
        case 3:
            issue(&s, false, 0);
            break;
        case 4:
            (void)step(&s);
            break;
        case 5: {
            uint8_t k = rd8(&r);
            if (s.len > 0) {
                const item_t *it = &s.q[(s.head + k % s.len) % QUEUE_MAX];
                __atomic_store_n(&s.db->ready, it->seq, __ATOMIC_RELEASE);
            }
            break;
        }
        case 6:
            release(&s);
            break;
        default: {
            size_t n = rd8(&r);
            for (size_t i = 0; i < n; i++)
                page[i] = rd8(&r);
            break;
        }
        }
    }

    /* The client is gone, whatever it left in the page: every wait ends at
     * its first poll, and every done rings. */
    release(&s);
    size_t items = s.len;
    for (size_t i = 0; i < items; i++)
        CHECK(step(&s));
    CHECK(s.len == 0);
    if (s.last > s.base)
        CHECK(s.own.done == s.last);
    return 0;
}

/* ------------------------------------------------------------- standalone */

#ifdef OVL_FUZZ_STANDALONE

/* Scripts of random commands, with a bias towards the interesting ones. */
static void random_scripts(int count, size_t maxlen)
{
    uint8_t in[1024];
    if (maxlen > sizeof(in))
        maxlen = sizeof(in);
    for (int i = 0; i < count; i++) {
        size_t n = 1 + fuzz_prng() % maxlen;
        for (size_t j = 0; j < n; j++)
            in[j] = (uint8_t)fuzz_prng();
        /* now and then, runs of issue/step/ready so that queues fill up */
        if (i & 1)
            for (size_t j = 1; j < n; j += 2)
                in[j] = (uint8_t)(2 + fuzz_prng() % 4);
        fuzz_run(in, n);
    }
}

static void fuzz_builtin(void)
{
    /* The hostile client: it leaves with an op waiting and writes ready = 0
     * after the release; then every field garbage. */
    static const uint8_t hostile[] = {
        0x00, 2, 0,                      /* issue op 1 */
        4,                               /* poll: not ready */
        6,                               /* release */
        0,    0, 0, 0, 0, 0, 0, 0, 0, 0, /* ready = 0 */
        4,                               /* poll: passes (the floor) */
        4,                               /* done */
    };
    fuzz_run(hostile, sizeof(hostile));
    /* done written by the client ahead of ovld, and out-of-order rings */
    static const uint8_t ahead[] = {
        0x00, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* done = max */
        2,    0, 2, 5,    3,    5,    0,    5,    1,    4,    4,    4, 4, 4, 4,
    };
    fuzz_run(ahead, sizeof(ahead));
    /* the error word set by the client before the first failure */
    static const uint8_t err[] = {0x00, 0, 2, 0x01, 0, 0, 0, 0, 0, 0, 0, 2, 7, 5, 0, 4, 4};
    fuzz_run(err, sizeof(err));
    /* every fill byte, with a fixed script: base near 2^32 included */
    static const uint8_t script[] = {2, 0, 2, 9, 3, 5, 0, 4, 4, 1, 0, 0, 7, 1, 2,
                                     3, 4, 5, 6, 7, 4, 4, 5, 1, 4, 4, 6, 4, 4};
    for (unsigned fill = 0; fill < 256; fill++) {
        uint8_t in[1 + sizeof(script)];
        in[0] = (uint8_t)fill;
        memcpy(in + 1, script, sizeof(script));
        fuzz_run(in, sizeof(in));
    }
    /* a full queue, then a release */
    uint8_t full[1 + 2 * QUEUE_MAX];
    full[0] = 0;
    for (size_t i = 1; i < sizeof(full); i += 2) {
        full[i] = 2;
        full[i + 1] = (uint8_t)i;
    }
    fuzz_run(full, sizeof(full));
    random_scripts(20000, 200);
    random_scripts(500, 1024);
    fuzz_run(NULL, 0);
}

#endif /* OVL_FUZZ_STANDALONE */

/*
 * test_tune.c: `auto` that measures (daemon/core/tune.h) and the planner's
 * candidates (ovl_plan_candidates), pure: the candidates of both kinds; the
 * measuring protocol (warm-up, samples, the least median chosen, every
 * later op of the key on it); ops in flight together; failures dropping a
 * candidate; the table's bound and stale tickets; params tune leaves alone;
 * the text round trip, another device's table, lines that do not parse and
 * bytes mangled at random (never a crash, never a choice that does not
 * plan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan.h"
#include "tune.h"

#define UID 1000 /* the user of the ops the tests pick for */

static ovl_plan_params_t ag(uint32_t world, uint64_t m, uint64_t n, uint64_t k)
{
    return (ovl_plan_params_t){.kind = OVL_OP_AG_GEMM,
                               .algo = OVL_ALGO_AUTO,
                               .world = world,
                               .m = m,
                               .n = n,
                               .k = k,
                               .dtype = OVL_DTYPE_BF16,
                               .allgather = OVL_AG_NCCL};
}

static ovl_plan_params_t rs(uint32_t world, uint64_t m, uint64_t n, uint64_t k)
{
    ovl_plan_params_t p = ag(world, m, n, k);
    p.kind = OVL_OP_GEMM_RS;
    return p;
}

/* As ovld resolves an op that said auto: the rule's algorithm. */
static ovl_plan_params_t by_rule(ovl_plan_params_t p)
{
    p.algo = ovl_plan_choose(&p);
    p.chosen = OVL_CHOSEN_RULE;
    return p;
}

static void check_candidates(const ovl_plan_params_t *p, uint32_t min)
{
    ovl_plan_cand_t c[OVL_PLAN_MAX_CANDS];
    uint32_t n = ovl_plan_candidates(p, c);
    if (n < min)
        fail_msg("%u candidates, want at least %u", n, min);
    assert_true(n <= OVL_PLAN_MAX_CANDS);
    assert_int_equal(c[0].algo, ovl_plan_choose(p));
    assert_int_equal(c[0].chunks, 0);
    for (uint32_t i = 0; i < n; i++) {
        ovl_plan_params_t q = *p;
        ovl_plan_t plan;
        q.algo = c[i].algo;
        q.chunks = c[i].chunks;
        /* by the copy engine only where the params leave it to ovld */
        assert_true(c[i].allgather == OVL_AG_AUTO ||
                    (c[i].allgather == OVL_AG_COPY && p->allgather == OVL_AG_AUTO));
        if (c[i].allgather != OVL_AG_AUTO)
            q.allgather = c[i].allgather;
        assert_true(ovl_op_kind_takes_algo(p->kind, c[i].algo));
        assert_int_equal(ovl_plan_build(&q, &plan), OVL_OK);
        ovl_plan_free(&plan);
        for (uint32_t j = 0; j < i; j++)
            assert_false(c[j].algo == c[i].algo && c[j].chunks == c[i].chunks &&
                         c[j].allgather == c[i].allgather);
    }
}

/* How many of p's candidates are algo gathering by the copy engine where
 * the params would have NCCL. */
static uint32_t copy_variants(const ovl_plan_params_t *p, ovl_algo_t algo)
{
    ovl_plan_cand_t c[OVL_PLAN_MAX_CANDS];
    uint32_t n = ovl_plan_candidates(p, c), copies = 0;
    for (uint32_t i = 0; i < n; i++)
        copies += c[i].algo == algo && c[i].allgather == OVL_AG_COPY;
    return copies;
}

static void test_candidates(void **state)
{
    (void)state;
    /* all-gather + GEMM: naive, collective and ring, several chunkings */
    ovl_plan_params_t p = ag(2, 1024, 1024, 1024);
    check_candidates(&p, 5);
    p = ag(4, 64, 96, 32);
    check_candidates(&p, 3);
    /* GEMM + reduce-scatter: its four */
    p = rs(2, 2048, 512, 512);
    check_candidates(&p, 5);
    /* where ranks share a GPU, naive and collective GEMM + reduce-scatter
     * cannot run (no NCCL between them): never candidates */
    p.shared_gpu = true;
    ovl_plan_cand_t c[OVL_PLAN_MAX_CANDS];
    uint32_t n = ovl_plan_candidates(&p, c);
    assert_true(n >= 2);
    for (uint32_t i = 0; i < n; i++)
        assert_true(c[i].algo == OVL_ALGO_RING || c[i].algo == OVL_ALGO_PUSH);
    /* one row: chunkings collapse into one plan each */
    p = ag(2, 1, 64, 64);
    n = ovl_plan_candidates(&p, c);
    assert_true(n >= 2 && n <= 3);
    /* how A is gathered: where the params leave it to ovld (allgather
     * auto: NCCL at world 2), naive and collective also by the copy
     * engine; ring gathers by the copy engine anyway (no second variant);
     * an operator's nccl or copy is kept */
    p = ag(2, 1024, 1024, 1024);
    p.allgather = OVL_AG_AUTO;
    check_candidates(&p, 8);
    assert_int_equal(copy_variants(&p, OVL_ALGO_NAIVE), 1);
    assert_true(copy_variants(&p, OVL_ALGO_COLLECTIVE) >= 2);
    assert_int_equal(copy_variants(&p, OVL_ALGO_RING), 0);
    for (ovl_ag_pref_t g = OVL_AG_NCCL; g <= OVL_AG_COPY; g++) {
        p.allgather = g;
        check_candidates(&p, 5);
        assert_int_equal(copy_variants(&p, OVL_ALGO_NAIVE), 0);
        assert_int_equal(copy_variants(&p, OVL_ALGO_COLLECTIVE), 0);
    }
    /* world 1 gathers by a local copy whatever the preference: one each */
    p = ag(1, 1024, 1024, 1024);
    p.allgather = OVL_AG_AUTO;
    assert_int_equal(copy_variants(&p, OVL_ALGO_NAIVE), 0);
    /* GEMM + reduce-scatter gathers nothing: no variants */
    p = rs(2, 2048, 512, 512);
    p.allgather = OVL_AG_AUTO;
    for (ovl_algo_t a = OVL_ALGO_NAIVE; a < OVL_ALGO_COUNT; a++)
        assert_int_equal(copy_variants(&p, a), 0);
    /* params no algorithm plans: none */
    p = ag(2, 0, 64, 64);
    assert_int_equal(ovl_plan_candidates(&p, c), 0);
    assert_int_equal(ovl_plan_candidates(NULL, c), 0);
}

/* Runs ops of key p until it is chosen, one at a time, candidate c taking
 * time(c); returns the ops it took. */
static uint32_t measure(ovld_tune_t *t, const ovl_plan_params_t *p,
                        uint64_t (*time)(const ovl_plan_params_t *q), uint32_t max_ops)
{
    for (uint32_t ops = 0; ops < max_ops; ops++) {
        ovl_plan_params_t q = *p;
        ovld_tune_ticket_t tk;
        ovld_tune_pick(t, UID, &q, &tk);
        if (q.chosen == OVL_CHOSEN_MEASURED)
            return ops;
        if (q.chosen == OVL_CHOSEN_RULE)
            return ops; /* gave up: the rule's */
        assert_int_equal(q.chosen, OVL_CHOSEN_TRYING);
        assert_int_not_equal(tk.entry, 0);
        uint64_t ns = time(&q);
        /* a time of 0 here: the op failed for its plan's reason */
        ovld_tune_record(t, tk, ns ? OVLD_TUNE_TIMED : OVLD_TUNE_FAILED, ns);
    }
    fail_msg("not chosen after %u ops", max_ops);
    return 0;
}

/* The candidate the time functions below make fastest. */
static ovl_plan_cand_t fastest;

/* Makes the last candidate of p the fastest, and returns it. */
static ovl_plan_cand_t aim_last(const ovl_plan_params_t *p)
{
    ovl_plan_cand_t c[OVL_PLAN_MAX_CANDS];
    uint32_t n = ovl_plan_candidates(p, c);
    assert_true(n >= 2);
    fastest = c[n - 1];
    return fastest;
}

/* fastest at 1000 ns; everything else slower, by its chunks and algo */
static uint64_t time_aimed(const ovl_plan_params_t *q)
{
    if (q->algo == fastest.algo && q->chunks == fastest.chunks &&
        (q->allgather == fastest.allgather ||
         (fastest.allgather == OVL_AG_AUTO && q->allgather != OVL_AG_COPY)))
        return 1000;
    return 2000 + 100 * q->chunks + 10 * (uint64_t)q->algo + (uint64_t)q->allgather;
}

static void test_protocol(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(3, 16, 0);
    assert_non_null(t);
    ovl_plan_params_t p = by_rule(ag(2, 1024, 1024, 1024));
    ovl_plan_cand_t c[OVL_PLAN_MAX_CANDS];
    uint32_t n = ovl_plan_candidates(&p, c);
    ovl_plan_cand_t want = aim_last(&p);

    /* every candidate: a warm-up and three samples, then the choice */
    uint32_t ops = measure(t, &p, time_aimed, 1000);
    assert_int_equal(ops, n * 4);
    assert_int_equal(ovld_tune_size(t), 1);
    assert_int_equal(ovld_tune_chosen(t), 1);
    assert_true(ovld_tune_take_dirty(t));
    assert_false(ovld_tune_take_dirty(t));
    for (int i = 0; i < 5; i++) {
        ovl_plan_params_t q = p;
        ovld_tune_ticket_t tk;
        ovld_tune_pick(t, UID, &q, &tk);
        assert_int_equal(q.chosen, OVL_CHOSEN_MEASURED);
        assert_int_equal(q.algo, want.algo);
        assert_int_equal(q.chunks, want.chunks);
        assert_int_equal(tk.entry, 0);
    }
    /* a Plan request's look: the choice, nothing measured or added */
    ovl_plan_params_t pk = p;
    assert_true(ovld_tune_peek(t, &pk));
    assert_int_equal(pk.chosen, OVL_CHOSEN_MEASURED);
    assert_int_equal(pk.algo, want.algo);
    ovl_plan_params_t other = by_rule(ag(2, 1024, 4096, 1024));
    assert_false(ovld_tune_peek(t, &other));
    assert_int_equal(other.chosen, OVL_CHOSEN_RULE);
    assert_int_equal(ovld_tune_size(t), 1);
    /* another rank, or one B said as nb 1: the same key */
    ovl_plan_params_t r = p;
    ovld_tune_ticket_t tk;
    r.nb = 1;
    ovld_tune_pick(t, UID, &r, &tk);
    assert_int_equal(r.chosen, OVL_CHOSEN_MEASURED);
    r = p;
    r.rank = 1;
    ovld_tune_pick(t, UID, &r, &tk);
    assert_int_equal(r.chosen, OVL_CHOSEN_MEASURED);
    assert_int_equal(ovld_tune_size(t), 1);
    /* another shape: a new key */
    r = by_rule(ag(2, 1024, 2048, 1024));
    ovld_tune_pick(t, UID, &r, &tk);
    assert_int_equal(r.chosen, OVL_CHOSEN_TRYING);
    assert_int_equal(ovld_tune_size(t), 2);
    ovld_tune_destroy(t);
}

/* The warm-up is not counted: a first run of a candidate, however fast,
 * does not make it the choice. */
static uint64_t first_fast(const ovl_plan_params_t *q)
{
    static uint32_t naive_runs;
    if (q->algo == OVL_ALGO_NAIVE)
        return naive_runs++ == 0 ? 1 : 5000;
    return 3000;
}

static void test_warmup(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 4, 0);
    ovl_plan_params_t p = by_rule(ag(2, 256, 256, 256));
    (void)measure(t, &p, first_fast, 200);
    ovl_plan_params_t q = p;
    ovld_tune_ticket_t tk;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_int_not_equal(q.algo, OVL_ALGO_NAIVE);
    ovld_tune_destroy(t);
}

/* Ops in flight together: tickets handed out before any time is back, the
 * times coming back in another order. */
static void test_in_flight(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(2, 4, 0);
    ovl_plan_params_t p = by_rule(rs(2, 2048, 512, 512));
    enum { WINDOW = 7 };
    ovld_tune_ticket_t tk[WINDOW];
    ovl_plan_params_t q[WINDOW];
    uint32_t rounds = 0;
    for (;;) {
        uint32_t got = 0;
        for (uint32_t i = 0; i < WINDOW; i++) {
            q[i] = p;
            ovld_tune_pick(t, UID, &q[i], &tk[i]);
            got += q[i].chosen == OVL_CHOSEN_TRYING;
        }
        if (got == 0)
            break;
        for (uint32_t i = WINDOW; i-- > 0;)
            ovld_tune_record(t, tk[i], OVLD_TUNE_TIMED, q[i].algo == OVL_ALGO_PUSH ? 10 : 20);
        assert_true(++rounds < 100);
    }
    ovl_plan_params_t r = p;
    ovld_tune_ticket_t none;
    ovld_tune_pick(t, UID, &r, &none);
    assert_int_equal(r.chosen, OVL_CHOSEN_MEASURED);
    assert_int_equal(r.algo, OVL_ALGO_PUSH);
    /* a ticket of a key already chosen counts nothing */
    ovld_tune_record(t, tk[0], OVLD_TUNE_TIMED, 1);
    ovld_tune_pick(t, UID, &r, &none);
    assert_int_equal(r.algo, OVL_ALGO_PUSH);
    ovld_tune_destroy(t);
}

/* A candidate whose ops fail (time 0) samples times is dropped; all
 * dropped: the rule's. */
static uint64_t naive_fails(const ovl_plan_params_t *q)
{
    return q->algo == OVL_ALGO_NAIVE ? 0 : 100 + q->chunks;
}

static uint64_t all_fail(const ovl_plan_params_t *q)
{
    (void)q;
    return 0;
}

static void test_failures(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(2, 4, 0);
    ovl_plan_params_t p = by_rule(ag(2, 512, 512, 512));
    (void)measure(t, &p, naive_fails, 500);
    ovl_plan_params_t q = p;
    ovld_tune_ticket_t tk;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_int_not_equal(q.algo, OVL_ALGO_NAIVE);
    char text[4096];
    assert_true(ovld_tune_format(t, "dev", false, text, sizeof(text)) < sizeof(text));
    assert_non_null(strstr(text, "naive/0:0!"));

    /* every candidate fails: no choice, the rule's from then on, and
     * nothing for the state file (chosen_only) */
    ovl_plan_params_t p2 = by_rule(ag(2, 512, 1024, 512));
    (void)measure(t, &p2, all_fail, 500);
    for (int i = 0; i < 3; i++) {
        q = p2;
        ovld_tune_pick(t, UID, &q, &tk);
        assert_int_equal(q.chosen, OVL_CHOSEN_RULE);
        assert_int_equal(q.algo, ovl_plan_choose(&p2));
        assert_int_equal(q.chunks, 0);
        assert_int_equal(tk.entry, 0);
    }
    q = p2;
    assert_false(ovld_tune_peek(t, &q));
    ovld_tune_format(t, "dev", false, text, sizeof(text));
    assert_non_null(strstr(text, " chose=- "));
    assert_non_null(strstr(text, " gave-up\n"));
    ovld_tune_format(t, "dev", true, text, sizeof(text));
    assert_null(strstr(text, " n=1024 "));
    assert_non_null(strstr(text, " n=512 ")); /* the chosen key only */
    ovld_tune_destroy(t);
}

/* Ops that failed for another's reason count nothing; an op that ran
 * without a time makes the key give up (the timer does not work for it). */
static void test_outcomes(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 4, 0);
    ovl_plan_params_t p = by_rule(ag(2, 512, 512, 512)), q;
    ovld_tune_ticket_t tk;
    for (int i = 0; i < 50; i++) {
        q = p;
        ovld_tune_pick(t, UID, &q, &tk);
        assert_int_equal(q.chosen, OVL_CHOSEN_TRYING);
        ovld_tune_record(t, tk, OVLD_TUNE_NONE, 0);
    }
    char text[4096];
    ovld_tune_format(t, "dev", false, text, sizeof(text));
    assert_null(strstr(text, "!")); /* nothing dropped */
    assert_non_null(strstr(text, " measuring\n"));
    q = p;
    ovld_tune_pick(t, UID, &q, &tk);
    ovld_tune_record(t, tk, OVLD_TUNE_TIMED, 0);
    q = p;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_int_equal(q.chosen, OVL_CHOSEN_RULE);
    assert_int_equal(tk.entry, 0);
    assert_false(ovld_tune_take_dirty(t)); /* nothing for the file */
    /* the outcome of a status */
    assert_int_equal(ovld_tune_outcome_of(OVL_OK, false), OVLD_TUNE_TIMED);
    assert_int_equal(ovld_tune_outcome_of(OVL_ERR_INVALID, true), OVLD_TUNE_FAILED);
    assert_int_equal(ovld_tune_outcome_of(OVL_ERR_BACKEND, false), OVLD_TUNE_FAILED);
    assert_int_equal(ovld_tune_outcome_of(OVL_ERR_NOMEM, false), OVLD_TUNE_FAILED);
    assert_int_equal(ovld_tune_outcome_of(OVL_ERR_ABORTED, false), OVLD_TUNE_NONE);
    assert_int_equal(ovld_tune_outcome_of(OVL_ERR_INVALID, false), OVLD_TUNE_NONE);
    ovld_tune_destroy(t);
}

/* An op's own chunks or streams (or the operator's defaults) are kept: such
 * ops are not measured, and a Plan request's look leaves them too. */
static void test_chunks_asked(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 4, 0);
    ovl_plan_params_t p = by_rule(ag(2, 1024, 1024, 1024));
    (void)aim_last(&p);
    (void)measure(t, &p, time_aimed, 1000);
    ovl_plan_params_t q = p;
    q.chunks = 8;
    ovld_tune_ticket_t tk;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_int_equal(q.chunks, 8);
    assert_int_equal(q.chosen, OVL_CHOSEN_RULE);
    assert_false(ovld_tune_peek(t, &q));
    q = p;
    q.streams = 2;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_int_equal(q.streams, 2);
    assert_int_equal(q.chosen, OVL_CHOSEN_RULE);
    assert_int_equal(tk.entry, 0);
    ovld_tune_destroy(t);
}

/* At most max_entries keys, the least recently used out; its tickets are
 * then ignored. */
static void test_bound(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 2, 0);
    ovl_plan_params_t a = by_rule(ag(2, 256, 256, 256)), b = by_rule(ag(2, 256, 512, 256)),
                      c = by_rule(ag(2, 256, 768, 256));
    ovld_tune_ticket_t ta, tb, tc;
    ovl_plan_params_t q = a;
    ovld_tune_pick(t, UID, &q, &ta);
    q = b;
    ovld_tune_pick(t, UID, &q, &tb);
    q = a; /* a used again: b is the least recent */
    ovld_tune_pick(t, UID, &q, &ta);
    q = c;
    ovld_tune_pick(t, UID, &q, &tc);
    assert_int_equal(ovld_tune_size(t), 2);
    ovld_tune_record(t, tb, OVLD_TUNE_TIMED, 5); /* b's entry is gone: ignored */
    char text[8192];
    ovld_tune_format(t, "dev", false, text, sizeof(text));
    assert_null(strstr(text, " n=512 "));
    assert_non_null(strstr(text, " n=256 "));
    assert_non_null(strstr(text, " n=768 "));
    ovld_tune_clear(t);
    assert_int_equal(ovld_tune_size(t), 0);
    ovld_tune_record(t, ta, OVLD_TUNE_TIMED, 5); /* cleared: ignored */
    ovld_tune_destroy(t);
    /* out of range */
    assert_null(ovld_tune_create(0, 4, 0));
    assert_null(ovld_tune_create(OVLD_TUNE_MAX_SAMPLES + 1, 4, 0));
    assert_null(ovld_tune_create(3, 0, 0));
}

/* A job across nodes (a coordinator's params): its topology is part of
 * the key (node_of copied: the caller's array may go), every rank on node
 * 0 is one node, and the text keeps it (nodes=). */
static void test_nodes(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 8, 0);
    uint32_t *two = malloc(4 * sizeof(*two));
    two[0] = two[1] = 0;
    two[2] = two[3] = 1;
    static const uint32_t zeros[4] = {0, 0, 0, 0};
    ovl_plan_params_t across = by_rule(ag(4, 512, 512, 512)), one = across;
    across.allgather = OVL_AG_NCCL;
    one.allgather = OVL_AG_NCCL;
    across.node_of = two;
    across = by_rule(across);
    (void)aim_last(&across);
    (void)measure(t, &across, time_aimed, 1000);
    assert_int_equal(ovld_tune_size(t), 1);
    ovl_plan_params_t q = one;
    ovld_tune_ticket_t tk;
    ovld_tune_pick(t, UID, &q, &tk); /* one node: another key */
    assert_int_equal(q.chosen, OVL_CHOSEN_TRYING);
    assert_int_equal(ovld_tune_size(t), 2);
    q = one;
    q.node_of = zeros; /* every rank on node 0: one node's key */
    ovld_tune_pick(t, UID, &q, &tk);
    assert_int_equal(ovld_tune_size(t), 2);
    uint32_t copy[4] = {0, 0, 1, 1};
    q = across;
    q.node_of = copy;
    free(two); /* the caller's array goes: the key stays */
    assert_true(ovld_tune_peek(t, &q));
    assert_int_equal(q.algo, fastest.algo);
    char text[4096];
    size_t len = ovld_tune_format(t, "dev", false, text, sizeof(text));
    assert_non_null(strstr(text, " nodes=0,0,1,1 "));
    ovld_tune_t *u = ovld_tune_create(1, 8, 0);
    size_t skipped;
    char why[128];
    assert_int_equal(ovld_tune_load(u, "dev", text, len, &skipped, why, sizeof(why)), 1);
    q = across;
    q.node_of = copy;
    assert_true(ovld_tune_peek(u, &q));
    assert_int_equal(q.algo, fastest.algo);
    /* a nodes= list not one per rank: skipped */
    char *bad = strstr(text, " nodes=0,0,1,1 ");
    memcpy(bad, " nodes=0,0,1,  ", 15);
    ovld_tune_t *w = ovld_tune_create(1, 8, 0);
    assert_int_equal(ovld_tune_load(w, "dev", text, len, &skipped, why, sizeof(why)), 0);
    ovld_tune_destroy(w);
    ovld_tune_destroy(u);
    ovld_tune_destroy(t);
}

/* One user's keys at most max_per_uid: past it that user's least recent
 * goes, not another user's; keys loaded from the file are nobody's. */
static void test_uid_bound(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(1, 8, 2);
    ovld_tune_ticket_t tk;
    ovl_plan_params_t other = by_rule(ag(2, 64, 64, 64));
    ovl_plan_params_t q = other;
    ovld_tune_pick(t, 2000, &q, &tk); /* another user's */
    for (uint64_t n = 1; n <= 5; n++) {
        q = by_rule(ag(2, 64, 64 * (n + 1), 64));
        ovld_tune_pick(t, UID, &q, &tk);
    }
    assert_int_equal(ovld_tune_size(t), 3); /* UID's last two and the other's */
    char text[8192];
    ovld_tune_format(t, "dev", false, text, sizeof(text));
    assert_non_null(strstr(text, " n=64 "));  /* the other user's stays */
    assert_non_null(strstr(text, " n=320 ")); /* UID's two most recent */
    assert_non_null(strstr(text, " n=384 "));
    assert_null(strstr(text, " n=256 "));
    ovld_tune_destroy(t);
}

/* Params tune leaves as they are: an algorithm the op named or the
 * default_algo stood for, one candidate. */
static void test_left_alone(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(2, 4, 0);
    ovld_tune_ticket_t tk;
    ovl_plan_params_t p = ag(2, 256, 256, 256);
    p.algo = OVL_ALGO_NAIVE; /* given */
    ovl_plan_params_t q = p;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_memory_equal(&q, &p, sizeof(p));
    p.chosen = OVL_CHOSEN_DEFAULT;
    q = p;
    ovld_tune_pick(t, UID, &q, &tk);
    assert_memory_equal(&q, &p, sizeof(p));
    assert_int_equal(tk.entry, 0);
    assert_int_equal(ovld_tune_size(t), 0);
    assert_false(ovld_tune_peek(t, &q));
    ovld_tune_pick(NULL, UID, &q, &tk); /* no table: the rule's */
    assert_int_equal(tk.entry, 0);
    ovld_tune_destroy(t);
}

static uint64_t time_push4(const ovl_plan_params_t *q)
{
    return q->algo == OVL_ALGO_PUSH && q->chunks == 4 ? 50 : 70 + q->chunks;
}

static void test_text(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(2, 8, 0);
    ovl_plan_params_t a = by_rule(ag(2, 1024, 1024, 1024));
    ovl_plan_params_t b = by_rule(rs(2, 2048, 512, 512));
    b.reduce_op = OVL_REDUCE_AVG;
    ovl_plan_params_t c = by_rule(ag(2, 256, 64, 128));
    c.nb = 3;
    c.n_more[0] = 32;
    c.n_more[1] = 16;
    c.transb = true;
    c.dtype = OVL_DTYPE_FP8_E4M3;
    c.sc = (ovl_plan_scaling_t){.scaled = true,
                                .b_dtype = OVL_DTYPE_FP8_E5M2,
                                .out_dtype = OVL_DTYPE_FP16,
                                .a_mode = OVL_SCALE_BLOCK_1X128,
                                .b_mode = OVL_SCALE_BLOCK_128X128,
                                .bias = true};
    c = by_rule(c);
    (void)aim_last(&a);
    (void)measure(t, &a, time_aimed, 1000);
    (void)measure(t, &b, time_push4, 1000);
    (void)aim_last(&c);
    (void)measure(t, &c, time_aimed, 1000);
    /* A gathered by the copy engine where NCCL is the rule's: the choice
     * says so (collective/CHUNKS/copy) and a reload plans it so */
    ovl_plan_params_t e = ag(2, 2048, 1024, 1024);
    e.allgather = OVL_AG_AUTO;
    e = by_rule(e);
    {
        ovl_plan_cand_t cs[OVL_PLAN_MAX_CANDS];
        uint32_t ncs = ovl_plan_candidates(&e, cs);
        fastest.allgather = OVL_AG_AUTO;
        for (uint32_t i = 0; i < ncs; i++)
            if (cs[i].algo == OVL_ALGO_COLLECTIVE && cs[i].allgather == OVL_AG_COPY)
                fastest = cs[i];
        assert_int_equal(fastest.allgather, OVL_AG_COPY);
    }
    (void)measure(t, &e, time_aimed, 1000);
    ovl_plan_params_t d = by_rule(ag(2, 512, 512, 512)); /* left measuring */
    ovld_tune_ticket_t tk;
    ovld_tune_pick(t, UID, &d, &tk);

    size_t need = ovld_tune_format(t, "H200 driver 580", false, NULL, 0);
    char *text = malloc(need + 1);
    assert_int_equal(ovld_tune_format(t, "H200 driver 580", false, text, need + 1), need);
    assert_int_equal(strlen(text), need);
    assert_true(strncmp(text, "ovld-tune 1 H200 driver 580\n", 28) == 0);
    assert_non_null(strstr(text, " measuring\n"));
    assert_non_null(strstr(text, "a_mode=1x128 b_mode=128x128"));
    assert_non_null(strstr(text, " reduce=avg "));
    assert_non_null(strstr(text, " n=64,32,16 "));
    assert_non_null(strstr(text, " allgather=auto chose=collective/"));
    assert_non_null(strstr(text, "/copy ns="));
    assert_non_null(strstr(text, "naive/0/copy:"));
    /* truncated: the same length asked, a NUL-terminated prefix */
    char small[16];
    assert_int_equal(ovld_tune_format(t, "H200 driver 580", false, small, sizeof(small)), need);
    assert_int_equal(strlen(small), sizeof(small) - 1);

    /* reloaded: the three choices (not the key measuring), the same plans */
    ovld_tune_t *u = ovld_tune_create(2, 8, 0);
    size_t skipped = 9;
    char why[128];
    assert_int_equal(ovld_tune_load(u, "H200 driver 580", text, need, &skipped, why, sizeof(why)),
                     4);
    assert_int_equal(skipped, 1); /* the one measuring */
    assert_non_null(strstr(why, "measuring"));
    assert_true(ovld_tune_take_dirty(u));
    ovl_plan_params_t keys[4] = {a, b, c, e};
    for (int i = 0; i < 4; i++) {
        ovl_plan_params_t q0 = keys[i], q1 = keys[i];
        ovld_tune_ticket_t t0, t1;
        ovld_tune_pick(t, UID, &q0, &t0);
        ovld_tune_pick(u, UID, &q1, &t1);
        assert_int_equal(q1.chosen, OVL_CHOSEN_MEASURED);
        assert_int_equal(q0.algo, q1.algo);
        assert_int_equal(q0.chunks, q1.chunks);
        assert_int_equal(q0.allgather, q1.allgather);
        assert_int_equal(q1.allgather, i == 3 ? OVL_AG_COPY : keys[i].allgather);
    }
    /* the round trip of the reloaded table is the chosen lines again */
    size_t need2 = ovld_tune_format(u, "H200 driver 580", false, NULL, 0);
    char *text2 = malloc(need2 + 1);
    ovld_tune_format(u, "H200 driver 580", false, text2, need2 + 1);
    assert_int_equal(ovld_tune_load(u, "H200 driver 580", text2, need2, &skipped, why, sizeof(why)),
                     0);
    assert_int_equal(skipped, 4); /* each a key given twice */
    /* another device, another version: nothing */
    ovld_tune_t *v = ovld_tune_create(2, 8, 0);
    assert_int_equal(ovld_tune_load(v, "H100 driver 580", text, need, &skipped, why, sizeof(why)),
                     0);
    assert_non_null(strstr(why, "H100"));
    text[10] = '2';
    assert_int_equal(ovld_tune_load(v, "H200 driver 580", text, need, &skipped, why, sizeof(why)),
                     0);
    text[10] = '1';
    /* a table smaller than the file: the first keys */
    ovld_tune_t *w = ovld_tune_create(2, 2, 0);
    assert_int_equal(ovld_tune_load(w, "H200 driver 580", text, need, &skipped, why, sizeof(why)),
                     2);
    assert_int_equal(skipped, 3);
    ovld_tune_destroy(w);
    ovld_tune_destroy(v);
    ovld_tune_destroy(u);
    ovld_tune_destroy(t);
    free(text2);
    free(text);
}

/* Lines that do not parse, or do not plan, are skipped with words. */
static void test_bad_lines(void **state)
{
    (void)state;
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=ring/0", "fewer than two"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=ring/3 ns=ring/0:1,naive/0:2",
         "none of the candidates"},
        {"kind=ag_gemm world=2 m=0 n=64 k=64 dtype=bf16 chose=ring/0 ns=ring/0:1,naive/0:2",
         "does not plan"},
        {"kind=ag_gemm world=99999 m=64 n=64 k=64 chose=ring/0 ns=ring/0:1,naive/0:2", "world"},
        {"kind=nope world=2 m=64 n=64 k=64 chose=ring/0 ns=ring/0:1,naive/0:2", "kind"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 color=red chose=ring/0 "
         "ns=ring/0:1,naive/0:2",
         "unknown field"},
        {"kind=ag_gemm world=2 m=18446744073709551616 n=64 k=64 chose=ring/0 "
         "ns=ring/0:1,naive/0:2",
         "m"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=auto/0 ns=ring/0:1,naive/0:2",
         "chose"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=ring/0 ns=ring/0:x,naive/0:2",
         "a time"},
        {"kind=ag_gemm world=2 m=64 n=64,1,2,3,4,5,6,7,8 k=64 chose=ring/0 ns=ring/0:1,naive/0:2",
         "too many"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 transb=2 chose=ring/0 "
         "ns=ring/0:1,naive/0:2",
         "transb"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 novalue ns=ring/0:1,naive/0:2",
         "without its value"},
        /* how A is gathered: nccl or copy, never auto or another word */
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=naive/0/auto "
         "ns=naive/0:1,naive/0/copy:2",
         "chose"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=naive/0 "
         "ns=naive/0:1,naive/0/pigeon:2",
         "ns: a candidate"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=naive/0 "
         "ns=naive/0:1,naive/0/nccl:2",
         "ns: a candidate"},
        /* every key names its kind */
        {"world=2 m=64 n=64 k=64 dtype=bf16 chose=ring/0 ns=ring/0:1,naive/0:2", "kind missing"},
        /* never over the operator's allgather */
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 allgather=nccl chose=naive/0/copy "
         "ns=naive/0:2,naive/0/copy:1",
         "does not leave to ovld"},
        {"kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 chose=naive/0/copy "
         "ns=naive/0:1,ring/0:2",
         "none of the candidates"},
        /* across nodes only NCCL moves rows: a copy-engine choice does not
         * plan */
        {"kind=ag_gemm world=4 m=64 n=64 k=64 dtype=bf16 allgather=auto nodes=0,0,1,1 "
         "chose=naive/0/copy ns=naive/0:2,naive/0/copy:1",
         "does not plan"},
    };
    const char *good =
        "kind=ag_gemm world=2 m=64 n=64 k=64 dtype=bf16 transb=0 a_out=0 strided=0 shared_gpu=0 "
        "allgather=nccl chose=naive/0 ns=ring/0:9,naive/0:4";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[1024];
        int len = snprintf(text, sizeof(text), "ovld-tune 1 dev\n%s\n%s", bad[i].line, good);
        ovld_tune_t *t = ovld_tune_create(2, 8, 0);
        size_t skipped = 0;
        char why[160];
        size_t taken = ovld_tune_load(t, "dev", text, (size_t)len, &skipped, why, sizeof(why));
        if (taken != 1 || skipped != 1)
            fail_msg("case %zu: %zu taken, %zu skipped (%s)", i, taken, skipped, why);
        if (!strstr(why, bad[i].why) || !strstr(why, "line 2"))
            fail_msg("case %zu: '%s' does not say 'line 2' and '%s'", i, why, bad[i].why);
        ovl_plan_params_t q = by_rule(ag(2, 64, 64, 64));
        q.allgather = OVL_AG_NCCL;
        ovld_tune_ticket_t tk;
        ovld_tune_pick(t, UID, &q, &tk);
        assert_int_equal(q.chosen, OVL_CHOSEN_MEASURED);
        assert_int_equal(q.algo, OVL_ALGO_NAIVE);
        ovld_tune_destroy(t);
    }
}

/* Bytes mangled at random: whatever loads is a valid choice. */
static void test_mangled(void **state)
{
    (void)state;
    ovld_tune_t *t = ovld_tune_create(2, 8, 0);
    ovl_plan_params_t a = by_rule(ag(2, 1024, 1024, 1024)), b = by_rule(rs(2, 2048, 512, 512));
    (void)aim_last(&a);
    (void)measure(t, &a, time_aimed, 1000);
    (void)measure(t, &b, time_push4, 1000);
    char text[4096];
    size_t len = ovld_tune_format(t, "dev", false, text, sizeof(text));
    assert_true(len < sizeof(text));
    ovld_tune_destroy(t);
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 3000; round++) {
        char m[4096];
        memcpy(m, text, len);
        for (int f = 0; f < 1 + round % 4; f++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t at = 16 + (size_t)(x % (len - 16));
            m[at] = (char)(x >> 32);
        }
        ovld_tune_t *u = ovld_tune_create(2, 8, 0);
        size_t skipped;
        char why[128];
        size_t n = ovld_tune_load(u, "dev", m, len, &skipped, why, sizeof(why));
        assert_true(n <= 2);
        /* every key taken plans its choice */
        char out[4096];
        size_t olen = ovld_tune_format(u, "dev", false, out, sizeof(out));
        assert_true(olen < sizeof(out));
        ovld_tune_t *w = ovld_tune_create(2, 8, 0);
        assert_int_equal(ovld_tune_load(w, "dev", out, olen, &skipped, why, sizeof(why)), n);
        ovld_tune_destroy(w);
        ovld_tune_destroy(u);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_candidates), cmocka_unit_test(test_protocol),
        cmocka_unit_test(test_warmup),     cmocka_unit_test(test_in_flight),
        cmocka_unit_test(test_failures),   cmocka_unit_test(test_bound),
        cmocka_unit_test(test_outcomes),   cmocka_unit_test(test_chunks_asked),
        cmocka_unit_test(test_uid_bound),  cmocka_unit_test(test_nodes),
        cmocka_unit_test(test_left_alone), cmocka_unit_test(test_text),
        cmocka_unit_test(test_bad_lines),  cmocka_unit_test(test_mangled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

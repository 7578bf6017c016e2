/*
 * test_plancache.c: unit test of a job's plan cache (daemon/core/plancache.h)
 * and of plan parameters' equality (plan.h, ovl_plan_params_equal).
 *
 * What must hold:
 *  - the same parameters (whatever the rank asked) and the same ranks
 *    present give the same set, planned once; each plan is the one
 *    ovl_plan_build makes for its rank, byte for byte;
 *  - any other parameter, or other ranks present, is another set; ranks
 *    not present get no plan;
 *  - the cache keeps at most its capacity, the least recently used out
 *    first, and a set an op still holds stays whole until its last put
 *    (ASan would see a use after free or a leak);
 *  - a rank the planner refuses fails the get with its status and rank,
 *    and nothing is cached;
 *  - without a cache every get plans anew;
 *  - equality looks at every field, node_of by its entries.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "plancache.h"

static ovl_plan_params_t params(ovl_algo_t algo, uint32_t world, uint64_t m)
{
    return (ovl_plan_params_t){.algo = algo,
                               .world = world,
                               .m = m,
                               .n = 48,
                               .k = 32,
                               .dtype = OVL_DTYPE_BF16,
                               .shared_gpu = world > 1,
                               .allgather = OVL_AG_COPY};
}

static const void *all4[4] = {"r0", "r1", "r2", "r3"};

/* s's plans are ovl_plan_build's for each present rank, and nothing else. */
static void assert_planned(const ovld_plans_t *s, const ovl_plan_params_t *pp,
                           const void *const *present)
{
    assert_int_equal(s->world, pp->world);
    for (uint32_t r = 0; r < pp->world; r++) {
        if (!present[r]) {
            assert_false(s->present[r]);
            assert_int_equal(s->plans[r].ninstr, 0);
            continue;
        }
        assert_true(s->present[r]);
        ovl_plan_params_t p = *pp;
        p.rank = r;
        ovl_plan_t want;
        assert_int_equal(ovl_plan_build(&p, &want), OVL_OK);
        assert_int_equal(s->plans[r].params.rank, r);
        assert_int_equal(s->plans[r].ninstr, want.ninstr);
        assert_memory_equal(s->plans[r].instr, want.instr, want.ninstr * sizeof(*want.instr));
        ovl_plan_free(&want);
    }
}

static void test_hit_and_miss(void **state)
{
    (void)state;
    ovld_plancache_t *pc = ovld_plancache_create(4);
    assert_non_null(pc);
    ovl_plan_params_t p = params(OVL_ALGO_RING, 4, 64);
    ovld_plans_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    uint32_t bad = 99;
    assert_int_equal(ovld_plans_get(pc, &p, all4, &a, &bad), OVL_OK);
    assert_planned(a, &p, all4);
    p.rank = 3; /* the rank asked for is not part of the key */
    assert_int_equal(ovld_plans_get(pc, &p, all4, &b, &bad), OVL_OK);
    assert_ptr_equal(a, b);
    assert_int_equal(a->refs, 3); /* the cache's and two ops' */
    assert_int_equal(ovld_plancache_size(pc), 1);

    ovl_plan_params_t q = p;
    q.m = 128;
    assert_int_equal(ovld_plans_get(pc, &q, all4, &c, &bad), OVL_OK);
    assert_ptr_not_equal(c, a);
    assert_planned(c, &q, all4);

    /* ranks 1 and 3 are another daemon's: another set, without their plans */
    const void *some[4] = {"r0", NULL, "r2", NULL};
    assert_int_equal(ovld_plans_get(pc, &p, some, &d, &bad), OVL_OK);
    assert_ptr_not_equal(d, a);
    assert_planned(d, &p, some);
    assert_int_equal(ovld_plancache_size(pc), 3);

    ovld_plans_put(a);
    ovld_plans_put(b);
    ovld_plans_put(c);
    ovld_plans_put(d);
    ovld_plancache_destroy(pc);
}

static void test_lru_and_held_sets(void **state)
{
    (void)state;
    ovld_plancache_t *pc = ovld_plancache_create(2);
    ovl_plan_params_t p1 = params(OVL_ALGO_RING, 2, 16), p2 = params(OVL_ALGO_NAIVE, 2, 16),
                      p3 = params(OVL_ALGO_COLLECTIVE, 2, 16);
    ovld_plans_t *s1, *s2, *s3, *t;
    uint32_t bad;
    assert_int_equal(ovld_plans_get(pc, &p1, all4, &s1, &bad), OVL_OK);
    assert_int_equal(ovld_plans_get(pc, &p2, all4, &s2, &bad), OVL_OK);
    /* s2 stays held until the end, so that a set planned anew cannot take
     * its address (without ASan, malloc would hand it out again) */
    /* p1 again: now the most recent, so p3 pushes p2 out */
    assert_int_equal(ovld_plans_get(pc, &p1, all4, &t, &bad), OVL_OK);
    assert_ptr_equal(t, s1);
    ovld_plans_put(t);
    assert_int_equal(ovld_plans_get(pc, &p3, all4, &s3, &bad), OVL_OK);
    assert_int_equal(ovld_plancache_size(pc), 2);
    assert_int_equal(ovld_plans_get(pc, &p1, all4, &t, &bad), OVL_OK);
    assert_ptr_equal(t, s1); /* still cached */
    ovld_plans_put(t);
    assert_int_equal(ovld_plans_get(pc, &p2, all4, &t, &bad), OVL_OK);
    assert_ptr_not_equal(t, s2); /* planned anew: s2 went out of the cache */
    assert_planned(t, &p2, all4);
    ovld_plans_put(t);
    ovld_plans_put(s2);
    /* p3 went out for p2, but its op still holds it: whole until its put */
    assert_int_equal(ovld_plancache_size(pc), 2);
    assert_planned(s3, &p3, all4);
    ovld_plans_put(s3);
    /* the cache goes while an op holds s1: the op's reference keeps it */
    ovld_plancache_destroy(pc);
    assert_int_equal(s1->refs, 1);
    assert_planned(s1, &p1, all4);
    ovld_plans_put(s1);
}

static void test_refused_and_uncached(void **state)
{
    (void)state;
    ovld_plancache_t *pc = ovld_plancache_create(4);
    ovl_plan_params_t p = params(OVL_ALGO_RING, 4, 64);
    p.chunks = OVL_PLAN_MAX_CHUNKS + 1; /* the planner refuses every rank */
    ovld_plans_t *s = NULL;
    uint32_t bad = 99;
    assert_int_equal(ovld_plans_get(pc, &p, all4, &s, &bad), OVL_ERR_INVALID);
    assert_int_equal(bad, 0);
    assert_null(s);
    assert_int_equal(ovld_plancache_size(pc), 0);
    ovld_plancache_destroy(pc);

    /* no cache (replay_cache 0): every get plans anew, and the put frees */
    assert_null(ovld_plancache_create(0));
    p = params(OVL_ALGO_NAIVE, 4, 64);
    ovld_plans_t *a, *b;
    assert_int_equal(ovld_plans_get(NULL, &p, all4, &a, &bad), OVL_OK);
    assert_int_equal(ovld_plans_get(NULL, &p, all4, &b, &bad), OVL_OK);
    assert_ptr_not_equal(a, b);
    assert_int_equal(a->refs, 1);
    assert_planned(a, &p, all4);
    ovld_plans_put(a);
    ovld_plans_put(b);
    ovld_plans_put(NULL);
}

static void test_params_equal(void **state)
{
    (void)state;
    ovl_plan_params_t a = params(OVL_ALGO_RING, 4, 64);
    a.n_more[1] = 7;
    ovl_plan_params_t b = a;
    assert_true(ovl_plan_params_equal(&a, &b));
    /* each field on its own makes them differ */
    ovl_plan_params_t v[18];
    for (int i = 0; i < 18; i++)
        v[i] = a;
    v[0].algo = OVL_ALGO_NAIVE;
    v[1].world = 2;
    v[2].rank = 1;
    v[3].m++;
    v[4].n++;
    v[5].k++;
    v[6].dtype = OVL_DTYPE_FP16;
    v[7].chunks = 2;
    v[8].streams = 2;
    v[9].want_gathered = true;
    v[10].transb = true;
    v[11].strided = true;
    v[12].shared_gpu = false;
    v[13].allgather = OVL_AG_NCCL;
    v[14].nb = 3;
    v[15].n_more[1] = 8;
    v[16].n_more[0] = 1;
    static const uint32_t two_nodes[4] = {0, 0, 1, 1};
    v[17].node_of = two_nodes;
    for (int i = 0; i < 18; i++) {
        if (ovl_plan_params_equal(&a, &v[i]) || ovl_plan_params_equal(&v[i], &a))
            fail_msg("field %d: equal", i);
    }
    /* node_of by its entries: NULL is every rank on node 0 */
    static const uint32_t one_node[4] = {0, 0, 0, 0}, two_again[4] = {0, 0, 1, 1};
    b.node_of = one_node;
    assert_true(ovl_plan_params_equal(&a, &b));
    a.node_of = two_nodes;
    b.node_of = two_again;
    assert_true(ovl_plan_params_equal(&a, &b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_and_miss),
        cmocka_unit_test(test_lru_and_held_sets),
        cmocka_unit_test(test_refused_and_uncached),
        cmocka_unit_test(test_params_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

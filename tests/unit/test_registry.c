/*
 * test_registry.c: unit tests of ovld's per-connection table of registered
 * buffers (daemon/core/registry.c) and of the range arithmetic every op goes
 * through before it touches client memory: ovl_matrix_extent
 * (common/matrix.h) and ovld_range_check. The range checks are the daemon's
 * only guard against a client naming bytes outside what it registered, so
 * every multiplication and addition is tested at its overflow boundary.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "matrix.h"
#include "registry.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define NREGS    1000 /* well past the initial 64 buckets: several growths */

/* ---------------------------------------------------------------- helpers */

/* Sizes that differ per entry, so that a mapped_bytes total built from the
 * wrong entries does not match by accident. */
static uint64_t size_of(size_t i)
{
    return 4096u * (i % 7 + 1) + i;
}

static ovld_reg_t *add_many(ovld_registry_t *r, size_t n)
{
    ovld_reg_t *regs = calloc(n, sizeof(*regs));
    assert_non_null(regs);
    for (size_t i = 0; i < n; i++) {
        regs[i].bytes = size_of(i);
        regs[i].client_addr = 0x7f0000000000u + i * 0x100000u;
        regs[i].device = (int)(i % 4);
        assert_int_equal(ovld_registry_add(r, &regs[i]), OVL_OK);
    }
    return regs;
}

static uint64_t sum_bytes(const ovld_reg_t *regs, size_t n, bool registered_only)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        if (!registered_only || regs[i].registered)
            s += regs[i].bytes;
    return s;
}

/* --------------------------------------------------------------- registry */

static void test_init_empty(void **state)
{
    (void)state;
    ovld_registry_t r;
    assert_int_equal(ovld_registry_init(&r), OVL_OK);
    assert_int_equal(r.count, 0);
    assert_int_equal(r.mapped_bytes, 0);
    assert_non_null(r.buckets);
    /* Power of two: lookups mask the id. */
    assert_true(r.nbuckets > 0 && (r.nbuckets & (r.nbuckets - 1)) == 0);
    assert_null(ovld_registry_find(&r, 0));
    assert_null(ovld_registry_find(&r, 1));
    assert_null(ovld_registry_find(&r, UINT64_MAX));
    ovld_registry_fini(&r);
    /* A finished table answers "not found" instead of crashing. */
    assert_null(ovld_registry_find(&r, 1));
}

static void test_add_find(void **state)
{
    (void)state;
    ovld_registry_t r;
    assert_int_equal(ovld_registry_init(&r), OVL_OK);
    size_t nb0 = r.nbuckets;
    ovld_reg_t *regs = add_many(&r, NREGS);
    assert_int_equal(r.count, NREGS);
    assert_true(r.nbuckets > nb0); /* it grew */
    assert_true((r.nbuckets & (r.nbuckets - 1)) == 0);
    assert_int_equal(r.mapped_bytes, sum_bytes(regs, NREGS, false));

    for (size_t i = 0; i < NREGS; i++) {
        /* Unique ids (sequential from 1 is how they are made; what matters
         * is that none is 0 and none repeats). */
        assert_true(regs[i].id != 0);
        if (i > 0)
            assert_true(regs[i].id > regs[i - 1].id);
        assert_int_equal(regs[i].refs, 1);
        assert_true(regs[i].registered);
        assert_ptr_equal(ovld_registry_find(&r, regs[i].id), &regs[i]);
    }
    /* Ids that were never handed out, including ones that alias a used
     * bucket under the mask. */
    assert_null(ovld_registry_find(&r, 0));
    assert_null(ovld_registry_find(&r, regs[NREGS - 1].id + 1));
    assert_null(ovld_registry_find(&r, regs[0].id + r.nbuckets * 1000));
    assert_null(ovld_registry_find(&r, UINT64_MAX));
    ovld_registry_fini(&r);
    free(regs);
}

static void test_remove(void **state)
{
    (void)state;
    ovld_registry_t r;
    assert_int_equal(ovld_registry_init(&r), OVL_OK);
    ovld_reg_t *regs = add_many(&r, NREGS);
    /* Every third one, so chains lose heads, middles and tails. */
    size_t removed = 0;
    for (size_t i = 0; i < NREGS; i += 3) {
        ovld_registry_remove(&r, &regs[i]);
        removed++;
        assert_false(regs[i].registered);
        assert_null(regs[i].next);
        /* The reference count is the caller's business, untouched. */
        assert_int_equal(regs[i].refs, 1);
    }
    assert_int_equal(r.count, NREGS - removed);
    assert_int_equal(r.mapped_bytes, sum_bytes(regs, NREGS, true));
    for (size_t i = 0; i < NREGS; i++) {
        if (i % 3 == 0)
            assert_null(ovld_registry_find(&r, regs[i].id));
        else
            assert_ptr_equal(ovld_registry_find(&r, regs[i].id), &regs[i]);
    }
    /* Removing twice is a no-op: count and bytes do not go down again. */
    size_t count = r.count;
    uint64_t bytes = r.mapped_bytes;
    ovld_registry_remove(&r, &regs[0]);
    ovld_registry_remove(&r, &regs[3]);
    assert_int_equal(r.count, count);
    assert_int_equal(r.mapped_bytes, bytes);

    /* New registrations after removals never reuse an id. */
    ovld_reg_t extra[10];
    memset(extra, 0, sizeof(extra));
    for (size_t i = 0; i < NELEM(extra); i++) {
        extra[i].bytes = 1;
        assert_int_equal(ovld_registry_add(&r, &extra[i]), OVL_OK);
        for (size_t j = 0; j < NREGS; j++)
            assert_true(extra[i].id != regs[j].id);
        assert_ptr_equal(ovld_registry_find(&r, extra[i].id), &extra[i]);
    }
    assert_int_equal(r.mapped_bytes, bytes + NELEM(extra));

    /* Everything out: back to zero. */
    for (size_t i = 0; i < NREGS; i++)
        ovld_registry_remove(&r, &regs[i]);
    for (size_t i = 0; i < NELEM(extra); i++)
        ovld_registry_remove(&r, &extra[i]);
    assert_int_equal(r.count, 0);
    assert_int_equal(r.mapped_bytes, 0);
    ovld_registry_fini(&r);
    free(regs);
}

struct visit {
    ovld_reg_t *base;
    size_t n;
    unsigned *seen; /* visits per entry */
    size_t calls;
    ovld_registry_t *r;
    int remove_mod; /* remove entries whose index % remove_mod == 0 (0: none) */
};

static void visit_fn(ovld_reg_t *reg, void *arg)
{
    struct visit *v = arg;
    /* Only entries of the table: pointers into base[]. */
    assert_true(reg >= v->base && reg < v->base + v->n);
    size_t i = (size_t)(reg - v->base);
    v->seen[i]++;
    v->calls++;
    assert_true(reg->registered);
    if (v->remove_mod && i % (size_t)v->remove_mod == 0)
        ovld_registry_remove(v->r, reg);
}

static void test_foreach(void **state)
{
    (void)state;
    ovld_registry_t r;
    assert_int_equal(ovld_registry_init(&r), OVL_OK);
    ovld_reg_t *regs = add_many(&r, NREGS);
    unsigned *seen = calloc(NREGS, sizeof(*seen));
    assert_non_null(seen);
    struct visit v = {.base = regs, .n = NREGS, .seen = seen, .r = &r};

    /* Each entry exactly once. */
    ovld_registry_foreach(&r, visit_fn, &v);
    assert_int_equal(v.calls, NREGS);
    for (size_t i = 0; i < NREGS; i++)
        assert_int_equal(seen[i], 1);

    /* Removing the visited entry (how a closing connection drops all). */
    memset(seen, 0, NREGS * sizeof(*seen));
    v.calls = 0;
    v.remove_mod = 2;
    ovld_registry_foreach(&r, visit_fn, &v);
    assert_int_equal(v.calls, NREGS); /* removal did not skip the next one */
    for (size_t i = 0; i < NREGS; i++)
        assert_int_equal(seen[i], 1);
    assert_int_equal(r.count, NREGS / 2);
    assert_int_equal(r.mapped_bytes, sum_bytes(regs, NREGS, true));

    /* The removed ones are no longer visited. */
    memset(seen, 0, NREGS * sizeof(*seen));
    v.calls = 0;
    v.remove_mod = 0;
    ovld_registry_foreach(&r, visit_fn, &v);
    assert_int_equal(v.calls, NREGS / 2);
    for (size_t i = 0; i < NREGS; i++)
        assert_int_equal(seen[i], i % 2 ? 1u : 0u);

    /* Remove all during one pass. */
    v.calls = 0;
    v.remove_mod = 1;
    ovld_registry_foreach(&r, visit_fn, &v);
    assert_int_equal(v.calls, NREGS / 2);
    assert_int_equal(r.count, 0);
    assert_int_equal(r.mapped_bytes, 0);
    v.calls = 0;
    ovld_registry_foreach(&r, visit_fn, &v);
    assert_int_equal(v.calls, 0);

    ovld_registry_fini(&r);
    free(seen);
    free(regs);
}

/* Large registrations: the byte total is 64-bit. */
static void test_mapped_bytes_large(void **state)
{
    (void)state;
    ovld_registry_t r;
    assert_int_equal(ovld_registry_init(&r), OVL_OK);
    ovld_reg_t a = {.bytes = UINT64_C(1) << 40}, b = {.bytes = (UINT64_C(1) << 40) + 3};
    assert_int_equal(ovld_registry_add(&r, &a), OVL_OK);
    assert_int_equal(ovld_registry_add(&r, &b), OVL_OK);
    assert_int_equal(r.mapped_bytes, (UINT64_C(1) << 41) + 3);
    ovld_registry_remove(&r, &a);
    assert_int_equal(r.mapped_bytes, (UINT64_C(1) << 40) + 3);
    ovld_registry_remove(&r, &b);
    assert_int_equal(r.mapped_bytes, 0);
    ovld_registry_fini(&r);
}

/* ------------------------------------------------------------ extents */

struct extent_case {
    uint64_t rows, cols, ld;
    size_t elem;
    ovl_status_t st;
    uint64_t bytes; /* when st == OVL_OK */
};

#define U64MAX UINT64_MAX
#define P63    (UINT64_C(1) << 63)
#define P62    (UINT64_C(1) << 62)
#define P32    (UINT64_C(1) << 32)

static const struct extent_case extent_cases[] = {
    /* Normal: ((rows-1)*ld + cols) * elem. */
    {1, 1, 1, 1, OVL_OK, 1},
    {1, 3, 3, 2, OVL_OK, 6},
    {2, 3, 5, 4, OVL_OK, 32},
    {4, 4, 4, 4, OVL_OK, 64},
    {1, 3, 100, 4, OVL_OK, 12}, /* one row: ld does not count */
    {1024, 512, 1024, 2, OVL_OK, (1023u * 1024u + 512u) * 2u},
    /* Empty matrices span nothing, wherever they are. */
    {0, 3, 3, 4, OVL_OK, 0},
    {3, 0, 3, 4, OVL_OK, 0},
    {3, 0, 0, 4, OVL_OK, 0},
    {0, 0, 0, 1, OVL_OK, 0},
    {U64MAX, 0, U64MAX, U64MAX, OVL_OK, 0}, /* no overflow from an empty one */
    {0, U64MAX, U64MAX, U64MAX, OVL_OK, 0},
    /* Bad geometry, checked before emptiness. */
    {2, 3, 2, 4, OVL_ERR_INVALID, 0},
    {1, 3, 2, 4, OVL_ERR_INVALID, 0},
    {0, 3, 2, 4, OVL_ERR_INVALID, 0},
    {2, U64MAX, U64MAX - 1, 1, OVL_ERR_INVALID, 0},
    {2, 3, 3, 0, OVL_ERR_INVALID, 0},
    {0, 0, 0, 0, OVL_ERR_INVALID, 0},
    /* (rows-1)*ld: the largest product that fits, and the first that does not. */
    {P32, P32 - 1, P32, 1, OVL_OK, U64MAX},
    {P32 + 1, 1, P32, 1, OVL_ERR_RANGE, 0},
    {3, 1, P63, 1, OVL_ERR_RANGE, 0},
    {U64MAX, 1, 2, 1, OVL_ERR_RANGE, 0},
    {U64MAX, U64MAX, U64MAX, 1, OVL_ERR_RANGE, 0},
    /* + cols: exactly UINT64_MAX fits, one more does not. */
    {2, 1, U64MAX - 1, 1, OVL_OK, U64MAX},
    {2, 1, U64MAX, 1, OVL_ERR_RANGE, 0},
    {2, 2, U64MAX - 1, 1, OVL_ERR_RANGE, 0},
    {1, U64MAX, U64MAX, 1, OVL_OK, U64MAX},
    /* * elem. */
    {1, P62, P62, 3, OVL_OK, 3 * P62},
    {1, P62, P62, 4, OVL_ERR_RANGE, 0},
    {2, 1, P63, 1, OVL_OK, P63 + 1},
    {2, 1, P63, 2, OVL_ERR_RANGE, 0},
    {1, U64MAX / 8, U64MAX / 8, 8, OVL_OK, (U64MAX / 8) * 8},
    {1, U64MAX / 8 + 1, U64MAX / 8 + 1, 8, OVL_ERR_RANGE, 0},
    {1, 1, 1, SIZE_MAX, OVL_OK, (uint64_t)SIZE_MAX},
    {1, 2, 2, SIZE_MAX, OVL_ERR_RANGE, 0},
};

static void test_matrix_extent(void **state)
{
    (void)state;
    for (size_t i = 0; i < NELEM(extent_cases); i++) {
        const struct extent_case *c = &extent_cases[i];
        uint64_t bytes = 0xdeadbeef;
        ovl_status_t st = ovl_matrix_extent(c->rows, c->cols, c->ld, c->elem, &bytes);
        if (st != c->st)
            fail_msg("case %zu (rows %llu cols %llu ld %llu elem %zu): status %d, want %d", i,
                     (unsigned long long)c->rows, (unsigned long long)c->cols,
                     (unsigned long long)c->ld, c->elem, st, c->st);
        if (st == OVL_OK && bytes != c->bytes)
            fail_msg("case %zu: %llu bytes, want %llu", i, (unsigned long long)bytes,
                     (unsigned long long)c->bytes);
        if (st != OVL_OK)
            assert_int_equal(bytes, 0xdeadbeef); /* untouched on failure */
    }
}

/* ---------------------------------------------------------- range checks */

struct range_case {
    uint64_t reg, offset, rows, cols, ld;
    size_t elem;
    ovl_status_t st;
};

static const struct range_case range_cases[] = {
    /* 10 x 25 fp32 = 1000 bytes in a 1000-byte registration. */
    {1000, 0, 10, 25, 25, 4, OVL_OK},
    {1000, 1, 10, 25, 25, 4, OVL_ERR_RANGE}, /* one past the end */
    {1000, 4, 10, 25, 25, 4, OVL_ERR_RANGE},
    {1001, 1, 10, 25, 25, 4, OVL_OK}, /* exactly at the end */
    {999, 0, 10, 25, 25, 4, OVL_ERR_RANGE},
    {1000, 996, 1, 1, 1, 4, OVL_OK},
    {1000, 997, 1, 1, 1, 4, OVL_ERR_RANGE},
    /* A strided sub-matrix: 3 x 2 of ld 10, fp16: (2*10+2)*2 = 44 bytes. */
    {100, 56, 3, 2, 10, 2, OVL_OK},
    {100, 57, 3, 2, 10, 2, OVL_ERR_RANGE},
    /* Empty matrices: anywhere up to and including the end, not beyond. */
    {1000, 1000, 0, 25, 25, 4, OVL_OK},
    {1000, 1000, 10, 0, 25, 4, OVL_OK},
    {1000, 1001, 0, 25, 25, 4, OVL_ERR_RANGE},
    {1000, U64MAX, 0, 25, 25, 4, OVL_ERR_RANGE},
    {0, 0, 0, 0, 0, 1, OVL_OK},
    {0, 0, 1, 1, 1, 1, OVL_ERR_RANGE},
    /* Offset beyond the registration. */
    {1000, 2000, 1, 1, 1, 1, OVL_ERR_RANGE},
    /* offset + extent overflows to a small number that would fit. */
    {1000, U64MAX, 1, 1, 1, 1, OVL_ERR_RANGE},
    {1000, U64MAX - 10, 1, 11, 11, 1, OVL_ERR_RANGE}, /* wraps to exactly 0 */
    {1000, U64MAX - 10, 1, 20, 20, 1, OVL_ERR_RANGE}, /* wraps to 8 */
    {U64MAX, U64MAX - 10, 1, 20, 20, 1, OVL_ERR_RANGE},
    {U64MAX, 1, 1, U64MAX - 1, U64MAX - 1, 1, OVL_OK}, /* end == UINT64_MAX */
    {U64MAX, 2, 1, U64MAX - 1, U64MAX - 1, 1, OVL_ERR_RANGE},
    {U64MAX, 0, 1, U64MAX, U64MAX, 1, OVL_OK},
    /* An extent that overflows by itself is a range error, not a wrap. */
    {1000, 0, P32 + 1, 1, P32, 1, OVL_ERR_RANGE},
    {1000, 0, 2, 1, U64MAX, 1, OVL_ERR_RANGE},
    {1000, 0, 1, P62, P62, 4, OVL_ERR_RANGE},
    {U64MAX, 0, 1, P62, P62, 4, OVL_ERR_RANGE},
    /* Bad geometry is reported as such, whatever the range. */
    {1000, 0, 2, 5, 4, 4, OVL_ERR_INVALID},
    {1000, 0, 2, 5, 5, 0, OVL_ERR_INVALID},
    {1000, U64MAX, 2, 5, 4, 4, OVL_ERR_INVALID},
};

static void test_range_check(void **state)
{
    (void)state;
    for (size_t i = 0; i < NELEM(range_cases); i++) {
        const struct range_case *c = &range_cases[i];
        ovl_status_t st = ovld_range_check(c->reg, c->offset, c->rows, c->cols, c->ld, c->elem);
        if (st != c->st)
            fail_msg("case %zu (reg %llu offset %llu rows %llu cols %llu ld %llu elem %zu): "
                     "status %d, want %d",
                     i, (unsigned long long)c->reg, (unsigned long long)c->offset,
                     (unsigned long long)c->rows, (unsigned long long)c->cols,
                     (unsigned long long)c->ld, c->elem, st, c->st);
    }
}

/* Exhaustive over small values against a 128-bit model: every geometry and
 * offset either fits (and then every byte it names is inside) or is refused. */
static void test_range_check_model(void **state)
{
    (void)state;
    const uint64_t reg = 64;
    for (uint64_t rows = 0; rows <= 5; rows++)
        for (uint64_t cols = 0; cols <= 5; cols++)
            for (uint64_t ld = 0; ld <= 7; ld++)
                for (size_t elem = 0; elem <= 4; elem++)
                    for (uint64_t off = 0; off <= reg + 2; off++) {
                        ovl_status_t st = ovld_range_check(reg, off, rows, cols, ld, elem);
                        ovl_status_t want;
                        if (elem == 0 || ld < cols) {
                            want = OVL_ERR_INVALID;
                        } else {
                            unsigned __int128 ext =
                                (rows == 0 || cols == 0)
                                    ? 0
                                    : ((unsigned __int128)(rows - 1) * ld + cols) * elem;
                            want = (unsigned __int128)off + ext <= reg ? OVL_OK : OVL_ERR_RANGE;
                        }
                        if (st != want)
                            fail_msg("reg %llu off %llu rows %llu cols %llu ld %llu elem %zu: "
                                     "%d, want %d",
                                     (unsigned long long)reg, (unsigned long long)off,
                                     (unsigned long long)rows, (unsigned long long)cols,
                                     (unsigned long long)ld, elem, st, want);
                    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_empty),
        cmocka_unit_test(test_add_find),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_foreach),
        cmocka_unit_test(test_mapped_bytes_large),
        cmocka_unit_test(test_matrix_extent),
        cmocka_unit_test(test_range_check),
        cmocka_unit_test(test_range_check_model),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}

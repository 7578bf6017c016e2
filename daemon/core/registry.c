/*
 * registry.c: see registry.h. A chained hash table keyed by id: ids are
 * sequential, so the low bits spread well.
 */
#include "registry.h"

#include <stdlib.h>

#include "matrix.h"

#define INITIAL_BUCKETS 64u

ovl_status_t ovld_registry_init(ovld_registry_t *r)
{
    r->buckets = calloc(INITIAL_BUCKETS, sizeof(*r->buckets));
    if (!r->buckets)
        return OVL_ERR_NOMEM;
    r->nbuckets = INITIAL_BUCKETS;
    r->count = 0;
    r->mapped_bytes = 0;
    r->next_id = 1;
    return OVL_OK;
}

void ovld_registry_fini(ovld_registry_t *r)
{
    free(r->buckets);
    r->buckets = NULL;
    r->nbuckets = 0;
}

static void grow(ovld_registry_t *r)
{
    size_t n = r->nbuckets * 2;
    ovld_reg_t **nb = calloc(n, sizeof(*nb));
    if (!nb)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < r->nbuckets; i++) {
        ovld_reg_t *e = r->buckets[i];
        while (e) {
            ovld_reg_t *next = e->next;
            e->next = nb[e->id & (n - 1)];
            nb[e->id & (n - 1)] = e;
            e = next;
        }
    }
    free(r->buckets);
    r->buckets = nb;
    r->nbuckets = n;
}

ovl_status_t ovld_registry_add(ovld_registry_t *r, ovld_reg_t *reg)
{
    if (r->count >= r->nbuckets)
        grow(r);
    reg->id = r->next_id++;
    reg->refs = 1;
    reg->registered = true;
    size_t b = reg->id & (r->nbuckets - 1);
    reg->next = r->buckets[b];
    r->buckets[b] = reg;
    r->count++;
    r->mapped_bytes += reg->bytes;
    return OVL_OK;
}

ovld_reg_t *ovld_registry_find(const ovld_registry_t *r, uint64_t id)
{
    if (!r->buckets)
        return NULL;
    for (ovld_reg_t *e = r->buckets[id & (r->nbuckets - 1)]; e; e = e->next)
        if (e->id == id)
            return e;
    return NULL;
}

void ovld_registry_remove(ovld_registry_t *r, ovld_reg_t *reg)
{
    ovld_reg_t **pp = &r->buckets[reg->id & (r->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if (*pp == reg) {
            *pp = reg->next;
            reg->next = NULL;
            reg->registered = false;
            r->count--;
            r->mapped_bytes -= reg->bytes;
            return;
        }
}

void ovld_registry_foreach(ovld_registry_t *r, void (*fn)(ovld_reg_t *reg, void *arg), void *arg)
{
    for (size_t i = 0; i < r->nbuckets; i++) {
        ovld_reg_t *e = r->buckets[i];
        while (e) {
            ovld_reg_t *next = e->next;
            fn(e, arg);
            e = next;
        }
    }
}

ovl_status_t ovld_range_check(uint64_t reg_bytes, uint64_t offset, uint64_t rows, uint64_t cols,
                              uint64_t ld, size_t elem)
{
    uint64_t extent, end;
    ovl_status_t st = ovl_matrix_extent(rows, cols, ld, elem, &extent);
    if (st != OVL_OK)
        return st;
    if (__builtin_add_overflow(offset, extent, &end) || end > reg_bytes || offset > reg_bytes)
        return OVL_ERR_RANGE;
    return OVL_OK;
}

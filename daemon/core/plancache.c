/*
 * plancache.c: see plancache.h. A few sets per job, so a list searched
 * from the most recently used is all it needs.
 */
#include "plancache.h"

#include <stdlib.h>
#include <string.h>

struct ovld_plancache {
    uint32_t cap, n;
    ovld_plans_t *head, *tail; /* most recently used first */
};

ovld_plancache_t *ovld_plancache_create(uint32_t cap)
{
    if (cap == 0)
        return NULL;
    ovld_plancache_t *pc = calloc(1, sizeof(*pc));
    if (pc)
        pc->cap = cap;
    return pc;
}

static void set_free(ovld_plans_t *s)
{
    for (uint32_t r = 0; r < s->world; r++)
        ovl_plan_free(&s->plans[r]);
    free(s->present);
    free(s);
}

void ovld_plans_put(ovld_plans_t *s)
{
    if (s && --s->refs == 0)
        set_free(s);
}

static void unlink_set(ovld_plancache_t *pc, ovld_plans_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        pc->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        pc->tail = s->prev;
    s->prev = s->next = NULL;
    pc->n--;
}

static void push_front(ovld_plancache_t *pc, ovld_plans_t *s)
{
    s->prev = NULL;
    s->next = pc->head;
    if (pc->head)
        pc->head->prev = s;
    else
        pc->tail = s;
    pc->head = s;
    pc->n++;
}

/* Drops the cache's reference to s. */
static void drop(ovld_plancache_t *pc, ovld_plans_t *s)
{
    unlink_set(pc, s);
    ovld_plans_put(s);
}

void ovld_plancache_destroy(ovld_plancache_t *pc)
{
    if (!pc)
        return;
    while (pc->head)
        drop(pc, pc->head);
    free(pc);
}

uint32_t ovld_plancache_size(const ovld_plancache_t *pc)
{
    return pc ? pc->n : 0;
}

static bool same_ranks(const ovld_plans_t *s, const void *const *present)
{
    for (uint32_t r = 0; r < s->world; r++)
        if (s->present[r] != (present[r] != NULL))
            return false;
    return true;
}

static ovl_status_t build(const ovl_plan_params_t *pp, const void *const *present,
                          ovld_plans_t **ret, uint32_t *ret_rank)
{
    ovld_plans_t *s = calloc(1, sizeof(*s) + (size_t)pp->world * sizeof(s->plans[0]));
    if (!s || !(s->present = calloc(pp->world, sizeof(*s->present)))) {
        free(s);
        return OVL_ERR_NOMEM;
    }
    s->refs = 1;
    s->world = pp->world;
    s->params = *pp;
    s->params.rank = 0;
    for (uint32_t r = 0; r < pp->world; r++) {
        if (!present[r])
            continue; /* another daemon's */
        ovl_plan_params_t p = *pp;
        p.rank = r;
        ovl_status_t st = ovl_plan_build(&p, &s->plans[r]);
        if (st != OVL_OK) {
            *ret_rank = r;
            set_free(s);
            return st;
        }
        s->present[r] = true;
    }
    *ret = s;
    return OVL_OK;
}

ovl_status_t ovld_plans_get(ovld_plancache_t *pc, const ovl_plan_params_t *pp,
                            const void *const *present, ovld_plans_t **ret, uint32_t *ret_rank)
{
    ovl_plan_params_t key = *pp;
    key.rank = 0;
    for (ovld_plans_t *s = pc ? pc->head : NULL; s; s = s->next)
        if (s->world == key.world && ovl_plan_params_equal(&s->params, &key) &&
            same_ranks(s, present)) {
            if (s != pc->head) {
                unlink_set(pc, s);
                push_front(pc, s);
            }
            s->refs++;
            *ret = s;
            return OVL_OK;
        }
    ovld_plans_t *s = NULL;
    ovl_status_t st = build(&key, present, &s, ret_rank);
    if (st != OVL_OK)
        return st;
    if (pc) {
        if (pc->n == pc->cap)
            drop(pc, pc->tail);
        s->refs++; /* the cache's */
        push_front(pc, s);
    }
    *ret = s;
    return OVL_OK;
}

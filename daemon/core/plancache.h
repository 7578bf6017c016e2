/*
 * plancache.h: a job's plans by their parameters. A plan is a pure
 * function of its parameters (plan.h), so an op with the parameters of an
 * earlier one takes that op's plans instead of planning every rank again
 * (at world 8, ring, 128^3: 70 us of the loop's time per op, measured on
 * one H100's host). The cache keeps `cap` sets, the least recently used
 * out first; a set taken by an op stays alive until the op lets it go,
 * whatever the cache does meanwhile. Loop thread only.
 */
#ifndef OVLD_PLANCACHE_H
#define OVLD_PLANCACHE_H

#include <stdint.h>

#include "ovl.h"
#include "plan.h"

typedef struct ovld_plancache ovld_plancache_t;

/* One op's plans: plans[r] for every rank r that was present (the others
 * zeroed). */
typedef struct ovld_plans {
    uint32_t refs;            /* the cache's (while on its list) and each op's */
    uint32_t world;           /* entries of plans and present */
    ovl_plan_params_t params; /* rank 0 */
    bool *present;
    struct ovld_plans *prev, *next; /* the cache's list, most recent first */
    ovl_plan_t plans[];
} ovld_plans_t;

/* A cache of at most cap sets (cap >= 1); NULL without memory. */
ovld_plancache_t *ovld_plancache_create(uint32_t cap);
/* Drops every set; those still taken by an op go at their last put.
 * Accepts NULL. */
void ovld_plancache_destroy(ovld_plancache_t *pc);

/*
 * The plans of pp (its rank ignored) for the ranks r of [0, pp->world)
 * with present[r] non-NULL, from the cache or built now (and cached), with
 * a reference for the caller (ovld_plans_put). pc NULL: built now, cached
 * nowhere. On a rank the planner refuses, its status, with the rank in
 * *ret_rank; OVL_ERR_NOMEM without memory.
 */
ovl_status_t ovld_plans_get(ovld_plancache_t *pc, const ovl_plan_params_t *pp,
                            const void *const *present, ovld_plans_t **ret, uint32_t *ret_rank);
/* Lets the set go (frees it when nothing holds it). Accepts NULL. */
void ovld_plans_put(ovld_plans_t *s);

/* Sets in the cache. */
uint32_t ovld_plancache_size(const ovld_plancache_t *pc);

#endif /* OVLD_PLANCACHE_H */

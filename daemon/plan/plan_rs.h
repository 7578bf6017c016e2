/*
 * plan_rs.h: GEMM + reduce-scatter's emitters (plan_rs.c), as the
 * planner's entry points (plan.c) call them for that kind: ovl_plan_build's
 * checks (words for a refusal; NULL: valid), its scratch, and its build.
 * Nothing outside daemon/plan/ sees it.
 */
#ifndef OVL_PLAN_RS_H
#define OVL_PLAN_RS_H

#include "plan.h"

const char *pb_rs_refusal(const ovl_plan_params_t *p); /* NULL: valid */
ovl_status_t pb_rs_scratch(const ovl_plan_params_t *p, uint64_t *ret);
ovl_status_t pb_rs_build(const ovl_plan_params_t *params, ovl_plan_t *ret_plan);
/* auto's algorithm for a job of world > 1, and its reason in words (*why):
 * the rule written from the measurements of docs/performance.md. */
ovl_algo_t pb_rs_choose(const ovl_plan_params_t *p, const char **why);

#endif /* OVL_PLAN_RS_H */

/*
 * request.h: the checks every request passes at the boundary, before any
 * handler sees it. Each integer is checked against its field's range before
 * anything narrows it (the wire carries 64 bits where ovld keeps 32: a
 * world of 2^32 + 2 must not pass as 2), each job id against its form
 * (1..OVLD_JOB_ID_MAX bytes of clean UTF-8, common/text.h: no NUL inside,
 * no control character). What depends on state (registrations, jobs,
 * quotas) is checked by the handlers.
 *
 * Pure: no connection, no state, no logging. tests/fuzz/fuzz_request.c
 * drives it behind the frame reader and the decoder, as ovld does.
 */
#ifndef OVLD_REQUEST_H
#define OVLD_REQUEST_H

#include <stddef.h>

#include "desc.h"
#include "ovl.h"
#include "ovl.pb-c.h"

/*
 * Checks q. OVL_OK, or a status with a message in err naming the field,
 * its value and its range:
 * - OVL_ERR_PROTOCOL: a request with no body or an unknown one, or one
 *   that puts the connection out of step (more descriptors announced than
 *   a request takes): the caller closes the connection;
 * - OVL_ERR_INVALID: a field outside its range or form.
 * An Op that fails here is still an op of its comm: the caller fails that
 * op (its doorbell rings with the error), the connection stays.
 */
ovl_status_t ovld_request_check(const Ovl__Request *q, char *err, size_t errlen);

/* The descriptors (desc.h) of a request, for the core. */
/* An op of an unknown kind reads as OVLD_KIND_NONE; after a refusal only
 * comm_id and seq mean anything (the rest saturates, never wraps). */
void ovld_request_op_desc(const Ovl__Op *q, ovld_op_desc_t *ret);
/* A Plan request's op (its kind, fields and the slots it gives, with no
 * buffer behind them), world and rank. q must have passed
 * ovld_request_check. */
void ovld_request_plan_desc(const Ovl__PlanRequest *q, ovld_op_desc_t *ret, uint32_t *world,
                            uint32_t *rank);
/* q must have passed ovld_request_check. */
void ovld_request_join_desc(const Ovl__CommInit *q, ovld_join_desc_t *ret);

#endif /* OVLD_REQUEST_H */

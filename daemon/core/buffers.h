/*
 * buffers.h: the whole life of a client buffer in ovld. A buffer is mapped
 * by the backend when its client registers it (MemRegister), lives in its
 * connection's table (registry.h) until deregistered or the connection
 * closes, and is held by every op that reads or writes it until the op is
 * done: the mapping goes only when the last holder lets go, so that a
 * buffer deregistered (or a client gone) mid-op is never unmapped under
 * the GPU.
 *
 * A deregistration that finds ops still holding the buffer waits: its
 * callback runs once only the connection's reference is left, from
 * ovld_buffers_run_idle, which the loop calls after the callbacks of a
 * round (a completion that lets a buffer go never runs a connection's
 * requests from inside itself).
 *
 * The boundary (server/dispatch.c) resolves the buffers an op names into views with
 * ovld_buf_resolve; jobs below only hold and put what they were given.
 * Loop thread only, except ovld_buf_unmap_now (a worker). Nothing logs.
 */
#ifndef OVLD_BUFFERS_H
#define OVLD_BUFFERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "desc.h" /* ovld_buf_use_t */
#include "registry.h"

typedef struct ovld_buffers {
    ovld_backend_t *backend;
    ovld_reg_t *idle; /* buffers whose deregistration may be answered now */
    /* Buffers unmapped so far (the memory generation): a graph captured
     * before an unmapping may name an address that maps other memory now
     * (replay.h). Bumped by whichever thread unmaps. */
    _Atomic uint64_t unmapped;
} ovld_buffers_t;

void ovld_buffers_init(ovld_buffers_t *bs, ovld_backend_t *backend);

/* The memory generation: changes whenever a buffer is unmapped. Any
 * thread. */
uint64_t ovld_buffers_generation(ovld_buffers_t *bs);

/* A buffer not yet mapped nor registered (refs 0), or NULL without memory.
 * Mapping it is the caller's (the backend's mem_import into ->bmem and
 * ->ptr, maybe on a worker); then ovld_buf_register, or ovld_buf_discard. */
ovld_reg_t *ovld_buf_new(ovld_buffers_t *bs);

/* Frees a buffer that never got registered, unmapping it if mapped. */
void ovld_buf_discard(ovld_reg_t *reg, bool mapped);

/* Adds a mapped buffer to a connection's table: the table holds the first
 * reference, and the buffer gets its id. */
ovl_status_t ovld_buf_register(ovld_registry_t *table, ovld_reg_t *reg);

/* Another reference (an op that will use it). */
void ovld_buf_hold(ovld_reg_t *reg);

/* Lets one reference go: with the last the buffer is unmapped and freed;
 * when only the table's is left and a deregistration waits, it is posted
 * for ovld_buffers_run_idle. Accepts NULL. */
void ovld_buf_put(ovld_reg_t *reg);

/* Whether ops still hold the buffer (more than the table's reference). */
bool ovld_buf_in_use(const ovld_reg_t *reg);

/* Takes the buffer out of its table and lets the table's reference go. */
void ovld_buf_unregister(ovld_registry_t *table, ovld_reg_t *reg);

/* Takes the buffer out of its table, which must hold the only reference,
 * for an unmapping that may block: the caller then runs ovld_buf_unmap_now
 * (on a worker thread, or in place). */
void ovld_buf_detach(ovld_registry_t *table, ovld_reg_t *reg);
/* Unmaps and frees a detached buffer; may block (may_block: the caller
 * wants the mapping gone on return, a client about to free its memory
 * waits for it). Any thread. */
void ovld_buf_unmap_now(ovld_reg_t *reg, bool may_block);

/* Calls fn(reg, arg) once the ops holding reg have let it go (from
 * ovld_buffers_run_idle). One waiter per buffer. */
void ovld_buf_when_idle(ovld_reg_t *reg, void (*fn)(ovld_reg_t *reg, void *arg), void *arg);
/* Whether a deregistration waits on reg. */
bool ovld_buf_has_waiter(const ovld_reg_t *reg);
/* Cancels the wait (its connection is gone) and returns its arg. */
void *ovld_buf_cancel_wait(ovld_reg_t *reg);

/* Runs the waits whose buffers went idle (the loop, after a round). */
void ovld_buffers_run_idle(ovld_buffers_t *bs);

/*
 * Resolves a matrix of rows x cols elements (elem bytes each) with leading
 * dimension ld at byte `offset` of buffer `mem_id` of table, for an op of a
 * comm on `device` (a buffer on another device is refused). On success
 * *ret holds a reference. Otherwise a status and a message naming `name`,
 * the buffer and what is wrong: OVL_ERR_NOT_FOUND (not registered),
 * OVL_ERR_INVALID (other device, ld < cols), OVL_ERR_RANGE (outside the
 * registration).
 */
ovl_status_t ovld_buf_resolve(const ovld_registry_t *table, const char *name, uint64_t mem_id,
                              uint64_t offset, uint64_t ld, uint64_t rows, uint64_t cols,
                              size_t elem, int device, ovld_buf_use_t *ret, char *msg,
                              size_t msglen);

/*
 * Resolves every buffer op q names (A, B, C, and a_out if given) against
 * table, for a rank of world ranks on device, with the shapes the op's m,
 * n, k and transb give them (q's fields passed the boundary's checks):
 * each one resolved holds a reference, in q->use. On a failure the
 * references taken are let go, and msg says which buffer and why (as
 * ovld_buf_resolve, or "m * world overflows", or "<name>: no buffer
 * given").
 */
ovl_status_t ovld_buf_resolve_op(const ovld_registry_t *table, uint32_t world, uint32_t device,
                                 ovld_op_desc_t *q, char *msg, size_t msglen);

#endif /* OVLD_BUFFERS_H */

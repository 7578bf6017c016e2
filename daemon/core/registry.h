/*
 * registry.h: the table of the buffers one connection registered, by id,
 * and the range check every op's matrices pass. Pure bookkeeping: the life
 * of a buffer (references, mapping, waits) is buffers.c's; nothing logs.
 */
#ifndef OVLD_REGISTRY_H
#define OVLD_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ovl.h"

typedef struct ovld_reg {
    uint64_t id;
    uint64_t bytes;
    uint64_t client_addr; /* for messages */
    void *ptr;            /* the daemon's mapping */
    void *bmem;           /* the backend's handle (ovld_bmem_t *) */
    int device;
    /* Its life (buffers.c): the table's reference while registered, one
     * per op that uses it; a deregistration that waits for those ops. */
    struct ovld_buffers *owner;
    uint32_t refs;
    bool registered; /* still in its connection's table */
    void (*on_idle)(struct ovld_reg *reg, void *arg);
    void *idle_arg;
    bool idle_posted;
    struct ovld_reg *idle_next;
    struct ovld_reg *next;
} ovld_reg_t;

typedef struct ovld_registry {
    ovld_reg_t **buckets;
    size_t nbuckets;
    size_t count;
    uint64_t mapped_bytes;
    uint64_t next_id;
} ovld_registry_t;

ovl_status_t ovld_registry_init(ovld_registry_t *r);
/* Frees the table only; the caller drops every registration first. */
void ovld_registry_fini(ovld_registry_t *r);

/* Adds reg (refs 1, registered) with a fresh id. */
ovl_status_t ovld_registry_add(ovld_registry_t *r, ovld_reg_t *reg);
ovld_reg_t *ovld_registry_find(const ovld_registry_t *r, uint64_t id);
/* Unlinks reg from the table (it stays alive while referenced). */
void ovld_registry_remove(ovld_registry_t *r, ovld_reg_t *reg);
/* Calls fn on every registration (fn may remove the one it is given). */
void ovld_registry_foreach(ovld_registry_t *r, void (*fn)(ovld_reg_t *reg, void *arg), void *arg);

/*
 * Checks (with ovl_matrix_extent, common/matrix.h) that the matrix at `offset` bytes into a
 * registration of `reg_bytes` lies inside it, overflow-safe. OVL_OK, OVL_ERR_INVALID (bad geometry)
 * or OVL_ERR_RANGE.
 */
ovl_status_t ovld_range_check(uint64_t reg_bytes, uint64_t offset, uint64_t rows, uint64_t cols,
                              uint64_t ld, size_t elem);

#endif /* OVLD_REGISTRY_H */

/*
 * buffers.c: see buffers.h.
 */
#include "buffers.h"
#include "kind.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

void ovld_buffers_init(ovld_buffers_t *bs, ovld_backend_t *backend)
{
    bs->backend = backend;
    bs->idle = NULL;
    atomic_init(&bs->unmapped, 0);
}

uint64_t ovld_buffers_generation(ovld_buffers_t *bs)
{
    return atomic_load_explicit(&bs->unmapped, memory_order_acquire);
}

ovld_reg_t *ovld_buf_new(ovld_buffers_t *bs)
{
    ovld_reg_t *reg = calloc(1, sizeof(*reg));
    if (reg)
        reg->owner = bs;
    return reg;
}

static void unmap_free(ovld_reg_t *reg, bool may_block)
{
    ovld_backend_t *b = reg->owner->backend;
    b->ops->mem_release(b, reg->bmem, may_block);
    atomic_fetch_add_explicit(&reg->owner->unmapped, 1, memory_order_release);
    free(reg);
}

void ovld_buf_discard(ovld_reg_t *reg, bool mapped)
{
    if (mapped)
        unmap_free(reg, false);
    else
        free(reg);
}

ovl_status_t ovld_buf_register(ovld_registry_t *table, ovld_reg_t *reg)
{
    return ovld_registry_add(table, reg); /* refs = 1: the table's */
}

void ovld_buf_hold(ovld_reg_t *reg)
{
    reg->refs++;
}

void ovld_buf_put(ovld_reg_t *reg)
{
    if (!reg)
        return;
    if (--reg->refs == 1 && reg->on_idle && !reg->idle_posted) {
        /* Its deregistration can be answered now: by the loop, after the
         * completion that let it go has returned, never from inside it. */
        ovld_buffers_t *bs = reg->owner;
        reg->idle_posted = true;
        reg->idle_next = bs->idle;
        bs->idle = reg;
        return;
    }
    if (reg->refs == 0)
        unmap_free(reg, false);
}

bool ovld_buf_in_use(const ovld_reg_t *reg)
{
    return reg->refs > 1;
}

void ovld_buf_unregister(ovld_registry_t *table, ovld_reg_t *reg)
{
    ovld_registry_remove(table, reg);
    ovld_buf_put(reg);
}

void ovld_buf_detach(ovld_registry_t *table, ovld_reg_t *reg)
{
    ovld_registry_remove(table, reg);
}

void ovld_buf_unmap_now(ovld_reg_t *reg, bool may_block)
{
    unmap_free(reg, may_block);
}

void ovld_buf_when_idle(ovld_reg_t *reg, void (*fn)(ovld_reg_t *reg, void *arg), void *arg)
{
    reg->on_idle = fn;
    reg->idle_arg = arg;
}

bool ovld_buf_has_waiter(const ovld_reg_t *reg)
{
    return reg->on_idle != NULL;
}

void *ovld_buf_cancel_wait(ovld_reg_t *reg)
{
    if (reg->idle_posted) {
        for (ovld_reg_t **pp = &reg->owner->idle; *pp; pp = &(*pp)->idle_next)
            if (*pp == reg) {
                *pp = reg->idle_next;
                break;
            }
    }
    void *arg = reg->idle_arg;
    reg->idle_posted = false;
    reg->idle_next = NULL;
    reg->on_idle = NULL;
    reg->idle_arg = NULL;
    return arg;
}

void ovld_buffers_run_idle(ovld_buffers_t *bs)
{
    ovld_reg_t *reg;
    while ((reg = bs->idle) != NULL) {
        bs->idle = reg->idle_next;
        reg->idle_posted = false;
        reg->idle_next = NULL;
        void (*fn)(ovld_reg_t *, void *) = reg->on_idle;
        void *arg = reg->idle_arg;
        reg->on_idle = NULL;
        reg->idle_arg = NULL;
        fn(reg, arg);
    }
}

ovl_status_t ovld_buf_resolve(const ovld_registry_t *table, const char *name, uint64_t mem_id,
                              uint64_t offset, uint64_t ld, uint64_t rows, uint64_t cols,
                              size_t elem, int device, ovld_buf_use_t *ret, char *msg,
                              size_t msglen)
{
    ovld_reg_t *reg = ovld_registry_find(table, mem_id);
    if (!reg) {
        snprintf(msg, msglen, "%s: buffer %" PRIu64 " is not registered on this connection", name,
                 mem_id);
        return OVL_ERR_NOT_FOUND;
    }
    if (reg->device >= 0 && reg->device != device) {
        snprintf(msg, msglen, "%s: buffer %" PRIu64 " is on device %d, the comm on device %d", name,
                 mem_id, reg->device, device);
        return OVL_ERR_INVALID;
    }
    ovl_status_t st = ovld_range_check(reg->bytes, offset, rows, cols, ld, elem);
    if (st == OVL_ERR_INVALID) {
        snprintf(msg, msglen,
                 "%s: leading dimension %" PRIu64 " is less than its %" PRIu64 " columns", name, ld,
                 cols);
        return st;
    }
    if (st != OVL_OK) {
        snprintf(msg, msglen,
                 "%s: %" PRIu64 " x %" PRIu64 " (ld %" PRIu64 ") at offset %" PRIu64
                 " lies outside its registration of %" PRIu64 " bytes",
                 name, rows, cols, ld, offset, reg->bytes);
        return st;
    }
    ovld_buf_hold(reg);
    *ret = (ovld_buf_use_t){.hold = reg,
                            .view = {.ptr = (char *)reg->ptr + offset, .ld = ld},
                            .rows = rows,
                            .cols = cols};
    return OVL_OK;
}

ovl_status_t ovld_buf_resolve_op(const ovld_registry_t *table, uint32_t world, uint32_t device,
                                 ovld_op_desc_t *q, char *msg, size_t len)
{
    /* the kind and its fields passed the boundary (request.h); what is
     * left depends on the job and the registrations */
    ovld_buf_shape_t shape[OVLD_BUF_COUNT];
    ovl_status_t st;
    const ovld_kind_t *kind = ovld_kind_shapes(q, world, shape, &st, msg, len);
    if (!kind)
        return st;
    for (int b = 0; b < OVLD_BUF_COUNT && st == OVL_OK; b++) {
        const ovld_buf_ref_t *ref = &q->buf[b];
        if (!shape[b].required && !shape[b].optional)
            continue; /* not the op's (a B or C past its nb) */
        if (!ref->given) {
            if (shape[b].optional)
                continue; /* the plans do without it */
            snprintf(msg, len, "%s: no buffer given", kind->buf_name(b));
            st = OVL_ERR_INVALID;
            break;
        }
        if (shape[b].dense && ref->ld != shape[b].cols) {
            snprintf(msg, len,
                     "%s: leading dimension %" PRIu64 ": a vector of scales or a bias is dense "
                     "(ld %" PRIu64 ")",
                     kind->buf_name(b), ref->ld, shape[b].cols);
            st = OVL_ERR_INVALID;
            break;
        }
        st = ovld_buf_resolve(table, kind->buf_name(b), ref->mem_id, ref->offset, ref->ld,
                              shape[b].rows, shape[b].cols, shape[b].elem, (int)device, &q->use[b],
                              msg, len);
    }
    if (st != OVL_OK)
        for (int b = 0; b < OVLD_BUF_COUNT; b++) {
            ovld_buf_put(q->use[b].hold);
            q->use[b] = (ovld_buf_use_t){0};
        }
    return st;
}

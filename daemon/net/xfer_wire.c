/*
 * xfer_wire.c: see xfer_wire.h.
 */
#include "xfer_wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errf.h"
#include "text.h"
#include "wire.h"
#include "xfer.h" /* OVLD_XFER_RKEY_MAX */
#include "xfer.pb-c.h"

const char *ovld_xfer_type_name(uint32_t type, char *buf, size_t len)
{
    switch (type) {
    case OVLD_XFER_ROWS_READY:
        return "RowsReady";
    case OVLD_XFER_ROWS_TAKEN:
        return "RowsTaken";
    case OVLD_XFER_ROWS_WITHDRAWN:
        return "RowsWithdrawn";
    }
    snprintf(buf, len, "message type %" PRIu32, type);
    return buf;
}

void ovld_xfer_msg_clear(ovld_xfer_msg_t *m)
{
    free(m->rkey);
    m->rkey = NULL;
    m->rkey_len = 0;
}

/* A value of at most 32 bits. */
static ovl_status_t take_u32(uint64_t v, uint32_t *out, const char *msg, const char *field,
                             char *err, size_t errlen)
{
    if (v > UINT32_MAX)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: %s %" PRIu64 " (32 bits)", msg, field, v);
    *out = (uint32_t)v;
    return OVL_OK;
}

static ovl_status_t take_transfer(const Ovlxfer__Transfer *t, ovld_xfer_msg_t *ret, const char *msg,
                                  char *err, size_t errlen)
{
    ovl_status_t st;
    if (!t)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: %s: no transfer named",
                        msg);
    if (t->job.len != OVLD_JOB_NONCE_LEN)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: a job key of %zu bytes, not %d", msg, t->job.len,
                        OVLD_JOB_NONCE_LEN);
    memcpy(ret->job, t->job.data, OVLD_JOB_NONCE_LEN);
    ret->seq = t->seq;
    if ((st = take_u32(t->index, &ret->index, msg, "index", err, errlen)) != OVL_OK ||
        (st = take_u32(t->from, &ret->from, msg, "rank from", err, errlen)) != OVL_OK)
        return st;
    return take_u32(t->to, &ret->to, msg, "rank to", err, errlen);
}

/* A status and its reason: a status this ovld does not know still fails,
 * as a protocol error, with the sender's words. */
static ovl_status_t take_status(int64_t status, const ProtobufCBinaryData *reason,
                                ovld_xfer_msg_t *ret, const char *msg, char *err, size_t errlen)
{
    ret->status =
        status <= 0 && status >= OVL_ERR_INTERNAL ? (ovl_status_t)status : OVL_ERR_PROTOCOL;
    if (reason->len > OVLD_XFER_REASON_MAX)
        return ovl_errf(OVL_ERR_LIMIT, err, errlen,
                        "%s: a reason of %zu bytes, over the limit of %d (OVLD_XFER_REASON_MAX)",
                        msg, reason->len, OVLD_XFER_REASON_MAX);
    ovl_text_sanitize(ret->reason, sizeof(ret->reason), reason->data, reason->len);
    return OVL_OK;
}

static ovl_status_t take_ready(const Ovlxfer__RowsReady *m, ovld_xfer_msg_t *ret, const char *msg,
                               char *err, size_t errlen)
{
    ovl_status_t st = take_transfer(m->xfer, ret, msg, err, errlen);
    if (st != OVL_OK)
        return st;
    if (m->bytes == 0)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: %s: 0 bytes", msg);
    if (m->bytes > OVLD_XFER_MAX_BYTES)
        return ovl_errf(OVL_ERR_LIMIT, err, errlen,
                        "%s: %" PRIu64 " bytes, over the limit of %llu (OVLD_XFER_MAX_BYTES)", msg,
                        m->bytes, (unsigned long long)OVLD_XFER_MAX_BYTES);
    if (m->addr > UINT64_MAX - m->bytes)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: %" PRIu64 " bytes at 0x%" PRIx64 " wrap around", msg,
                        m->bytes, m->addr);
    if (m->rkey.len == 0 || m->rkey.len > OVLD_XFER_RKEY_MAX)
        return ovl_errf(OVL_ERR_LIMIT, err, errlen,
                        "%s: a memory key of %zu bytes (1 to %u, OVLD_XFER_RKEY_MAX)", msg,
                        m->rkey.len, OVLD_XFER_RKEY_MAX);
    if (!(ret->rkey = malloc(m->rkey.len)))
        return ovl_errf(OVL_ERR_NOMEM, err, errlen, "out of memory");
    memcpy(ret->rkey, m->rkey.data, m->rkey.len);
    ret->rkey_len = m->rkey.len;
    ret->addr = m->addr;
    ret->bytes = m->bytes;
    return OVL_OK;
}

ovl_status_t ovld_xfer_decode(uint32_t type, const void *body, size_t len, ovld_xfer_msg_t *ret,
                              char *err, size_t errlen)
{
    memset(ret, 0, sizeof(*ret));
    char tb[32];
    const char *name = ovld_xfer_type_name(type, tb, sizeof(tb));
    const uint8_t *b = body;
    ovl_status_t st = OVL_OK;
    ret->type = type;
    switch (type) {
    case OVLD_XFER_ROWS_READY: {
        Ovlxfer__RowsReady *m = ovlxfer__rows_ready__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed %s", name);
        st = take_ready(m, ret, name, err, errlen);
        ovlxfer__rows_ready__free_unpacked(m, NULL);
        break;
    }
    case OVLD_XFER_ROWS_TAKEN:
    case OVLD_XFER_ROWS_WITHDRAWN: {
        Ovlxfer__RowsStatus *m = ovlxfer__rows_status__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed %s", name);
        if ((st = take_transfer(m->xfer, ret, name, err, errlen)) == OVL_OK &&
            (st = take_status(m->status, &m->reason, ret, name, err, errlen)) == OVL_OK &&
            type == OVLD_XFER_ROWS_WITHDRAWN && ret->status == OVL_OK)
            st = ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a %s of status 0", name);
        ovlxfer__rows_status__free_unpacked(m, NULL);
        break;
    }
    default:
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a %s, not one of rows",
                        name);
    }
    if (st != OVL_OK)
        ovld_xfer_msg_clear(ret);
    return st;
}

ovl_status_t ovld_xfer_encode(const ovld_xfer_msg_t *m, uint8_t **ret_body, size_t *ret_len)
{
    Ovlxfer__Transfer t = OVLXFER__TRANSFER__INIT;
    t.job = (ProtobufCBinaryData){OVLD_JOB_NONCE_LEN, (uint8_t *)m->job};
    t.seq = m->seq;
    t.index = m->index;
    t.from = m->from;
    t.to = m->to;
    ProtobufCBinaryData reason = {strnlen(m->reason, sizeof(m->reason)), (uint8_t *)m->reason};
    *ret_body = NULL;
    *ret_len = 0;
    if (reason.len > OVLD_XFER_REASON_MAX || m->rkey_len > OVLD_XFER_RKEY_MAX)
        return OVL_ERR_INVALID;
    switch (m->type) {
    case OVLD_XFER_ROWS_READY: {
        Ovlxfer__RowsReady r = OVLXFER__ROWS_READY__INIT;
        r.xfer = &t;
        r.addr = m->addr;
        r.bytes = m->bytes;
        r.rkey = (ProtobufCBinaryData){m->rkey_len, m->rkey};
        return ovl_wire_pack(&r.base, ret_body, ret_len);
    }
    case OVLD_XFER_ROWS_TAKEN:
    case OVLD_XFER_ROWS_WITHDRAWN: {
        Ovlxfer__RowsStatus r = OVLXFER__ROWS_STATUS__INIT;
        r.xfer = &t;
        r.status = m->status;
        r.reason = reason;
        return ovl_wire_pack(&r.base, ret_body, ret_len);
    }
    }
    return OVL_ERR_INVALID;
}

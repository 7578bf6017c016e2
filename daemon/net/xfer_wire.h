/*
 * xfer_wire.h: the messages of the host backend's rows between nodes
 * (proto/xfer.proto, xfer.h), as bytes: the checks every message passes
 * before xfer.c acts on it, and the encoder. Pure code: no UCX, no state,
 * no logging. What the decoder cannot know (the job, whether a rank is in
 * its world, which node serves it) xfer.c checks.
 */
#ifndef OVLD_XFER_WIRE_H
#define OVLD_XFER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "jobid.h" /* OVLD_JOB_NONCE_LEN */
#include "ovl.h"

/* The message types (xfer.h: OVLD_XFER_TYPE_FIRST to _LAST are this
 * module's; the rest of that range is refused). */
#define OVLD_XFER_ROWS_READY     32
#define OVLD_XFER_ROWS_TAKEN     33
#define OVLD_XFER_ROWS_WITHDRAWN 34

#define OVLD_XFER_MAX_BYTES  (1ull << 40) /* of one transfer: far past any shard */
#define OVLD_XFER_REASON_MAX 200          /* bytes of a RowsTaken's or RowsWithdrawn's reason */

/* One message, decoded. */
typedef struct ovld_xfer_msg {
    uint32_t type;
    uint8_t job[OVLD_JOB_NONCE_LEN];
    uint64_t seq;
    uint32_t index, from, to;
    /* RowsReady: the rows in the sender's daemon and their key (malloc'd:
     * ovld_xfer_msg_clear frees it) */
    uint64_t addr, bytes;
    uint8_t *rkey;
    size_t rkey_len;
    /* RowsTaken (OVL_OK: read), RowsWithdrawn (an error): status an
     * ovl_status_t (OVL_ERR_PROTOCOL where the sender's is not one),
     * reason clean text (common/text.h), maybe "" */
    ovl_status_t status;
    char reason[OVLD_XFER_REASON_MAX + 1];
} ovld_xfer_msg_t;

/* The type's name for messages ("RowsReady", ..., "message type 40");
 * buf holds what is not a constant. */
const char *ovld_xfer_type_name(uint32_t type, char *buf, size_t len);

/* Frees what a decoded message holds (its key); m may be zeroed. */
void ovld_xfer_msg_clear(ovld_xfer_msg_t *m);

/*
 * Decodes the body of a message of type. OVL_OK and *ret filled
 * (ovld_xfer_msg_clear it), or with err saying what:
 * - OVL_ERR_PROTOCOL: a type not of this module, a body that does not
 *   unpack or has no Transfer, a job key not of 16 bytes, an index or rank
 *   past 32 bits, a RowsReady of 0 bytes or whose range wraps around, a
 *   RowsWithdrawn of status 0;
 * - OVL_ERR_LIMIT: a RowsReady of more than OVLD_XFER_MAX_BYTES, a key of
 *   none or over OVLD_XFER_RKEY_MAX bytes (xfer.h), a reason over
 *   OVLD_XFER_REASON_MAX.
 * Unknown protobuf fields are ignored (a later version may add some).
 */
ovl_status_t ovld_xfer_decode(uint32_t type, const void *body, size_t len, ovld_xfer_msg_t *ret,
                              char *err, size_t errlen);

/*
 * Packs m's body (m->type one of the three; its fields as the decoder
 * returns them) into a malloc'd buffer of *ret_len bytes. OVL_ERR_NOMEM,
 * or OVL_ERR_INVALID for another type, a key or a reason too long.
 */
ovl_status_t ovld_xfer_encode(const ovld_xfer_msg_t *m, uint8_t **ret_body, size_t *ret_len);

#endif /* OVLD_XFER_WIRE_H */

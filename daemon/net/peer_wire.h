/*
 * peer_wire.h: the messages between the ovld of different nodes, as bytes
 * (proto/peer.proto): the handshake's frames on TCP, the header of a UCX
 * active message, the checks every message passes before the transport
 * (peer.c) acts on it, and the encoder. Pure code: no UCX, no sockets, no
 * state, no logging; tests/fuzz/fuzz_peer.c drives the checks and the
 * decoder with any bytes.
 */
#ifndef OVLD_PEER_WIRE_H
#define OVLD_PEER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "config.h" /* OVLD_ADDR_TEXT_MAX */
#include "ovl.h"
#include "peer_auth.h"

#define OVLD_PEER_VERSION      2            /* of this protocol; Hello and Challenge carry it */
#define OVLD_PEER_AM_ID        7            /* the one UCX active message id ovld uses */
#define OVLD_PEER_FRAME_HDR    8            /* a handshake frame's header: type, length */
#define OVLD_PEER_AM_HDR       24           /* an AM's header: type, length, session id */
#define OVLD_PEER_MAX_FRAME    (64u << 10)  /* bytes of a handshake frame's body */
#define OVLD_PEER_MAX_BODY     (256u << 10) /* bytes of a message's body over UCX */
#define OVLD_PEER_UCX_ADDR_MAX (32u << 10)  /* bytes of a UCX worker address */
#define OVLD_PEER_REASON_MAX   200          /* bytes of a Refuse's or a Bye's reason */
#define OVLD_PEER_TYPE_USER    16           /* types from here on are not the transport's */

/* The transport's own messages (types below OVLD_PEER_TYPE_USER). */
typedef enum ovld_peer_type {
    OVLD_PEER_HELLO = 1,     /* handshake, on TCP */
    OVLD_PEER_CHALLENGE = 2, /* handshake, on TCP */
    OVLD_PEER_AUTH = 3,      /* handshake, on TCP */
    OVLD_PEER_REFUSE = 4,    /* handshake, on TCP */
    OVLD_PEER_PING = 5,      /* on UCX */
    OVLD_PEER_PONG = 6,      /* on UCX */
    OVLD_PEER_BYE = 7,       /* on UCX */
} ovld_peer_type_t;

/* The type's name for messages ("Hello", ..., "message type 42"); buf
 * holds what is not a constant. */
const char *ovld_peer_type_name(uint32_t type, char *buf, size_t len);

/* One message, decoded. For a type from OVLD_PEER_TYPE_USER on only type,
 * body and len are set: the body is what the sender gave, unchecked. */
typedef struct ovld_peer_msg {
    uint32_t type;
    const uint8_t *body; /* the bytes given to the decoder; not copied */
    size_t len;
    /* Hello, Challenge */
    uint8_t nonce[OVLD_PEER_NONCE_LEN];
    uint8_t instance[OVLD_PEER_INSTANCE_LEN];
    char address[OVLD_ADDR_TEXT_MAX]; /* canonical: ovld_peer_addr_format's */
    uint8_t *ucx_addr;                /* malloc'd (ovld_peer_msg_clear frees it) */
    size_t ucx_len;
    /* Challenge, Auth */
    uint8_t mac[OVLD_PEER_MAC_LEN];
    /* Ping, Pong */
    uint64_t seq;
    /* Refuse, Bye: status an ovl_status_t (OVL_ERR_PROTOCOL where the
     * sender's is not one), reason clean text (common/text.h), maybe "" */
    ovl_status_t status;
    char reason[OVLD_PEER_REASON_MAX + 1];
} ovld_peer_msg_t;

/* Frees what a decoded message holds (its UCX address); m may be zeroed. */
void ovld_peer_msg_clear(ovld_peer_msg_t *m);

/* Writes a handshake frame's header. */
void ovld_peer_frame_header(uint8_t hdr[OVLD_PEER_FRAME_HDR], uint32_t type, uint32_t len);

/*
 * Checks a handshake frame's header, before its body is read: *ret_type
 * and *ret_len, or OVL_ERR_PROTOCOL for a type that is not one of the
 * handshake's (1 to 4), OVL_ERR_LIMIT for a length over
 * OVLD_PEER_MAX_FRAME (err names it).
 */
ovl_status_t ovld_peer_frame_check(const uint8_t hdr[OVLD_PEER_FRAME_HDR], uint32_t *ret_type,
                                   uint32_t *ret_len, char *err, size_t errlen);

/* Writes an active message's header. */
void ovld_peer_am_header(uint8_t hdr[OVLD_PEER_AM_HDR], uint32_t type, uint32_t len,
                         const uint8_t session[OVLD_PEER_SESSION_LEN]);

/*
 * Checks an active message's header (hdr_len bytes) against its payload
 * of len bytes: *ret_type and ret_session, or OVL_ERR_PROTOCOL for a
 * header not of 24 bytes (ret_session then untouched), a length in it that
 * is not the payload's, a type that does not travel over UCX (0 to 4, 8 to
 * 15); OVL_ERR_LIMIT for a body over OVLD_PEER_MAX_BODY. ret_session is
 * set whenever the header is 24 bytes, so that a bad message can be
 * charged to its session.
 */
ovl_status_t ovld_peer_am_check(const void *hdr, size_t hdr_len, size_t len, uint32_t *ret_type,
                                uint8_t ret_session[OVLD_PEER_SESSION_LEN], char *err,
                                size_t errlen);

/*
 * Decodes the body of a message of type (1 to 7; from 16 on, only type,
 * body and len are set). OVL_OK and *ret filled (ovld_peer_msg_clear it),
 * or with err saying what:
 * - OVL_ERR_PROTOCOL: type 0 or 8 to 15, a body that does not unpack, a
 *   field of the wrong size (nonce 32 bytes, instance 16, MAC 32), an
 *   address that is not a numeric ADDRESS:PORT other than the wildcard, an
 *   empty UCX address;
 * - OVL_ERR_LIMIT: a reason over OVLD_PEER_REASON_MAX bytes, a UCX address
 *   over OVLD_PEER_UCX_ADDR_MAX;
 * - OVL_ERR_VERSION: a Hello or Challenge of another version (the message
 *   names both).
 * Unknown protobuf fields are ignored (a later version may add some).
 */
ovl_status_t ovld_peer_decode(uint32_t type, const void *body, size_t len, ovld_peer_msg_t *ret,
                              char *err, size_t errlen);

/*
 * Packs m's body (m->type 1 to 7; its fields as the decoder returns them)
 * into a malloc'd buffer of *ret_len bytes (NULL for an empty body).
 * OVL_ERR_NOMEM, or OVL_ERR_INVALID for another type, a reason or a UCX
 * address too long.
 */
ovl_status_t ovld_peer_encode(const ovld_peer_msg_t *m, uint8_t **ret_body, size_t *ret_len);

/* "A.B.C.D:PORT" or "[IPV6]:PORT" of a, the form peers are named by; "?"
 * for another family. */
void ovld_peer_addr_format(const struct sockaddr_storage *a, char *buf, size_t len);

/*
 * Parses text as an address a peer may be known by: numeric ADDRESS:PORT
 * (ovld_config_addr_parse), not the wildcard; *ret_ss and ret_name (its
 * canonical text, OVLD_ADDR_TEXT_MAX bytes) filled. OVL_ERR_INVALID with
 * words otherwise.
 */
ovl_status_t ovld_peer_addr_parse(const char *text, struct sockaddr_storage *ret_ss,
                                  char ret_name[OVLD_ADDR_TEXT_MAX], char *err, size_t errlen);

#endif /* OVLD_PEER_WIRE_H */

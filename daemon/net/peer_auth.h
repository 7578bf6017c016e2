/*
 * peer_auth.h: what ovld proves to another ovld with, and how: the cluster
 * key (peer_key_file) and the two MACs of the handshake (docs/multinode.md,
 * "The handshake"). Pure code: no logging, no state; the key is the
 * caller's.
 */
#ifndef OVLD_PEER_AUTH_H
#define OVLD_PEER_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include "ovl.h"

#define OVLD_PEER_KEY_MIN      32   /* bytes of key, whitespace at the end trimmed */
#define OVLD_PEER_KEY_MAX      4096 /* bytes of key */
#define OVLD_PEER_KEY_FILE_MAX 8192 /* bytes of file, trailing whitespace included */
#define OVLD_PEER_NONCE_LEN    32
#define OVLD_PEER_INSTANCE_LEN 16
#define OVLD_PEER_MAC_LEN      crypto_auth_hmacsha256_BYTES /* 32 */
#define OVLD_PEER_SESSION_LEN  16

typedef struct ovld_peer_key {
    uint8_t bytes[OVLD_PEER_KEY_MAX];
    size_t len;
} ovld_peer_key_t;

/*
 * Reads the cluster key from path into *ret: the whole content of the
 * file, whitespace at its end trimmed (a key written by `base64 > FILE`
 * ends with a newline), 32 bytes to 4 KiB. The file must be a regular file
 * (a symbolic link to one is followed), owned by ovld's effective uid, with
 * no permission bit for group or others; its mode and owner are taken from
 * the open file (fstat), so that they are those of the bytes read.
 * OVL_ERR_CONFIG with err saying what was found and what is needed
 * ("... has mode 0644: group and others must have no access (chmod 600
 * ...)"); OVL_ERR_SYSTEM when it cannot be read. *ret is wiped on failure.
 */
ovl_status_t ovld_peer_key_load(const char *path, ovld_peer_key_t *ret, char *err, size_t errlen);

/* Which side's proof: the labels differ so that neither proof can be sent
 * back as the other. */
typedef enum ovld_peer_role {
    OVLD_PEER_ACCEPTOR = 0, /* the side that listened: its proof comes first */
    OVLD_PEER_CONNECTOR = 1,
} ovld_peer_role_t;

/* What both proofs cover: both nonces, both instances, both advertised
 * addresses ("ADDRESS:PORT", at most 255 bytes each) and both UCX worker
 * addresses (where the session's messages will go). */
typedef struct ovld_peer_transcript {
    const uint8_t *nonce_c, *nonce_s; /* OVLD_PEER_NONCE_LEN each */
    const uint8_t *inst_c, *inst_s;   /* OVLD_PEER_INSTANCE_LEN each */
    const char *addr_c, *addr_s;      /* NUL-terminated */
    const uint8_t *ucx_c, *ucx_s;
    size_t ucx_c_len, ucx_s_len;
} ovld_peer_transcript_t;

/*
 * The proof of role over t with key: HMAC-SHA256(key, label || 0x00 ||
 * nonce_c || nonce_s || inst_c || inst_s || len8(addr_c) || addr_c ||
 * len8(addr_s) || addr_s || len32(ucx_c) || ucx_c || len32(ucx_s) ||
 * ucx_s), len8 one byte, len32 four bytes big-endian; label
 * "ovl-peer-v1 acceptor" or "ovl-peer-v1 connector".
 */
void ovld_peer_mac(const ovld_peer_key_t *key, ovld_peer_role_t role,
                   const ovld_peer_transcript_t *t, uint8_t out[OVLD_PEER_MAC_LEN]);

/*
 * The session id both sides derive once the handshake is done: the first
 * 16 bytes of the same HMAC with the label "ovl-peer-v1 session". It goes
 * in every message's header over UCX, which is how a message is charged to
 * its session: one that does not know the key cannot make one up.
 */
void ovld_peer_session(const ovld_peer_key_t *key, const ovld_peer_transcript_t *t,
                       uint8_t out[OVLD_PEER_SESSION_LEN]);

#endif /* OVLD_PEER_AUTH_H */

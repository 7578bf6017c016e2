/*
 * sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written here
 * so that the daemons' authentication (daemon/peer_wire.h) needs no crypto
 * library, and a constant-time comparison for MACs.
 *
 * Pure code: no allocation, no globals, any thread (each context is the
 * caller's).
 */
#ifndef OVL_SHA256_H
#define OVL_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OVL_SHA256_LEN   32 /* bytes of a digest */
#define OVL_SHA256_BLOCK 64 /* bytes of a block (HMAC's key size) */

typedef struct ovl_sha256 {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    uint8_t buf[OVL_SHA256_BLOCK];
    size_t nbuf; /* bytes waiting in buf, < 64 */
} ovl_sha256_t;

void ovl_sha256_init(ovl_sha256_t *c);
void ovl_sha256_update(ovl_sha256_t *c, const void *data, size_t len);
/* Writes the digest; c must be initialized again before reuse. */
void ovl_sha256_final(ovl_sha256_t *c, uint8_t out[OVL_SHA256_LEN]);
/* One call: the digest of len bytes. */
void ovl_sha256(const void *data, size_t len, uint8_t out[OVL_SHA256_LEN]);

/* HMAC-SHA256 over several pieces, fed in order (a message assembled
 * without copying): key of any length (longer than a block is hashed
 * first, as RFC 2104 says). */
typedef struct ovl_hmac_sha256 {
    ovl_sha256_t inner, outer;
} ovl_hmac_sha256_t;

void ovl_hmac_sha256_init(ovl_hmac_sha256_t *c, const void *key, size_t keylen);
void ovl_hmac_sha256_update(ovl_hmac_sha256_t *c, const void *data, size_t len);
void ovl_hmac_sha256_final(ovl_hmac_sha256_t *c, uint8_t out[OVL_SHA256_LEN]);

/* The MAC of one message. */
void ovl_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                     uint8_t out[OVL_SHA256_LEN]);

/* Whether a and b hold the same n bytes, in a time that depends on n only
 * (not on where they differ): for comparing MACs. */
bool ovl_ct_equal(const void *a, const void *b, size_t n);

/* Overwrites n bytes with zeros in a way the compiler keeps (keys,
 * intermediate states). */
void ovl_wipe(void *p, size_t n);

#endif /* OVL_SHA256_H */

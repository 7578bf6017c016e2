/*
 * peer_auth.c: see peer_auth.h. The MAC is libsodium's HMAC-SHA-256
 * (crypto_auth_hmacsha256, any key length, RFC 2104), the same bytes as
 * the hand-written HMAC this replaced (RFC 4231's vectors: test_hmac), so
 * daemons of either kind still link; comparisons of secrets and wiping go
 * through libsodium too (sodium_memcmp, sodium_memzero).
 */
#include "peer_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errf.h"

ovl_status_t ovld_peer_key_load(const char *path, ovld_peer_key_t *ret, char *err, size_t errlen)
{
    ovl_status_t st = OVL_OK;
    uint8_t buf[OVLD_PEER_KEY_FILE_MAX + 1];
    size_t len = 0;
    memset(ret, 0, sizeof(*ret));
    /* before anything of libsodium's (sodium_init(3): idempotent and
     * thread-safe); a key is what every later call here needs */
    if (sodium_init() < 0)
        return ovl_errf(OVL_ERR_SYSTEM, err, errlen,
                        "peer_key_file %s: libsodium: sodium_init failed", path);
    /* O_NONBLOCK: a FIFO put in the key's place must not hang the start;
     * it is refused below as not a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return ovl_errf(errno == EACCES ? OVL_ERR_CONFIG : OVL_ERR_SYSTEM, err, errlen,
                        "peer_key_file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = ovl_errf(OVL_ERR_SYSTEM, err, errlen, "peer_key_file %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ovl_errf(OVL_ERR_CONFIG, err, errlen, "peer_key_file %s is not a regular file", path);
        goto out;
    }
    if (sb.st_uid != geteuid()) {
        st = ovl_errf(OVL_ERR_CONFIG, err, errlen,
                      "peer_key_file %s is owned by uid %u; it must be owned by ovld's user "
                      "(uid %u)",
                      path, (unsigned)sb.st_uid, (unsigned)geteuid());
        goto out;
    }
    if (sb.st_mode & 077) {
        st = ovl_errf(OVL_ERR_CONFIG, err, errlen,
                      "peer_key_file %s has mode %04o: group and others must have no access "
                      "(0600 or stricter: chmod 600 %s)",
                      path, (unsigned)(sb.st_mode & 07777), path);
        goto out;
    }
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            st = ovl_errf(OVL_ERR_SYSTEM, err, errlen, "peer_key_file %s: %s", path,
                          strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len == sizeof(buf)) {
            st = ovl_errf(OVL_ERR_CONFIG, err, errlen,
                          "peer_key_file %s is larger than %d bytes; a key is %d to %d bytes", path,
                          OVLD_PEER_KEY_FILE_MAX, OVLD_PEER_KEY_MIN, OVLD_PEER_KEY_MAX);
            goto out;
        }
    }
    /* The whitespace that editors and `base64` leave at the end is not key. */
    while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t' || buf[len - 1] == '\n' ||
                       buf[len - 1] == '\r' || buf[len - 1] == '\v' || buf[len - 1] == '\f'))
        len--;
    if (len < OVLD_PEER_KEY_MIN || len > OVLD_PEER_KEY_MAX) {
        st =
            ovl_errf(OVL_ERR_CONFIG, err, errlen,
                     "peer_key_file %s holds %zu bytes of key (trailing whitespace trimmed); a key "
                     "is %d to %d bytes (head -c 32 /dev/urandom | base64 > %s)",
                     path, len, OVLD_PEER_KEY_MIN, OVLD_PEER_KEY_MAX, path);
        goto out;
    }
    memcpy(ret->bytes, buf, len);
    ret->len = len;
out:
    sodium_memzero(buf, sizeof(buf));
    close(fd);
    return st;
}

/* HMAC(key, label || 0x00 || the transcript) (peer_auth.h). */
static void transcript_mac(const ovld_peer_key_t *key, const char *label,
                           const ovld_peer_transcript_t *t, uint8_t out[OVLD_PEER_MAC_LEN])
{
    crypto_auth_hmacsha256_state c;
    /* no failure but a key length past size_t's, which the key's 4 KiB
     * cap rules out */
    (void)crypto_auth_hmacsha256_init(&c, key->bytes, key->len);
    /* the label with its NUL: a label is never the prefix of another input */
    (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)label, strlen(label) + 1);
    (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)t->nonce_c, OVLD_PEER_NONCE_LEN);
    (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)t->nonce_s, OVLD_PEER_NONCE_LEN);
    (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)t->inst_c,
                                        OVLD_PEER_INSTANCE_LEN);
    (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)t->inst_s,
                                        OVLD_PEER_INSTANCE_LEN);
    /* each variable field behind its length, so that the splits between
     * them are part of what is proven */
    const char *addrs[2] = {t->addr_c, t->addr_s};
    for (int i = 0; i < 2; i++) {
        size_t n = strnlen(addrs[i], 255);
        uint8_t l = (uint8_t)n;
        (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)&l, 1);
        (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)addrs[i], n);
    }
    const uint8_t *ucx[2] = {t->ucx_c, t->ucx_s};
    size_t ucx_len[2] = {t->ucx_c_len, t->ucx_s_len};
    for (int i = 0; i < 2; i++) {
        uint32_t n = (uint32_t)ucx_len[i];
        uint8_t l[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
        (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)l, 4);
        (void)crypto_auth_hmacsha256_update(&c, (const unsigned char *)ucx[i], n);
    }
    (void)crypto_auth_hmacsha256_final(&c, out);
    sodium_memzero(&c, sizeof(c));
}

void ovld_peer_mac(const ovld_peer_key_t *key, ovld_peer_role_t role,
                   const ovld_peer_transcript_t *t, uint8_t out[OVLD_PEER_MAC_LEN])
{
    transcript_mac(
        key, role == OVLD_PEER_ACCEPTOR ? "ovl-peer-v1 acceptor" : "ovl-peer-v1 connector", t, out);
}

void ovld_peer_session(const ovld_peer_key_t *key, const ovld_peer_transcript_t *t,
                       uint8_t out[OVLD_PEER_SESSION_LEN])
{
    uint8_t mac[OVLD_PEER_MAC_LEN];
    transcript_mac(key, "ovl-peer-v1 session", t, mac);
    memcpy(out, mac, OVLD_PEER_SESSION_LEN);
    sodium_memzero(mac, sizeof(mac));
}

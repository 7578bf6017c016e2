/*
 * test_peer_auth.c: unit tests of daemon/net/peer_auth.c: the cluster key
 * file's checks (what ovld refuses to start with, and the words it says
 * it with), and the handshake's proofs and session id (which inputs they
 * depend on, and that the two roles' proofs differ).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peer_auth.h"

/* HMAC-SHA-256 of one message under a key of any length (libsodium's
 * one-shot call takes 32-byte keys only). */
static void hmac_sha256(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                        uint8_t out[32])
{
    crypto_auth_hmacsha256_state c;
    assert_int_equal(crypto_auth_hmacsha256_init(&c, key, keylen), 0);
    assert_int_equal(crypto_auth_hmacsha256_update(&c, msg, n), 0);
    assert_int_equal(crypto_auth_hmacsha256_final(&c, out), 0);
}

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/ovl-test-key-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes len bytes to dir/name with mode; returns the path (static). */
static const char *key_file(const char *name, const void *data, size_t len, mode_t mode)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
    return path;
}

static ovl_status_t load(const char *path, ovld_peer_key_t *k, char *err, size_t errlen)
{
    err[0] = '\0';
    return ovld_peer_key_load(path, k, err, errlen);
}

static void test_key_good(void **state)
{
    (void)state;
    ovld_peer_key_t k;
    char err[512];
    /* as `head -c 32 /dev/urandom | base64 > FILE` writes it: 44 bytes and a newline */
    const char b64[] = "q7vV2Kx0yB3nQ9pL1mZ8cR4tW6uE5iO0aS7dF2gH3jk=\n";
    const char *p = key_file("good", b64, strlen(b64), 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_OK);
    assert_int_equal(k.len, strlen(b64) - 1);
    assert_memory_equal(k.bytes, b64, k.len);
    /* stricter modes are fine; trailing whitespace of every kind trimmed,
     * leading and inner kept */
    const char ws[] = " 0123456789abcdef 0123456789abcdef\t\r\n \n\v\f";
    p = key_file("ws", ws, strlen(ws), 0400);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_OK);
    assert_int_equal(k.len, 34);
    assert_memory_equal(k.bytes, ws, 34);
    /* exactly 32 and exactly 4096 bytes, binary included */
    uint8_t bin[OVLD_PEER_KEY_MAX];
    for (size_t i = 0; i < sizeof(bin); i++)
        bin[i] = (uint8_t)(i * 7 + 1); /* never ends in whitespace */
    bin[sizeof(bin) - 1] = 'x';
    p = key_file("min", bin, OVLD_PEER_KEY_MIN, 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_OK);
    assert_int_equal(k.len, OVLD_PEER_KEY_MIN);
    p = key_file("max", bin, sizeof(bin), 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_OK);
    assert_int_equal(k.len, OVLD_PEER_KEY_MAX);
    assert_memory_equal(k.bytes, bin, sizeof(bin));
    /* a symbolic link to a good file is followed */
    char link[160];
    snprintf(link, sizeof(link), "%s/link", dir);
    assert_int_equal(symlink(p, link), 0);
    assert_int_equal(load(link, &k, err, sizeof(err)), OVL_OK);
}

static void test_key_mode(void **state)
{
    (void)state;
    ovld_peer_key_t k;
    char err[512];
    const char key[] = "0123456789abcdef0123456789abcdef";
    static const mode_t bad[] = {0644, 0640, 0604, 0660, 0606, 0601, 0610, 0700 | 0070, 0777};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *p = key_file("mode", key, strlen(key), bad[i]);
        assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
        char want[64];
        snprintf(want, sizeof(want), "has mode %04o", (unsigned)bad[i]);
        assert_non_null(strstr(err, want));
        assert_non_null(strstr(err, "0600 or stricter"));
        assert_non_null(strstr(err, p));
        assert_int_equal(k.len, 0);
    }
}

static void test_key_size(void **state)
{
    (void)state;
    ovld_peer_key_t k;
    char err[512];
    /* 31 bytes, and 31 bytes padded with whitespace to well over 32 */
    const char s31[] = "0123456789abcdef0123456789abcde";
    const char *p = key_file("short", s31, strlen(s31), 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "holds 31 bytes of key"));
    assert_non_null(strstr(err, "32 to 4096 bytes"));
    const char pad[] = "0123456789abcdef0123456789abcde\n\n\n\n      \n";
    p = key_file("padded", pad, strlen(pad), 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "holds 31 bytes of key"));
    p = key_file("empty", "", 0, 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "holds 0 bytes of key"));
    /* 4097 bytes of key; and a file past 8 KiB, refused before reading on */
    static uint8_t big[OVLD_PEER_KEY_FILE_MAX + 100];
    memset(big, 'k', sizeof(big));
    p = key_file("long", big, OVLD_PEER_KEY_MAX + 1, 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "holds 4097 bytes of key"));
    p = key_file("huge", big, sizeof(big), 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "larger than 8192 bytes"));
    /* 4096 bytes of key and 4000 of trailing whitespace: fine */
    memset(big + OVLD_PEER_KEY_MAX, '\n', 4000);
    p = key_file("trail", big, OVLD_PEER_KEY_MAX + 4000, 0600);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_OK);
    assert_int_equal(k.len, OVLD_PEER_KEY_MAX);
}

static void test_key_not_a_file(void **state)
{
    (void)state;
    ovld_peer_key_t k;
    char err[512], path[160];
    /* missing */
    snprintf(path, sizeof(path), "%s/missing", dir);
    assert_int_equal(load(path, &k, err, sizeof(err)), OVL_ERR_SYSTEM);
    assert_non_null(strstr(err, "No such file"));
    /* a directory */
    snprintf(path, sizeof(path), "%s/adir", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(load(path, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "is not a regular file"));
    /* a FIFO: refused at once, not waited on */
    snprintf(path, sizeof(path), "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(load(path, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "is not a regular file"));
    /* /dev/null: a character device */
    assert_int_equal(load("/dev/null", &k, err, sizeof(err)), OVL_ERR_CONFIG);
    /* errlen 0 writes nothing */
    char none[4] = "abc";
    assert_int_equal(ovld_peer_key_load("/dev/null", &k, none, 0), OVL_ERR_CONFIG);
    assert_string_equal(none, "abc");
}

static void test_key_owner(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        /* only root can give a file away; as another user, a file of root's
         * in /etc does the same when readable */
        skip();
    }
    ovld_peer_key_t k;
    char err[512];
    const char key[] = "0123456789abcdef0123456789abcdef";
    const char *p = key_file("owner", key, strlen(key), 0600);
    assert_int_equal(chown(p, 65534, 65534), 0);
    assert_int_equal(load(p, &k, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "is owned by uid 65534"));
    assert_non_null(strstr(err, "ovld's user (uid 0)"));
}

/* ------------------------------------------------------------- proofs */

/* A proof's input as docs/multinode.md writes it, built by hand: the label
 * with its NUL, the nonces, the instances, the addresses "10.0.0.1:7411"
 * and "10.0.0.2:7411" behind one byte of length, the UCX addresses behind
 * four (big-endian). Returns its length. */
static size_t doc_input(uint8_t *msg, const char *label, const uint8_t *nc, const uint8_t *ns,
                        const uint8_t *ic, const uint8_t *is, const uint8_t *uc, size_t ucl,
                        const uint8_t *us, size_t usl)
{
    size_t n = strlen(label) + 1;
    memcpy(msg, label, n);
    memcpy(msg + n, nc, 32), n += 32;
    memcpy(msg + n, ns, 32), n += 32;
    memcpy(msg + n, ic, 16), n += 16;
    memcpy(msg + n, is, 16), n += 16;
    msg[n++] = 13;
    memcpy(msg + n, "10.0.0.1:7411", 13), n += 13;
    msg[n++] = 13;
    memcpy(msg + n, "10.0.0.2:7411", 13), n += 13;
    msg[n++] = 0, msg[n++] = 0, msg[n++] = 0, msg[n++] = (uint8_t)ucl;
    memcpy(msg + n, uc, ucl), n += ucl;
    msg[n++] = 0, msg[n++] = 0, msg[n++] = 0, msg[n++] = (uint8_t)usl;
    memcpy(msg + n, us, usl), n += usl;
    return n;
}

static void test_proofs(void **state)
{
    (void)state;
    ovld_peer_key_t k = {.len = 32};
    memset(k.bytes, 0x5a, k.len);
    uint8_t nc[32], ns[32], ic[16], is[16], uc[40], us[50];
    memset(nc, 1, sizeof(nc));
    memset(ns, 2, sizeof(ns));
    memset(ic, 3, sizeof(ic));
    memset(is, 4, sizeof(is));
    memset(uc, 5, sizeof(uc));
    memset(us, 6, sizeof(us));
    ovld_peer_transcript_t t = {nc, ns, ic,         is,        "10.0.0.1:7411", "10.0.0.2:7411",
                                uc, us, sizeof(uc), sizeof(us)};
    uint8_t a[32], c[32], a2[32], s1[16];
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a);
    ovld_peer_mac(&k, OVLD_PEER_CONNECTOR, &t, c);
    ovld_peer_session(&k, &t, s1);
    /* deterministic, and the roles differ (neither proof can be sent back
     * as the other), and so does the session id */
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
    assert_memory_equal(a, a2, 32);
    assert_memory_not_equal(a, c, 32);
    assert_memory_not_equal(a, s1, 16);
    assert_memory_not_equal(c, s1, 16);
    /* every input matters: a changed byte anywhere changes the proof */
    uint8_t *bufs[] = {nc, ns, ic, is, uc, us};
    size_t lens[] = {32, 32, 16, 16, sizeof(uc), sizeof(us)};
    for (size_t b = 0; b < 6; b++) {
        for (size_t i = 0; i < lens[b]; i += lens[b] - 1) {
            bufs[b][i] ^= 1;
            ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
            assert_memory_not_equal(a, a2, 32);
            bufs[b][i] ^= 1;
        }
    }
    t.addr_c = "10.0.0.1:7412";
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
    assert_memory_not_equal(a, a2, 32);
    /* the split between the two addresses is proven too */
    t.addr_c = "10.0.0.1:741";
    t.addr_s = "110.0.0.2:7411";
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
    assert_memory_not_equal(a, a2, 32);
    t.addr_c = "10.0.0.1:7411";
    t.addr_s = "10.0.0.2:7411";
    /* and the split between the two UCX addresses */
    t.ucx_c_len = sizeof(uc) - 1;
    t.ucx_s = uc + sizeof(uc) - 1;
    t.ucx_s_len = 1;
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
    assert_memory_not_equal(a, a2, 32);
    t.ucx_c_len = sizeof(uc);
    t.ucx_s = us;
    t.ucx_s_len = sizeof(us);
    /* another key, another proof */
    k.bytes[31] ^= 0x80;
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
    assert_memory_not_equal(a, a2, 32);
    k.bytes[31] ^= 0x80;
    ovld_peer_mac(&k, OVLD_PEER_ACCEPTOR, &t, a2);
    assert_memory_equal(a, a2, 32);
    /* The inputs as docs/multinode.md writes them, by hand: HMAC over the
     * label with its NUL, the nonces, the instances, the addresses behind
     * one byte of length, the UCX addresses behind four (big-endian). */
    uint8_t msg[1024], want[32];
    size_t n =
        doc_input(msg, "ovl-peer-v1 acceptor", nc, ns, ic, is, uc, sizeof(uc), us, sizeof(us));
    hmac_sha256(k.bytes, k.len, msg, n, want);
    assert_memory_equal(a, want, 32);
    /* the session id: the first 16 bytes of the same with its own label */
    n = doc_input(msg, "ovl-peer-v1 session", nc, ns, ic, is, uc, sizeof(uc), us, sizeof(us));
    hmac_sha256(k.bytes, k.len, msg, n, want);
    assert_memory_equal(s1, want, 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_good),  cmocka_unit_test(test_key_mode),
        cmocka_unit_test(test_key_size),  cmocka_unit_test(test_key_not_a_file),
        cmocka_unit_test(test_key_owner), cmocka_unit_test(test_proofs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

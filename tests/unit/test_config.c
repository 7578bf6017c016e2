/*
 * test_config.c: unit tests of ovld's configuration parser (daemon/util/config.c)
 * and of the sample file deploy/ovld.conf, which must parse and whose
 * commented-out values must be the real defaults.
 *
 * OVL_SOURCE_DIR (the source tree's root, passed with -D) locates the sample.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "config.h"

#ifndef OVL_SOURCE_DIR
#error "OVL_SOURCE_DIR must be defined (-DOVL_SOURCE_DIR=\"/path/to/ovl\")"
#endif

#define SAMPLE_PATH OVL_SOURCE_DIR "/deploy/ovld.conf"
#define NAME        "t.conf"
#define NELEM(a)    (sizeof(a) / sizeof((a)[0]))

static const char *const all_keys[] = {
    "socket",
    "socket_group",
    "socket_mode",
    "log_level",
    "backend",
    "host_devices",
    "max_frame_bytes",
    "max_connections",
    "max_registrations",
    "max_mapped_bytes",
    "max_ops_in_flight",
    "max_jobs",
    "default_algo",
    "default_chunks",
    "default_streams",
    "replay_cache",
    "capture_streams",
    "tune_samples",
    "tune_entries",
    "tune_entries_per_uid",
    "state_dir",
    "allgather",
    "max_connections_per_uid",
    "max_jobs_per_uid",
    "max_ranks_per_uid",
    "max_registrations_per_uid",
    "max_mapped_bytes_per_uid",
    "max_mappings",
    "hello_timeout_ms",
    "hold_limit_ms",
    "gate_spin_ms",
    "peer_listen",
    "peer_advertise",
    "peer_key_file",
    "peer_timeout_ms",
    "peer_allow",
};

/* Keys whose default (unset) cannot be written as a value: the sample
 * describes them in prose and shows an example, not a default line. */
static bool default_unset(const char *key)
{
    return strcmp(key, "socket_group") == 0 || strcmp(key, "peer_listen") == 0 ||
           strcmp(key, "peer_advertise") == 0 || strcmp(key, "peer_key_file") == 0 ||
           strcmp(key, "peer_allow") == 0 || strcmp(key, "state_dir") == 0;
}

/* ---------------------------------------------------------------- helpers */

/* Field by field, so that a failure names the field that differs. */
static void assert_config_equal(const ovld_config_t *a, const ovld_config_t *b)
{
    assert_string_equal(a->socket_path, b->socket_path);
    assert_string_equal(a->socket_group, b->socket_group);
    assert_int_equal(a->socket_mode, b->socket_mode);
    assert_int_equal(a->log_level, b->log_level);
    assert_int_equal(a->backend, b->backend);
    assert_int_equal(a->host_devices, b->host_devices);
    assert_int_equal(a->max_frame_bytes, b->max_frame_bytes);
    assert_int_equal(a->max_connections, b->max_connections);
    assert_int_equal(a->max_registrations, b->max_registrations);
    assert_int_equal(a->max_mapped_bytes, b->max_mapped_bytes);
    assert_int_equal(a->max_ops_in_flight, b->max_ops_in_flight);
    assert_int_equal(a->max_jobs, b->max_jobs);
    assert_int_equal(a->max_connections_per_uid, b->max_connections_per_uid);
    assert_int_equal(a->max_jobs_per_uid, b->max_jobs_per_uid);
    assert_int_equal(a->max_ranks_per_uid, b->max_ranks_per_uid);
    assert_int_equal(a->max_registrations_per_uid, b->max_registrations_per_uid);
    assert_int_equal(a->max_mapped_bytes_per_uid, b->max_mapped_bytes_per_uid);
    assert_int_equal(a->max_mappings, b->max_mappings);
    assert_int_equal(a->hello_timeout_ms, b->hello_timeout_ms);
    assert_int_equal(a->hold_limit_ms, b->hold_limit_ms);
    assert_int_equal(a->gate_spin_ms, b->gate_spin_ms);
    assert_int_equal(a->default_algo, b->default_algo);
    assert_int_equal(a->default_chunks, b->default_chunks);
    assert_int_equal(a->default_streams, b->default_streams);
    assert_int_equal(a->replay_cache, b->replay_cache);
    assert_int_equal(a->capture_streams, b->capture_streams);
    assert_int_equal(a->tune_samples, b->tune_samples);
    assert_int_equal(a->tune_entries, b->tune_entries);
    assert_int_equal(a->tune_entries_per_uid, b->tune_entries_per_uid);
    assert_string_equal(a->state_dir, b->state_dir);
    assert_int_equal(a->allgather, b->allgather);
    assert_string_equal(a->peer_listen, b->peer_listen);
    assert_string_equal(a->peer_advertise, b->peer_advertise);
    assert_string_equal(a->peer_key_file, b->peer_key_file);
    assert_int_equal(a->peer_timeout_ms, b->peer_timeout_ms);
    assert_int_equal(a->n_peer_allow, b->n_peer_allow);
    assert_memory_equal(a->peer_allow, b->peer_allow, sizeof(a->peer_allow));
}

/* Parses text over the defaults; asserts success and returns the result. */
static ovld_config_t parse_ok(const char *text)
{
    ovld_config_t cfg;
    char err[512] = "unset";

    ovld_config_defaults(&cfg);
    ovl_status_t r = ovld_config_parse(&cfg, NAME, text, err, sizeof(err));
    if (r != OVL_OK)
        fail_msg("parsing \"%s\" failed: %s", text, err);
    assert_string_equal(err, "");
    return cfg;
}

/*
 * Asserts that text fails with OVL_ERR_CONFIG, a message that starts with
 * "t.conf:LINE: " and holds `want`, and that the config it was parsed over
 * is untouched, byte for byte.
 */
static void expect_error(const char *text, unsigned line, const char *want)
{
    ovld_config_t cfg, before;
    char err[512];
    char prefix[64];

    /* Not the defaults, so that "untouched" cannot pass by a reset to them. */
    ovld_config_defaults(&cfg);
    cfg.max_jobs = 7;
    strcpy(cfg.socket_group, "before");
    before = cfg;

    ovl_status_t r = ovld_config_parse(&cfg, NAME, text, err, sizeof(err));
    if (r != OVL_ERR_CONFIG)
        fail_msg("parsing \"%s\" returned %d, not OVL_ERR_CONFIG", text, r);
    snprintf(prefix, sizeof(prefix), "%s:%u: ", NAME, line);
    if (strncmp(err, prefix, strlen(prefix)) != 0)
        fail_msg("parsing \"%s\": message \"%s\" does not start with \"%s\"", text, err, prefix);
    if (want && !strstr(err, want))
        fail_msg("parsing \"%s\": message \"%s\" does not hold \"%s\"", text, err, want);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
}

/* "key = value\n" into a static buffer; for one-line cases. */
static const char *kv(const char *key, const char *value)
{
    static char buf[8192];
    snprintf(buf, sizeof(buf), "%s = %s\n", key, value);
    return buf;
}

/* Writes `len` bytes to a new temporary file; returns its malloc'ed path. */
static char *write_temp(const void *data, size_t len)
{
    const char *dir = getenv("TMPDIR");
    char *path = malloc(4096);
    assert_non_null(path);
    snprintf(path, 4096, "%s/test_config.XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        assert_true(w > 0);
        p += w;
        len -= (size_t)w;
    }
    assert_int_equal(close(fd), 0);
    return path;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s: %s", path, strerror(errno));
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    assert_int_equal(ferror(f), 0);
    assert_true(feof(f));
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* ------------------------------------------------------------- defaults */

static void test_defaults(void **state)
{
    (void)state;
    ovld_config_t cfg;
    memset(&cfg, 0xa5, sizeof(cfg));
    ovld_config_defaults(&cfg);

    assert_string_equal(cfg.socket_path, OVL_DEFAULT_SOCKET);
    assert_string_equal(cfg.socket_group, "");
    assert_int_equal(cfg.socket_mode, 0660);
    assert_int_equal(cfg.log_level, OVLD_LOG_INFO);
    assert_int_equal(cfg.backend, OVLD_BACKEND_AUTO);
    assert_int_equal(cfg.host_devices, 8);
    assert_int_equal(cfg.max_frame_bytes, 1 << 20);
    assert_int_equal(cfg.max_connections, 1024);
    assert_int_equal(cfg.max_registrations, 4096);
    assert_int_equal(cfg.max_mapped_bytes, UINT64_C(1) << 40);
    assert_int_equal(cfg.max_ops_in_flight, 64);
    assert_int_equal(cfg.max_jobs, 256);
    assert_int_equal(cfg.max_connections_per_uid, 128);
    assert_int_equal(cfg.max_jobs_per_uid, 32);
    assert_int_equal(cfg.max_ranks_per_uid, 64);
    assert_int_equal(cfg.max_registrations_per_uid, 16384);
    assert_int_equal(cfg.max_mapped_bytes_per_uid, UINT64_C(4) << 40);
    assert_int_equal(cfg.max_mappings, 0); /* auto */
    assert_int_equal(cfg.max_mappings, OVLD_MAX_MAPPINGS_AUTO);
    assert_int_equal(cfg.hello_timeout_ms, 5000);
    assert_int_equal(cfg.hold_limit_ms, 10000);
    assert_int_equal(cfg.gate_spin_ms, 1000);
    assert_int_equal(cfg.default_algo, OVL_ALGO_AUTO);
    assert_int_equal(cfg.default_chunks, 0);
    assert_int_equal(cfg.default_streams, 0);
    assert_int_equal(cfg.tune_samples, 5);
    assert_int_equal(cfg.tune_entries, 1024);
    assert_int_equal(cfg.tune_entries_per_uid, 256);
    assert_string_equal(cfg.state_dir, "");
    assert_int_equal(cfg.replay_cache, 16);
    assert_int_equal(cfg.capture_streams, 8);
    assert_int_equal(cfg.allgather, OVL_AG_AUTO);

    /* Defaults are fully determined, padding included. */
    ovld_config_t again;
    memset(&again, 0x5a, sizeof(again));
    ovld_config_defaults(&again);
    assert_memory_equal(&cfg, &again, sizeof(cfg));
}

static void test_empty_text(void **state)
{
    (void)state;
    ovld_config_t def, cfg;
    ovld_config_defaults(&def);

    cfg = parse_ok("");
    assert_config_equal(&cfg, &def);
    cfg = parse_ok("\n\n   \n\t\n# only a comment\n   # indented comment\r\n");
    assert_config_equal(&cfg, &def);
}

/* ------------------------------------------------------------ every key */

static void test_every_key(void **state)
{
    (void)state;
    ovld_config_t cfg = parse_ok("socket = /tmp/ovl test/d.sock\n"
                                 "socket_group = gpu-users\n"
                                 "socket_mode = 0600\n"
                                 "log_level = debug\n"
                                 "backend = host\n"
                                 "host_devices = 4\n"
                                 "max_frame_bytes = 64K\n"
                                 "max_connections = 10\n"
                                 "max_registrations = 11\n"
                                 "max_mapped_bytes = 2G\n"
                                 "max_ops_in_flight = 12\n"
                                 "max_jobs = 13\n"
                                 "default_algo = ring\n"
                                 "default_chunks = 5\n"
                                 "default_streams = 3\n"
                                 "allgather = copy\n"
                                 "max_connections_per_uid = 14\n"
                                 "max_jobs_per_uid = 15\n"
                                 "max_ranks_per_uid = 24\n"
                                 "max_registrations_per_uid = 16\n"
                                 "max_mapped_bytes_per_uid = 3G\n"
                                 "max_mappings = 17\n"
                                 "hello_timeout_ms = 1800\n"
                                 "peer_listen = 0.0.0.0:7411\n"
                                 "peer_advertise = 10.1.2.3:7411\n"
                                 "peer_key_file = /etc/ovl/cluster.key\n"
                                 "peer_timeout_ms = 900\n");

    assert_string_equal(cfg.socket_path, "/tmp/ovl test/d.sock");
    assert_string_equal(cfg.socket_group, "gpu-users");
    assert_int_equal(cfg.socket_mode, 0600);
    assert_int_equal(cfg.log_level, OVLD_LOG_DEBUG);
    assert_int_equal(cfg.backend, OVLD_BACKEND_HOST);
    assert_int_equal(cfg.host_devices, 4);
    assert_int_equal(cfg.max_frame_bytes, 64 * 1024);
    assert_int_equal(cfg.max_connections, 10);
    assert_int_equal(cfg.max_registrations, 11);
    assert_int_equal(cfg.max_mapped_bytes, UINT64_C(2) << 30);
    assert_int_equal(cfg.max_ops_in_flight, 12);
    assert_int_equal(cfg.max_jobs, 13);
    assert_int_equal(cfg.default_algo, OVL_ALGO_RING);
    assert_int_equal(cfg.default_chunks, 5);
    assert_int_equal(cfg.default_streams, 3);
    assert_int_equal(cfg.allgather, OVL_AG_COPY);
    assert_int_equal(cfg.max_connections_per_uid, 14);
    assert_int_equal(cfg.max_jobs_per_uid, 15);
    assert_int_equal(cfg.max_ranks_per_uid, 24);
    assert_int_equal(cfg.max_registrations_per_uid, 16);
    assert_int_equal(cfg.max_mapped_bytes_per_uid, UINT64_C(3) << 30);
    assert_int_equal(cfg.max_mappings, 17);
    assert_int_equal(cfg.hello_timeout_ms, 1800);
    assert_string_equal(cfg.peer_listen, "0.0.0.0:7411");
    assert_string_equal(cfg.peer_advertise, "10.1.2.3:7411");
    assert_string_equal(cfg.peer_key_file, "/etc/ovl/cluster.key");
    assert_int_equal(cfg.peer_timeout_ms, 900);
}

static struct sockaddr_storage addr_of(const char *text)
{
    struct sockaddr_storage ss;
    char why[96];
    if (ovld_config_addr_parse(text, &ss, why, sizeof(why)) != OVL_OK)
        fail_msg("%s: %s", text, why);
    return ss;
}

/* peer_allow: networks, their ranges, what they let in, and how they read
 * back; unset lets nothing in by itself (the daemon's rule then). */
static void test_peer_allow(void **state)
{
    (void)state;
    char text[512];
    ovld_config_t cfg = parse_ok("");
    assert_int_equal(cfg.n_peer_allow, 0);
    struct sockaddr_storage a = addr_of("10.1.2.3:7411");
    assert_false(ovld_config_peer_allowed(&cfg, &a));
    ovld_config_peer_allow_format(&cfg, text, sizeof(text));
    assert_string_equal(text, "");

    cfg = parse_ok("peer_allow = 10.0.0.0/8, 192.168.7.9\tfd00::/8,,127.1.2.3/16\n");
    assert_int_equal(cfg.n_peer_allow, 4);
    ovld_config_peer_allow_format(&cfg, text, sizeof(text));
    /* host bits past the prefix are cleared; a host is /32 or /128 */
    assert_string_equal(text, "10.0.0.0/8, 192.168.7.9/32, fd00::/8, 127.1.0.0/16");
    static const struct {
        const char *addr;
        bool in;
    } cases[] = {
        {"10.0.0.1:1", true},           {"10.255.255.255:7411", true}, {"11.0.0.1:7411", false},
        {"192.168.7.9:7411", true},     {"192.168.7.8:7411", false},   {"[fd12::1]:7411", true},
        {"[fe00::1]:7411", false},      {"127.1.200.1:7411", true},    {"127.2.0.1:7411", false},
        {"[::ffff:10.0.0.1]:1", false}, /* IPv4-mapped is IPv6 here */
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        a = addr_of(cases[i].addr);
        if (ovld_config_peer_allowed(&cfg, &a) != cases[i].in)
            fail_msg("%s: allowed %d, expected %d", cases[i].addr, !cases[i].in, cases[i].in);
    }
    /* read back: the same config */
    char line[600];
    snprintf(line, sizeof(line), "peer_allow = %s\n", text);
    ovld_config_t back = parse_ok(line);
    assert_config_equal(&back, &cfg);
    /* everything, and the edges of each prefix */
    cfg = parse_ok("peer_allow = 0.0.0.0/0, ::/0\n");
    a = addr_of("1.2.3.4:5");
    assert_true(ovld_config_peer_allowed(&cfg, &a));
    cfg = parse_ok("peer_allow = 10.0.0.1/32, 10.0.0.128/25, fe80::1/128, 2001:db8::/127\n");
    ovld_config_peer_allow_format(&cfg, text, sizeof(text));
    assert_string_equal(text, "10.0.0.1/32, 10.0.0.128/25, fe80::1/128, 2001:db8::/127");
    a = addr_of("[2001:db8::1]:5");
    assert_true(ovld_config_peer_allowed(&cfg, &a));
    a = addr_of("[2001:db8::2]:5");
    assert_false(ovld_config_peer_allowed(&cfg, &a));
    a = addr_of("10.0.0.127:5");
    assert_false(ovld_config_peer_allowed(&cfg, &a));
    /* OVLD_PEER_ALLOW_MAX networks, not one more */
    size_t o = (size_t)snprintf(line, sizeof(line), "peer_allow =");
    for (int i = 0; i < OVLD_PEER_ALLOW_MAX; i++)
        o += (size_t)snprintf(line + o, sizeof(line) - o, " 10.0.%d.0/24", i);
    snprintf(line + o, sizeof(line) - o, "\n");
    cfg = parse_ok(line);
    assert_int_equal(cfg.n_peer_allow, OVLD_PEER_ALLOW_MAX);
    line[o] = '\0';
    snprintf(line + o, sizeof(line) - o, " 10.1.0.0/16\n");
    expect_error(line, 1, "peer_allow: more than 32 networks");
    /* refusals, each naming the key and what is wrong */
    expect_error("peer_allow = 10.0.0.0/33\n", 1,
                 "peer_allow: '10.0.0.0/33': the prefix must be 0..32");
    expect_error("peer_allow = fd00::/129\n", 1,
                 "peer_allow: 'fd00::/129': the prefix must be 0..128");
    expect_error("peer_allow = 10.0.0.0/\n", 1, "the prefix must be 0..32");
    expect_error("peer_allow = 10.0.0.0/-1\n", 1, "the prefix must be 0..32");
    expect_error("peer_allow = 10.0.0.0/8x\n", 1, "the prefix must be 0..32");
    expect_error(
        "peer_allow = node1\n", 1,
        "peer_allow: 'node1': not a numeric IPv4 or IPv6 address, with an optional /PREFIX");
    expect_error("peer_allow = 10.0.0.1:7411\n", 1, "not a numeric IPv4 or IPv6 address");
    expect_error("peer_allow = [::1]\n", 1, "not a numeric IPv4 or IPv6 address");
    expect_error("peer_allow = /8\n", 1, "peer_allow: '/8': not an ADDRESS or ADDRESS/PREFIX");
    expect_error("peer_allow = ,\n", 1, "peer_allow: no network in ','");
    expect_error("peer_allow = 10.0.0.1\npeer_allow = 10.0.0.2\n", 2, "duplicate key 'peer_allow'");
}

/* peer_*: addresses, and the keys that need each other. */
static void test_peer_keys(void **state)
{
    (void)state;
    ovld_config_t cfg = parse_ok("peer_listen = 127.0.0.1:1\npeer_key_file = /k\n");
    assert_string_equal(cfg.peer_listen, "127.0.0.1:1");
    assert_string_equal(cfg.peer_advertise, "");
    cfg = parse_ok("peer_listen = [::1]:65535\npeer_key_file = /k\n");
    assert_string_equal(cfg.peer_listen, "[::1]:65535");
    cfg = parse_ok("peer_listen = [::]:7411\npeer_advertise = [fe80::1]:7411\n"
                   "peer_key_file = /k\n");
    assert_string_equal(cfg.peer_advertise, "[fe80::1]:7411");

    struct sockaddr_storage ss;
    char why[96];
    assert_int_equal(ovld_config_addr_parse("192.168.0.7:7411", &ss, why, sizeof(why)), OVL_OK);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 7411);
    assert_false(ovld_config_addr_is_any(&ss));
    assert_int_equal(ovld_config_addr_parse("0.0.0.0:1", &ss, why, sizeof(why)), OVL_OK);
    assert_true(ovld_config_addr_is_any(&ss));
    assert_int_equal(ovld_config_addr_parse("[::]:1", &ss, why, sizeof(why)), OVL_OK);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_true(ovld_config_addr_is_any(&ss));

    expect_error("peer_listen = node1:7411\npeer_key_file = /k\n", 1,
                 "peer_listen: 'node1:7411': not a numeric IPv4 or [IPv6] address");
    expect_error("peer_listen = 10.0.0.1\n", 1, "expected IPV4:PORT or [IPV6]:PORT");
    expect_error("peer_listen = 10.0.0.1:0\n", 1, "the port must be 1..65535");
    expect_error("peer_listen = 10.0.0.1:65536\n", 1, "the port must be 1..65535");
    expect_error("peer_listen = 10.0.0.1:7x\n", 1, "the port must be 1..65535");
    expect_error("peer_listen = ::1:7411\n", 1, "expected IPV4:PORT or [IPV6]:PORT");
    expect_error("peer_listen = [::1]7411\n", 1, "expected [IPV6]:PORT");
    expect_error("peer_listen = [10.0.0.1]:7411\n", 1, "not a numeric IPv4 or [IPv6]");
    expect_error("peer_key_file = key\n", 1, "peer_key_file: 'key' is not an absolute path");
    expect_error("peer_timeout_ms = 499\n", 1, "peer_timeout_ms: '499' is out of range 500..60000");
    /* the keys that go together */
    expect_error("# c\npeer_listen = 10.0.0.1:7411\n", 2,
                 "peer_listen needs peer_key_file (the cluster key every node shares)");
    expect_error("peer_key_file = /k\n\npeer_listen = 0.0.0.0:7411\n", 3,
                 "peer_listen 0.0.0.0:7411 is a wildcard: set peer_advertise");
    expect_error("peer_advertise = 10.0.0.1:7411\n", 1,
                 "peer_advertise is set but peer_listen is not");
    expect_error("peer_key_file = /k\npeer_listen = 0.0.0.0:7411\npeer_advertise = 0.0.0.0:7411\n",
                 3, "peer_advertise 0.0.0.0:7411 is a wildcard");
}

static void test_enum_values(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        ovld_log_level_t level;
    } levels[] = {{"error", OVLD_LOG_ERROR},
                  {"warn", OVLD_LOG_WARN},
                  {"info", OVLD_LOG_INFO},
                  {"debug", OVLD_LOG_DEBUG}};
    for (size_t i = 0; i < NELEM(levels); i++)
        assert_int_equal(parse_ok(kv("log_level", levels[i].name)).log_level, levels[i].level);

    static const struct {
        const char *name;
        ovld_backend_kind_t kind;
    } kinds[] = {
        {"auto", OVLD_BACKEND_AUTO}, {"host", OVLD_BACKEND_HOST}, {"cuda", OVLD_BACKEND_CUDA}};
    for (size_t i = 0; i < NELEM(kinds); i++)
        assert_int_equal(parse_ok(kv("backend", kinds[i].name)).backend, kinds[i].kind);

    static const struct {
        const char *name;
        ovl_algo_t algo;
    } algos[] = {{"auto", OVL_ALGO_AUTO},
                 {"naive", OVL_ALGO_NAIVE},
                 {"collective", OVL_ALGO_COLLECTIVE},
                 {"ring", OVL_ALGO_RING}};
    for (size_t i = 0; i < NELEM(algos); i++)
        assert_int_equal(parse_ok(kv("default_algo", algos[i].name)).default_algo, algos[i].algo);

    static const struct {
        const char *name;
        ovl_ag_pref_t pref;
    } prefs[] = {{"auto", OVL_AG_AUTO}, {"nccl", OVL_AG_NCCL}, {"copy", OVL_AG_COPY}};
    for (size_t i = 0; i < NELEM(prefs); i++)
        assert_int_equal(parse_ok(kv("allgather", prefs[i].name)).allgather, prefs[i].pref);

    expect_error("log_level = INFO\n", 1,
                 "log_level: 'INFO' is not one of error, warn, info, debug");
    expect_error("log_level = warning\n", 1, "log_level: 'warning'");
    expect_error("backend = gpu\n", 1, "backend: 'gpu' is not one of auto, host, cuda");
    expect_error("default_algo = fast\n", 1,
                 "default_algo: 'fast' is not one of auto, naive, collective, ring");
    expect_error("allgather = mpi\n", 1, "allgather: 'mpi' is not one of auto, nccl, copy");
}

/* Keys absent from the text keep the values the config had: a reload
 * parses over the running config's copy. */
static void test_overlay(void **state)
{
    (void)state;
    ovld_config_t cfg;
    char err[256];

    ovld_config_defaults(&cfg);
    cfg.max_jobs = 99;
    strcpy(cfg.socket_group, "keep");
    assert_int_equal(ovld_config_parse(&cfg, NAME, "max_connections = 5\n", err, sizeof(err)),
                     OVL_OK);
    assert_int_equal(cfg.max_connections, 5);
    assert_int_equal(cfg.max_jobs, 99);
    assert_string_equal(cfg.socket_group, "keep");
}

/* --------------------------------------------------------------- syntax */

static void test_layout(void **state)
{
    (void)state;
    ovld_config_t cfg;

    /* blanks, tabs, comments after values, no blanks around '=' */
    cfg = parse_ok("# header\n"
                   "\n"
                   "   max_jobs\t=\t12   # trailing comment\n"
                   "\t\n"
                   "max_connections=3#tight\n"
                   "host_devices =2\n"
                   "   # indented comment = not a key\n");
    assert_int_equal(cfg.max_jobs, 12);
    assert_int_equal(cfg.max_connections, 3);
    assert_int_equal(cfg.host_devices, 2);

    /* CRLF endings, and a CRLF file without a final line ending */
    cfg = parse_ok("max_jobs = 12\r\n# c\r\n\r\nmax_connections = 3\r\nhost_devices = 2");
    assert_int_equal(cfg.max_jobs, 12);
    assert_int_equal(cfg.max_connections, 3);
    assert_int_equal(cfg.host_devices, 2);
    cfg = parse_ok("max_jobs = 12\r");
    assert_int_equal(cfg.max_jobs, 12);

    /* no final newline; the value runs to the end of the text */
    cfg = parse_ok("max_jobs = 1\nsocket = /a/b");
    assert_int_equal(cfg.max_jobs, 1);
    assert_string_equal(cfg.socket_path, "/a/b");

    /* everything after the first '=' is the value */
    cfg = parse_ok("socket = /run/a=b.sock\n");
    assert_string_equal(cfg.socket_path, "/run/a=b.sock");

    /* blanks inside a value are kept, around it trimmed */
    cfg = parse_ok("socket =   /run/my dir/x.sock  \t\n");
    assert_string_equal(cfg.socket_path, "/run/my dir/x.sock");
}

static void test_syntax_errors(void **state)
{
    (void)state;
    expect_error("max_jobs 5\n", 1, "expected 'key = value', got 'max_jobs 5'");
    expect_error("# ok\n\nmax_jobs\n", 3, "expected 'key = value'");
    expect_error("max_jobs = 5\n= 5\n", 2, "missing key before '='");
    expect_error("\n\n\n\n\n\nsokcet = /x\n", 7, "unknown key 'sokcet'");
    expect_error("Max_Jobs = 5\n", 1, "unknown key 'Max_Jobs'");
    expect_error("max jobs = 5\n", 1, "unknown key 'max jobs'");
    expect_error("max_jobs =\n", 1, "max_jobs: missing value");
    expect_error("max_jobs = # nothing\n", 1, "max_jobs: missing value");
    expect_error("max_jobs = \t \r\n", 1, "max_jobs: missing value");
    /* the key is checked before the value */
    expect_error("nosuch =\n", 1, "unknown key 'nosuch'");
    /* a lone CR inside a line, other control characters */
    expect_error("max_jobs = 5\nmax_connections = 5\rhost_devices = 2\n", 2,
                 "control character 0x0d");
    expect_error("\x01\n", 1, "control character 0x01");
    expect_error("# c\n# \x7f\n", 2, "control character 0x7f");
    /* the error is found on its line even after many good ones, in a CRLF file */
    expect_error("max_jobs = 5\r\n\r\n# c\r\nmax_connections = 5\r\nbad\r\n", 5, "expected");
    /* a long key or value is cut in the message, which keeps its prefix */
    char text[3000];
    memset(text, 'k', 2000);
    strcpy(text + 2000, " = 1\n");
    expect_error(text, 1, "unknown key 'kkkk");
    expect_error(text, 1, "...'");
}

static void test_duplicates(void **state)
{
    (void)state;
    expect_error("\nsocket = /a\nmax_jobs = 1\n# c\n\n\n\n\nsocket = /b\n", 9,
                 "duplicate key 'socket' (first on line 2)");
    expect_error("max_jobs = 1\nmax_jobs = 1\n", 2, "duplicate key 'max_jobs' (first on line 1)");
    /* a duplicate is an error even when its first value was bad */
    expect_error("max_jobs = 0\nmax_jobs = 1\n", 1, "max_jobs: '0' is out of range");
}

static void test_line_length(void **state)
{
    (void)state;
    char *text = malloc(3 * 4096 + 64);
    assert_non_null(text);

    /* exactly 4096 bytes, also with "\r\n" after them */
    memset(text, ' ', 4096);
    memcpy(text, "max_jobs = 3", 12);
    text[4095] = '#';
    strcpy(text + 4096, "\r\nmax_connections = 2\n");
    ovld_config_t cfg = parse_ok(text);
    assert_int_equal(cfg.max_jobs, 3);
    assert_int_equal(cfg.max_connections, 2);

    /* 4096 bytes as the last line, without a line ending */
    text[4096] = '\0';
    assert_int_equal(parse_ok(text).max_jobs, 3);

    /* 4097 bytes on line 3 */
    strcpy(text, "max_jobs = 3\n\n");
    size_t at = strlen(text);
    memset(text + at, '#', 4097);
    strcpy(text + at + 4097, "\nmax_connections = 2\n");
    expect_error(text, 3, "line longer than 4096 bytes");

    /* a huge last line with no line ending */
    memset(text, 'x', 3 * 4096);
    text[3 * 4096] = '\0';
    expect_error(text, 1, "line longer than 4096 bytes");
    free(text);
}

/* --------------------------------------------------------------- values */

typedef struct range_case {
    const char *key;
    const char *value;
    bool ok;
    uint64_t expect; /* for ok cases */
} range_case_t;

static uint64_t field_of(const ovld_config_t *cfg, const char *key)
{
    if (strcmp(key, "socket_mode") == 0)
        return cfg->socket_mode;
    if (strcmp(key, "host_devices") == 0)
        return cfg->host_devices;
    if (strcmp(key, "max_frame_bytes") == 0)
        return cfg->max_frame_bytes;
    if (strcmp(key, "max_connections") == 0)
        return cfg->max_connections;
    if (strcmp(key, "max_registrations") == 0)
        return cfg->max_registrations;
    if (strcmp(key, "max_mapped_bytes") == 0)
        return cfg->max_mapped_bytes;
    if (strcmp(key, "max_ops_in_flight") == 0)
        return cfg->max_ops_in_flight;
    if (strcmp(key, "max_jobs") == 0)
        return cfg->max_jobs;
    if (strcmp(key, "max_connections_per_uid") == 0)
        return cfg->max_connections_per_uid;
    if (strcmp(key, "max_jobs_per_uid") == 0)
        return cfg->max_jobs_per_uid;
    if (strcmp(key, "max_ranks_per_uid") == 0)
        return cfg->max_ranks_per_uid;
    if (strcmp(key, "max_registrations_per_uid") == 0)
        return cfg->max_registrations_per_uid;
    if (strcmp(key, "max_mapped_bytes_per_uid") == 0)
        return cfg->max_mapped_bytes_per_uid;
    if (strcmp(key, "max_mappings") == 0)
        return cfg->max_mappings;
    if (strcmp(key, "hello_timeout_ms") == 0)
        return cfg->hello_timeout_ms;
    if (strcmp(key, "default_chunks") == 0)
        return cfg->default_chunks;
    if (strcmp(key, "default_streams") == 0)
        return cfg->default_streams;
    if (strcmp(key, "replay_cache") == 0)
        return cfg->replay_cache;
    if (strcmp(key, "capture_streams") == 0)
        return cfg->capture_streams;
    if (strcmp(key, "tune_samples") == 0)
        return cfg->tune_samples;
    if (strcmp(key, "tune_entries") == 0)
        return cfg->tune_entries;
    if (strcmp(key, "tune_entries_per_uid") == 0)
        return cfg->tune_entries_per_uid;
    if (strcmp(key, "hold_limit_ms") == 0)
        return cfg->hold_limit_ms;
    if (strcmp(key, "gate_spin_ms") == 0)
        return cfg->gate_spin_ms;
    fail_msg("no numeric key %s", key);
    return 0;
}

static void run_range_cases(const range_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *text = kv(cases[i].key, cases[i].value);
        if (cases[i].ok) {
            ovld_config_t cfg = parse_ok(text);
            if (field_of(&cfg, cases[i].key) != cases[i].expect)
                fail_msg("%s = %s gave %llu, not %llu", cases[i].key, cases[i].value,
                         (unsigned long long)field_of(&cfg, cases[i].key),
                         (unsigned long long)cases[i].expect);
        } else {
            char want[256];
            snprintf(want, sizeof(want), "%s: '%s' is out of range", cases[i].key, cases[i].value);
            expect_error(text, 1, want);
        }
    }
}

static void test_integer_ranges(void **state)
{
    (void)state;
    static const range_case_t cases[] = {
        {"host_devices", "0", false, 0},
        {"host_devices", "1", true, 1},
        {"host_devices", "64", true, 64},
        {"host_devices", "65", false, 0},
        {"max_connections", "0", false, 0},
        {"max_connections", "1", true, 1},
        {"max_connections", "65536", true, 65536},
        {"max_connections", "65537", false, 0},
        {"max_registrations", "0", false, 0},
        {"max_registrations", "1", true, 1},
        {"max_registrations", "1048576", true, 1048576},
        {"max_registrations", "1048577", false, 0},
        {"max_ops_in_flight", "0", false, 0},
        {"max_ops_in_flight", "1", true, 1},
        {"max_ops_in_flight", "4096", true, 4096},
        {"max_ops_in_flight", "4097", false, 0},
        {"max_jobs", "0", false, 0},
        {"max_jobs", "1", true, 1},
        {"max_jobs", "65536", true, 65536},
        {"max_jobs", "65537", false, 0},
        {"max_jobs", "4294967296", false, 0},           /* would wrap to 0 in 32 bits */
        {"max_jobs", "4294967297", false, 0},           /* would wrap to 1 */
        {"max_jobs", "18446744073709551617", false, 0}, /* more than 64 bits */
        {"max_jobs", "00012", true, 12},
        {"default_chunks", "0", true, 0},
        {"default_chunks", "64", true, 64},
        {"default_chunks", "65", false, 0},
        {"default_streams", "0", true, 0},
        {"default_streams", "8", true, 8},
        {"default_streams", "9", false, 0},
        {"replay_cache", "0", true, 0},
        {"replay_cache", "256", true, 256},
        {"replay_cache", "257", false, 0},
        {"capture_streams", "0", true, 0},
        {"capture_streams", "1", true, 1},
        {"capture_streams", "8", true, 8},
        {"capture_streams", "9", false, 0},
        {"tune_samples", "0", true, 0},
        {"tune_samples", "64", true, 64},
        {"tune_samples", "65", false, 0},
        {"tune_entries", "0", false, 0},
        {"tune_entries", "1", true, 1},
        {"tune_entries", "65536", true, 65536},
        {"tune_entries", "65537", false, 0},
        {"tune_entries_per_uid", "0", false, 0},
        {"tune_entries_per_uid", "65536", true, 65536},
        {"tune_entries_per_uid", "65537", false, 0},
        {"hold_limit_ms", "0", true, 0},
        {"hold_limit_ms", "3600000", true, 3600000},
        {"hold_limit_ms", "3600001", false, 0},
        {"gate_spin_ms", "0", true, 0},
        {"gate_spin_ms", "60000", true, 60000},
        {"gate_spin_ms", "60001", false, 0},
        {"max_connections_per_uid", "0", false, 0},
        {"max_connections_per_uid", "1", true, 1},
        {"max_connections_per_uid", "65536", true, 65536},
        {"max_connections_per_uid", "65537", false, 0},
        {"max_connections_per_uid", "4294967297", false, 0}, /* would wrap to 1 */
        {"max_jobs_per_uid", "0", false, 0},
        {"max_jobs_per_uid", "1", true, 1},
        {"max_jobs_per_uid", "65536", true, 65536},
        {"max_jobs_per_uid", "65537", false, 0},
        {"max_ranks_per_uid", "0", false, 0},
        {"max_ranks_per_uid", "1", true, 1},
        {"max_ranks_per_uid", "65536", true, 65536},
        {"max_ranks_per_uid", "65537", false, 0},
        {"max_ranks_per_uid", "4294967297", false, 0}, /* would wrap to 1 */
        {"max_registrations_per_uid", "0", false, 0},
        {"max_registrations_per_uid", "1", true, 1},
        {"max_registrations_per_uid", "1048576", true, 1048576},
        {"max_registrations_per_uid", "1048577", false, 0},
        {"max_mappings", "0", false, 0}, /* 0 is how auto is stored, not a value */
        {"max_mappings", "1", true, 1},
        {"max_mappings", "16777216", true, 16777216},
        {"max_mappings", "16777217", false, 0},
        {"max_mappings", "4294967297", false, 0},
        {"max_mappings", "18446744073709551617", false, 0},
        {"hello_timeout_ms", "0", false, 0},
        {"hello_timeout_ms", "99", false, 0},
        {"hello_timeout_ms", "100", true, 100},
        {"hello_timeout_ms", "600000", true, 600000},
        {"hello_timeout_ms", "600001", false, 0},
    };
    run_range_cases(cases, NELEM(cases));

    /* the exact message of the brief's example */
    expect_error("# c\n\nmax_jobs = 0\n", 3, "max_jobs: '0' is out of range 1..65536");
}

static void test_integer_syntax(void **state)
{
    (void)state;
    static const char *const bad[] = {"12abc", "-1", "+1",  "1 2",   "0x10",  "1e3",
                                      "1.0",   "1K", "one", "\"5\"", "1_000", "\xc2\xb9"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        char want[128];
        snprintf(want, sizeof(want), "max_jobs: '%s' is not a decimal integer", bad[i]);
        expect_error(kv("max_jobs", bad[i]), 1, want);
    }
    /* a comment ends the value before it is seen */
    assert_int_equal(parse_ok("max_jobs = 12 # x y\n").max_jobs, 12);

    /* every integer key takes the same syntax */
    static const char *const ints[] = {"host_devices",
                                       "max_connections",
                                       "max_registrations",
                                       "max_ops_in_flight",
                                       "max_jobs",
                                       "default_chunks",
                                       "default_streams",
                                       "replay_cache",
                                       "max_connections_per_uid",
                                       "max_jobs_per_uid",
                                       "max_ranks_per_uid",
                                       "max_registrations_per_uid",
                                       "hello_timeout_ms",
                                       "capture_streams",
                                       "hold_limit_ms",
                                       "gate_spin_ms",
                                       "peer_timeout_ms",
                                       "tune_samples",
                                       "tune_entries",
                                       "tune_entries_per_uid"};
    for (size_t i = 0; i < NELEM(ints); i++) {
        expect_error(kv(ints[i], "-1"), 1, "is not a decimal integer");
        expect_error(kv(ints[i], "2x"), 1, "is not a decimal integer");
    }
}

static void test_sizes(void **state)
{
    (void)state;
    static const range_case_t cases[] = {
        {"max_frame_bytes", "4096", true, 4096},
        {"max_frame_bytes", "4K", true, 4096},
        {"max_frame_bytes", "4k", true, 4096},
        {"max_frame_bytes", "4KiB", true, 4096},
        {"max_frame_bytes", "4kib", true, 4096},
        {"max_frame_bytes", "4KB", true, 4096},
        {"max_frame_bytes", "4kb", true, 4096},
        {"max_frame_bytes", "1M", true, 1 << 20},
        {"max_frame_bytes", "64M", true, 64 << 20},
        {"max_frame_bytes", "64MiB", true, 64 << 20},
        {"max_frame_bytes", "65536K", true, 64 << 20},
        {"max_frame_bytes", "4095", false, 0},
        {"max_frame_bytes", "3K", false, 0},
        {"max_frame_bytes", "67108865", false, 0},
        {"max_frame_bytes", "65M", false, 0},
        {"max_frame_bytes", "1G", false, 0},
        {"max_frame_bytes", "4194304T", false, 0}, /* 2^62, wraps to 0 in 32 bits */
        {"max_frame_bytes", "99999999999T", false, 0},
        {"max_mapped_bytes", "4K", true, 4096},
        {"max_mapped_bytes", "1T", true, UINT64_C(1) << 40},
        {"max_mapped_bytes", "3g", true, UINT64_C(3) << 30},
        {"max_mapped_bytes", "16777215T", true, UINT64_C(16777215) << 40},
        {"max_mapped_bytes", "18446744073709551615", true, UINT64_MAX},
        {"max_mapped_bytes_per_uid", "4096", true, 4096},
        {"max_mapped_bytes_per_uid", "4K", true, 4096},
        {"max_mapped_bytes_per_uid", "4T", true, UINT64_C(4) << 40},
        {"max_mapped_bytes_per_uid", "8tib", true, UINT64_C(8) << 40},
        {"max_mapped_bytes_per_uid", "512MiB", true, UINT64_C(512) << 20},
        {"max_mapped_bytes_per_uid", "3g", true, UINT64_C(3) << 30},
        {"max_mapped_bytes_per_uid", "16777215T", true, UINT64_C(16777215) << 40},
        {"max_mapped_bytes_per_uid", "18446744073709551615", true, UINT64_MAX},
    };
    run_range_cases(cases, NELEM(cases));

    /* max_mapped_bytes has no upper bound but 64 bits */
    expect_error(kv("max_mapped_bytes", "4095"), 1,
                 "max_mapped_bytes: '4095' is less than the minimum 4K");
    expect_error(kv("max_mapped_bytes", "99999999999T"), 1,
                 "max_mapped_bytes: '99999999999T' does not fit in 64 bits");
    expect_error(kv("max_mapped_bytes", "16777216T"), 1, "does not fit in 64 bits");
    expect_error(kv("max_mapped_bytes", "18014398509481984K"), 1, "does not fit in 64 bits");
    expect_error(kv("max_mapped_bytes", "18446744073709551616"), 1, "does not fit in 64 bits");
    expect_error(kv("max_mapped_bytes", "99999999999999999999999999T"), 1,
                 "does not fit in 64 bits");

    /* so has max_mapped_bytes_per_uid */
    expect_error(kv("max_mapped_bytes_per_uid", "4095"), 1,
                 "max_mapped_bytes_per_uid: '4095' is less than the minimum 4K");
    expect_error(kv("max_mapped_bytes_per_uid", "3K"), 1,
                 "max_mapped_bytes_per_uid: '3K' is less than the minimum 4K");
    expect_error(kv("max_mapped_bytes_per_uid", "0"), 1, "is less than the minimum 4K");
    expect_error(kv("max_mapped_bytes_per_uid", "16777216T"), 1,
                 "max_mapped_bytes_per_uid: '16777216T' does not fit in 64 bits");
    expect_error(kv("max_mapped_bytes_per_uid", "18446744073709551616"), 1,
                 "does not fit in 64 bits");
    expect_error(kv("max_mapped_bytes_per_uid", "4X"), 1,
                 "max_mapped_bytes_per_uid: '4X' is not a size");
    expect_error(kv("max_mapped_bytes_per_uid", "auto"), 1,
                 "max_mapped_bytes_per_uid: 'auto' is not a size");

    /* range messages write sizes with their suffix */
    expect_error(kv("max_frame_bytes", "1K"), 1, "max_frame_bytes: '1K' is out of range 4K..64M");

    static const char *const bad[] = {"K",   "4 K", "4KK",    "4X",   "4KiBs", "4iB", "4B",
                                      "-4K", "+4K", "0x1000", "4.5M", "4Ki",   "4P",  "M4"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        char want[128];
        snprintf(want, sizeof(want), "max_mapped_bytes: '%s' is not a size", bad[i]);
        expect_error(kv("max_mapped_bytes", bad[i]), 1, want);
    }
}

/*
 * The per-uid limits, max_mappings and hello_timeout_ms, key by key: the
 * default, a value in range, both ends of the range, the exact message for
 * a value out of range (naming the file, the line and the key), and a
 * duplicate refused. The ends and the syntax are also in the tables of
 * test_integer_ranges, test_integer_syntax and test_sizes.
 */
static void test_limit_keys(void **state)
{
    (void)state;
    static const struct {
        const char *key;
        uint64_t def;        /* the default */
        const char *value;   /* a value in range, not the default ... */
        uint64_t parsed;     /* ... and what it parses to */
        const char *lo, *hi; /* the ends of the range, as written */
        uint64_t lo_v, hi_v;
        const char *below; /* out of range, and the message it gets */
        const char *below_msg;
        const char *above; /* past the top (for a size: past 64 bits) */
        const char *above_msg;
    } keys[] = {
        {"max_connections_per_uid", 128, "200", 200, "1", "65536", 1, 65536, "0",
         "max_connections_per_uid: '0' is out of range 1..65536", "65537",
         "max_connections_per_uid: '65537' is out of range 1..65536"},
        {"max_jobs_per_uid", 32, "7", 7, "1", "65536", 1, 65536, "0",
         "max_jobs_per_uid: '0' is out of range 1..65536", "70000",
         "max_jobs_per_uid: '70000' is out of range 1..65536"},
        {"max_ranks_per_uid", 64, "16", 16, "1", "65536", 1, 65536, "0",
         "max_ranks_per_uid: '0' is out of range 1..65536", "65537",
         "max_ranks_per_uid: '65537' is out of range 1..65536"},
        {"max_registrations_per_uid", 16384, "100000", 100000, "1", "1048576", 1, 1048576, "0",
         "max_registrations_per_uid: '0' is out of range 1..1048576", "1048577",
         "max_registrations_per_uid: '1048577' is out of range 1..1048576"},
        {"max_mapped_bytes_per_uid", UINT64_C(4) << 40, "64G", UINT64_C(64) << 30, "4K",
         "18446744073709551615", 4096, UINT64_MAX, "4095",
         "max_mapped_bytes_per_uid: '4095' is less than the minimum 4K", "16777216T",
         "max_mapped_bytes_per_uid: '16777216T' does not fit in 64 bits"},
        {"max_mappings", 0, "30000", 30000, "1", "16777216", 1, 16777216, "0",
         "max_mappings: '0' is out of range 1..16777216", "16777217",
         "max_mappings: '16777217' is out of range 1..16777216"},
        {"hello_timeout_ms", 5000, "250", 250, "100", "600000", 100, 600000, "99",
         "hello_timeout_ms: '99' is out of range 100..600000", "600001",
         "hello_timeout_ms: '600001' is out of range 100..600000"},
    };

    ovld_config_t def;
    ovld_config_defaults(&def);
    for (size_t i = 0; i < NELEM(keys); i++) {
        const char *key = keys[i].key;
        char text[512], want[256];

        if (field_of(&def, key) != keys[i].def)
            fail_msg("%s defaults to %llu, not %llu", key, (unsigned long long)field_of(&def, key),
                     (unsigned long long)keys[i].def);

        /* a key left out keeps its default; one given replaces it, and only it */
        ovld_config_t cfg = parse_ok(kv(key, keys[i].value));
        assert_int_equal(field_of(&cfg, key), keys[i].parsed);
        cfg = parse_ok("max_jobs = 3\n");
        assert_int_equal(field_of(&cfg, key), keys[i].def);

        /* both ends of the range, with blanks and a comment around them */
        snprintf(text, sizeof(text), "\t%s=%s   # low end\n", key, keys[i].lo);
        cfg = parse_ok(text);
        assert_int_equal(field_of(&cfg, key), keys[i].lo_v);
        snprintf(text, sizeof(text), "%s = %s\n", key, keys[i].hi);
        cfg = parse_ok(text);
        assert_int_equal(field_of(&cfg, key), keys[i].hi_v);

        /* out of range, on line 3 of the file: "t.conf:3: KEY: ..." */
        snprintf(text, sizeof(text), "# c\nmax_jobs = 2\n%s = %s\n", key, keys[i].below);
        expect_error(text, 3, keys[i].below_msg);
        snprintf(text, sizeof(text), "# c\nmax_jobs = 2\n%s = %s\n", key, keys[i].above);
        expect_error(text, 3, keys[i].above_msg);

        /* a duplicate, even with the same value */
        snprintf(text, sizeof(text), "%s = %s\n\nmax_jobs = 2\n%s = %s\n", key, keys[i].value, key,
                 keys[i].value);
        snprintf(want, sizeof(want), "duplicate key '%s' (first on line 1)", key);
        expect_error(text, 4, want);

        /* an empty value is an error, not the default */
        snprintf(want, sizeof(want), "%s: missing value", key);
        expect_error(kv(key, ""), 1, want);
    }
}

static void test_max_mappings(void **state)
{
    (void)state;
    ovld_config_t cfg;
    char err[256];

    /* auto is stored as 0, also over a config that held a number */
    assert_int_equal(parse_ok("max_mappings = auto\n").max_mappings, 0);
    assert_int_equal(parse_ok("max_mappings = auto\n").max_mappings, OVLD_MAX_MAPPINGS_AUTO);
    ovld_config_defaults(&cfg);
    cfg.max_mappings = 1234;
    assert_int_equal(
        ovld_config_parse(&cfg, NAME, "max_mappings=auto # default\n", err, sizeof(err)), OVL_OK);
    assert_int_equal(cfg.max_mappings, 0);
    /* and a number over auto */
    ovld_config_defaults(&cfg);
    assert_int_equal(ovld_config_parse(&cfg, NAME, "max_mappings = 32765\n", err, sizeof(err)),
                     OVL_OK);
    assert_int_equal(cfg.max_mappings, 32765);
    assert_int_equal(parse_ok("max_mappings = 00042\n").max_mappings, 42);

    /* 0 would read as auto: it is refused, not taken as auto */
    expect_error("max_mappings = 0\n", 1, "max_mappings: '0' is out of range 1..16777216");

    /* names are lower-case; nothing but auto and plain digits */
    static const char *const bad[] = {"AUTO", "Auto", "automatic", "auto1", "1auto", "-1",
                                      "+1",   "1K",   "0x10",      "1e3",   "one",   "auto auto"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        char want[128];
        snprintf(want, sizeof(want), "max_mappings: '%s' is not 'auto' or a decimal integer",
                 bad[i]);
        expect_error(kv("max_mappings", bad[i]), 1, want);
    }

    /* a duplicate of auto */
    expect_error("max_mappings = auto\nmax_mappings = auto\n", 2,
                 "duplicate key 'max_mappings' (first on line 1)");
    expect_error("max_mappings = auto\nmax_mappings = 5\n", 2,
                 "duplicate key 'max_mappings' (first on line 1)");
}

static void test_socket_mode(void **state)
{
    (void)state;
    static const range_case_t cases[] = {
        {"socket_mode", "0660", true, 0660},
        {"socket_mode", "660", true, 0660},
        {"socket_mode", "0", true, 0},
        {"socket_mode", "0777", true, 0777},
        {"socket_mode", "777", true, 0777},
        {"socket_mode", "0000600", true, 0600},
        {"socket_mode", "01000", false, 0},
        {"socket_mode", "1777", false, 0},
        {"socket_mode", "7777777777777777777777777", false, 0},
    };
    run_range_cases(cases, NELEM(cases));
    expect_error(kv("socket_mode", "01000"), 1, "socket_mode: '01000' is out of range 0..0777");

    static const char *const bad[] = {"8", "0668", "0o660", "0x1b0", "-0660", "rw-rw----", "06 60"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        char want[128];
        snprintf(want, sizeof(want), "socket_mode: '%s' is not an octal mode", bad[i]);
        expect_error(kv("socket_mode", bad[i]), 1, want);
    }
}

static void test_socket_path(void **state)
{
    (void)state;
    char path[200];

    /* 107 bytes fit in sun_path with its NUL, 108 do not */
    memset(path, 'a', sizeof(path));
    path[0] = '/';
    path[107] = '\0';
    assert_string_equal(parse_ok(kv("socket", path)).socket_path, path);
    path[107] = 'a';
    path[108] = '\0';
    expect_error(kv("socket", path), 1,
                 "socket: path is 108 bytes; a socket path holds at most 107");

    expect_error(kv("socket", "ovld.sock"), 1, "socket: 'ovld.sock' is not an absolute path");
    expect_error(kv("socket", "./ovld.sock"), 1, "is not an absolute path");
    expect_error(kv("socket", "/run/ovl/"), 1, "socket: '/run/ovl/' names a directory");
    expect_error(kv("socket", "/"), 1, "names a directory");
}

static void test_socket_group(void **state)
{
    (void)state;
    static const char *const good[] = {"ovl", "gpu-users", "_a.b", "A9", "x-"};
    for (size_t i = 0; i < NELEM(good); i++)
        assert_string_equal(parse_ok(kv("socket_group", good[i])).socket_group, good[i]);

    char name[80];
    memset(name, 'g', sizeof(name));
    name[63] = '\0';
    assert_string_equal(parse_ok(kv("socket_group", name)).socket_group, name);
    name[63] = 'g';
    name[64] = '\0';
    expect_error(kv("socket_group", name), 1, "is longer than 63 characters");

    static const char *const bad[] = {"-ovl", "a b", "a:b", "a/b", "grüppe", "a$"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        char want[128];
        snprintf(want, sizeof(want), "socket_group: '%s' is not a group name", bad[i]);
        expect_error(kv("socket_group", bad[i]), 1, want);
    }
}

/* -------------------------------------------------------- error buffers */

static void test_error_buffers(void **state)
{
    (void)state;
    ovld_config_t cfg;
    ovld_config_defaults(&cfg);

    /* no buffer at all */
    assert_int_equal(ovld_config_parse(&cfg, NAME, "nosuch = 1\n", NULL, 0), OVL_ERR_CONFIG);
    assert_int_equal(ovld_config_parse(&cfg, NAME, "max_jobs = 2\n", NULL, 0), OVL_OK);
    assert_int_equal(cfg.max_jobs, 2);

    /* a small buffer is filled, truncated and terminated */
    char small[12];
    memset(small, 'x', sizeof(small));
    assert_int_equal(ovld_config_parse(&cfg, NAME, "nosuch = 1\n", small, sizeof(small)),
                     OVL_ERR_CONFIG);
    assert_string_equal(small, "t.conf:1: u");

    /* a buffer too small even for the prefix */
    char tiny[4];
    assert_int_equal(ovld_config_parse(&cfg, NAME, "nosuch = 1\n", tiny, sizeof(tiny)),
                     OVL_ERR_CONFIG);
    assert_string_equal(tiny, "t.c");

    /* success clears a stale message */
    char err[64] = "stale";
    assert_int_equal(ovld_config_parse(&cfg, NAME, "", err, sizeof(err)), OVL_OK);
    assert_string_equal(err, "");

    /* no name: a placeholder, still with the line */
    assert_int_equal(ovld_config_parse(&cfg, NULL, "\nnosuch = 1\n", err, sizeof(err)),
                     OVL_ERR_CONFIG);
    assert_non_null(strstr(err, ":2: unknown key 'nosuch'"));

    /* NULL arguments */
    assert_int_equal(ovld_config_parse(NULL, NAME, "", err, sizeof(err)), OVL_ERR_INVALID);
    assert_int_equal(ovld_config_parse(&cfg, NAME, NULL, err, sizeof(err)), OVL_ERR_INVALID);
    assert_int_equal(ovld_config_load(&cfg, NULL, err, sizeof(err)), OVL_ERR_INVALID);
}

/* Every kind of error leaves the config byte for byte as it was, even when
 * good lines came before the bad one. */
static void test_untouched_on_error(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "socket = /new\nsocket_group = new\nmax_jobs = 2\nbogus = 1\n",
        "socket = /new\nlog_level = debug\nmax_jobs = 0\n",
        "default_algo = ring\nmax_mapped_bytes = 99999999999T\n",
        "max_connections = 2\nmax_connections = 3\n",
        "backend = cuda\nno equals sign\n",
        "max_mappings = auto\nmax_jobs_per_uid = 0\n",
        "max_ranks_per_uid = 8\nmax_jobs_per_uid = 4\nmax_ranks_per_uid = 70000\n",
        "max_connections_per_uid = 2\nmax_mapped_bytes_per_uid = 1K\n",
        "hello_timeout_ms = 100\nmax_registrations_per_uid = 1\nhello_timeout_ms = 200\n",
    };
    for (size_t i = 0; i < NELEM(texts); i++) {
        ovld_config_t cfg, before;
        char err[256];
        ovld_config_defaults(&cfg);
        cfg.host_devices = 3;
        cfg.max_mappings = 5; /* not auto, so that a stored auto would show */
        before = cfg;
        assert_int_equal(ovld_config_parse(&cfg, NAME, texts[i], err, sizeof(err)), OVL_ERR_CONFIG);
        assert_memory_equal(&cfg, &before, sizeof(cfg));
    }
}

/* ---------------------------------------------------------------- files */

static void test_load(void **state)
{
    (void)state;
    ovld_config_t cfg, before;
    char err[512];

    const char *text = "# test\r\nmax_jobs = 17\nsocket = /tmp/x.sock";
    char *path = write_temp(text, strlen(text));
    ovld_config_defaults(&cfg);
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_OK);
    assert_int_equal(cfg.max_jobs, 17);
    assert_string_equal(cfg.socket_path, "/tmp/x.sock");
    unlink(path);
    free(path);

    /* errors name the file's path and the line */
    text = "max_jobs = 1\n\nmax_jobs = 2\n";
    path = write_temp(text, strlen(text));
    ovld_config_defaults(&cfg);
    before = cfg;
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_ERR_CONFIG);
    char want[600];
    snprintf(want, sizeof(want), "%s:3: duplicate key 'max_jobs' (first on line 1)", path);
    assert_string_equal(err, want);
    assert_memory_equal(&cfg, &before, sizeof(cfg));

    /* a new key out of range, in a file */
    unlink(path);
    free(path);
    text = "# limits\nmax_jobs_per_uid = 8\nhello_timeout_ms = 50\n";
    path = write_temp(text, strlen(text));
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_ERR_CONFIG);
    snprintf(want, sizeof(want), "%s:3: hello_timeout_ms: '50' is out of range 100..600000", path);
    assert_string_equal(err, want);
    assert_memory_equal(&cfg, &before, sizeof(cfg));

    /* the file is gone */
    unlink(path);
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_ERR_CONFIG);
    snprintf(want, sizeof(want), "%s: %s", path, strerror(ENOENT));
    assert_string_equal(err, want);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
    free(path);

    /* a directory */
    const char *dir = getenv("TMPDIR");
    dir = dir && *dir ? dir : "/tmp";
    assert_int_equal(ovld_config_load(&cfg, dir, err, sizeof(err)), OVL_ERR_CONFIG);
    assert_non_null(strstr(err, "not a regular file"));

    /* a NUL byte, on line 2 */
    static const char with_nul[] = "max_jobs = 1\nmax_conn\0ections = 2\n";
    path = write_temp(with_nul, sizeof(with_nul) - 1);
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_ERR_CONFIG);
    snprintf(want, sizeof(want), "%s:2: NUL byte in file", path);
    assert_string_equal(err, want);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
    unlink(path);
    free(path);
}

static void test_load_size_limit(void **state)
{
    (void)state;
    ovld_config_t cfg;
    char err[512], want[600];
    size_t mib = 1024 * 1024;
    char *big = malloc(mib + 1);
    assert_non_null(big);

    /* exactly 1 MiB of comment lines, the last one a setting: accepted */
    memset(big, '#', mib);
    for (size_t i = 99; i < mib; i += 100)
        big[i] = '\n';
    const char *last = "\nmax_jobs = 5\n";
    memcpy(big + mib - strlen(last), last, strlen(last));
    char *path = write_temp(big, mib);
    ovld_config_defaults(&cfg);
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_OK);
    assert_int_equal(cfg.max_jobs, 5);
    unlink(path);
    free(path);

    /* one byte more: refused */
    big[mib] = '\n';
    path = write_temp(big, mib + 1);
    assert_int_equal(ovld_config_load(&cfg, path, err, sizeof(err)), OVL_ERR_CONFIG);
    snprintf(want, sizeof(want), "%s: file larger than 1 MiB", path);
    assert_string_equal(err, want);
    unlink(path);
    free(path);
    free(big);
}

/* ---------------------------------------------------------- the sample */

static void test_sample_parses(void **state)
{
    (void)state;
    ovld_config_t cfg, def;
    char err[512];

    ovld_config_defaults(&def);
    cfg = def;
    ovl_status_t r = ovld_config_load(&cfg, SAMPLE_PATH, err, sizeof(err));
    if (r != OVL_OK)
        fail_msg("%s", err);
    assert_config_equal(&cfg, &def);
}

static int key_index(const char *s, size_t len)
{
    for (size_t i = 0; i < NELEM(all_keys); i++)
        if (strlen(all_keys[i]) == len && strncmp(all_keys[i], s, len) == 0)
            return (int)i;
    return -1;
}

/*
 * Uncomments every "# key = value" line of the sample (key a known key,
 * exactly one blank after the '#', as the sample writes its settings; prose
 * and indented examples do not match) and checks that the result parses to
 * the defaults: the values the sample shows are the real defaults. Also
 * checks that every key but socket_group has such a line: socket_group's
 * default (unset) cannot be written as a value, so the sample describes it
 * in prose.
 */
static void test_sample_defaults_are_real(void **state)
{
    (void)state;
    char *text = read_file(SAMPLE_PATH);
    char *out = malloc(strlen(text) + 1);
    assert_non_null(out);
    unsigned seen[NELEM(all_keys)] = {0};

    char *o = out;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line + 1) : strlen(line);
        const char *s = line;
        if (strncmp(s, "# ", 2) == 0) {
            size_t klen = strspn(s + 2, "abcdefghijklmnopqrstuvwxyz_");
            const char *after = s + 2 + klen;
            int k = key_index(s + 2, klen);
            if (k >= 0 && strncmp(after, " = ", 3) == 0) {
                seen[k]++;
                len -= 2;
                line += 2;
            }
        }
        memcpy(o, line, len);
        o += len;
        line += len;
    }
    *o = '\0';

    for (size_t i = 0; i < NELEM(all_keys); i++) {
        unsigned want = default_unset(all_keys[i]) ? 0 : 1;
        if (seen[i] != want)
            fail_msg("the sample has %u commented default line(s) for %s, expected %u", seen[i],
                     all_keys[i], want);
        /* and the key is documented: named in the sample's prose */
        char doc[64];
        snprintf(doc, sizeof(doc), "\n# %s: ", all_keys[i]);
        if (!strstr(text, doc))
            fail_msg("the sample has no comment block starting \"# %s: \"", all_keys[i]);
    }

    ovld_config_t cfg, def;
    char err[512];
    ovld_config_defaults(&def);
    /* parse over a config that differs from the defaults in every field, so
     * that a key silently skipped would show */
    memset(&cfg, 0, sizeof(cfg));
    strcpy(cfg.socket_path, "/nonsense");
    cfg.socket_mode = 01;
    cfg.log_level = OVLD_LOG_ERROR;
    cfg.backend = OVLD_BACKEND_CUDA;
    cfg.default_algo = OVL_ALGO_RING;
    cfg.default_chunks = 3;
    cfg.default_streams = 3;
    cfg.replay_cache = 3;
    cfg.capture_streams = 3;
    cfg.allgather = OVL_AG_COPY;
    cfg.max_mappings = 3; /* the default, auto, is 0 */
    cfg.peer_timeout_ms = 3;
    ovl_status_t r = ovld_config_parse(&cfg, "ovld.conf (uncommented)", out, err, sizeof(err));
    if (r != OVL_OK)
        fail_msg("%s", err);
    assert_config_equal(&cfg, &def);
    free(out);
    free(text);
}

/* ---------------------------------------------------------------- names */

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(ovld_log_level_name(OVLD_LOG_ERROR), "error");
    assert_string_equal(ovld_log_level_name(OVLD_LOG_WARN), "warn");
    assert_string_equal(ovld_log_level_name(OVLD_LOG_INFO), "info");
    assert_string_equal(ovld_log_level_name(OVLD_LOG_DEBUG), "debug");
    assert_string_equal(ovld_log_level_name((ovld_log_level_t)5), "unknown");
    assert_string_equal(ovld_log_level_name((ovld_log_level_t)-1), "unknown");

    assert_string_equal(ovld_backend_kind_name(OVLD_BACKEND_AUTO), "auto");
    assert_string_equal(ovld_backend_kind_name(OVLD_BACKEND_HOST), "host");
    assert_string_equal(ovld_backend_kind_name(OVLD_BACKEND_CUDA), "cuda");
    assert_string_equal(ovld_backend_kind_name((ovld_backend_kind_t)3), "unknown");

    /* every name parses back to its value */
    ovld_log_level_t levels[] = {OVLD_LOG_ERROR, OVLD_LOG_WARN, OVLD_LOG_INFO, OVLD_LOG_DEBUG};
    for (size_t i = 0; i < NELEM(levels); i++)
        assert_int_equal(parse_ok(kv("log_level", ovld_log_level_name(levels[i]))).log_level,
                         levels[i]);
    ovld_backend_kind_t kinds[] = {OVLD_BACKEND_AUTO, OVLD_BACKEND_HOST, OVLD_BACKEND_CUDA};
    for (size_t i = 0; i < NELEM(kinds); i++)
        assert_int_equal(parse_ok(kv("backend", ovld_backend_kind_name(kinds[i]))).backend,
                         kinds[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_empty_text),
        cmocka_unit_test(test_every_key),
        cmocka_unit_test(test_enum_values),
        cmocka_unit_test(test_overlay),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_line_length),
        cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_integer_syntax),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_limit_keys),
        cmocka_unit_test(test_max_mappings),
        cmocka_unit_test(test_socket_mode),
        cmocka_unit_test(test_socket_path),
        cmocka_unit_test(test_socket_group),
        cmocka_unit_test(test_error_buffers),
        cmocka_unit_test(test_untouched_on_error),
        cmocka_unit_test(test_peer_keys),
        cmocka_unit_test(test_peer_allow),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_load_size_limit),
        cmocka_unit_test(test_sample_parses),
        cmocka_unit_test(test_sample_defaults_are_real),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}

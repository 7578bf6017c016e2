/*
 * fuzz_config.c: libFuzzer target for ovld's configuration parser
 * (ovld_config_parse, daemon/util/config.c) over arbitrary text. The file is
 * written by an operator, not a client, but it is read again on every
 * SIGHUP and a bad one must be refused whole, with a message that says
 * where.
 *
 * Input: the text itself (a NUL-terminated copy of it: ovld_config_load
 * refuses a file with a NUL byte before the parser sees it, so what
 * follows a NUL here is simply not parsed).
 *
 * Properties (any failure aborts):
 * - the outcome is OVL_OK or OVL_ERR_CONFIG, and the same onto the
 *   defaults and onto a config with every field changed (a line's validity
 *   does not depend on the base);
 * - on OVL_OK every field lies in its documented range (config.h,
 *   docs/config.md), strings are NUL-terminated in their arrays, a socket
 *   path is absolute and not a directory, a group name has only the
 *   allowed characters; and writing the result back as text and parsing
 *   that onto the defaults gives the same config (nothing is accepted that
 *   the parser cannot read back);
 * - on error the config is byte for byte what it was, and the message is
 *   "NAME:LINE: ..." with the name given and a line number of the text;
 *   the lines before that line have no error of their own (the first bad
 *   line is the one named; their whole may fail only the checks across
 *   the peer_* keys, which run on the whole file: across_keys); a shorter
 *   buffer gets the same message cut to fit, and errlen 0 writes nothing.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "config.h"
#include "ovl.h"

#define FUZZ_NAME "fuzz_config"
#include "fuzz_main.h"

#define NAME    "fuzz.conf"
#define ERR_LEN 512u

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)

/* Every field changed from its default, each within its range. */
static void other_config(ovld_config_t *c)
{
    ovld_config_defaults(c);
    snprintf(c->socket_path, sizeof(c->socket_path), "/tmp/other/ovld.sock");
    snprintf(c->socket_group, sizeof(c->socket_group), "ovl");
    c->socket_mode = 0600;
    c->log_level = OVLD_LOG_DEBUG;
    c->backend = OVLD_BACKEND_HOST;
    c->host_devices = 3;
    c->max_frame_bytes = 8 * KIB;
    c->max_connections = 7;
    c->max_registrations = 9;
    c->max_mapped_bytes = 5 * MIB;
    c->max_ops_in_flight = 11;
    c->max_jobs = 13;
    c->max_connections_per_uid = 17;
    c->max_jobs_per_uid = 19;
    c->max_ranks_per_uid = 37;
    c->max_registrations_per_uid = 23;
    c->max_mapped_bytes_per_uid = 29 * MIB;
    c->max_mappings = 31;
    c->hello_timeout_ms = 250;
    c->default_algo = OVL_ALGO_RING;
    c->default_chunks = 4;
    c->default_streams = 2;
    c->hold_limit_ms = 7;
    c->gate_spin_ms = 3;
    c->replay_cache = 5;
    c->capture_streams = 2;
    c->allgather = OVL_AG_COPY;
    c->peer_timeout_ms = 1500;
    c->tune_samples = 3;
    c->tune_entries = 77;
    c->tune_entries_per_uid = 9;
    snprintf(c->state_dir, sizeof(c->state_dir), "/var/lib/ovl-other");
    c->n_peer_allow = 2;
    c->peer_allow[0] = (ovld_net_t){.family = AF_INET, .prefix = 8, .addr = {10}};
    c->peer_allow[1] = (ovld_net_t){.family = AF_INET6, .prefix = 128, .addr = {0xfd, [15] = 1}};
}

static bool terminated(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

static void check_in_range(const ovld_config_t *c)
{
    CHECK(terminated(c->socket_path, sizeof(c->socket_path)));
    size_t plen = strlen(c->socket_path);
    CHECK(plen >= 1 && c->socket_path[0] == '/' && c->socket_path[plen - 1] != '/');
    CHECK(terminated(c->socket_group, sizeof(c->socket_group)));
    CHECK(c->socket_group[0] != '-');
    for (const char *g = c->socket_group; *g; g++)
        CHECK((*g >= 'a' && *g <= 'z') || (*g >= 'A' && *g <= 'Z') || (*g >= '0' && *g <= '9') ||
              *g == '_' || *g == '.' || *g == '-');
    CHECK(c->socket_mode <= 0777);
    CHECK(c->log_level == OVLD_LOG_ERROR || c->log_level == OVLD_LOG_WARN ||
          c->log_level == OVLD_LOG_INFO || c->log_level == OVLD_LOG_DEBUG);
    CHECK(c->backend == OVLD_BACKEND_AUTO || c->backend == OVLD_BACKEND_HOST ||
          c->backend == OVLD_BACKEND_CUDA);
    CHECK(c->host_devices >= 1 && c->host_devices <= 64);
    CHECK(c->max_frame_bytes >= 4 * KIB && c->max_frame_bytes <= 64 * MIB);
    CHECK(c->max_connections >= 1 && c->max_connections <= 65536);
    CHECK(c->max_registrations >= 1 && c->max_registrations <= MIB);
    CHECK(c->max_mapped_bytes >= 4 * KIB);
    CHECK(c->max_ops_in_flight >= 1 && c->max_ops_in_flight <= 4096);
    CHECK(c->max_jobs >= 1 && c->max_jobs <= 65536);
    CHECK(c->max_connections_per_uid >= 1 && c->max_connections_per_uid <= 65536);
    CHECK(c->max_jobs_per_uid >= 1 && c->max_jobs_per_uid <= 65536);
    CHECK(c->max_ranks_per_uid >= 1 && c->max_ranks_per_uid <= 65536);
    CHECK(c->max_registrations_per_uid >= 1 && c->max_registrations_per_uid <= MIB);
    CHECK(c->max_mapped_bytes_per_uid >= 4 * KIB);
    CHECK(c->max_mappings == OVLD_MAX_MAPPINGS_AUTO ||
          (c->max_mappings >= 1 && c->max_mappings <= 16 * MIB));
    CHECK(c->hello_timeout_ms >= 100 && c->hello_timeout_ms <= 600000);
    CHECK(c->default_algo >= OVL_ALGO_AUTO && c->default_algo < OVL_ALGO_COUNT);
    CHECK(ovl_algo_name(c->default_algo) != NULL);
    CHECK(c->default_chunks <= 64);
    CHECK(c->default_streams <= 8);
    CHECK(c->hold_limit_ms <= 3600000);
    CHECK(c->gate_spin_ms <= 60000);
    CHECK(c->replay_cache <= 256);
    CHECK(c->capture_streams <= 8);
    CHECK(ovl_ag_pref_name(c->allgather) != NULL);
    CHECK(c->peer_timeout_ms >= 500 && c->peer_timeout_ms <= 60000);
    CHECK(c->tune_samples <= 64);
    CHECK(c->tune_entries >= 1 && c->tune_entries <= 65536);
    CHECK(c->tune_entries_per_uid >= 1 && c->tune_entries_per_uid <= 65536);
    CHECK(terminated(c->state_dir, sizeof(c->state_dir)));
    CHECK(!c->state_dir[0] || c->state_dir[0] == '/');
    CHECK(terminated(c->peer_listen, sizeof(c->peer_listen)));
    CHECK(terminated(c->peer_advertise, sizeof(c->peer_advertise)));
    CHECK(terminated(c->peer_key_file, sizeof(c->peer_key_file)));
    /* the peer_* keys go together (check_peer_keys) */
    CHECK(c->peer_listen[0] || !c->peer_advertise[0]);
    CHECK(!c->peer_listen[0] || c->peer_key_file[0] == '/');
    /* peer_allow: at most OVLD_PEER_ALLOW_MAX networks, each a family with
     * its prefix in range and no bit set past it; nothing past the last */
    CHECK(c->n_peer_allow <= OVLD_PEER_ALLOW_MAX);
    for (uint32_t i = 0; i < OVLD_PEER_ALLOW_MAX; i++) {
        const ovld_net_t *n = &c->peer_allow[i];
        if (i >= c->n_peer_allow) {
            static const ovld_net_t zero;
            CHECK(memcmp(n, &zero, sizeof(zero)) == 0);
            continue;
        }
        CHECK(n->family == AF_INET || n->family == AF_INET6);
        unsigned bits = n->family == AF_INET ? 32 : 128;
        CHECK(n->prefix <= bits);
        for (unsigned b = n->prefix; b < 128; b++)
            CHECK(!(n->addr[b / 8] & (0x80u >> (b % 8))));
    }
}

/* The config as a file, every key set (socket_group, state_dir and the
 * peer_* text keys only when set: an empty value is an error). */
static size_t render(const ovld_config_t *c, char *out, size_t cap)
{
    char mappings[24], allow[2048];
    ovld_config_peer_allow_format(c, allow, sizeof(allow));
    if (c->max_mappings == OVLD_MAX_MAPPINGS_AUTO)
        snprintf(mappings, sizeof(mappings), "auto");
    else
        snprintf(mappings, sizeof(mappings), "%" PRIu32, c->max_mappings);
    int n = snprintf(
        out, cap,
        "socket = %s\n%s%s%ssocket_mode = %o\nlog_level = %s\nbackend = %s\n"
        "host_devices = %" PRIu32 "\nmax_frame_bytes = %" PRIu32 "\nmax_connections = %" PRIu32
        "\nmax_registrations = %" PRIu32 "\nmax_mapped_bytes = %" PRIu64
        "\nmax_ops_in_flight = %" PRIu32 "\nmax_jobs = %" PRIu32
        "\nmax_connections_per_uid = %" PRIu32 "\nmax_jobs_per_uid = %" PRIu32
        "\nmax_ranks_per_uid = %" PRIu32 "\nmax_registrations_per_uid = %" PRIu32
        "\nmax_mapped_bytes_per_uid = %" PRIu64 "\nmax_mappings = %s\nhello_timeout_ms = %" PRIu32
        "\ndefault_algo = %s\n"
        "default_chunks = %" PRIu32 "\ndefault_streams = %" PRIu32 "\nhold_limit_ms = %" PRIu32
        "\ngate_spin_ms = %" PRIu32 "\nreplay_cache = %" PRIu32 "\ncapture_streams = %" PRIu32
        "\nallgather = %s\npeer_timeout_ms = %" PRIu32 "\ntune_samples = %" PRIu32
        "\ntune_entries = %" PRIu32 "\ntune_entries_per_uid = %" PRIu32
        "\n%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s",
        c->socket_path, c->socket_group[0] ? "socket_group = " : "", c->socket_group,
        c->socket_group[0] ? "\n" : "", c->socket_mode, ovld_log_level_name(c->log_level),
        ovld_backend_kind_name(c->backend), c->host_devices, c->max_frame_bytes, c->max_connections,
        c->max_registrations, c->max_mapped_bytes, c->max_ops_in_flight, c->max_jobs,
        c->max_connections_per_uid, c->max_jobs_per_uid, c->max_ranks_per_uid,
        c->max_registrations_per_uid, c->max_mapped_bytes_per_uid, mappings, c->hello_timeout_ms,
        ovl_algo_name(c->default_algo), c->default_chunks, c->default_streams, c->hold_limit_ms,
        c->gate_spin_ms, c->replay_cache, c->capture_streams, ovl_ag_pref_name(c->allgather),
        c->peer_timeout_ms, c->tune_samples, c->tune_entries, c->tune_entries_per_uid,
        c->state_dir[0] ? "state_dir = " : "", c->state_dir, c->state_dir[0] ? "\n" : "",
        c->peer_listen[0] ? "peer_listen = " : "", c->peer_listen, c->peer_listen[0] ? "\n" : "",
        c->peer_advertise[0] ? "peer_advertise = " : "", c->peer_advertise,
        c->peer_advertise[0] ? "\n" : "", c->peer_key_file[0] ? "peer_key_file = " : "",
        c->peer_key_file, c->peer_key_file[0] ? "\n" : "", allow[0] ? "peer_allow = " : "", allow,
        allow[0] ? "\n" : "");
    CHECK(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

/* Whether a parse's message is one of the checks across keys
 * (check_peer_keys): "NAME:LINE: " then the key, a space (a key's own
 * error has a colon there) and one of its phrases. */
static bool across_keys(const char *err)
{
    const char *p = strchr(err, ':');
    p = p ? strchr(p + 1, ':') : NULL;
    if (!p || p[1] != ' ')
        return false;
    p += 2;
    if (strncmp(p, "peer_listen needs peer_key_file ", 32) == 0 ||
        strncmp(p, "peer_advertise is set but peer_listen is not", 44) == 0)
        return true;
    if (strncmp(p, "peer_listen ", 12) == 0)
        return strstr(p, " is a wildcard: set peer_advertise to ") != NULL;
    if (strncmp(p, "peer_advertise ", 15) == 0)
        return strstr(p, " is a wildcard: other nodes cannot reach it") != NULL;
    return false;
}

/* "NAME:LINE: ..." with LINE in 1..lines; returns LINE. */
static size_t message_line(const char *err, size_t lines)
{
    size_t nl = strlen(NAME);
    CHECK(strncmp(err, NAME ":", nl + 1) == 0);
    const char *p = err + nl + 1;
    size_t line = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 20) {
        line = line * 10 + (size_t)(*p - '0');
        p++;
        digits++;
    }
    CHECK(digits > 0 && digits < 20);
    CHECK(p[0] == ':' && p[1] == ' ' && p[2] != '\0');
    CHECK(line >= 1 && line <= lines);
    return line;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    CHECK(text != NULL);
    if (size)
        memcpy(text, data, size);
    text[size] = '\0';
    size_t tlen = strlen(text);
    /* lines as the parser counts them: a last line needs no "\n" */
    size_t lines = 0;
    for (size_t i = 0; i < tlen; i++)
        lines += text[i] == '\n';
    if (tlen > 0 && text[tlen - 1] != '\n')
        lines++;

    ovld_config_t base, cfg, alt_base, alt;
    ovld_config_defaults(&base);
    cfg = base;
    other_config(&alt_base);
    alt = alt_base;
    char err[ERR_LEN], err2[ERR_LEN];
    memset(err, 0xaa, sizeof(err));
    memset(err2, 0xaa, sizeof(err2));
    ovl_status_t st = ovld_config_parse(&cfg, NAME, text, err, sizeof(err));
    ovl_status_t st2 = ovld_config_parse(&alt, NAME, text, err2, sizeof(err2));
    CHECK(st == OVL_OK || st == OVL_ERR_CONFIG);
    CHECK(st2 == st);
    CHECK(terminated(err, sizeof(err)) && terminated(err2, sizeof(err2)));

    if (st == OVL_OK) {
        check_in_range(&cfg);
        check_in_range(&alt);
        /* Read back from text: the same config. */
        static char out[8192];
        render(&cfg, out, sizeof(out));
        ovld_config_t back;
        ovld_config_defaults(&back);
        char berr[ERR_LEN];
        ovl_status_t bst = ovld_config_parse(&back, "rendered", out, berr, sizeof(berr));
        if (bst != OVL_OK)
            fprintf(stderr, "%s\n--- rendered:\n%s", berr, out);
        CHECK(bst == OVL_OK);
        CHECK(memcmp(&back, &cfg, sizeof(cfg)) == 0);
    } else {
        CHECK(memcmp(&cfg, &base, sizeof(cfg)) == 0);
        CHECK(memcmp(&alt, &alt_base, sizeof(alt)) == 0);
        CHECK(strcmp(err, err2) == 0);
        size_t line = message_line(err, lines);

        /* The lines before the one named are good: none has an error of
         * its own. Their whole may still fail the checks across keys (the
         * peer_* keys go together: check_peer_keys), which run once the
         * file is read, on the whole of it. */
        size_t cut = 0;
        for (size_t l = 1; l < line; l++) {
            const char *nl = strchr(text + cut, '\n');
            CHECK(nl != NULL);
            cut = (size_t)(nl - text) + 1;
        }
        char keep = text[cut];
        text[cut] = '\0';
        ovld_config_t pre;
        ovld_config_defaults(&pre);
        char perr[ERR_LEN];
        ovl_status_t pst = ovld_config_parse(&pre, NAME, text, perr, sizeof(perr));
        bool across = pst != OVL_OK && across_keys(perr);
        if (pst != OVL_OK && !across)
            fprintf(stderr, "fuzz_config: '%s' but the lines before: '%s'\n", err, perr);
        CHECK(pst == OVL_OK || across);
        text[cut] = keep;

        /* Short buffers: the same message cut; none at all: nothing. */
        static const size_t lens[] = {1, 10, 11, 40};
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            char small[41];
            memset(small, 0x55, sizeof(small));
            ovld_config_t c2 = base;
            CHECK(ovld_config_parse(&c2, NAME, text, small, lens[i]) == st);
            CHECK(small[lens[i]] == 0x55);
            CHECK(memchr(small, '\0', lens[i]) != NULL);
            CHECK(strncmp(small, err, lens[i] - 1) == 0);
            CHECK(strlen(small) == strnlen(err, lens[i] - 1));
            CHECK(memcmp(&c2, &base, sizeof(c2)) == 0);
        }
        char none = 0x55;
        ovld_config_t c3 = base;
        CHECK(ovld_config_parse(&c3, NAME, text, &none, 0) == st);
        CHECK(none == 0x55);
    }
    free(text);
    return 0;
}

/* ------------------------------------------------------------- standalone */

#ifdef OVL_FUZZ_STANDALONE

static void run_text(const char *s)
{
    fuzz_run((const uint8_t *)s, strlen(s));
}

/* Values for every key: good ones, edges, bad ones. */
/* clang-format off */
static const char *const keys[] = {
    "socket", "socket_group", "socket_mode", "log_level", "backend", "host_devices",
    "max_frame_bytes", "max_connections", "max_registrations", "max_mapped_bytes",
    "max_ops_in_flight", "max_jobs", "max_connections_per_uid", "max_jobs_per_uid",
    "max_ranks_per_uid", "max_registrations_per_uid", "max_mapped_bytes_per_uid", "max_mappings",
    "hello_timeout_ms", "default_algo", "default_chunks", "default_streams", "hold_limit_ms",
    "gate_spin_ms", "replay_cache", "capture_streams", "allgather", "peer_listen",
    "peer_advertise", "peer_key_file", "peer_timeout_ms", "peer_allow", "tune_samples",
    "tune_entries", "tune_entries_per_uid", "state_dir", "unknown_key"};
static const char *const values[] = {
    "0", "1", "2", "7", "8", "9", "63", "64", "65", "99", "100", "4095", "4096", "4097",
    "65535", "65536", "65537", "1048576", "1048577", "16777216", "16777217", "600000", "600001",
    "4294967295", "4294967296", "18446744073709551615", "18446744073709551616", "-1", "+1",
    " 1", "1 ", "0x10", "1e3", "4K", "4k", "4KiB", "4kb", "3K", "64M", "64MiB", "65M", "1G",
    "1T", "16777215T", "16777216T", "1P", "1KB2", "1Ki", "0660", "660", "0777", "01000", "8",
    "0o660", "auto", "host", "cuda", "naive", "collective", "ring", "error", "warn", "info",
    "debug", "INFO", "/run/ovl/ovld.sock", "/", "/run/ovl/", "relative", "ovl", "-ovl",
    "ovl.users_1", "ovl group", "\xc3\xa9", "", "=", "#", "a=b", "nccl", "copy", "3600000",
    "3600001", "60000", "60001", "256", "257", "127.0.0.1:7000", "0.0.0.0:7000", "[::1]:7000",
    "host:7000", "127.0.0.1:0", "127.0.0.1:65536", "/etc/ovl/cluster.key", "10.0.0.0/8",
    "10.1.2.3/8", "10.0.0.1/33", "10.0.0.1/", "::/0", "fd00::5/64, 127.0.0.1", "0.0.0.0/0",
    "fe80::1/129", "10.0.0.1,,10.0.0.2", ",", "1.2.3.4 5.6.7.8\t9.9.9.9", "[::1]"};
/* clang-format on */

static void fuzz_builtin(void)
{
    char buf[512];
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
        for (size_t v = 0; v < sizeof(values) / sizeof(values[0]); v++) {
            snprintf(buf, sizeof(buf), "%s = %s\n", keys[k], values[v]);
            run_text(buf);
            /* after a good line and a comment, without the final newline */
            snprintf(buf, sizeof(buf), "# c\nmax_jobs = 5\r\n\t%s=%s # trailing", keys[k],
                     values[v]);
            run_text(buf);
        }
    /* every key at once, twice, and with lines of every kind */
    run_text("socket = /run/ovl/ovld.sock\nsocket_group = ovl\nsocket_mode = 0660\n"
             "log_level = info\nbackend = auto\nhost_devices = 8\nmax_frame_bytes = 1M\n"
             "max_connections = 1024\nmax_registrations = 4096\nmax_mapped_bytes = 1T\n"
             "max_ops_in_flight = 64\nmax_jobs = 256\nmax_connections_per_uid = 128\n"
             "max_jobs_per_uid = 32\nmax_ranks_per_uid = 64\n"
             "max_registrations_per_uid = 16384\n"
             "max_mapped_bytes_per_uid = 4T\nmax_mappings = auto\nhello_timeout_ms = 5000\n"
             "default_algo = auto\ndefault_chunks = 0\ndefault_streams = 0\n"
             "hold_limit_ms = 10000\ngate_spin_ms = 1000\nreplay_cache = 16\n"
             "capture_streams = 8\nallgather = auto\npeer_timeout_ms = 2000\n");
    /* the peer_* keys together, each way they go or fail together */
    run_text("peer_listen = 127.0.0.1:7000\npeer_key_file = /etc/ovl/cluster.key\n"
             "peer_timeout_ms = 4000\n");
    run_text("peer_listen = 0.0.0.0:7000\npeer_advertise = 10.0.0.2:7000\n"
             "peer_key_file = /etc/ovl/cluster.key\n");
    run_text("peer_listen = 0.0.0.0:7000\npeer_key_file = /etc/ovl/cluster.key\n");
    run_text("peer_advertise = 10.0.0.2:7000\n");
    run_text("peer_listen = 127.0.0.1:7000\n");
    /* an error after lines that fail only the checks across keys */
    run_text("peer_advertise = 10.0.0.2:7000\npeer_listen = 127.0.0.1:7000\nmax_jobs = x\n");
    run_text("peer_listen = 0.0.0.0:7000\npeer_key_file = /k\nmax_jobs = x\n");
    run_text("peer_listen = [::]:7000\npeer_advertise = [::]:7000\npeer_key_file = /k\n"
             "max_jobs = x\n");
    run_text("max_jobs = 1\nmax_jobs = 2\n");
    run_text("\n\n\n  \t \n# only comments\n#max_jobs = x\n");
    run_text("max_jobs\n");
    run_text(" = 5\n");
    run_text("max_jobs = \n");
    run_text("max_jobs = 5\x01\n");
    run_text("max_jobs = 5\x7f\n");
    run_text("max_jobs = 5\rmax_jobs = 6\n");
    run_text("\r\n\r\nmax_jobs = 5\r\n");
    run_text("max_jobs = 5\r\r\n");
    /* a NUL ends the text */
    fuzz_run((const uint8_t *)"max_jobs = 5\n\0max_jobs = x\n", 27);
    /* lines at and past the 4096-byte limit, with and without "\r" */
    {
        static char big[4200];
        for (size_t len = 4094; len <= 4098; len++) {
            memset(big, ' ', len);
            memcpy(big, "max_jobs = 5", 12);
            big[len] = '\0';
            run_text(big);
            big[len] = '\r';
            big[len + 1] = '\n';
            big[len + 2] = '\0';
            run_text(big);
        }
        memset(big, '#', 4150);
        big[4150] = '\0';
        run_text(big);
    }
    /* long values: quoted cut to 64 bytes in messages */
    memset(buf, 'x', sizeof(buf));
    memcpy(buf, "socket = /", 10);
    buf[300] = '\0';
    run_text(buf);
    memcpy(buf, "socket_group = ", 15);
    run_text(buf);
    memcpy(buf, "unknown_kex = ", 14);
    run_text(buf);
    /* socket paths around sun_path */
    for (size_t len = 105; len <= 109; len++) {
        memset(buf, 'p', sizeof(buf));
        memcpy(buf, "socket = /", 10);
        buf[9 + len] = '\0';
        run_text(buf);
    }
    /* group names around 63 characters */
    for (size_t len = 62; len <= 65; len++) {
        memset(buf, 'g', sizeof(buf));
        memcpy(buf, "socket_group = ", 15);
        buf[15 + len] = '\0';
        run_text(buf);
    }
    /* random lines built from keys, values and separators */
    static const char *const seps[] = {" = ", "=", " =", "= ", "\t=\t", " ", " == ", ":"};
    for (int i = 0; i < 20000; i++) {
        size_t n = 0;
        int nlines = 1 + (int)(fuzz_prng() % 4);
        for (int l = 0; l < nlines && n < 400; l++) {
            uint32_t x = fuzz_prng();
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s%s%s%s", x & 0x100 ? "" : " ",
                                  keys[x % (sizeof(keys) / sizeof(keys[0]))],
                                  seps[(x >> 9) % (sizeof(seps) / sizeof(seps[0]))],
                                  values[(x >> 12) % (sizeof(values) / sizeof(values[0]))],
                                  x & 0x80000 ? "\n" : (x & 0x100000 ? "\r\n" : " # c\n"));
        }
        if (n < sizeof(buf) && (fuzz_prng() & 3) == 0 && n > 0)
            buf[fuzz_prng() % n] = (char)fuzz_prng(); /* a byte changed */
        fuzz_run((const uint8_t *)buf, n < sizeof(buf) ? n : sizeof(buf) - 1);
    }
    fuzz_run(NULL, 0);
}

#endif /* OVL_FUZZ_STANDALONE */

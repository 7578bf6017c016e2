/*
 * config.c: ovld's configuration file (the format is in config.h and
 * docs/config.md; deploy/ovld.conf is the sample).
 *
 * Every key is one row of `keys[]`: its name, the kind of value it takes, the
 * field it fills and, for numbers, its range. Adding a key means one row here,
 * one field in config.h, and the documentation in docs/config.md and
 * deploy/ovld.conf (the unit tests check that the sample names every key).
 *
 * The parser writes into a copy of the caller's config and hands it back only
 * when the whole text is good: a reload with one typo changes nothing rather
 * than half the settings.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define TIB (GIB * 1024)

#define CONFIG_LINE_MAX 4096 /* bytes in one line, its "\n" or "\r\n" not counted */
#define CONFIG_FILE_MAX (1024 * 1024)
#define SHOW_MAX        64 /* a key or value quoted in a message is cut to this */

/* The documented ranges (config.h, docs, sample) repeat the planner's limits;
 * if the planner's change, those texts must change with them. */
_Static_assert(OVL_PLAN_MAX_CHUNKS == 64, "default_chunks is documented as 0..64");
_Static_assert(OVL_PLAN_MAX_STREAMS == 8, "default_streams is documented as 0..8");
_Static_assert(sizeof(OVL_DEFAULT_SOCKET) <= OVLD_CONFIG_PATH_MAX, "default socket too long");

typedef enum value_kind {
    V_SOCKET,    /* absolute path that fits in sun_path */
    V_GROUP,     /* group name, not looked up */
    V_MODE,      /* octal permission bits */
    V_LOG_LEVEL, /* error | warn | info | debug */
    V_BACKEND,   /* auto | host | cuda */
    V_ALGO,      /* an ovl_algo_t name */
    V_ALLGATHER, /* an ovl_ag_pref_t name: auto | nccl | copy */
    V_UINT,      /* decimal integer */
    V_SIZE,      /* decimal integer with an optional K/M/G/T suffix */
    V_UINT_AUTO, /* "auto" (stored as 0) or a decimal integer; lo >= 1 */
    V_ADDR,      /* ADDRESS:PORT, numeric (ovld_config_addr_parse) */
    V_PATH,      /* an absolute path that fits the field */
    V_NETS,      /* ADDRESS[/PREFIX], ... (peer_allow); hi: how many at most */
} value_kind_t;

typedef struct key_spec {
    const char *name;
    value_kind_t kind;
    size_t offset; /* of the field in ovld_config_t */
    size_t size;   /* of the field: V_UINT and V_SIZE store 4 or 8 bytes */
    uint64_t lo, hi;
} key_spec_t;

#define FIELD(f) offsetof(ovld_config_t, f), sizeof(((ovld_config_t *)0)->f)

static const key_spec_t keys[] = {
    {"socket", V_SOCKET, FIELD(socket_path), 0, 0},
    {"socket_group", V_GROUP, FIELD(socket_group), 0, 0},
    {"socket_mode", V_MODE, FIELD(socket_mode), 0, 0777},
    {"log_level", V_LOG_LEVEL, FIELD(log_level), 0, 0},
    {"backend", V_BACKEND, FIELD(backend), 0, 0},
    {"host_devices", V_UINT, FIELD(host_devices), 1, 64},
    {"max_frame_bytes", V_SIZE, FIELD(max_frame_bytes), 4 * KIB, 64 * MIB},
    {"max_connections", V_UINT, FIELD(max_connections), 1, 65536},
    {"max_registrations", V_UINT, FIELD(max_registrations), 1, MIB},
    {"max_mapped_bytes", V_SIZE, FIELD(max_mapped_bytes), 4 * KIB, UINT64_MAX},
    {"max_ops_in_flight", V_UINT, FIELD(max_ops_in_flight), 1, 4096},
    {"max_jobs", V_UINT, FIELD(max_jobs), 1, 65536},
    {"max_connections_per_uid", V_UINT, FIELD(max_connections_per_uid), 1, 65536},
    {"max_jobs_per_uid", V_UINT, FIELD(max_jobs_per_uid), 1, 65536},
    {"max_ranks_per_uid", V_UINT, FIELD(max_ranks_per_uid), 1, 65536},
    {"max_registrations_per_uid", V_UINT, FIELD(max_registrations_per_uid), 1, MIB},
    {"max_mapped_bytes_per_uid", V_SIZE, FIELD(max_mapped_bytes_per_uid), 4 * KIB, UINT64_MAX},
    {"max_mappings", V_UINT_AUTO, FIELD(max_mappings), 1, 16 * MIB},
    {"hello_timeout_ms", V_UINT, FIELD(hello_timeout_ms), 100, 600000},
    {"hold_limit_ms", V_UINT, FIELD(hold_limit_ms), 0, 3600000},
    {"gate_spin_ms", V_UINT, FIELD(gate_spin_ms), 0, 60000},
    {"default_algo", V_ALGO, FIELD(default_algo), 0, 0},
    {"default_chunks", V_UINT, FIELD(default_chunks), 0, OVL_PLAN_MAX_CHUNKS},
    {"default_streams", V_UINT, FIELD(default_streams), 0, OVL_PLAN_MAX_STREAMS},
    {"replay_cache", V_UINT, FIELD(replay_cache), 0, 256},
    {"capture_streams", V_UINT, FIELD(capture_streams), 0, OVL_PLAN_MAX_STREAMS},
    {"tune_samples", V_UINT, FIELD(tune_samples), 0, 64},
    {"tune_entries", V_UINT, FIELD(tune_entries), 1, 65536},
    {"tune_entries_per_uid", V_UINT, FIELD(tune_entries_per_uid), 1, 65536},
    {"state_dir", V_PATH, FIELD(state_dir), 0, 0},
    {"allgather", V_ALLGATHER, FIELD(allgather), 0, 0},
    {"peer_listen", V_ADDR, FIELD(peer_listen), 0, 0},
    {"peer_advertise", V_ADDR, FIELD(peer_advertise), 0, 0},
    {"peer_key_file", V_PATH, FIELD(peer_key_file), 0, 0},
    {"peer_timeout_ms", V_UINT, FIELD(peer_timeout_ms), 500, 60000},
    {"peer_allow", V_NETS, FIELD(peer_allow), 1, OVLD_PEER_ALLOW_MAX},
};

typedef struct named_value {
    const char *name;
    int value;
} named_value_t;

static const named_value_t log_levels[] = {
    {"error", OVLD_LOG_ERROR},
    {"warn", OVLD_LOG_WARN},
    {"info", OVLD_LOG_INFO},
    {"debug", OVLD_LOG_DEBUG},
};

static const named_value_t backends[] = {
    {"auto", OVLD_BACKEND_AUTO},
    {"host", OVLD_BACKEND_HOST},
    {"cuda", OVLD_BACKEND_CUDA},
};

void ovld_config_defaults(ovld_config_t *cfg)
{
    /* Zero first so that padding, and the unused tail of the strings, are
     * the same in every default config: callers may compare with memcmp. */
    memset(cfg, 0, sizeof(*cfg));
    memcpy(cfg->socket_path, OVL_DEFAULT_SOCKET, sizeof(OVL_DEFAULT_SOCKET));
    cfg->socket_group[0] = '\0';
    cfg->socket_mode = 0660;
    cfg->log_level = OVLD_LOG_INFO;
    cfg->backend = OVLD_BACKEND_AUTO;
    cfg->host_devices = 8;
    cfg->max_frame_bytes = (uint32_t)MIB;
    cfg->max_connections = 1024;
    cfg->max_registrations = 4096;
    cfg->max_mapped_bytes = TIB;
    cfg->max_ops_in_flight = 64;
    cfg->max_jobs = 256;
    cfg->max_connections_per_uid = 128;
    cfg->max_jobs_per_uid = 32;
    cfg->max_ranks_per_uid = 64;
    cfg->max_registrations_per_uid = 16384;
    cfg->max_mapped_bytes_per_uid = 4 * TIB;
    cfg->max_mappings = OVLD_MAX_MAPPINGS_AUTO;
    cfg->hello_timeout_ms = 5000;
    cfg->hold_limit_ms = 10000;
    cfg->gate_spin_ms = 1000;
    cfg->default_algo = OVL_ALGO_AUTO;
    cfg->default_chunks = 0;
    cfg->default_streams = 0;
    cfg->replay_cache = 16;
    cfg->capture_streams = 8;
    cfg->tune_samples = 5;
    cfg->tune_entries = 1024;
    cfg->tune_entries_per_uid = 256;
    cfg->allgather = OVL_AG_AUTO;
    cfg->peer_timeout_ms = 2000;
}

static const char *name_of(const named_value_t *table, size_t n, int value)
{
    for (size_t i = 0; i < n; i++)
        if (table[i].value == value)
            return table[i].name;
    return "unknown";
}

/* Never NULL: an out-of-range value reads "unknown", so that a message can
 * print the result without a check. */
const char *ovld_log_level_name(ovld_log_level_t level)
{
    return name_of(log_levels, NELEM(log_levels), (int)level);
}

const char *ovld_backend_kind_name(ovld_backend_kind_t kind)
{
    return name_of(backends, NELEM(backends), (int)kind);
}

/* ------------------------------------------------------------- messages */

typedef struct parser {
    const char *name; /* the file name in messages */
    size_t line;      /* 1-based number of the line being parsed */
    char *err;
    size_t errlen;
} parser_t;

/*
 * Writes "NAME:LINE: <fmt...>" into the parser's error buffer (when it has
 * one; truncated to fit) and returns OVL_ERR_CONFIG, so that callers can
 * `return fail(...)`.
 */
static ovl_status_t fail(const parser_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static ovl_status_t fail(const parser_t *p, const char *fmt, ...)
{
    if (p->errlen == 0)
        return OVL_ERR_CONFIG;
    int n = snprintf(p->err, p->errlen, "%s:%zu: ", p->name, p->line);
    if (n >= 0 && (size_t)n < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        (void)vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return OVL_ERR_CONFIG;
}

/* Quoting user text in messages: SHOW(s) expands to the arguments of
 * "%.*s%s", cutting s to SHOW_MAX bytes and marking the cut with "...", so
 * that a 4000-byte value cannot push the file and line out of the buffer. */
#define SHOW(s)                                                                                    \
    (int)(strlen(s) > SHOW_MAX ? SHOW_MAX : strlen(s)), (s), (strlen(s) > SHOW_MAX ? "..." : "")

/* Formats a byte count for a range message: with the largest binary suffix
 * that divides it exactly, so "64M" rather than "67108864". */
static void format_size(uint64_t v, char *buf, size_t len)
{
    static const struct {
        uint64_t unit;
        char suffix;
    } units[] = {{TIB, 'T'}, {GIB, 'G'}, {MIB, 'M'}, {KIB, 'K'}};

    for (size_t i = 0; i < NELEM(units); i++)
        if (v != 0 && v % units[i].unit == 0) {
            (void)snprintf(buf, len, "%llu%c", (unsigned long long)(v / units[i].unit),
                           units[i].suffix);
            return;
        }
    (void)snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* --------------------------------------------------------------- values */

typedef enum num_result {
    NUM_OK,
    NUM_SYNTAX,   /* not a number of the expected form */
    NUM_OVERFLOW, /* well formed, but more than 64 bits hold */
} num_result_t;

static bool ascii_ieq(char a, char b)
{
    if (a >= 'A' && a <= 'Z')
        a = (char)(a - 'A' + 'a');
    if (b >= 'A' && b <= 'Z')
        b = (char)(b - 'A' + 'a');
    return a == b;
}

/*
 * Converts the digits s[0, ndigits) in `base` (8 or 10) to *ret. The caller
 * has checked that s starts with ndigits > 0 digits of that base, and that
 * what follows them is no digit: strtoull alone would accept leading blanks
 * and a sign ("-1" silently becomes 2^64-1); here it only converts, with its
 * overflow check.
 */
static num_result_t convert_digits(const char *s, size_t ndigits, int base, uint64_t *ret)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno == ERANGE)
        return NUM_OVERFLOW;
    if (errno != 0 || end != s + ndigits)
        return NUM_SYNTAX;
#if ULLONG_MAX > UINT64_MAX
    if (v > UINT64_MAX)
        return NUM_OVERFLOW;
#endif
    *ret = (uint64_t)v;
    return NUM_OK;
}

/* A decimal integer: digits only, nothing before or after. */
static num_result_t parse_uint(const char *s, uint64_t *ret)
{
    size_t n = strspn(s, "0123456789");
    if (n == 0 || s[n] != '\0')
        return NUM_SYNTAX;
    return convert_digits(s, n, 10, ret);
}

/*
 * A size: a decimal integer, then optionally (no blank between) one of
 * K, M, G, T (binary multiples), which may be followed by "B" or "iB"; case
 * does not matter ("64M", "64MiB", "64mb" are the same).
 */
static num_result_t parse_size(const char *s, uint64_t *ret)
{
    static const char suffixes[] = "KMGT";
    size_t n = strspn(s, "0123456789");
    if (n == 0)
        return NUM_SYNTAX;

    const char *rest = s + n;
    unsigned shift = 0;
    if (*rest != '\0') {
        size_t i = 0;
        while (i < sizeof(suffixes) - 1 && !ascii_ieq(*rest, suffixes[i]))
            i++;
        if (i == sizeof(suffixes) - 1)
            return NUM_SYNTAX;
        shift = 10 * (unsigned)(i + 1);
        rest++;
        if (ascii_ieq(rest[0], 'i') && ascii_ieq(rest[1], 'b'))
            rest += 2;
        else if (ascii_ieq(rest[0], 'b'))
            rest += 1;
        if (*rest != '\0')
            return NUM_SYNTAX;
    }

    uint64_t v;
    num_result_t r = convert_digits(s, n, 10, &v);
    if (r != NUM_OK)
        return r;
    if (v > (UINT64_MAX >> shift))
        return NUM_OVERFLOW;
    *ret = v << shift;
    return NUM_OK;
}

/* Permission bits in octal, with or without the leading 0 ("0660", "660"). */
static num_result_t parse_mode(const char *s, uint64_t *ret)
{
    size_t n = strspn(s, "01234567");
    if (n == 0 || s[n] != '\0')
        return NUM_SYNTAX;
    return convert_digits(s, n, 8, ret);
}

/* Group names as useradd and systemd-sysusers take them, less the rarely
 * used forms: what the kernel would accept is much wider, but a name an
 * operator can type into groupadd is what belongs in a config file. */
static bool valid_group(const char *s)
{
    if (s[0] == '-')
        return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '.' || *c == '-'))
            return false;
    return true;
}

static bool lookup_name(const named_value_t *table, size_t n, const char *name, int *ret)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0) {
            *ret = table[i].value;
            return true;
        }
    return false;
}

/* "error, warn, info, debug": the accepted names, for a message. */
static void list_names(const named_value_t *table, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", table[i].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

static void list_algos(char *buf, size_t len)
{
    named_value_t table[OVL_ALGO_COUNT];
    for (size_t n = 0; n < OVL_ALGO_COUNT; n++)
        table[n] = (named_value_t){ovl_algo_name((ovl_algo_t)n), (int)n};
    list_names(table, OVL_ALGO_COUNT, buf, len);
}

static void list_ag_prefs(char *buf, size_t len)
{
    named_value_t table[OVL_AG_PREF_COUNT];
    for (size_t n = 0; n < OVL_AG_PREF_COUNT; n++)
        table[n] = (named_value_t){ovl_ag_pref_name((ovl_ag_pref_t)n), (int)n};
    list_names(table, OVL_AG_PREF_COUNT, buf, len);
}

static void store_uint(ovld_config_t *cfg, const key_spec_t *key, uint64_t v)
{
    char *field = (char *)cfg + key->offset;
    if (key->size == sizeof(uint64_t)) {
        uint64_t v64 = v;
        memcpy(field, &v64, sizeof(v64));
    } else {
        /* key->hi <= UINT32_MAX for every 4-byte field, checked by the range */
        uint32_t v32 = (uint32_t)v;
        memcpy(field, &v32, sizeof(v32));
    }
}

/* ------------------------------------------------------------ addresses */

static ovl_status_t addr_bad(char *err, size_t errlen, const char *why)
{
    if (errlen > 0)
        (void)snprintf(err, errlen, "%s", why);
    return OVL_ERR_INVALID;
}

ovl_status_t ovld_config_addr_parse(const char *text, struct sockaddr_storage *ret, char *err,
                                    size_t errlen)
{
    char host[OVLD_ADDR_TEXT_MAX];
    const char *port;
    size_t len = strlen(text);

    if (len >= sizeof(host))
        return addr_bad(err, errlen, "too long");
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':')
            return addr_bad(err, errlen, "expected [IPV6]:PORT");
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || strchr(text, ':') != colon)
            return addr_bad(err, errlen, "expected IPV4:PORT or [IPV6]:PORT");
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    uint64_t pv;
    if (parse_uint(port, &pv) != NUM_OK || pv < 1 || pv > 65535)
        return addr_bad(err, errlen, "the port must be 1..65535");
    memset(ret, 0, sizeof(*ret));
    struct sockaddr_in *v4 = (struct sockaddr_in *)ret;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ret;
    if (text[0] != '[' && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)pv);
        return OVL_OK;
    }
    if (text[0] == '[' && inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)pv);
        return OVL_OK;
    }
    return addr_bad(err, errlen, "not a numeric IPv4 or [IPv6] address (names are not looked up)");
}

/* Parses "ADDRESS" or "ADDRESS/PREFIX" (IPv4, or IPv6 without brackets)
 * into *ret, the bits past the prefix cleared. */
static ovl_status_t net_parse(const char *text, ovld_net_t *ret, char *err, size_t errlen)
{
    char host[64];
    const char *slash = strchr(text, '/');
    size_t hl = slash ? (size_t)(slash - text) : strlen(text);
    if (hl == 0 || hl >= sizeof(host))
        return addr_bad(err, errlen, "not an ADDRESS or ADDRESS/PREFIX");
    memcpy(host, text, hl);
    host[hl] = '\0';
    memset(ret, 0, sizeof(*ret));
    unsigned bits;
    if (inet_pton(AF_INET, host, ret->addr) == 1) {
        ret->family = AF_INET;
        bits = 32;
    } else if (inet_pton(AF_INET6, host, ret->addr) == 1) {
        ret->family = AF_INET6;
        bits = 128;
    } else {
        return addr_bad(err, errlen,
                        "not a numeric IPv4 or IPv6 address, with an optional /PREFIX (names "
                        "are not looked up)");
    }
    uint64_t prefix = bits;
    if (slash && (parse_uint(slash + 1, &prefix) != NUM_OK || prefix > bits))
        return addr_bad(err, errlen,
                        bits == 32 ? "the prefix must be 0..32" : "the prefix must be 0..128");
    ret->prefix = (uint8_t)prefix;
    for (unsigned b = (unsigned)prefix; b < bits; b++)
        ret->addr[b / 8] &= (uint8_t) ~(0x80u >> (b % 8));
    return OVL_OK;
}

static bool net_contains(const ovld_net_t *n, const struct sockaddr_storage *a)
{
    const uint8_t *bytes;
    if (a->ss_family != n->family)
        return false;
    if (a->ss_family == AF_INET)
        bytes = (const uint8_t *)&((const struct sockaddr_in *)a)->sin_addr;
    else if (a->ss_family == AF_INET6)
        bytes = ((const struct sockaddr_in6 *)a)->sin6_addr.s6_addr;
    else
        return false;
    unsigned full = n->prefix / 8, rest = n->prefix % 8;
    if (memcmp(bytes, n->addr, full) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xffu << (8 - rest));
    return (bytes[full] & mask) == n->addr[full];
}

int ovld_config_peer_allowed(const ovld_config_t *cfg, const struct sockaddr_storage *a)
{
    for (uint32_t i = 0; i < cfg->n_peer_allow && i < OVLD_PEER_ALLOW_MAX; i++)
        if (net_contains(&cfg->peer_allow[i], a))
            return 1;
    return 0;
}

void ovld_config_peer_allow_format(const ovld_config_t *cfg, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    for (uint32_t i = 0; i < cfg->n_peer_allow && i < OVLD_PEER_ALLOW_MAX && used < len; i++) {
        const ovld_net_t *n = &cfg->peer_allow[i];
        char host[INET6_ADDRSTRLEN];
        if (!inet_ntop(n->family == AF_INET ? AF_INET : AF_INET6, n->addr, host, sizeof(host)))
            snprintf(host, sizeof(host), "?");
        int w = snprintf(buf + used, len - used, "%s%s/%u", i ? ", " : "", host, n->prefix);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

int ovld_config_addr_is_any(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &in6addr_any,
                      sizeof(in6addr_any)) == 0;
    return 0;
}

/* Checks a parsed number against the key's range and stores it; `r` and `v`
 * come from the kind's parser, `what` names the expected form. */
static ovl_status_t apply_number(const parser_t *p, ovld_config_t *cfg, const key_spec_t *key,
                                 const char *value, num_result_t r, uint64_t v, const char *what)
{
    char lo[32], hi[32];

    if (r == NUM_SYNTAX)
        return fail(p, "%s: '%.*s%s' is not %s", key->name, SHOW(value), what);
    if (key->kind == V_SIZE) {
        format_size(key->lo, lo, sizeof(lo));
        format_size(key->hi, hi, sizeof(hi));
    } else if (key->kind == V_MODE) {
        (void)snprintf(lo, sizeof(lo), "%#llo", (unsigned long long)key->lo);
        (void)snprintf(hi, sizeof(hi), "%#llo", (unsigned long long)key->hi);
    } else {
        (void)snprintf(lo, sizeof(lo), "%llu", (unsigned long long)key->lo);
        (void)snprintf(hi, sizeof(hi), "%llu", (unsigned long long)key->hi);
    }
    if (key->hi == UINT64_MAX) {
        /* no upper bound but 64 bits: "..18446744073709551615" helps nobody */
        if (r == NUM_OVERFLOW)
            return fail(p, "%s: '%.*s%s' does not fit in 64 bits", key->name, SHOW(value));
        if (v < key->lo)
            return fail(p, "%s: '%.*s%s' is less than the minimum %s", key->name, SHOW(value), lo);
    } else if (r == NUM_OVERFLOW || v < key->lo || v > key->hi) {
        return fail(p, "%s: '%.*s%s' is out of range %s..%s", key->name, SHOW(value), lo, hi);
    }

    store_uint(cfg, key, v);
    return OVL_OK;
}

/* Parses `value` (trimmed, not empty) for `key` into cfg. */
static ovl_status_t apply_value(const parser_t *p, ovld_config_t *cfg, const key_spec_t *key,
                                const char *value)
{
    char names[128];
    /* the parser runs before v is read: as arguments of one call, the order
     * of the two would be unspecified */
    num_result_t r;
    uint64_t v = 0;
    int e;
    size_t len = strlen(value);

    switch (key->kind) {
    case V_SOCKET:
        if (value[0] != '/')
            return fail(p, "%s: '%.*s%s' is not an absolute path", key->name, SHOW(value));
        if (value[len - 1] == '/')
            return fail(p, "%s: '%.*s%s' names a directory, not a socket", key->name, SHOW(value));
        if (len >= sizeof(cfg->socket_path))
            return fail(p, "%s: path is %zu bytes; a socket path holds at most %zu", key->name, len,
                        sizeof(cfg->socket_path) - 1);
        memcpy(cfg->socket_path, value, len + 1);
        return OVL_OK;

    case V_GROUP:
        if (len >= sizeof(cfg->socket_group))
            return fail(p, "%s: '%.*s%s' is longer than %zu characters", key->name, SHOW(value),
                        sizeof(cfg->socket_group) - 1);
        if (!valid_group(value))
            return fail(p,
                        "%s: '%.*s%s' is not a group name (letters, digits, '_', '.', '-'; "
                        "not starting with '-')",
                        key->name, SHOW(value));
        memcpy(cfg->socket_group, value, len + 1);
        return OVL_OK;

    case V_MODE:
        r = parse_mode(value, &v);
        return apply_number(p, cfg, key, value, r, v, "an octal mode such as 0660");

    case V_LOG_LEVEL:
        if (!lookup_name(log_levels, NELEM(log_levels), value, &e)) {
            list_names(log_levels, NELEM(log_levels), names, sizeof(names));
            return fail(p, "%s: '%.*s%s' is not one of %s", key->name, SHOW(value), names);
        }
        cfg->log_level = (ovld_log_level_t)e;
        return OVL_OK;

    case V_BACKEND:
        if (!lookup_name(backends, NELEM(backends), value, &e)) {
            list_names(backends, NELEM(backends), names, sizeof(names));
            return fail(p, "%s: '%.*s%s' is not one of %s", key->name, SHOW(value), names);
        }
        cfg->backend = (ovld_backend_kind_t)e;
        return OVL_OK;

    case V_ALGO: {
        ovl_algo_t algo;
        if (ovl_algo_parse(value, &algo) != OVL_OK) {
            list_algos(names, sizeof(names));
            return fail(p, "%s: '%.*s%s' is not one of %s", key->name, SHOW(value), names);
        }
        cfg->default_algo = algo;
        return OVL_OK;
    }

    case V_ALLGATHER: {
        ovl_ag_pref_t pref;
        if (ovl_ag_pref_parse(value, &pref) != OVL_OK) {
            list_ag_prefs(names, sizeof(names));
            return fail(p, "%s: '%.*s%s' is not one of %s", key->name, SHOW(value), names);
        }
        cfg->allgather = pref;
        return OVL_OK;
    }

    case V_UINT:
        r = parse_uint(value, &v);
        return apply_number(p, cfg, key, value, r, v, "a decimal integer");

    case V_SIZE:
        r = parse_size(value, &v);
        return apply_number(p, cfg, key, value, r, v,
                            "a size (an integer with an optional K, M, G or T suffix)");

    case V_ADDR: {
        struct sockaddr_storage ss;
        char why[96];
        if (len >= OVLD_ADDR_TEXT_MAX)
            return fail(p, "%s: '%.*s%s' is longer than %d characters", key->name, SHOW(value),
                        OVLD_ADDR_TEXT_MAX - 1);
        if (ovld_config_addr_parse(value, &ss, why, sizeof(why)) != OVL_OK)
            return fail(p, "%s: '%.*s%s': %s", key->name, SHOW(value), why);
        memcpy((char *)cfg + key->offset, value, len + 1);
        return OVL_OK;
    }

    case V_PATH:
        if (value[0] != '/')
            return fail(p, "%s: '%.*s%s' is not an absolute path", key->name, SHOW(value));
        if (len >= key->size)
            return fail(p, "%s: path is %zu bytes; at most %zu", key->name, len, key->size - 1);
        memcpy((char *)cfg + key->offset, value, len + 1);
        return OVL_OK;

    case V_NETS: {
        /* networks separated by commas or blanks; the whole list replaces
         * what was there, so that a reload drops a network taken out */
        ovld_net_t nets[OVLD_PEER_ALLOW_MAX];
        uint32_t n = 0;
        char item[80], why[96];
        memset(nets, 0, sizeof(nets));
        for (const char *c = value; *c;) {
            if (*c == ',' || *c == ' ' || *c == '\t') {
                c++;
                continue;
            }
            size_t il = strcspn(c, ", \t");
            if (n == key->hi)
                return fail(p, "%s: more than %llu networks", key->name,
                            (unsigned long long)key->hi);
            if (il >= sizeof(item))
                return fail(p, "%s: '%.*s%s' is not an ADDRESS or ADDRESS/PREFIX", key->name,
                            SHOW(c));
            memcpy(item, c, il);
            item[il] = '\0';
            if (net_parse(item, &nets[n], why, sizeof(why)) != OVL_OK)
                return fail(p, "%s: '%.*s%s': %s", key->name, SHOW(item), why);
            n++;
            c += il;
        }
        if (n < key->lo)
            return fail(p, "%s: no network in '%.*s%s'", key->name, SHOW(value));
        memcpy(cfg->peer_allow, nets, sizeof(nets));
        cfg->n_peer_allow = n;
        return OVL_OK;
    }

    case V_UINT_AUTO:
        /* 0 stands for auto, which is why the range starts at 1: a written
         * "0" is refused rather than read as auto */
        if (strcmp(value, "auto") == 0) {
            store_uint(cfg, key, 0);
            return OVL_OK;
        }
        r = parse_uint(value, &v);
        return apply_number(p, cfg, key, value, r, v, "'auto' or a decimal integer");
    }
    return fail(p, "%s: internal error: unknown value kind", key->name);
}

/* ---------------------------------------------------------------- lines */

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* Trims blanks at both ends of s in place; returns the new start. */
static char *trim(char *s)
{
    while (is_blank(*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && is_blank(s[n - 1]))
        n--;
    s[n] = '\0';
    return s;
}

/*
 * Parses one line (its terminator removed, at most CONFIG_LINE_MAX bytes,
 * modified in place) into cfg. first_line[i] is the line on which keys[i]
 * was set, 0 if not yet: a key given twice is an error rather than "last one
 * wins", because two values for one key in a file are almost always an edit
 * that went wrong.
 */
static ovl_status_t parse_line(parser_t *p, ovld_config_t *cfg, size_t first_line[], char *line)
{
    /* Control characters cannot be meant, and would otherwise be echoed into
     * log lines by the messages below. A tab is a blank. */
    for (const char *c = line; *c; c++) {
        unsigned char u = (unsigned char)*c;
        if ((u < 0x20 && u != '\t') || u == 0x7f)
            return fail(p, "control character 0x%02x in line", u);
    }

    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    char *s = trim(line);
    if (*s == '\0')
        return OVL_OK;

    char *eq = strchr(s, '=');
    if (!eq)
        return fail(p, "expected 'key = value', got '%.*s%s'", SHOW(s));
    *eq = '\0';
    char *name = trim(s);
    char *value = trim(eq + 1);
    if (*name == '\0')
        return fail(p, "missing key before '='");

    size_t i = 0;
    while (i < NELEM(keys) && strcmp(keys[i].name, name) != 0)
        i++;
    if (i == NELEM(keys))
        return fail(p, "unknown key '%.*s%s'", SHOW(name));
    if (first_line[i] != 0)
        return fail(p, "duplicate key '%s' (first on line %zu)", keys[i].name, first_line[i]);
    first_line[i] = p->line;
    if (*value == '\0')
        return fail(p, "%s: missing value", keys[i].name);
    return apply_value(p, cfg, &keys[i], value);
}

static size_t key_index(const char *name)
{
    size_t i = 0;
    while (i < NELEM(keys) && strcmp(keys[i].name, name) != 0)
        i++;
    return i;
}

/* The peer_* keys go together: a listener needs the cluster key, and an
 * address others can reach (peer_advertise where peer_listen is a
 * wildcard). Reported on the line of the key that needs the other one. */
static ovl_status_t check_peer_keys(parser_t *p, const ovld_config_t *cfg,
                                    const size_t first_line[])
{
    size_t li = key_index("peer_listen"), ai = key_index("peer_advertise");
    p->line = first_line[li] ? first_line[li] : first_line[ai];
    if (cfg->peer_listen[0] == '\0') {
        if (cfg->peer_advertise[0] != '\0')
            return fail(p, "peer_advertise is set but peer_listen is not");
        return OVL_OK;
    }
    if (cfg->peer_key_file[0] == '\0')
        return fail(p, "peer_listen needs peer_key_file (the cluster key every node shares)");
    struct sockaddr_storage ss;
    if (ovld_config_addr_parse(cfg->peer_listen, &ss, NULL, 0) == OVL_OK &&
        ovld_config_addr_is_any(&ss)) {
        if (cfg->peer_advertise[0] == '\0')
            return fail(p,
                        "peer_listen %s is a wildcard: set peer_advertise to the address other "
                        "nodes reach this one at",
                        cfg->peer_listen);
    }
    if (cfg->peer_advertise[0] != '\0' &&
        ovld_config_addr_parse(cfg->peer_advertise, &ss, NULL, 0) == OVL_OK &&
        ovld_config_addr_is_any(&ss)) {
        p->line = first_line[ai];
        return fail(p, "peer_advertise %s is a wildcard: other nodes cannot reach it",
                    cfg->peer_advertise);
    }
    return OVL_OK;
}

/*
 * Lines end at "\n"; a "\r" right before it (or before the end of the text)
 * is dropped, so files written on Windows read the same. The last line needs
 * no "\n".
 */
ovl_status_t ovld_config_parse(ovld_config_t *cfg, const char *name, const char *text, char *err,
                               size_t errlen)
{
    parser_t p = {.name = name ? name : "(config)", .line = 0, .err = err, .errlen = errlen};
    size_t first_line[NELEM(keys)] = {0};
    char buf[CONFIG_LINE_MAX + 1];

    if (errlen > 0)
        err[0] = '\0';
    if (!cfg || !text) {
        if (errlen > 0)
            (void)snprintf(err, errlen, "ovld_config_parse: NULL argument");
        return OVL_ERR_INVALID;
    }

    ovld_config_t next = *cfg;
    const char *s = text;
    while (*s != '\0') {
        p.line++;
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        const char *after = nl ? nl + 1 : s + len;
        if (len > 0 && s[len - 1] == '\r')
            len--;
        if (len > CONFIG_LINE_MAX)
            return fail(&p, "line longer than %d bytes", CONFIG_LINE_MAX);
        memcpy(buf, s, len);
        buf[len] = '\0';

        ovl_status_t r = parse_line(&p, &next, first_line, buf);
        if (r != OVL_OK)
            return r;
        s = after;
    }

    ovl_status_t r = check_peer_keys(&p, &next, first_line);
    if (r != OVL_OK)
        return r;
    *cfg = next;
    return OVL_OK;
}

/* ----------------------------------------------------------------- file */

/*
 * Only a regular file is read: O_NONBLOCK keeps open() from hanging on a
 * FIFO with no writer (a daemon re-reading its config on SIGHUP must not
 * block), and the fstat check then refuses it. The file is read to its end
 * rather than trusting st_size, which an editor may change under us; one
 * byte past the limit is enough to tell "too large".
 *
 * Returns OVL_ERR_CONFIG for every problem with the file or its text, and
 * OVL_ERR_NOMEM if the buffer cannot be had.
 */
ovl_status_t ovld_config_load(ovld_config_t *cfg, const char *path, char *err, size_t errlen)
{
    ovl_status_t status;
    char *buf = NULL;
    size_t n = 0;
    int fd = -1;
    struct stat st;
    const char *nul;

    if (errlen > 0)
        err[0] = '\0';
    if (!cfg || !path) {
        if (errlen > 0)
            (void)snprintf(err, errlen, "ovld_config_load: NULL argument");
        return OVL_ERR_INVALID;
    }

    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        goto sys_error;
    if (fstat(fd, &st) < 0)
        goto sys_error;
    if (!S_ISREG(st.st_mode)) {
        if (errlen > 0)
            (void)snprintf(err, errlen, "%s: not a regular file", path);
        status = OVL_ERR_CONFIG;
        goto out;
    }

    buf = malloc(CONFIG_FILE_MAX + 2);
    if (!buf) {
        if (errlen > 0)
            (void)snprintf(err, errlen, "%s: out of memory", path);
        status = OVL_ERR_NOMEM;
        goto out;
    }
    for (;;) {
        ssize_t r = read(fd, buf + n, CONFIG_FILE_MAX + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            goto sys_error;
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > CONFIG_FILE_MAX) {
            if (errlen > 0)
                (void)snprintf(err, errlen, "%s: file larger than 1 MiB", path);
            status = OVL_ERR_CONFIG;
            goto out;
        }
    }
    buf[n] = '\0';

    /* The parser sees a C string: a NUL would silently end the file early. */
    nul = memchr(buf, '\0', n);
    if (nul) {
        parser_t p = {.name = path, .line = 1, .err = err, .errlen = errlen};
        for (const char *c = buf; c < nul; c++)
            p.line += *c == '\n';
        status = fail(&p, "NUL byte in file");
        goto out;
    }

    status = ovld_config_parse(cfg, path, buf, err, errlen);
    goto out;

sys_error:
    if (errlen > 0)
        (void)snprintf(err, errlen, "%s: %s", path, strerror(errno));
    status = OVL_ERR_CONFIG;
out:
    free(buf);
    if (fd >= 0)
        (void)close(fd);
    return status;
}

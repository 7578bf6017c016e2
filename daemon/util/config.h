/*
 * config.h: ovld's configuration file. Pure code: parsing never logs; errors
 * come back as a status and a message "FILE:LINE: what is wrong".
 *
 * Format (documented in docs/config.md and in deploy/ovld.conf): one
 * `key = value` per line; `#` starts a comment (to the end of the line,
 * outside nothing: values hold no `#`); blank lines are ignored; whitespace
 * around keys and values is trimmed. Unknown keys, duplicate keys, missing
 * `=`, empty values and bad values are errors.
 */
#ifndef OVLD_CONFIG_H
#define OVLD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "ovl.h"
#include "plan.h" /* ovl_ag_pref_t */

/* syslog priorities, as sd-daemon(3) prefixes use them */
typedef enum ovld_log_level {
    OVLD_LOG_ERROR = 3,
    OVLD_LOG_WARN = 4,
    OVLD_LOG_INFO = 6,
    OVLD_LOG_DEBUG = 7,
} ovld_log_level_t;

typedef enum ovld_backend_kind {
    OVLD_BACKEND_AUTO = 0, /* cuda where a GPU is present, else host */
    OVLD_BACKEND_HOST = 1,
    OVLD_BACKEND_CUDA = 2,
} ovld_backend_kind_t;

#define OVLD_CONFIG_PATH_MAX    108 /* sizeof(sun_path) */
#define OVLD_CONFIG_KEYPATH_MAX 256 /* peer_key_file */
#define OVLD_ADDR_TEXT_MAX      64  /* "[IPv6]:port" with room to spare */

#define OVLD_PEER_ALLOW_MAX 32 /* peer_allow: networks listed */

/* One network of peer_allow: an address and how many leading bits of it
 * count (a host: 32 or 128); the bits past prefix are zero. */
typedef struct ovld_net {
    uint8_t family; /* AF_INET or AF_INET6 */
    uint8_t prefix; /* 0..32 or 0..128 */
    uint8_t addr[16];
} ovld_net_t;

/* ovld_config_t.max_mappings: "auto", resolved by the daemon */
#define OVLD_MAX_MAPPINGS_AUTO 0u

typedef struct ovld_config {
    char socket_path[OVLD_CONFIG_PATH_MAX]; /* socket: default OVL_DEFAULT_SOCKET */
    char socket_group[64];                  /* socket_group: "" = leave the group alone */
    unsigned socket_mode;                   /* socket_mode: octal, default 0660 */
    ovld_log_level_t log_level;             /* log_level: error|warn|info|debug, default info */
    ovld_backend_kind_t backend;            /* backend: auto|host|cuda, default auto */
    uint32_t host_devices;                  /* host_devices: 1..64, default 8 */
    uint32_t max_frame_bytes;               /* max_frame_bytes: 4K..64M, default 1M */
    uint32_t max_connections;               /* max_connections: 1..65536, default 1024 */
    uint32_t max_registrations; /* max_registrations (per connection): 1..1M, default 4096 */
    uint64_t max_mapped_bytes;  /* max_mapped_bytes (per connection): >= 4K, default 1T */
    uint32_t max_ops_in_flight; /* max_ops_in_flight (per job): 1..4096, default 64 */
    uint32_t max_jobs;          /* max_jobs: 1..65536, default 256 */
    /* Per-uid limits bound a user's total over all its connections. */
    uint32_t max_connections_per_uid;   /* max_connections_per_uid: 1..65536, default 128 */
    uint32_t max_jobs_per_uid;          /* max_jobs_per_uid: 1..65536, default 32 */
    uint32_t max_ranks_per_uid;         /* max_ranks_per_uid: 1..65536, default 64 */
    uint32_t max_registrations_per_uid; /* max_registrations_per_uid: 1..1M, default 16384 */
    uint64_t max_mapped_bytes_per_uid;  /* max_mapped_bytes_per_uid: >= 4K, default 4T */
    /* max_mappings: client buffers mapped at once, over all users: auto (0)
     * or 1..16M. The parser stores 0 for auto; the daemon resolves it (half
     * of vm.max_map_count, read at start and on reload). */
    uint32_t max_mappings;
    uint32_t hello_timeout_ms; /* hello_timeout_ms: 100..600000, default 5000 */
    uint32_t hold_limit_ms;    /* hold_limit_ms: 0 (never)..3600000, default 10000 */
    uint32_t gate_spin_ms;     /* gate_spin_ms: 0 (never spin)..60000, default 1000 */
    ovl_algo_t default_algo;   /* default_algo: auto|naive|collective|ring|push */
    uint32_t default_chunks;   /* default_chunks: 0 (planner's choice)..64 */
    uint32_t default_streams;  /* default_streams: 0 (planner's choice)..8 */
    uint32_t replay_cache;     /* replay_cache: ops captured per job, 0 (off)..256 */
    ovl_ag_pref_t allgather;   /* allgather: auto|nccl|copy, default auto */
    /* capture_streams: streams a captured op forks to on a GPU that several
     * of its ranks share, 0 (each rank's own) or 1..8 (default 8). Read at
     * start only. */
    uint32_t capture_streams;
    /* `auto` that measures (docs/config.md; daemon/core/tune.h). Read at
     * start only. tune_samples: times kept per candidate, 0 (measuring
     * off: the rule alone)..64, default 5; tune_entries: shapes kept,
     * 1..65536, default 1024 (tune_entries_per_uid of them one user's);
     * state_dir: where the measured choices are
     * kept across restarts (an absolute path; "" (the default): systemd's
     * $STATE_DIRECTORY if set, else nowhere). */
    uint32_t tune_samples;
    uint32_t tune_entries;
    uint32_t tune_entries_per_uid; /* 1..65536, default 256: one user's shapes at most */
    char state_dir[OVLD_CONFIG_KEYPATH_MAX];
    /* Jobs across nodes (docs/multinode.md). Read at start only. */
    char peer_listen[OVLD_ADDR_TEXT_MAX];    /* peer_listen: ADDRESS:PORT, "" = off (default) */
    char peer_advertise[OVLD_ADDR_TEXT_MAX]; /* peer_advertise: ADDRESS:PORT, "" = peer_listen */
    char peer_key_file[OVLD_CONFIG_KEYPATH_MAX]; /* peer_key_file: absolute path */
    uint32_t peer_timeout_ms;                    /* peer_timeout_ms: 500..60000, default 2000 */
    /* peer_allow: the networks whose ovld a job id may make this one
     * connect to (1..OVLD_PEER_ALLOW_MAX of them); unset (0, the default):
     * only root and ovld's own user may name a node not linked already
     * (docs/config.md). Read at start and on reload. */
    ovld_net_t peer_allow[OVLD_PEER_ALLOW_MAX];
    uint32_t n_peer_allow;
} ovld_config_t;

/* Fills every field with its default. */
void ovld_config_defaults(ovld_config_t *cfg);

/*
 * Parses `text` (NUL-terminated; `name` is the file name used in messages)
 * over *cfg: keys present replace the values in *cfg, others are left as
 * they are. On error *cfg is left untouched, err (if errlen > 0) holds
 * "NAME:LINE: message" and OVL_ERR_CONFIG is returned.
 */
ovl_status_t ovld_config_parse(ovld_config_t *cfg, const char *name, const char *text, char *err,
                               size_t errlen);

/* Reads the file at path (at most 1 MiB) and parses it as above. A file that
 * cannot be read is OVL_ERR_CONFIG with "PATH: strerror". */
ovl_status_t ovld_config_load(ovld_config_t *cfg, const char *path, char *err, size_t errlen);

/* Parses "A.B.C.D:PORT" or "[IPV6]:PORT" (numeric addresses only, port
 * 1..65535) into *ret. OVL_ERR_INVALID with words in err if it is not one. */
struct sockaddr_storage;
ovl_status_t ovld_config_addr_parse(const char *text, struct sockaddr_storage *ret, char *err,
                                    size_t errlen);
/* Whether a is in one of cfg's peer_allow networks (false when none is
 * listed). */
int ovld_config_peer_allowed(const ovld_config_t *cfg, const struct sockaddr_storage *a);
/* "10.0.0.0/8, fd00::/8": cfg's peer_allow as the parser reads it back;
 * "" when unset. Cut to fit len. */
void ovld_config_peer_allow_format(const ovld_config_t *cfg, char *buf, size_t len);
/* Whether a parsed address is the wildcard (0.0.0.0 or ::). */
int ovld_config_addr_is_any(const struct sockaddr_storage *a);

/* Names for messages and `ovlctl status`. */
const char *ovld_log_level_name(ovld_log_level_t level);
const char *ovld_backend_kind_name(ovld_backend_kind_t kind);

#endif /* OVLD_CONFIG_H */

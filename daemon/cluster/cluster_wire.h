/*
 * cluster_wire.h: the messages of jobs across nodes (proto/cluster.proto,
 * cluster.h) as bytes: the checks every message from a peer passes before
 * the coordinator or a node acts on it, and the encoder. Pure code: no
 * libuv, no peers, no job state, no logging; tests/fuzz/fuzz_cluster.c
 * drives the decoder with any bytes.
 *
 * What the decoder cannot know is its caller's to check, with its state:
 * whether the job is one it knows and the sender one of its nodes, an
 * OpReady's seq against the node's last and its first_rank against the
 * world, a JobLeave's rank against the job's ranks on that node, whether a
 * JobStart's addresses parse and its rail keys fit the rail groups (the
 * latter with ovld_cluster_start_rails below: a start that fails those
 * fails on the node, it is not malformed).
 */
#ifndef OVLD_CLUSTER_WIRE_H
#define OVLD_CLUSTER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h" /* OVLD_ADDR_TEXT_MAX */
#include "desc.h"   /* ovld_op_fields_t */
#include "jobid.h"  /* OVLD_JOB_NONCE_LEN, OVLD_INSTANCE_LEN */
#include "ovl.h"

/* The message types (cluster.h: OVLD_CLUSTER_TYPE_FIRST to _LAST are this
 * module's; the rest of that range is refused). */
#define OVLD_CLUSTER_JOB_JOIN       16 /* a node to the coordinator */
#define OVLD_CLUSTER_JOB_JOIN_REPLY 17 /* the coordinator to a node */
#define OVLD_CLUSTER_JOB_START      18 /* the coordinator to every node */
#define OVLD_CLUSTER_OP_READY       19 /* a node to the coordinator */
#define OVLD_CLUSTER_OP_GO          20 /* the coordinator to every node */
#define OVLD_CLUSTER_JOB_LEAVE      21 /* a node to the coordinator */
#define OVLD_CLUSTER_JOB_END        22 /* the coordinator to every node */
#define OVLD_CLUSTER_OP_TIME        23 /* a node to the coordinator */

#define OVLD_CLUSTER_REASON_MAX  200        /* bytes of a reason; longer ones are cut */
#define OVLD_CLUSTER_BACKEND_MAX 16         /* a JobJoin's backend name, its NUL included */
#define OVLD_CLUSTER_NO_RANK     UINT32_MAX /* a JobLeave's rank: the node gives up the job */
#define OVLD_CLUSTER_KEY_LEN     128        /* a job key: backend.h's OVLD_NCCL_ID_LEN (checked) */

/* Every text below is clean (common/text.h), NUL-terminated in its
 * buffer. Every status is an ovl_status_t. */

/* JobJoin: may rank of world join, for uid, on the sender's device? */
typedef struct ovld_cluster_join_msg {
    uint64_t req;                           /* echoed in the reply */
    uint8_t instance[OVLD_INSTANCE_LEN];    /* the coordinator's run, from the id */
    uint32_t world;                         /* 1..OVL_PLAN_MAX_WORLD */
    uint32_t rank;                          /* < world */
    uint32_t uid;                           /* the client's on the sender's node */
    uint32_t device;                        /* the sender's numbering */
    char backend[OVLD_CLUSTER_BACKEND_MAX]; /* 1..15 bytes */
} ovld_cluster_join_msg_t;

/* JobJoinReply: admitted (OVL_OK) or why not. */
typedef struct ovld_cluster_join_reply_msg {
    uint64_t req;
    ovl_status_t status; /* OVL_ERR_PROTOCOL where the sender's is not a status */
    char reason[OVLD_CLUSTER_REASON_MAX + 1];
} ovld_cluster_join_reply_msg_t;

/* JobStart: every rank is in; the job's nodes. The arrays are malloc'd by
 * the decoder (ovld_cluster_msg_clear frees them); the encoder only reads
 * them. */
typedef struct ovld_cluster_start_msg {
    uint32_t world;                    /* 1..OVL_PLAN_MAX_WORLD */
    uint32_t nnodes;                   /* 1..world */
    uint32_t self_node;                /* < nnodes: the receiver's own node */
    uint32_t *node_of;                 /* world entries, dense: each < nnodes, each node named */
    char (*nodes)[OVLD_ADDR_TEXT_MAX]; /* nnodes advertised addresses, not empty, not parsed */
    bool has_key;                      /* key: the backend's job key */
    uint8_t key[OVLD_CLUSTER_KEY_LEN];
    /* Ranks share a GPU: instead of a key, one per rail group (1..world,
     * nrail_keys of OVLD_CLUSTER_KEY_LEN bytes, back to back); else 0, NULL. */
    uint32_t nrail_keys;
    uint8_t *rail_keys;
} ovld_cluster_start_msg_t;

/* OpReady: op seq is in on the sender's node, or fails there. */
typedef struct ovld_cluster_ready_msg {
    uint64_t seq;
    ovl_status_t status; /* a status: anything else is refused */
    char reason[OVLD_CLUSTER_REASON_MAX + 1];
    uint32_t first_rank; /* the node's lowest rank (32 bits; not checked against a world) */
    ovld_op_fields_t f;  /* nb 1..OVLD_MAX_BS, n_more's first nb - 1 entries, the rest 0 */
    bool strided, shared_gpu;
} ovld_cluster_ready_msg_t;

/* OpGo: op seq runs everywhere with these parameters, or fails. */
typedef struct ovld_cluster_go_msg {
    uint64_t seq;
    ovl_status_t status; /* OVL_ERR_PROTOCOL where the sender's is not a status */
    char reason[OVLD_CLUSTER_REASON_MAX + 1];
    /* With status OVL_OK: an algorithm (not auto), chunks and streams
     * within the planner's limits, an all-gather preference; else 0. */
    uint32_t algo, chunks, streams, allgather;
    bool strided, shared_gpu;
    bool timed; /* each node answers with an OpTime (with status OVL_OK only) */
} ovld_cluster_go_msg_t;

/* OpTime: how a timed op ended on the sender's node (0 ran, 1 failed for
 * its plan's reason, 2 for another's: tune.h's ovld_tune_outcome_t) and
 * its device time there (0: none). */
typedef struct ovld_cluster_time_msg {
    uint64_t seq, ns;
    uint32_t outcome;
} ovld_cluster_time_msg_t;

/* JobLeave: a rank left the sender's node, or (OVLD_CLUSTER_NO_RANK) the
 * node gives up the job. */
typedef struct ovld_cluster_leave_msg {
    uint32_t rank;
    bool abort;
    char reason[OVLD_CLUSTER_REASON_MAX + 1];
} ovld_cluster_leave_msg_t;

/* JobEnd: the job takes no more ops, or (abort) fails what is pending. */
typedef struct ovld_cluster_end_msg {
    bool abort;
    ovl_status_t status; /* an error: OVL_ERR_ABORTED where the sender's is 0 or not a status */
    char reason[OVLD_CLUSTER_REASON_MAX + 1];
} ovld_cluster_end_msg_t;

/* One message, decoded (or to encode). */
typedef struct ovld_cluster_msg {
    uint32_t type;
    /* After a refusal, what is still known, so that the receiver can
     * answer the message or charge it to its job: unpacked: the body
     * unpacked as type's message, and its req (JobJoin, JobJoinReply) or
     * seq (OpReady, OpGo, OpTime) is set; named: nonce is set too. After OVL_OK
     * unpacked is true, and named too but for a JobJoinReply (which names
     * no job). The encoder ignores both. */
    bool unpacked, named;
    uint8_t nonce[OVLD_JOB_NONCE_LEN]; /* the job; every type but JobJoinReply */
    union {
        ovld_cluster_join_msg_t join;
        ovld_cluster_join_reply_msg_t join_reply;
        ovld_cluster_start_msg_t start;
        ovld_cluster_ready_msg_t ready;
        ovld_cluster_go_msg_t go;
        ovld_cluster_leave_msg_t leave;
        ovld_cluster_end_msg_t end;
        ovld_cluster_time_msg_t time;
    };
} ovld_cluster_msg_t;

/* The type's name for messages ("JobJoin", ..., "message type 23"); buf
 * holds what is not a constant. */
const char *ovld_cluster_type_name(uint32_t type, char *buf, size_t len);

/* Whether type is one of the eight messages (16 to 23). */
bool ovld_cluster_type_known(uint32_t type);

/* Frees what a decoded message holds (a JobStart's arrays); m may be
 * zeroed, and one the decoder refused. */
void ovld_cluster_msg_clear(ovld_cluster_msg_t *m);

/*
 * Decodes the body of a message of type. OVL_OK and *ret filled
 * (ovld_cluster_msg_clear it), or a refusal, err saying what, ret holding
 * no memory and unpacked and named saying what of it is known:
 * - OVL_ERR_PROTOCOL: a type not of the eight, or a body that does not
 *   unpack (unpacked false); else a field out of its range (unpacked; named
 *   but for a nonce not of 16 bytes):
 *   - JobJoin: an instance not of 16 bytes, world 0 or over
 *     OVL_PLAN_MAX_WORLD, a rank not under world, a uid or a device past 32
 *     bits, a backend name of 0 or over 15 bytes;
 *   - JobStart: world as JobJoin's, node_of not of world entries, no node
 *     or more than world, self_node not a node, a key neither empty nor of
 *     OVLD_CLUSTER_KEY_LEN bytes, rail keys along with a key or more than
 *     world, a rail key not of OVLD_CLUSTER_KEY_LEN bytes, a rank's node not a
 *     node, a node with no rank, an address empty or of OVLD_ADDR_TEXT_MAX
 *     bytes or more;
 *   - OpReady: nb 0 or over OVLD_MAX_BS, n_more not of nb - 1 entries, a
 *     first_rank, dtype, algo, chunks or streams past 32 bits, a status
 *     that is not one;
 *   - OpGo: with status 0 only, algo auto or unknown, chunks over
 *     OVL_PLAN_MAX_CHUNKS, streams over OVL_PLAN_MAX_STREAMS, an unknown
 *     all-gather preference: err is then "the coordinator's parameters
 *     for op SEQ are out of range" (the words a node fails the op with);
 *   - JobLeave: a rank past 32 bits;
 *   - OpTime: an outcome past 2;
 * - OVL_ERR_NOMEM (unpacked, named): no memory for a JobStart's arrays.
 * A reason is not refused for its length: it is cut at
 * OVLD_CLUSTER_REASON_MAX bytes on a character's boundary; every text is
 * made clean (ovl_text_sanitize: a byte that is not clean text becomes
 * '?'). Unknown protobuf fields are ignored (a later version may add some).
 */
ovl_status_t ovld_cluster_decode(uint32_t type, const void *body, size_t len,
                                 ovld_cluster_msg_t *ret, char *err, size_t errlen);

/*
 * Packs m's body (m->type one of the eight; its fields as the decoder
 * returns them: a JobStart's arrays of world, nnodes and nrail_keys
 * entries) into a malloc'd buffer (never NULL) of *ret_len bytes (maybe
 * 0). A text is sent up to its NUL, and at most the bytes its decoder
 * takes (a reason OVLD_CLUSTER_REASON_MAX, a backend name 15, an address
 * OVLD_ADDR_TEXT_MAX - 1). OVL_ERR_NOMEM, or OVL_ERR_INVALID for another
 * type.
 */
ovl_status_t ovld_cluster_encode(const ovld_cluster_msg_t *m, uint8_t **ret_body, size_t *ret_len);

/*
 * The rail groups of a decoded JobStart with rail keys (nrail_keys > 0),
 * as this node counts them: each rank's group and its place in it
 * (group_of and pos, world entries each: ovl_plan_rail_groups). OVL_OK
 * when the coordinator sent one key per group; OVL_ERR_PROTOCOL with err
 * "the coordinator sent N rail keys for M rail groups" when not;
 * ovl_plan_rail_groups's failure (OVL_ERR_NOMEM) with err untouched.
 */
ovl_status_t ovld_cluster_start_rails(const ovld_cluster_start_msg_t *s, uint32_t *group_of,
                                      uint32_t *pos, char *err, size_t errlen);

#endif /* OVLD_CLUSTER_WIRE_H */

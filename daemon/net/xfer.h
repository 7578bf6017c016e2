/*
 * xfer.h: the host backend's rows between nodes. A job across nodes on the
 * host backend has no NCCL: its all-gathers and rails move the rows of
 * ranks served by other daemons with UCX, over the peers' links (peer.h).
 * NCCL's model, point to point: a sender posts a send of a dense block
 * (src, bytes) to one rank of the job, the receiver a receive of a block
 * of the same size from that rank, both under the same tag (the op's
 * number and the collective call's place in the op, backend.h
 * ovld_coll_tag_t); they match by (job, tag, from, to), in any order.
 *
 * How (docs/multinode.md, "Rows between nodes"): the sender's daemon maps
 * src with ucp_mem_map, packs its rkey, and tells the receiver's daemon
 * where the rows are (a RowsReady message); the receiver's daemon, once
 * the receive is posted, reads them with ucp_get_nbx straight into dst and
 * answers RowsTaken; then both complete, and the sender unmaps. A send
 * completes when its rows were read, so that src may be reused after;
 * more generally, no done runs while a read of its buffer may be in
 * flight (a failed send whose rows were announced completes once the
 * receiver said it will not read them, or its peer is down).
 *
 * Threads: ovld_xfer_send and ovld_xfer_recv are called from any thread (a
 * host stream's); their done callbacks run on the loop thread, exactly once
 * each (a stream thread waits on a condition its callback signals). All
 * else is loop thread only. Every failure says why: the peer down (naming
 * it), the job aborted, a size that does not match the other side's, a
 * limit.
 *
 * Limits, each named in its refusal: transfers of a job in flight on this
 * node, posted or announced by a peer and not finished
 * (OVLD_XFER_MAX_PENDING), a RowsReady's rkey (OVLD_XFER_RKEY_MAX).
 * A peer's message is checked like a client's: unknown job (dropped and
 * counted, since a job may have ended there first), a rank out of the
 * job's world or not served by that peer, a size that disagrees with the
 * receive (both sides fail with OVL_ERR_MISMATCH).
 */
#ifndef OVLD_XFER_H
#define OVLD_XFER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "backend.h"
#include "jobid.h"
#include "ovl.h"
#include "peer.h"
#include "stats.h"

/* Peer message types of this module: [OVLD_XFER_TYPE_FIRST,
 * OVLD_XFER_TYPE_LAST] (cluster.h has 16..31). */
#define OVLD_XFER_TYPE_FIRST  32
#define OVLD_XFER_TYPE_LAST   47
#define OVLD_XFER_MAX_PENDING 4096 /* transfers of one job posted or announced, not finished */
#define OVLD_XFER_RKEY_MAX    (16u << 10) /* bytes of a packed rkey in a RowsReady */

typedef struct ovld_xfer ovld_xfer_t;         /* the daemon's: one with the peers */
typedef struct ovld_xfer_job ovld_xfer_job_t; /* one job's (backend.h names it) */

/* Loop thread. ps and counters outlive the mover. */
ovl_status_t ovld_xfer_create(uv_loop_t *loop, ovld_peers_t *ps, ovld_counters_t *counters,
                              ovld_xfer_t **ret, char *err, size_t errlen);
/* Fails everything pending (OVL_ERR_SHUTDOWN; the callbacks run before this
 * returns or from the loop after) and frees what nothing holds any more;
 * before ovld_peers_close. */
void ovld_xfer_destroy(ovld_xfer_t *x);

/* The peers' on_message for this module's types, and their on_down (fails
 * every transfer to or from p with OVL_ERR_ABORTED naming p, and every
 * later one of the jobs that have p's node: their transfers with it are
 * over, even if it comes back). */
void ovld_xfer_on_message(ovld_xfer_t *x, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                          size_t len);
void ovld_xfer_on_down(ovld_xfer_t *x, ovld_peer_t *p, const char *why);

/*
 * A job's mover (loop thread): key is the job's nonce (what the daemons of
 * the job know it by); rank q is served by node node_of[q], node n by
 * peers[n] (this daemon's own node, self_node, by NULL). Arrays are copied.
 * Refused (OVL_ERR_EXISTS) if a job with this key is there already. Every
 * node of the job must have its mover before any node's ranks run an op
 * of the job: a RowsReady of a job a node does not have is dropped.
 */
ovl_status_t ovld_xfer_job_create(ovld_xfer_t *x, const uint8_t key[OVLD_JOB_NONCE_LEN],
                                  uint32_t world, const uint32_t *node_of, uint32_t self_node,
                                  ovld_peer_t *const *peers, uint32_t nnodes, ovld_xfer_job_t **ret,
                                  char *err, size_t errlen);
/* Fails every transfer of the job pending now and every later one with
 * status and why (loop thread); the first abort's words stay. Sends
 * announced are withdrawn (RowsWithdrawn) and complete once their
 * receivers answer; reads in flight complete first. */
void ovld_xfer_job_abort(ovld_xfer_job_t *xj, ovl_status_t status, const char *why);
/* The job is done with it (loop thread): aborts what is pending and frees
 * it once no callback is owed. */
void ovld_xfer_job_release(ovld_xfer_job_t *xj);

/* Runs on the loop thread, once per transfer (backend.h). */
typedef ovld_rows_done_fn ovld_xfer_done_fn;

/* ovld_xfer_send and ovld_xfer_recv, as the backends take them
 * (ovld_job_net_t's mover). */
extern const ovld_rows_mover_t ovld_xfer_mover;

/* Any thread. Rank `from`'s rows (src, bytes) to rank `to` of the job
 * (from served here, to elsewhere), or the converse for a receive into
 * dst. On OVL_OK, done will be called; on an error return (a rank not
 * where it must be, out of memory) it will not, and the backend's
 * last_error words come from why (at least 160 bytes). */
ovl_status_t ovld_xfer_send(ovld_xfer_job_t *xj, ovld_coll_tag_t tag, uint32_t from, uint32_t to,
                            const void *src, size_t bytes, ovld_xfer_done_fn done, void *arg,
                            char *why, size_t whylen);
ovl_status_t ovld_xfer_recv(ovld_xfer_job_t *xj, ovld_coll_tag_t tag, uint32_t from, uint32_t to,
                            void *dst, size_t bytes, ovld_xfer_done_fn done, void *arg, char *why,
                            size_t whylen);

#endif /* OVLD_XFER_H */

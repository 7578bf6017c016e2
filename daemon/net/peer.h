/*
 * peer.h: ovld's authenticated links to the ovld of other nodes, over UCX
 * (ucp active messages), driven from the loop (docs/multinode.md).
 *
 * One UCX context and worker per daemon, owned by the loop thread; a
 * listener on peer_listen; an endpoint per connection, either way. A peer
 * is another ovld, named by its advertised ADDRESS:PORT; before anything
 * else on a connection, both sides prove that they hold the cluster key
 * (peer_auth.h). A peer record may hold two endpoints (one each side
 * opened); messages go on one of them, in order. A peer is up from the
 * first endpoint that authenticates until one of its endpoints fails, is
 * not heard from for peer_timeout_ms, or the peer comes back as a new
 * instance (restarted): then it is down, once per episode, and the next
 * ovld_peers_get starts a new one.
 *
 * Everything here runs on the loop thread; the callbacks are called from
 * the loop, on_message from inside UCX's progress (it may send and get,
 * not close), on_down, ping and read completions outside it. Every resource is
 * bounded (OVLD_PEERS_MAX, OVLD_PEERS_MAX_UNAUTH, OVLD_PEERS_MAX_UNAUTH_SOURCE,
 * OVLD_PEER_QUEUE_MAX, OVLD_PEER_MAX_BODY), and a refusal names its limit. When
 * OVLD_PEERS_MAX_UNAUTH handshakes run, a new connection evicts the oldest
 * of the address holding the most, so that strangers cannot keep a node
 * that holds the key out.
 *
 * This module reports through the reporter it is given (refusals, peers
 * up and down), and counts into the daemon's counters (stats.h).
 */
#ifndef OVLD_PEER_H
#define OVLD_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <uv.h>

#include "config.h"
#include "ovl.h"
#include "peer_wire.h"
#include "report.h"
#include "stats.h"

#define OVLD_PEERS_MAX        1024 /* peer records */
#define OVLD_PEERS_MAX_UNAUTH 64   /* accepted endpoints not authenticated yet */
/* of those, from one source (an IPv4 address, an IPv6 /64: peer_handshake.c, source_of) */
#define OVLD_PEERS_MAX_UNAUTH_SOURCE 8
#define OVLD_PEER_QUEUE_MAX          (4u << 20) /* bytes queued or in flight to one peer */

typedef struct ovld_peers ovld_peers_t; /* the daemon's UCX context, worker, listener, peers */
typedef struct ovld_peer ovld_peer_t;   /* one other ovld, known by its advertised ADDRESS:PORT */

typedef struct ovld_peers_cb {
    /* a message of an authenticated peer (type >= OVLD_PEER_TYPE_USER), loop
     * thread; body valid during the call only */
    void (*on_message)(void *arg, ovld_peer_t *p, uint32_t type, const uint8_t *body, size_t len);
    /* p went down (was up, or never came up after ovld_peers_get): timeout,
     * UCX error, closed, authentication refused; once per episode; later
     * sends fail until a get reconnects */
    void (*on_down)(void *arg, ovld_peer_t *p, ovl_status_t st, const char *why);
    void *arg;
} ovld_peers_cb_t;

/*
 * Once, first thing in main (before libuv installs signal handlers):
 * libucs's constructor installs UCX's own handlers for SIGILL, SIGSEGV,
 * SIGBUS, SIGFPE and SIGHUP when the library loads, before main, from the
 * environment of that moment (ucs/sys/init.c), so setting ERROR_SIGNALS
 * later changes nothing; this puts back what was there before (the
 * default, or the sanitizer's). In a sanitizer build it also turns UCX's
 * malloc hooks off, which would hand the sanitizer memory it did not
 * allocate.
 */
void ovld_peers_process_init(void);

/*
 * Starts the transport on loop with cfg's peer_* settings (peer_listen
 * set): reads the key (peer_auth.h), creates the UCX context and worker,
 * listens, and starts the handles that drive UCX. On failure nothing is
 * left open and err says what (the key file's refusal, a UCX status in
 * words, the address in use). report and counters must outlive the
 * transport.
 */
ovl_status_t ovld_peers_start(uv_loop_t *loop, const ovld_config_t *cfg, const ovld_peers_cb_t *cb,
                              const ovld_reporter_t *report, ovld_counters_t *counters,
                              ovld_peers_t **ret, char *err, size_t errlen);
/*
 * Shutdown: says Bye to every peer that is up, closes every endpoint, the
 * listener, the worker and the context (waiting at most about a second for
 * UCX to finish), fails pending pings with OVL_ERR_SHUTDOWN, and closes the
 * loop's handles; ps is freed when libuv has closed them. No callback but
 * the pings' after this; not from inside a callback of this module.
 */
void ovld_peers_close(ovld_peers_t *ps);
const char *ovld_peers_self(const ovld_peers_t *ps);        /* advertised "ADDRESS:PORT" */
const uint8_t *ovld_peers_instance(const ovld_peers_t *ps); /* 16 random bytes, new each start */

/* The peer at addr (connects and authenticates if not up; returns at
 * once); the record lives until ovld_peers_close. OVL_ERR_INVALID for the
 * wildcard or this ovld's own address, OVL_ERR_LIMIT past OVLD_PEERS_MAX
 * peers, OVL_ERR_SHUTDOWN once closing; err says so. */
ovl_status_t ovld_peers_get(ovld_peers_t *ps, const struct sockaddr_storage *addr,
                            ovld_peer_t **ret, char *err, size_t errlen);
/* Whether the peer at addr is up now (authenticated: it holds the key).
 * Connects to nothing. */
bool ovld_peers_is_up_at(const ovld_peers_t *ps, const struct sockaddr_storage *addr);
/* Queued while connecting (bounded), sent in order; fails once down
 * (OVL_ERR_CLOSED); OVL_ERR_LIMIT naming the limit when too large
 * (OVLD_PEER_MAX_BODY) or the queue is full (OVLD_PEER_QUEUE_MAX);
 * OVL_ERR_INVALID for a type below OVLD_PEER_TYPE_USER. */
ovl_status_t ovld_peer_send(ovld_peer_t *p, uint32_t type, const void *body, size_t len);
bool ovld_peer_is_up(const ovld_peer_t *p);
const char *ovld_peer_name(const ovld_peer_t *p);
const uint8_t *ovld_peer_instance(const ovld_peer_t *p); /* the peer's, once up; else NULL */

typedef struct ovld_peer_info {
    const char *name, *state; /* state: "connecting", "up", "down" */
    double rtt_s;             /* the last round trip measured; 0: none yet */
    uint64_t msgs_in, msgs_out, bytes_in, bytes_out, errors;
    const char *last_error; /* "" if none */
} ovld_peer_info_t;
void ovld_peers_foreach(const ovld_peers_t *ps, void (*fn)(const ovld_peer_info_t *, void *),
                        void *arg);

/*
 * A round trip to the ovld at addr, for operators and tests (`ovlctl peer
 * ping`): connects and authenticates if needed, sends a Ping and waits for
 * its Pong. done is called once, from the loop, never from inside this
 * call: OVL_OK with the round trip and the peer's instance, or the failure
 * in words (unreachable: OVL_ERR_CONNECT; refused: OVL_ERR_PERMISSION,
 * "wrong cluster key"; no answer within peer_timeout_ms of the call:
 * OVL_ERR_TIMEOUT; OVL_ERR_SHUTDOWN from ovld_peers_close). A failure to
 * start (the address, the limits) is returned here instead, with err, and
 * done is not called.
 */
typedef void (*ovld_peers_ping_fn)(void *arg, ovl_status_t st, double rtt_s,
                                   const uint8_t *instance, const char *why);
ovl_status_t ovld_peers_ping(ovld_peers_t *ps, const struct sockaddr_storage *addr,
                             ovld_peers_ping_fn done, void *arg, char *err, size_t errlen);

/*
 * Remote reads (UCX RMA), for the host backend's rows between nodes
 * (xfer.h). The owner of some memory maps it and tells a peer where it is
 * and its packed key (in a message of its own); the peer reads it with
 * ovld_peer_get. Loop thread, as everything here.
 */
typedef struct ovld_peer_mem ovld_peer_mem_t; /* a range of this process that peers may read */

/*
 * Maps [addr, addr + len) of this process, memory that exists and stays
 * valid until the unmap, for peers to read (ucp_mem_map on the range, with
 * local and remote read access only; nothing is allocated), and packs its
 * remote key (ucp_rkey_pack). OVL_ERR_INVALID for len 0 or a NULL addr,
 * OVL_ERR_SHUTDOWN once closing, OVL_ERR_SYSTEM with UCX's words.
 */
ovl_status_t ovld_peers_mem_map(ovld_peers_t *ps, void *addr, size_t len, ovld_peer_mem_t **ret,
                                char *err, size_t errlen);
/* The packed remote key of m (*ret_len bytes), valid until the unmap. */
const void *ovld_peer_mem_rkey(const ovld_peer_mem_t *m, size_t *ret_len);
/* Unmaps m (a read of it from then on fails on the reader's side, or reads
 * what is there: the caller unmaps once no peer will read); NULL is
 * nothing. Before ovld_peers_close. */
void ovld_peers_mem_unmap(ovld_peers_t *ps, ovld_peer_mem_t *m);

/*
 * Reads len bytes at remote_addr of p's process, mapped there under the
 * packed key rkey (rkey_len bytes, copied), into dst, which must stay valid
 * until done. The key is unpacked on p's current endpoint for this read
 * alone (an endpoint of another episode could not use it) and destroyed
 * when the read completes. done is called once, on the loop outside UCX's
 * progress, never from inside this call: OVL_OK once the bytes are in dst;
 * OVL_ERR_CLOSED naming p when the read fails or its endpoint does (p goes
 * down; UCX's words); OVL_ERR_SHUTDOWN from ovld_peers_close, after the
 * worker is gone (so that nothing writes into dst after any done). A read
 * that cannot start (p not up, a key UCX refuses, len 0, UCX refusing to
 * post it) is refused here with err, and done is not called. The read goes
 * in pieces of a few MiB (peer_rma.c, GET_PIECE), each completed one counting
 * as the peer heard from, so that a long read cannot starve the link's
 * heartbeats.
 */
typedef void (*ovld_peer_get_fn)(void *arg, ovl_status_t st, const char *why);
ovl_status_t ovld_peer_get(ovld_peer_t *p, uint64_t remote_addr, const void *rkey, size_t rkey_len,
                           void *dst, size_t len, ovld_peer_get_fn done, void *arg, char *err,
                           size_t errlen);

#endif /* OVLD_PEER_H */

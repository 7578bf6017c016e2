/*
 * replay.h: a job's captured ops. An op whose plans and buffers were seen
 * before is not issued call by call again: the executor captures its body
 * (every instruction between each rank's WAIT_READY and its DONE) once
 * into a backend graph (backend.h, graph_*), and replays that graph for
 * every later op of the same key; the doorbell's wait and done are
 * graph_run's, since their values change with every op.
 *
 * The key is the executor's (exec.c: the op's plan parameters, its ranks
 * and every view its plans name); this module only keeps keys and their
 * graphs: at most `cap` of them, the least recently used evicted first. A
 * key is captured the second time it is seen, never the first, so that an
 * op whose buffers change every time costs nothing more than before; a key
 * whose capture failed is issued call by call for as long as it stays.
 * Every entry is dropped when the memory generation (buffers.h: bumped
 * whenever a client buffer is unmapped) differs from the one the entries
 * were made at: a graph names device addresses, and a new mapping at an
 * old address must not inherit a graph made for the old.
 *
 * Threads: a cache belongs to one lane (issuer.h): its calls come from one
 * thread at a time, in order, and ovld_replay_destroy once the lane is
 * idle. Nothing logs.
 */
#ifndef OVLD_REPLAY_H
#define OVLD_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct ovld_replay ovld_replay_t;

/* What the executor does with an op (ovld_replay_find). */
typedef enum ovld_replay_how {
    OVLD_REPLAY_EAGER,   /* issue it call by call (first seen, not replayable, or refused) */
    OVLD_REPLAY_CAPTURE, /* capture its body, then launch it (second seen) */
    OVLD_REPLAY_LAUNCH,  /* launch the graph ovld_replay_find gave */
} ovld_replay_how_t;

/* A cache for a job's ops on backend b, keeping at most cap keys (>= 1).
 * NULL without memory (the job then issues every op call by call). */
ovld_replay_t *ovld_replay_create(ovld_backend_t *b, uint32_t cap);
/* Frees every graph (the backend frees one still running once it ends)
 * and the cache. Accepts NULL. */
void ovld_replay_destroy(ovld_replay_t *rp);

/*
 * Looks key (len bytes) up, at memory generation gen: LAUNCH with its
 * graph in *ret_graph; CAPTURE when it was seen once before (the caller
 * then reports with ovld_replay_captured or ovld_replay_refused, before
 * any other call; or with neither where the op fails before its capture
 * begins: the key is then asked for again at its next sight); EAGER
 * otherwise (a key seen for the first time is
 * remembered; without memory it is not, and stays EAGER).
 */
ovld_replay_how_t ovld_replay_find(ovld_replay_t *rp, const void *key, size_t len, uint64_t gen,
                                   ovld_graph_t **ret_graph);
/* The capture ovld_replay_find asked for made graph g: the key's from now
 * on (the cache owns g). */
void ovld_replay_captured(ovld_replay_t *rp, ovld_graph_t *g);
/* The capture failed: the key is issued call by call while it stays. */
void ovld_replay_refused(ovld_replay_t *rp);

/* Keys held now (tests). */
uint32_t ovld_replay_size(const ovld_replay_t *rp);

#endif /* OVLD_REPLAY_H */

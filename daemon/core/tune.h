/*
 * tune.h: `auto` that measures (docs/performance.md, "auto that measures").
 *
 * A key is what a plan's speed depends on beyond the choice itself: an op's
 * plan parameters but its algorithm, chunks, streams, rank and who chose
 * (plan.h). The first ops of a new key run the planner's candidates
 * (ovl_plan_candidates) in turn, each timed on the device (the backend's op
 * time, backend.h); a candidate's first run is a warm-up and is not
 * counted. Once every candidate has `samples` times, the one of the least
 * median is the key's choice, and every later op of the key runs it
 * (chosen OVL_CHOSEN_MEASURED). Only ops that leave the algorithm to the
 * rule and the chunks and streams to the planner are measured (an op's
 * own chunks or streams, or the operator's defaults, are kept as asked).
 * An op that failed for a reason of its candidate's (ovld_tune_record)
 * counts against it, and a candidate that fails `samples` times is
 * dropped; one that failed otherwise (an aborted job, a client's error)
 * counts nothing. Where a candidate's op ran but no time came, or every
 * candidate was dropped, measuring the key gives up: the rule's plan from
 * then on, and nothing kept.
 *
 * All the ranks of an op on a node run one plan (the op is planned once
 * here), so they agree. A job across nodes is measured by its coordinator
 * (cluster_coord.c): its key holds the topology (node_of, copied), the
 * nodes run the plan it says, time it and send their times, and it
 * records the slowest node's.
 *
 * The table holds at most max_entries keys, the least recently used out
 * first; one user's keys (the uid of the jobs whose ops made them) at most
 * max_per_uid of them, that user's least recently used out first, so that
 * one user's many shapes do not push out everyone else's choices. Keys are
 * found by a hash index. Its choices are text (ovld_tune_format,
 * ovld_tune_load) for ovld's state file, which main keeps per backend,
 * device model (its first device's) and driver. Pure: no I/O, no clock,
 * no thread of its own; loop thread only.
 */
#ifndef OVLD_TUNE_H
#define OVLD_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ovl.h"
#include "plan.h"

typedef struct ovld_tune ovld_tune_t;

/* What an op that runs a candidate reports its time with (entry 0: the op
 * is not being measured; nothing to report). */
typedef struct ovld_tune_ticket {
    uint64_t entry; /* the key's entry, by its number (never reused) */
    uint64_t hash;  /* its key's hash: where the index finds it */
    uint32_t cand;
} ovld_tune_ticket_t;

#define OVLD_TUNE_MAX_SAMPLES 64 /* ovld_tune_create's samples at most */

/* A table of at most max_entries keys (>= 1), at most max_per_uid (0: no
 * bound but max_entries) made by one user's ops, each candidate timed
 * samples times (1..OVLD_TUNE_MAX_SAMPLES) after its warm-up; NULL without
 * memory or for a value out of range. */
ovld_tune_t *ovld_tune_create(uint32_t samples, uint32_t max_entries, uint32_t max_per_uid);
void ovld_tune_destroy(ovld_tune_t *t); /* accepts NULL */

/*
 * pp: an op's resolved parameters whose algorithm `auto` left to the rule
 * (chosen OVL_CHOSEN_RULE; node_of: its topology, NULL for one node), of a
 * job of user uid (a new key counts against that user's bound). Sets its
 * algo and chunks (and allgather, where the candidate gathers A by another
 * method than pp says) to the plan to run: the key's choice (chosen
 * OVL_CHOSEN_MEASURED), or the next candidate to time (OVL_CHOSEN_TRYING,
 * with a ticket in *ret for ovld_tune_record). Leaves pp as it is (the
 * rule's, *ret empty) for params of another kind of choice, with one
 * candidate, or without memory for a new key.
 */
void ovld_tune_pick(ovld_tune_t *t, uint32_t uid, ovl_plan_params_t *pp, ovld_tune_ticket_t *ret);

/* What ovld_tune_pick would run for pp where its key is chosen (pp's algo
 * and chunks, chosen OVL_CHOSEN_MEASURED; true), without measuring or
 * adding anything (a Plan request's answer); false: pp left as it is. */
bool ovld_tune_peek(const ovld_tune_t *t, ovl_plan_params_t *pp);

/* How an op that ran a candidate ended (ovld_tune_record). */
typedef enum ovld_tune_outcome {
    OVLD_TUNE_TIMED,  /* it ran: ns its device time (0: none came) */
    OVLD_TUNE_FAILED, /* it failed for its plan's reason (the planner, the device, memory) */
    OVLD_TUNE_NONE,   /* it failed for another's (an aborted job, a client's error) */
} ovld_tune_outcome_t;

/* The outcome of an op of status st (planner_refused: the planner refused
 * its plan): OVL_OK TIMED; the planner's, the device's or memory's
 * failures (OVL_ERR_BACKEND, _NOMEM, _LIMIT, _UNSUPPORTED, _INTERNAL)
 * FAILED; any other NONE. */
ovld_tune_outcome_t ovld_tune_outcome_of(ovl_status_t st, bool planner_refused);

/* What became of an op that ran tk's candidate. A ticket of an entry gone
 * meanwhile (evicted, cleared), or of a key no longer measuring, is
 * ignored. */
void ovld_tune_record(ovld_tune_t *t, ovld_tune_ticket_t tk, ovld_tune_outcome_t how, uint64_t ns);

/* Keys in the table, and of those the ones chosen. */
size_t ovld_tune_size(const ovld_tune_t *t);
size_t ovld_tune_chosen(const ovld_tune_t *t);
/* Whether a choice was made or loaded since the last call (which clears
 * it): the table's text has changed, for the state file; set_dirty says
 * so again (a save that failed). */
bool ovld_tune_take_dirty(ovld_tune_t *t);
void ovld_tune_set_dirty(ovld_tune_t *t);
/* Forgets every key (what ops are measuring starts again). */
void ovld_tune_clear(ovld_tune_t *t);

/*
 * The table as text, like snprintf (the length the whole text needs,
 * without the NUL): a first line "ovld-tune 1 DEVICE", DEVICE the caller's
 * words for the device model and driver (no newline), then per key (the
 * chosen ones only with chosen_only: the state file's), one line
 *   KEY chose=CAND ns=CAND:MEDIAN,... [measuring|gave-up]
 * CAND being ALGO/CHUNKS, and /copy where the candidate gathers A by the
 * copy engine (only in keys of allgather auto; ovl_plan_cand_t),
 * KEY being space-separated name=value fields (docs/performance.md), the
 * medians in ns over the samples taken (0: none yet), a candidate dropped
 * for failing marked "!", chose=- where there is no choice. Only chosen
 * keys are ever loaded back.
 */
size_t ovld_tune_format(const ovld_tune_t *t, const char *device, bool chosen_only, char *buf,
                        size_t len);
/* The same text, malloc'ed whole (*ret_len bytes and a NUL); NULL without
 * memory. */
char *ovld_tune_text(const ovld_tune_t *t, const char *device, bool chosen_only, size_t *ret_len);

/*
 * Takes the chosen keys of a text ovld_tune_format made (len bytes, not
 * NUL-terminated) into the table, for device only: a first line of another
 * device or version loads nothing. A line that does not parse, or names no
 * valid plan, is skipped and counted in *ret_skipped, with the first one's
 * words in why. Returns the keys taken. Keys past max_entries are not
 * taken.
 */
size_t ovld_tune_load(ovld_tune_t *t, const char *device, const char *text, size_t len,
                      size_t *ret_skipped, char *why, size_t whylen);

#endif /* OVLD_TUNE_H */

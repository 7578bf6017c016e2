/*
 * replay.c: see replay.h.
 */
#include "replay.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef enum entry_state {
    ENTRY_FREE = 0,
    ENTRY_SEEN,    /* seen once: the next sight captures */
    ENTRY_GRAPH,   /* captured: replays */
    ENTRY_REFUSED, /* its capture failed: call by call */
} entry_state_t;

typedef struct entry {
    entry_state_t state;
    uint64_t hash;
    void *key;
    size_t len;
    ovld_graph_t *graph;
    uint64_t used; /* the tick of its last find */
} entry_t;

struct ovld_replay {
    ovld_backend_t *b;
    uint32_t cap;
    entry_t *entries;
    uint64_t gen;   /* the memory generation the entries were made at */
    uint64_t tick;  /* finds so far */
    entry_t *asked; /* the entry whose capture ovld_replay_find asked for */
};

#define FNV_PRIME 1099511628211ull

/* One FNV-1a step over a 64-bit word, its high half folded down. */
static inline uint64_t mix(uint64_t h, uint64_t w)
{
    h ^= w;
    h *= FNV_PRIME;
    return h ^ (h >> 32);
}

/* FNV-1a over 64-bit words, four independent lanes so that the
 * multiplications overlap (the executor's keys are words: a few hundred to
 * a few thousand bytes, hashed once per op on the issuing thread), the
 * lanes folded into one, then the tail byte by byte. */
static uint64_t hash_of(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h[4] = {14695981039346656037ull, 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                     0x165667b19e3779f9ull};
    size_t i = 0;
    for (; i + 32 <= len; i += 32)
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * l, 8);
            h[l] = mix(h[l], w);
        }
    uint64_t f = h[0];
    for (int l = 1; l < 4; l++)
        f = mix(f, h[l]);
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        f = mix(f, w);
    }
    for (; i < len; i++) {
        f ^= p[i];
        f *= FNV_PRIME;
    }
    return f;
}

static void entry_clear(ovld_replay_t *rp, entry_t *e)
{
    if (e->graph)
        rp->b->ops->graph_free(rp->b, e->graph);
    free(e->key);
    memset(e, 0, sizeof(*e));
}

ovld_replay_t *ovld_replay_create(ovld_backend_t *b, uint32_t cap)
{
    if (!b || cap == 0)
        return NULL;
    ovld_replay_t *rp = calloc(1, sizeof(*rp));
    if (!rp)
        return NULL;
    rp->entries = calloc(cap, sizeof(*rp->entries));
    if (!rp->entries) {
        free(rp);
        return NULL;
    }
    rp->b = b;
    rp->cap = cap;
    return rp;
}

void ovld_replay_destroy(ovld_replay_t *rp)
{
    if (!rp)
        return;
    for (uint32_t i = 0; i < rp->cap; i++)
        entry_clear(rp, &rp->entries[i]);
    free(rp->entries);
    free(rp);
}

ovld_replay_how_t ovld_replay_find(ovld_replay_t *rp, const void *key, size_t len, uint64_t gen,
                                   ovld_graph_t **ret_graph)
{
    *ret_graph = NULL;
    rp->asked = NULL;
    if (gen != rp->gen) {
        /* a client buffer was unmapped since: its address may map other
         * memory now */
        for (uint32_t i = 0; i < rp->cap; i++)
            entry_clear(rp, &rp->entries[i]);
        rp->gen = gen;
    }
    rp->tick++;
    uint64_t h = hash_of(key, len);
    entry_t *victim = NULL;
    for (uint32_t i = 0; i < rp->cap; i++) {
        entry_t *e = &rp->entries[i];
        if (e->state == ENTRY_FREE) {
            if (!victim || victim->state != ENTRY_FREE)
                victim = e;
            continue;
        }
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) {
            e->used = rp->tick;
            switch (e->state) {
            case ENTRY_GRAPH:
                *ret_graph = e->graph;
                return OVLD_REPLAY_LAUNCH;
            case ENTRY_SEEN:
                rp->asked = e;
                return OVLD_REPLAY_CAPTURE;
            default:
                return OVLD_REPLAY_EAGER;
            }
        }
        if (!victim || (victim->state != ENTRY_FREE && e->used < victim->used))
            victim = e;
    }
    /* first sight: remembered in a free entry, else in the least recently
     * used one's place */
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return OVLD_REPLAY_EAGER;
    entry_clear(rp, victim);
    memcpy(copy, key, len);
    *victim = (entry_t){.state = ENTRY_SEEN, .hash = h, .key = copy, .len = len, .used = rp->tick};
    return OVLD_REPLAY_EAGER;
}

void ovld_replay_captured(ovld_replay_t *rp, ovld_graph_t *g)
{
    entry_t *e = rp->asked;
    rp->asked = NULL;
    if (!e) {
        rp->b->ops->graph_free(rp->b, g); /* a caller's bug: nothing asked for it */
        return;
    }
    e->state = ENTRY_GRAPH;
    e->graph = g;
}

void ovld_replay_refused(ovld_replay_t *rp)
{
    if (rp->asked)
        rp->asked->state = ENTRY_REFUSED;
    rp->asked = NULL;
}

uint32_t ovld_replay_size(const ovld_replay_t *rp)
{
    uint32_t n = 0;
    for (uint32_t i = 0; rp && i < rp->cap; i++)
        n += rp->entries[i].state != ENTRY_FREE;
    return n;
}

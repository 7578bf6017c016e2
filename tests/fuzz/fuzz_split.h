/*
 * fuzz_split.h: how the wire targets (fuzz_wire.c, fuzz_request.c) feed a
 * stream to the frame reader in pieces, as a socket delivers it. Include
 * after fuzz_main.h (CHECK).
 */
#ifndef OVL_FUZZ_SPLIT_H
#define OVL_FUZZ_SPLIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire.h"

typedef struct splitter {
    uint8_t mode;
    uint32_t rng;
} splitter_t;

/*
 * The next piece size. mode & 3: 0 the whole rest at once, 1 byte by byte,
 * 2 a fixed size from the mode's upper bits, 3 pseudo-random sizes (seeded by
 * the mode) from 1 to 64 or, now and then, up to 4096.
 */
static inline size_t next_piece(splitter_t *s, size_t left)
{
    size_t n;
    switch (s->mode & 3) {
    case 0:
        n = left;
        break;
    case 1:
        n = 1;
        break;
    case 2:
        n = (size_t)((s->mode >> 2) & 0x1f) * 3 + 2;
        break;
    default:
        s->rng = s->rng * 1103515245u + 12345u;
        n = (s->rng >> 16) % 8 == 0 ? (s->rng >> 8) % 4096 + 1 : (s->rng >> 16) % 64 + 1;
        break;
    }
    return n < left ? n : left;
}

/* Puts n bytes into the reader. Bit 7 of the mode takes the socket path's
 * interface (space, copy at most what it offers, commit), else feed. */
static inline ovl_status_t put(ovl_wire_reader_t *r, bool socket_like, const uint8_t *p, size_t n,
                               size_t *ret_taken)
{
    if (!socket_like) {
        *ret_taken = n;
        return ovl_wire_reader_feed(r, p, n);
    }
    uint8_t *dst;
    size_t avail;
    ovl_status_t st = ovl_wire_reader_space(r, &dst, &avail);
    if (st != OVL_OK) {
        *ret_taken = 0;
        return st;
    }
    CHECK(avail >= 1); /* wire.h: "at least one free byte" */
    size_t take = n < avail ? n : avail;
    memcpy(dst, p, take);
    ovl_wire_reader_commit(r, take);
    *ret_taken = take;
    return OVL_OK;
}

#endif /* OVL_FUZZ_SPLIT_H */

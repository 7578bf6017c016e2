/*
 * issue_lab_copies.h: a gather of several 2-D copies in one kernel, for
 * ovl-issue-lab's world-8 graph rows (issue_lab.c): the pulls of one rank
 * as one kernel node instead of one copy node each. Not ovld's: a
 * measurement of the alternative.
 */
#ifndef OVL_ISSUE_LAB_COPIES_H
#define OVL_ISSUE_LAB_COPIES_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One copy of a batch: rows of width bytes, src_ld and dst_ld bytes apart. */
typedef struct lab_copy_piece {
    const void *src;
    void *dst;
    uint64_t src_ld, dst_ld;
    uint64_t rows, width;
} lab_copy_piece_t;

#define LAB_COPIES_MAX 16 /* pieces per launch (they travel as its argument) */

typedef struct lab_copies {
    uint32_t n;
    lab_copy_piece_t p[LAB_COPIES_MAX];
} lab_copies_t;

/* Every piece of c (n <= LAB_COPIES_MAX, none empty, no piece's dst
 * overlapping another's src or dst) in one kernel on stream s: the pieces
 * run at once, not one after another, on the SMs rather than the copy
 * engines, in 16-byte words where a piece's addresses and strides allow.
 * src may be another device's memory mapped here (peer access or an IPC
 * mapping). Returns the launch's error. */
cudaError_t lab_launch_copies(cudaStream_t s, const lab_copies_t *c);

#ifdef __cplusplus
}
#endif

#endif /* OVL_ISSUE_LAB_COPIES_H */

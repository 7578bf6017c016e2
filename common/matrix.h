/*
 * matrix.h: the one definition of how many bytes a strided matrix spans,
 * used by libovl (to find the registration holding a matrix) and by ovld (to
 * check an op's ranges against registrations).
 */
#ifndef OVL_MATRIX_H
#define OVL_MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "ovl.h"

/*
 * The bytes a rows x cols row-major matrix with leading dimension ld (in
 * elements of elem bytes) spans: ((rows-1)*ld + cols) * elem, 0 if rows or
 * cols is 0. OVL_ERR_INVALID if ld < cols or elem is 0; OVL_ERR_RANGE on
 * overflow.
 */
static inline ovl_status_t ovl_matrix_extent(uint64_t rows, uint64_t cols, uint64_t ld, size_t elem,
                                             uint64_t *ret_bytes)
{
    if (elem == 0 || ld < cols)
        return OVL_ERR_INVALID;
    if (rows == 0 || cols == 0) {
        *ret_bytes = 0;
        return OVL_OK;
    }
    uint64_t elems, bytes;
    if (__builtin_mul_overflow(rows - 1, ld, &elems) ||
        __builtin_add_overflow(elems, cols, &elems) ||
        __builtin_mul_overflow(elems, (uint64_t)elem, &bytes))
        return OVL_ERR_RANGE;
    *ret_bytes = bytes;
    return OVL_OK;
}

#endif /* OVL_MATRIX_H */

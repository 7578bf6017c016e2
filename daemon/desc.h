/*
 * desc.h: requests as the core sees them. The server turns each request
 * into one of these plain descriptors at the boundary (request.c); jobs,
 * the op queue and everything below never see wire types.
 */
#ifndef OVLD_DESC_H
#define OVLD_DESC_H

#include <stdbool.h>
#include <stdint.h>

#include "uuid.h"

#define OVLD_JOB_ID_MAX 63

/* The buffers an op names. */
enum { OVLD_BUF_A, OVLD_BUF_B, OVLD_BUF_C, OVLD_BUF_AOUT, OVLD_BUF_COUNT };

/* One of them: a registration of the client's connection, the offset of
 * the matrix in it, and its leading dimension (elements). */
typedef struct ovld_buf_ref {
    bool given;
    uint64_t mem_id;
    uint64_t offset;
    uint64_t ld;
} ovld_buf_ref_t;

/* An AgGemm. After ovld_request_check said OVL_OK every field is in its
 * range; after a refusal only comm_id and seq mean anything (the rest is
 * narrowed with saturation, so nothing wraps into a valid value). */
typedef struct ovld_op_desc {
    uint64_t comm_id;
    uint64_t seq;
    uint64_t m, n, k;
    uint32_t dtype, algo, chunks, streams;
    bool transb;
    ovld_buf_ref_t buf[OVLD_BUF_COUNT];
} ovld_op_desc_t;

/* A CommInit that passed ovld_request_check. */
typedef struct ovld_join_desc {
    char job_id[OVLD_JOB_ID_MAX + 1]; /* clean text, NUL-terminated */
    uint32_t world, rank;
    uint8_t device_uuid[OVLD_UUID_LEN];
} ovld_join_desc_t;

#endif /* OVLD_DESC_H */

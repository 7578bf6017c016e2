/*
 * status.c: names of status codes, dtypes and algorithms, shared by libovl,
 * ovlctl and ovld so that all three print the same words.
 */
#include <string.h>

#include "ovl.h"

const char *ovl_strerror(ovl_status_t status)
{
    switch (status) {
    case OVL_OK:
        return "success";
    case OVL_ERR_INVALID:
        return "invalid argument";
    case OVL_ERR_NOMEM:
        return "out of memory";
    case OVL_ERR_SYSTEM:
        return "system call failed";
    case OVL_ERR_PROTOCOL:
        return "protocol error";
    case OVL_ERR_VERSION:
        return "protocol version mismatch";
    case OVL_ERR_TIMEOUT:
        return "timed out";
    case OVL_ERR_CONNECT:
        return "cannot reach the daemon";
    case OVL_ERR_CLOSED:
        return "connection closed";
    case OVL_ERR_PERMISSION:
        return "permission denied";
    case OVL_ERR_NOT_FOUND:
        return "not found";
    case OVL_ERR_EXISTS:
        return "already exists";
    case OVL_ERR_LIMIT:
        return "limit exceeded";
    case OVL_ERR_MISMATCH:
        return "ranks disagree";
    case OVL_ERR_RANGE:
        return "buffer range outside its registration";
    case OVL_ERR_BACKEND:
        return "backend failure";
    case OVL_ERR_UNSUPPORTED:
        return "not supported";
    case OVL_ERR_ABORTED:
        return "job aborted";
    case OVL_ERR_CONFIG:
        return "bad configuration";
    case OVL_ERR_SHUTDOWN:
        return "daemon shutting down";
    case OVL_ERR_AGAIN:
        return "not complete yet";
    case OVL_ERR_INTERNAL:
        return "internal error";
    }
    return "unknown status";
}

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Indexed by value and unsized, so that a name past the count (a value
 * named but not counted) or a count past the last name fails the build; a
 * gap reads NULL, which the unit tests (test_enums) catch. */
static const char *const dtype_names[] = {
    [OVL_DTYPE_BF16] = "bf16",        [OVL_DTYPE_FP16] = "fp16",        [OVL_DTYPE_FP32] = "fp32",
    [OVL_DTYPE_FP8_E4M3] = "fp8e4m3", [OVL_DTYPE_FP8_E5M2] = "fp8e5m2",
};
_Static_assert(NELEM(dtype_names) == OVL_DTYPE_COUNT, "every dtype has a name");

static const char *const algo_names[] = {
    [OVL_ALGO_AUTO] = "auto", [OVL_ALGO_NAIVE] = "naive", [OVL_ALGO_COLLECTIVE] = "collective",
    [OVL_ALGO_RING] = "ring", [OVL_ALGO_PUSH] = "push",
};
_Static_assert(NELEM(algo_names) == OVL_ALGO_COUNT, "every algorithm has a name");

static const char *const op_kind_names[] = {
    [OVL_OP_AG_GEMM] = "ag_gemm",
    [OVL_OP_GEMM_RS] = "gemm_rs",
};
_Static_assert(NELEM(op_kind_names) == OVL_OP_KIND_COUNT, "every op kind has a name");

static const char *const scale_mode_names[] = {
    [OVL_SCALE_TENSOR] = "tensor",
    [OVL_SCALE_ROW] = "row",
    [OVL_SCALE_BLOCK_1X128] = "1x128",
    [OVL_SCALE_BLOCK_128X128] = "128x128",
};
_Static_assert(NELEM(scale_mode_names) == OVL_SCALE_MODE_COUNT, "every scale mode has a name");

const char *ovl_scale_mode_name(ovl_scale_mode_t mode)
{
    return (unsigned)mode < OVL_SCALE_MODE_COUNT ? scale_mode_names[mode] : NULL;
}

ovl_status_t ovl_scale_mode_parse(const char *name, ovl_scale_mode_t *ret)
{
    for (unsigned i = 0; name && i < OVL_SCALE_MODE_COUNT; i++)
        if (strcmp(name, scale_mode_names[i]) == 0) {
            *ret = (ovl_scale_mode_t)i;
            return OVL_OK;
        }
    return OVL_ERR_INVALID;
}

const char *ovl_dtype_name(ovl_dtype_t dtype)
{
    return (unsigned)dtype < OVL_DTYPE_COUNT ? dtype_names[dtype] : NULL;
}

const char *ovl_algo_name(ovl_algo_t algo)
{
    return (unsigned)algo < OVL_ALGO_COUNT ? algo_names[algo] : NULL;
}

int ovl_op_kind_takes_algo(ovl_op_kind_t kind, ovl_algo_t algo)
{
    switch (kind) {
    case OVL_OP_AG_GEMM:
        return (unsigned)algo < OVL_ALGO_COUNT && algo != OVL_ALGO_PUSH;
    case OVL_OP_GEMM_RS:
        return (unsigned)algo < OVL_ALGO_COUNT;
    }
    return 0;
}

const char *ovl_op_kind_algos(ovl_op_kind_t kind)
{
    switch (kind) {
    case OVL_OP_AG_GEMM:
        return "auto, naive, collective and ring";
    case OVL_OP_GEMM_RS:
        return "auto, naive, collective, ring and push";
    }
    return NULL;
}

/* 0 names no kind: its slot is NULL, and the name of 0 is NULL */
const char *ovl_op_kind_name(ovl_op_kind_t kind)
{
    return (unsigned)kind < OVL_OP_KIND_COUNT ? op_kind_names[kind] : NULL;
}

ovl_status_t ovl_op_kind_parse(const char *name, ovl_op_kind_t *ret)
{
    for (unsigned i = 1; name && i < OVL_OP_KIND_COUNT; i++)
        if (op_kind_names[i] && strcmp(name, op_kind_names[i]) == 0) {
            *ret = (ovl_op_kind_t)i;
            return OVL_OK;
        }
    return OVL_ERR_INVALID;
}

ovl_status_t ovl_dtype_parse(const char *name, ovl_dtype_t *ret)
{
    for (unsigned i = 0; name && i < OVL_DTYPE_COUNT; i++)
        if (dtype_names[i] && strcmp(name, dtype_names[i]) == 0) {
            *ret = (ovl_dtype_t)i;
            return OVL_OK;
        }
    return OVL_ERR_INVALID;
}

ovl_status_t ovl_algo_parse(const char *name, ovl_algo_t *ret)
{
    for (unsigned i = 0; name && i < OVL_ALGO_COUNT; i++)
        if (algo_names[i] && strcmp(name, algo_names[i]) == 0) {
            *ret = (ovl_algo_t)i;
            return OVL_OK;
        }
    return OVL_ERR_INVALID;
}

size_t ovl_dtype_size(ovl_dtype_t dtype)
{
    switch (dtype) {
    case OVL_DTYPE_BF16:
    case OVL_DTYPE_FP16:
        return 2;
    case OVL_DTYPE_FP32:
        return 4;
    case OVL_DTYPE_FP8_E4M3:
    case OVL_DTYPE_FP8_E5M2:
        return 1;
    }
    return 0;
}

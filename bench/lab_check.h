/*
 * lab_check.h: the labs' checks (ring_lab.c, gather_lab.c, issue_lab.c,
 * offload_lab.c). A lab is no service: the first failed call ends it
 * (exit 1), named by the lab (LAB_WHO, an expression each lab defines
 * before including this: its program's name, or which of its processes
 * speaks), the call and its line.
 */
#ifndef OVL_LAB_CHECK_H
#define OVL_LAB_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#ifndef LAB_WHO
#error "define LAB_WHO (the lab's name) before including lab_check.h"
#endif

static inline void lab_fail(const char *who, const char *call, int line, const char *why)
{
    fprintf(stderr, "%s: %s: %s (line %d)\n", who, call, why, line);
    exit(1);
}

/* a CUDA runtime call */
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess)                                                                     \
            lab_fail(LAB_WHO, #x, __LINE__, cudaGetErrorString(e_));                               \
    } while (0)

#endif /* OVL_LAB_CHECK_H */

/*
 * kind.c: the table of op kinds (kind.h).
 */
#include "kind.h"

const ovld_kind_t *ovld_kind(uint32_t id)
{
    static const ovld_kind_t *const kinds[] = {
        [OVLD_KIND_AG_GEMM] = &ovld_kind_ag_gemm,
    };
    return id < sizeof(kinds) / sizeof(kinds[0]) ? kinds[id] : NULL;
}

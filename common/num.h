/*
 * num.h: the one rule for a decimal number on a command line (ovlctl,
 * ovl-demo, ovl-bench): digits only, nothing before or after, no sign, and
 * within 64 bits. ovld's config file has its own parser with sizes and
 * ranges (daemon/util/config.c) and the same digits-only rule.
 */
#ifndef OVL_NUM_H
#define OVL_NUM_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* 0 and *ret set, or -1 when s is not such a number. */
static inline int ovl_parse_u64(const char *s, uint64_t *ret)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *ret = v;
    return 0;
}

#endif

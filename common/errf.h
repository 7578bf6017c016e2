/*
 * errf.h: the words of a refusal, for code that returns a status and says
 * why in the caller's buffer (err of errlen bytes; errlen 0: no words), as
 * the pure modules do (peer_wire, peer_auth, xfer_wire).
 */
#ifndef OVL_ERRF_H
#define OVL_ERRF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "ovl.h"

/* Writes fmt's words into err and returns st. */
static inline ovl_status_t ovl_errf(ovl_status_t st, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline ovl_status_t ovl_errf(ovl_status_t st, char *err, size_t errlen, const char *fmt, ...)
{
    if (errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

#endif /* OVL_ERRF_H */

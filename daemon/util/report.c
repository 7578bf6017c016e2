/*
 * report.c: see report.h.
 */
#include "report.h"

#include <stdarg.h>
#include <stdio.h>

void ovld_report(const ovld_reporter_t *r, ovld_report_level_t level, const char *fmt, ...)
{
    if (!r || !r->fn)
        return;
    /* On the caller's stack, not a shared buffer: reports come from any
     * thread at once. */
    char msg[1024];
    msg[0] = '\0'; /* what goes out if formatting fails */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    r->fn(r->arg, level, msg);
}

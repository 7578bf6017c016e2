/*
 * uuid.c: see uuid.h.
 */
#include "uuid.h"

#include <stdio.h>

void ovld_uuid_format(const uint8_t u[OVLD_UUID_LEN], const char *prefix, char *buf, size_t len)
{
    snprintf(buf, len, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
             u[12], u[13], u[14], u[15]);
}

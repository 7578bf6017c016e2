/*
 * backend.c: what all backends share (choosing one is daemon/backends.c).
 */
#include <stdio.h>
#include <string.h>

#include "backend.h"

int ovld_backend_device_by_uuid(ovld_backend_t *b, const uint8_t *uuid, size_t len)
{
    if (!uuid || len != OVLD_UUID_LEN)
        return -1;
    uint32_t n = b->ops->device_count(b);
    for (uint32_t i = 0; i < n; i++) {
        ovld_device_info_t info;
        b->ops->device_info(b, i, &info);
        if (memcmp(info.uuid, uuid, OVLD_UUID_LEN) == 0)
            return (int)i;
    }
    return -1;
}

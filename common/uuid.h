/*
 * uuid.h: device UUIDs as text, shared by ovld (its messages) and ovlctl
 * (`ovlctl status`). A device UUID is the 16 bytes by which the wire names a
 * device (Device.uuid, and the device_uuid of requests). Pure code.
 */
#ifndef OVL_UUID_H
#define OVL_UUID_H

#include <stddef.h>
#include <stdint.h>

#define OVLD_UUID_LEN 16

/* Formats a device UUID as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" style
 * text with the given prefix; buf must hold 64 bytes. */
void ovld_uuid_format(const uint8_t uuid[OVLD_UUID_LEN], const char *prefix, char *buf, size_t len);

#endif /* OVL_UUID_H */

/*
 * jobid.c: the job id blob of a job across nodes (jobid.h has the layout).
 */
#include "jobid.h"

#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAGIC       "OVLJ"
#define VERSION     1
#define OFF_VERSION 4
#define OFF_FAMILY  5
#define OFF_PORT    6
#define OFF_ADDR    8
#define OFF_NONCE   24
#define OFF_INST    40
#define OFF_TAIL    56

_Static_assert(OFF_INST + OVLD_INSTANCE_LEN == OFF_TAIL, "the layout of jobid.h");
_Static_assert(OFF_NONCE + OVLD_JOB_NONCE_LEN == OFF_INST, "the layout of jobid.h");

static bool all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

ovl_status_t ovld_job_blob_encode(const ovld_job_blob_t *b, uint8_t out[OVLD_JOB_BLOB_LEN])
{
    uint16_t port;

    memset(out, 0, OVLD_JOB_BLOB_LEN);
    memcpy(out, MAGIC, 4);
    out[OFF_VERSION] = VERSION;
    if (b->coordinator.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&b->coordinator;
        out[OFF_FAMILY] = 4;
        port = ntohs(a->sin_port);
        memcpy(out + OFF_ADDR, &a->sin_addr, 4);
    } else if (b->coordinator.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&b->coordinator;
        out[OFF_FAMILY] = 6;
        port = ntohs(a->sin6_port);
        memcpy(out + OFF_ADDR, &a->sin6_addr, 16);
    } else {
        return OVL_ERR_INVALID;
    }
    if (port == 0)
        return OVL_ERR_INVALID;
    out[OFF_PORT] = (uint8_t)(port >> 8);
    out[OFF_PORT + 1] = (uint8_t)port;
    memcpy(out + OFF_NONCE, b->nonce, OVLD_JOB_NONCE_LEN);
    memcpy(out + OFF_INST, b->instance, OVLD_INSTANCE_LEN);
    return OVL_OK;
}

static ovl_status_t bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ovl_status_t bad(char *err, size_t errlen, const char *fmt, ...)
{
    if (errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        (void)vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return OVL_ERR_INVALID;
}

ovl_status_t ovld_job_blob_decode(const uint8_t *in, size_t len, ovld_job_blob_t *ret, char *err,
                                  size_t errlen)
{
    if (len != OVLD_JOB_BLOB_LEN)
        return bad(err, errlen, "a job id is %d bytes, not %zu", OVLD_JOB_BLOB_LEN, len);
    if (memcmp(in, MAGIC, 4) != 0)
        return bad(err, errlen, "not an ovl job id (no OVLJ magic)");
    if (in[OFF_VERSION] != VERSION)
        return bad(err, errlen, "job id version %u; this ovld reads version %d", in[OFF_VERSION],
                   VERSION);
    uint16_t port = (uint16_t)(in[OFF_PORT] << 8 | in[OFF_PORT + 1]);
    if (port == 0)
        return bad(err, errlen, "job id names port 0");
    if (!all_zero(in + OFF_TAIL, OVLD_JOB_BLOB_LEN - OFF_TAIL))
        return bad(err, errlen, "job id has bytes set past its fields");
    memset(ret, 0, sizeof(*ret));
    if (in[OFF_FAMILY] == 4) {
        if (!all_zero(in + OFF_ADDR + 4, 12))
            return bad(err, errlen, "job id: IPv4 address with bytes set past its 4th");
        struct sockaddr_in *a = (struct sockaddr_in *)&ret->coordinator;
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        memcpy(&a->sin_addr, in + OFF_ADDR, 4);
    } else if (in[OFF_FAMILY] == 6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ret->coordinator;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        memcpy(&a->sin6_addr, in + OFF_ADDR, 16);
    } else {
        return bad(err, errlen, "job id: address family %u (4 or 6)", in[OFF_FAMILY]);
    }
    memcpy(ret->nonce, in + OFF_NONCE, OVLD_JOB_NONCE_LEN);
    memcpy(ret->instance, in + OFF_INST, OVLD_INSTANCE_LEN);
    return OVL_OK;
}

void ovld_job_blob_name(const ovld_job_blob_t *b, char out[19])
{
    static const char hex[] = "0123456789abcdef";
    out[0] = 'x';
    out[1] = '-';
    for (int i = 0; i < 8; i++) {
        out[2 + 2 * i] = hex[b->nonce[i] >> 4];
        out[3 + 2 * i] = hex[b->nonce[i] & 15];
    }
    out[18] = '\0';
}

/*
 * xfer.c: TEMPORARY stand-in until the host backend's rows between nodes
 * land (xfer.h): every job across nodes on the host backend fails its
 * transfers with OVL_ERR_UNSUPPORTED.
 */
#include <stdio.h>
#include <stdlib.h>

#include "xfer.h"

struct ovld_xfer {
    int unused;
};

ovl_status_t ovld_xfer_create(uv_loop_t *loop, ovld_peers_t *ps, ovld_counters_t *counters,
                              ovld_xfer_t **ret, char *err, size_t errlen)
{
    (void)loop;
    (void)ps;
    (void)counters;
    (void)err;
    (void)errlen;
    *ret = NULL;
    return OVL_OK;
}

void ovld_xfer_destroy(ovld_xfer_t *x)
{
    (void)x;
}

void ovld_xfer_on_message(ovld_xfer_t *x, ovld_peer_t *p, uint32_t type, const uint8_t *body,
                          size_t len)
{
    (void)x;
    (void)p;
    (void)type;
    (void)body;
    (void)len;
}

void ovld_xfer_on_down(ovld_xfer_t *x, ovld_peer_t *p, const char *why)
{
    (void)x;
    (void)p;
    (void)why;
}

ovl_status_t ovld_xfer_job_create(ovld_xfer_t *x, const uint8_t key[OVLD_JOB_NONCE_LEN],
                                  uint32_t world, const uint32_t *node_of, uint32_t self_node,
                                  ovld_peer_t *const *peers, uint32_t nnodes, ovld_xfer_job_t **ret,
                                  char *err, size_t errlen)
{
    (void)x;
    (void)key;
    (void)world;
    (void)node_of;
    (void)self_node;
    (void)peers;
    (void)nnodes;
    (void)err;
    (void)errlen;
    *ret = NULL;
    return OVL_OK;
}

void ovld_xfer_job_abort(ovld_xfer_job_t *xj, ovl_status_t status, const char *why)
{
    (void)xj;
    (void)status;
    (void)why;
}

void ovld_xfer_job_release(ovld_xfer_job_t *xj)
{
    (void)xj;
}

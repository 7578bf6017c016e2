/*
 * libovl_internal.h: what ovlctl and the tests use of libovl beyond ovl.h:
 * one request/response round trip with the raw protocol messages.
 */
#ifndef OVL_LIBOVL_INTERNAL_H
#define OVL_LIBOVL_INTERNAL_H

#include "ovl.h"
#include "ovl.pb-c.h"

/* Sends q (its id is set here) with nfds descriptors (owned by the call) and
 * waits for its response. An Error response becomes its status, with the
 * message in ovl_last_error. On OVL_OK free *ret with libovl_response_free. */
ovl_status_t libovl_call(ovl_client_t *cl, Ovl__Request *q, const int *fds, unsigned nfds,
                         Ovl__Response **ret);
void libovl_response_free(Ovl__Response *r);
/* Records a failure of cl (ovl_last_error) and returns st. */
ovl_status_t libovl_fail(ovl_client_t *cl, ovl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A Status round trip: on OVL_OK, (*ret)->status is the daemon's status. */
ovl_status_t libovl_status(ovl_client_t *cl, Ovl__Response **ret);

/* The comm's doorbell (proto/doorbell.h) as this process maps it, for tests
 * that must watch it without calling into libovl. */
const struct ovl_doorbell *libovl_comm_doorbell(const ovl_comm_t *comm);

#endif

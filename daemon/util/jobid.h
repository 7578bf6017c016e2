/*
 * jobid.h: the job id of a job across nodes, as NCCL's ncclUniqueId is for
 * a communicator: an opaque fixed-size blob that one rank gets from its
 * ovld and passes to the job's other ranks out of band (MPI,
 * torch.distributed, a file); every rank joins with it, through whichever
 * ovld serves it. It says which ovld coordinates the job (its advertised
 * peer address and the random instance id it has since it started) and
 * holds a random 128-bit nonce: the coordinator admits only nonces it
 * issued, so that a forged or stale id names no job.
 *
 * Layout (OVLD_JOB_BLOB_LEN bytes, integers big-endian):
 *   0   4  magic "OVLJ"
 *   4   1  version (1)
 *   5   1  address family: 4 or 6
 *   6   2  port
 *   8  16  address (IPv4 in the first 4 bytes, the rest zero)
 *  24  16  nonce
 *  40  16  the coordinator's instance id
 *  56  72  zero
 * A blob with anything else (another magic or version, a family not 4 or 6,
 * port 0, IPv4 address bytes past the 4th or the tail not zero) is refused:
 * it is input from the application, to be checked like any other.
 *
 * Pure code: no I/O, no logging.
 */
#ifndef OVLD_JOBID_H
#define OVLD_JOBID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include "ovl.h"

#define OVLD_JOB_BLOB_LEN  128 /* the size of ncclUniqueId, and of ovl's id */
#define OVLD_JOB_NONCE_LEN 16
#define OVLD_INSTANCE_LEN  16

typedef struct ovld_job_blob {
    struct sockaddr_storage coordinator; /* AF_INET or AF_INET6, with the port */
    uint8_t nonce[OVLD_JOB_NONCE_LEN];
    uint8_t instance[OVLD_INSTANCE_LEN];
} ovld_job_blob_t;

/* Writes b as OVLD_JOB_BLOB_LEN bytes into out. OVL_ERR_INVALID if the
 * address is not IPv4 or IPv6 with a port. */
ovl_status_t ovld_job_blob_encode(const ovld_job_blob_t *b, uint8_t out[OVLD_JOB_BLOB_LEN]);

/* Reads len bytes into *ret; OVL_ERR_INVALID with the reason in err for
 * anything but a well-formed blob of exactly OVLD_JOB_BLOB_LEN bytes. */
ovl_status_t ovld_job_blob_decode(const uint8_t *in, size_t len, ovld_job_blob_t *ret, char *err,
                                  size_t errlen);

/* The name status and the logs show for such a job: "x-" and the first 8
 * bytes of the nonce in hex (18 characters). For display only: jobs made
 * from a blob are found by their nonce, never by this name, so a string id
 * that happens to read the same names another job. */
void ovld_job_blob_name(const ovld_job_blob_t *b, char out[19]);

#endif /* OVLD_JOBID_H */

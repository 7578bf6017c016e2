/*
 * doorbell.h: the layout of a rank's doorbell, shared by ovld and libovl.
 *
 * One per rank, allocated by ovld (host backend: in a memfd mapped by both;
 * CUDA backend: in device memory on the rank's GPU, exported by IPC, plus a
 * memfd page mapped and registered by both that holds `ready` and host
 * copies of done and the error fields: a CPU store there can end ovld's
 * wait for a client that died, where a GPU write could sit behind that very
 * wait in a stalled hardware queue). For op
 * n the client writes ready = n (on its stream) and waits done >= n; ovld
 * waits ready >= n before the op's plan and writes done = n after it. An op
 * that fails still rings done, after setting error (the first failure's
 * status) and error_seq. Counters only grow. `wake` is bumped after every
 * done so that a host waiter can sleep in futex(2) on it.
 */
#ifndef OVL_DOORBELL_H
#define OVL_DOORBELL_H

#include <stdint.h>

struct ovl_doorbell {
    uint64_t ready;     /* written by the client */
    uint64_t done;      /* written by ovld */
    int32_t error;      /* ovl_status_t of the first failed op, 0 if none */
    uint32_t wake;      /* futex word, bumped after each done (host backend) */
    uint64_t error_seq; /* the op that failed first */
};

#define OVL_DOORBELL_SIZE 4096u /* one page: what is mapped and exported */

#endif /* OVL_DOORBELL_H */

/*
 * doorbell.h: the layout of a rank's doorbell, shared by ovld and libovl.
 *
 * One per rank, allocated by ovld. For op n the client says its inputs are
 * ready (on its stream) and waits done >= n; ovld waits for ready before the
 * op's plan and writes done = n after it. An op that fails still rings done,
 * after setting error (the first failure's status) and error_seq. done only
 * grows. `wake` is bumped after every done that the host backend rings (and
 * by libovl's own release, below) so that a host waiter can sleep in
 * futex(2) on it.
 *
 * One memfd page mapped by both. Host backend: ready = n in `ready`.
 *
 * CUDA backend: the same page, registered with CUDA by both. ovld's stream
 * writes done and the error fields (which host-side waits read), and the
 * slots that the two processes' streams wait on: op n's client stream
 * writes ready_slot[n % OVL_READY_SLOTS] = n and waits
 * done_slot[n % OVL_READY_SLOTS] >= n; ovld's stream does the converse.
 * Every wait that crosses the two processes is on host memory, so that
 * ovld can end the waits on both sides of a client that died with CPU
 * stores (a GPU write could sit behind that very wait in a stalled
 * hardware queue; and a dying process's stream, still blocked waiting for
 * done, can hold the GPU up). One slot per op keeps a release from being
 * undone: the dead client's stream can still run for a while, and each op
 * completed lets it write the next op's ready (and ovld's stream writes
 * done for its last ops). Such late writes only ever hit the slot of an
 * op whose wait they satisfy, since at most a few ops are issued at a time
 * (OVLD_MAX_ISSUED, far below OVL_READY_SLOTS).
 */
#ifndef OVL_DOORBELL_H
#define OVL_DOORBELL_H

#include <stdint.h>

#define OVL_READY_SLOTS 64u

struct ovl_doorbell {
    uint64_t ready;                       /* written by the client (host backend) */
    uint64_t done;                        /* written by ovld */
    int32_t error;                        /* ovl_status_t of the first failed op, 0 if none */
    uint32_t wake;                        /* futex word, bumped after each done (host backend) */
    uint64_t error_seq;                   /* the op that failed first */
    uint64_t ready_slot[OVL_READY_SLOTS]; /* written by the client's stream (CUDA) */
    uint64_t done_slot[OVL_READY_SLOTS];  /* written by ovld's stream (CUDA) */
};

#define OVL_DOORBELL_SIZE 4096u /* one page: what is mapped and exported */

_Static_assert(sizeof(struct ovl_doorbell) <= OVL_DOORBELL_SIZE, "the doorbell fits its page");

/* What is stored to release every wait for ops up to seq_hi: by ovld for a
 * client that is gone, by libovl for an ovld that is gone (client/ovl.h).
 * Well ahead of them, but not by half the number space. The
 * GPU's GEQ wait is cyclic, (int64_t)(*addr - value) >= 0 (cuStreamWaitValue64),
 * so UINT64_MAX reads as -1 there and releases nothing: that was the hang
 * when a client died. The host backend's waits compare plainly, and this
 * value serves them as well. */
static inline uint64_t ovl_doorbell_release_value(uint64_t seq_hi)
{
    return seq_hi + (UINT64_C(1) << 32);
}

#endif /* OVL_DOORBELL_H */

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

#include <stdbool.h>
#include <stdint.h>

#include "ovl.h"

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
 * client that is gone, by libovl for an ovld that is gone (include/ovl/ovl.h).
 * Well ahead of them, but not by half the number space. The
 * GPU's GEQ wait is cyclic, (int64_t)(*addr - value) >= 0 (cuStreamWaitValue64),
 * so UINT64_MAX reads as -1 there and releases nothing: that was the hang
 * when a client died. The host backend's waits compare plainly, and this
 * value serves them as well. */
static inline uint64_t ovl_doorbell_release_value(uint64_t seq_hi)
{
    return seq_hi + (UINT64_C(1) << 32);
}

/*
 * ovld's side of the host backend's doorbell, as it reads and writes the
 * page. The client maps the same page and may write anything into any of
 * its words at any time, so whatever ovld decides depends on the page only
 * where the client alone can be hurt by it (its own waits, its own error
 * report); what ovld must be sure of (that a released rank's waits end,
 * that done only grows) it keeps in its own memory, `struct
 * ovl_doorbell_own`, which the client cannot reach. Each word of the page
 * is read once per decision, with one atomic load: no loop here runs on
 * page contents. tests/fuzz/fuzz_doorbell.c drives these with pages and
 * client writes of every kind.
 */
struct ovl_doorbell_own {
    uint64_t done;        /* the highest done ovld rang (its writers serialize) */
    uint64_t ready_floor; /* the release value once released, else 0 (atomic) */
};

/* Whether op seq may start: the client said ready (ready >= seq), or the
 * rank was released up to floor (the client is gone; a late or hostile
 * write into `ready` must not undo that). */
static inline bool ovl_doorbell_ready_reached(uint64_t ready, uint64_t floor, uint64_t seq)
{
    return ready >= seq || floor >= seq;
}

/* The done to store for op seq, given the highest done already rung: never
 * less, so that done only grows even when a ring comes out of order. */
static inline uint64_t ovl_doorbell_done_value(uint64_t rung, uint64_t seq)
{
    return seq > rung ? seq : rung;
}

/* Whether a failure may be recorded in a page whose error word holds
 * error_word: only the first one is (a nonzero word means one was). */
static inline bool ovl_doorbell_may_set_error(int32_t error_word)
{
    return error_word == 0;
}

/* Records op seq's failure by CPU stores, unless a failure is recorded
 * already: error_seq, then error (status, an ovl_status_t). */
static inline void ovl_doorbell_set_error(struct ovl_doorbell *db, uint64_t seq, int32_t status)
{
    if (ovl_doorbell_may_set_error(__atomic_load_n(&db->error, __ATOMIC_RELAXED))) {
        __atomic_store_n(&db->error_seq, seq, __ATOMIC_RELAXED);
        __atomic_store_n(&db->error, status, __ATOMIC_RELEASE);
    }
}

/* The ready wait's test, on the page and ovld's own record. */
static inline bool ovl_doorbell_ready(const struct ovl_doorbell *db,
                                      const struct ovl_doorbell_own *own, uint64_t seq)
{
    return ovl_doorbell_ready_reached(__atomic_load_n(&db->ready, __ATOMIC_ACQUIRE),
                                      __atomic_load_n(&own->ready_floor, __ATOMIC_ACQUIRE), seq);
}

/*
 * Rings done for op seq, with the first failure when status (an
 * ovl_status_t) is not 0: error_seq, then error, then done. Callers
 * serialize the rings of one doorbell (own->done is plain) and wake the
 * futex on `wake` afterwards. Returns the done stored.
 */
static inline uint64_t ovl_doorbell_ring(struct ovl_doorbell *db, struct ovl_doorbell_own *own,
                                         uint64_t seq, int32_t status)
{
    if (status != 0)
        ovl_doorbell_set_error(db, seq, status);
    uint64_t v = ovl_doorbell_done_value(own->done, seq);
    own->done = v;
    __atomic_store_n(&db->done, v, __ATOMIC_RELEASE);
    __atomic_add_fetch(&db->wake, 1, __ATOMIC_RELEASE);
    return v;
}

/* Releases every wait for ops up to seq_hi (a client that is gone): in the
 * page for whoever still reads it, and in ovld's own record, which the
 * ready wait reads too. */
static inline void ovl_doorbell_release_ready(struct ovl_doorbell *db, struct ovl_doorbell_own *own,
                                              uint64_t seq_hi)
{
    uint64_t v = ovl_doorbell_release_value(seq_hi);
    __atomic_store_n(&own->ready_floor, v, __ATOMIC_RELEASE);
    __atomic_store_n(&db->ready, v, __ATOMIC_RELEASE);
}

/* Op seq's done slot rung by a CPU store, where no stream will write it
 * (the GPU cannot, or the request never reached ovld): seq, unless the
 * slot already holds as much, compared as the GPU's wait compares
 * (cyclically), so that a release value stays. */
static inline void ovl_doorbell_ring_slot(struct ovl_doorbell *db, uint64_t seq)
{
    uint64_t *slot = &db->done_slot[seq % OVL_READY_SLOTS];
    if ((int64_t)(__atomic_load_n(slot, __ATOMIC_ACQUIRE) - seq) < 0)
        __atomic_store_n(slot, seq, __ATOMIC_RELEASE);
}

/* ------------------------------------------- the page, and its releases */

/*
 * Makes a doorbell: a zeroed page of a memfd (MFD_CLOEXEC), mapped shared.
 * On OVL_OK *ret_db and *ret_fd hold the mapping and the fd, for
 * ovl_doorbell_destroy; OVL_ERR_SYSTEM with errno set otherwise. ovld makes
 * every rank's doorbell with it, with either backend; the client maps the
 * fd it is given (proto/doorbell.c, the one place the page is made).
 */
ovl_status_t ovl_doorbell_create(struct ovl_doorbell **ret_db, int *ret_fd);

/* Unmaps db and closes fd (either may be absent: NULL, -1). */
void ovl_doorbell_destroy(struct ovl_doorbell *db, int fd);

/* ovld, CUDA backend, a client gone: every ready slot and done slot holds
 * the release value for seq_hi, by CPU stores (what a stream would write
 * can sit behind the very wait it is meant to end). Returns the value. */
uint64_t ovl_doorbell_release_slots(struct ovl_doorbell *db, uint64_t seq_hi);

/* libovl, ovld gone: the error word says `status` (unless an op failed
 * already, with error_seq the first op not done), and done and every done
 * slot hold the release value past both done and seq_hi, the client's last
 * op; a host waiter on `wake` is woken. */
void ovl_doorbell_release_closed(struct ovl_doorbell *db, uint64_t seq_hi, int32_t status);

#endif /* OVL_DOORBELL_H */

/*
 * stall.h: ovld's event loop must never block: every call that can wait
 * (CUDA IPC opens, communicator setup, teardown) runs on a worker. If the
 * loop does stop turning all the same, this says where it is stuck: a
 * monitor thread sees the loop's heartbeat stop, and the loop thread,
 * interrupted by SIGUSR2, writes its own stack to stderr (SIGUSR2 sent to
 * any thread with tgkill(2) does the same for that thread). Once per stall;
 * the loop turning again is logged too. A stall is a bug in ovld (or a
 * library call that blocked where it should not): the stack is for its
 * report. systemd's watchdog (WatchdogSec) restarts a daemon that stays
 * stuck.
 */
#ifndef OVLD_STALL_H
#define OVLD_STALL_H

#include <uv.h>

typedef struct ovld_stall ovld_stall_t;

/* Starts watching `loop`, which must be run by the calling thread; a stall
 * is threshold_ms without a turn. Returns 0 or a negative errno / uv error. */
int ovld_stall_start(ovld_stall_t **ret, uv_loop_t *loop, unsigned threshold_ms);

/* Stops the monitor; the heartbeat timer is closed (the loop frees it on its
 * next turn, or with uv_loop_close). NULL is a no-op. */
void ovld_stall_stop(ovld_stall_t *s);

#endif /* OVLD_STALL_H */

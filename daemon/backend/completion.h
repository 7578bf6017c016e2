/*
 * completion.h: hands op completions from backend threads (host workers, CUDA
 * host functions) to the loop thread. Producers push a node they own (no
 * allocation, so pushing cannot fail); uv_async_send wakes the loop, which
 * drains the whole queue, since sends coalesce.
 */
#ifndef OVLD_COMPLETION_H
#define OVLD_COMPLETION_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "backend.h"

typedef struct ovld_cq_node {
    struct ovld_cq_node *next;
    void *cookie;
    uint64_t seq;
    ovl_status_t status;
    uint64_t ns; /* the op's device time (ovld_done_cb); 0: not timed */
    char message[256];
    /* called after the callback, to let the producer reclaim the node */
    void (*release)(struct ovld_cq_node *node);
} ovld_cq_node_t;

/* Completions pushed without a node (ovld_cq_push_nomem): a few slots
 * held in the queue itself, delivered with OVL_ERR_NOMEM. */
#define OVLD_CQ_NOMEM_SLOTS 256

typedef struct ovld_cq {
    uv_async_t async;
    pthread_mutex_t mu;
    ovld_cq_node_t *head, *tail;
    struct {
        void *cookie;
        uint64_t seq;
    } nomem[OVLD_CQ_NOMEM_SLOTS];
    uint32_t nnomem;
    uint64_t nomem_lost; /* slots were full: completions that never came */
    ovld_done_cb cb;
    void *arg;
    void (*closed)(struct ovld_cq *q);
} ovld_cq_t;

int ovld_cq_init(ovld_cq_t *q, uv_loop_t *loop, ovld_done_cb cb, void *arg);
/* Any thread. */
void ovld_cq_push(ovld_cq_t *q, ovld_cq_node_t *node);
/* Any thread: a completion that failed for want of memory for its node
 * (the doorbell was rung by the CPU). false where every slot is taken
 * (the loop has not drained OVLD_CQ_NOMEM_SLOTS of them): the completion
 * is lost, and the op's job never ends; the caller reports it. */
bool ovld_cq_push_nomem(ovld_cq_t *q, void *cookie, uint64_t seq);
/* Loop thread: delivers what is queued, then closes the handle; `closed`
 * runs once it is closed (the owner frees the queue's memory there). */
void ovld_cq_close(ovld_cq_t *q, void (*closed)(ovld_cq_t *q));

#endif /* OVLD_COMPLETION_H */

/*
 * completion.c: see completion.h.
 */
#include "completion.h"

static void drain(ovld_cq_t *q)
{
    for (;;) {
        pthread_mutex_lock(&q->mu);
        ovld_cq_node_t *n = q->head;
        q->head = q->tail = NULL;
        uint32_t k = q->nnomem;
        void *cookie[OVLD_CQ_NOMEM_SLOTS];
        uint64_t seq[OVLD_CQ_NOMEM_SLOTS];
        for (uint32_t i = 0; i < k; i++) {
            cookie[i] = q->nomem[i].cookie;
            seq[i] = q->nomem[i].seq;
        }
        q->nnomem = 0;
        pthread_mutex_unlock(&q->mu);
        for (uint32_t i = 0; i < k; i++)
            q->cb(q->arg, cookie[i], seq[i], OVL_ERR_NOMEM, "ovld: out of memory tracking the op",
                  0);
        if (!n && k == 0)
            return;
        while (n) {
            ovld_cq_node_t *next = n->next;
            q->cb(q->arg, n->cookie, n->seq, n->status, n->message, n->ns);
            if (n->release)
                n->release(n);
            n = next;
        }
    }
}

static void on_async(uv_async_t *h)
{
    drain(h->data);
}

int ovld_cq_init(ovld_cq_t *q, uv_loop_t *loop, ovld_done_cb cb, void *arg)
{
    q->head = q->tail = NULL;
    q->nnomem = 0;
    q->nomem_lost = 0;
    q->cb = cb;
    q->arg = arg;
    q->closed = NULL;
    int rc = pthread_mutex_init(&q->mu, NULL);
    if (rc != 0)
        return -rc;
    rc = uv_async_init(loop, &q->async, on_async);
    if (rc != 0) {
        pthread_mutex_destroy(&q->mu);
        return rc;
    }
    q->async.data = q;
    return 0;
}

bool ovld_cq_push_nomem(ovld_cq_t *q, void *cookie, uint64_t seq)
{
    pthread_mutex_lock(&q->mu);
    bool ok = q->nnomem < OVLD_CQ_NOMEM_SLOTS;
    if (ok) {
        q->nomem[q->nnomem].cookie = cookie;
        q->nomem[q->nnomem].seq = seq;
        q->nnomem++;
    } else {
        q->nomem_lost++;
    }
    pthread_mutex_unlock(&q->mu);
    if (ok)
        uv_async_send(&q->async);
    return ok;
}

void ovld_cq_push(ovld_cq_t *q, ovld_cq_node_t *node)
{
    node->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = node;
    else
        q->head = node;
    q->tail = node;
    pthread_mutex_unlock(&q->mu);
    uv_async_send(&q->async);
}

static void on_closed(uv_handle_t *h)
{
    ovld_cq_t *q = h->data;
    pthread_mutex_destroy(&q->mu);
    if (q->closed)
        q->closed(q);
}

void ovld_cq_close(ovld_cq_t *q, void (*closed)(ovld_cq_t *q))
{
    drain(q);
    q->closed = closed;
    uv_close((uv_handle_t *)&q->async, on_closed);
}

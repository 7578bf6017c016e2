/*
 * backend_host.c: the host backend. Every "device" is host memory; a stream
 * is a worker thread with a FIFO of work; an event is a pair of counters
 * (records enqueued, records completed); an all-gather (either NCCL
 * method) is a barrier plus memcpy between the ranks' buffers, a rail the
 * same between each sender and its receivers (rows of ranks that other
 * daemons serve move through the job's mover, backend.h); a GEMM is
 * hostgemm.c; the doorbell is a page of a memfd that the client maps too.
 * It runs the same plans as the CUDA backend and returns real results, so
 * that everything but the CUDA calls is exercised without a GPU.
 *
 * Its parts: backend_host.c (the vtable, create/destroy, devices),
 * host_rank.c, host_mem.c and host_coll.c; host_internal.h is what they
 * share.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "host_internal.h"

/* ------------------------------------------------- errors, in one place */

_Thread_local char host_last_err[200];

ovl_status_t host_fail(ovl_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(host_last_err, sizeof(host_last_err), fmt, ap);
    va_end(ap);
    return st;
}

static const char *host_last_error(ovld_backend_t *b)
{
    (void)b;
    return host_last_err;
}

/* ------------------------------------------------------------ the ops */

static void handle_gone(host_backend_t *hb)
{
    if (--hb->handles > 0)
        return;
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    free(hb);
}

static void on_cq_closed(ovld_cq_t *q)
{
    handle_gone((host_backend_t *)((char *)q - offsetof(host_backend_t, cq)));
}

static void on_setup_closed(uv_handle_t *h)
{
    handle_gone(h->data);
}

/* A job_setup's callback, for the loop's next turn. */
typedef struct host_setup {
    struct host_setup *next;
    ovld_setup_cb cb;
    void *arg;
    ovl_status_t status;
    char message[200];
} host_setup_t;

static void host_destroy(ovld_backend_t *b)
{
    host_backend_t *hb = (host_backend_t *)b;
    /* Whatever still waits (an event, a collective, a transfer) stops
     * waiting. */
    pthread_mutex_lock(&hb->mu);
    atomic_store(&hb->stopping, true);
    pthread_cond_broadcast(&hb->cv);
    pthread_mutex_unlock(&hb->mu);
    /* Nobody is left to hear of a setup (ovld destroys the backend once its
     * jobs are gone). */
    while (hb->setups) {
        host_setup_t *su = hb->setups;
        hb->setups = su->next;
        free(su);
    }
    /* hb is freed once both async handles are closed (handle_gone), which
     * the loop does before uv_run returns. */
    uv_close((uv_handle_t *)&hb->setup_async, on_setup_closed);
    ovld_cq_close(&hb->cq, on_cq_closed);
}

static void on_setup_async(uv_async_t *h)
{
    host_backend_t *hb = h->data;
    /* in the order of the calls: the list is last first */
    host_setup_t *su = NULL;
    while (hb->setups) {
        host_setup_t *next = hb->setups->next;
        hb->setups->next = su;
        su = hb->setups;
        hb->setups = next;
    }
    while (su) {
        host_setup_t *next = su->next;
        su->cb(su->arg, su->status, su->message);
        free(su);
        su = next;
    }
}

/* Checks what a job across nodes says of its local ranks; words in why. */
static ovl_status_t net_check(ovld_rank_t *const *ranks, uint32_t n, const ovld_job_net_t *net,
                              char *why, size_t whylen)
{
    if (!net->xfer || !net->mover) {
        snprintf(why, whylen,
                 "a job across nodes without a mover: the host backend moves the rows of other "
                 "nodes' ranks with the job's mover (net/xfer.h)");
        return OVL_ERR_INVALID;
    }
    if (n == 0 || n > net->world || net->self_node >= net->nnodes) {
        snprintf(why, whylen, "%u of %u ranks here, node %u of %u", n, net->world, net->self_node,
                 net->nnodes);
        return OVL_ERR_INVALID;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t g = net->global[i];
        if (g >= net->world || net->node_of[g] != net->self_node || !ranks[i]) {
            snprintf(why, whylen, "local rank %u is rank %u of %u, on node %u (this is node %u)", i,
                     g, net->world, g < net->world ? net->node_of[g] : 0, net->self_node);
            return OVL_ERR_INVALID;
        }
        for (uint32_t k = 0; k < i; k++)
            if (net->global[k] == g) {
                snprintf(why, whylen, "rank %u is here twice", g);
                return OVL_ERR_INVALID;
            }
    }
    return OVL_OK;
}

/*
 * Nothing to make: the collectives are the backend's own threads. A job
 * across nodes has its ranks learn where they are in it and its mover;
 * one on this daemon alone stays as it is. Either way cb runs on the
 * loop's next turn (a refusal there too, with words).
 */
static ovl_status_t host_job_setup(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                                   const ovld_job_net_t *net, bool collective, ovld_setup_cb cb,
                                   void *arg)
{
    host_backend_t *hb = (host_backend_t *)b;
    (void)collective;
    host_setup_t *su = calloc(1, sizeof(*su));
    if (!su)
        return OVL_ERR_NOMEM;
    su->cb = cb;
    su->arg = arg;
    if (net && (su->status = net_check(ranks, n, net, su->message, sizeof(su->message))) == OVL_OK)
        for (uint32_t i = 0; i < n; i++) {
            ranks[i]->global = net->global[i];
            ranks[i]->world = net->world;
            ranks[i]->xfer = net->xfer;
            ranks[i]->mover = net->mover;
        }
    su->next = hb->setups;
    hb->setups = su;
    int rc = uv_async_send(&hb->setup_async);
    if (rc != 0) {
        hb->setups = su->next;
        free(su);
        return OVL_ERR_SYSTEM;
    }
    return OVL_OK;
}

static uint32_t host_device_count(ovld_backend_t *b)
{
    return ((host_backend_t *)b)->ndevices;
}

static void host_device_info(ovld_backend_t *b, uint32_t index, ovld_device_info_t *ret)
{
    host_backend_t *hb = (host_backend_t *)b;
    memset(ret, 0, sizeof(*ret));
    memcpy(ret->uuid, "ovl-host", 8);
    for (int i = 0; i < 8; i++)
        ret->uuid[8 + i] = (uint8_t)((uint64_t)index >> (8 * (7 - i)));
    snprintf(ret->name, sizeof(ret->name), "host-%u", index);
    ret->total_memory = hb->device_memory;
}

static void host_device_usage(ovld_backend_t *b, uint32_t index, uint32_t *streams, uint64_t *bytes)
{
    host_backend_t *hb = (host_backend_t *)b;
    *streams = 0;
    *bytes = 0;
    pthread_mutex_lock(&hb->mu);
    for (struct ovld_rank *r = hb->ranks; r; r = r->next) {
        if (r->device != index)
            continue;
        *bytes += OVL_DOORBELL_SIZE + r->scratch_bytes;
        for (uint32_t i = 0; i < r->nstreams; i++)
            *streams += r->streams[i]->started;
    }
    pthread_mutex_unlock(&hb->mu);
}

static const ovld_backend_ops_t host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .device_count = host_device_count,
    .device_info = host_device_info,
    .device_usage = host_device_usage,
    .import_blocking = false,
    .mem_import = host_mem_import,
    .mem_release = host_mem_release,
    .rank_create = host_rank_create,
    .rank_destroy = host_rank_destroy,
    .rank_release = host_rank_release,
    .job_setup = host_job_setup,
    .rank_scratch = host_rank_scratch,
    .issue_parallel = true,
    .reserve_events = host_reserve_events,
    .set_streams = host_set_streams,
    .wait_ready = host_wait_ready,
    .time_start = host_time_start,
    .record = host_record,
    .wait = host_wait,
    .allgather = host_allgather,
    .rail = host_rail,
    .reduce_scatter = host_reduce_scatter,
    .copy = host_copy,
    .gemm = host_gemm,
    .reduce = host_reduce,
    .sleep = host_sleep,
    .done = host_done,
    .last_error = host_last_error,
};

ovl_status_t ovld_backend_host_create(uv_loop_t *loop, const ovld_config_t *cfg,
                                      ovld_done_cb done_cb, void *done_arg,
                                      const ovld_reporter_t *report, ovld_backend_t **ret,
                                      char *err, size_t errlen)
{
    host_backend_t *hb = calloc(1, sizeof(*hb));
    if (!hb) {
        snprintf(err, errlen, "host backend: out of memory");
        return OVL_ERR_NOMEM;
    }
    hb->base.ops = &host_ops;
    if (report)
        hb->base.report = *report;
    hb->ndevices = cfg->host_devices;
    struct sysinfo si;
    hb->device_memory = sysinfo(&si) == 0 ? (uint64_t)si.totalram * si.mem_unit : 0;
    if (pthread_mutex_init(&hb->mu, NULL) != 0 || pthread_cond_init(&hb->cv, NULL) != 0) {
        snprintf(err, errlen, "host backend: cannot create locks");
        free(hb);
        return OVL_ERR_SYSTEM;
    }
    int rc = ovld_cq_init(&hb->cq, loop, done_cb, done_arg);
    if (rc != 0) {
        snprintf(err, errlen, "host backend: completion queue: %s", uv_strerror(rc));
        free(hb);
        return OVL_ERR_SYSTEM;
    }
    hb->handles = 1;
    if ((rc = uv_async_init(loop, &hb->setup_async, on_setup_async)) != 0) {
        snprintf(err, errlen, "host backend: uv_async_init: %s", uv_strerror(rc));
        ovld_cq_close(&hb->cq, on_cq_closed); /* frees hb */
        return OVL_ERR_SYSTEM;
    }
    hb->setup_async.data = hb;
    hb->handles = 2;
    *ret = &hb->base;
    return OVL_OK;
}

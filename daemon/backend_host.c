/*
 * backend_host.c: the host backend. Every "device" is host memory; a stream
 * is a worker thread with a FIFO of work; an event is a pair of counters
 * (records enqueued, records completed); an all-gather (either NCCL
 * method) is a barrier plus memcpy between the ranks' buffers, a rail the
 * same between each sender and its receivers; a GEMM is
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

static void on_cq_closed(ovld_cq_t *q)
{
    host_backend_t *hb = (host_backend_t *)((char *)q - offsetof(host_backend_t, cq));
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    free(hb);
}

static void host_destroy(ovld_backend_t *b)
{
    host_backend_t *hb = (host_backend_t *)b;
    atomic_store(&hb->stopping, true);
    /* hb is freed once the async handle is closed (on_cq_closed), which the
     * loop does before uv_run returns. */
    ovld_cq_close(&hb->cq, on_cq_closed);
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
    .rank_scratch = host_rank_scratch,
    .issue_parallel = true,
    .reserve_events = host_reserve_events,
    .set_streams = host_set_streams,
    .wait_ready = host_wait_ready,
    .record = host_record,
    .wait = host_wait,
    .allgather = host_allgather,
    .rail = host_rail,
    .copy = host_copy,
    .gemm = host_gemm,
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
    *ret = &hb->base;
    return OVL_OK;
}

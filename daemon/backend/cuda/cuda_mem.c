/*
 * cuda_mem.c: client buffers of the CUDA backend. They arrive as CUDA IPC
 * handles, opened once per (device, handle) and kept in a reference-counted
 * cache; closing, which may synchronize, goes to a worker thread unless the
 * caller is one.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_internal.h"

/* One opened IPC handle on one device. */
struct ipc_entry {
    int device;
    uint8_t handle[sizeof(cudaIpcMemHandle_t)];
    void *ptr;
    size_t size; /* of the allocation behind the handle */
    uint32_t refs;
    struct ipc_entry *next;
};

struct ovld_bmem {
    ipc_entry_t *entry;
};

/* ---------------------------------------------------------------- memory */

ovl_status_t cuda_mem_import(ovld_backend_t *b, const ovld_mem_import_t *imp, ovld_bmem_t **ret_mem,
                             void **ret_ptr, char *err, size_t errlen)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    if (imp->fd >= 0)
        close(imp->fd); /* CUDA buffers come as IPC handles, never as fds */
    if (imp->fd >= 0 || !imp->ipc || imp->ipc_len != sizeof(cudaIpcMemHandle_t)) {
        if (imp->fd >= 0)
            snprintf(err, errlen, "the CUDA backend maps CUDA IPC handles, not memfds");
        else
            snprintf(err, errlen, "a CUDA IPC handle is %zu bytes, not %zu",
                     sizeof(cudaIpcMemHandle_t), imp->ipc ? imp->ipc_len : 0);
        return OVL_ERR_INVALID;
    }
    if (imp->device < 0 || (uint32_t)imp->device >= cb->ndev) {
        snprintf(err, errlen, "the memory is on no device of ovld's");
        return OVL_ERR_INVALID;
    }
    ovld_bmem_t *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    ovl_status_t st = OVL_OK;
    pthread_mutex_lock(&cb->ipc_mu);
    ipc_entry_t *e = cb->ipc;
    while (e && !(e->device == imp->device && memcmp(e->handle, imp->ipc, imp->ipc_len) == 0))
        e = e->next;
    if (e) {
        e->refs++;
        cb->ipc_hits++;
    }
    pthread_mutex_unlock(&cb->ipc_mu);
    if (!e) {
        /* Opened without the lock: it takes up to 2 ms, and the loop thread
         * takes the lock to release and count. */
        ipc_entry_t *ne = calloc(1, sizeof(*ne));
        if (!ne) {
            free(m);
            snprintf(err, errlen, "out of memory");
            return OVL_ERR_NOMEM;
        }
        cudaIpcMemHandle_t h;
        memcpy(&h, imp->ipc, sizeof(h));
        /* In the context of the GPU that reads it (API-NOTES 3.1). */
        const char *what = "cudaSetDevice";
        cudaError_t ce = cudaSetDevice(cb->devs[imp->device].ordinal);
        if (ce == cudaSuccess) {
            what = "cudaIpcOpenMemHandle";
            ce = cudaIpcOpenMemHandle(&ne->ptr, h, cudaIpcMemLazyEnablePeerAccess);
        }
        CUdeviceptr base = 0;
        size_t size = 0;
        if (ce == cudaSuccess &&
            cb->drv.mem_get_address_range(&base, &size, (CUdeviceptr)ne->ptr) != CUDA_SUCCESS)
            size = 0;
        if (ce != cudaSuccess) {
            snprintf(err, errlen, "%s on device %d: %s", what, imp->device, cudaGetErrorString(ce));
            free(ne);
            free(m);
            return OVL_ERR_BACKEND;
        }
        ne->device = imp->device;
        memcpy(ne->handle, imp->ipc, imp->ipc_len);
        ne->size = size;
        ne->refs = 1;
        pthread_mutex_lock(&cb->ipc_mu);
        /* Another connection may have opened the same handle meanwhile: the
         * driver counted both opens, so keep one entry and close the other. */
        e = cb->ipc;
        while (e && !(e->device == imp->device && memcmp(e->handle, imp->ipc, imp->ipc_len) == 0))
            e = e->next;
        if (e) {
            e->refs++;
            cb->ipc_hits++;
        } else {
            cb->ipc_misses++;
            ne->next = cb->ipc;
            cb->ipc = ne;
            e = ne;
            ne = NULL;
        }
        pthread_mutex_unlock(&cb->ipc_mu);
        if (ne) {
            cudaIpcCloseMemHandle(ne->ptr);
            free(ne);
        }
    }
    /* What the client says it registered must lie inside the allocation the
     * handle names: ovld's own copies and GEMMs are bounded by this. */
    uint64_t end;
    if (__builtin_add_overflow(imp->ipc_offset, imp->bytes, &end) || end > e->size) {
        snprintf(err, errlen,
                 "device %d: registration of %" PRIu64 " bytes at offset %" PRIu64
                 " exceeds its allocation of %zu bytes",
                 imp->device, imp->bytes, imp->ipc_offset, e->size);
        m->entry = e;
        cuda_mem_release(b, m, true);
        return OVL_ERR_RANGE;
    }
    m->entry = e;
    *ret_mem = m;
    *ret_ptr = (char *)e->ptr + imp->ipc_offset;
    (void)st;
    return OVL_OK;
}

typedef struct release_work {
    uv_work_t req;
    cuda_backend_t *cb;
    ipc_entry_t *entry;
} release_work_t;

static void release_run(uv_work_t *req)
{
    release_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    if (cudaSetDevice(cb->devs[w->entry->device].ordinal) == cudaSuccess) {
        cudaError_t ce = cudaIpcCloseMemHandle(w->entry->ptr);
        /* release has no status to give back (a deregistration succeeds
         * regardless): what went wrong is reported. */
        if (ce != cudaSuccess)
            ovld_report(&cb->base.report, OVLD_REPORT_WARN, "cudaIpcCloseMemHandle: %s",
                        cudaGetErrorString(ce));
    }
    free(w->entry);
}

static void release_after(uv_work_t *req, int status)
{
    (void)status;
    release_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    free(w);
    cuda_work_done(cb);
}

void cuda_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    if (!m)
        return;
    ipc_entry_t *dead = NULL;
    pthread_mutex_lock(&cb->ipc_mu);
    if (--m->entry->refs == 0) {
        for (ipc_entry_t **pp = &cb->ipc; *pp; pp = &(*pp)->next)
            if (*pp == m->entry) {
                *pp = m->entry->next;
                break;
            }
        dead = m->entry;
    }
    pthread_mutex_unlock(&cb->ipc_mu);
    free(m);
    if (!dead)
        return;
    if (may_block) {
        release_work_t now = {.cb = cb, .entry = dead};
        release_run(&(uv_work_t){.data = &now});
        return;
    }
    /* Closing costs 0.1 ms and may synchronize: not on the loop thread. */
    release_work_t *w = calloc(1, sizeof(*w));
    if (w) {
        w->req.data = w;
        w->cb = cb;
        w->entry = dead;
        atomic_fetch_add(&cb->works, 1);
        if (uv_queue_work(cb->loop, &w->req, release_run, release_after) == 0)
            return;
        atomic_fetch_sub(&cb->works, 1);
        free(w);
    }
    w = &(release_work_t){.cb = cb, .entry = dead};
    release_run(&(uv_work_t){.data = w});
}

void cuda_mem_cache_stats(ovld_backend_t *b, uint64_t *hits, uint64_t *misses)
{
    cuda_backend_t *cb = (cuda_backend_t *)b;
    pthread_mutex_lock(&cb->ipc_mu);
    *hits = cb->ipc_hits;
    *misses = cb->ipc_misses;
    pthread_mutex_unlock(&cb->ipc_mu);
}

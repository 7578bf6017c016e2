/*
 * libovl_cuda.c: libovl's CUDA (libovl_cuda.h), built only with CUDA:
 * device UUIDs, registering device memory, the doorbell page as the GPU
 * sees it, and each op's ready and done on the caller's stream.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "clock.h"
#include "cudrv.h"
#include "doorbell.h"
#include "libovl_cuda.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == LIBOVL_IPC_HANDLE_LEN, "IPC handle size");
_Static_assert(sizeof(((struct cudaDeviceProp *)0)->uuid.bytes) == LIBOVL_UUID_LEN, "UUID size");

#define DOORBELL_IDLE_WAIT_MS 2000

struct libovl_cuda {
    ovl_cudrv_t drv;
};

struct libovl_cuda_doorbell {
    void *map;               /* the mapping registered with CUDA */
    struct ovl_doorbell *db; /* the page, as the GPU sees it */
    /* Recorded on the caller's stream after each op's wait on the page, so
     * that the page is unregistered only once no wait can still read it. */
    cudaEvent_t waited;
    bool waited_lost; /* a record failed: the last wait's end is unknown */
};

static ovl_status_t cuda_fail(ovl_client_t *cl, cudaError_t e, const char *what)
{
    return libovl_fail(cl, e == cudaErrorMemoryAllocation ? OVL_ERR_NOMEM : OVL_ERR_BACKEND,
                       "%s: %s", what, cudaGetErrorString(e));
}

/* Loads the driver entry points on first use. */
static ovl_status_t cuda_load(ovl_client_t *cl, libovl_cuda_t **cu)
{
    if (*cu)
        return OVL_OK;
    libovl_cuda_t *c = calloc(1, sizeof(*c));
    if (!c)
        return libovl_fail(cl, OVL_ERR_NOMEM, "out of memory");
    char why[256];
    if (ovl_cudrv_load(&c->drv, why, sizeof(why)) != 0) {
        free(c);
        return libovl_fail(cl, OVL_ERR_UNSUPPORTED, "the CUDA driver API is not available: %s",
                           why);
    }
    *cu = c;
    return OVL_OK;
}

ovl_status_t libovl_cuda_present(ovl_client_t *cl)
{
    (void)cl;
    return OVL_OK;
}

void libovl_cuda_free(libovl_cuda_t *cu)
{
    free(cu);
}

ovl_status_t libovl_cuda_device_uuid(ovl_client_t *cl, int device, uint8_t uuid[LIBOVL_UUID_LEN])
{
    struct cudaDeviceProp prop;
    cudaError_t ce = cudaGetDeviceProperties(&prop, device);
    if (ce != cudaSuccess)
        return libovl_fail(cl, OVL_ERR_NOT_FOUND, "CUDA device %d: %s", device,
                           cudaGetErrorString(ce));
    memcpy(uuid, prop.uuid.bytes, LIBOVL_UUID_LEN);
    return OVL_OK;
}

ovl_status_t libovl_cuda_mem_alloc(ovl_client_t *cl, libovl_cuda_t **cu, const void *ptr,
                                   size_t bytes, libovl_cuda_alloc_t *ret)
{
    ovl_status_t st = cuda_load(cl, cu);
    if (st != OVL_OK)
        return st;
    const ovl_cudrv_t *drv = &(*cu)->drv;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult cr = drv->mem_get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
    if (cr != CUDA_SUCCESS)
        return libovl_fail(cl, OVL_ERR_INVALID,
                           "%p is not device memory (cuMemGetAddressRange: %s)", ptr,
                           ovl_cudrv_strerror(drv, cr));
    if ((uintptr_t)ptr + bytes > (uintptr_t)base + size || (uintptr_t)ptr + bytes < (uintptr_t)ptr)
        return libovl_fail(cl, OVL_ERR_RANGE,
                           "%p + %zu bytes runs past its allocation (%zu bytes at 0x%llx)", ptr,
                           bytes, size, (unsigned long long)base);
    cudaIpcMemHandle_t h;
    cudaError_t ce = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
    if (ce != cudaSuccess)
        return cuda_fail(cl, ce, "cudaIpcGetMemHandle (memory from cudaMalloc is needed)");
    unsigned long long id = 0;
    cr = drv->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base);
    if (cr != CUDA_SUCCESS || id == 0)
        return libovl_fail(cl, OVL_ERR_BACKEND, "%p: no buffer id (cuPointerGetAttribute: %s)", ptr,
                           cr != CUDA_SUCCESS ? ovl_cudrv_strerror(drv, cr) : "0");
    ret->buffer_id = id;
    ret->base = (uintptr_t)base;
    ret->size = size;
    memcpy(ret->handle, &h, sizeof(h));
    return OVL_OK;
}

uint64_t libovl_cuda_buffer_id(const libovl_cuda_t *cu, const void *ptr)
{
    unsigned long long id = 0;
    if (!cu || cu->drv.pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                             (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
        return 0;
    return id;
}

ovl_status_t libovl_cuda_mem_device_uuid(ovl_client_t *cl, const void *ptr,
                                         uint8_t uuid[LIBOVL_UUID_LEN])
{
    struct cudaPointerAttributes pa;
    cudaError_t ce = cudaPointerGetAttributes(&pa, ptr);
    if (ce != cudaSuccess)
        return cuda_fail(cl, ce, "cudaPointerGetAttributes");
    struct cudaDeviceProp prop;
    if ((ce = cudaGetDeviceProperties(&prop, pa.device)) != cudaSuccess)
        return cuda_fail(cl, ce, "cudaGetDeviceProperties");
    memcpy(uuid, prop.uuid.bytes, LIBOVL_UUID_LEN);
    return OVL_OK;
}

ovl_status_t libovl_cuda_doorbell_register(ovl_client_t *cl, int device, void *map, size_t map_len,
                                           struct ovl_doorbell *db, libovl_cuda_doorbell_t **ret)
{
    libovl_cuda_doorbell_t *cd = calloc(1, sizeof(*cd));
    if (!cd)
        return libovl_fail(cl, OVL_ERR_NOMEM, "out of memory");
    bool registered = false;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaError_t ce = cudaSetDevice(device);
    const char *what = "cudaSetDevice";
    if (ce == cudaSuccess) {
        what = "cudaHostRegister (doorbell)";
        ce = cudaHostRegister(map, map_len, cudaHostRegisterMapped | cudaHostRegisterPortable);
        registered = ce == cudaSuccess;
    }
    if (ce == cudaSuccess) {
        void *dp = NULL;
        what = "cudaHostGetDevicePointer (doorbell)";
        ce = cudaHostGetDevicePointer(&dp, db, 0);
        cd->db = dp;
    }
    if (ce == cudaSuccess) {
        what = "cudaEventCreateWithFlags (doorbell)";
        ce = cudaEventCreateWithFlags(&cd->waited, cudaEventDisableTiming);
    }
    cudaSetDevice(prev);
    if (ce != cudaSuccess) {
        if (registered)
            cudaHostUnregister(map);
        free(cd);
        return cuda_fail(cl, ce, what);
    }
    cd->map = map;
    *ret = cd;
    return OVL_OK;
}

/* Its last op's wait, recorded by `waited`, has completed (the earlier ones
 * are ordered before it, or long over: their done rang first). */
bool libovl_cuda_doorbell_idle(libovl_cuda_doorbell_t *cd)
{
    if (cd->waited_lost)
        return false;
    uint64_t deadline = ovl_mono_ms() + DOORBELL_IDLE_WAIT_MS;
    for (;;) {
        cudaError_t e = cudaEventQuery(cd->waited);
        if (e == cudaSuccess)
            return true;
        if (e != cudaErrorNotReady) {
            cudaGetLastError(); /* not the application's error to find later */
            return false;
        }
        if (ovl_mono_ms() >= deadline)
            return false;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

void libovl_cuda_doorbell_free(libovl_cuda_doorbell_t *cd, bool unregister)
{
    if (!cd)
        return;
    if (unregister)
        cudaHostUnregister(cd->map);
    cudaEventDestroy(cd->waited);
    free(cd);
}

ovl_status_t libovl_cuda_submit(ovl_client_t *cl, libovl_cuda_t **cu, libovl_cuda_doorbell_t *cd,
                                void *stream, uint64_t seq)
{
    ovl_status_t st = cuda_load(cl, cu);
    if (st != OVL_OK)
        return st;
    const ovl_cudrv_t *drv = &(*cu)->drv;
    /* One batch, its operations run in the array's order: about 0.9 us of
     * host time against 1.8 for the two calls (bench/issue_lab.c). */
    CUstreamBatchMemOpParams ops[2] = {
        ovl_cudrv_op_write((CUdeviceptr)(uintptr_t)&cd->db->ready_slot[seq % OVL_READY_SLOTS], seq,
                           true),
        ovl_cudrv_op_wait_geq((CUdeviceptr)(uintptr_t)&cd->db->done_slot[seq % OVL_READY_SLOTS],
                              seq),
    };
    CUresult cr = drv->stream_batch_mem_op((CUstream)stream, 2, ops, 0);
    if (cr != CUDA_SUCCESS)
        return libovl_fail(cl, OVL_ERR_BACKEND, "cuStreamBatchMemOp (doorbell ready, done): %s",
                           ovl_cudrv_strerror(drv, cr));
    /* Where the stream will be past this wait (libovl_cuda_doorbell_idle). */
    if (cudaEventRecord(cd->waited, (cudaStream_t)stream) != cudaSuccess) {
        cudaGetLastError();
        cd->waited_lost = true;
    }
    return OVL_OK;
}

void libovl_cuda_submit_undo(libovl_cuda_doorbell_t *cd, uint64_t seq)
{
    ovl_doorbell_ring_slot(cd->db, seq);
}

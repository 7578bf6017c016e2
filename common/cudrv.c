/*
 * cudrv.c: see cudrv.h.
 */
#include "cudrv.h"

#include <stdio.h>

#include <cuda_runtime_api.h>

/* Each symbol with the CUDA version whose semantics we ask for. */
static int load(const char *sym, void **fp, char *err, size_t errlen)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fp, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fp) {
        snprintf(err, errlen, "CUDA driver entry point %s: %s", sym,
                 e != cudaSuccess ? cudaGetErrorString(e) : "not found");
        return -1;
    }
    return 0;
}

int ovl_cudrv_load(ovl_cudrv_t *d, char *err, size_t errlen)
{
    if (load("cuStreamWaitValue64", (void **)&d->stream_wait_value64, err, errlen) ||
        load("cuStreamWriteValue64", (void **)&d->stream_write_value64, err, errlen) ||
        load("cuStreamWriteValue32", (void **)&d->stream_write_value32, err, errlen) ||
        load("cuStreamBatchMemOp", (void **)&d->stream_batch_mem_op, err, errlen) ||
        load("cuMemGetAddressRange", (void **)&d->mem_get_address_range, err, errlen) ||
        load("cuPointerGetAttribute", (void **)&d->pointer_get_attribute, err, errlen) ||
        load("cuGetErrorString", (void **)&d->get_error_string, err, errlen))
        return -1;
    return 0;
}

const char *ovl_cuda_why(cudaError_t e)
{
    int v = -1;
    if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&v) == cudaSuccess && v == 0)
        return "no NVIDIA driver is installed, so no GPU can be used "
               "(cudaErrorInsufficientDriver)";
    if (e == cudaErrorInsufficientDriver)
        return "the NVIDIA driver is older than this CUDA runtime needs "
               "(cudaErrorInsufficientDriver)";
    if (e == cudaErrorNoDevice)
        return "no NVIDIA GPU found: the driver sees none, or CUDA_VISIBLE_DEVICES hides them "
               "(cudaErrorNoDevice)";
    return cudaGetErrorString(e);
}

const char *ovl_cudrv_strerror(const ovl_cudrv_t *d, CUresult r)
{
    const char *s = NULL;
    if (d && d->get_error_string && d->get_error_string(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "unknown CUDA driver error";
}

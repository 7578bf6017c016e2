/*
 * cudrv.h: the few CUDA driver-API calls ovl needs (stream memory operations
 * for doorbells, address ranges for registration), reached through the
 * runtime's cudaGetDriverEntryPointByVersion. Nothing links libcuda, so that
 * binaries built with CUDA start (and fall back to the host backend) on
 * machines without a driver. Shared by ovld and libovl; built only with CUDA.
 */
#ifndef OVL_CUDRV_H
#define OVL_CUDRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

typedef struct ovl_cudrv {
    CUresult (*stream_wait_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
    CUresult (*stream_write_value64)(CUstream s, CUdeviceptr addr, cuuint64_t v, unsigned flags);
    CUresult (*stream_write_value32)(CUstream s, CUdeviceptr addr, cuuint32_t v, unsigned flags);
    /* count < 256 waits and writes, enqueued in order by one call */
    CUresult (*stream_batch_mem_op)(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops,
                                    unsigned flags);
    CUresult (*mem_get_address_range)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
    CUresult (*pointer_get_attribute)(void *data, CUpointer_attribute a, CUdeviceptr p);
    CUresult (*get_error_string)(CUresult r, const char **s);
} ovl_cudrv_t;

/* Fills d; 0 on success, -1 with a message in err (no driver, too old). */
int ovl_cudrv_load(ovl_cudrv_t *d, char *err, size_t errlen);

/*
 * The words for a CUDA runtime error e, for users (never NULL): where no
 * NVIDIA driver is installed, CUDA says "CUDA driver version is
 * insufficient for CUDA runtime version" (cudaErrorInsufficientDriver, with
 * a driver version of 0), and where the driver sees no GPU "no CUDA-capable
 * device is detected" (cudaErrorNoDevice): these say so plainly. Other
 * errors are cudaGetErrorString's.
 */
const char *ovl_cuda_why(cudaError_t e);

/* The driver's words for r (never NULL). */
const char *ovl_cudrv_strerror(const ovl_cudrv_t *d, CUresult r);

/* One entry of a stream_batch_mem_op: write v (64 bits, or 32 where not
 * wide) to addr, after all prior work's memory writes (the default flag:
 * whoever sees the value sees what the stream wrote before it). */
static inline CUstreamBatchMemOpParams ovl_cudrv_op_write(CUdeviceptr addr, uint64_t v, bool wide)
{
    CUstreamBatchMemOpParams p;
    memset(&p, 0, sizeof(p));
    p.writeValue.operation =
        wide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
    p.writeValue.address = addr;
    if (wide)
        p.writeValue.value64 = v;
    else
        p.writeValue.value = (cuuint32_t)v;
    p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    return p;
}

/* One entry of a stream_batch_mem_op: wait until the 64 bits at addr are
 * >= v (compared as the GPU does, cyclically). */
static inline CUstreamBatchMemOpParams ovl_cudrv_op_wait_geq(CUdeviceptr addr, uint64_t v)
{
    CUstreamBatchMemOpParams p;
    memset(&p, 0, sizeof(p));
    p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
    p.waitValue.address = addr;
    p.waitValue.value64 = v;
    p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    return p;
}

#endif /* OVL_CUDRV_H */

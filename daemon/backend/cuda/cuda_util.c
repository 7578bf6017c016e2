/*
 * cuda_util.c: what every file of the CUDA backend shares and none owns:
 * the thread's last failure in words, making a device current, whether the
 * thread is capturing a replay, and the count of work items that decides
 * who frees the backend. A leaf: it calls no other file of the backend.
 */
#include <stdlib.h>

#include "cuda_internal.h"

/* The last enqueue failure of this thread, in words: exec.c asks for it
 * (last_error) on the thread that issued the failed call. */
_Thread_local char cuda_last_err[256];

ovl_status_t cuda_set_device(cuda_backend_t *cb, cuda_dev_t *dev)
{
    CUDA_TRY(cb, cudaSetDevice(dev->ordinal), "device");
    return OVL_OK;
}

/* Set by cuda_graph.c while this thread captures an op's body. */
_Thread_local bool cuda_capturing;

bool cuda_in_capture(cudaStream_t s)
{
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive;
}

void cuda_backend_free(cuda_backend_t *cb)
{
    for (uint32_t i = 0; i < cb->ndev; i++)
        if (cb->devs[i].lt) {
            cudaSetDevice(cb->devs[i].ordinal);
            ovld_lt_destroy(cb->devs[i].lt);
        }
    free(cb->devs);
    pthread_mutex_destroy(&cb->ipc_mu);
    pthread_mutex_destroy(&cb->ranks_mu);
    pthread_mutex_destroy(&cb->poll_mu);
    pthread_cond_destroy(&cb->poll_cv);
    free(cb);
}

/* After a work item: the backend may have been destroyed meanwhile. */
void cuda_work_done(cuda_backend_t *cb)
{
    if (atomic_fetch_sub(&cb->works, 1) == 1 && cb->cq_closed)
        cuda_backend_free(cb);
}

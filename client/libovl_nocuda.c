/*
 * libovl_nocuda.c: libovl_cuda.h in a libovl built without CUDA. Only the
 * host backend can be used: what needs CUDA fails with OVL_ERR_UNSUPPORTED.
 * No comm ever gets a libovl_cuda_doorbell_t, nor a client a libovl_cuda_t.
 */
#include "libovl_cuda.h"

/* Why, naming the backend ovld runs. */
static ovl_status_t unsupported(ovl_client_t *cl)
{
    ovl_daemon_info_t info;
    if (ovl_daemon_info(cl, &info) != OVL_OK)
        info.backend[0] = '\0';
    return libovl_fail(cl, OVL_ERR_UNSUPPORTED, "this libovl was built without CUDA; ovld runs %s",
                       info.backend);
}

ovl_status_t libovl_cuda_present(ovl_client_t *cl)
{
    return libovl_fail(cl, OVL_ERR_UNSUPPORTED, "this libovl was built without CUDA");
}

void libovl_cuda_free(libovl_cuda_t *cu)
{
    (void)cu;
}

ovl_status_t libovl_cuda_device_uuid(ovl_client_t *cl, int device, uint8_t uuid[LIBOVL_UUID_LEN])
{
    (void)device;
    (void)uuid;
    return unsupported(cl);
}

ovl_status_t libovl_cuda_mem_alloc(ovl_client_t *cl, libovl_cuda_t **cu, const void *ptr,
                                   size_t bytes, libovl_cuda_alloc_t *ret)
{
    (void)cu;
    (void)ptr;
    (void)bytes;
    (void)ret;
    return unsupported(cl);
}

uint64_t libovl_cuda_buffer_id(const libovl_cuda_t *cu, const void *ptr)
{
    (void)cu;
    (void)ptr;
    return 0;
}

ovl_status_t libovl_cuda_mem_device_uuid(ovl_client_t *cl, const void *ptr,
                                         uint8_t uuid[LIBOVL_UUID_LEN])
{
    (void)ptr;
    (void)uuid;
    return unsupported(cl);
}

ovl_status_t libovl_cuda_doorbell_register(ovl_client_t *cl, int device, void *map, size_t map_len,
                                           struct ovl_doorbell *db, libovl_cuda_doorbell_t **ret)
{
    (void)device;
    (void)map;
    (void)map_len;
    (void)db;
    (void)ret;
    return libovl_cuda_present(cl);
}

bool libovl_cuda_doorbell_idle(libovl_cuda_doorbell_t *cd)
{
    (void)cd;
    return true;
}

void libovl_cuda_doorbell_free(libovl_cuda_doorbell_t *cd, bool unregister)
{
    (void)cd;
    (void)unregister;
}

ovl_status_t libovl_cuda_submit(ovl_client_t *cl, libovl_cuda_t **cu, libovl_cuda_doorbell_t *cd,
                                void *stream, uint64_t seq)
{
    (void)cu;
    (void)cd;
    (void)stream;
    (void)seq;
    return libovl_cuda_present(cl);
}

void libovl_cuda_submit_undo(libovl_cuda_doorbell_t *cd, uint64_t seq)
{
    (void)cd;
    (void)seq;
}

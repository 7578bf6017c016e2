/*
 * libovl_cuda.h: all that libovl.c asks of CUDA, private to libovl (the
 * library's hidden visibility keeps it out of libovl.so's exports).
 * libovl_cuda.c implements it in a CUDA build, libovl_nocuda.c in a build
 * without CUDA, where what needs CUDA fails with OVL_ERR_UNSUPPORTED; the
 * build compiles exactly one of them. A failure says why in the client's
 * last error, through libovl_fail.
 */
#ifndef OVL_LIBOVL_CUDA_H
#define OVL_LIBOVL_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ovl.h"

struct ovl_doorbell;

#define LIBOVL_UUID_LEN       16 /* a device's UUID, as ovld knows it */
#define LIBOVL_IPC_HANDLE_LEN 64 /* a cudaIpcMemHandle_t */

/* libovl.c's: sets the client's last error and returns st. */
ovl_status_t libovl_fail(ovl_client_t *cl, ovl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A client's CUDA state (the driver's entry points), made on first use:
 * NULL until then; freed with the client. */
typedef struct libovl_cuda libovl_cuda_t;

/* A comm's doorbell page registered with CUDA, as the GPU sees it: the
 * caller's stream writes its ready slots and waits on its done slots; ovld's
 * stream does the converse, and ovld can end both sides' waits with CPU
 * stores should this process die. */
typedef struct libovl_cuda_doorbell libovl_cuda_doorbell_t;

/* OVL_OK where this libovl can drive a GPU backend (a CUDA build). */
ovl_status_t libovl_cuda_present(ovl_client_t *cl);

void libovl_cuda_free(libovl_cuda_t *cu);

/* The UUID of CUDA device `device`, an ordinal of this process's (its
 * CUDA_VISIBLE_DEVICES): OVL_ERR_NOT_FOUND if there is none. */
ovl_status_t libovl_cuda_device_uuid(ovl_client_t *cl, int device, uint8_t uuid[LIBOVL_UUID_LEN]);

/* The whole allocation holding [ptr, ptr+bytes) (caching allocators hand
 * out pointers inside larger blocks, and an IPC handle always names the
 * allocation's base: API-NOTES 3.1), its IPC handle and its buffer id
 * (libovl_cuda_buffer_id). Loads *cu first. */
typedef struct libovl_cuda_alloc {
    uintptr_t base;
    size_t size;
    uint64_t buffer_id;
    uint8_t handle[LIBOVL_IPC_HANDLE_LEN];
} libovl_cuda_alloc_t;
ovl_status_t libovl_cuda_mem_alloc(ovl_client_t *cl, libovl_cuda_t **cu, const void *ptr,
                                   size_t bytes, libovl_cuda_alloc_t *ret);

/* The driver's id of the allocation holding ptr
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID: unique within the process, never given
 * to a later allocation, so an allocation freed and its address handed out
 * again has another id), in *ret; 0 where ptr is no CUDA allocation or the
 * driver is not loaded yet. One driver call, no IPC: what the submit path
 * asks of a buffer it has registered before. */
uint64_t libovl_cuda_buffer_id(const libovl_cuda_t *cu, const void *ptr);

/* The UUID of the device that holds ptr. */
ovl_status_t libovl_cuda_mem_device_uuid(ovl_client_t *cl, const void *ptr,
                                         uint8_t uuid[LIBOVL_UUID_LEN]);

/* Registers the doorbell page db, inside the mapping [map, map+map_len),
 * with CUDA on `device`. On failure nothing stays registered. */
ovl_status_t libovl_cuda_doorbell_register(ovl_client_t *cl, int device, void *map, size_t map_len,
                                           struct ovl_doorbell *db, libovl_cuda_doorbell_t **ret);

/* Whether the caller's streams are past every wait they had on the page;
 * gives up, false, after a while (a stream held by the application, or an
 * ovld that died and will never ring). */
bool libovl_cuda_doorbell_idle(libovl_cuda_doorbell_t *cd);

/* Frees cd; unregisters the page only if `unregister` (no wait can still
 * read it: see libovl_cuda_doorbell_idle). NULL: nothing. */
void libovl_cuda_doorbell_free(libovl_cuda_doorbell_t *cd, bool unregister);

/* An op on the caller's stream, in one driver call (loading *cu first):
 * ready slot = seq once the work before it is done, then wait until done
 * slot >= seq, so that work after it sees C. No host synchronization. The
 * caller sends the request after it; if that fails,
 * libovl_cuda_submit_undo. */
ovl_status_t libovl_cuda_submit(ovl_client_t *cl, libovl_cuda_t **cu, libovl_cuda_doorbell_t *cd,
                                void *stream, uint64_t seq);

/* Op seq's request never reached ovld whole: its done slot, by a CPU store,
 * so that the caller's stream does not wait for ever on it (ovld may have
 * the op or not: the comm is given up, and C is not to be read). */
void libovl_cuda_submit_undo(libovl_cuda_doorbell_t *cd, uint64_t seq);

#endif

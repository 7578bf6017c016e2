/*
 * host_mem.c: client buffers of the host backend: sealed memfds, mapped
 * shared for the range the client registers.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_internal.h"

struct ovld_bmem {
    void *map;
    size_t map_len;
};

ovl_status_t host_mem_import(ovld_backend_t *b, const ovld_mem_import_t *imp, ovld_bmem_t **ret_mem,
                             void **ret_ptr, char *err, size_t errlen)
{
    (void)b;
    ovl_status_t st = OVL_OK;
    ovld_bmem_t *m = NULL;
    struct stat sb;
    if (imp->fd < 0 || imp->bytes == 0) {
        snprintf(err, errlen, "%s", imp->fd < 0 ? "no memfd came with it" : "zero bytes");
        if (imp->fd >= 0)
            close(imp->fd);
        return OVL_ERR_INVALID;
    }
    if (fstat(imp->fd, &sb) != 0) {
        st = OVL_ERR_INVALID;
        snprintf(err, errlen, "fstat: %s", strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = OVL_ERR_INVALID;
        snprintf(err, errlen, "memory must be a memfd (not a regular file)");
        goto out;
    }
    /* A client that shrank the file under our mapping would fault the
     * daemon: only sealed memory is accepted. */
    int seals = fcntl(imp->fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        st = OVL_ERR_PERMISSION;
        snprintf(err, errlen, "memory must be a sealed memfd (F_SEAL_SHRINK)%s%s%s",
                 seals < 0 ? " (F_GET_SEALS: " : "", seals < 0 ? strerror(errno) : "",
                 seals < 0 ? ")" : "");
        goto out;
    }
    uint64_t end;
    if (__builtin_add_overflow(imp->fd_offset, imp->bytes, &end) || end > (uint64_t)sb.st_size) {
        st = OVL_ERR_RANGE;
        snprintf(err, errlen,
                 "range lies outside the memory passed (%" PRIu64 " bytes at offset %" PRIu64
                 " of a %lld-byte memfd)",
                 imp->bytes, imp->fd_offset, (long long)sb.st_size);
        goto out;
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t base = imp->fd_offset - imp->fd_offset % (uint64_t)page;
    m = calloc(1, sizeof(*m));
    if (!m) {
        st = OVL_ERR_NOMEM;
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    m->map_len = (size_t)(end - base);
    m->map = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, imp->fd, (off_t)base);
    if (m->map == MAP_FAILED) {
        int e = errno;
        st = e == ENOMEM ? OVL_ERR_NOMEM : OVL_ERR_SYSTEM;
        snprintf(err, errlen, "mmap of %zu bytes: %s", m->map_len, strerror(e));
        free(m);
        m = NULL;
        goto out;
    }
    *ret_mem = m;
    *ret_ptr = (char *)m->map + (imp->fd_offset - base);
out:
    close(imp->fd);
    return st;
}

void host_mem_release(ovld_backend_t *b, ovld_bmem_t *m, bool may_block)
{
    (void)b;
    (void)may_block; /* munmap does not block */
    if (!m)
        return;
    munmap(m->map, m->map_len);
    free(m);
}

/*
 * doorbell.c: see doorbell.h. The doorbell's page is made, released and
 * destroyed here, for ovld's backends and for libovl.
 */
#include "doorbell.h"

#include <errno.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

ovl_status_t ovl_doorbell_create(struct ovl_doorbell **ret_db, int *ret_fd)
{
    int fd = memfd_create("ovl-doorbell", MFD_CLOEXEC);
    if (fd < 0)
        return OVL_ERR_SYSTEM;
    void *p = MAP_FAILED;
    if (ftruncate(fd, OVL_DOORBELL_SIZE) == 0)
        p = mmap(NULL, OVL_DOORBELL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return OVL_ERR_SYSTEM;
    }
    /* a new memfd reads as zeros: every counter starts at 0 */
    *ret_db = p;
    *ret_fd = fd;
    return OVL_OK;
}

void ovl_doorbell_destroy(struct ovl_doorbell *db, int fd)
{
    if (db)
        munmap(db, OVL_DOORBELL_SIZE);
    if (fd >= 0)
        close(fd);
}

uint64_t ovl_doorbell_release_slots(struct ovl_doorbell *db, uint64_t seq_hi)
{
    uint64_t v = ovl_doorbell_release_value(seq_hi);
    for (uint32_t i = 0; i < OVL_READY_SLOTS; i++) {
        __atomic_store_n(&db->ready_slot[i], v, __ATOMIC_RELEASE);
        __atomic_store_n(&db->done_slot[i], v, __ATOMIC_RELEASE);
    }
    return v;
}

void ovl_doorbell_release_closed(struct ovl_doorbell *db, uint64_t seq_hi, int32_t status)
{
    uint64_t done = __atomic_load_n(&db->done, __ATOMIC_ACQUIRE);
    uint64_t v = ovl_doorbell_release_value(seq_hi > done ? seq_hi : done);
    ovl_doorbell_set_error(db, done + 1, status);
    for (uint32_t i = 0; i < OVL_READY_SLOTS; i++)
        __atomic_store_n(&db->done_slot[i], v, __ATOMIC_RELEASE);
    __atomic_store_n(&db->done, v, __ATOMIC_RELEASE);
    /* host backend: a waiter may sleep on the futex word */
    __atomic_add_fetch(&db->wake, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &db->wake, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

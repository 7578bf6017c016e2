/*
 * tunefile.c: see tunefile.h.
 */
#include "tunefile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define TUNEFILE_MAX (64u << 20) /* bytes read at most: 65536 keys of 1 KiB */

ovl_status_t ovld_tunefile_init(ovld_tunefile_t *f, const char *state_dir, const char *backend,
                                const ovld_device_info_t *dev, char *err, size_t errlen)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->device, sizeof(f->device), "%s %s%s%s", backend, dev->name,
             dev->driver[0] ? " " : "", dev->driver);
    if (!state_dir || !state_dir[0])
        return OVL_OK;
    if (state_dir[0] != '/') {
        snprintf(err, errlen, "state directory '%s' is not an absolute path", state_dir);
        return OVL_ERR_CONFIG;
    }
    char name[sizeof(f->device)];
    size_t i = 0;
    for (; f->device[i] && i + 1 < sizeof(name); i++) {
        char c = f->device[i];
        bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-';
        name[i] = keep ? c : '_';
    }
    name[i] = '\0';
    int n = snprintf(f->path, sizeof(f->path), "%s/tune-%s.txt", state_dir, name);
    if (n < 0 || (size_t)n >= sizeof(f->path)) {
        f->path[0] = '\0';
        snprintf(err, errlen, "state directory '%s': its path is too long", state_dir);
        return OVL_ERR_CONFIG;
    }
    return OVL_OK;
}

size_t ovld_tunefile_load(const ovld_tunefile_t *f, ovld_tune_t *t)
{
    if (!f->path[0] || !t)
        return 0;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno != ENOENT)
            log_warn("tuning: cannot read %s: %s; measuring anew", f->path, strerror(errno));
        return 0;
    }
    struct stat st;
    char *buf = NULL;
    size_t len = 0, taken = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > TUNEFILE_MAX) {
        log_warn("tuning: %s is not a regular file of at most %u bytes; measuring anew", f->path,
                 TUNEFILE_MAX);
        goto out;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        log_warn("tuning: out of memory reading %s", f->path);
        goto out;
    }
    while (len < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + len, (size_t)st.st_size - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            log_warn("tuning: reading %s: %s; measuring anew", f->path,
                     r < 0 ? strerror(errno) : "short read");
            goto out;
        }
        len += (size_t)r;
    }
    size_t skipped = 0;
    char why[160] = "";
    taken = ovld_tune_load(t, f->device, buf, len, &skipped, why, sizeof(why));
    if (taken == 0 && len > 0 && skipped == 0)
        log_info("tuning: %s holds no choices for this device (%s)", f->path, why);
    else if (skipped)
        log_warn("tuning: %s: %zu line(s) skipped (the first: %s)", f->path, skipped, why);
    if (taken)
        log_info("tuning: %zu measured choice(s) from %s", taken, f->path);
    (void)ovld_tune_take_dirty(t); /* what is on disk already */
out:
    free(buf);
    close(fd);
    return taken;
}

ovl_status_t ovld_tunefile_write(const char *path, const char *text, size_t len, char *err,
                                 size_t errlen)
{
    char tmp[PATH_MAX + 8], dir[PATH_MAX];
    const char *what = "open";
    bool created = false;
    int fd = -1, e = 0;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        goto fail;
    created = true;
    what = "write";
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            goto fail;
        }
        off += (size_t)w;
    }
    what = "fsync";
    if (fsync(fd) != 0)
        goto fail;
    what = "close";
    int rc = close(fd);
    fd = -1;
    if (rc != 0)
        goto fail;
    what = "rename";
    if (rename(tmp, path) != 0)
        goto fail;
    created = false;
    /* the rename itself, durable */
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir)
        *slash = '\0';
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd); /* the file is in place either way */
        close(dfd);
    }
    return OVL_OK;
fail:
    e = errno;
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(tmp);
    snprintf(err, errlen, "%s: %s", what, strerror(e));
    return OVL_ERR_SYSTEM;
}

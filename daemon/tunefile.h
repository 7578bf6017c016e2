/*
 * tunefile.h: ovld's measured choices of plan (core/tune.h) on disk: one
 * file per backend, device model and driver in the state directory
 * (config state_dir, else systemd's $STATE_DIRECTORY), read at start and
 * written when the choices change, whole, through a temporary file renamed
 * over the old one (a crash leaves the old file or the new, never half of
 * one). Loop thread only.
 */
#ifndef OVLD_TUNEFILE_H
#define OVLD_TUNEFILE_H

#include <limits.h>
#include <stdbool.h>

#include "backend.h"
#include "tune.h"

typedef struct ovld_tunefile {
    char path[PATH_MAX]; /* "": choices are kept nowhere */
    char device[192];    /* the table's first line's words (tune.h) */
} ovld_tunefile_t;

/* The file of device dev of backend `backend` under state_dir ("" or NULL:
 * none; f->path is then ""), its name made of the device's words with
 * anything but letters, digits, '.' and '-' as '_'. OVL_ERR_CONFIG (with
 * err) for a state_dir that is not an absolute path or too long. */
ovl_status_t ovld_tunefile_init(ovld_tunefile_t *f, const char *state_dir, const char *backend,
                                const ovld_device_info_t *dev, char *err, size_t errlen);

/* Loads the file's choices into t (a missing file: none); what it skipped
 * or could not read is logged. Returns the choices taken. */
size_t ovld_tunefile_load(const ovld_tunefile_t *f, ovld_tune_t *t);

/* Writes text to path whole, on any thread (a worker's: it waits for the
 * disk): a temporary file beside it, written, fsynced, renamed over it,
 * then the directory fsynced; the temporary file is removed on any
 * failure. OVL_OK, or OVL_ERR_SYSTEM with the step and errno in words. */
ovl_status_t ovld_tunefile_write(const char *path, const char *text, size_t len, char *err,
                                 size_t errlen);

#endif /* OVLD_TUNEFILE_H */

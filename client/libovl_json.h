/*
 * libovl_json.h: ovld's Status and Stats replies as JSON (docs/ovlctl.md's
 * schemas), and the table of a StatsBlock's scalar fields that the JSON,
 * ovlctl's table and its Prometheus text all use, so that they never
 * disagree. Internal to libovl (and ovlctl, which links it statically);
 * the public calls are ovl_status_json and ovl_stats_json (ovl.h).
 */
#ifndef LIBOVL_JSON_H
#define LIBOVL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ovl.pb-c.h"

enum { LIBOVL_F_U64, LIBOVL_F_DBL, LIBOVL_F_MS /* seconds, shown in ms in ovlctl's table */ };

/* One scalar field of a StatsBlock. */
typedef struct libovl_stat_field {
    const char *key;  /* JSON key; Prometheus name is ovl_<prom> */
    const char *prom; /* NULL: not exported (derived or shown elsewhere) */
    const char *type; /* Prometheus type */
    const char *help;
    int kind;
    size_t off;
    /* another name of the field before it, kept for JSON and Prometheus
     * readers of the older name; the table leaves it out */
    bool alias;
} libovl_stat_field_t;

extern const libovl_stat_field_t libovl_stat_fields[];
extern const size_t libovl_stat_nfields;

/* A field of kind LIBOVL_F_DBL or LIBOVL_F_MS. */
double libovl_stat_dbl(const Ovl__StatsBlock *b, const libovl_stat_field_t *f);
/* A counter, from its 64 bits: a double would round it past 2^53, which FLOP
 * counts reach in seconds on a GPU. */
uint64_t libovl_stat_u64(const Ovl__StatsBlock *b, const libovl_stat_field_t *f);
/* flops per busy second, in TFLOP/s (0 when nothing ran). */
double libovl_stats_tflops(const Ovl__StatsBlock *b);
/* A field as JSON and Prometheus print it. */
void libovl_stat_print(FILE *f, const Ovl__StatsBlock *b, const libovl_stat_field_t *sf);
/* A device's UUID as nvidia-smi writes it ("GPU-...", host: "HOST-..."). */
void libovl_uuid_text(const Ovl__Device *d, const char *backend, char *buf, size_t len);

/* s as a JSON string (quoted, escaped: always valid UTF-8 and JSON). */
void libovl_json_string(FILE *f, const char *s);

/* The JSON texts (one line each, with a final newline). */
void libovl_status_json_write(FILE *f, const Ovl__StatusReply *s);
void libovl_stats_json_write(FILE *f, const Ovl__StatsReply *r);

#endif /* LIBOVL_JSON_H */

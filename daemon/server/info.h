/*
 * info.h: what ovld reports about itself (info.c), above reply.c: the
 * replies to Hello, Status and Stats.
 */
#ifndef OVLD_INFO_H
#define OVLD_INFO_H

#include <stdint.h>

#include "conn.h"
#include "ovl.pb-c.h"

void ovld_info_hello(ovld_conn_t *c, uint64_t id);
void ovld_info_status(ovld_conn_t *c, uint64_t id);
void ovld_info_stats(ovld_conn_t *c, uint64_t id, const Ovl__StatsRequest *q);
/* auto's measured choices (core/tune.h): the table as text; clear (root or
 * ovld's own user) forgets them, and the state file is rewritten empty by
 * main's timer. */
void ovld_info_tune(ovld_conn_t *c, uint64_t id, const Ovl__TuneRequest *q);

#endif /* OVLD_INFO_H */

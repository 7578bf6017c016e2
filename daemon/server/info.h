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

#endif /* OVLD_INFO_H */

/*
 * libovl_json.c: see libovl_json.h; ovl_status_json, ovl_stats_json and
 * ovl_free (ovl.h).
 */
#include "libovl_json.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "libovl_internal.h"
#include "ovl.h"
#include "text.h"
#include "uuid.h"

/* What libovl exports, as libovl.c marks it. */
#define OVL_API __attribute__((visibility("default")))

/* s as a JSON string, escaped (common/text.h: control characters, and
 * invalid UTF-8 as U+FFFD). */
static void json_str(FILE *f, const char *s);

void libovl_json_string(FILE *f, const char *s)
{
    json_str(f, s);
}

static void json_str(FILE *f, const char *s)
{
    if (!s)
        s = "";
    size_t len = ovl_text_escape_json_len(s);
    char *buf = malloc(len + 1);
    fputc('"', f);
    if (buf) {
        ovl_text_escape_json(buf, len + 1, s);
        fputs(buf, f);
        free(buf);
    }
    fputc('"', f);
}

void libovl_uuid_text(const Ovl__Device *d, const char *backend, char *buf, size_t len)
{
    if (d->uuid.len != OVLD_UUID_LEN) {
        snprintf(buf, len, "?");
        return;
    }
    ovld_uuid_format(d->uuid.data, strcmp(backend, "cuda") == 0 ? "GPU-" : "HOST-", buf, len);
}

#define SF(key, prom, type, help, kind, field)                                                     \
    {                                                                                              \
        key, prom, type, help, kind, offsetof(Ovl__StatsBlock, field), false                       \
    }
const libovl_stat_field_t libovl_stat_fields[] = {
    SF("seconds", NULL, NULL, "counting for (s)", LIBOVL_F_DBL, seconds),
    SF("ops_done", NULL, NULL, "ops done", LIBOVL_F_U64, ops_done),
    SF("ops_failed", "ops_failed_total", "counter", "ops that failed", LIBOVL_F_U64, ops_failed),
    SF("comm_bytes", "comm_bytes_total", "counter",
       "bytes ops' communication moved into ranks (ag_gemm: the gathered A), summed over ranks",
       LIBOVL_F_U64, comm_bytes),
    /* comm_bytes by its name from when ag_gemm was the only kind: kept, as
     * the JSON and Prometheus outputs only add fields (docs/ovlctl.md) */
    {"bytes_gathered", "gathered_bytes_total", "counter",
     "the same as comm_bytes_total (its name before op kinds; deprecated)", LIBOVL_F_U64,
     offsetof(Ovl__StatsBlock, comm_bytes), true},
    SF("flops", "flops_total", "counter", "floating-point operations of ops done", LIBOVL_F_U64,
       flops),
    SF("busy_s", "busy_seconds_total", "counter", "sum of op latencies", LIBOVL_F_DBL, busy_s),
    SF("latency_p50_s", NULL, NULL, "latency p50 (s)", LIBOVL_F_MS, latency_p50_s),
    SF("latency_p90_s", NULL, NULL, "latency p90 (s)", LIBOVL_F_MS, latency_p90_s),
    SF("latency_p99_s", NULL, NULL, "latency p99 (s)", LIBOVL_F_MS, latency_p99_s),
    SF("latency_max_s", "op_latency_max_seconds", "gauge", "longest op latency", LIBOVL_F_MS,
       latency_max_s),
    SF("issue_s", "issue_seconds_total", "counter", "ovld's time spent planning and enqueueing ops",
       LIBOVL_F_DBL, issue_sum_s),
    SF("issue_p50_s", NULL, NULL, "issue p50 (s)", LIBOVL_F_MS, issue_p50_s),
    SF("issue_p99_s", NULL, NULL, "issue p99 (s)", LIBOVL_F_MS, issue_p99_s),
    SF("issue_max_s", "op_issue_max_seconds", "gauge", "longest time to issue one op", LIBOVL_F_MS,
       issue_max_s),
    SF("ops_replayed", "ops_replayed_total", "counter",
       "ops whose body was launched from a graph captured before", LIBOVL_F_U64, ops_replayed),
    SF("ops_captured", "ops_captured_total", "counter", "ops whose body was captured for replay",
       LIBOVL_F_U64, ops_captured),
    SF("registrations", "registrations_total", "counter", "buffers registered", LIBOVL_F_U64,
       registrations),
    SF("deregistrations", "deregistrations_total", "counter", "buffers deregistered", LIBOVL_F_U64,
       deregistrations),
    SF("registry_hits", "registry_hits_total", "counter",
       "registrations that found their mapping open", LIBOVL_F_U64, registry_hits),
    SF("registry_misses", "registry_misses_total", "counter",
       "registrations that mapped memory anew", LIBOVL_F_U64, registry_misses),
    SF("connections_accepted", "connections_accepted_total", "counter", "connections accepted",
       LIBOVL_F_U64, connections_accepted),
    SF("connections_refused", "connections_refused_total", "counter",
       "connections refused (limits, shutdown)", LIBOVL_F_U64, connections_refused),
    SF("peer_msgs_in", "peer_messages_received_total", "counter",
       "messages from other nodes' ovld, heartbeats included", LIBOVL_F_U64, peer_msgs_in),
    SF("peer_msgs_out", "peer_messages_sent_total", "counter",
       "messages to other nodes' ovld, heartbeats included", LIBOVL_F_U64, peer_msgs_out),
    SF("peer_bytes_in", "peer_received_bytes_total", "counter",
       "bytes of messages from other nodes' ovld", LIBOVL_F_U64, peer_bytes_in),
    SF("peer_bytes_out", "peer_sent_bytes_total", "counter",
       "bytes of messages to other nodes' ovld", LIBOVL_F_U64, peer_bytes_out),
    SF("peer_errors", "peer_errors_total", "counter",
       "links to other nodes that failed or timed out, and their protocol errors", LIBOVL_F_U64,
       peer_errors),
    SF("peer_dropped", "peer_dropped_messages_total", "counter",
       "messages to other nodes dropped: their peer went down, or its queue was full", LIBOVL_F_U64,
       peer_dropped),
    SF("peer_auth_refused", "peer_auth_refused_total", "counter",
       "handshakes with other nodes' ovld refused, either side", LIBOVL_F_U64, peer_auth_refused),
    SF("xfer_sends", "xfer_sends_total", "counter",
       "host backend: transfers of rows to other nodes done", LIBOVL_F_U64, xfer_sends),
    SF("xfer_recvs", "xfer_recvs_total", "counter",
       "host backend: transfers of rows from other nodes done", LIBOVL_F_U64, xfer_recvs),
    SF("xfer_bytes_out", "xfer_sent_bytes_total", "counter",
       "host backend: bytes of rows read by other nodes", LIBOVL_F_U64, xfer_bytes_out),
    SF("xfer_bytes_in", "xfer_received_bytes_total", "counter",
       "host backend: bytes of rows read from other nodes", LIBOVL_F_U64, xfer_bytes_in),
    SF("xfer_errors", "xfer_errors_total", "counter",
       "host backend: transfers of rows between nodes that failed", LIBOVL_F_U64, xfer_errors),
    SF("xfer_dropped", "xfer_dropped_messages_total", "counter",
       "host backend: rows messages from other nodes dropped (malformed, unknown job, ranks "
       "their sender may not name)",
       LIBOVL_F_U64, xfer_dropped),
};
const size_t libovl_stat_nfields = sizeof(libovl_stat_fields) / sizeof(libovl_stat_fields[0]);

/* A field of kind LIBOVL_F_DBL or LIBOVL_F_MS (counters go through field_u64). */
double libovl_stat_dbl(const Ovl__StatsBlock *b, const libovl_stat_field_t *f)
{
    double v;
    memcpy(&v, (const char *)b + f->off, sizeof(v));
    return v;
}

double libovl_stats_tflops(const Ovl__StatsBlock *b)
{
    return b->busy_s > 0 ? (double)b->flops / b->busy_s / 1e12 : 0;
}

/* Counters are printed from their 64 bits: a double would round them past
 * 2^53, which FLOP counts reach in seconds on a GPU. */
uint64_t libovl_stat_u64(const Ovl__StatsBlock *b, const libovl_stat_field_t *f)
{
    uint64_t v;
    memcpy(&v, (const char *)b + f->off, sizeof(v));
    return v;
}

void libovl_stat_print(FILE *f, const Ovl__StatsBlock *b, const libovl_stat_field_t *sf)
{
    if (sf->kind == LIBOVL_F_U64)
        fprintf(f, "%" PRIu64, libovl_stat_u64(b, sf));
    else
        fprintf(f, "%.9g", libovl_stat_dbl(b, sf));
}

static void stats_block_json(FILE *f, const Ovl__StatsBlock *b)
{
    fputc('{', f);
    for (size_t i = 0; i < libovl_stat_nfields; i++) {
        fprintf(f, "%s\"%s\":", i ? "," : "", libovl_stat_fields[i].key);
        libovl_stat_print(f, b, &libovl_stat_fields[i]);
    }
    fprintf(f, ",\"tflops\":%.6g,\"ops\":[", libovl_stats_tflops(b));
    for (size_t i = 0; i < b->n_ops; i++) {
        fprintf(f, "%s{\"kind\":", i ? "," : "");
        json_str(f, b->ops[i]->kind);
        fprintf(f, ",\"algo\":");
        json_str(f, b->ops[i]->algo);
        fprintf(f, ",\"dtype\":");
        json_str(f, b->ops[i]->dtype);
        fprintf(f, ",\"count\":%" PRIu64 "}", b->ops[i]->count);
    }
    fprintf(f, "],\"errors\":[");
    for (size_t i = 0; i < b->n_errors; i++) {
        fprintf(f, "%s{\"status\":%d,\"name\":", i ? "," : "", b->errors[i]->status);
        json_str(f, b->errors[i]->name);
        fprintf(f, ",\"count\":%" PRIu64 "}", b->errors[i]->count);
    }
    fprintf(f,
            "],\"issue_count\":%" PRIu64 ",\"latency_count\":%" PRIu64
            ",\"latency_sum_s\":%.9g,\"latency_buckets\":[",
            b->issue_count, b->latency_count, b->latency_sum_s);
    for (size_t i = 0; i < b->n_latency_buckets; i++)
        fprintf(f, "%s{\"le_s\":%.9g,\"count\":%" PRIu64 "}", i ? "," : "",
                b->latency_buckets[i]->le_s, b->latency_buckets[i]->count);
    fprintf(f, "]}");
}

void libovl_status_json_write(FILE *f, const Ovl__StatusReply *s)
{
    fprintf(f, "{\"version\":");
    json_str(f, s->version);
    fprintf(f, ",\"protocol_version\":%u,\"pid\":%d,\"uptime_s\":%.3f,\"backend\":",
            s->protocol_version, s->pid, s->uptime_s);
    json_str(f, s->backend);
    fprintf(f, ",\"socket\":");
    json_str(f, s->socket);
    fprintf(f, ",\"config_file\":");
    json_str(f, s->config_file);
    fprintf(f, ",\"op_kinds\":[");
    for (size_t i = 0; i < s->n_op_kinds; i++) {
        if (i)
            fputc(',', f);
        json_str(f, s->op_kinds[i]);
    }
    fputc(']', f);
    fprintf(f,
            ",\"connections\":%u,\"restricted\":%s,\"other_jobs\":%u,\"other_clients\":%u,"
            "\"devices\":[",
            s->connections, s->restricted ? "true" : "false", s->other_jobs, s->other_clients);
    for (size_t i = 0; i < s->n_devices; i++) {
        const Ovl__Device *d = s->devices[i];
        char u[64];
        libovl_uuid_text(d, s->backend, u, sizeof(u));
        fprintf(f, "%s{\"index\":%u,\"uuid\":", i ? "," : "", d->index);
        json_str(f, u);
        fprintf(f, ",\"name\":");
        json_str(f, d->name);
        fprintf(f,
                ",\"total_memory\":%" PRIu64 ",\"streams\":%u,\"held_bytes\":%" PRIu64
                ",\"mps\":%s}",
                d->total_memory, d->streams, d->held_bytes, d->mps ? "true" : "false");
    }
    fprintf(f, "],\"jobs\":[");
    for (size_t i = 0; i < s->n_jobs; i++) {
        const Ovl__JobInfo *j = s->jobs[i];
        fprintf(f, "%s{\"id\":", i ? "," : "");
        json_str(f, j->id);
        fprintf(f, ",\"owner_uid\":%u,\"world\":%u,\"local_ranks\":%u,\"state\":", j->owner_uid,
                j->world, j->local_ranks);
        json_str(f, j->state);
        fprintf(f, ",\"ops_done\":%" PRIu64 ",\"ops_in_flight\":%u,\"last_error\":", j->ops_done,
                j->ops_in_flight);
        json_str(f, j->last_error);
        fprintf(f, ",\"rank_devices\":[");
        for (size_t r = 0; r < j->n_rank_devices; r++)
            fprintf(f, "%s%d", r ? "," : "", j->rank_devices[r]);
        fprintf(f, "],\"self_node\":%u,\"nodes\":[", j->self_node);
        for (size_t n = 0; n < j->n_nodes; n++) {
            fprintf(f, "%s", n ? "," : "");
            json_str(f, j->nodes[n]);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"clients\":[");
    for (size_t i = 0; i < s->n_clients; i++) {
        const Ovl__ClientInfo *c = s->clients[i];
        fprintf(f, "%s{\"id\":%" PRIu64 ",\"pid\":%d,\"uid\":%u,\"gid\":%u,\"name\":", i ? "," : "",
                c->id, c->pid, c->uid, c->gid);
        json_str(f, c->name);
        fprintf(f, ",\"job\":");
        json_str(f, c->job);
        fprintf(f, ",\"rank\":%d,\"buffers\":%u,\"mapped_bytes\":%" PRIu64 "}", c->rank, c->buffers,
                c->mapped_bytes);
    }
    fprintf(f, "],\"peer_self\":");
    json_str(f, s->peer_self);
    fprintf(f, ",\"peers\":[");
    for (size_t i = 0; i < s->n_peers; i++) {
        const Ovl__PeerInfo *p = s->peers[i];
        fprintf(f, "%s{\"address\":", i ? "," : "");
        json_str(f, p->address);
        fprintf(f, ",\"state\":");
        json_str(f, p->state);
        fprintf(f,
                ",\"rtt_s\":%.9g,\"msgs_in\":%" PRIu64 ",\"msgs_out\":%" PRIu64
                ",\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"errors\":%" PRIu64
                ",\"last_error\":",
                p->rtt_s, p->msgs_in, p->msgs_out, p->bytes_in, p->bytes_out, p->errors);
        json_str(f, p->last_error);
        fputc('}', f);
    }
    fprintf(f, "]}\n");
}

void libovl_stats_json_write(FILE *f, const Ovl__StatsReply *r)
{
    fprintf(f, "{\"uptime_s\":%.3f,\"reset_done\":%s,\"heap_bytes\":%" PRIu64 ",\"total\":",
            r->uptime_s, r->reset_done ? "true" : "false", r->heap_bytes);
    stats_block_json(f, r->total);
    fprintf(f, ",\"since_reset\":");
    stats_block_json(f, r->since_reset);
    fprintf(f, "}\n");
}

/* Runs a request and writes its reply's JSON into a malloc'd string. */
static ovl_status_t json_of(ovl_client_t *cl, Ovl__Request *q, bool stats, char **ret_json)
{
    if (!cl || !ret_json)
        return OVL_ERR_INVALID;
    Ovl__Response *r = NULL;
    ovl_status_t st = libovl_call(cl, q, NULL, 0, &r);
    if (st != OVL_OK)
        return st;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        libovl_response_free(r);
        return libovl_fail(cl, OVL_ERR_NOMEM, "out of memory formatting the reply");
    }
    if (stats)
        libovl_stats_json_write(f, r->stats);
    else
        libovl_status_json_write(f, r->status);
    int e = fclose(f);
    libovl_response_free(r);
    if (e != 0 || !buf) {
        free(buf);
        return libovl_fail(cl, OVL_ERR_NOMEM, "out of memory formatting the reply");
    }
    *ret_json = buf;
    return OVL_OK;
}

OVL_API ovl_status_t ovl_status_json(ovl_client_t *cl, char **ret_json)
{
    Ovl__StatusRequest sq = OVL__STATUS_REQUEST__INIT;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_STATUS;
    q.status = &sq;
    return json_of(cl, &q, false, ret_json);
}

OVL_API ovl_status_t ovl_stats_json(ovl_client_t *cl, int reset, char **ret_json)
{
    Ovl__StatsRequest sq = OVL__STATS_REQUEST__INIT;
    sq.reset = reset != 0;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_STATS;
    q.stats = &sq;
    return json_of(cl, &q, true, ret_json);
}

OVL_API void ovl_free(void *p)
{
    free(p);
}

/*
 * info.c: what ovld reports about itself: the device list of Hello and
 * Status, Status (jobs and clients, restricted to their own for users
 * other than root and ovld's), and Stats (the counters, stats.h). The one
 * place these replies are formatted.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "conn.h"
#include "heap.h"
#include "info.h"
#include "kind.h"
#include "log.h"
#include "peer.h"
#include "reply.h"
#include "tune.h"
/* ------------------------------------------------------------ devices */

static void fill_device(ovld_t *d, uint32_t i, Ovl__Device *dev, ovld_device_info_t *info)
{
    d->backend->ops->device_info(d->backend, i, info);
    ovl__device__init(dev);
    dev->index = i;
    dev->uuid.data = info->uuid;
    dev->uuid.len = OVLD_UUID_LEN;
    dev->name = info->name;
    dev->total_memory = info->total_memory;
    dev->mps = info->mps;
    if (d->backend->ops->device_usage)
        d->backend->ops->device_usage(d->backend, i, &dev->streams, &dev->held_bytes);
}

/* Every device, as Hello and Status replies list them. */
typedef struct device_list {
    uint32_t n;
    Ovl__Device *devs;
    Ovl__Device **pdevs;       /* what the reply points at */
    ovld_device_info_t *infos; /* the strings devs point into */
} device_list_t;

static void device_list_free(device_list_t *l)
{
    free(l->devs);
    free(l->pdevs);
    free(l->infos);
}

/* false (nothing to free) when out of memory. */
static bool device_list_make(ovld_t *d, device_list_t *l)
{
    l->n = d->backend->ops->device_count(d->backend);
    l->devs = calloc(l->n + 1, sizeof(*l->devs));
    l->pdevs = calloc(l->n + 1, sizeof(*l->pdevs));
    l->infos = calloc(l->n + 1, sizeof(*l->infos));
    if (!l->devs || !l->pdevs || !l->infos) {
        device_list_free(l);
        return false;
    }
    for (uint32_t i = 0; i < l->n; i++) {
        fill_device(d, i, &l->devs[i], &l->infos[i]);
        l->pdevs[i] = &l->devs[i];
    }
    return true;
}

void ovld_info_hello(ovld_conn_t *c, uint64_t id)
{
    ovld_t *d = c->d;
    device_list_t dl;
    if (!device_list_make(d, &dl)) {
        ovld_conn_fail(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    Ovl__HelloReply hr = OVL__HELLO_REPLY__INIT;
    hr.protocol_version = OVL_PROTOCOL_VERSION;
    hr.daemon_version = (char *)OVL_VERSION_STRING;
    hr.backend = (char *)d->backend->ops->name;
    hr.daemon_pid = (int32_t)getpid();
    hr.client_id = c->id;
    hr.n_devices = dl.n;
    hr.devices = dl.pdevs;
    /* A copy of our pidfd: the client sees when this process is gone. */
    int pidfd = d->self_pidfd >= 0 ? fcntl(d->self_pidfd, F_DUPFD_CLOEXEC, 0) : -1;
    if (d->self_pidfd >= 0 && pidfd < 0)
        log_warn("client %" PRIu64 ": cannot copy ovld's pidfd: %s", c->id, strerror(errno));
    hr.fd_count = pidfd >= 0 ? 1 : 0;
    hr.features = OVL_FEATURE_MULTI_B | OVL_FEATURE_FP8;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_HELLO;
    r.hello = &hr;
    ovld_reply(c, &r, pidfd >= 0 ? &pidfd : NULL, pidfd >= 0 ? 1 : 0);
    device_list_free(&dl);
}

/* Status's job list, built by ovld_jobs_foreach. */
typedef struct job_rows {
    Ovl__JobInfo *jobs;
    Ovl__JobInfo **pjobs;
    int32_t **devs; /* each job's rank_devices, freed after the reply */
    bool nomem;
    size_t n, max;
    bool restricted;
    uid_t uid;
    uint32_t others;
} job_rows_t;

static void add_job(const ovld_job_info_t *j, void *arg)
{
    job_rows_t *t = arg;
    if (t->restricted && j->owner != t->uid) {
        t->others++;
        return;
    }
    if (t->n >= t->max)
        return;
    Ovl__JobInfo *ji = &t->jobs[t->n];
    t->pjobs[t->n++] = ji;
    ovl__job_info__init(ji);
    ji->id = (char *)j->id;
    ji->owner_uid = (uint32_t)j->owner;
    ji->world = j->world;
    ji->local_ranks = j->joined;
    ji->state = (char *)ovld_job_state_name(j->state);
    ji->ops_done = j->ops_done;
    ji->ops_in_flight = j->in_flight;
    ji->last_error = (char *)j->last_error;
    t->devs[t->n - 1] = malloc(j->world * sizeof(int32_t));
    if (!t->devs[t->n - 1]) {
        t->nomem = true;
        return;
    }
    memcpy(t->devs[t->n - 1], j->rank_devices, j->world * sizeof(int32_t));
    ji->n_rank_devices = j->world;
    ji->rank_devices = t->devs[t->n - 1];
    /* the cluster's strings, which live as long as the job */
    ji->n_nodes = j->nnodes;
    ji->nodes = (char **)(uintptr_t)j->nodes;
    ji->self_node = j->self_node;
}

/* Status's peer list, built by ovld_peers_foreach (peer.h). The strings
 * point into the peers' records, which live until the reply is sent. */
typedef struct peer_rows {
    Ovl__PeerInfo *rows;
    Ovl__PeerInfo **prows;
    size_t n, max;
} peer_rows_t;

static void count_peer(const ovld_peer_info_t *i, void *arg)
{
    (void)i;
    (*(size_t *)arg)++;
}

static void add_peer(const ovld_peer_info_t *i, void *arg)
{
    peer_rows_t *t = arg;
    if (t->n >= t->max)
        return;
    Ovl__PeerInfo *pi = &t->rows[t->n];
    t->prows[t->n++] = pi;
    ovl__peer_info__init(pi);
    pi->address = (char *)i->name;
    pi->state = (char *)i->state;
    pi->rtt_s = i->rtt_s;
    pi->msgs_in = i->msgs_in;
    pi->msgs_out = i->msgs_out;
    pi->bytes_in = i->bytes_in;
    pi->bytes_out = i->bytes_out;
    pi->errors = i->errors;
    pi->last_error = (char *)i->last_error;
}

void ovld_info_status(ovld_conn_t *c, uint64_t id)
{
    ovld_t *d = c->d;
    size_t nj = d->jobs.njobs, nc = d->nconns;
    const size_t nj_max = nj;
    device_list_t dl = {0};
    bool have_devs = device_list_make(d, &dl);
    Ovl__JobInfo *jobs = calloc(nj + 1, sizeof(*jobs));
    Ovl__JobInfo **pjobs = calloc(nj + 1, sizeof(*pjobs));
    Ovl__ClientInfo *cls = calloc(nc + 1, sizeof(*cls));
    Ovl__ClientInfo **pcls = calloc(nc + 1, sizeof(*pcls));
    int32_t **devs = calloc(nj + 1, sizeof(*devs));
    size_t np = 0;
    if (d->peers)
        ovld_peers_foreach(d->peers, count_peer, &np);
    peer_rows_t pr = {.rows = calloc(np + 1, sizeof(Ovl__PeerInfo)),
                      .prows = calloc(np + 1, sizeof(Ovl__PeerInfo *)),
                      .max = np};
    if (!have_devs || !jobs || !pjobs || !cls || !pcls || !devs || !pr.rows || !pr.prows) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* Root and ovld's own user see everything; anyone else sees their own
     * jobs and clients, and how many others there are (docs/ovlctl.md). */
    bool restricted = c->uid != 0 && c->uid != getuid();
    job_rows_t jr = {.jobs = jobs,
                     .pjobs = pjobs,
                     .devs = devs,
                     .max = nj,
                     .restricted = restricted,
                     .uid = c->uid};
    ovld_jobs_foreach(&d->jobs, add_job, &jr);
    if (jr.nomem) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        goto out;
    }
    nj = jr.n;
    uint32_t other_jobs = jr.others, other_clients = 0;
    size_t i = 0;
    for (ovld_conn_t *k = d->conns; k && i < nc; k = k->next) {
        if (restricted && k->uid != c->uid) {
            other_clients++;
            continue;
        }
        Ovl__ClientInfo *ci = &cls[i];
        pcls[i++] = ci;
        ovl__client_info__init(ci);
        ci->id = k->id;
        ci->pid = (int32_t)k->pid;
        ci->uid = (uint32_t)k->uid;
        ci->gid = (uint32_t)k->gid;
        ci->name = k->name;
        ci->rank = -1;
        ci->job = (char *)"";
        if (k->comms) {
            ci->job = (char *)ovld_member_job_id(k->comms->m);
            ci->rank = (int32_t)ovld_member_rank(k->comms->m);
        }
        ci->buffers = (uint32_t)k->reg.count;
        ci->mapped_bytes = k->reg.mapped_bytes;
    }
    nc = i;
    Ovl__StatusReply sr = OVL__STATUS_REPLY__INIT;
    sr.version = (char *)OVL_VERSION_STRING;
    sr.protocol_version = OVL_PROTOCOL_VERSION;
    sr.pid = (int32_t)getpid();
    sr.uptime_s = (double)(ovl_mono_ns() - d->start_ns) / 1e9;
    sr.backend = (char *)d->backend->ops->name;
    sr.socket = d->cfg.socket_path;
    sr.config_file = d->config_path;
    sr.connections = d->nconns;
    sr.n_devices = dl.n;
    sr.devices = dl.pdevs;
    sr.n_jobs = nj;
    sr.jobs = pjobs;
    sr.n_clients = nc;
    sr.clients = pcls;
    /* the kinds this ovld runs: those of the core's table */
    char *kinds[OVL_OP_KIND_COUNT];
    for (uint32_t k = 1; k < OVL_OP_KIND_COUNT; k++)
        if (ovld_kind(k))
            kinds[sr.n_op_kinds++] = (char *)ovl_op_kind_name((ovl_op_kind_t)k);
    sr.op_kinds = kinds;
    sr.restricted = restricted;
    sr.other_jobs = other_jobs;
    sr.other_clients = other_clients;
    if (d->peers) {
        /* Every user sees the links: they are the node's, not a user's. */
        ovld_peers_foreach(d->peers, add_peer, &pr);
        sr.peer_self = (char *)ovld_peers_self(d->peers);
    }
    sr.n_peers = pr.n;
    sr.peers = pr.prows;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_STATUS;
    r.status = &sr;
    ovld_reply(c, &r, NULL, 0);
out:
    if (have_devs)
        device_list_free(&dl);
    free(jobs);
    free(pjobs);
    free(cls);
    free(pcls);
    for (size_t q = 0; devs && q < nj_max; q++) /* calloc'd: unused ones are NULL */
        free(devs[q]);
    free(devs);
    free(pr.rows);
    free(pr.prows);
}

/* ----------------------------------------------------------------- stats */

/* Prometheus-style latency buckets: powers of two from 1 us to 69 s. */
#define STATS_BUCKETS 27

typedef struct stats_msg {
    Ovl__StatsBlock block;
    Ovl__OpCount ops[OVL_OP_KIND_COUNT * OVL_ALGO_COUNT * OVL_DTYPE_COUNT];
    Ovl__OpCount *pops[OVL_OP_KIND_COUNT * OVL_ALGO_COUNT * OVL_DTYPE_COUNT];
    Ovl__ErrorCount errs[OVLD_STATUS_KINDS];
    Ovl__ErrorCount *perrs[OVLD_STATUS_KINDS];
    Ovl__HistBucket buckets[STATS_BUCKETS];
    Ovl__HistBucket *pbuckets[STATS_BUCKETS];
} stats_msg_t;

/* Fills a StatsBlock that points into m (which must outlive the packing). */
static void fill_stats(ovld_t *d, const ovld_stats_t *s, stats_msg_t *m, uint64_t now,
                       uint64_t hits, uint64_t misses)
{
    Ovl__StatsBlock *b = &m->block;
    ovl__stats_block__init(b);
    b->seconds = (double)(now - s->since_ns) / 1e9;
    size_t n = 0;
    /* every cell, AUTO's included: ops are counted as run, so AUTO's stay
     * 0; kind 0 (none) has no name, and its cells stay 0 */
    for (int k = 1; k < OVL_OP_KIND_COUNT; k++)
        for (int a = 0; a < OVL_ALGO_COUNT; a++)
            for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
                uint64_t cnt = s->ops[k][a][t];
                b->ops_done += cnt;
                if (!cnt)
                    continue;
                ovl__op_count__init(&m->ops[n]);
                m->ops[n].kind = (char *)ovl_op_kind_name((ovl_op_kind_t)k);
                m->ops[n].algo = (char *)ovl_algo_name((ovl_algo_t)a);
                m->ops[n].dtype = (char *)ovl_dtype_name((ovl_dtype_t)t);
                m->ops[n].count = cnt;
                m->pops[n] = &m->ops[n];
                n++;
            }
    b->n_ops = n;
    b->ops = m->pops;
    b->ops_failed = s->ops_failed;
    b->comm_bytes = s->comm_bytes;
    b->flops = s->flops;
    b->busy_s = (double)s->busy_ns / 1e9;
    const ovld_hist_t *h = &s->latency;
    b->latency_count = h->count;
    b->latency_sum_s = (double)h->sum_ns / 1e9;
    b->latency_p50_s = (double)ovld_hist_quantile(h, 0.50) / 1e9;
    b->latency_p90_s = (double)ovld_hist_quantile(h, 0.90) / 1e9;
    b->latency_p99_s = (double)ovld_hist_quantile(h, 0.99) / 1e9;
    b->latency_max_s = (double)h->max_ns / 1e9;
    b->issue_count = s->issue.count;
    b->issue_sum_s = (double)s->issue.sum_ns / 1e9;
    b->issue_p50_s = (double)ovld_hist_quantile(&s->issue, 0.50) / 1e9;
    b->issue_p99_s = (double)ovld_hist_quantile(&s->issue, 0.99) / 1e9;
    b->issue_max_s = (double)s->issue.max_ns / 1e9;
    b->ops_replayed = s->ops_replayed;
    b->ops_captured = s->ops_captured;
    unsigned fine = 0;
    uint64_t cum = 0;
    for (unsigned i = 0; i < STATS_BUCKETS; i++) {
        /* 2^10 - 1 ns (about 1 us) to 2^36 - 1 ns (about 69 s): the fine
         * buckets end exactly there, so "<= le" is exact. */
        uint64_t le = (1024ull << i) - 1;
        while (fine < OVLD_HIST_BUCKETS && ovld_hist_bucket_upper(fine) <= le)
            cum += h->buckets[fine++];
        ovl__hist_bucket__init(&m->buckets[i]);
        m->buckets[i].le_s = (double)le / 1e9;
        m->buckets[i].count = cum;
        m->pbuckets[i] = &m->buckets[i];
    }
    b->n_latency_buckets = STATS_BUCKETS;
    b->latency_buckets = m->pbuckets;
    b->registrations = s->registrations;
    b->deregistrations = s->deregistrations;
    b->registry_hits = hits;
    b->registry_misses = misses;
    n = 0;
    for (unsigned k = 1; k < OVLD_STATUS_KINDS; k++) {
        if (!s->errors[k])
            continue;
        ovl__error_count__init(&m->errs[n]);
        m->errs[n].status = -(int32_t)k;
        m->errs[n].name = (char *)ovl_strerror((ovl_status_t) - (int)k);
        m->errs[n].count = s->errors[k];
        m->perrs[n] = &m->errs[n];
        n++;
    }
    b->n_errors = n;
    b->errors = m->perrs;
    b->connections_accepted = s->conns_accepted;
    b->connections_refused = s->conns_refused;
    b->peer_msgs_in = s->peer_msgs_in;
    b->peer_msgs_out = s->peer_msgs_out;
    b->peer_bytes_in = s->peer_bytes_in;
    b->peer_bytes_out = s->peer_bytes_out;
    b->peer_errors = s->peer_errors;
    b->peer_dropped = s->peer_dropped;
    b->peer_auth_refused = s->peer_auth_refused;
    b->xfer_sends = s->xfer_sends;
    b->xfer_recvs = s->xfer_recvs;
    b->xfer_bytes_out = s->xfer_bytes_out;
    b->xfer_bytes_in = s->xfer_bytes_in;
    b->xfer_errors = s->xfer_errors;
    b->xfer_dropped = s->xfer_dropped;
    (void)d;
}

void ovld_info_stats(ovld_conn_t *c, uint64_t id, const Ovl__StatsRequest *q)
{
    ovld_t *d = c->d;
    if (q->reset && c->uid != 0 && c->uid != getuid()) {
        ovld_reply_error(c, id, OVL_ERR_PERMISSION,
                         "only root or ovld's own user (uid %u) may reset the counters",
                         (unsigned)getuid());
        return;
    }
    stats_msg_t *m = calloc(2, sizeof(*m));
    if (!m) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    uint64_t now = ovl_mono_ns(), hits = 0, misses = 0;
    if (d->backend->ops->mem_cache_stats)
        d->backend->ops->mem_cache_stats(d->backend, &hits, &misses);
    else
        misses = d->counters.total.registrations; /* every import maps anew */
    /* The backend counts since start; since a reset is the difference. */
    fill_stats(d, &d->counters.total, &m[0], now, hits, misses);
    fill_stats(d, &d->counters.window, &m[1], now, hits - d->hits_at_reset,
               misses - d->misses_at_reset);
    Ovl__StatsReply sr = OVL__STATS_REPLY__INIT;
    sr.uptime_s = (double)(now - d->start_ns) / 1e9;
    sr.total = &m[0].block;
    sr.since_reset = &m[1].block;
    sr.reset_done = q->reset;
    sr.heap_bytes = ovld_heap_bytes();
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_STATS;
    r.stats = &sr;
    ovld_reply(c, &r, NULL, 0);
    free(m);
    if (q->reset) {
        ovld_stats_reset(&d->counters.window, now);
        d->hits_at_reset = hits;
        d->misses_at_reset = misses;
        log_info("counters reset by uid %u (pid %d)", (unsigned)c->uid, (int)c->pid);
    }
}

void ovld_info_tune(ovld_conn_t *c, uint64_t id, const Ovl__TuneRequest *q)
{
    ovld_t *d = c->d;
    if (q->clear && c->uid != 0 && c->uid != getuid()) {
        ovld_reply_error(c, id, OVL_ERR_PERMISSION,
                         "only root or ovld's own user (uid %u) may clear the measured choices",
                         (unsigned)getuid());
        return;
    }
    if (q->clear && d->tune) {
        ovld_tune_clear(d->tune);
        log_info("measured choices cleared by uid %u (pid %d)", (unsigned)c->uid, (int)c->pid);
    }
    size_t need;
    char *text = ovld_tune_text(d->tune, d->tune_device, false, &need);
    if (!text) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    Ovl__TuneReply tr = OVL__TUNE_REPLY__INIT;
    tr.measuring = d->tune != NULL;
    tr.file = d->tune_path;
    tr.keys = ovld_tune_size(d->tune);
    tr.chosen = ovld_tune_chosen(d->tune);
    tr.text = text;
    tr.cleared = q->clear;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_TUNE;
    r.tune = &tr;
    ovld_reply(c, &r, NULL, 0);
    free(text);
}

/* Handles one frame; false if the connection was closed. */

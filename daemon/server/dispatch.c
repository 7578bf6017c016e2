/*
 * dispatch.c: a connection's requests (conn.c hands each complete frame to
 * ovld_dispatch_frame): decoded, checked, and served by their handler, in
 * order; the requests that change state (join, leave, register,
 * deregister, ops, plans, peer pings, job ids) are served here, what ovld
 * reports about itself by info.c.
 *
 * This is the boundary: each request is checked (request.c) and turned
 * into a descriptor (desc.h), an op's buffers are resolved against the
 * connection's registrations (buffers.h), and the core (job.h) gets
 * nothing else. Per-uid quotas on mappings are applied here (those on
 * connections at accept, conn.c).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buffers.h"
#include "cluster.h"
#include "conn.h"
#include "dispatch.h"
#include "info.h"
#include "job.h"
#include "log.h"
#include "ovl.pb-c.h"
#include "peer.h"
#include "plan.h"
#include "tune.h"
#include "reply.h"
#include "request.h"
#include "text.h"

/* ------------------------------------------------------------ requests */

static void on_hello(ovld_conn_t *c, uint64_t id, const Ovl__Hello *h)
{
    if (c->hello_done) {
        ovld_conn_fail(c, id, OVL_ERR_PROTOCOL, "Hello sent twice");
        return;
    }
    char lib[32] = "?";
    if (h->library_version && h->library_version[0])
        ovl_text_sanitize(lib, sizeof(lib), (const uint8_t *)h->library_version,
                          strlen(h->library_version));
    if (h->protocol_version != OVL_PROTOCOL_VERSION) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "protocol version mismatch: the client (libovl %s) speaks version %" PRIu64
                 ", ovld %s speaks version %u",
                 lib, h->protocol_version, OVL_VERSION_STRING, OVL_PROTOCOL_VERSION);
        ovld_conn_fail(c, id, OVL_ERR_VERSION, msg);
        return;
    }
    c->hello_done = true;
    /* Shown to operators (ovlctl status, the log): clean text, cut on a
     * character boundary, whatever the client sent (text.h). */
    if (h->client_name.len)
        ovl_text_sanitize(c->name, sizeof(c->name), h->client_name.data, h->client_name.len);
    log_debug("client %" PRIu64 ": hello from '%s' (pid %d, uid %u, libovl %s)", c->id, c->name,
              (int)c->pid, (unsigned)c->uid, lib);
    ovld_info_hello(c, id);
}

/* The comm of c with this id, or NULL. */
static ovld_conn_comm_t *conn_comm(ovld_conn_t *c, uint64_t comm_id)
{
    for (ovld_conn_comm_t *k = c->comms; k; k = k->next)
        if (k->comm_id == comm_id)
            return k;
    return NULL;
}

/* A join refused: said to the client, and logged (a refusal for the
 * client's own reasons is news at info; one because ovld or the device
 * failed is a warning). */
static void join_refused(ovld_conn_t *c, uint64_t id, ovl_status_t st, const char *err)
{
    bool ours = st == OVL_ERR_BACKEND || st == OVL_ERR_SYSTEM || st == OVL_ERR_NOMEM ||
                st == OVL_ERR_INTERNAL;
    if (ours)
        log_warn("client %" PRIu64 " (pid %d): join refused: %s", c->id, (int)c->pid, err);
    else
        log_info("client %" PRIu64 " (pid %d): join refused: %s", c->id, (int)c->pid, err);
    ovld_reply_error(c, id, st, "%s", err);
}

/* Joins the rank here and answers; the status of the join. */
static ovl_status_t comm_join(ovld_conn_t *c, uint64_t id, const ovld_join_desc_t *jd)
{
    ovld_member_t *m;
    ovld_doorbell_export_t db = {.fd = -1};
    char err[256] = "";
    ovld_conn_comm_t *k = calloc(1, sizeof(*k));
    if (!k) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return OVL_ERR_NOMEM;
    }
    ovl_status_t st = ovld_job_join(&c->d->jobs, jd, &m, &db, err, sizeof(err));
    if (st != OVL_OK) {
        free(k);
        join_refused(c, id, st, err);
        return st;
    }
    k->m = m;
    k->comm_id = ovld_member_comm_id(m);
    k->next = c->comms;
    c->comms = k;
    Ovl__CommInitReply cr = OVL__COMM_INIT_REPLY__INIT;
    cr.comm_id = k->comm_id;
    cr.doorbell_offset = db.offset;
    cr.fd_count = db.fd >= 0 ? 1 : 0;
    cr.max_in_flight = c->d->cfg.max_ops_in_flight;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_COMM_INIT;
    r.comm_init = &cr;
    ovld_reply(c, &r, db.fd >= 0 ? &db.fd : NULL, db.fd >= 0 ? 1 : 0);
    return OVL_OK;
}

/* A join of a job across nodes waiting for its coordinator's word
 * (cluster.h): the connection's later requests wait with it, as for an
 * import. */
typedef struct admit_work {
    ovld_conn_t *c;
    uint64_t id;
    ovld_join_desc_t jd;
} admit_work_t;

static void admit_done(void *arg, ovl_status_t st, const char *why)
{
    admit_work_t *w = arg;
    ovld_conn_t *c = w->c;
    ovld_t *d = c->d;
    d->works--;
    c->busy = false;
    if (st != OVL_OK) {
        if (!c->closing) {
            char err[320];
            snprintf(err, sizeof(err), "%s", why);
            join_refused(c, w->id, st, err);
        }
    } else if (c->closing) {
        ovld_cluster_leave(d->cluster, w->jd.blob.nonce, w->jd.rank, false,
                           "its client went away while it joined");
    } else if (comm_join(c, w->id, &w->jd) != OVL_OK) {
        ovld_cluster_leave(d->cluster, w->jd.blob.nonce, w->jd.rank, false,
                           "it could not join on its node");
    }
    if (!c->closing) {
        ovld_conn_update_poll(c);
        ovld_conn_process_frames(c);
    }
    free(w);
    ovld_conn_put(c);
}

static void on_comm_init(ovld_conn_t *c, uint64_t id, const Ovl__CommInit *q)
{
    ovld_t *d = c->d;
    ovld_join_desc_t jd;
    ovld_request_join_desc(q, &jd);
    jd.uid = c->uid;
    jd.pid = c->pid;
    if (!jd.across) {
        (void)comm_join(c, id, &jd);
        return;
    }
    char err[256] = "";
    if (!d->cluster) {
        ovld_reply_error(c, id, OVL_ERR_UNSUPPORTED,
                         "a job across nodes needs links to the other nodes: peer_listen is not "
                         "set on this node (docs/multinode.md)");
        return;
    }
    /* What this node would refuse anyway, before the coordinator counts
     * the rank in. */
    uint32_t dev = 0;
    ovl_status_t st = ovld_job_join_check(&d->jobs, &jd, &dev, err, sizeof(err));
    if (st != OVL_OK) {
        join_refused(c, id, st, err);
        return;
    }
    admit_work_t *w = calloc(1, sizeof(*w));
    if (!w) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    *w = (admit_work_t){.c = c, .id = id, .jd = jd};
    st = ovld_cluster_admit(d->cluster, &jd.blob, jd.world, jd.rank, dev, jd.uid, admit_done, w,
                            err, sizeof(err));
    if (st != OVL_OK) {
        free(w);
        join_refused(c, id, st, err);
        return;
    }
    c->busy = true;
    c->refs++;
    d->works++;
    ovld_conn_update_poll(c);
}

static void on_job_id_create(ovld_conn_t *c, uint64_t id)
{
    ovld_t *d = c->d;
    if (!d->cluster) {
        ovld_reply_error(c, id, OVL_ERR_UNSUPPORTED,
                         "jobs across nodes need links to the other nodes: peer_listen is not "
                         "set on this node (docs/multinode.md)");
        return;
    }
    uint8_t blob[OVLD_JOB_BLOB_LEN];
    char err[256] = "";
    ovl_status_t st = ovld_cluster_job_id_create(d->cluster, c->uid, blob, err, sizeof(err));
    if (st != OVL_OK) {
        log_info("client %" PRIu64 " (pid %d, uid %u): job id refused: %s", c->id, (int)c->pid,
                 (unsigned)c->uid, err);
        ovld_reply_error(c, id, st, "%s", err);
        return;
    }
    Ovl__JobIdCreateReply jr = OVL__JOB_ID_CREATE_REPLY__INIT;
    jr.id.data = blob;
    jr.id.len = sizeof(blob);
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_JOB_ID_CREATE;
    r.job_id_create = &jr;
    ovld_reply(c, &r, NULL, 0);
}

static void on_comm_destroy(ovld_conn_t *c, uint64_t id, const Ovl__CommDestroy *q)
{
    ovld_conn_comm_t *k = conn_comm(c, q->comm_id);
    if (!k) {
        ovld_reply_error(c, id, OVL_ERR_NOT_FOUND, "no comm %" PRIu64 " on this connection",
                         q->comm_id);
        return;
    }
    ovld_conn_leave(c, k, "comm destroyed");
    ovld_reply_ok(c, id);
}

static void on_comm_check(ovld_conn_t *c, uint64_t id, const Ovl__CommCheck *q)
{
    ovld_conn_comm_t *k = conn_comm(c, q->comm_id);
    if (!k) {
        ovld_reply_error(c, id, OVL_ERR_NOT_FOUND, "no comm %" PRIu64 " on this connection",
                         q->comm_id);
        return;
    }
    Ovl__CommCheckReply cr = OVL__COMM_CHECK_REPLY__INIT;
    ovl_status_t st;
    const char *msg;
    ovld_member_error(k->m, &st, &cr.seq, &msg);
    cr.status = st;
    cr.message = (char *)msg;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_COMM_CHECK;
    r.comm_check = &cr;
    ovld_reply(c, &r, NULL, 0);
}

/* One registration: import (maybe on a worker thread), then the reply. */
typedef struct import_work {
    uv_work_t req;
    ovld_conn_t *c;
    uint64_t id;
    ovld_mem_import_t imp;
    uint8_t ipc[64];
    uint64_t client_addr;
    ovld_reg_t *reg;
    ovl_status_t st;
    char err[200]; /* the backend's words for a failure */
} import_work_t;

static void import_run(uv_work_t *req)
{
    import_work_t *w = req->data;
    ovld_backend_t *b = w->c->d->backend;
    w->st = b->ops->mem_import(b, &w->imp, (ovld_bmem_t **)&w->reg->bmem, &w->reg->ptr, w->err,
                               sizeof(w->err));
}

static void import_finish(import_work_t *w)
{
    ovld_conn_t *c = w->c;
    ovld_t *d = c->d;
    ovld_reg_t *reg = w->reg;
    if (w->st == OVL_OK && c->closing) {
        ovld_buf_discard(reg, true);
    } else if (w->st == OVL_OK) {
        reg->bytes = w->imp.bytes;
        reg->client_addr = w->client_addr;
        reg->device = w->imp.device;
        ovld_buf_register(&c->reg, reg);
        OVLD_COUNT(&d->counters, registrations, 1);
        Ovl__MemRegisterReply mr = OVL__MEM_REGISTER_REPLY__INIT;
        mr.mem_id = reg->id;
        Ovl__Response r = OVL__RESPONSE__INIT;
        r.id = w->id;
        r.body_case = OVL__RESPONSE__BODY_MEM_REGISTER;
        r.mem_register = &mr;
        log_debug("client %" PRIu64 ": registered buffer %" PRIu64 " (%" PRIu64
                  " bytes at 0x%" PRIx64 ", device %d)",
                  c->id, reg->id, reg->bytes, reg->client_addr, reg->device);
        ovld_reply(c, &r, NULL, 0);
    } else {
        ovld_buf_discard(reg, false);
        const char *why = w->err[0] ? w->err /* the backend's own words */
                          : w->st == OVL_ERR_PERMISSION
                              ? "memory must be a sealed memfd (F_SEAL_SHRINK)"
                          : w->st == OVL_ERR_RANGE   ? "range lies outside the memory passed"
                          : w->st == OVL_ERR_BACKEND ? "the backend cannot map it"
                                                     : ovl_strerror(w->st);
        /* Logged once, here, with the words the client gets. */
        log_info("client %" PRIu64 " (pid %d, uid %u): cannot register %" PRIu64 " bytes: %s%s",
                 c->id, (int)c->pid, (unsigned)c->uid, w->imp.bytes, why,
                 c->closing ? " (the client is gone)" : "");
        if (!c->closing)
            ovld_reply_error(c, w->id, w->st, "cannot register %" PRIu64 " bytes: %s", w->imp.bytes,
                             why);
    }
    free(w);
}

static void import_after(uv_work_t *req, int status)
{
    import_work_t *w = req->data;
    ovld_conn_t *c = w->c;
    c->d->works--;
    if (status == UV_ECANCELED && w->st == OVL_OK)
        w->st = OVL_ERR_SHUTDOWN;
    c->busy = false;
    import_finish(w);
    if (!c->closing) {
        ovld_conn_update_poll(c);
        ovld_conn_process_frames(c);
    }
    ovld_conn_put(c);
}

/* Whether c may map `bytes` more: every limit that applies (the
 * connection's, its uid's, the daemon's), and the refusal names the one
 * that was hit, with its value. */
static ovl_status_t mapping_quota(const ovld_conn_t *c, uint64_t bytes, char *why, size_t len)
{
    const ovld_t *d = c->d;
    const ovld_config_t *cfg = &d->cfg;
    ovld_uid_usage_t u;
    uint64_t all, total;
    ovld_conn_uid_usage(d, c->uid, &u, &all);
    if (c->reg.count >= cfg->max_registrations) {
        snprintf(why, len, "this connection has %zu buffers registered (max_registrations = %u)",
                 c->reg.count, cfg->max_registrations);
        return OVL_ERR_LIMIT;
    }
    if (__builtin_add_overflow(c->reg.mapped_bytes, bytes, &total) ||
        total > cfg->max_mapped_bytes) {
        snprintf(why, len,
                 "this connection has %" PRIu64 " bytes mapped (max_mapped_bytes = %" PRIu64 ")",
                 c->reg.mapped_bytes, cfg->max_mapped_bytes);
        return OVL_ERR_LIMIT;
    }
    if (u.regs >= cfg->max_registrations_per_uid) {
        snprintf(why, len,
                 "uid %u has %" PRIu64 " buffers registered (max_registrations_per_uid = %u)",
                 (unsigned)c->uid, u.regs, cfg->max_registrations_per_uid);
        return OVL_ERR_LIMIT;
    }
    if (__builtin_add_overflow(u.bytes, bytes, &total) || total > cfg->max_mapped_bytes_per_uid) {
        snprintf(why, len,
                 "uid %u has %" PRIu64 " bytes mapped (max_mapped_bytes_per_uid = %" PRIu64 ")",
                 (unsigned)c->uid, u.bytes, cfg->max_mapped_bytes_per_uid);
        return OVL_ERR_LIMIT;
    }
    if (all >= d->max_mappings) {
        snprintf(why, len,
                 "ovld has %" PRIu64 " buffers mapped for all users (max_mappings = %u%s)", all,
                 d->max_mappings, cfg->max_mappings ? "" : ", auto: half of vm.max_map_count");
        return OVL_ERR_LIMIT;
    }
    return OVL_OK;
}

static void on_mem_register(ovld_conn_t *c, uint64_t id, const Ovl__MemRegister *q)
{
    ovld_t *d = c->d;
    int fd = -1;
    if (q->fd_count == 1) { /* at most one: request.c */
        fd = ovl_fdq_pop(&c->fdq);
        if (fd < 0) {
            ovld_conn_fail(c, id, OVL_ERR_PROTOCOL,
                           "MemRegister announced a descriptor that did not come");
            return;
        }
    }
    ovl_status_t st;
    const char *why = NULL;
    char whybuf[200];
    int device = -1;
    if (q->device_uuid.len) {
        device = ovld_backend_device_by_uuid(d->backend, q->device_uuid.data, q->device_uuid.len);
        if (device < 0) {
            st = OVL_ERR_NOT_FOUND;
            why = "no such device on this node";
            goto refuse;
        }
    }
    if ((st = mapping_quota(c, q->bytes, whybuf, sizeof(whybuf))) != OVL_OK) {
        why = whybuf;
    } else {
        import_work_t *w = calloc(1, sizeof(*w));
        ovld_reg_t *reg = ovld_buf_new(&d->buffers);
        if (!w || !reg) {
            free(w);
            free(reg);
            st = OVL_ERR_NOMEM;
            why = "out of memory";
            goto refuse;
        }
        w->req.data = w;
        w->c = c;
        w->id = id;
        w->reg = reg;
        w->client_addr = q->client_addr;
        if (q->ipc_handle.len)
            memcpy(w->ipc, q->ipc_handle.data, q->ipc_handle.len);
        w->imp = (ovld_mem_import_t){.fd = fd,
                                     .fd_offset = q->fd_offset,
                                     .bytes = q->bytes,
                                     .ipc = q->ipc_handle.len ? w->ipc : NULL,
                                     .ipc_len = q->ipc_handle.len,
                                     .ipc_offset = q->ipc_offset,
                                     .device = device};
        fd = -1; /* the backend owns it now */
        if (!d->backend->ops->import_blocking) {
            import_run(&w->req);
            import_finish(w);
            return;
        }
        /* Opening an IPC handle costs up to 2 ms and may synchronize: on a
         * worker, with this connection's later requests held until done. */
        c->busy = true;
        c->refs++;
        d->works++;
        if (uv_queue_work(d->loop, &w->req, import_run, import_after) != 0) {
            c->busy = false;
            c->refs--;
            d->works--;
            import_run(&w->req);
            import_finish(w);
            return;
        }
        ovld_conn_update_poll(c);
        return;
    }
refuse:
    if (fd >= 0)
        close(fd);
    ovld_reply_error(c, id, st, "cannot register %" PRIu64 " bytes: %s", q->bytes, why);
}

/* A deregistration whose unmapping may block: done on a worker, answered
 * once the mapping is gone, so that the client may free its memory then. */
typedef struct unmap_work {
    uv_work_t req;
    ovld_conn_t *c;
    uint64_t id;
    ovld_reg_t *reg;
} unmap_work_t;

static void unmap_run(uv_work_t *req)
{
    unmap_work_t *w = req->data;
    ovld_buf_unmap_now(w->reg, true);
}

static void unmap_after(uv_work_t *req, int status)
{
    (void)status;
    unmap_work_t *w = req->data;
    ovld_conn_t *c = w->c;
    c->d->works--;
    c->busy = false;
    if (!c->closing) {
        ovld_reply_ok(c, w->id);
        ovld_conn_update_poll(c);
        ovld_conn_process_frames(c);
    }
    free(w);
    ovld_conn_put(c);
}

/* Unmaps a registration nothing but its connection uses any more, then
 * answers the client (on a worker where unmapping may block). */
static void deregister_now(ovld_conn_t *c, uint64_t id, ovld_reg_t *reg)
{
    ovld_t *d = c->d;
    unmap_work_t *w = d->backend->ops->import_blocking ? calloc(1, sizeof(*w)) : NULL;
    if (w) {
        ovld_buf_detach(&c->reg, reg);
        w->req.data = w;
        w->c = c;
        w->id = id;
        w->reg = reg;
        c->busy = true;
        c->refs++;
        d->works++;
        if (uv_queue_work(d->loop, &w->req, unmap_run, unmap_after) == 0) {
            ovld_conn_update_poll(c);
            return;
        }
        c->busy = false;
        c->refs--;
        d->works--;
        free(w);
        ovld_buf_unmap_now(reg, true);
        ovld_reply_ok(c, id);
        return;
    }
    ovld_buf_unregister(&c->reg, reg);
    ovld_reply_ok(c, id);
}

typedef struct dereg_wait {
    ovld_conn_t *c;
    uint64_t id;
} dereg_wait_t;

static void on_reg_idle(ovld_reg_t *reg, void *arg)
{
    dereg_wait_t *w = arg;
    ovld_conn_t *c = w->c;
    uint64_t id = w->id;
    free(w);
    c->busy = false;
    if (c->closing) {
        ovld_conn_put(c);
        return;
    }
    deregister_now(c, id, reg);
    if (!c->busy) {
        ovld_conn_update_poll(c);
        ovld_conn_process_frames(c);
    }
    ovld_conn_put(c);
}

static void on_mem_deregister(ovld_conn_t *c, uint64_t id, const Ovl__MemDeregister *q)
{
    ovld_t *d = c->d;
    ovld_reg_t *reg = ovld_registry_find(&c->reg, q->mem_id);
    if (!reg) {
        ovld_reply_error(c, id, OVL_ERR_NOT_FOUND, "buffer %" PRIu64 " is not registered here",
                         q->mem_id);
        return;
    }
    OVLD_COUNT(&d->counters, deregistrations, 1);
    if (ovld_buf_in_use(reg)) {
        /* Ops still read or write it: their completions may reach this
         * thread after the client saw its doorbell rung. Answer once the
         * last of them let go, holding the connection's later requests. */
        dereg_wait_t *w = calloc(1, sizeof(*w));
        if (!w) {
            ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
            return;
        }
        w->c = c;
        w->id = id;
        ovld_buf_when_idle(reg, on_reg_idle, w);
        c->busy = true;
        c->refs++;
        ovld_conn_update_poll(c);
        return;
    }
    deregister_now(c, id, reg);
}

static void on_op(ovld_conn_t *c, const Ovl__Op *q, ovl_status_t invalid, const char *invalid_msg)
{
    ovld_conn_comm_t *k = conn_comm(c, q->comm_id);
    if (!k) {
        /* Nobody waits on a doorbell we do not know: say it and go on. */
        log_warn("client %" PRIu64 " (pid %d): op for unknown comm %" PRIu64, c->id, (int)c->pid,
                 q->comm_id);
        ovld_reply_error(c, 0, OVL_ERR_NOT_FOUND, "op %" PRIu64 " names unknown comm %" PRIu64,
                         q->seq, q->comm_id);
        return;
    }
    char err[256], bufs_msg[256] = "";
    ovld_op_desc_t op;
    ovld_request_op_desc(q, &op);
    ovld_op_verdict_t v = {.fields = invalid, .fields_msg = invalid_msg, .bufs = OVL_OK};
    if (invalid == OVL_OK) {
        v.bufs = ovld_buf_resolve_op(&c->reg, ovld_member_world(k->m), ovld_member_device(k->m),
                                     &op, bufs_msg, sizeof(bufs_msg));
        v.bufs_msg = bufs_msg;
    }
    ovl_status_t st = ovld_job_submit(&c->d->jobs, k->m, &op, &v, err, sizeof(err));
    if (st != OVL_OK)
        ovld_conn_fail(c, 0, st, err);
}

static void on_plan(ovld_conn_t *c, uint64_t id, const Ovl__PlanRequest *q)
{
    ovld_op_desc_t op;
    uint32_t world, rank;
    ovld_request_plan_desc(q, &op, &world, &rank);
    ovl_plan_params_t p;
    char why[200];
    ovl_status_t pst = ovld_op_plan_params(&c->d->cfg, c->d->backend->ops->allgather != NULL, &op,
                                           world, rank, &p, why, sizeof(why));
    if (pst != OVL_OK) {
        ovld_reply_error(c, id, pst, "cannot plan: %s", why);
        return;
    }
    /* auto's measured choice where it has one: what an op would run */
    (void)ovld_tune_peek(c->d->tune, &p);
    /* a shape it cannot plan is refused below */
    ovl_plan_t plan;
    ovl_status_t st = ovl_plan_build(&p, &plan);
    if (st != OVL_OK) {
        ovld_reply_error(c, id, st,
                         "cannot plan: %s (world %u, rank %u, m %" PRIu64 ", n %" PRIu64
                         ", k %" PRIu64 ", chunks %u, streams %u)",
                         ovl_strerror(st), p.world, p.rank, p.m, p.n, p.k, p.chunks, p.streams);
        return;
    }
    size_t len = ovl_plan_format(&plan, NULL, 0);
    char *text = malloc(len + 1);
    if (!text) {
        ovl_plan_free(&plan);
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    ovl_plan_format(&plan, text, len + 1);
    Ovl__PlanReply pr = OVL__PLAN_REPLY__INIT;
    pr.algo = (char *)ovl_algo_name(plan.params.algo);
    pr.kind = (char *)ovl_op_kind_name(plan.params.kind);
    pr.text = text;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_PLAN;
    r.plan = &pr;
    ovld_reply(c, &r, NULL, 0);
    free(text);
    ovl_plan_free(&plan);
}

/* A PeerPing waiting for its round trip (peer.h): the connection's later
 * requests wait with it, as for an import; at most peer_timeout_ms. */
typedef struct ping_work {
    ovld_conn_t *c;
    uint64_t id;
    char addr[OVLD_ADDR_TEXT_MAX];
} ping_work_t;

static void peer_ping_done(void *arg, ovl_status_t st, double rtt_s, const uint8_t *instance,
                           const char *why)
{
    ping_work_t *w = arg;
    ovld_conn_t *c = w->c;
    c->d->works--;
    c->busy = false;
    if (st == OVL_OK)
        log_debug("client %" PRIu64 ": peer ping %s: %.3f ms", c->id, w->addr, rtt_s * 1e3);
    else
        log_info("client %" PRIu64 " (pid %d, uid %u): peer ping %s failed: %s", c->id, (int)c->pid,
                 (unsigned)c->uid, w->addr, why);
    if (!c->closing) {
        if (st == OVL_OK) {
            Ovl__PeerPingReply pr = OVL__PEER_PING_REPLY__INIT;
            pr.address = w->addr;
            pr.rtt_s = rtt_s;
            pr.instance.data = (uint8_t *)instance;
            pr.instance.len = OVLD_PEER_INSTANCE_LEN;
            Ovl__Response r = OVL__RESPONSE__INIT;
            r.id = w->id;
            r.body_case = OVL__RESPONSE__BODY_PEER_PING;
            r.peer_ping = &pr;
            ovld_reply(c, &r, NULL, 0);
        } else {
            ovld_reply_error(c, w->id, st, "%s: %s", w->addr, why);
        }
        if (!c->closing) {
            ovld_conn_update_poll(c);
            ovld_conn_process_frames(c);
        }
    }
    free(w);
    ovld_conn_put(c);
}

static void on_peer_ping(ovld_conn_t *c, uint64_t id, const Ovl__PeerPing *q)
{
    ovld_t *d = c->d;
    /* It makes ovld open connections to other machines: an operator's
     * tool, not a user's. */
    if (c->uid != 0 && c->uid != getuid()) {
        ovld_reply_error(c, id, OVL_ERR_PERMISSION,
                         "only root or ovld's own user (uid %u) may ping peers",
                         (unsigned)getuid());
        return;
    }
    if (!d->peers) {
        ovld_reply_error(c, id, OVL_ERR_UNSUPPORTED,
                         "this ovld has no links to other nodes: peer_listen is not set "
                         "(docs/multinode.md)");
        return;
    }
    char text[OVLD_ADDR_TEXT_MAX], err[256];
    memcpy(text, q->address.data, q->address.len); /* 1..63 bytes, checked */
    text[q->address.len] = '\0';
    struct sockaddr_storage ss;
    ping_work_t *w = calloc(1, sizeof(*w));
    if (!w) {
        ovld_reply_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    ovl_status_t st = ovld_peer_addr_parse(text, &ss, w->addr, err, sizeof(err));
    if (st == OVL_OK)
        st = ovld_peers_ping(d->peers, &ss, peer_ping_done, w, err, sizeof(err));
    if (st != OVL_OK) {
        free(w);
        ovld_reply_error(c, id, st, "%s: %s", text, err);
        return;
    }
    w->c = c;
    w->id = id;
    c->busy = true;
    c->refs++;
    d->works++;
    ovld_conn_update_poll(c);
}

bool ovld_dispatch_frame(ovld_conn_t *c, const uint8_t *body, uint32_t len)
{
    Ovl__Request *q = ovl__request__unpack(NULL, len, body);
    if (!q) {
        ovld_conn_fail(c, 0, OVL_ERR_PROTOCOL, "malformed request");
        return false;
    }
    uint64_t id = q->id;
    if (!c->hello_done && q->body_case != OVL__REQUEST__BODY_HELLO) {
        ovld_conn_fail(c, id, OVL_ERR_PROTOCOL, "expected Hello first");
        ovl__request__free_unpacked(q, NULL);
        return false;
    }
    if (c->d->stopping && q->body_case != OVL__REQUEST__BODY_STATUS &&
        q->body_case != OVL__REQUEST__BODY_STATS && q->body_case != OVL__REQUEST__BODY_OP) {
        bool open = ovld_reply_error(c, id, OVL_ERR_SHUTDOWN, "ovld is shutting down");
        ovl__request__free_unpacked(q, NULL);
        return open;
    }
    char why[256];
    ovl_status_t chk = ovld_request_check(q, why, sizeof(why));
    if (chk == OVL_ERR_PROTOCOL) {
        ovld_conn_fail(c, id, chk, why);
        ovl__request__free_unpacked(q, NULL);
        return false;
    }
    if (chk != OVL_OK && q->body_case != OVL__REQUEST__BODY_OP) {
        /* Refused whole; an op is refused as an op, on its doorbell. A
         * descriptor that came with it goes, so that the next request's
         * is the next in the queue. */
        if (q->body_case == OVL__REQUEST__BODY_MEM_REGISTER && q->mem_register->fd_count == 1) {
            int fd = ovl_fdq_pop(&c->fdq);
            if (fd < 0) {
                ovld_conn_fail(c, id, OVL_ERR_PROTOCOL,
                               "MemRegister announced a descriptor that did not come");
                ovl__request__free_unpacked(q, NULL);
                return false;
            }
            close(fd);
        }
        const char *what = q->body_case == OVL__REQUEST__BODY_PLAN           ? "cannot plan: "
                           : q->body_case == OVL__REQUEST__BODY_COMM_INIT    ? "cannot join: "
                           : q->body_case == OVL__REQUEST__BODY_MEM_REGISTER ? "cannot register: "
                                                                             : "";
        log_info("client %" PRIu64 " (pid %d, uid %u): request refused: %s%s", c->id, (int)c->pid,
                 (unsigned)c->uid, what, why);
        bool open = ovld_reply_error(c, id, chk, "%s%s", what, why);
        ovl__request__free_unpacked(q, NULL);
        return open;
    }
    switch (q->body_case) {
    case OVL__REQUEST__BODY_HELLO:
        on_hello(c, id, q->hello);
        break;
    case OVL__REQUEST__BODY_STATUS:
        ovld_info_status(c, id);
        break;
    case OVL__REQUEST__BODY_COMM_INIT:
        on_comm_init(c, id, q->comm_init);
        break;
    case OVL__REQUEST__BODY_COMM_DESTROY:
        on_comm_destroy(c, id, q->comm_destroy);
        break;
    case OVL__REQUEST__BODY_COMM_CHECK:
        on_comm_check(c, id, q->comm_check);
        break;
    case OVL__REQUEST__BODY_MEM_REGISTER:
        on_mem_register(c, id, q->mem_register);
        break;
    case OVL__REQUEST__BODY_MEM_DEREGISTER:
        on_mem_deregister(c, id, q->mem_deregister);
        break;
    case OVL__REQUEST__BODY_OP:
        on_op(c, q->op, chk, why);
        break;
    case OVL__REQUEST__BODY_PLAN:
        on_plan(c, id, q->plan);
        break;
    case OVL__REQUEST__BODY_STATS:
        ovld_info_stats(c, id, q->stats);
        break;
    case OVL__REQUEST__BODY_TUNE:
        ovld_info_tune(c, id, q->tune);
        break;
    case OVL__REQUEST__BODY_PEER_PING:
        on_peer_ping(c, id, q->peer_ping);
        break;
    case OVL__REQUEST__BODY_JOB_ID_CREATE:
        on_job_id_create(c, id);
        break;
    default:
        ovld_conn_fail(c, id, OVL_ERR_PROTOCOL, "unknown request");
        break;
    }
    bool open = !c->closing;
    ovl__request__free_unpacked(q, NULL);
    return open;
}

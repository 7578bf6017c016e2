/*
 * server.c: the Unix socket, connections and requests. One libuv loop; every
 * socket is ours (accept4, recvmsg, sendmsg), libuv only polls it, because
 * libuv will not hand over passed descriptors other than sockets (API-NOTES
 * section 5) and the host backend receives memfds.
 *
 * A connection's life: accept (SO_PEERCRED taken), Hello first (version
 * check), then requests in order, each answered in order except AgGemm,
 * which is answered through the doorbell. A malformed, oversized or
 * out-of-order frame gets an Error (where it can still be sent) and closes
 * that connection only.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "job.h"
#include "log.h"
#include "ovl.pb-c.h"
#include "ovld.h"
#include "plan.h"
#include "request.h"
#include "sdnotify.h"
#include "text.h"
#include "clock.h"

/* A client that stops reading its replies is dropped past this. */
#define MAX_OUT_PENDING (64u << 20)

static void conn_update_poll(ovld_conn_t *c);

/* Queues a response; false if the connection had to be closed. */
static bool send_error(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool send_response(ovld_conn_t *c, Ovl__Response *resp, const int *fds, unsigned nfds)
{
    uint32_t max = c->d->cfg.max_frame_bytes;
    size_t len = ovl__response__get_packed_size(resp);
    if (len > max && resp->body_case != OVL__RESPONSE__BODY_ERROR) {
        /* The client's reader would refuse it: say so instead (an Error is
         * short, and its message says which limit). */
        for (unsigned i = 0; i < nfds; i++)
            close(fds[i]);
        return send_error(c, resp->id, OVL_ERR_LIMIT,
                          "the reply would be %zu bytes, over max_frame_bytes (%u)", len, max);
    }
    ovl_status_t st = ovl_wire_out_append(&c->out, &resp->base, max, fds, nfds);
    if (st != OVL_OK) {
        log_error("client %" PRIu64 " (pid %d): cannot queue a reply: %s", c->id, (int)c->pid,
                  ovl_strerror(st));
        ovld_conn_close(c, "reply failed");
        return false;
    }
    st = ovl_wire_flush(c->fd, &c->out);
    if (st == OVL_ERR_AGAIN) {
        if (ovl_wire_out_pending(&c->out) > MAX_OUT_PENDING) {
            ovld_conn_close(c, "client does not read its replies");
            return false;
        }
        conn_update_poll(c);
        return true;
    }
    if (st != OVL_OK) {
        ovld_conn_close(c, st == OVL_ERR_CLOSED ? "client went away" : strerror(errno));
        return false;
    }
    conn_update_poll(c);
    return true;
}

static bool send_error(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *fmt, ...)
{
    char msg[512];
    ovld_count_error(&c->d->counters, status);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    Ovl__Error e = OVL__ERROR__INIT;
    e.status = status;
    e.message = msg;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_ERROR;
    r.error = &e;
    return send_response(c, &r, NULL, 0);
}

/* Logs, sends an Error where it can, and closes the connection. */
static void conn_fail(ovld_conn_t *c, uint64_t id, ovl_status_t status, const char *what)
{
    log_warn("client %" PRIu64 " (pid %d, uid %u): %s; closing the connection", c->id, (int)c->pid,
             (unsigned)c->uid, what);
    if (send_error(c, id, status, "%s", what))
        ovld_conn_close(c, what);
}

static bool send_ok(ovld_conn_t *c, uint64_t id)
{
    Ovl__Ok ok = OVL__OK__INIT;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_OK;
    r.ok = &ok;
    return send_response(c, &r, NULL, 0);
}

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

/* ------------------------------------------------------------ requests */

static void on_hello(ovld_conn_t *c, uint64_t id, const Ovl__Hello *h)
{
    ovld_t *d = c->d;
    if (c->hello_done) {
        conn_fail(c, id, OVL_ERR_PROTOCOL, "Hello sent twice");
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
        conn_fail(c, id, OVL_ERR_VERSION, msg);
        return;
    }
    c->hello_done = true;
    /* Shown to operators (ovlctl status, the log): clean text, cut on a
     * character boundary, whatever the client sent (text.h). */
    if (h->client_name.len)
        ovl_text_sanitize(c->name, sizeof(c->name), h->client_name.data, h->client_name.len);

    device_list_t dl;
    if (!device_list_make(d, &dl)) {
        conn_fail(c, id, OVL_ERR_NOMEM, "out of memory");
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
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_HELLO;
    r.hello = &hr;
    log_debug("client %" PRIu64 ": hello from '%s' (pid %d, uid %u, libovl %s)", c->id, c->name,
              (int)c->pid, (unsigned)c->uid, lib);
    send_response(c, &r, pidfd >= 0 ? &pidfd : NULL, pidfd >= 0 ? 1 : 0);
    device_list_free(&dl);
}

static void on_status(ovld_conn_t *c, uint64_t id)
{
    ovld_t *d = c->d;
    size_t nj = d->njobs, nc = d->nconns;
    device_list_t dl = {0};
    bool have_devs = device_list_make(d, &dl);
    Ovl__JobInfo *jobs = calloc(nj + 1, sizeof(*jobs));
    Ovl__JobInfo **pjobs = calloc(nj + 1, sizeof(*pjobs));
    Ovl__ClientInfo *cls = calloc(nc + 1, sizeof(*cls));
    Ovl__ClientInfo **pcls = calloc(nc + 1, sizeof(*pcls));
    if (!have_devs || !jobs || !pjobs || !cls || !pcls) {
        send_error(c, id, OVL_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* Root and ovld's own user see everything; anyone else sees their own
     * jobs and clients, and how many others there are (docs/ovlctl.md). */
    bool restricted = c->uid != 0 && c->uid != getuid();
    uint32_t other_jobs = 0, other_clients = 0;
    size_t i = 0;
    for (ovld_job_t *j = d->jobs; j && i < nj; j = j->next) {
        if (restricted && j->owner != c->uid) {
            other_jobs++;
            continue;
        }
        Ovl__JobInfo *ji = &jobs[i];
        pjobs[i++] = ji;
        ovl__job_info__init(ji);
        ji->id = j->id;
        ji->owner_uid = (uint32_t)j->owner;
        ji->world = j->world;
        ji->local_ranks = j->joined;
        ji->state = (char *)ovld_job_state_name(j->state);
        ji->ops_done = j->ops_done;
        ji->ops_in_flight = j->in_flight;
        ji->last_error = j->last_error;
    }
    nj = i;
    i = 0;
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
        if (k->members) {
            ci->job = k->members->job->id;
            ci->rank = (int32_t)k->members->rank;
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
    sr.restricted = restricted;
    sr.other_jobs = other_jobs;
    sr.other_clients = other_clients;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_STATUS;
    r.status = &sr;
    send_response(c, &r, NULL, 0);
out:
    if (have_devs)
        device_list_free(&dl);
    free(jobs);
    free(pjobs);
    free(cls);
    free(pcls);
}

static void on_comm_init(ovld_conn_t *c, uint64_t id, const Ovl__CommInit *q)
{
    ovld_member_t *m;
    ovld_doorbell_export_t db = {.fd = -1};
    char err[256] = "";
    ovld_join_desc_t jd;
    ovld_request_join_desc(q, &jd);
    ovl_status_t st = ovld_job_join(c->d, c, &jd, &m, &db, err, sizeof(err));
    if (st != OVL_OK) {
        log_info("client %" PRIu64 " (pid %d): join refused: %s", c->id, (int)c->pid, err);
        send_error(c, id, st, "%s", err);
        return;
    }
    Ovl__CommInitReply cr = OVL__COMM_INIT_REPLY__INIT;
    cr.comm_id = m->comm_id;
    cr.doorbell_offset = db.offset;
    cr.fd_count = db.fd >= 0 ? 1 : 0;
    cr.max_in_flight = c->d->cfg.max_ops_in_flight;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_COMM_INIT;
    r.comm_init = &cr;
    send_response(c, &r, db.fd >= 0 ? &db.fd : NULL, db.fd >= 0 ? 1 : 0);
}

static void on_comm_destroy(ovld_conn_t *c, uint64_t id, const Ovl__CommDestroy *q)
{
    ovld_member_t *m = ovld_job_member(c, q->comm_id);
    if (!m) {
        send_error(c, id, OVL_ERR_NOT_FOUND, "no comm %" PRIu64 " on this connection", q->comm_id);
        return;
    }
    ovld_job_leave(c->d, m, "comm destroyed");
    send_ok(c, id);
}

static void on_comm_check(ovld_conn_t *c, uint64_t id, const Ovl__CommCheck *q)
{
    ovld_member_t *m = ovld_job_member(c, q->comm_id);
    if (!m) {
        send_error(c, id, OVL_ERR_NOT_FOUND, "no comm %" PRIu64 " on this connection", q->comm_id);
        return;
    }
    Ovl__CommCheckReply cr = OVL__COMM_CHECK_REPLY__INIT;
    cr.status = m->err;
    cr.seq = m->err_seq;
    cr.message = m->err_msg;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_COMM_CHECK;
    r.comm_check = &cr;
    send_response(c, &r, NULL, 0);
}

static void process_frames(ovld_conn_t *c);
static void conn_put(ovld_conn_t *c);

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
        d->backend->ops->mem_release(d->backend, reg->bmem, false);
        free(reg);
    } else if (w->st == OVL_OK) {
        reg->bytes = w->imp.bytes;
        reg->client_addr = w->client_addr;
        reg->device = w->imp.device;
        ovld_registry_add(&c->reg, reg);
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
        send_response(c, &r, NULL, 0);
    } else {
        free(reg);
        if (!c->closing) {
            const char *why =
                w->st == OVL_ERR_PERMISSION ? "memory must be a sealed memfd (F_SEAL_SHRINK)"
                : w->st == OVL_ERR_RANGE    ? "range lies outside the memory passed"
                : w->st == OVL_ERR_BACKEND  ? "the backend cannot map it (see ovld's log)"
                                            : ovl_strerror(w->st);
            if (w->err[0])
                why = w->err; /* the backend's own words */
            send_error(c, w->id, w->st, "cannot register %" PRIu64 " bytes: %s", w->imp.bytes, why);
        }
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
        conn_update_poll(c);
        process_frames(c);
    }
    conn_put(c);
}

/* What one uid holds, over all its connections. */
typedef struct uid_usage {
    uint32_t conns;
    uint64_t regs;
    uint64_t bytes;
} uid_usage_t;

/* uid's usage, and the buffers mapped for everyone (*ret_all). A scan of
 * the connections: at most max_connections, and only on a connect or a
 * registration, which are rare next to ops. */
static void uid_usage(const ovld_t *d, uid_t uid, uid_usage_t *u, uint64_t *ret_all)
{
    *u = (uid_usage_t){0};
    uint64_t all = 0;
    for (const ovld_conn_t *k = d->conns; k; k = k->next) {
        all += k->reg.count;
        if (k->uid != uid)
            continue;
        u->conns++;
        u->regs += k->reg.count;
        u->bytes += k->reg.mapped_bytes;
    }
    if (ret_all)
        *ret_all = all;
}

/* Whether c may map `bytes` more: every limit that applies (the
 * connection's, its uid's, the daemon's), and the refusal names the one
 * that was hit, with its value. */
static ovl_status_t mapping_quota(const ovld_conn_t *c, uint64_t bytes, char *why, size_t len)
{
    const ovld_t *d = c->d;
    const ovld_config_t *cfg = &d->cfg;
    uid_usage_t u;
    uint64_t all, total;
    uid_usage(d, c->uid, &u, &all);
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
            conn_fail(c, id, OVL_ERR_PROTOCOL,
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
        ovld_reg_t *reg = calloc(1, sizeof(*reg));
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
        conn_update_poll(c);
        return;
    }
refuse:
    if (fd >= 0)
        close(fd);
    send_error(c, id, st, "cannot register %" PRIu64 " bytes: %s", q->bytes, why);
}

static void reg_drop(ovld_t *d, ovld_conn_t *c, ovld_reg_t *reg)
{
    ovld_registry_remove(&c->reg, reg);
    if (--reg->refs == 0) {
        d->backend->ops->mem_release(d->backend, reg->bmem, false);
        free(reg);
    }
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
    ovld_backend_t *b = w->c->d->backend;
    b->ops->mem_release(b, w->reg->bmem, true);
}

static void unmap_after(uv_work_t *req, int status)
{
    (void)status;
    unmap_work_t *w = req->data;
    ovld_conn_t *c = w->c;
    c->d->works--;
    free(w->reg);
    c->busy = false;
    if (!c->closing) {
        send_ok(c, w->id);
        conn_update_poll(c);
        process_frames(c);
    }
    free(w);
    conn_put(c);
}

/* Unmaps a registration nothing but its connection uses any more, then
 * answers the client (on a worker where unmapping may block). */
static void deregister_now(ovld_conn_t *c, uint64_t id, ovld_reg_t *reg)
{
    ovld_t *d = c->d;
    unmap_work_t *w = d->backend->ops->import_blocking ? calloc(1, sizeof(*w)) : NULL;
    if (w) {
        ovld_registry_remove(&c->reg, reg);
        w->req.data = w;
        w->c = c;
        w->id = id;
        w->reg = reg;
        c->busy = true;
        c->refs++;
        d->works++;
        if (uv_queue_work(d->loop, &w->req, unmap_run, unmap_after) == 0) {
            conn_update_poll(c);
            return;
        }
        c->busy = false;
        c->refs--;
        d->works--;
        free(w);
        d->backend->ops->mem_release(d->backend, reg->bmem, true);
        free(reg);
        send_ok(c, id);
        return;
    }
    reg_drop(d, c, reg);
    send_ok(c, id);
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
        conn_put(c);
        return;
    }
    deregister_now(c, id, reg);
    if (!c->busy) {
        conn_update_poll(c);
        process_frames(c);
    }
    conn_put(c);
}

/* Answers the deregistrations whose buffers went idle during this loop
 * round (job.c posts them). */
static void on_idle_check(uv_check_t *h)
{
    ovld_t *d = h->data;
    ovld_reg_t *reg;
    while ((reg = d->idle_regs) != NULL) {
        d->idle_regs = reg->idle_next;
        reg->idle_posted = false;
        reg->idle_next = NULL;
        void (*fn)(ovld_reg_t *, void *) = reg->on_idle;
        reg->on_idle = NULL;
        fn(reg, reg->idle_arg);
    }
}

/* Takes reg off the idle list, where a connection that closes finds it. */
static void idle_unlink(ovld_t *d, ovld_reg_t *reg)
{
    for (ovld_reg_t **pp = &d->idle_regs; *pp; pp = &(*pp)->idle_next)
        if (*pp == reg) {
            *pp = reg->idle_next;
            break;
        }
    reg->idle_posted = false;
    reg->idle_next = NULL;
}

static void on_mem_deregister(ovld_conn_t *c, uint64_t id, const Ovl__MemDeregister *q)
{
    ovld_t *d = c->d;
    ovld_reg_t *reg = ovld_registry_find(&c->reg, q->mem_id);
    if (!reg) {
        send_error(c, id, OVL_ERR_NOT_FOUND, "buffer %" PRIu64 " is not registered here",
                   q->mem_id);
        return;
    }
    OVLD_COUNT(&d->counters, deregistrations, 1);
    if (reg->refs > 1) {
        /* Ops still read or write it: their completions may reach this
         * thread after the client saw its doorbell rung. Answer once the
         * last of them let go, holding the connection's later requests. */
        dereg_wait_t *w = calloc(1, sizeof(*w));
        if (!w) {
            send_error(c, id, OVL_ERR_NOMEM, "out of memory");
            return;
        }
        w->c = c;
        w->id = id;
        reg->on_idle = on_reg_idle;
        reg->idle_arg = w;
        c->busy = true;
        c->refs++;
        conn_update_poll(c);
        return;
    }
    deregister_now(c, id, reg);
}

static void on_ag_gemm(ovld_conn_t *c, const Ovl__AgGemm *q, ovl_status_t invalid,
                       const char *invalid_msg)
{
    ovld_member_t *m = ovld_job_member(c, q->comm_id);
    if (!m) {
        /* Nobody waits on a doorbell we do not know: say it and go on. */
        log_warn("client %" PRIu64 " (pid %d): op for unknown comm %" PRIu64, c->id, (int)c->pid,
                 q->comm_id);
        send_error(c, 0, OVL_ERR_NOT_FOUND, "op %" PRIu64 " names unknown comm %" PRIu64, q->seq,
                   q->comm_id);
        return;
    }
    char err[256];
    ovld_op_desc_t op;
    ovld_request_op_desc(q, &op);
    ovl_status_t st = ovld_job_submit(c->d, m, &op, invalid, invalid_msg, err, sizeof(err));
    if (st != OVL_OK)
        conn_fail(c, 0, st, err);
}

static void on_plan(ovld_conn_t *c, uint64_t id, const Ovl__PlanRequest *q)
{
    ovl_plan_params_t p = {.algo = (ovl_algo_t)q->algo,
                           .world = q->world,
                           .rank = q->rank,
                           .m = q->m,
                           .n = q->n,
                           .k = q->k,
                           .dtype = (ovl_dtype_t)q->dtype,
                           .chunks = q->chunks,
                           .streams = q->streams,
                           .want_gathered = q->want_gathered};
    ovld_plan_resolve(c->d, &p); /* a shape it cannot plan is refused below */
    ovl_plan_t plan;
    ovl_status_t st = ovl_plan_build(&p, &plan);
    if (st != OVL_OK) {
        send_error(c, id, st,
                   "cannot plan: %s (world %u, rank %u, m %" PRIu64 ", n %" PRIu64 ", k %" PRIu64
                   ", chunks %u, streams %u)",
                   ovl_strerror(st), p.world, p.rank, p.m, p.n, p.k, p.chunks, p.streams);
        return;
    }
    size_t len = ovl_plan_format(&plan, NULL, 0);
    char *text = malloc(len + 1);
    if (!text) {
        ovl_plan_free(&plan);
        send_error(c, id, OVL_ERR_NOMEM, "out of memory");
        return;
    }
    ovl_plan_format(&plan, text, len + 1);
    Ovl__PlanReply pr = OVL__PLAN_REPLY__INIT;
    pr.algo = (char *)ovl_algo_name(plan.params.algo);
    pr.text = text;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_PLAN;
    r.plan = &pr;
    send_response(c, &r, NULL, 0);
    free(text);
    ovl_plan_free(&plan);
}

/* ----------------------------------------------------------------- stats */

/* Prometheus-style latency buckets: powers of two from 1 us to 69 s. */
#define STATS_BUCKETS 27

typedef struct stats_msg {
    Ovl__StatsBlock block;
    Ovl__OpCount ops[OVL_ALGO_COUNT * OVL_DTYPE_COUNT];
    Ovl__OpCount *pops[OVL_ALGO_COUNT * OVL_DTYPE_COUNT];
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
    /* every cell, AUTO's included: ops are counted as run, so AUTO's stay 0 */
    for (int a = 0; a < OVL_ALGO_COUNT; a++)
        for (int t = 0; t < OVL_DTYPE_COUNT; t++) {
            b->ops_done += s->ops[a][t];
            if (!s->ops[a][t])
                continue;
            ovl__op_count__init(&m->ops[n]);
            m->ops[n].algo = (char *)ovl_algo_name((ovl_algo_t)a);
            m->ops[n].dtype = (char *)ovl_dtype_name((ovl_dtype_t)t);
            m->ops[n].count = s->ops[a][t];
            m->pops[n] = &m->ops[n];
            n++;
        }
    b->n_ops = n;
    b->ops = m->pops;
    b->ops_failed = s->ops_failed;
    b->bytes_gathered = s->bytes_gathered;
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
    (void)d;
}

static void on_stats(ovld_conn_t *c, uint64_t id, const Ovl__StatsRequest *q)
{
    ovld_t *d = c->d;
    if (q->reset && c->uid != 0 && c->uid != getuid()) {
        send_error(c, id, OVL_ERR_PERMISSION,
                   "only root or ovld's own user (uid %u) may reset the counters",
                   (unsigned)getuid());
        return;
    }
    stats_msg_t *m = calloc(2, sizeof(*m));
    if (!m) {
        send_error(c, id, OVL_ERR_NOMEM, "out of memory");
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
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.id = id;
    r.body_case = OVL__RESPONSE__BODY_STATS;
    r.stats = &sr;
    send_response(c, &r, NULL, 0);
    free(m);
    if (q->reset) {
        ovld_stats_reset(&d->counters.window, now);
        d->hits_at_reset = hits;
        d->misses_at_reset = misses;
        log_info("counters reset by uid %u (pid %d)", (unsigned)c->uid, (int)c->pid);
    }
}

/* Handles one frame; false if the connection was closed. */
static bool handle_frame(ovld_conn_t *c, const uint8_t *body, uint32_t len)
{
    Ovl__Request *q = ovl__request__unpack(NULL, len, body);
    if (!q) {
        conn_fail(c, 0, OVL_ERR_PROTOCOL, "malformed request");
        return false;
    }
    uint64_t id = q->id;
    if (!c->hello_done && q->body_case != OVL__REQUEST__BODY_HELLO) {
        conn_fail(c, id, OVL_ERR_PROTOCOL, "expected Hello first");
        ovl__request__free_unpacked(q, NULL);
        return false;
    }
    if (c->d->stopping && q->body_case != OVL__REQUEST__BODY_STATUS &&
        q->body_case != OVL__REQUEST__BODY_STATS && q->body_case != OVL__REQUEST__BODY_AG_GEMM) {
        bool open = send_error(c, id, OVL_ERR_SHUTDOWN, "ovld is shutting down");
        ovl__request__free_unpacked(q, NULL);
        return open;
    }
    char why[256];
    ovl_status_t chk = ovld_request_check(q, why, sizeof(why));
    if (chk == OVL_ERR_PROTOCOL) {
        conn_fail(c, id, chk, why);
        ovl__request__free_unpacked(q, NULL);
        return false;
    }
    if (chk != OVL_OK && q->body_case != OVL__REQUEST__BODY_AG_GEMM) {
        /* Refused whole; an op is refused as an op, on its doorbell. A
         * descriptor that came with it goes, so that the next request's
         * is the next in the queue. */
        if (q->body_case == OVL__REQUEST__BODY_MEM_REGISTER && q->mem_register->fd_count == 1) {
            int fd = ovl_fdq_pop(&c->fdq);
            if (fd < 0) {
                conn_fail(c, id, OVL_ERR_PROTOCOL,
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
        bool open = send_error(c, id, chk, "%s%s", what, why);
        ovl__request__free_unpacked(q, NULL);
        return open;
    }
    switch (q->body_case) {
    case OVL__REQUEST__BODY_HELLO:
        on_hello(c, id, q->hello);
        break;
    case OVL__REQUEST__BODY_STATUS:
        on_status(c, id);
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
    case OVL__REQUEST__BODY_AG_GEMM:
        on_ag_gemm(c, q->ag_gemm, chk, why);
        break;
    case OVL__REQUEST__BODY_PLAN:
        on_plan(c, id, q->plan);
        break;
    case OVL__REQUEST__BODY_STATS:
        on_stats(c, id, q->stats);
        break;
    default:
        conn_fail(c, id, OVL_ERR_PROTOCOL, "unknown request");
        break;
    }
    bool open = !c->closing;
    ovl__request__free_unpacked(q, NULL);
    return open;
}

/* --------------------------------------------------------- connections */

static void on_conn_closed(uv_handle_t *h)
{
    ovld_conn_t *c = h->data;
    close(c->fd);
    c->closed = true;
    if (c->refs == 0)
        free(c);
}

/* A work item is done with the connection. */
static void conn_put(ovld_conn_t *c)
{
    if (--c->refs == 0 && c->closed)
        free(c);
}

static void drop_reg(ovld_reg_t *reg, void *arg)
{
    ovld_conn_t *c = arg;
    if (reg->on_idle) { /* a deregistration waiting for ops: nobody to answer now */
        if (reg->idle_posted)
            idle_unlink(c->d, reg);
        free(reg->idle_arg);
        reg->on_idle = NULL;
        reg->idle_arg = NULL;
        c->busy = false;
        c->refs--;
    }
    reg_drop(c->d, c, reg);
}

void ovld_conn_close(ovld_conn_t *c, const char *why)
{
    if (c->closing)
        return;
    ovld_t *d = c->d;
    c->closing = true;
    log_debug("client %" PRIu64 " (pid %d): closed: %s", c->id, (int)c->pid, why);
    while (c->members)
        ovld_job_leave(d, c->members, "its client closed the connection");
    ovld_registry_foreach(&c->reg, drop_reg, c);
    ovld_registry_fini(&c->reg);
    ovl_fdq_close_all(&c->fdq);
    ovl_wire_reader_free(&c->rd);
    ovl_wire_out_free(&c->out);
    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->nconns--;
    uv_poll_stop(&c->poll);
    uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

static void on_conn_io(uv_poll_t *h, int status, int events)
{
    ovld_conn_t *c = h->data;
    if (status < 0) {
        ovld_conn_close(c, uv_strerror(status));
        return;
    }
    if (events & UV_WRITABLE) {
        ovl_status_t st = ovl_wire_flush(c->fd, &c->out);
        if (st != OVL_OK && st != OVL_ERR_AGAIN) {
            ovld_conn_close(c, "write failed");
            return;
        }
        conn_update_poll(c);
    }
    if (!(events & (UV_READABLE | UV_DISCONNECT)))
        return;
    /* One recvmsg per wakeup: poll is level-triggered, so the rest comes on
     * the next round, and one busy client cannot starve the others. */
    size_t n = 0;
    ovl_status_t st = ovl_wire_recv(c->fd, &c->rd, &c->fdq, &n);
    if (st == OVL_ERR_AGAIN)
        return;
    if (st == OVL_ERR_CLOSED) {
        ovld_conn_close(c, "client closed the connection");
        return;
    }
    if (st == OVL_ERR_LIMIT && c->rd.fd_overflow) {
        char what[160];
        snprintf(what, sizeof(what),
                 "more than %u file descriptors were passed ahead of the requests that take "
                 "them (at most %u may wait)",
                 OVL_WIRE_MAX_FDS, OVL_WIRE_MAX_FDS);
        conn_fail(c, 0, OVL_ERR_LIMIT, what);
        return;
    }
    if (st == OVL_ERR_LIMIT && c->rd.failed == OVL_ERR_LIMIT) {
        char what[128];
        snprintf(what, sizeof(what), "frame larger than max_frame_bytes (%u)",
                 c->d->cfg.max_frame_bytes);
        conn_fail(c, 0, OVL_ERR_LIMIT, what);
        return;
    }
    if (st != OVL_OK) {
        char what[128];
        snprintf(what, sizeof(what), "receive failed: %s%s%s", ovl_strerror(st),
                 st == OVL_ERR_SYSTEM ? ": " : "", st == OVL_ERR_SYSTEM ? strerror(errno) : "");
        conn_fail(c, 0, st == OVL_ERR_LIMIT ? OVL_ERR_LIMIT : OVL_ERR_PROTOCOL, what);
        return;
    }
    process_frames(c);
}

/* Handles the frames received, in order, until none is complete, the
 * connection closes or a request goes off the loop (busy). */
static void process_frames(ovld_conn_t *c)
{
    while (!c->closing && !c->busy) {
        const uint8_t *body;
        uint32_t len;
        ovl_status_t st = ovl_wire_reader_next(&c->rd, &body, &len);
        if (st == OVL_ERR_AGAIN)
            return;
        if (st == OVL_ERR_LIMIT) {
            char what[128];
            snprintf(what, sizeof(what), "frame larger than max_frame_bytes (%u)",
                     c->d->cfg.max_frame_bytes);
            conn_fail(c, 0, OVL_ERR_LIMIT, what);
            return;
        }
        if (st != OVL_OK) {
            conn_fail(c, 0, OVL_ERR_PROTOCOL, "bad frame header (magic)");
            return;
        }
        if (!handle_frame(c, body, len))
            return;
    }
}

static void conn_update_poll(ovld_conn_t *c)
{
    if (c->closing)
        return;
    /* While a request is served off the loop, later ones wait unread; a
     * client that hangs up is still noticed. */
    int ev = c->busy ? UV_DISCONNECT : UV_READABLE | UV_DISCONNECT;
    if (ovl_wire_out_pending(&c->out) > 0)
        ev |= UV_WRITABLE;
    if (ev != c->poll_events) {
        c->poll_events = ev;
        int e = ev ? uv_poll_start(&c->poll, ev, on_conn_io) : uv_poll_stop(&c->poll);
        if (e != 0) { /* unwatched, it would hang its client: close it */
            log_error("client %" PRIu64 " (pid %d): uv_poll_start: %s", c->id, (int)c->pid,
                      uv_strerror(e));
            ovld_conn_close(c, "cannot watch the connection");
        }
    }
}

/* Answers a connection that is refused at once with an Error, and closes it. */
static void refuse_conn(int fd, ovl_status_t status, const char *msg)
{
    ovl_wire_out_t o;
    ovl_wire_out_init(&o);
    Ovl__Error e = OVL__ERROR__INIT;
    e.status = status;
    e.message = (char *)msg;
    Ovl__Response r = OVL__RESPONSE__INIT;
    r.body_case = OVL__RESPONSE__BODY_ERROR;
    r.error = &e;
    if (ovl_wire_out_append(&o, &r.base, 0, NULL, 0) == OVL_OK)
        (void)ovl_wire_flush(fd, &o);
    ovl_wire_out_free(&o);
    close(fd);
}

static void on_accept(uv_poll_t *h, int status, int events);

static void on_accept_resume(uv_timer_t *t)
{
    ovld_t *d = t->data;
    if (!d->listening || !d->listen_paused)
        return;
    d->listen_paused = false;
    int rc = uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
    if (rc != 0)
        log_error("listening socket: uv_poll_start: %s", uv_strerror(rc));
}

/* Out of descriptors (EMFILE/ENFILE). Accepting nothing would leave the
 * socket readable and the loop spinning, so: close the spare descriptor,
 * accept the connection and close it at once (its client sees the
 * connection closed, with an Error if one fits), then take the spare again
 * (libuv's idiom). Without a spare, stop watching the socket for a moment.
 * Logged once an episode, at its start and its end. */
static void accept_starved(ovld_t *d, int err)
{
    if (!d->fd_starved) {
        d->fd_starved = true;
        d->fd_refused = 0;
        log_error("accept: %s: refusing connections until ovld has descriptors again "
                  "(LimitNOFILE, or clients holding too many connections)",
                  strerror(err));
    }
    if (d->spare_fd >= 0) {
        close(d->spare_fd);
        d->spare_fd = -1;
        int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            d->fd_refused++;
            OVLD_COUNT(&d->counters, conns_refused, 1);
            refuse_conn(fd, OVL_ERR_LIMIT, "ovld is out of file descriptors");
        }
        d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (d->spare_fd >= 0)
            return;
    }
    if (!d->listen_paused) {
        d->listen_paused = true;
        uv_poll_stop(&d->listen_poll);
        uv_timer_start(&d->accept_timer, on_accept_resume, 100, 0);
    }
}

/* Closes the connections whose Hello is overdue, and arms the timer for the
 * next deadline. */
static void on_hello_timer(uv_timer_t *t)
{
    ovld_t *d = t->data;
    uint64_t now = uv_now(d->loop), next = 0;
    ovld_conn_t *c = d->conns;
    while (c) {
        ovld_conn_t *k = c;
        c = c->next;
        if (k->hello_done || k->closing)
            continue;
        if (k->hello_deadline <= now) {
            char what[96];
            snprintf(what, sizeof(what), "no Hello within %u ms (hello_timeout_ms)",
                     d->cfg.hello_timeout_ms);
            conn_fail(k, 0, OVL_ERR_TIMEOUT, what);
        } else if (!next || k->hello_deadline < next) {
            next = k->hello_deadline;
        }
    }
    if (next)
        uv_timer_start(&d->hello_timer, on_hello_timer, next - now, 0);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    ovld_t *d = h->data;
    (void)events;
    if (status < 0) {
        log_error("listening socket: %s", uv_strerror(status));
        return;
    }
    int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
            accept_starved(d, e);
        else if (e != EAGAIN && e != EINTR && e != ECONNABORTED)
            log_error("accept: %s", strerror(e));
        return;
    }
    if (d->fd_starved) {
        d->fd_starved = false;
        log_warn("accepting connections again (%" PRIu64 " refused for want of descriptors)",
                 d->fd_refused);
    }
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0) {
        log_error("SO_PEERCRED: %s", strerror(errno));
        close(fd);
        return;
    }
    uid_usage_t u;
    uid_usage(d, uc.uid, &u, NULL);
    char why[160] = "";
    ovl_status_t refuse = OVL_OK;
    if (d->stopping) {
        refuse = OVL_ERR_SHUTDOWN;
        snprintf(why, sizeof(why), "ovld is shutting down");
    } else if (d->nconns >= d->cfg.max_connections) {
        refuse = OVL_ERR_LIMIT;
        snprintf(why, sizeof(why), "too many connections (max_connections = %u)",
                 d->cfg.max_connections);
    } else if (u.conns >= d->cfg.max_connections_per_uid) {
        refuse = OVL_ERR_LIMIT;
        snprintf(why, sizeof(why),
                 "too many connections: uid %u has %u (max_connections_per_uid = %u)",
                 (unsigned)uc.uid, u.conns, d->cfg.max_connections_per_uid);
    }
    if (refuse != OVL_OK) {
        OVLD_COUNT(&d->counters, conns_refused, 1);
        log_warn("refused a connection from pid %d, uid %u: %s", (int)uc.pid, (unsigned)uc.uid,
                 why);
        refuse_conn(fd, refuse, why);
        return;
    }
    ovld_conn_t *c = calloc(1, sizeof(*c));
    if (!c || ovld_registry_init(&c->reg) != OVL_OK) {
        free(c);
        log_error("out of memory accepting a connection");
        close(fd);
        return;
    }
    c->d = d;
    c->fd = fd;
    c->id = ++d->next_conn_id;
    c->pid = uc.pid;
    c->uid = uc.uid;
    c->gid = uc.gid;
    snprintf(c->name, sizeof(c->name), "pid %d", (int)uc.pid);
    ovl_wire_reader_init(&c->rd, d->cfg.max_frame_bytes);
    ovl_fdq_init(&c->fdq);
    ovl_wire_out_init(&c->out);
    int rc = uv_poll_init(d->loop, &c->poll, fd);
    if (rc != 0) {
        log_error("uv_poll_init: %s", uv_strerror(rc));
        ovld_registry_fini(&c->reg);
        ovl_wire_reader_free(&c->rd);
        free(c);
        close(fd);
        return;
    }
    c->poll.data = c;
    c->hello_deadline = uv_now(d->loop) + d->cfg.hello_timeout_ms;
    if (!uv_is_active((uv_handle_t *)&d->hello_timer) ||
        uv_timer_get_due_in(&d->hello_timer) > d->cfg.hello_timeout_ms)
        uv_timer_start(&d->hello_timer, on_hello_timer, d->cfg.hello_timeout_ms, 0);
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    OVLD_COUNT(&d->counters, conns_accepted, 1);
    c->poll_events = 0;
    conn_update_poll(c);
    log_debug("client %" PRIu64 ": connected (pid %d, uid %u, gid %u)", c->id, (int)c->pid,
              (unsigned)c->uid, (unsigned)c->gid);
}

/* ------------------------------------------------------------ listening */

/* Binds a fresh socket at path. A stale socket file is replaced; a live one
 * (another ovld answering) or any other file is an error. */
static ovl_status_t bind_socket(ovld_t *d, char *err, size_t errlen)
{
    const char *path = d->cfg.socket_path;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "socket path too long: %s", path);
        return OVL_ERR_CONFIG;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "%s exists and is not a socket", path);
            return OVL_ERR_EXISTS;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            close(probe);
            snprintf(err, errlen, "another daemon is listening on %s", path);
            return OVL_ERR_EXISTS;
        }
        if (probe >= 0)
            close(probe);
        if (unlink(path) != 0) {
            snprintf(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(errno));
            return OVL_ERR_SYSTEM;
        }
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return OVL_ERR_SYSTEM;
    }
    /* Create it with no access, then open it up: no window where others
     * could connect with looser permissions. */
    mode_t old = umask(0777);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int bind_errno = errno;
    umask(old);
    if (rc != 0) {
        snprintf(err, errlen, "bind %s: %s", path, strerror(bind_errno));
        close(fd);
        return OVL_ERR_SYSTEM;
    }
    if (d->cfg.socket_group[0]) {
        struct group *g = getgrnam(d->cfg.socket_group);
        if (!g) {
            snprintf(err, errlen, "socket_group '%s' does not exist", d->cfg.socket_group);
            goto fail;
        }
        if (chown(path, (uid_t)-1, g->gr_gid) != 0) {
            snprintf(err, errlen, "chown %s to group %s: %s", path, d->cfg.socket_group,
                     strerror(errno));
            goto fail;
        }
    }
    if (chmod(path, d->cfg.socket_mode) != 0) {
        snprintf(err, errlen, "chmod %s: %s", path, strerror(errno));
        goto fail;
    }
    if (listen(fd, 128) != 0) {
        snprintf(err, errlen, "listen %s: %s", path, strerror(errno));
        goto fail;
    }
    d->listen_fd = fd;
    d->listen_owned = true;
    return OVL_OK;
fail:
    close(fd);
    unlink(path);
    return OVL_ERR_SYSTEM;
}

ovl_status_t ovld_server_start(ovld_t *d, char *err, size_t errlen)
{
    int fd = -1;
    ovl_status_t st = ovld_sd_listen_fd(&fd, err, errlen);
    if (st != OVL_OK)
        return st;
    if (fd >= 0) {
        d->listen_fd = fd;
        d->listen_owned = false;
        /* Report the path systemd listens on, not the configured one. */
        struct sockaddr_un sa;
        socklen_t sl = sizeof(sa);
        if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sun_family == AF_UNIX &&
            sl > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] != '\0') {
            size_t n = sl - offsetof(struct sockaddr_un, sun_path);
            if (n >= sizeof(d->cfg.socket_path))
                n = sizeof(d->cfg.socket_path) - 1;
            memcpy(d->cfg.socket_path, sa.sun_path, n);
            d->cfg.socket_path[n] = '\0';
        }
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
            snprintf(err, errlen, "socket from systemd: fcntl: %s", strerror(errno));
            return OVL_ERR_SYSTEM;
        }
        log_info("listening on %s, passed by systemd", d->cfg.socket_path);
    } else {
        st = bind_socket(d, err, errlen);
        if (st != OVL_OK)
            return st;
        log_info("listening on %s", d->cfg.socket_path);
    }
    ovld_server_apply_config(d);
    d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (d->spare_fd < 0)
        log_warn("cannot open a spare descriptor: %s", strerror(errno));
    int rc = uv_timer_init(d->loop, &d->accept_timer);
    if (rc == 0)
        rc = uv_timer_init(d->loop, &d->hello_timer);
    if (rc == 0)
        rc = uv_check_init(d->loop, &d->idle_check);
    if (rc == 0) {
        d->idle_check.data = d;
        rc = uv_check_start(&d->idle_check, on_idle_check);
        uv_unref((uv_handle_t *)&d->idle_check); /* it keeps no loop alive */
    }
    if (rc == 0)
        rc = uv_poll_init(d->loop, &d->listen_poll, d->listen_fd);
    if (rc == 0)
        rc = uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
    if (rc != 0) {
        snprintf(err, errlen, "uv_poll on the socket: %s", uv_strerror(rc));
        return OVL_ERR_SYSTEM;
    }
    d->accept_timer.data = d;
    d->hello_timer.data = d;
    d->listen_poll.data = d;
    d->listening = true;
    d->self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (d->self_pidfd < 0)
        log_warn("pidfd_open: %s: clients will not see when ovld exits, and give it up as soon "
                 "as its connection closes",
                 strerror(errno));
    return OVL_OK;
}

static void on_listen_closed(uv_handle_t *h)
{
    ovld_t *d = h->data;
    close(d->listen_fd);
    d->listen_fd = -1;
}

void ovld_server_apply_config(ovld_t *d)
{
    d->max_mappings = d->cfg.max_mappings;
    if (d->max_mappings != OVLD_MAX_MAPPINGS_AUTO)
        return;
    /* Half of the kernel's limit: the rest is ovld's own (libraries,
     * thread stacks, malloc arenas, CUDA's mappings). */
    unsigned long max = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "re");
    if (f) {
        if (fscanf(f, "%lu", &max) != 1)
            max = 65530;
        fclose(f);
    }
    max /= 2;
    d->max_mappings = max < 1 ? 1 : max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
}

void ovld_server_close(ovld_t *d)
{
    if (uv_is_closing((uv_handle_t *)&d->idle_check) || !d->idle_check.loop)
        return;
    uv_check_stop(&d->idle_check);
    uv_close((uv_handle_t *)&d->idle_check, NULL);
}

void ovld_server_stop_listening(ovld_t *d)
{
    if (!d->listening)
        return;
    d->listening = false;
    uv_poll_stop(&d->listen_poll);
    uv_close((uv_handle_t *)&d->listen_poll, on_listen_closed);
    uv_timer_stop(&d->accept_timer);
    uv_close((uv_handle_t *)&d->accept_timer, NULL);
    uv_timer_stop(&d->hello_timer);
    uv_close((uv_handle_t *)&d->hello_timer, NULL);
    if (d->spare_fd >= 0) {
        close(d->spare_fd);
        d->spare_fd = -1;
    }
    if (d->listen_owned && unlink(d->cfg.socket_path) != 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", d->cfg.socket_path, strerror(errno));
}

/*
 * job.c: jobs and their ranks (job.h): joining, setting up what the ranks
 * share, leaving, and the end of a job. The op queue of a job is opq.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_internal.h"
#include "log.h"
#include "xfer.h"

void ovld_jobs_init(ovld_jobs_t *js, ovld_backend_t *backend, const ovld_config_t *cfg,
                    ovld_counters_t *counters, ovld_exec_pool_t *pool, ovld_issuer_t *issuer,
                    ovld_buffers_t *buffers)
{
    *js = (ovld_jobs_t){.backend = backend,
                        .cfg = cfg,
                        .counters = counters,
                        .pool = pool,
                        .issuer = issuer,
                        .buffers = buffers};
}

bool ovld_jobs_empty(const ovld_jobs_t *js)
{
    return !js->live && !js->dead;
}

/* The live job a join names: by owner and id, or across nodes by nonce
 * (whose coordinator checks the owner). */
static ovld_job_t *job_find(ovld_jobs_t *js, const ovld_join_desc_t *req)
{
    for (ovld_job_t *j = js->live; j; j = j->next) {
        if (j->across != req->across)
            continue;
        if (j->across ? memcmp(j->nonce, req->blob.nonce, OVLD_JOB_NONCE_LEN) == 0
                      : j->owner == req->uid && strcmp(j->id, req->job_id) == 0)
            return j;
    }
    return NULL;
}

static ovld_job_t *job_find_nonce(ovld_jobs_t *js, const uint8_t *nonce)
{
    for (ovld_job_t *j = js->live; j; j = j->next)
        if (j->across && memcmp(j->nonce, nonce, OVLD_JOB_NONCE_LEN) == 0)
            return j;
    return NULL;
}

/* ------------------------------------------------------------------ join */

typedef struct setup_ctx {
    ovld_jobs_t *js;
    ovld_job_t *j;
} setup_ctx_t;

static void on_setup(void *arg, ovl_status_t st, const char *msg)
{
    setup_ctx_t *sc = arg;
    ovld_jobs_t *js = sc->js;
    ovld_job_t *j = sc->j;
    free(sc);
    j->setup_pending = false;
    if (st != OVL_OK && j->across) {
        /* the other nodes would wait for this one's ops for ever */
        char why[300];
        snprintf(why, sizeof(why), "backend setup failed on node %u: %s", j->self_node, msg);
        j->pins++; /* abort_across may free it: not before this function is done */
        ovld_job_abort_across(js, j, st, why, true);
        j->pins--;
    } else if (st != OVL_OK) {
        j->state = OVLD_JOB_ABORTED;
        snprintf(j->last_error, sizeof(j->last_error), "backend setup failed: %s", msg);
        log_error("job '%s': %s", j->id, j->last_error);
    } else if (j->state == OVLD_JOB_SETUP) {
        j->state = OVLD_JOB_READY;
        log_info("job '%s': ready", j->id);
    }
    ovld_opq_progress(js, j);
    ovld_job_maybe_free(js, j);
}

/* Every rank is in (net: a job across nodes, whose ranks here are in):
 * let the backend prepare what the ranks share. */
static void job_start(ovld_jobs_t *js, ovld_job_t *j, ovld_job_net_t *net)
{
    /* Ranks of a job may share a device (several ranks on one GPU): NCCL
     * cannot make their communicator, so the plans gather by the copy
     * engine (plan.h, shared_gpu) and the backend makes none. */
    for (uint32_t r = 0; r < j->world && !j->shared_gpu; r++)
        for (uint32_t q = 0; q < r && j->members[r]; q++)
            if (j->members[q] && j->members[q]->device == j->members[r]->device) {
                j->shared_gpu = true;
                break;
            }
    if (!js->backend->ops->job_setup) {
        j->state = OVLD_JOB_READY;
        return;
    }
    uint32_t n = 0;
    ovld_rank_t **ranks = calloc(j->world, sizeof(*ranks));
    uint32_t *global = calloc(j->world, sizeof(*global));
    setup_ctx_t *sc = calloc(1, sizeof(*sc));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (ranks && global && sc) {
        for (uint32_t r = 0; r < j->world; r++)
            if (j->members[r]) {
                global[n] = r;
                ranks[n++] = j->members[r]->brank;
            }
        if (net)
            net->global = global;
        sc->js = js;
        sc->j = j;
        j->state = OVLD_JOB_SETUP;
        j->setup_pending = true;
        st = js->backend->ops->job_setup(js->backend, ranks, n, net, !j->shared_gpu, on_setup, sc);
    }
    free(ranks);
    free(global);
    if (st != OVL_OK) {
        free(sc);
        j->setup_pending = false;
        j->state = OVLD_JOB_ABORTED;
        snprintf(j->last_error, sizeof(j->last_error), "backend setup failed: %s",
                 ovl_strerror(st));
        log_error("job '%s': %s", j->id, j->last_error);
    }
}

/* The ranks joined in uid's jobs, those still completing included. */
static uint32_t uid_ranks(const ovld_jobs_t *js, uid_t uid)
{
    uint32_t n = 0;
    for (const ovld_job_t *j = js->live; j; j = j->next)
        n += j->owner == uid ? j->joined : 0;
    for (const ovld_job_t *j = js->dead; j; j = j->next)
        n += j->owner == uid ? j->joined : 0;
    return n;
}

/* What a join would refuse before anything is made; *ret_j the job it
 * joins (NULL: a new one), *ret_dev the device. */
static ovl_status_t join_check(ovld_jobs_t *js, const ovld_join_desc_t *req, ovld_job_t **ret_j,
                               uint32_t *ret_dev, char *err, size_t errlen)
{
    /* The boundary checked the forms and ranges (request.h): the id is
     * 1..OVLD_JOB_ID_MAX bytes of clean text, rank < world <= the planner's
     * limit. */
    const char *id = req->job_id;
    size_t idlen = strlen(id);
    uint32_t world = req->world, rank = req->rank;
    if (idlen == 0 || idlen > OVLD_JOB_ID_MAX || world == 0 || world > OVL_PLAN_MAX_WORLD ||
        rank >= world) {
        snprintf(err, errlen, "internal error: CommInit not checked at the boundary");
        return OVL_ERR_INTERNAL;
    }
    int found = ovld_backend_device_by_uuid(js->backend, req->device_uuid, OVLD_UUID_LEN);
    if (found < 0) {
        char u[64];
        ovld_uuid_format(req->device_uuid, "", u, sizeof(u));
        snprintf(err, errlen, "no device with UUID %s on this node", u);
        return OVL_ERR_NOT_FOUND;
    }
    uint32_t dev = (uint32_t)found;

    /* Ranks hold device resources (streams, events, workspaces): a user's
     * are bounded, those of its jobs still completing included. */
    uint32_t ranks = uid_ranks(js, req->uid);
    if (ranks >= js->cfg->max_ranks_per_uid) {
        snprintf(err, errlen, "uid %u holds %u ranks (max_ranks_per_uid = %u)", (unsigned)req->uid,
                 ranks, js->cfg->max_ranks_per_uid);
        return OVL_ERR_LIMIT;
    }
    /* Job ids are a namespace of each uid: another user's "train" is
     * another job, so that nobody can claim an id before its owner does. */
    ovld_job_t *j = job_find(js, req);
    *ret_j = j;
    *ret_dev = dev;
    if (j) {
        /* A job across nodes is found by its nonce, whoever asks: its
         * owner is checked first, before anything about it (its world,
         * state, the pids of its ranks) is said to another user. */
        if (j->owner != req->uid) {
            snprintf(err, errlen,
                     "job '%s' belongs to another user: only the uid that made a job may join it",
                     id);
            return OVL_ERR_PERMISSION;
        }
        if (j->world != world) {
            snprintf(err, errlen, "job '%s' has world %u, not %u", id, j->world, world);
            return OVL_ERR_MISMATCH;
        }
        if (j->state == OVLD_JOB_ABORTED || j->state == OVLD_JOB_ENDING) {
            snprintf(err, errlen, "job '%s' is %s (%s); it ends when its ranks leave", id,
                     ovld_job_state_name(j->state), j->last_error);
            return OVL_ERR_ABORTED;
        }
        if (j->members[rank]) {
            snprintf(err, errlen, "rank %u of job '%s' already joined (pid %d)", rank, id,
                     (int)j->members[rank]->pid);
            return OVL_ERR_EXISTS;
        }
    } else {
        if (js->njobs >= js->cfg->max_jobs) {
            snprintf(err, errlen, "too many jobs (max_jobs = %u)", js->cfg->max_jobs);
            return OVL_ERR_LIMIT;
        }
        uint32_t mine = 0;
        for (ovld_job_t *o = js->live; o; o = o->next)
            mine += o->owner == req->uid;
        if (mine >= js->cfg->max_jobs_per_uid) {
            snprintf(err, errlen, "uid %u has %u jobs (max_jobs_per_uid = %u)", (unsigned)req->uid,
                     mine, js->cfg->max_jobs_per_uid);
            return OVL_ERR_LIMIT;
        }
    }
    return OVL_OK;
}

ovl_status_t ovld_job_join_check(ovld_jobs_t *js, const ovld_join_desc_t *req, uint32_t *ret_dev,
                                 char *err, size_t errlen)
{
    ovld_job_t *j;
    return join_check(js, req, &j, ret_dev, err, errlen);
}

ovl_status_t ovld_job_join(ovld_jobs_t *js, const ovld_join_desc_t *req, ovld_member_t **ret_member,
                           ovld_doorbell_export_t *ret_db, char *err, size_t errlen)
{
    ovld_job_t *j;
    uint32_t dev, world = req->world, rank = req->rank;
    ovl_status_t st = join_check(js, req, &j, &dev, err, errlen);
    if (st != OVL_OK)
        return st;
    const char *id = req->job_id;
    size_t idlen = strlen(id);
    bool created = false;
    if (!j) {
        j = calloc(1, sizeof(*j));
        if (!j || !(j->members = calloc(world, sizeof(*j->members))) ||
            ovld_lane_new(js->issuer, j, &j->lane) != OVL_OK) {
            if (j)
                free(j->members);
            free(j);
            snprintf(err, errlen, "out of memory");
            return OVL_ERR_NOMEM;
        }
        memcpy(j->id, id, idlen + 1);
        if (js->cfg->replay_cache > 0 && js->backend->ops->graph_run)
            j->replay = ovld_replay_create(js->backend, js->cfg->replay_cache); /* NULL: none */
        j->plans = ovld_plancache_create(js->cfg->replay_cache);                /* NULL: none */
        j->owner = req->uid;
        j->across = req->across;
        if (req->across)
            memcpy(j->nonce, req->blob.nonce, OVLD_JOB_NONCE_LEN);
        j->world = world;
        j->state = OVLD_JOB_FORMING;
        j->next = js->live;
        js->live = j;
        js->njobs++;
        created = true;
    }

    ovld_member_t *m = calloc(1, sizeof(*m));
    st = OVL_ERR_NOMEM;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    m->job = j;
    m->attached = true;
    m->pid = req->pid;
    m->rank = rank;
    m->device = dev;
    m->next_seq = 1;
    m->window = js->cfg->max_ops_in_flight;
    errno = 0;
    char why[160] = "";
    st = js->backend->ops->rank_create(js->backend, dev, &m->brank, ret_db, why, sizeof(why));
    if (st != OVL_OK) {
        /* The backend's words say why; without them, a system call's errno
         * (ENOMEM from mmap: the process is out of memory maps) */
        int e = errno;
        snprintf(err, errlen, "device %u: cannot set up the rank: %s%s%s%s", dev,
                 why[0] ? why : ovl_strerror(st), st == OVL_ERR_SYSTEM && e && !why[0] ? ": " : "",
                 st == OVL_ERR_SYSTEM && e && !why[0] ? strerror(e) : "",
                 st == OVL_ERR_SYSTEM && e == ENOMEM
                     ? " (out of memory maps? see vm.max_map_count and max_mappings)"
                     : "");
        free(m);
        goto fail;
    }
    m->comm_id = ++js->next_comm_id;
    ovld_lane_add_device(j->lane, dev);
    j->members[rank] = m;
    j->joined++;
    if (j->joined == j->world && !j->across)
        job_start(js, j, NULL); /* a job across nodes starts when its coordinator says so */
    log_info("job '%s': rank %u/%u joined on device %u (pid %d, uid %u)%s", j->id, m->rank,
             j->world, dev, (int)req->pid, (unsigned)req->uid,
             j->state == OVLD_JOB_READY ? "; all ranks in" : "");
    *ret_member = m;
    return OVL_OK;
fail:
    if (created)
        ovld_job_free(js, j);
    return st;
}

uint64_t ovld_member_comm_id(const ovld_member_t *m)
{
    return m->comm_id;
}

uint32_t ovld_member_rank(const ovld_member_t *m)
{
    return m->rank;
}

uint32_t ovld_member_device(const ovld_member_t *m)
{
    return m->device;
}

uint32_t ovld_member_world(const ovld_member_t *m)
{
    return m->job->world;
}

const char *ovld_member_job_id(const ovld_member_t *m)
{
    return m->job->id;
}

void ovld_jobs_foreach(const ovld_jobs_t *js, void (*fn)(const ovld_job_info_t *info, void *arg),
                       void *arg)
{
    for (const ovld_job_t *j = js->live; j; j = j->next) {
        int32_t devs[OVL_PLAN_MAX_WORLD];
        for (uint32_t r = 0; r < j->world; r++)
            devs[r] = j->members[r] ? (int32_t)j->members[r]->device : -1;
        const char *const *nodes = NULL;
        uint32_t nnodes = j->across ? js->across.job_nodes(js->across.ctx, j->nonce, &nodes) : 0;
        ovld_job_info_t info = {.rank_devices = devs,
                                .nnodes = nnodes,
                                .self_node = j->self_node,
                                .nodes = nodes,
                                .id = j->id,
                                .owner = j->owner,
                                .world = j->world,
                                .joined = j->joined,
                                .state = j->state,
                                .ops_done = j->ops_done,
                                .in_flight = j->in_flight,
                                .last_error = j->last_error};
        fn(&info, arg);
    }
}

/* A rank of a job across nodes leaves before the job started: its place is
 * free again, here and at the coordinator, and the job forms on. */
static void leave_forming(ovld_jobs_t *js, ovld_member_t *m, const char *why)
{
    ovld_job_t *j = m->job;
    log_info("job '%s': rank %u left before the job started (%s)", j->id, m->rank, why);
    js->across.leave(js->across.ctx, j->nonce, m->rank, false, why);
    j->members[m->rank] = NULL;
    j->joined--;
    bool dev_used = false; /* by another of the job's ranks */
    for (uint32_t r = 0; r < j->world && !dev_used; r++)
        dev_used = j->members[r] && j->members[r]->device == m->device;
    if (!dev_used) /* the device is not the job's any more: no gate, no hold */
        ovld_lane_remove_device(j->lane, m->device);
    js->backend->ops->rank_destroy(js->backend, m->brank);
    free(m);
    ovld_job_maybe_free(js, j);
}

void ovld_job_leave(ovld_jobs_t *js, ovld_member_t *m, const char *why)
{
    ovld_job_t *j = m->job;
    if (j->across && !j->started && j->state == OVLD_JOB_FORMING && !ovld_opq_pending(j)) {
        leave_forming(js, m, why);
        return;
    }
    m->attached = false;
    /* Its client will never say ready for ops already issued: let them run
     * (on whatever its buffers hold) so that they complete and peers are
     * not left waiting in a collective. Whether or not any are issued: the
     * release also ends what the client's own stream may still wait for
     * (a dying process's stream can hold the GPU up). */
    if (js->backend->ops->rank_release)
        js->backend->ops->rank_release(js->backend, m->brank, m->next_seq - 1);
    bool others = ovld_job_has_clients(j); /* m is detached by now */
    bool pending = ovld_opq_pending(j);
    if (j->across) /* the other nodes end (or abort) the job too */
        js->across.leave(js->across.ctx, j->nonce, m->rank, pending, why);
    bool live =
        j->state == OVLD_JOB_FORMING || j->state == OVLD_JOB_SETUP || j->state == OVLD_JOB_READY;
    if (others && !pending && live) {
        /* A rank that leaves with nothing pending ends the job quietly; ops
         * submitted after this fail, since the rank will not take part. */
        char msg[200];
        snprintf(msg, sizeof(msg), "rank %u left the job (%s)", m->rank, why);
        ovld_job_end(j, OVLD_JOB_ENDING, msg);
        log_info("job '%s': rank %u left (%s); the job takes no more ops", j->id, m->rank, why);
    } else if (pending && j->state != OVLD_JOB_ABORTED) {
        /* Nobody else may be connected: the pending ops still fail, so that
         * they do not hold the job, its rank and their buffers for ever. */
        char msg[200];
        snprintf(msg, sizeof(msg), "rank %u left the job (%s)", m->rank, why);
        ovld_job_end(j, OVLD_JOB_ABORTED, msg);
        log_warn("job '%s': aborted: rank %u left (%s) with ops pending", j->id, m->rank, why);
        snprintf(msg, sizeof(msg), "job aborted: rank %u left (%s)", m->rank, why);
        ovld_opq_fail_waiting(j, OVL_ERR_ABORTED, msg);
        ovld_opq_progress(js, j);
    } else {
        log_info("job '%s': rank %u left (%s)", j->id, m->rank, why);
    }
    ovld_job_maybe_free(js, j);
}

/* The job takes no more ops: those waiting fail with status and
 * "<what>: <why>", and the job goes once nothing holds it. */
bool ovld_jobs_owner_busy(void *owner)
{
    const ovld_job_t *j = owner;
    return j->in_flight > 0 || ovld_opq_pending(j);
}

void ovld_jobs_on_hold(void *arg, void *owner, uint64_t seq, uint64_t held_ms)
{
    ovld_jobs_t *js = arg;
    ovld_job_t *j = owner;
    char why[256];
    snprintf(why, sizeof(why),
             "op %" PRIu64 " waited %" PRIu64 " ms for its clients' doorbells on a GPU that "
             "another job shares, holding that job's work up (hold_limit_ms is %u)",
             seq, held_ms, js->cfg->hold_limit_ms);
    /* What its clients see: the error word (the op's own done says OK),
     * and CommCheck's words. Then the waits end: the op runs on what its
     * buffers hold, and the client's stream goes on. */
    for (uint32_t r = 0; r < j->world; r++) {
        ovld_member_t *m = j->members[r];
        if (!m)
            continue;
        ovld_member_fail(m, seq, OVL_ERR_LIMIT, why);
        if (js->backend->ops->rank_fail)
            js->backend->ops->rank_fail(js->backend, m->brank, seq, OVL_ERR_LIMIT);
        if (js->backend->ops->rank_release)
            js->backend->ops->rank_release(js->backend, m->brank, m->next_seq - 1);
    }
    if (j->across) {
        ovld_job_abort_across(js, j, OVL_ERR_LIMIT, why, true);
        return;
    }
    if (j->state != OVLD_JOB_ABORTED) {
        ovld_job_end(j, OVLD_JOB_ABORTED, why);
        log_warn("job '%s': aborted: %s", j->id, why);
    }
    ovld_job_fail_rest(js, j, OVL_ERR_LIMIT, "job aborted", why);
}

/* ------------------------------------------------------ across nodes */

void ovld_jobs_on_start(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN],
                        const ovld_cluster_start_t *s)
{
    ovld_jobs_t *js = arg;
    ovld_job_t *j = job_find_nonce(js, nonce);
    if (!j) {
        /* every rank of it left here meanwhile (the coordinator hears it) */
        if (s->xfer)
            ovld_xfer_job_release(s->xfer);
        return;
    }
    j->xfer = s->xfer;
    char why[200] = "";
    /* The coordinator admitted exactly the ranks that joined here. */
    uint32_t nlocal = 0;
    for (uint32_t q = 0; q < j->world && !why[0]; q++) {
        bool mine = s->world == j->world && s->node_of[q] == s->self_node;
        if (mine != (j->members[q] != NULL))
            snprintf(why, sizeof(why),
                     "the coordinator's start %s rank %u on this node, which %s it",
                     mine ? "places" : "does not place", q, mine ? "does not have" : "has");
        nlocal += mine;
    }
    if (!why[0] && !(j->node_of = malloc(j->world * sizeof(*j->node_of))))
        snprintf(why, sizeof(why), "out of memory");
    if (why[0] || j->state != OVLD_JOB_FORMING) {
        ovld_job_abort_across(js, j, OVL_ERR_INTERNAL,
                              why[0] ? why : "the job ended here before it started", true);
        return;
    }
    memcpy(j->node_of, s->node_of, j->world * sizeof(*j->node_of));
    j->nnodes = s->nnodes;
    j->self_node = s->self_node;
    j->nlocal = nlocal;
    j->started = true;
    log_info("job '%s': all %u ranks in, %u of them here, on %u nodes", j->id, j->world, nlocal,
             s->nnodes);
    ovld_job_net_t net = {.world = j->world,
                          .node_of = j->node_of,
                          .self_node = s->self_node,
                          .nnodes = s->nnodes,
                          .key = s->key,
                          .rail_keys = s->rail_keys,
                          .nrail_keys = s->nrail_keys,
                          .rail_group = s->rail_group,
                          .rail_pos = s->rail_pos,
                          .xfer = s->xfer,
                          .mover = s->xfer ? &ovld_xfer_mover : NULL};
    j->pins++;
    job_start(js, j, &net);
    ovld_opq_progress(js, j);
    j->pins--;
    ovld_job_maybe_free(js, j);
}

void ovld_jobs_on_go(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN], uint64_t seq,
                     const ovld_cluster_go_t *go)
{
    ovld_jobs_t *js = arg;
    ovld_job_t *j = job_find_nonce(js, nonce);
    if (j)
        ovld_opq_go(js, j, seq, go);
}

void ovld_jobs_on_end(void *arg, const uint8_t nonce[OVLD_JOB_NONCE_LEN], bool abort,
                      ovl_status_t status, const char *why)
{
    ovld_jobs_t *js = arg;
    ovld_job_t *j = job_find_nonce(js, nonce);
    if (!j) {
        js->across.forget(js->across.ctx, nonce);
        return;
    }
    if (abort) {
        ovld_job_abort_across(js, j, status, why, false);
        return;
    }
    if (j->state == OVLD_JOB_ABORTED || j->state == OVLD_JOB_ENDING)
        return;
    /* Ops still waiting for their go never get one: they fail. */
    ovld_job_end(j, OVLD_JOB_ENDING, why);
    log_info("job '%s': takes no more ops: %s", j->id, why);
    ovld_job_fail_rest(js, j, OVL_ERR_ABORTED, "job ended", why);
}

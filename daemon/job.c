/*
 * job.c: jobs and their ranks (job.h): joining, setting up what the ranks
 * share, leaving, and the end of a job. The op queue of a job is opq.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_internal.h"
#include "log.h"

void ovld_jobs_init(ovld_jobs_t *js, ovld_backend_t *backend, const ovld_config_t *cfg,
                    ovld_counters_t *counters, ovld_exec_pool_t *pool)
{
    *js = (ovld_jobs_t){.backend = backend, .cfg = cfg, .counters = counters, .pool = pool};
}

bool ovld_jobs_empty(const ovld_jobs_t *js)
{
    return !js->live && !js->dead;
}

const char *ovld_job_state_name(ovld_job_state_t s)
{
    switch (s) {
    case OVLD_JOB_FORMING:
        return "forming";
    case OVLD_JOB_SETUP:
        return "setup";
    case OVLD_JOB_READY:
        return "ready";
    case OVLD_JOB_ENDING:
        return "ending";
    case OVLD_JOB_ABORTED:
        return "aborted";
    }
    return "?";
}

void ovld_member_fail(ovld_member_t *m, uint64_t seq, ovl_status_t st, const char *msg)
{
    if (m->err != OVL_OK)
        return;
    m->err = st;
    m->err_seq = seq;
    snprintf(m->err_msg, sizeof(m->err_msg), "%s", msg);
}

static void job_unlink(ovld_job_t **list, ovld_job_t *j)
{
    for (ovld_job_t **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            return;
        }
}

static void job_free(ovld_jobs_t *js, ovld_job_t *j)
{
    if (j->detached) {
        job_unlink(&js->dead, j);
    } else {
        job_unlink(&js->live, j);
        js->njobs--;
    }
    ovld_rank_t **ranks = calloc(j->world, sizeof(*ranks));
    for (uint32_t r = 0; r < j->world; r++) {
        ovld_member_t *m = j->members[r];
        if (!m)
            continue;
        if (ranks && js->backend->ops->job_teardown)
            ranks[r] = m->brank;
        else
            js->backend->ops->rank_destroy(js->backend, m->brank);
        free(m);
    }
    if (ranks && js->backend->ops->job_teardown)
        js->backend->ops->job_teardown(js->backend, ranks, j->world);
    free(ranks);
    free(j->members);
    free(j);
}

bool ovld_job_has_clients(const ovld_job_t *j)
{
    for (uint32_t r = 0; r < j->world; r++)
        if (j->members[r] && j->members[r]->attached)
            return true;
    return false;
}

/* A job with nobody in it and nothing running goes away. */
void ovld_job_maybe_free(ovld_jobs_t *js, ovld_job_t *j)
{
    if (ovld_job_has_clients(j))
        return;
    if (!j->detached) {
        /* Nobody is left: the id is free for a new job at once, while this
         * one waits on the side for its last completions. */
        job_unlink(&js->live, j);
        js->njobs--;
        j->detached = true;
        j->next = js->dead;
        js->dead = j;
        log_info("job '%s': ended after %" PRIu64 " ops", j->id, j->ops_done);
    }
    if (j->in_flight > 0 || j->setup_pending || j->pins > 0)
        return;
    job_free(js, j);
}

static ovld_job_t *job_find(ovld_jobs_t *js, uid_t owner, const char *id)
{
    for (ovld_job_t *j = js->live; j; j = j->next)
        if (j->owner == owner && strcmp(j->id, id) == 0)
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
    if (st != OVL_OK) {
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

/* Every rank is in: let the backend prepare what the ranks share. */
static void job_start(ovld_jobs_t *js, ovld_job_t *j)
{
    /* Ranks of a job may share a device (several ranks on one GPU): NCCL
     * cannot make their communicator, so the plans gather by the copy
     * engine (plan.h, shared_gpu) and the backend makes none. */
    for (uint32_t r = 0; r < j->world && !j->shared_gpu; r++)
        for (uint32_t q = 0; q < r; q++)
            if (j->members[q]->device == j->members[r]->device) {
                j->shared_gpu = true;
                break;
            }
    if (!js->backend->ops->job_setup) {
        j->state = OVLD_JOB_READY;
        return;
    }
    ovld_rank_t **ranks = calloc(j->world, sizeof(*ranks));
    setup_ctx_t *sc = calloc(1, sizeof(*sc));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (ranks && sc) {
        for (uint32_t r = 0; r < j->world; r++)
            ranks[r] = j->members[r]->brank;
        sc->js = js;
        sc->j = j;
        j->state = OVLD_JOB_SETUP;
        j->setup_pending = true;
        st = js->backend->ops->job_setup(js->backend, ranks, j->world, NULL, !j->shared_gpu,
                                         on_setup, sc);
    }
    free(ranks);
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

ovl_status_t ovld_job_join(ovld_jobs_t *js, const ovld_join_desc_t *req, ovld_member_t **ret_member,
                           ovld_doorbell_export_t *ret_db, char *err, size_t errlen)
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
    ovld_job_t *j = job_find(js, req->uid, id);
    bool created = false;
    if (j) {
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
        j = calloc(1, sizeof(*j));
        if (!j || !(j->members = calloc(world, sizeof(*j->members)))) {
            free(j);
            snprintf(err, errlen, "out of memory");
            return OVL_ERR_NOMEM;
        }
        memcpy(j->id, id, idlen + 1);
        j->owner = req->uid;
        j->world = world;
        j->state = OVLD_JOB_FORMING;
        j->next = js->live;
        js->live = j;
        js->njobs++;
        created = true;
    }

    ovld_member_t *m = calloc(1, sizeof(*m));
    ovl_status_t st = OVL_ERR_NOMEM;
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
    j->members[rank] = m;
    j->joined++;
    if (j->joined == j->world)
        job_start(js, j);
    log_info("job '%s': rank %u/%u joined on device %u (pid %d, uid %u)%s", j->id, m->rank,
             j->world, dev, (int)req->pid, (unsigned)req->uid,
             j->state == OVLD_JOB_READY ? "; all ranks in" : "");
    *ret_member = m;
    return OVL_OK;
fail:
    if (created)
        job_free(js, j);
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

void ovld_member_error(const ovld_member_t *m, ovl_status_t *ret_status, uint64_t *ret_seq,
                       const char **ret_msg)
{
    *ret_status = m->err;
    *ret_seq = m->err_seq;
    *ret_msg = m->err_msg;
}

void ovld_jobs_foreach(const ovld_jobs_t *js, void (*fn)(const ovld_job_info_t *info, void *arg),
                       void *arg)
{
    for (const ovld_job_t *j = js->live; j; j = j->next) {
        int32_t devs[OVL_PLAN_MAX_WORLD];
        for (uint32_t r = 0; r < j->world; r++)
            devs[r] = j->members[r] ? (int32_t)j->members[r]->device : -1;
        ovld_job_info_t info = {.rank_devices = devs,
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

void ovld_job_end(ovld_job_t *j, ovld_job_state_t state, const char *why)
{
    j->state = state;
    snprintf(j->last_error, sizeof(j->last_error), "%s", why);
}

void ovld_job_leave(ovld_jobs_t *js, ovld_member_t *m, const char *why)
{
    ovld_job_t *j = m->job;
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

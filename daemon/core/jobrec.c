/*
 * jobrec.c: a job's record (job_internal.h): its state's name and its end,
 * its members' first errors, and its freeing once nobody is in it and
 * nothing runs. Below both job.c (joining, leaving) and opq.c (the op
 * queue), which call it; it calls neither.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "job_internal.h"
#include "log.h"
#include "xfer.h"

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

/* A member's first failure is written by the loop and by issuing threads
 * (an op's failure, before its doorbells ring: exec.h, failing), and read
 * by the loop: this leaf lock guards every member's err fields. */
static pthread_mutex_t member_err_mu = PTHREAD_MUTEX_INITIALIZER;

void ovld_member_fail(ovld_member_t *m, uint64_t seq, ovl_status_t st, const char *msg)
{
    pthread_mutex_lock(&member_err_mu);
    if (m->err == OVL_OK) {
        m->err = st;
        m->err_seq = seq;
        snprintf(m->err_msg, sizeof(m->err_msg), "%s", msg);
    }
    pthread_mutex_unlock(&member_err_mu);
}

void ovld_member_error(const ovld_member_t *m, ovl_status_t *ret_status, uint64_t *ret_seq,
                       const char **ret_msg)
{
    /* once set, the fields never change again */
    pthread_mutex_lock(&member_err_mu);
    *ret_status = m->err;
    *ret_seq = m->err_seq;
    *ret_msg = m->err != OVL_OK ? m->err_msg : "";
    pthread_mutex_unlock(&member_err_mu);
}

void ovld_job_end(ovld_job_t *j, ovld_job_state_t state, const char *why)
{
    j->state = state;
    snprintf(j->last_error, sizeof(j->last_error), "%s", why);
}

static void job_unlink(ovld_job_t **list, ovld_job_t *j)
{
    for (ovld_job_t **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            return;
        }
}

void ovld_job_free(ovld_jobs_t *js, ovld_job_t *j)
{
    if (j->detached) {
        job_unlink(&js->dead, j);
    } else {
        job_unlink(&js->live, j);
        js->njobs--;
    }
    /* the lane before the ranks: the issuer reads their doorbells until then */
    ovld_lane_free(j->lane);
    j->lane = NULL;
    /* its graphs before its ranks (their streams and memory) */
    ovld_replay_destroy(j->replay);
    j->replay = NULL;
    ovld_plancache_destroy(j->plans);
    j->plans = NULL;
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
    if (j->across) {
        /* after the backend's teardown: nothing of it moves rows any more */
        if (j->xfer)
            ovld_xfer_job_release(j->xfer);
        js->across.forget(js->across.ctx, j->nonce);
    }
    free(j->node_of);
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
    if (j->in_flight > 0 || j->setup_pending || j->pins > 0 || ovld_lane_busy(j->lane))
        return;
    ovld_job_free(js, j);
}

/*
 * opq.c: one job's op queue (job.h): ops matched across ranks by number,
 * checked for agreement, issued in order through the executor within the
 * issue window, failed on every rank that submitted them, and completed
 * once every rank's done is back. The buffers of an op come resolved
 * (desc.h); the queue holds their references until the op is done.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffers.h"
#include "clock.h"
#include "doorbell.h"
#include "exec.h"
#include "job_internal.h"
#include "kind.h"
#include "log.h"
#include "plan.h"
#include "tune.h"
#include "xfer.h"

/* What a completion names (the backend's cookie): one rank's part of an op,
 * or an op refused for one rank alone before it had an op record. */
typedef enum { TICKET_OP, TICKET_REFUSAL } ticket_kind_t;

typedef struct ovld_ticket {
    ticket_kind_t kind;
    ovld_member_t *m;
    struct ovld_op *op; /* TICKET_OP */
} ovld_ticket_t;

/* One rank's submission of one op, with its buffers resolved and held. */
typedef struct ovld_sub {
    ovld_ticket_t ticket;
    bool in;
    ovld_buf_use_t use[OVLD_BUF_COUNT]; /* hold: a reference, or NULL */
} ovld_sub_t;

typedef struct ovld_op {
    uint64_t seq;
    uint32_t nin;     /* ranks whose submission is in */
    uint32_t nrung;   /* ranks whose done was (or will be) rung */
    uint32_t ndone;   /* of those, ranks whose done came back */
    bool issued;      /* run or failed: doorbells rung */
    bool windowed;    /* counted in j->running until its completions are in */
    bool refusal;     /* one rank's submission refused: never matched by seq */
    bool rung_failed; /* its doorbells were rung with its error (op_fail, or
                         the executor failed): their completions say nothing new */
    bool ringing;     /* its doorbells are being rung: completions that come
                         back at once (a backend out of memory) are counted,
                         and the ringer ends the op (op_rung) */
    ovl_status_t st;  /* why it fails, if it does */
    char msg[256];
    ovld_op_fields_t f; /* what every rank must agree on, from the first submission */
    /* A job across nodes: told the coordinator (every local rank in), and
     * its go came (with the parameters every node runs, or the failure in
     * st and msg). */
    bool asked, go;
    bool planner_refused;        /* the same on every node: not a reason to abort */
    ovld_cluster_go_t go_params; /* reason not kept (it is in msg) */
    uint32_t first_rank;
    ovl_algo_t ran_algo; /* the algorithm that ran (AUTO resolved) */
    /* `auto` that measures (tune.h): what it picked for the op, once (the
     * queue may resolve an op's parameters more than once), the ticket of
     * a candidate being timed, and the op's device time so far (the
     * slowest rank's; a rank without one makes it none). */
    bool tune_picked, tune_untimed;
    ovl_algo_t tune_algo;
    uint32_t tune_chunks;
    ovl_ag_pref_t tune_allgather;
    ovl_choice_t tune_chosen;
    ovld_tune_ticket_t tune;
    uint64_t tune_ns;
    uint64_t ready_ns; /* when the last rank's submission came in */
    /* While its issue is on the job's lane (ringing): the item, and what
     * it walks or rings, freed in its callback. */
    ovld_jobs_t *js;
    ovld_job_t *job;
    ovld_issue_t issue;
    ovld_plans_t *plans;
    ovld_exec_rank_t *xr;
    ovld_exec_ring_t *rings;
    uint64_t plan_ns; /* planning, before the issue */
    struct ovld_op *next;
    ovld_sub_t subs[];
} ovld_op_t;

static void op_free(ovld_job_t *j, ovld_op_t *op)
{
    for (uint32_t r = 0; r < j->world; r++)
        for (int b = 0; b < OVLD_BUF_COUNT; b++)
            ovld_buf_put(op->subs[r].use[b].hold);
    free(op);
}

static void op_complete(ovld_jobs_t *js, ovld_job_t *j, ovld_op_t *op);

/* An op still waiting in the queue for its ranks or its turn (refusals,
 * one rank's alone, are not ops the job waits for). */
static bool op_pending(const ovld_op_t *op)
{
    return !op->issued && !op->refusal;
}

/* The ringer is done with op: end it if its completions are all in. */
static void op_rung(ovld_jobs_t *js, ovld_job_t *j, ovld_op_t *op)
{
    op->ringing = false;
    if (op->ndone >= op->nrung)
        op_complete(js, j, op);
}

static void op_fail_issued(ovld_issue_t *it);

/* Rings done with op->st on every rank that submitted op (or every joined
 * rank when all did); completions come back through ovld_job_on_done. */
static void op_fail(ovld_jobs_t *js, ovld_job_t *j, ovld_op_t *op)
{
    op->issued = true;
    op->rung_failed = true;
    /* An op of an ended job fails for the reason the job ended, which is
     * its last error already and went to the log when it ended: taking the
     * op's own words ("job aborted: <the reason>") would nest them again in
     * every later op's. */
    bool ended = j->state == OVLD_JOB_ABORTED || j->state == OVLD_JOB_ENDING;
    if (!op->refusal && !ended) {
        snprintf(j->last_error, sizeof(j->last_error), "op %" PRIu64 ": %s", op->seq, op->msg);
        log_warn("job '%s': op %" PRIu64 " failed: %s", j->id, op->seq, op->msg);
    } else if (!op->refusal) {
        log_debug("job '%s': op %" PRIu64 " failed: %s", j->id, op->seq, op->msg);
    }
    for (uint32_t r = 0; r < j->world; r++)
        op->nrung += op->subs[r].in && j->members[r];
    /* Its rings are stream work like an op's: they count against the same
     * window (job_progress), and go through the job's lane, behind the
     * ops before it. A record always has a ring: it exists because a rank
     * submitted, and members stay until the job is freed. */
    op->windowed = true;
    j->running++;
    op->ringing = true;
    op->rings = calloc(j->world, sizeof(*op->rings));
    uint32_t n = 0;
    for (uint32_t r = 0; r < j->world; r++) {
        ovld_member_t *m = j->members[r];
        if (!op->subs[r].in || !m)
            continue;
        ovld_member_fail(m, op->seq, op->st, op->msg);
        op->subs[r].ticket = (ovld_ticket_t){.kind = TICKET_OP, .m = m, .op = op};
        ovld_exec_ring_t ring = {.rank = m->brank, .cookie = &op->subs[r].ticket};
        if (op->rings)
            op->rings[n++] = ring;
        else /* out of memory: rung from here, maybe ahead of ops on the lane */
            ovld_exec_fail(js->backend, &ring, 1, op->seq, op->st, op->msg);
    }
    if (!op->rings) {
        op_rung(js, j, op);
        return;
    }
    op->js = js;
    op->job = j;
    op->issue = (ovld_issue_t){.fail = true,
                               .rings = op->rings,
                               .nrings = n,
                               .seq = op->seq,
                               .status = op->st,
                               .message = op->msg,
                               .cb = op_fail_issued,
                               .arg = op};
    ovld_lane_submit(j->lane, js->backend, js->pool, &op->issue);
}

/* The rings of a failed op are queued on the streams (loop thread). */
static void op_fail_issued(ovld_issue_t *it)
{
    ovld_op_t *op = it->arg;
    ovld_jobs_t *js = op->js;
    ovld_job_t *j = op->job;
    free(op->rings);
    op->rings = NULL;
    j->pins++;
    op_rung(js, j, op);
    j->pins--;
    ovld_job_maybe_free(js, j);
}

/* Resolves one rank's views and builds its plan. */

static ovl_status_t op_prepare_rank(ovld_jobs_t *js, ovld_job_t *j, ovld_op_t *op, uint32_t r,
                                    const ovl_plan_t *plan, ovld_exec_rank_t *x)
{
    /* each buffer the op gives, under the plan's name for it */
    const ovld_kind_t *kind = ovld_kind(op->f.kind);
    ovld_sub_t *s = &op->subs[r];
    ovl_status_t st;
    for (int b = 0; b < OVLD_BUF_COUNT; b++) {
        int pb = s->use[b].hold ? kind->plan_buf(b) : -1;
        if (pb >= 0)
            x->buf[pb] = s->use[b].view;
    }
    x->rank = j->members[r]->brank;
    x->plan = plan;
    s->ticket = (ovld_ticket_t){.kind = TICKET_OP, .m = j->members[r], .op = op};
    x->cookie = &s->ticket;
    if (plan->scratch_bytes) {
        if (plan->scratch_bytes > j->scratch_bytes && j->running > 0) {
            /* ovld_opq_progress holds such an op back until nothing runs:
             * the backend would free scratch that issued ops still use */
            snprintf(op->msg, sizeof(op->msg),
                     "internal error: scratch would grow under %u running ops", j->running);
            return OVL_ERR_INTERNAL;
        }
        char why[160] = "";
        void *base = NULL;
        st = js->backend->ops->rank_scratch(js->backend, x->rank, plan->scratch_bytes, &base, why,
                                            sizeof(why));
        if (st != OVL_OK) {
            snprintf(op->msg, sizeof(op->msg), "rank %u: scratch of %" PRIu64 " bytes: %s", r,
                     plan->scratch_bytes, why[0] ? why : ovl_strerror(st));
            return st;
        }
        /* the plan's scratch buffers, each dense at its offset */
        for (int pb = 0; pb < OVL_BUF_COUNT; pb++)
            if (plan->bufs[pb].scratch)
                x->buf[pb] = (ovld_view_t){.ptr = (char *)base + plan->bufs[pb].scratch_offset,
                                           .ld = plan->bufs[pb].cols};
    }
    return OVL_OK;
}

/* The scratch op's plans gather into (the same on every rank; 0 when they
 * gather into the client's a_out or not at all), by the planner's rule;
 * OVL_ERR_LIMIT when it does not fit in 64 bits. pp: the op's parameters,
 * resolved. */
static ovl_status_t op_scratch(const ovl_plan_params_t *pp, uint64_t *ret)
{
    ovl_status_t st = ovl_plan_scratch_bytes(pp, ret);
    if (st == OVL_ERR_INVALID)
        *ret = 0; /* the planner refuses the op itself: op_prepare_rank says so */
    return st == OVL_ERR_LIMIT ? st : OVL_OK;
}

/* Whether the buffers of any rank here force the plans to the copy engine
 * (the kind says which layouts NCCL cannot move). */
static bool op_strided(const ovld_job_t *j, const ovld_op_t *op)
{
    const ovld_kind_t *kind = ovld_kind(op->f.kind); /* NULL: a failing op's */
    for (uint32_t r = 0; kind && r < j->world; r++)
        if (kind->strided(&op->f, op->subs[r].use))
            return true;
    return false;
}

/* op's plan parameters, resolved: the one place they are made. */
static void op_params(const ovld_jobs_t *js, const ovld_job_t *j, ovld_op_t *op,
                      ovl_plan_params_t *pp)
{
    ovld_kind(op->f.kind)->plan_params(&op->f, j->world, pp);
    pp->shared_gpu = j->shared_gpu;
    pp->strided = op_strided(j, op);
    if (j->across) {
        /* resolved once, by the coordinator, for every node */
        pp->algo = (ovl_algo_t)op->go_params.algo;
        pp->chunks = op->go_params.chunks;
        pp->streams = op->go_params.streams;
        pp->allgather = (ovl_ag_pref_t)op->go_params.allgather;
        pp->strided = op->go_params.strided;
        pp->shared_gpu = op->go_params.shared_gpu;
        pp->node_of = j->node_of;
        return;
    }
    ovld_plan_resolve(js->cfg, js->backend->ops->allgather != NULL, pp);
    /* auto by the rule: measured instead, where a timer is (tune.h) */
    if (js->tune && js->backend->ops->time_start && pp->chosen == OVL_CHOSEN_RULE) {
        if (!op->tune_picked) {
            ovld_tune_pick(js->tune, (uint32_t)j->owner, pp, &op->tune);
            op->tune_picked = true;
            op->tune_algo = pp->algo;
            op->tune_chunks = pp->chunks;
            op->tune_allgather = pp->allgather;
            op->tune_chosen = pp->chosen;
        }
        pp->algo = op->tune_algo;
        pp->chunks = op->tune_chunks;
        pp->allgather = op->tune_allgather;
        pp->chosen = op->tune_chosen;
    }
}

/* An op of a job across nodes failed here after its go: the other nodes
 * would wait for this one's rows for ever, so the job aborts everywhere. */
static void across_failed(ovld_jobs_t *js, ovld_job_t *j, uint64_t seq, const char *msg)
{
    char why[300];
    snprintf(why, sizeof(why), "op %" PRIu64 " failed on node %u: %s", seq, j->self_node, msg);
    ovld_job_abort_across(js, j, OVL_ERR_ABORTED, why, true);
}

/* An issuing thread is about to ring op's doorbells with a failure: the
 * members' words first, so that a client that sees the error finds them
 * (CommCheck). Members stay until the job is freed, which waits for the
 * lane. */
static void op_failing(void *arg, ovl_status_t st, const char *msg)
{
    ovld_op_t *op = arg;
    ovld_job_t *j = op->job;
    for (uint32_t r = 0; r < j->world; r++)
        if (j->members[r])
            ovld_member_fail(j->members[r], op->seq, st, msg);
}

static void op_issued(ovld_issue_t *it);

static void op_run(ovld_jobs_t *js, ovld_job_t *j, ovld_op_t *op, const ovl_plan_params_t *params)
{
    uint64_t t0 = ovl_mono_ns();
    ovl_plan_params_t pp = *params;
    op->ran_algo = pp.algo;

    /* The op holds its plans only while the executor walks them: backends
     * copy what they need into their own work items. */
    ovld_plans_t *plans = NULL;
    ovld_exec_rank_t *xr = calloc(j->world, sizeof(*xr));
    if (!xr) {
        op->st = OVL_ERR_NOMEM;
        snprintf(op->msg, sizeof(op->msg), "out of memory");
        goto fail;
    }
    uint64_t scratch;
    if (op_scratch(&pp, &scratch) != OVL_OK) {
        op->st = OVL_ERR_LIMIT;
        snprintf(op->msg, sizeof(op->msg), "gathered A does not fit in memory");
        goto fail;
    }
    uint32_t refused = 0;
    op->st = ovld_plans_get(j->plans, &pp, (const void *const *)j->members, &plans, &refused);
    if (op->st != OVL_OK) {
        if (op->st == OVL_ERR_NOMEM) {
            snprintf(op->msg, sizeof(op->msg), "out of memory");
        } else {
            const char *why = op->st == OVL_ERR_INVALID ? ovl_plan_refusal(&pp) : NULL;
            snprintf(op->msg, sizeof(op->msg), "planner refused rank %u: %s", refused,
                     why ? why : ovl_strerror(op->st));
            op->planner_refused = true;
        }
        goto fail;
    }
    uint32_t nlocal = 0;
    for (uint32_t r = 0; r < j->world; r++) {
        if (!j->members[r])
            continue; /* another node's */
        op->st = op_prepare_rank(js, j, op, r, &plans->plans[r], &xr[r]);
        if (op->st != OVL_OK)
            goto fail;
        nlocal++;
    }
    op->issued = true;
    op->windowed = true;
    op->nrung = nlocal;
    j->running++;
    if (scratch > j->scratch_bytes)
        j->scratch_bytes = scratch; /* every rank holds it now */
    op->ringing = true;
    op->js = js;
    op->job = j;
    op->plans = plans;
    op->xr = xr;
    op->plan_ns = ovl_mono_ns() - t0;
    /* Ranks on one device are issued from one thread: a backend's state of
     * a device is not shared between threads (backend.h). */
    op->issue =
        (ovld_issue_t){.op = {.seq = op->seq,
                              .world = j->world,
                              .ranks = xr,
                              .serial = j->shared_gpu,
                              .failing = op_failing,
                              .failing_arg = op,
                              .replay = j->replay,
                              .mem_gen = js->buffers ? ovld_buffers_generation(js->buffers) : 0,
                              .timed = op->tune.entry != 0 || (j->across && op->go_params.timed)},
                       .cb = op_issued,
                       .arg = op};
    ovld_lane_submit(j->lane, js->backend, js->pool, &op->issue);
    return;
fail:
    ovld_plans_put(plans);
    free(xr);
    op_fail(js, j, op);
    if (j->across && !op->planner_refused)
        across_failed(js, j, op->seq, op->msg);
}

/* op's plans are on the streams, or failed half-way with every doorbell
 * rung (loop thread). */
static void op_issued(ovld_issue_t *it)
{
    ovld_op_t *op = it->arg;
    ovld_jobs_t *js = op->js;
    ovld_job_t *j = op->job;
    ovl_status_t st = it->st;
    ovld_count_issue(js->counters, op->plan_ns + it->issue_ns);
    if (it->how == OVLD_REPLAY_LAUNCH)
        OVLD_COUNT(js->counters, ops_replayed, 1);
    else if (it->how == OVLD_REPLAY_CAPTURE)
        OVLD_COUNT(js->counters, ops_captured, 1);
    j->pins++;
    if (st != OVL_OK) {
        /* The executor rang every doorbell with the error (and told the
         * members first, op_failing); their completions say nothing new
         * (on_done_op). */
        op->st = st;
        op->rung_failed = true;
        snprintf(op->msg, sizeof(op->msg), "%s", it->err);
    }
    if (op->st != OVL_OK) {
        /* The executor's failure, or one that a completion delivered
         * while it rang reported (on_done_op leaves those to us). */
        snprintf(j->last_error, sizeof(j->last_error), "op %" PRIu64 ": %s", op->seq, op->msg);
        log_error("job '%s': op %" PRIu64 ": %s", j->id, op->seq, op->msg);
    } else if (ovld_log_get_level() >= OVLD_LOG_DEBUG) { /* no formatting per op otherwise */
        const ovld_kind_t *kind = ovld_kind(op->f.kind); /* an issued op's: never NULL */
        const char *kname = ovl_op_kind_name((ovl_op_kind_t)op->f.kind);
        char shape[96] = "";
        if (kind)
            kind->describe(&op->f, shape, sizeof(shape));
        log_debug("job '%s': op %" PRIu64 " issued (%s %s, %s)", j->id, op->seq,
                  kname ? kname : "?", ovl_algo_name(op->ran_algo), shape);
    }
    ovld_plans_put(op->plans);
    free(op->xr);
    op->plans = NULL;
    op->xr = NULL;
    bool failed = op->st != OVL_OK;
    uint64_t seq = op->seq;
    char msg[sizeof(op->msg)];
    snprintf(msg, sizeof(msg), "%s", op->msg);
    op_rung(js, j, op); /* may free op */
    if (failed && j->across)
        across_failed(js, j, seq, msg);
    j->pins--;
    ovld_job_maybe_free(js, j);
}

/* Scratch may be freed or moved only while no issued op can use it: an op
 * that gathers into more scratch than every rank holds waits until nothing
 * of the job runs. j->scratch_bytes is what the ranks were given, raised
 * only once they all had it (op_run), never by an op that used none (a
 * world-1 ring op raised it once, and let the next op reallocate scratch
 * that a queued op was about to gather into). Ops of a size seen before run
 * back to back. */
static bool needs_scratch_growth(const ovld_job_t *j, const ovl_plan_params_t *pp)
{
    uint64_t scratch;
    return op_scratch(pp, &scratch) == OVL_OK && scratch > j->scratch_bytes;
}

/* Runs (or fails) every op at the head of the queue whose submissions are
 * all in, in order.
 *
 * At most OVLD_MAX_ISSUED ops (run or failed) are on the streams at a time.
 * A few ahead keep the GPU busy; more would only fill its command queues.
 * And a stream can stall for good: a rank's stream 0 waits for its client's
 * `ready`, which a client that died never writes. An enqueue onto a stalled
 * stream whose queue is full blocks the calling thread in the driver (seen
 * on 2 x H200: about 50 failed ops rung at once blocked ovld's loop in
 * cuStreamWriteValue64), and this is the loop thread: it could then never
 * see the other clients close, nor release their waits. Failed ops and
 * refusals are stream work too (their doorbells ring on stream 0), so they
 * queue here like the rest. */
/* A job across nodes: each op whose ranks here are all in goes to the
 * coordinator, in order, with what they agree on or why it fails here. */
static void across_ask(ovld_jobs_t *js, ovld_job_t *j)
{
    if (j->state != OVLD_JOB_READY || !js->across.ctx)
        return;
    uint32_t first = 0;
    while (first < j->world && !j->members[first])
        first++;
    for (ovld_op_t *op = j->ops; op; op = op->next) {
        if (op->refusal || op->issued || op->asked)
            continue;
        if (op->nin < j->nlocal)
            break; /* in order */
        op->asked = true;
        ovld_cluster_ready_t r = {.status = op->st,
                                  .reason = op->msg,
                                  .first_rank = first,
                                  .f = op->f,
                                  .strided = op_strided(j, op),
                                  .shared_gpu = j->shared_gpu};
        js->across.op_ready(js->across.ctx, j->nonce, op->seq, &r);
    }
}

void ovld_opq_go(ovld_jobs_t *js, ovld_job_t *j, uint64_t seq, const ovld_cluster_go_t *go)
{
    ovld_op_t *op = j->ops;
    while (op && (op->seq != seq || op->refusal))
        op = op->next;
    if (!op || !op->asked || op->go) {
        char why[160];
        snprintf(why, sizeof(why), "the coordinator gave op %" PRIu64 " a go it was not asked for",
                 seq);
        ovld_job_abort_across(js, j, OVL_ERR_PROTOCOL, why, true);
        return;
    }
    op->go = true;
    op->go_params = *go;
    op->go_params.reason = NULL;
    if (go->status != OVL_OK) {
        /* the same failure on every node (the first node's, or a
         * disagreement naming the ranks) */
        op->st = go->status;
        snprintf(op->msg, sizeof(op->msg), "%s", go->reason);
    }
    ovld_opq_progress(js, j);
}

_Static_assert(OVLD_MAX_ISSUED + 2 <= OVL_READY_SLOTS,
               "a dying client's late ready writes must not reach a waiting op's slot");

void ovld_opq_progress(ovld_jobs_t *js, ovld_job_t *j)
{
    /* A completion delivered at once (a backend out of memory) can end ops,
     * and run this again, under the call: the job stays, and the scan starts
     * over after each op it runs or fails. */
    j->pins++;
    if (j->across)
        across_ask(js, j);
    ovld_op_t *op = j->ops;
    while (op) {
        if (op->issued) {
            op = op->next;
            continue;
        }
        if (j->state == OVLD_JOB_ABORTED || j->state == OVLD_JOB_ENDING) {
            if (op->st == OVL_OK) {
                op->st = OVL_ERR_ABORTED;
                snprintf(op->msg, sizeof(op->msg), "job aborted: %s", j->last_error);
            }
        } else if (!op->refusal && j->across) {
            if (!op->go || j->state != OVLD_JOB_READY)
                break; /* its go (or its failure) comes from the coordinator */
        } else if (!op->refusal && (op->nin < j->world || j->state != OVLD_JOB_READY)) {
            break; /* later ops wait for this one */
        }
        if (j->running >= OVLD_MAX_ISSUED)
            break; /* resumes from ovld_job_on_done */
        ovl_plan_params_t pp;
        if (op->st == OVL_OK)
            op_params(js, j, op, &pp);
        if (op->st == OVL_OK && j->running > 0 && needs_scratch_growth(j, &pp))
            break; /* resumes from ovld_job_on_done */
        if (op->st != OVL_OK)
            op_fail(js, j, op);
        else
            op_run(js, j, op, &pp);
        op = j->ops;
    }
    j->pins--;
}

static void op_unlink(ovld_job_t *j, ovld_op_t *op)
{
    ovld_op_t *prev = NULL;
    for (ovld_op_t *o = j->ops; o; prev = o, o = o->next)
        if (o == op) {
            if (prev)
                prev->next = op->next;
            else
                j->ops = op->next;
            if (j->ops_tail == op)
                j->ops_tail = prev;
            return;
        }
}

static void on_done_op(ovld_jobs_t *js, ovld_job_t *j, ovld_member_t *m, ovld_op_t *op,
                       uint64_t seq, ovl_status_t status, const char *message, uint64_t ns);

void ovld_job_on_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status,
                      const char *message, uint64_t ns)
{
    ovld_jobs_t *js = arg;
    ovld_ticket_t *t = cookie;
    ovld_member_t *m = t->m;
    ovld_job_t *j = m->job;
    if (status != OVL_OK)
        ovld_member_fail(m, seq, status, message);
    if (t->kind == TICKET_REFUSAL) {
        free(t);
        j->in_flight--;
        ovld_job_maybe_free(js, j);
        return;
    }
    /* Completing the op runs the next ones of the queue, whose failures
     * can complete at once (a backend out of memory): the job stays until
     * this function is done with it. (A deregistration that the op's
     * buffers let go is answered by the loop afterwards, not from here.) */
    j->pins++;
    on_done_op(js, j, m, t->op, seq, status, message, ns);
    j->pins--;
    ovld_job_maybe_free(js, j);
}

static void on_done_op(ovld_jobs_t *js, ovld_job_t *j, ovld_member_t *m, ovld_op_t *op,
                       uint64_t seq, ovl_status_t status, const char *message, uint64_t ns)
{
    /* the op's device time: its slowest rank's, none if a rank has none */
    if (ns == 0)
        op->tune_untimed = true;
    else if (ns > op->tune_ns)
        op->tune_ns = ns;
    if (status != OVL_OK && !op->rung_failed && op->ringing) {
        /* Delivered at once, while the op is still being rung: the ringer
         * (op_run) records and logs it when it is done. */
        if (op->st == OVL_OK) {
            op->st = status;
            snprintf(op->msg, sizeof(op->msg), "%s", message);
        }
    } else if (status != OVL_OK && !op->rung_failed) {
        /* A failure the backend found on this rank: each rank's is news,
         * logged once here; the first one is the op's, and the job's last
         * error. */
        log_error("job '%s': op %" PRIu64 " failed on rank %u: %s", j->id, seq, m->rank, message);
        if (op->st == OVL_OK) {
            op->st = status;
            snprintf(op->msg, sizeof(op->msg), "%s", message);
            snprintf(j->last_error, sizeof(j->last_error), "op %" PRIu64 ": %s", seq, message);
        }
        if (j->across && j->state != OVLD_JOB_ABORTED)
            across_failed(js, j, seq, message);
    }
    if (++op->ndone < op->nrung || !op->issued || op->ringing)
        return;
    op_complete(js, j, op);
}

/* All of op's completions are in: count it, free it, and let the next ops
 * go. */
static void op_complete(ovld_jobs_t *js, ovld_job_t *j, ovld_op_t *op)
{
    if (op->windowed)
        j->running--;
    if (op->st == OVL_OK)
        j->ops_done++;
    uint64_t ns = op->tune_untimed ? 0 : op->tune_ns;
    if (op->tune.entry)
        ovld_tune_record(js->tune, op->tune, ovld_tune_outcome_of(op->st, op->planner_refused), ns);
    /* across nodes the coordinator measures: this node's outcome to it */
    if (j->across && op->go && op->go_params.timed && js->across.op_time)
        js->across.op_time(js->across.ctx, j->nonce, op->seq,
                           ovld_tune_outcome_of(op->st, op->planner_refused), ns);
    if (!op->refusal) { /* a refusal was counted as an error when it was made */
        const ovld_kind_t *kind = ovld_kind(op->f.kind); /* NULL: a failed op's */
        ovld_op_count_t n =
            kind && op->st == OVL_OK ? kind->count(&op->f, j->world) : (ovld_op_count_t){0};
        /* a failed op counts as failed, by its status alone (stats.c) */
        ovld_count_op(js->counters, (ovl_op_kind_t)op->f.kind, op->ran_algo, (ovl_dtype_t)n.dtype,
                      n.flop, n.bytes, ovl_mono_ns() - op->ready_ns, op->st);
    }
    j->in_flight--;
    op_unlink(j, op);
    op_free(j, op);
    ovld_opq_progress(js, j);
}

/* ------------------------------------------------------------------ join */

typedef struct setup_ctx {
    ovld_jobs_t *js;
    ovld_job_t *j;
} setup_ctx_t;

static ovld_op_t *op_append(ovld_job_t *j, uint64_t seq, uint32_t first_rank)
{
    ovld_op_t *op = calloc(1, sizeof(*op) + j->world * sizeof(op->subs[0]));
    if (!op)
        return NULL;
    op->seq = seq;
    op->first_rank = first_rank;
    if (j->ops_tail)
        j->ops_tail->next = op;
    else
        j->ops = op;
    j->ops_tail = op;
    j->in_flight++; /* the job outlives the op's completions */
    return op;
}

/* A refusal rung without an op record (out of memory for one). */
typedef struct refusal {
    ovld_jobs_t *js;
    ovld_job_t *j;
    ovld_issue_t it;
    ovld_exec_ring_t ring;
    char msg[256];
} refusal_t;

static void refusal_issued(ovld_issue_t *it)
{
    refusal_t *rf = it->arg;
    ovld_jobs_t *js = rf->js;
    ovld_job_t *j = rf->j;
    free(rf);
    ovld_job_maybe_free(js, j);
}

/* Fails op seq for one rank alone. The refusal joins the job's queue as a
 * record of its own, so that its doorbell rings after the rank's earlier
 * ops and within the issue window (job_progress). Without memory for the
 * record it rings at once: out of order only if earlier ops of the rank
 * still wait in the queue. */
static void refuse(ovld_jobs_t *js, ovld_member_t *m, uint64_t seq, ovl_status_t st,
                   const char *msg)
{
    ovld_job_t *j = m->job;
    ovld_member_fail(m, seq, st, msg);
    ovld_count_error(js->counters, st);
    ovld_op_t *op = op_append(j, seq, m->rank);
    if (op) {
        op->refusal = true;
        op->st = st;
        snprintf(op->msg, sizeof(op->msg), "%s", msg);
        op->subs[m->rank].in = true;
        op->nin = 1;
        ovld_opq_progress(js, j);
        return;
    }
    ovld_ticket_t *t = calloc(1, sizeof(*t));
    if (!t) {
        log_error("job '%s': out of memory refusing op %" PRIu64, j->id, seq);
        return;
    }
    *t = (ovld_ticket_t){.kind = TICKET_REFUSAL, .m = m};
    j->in_flight++; /* the job outlives the completion */
    refusal_t *rf = calloc(1, sizeof(*rf));
    if (!rf) { /* rung from here, maybe ahead of ops on the lane */
        ovld_exec_ring_t ring = {.rank = m->brank, .cookie = t};
        ovld_exec_fail(js->backend, &ring, 1, seq, st, msg);
        return;
    }
    rf->js = js;
    rf->j = j;
    rf->ring = (ovld_exec_ring_t){.rank = m->brank, .cookie = t};
    snprintf(rf->msg, sizeof(rf->msg), "%s", msg);
    rf->it = (ovld_issue_t){.fail = true,
                            .rings = &rf->ring,
                            .nrings = 1,
                            .seq = seq,
                            .status = st,
                            .message = rf->msg,
                            .cb = refusal_issued,
                            .arg = rf};
    ovld_lane_submit(j->lane, js->backend, js->pool, &rf->it);
}

static void disagree(ovld_op_t *op, uint32_t r, const ovld_op_fields_t *mine)
{
    char what[32];
    uint64_t a, b;
    if (op->st != OVL_OK || !ovld_op_fields_differ(mine, &op->f, what, sizeof(what), &a, &b))
        return;
    op->st = OVL_ERR_MISMATCH;
    snprintf(op->msg, sizeof(op->msg),
             "ranks disagree on %s: rank %u has %" PRIu64 ", rank %u has %" PRIu64, what, r, a,
             op->first_rank, b);
}

/* Lets go of the buffers of a submission that will not be kept. */
static void uses_put(const ovld_op_desc_t *q)
{
    for (int b = 0; b < OVLD_BUF_COUNT; b++)
        ovld_buf_put(q->use[b].hold);
}

ovl_status_t ovld_job_submit(ovld_jobs_t *js, ovld_member_t *m, const ovld_op_desc_t *q,
                             const ovld_op_verdict_t *v, char *err, size_t errlen)
{
    ovld_job_t *j = m->job;
    char msg[256];
    if (q->seq != m->next_seq) {
        /* Op numbers are the client library's business; a wrong one means a
         * broken or hostile client, and ringing out of order would move the
         * doorbell backwards. */
        snprintf(err, errlen,
                 "op number %" PRIu64 " out of order on comm %" PRIu64 ": expected %" PRIu64,
                 q->seq, m->comm_id, m->next_seq);
        uses_put(q);
        return OVL_ERR_PROTOCOL;
    }
    m->next_seq++;

    if (j->state == OVLD_JOB_ABORTED || j->state == OVLD_JOB_ENDING) {
        snprintf(msg, sizeof(msg), "job %s: %s", ovld_job_state_name(j->state), j->last_error);
        uses_put(q);
        refuse(js, m, q->seq, OVL_ERR_ABORTED, msg);
        return OVL_OK;
    }

    /* in range when valid; an invalid op only fails, and its fields are
     * never compared (op->st is set below). A valid op has a kind of the
     * table (request.c checked it); an invalid one may have none. */
    const ovld_kind_t *kind = ovld_kind(q->kind);
    if (!kind && v->fields == OVL_OK) {
        snprintf(err, errlen, "op %" PRIu64 " on comm %" PRIu64 ": no op kind %u", q->seq,
                 m->comm_id, q->kind);
        uses_put(q);
        return OVL_ERR_PROTOCOL;
    }
    ovld_op_fields_t mine = {.kind = q->kind}; /* an invalid op's: never compared */
    if (kind)
        kind->fields(q, v->fields == OVL_OK, &mine);
    ovld_op_t *op = j->ops;
    while (op && (op->seq != q->seq || op->refusal))
        op = op->next;
    if (!op) {
        /* Only ops still waiting for ranks count: issued ones are bounded by
         * the clients' own throttle (libovl waits for done before it goes
         * past max_in_flight), and their completions may reach this thread
         * after the client saw its doorbell rung. */
        uint32_t pending = 0;
        for (ovld_op_t *o = j->ops; o; o = o->next)
            pending += op_pending(o);
        /* The client throttles to the window it was told; a reload may
         * have changed the setting since. */
        uint32_t limit =
            m->window > js->cfg->max_ops_in_flight ? m->window : js->cfg->max_ops_in_flight;
        if (pending >= limit) {
            snprintf(msg, sizeof(msg),
                     "rank %u is more than %u ops ahead of the others (max_ops_in_flight)", m->rank,
                     limit);
            /* The ranks no longer agree on op numbers: nothing can be matched
             * again, so the job ends here rather than later and worse. Its
             * pending ops fail first, so that this rank's doorbell rings in
             * order. */
            ovld_job_end(j, OVLD_JOB_ABORTED, msg);
            log_warn("job '%s': aborted: %s", j->id, msg);
            uses_put(q);
            ovld_opq_progress(js, j);
            refuse(js, m, q->seq, OVL_ERR_LIMIT, msg);
            return OVL_OK;
        }
        op = op_append(j, q->seq, m->rank);
        if (!op) {
            uses_put(q);
            refuse(js, m, q->seq, OVL_ERR_NOMEM, "ovld: out of memory");
            return OVL_OK;
        }
        op->f = mine;
    } else {
        if (op->subs[m->rank].in) { /* cannot happen: seq is checked above */
            snprintf(err, errlen, "op %" PRIu64 " submitted twice", q->seq);
            uses_put(q);
            return OVL_ERR_INTERNAL;
        }
        if (v->fields == OVL_OK) /* an invalid op fails below, as itself */
            disagree(op, m->rank, &mine);
    }
    ovld_sub_t *s = &op->subs[m->rank];
    s->in = true;
    if (++op->nin == j->world)
        op->ready_ns = ovl_mono_ns();
    if (v->fields != OVL_OK && op->st == OVL_OK) {
        op->st = v->fields;
        snprintf(op->msg, sizeof(op->msg), "rank %u: %s", m->rank, v->fields_msg);
    }
    if (v->bufs != OVL_OK && op->st == OVL_OK) {
        op->st = v->bufs;
        snprintf(op->msg, sizeof(op->msg), "rank %u: %s", m->rank, v->bufs_msg);
    }
    if (kind && j->across && !kind->across && op->st == OVL_OK) {
        op->st = OVL_ERR_UNSUPPORTED;
        snprintf(op->msg, sizeof(op->msg),
                 "an op of kind %s cannot run in a job across nodes: its plans are of one node",
                 ovl_op_kind_name((ovl_op_kind_t)kind->id));
    }
    if (op->st == OVL_OK)
        memcpy(s->use, q->use, sizeof(s->use)); /* the op holds them now */
    else
        uses_put(q);
    ovld_opq_progress(js, j);
    return OVL_OK;
}

void ovld_job_fail_pending(ovld_jobs_t *js, ovl_status_t status, const char *why)
{
    for (ovld_job_t *j = js->live; j; j = j->next) {
        for (ovld_op_t *op = j->ops; op; op = op->next)
            if (!op->issued && op->st == OVL_OK) {
                op->st = status;
                snprintf(op->msg, sizeof(op->msg), "%s", why);
            }
        if (j->state != OVLD_JOB_ABORTED) {
            j->state = OVLD_JOB_ABORTED;
            snprintf(j->last_error, sizeof(j->last_error), "%s", why);
        }
        ovld_opq_progress(js, j);
    }
}

uint32_t ovld_job_running(const ovld_jobs_t *js)
{
    uint32_t n = 0;
    for (const ovld_job_t *j = js->live; j; j = j->next)
        n += j->in_flight + j->setup_pending;
    for (const ovld_job_t *j = js->dead; j; j = j->next)
        n += j->in_flight + j->setup_pending;
    return n;
}

bool ovld_opq_pending(const ovld_job_t *j)
{
    for (const ovld_op_t *op = j->ops; op; op = op->next)
        if (op_pending(op))
            return true;
    return false;
}

void ovld_opq_fail_waiting(ovld_job_t *j, ovl_status_t status, const char *msg)
{
    for (ovld_op_t *op = j->ops; op; op = op->next)
        if (op_pending(op)) {
            op->st = status;
            snprintf(op->msg, sizeof(op->msg), "%s", msg);
        }
}

/* ------------------------------------------ what is left of a job fails */

void ovld_job_fail_rest(ovld_jobs_t *js, ovld_job_t *j, ovl_status_t status, const char *what,
                        const char *why)
{
    char msg[300];
    snprintf(msg, sizeof(msg), "%s: %s", what, why);
    j->pins++;
    ovld_opq_fail_waiting(j, status, msg);
    ovld_opq_progress(js, j);
    j->pins--;
    ovld_job_maybe_free(js, j);
}

void ovld_job_abort_across(ovld_jobs_t *js, ovld_job_t *j, ovl_status_t status, const char *why,
                           bool tell)
{
    bool was = j->state == OVLD_JOB_ABORTED;
    if (!was) {
        ovld_job_end(j, OVLD_JOB_ABORTED, why);
        log_warn("job '%s': aborted: %s", j->id, why);
    }
    if (tell)
        js->across.leave(js->across.ctx, j->nonce, UINT32_MAX, true, why);
    if (was)
        return;
    /* What waits on the other nodes stops waiting: the issued ops complete
     * (failed), and nothing hangs. */
    if (j->xfer)
        ovld_xfer_job_abort(j->xfer, status, why);
    if (js->backend->ops->job_abort && j->started) {
        ovld_rank_t **ranks = calloc(j->world, sizeof(*ranks));
        uint32_t n = 0;
        for (uint32_t r = 0; ranks && r < j->world; r++)
            if (j->members[r])
                ranks[n++] = j->members[r]->brank;
        if (ranks)
            js->backend->ops->job_abort(js->backend, ranks, n);
        else
            log_error("job '%s': out of memory aborting its communicators", j->id);
        free(ranks);
    }
    ovld_job_fail_rest(js, j, status, "job aborted", why);
}

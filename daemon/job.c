/*
 * job.c: see job.h.
 */
#include "job.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "doorbell.h"
#include "exec.h"
#include "log.h"
#include "plan.h"
#include "clock.h"

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
    ovld_reg_t *reg[OVLD_BUF_COUNT]; /* each holds a reference */
    uint64_t off[OVLD_BUF_COUNT];
    uint64_t ld[OVLD_BUF_COUNT];
} ovld_sub_t;

static const char *const buf_names[] = {"a", "b", "c", "a_out"};
_Static_assert(sizeof(buf_names) / sizeof(buf_names[0]) == OVLD_BUF_COUNT,
               "a name for every buffer");

typedef struct ovld_op {
    uint64_t seq;
    uint32_t nin;    /* ranks whose submission is in */
    uint32_t nrung;  /* ranks whose done was (or will be) rung */
    uint32_t ndone;  /* of those, ranks whose done came back */
    bool issued;     /* run or failed: doorbells rung */
    bool windowed;   /* counted in j->running until its completions are in */
    bool refusal;    /* one rank's submission refused: never matched by seq */
    bool ringing;    /* its doorbells are being rung: completions that come
                        back at once (a backend out of memory) are counted,
                        and the ringer ends the op (op_rung) */
    ovl_status_t st; /* why it fails, if it does */
    char msg[256];
    /* what every rank must agree on, from the first submission */
    uint64_t m, n, k;
    uint32_t dtype, algo, chunks, streams;
    bool transb, has_aout;
    uint32_t first_rank;
    ovl_algo_t ran_algo; /* the algorithm that ran (AUTO resolved) */
    uint64_t ready_ns;   /* when the last rank's submission came in */
    struct ovld_op *next;
    ovld_sub_t subs[];
} ovld_op_t;

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

static void member_error(ovld_member_t *m, uint64_t seq, ovl_status_t st, const char *msg)
{
    if (m->err != OVL_OK)
        return;
    m->err = st;
    m->err_seq = seq;
    snprintf(m->err_msg, sizeof(m->err_msg), "%s", msg);
}

static void reg_put(ovld_t *d, ovld_reg_t *reg)
{
    if (!reg)
        return;
    if (--reg->refs == 1 && reg->on_idle && !reg->idle_posted) {
        /* Its deregistration can be answered now: by the loop, after this
         * completion has returned (server.c), never from inside it. */
        reg->idle_posted = true;
        reg->idle_next = d->idle_regs;
        d->idle_regs = reg;
        return;
    }
    if (reg->refs > 0)
        return;
    d->backend->ops->mem_release(d->backend, reg->bmem, false);
    free(reg);
}

static void op_free(ovld_t *d, ovld_job_t *j, ovld_op_t *op)
{
    for (uint32_t r = 0; r < j->world; r++)
        for (int b = 0; b < OVLD_BUF_COUNT; b++)
            reg_put(d, op->subs[r].reg[b]);
    free(op);
}

static void job_unlink(ovld_job_t **list, ovld_job_t *j)
{
    for (ovld_job_t **pp = list; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            return;
        }
}

static void job_free(ovld_t *d, ovld_job_t *j)
{
    if (j->detached) {
        job_unlink(&d->dead_jobs, j);
    } else {
        job_unlink(&d->jobs, j);
        d->njobs--;
    }
    ovld_rank_t **ranks = calloc(j->world, sizeof(*ranks));
    for (uint32_t r = 0; r < j->world; r++) {
        ovld_member_t *m = j->members[r];
        if (!m)
            continue;
        if (ranks && d->backend->ops->job_teardown)
            ranks[r] = m->brank;
        else
            d->backend->ops->rank_destroy(d->backend, m->brank);
        free(m);
    }
    if (ranks && d->backend->ops->job_teardown)
        d->backend->ops->job_teardown(d->backend, ranks, j->world);
    free(ranks);
    free(j->members);
    free(j);
}

/* Whether any rank's client is still connected. */
static bool job_has_clients(const ovld_job_t *j)
{
    for (uint32_t r = 0; r < j->world; r++)
        if (j->members[r] && j->members[r]->conn)
            return true;
    return false;
}

/* A job with nobody in it and nothing running goes away. */
static void job_maybe_free(ovld_t *d, ovld_job_t *j)
{
    if (job_has_clients(j))
        return;
    if (!j->detached) {
        /* Nobody is left: the id is free for a new job at once, while this
         * one waits on the side for its last completions. */
        job_unlink(&d->jobs, j);
        d->njobs--;
        j->detached = true;
        j->next = d->dead_jobs;
        d->dead_jobs = j;
        log_info("job '%s': ended after %" PRIu64 " ops", j->id, j->ops_done);
    }
    if (j->in_flight > 0 || j->setup_pending || j->pins > 0)
        return;
    job_free(d, j);
}

static ovld_job_t *job_find(ovld_t *d, uid_t owner, const char *id)
{
    for (ovld_job_t *j = d->jobs; j; j = j->next)
        if (j->owner == owner && strcmp(j->id, id) == 0)
            return j;
    return NULL;
}

static void op_complete(ovld_t *d, ovld_job_t *j, ovld_op_t *op);

/* An op still waiting in the queue for its ranks or its turn (refusals,
 * one rank's alone, are not ops the job waits for). */
static bool op_pending(const ovld_op_t *op)
{
    return !op->issued && !op->refusal;
}

/* The ringer is done with op: end it if its completions are all in. */
static void op_rung(ovld_t *d, ovld_job_t *j, ovld_op_t *op)
{
    op->ringing = false;
    if (op->ndone >= op->nrung)
        op_complete(d, j, op);
}

/* Rings done with op->st on every rank that submitted op (or every joined
 * rank when all did); completions come back through ovld_job_on_done. */
static void op_fail(ovld_t *d, ovld_job_t *j, ovld_op_t *op)
{
    op->issued = true;
    if (!op->refusal) {
        snprintf(j->last_error, sizeof(j->last_error), "op %" PRIu64 ": %s", op->seq, op->msg);
        log_warn("job '%s': op %" PRIu64 " failed: %s", j->id, op->seq, op->msg);
    }
    for (uint32_t r = 0; r < j->world; r++)
        op->nrung += op->subs[r].in && j->members[r];
    /* Its rings are stream work like an op's: they count against the same
     * window (job_progress). A record always has a ring: it exists because
     * a rank submitted, and members stay until the job is freed. */
    op->windowed = true;
    j->running++;
    op->ringing = true;
    for (uint32_t r = 0; r < j->world; r++) {
        ovld_member_t *m = j->members[r];
        if (!op->subs[r].in || !m)
            continue;
        member_error(m, op->seq, op->st, op->msg);
        op->subs[r].ticket = (ovld_ticket_t){.kind = TICKET_OP, .m = m, .op = op};
        d->backend->ops->done(m->brank, 0, op->seq, op->st, op->msg, &op->subs[r].ticket);
    }
    op_rung(d, j, op);
}

/* Resolves one rank's views and builds its plan. */
static ovl_status_t op_prepare_rank(ovld_t *d, ovld_job_t *j, ovld_op_t *op, uint32_t r,
                                    const ovl_plan_params_t *pp, ovl_plan_t *plan,
                                    ovld_exec_rank_t *x)
{
    /* The plan's name of each buffer an op gives. */
    static const ovl_buf_t plan_buf[OVLD_BUF_COUNT] = {
        [OVLD_BUF_A] = OVL_BUF_A,
        [OVLD_BUF_B] = OVL_BUF_B,
        [OVLD_BUF_C] = OVL_BUF_C,
        [OVLD_BUF_AOUT] = OVL_BUF_G,
    };
    ovld_sub_t *s = &op->subs[r];
    ovl_plan_params_t p = *pp;
    p.rank = r;
    ovl_status_t st = ovl_plan_build(&p, plan);
    if (st != OVL_OK) {
        snprintf(op->msg, sizeof(op->msg), "planner refused rank %u: %s", r, ovl_strerror(st));
        return st;
    }
    for (int b = 0; b < OVLD_BUF_COUNT; b++)
        if (s->reg[b])
            x->buf[plan_buf[b]] =
                (ovld_view_t){.ptr = (char *)s->reg[b]->ptr + s->off[b], .ld = s->ld[b]};
    x->rank = j->members[r]->brank;
    x->plan = plan;
    s->ticket = (ovld_ticket_t){.kind = TICKET_OP, .m = j->members[r], .op = op};
    x->cookie = &s->ticket;
    if (plan->scratch_bytes) {
        if (plan->scratch_bytes > j->scratch_bytes && j->running > 0) {
            /* job_progress holds such an op back until nothing runs: the
             * backend would free scratch that issued ops still use */
            snprintf(op->msg, sizeof(op->msg),
                     "internal error: scratch would grow under %u running ops", j->running);
            return OVL_ERR_INTERNAL;
        }
        st = d->backend->ops->rank_scratch(d->backend, x->rank, plan->scratch_bytes,
                                           &x->buf[OVL_BUF_G].ptr);
        if (st != OVL_OK) {
            snprintf(op->msg, sizeof(op->msg), "rank %u: scratch of %" PRIu64 " bytes: %s", r,
                     plan->scratch_bytes, ovl_strerror(st));
            return st;
        }
        x->buf[OVL_BUF_G].ld = plan->bufs[OVL_BUF_G].cols; /* scratch is dense */
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

void ovld_plan_resolve(const ovld_t *d, ovl_plan_params_t *p)
{
    /* How A is gathered: the operator's preference; a backend without a
     * collective gathers by pulls. */
    if (p->allgather == OVL_AG_AUTO)
        p->allgather = d->cfg.allgather;
    if (!d->backend || !d->backend->ops->allgather)
        p->allgather = OVL_AG_COPY;
    if (!p->chunks)
        p->chunks = d->cfg.default_chunks;
    if (!p->streams)
        p->streams = d->cfg.default_streams;
    if (p->algo == OVL_ALGO_AUTO)
        p->algo = d->cfg.default_algo;
    if (p->algo == OVL_ALGO_AUTO)
        p->algo = ovl_plan_choose(p);
}

static void plans_free(ovl_plan_t *plans, uint32_t n)
{
    for (uint32_t r = 0; plans && r < n; r++)
        ovl_plan_free(&plans[r]);
    free(plans);
}

/* op's plan parameters, resolved: the one place they are made. */
static void op_params(const ovld_t *d, const ovld_job_t *j, const ovld_op_t *op,
                      ovl_plan_params_t *pp)
{
    *pp = (ovl_plan_params_t){
        .algo = (ovl_algo_t)op->algo,
        .world = j->world,
        .m = op->m,
        .n = op->n,
        .k = op->k,
        .dtype = (ovl_dtype_t)op->dtype,
        .chunks = op->chunks,
        .streams = op->streams,
        .want_gathered = op->has_aout,
        .transb = op->transb,
    };
    /* NCCL moves a rank's rows only as one dense piece: an A or a_out of
     * any rank whose leading dimension is not k makes the plans gather by
     * the copy engine. */
    for (uint32_t r = 0; r < j->world; r++) {
        const ovld_sub_t *s = &op->subs[r];
        if ((s->reg[OVLD_BUF_A] && s->ld[OVLD_BUF_A] != op->k) ||
            (s->reg[OVLD_BUF_AOUT] && s->ld[OVLD_BUF_AOUT] != op->k))
            pp->strided = true;
    }
    ovld_plan_resolve(d, pp);
}

static void op_run(ovld_t *d, ovld_job_t *j, ovld_op_t *op, const ovl_plan_params_t *params)
{
    uint64_t t0 = ovl_mono_ns();
    ovl_plan_params_t pp = *params;
    op->ran_algo = pp.algo;

    /* Plans live only while the executor walks them: backends copy what they
     * need into their own work items. */
    ovld_exec_rank_t *xr = calloc(j->world, sizeof(*xr));
    ovl_plan_t *plans = calloc(j->world, sizeof(*plans));
    if (!xr || !plans) {
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
    for (uint32_t r = 0; r < j->world; r++) {
        op->st = op_prepare_rank(d, j, op, r, &pp, &plans[r], &xr[r]);
        if (op->st != OVL_OK)
            goto fail;
    }
    ovld_exec_op_t x = {.seq = op->seq, .world = j->world, .ranks = xr};
    op->issued = true;
    op->windowed = true;
    op->nrung = j->world;
    j->running++;
    if (scratch > j->scratch_bytes)
        j->scratch_bytes = scratch; /* every rank holds it now */
    char err[256] = "";
    op->ringing = true;
    ovl_status_t st = ovld_exec_run(d->exec_pool, d->backend, &x, err, sizeof(err));
    ovld_count_issue(&d->counters, ovl_mono_ns() - t0);
    if (st != OVL_OK) {
        /* the executor rang every doorbell with the error */
        op->st = st;
        snprintf(op->msg, sizeof(op->msg), "%s", err);
        log_error("job '%s': op %" PRIu64 ": %s", j->id, op->seq, err);
    } else {
        log_debug("job '%s': op %" PRIu64 " issued (%s, m=%" PRIu64 " n=%" PRIu64 " k=%" PRIu64 ")",
                  j->id, op->seq, ovl_algo_name(pp.algo), op->m, op->n, op->k);
    }
    plans_free(plans, j->world);
    free(xr);
    op_rung(d, j, op);
    return;
fail:
    plans_free(plans, j->world);
    free(xr);
    op_fail(d, j, op);
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
_Static_assert(OVLD_MAX_ISSUED + 2 <= OVL_READY_SLOTS,
               "a dying client's late ready writes must not reach a waiting op's slot");

static void job_progress(ovld_t *d, ovld_job_t *j)
{
    /* A completion delivered at once (a backend out of memory) can end ops,
     * and run this again, under the call: the job stays, and the scan starts
     * over after each op it runs or fails. */
    j->pins++;
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
        } else if (!op->refusal && (op->nin < j->world || j->state != OVLD_JOB_READY)) {
            break; /* later ops wait for this one */
        }
        if (j->running >= OVLD_MAX_ISSUED)
            break; /* resumes from ovld_job_on_done */
        ovl_plan_params_t pp;
        if (op->st == OVL_OK)
            op_params(d, j, op, &pp);
        if (op->st == OVL_OK && j->running > 0 && needs_scratch_growth(j, &pp))
            break; /* resumes from ovld_job_on_done */
        if (op->st != OVL_OK)
            op_fail(d, j, op);
        else
            op_run(d, j, op, &pp);
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

static void on_done_op(ovld_t *d, ovld_job_t *j, ovld_member_t *m, ovld_op_t *op, uint64_t seq,
                       ovl_status_t status, const char *message);

void ovld_job_on_done(void *arg, void *cookie, uint64_t seq, ovl_status_t status,
                      const char *message)
{
    ovld_t *d = arg;
    ovld_ticket_t *t = cookie;
    ovld_member_t *m = t->m;
    ovld_job_t *j = m->job;
    if (status != OVL_OK)
        member_error(m, seq, status, message);
    if (t->kind == TICKET_REFUSAL) {
        free(t);
        j->in_flight--;
        job_maybe_free(d, j);
        return;
    }
    /* Completing the op runs the next ones of the queue, whose failures
     * can complete at once (a backend out of memory): the job stays until
     * this function is done with it. (A deregistration that the op's
     * buffers let go is answered by the loop afterwards, not from here.) */
    j->pins++;
    on_done_op(d, j, m, t->op, seq, status, message);
    j->pins--;
    job_maybe_free(d, j);
}

static void on_done_op(ovld_t *d, ovld_job_t *j, ovld_member_t *m, ovld_op_t *op, uint64_t seq,
                       ovl_status_t status, const char *message)
{
    if (status != OVL_OK && op->st == OVL_OK) {
        op->st = status;
        snprintf(op->msg, sizeof(op->msg), "%s", message);
        snprintf(j->last_error, sizeof(j->last_error), "op %" PRIu64 ": %s", seq, message);
        log_error("job '%s': op %" PRIu64 " failed on rank %u: %s", j->id, seq, m->rank, message);
    }
    if (++op->ndone < op->nrung || !op->issued || op->ringing)
        return;
    op_complete(d, j, op);
}

/* All of op's completions are in: count it, free it, and let the next ops
 * go. */
static void op_complete(ovld_t *d, ovld_job_t *j, ovld_op_t *op)
{
    if (op->windowed)
        j->running--;
    if (op->st == OVL_OK)
        j->ops_done++;
    if (!op->refusal) /* a refusal was counted as an error when it was made */
        ovld_count_op(&d->counters, op->ran_algo, (ovl_dtype_t)op->dtype, j->world, op->m, op->n,
                      op->k, ovl_mono_ns() - op->ready_ns, op->st);
    j->in_flight--;
    op_unlink(j, op);
    op_free(d, j, op);
    job_progress(d, j);
}

/* ------------------------------------------------------------------ join */

typedef struct setup_ctx {
    ovld_t *d;
    ovld_job_t *j;
} setup_ctx_t;

static void on_setup(void *arg, ovl_status_t st, const char *msg)
{
    setup_ctx_t *sc = arg;
    ovld_t *d = sc->d;
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
    job_progress(d, j);
    job_maybe_free(d, j);
}

/* Every rank is in: let the backend prepare what the ranks share. */
static void job_start(ovld_t *d, ovld_job_t *j)
{
    if (!d->backend->ops->job_setup) {
        j->state = OVLD_JOB_READY;
        return;
    }
    ovld_rank_t **ranks = calloc(j->world, sizeof(*ranks));
    setup_ctx_t *sc = calloc(1, sizeof(*sc));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (ranks && sc) {
        for (uint32_t r = 0; r < j->world; r++)
            ranks[r] = j->members[r]->brank;
        sc->d = d;
        sc->j = j;
        j->state = OVLD_JOB_SETUP;
        j->setup_pending = true;
        st = d->backend->ops->job_setup(d->backend, ranks, j->world, on_setup, sc);
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
static uint32_t uid_ranks(const ovld_t *d, uid_t uid)
{
    uint32_t n = 0;
    for (const ovld_job_t *j = d->jobs; j; j = j->next)
        n += j->owner == uid ? j->joined : 0;
    for (const ovld_job_t *j = d->dead_jobs; j; j = j->next)
        n += j->owner == uid ? j->joined : 0;
    return n;
}

ovl_status_t ovld_job_join(ovld_t *d, ovld_conn_t *c, const ovld_join_desc_t *req,
                           ovld_member_t **ret_member, ovld_doorbell_export_t *ret_db, char *err,
                           size_t errlen)
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
    int found = ovld_backend_device_by_uuid(d->backend, req->device_uuid, OVLD_UUID_LEN);
    if (found < 0) {
        char u[64];
        ovld_uuid_format(req->device_uuid, "", u, sizeof(u));
        snprintf(err, errlen, "no device with UUID %s on this node", u);
        return OVL_ERR_NOT_FOUND;
    }
    uint32_t dev = (uint32_t)found;

    /* Ranks hold device resources (streams, events, workspaces): a user's
     * are bounded, those of its jobs still completing included. */
    uint32_t ranks = uid_ranks(d, c->uid);
    if (ranks >= d->cfg.max_ranks_per_uid) {
        snprintf(err, errlen, "uid %u holds %u ranks (max_ranks_per_uid = %u)", (unsigned)c->uid,
                 ranks, d->cfg.max_ranks_per_uid);
        return OVL_ERR_LIMIT;
    }
    /* Job ids are a namespace of each uid: another user's "train" is
     * another job, so that nobody can claim an id before its owner does. */
    ovld_job_t *j = job_find(d, c->uid, id);
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
                     j->members[rank]->conn ? (int)j->members[rank]->conn->pid : -1);
            return OVL_ERR_EXISTS;
        }
        for (uint32_t r = 0; r < j->world; r++)
            if (j->members[r] && j->members[r]->device == dev) {
                snprintf(err, errlen, "device %u is already used by rank %u of job '%s'", dev, r,
                         id);
                return OVL_ERR_EXISTS;
            }
    } else {
        if (d->njobs >= d->cfg.max_jobs) {
            snprintf(err, errlen, "too many jobs (max_jobs = %u)", d->cfg.max_jobs);
            return OVL_ERR_LIMIT;
        }
        uint32_t mine = 0;
        for (ovld_job_t *o = d->jobs; o; o = o->next)
            mine += o->owner == c->uid;
        if (mine >= d->cfg.max_jobs_per_uid) {
            snprintf(err, errlen, "uid %u has %u jobs (max_jobs_per_uid = %u)", (unsigned)c->uid,
                     mine, d->cfg.max_jobs_per_uid);
            return OVL_ERR_LIMIT;
        }
        j = calloc(1, sizeof(*j));
        if (!j || !(j->members = calloc(world, sizeof(*j->members)))) {
            free(j);
            snprintf(err, errlen, "out of memory");
            return OVL_ERR_NOMEM;
        }
        memcpy(j->id, id, idlen + 1);
        j->owner = c->uid;
        j->world = world;
        j->state = OVLD_JOB_FORMING;
        j->next = d->jobs;
        d->jobs = j;
        d->njobs++;
        created = true;
    }

    ovld_member_t *m = calloc(1, sizeof(*m));
    ovl_status_t st = OVL_ERR_NOMEM;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    m->job = j;
    m->conn = c;
    m->rank = rank;
    m->device = dev;
    m->next_seq = 1;
    m->window = d->cfg.max_ops_in_flight;
    errno = 0;
    st = d->backend->ops->rank_create(d->backend, dev, &m->brank, ret_db);
    if (st != OVL_OK) {
        /* a system call's errno says why (ENOMEM from mmap: the process is
         * out of memory maps, vm.max_map_count) */
        int e = errno;
        snprintf(err, errlen, "device %u: cannot set up the rank: %s%s%s%s", dev, ovl_strerror(st),
                 st == OVL_ERR_SYSTEM && e ? ": " : "",
                 st == OVL_ERR_SYSTEM && e ? strerror(e) : "",
                 st == OVL_ERR_SYSTEM && e == ENOMEM
                     ? " (out of memory maps? see vm.max_map_count and max_mappings)"
                     : "");
        free(m);
        goto fail;
    }
    m->comm_id = ++d->next_comm_id;
    j->members[rank] = m;
    j->joined++;
    if (j->joined == j->world)
        job_start(d, j);
    m->conn_next = c->members;
    c->members = m;
    log_info("job '%s': rank %u/%u joined on device %u (pid %d, uid %u)%s", j->id, m->rank,
             j->world, dev, (int)c->pid, (unsigned)c->uid,
             j->state == OVLD_JOB_READY ? "; all ranks in" : "");
    *ret_member = m;
    return OVL_OK;
fail:
    if (created)
        job_free(d, j);
    return st;
}

ovld_member_t *ovld_job_member(ovld_conn_t *c, uint64_t comm_id)
{
    for (ovld_member_t *m = c->members; m; m = m->conn_next)
        if (m->comm_id == comm_id)
            return m;
    return NULL;
}

void ovld_job_leave(ovld_t *d, ovld_member_t *m, const char *why)
{
    ovld_job_t *j = m->job;
    ovld_conn_t *c = m->conn;
    if (c) {
        for (ovld_member_t **pp = &c->members; *pp; pp = &(*pp)->conn_next)
            if (*pp == m) {
                *pp = m->conn_next;
                break;
            }
    }
    m->conn = NULL;
    m->conn_next = NULL;
    /* Its client will never say ready for ops already issued: let them run
     * (on whatever its buffers hold) so that they complete and peers are
     * not left waiting in a collective. Whether or not any are issued: the
     * release also ends what the client's own stream may still wait for
     * (a dying process's stream can hold the GPU up). */
    if (d->backend->ops->rank_release)
        d->backend->ops->rank_release(d->backend, m->brank, m->next_seq - 1);
    bool others = job_has_clients(j); /* m->conn is NULL by now */
    bool pending = false;
    for (ovld_op_t *op = j->ops; op; op = op->next)
        pending = pending || op_pending(op);
    bool live =
        j->state == OVLD_JOB_FORMING || j->state == OVLD_JOB_SETUP || j->state == OVLD_JOB_READY;
    if (others && !pending && live) {
        /* A rank that leaves with nothing pending ends the job quietly; ops
         * submitted after this fail, since the rank will not take part. */
        j->state = OVLD_JOB_ENDING;
        snprintf(j->last_error, sizeof(j->last_error), "rank %u left the job (%s)", m->rank, why);
        log_info("job '%s': rank %u left (%s); the job takes no more ops", j->id, m->rank, why);
    } else if (pending && j->state != OVLD_JOB_ABORTED) {
        /* Nobody else may be connected: the pending ops still fail, so that
         * they do not hold the job, its rank and their buffers for ever. */
        j->state = OVLD_JOB_ABORTED;
        snprintf(j->last_error, sizeof(j->last_error), "rank %u left the job (%s)", m->rank, why);
        log_warn("job '%s': aborted: rank %u left (%s) with ops pending", j->id, m->rank, why);
        for (ovld_op_t *op = j->ops; op; op = op->next)
            if (op_pending(op)) {
                op->st = OVL_ERR_ABORTED;
                snprintf(op->msg, sizeof(op->msg), "job aborted: rank %u left (%s)", m->rank, why);
            }
        job_progress(d, j);
    } else {
        log_info("job '%s': rank %u left (%s)", j->id, m->rank, why);
    }
    job_maybe_free(d, j);
}

/* --------------------------------------------------------------- submit */

static ovl_status_t resolve(ovld_conn_t *c, const ovld_buf_ref_t *ref, int which, uint64_t rows,
                            uint64_t cols, size_t elem, int device, ovld_sub_t *s, char *msg,
                            size_t len)
{
    uint64_t ld = ref->ld;
    if (!ref->given) {
        snprintf(msg, len, "%s: no buffer given", buf_names[which]);
        return OVL_ERR_INVALID;
    }
    ovld_reg_t *reg = ovld_registry_find(&c->reg, ref->mem_id);
    if (!reg) {
        snprintf(msg, len, "%s: buffer %" PRIu64 " is not registered on this connection",
                 buf_names[which], ref->mem_id);
        return OVL_ERR_NOT_FOUND;
    }
    if (reg->device >= 0 && reg->device != device) {
        snprintf(msg, len, "%s: buffer %" PRIu64 " is on device %d, the comm on device %d",
                 buf_names[which], ref->mem_id, reg->device, device);
        return OVL_ERR_INVALID;
    }
    ovl_status_t st = ovld_range_check(reg->bytes, ref->offset, rows, cols, ld, elem);
    if (st == OVL_ERR_INVALID) {
        snprintf(msg, len, "%s: leading dimension %" PRIu64 " is less than its %" PRIu64 " columns",
                 buf_names[which], ld, cols);
        return st;
    }
    if (st != OVL_OK) {
        snprintf(msg, len,
                 "%s: %" PRIu64 " x %" PRIu64 " (ld %" PRIu64 ") at offset %" PRIu64
                 " lies outside its registration of %" PRIu64 " bytes",
                 buf_names[which], rows, cols, ld, ref->offset, reg->bytes);
        return st;
    }
    reg->refs++;
    s->reg[which] = reg;
    s->off[which] = ref->offset;
    s->ld[which] = ld;
    return OVL_OK;
}

/* Validates one rank's op against its own registrations. */
static ovl_status_t check_sub(ovld_member_t *m, const ovld_op_desc_t *q, ovld_sub_t *s, char *msg,
                              size_t len)
{
    /* dtype, algorithm, m, n, k, chunks and streams passed the boundary
     * (request.h); what is left depends on the job and the registrations */
    ovld_job_t *j = m->job;
    size_t elem = ovl_dtype_size((ovl_dtype_t)q->dtype);
    uint64_t rows_all;
    if (__builtin_mul_overflow(q->m, (uint64_t)j->world, &rows_all)) {
        snprintf(msg, len, "m * world overflows");
        return OVL_ERR_RANGE;
    }
    ovld_conn_t *c = m->conn;
    int dev = (int)m->device;
    ovl_status_t st;
    const ovld_buf_ref_t *b = q->buf;
    if ((st = resolve(c, &b[OVLD_BUF_A], OVLD_BUF_A, q->m, q->k, elem, dev, s, msg, len)) != OVL_OK)
        return st;
    if ((st = resolve(c, &b[OVLD_BUF_B], OVLD_BUF_B, q->transb ? q->n : q->k,
                      q->transb ? q->k : q->n, elem, dev, s, msg, len)) != OVL_OK)
        return st;
    if ((st = resolve(c, &b[OVLD_BUF_C], OVLD_BUF_C, rows_all, q->n, elem, dev, s, msg, len)) !=
        OVL_OK)
        return st;
    if (b[OVLD_BUF_AOUT].given && (st = resolve(c, &b[OVLD_BUF_AOUT], OVLD_BUF_AOUT, rows_all, q->k,
                                                elem, dev, s, msg, len)) != OVL_OK)
        return st;
    return OVL_OK;
}

/* A new op record at the tail of the job's queue, or NULL without memory. */
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

/* Fails op seq for one rank alone. The refusal joins the job's queue as a
 * record of its own, so that its doorbell rings after the rank's earlier
 * ops and within the issue window (job_progress). Without memory for the
 * record it rings at once: out of order only if earlier ops of the rank
 * still wait in the queue. */
static void refuse(ovld_t *d, ovld_member_t *m, uint64_t seq, ovl_status_t st, const char *msg)
{
    ovld_job_t *j = m->job;
    member_error(m, seq, st, msg);
    ovld_count_error(&d->counters, st);
    ovld_op_t *op = op_append(j, seq, m->rank);
    if (op) {
        op->refusal = true;
        op->st = st;
        snprintf(op->msg, sizeof(op->msg), "%s", msg);
        op->subs[m->rank].in = true;
        op->nin = 1;
        job_progress(d, j);
        return;
    }
    ovld_ticket_t *t = calloc(1, sizeof(*t));
    if (!t) {
        log_error("job '%s': out of memory refusing op %" PRIu64, j->id, seq);
        return;
    }
    *t = (ovld_ticket_t){.kind = TICKET_REFUSAL, .m = m};
    j->in_flight++; /* the job outlives the completion */
    d->backend->ops->done(m->brank, 0, seq, st, msg, t);
}

static void disagree(ovld_op_t *op, uint32_t r, const char *field, uint64_t mine, uint64_t theirs)
{
    if (mine == theirs || op->st != OVL_OK)
        return;
    op->st = OVL_ERR_MISMATCH;
    snprintf(op->msg, sizeof(op->msg),
             "ranks disagree on %s: rank %u has %" PRIu64 ", rank %u has %" PRIu64, field, r, mine,
             op->first_rank, theirs);
}

ovl_status_t ovld_job_submit(ovld_t *d, ovld_member_t *m, const ovld_op_desc_t *q,
                             ovl_status_t invalid, const char *invalid_msg, char *err,
                             size_t errlen)
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
        return OVL_ERR_PROTOCOL;
    }
    m->next_seq++;

    if (j->state == OVLD_JOB_ABORTED || j->state == OVLD_JOB_ENDING) {
        snprintf(msg, sizeof(msg), "job %s: %s", ovld_job_state_name(j->state), j->last_error);
        refuse(d, m, q->seq, OVL_ERR_ABORTED, msg);
        return OVL_OK;
    }

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
            m->window > d->cfg.max_ops_in_flight ? m->window : d->cfg.max_ops_in_flight;
        if (pending >= limit) {
            snprintf(msg, sizeof(msg),
                     "rank %u is more than %u ops ahead of the others (max_ops_in_flight)", m->rank,
                     limit);
            /* The ranks no longer agree on op numbers: nothing can be matched
             * again, so the job ends here rather than later and worse. Its
             * pending ops fail first, so that this rank's doorbell rings in
             * order. */
            j->state = OVLD_JOB_ABORTED;
            snprintf(j->last_error, sizeof(j->last_error), "%s", msg);
            log_warn("job '%s': aborted: %s", j->id, msg);
            job_progress(d, j);
            refuse(d, m, q->seq, OVL_ERR_LIMIT, msg);
            return OVL_OK;
        }
        op = op_append(j, q->seq, m->rank);
        if (!op) {
            refuse(d, m, q->seq, OVL_ERR_NOMEM, "ovld: out of memory");
            return OVL_OK;
        }
        op->m = q->m;
        op->n = q->n;
        op->k = q->k;
        /* in range when valid; an invalid op only fails, and its fields
         * are never compared (op->st is set below) */
        op->dtype = invalid == OVL_OK ? q->dtype : UINT32_MAX;
        op->algo = invalid == OVL_OK ? q->algo : UINT32_MAX;
        op->chunks = q->chunks;
        op->streams = q->streams;
        op->transb = q->transb;
        op->has_aout = q->buf[OVLD_BUF_AOUT].given;
    } else {
        if (op->subs[m->rank].in) { /* cannot happen: seq is checked above */
            snprintf(err, errlen, "op %" PRIu64 " submitted twice", q->seq);
            return OVL_ERR_INTERNAL;
        }
        if (invalid == OVL_OK) { /* an invalid op fails below, as itself */
            disagree(op, m->rank, "m", q->m, op->m);
            disagree(op, m->rank, "n", q->n, op->n);
            disagree(op, m->rank, "k", q->k, op->k);
            disagree(op, m->rank, "dtype", (uint64_t)q->dtype, op->dtype);
            disagree(op, m->rank, "transb", q->transb, op->transb);
            disagree(op, m->rank, "algo", (uint64_t)q->algo, op->algo);
            disagree(op, m->rank, "chunks", q->chunks, op->chunks);
            disagree(op, m->rank, "streams", q->streams, op->streams);
            disagree(op, m->rank, "a_out (given or not)", q->buf[OVLD_BUF_AOUT].given,
                     op->has_aout);
        }
    }
    ovld_sub_t *s = &op->subs[m->rank];
    s->in = true;
    if (++op->nin == j->world)
        op->ready_ns = ovl_mono_ns();
    if (invalid != OVL_OK && op->st == OVL_OK) {
        op->st = invalid;
        snprintf(op->msg, sizeof(op->msg), "rank %u: %s", m->rank, invalid_msg);
    }
    if (op->st == OVL_OK) {
        ovl_status_t st = check_sub(m, q, s, msg, sizeof(msg));
        if (st != OVL_OK) {
            op->st = st;
            snprintf(op->msg, sizeof(op->msg), "rank %u: %s", m->rank, msg);
        }
    }
    job_progress(d, j);
    return OVL_OK;
}

void ovld_job_fail_pending(ovld_t *d, ovl_status_t status, const char *why)
{
    for (ovld_job_t *j = d->jobs; j; j = j->next) {
        for (ovld_op_t *op = j->ops; op; op = op->next)
            if (!op->issued && op->st == OVL_OK) {
                op->st = status;
                snprintf(op->msg, sizeof(op->msg), "%s", why);
            }
        if (j->state != OVLD_JOB_ABORTED) {
            j->state = OVLD_JOB_ABORTED;
            snprintf(j->last_error, sizeof(j->last_error), "%s", why);
        }
        job_progress(d, j);
    }
}

uint32_t ovld_job_running(const ovld_t *d)
{
    uint32_t n = 0;
    for (const ovld_job_t *j = d->jobs; j; j = j->next)
        n += j->in_flight + j->setup_pending;
    for (const ovld_job_t *j = d->dead_jobs; j; j = j->next)
        n += j->in_flight + j->setup_pending;
    return n;
}

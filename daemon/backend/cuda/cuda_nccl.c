/*
 * cuda_nccl.c: communication in the CUDA backend: a job's NCCL
 * communicators and what moves rows over them.
 *
 *   job_key       ncclGetUniqueId into the 128 bytes that the daemon
 *                 coordinating a job across nodes hands to every node (this
 *                 process then serves the id's bootstrap root).
 *   job_setup     one NCCL communicator per local rank, all created
 *                 nonblocking in one group on a worker. Without net the
 *                 daemon serves the whole job: the worker makes the id, and
 *                 rank i of the call is rank i of n. With net the
 *                 communicator spans every node: net->world ranks, the
 *                 coordinator's id (net->key), each local rank at its job
 *                 rank (net->global[i]); or, where ranks share a GPU, its
 *                 rail group's (below). Each rank record keeps its job rank
 *                 and the world (global, world), which the collectives check
 *                 their parts against. Without collective and without net
 *                 nothing is made (the ranks share a GPU and the plans
 *                 gather by pulls); with net the communicators are made
 *                 whatever collective says.
 *   job_abort     a job across nodes lost a node: every given rank's
 *                 communicator is taken off the rank on the loop thread and
 *                 aborted (ncclCommAbort) on a worker, its ops in flight
 *                 complete with OVL_ERR_ABORTED (the completion and the
 *                 doorbell's error word), and its later collective calls
 *                 fail at once. A setup in progress is stopped instead
 *                 (its worker aborts what it made).
 *   job_teardown  finalize, then destroy (abort where the communicator
 *                 failed or the job was aborted), on a worker, once every
 *                 abort of the same ranks is over; then the ranks are freed.
 *   allgather     exactly the NCCL method the plan names, for the parts of
 *                 the local ranks (part.global is the communicator rank):
 *                 ncclAllGather, or grouped ncclSend/ncclRecv with every
 *                 other rank of the job (the own rows by a local copy), all
 *                 local parts in one group. Strided layouts and jobs
 *                 without NCCL are gathered by the plans' own pulls, never
 *                 here.
 *   rail          grouped ncclSend/ncclRecv between the job ranks the plan
 *                 names, on the job's communicator (its ranks are the job's)
 *                 or, where ranks share a GPU, on each rank's rail group's
 *                 (comm_rank_of translates).
 *   copy          the pulls (cudaMemcpy(2D)Async from a peer's mapping).
 *
 * Who may be inside NCCL on a rank's communicator (r->nccl), so that no two
 * threads ever are at once (API-NOTES 1.3; a safe abort needs it):
 *   - the setup worker, while r->setup_pending (code on the loop leaves the
 *     communicator alone then: the watchdog, job_abort);
 *   - then whoever holds r->nccl_mu: the issuing thread (issuer.h) for a
 *     collective call, from its checks to the end of its launch wait (the
 *     parts' ranks locked in part order); the watchdog's
 *     ncclCommGetAsyncError, which only tries the lock (the issuing
 *     thread polls the errors itself meanwhile);
 *   - an abort worker: job_abort (loop thread) sets r->aborted, so that
 *     collective calls fail at once with words and a launch wait stops,
 *     and hands the ranks to a worker, which takes each handle under
 *     nccl_mu (r->nccl = NULL) and aborts them;
 *   - the teardown worker, once the ranks are unlinked (the watchdog sees
 *     them no more), their job's lane is idle (no issue is left), and
 *     every abort of them is over (abort_pending; a teardown that comes
 *     earlier waits on the backend's deferred list).
 * Give job_abort every local rank of a job in one call: NCCL frees the
 * communicators of one process together, when the last is aborted or
 * destroyed, and two workers aborting siblings at once would race there.
 *
 * Ranks that share a GPU, across nodes. NCCL cannot put two ranks of one
 * GPU into one communicator, so there is no communicator of the job: the
 * coordinator sends one id per rail group instead (net->rail_keys), and
 * each local rank joins its group's communicator at its place in the group
 * (all in the same one group of inits). Ring's RAILs only name ranks of
 * the own group; rail translates them (comm_rank_of). An all-gather over
 * the job cannot run then (the planner plans none; here it is refused with
 * words). Refused at setup, with words through job_setup's callback: two
 * local ranks on one GPU in one communicator (the job's, or a rail group's
 * where nodes are uneven; the coordinator refuses the latter first).
 *
 * Launches run on an issuing thread, and a grouped launch on nonblocking
 * communicators always says ncclInProgress (NCCL finishes it on a thread of
 * its own), so launch_wait spins until every communicator took it, up to
 * NCCL_LAUNCH_LIMIT_NS, or until the job is aborted. Across nodes a launch
 * that needs a new connection (the first use of a peer, or of an
 * algorithm) completes only once the other nodes' daemons issued their
 * matching call too.
 */
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_internal.h"
#include "clock.h"
#include "doorbell.h"
#include "heap.h"

#define NCCL_LAUNCH_LIMIT_NS (5000ull * 1000 * 1000) /* a grouped launch's wait */
#define NCCL_WAIT_BATCH      64 /* communicators whose launch one nccl_wait call polls */
#define NCCL_SPIN_NS         (50ull * 1000 * 1000) /* a worker's wait spins this long, then naps */
#define NCCL_NAP_NS          (1000ull * 1000)      /* between its polls after that */

_Static_assert(sizeof(ncclUniqueId) == OVLD_NCCL_ID_LEN, "a job key is an ncclUniqueId");

/* --------------------------------------------------------------- words */

/* NCCL's last warning, as "; NCCL's last warning: ..." to end a message
 * with, or "" where there is none. ncclGetLastError reads one buffer of
 * the process (its argument is unused in 2.28), so the warning may be
 * another communicator's: the words say "last". */
static void nccl_last_words(char *buf, size_t len)
{
    const char *w = ncclGetLastError(NULL);
    if (w && w[0])
        snprintf(buf, len, "; NCCL's last warning: %.160s", w);
    else if (len)
        buf[0] = '\0';
}

/* --------------------------------------------------------------- NCCL */

/* A job's setup or teardown on a worker. */
typedef struct cuda_setup_work {
    uv_work_t req;
    cuda_backend_t *cb;
    struct ovld_rank **ranks;
    uint32_t n;
    ovld_setup_cb done;
    void *arg;
    ovl_status_t st; /* setup: set beforehand where it is refused */
    char msg[256];
    bool no_comms; /* setup: the job's plans never use the collective */
    /* setup: the job's ranks and each local rank's job rank; each local
     * rank's communicator: its ranks (comm_n), its place in it
     * (comm_rank) and its id (ids[comm_id]): the job's, one id, the
     * coordinator's or (have_id false) one the worker makes; or, where
     * ranks share a GPU, its rail group's, one id per group */
    uint32_t world;
    uint32_t *global; /* one block of 4 n: global, comm_n, comm_rank, comm_id */
    uint32_t *comm_n, *comm_rank, *comm_id;
    ncclUniqueId *ids;
    uint32_t nids;
    bool have_id;
    atomic_bool abort;            /* setup: job_abort came meanwhile */
    struct cuda_setup_work *next; /* teardown: on the backend's deferred list */
} setup_work_t;

/* Communicators taken off their ranks by job_abort, aborted on a worker. */
typedef struct abort_work {
    uv_work_t req;
    cuda_backend_t *cb;
    uint32_t n;
    struct ovld_rank **ranks; /* whose comms[i] it was (alive: teardown waits) */
    ncclComm_t *comms;
} abort_work_t;

/*
 * Waits for nonblocking communicators to leave ncclInProgress, until
 * deadline_ns (CLOCK_MONOTONIC; 0: no limit) or until *stop is set (NULL:
 * never), after which it returns ncclInProgress. A failure is returned at
 * once, with its communicator's index in *ret_bad. Without a deadline the
 * caller is a worker that may wait long (a job's other nodes joining): it
 * naps between polls after NCCL_SPIN_NS rather than hold a core.
 */
static ncclResult_t nccl_wait(struct ovld_rank **ranks, uint32_t n, uint64_t deadline_ns,
                              atomic_bool *stop, uint32_t *ret_bad)
{
    uint64_t start = ovl_mono_ns();
    for (;;) {
        bool busy = false;
        for (uint32_t i = 0; i < n; i++) {
            ncclResult_t r = ncclSuccess;
            ncclResult_t q = ncclCommGetAsyncError(ranks[i]->nccl, &r);
            if (q != ncclSuccess || (r != ncclSuccess && r != ncclInProgress)) {
                *ret_bad = i;
                return q != ncclSuccess ? q : r;
            }
            busy |= r == ncclInProgress;
        }
        if (!busy)
            return ncclSuccess;
        uint64_t now = ovl_mono_ns();
        if ((deadline_ns && now > deadline_ns) || (stop && atomic_load(stop)))
            return ncclInProgress;
        if (!deadline_ns && now - start > NCCL_SPIN_NS) {
            struct timespec nap = {0, NCCL_NAP_NS};
            nanosleep(&nap, NULL);
        } else {
            sched_yield();
        }
    }
}

/* Aborts what a failed or stopped setup made, reporting what NCCL says
 * (the setup's own words go to its callback). */
static void setup_abort_made(setup_work_t *w)
{
    for (uint32_t i = 0; i < w->n; i++) {
        struct ovld_rank *rk = w->ranks[i];
        if (!rk->nccl)
            continue;
        ncclResult_t e = ncclCommAbort(rk->nccl);
        if (e != ncclSuccess)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN,
                        "device %d: ncclCommAbort (a failed setup, job rank %u): %s",
                        rk->dev->ordinal, rk->global, ncclGetErrorString(e));
        rk->nccl = NULL;
    }
}

static void setup_run(uv_work_t *req)
{
    setup_work_t *w = req->data;
    if (w->st != OVL_OK || w->no_comms)
        return; /* refused (the callback says why), or the plans will not ask (backend.h) */
    char nccl_says[200];
    ncclResult_t r;
    if (!w->have_id) {
        r = ncclGetUniqueId(&w->ids[0]);
        if (r != ncclSuccess) {
            nccl_last_words(nccl_says, sizeof(nccl_says));
            w->st = OVL_ERR_BACKEND;
            snprintf(w->msg, sizeof(w->msg), "ncclGetUniqueId: %s%s", ncclGetErrorString(r),
                     nccl_says);
            return;
        }
    }
    uint64_t heap0 = ovld_heap_bytes(); /* what communicators cost: said at debug */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* so that a fault can be detected and aborted */
    /* Not ncclCommInitAll, which takes no config (API-NOTES 0.3). */
    const char *what = "ncclGroupStart";
    cudaError_t ce = cudaSuccess;
    uint32_t bad = 0;
    r = ncclGroupStart();
    if (r == ncclSuccess) {
        for (uint32_t i = 0; r == ncclSuccess && i < w->n; i++) {
            struct ovld_rank *rk = w->ranks[i];
            bad = i;
            if ((ce = cudaSetDevice(rk->dev->ordinal)) != cudaSuccess) {
                what = "cudaSetDevice";
                r = ncclUnhandledCudaError;
                break;
            }
            what = "ncclCommInitRankConfig";
            r = ncclCommInitRankConfig(&rk->nccl, (int)w->comm_n[i], w->ids[w->comm_id[i]],
                                       (int)w->comm_rank[i], &cfg);
            if (r == ncclInProgress)
                r = ncclSuccess;
        }
        /* What was queued is launched (or, after a failure, undone) here. */
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess && e != ncclSuccess && e != ncclInProgress) {
            what = "ncclGroupEnd";
            r = e;
        }
    }
    if (r == ncclSuccess) {
        what = "the communicator's setup";
        r = nccl_wait(w->ranks, w->n, 0, &w->abort, &bad); /* a worker: setup takes what it takes */
    }
    if (r == ncclSuccess) {
        uint64_t heap1 = ovld_heap_bytes();
        ovld_report(&w->cb->base.report, OVLD_REPORT_DEBUG,
                    "%u NCCL communicator%s made; host heap %.1f MiB, %+.1f MiB since they began "
                    "(other jobs' threads move it too)",
                    w->n, w->n == 1 ? "" : "s", heap1 / 1048576.0,
                    ((double)heap1 - (double)heap0) / 1048576.0);
        return; /* an abort that comes now is setup_after's */
    }
    if (r == ncclInProgress && atomic_load(&w->abort)) {
        w->st = OVL_ERR_ABORTED;
        snprintf(w->msg, sizeof(w->msg),
                 "the job was aborted (it lost a node) while its NCCL communicators were made");
    } else if (ce != cudaSuccess) {
        w->st = OVL_ERR_BACKEND;
        snprintf(w->msg, sizeof(w->msg), "device %d: cudaSetDevice: %s",
                 w->ranks[bad]->dev->ordinal, cudaGetErrorString(ce));
    } else {
        nccl_last_words(nccl_says, sizeof(nccl_says));
        w->st = OVL_ERR_BACKEND;
        snprintf(w->msg, sizeof(w->msg),
                 "NCCL communicator of %u ranks (job rank %u on device %d%s): %s: %s%s",
                 w->comm_n[bad], w->global[bad], w->ranks[bad]->dev->ordinal,
                 w->nids > 1 ? ", its rail group's" : "", what, ncclGetErrorString(r), nccl_says);
    }
    setup_abort_made(w);
}

static void abort_start(cuda_backend_t *cb, struct ovld_rank *const *ranks, uint32_t n);

static void setup_after(uv_work_t *req, int status)
{
    setup_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    bool aborted = false;
    for (uint32_t i = 0; i < w->n; i++) {
        w->ranks[i]->setup_pending = false;
        w->ranks[i]->setup = NULL;
        aborted |= w->ranks[i]->aborted;
    }
    if (status == UV_ECANCELED && w->st == OVL_OK) {
        w->st = OVL_ERR_SHUTDOWN;
        snprintf(w->msg, sizeof(w->msg), "cancelled");
    }
    if (aborted) {
        /* job_abort came while the worker made the communicators, too late
         * for it to stop: what it made is aborted now, as job_abort does. */
        abort_start(cb, w->ranks, w->n);
        if (w->st == OVL_OK) {
            w->st = OVL_ERR_ABORTED;
            snprintf(w->msg, sizeof(w->msg), "the job was aborted (it lost a node) during setup");
        }
    }
    if (w->done)
        w->done(w->arg, w->st, w->msg);
    free(w->global);
    free(w->ids);
    free(w->ranks);
    free(w);
    cuda_work_done(cb);
}

/* Says in w why a setup cannot be done, before anything is made (the
 * worker then does nothing and the callback carries the words); else fills
 * w's communicators (ids, and each local rank's comm_*). */
static void setup_check(setup_work_t *w, const ovld_job_net_t *net)
{
#define REFUSE(status, ...)                                                                        \
    do {                                                                                           \
        w->st = (status);                                                                          \
        snprintf(w->msg, sizeof(w->msg), __VA_ARGS__);                                             \
        return;                                                                                    \
    } while (0)
    for (uint32_t i = 0; i < w->n; i++)
        if (w->ranks[i]->aborted)
            REFUSE(OVL_ERR_ABORTED, "the job was aborted (it lost a node) before its setup");
    if (w->no_comms)
        return;
    if (!net) {
        /* the job is all here: one communicator of its n ranks, an id the
         * worker makes */
        w->nids = 1;
        if (!(w->ids = calloc(1, sizeof(*w->ids))))
            REFUSE(OVL_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < w->n; i++) {
            w->comm_n[i] = w->n;
            w->comm_rank[i] = i;
        }
        return;
    }
    if (net->world == 0 || net->world > INT_MAX || w->n > net->world || !net->global)
        REFUSE(OVL_ERR_INTERNAL, "a job across nodes of %u ranks, %u of them here%s", net->world,
               w->n, net->global ? "" : ", without their job ranks");
    bool rail = net->rail_keys != NULL;
    if (!net->key && !rail)
        REFUSE(OVL_ERR_UNSUPPORTED,
               "no NCCL id for the job: the coordinating daemon's backend made no job key "
               "(do all nodes run the CUDA backend?)");
    if (rail && (net->key || !net->rail_group || !net->rail_pos || net->nrail_keys == 0 ||
                 net->nrail_keys > net->world))
        REFUSE(OVL_ERR_INTERNAL, "a job across nodes with %u rail keys%s", net->nrail_keys,
               net->key ? " and a job key" : "");
    for (uint32_t i = 0; i < w->n; i++) {
        uint32_t g = net->global[i];
        if (g >= net->world)
            REFUSE(OVL_ERR_INTERNAL, "local rank %u is job rank %u of %u", i, g, net->world);
        uint32_t grp = rail ? net->rail_group[g] : 0;
        if (grp >= (rail ? net->nrail_keys : 1))
            REFUSE(OVL_ERR_INTERNAL, "job rank %u is in rail group %u of %u", g, grp,
                   net->nrail_keys);
        for (uint32_t k = 0; k < i; k++) {
            if (net->global[k] == g)
                REFUSE(OVL_ERR_INTERNAL, "local ranks %u and %u are both job rank %u", k, i, g);
            if (w->ranks[k]->dev == w->ranks[i]->dev && (!rail || w->comm_id[k] == grp))
                REFUSE(OVL_ERR_UNSUPPORTED,
                       "job ranks %u and %u share device %d%s: NCCL cannot make one "
                       "communicator of two ranks on one GPU",
                       net->global[k], g, w->ranks[i]->dev->ordinal,
                       rail ? " and one rail group" : "");
        }
        w->comm_id[i] = grp;
        w->comm_n[i] = rail ? 0 : net->world;
        w->comm_rank[i] = rail ? net->rail_pos[g] : g;
        for (uint32_t q = 0; rail && q < net->world; q++)
            w->comm_n[i] += net->rail_group[q] == grp;
        if (w->comm_rank[i] >= w->comm_n[i])
            REFUSE(OVL_ERR_INTERNAL, "job rank %u is at %u of a rail group of %u", g,
                   w->comm_rank[i], w->comm_n[i]);
    }
    w->nids = rail ? net->nrail_keys : 1;
    if (!(w->ids = calloc(w->nids, sizeof(*w->ids))))
        REFUSE(OVL_ERR_NOMEM, "out of memory");
    memcpy(w->ids, rail ? net->rail_keys : net->key, w->nids * sizeof(*w->ids));
    w->have_id = true;
    /* each local rank's peers in its group's communicator, for its rails */
    for (uint32_t i = 0; rail && i < w->n; i++) {
        uint32_t *map = malloc(net->world * sizeof(*map));
        if (!map)
            REFUSE(OVL_ERR_NOMEM, "out of memory");
        for (uint32_t q = 0; q < net->world; q++)
            map[q] = net->rail_group[q] == w->comm_id[i] ? net->rail_pos[q] : UINT32_MAX;
        free(w->ranks[i]->comm_rank_of);
        w->ranks[i]->comm_rank_of = map;
    }
#undef REFUSE
}

ovl_status_t cuda_job_setup(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n,
                            const ovld_job_net_t *net, bool collective, ovld_setup_cb cb, void *arg)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
    if (n == 0 || !ranks)
        return OVL_ERR_INTERNAL; /* job.c never asks for a job of no ranks */
    for (uint32_t i = 0; i < n; i++)
        if (!ranks[i])
            return OVL_ERR_INTERNAL;
    setup_work_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->ranks = calloc(n, sizeof(*w->ranks))) ||
        !(w->global = calloc(4 * (size_t)n, sizeof(*w->global)))) {
        if (w)
            free(w->ranks);
        free(w);
        return OVL_ERR_NOMEM;
    }
    w->comm_n = w->global + n;
    w->comm_rank = w->comm_n + n;
    w->comm_id = w->comm_rank + n;
    memcpy(w->ranks, ranks, n * sizeof(*ranks));
    w->req.data = w;
    w->cb = be;
    w->n = n;
    w->done = cb;
    w->arg = arg;
    /* across nodes communicators are made whatever collective says: the
     * job's, or one per rail group where ranks share a GPU */
    w->no_comms = !collective && !net;
    atomic_init(&w->abort, false);
    setup_check(w, net);
    w->world = net ? net->world : n;
    for (uint32_t i = 0; i < n; i++) {
        w->global[i] = w->st == OVL_OK && net ? net->global[i] : i;
        ranks[i]->global = w->global[i];
        ranks[i]->world = w->world;
        ranks[i]->across_nodes = net && net->nnodes > 1;
        ranks[i]->setup_pending = true;
        ranks[i]->setup = w;
    }
    atomic_fetch_add(&be->works, 1);
    int rc = uv_queue_work(be->loop, &w->req, setup_run, setup_after);
    if (rc != 0) {
        atomic_fetch_sub(&be->works, 1);
        for (uint32_t i = 0; i < n; i++) {
            ranks[i]->setup_pending = false;
            ranks[i]->setup = NULL;
        }
        free(w->global);
        free(w->ids);
        free(w->ranks);
        free(w);
        return OVL_ERR_SYSTEM;
    }
    return OVL_OK;
}

ovl_status_t cuda_job_key(ovld_backend_t *b, uint8_t out[OVLD_NCCL_ID_LEN], char *err,
                          size_t errlen)
{
    (void)b;
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        char nccl_says[200];
        nccl_last_words(nccl_says, sizeof(nccl_says));
        snprintf(err, errlen, "ncclGetUniqueId: %s%s", ncclGetErrorString(r), nccl_says);
        return OVL_ERR_BACKEND;
    }
    memcpy(out, &id, OVLD_NCCL_ID_LEN);
    return OVL_OK;
}

/* ---------------------------------------------------------------- abort */

/* Ends the ops of an aborted rank that the GPU has not finished, as
 * failed: their NCCL kernels quit when the communicator is aborted (NCCL
 * polls its abort flag on the GPU), so what follows them computes on rows
 * that never came. Each completion says so (loop thread: the deliveries
 * read it there, later), and the doorbell's error word too, by a CPU
 * store, as cuda_done does where the GPU cannot ring: no GPU write of it is
 * queued unless this claims the error pair (cuda_claim_error). Ops the GPU just finished but that
 * the poller has not seen yet are failed with them; the job is lost
 * anyway. */
static void abort_inflight(struct ovld_rank *r)
{
    uint64_t first = 0;
    bool any = false;
    pthread_mutex_lock(&r->mu);
    for (cuda_done_t *d = r->inflight; d; d = d->next) {
        if (atomic_load(&d->state) != 0)
            continue;
        if (d->node.status == OVL_OK) {
            d->node.status = OVL_ERR_ABORTED;
            snprintf(d->node.message, sizeof(d->node.message),
                     "device %d: the job was aborted (it lost a node) while op %" PRIu64
                     " was in flight",
                     r->dev->ordinal, d->node.seq);
        }
        if (!any || d->node.seq < first)
            first = d->node.seq;
        any = true;
    }
    pthread_mutex_unlock(&r->mu);
    if (!any || !r->db || !cuda_claim_error(r))
        return;
    ovl_doorbell_set_error(r->db, first, (int32_t)OVL_ERR_ABORTED);
}

static void abort_run(uv_work_t *req)
{
    abort_work_t *w = req->data;
    /* The handles, once no issuing thread is inside NCCL on them: one that
     * waits for a launch sees aborted and lets go (nccl_wait's stop). */
    for (uint32_t i = 0; i < w->n; i++) {
        struct ovld_rank *r = w->ranks[i];
        pthread_mutex_lock(&r->nccl_mu);
        w->comms[i] = r->nccl;
        r->nccl = NULL; /* the work's alone from now on */
        pthread_mutex_unlock(&r->nccl_mu);
    }
    /* One after the other: NCCL frees a process's communicators of one
     * job together, in the abort of the last one. */
    for (uint32_t i = 0; i < w->n; i++) {
        if (!w->comms[i])
            continue;
        ncclResult_t e = ncclCommAbort(w->comms[i]);
        if (e != ncclSuccess)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN,
                        "device %d: ncclCommAbort (job rank %u, the job lost a node): %s",
                        w->ranks[i]->dev->ordinal, w->ranks[i]->global, ncclGetErrorString(e));
    }
}

static void teardown_resume(cuda_backend_t *cb);

static void abort_after(uv_work_t *req, int status)
{
    abort_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    if (status == UV_ECANCELED)
        abort_run(req); /* never ran (nothing cancels these today): the handles are ours alone */
    for (uint32_t i = 0; i < w->n; i++)
        w->ranks[i]->abort_pending--;
    teardown_resume(cb);
    free(w->comms);
    free(w->ranks);
    free(w);
    cuda_work_done(cb);
}

/* Hands the ranks whose setup is not in progress to a work item that
 * takes their communicators (where they have one) and aborts them off the
 * loop thread (loop thread). Out of memory, the communicators stay on
 * their ranks, which are aborted all the same: teardown aborts them then. */
static void abort_start(cuda_backend_t *cb, struct ovld_rank *const *ranks, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        k += ranks[i] && !ranks[i]->setup_pending;
    if (k == 0)
        return;
    abort_work_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->ranks = calloc(k, sizeof(*w->ranks))) ||
        !(w->comms = calloc(k, sizeof(*w->comms)))) {
        if (w)
            free(w->ranks);
        free(w);
        ovld_report(&cb->base.report, OVLD_REPORT_ERROR,
                    "out of memory aborting %u NCCL communicators: they are aborted at the "
                    "job's teardown",
                    k);
        return;
    }
    w->req.data = w;
    w->cb = cb;
    for (uint32_t i = 0; i < n; i++) {
        struct ovld_rank *r = ranks[i];
        if (!r || r->setup_pending)
            continue;
        w->ranks[w->n++] = r;
        r->abort_pending++;
    }
    atomic_fetch_add(&cb->works, 1);
    if (uv_queue_work(cb->loop, &w->req, abort_run, abort_after) != 0)
        abort_after(&w->req, UV_ECANCELED); /* aborts here, blocking: the loop cannot queue */
}

void cuda_job_abort(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
    for (uint32_t i = 0; i < n; i++) {
        struct ovld_rank *r = ranks[i];
        if (!r)
            continue;
        if (!r->aborted) {
            r->aborted = true;
            abort_inflight(r);
        }
        /* Its communicator is the setup worker's: tell it to stop waiting;
         * setup_after aborts what it made. */
        if (r->setup_pending && r->setup)
            atomic_store(&r->setup->abort, true);
    }
    abort_start(be, ranks, n);
}

/* ------------------------------------------------------------- teardown */

static void teardown_run(uv_work_t *req)
{
    setup_work_t *w = req->data;
    /* ncclCommDestroy is collective within the node: finalize all, then
     * destroy all (NCCL's own single-process example). A communicator that
     * failed is aborted instead, as NCCL asks, and so is one of an aborted
     * job (whose abort found no memory): finalizing it would wait for
     * peers that are gone. */
    for (uint32_t i = 0; i < w->n; i++) {
        struct ovld_rank *rk = w->ranks[i];
        if (!rk->nccl || rk->aborted)
            continue;
        cudaError_t ce = cudaSetDevice(rk->dev->ordinal);
        ncclResult_t e = ce == cudaSuccess ? ncclCommFinalize(rk->nccl) : ncclUnhandledCudaError;
        if (e != ncclSuccess && e != ncclInProgress)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN, "device %d: ncclCommFinalize: %s",
                        rk->dev->ordinal,
                        ce != cudaSuccess ? cudaGetErrorString(ce) : ncclGetErrorString(e));
    }
    for (uint32_t i = 0; i < w->n; i++) {
        struct ovld_rank *rk = w->ranks[i];
        if (!rk->nccl)
            continue;
        ncclResult_t r = ncclSuccess, q = ncclSuccess;
        if (!rk->aborted) {
            while ((q = ncclCommGetAsyncError(rk->nccl, &r)) == ncclSuccess && r == ncclInProgress)
                sched_yield();
            if (q != ncclSuccess)
                r = q;
        }
        bool destroy = !rk->aborted && r == ncclSuccess;
        ncclResult_t e = destroy ? ncclCommDestroy(rk->nccl) : ncclCommAbort(rk->nccl);
        if (r != ncclSuccess)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN,
                        "device %d: the job's communicator failed (%s): aborted", rk->dev->ordinal,
                        ncclGetErrorString(r));
        if (e != ncclSuccess)
            ovld_report(&w->cb->base.report, OVLD_REPORT_WARN, "device %d: %s: %s",
                        rk->dev->ordinal, destroy ? "ncclCommDestroy" : "ncclCommAbort",
                        ncclGetErrorString(e));
        rk->nccl = NULL;
    }
    for (uint32_t i = 0; i < w->n; i++) {
        cuda_rank_free_resources(w->ranks[i]);
        free(w->ranks[i]);
    }
    /* A job's communicators and ranks are gone: give the pages glibc keeps
     * free in its arenas back to the system. NCCL's and the driver's threads
     * allocate in arenas of their own (64 MiB each); malloc_trim(0) returns
     * every free page of every arena (glibc 2.8 and later) but the tops of
     * all arenas but the main one, which main.c's fixed trim threshold
     * gives back (docs/performance.md, "ovld's own memory"). It takes each
     * arena's lock in turn while it walks it, so a thread allocating in that
     * arena meanwhile waits: once per job's end, on this worker, not per
     * op. */
#ifdef __GLIBC__
    (void)malloc_trim(0);
#endif
}

static void teardown_after(uv_work_t *req, int status)
{
    setup_work_t *w = req->data;
    cuda_backend_t *cb = w->cb;
    if (status == UV_ECANCELED)
        teardown_run(req); /* never ran (nothing cancels these today) */
    free(w->ranks);
    free(w);
    cuda_work_done(cb);
}

/* Queues a teardown whose work is counted already (be->works). */
static void teardown_queue(cuda_backend_t *be, setup_work_t *w)
{
    if (uv_queue_work(be->loop, &w->req, teardown_run, teardown_after) != 0)
        teardown_after(&w->req, UV_ECANCELED); /* here, blocking: the loop cannot queue */
}

/* Whether an abort of one of w's ranks is still running. */
static bool teardown_blocked(const setup_work_t *w)
{
    for (uint32_t i = 0; i < w->n; i++)
        if (w->ranks[i]->abort_pending)
            return true;
    return false;
}

/* Queues the deferred teardowns whose aborts are over (loop thread). */
static void teardown_resume(cuda_backend_t *cb)
{
    for (setup_work_t **pp = &cb->deferred; *pp;) {
        setup_work_t *w = *pp;
        if (teardown_blocked(w)) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        w->next = NULL;
        teardown_queue(cb, w);
    }
}

void cuda_job_teardown(ovld_backend_t *b, ovld_rank_t *const *ranks, uint32_t n)
{
    cuda_backend_t *be = (cuda_backend_t *)b;
    setup_work_t *w = calloc(1, sizeof(*w));
    struct ovld_rank **copy = calloc(n ? n : 1, sizeof(*copy));
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (ranks[i]) {
            cuda_rank_unlink(ranks[i]);
            if (copy)
                copy[k++] = ranks[i];
        }
    if (!w || !copy) {
        free(w);
        free(copy);
        return; /* out of memory: leak rather than block the loop */
    }
    w->req.data = w;
    w->cb = be;
    w->ranks = copy;
    w->n = k;
    atomic_fetch_add(&be->works, 1);
    if (teardown_blocked(w)) {
        /* An abort of these communicators is running: the ranks (streams,
         * memory) go once it is over (abort_after). */
        w->next = be->deferred;
        be->deferred = w;
        return;
    }
    teardown_queue(be, w);
}

/* ------------------------------------------------- all-gather and pulls */

static ncclDataType_t nccl_type(ovl_dtype_t dt)
{
    switch (dt) {
    case OVL_DTYPE_BF16:
        return ncclBfloat16;
    case OVL_DTYPE_FP16:
        return ncclFloat16;
    case OVL_DTYPE_FP32:
        return ncclFloat32;
    case OVL_DTYPE_FP8_E4M3: /* moved, never reduced: bytes */
    case OVL_DTYPE_FP8_E5M2:
        return ncclUint8;
    }
    return ncclFloat32;
}

static ovl_status_t copy_rows(struct ovld_rank *r, cudaStream_t s, ovld_view_t dst, ovld_view_t src,
                              uint64_t rows, uint64_t cols, size_t elem)
{
    if (rows == 0 || cols == 0)
        return OVL_OK;
    if (dst.ld == cols && src.ld == cols)
        CUDA_TRY(r->cb, cudaMemcpyAsync(dst.ptr, src.ptr, rows * cols * elem, cudaMemcpyDefault, s),
                 "copy");
    else
        CUDA_TRY(r->cb,
                 cudaMemcpy2DAsync(dst.ptr, dst.ld * elem, src.ptr, src.ld * elem, cols * elem,
                                   rows, cudaMemcpyDefault, s),
                 "copy (2D)");
    (void)r;
    return OVL_OK;
}

#define REFUSE(st, ...)                                                                            \
    do {                                                                                           \
        snprintf(cuda_last_err, sizeof(cuda_last_err), __VA_ARGS__);                               \
        return (st);                                                                               \
    } while (0)

/* What every part of a collective call must be: dense rows (src and dst
 * of ld cols: NCCL moves one piece per rank), on a rank of the call's
 * communicator, not aborted, that is the part's job rank among `world`
 * (the record job_setup kept: the communicator was made with those), with
 * the stream it names; parts in rank order (backend.h), each rank once.
 * prev: the previous part's rank, or -1. */
static ovl_status_t part_check(const char *name, const struct ovld_rank *rk, uint32_t global,
                               int64_t prev, uint32_t world, uint32_t stream, ovld_view_t src,
                               ovld_view_t dst, uint64_t cols, bool job_comm)
{
    if (src.ld != cols || dst.ld != cols)
        REFUSE(OVL_ERR_INVALID,
               "%s moves dense rows only: rank %u has ld %" PRIu64 " and %" PRIu64 " for %" PRIu64
               " columns",
               name, global, src.ld, dst.ld, cols);
    if (global >= world)
        REFUSE(OVL_ERR_INTERNAL, "%s: a part of job rank %u in a job of %u", name, global, world);
    if ((int64_t)global <= prev)
        REFUSE(OVL_ERR_INTERNAL, "%s: parts out of rank order: job rank %u after %" PRId64, name,
               global, prev);
    if (rk->aborted)
        REFUSE(OVL_ERR_ABORTED, "%s: rank %u's communicator was aborted (the job lost a node)",
               name, global);
    if (!rk->nccl)
        REFUSE(OVL_ERR_UNSUPPORTED,
               "%s: rank %u has no NCCL communicator (where ranks share a GPU, GEMM + "
               "reduce-scatter runs by push, which auto picks there)",
               name, global);
    if (job_comm && rk->comm_rank_of)
        REFUSE(OVL_ERR_UNSUPPORTED,
               "%s: ranks of the job share a GPU, so job rank %u has its rail group's NCCL "
               "communicator, none over the job: only ring runs across nodes then",
               name, global);
    if (rk->global != global || rk->world != world)
        REFUSE(OVL_ERR_INTERNAL,
               "%s: the part of job rank %u of %u is rank %u of a communicator of %u", name, global,
               world, rk->global, rk->world);
    if (!cuda_stream((struct ovld_rank *)rk, stream))
        return OVL_ERR_INVALID; /* cuda_stream said why */
    return OVL_OK;
}

/* The layout checks of an all-gather and a rail: dense rows (one piece per
 * rank), blocks that do not overlap, sizes that fit. */
static ovl_status_t layout_check(const char *name, size_t elem, uint32_t nparts, uint32_t world,
                                 uint64_t rows, uint64_t cols, uint64_t stride)
{
    if (elem == 0)
        REFUSE(OVL_ERR_INVALID, "%s: unknown dtype", name);
    if (nparts == 0 || nparts > world || world > INT_MAX)
        REFUSE(OVL_ERR_INTERNAL, "%s: %u parts of a job of %u ranks", name, nparts, world);
    if (stride < rows)
        REFUSE(OVL_ERR_INVALID, "%s: blocks overlap: stride %" PRIu64 ", rows %" PRIu64, name,
               stride, rows);
    if (cols != 0 && rows > SIZE_MAX / cols / elem)
        REFUSE(OVL_ERR_LIMIT, "%s: %" PRIu64 " x %" PRIu64 " elements do not fit in memory", name,
               rows, cols);
    return OVL_OK;
}

/* Refuses, with words, an all-gather NCCL cannot do as asked: its rows
 * must be dense (one piece per rank), ncclAllGather's shards back to back,
 * and each part on a rank of the job's communicator at its job rank. */
static ovl_status_t allgather_check(ovl_ag_method_t method, const ovld_allgather_part_t *parts,
                                    uint32_t n, uint32_t world, size_t elem, uint64_t rows,
                                    uint64_t cols, uint64_t stride)
{
    const char *name = ovl_ag_method_name(method);
    if (!name || method == OVL_AG_NCCL_RAIL)
        REFUSE(OVL_ERR_UNSUPPORTED, "all-gather method %d: not one the CUDA backend has",
               (int)method);
    if (method == OVL_AG_NCCL_ALLGATHER && stride != rows)
        REFUSE(OVL_ERR_INVALID, "%s places shards back to back: stride %" PRIu64 ", rows %" PRIu64,
               name, stride, rows);
    ovl_status_t st = layout_check(name, elem, n, world, rows, cols, stride);
    int64_t prev = -1;
    for (uint32_t i = 0; st == OVL_OK && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        st = part_check(name, x->rank, x->global, prev, world, x->stream, x->src, x->dst, cols,
                        true);
        prev = x->global;
    }
    return st;
}

/* Refuses, with words, a rail NCCL cannot do as asked: dense rows (one
 * piece per peer), blocks that do not overlap, and every part on a rank of
 * the job's communicator at its job rank, its peers ranks of that
 * communicator other than its own. Matching sends with receives is the
 * plans' (the checker proves it): NCCL cannot tell a missing one from a
 * late one. */
static ovl_status_t rail_check(ovl_ag_method_t method, const ovld_rail_part_t *parts, uint32_t n,
                               uint32_t world, size_t elem, uint64_t rows, uint64_t cols,
                               uint64_t stride)
{
    if (method != OVL_AG_NCCL_RAIL)
        REFUSE(OVL_ERR_UNSUPPORTED, "rail method %d: not one the CUDA backend has", (int)method);
    ovl_status_t st = layout_check("nccl-rail", elem, n, world, rows, cols, stride);
    int64_t prev = -1;
    for (uint32_t i = 0; st == OVL_OK && i < n; i++) {
        const ovld_rail_part_t *x = &parts[i];
        st = part_check("nccl-rail", x->rank, x->global, prev, world, x->stream, x->src, x->dst,
                        cols, false);
        prev = x->global;
        for (uint32_t k = 0; st == OVL_OK && k < x->nsend + x->nrecv; k++) {
            uint32_t peer = k < x->nsend ? x->send[k] : x->recv[k - x->nsend];
            if (peer == x->global || peer >= world)
                REFUSE(OVL_ERR_INTERNAL, "nccl-rail: rank %u names rank %u of a job of %u",
                       x->global, peer, world);
            if (x->rank->comm_rank_of && x->rank->comm_rank_of[peer] == UINT32_MAX)
                REFUSE(OVL_ERR_INTERNAL, "nccl-rail: rank %u names rank %u, of another rail group",
                       x->global, peer);
        }
    }
    return st;
}

/* Refuses, with words, a reduce-scatter NCCL cannot do as asked: dense
 * partials (src; the blocks stride rows apart), the parts on ranks of the
 * job's communicator at their job ranks. The output may be strided: it is
 * then reduced in place into the own block of src and copied. */
static ovl_status_t reduce_scatter_check(const ovld_allgather_part_t *parts, uint32_t n,
                                         uint32_t world, size_t elem, uint64_t rows, uint64_t cols,
                                         uint64_t stride)
{
    ovl_status_t st = layout_check("reduce-scatter", elem, n, world, rows, cols, stride);
    int64_t prev = -1;
    for (uint32_t i = 0; st == OVL_OK && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        /* part_check wants dense ends: the output's layout is handled here */
        ovld_view_t dense_dst = {.ptr = x->dst.ptr, .ld = cols};
        st = part_check("reduce-scatter", x->rank, x->global, prev, world, x->stream, x->src,
                        dense_dst, cols, true);
        prev = x->global;
    }
    return st;
}

#undef REFUSE

/* Part i's rank, whatever the parts' type (launch_wait). */
typedef struct ovld_rank *(*part_rank_fn)(const void *parts, uint32_t i);

static struct ovld_rank *allgather_rank(const void *parts, uint32_t i)
{
    return ((const ovld_allgather_part_t *)parts)[i].rank;
}

static struct ovld_rank *rail_rank(const void *parts, uint32_t i)
{
    return ((const ovld_rail_part_t *)parts)[i].rank;
}

/*
 * After a grouped launch that said ncclInProgress: nonblocking comms take
 * nothing else on their streams before the launch is complete (API-NOTES
 * 1.3), so this waits for every part's communicator, on the issuing
 * thread (the job's lane waits with it, not the loop): a launch that is not
 * complete within NCCL_LAUNCH_LIMIT_NS (a GPU that no longer moves, or
 * across nodes a connection whose other end's daemon has not issued its
 * part) fails the op rather than hold the job up for ever, and one whose
 * job is aborted stops at once (ncclInProgress then, either way). *ret_bad:
 * the index of the part whose communicator failed.
 */
static ncclResult_t launch_wait(const void *parts, uint32_t n, part_rank_fn rank_of,
                                uint32_t *ret_bad)
{
    uint64_t deadline = ovl_mono_ns() + NCCL_LAUNCH_LIMIT_NS;
    /* job_abort marks every local rank of the job at once */
    atomic_bool *stop = &rank_of(parts, 0)->aborted;
    struct ovld_rank *rk[NCCL_WAIT_BATCH];
    uint32_t done = 0;
    ncclResult_t r = ncclSuccess;
    while (done < n) {
        uint32_t c = 0, bad = 0;
        for (; c < NCCL_WAIT_BATCH && done + c < n; c++)
            rk[c] = rank_of(parts, done + c);
        r = nccl_wait(rk, c, deadline, stop, &bad);
        if (r != ncclSuccess) {
            *ret_bad = done + bad;
            break;
        }
        done += c;
    }
    return r;
}

/* The words of a failed grouped launch (cuda_last_err): the method, its
 * rows, what failed and how; a launch not complete in time says where it
 * may wait. */
static void launch_words(const char *name, uint64_t rows, const char *what, ncclResult_t r,
                         const struct ovld_rank *rk)
{
    char nccl_says[200], who[48] = "";
    nccl_last_words(nccl_says, sizeof(nccl_says));
    if (rk)
        snprintf(who, sizeof(who), " (job rank %u, device %d)", rk->global, rk->dev->ordinal);
    if (r == ncclInProgress && rk && atomic_load(&rk->aborted))
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "%s of %" PRIu64 " rows: the job was aborted (it lost a node) while the launch "
                 "waited",
                 name, rows);
    else if (r == ncclInProgress)
        snprintf(cuda_last_err, sizeof(cuda_last_err),
                 "%s of %" PRIu64 " rows: launch not complete after 5 s (%s)", name, rows,
                 rk && rk->across_nodes
                     ? "does another node's ovld issue its part? is the GPU stalled?"
                     : "is the GPU stalled?");
    else
        snprintf(cuda_last_err, sizeof(cuda_last_err), "%s of %" PRIu64 " rows: %s%s: %s%s", name,
                 rows, what, who, ncclGetErrorString(r), nccl_says);
}

/* The end of a grouped launch, its calls' outcome in r (what failed, and
 * at which part's rank): ncclGroupEnd where ncclGroupStart succeeded
 * (started), the wait for a launch in progress, the words of a failure
 * (name, rows). */
static ovl_status_t group_finish(bool started, ncclResult_t r, const char *what,
                                 const struct ovld_rank *at, const void *parts, uint32_t n,
                                 part_rank_fn rank_of, const char *name, uint64_t rows)
{
    if (started) {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess && e != ncclSuccess) {
            what = "ncclGroupEnd";
            at = NULL;
            r = e;
        }
    }
    if (r == ncclInProgress) {
        uint32_t bad = 0;
        what = "the launch";
        r = launch_wait(parts, n, rank_of, &bad);
        at = rank_of(parts, bad);
    }
    if (r == ncclSuccess)
        return OVL_OK;
    launch_words(name, rows, what, r, at);
    return r == ncclInProgress && at && atomic_load(&at->aborted) ? OVL_ERR_ABORTED
                                                                  : OVL_ERR_BACKEND;
}

/* The communicators of a collective call's parts, held from its checks to
 * the end of its launch (nccl_mu, in part order), so that no abort or
 * watchdog query enters NCCL on them meanwhile. */
static void comms_lock(const void *parts, uint32_t n, part_rank_fn rank_of, bool lock)
{
    for (uint32_t i = 0; i < n; i++) {
        struct ovld_rank *rk = rank_of(parts, i);
        if (lock)
            pthread_mutex_lock(&rk->nccl_mu);
        else
            pthread_mutex_unlock(&rk->nccl_mu);
    }
}

static ovl_status_t allgather_locked(ovl_ag_method_t method, const ovld_allgather_part_t *parts,
                                     uint32_t n, uint32_t world, ovl_dtype_t dtype, uint64_t rows,
                                     uint64_t cols, uint64_t stride)
{
    size_t elem = ovl_dtype_size(dtype);
    ovl_status_t st = allgather_check(method, parts, n, world, elem, rows, cols, stride);
    if (st != OVL_OK)
        return st;
    const char *name = ovl_ag_method_name(method);
    size_t count = (size_t)(rows * cols);
    ncclDataType_t t = nccl_type(dtype);
    /* nccl-sendrecv: the own rows by a local copy, queued before the
     * group (on the stream that the group's kernels then follow, as
     * ncclGroupEnd launches them): a copy that fails leaves no NCCL call
     * queued, whereas a failed NCCL call inside a group makes ncclGroupEnd
     * launch nothing of it (NCCL keeps the group's error). */
    for (uint32_t i = 0; method == OVL_AG_NCCL_SENDRECV && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        void *dst = ovld_view_rows(x->dst, (uint64_t)x->global * stride, elem).ptr;
        cudaError_t ce = cudaSetDevice(x->rank->dev->ordinal);
        if (ce == cudaSuccess)
            ce = cudaMemcpyAsync(dst, x->src.ptr, count * elem, cudaMemcpyDeviceToDevice,
                                 cuda_stream(x->rank, x->stream)); /* checked above */
        if (ce != cudaSuccess) {
            snprintf(cuda_last_err, sizeof(cuda_last_err),
                     "%s: the own rows' copy (job rank %u, device %d): %s", name, x->global,
                     x->rank->dev->ordinal, cudaGetErrorString(ce));
            return OVL_ERR_BACKEND;
        }
    }
    const char *what = "ncclGroupStart";
    const struct ovld_rank *at = NULL; /* the part whose call failed */
    ncclResult_t r = ncclGroupStart();
    bool started = r == ncclSuccess;
    for (uint32_t i = 0; started && r == ncclSuccess && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        cudaStream_t s = cuda_stream(x->rank, x->stream); /* checked above */
        at = x->rank;
        if (method == OVL_AG_NCCL_ALLGATHER) {
            /* every rank's count elements land back to back from dst:
             * rank q's at q*stride rows, stride == rows */
            what = "ncclAllGather";
            r = ncclAllGather(x->src.ptr, x->dst.ptr, count, t, x->rank->nccl, s);
            continue;
        }
        /* send/recv with every other rank of the job, on this node or
         * another: rank p's rows land stride*p rows into dst */
        for (uint32_t p = 0; r == ncclSuccess && p < world; p++) {
            if (p == x->global)
                continue; /* copied above */
            void *dst = ovld_view_rows(x->dst, (uint64_t)p * stride, elem).ptr;
            what = "ncclSend";
            r = ncclSend(x->src.ptr, count, t, (int)p, x->rank->nccl, s);
            if (r == ncclSuccess) {
                what = "ncclRecv";
                r = ncclRecv(dst, count, t, (int)p, x->rank->nccl, s);
            }
        }
    }
    return group_finish(started, r, what, at, parts, n, allgather_rank, name, rows);
}

static ovl_status_t rail_locked(ovl_ag_method_t method, const ovld_rail_part_t *parts, uint32_t n,
                                uint32_t world, ovl_dtype_t dtype, uint64_t rows, uint64_t cols,
                                uint64_t stride)
{
    size_t elem = ovl_dtype_size(dtype);
    ovl_status_t st = rail_check(method, parts, n, world, elem, rows, cols, stride);
    if (st != OVL_OK)
        return st;
    size_t count = (size_t)(rows * cols);
    ncclDataType_t t = nccl_type(dtype);
    const char *what = "ncclGroupStart";
    const struct ovld_rank *at = NULL;
    /* Every local part's sends and receives in one group: NCCL matches
     * them with each other and with other processes' (other nodes') in
     * any order, and a rank that sends to a peer which receives later in
     * the group does not wait for it. The lists name job ranks: the ranks
     * of the job's communicator, or translated into the rail group's. */
    ncclResult_t r = ncclGroupStart();
    bool started = r == ncclSuccess;
    for (uint32_t i = 0; started && r == ncclSuccess && i < n; i++) {
        const ovld_rail_part_t *x = &parts[i];
        cudaStream_t s = cuda_stream(x->rank, x->stream); /* checked above */
        at = x->rank;
        what = "ncclSend";
        const uint32_t *to = x->rank->comm_rank_of; /* checked above */
        for (uint32_t k = 0; r == ncclSuccess && k < x->nsend; k++)
            r = ncclSend(x->src.ptr, count, t, (int)(to ? to[x->send[k]] : x->send[k]),
                         x->rank->nccl, s);
        if (r == ncclSuccess)
            what = "ncclRecv";
        for (uint32_t k = 0; r == ncclSuccess && k < x->nrecv; k++) {
            /* rank q's rows land stride*q rows into dst */
            void *dst = ovld_view_rows(x->dst, (uint64_t)x->recv[k] * stride, elem).ptr;
            r = ncclRecv(dst, count, t, (int)(to ? to[x->recv[k]] : x->recv[k]), x->rank->nccl, s);
        }
    }
    return group_finish(started, r, what, at, parts, n, rail_rank, "nccl-rail", rows);
}

/*
 * The reduce-scatter (backend.h): where the W blocks of a part's partials
 * lie back to back (stride == rows) one ncclReduceScatter, else one
 * ncclReduce per block, rooted at the block's rank, all in one group.
 * Each lands in the part's C where C is dense, else in place in the own
 * block of its partials (NCCL's in-place form), copied into C after the
 * group on the same stream. NCCL sums 16-bit types in the type, one
 * rounding per step of its algorithm: at world 2, one (docs/plans.md).
 */
static ovl_status_t reduce_scatter_locked(const ovld_allgather_part_t *parts, uint32_t n,
                                          uint32_t world, ovl_dtype_t dtype, uint64_t rows,
                                          uint64_t cols, uint64_t stride, bool avg)
{
    size_t elem = ovl_dtype_size(dtype);
    ovl_status_t st = reduce_scatter_check(parts, n, world, elem, rows, cols, stride);
    if (st != OVL_OK)
        return st;
    size_t count = (size_t)(rows * cols);
    ncclDataType_t t = nccl_type(dtype);
    ncclRedOp_t op = avg ? ncclAvg : ncclSum;
    const char *what = "ncclGroupStart";
    const struct ovld_rank *at = NULL;
    ncclResult_t r = ncclGroupStart();
    bool started = r == ncclSuccess;
    for (uint32_t i = 0; started && r == ncclSuccess && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        cudaStream_t s = cuda_stream(x->rank, x->stream); /* checked above */
        /* the own block of the partials: the in-place destination */
        void *own = ovld_view_rows(x->src, (uint64_t)x->global * stride, elem).ptr;
        void *dst = x->dst.ld == cols ? x->dst.ptr : own;
        at = x->rank;
        if (stride == rows) {
            what = "ncclReduceScatter";
            r = ncclReduceScatter(x->src.ptr, dst, count, t, op, x->rank->nccl, s);
            continue;
        }
        what = "ncclReduce";
        for (uint32_t b = 0; r == ncclSuccess && b < world; b++)
            r = ncclReduce(ovld_view_rows(x->src, (uint64_t)b * stride, elem).ptr,
                           b == x->global ? dst : NULL, count, t, op, (int)b, x->rank->nccl, s);
    }
    st = group_finish(started, r, what, at, parts, n, allgather_rank, "reduce-scatter", rows);
    for (uint32_t i = 0; st == OVL_OK && i < n; i++) {
        const ovld_allgather_part_t *x = &parts[i];
        if (x->dst.ld == cols)
            continue;
        ovld_view_t own = ovld_view_rows(x->src, (uint64_t)x->global * stride, elem);
        cudaError_t ce = cudaSetDevice(x->rank->dev->ordinal);
        if (ce != cudaSuccess) {
            snprintf(cuda_last_err, sizeof(cuda_last_err), "reduce-scatter: cudaSetDevice(%d): %s",
                     x->rank->dev->ordinal, cudaGetErrorString(ce));
            return OVL_ERR_BACKEND;
        }
        st = copy_rows(x->rank, cuda_stream(x->rank, x->stream), x->dst, own, rows, cols, elem);
    }
    return st;
}

ovl_status_t cuda_reduce_scatter(ovld_backend_t *b, ovld_coll_tag_t tag,
                                 const ovld_allgather_part_t *parts, uint32_t n, uint32_t world,
                                 ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride,
                                 bool avg)
{
    (void)b;
    (void)tag; /* NCCL matches the nodes' calls by issue order */
    if (world == 1 && n == 1) {
        /* one rank: its partials are the sum (and the average) */
        const ovld_allgather_part_t *x = &parts[0];
        cudaStream_t s = cuda_stream(x->rank, x->stream);
        if (!s)
            return OVL_ERR_INVALID; /* cuda_stream said why */
        cudaError_t ce = cudaSetDevice(x->rank->dev->ordinal);
        if (ce != cudaSuccess) {
            snprintf(cuda_last_err, sizeof(cuda_last_err), "reduce-scatter: cudaSetDevice(%d): %s",
                     x->rank->dev->ordinal, cudaGetErrorString(ce));
            return OVL_ERR_BACKEND;
        }
        return copy_rows(x->rank, s, x->dst, x->src, rows, cols, ovl_dtype_size(dtype));
    }
    comms_lock(parts, n, allgather_rank, true);
    ovl_status_t st = reduce_scatter_locked(parts, n, world, dtype, rows, cols, stride, avg);
    comms_lock(parts, n, allgather_rank, false);
    return st;
}

ovl_status_t cuda_allgather(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                            const ovld_allgather_part_t *parts, uint32_t n, uint32_t world,
                            ovl_dtype_t dtype, uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag; /* NCCL matches the nodes' calls by issue order */
    comms_lock(parts, n, allgather_rank, true);
    ovl_status_t st = allgather_locked(method, parts, n, world, dtype, rows, cols, stride);
    comms_lock(parts, n, allgather_rank, false);
    return st;
}

ovl_status_t cuda_rail(ovld_backend_t *b, ovl_ag_method_t method, ovld_coll_tag_t tag,
                       const ovld_rail_part_t *parts, uint32_t n, uint32_t world, ovl_dtype_t dtype,
                       uint64_t rows, uint64_t cols, uint64_t stride)
{
    (void)b;
    (void)tag; /* NCCL matches the nodes' calls by issue order */
    comms_lock(parts, n, rail_rank, true);
    ovl_status_t st = rail_locked(method, parts, n, world, dtype, rows, cols, stride);
    comms_lock(parts, n, rail_rank, false);
    return st;
}

ovl_status_t cuda_copy(ovld_rank_t *r, uint32_t stream, ovld_view_t dst, ovld_view_t src,
                       uint64_t rows, uint64_t cols, size_t elem)
{
    USE_DEVICE(r);
    cudaStream_t s = cuda_stream(r, stream);
    if (!s)
        return OVL_ERR_INVALID; /* cuda_stream said why */
    return copy_rows(r, s, dst, src, rows, cols, elem);
}

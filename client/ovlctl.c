/*
 * ovlctl.c: the operator's command line for ovld.
 *
 * Exit codes: 0 ok; 1 the daemon said no or cannot be reached (one line on
 * stderr says why); 2 usage.
 */
#include <errno.h>
#include <stddef.h>
#include <unistd.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libovl_internal.h"
#include "libovl_json.h"
#include "num.h"
#include "ovl.h"
#include "plan.h"
#include "text.h"
#include "uuid.h"

#define EXIT_USAGE 2

static const char *socket_opt;

static void usage(FILE *f)
{
    char now[256];
    ovl_socket_rule_t rule;
    if (ovl_default_socket(now, sizeof(now), &rule) != OVL_OK)
        snprintf(now, sizeof(now), "(too long)");
    fprintf(f,
            "Usage: ovlctl [--socket PATH] COMMAND [OPTIONS]\n"
            "\n"
            "Commands:\n"
            "  status [--json]          the daemon, its devices, jobs, clients and peers\n"
            "  stats [--json|--prometheus] [--watch SECONDS] [--reset]\n"
            "                           counters since start and since the last reset, op\n"
            "                           latency and issue-time percentiles; --reset: root or\n"
            "                           ovld's user\n"
            "  plan [OPTIONS]           print the host program of one op for one rank\n"
            "  tune [--json] [--clear]  auto's measured choices: per shape, the plans it\n"
            "                           timed (median ns) and the one it runs; --clear\n"
            "                           forgets them (root or ovld's user)\n"
            "  peer ping [--json] ADDRESS:PORT\n"
            "                           ovld connects to the ovld of another node (with the\n"
            "                           cluster key) and measures a round trip; root or\n"
            "                           ovld's user\n"
            "  version                  versions of ovlctl and of the daemon\n"
            "\n"
            "Options of plan:\n"
            "  --kind ag_gemm|gemm_rs   the op's kind (default ag_gemm: C = allgather(A) @ B;\n"
            "                           gemm_rs: C = reduce_scatter(A @ B), -m the rows of A\n"
            "                           and of the sum, a multiple of the world, -k the\n"
            "                           rank's inner dimension)\n"
            "  --op ag|rs               the same, as ovl-demo and ovl-bench spell it\n"
            "  --reduce sum|avg         gemm_rs: how the partials combine (default sum)\n"
            "  --algo auto|naive|collective|ring|push (default auto; push is gemm_rs's\n"
            "                           only)\n"
            "  --world W --rank R -m M -n N -k K (required)\n"
            "  --chunks C --streams S   0: the planner's default (default 0); ring's and\n"
            "                           push's streams are fixed by their roles (client,\n"
            "                           copy, compute): they ignore S, and ovlctl says so\n"
            "                           on stderr\n"
            "  --dtype bf16|fp16|fp32|fp8e4m3|fp8e5m2  (default bf16); fp8: a scaled op,\n"
            "                           B transposed (--transb implied)\n"
            "  --b-dtype T --out-dtype T  a scaled op's B (fp8; default fp8e4m3) and C\n"
            "                           (bf16, fp16, fp32; default bf16)\n"
            "  --scale MODE             both scales' mode (default row): tensor, row, 1x128\n"
            "                           or 128x128 (B only); --a-scale MODE and --b-scale\n"
            "                           MODE set one (DeepSeek-V3's pair: --a-scale 1x128\n"
            "                           --b-scale 128x128; the plan moves A's 1x128 scales\n"
            "                           with its rows, SA and SG ceil(k/128) a row)\n"
            "  --bias --fast-accum      a scaled op's bias; cuBLASLt's fast accumulation\n"
            "  --a-out                  the client wants the gathered A\n"
            "  --transb                 B is n x k (a Linear weight's layout)\n"
            "  --strided                some A or a_out has ld != k (gathered by pulls)\n"
            "  --shared-gpu             some ranks share a GPU (gathered by pulls; gemm_rs:\n"
            "                           auto is push)\n"
            "  --allgather auto|nccl|copy  how A is gathered (default auto)\n"
            "  --more-n N1,N2,...       several Bs: the n of each B after the first (-n);\n"
            "                           up to 7\n"
            "  --nodes N                the job spans N nodes, node-major, world/N ranks each\n"
            "  --local-ranks L1,L2,...  the job spans nodes of L1, L2, ... ranks, node-major\n"
            "                           (they add up to the world)\n"
            "  --daemon                 ask ovld which plan it would run (its defaults, its\n"
            "                           allgather setting and its choice for auto) for a\n"
            "                           dense op, instead of planning here; takes --transb\n"
            "                           and --more-n, not --strided, --shared-gpu, --allgather\n"
            "\n"
            "Global options:\n"
            "  -s, --socket PATH        ovld's socket; default: $OVL_SOCKET, else the per-user\n"
            "                           /run/ovl/%u/ovld.sock or $XDG_RUNTIME_DIR/ovl/ovld.sock\n"
            "                           if it exists, else %s\n"
            "                           (here and now: %s, %s)\n"
            "  -h, --help               show this help\n"
            "\n"
            "Exit status: 0 ok, 1 the daemon refused or is unreachable, 2 usage.\n",
            (unsigned)geteuid(), OVL_DEFAULT_SOCKET, now, ovl_socket_rule_name(rule));
}

/* ------------------------------------------------------------ output */

/*
 * Every string that comes from ovld (job ids and client names come from
 * clients; an older ovld checks nothing) is printed escaped: through
 * ovl_text_escape_term on a terminal, ovl_text_escape_json in JSON
 * (common/text.h). Nothing ovld sends reaches the terminal raw.
 */

/* The escaped strings of one line of output: a ring of buffers, each grown
 * as needed, so that one printf can take several (at most ESC_RING). */
#define ESC_RING 8
static char *esc_buf[ESC_RING];
static size_t esc_cap[ESC_RING];
static unsigned esc_next;

static void esc_free(void)
{
    for (int i = 0; i < ESC_RING; i++) {
        free(esc_buf[i]);
        esc_buf[i] = NULL;
        esc_cap[i] = 0;
    }
}

/* A buffer of the ring with room for len bytes; NULL if out of memory. */
static char *esc_slot(size_t len)
{
    unsigned i = esc_next++ % ESC_RING;
    if (esc_cap[i] < len) {
        char *p = realloc(esc_buf[i], len);
        if (!p)
            return NULL;
        esc_buf[i] = p;
        esc_cap[i] = len;
    }
    return esc_buf[i];
}

/*
 * s escaped for a terminal, then padded with spaces to width columns (0:
 * none): escape first, then pad, so that an escape cannot break the
 * alignment. A column is a character (the escaped text is UTF-8). Valid
 * until ESC_RING more calls.
 */
static const char *cell(const char *s, size_t width)
{
    if (!s)
        s = "";
    /* the worst case is \xHH (4 bytes) for each byte */
    size_t n = strlen(s), cap = 4 * n + width + 1;
    char *buf = esc_slot(cap);
    if (!buf)
        return "?";
    size_t len = ovl_text_escape_term(buf, cap - width, s), cols = 0;
    for (size_t i = 0; i < len; i++)
        cols += ((unsigned char)buf[i] & 0xc0) != 0x80;
    while (cols < width) {
        buf[len++] = ' ';
        cols++;
    }
    buf[len] = '\0';
    return buf;
}

static const char *term(const char *s)
{
    return cell(s, 0);
}

/* s, or "-" if it is empty, for a terminal. */
static const char *term_or_dash(const char *s, size_t width)
{
    return cell(s && s[0] ? s : "-", width);
}

/* A JSON string of s: valid UTF-8 and valid JSON whatever bytes s holds. */

/* A Prometheus label value (text format 0.0.4 knows only \\, \" and \n):
 * escaped for a terminal, then its backslashes and quotes escaped again. */
static const char *prom_label(const char *s)
{
    const char *t = term(s);
    size_t extra = 0;
    for (const char *p = t; *p; p++)
        extra += *p == '\\' || *p == '"';
    char *buf = esc_slot(strlen(t) + extra + 1);
    if (!buf)
        return "?";
    char *o = buf;
    for (const char *p = t; *p; p++) {
        if (*p == '\\' || *p == '"')
            *o++ = '\\';
        *o++ = *p;
    }
    *o = '\0';
    return buf;
}

/* Multi-line text from ovld (a plan): each line escaped, the line breaks
 * kept. */
static void print_lines(FILE *f, const char *s)
{
    if (!s)
        return;
    while (*s) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        char *line = malloc(n + 1);
        if (!line)
            return;
        memcpy(line, s, n);
        line[n] = '\0';
        fputs(term(line), f);
        free(line);
        if (!nl)
            break;
        fputc('\n', f);
        s = nl + 1;
    }
}

static void human_bytes(uint64_t b, char *buf, size_t len)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

/* A job's device of each rank, by rank ("0,0,1,1"; "-" for a rank not
 * joined), cut to fit width with a trailing "..": ranks that share a
 * device show the same number. */
static void rank_devices_text(const Ovl__JobInfo *j, char *buf, size_t width)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t r = 0; r < j->n_rank_devices; r++) {
        char one[16];
        int n = j->rank_devices[r] >= 0
                    ? snprintf(one, sizeof(one), "%s%d", r ? "," : "", j->rank_devices[r])
                    : snprintf(one, sizeof(one), "%s-", r ? "," : "");
        bool last = r + 1 == j->n_rank_devices;
        if (len + (size_t)n + (last ? 0 : 3) > width) { /* room for ",.." */
            snprintf(buf + len, width + 1 - len, "%s..", len ? "," : "");
            return;
        }
        memcpy(buf + len, one, (size_t)n + 1);
        len += (size_t)n;
    }
    if (!len)
        snprintf(buf, width + 1, "-");
}

static void print_status_table(const Ovl__StatusReply *s)
{
    printf("ovld %s (protocol %u), pid %d, up %.1f s\n", term(s->version), s->protocol_version,
           s->pid, s->uptime_s);
    printf("  backend:      %s\n", term(s->backend));
    printf("  op kinds:    ");
    for (size_t i = 0; i < s->n_op_kinds; i++)
        printf(" %s", term(s->op_kinds[i]));
    printf("%s\n", s->n_op_kinds ? "" : " -");
    printf("  socket:       %s\n", term_or_dash(s->socket, 0));
    printf("  config file:  %s\n", term_or_dash(s->config_file, 0));
    printf("  connections:  %u\n", s->connections);
    printf("\nDEVICES (%zu)\n", s->n_devices);
    printf("  %-5s  %-41s  %-16s  %10s  %7s  %10s  %s\n", "INDEX", "UUID", "NAME", "MEMORY",
           "STREAMS", "OVL HOLDS", "MPS");
    for (size_t i = 0; i < s->n_devices; i++) {
        const Ovl__Device *d = s->devices[i];
        char u[64], mem[32], held[32];
        libovl_uuid_text(d, s->backend, u, sizeof(u));
        human_bytes(d->total_memory, mem, sizeof(mem));
        human_bytes(d->held_bytes, held, sizeof(held));
        printf("  %-5u  %-41s  %s  %10s  %7u  %10s  %s\n", d->index, u, cell(d->name, 16), mem,
               d->streams, held,
               strcmp(s->backend, "cuda") ? "-"
               : d->mps                   ? "yes"
                                          : "NO");
    }
    printf("\nJOBS (%zu)\n", s->n_jobs);
    if (s->n_jobs)
        printf("  %-20s  %6s  %5s  %5s  %-16s  %-8s  %10s  %9s  %s\n", "ID", "OWNER", "WORLD",
               "LOCAL", "DEVICES", "STATE", "OPS DONE", "IN FLIGHT", "LAST ERROR");
    for (size_t i = 0; i < s->n_jobs; i++) {
        const Ovl__JobInfo *j = s->jobs[i];
        char devs[17];
        rank_devices_text(j, devs, 16);
        printf("  %s  %6u  %5u  %5u  %-16s  %s  %10" PRIu64 "  %9u  %s\n", cell(j->id, 20),
               j->owner_uid, j->world, j->local_ranks, devs, cell(j->state, 8), j->ops_done,
               j->ops_in_flight, term_or_dash(j->last_error, 0));
        /* a job across nodes: where its other ranks are */
        for (size_t n = 0; n < j->n_nodes; n++)
            printf("  %s node %zu: %s%s\n", n ? "         " : "  across", n, term(j->nodes[n]),
                   n == j->self_node ? " (this node)" : "");
    }
    printf("\nCLIENTS (%zu)\n", s->n_clients);
    if (s->n_clients)
        printf("  %-4s  %8s  %6s  %-16s  %-20s  %4s  %7s  %10s\n", "ID", "PID", "UID", "NAME",
               "JOB", "RANK", "BUFFERS", "MAPPED");
    for (size_t i = 0; i < s->n_clients; i++) {
        const Ovl__ClientInfo *c = s->clients[i];
        char mem[32], rank[16];
        human_bytes(c->mapped_bytes, mem, sizeof(mem));
        if (c->rank >= 0)
            snprintf(rank, sizeof(rank), "%d", c->rank);
        else
            snprintf(rank, sizeof(rank), "-");
        printf("  %-4" PRIu64 "  %8d  %6u  %s  %s  %4s  %7u  %10s\n", c->id, c->pid, c->uid,
               cell(c->name, 16), term_or_dash(c->job, 20), rank, c->buffers, mem);
    }
    if (s->restricted)
        printf("\n(%u job%s and %u client%s of other users not shown)\n", s->other_jobs,
               s->other_jobs == 1 ? "" : "s", s->other_clients, s->other_clients == 1 ? "" : "s");
    /* Only an ovld with links to other nodes (peer_listen) has peers. */
    if (!s->peer_self || !s->peer_self[0])
        return;
    printf("\nPEERS (%zu), this node: %s\n", s->n_peers, term(s->peer_self));
    if (s->n_peers)
        printf("  %-24s  %-10s  %12s  %10s  %10s  %6s  %s\n", "ADDRESS", "STATE", "ROUND TRIP",
               "MSGS IN", "MSGS OUT", "ERRORS", "LAST ERROR");
    for (size_t i = 0; i < s->n_peers; i++) {
        const Ovl__PeerInfo *p = s->peers[i];
        char rtt[32];
        if (p->rtt_s > 0)
            snprintf(rtt, sizeof(rtt), "%.3f ms", p->rtt_s * 1e3);
        else
            snprintf(rtt, sizeof(rtt), "-");
        printf("  %s  %s  %12s  %10" PRIu64 "  %10" PRIu64 "  %6" PRIu64 "  %s\n",
               cell(p->address, 24), cell(p->state, 10), rtt, p->msgs_in, p->msgs_out, p->errors,
               term_or_dash(p->last_error, 0));
    }
}

/* ---------------------------------------------------------- commands */

static int connect_or_die(ovl_client_t **cl)
{
    ovl_status_t st = ovl_connect(socket_opt, cl);
    if (st != OVL_OK) {
        fprintf(stderr, "ovlctl: %s\n", term(ovl_connect_error()));
        return 1;
    }
    return 0;
}

/* The options of a command that takes --json and --help only: -1 to go
 * on (*json set), else the exit status (0 after --help, EXIT_USAGE). */
static int json_options(int argc, char **argv, bool *json)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        if (c == 'j') {
            *json = true;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            return EXIT_USAGE;
        }
    }
    return -1;
}

static int cmd_status(int argc, char **argv)
{
    bool json = false;
    int rc = json_options(argc, argv, &json);
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        fprintf(stderr, "ovlctl status: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    ovl_client_t *cl;
    if (connect_or_die(&cl))
        return 1;
    Ovl__Response *r = NULL;
    if (libovl_status(cl, &r) != OVL_OK) {
        fprintf(stderr, "ovlctl: status: %s\n", term(ovl_last_error(cl)));
        ovl_disconnect(cl);
        return 1;
    }
    if (json)
        libovl_status_json_write(stdout, r->status);
    else
        print_status_table(r->status);
    libovl_response_free(r);
    ovl_disconnect(cl);
    return 0;
}

static int parse_u64(const char *name, const char *s, uint64_t *ret)
{
    if (ovl_parse_u64(s, ret) == 0)
        return 0;
    fprintf(stderr, "ovlctl: %s: '%s' is not a number\n", name, s ? s : "");
    return -1;
}

/*
 * Whether a plan text from ovld (docs/plans.md: the plan line, then a bs
 * line where the op has several Bs) says p's transb and Bs, for a p with
 * transb or several Bs: an ovld that predates them in the Plan request
 * ignores them, and plans one B without transb.
 */
static bool daemon_planned(const char *text, const ovl_plan_params_t *p)
{
    const char *nl = text ? strchr(text, '\n') : NULL;
    if (!nl)
        return false;
    const char *t = strstr(text, " transb=yes ");
    if (p->transb && (!t || t > nl))
        return false;
    if (p->nb <= 1)
        return true;
    /* "bs nb=3 n=256,64,96\n": at most 8 numbers of 20 digits */
    char want[256];
    size_t len = (size_t)snprintf(want, sizeof(want), "bs nb=%u n=%" PRIu64, p->nb, p->n);
    for (uint32_t i = 1; i < p->nb && i < OVL_PLAN_MAX_BS && len < sizeof(want); i++)
        len += (size_t)snprintf(want + len, sizeof(want) - len, ",%" PRIu64, p->n_more[i - 1]);
    if (len + 1 >= sizeof(want))
        return false;
    want[len++] = '\n';
    want[len] = '\0';
    /* the bs line is one of the lines between the header and buffers (a
     * "chosen by" line may come first: docs/plans.md, "The format") */
    const char *end = strstr(text, "\nbuffers ");
    for (const char *line = nl + 1; line && (!end || line <= end); line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (strncmp(line, want, len) == 0)
            return true;
        if (strncmp(line, "buffers ", 8) == 0)
            break;
    }
    return false;
}

/* --local-ranks: comma-separated node sizes, each > 0, at most
 * OVL_PLAN_MAX_WORLD of them. 0, or -1 after saying why. */
static int parse_sizes(const char *arg, uint64_t *sizes, uint32_t *ret_n)
{
    char *list = strdup(arg), *save = NULL;
    uint32_t n = 0;
    int bad = 0;
    if (!list) {
        fprintf(stderr, "ovlctl: out of memory\n");
        return -1;
    }
    for (char *t = strtok_r(list, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
        if (n == OVL_PLAN_MAX_WORLD) {
            fprintf(stderr, "ovlctl: --local-ranks: at most %d nodes\n", OVL_PLAN_MAX_WORLD);
            bad = -1;
            break;
        }
        bad = parse_u64("--local-ranks", t, &sizes[n]);
        if (!bad && (sizes[n] == 0 || sizes[n] > OVL_PLAN_MAX_WORLD)) {
            fprintf(stderr, "ovlctl: --local-ranks: every node has 1 to %d ranks\n",
                    OVL_PLAN_MAX_WORLD);
            bad = -1;
        }
        n++;
    }
    free(list);
    if (!bad && n == 0) {
        fprintf(stderr, "ovlctl: --local-ranks: no node\n");
        bad = -1;
    }
    *ret_n = n;
    return bad;
}

/* The checks of the plan's topology, --nodes (node-major, world/nodes
 * each) or --local-ranks (node-major, the sizes given): 0, or EXIT_USAGE
 * after saying why. */
static int plan_topology_check(uint32_t world, uint64_t nodes, const uint64_t *sizes,
                               uint32_t nsizes, bool daemon)
{
    uint64_t total = 0;
    if (nodes && nsizes) {
        fprintf(stderr, "ovlctl plan: --nodes or --local-ranks, not both\n");
        return EXIT_USAGE;
    }
    if (daemon) {
        /* the Plan request has no topology: ovld plans for its own */
        fprintf(stderr, "ovlctl plan: --nodes and --local-ranks plan here only, not with "
                        "--daemon\n");
        return EXIT_USAGE;
    }
    if (world == 0 || world > OVL_PLAN_MAX_WORLD) {
        fprintf(stderr, "ovlctl plan: a topology needs a world of 1 to %d\n", OVL_PLAN_MAX_WORLD);
        return EXIT_USAGE;
    }
    if (nodes && (nodes > world || world % nodes != 0)) {
        fprintf(stderr, "ovlctl plan: --nodes %llu does not divide the world (%u)\n",
                (unsigned long long)nodes, world);
        return EXIT_USAGE;
    }
    for (uint32_t i = 0; i < nsizes; i++)
        total += sizes[i];
    if (nsizes && total != world) {
        fprintf(stderr, "ovlctl plan: --local-ranks add up to %llu, not the world (%u)\n",
                (unsigned long long)total, world);
        return EXIT_USAGE;
    }
    return 0;
}

/* The plan's node_of (world entries; the caller frees it) for a topology
 * that plan_topology_check passed: --nodes (nodes > 0), else the sizes of
 * --local-ranks. NULL if out of memory. */
static uint32_t *plan_node_of(uint32_t world, uint64_t nodes, const uint64_t *sizes)
{
    uint32_t *node_of = malloc(world * sizeof(*node_of));
    if (!node_of)
        return NULL;
    for (uint32_t q = 0, n = 0, left = nodes ? world / (uint32_t)nodes : (uint32_t)sizes[0];
         q < world; q++) {
        if (left == 0) {
            n++;
            left = nodes ? world / (uint32_t)nodes : (uint32_t)sizes[n];
        }
        node_of[q] = n;
        left--;
    }
    return node_of;
}

/*
 * The plan's header line (docs/plans.md: "plan format=... chunks=C ...
 * streams=S ...") against the --chunks and --streams asked for (0: the
 * planner's choice): where the plan has other values, one line on stderr
 * says so and why, so that nobody reads streams=4 as what --streams 2 made.
 * stdout keeps the plan text as the planner wrote it.
 */
static void note_ignored(const char *text, uint32_t chunks, uint32_t streams)
{
    const char *nl = text ? strchr(text, '\n') : NULL;
    const char *algo = text ? strstr(text, " algo=") : NULL;
    const char *c = text ? strstr(text, " chunks=") : NULL;
    const char *s = text ? strstr(text, " streams=") : NULL;
    if (!nl || !algo || algo > nl)
        return;
    bool ring = strncmp(algo, " algo=ring ", 11) == 0;
    bool push = strncmp(algo, " algo=push ", 11) == 0;
    if (streams && s && s < nl) {
        unsigned long got = strtoul(s + 9, NULL, 10);
        if (got != streams)
            fprintf(stderr, "ovlctl plan: --streams %u not used: the plan has streams=%lu (%s)\n",
                    streams, got,
                    ring   ? "ring's streams are fixed by its roles: the client's, a copy "
                             "stream and compute streams"
                    : push ? "push's streams are fixed by its roles: the client's, a copy "
                             "stream and compute streams"
                           : "the planner's limits for this shape");
    }
    if (chunks && c && c < nl) {
        unsigned long got = strtoul(c + 8, NULL, 10);
        if (got != chunks)
            fprintf(stderr,
                    "ovlctl plan: --chunks %u not used: the plan has chunks=%lu (the planner's "
                    "limits for this algorithm and shape)\n",
                    chunks, got);
    }
}

/* getopt_long's values for the options of `ovlctl plan` that have no
 * short form. */
enum {
    O_ALGO = 1,
    O_WORLD,
    O_RANK,
    O_CHUNKS,
    O_STREAMS,
    O_DTYPE,
    O_AOUT,
    O_TRANSB,
    O_STRIDED,
    O_SHARED_GPU,
    O_ALLGATHER,
    O_MORE_N,
    O_DAEMON,
    O_NODES,
    O_LOCAL_RANKS,
    O_KIND,
    O_OP,
    O_REDUCE,
    O_B_DTYPE,
    O_OUT_DTYPE,
    O_SCALE,
    O_A_SCALE,
    O_B_SCALE,
    O_BIAS,
    O_FAST_ACCUM
};

/* --scale, --a-scale, --b-scale: a mode's name into *ret; 0, or
 * EXIT_USAGE after saying why. */
static int parse_scale_mode(const char *opt, const char *arg, ovl_scale_mode_t *ret)
{
    if (ovl_scale_mode_parse(arg, ret) == OVL_OK)
        return 0;
    fprintf(stderr, "ovlctl: %s: '%s' is not tensor, row, 1x128 or 128x128\n", opt, arg);
    return EXIT_USAGE;
}

/* `ovlctl plan`'s options, read by plan_options. Once they passed its
 * checks, p holds the op and the planner's knobs (world, rank, chunks and
 * streams in range; node_of NULL: plan_here makes it from the topology). */
typedef struct plan_opts {
    ovl_plan_params_t p;
    uint64_t world, rank, chunks, streams; /* as given, range-checked at the end */
    bool have_world, have_rank;
    bool daemon;        /* --daemon: ovld plans, not ovlctl */
    bool reduce_given;  /* --reduce */
    bool scaling_given; /* an option of a scaled op: only with an fp8 --dtype */
    bool local_only;    /* --strided, --shared-gpu or --allgather: not with --daemon */
    /* the topology: --nodes (nodes > 0), or --local-ranks' sizes */
    uint64_t nodes, sizes[OVL_PLAN_MAX_WORLD];
    uint32_t nsizes;
} plan_opts_t;

/* --more-n's comma-separated list (B 1's n, B 2's, ...) into p's Bs after
 * the first. 0, or the exit status after saying why: EXIT_USAGE, or
 * EXIT_FAILURE out of memory. */
static int parse_more_n(const char *arg, ovl_plan_params_t *p)
{
    char *list = strdup(arg), *save = NULL;
    int bad = 0;
    if (!list) {
        fprintf(stderr, "ovlctl: out of memory\n");
        return EXIT_FAILURE;
    }
    p->nb = 1;
    for (char *t = strtok_r(list, ",", &save); t && !bad; t = strtok_r(NULL, ",", &save)) {
        if (p->nb >= OVL_PLAN_MAX_BS) {
            fprintf(stderr, "ovlctl: --more-n: at most %d Bs after the first\n",
                    OVL_PLAN_MAX_BS - 1);
            bad = -1;
            break;
        }
        bad = parse_u64("--more-n", t, &p->n_more[p->nb - 1]);
        if (!bad && p->n_more[p->nb - 1] == 0) {
            fprintf(stderr, "ovlctl: --more-n: every n must be positive\n");
            bad = -1;
        }
        p->nb++;
    }
    free(list);
    return bad ? EXIT_USAGE : 0;
}

/* One option of `ovlctl plan` (getopt_long's c, and arg its optarg) into
 * o: -1 to go on, else the exit status (0 after --help; EXIT_USAGE, or
 * EXIT_FAILURE out of memory, after saying why). */
static int plan_option(plan_opts_t *o, int c, const char *arg)
{
    ovl_plan_params_t *p = &o->p;
    int bad = 0;
    switch (c) {
    case O_OP:
        /* ovl-demo's and ovl-bench's spelling of the kind */
        if (strcmp(arg, "ag") != 0 && strcmp(arg, "rs") != 0) {
            fprintf(stderr, "ovlctl: --op: '%s' is not ag or rs\n", arg);
            return EXIT_USAGE;
        }
        p->kind = arg[0] == 'r' ? OVL_OP_GEMM_RS : OVL_OP_AG_GEMM;
        break;
    case O_KIND:
        if (ovl_op_kind_parse(arg, &p->kind) != OVL_OK) {
            fprintf(stderr, "ovlctl: --kind: unknown op kind '%s' (ovlctl knows:", arg);
            for (int k = 1; k < OVL_OP_KIND_COUNT; k++)
                fprintf(stderr, " %s", ovl_op_kind_name((ovl_op_kind_t)k));
            fprintf(stderr, ")\n");
            return EXIT_USAGE;
        }
        break;
    case O_REDUCE:
        if (strcmp(arg, "sum") == 0 || strcmp(arg, "avg") == 0) {
            p->reduce_op = arg[0] == 's' ? OVL_REDUCE_SUM : OVL_REDUCE_AVG;
        } else {
            fprintf(stderr, "ovlctl: --reduce: '%s' is not sum or avg\n", arg);
            return EXIT_USAGE;
        }
        o->reduce_given = true;
        break;
    case O_ALGO:
        if (ovl_algo_parse(arg, &p->algo) != OVL_OK) {
            fprintf(stderr, "ovlctl: --algo: unknown algorithm '%s'\n", arg);
            return EXIT_USAGE;
        }
        break;
    case O_DTYPE:
        if (ovl_dtype_parse(arg, &p->dtype) != OVL_OK) {
            fprintf(stderr, "ovlctl: --dtype: unknown dtype '%s'\n", arg);
            return EXIT_USAGE;
        }
        break;
    case O_B_DTYPE:
    case O_OUT_DTYPE: {
        ovl_dtype_t *t = c == O_B_DTYPE ? &p->sc.b_dtype : &p->sc.out_dtype;
        if (ovl_dtype_parse(arg, t) != OVL_OK) {
            fprintf(stderr, "ovlctl: --%s: unknown dtype '%s'\n",
                    c == O_B_DTYPE ? "b-dtype" : "out-dtype", arg);
            return EXIT_USAGE;
        }
        o->scaling_given = true;
        break;
    }
    case O_SCALE:
    case O_A_SCALE:
    case O_B_SCALE: {
        const char *name = c == O_SCALE ? "--scale" : c == O_A_SCALE ? "--a-scale" : "--b-scale";
        ovl_scale_mode_t mode;
        if (parse_scale_mode(name, arg, &mode))
            return EXIT_USAGE;
        if (c != O_B_SCALE)
            p->sc.a_mode = mode;
        if (c != O_A_SCALE)
            p->sc.b_mode = mode;
        o->scaling_given = true;
        break;
    }
    case O_BIAS:
        p->sc.bias = true;
        o->scaling_given = true;
        break;
    case O_FAST_ACCUM:
        p->sc.fast_accum = true;
        o->scaling_given = true;
        break;
    case O_WORLD:
        bad = parse_u64("--world", arg, &o->world);
        o->have_world = true;
        break;
    case O_RANK:
        bad = parse_u64("--rank", arg, &o->rank);
        o->have_rank = true;
        break;
    case O_CHUNKS:
        bad = parse_u64("--chunks", arg, &o->chunks);
        break;
    case O_STREAMS:
        bad = parse_u64("--streams", arg, &o->streams);
        break;
    case 'm':
        bad = parse_u64("-m", arg, &p->m);
        break;
    case 'n':
        bad = parse_u64("-n", arg, &p->n);
        break;
    case 'k':
        bad = parse_u64("-k", arg, &p->k);
        break;
    case O_AOUT:
        p->want_gathered = true;
        break;
    case O_TRANSB:
        p->transb = true;
        break;
    case O_STRIDED:
        p->strided = true;
        o->local_only = true;
        break;
    case O_SHARED_GPU:
        p->shared_gpu = true;
        o->local_only = true;
        break;
    case O_ALLGATHER:
        if (ovl_ag_pref_parse(arg, &p->allgather) != OVL_OK) {
            fprintf(stderr, "ovlctl: --allgather: '%s' is not one of auto, nccl, copy\n", arg);
            return EXIT_USAGE;
        }
        o->local_only = true;
        break;
    case O_MORE_N: {
        int rc = parse_more_n(arg, p);
        if (rc)
            return rc;
        break;
    }
    case O_DAEMON:
        o->daemon = true;
        break;
    case O_NODES:
        bad = parse_u64("--nodes", arg, &o->nodes);
        if (!bad && o->nodes == 0) {
            fprintf(stderr, "ovlctl: --nodes: at least 1\n");
            bad = -1;
        }
        break;
    case O_LOCAL_RANKS:
        bad = parse_sizes(arg, o->sizes, &o->nsizes);
        break;
    case 'h':
        usage(stdout);
        return 0;
    default:
        return EXIT_USAGE;
    }
    return bad ? EXIT_USAGE : -1;
}

/* The checks of `ovlctl plan`'s options together, once every one is read;
 * they set o->p's world, rank, chunks and streams. -1 to go on, else
 * EXIT_USAGE after saying why. */
static int plan_check(plan_opts_t *o)
{
    ovl_plan_params_t *p = &o->p;
    if (!o->have_world || !o->have_rank || !p->m || !p->n || !p->k) {
        fprintf(stderr, "ovlctl plan: --world, --rank, -m, -n and -k are required (m, n, k > 0)\n");
        return EXIT_USAGE;
    }
    if (p->kind == OVL_OP_GEMM_RS && (p->want_gathered || p->nb > 1)) {
        fprintf(stderr, "ovlctl plan: --kind gemm_rs takes no --a-out or --more-n\n");
        return EXIT_USAGE;
    }
    if (!ovl_op_kind_takes_algo(p->kind, p->algo)) {
        fprintf(stderr, "ovlctl plan: --algo %s: %s has %s\n", ovl_algo_name(p->algo),
                ovl_op_kind_name(p->kind), ovl_op_kind_algos(p->kind));
        return EXIT_USAGE;
    }
    if (p->kind != OVL_OP_GEMM_RS && o->reduce_given) {
        fprintf(stderr, "ovlctl plan: --reduce is gemm_rs's\n");
        return EXIT_USAGE;
    }
    /* an fp8 dtype is a scaled op: B transposed (the one layout of
     * cuBLASLt's fp8 GEMM), its other options checked by the planner */
    p->sc.scaled = ovl_dtype_is_fp8(p->dtype);
    if (o->scaling_given && !p->sc.scaled) {
        fprintf(stderr, "ovlctl plan: --b-dtype, --out-dtype, --scale, --a-scale, --b-scale, "
                        "--bias and --fast-accum are for an fp8 --dtype\n");
        return EXIT_USAGE;
    }
    if (p->sc.scaled)
        p->transb = true;
    if (p->kind == OVL_OP_GEMM_RS && o->have_world && o->world && p->m % o->world != 0) {
        fprintf(stderr,
                "ovlctl plan: gemm_rs: -m %" PRIu64 " is not a multiple of the world %" PRIu64
                " (each rank keeps m / world rows of the sum)\n",
                p->m, o->world);
        return EXIT_USAGE;
    }
    if (o->daemon && o->local_only) {
        /* The Plan request carries the op (shape, Bs, transb) and the
         * algorithm's knobs; the daemon plans a dense op of a job whose
         * ranks have GPUs of their own, gathered as its allgather setting
         * says: those come from its jobs and its configuration. */
        fprintf(stderr, "ovlctl plan: --strided, --shared-gpu and --allgather plan here only, not "
                        "with --daemon (ovld takes them from its jobs and its allgather "
                        "setting)\n");
        return EXIT_USAGE;
    }
    if (o->world > UINT32_MAX || o->rank > UINT32_MAX || o->chunks > UINT32_MAX ||
        o->streams > UINT32_MAX) {
        fprintf(stderr, "ovlctl plan: a value is out of range\n");
        return EXIT_USAGE;
    }
    p->world = (uint32_t)o->world;
    p->rank = (uint32_t)o->rank;
    p->chunks = (uint32_t)o->chunks;
    p->streams = (uint32_t)o->streams;
    if ((o->nodes || o->nsizes) &&
        plan_topology_check(p->world, o->nodes, o->sizes, o->nsizes, o->daemon))
        return EXIT_USAGE;
    return -1;
}

/* `ovlctl plan`'s options into *o, checked: -1 to go on, else the exit
 * status (0 after --help; EXIT_USAGE, or EXIT_FAILURE out of memory, after
 * saying why). */
static int plan_options(int argc, char **argv, plan_opts_t *o)
{
    static const struct option opts[] = {
        {"kind", required_argument, NULL, O_KIND},
        {"op", required_argument, NULL, O_OP},
        {"reduce", required_argument, NULL, O_REDUCE},
        {"algo", required_argument, NULL, O_ALGO},
        {"world", required_argument, NULL, O_WORLD},
        {"rank", required_argument, NULL, O_RANK},
        {"chunks", required_argument, NULL, O_CHUNKS},
        {"streams", required_argument, NULL, O_STREAMS},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"a-out", no_argument, NULL, O_AOUT},
        {"transb", no_argument, NULL, O_TRANSB},
        {"strided", no_argument, NULL, O_STRIDED},
        {"shared-gpu", no_argument, NULL, O_SHARED_GPU},
        {"allgather", required_argument, NULL, O_ALLGATHER},
        {"more-n", required_argument, NULL, O_MORE_N},
        {"b-dtype", required_argument, NULL, O_B_DTYPE},
        {"out-dtype", required_argument, NULL, O_OUT_DTYPE},
        {"scale", required_argument, NULL, O_SCALE},
        {"a-scale", required_argument, NULL, O_A_SCALE},
        {"b-scale", required_argument, NULL, O_B_SCALE},
        {"bias", no_argument, NULL, O_BIAS},
        {"fast-accum", no_argument, NULL, O_FAST_ACCUM},
        {"daemon", no_argument, NULL, O_DAEMON},
        {"nodes", required_argument, NULL, O_NODES},
        {"local-ranks", required_argument, NULL, O_LOCAL_RANKS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (plan_opts_t){.p = {.kind = OVL_OP_AG_GEMM,
                             .algo = OVL_ALGO_AUTO,
                             .dtype = OVL_DTYPE_BF16,
                             /* a scaled op's defaults (an fp8 --dtype) */
                             .sc = {.b_dtype = OVL_DTYPE_FP8_E4M3,
                                    .out_dtype = OVL_DTYPE_BF16,
                                    .a_mode = OVL_SCALE_ROW,
                                    .b_mode = OVL_SCALE_ROW}}};
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:k:h", opts, NULL)) != -1)
        if ((rc = plan_option(o, c, optarg)) >= 0)
            return rc;
    if (optind < argc) {
        fprintf(stderr, "ovlctl plan: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    return plan_check(o);
}

/* Asks ovld for its plan of p (a dense op of its jobs: p's topology,
 * strided, shared_gpu and allgather are not sent): libovl_call's status,
 * and *r the answer where it is OVL_OK (the caller frees it). The op goes
 * as an Op carries it: its kind, and its kind's parameters. */
static ovl_status_t plan_request(ovl_client_t *cl, const ovl_plan_params_t *p, Ovl__Response **r)
{
    Ovl__PlanRequest pr = OVL__PLAN_REQUEST__INIT;
    Ovl__AgGemmParams ag = OVL__AG_GEMM_PARAMS__INIT;
    Ovl__GemmRsParams rs = OVL__GEMM_RS_PARAMS__INIT;
    uint64_t more_n[OVL_PLAN_MAX_BS - 1];
    uint64_t given[2];
    Ovl__Scaling sc = OVL__SCALING__INIT;
    sc.b_dtype = (uint64_t)p->sc.b_dtype;
    sc.out_dtype = (uint64_t)p->sc.out_dtype;
    sc.a_mode = (uint64_t)p->sc.a_mode;
    sc.b_mode = (uint64_t)p->sc.b_mode;
    sc.fast_accum = p->sc.fast_accum;
    if (p->sc.scaled && p->sc.bias) {
        given[pr.n_given++] = 20; /* the bias's slot (proto/ovl.proto, Scaling) */
        pr.given = given;
    }
    pr.world = p->world;
    pr.rank = p->rank;
    pr.kind = (uint64_t)p->kind; /* parsed: a kind ovlctl knows */
    if (p->kind == OVL_OP_GEMM_RS) {
        pr.gemm_rs = &rs;
        rs.algo = (uint64_t)p->algo;
        rs.m = p->m;
        rs.n = p->n;
        rs.k = p->k;
        rs.dtype = (uint64_t)p->dtype;
        rs.chunks = p->chunks;
        rs.streams = p->streams;
        rs.transb = p->transb;
        rs.reduce_op = (uint64_t)p->reduce_op;
        rs.scaling = p->sc.scaled ? &sc : NULL;
        Ovl__Request q = OVL__REQUEST__INIT;
        q.body_case = OVL__REQUEST__BODY_PLAN;
        q.plan = &pr;
        return libovl_call(cl, &q, NULL, 0, r);
    }
    pr.ag_gemm = &ag;
    ag.algo = (uint64_t)p->algo;
    ag.m = p->m;
    ag.n = p->n;
    ag.k = p->k;
    ag.dtype = (uint64_t)p->dtype;
    ag.chunks = p->chunks;
    ag.streams = p->streams;
    ag.transb = p->transb;
    ag.scaling = p->sc.scaled ? &sc : NULL;
    if (p->nb > 1) {
        /* parsed by parse_more_n: at most OVL_PLAN_MAX_BS Bs */
        memcpy(more_n, p->n_more, (p->nb - 1) * sizeof(more_n[0]));
        ag.n_more_n = p->nb - 1;
        ag.more_n = more_n;
    }
    if (p->want_gathered) {
        given[pr.n_given++] = 3; /* the gathered A's slot (docs/protocol.md, "Ops") */
        pr.given = given;
    }
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_PLAN;
    q.plan = &pr;
    return libovl_call(cl, &q, NULL, 0, r);
}

/* ovld's plan text for p on stdout: 0, or 1 (with one line on stderr, and
 * nothing on stdout) where it is not the plan of p (daemon_planned). */
static int print_daemon_plan(const char *text, const ovl_plan_params_t *p)
{
    if ((p->transb || p->nb > 1) && !daemon_planned(text, p)) {
        /* An ovld older than the Plan request's transb and more_n ignores
         * them and plans one B without transb: not the plan asked for. */
        fprintf(stderr, "ovlctl: plan: ovld ignored --transb or --more-n (it is older than "
                        "ovlctl); plan here, without --daemon\n");
        return 1;
    }
    note_ignored(text, p->chunks, p->streams);
    print_lines(stdout, text);
    return 0;
}

/* `ovlctl plan --daemon`: ovld's plan of p, printed. The exit status. */
static int plan_daemon(const ovl_plan_params_t *p)
{
    ovl_client_t *cl;
    if (connect_or_die(&cl))
        return 1;
    Ovl__Response *r;
    int rc = 1;
    if (plan_request(cl, p, &r) != OVL_OK) {
        fprintf(stderr, "ovlctl: plan: %s\n", term(ovl_last_error(cl)));
    } else {
        rc = print_daemon_plan(r->plan->text, p);
        libovl_response_free(r);
    }
    ovl_disconnect(cl);
    return rc;
}

/* `ovlctl plan`: the plan of o's options built here (the planner's choice
 * for auto), printed. The exit status. */
static int plan_here(const plan_opts_t *o)
{
    ovl_plan_params_t p = o->p;
    uint32_t *node_of = NULL;
    if (o->nodes || o->nsizes) {
        node_of = plan_node_of(p.world, o->nodes, o->sizes);
        if (!node_of) {
            fprintf(stderr, "ovlctl: out of memory\n");
            return 1;
        }
        p.node_of = node_of;
    }
    if (p.algo == OVL_ALGO_AUTO && p.world > 0 && p.rank < p.world) {
        p.algo = ovl_plan_choose(&p);
        p.chosen = OVL_CHOSEN_RULE;
    }
    ovl_plan_t plan;
    ovl_status_t st = ovl_plan_build(&p, &plan);
    /* words for a refusal, read while p's topology is still there */
    const char *why = st == OVL_ERR_INVALID ? ovl_plan_refusal(&p) : NULL;
    bool nodes_given = node_of != NULL;
    free(node_of); /* the plan keeps a copy */
    if (st != OVL_OK) {
        if (why)
            fprintf(stderr, "ovlctl plan: %s: %s\n", ovl_strerror(st), why);
        else
            fprintf(stderr, "ovlctl plan: %s (world %u, rank %u, chunks <= %d, streams <= %d%s)\n",
                    ovl_strerror(st), p.world, p.rank, OVL_PLAN_MAX_CHUNKS, OVL_PLAN_MAX_STREAMS,
                    nodes_given
                        ? "; across nodes: not strided or allgather copy, shared-gpu ring only"
                        : "");
        return EXIT_USAGE;
    }
    size_t len = ovl_plan_format(&plan, NULL, 0);
    char *text = malloc(len + 1);
    if (!text) {
        ovl_plan_free(&plan);
        fprintf(stderr, "ovlctl: out of memory\n");
        return 1;
    }
    ovl_plan_format(&plan, text, len + 1);
    note_ignored(text, p.chunks, p.streams);
    fputs(text, stdout);
    free(text);
    ovl_plan_free(&plan);
    return 0;
}

static int cmd_plan(int argc, char **argv)
{
    plan_opts_t o;
    int rc = plan_options(argc, argv, &o);
    if (rc >= 0)
        return rc;
    return o.daemon ? plan_daemon(&o.p) : plan_here(&o);
}

/* ----------------------------------------------------------------- tune */

static int cmd_tune(int argc, char **argv)
{
    enum { O_JSON = 1, O_CLEAR };
    static const struct option opts[] = {
        {"json", no_argument, NULL, O_JSON},
        {"clear", no_argument, NULL, O_CLEAR},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false, clear = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_JSON:
            json = true;
            break;
        case O_CLEAR:
            clear = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ovlctl tune: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    ovl_client_t *cl;
    if (connect_or_die(&cl))
        return 1;
    Ovl__TuneRequest tq = OVL__TUNE_REQUEST__INIT;
    tq.clear = clear;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_TUNE;
    q.tune = &tq;
    Ovl__Response *r = NULL;
    if (libovl_call(cl, &q, NULL, 0, &r) != OVL_OK) {
        fprintf(stderr, "ovlctl: tune: %s\n", term(ovl_last_error(cl)));
        ovl_disconnect(cl);
        return 1;
    }
    const Ovl__TuneReply *t = r->tune;
    if (json) {
        printf("{\"measuring\":%s,\"file\":", t->measuring ? "true" : "false");
        libovl_json_string(stdout, t->file);
        printf(",\"keys\":%" PRIu64 ",\"chosen\":%" PRIu64 ",\"cleared\":%s,\"text\":", t->keys,
               t->chosen, t->cleared ? "true" : "false");
        libovl_json_string(stdout, t->text);
        printf("}\n");
    } else {
        if (t->cleared)
            printf("cleared\n");
        printf("auto %s; %" PRIu64 " shape%s, %" PRIu64 " chosen; kept in %s\n",
               t->measuring ? "measures" : "chooses by the planner's rule (tune_samples = 0)",
               t->keys, t->keys == 1 ? "" : "s", t->chosen, t->file[0] ? t->file : "memory only");
        /* the table's lines after its first (the device's), each escaped
         * for a terminal */
        const char *body = strchr(t->text, '\n');
        if (body && body[1]) {
            print_lines(stdout, ++body);
            if (body[strlen(body) - 1] != '\n')
                putchar('\n');
        }
    }
    libovl_response_free(r);
    ovl_disconnect(cl);
    return 0;
}

/* ---------------------------------------------------------------- stats */

/* The text exposition format (node_exporter's textfile collector): the
 * counters since start, which never go back; reset touches none of them. */
static void print_stats_prometheus(const Ovl__StatsReply *r)
{
    const Ovl__StatsBlock *b = r->total;
    printf("# HELP ovl_uptime_seconds time since ovld started\n# TYPE ovl_uptime_seconds gauge\n"
           "ovl_uptime_seconds %.3f\n",
           r->uptime_s);
    printf("# HELP ovl_heap_bytes bytes ovld's allocator holds for live allocations\n"
           "# TYPE ovl_heap_bytes gauge\novl_heap_bytes %" PRIu64 "\n",
           r->heap_bytes);
    printf("# HELP ovl_ops_total ops done, by kind, algorithm and dtype\n"
           "# TYPE ovl_ops_total counter\n");
    for (size_t i = 0; i < b->n_ops; i++)
        printf("ovl_ops_total{kind=\"%s\",algo=\"%s\",dtype=\"%s\"} %" PRIu64 "\n",
               prom_label(b->ops[i]->kind), prom_label(b->ops[i]->algo),
               prom_label(b->ops[i]->dtype), b->ops[i]->count);
    for (size_t i = 0; i < libovl_stat_nfields; i++) {
        const libovl_stat_field_t *f = &libovl_stat_fields[i];
        if (!f->prom)
            continue;
        printf("# HELP ovl_%s %s\n# TYPE ovl_%s %s\novl_%s ", f->prom, f->help, f->prom, f->type,
               f->prom);
        libovl_stat_print(stdout, b, f);
        putchar('\n');
    }
    printf("# HELP ovl_errors_total failed ops and refused requests, by status\n"
           "# TYPE ovl_errors_total counter\n");
    for (size_t i = 0; i < b->n_errors; i++)
        printf("ovl_errors_total{status=\"%d\",name=\"%s\"} %" PRIu64 "\n", b->errors[i]->status,
               prom_label(b->errors[i]->name), b->errors[i]->count);
    printf("# HELP ovl_op_latency_seconds from the last rank's submission to every rank's done\n"
           "# TYPE ovl_op_latency_seconds histogram\n");
    for (size_t i = 0; i < b->n_latency_buckets; i++)
        printf("ovl_op_latency_seconds_bucket{le=\"%.9g\"} %" PRIu64 "\n",
               b->latency_buckets[i]->le_s, b->latency_buckets[i]->count);
    printf("ovl_op_latency_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", b->latency_count);
    printf("ovl_op_latency_seconds_sum %.9g\n", b->latency_sum_s);
    printf("ovl_op_latency_seconds_count %" PRIu64 "\n", b->latency_count);
}

/* One cell of the stats table: counters whole, latencies and issue times in
 * ms. */
static void table_cell(char *buf, size_t len, const Ovl__StatsBlock *b,
                       const libovl_stat_field_t *f)
{
    if (f->kind == LIBOVL_F_U64)
        snprintf(buf, len, "%" PRIu64, libovl_stat_u64(b, f));
    else if (f->kind == LIBOVL_F_MS)
        snprintf(buf, len, "%.3f ms", libovl_stat_dbl(b, f) * 1e3);
    else
        snprintf(buf, len, "%.3f", libovl_stat_dbl(b, f));
}

/* A row's name in the stats table: the JSON key, but a time the table shows
 * in milliseconds is named so ("latency_p50_s" is "latency_p50_ms"), so that
 * a row's name and its unit agree. */
static void table_name(char *buf, size_t len, const libovl_stat_field_t *f)
{
    size_t n = strlen(f->key);
    if (f->kind == LIBOVL_F_MS && n > 2 && strcmp(f->key + n - 2, "_s") == 0)
        snprintf(buf, len, "%.*s_ms", (int)(n - 2), f->key);
    else
        snprintf(buf, len, "%s", f->key);
}

static void print_stats_table(const Ovl__StatsReply *r)
{
    const Ovl__StatsBlock *t = r->total, *w = r->since_reset;
    printf("ovld up %.1f s, heap in use %.1f MiB%s\n\n", r->uptime_s,
           (double)r->heap_bytes / (1 << 20), r->reset_done ? " (counters reset now)" : "");
    printf("  %-24s %18s %18s\n", "", "since start", "since reset");
    for (size_t i = 0; i < libovl_stat_nfields; i++) {
        const libovl_stat_field_t *f = &libovl_stat_fields[i];
        if (f->alias)
            continue;
        char name[64];
        table_name(name, sizeof(name), f);
        printf("  %-24s ", name);
        char a[32], bb[32];
        table_cell(a, sizeof(a), t, f);
        table_cell(bb, sizeof(bb), w, f);
        printf("%18s %18s\n", a, bb);
    }
    printf("  %-24s %18.3f %18.3f\n", "tflops (per busy s)", libovl_stats_tflops(t),
           libovl_stats_tflops(w));
    printf("\nOPS BY KIND, ALGORITHM AND DTYPE (since start)\n");
    for (size_t i = 0; i < t->n_ops; i++)
        printf("  %s %s %s %12" PRIu64 "\n", cell(t->ops[i]->kind, 12), cell(t->ops[i]->algo, 12),
               cell(t->ops[i]->dtype, 6), t->ops[i]->count);
    printf("\nERRORS (since start)\n");
    for (size_t i = 0; i < t->n_errors; i++)
        printf("  %4d %s %12" PRIu64 "\n", t->errors[i]->status, cell(t->errors[i]->name, 40),
               t->errors[i]->count);
}

static int cmd_stats(int argc, char **argv)
{
    enum { O_JSON = 1, O_PROM, O_WATCH, O_RESET };
    static const struct option opts[] = {
        {"json", no_argument, NULL, O_JSON},
        {"prometheus", no_argument, NULL, O_PROM},
        {"watch", required_argument, NULL, O_WATCH},
        {"reset", no_argument, NULL, O_RESET},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int mode = 0, c;
    bool reset = false;
    uint64_t watch = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_JSON:
            mode = O_JSON;
            break;
        case O_PROM:
            mode = O_PROM;
            break;
        case O_RESET:
            reset = true;
            break;
        case O_WATCH:
            if (parse_u64("--watch", optarg, &watch))
                return EXIT_USAGE;
            if (watch == 0 || watch > 86400) {
                fprintf(stderr, "ovlctl: --watch: %" PRIu64 " is out of range 1..86400 seconds\n",
                        watch);
                return EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ovlctl stats: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    ovl_client_t *cl;
    if (connect_or_die(&cl))
        return 1;
    int rc = 0;
    for (;;) {
        Ovl__StatsRequest sq = OVL__STATS_REQUEST__INIT;
        sq.reset = reset;
        Ovl__Request q = OVL__REQUEST__INIT;
        q.body_case = OVL__REQUEST__BODY_STATS;
        q.stats = &sq;
        Ovl__Response *r = NULL;
        if (libovl_call(cl, &q, NULL, 0, &r) != OVL_OK) {
            fprintf(stderr, "ovlctl: stats: %s\n", term(ovl_last_error(cl)));
            rc = 1;
            break;
        }
        if (mode == O_JSON)
            libovl_stats_json_write(stdout, r->stats);
        else if (mode == O_PROM)
            print_stats_prometheus(r->stats);
        else
            print_stats_table(r->stats);
        fflush(stdout);
        libovl_response_free(r);
        reset = false; /* once, even when watching */
        if (!watch)
            break;
        sleep((unsigned)watch);
        if (mode != O_JSON && mode != O_PROM)
            printf("\n");
    }
    ovl_disconnect(cl);
    return rc;
}

/* ---------------------------------------------------------------- peer */

/* `peer ping ADDRESS:PORT`: ovld connects to that node's ovld
 * (authenticating with the cluster key) and measures a round trip. */
static int cmd_peer(int argc, char **argv)
{
    bool json = false;
    int rc = json_options(argc, argv, &json);
    if (rc >= 0)
        return rc;
    if (optind + 2 != argc || strcmp(argv[optind], "ping") != 0) {
        fprintf(stderr, "ovlctl peer: usage: ovlctl peer ping [--json] ADDRESS:PORT\n");
        return EXIT_USAGE;
    }
    const char *addr = argv[optind + 1];
    size_t len = strlen(addr);
    if (len == 0 || len > 63) {
        fprintf(stderr, "ovlctl peer ping: '%s' is not ADDRESS:PORT\n", term(addr));
        return EXIT_USAGE;
    }
    ovl_client_t *cl;
    if (connect_or_die(&cl))
        return 1;
    /* ovld answers within its peer_timeout_ms (at most 60 s) */
    ovl_set_timeout(cl, 75000);
    Ovl__PeerPing pp = OVL__PEER_PING__INIT;
    pp.address.data = (uint8_t *)addr;
    pp.address.len = len;
    Ovl__Request q = OVL__REQUEST__INIT;
    q.body_case = OVL__REQUEST__BODY_PEER_PING;
    q.peer_ping = &pp;
    Ovl__Response *r;
    if (libovl_call(cl, &q, NULL, 0, &r) != OVL_OK) {
        fprintf(stderr, "ovlctl: peer ping: %s\n", term(ovl_last_error(cl)));
        ovl_disconnect(cl);
        return 1;
    }
    const Ovl__PeerPingReply *pr = r->peer_ping;
    char inst[2 * 16 + 1] = "";
    for (size_t i = 0; i < pr->instance.len && i < 16; i++)
        snprintf(inst + 2 * i, 3, "%02x", pr->instance.data[i]);
    if (json) {
        char *a = NULL;
        size_t alen = 0;
        FILE *f = open_memstream(&a, &alen);
        if (f) {
            libovl_json_string(f, pr->address);
            fclose(f);
        }
        printf("{\"address\":%s,\"rtt_s\":%.9g,\"instance\":\"%s\"}\n", a ? a : "\"\"", pr->rtt_s,
               inst);
        free(a);
    } else {
        printf("%s: round trip %.3f ms (instance %s)\n", term(pr->address), pr->rtt_s * 1e3, inst);
    }
    libovl_response_free(r);
    ovl_disconnect(cl);
    return 0;
}

static int cmd_version(void)
{
    printf("ovlctl %s (protocol %d)\n", OVL_VERSION_STRING, OVL_PROTOCOL_VERSION);
    ovl_client_t *cl;
    if (ovl_connect(socket_opt, &cl) != OVL_OK) {
        printf("ovld: unreachable (%s)\n", term(ovl_connect_error()));
        return 1;
    }
    ovl_daemon_info_t info;
    ovl_daemon_info(cl, &info);
    printf("ovld %s (protocol %u), %s backend, pid %d\n", term(info.version), info.protocol_version,
           term(info.backend), info.pid);
    ovl_disconnect(cl);
    return 0;
}

int main(int argc, char **argv)
{
    atexit(esc_free);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--socket") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr,
                        "ovlctl: option '%s' needs an argument: the path of ovld's socket\n",
                        argv[i]);
                return EXIT_USAGE;
            }
            socket_opt = argv[++i];
        } else if (strncmp(argv[i], "--socket=", 9) == 0) {
            socket_opt = argv[i] + 9;
        } else {
            fprintf(stderr, "ovlctl: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[i];
    int sub_argc = argc - i;
    char **sub_argv = argv + i;
    if (strcmp(cmd, "status") == 0)
        return cmd_status(sub_argc, sub_argv);
    if (strcmp(cmd, "plan") == 0)
        return cmd_plan(sub_argc, sub_argv);
    if (strcmp(cmd, "version") == 0)
        return cmd_version();
    if (strcmp(cmd, "stats") == 0)
        return cmd_stats(sub_argc, sub_argv);
    if (strcmp(cmd, "tune") == 0)
        return cmd_tune(sub_argc, sub_argv);
    if (strcmp(cmd, "peer") == 0)
        return cmd_peer(sub_argc, sub_argv);
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ovlctl: unknown command '%s'\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}

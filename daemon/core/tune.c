/*
 * tune.c: `auto` that measures (tune.h).
 */
#include "tune.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    ovl_plan_params_t key; /* normalized: key_of */
    uint64_t hash, id, used;
    uint32_t uid; /* whose ops made it; OWNER_NONE: loaded from the file */
    uint32_t ncand;
    ovl_plan_cand_t cand[OVL_PLAN_MAX_CANDS];
    uint32_t runs[OVL_PLAN_MAX_CANDS];  /* times reported, warm-up included */
    uint32_t fails[OVL_PLAN_MAX_CANDS]; /* ops that came to nothing */
    uint32_t nsamp[OVL_PLAN_MAX_CANDS]; /* times kept (after the warm-up) */
    uint64_t med[OVL_PLAN_MAX_CANDS];   /* medians once chosen (or loaded) */
    uint64_t *samp;                     /* ncand x samples; NULL once chosen */
    uint32_t *nodes;                    /* key.node_of's copy (world entries); NULL: one node */
    struct entry *hnext;                /* the next of its hash bucket */
    uint32_t next;                      /* the candidate handed out next */
    int32_t chosen;                     /* MEASURING, GAVE_UP, or the choice */
} entry_t;

#define OWNER_NONE UINT32_MAX
#define MEASURING  (-1) /* candidates still want samples */
#define GAVE_UP    (-2) /* no time comes, or every candidate failed: the rule's */

struct ovld_tune {
    uint32_t samples, max, max_per_uid;
    entry_t **ents;
    size_t n;
    entry_t **buckets; /* the hash index: nbuckets (a power of two, >= 2 max) chains */
    size_t nbuckets;
    uint64_t next_id, clock;
    bool dirty;
};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

ovld_tune_t *ovld_tune_create(uint32_t samples, uint32_t max_entries, uint32_t max_per_uid)
{
    if (samples == 0 || samples > OVLD_TUNE_MAX_SAMPLES || max_entries == 0)
        return NULL;
    ovld_tune_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->ents = calloc(max_entries, sizeof(*t->ents));
    for (t->nbuckets = 2; t->nbuckets < 2 * (size_t)max_entries;)
        t->nbuckets *= 2;
    t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
    if (!t->ents || !t->buckets) {
        free(t->ents);
        free(t->buckets);
        free(t);
        return NULL;
    }
    t->samples = samples;
    t->max = max_entries;
    t->max_per_uid = max_per_uid;
    t->next_id = 1;
    return t;
}

static void entry_free(entry_t *e)
{
    if (e) {
        free(e->samp);
        free(e->nodes);
        free(e);
    }
}

void ovld_tune_clear(ovld_tune_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        entry_free(t->ents[i]);
    t->n = 0;
    memset(t->buckets, 0, t->nbuckets * sizeof(*t->buckets));
    t->dirty = true;
}

void ovld_tune_destroy(ovld_tune_t *t)
{
    if (!t)
        return;
    ovld_tune_clear(t);
    free(t->ents);
    free(t->buckets);
    free(t);
}

/* The key of params: what auto chooses, the rank and who chose, zeroed. */
static ovl_plan_params_t key_of(const ovl_plan_params_t *p)
{
    ovl_plan_params_t k = *p;
    k.algo = OVL_ALGO_AUTO;
    k.chosen = OVL_CHOSEN_GIVEN;
    k.chunks = 0;
    k.streams = 0;
    k.rank = 0;
    /* every rank on node 0 is one node, as NULL says */
    bool several = false;
    for (uint32_t q = 0; p->node_of && q < p->world && !several; q++)
        several = p->node_of[q] != 0;
    if (!several)
        k.node_of = NULL;
    /* one B is nb 0 or 1 alike, and a B past nb has no n */
    if (k.nb <= 1)
        k.nb = 0;
    for (uint32_t i = k.nb ? k.nb - 1 : 0; i + 1 < OVL_PLAN_MAX_BS; i++)
        k.n_more[i] = 0;
    return k;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t key_hash(const ovl_plan_params_t *k)
{
    uint64_t h = 0;
    h = mix(h, k->kind);
    h = mix(h, k->world);
    h = mix(h, k->m);
    h = mix(h, k->n);
    h = mix(h, k->k);
    h = mix(h, k->dtype);
    h = mix(h, k->nb);
    for (uint32_t i = 0; i + 1 < OVL_PLAN_MAX_BS; i++)
        h = mix(h, k->n_more[i]);
    h = mix(h, (uint64_t)k->transb | (uint64_t)k->want_gathered << 1 | (uint64_t)k->strided << 2 |
                   (uint64_t)k->shared_gpu << 3 | (uint64_t)k->sc.scaled << 4);
    h = mix(h, (uint64_t)k->allgather << 8 | k->reduce_op);
    for (uint32_t q = 0; k->node_of && q < k->world; q++)
        h = mix(h, k->node_of[q]);
    return h;
}

static entry_t *find(ovld_tune_t *t, const ovl_plan_params_t *k, uint64_t h)
{
    for (entry_t *e = t->buckets[h & (t->nbuckets - 1)]; e; e = e->hnext)
        if (e->hash == h && ovl_plan_params_equal(&e->key, k))
            return e;
    return NULL;
}

static void unhash(ovld_tune_t *t, entry_t *e)
{
    for (entry_t **pp = &t->buckets[e->hash & (t->nbuckets - 1)]; *pp; pp = &(*pp)->hnext)
        if (*pp == e) {
            *pp = e->hnext;
            return;
        }
}

/* The entry a ticket names, through the index (NULL: gone since). */
static entry_t *find_id(ovld_tune_t *t, ovld_tune_ticket_t tk)
{
    for (entry_t *e = t->buckets[tk.hash & (t->nbuckets - 1)]; e; e = e->hnext)
        if (e->id == tk.entry)
            return e;
    return NULL;
}

/* Room for one more entry of uid's: uid's least recently used goes when
 * uid holds max_per_uid, else the least recently used of all when full. */
static void make_room(ovld_tune_t *t, uint32_t uid)
{
    /* no user's bound to keep (a loaded key has no user): only a full
     * table makes room, and a table loading is never full */
    if (t->n < t->max && (uid == OWNER_NONE || t->max_per_uid == 0))
        return;
    size_t mine = 0, lru = SIZE_MAX, lru_mine = SIZE_MAX;
    for (size_t i = 0; i < t->n; i++) {
        const entry_t *e = t->ents[i];
        if (lru == SIZE_MAX || e->used < t->ents[lru]->used)
            lru = i;
        if (uid != OWNER_NONE && e->uid == uid) {
            mine++;
            if (lru_mine == SIZE_MAX || e->used < t->ents[lru_mine]->used)
                lru_mine = i;
        }
    }
    size_t out = t->max_per_uid && mine >= t->max_per_uid ? lru_mine
                 : t->n >= t->max                         ? lru
                                                          : SIZE_MAX;
    if (out == SIZE_MAX)
        return;
    unhash(t, t->ents[out]);
    entry_free(t->ents[out]);
    t->ents[out] = t->ents[--t->n];
}

/* A new entry for key k with its candidates (taken by the caller), or NULL
 * without memory. */
static entry_t *entry_new(ovld_tune_t *t, const ovl_plan_params_t *k, uint64_t h,
                          const ovl_plan_cand_t *cand, uint32_t ncand, bool measuring, uint32_t uid)
{
    entry_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    if ((measuring && !(e->samp = calloc((size_t)ncand * t->samples, sizeof(*e->samp)))) ||
        (k->node_of && !(e->nodes = malloc((size_t)k->world * sizeof(*e->nodes))))) {
        entry_free(e);
        return NULL;
    }
    e->key = *k;
    if (e->nodes) {
        memcpy(e->nodes, k->node_of, (size_t)k->world * sizeof(*e->nodes));
        e->key.node_of = e->nodes;
    }
    e->hash = h;
    e->id = t->next_id++;
    e->ncand = ncand;
    memcpy(e->cand, cand, ncand * sizeof(*cand));
    e->chosen = MEASURING;
    e->uid = uid;
    make_room(t, uid);
    t->ents[t->n++] = e;
    e->hnext = t->buckets[h & (t->nbuckets - 1)];
    t->buckets[h & (t->nbuckets - 1)] = e;
    return e;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool dropped(const ovld_tune_t *t, const entry_t *e, uint32_t c)
{
    return e->fails[c] >= t->samples;
}

/* Measuring ends without a choice: the rule's from now on, nothing kept
 * (tune.h). */
static void give_up(entry_t *e)
{
    e->chosen = GAVE_UP;
    free(e->samp);
    e->samp = NULL;
}

/* The median of a candidate's samples so far (0: none). */
static uint64_t median_now(const ovld_tune_t *t, const entry_t *e, uint32_t c)
{
    if (e->chosen >= 0 || !e->samp || e->nsamp[c] == 0)
        return e->med[c];
    uint64_t s[OVLD_TUNE_MAX_SAMPLES];
    memcpy(s, e->samp + (size_t)c * t->samples, e->nsamp[c] * sizeof(*s));
    qsort(s, e->nsamp[c], sizeof(*s), cmp_u64);
    return s[e->nsamp[c] / 2];
}

/* Every candidate has its samples, or is dropped: the least median wins;
 * all dropped: no choice (give_up). */
static void maybe_choose(ovld_tune_t *t, entry_t *e)
{
    for (uint32_t c = 0; c < e->ncand; c++)
        if (!dropped(t, e, c) && e->nsamp[c] < t->samples)
            return;
    int32_t best = -1;
    for (uint32_t c = 0; c < e->ncand; c++) {
        if (dropped(t, e, c))
            continue;
        e->med[c] = median_now(t, e, c);
        if (best < 0 || e->med[c] < e->med[best])
            best = (int32_t)c;
    }
    if (best < 0) {
        give_up(e);
        return;
    }
    e->chosen = best;
    free(e->samp);
    e->samp = NULL;
    t->dirty = true;
}

/* Whether pp leaves what auto measures to ovld: the algorithm to the rule,
 * and the chunks and streams to the planner (an op's own, or the
 * operator's default_chunks, are kept as asked). */
static bool measurable(const ovl_plan_params_t *pp)
{
    return pp->chosen == OVL_CHOSEN_RULE && pp->chunks == 0 && pp->streams == 0;
}

/* Candidate c's plan into pp: its algorithm, chunks and, where it says
 * one, how A is gathered. */
static void apply(const ovl_plan_cand_t *c, ovl_plan_params_t *pp)
{
    pp->algo = c->algo;
    pp->chunks = c->chunks;
    if (c->allgather != OVL_AG_AUTO)
        pp->allgather = c->allgather;
}

void ovld_tune_pick(ovld_tune_t *t, uint32_t uid, ovl_plan_params_t *pp, ovld_tune_ticket_t *ret)
{
    *ret = (ovld_tune_ticket_t){0};
    if (!t || !measurable(pp))
        return;
    ovl_plan_params_t k = key_of(pp);
    uint64_t h = key_hash(&k);
    entry_t *e = find(t, &k, h);
    if (!e) {
        ovl_plan_cand_t cand[OVL_PLAN_MAX_CANDS];
        uint32_t n = ovl_plan_candidates(pp, cand);
        if (n < 2)
            return; /* nothing to choose between: the rule's */
        e = entry_new(t, &k, h, cand, n, true, uid == OWNER_NONE ? OWNER_NONE - 1 : uid);
        if (!e)
            return;
    }
    e->used = ++t->clock;
    if (e->chosen == GAVE_UP)
        return;
    if (e->chosen >= 0) {
        apply(&e->cand[e->chosen], pp);
        pp->chosen = OVL_CHOSEN_MEASURED;
        return;
    }
    /* the next candidate that still wants samples, round robin */
    for (uint32_t i = 0; i < e->ncand; i++) {
        uint32_t c = (e->next + i) % e->ncand;
        if (dropped(t, e, c) || e->nsamp[c] >= t->samples)
            continue;
        e->next = (c + 1) % e->ncand;
        apply(&e->cand[c], pp);
        pp->chosen = OVL_CHOSEN_TRYING;
        *ret = (ovld_tune_ticket_t){.entry = e->id, .hash = e->hash, .cand = c};
        return;
    }
}

bool ovld_tune_peek(const ovld_tune_t *t, ovl_plan_params_t *pp)
{
    if (!t || !measurable(pp))
        return false;
    ovl_plan_params_t k = key_of(pp);
    const entry_t *e = find((ovld_tune_t *)t, &k, key_hash(&k));
    if (!e || e->chosen < 0)
        return false;
    apply(&e->cand[e->chosen], pp);
    pp->chosen = OVL_CHOSEN_MEASURED;
    return true;
}

ovld_tune_outcome_t ovld_tune_outcome_of(ovl_status_t st, bool planner_refused)
{
    if (st == OVL_OK)
        return OVLD_TUNE_TIMED;
    if (planner_refused)
        return OVLD_TUNE_FAILED;
    switch (st) {
    case OVL_ERR_BACKEND:
    case OVL_ERR_NOMEM:
    case OVL_ERR_LIMIT:
    case OVL_ERR_UNSUPPORTED:
    case OVL_ERR_INTERNAL:
        return OVLD_TUNE_FAILED;
    default:
        return OVLD_TUNE_NONE;
    }
}

void ovld_tune_record(ovld_tune_t *t, ovld_tune_ticket_t tk, ovld_tune_outcome_t how, uint64_t ns)
{
    if (!t || tk.entry == 0)
        return;
    entry_t *e = find_id(t, tk);
    if (!e || e->chosen != MEASURING || tk.cand >= e->ncand)
        return;
    uint32_t c = tk.cand;
    switch (how) {
    case OVLD_TUNE_TIMED:
        if (ns == 0) {
            /* ran, but no time came: the timer does not work for it, and
             * measuring this shape would never end */
            give_up(e);
            return;
        }
        if (e->runs[c]++ > 0 && e->nsamp[c] < t->samples)
            e->samp[(size_t)c * t->samples + e->nsamp[c]++] = ns; /* past the warm-up */
        break;
    case OVLD_TUNE_FAILED:
        e->fails[c]++;
        break;
    case OVLD_TUNE_NONE:
        return;
    }
    maybe_choose(t, e);
}

size_t ovld_tune_size(const ovld_tune_t *t)
{
    return t ? t->n : 0;
}

size_t ovld_tune_chosen(const ovld_tune_t *t)
{
    size_t n = 0;
    for (size_t i = 0; t && i < t->n; i++)
        n += t->ents[i]->chosen >= 0;
    return n;
}

void ovld_tune_set_dirty(ovld_tune_t *t)
{
    if (t)
        t->dirty = true;
}

bool ovld_tune_take_dirty(ovld_tune_t *t)
{
    bool d = t && t->dirty;
    if (t)
        t->dirty = false;
    return d;
}

/* ------------------------------------------------------------- the text */

#define TUNE_MAGIC "ovld-tune 1 "

typedef struct out {
    char *buf;
    size_t len, need;
} out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->need < o->len ? o->len - o->need : 0;
    int n = vsnprintf(room ? o->buf + o->need : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->need += (size_t)n;
}

static const char *name_or(const char *s)
{
    return s ? s : "?";
}

static const char *reduce_name(ovl_reduce_op_t op)
{
    return op == OVL_REDUCE_SUM ? "sum" : op == OVL_REDUCE_AVG ? "avg" : NULL;
}

static void put_key(out_t *o, const ovl_plan_params_t *k)
{
    put(o, "kind=%s world=%" PRIu32 " m=%" PRIu64 " n=%" PRIu64, name_or(ovl_op_kind_name(k->kind)),
        k->world, k->m, k->n);
    for (uint32_t i = 1; i < ovl_plan_nb(k) && i < OVL_PLAN_MAX_BS; i++)
        put(o, ",%" PRIu64, k->n_more[i - 1]);
    put(o, " k=%" PRIu64 " dtype=%s transb=%d a_out=%d strided=%d shared_gpu=%d allgather=%s", k->k,
        name_or(ovl_dtype_name(k->dtype)), k->transb, k->want_gathered, k->strided, k->shared_gpu,
        name_or(ovl_ag_pref_name(k->allgather)));
    if (k->kind == OVL_OP_GEMM_RS)
        put(o, " reduce=%s", name_or(reduce_name(k->reduce_op)));
    if (k->node_of) {
        put(o, " nodes=");
        for (uint32_t q = 0; q < k->world; q++)
            put(o, "%s%" PRIu32, q ? "," : "", k->node_of[q]);
    }
    if (k->sc.scaled)
        put(o, " b_dtype=%s out_dtype=%s a_mode=%s b_mode=%s fast_accum=%d bias=%d",
            name_or(ovl_dtype_name(k->sc.b_dtype)), name_or(ovl_dtype_name(k->sc.out_dtype)),
            name_or(ovl_scale_mode_name(k->sc.a_mode)), name_or(ovl_scale_mode_name(k->sc.b_mode)),
            k->sc.fast_accum, k->sc.bias);
}

static void put_cand(out_t *o, const ovl_plan_cand_t *c)
{
    put(o, "%s/%" PRIu32, name_or(ovl_algo_name(c->algo)), c->chunks);
    if (c->allgather != OVL_AG_AUTO)
        put(o, "/%s", name_or(ovl_ag_pref_name(c->allgather)));
}

char *ovld_tune_text(const ovld_tune_t *t, const char *device, bool chosen_only, size_t *ret_len)
{
    size_t need = ovld_tune_format(t, device, chosen_only, NULL, 0);
    char *text = malloc(need + 1);
    if (text)
        ovld_tune_format(t, device, chosen_only, text, need + 1);
    *ret_len = need;
    return text;
}

size_t ovld_tune_format(const ovld_tune_t *t, const char *device, bool chosen_only, char *buf,
                        size_t len)
{
    out_t o = {.buf = buf, .len = len};
    if (len)
        buf[0] = '\0';
    put(&o, TUNE_MAGIC "%s\n", device ? device : "");
    for (size_t i = 0; t && i < t->n; i++) {
        const entry_t *e = t->ents[i];
        if (chosen_only && e->chosen < 0)
            continue;
        put_key(&o, &e->key);
        put(&o, " chose=");
        if (e->chosen >= 0)
            put_cand(&o, &e->cand[e->chosen]);
        else
            put(&o, "-");
        put(&o, " ns=");
        for (uint32_t c = 0; c < e->ncand; c++) {
            put(&o, "%s", c ? "," : "");
            put_cand(&o, &e->cand[c]);
            put(&o, ":%" PRIu64 "%s", median_now(t, e, c), dropped(t, e, c) ? "!" : "");
        }
        put(&o, "%s\n", e->chosen >= 0 ? "" : e->chosen == GAVE_UP ? " gave-up" : " measuring");
    }
    return o.need;
}

/* -------------------------------------------------------------- loading */

/* A decimal of at most UINT64_MAX, the whole of [s, end). */
static bool parse_u64(const char *s, const char *end, uint64_t *ret)
{
    uint64_t v = 0;
    if (s == end || end - s > 20)
        return false;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9' || __builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
            return false;
    }
    *ret = v;
    return true;
}

static bool parse_bool(const char *s, const char *end, bool *ret)
{
    uint64_t v;
    if (!parse_u64(s, end, &v) || v > 1)
        return false;
    *ret = v != 0;
    return true;
}

/* [s, end) as a NUL-terminated name into buf (of len bytes). */
static bool token(const char *s, const char *end, char *buf, size_t len)
{
    if ((size_t)(end - s) >= len)
        return false;
    memcpy(buf, s, (size_t)(end - s));
    buf[end - s] = '\0';
    return true;
}

/* "ALGO/CHUNKS[/copy]" in [s, end) (/copy: A gathered by the copy engine;
 * none: as the key's allgather says). */
static bool parse_cand(const char *s, const char *end, ovl_plan_cand_t *ret)
{
    const char *slash = memchr(s, '/', (size_t)(end - s));
    char name[32];
    uint64_t ch;
    if (!slash || !token(s, slash, name, sizeof(name)) ||
        ovl_algo_parse(name, &ret->algo) != OVL_OK || ret->algo == OVL_ALGO_AUTO)
        return false;
    const char *slash2 = memchr(slash + 1, '/', (size_t)(end - slash - 1));
    if (!parse_u64(slash + 1, slash2 ? slash2 : end, &ch) || ch > OVL_PLAN_MAX_CHUNKS)
        return false;
    ret->chunks = (uint32_t)ch;
    ret->allgather = OVL_AG_AUTO;
    if (slash2 && (!token(slash2 + 1, end, name, sizeof(name)) || strcmp(name, "copy")))
        return false;
    if (slash2)
        ret->allgather = OVL_AG_COPY;
    return true;
}

typedef struct parsed {
    ovl_plan_params_t key;
    uint32_t nodes[OVL_PLAN_MAX_WORLD]; /* key.node_of points here when given */
    uint32_t nnodes;
    ovl_plan_cand_t cand[OVL_PLAN_MAX_CANDS];
    uint64_t med[OVL_PLAN_MAX_CANDS];
    bool drop[OVL_PLAN_MAX_CANDS];
    uint32_t ncand;
    ovl_plan_cand_t chose;
    bool have_chose, measuring;
} parsed_t;

/* One field name=value of a key line into *p; the words of a failure. */
static const char *parse_field(const char *name, const char *v, const char *end, parsed_t *p)
{
    ovl_plan_params_t *k = &p->key;
    char word[32];
    uint64_t u;

    if (!strcmp(name, "kind"))
        return token(v, end, word, sizeof(word)) && ovl_op_kind_parse(word, &k->kind) == OVL_OK
                   ? NULL
                   : "kind";
    if (!strcmp(name, "world"))
        return parse_u64(v, end, &u) && u >= 1 && u <= OVL_PLAN_MAX_WORLD
                   ? (k->world = (uint32_t)u, NULL)
                   : "world";
    if (!strcmp(name, "m"))
        return parse_u64(v, end, &k->m) ? NULL : "m";
    if (!strcmp(name, "k"))
        return parse_u64(v, end, &k->k) ? NULL : "k";
    if (!strcmp(name, "n")) {
        /* N0[,N1...] */
        uint32_t nb = 0;
        for (const char *s = v; s <= end && nb < OVL_PLAN_MAX_BS;) {
            const char *comma = memchr(s, ',', (size_t)(end - s));
            const char *e = comma ? comma : end;
            if (!parse_u64(s, e, nb ? &k->n_more[nb - 1] : &k->n))
                return "n";
            nb++;
            if (!comma)
                break;
            s = comma + 1;
            if (nb == OVL_PLAN_MAX_BS)
                return "n: too many Bs";
        }
        k->nb = nb > 1 ? nb : 0;
        return NULL;
    }
    if (!strcmp(name, "dtype") || !strcmp(name, "b_dtype") || !strcmp(name, "out_dtype")) {
        ovl_dtype_t dt;
        if (!token(v, end, word, sizeof(word)) || ovl_dtype_parse(word, &dt) != OVL_OK)
            return "a dtype";
        if (name[0] == 'd')
            k->dtype = dt;
        else if (name[0] == 'b')
            k->sc.b_dtype = dt;
        else
            k->sc.out_dtype = dt;
        if (name[0] != 'd')
            k->sc.scaled = true;
        return NULL;
    }
    if (!strcmp(name, "a_mode") || !strcmp(name, "b_mode")) {
        ovl_scale_mode_t m;
        if (!token(v, end, word, sizeof(word)) || ovl_scale_mode_parse(word, &m) != OVL_OK)
            return "a scale mode";
        if (name[0] == 'a')
            k->sc.a_mode = m;
        else
            k->sc.b_mode = m;
        k->sc.scaled = true;
        return NULL;
    }
    if (!strcmp(name, "nodes")) {
        /* N0,N1,...: a node per rank */
        for (const char *s = v; s < end;) {
            const char *comma = memchr(s, ',', (size_t)(end - s));
            const char *e = comma ? comma : end;
            if (p->nnodes == OVL_PLAN_MAX_WORLD || !parse_u64(s, e, &u) || u >= OVL_PLAN_MAX_WORLD)
                return "nodes";
            p->nodes[p->nnodes++] = (uint32_t)u;
            s = comma ? comma + 1 : end;
        }
        k->node_of = p->nnodes ? p->nodes : NULL;
        return NULL;
    }
    if (!strcmp(name, "transb"))
        return parse_bool(v, end, &k->transb) ? NULL : "transb";
    if (!strcmp(name, "a_out"))
        return parse_bool(v, end, &k->want_gathered) ? NULL : "a_out";
    if (!strcmp(name, "strided"))
        return parse_bool(v, end, &k->strided) ? NULL : "strided";
    if (!strcmp(name, "shared_gpu"))
        return parse_bool(v, end, &k->shared_gpu) ? NULL : "shared_gpu";
    if (!strcmp(name, "fast_accum"))
        return parse_bool(v, end, &k->sc.fast_accum) ? NULL : "fast_accum";
    if (!strcmp(name, "bias"))
        return parse_bool(v, end, &k->sc.bias) ? NULL : "bias";
    if (!strcmp(name, "allgather"))
        return token(v, end, word, sizeof(word)) && ovl_ag_pref_parse(word, &k->allgather) == OVL_OK
                   ? NULL
                   : "allgather";
    if (!strcmp(name, "reduce")) {
        if (!token(v, end, word, sizeof(word)))
            return "reduce";
        if (!strcmp(word, "sum"))
            k->reduce_op = OVL_REDUCE_SUM;
        else if (!strcmp(word, "avg"))
            k->reduce_op = OVL_REDUCE_AVG;
        else
            return "reduce";
        return NULL;
    }
    if (!strcmp(name, "chose")) {
        if (end - v == 1 && *v == '-')
            return NULL;
        p->have_chose = parse_cand(v, end, &p->chose);
        return p->have_chose ? NULL : "chose";
    }
    if (!strcmp(name, "ns")) {
        /* ALGO/CHUNKS:NS[!],... */
        for (const char *s = v; s < end;) {
            const char *comma = memchr(s, ',', (size_t)(end - s));
            const char *e = comma ? comma : end;
            const char *colon = memchr(s, ':', (size_t)(e - s));
            uint32_t c = p->ncand;
            if (!colon || c == OVL_PLAN_MAX_CANDS || !parse_cand(s, colon, &p->cand[c]))
                return "ns: a candidate";
            const char *ne = e;
            if (ne > colon + 1 && ne[-1] == '!') {
                p->drop[c] = true;
                ne--;
            }
            if (!parse_u64(colon + 1, ne, &p->med[c]))
                return "ns: a time";
            p->ncand++;
            s = comma ? comma + 1 : end;
        }
        return NULL;
    }
    return "an unknown field";
}

/* One line [s, end): a key and its choice into *p; the words of a
 * failure. */
static const char *parse_line(const char *s, const char *end, parsed_t *p)
{
    memset(p, 0, sizeof(*p));
    while (s < end) {
        const char *sp = memchr(s, ' ', (size_t)(end - s));
        const char *e = sp ? sp : end;
        const char *eq = memchr(s, '=', (size_t)(e - s));
        char name[16];
        if ((e - s == 9 && !memcmp(s, "measuring", 9)) ||
            (e - s == 7 && !memcmp(s, "gave-up", 7))) {
            p->measuring = true;
        } else {
            if (!eq || !token(s, eq, name, sizeof(name)))
                return "a field without its value";
            const char *why = parse_field(name, eq + 1, e, p);
            if (why)
                return why;
        }
        s = sp ? sp + 1 : end;
    }
    return NULL;
}

size_t ovld_tune_load(ovld_tune_t *t, const char *device, const char *text, size_t len,
                      size_t *ret_skipped, char *why, size_t whylen)
{
    size_t taken = 0, skipped = 0;
    const char *end = text + len, *nl = memchr(text, '\n', len);
    size_t head = strlen(TUNE_MAGIC);
    if (whylen)
        why[0] = '\0';
    /* the first line: this version, and this device */
    if (!t || !nl || (size_t)(nl - text) != head + strlen(device) ||
        memcmp(text, TUNE_MAGIC, head) || memcmp(text + head, device, strlen(device))) {
        if (whylen)
            snprintf(why, whylen, "not a table of version 1 for %s", device);
        if (ret_skipped)
            *ret_skipped = 0;
        return 0;
    }
    size_t line = 1;
    for (const char *s = nl + 1; s < end;) {
        const char *e = memchr(s, '\n', (size_t)(end - s));
        line++;
        const char *le = e ? e : end;
        parsed_t p;
        const char *bad = parse_line(s, le, &p);
        uint64_t scratch;
        if (!bad && p.key.kind == 0) /* the planner would read it as ag_gemm */
            bad = "kind missing";
        if (!bad && p.key.node_of && p.nnodes != p.key.world)
            bad = "nodes: not one per rank";
        if (!bad && (p.measuring || !p.have_chose))
            bad = "no choice (measuring, or gave up)";
        if (!bad && p.ncand < 2)
            bad = "fewer than two candidates";
        /* the gather is ovld's to choose only where the operator left it
         * (allgather auto): never over a configured nccl or copy */
        for (uint32_t c = 0; !bad && c < p.ncand; c++)
            if (p.cand[c].allgather != OVL_AG_AUTO && p.key.allgather != OVL_AG_AUTO)
                bad = "a gather the key's allgather does not leave to ovld";
        int32_t chosen = -1;
        for (uint32_t c = 0; !bad && c < p.ncand; c++)
            if (p.cand[c].algo == p.chose.algo && p.cand[c].chunks == p.chose.chunks &&
                p.cand[c].allgather == p.chose.allgather)
                chosen = (int32_t)c;
        if (!bad && chosen < 0)
            bad = "the choice is none of the candidates";
        if (!bad) {
            /* the choice must plan: the key with it is valid params */
            ovl_plan_params_t q = p.key;
            apply(&p.chose, &q);
            if (ovl_plan_scratch_bytes(&q, &scratch) != OVL_OK)
                bad = "the choice does not plan";
        }
        ovl_plan_params_t k = key_of(&p.key);
        uint64_t h = key_hash(&k);
        if (!bad && find(t, &k, h))
            bad = "a key given twice";
        if (!bad && taken >= t->max)
            bad = "past the table's size";
        if (!bad) {
            entry_t *en = entry_new(t, &k, h, p.cand, p.ncand, false, OWNER_NONE);
            if (!en) {
                bad = "out of memory";
            } else {
                en->chosen = chosen;
                memcpy(en->med, p.med, sizeof(p.med));
                for (uint32_t c = 0; c < p.ncand; c++)
                    en->fails[c] = p.drop[c] ? t->samples : 0;
                en->used = ++t->clock;
                taken++;
            }
        }
        if (bad) {
            if (skipped++ == 0 && whylen)
                snprintf(why, whylen, "line %zu: %s", line, bad);
        }
        s = e ? e + 1 : end;
    }
    if (taken)
        t->dirty = true;
    if (ret_skipped)
        *ret_skipped = skipped;
    return taken;
}

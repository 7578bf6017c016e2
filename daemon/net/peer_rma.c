/*
 * peer_rma.c: remote reads over UCX (peer.h, peer_internal.h): memory this
 * process maps for peers to read, its packed keys, and ovld_peer_get's
 * reads of a peer's memory, in pieces. The transport (peer.c) drives what
 * is left of a read outside UCX's progress (peer_rma_reap) and ends the
 * reads at its close.
 */
#include "peer_internal.h"

#include <stdlib.h>

/*
 * A read of ovld_peer_get, in pieces of at most GET_PIECE bytes, at most
 * GET_WINDOW of them in flight. One read of hundreds of MiB would hold the
 * peer's other messages (heartbeats) behind it on a stream transport (TCP)
 * for longer than peer_timeout_ms, and the link would be declared dead
 * while it carried data (2 daemons, 256 MiB rows, UCX 1.13 over TCP: "not
 * heard from for 1089 ms"). In pieces, each completed piece is heard from
 * the peer (it is up: its memory was served), and the peer's messages pass
 * between pieces.
 */
#define GET_PIECE  (4u << 20)
#define GET_WINDOW 4u
typedef struct getw {
    struct getw *next;
    ovld_peer_t *peer;
    link_t *link;    /* posted on (counted in its sends); NULL once completed */
    ucp_rkey_h rkey; /* unpacked on link's endpoint; destroyed when the read completes */
    uint64_t raddr;  /* the whole read: from raddr into dst, len bytes */
    char *dst;
    size_t len;
    size_t posted;     /* bytes posted so far, from the start */
    unsigned inflight; /* pieces posted, not completed */
    bool failed;       /* a piece failed (st, why say how): no more are posted */
    bool more;         /* a piece completed: reap posts the next ones */
    ovld_peer_get_fn done;
    void *arg;
    bool finished;
    ovl_status_t st;
    char why[WHY_MAX];
} getw_t;

/* A range mapped for peers to read. */
struct ovld_peer_mem {
    ucp_mem_h memh;
    void *rkey; /* ucp_rkey_pack's */
    size_t rkey_len;
};

/* ------------------------------------------------------- remote reads */

ovl_status_t ovld_peers_mem_map(ovld_peers_t *ps, void *addr, size_t len, ovld_peer_mem_t **ret,
                                char *err, size_t errlen)
{
    if (ps->closing || !ps->ctx) {
        set_err(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    if (!addr || len == 0) {
        set_err(err, errlen, "nothing to map (%zu bytes at %p)", len, addr);
        return OVL_ERR_INVALID;
    }
    ovld_peer_mem_t *m = calloc(1, sizeof(*m));
    if (!m) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    /* Peers read it, and nothing more: no remote write access. */
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT,
        .address = addr,
        .length = len,
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ,
    };
    ucs_status_t us = ucp_mem_map(ps->ctx, &mp, &m->memh);
    if (us != UCS_OK) {
        free(m);
        set_err(err, errlen, "UCX: ucp_mem_map of %zu bytes: %s", len, ucs_status_string(us));
        return OVL_ERR_SYSTEM;
    }
    us = ucp_rkey_pack(ps->ctx, m->memh, &m->rkey, &m->rkey_len);
    if (us != UCS_OK) {
        (void)ucp_mem_unmap(ps->ctx, m->memh);
        free(m);
        set_err(err, errlen, "UCX: ucp_rkey_pack: %s", ucs_status_string(us));
        return OVL_ERR_SYSTEM;
    }
    *ret = m;
    return OVL_OK;
}

const void *ovld_peer_mem_rkey(const ovld_peer_mem_t *m, size_t *ret_len)
{
    *ret_len = m->rkey_len;
    return m->rkey;
}

void ovld_peers_mem_unmap(ovld_peers_t *ps, ovld_peer_mem_t *m)
{
    if (!m)
        return;
    ucp_rkey_buffer_release(m->rkey);
    /* Without a context (closed), the mapping went with it. */
    if (ps->ctx) {
        ucs_status_t us = ucp_mem_unmap(ps->ctx, m->memh);
        if (us != UCS_OK)
            say(ps, OVLD_REPORT_WARN, "peers: ucp_mem_unmap: %s", ucs_status_string(us));
    }
    free(m);
}

/* The whole read is over (its pieces completed, or one failed and the
 * rest completed): its key goes now, while the endpoint it was unpacked on
 * exists; reap calls done. */
static void get_finish(getw_t *g)
{
    ucp_rkey_destroy(g->rkey);
    g->rkey = NULL;
    g->link->sends--;
    g->link = NULL;
    g->finished = true;
    if (!g->failed)
        g->st = OVL_OK;
    kick(g->peer->ps);
}

/* One piece completed (inside progress, or at once when posted): a piece
 * served is the peer heard from, on every link of it. */
static void get_piece_done(getw_t *g, ucs_status_t status)
{
    if (g->finished)
        return; /* the transport closed under it (ovld_peers_close) */
    g->inflight--;
    if (status == UCS_OK) {
        ovld_peers_t *ps = g->peer->ps;
        uint64_t now = now_ms(ps);
        for (link_t *l = ps->links; l; l = l->next)
            if (l->peer == g->peer && l->state == L_UP)
                l->heard = now;
    } else if (!g->failed) {
        g->failed = true;
        g->st = OVL_ERR_CLOSED;
        snprintf(g->why, sizeof(g->why), "reading from peer %s: UCX: %s", g->peer->name,
                 ucs_status_string(status));
    }
    if (g->inflight == 0 && (g->failed || g->posted == g->len))
        get_finish(g);
    else
        g->more = true;
    kick(g->peer->ps);
}

static void on_got(void *req, ucs_status_t status, void *user_data)
{
    get_piece_done(user_data, status);
    ucp_request_free(req);
}

/* Posts the read's next pieces, up to GET_WINDOW in flight (outside UCX's
 * progress: ovld_peer_get, reap). A post refused fails the read. */
static void get_post(getw_t *g)
{
    g->more = false;
    while (!g->finished && !g->failed && g->posted < g->len && g->inflight < GET_WINDOW) {
        size_t n = g->len - g->posted < GET_PIECE ? g->len - g->posted : GET_PIECE;
        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = on_got,
            .user_data = g,
        };
        ucs_status_ptr_t r =
            ucp_get_nbx(g->link->ep, g->dst + g->posted, n, g->raddr + g->posted, g->rkey, &rp);
        g->posted += n;
        g->inflight++;
        if (UCS_PTR_IS_ERR(r))
            get_piece_done(g, UCS_PTR_STATUS(r));
        else if (r == NULL)
            get_piece_done(g, UCS_OK);
    }
    kick(g->peer->ps);
}

ovl_status_t ovld_peer_get(ovld_peer_t *p, uint64_t remote_addr, const void *rkey, size_t rkey_len,
                           void *dst, size_t len, ovld_peer_get_fn done, void *arg, char *err,
                           size_t errlen)
{
    ovld_peers_t *ps = p->ps;
    if (ps->closing) {
        set_err(err, errlen, "ovld is shutting down");
        return OVL_ERR_SHUTDOWN;
    }
    if (!dst || len == 0 || !rkey || rkey_len == 0) {
        set_err(err, errlen, "reading from peer %s: nothing to read (%zu bytes, a key of %zu)",
                p->name, len, rkey_len);
        return OVL_ERR_INVALID;
    }
    link_t *l = p->tx;
    if (p->state != PEER_UP || !l || !l->ep || l->ep_failed) {
        set_err(err, errlen, "reading from peer %s: it is not up", p->name);
        return OVL_ERR_CLOSED;
    }
    getw_t *g = calloc(1, sizeof(*g));
    if (!g) {
        set_err(err, errlen, "out of memory");
        return OVL_ERR_NOMEM;
    }
    /* UCX parses the key without its length (ucp.h): keys come from
     * authenticated peers only. */
    ucs_status_t us = ucp_ep_rkey_unpack(l->ep, rkey, &g->rkey);
    if (us != UCS_OK) {
        free(g);
        set_err(err, errlen, "reading from peer %s: its memory key is refused (%s)", p->name,
                ucs_status_string(us));
        return OVL_ERR_PROTOCOL;
    }
    g->peer = p;
    g->link = l;
    g->raddr = remote_addr;
    g->dst = dst;
    g->len = len;
    g->done = done;
    g->arg = arg;
    l->sends++; /* the link stays until the read completed */
    g->next = ps->gets;
    ps->gets = g;
    get_post(g);
    if (g->finished && g->failed) { /* refused at once, every piece: said here */
        ps->gets = g->next;
        set_err(err, errlen, "%s", g->why);
        free(g);
        return OVL_ERR_CLOSED;
    }
    return OVL_OK;
}

/* -------------------------------------------- the transport's turns */

/* Outside UCX's progress (reap): the reads that may go on post their next
 * pieces; those that are over are taken off, and their owners hear. */
void peer_rma_reap(ovld_peers_t *ps)
{
    for (getw_t *g = ps->gets; g; g = g->next)
        if (g->more && !g->finished)
            get_post(g);
    for (getw_t **gp = &ps->gets; *gp;) {
        getw_t *g = *gp;
        if (!g->finished) {
            gp = &g->next;
            continue;
        }
        *gp = g->next;
        g->done(g->arg, g->st, g->why);
        free(g);
        gp = &ps->gets; /* the callback may have added reads: from the start */
    }
}

/* ovld_peers_close, before the worker goes: the reads UCX has not
 * completed end, their keys destroyed while the endpoints exist. */
void peer_rma_shutdown(ovld_peers_t *ps)
{
    for (getw_t *g = ps->gets; g; g = g->next) {
        if (g->finished)
            continue;
        ucp_rkey_destroy(g->rkey);
        g->rkey = NULL;
        g->link = NULL;
        g->finished = true;
        g->st = OVL_ERR_SHUTDOWN;
        snprintf(g->why, sizeof(g->why), "reading from peer %s: ovld is shutting down",
                 g->peer->name);
    }
}

/* ovld_peers_close, once the worker is gone: every read's owner hears. */
void peer_rma_finish(ovld_peers_t *ps)
{
    while (ps->gets) {
        getw_t *g = ps->gets;
        ps->gets = g->next;
        g->done(g->arg, g->st, g->why);
        free(g);
    }
}

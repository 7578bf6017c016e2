/*
 * wire.c: framing, fd queues and the two socket calls both sides use.
 */
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

const uint8_t ovl_wire_magic[4] = {'O', 'V', 'L', '1'};

#define READ_SLACK 4096u /* receive granularity beyond the current frame */

void ovl_wire_header_encode(uint8_t out[OVL_WIRE_HEADER_SIZE], uint32_t len)
{
    memcpy(out, ovl_wire_magic, 4);
    out[4] = (uint8_t)(len & 0xff);
    out[5] = (uint8_t)((len >> 8) & 0xff);
    out[6] = (uint8_t)((len >> 16) & 0xff);
    out[7] = (uint8_t)((len >> 24) & 0xff);
}

static uint32_t header_len(const uint8_t *h)
{
    return (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
}

/* ------------------------------------------------------------- reading */

void ovl_wire_reader_init(ovl_wire_reader_t *r, uint32_t max_body)
{
    memset(r, 0, sizeof(*r));
    r->max_body = max_body ? max_body : OVL_WIRE_DEFAULT_MAX;
}

void ovl_wire_reader_free(ovl_wire_reader_t *r)
{
    free(r->buf);
    memset(r, 0, sizeof(*r));
}

size_t ovl_wire_reader_pending(const ovl_wire_reader_t *r)
{
    return r->end - r->start;
}

/*
 * Checks the header at the front, if complete. Sets r->failed on a bad one,
 * so that no call after it allocates for the announced length.
 */
static ovl_status_t check_header(ovl_wire_reader_t *r, uint32_t *ret_len)
{
    if (r->failed)
        return r->failed;
    size_t have = r->end - r->start;
    if (have == 0)
        return OVL_ERR_AGAIN; /* also keeps NULL + 0 out of a fresh reader */
    const uint8_t *h = r->buf + r->start;
    /* A bad magic is refused as soon as its first wrong byte arrives. */
    for (size_t i = 0; i < have && i < 4; i++)
        if (h[i] != ovl_wire_magic[i])
            return r->failed = OVL_ERR_PROTOCOL;
    if (have < OVL_WIRE_HEADER_SIZE)
        return OVL_ERR_AGAIN;
    uint32_t len = header_len(h);
    if (len > r->max_body)
        return r->failed = OVL_ERR_LIMIT;
    *ret_len = len;
    return OVL_OK;
}

ovl_status_t ovl_wire_reader_space(ovl_wire_reader_t *r, uint8_t **ret_ptr, size_t *ret_avail)
{
    uint32_t len = 0;
    ovl_status_t st = check_header(r, &len);
    if (st != OVL_OK && st != OVL_ERR_AGAIN)
        return st;

    /* Move what is left to the front before growing. */
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    /* Enough for the frame at the front (its length is known and checked)
     * and for what is already here (frames not taken yet), plus some slack
     * to read the next header in the same call: never zero room. */
    size_t front = st == OVL_OK ? OVL_WIRE_HEADER_SIZE + (size_t)len : 0;
    size_t want = (front > r->end ? front : r->end) + READ_SLACK;
    if (want > r->cap) {
        size_t cap = r->cap ? r->cap : READ_SLACK;
        while (cap < want)
            cap *= 2;
        uint8_t *nb = realloc(r->buf, cap);
        if (!nb)
            return OVL_ERR_NOMEM;
        r->buf = nb;
        r->cap = cap;
    }
    *ret_ptr = r->buf + r->end;
    *ret_avail = r->cap - r->end;
    return OVL_OK;
}

void ovl_wire_reader_commit(ovl_wire_reader_t *r, size_t n)
{
    r->end += n;
}

ovl_status_t ovl_wire_reader_feed(ovl_wire_reader_t *r, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n > 0) {
        uint8_t *dst;
        size_t avail;
        ovl_status_t st = ovl_wire_reader_space(r, &dst, &avail);
        if (st != OVL_OK)
            return st;
        size_t take = n < avail ? n : avail;
        memcpy(dst, p, take);
        ovl_wire_reader_commit(r, take);
        p += take;
        n -= take;
    }
    return OVL_OK;
}

ovl_status_t ovl_wire_reader_next(ovl_wire_reader_t *r, const uint8_t **ret_body, uint32_t *ret_len)
{
    uint32_t len = 0;
    ovl_status_t st = check_header(r, &len);
    if (st != OVL_OK)
        return st;
    if (r->end - r->start < OVL_WIRE_HEADER_SIZE + (size_t)len)
        return OVL_ERR_AGAIN;
    *ret_body = r->buf + r->start + OVL_WIRE_HEADER_SIZE;
    *ret_len = len;
    r->start += OVL_WIRE_HEADER_SIZE + (size_t)len;
    return OVL_OK;
}

/* ------------------------------------------------------ passed fds */

void ovl_fdq_init(ovl_fdq_t *q)
{
    memset(q, 0, sizeof(*q));
}

ovl_status_t ovl_fdq_push(ovl_fdq_t *q, int fd)
{
    if (q->count == OVL_WIRE_MAX_FDS) {
        close(fd);
        return OVL_ERR_LIMIT;
    }
    q->fds[(q->head + q->count) % OVL_WIRE_MAX_FDS] = fd;
    q->count++;
    return OVL_OK;
}

int ovl_fdq_pop(ovl_fdq_t *q)
{
    if (q->count == 0)
        return -1;
    int fd = q->fds[q->head];
    q->head = (q->head + 1) % OVL_WIRE_MAX_FDS;
    q->count--;
    return fd;
}

void ovl_fdq_close_all(ovl_fdq_t *q)
{
    int fd;
    while ((fd = ovl_fdq_pop(q)) >= 0)
        close(fd);
}

ovl_status_t ovl_wire_recv(int sock, ovl_wire_reader_t *r, ovl_fdq_t *q, size_t *ret_n)
{
    uint8_t *dst;
    size_t avail;
    ovl_status_t st = ovl_wire_reader_space(r, &dst, &avail);
    if (st != OVL_OK)
        return st;

    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * OVL_WIRE_MAX_FDS)];
    } ctl;
    struct iovec iov = {.iov_base = dst, .iov_len = avail};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return OVL_ERR_AGAIN;
        if (errno == ECONNRESET)
            return OVL_ERR_CLOSED;
        return OVL_ERR_SYSTEM;
    }

    /* Take every fd first, even on the error paths, so none leaks. */
    ovl_status_t fst = OVL_OK;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fst != OVL_OK)
                close(fd);
            else
                fst = ovl_fdq_push(q, fd);
        }
    }
    /* The bytes just read are lost on these paths: the stream is out of
     * step, and stays failed. */
    if (mh.msg_flags & MSG_CTRUNC)
        return r->failed = OVL_ERR_PROTOCOL;
    if (fst != OVL_OK) {
        r->fd_overflow = fst == OVL_ERR_LIMIT;
        return r->failed = fst;
    }
    if (n == 0)
        return OVL_ERR_CLOSED;
    ovl_wire_reader_commit(r, (size_t)n);
    *ret_n = (size_t)n;
    return OVL_OK;
}

/* ------------------------------------------------------------- writing */

void ovl_wire_out_init(ovl_wire_out_t *o)
{
    memset(o, 0, sizeof(*o));
}

void ovl_wire_out_free(ovl_wire_out_t *o)
{
    for (unsigned i = 0; i < o->natt; i++)
        close(o->att[i].fd);
    free(o->buf);
    memset(o, 0, sizeof(*o));
}

size_t ovl_wire_out_pending(const ovl_wire_out_t *o)
{
    return o->len - o->off;
}

static void close_fds(const int *fds, unsigned nfds)
{
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
}

ovl_status_t ovl_wire_pack(const ProtobufCMessage *msg, uint8_t **ret_body, size_t *ret_len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return OVL_ERR_NOMEM;
    protobuf_c_message_pack(msg, buf);
    *ret_body = buf;
    *ret_len = n;
    return OVL_OK;
}

ovl_status_t ovl_wire_out_append(ovl_wire_out_t *o, const ProtobufCMessage *msg, uint32_t max_body,
                                 const int *fds, unsigned nfds)
{
    ovl_status_t st = OVL_OK;
    size_t body = protobuf_c_message_get_packed_size(msg);
    if (body > (max_body ? max_body : OVL_WIRE_DEFAULT_MAX) ||
        nfds > OVL_WIRE_MAX_ATTACHED - o->natt) {
        st = OVL_ERR_LIMIT;
        goto fail;
    }
    /* Reclaim the sent prefix before growing: a peer that always lags a
     * little must not make the buffer grow for ever. Fds still to send
     * belong to frames at or after off. */
    if (o->off > 0) {
        memmove(o->buf, o->buf + o->off, o->len - o->off);
        for (unsigned i = 0; i < o->natt; i++)
            o->att[i].pos -= o->off;
        o->len -= o->off;
        o->off = 0;
    }
    size_t need = o->len + OVL_WIRE_HEADER_SIZE + body;
    if (need > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *nb = realloc(o->buf, cap);
        if (!nb) {
            st = OVL_ERR_NOMEM;
            goto fail;
        }
        o->buf = nb;
        o->cap = cap;
    }
    size_t pos = o->len;
    ovl_wire_header_encode(o->buf + pos, (uint32_t)body);
    size_t packed = protobuf_c_message_pack(msg, o->buf + pos + OVL_WIRE_HEADER_SIZE);
    if (packed != body) {
        st = OVL_ERR_INTERNAL;
        goto fail;
    }
    o->len = pos + OVL_WIRE_HEADER_SIZE + body;
    for (unsigned i = 0; i < nfds; i++)
        o->att[o->natt++] = (ovl_wire_attached_t){.pos = pos, .fd = fds[i]};
    return OVL_OK;

fail:
    close_fds(fds, nfds);
    return st;
}

ovl_status_t ovl_wire_flush(int sock, ovl_wire_out_t *o)
{
    while (o->off < o->len) {
        size_t end = o->len;
        unsigned nfd = 0;
        /* fds go with the first byte of their frame: stop short of the next
         * attachment, or attach every fd that belongs at this position. */
        if (o->natt > 0) {
            if (o->att[0].pos > o->off)
                end = o->att[0].pos;
            else
                while (nfd < o->natt && o->att[nfd].pos <= o->off)
                    nfd++;
            if (nfd > 0 && nfd < o->natt && o->att[nfd].pos < end)
                end = o->att[nfd].pos;
        }
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int) * OVL_WIRE_MAX_ATTACHED)];
        } ctl;
        struct iovec iov = {.iov_base = o->buf + o->off, .iov_len = end - o->off};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (nfd > 0) {
            memset(&ctl, 0, sizeof(ctl));
            mh.msg_control = ctl.buf;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfd);
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * nfd);
            for (unsigned i = 0; i < nfd; i++)
                memcpy(CMSG_DATA(c) + i * sizeof(int), &o->att[i].fd, sizeof(int));
        }
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return OVL_ERR_AGAIN;
            if (errno == EPIPE || errno == ECONNRESET)
                return OVL_ERR_CLOSED;
            return OVL_ERR_SYSTEM;
        }
        /* The kernel took the fds with the first byte, even on a short write. */
        for (unsigned i = 0; i < nfd; i++)
            close(o->att[i].fd);
        memmove(o->att, o->att + nfd, (o->natt - nfd) * sizeof(o->att[0]));
        o->natt -= nfd;
        o->off += (size_t)n;
    }
    o->off = o->len = 0;
    return OVL_OK;
}

/*
 * peer_wire.c: see peer_wire.h.
 */
#include "peer_wire.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "errf.h"
#include "peer.pb-c.h"
#include "text.h"
#include "wire.h"

const char *ovld_peer_type_name(uint32_t type, char *buf, size_t len)
{
    static const char *names[] = {NULL,     "Hello", "Challenge", "Auth",
                                  "Refuse", "Ping",  "Pong",      "Bye"};
    if (type < sizeof(names) / sizeof(names[0]) && names[type])
        return names[type];
    snprintf(buf, len, "message type %" PRIu32, type);
    return buf;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void ovld_peer_frame_header(uint8_t hdr[OVLD_PEER_FRAME_HDR], uint32_t type, uint32_t len)
{
    put_le32(hdr, type);
    put_le32(hdr + 4, len);
}

ovl_status_t ovld_peer_frame_check(const uint8_t hdr[OVLD_PEER_FRAME_HDR], uint32_t *ret_type,
                                   uint32_t *ret_len, char *err, size_t errlen)
{
    uint32_t type = get_le32(hdr), len = get_le32(hdr + 4);
    char tb[32];
    if (type < OVLD_PEER_HELLO || type > OVLD_PEER_REFUSE)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: a %s where a handshake message was expected",
                        ovld_peer_type_name(type, tb, sizeof(tb)));
    if (len > OVLD_PEER_MAX_FRAME)
        return ovl_errf(OVL_ERR_LIMIT, err, errlen,
                        "a %s of %" PRIu32
                        " bytes, over the limit of %u bytes (OVLD_PEER_MAX_FRAME)",
                        ovld_peer_type_name(type, tb, sizeof(tb)), len, OVLD_PEER_MAX_FRAME);
    *ret_type = type;
    *ret_len = len;
    return OVL_OK;
}

void ovld_peer_am_header(uint8_t hdr[OVLD_PEER_AM_HDR], uint32_t type, uint32_t len,
                         const uint8_t session[OVLD_PEER_SESSION_LEN])
{
    put_le32(hdr, type);
    put_le32(hdr + 4, len);
    memcpy(hdr + 8, session, OVLD_PEER_SESSION_LEN);
}

ovl_status_t ovld_peer_am_check(const void *hdr, size_t hdr_len, size_t len, uint32_t *ret_type,
                                uint8_t ret_session[OVLD_PEER_SESSION_LEN], char *err,
                                size_t errlen)
{
    const uint8_t *h = hdr;
    if (hdr_len != OVLD_PEER_AM_HDR)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: a message header of %zu bytes, not %d", hdr_len,
                        OVLD_PEER_AM_HDR);
    uint32_t type = get_le32(h), hlen = get_le32(h + 4);
    memcpy(ret_session, h + 8, OVLD_PEER_SESSION_LEN);
    char tb[32];
    const char *name = ovld_peer_type_name(type, tb, sizeof(tb));
    /* The limit first: it is what an oversized message is refused for,
     * whatever its header says. */
    if (len > OVLD_PEER_MAX_BODY)
        return ovl_errf(OVL_ERR_LIMIT, err, errlen,
                        "a %s of %zu bytes, over the limit of %u bytes (OVLD_PEER_MAX_BODY)", name,
                        len, OVLD_PEER_MAX_BODY);
    if (hlen != len)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: a %s whose header says %" PRIu32 " bytes, %zu came", name,
                        hlen, len);
    if (type < OVLD_PEER_PING || (type > OVLD_PEER_BYE && type < OVLD_PEER_TYPE_USER))
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: a %s, which does not travel over UCX", name);
    *ret_type = type;
    return OVL_OK;
}

void ovld_peer_msg_clear(ovld_peer_msg_t *m)
{
    free(m->ucx_addr);
    m->ucx_addr = NULL;
    m->ucx_len = 0;
}

void ovld_peer_addr_format(const struct sockaddr_storage *a, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)a;
        if (inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host)))
            snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(v4->sin_port));
        else
            snprintf(buf, len, "?");
    } else if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)a;
        if (inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host)))
            snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(v6->sin6_port));
        else
            snprintf(buf, len, "?");
    } else {
        snprintf(buf, len, "?");
    }
}

ovl_status_t ovld_peer_addr_parse(const char *text, struct sockaddr_storage *ret_ss,
                                  char ret_name[OVLD_ADDR_TEXT_MAX], char *err, size_t errlen)
{
    char why[128];
    struct sockaddr_storage ss;
    if (ovld_config_addr_parse(text, &ss, why, sizeof(why)) != OVL_OK)
        return ovl_errf(OVL_ERR_INVALID, err, errlen, "not a peer address: %s", why);
    if (ovld_config_addr_is_any(&ss))
        return ovl_errf(OVL_ERR_INVALID, err, errlen,
                        "not a peer address: the wildcard address names no one node");
    *ret_ss = ss;
    ovld_peer_addr_format(&ss, ret_name, OVLD_ADDR_TEXT_MAX);
    return OVL_OK;
}

/* A field of exactly n bytes. */
static ovl_status_t take_fixed(const ProtobufCBinaryData *b, uint8_t *out, size_t n,
                               const char *msg, const char *field, char *err, size_t errlen)
{
    if (b->len != n)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: %s of %zu bytes, not %zu", msg, field, b->len, n);
    memcpy(out, b->data, n);
    return OVL_OK;
}

/* An advertised address: text, no NUL, numeric, not the wildcard; kept in
 * its canonical form so that one node has one name. */
static ovl_status_t take_address(const ProtobufCBinaryData *b, char out[OVLD_ADDR_TEXT_MAX],
                                 const char *msg, char *err, size_t errlen)
{
    char text[OVLD_ADDR_TEXT_MAX];
    if (b->len == 0 || b->len >= sizeof(text))
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: an address of %zu bytes, not 1 to %d", msg, b->len,
                        OVLD_ADDR_TEXT_MAX - 1);
    if (memchr(b->data, 0, b->len) || !ovl_text_is_clean(b->data, b->len))
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: %s: the address is not clean text", msg);
    memcpy(text, b->data, b->len);
    text[b->len] = '\0';
    struct sockaddr_storage ss;
    char why[160];
    if (ovld_peer_addr_parse(text, &ss, out, why, sizeof(why)) != OVL_OK)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: %s: %s", msg, why);
    return OVL_OK;
}

static ovl_status_t take_reason(const ProtobufCBinaryData *b, char *out, const char *msg, char *err,
                                size_t errlen)
{
    if (b->len > OVLD_PEER_REASON_MAX)
        return ovl_errf(OVL_ERR_LIMIT, err, errlen,
                        "%s: a reason of %zu bytes, over the limit of %d (OVLD_PEER_REASON_MAX)",
                        msg, b->len, OVLD_PEER_REASON_MAX);
    /* Shown in the log: cleaned, never refused for its bytes. */
    ovl_text_sanitize(out, OVLD_PEER_REASON_MAX + 1, b->data, b->len);
    return OVL_OK;
}

static ovl_status_t take_ucx(const ProtobufCBinaryData *b, ovld_peer_msg_t *ret, const char *msg,
                             char *err, size_t errlen)
{
    if (b->len == 0)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: %s: no UCX address", msg);
    if (b->len > OVLD_PEER_UCX_ADDR_MAX)
        return ovl_errf(
            OVL_ERR_LIMIT, err, errlen,
            "%s: a UCX address of %zu bytes, over the limit of %u (OVLD_PEER_UCX_ADDR_MAX)", msg,
            b->len, OVLD_PEER_UCX_ADDR_MAX);
    if (!(ret->ucx_addr = malloc(b->len)))
        return ovl_errf(OVL_ERR_NOMEM, err, errlen, "out of memory");
    memcpy(ret->ucx_addr, b->data, b->len);
    ret->ucx_len = b->len;
    return OVL_OK;
}

static ovl_status_t take_version(uint64_t v, const char *msg, char *err, size_t errlen)
{
    if (v != OVLD_PEER_VERSION)
        return ovl_errf(OVL_ERR_VERSION, err, errlen,
                        "%s: peer protocol version %" PRIu64 ", this ovld speaks version %d", msg,
                        v, OVLD_PEER_VERSION);
    return OVL_OK;
}

ovl_status_t ovld_peer_decode(uint32_t type, const void *body, size_t len, ovld_peer_msg_t *ret,
                              char *err, size_t errlen)
{
    memset(ret, 0, sizeof(*ret));
    char tb[32];
    const char *name = ovld_peer_type_name(type, tb, sizeof(tb));
    ret->type = type;
    ret->body = body;
    ret->len = len;
    if (type >= OVLD_PEER_TYPE_USER)
        return OVL_OK;
    if (type == 0 || type > OVLD_PEER_BYE)
        return ovl_errf(OVL_ERR_PROTOCOL, err, errlen,
                        "protocol error: unknown transport message type %" PRIu32, type);
    ovl_status_t st = OVL_OK;
    const uint8_t *b = body;
    switch ((ovld_peer_type_t)type) {
    case OVLD_PEER_HELLO: {
        Ovlpeer__Hello *m = ovlpeer__hello__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Hello");
        if ((st = take_version(m->version, name, err, errlen)) == OVL_OK &&
            (st = take_fixed(&m->nonce, ret->nonce, OVLD_PEER_NONCE_LEN, name, "nonce", err,
                             errlen)) == OVL_OK &&
            (st = take_fixed(&m->instance, ret->instance, OVLD_PEER_INSTANCE_LEN, name, "instance",
                             err, errlen)) == OVL_OK &&
            (st = take_address(&m->address, ret->address, name, err, errlen)) == OVL_OK)
            st = take_ucx(&m->ucx_address, ret, name, err, errlen);
        ovlpeer__hello__free_unpacked(m, NULL);
        break;
    }
    case OVLD_PEER_CHALLENGE: {
        Ovlpeer__Challenge *m = ovlpeer__challenge__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Challenge");
        if ((st = take_version(m->version, name, err, errlen)) == OVL_OK &&
            (st = take_fixed(&m->nonce, ret->nonce, OVLD_PEER_NONCE_LEN, name, "nonce", err,
                             errlen)) == OVL_OK &&
            (st = take_fixed(&m->instance, ret->instance, OVLD_PEER_INSTANCE_LEN, name, "instance",
                             err, errlen)) == OVL_OK &&
            (st = take_address(&m->address, ret->address, name, err, errlen)) == OVL_OK &&
            (st = take_fixed(&m->mac, ret->mac, OVLD_PEER_MAC_LEN, name, "MAC", err, errlen)) ==
                OVL_OK)
            st = take_ucx(&m->ucx_address, ret, name, err, errlen);
        ovlpeer__challenge__free_unpacked(m, NULL);
        break;
    }
    case OVLD_PEER_AUTH: {
        Ovlpeer__Auth *m = ovlpeer__auth__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Auth");
        st = take_fixed(&m->mac, ret->mac, OVLD_PEER_MAC_LEN, name, "MAC", err, errlen);
        ovlpeer__auth__free_unpacked(m, NULL);
        break;
    }
    case OVLD_PEER_REFUSE: {
        Ovlpeer__Refuse *m = ovlpeer__refuse__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Refuse");
        /* a status this ovld does not know still refuses: as a protocol
         * error, with the sender's words */
        ret->status = m->status < 0 && m->status >= OVL_ERR_INTERNAL ? (ovl_status_t)m->status
                                                                     : OVL_ERR_PROTOCOL;
        st = take_reason(&m->reason, ret->reason, name, err, errlen);
        ovlpeer__refuse__free_unpacked(m, NULL);
        break;
    }
    case OVLD_PEER_PING: {
        Ovlpeer__Ping *m = ovlpeer__ping__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Ping");
        ret->seq = m->seq;
        ovlpeer__ping__free_unpacked(m, NULL);
        break;
    }
    case OVLD_PEER_PONG: {
        Ovlpeer__Pong *m = ovlpeer__pong__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Pong");
        ret->seq = m->seq;
        ovlpeer__pong__free_unpacked(m, NULL);
        break;
    }
    case OVLD_PEER_BYE: {
        Ovlpeer__Bye *m = ovlpeer__bye__unpack(NULL, len, b);
        if (!m)
            return ovl_errf(OVL_ERR_PROTOCOL, err, errlen, "protocol error: a malformed Bye");
        ret->status = m->status < 0 && m->status >= OVL_ERR_INTERNAL ? (ovl_status_t)m->status
                                                                     : OVL_ERR_PROTOCOL;
        st = take_reason(&m->reason, ret->reason, name, err, errlen);
        ovlpeer__bye__free_unpacked(m, NULL);
        break;
    }
    }
    if (st != OVL_OK)
        ovld_peer_msg_clear(ret);
    return st;
}

/* Packs msg into a malloc'd buffer; NULL for an empty body
 * (ovld_peer_encode's contract). */
static ovl_status_t pack(const ProtobufCMessage *msg, uint8_t **ret_body, size_t *ret_len)
{
    *ret_body = NULL;
    *ret_len = 0;
    uint8_t *buf;
    size_t n;
    ovl_status_t st = ovl_wire_pack(msg, &buf, &n);
    if (st != OVL_OK)
        return st;
    if (n == 0) {
        free(buf);
        return OVL_OK;
    }
    *ret_body = buf;
    *ret_len = n;
    return OVL_OK;
}

ovl_status_t ovld_peer_encode(const ovld_peer_msg_t *m, uint8_t **ret_body, size_t *ret_len)
{
    ProtobufCBinaryData nonce = {OVLD_PEER_NONCE_LEN, (uint8_t *)m->nonce};
    ProtobufCBinaryData inst = {OVLD_PEER_INSTANCE_LEN, (uint8_t *)m->instance};
    ProtobufCBinaryData addr = {strnlen(m->address, sizeof(m->address)), (uint8_t *)m->address};
    ProtobufCBinaryData mac = {OVLD_PEER_MAC_LEN, (uint8_t *)m->mac};
    ProtobufCBinaryData reason = {strnlen(m->reason, sizeof(m->reason)), (uint8_t *)m->reason};
    ProtobufCBinaryData ucx = {m->ucx_len, m->ucx_addr};
    *ret_body = NULL;
    *ret_len = 0;
    if (reason.len > OVLD_PEER_REASON_MAX || ucx.len > OVLD_PEER_UCX_ADDR_MAX)
        return OVL_ERR_INVALID;
    switch (m->type) {
    case OVLD_PEER_HELLO: {
        Ovlpeer__Hello h = OVLPEER__HELLO__INIT;
        h.version = OVLD_PEER_VERSION;
        h.nonce = nonce;
        h.instance = inst;
        h.address = addr;
        h.ucx_address = ucx;
        return pack(&h.base, ret_body, ret_len);
    }
    case OVLD_PEER_CHALLENGE: {
        Ovlpeer__Challenge c = OVLPEER__CHALLENGE__INIT;
        c.version = OVLD_PEER_VERSION;
        c.nonce = nonce;
        c.instance = inst;
        c.address = addr;
        c.mac = mac;
        c.ucx_address = ucx;
        return pack(&c.base, ret_body, ret_len);
    }
    case OVLD_PEER_AUTH: {
        Ovlpeer__Auth a = OVLPEER__AUTH__INIT;
        a.mac = mac;
        return pack(&a.base, ret_body, ret_len);
    }
    case OVLD_PEER_REFUSE: {
        Ovlpeer__Refuse r = OVLPEER__REFUSE__INIT;
        r.status = m->status;
        r.reason = reason;
        return pack(&r.base, ret_body, ret_len);
    }
    case OVLD_PEER_PING: {
        Ovlpeer__Ping p = OVLPEER__PING__INIT;
        p.seq = m->seq;
        return pack(&p.base, ret_body, ret_len);
    }
    case OVLD_PEER_PONG: {
        Ovlpeer__Pong p = OVLPEER__PONG__INIT;
        p.seq = m->seq;
        return pack(&p.base, ret_body, ret_len);
    }
    case OVLD_PEER_BYE: {
        Ovlpeer__Bye b = OVLPEER__BYE__INIT;
        b.reason = reason;
        b.status = m->status;
        return pack(&b.base, ret_body, ret_len);
    }
    }
    return OVL_ERR_INVALID;
}

/*
 * wire.h: framing on the stream socket, shared by ovld, libovl and ovlctl.
 *
 * A frame is an 8-byte header, the magic "OVL1" and the body length as a
 * little-endian u32, then the body (a packed Request or Response). The reader
 * takes bytes in any pieces (a frame split over many reads, several frames in
 * one read) and refuses a frame longer than its limit from the header alone,
 * before allocating anything for it. File descriptors ride along as
 * SCM_RIGHTS with the first byte of the frame that carries them; both sides
 * keep them in a queue, in order. Pure code except the two socket calls
 * (ovl_wire_recv, ovl_wire_flush); nothing logs.
 */
#ifndef OVL_WIRE_H
#define OVL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "ovl.h"

#define OVL_WIRE_HEADER_SIZE  8u
#define OVL_WIRE_DEFAULT_MAX  (1u << 20) /* default body limit: 1 MiB */
#define OVL_WIRE_MAX_FDS      16u        /* fds queued per connection */
#define OVL_WIRE_MAX_ATTACHED 16u        /* fds waiting to be sent */

/* HelloReply.features: what an ovld does beyond its protocol version. */
#define OVL_FEATURE_MULTI_B 1u /* AgGemm.more_bs: several Bs in one op */
#define OVL_FEATURE_FP8     2u /* Scaling: scaled fp8 ops */

extern const uint8_t ovl_wire_magic[4];

/* Writes the header of a body of `len` bytes into out[0..8). */
void ovl_wire_header_encode(uint8_t out[OVL_WIRE_HEADER_SIZE], uint32_t len);

/* ------------------------------------------------------------- reading */

typedef struct ovl_wire_reader {
    uint8_t *buf;
    size_t cap;   /* allocated */
    size_t start; /* first unconsumed byte */
    size_t end;   /* one past the last received byte */
    uint32_t max_body;
    ovl_status_t failed; /* sticky: once a stream is bad it stays bad */
    bool fd_overflow;    /* failed because more fds came than the queue holds */
} ovl_wire_reader_t;

void ovl_wire_reader_init(ovl_wire_reader_t *r, uint32_t max_body);
void ovl_wire_reader_free(ovl_wire_reader_t *r);

/*
 * Room to receive into: on OVL_OK, *ret_ptr and *ret_avail describe at least one
 * free byte. The buffer holds the frame at the front (at most the limit) and
 * whatever else was received and not yet taken with ovl_wire_reader_next.
 * Then call ovl_wire_reader_commit with the number of bytes written there.
 */
ovl_status_t ovl_wire_reader_space(ovl_wire_reader_t *r, uint8_t **ret_ptr, size_t *ret_avail);
void ovl_wire_reader_commit(ovl_wire_reader_t *r, size_t n);

/* Copies n bytes in (tests and fuzzing; the socket path uses space/commit). */
ovl_status_t ovl_wire_reader_feed(ovl_wire_reader_t *r, const void *data, size_t n);

/*
 * The next complete frame. OVL_OK: *ret_body and *ret_len hold its body, valid
 * until the next space/feed call. OVL_ERR_AGAIN: no complete frame yet.
 * OVL_ERR_PROTOCOL: bad magic. OVL_ERR_LIMIT: the header announces a body
 * over the limit. Errors are sticky: the stream cannot be resynchronised.
 */
ovl_status_t ovl_wire_reader_next(ovl_wire_reader_t *r, const uint8_t **ret_body,
                                  uint32_t *ret_len);

/* Bytes received but not yet returned as frames. */
size_t ovl_wire_reader_pending(const ovl_wire_reader_t *r);

/* ------------------------------------------------------ passed fds */

typedef struct ovl_fdq {
    int fds[OVL_WIRE_MAX_FDS];
    unsigned head;
    unsigned count;
} ovl_fdq_t;

void ovl_fdq_init(ovl_fdq_t *q);
/* Takes ownership of fd; OVL_ERR_LIMIT (fd closed) when the queue is full. */
ovl_status_t ovl_fdq_push(ovl_fdq_t *q, int fd);
/* The oldest fd (ownership passes to the caller), or -1 if none. */
int ovl_fdq_pop(ovl_fdq_t *q);
void ovl_fdq_close_all(ovl_fdq_t *q);

/*
 * One recvmsg on a socket into the reader, with any passed fds pushed on q
 * (MSG_CMSG_CLOEXEC). Returns OVL_OK (*ret_n bytes read), OVL_ERR_AGAIN
 * (EAGAIN/EINTR), OVL_ERR_CLOSED (orderly shutdown by the peer),
 * OVL_ERR_PROTOCOL (truncated control data), OVL_ERR_LIMIT (too many fds
 * queued: the extra ones are closed, and r->fd_overflow says so; or a frame
 * over the limit) or OVL_ERR_SYSTEM (errno set). After
 * PROTOCOL or LIMIT the reader is failed for good; fds that arrived stay in
 * q for the caller's ovl_fdq_close_all.
 */
ovl_status_t ovl_wire_recv(int sock, ovl_wire_reader_t *r, ovl_fdq_t *q, size_t *ret_n);

/* ------------------------------------------------------------- writing */

typedef struct ovl_wire_attached {
    size_t pos; /* offset in buf of the first byte of the frame */
    int fd;
} ovl_wire_attached_t;

typedef struct ovl_wire_out {
    uint8_t *buf;
    size_t cap;
    size_t len; /* bytes queued */
    size_t off; /* bytes already sent */
    ovl_wire_attached_t att[OVL_WIRE_MAX_ATTACHED];
    unsigned natt;
} ovl_wire_out_t;

void ovl_wire_out_init(ovl_wire_out_t *o);
/* Frees the buffer and closes fds never sent. */
void ovl_wire_out_free(ovl_wire_out_t *o);

/*
 * Packs msg into a frame at the end of the queue, with nfds fds to pass along
 * (the queue takes ownership and closes them once sent, or in
 * ovl_wire_out_free; on failure they are closed too). OVL_ERR_LIMIT when the
 * body exceeds max_body or too many fds wait; OVL_ERR_NOMEM.
 */
ovl_status_t ovl_wire_out_append(ovl_wire_out_t *o, const ProtobufCMessage *msg, uint32_t max_body,
                                 const int *fds, unsigned nfds);

/* msg packed into a malloc'd buffer of *ret_len bytes, never NULL (one
 * byte is allocated for an empty message): the bodies of the daemons'
 * messages to each other. OVL_OK, or OVL_ERR_NOMEM. */
ovl_status_t ovl_wire_pack(const ProtobufCMessage *msg, uint8_t **ret_body, size_t *ret_len);

/* Bytes not yet sent. */
size_t ovl_wire_out_pending(const ovl_wire_out_t *o);

/*
 * Sends what it can with sendmsg(MSG_NOSIGNAL). OVL_OK: all sent.
 * OVL_ERR_AGAIN: the socket is full (wait for POLLOUT). OVL_ERR_CLOSED: the
 * peer is gone (EPIPE/ECONNRESET). OVL_ERR_SYSTEM: errno set.
 */
ovl_status_t ovl_wire_flush(int sock, ovl_wire_out_t *o);

#endif /* OVL_WIRE_H */

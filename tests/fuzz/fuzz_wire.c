/*
 * fuzz_wire.c: libFuzzer target for the frame reader (proto/wire.c) and the
 * protobuf decoding behind it, i.e. everything ovld does with bytes from a
 * client before it trusts them.
 *
 * Input: one byte choosing how the rest is cut into pieces, then the stream.
 * The stream goes through an ovl_wire_reader (64 KiB limit) piece by piece,
 * every complete frame is decoded as a Request and as a Response, and every
 * decoded Request is framed again with ovl_wire_out_append and read back.
 * A plain reference parser over the whole stream says which frames and which
 * final status the reader must produce, whatever the pieces; any difference
 * aborts, so the fuzzer reports it like a crash.
 *
 * With OVL_FUZZ_STANDALONE, fuzz_main.h adds a main() that replays files
 * and directories named on the command line, or with no arguments the
 * built-in deterministic set below (fuzz_builtin), so that ctest can run it
 * without libFuzzer.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ovl.pb-c.h"
#include "wire.h"

#define FUZZ_NAME "fuzz_wire"
#include "fuzz_main.h"
#include "fuzz_split.h"

#define FUZZ_MAX_BODY (64u * 1024u)
#define READ_SLACK    4096u /* wire.c's receive granularity, for the memory bound */

/* ------------------------------------------------------ reference parser */

/* The frame at pos of the whole stream s[0..n), judged the way wire.h
 * specifies: its size with *st = OVL_OK, or 0 with *st = AGAIN (incomplete),
 * PROTOCOL (a wrong magic byte, even before the header is complete) or LIMIT
 * (a length over the limit). */
static size_t ref_frame(const uint8_t *s, size_t n, size_t pos, uint32_t *len, ovl_status_t *st)
{
    size_t have = n - pos;
    for (size_t i = 0; i < have && i < 4; i++)
        if (s[pos + i] != ovl_wire_magic[i]) {
            *st = OVL_ERR_PROTOCOL;
            return 0;
        }
    if (have < OVL_WIRE_HEADER_SIZE) {
        *st = OVL_ERR_AGAIN;
        return 0;
    }
    const uint8_t *h = s + pos;
    *len = (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
    if (*len > FUZZ_MAX_BODY) {
        *st = OVL_ERR_LIMIT;
        return 0;
    }
    if (have - OVL_WIRE_HEADER_SIZE < *len) {
        *st = OVL_ERR_AGAIN;
        return 0;
    }
    *st = OVL_OK;
    return OVL_WIRE_HEADER_SIZE + *len;
}

/* --------------------------------------------------------------- decoding */

/* Frames a decoded Request again and reads it back: the writer must produce
 * exactly the header and the packed bytes, and the reader must return them. */
static void reframe(const Ovl__Request *req)
{
    ovl_wire_out_t o;
    ovl_wire_out_init(&o);
    size_t body = ovl__request__get_packed_size(req);
    ovl_status_t st = ovl_wire_out_append(&o, &req->base, FUZZ_MAX_BODY, NULL, 0);
    if (body > FUZZ_MAX_BODY) {
        /* Re-encoding can grow (e.g. non-minimal varints in the input). */
        CHECK(st == OVL_ERR_LIMIT);
        CHECK(ovl_wire_out_pending(&o) == 0);
        ovl_wire_out_free(&o);
        return;
    }
    CHECK(st == OVL_OK);
    CHECK(ovl_wire_out_pending(&o) == OVL_WIRE_HEADER_SIZE + body);
    uint8_t *packed = malloc(body ? body : 1);
    CHECK(packed != NULL);
    CHECK(ovl__request__pack(req, packed) == body);
    CHECK(memcmp(o.buf + OVL_WIRE_HEADER_SIZE, packed, body) == 0);

    ovl_wire_reader_t r;
    ovl_wire_reader_init(&r, FUZZ_MAX_BODY);
    CHECK(ovl_wire_reader_feed(&r, o.buf, o.len) == OVL_OK);
    const uint8_t *b;
    uint32_t len;
    CHECK(ovl_wire_reader_next(&r, &b, &len) == OVL_OK);
    CHECK(len == body && memcmp(b, packed, body) == 0);
    CHECK(ovl_wire_reader_next(&r, &b, &len) == OVL_ERR_AGAIN);
    ovl_wire_reader_free(&r);
    free(packed);
    ovl_wire_out_free(&o);
}

static void decode(const uint8_t *body, uint32_t len)
{
    Ovl__Request *req = ovl__request__unpack(NULL, len, body);
    if (req) {
        reframe(req);
        ovl__request__free_unpacked(req, NULL);
    }
    Ovl__Response *resp = ovl__response__unpack(NULL, len, body);
    if (resp)
        ovl__response__free_unpacked(resp, NULL);
}

/* ------------------------------------------------------------------ target */


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    splitter_t sp = {.mode = data[0], .rng = 0x9e3779b9u ^ data[0]};
    bool socket_like = (data[0] & 0x80) != 0;
    const uint8_t *s = data + 1;
    size_t n = size - 1;

    ovl_wire_reader_t r;
    ovl_wire_reader_init(&r, FUZZ_MAX_BODY);

    /* The reader's output is checked frame by frame against the reference. */
    size_t ref_pos = 0;
    ovl_status_t ref_st = OVL_OK;
    size_t off = 0, max_piece = 0, cap_bound = 0;
    ovl_status_t st = OVL_OK;
    while (off < n && st == OVL_OK) {
        size_t piece = next_piece(&sp, n - off), taken = 0;
        if (piece > max_piece) {
            max_piece = piece;
            cap_bound = 2 * ((size_t)OVL_WIRE_HEADER_SIZE + FUZZ_MAX_BODY + READ_SLACK + max_piece);
        }
        st = put(&r, socket_like, s + off, piece, &taken);
        off += taken;
        if (st != OVL_OK)
            break; /* a sticky error: compared with the reference below */
        /* Drain, as both ovld and libovl do after each receive. */
        for (;;) {
            const uint8_t *body;
            uint32_t len;
            ovl_status_t nst = ovl_wire_reader_next(&r, &body, &len);
            if (nst == OVL_ERR_AGAIN)
                break;
            if (nst != OVL_OK) {
                st = nst;
                break;
            }
            uint32_t ref_len = 0;
            size_t fsz = ref_frame(s, n, ref_pos, &ref_len, &ref_st);
            CHECK(ref_st == OVL_OK);
            CHECK(len == ref_len);
            CHECK(body == r.buf + r.start - len); /* inside the buffer */
            CHECK(memcmp(body, s + ref_pos + OVL_WIRE_HEADER_SIZE, len) == 0);
            /* A frame is returned only once all of it has been put in. */
            CHECK(ref_pos + fsz <= off);
            ref_pos += fsz;
            decode(body, len);
        }
        /* Memory stays bounded by the largest acceptable frame (or what one
         * piece put in beyond it) plus slack, doubled by the growth policy:
         * a header announcing more than the limit allocates nothing. */
        CHECK(r.cap <= cap_bound);
    }

    /* Where the reference stands after the frames the reader returned. */
    uint32_t ref_len = 0;
    (void)ref_frame(s, n, ref_pos, &ref_len, &ref_st);
    const uint8_t *body;
    uint32_t len;
    if (st == OVL_OK) {
        /* All of it put in and drained: no complete frame was missed, and
         * the rest is pending. */
        CHECK(ref_st == OVL_ERR_AGAIN);
        CHECK(ovl_wire_reader_pending(&r) == n - ref_pos);
        CHECK(ovl_wire_reader_next(&r, &body, &len) == OVL_ERR_AGAIN);
    } else {
        /* Stopped on an error: the reference finds the same one at the same
         * frame (the reader judges only the front frame), and it is sticky. */
        CHECK(st == OVL_ERR_PROTOCOL || st == OVL_ERR_LIMIT);
        CHECK(st == ref_st);
        CHECK(r.failed == st);
        CHECK(ovl_wire_reader_next(&r, &body, &len) == st);
        CHECK(ovl_wire_reader_feed(&r, "x", 1) == st);
        CHECK(r.cap <= cap_bound);
    }
    ovl_wire_reader_free(&r);
    return 0;
}

/* ------------------------------------------------------------- standalone */

#ifdef OVL_FUZZ_STANDALONE

/* Appends a frame holding a packed Request{id, Hello} at out[*len]. */
static void put_hello_frame(uint8_t *out, size_t cap, size_t *len, uint64_t id, const char *name)
{
    Ovl__Hello h = OVL__HELLO__INIT;
    h.protocol_version = OVL_PROTOCOL_VERSION;
    h.library_version = (char *)OVL_VERSION_STRING;
    h.pid = 1234;
    h.client_name.data = (uint8_t *)name;
    h.client_name.len = strlen(name);
    h.wants = 1;
    Ovl__Request req = OVL__REQUEST__INIT;
    req.id = id;
    req.body_case = OVL__REQUEST__BODY_HELLO;
    req.hello = &h;
    size_t body = ovl__request__get_packed_size(&req);
    CHECK(*len + OVL_WIRE_HEADER_SIZE + body <= cap);
    ovl_wire_header_encode(out + *len, (uint32_t)body);
    CHECK(ovl__request__pack(&req, out + *len + OVL_WIRE_HEADER_SIZE) == body);
    *len += OVL_WIRE_HEADER_SIZE + body;
}

/* Runs stream under several split modes: whole, byte by byte, fixed sizes,
 * pseudo-random sizes, each through feed and through space/commit. */
static void run_modes(const uint8_t *stream, size_t n)
{
    static const uint8_t modes[] = {0x00, 0x01, 0x02, 0x06, 0x7e, 0x03, 0x07,
                                    0x0b, 0x80, 0x81, 0x86, 0x83, 0xfb};
    uint8_t *buf = malloc(n + 1);
    CHECK(buf != NULL);
    memcpy(buf + 1, stream, n);
    for (size_t i = 0; i < sizeof(modes); i++) {
        buf[0] = modes[i];
        fuzz_run(buf, n + 1);
    }
    free(buf);
}

static void fuzz_builtin(void)
{
    uint8_t valid[1024];
    size_t vn = 0;
    put_hello_frame(valid, sizeof(valid), &vn, 1, "fuzz_wire");
    size_t one = vn;
    put_hello_frame(valid, sizeof(valid), &vn, 2, "");
    ovl_wire_header_encode(valid + vn, 0); /* an empty body: a valid empty Request */
    vn += OVL_WIRE_HEADER_SIZE;

    /* Valid streams under every mode byte. */
    uint8_t buf[1200];
    if (vn >= sizeof(buf))
        abort(); /* cannot happen; also tells the compiler the copy fits */
    for (unsigned m = 0; m < 256; m++) {
        buf[0] = (uint8_t)m;
        memcpy(buf + 1, valid, vn);
        fuzz_run(buf, vn + 1);
    }
    /* Every truncation. */
    for (size_t k = 0; k <= vn; k++)
        run_modes(valid, k);
    /* Every byte flipped, and every byte set to a few values: hits the magic,
     * the length and every protobuf field. */
    static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < vn; i++) {
        uint8_t m[1024];
        memcpy(m, valid, vn);
        m[i] ^= 0xff;
        run_modes(m, vn);
        for (size_t v = 0; v < sizeof(vals); v++) {
            memcpy(m, valid, vn);
            m[i] = vals[v];
            buf[0] = (uint8_t)(i * 7 + v);
            memcpy(buf + 1, m, vn);
            fuzz_run(buf, vn + 1);
        }
    }
    /* Headers at and around the limit, and absurd lengths. */
    static const uint32_t lens[] = {FUZZ_MAX_BODY, FUZZ_MAX_BODY + 1, 0x7fffffffu,
                                    0x80000000u,   0xfffffffeu,       0xffffffffu};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint8_t h[OVL_WIRE_HEADER_SIZE];
        ovl_wire_header_encode(h, lens[i]);
        run_modes(h, OVL_WIRE_HEADER_SIZE);
        /* After a good frame. */
        uint8_t s2[1024 + OVL_WIRE_HEADER_SIZE];
        memcpy(s2, valid, one);
        ovl_wire_header_encode(s2 + one, lens[i]);
        run_modes(s2, one + OVL_WIRE_HEADER_SIZE);
    }
    /* A body exactly at the limit, and a frame larger than the initial
     * buffer (growth), whole and in pieces. */
    {
        size_t n = OVL_WIRE_HEADER_SIZE + FUZZ_MAX_BODY;
        uint8_t *big = malloc(n + 1);
        CHECK(big != NULL);
        ovl_wire_header_encode(big + 1, FUZZ_MAX_BODY);
        for (size_t i = 0; i < FUZZ_MAX_BODY; i++)
            big[1 + OVL_WIRE_HEADER_SIZE + i] = (uint8_t)fuzz_prng();
        static const uint8_t bigmodes[] = {0x00, 0x03, 0x7e, 0x80, 0x83};
        for (size_t i = 0; i < sizeof(bigmodes); i++) {
            big[0] = bigmodes[i];
            fuzz_run(big, n + 1);
        }
        free(big);
    }
    /* Bad magic, whole and as 1-3 byte prefixes. */
    static const char *const bad[] = {"OVL2", "XVL1", "OXL1", "OVX1", "ovl1", "\0\0\0\0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t h[OVL_WIRE_HEADER_SIZE + 4] = {0};
        memcpy(h, bad[i], 4);
        for (size_t k = 1; k <= sizeof(h); k++)
            run_modes(h, k);
    }
    /* Random bytes, with a valid magic in front half of the time so that
     * lengths and bodies get exercised too. */
    for (int i = 0; i < 20000; i++) {
        uint8_t in[301];
        size_t n = fuzz_prng() % 301;
        for (size_t j = 0; j < n; j++)
            in[j] = (uint8_t)fuzz_prng();
        if (n >= 9 && (i & 1)) {
            memcpy(in + 1, "OVL1", 4);
            uint32_t len = fuzz_prng() % 320;
            ovl_wire_header_encode(in + 1, len);
        }
        fuzz_run(in, n);
    }
    /* Random protobuf-ish bodies in well-formed frames: tags and varints. */
    for (int i = 0; i < 5000; i++) {
        uint8_t in[1 + OVL_WIRE_HEADER_SIZE + 200];
        size_t body = fuzz_prng() % 201;
        in[0] = (uint8_t)fuzz_prng();
        ovl_wire_header_encode(in + 1, (uint32_t)body);
        for (size_t j = 0; j < body; j++) {
            uint32_t x = fuzz_prng();
            /* Mostly small bytes: plausible field tags and lengths. */
            in[1 + OVL_WIRE_HEADER_SIZE + j] = (uint8_t)((x & 3) ? x % 0x50 : x >> 8);
        }
        fuzz_run(in, 1 + OVL_WIRE_HEADER_SIZE + body);
    }
    /* Mutations of the valid frame: a few random byte changes each. */
    for (int i = 0; i < 5000; i++) {
        uint8_t in[1 + 1024];
        in[0] = (uint8_t)fuzz_prng();
        memcpy(in + 1, valid, vn);
        int k = 1 + (int)(fuzz_prng() % 4);
        for (int j = 0; j < k; j++)
            in[1 + fuzz_prng() % vn] = (uint8_t)fuzz_prng();
        fuzz_run(in, vn + 1);
    }
    fuzz_run(NULL, 0);
}

#endif /* OVL_FUZZ_STANDALONE */

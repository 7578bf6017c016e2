/*
 * test_text.c: unit tests of common/text.c, the code that checks and escapes
 * text crossing a trust boundary (client names and job ids on an operator's
 * terminal and in JSON).
 *
 * The expectations come from a reference model written here independently
 * of text.c: a UTF-8 decoder after the table of well-formed byte sequences
 * (Unicode 15, table 3-7), and the escapers' outputs piece by piece (one
 * piece per character or per byte that does not start a character). Random
 * inputs come from a fixed-seed xorshift generator, so every run is the same.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

#define NELEM(a)     (sizeof(a) / sizeof((a)[0]))
#define RANDOM_CASES 10000
#define MAX_IN       96 /* bytes of one random input */
#define MAX_PIECES   MAX_IN
#define BIG          1024 /* larger than any escaped random input (6 x MAX_IN) */

/* ------------------------------------------------------------ reference */

/* The length of the well-formed UTF-8 sequence at s[0..n) and its code
 * point, or 0: Unicode's table 3-7, byte ranges rather than arithmetic. */
static size_t ref_utf8(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    uint8_t b0 = s[0];
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */
    if (b0 <= 0x7f) {
        *cp = b0;
        return 1;
    } else if (b0 >= 0xc2 && b0 <= 0xdf) {
        len = 2;
    } else if (b0 == 0xe0) {
        len = 3, lo = 0xa0;
    } else if ((b0 >= 0xe1 && b0 <= 0xec) || b0 == 0xee || b0 == 0xef) {
        len = 3;
    } else if (b0 == 0xed) {
        len = 3, hi = 0x9f;
    } else if (b0 == 0xf0) {
        len = 4, lo = 0x90;
    } else if (b0 >= 0xf1 && b0 <= 0xf3) {
        len = 4;
    } else if (b0 == 0xf4) {
        len = 4, hi = 0x8f;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    uint32_t v = len == 2 ? b0 & 0x1fu : len == 3 ? b0 & 0x0fu : b0 & 0x07u;
    for (size_t i = 1; i < len; i++)
        v = v << 6 | (s[i] & 0x3fu);
    *cp = v;
    return len;
}

static bool ref_valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = ref_utf8(s + i, n - i, &cp);
        if (l == 0)
            return false;
        i += l;
    }
    return true;
}

/* The bidirectional formatting controls (UAX #9): ALM, LRM, RLM, LRE, RLE,
 * PDF, LRO, RLO, LRI, RLI, FSI, PDI. */
static const uint32_t bidi_controls[] = {0x061c, 0x200e, 0x200f, 0x202a, 0x202b, 0x202c,
                                         0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069};

static bool ref_control(uint32_t cp)
{
    for (size_t i = 0; i < sizeof(bidi_controls) / sizeof(bidi_controls[0]); i++)
        if (cp == bidi_controls[i])
            return true;
    return cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f);
}

/* Encodes cp (any value up to 0x1fffff, surrogates included) the way a naive
 * encoder would; returns its length. */
static size_t encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    } else if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

typedef struct piece {
    char s[16];
    size_t len;
} piece_t;

/* What the terminal escaper must make of one character (or bad byte). */
static void ref_term_piece(const uint8_t *s, size_t l, uint32_t cp, bool bad, piece_t *p)
{
    if (bad)
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\x%02x", (unsigned)s[0]);
    else if (cp == '\\')
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\\\");
    else if (cp == '\t')
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\t");
    else if (cp == '\n')
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\n");
    else if (cp == '\r')
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\r");
    else if (cp == 0x1b)
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\e");
    else if (cp <= 0x1f || cp == 0x7f)
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\x%02x", (unsigned)cp);
    else if (ref_control(cp)) /* C1, and the bidi controls */
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\u%04x", (unsigned)cp);
    else {
        memcpy(p->s, s, l);
        p->len = l;
    }
}

/* What the JSON escaper must make of one character (or bad byte); json_cp
 * is what a JSON parser reads back from it. */
static void ref_json_piece(const uint8_t *s, size_t l, uint32_t cp, bool bad, piece_t *p,
                           uint32_t *json_cp)
{
    *json_cp = bad ? 0xfffd : cp;
    if (bad) {
        memcpy(p->s, "\xef\xbf\xbd", 3);
        p->len = 3;
    } else if (cp == '"' || cp == '\\') {
        p->s[0] = '\\';
        p->s[1] = (char)cp;
        p->len = 2;
    } else if (cp == '\t' || cp == '\n' || cp == '\r') {
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\%c",
                                  cp == '\t'   ? 't'
                                  : cp == '\n' ? 'n'
                                               : 'r');
    } else if (ref_control(cp)) {
        p->len = (size_t)snprintf(p->s, sizeof(p->s), "\\u%04x", (unsigned)cp);
    } else {
        memcpy(p->s, s, l);
        p->len = l;
    }
}

/* Splits NUL-terminated s into the pieces an escaper must write. */
static size_t ref_pieces(const char *str, bool json, piece_t *pieces, uint32_t *json_cps)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t n = strlen(str), np = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0, jcp;
        size_t l = ref_utf8(s + i, n - i, &cp);
        bool bad = l == 0;
        if (bad)
            l = 1;
        if (json) {
            ref_json_piece(s + i, l, cp, bad, &pieces[np], &jcp);
            if (json_cps)
                json_cps[np] = jcp;
        } else {
            ref_term_piece(s + i, l, cp, bad, &pieces[np]);
        }
        np++;
        i += l;
    }
    return np;
}

/* The output for a buffer of dstlen bytes: the most whole pieces that fit
 * in dstlen - 1 bytes, in order, stopping at the first that does not. */
static size_t ref_join(const piece_t *pieces, size_t np, size_t dstlen, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < np; i++) {
        if (o + pieces[i].len > dstlen - 1)
            break;
        memcpy(out + o, pieces[i].s, pieces[i].len);
        o += pieces[i].len;
    }
    out[o] = '\0';
    return o;
}

/* -------------------------------------------------------- JSON checking */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/*
 * Parses s[0..n) as the contents of a JSON string (RFC 8259, section 7):
 * every byte below 0x20 and every '"' must be escaped, escapes are \" \\ \/
 * \b \f \n \r \t or \uXXXX (a surrogate only as a high-low pair), and the
 * text is valid UTF-8 (section 8.1). Writes the code points it denotes to
 * cps (if not NULL); returns their count, or -1 if s is not valid.
 */
static long json_string_parse(const char *str, size_t n, uint32_t *cps, size_t maxcps)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0, k = 0;
    while (i < n) {
        uint32_t cp;
        if (s[i] == '"' || s[i] < 0x20)
            return -1;
        if (s[i] != '\\') {
            size_t l = ref_utf8(s + i, n - i, &cp);
            if (l == 0)
                return -1;
            i += l;
        } else {
            if (i + 1 >= n)
                return -1;
            char e = (char)s[i + 1];
            i += 2;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                cp = (uint32_t)e;
                break;
            case 'b':
                cp = 8;
                break;
            case 'f':
                cp = 12;
                break;
            case 'n':
                cp = 10;
                break;
            case 'r':
                cp = 13;
                break;
            case 't':
                cp = 9;
                break;
            case 'u': {
                if (i + 4 > n)
                    return -1;
                cp = 0;
                for (int j = 0; j < 4; j++) {
                    int h = hexval((char)s[i + (size_t)j]);
                    if (h < 0)
                        return -1;
                    cp = cp << 4 | (uint32_t)h;
                }
                i += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return -1; /* a low surrogate alone */
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    uint32_t lo = 0;
                    if (i + 6 > n || s[i] != '\\' || s[i + 1] != 'u')
                        return -1;
                    for (int j = 0; j < 4; j++) {
                        int h = hexval((char)s[i + 2 + (size_t)j]);
                        if (h < 0)
                            return -1;
                        lo = lo << 4 | (uint32_t)h;
                    }
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return -1;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    i += 6;
                }
                break;
            }
            default:
                return -1;
            }
        }
        if (cps) {
            if (k >= maxcps)
                return -1;
            cps[k] = cp;
        }
        k++;
    }
    return (long)k;
}

static bool json_string_valid(const char *s)
{
    return json_string_parse(s, strlen(s), NULL, 0) >= 0;
}

/* Decodes the terminal escaper's output back to the bytes it came from:
 * every escape it writes is unambiguous. Returns the length, or -1 if out
 * holds something the escaper never writes. */
static long term_unescape(const char *out, uint8_t *buf, size_t buflen)
{
    size_t i = 0, o = 0, n = strlen(out);
    while (i < n) {
        if (o + 4 > buflen)
            return -1;
        if (out[i] != '\\') {
            buf[o++] = (uint8_t)out[i++];
            continue;
        }
        if (i + 1 >= n)
            return -1;
        char e = out[i + 1];
        i += 2;
        if (e == '\\' || e == 't' || e == 'n' || e == 'r' || e == 'e') {
            buf[o++] = e == '\\'  ? '\\'
                       : e == 't' ? '\t'
                       : e == 'n' ? '\n'
                       : e == 'r' ? '\r'
                                  : 0x1b;
        } else if (e == 'x') {
            int h1, h2;
            if (i + 2 > n || (h1 = hexval(out[i])) < 0 || (h2 = hexval(out[i + 1])) < 0)
                return -1;
            buf[o++] = (uint8_t)(h1 << 4 | h2);
            i += 2;
        } else if (e == 'u') {
            uint32_t cp = 0;
            if (i + 4 > n)
                return -1;
            for (int j = 0; j < 4; j++) {
                int h = hexval(out[i + (size_t)j]);
                if (h < 0)
                    return -1;
                cp = cp << 4 | (uint32_t)h;
            }
            i += 4;
            o += encode(cp, buf + o);
        } else {
            return -1;
        }
    }
    return (long)o;
}

/* --------------------------------------------------------------- random */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint32_t rnd_below(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}

/* A random code point of any kind (controls, surrogates and past U+10FFFF
 * included: the naive encoder writes them all). */
static uint32_t rnd_cp(void)
{
    switch (rnd_below(8)) {
    case 0:
        return rnd_below(0x20); /* C0 */
    case 1:
        return 0x7f + rnd_below(0x21); /* DEL, C1 */
    case 2:
        return 0x20 + rnd_below(0x5f); /* printable ASCII */
    case 3:
        return 0xa0 + rnd_below(0x800 - 0xa0); /* two bytes */
    case 4:
        return 0x800 + rnd_below(0x10000 - 0x800); /* three, surrogates too */
    case 5:
        return 0xd800 + rnd_below(0x800); /* surrogates */
    case 6:
        return 0x10000 + rnd_below(0x100000); /* four */
    default:
        return 0x10fff0 + rnd_below(0x20); /* around the top */
    }
}

/*
 * Fills buf with up to max bytes of a random mix: whole characters of
 * every kind, single random bytes, overlong forms, sequences cut short;
 * no NUL if nul is false. Returns the length.
 */
static size_t rnd_bytes(uint8_t *buf, size_t max, bool nul)
{
    size_t n = 0, want = rnd_below((uint32_t)max + 1);
    while (n < want) {
        uint8_t tmp[4];
        size_t l;
        switch (rnd_below(6)) {
        case 0: /* any byte */
            tmp[0] = (uint8_t)rnd();
            l = 1;
            break;
        case 1: { /* an overlong form: C0..C1 xx, E0 80..9F xx, F0 80..8F xx xx */
            l = 2 + rnd_below(3);
            tmp[0] = l == 2 ? (uint8_t)(0xc0 | rnd_below(2)) : l == 3 ? 0xe0 : 0xf0;
            tmp[1] = (uint8_t)(0x80 | rnd_below(l == 2 ? 64 : l == 3 ? 32 : 16));
            tmp[2] = (uint8_t)(0x80 | rnd_below(64));
            tmp[3] = (uint8_t)(0x80 | rnd_below(64));
            break;
        }
        case 2: /* a character cut short */
            l = encode(0x80 + rnd_below(0x10ff80), tmp);
            l = l > 1 ? 1 + rnd_below((uint32_t)l - 1) : l;
            break;
        default:
            l = encode(rnd_cp(), tmp);
            break;
        }
        if (n + l > max)
            break;
        for (size_t i = 0; i < l; i++)
            if (!nul && tmp[i] == 0)
                tmp[i] = 'z';
        memcpy(buf + n, tmp, l);
        n += l;
    }
    return n;
}

/* -------------------------------------------------------- ovl_utf8_next */

typedef struct seq {
    const char *s;
    size_t n;
    size_t len; /* expected */
    uint32_t cp;
} seq_t;

#define S(lit) lit, sizeof(lit) - 1

static void test_utf8_next_valid(void **state)
{
    (void)state;
    static const seq_t seqs[] = {
        {S("A"), 1, 'A'},
        {S("\x7f"), 1, 0x7f},
        {"\0", 1, 1, 0}, /* NUL is a character (a control one) */
        {S("Az"), 1, 'A'},
        {S("\xc2\x80"), 2, 0x80},
        {S("\xc2\x9b"), 2, 0x9b},
        {S("\xc3\xa9"), 2, 0xe9},
        {S("\xdf\xbf"), 2, 0x7ff},
        {S("\xe0\xa0\x80"), 3, 0x800},
        {S("\xe2\x82\xac"), 3, 0x20ac},
        {S("\xed\x9f\xbf"), 3, 0xd7ff},
        {S("\xee\x80\x80"), 3, 0xe000},
        {S("\xef\xbf\xbd"), 3, 0xfffd},
        {S("\xef\xbf\xbf"), 3, 0xffff},
        {S("\xf0\x90\x80\x80"), 4, 0x10000},
        {S("\xf0\x9f\x98\x80"), 4, 0x1f600},
        {S("\xf3\xbf\xbf\xbf"), 4, 0xfffff},
        {S("\xf4\x8f\xbf\xbf"), 4, 0x10ffff},
        {S("\xc3\xa9\xff"), 2, 0xe9}, /* what follows does not matter */
    };
    for (size_t i = 0; i < NELEM(seqs); i++) {
        uint32_t cp = 0xdeadbeef;
        size_t l = ovl_utf8_next((const uint8_t *)seqs[i].s, seqs[i].n, &cp);
        if (l != seqs[i].len || cp != seqs[i].cp)
            fail_msg("case %zu: length %zu, U+%04X; expected %zu, U+%04X", i, l, (unsigned)cp,
                     seqs[i].len, (unsigned)seqs[i].cp);
    }
}

static void test_utf8_next_invalid(void **state)
{
    (void)state;
    static const seq_t seqs[] = {
        {"", 0, 0, 0},
        {S("\xc0\x80"), 0, 0},                 /* overlong U+0000 */
        {S("\xc1\xbf"), 0, 0},                 /* overlong U+007F */
        {S("\xe0\x80\x80"), 0, 0},             /* overlong U+0000 */
        {S("\xe0\x9f\xbf"), 0, 0},             /* overlong U+07FF */
        {S("\xf0\x80\x80\x80"), 0, 0},         /* overlong U+0000 */
        {S("\xf0\x8f\xbf\xbf"), 0, 0},         /* overlong U+FFFF */
        {S("\xed\xa0\x80"), 0, 0},             /* U+D800 */
        {S("\xed\xbf\xbf"), 0, 0},             /* U+DFFF */
        {S("\xed\xa0\xbd\xed\xb8\x80"), 0, 0}, /* CESU-8 pair */
        {S("\xf4\x90\x80\x80"), 0, 0},         /* U+110000 */
        {S("\xf5\x80\x80\x80"), 0, 0},
        {S("\xf7\xbf\xbf\xbf"), 0, 0},     /* U+1FFFFF */
        {S("\xf8\x88\x80\x80\x80"), 0, 0}, /* five bytes */
        {S("\xfc\x84\x80\x80\x80\x80"), 0, 0},
        {S("\xfe"), 0, 0},
        {S("\xff"), 0, 0},
        {S("\x80"), 0, 0}, /* stray continuation bytes */
        {S("\xbf"), 0, 0},
        {S("\x80\x41"), 0, 0},
        {S("\xc3"), 0, 0}, /* cut short at the end */
        {S("\xe2\x82"), 0, 0},
        {S("\xe2"), 0, 0},
        {S("\xf0\x9f\x98"), 0, 0},
        {S("\xf0\x9f"), 0, 0},
        {S("\xc3\x41"), 0, 0}, /* cut short by a non-continuation byte */
        {S("\xc3\xc3\xa9"), 0, 0},
        {S("\xe2\x82\x41"), 0, 0},
        {S("\xe2\x41\xac"), 0, 0},
        {S("\xf0\x9f\x98\x41"), 0, 0},
        {"\xc3\xa9", 1, 0, 0}, /* cut short by n, not by the bytes */
        {"\xe2\x82\xac", 2, 0, 0},
        {"\xf0\x9f\x98\x80", 3, 0, 0},
    };
    for (size_t i = 0; i < NELEM(seqs); i++) {
        uint32_t cp = 0;
        size_t l = ovl_utf8_next((const uint8_t *)seqs[i].s, seqs[i].n, &cp);
        if (l != 0)
            fail_msg("case %zu: length %zu (U+%04X); expected 0", i, l, (unsigned)cp);
    }
}

/* Every code point a naive encoder can write, and every lead byte alone. */
static void test_utf8_next_exhaustive(void **state)
{
    (void)state;
    for (uint32_t cp = 0; cp <= 0x1fffff; cp++) {
        uint8_t b[8] = {0};
        size_t n = encode(cp, b);
        uint32_t got = 0xffffffff;
        size_t l = ovl_utf8_next(b, n, &got);
        bool valid = cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
        if (valid ? (l != n || got != cp) : l != 0)
            fail_msg("U+%04X: length %zu, U+%04X", (unsigned)cp, l, (unsigned)got);
        /* and never a whole character from fewer bytes */
        for (size_t k = 1; k < n; k++)
            if (ovl_utf8_next(b, k, &got) != 0)
                fail_msg("U+%04X: a character from %zu of its %zu bytes", (unsigned)cp, k, n);
    }
    for (unsigned b0 = 0; b0 < 256; b0++) {
        uint8_t b = (uint8_t)b0;
        uint32_t got;
        size_t l = ovl_utf8_next(&b, 1, &got);
        assert_int_equal(l, b0 < 0x80 ? 1 : 0);
    }
    /* every two-byte string against the reference */
    for (unsigned v = 0; v < 65536; v++) {
        uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
        uint32_t a = 0, r = 0;
        size_t la = ovl_utf8_next(b, 2, &a), lr = ref_utf8(b, 2, &r);
        if (la != lr || (la && a != r))
            fail_msg("%02x %02x: %zu U+%04X, expected %zu U+%04X", b[0], b[1], la, (unsigned)a, lr,
                     (unsigned)r);
    }
}

/* Random byte strings: the same answers as the reference, from every
 * offset. */
static void test_utf8_next_random(void **state)
{
    (void)state;
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int t = 0; t < RANDOM_CASES; t++) {
        uint8_t buf[MAX_IN];
        size_t n = rnd_bytes(buf, sizeof(buf), true);
        for (size_t i = 0; i <= n; i++) {
            uint32_t a = 0, r = 0;
            size_t la = ovl_utf8_next(buf + i, n - i, &a), lr = ref_utf8(buf + i, n - i, &r);
            if (la != lr || (la && a != r))
                fail_msg("case %d at %zu: %zu U+%04X, expected %zu U+%04X", t, i, la, (unsigned)a,
                         lr, (unsigned)r);
        }
    }
}

/* ---------------------------------------------------- ovl_text_is_control */

static void test_is_control(void **state)
{
    (void)state;
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++)
        assert_int_equal(ovl_text_is_control(cp), ref_control(cp));
    assert_true(ovl_text_is_control(0));
    assert_true(ovl_text_is_control(0x1b));
    assert_true(ovl_text_is_control(0x1f));
    assert_false(ovl_text_is_control(' '));
    assert_false(ovl_text_is_control('~'));
    assert_true(ovl_text_is_control(0x7f));
    assert_true(ovl_text_is_control(0x80));
    assert_true(ovl_text_is_control(0x9b)); /* CSI */
    assert_true(ovl_text_is_control(0x9f));
    assert_false(ovl_text_is_control(0xa0));
    assert_false(ovl_text_is_control(0xfffd));
    assert_false(ovl_text_is_control(0x10ffff));
}

/* ------------------------------------------------------ ovl_text_is_clean */

static bool clean(const char *s, size_t n)
{
    return ovl_text_is_clean((const uint8_t *)s, n);
}

static void test_is_clean(void **state)
{
    (void)state;
    assert_true(clean("", 0));
    assert_true(clean(NULL, 0));
    assert_true(clean(S("train-7")));
    assert_true(clean(S(" !\"#$%&'()*+,-./09:;<=>?@AZ[\\]^_`az{|}~")));
    assert_true(clean(S("caf\xc3\xa9")));
    assert_true(clean(S("\xc2\xa0")));         /* U+00A0: not C1 */
    assert_true(clean(S("\xe2\x82\xac")));     /* U+20AC */
    assert_true(clean(S("\xf0\x9f\x98\x80"))); /* U+1F600 */
    assert_true(clean(S("\xf4\x8f\xbf\xbf"))); /* U+10FFFF */
    assert_true(clean(S("\xef\xbf\xbd")));     /* U+FFFD */

    assert_false(clean(S("a\x1b[31m")));
    assert_false(clean(S("tab\there")));
    assert_false(clean(S("line\n")));
    assert_false(clean(S("\x07")));
    assert_false(clean(S("\x7f")));
    assert_false(clean(S("\xc2\x80")));
    assert_false(clean(S("\xc2\x9b"
                         "2J"))); /* U+009B: CSI */
    assert_false(clean(S("\xc2\x9f")));
    assert_false(clean(S("nul\0tail"))); /* a NUL inside */
    assert_false(clean("a\0", 2));       /* a NUL at the end, when n counts it */
    assert_true(clean("a\0", 1));
    assert_false(clean(S("\xc0\x80")));
    assert_false(clean(S("\xe0\x80\x80")));
    assert_false(clean(S("\xf0\x80\x80\x80")));
    assert_false(clean(S("\xed\xa0\x80")));
    assert_false(clean(S("\xf4\x90\x80\x80")));
    assert_false(clean(S("ab\x80")));
    assert_false(clean(S("ab\xc3")));
    assert_false(clean(S("ab\xe2\x82")));
    assert_false(clean(S("ab\xf0\x9f\x98")));
    assert_false(clean(S("\xff\xfe")));
    assert_false(clean("caf\xc3\xa9", 4)); /* n cuts the last character */

    rng_state = 0x243f6a8885a308d3ull;
    for (int t = 0; t < RANDOM_CASES; t++) {
        uint8_t buf[MAX_IN];
        size_t n = rnd_bytes(buf, sizeof(buf), true);
        bool want = true;
        for (size_t i = 0; i < n && want;) {
            uint32_t cp;
            size_t l = ref_utf8(buf + i, n - i, &cp);
            want = l && !ref_control(cp);
            i += l;
        }
        if (ovl_text_is_clean(buf, n) != want)
            fail_msg("case %d: is_clean %d, expected %d", t, !want, want);
    }
}

/* ------------------------------------------------------ ovl_text_sanitize */

static void check_sanitize(const char *in, size_t n, size_t dstlen, const char *want)
{
    char dst[256];
    memset(dst, 'X', sizeof(dst));
    size_t got = ovl_text_sanitize(dst, dstlen, (const uint8_t *)in, n);
    assert_int_equal(got, strlen(want));
    assert_string_equal(dst, want);
    assert_int_equal(dst[dstlen], 'X'); /* nothing past dstlen */
}

static void test_sanitize_cases(void **state)
{
    (void)state;
    check_sanitize(S("python3"), 64, "python3");
    check_sanitize(S(""), 64, "");
    check_sanitize(NULL, 0, 64, "");
    check_sanitize(S("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), 64,
                   "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    check_sanitize(S("\x1b[31mRED\x1b]0;title\x07"), 64, "?[31mRED?]0;title?");
    check_sanitize(S("\xff\xfe\xc3"), 64, "???");
    check_sanitize(S("a\tb\nc\rd\x7f"
                     "e"),
                   64, "a?b?c?d?e");
    check_sanitize(S("\xc2\x9b"
                     "2J"),
                   64, "?2J"); /* one '?' for one C1 character */
    check_sanitize(S("\xc2\x80\xc2\x9f\xc2\xa0"), 64, "??\xc2\xa0");
    check_sanitize(S("nul\0tail"), 64, "nul?tail"); /* NUL inside */
    check_sanitize(S("\0"), 64, "?");
    check_sanitize(S("\xc0\x80"), 64, "??"); /* each byte of a bad sequence */
    check_sanitize(S("\xe0\x80\x80"), 64, "???");
    check_sanitize(S("\xf0\x80\x80\x80"), 64, "????");
    check_sanitize(S("\xed\xa0\x80"), 64, "???");
    check_sanitize(S("\xf4\x90\x80\x80"), 64, "????");
    check_sanitize(S("\x80\xbf"
                     "a"),
                   64, "??a");
    check_sanitize(S("ab\xe2\x82"), 64, "ab??"); /* cut short at the end */
    check_sanitize(S("ab\xf0\x9f\x98"), 64, "ab???");
    check_sanitize(S("\xc3\xc3\xa9"), 64, "?\xc3\xa9"); /* resynchronizes */
    check_sanitize(S("\xe2\x82\x41"), 64, "??A");
    check_sanitize("caf\xc3\xa9", 4, 64, "caf?"); /* n, not the NUL, ends the input */
}

static void test_sanitize_cut(void **state)
{
    (void)state;
    char in[256], want[256];
    size_t n = 0;

    /* 40 two-byte characters into 64 bytes: 31 of them, 62 bytes */
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(in + n, sizeof(in) - n, "\xc3\xa9");
    assert_int_equal(n, 80);
    want[0] = '\0';
    for (int i = 0; i < 31; i++)
        strcat(want, "\xc3\xa9");
    check_sanitize(in, n, 64, want);
    assert_int_equal(strlen(want), 62);

    /* an odd start shifts the boundary: "a" + 31 of them is 63 bytes */
    in[0] = 'a';
    n = 1;
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(in + n, sizeof(in) - n, "\xc3\xa9");
    snprintf(want, sizeof(want), "a");
    for (int i = 0; i < 31; i++)
        strcat(want, "\xc3\xa9");
    check_sanitize(in, n, 64, want);

    /* three bytes: 21 characters are 63 bytes, and 22 do not fit */
    n = 0;
    for (int i = 0; i < 22; i++)
        n += (size_t)snprintf(in + n, sizeof(in) - n, "\xe2\x82\xac");
    memcpy(want, in, 63);
    want[63] = '\0';
    check_sanitize(in, 63, 64, want);
    check_sanitize(in, n, 64, want);
    want[60] = '\0'; /* 62 bytes hold 20 of them */
    check_sanitize(in, n, 63, want);

    /* four bytes: 16 of them are 64 bytes, 15 fit */
    n = 0;
    for (int i = 0; i < 16; i++)
        n += (size_t)snprintf(in + n, sizeof(in) - n, "\xf0\x9f\x98\x80");
    memcpy(want, in, 60);
    want[60] = '\0';
    check_sanitize(in, n, 64, want);

    /* a '?' still fits where the bad sequence would not */
    memset(in, 'a', 62);
    memcpy(in + 62, "\xed\xa0\x80", 3);
    memset(want, 'a', 62);
    memcpy(want + 62, "?", 2);
    check_sanitize(in, 65, 64, want);

    /* the smallest buffers */
    check_sanitize(S("abc"), 1, "");
    check_sanitize(S("\xc3\xa9"), 1, "");
    check_sanitize(S("\xff"), 1, "");
    check_sanitize(S(""), 1, "");
    check_sanitize(S("abc"), 2, "a");
    check_sanitize(S("\xc3\xa9"), 2, "");
    check_sanitize(S("\xc3\xa9"), 3, "\xc3\xa9");
    check_sanitize(S("\xe2\x82\xac"), 3, "");
    check_sanitize(S("\xe2\x82\xac"), 4, "\xe2\x82\xac");
    check_sanitize(S("\xff"), 2, "?");
    check_sanitize(S("\x1b"), 2, "?");
}

/* Random bytes: the output is clean, the longest cut of the whole
 * sanitized text that fits, and clean text comes through unchanged. */
static void test_sanitize_random(void **state)
{
    (void)state;
    rng_state = 0x13198a2e03707344ull;
    for (int t = 0; t < RANDOM_CASES; t++) {
        uint8_t in[MAX_IN];
        size_t n = rnd_bytes(in, sizeof(in), true);
        /* the reference: one piece per character or bad byte */
        piece_t pieces[MAX_PIECES];
        size_t np = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = ref_utf8(in + i, n - i, &cp);
            if (l == 0 || ref_control(cp)) {
                pieces[np].s[0] = '?';
                pieces[np].len = 1;
                l = l ? l : 1;
            } else {
                memcpy(pieces[np].s, in + i, l);
                pieces[np].len = l;
            }
            np++;
            i += l;
        }
        size_t dstlen = 1 + rnd_below(MAX_IN + 2);
        char want[MAX_IN + 1], dst[MAX_IN + 8];
        size_t wl = ref_join(pieces, np, dstlen, want);
        memset(dst, 'X', sizeof(dst));
        size_t got = ovl_text_sanitize(dst, dstlen, in, n);
        if (got != wl || memcmp(dst, want, wl + 1) != 0)
            fail_msg("case %d (n %zu, dstlen %zu): %zu bytes '%s', expected %zu '%s'", t, n, dstlen,
                     got, dst, wl, want);
        assert_true(got < dstlen);
        assert_int_equal(dst[dstlen], 'X');
        assert_true(ovl_text_is_clean((const uint8_t *)dst, got));
        assert_true(ref_valid_utf8((const uint8_t *)dst, got));
        /* sanitizing clean text changes nothing */
        char again[MAX_IN + 8];
        assert_int_equal(ovl_text_sanitize(again, sizeof(again), (const uint8_t *)dst, got), got);
        assert_string_equal(again, dst);
    }
}

/* --------------------------------------------------- ovl_text_escape_term */

static void check_term(const char *in, size_t dstlen, const char *want)
{
    char dst[256];
    memset(dst, 'X', sizeof(dst));
    size_t got = ovl_text_escape_term(dst, dstlen, in);
    assert_string_equal(dst, want);
    assert_int_equal(got, strlen(want));
    assert_int_equal(dst[dstlen], 'X');
}

static void test_escape_term_cases(void **state)
{
    (void)state;
    check_term("", 64, "");
    check_term("train-7 python3", 64, "train-7 python3");
    check_term("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0", 64,
               "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\xa0");
    check_term("\x1b[31mRED\x1b]0;title\x07", 64, "\\e[31mRED\\e]0;title\\x07");
    check_term("a\nb", 64, "a\\nb");
    check_term("a\tb", 64, "a\\tb");
    check_term("a\rb", 64, "a\\rb");
    check_term("C:\\dir", 64, "C:\\\\dir");
    check_term("\\x41", 64, "\\\\x41"); /* a literal escape stays told apart */
    check_term("\x01\x1f\x7f", 64, "\\x01\\x1f\\x7f");
    check_term("\x08\x0b\x0c", 64, "\\x08\\x0b\\x0c");
    check_term("\xc2\x9b"
               "2J",
               64, "\\u009b2J"); /* C1 CSI */
    check_term("\xc2\x80\xc2\x9f", 64, "\\u0080\\u009f");
    check_term("\xff\xfe\xc3", 64, "\\xff\\xfe\\xc3");
    check_term("\xc0\x80", 64, "\\xc0\\x80");
    check_term("\xe0\x80\x80", 64, "\\xe0\\x80\\x80");
    check_term("\xf0\x80\x80\x80", 64, "\\xf0\\x80\\x80\\x80");
    check_term("\xed\xa0\x80", 64, "\\xed\\xa0\\x80");
    check_term("\xf4\x90\x80\x80", 64, "\\xf4\\x90\\x80\\x80");
    check_term("ab\xe2\x82", 64, "ab\\xe2\\x82");
    check_term("\x9b[2J", 64, "\\x9b[2J"); /* a raw 0x9b byte is not UTF-8 */
    check_term("\"quoted\" 'x'", 64, "\"quoted\" 'x'");
}

/* A right-to-left override in a job id would reorder the rest of a status
 * line on a terminal: every bidi control is refused as clean text, made '?'
 * by the sanitizer and escaped by both escapers; its neighbours are not. */
static void test_bidi_controls(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bidi_controls) / sizeof(bidi_controls[0]); i++) {
        uint32_t cp = bidi_controls[i];
        assert_true(ovl_text_is_control(cp));
        assert_true(ovl_text_is_bidi_control(cp));
        uint8_t enc[4];
        size_t el = encode(cp, enc);
        char in[16], want[32], out[64];
        snprintf(in, sizeof(in), "a%.*sb", (int)el, (const char *)enc);
        assert_false(ovl_text_is_clean((const uint8_t *)in, strlen(in)));
        ovl_text_sanitize(out, sizeof(out), (const uint8_t *)in, strlen(in));
        assert_string_equal(out, "a?b");
        snprintf(want, sizeof(want), "a\\u%04xb", (unsigned)cp);
        check_term(in, 64, want);
        ovl_text_escape_json(out, sizeof(out), in);
        assert_string_equal(out, want);
    }
    /* the code points around them are text */
    static const uint32_t kept[] = {0x061b, 0x061d, 0x200d, 0x2010, 0x2029, 0x202f, 0x2065, 0x206a};
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
        assert_false(ovl_text_is_control(kept[i]));
        assert_false(ovl_text_is_bidi_control(kept[i]));
    }
    /* "ovlctl status" of a job named with an override: the escape shows it */
    check_term("job\xe2\x80\xaegnp.exe", 64, "job\\u202egnp.exe");
}

static void test_escape_term_cut(void **state)
{
    (void)state;
    check_term("abc", 1, "");
    check_term("\x1b", 1, "");
    check_term("abc", 2, "a");
    check_term("abc", 4, "abc");
    check_term("ab\x1b", 4, "ab"); /* "\e" needs 2 bytes, 1 is left */
    check_term("ab\x1b", 5, "ab\\e");
    check_term("a\xff", 5, "a"); /* "\xff" needs 4 */
    check_term("a\xff", 6, "a\\xff");
    check_term("a\xc2\x9b", 7, "a"); /* "\u009b" needs 6 */
    check_term("a\xc2\x9b", 8, "a\\u009b");
    check_term("a\xc3\xa9", 3, "a"); /* never half a character */
    check_term("a\xf0\x9f\x98\x80", 5, "a");
    check_term("a\xf0\x9f\x98\x80", 6, "a\xf0\x9f\x98\x80");
    check_term("\x1b"
               "abc",
               2, ""); /* nothing after a piece that did not fit */
    check_term("\xc3\xa9"
               "abc",
               2, "");
}

static void test_escape_term_random(void **state)
{
    (void)state;
    rng_state = 0xa4093822299f31d0ull;
    for (int t = 0; t < RANDOM_CASES; t++) {
        uint8_t in[MAX_IN + 1];
        size_t n = rnd_bytes(in, MAX_IN, false);
        in[n] = '\0';
        piece_t pieces[MAX_PIECES];
        size_t np = ref_pieces((const char *)in, false, pieces, NULL);

        /* a buffer large enough: every piece, and nothing a terminal acts on */
        char full[BIG], want[BIG];
        size_t fl = ovl_text_escape_term(full, sizeof(full), (const char *)in);
        size_t wl = ref_join(pieces, np, sizeof(want), want);
        if (fl != wl || strcmp(full, want) != 0)
            fail_msg("case %d: '%s', expected '%s'", t, full, want);
        assert_true(fl <= 4 * n); /* the worst case: \xHH for each byte */
        assert_true(ovl_text_is_clean((const uint8_t *)full, fl));
        assert_true(ref_valid_utf8((const uint8_t *)full, fl));
        for (size_t i = 0; i < fl; i++)
            assert_true((uint8_t)full[i] >= 0x20 && (uint8_t)full[i] != 0x7f);
        /* and it reads back to the very bytes it came from */
        uint8_t back[BIG];
        long bl = term_unescape(full, back, sizeof(back));
        if (bl != (long)n || memcmp(back, in, n) != 0)
            fail_msg("case %d: '%s' does not read back", t, full);

        /* a short buffer: the longest run of whole pieces that fits */
        size_t dstlen = 1 + rnd_below((uint32_t)fl + 2);
        char dst[BIG];
        memset(dst, 'X', sizeof(dst));
        size_t got = ovl_text_escape_term(dst, dstlen, (const char *)in);
        wl = ref_join(pieces, np, dstlen, want);
        if (got != wl || strcmp(dst, want) != 0)
            fail_msg("case %d, dstlen %zu: '%s', expected '%s'", t, dstlen, dst, want);
        assert_int_equal(dst[dstlen], 'X');
        assert_true(ovl_text_is_clean((const uint8_t *)dst, got));
    }
}

/* --------------------------------------------------- ovl_text_escape_json */

static void check_json(const char *in, size_t dstlen, const char *want)
{
    char dst[256];
    memset(dst, 'X', sizeof(dst));
    size_t got = ovl_text_escape_json(dst, dstlen, in);
    assert_string_equal(dst, want);
    assert_int_equal(got, strlen(want));
    assert_int_equal(dst[dstlen], 'X');
    assert_true(json_string_valid(dst));
}

static void test_escape_json_cases(void **state)
{
    (void)state;
    check_json("", 64, "");
    check_json("train-7", 64, "train-7");
    check_json("a\"b\\c/d", 64, "a\\\"b\\\\c/d");
    check_json("\n\t\r", 64, "\\n\\t\\r");
    check_json("\x01\x08\x0c\x1f", 64, "\\u0001\\u0008\\u000c\\u001f");
    check_json("\x1b[31mRED\x1b]0;title\x07", 64, "\\u001b[31mRED\\u001b]0;title\\u0007");
    check_json("\x7f", 64, "\\u007f");
    check_json("\xc2\x9b"
               "2J",
               64, "\\u009b2J");
    check_json("\xc2\x80\xc2\x9f\xc2\xa0", 64, "\\u0080\\u009f\xc2\xa0");
    check_json("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 64,
               "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    check_json("\xef\xbf\xbd", 64, "\xef\xbf\xbd"); /* a real U+FFFD */
    check_json("\xff\xfe\xc3", 64, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    check_json("\xc0\x80", 64, "\xef\xbf\xbd\xef\xbf\xbd");
    check_json("\xed\xa0\x80", 64, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    check_json("\xf4\x90\x80\x80", 64, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    check_json("a\x80z", 64, "a\xef\xbf\xbdz");
    check_json("ab\xe2\x82", 64, "ab\xef\xbf\xbd\xef\xbf\xbd");

    assert_int_equal(ovl_text_escape_json_len(""), 0);
    assert_int_equal(ovl_text_escape_json_len("abc"), 3);
    assert_int_equal(ovl_text_escape_json_len("\x1b"), 6);
    assert_int_equal(ovl_text_escape_json_len("\xff"), 3);
    assert_int_equal(ovl_text_escape_json_len("\"\\"), 4);
    assert_int_equal(ovl_text_escape_json_len("\xc3\xa9"), 2);
}

static void test_escape_json_cut(void **state)
{
    (void)state;
    check_json("abc", 1, "");
    check_json("\"", 1, "");
    check_json("a\"", 3, "a"); /* never a lone backslash */
    check_json("a\"", 4, "a\\\"");
    check_json("a\x1b", 7, "a"); /* never half of \u001b */
    check_json("a\x1b", 8, "a\\u001b");
    check_json("a\xff", 4, "a"); /* never half of U+FFFD */
    check_json("a\xff", 5, "a\xef\xbf\xbd");
    check_json("a\xe2\x82\xac", 4, "a");
    check_json("\x1b"
               "abc",
               6, ""); /* nothing after a piece that did not fit */
    /* len does not depend on any buffer */
    assert_int_equal(ovl_text_escape_json_len("a\x1b"), 7);
}

static void test_escape_json_random(void **state)
{
    (void)state;
    rng_state = 0x082efa98ec4e6c89ull;
    for (int t = 0; t < RANDOM_CASES; t++) {
        uint8_t in[MAX_IN + 1];
        size_t n = rnd_bytes(in, MAX_IN, false);
        in[n] = '\0';
        piece_t pieces[MAX_PIECES];
        uint32_t cps[MAX_PIECES];
        size_t np = ref_pieces((const char *)in, true, pieces, cps);

        char full[BIG], want[BIG];
        size_t need = ovl_text_escape_json_len((const char *)in);
        size_t fl = ovl_text_escape_json(full, sizeof(full), (const char *)in);
        size_t wl = ref_join(pieces, np, sizeof(want), want);
        if (fl != wl || strcmp(full, want) != 0)
            fail_msg("case %d: '%s', expected '%s'", t, full, want);
        assert_int_equal(need, fl);
        assert_true(fl <= 6 * n); /* the worst case: \u001f for a byte */
        /* exactly need + 1 bytes are enough, one fewer is not */
        char exact[BIG];
        assert_int_equal(ovl_text_escape_json(exact, need + 1, (const char *)in), need);
        assert_string_equal(exact, full);
        if (need > 0)
            assert_true(ovl_text_escape_json(exact, need, (const char *)in) < need);

        /* valid UTF-8, valid JSON, and it reads back to the characters of
         * the input with U+FFFD for each bad byte */
        assert_true(ref_valid_utf8((const uint8_t *)full, fl));
        assert_true(ovl_text_is_clean((const uint8_t *)full, fl));
        uint32_t back[BIG];
        long nb = json_string_parse(full, fl, back, NELEM(back));
        if (nb != (long)np)
            fail_msg("case %d: '%s' parses to %ld characters, expected %zu", t, full, nb, np);
        for (size_t i = 0; i < np; i++)
            if (back[i] != cps[i])
                fail_msg("case %d: character %zu is U+%04X, expected U+%04X", t, i,
                         (unsigned)back[i], (unsigned)cps[i]);

        /* a short buffer: whole pieces only, still valid */
        size_t dstlen = 1 + rnd_below((uint32_t)fl + 2);
        char dst[BIG];
        memset(dst, 'X', sizeof(dst));
        size_t got = ovl_text_escape_json(dst, dstlen, (const char *)in);
        wl = ref_join(pieces, np, dstlen, want);
        if (got != wl || strcmp(dst, want) != 0)
            fail_msg("case %d, dstlen %zu: '%s', expected '%s'", t, dstlen, dst, want);
        assert_int_equal(dst[dstlen], 'X');
        assert_true(ref_valid_utf8((const uint8_t *)dst, got));
        assert_true(json_string_valid(dst));
        /* len is what the full escape needs, whatever the buffer */
        assert_int_equal(ovl_text_escape_json_len((const char *)in), need);
    }
}

/* The checker itself: it must refuse what is not a JSON string, or the
 * random test proves nothing. */
static void test_json_checker(void **state)
{
    (void)state;
    assert_true(json_string_valid(""));
    assert_true(json_string_valid("a\\\"b\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00"));
    assert_false(json_string_valid("\""));
    assert_false(json_string_valid("\\"));
    assert_false(json_string_valid("a\\"));
    assert_false(json_string_valid("\\x41"));
    assert_false(json_string_valid("\\e"));
    assert_false(json_string_valid("\\u00"));
    assert_false(json_string_valid("\\u00g0"));
    assert_false(json_string_valid("\\ud83d"));
    assert_false(json_string_valid("\\ude00"));
    assert_false(json_string_valid("\x1b"));
    assert_false(json_string_valid("\t"));
    assert_false(json_string_valid("\xff"));
    assert_false(json_string_valid("\xc3"));
    assert_false(json_string_valid("\xed\xa0\x80"));
    uint8_t back[8];
    assert_int_equal(term_unescape("\\e\\x41\\u009b", back, sizeof(back)), 4);
    assert_memory_equal(back,
                        "\x1b"
                        "A\xc2\x9b",
                        4);
    assert_int_equal(term_unescape("\\q", back, sizeof(back)), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_next_valid),      cmocka_unit_test(test_utf8_next_invalid),
        cmocka_unit_test(test_utf8_next_exhaustive), cmocka_unit_test(test_utf8_next_random),
        cmocka_unit_test(test_is_control),           cmocka_unit_test(test_is_clean),
        cmocka_unit_test(test_sanitize_cases),       cmocka_unit_test(test_sanitize_cut),
        cmocka_unit_test(test_sanitize_random),      cmocka_unit_test(test_json_checker),
        cmocka_unit_test(test_escape_term_cases),    cmocka_unit_test(test_escape_term_cut),
        cmocka_unit_test(test_escape_term_random),   cmocka_unit_test(test_escape_json_cases),
        cmocka_unit_test(test_escape_json_cut),      cmocka_unit_test(test_escape_json_random),
        cmocka_unit_test(test_bidi_controls),
    };
    return cmocka_run_group_tests_name("text", tests, NULL, NULL);
}

/*
 * text.c: see text.h.
 */
#include "text.h"

#include <stdio.h>
#include <string.h>

size_t ovl_utf8_next(const uint8_t *s, size_t n, uint32_t *ret_cp)
{
    if (n == 0)
        return 0;
    uint8_t b = s[0];
    size_t len;
    uint32_t cp, min;
    if (b < 0x80) {
        *ret_cp = b;
        return 1;
    } else if ((b & 0xe0) == 0xc0) {
        len = 2, cp = b & 0x1f, min = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
        len = 3, cp = b & 0x0f, min = 0x800;
    } else if ((b & 0xf8) == 0xf0) {
        len = 4, cp = b & 0x07, min = 0x10000;
    } else {
        return 0; /* a continuation byte, or 0xf8..0xff */
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    *ret_cp = cp;
    return len;
}

bool ovl_text_is_control(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || ovl_text_is_bidi_control(cp);
}

bool ovl_text_is_bidi_control(uint32_t cp)
{
    /* ALM; LRM, RLM; LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI */
    return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

bool ovl_text_is_clean(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = ovl_utf8_next(s + i, n - i, &cp);
        if (l == 0 || ovl_text_is_control(cp))
            return false;
        i += l;
    }
    return true;
}

size_t ovl_text_sanitize(char *dst, size_t dstlen, const uint8_t *s, size_t n)
{
    size_t o = 0, i = 0;
    if (dstlen == 0)
        return 0;
    while (i < n) {
        uint32_t cp;
        size_t l = ovl_utf8_next(s + i, n - i, &cp);
        const uint8_t *piece = s + i;
        size_t plen = l;
        if (l == 0 || ovl_text_is_control(cp)) {
            piece = (const uint8_t *)"?";
            plen = 1;
            l = l ? l : 1;
        }
        if (o + plen > dstlen - 1)
            break;
        memcpy(dst + o, piece, plen);
        o += plen;
        i += l;
    }
    dst[o] = '\0';
    return o;
}

/* Both escapers walk s the same way; an escaper's piece for one character
 * (or one bad byte) goes to dst whole or not at all. */
typedef size_t (*piece_fn)(const uint8_t *s, size_t l, uint32_t cp, bool bad, char out[16]);

static size_t escape(char *dst, size_t dstlen, const char *str, piece_fn fn, size_t *ret_need)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t n = strlen(str), i = 0, o = 0, need = 0;
    bool full = dstlen == 0; /* nothing fits, not even the NUL */
    while (i < n) {
        uint32_t cp = 0;
        size_t l = ovl_utf8_next(s + i, n - i, &cp);
        bool bad = l == 0;
        char piece[16];
        size_t plen = fn(s + i, bad ? 1 : l, cp, bad, piece);
        need += plen;
        if (!full && dst && o + plen <= dstlen - 1) {
            memcpy(dst + o, piece, plen);
            o += plen;
        } else {
            full = true;
        }
        i += bad ? 1 : l;
    }
    if (dst && dstlen)
        dst[o] = '\0';
    if (ret_need)
        *ret_need = need;
    return o;
}

/* The escapes a terminal and JSON share: a backslash and the usual
 * whitespace controls, written into out; 0 for any other character. */
static size_t common_escape(uint32_t cp, char out[16])
{
    const char *e = cp == '\\'   ? "\\\\"
                    : cp == '\t' ? "\\t"
                    : cp == '\n' ? "\\n"
                    : cp == '\r' ? "\\r"
                                 : NULL;
    return e ? (size_t)snprintf(out, 16, "%s", e) : 0;
}

/* A character kept as it is, or a control written as \u00XX. */
static size_t plain_or_u(const uint8_t *s, size_t l, uint32_t cp, char out[16])
{
    if (ovl_text_is_control(cp))
        return (size_t)snprintf(out, 16, "\\u%04x", (unsigned)cp);
    memcpy(out, s, l);
    return l;
}

static size_t term_piece(const uint8_t *s, size_t l, uint32_t cp, bool bad, char out[16])
{
    size_t n;
    if (bad)
        return (size_t)snprintf(out, 16, "\\x%02x", s[0]);
    if ((n = common_escape(cp, out)) > 0)
        return n;
    if (cp == 0x1b)
        return (size_t)snprintf(out, 16, "\\e");
    if (cp < 0x20 || cp == 0x7f)
        return (size_t)snprintf(out, 16, "\\x%02x", (unsigned)cp);
    return plain_or_u(s, l, cp, out); /* C1 as \u0080..\u009f, bidi as \u202e... */
}

static size_t json_piece(const uint8_t *s, size_t l, uint32_t cp, bool bad, char out[16])
{
    size_t n;
    if (bad) {
        memcpy(out, "\xef\xbf\xbd", 3); /* U+FFFD */
        return 3;
    }
    if (cp == '"')
        return (size_t)snprintf(out, 16, "\\\"");
    if ((n = common_escape(cp, out)) > 0)
        return n;
    return plain_or_u(s, l, cp, out);
}

size_t ovl_text_escape_term(char *dst, size_t dstlen, const char *s)
{
    return escape(dst, dstlen, s, term_piece, NULL);
}

size_t ovl_text_escape_json(char *dst, size_t dstlen, const char *s)
{
    return escape(dst, dstlen, s, json_piece, NULL);
}

size_t ovl_text_escape_json_len(const char *s)
{
    size_t need;
    escape(NULL, 0, s, json_piece, &need);
    return need;
}

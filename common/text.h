/*
 * text.h: text that crosses a trust boundary. Job ids and client names come
 * from clients and end up on an operator's terminal and in JSON, so ovld
 * checks them at the boundary and ovlctl escapes whatever it prints. Pure
 * code, shared by ovld and ovlctl; nothing logs.
 *
 * "Clean" text is valid UTF-8 (RFC 3629: no overlong forms, no surrogates,
 * nothing above U+10FFFF) with no control character: no C0 (U+0000..U+001F),
 * no DEL (U+007F), no C1 (U+0080..U+009F; a terminal reads U+009B as CSI),
 * and no bidirectional formatting control (U+061C, U+200E, U+200F,
 * U+202A..U+202E, U+2066..U+2069): an override such as U+202E reorders the
 * rest of the line it is printed on, so that a job id could make a status
 * line read as something else (Trojan Source, CVE-2021-42574).
 */
#ifndef OVL_TEXT_H
#define OVL_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The length (1..4) of the valid UTF-8 sequence at s[0..n), its code point in
 * *ret_cp; 0 if s does not start with one (n == 0, a stray continuation
 * byte, an overlong form, a surrogate, a code point past U+10FFFF, or a
 * sequence cut short by n). */
size_t ovl_utf8_next(const uint8_t *s, size_t n, uint32_t *ret_cp);

/* Whether code point cp is a control character (C0, DEL, C1 or a bidi
 * control). */
bool ovl_text_is_control(uint32_t cp);
/* Whether cp is one of the bidirectional formatting controls above. */
bool ovl_text_is_bidi_control(uint32_t cp);

/* Whether s[0..n) is clean text (above). */
bool ovl_text_is_clean(const uint8_t *s, size_t n);

/*
 * Copies s[0..n) into dst (of dstlen >= 1 bytes, always NUL-terminated) as
 * clean text: each byte that does not start a valid sequence, and each
 * control character, becomes '?'; the copy is cut on a character boundary,
 * never inside a sequence. Returns the bytes written, the NUL excluded.
 */
size_t ovl_text_sanitize(char *dst, size_t dstlen, const uint8_t *s, size_t n);

/*
 * Escapes NUL-terminated s for a terminal into dst (dstlen >= 1, always
 * NUL-terminated): control characters as \t, \n, \r, \e, \\ or \xHH (C1 as
 * \u0080..\u009f, bidi controls as \u202e and the like), bytes that are not
 * valid UTF-8 as \xHH, a backslash as \\; clean characters are kept. Cut on
 * an escape's or a character's boundary when dst is short. Returns the bytes written.
 */
size_t ovl_text_escape_term(char *dst, size_t dstlen, const char *s);

/*
 * Escapes NUL-terminated s as the contents of a JSON string (RFC 8259) into
 * dst: '"' and '\\' escaped, every control character as \uXXXX (or \n, \t,
 * ...), each byte that is not valid UTF-8 as U+FFFD, so that the result is
 * valid UTF-8 and valid JSON whatever s holds. Cut on a boundary as above.
 * Returns the bytes written; ovl_text_escape_json_len gives the size needed
 * (without the NUL).
 */
size_t ovl_text_escape_json(char *dst, size_t dstlen, const char *s);
size_t ovl_text_escape_json_len(const char *s);

#endif /* OVL_TEXT_H */

/* _kscan_json.h: the strict JSON lexer of the native scanner (parsers/_kscan.c): tokens, the
 * parser state, the give-up macro, and the lexer / string functions _kscan_json.c defines.
 *
 * Private to the extension ep_trace.parsers._kscan, whose parts are compiled as one translation
 * unit (see _kscan.c): the functions are static, so the module exports PyInit__kscan only.
 */
#ifndef EP_TRACE_KSCAN_JSON_H
#define EP_TRACE_KSCAN_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "_kscan_buf.h"

/* ---------------------------------------------------------------- tokens */
enum { T_MISSING = 0, T_NULL, T_TRUE, T_FALSE, T_STR, T_NUM, T_OBJ, T_ARR };

typedef struct {
    int type;
    const uint8_t *s; /* string: first byte after the quote; number: its first byte */
    size_t n;         /* raw length (string: without quotes) */
    int esc;          /* string holds a backslash escape */
    int ascii;        /* string: every raw byte < 0x80 */
    int is_int;       /* number: no fraction, no exponent */
    int digits;       /* number: digits before any '.' or exponent */
} Tok;

typedef struct {
    const uint8_t *p, *end;
    const char *why;
    int depth;
} P;

/* Give up: record why (a static string; it reaches Python word for word) and return -1. */
#define BAIL(P_, msg)        \
    do {                     \
        (P_)->why = (msg);   \
        return -1;           \
    } while (0)

static inline void skip_ws(P *q) {
    while (q->p < q->end) {
        uint8_t c = *q->p;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
            q->p++;
        else
            break;
    }
}

/* Fill the lexer's byte-class table; once, before any scan (the module init calls it). */
static void json_init_tables(void);

/* A string at q->p (on its '"'), validated: escapes, surrogate pairs, UTF-8. */
static int scan_string(P *q, Tok *t);

/* Any value at q->p (after blanks), validated; t says what it was. */
static int skip_value(P *q, Tok *t);

/* The decoded text of a string token into b (escapes resolved, surrogate pairs joined). */
static int unescape(const Tok *t, Buf *b);

#endif /* EP_TRACE_KSCAN_JSON_H */

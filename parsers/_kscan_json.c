/* _kscan_json.c: the strict JSON lexer of the native scanner (parsers/_kscan.c).
 *
 * Validates every byte of a value as orjson's reader would accept it (JSON grammar, string
 * escapes, surrogate pairs, UTF-8) and gives up, with a fixed reason, on anything else; numbers
 * are only delimited and range-checked here (converted in _kscan_num.c). unescape() decodes a
 * validated string token. No Python API: this code runs without the GIL.
 *
 * Compiled inside _kscan.c's translation unit (see there why), after Python.h.
 */
#ifndef KSCAN_ONE_UNIT
#error "_kscan_json.c is compiled as part of _kscan.c (one translation unit; see there), not on its own"
#endif
#include <string.h>

#include "_kscan_json.h"

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const uint8_t *s, const uint8_t *end, unsigned *out) {
    unsigned v = 0;
    int i, h;
    if (end - s < 4) return -1;
    for (i = 0; i < 4; i++) {
        h = hexval(s[i]);
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* bytes that end the plain run of a string: '"', '\\', controls, non-ASCII */
static uint8_t STOP[256];

/* One UTF-8 sequence starting at s (s[0] >= 0x80): its length, or 0 if invalid (overlong,
 * surrogate, beyond U+10FFFF, truncated), as the UTF-8 check of orjson's reader refuses it. */
static int utf8_len(const uint8_t *s, const uint8_t *end) {
    uint8_t c = s[0];
    if (c >= 0xC2 && c <= 0xDF) {
        if (end - s < 2 || (s[1] & 0xC0) != 0x80) return 0;
        return 2;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - s < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - s < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
        return 4;
    }
    return 0;
}

/* A string at q->p (on its '"'), validated: escapes, surrogate pairs, UTF-8. */
static int scan_string(P *q, Tok *t) {
    const uint8_t *p = q->p + 1, *end = q->end;
    t->type = T_STR;
    t->s = p;
    t->esc = 0;
    t->ascii = 1;
    for (;;) {
        /* 8 bytes at a time while none of them is a '"', a '\\', a control or a non-ASCII byte
         * (the classic has-zero-byte tests, SWAR; a hit only hands over to the byte loop) */
        while (end - p >= 8) {
            uint64_t v, a, b;
            memcpy(&v, p, 8);
            a = v ^ 0x2222222222222222ULL;
            b = v ^ 0x5C5C5C5C5C5C5C5CULL;
            if ((((a - ONES) & ~a) | ((b - ONES) & ~b) | ((v - 0x2020202020202020ULL) & ~v) | v) & HIGHS) break;
            p += 8;
        }
        while (p < end && !STOP[*p]) p++;
        if (p >= end) BAIL(q, "unterminated string");
        if (*p == '"') break;
        if (*p == '\\') {
            unsigned u, lo;
            t->esc = 1;
            if (p + 1 >= end) BAIL(q, "unterminated string");
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                break;
            case 'u':
                if (hex4(p + 2, end, &u)) BAIL(q, "bad \\u escape");
                p += 6;
                if (u >= 0xDC00 && u <= 0xDFFF) BAIL(q, "lone low surrogate");
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) || lo < 0xDC00 ||
                        lo > 0xDFFF)
                        BAIL(q, "lone high surrogate");
                    p += 6;
                }
                break;
            default:
                BAIL(q, "bad escape");
            }
            continue;
        }
        if (*p < 0x20) BAIL(q, "control character in a string");
        {
            int k = utf8_len(p, end);
            if (!k) BAIL(q, "invalid UTF-8");
            t->ascii = 0;
            p += k;
        }
    }
    t->n = (size_t)(p - t->s);
    q->p = p + 1;
    return 0;
}

/* A number at q->p, validated against JSON's grammar; refused where orjson could read infinity. */
static int scan_number(P *q, Tok *t) {
    const uint8_t *p = q->p, *end = q->end;
    long ex = 0;
    int exneg = 0, idig = 0, int0 = 0;
    t->type = T_NUM;
    t->s = p;
    t->is_int = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) BAIL(q, "bad number");
    if (*p == '0') {
        p++;
        idig = 1;
        int0 = 1;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++, idig++;
    } else
        BAIL(q, "bad number");
    if (p < end && *p == '.') {
        t->is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') BAIL(q, "bad number");
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        t->is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) exneg = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9') BAIL(q, "bad number");
        while (p < end && *p >= '0' && *p <= '9') {
            if (ex < 100000) ex = ex * 10 + (*p - '0');
            p++;
        }
    }
    /* |value| < 10^308 (never infinity in orjson): its decimal exponent is at most 307 (an int part
     * "0" makes it < 10^ex); exponents <= -400 refused too (orjson reads them as 0.0; not worth it) */
    {
        long mag = exneg ? (long)idig - 1 - ex : (int0 ? ex - 1 : (long)idig - 1 + ex);
        if (mag > 307 || (exneg && ex > 400)) BAIL(q, "number near the float range");
    }
    t->digits = idig;
    t->n = (size_t)(p - t->s);
    q->p = p;
    return 0;
}

static int skip_container(P *q, uint8_t close) {
    Tok t;
    if (++q->depth > 200) BAIL(q, "nested too deep");
    q->p++;
    skip_ws(q);
    if (q->p < q->end && *q->p == close) {
        q->p++;
        q->depth--;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            if (q->p >= q->end || *q->p != '"') BAIL(q, "object key expected");
            if (scan_string(q, &t)) return -1;
            skip_ws(q);
            if (q->p >= q->end || *q->p != ':') BAIL(q, "':' expected");
            q->p++;
            skip_ws(q);
        }
        if (skip_value(q, &t)) return -1;
        skip_ws(q);
        if (q->p >= q->end) BAIL(q, "unterminated container");
        if (*q->p == ',') {
            q->p++;
            skip_ws(q);
            continue;
        }
        if (*q->p == close) {
            q->p++;
            q->depth--;
            return 0;
        }
        BAIL(q, "',' expected");
    }
}

static int literal(P *q, const char *word, size_t n) {
    if ((size_t)(q->end - q->p) < n || memcmp(q->p, word, n)) BAIL(q, "bad literal");
    q->p += n;
    return 0;
}

/* Any value at q->p (after blanks), validated; t says what it was. */
static int skip_value(P *q, Tok *t) {
    uint8_t c;
    if (q->p >= q->end) BAIL(q, "value expected");
    c = *q->p;
    switch (c) {
    case '"':
        return scan_string(q, t);
    case '{':
        t->type = T_OBJ;
        return skip_container(q, '}');
    case '[':
        t->type = T_ARR;
        return skip_container(q, ']');
    case 't':
        t->type = T_TRUE;
        return literal(q, "true", 4);
    case 'f':
        t->type = T_FALSE;
        return literal(q, "false", 5);
    case 'n':
        t->type = T_NULL;
        return literal(q, "null", 4);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return scan_number(q, t);
        BAIL(q, "value expected");
    }
}

/* The decoded text of a string token into b (escapes resolved, surrogate pairs joined). */
static int unescape(const Tok *t, Buf *b) {
    const uint8_t *p = t->s, *end = t->s + t->n;
    if (!t->esc) return buf_put(b, p, t->n);
    if (buf_grow(b, t->n)) return -1; /* decoded text is never longer than its escaped form */
    while (p < end) {
        const uint8_t *r = p;
        while (p < end && *p != '\\') p++;
        memcpy(b->p + b->len, r, (size_t)(p - r));
        b->len += (size_t)(p - r);
        if (p >= end) break;
        {
            char *o = b->p + b->len;
            unsigned u = 0, lo = 0;
            switch (p[1]) {
            case 'b': *o = '\b'; b->len++; p += 2; continue;
            case 'f': *o = '\f'; b->len++; p += 2; continue;
            case 'n': *o = '\n'; b->len++; p += 2; continue;
            case 'r': *o = '\r'; b->len++; p += 2; continue;
            case 't': *o = '\t'; b->len++; p += 2; continue;
            case 'u': break;
            default: *o = (char)p[1]; b->len++; p += 2; continue;
            }
            hex4(p + 2, end, &u);
            p += 6;
            if (u >= 0xD800 && u <= 0xDBFF) { /* validated by scan_string: a low half follows */
                hex4(p + 2, end, &lo);
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* (the UTF-8 form of one escape is never longer than its 6 or 12 bytes of text) */
            if (u < 0x80) {
                o[0] = (char)u;
                b->len += 1;
            } else if (u < 0x800) {
                o[0] = (char)(0xC0 | (u >> 6));
                o[1] = (char)(0x80 | (u & 0x3F));
                b->len += 2;
            } else if (u < 0x10000) {
                o[0] = (char)(0xE0 | (u >> 12));
                o[1] = (char)(0x80 | ((u >> 6) & 0x3F));
                o[2] = (char)(0x80 | (u & 0x3F));
                b->len += 3;
            } else {
                o[0] = (char)(0xF0 | (u >> 18));
                o[1] = (char)(0x80 | ((u >> 12) & 0x3F));
                o[2] = (char)(0x80 | ((u >> 6) & 0x3F));
                o[3] = (char)(0x80 | (u & 0x3F));
                b->len += 4;
            }
        }
    }
    return 0;
}

static void json_init_tables(void) {
    int c;
    for (c = 0; c < 256; c++) STOP[c] = (uint8_t)(c == '"' || c == '\\' || c < 0x20 || c >= 0x80);
}

/* ep_trace.parsers._kscan: a strict scanner for Kineto ``traceEvents`` slices.
 *
 * scan(pieces, keep_prefixes) reads the JSON pieces of one slice (each "[" + whole events + "]",
 * see parsers/kineto_stream.py::Slice) and returns, for the complete events ("ph":"X") in order,
 * the columns parsers/kineto.py::_chunk_frame builds from orjson objects, as raw buffers; or a
 * str naming why it gave up. It gives up on anything it does not read exactly as that path does
 * (a duplicate key, an escaped key, a boolean / string / > 18-digit time, a float or quoted id, a
 * float / bool pid, a label pid with non-ASCII or control characters, args that are no object,
 * invalid JSON or UTF-8, a lone surrogate, a number orjson could read as infinity ...): the caller
 * then decodes that slice with the reference path, so the result is exact by construction.
 *
 * Numbers: Clinger's fast path (an integer mantissa <= 2^53 scaled by an exact power of ten
 * <= 10^22: one correctly rounded multiply or divide), else strtod on a NUL-terminated copy
 * (glibc's strtod is correctly rounded, as orjson's reader is).
 *
 * The scan runs without the GIL (two worker threads of kineto_columnar use it at once).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* ---------------------------------------------------------------- growable buffers */
typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t extra) {
    size_t need = b->len + extra, cap = b->cap ? b->cap : 4096;
    char *q;
    if (need <= b->cap) return 0;
    while (cap < need) cap *= 2;
    q = (char *)realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (!n) return 0; /* (an empty string into a buffer not yet allocated: no memcpy on NULL) */
    if (b->len + n > b->cap && buf_grow(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }
static inline int buf_f64(Buf *b, double v) { return buf_put(b, &v, 8); }
static inline int buf_u8(Buf *b, uint8_t v) { return buf_put(b, &v, 1); }

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

static int skip_value(P *q, Tok *t);

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

/* ---------------------------------------------------------------- value conversion */
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* float64 of a number token, as orjson + float() give it; -1: give up. */
static int num_double(const Tok *t, double *out) {
    const uint8_t *p = t->s, *end = t->s + t->n;
    uint64_t m = 0;
    int neg = 0, sig = 0, frac = 0;
    long ex = 0, e10;
    int exneg = 0;
    if (*p == '-') neg = 1, p++;
    while (p < end && *p >= '0' && *p <= '9') {
        if (m || *p != '0') {
            if (sig < 19) m = m * 10 + (uint64_t)(*p - '0');
            sig++;
        }
        p++;
    }
    if (p < end && *p == '.') {
        p++;
        while (p < end && *p >= '0' && *p <= '9') {
            if (m || *p != '0') {
                if (sig < 19) m = m * 10 + (uint64_t)(*p - '0');
                sig++;
            }
            if (sig <= 19) frac++; /* a digit not taken into m is not counted as a fraction digit */
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-') exneg = *p++ == '-';
        while (p < end) ex = ex * 10 + (*p++ - '0'); /* bounded by scan_number */
    }
    if (m == 0 && sig == 0) {
        /* an int token is a Python int first: -0 -> 0 -> +0.0; a float keeps its sign */
        *out = (neg && !t->is_int) ? -0.0 : 0.0;
        return 0;
    }
    e10 = (exneg ? -ex : ex) - frac;
    if (sig <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        *out = neg ? -d : d;
        return 0;
    }
    {
        char tmp[400];
        char *stop;
        double d;
        if (t->n >= sizeof tmp) return -1;
        memcpy(tmp, t->s, t->n);
        tmp[t->n] = 0;
        d = strtod(tmp, &stop);
        if (stop != tmp + t->n || !isfinite(d)) return -1;
        *out = d;
        return 0;
    }
}

/* int64 of an int token of at most 18 digits (the ids, bytes, pid / tid); -1: give up. */
static int num_int(const Tok *t, int64_t *out) {
    const uint8_t *p = t->s, *end = t->s + t->n;
    int neg = 0;
    int64_t v = 0;
    if (t->type != T_NUM || !t->is_int || t->digits > 18) return -1;
    if (*p == '-') neg = 1, p++;
    while (p < end) v = v * 10 + (*p++ - '0');
    *out = neg ? -v : v;
    return 0;
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

/* ---------------------------------------------------------------- columns */
enum { C_IDS, C_CAT_OFF, C_CAT, C_CAT_OK, C_NAME_OFF, C_NAME, C_NAME_OK, C_PID, C_PID_OK, C_TID, C_TID_OK,
       C_TS, C_TS_OK, C_DUR, C_DUR_OK, C_CORR, C_CORR_OK, C_EXT, C_EXT_OK, C_BYTES, C_BYTES_OK, C_CAND,
       C_SCRATCH, N_BUFS };

typedef struct {
    Buf b[N_BUFS];
    int64_t n;  /* events of the slice */
    int64_t nx; /* X events */
    const uint8_t *const *prefixes;
    const Py_ssize_t *prefix_lens;
    Py_ssize_t n_prefixes;
} Out;

/* top-level keys read (bit per key); a duplicate of one of them gives up */
enum { K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ARGS, K_CORR, K_EXT, K_BYTES, K_COLL };

typedef struct {
    Tok k[12];
    unsigned seen;
} Ev;

static int top_key(const Tok *t) {
    const uint8_t *s = t->s;
    switch (t->n) {
    case 2:
        if (s[0] == 'p' && s[1] == 'h') return K_PH;
        if (s[0] == 't' && s[1] == 's') return K_TS;
        return -1;
    case 3:
        if (!memcmp(s, "cat", 3)) return K_CAT;
        if (!memcmp(s, "pid", 3)) return K_PID;
        if (!memcmp(s, "tid", 3)) return K_TID;
        if (!memcmp(s, "dur", 3)) return K_DUR;
        return -1;
    case 4:
        if (!memcmp(s, "name", 4)) return K_NAME;
        if (!memcmp(s, "args", 4)) return K_ARGS;
        return -1;
    default:
        return -1;
    }
}

static int args_key(const Tok *t) {
    switch (t->n) {
    case 5:
        return memcmp(t->s, "bytes", 5) ? -1 : K_BYTES;
    case 11:
        if (!memcmp(t->s, "correlation", 11)) return K_CORR;
        if (!memcmp(t->s, "External id", 11)) return K_EXT;
        return -1;
    case 15:
        return memcmp(t->s, "Collective name", 15) ? -1 : K_COLL;
    default:
        return -1;
    }
}

/* The members of an object at q->p ('{'); level 0: an event, 1: its args. */
static int scan_members(P *q, Ev *ev, int level) {
    Tok key, val;
    q->p++;
    skip_ws(q);
    if (q->p < q->end && *q->p == '}') {
        q->p++;
        return 0;
    }
    for (;;) {
        int k;
        if (q->p >= q->end || *q->p != '"') BAIL(q, "object key expected");
        if (scan_string(q, &key)) return -1;
        if (key.esc) BAIL(q, "escaped key"); /* it could spell one of the keys read */
        k = level ? args_key(&key) : top_key(&key);
        skip_ws(q);
        if (q->p >= q->end || *q->p != ':') BAIL(q, "':' expected");
        q->p++;
        skip_ws(q);
        if (k >= 0) {
            if (ev->seen & (1u << k)) BAIL(q, "duplicate key"); /* orjson keeps the last one */
            ev->seen |= 1u << k;
            if (k == K_ARGS && q->p < q->end && *q->p == '{') {
                ev->k[K_ARGS].type = T_OBJ;
                if (scan_members(q, ev, 1)) return -1;
            } else if (skip_value(q, &ev->k[k]))
                return -1;
        } else if (skip_value(q, &val))
            return -1;
        skip_ws(q);
        if (q->p >= q->end) BAIL(q, "unterminated object");
        if (*q->p == ',') {
            q->p++;
            skip_ws(q);
            continue;
        }
        if (*q->p == '}') {
            q->p++;
            return 0;
        }
        BAIL(q, "',' expected");
    }
}

static inline int tok_is(const Tok *t, const char *s, size_t n) {
    return t->type == T_STR && !t->esc && t->n == n && !memcmp(t->s, s, n);
}

/* A text column (cat / name): null, or the decoded string; anything else gives up (numbers would
 * be printed by polars, see parsers/input_guard.py::text_series). */
static int put_text(P *q, Out *o, const Tok *t, int data, int off, int ok) {
    if (t->type == T_MISSING || t->type == T_NULL) {
        if (buf_u8(&o->b[ok], 0)) BAIL(q, "out of memory");
    } else if (t->type == T_STR) {
        if (unescape(t, &o->b[data]) || buf_u8(&o->b[ok], 1)) BAIL(q, "out of memory");
    } else
        BAIL(q, "cat or name is no string");
    if (buf_i64(&o->b[off], (int64_t)o->b[data].len)) BAIL(q, "out of memory");
    return 0;
}

/* pid / tid as parsers/kineto.py::_track_ids reads them: ints as they are, label strings their
 * trailing number (polars' r"(\d+)\s*$", here on ASCII text without control characters only). */
static int put_track(P *q, Out *o, const Tok *t, int col, int ok) {
    int64_t v = 0;
    int valid = 0;
    if (t->type == T_NUM) {
        if (num_int(t, &v)) BAIL(q, "pid or tid is no int of <= 18 digits");
        valid = 1;
    } else if (t->type == T_STR) {
        Buf *s = &o->b[C_SCRATCH];
        size_t i, j;
        s->len = 0;
        if (unescape(t, s)) BAIL(q, "out of memory");
        for (i = 0; i < s->len; i++) {
            uint8_t c = (uint8_t)s->p[i];
            if (c < 0x20 || c >= 0x7F) BAIL(q, "pid or tid label with unusual characters");
        }
        j = s->len;
        while (j && s->p[j - 1] == ' ') j--;
        i = j;
        while (i && s->p[i - 1] >= '0' && s->p[i - 1] <= '9') i--;
        if (j - i > 18) BAIL(q, "pid or tid label number of > 18 digits");
        if (j > i) {
            valid = 1;
            for (; i < j; i++) v = v * 10 + (s->p[i] - '0');
        }
    } else if (t->type != T_MISSING && t->type != T_NULL)
        BAIL(q, "pid or tid is a bool or a container");
    if (buf_i64(&o->b[col], v) || buf_u8(&o->b[ok], (uint8_t)valid)) BAIL(q, "out of memory");
    return 0;
}

static int put_time(P *q, Out *o, const Tok *t, int col, int ok) {
    double d = 0.0;
    int valid = 0;
    if (t->type == T_NUM) {
        if ((t->is_int && t->digits > 18) || num_double(t, &d)) BAIL(q, "unusual ts or dur number");
        valid = 1;
    } else if (t->type != T_MISSING && t->type != T_NULL)
        BAIL(q, "ts or dur is no number"); /* the reference path names the event */
    if (buf_f64(&o->b[col], d) || buf_u8(&o->b[ok], (uint8_t)valid)) BAIL(q, "out of memory");
    return 0;
}

static int put_id(P *q, Out *o, const Tok *t, int col, int ok) {
    int64_t v = 0;
    int valid = 0;
    if (t->type == T_NUM) {
        if (num_int(t, &v)) BAIL(q, "id or bytes is no int of <= 18 digits");
        valid = 1;
    } else if (t->type != T_MISSING && t->type != T_NULL)
        BAIL(q, "id or bytes is no number");
    if (buf_i64(&o->b[col], v) || buf_u8(&o->b[ok], (uint8_t)valid)) BAIL(q, "out of memory");
    return 0;
}

/* One X event's row. */
static int put_row(P *q, Out *o, Ev *ev, int64_t piece, int64_t start, int64_t stop) {
    static const Tok none = {T_MISSING, NULL, 0, 0, 1, 0, 0};
    const Tok *cat = &ev->k[K_CAT], *name = &ev->k[K_NAME];
    int args = ev->k[K_ARGS].type, mem, mark = 0, kern;
    if (args != T_MISSING && args != T_NULL && args != T_OBJ) BAIL(q, "args is no object");
    if (buf_i64(&o->b[C_IDS], o->n)) BAIL(q, "out of memory");
    if (put_text(q, o, cat, C_CAT, C_CAT_OFF, C_CAT_OK) || put_text(q, o, name, C_NAME, C_NAME_OFF, C_NAME_OK) ||
        put_track(q, o, &ev->k[K_PID], C_PID, C_PID_OK) || put_track(q, o, &ev->k[K_TID], C_TID, C_TID_OK) ||
        put_time(q, o, &ev->k[K_TS], C_TS, C_TS_OK) || put_time(q, o, &ev->k[K_DUR], C_DUR, C_DUR_OK) ||
        put_id(q, o, &ev->k[K_CORR], C_CORR, C_CORR_OK) || put_id(q, o, &ev->k[K_EXT], C_EXT, C_EXT_OK))
        return -1;
    /* bytes only on memcpy / memset rows, as _chunk_frame reads it; escaped cat text is decoded */
    if (cat->type == T_STR && cat->esc) {
        Buf *s = &o->b[C_SCRATCH];
        s->len = 0;
        if (unescape(cat, s)) BAIL(q, "out of memory");
        mem = (s->len == 10 && (!memcmp(s->p, "gpu_memcpy", 10) || !memcmp(s->p, "gpu_memset", 10)));
        kern = s->len == 6 && !memcmp(s->p, "kernel", 6);
    } else {
        mem = tok_is(cat, "gpu_memcpy", 10) || tok_is(cat, "gpu_memset", 10);
        kern = tok_is(cat, "kernel", 6);
    }
    if (put_id(q, o, mem ? &ev->k[K_BYTES] : &none, C_BYTES, C_BYTES_OK)) return -1;
    if (name->type == T_STR) { /* the name as stored: the last text of the name column */
        const Buf *nb = &o->b[C_NAME];
        int64_t end = (int64_t)nb->len, begin = ((int64_t *)o->b[C_NAME_OFF].p)[o->nx];
        Py_ssize_t i;
        for (i = 0; i < o->n_prefixes && !mark; i++)
            mark = end - begin >= o->prefix_lens[i] && !memcmp(nb->p + begin, o->prefixes[i], (size_t)o->prefix_lens[i]);
    }
    kern = kern && args == T_OBJ && (ev->seen & (1u << K_COLL));
    if (mark || kern) {
        int64_t c[5] = {o->nx, piece, start, stop, mark};
        if (buf_put(&o->b[C_CAND], c, sizeof c)) BAIL(q, "out of memory");
    }
    o->nx++;
    return 0;
}

static int scan_piece(P *q, Out *o, int64_t piece) {
    const uint8_t *base = q->p;
    skip_ws(q);
    if (q->p >= q->end || *q->p != '[') BAIL(q, "piece is no array");
    q->p++;
    skip_ws(q);
    if (q->p < q->end && *q->p == ']') {
        q->p++;
    } else {
        for (;;) {
            Ev ev;
            const uint8_t *start = q->p;
            if (q->p >= q->end || *q->p != '{') BAIL(q, "event is no object");
            memset(&ev, 0, sizeof ev);
            if (scan_members(q, &ev, 0)) return -1;
            if (tok_is(&ev.k[K_PH], "X", 1)) {
                if (put_row(q, o, &ev, piece, start - base, q->p - base)) return -1;
            } else if (ev.k[K_PH].type == T_STR && ev.k[K_PH].esc)
                BAIL(q, "escaped ph");
            o->n++;
            skip_ws(q);
            if (q->p >= q->end) BAIL(q, "unterminated array");
            if (*q->p == ',') {
                q->p++;
                skip_ws(q);
                continue;
            }
            if (*q->p == ']') {
                q->p++;
                break;
            }
            BAIL(q, "',' expected");
        }
    }
    skip_ws(q);
    if (q->p != q->end) BAIL(q, "text after the piece's array");
    return 0;
}

/* ---------------------------------------------------------------- Python glue */
static PyObject *bytes_of(const Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len); }

/* Arrow validity bitmap (LSB first) of a byte-per-row column; None when every row is valid. */
static PyObject *bitmap_of(const Buf *b) {
    size_t n = b->len, i;
    const uint8_t *v = (const uint8_t *)b->p;
    PyObject *out;
    uint8_t *m;
    for (i = 0; i < n && v[i]; i++)
        ;
    if (i == n) Py_RETURN_NONE;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 7) / 8));
    if (!out) return NULL;
    m = (uint8_t *)PyBytes_AS_STRING(out);
    memset(m, 0, (n + 7) / 8);
    for (i = 0; i < n; i++) m[i >> 3] |= (uint8_t)(v[i] << (i & 7));
    return out;
}

static PyObject *kscan_scan(PyObject *self, PyObject *args) {
    PyObject *pieces_arg, *prefixes_arg, *pieces = NULL, *prefixes = NULL, *res = NULL;
    const uint8_t **pfx = NULL;
    Py_ssize_t *pfx_len = NULL, np, npf, i;
    Out o;
    P q;
    int failed = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO:scan", &pieces_arg, &prefixes_arg)) return NULL;
    memset(&o, 0, sizeof o);
    memset(&q, 0, sizeof q);
    pieces = PySequence_Tuple(pieces_arg); /* held for the scan: the GIL is released during it */
    prefixes = pieces ? PySequence_Tuple(prefixes_arg) : NULL;
    if (!prefixes) goto done;
    np = PyTuple_GET_SIZE(pieces);
    npf = PyTuple_GET_SIZE(prefixes);
    for (i = 0; i < np; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(pieces, i))) {
            PyErr_SetString(PyExc_TypeError, "pieces must be bytes");
            goto done;
        }
    pfx = (const uint8_t **)PyMem_Malloc(sizeof *pfx * (size_t)(npf + 1));
    pfx_len = (Py_ssize_t *)PyMem_Malloc(sizeof *pfx_len * (size_t)(npf + 1));
    if (!pfx || !pfx_len) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < npf; i++) {
        PyObject *s = PyTuple_GET_ITEM(prefixes, i);
        if (!PyBytes_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "keep_prefixes must be bytes");
            goto done;
        }
        pfx[i] = (const uint8_t *)PyBytes_AS_STRING(s);
        pfx_len[i] = PyBytes_GET_SIZE(s);
    }
    o.prefixes = pfx;
    o.prefix_lens = pfx_len;
    o.n_prefixes = npf;
    Py_BEGIN_ALLOW_THREADS;
    if (buf_i64(&o.b[C_CAT_OFF], 0) || buf_i64(&o.b[C_NAME_OFF], 0)) {
        q.why = "out of memory";
        failed = 1;
    }
    for (i = 0; i < np && !failed; i++) {
        PyObject *b = PyTuple_GET_ITEM(pieces, i);
        q.p = (const uint8_t *)PyBytes_AS_STRING(b);
        q.end = q.p + PyBytes_GET_SIZE(b);
        q.depth = 0;
        failed = scan_piece(&q, &o, (int64_t)i) != 0;
    }
    Py_END_ALLOW_THREADS;
    if (failed) {
        res = PyUnicode_FromString(q.why ? q.why : "scan failed");
        goto done;
    }
    res = Py_BuildValue("(LLNNNNNNNNNNNNNNNNNNNNN)", (long long)o.n, (long long)o.nx, bytes_of(&o.b[C_IDS]),
                        bytes_of(&o.b[C_CAT_OFF]), bytes_of(&o.b[C_CAT]), bitmap_of(&o.b[C_CAT_OK]),
                        bytes_of(&o.b[C_NAME_OFF]), bytes_of(&o.b[C_NAME]), bitmap_of(&o.b[C_NAME_OK]),
                        bytes_of(&o.b[C_PID]), bitmap_of(&o.b[C_PID_OK]), bytes_of(&o.b[C_TID]),
                        bitmap_of(&o.b[C_TID_OK]), bytes_of(&o.b[C_TS]), bitmap_of(&o.b[C_TS_OK]),
                        bytes_of(&o.b[C_DUR]), bitmap_of(&o.b[C_DUR_OK]), bytes_of(&o.b[C_CORR]),
                        bitmap_of(&o.b[C_CORR_OK]), bytes_of(&o.b[C_EXT]), bitmap_of(&o.b[C_EXT_OK]),
                        bytes_of(&o.b[C_BYTES]), bitmap_of(&o.b[C_BYTES_OK]));
    if (res) { /* the candidates separately: Py_BuildValue takes at most so many N's readably */
        PyObject *cand = bytes_of(&o.b[C_CAND]);
        PyObject *both = cand ? PyTuple_Pack(2, res, cand) : NULL;
        Py_XDECREF(cand);
        Py_DECREF(res);
        res = both;
    }
done:
    for (i = 0; i < N_BUFS; i++) free(o.b[i].p);
    PyMem_Free(pfx);
    PyMem_Free(pfx_len);
    Py_XDECREF(pieces);
    Py_XDECREF(prefixes);
    return res;
}

static PyMethodDef kscan_methods[] = {
    {"scan", kscan_scan, METH_VARARGS,
     "scan(pieces, keep_prefixes) -> ((n, nx, columns...), candidates) | str\n\n"
     "Columns of the X events of one traceEvents slice, or why the slice is left to the reference path."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kscan_module = {PyModuleDef_HEAD_INIT, "_kscan",
                                          "Strict native scanner of Kineto traceEvents slices.", -1, kscan_methods};

PyMODINIT_FUNC PyInit__kscan(void) {
    int c;
    for (c = 0; c < 256; c++) STOP[c] = (uint8_t)(c == '"' || c == '\\' || c < 0x20 || c >= 0x80);
    return PyModule_Create(&kscan_module);
}

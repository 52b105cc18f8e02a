/* _kscan_record.c: the event-record scanner of the native scanner (parsers/_kscan.c).
 *
 * Walks the events of one piece, reads the keys parsers/kineto.py::_chunk_frame reads (a top-level
 * or args key matched on its raw bytes, a duplicate of one gives up, as orjson keeps the last) and
 * appends each X event's row to the columns of _kscan_record.h, converting every field exactly as
 * the reference path does or giving up. Runs without the GIL (no Python API calls).
 *
 * Compiled inside _kscan.c's translation unit (see there why), after Python.h.
 */
#ifndef KSCAN_ONE_UNIT
#error "_kscan_record.c is compiled as part of _kscan.c (one translation unit; see there), not on its own"
#endif
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_kscan_buf.h"
#include "_kscan_json.h"
#include "_kscan_num.h"
#include "_kscan_record.h"

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
        mem = (s->len == 10 && (!memcmp(s->p, "gpu_memcpy", 10) || !memcmp(s->p, "gpu_memset", 10))) ||
              (s->len == 6 && (!memcmp(s->p, "Memcpy", 6) || !memcmp(s->p, "Memset", 6)));
        kern = s->len == 6 && !memcmp(s->p, "kernel", 6);
    } else {
        /* kineto_batch.MEMORY_CATEGORIES: the 2021 spellings Memcpy / Memset too */
        mem = tok_is(cat, "gpu_memcpy", 10) || tok_is(cat, "gpu_memset", 10) || tok_is(cat, "Memcpy", 6) ||
              tok_is(cat, "Memset", 6);
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

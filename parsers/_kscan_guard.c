/* _kscan_guard.c: the structural guard of a JSON text (ep_trace.parsers.json_guard), in C.
 *
 * One linear pass over the bytes, fed in pieces (state carried between calls), before any decoder
 * sees them: the nesting depth (a value 1,000 lists deep aborts polars' Series builder, issue 40),
 * the end of the first top-level value (NUL padding or a second document after it is refused in
 * one pass; the end search of kineto_json tried each ']' from the end, quadratic on such a tail)
 * and the objects opened at event level (depth 3 under a top-level object: the entries of
 * traceEvents; depth 2 in a bare-array trace), which a gzip bomb of tiny events inflates without
 * bound.
 *
 * The rules are those of json_guard.guard_numpy, byte for byte (tests compare both):
 *   - after the first value ended, any byte but JSON blank (space, \t, \n, \r) is trailing data;
 *   - a backslash escapes the next byte, inside or outside a string (outside it is invalid JSON
 *     anyway, refused later by the decoders; the rule only keeps both implementations equal);
 *   - an unescaped '"' toggles "inside a string"; brackets inside strings do not count;
 *   - an opener raises the depth; a closer lowers it unless it is 0 (a stray closer: the decoders
 *     refuse it); the first value ends at the closer that brings the depth from 1 to 0.
 *
 * Compiled inside _kscan.c's translation unit (see there), after Python.h. No Python API here.
 */
#ifndef KSCAN_ONE_UNIT
#error "_kscan_guard.c is compiled as part of _kscan.c (one translation unit; see there), not on its own"
#endif
#include <stdint.h>
#include <string.h>

enum { G_OK = 0, G_DEEP = 1, G_TRAILING = 2, G_EVENTS = 3 };

typedef struct {
    int64_t pos;    /* bytes fed before this piece */
    int64_t depth;  /* open containers */
    int64_t end;    /* offset just after the first value, -1 while it is open */
    int64_t events; /* '{' opened at the event depth */
    int in_str, esc;
    int ev_depth; /* the events' depth: 3 under a top-level object (traceEvents), 2 in a bare array; 0 before */
} Guard;

/* byte classes outside strings; 0 = nothing to do */
enum { C_NONE = 0, C_QUOTE, C_BSL, C_OPEN_ARR, C_OPEN_OBJ, C_CLOSE };
static uint8_t GCLASS[256];
/* bytes that end a run inside a string */
static uint8_t GSTOP[256];

static void guard_init_tables(void) {
    GCLASS['"'] = C_QUOTE;
    GCLASS['\\'] = C_BSL;
    GCLASS['['] = C_OPEN_ARR;
    GCLASS['{'] = C_OPEN_OBJ;
    GCLASS[']'] = C_CLOSE;
    GCLASS['}'] = C_CLOSE;
    GSTOP['"'] = 1;
    GSTOP['\\'] = 1;
}

/* Scan s[0..n): update g; on a finding return its code and set *at to its offset in the text.
 * Two loops, outside and inside a string, with the state in locals (a flag test per byte cost
 * a third of the speed). */
static int guard_scan(Guard *g, const uint8_t *s, size_t n, int64_t max_depth, int64_t max_events, int64_t *at) {
    const uint8_t *p = s, *e = s + n;
    int64_t depth = g->depth, events = g->events;
    int code = G_OK, ev_depth = g->ev_depth;
    if (g->end >= 0) goto after_end;
    if (g->esc) {
        if (p == e) return G_OK;
        g->esc = 0;
        p++;
    }
    if (g->in_str) goto in_string;
outside:
    for (;;) {
        uint8_t c;
        while (p < e && !GCLASS[*p]) p++; /* numbers, blanks, ':' and ',' */
        if (p == e) {
            g->in_str = 0;
            goto done;
        }
        c = *p;
        switch (GCLASS[c]) {
        case C_QUOTE:
            p++;
            goto in_string;
        case C_BSL:
            if (++p == e) {
                g->esc = 1;
                g->in_str = 0;
                goto done;
            }
            p++;
            break;
        case C_CLOSE:
            p++;
            if (depth > 0 && --depth == 0) {
                g->end = g->pos + (int64_t)(p - s);
                goto after_end;
            }
            break;
        default: /* an opener */
            if (++depth > max_depth) {
                code = G_DEEP;
                goto found;
            }
            if (depth == 1) ev_depth = c == '{' ? 3 : 2;
            if (c == '{' && depth == ev_depth && ++events > max_events) {
                code = G_EVENTS;
                goto found;
            }
            p++;
            break;
        }
    }
in_string:
    for (;;) {
        while (e - p >= 8) { /* 8 bytes at a time while none is a '"' or a '\\' (as scan_string) */
            uint64_t v, a, b;
            memcpy(&v, p, 8);
            a = v ^ 0x2222222222222222ULL;
            b = v ^ 0x5C5C5C5C5C5C5C5CULL;
            if ((((a - ONES) & ~a) | ((b - ONES) & ~b)) & HIGHS) break;
            p += 8;
        }
        while (p < e && !GSTOP[*p]) p++;
        if (p == e) {
            g->in_str = 1;
            goto done;
        }
        if (*p++ == '"') goto outside;
        if (p == e) { /* a backslash ends the piece: the next piece starts escaped */
            g->in_str = 1;
            g->esc = 1;
            goto done;
        }
        p++;
    }
after_end:
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    if (p < e) {
        code = G_TRAILING;
        goto found;
    }
done:
    g->depth = depth;
    g->events = events;
    g->ev_depth = ev_depth;
    g->pos += (int64_t)n;
    return G_OK;
found:
    g->depth = depth;
    g->events = events;
    g->ev_depth = ev_depth;
    *at = g->pos + (int64_t)(p - s);
    return code;
}

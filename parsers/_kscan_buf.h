/* _kscan_buf.h: the growable byte buffers the native scanner (parsers/_kscan.c) writes its
 * columns into (one Buf per column; see _kscan_record.h).
 *
 * Header-only: buf_put / buf_i64 run once or more per field of every event and are inlined.
 */
#ifndef EP_TRACE_KSCAN_BUF_H
#define EP_TRACE_KSCAN_BUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

#endif /* EP_TRACE_KSCAN_BUF_H */

/* _kscan_record.h: the event-record scanner of ep_trace.parsers._kscan (_kscan_record.c): the
 * output columns it fills, one Buf each, and scan_piece(). Private to the extension.
 *
 * Includers include Python.h first (Py_ssize_t; Python's headers must precede system headers).
 */
#ifndef EP_TRACE_KSCAN_RECORD_H
#define EP_TRACE_KSCAN_RECORD_H

#include <Python.h>
#include <stdint.h>

#include "_kscan_buf.h"
#include "_kscan_json.h"

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

/* One piece ("[" + whole events + "]") at q->p .. q->end: its X events' rows appended to o
 * (the offsets columns C_CAT_OFF / C_NAME_OFF already hold their leading 0); -1 and q->why set
 * when it gives up. piece: its index in the slice, for the candidates' rows. */
static int scan_piece(P *q, Out *o, int64_t piece);

#endif /* EP_TRACE_KSCAN_RECORD_H */

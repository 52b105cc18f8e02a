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
 * The scan runs without the GIL (two worker threads of kineto_columnar use it at once).
 *
 * This file is the Python module glue: argument checks, the GIL release around the scan, the
 * columns handed back as bytes / Arrow validity bitmaps. The scanner itself, one concept a file:
 *   _kscan_buf.h                       growable column buffers (header-only, inlined)
 *   _kscan_json.h / _kscan_json.c      the strict JSON lexer: grammar, strings, escapes, UTF-8
 *   _kscan_num.h / _kscan_num.c        numbers to float64 / int64 (Clinger fast path, strtod fallback)
 *   _kscan_record.h / _kscan_record.c  events: keys read, rows of the X events, the give-ups
 *   _kscan_guard.c                     the structural guard of a whole text (json_guard.py): depth,
 *                                      the end of the document, objects at event level
 *
 * One translation unit: this file includes the three .c parts below (setup.py compiles it alone;
 * the parts are its depends=). Compiled apart, scan_members (_kscan_record.c) loses GCC's
 * interprocedural facts about scan_string / skip_value (_kscan_json.c), which it calls for every
 * key and value (registers they leave alone, fields they never write: q->end is reloaded after
 * each call): +0.2 % instructions but 6-7 % less scan throughput measured (gcc 12 -O2, AMD EPYC,
 * 155 MB of Kineto slices: 0.157 s single file, 0.168 s four units, 0.156 s this one unit). Every
 * function stays static: the module exports PyInit__kscan only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KSCAN_ONE_UNIT
#include "_kscan_json.c"
#include "_kscan_num.c"
#include "_kscan_record.c"
#include "_kscan_guard.c"

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

/* guard(text, state, max_depth, max_events) -> (state, code, offset): see _kscan_guard.c. */
static PyObject *kscan_guard(PyObject *self, PyObject *args) {
    Py_buffer view;
    Guard g;
    long long max_depth, max_events, at = -1, pos, depth, end, events;
    int code;
    (void)self;
    memset(&g, 0, sizeof g);
    if (!PyArg_ParseTuple(args, "y*(LLLLiii)LL:guard", &view, &pos, &depth, &end, &events, &g.in_str, &g.esc,
                          &g.ev_depth, &max_depth, &max_events))
        return NULL;
    g.pos = pos;
    g.depth = depth;
    g.end = end;
    g.events = events;
    {
        int64_t at64 = -1;
        Py_BEGIN_ALLOW_THREADS;
        code = guard_scan(&g, (const uint8_t *)view.buf, (size_t)view.len, max_depth, max_events, &at64);
        Py_END_ALLOW_THREADS;
        at = at64;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(LLLLiii)iL", (long long)g.pos, (long long)g.depth, (long long)g.end, (long long)g.events,
                         g.in_str, g.esc, g.ev_depth, code, at);
}

static PyMethodDef kscan_methods[] = {
    {"scan", kscan_scan, METH_VARARGS,
     "scan(pieces, keep_prefixes) -> ((n, nx, columns...), candidates) | str\n\n"
     "Columns of the X events of one traceEvents slice, or why the slice is left to the reference path."},
    {"guard", kscan_guard, METH_VARARGS,
     "guard(text, state, max_depth, max_events) -> (state, code, offset)\n\n"
     "One piece of a JSON text through the structural guard (depth, end of the document, events)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kscan_module = {PyModuleDef_HEAD_INIT, "_kscan",
                                          "Strict native scanner of Kineto traceEvents slices.", -1, kscan_methods};

PyMODINIT_FUNC PyInit__kscan(void) {
    json_init_tables();
    guard_init_tables();
    return PyModule_Create(&kscan_module);
}

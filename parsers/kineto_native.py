"""The native decode of one ``traceEvents`` slice: the C scanner ``ep_trace.parsers._kscan``.

The scanner (``parsers/_kscan.c``: the module glue, which includes the JSON lexer, the number
conversion and the event-record scanner from ``parsers/_kscan_{json,num,record}.c``) reads a slice's
JSON pieces once, validating every byte as JSON, and returns the columns of its X events as raw
buffers (int64 / float64 values, Arrow validity bitmaps, UTF-8 data with int64 offsets), wrapped
here as Arrow arrays and one polars frame with no copy per event. It is strict instead of clever:
any input it does not read exactly as :func:`ep_trace.parsers.kineto._chunk_frame` reads the orjson
objects (a duplicate or escaped key, a boolean / string time, a float / quoted / > 18-digit id, a
bool or float pid, a label pid with non-ASCII text, args that are no object, invalid JSON or UTF-8,
a lone surrogate ...) makes it return the reason instead, and
:mod:`ep_trace.parsers.kineto_columnar` decodes that slice on its other paths (same result or the
same one-line error). Kept args (collective markers by name, kernels with a ``Collective name`` key,
even a null one) are decoded by one orjson call from the offsets the scanner gives, as on the polars
path.

``EP_TRACE_NATIVE=0`` in the environment turns it off (tests of both paths, debugging); without
a C compiler at install time the extension is absent and the other paths run.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import numpy as np
import orjson
import polars as pl
import pyarrow as pa

from ep_trace.parsers import kineto_stream

try:
    from ep_trace.parsers import _kscan
except ImportError:  # pragma: no cover - built by setup.py; optional (no compiler: Python paths)
    _kscan = None  # type: ignore[assignment]

__all__ = ["available", "enabled", "slice_frame"]

log = logging.getLogger(__name__)

_NAMES = ("event_id", "category", "name", "pid_raw", "tid_raw", "ts", "dur", "correlation", "external_id", "bytes")
_INT, _FLOAT, _TEXT = pa.int64(), pa.float64(), pa.large_utf8()


def available() -> bool:
    """Whether the extension was built and imports."""
    return _kscan is not None


def enabled() -> bool:
    """Whether slices are decoded natively: the extension imports and ``EP_TRACE_NATIVE`` is not ``0``
    (read at each call: tests and users switch it without a re-import)."""
    on = _kscan is not None and os.environ.get("EP_TRACE_NATIVE", "1") != "0"
    _note(on)
    return on


@functools.cache
def _note(on: bool) -> None:
    """Log, once per process and state, which decoder reads the slices."""
    if on:
        log.debug("Kineto slices: native scanner (ep_trace.parsers._kscan)")
    else:
        why = "EP_TRACE_NATIVE=0" if _kscan is not None else "extension not built"
        log.debug("Kineto slices: polars reader (%s)", why)


@functools.lru_cache(maxsize=8)
def _prefixes(keep_prefixes: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(p.encode() for p in keep_prefixes)


def _valid(bitmap: bytes | None) -> pa.Buffer | None:
    return None if bitmap is None else pa.py_buffer(bitmap)


def _column(kind: pa.DataType, nx: int, *bufs: bytes | None) -> pa.Array:
    """An Arrow array over the scanner's buffers (validity first, as Arrow orders them)."""
    valid, *data = bufs
    return pa.Array.from_buffers(kind, nx, [_valid(valid), *(pa.py_buffer(b) for b in data)])


def slice_frame(
    sl: kineto_stream.Slice, keep_prefixes: tuple[str, ...]
) -> tuple[pl.DataFrame, int, list[tuple[int, dict[str, Any]]]] | None:
    """Columns of the X events of one slice, its event count and the kept args (slice-local event
    ids), as :func:`ep_trace.parsers.kineto_columnar._slice_frame` returns them; None when the
    scanner gave up on the slice (the reason is logged at debug level).

    Raises:
        kineto_stream.Fallback: a kept event's text is not decodable by orjson (never seen: the
            scanner validated it).
    """
    assert _kscan is not None
    got = _kscan.scan(sl.pieces, _prefixes(keep_prefixes))
    if isinstance(got, str):
        log.debug("native scanner left a slice to the other paths: %s", got)
        return None
    cols, cand = got
    n, nx, ids, cat_off, cat, cat_ok, name_off, name, name_ok, *nums = cols
    arrays = [
        _column(_INT, nx, None, ids),
        _column(_TEXT, nx, cat_ok, cat_off, cat),
        _column(_TEXT, nx, name_ok, name_off, name),
    ]
    # pid, tid, ts, dur, correlation, external_id, bytes: (values, validity) pairs
    kinds = (_INT, _INT, _FLOAT, _FLOAT, _INT, _INT, _INT)
    arrays += [_column(k, nx, nums[2 * j + 1], nums[2 * j]) for j, k in enumerate(kinds)]
    frame = pl.from_arrow(pa.RecordBatch.from_arrays(arrays, names=_NAMES))
    assert isinstance(frame, pl.DataFrame)
    kept: list[tuple[int, dict[str, Any]]] = []
    if cand:
        # rows of (x row, piece, start, end, is_mark): the candidates' own text, decoded at once
        c = np.frombuffer(cand, dtype=np.int64).reshape(-1, 5)
        rows = c[:, 0].tolist()
        texts = [sl.pieces[p][a:b] for p, a, b in c[:, 1:4].tolist()]
        try:
            evs = orjson.loads(b"[" + b",".join(texts) + b"]")
        except orjson.JSONDecodeError:
            raise kineto_stream.Fallback("kept event not decodable by orjson") from None
        names = frame.get_column("name").gather(rows).to_list()
        if len(evs) != len(rows) or [e.get("name") for e in evs] != names:
            return None  # (cannot happen: the offsets are the scanner's own)
        ids_l = np.frombuffer(ids, dtype=np.int64)[c[:, 0]].tolist()
        is_mark = c[:, 4].tolist()
        arg = [e.get("args") for e in evs]
        # same order and tests as _chunk_frame: name marks first, then kernels with a metadata copy
        kept = [(i, a) for i, a, m in zip(ids_l, arg, is_mark, strict=True) if m and a]
        kept += [(i, a) for i, a, m in zip(ids_l, arg, is_mark, strict=True) if not m and a and "Collective name" in a]
    return frame, n, kept

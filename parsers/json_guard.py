"""The structural guard of a JSON input: nesting depth, what follows the document, events per byte.

Every JSON reader runs its text through here before a decoder sees it (part of the validation
layer, :mod:`ep_trace.parsers.validate`): the Kineto paths (:mod:`ep_trace.parsers.kineto_stream`
feeds each decompressed piece, :func:`ep_trace.parsers.kineto_json.read_bytes` the whole buffer),
the sidecar (:mod:`ep_trace.parsers.sidecar`, line by line: :func:`check_json_line`) and the
CUPTI footer. One linear pass
finds three things no decoder bounds (issue 40):

* **depth**: a value nested deeper than :data:`MAX_JSON_DEPTH` levels (the top-level object is
  level 1; a Kineto event sits at level 3, its deepest ``Input Dims`` at 6). A timestamp nested
  1,000 lists deep decoded fine in orjson, then aborted the process in polars' Series builder;
  Python's ``json`` stops near 1,000 with a RecursionError. ``EP_TRACE_MAX_JSON_DEPTH`` raises the
  cap up to :data:`HARD_MAX_JSON_DEPTH` (the native scanner's own limit);
* **trailing data**: anything but blanks after the first top-level value: NUL padding (an
  interrupted write, a block copy), a second document (two traces concatenated), other bytes. The
  end search of :mod:`ep_trace.parsers.kineto_json` tried each ``]`` from the end of such a file,
  copying the tail every time (a 110 KB ``.json.gz`` padded with NULs took 140 s); it is refused here
  as soon as its first byte is seen;
* **events**: objects opened at the events' depth (3 under a top-level object: the entries of
  ``traceEvents``, and the few of ``deviceProperties``; 2 in a bare-array Chrome trace) beyond
  :func:`event_limit`: one per byte of the file on disk, at least :data:`EVENTS_FLOOR`. Real traces
  hold one event per 12.7 to 82 bytes of ``.json.gz`` (``../shared/external``, ``sample_traces``);
  a 0.9 MB gzip of tiny events inflated to 4.4 M events under the 256 MiB inflate floor and past
  4 GB of memory. A plain ``.json`` needs at least 3 bytes per event, so the cap never binds there.
  ``EP_TRACE_MAX_EVENTS`` replaces the rule by one number.

The scan is the C function ``_kscan.guard`` when the extension is built (about as fast as a
``memchr`` over string text), else :func:`guard_numpy`, which applies the same rules with numpy
(tests compare the two on every shape). The rules, so both agree byte for byte on any input: a
backslash escapes the next byte (inside or outside a string), an unescaped ``"`` toggles "inside a
string", brackets outside strings move the depth (a closer at depth 0 is ignored: the decoders
refuse it), and the first value ends at the closer that brings the depth from 1 to 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ep_trace.errors import ResourceLimitError, TraceFormatError
from ep_trace.parsers.input_guard import env_bytes

try:
    from ep_trace.parsers import _kscan
except ImportError:  # pragma: no cover - the extension is optional (no C compiler at install)
    _kscan = None  # type: ignore[assignment]

__all__ = [
    "MAX_JSON_DEPTH",
    "HARD_MAX_JSON_DEPTH",
    "EVENTS_FLOOR",
    "JsonGuard",
    "check_json_text",
    "check_json_line",
    "event_limit",
    "json_depth_limit",
    "guard_numpy",
]

#: Deepest accepted nesting (the top-level value is level 1); ``EP_TRACE_MAX_JSON_DEPTH`` raises it.
MAX_JSON_DEPTH = 64
#: ... at most to this: the native scanner gives up beyond it and the other decoders must survive it.
HARD_MAX_JSON_DEPTH = 200
#: A file may always hold this many events, whatever its size on disk (``EP_TRACE_MAX_EVENTS``).
EVENTS_FLOOR = 1 << 20

State = tuple[int, int, int, int, int, int, int]  # pos, depth, end (-1: open), events, in_str, esc, ev_depth
_START: State = (0, 0, -1, 0, 0, 0, 0)
_OK, _DEEP, _TRAILING, _EVENTS = 0, 1, 2, 3
_BLANK = b" \t\n\r"
_NO_CAP = 1 << 62

_CLASS = np.zeros(256, dtype=np.int8)  # brackets: +1 opener, -1 closer
_CLASS[[ord("["), ord("{")]] = 1
_CLASS[[ord("]"), ord("}")]] = -1
_IS_BLANK = np.ones(256, dtype=bool)
_IS_BLANK[list(_BLANK)] = False  # (True = not blank)


def json_depth_limit() -> int:
    """The depth cap: ``EP_TRACE_MAX_JSON_DEPTH`` (at most :data:`HARD_MAX_JSON_DEPTH`), else :data:`MAX_JSON_DEPTH`."""
    return min(env_bytes("EP_TRACE_MAX_JSON_DEPTH", MAX_JSON_DEPTH), HARD_MAX_JSON_DEPTH)


def event_limit(path: str | Path) -> int:
    """Most events (objects at the events' depth) accepted from ``path``: one per byte on disk, at least
    :data:`EVENTS_FLOOR`; ``EP_TRACE_MAX_EVENTS`` replaces the rule by one number."""
    if os.environ.get("EP_TRACE_MAX_EVENTS"):
        return env_bytes("EP_TRACE_MAX_EVENTS", EVENTS_FLOOR)
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return max(EVENTS_FLOOR, size)


def _escaped(a: np.ndarray, esc_in: int) -> tuple[np.ndarray, int]:
    """Positions escaped by a backslash (sorted), and whether the byte after the text is."""
    b = np.flatnonzero(a == 92)
    if b.size == 0:
        return (np.zeros(1, np.int64) if esc_in and a.size else np.zeros(0, np.int64)), int(esc_in and a.size == 0)
    new_run = np.ones(b.size, dtype=bool)
    new_run[1:] = b[1:] != b[:-1] + 1
    run_start = np.maximum.accumulate(np.where(new_run, b, 0))
    first_escaped = (run_start == 0) & bool(esc_in)  # a run at byte 0 starts escaped when the last piece said so
    escaper = ~(first_escaped ^ ((b - run_start) % 2 == 1))  # alternate along the run
    hit = b[escaper] + 1
    out = hit[hit < a.size]
    if esc_in and b[0] != 0:
        out = np.concatenate([[0], out])
    esc_out = int(bool(escaper[-1]) and b[-1] == a.size - 1)
    return out, esc_out


def _minus(xs: np.ndarray, drop: np.ndarray) -> np.ndarray:
    """Sorted ``xs`` without the (sorted) positions in ``drop``."""
    if drop.size == 0 or xs.size == 0:
        return xs
    i = np.searchsorted(drop, xs)
    hit = (i < drop.size) & (drop[np.minimum(i, drop.size - 1)] == xs)
    return xs[~hit]


def _first_non_blank(a: np.ndarray) -> int | None:
    nb = np.flatnonzero(_IS_BLANK[a])
    return int(nb[0]) if nb.size else None


def guard_numpy(
    text: bytes | bytearray | memoryview, state: State, max_depth: int, max_events: int
) -> tuple[State, int, int]:
    """The guard's rules in numpy: the same result as ``_kscan.guard`` (see the module doc)."""
    pos, depth, end, events, in_str, esc, ev_depth = state
    a = np.frombuffer(text, dtype=np.uint8)
    n = int(a.size)
    if end >= 0:
        t = _first_non_blank(a)
        if t is not None:
            return state, _TRAILING, pos + t
        return (pos + n, *state[1:]), _OK, -1
    escaped, esc_out = _escaped(a, esc)
    quotes = _minus(np.flatnonzero(a == 34), escaped)
    cls = _CLASS[a]
    br = _minus(np.flatnonzero(cls), escaped)
    br = br[(np.searchsorted(quotes, br) + in_str) % 2 == 0]  # outside strings
    steps = cls[br].astype(np.int64)
    s = depth + np.cumsum(steps)
    d = s - np.minimum(np.minimum.accumulate(s), 0)  # a closer at depth 0 stays at 0
    before = np.concatenate([[depth], d[:-1]]) if d.size else d
    k_end = np.flatnonzero((steps < 0) & (before == 1))
    stop = int(k_end[0]) if k_end.size else d.size  # findings after the end are only trailing bytes
    deep = np.flatnonzero(d[:stop] > max_depth)
    tops = np.flatnonzero((steps[:stop] > 0) & (d[:stop] == 1))  # the document's own opener
    if tops.size:
        ev_depth = 3 if a[br[tops[0]]] == 123 else 2
    is_event = (steps[:stop] > 0) & (a[br[:stop]] == 123) & (d[:stop] == ev_depth)
    over = np.flatnonzero(events + np.cumsum(is_event) > max_events)
    found = [(int(br[deep[0]]), _DEEP)] if deep.size else []
    found += [(int(br[over[0]]), _EVENTS)] if over.size else []
    if k_end.size:
        t = _first_non_blank(a[int(br[stop]) + 1 :])
        if t is not None:
            found.append((int(br[stop]) + 1 + t, _TRAILING))
    new_end = pos + int(br[stop]) + 1 if k_end.size else -1
    if found:  # (the state as the C scan leaves it: only the end matters then)
        at, code = min(found)
        return (pos, depth, new_end if code == _TRAILING else -1, events, in_str, esc, ev_depth), code, pos + at
    new_depth = int(d[-1]) if d.size and not k_end.size else (0 if k_end.size else depth)
    new_in = (in_str + quotes.size) % 2 if not k_end.size else 0
    return (pos + n, new_depth, new_end, events + int(is_event.sum()), new_in, esc_out, ev_depth), _OK, -1


def _scan(
    text: bytes | bytearray | memoryview, state: State, max_depth: int, max_events: int
) -> tuple[State, int, int]:
    if _kscan is not None:
        return _kscan.guard(text, state, max_depth, max_events)
    return guard_numpy(text, state, max_depth, max_events)


def _what_follows(byte: int) -> str:
    if byte == 0:
        return "NUL padding"
    if byte in b"{[":
        return "a second JSON document"
    return f"other data ({bytes([byte])!r})"


class JsonGuard:
    """The guard over one input fed in pieces (:meth:`feed`), raising at the first finding.

    Args:
        path: The input (named in the errors; its size on disk sets the event cap).
        events: Count events (objects at the events' depth) against :func:`event_limit`; False for
            texts that are not event lists (a sidecar line, a footer).
        record: The record named in the error instead of the byte offset (a sidecar's line).
    """

    def __init__(self, path: str | Path, events: bool = True, record: str | None = None) -> None:
        self.path = path
        self.max_depth = json_depth_limit()
        self.max_events = event_limit(path) if events else _NO_CAP
        self.record = record
        self.state: State = _START

    def feed(self, piece: bytes | bytearray | memoryview) -> None:
        """Scan the next piece of the text.

        Raises:
            ResourceLimitError: nested deeper than the cap, or more events than the cap.
            TraceFormatError: data after the end of the first JSON value.
        """
        prev = self.state
        self.state, code, at = _scan(piece, prev, self.max_depth, self.max_events)
        if code == _OK:
            return
        rec = self.record or f"byte {at:,}"
        if code == _DEEP:
            raise ResourceLimitError(
                self.path,
                f"JSON nested more than {self.max_depth} levels deep",
                f"the file is damaged or not a trace; if it is genuine, set EP_TRACE_MAX_JSON_DEPTH={self.max_depth * 2} "
                f"(at most {HARD_MAX_JSON_DEPTH}) to raise the cap (--keep-going skips it)",
                record=rec,
            )
        if code == _EVENTS:
            raise ResourceLimitError(
                self.path,
                f"holds more than {self.max_events:,} events (cap: one per byte of the file, at least "
                f"{EVENTS_FLOOR:,}; a gzip bomb?)",
                f"if the trace is genuine, set EP_TRACE_MAX_EVENTS={self.max_events * 2} to raise the cap",
                record=rec,
            )
        end = self.state[2]
        byte = memoryview(piece)[at - prev[0]]
        raise TraceFormatError(
            self.path,
            f"{_what_follows(byte)} from byte {at:,}, after the end of the JSON document (its first {end:,} bytes)",
            f"re-export the trace, or keep only the first {end:,} bytes of its text (--keep-going skips it)",
            record=self.record,
        )


def check_json_text(path: str | Path, text: bytes | bytearray | memoryview, events: bool = True) -> None:
    """Run one whole text through the guard (:class:`JsonGuard`)."""
    JsonGuard(path, events).feed(text)


def check_json_line(path: str | Path, line: bytes, number: int) -> None:
    """The depth cap on line ``number`` (1-based) of a JSON Lines file (a sidecar). A line holding no
    more brackets than the cap is shallow enough by counting alone (C speed); only the others are
    scanned. Data after a line's value is left to the reader, which calls the line malformed.

    Raises:
        ResourceLimitError: naming the line.
    """
    if line.count(b"[") + line.count(b"{") <= json_depth_limit():
        return
    try:
        JsonGuard(path, events=False, record=f"line {number}").feed(line)
    except ResourceLimitError:
        raise
    except TraceFormatError:
        return

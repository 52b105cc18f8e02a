"""Columnar decode of ``traceEvents`` slices with polars' JSON reader: no Python object per event.

(Each slice goes first to the native scanner, :mod:`ep_trace.parsers.kineto_native`, when it is
built and not switched off by ``EP_TRACE_NATIVE=0``; this module's reader takes the slices it
gives up on, and the orjson path those this reader could read differently.)

The orjson path (:func:`ep_trace.parsers.kineto._chunk_frame`) builds ~25 Python objects per event
and then one list comprehension per field; on GPU traces (~530k events per 100 MB) that is over half
of the ingest time. Here each slice from :func:`ep_trace.parsers.kineto_stream.stream_slices` is read
by ``pl.read_json`` (in eight pieces, :func:`_read`) with a schema naming only the fields the parser
uses, in two threads (the reader releases the GIL, and so does the gunzip of the next slice in the
calling thread). Only the few events whose whole ``args`` the collective builder needs
(``record_param_comms``, ``nccl:*`` ..., kernels with a ``Collective name`` copy) are decoded again
by orjson, from their own text.

The result must equal the orjson path's bit for bit, so polars' lenient coercions are checked, and
any slice where they could differ is handed to the orjson path (same slice, same result or error).
The checks are polars reductions over the slice's X rows (one select, expressions built once per
process) plus two byte scans (``bytes.count``, and a numpy search of the newlines when some
event's text is needed); none is a regex over the whole slice text, which cost a third of the
reader's own time:

* ids / bytes are read as float64: a quoted value is a reader error, a fraction or a value beyond
  2^53 (an error or another value there) falls back (``bytes`` checked on every X row);
* ts / dur are read as float64, and the reader reads ``true`` / ``false`` as 1.0 / 0.0 where the
  orjson path names the event: the text of the X events whose ts or dur read as 0.0 or 1.0 is
  searched for a boolean time (the whole slice when there are many such events);
* pid / tid are read as text: ints and non-numeric labels convert as there; float-looking or bool
  values (whose meaning depends on the other values of the orjson slice) fall back;
* ``cat`` / ``name`` numbers print differently (``1e3``): numeric-looking float text falls back;
* a ``Collective name`` key whose value is null is not visible in the struct: in each piece
  holding an X kernel (the only rows whose args are tested for the key) that reads as having none,
  the number of non-null values must equal the number of ``"Collective name"`` keys in the text;
* kept events are located by the event boundaries (``}`` ``,`` ``{``); their count must equal the
  number of events (else a boundary lies inside a string).

Known differences, on input no Kineto version writes: a JSON object with a duplicate key keeps the
first value here and the last in orjson; a float with no fraction (``2.0``) in an id field or in
pid / tid reads as that int here but is an error / null there; a quoted negative pid / tid
(``"-5"``) keeps its sign here.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from ep_trace.parsers import kineto_json, kineto_native, kineto_stream
from ep_trace.parsers.kineto_batch import MEMORY_CATEGORIES

__all__ = ["decode_columnar"]

# ids as Float64: a quoted value is a reader error, a fraction or an int beyond 2^53 is visible
_ARGS = pl.Struct(
    {"correlation": pl.Float64, "External id": pl.Float64, "bytes": pl.Float64, "Collective name": pl.Utf8}
)
_SCHEMA: dict[str, Any] = {
    "ph": pl.Utf8,
    "cat": pl.Utf8,
    "name": pl.Utf8,
    "pid": pl.Utf8,
    "tid": pl.Utf8,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "args": _ARGS,
}
_FLOATISH = r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^(?:true|false)$"
# the same test in Python's re: its ``$`` also matches before a final newline, Rust's only at the end
_FLOATISH_RE = re.compile(_FLOATISH.replace("$", r"\Z"))
_BOOL_TIME = re.compile(rb'"(?:ts|dur)"\s*:\s*(?:true|false)')
_WORDS = (re.compile(rb"true"), re.compile(rb"false"))
_BLANKS = frozenset(b" \t\n\r\x0b\x0c")  # what \s matches in a bytes pattern
_BLANK_BYTE = np.zeros(256, dtype=bool)
_BLANK_BYTE[list(_BLANKS)] = True
_FRAME_SCHEMA = {
    "event_id": pl.Int64,
    "category": pl.Utf8,
    "name": pl.Utf8,
    "pid_raw": pl.Int64,
    "tid_raw": pl.Int64,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "bytes": pl.Int64,
}
_FRAME_COLS = tuple(_FRAME_SCHEMA)
_PIPELINE = 4  # slices decoded ahead of the one being consumed
_PARTS = 8  # JSON pieces per slice (see _read)

ChunkFrame = Callable[[list[Any], int, Path, dict[int, dict[str, Any]]], pl.DataFrame]


class _Surprise(Exception):
    """This slice may decode differently from orjson: use the orjson path for it."""


def _track(col: pl.Series, ints: pl.Series) -> pl.Series:
    """pid / tid: ``ints`` (the text cast to Int64, null where it is no int) completed, for label
    strings, as ``kineto._track_ids`` does: their trailing number, else null.

    Negative ints are real (Kineto writes some thread ids as signed 32-bit values, e.g. -549452224);
    a quoted negative number would lose its sign there (see the module doc)."""
    # the few null ints first, then the null texts among them dropped (a mask over the few rows,
    # not a second one over the slice: 4 Series operations on every row -> 2)
    rows = ints.is_null().arg_true()
    labels = col.gather(rows)
    if labels.null_count():
        keep = labels.is_not_null()
        rows, labels = rows.filter(keep), labels.filter(keep)
    # a float, a bool or an int beyond int64: its value there depends on the rest of the orjson slice
    # (a few label events, "Spans": checked in Python, two Series operations fewer)
    if (
        any(_FLOATISH_RE.search(t) for t in labels.to_list())
        if labels.len() <= 64
        else labels.str.contains(_FLOATISH).any()
    ):
        raise _Surprise("pid/tid")
    return ints.clone().scatter(rows, labels.str.extract(r"([0-9]+)\s*$").cast(pl.Int64))


def _not_int(e: pl.Expr) -> pl.Expr:
    """Any float64 value that is not an int exactly representable (fraction, or beyond 2^53); null
    when the column is all null. Two reductions, not an OR of two full masks."""
    return (e != e.round(0)).any() | (e.abs().max() >= 2.0**53)


def _cuts(text: bytes, expected: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the ``}`` ending each event but the last in a slice piece, and of the ``{``
    opening each event but the first (``expected`` of each, the piece's event count - 1).

    Writers use one separator throughout: Kineto (and json.dumps with indent) ``},\n  {``,
    compact writers ``},{``. Every occurrence of the first separator found is located with numpy,
    anchored on its newline (which JSON strings cannot contain) or on its ``}``, instead of the list
    of every regex match (4x faster with newlines; 0.28 vs 0.57 ms per 0.7 MB compact rank file).
    When the count is not ``expected``, or a compact separator cannot be shown to be the only form
    (:func:`_no_blank_after`, else the regex's count), the regex's matches are returned; callers
    check their count too.
    """
    first = kineto_json._BOUNDARY_RE.search(text)
    if first is None:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    sep = first.group()
    j = sep.find(b"\n")
    newline = j >= 0
    arr = np.frombuffer(text, dtype=np.uint8)
    anchors = np.flatnonzero(arr == (10 if newline else 125))  # the separator's newline, or its "}"
    j = max(j, 0)
    # (anchors ascend: the ones with room for the whole separator are a slice of them)
    lo = np.searchsorted(anchors, j, side="left")
    hi = np.searchsorted(anchors, len(arr) - len(sep) + j, side="right")
    at = anchors[lo:hi] - j  # each candidate's "}"
    ok = np.ones(len(at), dtype=bool)
    for i, c in enumerate(sep):
        ok &= arr[at + i] == c
    ends = at[ok]
    # Every occurrence found is a regex match (a separator cannot overlap another), so equal counts
    # mean the same boundaries. A newline-anchored one cannot lie inside a string; a compact one can
    # ("},{" in a name), so there it must be shown that no boundary of another form exists: from the
    # few braces a blank follows, else by the regex's count (findall: 0.4 ms per 0.7 MB)
    if len(ends) == expected and (
        newline
        or (sep == b"},{" and _no_blank_after(text, arr, anchors))  # compact: the anchors are every "}"
        or len(kineto_json._BOUNDARY_RE.findall(text)) == expected
    ):
        return ends, ends + (len(sep) - 1)
    found = [(m.start(), m.end() - 1) for m in kineto_json._BOUNDARY_RE.finditer(text)]
    pos = np.array(found, dtype=np.int64).reshape(-1, 2)
    return pos[:, 0], pos[:, 1]


def _no_blank_after(text: bytes, arr: np.ndarray, braces: np.ndarray) -> bool:
    """Whether every regex boundary (``}`` blanks ``,`` blanks ``{``) of ``text`` is a blank-free
    ``},{``: then the ``},{`` occurrences are all of them.

    Only a ``}`` followed by a blank, or a ``},`` followed by one, can start a boundary with blanks;
    C++ kernel names make a few dozen per piece (``{lambda(float)#1}, at::``), each tried with an
    anchored match instead of counting every boundary with the regex (~30 µs vs 0.13 ms a piece)."""
    b = braces[braces + 2 < len(arr)]
    nxt = arr[b + 1]
    cand = b[_BLANK_BYTE[nxt] | ((nxt == 44) & _BLANK_BYTE[arr[b + 2]])]  # 44: ","
    if len(cand) > 512:
        return False
    return not any(kineto_json._BOUNDARY_RE.match(text, p) for p in cand.tolist())


class _Texts:
    """The JSON text of single events of a slice, by row (events located through the pieces'
    boundaries, found once per piece when first needed)."""

    def __init__(self, sl: kineto_stream.Slice, heights: list[int]) -> None:
        self._sl = sl
        self._heights = heights
        self.starts = np.cumsum([0, *heights])  # first row of each piece (and the end of the last)
        self._bounds: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _piece(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """``(start, end)`` offsets of every event of piece ``j`` (``text[start:end]``)."""
        got = self._bounds.get(j)
        if got is None:
            text = self._sl.pieces[j]
            ends, nexts = _cuts(text, self._heights[j] - 1)
            if len(ends) != self._heights[j] - 1:
                raise _Surprise("boundary inside a string")
            # the first event starts after the "[", the last ends before the "]" closing the piece
            got = self._bounds[j] = (np.concatenate(([1], nexts)), np.concatenate((ends + 1, [len(text) - 1])))
        return got

    def __call__(self, rows: list[int]) -> list[bytes]:
        """The texts of slice rows ``rows`` (ascending).

        Raises:
            _Surprise: a piece's boundaries do not match its event count (one inside a string).
        """
        r = np.asarray(rows, dtype=np.int64)
        piece_of = np.searchsorted(self.starts, r, side="right") - 1
        out: list[bytes] = []
        for j in np.unique(piece_of).tolist():
            starts, ends = self._piece(j)
            k = r[piece_of == j] - self.starts[j]
            text = self._sl.pieces[j]
            out += [text[a:b] for a, b in zip(starts[k].tolist(), ends[k].tolist(), strict=True)]
        return out


def _read(sl: kineto_stream.Slice) -> tuple[pl.DataFrame, list[int]]:
    """``pl.read_json`` of each piece of a slice, concatenated; and the pieces' event counts.

    The reader holds ~9x its input while it parses (polars 2.1: 19 MB for a 2 MB slice) and
    jemalloc keeps freed pages resident for a while (see :mod:`ep_trace.parsers.allocator`); pieces
    of ~256 KB bound that and parse faster (0.15 vs 0.21 CPU-s per 55 MB)."""
    parts = [pl.read_json(p, schema=_SCHEMA) for p in sl.pieces]
    heights = [f.height for f in parts]
    return (parts[0] if len(parts) == 1 else pl.concat(parts)), heights


def _bool_time(sl: kineto_stream.Slice, rows: list[int], texts: _Texts) -> bool:
    """Whether one of events ``rows`` (X events whose ts or dur read as 0.0 or 1.0) holds a boolean
    ``ts`` / ``dur``, which the JSON reader reads as 1.0 / 0.0 and the orjson path refuses.

    Only those events' text is searched: a regex scan of the whole slice stops at every ``"``
    (0.06 CPU-s per 50 MB, a third of the reader's own time). A boundary that cannot be trusted
    searches the whole slice."""
    try:
        if len(rows) <= 256:
            return any(_BOOL_TIME.search(t) for t in texts(rows))
        # many rows (int traces, where 1 µs is common: 30% of a param DLRM rank's X events): their
        # texts joined by NULs (no match can straddle one), scanned once by the word search
        return _has_bool_time(b"\x00".join(texts(rows)))
    except _Surprise:
        return any(_has_bool_time(p) for p in sl.pieces)


def _has_bool_time(text: bytes) -> bool:
    """``_BOOL_TIME.search(text)``, from the words instead of every ``"``.

    The regex stops at each quote (0.8 ms per 0.7 MB); a literal pattern is scanned by ``re``'s
    prefix search (0.13 ms for ``true``, faster than ``bytes.find``'s 0.18), and a Kineto file holds
    a few dozen of the words (kernel templates such as ``<int, true>``), each checked by walking back
    over the blanks (what the regex's whitespace class matches) to a ``:`` and a ``"ts"`` / ``"dur"`` key."""
    for word in _WORDS:
        for m in word.finditer(text):
            j = m.start()
            while j and text[j - 1] in _BLANKS:
                j -= 1
            if not j or text[j - 1] != 58:  # ":"
                continue
            j -= 1
            while j and text[j - 1] in _BLANKS:
                j -= 1
            if text[max(0, j - 4) : j] == b'"ts"' or text[max(0, j - 5) : j] == b'"dur"':
                return True
    return False


@functools.lru_cache(maxsize=8)
def _exprs(keep_prefixes: tuple[str, ...]) -> list[pl.Expr]:
    """The expressions of :func:`_slice_frame`'s one select over a slice's X rows, built once
    (building them per slice cost ~0.5 ms of Python each time): the columns, the two checks (a
    boolean each, broadcast) and the rows whose ts or dur may be a boolean. They read the ``args``
    fields as plain columns (the struct is unnested before the X rows are filtered: filtering the
    struct cost twice its fields)."""
    cat, name = pl.col("cat"), pl.col("name")
    mem = cat.is_in(MEMORY_CATEGORIES).fill_null(False)
    nbytes = pl.when(mem).then(pl.col("bytes"))
    # one anchored regex (a literal-prefix set) instead of an OR of starts_with per prefix
    marks = name.str.contains("^(?:" + "|".join(re.escape(p) for p in keep_prefixes) + ")").fill_null(False)
    is_kernel = (cat == "kernel").fill_null(False)
    coll = pl.col("Collective name")
    kern = is_kernel & coll.is_not_null()
    ts, dur = pl.col("ts"), pl.col("dur")
    zero_one = ((ts == 0.0) | (ts == 1.0) | (dur == 0.0) | (dur == 1.0)).fill_null(False)  # maybe a bool
    return [
        cat.alias("category"),
        name,
        pl.col("pid").cast(pl.Int64, strict=False).alias("pid_raw"),
        pl.col("tid").cast(pl.Int64, strict=False).alias("tid_raw"),
        ts,
        dur,
        pl.col("correlation").cast(pl.Int64, strict=False),
        pl.col("External id").cast(pl.Int64, strict=False).alias("external_id"),
        nbytes.cast(pl.Int64, strict=False).alias("bytes"),
        marks.alias("_mark"),
        (marks | kern).alias("_cand"),
        zero_one.alias("_zero_one"),
        (is_kernel & coll.is_null()).alias("_kern_plain"),
        (cat.str.contains(_FLOATISH) | name.str.contains(_FLOATISH)).fill_null(False).any().alias("_text"),
        pl.any_horizontal(
            # bytes of every X row, not only the memcpy / memset rows that use it: stricter, so
            # still exact (a fraction anywhere sends the slice to orjson), and no mask to build
            _not_int(pl.col("correlation")),
            _not_int(pl.col("External id")),
            _not_int(pl.col("bytes")),
        )
        .fill_null(False)
        .alias("_ints"),
    ]


def _slice_frame(
    sl: kineto_stream.Slice, offset: int, keep_prefixes: tuple[str, ...]
) -> tuple[pl.DataFrame, int, list[tuple[int, dict[str, Any]]]]:
    """Columns of the X events of one slice, the slice's event count and the kept args, in order.

    Eager polars: one filter and one select over the X rows, everything else on Series (each
    DataFrame query costs ~0.1 ms of planning and dispatch whatever its size; a lazy
    ``collect_all`` of the same queries cost 30% more)."""
    try:
        df, heights = _read(sl)
    except Exception as exc:  # noqa: BLE001 - any reader complaint means: let orjson decide
        raise _Surprise(str(exc)[:80]) from None
    n = df.height
    df = df.unnest("args")
    texts = _Texts(sl, heights)

    is_x = df.get_column("ph") == "X"
    x = df.filter(is_x)
    rows = is_x.arg_true().cast(pl.Int64)  # slice-local event index of each X row
    if x.height == 0:
        return pl.DataFrame(schema=_FRAME_SCHEMA), n, []
    cols = x.select(_exprs(keep_prefixes))
    if cols.get_column("_text")[0] or cols.get_column("_ints")[0]:
        raise _Surprise("numeric text or non-int id")
    kern_plain = cols.get_column("_kern_plain")
    if kern_plain.any() and _null_coll_name(sl, df, rows.filter(kern_plain), texts):
        raise _Surprise("null or nested Collective name")
    cand_rows = cols.get_column("_cand").arg_true()
    zero_one = cols.get_column("_zero_one")
    if (
        zero_one.any()
        # (when kept events are located anyway, their boundaries serve the search too: no
        # whole-slice scan for the words; kernel names hold "true" / "false" in templates)
        and (cand_rows.len() or any(b"true" in p or b"false" in p for p in sl.pieces))
        and _bool_time(sl, rows.filter(zero_one).to_list(), texts)
    ):
        # the JSON reader reads a boolean ts / dur as 1.0 / 0.0; the orjson path names the event
        raise _Surprise("boolean ts or dur")
    ids = rows + offset if offset else rows
    out = [cols.get_column(c) for c in _FRAME_COLS[1:]]
    # label strings ("Spans", "stream 7 ") among the ints: the cast made them null (rare, per Series;
    # put in place before the frame is built: a with_columns cost ~0.1 ms a slice)
    for c in ("pid", "tid"):
        j = _FRAME_COLS.index(f"{c}_raw") - 1
        if out[j].null_count() != x.get_column(c).null_count():
            out[j] = _track(x.get_column(c), out[j]).alias(f"{c}_raw")
    frame = pl.DataFrame([ids.alias("event_id"), *out])
    kept: list[tuple[int, dict[str, Any]]] = []
    if cand_rows.len():
        cand_ids = rows.gather(cand_rows).to_list()
        try:  # one orjson call for all of them (per-event calls cost ~1 µs each more)
            evs = orjson.loads(b"[" + b",".join(texts(cand_ids)) + b"]")
        except orjson.JSONDecodeError:
            raise kineto_stream.Fallback("kept event not decodable by orjson") from None  # e.g. > uint64
        if (
            len(evs) != len(cand_ids)
            or not all(isinstance(e, dict) for e in evs)
            or [e.get("name") for e in evs] != cols.get_column("name").gather(cand_rows).to_list()
        ):
            raise _Surprise("kept event text misplaced")
        ids_l = [i + offset for i in cand_ids]
        is_mark = cols.get_column("_mark").gather(cand_rows).to_list()
        arg = [e.get("args") for e in evs]
        # same order and tests as _chunk_frame: name marks first, then kernels with a metadata copy
        kept = [(i, a) for i, a, m in zip(ids_l, arg, is_mark, strict=False) if m and a]
        kept += [(i, a) for i, a, m in zip(ids_l, arg, is_mark, strict=False) if not m and a and "Collective name" in a]
    return frame, n, kept


def _null_coll_name(sl: kineto_stream.Slice, df: pl.DataFrame, rows: pl.Series, texts: _Texts) -> bool:
    """Whether a piece holding one of X kernels ``rows`` (read with no ``Collective name``) has
    more ``"Collective name"`` keys in its text than non-null values in the reader's column.

    A key whose value is null keeps a kernel's args in the orjson path and is invisible here; on
    any other row it changes nothing (only X kernels' args are tested for the key), so only the
    pieces of such kernels are counted: none on a CPU-only trace (11 ms per 51 MB gloo file), 138
    of 213 pieces of the 56 MB ``nccl1_50mb``. A piece counted may also fall back for a null
    elsewhere in it: stricter, still exact."""
    starts = texts.starts
    pieces = np.unique(np.searchsorted(starts, rows.to_numpy(), side="right") - 1).tolist()
    given = df.get_column("Collective name").is_not_null().to_numpy()
    return any(sl.pieces[j].count(b'"Collective name"') != int(given[starts[j] : starts[j + 1]].sum()) for j in pieces)


def _work(
    sl: kineto_stream.Slice, keep_prefixes: tuple[str, ...]
) -> tuple[pl.DataFrame, int, list[tuple[int, dict[str, Any]]]] | None:
    """One slice in a worker thread: the native scanner when built and enabled
    (:mod:`ep_trace.parsers.kineto_native`), else or where it gives up polars' reader; None: decode
    it with orjson instead (exact by construction)."""
    if kineto_native.enabled():
        got = kineto_native.slice_frame(sl, keep_prefixes)
        if got is not None:
            return got
    try:
        return _slice_frame(sl, 0, keep_prefixes)
    except (_Surprise, pl.exceptions.PolarsError):  # a polars complaint on odd data is a surprise too
        return None


def decode_columnar(
    path: Path, chunk_frame: ChunkFrame, keep_prefixes: tuple[str, ...]
) -> tuple[dict[str, Any], dict[int, dict[str, Any]], list[pl.DataFrame]]:
    """Header, kept args and per-slice event frames, as ``kineto._decode`` returns them.

    Args:
        path: The trace file.
        chunk_frame: The orjson-path column builder, used for slices that could decode differently.
        keep_prefixes: Event names whose ``args`` are kept.

    Raises:
        kineto_stream.Fallback: the file cannot be streamed (the caller uses the other paths).
        TraceFormatError: bad event (from ``chunk_frame``), in file order.
    """
    header: dict[str, Any] = {}
    kept_args: dict[int, dict[str, Any]] = {}
    frames: list[pl.DataFrame] = []
    offset = 0

    def consume(sl: kineto_stream.Slice, fut: Future) -> None:
        nonlocal offset
        res = fut.result()
        if res is None:  # the orjson path, on the very same slice
            try:
                evs = orjson.loads(sl.text)
            except orjson.JSONDecodeError:
                raise kineto_stream.Fallback("slice boundary inside a string") from None
            if evs:
                frames.append(chunk_frame(evs, offset, path, kept_args))
            offset += len(evs)
            return
        frame, n, kept = res
        if n:  # (an empty tail slice adds no frame, as in the orjson path)
            frames.append(frame.with_columns(pl.col("event_id") + offset) if offset else frame)
        for i, a in kept:
            kept_args[i + offset] = a
        offset += n

    pending: deque[tuple[kineto_stream.Slice, Future]] = deque()
    piece = max(1, kineto_json.CHUNK_BYTES // _PARTS)
    slices = kineto_stream.stream_pieces(path, header, piece_bytes=piece)

    def inline(sl: kineto_stream.Slice) -> None:
        done: Future = Future()
        done.set_result(_work(sl, keep_prefixes))
        consume(sl, done)

    first = next(slices, None)
    try:
        second = next(slices, None) if first is not None else None
    except kineto_stream.Fallback:
        if first is not None:  # its error, if any, comes before the stream's (file order)
            inline(first)
        raise
    if second is None:
        # one slice (a rank file under ~2 MB of JSON): no pool. Starting and joining 2 threads and
        # handing the slice over cost ~1 ms, 1 CPU-s over 1,024 small ranks (benchmarks/README.md)
        if first is not None:
            inline(first)
        return header, kept_args, frames
    with ThreadPoolExecutor(max_workers=2) as pool:
        try:
            for sl in itertools.chain((first, second), slices):
                pending.append((sl, pool.submit(_work, sl, keep_prefixes)))
                while len(pending) > _PIPELINE:
                    consume(*pending.popleft())
        finally:
            # earlier slices first: their errors come before a later stream problem, as in the orjson path
            try:
                while pending:
                    consume(*pending.popleft())
            finally:
                for _, fut in pending:
                    fut.cancel()
    return header, kept_args, frames

"""Bounded-memory decoding of a Kineto Chrome-trace file: header + ``traceEvents`` in chunks.

Decoding a 100 MB trace into Python objects at once costs several times the file size in RSS, so
the ``traceEvents`` array is decoded in slices of about :data:`CHUNK_BYTES` cut at event
boundaries (``}`` ``,`` ``{`` between two events), each slice turned into columns and dropped
before the next. A cut inside a string would make a slice invalid JSON, which is detected and
answered by decoding the whole array at once (correct, only slower), so the fast path can never
produce a different result from a plain ``orjson.loads``.

orjson keeps integers up to uint64 (``Comms Id`` can exceed int64); a document holding a larger
integer is re-decoded with the standard library (arbitrary precision) so the offending field can be
named by the column builder.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ep_trace.errors import TraceFormatError
from ep_trace.parsers.json_guard import check_json_text

__all__ = ["CHUNK_BYTES", "read_bytes", "decode_header", "iter_event_chunks"]

#: Target size of one decoded slice of ``traceEvents`` (bytes of JSON text). Decoded, a slice costs
#: about 10x its size in Python objects; 2 MB keeps that small next to the file's own bytes while
#: the per-slice overhead stays negligible.
CHUNK_BYTES = 2 << 20

_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY_RE = re.compile(rb"\}\s*,\s*\{")
_NON_SPACE = re.compile(rb"\S")
_AFTER_RE = re.compile(rb"\s*(?=[,}])")  # what may follow the array's "]": blanks, then "," or "}"
_FIX_REEXPORT = "re-export the trace (torch.profiler export_chrome_trace) or remove the file"


class _TooLarge(Exception):
    """The gzip stream inflates beyond the cap."""


def _gunzip(raw: bytes | bytearray, limit: int | None = None) -> bytearray:
    """Decompress gzip into one preallocated buffer.

    ``gzip.decompress`` peaks at twice the output (CPython 3.11 grows and copies its result); the
    gzip trailer's ISIZE gives the final size (mod 2^32), so the output is written in place, fed
    1 MB of input at a time. Multi-member files and wrong ISIZE values still work (the buffer grows).

    Raises:
        EOFError: the stream ends early. zlib.error: corrupt data. _TooLarge: more than ``limit`` bytes.
    """
    # ISIZE of a corrupt or truncated file is arbitrary (up to 4 GiB): trust it only up to 16x the
    # compressed size (Kineto JSON compresses ~8x); beyond that the buffer grows as data arrives.
    out = bytearray(min(int.from_bytes(raw[-4:], "little"), 16 * len(raw) + (1 << 20), limit or (1 << 62)))
    pos = 0
    view = memoryview(raw)
    while len(view):
        d = zlib.decompressobj(wbits=31)
        i = 0
        while not d.eof and i < len(view):
            buf: bytes | memoryview = view[i : i + (1 << 20)]
            i += 1 << 20
            while buf:
                piece = d.decompress(buf, 1 << 22)
                n = len(piece)
                if limit is not None and pos + n > limit:
                    raise _TooLarge(pos + n)
                if pos + n > len(out):
                    out.extend(bytes(pos + n - len(out)))
                out[pos : pos + n] = piece
                pos += n
                buf = d.unconsumed_tail
                if d.eof:
                    break
        if not d.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        view = memoryview(d.unused_data).toreadonly() if d.unused_data.strip(b"\x00") else memoryview(b"")
    del out[pos:]
    return out


def read_bytes(path: Path) -> bytes | bytearray:
    """Read a ``.json`` / ``.json.gz`` file (gzip recognised by its magic bytes).

    Raises:
        TraceFormatError: empty file, an invalid / truncated gzip stream, data after the JSON
            document (:func:`ep_trace.parsers.json_guard.check_json_text`).
        ResourceLimitError: beyond the inflate, depth or event caps.
    """
    raw: bytes | bytearray = path.read_bytes()
    if not raw:
        raise TraceFormatError(path, "empty file", _FIX_REEXPORT)
    if raw[:2] == b"\x1f\x8b":
        from ep_trace.parsers import validate

        limit = validate.inflate_limit(path)
        try:
            raw = _gunzip(raw, limit)
        except _TooLarge as big:
            validate.check_inflated(path, int(str(big.args[0])), limit)
            raise
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(path, f"invalid or truncated gzip data ({exc})", _FIX_REEXPORT) from None
        if _NON_SPACE.search(raw) is None:  # (raw.strip() would copy the whole buffer)
            raise TraceFormatError(path, "empty file (after gunzip)", _FIX_REEXPORT)
    elif path.name.endswith(".gz"):
        raise TraceFormatError(path, "invalid gzip data (no gzip header)", _FIX_REEXPORT)
    check_json_text(path, raw)  # depth, data after the document, events per byte (json_guard)
    return raw


def _loads(raw: bytes | bytearray, path: Path, what: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "64-bit" in str(exc):
            # An integer beyond uint64: stdlib json keeps it (Python int); the column builder then
            # names the event that holds it if the parser uses that field.
            try:
                return json.loads(raw)
            except ValueError:
                pass
        raise TraceFormatError(path, f"invalid or truncated JSON in {what} ({exc})", _FIX_REEXPORT) from None


def _closes_last_event(raw: bytes | bytearray, open_pos: int, end: int) -> bool:
    """True when ``raw[x:end]`` is one or more whole events for some event boundary x before ``end``.

    Boundaries are tried from the last one backwards, since a string may contain ``}, {``.
    """
    window = 1 << 16
    lo = max(open_pos, end - window)
    starts = [m.end() - 1 for m in _BOUNDARY_RE.finditer(raw, lo, end)]
    if lo == open_pos:
        starts.insert(0, open_pos)
    for x in reversed(starts[-8:] if lo > open_pos else starts[-8:] + starts[:1]):
        try:
            if isinstance(orjson.loads(b"[" + raw[x:end] + b"]"), list):
                return True
        except orjson.JSONDecodeError:
            continue
    return False


def _array_end(raw: bytes | bytearray, open_pos: int) -> int | None:
    """Index of the ``]`` closing the ``traceEvents`` array, found from the end of the document.

    Later top-level values can hold arrays too (``INFO`` is a list of log lines), so a candidate
    ``]`` must be followed by a parsable object remainder *and* close a parsable last event. The
    remainders tried are bounded to about twice the text in all (each is a copy of the tail; a
    tail of many ``],`` made this quadratic): past that, None (the caller decodes the whole text).
    """
    pos = len(raw)
    budget = 2 * len(raw) + (64 << 20)
    for _ in range(256):
        pos = raw.rfind(b"]", open_pos, pos)
        if pos < 0:
            return None
        m = _AFTER_RE.match(raw, pos + 1)  # (no copy of the tail for a candidate followed by other text)
        if m is None:
            continue
        budget -= len(raw) - m.start()
        if budget < 0:
            return None
        try:
            orjson.loads(b'{"_":0' + raw[m.end() :])
        except orjson.JSONDecodeError:
            continue
        if _closes_last_event(raw, open_pos, pos):
            return pos
    return None


def decode_header(raw: bytes | bytearray, path: Path) -> tuple[dict[str, Any], memoryview | list[Any]]:
    """Split a trace document into its top-level keys and its events.

    Returns:
        ``(header, events)`` where ``header`` holds every top-level key except ``traceEvents``, and
        ``events`` is either a view of the array body's bytes (fast path) or an already decoded list.

    Raises:
        TraceFormatError: not JSON, not an object with a ``traceEvents`` list.
    """
    m = _KEY_RE.search(raw)
    end = _array_end(raw, m.end()) if m else None
    if m is not None and end is not None:
        head = raw[: m.start()] + b'"traceEvents":[]' + raw[end + 1 :]
        try:
            header = orjson.loads(head)
        except orjson.JSONDecodeError:
            header = None
        if isinstance(header, dict):
            header.pop("traceEvents", None)
            return header, memoryview(raw)[m.end() : end]  # a view: no copy of the event text
    doc = _loads(raw, path, "the document")
    if isinstance(doc, list):  # the bare-array Chrome trace format
        return {}, doc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        keys = sorted(doc)[:6] if isinstance(doc, dict) else type(doc).__name__
        raise TraceFormatError(
            path,
            f"not a Chrome/Kineto trace: no 'traceEvents' list (top level: {keys})",
            "pass a torch.profiler trace (*.pt.trace.json[.gz]) or an Nsight export",
        )
    events = doc.pop("traceEvents")
    return doc, events


def iter_event_chunks(
    events: bytes | memoryview | list[Any], path: Path, chunk_bytes: int | None = None
) -> Iterator[tuple[int, list[Any]]]:
    """Yield ``(offset, events)`` slices of ``traceEvents``; ``offset`` = index of the slice's first event.

    Raises:
        TraceFormatError: the array is not valid JSON.
    """
    if isinstance(events, list):
        yield 0, events
        return
    body = events
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    pieces: list[tuple[int, int]] = []
    pos = 0
    n = len(body)
    while pos < n:
        target = pos + chunk_bytes
        if target >= n:
            pieces.append((pos, n))
            break
        m = _BOUNDARY_RE.search(body, target)
        if m is None:
            pieces.append((pos, n))
            break
        cut = m.start() + 1  # keep the closing brace in this slice
        pieces.append((pos, cut))
        pos = m.end() - 1  # the "{" opening the next event
    offset = 0
    for a, b in pieces:
        try:
            part = orjson.loads(b"[" + body[a:b] + b"]")
        except orjson.JSONDecodeError:
            part = None
        if not isinstance(part, list):
            # A cut landed inside a string, or the array is corrupt: decode the rest whole, which
            # either succeeds (same result as a plain decode) or raises the one-line error.
            yield offset, _loads(b"[" + body[a:] + b"]", path, "traceEvents")
            return
        yield offset, part
        offset += len(part)

"""Streaming decode of a Kineto trace: never holds the whole decompressed text.

The file is read (and gunzipped) 1 MB at a time into a small buffer; every time the buffer holds
more than ``CHUNK_BYTES`` of ``traceEvents`` text it is cut at the last event boundary (``}`` ``,``
``{``), that slice is decoded and handed out, and the buffer keeps only the rest. Top-level keys
before the array (``distributedInfo`` ...) and after it (``baseTimeNanoseconds``, ``traceName``;
Kineto writes the base last) are parsed together once the stream ends, so the caller applies the
time base after the events are columns. Peak memory: the compressed file, ~2 chunks of text and one
chunk of decoded objects, instead of the whole decompressed document.

Anything unexpected (no ``"traceEvents": [`` key, a cut inside a string, corrupt gzip, a missing
array end) raises :class:`Fallback`: the caller then re-reads the file with the whole-buffer path of
:mod:`ep_trace.parsers.kineto_json`, which decodes it exactly or raises the one-line error. The
streaming path therefore never changes a result, only the memory needed to get it.
"""

from __future__ import annotations

import re
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import orjson

from ep_trace.parsers import kineto_json, validate
from ep_trace.parsers.json_guard import JsonGuard

__all__ = ["Fallback", "Slice", "stream_events", "stream_pieces", "stream_slices"]

_READ = 1 << 20

try:  # ISA-L inflate: 2.7x zlib's speed on Kineto JSON (0.07 vs 0.19 s per 100 MB), same bytes and
    # the same CRC / length checks; zlib when python-isal is not installed.
    from isal import isal_zlib

    _inflate: types.ModuleType = isal_zlib
    # the stubs type isal_zlib.error as an instance; it is the exception class
    _INFLATE_ERRORS: tuple[type[BaseException], ...] = (zlib.error, cast(type[BaseException], isal_zlib.error))
except ImportError:  # pragma: no cover - isal is a dependency, kept optional for minimal installs
    _inflate = zlib
    _INFLATE_ERRORS = (zlib.error,)

try:  # one-shot gunzip of a small file: 0.22 ms vs 0.52 ms for a decompressobj on a 74 KB rank
    # file (its output buffer grows from 16 KB by copies); whole gzip members, CRC checked
    from isal.igzip import decompress as _gunzip
except ImportError:  # pragma: no cover
    from gzip import decompress as _gunzip

#: Deflate's largest ratio (258-byte matches in ~2 bits): a file of ``n`` compressed bytes
#: inflates to at most ~1032 n, so one whose bound is within the inflate limit is inflated in one
#: call with no risk of a bomb beyond the limit.
_DEFLATE_MAX_RATIO = 1032


class Fallback(Exception):
    """The streaming path cannot decode this file; use the whole-buffer path."""


def _pieces(path: Path) -> Iterator[bytes | memoryview]:
    """Decompressed (or plain) bytes of the file, in pieces of at most 1 MB (a piece is valid until
    the next one is asked for: copy what you keep), each through the structural guard
    (:class:`ep_trace.parsers.json_guard.JsonGuard`: depth, data after the document, events) before
    it is handed out.

    Raises:
        ResourceLimitError: the file inflates beyond :func:`ep_trace.parsers.validate.inflate_limit`
            (a gzip bomb: 1 MB inflating to 1 GiB), or the guard's depth or event cap is passed; not
            a :class:`Fallback`, the other path would refuse it too.
        TraceFormatError: data after the end of the JSON document (the guard).
    """
    guard = JsonGuard(path)
    for piece in _raw_pieces(path):
        guard.feed(piece)
        yield piece


def _raw_pieces(path: Path) -> Iterator[bytes | memoryview]:
    """:func:`_pieces` before the guard."""
    limit = validate.inflate_limit(path)
    produced = 0
    with open(path, "rb") as fh:
        first = fh.read(_READ)
        if first[:2] != b"\x1f\x8b":
            if path.name.endswith(".gz"):
                raise Fallback("no gzip header")
            yield first
            # later pieces read into one reused buffer (each is consumed before the next read): a
            # new 1 MB bytes object per read was fresh memory, page-faulted in every time
            scratch = bytearray(_READ)
            with memoryview(scratch) as view:
                while n := fh.readinto(scratch):
                    yield view[:n]
            return
        if len(first) < _READ and len(first) * _DEFLATE_MAX_RATIO <= limit:  # the whole file, small
            try:
                whole = _gunzip(first)
            except Exception:  # noqa: BLE001 - trailing bytes, truncation ...: the streaming path below decides
                whole = None
            if whole is not None:
                validate.check_inflated(path, len(whole), limit)
                view = memoryview(whole)  # the same 1 MB pieces as the stream: the same slices
                for i in range(0, len(whole), _READ):
                    yield view[i : i + _READ]
                return
        d = _inflate.decompressobj(wbits=31)
        data = first
        while data:
            try:
                buf = data
                while buf:
                    piece = d.decompress(buf, _READ)
                    if piece:
                        produced += len(piece)
                        validate.check_inflated(path, produced, limit)
                        yield piece
                    if d.eof:
                        rest = d.unused_data + fh.read(_READ)
                        if rest.strip(b"\x00"):  # another gzip member
                            d = _inflate.decompressobj(wbits=31)
                            buf = rest
                            continue
                        return
                    buf = d.unconsumed_tail
            except _INFLATE_ERRORS as exc:
                raise Fallback(str(exc)) from None
            data = fh.read(_READ)
        if not d.eof:
            raise Fallback("truncated gzip stream")


_BLANK = frozenset(b" \t\n\r\x0b\x0c")  # what \s matches in a bytes pattern


def _last_boundary(buf: bytearray) -> re.Match[bytes] | None:
    """The last event boundary (``}`` ``,`` ``{`` with blanks between) starting in the final 2 MB of
    ``buf``: the same match as the last of ``_BOUNDARY_RE.finditer`` there (matches cannot
    overlap, so the last one is the one ending at the rightmost boundary ``{``), found from the end
    by ``rfind`` of ``{`` and a few bytes read backwards (iterating the ~350 matches of a 64 KB
    window in Python cost 2-3 ms per 50 MB)."""
    lo = max(0, len(buf) - 2 * _READ)
    q = len(buf)
    while (q := buf.rfind(b"{", lo, q)) >= 0:
        i = q - 1
        while i >= lo and buf[i] in _BLANK:
            i -= 1
        if i >= lo and buf[i] == 0x2C:  # ","
            i -= 1
            while i >= lo and buf[i] in _BLANK:
                i -= 1
            if i >= lo and buf[i] == 0x7D:  # "}"
                return kineto_json._BOUNDARY_RE.match(buf, i, q + 1)
    return None


class Slice:
    """One ``traceEvents`` slice as JSON-array *pieces* of about ``piece_bytes`` each.

    ``pieces[i]`` is ``[`` + some whole events + ``]``, and ``seps[i]`` the text (``,`` and
    whitespace) that separated ``pieces[i]`` from ``pieces[i + 1]`` in the file, so :attr:`text`
    rebuilds the slice byte for byte. A slice of one piece is exactly the text
    :func:`stream_slices` yields. polars' JSON reader parses a ~256 KB piece ~1.4x faster than a
    2 MB one (its parse buffers stay in cache), and cutting here costs one copy of the text instead
    of a second copy per piece later.
    """

    __slots__ = ("pieces", "seps")

    def __init__(self, pieces: list[bytes], seps: list[bytes]) -> None:
        self.pieces = pieces
        self.seps = seps

    @property
    def text(self) -> bytes:
        """The slice's JSON text (``[`` ... ``]``), rebuilt from the pieces."""
        if len(self.pieces) == 1:
            return self.pieces[0]
        parts = [self.pieces[0][:-1]]
        for sep, piece in zip(self.seps, self.pieces[1:], strict=True):
            parts += (sep, piece[1:-1])
        parts.append(b"]")
        return b"".join(parts)


def _cut(buf: bytearray, end: int, piece_bytes: int | None) -> Slice:
    """``buf[:end]`` (whole events, ``end`` just after the last one's ``}``) as a :class:`Slice`.

    Pieces are cut at event boundaries (``}`` ``,`` ``{``) found forward from every
    ``piece_bytes``; a boundary inside a string would make a piece invalid JSON (the text before
    the cut ends inside that string), never a different valid one, and the reader then hands the
    slice to orjson."""
    pieces, seps = [], []
    pos = 0
    with memoryview(buf) as view:
        while piece_bytes and (m := kineto_json._BOUNDARY_RE.search(buf, pos + piece_bytes, end)) is not None:
            pieces.append(b"".join((b"[", view[pos : m.start() + 1], b"]")))
            seps.append(bytes(view[m.start() + 1 : m.end() - 1]))
            pos = m.end() - 1  # the "{" of the next event
        pieces.append(b"".join((b"[", view[pos:end], b"]")))
    return Slice(pieces, seps)


def stream_pieces(
    path: Path, header: dict[str, Any], chunk_bytes: int | None = None, piece_bytes: int | None = None
) -> Iterator[Slice]:
    """Yield the ``traceEvents`` slices of :func:`stream_slices` (the same cuts), each as pieces of
    about ``piece_bytes`` (None: one piece); fill ``header`` when the stream ends.

    Raises:
        Fallback: see the module doc (possibly after some slices were yielded: discard them).
    """
    size = chunk_bytes or kineto_json.CHUNK_BYTES
    pieces = _pieces(path)
    buf = bytearray()
    m = None
    for piece in pieces:
        buf += piece
        m = kineto_json._KEY_RE.search(buf)
        if m is not None:
            break
    if m is None:
        raise Fallback("no traceEvents key")
    prefix = bytes(buf[: m.start()])
    del buf[: m.end()]
    for piece in pieces:
        buf += piece
        if len(buf) < size:
            continue
        last = _last_boundary(buf)  # slices of about `size`, the buffer stays below size + 1 MB
        if last is None:
            continue  # one huge event: keep reading
        yield _cut(buf, last.start() + 1, piece_bytes)
        del buf[: last.end() - 1]
    end = kineto_json._array_end(buf, 0)
    if end is None:
        raise Fallback("no end of traceEvents")
    try:
        doc = orjson.loads(prefix + b'"traceEvents":[]' + buf[end + 1 :])
    except orjson.JSONDecodeError:
        raise Fallback("undecodable tail") from None
    if not isinstance(doc, dict):
        raise Fallback("not an object")
    doc.pop("traceEvents", None)
    header.update(doc)
    yield _cut(buf, end, piece_bytes)


def stream_slices(path: Path, header: dict[str, Any], chunk_bytes: int | None = None) -> Iterator[bytes]:
    """Yield the JSON text of ``traceEvents`` slices (``[`` ... ``]``, whole events); fill ``header``
    when the stream ends.

    Args:
        path: A ``.json`` / ``.json.gz`` trace.
        header: Receives every top-level key except ``traceEvents`` (before the last slice).
        chunk_bytes: Slice size; default :data:`ep_trace.parsers.kineto_json.CHUNK_BYTES`.

    Raises:
        Fallback: see the module doc (possibly after some slices were yielded: discard them).
    """
    for sl in stream_pieces(path, header, chunk_bytes):
        yield sl.pieces[0]


def stream_events(
    path: Path, header: dict[str, Any], chunk_bytes: int | None = None
) -> Iterator[tuple[int, list[Any]]]:
    """Yield ``(offset, events)`` slices of ``traceEvents`` decoded by orjson (:func:`stream_slices`).

    Raises:
        Fallback: see the module doc (possibly after some slices were yielded: discard them).
    """
    offset = 0
    for text in stream_slices(path, header, chunk_bytes):
        try:
            part = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise Fallback("slice boundary inside a string") from None
        if part:
            yield offset, part
        offset += len(part)

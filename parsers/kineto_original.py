"""The original bytes of a Kineto trace file, and where extra events can be appended to it.

``ep-trace annotate`` keeps every rank's trace as it was (all events, flows, metadata,
``distributedInfo``, ``deviceProperties``, ``schemaVersion``, timestamps) and only appends its own
events at the end of ``traceEvents``. This module finds that spot without decoding the events
(the same top-level split as :func:`ep_trace.parsers.kineto_json.decode_header`) and the time base
of the file's ``ts`` (``baseTimeNanoseconds``, kineto#928, else absolute epoch µs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from ep_trace.errors import TraceFormatError
from ep_trace.parsers.kineto_json import _KEY_RE, _array_end, read_bytes

__all__ = ["KinetoOriginal", "read_original"]

_FIX = "annotate needs the rank's original Kineto trace file; re-export it with torch.profiler"


@dataclass(frozen=True)
class KinetoOriginal:
    """A Kineto trace document, uncompressed, with the insertion point for extra events.

    Attributes:
        path: The file.
        raw: The whole JSON document (gunzipped), byte for byte.
        insert_at: Index of the ``]`` that closes ``traceEvents``: extra events go right before it.
        empty: ``traceEvents`` holds no event (no comma needed before the first extra one).
        base_ns: Epoch ns of ``ts = 0`` (``baseTimeNanoseconds``, else 0: ``ts`` is epoch µs).
    """

    path: Path
    raw: bytes
    insert_at: int
    empty: bool
    base_ns: int

    def with_events(self, events: list[bytes]) -> bytes:
        """The original document with ``events`` (encoded JSON objects) appended to ``traceEvents``."""
        if not events:
            return self.raw
        lead = b"" if self.empty else b","
        return self.raw[: self.insert_at] + lead + b",".join(events) + self.raw[self.insert_at :]


def read_original(path: str | Path) -> KinetoOriginal:
    """Read a Kineto ``.json`` / ``.json.gz`` file for annotation.

    Raises:
        TraceFormatError: not a JSON object with a ``traceEvents`` array, or a bad ``baseTimeNanoseconds``.
    """
    p = Path(path)
    raw = bytes(read_bytes(p))
    m = _KEY_RE.search(raw)
    end = _array_end(raw, m.end()) if m else None
    if m is None or end is None:
        raise TraceFormatError(p, "no top-level 'traceEvents' array to append the annotation tracks to", _FIX)
    try:
        header = orjson.loads(raw[: m.start()] + b'"traceEvents":[]' + raw[end + 1 :])
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(p, f"the document around 'traceEvents' is not JSON ({exc})", _FIX) from None
    base = header.get("baseTimeNanoseconds") if isinstance(header, dict) else None
    try:
        base_ns = int(base) if base is not None else 0
    except (TypeError, ValueError):
        raise TraceFormatError(p, f"baseTimeNanoseconds is not an integer ({base!r})", _FIX) from None
    empty = not raw[m.end() : end].strip()
    return KinetoOriginal(p, raw, end, empty, base_ns)

"""Split lists, group ranks and dtypes as Kineto records them (strings, possibly truncated).

Kineto stores ``In split size`` / ``Out split size`` / ``Process Group Ranks`` as JSON *strings*
(``"[3, 5]"``, ``"[]"``), and torch truncates lists longer than 30 entries
(``kTruncatLength = 30`` in ``torch/csrc/profiler/util.cpp``) in one of two formats:

* older torch: the first 30 values then ``...`` -> ``"[a0, ..., a29, ...]"``;
* newer torch: the first 29 values, ``...``, and the last value -> ``"[a0, ..., a28, ..., a_last]"``.

Third-party exporters sometimes write real JSON arrays; both are accepted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ep_trace.dtypes import itemsize

__all__ = ["ParsedList", "parse_int_list", "itemsize", "prod"]


@dataclass(frozen=True)
class ParsedList:
    """A parsed integer list.

    Attributes:
        values: The values in list order; ``None`` entries mark positions lost to truncation.
        truncated: The source list was truncated (``...``).
    """

    values: tuple[int | None, ...]
    truncated: bool


def parse_int_list(value: object, full_length: int | None = None) -> ParsedList | None:
    """Parse a Kineto integer list (string or array), tolerating ``...`` truncation.

    Args:
        value: ``"[1, 2]"``, ``"[]"``, ``[1, 2]``, ``"[a0, ..., a29, ...]"`` or ``None``.
        full_length: The true list length when known (e.g. the group size): a truncated list is
            then padded with ``None`` to that length, with the newer format's last value placed
            at the last position. Without it only the leading known values are kept.

    Returns:
        ``None`` when ``value`` is missing or not a list; otherwise the parsed list (empty for
        ``"[]"``).
    """
    if value.__class__ is str:  # the same few strings on every call of a trace ("[0, 1]", "[]"): cached
        return _parse_text(value, full_length)  # type: ignore[arg-type]
    return _parse(value, full_length)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str, full_length: int | None) -> ParsedList | None:
    return _parse(value, full_length)


def _parse(value: object, full_length: int | None) -> ParsedList | None:
    if value is None:
        return None
    if isinstance(value, list):
        items: list[object] = list(value)
    elif isinstance(value, str):
        s = value.strip()
        if not (s.startswith("[") and s.endswith("]")):
            return None
        body = s[1:-1].strip()
        items = [t.strip() for t in body.split(",")] if body else []
    else:
        return None
    head: list[int] = []
    tail: list[int] = []
    truncated = False
    for item in items:
        if item in ("...", Ellipsis, "…"):
            truncated = True
            continue
        try:
            v = int(item)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return None
        (tail if truncated else head).append(v)
    if not truncated:
        return ParsedList(tuple(head), False)
    if full_length is None or full_length < len(head) + len(tail):
        return ParsedList(tuple(head), True)
    pad = full_length - len(head) - len(tail)
    return ParsedList(tuple(head) + (None,) * pad + tuple(tail), True)


def prod(dims: object) -> int | None:
    """Product of a shape list (``[3, 8]`` -> 24, ``[]`` -> None: a scalar or an unrecorded shape)."""
    if not isinstance(dims, list) or not dims:
        return None
    out = 1
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            return None
        out *= d
    return out

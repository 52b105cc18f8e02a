"""Split lists, group ranks and dtypes as Kineto records them (strings, possibly truncated).

Kineto stores ``In split size`` / ``Out split size`` / ``Process Group Ranks`` as JSON *strings*
(``"[3, 5]"``, ``"[]"``), and torch truncates lists longer than 30 entries
(``kTruncatLength = 30`` in ``torch/csrc/profiler/util.cpp``) in one of two formats:

* older torch: the first 30 values then ``...`` -> ``"[a0, ..., a29, ...]"``;
* newer torch: the first 29 values, ``...``, and the last value -> ``"[a0, ..., a28, ..., a_last]"``.

Third-party exporters sometimes write real JSON arrays; both are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ParsedList", "parse_int_list", "itemsize", "prod"]

#: Bytes per element, keyed by every dtype spelling found in traces: c10 scalar names
#: (``record_param_comms`` ``dtype``), ``Input type`` strings of ``cpu_op`` rows, and torch names
#: without the ``torch.`` prefix (the ep-trace sidecar).
_ITEMSIZE: dict[str, int] = {
    # c10 ScalarType names
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
    # Input type strings (C++ type names printed by the profiler)
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8,
    "int": 4, "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16, "long long": 8, "unsigned short": 2, "unsigned int": 4,
    # torch dtype names
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8, "complex128": 16,
}


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


def itemsize(dtype: object) -> int | None:
    """Bytes per element of a dtype spelled as in a trace (``'Float'``, ``'c10::BFloat16'``,
    ``'long int'``, ``'bfloat16'``, ``'torch.float32'``); ``None`` when unknown."""
    if not isinstance(dtype, str):
        return None
    d = dtype.strip()
    if d.startswith("torch."):
        d = d[6:]
    return _ITEMSIZE.get(d)


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

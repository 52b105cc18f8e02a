"""Dtypes by every spelling found in traces: bytes per element, and which are integers (pure: no
torch, no parsers).

Shared by the parsers (``row_bytes`` of a collective; count exchanges, whose payload is split
sizes, told from token all-to-alls) and the analysis (bytes of a call whose parser knew the dtype
but not the row width).
"""

from __future__ import annotations

import polars as pl

__all__ = ["INTEGER_DTYPES", "itemsize", "itemsize_expr"]

#: Bytes per element, keyed by every dtype spelling found in traces: c10 scalar names
#: (``record_param_comms`` ``dtype``), ``Input type`` strings of ``cpu_op`` rows, and torch names
#: without the ``torch.`` prefix (the ep-trace sidecar).
_ITEMSIZE: dict[str, int] = {
    # c10 ScalarType names
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "ComplexHalf": 4,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    # Input type strings (C++ type names printed by the profiler)
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "long long": 8,
    "unsigned short": 2,
    "unsigned int": 4,
    # torch dtype names
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "complex128": 16,
}

#: Integer (and bool) spellings among the above, exactly as written in traces: an all-to-all of
#: such a tensor moves counts or indices, not token activations.
INTEGER_DTYPES: frozenset[str] = frozenset(
    {
        "Long",
        "Int",
        "Short",
        "Char",
        "Byte",
        "long int",
        "long",
        "int",
        "short int",
        "signed char",
        "unsigned char",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "Bool",
        "long long",
        "unsigned int",
    }
)

# Case-folded view for names whose capitalisation varies between writers ('Float' / 'float').
_ITEMSIZE_LOWER: dict[str, int] = {k.lower(): v for k, v in _ITEMSIZE.items()}


def itemsize(dtype: object) -> int | None:
    """Bytes per element of a dtype spelled as in a trace (``'Float'``, ``'c10::BFloat16'``,
    ``'long int'``, ``'bfloat16'``, ``'torch.float32'``); ``None`` when unknown."""
    if not isinstance(dtype, str):
        return None
    d = dtype.strip()
    if d.startswith("torch."):
        d = d[6:]
    return _ITEMSIZE.get(d)


def itemsize_expr(dtype: pl.Expr) -> pl.Expr:
    """Bytes per element of a dtype column, case-insensitive (``'Float'``, ``'BFloat16'``,
    ``'float32'``, ...); null when unknown."""
    d = dtype.str.strip_chars().str.strip_prefix("torch.").str.to_lowercase()
    return d.replace_strict(_ITEMSIZE_LOWER, default=None, return_dtype=pl.Int64)

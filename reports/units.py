"""Formatting of durations, bytes and ratios for people (one place, so every page agrees)."""

from __future__ import annotations

import math

__all__ = ["fmt_ns", "fmt_bytes", "fmt_pct", "fmt_ratio", "is_missing"]


def is_missing(x: object) -> bool:
    """True for ``None`` and NaN."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_ns(ns: float | int | None, signed: bool = False) -> str:
    """A duration given in ns as ``'1.23 ms'``, ``'45.6 µs'``, ``'789 ns'`` or ``'2.50 s'``.

    Args:
        ns: Duration in nanoseconds (``None`` / NaN -> ``'–'``).
        signed: Prefix ``+`` for positive values (deltas).
    """
    if is_missing(ns):
        return "–"
    v = float(ns)  # type: ignore[arg-type]
    sign = "+" if signed and v > 0 else ("-" if v < 0 else "")
    a = abs(v)
    if a >= 1e9:
        s = f"{a / 1e9:.2f} s"
    elif a >= 1e3:
        unit, v = ("ms", a / 1e6) if a >= 1e6 else ("µs", a / 1e3)
        s = f"{v:.0f} {unit}" if v >= 100 else (f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}")
    else:
        s = f"{a:.0f} ns"
    return sign + s


def fmt_bytes(b: float | int | None) -> str:
    """Bytes as ``'1.5 MiB'`` (binary units)."""
    if is_missing(b):
        return "–"
    v = float(b)  # type: ignore[arg-type]
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GiB"  # pragma: no cover


def fmt_pct(x: float | None, signed: bool = False) -> str:
    """A fraction (0.25) as ``'25.0%'``."""
    if is_missing(x):
        return "–"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"  # type: ignore[operator]


def fmt_ratio(x: float | None) -> str:
    """A ratio such as I_e as ``'3.20×'``."""
    if is_missing(x):
        return "–"
    return f"{x:.2f}×"

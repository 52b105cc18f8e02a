"""Trace strings, file names and messages made safe to print on a terminal, in one line.

A trace string (a kernel, host or file name, a message quoting one) reaches the terminal verbatim
unless escaped: C0 controls and ESC sequences (``\\x1b]0;...\\x07`` retitles the window, ``\\x1b[2J``
clears it), and their 8-bit C1 forms (``\\x9b`` = CSI, ``\\x9d ... \\x9c`` = an OSC string closed by
ST, ECMA-48 §5.3) drive it; a newline, U+0085 (NEL) or U+2028 / U+2029 (line / paragraph
separators, which ``str.splitlines`` and many terminals and log viewers break on) split a one-line
error. Each is shown as its escape (``\\x1b``, ``\\u2028``) instead: the text stays readable, the
terminal is not driven, the message stays one line.
"""

from __future__ import annotations

import polars as pl

__all__ = ["CONTROL_CODES", "CONTROL_PATTERN", "printable", "printable_expr"]

#: Code points escaped before printing: C0, DEL, C1, the Unicode line and paragraph separators.
CONTROL_CODES: tuple[int, ...] = (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)
#: A regex character class matching any of :data:`CONTROL_CODES` (for polars ``str.contains``).
CONTROL_PATTERN = r"[\x00-\x1f\x7f-\x9f\u2028\u2029]"

_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in CONTROL_CODES}


def printable(text: str) -> str:
    """``text`` with every control character of :data:`CONTROL_CODES` escaped (``\\x1b``, ``\\x9d``,
    ``\\u2028``): it can neither drive the terminal nor break the line."""
    return text.translate(_ESCAPES)


def printable_expr(col: str) -> pl.Expr:
    """Vectorised :func:`printable` of one string column (one literal replace per control code)."""
    e = pl.col(col)
    for code, esc in _ESCAPES.items():
        e = e.str.replace_all(chr(code), esc, literal=True)
    return e.alias(col)

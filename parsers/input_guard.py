"""The input before it is read, and the resource caps of decoding (part of the validation layer).

:mod:`ep_trace.parsers.validate` re-exports every name here; readers call these through it.

* :func:`check_input_path`: a directory where a file is expected, a FIFO, socket or device file, a
  dangling symlink, a symlink loop, no permission: refused before any byte is read (a FIFO or
  ``/dev/zero`` would block or never end);
* :func:`os_error` / :func:`unexpected_error`: an OS error or a decoder's own exception met while
  reading, as the one-line :class:`~ep_trace.errors.TraceFormatError` (so ``--keep-going`` skips it);
* caps: decompressed bytes per file (:func:`inflate_limit`, :func:`check_inflated`), decoded string
  length (:func:`check_strings`, :func:`check_string_table`), containers where text belongs
  (:func:`text_series`). Environment variables raise them; their names are in the messages.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ep_trace.errors import EpTraceError, ResourceLimitError, TraceFormatError

__all__ = [
    "NOT_A_TRACE",
    "guarded",
    "rank_for",
    "INFLATE_RATIO",
    "INFLATE_FLOOR",
    "INFLATE_MAX",
    "MAX_STRING_BYTES",
    "check_input_path",
    "os_error",
    "unexpected_error",
    "inflate_limit",
    "check_inflated",
    "check_strings",
    "check_string_table",
    "text_series",
    "env_bytes",
]

#: Default cap on decompressed bytes: this many times the compressed size ...
INFLATE_RATIO = 20
#: ... but at least this much (small files of a very repetitive trace) ...
INFLATE_FLOOR = 256 << 20
#: ... and never more than this (``EP_TRACE_MAX_INFLATE_BYTES`` overrides).
INFLATE_MAX = 4 << 30
#: Longest accepted decoded string (event name, category, host): 1 MiB (``EP_TRACE_MAX_STRING_BYTES``).
MAX_STRING_BYTES = 1 << 20


_FIX_REEXPORT = "re-export the trace or remove the file (--keep-going skips it)"


def env_bytes(name: str, default: int) -> int:
    """The byte count in environment variable ``name`` (``default`` when unset; at least 1).

    Raises:
        ConfigError: the value is not a number.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(float(raw))
    except ValueError:
        from ep_trace.errors import ConfigError

        raise ConfigError(f"{name}={raw!r}: not a number of bytes; set it to e.g. 8589934592") from None
    return max(value, 1)


# --- the input before reading ------------------------------------------------------------------


def os_error(path: str | Path, exc: OSError, doing: str = "cannot read") -> TraceFormatError:
    """One-line error for an OS error met on ``path`` (a fix per errno)."""
    fixes = {
        errno.EACCES: "check the file's permissions (chmod) or run as its owner",
        errno.EPERM: "check the file's permissions (chmod) or run as its owner",
        errno.ELOOP: "the path is a symlink loop; point it at a real file",
        errno.ENOENT: "check the path (a dangling symlink?)",
        errno.EISDIR: "pass the file, not a directory",
        errno.ENOTDIR: "check the path",
        errno.EIO: "the disk or network filesystem failed to deliver the data; copy the file elsewhere and retry",
        errno.ENOSPC: "free disk space",
        errno.ENOMEM: "free memory or read fewer files at once (--jobs 1)",
    }
    fix = fixes.get(exc.errno or 0, "check the file and the filesystem")
    reason = exc.strerror or type(exc).__name__
    return TraceFormatError(path, f"{doing} ({reason}, errno {exc.errno})", f"{fix}; --keep-going skips it")


def check_input_path(path: str | Path, expect_dir: bool = False) -> None:
    """Refuse an input that is not a regular file (or, ``expect_dir``, a directory) before reading.

    A FIFO or ``/dev/zero`` would block or never end; a directory named like a trace file would be
    read as nothing; a dangling link or a loop has no data.

    Raises:
        TraceFormatError: naming the path and what it is.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(p):
            raise TraceFormatError(
                p, f"dangling symlink (to {os.readlink(p)!r})", "point the link at the trace file or remove it"
            ) from None
        if exc.errno == errno.ELOOP:
            raise TraceFormatError(p, "symlink loop", "point the link at a real file or remove it") from None
        raise os_error(p, exc) from None
    mode = st.st_mode
    if expect_dir:
        if not stat.S_ISDIR(mode):
            raise TraceFormatError(p, "expected a directory (an nsys parquetdir)", "pass the export directory")
        if not os.access(p, os.R_OK | os.X_OK):
            raise os_error(p, PermissionError(errno.EACCES, "Permission denied"))
        return
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    for test, what in kinds:
        if test(mode):
            raise TraceFormatError(
                p, f"is {what}, not a regular file", "pass the trace file itself (--keep-going skips it)"
            )
    if not os.access(p, os.R_OK):
        raise os_error(p, PermissionError(errno.EACCES, "Permission denied"))


def unexpected_error(path: str | Path, exc: BaseException) -> TraceFormatError:
    """A reader failure that is not one of ours (a decoder's ``ValueError``, a polars error on a
    value no exporter writes) as the one-line error, so ``--keep-going`` can skip the file."""
    if isinstance(exc, MemoryError):
        return ResourceLimitError(
            path, "ran out of memory while decoding", "free memory, or read fewer files at once (--jobs 1)"
        )
    if isinstance(exc, RecursionError):
        return ResourceLimitError(path, "values nested too deeply to decode", _FIX_REEXPORT)
    text = " ".join(str(exc).split())[:160] or type(exc).__name__
    return TraceFormatError(path, f"unreadable content ({type(exc).__name__}: {text})", _FIX_REEXPORT)


# --- resource caps -----------------------------------------------------------------------------


#: Problems that mean "this file is no trace at all" (a config JSON next to the traces), as opposed
#: to a damaged trace: discovered files with one of them are skipped with a warning.
NOT_A_TRACE = ("not a Chrome/Kineto trace", "not an Nsight Systems export")


def guarded(path: Path, fn: Callable[[], Any]) -> Any:
    """``fn()`` with any failure but an :class:`EpTraceError`, an OS error or a decoder's own
    exception, turned into the one-line :class:`~ep_trace.errors.TraceFormatError` naming ``path``."""
    try:
        return fn()
    except EpTraceError:
        raise
    except OSError as exc:
        raise os_error(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - MemoryError, RecursionError included: the one-line contract
        raise unexpected_error(path, exc) from None


def rank_for(path: Path, rank_map: Mapping[object, int] | None) -> int | None:
    """The rank ``rank_map`` gives a file: keyed by the path as discovered, its absolute form
    (``--rank-map R=PATH`` keys both), then the bare name; None when it names none."""
    if rank_map:
        for key in (str(path), str(path.resolve()), path, path.name):
            if key in rank_map:
                return int(rank_map[key])
    return None


def inflate_limit(path: str | Path) -> int:
    """Most decompressed bytes accepted from ``path``: ``max(20 x size, 256 MiB)``, at most 4 GiB.

    ``EP_TRACE_MAX_INFLATE_BYTES`` replaces the whole rule by one number (bytes).
    """
    env = os.environ.get("EP_TRACE_MAX_INFLATE_BYTES")
    if env:
        return env_bytes("EP_TRACE_MAX_INFLATE_BYTES", INFLATE_MAX)
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return min(max(INFLATE_RATIO * size, INFLATE_FLOOR), INFLATE_MAX)


def check_inflated(path: str | Path, produced: int, limit: int) -> None:
    """Raise once a decompressor has produced more than ``limit`` bytes (a gzip bomb, or a trace
    larger than the default cap).

    Raises:
        ResourceLimitError: naming the cap and how to raise it.
    """
    if produced > limit:
        raise ResourceLimitError(
            path,
            f"decompresses to more than {limit:,} bytes (cap: 20x the compressed size, at most 4 GiB)",
            f"if the trace is genuine, set EP_TRACE_MAX_INFLATE_BYTES={max(2 * limit, 8 << 30)} (bytes) to raise the cap",
        )


def check_strings(path: str | Path, df: pl.DataFrame, table: str, columns: tuple[str, ...]) -> None:
    """Refuse decoded strings longer than ``EP_TRACE_MAX_STRING_BYTES`` (default 1 MiB)."""
    limit = env_bytes("EP_TRACE_MAX_STRING_BYTES", MAX_STRING_BYTES)
    cols = [c for c in columns if c in df.columns and df.schema[c] in (pl.Utf8, pl.Categorical)]
    if not cols or df.height == 0:
        return
    lens = df.select([pl.col(c).cast(pl.Utf8).str.len_bytes().max().alias(c) for c in cols]).row(0)
    for c, n in zip(cols, lens, strict=True):
        if n is not None and n > limit:
            i = int(df.select(pl.col(c).cast(pl.Utf8).str.len_bytes().arg_max()).item())
            raise ResourceLimitError(
                path,
                f"{c} is {n:,} bytes long (cap {limit:,})",
                f"set EP_TRACE_MAX_STRING_BYTES={2 * n} to accept it",
                record=_record(df, table, i),
            )


def check_string_table(path: str | Path, df: pl.DataFrame, table: str, id_col: str, text_col: str) -> None:
    """An id -> string table (Nsight ``StringIds``): ids unique, strings within the length cap.

    Checked before any join: one 50 MB string used by 3,604 rows would be copied into each row
    (6.3 GB, then an abort), and a duplicate id would duplicate every row that uses it.

    Raises:
        TraceFormatError / ResourceLimitError: naming the table and the id.
    """
    if df.height == 0:
        return
    dup = df.filter(pl.col(id_col).is_duplicated())
    if dup.height:
        raise TraceFormatError(
            path,
            f"id {dup[id_col][0]} appears {int((df[id_col] == dup[id_col][0]).sum())} times",
            "the export is corrupt; re-export it with nsys export --type sqlite",
            record=table,
        )
    limit = env_bytes("EP_TRACE_MAX_STRING_BYTES", MAX_STRING_BYTES)
    n = df.select(pl.col(text_col).str.len_bytes().max()).item()
    if n is not None and n > limit:
        i = int(df.select(pl.col(text_col).str.len_bytes().arg_max()).item())
        raise ResourceLimitError(
            path,
            f"string id {df[id_col][i]} is {n:,} bytes long (cap {limit:,})",
            f"set EP_TRACE_MAX_STRING_BYTES={2 * n} to accept it",
            record=table,
        )


def text_series(path: str | Path, values: list[Any], ids: list[int], what: str) -> pl.Series:
    """A Utf8 column of decoded JSON values: strings as they are, numbers as text, null as null.

    A list or an object where text belongs is refused: polars would render it to text, and a
    1000-deep nested list of 2 KB renders to gigabytes (7.7 GB, then an abort).

    Raises:
        TraceFormatError: naming the event (``traceEvents[i]``) and the field.
    """
    kinds = set(map(type, values))  # C-level pass; polars would first build the nested value (minutes)
    if kinds <= {str, type(None)}:
        return pl.Series(values, dtype=pl.Utf8)
    if list not in kinds and dict not in kinds:
        return pl.Series(values, dtype=pl.Utf8, strict=False)
    i = next(j for j, v in enumerate(values) if isinstance(v, (list, dict)))
    raise TraceFormatError(
        path,
        f"'{what}' is a JSON {'list' if isinstance(values[i], list) else 'object'}, not a string",
        _FIX_REEXPORT,
        record=f"traceEvents[{ids[i]}]",
    )


def _record(df: pl.DataFrame, table: str, row: int) -> str:
    """``event <event_id>`` for events (event_id points back into the file), else ``table[row]``."""
    if table == "events" and "event_id" in df.columns:
        return f"event {int(df['event_id'][row])}"
    return f"{table}[{row}]"

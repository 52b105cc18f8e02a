"""SQLite inputs (Nsight Systems exports) opened so that reading them can neither change them nor hang.

Part of the validation layer (:mod:`ep_trace.parsers.validate`), used by
:class:`ep_trace.parsers.nsys_source.SqliteSource`:

* :func:`connect_readonly`: a ``file:`` URI with the path percent-encoded (a ``?`` or ``#`` in a
  file name would otherwise end the path, and a ``mode=`` after it would be lost: SQLite would open,
  or create, another file read-write) and ``mode=ro``; ``immutable=1`` as well when the header says
  rollback journal (every ``nsys export``) and no ``-journal`` / ``-wal`` file lies beside it: then
  SQLite takes no lock and writes no side file, so a read-only medium or a file being copied reads
  the same. A WAL database is opened ``mode=ro`` only (immutable would ignore its WAL file);
* :func:`check_readable_table`: a table we read must be a plain table. A view runs a query when read
  (a ``StringIds`` view over a recursive CTE never ends, in a 0.5 MB file), a virtual table runs its
  module, a generated column computes on every read: each is refused, naming the table, before it
  is queried (``sqlite_master`` type ``view``, ``CREATE VIRTUAL TABLE``, ``PRAGMA table_xinfo``
  ``hidden`` 2 / 3);
* :class:`StepBudget`: a progress handler that aborts any one statement after
  :data:`STEPS_PER_BYTE` virtual-machine steps per byte of the file (at least
  :data:`MIN_STEPS`). Reading every column of every row of a real export takes well under one step
  per byte (about 20 steps per 100-byte kernel row); the budget is the backstop for a query the
  checks above do not foresee.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path

from ep_trace.errors import TraceFormatError

__all__ = ["STEPS_PER_BYTE", "MIN_STEPS", "StepBudget", "connect_readonly", "check_readable_table"]

#: Virtual-machine steps one statement may take per byte of the database file ...
STEPS_PER_BYTE = 64
#: ... and at least this many (a small file).
MIN_STEPS = 50_000_000
#: Steps between two calls of the progress handler.
_EVERY = 10_000

_FIX = "re-export the report with 'nsys export --type sqlite' (an export holds plain tables only)"


class StepBudget:
    """The progress handler of one connection: aborts a statement past its step budget.

    Call :meth:`start` before each statement; ``tripped`` says whether the last one was aborted.
    """

    def __init__(self, path: Path) -> None:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = 0
        self.limit = max(MIN_STEPS, STEPS_PER_BYTE * size)
        self.calls = 0
        self.tripped = False

    def start(self) -> None:
        """A new statement: the budget starts again."""
        self.calls = 0
        self.tripped = False

    def __call__(self) -> int:
        self.calls += 1
        if self.calls * _EVERY > self.limit:
            self.tripped = True
            return 1  # non-zero: SQLite interrupts the statement
        return 0

    def error(self, path: Path, what: str) -> TraceFormatError:
        """The one-line error of a statement this budget aborted."""
        return TraceFormatError(
            path,
            f"reading {what} took more than {self.limit:,} SQLite steps ({STEPS_PER_BYTE} per byte of the file)",
            f"the file is damaged or not an nsys export; {_FIX}",
            record=what,
        )


def _immutable_ok(path: Path, head: bytes) -> bool:
    """Rollback-journal database (header bytes 18 / 19 = 1) with no journal or WAL file beside it."""
    if len(head) < 20 or head[18] != 1 or head[19] != 1:
        return False
    return not any(os.path.exists(f"{path}{suffix}") for suffix in ("-journal", "-wal"))


def connect_readonly(path: Path, head: bytes) -> tuple[sqlite3.Connection, StepBudget]:
    """Open ``path`` read-only (see the module doc), with its :class:`StepBudget` installed.

    Args:
        path: The SQLite file.
        head: Its first 100 bytes (the header, already read to check the magic).
    """
    uri = "file:" + urllib.parse.quote(str(Path(path).absolute()), safe="/") + "?mode=ro"
    if _immutable_ok(path, head):
        uri += "&immutable=1"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    budget = StepBudget(path)
    con.set_progress_handler(budget, _EVERY)
    return con, budget


def check_readable_table(con: sqlite3.Connection, path: Path, table: str) -> None:
    """Refuse ``table`` unless it is a plain table without generated columns (see the module doc).

    Raises:
        TraceFormatError: naming the table and what it is.
    """
    row = con.execute("SELECT type, sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    if row is None:
        return
    kind, sql = row[0], str(row[1] or "")
    if kind == "view":
        raise TraceFormatError(path, "is a view, not a table (reading it would run its query)", _FIX, record=table)
    if sql.lstrip().upper().startswith("CREATE VIRTUAL TABLE"):
        raise TraceFormatError(path, "is a virtual table (reading it would run its module)", _FIX, record=table)
    cols = con.execute(f'PRAGMA table_xinfo("{table}")').fetchall()
    generated = [r[1] for r in cols if len(r) > 6 and r[6] in (2, 3)]
    if generated:
        raise TraceFormatError(
            path,
            f"column {generated[0]!r} is generated (computed on every read), not stored",
            _FIX,
            record=table,
        )

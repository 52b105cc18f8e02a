"""Table sources for Nsight Systems exports: SQLite file, ``parquetdir`` folder, ``.nsys-rep``.

One small interface (list tables, list columns, read columns into polars) so that the reader in
:mod:`ep_trace.parsers.nsys` never assumes a table or a column exists: nsys creates tables lazily
(``--lazy=true`` is the default) and minor schema bumps rename/add columns, so every table and
every non-core column is discovered (``sqlite_master`` / ``PRAGMA table_info`` / Parquet schema).

All joins happen in polars, never in SQLite: nsys exports carry no indexes.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Protocol

import polars as pl

from ep_trace.errors import MissingDependencyError, TraceFormatError
from ep_trace.parsers.sqlite_guard import check_readable_table, connect_readonly

__all__ = ["TableSource", "SqliteSource", "ParquetDirSource", "open_source", "export_nsys_rep"]

log = logging.getLogger(__name__)

_SQLITE_MAGIC = b"SQLite format 3\x00"
# Declared SQLite column types of nsys tables -> polars dtypes (nsys declares every column).
_DECLARED: dict[str, pl.DataType] = {"INTEGER": pl.Int64(), "TEXT": pl.Utf8(), "REAL": pl.Float64()}


class TableSource(Protocol):
    """What the nsys reader needs from an export, whatever its container."""

    path: Path

    def tables(self) -> frozenset[str]:
        """Names of the tables present."""
        ...

    def columns(self, table: str) -> tuple[str, ...]:
        """Column names of ``table`` (empty when the table is absent)."""
        ...

    def read(self, table: str, columns: list[str], where: str | None = None) -> pl.DataFrame:
        """Read ``columns`` of ``table``; integer columns come back as Int64, text as Utf8."""
        ...


def _corrupt(path: Path, exc: Exception) -> TraceFormatError:
    return TraceFormatError(
        path,
        f"SQLite file is truncated or corrupt ({exc})",
        "re-export it with 'nsys export --type sqlite' or copy the file again",
    )


class SqliteSource:
    """An nsys SQLite export opened read-only (``mode=ro``, ``immutable=1`` where right: never touches
    the user's file), tables only, every statement on a step budget (:mod:`ep_trace.parsers.sqlite_guard`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as fh:
            head = fh.read(100)
        if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
            what = "an empty file" if not head else "not a SQLite file"
            raise TraceFormatError(path, what, "pass an nsys SQLite export (nsys export --type sqlite) or a .nsys-rep")
        # SQLite stores the page count in the header (bytes 28..31, big endian, valid since 3.7.0):
        # a file shorter than page_size * page_count was cut off (an interrupted copy / export).
        page_size = int.from_bytes(head[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        n_pages = int.from_bytes(head[28:32], "big")
        size = path.stat().st_size
        if n_pages and size < page_size * n_pages:
            raise TraceFormatError(
                path,
                f"SQLite file is truncated ({size} of {page_size * n_pages} bytes)",
                "copy or export the file again",
            )
        # read-only, immutable where right, every statement on a step budget (sqlite_guard)
        self._con, self._budget = connect_readonly(path, head)
        try:
            rows = self._con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except sqlite3.DatabaseError as exc:
            raise _corrupt(path, exc) from exc
        self._tables = frozenset(r[0] for r in rows)
        self._cols: dict[str, tuple[str, ...]] = {}
        self._types: dict[str, dict[str, pl.DataType | None]] = {}

    def tables(self) -> frozenset[str]:
        return self._tables

    def columns(self, table: str) -> tuple[str, ...]:
        if table not in self._tables:
            return ()
        if table not in self._cols:
            try:
                check_readable_table(self._con, self.path, table)  # no view, virtual table or generated column
                info = self._con.execute(f'PRAGMA table_info("{table}")').fetchall()
            except sqlite3.DatabaseError as exc:
                raise _corrupt(self.path, exc) from exc
            self._cols[table] = tuple(r[1] for r in info)
            self._types[table] = {r[1]: _DECLARED.get(str(r[2]).upper()) for r in info}
        return self._cols[table]

    def read(self, table: str, columns: list[str], where: str | None = None) -> pl.DataFrame:
        cols = ", ".join(f'"{c}"' for c in columns)
        sql = f'SELECT {cols} FROM "{table}"' + (f" WHERE {where}" if where else "")
        self.columns(table)  # (refuses a view before it runs)
        self._budget.start()
        try:
            rows = self._con.execute(sql).fetchall()
        except sqlite3.OperationalError as exc:
            if self._budget.tripped:
                raise self._budget.error(self.path, table) from None
            if "decode" not in str(exc):
                raise _corrupt(self.path, exc) from exc
            # Free-text tables (TARGET_INFO_SYSTEM_ENV in the 2.9.1 export) can hold bytes that are
            # not UTF-8; only then pay for a Python-level decoder that replaces them.
            self._con.text_factory = lambda b: b.decode("utf-8", "replace")
            self._budget.start()
            try:
                rows = self._con.execute(sql).fetchall()
            except sqlite3.DatabaseError as again:
                if self._budget.tripped:
                    raise self._budget.error(self.path, table) from None
                raise _corrupt(self.path, again) from again
            finally:
                self._con.text_factory = str
        except sqlite3.DatabaseError as exc:
            raise _corrupt(self.path, exc) from exc
        # Declared column types (INTEGER / TEXT) give the schema up front, which is ~40% faster
        # than inference; undeclared columns are inferred over all rows (infer_schema_length=None)
        # because SQLite is dynamically typed and a column may be NULL for a long prefix.
        types = self._types.get(table, {})
        df = None
        if all(types.get(c) is not None for c in columns):
            try:
                df = pl.DataFrame(rows, schema={c: types[c] for c in columns}, orient="row")
            except (TypeError, ValueError, pl.exceptions.PolarsError):
                df = None  # a value that does not fit its declared type: infer instead
        if df is None:
            df = pl.DataFrame(rows, schema=columns, orient="row", infer_schema_length=None)
        return _normalise(df)

    def close(self) -> None:
        self._con.close()


class ParquetDirSource:
    """An ``nsys export --type parquetdir`` folder: one ``<TABLE>.parquet`` per table."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.path = path
        self._files = {p.stem: p for p in sorted(path.glob("*.parquet"))}
        self._pq = pq
        self._cols: dict[str, tuple[str, ...]] = {}

    def tables(self) -> frozenset[str]:
        return frozenset(self._files)

    def columns(self, table: str) -> tuple[str, ...]:
        if table not in self._files:
            return ()
        if table not in self._cols:
            try:
                self._cols[table] = tuple(self._pq.read_schema(self._files[table]).names)
            except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a bad file
                raise TraceFormatError(
                    self._files[table], f"unreadable Parquet file ({exc})", "re-export the folder"
                ) from exc
        return self._cols[table]

    def read(self, table: str, columns: list[str], where: str | None = None) -> pl.DataFrame:
        if where is not None:
            raise ValueError("ParquetDirSource.read does not filter; filter the frame instead")
        try:
            tbl = self._pq.read_table(self._files[table], columns=columns)
        except Exception as exc:
            raise TraceFormatError(
                self._files[table], f"unreadable Parquet file ({exc})", "re-export the folder"
            ) from exc
        return _normalise(pl.from_arrow(tbl))  # type: ignore[arg-type]

    def close(self) -> None:
        return None


def _normalise(df: pl.DataFrame) -> pl.DataFrame:
    """Integers -> Int64 (Parquet keeps nsys' unsigned types; globalTid may exceed 2**63 and is
    wrapped to the same two's-complement value SQLite stores), binary-as-string stays Utf8."""
    exprs = []
    for name, dtype in df.schema.items():
        if dtype.is_integer() and dtype != pl.Int64:
            exprs.append(pl.col(name).cast(pl.Int64, wrap_numerical=True))
        elif dtype == pl.Null:
            exprs.append(pl.col(name).cast(pl.Int64))
    return df.with_columns(exprs) if exprs else df


def export_nsys_rep(path: Path, cache_dir: Path | None = None) -> Path:
    """Export a ``.nsys-rep`` to SQLite once and return the SQLite path.

    The export is cached by name, size, mtime, ctime and inode (a report regenerated with its old
    size and mtime put back, ``cp -p``, has a new ctime or inode: :mod:`ep_trace.parsers.cache_key`).

    Raises:
        MissingDependencyError: ``nsys`` is not on PATH; the message gives the exact command.
        TraceFormatError: ``nsys export`` failed.
    """
    cache = cache_dir if cache_dir is not None else path.parent / ".ep-trace-cache"
    st = path.stat()
    out = cache / f"{path.stem}.{st.st_size}.{st.st_mtime_ns}.{st.st_ctime_ns}.{st.st_ino}.sqlite"
    if out.is_file():
        return out
    nsys = shutil.which("nsys")
    if nsys is None:
        raise MissingDependencyError(
            f"{path}: reading a .nsys-rep needs Nsight Systems' 'nsys' on PATH; export it yourself with: "
            f"nsys export --type sqlite --output {path.with_suffix('.sqlite')} {path}"
        )
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = cache / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        # Read-only trace folder (e.g. a shared or mounted dataset): export into the temp dir.
        cache = Path(tempfile.gettempdir()) / "ep-trace-nsys-cache"
        cache.mkdir(parents=True, exist_ok=True)
        out = cache / out.name
        if out.is_file():
            return out
    tmp = out.with_suffix(".partial.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(path)]
    log.info("exporting %s with %s", path, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not tmp.is_file():
        last = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise TraceFormatError(
            path,
            f"'nsys export' failed ({last[-1] if last else f'exit {proc.returncode}'})",
            f"run: nsys export --type sqlite --output {path.with_suffix('.sqlite')} {path}",
        )
    tmp.replace(out)
    return out


def open_source(path: Path, cache_dir: Path | None = None) -> TableSource:
    """Open a SQLite export, a parquetdir folder or a ``.nsys-rep`` (exported first)."""
    if path.is_dir():
        if not any(path.glob("*.parquet")):
            raise TraceFormatError(
                path, "folder holds no .parquet tables", "pass an 'nsys export --type parquetdir' folder"
            )
        return ParquetDirSource(path)
    if not path.is_file():
        raise TraceFormatError(path, "no such file", "check the path")
    if path.suffix == ".nsys-rep":
        return SqliteSource(export_nsys_rep(path, cache_dir))
    return SqliteSource(path)

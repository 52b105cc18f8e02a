"""Canonical tables <-> Parquet, and the ingest cache.

Layout of an ingest output directory (readable by polars, pandas, DuckDB)::

    OUT/ranks.parquet  events.parquet  collectives.parquet  routing_counts.parquet
        routing_matrix.parquet  placement.parquet  stages.parquet   (rank is a column)
        load_report.json   -- list of {file, rank, level, message}
        manifest.json      -- ep-trace version, input key, inputs; written last (= complete)

Cache: the *input key* is a SHA-256 over the ep-trace version, the schema version, the reader options and
``(relative path, size, mtime_ns)`` of every input file (traces and sidecars). ``ep-trace ingest``
treats its own ``OUT`` as the cache: an unchanged directory is not parsed again when
``OUT/manifest.json`` holds the same key. :func:`load_trace_dir` (used by analysis commands) keeps
copies under ``$EP_TRACE_CACHE_DIR`` or ``~/.cache/ep-trace/<key>/``; any change to a file's size or
mtime changes the key, and stale entries are simply never read again.

Safety: every file is written to a temporary name and renamed into place, ``manifest.json`` is
removed first and renamed in last, and :func:`ingest` holds an exclusive lock on ``OUT`` (``flock``
on ``OUT/.ep-trace.lock``) for the whole read-or-write, so two ingests into one ``OUT`` never leave
tables of two inputs side by side: the second waits (up to ``EP_TRACE_LOCK_TIMEOUT`` seconds,
default 600) and then reuses the first one's tables or fails naming the lock. A cache entry that
cannot be read back (a truncated or damaged Parquet file, a manifest that is not JSON) is rebuilt
from the traces, never trusted; its tables are validated like any reader's
(:mod:`ep_trace.parsers.validate`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import orjson
import polars as pl

from ep_trace import schema
from ep_trace.errors import EpTraceError, OutputError, TraceFormatError

__all__ = [
    "TABLE_NAMES",
    "output_lock",
    "write_parquet",
    "read_parquet",
    "input_key",
    "ingest",
    "load_trace_dir",
    "default_cache_dir",
]

log = logging.getLogger(__name__)

TABLE_NAMES: tuple[str, ...] = (
    "ranks",
    "events",
    "collectives",
    "routing_counts",
    "routing_matrix",
    "placement",
    "stages",
)
_MANIFEST = "manifest.json"
_REPORT = "load_report.json"
_LOCK = ".ep-trace.lock"


def _replace_into(path: Path, write: Callable[[Path], object]) -> None:
    """Write through ``write(tmp)`` to a temporary sibling of ``path``, then rename it into place."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def output_lock(out: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Exclusive lock on an output directory for the duration of the block.

    A second ep-trace process writing the same directory waits up to ``timeout_s`` (default
    ``EP_TRACE_LOCK_TIMEOUT`` or 600 s), then fails.

    Raises:
        OutputError: the lock is still held after the wait, or the directory cannot be created.
    """
    import fcntl

    if timeout_s is None:
        timeout_s = float(os.environ.get("EP_TRACE_LOCK_TIMEOUT", "600"))
    lock = out / _LOCK
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"{out}: cannot create the output directory ({exc.strerror or exc}); choose another -o"
        ) from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fh = open(lock, "a+")  # noqa: SIM115 - held for the whole block
        except OSError as exc:
            raise OutputError(f"{out}: cannot write there ({exc.strerror or exc}); choose another -o") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise OutputError(f"{out}: cannot lock ({exc.strerror}); choose another -o") from None
            if time.monotonic() >= deadline:
                raise OutputError(
                    f"{out}: another ep-trace process is writing this directory (lock {lock} held for "
                    f"{timeout_s:.0f} s); wait for it to finish or choose another -o"
                ) from None
            log.info("%s: waiting for another ep-trace process to finish writing", out)
            time.sleep(0.2)
            continue
        # the holder before us unlinks the file on release: a lock on an unlinked inode is no lock
        try:
            same = os.fstat(fh.fileno()).st_ino == os.stat(lock).st_ino
        except OSError:
            same = False
        if same:
            break
        fh.close()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # while still holding it: waiters re-check the inode (above)
        fh.close()  # releases the lock


def default_cache_dir() -> Path:
    """``$EP_TRACE_CACHE_DIR`` or ``~/.cache/ep-trace``."""
    env = os.environ.get("EP_TRACE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ep-trace"


def write_parquet(
    tables: schema.TraceTables, out_dir: str | Path, manifest: Mapping[str, Any] | None = None
) -> list[Path]:
    """Write every table as ``<name>.parquet`` plus ``load_report.json`` (and ``manifest.json`` last).

    Returns:
        The files written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stale = out / _MANIFEST
    if stale.exists():
        stale.unlink()  # the directory is incomplete until the new manifest lands
    written = []
    for name in TABLE_NAMES:
        p = out / f"{name}.parquet"
        df = tables.table(name)  # type: ignore[arg-type]

        def write(tmp: Path, df: pl.DataFrame = df) -> None:
            df.write_parquet(tmp, compression="zstd", statistics=True)

        _replace_into(p, write)
        written.append(p)
    rep = out / _REPORT
    report = orjson.dumps([asdict(i) for i in tables.load_report], option=orjson.OPT_INDENT_2)
    _replace_into(rep, lambda tmp: tmp.write_bytes(report))
    written.append(rep)
    man = dict(manifest or {})
    man.setdefault("tables", {n: tables.table(n).height for n in TABLE_NAMES})  # type: ignore[arg-type]
    blob = orjson.dumps(man, option=orjson.OPT_INDENT_2)
    _replace_into(out / _MANIFEST, lambda tmp: tmp.write_bytes(blob))  # last: the directory is complete
    written.append(out / _MANIFEST)
    return written


def read_parquet(out_dir: str | Path) -> schema.TraceTables:
    """Read a directory written by :func:`write_parquet` back into validated tables.

    Raises:
        TraceFormatError: a table file is missing or does not match the canonical schema.
    """
    out = Path(out_dir)
    frames = {}
    for name in TABLE_NAMES:
        p = out / f"{name}.parquet"
        if not p.exists():
            raise TraceFormatError(p, "missing table file", "re-run ep-trace ingest into this directory")
        try:
            df = pl.read_parquet(p)
        except OSError as exc:
            from ep_trace.parsers.validate import os_error

            raise os_error(p, exc) from None
        except Exception as exc:  # noqa: BLE001 - polars' errors on a truncated / damaged file
            raise TraceFormatError(
                p,
                f"damaged Parquet file ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})",
                "re-run ep-trace ingest into this directory (--no-cache)",
            ) from None
        # conform first: directories written before a layout change (e.g. kind as String) still read
        if set(df.columns) >= set(schema.SCHEMAS[name]):  # type: ignore[index]
            try:
                df = schema.conform(name, df)  # type: ignore[arg-type]
            except pl.exceptions.PolarsError:
                pass  # validate names the mismatch
        frames[name] = schema.validate(name, df, str(p))  # type: ignore[arg-type]
    issues: tuple[schema.LoadIssue, ...] = ()
    rep = out / _REPORT
    if rep.exists():
        try:
            issues = tuple(schema.LoadIssue(**d) for d in orjson.loads(rep.read_bytes()))
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise TraceFormatError(
                rep, f"damaged load report ({exc})", "re-run ep-trace ingest into this directory (--no-cache)"
            ) from None
    tables = schema.TraceTables(**frames, load_report=issues)  # type: ignore[arg-type]
    from ep_trace.parsers.validate import check_tables

    check_tables(str(out), tables)  # a cache is an input like any other: same ranges as the readers
    return tables


def _read_cached(out: Path, key: str) -> schema.TraceTables | None:
    """The tables of a cache entry holding ``key``; ``None`` when absent, stale or damaged (rebuilt)."""
    if not _cached(out, key):
        return None
    try:
        return read_parquet(out)
    except EpTraceError as exc:
        log.warning("%s: damaged cache, rebuilding it: %s", out, exc)
        return None


def _input_files(path: Path) -> list[Path]:
    from ep_trace.parsers.dispatch import discover

    inputs, sidecars = discover(path)
    files: list[Path] = []
    for f, _ in inputs:
        files.extend(sorted(x for x in f.rglob("*") if x.is_file()) if f.is_dir() else [f])
    files.extend(sidecars.values())
    return files


def input_key(path: str | Path, options: Mapping[str, Any] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Cache key of a trace directory: SHA-256 of version, options and (path, size, mtime_ns) of each input.

    Returns:
        ``(hex key, [{path, size, mtime_ns}, ...])``.
    """
    from ep_trace import __version__

    p = Path(path)
    root = p.parent if p.is_file() else p
    entries = []
    try:
        files = _input_files(p)
    except OSError as exc:
        from ep_trace.parsers.validate import os_error

        raise os_error(exc.filename or p, exc, "cannot list") from None
    for f in files:
        try:
            st = f.stat()
        except OSError as exc:  # a dangling link or a loop: read_trace_dir names it (or skips it)
            entries.append({"path": os.path.relpath(f, root), "size": -1, "mtime_ns": exc.errno})
            continue
        entries.append({"path": os.path.relpath(f, root), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    blob = orjson.dumps(
        {
            "v": __version__,
            "schema": schema.SCHEMA_VERSION,
            "root": str(root.resolve()),
            "opts": {k: str(v) for k, v in sorted((options or {}).items())},
            "files": entries,
        }
    )
    return hashlib.sha256(blob).hexdigest(), entries


def _cached(out: Path, key: str) -> bool:
    man = out / _MANIFEST
    if not man.exists():
        return False
    try:
        return orjson.loads(man.read_bytes()).get("input_key") == key and all(
            (out / f"{n}.parquet").exists() for n in TABLE_NAMES
        )
    except (orjson.JSONDecodeError, OSError, AttributeError):
        return False  # a manifest that is not a JSON object is a damaged cache: rebuild


def ingest(
    path: str | Path,
    out_dir: str | Path,
    *,
    format: Literal["auto", "kineto", "nsys", "cupti"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Callable[[str, int, int], None] | None = None,
    rank_map: Mapping[object, int] | None = None,
    use_cache: bool = True,
    jobs: int = 1,
) -> tuple[schema.TraceTables, bool]:
    """Read a trace directory and write its tables to ``out_dir``, unless ``out_dir`` already holds them.

    Returns:
        ``(tables, from_cache)``.
    """
    from ep_trace import __version__
    from ep_trace.parsers.dispatch import read_trace_dir

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputError(f"-o {out}: exists and is not a directory; pass a directory for the tables")
    key, files = input_key(path, {"format": format, "on_error": on_error, "rank_map": dict(rank_map or {})})
    with output_lock(out):
        cached = _read_cached(out, key) if use_cache else None
        if cached is not None:
            log.info("%s: unchanged since the last ingest; reusing %s", path, out)
            return cached, True
        tables = read_trace_dir(path, format=format, on_error=on_error, progress=progress, rank_map=rank_map, jobs=jobs)
        try:
            write_parquet(
                tables, out, {"ep_trace_version": __version__, "input_key": key, "source": str(path), "inputs": files}
            )
        except OSError as exc:
            raise OutputError(
                f"-o {out}: cannot write the tables ({exc.strerror or exc}); free space or choose another -o"
            ) from None
    return tables, False


def load_trace_dir(
    path: str | Path,
    *,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    format: Literal["auto", "kineto", "nsys", "cupti"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Callable[[str, int, int], None] | None = None,
    rank_map: Mapping[object, int] | None = None,
    jobs: int = 1,
) -> schema.TraceTables:
    """:func:`~ep_trace.parsers.dispatch.read_trace_dir` with a Parquet cache in ``cache_dir/<key>/``.

    Args:
        path: Trace directory or file.
        cache_dir: Cache root; default :func:`default_cache_dir`.
        use_cache: False = always parse (and do not write the cache).
        format, on_error, progress, rank_map, jobs: As for ``read_trace_dir``.
    """
    from ep_trace.parsers.dispatch import read_trace_dir

    if not use_cache:
        return read_trace_dir(path, format=format, on_error=on_error, progress=progress, rank_map=rank_map, jobs=jobs)
    key, files = input_key(path, {"format": format, "on_error": on_error, "rank_map": dict(rank_map or {})})
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = root / key
    cached = _read_cached(entry, key)
    if cached is not None:
        return cached
    tables = read_trace_dir(path, format=format, on_error=on_error, progress=progress, rank_map=rank_map, jobs=jobs)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
        write_parquet(tables, tmp, {"input_key": key, "source": str(path), "inputs": files})
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except OSError as exc:  # a read-only home must not break analysis
        log.warning("could not write the ingest cache under %s: %s", root, exc)
    return tables

"""Canonical tables <-> Parquet, and the ingest cache.

Layout of an ingest output directory (readable by polars, pandas, DuckDB)::

    OUT/<table>/part-<i>.parquet   -- table = ranks, events, collectives, routing_counts,
                                      routing_matrix, placement, stages; rank is a column
        load_report.json   -- list of {file, rank, level, message}
        manifest.json      -- ep-trace version, input key, inputs, layout; written last (= complete)

``ep-trace ingest`` streams: rank files are decoded in batches of consecutive files
(:mod:`ep_trace.parsers.read_pool`), each batch writes one partition ``part-<i>.parquet`` per
table as soon as it is decoded (so ingest never holds more than the batches in flight), and
``part-<i>`` holds the ranks of batch ``i`` (one big rank file = one batch). Read a table with
``pl.scan_parquet("OUT/events/*.parquet")`` or DuckDB ``from 'OUT/events/*.parquet'``; an
empty table has no part file. Directories written before partitioning (``OUT/<table>.parquet``)
still read. :func:`write_parquet` (a set already in memory) writes one part per table.

Cache: the *input key* (:mod:`ep_trace.parsers.cache_key`) is a SHA-256 over the ep-trace version,
the schema version, the reader options and ``(relative path, size, mtime_ns, ctime_ns, inode)`` of
every input file (traces and sidecars): a file regenerated with its old size and mtime put back
(``cp -p``, ``rsync --times``) has a new ctime or inode, which no user can set back; a file changed
within 2 s of being read also has its SHA-256 in the manifest, checked on every reuse.
``ep-trace ingest`` treats its own ``OUT`` as the cache: an unchanged directory is not parsed again
when ``OUT/manifest.json`` holds the same key. :func:`load_trace_dir` (used by analysis commands)
keeps copies under ``$EP_TRACE_CACHE_DIR`` or ``~/.cache/ep-trace/<key>/``; any change to a file
changes the key, and stale entries are simply never read again.

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
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import polars as pl

from ep_trace import schema
from ep_trace.errors import EpTraceError, OutputError
from ep_trace.parsers import cache_evict
from ep_trace.parsers.cache_key import input_key, still_valid
from ep_trace.parsers.parquet_read import (
    _MANIFEST,
    _REPORT,
    TABLE_NAMES,
    _has_tables,
    is_ingest_dir,
    read_parquet,
    table_files,
)

__all__ = [
    "TABLE_NAMES",
    "IngestResult",
    "output_lock",
    "default_cache_dir",
    "ingest",
    "ingest_to",
    "input_key",
    "is_ingest_dir",
    "load_trace_dir",
    "read_parquet",
    "table_files",
    "write_parquet",
]

log = logging.getLogger(__name__)

_LAYOUT = "partitioned-v1"  # OUT/<table>/part-<i>.parquet
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
    _clear_tables(out)
    written = []
    for name in TABLE_NAMES:
        df = tables.table(name)  # type: ignore[arg-type]
        (out / name).mkdir()
        if df.height:
            p = out / name / "part-000000.parquet"

            def write(tmp: Path, df: pl.DataFrame = df) -> None:
                df.write_parquet(tmp, compression="zstd", statistics=True)

            _replace_into(p, write)
            written.append(p)
    man = dict(manifest or {})
    man.setdefault("tables", {n: tables.table(n).height for n in TABLE_NAMES})  # type: ignore[arg-type]
    return written + _finish(out, tables.load_report, man)


def _clear_tables(out: Path) -> None:
    """Remove the table files of an earlier run (both layouts) from ``out``."""
    for name in (*TABLE_NAMES, "_splits"):
        shutil.rmtree(out / name, ignore_errors=True)
        (out / f"{name}.parquet").unlink(missing_ok=True)


def _finish(out: Path, issues: tuple[schema.LoadIssue, ...], manifest: dict[str, Any]) -> list[Path]:
    """Write ``load_report.json`` then ``manifest.json`` (last: the directory is complete)."""
    report = orjson.dumps([asdict(i) for i in issues], option=orjson.OPT_INDENT_2)
    _replace_into(out / _REPORT, lambda tmp: tmp.write_bytes(report))
    blob = orjson.dumps({**manifest, "layout": _LAYOUT}, option=orjson.OPT_INDENT_2)
    _replace_into(out / _MANIFEST, lambda tmp: tmp.write_bytes(blob))
    return [out / _REPORT, out / _MANIFEST]


def _read_cached(
    out: Path, key: str, source: str | Path | None = None, lazy_events: bool = False
) -> schema.TraceTables | None:
    """The tables of a cache entry holding ``key`` (read from ``source``); ``None`` when absent,
    stale or damaged (rebuilt)."""
    if not _cached(out, key, source):
        return None
    try:
        return read_parquet(out, lazy_events=lazy_events)
    except EpTraceError as exc:
        log.warning("%s: damaged cache, rebuilding it: %s", out, exc)
        return None


def _cached(out: Path, key: str, source: str | Path | None = None) -> bool:
    """Whether ``out`` holds complete tables of ``key`` whose racy inputs (:mod:`ep_trace.parsers.cache_key`,
    under ``source``) are unchanged."""
    man = out / _MANIFEST
    if not man.exists():
        return False
    try:
        doc = orjson.loads(man.read_bytes())
        if doc.get("input_key") != key or not _has_tables(out):
            return False
    except (orjson.JSONDecodeError, OSError, AttributeError):
        return False  # a manifest that is not a JSON object is a damaged cache: rebuild
    if source is None:
        return True
    src = Path(source)
    return still_valid(doc, src.parent if src.is_file() else src, man)


@dataclass(frozen=True)
class IngestResult:
    """What :func:`ingest_to` did.

    Attributes:
        out_dir: The ingest directory.
        from_cache: True when ``out_dir`` already held the tables of the unchanged inputs.
        rows: Rows per table.
        load_report: The load report (skipped ranks, warnings).
    """

    out_dir: Path
    from_cache: bool
    rows: dict[str, int]
    load_report: tuple[schema.LoadIssue, ...]


def ingest_to(
    path: str | Path,
    out_dir: str | Path,
    *,
    format: Literal["auto", "kineto", "nsys", "cupti"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Callable[[str, int, int], None] | None = None,
    rank_map: Mapping[object, int] | None = None,
    use_cache: bool = True,
    jobs: int = 1,
    executor: Executor | None = None,
) -> IngestResult:
    """Stream a trace directory into ``out_dir`` (partitioned Parquet), unless it already holds it.

    Rank files are decoded in batches, each written as one partition per table as soon as it is
    decoded (here, in ``jobs`` local processes, or on ``executor``: then ``out_dir`` must be
    writable by every worker); only the ranks rows and the load report are gathered here, so
    memory does not grow with the number of ranks. Nothing is returned but counts.

    Raises:
        TraceFormatError, BadInputError, RankConflictError: as ``read_trace_dir``; ``out_dir`` then
        has no manifest (incomplete) and is never reused.
    """

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputError(f"-o {out}: exists and is not a directory; pass a directory for the tables")
    key, files = input_key(path, {"format": format, "on_error": on_error, "rank_map": dict(rank_map or {})})
    with output_lock(out):
        try:
            return _ingest_locked(
                path, out, key, files, format, on_error, progress, rank_map, use_cache, jobs, executor
            )
        except OSError as exc:
            raise OutputError(
                f"-o {out}: cannot write the tables ({exc.strerror or exc}); free space or choose another -o"
            ) from None


def _ingest_locked(
    path: str | Path,
    out: Path,
    key: str,
    files: list[dict[str, Any]],
    format: Literal["auto", "kineto", "nsys", "cupti"],
    on_error: Literal["raise", "skip"],
    progress: Callable[[str, int, int], None] | None,
    rank_map: Mapping[object, int] | None,
    use_cache: bool,
    jobs: int,
    executor: Executor | None,
) -> IngestResult:
    """:func:`ingest_to` under the output lock."""
    from ep_trace import __version__
    from ep_trace.parsers.dispatch import read_batches, splits_routing

    if use_cache and _read_cached(out, key, path) is not None:
        log.info("%s: unchanged since the last ingest; reusing %s", path, out)
        man = orjson.loads((out / _MANIFEST).read_bytes())
        issues = tuple(schema.LoadIssue(**d) for d in orjson.loads((out / _REPORT).read_bytes()))
        return IngestResult(out, True, dict(man.get("tables") or {}), issues)
    out.mkdir(parents=True, exist_ok=True)
    (out / _MANIFEST).unlink(missing_ok=True)  # the directory is incomplete until the new manifest lands
    _clear_tables(out)
    for name in TABLE_NAMES:
        (out / name).mkdir(exist_ok=True)
    run = read_batches(path, format, on_error, progress, rank_map, jobs, executor, out_dir=out)
    rows = {n: sum(r.rows.get(n, 0) for r in run.results) for n in TABLE_NAMES}
    if rows["routing_matrix"] == 0:  # no sidecar anywhere: the routing the all_to_allv splits give
        parts = [pl.read_parquet(f) for f in sorted((out / "_splits").glob("part-*.parquet"))]
        rm = splits_routing(parts)  # type: ignore[arg-type]
        if rm.height:
            rm.write_parquet(out / "routing_matrix" / "part-000000.parquet", compression="zstd", statistics=True)
        rows["routing_matrix"] = rm.height
    shutil.rmtree(out / "_splits", ignore_errors=True)
    # ranks: the rows the batches gathered (placement is deduplicated when read)
    man = {"ep_trace_version": __version__, "input_key": key, "source": str(path), "inputs": files, "tables": rows}
    _finish(out, run.issues, man)
    return IngestResult(out, False, rows, run.issues)


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
    executor: Executor | None = None,
) -> tuple[schema.TraceTables, bool]:
    """:func:`ingest_to`, then the tables read back from ``out_dir``.

    Returns:
        ``(tables, from_cache)``.
    """
    res = ingest_to(
        path,
        out_dir,
        format=format,
        on_error=on_error,
        progress=progress,
        rank_map=rank_map,
        use_cache=use_cache,
        jobs=jobs,
        executor=executor,
    )
    return read_parquet(res.out_dir), res.from_cache


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
    executor: Executor | None = None,
) -> schema.TraceTables:
    """:func:`~ep_trace.parsers.dispatch.read_trace_dir` with a Parquet cache in ``cache_dir/<key>/``.

    The key (:func:`~ep_trace.parsers.cache_key.input_key`) covers the ep-trace version, the options
    and every input file's path, size, mtime, ctime and inode, so a changed, added or removed rank
    file is parsed again, even with its old size and mtime put back. On a miss the
    rank files are streamed into the entry batch by batch (:func:`ingest_to`'s path: never every
    rank's events in memory at once); either way the tables are read back with the events left on
    disk (``TraceTables.events_scan``: the analysis reads them a block of ranks at a time), the
    small tables in memory. An unwritable cache root only logs a warning and reads in memory. The cache is
    capped (``EP_TRACE_CACHE_MAX_BYTES``, default 20 GiB; :mod:`ep_trace.parsers.cache_evict`): least
    recently used entries go first.

    Args:
        path: Trace directory or file (an ingest output directory is read as it is).
        cache_dir: Cache root; default :func:`default_cache_dir`.
        use_cache: False = always parse (and do not write the cache).
        format, on_error, progress, rank_map, jobs, executor: As for ``read_trace_dir``.
    """
    from ep_trace.parsers.dispatch import read_trace_dir

    p = Path(path)
    if use_cache and is_ingest_dir(p):
        return read_parquet(p, lazy_events=True)
    if not use_cache or not (p.is_dir() or p.is_file()):
        # (a FIFO, a device, a missing path: read_trace_dir refuses it with its own message)
        return read_trace_dir(path, format, on_error, progress, rank_map, jobs, executor)
    try:
        key, files = input_key(path, {"format": format, "on_error": on_error, "rank_map": dict(rank_map or {})})
    except (EpTraceError, OSError):  # e.g. an unlistable directory: the reader names it as without a cache
        return read_trace_dir(path, format, on_error, progress, rank_map, jobs, executor)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = root / key
    cached = _read_cached(entry, key, path, lazy_events=True)
    if cached is not None:
        log.info("%s: unchanged since it was cached; reading %s", path, entry)
        cache_evict.touch(entry)
        return cached
    # a miss streams the batches into the entry (as `ep-trace ingest` does: one partition per batch,
    # written as it is decoded), then the events are read back lazily: neither the read nor the
    # analysis holds every rank's events at once (docs/scale.md)
    tmp: Path | None = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
    except OSError as exc:  # a read-only or full disk must not break analysis
        log.warning("could not write the ingest cache under %s: %s", root, exc)
        return read_trace_dir(path, format, on_error, progress, rank_map, jobs, executor)
    try:
        _ingest_locked(path, tmp, key, files, format, on_error, progress, rank_map, False, jobs, executor)
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except OSError as exc:
        log.warning("could not write the ingest cache under %s: %s", root, exc)
        shutil.rmtree(tmp, ignore_errors=True)
        return read_trace_dir(path, format, on_error, progress, rank_map, jobs, executor)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    cache_evict.evict(root, keep=entry)
    tables = _read_cached(entry, key, lazy_events=True)  # (just written from the inputs read now)
    if tables is None:  # removed under us (another process' eviction): read it in memory
        return read_trace_dir(path, format, on_error, progress, rank_map, jobs, executor)
    return tables

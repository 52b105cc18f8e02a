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
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import orjson
import polars as pl

from ep_trace import schema
from ep_trace.errors import TraceFormatError

__all__ = ["TABLE_NAMES", "write_parquet", "read_parquet", "input_key", "ingest", "load_trace_dir", "default_cache_dir"]

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
        tables.table(name).write_parquet(p, compression="zstd", statistics=True)  # type: ignore[arg-type]
        written.append(p)
    rep = out / _REPORT
    rep.write_bytes(orjson.dumps([asdict(i) for i in tables.load_report], option=orjson.OPT_INDENT_2))
    written.append(rep)
    man = dict(manifest or {})
    man.setdefault("tables", {n: tables.table(n).height for n in TABLE_NAMES})  # type: ignore[arg-type]
    (out / _MANIFEST).write_bytes(orjson.dumps(man, option=orjson.OPT_INDENT_2))
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
        df = pl.read_parquet(p)
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
        issues = tuple(schema.LoadIssue(**d) for d in orjson.loads(rep.read_bytes()))
    return schema.TraceTables(**frames, load_report=issues)  # type: ignore[arg-type]


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
    for f in _input_files(p):
        st = f.stat()
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
    except orjson.JSONDecodeError:
        return False


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
    key, files = input_key(path, {"format": format, "on_error": on_error, "rank_map": dict(rank_map or {})})
    if use_cache and _cached(out, key):
        log.info("%s: unchanged since the last ingest; reusing %s", path, out)
        return read_parquet(out), True
    tables = read_trace_dir(path, format=format, on_error=on_error, progress=progress, rank_map=rank_map, jobs=jobs)
    write_parquet(
        tables, out, {"ep_trace_version": __version__, "input_key": key, "source": str(path), "inputs": files}
    )
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
    if _cached(entry, key):
        return read_parquet(entry)
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

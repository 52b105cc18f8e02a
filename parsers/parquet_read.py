"""Reading an ingest output directory back (either layout); no dependency on the readers, so that
:mod:`ep_trace.parsers.dispatch` can accept such a directory without an import cycle with
:mod:`ep_trace.parsers.parquet_io` (which writes them)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import polars as pl

from ep_trace import schema
from ep_trace.errors import TraceFormatError

__all__ = ["TABLE_NAMES", "is_ingest_dir", "read_parquet", "table_files"]

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


def is_ingest_dir(path: str | Path) -> bool:
    """True for a complete ``ep-trace ingest`` output directory (or cache entry)."""
    p = Path(path)
    return p.is_dir() and (p / _MANIFEST).is_file() and _has_tables(p)


def _has_tables(out: Path) -> bool:
    return all((out / name).is_dir() or (out / f"{name}.parquet").is_file() for name in TABLE_NAMES)


def table_files(out_dir: str | Path, name: str) -> list[Path]:
    """The Parquet files of one table of an ingest directory, in rank-file order (either layout).

    Raises:
        TraceFormatError: the table is missing."""
    out = Path(out_dir)
    if (out / name).is_dir():
        return sorted((out / name).glob("part-*.parquet"))
    if (out / f"{name}.parquet").is_file():
        return [out / f"{name}.parquet"]
    raise TraceFormatError(out / name, "missing table file", "re-run ep-trace ingest into this directory")


def read_parquet(out_dir: str | Path, lazy_events: bool = False) -> schema.TraceTables:
    """Read a directory written by :func:`write_parquet` back into validated tables.

    Args:
        out_dir: The ingest directory (or cache entry).
        lazy_events: Leave the events on disk: ``TraceTables.events_scan`` is a lazy scan of the
            ``events/`` partitions (``events`` empty), each partition read and checked here one at a
            time (schema, ranges), so memory holds one partition at most. Directories of an older
            layout are read in memory as without it.

    Raises:
        TraceFormatError: a table file is missing or does not match the canonical schema.
    """
    out = Path(out_dir)
    frames = {}
    scan = None
    for name in TABLE_NAMES:
        files = table_files(out, name)
        if lazy_events and name == "events" and (out / name).is_dir():
            scan = _scan_events(files)
            if scan is not None:
                frames[name] = schema.empty("events")
                continue
        p = files[0] if len(files) == 1 else out / name
        df = pl.concat([_read_one(f) for f in files], how="vertical") if files else schema.empty(name)  # type: ignore[arg-type]
        # conform first: directories written before a layout change (e.g. kind as String) still read
        if set(df.columns) >= set(schema.SCHEMAS[name]):  # type: ignore[index]
            try:
                df = schema.conform(name, df)  # type: ignore[arg-type]
            except pl.exceptions.PolarsError:
                pass  # validate names the mismatch
        frames[name] = schema.validate(name, df, str(p))  # type: ignore[arg-type]
    # what merge_tables does to in-memory parts: ranks by rank, placement rows once
    frames["ranks"] = frames["ranks"].sort("rank")
    frames["placement"] = frames["placement"].unique(maintain_order=True)
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
    if scan is None:
        return tables
    for f in table_files(out, "events"):  # the same checks, one partition in memory at a time
        part = schema.validate("events", _read_one(f), str(f))
        check_tables(str(f), replace(tables, events=part))
        del part
    return replace(tables, events_scan=scan)


def _scan_events(files: list[Path]) -> pl.LazyFrame | None:
    """A lazy scan of the events partitions; ``None`` when some partition has another layout (read it
    in memory, conformed)."""
    for f in files:
        try:
            got = pl.read_parquet_schema(f)
        except Exception:  # noqa: BLE001 - a damaged file: the in-memory read names it
            return None
        if dict(got) != dict(schema.EVENTS):
            return None
    if not files:
        return schema.empty("events").lazy()
    return pl.scan_parquet(files, schema=schema.EVENTS)


def _read_one(p: Path) -> pl.DataFrame:
    """One Parquet file; a truncated or damaged one is the one-line error naming it."""
    try:
        return pl.read_parquet(p)
    except OSError as exc:
        from ep_trace.parsers.validate import os_error

        raise os_error(p, exc) from None
    except Exception as exc:  # noqa: BLE001 - polars' errors on a truncated / damaged file
        raise TraceFormatError(
            p,
            f"damaged Parquet file ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})",
            "re-run ep-trace ingest into this directory (--no-cache)",
        ) from None

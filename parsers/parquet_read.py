"""Reading an ingest output directory back (either layout); no dependency on the readers, so that
:mod:`ep_trace.parsers.dispatch` can accept such a directory without an import cycle with
:mod:`ep_trace.parsers.parquet_io` (which writes them)."""

from __future__ import annotations

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


def read_parquet(out_dir: str | Path) -> schema.TraceTables:
    """Read a directory written by :func:`write_parquet` back into validated tables.

    Raises:
        TraceFormatError: a table file is missing or does not match the canonical schema.
    """
    out = Path(out_dir)
    frames = {}
    for name in TABLE_NAMES:
        files = table_files(out, name)
        p = files[0] if len(files) == 1 else out / name
        df = pl.concat([pl.read_parquet(f) for f in files], how="vertical") if files else schema.empty(name)  # type: ignore[arg-type]
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
        issues = tuple(schema.LoadIssue(**d) for d in orjson.loads(rep.read_bytes()))
    return schema.TraceTables(**frames, load_report=issues)  # type: ignore[arg-type]

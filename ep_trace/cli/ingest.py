"""`ep-trace ingest DIR -o OUT`: trace directory -> one Parquet file per canonical table.

``OUT`` also serves as the cache: re-running on an unchanged directory (same files, sizes and
mtimes) reuses ``OUT`` without parsing (see :mod:`ep_trace.parsers.parquet_io`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ep_trace.cli.app import app, console
from ep_trace.errors import ConfigError

__all__ = ["ingest_cmd"]


@app.command("ingest")
def ingest_cmd(
    trace_dir: Path = typer.Argument(
        ...,
        help="Trace directory (or one file): rank*.pt.trace.json[.gz], *.sqlite / *.nsys-rep, *.ep-events.parquet, with optional rank*.ep.jsonl sidecars.",
    ),
    out: Path = typer.Option(
        ..., "-o", "--out", help="Output directory: <table>.parquet per table, load_report.json, manifest.json."
    ),
    fmt: str = typer.Option("auto", "--format", help="Input format: auto (per file), kineto, nsys or cupti."),
    keep_going: bool = typer.Option(
        False, "--keep-going", help="Skip unreadable ranks (listed in load_report.json) instead of stopping."
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Parse again even if OUT holds the tables of the unchanged inputs."
    ),
    jobs: int = typer.Option(
        1, "-j", "--jobs", help="Rank files read at once, one worker process each (memory grows with it)."
    ),
    rank_map: Optional[list[str]] = typer.Option(
        None,
        "--rank-map",
        help="Rank of a file: R=PATH, pid:PID=R (nsys file with several processes) or a file of such lines; repeatable. Beats every rank found in the files.",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print nothing on success."),
) -> None:
    """Convert a trace directory into Parquet tables (ranks, events, collectives, routing_*, placement, stages).

    Examples:
      ep-trace ingest demo_traces -o demo_tables
      duckdb -c "select rank, count(*) from 'demo_tables/events.parquet' group by rank"
    """
    from ep_trace.cli import printable
    from ep_trace.cli.analyze import progress_bar
    from ep_trace.cli.rank_map import parse_rank_map
    from ep_trace.parsers.dispatch import check_format
    from ep_trace.parsers.parquet_io import ingest

    check_format(fmt)
    if jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {jobs}")
    with progress_bar(not quiet) as progress:
        tables, cached = ingest(
            trace_dir,
            out,
            format=fmt,
            on_error="skip" if keep_going else "raise",  # type: ignore[arg-type]
            progress=progress,
            use_cache=not no_cache,
            jobs=jobs,
            rank_map=parse_rank_map(rank_map),
        )
    if quiet:
        return
    how = "reused (inputs unchanged)" if cached else "written"
    console.print(
        f"{printable(str(out))}: {how}: {tables.ranks.height} ranks, {tables.events.height} events, "
        f"{tables.collectives.height} collectives, {tables.routing_matrix.height} routing-matrix rows",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for issue in tables.load_report:
        line = printable(f"  {issue.level}: {issue.file}: {issue.message}")
        console.print(line, markup=False, highlight=False, soft_wrap=True)

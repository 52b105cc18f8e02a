"""`ep-trace ingest DIR -o OUT`: trace directory -> one Parquet file per canonical table.

``OUT`` also serves as the cache: re-running on an unchanged directory (same files, sizes, mtimes,
ctimes and inodes) reuses ``OUT`` without parsing (see :mod:`ep_trace.parsers.cache_key`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ep_trace.cli.app import app, console

__all__ = ["ingest_cmd"]


def _writes() -> tuple[str, ...]:
    """What ``ingest -o OUT`` writes or replaces in OUT (parsers/parquet_io.py: ``_clear_tables``, ``_finish``)."""
    from ep_trace.parsers.parquet_read import TABLE_NAMES

    tables = tuple(n for t in TABLE_NAMES for n in (t, f"{t}.parquet"))
    return (*tables, "_splits", "load_report.json", "manifest.json")


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
        1,
        "-j",
        "--jobs",
        help="Cores to use: worker processes at most for reading rank files (fewer when the files are too small to repay one), and polars threads.",
    ),
    engine: str = typer.Option("local", "--engine", help="Where rank files are decoded: local or ray (docs/scale.md)."),
    address: Optional[str] = typer.Option(
        None, "--address", help="Ray cluster address for --engine ray (default: RAY_ADDRESS or a new local Ray)."
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
    from ep_trace.cli.analyze import engine_executor, progress_bar
    from ep_trace.parsers.polars_threads import configure_threads

    configure_threads(jobs)  # before anything loads polars: --jobs N is N cores (parsers/polars_threads.py)
    from ep_trace.cli.output_guard import Output, check_outputs
    from ep_trace.cli.rank_map import parse_rank_map
    from ep_trace.parsers.dispatch import check_format
    from ep_trace.parsers.parquet_io import ingest_to

    check_format(fmt)
    check_outputs([trace_dir], Output("-o", out, directory=True, writes=_writes()))
    with progress_bar(not quiet) as progress, engine_executor(engine, jobs, address) as executor:
        res = ingest_to(
            trace_dir,
            out,
            format=fmt,  # type: ignore[arg-type]
            on_error="skip" if keep_going else "raise",
            progress=progress,
            use_cache=not no_cache,
            jobs=jobs,
            rank_map=parse_rank_map(rank_map),
            executor=executor,
        )
    if quiet:
        return
    how = "reused (inputs unchanged)" if res.from_cache else "written"
    rows = res.rows
    console.print(
        f"{printable(str(out))}: {how}: {rows.get('ranks', 0)} ranks, {rows.get('events', 0)} events, "
        f"{rows.get('collectives', 0)} collectives, {rows.get('routing_matrix', 0)} routing-matrix rows",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for issue in res.load_report:
        line = printable(f"  {issue.level}: {issue.file}: {issue.message}")
        console.print(line, markup=False, highlight=False, soft_wrap=True)

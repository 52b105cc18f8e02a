"""`ep-trace annotate`: each rank's original trace plus EP stages, barrier wait, exposed comm,
critical path and finding tracks (Perfetto / chrome://tracing / HTA)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

import typer

from ep_trace.cli.app import app, console

__all__ = ["annotate_cmd"]


class _Originals(Mapping[int, Any]):
    """rank -> the rank's original Kineto document, read when it is written (one file in memory at a time)."""

    def __init__(self, files: dict[int, Path]) -> None:
        self._files = files

    def __getitem__(self, rank: int) -> Any:
        from ep_trace.parsers.kineto_original import read_original

        return read_original(self._files[rank])

    def __iter__(self) -> Iterator[int]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def original_files(ranks: Any) -> dict[int, Path]:
    """rank -> source file of the ranks read from Kineto JSON (one file per rank), from ``tables.ranks``."""
    kineto = ranks.filter(ranks["format"] == "kineto")
    counts = kineto["source_file"].value_counts()
    single = set(counts.filter(counts["count"] == 1)["source_file"].to_list())
    return {int(r): Path(f) for r, f in zip(kineto["rank"], kineto["source_file"], strict=True) if f in single}


@app.command("annotate")
def annotate_cmd(
    trace_dir: Path = typer.Argument(..., help="Trace directory (or file): Kineto and/or Nsight, as for 'analyze'."),
    out: Path = typer.Option(
        ..., "-o", "--out", help="Directory to write rank{r}.ep-annotated.json.gz into (not the input directory)."
    ),
    fmt: str = typer.Option("auto", "--format", help="Input format: auto, kineto or nsys."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Skip unreadable ranks instead of stopping."),
    rank_map: Optional[list[str]] = typer.Option(
        None,
        "--rank-map",
        help="Rank of a file: R=PATH, pid:PID=R (nsys file with several processes) or a file of such lines; repeatable. Beats every rank found in the files.",
    ),
    cache: bool = typer.Option(
        True,
        "--cache/--no-cache",
        help="Reuse the parsed tables of an unchanged trace directory, as 'analyze' does; --no-cache always parses (into a scratch directory removed on exit) and keeps no cache.",
    ),
) -> None:
    """Write per-rank Chrome/Perfetto traces: the original trace unchanged plus ep-trace tracks.

    Kineto inputs keep every original event, flow and metadata record and their timestamps; Nsight
    inputs become a Chrome trace of their events. Extra tracks (process "ep-trace analysis"):
    findings (search F1, F2 ...), critical path, EP stages, communication, barrier wait, wait-free
    transfer and exposed (not overlapped) communication. Open the files in https://ui.perfetto.dev.

    Examples:

      ep-trace annotate demo_traces -o annotated/

      ep-trace annotate run.sqlite --format nsys -o annotated/
    """
    from ep_trace import load
    from ep_trace.cli.analyze import check_format, events_home, progress_bar
    from ep_trace.cli.output_guard import Output, check_outputs
    from ep_trace.cli.outputs import write_annotated
    from ep_trace.cli.rank_map import parse_rank_map

    # rank{r}.ep-annotated.json.gz: named like a trace, refused inside the input directory
    check_outputs([trace_dir], Output("-o", out, directory=True, writes=("rank0.ep-annotated.json.gz",)))
    with contextlib.ExitStack() as scratch, progress_bar() as progress:
        analysis = load(
            trace_dir,
            format=check_format(fmt),  # type: ignore[arg-type]
            on_error="skip" if keep_going else "raise",
            progress=progress,
            rank_map=parse_rank_map(rank_map),
            cache=events_home(scratch, cache),  # one rank in memory at a time
        )
        originals = _Originals(original_files(analysis.tables.ranks))
        paths = write_annotated(analysis, out, progress=progress, originals=originals)
    from ep_trace.cli import printable

    console.print(
        f"wrote {len(paths)} annotated trace(s) to {printable(str(out))} (open in https://ui.perfetto.dev)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )

"""`ep-trace annotate`: per-rank Perfetto traces with EP stages, barrier wait and exposed comm tracks."""

from __future__ import annotations

from pathlib import Path

import typer

from ep_trace.cli.app import app, console
from ep_trace.errors import ConfigError

__all__ = ["annotate_cmd"]


@app.command("annotate")
def annotate_cmd(
    trace_dir: Path = typer.Argument(..., help="Trace directory (or file): Kineto and/or Nsight, as for 'analyze'."),
    out: Path = typer.Option(
        ..., "-o", "--out", help="Directory to write rank{r}.ep-annotated.json.gz into (not the input directory)."
    ),
    fmt: str = typer.Option("auto", "--format", help="Input format: auto, kineto or nsys."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Skip unreadable ranks instead of stopping."),
) -> None:
    """Write per-rank Chrome/Perfetto traces: the original events plus ep-trace tracks.

    Extra tracks (process "ep-trace analysis"): EP stages, communication, barrier wait,
    wait-free transfer and exposed (not overlapped) communication. Open the files in
    https://ui.perfetto.dev.

    Examples:

      ep-trace annotate demo_traces -o annotated/

      ep-trace annotate run.sqlite --format nsys -o annotated/
    """
    from ep_trace import load
    from ep_trace.cli.analyze import check_format, progress_bar
    from ep_trace.reports.annotate import write_annotated_traces

    src = trace_dir if trace_dir.is_dir() else trace_dir.parent
    if out.resolve() == src.resolve():
        raise ConfigError(
            f"-o: {out} is the input directory; annotated traces there would be read as extra ranks next time, choose another directory"
        )
    with progress_bar() as progress:
        analysis = load(
            trace_dir, format=check_format(fmt), on_error="skip" if keep_going else "raise", progress=progress
        )  # type: ignore[arg-type]
        paths = write_annotated_traces(analysis, out, progress=progress)
    console.print(
        f"wrote {len(paths)} annotated trace(s) to {out} (open in https://ui.perfetto.dev)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )

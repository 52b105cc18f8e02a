"""The typer application object shared by the command modules."""

from __future__ import annotations

import typer
from rich.console import Console

__all__ = ["app", "console", "err_console"]

app = typer.Typer(
    name="ep-trace",
    help="Where the time of an expert-parallel MoE layer goes, on which rank, and why.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """ep-trace: per-stage, per-rank time of expert-parallel MoE layers, and why.

    Examples:
      ep-trace demo --out demo_traces
      ep-trace analyze demo_traces -o report.html --json summary.json
    """

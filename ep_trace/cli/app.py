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


def _version(value: bool) -> None:
    if value:
        from ep_trace import __version__

        console.print(f"ep-trace {__version__}", markup=False, highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the ep-trace version and exit."
    ),
) -> None:
    """ep-trace: per-stage, per-rank time of expert-parallel MoE layers, and why.

    Examples:
      ep-trace demo --out demo_traces
      ep-trace analyze demo_traces -o report.html --json summary.json
    """

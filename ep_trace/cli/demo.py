"""`ep-trace demo` (placeholder until the workload lands)."""
from __future__ import annotations

from ep_trace.cli.app import app


@app.command()
def version() -> None:
    """Print the ep-trace version."""
    from ep_trace import __version__
    from ep_trace.cli.app import console

    console.print(__version__)

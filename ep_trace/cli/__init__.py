"""The ``ep-trace`` command line: thin typer wrappers over library functions.

Errors are mapped to exit codes in exactly one place, :func:`main`: 0 ok, 1 nothing to analyze,
2 bad input (any :class:`~ep_trace.errors.EpTraceError` carries its code). Each command lives in its
own module and registers itself on :data:`app`.
"""

from __future__ import annotations

import logging
import sys

from ep_trace.cli.app import app, err_console

__all__ = ["app", "main"]


def _register() -> None:
    # Importing a command module registers its commands on `app`.
    from importlib import import_module

    for mod in ("demo", "ingest", "analyze", "compare", "annotate"):
        try:
            import_module(f"ep_trace.cli.{mod}")
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name != f"ep_trace.cli.{mod}":
                raise


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the process exit code."""
    from ep_trace.errors import EpTraceError

    logging.basicConfig(level=logging.WARNING, format="ep-trace: %(levelname)s: %(message)s")
    try:
        app(args=argv, standalone_mode=False)
    except EpTraceError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted", markup=False)
        code = 130
    except SystemExit as exc:  # typer.Exit / click usage errors raised inside commands
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:
        # Usage errors, Exit and Abort come from click, which recent typer versions vendor
        # (typer._click): recognise them by shape, not by import.
        exit_code = getattr(exc, "exit_code", None)
        if type(exc).__name__ == "Abort":
            code = 130
        elif callable(getattr(exc, "show", None)):
            getattr(exc, "show")()  # noqa: B009 - click usage error: prints "Usage: ... Error: ..." to stderr
            code = exit_code if isinstance(exit_code, int) else 2
        elif isinstance(exit_code, int):
            code = exit_code
        else:
            raise
    else:
        code = 0
    if argv is None:
        sys.exit(code)
    return code

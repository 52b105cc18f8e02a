"""The ``ep-trace`` command line: thin typer wrappers over library functions.

Errors are mapped to exit codes in exactly one place, :func:`main`: 0 ok, 1 nothing to analyze,
2 bad input (any :class:`~ep_trace.errors.EpTraceError` carries its code); 3 is a result, not an error
(:class:`~ep_trace.errors.RegressionFound`: ``compare --fail-on-regression`` exits with it). Each command lives in its
own module and registers itself on :data:`app`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ep_trace.cli.app import app, err_console

__all__ = ["app", "main", "printable"]


def _register() -> None:
    # Importing a command module registers its commands on `app`.
    from importlib import import_module

    for mod in ("demo", "ingest", "analyze", "compare", "annotate", "sweep"):
        try:
            import_module(f"ep_trace.cli.{mod}")
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name != f"ep_trace.cli.{mod}":
                raise


_register()


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}
_CONTROL.update({0x9B: "\\x9b"})  # the one-byte CSI of 8-bit terminals


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``), so a file name cannot drive the terminal.

    File names and trace strings reach error and warning lines verbatim; an escape sequence in one
    (``\\x1b]0;...`` retitles the window, ``\\x1b[2J`` clears it) must print as text.
    """
    return text.translate(_CONTROL)


class _EscapingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def _plain_flags(command: object) -> None:
    """Boolean flags show no ``<bool>`` value in ``--help`` (typer 0.29 prints one for every flag,
    which invites ``--keep-going true``; a flag takes no value)."""
    for param in getattr(command, "params", ()):
        if getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
            param.metavar = ""
    get_help = getattr(command, "get_help_option", None)
    if get_help is not None and not getattr(get_help, "_plain", False):

        def help_option(ctx: object, _get: Any = get_help) -> Any:
            opt = _get(ctx)
            if opt is not None:
                opt.metavar = ""
            return opt

        help_option._plain = True  # type: ignore[attr-defined]
        command.get_help_option = help_option  # type: ignore[attr-defined]
    for sub in getattr(command, "commands", {}).values():
        _plain_flags(sub)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the process exit code.

    0 ok, 1 nothing to analyze, 2 bad input or unwritable output (one line: ``error: ...``),
    3 a regression (``compare --fail-on-regression``; one line: ``regression: ...``), 130 interrupted (Ctrl-C; outputs are written atomically, so none is left half-written).
    """
    import typer.main

    from ep_trace.errors import EpTraceError

    handler = logging.StreamHandler()
    handler.setFormatter(_EscapingFormatter("ep-trace: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    command = typer.main.get_command(app)
    _plain_flags(command)
    try:
        rv = command.main(args=argv, standalone_mode=False)
    except EpTraceError as exc:
        err_console.print(f"error: {printable(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:  # typer.Exit / click usage errors raised inside commands
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:
        # Usage errors, Exit and Abort come from click, which recent typer versions vendor
        # (typer._click): recognise them by shape, not by import.
        exit_code = getattr(exc, "exit_code", None)
        if type(exc).__name__ == "Abort":
            code = 130
        elif callable(show := getattr(exc, "show", None)):
            show()  # prints "Usage: ... Error: ..." to stderr
            code = exit_code if isinstance(exit_code, int) else 2
        elif isinstance(exit_code, int):
            code = exit_code
        else:
            raise
    else:
        # standalone_mode=False: typer turns Ctrl-C into a *returned* 130 (typer/core.py _main:
        # `except KeyboardInterrupt: raise Exit(130)`, then `return e.exit_code`), and typer.Exit(n)
        # raised by a command comes back the same way; a command's own return value is None.
        code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
    if code == 130:
        err_console.print("interrupted", markup=False, highlight=False)
    if argv is None:
        sys.exit(code)
    return code

"""The ``ep-trace`` command line: thin typer wrappers over library functions.

Errors are mapped to exit codes in exactly one place, :func:`main`: 0 ok, 1 nothing to analyze,
2 bad input (any :class:`~ep_trace.errors.EpTraceError` carries its code); 3 is a result, not an error
(:class:`~ep_trace.errors.RegressionFound`: ``compare --fail-on-regression`` exits with it). Each command lives in its
own module and registers itself on :data:`app`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ep_trace.cli.app import app, err_console
from ep_trace.cli.safe_text import printable

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


def _usage_line(exc: Any) -> str:
    """A click / typer usage error as one printable line: ``ep-trace analyze: <message>; see 'ep-trace
    analyze --help'``."""
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) or "ep-trace"
    message = " ".join(str(exc.format_message()).split()).rstrip(".") or type(exc).__name__
    return printable(f"{path}: {message}; see '{path} --help'")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the process exit code.

    0 ok, 1 nothing to analyze, 2 bad input, an unwritable output, an output on an input or a usage
    error (one line: ``error: ...``, control characters escaped), 3 a regression (``compare
    --fail-on-regression``; one line: ``regression: ...``), 130 interrupted (Ctrl-C; outputs are written
    atomically, so none is left half-written).
    """
    import typer.main

    from ep_trace.errors import EpTraceError

    handler = logging.StreamHandler()
    handler.setFormatter(_EscapingFormatter("ep-trace: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    command = typer.main.get_command(app)
    _plain_flags(command)
    try:
        rv = command.main(args=argv, prog_name="ep-trace", standalone_mode=False)
    except EpTraceError as exc:
        err_console.print(f"error: {printable(str(exc))}", markup=False, highlight=False, soft_wrap=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:  # typer.Exit / click usage errors raised inside commands
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except BrokenPipeError:  # `ep-trace ... | head`: the reader left; nothing more to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        code = 1
    except OSError as exc:  # an OS error no check caught (a path the OS refuses): one line, not a traceback
        where = f"{exc.filename}: " if exc.filename is not None else ""
        err_console.print(
            f"error: {printable(f'{where}{exc.strerror or exc}; check the path, its permissions and the free space')}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        code = 2
    except Exception as exc:
        # Usage errors, Exit and Abort come from click, which recent typer versions vendor
        # (typer._click): recognise them by shape, not by import.
        exit_code = getattr(exc, "exit_code", None)
        if type(exc).__name__ == "Abort":
            code = 130
        elif type(exc).__name__ == "NoArgsIsHelpError":
            code = 0  # a bare `ep-trace`: typer printed the help, which is what was asked for
        elif callable(getattr(exc, "format_message", None)):
            # one line, like our own errors (click's show() prints "Usage: ...", "Try ...", "Error: ...")
            err_console.print(f"error: {_usage_line(exc)}", markup=False, highlight=False, soft_wrap=True)
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

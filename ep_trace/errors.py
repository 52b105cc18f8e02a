"""The one error hierarchy of ep-trace.

Every error a user can cause derives from :class:`EpTraceError` and carries the process exit code
the CLI maps it to (in one place: ``ep_trace.cli.main``). Messages are one line and name the file,
the record and the fix; tests pin them word for word.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "EpTraceError",
    "BadInputError",
    "TraceFormatError",
    "RankConflictError",
    "ConfigError",
    "MissingDependencyError",
    "NothingToAnalyzeError",
    "OutputError",
    "ResourceLimitError",
]


class EpTraceError(Exception):
    """Base class of every ep-trace error; ``exit_code`` is what the CLI exits with."""

    exit_code: int = 2


class BadInputError(EpTraceError):
    """The input (a trace, a sidecar, an option) cannot be used. Exit code 2."""

    exit_code = 2


class TraceFormatError(BadInputError):
    """A trace file is unreadable or malformed.

    The message is ``"<file>: <record>: <problem>; <fix>"`` (the record part is omitted when the
    whole file is at fault), always on one line.

    Args:
        path: The offending file.
        problem: What is wrong, e.g. ``"negative duration (dur=-3)"``.
        fix: What the user should do, e.g. ``"re-export the trace"``.
        record: Where in the file, e.g. ``"traceEvents[17]"``; ``None`` for the whole file.
    """

    def __init__(self, path: str | Path, problem: str, fix: str, record: str | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        self.record = record
        where = f"{self.path}: {record}" if record else self.path
        super().__init__(" ".join(f"{where}: {problem}; {fix}".split()))


class RankConflictError(BadInputError):
    """Files of one directory disagree: duplicate ranks, world sizes, or different jobs."""


class ConfigError(BadInputError):
    """A bad option or knob. The message names the option, e.g. ``"--top-k: 9 > --experts 8"``."""


class MissingDependencyError(EpTraceError):
    """An optional dependency (torch, hta, nsys, cupti-python) is needed but absent. Exit code 2."""

    exit_code = 2


class NothingToAnalyzeError(EpTraceError):
    """The input was readable but holds nothing to analyze (no events, no steps). Exit code 1."""

    exit_code = 1


class OutputError(EpTraceError):
    """An output (``-o``, ``--json``, an ingest directory) cannot be written or is locked. Exit code 2."""

    exit_code = 2


class ResourceLimitError(TraceFormatError):
    """An input exceeds a resource cap (decompressed size, nesting depth, string length). Exit code 2.

    The ``fix`` names the setting that raises the cap (e.g. ``EP_TRACE_MAX_INFLATE_BYTES``).
    """

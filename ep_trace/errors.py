"""The one error hierarchy of ep-trace, and the one place for its exit codes.

Every error a user can cause derives from :class:`EpTraceError` and carries the process exit code
the CLI maps it to (in one place: ``ep_trace.cli.main``). Messages are one line and name the file,
the record and the fix; tests pin them word for word. The one non-error exit code, 3, is a result:
:class:`RegressionFound` (``ep-trace compare --fail-on-regression``, the CI gate).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

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
    "RegressionFound",
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


@dataclass(frozen=True)
class RegressionFound:
    """The CI gate's failing verdict: NEW is worse than BASE on a gated metric. Exit code 3.

    Not an exception: the comparison itself succeeded. ``ep-trace compare --fail-on-regression`` writes
    its outputs, prints :attr:`verdict` on stderr as ``regression: <verdict>`` (no ``error:`` line, no
    traceback) and exits with :attr:`exit_code`.

    Attributes:
        metrics: The failed metrics (``step_time``, ``stage:expert``, ``finding:straggler_wait``, ...).
        verdict: One sentence naming them, their change, the noise rule and the threshold.
    """

    metrics: tuple[str, ...]
    verdict: str
    exit_code: ClassVar[int] = 3

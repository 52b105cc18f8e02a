"""Analyze layer: pure functions over the canonical tables (no torch, no parser internals)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.result import Analysis, Finding

if TYPE_CHECKING:
    from ep_trace.schema import TraceTables

__all__ = ["analyze", "Analysis", "AnalysisConfig", "Finding"]


def analyze(
    tables: TraceTables, config: AnalysisConfig | None = None, progress: Callable[[str, int, int], None] | None = None
) -> Analysis:
    """Run every analysis over ``tables``; see :mod:`ep_trace.analysis.engine` and docs/metrics.md.

    Args:
        tables: Canonical tables of one trace set (``ep_trace.parsers.read_trace_dir``).
        config: Analysis knobs (defaults when ``None``).
        progress: Optional ``progress(stage, done, total)`` callback.

    Returns:
        The frozen :class:`Analysis` (all times int64 ns).
    """
    from ep_trace.analysis.engine import analyze as _analyze

    return _analyze(tables, config or AnalysisConfig(), progress=progress)

"""Analyze layer: pure functions over the canonical tables (no torch, no parser internals)."""

from __future__ import annotations

from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["analyze", "Analysis", "AnalysisConfig", "Finding"]


def analyze(tables, config: AnalysisConfig | None = None, progress=None) -> Analysis:  # noqa: ANN001
    """Run every analysis over ``tables``; see :mod:`ep_trace.analysis.engine`."""
    from ep_trace.analysis.engine import analyze as _analyze

    return _analyze(tables, config or AnalysisConfig(), progress=progress)

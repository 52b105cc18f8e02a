"""ep-trace: where the time of an expert-parallel MoE layer goes, on which rank, and why.

Capture (needs torch): :class:`Tracer`, :func:`stage`, :func:`record_routing`.
Ingest (no torch): :func:`read_trace_dir` (``ep_trace.parsers``).
Analyze (no torch): :func:`analyze` (``ep_trace.analysis``).

Names are resolved lazily so that ``import ep_trace`` never imports torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ep_trace import allocator as _allocator

# Before any ep_trace module imports polars: jemalloc reads its options when polars loads.
_allocator.configure()

__version__ = "0.1.0"

_LAZY = {
    "Tracer": "ep_trace.capture",
    "stage": "ep_trace.stages",
    "record_routing": "ep_trace.routing",
    "record_a2a": "ep_trace.routing",
    "read_trace_dir": "ep_trace.parsers",
    "analyze": "ep_trace.analysis",
    "AnalysisConfig": "ep_trace.analysis",
    "Analysis": "ep_trace.analysis",
    "TraceTables": "ep_trace.schema",
    "EpTraceError": "ep_trace.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'ep_trace' has no attribute {name!r}")
    return getattr(import_module(mod), name)

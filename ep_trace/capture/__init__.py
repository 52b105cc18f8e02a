"""Capture layer: trace a training or serving step (needs torch, imported on first use).

* :class:`~ep_trace.capture.tracer.Tracer` -- context manager around ``torch.profiler`` (or the
  CUPTI collector) that writes ``rank{r}.pt.trace.json.gz`` and the sidecar ``rank{r}.ep.jsonl``;
* :func:`~ep_trace.capture.stages.stage` -- a named EP stage range seen by Kineto and NVTX;
* :func:`~ep_trace.capture.routing.record_routing` / :func:`~ep_trace.capture.routing.record_a2a`
  -- exact per-expert counts and full all-to-all split lists, into the sidecar;
* :mod:`~ep_trace.capture.sidecar` -- the sidecar writer; :mod:`~ep_trace.capture.cupti` -- the
  CUPTI collector.

Capture writes a trace directory (file names in :mod:`ep_trace.trace_files`); it never imports the
ingest, analysis or present layers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ep_trace.capture.routing import record_a2a, record_routing
    from ep_trace.capture.stages import stage
    from ep_trace.capture.tracer import Tracer

__all__ = ["Tracer", "record_a2a", "record_routing", "stage"]

_LAZY = {
    "Tracer": "ep_trace.capture.tracer",
    "stage": "ep_trace.capture.stages",
    "record_routing": "ep_trace.capture.routing",
    "record_a2a": "ep_trace.capture.routing",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'ep_trace.capture' has no attribute {name!r}")
    return getattr(import_module(mod), name)

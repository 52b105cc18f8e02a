"""Ingest layer: trace formats -> canonical tables (``ep_trace.schema``). Never imports torch.

One module per input format, each exposing ``read_<format>(path)``; :func:`read_trace_dir`
detects the format of every file of a directory and dispatches.
"""

from __future__ import annotations

from ep_trace.parsers.kineto import read_kineto

__all__ = ["read_kineto"]

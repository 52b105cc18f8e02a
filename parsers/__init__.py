"""Ingest layer: trace formats -> canonical tables (``ep_trace.schema``). Never imports torch.

One module per input format, each exposing ``read_<format>(path)``; :func:`read_trace_dir`
detects the format of every file of a directory and dispatches (Nsight and CUPTI readers are
imported lazily, only when such a file is present).

Public API:

* :func:`read_kineto` -- one Kineto rank file -> :class:`~ep_trace.schema.TraceTables`;
* :func:`read_trace_dir` -- a directory (any mix of formats + ``rank{r}.ep.jsonl`` sidecars);
* :func:`read_trace_dirs` -- several directories of one job (e.g. one per node), ranks disjoint;
* :func:`read_sidecar` / :func:`merge_sidecar` -- the ep-trace sidecar;
* :func:`write_parquet` / :func:`read_parquet` -- tables <-> one Parquet file per table;
* :func:`ingest` -- directory -> Parquet output, reusing it when the inputs are unchanged;
* :func:`load_trace_dir` -- ``read_trace_dir`` with a Parquet cache (``~/.cache/ep-trace``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ep_trace.parsers.dispatch import detect_format, discover, read_trace_dir, read_trace_dirs
    from ep_trace.parsers.kineto import read_kineto
    from ep_trace.parsers.parquet_io import default_cache_dir, ingest, load_trace_dir, read_parquet, write_parquet
    from ep_trace.parsers.sidecar import Sidecar, merge_sidecar, read_sidecar
    from ep_trace.schema import LoadIssue, TraceTables

__all__ = [
    "LoadIssue",
    "Sidecar",
    "TraceTables",
    "default_cache_dir",
    "detect_format",
    "discover",
    "ingest",
    "load_trace_dir",
    "merge_sidecar",
    "read_kineto",
    "read_parquet",
    "read_sidecar",
    "read_trace_dir",
    "read_trace_dirs",
    "write_parquet",
]

# Resolved on first use: ``import ep_trace`` imports ``ep_trace.parsers.allocator`` before polars
# loads (jemalloc reads its options then), so this package must not import polars eagerly.
_LAZY = {
    "detect_format": "ep_trace.parsers.dispatch",
    "discover": "ep_trace.parsers.dispatch",
    "read_trace_dir": "ep_trace.parsers.dispatch",
    "read_trace_dirs": "ep_trace.parsers.dispatch",
    "read_kineto": "ep_trace.parsers.kineto",
    "default_cache_dir": "ep_trace.parsers.parquet_io",
    "ingest": "ep_trace.parsers.parquet_io",
    "load_trace_dir": "ep_trace.parsers.parquet_io",
    "read_parquet": "ep_trace.parsers.parquet_io",
    "write_parquet": "ep_trace.parsers.parquet_io",
    "Sidecar": "ep_trace.parsers.sidecar",
    "merge_sidecar": "ep_trace.parsers.sidecar",
    "read_sidecar": "ep_trace.parsers.sidecar",
    "LoadIssue": "ep_trace.schema",
    "TraceTables": "ep_trace.schema",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'ep_trace.parsers' has no attribute {name!r}")
    return getattr(import_module(mod), name)

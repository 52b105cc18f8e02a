"""Ingest layer: trace formats -> canonical tables (``ep_trace.schema``). Never imports torch.

One module per input format, each exposing ``read_<format>(path)``; :func:`read_trace_dir`
detects the format of every file of a directory and dispatches (Nsight and CUPTI readers are
imported lazily, only when such a file is present).

Public API:

* :func:`read_kineto` -- one Kineto rank file -> :class:`~ep_trace.schema.TraceTables`;
* :func:`read_trace_dir` -- a directory (any mix of formats + ``rank{r}.ep.jsonl`` sidecars);
* :func:`read_sidecar` / :func:`merge_sidecar` -- the ep-trace sidecar;
* :func:`write_parquet` / :func:`read_parquet` -- tables <-> one Parquet file per table;
* :func:`ingest` -- directory -> Parquet output, reusing it when the inputs are unchanged;
* :func:`load_trace_dir` -- ``read_trace_dir`` with a Parquet cache (``~/.cache/ep-trace``).
"""

from __future__ import annotations

from ep_trace.parsers.dispatch import detect_format, discover, read_trace_dir
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
    "write_parquet",
]

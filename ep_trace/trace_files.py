"""The trace directory: file names and format versions shared by capture (writes) and ingest (reads).

A trace directory is the contract between the capture layer and the ingest layer; both import
these names from here, so neither imports the other:

* ``rank{r}.pt.trace.json.gz`` -- the standard Kineto trace of rank r (:func:`trace_path`);
* ``rank{r}.ep.jsonl`` -- the ep-trace sidecar, format docs/sidecar.md, version
  :data:`SIDECAR_VERSION` (:func:`sidecar_path`);
* ``rank{r}.ep-events.parquet`` -- canonical ``events`` rows of the CUPTI collector, footer key
  :data:`CUPTI_METADATA_KEY`, layout version :data:`CUPTI_FORMAT_VERSION` (:func:`events_path`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CUPTI_FILE_SUFFIX",
    "CUPTI_FORMAT_VERSION",
    "CUPTI_METADATA_KEY",
    "SIDECAR_VERSION",
    "events_path",
    "sidecar_path",
    "trace_path",
]

#: Version of the sidecar schema written (``"v"`` of every record).
SIDECAR_VERSION = 1
#: File name suffix the directory dispatcher routes to ``read_cupti``.
CUPTI_FILE_SUFFIX = ".ep-events.parquet"
#: Parquet footer key holding the CUPTI file's JSON metadata.
CUPTI_METADATA_KEY = b"ep_trace.cupti"
#: Version of the CUPTI file layout; readers reject newer versions.
CUPTI_FORMAT_VERSION = 1


def sidecar_path(out_dir: str | Path, rank: int) -> Path:
    """``<out_dir>/rank{rank}.ep.jsonl``."""
    return Path(out_dir) / f"rank{rank}.ep.jsonl"


def trace_path(out_dir: str | Path, rank: int) -> Path:
    """``<out_dir>/rank{rank}.pt.trace.json.gz``."""
    return Path(out_dir) / f"rank{rank}.pt.trace.json.gz"


def events_path(out_dir: str | Path, rank: int) -> Path:
    """``<out_dir>/rank{rank}.ep-events.parquet`` (beside the sidecar ``rank{rank}.ep.jsonl``)."""
    return Path(out_dir) / f"rank{rank}{CUPTI_FILE_SUFFIX}"

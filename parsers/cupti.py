"""Reader of ``rank{r}.ep-events.parquet`` files written by the CUPTI collector (``ep_trace.capture.cupti``).

The file already holds canonical ``events`` rows (see :mod:`ep_trace.capture.cupti.writer` for the layout),
so reading is: open the Parquet file, check the ep-trace footer metadata, validate the rows against
:data:`ep_trace.schema.EVENTS`, and build the ``ranks`` row from the footer. No cupti, no torch.

What a CUPTI file cannot give: host CPU ops (only CUDA API calls, ``stage()`` ranges and
``ProfilerStep#N`` ranges are recorded), hence no ``collectives`` rows; the collective calls, their
split lists and the routing counts come from the sidecar ``rank{r}.ep.jsonl`` merged by the
directory reader. A load-report warning says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from ep_trace.errors import TraceFormatError
from ep_trace.parsers.json_guard import check_json_text
from ep_trace.schema import LoadIssue, TraceTables, conform, empty, validate
from ep_trace.trace_files import CUPTI_FILE_SUFFIX as FILE_SUFFIX
from ep_trace.trace_files import CUPTI_FORMAT_VERSION as FORMAT_VERSION
from ep_trace.trace_files import CUPTI_METADATA_KEY as METADATA_KEY

__all__ = ["FILE_SUFFIX", "read_cupti", "is_cupti_file"]


def is_cupti_file(path: str | Path) -> bool:
    """True for file names the CUPTI collector writes (``*.ep-events.parquet``)."""
    return str(path).endswith(FILE_SUFFIX)


def _read_meta(path: Path, footer: dict[bytes, bytes] | None) -> dict[str, Any]:
    raw = (footer or {}).get(METADATA_KEY)
    if raw is None:
        raise TraceFormatError(
            path,
            "no ep-trace CUPTI metadata (footer key 'ep_trace.capture.cupti') in this Parquet file",
            "only files written by ep_trace.capture.cupti.CuptiCollector can be read as CUPTI events; "
            "rename other Parquet files so they do not end in '.ep-events.parquet'",
        )
    check_json_text(path, raw, events=False)  # (nesting depth, data after the object: json_guard)
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise TraceFormatError(
            path, f"footer key 'ep_trace.capture.cupti' is not JSON ({exc})", "re-run the capture"
        ) from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("rank"), int):
        raise TraceFormatError(
            path, "footer metadata has no integer 'rank'", "re-run the capture", record="ep_trace.cupti"
        )
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise TraceFormatError(
            path,
            f"CUPTI events format_version {version!r} is newer than this ep-trace reads ({FORMAT_VERSION})",
            "upgrade ep-trace to the version that captured the file",
            record="ep_trace.cupti",
        )
    return meta


def _ranks_row(path: Path, meta: dict[str, Any], events: pl.DataFrame) -> pl.DataFrame:
    row = {
        "rank": meta["rank"],
        "world_size": meta.get("world_size"),
        "host": meta.get("host"),
        "local_rank": meta.get("local_rank"),
        "device": meta.get("device"),
        "backend": meta.get("backend"),
        "source_file": str(path),
        "format": "cupti",
        "job_id": meta.get("job_id"),
        "trace_start_ns": events["start_ns"].min() if events.height else None,
        "trace_end_ns": events["end_ns"].max() if events.height else None,
        # The collector already converted CUPTI time to epoch ns (its measured offset is in the
        # footer as clock_offset_ns); no cross-host offset has been estimated yet.
        "clock_offset_ns": 0,
        "rank_source": "cupti_metadata",
        "has_sidecar": False,
        "torch_version": meta.get("torch_version"),
        "ep_trace_version": meta.get("ep_trace_version"),
    }
    return conform(
        "ranks", pl.DataFrame([row], schema_overrides={"trace_start_ns": pl.Int64, "trace_end_ns": pl.Int64})
    )


def read_cupti(path: str | Path) -> TraceTables:
    """Read one ``rank{r}.ep-events.parquet`` file into validated canonical tables.

    Args:
        path: The events file written by :class:`ep_trace.capture.cupti.collector.CuptiCollector`.

    Returns:
        :class:`~ep_trace.schema.TraceTables` with ``ranks`` (one row, ``format='cupti'``) and
        ``events``; ``collectives`` is empty (see the module docstring) and the load report says so.

    Raises:
        TraceFormatError: unreadable or truncated Parquet (e.g. the job died before the collector's
            ``stop()`` wrote the footer), missing / newer ep-trace metadata, rows that violate the
            canonical schema, or rows of another rank than the footer's.
    """
    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
        footer = pf.metadata.metadata
        table = pf.read()
    except FileNotFoundError as exc:
        raise TraceFormatError(path, "file not found", "check the path") from exc
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError with varying texts
        raise TraceFormatError(
            path,
            f"not a readable Parquet file ({type(exc).__name__}: {' '.join(str(exc).split())})",
            "re-run the capture; a job that dies before CuptiCollector.stop() leaves a file without its Parquet footer",
        ) from exc
    meta = _read_meta(path, footer)
    events = pl.from_arrow(table)
    assert isinstance(events, pl.DataFrame)
    if events.width == 0:
        events = empty("events")
    validate("events", events, str(path))
    wrong = events.filter(pl.col("rank") != meta["rank"])
    if wrong.height:
        raise TraceFormatError(
            path,
            f"{wrong.height} events carry rank {wrong['rank'][0]} but the footer says rank {meta['rank']}",
            "the file was modified after capture; re-run the capture",
            record="events",
        )
    issues = [
        LoadIssue(
            str(path),
            meta["rank"],
            "warning",
            "CUPTI capture records no host collective ops: collectives and split lists come from the sidecar only",
        )
    ]
    return TraceTables(
        ranks=_ranks_row(path, meta, events),
        events=events,
        collectives=empty("collectives"),
        load_report=tuple(issues),
    ).validate(str(path))

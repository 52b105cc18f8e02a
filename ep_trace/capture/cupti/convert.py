"""CUPTI activity records (as dicts) -> the canonical ``events`` table. Pure: polars only, no cupti.

The collector (:mod:`ep_trace.capture.cupti.collector`) copies every activity record it receives from
cupti-python into a plain dict whose keys are the cupti-python attribute names (snake case of the
CUPTI C struct members: ``CUpti_ActivityKernel9.correlationId`` -> ``correlation_id``), plus two
keys that CUPTI does not give and the collector adds:

* ``process_id`` on device records (kernel / memcpy / memset) and external-correlation records:
  CUPTI correlation ids are unique per process only, and device records carry no process id;
* ``name`` on runtime / driver records: the API function name resolved from ``cbid`` at capture time
  (``cupti.get_callback_name``), so reading never needs cupti.

Record layouts used (fields not listed are ignored):

===========================  ==========================================================================
``kind`` (CUpti_ActivityKind)  fields
===========================  ==========================================================================
3 KERNEL, 10 CONCURRENT_KERNEL  ``start, end, device_id, stream_id, correlation_id, name``
1 MEMCPY                     ``start, end, device_id, stream_id, correlation_id, copy_kind, src_kind,
                             dst_kind, bytes``
2 MEMSET                     ``start, end, device_id, stream_id, correlation_id, bytes, memory_kind``
4 DRIVER, 5 RUNTIME          ``start, end, cbid, process_id, thread_id, correlation_id`` (+ ``name``)
39 EXTERNAL_CORRELATION      ``external_kind, external_id, correlation_id`` (+ ``process_id``)
===========================  ==========================================================================

Host ranges recorded by the collector itself (``stage()`` ranges pushed as external correlation ids,
and one ``ProfilerStep#N`` range per step) are passed separately as dicts with ``name, start, end,
process_id, thread_id`` and optionally ``external_id`` (the id pushed while the range was open) and
``step``.

All times are CUPTI timestamps in ns; ``clock_offset_ns`` (epoch ns minus CUPTI ns, measured by the
collector) is added once so that the table holds epoch ns like every other source.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from ep_trace.schema import conform

__all__ = [
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "KIND_KERNEL",
    "KIND_DRIVER",
    "KIND_RUNTIME",
    "KIND_CONCURRENT_KERNEL",
    "KIND_EXTERNAL_CORRELATION",
    "EXTERNAL_KIND_EP_TRACE",
    "RAW_SCHEMA",
    "RANGE_SCHEMA",
    "records_to_events",
]

_log = logging.getLogger(__name__)

# CUpti_ActivityKind values (cupti_activity.h; stable since CUDA 10).
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_DRIVER = 4
KIND_RUNTIME = 5
KIND_CONCURRENT_KERNEL = 10
KIND_EXTERNAL_CORRELATION = 39

#: CUpti_ExternalCorrelationKind used by ep-trace: CUSTOM2 = 5. Kineto pushes CUSTOM0 (3, ops) and
#: CUSTOM1 (4, user annotations), so CUSTOM2 keeps ep-trace's ids apart when both run in one process.
EXTERNAL_KIND_EP_TRACE = 5

# CUpti_ActivityMemcpyKind / CUpti_ActivityMemoryKind names, spelled as Kineto spells them in its
# "Memcpy HtoD (Pinned -> Device)" event names (libkineto/src/output_base / CuptiActivity.cpp), so
# CUPTI and Kineto traces of the same job carry the same memcpy names.
_COPY_KIND = ["Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"]
_MEMORY_KIND = ["Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static"]

#: Columns read from the record dicts (the union of the layouts above), with their dtypes.
RAW_SCHEMA: dict[str, pl.DataType] = {
    "kind": pl.Int64(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "name": pl.Utf8(),
    "device_id": pl.Int64(),
    "stream_id": pl.Int64(),
    "correlation_id": pl.Int64(),
    "process_id": pl.Int64(),
    "thread_id": pl.Int64(),
    "cbid": pl.Int64(),
    "copy_kind": pl.Int64(),
    "src_kind": pl.Int64(),
    "dst_kind": pl.Int64(),
    "memory_kind": pl.Int64(),
    "bytes": pl.Int64(),
    "external_kind": pl.Int64(),
    "external_id": pl.Int64(),
}

#: Columns of the host ranges recorded by the collector.
RANGE_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.Utf8(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "process_id": pl.Int64(),
    "thread_id": pl.Int64(),
    "external_id": pl.Int64(),
    "step": pl.Int64(),
}

_KIND_TO_EVENT = {
    KIND_CONCURRENT_KERNEL: "gpu_kernel",
    KIND_KERNEL: "gpu_kernel",
    KIND_MEMCPY: "gpu_memcpy",
    KIND_MEMSET: "gpu_memset",
    KIND_RUNTIME: "runtime",
    KIND_DRIVER: "runtime",
}
# Kineto's 'cat' values for the same rows, so category-based code treats both sources alike.
_KIND_TO_CATEGORY = {
    KIND_CONCURRENT_KERNEL: "kernel",
    KIND_KERNEL: "kernel",
    KIND_MEMCPY: "gpu_memcpy",
    KIND_MEMSET: "gpu_memset",
    KIND_RUNTIME: "cuda_runtime",
    KIND_DRIVER: "cuda_driver",
}
_DEVICE_KINDS = (KIND_CONCURRENT_KERNEL, KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET)
_API_KINDS = (KIND_RUNTIME, KIND_DRIVER)


def _frame(rows: Sequence[Mapping[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Dicts -> frame with exactly ``schema`` (missing keys become nulls, extra keys are dropped)."""
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.from_dicts(rows, schema=schema, strict=False)


def _enum_name(col: str, names: list[str]) -> pl.Expr:
    return pl.col(col).replace_strict(list(range(len(names))), names, default="Unknown", return_dtype=pl.Utf8)


def _activity_rows(raw: pl.DataFrame, rank: int, offset: int) -> pl.DataFrame:
    """Kernel, memcpy, memset, runtime and driver records -> canonical rows (no ids yet)."""
    act = raw.filter(pl.col("kind").is_in(list(_KIND_TO_EVENT)))
    # start == end == 0 means "CUPTI could not collect the timestamp" (CUpti_ActivityAPI docs):
    # such a row has no interval and would be a wrong number, so it is dropped, counted, logged.
    unknown_time = (pl.col("start") == 0) & (pl.col("end") == 0)
    n_dropped = act.filter(unknown_time | pl.col("start").is_null() | pl.col("end").is_null()).height
    if n_dropped:
        _log.warning("rank %d: dropped %d CUPTI records without timestamps", rank, n_dropped)
    act = act.filter(~unknown_time & pl.col("start").is_not_null() & pl.col("end").is_not_null())
    kind = pl.col("kind")
    is_device = kind.is_in(list(_DEVICE_KINDS))
    # cuptiGetCallbackName returns the versioned symbol ('cudaLaunchKernel_v7000', 'cuMemcpyHtoD_v2');
    # Kineto strips the suffix (kineto#1400), so we do too: both sources then name launches alike.
    api_name = pl.col("name").str.replace(r"_v\d+$", "")
    name = (
        pl.when(kind.is_in([KIND_CONCURRENT_KERNEL, KIND_KERNEL]))
        .then(pl.col("name").fill_null("<unnamed kernel>"))
        .when(kind == KIND_MEMCPY)
        .then(
            pl.format(
                "Memcpy {} ({} -> {})",
                _enum_name("copy_kind", _COPY_KIND),
                _enum_name("src_kind", _MEMORY_KIND),
                _enum_name("dst_kind", _MEMORY_KIND),
            )
        )
        .when(kind == KIND_MEMSET)
        .then(pl.format("Memset ({})", _enum_name("memory_kind", _MEMORY_KIND)))
        .when(kind == KIND_RUNTIME)
        .then(pl.coalesce(api_name, pl.format("cuda_runtime_cbid_{}", pl.col("cbid"))))
        .otherwise(pl.coalesce(api_name, pl.format("cuda_driver_cbid_{}", pl.col("cbid"))))
    )
    return act.select(
        pl.lit(rank, pl.Int32).alias("rank"),
        kind.replace_strict(_KIND_TO_EVENT, return_dtype=pl.Utf8).alias("kind"),
        name.alias("name"),
        kind.replace_strict(_KIND_TO_CATEGORY, return_dtype=pl.Utf8).alias("category"),
        pl.when(is_device).then(pl.col("device_id")).alias("device"),
        pl.when(is_device).then(pl.col("stream_id")).alias("stream"),
        pl.col("process_id").alias("pid"),
        pl.when(is_device).then(None).otherwise(pl.col("thread_id")).alias("tid"),
        (pl.col("start") + offset).alias("start_ns"),
        (pl.col("end") + offset).alias("end_ns"),
        pl.col("correlation_id").alias("correlation"),
        pl.when(kind.is_in([KIND_MEMCPY, KIND_MEMSET])).then(pl.col("bytes")).alias("bytes"),
        pl.lit(None, pl.Int64).alias("seq"),
        is_device.alias("_is_device"),
        (kind == KIND_RUNTIME).alias("_is_runtime"),
    )


def _range_rows(ranges: pl.DataFrame, rank: int, offset: int) -> pl.DataFrame:
    """The collector's host ranges -> ``cpu_annotation`` rows (Kineto's ``user_annotation``)."""
    return ranges.select(
        pl.lit(rank, pl.Int32).alias("rank"),
        pl.lit("cpu_annotation").alias("kind"),
        pl.col("name"),
        pl.lit("user_annotation").alias("category"),
        pl.lit(None, pl.Int64).alias("device"),
        pl.lit(None, pl.Int64).alias("stream"),
        pl.col("process_id").alias("pid"),
        pl.col("thread_id").alias("tid"),
        (pl.col("start") + offset).alias("start_ns"),
        (pl.col("end") + offset).alias("end_ns"),
        pl.lit(None, pl.Int64).alias("correlation"),
        pl.lit(None, pl.Int64).alias("bytes"),
        pl.col("step").alias("seq"),
        pl.lit(False).alias("_is_device"),
        pl.lit(False).alias("_is_runtime"),
        pl.col("external_id").alias("_range_ext"),
    )


def records_to_events(
    records: Sequence[Mapping[str, Any]],
    *,
    rank: int,
    ranges: Sequence[Mapping[str, Any]] = (),
    clock_offset_ns: int = 0,
    event_id_base: int = 0,
    external_kind: int = EXTERNAL_KIND_EP_TRACE,
) -> pl.DataFrame:
    """Convert one batch of CUPTI activity records to canonical ``events`` rows.

    Links, all computed with joins (no per-record Python):

    * ``launch_id``: a kernel / memcpy / memset gets the ``event_id`` of the runtime or driver record
      with the same ``(process_id, correlation_id)`` (runtime preferred when both exist: a runtime
      call that enters the driver shares its id). Correlation ids repeat across processes, so the
      process is part of the key.
    * ``external_id``: runtime and device rows get the id of the ``EXTERNAL_CORRELATION`` record of
      kind ``external_kind`` with the same ``(process_id, correlation_id)``; range rows carry their
      own pushed id.
    * ``op_id``: runtime and device rows get the ``event_id`` of the host range whose pushed id is
      their ``external_id`` (the innermost open ``stage()`` range at launch time, since CUPTI
      reports the top of the external-id stack).

    Args:
        records: Activity records as dicts (layout in the module docstring), any order.
        rank: Global rank stamped on every row.
        ranges: Host ranges recorded by the collector (``stage()`` ranges, ``ProfilerStep#N``).
        clock_offset_ns: Epoch ns minus CUPTI ns, added to every timestamp.
        event_id_base: First ``event_id`` of this batch (ids stay unique across per-step batches).
        external_kind: ``CUpti_ExternalCorrelationKind`` whose ids are ep-trace's.

    Returns:
        Canonical ``events`` frame (schema :data:`ep_trace.schema.EVENTS`), sorted by ``start_ns``
        then ``end_ns`` descending, ``event_id`` = ``event_id_base`` + position. Links to records of
        other batches stay null.
    """
    raw = _frame(records, RAW_SCHEMA)
    rng = _frame(ranges, RANGE_SCHEMA)
    act = _activity_rows(raw, rank, clock_offset_ns).with_columns(pl.lit(None, pl.Int64).alias("_range_ext"))
    rows = pl.concat([act, _range_rows(rng, rank, clock_offset_ns)], how="vertical_relaxed")
    rows = rows.sort(["start_ns", "end_ns"], descending=[False, True], maintain_order=True).with_row_index(
        "event_id", offset=event_id_base
    )
    rows = rows.with_columns(pl.col("event_id").cast(pl.Int64))

    ext = (
        raw.filter((pl.col("kind") == KIND_EXTERNAL_CORRELATION) & (pl.col("external_kind") == external_kind))
        .select(pl.col("process_id").alias("pid"), pl.col("correlation_id").alias("correlation"), "external_id")
        .unique(["pid", "correlation"], keep="last")
    )
    launches = (
        rows.filter(pl.col("kind") == "runtime")
        .sort("_is_runtime", descending=True)
        .unique(["pid", "correlation"], keep="first")
        .select("pid", "correlation", pl.col("event_id").alias("launch_id"))
    )
    range_ids = (
        rows.filter(pl.col("_range_ext").is_not_null())
        .select(pl.col("pid"), pl.col("_range_ext").alias("external_id"), pl.col("event_id").alias("op_id"))
        .unique(["pid", "external_id"], keep="first")
    )

    rows = (
        rows.join(ext, on=["pid", "correlation"], how="left", nulls_equal=False)
        .join(launches, on=["pid", "correlation"], how="left", nulls_equal=False)
        .with_columns(
            pl.when(pl.col("_is_device")).then(pl.col("launch_id")).alias("launch_id"),
            pl.coalesce(pl.col("_range_ext"), pl.col("external_id")).alias("external_id"),
        )
        .join(range_ids, on=["pid", "external_id"], how="left", nulls_equal=False)
        .with_columns(pl.when(pl.col("_range_ext").is_null()).then(pl.col("op_id")).alias("op_id"))
        .sort("event_id")
    )
    return conform("events", rows)

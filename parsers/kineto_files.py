"""Reading many Kineto rank files as one batch: decode each, finish them together, errors exact.

:func:`read_kineto_files` is what :func:`ep_trace.parsers.read_pool.decode_batch` runs on the Kineto
files of a batch: each file is checked and decoded alone (:func:`ep_trace.parsers.kineto.decode_kineto_file`),
then every step after the decode runs once for the batch (:func:`ep_trace.parsers.kineto_batch.finish_files`)
and the range checks once per world size. Results and errors are those of reading each file alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.errors import EpTraceError
from ep_trace.parsers import gc_pause, validate
from ep_trace.parsers.input_guard import NOT_A_TRACE, guarded, rank_for
from ep_trace.parsers.kineto import decode_kineto_file
from ep_trace.parsers.kineto_batch import finish_files

__all__ = ["read_kineto_files"]

log = logging.getLogger(__name__)


def _check_together(done: list[tuple[schema.TraceTables, Any]]) -> None:
    """:func:`ep_trace.parsers.validate.check_tables` of Kineto files, one call per world size
    among them instead of one per file (each file is checked against its own world size; the range
    and string checks of a union pass exactly when each file's pass). The span of each file's events
    is its ranks row's ``trace_end_ns - trace_start_ns``.

    Raises:
        TraceFormatError, ValueError: some file fails (which one is found by checking them alone).
    """
    by_ws: dict[int | None, list[schema.TraceTables]] = {}
    for t, _ in done:
        r = t.ranks.row(0, named=True)
        if r["trace_end_ns"] - r["trace_start_ns"] > validate.MAX_SPAN_NS:
            raise ValueError(f"{r['source_file']} spans more than MAX_SPAN_NS")
        by_ws.setdefault(r["world_size"], []).append(t)
    for ws, ts in by_ws.items():
        whole = schema.TraceTables(
            ranks=pl.concat([t.ranks for t in ts]),
            events=pl.concat([t.events for t in ts], rechunk=False),
            collectives=pl.concat([t.collectives for t in ts], rechunk=False),
        )
        validate.check_tables("<batch>", whole, world_size=ws, span=False)


def read_kineto_files(
    paths: list[Path], rank_map: Mapping[object, int] | None, stop_at_error: bool = False
) -> list[tuple[schema.TraceTables, Any] | EpTraceError]:
    """:func:`ep_trace.parsers.read_pool.read_one` of many Kineto files, the steps after the decode
    run once for all of them (:func:`finish_files`): one result or error per file, in order.

    Results and errors are exactly those of ``read_one`` file by file: a file that fails its decode
    is that file's error; when the batch's later steps or its checks fail, every decoded file is
    finished and checked alone, so the error names the right file and record.

    Args:
        paths: Kineto files.
        rank_map: As for ``read_trace_dir``.
        stop_at_error: Stop decoding at the first error that is not :data:`NOT_A_TRACE` (the
            list is then shorter).
    """
    with gc_pause.paused():  # the batch's kept args live until its collectives are built: see gc_pause
        return _read_kineto_files(paths, rank_map, stop_at_error)


def _read_kineto_files(
    paths: list[Path], rank_map: Mapping[object, int] | None, stop_at_error: bool
) -> list[tuple[schema.TraceTables, Any] | EpTraceError]:
    """:func:`read_kineto_files`, the collector held off by the caller."""
    out: list[tuple[schema.TraceTables, Any] | EpTraceError | None] = []
    decoded = []
    for p in paths:
        try:
            validate.check_input_path(p)
            d = guarded(p, functools.partial(decode_kineto_file, p, rank_for(p, rank_map)))
        except EpTraceError as exc:
            out.append(exc)
            if stop_at_error and not str(getattr(exc, "problem", "")).startswith(NOT_A_TRACE):
                break
            continue
        decoded.append((len(out), d))
        out.append(None)
    if len(decoded) > 1:
        try:
            done = finish_files([d for _, d in decoded])
            _check_together(done)
        except Exception as exc:  # noqa: BLE001 - any failure: finish and check file by file, below
            log.debug("batch of %d Kineto files: reading them one by one (%s)", len(decoded), exc)
        else:
            for (j, _), res in zip(decoded, done, strict=True):
                out[j] = res
            decoded = []
    for j, d in decoded:
        try:
            tables, info = guarded(d.path, functools.partial(finish_files, [d]))[0]
            out[j] = (validate.validate_file(d.path, tables), info)
        except EpTraceError as exc:
            out[j] = exc
            if stop_at_error:
                del out[j + 1 :]
                break
    return [r for r in out if r is not None]

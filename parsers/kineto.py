"""Kineto (torch.profiler Chrome trace) -> canonical tables: the per-file decode (the steps after
it run for a batch of files at once in :mod:`ep_trace.parsers.kineto_batch`).

Decoding streams the file (:mod:`ep_trace.parsers.kineto_stream`, falling back to
:mod:`ep_trace.parsers.kineto_json`) in ~2 MB slices of ``traceEvents``; each slice becomes columns
through polars' JSON reader (:mod:`ep_trace.parsers.kineto_columnar`, no Python object per event),
or, for a slice that reader could read differently, through orjson and one list comprehension per
field (:func:`_chunk_frame`, the reference); everything after that is polars.

Rules (facts in ``shared/reference/kineto.md``):

* Only ``ph:"X"`` spans become ``events`` rows; flows (``ac2g`` / legacy ``async_cpu_to_gpu``),
  metadata (``ph:"M"``) and instants are dropped: linking uses ``args.correlation``, which every
  era carries, not flow drawing order (kineto#1380: under CUPTI skew a kernel can start before its
  launch ends, and ``hta_torchrec_pair`` has no flows at all).
* ``event_id`` = the event's index in ``traceEvents``, so every row points back into the file.
* Times: ``ts``/``dur`` are µs (ints in 2022-2023 traces, ``"<us>.<3-digit ns>"`` floats since).
  ``start_ns = baseTimeNanoseconds + round(ts * 1000)`` when the key exists (kineto#928, 2024:
  relative ts), else ``round(ts * 1000)`` (absolute epoch µs). The integer part is converted
  exactly and only the fraction is rounded, so epoch-µs ints (> 2^53 once scaled) stay exact.
  ``end_ns = start_ns + round(dur * 1000)``. ts 5.1 -> base + 5100.
* Kinds (schema ``EVENT_KINDS``; the 2021-2022 capitalised spellings ``Kernel``, ``Operator``,
  ``Runtime``, ``Memcpy``, ``Memset``, ``User`` / ``gpu_user_Annotation`` map like their modern
  names: ``kineto_batch._KIND_OF_CAT``): ``kernel`` -> gpu_kernel, ``gpu_memcpy``, ``gpu_memset``,
  ``gpu_user_annotation`` -> gpu_annotation, ``user_annotation`` -> cpu_annotation except
  ``gloo:*`` ranges on a gloo worker thread -> comm_worker, ``cpu_op`` -> cpu_op,
  ``python_function`` -> python_frame (call context, not work: never compute, never a link target),
  ``cuda_runtime`` / ``cuda_driver`` -> runtime; other accelerators: ``mtia_ccp_events`` ->
  gpu_kernel (device work, device ``mtia:N``), ``mtia_runtime`` / ``xpu_runtime`` / ``xpu_driver`` /
  ``hpu_op`` / ``privateuse1_*`` -> runtime; ``Trace``, ``overhead``, ``cuda_sync`` ... -> other; any
  other category -> other and named in the load report with its row count (never dropped silently).
* Kineto GPU rows use ``pid`` = device index and ``tid`` = stream (``device`` / ``stream`` columns).
"""

from __future__ import annotations

import functools
import logging
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.errors import TraceFormatError
from ep_trace.parsers import allocator, gc_pause, kineto_columnar, kineto_json, kineto_stream, validate
from ep_trace.parsers.dist_info import check_distributed_info
from ep_trace.parsers.kineto_batch import KINETO_CATEGORIES, MEMORY_CATEGORIES, Decoded, finish_files

__all__ = [
    "KinetoFileInfo",
    "decode_kineto_file",
    "read_kineto",
    "read_kineto_file",
    "rank_from_file_name",
    "ARG_KEEP_PREFIXES",
]

log = logging.getLogger(__name__)
#: Files smaller than this (on disk) skip the heap trim after their decode: a small file's freed
#: buffers (a few MB) are reused by the next file, and trimming them made the next one fault them in
#: again (without the trim: 0.1 M fewer page faults over 1,024 small ranks).
_TRIM_BYTES = 4 << 20


#: Names whose ``args`` are kept (for the collective builder); all other args are dropped per chunk.
ARG_KEEP_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:", "_c10d_functional::")

_RANK_FILE_RE = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_.]?(\d+)(?!\d)", re.IGNORECASE)
_FIX = "re-export the trace (torch.profiler export_chrome_trace) or remove the file"
#: Top-level keys only torch.profiler (Kineto) writes; a JSON with none of them and none of Kineto's
#: event categories is some other tool's Chrome trace (SGLang writes ``<id>-TP-<r>-perfetto.json.gz``
#: request spans next to its ``<id>-TP-<r>.trace.json.gz`` torch traces: python/sglang/srt/managers/
#: scheduler_perfetto_trace_mixin.py), not a rank: read as one it took rank 0 from no evidence.
_KINETO_KEYS = (
    "schemaVersion",
    "deviceProperties",
    "distributedInfo",
    "baseTimeNanoseconds",
    "traceName",
    "record_shapes",
    "cupti_version",
    "cuda_runtime_version",
    "trace_id",
)


@dataclass(frozen=True)
class KinetoFileInfo:
    """What one Kineto file says about its job (used by the directory merge to reject mixtures).

    Attributes:
        path: The file.
        rank: Rank used for its rows.
        rank_source: 'distributedInfo', 'rank_map', 'file_name' or 'default'.
        world_size: ``distributedInfo.world_size`` when present.
        backend: ``distributedInfo.backend`` when present.
        default_pg: ``(pg_size, ranks)`` of the default process group from ``pg_config``, if any.
    """

    path: str
    rank: int
    rank_source: str
    world_size: int | None
    backend: str | None
    default_pg: tuple[int | None, tuple[int, ...] | None] | None


def rank_from_file_name(name: str) -> int | None:
    """Rank guessed from a file name: ``rank-3``, ``rank3``, ``rank_3``, ``worker3_step_12...``."""
    m = _RANK_FILE_RE.search(name)
    return int(m.group(1)) if m else None


def _event_error(path: Path, index: int, problem: str, fix: str = _FIX) -> TraceFormatError:
    return TraceFormatError(path, problem, fix, record=f"traceEvents[{index}]")


def _strict_series(
    name: str, values: list[Any], dtype: pl.DataType | type[pl.DataType], path: Path, ev_index: list[int], what: str
) -> pl.Series:
    """Build a typed column; on a bad value (string, bool time, int beyond the type) name the event."""
    try:
        if dtype.is_float() and bool in set(map(type, values)):  # "ts": true would be an event at 1 µs
            raise TypeError("bool")
        return pl.Series(name, values, dtype=dtype)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        lo, hi = (-(2**63), 2**63 - 1) if dtype == pl.Int64 else (0, 2**64 - 1)
        for i, v in enumerate(values):
            bad = v is not None and (
                isinstance(v, bool)
                or (dtype.is_integer() and not (isinstance(v, int) and lo <= v <= hi))
                or (dtype.is_float() and not isinstance(v, (int, float)))
            )
            if bad:
                raise _event_error(
                    path, ev_index[i], f"{what} has an unusable value {str(v)[:40]!r} (beyond {dtype} or not a number)"
                ) from None
        raise


def _to_ns(us: pl.Expr) -> pl.Expr:
    """µs (float64 holding ints or ns-fraction floats) -> int64 ns: exact integer part, rounded fraction."""
    fl = us.floor()
    return fl.cast(pl.Int64) * 1000 + ((us - fl) * 1000).round(0).cast(pl.Int64)


def _track_ids(values: list[Any]) -> pl.Series:
    """pid / tid column: ints, or the trailing number of string labels ("stream 7", "GPU 0").

    Strings such as Kineto's ``"Spans"`` process become null."""
    try:
        return pl.Series(values, dtype=pl.Int64)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        nums = pl.Series([v if v.__class__ is int else None for v in values], dtype=pl.Int64)
        text = pl.Series([v if v.__class__ is str else None for v in values], dtype=pl.Utf8)
        return nums.fill_null(text.str.extract(r"(\d+)\s*$").cast(pl.Int64))


def _chunk_frame(evs: list[Any], offset: int, path: Path, kept_args: dict[int, dict[str, Any]]) -> pl.DataFrame:
    """Raw columns of the X events of one ``traceEvents`` slice: one list comprehension per field,
    no per-event work; checks and ns conversion run once on the concatenated frame (:func:`_times`)."""
    try:
        xi = [i for i, e in enumerate(evs) if e.get("ph") == "X"]
    except AttributeError:
        bad = next(i for i, e in enumerate(evs) if not isinstance(e, dict))
        raise _event_error(path, offset + bad, f"event is a {type(evs[bad]).__name__}, not an object") from None
    xs = [evs[i] for i in xi]
    ids = [offset + i for i in xi]
    cat = validate.text_series(path, [e.get("cat") for e in xs], ids, "cat")
    name = validate.text_series(path, [e.get("name") for e in xs], ids, "name")
    args = [e.get("args") for e in xs]
    # args kept for the collective builder: its markers by name, and kernels with a metadata copy
    marks = functools.reduce(operator.or_, [name.str.starts_with(p) for p in ARG_KEEP_PREFIXES]).fill_null(False)
    for j in marks.arg_true().to_list():
        if args[j]:
            kept_args[ids[j]] = args[j]
    for j in (cat == "kernel").fill_null(False).arg_true().to_list():
        a = args[j]
        if a and "Collective name" in a:
            kept_args[ids[j]] = a
    mem = cat.is_in(MEMORY_CATEGORIES)
    nbytes = [args[j].get("bytes") if args[j] else None for j in mem.fill_null(False).arg_true().to_list()]
    by = pl.Series("bytes", [None] * len(xs), dtype=pl.Int64)
    if nbytes:
        by = by.scatter(
            mem.fill_null(False).arg_true(), _strict_series("bytes", nbytes, pl.Int64, path, ids, "args.bytes")
        )
    return pl.DataFrame(
        {
            "event_id": pl.Series(ids, dtype=pl.Int64),
            "category": cat,
            "name": name,
            "pid_raw": _track_ids([e.get("pid") for e in xs]),
            "tid_raw": _track_ids([e.get("tid") for e in xs]),
            "ts": _strict_series("ts", [e.get("ts") for e in xs], pl.Float64, path, ids, "ts"),
            "dur": _strict_series("dur", [e.get("dur") for e in xs], pl.Float64, path, ids, "dur"),
            "correlation": _strict_series(
                "correlation",
                [a.get("correlation") if a else None for a in args],
                pl.Int64,
                path,
                ids,
                "args.correlation",
            ),
            "external_id": _strict_series(
                "external_id",
                [a.get("External id") if a else None for a in args],
                pl.Int64,
                path,
                ids,
                "args['External id']",
            ),
            "bytes": by,
        }
    )


def _concat_columns(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The slice frames as one frame of contiguous columns, emptying ``frames``.

    Column by column, each dropped from the slice frames once copied: the first contiguous
    operation on a plain ``pl.concat`` of ~50 slice frames copies all of them at once, so the peak
    would hold the events twice (~0.2x the rank file); here it holds them once plus one column."""
    if not frames:
        return pl.DataFrame()
    if len(frames) == 1:  # one slice (a small rank file): its columns are contiguous already
        return frames.pop()
    # the slices' columns as plain lists, the frames themselves released: dropping a column from
    # ~30 frames per column (a new frame each) cost 0.03 CPU-s per 50 MB, clearing a list slot nothing
    parts: list[list[pl.Series | None]] = [[*f.get_columns()] for f in frames]
    frames.clear()
    cols = []
    for j in range(len(parts[0])):
        cols.append(pl.concat([c for p in parts if (c := p[j]) is not None], rechunk=True))
        for p in parts:
            p[j] = None
    return pl.DataFrame(cols)


def _times(ev: pl.DataFrame, path: Path, base_ns: int) -> pl.DataFrame:
    """Check ts / dur (present, dur >= 0, in range) and replace them by ``start_ns`` / ``end_ns``.

    Two queries (the checks' three reductions at once, then the columns) instead of ~25 Series
    operations: ~1 ms less per rank file, 1 s over 1,024 small ranks."""
    ts, dur = pl.col("ts"), pl.col("dur")
    checks = (
        (ts.is_null() | dur.is_null(), lambda j: "complete event (ph 'X') without a numeric ts or dur", _FIX),
        (dur < 0, lambda j: f"negative duration (dur={ev['dur'][j]})", "the trace is corrupt; re-export it"),
        (
            (ts.abs() > 9.0e15) | (dur > 9.0e15),
            lambda j: f"timestamp out of range (ts={ev['ts'][j]}, dur={ev['dur'][j]})",
            _FIX,
        ),  # µs beyond int64 ns
    )
    masks = [bad.fill_null(False) for bad, _, _ in checks]
    flags = ev.select(m.any().alias(str(i)) for i, m in enumerate(masks)).row(0)
    for mask, flagged, (_, problem, fix) in zip(masks, flags, checks, strict=True):
        if flagged:
            j = int(ev.select(mask.arg_max()).item())
            raise _event_error(path, int(ev["event_id"][j]), problem(j), fix)
    start = _to_ns(ts) + base_ns
    return ev.with_columns(start.alias("start_ns"), (start + _to_ns(dur)).alias("end_ns")).drop("ts", "dur")


def _default_pg(info: dict[str, Any]) -> tuple[int | None, tuple[int, ...] | None] | None:
    from ep_trace.parsers.splits import parse_int_list

    for pg in info.get("pg_config") or []:
        if isinstance(pg, dict) and (pg.get("pg_desc") == "default_pg" or str(pg.get("pg_name")) == "0"):
            ranks = parse_int_list(pg.get("ranks"))
            size = pg.get("pg_size")
            return (
                size if isinstance(size, int) else None,
                tuple(v for v in ranks.values if v is not None) if ranks else None,
            )
    return None


def _decode(path: Path, columnar: bool = True) -> tuple[dict[str, Any], dict[int, dict[str, Any]], list[pl.DataFrame]]:
    """Header, kept args and per-slice event frames (times without the base), streaming when possible.

    ``columnar`` (default) decodes the slices with polars' JSON reader
    (:mod:`ep_trace.parsers.kineto_columnar`, same result); ``False`` uses orjson only."""
    if columnar:
        try:
            return kineto_columnar.decode_columnar(path, _chunk_frame, ARG_KEEP_PREFIXES)
        except kineto_stream.Fallback as exc:
            log.debug("%s: columnar decode not possible (%s)", path, exc)
    header: dict[str, Any] = {}
    kept_args: dict[int, dict[str, Any]] = {}
    frames: list[pl.DataFrame] = []
    try:
        for offset, chunk in kineto_stream.stream_events(path, header):
            frames.append(_chunk_frame(chunk, offset, path, kept_args))
            del chunk
        return header, kept_args, frames
    except kineto_stream.Fallback as exc:
        log.debug("%s: streaming decode not possible (%s); decoding the whole file", path, exc)
    kept_args.clear()
    frames = []
    raw = kineto_json.read_bytes(path)
    header, events = kineto_json.decode_header(raw, path)
    del raw
    for offset, chunk in kineto_json.iter_event_chunks(events, path):
        frames.append(_chunk_frame(chunk, offset, path, kept_args))
        del chunk
    return header, kept_args, frames


def _check_is_kineto(path: Path, header: dict[str, Any], ev: pl.DataFrame) -> None:
    """Refuse a Chrome-format JSON that torch.profiler did not write (no Kineto key, no Kineto category).

    Raises:
        TraceFormatError: with the :data:`~ep_trace.parsers.input_guard.NOT_A_TRACE` prefix, so that a
            directory read skips the file with a warning instead of giving it a rank.
    """
    if path.name.endswith((".pt.trace.json", ".pt.trace.json.gz")) or any(k in header for k in _KINETO_KEYS):
        return  # torch.profiler's own file name (tensorboard_trace_handler): meant as a rank, never skipped
    cats = ev.get_column("category").cast(pl.Utf8).drop_nulls().unique()
    if cats.is_in(list(KINETO_CATEGORIES)).any():
        return
    seen = ", ".join(sorted(cats.to_list())[:4]) or "none"
    raise TraceFormatError(
        path,
        "not a Chrome/Kineto trace of torch.profiler: no Kineto key (schemaVersion, distributedInfo, "
        f"deviceProperties, ...) and none of its event categories (cpu_op, kernel, ...; this file has: {seen})",
        "pass the torch.profiler traces (*.pt.trace.json[.gz]) and move other tools' Chrome traces out of the directory",
    )


def decode_kineto_file(path: str | Path, rank: int | None = None) -> Decoded:
    """The per-file half of reading a Kineto trace: decode, rank, time base and time checks.

    Everything after this (kinds, links, collectives, the canonical tables) runs on several files
    at once in :func:`ep_trace.parsers.kineto_batch.finish_files`.

    Raises:
        TraceFormatError: one line naming the file (and ``traceEvents[i]``) for bad input.
    """
    path = Path(path)
    header, kept_args, frames = _decode(path)
    if path.stat().st_size > _TRIM_BYTES:  # the decode's freed gzip / slice buffers (ep_trace.parsers.allocator)
        allocator.release_free_heap()
    issues: list[schema.LoadIssue] = []
    check_distributed_info(path, header, rank)  # rank / world size / pg_config / ep_trace header agree
    info = header.get("distributedInfo")
    dist: dict[str, Any] = info if isinstance(info, dict) else {}
    base = header.get("baseTimeNanoseconds")
    try:
        base_ns = int(base) if base is not None else 0
    except (TypeError, ValueError):
        raise TraceFormatError(path, f"baseTimeNanoseconds is not an integer ({base!r})", _FIX) from None

    file_rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    if rank is not None:
        rank_source = "rank_map"
        if file_rank is not None and file_rank != rank:
            issues.append(
                schema.LoadIssue(
                    str(path),
                    rank,
                    "warning",
                    f"distributedInfo says rank {file_rank}; rank {rank} given by the caller is used",
                )
            )
    elif file_rank is not None:
        rank, rank_source = file_rank, "distributedInfo"
    else:
        guess = rank_from_file_name(path.name)
        if guess is not None:
            rank, rank_source = guess, "file_name"
            issues.append(
                schema.LoadIssue(
                    str(path),
                    rank,
                    "warning",
                    f"no distributedInfo.rank in the trace; rank {rank} guessed from the file name",
                )
            )
        else:
            rank, rank_source = 0, "default"
            issues.append(
                schema.LoadIssue(
                    str(path),
                    0,
                    "warning",
                    "no distributedInfo.rank and no rank in the file name; assumed rank 0 (pass rank_map to set it)",
                )
            )

    ev = _concat_columns(frames)
    if ev.height == 0:
        raise TraceFormatError(
            path,
            "the trace has no complete events (ph 'X')",
            "profile at least one step (schedule active > 0) and re-export",
        )
    # relative ts (kineto#928): the base is known only once the whole file is read
    ev = _times(ev, path, base_ns)
    _check_is_kineto(path, header, ev)
    ws = dist.get("world_size")
    file_info = KinetoFileInfo(
        path=str(path),
        rank=rank,
        rank_source=rank_source,
        world_size=ws if isinstance(ws, int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        default_pg=_default_pg(dist),
    )
    return Decoded(path, rank, header, dist, kept_args, ev, issues, file_info)


def read_kineto_file(path: str | Path, rank: int | None = None) -> tuple[schema.TraceTables, KinetoFileInfo]:
    """Read one rank's Kineto trace; also return what the file says about its job.

    Args:
        path: ``*.json`` / ``*.json.gz`` / ``*.pt.trace.json[.gz]``.
        rank: Rank to use, overriding ``distributedInfo.rank`` (e.g. from a ``rank_map``).

    Returns:
        ``(tables, info)``; ``tables`` is validated, ``stages`` and routing tables are empty.

    Raises:
        TraceFormatError: one line naming the file (and ``traceEvents[i]``) for bad input.
    """
    with gc_pause.paused():  # (the kept args are ~47k containers per 50 MB rank: see gc_pause)
        tables, info = finish_files([decode_kineto_file(path, rank)])[0]
    return tables, info  # type: ignore[return-value]


def read_kineto(path: str | Path, rank: int | None = None) -> schema.TraceTables:
    """Read one rank's Kineto trace (``.json`` / ``.json.gz``) into canonical tables.

    Args:
        path: The trace file.
        rank: Rank to use; default ``distributedInfo.rank``, else a rank in the file name (warning
            in ``load_report``), else 0 (warning).

    Returns:
        Validated :class:`~ep_trace.schema.TraceTables` (events, collectives, ranks; routing empty
        until a sidecar is merged, see :func:`ep_trace.parsers.read_trace_dir`).

    Raises:
        TraceFormatError: bad input, one line naming the file and the event index.
    """
    return read_kineto_file(path, rank)[0]

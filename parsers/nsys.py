"""Nsight Systems ingest: an nsys SQLite / parquetdir export (or a .nsys-rep) -> canonical tables.

Entry point :func:`read_nsys`. Facts relied on (shared/reference/nsys.md, verified on the four
exports of schema 2.9.1, 3.24.0, 3.24.14 and 3.25.0 in shared/external/nsys/):

* tables and columns are discovered, never assumed (lazy exports omit empty tables; the metadata
  table is ``EXPORT_META_DATA`` in schema 2.x and ``META_DATA_EXPORT`` in 3.x);
* names are ids into ``StringIds``; NVTX names are ``text`` first, else ``textId``;
* ``globalTid`` = ``<hw:8><vm:8><pid:24><tid:24>``; ``globalPid`` is the same with tid bits 0;
* kernels join their launch on ``correlationId`` AND process (ids collide across processes), only
  runtime (eventClass 0) and driver (1) rows: schema 2.9.1 adds eventClass 67 backtrace duplicates;
* timestamps are capture-relative ns; epoch ns = ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` + ts.

Events written (``events.kind``): ``gpu_kernel`` (KERNEL rows, and whole-graph GRAPH_TRACE rows),
``gpu_memcpy`` (with ``bytes``), ``gpu_memset``, ``runtime`` (CUDA runtime and driver API calls,
``category`` ``cuda_runtime`` / ``cuda_driver``, ``_v<N>`` suffix stripped), ``cpu_annotation`` (NVTX
push/pop and start/end ranges with ``domain``; emit_nvtx ``, op_id = N`` / ``, seq = N`` suffixes
stripped) and ``gpu_annotation`` (NVTX -> GPU projection, ``op_id`` = the CPU range). GPU rows carry
``launch_id`` (the API call), ``op_id`` (innermost NVTX range around the launch on the launching
thread) and ``tid`` = stream, as Kineto GPU rows do. NVTX marks (eventType 34) are not kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import polars as pl

from ep_trace.comm_classifier import comm_family_expr
from ep_trace.errors import TraceFormatError
from ep_trace.parsers.nsys_collectives import group_collectives
from ep_trace.parsers.nsys_project import enclosing_pairs, innermost_range, range_envelopes
from ep_trace.parsers.nsys_ranks import (
    assign_ranks,
    hostname,
    launcher_env,
    launcher_topology,
    nccl_init_ranks,
    ranks_table,
)
from ep_trace.parsers.nsys_source import TableSource, open_source
from ep_trace.parsers.nsys_tables import (
    EMIT_NVTX_SUFFIX,
    GRAPH,
    RANGE_TYPES,
    STEP,
    THREAD_NAME_EVENT,
    domains,
    pid_of,
    proc_of,
    read_gpu,
    read_nvtx,
    read_runtime,
    read_strings,
    resolve,
    tid_of,
)
from ep_trace.schema import LoadIssue, TraceTables, conform, validate

__all__ = ["read_nsys"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


def _meta(src: TableSource) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in src.tables() and {"name", "value"} <= set(src.columns(table)):
            df = src.read(table, ["name", "value"])
            return {str(k): str(v) for k, v in zip(df["name"], df["value"], strict=False) if k is not None}
    return {}


def _session_offset(src: TableSource, meta: Mapping[str, str], path: Path, issues: list[LoadIssue]) -> int:
    """ns to add to export timestamps to get epoch ns.

    ``--ts-normalize`` exports are already on the UTC epoch (offset 0); ``--ts-shift X`` added X,
    which is taken back out. Fallback when ``TARGET_INFO_SESSION_START_TIME`` is absent: offset 0
    and a warning (times stay capture-relative; cross-file alignment is then impossible).
    """
    normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
    try:
        shift = int(meta.get("EXPORT_PARAM_TIME_SHIFT", "0") or 0)
    except ValueError:
        shift = 0
    if normalized:
        return -shift
    table = "TARGET_INFO_SESSION_START_TIME"
    if "utcEpochNs" in src.columns(table):
        vals = src.read(table, ["utcEpochNs"])["utcEpochNs"].drop_nulls()
        if len(vals):
            return int(vals[0]) - shift
    issues.append(
        LoadIssue(
            str(path),
            None,
            "warning",
            "no TARGET_INFO_SESSION_START_TIME: times are capture-relative, not epoch; "
            "files from different processes cannot be aligned",
        )
    )
    return -shift


def _mpi_ranks(src: TableSource, nv: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """Process -> MPI rank from ``MPI_RANKS`` or a thread named ``MPI Rank N`` (NVTX eventType 39
    rows, ``ThreadNames``). Columns ``proc_of``, ``_mpi``."""
    parts = [nv.filter(pl.col("eventType") == THREAD_NAME_EVENT).select("globalTid", "name")]
    if {"nameId", "globalTid"} <= set(src.columns("ThreadNames")):
        tn = resolve(src.read("ThreadNames", ["nameId", "globalTid"]), "nameId", strings, "name")
        parts.append(tn.select("globalTid", "name"))
    names = pl.concat(parts).select(
        proc_of(pl.col("globalTid")).alias("_proc"),
        pl.col("name").str.extract(r"^MPI Rank (\d+)$").cast(pl.Int64).alias("_mpi"),
    )
    if {"globalTid", "rank"} <= set(src.columns("MPI_RANKS")):
        mr = src.read("MPI_RANKS", ["globalTid", "rank"])
        names = pl.concat([mr.select(proc_of(pl.col("globalTid")).alias("_proc"), pl.col("rank").alias("_mpi")), names])
    return names.drop_nulls().unique("_proc", keep="first")


def _check_nsys(src: TableSource, path: Path) -> None:
    tables = src.tables()
    looks = ("StringIds" in tables) and (
        bool({"META_DATA_EXPORT", "EXPORT_META_DATA"} & tables)
        or any(t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_", "TARGET_INFO_")) for t in tables)
    )
    if not looks:
        raise TraceFormatError(
            path,
            "not an Nsight Systems export (no StringIds / META_DATA_EXPORT / CUPTI_* tables)",
            "pass the output of 'nsys export --type sqlite' (or --type parquetdir)",
        )


def read_nsys(
    path: str | Path,
    rank: int | None = None,
    rank_map: Mapping[object, int] | None = None,
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> TraceTables:
    """Read one Nsight Systems export into canonical tables (one or several ranks).

    Args:
        path: ``.sqlite`` export, ``parquetdir`` export folder, or ``.nsys-rep`` (exported once with
            ``nsys export --type sqlite`` into ``cache_dir``; needs ``nsys`` on PATH).
        rank: Rank of the file's single GPU process, from the caller (e.g. the file name).
        rank_map: ``{pid: rank}`` for multi-process files, or ``{file name: rank}``.
        cache_dir: Where a ``.nsys-rep`` is exported (default ``<dir>/.ep-trace-cache``).
        progress: Optional callback ``progress(stage, done, total)``.

    Returns:
        Validated :class:`TraceTables` with ``ranks``, ``events`` (times in epoch ns) and
        ``collectives`` (no split sizes: ``splits_source`` None); ``load_report`` holds warnings.

    Raises:
        TraceFormatError: not SQLite, truncated, not an nsys export, or no CUDA / NVTX events.
        MissingDependencyError: a ``.nsys-rep`` and no ``nsys`` on PATH.
        ConfigError: ``rank`` / ``rank_map`` do not fit the processes of the file.
    """
    path = Path(path)
    src = open_source(path, cache_dir)
    try:
        return _read(src, path, rank, rank_map, progress or (lambda stage, done, total: None))
    finally:
        src.close()  # type: ignore[attr-defined]


def _read(
    src: TableSource, path: Path, rank: int | None, rank_map: Mapping[object, int] | None, progress: Progress
) -> TraceTables:
    issues: list[LoadIssue] = []
    _check_nsys(src, path)
    meta = _meta(src)
    log.debug(
        "%s: nsys export schema %s (%s)",
        path,
        meta.get("EXPORT_SCHEMA_VERSION", "unknown"),
        meta.get("EXPORT_PRODUCT_VERSION", "?"),
    )
    offset = _session_offset(src, meta, path, issues)
    strings = read_strings(src)
    progress("read", 1, 4)
    gpu = read_gpu(src, strings)
    progress("read", 2, 4)
    rt = read_runtime(src, strings)
    progress("read", 3, 4)
    nv = read_nvtx(src, strings)
    progress("read", 4, 4)
    ranges = nv.filter(pl.col("eventType").is_in(RANGE_TYPES))
    if gpu.is_empty() and rt.is_empty() and ranges.is_empty():
        raise TraceFormatError(
            path,
            "the export holds no CUDA activity, CUDA API calls or NVTX ranges",
            "profile with 'nsys profile --trace=cuda,nvtx' and export again",
        )

    # uids: one id space across tables until event_id is assigned per rank at the end.
    n_gpu, n_rt = gpu.height, rt.height
    gpu = gpu.with_row_index("_uid").with_columns(pl.col("_uid").cast(pl.Int64), pl.col("globalPid").alias("_proc"))
    rt = rt.with_row_index("_uid", offset=n_gpu).with_columns(
        pl.col("_uid").cast(pl.Int64), proc_of(pl.col("globalTid")).alias("_proc")
    )
    ranges = ranges.with_row_index("_uid", offset=n_gpu + n_rt).with_columns(
        pl.col("_uid").cast(pl.Int64), proc_of(pl.col("globalTid")).alias("_proc")
    )
    trace_end = max(v for v in (gpu["end"].max(), rt["end"].max(), nv["start"].max(), nv["end"].max()) if v is not None)

    # Launch join on (process, correlationId): ids are per process (mfu_2gpu_before: 4280 rows on
    # correlationId alone vs 3986 with the process). Runtime rows first, then driver, one per key.
    launches = (
        rt.filter(pl.col("correlationId").is_not_null() & (pl.col("correlationId") != 0))
        .sort("eventClass")
        .unique(["_proc", "correlationId"], keep="first")
        .select(
            "_proc",
            "correlationId",
            pl.col("_uid").alias("_launch_uid"),
            pl.col("start").alias("_ls"),
            pl.col("end").alias("_le"),
            pl.col("globalTid").alias("_gtid"),
        )
    )
    gpu = gpu.join(launches, on=["_proc", "correlationId"], how="left")

    # NVTX ranges: a range still open at the end of the capture ends at the end of the trace;
    # ranges ending on another thread (endGlobalTid) are kept on the CPU side but never projected.
    ranges = domains(
        nv,
        ranges.with_columns(
            pl.col("end").fill_null(trace_end),
            pl.col("name").fill_null("<unnamed range>").str.replace(EMIT_NVTX_SUFFIX, ""),
        ),
    ).with_columns(
        (pl.col("endGlobalTid").is_null() | (pl.col("endGlobalTid") == pl.col("globalTid"))).alias("_same_thread")
    )
    proj_ranges = ranges.filter(pl.col("_same_thread")).select(
        "_uid", pl.col("globalTid").alias("_gtid"), pl.col("start").alias("_rs"), pl.col("end").alias("_re"), "name"
    )
    launched = gpu.filter(pl.col("_ls").is_not_null())
    pairs = enclosing_pairs(launched.select("_uid", "_gtid", "_ls", "_le"), proj_ranges)
    progress("project", 1, 2)
    gpu = gpu.join(innermost_range(pairs).rename({"_op": "_uid", "_range": "_op_uid"}), on="_uid", how="left")
    env = range_envelopes(
        pairs,
        gpu.select("_uid", "start", "end", pl.col("deviceId").alias("device"), pl.col("streamId").alias("stream")),
    )
    annotations = env.join(ranges.select(pl.col("_uid").alias("_range"), "_proc", "name", "domain"), on="_range")
    progress("project", 2, 2)

    comm = (
        gpu.filter(pl.col("kind") == "gpu_kernel")
        .with_columns(comm_family_expr(pl.col("name")).alias("family"))
        .filter(pl.col("family").is_not_null())
    )
    calls, members = group_collectives(
        comm.select("_uid", "_proc", "_gtid", "_ls", "_le", "start", "end", "family", "short_name"),
        proj_ranges,
        pairs,
    )

    # Ranks: processes that own GPU activity; CPU-only exports fall back to processes with API
    # calls or NVTX ranges (and say so).
    if gpu.height:
        owners = gpu.group_by("_proc").agg(pl.col("deviceId").min().cast(pl.Int64).alias("device"))
    else:
        issues.append(
            LoadIssue(
                str(path),
                None,
                "warning",
                "no GPU activity in the export (no kernel / memcpy / memset rows): only the CPU side "
                "(CUDA API calls, NVTX ranges) was read; device time, overlap and collectives are empty",
            )
        )
        owners = (
            pl.concat([rt.select("_proc"), ranges.select("_proc")])
            .unique()
            .with_columns(pl.lit(None, dtype=pl.Int64).alias("device"))
        )
    owners = owners.with_columns(pid_of(pl.col("_proc")).alias("pid"))
    rank_of = assign_ranks(
        owners,
        path,
        rank,
        rank_map,
        _mpi_ranks(src, nv, strings),
        issues,
        env=launcher_env(src),
        nccl=nccl_init_ranks(src, proc_of(pl.col("globalPid"))),
    )

    no_launch = gpu.height - launched.height
    if no_launch:
        issues.append(
            LoadIssue(
                str(path),
                None,
                "warning",
                f"{no_launch} of {gpu.height} GPU ops have no launching API call in the export "
                "(outside the capture / slice window): kept, with no stage attribution",
            )
        )
    if GRAPH in src.tables() and gpu.filter(pl.col("category") == GRAPH).height:
        issues.append(
            LoadIssue(
                str(path),
                None,
                "warning",
                "CUDA graph replays were traced as whole-graph rows (graph trace mode 'Graph'): "
                "their kernels are not listed individually",
            )
        )

    events, collectives = _assemble(gpu, rt, ranges, annotations, calls, members, rank_of, offset)
    ranks = ranks_table(events, collectives, rank_of, owners, path, hostname(src), launcher_topology(src))
    dropped = (
        pl.concat([gpu.select("_proc"), rt.select("_proc"), ranges.select("_proc")])
        .filter(~pl.col("_proc").is_in(rank_of["_proc"].implode()))
        .height
    )
    if dropped:
        issues.append(
            LoadIssue(
                str(path),
                None,
                "warning",
                f"{dropped} CPU-side rows of processes without GPU activity (launchers, tools) were skipped",
            )
        )
    src_name = str(path)
    return TraceTables(
        ranks=validate("ranks", ranks, src_name),
        events=validate("events", events, src_name),
        collectives=validate("collectives", collectives, src_name),
        load_report=tuple(issues),
    )


def _assemble(
    gpu: pl.DataFrame,
    rt: pl.DataFrame,
    ranges: pl.DataFrame,
    annotations: pl.DataFrame,
    calls: pl.DataFrame,
    members: pl.DataFrame,
    rank_of: pl.DataFrame,
    offset: int,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Concatenate the per-table frames, keep ranked processes, shift to epoch ns, assign ids."""
    i64, s = pl.Int64, pl.Utf8
    null_i, null_s = pl.lit(None, dtype=i64), pl.lit(None, dtype=s)
    n_before = gpu.height + rt.height + ranges.height
    # Calls: ordered per rank by host start (device start without a host range); coll_id = ordinal.
    cols = (
        calls.join(rank_of.select("_proc", "rank"), on="_proc", how="inner")
        .with_columns((pl.col(c) + offset).alias(f"{c}_ns") for c in ("cpu_start", "cpu_end", "start", "end"))
        .sort(["rank", pl.coalesce("cpu_start_ns", "start_ns"), "start_ns", "_call"])
        .with_columns(pl.int_range(pl.len(), dtype=i64).over("rank").alias("coll_id"))
    )
    coll_of = members.join(cols.select("_call", "coll_id"), on="_call").select("_uid", "coll_id")
    gpu_ev = gpu.join(coll_of, on="_uid", how="left").select(
        "_uid",
        "_proc",
        "kind",
        "name",
        "category",
        null_s.alias("domain"),
        pl.col("deviceId").alias("device"),
        pl.col("streamId").alias("stream"),
        pid_of(pl.col("_proc")).alias("pid"),
        pl.col("streamId").alias("tid"),
        "start",
        "end",
        pl.col("correlationId").alias("correlation"),
        "_launch_uid",
        "_op_uid",
        "coll_id",
        "bytes",
        null_i.alias("seq"),
    )
    rt_ev = rt.select(
        "_uid",
        "_proc",
        pl.lit("runtime").alias("kind"),
        "name",
        pl.when(pl.col("eventClass") == 1)
        .then(pl.lit("cuda_driver"))
        .otherwise(pl.lit("cuda_runtime"))
        .alias("category"),
        null_s.alias("domain"),
        null_i.alias("device"),
        null_i.alias("stream"),
        pid_of(pl.col("globalTid")).alias("pid"),
        tid_of(pl.col("globalTid")).alias("tid"),
        "start",
        "end",
        pl.col("correlationId").alias("correlation"),
        null_i.alias("_launch_uid"),
        null_i.alias("_op_uid"),
        null_i.alias("coll_id"),
        null_i.alias("bytes"),
        null_i.alias("seq"),
    )
    nv_ev = ranges.select(
        "_uid",
        "_proc",
        pl.lit("cpu_annotation").alias("kind"),
        "name",
        pl.lit("nvtx").alias("category"),
        "domain",
        null_i.alias("device"),
        null_i.alias("stream"),
        pid_of(pl.col("globalTid")).alias("pid"),
        tid_of(pl.col("globalTid")).alias("tid"),
        "start",
        "end",
        null_i.alias("correlation"),
        null_i.alias("_launch_uid"),
        null_i.alias("_op_uid"),
        null_i.alias("coll_id"),
        null_i.alias("bytes"),
        STEP.alias("seq"),
    )
    ann_ev = annotations.with_row_index("_uid", offset=n_before).select(
        pl.col("_uid").cast(i64),
        "_proc",
        pl.lit("gpu_annotation").alias("kind"),
        "name",
        pl.lit("nvtx_projection").alias("category"),
        "domain",
        "device",
        "stream",
        pid_of(pl.col("_proc")).alias("pid"),
        pl.col("stream").alias("tid"),
        "start",
        "end",
        null_i.alias("correlation"),
        null_i.alias("_launch_uid"),
        pl.col("_range").alias("_op_uid"),
        null_i.alias("coll_id"),
        null_i.alias("bytes"),
        STEP.alias("seq"),
    )
    parts = [p.cast({"device": i64, "stream": i64, "tid": i64, "pid": i64}) for p in (gpu_ev, rt_ev, nv_ev, ann_ev)]
    ev = (
        pl.concat(parts, how="vertical_relaxed")
        .with_columns(pl.col("_proc").replace_strict(rank_of["_proc"], rank_of["rank"], default=None).alias("rank"))
        .filter(pl.col("rank").is_not_null())
        .with_columns((pl.col("start") + offset).alias("start_ns"), (pl.col("end") + offset).alias("end_ns"))
        .sort(["rank", "start_ns", "end_ns", "_uid"], descending=[False, False, True, False])
        .with_columns(pl.int_range(pl.len(), dtype=i64).over("rank").alias("event_id"))
    )
    # uid -> event_id by a dense lookup array (uids are 0..n-1): a gather, not a join per link column.
    lookup = np.full(n_before + annotations.height, -1, dtype=np.int64)
    lookup[ev["_uid"].to_numpy()] = ev["event_id"].to_numpy()
    ev = ev.with_columns(_gather(ev["_launch_uid"], lookup, "launch_id"), _gather(ev["_op_uid"], lookup, "op_id"))
    cols = cols.with_columns(_gather(cols["_op_uid"], lookup, "op_id"))
    collectives = conform(
        "collectives", cols.with_columns(pl.col("coll_id").alias("ordinal"), pl.lit(False).alias("splits_truncated"))
    )
    return conform("events", ev), collectives


def _gather(uids: pl.Series, lookup: np.ndarray, name: str) -> pl.Series:
    """``lookup[uid]`` for every non-null uid; null where the uid is null or was dropped (-1)."""
    u = uids.fill_null(-1).to_numpy()
    out = pl.Series(name, np.where(u >= 0, lookup[np.clip(u, 0, None)], -1))
    return out.set(out == -1, None)  # type: ignore[arg-type]

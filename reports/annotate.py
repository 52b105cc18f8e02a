"""``ep-trace annotate``: every rank's trace with ep-trace's analysis added as extra tracks.

Kineto input: the rank's ORIGINAL trace document is written unchanged, byte for byte (all events,
flows, ``M`` metadata, ``distributedInfo``, ``deviceProperties``, ``schemaVersion``, original
timestamps), and ep-trace's own ``X`` events are appended at the end of ``traceEvents`` in a
process of their own ("ep-trace analysis (rank r)", sorted first): EP stages, communication,
barrier wait, wait-free transfer, exposed comm, the critical path (when the analysis has one) and
one slice per finding ("ep-trace findings": ``F1: <title>`` over its evidence window). The extra
events use the file's own time base (``ts`` µs since ``baseTimeNanoseconds``, or epoch µs), so
they line up with the original events; HTA and Perfetto read the files (tests/reports/test_annotate.py).
The caller passes the original documents (:class:`OriginalTrace`, read by the ingest layer:
``ep_trace.parsers.kineto_original``); this module never decodes a trace format.

Nsight / CUPTI input (no Chrome JSON to keep): the rank's canonical events (``tables.events``)
are written as a Chrome trace with the same extra tracks; ``ts`` is µs since the earliest event of
the job (``otherData.base_time_ns``) on the analysis' aligned clock, so a float64 keeps ns
precision and ranks loaded together line up.

Open the files in https://ui.perfetto.dev (docs/annotate.md: finding a finding's window).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, cast

import orjson
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.evidence import finding_evidence

__all__ = [
    "OriginalTrace",
    "TRACK_TIDS",
    "ANALYSIS_PID",
    "GPU_PID_BASE",
    "rank_offsets",
    "analysis_tracks",
    "annotated_trace",
    "annotated_traces",
]

#: pid of the extra "ep-trace analysis" process in every annotated file.
ANALYSIS_PID = 2_000_000
#: GPU activity of device d goes to pid GPU_PID_BASE + d (tid = stream), away from host pids.
GPU_PID_BASE = 1_000_000
#: Thread id of each analysis track (order = display order).
TRACK_TIDS: dict[str, int] = {
    "finding": 1,
    "critical_path": 2,
    "stage": 3,
    "comm": 4,
    "wait": 5,
    "transfer": 6,
    "exposed_comm": 7,
    "compute": 8,
}
_TRACK_NAMES = {
    "finding": "ep-trace findings",
    "critical_path": "critical path",
    "stage": "EP stages",
    "comm": "communication",
    "wait": "barrier wait",
    "transfer": "transfer (wait-free)",
    "exposed_comm": "exposed comm (not overlapped)",
    "compute": "compute",
}


class OriginalTrace(Protocol):
    """The original Kineto document of a rank (``ep_trace.parsers.kineto_original.KinetoOriginal``)."""

    @property
    def base_ns(self) -> int:
        """Epoch ns of the file's ``ts = 0``."""
        ...

    def with_events(self, events: list[bytes]) -> bytes:
        """The original document with ``events`` appended to ``traceEvents``."""
        ...


_GPU_KINDS = ("gpu_kernel", "gpu_memcpy", "gpu_memset", "gpu_annotation")


def rank_offsets(analysis: Analysis) -> pl.DataFrame:
    """Per rank: ns added to the rank's own clock to reach the analysis' aligned clock.

    = the parser's ``ranks.clock_offset_ns`` + the host offset the analysis estimated (``clock``).
    Events are on the rank's own clock; ``call_ranks`` and ``intervals`` are on the aligned clock.
    """
    rk = analysis.tables.ranks.select("rank", pl.col("host").fill_null("<unknown>"), "clock_offset_ns")
    ck = (
        analysis.clock.select("host", pl.col("offset_ns").alias("_host_off"))
        if analysis.clock.height
        else pl.DataFrame(schema={"host": pl.Utf8, "_host_off": pl.Int64})
    )
    return rk.join(ck, on="host", how="left").select(
        "rank", (pl.col("clock_offset_ns") + pl.col("_host_off").fill_null(0)).cast(pl.Int64).alias("offset_ns")
    )


def analysis_tracks(analysis: Analysis) -> pl.DataFrame:
    """Every analysis interval of every rank and step, aligned clock: rank, track, name, step, start_ns, end_ns.

    stage = the stage's device window (host range when it has no device work); comm / wait /
    transfer = each matched collective call split as in DESIGN.md §5; exposed_comm = every step's
    comm not covered by compute (``Analysis.exposed_comm``).
    """
    off = rank_offsets(analysis)
    st = analysis.stages
    parts = []
    if st.height:
        layer = (
            pl.when(pl.col("layer").is_not_null())
            .then(pl.lit(":l") + pl.col("layer").cast(pl.Utf8))
            .otherwise(pl.lit(""))
        )
        parts.append(
            st.join(off, on="rank", how="left").select(
                pl.col("rank").cast(pl.Int32),
                pl.lit("stage").alias("track"),
                pl.concat_str(
                    [pl.lit("ep:"), pl.col("stage"), layer, pl.lit(":"), pl.col("phase").fill_null("fwd")]
                ).alias("name"),
                pl.col("step").cast(pl.Int64),
                (pl.coalesce("start_ns", "cpu_start_ns") + pl.col("offset_ns").fill_null(0)).alias("start_ns"),
                (pl.coalesce("end_ns", "cpu_end_ns") + pl.col("offset_ns").fill_null(0)).alias("end_ns"),
            )
        )
    cr = analysis.call_ranks
    if cr.height:
        c = cr.select("match_id", pl.col("rank").cast(pl.Int32), "start_ns", "end_ns").join(
            analysis.calls.select(
                "match_id", "collective", "direction", "arrival_ns", "last_rank", pl.col("step").cast(pl.Int64)
            ),
            on="match_id",
        )
        label = pl.concat_str(
            [pl.col("collective"), pl.col("direction").fill_null("")], separator=":"
        ).str.strip_chars_end(":")
        parts += [
            c.select("rank", pl.lit("comm").alias("track"), label.alias("name"), "step", "start_ns", "end_ns"),
            c.select(
                "rank",
                pl.lit("wait").alias("track"),
                pl.format("wait for rank {}", "last_rank").alias("name"),
                "step",
                "start_ns",
                pl.min_horizontal("arrival_ns", "end_ns").alias("end_ns"),
            ),
            c.select(
                "rank",
                pl.lit("transfer").alias("track"),
                label.alias("name"),
                "step",
                pl.max_horizontal("start_ns", "arrival_ns").alias("start_ns"),
                "end_ns",
            ),
        ]
    if analysis.exposed_comm is not None:  # every step
        parts.append(
            analysis.exposed_comm.select(
                pl.col("rank").cast(pl.Int32),
                pl.lit("exposed_comm").alias("track"),
                pl.lit("exposed comm").alias("name"),
                pl.col("step").cast(pl.Int64),
                "start_ns",
                "end_ns",
            )
        )
    else:  # an Analysis built without it: the representative step's
        iv = analysis.intervals.filter(pl.col("track") == "exposed_comm")
        parts.append(
            iv.select(
                pl.col("rank").cast(pl.Int32), "track", "name", pl.col("step").cast(pl.Int64), "start_ns", "end_ns"
            )
        )
    cp = getattr(analysis, "critical_path", None)  # from the verdict analysis, when present
    if isinstance(cp, pl.DataFrame) and cp.height:
        cp_label: list[pl.Expr] = [pl.col("cause").cast(pl.Utf8).fill_null("unexplained")]
        if "stage" in cp.columns:
            cp_label += [pl.lit(": "), pl.col("stage").cast(pl.Utf8).fill_null("–")]
        if "name" in cp.columns:
            cp_label += [pl.lit(" "), pl.col("name").cast(pl.Utf8).fill_null("")]
        parts.append(
            cp.select(
                pl.col("rank").cast(pl.Int32),
                pl.lit("critical_path").alias("track"),
                pl.concat_str(cp_label).str.strip_chars().alias("name"),
                (pl.col("step") if "step" in cp.columns else pl.lit(None)).cast(pl.Int64).alias("step"),
                pl.col("start_ns").cast(pl.Int64),
                pl.col("end_ns").cast(pl.Int64),
            )
        )
    ev = [e for e in finding_evidence(analysis) if e.rank is not None and e.start_ns is not None]
    if ev:
        own = pl.DataFrame(
            {
                "rank": [e.rank for e in ev],
                "track": ["finding"] * len(ev),
                "name": [f"{e.fid}: {e.finding.title}" for e in ev],
                "step": [e.step for e in ev],
                "start_ns": [e.start_ns for e in ev],
                "end_ns": [e.end_ns for e in ev],
            },
            schema={
                "rank": pl.Int32,
                "track": pl.Utf8,
                "name": pl.Utf8,
                "step": pl.Int64,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
            },
        )
        # evidence windows are on the rank's own clock; every track here is on the aligned clock
        parts.append(
            own.join(off, on="rank", how="left").select(
                "rank",
                "track",
                "name",
                "step",
                pl.col("start_ns") + pl.col("offset_ns").fill_null(0),
                pl.col("end_ns") + pl.col("offset_ns").fill_null(0),
            )
        )
    out = pl.concat([p.cast({"start_ns": pl.Int64, "end_ns": pl.Int64}) for p in parts], how="vertical_relaxed")
    return out.filter(pl.col("end_ns") > pl.col("start_ns")).sort("rank", "track", "start_ns")


def _x_events(df: pl.DataFrame, base_ns: int) -> pl.DataFrame:
    """Complete ('X') events from a frame with name, cat, pid, tid, start_ns, end_ns, args."""
    return df.select(
        pl.col("name"),
        pl.col("cat"),
        pl.lit("X").alias("ph"),
        ((pl.col("start_ns") - base_ns) / 1000.0).alias("ts"),
        ((pl.col("end_ns") - pl.col("start_ns")) / 1000.0).alias("dur"),
        pl.col("pid").cast(pl.Int64),
        pl.col("tid").cast(pl.Int64),
        pl.col("args"),
    )


def _meta(pid: int, tid: int | None, kind: str, name: str) -> dict:
    ev: dict = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _aligned_events(analysis: Analysis) -> pl.LazyFrame:
    """Every event on the aligned clock, lazily: each rank's rows are read when its file is written
    (the events stay on disk when the tables keep them there: one rank in memory at a time)."""
    return (
        analysis.tables.scan_events()
        .join(rank_offsets(analysis).lazy(), on="rank", how="left", maintain_order="left")  # the file's event order
        .with_columns(
            pl.col("start_ns") + pl.col("offset_ns").fill_null(0), pl.col("end_ns") + pl.col("offset_ns").fill_null(0)
        )
    )


def _first_start(ev: pl.LazyFrame, tracks: pl.DataFrame) -> int:
    """The earliest aligned start of any event or track (0 when there is none)."""
    starts = [
        s for s in (ev.select(pl.col("start_ns").min()).collect().item(), tracks["start_ns"].min()) if s is not None
    ]
    return int(cast(int, min(starts))) if starts else 0


def _analysis_meta(rank: int, pid: int) -> list[dict]:
    meta = [
        _meta(pid, None, "process_name", f"ep-trace analysis (rank {rank})"),
        _meta(pid, None, "process_sort_index", "-1"),
    ]
    meta[1]["args"] = {"sort_index": -1}
    meta += [_meta(pid, tid, "thread_name", _TRACK_NAMES[t]) for t, tid in TRACK_TIDS.items()]
    meta += [
        {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        for tid in TRACK_TIDS.values()
    ]
    return meta


_QUOTED_TIME = re.compile(rb'"(ts|dur)":"(-?\d+\.\d{3})"')


def _exact_us(ns: pl.Expr) -> pl.Expr:
    """ns -> the decimal string of µs with 3 ns digits (exact; a float64 of epoch µs is not)."""
    a = ns.abs()
    sign = pl.when(ns < 0).then(pl.lit("-")).otherwise(pl.lit(""))
    return pl.concat_str([sign, (a // 1000).cast(pl.Utf8), pl.lit("."), (a % 1000).cast(pl.Utf8).str.zfill(3)])


def _track_lines(tracks: pl.DataFrame, pid: int, base_ns: int) -> list[bytes]:
    """The extra tracks as encoded ``X`` events with exact decimal ``ts`` / ``dur`` (µs since ``base_ns``)."""
    if tracks.height == 0:
        return []
    ev = tracks.select(
        pl.col("name"),
        pl.lit("ep-trace").alias("cat"),
        pl.lit("X").alias("ph"),
        _exact_us(pl.col("start_ns") - base_ns).alias("ts"),
        _exact_us(pl.col("end_ns") - pl.col("start_ns")).alias("dur"),
        pl.lit(pid, pl.Int64).alias("pid"),
        pl.col("track").replace_strict(TRACK_TIDS, return_dtype=pl.Int64).alias("tid"),
        pl.struct(pl.col("track"), pl.col("step")).alias("args"),
    )
    text = _QUOTED_TIME.sub(rb'"\1":\2', ev.write_ndjson().encode())
    return text.splitlines()


def annotated_trace(
    analysis: Analysis,
    rank: int,
    base_ns: int | None = None,
    events: pl.DataFrame | pl.LazyFrame | None = None,
    tracks: pl.DataFrame | None = None,
    original: OriginalTrace | None = None,
) -> bytes:
    """The Chrome trace JSON (uncompressed bytes) of one rank with the analysis tracks added.

    With ``original`` (a Kineto document): that document unchanged plus the extra tracks, which are
    moved from the aligned clock back to the rank's own clock and written in the file's time base.
    Without: the rank's canonical events as a Chrome trace on the aligned clock (Nsight / CUPTI).

    Args:
        analysis: The analysis (its ``tables.events``, stages, calls and intervals).
        rank: Global rank.
        base_ns: Epoch ns of ``ts = 0`` without ``original``; default = the earliest event of the whole job.
        events: :func:`_aligned_events` (lazy, or a frame of them), shared when writing many ranks.
        tracks: Pre-computed :func:`analysis_tracks`.
        original: The rank's original Kineto document.
    """
    tr = analysis_tracks(analysis) if tracks is None else tracks
    a = tr.filter(pl.col("rank") == rank)
    if original is not None:
        off = rank_offsets(analysis).filter(pl.col("rank") == rank)["offset_ns"]
        shift = int(off[0]) if off.len() else 0
        own = a.with_columns(pl.col("start_ns") - shift, pl.col("end_ns") - shift)
        pids = analysis.tables.scan_events().filter(pl.col("rank") == rank).select(pl.col("pid").drop_nulls().unique())
        used = set(pids.collect()["pid"].to_list())
        pid = next(p for p in range(ANALYSIS_PID, ANALYSIS_PID + 1000) if p not in used)
        extra = _track_lines(own, pid, original.base_ns) + [orjson.dumps(m) for m in _analysis_meta(rank, pid)]
        return original.with_events(extra)
    ev = _aligned_events(analysis) if events is None else events.lazy()
    if base_ns is None:
        base_ns = _first_start(ev, tr)
    e = ev.filter(pl.col("rank") == rank).collect()
    is_gpu = pl.col("kind").is_in(list(_GPU_KINDS))
    e = e.with_columns(
        pl.when(is_gpu)
        .then(GPU_PID_BASE + pl.col("device").fill_null(0).cast(pl.Int64))
        .otherwise(pl.col("pid").fill_null(0))
        .alias("pid"),
        pl.when(is_gpu).then(pl.col("stream").fill_null(0)).otherwise(pl.col("tid").fill_null(0)).alias("tid"),
        pl.coalesce(pl.col("category").cast(pl.Utf8), pl.col("kind").cast(pl.Utf8)).alias("cat"),  # Categorical, Enum
        pl.struct(pl.col("kind"), pl.col("correlation"), pl.col("external_id").alias("External id")).alias("args"),
    )
    lines: list[bytes] = []
    x = _x_events(e, base_ns)
    if x.height:
        lines.extend(x.write_ndjson().encode().splitlines())
    lines.extend(_track_lines(a, ANALYSIS_PID, base_ns))
    meta = _analysis_meta(rank, ANALYSIS_PID)
    for dev in e.filter(is_gpu)["device"].fill_null(0).unique().sort().to_list():
        meta.append(_meta(GPU_PID_BASE + int(dev), None, "process_name", f"GPU {dev} (rank {rank})"))
    for pid in e.filter(~is_gpu)["pid"].unique().sort().to_list():
        meta.append(_meta(int(pid), None, "process_name", f"host pid {pid} (rank {rank})"))
    lines.extend(orjson.dumps(m) for m in meta)
    other = orjson.dumps({"ep_trace": "annotated", "rank": rank, "base_time_ns": base_ns})
    return b'{"displayTimeUnit":"ns","otherData":' + other + b',"traceEvents":[' + b",".join(lines) + b"]}"


def annotated_traces(
    analysis: Analysis,
    ranks: Sequence[int] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    originals: Mapping[int, OriginalTrace] | None = None,
) -> Iterator[tuple[str, bytes]]:
    """``(file name, gzip bytes)`` of ``rank{r}.ep-annotated.json.gz`` per rank, one at a time (the CLI
    writes each atomically: ``ep_trace.cli.outputs.write_annotated``).

    Ranks in ``originals`` keep their original Kineto document (plus the tracks); the others are
    rebuilt from the canonical events, all on one time base (the earliest event of the job), so
    loading several in Perfetto keeps ranks aligned.
    """
    originals = originals or {}
    ev = _aligned_events(analysis)
    tr = analysis_tracks(analysis)
    todo = (
        sorted(ranks)
        if ranks is not None
        else sorted(
            set(ev.select(pl.col("rank").unique()).collect()["rank"].to_list()) | set(tr["rank"].unique().to_list())
        )
    )
    base = _first_start(ev, tr)
    for i, r in enumerate(todo):
        doc = annotated_trace(analysis, int(r), base, ev, tr, original=originals.get(int(r)))
        yield f"rank{r}.ep-annotated.json.gz", gzip.compress(doc, compresslevel=6)
        if progress:
            progress("annotate", i + 1, len(todo))

"""``ep-trace annotate``: per-rank Chrome / Perfetto traces with ep-trace's findings as extra tracks.

Each output file holds the rank's canonical events (written from ``tables.events``, not copied from
the input file, so Nsight input works too) plus an "ep-trace analysis" process whose threads are
the analysis tracks of every step: EP stages (``Analysis.stages``), comm / barrier wait / transfer
of every matched collective (``call_ranks``), and exposed comm (``intervals``).
Open them in https://ui.perfetto.dev or chrome://tracing.

Chrome trace JSON timestamps are µs; we write ``ts`` as µs relative to the earliest event of the
job (``otherData.base_time_ns``), so a float64 keeps ns precision and ranks loaded together line up.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import orjson
import polars as pl

from ep_trace.analysis.result import Analysis

__all__ = [
    "TRACK_TIDS",
    "ANALYSIS_PID",
    "GPU_PID_BASE",
    "rank_offsets",
    "analysis_tracks",
    "annotated_trace",
    "write_annotated_traces",
]

#: pid of the extra "ep-trace analysis" process in every annotated file.
ANALYSIS_PID = 2_000_000
#: GPU activity of device d goes to pid GPU_PID_BASE + d (tid = stream), away from host pids.
GPU_PID_BASE = 1_000_000
#: Thread id of each analysis track (order = display order).
TRACK_TIDS: dict[str, int] = {"stage": 1, "comm": 2, "wait": 3, "transfer": 4, "exposed_comm": 5, "compute": 6}
_TRACK_NAMES = {
    "stage": "EP stages",
    "comm": "communication",
    "wait": "barrier wait",
    "transfer": "transfer (wait-free)",
    "exposed_comm": "exposed comm (not overlapped)",
    "compute": "compute",
}
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


def _aligned_events(analysis: Analysis) -> pl.DataFrame:
    ev = analysis.tables.events
    return ev.join(rank_offsets(analysis), on="rank", how="left").with_columns(
        pl.col("start_ns") + pl.col("offset_ns").fill_null(0), pl.col("end_ns") + pl.col("offset_ns").fill_null(0)
    )


def annotated_trace(
    analysis: Analysis,
    rank: int,
    base_ns: int | None = None,
    events: pl.DataFrame | None = None,
    tracks: pl.DataFrame | None = None,
) -> bytes:
    """The Chrome trace JSON (uncompressed bytes) of one rank with the analysis tracks added.

    Times are on the analysis' aligned clock (host offsets applied), so the extra tracks line up
    with the events and several ranks line up with each other.

    Args:
        analysis: The analysis (its ``tables.events``, stages, calls and intervals).
        rank: Global rank.
        base_ns: Epoch ns of ``ts = 0``; default = the earliest event of the whole job.
        events: Pre-computed :func:`_aligned_events` (speed-up when writing many ranks).
        tracks: Pre-computed :func:`analysis_tracks`.
    """
    ev = _aligned_events(analysis) if events is None else events
    tr = analysis_tracks(analysis) if tracks is None else tracks
    if base_ns is None:
        starts = [s for s in (ev["start_ns"].min(), tr["start_ns"].min()) if s is not None]
        base_ns = int(cast(int, min(starts))) if starts else 0
    e = ev.filter(pl.col("rank") == rank)
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
    parts = [_x_events(e, base_ns)]
    a = tr.filter(pl.col("rank") == rank)
    if a.height:
        a = a.with_columns(
            pl.lit("ep-trace").alias("cat"),
            pl.lit(ANALYSIS_PID).alias("pid"),
            pl.col("track").replace_strict(TRACK_TIDS, return_dtype=pl.Int64).alias("tid"),
            pl.struct(pl.col("track"), pl.col("step")).alias("args"),
        )
        # The args structs of the two parts differ, so each part is encoded on its own below.
        parts.append(_x_events(a, base_ns))
    lines: list[bytes] = []
    for p in parts:
        if p.height:
            lines.extend(p.write_ndjson().encode().splitlines())
    meta = [
        _meta(ANALYSIS_PID, None, "process_name", f"ep-trace analysis (rank {rank})"),
        _meta(ANALYSIS_PID, None, "process_sort_index", "-1"),
    ]
    meta += [_meta(ANALYSIS_PID, tid, "thread_name", _TRACK_NAMES[t]) for t, tid in TRACK_TIDS.items()]
    meta += [_meta(ANALYSIS_PID, tid, "thread_sort_index", str(tid)) for tid in TRACK_TIDS.values()]
    for dev in e.filter(is_gpu)["device"].fill_null(0).unique().sort().to_list():
        meta.append(_meta(GPU_PID_BASE + int(dev), None, "process_name", f"GPU {dev} (rank {rank})"))
    for pid in e.filter(~is_gpu)["pid"].unique().sort().to_list():
        meta.append(_meta(int(pid), None, "process_name", f"host pid {pid} (rank {rank})"))
    lines.extend(orjson.dumps(m) for m in meta)
    other = orjson.dumps({"ep_trace": "annotated", "rank": rank, "base_time_ns": base_ns})
    return b'{"displayTimeUnit":"ns","otherData":' + other + b',"traceEvents":[' + b",".join(lines) + b"]}"


def write_annotated_traces(
    analysis: Analysis,
    out_dir: str | Path,
    ranks: Sequence[int] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[Path]:
    """Write ``rank{r}.ep-annotated.json.gz`` per rank into ``out_dir``; returns the paths.

    All files share one time base (the earliest event of the job), so loading several in Perfetto
    keeps ranks aligned.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ev = _aligned_events(analysis)
    tr = analysis_tracks(analysis)
    todo = (
        sorted(ranks)
        if ranks is not None
        else sorted(set(ev["rank"].unique().to_list()) | set(tr["rank"].unique().to_list()))
    )
    starts = [s for s in (ev["start_ns"].min(), tr["start_ns"].min()) if s is not None]
    base = int(cast(int, min(starts))) if starts else 0
    paths = []
    for i, r in enumerate(todo):
        p = out / f"rank{r}.ep-annotated.json.gz"
        p.write_bytes(gzip.compress(annotated_trace(analysis, int(r), base, ev, tr), compresslevel=6))
        paths.append(p)
        if progress:
            progress("annotate", i + 1, len(todo))
    return paths

"""Pass 7 of :func:`~ep_trace.analysis.engine.analyze`: the per-rank rows read from the activity.

Everything that reads the device activity of every rank before the step graph takes its only copy
(:func:`~ep_trace.analysis.rank_pass.drain_blocks`): host stalls on the critical path and the stage
they sit in, the representative step's timeline, the exposed-comm and barrier-wait spans, and the
per-step breakdown (:mod:`~ep_trace.analysis.breakdown`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import rank_pass
from ep_trace.analysis.breakdown import step_breakdown
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.host_stalls import host_stalls
from ep_trace.analysis.intervals import range_join, subtract, union
from ep_trace.analysis.match_pass import MatchPass
from ep_trace.analysis.queued import queued_spans
from ep_trace.analysis.steps import assign_step
from ep_trace.analysis.wait_pass import WaitPass

__all__ = ["TimelinePass", "timeline_pass"]


@dataclass(frozen=True)
class TimelinePass:
    """Attributes: the :class:`~ep_trace.analysis.result.Analysis` frames of the same names."""

    host_stalls: pl.DataFrame
    intervals: pl.DataFrame
    exposed_comm: pl.DataFrame
    breakdown: pl.DataFrame


def timeline_pass(
    blocks: rank_pass.Blocks,
    first: rank_pass.FirstPass,
    second: rank_pass.SecondPass,
    windows: pl.DataFrame,
    m: MatchPass,
    w: WaitPass,
    config: AnalysisConfig,
) -> TimelinePass:
    """Host stalls, timeline rows, exposed comm and wait spans, breakdown, all from ``second.activity``."""
    act, stage_df, rank_off = second.activity, second.stages, m.rank_offsets
    arrivals = (
        m.matched.filter(pl.col("match_id").is_not_null())
        .select("rank", "coll_id", "match_id")
        .join(m.calls.select("match_id", "arrival_ns"), on="match_id")
        .join(rank_off, on="rank")
        .select("rank", "coll_id", (pl.col("arrival_ns") - pl.col("offset_ns")).alias("arrival_ns"))
    )
    stalls = rank_pass.by_block(
        blocks, lambda b, mt, a, r: host_stalls(b, mt, a, first.mode, r), first.blocking, m.matched, act, arrivals
    )
    # a stall is device idle time: in the step window holding it (an overlap scheduler's host ranges
    # run ahead of their windows)
    stalls = _locate(assign_step(stalls, windows, "start_ns", span="step"), stage_df)
    intervals = _intervals(
        w.steps, act, second.exposed_iv, stage_df, m.call_ranks, m.calls, rank_off, config, w.stragglers
    )
    # every step's exposed comm, as steps.exposed_comm_ns measures it (compute of the same step)
    exposed_comm = (
        second.exposed_union.join(rank_off, on="rank", how="left")
        .select(
            pl.col("rank").cast(pl.Int32),
            pl.col("step").cast(pl.Int64),
            (pl.col("start_ns") + pl.col("offset_ns").fill_null(0)).alias("start_ns"),
            (pl.col("end_ns") + pl.col("offset_ns").fill_null(0)).alias("end_ns"),
        )
        .sort("rank", "start_ns")
    )
    # the barrier-wait spans on each rank's own clock (the step windows' clock)
    wait_spans = m.valid_call_ranks.join(rank_off, on="rank", how="left").select(
        "rank",
        "step",
        (pl.col("start_ns") - pl.col("offset_ns").fill_null(0)).alias("start_ns"),
        (pl.min_horizontal("arrival_ns", "end_ns") - pl.col("offset_ns").fill_null(0)).alias("end_ns"),
    )
    breakdown = rank_pass.by_block(blocks, step_breakdown, windows, act, wait_spans, _unqueued(stalls, act, windows))
    return TimelinePass(stalls, intervals, exposed_comm, breakdown)


def _unqueued(stalls: pl.DataFrame, act: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The blocking calls' spans less the device's queued idle (:mod:`ep_trace.analysis.queued`): the
    breakdown's host-stall part is device idle that ending the call would have ended."""
    q = queued_spans(act.filter(pl.col("launch_end_ns").is_not_null())) if "launch_end_ns" in act.columns else None
    s = stalls.filter(pl.col("step").is_not_null()).select(pl.col("rank").cast(pl.Int32), "step", "start_ns", "end_ns")
    if q is None or q.is_empty() or s.is_empty():
        return s
    q = assign_step(q.with_columns(pl.col("rank").cast(pl.Int32)), windows, "start_ns", span="step")
    return subtract(s, q.filter(pl.col("step").is_not_null()).select(s.columns), ["rank", "step"])


def _locate(stalls: pl.DataFrame, stage_df: pl.DataFrame) -> pl.DataFrame:
    """Attach the innermost stage whose host range contains the stall start."""
    cols = ["rank", "step", "layer", "stage", "name", "start_ns", "end_ns", "stall_ns"]
    if stalls.is_empty():
        return stalls.with_columns(pl.lit(None, pl.Int32).alias("layer"), pl.lit(None, pl.Utf8).alias("stage")).select(
            cols
        )
    s = stalls.with_row_index("_i")
    j = range_join(
        s,
        stage_df.select("rank", "cpu_start_ns", "cpu_end_ns", "layer", "stage"),
        ("start_ns", "start_ns"),
        ("cpu_start_ns", "cpu_end_ns"),
    )
    j = (
        j.sort(
            ["cpu_start_ns", "cpu_end_ns", "stage", "layer"], descending=[True, False, False, False], nulls_last=True
        )
        .unique("_i", keep="first")
        .select("_i", "layer", "stage")
    )
    return s.join(j, on="_i", how="left").sort(["rank", "start_ns"]).select(cols)


def _intervals(
    steps_df: pl.DataFrame,
    act: pl.DataFrame,
    exposed_iv: pl.DataFrame,
    stage_df: pl.DataFrame,
    call_ranks: pl.DataFrame,
    calls: pl.DataFrame,
    rank_off: pl.DataFrame,
    config: AnalysisConfig,
    stragglers: pl.DataFrame,
) -> pl.DataFrame:
    """Timeline rows of the representative step (clock-aligned), for at most ``max_timeline_ranks`` ranks."""
    if steps_df.is_empty():
        return pl.DataFrame(
            schema={
                "rank": pl.Int32,
                "step": pl.Int64,
                "track": pl.Utf8,
                "name": pl.Utf8,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
            }
        )
    med = steps_df.group_by("step").agg(pl.col("step_time_ns").median().alias("m")).sort("m")
    rep = (
        config.representative_step
        if config.representative_step is not None
        else int(med["step"][(med.height - 1) // 2])
    )
    ranks = sorted(steps_df["rank"].unique().to_list())
    n = config.max_timeline_ranks
    if len(ranks) > n:
        keep = {ranks[round(i * (len(ranks) - 1) / max(n - 2, 1))] for i in range(n - 1)}
        keep.add(int(stragglers["rank"][0]))
        ranks = sorted(keep)
    a = act.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks))
    parts = [
        union(a.filter(pl.col("cls") == c), ["rank"]).with_columns(pl.lit(c).alias("track"), pl.lit(c).alias("name"))
        for c in ("comm", "compute")
    ]
    w = steps_df.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks)).select(
        "rank", pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end")
    )
    dev_w = a.group_by("rank").agg(pl.col("start_ns").min().alias("_s"), pl.col("end_ns").max().alias("_e"))
    w = w.join(dev_w, on="rank", how="left").select(
        "rank", pl.min_horizontal("w_start", "_s").alias("w_start"), pl.max_horizontal("w_end", "_e").alias("w_end")
    )
    x = (
        exposed_iv.join(w, on="rank")
        .filter((pl.col("end_ns") > pl.col("w_start")) & (pl.col("start_ns") < pl.col("w_end")))
        .select("rank", "start_ns", "end_ns")
    )
    parts.append(x.with_columns(pl.lit("exposed_comm").alias("track"), pl.lit("exposed comm").alias("name")))
    st = stage_df.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks)).select(
        "rank",
        pl.col("cpu_start_ns").alias("start_ns"),
        pl.col("cpu_end_ns").alias("end_ns"),
        pl.lit("stage").alias("track"),
        pl.concat_str([pl.col("stage"), pl.col("layer").cast(pl.Utf8).fill_null("-")], separator=":l").alias("name"),
    )
    parts.append(st)
    out = pl.concat([p.select("rank", "track", "name", "start_ns", "end_ns") for p in parts], how="vertical_relaxed")
    out = (
        out.join(rank_off, on="rank", how="left")
        .with_columns(pl.col("start_ns") + pl.col("offset_ns"), pl.col("end_ns") + pl.col("offset_ns"))
        .drop("offset_ns")
    )
    cr = call_ranks.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks)).join(
        calls.select("match_id", "arrival_ns", "collective"), on="match_id"
    )
    waits = cr.select(
        "rank", pl.lit("wait").alias("track"), "collective", pl.col("start_ns"), pl.col("arrival_ns").alias("end_ns")
    )
    trans = cr.select(
        "rank",
        pl.lit("transfer").alias("track"),
        "collective",
        pl.max_horizontal("start_ns", "arrival_ns").alias("start_ns"),
        "end_ns",
    )
    out = pl.concat(
        [out, waits.rename({"collective": "name"}), trans.rename({"collective": "name"})], how="vertical_relaxed"
    )
    return (
        out.filter(pl.col("end_ns") > pl.col("start_ns"))
        .with_columns(pl.lit(rep, pl.Int64).alias("step"))
        .select(pl.col("rank").cast(pl.Int32), "step", "track", "name", "start_ns", "end_ns")
        .sort(["rank", "track", "start_ns"])
    )

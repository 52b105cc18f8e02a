"""Steps of a rank without ``ProfilerStep`` or serving iterations: a user range that encloses most of
the work.

A profile taken without ``profiler.step()`` (a one-off ``with torch.profiler.profile():`` around a
model call, a benchmark script) has no step marker; as one whole-trace step it holds the profiler's
start-up and tear-down, reported as idle. Users mark their work with ``record_function`` (Kineto
``user_annotation``) or NVTX ranges instead: TraceLens' MoE micro-benchmarks wrap each iteration in
``MoE[experts=.., tokens=..]`` (../shared/external/kineto/tracelens_moe_micro).

Rule (per rank without a step marker): the host annotation name whose ranges hold the most device
work (the time of the activity launched inside them: kernels by their launch, CPU ranks' compute by
its start) is the step when they hold at least :data:`MOST` of the rank's device work; its ranges,
outermost first, become steps ``1, 2, ...`` (``method`` ``'user_range'``), each with its GPU copies
(Kineto's ``gpu_user_annotation`` of the same name) as its device envelope. Ranges of the
collective and ep-trace stage vocabularies (``nccl:*``, ``gloo:*``, ``ep:*``, ``## ... ##``) are
parts of a step, never steps. ``--steps 0`` keeps the whole trace as step 0 instead.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join

__all__ = ["MOST", "user_range_steps"]

#: Share of a rank's device work a user range name must hold to be its step.
MOST = 0.5
#: Range names that are parts of a step (collectives' annotations, ep-trace stages, TorchRec's
#: ``## name ##`` ranges, serving engines' draft forwards), never a step.
_PARTS = ("nccl:", "gloo:", "ep:", "## ", "draft step[")


def _ranges(events: pl.DataFrame, ranks: pl.Series) -> pl.DataFrame:
    """Outermost occurrences of each host annotation name on the ranks (an occurrence inside an earlier
    one of the same name on its thread is part of it)."""
    r = (
        events.filter(pl.col("rank").is_in(ranks.implode()) & (pl.col("kind") == "cpu_annotation"))
        .filter(~pl.any_horizontal(*[pl.col("name").str.starts_with(p) for p in _PARTS]))
        .select("rank", "name", "tid", "start_ns", "end_ns")
        .sort("rank", "name", "tid", "start_ns")
    )
    prev_end = pl.col("end_ns").cum_max().shift(1).over("rank", "name", "tid")
    return r.filter(prev_end.is_null() | (pl.col("start_ns") >= prev_end))


def _work_in(ranges: pl.DataFrame, act: pl.DataFrame) -> pl.DataFrame:
    """Device work time (ns) launched inside each name's ranges, per (rank, name): one pair per
    (activity row, range holding its anchor), nested names each counting it."""
    a = act.select(
        pl.col("rank").cast(ranges.schema["rank"]), "anchor_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("_d")
    )
    w = ranges.select("rank", "name", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e"))
    hit = range_join(a, w, ("anchor_ns", "anchor_ns"), ("_s", "_e"))
    return hit.group_by("rank", "name").agg(pl.col("_d").sum().alias("_in"))


def user_range_steps(windows: pl.DataFrame, events: pl.DataFrame, act: pl.DataFrame) -> pl.DataFrame:
    """``windows`` with each whole-trace step replaced by the user ranges that qualify (module rule).

    Args:
        windows: :func:`~ep_trace.analysis.steps.step_windows` of the ranks of ``events``.
        events: Their canonical events.
        act: Their device activity (:func:`~ep_trace.analysis.activity.device_activity`).

    Returns:
        The windows, the replaced ranks' rows now one per range (same columns).
    """
    whole = windows.filter(pl.col("method") == "whole_trace")["rank"]
    if whole.is_empty() or act.is_empty():
        return windows
    ranges = _ranges(events, whole)
    if ranges.is_empty():
        return windows
    total = act.group_by("rank").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_all"))
    share = (
        _work_in(ranges, act)
        .join(total.with_columns(pl.col("rank").cast(ranges.schema["rank"])), on="rank")
        .with_columns((pl.col("_in") / pl.col("_all")).alias("_share"))
        .filter(pl.col("_share") >= MOST)
        .sort(["rank", "_share", "name"], descending=[False, True, False])
        .unique("rank", keep="first")
    )
    if share.is_empty():
        return windows
    chosen = ranges.join(share.select("rank", "name"), on=["rank", "name"]).sort("rank", "start_ns")
    env = _envelopes(events, chosen)
    steps = chosen.with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("rank").alias("step")).join(
        env, on=["rank", "start_ns"], how="left"
    )
    rows = steps.select(
        "rank",
        "step",
        "start_ns",
        "end_ns",
        pl.col("start_ns").alias("host_start_ns"),
        pl.col("end_ns").alias("host_end_ns"),
        "env_start_ns",
        "env_end_ns",
        "tid",
        pl.lit("user_range").alias("method"),
        pl.lit(None, pl.Utf8).alias("phase"),
        pl.col("name").alias("marker"),
    )
    kept = windows.filter(~pl.col("rank").is_in(chosen["rank"].unique().implode()))
    return pl.concat([kept, rows.cast(windows.schema)]).sort("rank", "step")


def _envelopes(events: pl.DataFrame, chosen: pl.DataFrame) -> pl.DataFrame:
    """The GPU copies (same name) of each chosen range: those starting after it and before the next."""
    gpu = (
        events.filter(pl.col("kind") == "gpu_annotation")
        .join(chosen.select("rank", "name").unique(), on=["rank", "name"], how="semi")
        .select("rank", "name", "start_ns", "end_ns")
        .sort("start_ns")
    )
    if gpu.is_empty():
        return pl.DataFrame(
            schema={
                "rank": chosen.schema["rank"],
                "start_ns": pl.Int64,
                "env_start_ns": pl.Int64,
                "env_end_ns": pl.Int64,
            }
        )
    host = chosen.select("rank", "name", pl.col("start_ns").alias("_hs")).sort("_hs")
    return (
        gpu.join_asof(
            host, left_on="start_ns", right_on="_hs", by=["rank", "name"], strategy="backward", check_sortedness=False
        )
        .filter(pl.col("_hs").is_not_null())
        .group_by("rank", "_hs")
        .agg(pl.col("start_ns").min().alias("env_start_ns"), pl.col("end_ns").max().alias("env_end_ns"))
        .rename({"_hs": "start_ns"})
    )

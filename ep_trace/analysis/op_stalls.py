"""Op calls that stall on a CPU rank: far slower than the same op's usual time in the same stage.

A CPU rank's op is host code: besides its work, a call can absorb a page-fault storm, a
``munmap`` whose TLB shootdown waits for a descheduled vCPU, or the thread losing its core to
another rank. Such a call takes 10-1000x the op's usual time while its work is unchanged. The
permute and unpermute stages repeat the same ops on the same number of rows in every layer and
step, and on every rank (each permutes its own ``T x top_k`` rows), so the op's usual time is the
median of its calls on the rank where that median is lowest, and a call far above it is a stall:

    usual(stage, op) = min over CPU ranks of the median duration of the rank's calls of op in stage
    stall of a call  = duration - usual, for calls with duration >= max(10 x usual, 1 ms)

The reference is across ranks because a rank can stall in most of its calls (ranks 2 and 3 of the
example below: ``aten::index_select`` of permute had a median of 5.7 ms there, 73 us on rank 0),
and the factor of 10 leaves ranks that merely carry more rows (uneven batches of a serving engine).

Top-level ops only (an op not nested in another op of its thread), so that ``aten::empty_like``
and the ``aten::empty_strided`` inside it are one call. GPU ranks have none: their stage time is
device kernels, whose duration does not include the host's stalls.

Why it matters: the ``fused_permute`` what-if halves permute / unpermute compute (a fused kernel
moves the data once). A stall is not data movement and fusing does not remove it. On the README
example on a 2-vCPU VM (benchmarks/README.md, stop 21), ranks 2 and 3 spent 21-31 ms per step in
permute + unpermute against 2.4 ms for rank 0 doing the same work; ``aten::empty_strided`` had a
median of 11 us and a 90th percentile of ~10 ms there.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join, top_level_cpu_ops

__all__ = [
    "stage_op_stalls",
    "stage_calls",
    "stalls_of_calls",
    "stall_share",
    "STALL_SCHEMA",
    "STALL_FACTOR",
    "STALL_FLOOR_NS",
    "PERMUTE_STAGES",
]

#: A call is a stall at this many times its op's median, and ...
STALL_FACTOR = 10.0
#: ... at least this long (ns): a 30 us call of a 2 us op is noise, not a stall.
STALL_FLOOR_NS = 1_000_000
#: The stages whose ops do the same work in every layer and step.
PERMUTE_STAGES = ("permute", "unpermute")

STALL_SCHEMA = {
    "rank": pl.Int32,
    "stage": pl.Utf8,
    "busy_ns": pl.Int64,
    "stall_ns": pl.Int64,
    "stall_calls": pl.Int64,
    "top_op": pl.Utf8,
}


def stage_op_stalls(
    ev: pl.DataFrame, stages: pl.DataFrame, cpu_ranks: frozenset[int], names: tuple[str, ...] = PERMUTE_STAGES
) -> pl.DataFrame:
    """Stalled op calls of each CPU rank's ``names`` stages over the analysed steps.

    Args:
        ev: Events (``rank, tid, kind, name, start_ns, end_ns``; the rank's own clock, as the
            stages' host windows).
        stages: ``Analysis.stages`` (``rank, step, stage, cpu_start_ns, cpu_end_ns``); rows with a
            null step (outside the analysed steps) are left out.
        cpu_ranks: Ranks whose work is host ops.
        names: Stages to look at.

    Returns:
        :data:`STALL_SCHEMA`, one row per (rank, stage) with top-level ops: ``busy_ns`` the sum of
        their durations, ``stall_ns`` the stalls' sum (ns over all analysed steps), ``stall_calls``
        how many calls stalled, ``top_op`` the op name with the largest stall sum (null if none).
    """
    return stalls_of_calls(stage_calls(ev, stages, cpu_ranks, names))


def stage_calls(
    ev: pl.DataFrame, stages: pl.DataFrame, cpu_ranks: frozenset[int], names: tuple[str, ...] = PERMUTE_STAGES
) -> pl.DataFrame:
    """The top-level op calls inside the CPU ranks' ``names`` stage windows of the analysed steps:
    ``rank, _stage, name, _d`` (duration, ns). A few per layer: the per-block passes keep them all,
    so that the op's usual time is the minimum over every rank (:func:`stalls_of_calls`)."""
    empty = pl.DataFrame(schema={"rank": pl.Int32, "_stage": pl.Utf8, "name": pl.Utf8, "_d": pl.Int64})
    if not cpu_ranks or stages.is_empty() or ev.is_empty():
        return empty
    ranks = sorted(cpu_ranks)
    win = stages.filter(
        pl.col("rank").is_in(ranks)
        & pl.col("stage").is_in(list(names))
        & pl.col("step").is_not_null()
        & pl.col("cpu_start_ns").is_not_null()
        & pl.col("cpu_end_ns").is_not_null()
    ).select(
        "rank", pl.col("stage").alias("_stage"), pl.col("cpu_start_ns").alias("_s0"), pl.col("cpu_end_ns").alias("_s1")
    )
    if win.is_empty():
        return empty
    top = top_level_cpu_ops(ev.filter(pl.col("rank").is_in(ranks)), ("name",)).drop("tid")
    inside = range_join(top, win, ("start_ns", "end_ns"), ("_s0", "_s1")).filter(
        (pl.col("start_ns") >= pl.col("_s0")) & (pl.col("end_ns") <= pl.col("_s1"))
    )
    if inside.is_empty():
        return empty
    return inside.select(
        pl.col("rank").cast(pl.Int32),
        pl.col("_stage").cast(pl.Utf8),
        pl.col("name").cast(pl.Utf8),
        (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Int64).alias("_d"),
    )


def stalls_of_calls(calls: pl.DataFrame) -> pl.DataFrame:
    """:data:`STALL_SCHEMA` rows from :func:`stage_calls` rows (of every rank: the reference is theirs)."""
    if calls.is_empty():
        return pl.DataFrame(schema=STALL_SCHEMA)
    per_rank = pl.col("_d").median().over(["rank", "_stage", "name"])
    calls = calls.with_columns(per_rank.alias("_m")).with_columns(pl.col("_m").min().over(["_stage", "name"]))
    stalled = (pl.col("_d") >= pl.max_horizontal(STALL_FACTOR * pl.col("_m"), pl.lit(STALL_FLOOR_NS))).alias("_st")
    calls = calls.with_columns(stalled).with_columns(
        pl.when(pl.col("_st")).then(pl.col("_d") - pl.col("_m")).otherwise(0.0).alias("_x")
    )
    by_op = (
        calls.group_by(["rank", "_stage", "name"])
        .agg(pl.col("_x").sum().alias("_xo"))
        .filter(pl.col("_xo") > 0)
        .sort(["_xo", "name"], descending=[True, False])
        .group_by(["rank", "_stage"], maintain_order=True)
        .agg(pl.col("name").first().alias("top_op"))
    )
    out = (
        calls.group_by(["rank", "_stage"])
        .agg(
            pl.col("_d").sum().alias("busy_ns"),
            pl.col("_x").sum().round().alias("stall_ns"),
            pl.col("_st").sum().alias("stall_calls"),
        )
        .join(by_op, on=["rank", "_stage"], how="left")
        .sort("rank", "_stage")
    )
    return out.select(
        pl.col("rank").cast(pl.Int32),
        pl.col("_stage").cast(pl.Utf8).alias("stage"),
        pl.col("busy_ns").cast(pl.Int64),
        pl.col("stall_ns").cast(pl.Int64),
        pl.col("stall_calls").cast(pl.Int64),
        pl.col("top_op").cast(pl.Utf8),
    )


def stall_share(stalls: pl.DataFrame) -> dict[int, float]:
    """Per rank, the share (0..1) of its permute + unpermute op time that is stalls.

    Args:
        stalls: :func:`stage_op_stalls` rows.

    Returns:
        ``rank -> stall_ns / busy_ns`` summed over the rank's stages; ranks without rows are absent.
    """
    if stalls.is_empty():
        return {}
    per = stalls.group_by("rank").agg(pl.col("stall_ns").sum(), pl.col("busy_ns").sum()).filter(pl.col("busy_ns") > 0)
    share = (pl.col("stall_ns") / pl.col("busy_ns")).clip(0.0, 1.0)
    return {int(r): float(v) for r, v in per.select("rank", share).iter_rows()}

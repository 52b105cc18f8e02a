"""Per-rank tables of the analysis: the straggler table (over all groups and per process group) and
the rank summary (step-time percentiles, mean comm / compute / exposed comm / wait per step, overlap
efficiency, wait uncertainty)."""

from __future__ import annotations

import polars as pl

__all__ = ["stragglers", "group_stragglers", "rank_summary", "with_uncertainty"]


def stragglers(ranks: pl.DataFrame, vcalls: pl.DataFrame, vcr: pl.DataFrame, steps: pl.Series) -> pl.DataFrame:
    """Per rank: times last, induced wait, lateness (last - second-last arrival) and its P50 over steps.

    Ranked by the P50 over steps of the per-step lateness: one warm-up step where a single early rank
    waits a second for everybody must not decide who the straggler is.
    """
    own = vcr.group_by("rank").agg(pl.col("wait_ns").sum().alias("total_wait_ns"))
    last = vcalls.group_by("last_rank").agg(pl.len().cast(pl.Int64).alias("times_last"), pl.col("lateness_ns").sum())
    induced = (
        vcr.filter(pl.col("rank") != pl.col("waited_for"))
        .group_by(pl.col("waited_for").alias("last_rank"))
        .agg(pl.col("wait_ns").sum().alias("induced_wait_ns"))
    )
    per_step = vcalls.group_by(["last_rank", "step"]).agg(pl.col("lateness_ns").sum().alias("_l"))
    grid = ranks.select("rank").join(pl.DataFrame({"step": steps.unique()}), how="cross")
    p50 = (
        grid.join(per_step.rename({"last_rank": "rank"}), on=["rank", "step"], how="left", nulls_equal=True)
        .group_by("rank")
        .agg(pl.col("_l").fill_null(0).median().round(0).cast(pl.Int64).alias("lateness_p50_ns"))
    )
    return (
        ranks.select("rank")
        .join(last.rename({"last_rank": "rank"}), on="rank", how="left")
        .join(induced.rename({"last_rank": "rank"}), on="rank", how="left")
        .join(own, on="rank", how="left")
        .join(p50, on="rank", how="left")
        .with_columns(
            pl.col("times_last").fill_null(0),
            pl.col("induced_wait_ns").fill_null(0),
            pl.col("lateness_ns").fill_null(0),
            pl.col("total_wait_ns").fill_null(0),
            pl.col("lateness_p50_ns").fill_null(0),
        )
        .sort(["lateness_p50_ns", "lateness_ns", "rank"], descending=[True, True, False])
    )


def group_stragglers(vcalls: pl.DataFrame, vcr: pl.DataFrame) -> pl.DataFrame:
    """Per process group: its ranks in the matched calls, the calls, the wait inside it, and its straggler.

    The straggler of a group is the member the others waited for most in the group's calls (an EP
    group's straggler need not be the world's: in the EP-2 gloo trace rank 3 holds up its EP group
    {2, 3} and, through rank 2, the expert-data-parallel group {0, 2}). Null when nobody waited.

    Args:
        vcalls: The valid matched calls (``pg_name``, ``last_rank``).
        vcr: Their (call, rank) rows with ``pg_name``.

    Returns:
        ``pg_name, ranks, matched_calls, wait_ns, straggler, times_last, induced_wait_ns``.
    """
    members = vcr.group_by("pg_name").agg(
        pl.col("rank").unique().sort().alias("ranks"),
        pl.col("wait_ns").sum(),
        pl.col("match_id").n_unique().cast(pl.Int64).alias("matched_calls"),
    )
    induced = (
        vcr.filter(pl.col("rank") != pl.col("waited_for"))
        .group_by(["pg_name", "waited_for"])
        .agg(pl.col("wait_ns").sum().alias("induced_wait_ns"))
        .filter(pl.col("induced_wait_ns") > 0)
        .sort(["pg_name", "induced_wait_ns", "waited_for"], descending=[False, True, False])
        .group_by("pg_name", maintain_order=True)
        .first()
        .rename({"waited_for": "straggler"})
    )
    last = vcalls.group_by(["pg_name", pl.col("last_rank").alias("straggler")]).agg(
        pl.len().cast(pl.Int64).alias("times_last")
    )
    return (
        members.join(induced, on="pg_name", how="left")
        .join(last, on=["pg_name", "straggler"], how="left")
        .with_columns(pl.when(pl.col("straggler").is_not_null()).then(pl.col("times_last").fill_null(0)))
        .select("pg_name", "ranks", "matched_calls", "wait_ns", "straggler", "times_last", "induced_wait_ns")
        .sort("pg_name")
    )


def rank_summary(steps_df: pl.DataFrame, ranks: pl.DataFrame, mode: dict[int, str]) -> pl.DataFrame:
    """Per rank: step time P50 / P95 / P99 / max, mean comm / compute / exposed comm / wait / transfer per
    step (ns), overlap efficiency, the number of steps and the rank's mode (gpu / cpu)."""
    q = lambda c, p: pl.col(c).quantile(p, "linear")  # noqa: E731
    s = steps_df.group_by("rank").agg(
        q("step_time_ns", 0.5).alias("step_time_ns"),
        pl.col("step_time_ns").max().alias("step_time_max_ns"),
        q("step_time_ns", 0.95).alias("step_time_p95_ns"),
        q("step_time_ns", 0.99).alias("step_time_p99_ns"),
        pl.col("comm_ns").mean(),
        pl.col("compute_ns").mean(),
        pl.col("exposed_comm_ns").mean(),
        q("exposed_comm_ns", 0.5).alias("exposed_comm_p50_ns"),
        q("exposed_comm_ns", 0.95).alias("exposed_comm_p95_ns"),
        pl.when(pl.col("comm_ns").sum() > 0)
        .then(pl.col("overlapped_ns").sum() / pl.col("comm_ns").sum())
        .otherwise(float("nan"))
        .alias("overlap_efficiency"),
        pl.col("barrier_wait_ns").mean(),
        q("barrier_wait_ns", 0.95).alias("barrier_wait_p95_ns"),
        pl.col("transfer_ns").mean(),
        pl.len().alias("n_steps"),
    )
    s = s.with_columns(pl.col(c).round(0).cast(pl.Int64) for c in s.columns if c.endswith("_ns"))
    md = pl.DataFrame({"rank": list(mode), "mode": list(mode.values())}, schema={"rank": pl.Int32, "mode": pl.Utf8})
    return ranks.select("rank", "host").join(s, on="rank", how="inner").join(md, on="rank", how="left").sort("rank")


def with_uncertainty(rank_summary: pl.DataFrame, call_ranks: pl.DataFrame) -> pl.DataFrame:
    """``rank_summary`` with ``wait_uncertainty_ns``: the largest clock uncertainty of the rank's calls."""
    u = call_ranks.group_by("rank").agg(pl.col("uncertainty_ns").max().alias("wait_uncertainty_ns"))
    return rank_summary.join(u, on="rank", how="left").with_columns(pl.col("wait_uncertainty_ns").fill_null(0))

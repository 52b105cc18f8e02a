"""Per-rank tables of the analysis: the straggler table and the rank summary (step-time percentiles,
mean comm / compute / exposed comm / wait per step, overlap efficiency, wait uncertainty)."""

from __future__ import annotations

import polars as pl

__all__ = ["stragglers", "rank_summary", "with_uncertainty"]


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

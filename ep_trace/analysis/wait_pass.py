"""Pass 5 of :func:`~ep_trace.analysis.engine.analyze`: waits, stragglers and the per-step table.

From the matched calls: the wait matrix (time rank i waited for rank j, the last arriver), the
straggler ranking, and one row per (rank, step) joining the step window, its overlap figures and
its barrier wait / transfer; then the per-rank summary.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import rank_tables
from ep_trace.analysis.match_pass import MatchPass

__all__ = ["WaitPass", "wait_pass"]


@dataclass(frozen=True)
class WaitPass:
    """Attributes: the :class:`~ep_trace.analysis.result.Analysis` frames of the same names."""

    wait_matrix: pl.DataFrame
    stragglers: pl.DataFrame
    steps: pl.DataFrame
    rank_summary: pl.DataFrame


def wait_pass(
    m: MatchPass, windows: pl.DataFrame, overlap: pl.DataFrame, ranks: pl.DataFrame, mode: dict[int, str]
) -> WaitPass:
    """Waits per pair of ranks and per step, stragglers, the step table and the rank summary."""
    vcr = m.valid_call_ranks
    wait_matrix = (
        vcr.filter(pl.col("rank") != pl.col("waited_for"))
        .group_by(["rank", "waited_for"])
        .agg(pl.col("wait_ns").sum())
        .select(pl.col("rank").alias("waiter"), "waited_for", "wait_ns")
        .sort(["waiter", "waited_for"])
    )
    stragglers = rank_tables.stragglers(ranks, m.calls.filter(pl.col("valid")), vcr, windows["step"])
    steps_df = _step_table(windows, overlap, vcr)
    rank_summary = rank_tables.with_uncertainty(rank_tables.rank_summary(steps_df, ranks, mode), m.call_ranks)
    return WaitPass(wait_matrix, stragglers, steps_df, rank_summary)


def _step_table(windows: pl.DataFrame, overlap: pl.DataFrame, vcr: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): window, comm / compute / overlap / exposed comm, barrier wait, transfer."""
    per_step_wait = vcr.group_by(["rank", "step"]).agg(
        pl.col("wait_ns").sum().alias("barrier_wait_ns"), pl.col("transfer_ns").sum()
    )
    return (
        windows.select(
            "rank",
            "step",
            "start_ns",
            "end_ns",
            (pl.col("end_ns") - pl.col("start_ns")).alias("step_time_ns"),
            "host_start_ns",
            "host_end_ns",
            "phase",
        )
        .join(overlap, on=["rank", "step"], how="left")
        .join(per_step_wait, on=["rank", "step"], how="left", nulls_equal=True)
        .select(
            "rank",
            "step",
            "start_ns",
            "end_ns",
            "step_time_ns",
            pl.col("a_ns").fill_null(0).alias("comm_ns"),
            pl.col("b_ns").fill_null(0).alias("compute_ns"),
            pl.col("both_ns").fill_null(0).alias("overlapped_ns"),
            pl.col("a_only_ns").fill_null(0).alias("exposed_comm_ns"),
            pl.col("barrier_wait_ns").fill_null(0),
            pl.col("transfer_ns").fill_null(0),
            "host_start_ns",
            "host_end_ns",
            "phase",
        )
        .sort(["rank", "step"])
    )

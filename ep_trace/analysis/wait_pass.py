"""Pass 5 of :func:`~ep_trace.analysis.engine.analyze`: waits, stragglers and the per-step table.

From the matched calls: the wait matrix per process group (time rank i waited for rank j, the last
arriver, in the calls of one group), the straggler ranking (over all groups and per group), and one row per (rank, step) joining the step window, its overlap figures and
its barrier wait / transfer; then the per-rank summary.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import rank_tables
from ep_trace.analysis.intervals import union_length
from ep_trace.analysis.match_pass import MatchPass

__all__ = ["WaitPass", "wait_pass"]


@dataclass(frozen=True)
class WaitPass:
    """Attributes: the :class:`~ep_trace.analysis.result.Analysis` frames of the same names."""

    wait_matrix: pl.DataFrame
    stragglers: pl.DataFrame
    group_stragglers: pl.DataFrame
    steps: pl.DataFrame
    rank_summary: pl.DataFrame


def wait_pass(
    m: MatchPass, windows: pl.DataFrame, overlap: pl.DataFrame, ranks: pl.DataFrame, mode: dict[int, str]
) -> WaitPass:
    """Waits per process group and pair of ranks and per step, stragglers, the step table and the rank
    summary. A wait is charged only between ranks of one group: calls are matched within their group
    (:mod:`~ep_trace.analysis.matching`), so the rank waited for is always a member."""
    vcalls = m.calls.filter(pl.col("valid"))
    vcr = m.valid_call_ranks.join(m.calls.select("match_id", "pg_name"), on="match_id", how="left")
    wait_matrix = (
        vcr.filter(pl.col("rank") != pl.col("waited_for"))
        .group_by(["pg_name", "rank", "waited_for"])
        .agg(pl.col("wait_ns").sum())
        .select("pg_name", pl.col("rank").alias("waiter"), "waited_for", "wait_ns")
        .sort(["pg_name", "waiter", "waited_for"])
    )
    stragglers = rank_tables.stragglers(ranks, vcalls, vcr, windows["step"])
    steps_df = _step_table(windows, overlap, vcr)
    rank_summary = rank_tables.with_uncertainty(rank_tables.rank_summary(steps_df, ranks, mode), m.call_ranks)
    return WaitPass(wait_matrix, stragglers, rank_tables.group_stragglers(vcalls, vcr), steps_df, rank_summary)


def _step_table(windows: pl.DataFrame, overlap: pl.DataFrame, vcr: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): window, comm / compute / overlap / exposed comm, barrier wait, transfer.

    The barrier wait of a step is the time the rank spent waiting: the union of its calls' wait spans
    ``[s_r, s_r + wait_r)``, not their sum, which counts twice the waits of calls in flight together
    (the chunked sample: two chunk all-to-alls on gloo's two worker threads summed 150 ms of wait in
    a 127 ms step). Without concurrent calls the two agree.
    """
    spans = vcr.select("rank", "step", "start_ns", (pl.col("start_ns") + pl.col("wait_ns")).alias("end_ns"))
    per_step_wait = (
        vcr.group_by(["rank", "step"])
        .agg(pl.col("transfer_ns").sum())
        .join(union_length(spans, ["rank", "step"], "barrier_wait_ns"), on=["rank", "step"], how="left")
        .with_columns(pl.col("barrier_wait_ns").fill_null(0))
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

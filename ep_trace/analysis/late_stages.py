"""Where a straggler's lateness lies: its compute stages' time above the other ranks'.

The ``no_straggler`` what-if says how much a late rank costs; this says in which stage the extra
time sits, so that the remedy can point at it (a sleep or a stall inside the expert stage, a slow
permute on one host) instead of listing every possible cause.

Per stage, per step (summed over layers and microbatches): the rank's stage wall time (CPU ranks: the
host range ``cpu_end_ns - cpu_start_ns`` where recorded, since the window spans only the stage's ops
and a sleep or a blocked wait inside the range is lateness too; GPU ranks: the device ``window_ns``,
the host range of an asynchronous launch says nothing of when the work ran) minus the median over the
other ranks of theirs, clipped at 0, then the mean over the analysed steps. Communication stages
(``dispatch``, ``combine`` and any stage whose time is mostly comm) are left out: there a rank waits
for the late one, it does not make itself late. For the ``expert`` stage the other ranks' time is
scaled to the rank's load (routing counts or splits): ``L_r x median_q (E_q / L_q)``, so that more
tokens are not read as lateness (that part is ``balanced_routing``'s).

The part of that excess during which none of the stage's ops runs (range minus ``busy_ns``, above the
other ranks' median of the same, at most the excess) is ``idle_ns``: a sleep, a lock or a blocking
call, not slower compute. On the README example (``--straggler 2:30``: rank 2 sleeps 30 ms in each of
its 2 expert stages) rank 2's expert excess is 50-64 ms per step on the 2-vCPU VM, nearly all idle.
"""

from __future__ import annotations

import polars as pl

__all__ = ["late_stages", "COMM_STAGES", "LATE_SCHEMA"]

#: Stages in which a rank mostly waits for the others (their lateness, not its own).
COMM_STAGES = ("dispatch", "combine")

LATE_SCHEMA = {"stage": pl.Utf8, "excess_ns": pl.Int64, "idle_ns": pl.Int64}


def late_stages(
    stages: pl.DataFrame, rank_load: pl.DataFrame, rank: int, cpu_ranks: frozenset[int] = frozenset()
) -> pl.DataFrame:
    """Mean per step of ``rank``'s stage time above the other ranks', by compute stage.

    Args:
        stages: ``Analysis.stages`` (``rank, step, stage, cpu_start_ns, cpu_end_ns, window_ns, comm_ns``).
        rank_load: ``Analysis.rank_load`` (``rank, step, recv_rows``); may be empty.
        rank: The late rank.
        cpu_ranks: Ranks whose work is host ops (their stage time is the host range).

    Returns:
        :data:`LATE_SCHEMA` rows (``excess_ns``, ``idle_ns``: ns per step) for the stages with an
        excess of 1 ns or more, largest first; empty when the rank has no stage rows or is the only rank.
    """
    empty = pl.DataFrame(schema=LATE_SCHEMA)
    if stages.is_empty() or stages.filter(pl.col("rank") != rank).is_empty():
        return empty
    host = pl.col("rank").is_in(sorted(cpu_ranks))
    host_range = pl.coalesce(pl.col("cpu_end_ns") - pl.col("cpu_start_ns"), pl.col("window_ns"))
    wall = pl.when(host).then(host_range).otherwise(pl.col("window_ns"))
    per = (
        stages.filter(wall.is_not_null())
        .group_by(["rank", "step", "stage"])
        .agg(
            wall.sum().cast(pl.Float64).alias("_w"),
            (wall - pl.col("busy_ns").fill_null(0)).clip(lower_bound=0).sum().cast(pl.Float64).alias("_i"),
            pl.col("comm_ns").fill_null(0).sum().alias("_c"),
        )
    )
    comm_share = per.group_by("stage").agg((pl.col("_c").sum() / pl.col("_w").sum().clip(lower_bound=1.0)).alias("_s"))
    keep = comm_share.filter((pl.col("_s") < 0.5) & ~pl.col("stage").is_in(COMM_STAGES))["stage"]
    per = per.filter(pl.col("stage").is_in(keep.implode()))
    if not rank_load.is_empty():
        load = rank_load.group_by(["rank", "step"]).agg(pl.col("recv_rows").sum().cast(pl.Float64).alias("_L"))
        per = per.join(load, on=["rank", "step"], how="left")
    else:
        per = per.with_columns(pl.lit(None, dtype=pl.Float64).alias("_L"))
    own = per.filter(pl.col("rank") == rank)
    others = per.filter(pl.col("rank") != rank)
    ref = others.group_by(["step", "stage"]).agg(
        pl.col("_w").median().alias("_m"),
        pl.col("_i").median().alias("_mi"),
        (pl.col("_w") / pl.col("_L")).filter(pl.col("_L") > 0).median().alias("_rate"),
    )
    x = own.join(ref, on=["step", "stage"], how="inner")
    scaled = pl.col("_L") * pl.col("_rate")
    expected = (
        pl.when((pl.col("stage") == "expert") & scaled.is_not_null() & (pl.col("_L") > 0))
        .then(scaled)
        .otherwise(pl.col("_m"))
    )
    x = x.with_columns((pl.col("_w") - expected).clip(lower_bound=0.0).alias("_ex"))
    x = x.with_columns(
        pl.min_horizontal((pl.col("_i") - pl.col("_mi")).clip(lower_bound=0.0), pl.col("_ex")).alias("_id")
    )
    n = max(own["step"].n_unique(), 1)
    out = (
        x.group_by("stage")
        .agg((pl.col("_ex").sum() / n).alias("_ex"), (pl.col("_id").sum() / n).alias("_id"))
        .filter(pl.col("_ex") >= 1.0)
        .sort(["_ex", "stage"], descending=[True, False])
    )
    return out.select(
        pl.col("stage").cast(pl.Utf8),
        pl.col("_ex").round().cast(pl.Int64).alias("excess_ns"),
        pl.col("_id").round().cast(pl.Int64).alias("idle_ns"),
    )

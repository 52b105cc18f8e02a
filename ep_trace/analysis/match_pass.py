"""Pass 4 of :func:`~ep_trace.analysis.engine.analyze`: collectives matched across ranks, on aligned clocks.

Matching (:mod:`~ep_trace.analysis.matching`) pairs each rank's calls of one collective instance;
the clocks of hosts are aligned from the matched calls' ends (:mod:`~ep_trace.analysis.clocks`);
the calls are then measured again on the aligned clock (arrival, wait, transfer per rank), with a
causality tolerance of the clocks' residual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import polars as pl

from ep_trace.analysis import clocks, matching, stage_families
from ep_trace.analysis.config import AnalysisConfig

__all__ = ["MatchPass", "match_pass"]

_TOL_FLOOR_NS = 10_000  # 10 µs: below any collective's launch jitter, above µs rounding of old traces


@dataclass(frozen=True)
class MatchPass:
    """Collective instances across ranks.

    Attributes:
        matched: The analysed steps' collective rows with ``match_id`` (null: unmatched).
        calls: One row per matched instance (``matching.measure_calls``).
        call_ranks: One row per (instance, rank) with wait / transfer and the clock uncertainty.
        valid_call_ranks: ``call_ranks`` of the valid instances, with the instance's ``last_rank``.
        rank_offsets: ``rank, offset_ns``: each rank's clock offset to the aligned clock.
        clock: Per host: offset, whether aligned, residual.
        misaligned: Instances whose ranks disagree on the call (``matching.match_collectives``).
        notes: What was left out and why.
    """

    matched: pl.DataFrame
    calls: pl.DataFrame
    call_ranks: pl.DataFrame
    valid_call_ranks: pl.DataFrame
    rank_offsets: pl.DataFrame
    clock: pl.DataFrame
    misaligned: pl.DataFrame
    notes: tuple[str, ...]


def match_pass(
    collectives: pl.DataFrame,
    ranks: pl.DataFrame,
    windows: pl.DataFrame,
    stage_df: pl.DataFrame,
    config: AnalysisConfig,
) -> MatchPass:
    """Match, align clocks, measure: the cross-rank view of the collectives."""
    notes: list[str] = []
    world = max(ranks.height, int(cast(int, ranks["world_size"].max()) or 0) if ranks.height else 0)
    coll = stage_families.kernel_call_directions(collectives, stage_df)  # vLLM's PyNccl EP calls: their stage
    matched, misaligned = matching.match_collectives(coll, windows, world)
    n_setup = int(matched.filter(pl.col("step").is_null())["coll_id"].len())
    if n_setup:
        # setup collectives (a c10d::barrier before the first ProfilerStep, ...) are not part of any
        # analysed step: they would dominate every wait figure (1.61 s of 2.82 s in a skewed demo)
        notes.append(f"{n_setup} collective rows outside the analysed profiler steps (setup barriers...): left out")
    matched = matched.filter(pl.col("step").is_not_null())
    notes += _apart_notes(matched, world)
    rank_off, clock, tol, clock_ranks = _aligned_clocks(matched, ranks, config, notes)
    calls, call_ranks = matching.measure_calls(matched, ranks, rank_off, tol_ns=tol)
    call_ranks = call_ranks.join(_uncertainty(clock_ranks, clock), on="rank", how="left")
    valid_ids = calls.filter(pl.col("valid"))["match_id"]
    vcr = call_ranks.filter(pl.col("match_id").is_in(valid_ids.implode())).join(
        calls.select("match_id", "last_rank"), on="match_id"
    )
    notes += _call_notes(calls, tol)
    return MatchPass(matched, calls, call_ranks, vcr, rank_off, clock, misaligned, tuple(notes))


def _aligned_clocks(
    matched: pl.DataFrame, ranks: pl.DataFrame, config: AnalysisConfig, notes: list[str]
) -> tuple[pl.DataFrame, pl.DataFrame, int, pl.DataFrame]:
    """``(rank_offsets, clock, tolerance_ns, clock_ranks)``: offsets per clock domain (a host, or a rank
    off its host's clock) fitted on the complete multi-rank calls; ``clock_ranks`` = ranks by domain."""
    base = ranks.select("rank", pl.col("clock_offset_ns").alias("offset_ns"))
    calls0, cr0 = matching.measure_calls(matched, ranks, base, tol_ns=1 << 62)
    ok0 = calls0.filter(pl.col("complete") & (pl.col("n_ranks") > 1))
    cr0 = cr0.join(ok0.select("match_id", "collective"), on="match_id")
    domains = clocks.clock_domains(cr0, ranks)
    real, ranks = ranks, domains.ranks
    host_off = clocks.estimate_offsets(cr0, ranks, config.align_clocks, config.min_clock_calls)
    if config.align_clocks and host_off.height > 1:
        for h, n in host_off.filter(~pl.col("aligned")).select("host", "n_calls").iter_rows():
            notes.append(
                f"host {h}: only {n} matched collectives shared with host {host_off['host'][0]} (fewer than "
                f"{config.min_clock_calls}): its recorded clock (nsys UTC epoch / Kineto baseTimeNanoseconds) is kept, "
                "not aligned; cross-host waits carry its residual"
            )
    rank_off = clocks.rank_offsets(ranks, host_off)
    # cr0 times carry the parsers' offsets only; move them to the aligned clock
    cr0a = (
        cr0.join(base.rename({"offset_ns": "_b"}), on="rank")
        .join(rank_off.rename({"offset_ns": "_o"}), on="rank")
        .with_columns(pl.col(c) - pl.col("_b") + pl.col("_o") for c in ("start_ns", "end_ns"))
    )
    notes += clocks.check_domains(domains, host_off, cr0a, real, config.align_clocks, config.min_clock_calls)
    resid = clocks.residuals(cr0a, ranks)
    tol = _TOL_FLOOR_NS + clocks.uncertainty(cr0a, ranks)
    clock = host_off.join(resid, on="host", how="left").with_columns(pl.col("residual_ns").fill_null(0))
    return rank_off, clock, tol, ranks


def _uncertainty(ranks: pl.DataFrame, clock: pl.DataFrame) -> pl.DataFrame:
    """``rank, uncertainty_ns``: every wait figure carries the clock residual of its rank's host."""
    return (
        ranks.select("rank", pl.col("host").fill_null("<unknown>"))
        .join(clock.select("host", "residual_ns"), on="host", how="left")
        .select("rank", pl.col("residual_ns").fill_null(0).alias("uncertainty_ns"))
    )


def _apart_notes(matched: pl.DataFrame, world: int) -> list[str]:
    """What was kept apart from matching (:func:`~ep_trace.analysis.matching._apart`), and why."""
    apart = matched.filter(pl.col("unmatched").is_not_null())
    if apart.is_empty():
        return []
    sub = pl.col("group_size").filter(pl.col("group_size") < world).unique().sort()
    by = apart.group_by("unmatched").agg(pl.len().alias("n"), sub.alias("sizes"))
    out = []
    for why, n, sizes in by.sort("unmatched").iter_rows():
        if why == "group_of_one":
            out.append(f"{n} collective calls on groups of one rank: no other rank takes part, so no wait; not matched")
        else:
            out.append(
                f"{n} collective calls name no process group while some run on sub-groups of "
                f"{'/'.join(map(str, sizes))} ranks (gloo names its groups only through distributedInfo.pg_config, "
                "torch >= 2.4): which group each belongs to is unknown, so they are not matched across ranks and "
                "are left out of wait figures"
            )
    return out


def _call_notes(calls: pl.DataFrame, tol: int) -> list[str]:
    notes: list[str] = []
    if calls.height and not calls["complete"].all():
        notes.append(
            f"{int((~calls['complete']).sum())} matched calls miss ranks of their group (not in the trace set): "
            "wait and straggler cannot be measured for them (no wait / transfer split is claimed); left out of wait figures"
        )
    if calls.height and not calls["causal"].all():
        notes.append(
            f"{int((~calls['causal']).sum())} matched calls end on some rank before the last rank arrived "
            f"(beyond the {tol} ns clock uncertainty): likely mis-paired, left out of wait figures"
        )
    return notes

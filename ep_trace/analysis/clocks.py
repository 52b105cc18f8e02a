"""Clock alignment across hosts from matched collective end times.

Ranks on one host share a clock. A collective ends at (nearly) the same instant on every rank, so
for each matched call c and host h: d(c, h) = median of host h's end times - median of the
reference host's end times. The offset added to host h's times is -median_c d(c, h) (median: a
few calls with a late rank do not move it). The residual is the P95 over (call, rank of h) of
|e_r - median_r e_r| after alignment: the uncertainty attached to every wait figure.

Minimum: a host is aligned only from at least :data:`MIN_CALLS` matched calls shared with the
reference host. A median of fewer calls is moved by one late rank (a straggler's lateness would be
read as clock skew and then hidden), so with fewer the host keeps its recorded clock (nsys:
``TARGET_INFO_SESSION_START_TIME.utcEpochNs``; Kineto: ``baseTimeNanoseconds``), ``aligned`` is
False and the engine says so in the report notes; its residual is still shown.
"""

from __future__ import annotations

import polars as pl

__all__ = ["estimate_offsets", "rank_offsets", "residuals", "MIN_CALLS"]

#: Matched calls per (host, reference host) pair needed before a host's clock is moved.
MIN_CALLS = 8


def estimate_offsets(
    call_ranks: pl.DataFrame, ranks: pl.DataFrame, enabled: bool = True, min_calls: int = MIN_CALLS
) -> pl.DataFrame:
    """Per-host clock offsets.

    Args:
        call_ranks: ``match_id, rank, end_ns`` of valid matched calls (unaligned times).
        ranks: ``rank, host`` (null host = one unnamed host).
        enabled: ``False`` returns zero offsets (``--no-align-clocks``).
        min_calls: Shared matched calls needed to move a host (default :data:`MIN_CALLS`).

    Returns:
        Columns ``host, offset_ns, n_calls, aligned`` (one row per host; reference host = host of the
        lowest rank, ``aligned`` True; a host with fewer than :data:`MIN_CALLS` shared calls keeps
        offset 0 and ``aligned`` False).
    """
    rh = ranks.select("rank", pl.col("host").fill_null("<unknown>"))
    hosts = rh.group_by("host").agg(pl.col("rank").min().alias("_r")).sort("_r")
    zero = hosts.select(
        "host",
        pl.lit(0, pl.Int64).alias("offset_ns"),
        pl.lit(0, pl.Int64).alias("n_calls"),
        (pl.lit(hosts.height < 2) | (pl.col("host") == hosts["host"][0])).alias("aligned"),
    )
    if not enabled or hosts.height < 2 or call_ranks.is_empty():
        return zero
    ref = hosts["host"][0]
    # medians in float64 lose ns precision at epoch scale: work relative to the call's first end
    rel = call_ranks.with_columns((pl.col("end_ns") - pl.col("end_ns").min().over("match_id")).alias("end_ns"))
    per = rel.join(rh, on="rank").group_by(["match_id", "host"]).agg(pl.col("end_ns").median().alias("m"))
    refm = per.filter(pl.col("host") == ref).select("match_id", pl.col("m").alias("m_ref"))
    d = per.join(refm, on="match_id").with_columns((pl.col("m") - pl.col("m_ref")).alias("d"))
    est = d.group_by("host").agg(
        (-pl.col("d").median()).round(0).cast(pl.Int64).alias("offset_ns"), pl.len().cast(pl.Int64).alias("n_calls")
    )
    out = zero.select("host").join(est, on="host", how="left").with_columns(pl.col("n_calls").fill_null(0))
    is_ref = pl.col("host") == ref
    enough = is_ref | (pl.col("n_calls") >= min_calls)
    return out.with_columns(
        pl.when(enough & ~is_ref).then(pl.col("offset_ns")).otherwise(0).fill_null(0).alias("offset_ns"),
        enough.alias("aligned"),
    )


def rank_offsets(ranks: pl.DataFrame, host_offsets: pl.DataFrame) -> pl.DataFrame:
    """Per rank, what moves its recorded times onto the aligned clock: ``ranks.clock_offset_ns`` plus
    its host's estimated offset (``host, offset_ns`` from :func:`estimate_offsets`, 0 where absent).

    Returns:
        Columns ``rank, offset_ns`` (ns).
    """
    return (
        ranks.select("rank", pl.col("host").fill_null("<unknown>"), "clock_offset_ns")
        .join(host_offsets.select("host", "offset_ns"), on="host", how="left")
        .select("rank", (pl.col("clock_offset_ns") + pl.col("offset_ns").fill_null(0)).alias("offset_ns"))
    )


def residuals(call_ranks_aligned: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """P95 per host of |e_r - median end of the call| after alignment (ns); columns ``host, residual_ns``."""
    rh = ranks.select("rank", pl.col("host").fill_null("<unknown>"))
    return (
        call_ranks_aligned.with_columns((pl.col("end_ns") - pl.col("end_ns").min().over("match_id")).alias("_e"))
        .with_columns((pl.col("_e") - pl.col("_e").median().over("match_id")).abs().alias("_r"))
        .join(rh, on="rank")
        .group_by("host")
        .agg(pl.col("_r").quantile(0.95, "nearest").round(0).cast(pl.Int64).alias("residual_ns"))
    )

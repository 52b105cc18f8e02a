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

One rank off its host's clock (a trace whose timestamps sit 50 ms or an hour from its peers', a
rank whose calls are paired with the wrong calls of its peers): ranks of one host share a clock, so
on one clock a rank's collective ends lie within its host's call window (last end - last arrival;
a synchronising collective ends nowhere before the last rank arrived). :func:`clock_domains` puts a
rank whose median distance to its host's median end exceeds twice the median window (+ 10 µs) on a
clock of its own, aligned like a host; :func:`check_domains` refuses it, naming the rank, where it
cannot be aligned (too few calls, alignment off) or stays off after alignment: a wait measured on
it would be clock error, up to the offset per call (longer than the step).

The causality tolerance of matched calls (:func:`uncertainty`) is the clock error between clock
domains only (0 on one clock): the end spread of one host's ranks (ms on gloo) or of a few
mis-paired calls is no clock error, and as a tolerance it let calls that end 100 ms before their
last arrival count as causal (waits longer than the step, negative replayed what-ifs).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.errors import BadInputError

__all__ = [
    "estimate_offsets",
    "rank_offsets",
    "residuals",
    "uncertainty",
    "clock_domains",
    "check_domains",
    "ClockDomains",
    "MIN_CALLS",
    "SYNC_COLLECTIVES",
]

#: Matched calls per (host, reference host) pair needed before a host's clock is moved.
MIN_CALLS = 8
#: Collective types that end on no rank before the last rank arrived (send / recv / broadcast may):
#: their end times agree on one clock.
SYNC_COLLECTIVES = ("all_to_all", "all_to_allv", "allreduce", "allgather", "reduce_scatter", "barrier")
#: Distance below which a rank's ends are never called off its host's clock: above µs rounding.
FAR_FLOOR_NS = 10_000


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


def uncertainty(call_ranks_aligned: pl.DataFrame, ranks: pl.DataFrame) -> int:
    """Clock error between clock domains after alignment (ns): the largest, over domains, of the
    median over calls of |median end of the domain - median end of the reference domain|; 0 on one
    clock (ranks of one host share it). A median, so a few mis-paired calls do not widen it."""
    rh = ranks.select("rank", pl.col("host").fill_null("<unknown>"))
    hosts = rh.group_by("host").agg(pl.col("rank").min().alias("_r")).sort("_r")
    if hosts.height < 2 or call_ranks_aligned.is_empty():
        return 0
    rel = call_ranks_aligned.with_columns((pl.col("end_ns") - pl.col("end_ns").min().over("match_id")).alias("_e"))
    per = rel.join(rh, on="rank").group_by(["match_id", "host"]).agg(pl.col("_e").median().alias("m"))
    refm = per.filter(pl.col("host") == hosts["host"][0]).select("match_id", pl.col("m").alias("m_ref"))
    d = per.join(refm, on="match_id").group_by("host").agg((pl.col("m") - pl.col("m_ref")).abs().median().alias("u"))
    worst = d["u"].max()
    return int(round(float(worst))) if isinstance(worst, (int, float)) else 0


@dataclass(frozen=True)
class ClockDomains:
    """Ranks grouped by the clock they share.

    Attributes:
        ranks: ``ranks`` with ``host`` replaced by the clock domain (the host, or ``host/rank<r>`` for
            a rank on a clock of its own): what :func:`estimate_offsets`, :func:`rank_offsets`,
            :func:`residuals` and :func:`uncertainty` take.
        split: ``rank, host, dev_ns, window_ns, n_calls``: the ranks off their host's clock, with their
            real host, median distance of their ends to the host's median end, the host's median
            call window, and their matched calls.
        match_ids: The calls these distances were measured on (:func:`_coupled`).
    """

    ranks: pl.DataFrame
    split: pl.DataFrame
    match_ids: pl.Series


def _coupled(call_ranks: pl.DataFrame) -> pl.DataFrame:
    """The rows of synchronising calls in which every rank waited for the last arrival: in an
    all_to_allv a rank that exchanges no rows with the last arriver ends before it arrives
    (``matching._peer_arrival``); its end is then no reading of the others' clock."""
    coupled = (pl.col("arrival_ns") == pl.col("start_ns").max().over("match_id")).all().over("match_id")
    return call_ranks.filter(pl.col("collective").is_in(SYNC_COLLECTIVES) & coupled)


def _distance(call_ranks: pl.DataFrame, group: pl.DataFrame) -> pl.DataFrame:
    """Per rank, over its calls (:func:`_coupled`) shared with another rank of its ``group`` (``rank, g``):
    ``dev_ns`` median |end - the group's median end|, ``window_ns`` median (group's last end - last
    start), ``n_calls``."""
    g = ["match_id", "g"]
    cr = call_ranks.join(group, on="rank").filter(pl.len().over(g) >= 2)
    # float medians lose ns precision at epoch scale: ends relative to the call's first end
    rel = pl.col("end_ns") - pl.col("end_ns").min().over(g)
    window = (pl.col("end_ns").max().over(g) - pl.col("start_ns").max().over(g)).clip(0)
    return (
        cr.with_columns(rel.alias("_e"), window.alias("_w"))
        .with_columns((pl.col("_e") - pl.col("_e").median().over(g)).abs().alias("_d"))
        .group_by("rank")
        .agg(
            pl.col("_d").median().alias("dev_ns"),
            pl.col("_w").median().alias("window_ns"),
            pl.len().cast(pl.Int64).alias("n_calls"),
        )
    )


def _far() -> pl.Expr:
    return pl.col("dev_ns") > 2 * pl.col("window_ns") + FAR_FLOOR_NS


def clock_domains(call_ranks: pl.DataFrame, ranks: pl.DataFrame) -> ClockDomains:
    """Put every rank whose collective ends sit far from its host's (see the module doc) on a clock
    of its own.

    Args:
        call_ranks: ``match_id, rank, start_ns, end_ns, arrival_ns, collective`` of complete
            multi-rank matched calls, on the recorded clocks.
        ranks: ``rank, host, clock_offset_ns``.
    """
    real = ranks.select("rank", pl.col("host").fill_null("<unknown>"))
    coupled = _coupled(call_ranks)
    dist = _distance(coupled, real.rename({"host": "g"}))
    split = dist.filter(_far()).join(real, on="rank").select("rank", "host", "dev_ns", "window_ns", "n_calls")
    domain = pl.when(pl.col("rank").is_in(split["rank"].implode())).then(
        pl.format("{}/rank{}", pl.col("host").fill_null("<unknown>"), "rank")
    )
    by_domain = ranks.with_columns(domain.otherwise(pl.col("host")).alias("host"))
    return ClockDomains(by_domain, split.sort("rank"), coupled["match_id"].unique())


def _span(ns: float) -> str:
    """A duration for a message: 3,600.0 s, 50.0 ms, 120.0 µs."""
    for unit, scale in (("s", 1e9), ("ms", 1e6)):
        if abs(ns) >= scale:
            return f"{ns / scale:,.1f} {unit}"
    return f"{ns / 1e3:,.1f} µs"


def check_domains(
    domains: ClockDomains,
    offsets: pl.DataFrame,
    call_ranks_aligned: pl.DataFrame,
    ranks: pl.DataFrame,
    enabled: bool,
    min_calls: int = MIN_CALLS,
) -> list[str]:
    """Notes for the ranks aligned on a clock of their own; refuse one that could not be.

    Args:
        domains: :func:`clock_domains`.
        offsets: :func:`estimate_offsets` over ``domains.ranks``.
        call_ranks_aligned: The calls given to :func:`clock_domains`, on the aligned clock.
        ranks: The real ``rank, host``.
        enabled: Clock alignment on (``AnalysisConfig.align_clocks``).

    Raises:
        BadInputError: naming the rank, when it was not aligned (fewer than ``min_calls`` calls,
            alignment off) or its ends stay far from its host's after alignment (mis-paired calls).
    """
    if domains.split.is_empty():
        return []
    real = ranks.select("rank", pl.col("host").fill_null("<unknown>").alias("g"))
    aligned = call_ranks_aligned.filter(pl.col("match_id").is_in(domains.match_ids.implode()))
    after = _distance(aligned, real).select("rank", pl.col("dev_ns").alias("after_ns"), "window_ns")
    dom = domains.ranks.select("rank", pl.col("host").alias("domain"))
    rows = (
        domains.split.join(dom, on="rank")
        .join(offsets.select(pl.col("host").alias("domain"), "offset_ns", "aligned"), on="domain", how="left")
        .join(after.rename({"window_ns": "w_after"}), on="rank", how="left")
    )
    notes = []
    for r in rows.iter_rows(named=True):
        head = (
            f"rank {r['rank']}: its collectives end {_span(r['dev_ns'])} from those of the other ranks of host "
            f"{r['host']}, whose clock it shares (median over {r['n_calls']} matched calls; on one clock they end "
            f"within {_span(r['window_ns'])} of each other)"
        )
        cause = "its timestamps are shifted, or its calls are paired with the wrong calls of its peers (a collective renamed or missing on that rank)"
        fix = "fix the rank's trace (its clock: baseTimeNanoseconds / the nsys session start; its collectives) or analyse the job without it"
        if not enabled:
            raise BadInputError(
                f"{head}: {cause}, and clock alignment is off (align_clocks=False); turn it on or {fix}"
            )
        if not r["aligned"]:
            raise BadInputError(
                f"{head}: {cause}, and {r['n_calls']} calls are too few to align its clock ({min_calls} needed); {fix}"
            )
        after_ns, w = r["after_ns"], r["w_after"]
        if after_ns is not None and after_ns > 2 * (w or 0) + FAR_FLOOR_NS:
            raise BadInputError(
                f"{head}, and still {_span(after_ns)} after moving its clock by {_span(r['offset_ns'])}: its calls are "
                f"paired with the wrong calls of its peers (a collective renamed or missing on that rank) or its clock jumps; {fix}"
            )
        notes.append(f"{head}: its clock is moved by {_span(r['offset_ns'])} on its own (its own clock domain)")
    return notes

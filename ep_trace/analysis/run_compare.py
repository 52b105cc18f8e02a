"""Two runs compared: what got better or worse per stage, per rank and per finding, against the runs' noise.

Both runs are :class:`~ep_trace.analysis.run_digest.RunDigest` s (a trace directory or a saved summary).
Definitions used on both sides, so they agree:

* step time = the slowest rank's mean step time (ns), so that it adds up with the stage times,
  which are means per step; a summary saved before schema 3 (no ``step_spread.ranks[].step_time_mean_ns``)
  falls back to the P50
  (``RunDigest.step_stat`` says which);
* stage time = per stage, the per-step window (first start -> last end, summed over layers and
  micro-batches) averaged over ranks; busy time alongside;
* noise = two standard errors of the difference of the two runs' means
  (:func:`ep_trace.analysis.step_spread.two_se`), from each run's own step-to-step spread;
* the step-time change is "explained" by the sum of the stage-window changes; the rest is work
  outside the EP stages (attention, optimizer, ...) or changed overlap between stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis.run_digest import RunDigest
from ep_trace.analysis.step_spread import two_se

__all__ = ["Comparison", "compare_runs", "within_noise"]


@dataclass(frozen=True)
class Comparison:
    """A vs B. Deltas are ``B − A`` (negative = B is faster).

    Attributes:
        a, b: The two digests.
        step_delta_ns: Change of the step time (``None`` when either run has none).
        stages: stage, a_window_ns, b_window_ns, delta_ns, a_busy_ns, b_busy_ns, busy_delta_ns, noise_ns
            (2 x the standard error of the window change from both runs' step-to-step spread; null when
            unknown), change (``better | worse | same | within noise``).
        ranks: rank, a_/b_/delta_ for step_time, exposed_comm and barrier_wait (ns).
        findings: kind, a_saving_ns, b_saving_ns, status (``new | resolved | better | worse | same |
            within noise``: a saving that moved by less than the step-time noise is within noise).
        explained_ns: Sum of the stage-window deltas.
        step_stat: ``'mean'`` when both runs know their mean step time, else ``'P50'``.
        a_step_ns, b_step_ns: The slowest rank's step time of each run (that statistic), ns.
    """

    a: RunDigest
    b: RunDigest
    step_delta_ns: float | None
    stages: pl.DataFrame
    ranks: pl.DataFrame
    findings: pl.DataFrame
    explained_ns: float
    step_stat: str = "mean"
    a_step_ns: float | None = None
    b_step_ns: float | None = None
    #: 2 x the standard error of the step-time difference from the runs' own step-to-step spread
    #: (None when a run has fewer than 2 steps or no spread): a change within it is noise.
    noise_ns: float | None = None
    #: Ranks present in both runs.
    common_ranks: tuple[int, ...] = ()


def _change(delta: pl.Expr, base: pl.Expr, tol: float) -> pl.Expr:
    """'better' / 'worse' / 'same': a change within ``tol`` of the base (or 1 µs) is 'same'."""
    small = delta.abs() <= pl.max_horizontal(base.abs() * tol, pl.lit(1000.0))
    return pl.when(small).then(pl.lit("same")).when(delta < 0).then(pl.lit("better")).otherwise(pl.lit("worse"))


def _noisy(change: pl.Expr, noise: pl.Expr, delta: pl.Expr | None = None) -> pl.Expr:
    """``change`` ('better' / 'worse' / 'same'), with 'better' / 'worse' turned into 'within noise'
    where ``|delta|`` (default: the ``delta_ns`` column) is no larger than ``noise`` (null: unknown)."""
    d = pl.col("delta_ns") if delta is None else delta
    moved = change.is_in(["better", "worse"])
    return pl.when(moved & noise.is_not_null() & (d.abs() <= noise)).then(pl.lit("within noise")).otherwise(change)


def compare_runs(a: RunDigest, b: RunDigest, tolerance: float = 0.02) -> Comparison:
    """Compare two runs; a change within ``tolerance`` (fraction of A's value, min 1 µs) counts as 'same'."""
    st = a.stages.join(b.stages, on="stage", how="full", coalesce=True, suffix="_b")
    st = st.with_columns(pl.col("busy_ns", "window_ns", "busy_ns_b", "window_ns_b").fill_null(0.0))
    n_a, n_b = pl.col("n_steps").fill_null(0), pl.col("n_steps_b").fill_null(0)
    stage_noise = (
        pl.when((n_a > 1) & (n_b > 1))
        .then(two_se(pl.col("window_sd_ns"), n_a, pl.col("window_sd_ns_b"), n_b))
        .otherwise(None)
    )
    st = (
        st.select(
            "stage",
            pl.col("window_ns").alias("a_window_ns"),
            pl.col("window_ns_b").alias("b_window_ns"),
            (pl.col("window_ns_b") - pl.col("window_ns")).alias("delta_ns"),
            pl.col("busy_ns").alias("a_busy_ns"),
            pl.col("busy_ns_b").alias("b_busy_ns"),
            (pl.col("busy_ns_b") - pl.col("busy_ns")).alias("busy_delta_ns"),
            stage_noise.alias("noise_ns"),
        )
        .with_columns(
            _noisy(_change(pl.col("delta_ns"), pl.col("a_window_ns"), tolerance), pl.col("noise_ns")).alias("change")
        )
        .sort("delta_ns")
    )
    cols = ("step_time_ns", "exposed_comm_ns", "barrier_wait_ns")
    rk = a.ranks.select("rank", *cols).join(
        b.ranks.select("rank", *cols), on="rank", how="full", coalesce=True, suffix="_b"
    )
    rk = rk.select(
        "rank",
        *[
            e
            for c in cols
            for e in (
                pl.col(c).alias(f"a_{c}"),
                pl.col(f"{c}_b").alias(f"b_{c}"),
                (pl.col(f"{c}_b") - pl.col(c)).alias(f"delta_{c}"),
            )
        ],
    ).sort("rank")
    noise = None
    if a.step_spread_ns is not None and b.step_spread_ns is not None and a.n_steps > 1 and b.n_steps > 1:
        noise = float(two_se(a.step_spread_ns, a.n_steps, b.step_spread_ns, b.n_steps))
    fa = a.findings.group_by("kind").agg(
        pl.col("est_saving_ns").sum().alias("a_saving_ns"), pl.col("title").first().alias("a_title")
    )
    fb = b.findings.group_by("kind").agg(
        pl.col("est_saving_ns").sum().alias("b_saving_ns"), pl.col("title").first().alias("b_title")
    )
    moved = (pl.col("b_saving_ns") - pl.col("a_saving_ns")).cast(pl.Float64)  # a finding's saving change
    fd = (
        fa.join(fb, on="kind", how="full", coalesce=True)
        .with_columns(
            pl.when(pl.col("a_saving_ns").is_null())
            .then(pl.lit("new"))
            .when(pl.col("b_saving_ns").is_null())
            .then(pl.lit("resolved"))
            .otherwise(
                _noisy(
                    _change(moved, pl.col("a_saving_ns").cast(pl.Float64), tolerance),
                    pl.lit(noise, pl.Float64),
                    moved,
                )
            )
            .alias("status"),
            pl.coalesce("b_title", "a_title").alias("title"),
        )
        .select("kind", "title", "a_saving_ns", "b_saving_ns", "status")
        .sort("kind")
    )
    stat = "mean" if a.step_stat == b.step_stat == "mean" else "P50"
    sa, sb = a.step_time_ns(stat), b.step_time_ns(stat)
    delta = None if sa is None or sb is None else sb - sa
    common = tuple(sorted(set(a.ranks["rank"].to_list()) & set(b.ranks["rank"].to_list())))
    return Comparison(
        a, b, delta, st, rk, fd, float(st["delta_ns"].sum()) if st.height else 0.0, stat, sa, sb, noise, common
    )


def within_noise(c: Comparison) -> bool | None:
    """The step-time change is within the runs' own step-to-step spread (None when unknown)."""
    if c.step_delta_ns is None or c.noise_ns is None:
        return None
    return abs(c.step_delta_ns) <= c.noise_ns

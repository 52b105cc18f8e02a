"""A rank axis that stays readable at any job size (64 → 4,096+ ranks).

Up to ``max_bars`` ranks every rank is its own bar. Beyond that the ``keep_slowest`` slowest ranks
(longest P50 step time, the ones a reader acts on) stay individual, and the others are averaged
per host when that gives at most ``max_bars`` groups, else per block of consecutive ranks
("node block": ranks ``r0-r7`` …). Values of a group are means over its members, so the bar keeps
the unit "per rank per step"; the label says how many ranks it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

__all__ = ["RankAxis", "rank_axis", "aggregate"]


@dataclass(frozen=True)
class RankAxis:
    """How ranks map to bars.

    Attributes:
        groups: ``rank -> group`` frame (columns ``rank``, ``group``, ``order``): the bar of each rank.
        labels: Bar labels in display order.
        aggregated: True when some bar stands for more than one rank.
        how: ``'rank'``, ``'host'`` or ``'block of N'``.
    """

    groups: pl.DataFrame
    labels: tuple[str, ...]
    aggregated: bool
    how: str


def rank_axis(
    ranks: pl.DataFrame, step_time: pl.DataFrame | None = None, max_bars: int = 64, keep_slowest: int = 8
) -> RankAxis:
    """Choose the bars for ``ranks`` (columns ``rank``, optional ``host``).

    Args:
        ranks: One row per rank.
        step_time: ``rank, step_time_ns`` (the P50 step time) to find the slowest ranks.
        max_bars: Most bars drawn.
        keep_slowest: Slowest ranks kept as their own bar when aggregating.
    """
    rk = (
        ranks.select(
            pl.col("rank").cast(pl.Int64),
            (pl.col("host") if "host" in ranks.columns else pl.lit(None)).cast(pl.Utf8).alias("host"),
        )
        .unique("rank")
        .sort("rank")
    )
    n = rk.height
    if n <= max_bars:
        g = rk.select("rank", pl.format("r{}", "rank").alias("group"), pl.col("rank").alias("order"))
        return RankAxis(g, tuple(g["group"].to_list()), False, "rank")
    slow: list[int] = []
    if step_time is not None and step_time.height:
        slow = (
            step_time.select(pl.col("rank").cast(pl.Int64), "step_time_ns")
            .sort("step_time_ns", "rank", descending=[True, False])
            .head(keep_slowest)["rank"]
            .to_list()
        )
    rest = rk.filter(~pl.col("rank").is_in(slow))
    hosts = rest["host"].drop_nulls().n_unique()
    budget = max_bars - len(slow)
    if rest["host"].null_count() == 0 and 1 < hosts <= budget:
        how = "host"
        first = rest.group_by("host").agg(pl.col("rank").min().alias("_f"), pl.len().alias("_n"))
        grp = rest.join(first, on="host").select(
            "rank", pl.format("{} ({} ranks)", "host", "_n").alias("group"), pl.col("_f").alias("order")
        )
    else:
        size = -(-rest.height // budget)
        how = f"block of {size}"
        idx = rest.with_row_index("_i").with_columns((pl.col("_i") // size).alias("_b"))
        span = idx.group_by("_b").agg(
            pl.col("rank").min().alias("_lo"), pl.col("rank").max().alias("_hi"), pl.len().alias("_n")
        )
        grp = idx.join(span, on="_b").select(
            "rank", pl.format("r{}-{} ({} ranks)", "_lo", "_hi", "_n").alias("group"), pl.col("_lo").alias("order")
        )
    # the slowest first, slowest leftmost, then the groups in rank order
    own = pl.DataFrame({"rank": slow, "_i": list(range(len(slow)))}, schema={"rank": pl.Int64, "_i": pl.Int64}).select(
        "rank", pl.format("r{} (slow)", "rank").alias("group"), (pl.col("_i") - (1 << 40)).alias("order")
    )
    g = pl.concat([own, grp.cast({"order": pl.Int64})])
    labels = g.group_by("group").agg(pl.col("order").min()).sort("order")["group"].to_list()
    return RankAxis(g, tuple(labels), True, how)


def aggregate(df: pl.DataFrame, axis: RankAxis, values: list[str]) -> pl.DataFrame:
    """Mean of ``values`` per bar of ``axis`` (``df`` has one row per rank); rows in bar order."""
    j = df.with_columns(pl.col("rank").cast(pl.Int64)).join(axis.groups, on="rank", how="inner")
    out = j.group_by("group").agg(*[pl.col(v).cast(pl.Float64).mean() for v in values], pl.col("order").min())
    return out.sort("order").drop("order")

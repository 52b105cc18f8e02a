"""Alpha-beta (Hockney) fit T = alpha + B / beta per link class over matched calls.

T is the wait-free transfer time of the call (min over ranks of e_r - max(s_r, a)), B the bytes of
the bottleneck rank (max over ranks of max(sent, received)). Least squares in closed form per link
class (no Python loop over calls). A class needs >= 3 calls and >= 2 distinct sizes, else its
verdict is ``insufficient_data``. Verdict at the median message size B50: ``latency_bound`` when
alpha > B50 / beta (the fixed cost dominates), else ``bandwidth_bound``.
"""

from __future__ import annotations

import polars as pl

__all__ = ["alpha_beta_fit"]


def alpha_beta_fit(calls: pl.DataFrame) -> pl.DataFrame:
    """Fit per link class.

    Args:
        calls: The ``calls`` frame (``valid, link_class, bytes_max, transfer_ns``).

    Returns:
        Columns ``link_class, alpha_us, beta_gbps, r2, n, median_bytes, verdict``.
    """
    d = calls.filter(pl.col("valid") & (pl.col("bytes_max") > 0) & (pl.col("transfer_ns") > 0)).select(
        "link_class", pl.col("bytes_max").cast(pl.Float64).alias("x"), pl.col("transfer_ns").cast(pl.Float64).alias("y")
    )
    x, y = pl.col("x"), pl.col("y")
    sxx = ((x - x.mean()) ** 2).sum()
    sxy = ((x - x.mean()) * (y - y.mean())).sum()
    syy = ((y - y.mean()) ** 2).sum()
    f = (
        d.group_by("link_class")
        .agg(
            pl.len().alias("n"),
            x.n_unique().alias("_nx"),
            (sxy / sxx).alias("_slope"),
            x.mean().alias("_mx"),
            y.mean().alias("_my"),
            pl.when(syy > 0).then(sxy**2 / (sxx * syy)).otherwise(1.0).alias("r2"),
            x.median().alias("median_bytes"),
        )
        .with_columns((pl.col("_my") - pl.col("_slope") * pl.col("_mx")).alias("_alpha"))
    )
    ok = (pl.col("n") >= 3) & (pl.col("_nx") >= 2) & (pl.col("_slope") > 0)
    return f.select(
        "link_class",
        pl.when(ok).then(pl.col("_alpha") / 1e3).alias("alpha_us"),
        pl.when(ok).then(1.0 / pl.col("_slope")).alias("beta_gbps"),  # bytes per ns == GB/s
        pl.when(ok).then(pl.col("r2")).alias("r2"),
        pl.col("n").cast(pl.Int64),
        "median_bytes",
        pl.when(~ok)
        .then(pl.lit("insufficient_data"))
        .when(pl.col("_alpha") > pl.col("median_bytes") * pl.col("_slope"))
        .then(pl.lit("latency_bound"))
        .otherwise(pl.lit("bandwidth_bound"))
        .alias("verdict"),
    ).sort("link_class")

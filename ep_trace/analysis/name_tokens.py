"""Tier ``token``: name tokens for the kernels no other tier claimed, only inside an MoE window.

The ``[[token]]`` rows of the knowledge table (``topk`` / ``router`` / ``routing`` -> route; ``sort`` /
``align`` / ``histogram`` / ``offsets`` / ``count`` -> permute; ``grouped`` / ``moe`` + ``gemm`` -> expert;
``finalize`` / ``reduce`` / ``combine`` after the window's first expert work -> unpermute) for kernels
whose name no ``[[kernel]]`` row knows, inside a window of :mod:`ep_trace.analysis.moe_windows`; never
over a whole step. Consecutive kernels of one stage in a window make one stage row.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis import stage_families
from ep_trace.knowledge import Row, first_match_expr, rows

__all__ = ["token_rows"]

_TOKENS = tuple((r.stage, r.pattern) for r in rows("token"))
_AFTER = tuple((r.stage, r.pattern) for r in rows("token") if r.after_expert)


def token_rows(
    act: pl.DataFrame, expert_start: pl.DataFrame, kernels: tuple[Row, ...] = ()
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Tier ``token``: unclaimed kernels inside an MoE window whose name says their stage; only names no
    kernel row knows (a dense GEMM of ``dpsk::grouped_gemm`` is a known ``gemm``, never a token's expert).

    Args:
        act: Unclaimed activity with ``mw`` (MoE window id) and ``layer`` (null = outside every window).
        expert_start: ``mw, _x0``: device start of each window's first expert work.
        kernels: User ``[[kernel]]`` rows (known names too).

    Returns:
        ``(ranges, attributed)`` as ``stage_tiers._segment_rows``.
    """
    k = act.filter(pl.col("mw").is_not_null() & (pl.col("cls") != "memory") & (pl.col("name") != "cpu compute"))
    if k.is_empty():
        return pl.DataFrame(), k
    names = (
        k.select(pl.col("name").unique())
        .filter(stage_families.family_label_expr(pl.col("name"), kernels).is_null())
        .with_columns(
            first_match_expr(pl.col("name"), _TOKENS).alias("_tok"),
            first_match_expr(pl.col("name"), _AFTER).alias("_aft"),
        )
    )
    k = k.join(names, on="name").join(expert_start, on="mw", how="left")
    after = pl.col("_x0").is_not_null() & (pl.col("start_ns") > pl.col("_x0"))
    k = k.with_columns(
        pl.when(pl.col("_aft").is_not_null() & after)
        .then(pl.col("_aft"))
        .when(pl.col("_aft").is_null())
        .then(pl.col("_tok"))
        .alias("stage")
    ).filter(pl.col("stage").is_not_null())
    if k.is_empty():
        return pl.DataFrame(), k
    k = k.sort("rank", "start_ns")
    run = ((pl.col("stage") != pl.col("stage").shift(1).over("mw")).fill_null(True)).cum_sum().over("mw")
    k = k.with_columns(run.alias("_run"))
    r = (
        k.group_by("mw", "_run")
        .agg(
            pl.col("rank").first(),
            pl.col("step").first(),
            pl.col("stage").first(),
            pl.col("layer").first(),
            pl.col("anchor_ns").min().alias("cpu_start_ns"),
            pl.col("anchor_ns").max().alias("cpu_end_ns"),
        )
        .sort("rank", "cpu_start_ns")
        .with_row_index("sid")
    )
    att = k.join(r.select("mw", "_run", "sid"), on=["mw", "_run"]).drop("_run", "_tok", "_aft", "_x0")
    r = r.drop("mw", "_run").with_columns(
        pl.lit(None, pl.Int32).alias("microbatch"), pl.lit("fwd").alias("phase"), pl.lit("name_token").alias("method")
    )
    return r, att

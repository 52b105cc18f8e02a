"""Count matrix from collective split lists, for trace directories without an ep-trace sidecar.

Without a sidecar nothing says which all-to-all(v) is a dispatch and which a combine, so the rule
is structural and documented: within one profiler step, the token all-to-alls of a rank are taken
in host order; a call whose send splits equal the previous call's receive splits is the combine of
that dispatch (combine returns exactly what dispatch delivered); every other call is a dispatch.
Calls with integer dtypes are count exchanges (split sizes, not tokens) and are left out. Truncated
lists (``splits_truncated``) are left out rather than guessed. ``layer`` is None and ``call`` is the
ordinal of the call within (step, direction). ``source = 'splits'``.
"""

from __future__ import annotations

import polars as pl

from ep_trace import schema

__all__ = ["routing_from_splits"]

_INT_DTYPES = {"Long", "Int", "Short", "Char", "Byte", "long int", "long", "int", "short int", "signed char", "unsigned char",
               "int64", "int32", "int16", "int8", "uint8", "bool", "Bool", "long long", "unsigned int"}


def routing_from_splits(collectives: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``routing_matrix`` rows (source 'splits') from the all_to_allv calls of one or more ranks.

    Args:
        collectives: Canonical collectives table.
        events: Canonical events table (its ``ProfilerStep#N`` rows give the step of each call).

    Returns:
        A conformed ``routing_matrix`` frame (possibly empty).
    """
    c = collectives.filter(
        (pl.col("collective") == "all_to_allv") & pl.col("in_splits").is_not_null() & ~pl.col("splits_truncated")
        & pl.col("group_ranks").is_not_null() & (pl.col("in_splits").list.len() == pl.col("group_ranks").list.len())
        & (pl.col("dtype").is_null() | ~pl.col("dtype").is_in(sorted(_INT_DTYPES)))
    )
    if c.height == 0:
        return schema.empty("routing_matrix")
    steps = (
        events.filter(pl.col("seq").is_not_null())
        .select("rank", pl.col("start_ns").alias("_s0"), pl.col("end_ns").alias("_s1"), pl.col("seq").alias("step"))
        .sort("_s0")
    )
    t = pl.coalesce("cpu_start_ns", "start_ns").alias("_t")
    c = c.with_columns(t).sort("_t").join_asof(steps, left_on="_t", right_on="_s0", by="rank", strategy="backward", check_sortedness=False)
    c = c.with_columns(pl.when(pl.col("_t") <= pl.col("_s1")).then(pl.col("step")).otherwise(-1).alias("step"))
    c = c.sort("rank", "_t")
    prev_out = pl.col("out_splits").shift(1).over("rank", "step")
    is_combine = (pl.col("in_splits") == prev_out).fill_null(False)
    # A combine pairs with the dispatch just before it; that dispatch cannot be a combine itself.
    c = c.with_columns(pl.when(is_combine).then(pl.lit("combine")).otherwise(pl.lit("dispatch")).alias("direction"))
    c = c.with_columns(
        (pl.int_range(pl.len()).over("rank", "step", "direction")).cast(pl.Int64).alias("call"),
        pl.lit(0, dtype=pl.Int32).alias("microbatch"),
    )
    df = c.select(
        "step", "microbatch", "direction", "call", "row_bytes", pl.col("rank").alias("src"),
        pl.col("in_splits").alias("rows"), pl.col("group_ranks").alias("dst"),
    ).explode("rows", "dst")
    return schema.conform("routing_matrix", df.with_columns(pl.lit("splits").alias("source")))


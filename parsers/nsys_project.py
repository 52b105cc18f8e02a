"""NVTX -> GPU projection for nsys input: which CPU ranges enclose the launch of each GPU op.

The rule (nsys' own projection, described in shared/reference/nsys.md §8): a GPU operation belongs
to an NVTX range when the CUDA API call that launched it lies **entirely** inside the range on the
**same thread**; GPU start time does not matter. Ranges that end on another thread are skipped.
The projected range runs from the first such op's start to the last one's end (an envelope).
The innermost range of an op is the enclosing range that started last.

Not quadratic: all (op, enclosing range) pairs come from one interval join (polars ``join_where``
with two inequality predicates runs an IEJoin, O((n + m) log(n + m) + pairs)). The thread
equality is folded into the keys: ``key = thread_index * span + (t - t0)`` puts every thread in its
own disjoint block of the time axis, so ``range.start <= launch.start`` and
``range.end >= launch.end`` can only hold within one block, i.e. on the same thread.
"""

from __future__ import annotations

from typing import cast

import polars as pl

__all__ = ["enclosing_pairs", "innermost_range", "range_envelopes"]

_MAX_KEY = 2**62


def enclosing_pairs(ops: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """All (op, range) pairs where the range encloses the op's launch on the same thread.

    Args:
        ops: Columns ``_uid`` (op id), ``_gtid`` (launching thread), ``_ls`` / ``_le`` (launch
            start / end, ns); rows without a launch must be filtered out by the caller.
        ranges: Columns ``_uid`` (range id), ``_gtid``, ``_rs`` / ``_re`` (range start / end, ns).

    Returns:
        Columns ``_op`` (op ``_uid``), ``_range`` (range ``_uid``), ``_rs``, ``_re``.
    """
    out_schema = {"_op": pl.Int64, "_range": pl.Int64, "_rs": pl.Int64, "_re": pl.Int64}
    if ops.is_empty() or ranges.is_empty():
        return pl.DataFrame(schema=out_schema)
    threads = (
        pl.concat([ops.select("_gtid"), ranges.select("_gtid")]).unique().sort("_gtid").with_row_index("_t")
    ).with_columns(pl.col("_t").cast(pl.Int64))
    t0 = min(cast(int, ops["_ls"].min()), cast(int, ranges["_rs"].min()))
    t1 = max(cast(int, ops["_le"].max()), cast(int, ranges["_re"].max()))
    span = t1 - t0 + 1
    per_chunk = max(1, _MAX_KEY // span)
    ops_k = ops.join(threads, on="_gtid").select(
        pl.col("_uid").alias("_op"),
        (pl.col("_t") // per_chunk).alias("_chunk"),
        pl.col("_t") % per_chunk,
        (pl.col("_ls") - t0).alias("_ls"),
        (pl.col("_le") - t0).alias("_le"),
    )
    rng_k = ranges.join(threads, on="_gtid").select(
        pl.col("_uid").alias("_range"),
        (pl.col("_t") // per_chunk).alias("_chunk"),
        pl.col("_t") % per_chunk,
        pl.col("_rs"),
        pl.col("_re"),
        (pl.col("_rs") - t0).alias("_rk0"),
        (pl.col("_re") - t0).alias("_rk1"),
    )
    parts = []
    # More than one chunk only when threads x capture length overflow int64 (hours-long captures
    # with millions of threads): a handful of iterations, each vectorised.
    for chunk in ops_k["_chunk"].unique().sort().to_list():
        o = ops_k.filter(pl.col("_chunk") == chunk).select(
            "_op",
            (pl.col("_t") * span + pl.col("_ls")).alias("_lk0"),
            (pl.col("_t") * span + pl.col("_le")).alias("_lk1"),
        )
        r = rng_k.filter(pl.col("_chunk") == chunk).select(
            "_range",
            "_rs",
            "_re",
            (pl.col("_t") * span + pl.col("_rk0")).alias("_rk0"),
            (pl.col("_t") * span + pl.col("_rk1")).alias("_rk1"),
        )
        if o.is_empty() or r.is_empty():
            continue
        j = o.join_where(r, pl.col("_rk0") <= pl.col("_lk0"), pl.col("_rk1") >= pl.col("_lk1"))
        parts.append(j.select("_op", "_range", "_rs", "_re"))
    if not parts:
        return pl.DataFrame(schema=out_schema)
    return pl.concat(parts).cast(out_schema)  # type: ignore[arg-type]


def innermost_range(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per op, the enclosing range that started last (ties: the one ending first, then the later id).

    Returns:
        Columns ``_op``, ``_range``.
    """
    return (
        pairs.sort(["_op", "_rs", "_re", "_range"], descending=[False, True, False, True])
        .unique("_op", keep="first", maintain_order=True)
        .select("_op", "_range")
    )


def range_envelopes(pairs: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Per range, the envelope of the GPU ops it encloses (nested ranges each get their own).

    Args:
        pairs: Output of :func:`enclosing_pairs`.
        ops: Columns ``_uid``, ``start``, ``end``, ``device``, ``stream`` of the GPU ops.

    Returns:
        Columns ``_range``, ``start``, ``end`` (ns), ``n_ops``, ``device`` (the single device or the
        lowest when the ops span several), ``stream`` (null when the ops span several streams).
    """
    return (
        pairs.select("_op", "_range")
        .join(ops.select(pl.col("_uid").alias("_op"), "start", "end", "device", "stream"), on="_op")
        .group_by("_range")
        .agg(
            pl.col("start").min(),
            pl.col("end").max(),
            pl.len().alias("n_ops"),
            pl.col("device").min(),
            pl.when(pl.col("stream").n_unique() == 1).then(pl.col("stream").first()).alias("stream"),
        )
    )

"""Routing imbalance: expert load n_e, rank load L_r, count matrices and their consistency.

Definitions (DESIGN.md §5): I_e = max_e n_e / mean_e n_e with the mean over ALL experts (empty ones
included, E from ``ranks.num_experts`` when known); L_r = column sums of the dispatch count matrix
C[i][j] (rows rank i sends to rank j); I_r = max_r L_r / mean_r L_r over every rank of the trace
(idle ranks included); the send side uses row sums. local ratio = trace(C) / sum(C); cross-node
ratio = rows between different hosts / sum(C). Whole-run aggregates: sum over (step, layer) of the
maxima / sum of the means (a token-weighted ratio, the inverse of vLLM EPLB's balancedness).
"""

from __future__ import annotations

from typing import cast

import polars as pl

from ep_trace.analysis.matching import splits_long

__all__ = [
    "expert_load",
    "count_matrix",
    "split_violations",
    "split_pairs_compared",
    "rank_load",
    "imbalance_table",
    "run_aggregate",
]


def expert_load(routing_counts: pl.DataFrame, num_experts: int | None) -> pl.DataFrame:
    """n_e per (step, layer, expert), summed over source ranks and micro-batches, zero-filled to E experts."""
    if routing_counts.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "layer": pl.Int32, "expert": pl.Int32, "count": pl.Int64})
    n = routing_counts.group_by(["step", "layer", "expert"]).agg(pl.col("count").sum())
    e = max(int(num_experts or 0), cast(int, n["expert"].max()) + 1)
    grid = (
        n.select("step", "layer")
        .unique()
        .join(pl.DataFrame({"expert": pl.arange(0, e, eager=True).cast(pl.Int32)}), how="cross")
    )
    return (
        grid.join(n, on=["step", "layer", "expert"], how="left")
        .with_columns(pl.col("count").fill_null(0))
        .sort(["step", "layer", "expert"])
    )


def count_matrix(routing_matrix: pl.DataFrame, matched: pl.DataFrame) -> pl.DataFrame:
    """The count matrix: the sidecar's when present, else built from the send split lists of matched calls.

    Args:
        routing_matrix: Canonical ``routing_matrix`` table (sidecar).
        matched: Collectives with ``match_id``, ``step`` and ``_gr`` (:func:`match_collectives`).
    """
    if not routing_matrix.is_empty():
        return routing_matrix
    m = matched.filter(pl.col("match_id").is_not_null() & (pl.col("direction").fill_null("") != "count"))
    long = splits_long(m, "in_splits")
    if long.is_empty():
        return routing_matrix
    meta = m.select(
        "rank", "coll_id", "match_id", "step", "layer", pl.col("direction").fill_null("dispatch"), "row_bytes"
    )
    long = long.join(meta, on=["rank", "coll_id"]).with_columns(
        pl.col("match_id").rank("dense").over(["step", "direction"]).cast(pl.Int64).sub(1).alias("call")
    )
    return long.select(
        pl.col("step").fill_null(0),
        "layer",
        pl.lit(0, pl.Int32).alias("microbatch"),
        "direction",
        "call",
        pl.col("rank").alias("src"),
        pl.col("peer").alias("dst"),
        "rows",
        "row_bytes",
        pl.lit("splits").alias("source"),
    ).sort(["step", "direction", "call", "src", "dst"])


def _split_pairs(matched: pl.DataFrame) -> pl.DataFrame:
    """``match_id, step, src, dst, sent, received``: every pair whose two ranks both recorded their list."""
    m = matched.filter(pl.col("match_id").is_not_null())
    meta = m.select("rank", "coll_id", "match_id", "step")
    sent = (
        splits_long(m, "in_splits")
        .join(meta, on=["rank", "coll_id"])
        .select(
            "match_id", "step", pl.col("rank").alias("src"), pl.col("peer").alias("dst"), pl.col("rows").alias("sent")
        )
    )
    recv = (
        splits_long(m, "out_splits")
        .join(meta, on=["rank", "coll_id"])
        .select("match_id", pl.col("peer").alias("src"), pl.col("rank").alias("dst"), pl.col("rows").alias("received"))
    )
    return sent.join(recv, on=["match_id", "src", "dst"], how="inner")


def split_violations(matched: pl.DataFrame) -> pl.DataFrame:
    """Pairs where rank src's send split to dst differs from rank dst's receive split from src.

    Only pairs where both ranks recorded their list are compared (a missing rank is a load-report
    matter, not a violation). Columns ``step, call, src, dst, sent, received`` (``call`` = match id).
    """
    j = _split_pairs(matched)
    return (
        j.filter(pl.col("sent") != pl.col("received"))
        .select("step", pl.col("match_id").alias("call"), "src", "dst", "sent", "received")
        .sort(["call", "src", "dst"])
    )


def split_pairs_compared(matched: pl.DataFrame) -> int:
    """How many (call, source, destination) split pairs :func:`split_violations` compared."""
    return _split_pairs(matched).height


def rank_load(cm: pl.DataFrame, all_ranks: list[int]) -> pl.DataFrame:
    """L_r (receive, column sums) and send rows (row sums) per (step, layer, microbatch, call) of the
    dispatch-direction matrix, zero-filled over ``all_ranks``."""
    d = cm.filter(pl.col("direction").is_in(["dispatch"]))
    if d.is_empty():
        d = cm.filter(pl.col("direction") != "combine")
    keys = ["step", "layer", "microbatch", "call"]
    if d.is_empty():
        return pl.DataFrame(
            schema={
                "step": pl.Int64,
                "layer": pl.Int32,
                "microbatch": pl.Int32,
                "call": pl.Int64,
                "rank": pl.Int32,
                "recv_rows": pl.Int64,
                "send_rows": pl.Int64,
            }
        )
    recv = d.group_by([*keys, "dst"]).agg(pl.col("rows").sum().alias("recv_rows")).rename({"dst": "rank"})
    send = d.group_by([*keys, "src"]).agg(pl.col("rows").sum().alias("send_rows")).rename({"src": "rank"})
    grid = d.select(keys).unique().join(pl.DataFrame({"rank": pl.Series(all_ranks, dtype=pl.Int32)}), how="cross")
    return (
        grid.join(recv, on=[*keys, "rank"], how="left", nulls_equal=True)
        .join(send, on=[*keys, "rank"], how="left", nulls_equal=True)
        .with_columns(pl.col("recv_rows").fill_null(0), pl.col("send_rows").fill_null(0))
        .sort([*keys, "rank"], nulls_last=True)
    )


def _ratio(col: str) -> pl.Expr:
    return pl.when(pl.col(col).mean() > 0).then(pl.col(col).max() / pl.col(col).mean()).otherwise(None)


def imbalance_table(el: pl.DataFrame, rl: pl.DataFrame, cm: pl.DataFrame, hosts: pl.DataFrame) -> pl.DataFrame:
    """Per (step, layer, microbatch, call): I_e, I_r, I_r_send, local and cross-node ratios, and the
    max / mean behind each ratio (for the run aggregate)."""
    keys = ["step", "layer", "microbatch", "call"]
    ie = el.group_by(["step", "layer"]).agg(
        _ratio("count").alias("I_e"), pl.col("count").max().alias("n_e_max"), pl.col("count").mean().alias("n_e_mean")
    )
    ir = rl.group_by(keys).agg(
        _ratio("recv_rows").alias("I_r"),
        _ratio("send_rows").alias("I_r_send"),
        pl.col("recv_rows").max().alias("L_max"),
        pl.col("recv_rows").mean().alias("L_mean"),
    )
    h = hosts.select("rank", pl.col("host").fill_null("<unknown>"))
    d = (
        cm.filter(pl.col("direction") != "combine")
        .join(h.rename({"rank": "src", "host": "hs"}), on="src", how="left")
        .join(h.rename({"rank": "dst", "host": "hd"}), on="dst", how="left")
    )
    loc = d.group_by(keys).agg(
        pl.when(pl.col("rows").sum() > 0)
        .then(pl.col("rows").filter(pl.col("src") == pl.col("dst")).sum() / pl.col("rows").sum())
        .alias("local_ratio"),
        pl.when(pl.col("rows").sum() > 0)
        .then(pl.col("rows").filter(pl.col("hs") != pl.col("hd")).sum() / pl.col("rows").sum())
        .alias("cross_node_ratio"),
    )
    ir = ir.join(loc, on=keys, how="left", nulls_equal=True)
    if ie.is_empty():
        out = ir.with_columns(
            pl.lit(None, pl.Float64).alias("I_e"),
            pl.lit(None, pl.Int64).alias("n_e_max"),
            pl.lit(None, pl.Float64).alias("n_e_mean"),
        )
    elif ir.is_empty():
        out = ie.with_columns(
            pl.lit(0, pl.Int32).alias("microbatch"),
            pl.lit(0, pl.Int64).alias("call"),
            *[
                pl.lit(None, pl.Float64).alias(c)
                for c in ["I_r", "I_r_send", "L_mean", "local_ratio", "cross_node_ratio"]
            ],
            pl.lit(None, pl.Int64).alias("L_max"),
        )
    else:
        # sidecar matrices carry (step, layer, microbatch); n_e is per (step, layer)
        out = ir.join(ie, on=["step", "layer"], how="full", coalesce=True, nulls_equal=True)
    cols = [
        "step",
        "layer",
        "microbatch",
        "call",
        "I_e",
        "I_r",
        "I_r_send",
        "local_ratio",
        "cross_node_ratio",
        "n_e_max",
        "n_e_mean",
        "L_max",
        "L_mean",
    ]
    return out.select(cols).sort(["step", "layer", "microbatch", "call"], nulls_last=True)


def run_aggregate(imb: pl.DataFrame) -> dict[str, float | None]:
    """Whole-run I_e and I_r: sum of per-(step, layer) maxima over sum of means; ``balancedness`` = 1 / I_r."""

    def agg(mx: str, mn: str) -> float | None:
        d = imb.filter(pl.col(mx).is_not_null() & pl.col(mn).is_not_null())
        if mx == "n_e_max":  # n_e is per (step, layer): count it once, not once per micro-batch row
            d = d.unique(["step", "layer"], keep="first")
        s = float(d[mn].sum()) if d.height else 0.0
        return float(d[mx].sum()) / s if s > 0 else None

    ir = agg("L_max", "L_mean")
    return {"I_e": agg("n_e_max", "n_e_mean"), "I_r": ir, "balancedness": (1.0 / ir) if ir else None}

"""From the ordered items of an MoE window to stage segments of host time (tiers ``module`` and ``cpu_op``).

An MoE window is the host span of one MoE layer call on one thread: an ``nn.Module`` MoE block
(:mod:`ep_trace.analysis.moe_blocks`), a framework's MoE op or range (a container preset), or a run of
top-level ops around a ``topk`` (:mod:`ep_trace.analysis.moe_ops`). Its *items* are what it calls, in
start order: child module frames and top-level ops (and the stage ranges inside it), each with a
category: ``route`` (the router / gate, ``topk``), ``route_aux`` (a softmax / sigmoid), ``permute``
(``one_hot``, ``sort``, ``where``, ``index``, ...), ``unpermute`` (``index_add_``, ``scatter_add_``, ...),
``expert`` (an expert module; an expert GEMM op), ``shared`` (a shared expert) or ``other``.

The layer's data path fixes the stage of every item from the positions of these anchors
(:func:`item_stages`):

* before the first expert item: ``route`` up to the last routing item, and on to the first permute
  item after it (the top-k weights' normalisation); ``permute`` from there (no routing item at all:
  ``permute``). An expert-GEMM op before the first routing item is the gate: ``route``;
* the expert items, and the items between two of them with no permute / unpermute anchor in between
  (an activation between the two GEMMs of one expert): ``expert``;
* between two experts with anchors in between (a loop over the experts: ``where``, ``index``, the
  expert, the weighting, ``index_add_``): ``unpermute`` up to the last unpermute anchor, ``permute``
  after it (no unpermute anchor: ``unpermute`` before the first permute anchor, ``permute`` from it);
* after the last expert item: ``unpermute``; shared-expert items: ``shared_expert``.

Each item then owns the host time from its start to the next item's start (the first from the
window's start, the last to its end), so the segments tile the window and every kernel launched in
it falls in exactly one. Communication launched in a route / permute segment is the ``dispatch``, in
an expert / unpermute one the ``combine`` (:func:`comm_stage`).
"""

from __future__ import annotations

import polars as pl

__all__ = ["CATEGORIES", "item_stages", "segments", "comm_stage"]

CATEGORIES = ("route", "route_aux", "permute", "unpermute", "expert", "shared", "other")


def _first(cond: pl.Expr, by: str | list[str]) -> pl.Expr:
    return pl.when(cond).then(pl.col("_o")).min().over(by)


def _last(cond: pl.Expr, by: str | list[str]) -> pl.Expr:
    return pl.when(cond).then(pl.col("_o")).max().over(by)


def item_stages(items: pl.DataFrame) -> pl.DataFrame:
    """The stage of every item of every window (the rules of the module doc).

    Args:
        items: ``wid`` (window id), ``start_ns`` and ``cat`` (one of :data:`CATEGORIES`) plus any
            other columns. Windows without an expert item get no stage (null).

    Returns:
        ``items`` sorted by (``wid``, ``start_ns``) with ``stage`` added.
    """
    w = "wid"
    it = items.sort([w, "start_ns"]).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(w).alias("_o"))
    cat = pl.col("cat")
    # routing items: the route / route_aux categories; an expert-GEMM op before the first of them is the gate
    it = it.with_columns(_first(cat.is_in(["route", "route_aux"]), w).alias("_r0"))
    gate = (cat == "expert") & pl.col("_r0").is_not_null() & (pl.col("_o") < pl.col("_r0"))
    it = it.with_columns(pl.when(gate).then(pl.lit("route")).otherwise(cat).alias("cat"))
    it = it.with_columns(_first(cat == "expert", w).alias("_e0"), _last(cat == "expert", w).alias("_e1"))
    before = pl.col("_o") < pl.col("_e0")
    it = it.with_columns(_last(cat.is_in(["route", "route_aux"]) & before, w).alias("_rl"))
    after_route = pl.col("_o") > pl.col("_rl").fill_null(-1)
    it = it.with_columns(_first((cat == "permute") & before & after_route, w).alias("_p0"))
    pre = (
        pl.when(pl.col("_rl").is_null())
        .then(pl.lit("permute"))
        .when(pl.col("_o") <= pl.col("_rl"))
        .then(pl.lit("route"))
        .when(pl.col("_p0").is_null() | (pl.col("_o") < pl.col("_p0")))
        .then(pl.lit("route"))
        .otherwise(pl.lit("permute"))
    )
    # gaps between expert items: g = number of expert items at or before the item
    it = it.with_columns((cat == "expert").cast(pl.Int32).cum_sum().over(w).alias("_g"))
    gap = [w, "_g"]
    inner = (pl.col("_o") > pl.col("_e0")) & (pl.col("_o") < pl.col("_e1")) & (cat != "expert")
    it = it.with_columns(
        _last(inner & (cat == "unpermute"), gap).alias("_ul"), _first(inner & (cat == "permute"), gap).alias("_pf")
    )
    mid = (
        pl.when(pl.col("_ul").is_not_null())
        .then(pl.when(pl.col("_o") <= pl.col("_ul")).then(pl.lit("unpermute")).otherwise(pl.lit("permute")))
        .when(pl.col("_pf").is_not_null())
        .then(pl.when(pl.col("_o") < pl.col("_pf")).then(pl.lit("unpermute")).otherwise(pl.lit("permute")))
        .otherwise(pl.lit("expert"))
    )
    stage = (
        pl.when(pl.col("_e0").is_null())
        .then(None)
        .when(cat == "shared")
        .then(pl.lit("shared_expert"))
        .when(cat == "expert")
        .then(pl.lit("expert"))
        .when(before)
        .then(pre)
        .when(pl.col("_o") > pl.col("_e1"))
        .then(pl.lit("unpermute"))
        .otherwise(mid)
    )
    return it.with_columns(stage.alias("stage")).drop("_o", "_r0", "_e0", "_e1", "_rl", "_p0", "_g", "_ul", "_pf")


def segments(items: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Host stage segments tiling each window: consecutive items of one stage merged.

    Args:
        items: :func:`item_stages` output (``wid, start_ns, stage``).
        windows: ``wid, rank, tid, start_ns, end_ns, method`` (one row per window).

    Returns:
        ``wid, rank, tid, stage, cpu_start_ns, cpu_end_ns, method``: no segment for a window without stages.
    """
    it = items.filter(pl.col("stage").is_not_null()).sort(["wid", "start_ns"])
    if it.is_empty():
        return pl.DataFrame(
            schema={
                "wid": pl.Int64,
                "rank": pl.Int32,
                "tid": pl.Int64,
                "stage": pl.Utf8,
                "cpu_start_ns": pl.Int64,
                "cpu_end_ns": pl.Int64,
                "method": pl.Utf8,
            }
        )
    win = windows.select("wid", "rank", "tid", pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"), "method")
    it = it.select("wid", "start_ns", "stage").join(win, on="wid", how="inner")
    run = (pl.col("stage") != pl.col("stage").shift(1).over("wid")).fill_null(True).cum_sum().over("wid")
    seg = (
        it.with_columns(run.alias("_run"))
        .group_by("wid", "_run")
        .agg(
            pl.col("stage").first(), pl.col("start_ns").min().alias("_s"), pl.all().exclude("stage", "start_ns").first()
        )
        .sort("wid", "_s")
    )
    nxt = pl.col("_s").shift(-1).over("wid")
    first = pl.col("_run") == pl.col("_run").min().over("wid")
    return seg.select(
        "wid",
        "rank",
        "tid",
        "stage",
        pl.when(first).then(pl.col("_ws")).otherwise(pl.col("_s")).alias("cpu_start_ns"),
        pl.coalesce(nxt, pl.col("_we")).alias("cpu_end_ns"),
        "method",
    )


def comm_stage(stage: pl.Expr, cls: pl.Expr) -> pl.Expr:
    """The stage of a device interval of class ``cls`` attributed to a segment of stage ``stage``:
    communication before the experts is the dispatch, from the experts on the combine."""
    is_comm = cls.cast(pl.Utf8) == "comm"
    return (
        pl.when(is_comm & stage.is_in(["route", "permute"]))
        .then(pl.lit("dispatch"))
        .when(is_comm & stage.is_in(["expert", "unpermute", "shared_expert"]))
        .then(pl.lit("combine"))
        .otherwise(stage)
    )

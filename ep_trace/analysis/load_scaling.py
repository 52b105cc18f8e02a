"""Expert compute scaled to a new load: the graph edit behind ``balanced_routing``, ``placement`` and
``node_local`` (:mod:`ep_trace.analysis.whatif`).

Each rank's expert compute in (step, layer) is priced per token from the trace itself: its measured
expert-stage compute E over the rows it received L, so a new load L' takes E x L' / L (a work piece
whose layer is unknown takes the rank's per-step factor Σ L' / Σ L). A rank that received nothing
(L = 0) has no per-token cost of its own: with ``charge_idle`` it takes the median per-row cost of the
ranks that worked in the same (step, layer), added to the lead gap of its combine call there (where
its expert stage sits in the 1-chunk data path).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ep_trace.analysis.graph import StepGraph

__all__ = ["expert_delta", "with_step"]


def with_step(work: pl.LazyFrame, g: StepGraph) -> pl.LazyFrame:
    """``work`` (rows of ``g.work``, or aggregates per node) with each piece's ``step`` (its node's)
    after ``rank``, ``node`` as the nodes' Int64."""
    steps = g.nodes.lazy().select("node", "step")
    return (
        work.with_columns(pl.col("node").cast(pl.Int64))
        .join(steps, on="node", how="left", maintain_order="left")
        .select("node", "rank", "step", pl.exclude("node", "rank", "step"))
    )


def expert_delta(g: StepGraph, loads: pl.DataFrame, charge_idle: bool = False) -> tuple[np.ndarray, list[int]]:
    """Gap reduction per node (negative = lengthening) of expert compute scaled from ``_L`` to ``_Ln``.

    Args:
        g: The step graph.
        loads: ``step, layer, rank, _L, _Ln`` (rows received now and under the edit).
        charge_idle: Give ranks with ``_L`` = 0 and ``_Ln`` > 0 the median per-row cost (module doc).

    Returns:
        ``(delta per node, ranks whose load drops)``.
    """
    z = np.zeros(g.nodes.height)
    if loads.is_empty():
        return z, []
    L = loads.with_columns(pl.col("layer").cast(pl.Int32), pl.col("rank").cast(pl.Int32))
    busy = L.filter(pl.col("_L") > 0)
    f_layer = busy.select("step", "layer", "rank", (pl.col("_Ln") / pl.col("_L")).alias("_f"))
    Ls = busy.group_by(["step", "rank"]).agg(pl.col("_L").sum(), pl.col("_Ln").sum())
    f_step = Ls.select("step", "rank", (pl.col("_Ln") / pl.col("_L")).alias("_fs"))
    w = (
        g.work.lazy()
        .filter((pl.col("cause") == "compute") & (pl.col("stage") == "expert"))
        .select("node", "rank", "layer", "start_ns", "end_ns")
        .pipe(with_step, g)
        .join(f_layer.lazy(), on=["step", "layer", "rank"], how="left", maintain_order="left")
        .join(f_step.lazy(), on=["step", "rank"], how="left", maintain_order="left")
        .with_columns(pl.coalesce("_f", "_fs").alias("_f"))
        .filter(pl.col("_f").is_not_null())
        .collect()
    )
    heavy: list[int] = []
    if not w.is_empty():
        dd = w.group_by("node").agg(((pl.col("end_ns") - pl.col("start_ns")) * (1 - pl.col("_f"))).sum().alias("_d"))
        z[dd["node"].to_numpy()] = dd["_d"].to_numpy()
        heavy = sorted({int(r) for r in w.filter(pl.col("_f") < 1)["rank"].unique()})
    if charge_idle:
        _charge_idle(g, w, L, z)
    return z, heavy


def _charge_idle(g: StepGraph, w: pl.DataFrame, loads: pl.DataFrame, z: np.ndarray) -> None:
    """Ranks that received nothing and get rows: the median per-row cost of the (step, layer), on the
    lead gap of their combine call of that layer (the first, when chunked)."""
    idle = loads.filter((pl.col("_L") == 0) & (pl.col("_Ln") > 0))
    if idle.is_empty() or w.is_empty():
        return
    per = (
        w.group_by("step", "layer", "rank")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().cast(pl.Float64).alias("_E"))
        .join(loads.filter(pl.col("_L") > 0), on=["step", "layer", "rank"], how="inner")
        .group_by("step", "layer")
        .agg((pl.col("_E") / pl.col("_L")).median().alias("_rate"))
    )
    comb = (
        g.nodes.filter((pl.col("kind") == "call") & (pl.col("direction") == "combine"))
        .group_by("rank", "step", "layer")
        .agg(pl.col("node").min())
    )
    add = idle.join(per, on=["step", "layer"], how="inner").join(comb, on=["rank", "step", "layer"], how="inner")
    if add.height:
        np.subtract.at(z, add["node"].to_numpy(), (add["_rate"] * add["_Ln"]).to_numpy())

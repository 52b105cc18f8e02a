"""The ``placement`` and ``node_local`` what-ifs: a proposed placement as an edit of the step graph.

For each proposal of the plan (:mod:`~ep_trace.analysis.placement_plan`), per (rank, step, layer):

* expert compute: scaled from the rows the rank received (``rank_load``) to the rows the proposal
  routes to it, at the rank's own measured cost per row (:func:`~ep_trace.analysis.load_scaling.
  expert_delta`, idle ranks at the median cost of the others);
* transfers: each dispatch / combine call of the rank re-priced with the α–β of the link classes
  (:mod:`~ep_trace.analysis.link_cost`): the call's measured wait-free transfer plus the modelled
  difference ``T(new bytes per class) - T(bytes it moved)``, never below 0. The new bytes are the
  proposal's per-class max(sent, received) rows of the rank in that layer x the call's bytes per row,
  times the call's share of the layer's rows on the rank (1 for an unchunked layer; a chunk's share of
  the chunked layer otherwise). Combine moves the dispatch's rows back, so its bytes per class are the
  same.

The edited graph is replayed like every other what-if; the rows join the verdict but not ``all``
(the balanced routing edit already bounds what any placement does to expert compute).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ep_trace.analysis import placement as plm
from ep_trace.analysis.graph import StepGraph
from ep_trace.analysis.link_cost import LinkCosts
from ep_trace.analysis.load_scaling import expert_delta
from ep_trace.analysis.placement_plan import SCENARIOS, PlacementPlan
from ep_trace.analysis.topology import LINK_CLASSES, with_link_class

__all__ = ["PlacementInputs", "placement_edits"]

_B = [f"b_{k}" for k in LINK_CLASSES]


@dataclass(frozen=True)
class PlacementInputs:
    """What the edits need besides the graph (built by the placement pass, consumed by the model pass).

    Attributes:
        plan: The placement plan.
        rank_load: ``Analysis.rank_load``.
        call_bytes: :func:`~ep_trace.analysis.link_cost.call_class_bytes` with ``row_bytes`` per call.
        costs: The fitted / default α–β per link class.
    """

    plan: PlacementPlan
    rank_load: pl.DataFrame
    call_bytes: pl.DataFrame
    costs: LinkCosts


def _loads(inp: PlacementInputs, scenario: str) -> pl.DataFrame:
    """``step, layer, rank, _L, _Ln``: measured rows received, and those the proposal routes."""
    group = list(inp.plan.current.ranks)
    new = plm.rank_loads(inp.plan.pairs[scenario], group).rename({"load": "_Ln"})
    rl = inp.rank_load
    if rl.is_empty():
        old = plm.rank_loads(inp.plan.pairs["current"], group).rename({"load": "_L"})
    else:
        old = rl.group_by("step", "layer", "rank").agg(pl.col("recv_rows").sum().alias("_L"))
    old = old.with_columns(pl.col("layer").cast(pl.Int32), pl.col("rank").cast(pl.Int32))
    new = new.with_columns(pl.col("layer").cast(pl.Int32), pl.col("rank").cast(pl.Int32))
    return old.join(new, on=["step", "layer", "rank"], how="inner").with_columns(
        pl.col("_L").cast(pl.Float64), pl.col("_Ln").cast(pl.Float64)
    )


def _class_rows(pairs: pl.DataFrame, node_of: dict[int, int]) -> pl.DataFrame:
    """``step, layer, rank, r_same_rank, r_same_node, r_cross_node``: per class max(sent, received) rows."""
    nodes = pl.DataFrame(
        {"rank": list(node_of), "node_id": list(node_of.values())}, schema={"rank": pl.Int32, "node_id": pl.Int32}
    )
    p = with_link_class(pairs.with_columns(pl.col("src").cast(pl.Int32), pl.col("dst").cast(pl.Int32)), nodes)
    sent = p.group_by("step", "layer", pl.col("src").alias("rank"), "link_class").agg(pl.col("rows").sum().alias("_s"))
    recv = p.group_by("step", "layer", pl.col("dst").alias("rank"), "link_class").agg(pl.col("rows").sum().alias("_r"))
    both = sent.join(recv, on=["step", "layer", "rank", "link_class"], how="full", coalesce=True)
    m = pl.max_horizontal(pl.col("_s").fill_null(0), pl.col("_r").fill_null(0)).cast(pl.Float64)
    return (
        both.group_by("step", "layer", "rank")
        .agg(*[m.filter(pl.col("link_class") == k).sum().alias(f"r_{k}") for k in LINK_CLASSES])
        .with_columns(pl.col("layer").cast(pl.Int32), pl.col("rank").cast(pl.Int32))
    )


def _transfer_delta(g: StepGraph, inp: PlacementInputs, scenario: str) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the modelled change of its link cost, ns, as ``(lead gap change, transfer change)``: an
    injected link delay the caller waited before the call sits in the lead gap, so the change of the
    delay's part of the costs (:attr:`~ep_trace.analysis.link_cost.LinkCosts.delay`) goes there and the
    rest to the transfer."""
    dg, dt = np.zeros(g.nodes.height), np.zeros(g.nodes.height)
    calls = g.nodes.filter(
        (pl.col("kind") == "call") & pl.col("direction").is_in(["dispatch", "combine"]) & pl.col("layer").is_not_null()
    ).select("node", "rank", "step", "layer", "direction", "match_id", "transfer_ns")
    if calls.is_empty() or inp.call_bytes.is_empty():
        return dg, dt
    c = calls.join(inp.call_bytes, on=["match_id", "rank"], how="inner")
    tot = pl.sum_horizontal(_B)
    c = c.with_columns(tot.alias("_tot")).with_columns(
        (pl.col("_tot") / pl.col("_tot").sum().over("rank", "step", "layer", "direction")).fill_nan(0.0).alias("_f")
    )
    new = _class_rows(inp.plan.pairs[scenario], inp.plan.node_of)
    c = c.join(new, on=["step", "layer", "rank"], how="inner")
    if c.is_empty():
        return dg, dt
    scale = pl.col("_f") * pl.col("row_bytes")
    old_b = c.select(_B).to_numpy().astype(np.float64)
    new_b = c.select([(pl.col(f"r_{k}") * scale).fill_null(0.0) for k in LINK_CLASSES]).to_numpy().astype(np.float64)
    change = inp.costs.price(new_b) - inp.costs.price(old_b)
    in_gap = inp.costs.price_delay(new_b) - inp.costs.price_delay(old_b)
    idx = c["node"].to_numpy()
    dg[idx], dt[idx] = in_gap, change - in_gap
    return dg, dt


def placement_edits(
    g: StepGraph, gap: np.ndarray, transfer: np.ndarray, inp: PlacementInputs
) -> list[tuple[str, np.ndarray, np.ndarray, list[int]]]:
    """``(scenario, edited gaps, edited transfers, ranks it changes)`` of each proposal of the plan."""
    out = []
    for sc in SCENARIOS:
        if sc not in inp.plan.proposals:
            continue
        dz, _ = expert_delta(g, _loads(inp, sc), charge_idle=True)
        dg, dt = _transfer_delta(g, inp, sc)
        changed = (np.abs(dz) > 0) | (np.abs(dt) > 0) | (np.abs(dg) > 0)
        ranks = sorted({int(r) for r in g.nodes.filter(pl.Series(changed))["rank"].unique()})
        edited_gap = np.maximum(gap - dz + dg, 0.0)
        out.append((sc, edited_gap, np.maximum(transfer + dt, 0.0), ranks or list(inp.plan.current.ranks)))
    return out

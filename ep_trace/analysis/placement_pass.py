"""Pass 6b of :func:`~ep_trace.analysis.engine.analyze`: topology, link costs, EP invariants, placement.

After the load pass: which ranks share a node (:mod:`~ep_trace.analysis.topology`), the bytes of each
layer per link class and the α–β of each class (:mod:`~ep_trace.analysis.link_cost`), the EP
invariants the counts make checkable (:mod:`~ep_trace.analysis.ep_invariants`), and the placement
plan (:mod:`~ep_trace.analysis.placement_plan`) whose proposals the model pass turns into what-ifs
(:mod:`~ep_trace.analysis.placement_whatif`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import ep_invariants, imbalance, link_cost, link_delay, topology
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.load_pass import LoadPass
from ep_trace.analysis.match_pass import MatchPass
from ep_trace.analysis.placement_plan import SCENARIOS, PlacementPlan, PlacementProposal, build_plan, row_bytes_of
from ep_trace.analysis.placement_whatif import PlacementInputs
from ep_trace.dtypes import itemsize_expr
from ep_trace.schema import TraceTables

__all__ = ["PlacementPass", "placement_pass", "proposals"]


@dataclass(frozen=True)
class PlacementPass:
    """Attributes: the :class:`~ep_trace.analysis.result.Analysis` frames ``topology``, ``link_costs``,
    ``link_bytes``, ``ep_invariants``, the plan, the what-ifs' inputs (None without a plan) and notes."""

    topology: pl.DataFrame
    link_costs: pl.DataFrame
    link_bytes: pl.DataFrame
    ep_invariants: pl.DataFrame
    plan: PlacementPlan | None
    inputs: PlacementInputs | None
    notes: tuple[str, ...]


def _observations(m: MatchPass, call_bytes: pl.DataFrame) -> pl.DataFrame:
    """One row per (valid all-to-all call, rank): bytes per class, the wait-free transfer ``y_ns`` and the
    injected link delay before the call ``delay_ns``."""
    if m.calls.is_empty() or call_bytes.is_empty():
        return pl.DataFrame(
            schema={**{f"b_{k}": pl.Float64 for k in topology.LINK_CLASSES}, "y_ns": pl.Float64, "delay_ns": pl.Float64}
        )
    ok = m.calls.filter(pl.col("valid") & pl.col("collective").str.starts_with("all_to_all")).select("match_id")
    cr = m.call_ranks.join(ok, on="match_id", how="semi").select(
        "match_id", pl.col("rank").cast(pl.Int32), pl.col("transfer_ns").cast(pl.Float64).alias("y_ns")
    )
    return cr.join(call_bytes, on=["match_id", "rank"], how="inner")


def _fit(obs: pl.DataFrame, config: AnalysisConfig) -> tuple[link_cost.LinkCosts, pl.DataFrame]:
    """The α–β per link class; where the sidecar recorded an injected delay before the calls (ep-trace
    demo's emulated network) it is part of the link cost, fitted apart from the transport
    (:mod:`~ep_trace.analysis.link_delay`)."""
    if link_delay.has_delays(obs):
        return link_delay.fit_emulated(obs, config.link_defaults)
    return link_cost.fit_link_costs(obs, config.link_defaults)


def _delays(matched: pl.DataFrame) -> pl.DataFrame:
    """``match_id, rank, delay_ns``: the injected link delay each rank waited before each call (sidecar)."""
    if "link_delay_ns" not in matched.columns:
        return pl.DataFrame(schema={"match_id": pl.Int64, "rank": pl.Int32, "delay_ns": pl.Float64})
    return (
        matched.filter(pl.col("match_id").is_not_null())
        .group_by("match_id", pl.col("rank").cast(pl.Int32))
        .agg(pl.col("link_delay_ns").fill_null(0).sum().cast(pl.Float64).alias("delay_ns"))
    )


def placement_pass(
    tables: TraceTables, m: MatchPass, ld: LoadPass, steps: list[int], config: AnalysisConfig
) -> PlacementPass:
    """Topology, link bytes and costs, EP invariants and the placement plan of the analysed steps."""
    notes: list[str] = []
    nodes = topology.rank_nodes(tables.ranks, config.topology)
    note = topology.topology_note(nodes)
    if note:
        notes.append(note)
    cb = link_cost.call_class_bytes(m.matched, nodes).join(_delays(m.matched), on=["match_id", "rank"], how="left")
    cb = cb.with_columns(pl.col("delay_ns").fill_null(0.0))
    costs, cost_table = _fit(_observations(m, cb), config)
    lb = link_cost.link_bytes(ld.count_matrix, nodes)
    plan = build_plan(
        tables.ranks,
        tables.routing_counts,
        tables.placement,
        nodes,
        steps,
        row_bytes_of(ld.count_matrix, tables.ranks),
        config.replica_budget,
        config.node_local_slack,
    )
    inv = ep_invariants.ep_invariants(
        tables.routing_counts.filter(pl.col("step").is_in(steps)) if steps else tables.routing_counts,
        ld.count_matrix,
        ld.split_violations,
        plan.in_force.per_key(recorded_only=True) if plan is not None and plan.in_force is not None else None,
        imbalance.split_pairs_compared(m.matched),
    )
    inputs = None
    if plan is not None and not plan.steps_matched:
        notes.append(
            "the routing counts' steps are none of the analysed profiler steps (a routing dump numbers its own): their "
            "mean per step stands for each analysed step in the placement model"
        )
    if plan is not None and plan.in_force is not None and plan.in_force.distinct > 1:
        notes.append(
            f"the analysed steps ran {plan.in_force.distinct} expert placements (a layer re-placed during the run, "
            "the sidecar's placement records): each step's counts are checked and routed under the placement it ran; "
            "'current' lists the one most of them ran"
        )
    if plan is not None:
        if not plan.recorded:
            notes.append(
                "no expert placement recorded: the placement what-ifs assume the contiguous default (rank i of the "
                "EP group holds experts i*E/W .. (i+1)*E/W - 1, as Megatron-Core and vLLM place them)"
            )
        rb = (
            m.matched.filter(pl.col("match_id").is_not_null())
            .group_by("match_id")
            .agg(pl.coalesce("row_bytes", itemsize_expr(pl.col("dtype"))).cast(pl.Float64).median().alias("row_bytes"))
        )
        inputs = PlacementInputs(plan, ld.rank_load, cb.join(rb, on="match_id", how="inner"), costs)
    return PlacementPass(nodes, cost_table, lb, inv, plan, inputs, tuple(notes))


def proposals(plan: PlacementPlan | None, budget: int) -> tuple[PlacementProposal, ...]:
    """The plan's proposals as data (``Analysis.placement_proposals``), in :data:`SCENARIOS` order."""
    if plan is None:
        return ()
    return tuple(plan.proposal(sc, budget) for sc in SCENARIOS if sc in plan.proposals)

"""The summary sections of the placement model (docs/summary.md): EP invariants, topology, link costs,
bytes per link class, and the placement comparison (current vs each proposal)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from ep_trace.analysis.placement_plan import scenario_stats

if TYPE_CHECKING:  # result.Analysis.summary() reaches here through summary.build_summary
    from ep_trace.analysis.result import Analysis

__all__ = ["invariants_section", "placement_sections"]


def invariants_section(a: Analysis) -> list[dict[str, Any]]:
    """``ep_invariants``: one object per check (``check, status, checked, violations, detail``)."""
    return a.ep_invariants.to_dicts() if a.ep_invariants is not None else []


def _topology(a: Analysis) -> dict[str, Any] | None:
    t = a.topology
    if t is None or t.is_empty():
        return None
    nodes = t.group_by("node", maintain_order=True).agg(pl.col("rank").sort())
    return {
        "sources": sorted(t["source"].unique().to_list()),
        "nodes": {str(n): [int(x) for x in r] for n, r in nodes.iter_rows()},
    }


def _placement(a: Analysis) -> dict[str, Any] | None:
    p = a.placement
    if p is None or p.is_empty():
        return None
    stats = scenario_stats(a.placement)
    wf = {r["scenario"]: r for r in a.whatif.iter_rows(named=True)} if a.whatif is not None else {}
    by_scenario = {}
    for sc, s in stats.items():
        rows = p.filter(pl.col("scenario") == sc).sort("rank")
        w = wf.get(sc)
        by_scenario[sc] = {
            "max_load_rows": s["max_load"],
            "mean_load_rows": s["mean_load"],
            "I_r": s["I_r"],
            "cross_node_bytes_per_step": s["cross_node_bytes"],
            "predicted_step_ns": int(w["predicted_step_ns"]) if w else None,
            "ranks": rows.select("rank", "node", "experts", "load", "cross_node_bytes").to_dicts(),
        }
    if "current" in by_scenario and wf:
        base = next(iter(wf.values()))
        by_scenario["current"]["predicted_step_ns"] = int(base["predicted_step_ns"]) + int(base["saving_ns"])
    return {
        "recorded": bool(p["recorded"][0]),
        "replica_budget": a.config.replica_budget,
        "scenarios": by_scenario,
    }


def placement_sections(a: Analysis) -> dict[str, Any]:
    """``topology``, ``link_costs``, ``link_bytes``, ``placement`` (null / empty when absent)."""
    lc = a.link_costs
    costs = {r.pop("link_class"): r for r in lc.to_dicts()} if lc is not None and lc.height else {}
    lb = a.link_bytes.to_dicts() if a.link_bytes is not None else []
    return {"topology": _topology(a), "link_costs": costs, "link_bytes": lb, "placement": _placement(a)}

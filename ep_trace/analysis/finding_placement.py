"""Findings of the placement what-ifs: re-place / replicate hot experts, keep tokens inside a node.

* expert_placement <- ``placement`` (EPLB-style balanced placement with replicas of the hot experts);
* cross_node_traffic <- ``node_local`` (experts on the nodes whose tokens use them).

Each states the proposal's effect on the quantities it changes (largest rank load over the mean,
cross-node bytes per step) beside its simulated step, and where to get the file a framework takes
(``ep-trace analyze --propose-placement FILE``). Only on EP traffic, where the proposal improves what
it is for (expert_placement: a lower max/mean rank load; cross_node_traffic: fewer cross-node bytes) and
saves at least :data:`MIN_SAVING_SHARE` of the step: under uniform routing the balanced proposal moves
a few rows either way and its simulated step differs by the per-row noise of the ranks' costs (85 µs of
a 19 ms step in a 2-rank demo run), not a saving worth moving expert weights for.
"""

from __future__ import annotations

from typing import Any

from ep_trace.analysis.finding_common import fmt_ns, has_ep_traffic, severity, wf, wf_ev
from ep_trace.analysis.placement_plan import scenario_stats
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["MIN_SAVING_SHARE", "placement_findings"]

#: The least share of the step a placement finding must save (the straggler rule's bar, findings.py).
MIN_SAVING_SHARE = 0.01


def _worth(saving: int, step_ns: float) -> bool:
    return saving > 0 and not (step_ns > 0 and saving < MIN_SAVING_SHARE * step_ns)


def _replicated(a: Analysis, scenario: str) -> list[int]:
    """Experts with more than one copy in the proposal."""
    for pr in a.placement_proposals:
        if pr.scenario == scenario:
            n: dict[int, int] = {}
            for ex in pr.experts:
                for e in set(ex):
                    n[e] = n.get(e, 0) + 1
            return sorted(e for e, c in n.items() if c > 1)
    return []


def _placement(a: Analysis, step_ns: float, stats: dict[str, dict[str, Any]]) -> list[Finding]:
    r = wf(a, "placement")
    if r is None or not _worth(int(r["saving_ns"]), step_ns) or "placement" not in stats:
        return []
    cur, new = stats["current"], stats["placement"]
    if cur["I_r"] is None or new["I_r"] is None or new["I_r"] >= cur["I_r"]:
        return []
    saving = int(r["saving_ns"])
    reps = _replicated(a, "placement")
    budget = a.config.replica_budget
    rep_txt = f"replicating experts {', '.join(map(str, reps[:6]))}" if reps else "without replicas"
    title = (
        f"Re-placing the experts ({rep_txt}, at most {budget} extra per rank) evens the expert load: max/mean "
        f"{cur['I_r']:.3g} -> {new['I_r']:.3g}; predicted step {fmt_ns(int(r['predicted_step_ns']))}, "
        f"{fmt_ns(saving)} saved per step (simulated)."
    )
    ev = {
        "whatif": wf_ev(r),
        "current": _ev(cur),
        "proposed": _ev(new),
        "replicated_experts": reps,
        "replica_budget": budget,
        "saving_rule": "simulated: each rank's expert compute at its measured cost per row for the rows the proposal "
        "routes to it; all-to-all transfers re-priced with the α–β of each link class",
    }
    remedy = (
        "Apply the proposed placement: ep-trace analyze ... --propose-placement FILE writes it (SGLang takes the "
        "FILE.sglang.json beside it as --init-expert-location; in vLLM, --enable-eplb with num_redundant_experts = "
        "ranks x the budget lets its EPLB place replicas itself). Re-run and compare with ep-trace compare."
    )
    return [Finding("expert_placement", severity(saving, step_ns), title, saving, ev, remedy, tuple(r["ranks"]))]


def _node_local(a: Analysis, step_ns: float, stats: dict[str, dict[str, Any]]) -> list[Finding]:
    r = wf(a, "node_local")
    if r is None or not _worth(int(r["saving_ns"]), step_ns) or "node_local" not in stats:
        return []
    cur, new = stats["current"], stats["node_local"]
    if new["cross_node_bytes"] >= cur["cross_node_bytes"]:
        return []
    saving = int(r["saving_ns"])
    cut = 1.0 - new["cross_node_bytes"] / cur["cross_node_bytes"] if cur["cross_node_bytes"] else 0.0
    title = (
        "Keeping tokens inside their node (the node_local placement): placing experts where their tokens come "
        f"from cuts cross-node bytes by {cut:.0%} per step at max/mean load {new['I_r']:.3g}; predicted step "
        f"{fmt_ns(int(r['predicted_step_ns']))}, {fmt_ns(saving)} saved per step (simulated)."
    )
    ev = {
        "whatif": wf_ev(r),
        "current": _ev(cur),
        "proposed": _ev(new),
        "cross_node_bytes_cut": round(cut, 4),
        "replicated_experts": _replicated(a, "node_local"),
        "saving_rule": "simulated: the proposal's rows per link class re-priced with the α–β of each class, expert "
        "compute at each rank's measured cost per row",
    }
    remedy = (
        "Place experts on the nodes whose tokens use them (ep-trace analyze ... --propose-placement FILE writes the "
        "node_local proposal as FILE.node_local.json), and keep the rest of the traffic node-limited: group-limited "
        "routing (DeepSeek-V3's top-k groups) or a hierarchical all-to-all (DeepEP internode: one NIC hop, then NVLink)."
    )
    return [Finding("cross_node_traffic", severity(saving, step_ns), title, saving, ev, remedy, tuple(r["ranks"]))]


def _ev(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_load_rows": round(float(s["max_load"]), 1),
        "mean_load_rows": round(float(s["mean_load"]), 1),
        "I_r": round(float(s["I_r"]), 4) if s["I_r"] is not None else None,
        "cross_node_bytes_per_step": int(s["cross_node_bytes"]),
    }


def placement_findings(a: Analysis, step_ns: float) -> list[Finding]:
    """The two findings (module doc), on EP traffic only."""
    if not has_ep_traffic(a):
        return []
    stats = scenario_stats(a.placement)
    return _placement(a, step_ns, stats) + _node_local(a, step_ns, stats)

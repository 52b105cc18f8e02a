"""Findings: the ranked bottleneck verdict, each with evidence, a simulated saving and a remedy.

Every saving (per step, ns) is the ``saving_ns`` of a what-if re-simulated on the step graph
(:mod:`ep_trace.analysis.whatif`), stated in each finding's ``evidence.whatif``, so savings of
different findings come from one model and rank against each other (they still overlap: the
``all`` what-if is the bound, not their sum):

* exposed_comm <- ``chunked_pipeline`` on EP traces when it saves (the remedy named), else
  ``full_overlap``; where neither saves (no resource to hide the transfer behind: gloo ranks without
  a spare core, ``analysis.resources``) ``fp8_dispatch``, fewer bytes (:mod:`finding_comm`);
* straggler_wait <- ``no_straggler`` (lateness its expert load does not explain); the most loaded
  rank whose lateness balancing the routing recovers by half or more is routing imbalance instead;
* routing_imbalance <- ``balanced_routing``;
* host_stall <- ``no_host_stalls``;
* host_bound <- ``no_launch_gaps`` (GPU ranks whose device waits for a busy host, :mod:`finding_host`);
* bandwidth_bound <- ``fp8_dispatch`` (EP traffic only);
* pack_unpack_overhead <- ``fused_permute``;
* small_message_latency: upper bound calls per step x alpha (no graph edit), only from a fit with
  enough calls and r2 >= 0.8;
* split_inconsistency / missing_collective: correctness findings, saving 0, listed after the
  performance findings.

Verdict hygiene (each rule has a test in tests/analysis/test_verdict.py): a finding with no positive
simulated saving is not reported; EP remedies (all-to-all pipelining, DeepEP, count exchange,
expert placement) only when the trace holds EP all-to-all traffic (an all-to-all with MoE evidence:
``finding_common.has_ep_traffic``; even all-to-alls alone, as sequence parallelism has, get an
all-to-all overlap remedy that says so), and "its expert load does not explain" only where routing
counts are known; with ranks missing from the
calls' groups no wait / transfer split and no straggler is claimed; a headline never contradicts its
remedy; figures carry 3 significant digits (:func:`fmt_ns`).
"""

from __future__ import annotations

import dataclasses
from typing import cast

import polars as pl

from ep_trace.analysis.finding_comm import MIN_FIT_CALLS, MIN_FIT_R2, alpha_beta, exposed, fit_conclusive
from ep_trace.analysis.finding_common import (
    fmt_ns,
    has_ep_traffic,
    has_expert_load,
    rank_modes,
    severity,
    waits_measurable,
)
from ep_trace.analysis.finding_common import num as _num
from ep_trace.analysis.finding_common import wf as _wf
from ep_trace.analysis.finding_common import wf_ev as _wf_ev
from ep_trace.analysis.finding_host import host_bound
from ep_trace.analysis.imbalance import run_aggregate
from ep_trace.analysis.late_stages import late_stages
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["with_findings", "severity", "fmt_ns", "fit_conclusive", "MIN_FIT_CALLS", "MIN_FIT_R2"]

REBALANCE_SHARE = (
    0.5  # balanced_routing saving / no_straggler saving above which the late, most loaded rank is imbalance
)

_ORDER = {"high": 0, "medium": 1, "low": 2}


def with_findings(a: Analysis) -> Analysis:
    """Return ``a`` with its findings filled and ranked by simulated saving."""
    step_ns = float(cast(float, a.rank_summary["step_time_ns"].median()) or 0.0) if a.rank_summary.height else 0.0
    n_steps = max(int(a.steps["step"].n_unique()), 1) if a.steps.height else 1
    out: list[Finding] = []
    out += exposed(a, step_ns)
    out += _straggler(a, step_ns, n_steps)
    out += _imbalance(a, step_ns)
    out += _stalls(a, step_ns, n_steps)
    out += host_bound(a, step_ns)
    out += alpha_beta(a, step_ns, n_steps)
    out += _pack(a, step_ns)
    # no finding without a positive saving heads (or joins) the performance list
    out = [f for f in out if f.est_saving_ns > 0]
    out = _one_finding_per_whatif(out)
    out.sort(key=lambda f: (-f.est_saving_ns, _ORDER.get(f.severity, 3), f.kind))
    out += _correctness(a)
    return dataclasses.replace(a, findings=tuple(out))


def _one_finding_per_whatif(out: list[Finding]) -> list[Finding]:
    """Each simulated saving backs one finding only (the larger; ties: the first): the same edit of the
    graph, e.g. ``fp8_dispatch`` for exposed comm and for a bandwidth-bound fit, is not counted twice."""

    def scenario(f: Finding) -> str | None:
        wf = f.evidence.get("whatif")
        return wf.get("scenario") if isinstance(wf, dict) else None

    best: dict[str, Finding] = {}
    for f in out:
        sc = scenario(f)
        if sc is not None and (sc not in best or f.est_saving_ns > best[sc].est_saving_ns):
            best[sc] = f
    return [f for f in out if (sc := scenario(f)) is None or best[sc] is f]


def _straggler(a: Analysis, step_ns: float, n_steps: int) -> list[Finding]:
    r = _wf(a, "no_straggler")
    if r is None or not waits_measurable(a) or int(r["saving_ns"]) <= 0:
        return []
    rank = int(r["ranks"][0])
    saving = int(r["saving_ns"])
    # a straggler stands out: removing its lateness must save a meaningful part of the step (1 %)
    if step_ns > 0 and saving < 0.01 * step_ns:
        return []
    # the most loaded rank, late by about what balancing the routing saves, is routing imbalance:
    # a CPU-starved or memory-bound rank with more tokens is slower in every phase, not only in its
    # expert GEMMs (REBALANCE_SHARE of the straggler saving explained by load is enough)
    bal = _wf(a, "balanced_routing")
    if bal is not None and rank == _most_loaded(a) and int(bal["saving_ns"]) >= REBALANCE_SHARE * saving:
        return []
    s = a.stragglers.filter(pl.col("rank") == rank)
    n_calls = int(a.calls.filter(pl.col("valid")).height) if a.calls.height else 0
    row = (
        s.row(0, named=True)
        if s.height
        else {"times_last": 0, "induced_wait_ns": 0, "lateness_p50_ns": 0, "total_wait_ns": 0}
    )
    # the waits on the rank in every group it belongs to (the wait matrix is per process group)
    wm = (
        a.wait_matrix.filter(pl.col("waited_for") == rank)
        .group_by("waiter")
        .agg(pl.col("wait_ns").sum())
        .sort("waiter")
    )
    ev = {
        "rank": rank,
        "times_last": int(row["times_last"]),
        "matched_calls": n_calls,
        "induced_wait_ns": int(row["induced_wait_ns"]),
        "lateness_p50_ns_per_step": int(row["lateness_p50_ns"]),
        "own_wait_ns": int(row["total_wait_ns"]),
        "waiting_ranks": {int(x["waiter"]): int(x["wait_ns"]) for x in wm.iter_rows(named=True)},
        "clock_uncertainty_ns": int(cast(int, a.clock["residual_ns"].max()) or 0) if a.clock.height else 0,
        "whatif": _wf_ev(r),
        "saving_rule": "simulated: the rank's work before each arrival, less its expert compute, set to the other ranks' median",
    }
    ep = has_ep_traffic(a)
    cpu = frozenset(r for r, m in rank_modes(a).items() if m == "cpu")
    late = late_stages(a.stages, a.rank_load, rank, cpu)
    ev["late_by_stage_ns_per_step"] = {str(x["stage"]): int(x["excess_ns"]) for x in late.iter_rows(named=True)}
    ev["late_idle_ns_per_step"] = {str(x["stage"]): int(x["idle_ns"]) for x in late.iter_rows(named=True)}
    # "its expert load does not explain" only where the load is known (routing counts or splits)
    why = "for reasons its expert load does not explain" if ep and has_expert_load(a) else "before the collectives"
    return [
        Finding(
            "straggler_wait",
            severity(saving, step_ns),
            f"Rank {rank} is the straggler: late {why} (last at {row['times_last']} of {n_calls} calls); removing its lateness "
            f"saves {fmt_ns(saving)} per step (simulated).",
            saving,
            ev,
            _straggler_remedy(a, rank, late, ep),
            (rank,),
        )
    ]


def _straggler_remedy(a: Analysis, rank: int, late: pl.DataFrame, ep: bool) -> str:
    """Where to look: the stage that holds most of the rank's extra time (:mod:`late_stages`), and
    whether it is idle inside the stage (a sleep, a lock) or in its ops (slower compute); the network
    is ruled out only when the rank's transfers are no slower than the others'."""
    total = float(late["excess_ns"].sum()) if late.height else 0.0
    top = late.row(0, named=True) if late.height else None
    if top is not None and top["excess_ns"] >= 0.5 * total:
        stage, ex, idle = str(top["stage"]), int(top["excess_ns"]), int(top["idle_ns"])
        vs = "the other ranks' (scaled to its load)" if stage == "expert" and has_expert_load(a) else "the other ranks'"
        where = f"Rank {rank}'s extra time is in its {stage} stage: {fmt_ns(ex)} per step above {vs}"
        if idle >= 0.5 * ex:
            text = (
                f"{where}, {fmt_ns(idle)} of it with none of the stage's ops running: look there for a sleep, a lock, a "
                "blocking call or a descheduled thread (py-spy dump of that rank), not for slower compute"
            )
        else:
            text = (
                f"{where}, spent in its ops: slower compute on that rank (clocks, throttling, a noisy neighbour, a "
                "different kernel or shape)"
            )
    else:
        text = (
            f"Find why rank {rank} is late before the collective: a host stall, slower hardware, a noisy neighbour or "
            + ("extra work outside the experts" if ep else "extra work on that rank")
        )
    rs = a.rank_summary
    if rs.height > 1 and "transfer_ns" in rs.columns:
        own = rs.filter(pl.col("rank") == rank)["transfer_ns"].to_list()
        others = rs.filter(pl.col("rank") != rank)["transfer_ns"].drop_nulls()
        if own and own[0] is not None and others.len() and own[0] <= 1.1 * float(cast(float, others.median())):
            text += "; its transfers are no slower than the other ranks', so this is not the network"
    return text + "."


def _most_loaded(a: Analysis) -> int | None:
    rl = a.rank_load
    if rl.is_empty():
        return None
    return int(
        rl.group_by("rank")
        .agg(pl.col("recv_rows").sum())
        .sort(["recv_rows", "rank"], descending=[True, False])["rank"][0]
    )


def _imbalance(a: Analysis, step_ns: float) -> list[Finding]:
    r = _wf(a, "balanced_routing")
    agg = run_aggregate(a.imbalance)
    ie, ir = agg["I_e"], agg["I_r"]
    if r is None or int(r["saving_ns"]) <= 0:
        return []
    saving = int(r["saving_ns"])
    rl = a.rank_load
    hot = []
    if a.expert_load.height:
        el = a.expert_load.group_by("expert").agg(pl.col("count").sum()).sort("count", descending=True)
        tot = float(el["count"].sum()) or 1.0
        hot = [
            {"expert": int(x["expert"]), "share": round(float(x["count"]) / tot, 4)}
            for x in el.head(3).iter_rows(named=True)
        ]
    worst = a.imbalance.sort("I_r", descending=True, nulls_last=True).head(1)
    maxrank = None
    if rl.height:
        maxrank = int(rl.group_by("rank").agg(pl.col("recv_rows").sum()).sort("recv_rows", descending=True)["rank"][0])
    ev = {
        "I_e": _num(ie),
        "I_r": _num(ir),
        "balancedness": _num(agg["balancedness"]),
        "hot_experts": hot,
        "most_loaded_rank": maxrank,
        "worst": {k: _num(v) for k, v in worst.row(0, named=True).items()} if worst.height else None,
        "whatif": _wf_ev(r),
        "saving_rule": "simulated: every rank's expert compute scaled by mean load / its load",
    }
    hot_txt = ", ".join(str(h["expert"]) for h in hot) or "the hottest experts"
    layers = tuple(sorted({int(x) for x in a.imbalance.filter(pl.col("I_r") >= 1.1)["layer"].drop_nulls()}))
    ir_txt = f"{ir:.3g}" if ir is not None else "n/a"
    ie_txt = f"{ie:.3g}" if ie is not None else "n/a"
    return [
        Finding(
            "routing_imbalance",
            severity(saving, step_ns),
            f"Routing is uneven (I_e = {ie_txt}, I_r = {ir_txt}, max/mean): rank {maxrank}'s experts carry the most tokens "
            f"and set the pace; balanced routing saves {fmt_ns(saving)} per step (simulated).",
            saving,
            ev,
            f"Replicate or re-place hot experts ({hot_txt}) across ranks (EPLB-style), strengthen load balancing "
            "(auxiliary-loss-free bias or aux loss), and prefer node-limited routing to cut cross-node traffic.",
            (maxrank,) if maxrank is not None else (),
            layers,
        )
    ]


def _stalls(a: Analysis, step_ns: float, n_steps: int) -> list[Finding]:
    hs = a.host_stalls
    r = _wf(a, "no_host_stalls")
    if r is None or hs.is_empty() or int(r["saving_ns"]) <= 0:
        return []
    saving = int(r["saving_ns"])
    steps = a.steps.select("rank", "step")
    per_step = steps.join(
        hs.group_by(["rank", "step"]).agg(pl.col("stall_ns").sum()), on=["rank", "step"], how="left"
    ).with_columns(pl.col("stall_ns").fill_null(0))
    per = (
        per_step.group_by("rank")
        .agg(pl.col("stall_ns").median().alias("p50"), pl.col("stall_ns").sum())
        .join(hs.group_by("rank").agg(pl.len().alias("n")), on="rank")
        .sort(["p50", "rank"], descending=[True, False])
    )
    w = per.row(0, named=True)
    names = (
        hs.filter(pl.col("rank") == w["rank"])
        .group_by("name")
        .agg(pl.col("stall_ns").sum())
        .sort(["stall_ns", "name"], descending=[True, False])  # ties by name: not by the group order
    )
    ev = {
        "rank": w["rank"],
        "stall_p50_ns_per_step": int(w["p50"]),
        "stall_ns_total": int(w["stall_ns"]),
        "calls": int(w["n"]),
        "by_call": {x["name"]: int(x["stall_ns"]) for x in names.head(5).iter_rows(named=True)},
        "by_stage": {
            str(x["stage"]): int(x["stall_ns"])
            for x in hs.group_by("stage").agg(pl.col("stall_ns").sum()).iter_rows(named=True)
        },
        "whatif": _wf_ev(r),
        "saving_rule": "simulated: blocking host calls take no time",
    }
    count_x = a.calls.height and bool((a.calls["direction"] == "count").any())
    remedy = (
        "Keep split sizes on the device: exchange counts with a device-side layout (DeepEP-style notify) or overlap the "
        "count all-to-all with permute; avoid .item()/cudaStreamSynchronize inside dispatch; use pinned non-blocking D2H."
        if has_ep_traffic(a) and count_x
        else "Remove blocking host syncs from the step (.item(), cudaStreamSynchronize, synchronous D2H copies): keep values "
        "on the device, use non-blocking copies into pinned memory, and sync once per step."
    )
    # the what-if removes every rank's blocking calls, not only the worst rank's: say so, or the
    # saving reads as that rank's (the default demo: rank 3 blocks 9.2 ms, all 4 ranks' calls save 13.4 ms)
    wranks = [int(x) for x in (r["ranks"] or [])]
    scope = (
        ""
        if len(wranks) <= 1
        else f" on all {len(wranks)} ranks"
        if len(wranks) == a.steps["rank"].n_unique()
        else f" on ranks {', '.join(map(str, wranks))}"
    )
    most = f" (the most of {per.height} ranks)" if per.height > 1 else ""
    if rank_modes(a).get(int(w["rank"])) == "cpu":
        # a gloo rank has no device to idle: its compute thread blocks in the count exchange (host_stalls)
        title = (
            f"Rank {w['rank']}'s compute thread blocks {fmt_ns(int(w['p50']))} per step in the count exchange after "
            f"the last rank arrived{most}; removing the blocking calls{scope} saves {fmt_ns(saving)} per step "
            "(simulated)."
        )
    else:
        title = (
            f"Rank {w['rank']}'s device is idle {fmt_ns(int(w['p50']))} per step while the host blocks{most}; "
            f"removing the blocking calls{scope} saves {fmt_ns(saving)} per step (simulated)."
        )
    return [
        Finding(
            "host_stall",
            severity(saving, step_ns),
            title,
            saving,
            ev,
            remedy,
            (int(w["rank"]),),
        )
    ]


def _pack(a: Analysis, step_ns: float) -> list[Finding]:
    r = _wf(a, "fused_permute")
    st = a.stages.filter(pl.col("stage").is_in(["permute", "unpermute"]))
    if r is None or st.is_empty() or int(r["saving_ns"]) <= 0:
        return []
    per = (
        st.group_by(["rank", "step"])
        .agg(pl.col("busy_ns").sum())
        .group_by("rank")
        .agg(pl.col("busy_ns").mean())
        .sort("busy_ns", descending=True)
    )
    w = per.row(0, named=True)
    if step_ns <= 0 or w["busy_ns"] < 0.1 * step_ns:
        return []
    saving = int(r["saving_ns"])
    rank = int(w["rank"])
    remedy = "Fuse permute/unpermute with the dispatch/combine (DeepEP-style) or use fused moe_align / scatter kernels."
    ev: dict[str, object] = {
        "rank": rank,
        "permute_unpermute_ns_per_step": int(w["busy_ns"]),
        "whatif": _wf_ev(r),
        "saving_rule": "simulated: permute / unpermute compute halved (fused kernels), less stalled op calls",
    }
    title = (
        f"Permute + unpermute take {fmt_ns(w['busy_ns'])} per step on rank {rank}; fused kernels at half the time "
        f"save {fmt_ns(saving)} per step (simulated)."
    )
    stall = _stalls_of(a, rank)
    if stall is not None:
        stall_ns, calls, op, busy_ns = stall
        n_steps = max(a.steps.filter(pl.col("rank") == rank)["step"].n_unique(), 1)
        per_step = stall_ns / n_steps
        ev |= {"stall_ns_per_step": int(per_step), "stall_calls": calls, "stall_top_op": op}
        if stall_ns >= 0.2 * max(busy_ns, 1):
            title = (
                f"Permute + unpermute take {fmt_ns(w['busy_ns'])} per step on rank {rank}, {fmt_ns(per_step)} of it in "
                f"op calls that ran 10x or more their usual time ({calls} in {n_steps} steps); fused kernels at half "
                f"the rest save {fmt_ns(saving)} per step (simulated)."
            )
            remedy = (
                f"Most of this is host stalls, not data movement: {calls} calls (most in {op}) took 10x or more the "
                "op's usual time (the fastest rank's median), as page faults, allocator unmaps or a thread that lost "
                f"its core do; fusing does not remove them. Look at rank {rank}'s host (perf / py-spy, its cores, "
                "memory and neighbours) first; then " + remedy[0].lower() + remedy[1:]
            )
    return [Finding("pack_unpack_overhead", severity(saving, step_ns), title, saving, ev, remedy, (rank,))]


def _stalls_of(a: Analysis, rank: int) -> tuple[int, int, str | None, int] | None:
    """``(stall ns, stalled calls, top op, busy ns)`` of ``rank``'s permute + unpermute, over the
    analysed steps; None without stalls."""
    st = a.op_stalls
    if st is None or st.is_empty():
        return None
    mine = st.filter(pl.col("rank") == rank)
    total = int(mine["stall_ns"].sum())
    if total <= 0:
        return None
    top = mine.sort("stall_ns", descending=True)["top_op"][0]
    return total, int(mine["stall_calls"].sum()), top, int(mine["busy_ns"].sum())


def _correctness(a: Analysis) -> list[Finding]:
    out = []
    v = a.split_violations
    if v.height:
        out.append(
            Finding(
                "split_inconsistency",
                "high",
                f"{v.height} send/receive split pairs disagree (rank i's send to j != rank j's receive from i).",
                0,
                {"violations": v.head(20).to_dicts(), "total": v.height},
                "Check the split bookkeeping of the dispatcher: counts must be exchanged before the token all-to-all.",
            )
        )
    m = a.misaligned
    nc = int((~a.calls["causal"]).sum()) if a.calls.height else 0
    if (m is not None and m.height) or nc:
        out.append(
            Finding(
                "missing_collective",
                "medium",
                "Some collectives could not be matched across ranks (a rank missed a call or the profiler windows differ); "
                "they are left out of wait figures.",
                0,
                {"misaligned": m.head(20).to_dicts() if m is not None else [], "non_causal_calls": nc},
                "Profile the same steps on every rank (same schedule), and check for ranks that skip a collective.",
            )
        )
    return out

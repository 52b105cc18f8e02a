"""Findings: the ranked bottleneck verdict, each with evidence, an estimated saving and a remedy.

Estimated savings (per step, ns) — deliberately simple, stated in each finding's evidence:

* exposed_comm: full overlap removes the exposed communication minus its barrier wait (the wait is
  the straggler's / imbalance's) of the worst rank (P50 over steps);
* straggler_wait: removing the straggler's lateness (last arrival - second-last arrival, summed
  over the calls it was last in), P50 over steps; reported only when the rank stands out (twice the
  next rank's P50 lateness, or last in at least half of the calls);
* routing_imbalance: max replaced by mean: the expert stage of the most loaded rank shrinks by
  (1 - 1/I_r);
* host_stall: the device idle time under blocking host calls of the worst rank (P50 over steps);
* small_message_latency: upper bound = calls per step x alpha of the class;
* bandwidth_bound: FP8 dispatch halves dispatch bytes: half the dispatch transfer time per step;
* pack_unpack_overhead: half of the permute + unpermute busy time of the worst rank per step
  (fused permute kernels);
* split_inconsistency / missing_collective: correctness findings, saving 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import polars as pl

from ep_trace.analysis.imbalance import run_aggregate
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["with_findings", "severity"]

_ORDER = {"high": 0, "medium": 1, "low": 2}


def severity(saving_ns: float, step_ns: float) -> str:
    """``high`` at >= 20 % of the step, ``medium`` at >= 5 %, else ``low``."""
    f = saving_ns / step_ns if step_ns > 0 else 0.0
    return "high" if f >= 0.2 else "medium" if f >= 0.05 else "low"


def _num(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else round(x, 4)
    return x


def with_findings(a: Analysis) -> Analysis:
    """Return ``a`` with its findings filled and ranked by estimated saving."""
    step_ns = float(cast(float, a.rank_summary["step_time_ns"].median()) or 0.0) if a.rank_summary.height else 0.0
    n_steps = max(int(a.steps["step"].n_unique()), 1) if a.steps.height else 1
    out: list[Finding] = []
    out += _exposed(a, step_ns)
    out += _straggler(a, step_ns, n_steps)
    out += _imbalance(a, step_ns)
    out += _stalls(a, step_ns, n_steps)
    out += _alpha_beta(a, step_ns, n_steps)
    out += _pack(a, step_ns)
    out += _correctness(a)
    out.sort(key=lambda f: (-f.est_saving_ns, _ORDER.get(f.severity, 3), f.kind))
    return dataclasses.replace(a, findings=tuple(out))


def _exposed(a: Analysis, step_ns: float) -> list[Finding]:
    # Overlap can only hide the transfer: the part of the exposed comm that is barrier wait belongs
    # to the straggler / imbalance findings, so it is taken out here (no double counting).
    per = a.steps.with_columns((pl.col("exposed_comm_ns") - pl.col("barrier_wait_ns")).clip(0).alias("_x"))
    x = per.group_by("rank").agg(pl.col("_x").median().round(0).cast(pl.Int64).alias("exposed_transfer_p50_ns"))
    rs = a.rank_summary.join(x, on="rank").filter(pl.col("exposed_comm_p50_ns") > 0)
    if rs.is_empty():
        return []
    w = rs.sort(["exposed_transfer_p50_ns", "exposed_comm_p50_ns"], descending=True).row(0, named=True)
    saving = int(w["exposed_transfer_p50_ns"])
    st = a.stages.filter(pl.col("exposed_comm_ns") > 0)
    n = max(int(a.steps["step"].n_unique()), 1)
    top = (
        st.group_by("stage")
        .agg((pl.col("exposed_comm_ns").sum() / n).round(0).cast(pl.Int64))
        .sort("exposed_comm_ns", descending=True)
        .head(3)
        if st.height
        else st
    )
    ev = {
        "rank": w["rank"],
        "exposed_comm_p50_ns": int(w["exposed_comm_p50_ns"]),
        "exposed_comm_mean_ns": int(w["exposed_comm_ns"]),
        "exposed_transfer_p50_ns": saving,
        "comm_ns_per_step": int(w["comm_ns"]),
        "overlap_efficiency": _num(float(w["overlap_efficiency"])),
        "step_time_ns": int(w["step_time_ns"]),
        "barrier_wait_ns_per_step": int(w["barrier_wait_ns"]),
        "worst_stages_ns_per_step_all_ranks": {r["stage"]: int(r["exposed_comm_ns"]) for r in top.iter_rows(named=True)}
        if top.height
        else {},
        "saving_rule": "full overlap hides the exposed comm minus its barrier wait, worst rank, P50 over steps",
    }
    remedy = (
        "Overlap the token all-to-all with compute: chunked dispatch-GEMM-combine pipelining (send chunk i+1 while the "
        "expert GEMM of chunk i runs), or overlap MoE comm with the attention/shared-expert of another micro-batch."
    )
    if w["barrier_wait_ns"] > 0.5 * w["exposed_comm_ns"]:  # both means per step
        remedy += " Most of this exposed time is barrier wait for a late rank: fix the straggler / imbalance first."
    layers = (
        tuple(sorted({int(v) for v in st.filter(pl.col("rank") == w["rank"])["layer"].drop_nulls()}))
        if st.height
        else ()
    )
    return [
        Finding(
            "exposed_comm",
            severity(saving, step_ns),
            f"Rank {w['rank']} spends {int(w['exposed_comm_p50_ns']) / 1e6:.3f} ms per step in communication not hidden by compute "
            f"(overlap efficiency {100 * (ev['overlap_efficiency'] or 0):.1f}%); {saving / 1e6:.3f} ms of it is transfer, not wait.",
            saving,
            ev,
            remedy,
            (int(w["rank"]),),
            layers,
        )
    ]


def _straggler(a: Analysis, step_ns: float, n_steps: int) -> list[Finding]:
    s = a.stragglers
    n_calls = int(a.calls.filter(pl.col("valid")).height) if a.calls.height else 0
    if s.is_empty() or n_calls == 0 or int(s["induced_wait_ns"][0]) <= 0:
        return []
    r = s.row(0, named=True)
    second = int(s["lateness_p50_ns"][1]) if s.height > 1 else 0
    # a straggler stands out: twice the next rank's typical lateness, or last in most calls
    if r["lateness_p50_ns"] <= 0 or (r["lateness_p50_ns"] < 2 * second and r["times_last"] < 0.5 * n_calls):
        return []
    saving = int(r["lateness_p50_ns"])
    wm = a.wait_matrix.filter(pl.col("waited_for") == r["rank"])
    ev = {
        "rank": r["rank"],
        "times_last": int(r["times_last"]),
        "matched_calls": n_calls,
        "induced_wait_ns": int(r["induced_wait_ns"]),
        "lateness_p50_ns_per_step": saving,
        "next_rank_lateness_p50_ns": second,
        "own_wait_ns": int(r["total_wait_ns"]),
        "waiting_ranks": {int(x["waiter"]): int(x["wait_ns"]) for x in wm.iter_rows(named=True)},
        "clock_uncertainty_ns": int(cast(int, a.clock["residual_ns"].max()) or 0) if a.clock.height else 0,
        "saving_rule": "P50 over steps of the straggler's lateness over the second-last arrival",
    }
    return [
        Finding(
            "straggler_wait",
            severity(saving, step_ns),
            f"Rank {r['rank']} arrives last at {r['times_last']} of {n_calls} matched collectives; the others wait "
            f"{r['induced_wait_ns'] / 1e6:.3f} ms in total for it.",
            saving,
            ev,
            f"Find why rank {r['rank']} is late before the collective: more tokens for its experts (re-place or replicate "
            "hot experts), a host stall, slower hardware or a noisy neighbour; its comm kernels are the shortest, "
            "so this is not the network.",
            (int(r["rank"]),),
        )
    ]


def _imbalance(a: Analysis, step_ns: float) -> list[Finding]:
    agg = run_aggregate(a.imbalance)
    ie, ir = agg["I_e"], agg["I_r"]
    if (ie is None or ie < 1.5) and (ir is None or ir < 1.1):
        return []
    saving = 0
    rl = a.rank_load
    exp = a.stages.filter(pl.col("stage") == "expert")
    if ir and exp.height and rl.height:
        per = exp.group_by(["rank", "step"]).agg(pl.col("busy_ns").sum()).group_by("rank").agg(pl.col("busy_ns").mean())
        saving = int(float(cast(float, per["busy_ns"].max())) * (1 - 1 / ir))
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
        "saving_rule": "max replaced by mean in the expert stage of the most loaded rank",
    }
    hot_txt = ", ".join(str(h["expert"]) for h in hot) or "the hottest experts"
    layers = tuple(sorted({int(x) for x in a.imbalance.filter(pl.col("I_r") >= 1.1)["layer"].drop_nulls()}))
    return [
        Finding(
            "routing_imbalance",
            severity(saving, step_ns) if saving else "medium",
            f"Routing is uneven: I_e = {ie or float('nan'):.2f}, I_r = {ir or float('nan'):.2f} (max/mean); the most loaded "
            "rank sets the pace of every dispatch and combine.",
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
    if hs.is_empty():
        return []
    steps = a.steps.select("rank", "step")
    per_step = steps.join(
        hs.group_by(["rank", "step"]).agg(pl.col("stall_ns").sum()), on=["rank", "step"], how="left"
    ).with_columns(pl.col("stall_ns").fill_null(0))
    per = (
        per_step.group_by("rank")
        .agg(pl.col("stall_ns").median().alias("p50"), pl.col("stall_ns").sum())
        .join(hs.group_by("rank").agg(pl.len().alias("n")), on="rank")
        .sort("p50", descending=True)
    )
    r = per.row(0, named=True)
    saving = int(r["p50"])
    names = (
        hs.filter(pl.col("rank") == r["rank"])
        .group_by("name")
        .agg(pl.col("stall_ns").sum())
        .sort("stall_ns", descending=True)
    )
    ev = {
        "rank": r["rank"],
        "stall_p50_ns_per_step": saving,
        "stall_ns_total": int(r["stall_ns"]),
        "calls": int(r["n"]),
        "by_call": {x["name"]: int(x["stall_ns"]) for x in names.head(5).iter_rows(named=True)},
        "by_stage": {
            str(x["stage"]): int(x["stall_ns"])
            for x in hs.group_by("stage").agg(pl.col("stall_ns").sum()).iter_rows(named=True)
        },
    }
    return [
        Finding(
            "host_stall",
            severity(saving, step_ns),
            f"Rank {r['rank']}'s device is idle {saving / 1e6:.3f} ms per step while the host blocks (count exchange / sync / .item()).",
            saving,
            ev,
            "Keep split sizes on the device: exchange counts with a device-side layout (DeepEP-style notify) or overlap the "
            "count all-to-all with permute; avoid .item()/cudaStreamSynchronize inside dispatch; use pinned non-blocking D2H.",
            (int(r["rank"]),),
        )
    ]


_LINK_WORDS = {
    "intra_host": "Intra-host collectives",
    "inter_host": "Inter-host collectives",
    "unknown": "Collectives (link class unknown: the traces name no hosts)",
}


def _alpha_beta(a: Analysis, step_ns: float, n_steps: int) -> list[Finding]:
    out = []
    vc = a.calls.filter(pl.col("valid")) if a.calls.height else a.calls
    for r in a.alpha_beta.iter_rows(named=True):
        cls_calls = vc.filter(pl.col("link_class") == r["link_class"])
        if r["verdict"] == "latency_bound":
            saving = int(cls_calls.height / n_steps * r["alpha_us"] * 1e3)
            out.append(
                Finding(
                    "small_message_latency",
                    severity(saving, step_ns),
                    f"{_LINK_WORDS.get(r['link_class'], r['link_class'] + ' collectives')} are latency-bound: alpha = {r['alpha_us']:.1f} µs dominates at the median "
                    f"message of {int(r['median_bytes'])} B.",
                    saving,
                    {
                        **{k: _num(v) for k, v in r.items()},
                        "calls_per_step": cls_calls.height / n_steps,
                        "saving_rule": "upper bound: calls per step x alpha",
                    },
                    "Use low-latency all-to-all kernels for small (decode) messages (e.g. DeepEP low-latency mode), fuse "
                    "the count exchange into the dispatch, or batch micro-batches to send fewer, larger messages.",
                )
            )
        elif r["verdict"] == "bandwidth_bound":
            disp = cls_calls.filter(pl.col("direction") == "dispatch")
            t = (
                float(disp["transfer_ns"].sum()) * 0.5
                if disp.height
                else float(cls_calls.filter(pl.col("collective").str.contains("all_to_all"))["transfer_ns"].sum())
                * 0.25
            )
            saving = int(t / n_steps)
            out.append(
                Finding(
                    "bandwidth_bound",
                    severity(saving, step_ns),
                    f"{_LINK_WORDS.get(r['link_class'], r['link_class'] + ' collectives')} are bandwidth-bound at {r['beta_gbps']:.2f} GB/s (r2 = {r['r2']:.2f}).",
                    saving,
                    {
                        **{k: _num(v) for k, v in r.items()},
                        "saving_rule": "FP8 dispatch halves dispatch bytes (half of all-to-all time when direction is unknown)",
                    },
                    "Dispatch in FP8, use hierarchical all-to-all (NVLink inside the node, one RDMA hop across), and "
                    "node-limited routing to cut cross-node bytes.",
                )
            )
    return out


def _pack(a: Analysis, step_ns: float) -> list[Finding]:
    st = a.stages.filter(pl.col("stage").is_in(["permute", "unpermute"]))
    if st.is_empty():
        return []
    per = (
        st.group_by(["rank", "step"])
        .agg(pl.col("busy_ns").sum())
        .group_by("rank")
        .agg(pl.col("busy_ns").mean())
        .sort("busy_ns", descending=True)
    )
    r = per.row(0, named=True)
    if step_ns <= 0 or r["busy_ns"] < 0.1 * step_ns:
        return []
    saving = int(0.5 * r["busy_ns"])
    return [
        Finding(
            "pack_unpack_overhead",
            severity(saving, step_ns),
            f"Permute + unpermute take {r['busy_ns'] / 1e6:.3f} ms per step on rank {r['rank']}.",
            saving,
            {
                "rank": r["rank"],
                "permute_unpermute_ns_per_step": int(r["busy_ns"]),
                "saving_rule": "half of it with fused kernels",
            },
            "Fuse permute/unpermute with the dispatch/combine (DeepEP-style) or use fused moe_align / scatter kernels.",
            (int(r["rank"]),),
        )
    ]


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

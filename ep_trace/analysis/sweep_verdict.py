"""The verdict of a sweep: which cause takes the largest share of one MoE layer at the operating point.

Rules in docs/sweep.md ("Verdict"); the remedies speak EP terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from ep_trace.analysis.linefit import significant
from ep_trace.analysis.sweep_runs import SweepRun, num, stage_at

__all__ = ["Verdict", "VERDICT_KINDS", "judge"]

VERDICT_KINDS: tuple[str, ...] = ("fixed_latency_bound", "bandwidth_bound", "expert_compute_bound", "imbalance_bound")

_REMEDY = {
    "fixed_latency_bound": (
        "A fixed cost per all-to-all pins the layer: fewer cross-node hops per all-to-all (a smaller EP "
        "group or node-limited routing, experts grouped or replicated so that most tokens stay inside a "
        "node, hierarchical all-to-all), low-latency all-to-all kernels for small messages, or more tokens "
        "per call (larger batches, fewer micro-batches) to amortise it. Buffer sizes, chunking and overlap "
        "tuning do not move a fixed latency."
    ),
    "bandwidth_bound": (
        "The all-to-alls grow with the bytes moved: send fewer bytes (FP8 dispatch halves them), keep "
        "traffic on the fast links (topology-aware expert placement, hierarchical all-to-all), and hide "
        "the rest under compute (chunked dispatch-GEMM-combine pipelining)."
    ),
    "expert_compute_bound": (
        "The expert GEMMs are the cost and communication is not the limit: make them efficient (grouped "
        "GEMM / fused MoE kernels, lower precision) or spread the experts over more ranks (a larger EP size) "
        "if the all-to-all cost stays small."
    ),
    "imbalance_bound": (
        "The most loaded rank sets the layer time: re-place or replicate the hot experts (EPLB-style "
        "placement), or balance the router (auxiliary-loss-free bias, capacity factor)."
    ),
}


@dataclass(frozen=True)
class Verdict:
    """The sweep's verdict: ``kind`` (:data:`VERDICT_KINDS`), the numbers behind it, the remedy in EP terms."""

    kind: str
    evidence: Mapping[str, Any]
    remedy: str
    title: str = ""


#: Knobs that scale the bytes one all-to-all moves (their fit's intercept is the zero-message cost).
_WORK_KNOBS = ("tokens", "hidden", "top_k")
#: Smallest max/min ratio of bytes per call over the runs for a fit against bytes to split α from β.
_MIN_BYTES_RANGE = 2.0


def _bytes_range(runs: Sequence[SweepRun], stage: str) -> float:
    vals = [stage_at(r, stage, "bytes") for r in runs]
    b = [v for v in vals if v]
    return max(b) / min(b) if len(b) >= 2 and min(b) > 0 else 0.0


def judge(runs: Sequence[SweepRun], xs: Sequence[float | None], fits: pl.DataFrame, knob: str,
             thr: Mapping[str, Any]) -> tuple[Verdict | None, str]:  # fmt: skip
    valid = [(r, x) for r, x in zip(runs, xs, strict=True) if x is not None]
    if len({x for _, x in valid}) < 2:
        return None, "fewer than 2 distinct knob values"
    op, x_op = max(valid, key=lambda p: p[1])  # type: ignore[arg-type,return-value]
    alphas: dict[str, Any] = {}
    latency = bandwidth = comm_imbalance = 0.0
    splittable = True
    for stage in ("dispatch", "combine"):
        f = fits.filter((pl.col("stage") == stage) & pl.col("layer").is_null())
        by_bytes, by_knob = f.filter(pl.col("x") == "bytes"), f.filter(pl.col("x") == knob)
        use = by_bytes if by_bytes.height and _bytes_range(runs, stage) >= _MIN_BYTES_RANGE else None
        if use is None and knob in _WORK_KNOBS and by_knob.height:
            use = by_knob  # the knob scales the bytes moved: its intercept is the zero-message cost
        measured = stage_at(op, stage) or 0.0
        if use is None or use.height == 0:
            splittable = False
            continue
        row = use.row(0, named=True)
        # the fixed latency counts only when α is > 0 at the 95 % level: a flat, noisy all-to-all time
        # (r² ~ 0) has an intercept, but no resolved fixed cost; the rest of the call is its per-byte part
        a_sig = significant(row["alpha_ns"], row["alpha_se_ns"], row["n"])
        b_sig = significant(row["beta_ns_per_unit"], row["beta_se_ns_per_unit"], row["n"])
        a = min(max(row["alpha_ns"], 0.0), measured) if a_sig else 0.0
        b = measured - a
        # the bytes above the ranks' mean (the most loaded rank moves more rows) are routing imbalance:
        # balanced routing would give every rank the mean
        bmax, bmean = stage_at(op, stage, "bytes"), stage_at(op, stage, "bytes_mean")
        excess = b * (1.0 - bmean / bmax) if b and bmax and bmean and bmean < bmax else 0.0
        latency, bandwidth = latency + a, bandwidth + b - excess
        comm_imbalance += excess
        alphas[stage] = {"alpha_ns": row["alpha_ns"], "x": row["x"], "r2": row["r2"], "n": row["n"],
                         "alpha_ci95_lo_ns": row["alpha_ci95_lo_ns"], "alpha_per_a2a_ns": row["alpha_per_a2a_ns"],
                         "alpha_significant": a_sig, "beta_significant": b_sig, "used_ns": a}  # fmt: skip
    comm = (stage_at(op, "dispatch") or 0.0) + (stage_at(op, "combine") or 0.0)
    e_max = stage_at(op, "expert") or 0.0
    e_mean = stage_at(op, "expert", "t_mean_ns") or 0.0
    layer = stage_at(op, "moe_layer") or (comm + e_max)
    parts: dict[str, float | None] = {
        "fixed_latency_bound": latency,
        "bandwidth_bound": bandwidth,
        "expert_compute_bound": e_mean,
        "imbalance_bound": max(e_max - e_mean, 0.0) + comm_imbalance,
    }
    resolved = max(e_mean, e_max - e_mean + comm_imbalance)
    if not splittable:
        # the knob does not change the bytes moved (chunks, ep_size, ...): α and β cannot be told apart,
        # so the all-to-all time is one part; no verdict when it is the largest
        parts["fixed_latency_bound"] = parts["bandwidth_bound"] = None
        if comm >= resolved:
            return None, (
                f"{knob} does not change the bytes an all-to-all moves, so its fixed latency and its bandwidth "
                "cannot be told apart, and the all-to-alls are the largest part of the layer; sweep tokens "
                "(or hidden, top_k) to split them"
            )
    kind = max((k for k in parts if parts[k] is not None), key=lambda k: parts[k] or 0.0)
    shares = {k: (v / layer if layer and v is not None else None) for k, v in parts.items()}
    other = max(layer - comm - e_max, 0.0)  # route / permute / unpermute, host gaps
    comm_r2 = [v["r2"] for v in alphas.values() if v.get("r2") is not None]
    confidence = "low" if not comm_r2 or min(comm_r2) < 0.8 else ("high" if min(comm_r2) >= 0.9 else "medium")
    i_r = [(r.label, num(r.figures.get("I_r"))) for r, _ in valid]
    evidence = {
        "operating_point": {"label": op.label, knob: x_op},
        "layer_time_ns": layer,
        "shares": shares,
        "parts_ns": parts,
        "other_ns": other,
        "other_share": other / layer if layer else None,
        "comm_fits": alphas,
        "comm_ns": comm,
        "expert_imbalance_ns": max(e_max - e_mean, 0.0),
        "comm_imbalance_ns": comm_imbalance,
        "latency_split": splittable,
        "fit_confidence": confidence,
        "I_r": {lbl: v for lbl, v in i_r},
        "exposed_comm_ratio": {r.label: num(r.figures.get("exposed_comm_ratio")) for r, _ in valid},
        "throughput_monotonic": thr.get("monotonic"),
    }
    pct = shares[kind]
    names = {
        "fixed_latency_bound": "the fixed per-call latency of the all-to-alls (α of dispatch + combine)",
        "bandwidth_bound": "the bytes-proportional part of the all-to-alls",
        "expert_compute_bound": "the expert GEMMs (mean over ranks)",
        "imbalance_bound": "the excess of the most loaded rank's expert work over the mean",
    }
    title = (
        f"At {knob} = {x_op:g} ({op.label}), {names[kind]} takes "
        + (f"{pct:.0%}" if pct is not None else "the largest part")
        + " of an MoE layer"
    )
    return Verdict(kind, evidence, _REMEDY[kind], title), ""

"""Shared helpers of the finding rules: severity, 3-significant-digit durations, the what-if rows a
finding takes its saving from, and the trace facts the hygiene rules test (EP traffic, measurable waits)."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ep_trace.analysis.result import Analysis

__all__ = [
    "severity",
    "fmt_ns",
    "rank_list",
    "num",
    "wf",
    "wf_ev",
    "MOE_STAGES",
    "has_ep_traffic",
    "has_expert_load",
    "rank_modes",
    "dominant_collective",
    "waits_measurable",
]


def severity(saving_ns: float, step_ns: float) -> str:
    """``high`` at >= 20 % of the step, ``medium`` at >= 5 %, else ``low``."""
    f = saving_ns / step_ns if step_ns > 0 else 0.0
    return "high" if f >= 0.2 else "medium" if f >= 0.05 else "low"


def num(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else round(x, 4)
    return x


def fmt_ns(ns: float) -> str:
    """A duration with 3 significant digits and a unit: ``2.45 s``, ``245 ms``, ``24.5 ms``, ``2.45 µs``."""
    v = float(ns)
    units = (("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9))
    i = 0
    while i < 3 and abs(v) >= units[i + 1][1]:
        i += 1
    while True:
        x = v / units[i][1]
        d = 0 if abs(x) >= 100 or i == 0 else 1 if abs(x) >= 10 else 2
        txt = f"{x:.{d}f}"
        if abs(float(txt)) < 1000 or i == 3:  # 999.7 ms prints as 1.00 s, not 1000 ms
            return f"{txt} {units[i][0]}"
        i += 1


def wf(a: Analysis, scenario: str) -> dict[str, Any] | None:
    """The what-if row of ``scenario`` (None when absent: not applicable to this trace)."""
    w = a.whatif
    if w is None or w.is_empty():
        return None
    r = w.filter(pl.col("scenario") == scenario)
    return r.row(0, named=True) if r.height else None


def wf_ev(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "scenario": r["scenario"],
        "predicted_step_ns": int(r["predicted_step_ns"]),
        "saving_ns": int(r["saving_ns"]),
        "ranks": [int(x) for x in r["ranks"]],
        **({"chunks": int(r["chunks"])} if r.get("chunks") is not None else {}),
    }


#: Stages only an MoE layer has. ``all_to_all`` (the plain-PyTorch collective stage) is not one, nor
#: ``route``: the PyTorch sort / top-k kernel families make route rows wherever a model sorts
#: (``../shared/external/kineto/param_dlrm_8rank``, a DLRM with TorchRec embedding all-to-alls, has 8
#: route rows from ``DeviceRadixSort`` kernels and no MoE).
MOE_STAGES = ("permute", "dispatch", "expert", "shared_expert", "combine", "unpermute")


#: Names of a training step: autograd's backward ops (``autograd::engine::evaluate_function:
#: MmBackward0``, ``MmBackward0``), backward kernels (``..._bwd_kernel``, ``..._backward_...``), the
#: optimizer (``Optimizer.step#AdamW.step``, ``Optimizer.zero_grad#...``; fused optimizer kernels, which
#: an Nsight trace without NVTX still names: ``multi_tensor_apply_kernel<...>``, ``FusedAdam...``; the
#: AMP grad scaler's ``_amp_foreach_non_finite_check_and_unscale_``) and the data-parallel wrappers'
#: gradient hooks (``DistributedDataParallel.forward``, FSDP's ``FullyShardedDataParallel``, FSDP2's
#: ``RegisterPostBackwardFunction``).
_TRAINING = (
    r"(?i)backward|autograd::engine|optimizer\.|_bwd|distributeddataparallel|fullyshardeddataparallel"
    r"|multi_tensor_apply|adam|accumulategrad|non_finite_check_and_unscale"
)


def is_training(a: Analysis) -> bool:
    """The trace holds a backward pass or an optimizer step (else it is inference: a serving engine's
    forward passes, whose all-reduces are tensor-parallel activations, not gradients)."""
    # the events may stay on disk (TraceTables.events_scan): one pass over the distinct names
    names = a.tables.scan_events().select(pl.col("name").unique())
    return bool(names.select(pl.col("name").str.contains(_TRAINING).any()).collect().item())


def has_ep_traffic(a: Analysis) -> bool:
    """The trace holds expert-parallel token all-to-all traffic: an all-to-all with MoE evidence.

    An all-to-all alone is not EP: sequence / context parallelism (DeepSpeed-Ulysses, the FastVideo
    ``AllToAll4D`` of ``../shared/external/nsys/nsys_ai_2gpu``) moves activations by even all-to-alls
    too. The evidence is one of: an ``all_to_allv`` (uneven splits: PyTorch's ProcessGroupNCCL /
    Gloo record ``all_to_allv`` only when split sizes are given; the EP kernels of DeepEP, pplx, MORI
    and TensorRT-LLM are typed so), routing counts (``rank_load``), or an MoE stage (:data:`MOE_STAGES`,
    from ep-trace, framework ranges or kernel families). Without an all-to-all: all-gather /
    reduce-scatter calls that are the dispatch / combine stage of an MoE layer (vLLM's default
    ``allgather_reducescatter`` backend, ``AgRsAll2AllManager`` in
    vllm/distributed/device_communicators/all2all.py), or the all-reduce that combines a
    tensor-parallel MoE layer's output (:mod:`ep_trace.analysis.stage_families`).
    """
    if a.calls.is_empty():
        return False
    coll = a.calls.get_column("collective")
    a2a = coll.filter(coll.str.starts_with("all_to_all"))
    if a2a.is_empty():
        # vLLM's default EP backend moves the tokens by all-gather (dispatch) and reduce-scatter
        # (combine): EP traffic when those calls are a dispatch / combine stage of an MoE layer
        # (PyNccl runs the uneven-size ones as grouped broadcasts / reduces: typed broadcast / unknown)
        if bool(a.calls.get_column("direction").is_in(["dispatch", "combine"]).any()):
            return True
        gs = coll.is_in(["allgather", "reduce_scatter", "broadcast"]).any()
        st = a.stages.filter(pl.col("stage").is_in(["dispatch", "combine"]) & (pl.col("comm_ns") > 0))
        return bool(gs and st.height)
    if (a2a == "all_to_allv").any() or has_expert_load(a):
        return True
    return bool(a.stages.get_column("stage").is_in(MOE_STAGES).any())


def has_expert_load(a: Analysis) -> bool:
    """Routing counts are known (exact counts or split lists), so lateness can be weighed against load."""
    return bool(a.rank_load.height)


def rank_modes(a: Analysis) -> dict[int, str]:
    """``rank -> 'gpu' | 'cpu'`` from ``rank_summary.mode`` (empty when the column is absent)."""
    rs = a.rank_summary
    if rs.height == 0 or "mode" not in rs.columns:
        return {}
    return {int(r): str(m) for r, m in zip(rs["rank"], rs["mode"], strict=True)}


def dominant_collective(a: Analysis) -> str | None:
    """The collective type with the most wait-free transfer time over the matched calls (None without calls)."""
    c = a.calls
    if c.is_empty():
        return None
    g = (
        c.group_by("collective")
        .agg(pl.col("transfer_ns").fill_null(0).sum().alias("_t"), pl.len().alias("_n"))
        .sort(["_t", "_n", "collective"], descending=[True, True, False])
    )
    return str(g["collective"][0])


def waits_measurable(a: Analysis) -> bool:
    """Every matched call has all ranks of its group in the trace set (else wait is unmeasurable)."""
    c = a.calls
    return bool(c.height) and bool(c.filter(pl.col("n_ranks") > 1)["complete"].all()) if c.height else False


def rank_list(ranks: list[int], limit: int = 8) -> str:
    """``0, 1, 2`` or ``0, 1, ... (+N more)`` beyond ``limit`` ranks (notes, table cells)."""
    head = ", ".join(str(r) for r in ranks[:limit])
    return head if len(ranks) <= limit else f"{head} ... (+{len(ranks) - limit} more)"

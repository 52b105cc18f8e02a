"""Communication findings: exposed communication (simulated overlap / pipelining / fewer bytes) and the
alpha-beta fit findings (latency-bound, bandwidth-bound)."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ep_trace.analysis.finding_common import (
    dominant_collective,
    fmt_ns,
    has_ep_traffic,
    is_training,
    severity,
    waits_measurable,
)
from ep_trace.analysis.finding_common import num as _num
from ep_trace.analysis.finding_common import wf as _wf
from ep_trace.analysis.finding_common import wf_ev as _wf_ev
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["exposed", "alpha_beta", "fit_conclusive", "MIN_FIT_CALLS", "MIN_FIT_R2"]

MIN_FIT_CALLS = 8  # calls in an alpha-beta fit before it may make a finding
MIN_FIT_R2 = 0.8  # and its r2


def exposed(a: Analysis, step_ns: float) -> list[Finding]:
    ep = has_ep_traffic(a)
    chunk = _wf(a, "chunked_pipeline") if ep else None
    r = chunk if chunk is not None and int(chunk["saving_ns"]) > 0 else _wf(a, "full_overlap") or chunk
    # overlap cannot help where the transfer has no resource of its own (a gloo rank without a spare
    # core, analysis.resources): then the remedy is fewer bytes, if halving them saves anything
    fewer = _wf(a, "fp8_dispatch") if ep else None
    full = _wf(a, "full_overlap")
    overlap_helps = any(x is not None and int(x["saving_ns"]) > 0 for x in (r, full))
    if not overlap_helps and fewer is not None and int(fewer["saving_ns"]) > 0:
        r = fewer
    rs = a.rank_summary.filter(pl.col("exposed_comm_p50_ns") > 0)
    if r is None or rs.is_empty():
        return []
    saving = int(r["saving_ns"])
    w = rs.sort(["exposed_comm_ns", "rank"], descending=[True, False]).row(0, named=True)
    bound = _wf(a, "full_overlap")
    measurable = waits_measurable(a)
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
    wait, exp = int(w["barrier_wait_ns"]), int(w["exposed_comm_ns"])
    ev = {
        "rank": w["rank"],
        "exposed_comm_mean_ns": exp,
        "exposed_comm_p50_ns": int(w["exposed_comm_p50_ns"]),
        "comm_ns_per_step": int(w["comm_ns"]),
        "overlap_efficiency": _num(float(w["overlap_efficiency"])),
        "step_time_ns": int(w["step_time_ns"]),
        "barrier_wait_ns_per_step": wait if measurable else None,
        "worst_stages_ns_per_step_all_ranks": {x["stage"]: int(x["exposed_comm_ns"]) for x in top.iter_rows(named=True)}
        if top.height
        else {},
        "whatif": _wf_ev(r),
        "bound_full_overlap": _wf_ev(bound) if bound else None,
        "saving_rule": f"simulated what-if {r['scenario']} on the step graph",
    }
    if ep:
        remedy = (
            "Overlap the token all-to-all with compute: chunked dispatch-GEMM-combine pipelining (send chunk i+1 while "
            "the expert GEMM of chunk i runs), or overlap MoE comm with the attention/shared-expert of another micro-batch."
        )
        how = {
            "chunked_pipeline": f"pipelining dispatch / experts / combine over {r.get('chunks')} chunks",
            "fp8_dispatch": "overlap cannot hide it on these ranks (no spare core for the transfer); "
            "dispatching half the bytes (FP8)",
        }.get(r["scenario"], "full overlap")
        if r["scenario"] == "fp8_dispatch":
            remedy = (
                "Send fewer bytes: dispatch in FP8 (or another compact format), deduplicate tokens bound for the same "
                "rank, and route node-limited. Overlap needs a free resource for the transfer: on CPU (gloo) ranks a "
                "core per rank beyond the compute thread."
            )
        if _combine_is_allreduce(a):
            # TP MoE, or EP over the TP ranks without an all-to-all backend: DefaultMoERunner.forward
            # (vLLM) / DeepseekV2MoE.forward_normal (SGLang) all-reduce the experts' partial outputs.
            # vLLM's pass flag is fuse_allreduce_rms in vllm/config/compilation.py (PassConfig; older
            # releases: enable_fi_allreduce_fusion)
            remedy = (
                "The combine is an all-reduce of all tokens (TP, or EP with no all-to-all "
                "backend). Fuse it with the next RMSNorm (vLLM "
                "-cc.pass_config.fuse_allreduce_rms=True, SGLang --enable-flashinfer-allreduce-fusion), or run "
                "attention data-parallel with a DeepEP all-to-all (vLLM --data-parallel-size "
                "--enable-expert-parallel --all2all-backend deepep_low_latency; SGLang --enable-dp-attention "
                "--moe-a2a-backend deepep)."
            )
        elif not (dominant_collective(a) or "").startswith("all_to_all"):
            # vLLM's allgather_reducescatter backend (its default): every rank receives every token
            remedy = (
                "The dispatch is an all-gather and the combine a reduce-scatter (vLLM's default EP backend): every "
                "rank gets every token, not only those routed to its experts. An all-to-all backend sends each token "
                "to its experts' ranks only (vLLM --all2all-backend deepep_high_throughput for prefill, "
                "deepep_low_latency for decode); then overlap it with compute (--enable-dbo)."
            )
    elif (dominant_collective(a) or "").startswith("all_to_all"):
        # all-to-alls without MoE evidence (has_ep_traffic): sequence / context parallelism's activations
        remedy = (
            "Overlap the all-to-alls with independent compute: embedding all-to-alls with the dense work of another "
            "batch (TorchRec's TrainPipelineSparseDist), sequence-parallel ones with the attention of another head "
            "group or micro-batch (DeepSpeed-Ulysses); keep them off the compute stream; no MoE routing or expert "
            "stage was found, so they are not treated as EP token traffic."
        )
        how = "full overlap"
    elif is_training(a):
        remedy = (
            "Overlap the collectives with compute: launch gradient all-reduces as buckets become ready (DDP/FSDP bucket "
            "size, bucket_cap_mb), prefetch all-gathers, and keep the comm stream free of host syncs."
        )
        how = "full overlap"
    else:
        # inference: tensor-parallel activation all-reduces. vLLM PassConfig (vllm/config/compilation.py):
        # fuse_gemm_comms "Enable async TP", fuse_allreduce_rms "Enable flashinfer allreduce fusion"
        remedy = (
            "No backward pass: these are tensor-parallel activation collectives. Overlap them with the GEMMs next to "
            "them (async TP: vLLM -cc.pass_config.fuse_gemm_comms=True with sequence parallelism), fuse each "
            "all-reduce with the next RMSNorm (vLLM -cc.pass_config.fuse_allreduce_rms=True, SGLang "
            "--enable-flashinfer-allreduce-fusion), keep the custom all-reduce on, or use fewer tensor-parallel ranks."
        )
        how = "full overlap"
    mostly_wait = measurable and wait > 0.5 * exp
    if mostly_wait:
        remedy += " Most of this exposed time is barrier wait for a late rank: fix the straggler" + (
            " / imbalance first." if ep else " first."
        )
    split = (
        ""
        if not measurable
        else (
            f"; {fmt_ns(wait)} of it is waiting for a late rank"
            if mostly_wait
            else f"; {fmt_ns(max(exp - wait, 0))} of it is transfer, not wait"
        )
    )
    layers = (
        tuple(sorted({int(v) for v in st.filter(pl.col("rank") == w["rank"])["layer"].drop_nulls()}))
        if st.height
        else ()
    )
    return [
        Finding(
            "exposed_comm",
            severity(saving, step_ns),
            f"Rank {w['rank']} spends {fmt_ns(exp)} per step in communication not hidden by compute{split}; "
            f"{how} would save {fmt_ns(saving)} per step (simulated).",
            saving,
            ev,
            remedy,
            (int(w["rank"]),),
            layers,
        )
    ]


_LINK_WORDS = {
    "intra_host": "Intra-host collectives",
    "inter_host": "Inter-host collectives",
    "unknown": "Collectives (link class unknown: the traces name no hosts)",
}


def _combine_is_allreduce(a: Analysis) -> bool:
    """The MoE combine calls are all-reduces and no call is a dispatch (tokens are not moved, only the
    experts' partial outputs summed)."""
    d = a.calls.filter(pl.col("direction").is_in(["dispatch", "combine"]))
    comb = d.filter(pl.col("direction") == "combine")
    return bool(comb.height and (comb["collective"] == "allreduce").all() and comb.height == d.height)


def fit_conclusive(r: dict[str, Any]) -> bool:
    """An alpha-beta fit may make a finding: enough calls and r2 >= :data:`MIN_FIT_R2`."""
    r2 = r.get("r2")
    n = r.get("n") or 0
    return r2 is not None and not math.isnan(float(r2)) and float(r2) >= MIN_FIT_R2 and int(n) >= MIN_FIT_CALLS


def alpha_beta(a: Analysis, step_ns: float, n_steps: int) -> list[Finding]:
    out = []
    vc = a.calls.filter(pl.col("valid")) if a.calls.height else a.calls
    ep = has_ep_traffic(a)
    training: bool | None = None  # is_training scans every event name: once, and only if a remedy needs it
    for r in a.alpha_beta.iter_rows(named=True):
        if not fit_conclusive(r):
            continue  # shown as inconclusive in the summary's alpha_beta table, no finding
        cls_calls = vc.filter(pl.col("link_class") == r["link_class"])
        words = _LINK_WORDS.get(r["link_class"], r["link_class"] + " collectives")
        if r["verdict"] == "latency_bound":
            saving = int(cls_calls.height / n_steps * r["alpha_us"] * 1e3)
            if not ep and training is None:
                training = is_training(a)
            out.append(
                Finding(
                    "small_message_latency",
                    severity(saving, step_ns),
                    f"{words} are latency-bound: alpha = {fmt_ns(r['alpha_us'] * 1e3)} dominates at the median message of "
                    f"{int(r['median_bytes'])} B (fit r2 = {r['r2']:.2f} over {r['n']} calls).",
                    saving,
                    {
                        **{k: _num(v) for k, v in r.items()},
                        "calls_per_step": cls_calls.height / n_steps,
                        "saving_rule": "upper bound: calls per step x alpha (not simulated)",
                    },
                    "Use low-latency all-to-all kernels for small (decode) messages (e.g. DeepEP low-latency mode), fuse "
                    "the count exchange into the dispatch, or batch micro-batches to send fewer, larger messages."
                    if ep
                    else "Send fewer, larger messages: bucket small all-reduces together (larger DDP buckets) and fuse "
                    "small collectives."
                    if training
                    else "Use a one-shot all-reduce for small messages (the custom all-reduce of vLLM / SGLang, or "
                    "NCCL's LL protocol), fuse each with the next RMSNorm, and capture the step in a CUDA graph.",
                )
            )
        elif r["verdict"] == "bandwidth_bound" and ep:
            wf = _wf(a, "fp8_dispatch")
            if wf is None or int(wf["saving_ns"]) <= 0:
                continue
            saving = int(wf["saving_ns"])
            out.append(
                Finding(
                    "bandwidth_bound",
                    severity(saving, step_ns),
                    f"{words} are bandwidth-bound at {r['beta_gbps']:.3g} GB/s (r2 = {r['r2']:.2f}); FP8 dispatch saves "
                    f"{fmt_ns(saving)} per step (simulated).",
                    saving,
                    {
                        **{k: _num(v) for k, v in r.items()},
                        "whatif": _wf_ev(wf),
                        "saving_rule": "simulated: dispatch transfers halved",
                    },
                    "Dispatch in FP8, use hierarchical all-to-all (NVLink inside the node, one RDMA hop across), and "
                    "node-limited routing to cut cross-node bytes.",
                )
            )
    return out

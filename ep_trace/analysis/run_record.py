"""The run record: the fields an EP investigation keeps about one run (docs/run_record.md).

Built from an :class:`Analysis` (plus the sidecar's optional ``workload`` object, passed in), pure:
the CLI writes it as YAML (``ep-trace analyze --record run.yaml``, one per run in ``ep-trace sweep``).
A field the traces cannot give is None (YAML ``null``), never guessed: no trace records the
interconnect, the tensor-parallel size, or whether a forward pass was prefill or decode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl

from ep_trace.analysis.run_facts import run_knobs, stage_times, step_figures
from ep_trace.analysis.stage_families import family_label_expr
from ep_trace.comm_classifier import comm_family_expr
from ep_trace.knowledge import range_presets

if TYPE_CHECKING:
    from ep_trace.analysis.result import Analysis

__all__ = ["RECORD_SCHEMA_VERSION", "run_record", "kernel_family"]

#: Version of the record layout (docs/run_record.md).
RECORD_SCHEMA_VERSION = 1

#: Communication families, most specific first: the one a run record names when several are seen
#: (a DeepEP job also launches NCCL kernels). Families and kernel names: the knowledge table
#: (ep_trace/families.toml, :mod:`ep_trace.comm_classifier`).
_PREFERENCE = ("deepep", "pplx", "mori", "trtllm_moe_a2a", "nvshmem", "msccl", "rccl", "nccl")
#: Stages of the kernel rows whose kernels are a fused / grouped expert path (the ``expert`` rows:
#: fused_moe_kernel, trtllm-gen bmm, CUTLASS / DeepGEMM grouped GEMMs, aiter fmoe, matmul_ogs, ...).
_FUSED_STAGE = "expert"


def kernel_family(a: Analysis) -> str | None:
    """The all-to-all implementation seen: a kernel family on GPU ranks, else the CPU backend (``gloo``)."""
    ev = a.tables.scan_events()  # the events may stay on disk (TraceTables.events_scan)
    k = ev.filter((pl.col("kind") == "gpu_kernel") & pl.col("coll_id").is_not_null()).select(pl.col("name").unique())
    seen = set(k.collect().select(comm_family_expr(pl.col("name"))).to_series().drop_nulls().to_list())
    for fam in (*_PREFERENCE, *sorted(seen)):
        if fam in seen:
            return fam
    coll = a.tables.collectives
    b = coll["backend"].drop_nulls() if coll.height else pl.Series([], dtype=pl.Utf8)
    if b.len():
        return str(b.mode().sort()[0])
    rb = a.tables.ranks["backend"].drop_nulls() if a.tables.ranks.height else b
    return str(rb[0]) if rb.len() else None


def _fused_moe(a: Analysis) -> bool | None:
    ev = a.tables.scan_events()
    kernels = ev.filter(pl.col("kind") == "gpu_kernel").select(pl.col("name").unique()).collect()
    ops = ev.filter(pl.col("kind") == "cpu_op").select(pl.col("name").unique()).collect()["name"]
    fused = kernels.filter(family_label_expr(pl.col("name")) == _FUSED_STAGE).height > 0
    containers = [p["pattern"] for p in range_presets() if p["kind"] == "container"]
    if fused or any(ops.str.contains(rx).any() for rx in containers):
        return True
    st = a.stages
    if st.height and {"dispatch", "expert", "combine"} <= set(st["stage"].unique().to_list()):
        return False  # separate dispatch / expert / combine stages: an unfused data path
    return None


def _hardware(a: Analysis) -> dict[str, Any]:
    r = a.tables.ranks
    hosts = r["host"].drop_nulls().n_unique() if r.height else 0
    dev = r.select("host", "device").drop_nulls()
    gpus = None
    if dev.height:
        cuda = dev.filter(pl.col("device").str.starts_with("cuda"))
        per_host = cuda.group_by("host").agg(pl.col("device").n_unique())["device"]
        gpus = int(per_host.max() or 0) if cuda.height else 0  # type: ignore[arg-type]
    device = None if not dev.height else ("gpu" if gpus else "cpu")
    modes = set(a.rank_summary["mode"].to_list()) if a.rank_summary.height else set()
    if device is None and len(modes) == 1:
        device = modes.pop()  # 'gpu' when the ranks have kernels, 'cpu' when gloo ranks only
    return {
        "ranks": r.height,
        "hosts": hosts or None,
        "gpus_per_host": gpus,
        "device": device,
        "interconnect": None,  # not in Kineto / Nsight traces
    }


def _hops(a: Analysis) -> int | None:
    """Cross-node hops per all-to-all: 0 when the EP group is on one host, 1 when it spans hosts (flat)."""
    r = a.tables.ranks
    if r.height == 0 or r["host"].null_count():
        return None
    groups = r["ep_group_ranks"].drop_nulls()
    members = set(groups[0].to_list()) if groups.len() else set(r["rank"].to_list())
    hosts = r.filter(pl.col("rank").is_in(list(members)))["host"].n_unique()
    return 0 if hosts <= 1 else 1


def _top_finding(a: Analysis) -> dict[str, Any] | None:
    if not a.findings:
        return None
    f = a.findings[0]
    return {"kind": f.kind, "severity": f.severity, "title": f.title, "est_saving_ns": int(f.est_saving_ns)}


def _at(times: pl.DataFrame, stage: str, col: str = "t_ns") -> float | None:
    sel = times.filter((pl.col("stage") == stage) & pl.col("layer").is_null())
    v = sel[col][0] if sel.height else None
    return None if v is None else float(v)


def run_record(
    a: Analysis, label: str = "", sources: Sequence[str] = (), workload: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The run record of one analysed run (docs/run_record.md).

    Args:
        a: The run.
        label: Its name.
        sources: The trace directories / files it was read from.
        workload: The sidecar ``meta.workload`` object, when present.

    Returns:
        A JSON / YAML-ready nested dict; unknown fields are None.
    """
    from ep_trace.analysis.summary import _clean

    wl = dict(workload or {})
    knobs = run_knobs(a, wl)
    times = stage_times(a)
    fig = step_figures(a, knobs["tokens"])
    st = a.stages
    phase = wl.get("phase")
    if phase is None and st.height and (st["phase"] == "bwd").any():
        phase = "training"  # backward stage ranges: a training step (prefill / decode are inference phases)
    coll = a.tables.collectives
    a2a_ops = sorted(
        coll.filter(pl.col("collective").is_in(["all_to_all", "all_to_allv"]))["op_name"].unique().to_list()
    )
    top = _top_finding(a)
    rs = a.rank_summary
    ov = rs["overlap_efficiency"].fill_nan(None).drop_nulls() if rs.height else pl.Series([], dtype=pl.Float64)
    holds_for = {k: knobs.get(k) for k in ("tokens", "top_k", "hidden", "ep_size", "dtype", "chunks")}
    holds_for.update({k: wl.get(k) for k in ("skew", "straggler", "link_latency_ms") if k in wl})
    record = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "run": {"label": label, "sources": list(sources), "job_id": _job_id(a), "steps": _steps(a)},
        "model": {
            "experts": knobs["experts"],
            "top_k": knobs["top_k"],
            "hidden": knobs["hidden"],
            "dtype": knobs["dtype"],
            "moe_layers": knobs["moe_layers"],
        },
        "hardware": _hardware(a),
        "parallelism": {
            "ep_size": knobs["ep_size"],
            "tp_size": None,  # not in the traces
            "cross_node_hops_per_a2a": _hops(a),
        },
        "path": {
            "a2a_backend": _backend(a),
            "kernel_family": kernel_family(a),
            "a2a_ops": a2a_ops,
            "fused_moe": _fused_moe(a),
            "stage_detection": a.detection_method,
        },
        "workload": {
            "tokens_per_rank": knobs["tokens"],
            "tokens_per_step": fig["tokens_per_step"],
            "batch": None,  # tokens are not grouped into sequences in the traces
            "phase": phase,
            "chunks": knobs["chunks"],
            "skew": wl.get("skew"),
            "straggler": wl.get("straggler"),
            "link_latency_ms": wl.get("link_latency_ms"),
            "name": wl.get("name"),
        },
        "performance": {
            "step_time_ns": fig["step_time_ns"],
            "step_time_p25_ns": fig["step_p25_ns"],
            "step_time_p75_ns": fig["step_p75_ns"],
            "tokens_per_s": fig["tokens_per_s"],
            "moe_layer_ns": _at(times, "moe_layer"),
        },
        "communication": {
            "dispatch_ns_per_layer": _at(times, "dispatch"),
            "combine_ns_per_layer": _at(times, "combine"),
            "a2a_calls_per_layer": _sum_opt(_at(times, "dispatch", "a2a_calls"), _at(times, "combine", "a2a_calls")),
            "dispatch_bytes_per_layer": _at(times, "dispatch", "bytes"),
            "exposed_comm_ratio": fig["exposed_comm_ratio"],
            "overlap_efficiency_min": float(ov.min()) if ov.len() else None,  # type: ignore[arg-type]
            "I_r": fig["I_r"],
        },
        "status": {
            "verdict": top,
            "holds_for": holds_for,
            "detection_method": a.detection_method,
            "load_issues": len(a.load_report),
        },
    }
    return _clean(record)


def _sum_opt(x: float | None, y: float | None) -> float | None:
    return None if x is None and y is None else (x or 0.0) + (y or 0.0)


def _job_id(a: Analysis) -> str | None:
    j = a.tables.ranks["job_id"].drop_nulls() if a.tables.ranks.height else None
    return str(j[0]) if j is not None and j.len() else None


def _steps(a: Analysis) -> list[int]:
    return sorted(int(s) for s in a.steps["step"].unique()) if a.steps.height else []


def _backend(a: Analysis) -> str | None:
    r = a.tables.ranks["backend"].drop_nulls() if a.tables.ranks.height else None
    if r is not None and r.len():
        return str(r[0])
    c = a.tables.collectives["backend"].drop_nulls()
    return str(c[0]) if c.len() else None

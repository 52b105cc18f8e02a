"""The JSON summary (docs/summary.md): a versioned, NaN-free dict built from an Analysis."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ep_trace.analysis import rank_coverage
from ep_trace.analysis.breakdown import BREAKDOWN_PARTS
from ep_trace.analysis.imbalance import run_aggregate
from ep_trace.analysis.placement_summary import invariants_section, placement_sections
from ep_trace.analysis.stage_coverage import summarize as coverage_summary
from ep_trace.analysis.step_spread import slowest_step, step_spread
from ep_trace.analysis.steps import phase_table
from ep_trace.analysis.whatif_checks import rerun_error_pct

if TYPE_CHECKING:  # result.Analysis.summary() calls build_summary: no import back at run time
    from ep_trace.analysis.result import Analysis

__all__ = ["SUMMARY_SCHEMA_VERSION", "build_summary"]

#: Version of the summary layout (docs/summary.md); bumped on any incompatible change.
SUMMARY_SCHEMA_VERSION = 3


def _clean(x: Any) -> Any:
    """Replace NaN / inf by None, recursively; numpy / polars scalars become Python ones."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return _clean(x.item())
    return x


def _rows(df: pl.DataFrame, cols: list[str]) -> list[dict[str, Any]]:
    return df.select([c for c in cols if c in df.columns]).to_dicts()


def _max(df: pl.DataFrame, col: str) -> Any:
    return df[col].max() if df.height and col in df.columns else None


def build_summary(a: Analysis) -> dict[str, Any]:
    """Build the summary dict of ``a`` (keys documented in docs/summary.md).

    Returns:
        A JSON-ready dict: no NaN, null for undefined values, times in ns unless the key says otherwise.
    """
    st = a.stragglers
    valid = a.calls.filter(pl.col("valid")) if a.calls.height else a.calls
    straggler = None
    if st.height and valid.height and int(st["induced_wait_ns"][0]) > 0:
        r = st.row(0, named=True)
        straggler = {
            "rank": r["rank"],
            "times_last": r["times_last"],
            "induced_wait_ns": r["induced_wait_ns"],
            "lateness_ns": r["lateness_ns"],
            "matched_calls": valid.height,
        }
    stages = (
        (
            a.stages.group_by(["rank", "stage"])
            .agg(
                pl.col("busy_ns").sum(),
                pl.col("window_ns").sum(),
                pl.col("exposed_comm_ns").sum(),
                pl.col("step").n_unique().alias("n_steps"),
                pl.col("tier").unique().sort().alias("tiers"),
            )
            .with_columns(
                (pl.col("busy_ns") / pl.col("n_steps")).round(0).cast(pl.Int64),
                (pl.col("window_ns") / pl.col("n_steps")).round(0).cast(pl.Int64),
                (pl.col("exposed_comm_ns") / pl.col("n_steps")).round(0).cast(pl.Int64),
            )
            .sort(["rank", "stage"])
        )
        if a.stages.height
        else a.stages
    )
    imb = a.imbalance
    per_layer = (
        imb.group_by("layer")
        .agg(
            pl.col("I_e").max().alias("I_e_max"),
            pl.col("I_r").max().alias("I_r_max"),
            pl.col("I_e").median().alias("I_e_p50"),
            pl.col("I_r").median().alias("I_r_p50"),
            pl.col("I_r_send").max().alias("I_r_send_max"),
        )
        .sort("layer", nulls_last=True)
        .to_dicts()
        if imb.height
        else []
    )
    agg = run_aggregate(imb)
    cm = a.count_matrix
    if cm.height:
        tot = cm.group_by(["direction", "src", "dst"]).agg(pl.col("rows").sum()).sort(["direction", "src", "dst"])
        count_matrix = {
            d: tot.filter(pl.col("direction") == d).select("src", "dst", "rows").to_dicts()
            for d in tot["direction"].unique().sort()
        }
    else:
        count_matrix = {}
    ab = {
        r["link_class"]: {k: r[k] for k in ("alpha_us", "beta_gbps", "r2", "n", "verdict")}
        for r in a.alpha_beta.to_dicts()
    }
    findings = [
        {
            "kind": f.kind,
            "severity": f.severity,
            "title": f.title,
            "est_saving_ns": f.est_saving_ns,
            "evidence": f.evidence,
            "remedy": f.remedy,
            "ranks": list(f.ranks),
            "layers": list(f.layers),
        }
        for f in a.findings
    ]
    load_report = [{"file": i.file, "rank": i.rank, "level": i.level, "message": i.message} for i in a.load_report]
    rs = a.rank_summary
    overall = {
        "step_time_ns": _max(rs, "step_time_ns"),
        "step_time_p99_ns": _max(rs, "step_time_p99_ns"),
        "exposed_comm_ns": _max(rs, "exposed_comm_ns"),
        "barrier_wait_ns": _max(rs, "barrier_wait_ns"),
        "overlap_efficiency_min": float(cast(float, rs["overlap_efficiency"].fill_nan(None).min()))
        if rs.height and rs["overlap_efficiency"].fill_nan(None).drop_nulls().len()
        else None,
        "wait_uncertainty_ns": _max(rs, "wait_uncertainty_ns"),
        "step_time_spread_ns": slowest_step(a.steps)[1],
        "matched_calls": valid.height,
        "unmatched_groups": a.misaligned.height if a.misaligned is not None else 0,
    }
    out = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "detection_method": a.detection_method,
        "n_ranks": a.rank_summary.height,
        "missing_ranks": rank_coverage.missing_ranks(a.tables.ranks),
        "steps": sorted(int(s) for s in a.steps["step"].unique()) if a.steps.height else [],
        "ep_invariants": invariants_section(a),  # before any performance figure (docs/summary.md)
        "overall": overall,
        "ranks": _rows(
            a.rank_summary,
            [
                "rank",
                "host",
                "mode",
                "step_time_ns",
                "step_time_max_ns",
                "step_time_p95_ns",
                "step_time_p99_ns",
                "comm_ns",
                "compute_ns",
                "exposed_comm_ns",
                "exposed_comm_p95_ns",
                "overlap_efficiency",
                "barrier_wait_ns",
                "barrier_wait_p95_ns",
                "transfer_ns",
                "wait_uncertainty_ns",
            ],
        ),
        "stages": _rows(stages, ["rank", "stage", "busy_ns", "window_ns", "exposed_comm_ns", "n_steps", "tiers"])
        if a.stages.height
        else [],
        "stage_coverage": coverage_summary(a.stage_coverage, a.unassigned_kernels),
        "straggler": straggler,
        "wait_matrix": a.wait_matrix.to_dicts(),
        "groups": a.group_stragglers.to_dicts() if a.group_stragglers is not None else [],
        "imbalance": {
            "I_e": agg["I_e"],
            "I_r": agg["I_r"],
            "balancedness": agg["balancedness"],
            "per_layer": per_layer,
            "count_matrix": count_matrix,
            "split_violations": a.split_violations.height,
            "routing_missing_ranks": rank_coverage.routing_missing_ranks(a.tables),
        },
        "alpha_beta": ab,
        "clock": a.clock.to_dicts(),
        "findings": findings,
        "load_report": load_report,
        "notes": list(a.notes),
        "withheld": [
            {"what": w.what, "name": w.name, "ranks": list(w.ranks), "invariant": w.invariant, "reason": w.reason}
            for w in a.withheld
        ],
    }
    out.update(_model_sections(a))
    out.update(placement_sections(a))
    out["breakdown"] = _breakdown(a)
    out["step_spread"] = step_spread(a)
    out["phases"] = phase_table(a.steps).to_dicts() if a.steps.height else []
    if a.hta_overlap is not None:
        out["hta_overlap"] = a.hta_overlap.to_dicts()
    return _clean(out)


def _model_sections(a: Analysis) -> dict[str, Any]:
    """``replay``, ``critical_path``, ``whatif`` (schema 2): the causal model behind the findings."""
    from ep_trace.analysis.critical_path import composition

    rep = a.replay
    replay = None
    if rep is not None and rep.height:
        per = rep.group_by("rank").agg(
            pl.col("error_pct").max(), pl.col("measured_ns").median(), pl.col("replayed_ns").median()
        )
        replay = {
            "error_pct": float(rep["error_pct"].to_numpy().max()),
            "per_rank": [
                {
                    "rank": int(r["rank"]),
                    "error_pct": float(r["error_pct"]),
                    "measured_ns": int(r["measured_ns"]),
                    "replayed_ns": int(r["replayed_ns"]),
                }
                for r in per.sort("rank").iter_rows(named=True)
            ],
        }
    cp = a.critical_path
    critical = None
    if cp is not None and cp.height:
        # the representative step: the median-length step (as the report's timeline)
        lens = cp.group_by("step").agg((pl.col("end_ns").max() - pl.col("start_ns").min()).alias("_l")).sort("_l")
        rep_step = int(lens["step"][(lens.height - 1) // 2])
        critical = composition(cp, rep_step)
        seg = cp.filter(pl.col("step") == rep_step)
        critical["segments"] = seg.select("seq", "rank", "start_ns", "end_ns", "cause", "stage", "name").to_dicts()
        critical["per_step"] = [composition(cp, int(s)) for s in sorted(cp["step"].unique())]
    wf = a.whatif
    whatif = (
        [
            {
                "scenario": r["scenario"],
                "predicted_step_ns": int(r["predicted_step_ns"]),
                "saving_ns": int(r["saving_ns"]),
                "ranks": [int(x) for x in r["ranks"]],
                "chunks": r.get("chunks"),
                "kept_work_ns": r.get("kept_work_ns"),
                "rerun_error_pct": rerun_error_pct(r["scenario"]),
            }
            for r in wf.iter_rows(named=True)
        ]
        if wf is not None
        else []
    )
    return {"replay": replay, "critical_path": critical, "whatif": whatif}


def _breakdown(a: Analysis) -> list[dict[str, Any]]:
    """Per rank: the mean per step of each part of the time breakdown (the parts sum to the step)."""
    bd = a.breakdown
    if bd is None or bd.is_empty():
        return []
    return (
        bd.group_by("rank")
        .agg(
            pl.len().alias("n_steps"),
            *(pl.col(c).mean().round(0).cast(pl.Int64) for c in (*BREAKDOWN_PARTS, "step_time_ns")),
        )
        .sort("rank")
        .to_dicts()
    )

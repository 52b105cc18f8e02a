"""What a person reads first, as data: the verdict, the ranked findings and the per-rank table.

Shared by the HTML page and the terminal summary so both say the same thing. Pure functions over
:class:`~ep_trace.analysis.result.Analysis`; durations stay in ns here and are formatted by the
renderers (``reports.units``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import polars as pl

from ep_trace.analysis.breakdown import BREAKDOWN_PARTS
from ep_trace.analysis.result import Analysis, Finding
from ep_trace.analysis.whatif_checks import RERUN_CHECKS
from ep_trace.reports.coverage_section import unattributed_clause
from ep_trace.reports.units import fmt_ns, fmt_pct

__all__ = [
    "Verdict",
    "StepStats",
    "DominantStage",
    "step_stats",
    "ranked_findings",
    "dominant_stage",
    "verdict",
    "rank_table",
    "withheld_lines",
]

_SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}


@dataclass(frozen=True)
class StepStats:
    """Step time of the job (per step: its slowest rank), ns, over the analysed steps.

    ``mean_ns`` is the reference for savings: findings estimate savings as means per step.
    """

    n_steps: int
    n_ranks: int
    mean_ns: float | None
    p50_ns: float | None
    p95_ns: float | None
    p99_ns: float | None
    max_ns: float | None


@dataclass(frozen=True)
class Verdict:
    """The first lines of the report.

    Attributes:
        headline: One plain sentence: the main bottleneck (or that none was found).
        detail: The saving and remedy of the top finding, or what was checked.
        context: Size of the run and its step time (P50 / P99 / max).
        severity: ``'high' | 'medium' | 'low' | 'none'``.
    """

    headline: str
    detail: str
    context: str
    severity: str


def step_stats(analysis: Analysis) -> StepStats:
    """P50 / P95 / P99 / max over steps of the step time of the slowest rank."""
    st = analysis.steps
    n_ranks = int(analysis.rank_summary.height or analysis.tables.ranks.height)
    if st.height == 0:
        return StepStats(0, n_ranks, None, None, None, None, None)
    per = st.group_by("step").agg(pl.col("step_time_ns").max())["step_time_ns"].cast(pl.Float64)
    q = [per.quantile(x, interpolation="linear") for x in (0.5, 0.95, 0.99)]
    return StepStats(per.len(), n_ranks, per.mean(), q[0], q[1], q[2], per.max())  # type: ignore[arg-type]


def ranked_findings(analysis: Analysis) -> list[Finding]:
    """Findings by estimated saving (largest first), then severity."""
    return sorted(analysis.findings, key=lambda f: (-int(f.est_saving_ns or 0), _SEVERITY_RANK.get(f.severity, 3)))


@dataclass(frozen=True)
class DominantStage:
    """The stage with the most busy time per step on the rank where it is largest.

    Attributes:
        stage: Stage name.
        rank: Rank where it takes the largest share.
        busy_ns: P50 over steps of the stage's busy time on that rank, ns.
        step_ns: P50 over steps of that rank's step time, ns.
        share: busy_ns / step_ns.
    """

    stage: str
    rank: int
    busy_ns: float
    step_ns: float
    share: float


#: Share of the step from which one stage is the verdict when no finding saves more than
#: :data:`_MINOR_SAVING` of the step (an expert GEMM that is 90% of the step is the answer).
DOMINANT_SHARE = 0.6
_MINOR_SAVING = 0.10
#: Below this share of the mean step no finding heads the verdict: a 27 µs host stall in a 222 ms
#: step (hta_nccl_metadata) is not what anyone should act on first; the verdict says where the time
#: goes and names the largest saving as minor.
NEGLIGIBLE_SAVING = 0.01
_REMEDY_OF_STAGE = {
    "expert": "the layer is compute-bound in the expert GEMMs, not in EP communication: use a grouped / fused "
    "expert GEMM (one launch for all local experts), FP8 or BF16 tensor-core kernels, larger tiles, or spread the "
    "experts over more EP ranks",
    "shared_expert": "the shared expert dominates: overlap it with the dispatch/combine all-to-all of the routed experts",
    "attn": "attention dominates the step: EP is not the bottleneck",
    "permute": "fuse permute with the dispatch (DeepEP-style) or use fused moe_align / scatter kernels",
    "unpermute": "fuse unpermute with the combine or use a fused gather + weighted-sum kernel",
    "route": "fuse the router (top-k + softmax) into one kernel",
    "dispatch": "chunk dispatch with the expert GEMM (pipelining) or use low-latency all-to-all kernels",
    "combine": "chunk combine with the expert GEMM (pipelining) or use low-latency all-to-all kernels",
}


def dominant_stage(analysis: Analysis) -> DominantStage | None:
    """The stage taking the largest share of a rank's step (busy time, P50 over steps), or None."""
    st, steps = analysis.stages, analysis.steps
    if st.height == 0 or steps.height == 0:
        return None
    per = (
        st.group_by("rank", "step", "stage")
        .agg(pl.col("busy_ns").sum())
        .group_by("rank", "stage")
        .agg(pl.col("busy_ns").median())
        .join(steps.group_by("rank").agg(pl.col("step_time_ns").median()), on="rank")
        .filter(pl.col("step_time_ns") > 0)
        .with_columns((pl.col("busy_ns") / pl.col("step_time_ns")).alias("share"))
        .sort("share", "rank", descending=[True, False])
    )
    if per.height == 0:
        return None
    r = per.row(0, named=True)
    return DominantStage(
        str(r["stage"]), int(r["rank"]), float(r["busy_ns"]), float(r["step_time_ns"]), float(r["share"])
    )


def verdict(analysis: Analysis) -> Verdict:
    """The verdict: main bottleneck, its saving as a share of the mean step, and the run's size."""
    ss = step_stats(analysis)
    context = (
        f"{ss.n_ranks} rank{'s' if ss.n_ranks != 1 else ''}, {ss.n_steps} step{'s' if ss.n_steps != 1 else ''} analysed"
    )
    if ss.p50_ns is not None:
        context += (
            f"; step time (slowest rank) mean {fmt_ns(ss.mean_ns)}, P50 {fmt_ns(ss.p50_ns)}, P99 {fmt_ns(ss.p99_ns)}, "
            f"max {fmt_ns(ss.max_ns)}"
        )
    if any("cannot be measured" in n for n in analysis.notes):
        context += "; ranks are missing from some groups: wait and straggler cannot be measured"
    if any("which group each belongs to is unknown" in n for n in analysis.notes):  # match_pass._apart_notes
        context += "; the trace does not name the process group of its calls: wait and straggler cannot be measured"
    if analysis.calls.height == 0 and analysis.tables.collectives.height == 0:
        context += "; no EP communication (no collective) in the trace"
    found = ranked_findings(analysis)
    dom = dominant_stage(analysis)
    top_share = (found[0].est_saving_ns / ss.mean_ns) if found and ss.mean_ns else 0.0
    if dom is not None and dom.share >= DOMINANT_SHARE and top_share < _MINOR_SAVING:
        headline = (
            f"The {dom.stage} stage takes {fmt_pct(dom.share)} of the step on rank {dom.rank} "
            f"({fmt_ns(dom.busy_ns)} of {fmt_ns(dom.step_ns)})"
        )
        remedy = _REMEDY_OF_STAGE.get(dom.stage, "speed up that stage first")
        detail = f"Remedy: {remedy}."
        if found:
            nxt = found[0]
            # the titles of what-if findings state their saving already ("... saves 32.1 µs per step")
            said = "save" in nxt.title
            detail += f" Next: {nxt.title}" + ("" if said else f" (saves {fmt_ns(nxt.est_saving_ns)} per step).")
        return Verdict(headline, detail, context, "medium")
    if not found:
        unsplit = _unmeasured_exposed(analysis)
        if unsplit is not None:
            return Verdict(
                unsplit,
                "Analyse all ranks of the job together: then the wait for the others is measured, the straggler found and "
                "the saving of overlap simulated.",
                context,
                "medium",
            )
        no_comm = analysis.calls.height == 0 and analysis.tables.collectives.height == 0
        lead = "No EP communication in the trace" if no_comm else "No EP bottleneck found"
        where = _where_time_goes(analysis)
        held = sum(w.what == "finding" for w in analysis.withheld)
        if held:  # not "below the thresholds": findings were made, and withheld (invariants)
            return Verdict(
                f"No finding can be published: {where}." if where else "No finding can be published.",
                f"{held} finding{'s' if held > 1 else ''} withheld: {'their' if held > 1 else 'its'} figures break a "
                "physical invariant (the withheld lines say which and why).",
                context,
                "low",
            )
        checked = "Exposed communication, barrier wait, routing imbalance and host stalls were all checked and are below the thresholds."
        # never "no bottleneck" while MoE work went without a stage: say how much could not be attributed
        unattributed = unattributed_clause(analysis)
        if unattributed is not None:
            head = unattributed[0].upper() + unattributed[1:]
            return Verdict(f"{head}: {where}." if where else f"{head}.", _COVERAGE_HINT, context, "low")
        return Verdict(f"{lead}: {where}." if where else f"{lead}.", checked, context, "none")
    top = found[0]
    of_mean = f"{fmt_pct(top.est_saving_ns / ss.mean_ns)} of the mean step" if ss.mean_ns else ""
    share = f" ({of_mean})" if of_mean else ""
    if ss.mean_ns and top_share < NEGLIGIBLE_SAVING:
        where = _where_time_goes(analysis)
        lead = f"No EP bottleneck worth {fmt_pct(NEGLIGIBLE_SAVING)} of the step"
        unattributed = unattributed_clause(analysis)
        if unattributed is not None:
            lead = unattributed[0].upper() + unattributed[1:]
        return Verdict(
            f"{lead}: {where}." if where else f"{lead}.",
            f"The largest simulated saving is {fmt_ns(top.est_saving_ns)} per step{share}: {top.title}",
            context,
            "none",
        )
    about = [of_mean] if of_mean else []
    scen = (top.evidence.get("whatif") or {}).get("scenario")
    if scen:
        # the figure people act on says how far its what-if has matched reality (whatif_checks)
        c = RERUN_CHECKS.get(str(scen))
        about.append(
            f"the {scen} what-if was {c.range_text} off in gloo reruns"
            if c
            else f"the {scen} what-if has not been checked against a rerun"
        )
    paren = f" ({'; '.join(about)})" if about else ""
    detail = f"Estimated saving {fmt_ns(top.est_saving_ns)} per step{paren}. Remedy: {top.remedy}"
    wf = analysis.whatif
    if wf is not None and wf.height and (wf["scenario"] == "all").any():
        bound = int(wf.filter(pl.col("scenario") == "all")["saving_ns"][0])
        detail += f" Every fix at once (simulated bound): {fmt_ns(bound)} per step; the findings' savings overlap, do not add them."
    return Verdict(top.title, detail, context, top.severity)


#: The verdict's detail when MoE work got no stage (reports/coverage_section.py says how much).
_COVERAGE_HINT = (
    "Exposed communication, barrier wait, routing imbalance and host stalls were checked on the stages found. "
    "The stage coverage section lists the kernels without a stage and the --stages rows that claim them."
)

#: Share of the slowest rank's step in unhidden communication from which, when the other ranks of its
#: groups are missing (no wait / transfer split, no what-if), the verdict says so rather than "no
#: bottleneck" (HTA's cpu_only rank-34 trace: 85 % of a 210 ms step in gloo all-reduce).
UNMEASURED_COMM_SHARE = 0.2


def _slowest_rank_parts(analysis: Analysis) -> tuple[dict[str, Any], dict[str, float]] | None:
    """The slowest rank's ``rank_summary`` row and the share of its step of each breakdown part, or None."""
    bd, rs = analysis.breakdown, analysis.rank_summary
    if bd is None or bd.is_empty() or rs.is_empty():
        return None
    slow = rs.sort(["step_time_ns", "rank"], descending=[True, False]).row(0, named=True)
    mine = bd.filter(pl.col("rank") == slow["rank"])
    total = float(cast(float, mine["step_time_ns"].sum()))
    if total <= 0:
        return None
    return slow, {c: float(cast(float, mine[c].sum())) / total for c in BREAKDOWN_PARTS}


def _unmeasured_exposed(analysis: Analysis) -> str | None:
    """The headline for a step dominated by communication whose wait cannot be measured, or None."""
    if not any("cannot be measured" in n for n in analysis.notes):
        return None
    found = _slowest_rank_parts(analysis)
    if found is None:
        return None
    slow, parts = found
    exposed = parts["exposed_comm_ns"] + parts["barrier_wait_ns"]
    if exposed < UNMEASURED_COMM_SHARE:
        return None
    return (
        f"Rank {slow['rank']}'s step (P50 {fmt_ns(slow['step_time_ns'])}) is {fmt_pct(exposed)} communication "
        "that nothing hides; the other ranks of its groups are not in the trace set, so how much of it is waiting "
        "for them cannot be measured and no saving is simulated"
    )


def _where_time_goes(analysis: Analysis) -> str:
    """'rank R's step (P50 X) is 62% compute, 20% idle' for the slowest rank, from the time breakdown."""
    found = _slowest_rank_parts(analysis)
    if found is None:
        return ""
    slow, parts = found
    # "overlapped_comm_ns" -> "overlapped comm"
    shares = sorted(((x, c.removesuffix("_ns").replace("_", " ")) for c, x in parts.items()), reverse=True)
    top = ", ".join(f"{fmt_pct(x)} {label}" for x, label in shares[:2] if x >= 0.05)
    return f"rank {slow['rank']}'s step (P50 {fmt_ns(slow['step_time_ns'])}) is {top}" if top else ""


def rank_table(analysis: Analysis) -> pl.DataFrame:
    """One row per rank: step time P50/P95/P99/max over steps, the per-step mean of comm metrics and
    the P99 over steps of exposed comm and barrier wait (where a mean would hide the tail).

    Columns: rank, host, step_p50_ns, step_p95_ns, step_p99_ns, step_max_ns, comm_ns, exposed_comm_ns,
    overlap_efficiency, barrier_wait_ns, transfer_ns, exposed_p99_ns, wait_p99_ns.
    """
    rs = analysis.rank_summary
    cols = ["rank", "host", "comm_ns", "exposed_comm_ns", "overlap_efficiency", "barrier_wait_ns", "transfer_ns"]
    base = rs.select([c for c in cols if c in rs.columns])
    st = analysis.steps
    if st.height:
        q = (
            st.group_by("rank")
            .agg(
                *[
                    pl.col("step_time_ns").cast(pl.Float64).quantile(x, interpolation="linear").alias(f"step_{n}_ns")
                    for n, x in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
                ],
                pl.col("step_time_ns").max().cast(pl.Float64).alias("step_max_ns"),
                pl.col("exposed_comm_ns")
                .cast(pl.Float64)
                .quantile(0.99, interpolation="linear")
                .alias("exposed_p99_ns"),
                pl.col("barrier_wait_ns").cast(pl.Float64).quantile(0.99, interpolation="linear").alias("wait_p99_ns"),
            )
            .with_columns(pl.col("rank").cast(base.schema.get("rank", pl.Int32)))
        )
        base = base.join(q, on="rank", how="full", coalesce=True) if base.height else q
    quantiles = ("step_p50_ns", "step_p95_ns", "step_p99_ns", "step_max_ns")
    for c in ("host", *quantiles, *cols[2:], "exposed_p99_ns", "wait_p99_ns"):
        if c not in base.columns:
            base = base.with_columns(pl.lit(None, dtype=pl.Utf8 if c == "host" else pl.Float64).alias(c))
    return base.select("rank", "host", *quantiles, *cols[2:], "exposed_p99_ns", "wait_p99_ns").sort("rank")


def withheld_lines(analysis: Analysis, limit: int = 8) -> list[str]:
    """One line per finding or group of figures withheld for breaking an invariant (findings first),
    at most ``limit`` and a last line counting the rest (``ep_trace.analysis.invariants``)."""
    w = sorted(analysis.withheld, key=lambda x: x.what != "finding")
    lines = [x.line() for x in w[:limit]]
    if len(w) > limit:
        lines.append(f"... and {len(w) - limit} more withheld (the JSON summary's withheld lists them all)")
    return lines

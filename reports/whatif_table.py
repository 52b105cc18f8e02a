"""The what-if table: every simulated edit of the step graph, its predicted step and its saving.

One row per scenario of ``Analysis.whatif`` (``ep_trace.analysis.whatif``), the ``all`` row last: the
bound of every fix at once, the figure to compare against (the rows' savings overlap and must not be
added). A negative saving reads "slower", and its row says why (:func:`slower_reason`): balanced
routing that moves tokens onto the late rank (the README example: predicted 8.6 ms slower, measured
8.9 in an in-run A/B, benchmarks/README.md), or chunks that cost more than pipelining hides.

A first row, ``as measured``, gives the baseline every row is compared with: the unedited step
replayed, with the what-ifs' own statistic (median over steps of the mean over ranks). It differs from
the verdict's "mean step" (the slowest rank's step, mean over steps) wherever ranks' steps differ in
length (``param_dlrm_8rank``: 16.0 vs 19.9 ms), so the share column names its denominator.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.finding_common import rank_list
from ep_trace.analysis.result import Analysis
from ep_trace.analysis.whatif_checks import RERUN_CHECKS, check_text
from ep_trace.reports.units import fmt_ns, fmt_pct

__all__ = [
    "WHATIF_HEADERS",
    "MEASURED",
    "whatif_rows",
    "SCENARIO_WORDS",
    "slower_reason",
    "slower_notes",
    "check_notes",
]

WHATIF_HEADERS = (
    "what-if",
    "what it changes",
    "predicted step",
    "saving per step",
    "of replayed step",
    "ranks",
    "checked against a rerun",
)
#: The what-ifs that are not part of ``all`` (each an alternative to ``balanced_routing``).
PLACEMENT_SCENARIOS = ("placement", "node_local")
#: The baseline row's name (no scenario of ``Analysis.whatif`` has it).
MEASURED = "as measured"

SCENARIO_WORDS = {
    "no_straggler": "the late rank's work before its arrivals set to the other ranks' median",
    "balanced_routing": "each rank's expert work scaled to the mean load",
    "full_overlap": "every transfer behind the work that follows it (as far as the rank has a resource for it)",
    "fp8_dispatch": "dispatch transfers halved (half the bytes)",
    "no_host_stalls": "blocking host calls and the count exchange removed",
    "no_launch_gaps": "the device never waits for the host (GPU ranks; bound of CUDA graphs)",
    "fused_permute": "permute / unpermute compute halved",
    "chunked_pipeline": "dispatch / experts / combine pipelined over {k} chunks (the best k)",
    "all": "every edit above at once: the bound (do not add the rows)",
    "placement": "experts re-placed, hot ones replicated (EPLB-style): each rank's expert work at its cost per row, "
    "transfers re-priced per link class",
    "node_local": "experts placed on the nodes whose tokens use them (fewest cross-node bytes at a bounded load)",
}


def slower_reason(scenario: str, heavy: list[int], straggler: int | None) -> str:
    """Why a what-if lengthens the step, in words ('' when there is no specific reason).

    Args:
        scenario: The what-if.
        heavy: Its ranks (for ``balanced_routing``: the ranks that give tokens away).
        straggler: The ``no_straggler`` row's rank, if any.
    """
    if scenario == "balanced_routing":
        if straggler is not None and straggler not in heavy:
            return f"balancing gives more tokens to rank {straggler}, the late rank, which then arrives later still"
        return "the ranks that receive tokens finish later than the heavy ranks did"
    if scenario in PLACEMENT_SCENARIOS:
        return "the ranks that take the moved rows work slower per row (measured) than the ranks that shed them"
    if scenario == "chunked_pipeline":
        return (
            "each extra chunk's two collective calls and re-issued ops cost more than pipelining hides on these ranks"
        )
    return ""


def _reasons(wf: pl.DataFrame) -> dict[str, str]:
    """``scenario -> reason`` of the what-ifs of ``wf`` that lengthen the step and have one."""
    late = wf.filter(pl.col("scenario") == "no_straggler")["ranks"].to_list()
    straggler = int(late[0][0]) if late and late[0] else None
    out = {}
    for r in wf.filter(pl.col("saving_ns") < 0).iter_rows(named=True):
        why = slower_reason(r["scenario"], [int(x) for x in r["ranks"]], straggler)
        if why:
            out[r["scenario"]] = why
    return out


def slower_notes(analysis: Analysis) -> list[str]:
    """``'<what-if> is slower: <reason>'`` per what-if that lengthens the step (for the terminal,
    whose table has no "what it changes" column)."""
    wf = analysis.whatif
    if wf is None or wf.is_empty():
        return []
    return [f"{s} is slower: {why}" for s, why in _reasons(wf).items()]


def whatif_rows(analysis: Analysis) -> list[list[str]]:
    """Table rows (strings, one per :data:`WHATIF_HEADERS` column): the replayed baseline
    (:data:`MEASURED`) first, then the simulated what-ifs, ``all`` last; empty without a model. The
    last column is the measured error of the scenario's saving against reruns
    (:mod:`ep_trace.analysis.whatif_checks`)."""
    wf = analysis.whatif
    if wf is None or wf.is_empty():
        return []
    wf = wf.with_columns((pl.col("scenario") == "all").alias("_last")).sort("_last", maintain_order=True)
    base = (wf["predicted_step_ns"] + wf["saving_ns"]).to_list()
    ranks = sorted({int(x) for r in wf["ranks"].to_list() for x in r})
    reasons = _reasons(wf)
    rows = [
        [
            MEASURED,
            "the step replayed unedited (median over steps of the mean over ranks): the baseline of every row",
            fmt_ns(base[0]),
            "–",
            "–",
            rank_list(ranks, limit=6),
            "–",
        ]
    ]
    for r, b in zip(wf.iter_rows(named=True), base, strict=True):
        sav = int(r["saving_ns"])
        words = SCENARIO_WORDS.get(r["scenario"], r["scenario"]).format(k=r.get("chunks"))
        words += f"; slower: {reasons[r['scenario']]}" if r["scenario"] in reasons else ""
        if r["scenario"] == "all" and wf["scenario"].is_in(list(PLACEMENT_SCENARIOS)).any():
            words += "; placement and node_local left out: alternatives to balanced_routing"
        saving = fmt_ns(sav) if sav >= 0 else f"{fmt_ns(-sav)} slower"
        rows.append(
            [
                r["scenario"],
                words,
                fmt_ns(r["predicted_step_ns"]),
                saving,
                fmt_pct(sav / b) if b else "–",
                rank_list([int(x) for x in r["ranks"]], limit=6),
                # the bound of every edit at once is no scenario a rerun can remove
                "not checked (a bound)" if r["scenario"] == "all" else check_text(r["scenario"]),
            ]
        )
    return rows


def check_notes(analysis: Analysis) -> list[str]:
    """For the terminal (its table has no rerun column): the measured error of the what-ifs shown that
    have been checked against reruns, each caveat, and the ones that have not been."""
    wf = analysis.whatif
    if wf is None or wf.is_empty():
        return []
    shown = [s for s in wf["scenario"].to_list() if s != "all"]
    checked = [RERUN_CHECKS[s] for s in shown if s in RERUN_CHECKS]
    out = []
    if checked:
        figs = ", ".join(f"{c.scenario} {c.range_text}" for c in checked)
        out.append(f"checked against reruns (gloo demo pairs, benchmarks/README.md): {figs} error")
        out += [f"{c.scenario}: {c.caveat}" for c in checked if c.caveat]
    unchecked = [s for s in shown if s not in RERUN_CHECKS]
    if unchecked:
        out.append(f"not checked against a rerun: {', '.join(unchecked)}")
    return out

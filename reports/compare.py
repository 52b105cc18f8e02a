"""``ep-trace compare A B``, presented: the headline, the figures, the page and the JSON of a comparison.

The comparison itself is analysis (:mod:`ep_trace.analysis.run_digest`: a run reduced to a
:class:`RunDigest` from an :class:`Analysis` or a saved summary; :mod:`ep_trace.analysis.run_compare`:
A vs B against the runs' noise; :mod:`ep_trace.analysis.regression_gate`: the CI gate); its names are
re-exported here, where the command and notebooks have always found them.
"""

from __future__ import annotations

import html
import math
from typing import Any

import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.regression_gate import Gate, evaluate
from ep_trace.analysis.run_compare import Comparison, compare_runs, within_noise
from ep_trace.analysis.run_digest import RunDigest, digest_analysis, digest_summary
from ep_trace.reports.gate import gate_header, gate_rows, gate_to_dict, gate_verdict
from ep_trace.reports.units import fmt_ns, fmt_pct

__all__ = [
    "RunDigest",
    "Comparison",
    "digest_analysis",
    "digest_summary",
    "compare_runs",
    "comparison_to_dict",
    "headline",
    "within_noise",
    "stage_delta_figure",
    "rank_delta_figure",
    "render_compare_html",
]


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def comparison_to_dict(c: Comparison, gate: Gate | None = None) -> dict[str, Any]:
    """JSON-ready dict of the comparison (ns integers rounded; null for unknown), with the regression
    gate's verdict (``gate``; default: every metric at the default threshold)."""

    def recs(df: pl.DataFrame) -> list[dict[str, Any]]:
        return [{k: _clean(v) for k, v in r.items()} for r in df.to_dicts()]

    return {
        "schema_version": 1,
        "a": c.a.label,
        "b": c.b.label,
        "step_time_ns": {
            "a": c.a_step_ns,
            "b": c.b_step_ns,
            "delta": c.step_delta_ns,
            "statistic": c.step_stat,
            "noise": c.noise_ns,
            "within_noise": within_noise(c),
        },
        "common_ranks": list(c.common_ranks),
        "explained_by_stages_ns": c.explained_ns,
        "unexplained_ns": None if c.step_delta_ns is None else c.step_delta_ns - c.explained_ns,
        "stages": recs(c.stages),
        "ranks": recs(c.ranks),
        "findings": recs(c.findings),
        "gate": gate_to_dict(gate if gate is not None else evaluate(c)),
    }


def headline(c: Comparison) -> str:
    """One sentence: how the step time moved (or that it is within noise) and which stage moved most."""
    pre = ""
    if not c.common_ranks and c.a.ranks.height and c.b.ranks.height:
        pre = (
            f"A and B have no rank in common (A: {_ranks_txt(c.a)}; B: {_ranks_txt(c.b)}): the figures compare "
            "different ranks. "
        )
    if c.step_delta_ns is None or not c.a_step_ns:
        return pre + "Step time not comparable (one run has no steps)."
    stat = c.step_stat
    if within_noise(c):
        s = pre + (
            f"Within noise: B - A = {fmt_ns(c.step_delta_ns, signed=True)} per step ({fmt_ns(c.a_step_ns)} → "
            f"{fmt_ns(c.b_step_ns)}, {stat} step of the slowest rank) is inside the runs' own step-to-step spread "
            f"(±{fmt_ns(c.noise_ns)}, 2 standard errors); neither run is better."
        )
    else:
        word = "faster" if c.step_delta_ns < 0 else "slower"
        s = pre + (
            f"B is {fmt_ns(abs(c.step_delta_ns))} {word} per step than A "
            f"({fmt_pct(c.step_delta_ns / c.a_step_ns, signed=True)}: "
            f"{fmt_ns(c.a_step_ns)} → {fmt_ns(c.b_step_ns)}, {stat} step of the slowest rank)."
        )
    if within_noise(c):
        # a step change inside the noise has nothing to explain: say which stages moved beyond their own
        # (stages without a known spread, from saved summaries, are not judged here)
        known = c.stages.filter(pl.col("noise_ns").is_not_null())
        if known.is_empty():
            return s
        moved = known.filter(pl.col("change").is_in(["better", "worse"]))
        if moved.is_empty():
            return s + " No stage window moved beyond its own step-to-step spread either."
        most = moved.sort(pl.col("delta_ns").abs(), descending=True).head(3)
        parts = ", ".join(f"{r['stage']} {fmt_ns(r['delta_ns'], signed=True)}" for r in most.iter_rows(named=True))
        return s + f" Stage windows that moved beyond their own spread: {parts}."
    if c.stages.height:
        top = c.stages.sort(pl.col("delta_ns").abs(), descending=True).row(0, named=True)
        s += f" Largest stage change: {top['stage']} {fmt_ns(top['delta_ns'], signed=True)}."
    rest = c.step_delta_ns - c.explained_ns
    s += f" Stage changes sum to {fmt_ns(c.explained_ns, signed=True)}"
    if abs(c.explained_ns) > abs(c.step_delta_ns) and rest * c.explained_ns < 0:
        if c.a.pipelined or c.b.pipelined:
            # chunked stages run concurrently: their windows overlap, so the sum over-counts
            s += (
                f", more than the step-time change: stage windows overlap each other (pipelined stages), "
                f"so {fmt_ns(-rest)} of the stage change is concurrent rather than serial"
            )
        else:
            # windows are means over ranks and hold the waits of ranks that do not set the step
            s += (
                ", more than the step-time change of the slowest rank: stage windows are means over ranks and "
                "include the waits of ranks that do not set the step"
            )
    else:
        s += f"; the remaining {fmt_ns(rest, signed=True)} is outside the EP stages"
    s += (
        "."
        if stat == "mean"
        else " (or the gap between the P50 step and the mean stage times: a summary saved before schema 3 holds no "
        "mean step)."
    )
    if c.noise_ns is not None and not within_noise(c):
        s += f" The change is beyond the runs' own step-to-step spread (±{fmt_ns(c.noise_ns)}, 2 standard errors)."
    return s


def _ranks_txt(d: RunDigest) -> str:
    r = sorted(int(x) for x in d.ranks["rank"])
    return ", ".join(str(x) for x in r[:8]) + (" ..." if len(r) > 8 else "")


def stage_delta_figure(c: Comparison) -> go.Figure | None:
    """Per stage: A and B window per step (ms), grouped bars."""
    if c.stages.height == 0:
        return None
    fig = go.Figure(
        [
            go.Bar(
                name=f"A: {c.a.label}",
                x=c.stages["stage"].to_list(),
                y=(c.stages["a_window_ns"] / 1e6).round(4).to_numpy(),
            ),
            go.Bar(
                name=f"B: {c.b.label}",
                x=c.stages["stage"].to_list(),
                y=(c.stages["b_window_ns"] / 1e6).round(4).to_numpy(),
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        height=360,
        title={"text": "Stage window per step (mean over ranks)", "x": 0.01},
        yaxis_title="ms per step",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def rank_delta_figure(c: Comparison) -> go.Figure | None:
    """Per rank: change of step time and of barrier wait (ms, B − A)."""
    if c.ranks.height == 0:
        return None
    x = [f"r{r}" for r in c.ranks["rank"].to_list()]
    fig = go.Figure(
        [
            go.Bar(name="Δ step time", x=x, y=(c.ranks["delta_step_time_ns"] / 1e6).round(4).to_numpy()),
            go.Bar(name="Δ barrier wait", x=x, y=(c.ranks["delta_barrier_wait_ns"] / 1e6).round(4).to_numpy()),
        ]
    )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        height=340,
        title={"text": "Per-rank change (B − A; negative = better)", "x": 0.01},
        yaxis_title="ms per step",
        legend={"orientation": "h", "y": -0.2},
    )
    fig.update_xaxes(type="category")
    return fig


def render_compare_html(c: Comparison, gate: Gate | None = None) -> str:
    """The comparison as one self-contained HTML page (plotly.js embedded once), with the regression
    gate's table (default: every metric at the default threshold)."""
    from ep_trace.reports.html_page import figure_html, page, table_html

    st_rows = [
        [
            r["stage"],
            fmt_ns(r["a_window_ns"]),
            fmt_ns(r["b_window_ns"]),
            fmt_ns(r["delta_ns"], signed=True),
            fmt_ns(r["busy_delta_ns"], signed=True),
            r["change"],
        ]
        for r in c.stages.iter_rows(named=True)
    ]
    rk_rows = [
        [
            r["rank"],
            fmt_ns(r["a_step_time_ns"]),
            fmt_ns(r["b_step_time_ns"]),
            fmt_ns(r["delta_step_time_ns"], signed=True),
            fmt_ns(r["delta_exposed_comm_ns"], signed=True),
            fmt_ns(r["delta_barrier_wait_ns"], signed=True),
        ]
        for r in c.ranks.iter_rows(named=True)
    ]
    fd_rows = [
        [r["kind"], r["title"], fmt_ns(r["a_saving_ns"]), fmt_ns(r["b_saving_ns"]), r["status"]]
        for r in c.findings.iter_rows(named=True)
    ]
    body = (
        f'<div class="verdict none"><div class="headline">{html.escape(headline(c))}</div>'
        f'<div class="context">A = {html.escape(c.a.label)}; B = {html.escape(c.b.label)}. Deltas are B − A; negative is better.</div></div>'
        "<h2>Per stage</h2>"
        + figure_html(stage_delta_figure(c), "fig-cmp-stages", "No stages in either run.")
        + table_html(["stage", "A window", "B window", "Δ window", "Δ busy", "change"], st_rows, left=(0, 5))
        + "<h2>Per rank</h2>"
        + figure_html(rank_delta_figure(c), "fig-cmp-ranks", "No ranks.")
        + table_html(["rank", "A step P50", "B step P50", "Δ step", "Δ exposed comm", "Δ barrier wait"], rk_rows)
        + "<h2>Findings</h2>"
        + table_html(["kind", "finding", "A saving", "B saving", "status"], fd_rows, left=(0, 1, 4))
        + _gate_html(gate if gate is not None else evaluate(c))
    )
    return page("ep-trace comparison", body, f"A: {c.a.label} · B: {c.b.label}")


def _gate_html(g: Gate) -> str:
    from ep_trace.reports.html_page import table_html

    return (
        "<h2>Regression gate</h2>"
        f'<p class="context">{html.escape(gate_header(g))}. {html.escape(gate_verdict(g))}</p>'
        + table_html(["result", "metric", "A", "B", "change", "noise", "limit"], gate_rows(g), left=(0, 1))
    )

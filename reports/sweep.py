"""The sweep report: one self-contained HTML page for a :class:`~ep_trace.analysis.sweep.SweepResult`.

Verdict first (the same ``.verdict .headline`` box as the analysis report), then stage time against
the knob with the fitted lines, throughput, the share of each cause per run, residuals, the fit and
run tables, and the definitions. Page helpers (offline plotly, figure renderer) come from
:mod:`ep_trace.reports.html_page`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.run_facts import SWEEP_STAGES
from ep_trace.analysis.sweep import SweepResult
from ep_trace.reports.html_page import figure_html, page, table_html
from ep_trace.reports.units import fmt_bytes, fmt_ns, fmt_pct

__all__ = ["render_sweep", "stage_fit_figure", "throughput_figure", "residual_figure", "exposed_figure"]

_COLORS = {
    "dispatch": "#E69F00",
    "combine": "#56B4E9",
    "expert": "#009E73",
    "moe_layer": "#0072B2",
    "step": "#666666",
}
_DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "Stage time of one call",
        "One execution of a stage in one MoE layer (micro-batch chunks summed): the device window on GPU ranks, the "
        "host range on CPU ranks. Per (step, layer): dispatch / combine take the rank that waited least (its time is "
        "the wait-free cost of the call), expert the slowest rank (mean kept beside it), the MoE layer and the step "
        "the slowest rank; then the median over steps.",
    ),
    (
        "Fit T = α + β·x",
        "Least squares over each run's fastest call (interference from other processes only adds time); x is the swept knob or, for dispatch / combine, the bytes one rank moves "
        "per call. α is per call; α per all-to-all divides it by the all-to-all calls of one call of the stage "
        "(dispatch: count exchange + token all-to-all). r² and a 95 % interval of α (Student t, n − 2 degrees of "
        "freedom) need 3 runs or more.",
    ),
    (
        "Verdict",
        "At the operating point (the largest knob value) one MoE layer's time is split into: fixed latency (Σ α of "
        "dispatch and combine where α > 0 at the 95 % level), bandwidth (the rest of dispatch + combine), expert "
        "compute (mean over ranks) and imbalance (expert max − mean, plus the all-to-all time of the bytes the most "
        "loaded rank moves above the mean). The largest part is the verdict (docs/sweep.md).",
    ),
    (
        "Throughput, non-monotonic",
        "tokens/s = tokens of all ranks per step / step time. A change between neighbouring runs counts when it "
        "exceeds both 5 % and twice the largest step-time spread (interquartile range / median) of a run.",
    ),
    (
        "Exposed-comm ratio",
        "Per rank: Σ over steps of communication not hidden by compute / Σ step time; the maximum over ranks.",
    ),
)


def _layout(fig: go.Figure, title: str, xaxis: str, yaxis: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    return fig


def stage_fit_figure(result: SweepResult) -> go.Figure | None:
    """Median stage time per call (markers, with the step quartiles of the step) and fitted lines vs the knob."""
    res = result.residuals.filter(pl.col("layer").is_null() & (pl.col("x") == result.knob))
    if res.height == 0:
        return None
    fig = go.Figure()
    for stage in SWEEP_STAGES:
        r = res.filter(pl.col("stage") == stage).sort("x_value")
        if r.height == 0:
            continue
        color = _COLORS.get(stage, "#333")
        fig.add_trace(
            go.Scatter(x=r["x_value"].to_list(), y=(r["t_ns"] / 1e6).to_list(), mode="markers", name=f"{stage} best call",
                       marker={"color": color, "size": 9}, text=r["label"].to_list(),
                       hovertemplate="%{text}<br>%{x}: %{y:.3f} ms<extra>" + stage + "</extra>")
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(x=r["x_value"].to_list(), y=(r["fit_ns"] / 1e6).to_list(), mode="lines", name=f"{stage} fit",
                       line={"color": color, "dash": "dot"}, hoverinfo="skip")
        )  # fmt: skip
    return _layout(fig, f"Time of one call per stage vs {result.knob} (all layers)", result.knob, "ms per call")


def throughput_figure(result: SweepResult) -> go.Figure | None:
    """tokens/s per run against the knob."""
    r = result.runs.filter(pl.col("tokens_per_s").is_not_null() & pl.col("x").is_not_null())
    if r.height == 0:
        return None
    fig = go.Figure(
        go.Scatter(x=r["x"].to_list(), y=r["tokens_per_s"].to_list(), mode="lines+markers", text=r["label"].to_list(),
                   marker={"color": "#0072B2", "size": 9}, hovertemplate="%{text}<br>%{x}: %{y:.0f} tokens/s<extra></extra>")
    )  # fmt: skip
    return _layout(fig, f"Throughput vs {result.knob}", result.knob, "tokens per second (all ranks)", 340)


def residual_figure(result: SweepResult) -> go.Figure | None:
    """Residuals (measured − fit) per stage and run, ms."""
    res = result.residuals.filter(pl.col("layer").is_null() & (pl.col("x") == result.knob))
    if res.height == 0:
        return None
    fig = go.Figure()
    for stage in SWEEP_STAGES:
        r = res.filter(pl.col("stage") == stage).sort("x_value")
        if r.height:
            fig.add_trace(
                go.Bar(x=r["label"].to_list(), y=(r["residual_ns"] / 1e6).to_list(), name=stage,
                       marker_color=_COLORS.get(stage, "#333"))
            )  # fmt: skip
    fig.update_layout(barmode="group")
    return _layout(fig, "Residuals of the fits (measured − fitted)", "run", "ms", 320)


def exposed_figure(result: SweepResult) -> go.Figure | None:
    """Exposed-comm ratio per run."""
    r = result.runs.filter(pl.col("exposed_comm_ratio").is_not_null())
    if r.height == 0:
        return None
    fig = go.Figure(go.Bar(x=r["label"].to_list(), y=(r["exposed_comm_ratio"] * 100).to_list(), marker_color="#8c564b"))
    return _layout(fig, "Exposed communication per run (max over ranks)", "run", "% of step time", 300)


def _shares_table(result: SweepResult) -> str:
    v = result.verdict
    if v is None:
        return ""
    parts = v.evidence.get("parts_ns", {})
    shares = v.evidence.get("shares", {})
    rows = [
        [k.replace("_bound", "").replace("_", " "), fmt_ns(parts.get(k)), fmt_pct(shares.get(k))]
        for k in ("fixed_latency_bound", "bandwidth_bound", "expert_compute_bound", "imbalance_bound")
    ]
    return "<h3>One MoE layer at the operating point</h3>" + table_html(["part", "time", "share of the layer"], rows)


def _fits_table(result: SweepResult) -> str:
    f = result.fits
    if f.height == 0:
        return '<p class="note">No fit: fewer than 2 runs with distinct knob values for any stage.</p>'
    rows = []
    for r in f.iter_rows(named=True):
        unit = "ns/byte" if r["x"] == "bytes" else f"ns/{result.knob}"
        ci = (
            f"{fmt_ns(r['alpha_ci95_lo_ns'])} … {fmt_ns(r['alpha_ci95_hi_ns'])}"
            if r["alpha_ci95_lo_ns"] is not None
            else "–"
        )
        rows.append([
            r["stage"], "all" if r["layer"] is None else r["layer"], r["x"], fmt_ns(r["alpha_ns"]), ci,
            fmt_ns(r["alpha_per_a2a_ns"]) if r["alpha_per_a2a_ns"] is not None else "–",
            f"{r['beta_ns_per_unit']:.4g} {unit}", "–" if r["r2"] is None else f"{r['r2']:.3f}", r["n"], r["confidence"],
        ])  # fmt: skip
    return table_html(
        ["stage", "layer", "x", "α per call", "α 95 %", "α per all-to-all", "β", "r²", "n", "confidence"], rows, left=3
    )


def _runs_table(result: SweepResult) -> str:
    rows = []
    for r in result.runs.iter_rows(named=True):
        rows.append([
            r["label"], "–" if r["x"] is None else f"{r['x']:g}", r.get("cond_skew") or "–",
            r.get("cond_link_latency_ms") or "–", fmt_ns(r["step_time_ns"]),
            "–" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}", fmt_pct(r["exposed_comm_ratio"]),
            "–" if r["I_r"] is None else f"{r['I_r']:.2f}", r["source"],
        ])  # fmt: skip
    return table_html(
        ["run", result.knob, "skew", "link latency ms", "step time", "tokens/s", "exposed comm", "I_r", "from"], rows
    )


def _verdict_html(result: SweepResult) -> str:
    v = result.verdict
    if v is None:
        return (
            '<div class="verdict none"><div class="headline">No verdict for this sweep</div>'
            f'<div class="detail">{html.escape(" ".join(result.notes) or "Fewer than 2 distinct knob values.")}</div></div>'
        )
    ev = v.evidence
    conf = ev.get("fit_confidence")
    fits = ev.get("comm_fits", {})
    alpha_txt = "; ".join(
        f"{s}: α = {fmt_ns(f.get('alpha_ns'))} per call"
        + (f" ({fmt_ns(f.get('alpha_per_a2a_ns'))} per all-to-all)" if f.get("alpha_per_a2a_ns") else "")
        + (f", r² = {f['r2']:.2f}" if f.get("r2") is not None else "")
        for s, f in fits.items()
    )
    sev = "high" if (ev.get("shares", {}).get(v.kind) or 0) >= 0.5 else "medium"
    t = result.throughput
    thr = ""
    if t.get("monotonic") is False:
        thr = f" Throughput is non-monotonic in {result.knob}: it peaks at {t.get('peak_label')}."
    return (
        f'<div class="verdict {sev}"><div class="headline">{html.escape(v.kind.replace("_", " "))}: {html.escape(v.title)}</div>'
        f'<div class="detail">Remedy: {html.escape(v.remedy)}</div>'
        f'<div class="context">{html.escape(alpha_txt)}. Fit confidence: {html.escape(str(conf))}.{html.escape(thr)}</div></div>'
    )


def render_sweep(result: SweepResult, title: str = "ep-trace sweep", sources: Sequence[str] = ()) -> str:
    """The sweep page (module doc) as one HTML string."""
    from datetime import datetime, timezone

    bytes_note = ""
    b = result.fits.filter((pl.col("x") == "bytes") & pl.col("layer").is_null())
    if b.height:
        bytes_note = "<p class=\"note\">Against bytes moved per call: " + "; ".join(
            f"{r['stage']}: α = {fmt_ns(r['alpha_ns'])}, "
            + (f"{1.0 / r['beta_ns_per_unit']:.3g} GB/s" if r["beta_ns_per_unit"] and r["beta_ns_per_unit"] > 0 else "β ≤ 0")
            + (f" (r² = {r['r2']:.2f})" if r["r2"] is not None else "")
            for r in b.iter_rows(named=True)
        ) + f". Bytes at the operating point: {fmt_bytes(_op_bytes(result))}.</p>"  # fmt: skip
    sections = [
        ("verdict", "Verdict", _verdict_html(result) + _shares_table(result)),
        (
            "fits",
            f"Stage time vs {result.knob}",
            figure_html(stage_fit_figure(result), "fig-sweep-stages", "No stage times to fit.")
            + bytes_note
            + _fits_table(result),
        ),
        (
            "throughput",
            "Throughput",
            figure_html(throughput_figure(result), "fig-sweep-throughput", "No token counts, so no throughput.")
            + figure_html(exposed_figure(result), "fig-sweep-exposed", "No exposed-comm figures."),
        ),
        ("residuals", "Residuals", figure_html(residual_figure(result), "fig-sweep-residuals", "No residuals.")),
        (
            "runs",
            "Runs",
            _runs_table(result)
            + ("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in result.notes) + "</ul>" if result.notes else ""),
        ),
        (
            "definitions",
            "Definitions",
            "<dl>" + "".join(f"<dt>{k}</dt><dd>{d}</dd>" for k, d in _DEFINITIONS) + "</dl>",
        ),
    ]
    nav = "<nav>" + "".join(f'<a href="#{a}">{t}</a>' for a, t, _ in sections) + "</nav>"
    body = nav + "".join(f'<section id="{a}"><h2>{t}</h2>{h}</section>' for a, t, h in sections)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page(title, body, (f"{len(result.runs)} runs · " if result.runs.height else "") + f"generated {stamp}")


def _op_bytes(result: SweepResult) -> float | None:
    r = result.residuals.filter(
        (pl.col("x") == "bytes") & (pl.col("stage") == "dispatch") & pl.col("layer").is_null()
    ).sort("x_value")
    return float(r["x_value"][-1]) if r.height else None

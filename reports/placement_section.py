"""The report's EP invariants box (first on the page: a silent mis-routing is worse than a slow layer)
and its placement section: topology, the count matrix by link class, the α–β per link class, and the
recorded placement beside each proposal (per-rank load, cross-node bytes, predicted step)."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.placement_plan import scenario_stats
from ep_trace.analysis.result import Analysis
from ep_trace.reports.figure_style import apply_layout, neutral_shades
from ep_trace.reports.html_page import esc, figure_html, table_html
from ep_trace.reports.units import fmt_ns

__all__ = ["invariants_html", "invariants_line", "placement_html", "rank_load_by_placement", "SCENARIO_LABELS"]

SCENARIO_LABELS = {
    "current": "as recorded",
    "placement": "placement (balanced, replicas)",
    "node_local": "node_local (fewest cross-node bytes)",
}
_CHECK_WORDS = {
    "assignment_conservation": "assignment conservation",
    "ownership": "ownership",
    "split_consistency": "split consistency",
}


def invariants_line(analysis: Analysis) -> tuple[str, bool]:
    """``('EP invariants: assignment conservation ok (48 checked) · ...', any violated)``; ('', False) when
    nothing could be checked (no routing counts, no split lists)."""
    inv = analysis.ep_invariants
    if inv is None or inv.is_empty() or bool((inv["status"] == "not_checked").all()):
        return "", False
    parts = []
    for r in inv.iter_rows(named=True):
        words = _CHECK_WORDS.get(r["check"], r["check"])
        if r["status"] == "ok":
            parts.append(f"{words} ok ({r['checked']} checked)")
        elif r["status"] == "violated":
            parts.append(f"{words} VIOLATED ({r['violations']} of {r['checked']})")
        else:
            parts.append(f"{words} not checked")
    return "EP invariants: " + " · ".join(parts), bool((inv["status"] == "violated").any())


def invariants_html(analysis: Analysis) -> str:
    """The invariants line (the verdict box's first line, before any performance figure), and each
    check's detail when one is violated."""
    line, bad = invariants_line(analysis)
    if not line:
        return ""
    inv = analysis.ep_invariants
    assert inv is not None
    detail = ""
    if bad:
        items = inv.filter(pl.col("status") != "ok")
        detail = (
            "<ul>"
            + "".join(
                f"<li>{esc(_CHECK_WORDS.get(c, c))}: {esc(d)}</li>" for c, d in items.select("check", "detail").rows()
            )
            + "</ul>"
        )
    style = "color:#b00020" if bad else "color:#2e7d32"
    return f'<div class="invariants" id="ep-invariants" style="{style}"><b>{esc(line)}</b>{detail}</div>'


#: Ranks beyond which the per-rank load figure is left out (the comparison table says it all; a
#: grouped bar per rank and scenario at 1,024 ranks is unreadable and heavy).
MAX_FIGURE_RANKS = 128


def rank_load_by_placement(analysis: Analysis) -> go.Figure | None:
    """Grouped bars: each rank's expert load (rows per step) as recorded and under each proposal (None
    beyond :data:`MAX_FIGURE_RANKS` ranks)."""
    p = analysis.placement
    if p is None or p.is_empty() or p["rank"].n_unique() > MAX_FIGURE_RANKS:
        return None
    fig = go.Figure()
    scen = [s for s in SCENARIO_LABELS if s in set(p["scenario"].to_list())]
    for sc, color in zip(scen, neutral_shades(len(scen)), strict=True):
        d = p.filter(pl.col("scenario") == sc).sort("rank")
        fig.add_bar(
            x=[str(r) for r in d["rank"]],
            y=d["load"].to_list(),
            name=SCENARIO_LABELS[sc],
            marker_color=color,
            hovertemplate="rank %{x}: %{y:.0f} rows/step<extra>" + SCENARIO_LABELS[sc] + "</extra>",
        )
    fig.update_xaxes(title_text="rank", type="category")
    fig.update_yaxes(title_text="rows routed to the rank per step")
    return apply_layout(fig, "Expert load per rank: recorded placement and proposals", barmode="group")


def _compare_rows(analysis: Analysis) -> list[list[str]]:
    stats = scenario_stats(analysis.placement)
    wf = {r["scenario"]: r for r in analysis.whatif.iter_rows(named=True)} if analysis.whatif is not None else {}
    base = None
    if wf:
        r0 = next(iter(wf.values()))
        base = int(r0["predicted_step_ns"]) + int(r0["saving_ns"])
    rows = []
    for sc in SCENARIO_LABELS:
        s = stats.get(sc)
        if s is None:
            continue
        w = wf.get(sc)
        pred = base if sc == "current" else (int(w["predicted_step_ns"]) if w else None)
        sav = None if sc == "current" or w is None else int(w["saving_ns"])
        saving = "–" if sav is None else fmt_ns(sav) if sav >= 0 else f"{fmt_ns(-sav)} slower"
        rows.append(
            [
                SCENARIO_LABELS[sc],
                str(int(s["max_experts_per_rank"])),
                f"{s['max_load']:.0f}",
                f"{s['mean_load']:.0f}",
                "–" if s["I_r"] is None else f"{s['I_r']:.3g}",
                f"{s['cross_node_bytes'] / 1e6:.3g} MB",
                "–" if pred is None else fmt_ns(pred),
                saving,
            ]
        )
    return rows


def _num(x: float) -> str:
    """3 significant digits without an exponent below 10⁶ (``1000``, not ``1e+03``)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _link_tables(analysis: Analysis) -> str:
    out = ""
    lb = analysis.link_bytes
    if lb is not None and lb.height:
        rows = [
            [
                str(r["layer"]),
                r["direction"],
                r["link_class"].replace("_", " "),
                f"{r['rows']:.0f}",
                f"{r['bytes'] / 1e6:.3g} MB",
            ]
            for r in lb.iter_rows(named=True)
        ]
        out += "<h3>Count matrix by link class (per layer, mean per step)</h3>" + table_html(
            ["layer", "direction", "link class", "rows", "bytes"], rows, left=3
        )
    lc = analysis.link_costs
    if lc is not None and lc.height:
        rows = [
            [
                r["link_class"].replace("_", " "),
                f"{r['alpha_us']:.1f} µs ({r['alpha_source']})",
                f"{_num(r['beta_gbps'])} GB/s ({r['beta_source']})",
                "–" if r["r2"] is None else f"{r['r2']:.3f}",
                str(r["n"]),
            ]
            for r in lc.iter_rows(named=True)
        ]
        out += "<h3>Cost of each link class (T = α of the farthest class + Σ bytes / β)</h3>" + table_html(
            ["link class", "α", "β", "r²", "transfers"], rows, left=1
        )
    return out


def placement_html(analysis: Analysis) -> str:
    """The placement section (empty string when the analysis has neither routing counts nor topology)."""
    parts = []
    t = analysis.topology
    if t is not None and t.height:
        nodes = t.group_by("node", maintain_order=True).agg(pl.col("rank"))
        src = ", ".join(sorted(set(t["source"].to_list())))
        parts.append(
            f'<p class="note">{nodes.height} node(s) ({esc(src)}): '
            + "; ".join(f"{esc(n)}: ranks {esc(', '.join(map(str, r)))}" for n, r in nodes.rows())
            + "</p>"
        )
    parts.append(_link_tables(analysis))
    rows = _compare_rows(analysis)
    if rows:
        recorded = analysis.placement is not None and bool(analysis.placement["recorded"][0])
        parts.append(
            "<h3>Recorded placement and proposals</h3>"
            + ("" if recorded else '<p class="note">No placement was recorded: the contiguous default is assumed.</p>')
            + table_html(
                [
                    "placement",
                    "experts per rank (max)",
                    "max load",
                    "mean load",
                    "max / mean",
                    "cross-node / step",
                    "predicted step",
                    "saving / step",
                ],
                rows,
                left=1,
            )
            + figure_html(
                rank_load_by_placement(analysis),
                "fig-placement-load",
                f"More than {MAX_FIGURE_RANKS} ranks: the per-rank load is in the table below (first 64 ranks).",
            )
            + _per_rank_table(analysis)
        )
    return "".join(parts)


def _per_rank_table(analysis: Analysis, max_rows: int = 64) -> str:
    p = analysis.placement
    assert p is not None
    wide = p.pivot(on="scenario", index=["rank", "node"], values=["experts", "load"], aggregate_function="first")
    scen = [s for s in SCENARIO_LABELS if f"load_{s}" in wide.columns]
    rows = []
    for r in wide.sort("rank").head(max_rows).iter_rows(named=True):
        row = [str(r["rank"]), str(r["node"])]
        for sc in scen:
            row += [", ".join(map(str, r[f"experts_{sc}"] or [])), f"{r[f'load_{sc}']:.0f}"]
        rows.append(row)
    heads = ["rank", "node"] + [h for sc in scen for h in (f"experts ({sc})", f"load ({sc})")]
    return table_html(heads, rows, left=2)

"""The communication figures: overlap of communication with compute (per rank, per stage, or one
sentence when nothing is hidden), barrier wait vs transfer per rank, the wait matrix and the α–β
fit of transfer time vs message size (thinned to ``max_points`` calls per link class).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.figure_style import (
    MS,
    TRACK_COLORS,
    apply_layout,
    n_ranks,
    neutral_shades,
    stage_order,
    step_count,
)
from ep_trace.reports.heatmaps import binned_matrix, zero_based_heatmap
from ep_trace.reports.plot_layout import axis_px as _axis_px
from ep_trace.reports.rank_axis import aggregate, rank_axis
from ep_trace.reports.units import fmt_ns

__all__ = [
    "overlap_sentence",
    "overlap_per_rank",
    "overlap_per_stage",
    "barrier_wait_per_rank",
    "wait_matrix_heatmap",
    "MIN_FIT_R2",
    "alpha_beta_conclusive",
    "alpha_beta_scatter",
]


def _rank_bars(analysis: Analysis, df: pl.DataFrame, values: list[str]) -> tuple[list[str], pl.DataFrame, str]:
    """(bar labels, per-bar means of ``values``, x-axis title) on a readable rank axis (reports/rank_axis.py)."""
    axis = rank_axis(analysis.tables.ranks.select("rank", "host"), analysis.rank_summary.select("rank", "step_time_ns"))
    agg = aggregate(df.select("rank", *values), axis, values).with_columns(pl.col(v).fill_null(0) for v in values)
    title = "rank" if not axis.aggregated else f"rank (mean per {axis.how}; the slowest ranks on their own)"
    return agg["group"].to_list(), agg, title


def overlap_sentence(analysis: Analysis) -> str | None:
    """One sentence instead of the overlap figures when they would only say "0%" (or nothing).

    None when the figures carry information (some comm is hidden under compute).
    """
    rs = analysis.rank_summary
    if rs.height == 0 or rs["comm_ns"].fill_null(0).sum() == 0:
        return "No communication intervals were found, so there is nothing to overlap."
    comm = rs["comm_ns"].fill_null(0).cast(pl.Float64)
    hidden = comm - rs["exposed_comm_ns"].fill_null(0).cast(pl.Float64)
    if float(hidden.sum()) > 0:
        return None
    worst = rs.sort("exposed_comm_ns", descending=True, nulls_last=True).row(0, named=True)
    return (
        f"No communication is hidden under compute on any rank (overlap efficiency 0%): all of it is exposed, "
        f"up to {fmt_ns(worst['exposed_comm_ns'] or 0)} per step on rank {worst['rank']}."
    )


def _stacked_rank_bars(
    analysis: Analysis, df: pl.DataFrame, series: list[tuple[str, str, str]], title: str
) -> go.Figure:
    """Per-rank stacked bars in ms per step; ``series`` = (column in ns, legend name, track colour key)."""
    x, agg, xtitle = _rank_bars(analysis, df, [c for c, _, _ in series])
    bars = [
        go.Bar(name=name, x=x, y=np.round(agg[c].to_numpy() / MS, 4), marker_color=TRACK_COLORS[colour])
        for c, name, colour in series
    ]
    fig = go.Figure(bars)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(type="category", title_text=xtitle)
    fig.update_yaxes(title_text="ms per step")
    return apply_layout(fig, title, height=380, axis_px=_axis_px(x))


def overlap_per_rank(analysis: Analysis) -> go.Figure | None:
    """Per rank: communication hidden under compute (|C ∩ K|) vs exposed (|C \\ K|), ms per step (mean over steps).

    None when no comm is hidden anywhere (the page says so in one sentence, :func:`overlap_sentence`).
    """
    if overlap_sentence(analysis) is not None:
        return None
    rs = analysis.rank_summary.with_columns(
        (pl.col("comm_ns").fill_null(0) - pl.col("exposed_comm_ns").fill_null(0)).alias("_hidden"),
        pl.col("exposed_comm_ns").fill_null(0).alias("_exposed"),
    )
    series = [("_hidden", "overlapped |C ∩ K|", "overlapped"), ("_exposed", "exposed |C \\ K|", "exposed_comm")]
    return _stacked_rank_bars(analysis, rs, series, "Communication per rank: overlapped vs exposed")


def overlap_per_stage(analysis: Analysis) -> go.Figure | None:
    """Per stage: overlapped vs exposed comm, ms per step, mean over ranks (hover: max over ranks).

    None when no stage hides any comm (the figure would only say 0%).
    """
    st = analysis.stages.filter(pl.col("step").is_not_null())  # analysed steps only
    if st.height == 0 or not {"comm_ns", "exposed_comm_ns"} <= set(st.columns) or st["comm_ns"].fill_null(0).sum() == 0:
        return None
    if overlap_sentence(analysis) is not None:
        return None
    n_steps = step_count(analysis)
    per_rank = st.group_by("stage", "rank").agg(
        pl.col("comm_ns").sum() / n_steps, pl.col("exposed_comm_ns").sum() / n_steps
    )
    agg = per_rank.group_by("stage").agg(
        pl.col("comm_ns").mean(), pl.col("exposed_comm_ns").mean(), pl.col("exposed_comm_ns").max().alias("exposed_max")
    )
    agg = agg.filter(pl.col("comm_ns") > 0)
    order = stage_order(agg["stage"].to_list())
    agg = pl.DataFrame({"stage": order}).join(agg, on="stage", how="left")
    comm = agg["comm_ns"].to_numpy()
    exp_ = agg["exposed_comm_ns"].to_numpy()
    fig = go.Figure(
        [
            go.Bar(
                name="overlapped |C ∩ K|",
                x=order,
                y=np.round((comm - exp_) / MS, 4),
                marker_color=TRACK_COLORS["overlapped"],
            ),
            go.Bar(
                name="exposed |C \\ K|",
                x=order,
                y=np.round(exp_ / MS, 4),
                marker_color=TRACK_COLORS["exposed_comm"],
                customdata=np.round(agg["exposed_max"].to_numpy() / MS, 4),
                hovertemplate="%{x}: exposed %{y:.3f} ms (max rank %{customdata:.3f} ms)<extra></extra>",
            ),
        ]
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="stage")
    fig.update_yaxes(title_text="ms per step (mean over ranks)")
    return apply_layout(fig, "Communication per stage: overlapped vs exposed", height=340)


def barrier_wait_per_rank(analysis: Analysis) -> go.Figure | None:
    """Per rank: time in collectives split into barrier wait (a − s_r) and transfer, ms per step."""
    rs = analysis.rank_summary
    if (
        rs.height == 0
        or (cast(int, rs["barrier_wait_ns"].fill_null(0).sum()) + cast(int, rs["transfer_ns"].fill_null(0).sum())) == 0
    ):
        return None
    series = [("barrier_wait_ns", "barrier wait", "wait"), ("transfer_ns", "transfer", "transfer")]
    return _stacked_rank_bars(analysis, rs, series, "Collective time per rank: barrier wait vs transfer")


def wait_matrix_heatmap(analysis: Analysis, max_cells: int = 64) -> go.Figure | None:
    """N×N wait matrix: M[i][j] = ms rank i waited for rank j (the last arriver), total over calls."""
    wm = analysis.wait_matrix
    if wm.height == 0 or wm["wait_ns"].sum() == 0:
        return None
    n = max(n_ranks(analysis), int(wm["waiter"].max()) + 1, int(wm["waited_for"].max()) + 1)  # type: ignore[arg-type]
    z, labels, size = binned_matrix(wm, "waiter", "waited_for", "wait_ns", n, max_cells)
    # no "vs mean" view: most cells are 0 by construction (only the last arriver is waited for)
    fig = zero_based_heatmap(
        z / MS, labels, labels, "ms", "rank %{y} waited %{z:.3f} ms for rank %{x}<extra></extra>", vs_mean=False
    )
    fig.update_xaxes(title_text="waited for (last arriver)", type="category")
    fig.update_yaxes(title_text="waiting rank", autorange="reversed", type="category")
    title = "Wait matrix (ms, total over calls)" + (f", ranks binned by {size}" if size > 1 else "")
    return apply_layout(fig, title, height=440)


#: r² from which an α–β fit is drawn and trusted (below: the scatter says "inconclusive").
MIN_FIT_R2 = 0.8


def alpha_beta_conclusive(fit: dict | None) -> bool:
    """True when a fitted α–β row explains the scatter (r² >= :data:`MIN_FIT_R2`, enough calls)."""
    if not fit or fit.get("verdict") == "insufficient_data":
        return False
    r2 = fit.get("r2")
    return r2 is not None and r2 == r2 and float(r2) >= MIN_FIT_R2 and bool(fit.get("beta_gbps"))


def alpha_beta_scatter(analysis: Analysis, max_points: int = 4000) -> go.Figure | None:
    """Wait-free transfer time vs bytes per call, per link class; the fitted T = α + B/β line only
    when the fit is conclusive (:func:`alpha_beta_conclusive`), else the legend says "inconclusive"."""
    calls = analysis.calls
    if calls.height == 0:
        return None
    pts = calls.filter(
        pl.col("bytes_max").is_not_null() & (pl.col("bytes_max") > 0) & pl.col("transfer_ns").is_not_null()
    )
    if pts.height == 0:
        return None
    fig = go.Figure()
    fits = {r["link_class"]: r for r in analysis.alpha_beta.iter_rows(named=True)} if analysis.alpha_beta.height else {}
    shades = neutral_shades(3)
    for i, cls in enumerate(sorted(pts["link_class"].fill_null("unknown").unique().to_list())):
        sub = pts.filter(pl.col("link_class").fill_null("unknown") == cls)
        if sub.height > max_points:  # thin deterministically to bound the page size
            sub = sub.gather_every(int(np.ceil(sub.height / max_points)))
        fit = fits.get(cls)
        ok = alpha_beta_conclusive(fit)
        r2 = fit.get("r2") if fit else None
        tag = "" if ok else (f" (fit inconclusive, r² = {r2:.2f})" if r2 is not None and r2 == r2 else " (no fit)")
        fig.add_trace(
            go.Scatter(
                name=f"{cls} calls{tag}",
                x=sub["bytes_max"].to_numpy(),
                y=np.round(sub["transfer_ns"].to_numpy() / 1e3, 3),
                mode="markers",
                marker={"size": 5, "opacity": 0.6, "color": shades[i % 3]},
                hovertemplate="%{x} B in %{y:.1f} µs<extra></extra>",
            )
        )
        if ok and fit is not None:
            bx = np.linspace(0, float(sub["bytes_max"].max()), 50)  # type: ignore[arg-type]
            by = fit["alpha_us"] + bx / (fit["beta_gbps"] * 1e9) * 1e6
            fig.add_trace(
                go.Scatter(
                    name=f"{cls} fit: α={fit['alpha_us']:.1f} µs, β={fit['beta_gbps']:.2f} GB/s, r²={fit['r2']:.2f} "
                    f"({str(fit['verdict']).replace('_', ' ')})",
                    x=np.round(bx, 1),
                    y=np.round(by, 3),
                    mode="lines",
                    line={"color": "#000000", "dash": "dash"},
                )
            )
    fig.update_xaxes(title_text="bytes per rank per call (B, max of sent and received)")
    fig.update_yaxes(title_text="wait-free transfer time (µs)")
    return apply_layout(fig, "α–β fit: transfer time vs message size", height=380)

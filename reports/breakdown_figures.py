"""The time-breakdown figure, the top kernel / CPU op tables and the critical-path overlay.

Read only :class:`~ep_trace.analysis.result.Analysis` frames: ``breakdown``, ``top_kernels``,
``top_ops`` (issue 13) and, when another analysis fills it, ``critical_path`` (rank, start_ns,
end_ns on the aligned clock, cause, stage, name). Colours come from :mod:`ep_trace.reports.palette`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.palette import cause_color
from ep_trace.reports.plot_layout import axis_px, legend_below
from ep_trace.reports.rank_axis import aggregate, rank_axis
from ep_trace.reports.units import fmt_ns

__all__ = ["PART_LABELS", "time_breakdown", "breakdown_sentence", "top_table", "critical_path_of", "add_critical_path"]

MS = 1e6
#: breakdown column -> legend label (display order = stacking order, bottom first).
PART_LABELS: dict[str, str] = {
    "compute_ns": "compute",
    "overlapped_comm_ns": "overlapped comm",
    "exposed_comm_ns": "exposed comm",
    "barrier_wait_ns": "barrier wait",
    "copy_ns": "copy",
    "host_stall_ns": "host stall",
    "idle_ns": "idle",
}
CRITICAL_CAUSES = ("compute", "copy", "transfer", "barrier_wait", "host_stall", "launch_gap", "queued", "unexplained")


def _per_rank(analysis: Analysis) -> pl.DataFrame | None:
    b = analysis.breakdown
    if b is None or b.height == 0:
        return None
    cols = [*PART_LABELS, "step_time_ns"]
    return b.group_by("rank").agg(pl.col(c).cast(pl.Float64).mean() for c in cols).sort("rank")


def breakdown_sentence(analysis: Analysis) -> str | None:
    """A one-line reading of the breakdown: the largest part over the job and the rank where it is largest."""
    per = _per_rank(analysis)
    if per is None:
        return None
    tot = {c: float(per[c].sum()) for c in PART_LABELS}
    step = float(per["step_time_ns"].sum()) or 1.0
    top = max(tot, key=lambda c: tot[c])
    worst = per.sort(top, descending=True).row(0, named=True)
    shares = ", ".join(f"{PART_LABELS[c]} {tot[c] / step:.0%}" for c in PART_LABELS if tot[c] / step >= 0.005)
    return (
        f"Mean over ranks and steps: {shares}. Largest part: {PART_LABELS[top]}, most on rank {worst['rank']} "
        f"({fmt_ns(worst[top])} of a {fmt_ns(worst['step_time_ns'])} step)."
    )


def time_breakdown(analysis: Analysis) -> go.Figure | None:
    """Per rank, where the step goes: the parts of ``Analysis.breakdown`` stacked, ms per step
    (mean over steps); they add up to the rank's step time. Large jobs: the rank axis groups ranks
    per host or block of ranks (means) and keeps the slowest ranks on their own (reports/rank_axis.py).
    """
    per = _per_rank(analysis)
    if per is None:
        return None
    axis = rank_axis(
        analysis.tables.ranks.select("rank", "host"), per.select("rank", "step_time_ns"), max_bars=64, keep_slowest=8
    )
    agg = aggregate(per, axis, [*PART_LABELS, "step_time_ns"])
    x = agg["group"].to_list()
    step = agg["step_time_ns"].to_numpy()
    fig = go.Figure()
    for col, label in PART_LABELS.items():
        y = agg[col].to_numpy()
        if col == "copy_ns" and not y.any():  # no device copies (every CPU trace): no empty legend entry
            continue
        share = np.divide(y, step, out=np.zeros_like(y), where=step > 0) * 100
        fig.add_trace(
            go.Bar(
                name=label,
                x=x,
                y=np.round(y / MS, 4),
                marker_color=cause_color(col),
                customdata=np.round(share, 1),
                hovertemplate=f"%{{x}}: {label} %{{y:.3f}} ms (%{{customdata}}% of the step)<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    xtitle = "rank" if not axis.aggregated else f"rank (mean per {axis.how}; the 8 slowest ranks on their own)"
    fig.update_xaxes(type="category", title_text=xtitle)
    fig.update_yaxes(title_text="ms per step (mean over steps)")
    fig.update_layout(
        title={"text": "Where each rank's step goes (parts add up to the step)", "x": 0.01, "font": {"size": 15}},
        template="plotly_white",
        height=420,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return legend_below(fig, axis_px(x))


def top_table(frame: pl.DataFrame | None, analysis: Analysis, n: int = 15) -> pl.DataFrame:
    """Top entries over all ranks: name, stage, ms per rank per step, count per rank per step,
    and the rank where the name costs most. Columns ``name, stage, per_rank_step_ns, count_per_step,
    max_rank, max_rank_ns``."""
    if frame is None or frame.height == 0:
        return pl.DataFrame(
            schema={
                "name": pl.Utf8,
                "stage": pl.Utf8,
                "per_rank_step_ns": pl.Float64,
                "count_per_step": pl.Float64,
                "max_rank": pl.Int32,
                "max_rank_ns": pl.Float64,
            }
        )
    n_ranks = max(int(frame["rank"].n_unique()), 1)
    n_steps = max(int(analysis.steps["step"].n_unique()) if analysis.steps.height else 1, 1)
    worst = (
        frame.sort(["total_ns", "rank"], descending=[True, False])
        .unique("name", keep="first")
        .select("name", pl.col("rank").alias("max_rank"), (pl.col("total_ns") / n_steps).alias("max_rank_ns"))
    )
    stage = (
        frame.group_by("name", "stage")
        .agg(pl.col("total_ns").sum().alias("_t"))
        .sort(["_t", "stage"], descending=[True, False], nulls_last=True)
        .unique("name", keep="first")
        .select("name", "stage")
    )
    return (
        frame.group_by("name")
        .agg(
            (pl.col("total_ns").sum() / n_ranks / n_steps).alias("per_rank_step_ns"),
            (pl.col("count").sum() / n_ranks / n_steps).alias("count_per_step"),
        )
        .join(stage, on="name", how="left")
        .join(worst, on="name", how="left")
        .sort("per_rank_step_ns", "name", descending=[True, False])
        .head(n)
        .select("name", "stage", "per_rank_step_ns", "count_per_step", "max_rank", "max_rank_ns")
    )


def critical_path_of(analysis: Analysis, step: int | None) -> pl.DataFrame | None:
    """The critical path segments of ``step`` (``Analysis.critical_path`` from the verdict analysis,
    when present and non-empty), else None."""
    cp = getattr(analysis, "critical_path", None)
    if not isinstance(cp, pl.DataFrame) or cp.height == 0:
        return None
    if step is not None and "step" in cp.columns:
        cp = cp.filter(pl.col("step") == step)
    return cp if cp.height else None


def add_critical_path(fig: go.Figure, cp: pl.DataFrame, t0: int, y: float, row_px: float) -> list[str]:
    """Draw critical-path segments as one row at ``y`` (ms since ``t0``), coloured by cause.

    Returns the causes drawn (legend order).
    """
    has = set(cp.columns)
    d = cp.with_columns(
        ((pl.col("start_ns") - t0) / MS).alias("x0"),
        ((pl.col("end_ns") - t0) / MS).alias("x1"),
        pl.col("cause").cast(pl.Utf8).fill_null("unexplained"),
    )
    drawn = []
    for cause in [c for c in CRITICAL_CAUSES if c in set(d["cause"].to_list())] + sorted(
        set(d["cause"].to_list()) - set(CRITICAL_CAUSES)
    ):
        sub = d.filter(pl.col("cause") == cause)
        nan = np.full(sub.height, np.nan)
        xs = np.round(np.column_stack([sub["x0"].to_numpy(), sub["x1"].to_numpy(), nan]).ravel(), 4)
        ys = np.column_stack([np.full(sub.height, y), np.full(sub.height, y), nan]).ravel()
        parts: list[Any] = [pl.lit("rank "), pl.col("rank").cast(pl.Utf8), pl.lit(f": {cause}")]
        if "stage" in has:
            parts += [pl.lit(" · "), pl.col("stage").cast(pl.Utf8).fill_null("–")]
        if "name" in has:
            parts += [pl.lit(" · "), pl.col("name").cast(pl.Utf8).fill_null("")]
        text = sub.select(pl.concat_str(parts)).to_series().to_list()
        fig.add_trace(
            go.Scatter(
                name=f"critical path: {cause.replace('_', ' ')}",
                x=xs,
                y=ys,
                mode="lines",
                line={"width": max(0.8 * row_px, 2.0), "color": cause_color(cause)},
                hoverinfo="name",
                legendgroup="critical",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=np.round((sub["x0"] + sub["x1"]).to_numpy() / 2, 4),
                y=np.full(sub.height, y),
                mode="markers",
                marker={"size": 6, "opacity": 0},
                hovertext=text,
                hoverinfo="text",
                showlegend=False,
                legendgroup="critical",
                name=f"critical path: {cause} (hover)",
            )
        )
        drawn.append(cause)
    return drawn

"""The timeline figure: one step, per rank, stage ranges, communication with barrier wait on top,
exposed communication and, when the analysis has one, the critical path. Large jobs stay
openable: :func:`timeline_selection` draws a sample of ranks and drops the shortest intervals
beyond a budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.breakdown_figures import add_critical_path, critical_path_of
from ep_trace.reports.figure_style import MS, TRACK_COLORS, apply_layout, stage_order
from ep_trace.reports.palette import STAGE_COLORS  # one palette for every figure

__all__ = ["TimelineSelection", "timeline_selection", "step_timeline"]


@dataclass(frozen=True)
class TimelineSelection:
    """Which step and ranks the timeline draws.

    Attributes:
        step: The representative step (the one whose slowest-rank length is the median).
        ranks: Ranks drawn, ascending.
        n_ranks_total: Ranks in the analysis.
        min_interval_ns: Intervals shorter than this were left out to bound the page size (0 = none).
    """

    step: int | None
    ranks: tuple[int, ...]
    n_ranks_total: int
    min_interval_ns: int = 0

    @property
    def sampled(self) -> bool:
        """True when not every rank is drawn."""
        return len(self.ranks) < self.n_ranks_total


def timeline_selection(analysis: Analysis, max_intervals: int = 20_000) -> TimelineSelection:
    """Choose the timeline's step and ranks.

    The step is ``config.representative_step`` when given, else the step whose length on its slowest
    rank is the median over steps. With more than ``config.max_timeline_ranks`` ranks, the ranks that
    induce the most wait (stragglers) and the ranks that wait most are kept first, then evenly spaced
    ranks fill the budget.
    """
    iv = analysis.intervals
    all_ranks = sorted(set(analysis.rank_summary["rank"].to_list()) | set(iv["rank"].unique().to_list()))
    step: int | None = analysis.config.representative_step
    if step is None:
        if analysis.steps.height:
            per = analysis.steps.group_by("step").agg(pl.col("step_time_ns").max()).sort("step_time_ns", "step")
            step = int(per["step"][(per.height - 1) // 2])
        elif iv.height:
            step = cast(int, iv["step"].drop_nulls().min()) if iv["step"].drop_nulls().len() else None
    budget = max(int(analysis.config.max_timeline_ranks), 1)
    if len(all_ranks) <= budget:
        chosen = list(all_ranks)
    else:
        first: list[int] = []
        if analysis.stragglers.height:
            first += analysis.stragglers.sort("induced_wait_ns", descending=True)["rank"].head(2).to_list()
        if analysis.rank_summary.height:
            first += analysis.rank_summary.sort("barrier_wait_ns", descending=True)["rank"].head(1).to_list()
        first = list(dict.fromkeys(int(r) for r in first))[: budget // 2]
        rest = [r for r in all_ranks if r not in first]
        idx = np.linspace(0, len(rest) - 1, budget - len(first)).round().astype(int)
        chosen = sorted(set(first) | {rest[i] for i in idx})
    sel = iv.filter(pl.col("rank").is_in(chosen))
    if step is not None:
        sel = sel.filter(pl.col("step") == step)
    min_ns = 0
    if sel.height > max_intervals:
        durs = np.sort((sel["end_ns"] - sel["start_ns"]).to_numpy())[::-1]
        min_ns = int(durs[max_intervals - 1]) + 1
    return TimelineSelection(step, tuple(int(r) for r in chosen), len(all_ranks), min_ns)


def _segments(x0: np.ndarray, x1: np.ndarray, yc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Horizontal segments as one NaN-separated polyline (drawn as ONE SVG path, not one per bar)."""
    nan = np.full(len(x0), np.nan)
    return np.round(np.column_stack([x0, x1, nan]).ravel(), 4), np.column_stack([yc, yc, nan]).ravel()


def step_timeline(
    analysis: Analysis, selection: TimelineSelection | None = None, hover_limit: int = 1500
) -> go.Figure | None:
    """Per-rank timeline of one step: stage ranges, comm (with barrier wait on top) and exposed comm.

    Time is ms since the start of the step on the earliest drawn rank. Three rows per rank:
    ``stages``, ``comm`` (grey = communication, red = waiting for the last arriver), ``exposed``
    (comm not hidden under compute). Each kind of interval is one scatter trace of wide line
    segments (3 points per interval, NaN-separated) so thousands of intervals stay one SVG path;
    per-interval hover labels are added up to ``hover_limit`` intervals.
    """
    sel = selection or timeline_selection(analysis)
    iv = analysis.intervals.filter(pl.col("rank").is_in(list(sel.ranks)))
    if sel.step is not None:
        iv = iv.filter(pl.col("step") == sel.step)
    iv = iv.filter((pl.col("end_ns") - pl.col("start_ns")) >= sel.min_interval_ns)
    row_of = {"stage": "stages", "comm": "comm", "wait": "comm", "exposed_comm": "exposed"}
    iv = iv.filter(pl.col("track").is_in(list(row_of)))
    if iv.height == 0:
        return None
    t0 = int(iv["start_ns"].min())  # type: ignore[arg-type]
    cp = critical_path_of(analysis, sel.step)  # the verdict analysis' critical path, when it is there
    order = [f"r{r} {k}" for r in sel.ranks for k in ("stages", "comm", "exposed")]
    if cp is not None:
        t0 = min(t0, int(cp["start_ns"].min()))  # type: ignore[arg-type]
        order = ["critical path", *order]
    ypos = {label: float(len(order) - 1 - i) for i, label in enumerate(order)}
    iv = iv.with_columns(
        ((pl.col("start_ns") - t0) / MS).alias("x0"),
        ((pl.col("end_ns") - t0) / MS).alias("x1"),
        (pl.lit("r") + pl.col("rank").cast(pl.Utf8) + pl.lit(" ") + pl.col("track").replace_strict(row_of)).alias(
            "row"
        ),
    ).with_columns(pl.col("row").replace_strict(ypos, return_dtype=pl.Float64).alias("y"))
    hover = iv.height <= hover_limit
    fig = go.Figure()

    height = 150 + 16 * len(order)
    row_px = (height - 100) / max(len(order), 1)  # plot-area pixels per row

    def add(sub: pl.DataFrame, name: str, color: str, half: float) -> None:
        if sub.height == 0:
            return
        xs, ys = _segments(sub["x0"].to_numpy(), sub["x1"].to_numpy(), sub["y"].to_numpy())
        # a segment stroked as wide as the bar: far cheaper for the browser than filled polygons
        fig.add_trace(
            go.Scatter(
                name=name,
                x=xs,
                y=ys,
                mode="lines",
                line={"width": max(2.0 * half * row_px, 1.0), "color": color},
                hoverinfo="name",
                legendgroup=name,
            )
        )
        if hover:
            mid = ((sub["x0"] + sub["x1"]) / 2).round(4).to_numpy()
            text = (
                sub.select(pl.format("{}: {} µs", "name", ((pl.col("x1") - pl.col("x0")) * 1000).round(1)))
                .to_series()
                .to_list()
            )
            fig.add_trace(
                go.Scatter(
                    x=mid,
                    y=sub["y"].to_numpy(),
                    mode="markers",
                    marker={"size": 6, "opacity": 0},
                    hovertext=text,
                    hoverinfo="text",
                    showlegend=False,
                    legendgroup=name,
                    name=f"{name} (hover)",
                )
            )

    stages = iv.filter(pl.col("track") == "stage").with_columns(
        pl.col("name").str.extract(r"^(?:ep:)?([a-z_]+)", 1).fill_null(pl.col("name")).alias("stage")
    )
    for stage in stage_order(stages["stage"].unique().to_list()):
        add(stages.filter(pl.col("stage") == stage), stage, STAGE_COLORS.get(stage, "#999999"), 0.4)
    add(iv.filter(pl.col("track") == "comm"), "comm", TRACK_COLORS["comm"], 0.4)
    add(iv.filter(pl.col("track") == "wait"), "barrier wait", TRACK_COLORS["wait"], 0.22)
    add(iv.filter(pl.col("track") == "exposed_comm"), "exposed comm", TRACK_COLORS["exposed_comm"], 0.4)
    if cp is not None:
        add_critical_path(fig, cp, t0, ypos["critical path"], row_px)
    fig.update_yaxes(
        tickvals=list(ypos.values()),
        ticktext=list(ypos),
        range=[-0.6, len(order) - 0.4],
        showgrid=False,
        zeroline=False,
    )
    fig.update_xaxes(title_text="ms since step start")
    fig.update_yaxes(title_text="rank, row")
    title = f"Timeline of step {sel.step}" if sel.step is not None else "Timeline"
    if sel.sampled:
        title += f" ({len(sel.ranks)} of {sel.n_ranks_total} ranks)"
    return apply_layout(fig, title, height=height, hovermode="closest")

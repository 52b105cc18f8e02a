"""The stage breakdown figure: per-rank × stage busy and window time (the "Where the time goes"
section, beside :func:`ep_trace.reports.breakdown_figures.time_breakdown`). Bars up to 32 ranks,
a heatmap beyond.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.figure_style import MS, apply_layout, stage_order
from ep_trace.reports.heatmaps import zero_based_heatmap
from ep_trace.reports.palette import STAGE_COLORS  # one palette for every figure
from ep_trace.reports.rank_axis import aggregate, rank_axis

__all__ = ["stage_breakdown"]


def stage_breakdown(analysis: Analysis, max_bar_ranks: int = 32) -> go.Figure | None:
    """Per-rank × stage busy and window time, ms per step (P50 over steps).

    Up to ``max_bar_ranks`` ranks: each rank has two stacked columns, ``busy`` (|union of the
    stage's device intervals|) and ``window`` (first start → last end); a window longer than busy
    time means idle gaps (waiting). Beyond that, a (stage busy / window) × rank heatmap, which stays
    readable and light for hundreds of ranks.
    """
    st = analysis.stages.filter(pl.col("step").is_not_null())  # analysed steps only (not a setup range)
    if st.height == 0:
        return None
    per = (
        st.group_by("rank", "step", "stage")
        .agg(pl.col("busy_ns").sum(), pl.col("window_ns").sum())
        .group_by("rank", "stage")
        # P50, not the mean: a warm-up step (often 10x longer) must not dominate the typical picture.
        .agg(pl.col("busy_ns").median(), pl.col("window_ns").median())
        .sort("rank")
    )
    ranks = per["rank"].unique().sort().to_list()
    stages = stage_order(per["stage"].unique().to_list())
    grid = pl.DataFrame({"rank": ranks}, schema={"rank": per.schema["rank"]})

    def column(stage: str, what: str) -> np.ndarray:
        sub = grid.join(per.filter(pl.col("stage") == stage), on="rank", how="left").fill_null(0)
        return sub[what].to_numpy() / MS

    fig = go.Figure()
    if len(ranks) > max_bar_ranks:
        rows = [(f"{s} {w}", f"{s}_{w}") for s in stages for w in ("busy", "window")]
        wide = grid.with_columns(
            **{f"{s}_{w}": pl.Series(column(s, f"{w}_ns")) for s in stages for w in ("busy", "window")}
        )
        axis = rank_axis(
            analysis.tables.ranks.select("rank", "host"), analysis.rank_summary.select("rank", "step_time_ns")
        )
        agg = aggregate(wide, axis, [c for _, c in rows])
        fig = zero_based_heatmap(
            np.vstack([agg[c].to_numpy() for _, c in rows]),
            agg["group"].to_list(),
            [n for n, _ in rows],
            "ms",
            "%{y} on %{x}: %{z:.3f} ms per step<extra></extra>",
        )
        fig.update_yaxes(autorange="reversed", type="category", title_text="stage, busy or window")
        fig.update_xaxes(
            type="category",
            title_text="rank" + (f" (grouped by {axis.how}, slowest ranks kept)" if axis.aggregated else ""),
        )
        return apply_layout(
            fig,
            f"Stage time per rank, ms per step (P50 over steps; {len(ranks)} ranks as a heatmap)",
            height=180 + 22 * len(rows),
        )
    labels = [f"r{r}" for r in ranks]
    x = [labels * 2, ["busy"] * len(ranks) + ["window"] * len(ranks)]
    for stage in stages:
        y = np.concatenate([column(stage, "busy_ns"), column(stage, "window_ns")])
        fig.add_trace(
            go.Bar(
                name=stage,
                x=x,
                y=np.round(y, 4),
                marker_color=STAGE_COLORS.get(stage),
                showlegend=True,
                hovertemplate=f"{stage}: %{{y:.3f}} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="ms per step (P50 over steps)")
    fig.update_xaxes(title_text="rank, busy or window")
    # two-level category axis (rank over busy / window), rotated on a phone: room for it
    return apply_layout(fig, "Stage time per rank: busy vs window", height=420, axis_px=130)

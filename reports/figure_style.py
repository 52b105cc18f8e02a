"""Shared conventions of the report's figures: units, template, colours, the common layout.

Every figure function (``stage_figures``, ``timeline``, ``routing_figures``, ``comm_figures``)
reads only :class:`~ep_trace.analysis.result.Analysis` frames and returns ``None`` when its frame
is empty (e.g. a trace without routing data), so the page can say why instead of drawing an empty
chart. Durations are drawn in milliseconds (ns / :data:`MS`) and say so on the axis. This module
holds what they share: the track colours, :func:`apply_layout` (title, template, legend below the
plot), the canonical stage order, step / rank counts and neutral shades.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ep_trace.analysis.result import Analysis
from ep_trace.reports.palette import CAUSE_COLORS, OTHER
from ep_trace.reports.plot_layout import legend_below
from ep_trace.stage_names import STAGES

__all__ = ["MS", "TRACK_COLORS", "apply_layout", "stage_order", "step_count", "n_ranks", "neutral_shades"]


#: ns per ms: figures draw durations in milliseconds.
MS = 1e6
_TEMPLATE = "plotly_white"
#: Colour of each kind of timeline / bar track (from the cause palette, reports/palette.py).
TRACK_COLORS = {
    "comm": OTHER,
    "wait": CAUSE_COLORS["barrier_wait"],
    "exposed_comm": CAUSE_COLORS["exposed_comm"],
    "transfer": CAUSE_COLORS["transfer"],
    "compute": CAUSE_COLORS["compute"],
    "overlapped": CAUSE_COLORS["overlapped_comm"],
}


def apply_layout(fig: go.Figure, title: str, height: int = 380, axis_px: int = 64, **kw: object) -> go.Figure:
    """Title (top left), template, ``height`` px and margins; the legend goes below the plot (room for an
    x axis ``axis_px`` px tall), so plotly's toolbar never covers it. ``kw`` goes to ``update_layout``."""
    bottom = max(50, int(fig.layout.margin.b or 0))  # a heatmap's "vs mean" buttons sit under the plot
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template=_TEMPLATE,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": bottom},
        **kw,
    )
    return legend_below(fig, axis_px)


def stage_order(names: list[str]) -> list[str]:
    """``names`` in the canonical EP stage order (ep_trace.stage_names.STAGES), unknown stages after, sorted."""
    known = [s for s in STAGES if s in names]
    return known + sorted(n for n in names if n not in STAGES)


def step_count(analysis: Analysis) -> int:
    """Number of analysed steps (from the steps table, else the stages table; at least 1)."""
    if analysis.steps.height:
        return max(int(analysis.steps["step"].n_unique()), 1)
    if analysis.stages.height and "step" in analysis.stages.columns:
        return max(int(analysis.stages["step"].n_unique()), 1)
    return 1


def n_ranks(analysis: Analysis) -> int:
    """Number of ranks (highest rank id + 1) seen in the rank summary or the ranks table."""
    parts = [analysis.rank_summary["rank"], analysis.tables.ranks["rank"]]
    m = max((int(p.max()) for p in parts if p.len()), default=-1)  # type: ignore[arg-type]
    return m + 1


def neutral_shades(n: int) -> list[str]:
    """``n`` shades of slate blue-grey, dark to light (for series that carry no stage / cause meaning)."""
    lo, hi = np.array([0x2F, 0x3E, 0x4E]), np.array([0xB8, 0xC4, 0xD0])
    rgb = [lo + (hi - lo) * (i / max(n - 1, 1)) for i in range(n)]
    return ["#" + "".join(f"{int(v):02X}" for v in c) for c in rgb]

"""Where legends and axis labels go, so that nothing overlaps from a 390 px phone to 4K."""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["legend_below", "axis_px"]


def legend_below(fig: go.Figure, axis_px: int = 64) -> go.Figure:
    """Pin the legend to the bottom of the figure, under the x axis, in its own margin.

    The legend sits in container coordinates at the bottom (never under plotly's toolbar, top
    right, and never over tick labels or the axis title): the bottom margin is the axis' room
    (``axis_px``: tick labels + title) plus one 22 px row per two legend entries, which is how
    they wrap on a 390 px phone.
    """
    n = sum(1 for t in fig.data if t.type != "heatmap" and t.showlegend is not False and t.name)
    if n <= 1 and not any(t.showlegend for t in fig.data):
        return fig
    rows = -(-n // 2)
    fig.update_layout(
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0.0,
            "yanchor": "bottom",
            "x": 0.0,
            "traceorder": "normal",
        },
        margin={"b": max(int(fig.layout.margin.b or 0), axis_px + 22 * rows + 8)},
    )
    return fig


def axis_px(labels: list[str]) -> int:
    """Room under the plot for rotated category labels (7 px per character) and the axis title."""
    longest = max((len(str(v)) for v in labels), default=3)
    return 64 if longest <= 4 else 40 + 7 * longest

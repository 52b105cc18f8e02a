"""Where legends and axis labels go, so that nothing overlaps from a 390 px phone to 4K."""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["legend_below", "legend_rows", "axis_px", "PHONE_LEGEND_PX"]


#: Width a legend has on a 390 px phone: plotly wraps a horizontal legend within the plot area
#: (viewport - page padding 20 - left margin, which grows to ~105 px for the timeline's row
#: labels - right margin 20), px; on the safe side, as a legend that does not fit spills out.
PHONE_LEGEND_PX = 220


def legend_rows(names: list[str], width_px: int = PHONE_LEGEND_PX) -> int:
    """Rows a horizontal legend of ``names`` takes at ``width_px``.

    plotly.js (legend/draw.js, computeLegendDimensions) puts every entry in a column as wide as
    the widest entry once they do not fit on one row; an entry is about 40 px (symbol + gaps)
    plus 7 px per character at the 12 px legend font.
    """
    widths = [40 + 7 * len(n) for n in names]
    if sum(widths) <= width_px:
        return 1
    per_row = max(1, width_px // max(widths))
    return -(-len(names) // per_row)


def legend_below(fig: go.Figure, axis_px: int = 64) -> go.Figure:
    """Pin the legend to the bottom of the figure, under the x axis, in its own margin.

    The legend sits in container coordinates at the bottom left (never under plotly's toolbar, top
    right, and never over tick labels or the axis title): the bottom margin is the axis' room
    (``axis_px``: tick labels + title) plus 20 px per legend row as the entries wrap on a 390 px
    phone (:func:`legend_rows`); on wider screens the legend just takes fewer of those rows.
    """
    names = [str(t.name) for t in fig.data if t.type != "heatmap" and t.showlegend is not False and t.name]
    if len(names) <= 1 and not any(t.showlegend for t in fig.data):
        return fig
    rows = legend_rows(names)
    legend_px = 20 * rows + 10
    old_b = int(fig.layout.margin.b or 0)
    new_b = max(old_b, axis_px + legend_px)
    # the figure grows by the extra margin, so the plot area keeps its height on a phone; without it
    # plotly caps a legend at half the figure and lets it spill out of the figure
    height = int(fig.layout.height or 400) + (new_b - old_b)
    fig.update_layout(
        height=height,
        legend={
            "orientation": "h",
            "xref": "container",
            "yref": "container",
            "x": 0.0,
            "y": 0.0,
            "yanchor": "bottom",
            "traceorder": "normal",
            "maxheight": legend_px + 10,
        },
        margin={"b": new_b},
    )
    return fig


def axis_px(labels: list[str]) -> int:
    """Room under the plot for rotated category labels (7 px per character) and the axis title."""
    longest = max((len(str(v)) for v in labels), default=3)
    return 64 if longest <= 4 else 40 + 7 * longest

"""Heatmap building blocks of the report's figures: a zero-based heatmap with a "vs mean" view and
an n×n rank matrix binned into groups, so that heatmaps stay readable (and the page light) for
thousands of ranks.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.reports.palette import DIVERGING, SEQUENTIAL

__all__ = ["MAX_TEXT_CELLS", "zero_based_heatmap", "binned_matrix"]


#: Cells up to which heatmaps print their numbers in the cells (beyond: on hover only).
MAX_TEXT_CELLS = 256


def zero_based_heatmap(
    z: np.ndarray,
    x: list,
    y: list,
    unit: str,
    hover: str,
    vs_mean: bool = True,
    max_text_cells: int = MAX_TEXT_CELLS,
) -> go.Figure:
    """A heatmap whose colour scale starts at zero, with the numbers in the cells (small matrices)
    and, when ``vs_mean``, a button switching to a diverging "% vs mean" view (blue below the mean,
    red above), so a ±7% spread looks like ±7%, not like black and white.

    Args:
        z: Values (rows = y).
        x: Column labels.
        y: Row labels.
        unit: Unit of ``z`` for the colour bar ("rows", "ms").
        hover: Hover template with ``%{x}``, ``%{y}``, ``%{z}`` (absolute view).
        vs_mean: Add the "vs mean" button.
        max_text_cells: Print the numbers in the cells up to this many cells.
    """
    z = np.asarray(z, dtype=float)
    zmax = float(np.nanmax(z)) if z.size and np.isfinite(z).any() else 1.0
    text = z.size <= max_text_cells
    fig = go.Figure(
        go.Heatmap(
            z=np.round(z, 3),
            x=x,
            y=y,
            zmin=0.0,
            zmax=zmax or 1.0,
            colorscale=SEQUENTIAL,
            colorbar={"title": {"text": unit}},
            texttemplate="%{z:.3~g}" if text else None,
            hovertemplate=hover,
        )
    )
    if vs_mean and z.size:
        mean = float(np.nanmean(z))
        rel = (z / mean - 1.0) * 100 if mean else np.zeros_like(z)
        m = max(float(np.nanmax(np.abs(rel))), 1.0)
        absolute = {
            "z": [np.round(z, 3)],
            "zmin": [0.0],
            "zmax": [zmax or 1.0],
            "colorscale": [SEQUENTIAL],
            "texttemplate": ["%{z:.3~g}" if text else None],
            "hovertemplate": [hover],
            "colorbar.title.text": unit,
        }
        diverging = {
            "z": [np.round(rel, 2)],
            "zmin": [-m],
            "zmax": [m],
            "colorscale": [DIVERGING],
            "texttemplate": ["%{z:+.0f}%" if text else None],
            "hovertemplate": ["%{y} / %{x}: %{z:+.1f}% vs the mean cell<extra></extra>"],
            "colorbar.title.text": "% vs mean",
        }
        fig.update_layout(
            updatemenus=[
                {
                    "type": "buttons",
                    "direction": "right",
                    "showactive": True,
                    # under the plot (below the axis title): the toolbar owns the top right, and on a
                    # phone the top row is too narrow for both
                    "x": 0.0,
                    "xanchor": "left",
                    "y": 0.0,
                    "yanchor": "top",
                    "pad": {"t": 62, "b": 0},
                    "buttons": [
                        {"label": f"absolute ({unit})", "method": "restyle", "args": [absolute]},
                        {"label": "vs mean (%)", "method": "restyle", "args": [diverging]},
                    ],
                }
            ],
            margin={"b": 110},
        )
    return fig


def binned_matrix(
    df: pl.DataFrame, row: str, col: str, val: str, n: int, max_cells: int
) -> tuple[np.ndarray, list[str], int]:
    """Sum ``val`` into an n×n matrix indexed by rank, binning ranks in groups beyond ``max_cells``."""
    size = max(int(np.ceil(n / max_cells)), 1)
    nb = int(np.ceil(n / size))
    z = np.zeros((nb, nb))
    if df.height:
        np.add.at(z, (df[row].to_numpy() // size, df[col].to_numpy() // size), df[val].to_numpy().astype(float))
    labels = [f"r{i * size}" if size == 1 else f"r{i * size}-{min((i + 1) * size, n) - 1}" for i in range(nb)]
    return z, labels, size

"""The routing figures: the dispatch count matrix, the expert load n_e and the imbalance ratios
I_e / I_r per layer. Each returns ``None`` when the traces carry no routing data.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.figure_style import apply_layout, n_ranks, neutral_shades
from ep_trace.reports.heatmaps import binned_matrix, zero_based_heatmap

__all__ = ["count_matrix_heatmap", "expert_load_bars", "imbalance_per_layer"]


def count_matrix_heatmap(analysis: Analysis, max_cells: int = 64) -> go.Figure | None:
    """Heatmap of dispatched rows C[src][dst], mean per step, summed over layers and micro-batches.

    Beyond ``max_cells`` ranks, ranks are binned into equal groups (cells sum their members).
    """
    cm = analysis.count_matrix
    if cm.height == 0:
        return None
    if (cm["direction"] == "dispatch").any():
        cm = cm.filter(pl.col("direction") == "dispatch")
    n = max(n_ranks(analysis), int(cm["src"].max()) + 1, int(cm["dst"].max()) + 1)  # type: ignore[arg-type]
    size = max(int(np.ceil(n / max_cells)), 1)
    # bin first: at 4,096 ranks the matrix has 16.7M (src, dst) rows but only 64 x 64 cells are drawn
    agg = (
        cm.group_by((pl.col("src") // size).alias("src"), (pl.col("dst") // size).alias("dst"))
        .agg(pl.col("rows").sum())
        .with_columns(pl.col("src") * size, pl.col("dst") * size)
    )
    z, labels, size = binned_matrix(agg, "src", "dst", "rows", n, max_cells)
    z = z / max(int(cm["step"].n_unique()), 1)
    local = float(np.trace(z) / z.sum()) if z.sum() and size == 1 else float("nan")
    fig = zero_based_heatmap(z, labels, labels, "rows", "src %{y} → dst %{x}: %{z:.1f} rows/step<extra></extra>")
    fig.update_xaxes(title_text="destination rank", type="category")
    fig.update_yaxes(title_text="source rank", autorange="reversed", type="category")
    title = "Dispatch count matrix (rows per step)"
    if size > 1:
        title += f", ranks binned by {size}"
    elif local == local:
        title += f", local ratio {local:.0%}"
    return apply_layout(fig, title, height=440)


def expert_load_bars(analysis: Analysis) -> go.Figure | None:
    """Assignments per expert (n_e, mean per step) per layer, with the per-layer I_e in the legend.

    Up to 8 layers as grouped bars; more layers as a layer × expert heatmap.
    """
    el = analysis.expert_load
    if el.height == 0:
        return None
    per = (
        el.group_by("layer", "expert")
        .agg(pl.col("count").sum())
        .with_columns((pl.col("count") / max(int(el["step"].n_unique()), 1)).alias("n_e"))
        .sort("layer", "expert")
    )
    layers = per["layer"].unique().sort().to_list()
    ie = _per_layer(analysis, "I_e")
    fig = go.Figure()
    if len(layers) <= 8:
        # layers are not stages or causes: shades of one neutral hue, so no colour means two things
        shades = neutral_shades(len(layers))
        for i, layer in enumerate(layers):
            sub = per.filter(pl.col("layer") == layer)
            tag = f"layer {layer}" + (f" (I_e {ie[layer]:.2f})" if layer in ie else "")
            fig.add_trace(
                go.Bar(
                    name=tag,
                    x=sub["expert"].to_numpy(),
                    y=np.round(sub["n_e"].to_numpy(), 2),
                    marker_color=shades[i],
                    hovertemplate=f"{tag}<br>expert %{{x}}: %{{y:.1f}} assignments/step<extra></extra>",
                )
            )
        mean = float(per["n_e"].mean())  # type: ignore[arg-type]
        fig.add_hline(y=mean, line_dash="dot", line_color="#555", annotation_text=f"mean {mean:.1f}")
        fig.update_layout(barmode="group")
        fig.update_xaxes(title_text="expert")
        fig.update_yaxes(title_text="assignments per step")
    else:
        experts = per["expert"].unique().sort().to_list()
        piv = per.pivot(on="expert", index="layer", values="n_e").sort("layer").fill_null(0)
        z = piv.select([str(e) for e in experts]).to_numpy()
        fig = zero_based_heatmap(
            z,
            experts,
            [f"l{x}" for x in piv["layer"].to_list()],
            "n_e",
            "layer %{y}, expert %{x}: %{z:.1f}<extra></extra>",
        )
        fig.update_xaxes(title_text="expert")
        fig.update_yaxes(title_text="layer")
    return apply_layout(fig, "Expert load n_e (assignments per step)", height=400)


def _per_layer(analysis: Analysis, col: str) -> dict[int, float]:
    imb = analysis.imbalance
    if imb.height == 0 or col not in imb.columns:
        return {}
    agg = imb.drop_nulls(col).group_by("layer").agg(pl.col(col).median())
    return {int(k): float(v) for k, v in agg.iter_rows() if k is not None}


def imbalance_per_layer(analysis: Analysis) -> go.Figure | None:
    """I_e and I_r per layer: bars = median over steps, whiskers up to the max over steps."""
    imb = analysis.imbalance
    if imb.height == 0:
        return None
    agg = (
        imb.group_by("layer")
        .agg(
            *[pl.col(c).median().alias(f"{c}_p50") for c in ("I_e", "I_r")],
            *[pl.col(c).max().alias(f"{c}_max") for c in ("I_e", "I_r")],
        )
        .sort("layer")
    )
    x = [f"l{v}" for v in agg["layer"].to_list()]
    fig = go.Figure()
    for c, color in (("I_e", "#2F3E4E"), ("I_r", "#B8C4D0")):  # ratios, not stages: neutral shades
        p50 = agg[f"{c}_p50"].to_numpy()
        mx = agg[f"{c}_max"].to_numpy()
        fig.add_trace(
            go.Bar(
                name=f"{c} (P50 over steps)",
                x=x,
                y=np.round(p50, 4),
                marker_color=color,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": np.round(mx - p50, 4),
                    "arrayminus": np.zeros(len(x)),
                },
                hovertemplate=f"{c} %{{x}}: %{{y:.2f}}×<extra></extra>",
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555", annotation_text="balanced = 1")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="max / mean (ratio, 1 = balanced)")
    fig.update_xaxes(title_text="MoE layer")
    return apply_layout(fig, "Routing imbalance per layer (whiskers: max over steps)", height=340)

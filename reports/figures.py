"""The report's figures: one function per figure, each returning a plotly ``Figure`` (or ``None``).

Every function reads only :class:`~ep_trace.analysis.result.Analysis` frames and returns ``None``
when its frame is empty (e.g. a trace without routing data), so the page can say why instead of
drawing an empty chart. Durations are drawn in milliseconds (ns / 1e6) and say so on the axis.
Large jobs stay openable: heatmaps are binned beyond ``max_cells`` ranks, the timeline draws a
sample of ranks (:func:`timeline_selection`), the α–β scatter is thinned to ``max_points``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.breakdown_figures import add_critical_path, critical_path_of
from ep_trace.reports.palette import CAUSE_COLORS, DIVERGING, OTHER, SEQUENTIAL, STAGE_COLORS
from ep_trace.reports.plot_layout import axis_px as _axis_px
from ep_trace.reports.plot_layout import legend_below
from ep_trace.reports.rank_axis import aggregate, rank_axis
from ep_trace.stage_names import STAGES

__all__ = [
    "TimelineSelection",
    "n_ranks",
    "stage_breakdown",
    "timeline_selection",
    "step_timeline",
    "count_matrix_heatmap",
    "expert_load_bars",
    "imbalance_per_layer",
    "overlap_per_rank",
    "overlap_per_stage",
    "barrier_wait_per_rank",
    "wait_matrix_heatmap",
    "alpha_beta_scatter",
]

MS = 1e6
_TEMPLATE = "plotly_white"
_STAGE_COLORS = STAGE_COLORS  # one palette for every figure (reports/palette.py)
_TRACK_COLORS = {
    "comm": OTHER,
    "wait": CAUSE_COLORS["barrier_wait"],
    "exposed_comm": CAUSE_COLORS["exposed_comm"],
    "transfer": CAUSE_COLORS["transfer"],
    "compute": CAUSE_COLORS["compute"],
    "overlapped": CAUSE_COLORS["overlapped_comm"],
}
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


def _layout(fig: go.Figure, title: str, height: int = 380, axis_px: int = 64, **kw: object) -> go.Figure:
    bottom = max(50, int(fig.layout.margin.b or 0))  # a heatmap's "vs mean" buttons sit under the plot
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template=_TEMPLATE,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": bottom},
        **kw,
    )
    return legend_below(fig, axis_px)


def _stage_order(names: list[str]) -> list[str]:
    known = [s for s in STAGES if s in names]
    return known + sorted(n for n in names if n not in STAGES)


def _n_steps(analysis: Analysis) -> int:
    if analysis.steps.height:
        return max(int(analysis.steps["step"].n_unique()), 1)
    if analysis.stages.height and "step" in analysis.stages.columns:
        return max(int(analysis.stages["step"].n_unique()), 1)
    return 1


def stage_breakdown(analysis: Analysis, max_bar_ranks: int = 32) -> go.Figure | None:
    """Per-rank × stage busy and window time, ms per step (P50 over steps).

    Up to ``max_bar_ranks`` ranks: each rank has two stacked columns, ``busy`` (|union of the
    stage's device intervals|) and ``window`` (first start → last end); a window longer than busy
    time means idle gaps (waiting). Beyond that, a (stage busy / window) × rank heatmap, which stays
    readable and light for hundreds of ranks.
    """
    st = analysis.stages
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
    stages = _stage_order(per["stage"].unique().to_list())
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
        return _layout(
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
                marker_color=_STAGE_COLORS.get(stage),
                showlegend=True,
                hovertemplate=f"{stage}: %{{y:.3f}} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="ms per step (P50 over steps)")
    fig.update_xaxes(title_text="rank, busy or window")
    # two-level category axis (rank over busy / window), rotated on a phone: room for it
    return _layout(fig, "Stage time per rank: busy vs window", height=420, axis_px=130)


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
    for stage in _stage_order(stages["stage"].unique().to_list()):
        add(stages.filter(pl.col("stage") == stage), stage, _STAGE_COLORS.get(stage, "#999999"), 0.4)
    add(iv.filter(pl.col("track") == "comm"), "comm", _TRACK_COLORS["comm"], 0.4)
    add(iv.filter(pl.col("track") == "wait"), "barrier wait", _TRACK_COLORS["wait"], 0.22)
    add(iv.filter(pl.col("track") == "exposed_comm"), "exposed comm", _TRACK_COLORS["exposed_comm"], 0.4)
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
    return _layout(fig, title, height=height, hovermode="closest")


def _binned_matrix(
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


def n_ranks(analysis: Analysis) -> int:
    """Number of ranks (highest rank id + 1) seen in the rank summary or the ranks table."""
    parts = [analysis.rank_summary["rank"], analysis.tables.ranks["rank"]]
    m = max((int(p.max()) for p in parts if p.len()), default=-1)  # type: ignore[arg-type]
    return m + 1


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
    z, labels, size = _binned_matrix(agg, "src", "dst", "rows", n, max_cells)
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
    return _layout(fig, title, height=440)


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
        shades = _shades(len(layers))
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
    return _layout(fig, "Expert load n_e (assignments per step)", height=400)


def _shades(n: int) -> list[str]:
    """``n`` shades of slate blue-grey, dark to light (for series that carry no stage / cause meaning)."""
    lo, hi = np.array([0x2F, 0x3E, 0x4E]), np.array([0xB8, 0xC4, 0xD0])
    rgb = [lo + (hi - lo) * (i / max(n - 1, 1)) for i in range(n)]
    return ["#" + "".join(f"{int(v):02X}" for v in c) for c in rgb]


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
    return _layout(fig, "Routing imbalance per layer (whiskers: max over steps)", height=340)


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
        f"up to {worst['exposed_comm_ns'] / MS:.3f} ms per step on rank {worst['rank']}."
    )


def _stacked_rank_bars(
    analysis: Analysis, df: pl.DataFrame, series: list[tuple[str, str, str]], title: str
) -> go.Figure:
    """Per-rank stacked bars in ms per step; ``series`` = (column in ns, legend name, track colour key)."""
    x, agg, xtitle = _rank_bars(analysis, df, [c for c, _, _ in series])
    bars = [
        go.Bar(name=name, x=x, y=np.round(agg[c].to_numpy() / MS, 4), marker_color=_TRACK_COLORS[colour])
        for c, name, colour in series
    ]
    fig = go.Figure(bars)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(type="category", title_text=xtitle)
    fig.update_yaxes(title_text="ms per step")
    return _layout(fig, title, height=380, axis_px=_axis_px(x))


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
    st = analysis.stages
    if st.height == 0 or not {"comm_ns", "exposed_comm_ns"} <= set(st.columns) or st["comm_ns"].fill_null(0).sum() == 0:
        return None
    if overlap_sentence(analysis) is not None:
        return None
    n_steps = _n_steps(analysis)
    per_rank = st.group_by("stage", "rank").agg(
        pl.col("comm_ns").sum() / n_steps, pl.col("exposed_comm_ns").sum() / n_steps
    )
    agg = per_rank.group_by("stage").agg(
        pl.col("comm_ns").mean(), pl.col("exposed_comm_ns").mean(), pl.col("exposed_comm_ns").max().alias("exposed_max")
    )
    agg = agg.filter(pl.col("comm_ns") > 0)
    order = _stage_order(agg["stage"].to_list())
    agg = pl.DataFrame({"stage": order}).join(agg, on="stage", how="left")
    comm = agg["comm_ns"].to_numpy()
    exp_ = agg["exposed_comm_ns"].to_numpy()
    fig = go.Figure(
        [
            go.Bar(
                name="overlapped |C ∩ K|",
                x=order,
                y=np.round((comm - exp_) / MS, 4),
                marker_color=_TRACK_COLORS["overlapped"],
            ),
            go.Bar(
                name="exposed |C \\ K|",
                x=order,
                y=np.round(exp_ / MS, 4),
                marker_color=_TRACK_COLORS["exposed_comm"],
                customdata=np.round(agg["exposed_max"].to_numpy() / MS, 4),
                hovertemplate="%{x}: exposed %{y:.3f} ms (max rank %{customdata:.3f} ms)<extra></extra>",
            ),
        ]
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="stage")
    fig.update_yaxes(title_text="ms per step (mean over ranks)")
    return _layout(fig, "Communication per stage: overlapped vs exposed", height=340)


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
    z, labels, size = _binned_matrix(wm, "waiter", "waited_for", "wait_ns", n, max_cells)
    # no "vs mean" view: most cells are 0 by construction (only the last arriver is waited for)
    fig = zero_based_heatmap(
        z / MS, labels, labels, "ms", "rank %{y} waited %{z:.3f} ms for rank %{x}<extra></extra>", vs_mean=False
    )
    fig.update_xaxes(title_text="waited for (last arriver)", type="category")
    fig.update_yaxes(title_text="waiting rank", autorange="reversed", type="category")
    title = "Wait matrix (ms, total over calls)" + (f", ranks binned by {size}" if size > 1 else "")
    return _layout(fig, title, height=440)


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
    shades = _shades(3)
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
    return _layout(fig, "α–β fit: transfer time vs message size", height=380)

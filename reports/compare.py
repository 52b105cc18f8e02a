"""``ep-trace compare A B``: what got better or worse between two runs, and why the step time moved.

Both runs are reduced to a :class:`RunDigest` (from an :class:`Analysis`, or from a saved JSON
summary, docs/summary.md), so a trace directory can be compared with a summary saved by CI.
Definitions used on both sides, so they agree:

* step time = the slowest rank's mean step time (ns), so that it adds up with the stage times,
  which are means per step; a summary without ``step_time_mean_ns`` falls back to the P50
  (``RunDigest.step_stat`` says which, and the headline says so);
* stage time = per stage, the per-step window (first start → last end, summed over layers and
  micro-batches) averaged over ranks; busy time alongside;
* the step-time change is "explained" by the sum of the stage-window changes; the rest is work
  outside the EP stages (attention, optimizer, ...) or changed overlap between stages.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports.units import fmt_ns, fmt_pct

__all__ = [
    "RunDigest",
    "Comparison",
    "digest_analysis",
    "digest_summary",
    "compare_runs",
    "comparison_to_dict",
    "headline",
    "within_noise",
    "stage_delta_figure",
    "rank_delta_figure",
    "render_compare_html",
]

_RANK_COLS = ("step_time_ns", "step_time_mean_ns", "comm_ns", "exposed_comm_ns", "barrier_wait_ns", "transfer_ns")


@dataclass(frozen=True)
class RunDigest:
    """What compare needs from one run.

    Attributes:
        label: Name shown (directory or file).
        ranks: rank + ``_RANK_COLS`` (ns per step; step_time_ns is the P50 over steps, step_time_mean_ns the mean).
        stages: stage, busy_ns, window_ns (ns per step, mean over ranks).
        findings: kind, severity, title, est_saving_ns.
        step_spread_ns: Step-to-step spread (std over steps of the slowest rank's step), the run's noise.
        n_steps: Steps analysed.
        pipelined: The run's dispatch -> expert -> combine ran in chunks (micro-batches > 0), so its stage
            windows overlap each other.
    """

    label: str
    ranks: pl.DataFrame
    stages: pl.DataFrame
    findings: pl.DataFrame
    #: Standard deviation over steps of the per-step step time (slowest rank), ns; None when unknown.
    step_spread_ns: float | None = None
    #: Steps behind the step statistics.
    n_steps: int = 0
    #: Stages ran in chunks (their windows overlap).
    pipelined: bool = False

    @property
    def step_stat(self) -> str:
        """``'mean'`` when every rank has a mean step time, else ``'P50'``."""
        col = self.ranks["step_time_mean_ns"]
        return "mean" if self.ranks.height and col.null_count() == 0 else "P50"

    def step_time_ns(self, stat: str | None = None) -> float | None:
        """The slowest rank's step time, ns: ``stat`` ``'mean'`` or ``'P50'`` (default: :attr:`step_stat`)."""
        if self.ranks.height == 0:
            return None
        v = self.ranks["step_time_mean_ns" if (stat or self.step_stat) == "mean" else "step_time_ns"].max()
        return None if v is None else float(v)  # type: ignore[arg-type]


_FINDINGS_SCHEMA = {"kind": pl.Utf8, "severity": pl.Utf8, "title": pl.Utf8, "est_saving_ns": pl.Int64}
_STAGES_SCHEMA = pl.Schema(
    {"stage": pl.Utf8, "busy_ns": pl.Float64, "window_ns": pl.Float64, "window_sd_ns": pl.Float64, "n_steps": pl.Int64}
)


def _rank_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    data: dict[str, list[Any]] = {"rank": [int(r["rank"]) for r in rows]}
    for c in _RANK_COLS:
        data[c] = [None if r.get(c) is None else float(r[c]) for r in rows]
    return pl.DataFrame(data, schema={"rank": pl.Int64, **{c: pl.Float64 for c in _RANK_COLS}}).sort("rank")


def digest_analysis(analysis: Analysis, label: str) -> RunDigest:
    """Reduce an :class:`Analysis` to a :class:`RunDigest`."""
    rs = analysis.rank_summary
    if analysis.steps.height:
        mean = analysis.steps.group_by("rank").agg(pl.col("step_time_ns").mean().alias("step_time_mean_ns"))
        rs = rs.join(mean.with_columns(pl.col("rank").cast(rs.schema["rank"])), on="rank", how="left")
    ranks = _rank_frame(rs.select("rank", *[c for c in _RANK_COLS if c in rs.columns]).to_dicts())
    st = analysis.stages
    if st.height:
        # per step the mean over ranks, then over steps: the steps' spread is each stage's own noise
        stages = (
            st.group_by("rank", "step", "stage")
            .agg(pl.col("busy_ns").sum(), pl.col("window_ns").sum())
            .group_by("step", "stage")
            .agg(pl.col("busy_ns").mean(), pl.col("window_ns").mean())
            .group_by("stage")
            .agg(
                pl.col("busy_ns").mean(),
                pl.col("window_ns").mean(),
                pl.col("window_ns").std().alias("window_sd_ns"),
                pl.len().alias("n_steps"),
            )
            .cast(_STAGES_SCHEMA)
            .sort("stage")
        )
    else:
        stages = pl.DataFrame(schema=_STAGES_SCHEMA)
    pipelined = bool(st.height and "microbatch" in st.columns and (st["microbatch"].fill_null(0) > 0).any())
    findings = pl.DataFrame(
        [
            {"kind": f.kind, "severity": f.severity, "title": f.title, "est_saving_ns": int(f.est_saving_ns)}
            for f in analysis.findings
        ],
        schema=_FINDINGS_SCHEMA,
    )
    spread, n = _spread(analysis.steps)
    return RunDigest(label, ranks, stages, findings, spread, n, pipelined)


def _spread(steps: pl.DataFrame) -> tuple[float | None, int]:
    """Std over steps of the per-step slowest-rank step time, and the number of steps."""
    if steps.is_empty():
        return None, 0
    per = steps.group_by("step").agg(pl.col("step_time_ns").max())
    n = per.height
    return (float(per["step_time_ns"].cast(pl.Float64).std() or 0.0) if n > 1 else None), n


def _records(obj: Any, key_name: str) -> list[dict[str, Any]]:
    """A list of records, or a mapping {key: record} turned into records carrying ``key_name``."""
    if obj is None:
        return []
    if isinstance(obj, Mapping):
        return [{key_name: k, **(v if isinstance(v, Mapping) else {"value": v})} for k, v in obj.items()]
    return [dict(r) for r in obj]


def digest_summary(summary: Mapping[str, Any], label: str) -> RunDigest:
    """Reduce a saved JSON summary (``Analysis.summary()``, docs/summary.md) to a :class:`RunDigest`.

    Raises:
        BadInputError: naming ``label`` when the JSON is not an ep-trace summary.
    """
    from ep_trace.errors import BadInputError

    if not isinstance(summary, Mapping) or "schema_version" not in summary or "ranks" not in summary:
        raise BadInputError(
            f"{label}: not an ep-trace summary (no 'schema_version' / 'ranks'); pass a file written by 'ep-trace analyze --json'"
        )
    ranks = _rank_frame(_records(summary.get("ranks"), "rank"))
    srows = _records(summary.get("stages"), "stage")
    if srows:
        df = pl.DataFrame(
            [
                {
                    "rank": r.get("rank"),
                    "stage": str(r["stage"]),
                    "busy_ns": float(r.get("busy_ns") or 0),
                    "window_ns": float(r.get("window_ns") or 0),
                }
                for r in srows
            ]
        )
        stages = (
            df.group_by("rank", "stage")
            .agg(pl.col("busy_ns").sum(), pl.col("window_ns").sum())
            .group_by("stage")
            .agg(pl.col("busy_ns").mean(), pl.col("window_ns").mean())
            # a summary holds per-rank means, not steps: no stage noise (the tolerance rule applies)
            .with_columns(pl.lit(None, pl.Float64).alias("window_sd_ns"), pl.lit(0, pl.Int64).alias("n_steps"))
            .cast(_STAGES_SCHEMA)
            .sort("stage")
        )
    else:
        stages = pl.DataFrame(schema=_STAGES_SCHEMA)
    frows = [
        {
            "kind": str(f.get("kind")),
            "severity": str(f.get("severity")),
            "title": str(f.get("title", f.get("kind"))),
            "est_saving_ns": int(f.get("est_saving_ns") or 0),
        }
        for f in _records(summary.get("findings"), "kind")
    ]
    ov = summary.get("overall") or {}
    spread = ov.get("step_time_spread_ns") if isinstance(ov, Mapping) else None
    n_steps = len(summary.get("steps") or [])
    return RunDigest(
        label,
        ranks,
        stages,
        pl.DataFrame(frows, schema=_FINDINGS_SCHEMA),
        None if spread is None else float(spread),
        n_steps,
    )


@dataclass(frozen=True)
class Comparison:
    """A vs B. Deltas are ``B − A`` (negative = B is faster).

    Attributes:
        a, b: The two digests.
        step_delta_ns: Change of the step time (``None`` when either run has none).
        stages: stage, a_window_ns, b_window_ns, delta_ns, a_busy_ns, b_busy_ns, busy_delta_ns, noise_ns
            (2 x the standard error of the window change from both runs' step-to-step spread; null when
            unknown), change (``better | worse | same | within noise``).
        ranks: rank, a_/b_/delta_ for step_time, exposed_comm and barrier_wait (ns).
        findings: kind, a_saving_ns, b_saving_ns, status (``new | resolved | better | worse | same |
            within noise``: a saving that moved by less than the step-time noise is within noise).
        explained_ns: Sum of the stage-window deltas.
        step_stat: ``'mean'`` when both runs know their mean step time, else ``'P50'``.
        a_step_ns, b_step_ns: The slowest rank's step time of each run (that statistic), ns.
    """

    a: RunDigest
    b: RunDigest
    step_delta_ns: float | None
    stages: pl.DataFrame
    ranks: pl.DataFrame
    findings: pl.DataFrame
    explained_ns: float
    step_stat: str = "mean"
    a_step_ns: float | None = None
    b_step_ns: float | None = None
    #: 2 x the standard error of the step-time difference from the runs' own step-to-step spread
    #: (None when a run has fewer than 2 steps or no spread): a change within it is noise.
    noise_ns: float | None = None
    #: Ranks present in both runs.
    common_ranks: tuple[int, ...] = ()


def _change(delta: pl.Expr, base: pl.Expr, tol: float) -> pl.Expr:
    """'better' / 'worse' / 'same': a change within ``tol`` of the base (or 1 µs) is 'same'."""
    small = delta.abs() <= pl.max_horizontal(base.abs() * tol, pl.lit(1000.0))
    return pl.when(small).then(pl.lit("same")).when(delta < 0).then(pl.lit("better")).otherwise(pl.lit("worse"))


def _noisy(change: pl.Expr, noise: pl.Expr, delta: pl.Expr | None = None) -> pl.Expr:
    """``change`` ('better' / 'worse' / 'same'), with 'better' / 'worse' turned into 'within noise'
    where ``|delta|`` (default: the ``delta_ns`` column) is no larger than ``noise`` (null: unknown)."""
    d = pl.col("delta_ns") if delta is None else delta
    moved = change.is_in(["better", "worse"])
    return pl.when(moved & noise.is_not_null() & (d.abs() <= noise)).then(pl.lit("within noise")).otherwise(change)


def _two_se(sd_a: Any, n_a: Any, sd_b: Any, n_b: Any) -> Any:
    """Two standard errors of a difference of means, ``2 sqrt(sd_a^2 / n_a + sd_b^2 / n_b)``: the noise
    of a step or a stage window. One formula for floats (the step) and polars expressions (the stages)."""
    return 2.0 * (sd_a**2 / n_a + sd_b**2 / n_b) ** 0.5


def compare_runs(a: RunDigest, b: RunDigest, tolerance: float = 0.02) -> Comparison:
    """Compare two runs; a change within ``tolerance`` (fraction of A's value, min 1 µs) counts as 'same'."""
    st = a.stages.join(b.stages, on="stage", how="full", coalesce=True, suffix="_b")
    st = st.with_columns(pl.col("busy_ns", "window_ns", "busy_ns_b", "window_ns_b").fill_null(0.0))
    n_a, n_b = pl.col("n_steps").fill_null(0), pl.col("n_steps_b").fill_null(0)
    stage_noise = (
        pl.when((n_a > 1) & (n_b > 1))
        .then(_two_se(pl.col("window_sd_ns"), n_a, pl.col("window_sd_ns_b"), n_b))
        .otherwise(None)
    )
    st = (
        st.select(
            "stage",
            pl.col("window_ns").alias("a_window_ns"),
            pl.col("window_ns_b").alias("b_window_ns"),
            (pl.col("window_ns_b") - pl.col("window_ns")).alias("delta_ns"),
            pl.col("busy_ns").alias("a_busy_ns"),
            pl.col("busy_ns_b").alias("b_busy_ns"),
            (pl.col("busy_ns_b") - pl.col("busy_ns")).alias("busy_delta_ns"),
            stage_noise.alias("noise_ns"),
        )
        .with_columns(
            _noisy(_change(pl.col("delta_ns"), pl.col("a_window_ns"), tolerance), pl.col("noise_ns")).alias("change")
        )
        .sort("delta_ns")
    )
    cols = ("step_time_ns", "exposed_comm_ns", "barrier_wait_ns")
    rk = a.ranks.select("rank", *cols).join(
        b.ranks.select("rank", *cols), on="rank", how="full", coalesce=True, suffix="_b"
    )
    rk = rk.select(
        "rank",
        *[
            e
            for c in cols
            for e in (
                pl.col(c).alias(f"a_{c}"),
                pl.col(f"{c}_b").alias(f"b_{c}"),
                (pl.col(f"{c}_b") - pl.col(c)).alias(f"delta_{c}"),
            )
        ],
    ).sort("rank")
    noise = None
    if a.step_spread_ns is not None and b.step_spread_ns is not None and a.n_steps > 1 and b.n_steps > 1:
        noise = float(_two_se(a.step_spread_ns, a.n_steps, b.step_spread_ns, b.n_steps))
    fa = a.findings.group_by("kind").agg(
        pl.col("est_saving_ns").sum().alias("a_saving_ns"), pl.col("title").first().alias("a_title")
    )
    fb = b.findings.group_by("kind").agg(
        pl.col("est_saving_ns").sum().alias("b_saving_ns"), pl.col("title").first().alias("b_title")
    )
    moved = (pl.col("b_saving_ns") - pl.col("a_saving_ns")).cast(pl.Float64)  # a finding's saving change
    fd = (
        fa.join(fb, on="kind", how="full", coalesce=True)
        .with_columns(
            pl.when(pl.col("a_saving_ns").is_null())
            .then(pl.lit("new"))
            .when(pl.col("b_saving_ns").is_null())
            .then(pl.lit("resolved"))
            .otherwise(
                _noisy(
                    _change(moved, pl.col("a_saving_ns").cast(pl.Float64), tolerance),
                    pl.lit(noise, pl.Float64),
                    moved,
                )
            )
            .alias("status"),
            pl.coalesce("b_title", "a_title").alias("title"),
        )
        .select("kind", "title", "a_saving_ns", "b_saving_ns", "status")
        .sort("kind")
    )
    stat = "mean" if a.step_stat == b.step_stat == "mean" else "P50"
    sa, sb = a.step_time_ns(stat), b.step_time_ns(stat)
    delta = None if sa is None or sb is None else sb - sa
    common = tuple(sorted(set(a.ranks["rank"].to_list()) & set(b.ranks["rank"].to_list())))
    return Comparison(
        a, b, delta, st, rk, fd, float(st["delta_ns"].sum()) if st.height else 0.0, stat, sa, sb, noise, common
    )


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def comparison_to_dict(c: Comparison) -> dict[str, Any]:
    """JSON-ready dict of the comparison (ns integers rounded; null for unknown)."""

    def recs(df: pl.DataFrame) -> list[dict[str, Any]]:
        return [{k: _clean(v) for k, v in r.items()} for r in df.to_dicts()]

    return {
        "schema_version": 1,
        "a": c.a.label,
        "b": c.b.label,
        "step_time_ns": {
            "a": c.a_step_ns,
            "b": c.b_step_ns,
            "delta": c.step_delta_ns,
            "statistic": c.step_stat,
            "noise": c.noise_ns,
            "within_noise": within_noise(c),
        },
        "common_ranks": list(c.common_ranks),
        "explained_by_stages_ns": c.explained_ns,
        "unexplained_ns": None if c.step_delta_ns is None else c.step_delta_ns - c.explained_ns,
        "stages": recs(c.stages),
        "ranks": recs(c.ranks),
        "findings": recs(c.findings),
    }


def within_noise(c: Comparison) -> bool | None:
    """The step-time change is within the runs' own step-to-step spread (None when unknown)."""
    if c.step_delta_ns is None or c.noise_ns is None:
        return None
    return abs(c.step_delta_ns) <= c.noise_ns


def headline(c: Comparison) -> str:
    """One sentence: how the step time moved (or that it is within noise) and which stage moved most."""
    pre = ""
    if not c.common_ranks and c.a.ranks.height and c.b.ranks.height:
        pre = (
            f"A and B have no rank in common (A: {_ranks_txt(c.a)}; B: {_ranks_txt(c.b)}): the figures compare "
            "different ranks. "
        )
    if c.step_delta_ns is None or not c.a_step_ns:
        return pre + "Step time not comparable (one run has no steps)."
    stat = c.step_stat
    if within_noise(c):
        s = pre + (
            f"Within noise: B - A = {fmt_ns(c.step_delta_ns, signed=True)} per step ({fmt_ns(c.a_step_ns)} → "
            f"{fmt_ns(c.b_step_ns)}, {stat} step of the slowest rank) is inside the runs' own step-to-step spread "
            f"(±{fmt_ns(c.noise_ns)}, 2 standard errors); neither run is better."
        )
    else:
        word = "faster" if c.step_delta_ns < 0 else "slower"
        s = pre + (
            f"B is {fmt_ns(abs(c.step_delta_ns))} {word} per step than A "
            f"({fmt_pct(c.step_delta_ns / c.a_step_ns, signed=True)}: "
            f"{fmt_ns(c.a_step_ns)} → {fmt_ns(c.b_step_ns)}, {stat} step of the slowest rank)."
        )
    if within_noise(c):
        # a step change inside the noise has nothing to explain: say which stages moved beyond their own
        # (stages without a known spread, from saved summaries, are not judged here)
        known = c.stages.filter(pl.col("noise_ns").is_not_null())
        if known.is_empty():
            return s
        moved = known.filter(pl.col("change").is_in(["better", "worse"]))
        if moved.is_empty():
            return s + " No stage window moved beyond its own step-to-step spread either."
        most = moved.sort(pl.col("delta_ns").abs(), descending=True).head(3)
        parts = ", ".join(f"{r['stage']} {fmt_ns(r['delta_ns'], signed=True)}" for r in most.iter_rows(named=True))
        return s + f" Stage windows that moved beyond their own spread: {parts}."
    if c.stages.height:
        top = c.stages.sort(pl.col("delta_ns").abs(), descending=True).row(0, named=True)
        s += f" Largest stage change: {top['stage']} {fmt_ns(top['delta_ns'], signed=True)}."
    rest = c.step_delta_ns - c.explained_ns
    s += f" Stage changes sum to {fmt_ns(c.explained_ns, signed=True)}"
    if abs(c.explained_ns) > abs(c.step_delta_ns) and rest * c.explained_ns < 0:
        if c.a.pipelined or c.b.pipelined:
            # chunked stages run concurrently: their windows overlap, so the sum over-counts
            s += (
                f", more than the step-time change: stage windows overlap each other (pipelined stages), "
                f"so {fmt_ns(-rest)} of the stage change is concurrent rather than serial"
            )
        else:
            # windows are means over ranks and hold the waits of ranks that do not set the step
            s += (
                ", more than the step-time change of the slowest rank: stage windows are means over ranks and "
                "include the waits of ranks that do not set the step"
            )
    else:
        s += f"; the remaining {fmt_ns(rest, signed=True)} is outside the EP stages"
    s += (
        "."
        if stat == "mean"
        else " (or the gap between the P50 step and the mean stage times: the summaries lack step_time_mean_ns)."
    )
    if c.noise_ns is not None and not within_noise(c):
        s += f" The change is beyond the runs' own step-to-step spread (±{fmt_ns(c.noise_ns)}, 2 standard errors)."
    return s


def _ranks_txt(d: RunDigest) -> str:
    r = sorted(int(x) for x in d.ranks["rank"])
    return ", ".join(str(x) for x in r[:8]) + (" ..." if len(r) > 8 else "")


def stage_delta_figure(c: Comparison) -> go.Figure | None:
    """Per stage: A and B window per step (ms), grouped bars."""
    if c.stages.height == 0:
        return None
    fig = go.Figure(
        [
            go.Bar(
                name=f"A: {c.a.label}",
                x=c.stages["stage"].to_list(),
                y=(c.stages["a_window_ns"] / 1e6).round(4).to_numpy(),
            ),
            go.Bar(
                name=f"B: {c.b.label}",
                x=c.stages["stage"].to_list(),
                y=(c.stages["b_window_ns"] / 1e6).round(4).to_numpy(),
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        height=360,
        title={"text": "Stage window per step (mean over ranks)", "x": 0.01},
        yaxis_title="ms per step",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def rank_delta_figure(c: Comparison) -> go.Figure | None:
    """Per rank: change of step time and of barrier wait (ms, B − A)."""
    if c.ranks.height == 0:
        return None
    x = [f"r{r}" for r in c.ranks["rank"].to_list()]
    fig = go.Figure(
        [
            go.Bar(name="Δ step time", x=x, y=(c.ranks["delta_step_time_ns"] / 1e6).round(4).to_numpy()),
            go.Bar(name="Δ barrier wait", x=x, y=(c.ranks["delta_barrier_wait_ns"] / 1e6).round(4).to_numpy()),
        ]
    )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        height=340,
        title={"text": "Per-rank change (B − A; negative = better)", "x": 0.01},
        yaxis_title="ms per step",
        legend={"orientation": "h", "y": -0.2},
    )
    fig.update_xaxes(type="category")
    return fig


def render_compare_html(c: Comparison) -> str:
    """The comparison as one self-contained HTML page (plotly.js embedded once)."""
    from ep_trace.reports.html_page import figure_html, page, table_html

    st_rows = [
        [
            r["stage"],
            fmt_ns(r["a_window_ns"]),
            fmt_ns(r["b_window_ns"]),
            fmt_ns(r["delta_ns"], signed=True),
            fmt_ns(r["busy_delta_ns"], signed=True),
            r["change"],
        ]
        for r in c.stages.iter_rows(named=True)
    ]
    rk_rows = [
        [
            r["rank"],
            fmt_ns(r["a_step_time_ns"]),
            fmt_ns(r["b_step_time_ns"]),
            fmt_ns(r["delta_step_time_ns"], signed=True),
            fmt_ns(r["delta_exposed_comm_ns"], signed=True),
            fmt_ns(r["delta_barrier_wait_ns"], signed=True),
        ]
        for r in c.ranks.iter_rows(named=True)
    ]
    fd_rows = [
        [r["kind"], r["title"], fmt_ns(r["a_saving_ns"]), fmt_ns(r["b_saving_ns"]), r["status"]]
        for r in c.findings.iter_rows(named=True)
    ]
    body = (
        f'<div class="verdict none"><div class="headline">{html.escape(headline(c))}</div>'
        f'<div class="context">A = {html.escape(c.a.label)}; B = {html.escape(c.b.label)}. Deltas are B − A; negative is better.</div></div>'
        "<h2>Per stage</h2>"
        + figure_html(stage_delta_figure(c), "fig-cmp-stages", "No stages in either run.")
        + table_html(["stage", "A window", "B window", "Δ window", "Δ busy", "change"], st_rows, left=(0, 5))
        + "<h2>Per rank</h2>"
        + figure_html(rank_delta_figure(c), "fig-cmp-ranks", "No ranks.")
        + table_html(["rank", "A step P50", "B step P50", "Δ step", "Δ exposed comm", "Δ barrier wait"], rk_rows)
        + "<h2>Findings</h2>"
        + table_html(["kind", "finding", "A saving", "B saving", "status"], fd_rows, left=(0, 1, 4))
    )
    return page("ep-trace comparison", body, f"A: {c.a.label} · B: {c.b.label}")

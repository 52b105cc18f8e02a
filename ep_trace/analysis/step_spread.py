"""The run's own noise: how much each figure that ``ep-trace compare`` judges moves from step to step.

A figure of a run is a mean over its analysed steps; two runs differ by noise alone within two standard
errors of the difference of those means (:func:`two_se`, from each run's standard deviation over steps).
This module reduces an :class:`Analysis` to those per-step statistics, once, for both consumers: the
compare digest of a trace directory (:mod:`ep_trace.analysis.run_digest`) and the JSON summary's
``step_spread`` section (docs/summary.md), so that a saved summary is judged exactly as its trace
directory would be. Per-step series (s = analysed step):

* slowest step: max over ranks of the step length of step s (``overall.step_time_spread_ns``);
* per rank: the rank's step length, exposed comm and barrier wait of step s;
* per stage: the mean over ranks of the stage's window in step s (layers and micro-batches summed);
* I_e / I_r: step s's imbalance, Σ over its (layer, micro-batch) rows of the maxima over Σ of the means
  (the whole-run aggregate of :func:`ep_trace.analysis.imbalance.run_aggregate`, restricted to one step).

All times in ns; a standard deviation over fewer than 2 steps is ``None`` (unknown, not zero).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from ep_trace.analysis.result import Analysis

__all__ = [
    "STAGES_SCHEMA",
    "RANK_SPREAD_SCHEMA",
    "two_se",
    "slowest_step",
    "rank_spread",
    "stage_spread",
    "imbalance_spread",
    "step_spread",
]

#: Per stage: busy / window mean per step (mean over ranks), the window's sd over steps, steps seen.
STAGES_SCHEMA = pl.Schema(
    {"stage": pl.Utf8, "busy_ns": pl.Float64, "window_ns": pl.Float64, "window_sd_ns": pl.Float64, "n_steps": pl.Int64}
)
#: Per rank: steps, and mean / sd over steps of its step length, exposed comm and barrier wait.
RANK_SPREAD_SCHEMA = pl.Schema(
    {
        "rank": pl.Int64,
        "n_steps": pl.Int64,
        "step_time_mean_ns": pl.Float64,
        "step_time_sd_ns": pl.Float64,
        "exposed_comm_sd_ns": pl.Float64,
        "barrier_wait_sd_ns": pl.Float64,
    }
)
_SERIES = ("step_time", "exposed_comm", "barrier_wait")


def two_se(sd_a: Any, n_a: Any, sd_b: Any, n_b: Any) -> Any:
    """Two standard errors of a difference of means, ``2 sqrt(sd_a^2 / n_a + sd_b^2 / n_b)``: the noise
    of a step, a stage window or any per-step figure. One formula for floats and polars expressions."""
    return 2.0 * (sd_a**2 / n_a + sd_b**2 / n_b) ** 0.5


def slowest_step(steps: pl.DataFrame) -> tuple[float | None, float | None, int]:
    """Mean and standard deviation over steps of the slowest rank's step length (ns), and the steps.

    The sd is ``None`` with fewer than 2 steps; both are ``None`` without steps.
    """
    if steps.is_empty():
        return None, None, 0
    # sorted: group_by's row order varies run to run, and the float sum of std with it (last bits)
    per = steps.group_by("step").agg(pl.col("step_time_ns").max()).sort("step")["step_time_ns"].cast(pl.Float64)
    sd = float(per.std() or 0.0) if per.len() > 1 else None
    return float(per.mean()), sd, per.len()  # type: ignore[arg-type]


def rank_spread(steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank (:data:`RANK_SPREAD_SCHEMA`): steps, mean step length, and the sd over steps of its step
    length, exposed comm and barrier wait (null with one step)."""
    if steps.is_empty():
        return pl.DataFrame(schema=RANK_SPREAD_SCHEMA)
    one = pl.len() < 2
    sds = [
        pl.when(one).then(None).otherwise(pl.col(f"{c}_ns").cast(pl.Float64).std()).alias(f"{c}_sd_ns") for c in _SERIES
    ]
    return (
        steps.sort("rank", "step")
        .group_by("rank")
        .agg(pl.len().alias("n_steps"), pl.col("step_time_ns").cast(pl.Float64).mean().alias("step_time_mean_ns"), *sds)
        .cast(RANK_SPREAD_SCHEMA)  # type: ignore[arg-type]
        .select(RANK_SPREAD_SCHEMA.names())
        .sort("rank")
    )


def stage_spread(stages: pl.DataFrame) -> pl.DataFrame:
    """Per stage (:data:`STAGES_SCHEMA`): per step the mean over ranks of its busy time and window (layers,
    micro-batches summed), then the mean over steps, the window's sd over steps and the steps seen."""
    if stages.is_empty():
        return pl.DataFrame(schema=STAGES_SCHEMA)
    return (
        stages.group_by("rank", "step", "stage")
        .agg(pl.col("busy_ns").sum(), pl.col("window_ns").sum())
        .group_by("step", "stage")
        .agg(pl.col("busy_ns").mean(), pl.col("window_ns").mean())
        .sort("stage", "step")
        .group_by("stage")
        .agg(
            pl.col("busy_ns").mean(),
            pl.col("window_ns").mean(),
            pl.when(pl.len() < 2).then(None).otherwise(pl.col("window_ns").std()).alias("window_sd_ns"),
            pl.len().alias("n_steps"),
        )
        .cast(STAGES_SCHEMA)  # type: ignore[arg-type]
        .sort("stage")
    )


def imbalance_spread(imb: pl.DataFrame) -> dict[str, tuple[float | None, int]]:
    """``{"I_e": (sd, n), "I_r": (sd, n)}``: the sd over steps of each step's imbalance and the steps
    with that figure (sd ``None`` with fewer than 2; ``(None, 0)`` without routing data)."""
    out: dict[str, tuple[float | None, int]] = {"I_e": (None, 0), "I_r": (None, 0)}
    if imb.is_empty() or "step" not in imb.columns:
        return out
    for name, mx, mn in (("I_e", "n_e_max", "n_e_mean"), ("I_r", "L_max", "L_mean")):
        if mx not in imb.columns or mn not in imb.columns:
            continue
        d = imb.filter(pl.col("step").is_not_null() & pl.col(mx).is_not_null() & pl.col(mn).is_not_null())
        if name == "I_e":  # n_e is per (step, layer): count it once, not once per micro-batch row
            d = d.unique(["step", "layer"], keep="first")
        per = (
            d.group_by("step")
            .agg((pl.col(mx).sum() / pl.col(mn).sum()).alias("i"), pl.col(mn).sum().alias("m"))
            .filter(pl.col("m") > 0)
            .sort("step")["i"]
        )
        out[name] = (float(per.std() or 0.0) if per.len() > 1 else None, per.len())  # type: ignore[arg-type]
    return out


def step_spread(a: Analysis) -> dict[str, Any]:
    """The summary's ``step_spread`` section (docs/summary.md): the per-step statistics above, JSON-ready.

    Returns:
        ``{n_steps, step_time_ns: {mean, sd}, ranks: [...], stages: [...], imbalance: {I_e: {sd, n},
        I_r: {sd, n}}}``; unknown values ``None``.
    """
    mean, sd, n = slowest_step(a.steps)
    imb = imbalance_spread(a.imbalance)
    return {
        "n_steps": n,
        "step_time_ns": {"mean": mean, "sd": sd},
        "ranks": rank_spread(a.steps).to_dicts(),
        "stages": stage_spread(a.stages).to_dicts(),
        "imbalance": {k: {"sd": v[0], "n": v[1]} for k, v in imb.items()},
    }

"""One run of a sweep (:class:`SweepRun`), from an :class:`Analysis` or a saved summary; knob labels.

The per-run figures come from :mod:`ep_trace.analysis.run_facts`; :mod:`ep_trace.analysis.sweep` fits
and judges a list of these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from ep_trace.analysis.run_facts import _TIMES_SCHEMA, KNOBS, run_identity, run_knobs, stage_times, step_figures
from ep_trace.errors import BadInputError

if TYPE_CHECKING:
    from ep_trace.analysis.result import Analysis

__all__ = ["SweepRun", "sweep_run", "sweep_run_from_summary", "with_knobs", "num", "stage_at"]


@dataclass(frozen=True)
class SweepRun:
    """The figures of one run that a sweep needs.

    Attributes:
        label: Run name (its directory or file).
        knobs: :data:`~ep_trace.analysis.run_facts.KNOBS` plus ``experts``, ``moe_layers`` (None = unknown).
        identity: ``world_size``, ``placement``: what makes runs the same job (with the model knobs).
        conditions: The workload's other settings when known (``skew``, ``straggler``, ``link_latency_ms``).
        stages: :func:`~ep_trace.analysis.run_facts.stage_times` (ns per stage execution).
        figures: :func:`~ep_trace.analysis.run_facts.step_figures`.
        source: ``trace`` or ``summary``.
        record: The run record (:func:`ep_trace.analysis.run_record.run_record`), when built from traces.
    """

    label: str
    knobs: Mapping[str, Any]
    identity: Mapping[str, Any]
    conditions: Mapping[str, Any]
    stages: pl.DataFrame
    figures: Mapping[str, Any]
    source: str = "trace"
    record: Mapping[str, Any] | None = None


def sweep_run(
    a: Analysis, label: str, workload: Mapping[str, Any] | None = None, record: Mapping[str, Any] | None = None
) -> SweepRun:
    """The :class:`SweepRun` of one analysed trace set.

    Args:
        a: The run's analysis.
        label: Its name in tables and figures.
        workload: The sidecar ``meta.workload`` object, when present (docs/sidecar.md).
        record: Its run record, carried into the sweep's output.
    """
    knobs = run_knobs(a, dict(workload or {}))
    wl = workload or {}
    conditions = {k: wl.get(k) for k in ("skew", "straggler", "link_latency_ms")}
    return SweepRun(
        label, knobs, run_identity(a), conditions, stage_times(a), step_figures(a, knobs["tokens"]), "trace", record
    )


def num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def sweep_run_from_summary(summary: Mapping[str, Any], label: str) -> SweepRun:
    """A :class:`SweepRun` from a saved JSON summary (docs/summary.md), read defensively.

    A summary holds per-(rank, stage) windows per step summed over layers and no knobs: stage rows get
    ``layer = None`` and the time per step (divided by the layer count when a trace run of the same job
    gives it, see :func:`analyze_sweep`); knobs come from ``--label``.

    Raises:
        BadInputError: the object is not an ep-trace summary (naming ``label``).
    """
    if not isinstance(summary, Mapping) or "schema_version" not in summary or "ranks" not in summary:
        raise BadInputError(
            f"{label}: not an ep-trace summary (no 'schema_version' / 'ranks'); "
            "pass a trace directory or a file written by 'ep-trace analyze --json'"
        )
    rows = [r for r in (summary.get("stages") or []) if isinstance(r, Mapping)]
    recs: list[dict[str, Any]] = []
    for stage in ("dispatch", "combine", "expert"):
        vals = [num(r.get("window_ns")) for r in rows if r.get("stage") == stage]
        v = [x for x in vals if x is not None]
        if not v:
            continue
        t = min(v) if stage in ("dispatch", "combine") else max(v)
        recs.append({"stage": stage, "layer": None, "t_ns": t, "t_p25_ns": t, "t_p75_ns": t,
                     "t_mean_ns": float(np.mean(v)), "n": 1, "a2a_calls": None, "bytes": None})  # fmt: skip
    ranks = [r for r in summary.get("ranks") or [] if isinstance(r, Mapping)]
    steps = [x for x in (num(r.get("step_time_ns")) for r in ranks) if x is not None]
    step = max(steps) if steps else None
    if step is not None:
        recs.append({"stage": "step", "layer": None, "t_ns": step, "t_p25_ns": step, "t_p75_ns": step,
                     "t_mean_ns": float(np.mean(steps)), "n": 1, "a2a_calls": None, "bytes": None})  # fmt: skip
    stages = pl.DataFrame(recs, schema=_TIMES_SCHEMA) if recs else pl.DataFrame(schema=_TIMES_SCHEMA)
    ratios = [
        e / s
        for e, s in ((num(r.get("exposed_comm_ns")), num(r.get("step_time_ns"))) for r in ranks)
        if e is not None and s
    ]
    imb = summary.get("imbalance") if isinstance(summary.get("imbalance"), Mapping) else {}
    figures = {
        "step_time_ns": step,
        "step_p25_ns": step,
        "step_p75_ns": step,
        "tokens_per_step": None,
        "tokens_per_s": None,
        "exposed_comm_ratio": max(ratios) if ratios else None,
        "I_r": num(imb.get("I_r")) if isinstance(imb, Mapping) else None,
    }
    knobs = dict.fromkeys((*KNOBS, "experts", "moe_layers"))
    identity = {"world_size": summary.get("n_ranks"), "placement": None}
    return SweepRun(label, knobs, identity, {}, stages, figures, "summary", None)


def with_knobs(run: SweepRun, values: Mapping[str, Any]) -> SweepRun:
    """``run`` with knob values set (``--label RUN=knob:value``); ``tokens`` also refreshes tokens/s."""
    knobs = {**run.knobs, **values}
    figures = dict(run.figures)
    tok = num(knobs.get("tokens"))
    if "tokens" in values and tok is not None:
        n = run.identity.get("world_size")
        if isinstance(n, int) and n > 0:
            figures["tokens_per_step"] = tok * n
            if figures.get("step_time_ns"):
                figures["tokens_per_s"] = tok * n / (figures["step_time_ns"] / 1e9)
    return replace(run, knobs=knobs, figures=figures)


def stage_at(run: SweepRun, stage: str, col: str = "t_ns") -> float | None:
    sel = run.stages.filter((pl.col("stage") == stage) & pl.col("layer").is_null())
    return num(sel[col][0]) if sel.height else None

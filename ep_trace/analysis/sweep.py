"""A sweep: several runs of one job that differ in one knob, explained by one curve per stage.

Per run (:class:`SweepRun`, from an :class:`Analysis` or a saved summary) the knobs and the time of
one execution of each stage (:mod:`ep_trace.analysis.run_facts`); over the runs (:func:`analyze_sweep`):

* fits ``T = α + β·x`` per (stage, layer) by least squares over each run's fastest call (best of its (step, layer) calls), ``x`` the swept
  knob, and for dispatch / combine also ``x`` = bytes one rank moves per call; with r², residuals,
  standard errors and a 95 % interval of α (Student t, n − 2 degrees of freedom);
* throughput (tokens/s) per run and where it is non-monotonic in the knob (a change counts when it
  exceeds both 5 % and twice the runs' own step-to-step spread);
* the verdict at the operating point (the run with the largest knob value), from the share of one
  MoE layer's time that each cause takes there:

  fixed latency, bandwidth, expert compute, imbalance (:mod:`ep_trace.analysis.sweep_verdict`).

Nothing here reads files: the CLI passes runs in and writes the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from ep_trace.analysis.linefit import confidence, fit_line
from ep_trace.analysis.run_facts import KNOBS, NUMERIC_KNOBS, SWEEP_STAGES
from ep_trace.analysis.sweep_runs import SweepRun, num, sweep_run, sweep_run_from_summary, with_knobs
from ep_trace.analysis.sweep_verdict import VERDICT_KINDS, Verdict, judge
from ep_trace.errors import BadInputError

__all__ = [
    "SweepRun",
    "SweepResult",
    "Verdict",
    "sweep_run",
    "sweep_run_from_summary",
    "with_knobs",
    "analyze_sweep",
    "fit_line",
    "sweep_dict",
    "SWEEP_SCHEMA_VERSION",
    "VERDICT_KINDS",
]

#: Version of the sweep.json layout (docs/sweep.md).
SWEEP_SCHEMA_VERSION = 1

#: knob -> identity fields that the knob changes with it (so they may differ across the sweep).
_IMPLIED = {"ep_size": ("world_size", "placement")}


@dataclass(frozen=True)
class SweepResult:
    """What :func:`analyze_sweep` returns (docs/sweep.md).

    Attributes:
        knob: The swept knob.
        runs: One row per run, sorted by the knob: ``label, x`` plus knobs, conditions and figures.
        fits: ``stage, layer, x, alpha_ns, beta_ns_per_unit, r2, n, alpha_se_ns, beta_se_ns_per_unit,
            alpha_ci95_lo_ns, alpha_ci95_hi_ns, a2a_calls, alpha_per_a2a_ns, confidence``.
        residuals: ``stage, layer, x, label, x_value, t_ns, fit_ns, residual_ns``.
        throughput: ``monotonic``, ``peak_label``, ``peak_x``, ``changes`` (significant moves between
            neighbouring runs), ``noise`` (the largest relative step-time spread of a run).
        verdict: The :class:`Verdict`, or None with fewer than 2 distinct knob values.
        notes: Caveats (summary runs, unknown fields).
        records: The per-run records, in run order (None where a run has none).
        details: Per run, in run order: ``label, x, source, knobs, conditions, figures`` (typed values).
    """

    knob: str
    runs: pl.DataFrame
    fits: pl.DataFrame
    residuals: pl.DataFrame
    throughput: Mapping[str, Any]
    verdict: Verdict | None
    notes: tuple[str, ...] = ()
    records: tuple[Mapping[str, Any] | None, ...] = field(default_factory=tuple)
    details: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)


def _pick_knob(runs: Sequence[SweepRun], by: str | None) -> str:
    varying = [k for k in KNOBS if len({run.knobs.get(k) for run in runs if run.knobs.get(k) is not None}) > 1]
    if by is not None:
        if by not in KNOBS:
            raise BadInputError(f"--by: unknown knob {by!r}; use one of {', '.join(KNOBS)}")
        return by
    if len(varying) == 1:
        return varying[0]
    if not varying:
        raise BadInputError(
            "sweep: the runs do not differ in any knob ("
            + ", ".join(KNOBS)
            + "); label each run with --label RUN=KNOB:VALUE"
        )
    raise BadInputError(f"sweep: the runs differ in {', '.join(varying)}; pass --by KNOB to choose the swept one")


def _check_same_job(runs: Sequence[SweepRun], knob: str) -> None:
    """Refuse runs of different jobs: every knob and identity field but the swept one must agree."""
    allowed = {knob, *_IMPLIED.get(knob, ())}
    fields = [(f, "knobs") for f in (*KNOBS, "experts", "moe_layers")] + [
        (f, "identity") for f in ("world_size", "placement")
    ]
    for name, where in fields:
        if name in allowed:
            continue
        seen: dict[Any, str] = {}
        for run in runs:
            v = getattr(run, where).get(name)
            if v is not None and v not in seen:
                seen[v] = run.label
        if len(seen) > 1:
            (v1, l1), (v2, l2) = list(seen.items())[:2]
            what = (
                f"{name} differs ({l1} vs {l2})"
                if name == "placement"
                else f"{name} = {v1!r} in {l1} but {v2!r} in {l2}"
            )
            raise BadInputError(
                f"sweep: {what}; a sweep compares runs of one job that differ only in the swept knob "
                f"({knob}): drop the run or sweep {name} with --by {name}"
                if name in KNOBS
                else f"sweep: {what}; a sweep compares runs of one job that differ only in the swept knob ({knob}): drop the run"
            )


def _x_value(run: SweepRun, knob: str) -> float | None:
    return num(run.knobs.get(knob))


def _fits(runs: Sequence[SweepRun], xs: Sequence[float | None], knob: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows, res = [], []
    for stage in SWEEP_STAGES:
        layers: set[int | None] = set()
        for run in runs:
            layers |= set(run.stages.filter(pl.col("stage") == stage)["layer"].to_list())
        for layer in sorted(layers, key=lambda v: (v is None, v if v is not None else 0)):
            pts: list[tuple[str, Any, Any, Any, Any]] = []
            for run, xk in zip(runs, xs, strict=True):
                sel = run.stages.filter((pl.col("stage") == stage) & (pl.col("layer").eq_missing(layer)))
                if sel.height == 0:
                    continue
                r = sel.row(0, named=True)
                # fit the best call of each run (interference only adds time); the median without a best
                t = r["t_best_ns"] if r.get("t_best_ns") is not None else r["t_ns"]
                pts.append((run.label, xk, r["bytes"], t, r["a2a_calls"]))
            axes = [(knob, 1)]
            if stage in ("dispatch", "combine"):
                axes.append(("bytes", 2))
            for axis, idx in axes:
                p = [q for q in pts if q[idx] is not None and q[3] is not None]
                f = fit_line([float(q[idx]) for q in p], [float(q[3]) for q in p])
                if f["alpha"] is None:
                    continue
                calls = [q[4] for q in p if q[4]]
                a2a = float(np.median(calls)) if calls else None
                rows.append(
                    {
                        "stage": stage,
                        "layer": layer,
                        "x": axis,
                        "alpha_ns": f["alpha"],
                        "beta_ns_per_unit": f["beta"],
                        "r2": f["r2"],
                        "n": f["n"],
                        "alpha_se_ns": f["alpha_se"],
                        "beta_se_ns_per_unit": f["beta_se"],
                        "alpha_ci95_lo_ns": f["alpha_lo"],
                        "alpha_ci95_hi_ns": f["alpha_hi"],
                        "a2a_calls": a2a,
                        "alpha_per_a2a_ns": f["alpha"] / a2a if a2a else None,
                        "confidence": confidence(f["r2"], f["n"]),
                    }
                )
                for q, fit in zip(p, f["fitted"], strict=True):
                    res.append({"stage": stage, "layer": layer, "x": axis, "label": q[0], "x_value": float(q[idx]),
                                "t_ns": float(q[3]), "fit_ns": fit, "residual_ns": float(q[3]) - fit})  # fmt: skip
    fit_schema = {
        "stage": pl.Utf8, "layer": pl.Int32, "x": pl.Utf8, "alpha_ns": pl.Float64, "beta_ns_per_unit": pl.Float64,
        "r2": pl.Float64, "n": pl.Int64, "alpha_se_ns": pl.Float64, "beta_se_ns_per_unit": pl.Float64,
        "alpha_ci95_lo_ns": pl.Float64, "alpha_ci95_hi_ns": pl.Float64, "a2a_calls": pl.Float64,
        "alpha_per_a2a_ns": pl.Float64, "confidence": pl.Utf8,
    }  # fmt: skip
    res_schema = {"stage": pl.Utf8, "layer": pl.Int32, "x": pl.Utf8, "label": pl.Utf8, "x_value": pl.Float64,
                  "t_ns": pl.Float64, "fit_ns": pl.Float64, "residual_ns": pl.Float64}  # fmt: skip
    return pl.DataFrame(rows, schema=fit_schema), pl.DataFrame(res, schema=res_schema)


def _throughput(runs: Sequence[SweepRun], xs: Sequence[float | None]) -> dict[str, Any]:
    pts = [(run, x, num(run.figures.get("tokens_per_s"))) for run, x in zip(runs, xs, strict=True)]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    noise = 0.0
    for run, _, _ in pts:
        s, lo, hi = (num(run.figures.get(k)) for k in ("step_time_ns", "step_p25_ns", "step_p75_ns"))
        if s and lo is not None and hi is not None:
            noise = max(noise, (hi - lo) / s)
    out: dict[str, Any] = {"monotonic": None, "peak_label": None, "peak_x": None, "changes": [], "noise": noise}
    if len(pts) < 2:
        return out
    thr = max(0.05, 2.0 * noise)
    changes, signs = [], []
    for (ra, xa, ta), (rb, xb, tb) in zip(pts, pts[1:], strict=False):
        rel = (tb - ta) / ta if ta else 0.0  # type: ignore[operator]
        sig = abs(rel) > thr
        changes.append({"from": ra.label, "to": rb.label, "from_x": xa, "to_x": xb, "change": rel, "significant": sig})
        if sig:
            signs.append(1 if rel > 0 else -1)
    peak = max(pts, key=lambda p: p[2])  # type: ignore[arg-type,return-value]
    out.update(
        monotonic=all(s == signs[0] for s in signs) if signs else True,
        peak_label=peak[0].label,
        peak_x=peak[1],
        changes=changes,
        threshold=thr,
    )
    return out


def analyze_sweep(runs: Sequence[SweepRun], by: str | None = None) -> SweepResult:
    """Fit, compare and judge the runs of one sweep (module doc; docs/sweep.md).

    Args:
        runs: Two or more runs of one job.
        by: The swept knob (default: the one knob whose values differ).

    Returns:
        The frozen :class:`SweepResult`.

    Raises:
        BadInputError: fewer than 2 runs, runs of different jobs, a knob that is not given for every
            run or does not vary, a non-numeric knob.
    """
    if len(runs) < 2:
        raise BadInputError(f"sweep: needs at least 2 runs, got {len(runs)}")
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise BadInputError(
            f"sweep: a run is given twice ({', '.join(sorted({x for x in labels if labels.count(x) > 1}))})"
        )
    knob = _pick_knob(runs, by)
    _check_same_job(runs, knob)
    missing = [r.label for r in runs if r.knobs.get(knob) is None]
    if missing:
        raise BadInputError(
            f"sweep: {knob} is unknown for {', '.join(missing)} (the traces do not say); "
            f"pass --label RUN={knob}:VALUE for each"
        )
    notes: list[str] = []
    numeric = knob in NUMERIC_KNOBS
    if not numeric:
        notes.append(f"{knob} is not numeric: fits are against the bytes moved per call only")
    runs = sorted(runs, key=lambda r: (_x_value(r, knob) is None, _x_value(r, knob) or 0.0, str(r.knobs.get(knob))))
    xs = [_x_value(r, knob) if numeric else None for r in runs]
    if numeric and len(set(xs)) < 2:
        raise BadInputError(f"sweep: every run has {knob} = {xs[0]:g}; a sweep needs at least 2 values")
    layers = {r.knobs.get("moe_layers") for r in runs if r.source == "trace" and r.knobs.get("moe_layers")}
    if any(r.source == "summary" for r in runs):
        n_layers = layers.pop() if len(layers) == 1 else None
        fixed = []
        for r in runs:
            if r.source != "summary":
                fixed.append(r)
                continue
            per = pl.col("stage") != "step"
            div = float(n_layers or 1)
            fixed.append(replace(r, stages=r.stages.with_columns(
                [pl.when(per).then(pl.col(c) / div).otherwise(pl.col(c)).alias(c)
                 for c in ("t_ns", "t_p25_ns", "t_p75_ns", "t_best_ns", "t_mean_ns")]
            )))  # fmt: skip
        runs = fixed
        notes.append(
            "summary runs: stage times are windows per step"
            + (
                f" divided by the {n_layers} MoE layers of the trace runs"
                if n_layers
                else " (layer count unknown: per step)"
            )
            + "; CPU trace runs use host ranges instead, so mixed CPU sweeps compare slightly different figures"
        )
    fits, residuals = _fits(runs, xs, knob)
    thr = _throughput(runs, xs)
    verdict, why = judge(runs, xs, fits, knob, thr) if numeric else (None, "the operating point needs a numeric knob")
    if verdict is None:
        notes.append(f"no verdict: {why}")
    run_rows = []
    for r, x in zip(runs, xs, strict=True):
        run_rows.append(
            {"label": r.label, "x": x, "source": r.source,
             **{f"knob_{k}": (None if r.knobs.get(k) is None else str(r.knobs.get(k))) for k in (*KNOBS, "experts", "moe_layers")},
             **{f"cond_{k}": (None if r.conditions.get(k) is None else str(r.conditions.get(k))) for k in ("skew", "straggler", "link_latency_ms")},
             **{k: num(r.figures.get(k)) for k in ("step_time_ns", "step_p25_ns", "step_p75_ns", "tokens_per_step",
                                                    "tokens_per_s", "exposed_comm_ratio", "I_r")}}
        )  # fmt: skip
    return SweepResult(
        knob=knob,
        runs=pl.DataFrame(run_rows, infer_schema_length=None),
        fits=fits,
        residuals=residuals,
        throughput=thr,
        verdict=verdict,
        notes=tuple(notes),
        records=tuple(r.record for r in runs),
        details=tuple(
            {
                "label": r.label,
                "x": x,
                "source": r.source,
                "knobs": dict(r.knobs),
                "conditions": dict(r.conditions),
                "figures": dict(r.figures),
            }
            for r, x in zip(runs, xs, strict=True)
        ),  # fmt: skip
    )


def sweep_dict(result: SweepResult) -> dict[str, Any]:
    """The JSON-ready ``sweep.json`` object of ``result`` (docs/sweep.md); NaN / inf become null."""
    from ep_trace.analysis.summary import _clean

    v = result.verdict
    return _clean(
        {
            "schema_version": SWEEP_SCHEMA_VERSION,
            "knob": result.knob,
            "fits": result.fits.to_dicts(),
            "runs": [dict(d) for d in result.details],
            "residuals": result.residuals.to_dicts(),
            "throughput": dict(result.throughput),
            "verdict": None
            if v is None
            else {"kind": v.kind, "title": v.title, "evidence": dict(v.evidence), "remedy": v.remedy},
            "notes": list(result.notes),
            "records": [None if r is None else dict(r) for r in result.records],
        }
    )

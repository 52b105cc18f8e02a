"""A sweep: several runs of one job that differ in one knob, explained by one curve per stage.

Per run (:class:`SweepRun`, from an :class:`Analysis` or a saved summary) the knobs and the time of
one execution of each stage (:mod:`ep_trace.analysis.run_facts`); over the runs (:func:`analyze_sweep`):

* fits ``T = α + β·x`` per (stage, layer) by least squares over the runs' medians, ``x`` the swept
  knob, and for dispatch / combine also ``x`` = bytes one rank moves per call; with r², residuals,
  standard errors and a 95 % interval of α (Student t, n − 2 degrees of freedom);
* throughput (tokens/s) per run and where it is non-monotonic in the knob (a change counts when it
  exceeds both 5 % and twice the runs' own step-to-step spread);
* the verdict at the operating point (the run with the largest knob value), from the share of one
  MoE layer's time that each cause takes there:

  - ``fixed_latency_bound``: Σ α of dispatch and combine (fit vs bytes, else vs the knob): the part of
    the all-to-alls that does not shrink with the message;
  - ``bandwidth_bound``: the rest of dispatch + combine (the bytes-proportional part);
  - ``expert_compute_bound``: the expert stage's mean over ranks (the work itself);
  - ``imbalance_bound``: expert max − mean over ranks (what the most loaded rank adds; every rank
    waits for it in combine).

  The largest share is the verdict; evidence carries all four shares and the fits they came from.

Nothing here reads files: the CLI passes runs in and writes the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from ep_trace.analysis.run_facts import (
    KNOBS,
    NUMERIC_KNOBS,
    SWEEP_STAGES,
    run_identity,
    run_knobs,
    stage_times,
    step_figures,
)
from ep_trace.errors import BadInputError

if TYPE_CHECKING:
    from ep_trace.analysis.result import Analysis

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

VERDICT_KINDS: tuple[str, ...] = ("fixed_latency_bound", "bandwidth_bound", "expert_compute_bound", "imbalance_bound")

#: Two-sided 95 % Student-t quantiles for 1..30 degrees of freedom (beyond: 1.96).
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

#: knob -> identity fields that the knob changes with it (so they may differ across the sweep).
_IMPLIED = {"ep_size": ("world_size", "placement")}

_REMEDY = {
    "fixed_latency_bound": (
        "A fixed cost per all-to-all pins the layer: fewer cross-node hops per all-to-all (a smaller EP "
        "group or node-limited routing, experts grouped or replicated so that most tokens stay inside a "
        "node, hierarchical all-to-all), low-latency all-to-all kernels for small messages, or more tokens "
        "per call (larger batches, fewer micro-batches) to amortise it. Buffer sizes, chunking and overlap "
        "tuning do not move a fixed latency."
    ),
    "bandwidth_bound": (
        "The all-to-alls grow with the bytes moved: send fewer bytes (FP8 dispatch halves them), keep "
        "traffic on the fast links (topology-aware expert placement, hierarchical all-to-all), and hide "
        "the rest under compute (chunked dispatch-GEMM-combine pipelining)."
    ),
    "expert_compute_bound": (
        "The expert GEMMs are the cost and communication is not the limit: make them efficient (grouped "
        "GEMM / fused MoE kernels, lower precision) or spread the experts over more ranks (a larger EP size) "
        "if the all-to-all cost stays small."
    ),
    "imbalance_bound": (
        "The most loaded rank sets the layer time: re-place or replicate the hot experts (EPLB-style "
        "placement), or balance the router (auxiliary-loss-free bias, capacity factor)."
    ),
}


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


@dataclass(frozen=True)
class Verdict:
    """The sweep's verdict: ``kind`` (:data:`VERDICT_KINDS`), the numbers behind it, the remedy in EP terms."""

    kind: str
    evidence: Mapping[str, Any]
    remedy: str
    title: str = ""


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


def _num(x: Any) -> float | None:
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
        vals = [_num(r.get("window_ns")) for r in rows if r.get("stage") == stage]
        v = [x for x in vals if x is not None]
        if not v:
            continue
        t = min(v) if stage in ("dispatch", "combine") else max(v)
        recs.append({"stage": stage, "layer": None, "t_ns": t, "t_p25_ns": t, "t_p75_ns": t,
                     "t_mean_ns": float(np.mean(v)), "n": 1, "a2a_calls": None, "bytes": None})  # fmt: skip
    ranks = [r for r in summary.get("ranks") or [] if isinstance(r, Mapping)]
    steps = [x for x in (_num(r.get("step_time_ns")) for r in ranks) if x is not None]
    step = max(steps) if steps else None
    if step is not None:
        recs.append({"stage": "step", "layer": None, "t_ns": step, "t_p25_ns": step, "t_p75_ns": step,
                     "t_mean_ns": float(np.mean(steps)), "n": 1, "a2a_calls": None, "bytes": None})  # fmt: skip
    from ep_trace.analysis.run_facts import _TIMES_SCHEMA

    stages = pl.DataFrame(recs, schema=_TIMES_SCHEMA) if recs else pl.DataFrame(schema=_TIMES_SCHEMA)
    ratios = [
        e / s
        for e, s in ((_num(r.get("exposed_comm_ns")), _num(r.get("step_time_ns"))) for r in ranks)
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
        "I_r": _num(imb.get("I_r")) if isinstance(imb, Mapping) else None,
    }
    knobs = dict.fromkeys((*KNOBS, "experts", "moe_layers"))
    identity = {"world_size": summary.get("n_ranks"), "placement": None}
    return SweepRun(label, knobs, identity, {}, stages, figures, "summary", None)


def with_knobs(run: SweepRun, values: Mapping[str, Any]) -> SweepRun:
    """``run`` with knob values set (``--label RUN=knob:value``); ``tokens`` also refreshes tokens/s."""
    knobs = {**run.knobs, **values}
    figures = dict(run.figures)
    tok = _num(knobs.get("tokens"))
    if "tokens" in values and tok is not None:
        n = run.identity.get("world_size")
        if isinstance(n, int) and n > 0:
            figures["tokens_per_step"] = tok * n
            if figures.get("step_time_ns"):
                figures["tokens_per_s"] = tok * n / (figures["step_time_ns"] / 1e9)
    return replace(run, knobs=knobs, figures=figures)


def fit_line(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """Least-squares ``y = α + β·x``.

    Returns:
        ``alpha, beta, r2, n, alpha_se, beta_se, alpha_lo, alpha_hi, fitted`` (list); r², standard
        errors and the 95 % interval of α are None below 3 points (no degrees of freedom left);
        r² is None when y does not vary.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    out: dict[str, Any] = {"n": n, "alpha": None, "beta": None, "r2": None, "alpha_se": None, "beta_se": None,
                           "alpha_lo": None, "alpha_hi": None, "fitted": [None] * n}  # fmt: skip
    if n < 2 or np.ptp(xs) == 0:
        return out
    xm, ym = xs.mean(), ys.mean()
    sxx = float(((xs - xm) ** 2).sum())
    beta = float(((xs - xm) * (ys - ym)).sum() / sxx)
    alpha = float(ym - beta * xm)
    fitted = alpha + beta * xs
    ss_res = float(((ys - fitted) ** 2).sum())
    ss_tot = float(((ys - ym) ** 2).sum())
    out.update(alpha=alpha, beta=beta, fitted=[float(v) for v in fitted])
    if n >= 3:
        out["r2"] = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
        s2 = ss_res / (n - 2)
        out["beta_se"] = math.sqrt(s2 / sxx)
        out["alpha_se"] = math.sqrt(s2 * (1.0 / n + xm * xm / sxx))
        t = _T95[n - 3] if n - 2 <= len(_T95) else 1.96
        out["alpha_lo"], out["alpha_hi"] = alpha - t * out["alpha_se"], alpha + t * out["alpha_se"]
    return out


def _confidence(r2: float | None, n: int) -> str:
    if r2 is None:
        return "none"
    if r2 >= 0.9 and n >= 4:
        return "high"
    return "medium" if r2 >= 0.8 else "low"


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
    return _num(run.knobs.get(knob))


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
                pts.append((run.label, xk, r["bytes"], r["t_ns"], r["a2a_calls"]))
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
                        "confidence": _confidence(f["r2"], f["n"]),
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
    pts = [(run, x, _num(run.figures.get("tokens_per_s"))) for run, x in zip(runs, xs, strict=True)]
    pts = [p for p in pts if p[1] is not None and p[2] is not None]
    noise = 0.0
    for run, _, _ in pts:
        s, lo, hi = (_num(run.figures.get(k)) for k in ("step_time_ns", "step_p25_ns", "step_p75_ns"))
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


def _stage_at(run: SweepRun, stage: str, col: str = "t_ns") -> float | None:
    sel = run.stages.filter((pl.col("stage") == stage) & pl.col("layer").is_null())
    return _num(sel[col][0]) if sel.height else None


#: Knobs that scale the bytes one all-to-all moves (their fit's intercept is the zero-message cost).
_WORK_KNOBS = ("tokens", "hidden", "top_k")
#: Smallest max/min ratio of bytes per call over the runs for a fit against bytes to split α from β.
_MIN_BYTES_RANGE = 2.0


def _bytes_range(runs: Sequence[SweepRun], stage: str) -> float:
    vals = [_stage_at(r, stage, "bytes") for r in runs]
    b = [v for v in vals if v]
    return max(b) / min(b) if len(b) >= 2 and min(b) > 0 else 0.0


def _t95(n: int) -> float:
    return _T95[n - 3] if 3 <= n and n - 2 <= len(_T95) else 1.96


def _significant(est: float | None, se: float | None, n: int) -> bool:
    """``est`` > 0 at the 95 % level (Student t, n − 2 df); with 2 points (no df) just ``est`` > 0."""
    if est is None:
        return False
    if n < 3 or se is None:
        return est > 0
    return est - _t95(n) * se > 0


def _verdict(runs: Sequence[SweepRun], xs: Sequence[float | None], fits: pl.DataFrame, knob: str,
             thr: Mapping[str, Any]) -> tuple[Verdict | None, str]:  # fmt: skip
    valid = [(r, x) for r, x in zip(runs, xs, strict=True) if x is not None]
    if len({x for _, x in valid}) < 2:
        return None, "fewer than 2 distinct knob values"
    op, x_op = max(valid, key=lambda p: p[1])  # type: ignore[arg-type,return-value]
    alphas: dict[str, Any] = {}
    latency = bandwidth = unresolved = comm_imbalance = 0.0
    splittable = True
    for stage in ("dispatch", "combine"):
        f = fits.filter((pl.col("stage") == stage) & pl.col("layer").is_null())
        by_bytes, by_knob = f.filter(pl.col("x") == "bytes"), f.filter(pl.col("x") == knob)
        use = by_bytes if by_bytes.height and _bytes_range(runs, stage) >= _MIN_BYTES_RANGE else None
        if use is None and knob in _WORK_KNOBS and by_knob.height:
            use = by_knob  # the knob scales the bytes moved: its intercept is the zero-message cost
        measured = _stage_at(op, stage) or 0.0
        if use is None or use.height == 0:
            splittable = False
            continue
        row = use.row(0, named=True)
        # a part counts only when its coefficient is > 0 at the 95 % level: a flat, noisy all-to-all
        # time (r² ~ 0) has an intercept but no resolved fixed latency, and no resolved bandwidth
        a_sig = _significant(row["alpha_ns"], row["alpha_se_ns"], row["n"])
        b_sig = _significant(row["beta_ns_per_unit"], row["beta_se_ns_per_unit"], row["n"])
        a = min(max(row["alpha_ns"], 0.0), measured) if a_sig else 0.0
        b = measured - a if b_sig else 0.0
        # the bytes above the ranks' mean (the most loaded rank moves more rows) are routing imbalance:
        # balanced routing would give every rank the mean
        bmax, bmean = _stage_at(op, stage, "bytes"), _stage_at(op, stage, "bytes_mean")
        excess = b * (1.0 - bmean / bmax) if b and bmax and bmean and bmean < bmax else 0.0
        latency, bandwidth, unresolved = latency + a, bandwidth + b - excess, unresolved + measured - a - b
        comm_imbalance += excess
        alphas[stage] = {"alpha_ns": row["alpha_ns"], "x": row["x"], "r2": row["r2"], "n": row["n"],
                         "alpha_ci95_lo_ns": row["alpha_ci95_lo_ns"], "alpha_per_a2a_ns": row["alpha_per_a2a_ns"],
                         "alpha_significant": a_sig, "beta_significant": b_sig, "used_ns": a}  # fmt: skip
    comm = (_stage_at(op, "dispatch") or 0.0) + (_stage_at(op, "combine") or 0.0)
    e_max = _stage_at(op, "expert") or 0.0
    e_mean = _stage_at(op, "expert", "t_mean_ns") or 0.0
    layer = _stage_at(op, "moe_layer") or (comm + e_max)
    parts: dict[str, float | None] = {
        "fixed_latency_bound": latency,
        "bandwidth_bound": bandwidth,
        "expert_compute_bound": e_mean,
        "imbalance_bound": max(e_max - e_mean, 0.0) + comm_imbalance,
    }
    resolved = max(e_mean, e_max - e_mean + comm_imbalance)
    if not splittable:
        # the knob does not change the bytes moved (chunks, ep_size, ...): α and β cannot be told apart,
        # so the all-to-all time is one part; no verdict when it is the largest
        parts["fixed_latency_bound"] = parts["bandwidth_bound"] = None
        if comm >= resolved:
            return None, (
                f"{knob} does not change the bytes an all-to-all moves, so its fixed latency and its bandwidth "
                "cannot be told apart, and the all-to-alls are the largest part of the layer; sweep tokens "
                "(or hidden, top_k) to split them"
            )
    elif unresolved > max(resolved, latency, bandwidth):
        return None, (
            "the all-to-all time does not follow a line in the knob (neither its fixed part nor its per-byte part "
            "is > 0 at the 95 % level; r² "
            + ", ".join(f"{s} {v['r2']:.2f}" for s, v in alphas.items() if v["r2"] is not None)
            + ") and it is the largest part of the layer; rerun with more steps or more knob values"
        )
    kind = max((k for k in parts if parts[k] is not None), key=lambda k: parts[k] or 0.0)
    shares = {k: (v / layer if layer and v is not None else None) for k, v in parts.items()}
    other = max(layer - comm - e_max, 0.0)  # route / permute / unpermute, host gaps
    comm_r2 = [v["r2"] for v in alphas.values() if v.get("r2") is not None]
    confidence = "low" if not comm_r2 or min(comm_r2) < 0.8 else ("high" if min(comm_r2) >= 0.9 else "medium")
    i_r = [(r.label, _num(r.figures.get("I_r"))) for r, _ in valid]
    evidence = {
        "operating_point": {"label": op.label, knob: x_op},
        "layer_time_ns": layer,
        "shares": shares,
        "parts_ns": parts,
        "other_ns": other,
        "other_share": other / layer if layer else None,
        "comm_fits": alphas,
        "comm_ns": comm,
        "unresolved_comm_ns": unresolved,
        "expert_imbalance_ns": max(e_max - e_mean, 0.0),
        "comm_imbalance_ns": comm_imbalance,
        "latency_split": splittable,
        "fit_confidence": confidence,
        "I_r": {lbl: v for lbl, v in i_r},
        "exposed_comm_ratio": {r.label: _num(r.figures.get("exposed_comm_ratio")) for r, _ in valid},
        "throughput_monotonic": thr.get("monotonic"),
    }
    pct = shares[kind]
    names = {
        "fixed_latency_bound": "the fixed per-call latency of the all-to-alls (α of dispatch + combine)",
        "bandwidth_bound": "the bytes-proportional part of the all-to-alls",
        "expert_compute_bound": "the expert GEMMs (mean over ranks)",
        "imbalance_bound": "the excess of the most loaded rank's expert work over the mean",
    }
    title = (
        f"At {knob} = {x_op:g} ({op.label}), {names[kind]} takes "
        + (f"{pct:.0%}" if pct is not None else "the largest part")
        + " of an MoE layer"
    )
    return Verdict(kind, evidence, _REMEDY[kind], title), ""


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
                 for c in ("t_ns", "t_p25_ns", "t_p75_ns", "t_mean_ns")]
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
    verdict, why = (
        _verdict(runs, xs, fits, knob, thr) if numeric else (None, "the operating point needs a numeric knob")
    )
    if verdict is None:
        notes.append(f"no verdict: {why}")
    run_rows = []
    for r, x in zip(runs, xs, strict=True):
        run_rows.append(
            {"label": r.label, "x": x, "source": r.source,
             **{f"knob_{k}": (None if r.knobs.get(k) is None else str(r.knobs.get(k))) for k in (*KNOBS, "experts", "moe_layers")},
             **{f"cond_{k}": (None if r.conditions.get(k) is None else str(r.conditions.get(k))) for k in ("skew", "straggler", "link_latency_ms")},
             **{k: _num(r.figures.get(k)) for k in ("step_time_ns", "step_p25_ns", "step_p75_ns", "tokens_per_step",
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

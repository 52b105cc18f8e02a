"""The CI gate of ``ep-trace compare BASE NEW --fail-on-regression``: is NEW worse than BASE on a gated metric?

A gated metric fails when NEW - BASE exceeds BOTH

* the runs' own noise: two standard errors of the difference of the two runs' means per step
  (:func:`ep_trace.analysis.step_spread.two_se`, each run's standard deviation over its steps); unknown
  for a run with one step or a summary saved before schema 3 (no ``step_spread``), when the threshold
  alone decides; and
* the threshold: ``threshold_pct`` % of the metric's reference, and 1 µs for times.

With earlier runs of BASE's configuration (``--history``, :func:`history_noise`) the noise of a metric is
also at least its run-to-run spread: ``t(0.975, m - 1) x sqrt(2) x`` the standard deviation of the metric
over BASE and those runs (m values): the noise of the difference of two single runs when whole runs differ
by more than their steps do (on the 2-vCPU CI machine identical demo runs stepped 20 or 28 ms, run by run,
with a 2 ms spread within each: benchmarks/README.md, "CI gate").

Every metric here is worse when larger. Metrics (docs/ci.md), with the reference of their threshold:

========================  ========================================================  ====================
name                      value (per step unless said)                               reference
========================  ========================================================  ====================
``step_time``             the slowest rank's mean step (compare's step statistic)    its BASE value
``stage:NAME``            the stage's window, mean over ranks                        its BASE value (the
                                                                                     BASE step if absent)
``exposed_comm``          max over ranks of the mean exposed communication           the BASE step
``barrier_wait``          max over ranks of the mean barrier wait                    the BASE step
``I_e``, ``I_r``          whole-run expert / rank imbalance (max / mean)             its BASE value
``finding:KIND``          the finding's simulated saving (0 when absent)             the BASE step
========================  ========================================================  ====================

Exposed comm, barrier wait and a finding's saving are time lost, often near zero in BASE: a change is
judged by what it costs the step, not against its own small base. The noise of a finding's saving is
the step time's (a saving is a paired difference of steps, never noisier than the step). Groups:
``stages`` (every stage of either run), ``findings`` (every finding kind of either run), ``all``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import polars as pl

from ep_trace.analysis.result import FindingKind
from ep_trace.analysis.run_compare import Comparison
from ep_trace.analysis.run_digest import RunDigest
from ep_trace.analysis.step_spread import two_se
from ep_trace.stage_names import STAGES

__all__ = [
    "DEFAULT_THRESHOLD_PCT",
    "GATE_METRICS",
    "GATE_SCHEMA",
    "Gate",
    "parse_gates",
    "check_threshold",
    "check_history",
    "evaluate",
    "history_noise",
    "RunNoise",
    "MIN_HISTORY_RUNS",
]

#: ``--threshold`` default, percent.
DEFAULT_THRESHOLD_PCT = 5.0
#: Names ``--gate`` takes besides ``stage:NAME`` and ``finding:KIND``.
GATE_METRICS: tuple[str, ...] = ("all", "step_time", "stages", "exposed_comm", "barrier_wait", "I_e", "I_r", "findings")
#: Earlier runs ``--history`` needs (with BASE: 3 values of each metric).
MIN_HISTORY_RUNS = 2
#: Two-sided 95 % Student t quantiles by degrees of freedom (1..10; 2.0 beyond): the spread of few runs is
#: itself uncertain, and 2 standard deviations of 3 runs would false-alarm far above 5 %.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
#: A time change below this is never a regression (the clock's resolution on old traces), ns.
TIME_FLOOR_NS = 1000.0
#: Columns of :attr:`Gate.lines`.
GATE_SCHEMA = pl.Schema(
    {
        "metric": pl.Utf8,
        "unit": pl.Utf8,  # 'ns' or 'ratio'
        "base": pl.Float64,
        "new": pl.Float64,
        "delta": pl.Float64,
        "change_pct": pl.Float64,
        "noise": pl.Float64,
        "reference": pl.Utf8,  # 'base value' or 'base step'
        "reference_value": pl.Float64,
        "limit": pl.Float64,
        "status": pl.Utf8,  # 'pass', 'fail' or 'n/a'
        "note": pl.Utf8,
    }
)
_RUN_TO_RUN = "noise: run-to-run spread over BASE and its earlier runs (--history)"
_NOISE_UNKNOWN = "noise unknown (a run with one step, or a summary without step_spread): the threshold alone decides"


@dataclass(frozen=True)
class Gate:
    """The gate's verdict: one row per gated metric (:data:`GATE_SCHEMA`).

    Attributes:
        threshold_pct: The threshold, percent of each metric's reference.
        gates: The ``--gate`` selection it ran with.
        lines: The metrics: base / new values, delta (new - base), change_pct (percent of the reference
            value; null when it is 0), noise (null: unknown), reference ('base value' or 'base step') and
            its value, limit (the largest of noise, threshold and floor: a delta above it fails), status,
            note (why n/a, that the noise is unknown, or that it is the run-to-run spread).
        history_runs: Runs the run-to-run noise was measured over (BASE and ``--history``); 0 without.
    """

    threshold_pct: float
    gates: tuple[str, ...]
    lines: pl.DataFrame
    history_runs: int = 0

    @property
    def failed(self) -> tuple[str, ...]:
        """Names of the failed metrics, in line order."""
        return tuple(self.lines.filter(pl.col("status") == "fail")["metric"].to_list())

    @property
    def passed(self) -> bool:
        """No gated metric failed."""
        return not self.failed


def check_threshold(pct: float) -> float:
    """``pct`` when it is a finite number >= 0.

    Raises:
        ConfigError: naming ``--threshold``.
    """
    from ep_trace.errors import ConfigError

    if not (isinstance(pct, (int, float)) and math.isfinite(pct) and pct >= 0):
        raise ConfigError(f"--threshold: must be a percentage >= 0 (e.g. 5 for 5 %), got {pct!r}")
    return float(pct)


def check_history(n: int) -> int:
    """``n`` when ``--history`` names enough earlier runs (:data:`MIN_HISTORY_RUNS`).

    Raises:
        ConfigError: naming ``--history``.
    """
    from ep_trace.errors import ConfigError

    if n < MIN_HISTORY_RUNS:
        raise ConfigError(
            f"--history: give at least {MIN_HISTORY_RUNS} earlier runs of BASE's configuration (got {n}): "
            f"the run-to-run spread needs {MIN_HISTORY_RUNS + 1} runs with BASE"
        )
    return n


def parse_gates(values: Iterable[str] | None) -> tuple[str, ...]:
    """The ``--gate`` values (repeatable, comma-separated) as metric names; ``("all",)`` when none.

    Raises:
        ConfigError: an unknown name or finding kind, naming ``--gate`` and what it takes.
    """
    from ep_trace.errors import ConfigError

    out: list[str] = []
    for v in values or ():
        for name in (x.strip() for x in v.split(",")):
            if not name:
                continue
            kind, sep, arg = name.partition(":")
            if sep and kind in ("stage", "finding") and not arg:
                raise ConfigError(f"--gate: '{name}' names no {kind}; use {kind}:NAME, e.g. {_EXAMPLE[kind]}")
            if sep and kind == "finding" and arg not in get_args(FindingKind):
                raise ConfigError(
                    f"--gate: unknown finding kind '{arg}'; use one of {', '.join(get_args(FindingKind))}"
                )
            if not (sep and kind in ("stage", "finding")) and name not in GATE_METRICS:
                raise ConfigError(
                    f"--gate: unknown metric '{name}'; use step_time, stages, stage:NAME, exposed_comm, "
                    "barrier_wait, I_e, I_r, findings, finding:KIND or all"
                )
            if name not in out:
                out.append(name)
    return tuple(out) or ("all",)


_EXAMPLE = {"stage": "stage:dispatch", "finding": "finding:straggler_wait"}


def _worst_rank(d: RunDigest, col: str) -> tuple[float | None, float | None, int]:
    """(value, sd, n) of the rank with the largest ``col`` (mean per step); (None, None, 0) without one."""
    r = d.ranks.filter(pl.col(col).is_not_null())
    if r.is_empty():
        return None, None, 0
    row = r.sort(col, descending=True).row(0, named=True)
    return float(row[col]), row[col.replace("_ns", "_sd_ns")], int(row["n_steps"] or 0)


def _imbalance(d: RunDigest, name: str) -> tuple[float | None, float | None, int]:
    """(value, sd, n) of ``I_e`` / ``I_r``; (None, None, 0) when the run has no routing data."""
    r = d.imbalance.filter(pl.col("metric") == name)
    return (None, None, 0) if r.is_empty() else (r["value"][0], r["sd"][0], int(r["n"][0] or 0))


def _noise(sd_a: float | None, n_a: int, sd_b: float | None, n_b: int) -> float | None:
    if sd_a is None or sd_b is None or n_a < 2 or n_b < 2:
        return None
    return float(two_se(sd_a, n_a, sd_b, n_b))


def _stage_key(stage: str) -> tuple[int, str]:
    return (STAGES.index(stage) if stage in STAGES else len(STAGES), stage)


def _row(
    metric: str,
    unit: str,
    base: float | None,
    new: float | None,
    noise: float | None,
    step: float | None = None,
    on_step: bool = False,
) -> dict[str, Any]:
    """One metric before judgement; the threshold is a share of ``step`` (BASE's) when ``on_step``, else of ``base``."""
    note = None
    if base is None or new is None:
        note = "not measured in " + (
            "either run" if base is None and new is None else "BASE" if base is None else "NEW"
        )
    elif noise is None:
        note = _NOISE_UNKNOWN
    return {
        "metric": metric,
        "unit": unit,
        "base": base,
        "new": new,
        "noise": noise,
        "ref": step if on_step else base,
        "reference": "base step" if on_step else "base value",
        "note": note,
    }


def _candidates(c: Comparison) -> list[dict[str, Any]]:
    """Every metric the comparison can gate (:func:`_row`), in line order, before selection."""
    step = c.a_step_ns
    rows = [_row("step_time", "ns", c.a_step_ns, c.b_step_ns, c.noise_ns)]
    for r in sorted(c.stages.iter_rows(named=True), key=lambda r: _stage_key(r["stage"])):
        # a stage BASE lacks (window 0) is judged against BASE's step
        absent = not r["a_window_ns"]
        rows.append(_row(f"stage:{r['stage']}", "ns", r["a_window_ns"], r["b_window_ns"], r["noise_ns"], step, absent))
    for name in ("exposed_comm", "barrier_wait"):
        (va, sa, na), (vb, sb, nb) = (_worst_rank(d, f"{name}_ns") for d in (c.a, c.b))
        rows.append(_row(name, "ns", va, vb, _noise(sa, na, sb, nb), step, on_step=True))
    for name in ("I_e", "I_r"):
        (va, sa, na), (vb, sb, nb) = (_imbalance(d, name) for d in (c.a, c.b))
        rows.append(_row(name, "ratio", va, vb, _noise(sa, na, sb, nb)))
    for r in c.findings.iter_rows(named=True):
        base, new = float(r["a_saving_ns"] or 0), float(r["b_saving_ns"] or 0)
        rows.append(_row(f"finding:{r['kind']}", "ns", base, new, c.noise_ns, step, on_step=True))
    return rows


def _selected(rows: list[dict[str, Any]], gates: tuple[str, ...], c: Comparison) -> list[dict[str, Any]]:
    """The rows ``gates`` selects, plus a row for each named metric neither run has."""
    if "all" in gates:
        return rows

    def wanted(m: str) -> bool:
        group = {"stage": "stages", "finding": "findings"}.get(m.partition(":")[0])
        return m in gates or (group is not None and group in gates)

    out = [r for r in rows if wanted(r["metric"])]
    have = {r["metric"] for r in rows}
    for g in gates:
        if g.startswith("finding:") and g not in have:  # no such finding in either run: no saving on either side
            out.append(_row(g, "ns", 0.0, 0.0, c.noise_ns, c.a_step_ns, on_step=True))
        elif g.startswith("stage:") and g not in have:
            out.append(_row(g, "ns", None, None, None) | {"note": "in neither run"})
    return out


@dataclass(frozen=True)
class RunNoise:
    """Run-to-run noise per metric (:func:`history_noise`).

    Attributes:
        runs: Runs it was measured over (BASE and its earlier runs).
        by_metric: Metric name -> noise of a difference of two single runs, in the metric's unit (ns or ratio).
    """

    runs: int
    by_metric: Mapping[str, float]


def history_noise(base: RunDigest, history: Sequence[RunDigest]) -> RunNoise:
    """Per metric, the run-to-run noise of a difference of two single runs (module doc): ``t x sqrt(2) x``
    the standard deviation of the metric over ``base`` and ``history`` (earlier runs of its configuration),
    in the metric's unit. A finding a run lacks counts as a saving of 0 there; a metric some run lacks
    otherwise (a stage, routing data) gets no entry.

    Raises:
        ConfigError: fewer than :data:`MIN_HISTORY_RUNS` runs in ``history``, naming ``--history``.
    """
    from ep_trace.analysis.run_compare import compare_runs

    check_history(len(history))
    runs = [{r["metric"]: r["base"] for r in _candidates(compare_runs(d, d))} for d in (base, *history)]
    findings = {m for r in runs for m in r if m.startswith("finding:")}
    out: dict[str, float] = {}
    for metric in set().union(*runs):
        values = [r.get(metric, 0.0 if metric in findings else None) for r in runs]
        if any(v is None for v in values):
            continue
        m = len(values)
        t = _T975[m - 2] if m - 1 <= len(_T975) else 2.0
        out[metric] = t * math.sqrt(2.0) * statistics.stdev(float(v) for v in values)  # type: ignore[arg-type]
    return RunNoise(len(runs), out)


def evaluate(
    c: Comparison,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    gates: tuple[str, ...] = ("all",),
    run_noise: RunNoise | None = None,
) -> Gate:
    """Judge every gated metric of ``c`` (module doc): pass, fail, or n/a where a run lacks the metric.

    Args:
        c: The comparison, A = BASE and B = NEW.
        threshold_pct: Percent of each metric's reference a change must exceed (as well as the noise).
        gates: Metric names and groups (:func:`parse_gates`).
        run_noise: :func:`history_noise` of BASE and its earlier runs: a metric's noise is at least this.
    """
    rows = _selected(_candidates(c), gates, c)
    for r in rows:
        extra = run_noise.by_metric.get(r["metric"]) if run_noise is not None else None
        if extra is not None and r["base"] is not None and r["new"] is not None:
            if r["noise"] is None or extra > r["noise"]:
                r["noise"], r["note"] = extra, _RUN_TO_RUN
    num = dict.fromkeys(("base", "new", "noise", "ref"), pl.Float64)
    df = pl.DataFrame(rows, schema={**dict.fromkeys(("metric", "unit", "reference", "note"), pl.Utf8), **num})
    base, new, ref = pl.col("base"), pl.col("new"), pl.col("ref")
    delta = new - base
    floor = pl.when(pl.col("unit") == "ns").then(pl.lit(TIME_FLOOR_NS)).otherwise(pl.lit(0.0))
    limit = pl.max_horizontal(pl.col("noise").fill_null(0.0), ref.abs().fill_null(0.0) * (threshold_pct / 100), floor)
    lines = df.with_columns(
        delta.alias("delta"),
        pl.when(ref > 0).then(delta / ref * 100).otherwise(None).alias("change_pct"),
        ref.alias("reference_value"),
        pl.when(base.is_null() | new.is_null()).then(None).otherwise(limit).alias("limit"),
    ).with_columns(
        pl.when(pl.col("limit").is_null())
        .then(pl.lit("n/a"))
        .when(pl.col("delta") > pl.col("limit"))
        .then(pl.lit("fail"))
        .otherwise(pl.lit("pass"))
        .alias("status")
    )
    runs = 0 if run_noise is None else run_noise.runs
    return Gate(threshold_pct, gates, lines.select(GATE_SCHEMA.names()).cast(GATE_SCHEMA), runs)  # type: ignore[arg-type]

"""The regression gate for people and dashboards: its lines, its verdict sentence and its JSON.

The gate itself is :mod:`ep_trace.analysis.regression_gate`; this module only words it. One line per
gated metric: result, metric, BASE -> NEW, change (percent of the metric's reference: its BASE value, or
"of step" for time lost, judged against BASE's step), the runs' noise and the limit a change must exceed
to fail (the larger of noise and threshold).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ep_trace.analysis.regression_gate import Gate
from ep_trace.reports.units import fmt_ns, is_missing

__all__ = ["gate_header", "gate_rows", "gate_lines", "gate_verdict", "gate_to_dict"]

_COLUMNS = ("result", "metric", "base", "new", "change", "noise", "limit")


def _value(x: float | None, unit: str, signed: bool = False) -> str:
    if is_missing(x):
        return "–"
    if unit == "ns":
        return fmt_ns(x, signed=signed)
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _change(r: dict[str, Any]) -> str:
    """The change in percent of the reference ("of step" when that is BASE's step, as for time lost)."""
    if r["status"] == "n/a":
        return "–"
    if r["change_pct"] is None:
        return "new" if r["delta"] > 0 else "0"
    return f"{r['change_pct']:+.1f}%" + (" of step" if r["reference"] == "base step" else "")


def gate_header(g: Gate) -> str:
    """What the gate checked, one sentence."""
    noise = "the runs' noise (2 standard errors"
    noise += f"; at least the run-to-run spread over {g.history_runs} runs)" if g.history_runs else ")"
    return (
        f"regression gate: a metric fails when NEW - BASE exceeds both {noise} "
        f"and {g.threshold_pct:g}% of its reference (its BASE value; the BASE step for exposed_comm, "
        "barrier_wait and finding:*)"
    )


def gate_rows(g: Gate) -> list[list[str]]:
    """Per gated metric the cells of :data:`_COLUMNS`, as text."""
    out = []
    for r in g.lines.iter_rows(named=True):
        u = r["unit"]
        noise = "unknown" if r["noise"] is None and r["status"] != "n/a" else _value(r["noise"], u)
        out.append(
            [
                r["status"].upper() if r["status"] == "fail" else r["status"],
                r["metric"],
                _value(r["base"], u),
                _value(r["new"], u),
                _change(r),
                noise if noise in ("unknown", "–") else f"±{noise}",
                _value(r["limit"], u, signed=True),
            ]
        )
    return out


def gate_lines(g: Gate) -> list[str]:
    """The header, a column header and one aligned line per gated metric (n/a lines end with their reason)."""
    rows = [list(_COLUMNS), *gate_rows(g)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    left = (0, 1)
    lines = [gate_header(g)]
    notes = [None, *g.lines["note"].to_list()]
    for cells, note in zip(rows, notes, strict=True):
        text = "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        if note is not None and cells[0] == "n/a":
            text += f"  ({note})"
        lines.append("  " + text.rstrip())
    return lines


def _moved(r: dict[str, Any]) -> str:
    d = _value(r["delta"], r["unit"], signed=True)
    return f"{r['metric']} {d} ({_change(r)})"


def gate_verdict(g: Gate) -> str:
    """One sentence: which metrics failed, or that none did (with the count of metrics judged)."""
    judged = g.lines.filter(pl.col("status") != "n/a")
    na = g.lines.height - judged.height
    rule = f"beyond the runs' noise and the {g.threshold_pct:g}% threshold"
    if g.passed:
        tail = f"; {na} n/a" if na else ""
        n = judged.height
        return f"gate passed: no gated metric is worse {rule} ({n} metric{'' if n == 1 else 's'} judged{tail})."
    failed = g.lines.filter(pl.col("status") == "fail")
    parts = ", ".join(_moved(r) for r in failed.iter_rows(named=True))
    return f"NEW is worse than BASE {rule} on {failed.height} of {judged.height} gated metrics: {parts}"


def gate_to_dict(g: Gate) -> dict[str, Any]:
    """The ``gate`` object of ``ep-trace compare --json`` (docs/summary.md)."""
    return {
        "threshold_pct": g.threshold_pct,
        "gates": list(g.gates),
        "passed": g.passed,
        "history_runs": g.history_runs,
        "failed": list(g.failed),
        "metrics": g.lines.to_dicts(),  # polars nulls, never NaN: JSON-ready
    }

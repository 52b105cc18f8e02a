"""What a fuzz case's run ended in: the outcome classifier of the robustness campaign.

Acceptable (the contract of issues 12 and 40):

* ``error``: exit 2 with our one-line message (``error: ...``, no control character);
* ``nothing``: exit 1, nothing to analyze (one line);
* ``excluded``: exit 0 and what was left out is named (a load-report entry, or a note naming missing /
  excluded ranks or inconsistent records);
* ``ok``: exit 0, a sane summary (every invariant of :func:`insane` holds).

Violations:

* ``wrong``: exit 0 with a number that breaks an invariant, or a bad input accepted without a word (a
  class whose mutation must be refused or named: ``expect = "refuse"``), or a stale cached result;
* ``bad_message``: an exit-2 message of several lines, or a control character reaching the terminal,
  or a report whose embedded JSON a trace string can break out of;
* ``crash``: a traceback (any exception but ours), an exit code outside 0 / 1 / 2, a segfault;
* ``blowup``: MemoryError or death under the address-space cap;
* ``hang``: no answer within the per-case timeout;
* ``modified``: an input file changed or removed, or a file named like a trace written into an input
  directory (the next run would read it as a rank).

``skipped`` counts mutations that did not apply to the source set.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ep_trace.analysis.breakdown import BREAKDOWN_PARTS

__all__ = ["ACCEPTABLE", "OUTCOMES", "classify_cli", "classify_summary", "control_leak", "insane", "named", "one_line"]

OUTCOMES = (
    "error",
    "nothing",
    "excluded",
    "ok",
    "wrong",
    "bad_message",
    "crash",
    "blowup",
    "hang",
    "modified",
    "skipped",
)
ACCEPTABLE = frozenset({"error", "nothing", "excluded", "ok", "skipped"})

#: A character that must not reach the terminal raw: C0 but newline, DEL, C1, U+2028 / U+2029.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
#: Words of a note that names what the analysis left out.
_NAMING = ("missing", "excluded", "not in the trace", "no sidecar", "without a sidecar", "inconsistent", "ignored")


def insane(summary: dict[str, Any]) -> str | None:
    """The first broken invariant of a summary, or None."""
    bad: list[str] = []

    def walk(o: Any, path: str) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{path}.{k}")
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, f"{path}[{i}]")
        elif isinstance(o, float) and not math.isfinite(o):
            bad.append(f"{path}={o}")
        elif isinstance(o, (int, float)) and not isinstance(o, bool):
            leaf = path.rsplit(".", 1)[-1]
            signed = any(w in leaf for w in ("offset", "delta", "lateness", "skew"))
            # a what-if row may lengthen the step (docs/summary.md: chunking ranks whose transfers
            # cannot hide); a finding's saving may not
            signed = signed or (path.startswith(".whatif[") and leaf == "saving_ns")
            if leaf.endswith("_ns") and not signed and o < 0:
                bad.append(f"{path}={o} < 0")
            ratio = "overlap" in leaf or leaf == "share" or leaf.endswith(("_share", "_ratio"))
            if ratio and not leaf.endswith("_ns") and not 0 <= o <= 1:
                bad.append(f"{path}={o} not in [0, 1]")  # a ratio, not a time

    walk(summary, "")
    rows = list(summary.get("ranks") or [])
    overall = summary.get("overall") or {}
    breakdown = list(summary.get("breakdown") or [])
    for b in breakdown:  # the parts of a step add up to it (means rounded to 1 ns each)
        parts = [b.get(k) for k in BREAKDOWN_PARTS]
        st = b.get("step_time_ns")
        if all(isinstance(x, int) for x in parts) and isinstance(st, int) and abs(sum(parts) - st) > 7:
            bad.append(f"breakdown of rank {b.get('rank')}: parts sum to {sum(parts)}, step is {st}")
    for r in rows + [overall] + breakdown:
        st = r.get("step_time_ns")
        for key in ("barrier_wait_ns", "exposed_comm_ns"):
            v = r.get(key)
            if isinstance(st, (int, float)) and isinstance(v, (int, float)) and v > st * 1.0001 + 1000:
                bad.append(f"{key}={v} > step_time_ns={st} (rank {r.get('rank')})")
    # the invariants the analysis' last pass enforces, on the published summary (ep_trace.analysis.invariants)
    from ep_trace.analysis.invariants import summary_violations

    bad += summary_violations(summary)
    return bad[0] if bad else None


def named(summary: dict[str, Any]) -> bool:
    """The summary names something it left out: a load-report entry, or a note saying what is missing."""
    if summary.get("load_report"):
        return True
    notes = " ".join(str(n) for n in summary.get("notes") or []).lower()
    return any(w in notes for w in _NAMING)


def classify_summary(summary: dict[str, Any], expect: str) -> dict[str, str]:
    """``ok`` / ``excluded`` / ``wrong`` for a run that exited 0 with ``summary``.

    ``expect``: ``"refuse"`` when the case's input is inconsistent (an exit 0 must name what it left
    out), ``"any"`` otherwise."""
    why = insane(summary)
    if why:
        return {"outcome": "wrong", "detail": why}
    if named(summary):
        return {"outcome": "excluded", "detail": ""}
    if expect == "refuse":
        return {"outcome": "wrong", "detail": "an inconsistent input accepted without a word"}
    return {"outcome": "ok", "detail": ""}


def control_leak(text: str) -> str | None:
    """The first control character of ``text`` that would drive a terminal, as its escape, or None."""
    m = _CONTROL.search(text)
    return None if m is None else f"{ord(m.group()):#x} at {m.start()}: {text[max(0, m.start() - 40) : m.start()]!r}"


def one_line(err: str) -> bool:
    """``err`` is one ``error: ...`` line."""
    return err.startswith("error: ") and len(err.splitlines()) == 1


def _report_leak(html_path: Path) -> str | None:
    """A trace string that broke out of the report's embedded JSON (a "<" in a spec block), or None."""
    try:
        html = html_path.read_text(encoding="utf-8")
    except OSError:
        return None
    for m in re.finditer(r'<script type="application/json" id="[^"]*">(.*?)</script>', html, re.S):
        if "<" in m.group(1):
            return "a '<' inside an embedded JSON block"
        try:
            json.loads(m.group(1))
        except ValueError:
            return "an embedded JSON block that does not parse"
    return None


def classify_cli(code: int, out: str, err: str, case: Path, plan: dict[str, Any]) -> dict[str, str]:
    """The outcome of ``ep-trace <argv>`` run in ``case``: exit code, stdout, stderr, and the summary /
    report the plan names (``summary``, ``html``: paths relative to ``case``)."""
    leak = control_leak(out) or control_leak(err)
    if leak:
        return {"outcome": "bad_message", "detail": f"control character on the terminal: {leak}"}
    if code == 2:
        ok = one_line(err)
        return {"outcome": "error" if ok else "bad_message", "detail": err[:300]}
    if code == 1:
        return {"outcome": "nothing" if one_line(err) else "bad_message", "detail": err[:300]}
    if code != 0:
        return {"outcome": "crash", "detail": f"exit {code}: {err[-300:]}"}
    if plan.get("html"):
        broken = _report_leak(case / plan["html"])
        if broken:
            return {"outcome": "bad_message", "detail": broken}
    if plan.get("summary") and (case / plan["summary"]).is_file():
        return classify_summary(json.loads((case / plan["summary"]).read_bytes()), plan.get("expect", "any"))
    if plan.get("expect") == "refuse":
        return {"outcome": "wrong", "detail": "exit 0 where the run must be refused"}
    return {"outcome": "ok", "detail": ""}

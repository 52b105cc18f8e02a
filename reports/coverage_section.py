"""Stage coverage in words: the terminal lines, the report section and the verdict's clause.

All three read :func:`ep_trace.analysis.stage_coverage.summarize` (the JSON summary's
``stage_coverage``): the share of the MoE time whose stage was found, by detection tier, the MoE time
no stage claimed, and the largest unclaimed kernels with the ``--stages`` rows that would claim them.
"""

from __future__ import annotations

from typing import Any

from ep_trace.analysis.result import Analysis
from ep_trace.analysis.stage_coverage import WARN_SHARE, summarize
from ep_trace.reports.html_page import esc, table_html
from ep_trace.reports.units import fmt_ns, fmt_pct

__all__ = ["coverage_of", "coverage_sentence", "coverage_lines", "coverage_html", "unattributed_clause"]

_SHORT = 90
#: Unattributed MoE time (without a named kernel) from which the verdict says so: 1 % of the MoE time.
_MATERIAL = 0.01


def coverage_of(analysis: Analysis) -> dict[str, Any] | None:
    """:func:`~ep_trace.analysis.stage_coverage.summarize` of the analysis (None without MoE time)."""
    return summarize(analysis.stage_coverage, analysis.unassigned_kernels)


def _short(name: str) -> str:
    return name if len(name) <= _SHORT else name[: _SHORT - 1] + "…"


def coverage_sentence(c: dict[str, Any]) -> str:
    """'stages found for 97.1% of the MoE time (family 87.3%, module 9.8%)' plus the unclaimed time."""
    tiers = ", ".join(f"{t} {fmt_pct(x)}" for t, x in c["by_tier"].items() if x >= 0.0005)
    text = f"Stages found for {fmt_pct(c['share'])} of the MoE time" + (f" ({tiers})" if tiers else "")
    if c["unassigned_ns"] > 0:
        text += f"; {fmt_ns(c['unassigned_ns'])} per step of MoE work got no stage"
    return text + "."


def coverage_lines(analysis: Analysis, top: int = 3) -> list[tuple[str, str]]:
    """Terminal lines ``(text, style)``: the coverage sentence; below 90 % a warning and the largest
    unclaimed kernels with the pattern that would claim each."""
    c = coverage_of(analysis)
    if c is None:
        return []
    out = [(coverage_sentence(c), "yellow" if c["warn"] else "dim")]
    if c["warn"]:
        out.append(
            (
                f"warning: stages found for only {fmt_pct(c['share'])} of the MoE time (below {fmt_pct(WARN_SHARE)}); "
                "the per-stage figures and the verdict leave the rest out. Largest kernels without a stage "
                "(--stages rows that claim them: the report's stage coverage section, or stage_coverage.snippet "
                "of --json):",
                "bold yellow",
            )
        )
        for u in c["unassigned_top"][:top]:
            out.append(
                (
                    f"  {_short(u['name'])}: {fmt_ns(u['per_step_ns'])} per step, "
                    f"stage {u['guess']} by its neighbours, pattern '{u['pattern']}'",
                    "yellow",
                )
            )
    return out


def coverage_html(analysis: Analysis) -> str:
    """The report's stage-coverage section: sentence, share by tier and rank, unclaimed kernels, snippet."""
    c = coverage_of(analysis)
    if c is None:
        return (
            '<p class="note">No MoE time found: no stage range, kernel family, MoE module frame or MoE op '
            "window in the trace, so there is no coverage to measure.</p>"
        )
    cls = "warn" if c["warn"] else "note"
    parts = [f'<p class="{cls}">{esc(coverage_sentence(c))}</p>']
    if c["warn"]:
        parts.append(
            f'<p class="warn">Below {esc(fmt_pct(WARN_SHARE))}: the stage breakdown and the verdict leave the '
            "unattributed time out. The kernels below ran inside MoE layers without a stage; the rows at the "
            "end claim them when passed with <code>--stages</code>.</p>"
        )
    tiers = [[t, fmt_pct(x)] for t, x in c["by_tier"].items()]
    parts.append(table_html(["tier", "share of the MoE time"], tiers))
    ranks = [[r["rank"], fmt_pct(r["share"]), fmt_ns(r["moe_ns"]), fmt_ns(r["unassigned_ns"])] for r in c["per_rank"]]
    parts.append(table_html(["rank", "stages found", "MoE time per step", "no stage, per step"], ranks[:64]))
    if c["unassigned_top"]:
        rows = [
            [_short(u["name"]), fmt_ns(u["per_step_ns"]), u["count"], u["guess"], u["pattern"]]
            for u in c["unassigned_top"]
        ]
        parts.append(
            "<h3>Kernels inside MoE layers without a stage</h3>"
            '<p class="note">Per step: the kernels\' own time (kernels on concurrent streams can overlap attributed '
            "time). Stage: the stage of the nearest attributed kernel of the same layer.</p>"
            + table_html(["kernel", "per step", "count", "stage", "pattern"], rows, left=[0, 3, 4])
            + f"<pre>{esc(c['snippet'])}</pre>"
        )
    return "".join(parts)


def unattributed_clause(analysis: Analysis) -> str | None:
    """What the verdict says instead of 'no bottleneck' while MoE time has no stage, or None."""
    c = coverage_of(analysis)
    # named kernels without a stage, or at least 1 % of the MoE time (the host glue between the stage
    # ranges of an instrumented CPU layer is unattributed too, but no candidate)
    if c is None or c["unassigned_ns"] <= 0 or (not c["unassigned_top"] and c["share"] > 1 - _MATERIAL):
        return None
    return (
        f"{fmt_ns(c['unassigned_ns'])} per step of MoE work ({fmt_pct(1 - c['share'])} of the MoE time) could not "
        f"be attributed to a stage, so no verdict covers it; in the stages found ({fmt_pct(c['share'])}) every "
        "check stays below its threshold"
    )

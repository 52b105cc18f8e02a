"""A finding or figure withheld by the invariants pass is one line in the terminal and the report, never
its numbers; with no finding left the verdict says so (ep_trace/analysis/invariants.py; the JSON's
``withheld``: tests/analysis/test_invariants.py)."""

from __future__ import annotations

import dataclasses

from fake_analysis import make_fake_analysis
from rich.console import Console, Group

from ep_trace.analysis.result import Withheld
from ep_trace.reports import digest
from ep_trace.reports.html import render_report
from ep_trace.reports.terminal import summary_renderables

HELD = (
    Withheld("finding", "host_bound", (1,), "compute_le_step", "rank 1, step 1009: compute 119 ms > step 100 ms"),
    Withheld("rank_figures", "compute", (1,), "compute_le_step", "rank 1, step 1009: compute 119 ms > step 100 ms"),
)
LINES = [
    "withheld finding host_bound (rank 1): breaks compute_le_step: rank 1, step 1009: compute 119 ms > step 100 ms",
    "withheld rank figures compute (rank 1): breaks compute_le_step: rank 1, step 1009: compute 119 ms > step 100 ms",
]


def test_lines_everywhere_and_the_verdict_says_findings_were_withheld() -> None:
    a = dataclasses.replace(make_fake_analysis(n_ranks=2), findings=(), withheld=HELD)
    assert digest.withheld_lines(a) == LINES
    con = Console(record=True, width=300)
    con.print(Group(*summary_renderables(a)))
    text = con.export_text()
    assert all(line in text for line in LINES)
    v = digest.verdict(a)
    assert v.headline.startswith("No finding can be published")
    assert v.detail == (
        "1 finding withheld: its figures break a physical invariant (the withheld lines say which and why)."
    )
    html = render_report(a)
    assert all(f'<p class="note withheld">{line.replace(">", "&gt;")}</p>' in html for line in LINES)


def test_many_withheld_lines_are_capped() -> None:
    many = tuple(dataclasses.replace(HELD[1], name=f"x{i}") for i in range(10))
    a = dataclasses.replace(make_fake_analysis(n_ranks=2), withheld=many)
    lines = digest.withheld_lines(a, limit=3)
    assert len(lines) == 4
    assert lines[-1] == "... and 7 more withheld (the JSON summary's withheld lists them all)"

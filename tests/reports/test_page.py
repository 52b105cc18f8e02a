"""The page: section order, verdict first, one embedded plotly.js, tolerant of missing data."""

from __future__ import annotations

import dataclasses
import re

import pytest
from fake_analysis import make_fake_analysis

from ep_trace.analysis.whatif_checks import RERUN_CHECKS
from ep_trace.reports import digest
from ep_trace.reports.html import render_report
from ep_trace.reports.html_page import Section
from ep_trace.reports.units import fmt_ns, fmt_pct


@pytest.fixture(scope="module")
def a4():
    return make_fake_analysis()


@pytest.fixture(scope="module")
def page4(a4):
    return render_report(a4, sources=["demo_traces"])


def test_units():
    assert [fmt_ns(x) for x in (None, 0, 999, 1500, 45_600, 880_000, 2_000_000, 12_345_678, 250_000_000, 2.5e9)] == [
        "–",
        "0 ns",
        "999 ns",
        "1.50 µs",
        "45.6 µs",
        "880 µs",
        "2.00 ms",
        "12.3 ms",
        "250 ms",
        "2.50 s",
    ]
    assert fmt_ns(-1500, signed=True) == "-1.50 µs" and fmt_ns(1500, signed=True) == "+1.50 µs"
    assert fmt_pct(0.394) == "39.4%" and fmt_pct(float("nan")) == "–"


def test_verdict_names_the_top_finding_with_its_saving(a4):
    v = digest.verdict(a4)
    assert v.headline == "Rank 2 arrives last in every dispatch; the other ranks wait 2.0 ms per step"
    assert v.severity == "high"
    # step (slowest rank) = 2 layers x 1230 µs x 1.25 + 2 ms + 3 µs rank skew = 5.078 ms, every step.
    assert v.detail.startswith("Estimated saving 2.00 ms per step (39.4% of the mean step). Remedy: Find why rank 2")
    assert (
        v.context
        == "4 ranks, 3 steps analysed; step time (slowest rank) mean 5.08 ms, P50 5.08 ms, P99 5.08 ms, max 5.08 ms"
    )


@pytest.mark.parametrize(
    ("scenario", "said"),
    [
        ("no_straggler", "the no_straggler what-if was {lo:.0f}-{hi:.0f} % off in gloo reruns"),
        ("fp8_dispatch", "the fp8_dispatch what-if has not been checked against a rerun"),
    ],
)
def test_verdict_says_how_its_saving_matched_reruns(a4, scenario, said):
    """The saving people act on says how far its what-if has matched a rerun (whatif_checks), or
    that it has not been checked."""
    top = digest.ranked_findings(a4)[0]
    ev = {**top.evidence, "whatif": {"scenario": scenario, "saving_ns": top.est_saving_ns}}
    a = dataclasses.replace(a4, findings=[dataclasses.replace(top, evidence=ev)])
    c = RERUN_CHECKS.get(scenario)
    text = said.format(lo=c.error_lo_pct, hi=c.error_hi_pct) if c else said
    assert digest.verdict(a).detail.startswith(
        f"Estimated saving 2.00 ms per step (39.4% of the mean step; {text}). Remedy: Find why rank 2"
    )


def test_rank_table_percentiles(a4):
    rt = digest.rank_table(a4)
    assert rt["rank"].to_list() == [0, 1, 2, 3]
    assert rt["step_p50_ns"].to_list() == [5_075_000.0, 5_076_000.0, 5_077_000.0, 5_078_000.0]
    assert rt["step_max_ns"].to_list() == rt["step_p99_ns"].to_list()
    assert rt["barrier_wait_ns"].to_list() == [2_000_000, 2_000_000, 0, 2_000_000]
    assert rt["wait_p99_ns"].to_list() == [2e6, 2e6, 0.0, 2e6] and rt["exposed_p99_ns"].to_list() == [
        2.16e6,
        2.16e6,
        6.6e5,
        2.16e6,
    ]


def test_sections_in_the_required_order(page4):
    ids = re.findall(r'<section id="([a-z]+)"', page4)
    assert ids == [
        "findings",
        "breakdown",
        "coverage",
        "timeline",
        "routing",
        "overlap",
        "wait",
        "alphabeta",
        "stalls",
        "load",
        "definitions",
    ]
    assert page4.index("Rank 2 arrives last") < page4.index('id="fig-stages"')
    # the verdict box comes right under the title, before the navigation and every section
    assert page4.index('class="verdict') < page4.index("<nav>") < page4.index("<section")


def test_self_contained_one_plotly_bundle(page4):
    assert page4.count('class="plotly-graph-div ep-fig"') == 11 and page4.count('type="application/json"') == 11
    assert page4.count("Plotly.newPlot(") == 1  # the one renderer script
    assert "<script src=" not in page4 and "<link" not in page4
    assert len(re.findall(r"plotly\.js (?:\(cartesian - minified\) )?v\d+\.\d+\.\d+", page4)) == 1  # the banner, once
    # outside the bundle nothing points to the network
    before_bundle = page4[: page4.index('id="ep-plotly-src"')]
    assert "https://" not in before_bundle and "http://" not in before_bundle
    # the verdict comes before the (large) bundle, so it paints first
    assert page4.index('class="verdict') < page4.index('id="ep-plotly-src"')


def test_definitions_and_tables_present(page4):
    for term in ("I_e (expert imbalance)", "Barrier wait, transfer", "Overlap, exposed comm", "Clock uncertainty"):
        assert f"<dt>{term}</dt>" in page4
    assert '<tr><td class="l">2</td><td>6</td><td>18.0 ms</td></tr>' in page4  # straggler ranking: rank 2, last 6 times
    assert "Stage detection method: <b>ep_trace</b>" in page4


def test_no_routing_data_says_so_and_extra_sections_go_before_definitions():
    a = make_fake_analysis(with_routing=False, findings=False)
    html = render_report(a, extra_sections=[Section("hta", "HTA cross-check", "<p>hta body</p>")])
    assert "No routing data: the traces carry neither an ep-trace sidecar nor all-to-all split sizes" in html
    # no finding: the verdict still says where the slowest rank's step goes
    assert re.search(r"No EP bottleneck found: rank \d+(&#x27;|')s step \(P50 [0-9.]+ ms\) is \d+(\.\d)?% ", html)
    assert html.index('id="hta"') < html.index('id="definitions"')


def test_large_job_notes_sampling_and_lists_skipped_rank():
    a = make_fake_analysis(n_ranks=64, steps=3, layers=2, experts=64, with_events=False)
    html = render_report(a)
    assert "16 of 64 ranks drawn" in html
    assert "truncated gzip stream: rank skipped" in html


def test_hta_overlap_and_unmatched_collectives_are_shown(a4):
    import dataclasses

    import polars as pl

    a = dataclasses.replace(
        a4,
        hta_overlap=pl.DataFrame(
            {"rank": [0, 1], "comm_us": [10, 10], "overlap_us": [2, 3], "comp_comm_overlap_pctg": [20.0, 30.0]}
        ),
        misaligned=pl.DataFrame(
            {"pg_name": ["0"], "step": [1], "calls_per_rank": ["0:3,1:2"], "reason": ["rank 1 has fewer calls"]}
        ),
    )
    html = render_report(a)
    assert '<tr><td class="l">0</td><td>20.0%</td><td>25.0%</td></tr>' in html
    assert (
        '<tr><td class="l">0</td><td class="l">1</td><td class="l">0:3,1:2</td><td class="l">rank 1 has fewer calls</td></tr>'
        in html
    )


def test_page_ships_the_cartesian_partial_bundle_and_every_trace_type_is_in_it(a4, page4):
    from plotly.offline import get_plotlyjs_version

    from ep_trace.reports import breakdown_figures, comm_figures, routing_figures, stage_figures, timeline
    from ep_trace.reports.html_page import CARTESIAN_TRACES, plotly_bundle

    js = plotly_bundle()
    assert js.lstrip("/*\n ").startswith(f"plotly.js (cartesian - minified) v{get_plotlyjs_version()}")
    assert len(js) < 2_000_000 and js[:2000] in page4
    not_figures = ("timeline_selection", "overlap_sentence", "alpha_beta_conclusive")
    fns = [
        getattr(m, n)
        for m in (stage_figures, timeline, routing_figures, comm_figures)
        for n in m.__all__
        if n[0].islower() and n not in not_figures
    ]
    used = {
        t["type"]
        for fn in fns + [breakdown_figures.time_breakdown]
        if (f := fn(a4)) is not None
        for t in f.to_dict()["data"]
    }
    assert used and used <= CARTESIAN_TRACES, used


def test_readme_shows_the_committed_report_screenshot():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    png = root / "docs" / "report.png"
    assert "![report](docs/report.png)" in (root / "README.md").read_text()
    # a real 1440 x 900 capture of the demo report (tests/reports/test_browser.py with
    # EP_TRACE_UPDATE_SCREENSHOT=1 refreshes it), not a placeholder
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") == 1440
    assert png.stat().st_size > 50_000

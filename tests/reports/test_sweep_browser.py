"""The sweep report in headless Chromium: the same checks as the analysis report (tests/reports/test_browser.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_sweep import _latency_runs
from test_browser import ARTIFACTS, CHROMIUM, _open, browser  # noqa: F401 - the fixture is used by name

from ep_trace.analysis.sweep import analyze_sweep
from ep_trace.cli.sweep import run_sweep
from ep_trace.reports.sweep import render_sweep

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)"),
]


def test_sweep_report_renders_in_chromium(browser, tmp_path, samples_dir):  # noqa: F811
    result = run_sweep([samples_dir / "balanced", samples_dir / "chunked_overlap"])
    out = tmp_path / "sweep.html"
    out.write_text(render_sweep(result, sources=["balanced", "chunked_overlap"]), encoding="utf-8")
    r = _open(browser, out, "sweep_report_chunks.png")
    assert r["errors"] == []
    assert r["plots"] == r["divs"] == r["rendered"] == 4  # stage fits, throughput, exposed comm, residuals
    assert r["svgs"] >= 2 * r["plots"]
    assert result.verdict is None and r["verdict"] == "No verdict for this sweep"  # chunks: α, β not separable
    assert Path(out).stat().st_size < 10_000_000


def test_sweep_report_with_a_verdict_renders_in_chromium(browser, tmp_path):  # noqa: F811
    out = tmp_path / "sweep.html"
    out.write_text(render_sweep(analyze_sweep(_latency_runs(20.0))), encoding="utf-8")
    r = _open(browser, out, "sweep_report.png")
    assert r["errors"] == []
    assert r["plots"] == r["divs"] == r["rendered"] == 4
    assert r["svgs"] >= 2 * r["plots"]
    assert r["verdict"] == (
        "fixed latency bound: At tokens = 2048 (t2048), the fixed per-call latency of the all-to-alls "
        "(α of dispatch + combine) takes 94% of an MoE layer"
    )
    assert (ARTIFACTS / "sweep_report.png").stat().st_size > 30_000

"""What a person sees: a real headless Chromium opens the reports (Debian's /usr/bin/chromium + playwright).

Checks: no console errors, every figure rendered (plot and SVG counts), the verdict text, a
screenshot under test-artifacts/, and the 64-rank synthetic report's size (< 10 MB) and open time
(< 3 s of renderer main-thread CPU, see test_64_rank_report_is_small_and_fast).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fake_analysis import make_fake_analysis

from ep_trace.reports.html import render_report

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def _open(browser, path: Path, screenshot: str | None = None) -> dict:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "request",
        lambda r: (
            errors.append(f"network request {r.url}") if not r.url.startswith(("file:", "data:", "blob:")) else None
        ),
    )
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    t0 = time.perf_counter()
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("document.body.hasAttribute('data-figures-rendered')", timeout=60_000)
    wall_s = time.perf_counter() - t0
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    mark = "(n) => performance.getEntriesByName(n)[0].startTime / 1000"
    res = {
        "errors": errors,
        "wall_s": wall_s,
        "main_thread_s": metrics["TaskDuration"],
        "main_thread_cpu_s": metrics["ThreadTime"],
        "first_paint_s": page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime / 1000"),
        "first_figure_s": page.evaluate(mark, "ep-first-figure"),
        "all_figures_s": page.evaluate(mark, "ep-all-figures"),
        "rendered": int(page.evaluate("document.body.dataset.figuresRendered")),
        "plots": page.locator(".js-plotly-plot").count(),
        "divs": page.locator("div.plotly-graph-div").count(),
        "svgs": page.locator(".js-plotly-plot .main-svg").count(),
        "verdict": page.locator(".verdict .headline").inner_text(),
    }
    if screenshot:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
    page.close()
    return res


def test_demo_report_renders_in_chromium(browser, tmp_path, samples_dir):
    from ep_trace.cli.outputs import build_report

    out = tmp_path / "report.html"
    build_report(samples_dir / "skewed_straggler", out)
    r = _open(browser, out, "demo_report.png")
    assert r["errors"] == []
    assert r["plots"] == r["divs"] == r["rendered"] >= 9  # every figure div became a plot
    assert r["svgs"] >= 2 * r["plots"]  # plotly draws >= 2 svg layers per plot
    assert r["verdict"]  # the verdict headline is shown first
    assert (ARTIFACTS / "demo_report.png").stat().st_size > 50_000


def test_64_rank_report_is_small_and_fast(browser, tmp_path):
    a = make_fake_analysis(n_ranks=64, steps=20, layers=16, experts=64, with_events=False)
    assert a.calls.height == 960 and a.call_ranks.height == 61_440
    out = tmp_path / "r64.html"
    out.write_text(render_report(a), encoding="utf-8")
    size = out.stat().st_size
    assert size < 10_000_000, size
    r = _open(browser, out, "report_64_ranks.png")
    assert r["errors"] == []
    assert r["plots"] == r["divs"] == r["rendered"] == 10
    assert r["verdict"] == "Rank 2 arrives last in every dispatch; the other ranks wait 2.0 ms per step"
    # "Opens in < 3 s": the verdict paints before plotly.js is parsed (wall clock), and drawing the
    # whole page costs < 3 s of the renderer main thread's CPU time (Chrome's ThreadTime counter) —
    # what it takes on an idle core. Wall time on a 2-core CI box shared with other jobs measures the
    # neighbours too (a load average of 8 doubles it), so it only gets a sanity bound.
    assert r["first_paint_s"] < 3.0, r
    assert r["main_thread_cpu_s"] < 3.0, r
    assert r["all_figures_s"] < 30.0, r

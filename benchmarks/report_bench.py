"""How fast the HTML report opens, at 8 → 4,096 ranks (issue 13.7, issue 16.5).

Builds a rank set by renumbering the ranks of a real trace set (default: the 8 param DLRM ranks,
``make_large_traces.py`` with one copy of the events per rank, ``distributedInfo.rank`` rewritten),
runs ``ep-trace analyze``'s report path on it, then opens the page in headless Chromium
(``/usr/bin/chromium`` + playwright) ``--repeat`` times and reports, per load: the verdict's paint
time (Element Timing), the first and the last figure (the renderer's performance marks), the
renderer main thread's CPU time, and the file size. Larger sets (``--fake``) use the synthetic
analysis of ``tests/reports/fake_analysis.py`` (the report only: no ingest of 4,096 files).

Usage::

    python benchmarks/report_bench.py --ranks 64 --repeat 5
    python benchmarks/report_bench.py --ranks 4096 --fake --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"

_VERDICT = """() => new Promise((resolve) => {
  const seen = performance.getEntriesByType('element').filter(e => e.identifier === 'verdict');
  if (seen.length) { resolve(seen[0].renderTime / 1000); return; }
  new PerformanceObserver((l) => resolve(l.getEntries()[0].renderTime / 1000)).observe({type: 'element', buffered: true});
})"""


def build(ranks: int, fake: bool, source: Path) -> Path:
    out = DATA / f"report{ranks}{'_fake' if fake else ''}.html"
    DATA.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    if fake:
        sys.path.insert(0, str(ROOT / "tests" / "reports"))
        from fake_analysis import make_fake_analysis

        from ep_trace.reports.html import render_report

        # a dense count matrix has ranks² rows per (step, layer): 16.7M at 4,096 ranks, so one of each there
        big = ranks > 256
        a = make_fake_analysis(
            n_ranks=ranks, steps=1 if big else 4, layers=1 if big else 4, experts=64, with_events=False
        )
        out.write_text(render_report(a), encoding="utf-8")
    else:
        d = DATA / f"renumbered{ranks}"
        if not d.exists():
            subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).with_name("make_large_traces.py")),
                    "--source",
                    str(source),
                    "--ranks",
                    str(ranks),
                    "--mb",
                    "0.001",
                    "--gzip",
                    "--out",
                    str(d),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        from ep_trace.cli.outputs import build_report

        build_report(d, out)
    print(f"built {out.name} in {time.perf_counter() - t0:.1f} s: {out.stat().st_size / 1e6:.2f} MB", flush=True)
    return out


def measure(path: Path, repeat: int) -> list[dict]:
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        for _ in range(repeat):
            pg = b.new_page(viewport={"width": 1440, "height": 900})
            cdp = pg.context.new_cdp_session(pg)
            cdp.send("Performance.enable")
            pg.goto(path.as_uri(), wait_until="load")
            pg.wait_for_function("document.body.hasAttribute('data-figures-rendered')", timeout=120_000)
            m = {x["name"]: x["value"] for x in cdp.send("Performance.getMetrics")["metrics"]}
            mark = "(n) => performance.getEntriesByName(n)[0].startTime / 1000"
            rows.append(
                {
                    "verdict_s": pg.evaluate(_VERDICT),
                    "first_figure_s": pg.evaluate(mark, "ep-first-figure"),
                    "all_figures_s": pg.evaluate(mark, "ep-all-figures"),
                    "main_thread_cpu_s": m["ThreadTime"],
                    "figures": int(pg.evaluate("document.body.dataset.figuresRendered")),
                    "scroll_width": pg.evaluate("document.documentElement.scrollWidth"),
                }
            )
            pg.close()
        b.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--fake", action="store_true", help="synthetic analysis instead of renumbered real ranks")
    ap.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "external" / "kineto" / "param_dlrm_8rank")
    args = ap.parse_args(argv)
    path = build(args.ranks, args.fake, args.source)
    rows = measure(path, args.repeat)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    best = {k: min(r[k] for r in rows) for k in rows[0]}
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "fake": args.fake,
                "size_mb": round(path.stat().st_size / 1e6, 2),
                "median": med,
                "best": best,
                "loadavg": os.getloadavg()[0],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

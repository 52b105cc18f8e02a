"""Analysis benchmark: ``analyze`` vs the ingest (``read_trace_dir``) of the same trace directory.

The speed bar (issue 5): analysing a trace set must cost no more than ingesting it. Both run in one
process, one after the other (ingest first; its tables feed the analysis), best of ``--repeat``.
Also reports the HTA-compatible overlap pass separately (``--hta-compatible``). Not a timed test:
run by hand and paste the figures into benchmarks/README.md (section "analysis").

Usage::

    python benchmarks/make_large_traces.py --ranks 8 --mb 40 --out benchmarks/data/large8
    python benchmarks/analysis_bench.py benchmarks/data/large8 --repeat 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ep_trace.analysis import AnalysisConfig, analyze
from ep_trace.parsers.dispatch import read_trace_dir


def bench(path: Path, repeat: int, hta: bool) -> dict[str, float]:
    """Best-of-``repeat`` wall seconds of ingest, analysis and (optionally) the HTA-compatible pass."""
    best: dict[str, float] = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        tables = read_trace_dir(path)
        t1 = time.perf_counter()
        a = analyze(tables)
        t2 = time.perf_counter()
        res = {
            "ingest_s": t1 - t0,
            "analyze_s": t2 - t1,
            "events": tables.events.height,
            "ranks": tables.ranks.height,
            "calls": a.calls.height,
            "stages": a.stages.height,
        }
        if hta:
            t3 = time.perf_counter()
            analyze(tables, AnalysisConfig(hta_compatible=True))
            res["analyze_hta_s"] = time.perf_counter() - t3
        for k, v in res.items():
            best[k] = min(best.get(k, v), v) if k.endswith("_s") else v
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="analysis vs ingest time on one trace directory")
    ap.add_argument("data", type=Path, nargs="+")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--hta-compatible", action="store_true")
    args = ap.parse_args(argv)
    for d in args.data:
        r = bench(d, args.repeat, args.hta_compatible)
        extra = f"  analyze+hta {r['analyze_hta_s']:.2f} s" if "analyze_hta_s" in r else ""
        print(
            f"{d}: {r['ranks']} ranks, {r['events']} events, {r['calls']} matched calls, {r['stages']} stage rows: "
            f"ingest {r['ingest_s']:.2f} s  analyze {r['analyze_s']:.2f} s  ratio {r['analyze_s'] / r['ingest_s']:.2f}{extra}"
        )


if __name__ == "__main__":
    main()

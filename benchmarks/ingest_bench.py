"""Kineto ingest benchmark: ep-trace ``read_trace_dir`` vs the decode floor vs HTA's trace load.

Each contender runs in a fresh subprocess (so peak RSS is its own) on the same directory:

* ``floor``  -- per file: read + gunzip + ``orjson.loads`` (one file at a time), nothing else;
* ``ingest`` -- ``ep_trace.parsers.read_trace_dir(dir)`` (no cache), all canonical tables;
  ``ingestN`` -- the same with ``jobs=N`` worker processes (HTA parses with a pool too);
* ``hta``    -- ``hta.trace_analysis.TraceAnalysis(trace_dir=dir)`` (HolisticTraceAnalysis 0.5.0).

Reported: wall seconds (best of ``--repeat``), peak RSS of the process (and of its children, HTA
parses in a process pool), RSS after imports, the largest rank file (uncompressed) and the size of
the output tables. Not a timed test: run by hand and paste the figures into benchmarks/README.md.

Usage::

    python benchmarks/make_large_traces.py --ranks 8 --mb 100 --out benchmarks/data/large8
    python benchmarks/ingest_bench.py benchmarks/data/large8 --hta
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time, gc
mode, path = sys.argv[1], sys.argv[2]
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if mode == "floor":
    import gzip, orjson
    from pathlib import Path
    base = rss(); t = time.perf_counter(); n = 0
    for f in sorted(Path(path).iterdir()):
        if not f.name.endswith((".json", ".json.gz")):
            continue
        raw = f.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = orjson.loads(raw); n += len(doc["traceEvents"]); del doc, raw
    out = {"events": n}
elif mode.startswith("ingest"):
    from ep_trace.parsers import read_trace_dir
    import polars as pl
    base = rss(); t = time.perf_counter()
    tt = read_trace_dir(path, jobs=int(mode[6:] or 1))
    wall_ingest = time.perf_counter() - t
    out = {"events": tt.events.height, "collectives": tt.collectives.height,
           "tables_bytes": sum(tt.table(n).estimated_size() for n in ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement"))}
    # polars' estimated_size leaves out the 16-byte views of String columns (16 B/row each): the
    # tables' resident size is measured as the RSS given back when they are dropped.
    from ep_trace.parsers.allocator import release_free_heap
    def settle():
        for _ in range(4):
            gc.collect(); release_free_heap(); time.sleep(0.3); pl.DataFrame({"a": [1]}).sum()  # jemalloc purges on activity
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    held = settle(); del tt; out["tables_resident"] = held - settle()
elif mode == "hta":
    import logging; logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    base = rss(); t = time.perf_counter()
    ta = TraceAnalysis(trace_dir=path)
    out = {"events": int(sum(len(df) for df in ta.t.traces.values()))}
wall = wall_ingest if mode.startswith("ingest") else time.perf_counter() - t
gc.collect()
out.update(wall_s=wall, peak_rss=rss(), base_rss=base, children_peak_rss=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
print("RESULT " + json.dumps(out))
"""


def run(mode: str, path: Path, repeat: int) -> dict:
    best: dict | None = None
    for _ in range(repeat):
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True, text=True, check=False
        )
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        res = json.loads(line[7:])
        if best is None or res["wall_s"] < best["wall_s"]:
            best = res
    assert best is not None
    return best


def largest_uncompressed(path: Path) -> int:
    sizes = []
    for f in path.iterdir():
        if f.name.endswith(".json.gz"):
            with gzip.open(f) as fh:
                sizes.append(sum(len(b) for b in iter(lambda: fh.read(1 << 24), b"")))
        elif f.name.endswith(".json"):
            sizes.append(f.stat().st_size)
    return max(sizes)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Kineto ingest vs decode floor vs HTA")
    ap.add_argument("data", type=Path)
    ap.add_argument("--hta", action="store_true", help="also time HTA's TraceAnalysis load")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--modes", default="floor,ingest", help="comma list of floor, ingest, hta")
    args = ap.parse_args(argv)
    mb = 1e6
    big = largest_uncompressed(args.data)
    modes = [m for m in args.modes.split(",") if m] + (["hta"] if args.hta and "hta" not in args.modes else [])
    res = {m: run(m, args.data, args.repeat) for m in modes}
    fl, ing = res.get("floor"), res.get("ingest")
    print(f"data: {args.data}  largest rank file: {big / mb:.1f} MB uncompressed")
    for m, r in res.items():
        print(
            f"{m:>7}: {r['wall_s']:7.2f} s  peak RSS {r['peak_rss'] / mb:8.1f} MB (after imports {r['base_rss'] / mb:7.1f} MB, "
            f"children {r['children_peak_rss'] / mb:7.1f} MB)  events {r['events']}"
        )
    if fl and ing:
        print(f"ingest / floor time: {ing['wall_s'] / fl['wall_s']:.2f}x")
    for m in res:
        if m.startswith("ingest") and "hta" in res:
            print(f"HTA / {m} time: {res['hta']['wall_s'] / res[m]['wall_s']:.2f}x")
    if not ing:
        return
    grow = ing["peak_rss"] - ing["base_rss"]
    print(
        f"ingest RSS growth {grow / mb:.1f} MB = {grow / (big + ing['tables_bytes']):.2f} x (largest file {big / mb:.1f} MB + output tables {ing['tables_bytes'] / mb:.1f} MB by estimated_size)"
        f" = {grow / (big + ing['tables_resident']):.2f} x (tables resident {ing['tables_resident'] / mb:.1f} MB)"
    )


if __name__ == "__main__":
    main()

"""Rank-scaling benchmark: ``ep-trace analyze`` (or ``ingest``) on 64 ... 4,096 small rank files.

Each run is a fresh ``ep-trace`` subprocess; reported per (ranks, mode): wall seconds, CPU seconds
of the whole process tree (user + system: the driver's ``wait4`` rusage, which includes every
descendant it reaped, or the sum of psutil samples of every process seen in the tree, whichever is
larger; Ray's worker processes are only in the samples), peak RSS of the tree (sum of the
resident sizes of all its processes, sampled every 50 ms) and of the driver alone, and the HTML
report size. Medians of ``--repeat`` runs. The CPU-seconds exponent is the least-squares slope of
log(CPU-s) on log(ranks). Not a timed test: run by hand, paste the figures into benchmarks/README.md.

Usage::

    for n in 64 256 1024 4096; do python benchmarks/make_many_ranks.py --ranks $n --out benchmarks/data/dlrm$n; done
    python benchmarks/rank_scaling.py --ranks 64 256 1024 --modes jobs1 jobs2 rerun ray --repeat 3

``analyze`` runs with a fresh ingest cache (``EP_TRACE_CACHE_DIR`` in the run's temporary
directory): a first analysis, which parses and writes the cache; mode ``rerun`` measures the
second analysis of the same directory (the cache warm).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

_DATA = Path(__file__).resolve().parent / "data"
_MODES = {
    "jobs1": [],
    "jobs2": ["--jobs", "2"],
    "ray": ["--engine", "ray", "--jobs", "2"],
    "rerun": [],  # analyze again, the ingest cache warm (the first run is not measured)
}


def _tree(p: psutil.Process) -> list[psutil.Process]:
    try:
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return [p]


def run_once(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """One subprocess run: wall, tree CPU-s, peak tree RSS, peak driver RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ps = psutil.Process(proc.pid)
    cpu: dict[int, float] = {}
    peak = peak_driver = 0
    while proc.poll() is None:
        total = 0
        for q in _tree(ps):
            try:
                m = q.memory_info().rss
                t = q.cpu_times()
            except psutil.Error:
                continue
            total += m
            cpu[q.pid] = t.user + t.system
            if q.pid == proc.pid:
                peak_driver = max(peak_driver, m)
        peak = max(peak, total)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return {"wall_s": wall, "cpu_s": max(sum(cpu.values()), waited), "rss": peak, "rss_driver": peak_driver}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--modes", nargs="+", default=["jobs1", "jobs2"], choices=sorted(_MODES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--command", default="analyze", choices=["analyze", "ingest"])
    ap.add_argument("--prefix", default="dlrm", help="data sets are benchmarks/data/<prefix><ranks>")
    args = ap.parse_args(argv)
    exe = str(Path(sys.executable).with_name("ep-trace"))
    rows = []
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for mode in args.modes:
        xs, ys = [], []
        for n in args.ranks:
            d = _DATA / f"{args.prefix}{n}"
            runs = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / ("r.html" if args.command == "analyze" else "tables")
                    cmd = [exe, args.command, str(d), "-o", str(out), "-q", *_MODES[mode]]
                    if args.command == "ingest":
                        cmd.append("--no-cache")
                    # analyze: a fresh ingest cache per run (a first analysis, which writes it)
                    env = dict(os.environ, EP_TRACE_CACHE_DIR=str(Path(tmp) / "cache"))
                    if mode == "rerun":
                        run_once(cmd, env)
                    r = run_once(cmd, env)
                    r["report_mb"] = out.stat().st_size / 1e6 if out.is_file() else 0.0
                    runs.append(r)
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append((mode, n, med))
            xs.append(math.log(n))
            ys.append(math.log(med["cpu_s"]))
            print(
                f"| {mode} | {n} | {med['wall_s']:.1f} | {med['cpu_s']:.1f} | {med['rss'] / 1e6:.0f} "
                f"| {med['rss_driver'] / 1e6:.0f} | {med['report_mb']:.1f} | load {os.getloadavg()[0]:.1f} |",
                flush=True,
            )
        if len(xs) > 1:
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
            print(f"{mode}: CPU-s exponent {slope:.2f} over {args.ranks}", flush=True)


if __name__ == "__main__":
    main()

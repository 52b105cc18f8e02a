"""Nsight ingest benchmark: whole ``read_nsys`` (incl. NVTX projection) vs the SELECT floor.

Floor = ``SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL`` through the stdlib ``sqlite3`` driver into an
Arrow table (the cheapest way to get the kernel table out of SQLite without an extra dependency).
Target: read_nsys <= 3x the floor. Run by hand; paste the figures into benchmarks/README.md.

Usage: python benchmarks/nsys_bench.py [FILE] [--repeat 3]   (default: benchmarks/data/mfu_x250.sqlite,
built by benchmarks/make_large_nsys.py when missing)
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from pathlib import Path

import polars as pl

from ep_trace.parsers.nsys import read_nsys

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks/data/mfu_x250.sqlite"


def floor(path: Path) -> tuple[float, int]:
    """Seconds for SELECT * FROM the kernel table into Arrow, and the row count."""
    t = time.perf_counter()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cur = con.execute("SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")
    cols = [d[0] for d in cur.description]
    table = pl.DataFrame(cur.fetchall(), schema=cols, orient="row", infer_schema_length=None).to_arrow()
    con.close()
    return time.perf_counter() - t, table.num_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not a.file.exists() and a.file == DEFAULT:
        from make_large_nsys import build  # type: ignore[import-not-found]

        build(DEFAULT, 250)
    stages: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        stages[f"{stage} {done}/{total}"] = time.perf_counter()

    f_best = min(floor(a.file)[0] for _ in range(a.repeat))
    n_rows = floor(a.file)[1]
    best = float("inf")
    for _ in range(a.repeat):
        stages.clear()
        t0 = time.perf_counter()
        tt = read_nsys(a.file, progress=progress)
        dt = time.perf_counter() - t0
        if dt < best:
            best, marks = dt, {k: v - t0 for k, v in stages.items()}
    kinds = dict(tt.events.group_by("kind").len().rows())
    print(
        f"file: {a.file} ({a.file.stat().st_size / 1e6:.0f} MB), kernels: {n_rows}, events: {tt.events.height}, "
        f"collectives: {tt.collectives.height}"
    )
    print(f"events by kind: {kinds}")
    print(f"floor  SELECT * kernel -> Arrow: {f_best:.2f} s")
    print(f"read_nsys (whole, incl. projection): {best:.2f} s  = {best / f_best:.2f}x floor")
    print("stage marks (s since start): " + ", ".join(f"{k} {v:.2f}" for k, v in marks.items()))


if __name__ == "__main__":
    main()

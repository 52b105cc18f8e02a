"""Build a large nsys export by replicating a real file's rows (benchmarks/data/, git-ignored).

Copies ``mfu_2gpu_before.sqlite`` (2 processes, 4 010 kernels, 7 466 API calls, 19 118 NVTX rows)
and appends N-1 time-shifted copies of its KERNEL, RUNTIME, NVTX_EVENTS, MEMCPY and MEMSET rows:
copy k is shifted by k x (capture span + 1 ms) and its correlationIds by k x (max id + 1), so every
copy keeps its launch links and its NVTX nesting. 250 copies = 1 002 500 kernels.

Usage: python benchmarks/make_large_nsys.py [--copies 250] [--out benchmarks/data/mfu_x250.sqlite]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared/external/nsys/nsys_ai_2gpu/mfu_2gpu_before.sqlite"
TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)


def build(out: Path, copies: int, source: Path = SOURCE) -> Path:
    """Write ``out`` with ``copies`` x the rows of ``source``; returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, out)
    con = sqlite3.connect(out)
    lo, hi = con.execute(
        'SELECT min(s), max(e) FROM (SELECT min(start) s, max("end") e FROM CUPTI_ACTIVITY_KIND_RUNTIME '
        'UNION ALL SELECT min(start), max("end") FROM NVTX_EVENTS UNION ALL SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_KERNEL)'
    ).fetchone()
    shift = hi - lo + 1_000_000
    corr = con.execute("SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] + 1
    for table in TABLES:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        con.execute(f'CREATE TEMP TABLE base AS SELECT * FROM "{table}"')
        for k in range(1, copies):
            sel = []
            for c in cols:
                if c in ("start", "end"):
                    sel.append(f'"{c}" + {k * shift}')
                elif c == "correlationId":
                    sel.append(f'"{c}" + {k * corr}')
                else:
                    sel.append(f'"{c}"')
            con.execute(f'INSERT INTO "{table}" SELECT {", ".join(sel)} FROM base')
        con.execute("DROP TABLE base")
        con.commit()
    con.execute("VACUUM")
    con.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=250)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/data/mfu_x250.sqlite")
    a = ap.parse_args()
    build(a.out, a.copies)


if __name__ == "__main__":
    main()

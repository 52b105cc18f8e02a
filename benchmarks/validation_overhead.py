"""Cost of the parser-boundary validation (ep_trace.parsers.validate) on ingest.

Runs ``read_trace_dir`` on a directory with the validation layer on and with it replaced by
no-ops (in process, alternating, best of ``--repeat``), and times the validation calls alone on the
tables read. Not a timed test: run by hand and paste the figures into benchmarks/README.md.

Usage::

    python benchmarks/make_large_traces.py --source ../shared/external/kineto/hta_nccl_metadata \
        --ranks 1 --mb 100 --gzip --out benchmarks/data/v100
    python benchmarks/validation_overhead.py benchmarks/data/v100 --repeat 3
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def validation_off() -> Any:
    from ep_trace.parsers import validate

    saved = {
        n: getattr(validate, n) for n in ("validate_file", "drop_duplicate_rows", "check_job_clocks", "text_series")
    }
    import polars as pl

    validate.validate_file = lambda path, t: t  # type: ignore[assignment]
    validate.drop_duplicate_rows = lambda ev, path, rank, key=(): (ev, None)  # type: ignore[assignment]
    validate.check_job_clocks = lambda ranks: None  # type: ignore[assignment]
    validate.text_series = lambda path, values, ids, what: pl.Series(values, dtype=pl.Utf8, strict=False)  # type: ignore[assignment]
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(validate, n, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from ep_trace.parsers import read_trace_dir, validate

    on, off = [], []
    for _ in range(args.repeat):
        with validation_off():
            t = time.perf_counter()
            read_trace_dir(args.trace_dir)
            off.append(time.perf_counter() - t)
        t = time.perf_counter()
        tables = read_trace_dir(args.trace_dir)
        on.append(time.perf_counter() - t)
    # the checks alone, on the tables read: best of 5 (the reader's per-file duplicate pass included)
    import polars as pl

    per_rank = [
        tables.events.filter(pl.col("rank") == r).rename({"pid": "pid_raw", "tid": "tid_raw"})
        for r in tables.ranks["rank"].to_list()
    ]
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        validate.check_tables(str(args.trace_dir), tables)
        for ev in per_rank:
            validate.drop_duplicate_rows(ev, str(args.trace_dir), 0)
        runs.append(time.perf_counter() - t)
    alone = min(runs)
    n = tables.events.height
    print(f"{args.trace_dir}: {n:,} events")
    print(f"read_trace_dir, validation off: best {min(off):.3f} s  (runs {', '.join(f'{x:.3f}' for x in off)})")
    print(f"read_trace_dir, validation on:  best {min(on):.3f} s  (runs {', '.join(f'{x:.3f}' for x in on)})")
    print(f"overhead (on - off, noisy on a shared machine): {min(on) - min(off):+.3f} s")
    print(f"checks alone: {alone:.3f} s = {100 * alone / min(off):.1f} % of the read")


if __name__ == "__main__":
    main()

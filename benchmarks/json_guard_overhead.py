"""Cost of the JSON structural guard (ep_trace.parsers.json_guard) on ingest.

Reads a trace directory with ``read_trace_dir`` with the guard on and with ``JsonGuard.feed``
replaced by a no-op (in process, alternating, best of ``--repeat``), then times the guard alone
on each file's decompressed text: the C scan (``_kscan.guard``) and the numpy fallback
(``guard_numpy``, what runs without the extension), in 1 MiB pieces as the stream feeds them.
Not a timed test: run by hand on a quiet machine and paste the figures into benchmarks/README.md.

Usage::

    python benchmarks/make_large_traces.py --source ../shared/external/kineto/hta_nccl_metadata \\
        --ranks 1 --mb 100 --gzip --out benchmarks/data/v100
    python benchmarks/json_guard_overhead.py benchmarks/data/v100 --repeat 5
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path


def _read_s(trace_dir: Path) -> float:
    from ep_trace.parsers import read_trace_dir

    t = time.perf_counter()
    read_trace_dir(trace_dir)
    return time.perf_counter() - t


def _scan_s(text: bytes, scan: object) -> float:
    from ep_trace.parsers import json_guard

    t = time.perf_counter()
    state = json_guard._START
    for i in range(0, len(text), 1 << 20):
        state, code, _ = scan(text[i : i + (1 << 20)], state, 64, 1 << 62)  # type: ignore[operator]
        assert code == 0, f"the guard refused the input (code {code})"
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from ep_trace.parsers import json_guard

    real = json_guard.JsonGuard.feed
    on, off = [], []
    for _ in range(args.repeat):
        json_guard.JsonGuard.feed = lambda self, piece: None  # type: ignore[method-assign]
        try:
            off.append(_read_s(args.trace_dir))
        finally:
            json_guard.JsonGuard.feed = real  # type: ignore[method-assign]
        on.append(_read_s(args.trace_dir))
    files = sorted(p for p in args.trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))
    texts = [gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes() for p in files]
    mb = sum(len(t) for t in texts) / 1e6
    scans = [("numpy", json_guard.guard_numpy)]
    if json_guard._kscan is not None:
        scans.insert(0, ("C", json_guard._kscan.guard))
    print(f"{len(files)} files, {mb:,.1f} MB of JSON")
    print(
        f"read_trace_dir: guard on {min(on):.3f} s, off {min(off):.3f} s (best of {args.repeat}); "
        f"+{100 * (min(on) / min(off) - 1):.1f} %"
    )
    for name, scan in scans:
        best = min(sum(_scan_s(t, scan) for t in texts) for _ in range(args.repeat))
        print(f"guard alone ({name}): {best:.3f} s, {mb / best:,.0f} MB/s")


if __name__ == "__main__":
    main()

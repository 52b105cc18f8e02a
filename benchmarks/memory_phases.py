"""Where the peak RSS of ``ep-trace analyze`` is: the process' resident size sampled every 20 ms
against the analysis phases (entry / exit of the engine's passes), one first analysis in-process.

``tracemalloc`` cannot see polars' (Rust) allocations, hence RSS. Prints the peak, then per phase
(from one mark to the next) the largest RSS seen and the RSS at the phase's start. Run by hand:

    python benchmarks/memory_phases.py benchmarks/data/dlrm4096

Extra arguments go to ``ep-trace analyze`` (e.g. ``--jobs 2``). The ingest cache is a fresh
temporary directory (a first analysis, as ``rank_scaling.py`` measures it).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

_PHASES = [
    ("ep_trace.analysis.engine", "analyze"),
    ("ep_trace.analysis.rank_pass", "first_pass"),
    ("ep_trace.analysis.rank_pass", "second_pass"),
    ("ep_trace.analysis.graph", "build_graph"),
    ("ep_trace.analysis.whatif", "model"),
    ("ep_trace.analysis.engine", "_intervals"),
    ("ep_trace.analysis.findings", "with_findings"),
    ("ep_trace.cli.outputs", "write_report"),
]


def main(argv: list[str]) -> None:
    proc = psutil.Process()
    t0 = time.perf_counter()
    samples: list[tuple[float, int]] = []
    marks: list[tuple[float, str, int]] = [(0.0, "start (ingest)", proc.memory_info().rss)]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() - t0, proc.memory_info().rss))
            time.sleep(0.02)

    def marked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*a: Any, **k: Any) -> Any:
            marks.append((time.perf_counter() - t0, f"> {name}", proc.memory_info().rss))
            try:
                return fn(*a, **k)
            finally:
                marks.append((time.perf_counter() - t0, f"< {name}", proc.memory_info().rss))

        return run

    from ep_trace.parsers.polars_threads import configure_threads

    configure_threads(1)  # before polars loads, as the CLI does with --jobs 1
    for mod, fn in _PHASES:
        m = importlib.import_module(mod)
        setattr(m, fn, marked(f"{mod.rsplit('.', 1)[-1]}.{fn}", getattr(m, fn)))
    import ep_trace.cli as cli

    threading.Thread(target=sample, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["EP_TRACE_CACHE_DIR"] = os.path.join(tmp, "cache")
        rc = cli.main(["analyze", argv[0], "-o", os.path.join(tmp, "r.html"), "-q", *argv[1:]])
    done.set()
    end = time.perf_counter() - t0
    peak_t, peak = max(samples, key=lambda s: s[1])
    cpu = proc.cpu_times()
    print(
        f"exit {rc}; peak RSS {peak / 1e6:.0f} MB at {peak_t:.1f} s of {end:.1f} s; CPU {cpu.user + cpu.system:.1f} s"
    )
    bounds = [*marks, (end, "end", 0)]
    for (ta, na, ra), (tb, nb, _) in zip(bounds, bounds[1:], strict=False):
        seg = [r for t, r in samples if ta <= t <= tb]
        if seg:
            print(
                f"{ta:7.2f}-{tb:7.2f} s  {na:28s} -> {nb:28s} max {max(seg) / 1e6:5.0f} MB (at start {ra / 1e6:5.0f})"
            )


if __name__ == "__main__":
    main(sys.argv[1:])

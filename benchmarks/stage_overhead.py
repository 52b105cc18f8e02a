"""Per-call cost of ``ep_trace.stage()`` vs bare ``torch.autograd.profiler.record_function``.

Run by hand (not a test):  python benchmarks/stage_overhead.py [--calls 20000] [--repeats 5]

Prints the best-of-repeats time per ``with ...: pass`` call, in microseconds, with no profiler active
and with ``torch.profiler.profile`` (CPU activity) active. Targets (issue 2): < 2 us inactive, and
within 2x of bare ``record_function`` when active.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from ep_trace import stage


def _per_call_us(body: Callable[[int], None], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        body(calls)
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1e3)
    return best


def _empty(n: int) -> None:
    for _ in range(n):
        pass


def _stage(n: int) -> None:
    for _ in range(n):
        with stage("dispatch", layer=3):
            pass


def _record_function(n: int) -> None:
    for _ in range(n):
        with record_function("ep:dispatch:l3:fwd"):
            pass


def main() -> None:
    """Measure and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _stage(10)  # resolve torch hooks and the name cache once
    rows = []
    loop = _per_call_us(_empty, args.calls, args.repeats)
    rows.append(("inactive", "empty loop", loop))
    rows.append(("inactive", "stage()", _per_call_us(_stage, args.calls, args.repeats)))
    rows.append(("inactive", "record_function", _per_call_us(_record_function, args.calls, args.repeats)))
    # Fresh profiler per measurement so the recorded-event buffer does not grow across repeats.
    for name, fn in (("stage()", _stage), ("record_function", _record_function)):
        best = float("inf")
        for _ in range(args.repeats):
            with profile(activities=[ProfilerActivity.CPU]):
                best = min(best, _per_call_us(fn, args.calls, 1))
        rows.append(("profiler active", name, best))
    print(f"torch {torch.__version__}, {args.calls} calls, best of {args.repeats}\n")
    print("| profiler | range | us per call |")
    print("|---|---|---|")
    for state, name, us in rows:
        print(f"| {state} | {name} | {us:.3f} |")
    inactive = rows[1][2]
    active_ratio = rows[3][2] / rows[4][2]
    print(
        f"\nstage() inactive: {inactive:.3f} us (target < 2 us); active stage()/record_function = {active_ratio:.2f}x (target <= 2x)"
    )


if __name__ == "__main__":
    main()

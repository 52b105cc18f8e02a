#!/usr/bin/env python3
"""Independent reference count of a Kineto trace's steps (Python standard library only).

Written apart from ep-trace (no import of it, no polars) so that the tests compare the analysis with a
count made another way. For one Kineto JSON file (``.json`` or ``.json.gz``, any era: the 2021
capitalised categories included) it prints, as JSON:

* ``kernels``: the number of kernel rows and the sum of their durations (ns);
* ``steps``: per step marker (``ProfilerStep#N`` by default, or the first host row matching
  ``--marker``, numbered 1, 2, ... in start order), the host range and the **step window** by the
  documented rule (docs/metrics.md, *Steps*): the device work (kernels, copies, memsets) the step
  launched is the work whose runtime launch row (same ``args.correlation``) starts inside the host
  range, plus the work with no launch row that starts inside the window; the window ends at the latest of the host range's end and that work's end, and starts at the
  host range's start, or at the previous window's end when that is later; then ``busy_ns`` (the union
  of the launched work clipped to the window; ``kernel_busy_ns``: of its kernels only) and the split of the window's device-idle time (idle =
  no device work of any step) into ``queued_ns`` (the work that ends the idle span had been launched
  more than 10 µs before it ended: the device waited on something else), ``blocked_ns`` (the host was inside a blocking call:
  a synchronize or a synchronous copy) and ``host_wait_ns`` (the rest: the device waited for a busy
  host).

Times are ns on the trace's clock: ``ts * 1000`` (the integer part exact, the fraction rounded;
+ ``baseTimeNanoseconds`` when present).

Usage: ``python tests/data/reference_count.py TRACE [--marker REGEX]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys

KERNEL = {"kernel", "Kernel"}
DEVICE = KERNEL | {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
RUNTIME = {"cuda_runtime", "cuda_driver", "Runtime"}
HOST = {"cpu_op", "user_annotation", "Operator"}
BLOCKING = re.compile(
    r"^(?:cuda(?:Stream|Device|Event)Synchronize|cudaMemcpy(?:_v\d+)?$|cudaMemcpy2D|cuStreamSynchronize"
    r"|cuCtxSynchronize|hip(?:Stream|Device|Event)Synchronize|hipMemcpy(?:WithStream|DtoH|HtoD)?$|hipMemcpy2D)"
)


def _load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _ns(us: int | float | str) -> int:
    """µs -> ns; the integer part exactly (epoch µs times 1000 exceed a float's 53 bits)."""
    if isinstance(us, int):
        return us * 1000
    v = float(us)
    whole = int(v)
    return whole * 1000 + round((v - whole) * 1000)


def _span(e: dict, base: int) -> tuple[int, int]:
    s = base + _ns(e["ts"])
    return s, s + _ns(e.get("dur", 0))


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def _length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def _clip(iv: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(s, lo), min(e, hi)) for s, e in iv if min(e, hi) > max(s, lo)]


def _gaps(busy: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out, t = [], lo
    for s, e in busy:
        if s > t:
            out.append((t, min(s, hi)))
        t = max(t, e)
    if t < hi:
        out.append((t, hi))
    return [(s, e) for s, e in out if e > s]


def count(path: str, marker: str | None = None) -> dict:
    doc = _load(path)
    base = int(doc.get("baseTimeNanoseconds", 0) or 0)
    xs = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    launch_of: dict[int, tuple[int, int]] = {}
    blocking: list[tuple[int, int]] = []
    for e in xs:
        if e.get("cat") in RUNTIME:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch_of[int(corr)] = _span(e, base)
            if BLOCKING.search(str(e.get("name", ""))):
                blocking.append(_span(e, base))
    work = []  # (start, end, launch start or None, launch end or None)
    kernel_work = set()  # indexes into work of the kernels
    for e in xs:
        if e.get("cat") in DEVICE:
            s, t = _span(e, base)
            launch = launch_of.get(int((e.get("args") or {}).get("correlation", -1)))
            if e.get("cat") in KERNEL:
                kernel_work.add(len(work))
            work.append((s, t, launch[0] if launch else None, launch[1] if launch else None))
    kernels = [e for e in xs if e.get("cat") in KERNEL]
    rx = re.compile(marker) if marker else re.compile(r"^ProfilerStep#\d+$")
    marks = sorted(_span(e, base) for e in xs if e.get("cat") in HOST and rx.search(str(e.get("name", ""))))
    steps, prev_end = [], None
    all_busy = _union([(s, t) for s, t, _, _ in work])
    launched_by_start: dict[int, int] = {}  # device work start -> the earliest launch end of work starting then
    for s, _, _, le in work:
        if le is not None:
            launched_by_start[s] = min(le, launched_by_start.get(s, le))
    blocked = _union(blocking)
    for i, (hs, he) in enumerate(marks):
        idx = [j for j, (_, _, ls, _) in enumerate(work) if ls is not None and hs <= ls <= he]
        w_lo = min([hs] + [work[j][0] for j in idx])
        start = w_lo if prev_end is None else max(w_lo, prev_end)
        end = max([he] + [work[j][1] for j in idx])
        # work without a linked launch belongs to the window holding its start
        idx += [j for j, (s, _, ls, _) in enumerate(work) if ls is None and start <= s <= end]
        end = max([end] + [work[j][1] for j in idx])
        mine = [work[j][:2] for j in idx]
        mine_k = [work[j][:2] for j in idx if j in kernel_work]
        prev_end = end
        busy = _length(_clip(_union(mine), start, end))
        kernel_busy = _length(_clip(_union(mine_k), start, end))
        queued = host_wait = blk = 0
        for a, b in _gaps(_clip(all_busy, start, end), start, end):
            le = launched_by_start.get(b)
            ready = None if le is None else le + 10_000  # the launch's dispatch, 10 µs
            q_from = max(a, ready) if ready is not None and ready < b else b
            queued += b - q_from
            blk_here = _length(_clip(blocked, a, q_from))
            blk += blk_here
            host_wait += (q_from - a) - blk_here
        steps.append(
            {
                "step": i + 1,
                "host_start_ns": hs,
                "host_end_ns": he,
                "start_ns": start,
                "end_ns": end,
                "launched": len(mine),
                "busy_ns": busy,
                "kernel_busy_ns": kernel_busy,
                "queued_ns": queued,
                "blocked_ns": blk,
                "host_wait_ns": host_wait,
            }
        )
    return {
        "kernels": {"n": len(kernels), "time_ns": sum(_ns(e.get("dur", 0)) for e in kernels)},
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--marker", default=None, help="regex of the step's host row (default ProfilerStep#N)")
    args = p.parse_args(argv)
    json.dump(count(args.trace, args.marker), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

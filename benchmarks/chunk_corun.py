"""What chunking costs the demo's expert stage without gloo: alone, with the ranks co-running, profiled.

Issue 17, pair (c): in the 2-rank pipelined demo the chunked steps' ``aten::mm`` calls take +3.8 ms
per step more than the 1-chunk steps' (512 tokens, k = 4; benchmarks/README.md "Stop 24"). This
runs the demo's own expert stage (``_grouped_experts`` on 1 024 received rows of 2 peers, 4 local
experts, hidden 256, FFN 512, 2 layers, the demo's chunk split: chunk-major rows, ``_chunk_major``,
each chunk a slice since stop 25) over k = 1 / 4 / 8
chunks with no collective at all, in three settings:

* ``alone``: one process, one thread (as the demo's ranks: ``torch.set_num_threads(1)``);
* ``co-running``: two such processes started together at each repetition (a barrier), as two
  ranks computing at once on the 2 cores;
* ``profiled``: one process under ``torch.profiler`` (CPU activities), as the demo's ranks.

If chunking cost more when the ranks co-run or when profiled, that would be the missing term.

Run: ``python benchmarks/chunk_corun.py [--reps 30]`` (~1 min, on an otherwise idle machine; run it
with the demo's allocator: ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``). Prints ms per step (2 layers), medians.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from ep_trace.workloads.moe import (
    _chunk_major,
    _chunk_offsets,
    _chunk_splits,
    _grouped_experts,
    local_experts,
    make_layer_weights,
)

CHUNKS = (1, 4, 8)


def _run(q: Any, bar: Any, reps: int, profiled: bool) -> None:
    torch.set_num_threads(1)
    ws = [local_experts(make_layer_weights(256, 512, 8, seed=0, layer=layer), 0, 4) for layer in range(2)]
    g = torch.Generator().manual_seed(1)
    sizes = [512, 512]  # rows received from each of the 2 peers, each peer's segment sorted by expert
    rows = torch.randn(sum(sizes), 256, generator=g)
    eid = torch.cat([torch.sort(torch.randint(0, 4, (s,), generator=g)).values for s in sizes])
    split = {}
    for k in CHUNKS:  # per k: the rows in the demo's chunk-major order, and each chunk's slice
        perm = _chunk_major(torch.tensor(sizes), k)
        split[k] = (rows.index_select(0, perm), eid.index_select(0, perm), _chunk_offsets(_chunk_splits(sizes, k)))
    res: dict[int, list[int]] = {}
    with profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext():
        for _ in range(reps):
            for k in CHUNKS:
                rows_k, eid_k, off = split[k]
                if bar is not None:
                    bar.wait()
                t0 = time.perf_counter_ns()
                for w in ws:
                    for c in range(k):
                        _grouped_experts(rows_k[off[c] : off[c + 1]], eid_k[off[c] : off[c + 1]], w)
                res.setdefault(k, []).append(time.perf_counter_ns() - t0)
    q.put({k: statistics.median(v[3:]) / 1e6 for k, v in res.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    out: list[tuple[str, dict[int, float]]] = []
    for name, profiled in (("alone", False), ("profiled", True)):
        p = ctx.Process(target=_run, args=(q, None, args.reps, profiled))
        p.start()
        out.append((name, q.get()))
        p.join()
    bar = ctx.Barrier(2)
    procs = [ctx.Process(target=_run, args=(q, bar, args.reps, False)) for _ in range(2)]
    for p in procs:
        p.start()
    out += [(f"co-running, process {i}", q.get()) for i in range(2)]
    for p in procs:
        p.join()
    print("| setting | " + " | ".join(f"k = {k} ms" for k in CHUNKS) + " | k = 4 minus k = 1 ms |")
    print("|---|" + "---|" * (len(CHUNKS) + 1))
    for name, r in out:
        print(f"| {name} | " + " | ".join(f"{r[k]:.2f}" for k in CHUNKS) + f" | {r[4] - r[1]:+.2f} |")


if __name__ == "__main__":
    main()

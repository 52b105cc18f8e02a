"""What an async gloo all-to-all costs on a rank without a spare core (issue 17, the chunks pair).

The chunked pipeline of the demo posts chunk c+1's all-to-all (``async_op=True``) and then computes
chunk c on the same thread. On a CPU rank the transfer is work of gloo's worker thread; with one
core per rank (2 ranks on the 2 cores here) that thread only runs when the scheduler preempts the
compute or when the compute blocks in ``wait()``. This measures, for 2 gloo ranks on loopback:

* ``sync``: a blocking ``all_to_all_single`` (what the 1-chunk trace shows);
* ``wait``: the ``wait()`` of the same call posted async before ``C`` ms of compute on the
  posting thread (what the chunked run pays per call after its compute).

If the transfer progressed under the compute, ``wait`` would fall to ~0 for ``C`` > ``sync``. It
does not until ``C`` reaches the scheduler's preemption latency (~3-4 ms here): below it the
transfer runs after the compute (``resources.transfer_hiding`` = 0 is right), and the mean wait
carries a tail (the peer's worker thread not yet scheduled) that no quantity of the 1-chunk trace
predicts.

``--beside`` measures the other side of the same question (stop 24): what a transfer in flight
costs the compute it overlaps. The compute is a fixed amount of work (``N`` x the demo's expert GEMM
at 12 rows, ``[12, 256] x [256, 512]``, and a GELU), timed alone and with one or two async
all-to-alls posted just before it (chunk c+1's dispatch and chunk c-1's combine in flight); the
wait after it is timed too. ``async cost`` = (compute beside - compute alone) + wait: what the
overlapped calls cost the posting thread in all, against the sum of the same calls run synchronous
(what ``resources.transfer_hiding`` = 0 charges). A ratio above 1 would be a cost of running beside
the transfer that the 1-chunk trace cannot show.

Run: ``python benchmarks/async_handoff.py [--rows 16 512] [--iters 60]`` or
``python benchmarks/async_handoff.py --beside [--rows 128 512]`` (the demo's chunks at 512 / 2048 tokens) (~1-2 min each; run it on an
otherwise idle machine). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COMPUTE_MS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _busy(ms: float) -> None:
    a = torch.randn(64, 64)
    t_end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < t_end:
        a = torch.tanh(a @ a * 0.01)


def _stats(xs: list[int]) -> tuple[float, float, float]:
    s = sorted(xs)
    return statistics.median(s) / 1e6, statistics.fmean(s) / 1e6, s[int(0.9 * (len(s) - 1))] / 1e6


def _rank(rank: int, port: int, rows: list[int], iters: int, q: object) -> None:
    torch.set_num_threads(1)  # as the demo's launcher: one intra-op thread per rank
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    res = {}
    for c_ms in COMPUTE_MS:
        for r in rows:
            x = torch.randn(r * 2, 256)
            y = torch.empty_like(x)
            sync, wait = [], []
            for _ in range(iters):
                dist.barrier()
                t0 = time.perf_counter_ns()
                dist.all_to_all_single(y, x)
                sync.append(time.perf_counter_ns() - t0)
                dist.barrier()
                work = dist.all_to_all_single(y, x, async_op=True)
                _busy(c_ms)
                t1 = time.perf_counter_ns()
                work.wait()
                wait.append(time.perf_counter_ns() - t1)
            res[(c_ms, r)] = (_stats(sync[5:]), _stats(wait[5:]))
    if rank == 0:
        q.put(res)  # type: ignore[attr-defined]
    dist.destroy_process_group()


BESIDE_WORK = (5, 20, 80)  # expert GEMM + GELU pairs: ~0.5 / 2 / 9 ms on the 2-vCPU VM


def _work(n: int, a: torch.Tensor, w: torch.Tensor) -> None:
    for _ in range(n):
        torch.nn.functional.gelu(a @ w)


def _beside(rank: int, port: int, rows: list[int], iters: int, q: object) -> None:
    """Compute alone vs beside 1 or 2 async all-to-alls; medians in ms, keyed (rows, N, in flight)."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, w = torch.randn(12, 256), torch.randn(256, 512)
    res = {}
    for r in rows:
        xs = [torch.randn(r * 2, 256) for _ in range(2)]
        ys = [torch.empty_like(x) for x in xs]
        for n in BESIDE_WORK:
            for flight in (1, 2):
                alone, sync, beside, wait = [], [], [], []
                for _ in range(iters):
                    dist.barrier()
                    t0 = time.perf_counter_ns()
                    _work(n, a, w)
                    alone.append(time.perf_counter_ns() - t0)
                    dist.barrier()
                    t0 = time.perf_counter_ns()
                    for x, y in zip(xs[:flight], ys[:flight], strict=True):
                        dist.all_to_all_single(y, x)
                    sync.append(time.perf_counter_ns() - t0)
                    dist.barrier()
                    works = [
                        dist.all_to_all_single(y, x, async_op=True)
                        for x, y in zip(xs[:flight], ys[:flight], strict=True)
                    ]
                    t0 = time.perf_counter_ns()
                    _work(n, a, w)
                    t1 = time.perf_counter_ns()
                    for wk in works:
                        wk.wait()
                    beside.append(t1 - t0)
                    wait.append(time.perf_counter_ns() - t1)
                res[(r, n, flight)] = tuple(statistics.median(v[5:]) / 1e6 for v in (alone, beside, wait, sync))
    if rank == 0:
        q.put(res)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def _print_beside(res: dict) -> None:
    print(
        "| KB per peer | work N | calls in flight | compute alone ms | compute beside ms | wait after ms "
        "| async cost ms | same calls sync ms | async / sync |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (r, n, flight), (alone, beside, wait, sync) in sorted(res.items()):
        cost = beside - alone + wait
        print(
            f"| {r * 256 * 4 // 1024} | {n} | {flight} | {alone:.3f} | {beside:.3f} | {wait:.3f} | {cost:.3f} "
            f"| {sync:.3f} | {cost / sync:.2f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 512], help="rows of 256 floats sent to each peer")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--beside", action="store_true", help="compute beside in-flight transfers (see the docstring)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    target = _beside if args.beside else _rank
    procs = [ctx.Process(target=target, args=(r, args.port, args.rows, args.iters, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = q.get()
    for p in procs:
        p.join()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.beside:
        _print_beside(res)
        return
    print("| compute C ms | KB per peer | sync median / mean / p90 ms | wait after C: median / mean / p90 ms |")
    print("|---|---|---|---|")
    for (c_ms, r), (s, w) in sorted(res.items()):
        print(
            f"| {c_ms:g} | {r * 256 * 4 // 1024} | {s[0]:.3f} / {s[1]:.3f} / {s[2]:.3f} | {w[0]:.3f} / {w[1]:.3f} / {w[2]:.3f} |"
        )


if __name__ == "__main__":
    main()

"""Where a gloo rank's step time goes, thread by thread: on a core, queued for one, or blocked.

Runs the demo's MoE layer (``ep_trace.workloads.demo.model_step``) on 2 gloo ranks, no profiler,
alternating 1 and K chunks step by step in one run (``--alt-chunks``), and reads every thread's
``/proc/self/task/<tid>/schedstat`` (time on a CPU, time waiting on the run queue, ns) around each
step. Per rank and chunk count it prints the medians over steps of the step's wall time and of each
thread's run / run-queue time: the main thread is the compute, ``pt_gloo_runloop`` torch's gloo
worker, ``gloo_tcp_loop`` gloo's TCP event loop. Blocked time = wall - run - run queue.

``--comm fifo`` puts the gloo threads on SCHED_FIFO (what ``ep-trace demo --comm-priority`` does),
``--comm normal`` leaves them on the fair scheduler; ``--sync-chunks`` waits for every chunk's
all-to-all at once (chunked, not overlapped), which separates the cost of chunking from any cost of
the overlap. The ranks run on jemalloc when it is installed, as the demo's do.

Run: ``python benchmarks/comm_sched.py [--tokens 512] [--k 4] [--steps 60] [--comm fifo|normal]
[--sync-chunks] [--pin]`` (a few seconds). Figures: benchmarks/README.md, "Stop 25".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any


def _threads() -> dict[int, tuple[int, int, str]]:
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            run, wait, _ = (task / "schedstat").read_text().split()
            out[int(task.name)] = (int(run), int(wait), (task / "comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _rank(rank: int, port: int, q: Any, args: argparse.Namespace, out: str) -> None:
    import time

    import torch.distributed as dist

    from ep_trace.workloads.comm_priority import prioritize_comm_threads
    from ep_trace.workloads.demo import DemoConfig, build_rank_model, model_step
    from ep_trace.workloads.launcher import init_rank, pin_to_core

    if args.pin:
        pin_to_core(rank)
    init_rank(rank, 2, port)
    if args.sync_chunks:
        import ep_trace.workloads.moe as moe

        post = moe._a2a

        class _Done:
            def wait(self) -> bool:
                return True

        def sync(o: Any, i: Any, os_: list[int], is_: list[int], group: Any, async_op: bool) -> Any:
            post(o, i, os_, is_, group, False)
            return _Done()

        moe._a2a = sync  # type: ignore[assignment]
    cfg = DemoConfig(ranks=2, tokens=args.tokens, chunks=1, alt_chunks=args.k, steps=args.steps)
    weights = build_rank_model(cfg, rank)
    main = threading.get_native_id()
    for s in (-1, -2):  # gloo connects on first use; both paths once
        model_step(cfg, weights, rank, s, 0.0)
    got = prioritize_comm_threads("realtime" if args.comm == "fifo" else "normal")
    rows = []
    for s in range(args.steps):
        dist.barrier()
        a, t0 = _threads(), time.perf_counter_ns()
        model_step(cfg, weights, rank, s, 0.0)
        t1, b = time.perf_counter_ns(), _threads()
        per: dict[str, list[int]] = {}
        for tid, (run, wait, name) in b.items():
            r0, w0, _ = a.get(tid, (0, 0, name))
            x = per.setdefault("main" if tid == main else name, [0, 0])
            x[0] += run - r0
            x[1] += wait - w0
        rows.append({"chunks": cfg.chunks_at(s), "wall": t1 - t0, "threads": per})
    Path(out, f"rank{rank}.json").write_text(json.dumps({"comm_threads": got, "steps": rows[2:]}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--comm", choices=("fifo", "normal"), default="fifo")
    ap.add_argument("--sync-chunks", action="store_true")
    ap.add_argument("--pin", action="store_true")
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        sys.exit("comm_sched: needs Linux (/proc/<tid>/schedstat)")
    from ep_trace.workloads.comm_priority import COMM_THREAD_PREFIXES
    from ep_trace.workloads.launcher import rank_allocator, spawn_ranks

    with tempfile.TemporaryDirectory() as out, rank_allocator():
        spawn_ranks(_rank, 2, (args, out))
        print(f"gloo threads: {json.loads(Path(out, 'rank0.json').read_text())['comm_threads']}; ms per step, medians")
        print("| rank | chunks | steps | wall | main run | main run queue | main blocked | gloo run | gloo run queue |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in (0, 1):
            steps = json.loads(Path(out, f"rank{r}.json").read_text())["steps"]
            for k in sorted({x["chunks"] for x in steps}):
                sel = [x for x in steps if x["chunks"] == k]

                def med(f: Any, sel: list[dict[str, Any]] = sel) -> float:
                    return statistics.median(f(x) for x in sel) / 1e6

                def gloo(x: dict[str, Any], i: int) -> int:
                    return sum(v[i] for n, v in x["threads"].items() if n.startswith(COMM_THREAD_PREFIXES))

                run, rq = med(lambda x: x["threads"]["main"][0]), med(lambda x: x["threads"]["main"][1])
                wall = med(lambda x: x["wall"])
                print(
                    f"| {r} | {k} | {len(sel)} | {wall:.2f} | {run:.2f} | {rq:.2f} | {wall - run - rq:.2f} "
                    f"| {med(lambda x: gloo(x, 0)):.2f} | {med(lambda x: gloo(x, 1)):.2f} |"
                )


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

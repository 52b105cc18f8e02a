"""Generate the 4-rank EP-2 gloo training traces of ``tests/data/ep2_gloo/`` with a plain torch job.

An expert-parallel MoE layer as a user writes it, without ep-trace's capture: 4 ranks on gloo
(CPU, loopback), EP size 2, so

* EP groups {0, 1} and {2, 3}: the token count exchange, dispatch and combine all-to-alls
  (``dist.all_to_all_single`` with split sizes);
* expert-data-parallel groups {0, 2} and {1, 3}: the experts' gradient all-reduce;
* the world: the dense (non-expert) gradient all-reduce.

Rank 3 is a straggler: its experts take ``STRAGGLER_S`` longer (a sleep inside its expert stage),
so rank 2 waits for it in its EP group's combine, rank 1 in its expert-data-parallel all-reduce, and
everybody in the world all-reduce; rank 0 shares no all-to-all with rank 3.

Profiled with ``torch.profiler`` (CPU activity, ``record_shapes=True`` so that gloo's split sizes
are recorded), 1 warm-up step then 3 active steps; writes ``rank{r}.pt.trace.json.gz``.

Command (about 20 s on 2 cores)::

    python tests/data/ep2_gloo/make_ep2_gloo.py tests/data/ep2_gloo
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
EP = 2
TOKENS = 256
HIDDEN = 64
EXPERTS_PER_RANK = 2
STRAGGLER_RANK = 3
STRAGGLER_S = 0.02
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _step(rank: int, ep_group: dist.ProcessGroup, edp_group: dist.ProcessGroup, w: dict[str, torch.Tensor]) -> None:
    """One training step of the MoE layer (forward, backward by hand, gradient all-reduces)."""
    gen = torch.Generator().manual_seed(rank * 1000 + int(time.time_ns() % 7))
    x = torch.randn(TOKENS, HIDDEN, generator=gen)
    with torch.profiler.record_function("dense"):
        h = torch.relu(x @ w["dense"])
    with torch.profiler.record_function("route"):
        logits = h @ w["router"]
        expert = logits.argmax(dim=1)  # top-1 over EP * EXPERTS_PER_RANK experts
        owner = expert // EXPERTS_PER_RANK  # EP-local rank owning the expert
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=EP)
    with torch.profiler.record_function("dispatch"):
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=ep_group)  # count exchange
        tokens = torch.empty(int(recv.sum()), HIDDEN)
        dist.all_to_all_single(tokens, h[order], recv.tolist(), send.tolist(), group=ep_group)
    with torch.profiler.record_function("expert"):
        y = torch.relu(tokens @ w["expert"])
        if rank == STRAGGLER_RANK:
            time.sleep(STRAGGLER_S)
    with torch.profiler.record_function("combine"):
        back = torch.empty(TOKENS, HIDDEN)
        dist.all_to_all_single(back, y, send.tolist(), recv.tolist(), group=ep_group)
    with torch.profiler.record_function("backward"):
        g_expert = tokens.T @ y / TOKENS
        g_dense = x.T @ back[torch.argsort(order)] / TOKENS
    with torch.profiler.record_function("grad_sync"):
        dist.all_reduce(g_expert, group=edp_group)  # the experts' replicas: expert-data-parallel
        dist.all_reduce(g_dense)  # dense weights: the world
    w["expert"] -= 1e-3 * g_expert
    w["dense"] -= 1e-3 * g_dense


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120)
    )
    # every rank creates every group, in the same order (torch.distributed.new_group's contract)
    ep_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    edp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    ep_group = ep_groups[rank // EP]
    edp_group = edp_groups[rank % EP]
    torch.manual_seed(0)  # replicated weights
    w = {
        "dense": torch.randn(HIDDEN, HIDDEN) / HIDDEN**0.5,
        "router": torch.randn(HIDDEN, EP * EXPERTS_PER_RANK),
        "expert": torch.randn(HIDDEN, HIDDEN) / HIDDEN**0.5,
    }
    dist.barrier()
    sched = torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)
    tmp = Path(out) / f".rank{rank}.json"
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=sched,
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(tmp)),
    ) as prof:
        for _ in range(1 + STEPS):
            _step(rank, ep_group, edp_group, w)
            prof.step()
    dist.barrier()
    with open(tmp, "rb") as src, gzip.open(Path(out) / f"rank{rank}.pt.trace.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    tmp.unlink()
    dist.destroy_process_group()


def main(out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(_free_port(), out), nprocs=WORLD, join=True, start_method="spawn")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/ep2_gloo")

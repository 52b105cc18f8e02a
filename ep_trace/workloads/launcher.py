"""Multi-rank launcher: torch.multiprocessing spawn + gloo on loopback with a free port."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["free_port", "spawn_ranks", "init_rank", "Progress"]

#: ``progress(stage, done, total)`` callback.
Progress = Callable[[str, int, int], None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_rank(rank: int, world: int, port: int, timeout_s: float = 120.0, backend: str = "gloo") -> None:
    """Join the process group of a spawned run (called inside each rank); TCP rendezvous on loopback.

    ``backend="nccl"`` binds rank r to ``cuda:r`` first (NCCL needs one device per rank).
    """
    import torch
    import torch.distributed as dist

    # One intra-op thread per rank: W ranks share the machine's cores; more threads only thrash.
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)
    # gloo picks an interface from the host name, which may not resolve; pin loopback.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def spawn_ranks(
    fn: Callable[..., None],
    world: int,
    args: tuple[Any, ...],
    on_message: Callable[[Any], None] | None = None,
) -> None:
    """Run ``fn(rank, port, queue, *args)`` in ``world`` spawned processes and wait for all.

    ``queue`` is a spawn-context queue; every object a rank puts on it is passed to ``on_message``
    in the parent while the ranks run. A failing rank makes torch terminate the others and raise
    ``torch.multiprocessing.ProcessRaisedException`` (with the rank's traceback) here.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_port()
    procs = mp.start_processes(fn, args=(port, q, *args), nprocs=world, join=False, start_method="spawn")

    def drain() -> None:
        while not q.empty():
            msg = q.get()
            if on_message is not None:
                on_message(msg)

    try:
        while not procs.join(timeout=0.1):
            drain()
        drain()
    except BaseException:
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
        raise
    finally:
        q.close()

"""Multi-rank launcher: torch.multiprocessing spawn + gloo on loopback with a free port."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

__all__ = ["free_port", "spawn_ranks", "init_rank", "pin_to_core", "huge_page_malloc", "Progress", "HUGE_PAGE_TUNABLE"]

#: ``progress(stage, done, total)`` callback.
Progress = Callable[[str, int, int], None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: glibc (>= 2.35) tunable: malloc asks for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on
#: the memory it maps, so a fresh multi-MB buffer faults once per 2 MiB instead of once per 4 KiB.
HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def pin_to_core(rank: int) -> int:
    """Pin the calling process to one core of its affinity mask (``rank`` modulo the mask's size).

    Call it before any thread is started (gloo's worker threads, torch's pools inherit the mask):
    each rank then owns a core the way it would own a GPU, its transfer thread shares that core with
    its compute (no rank borrows a core from another between steps), and the sidecar's
    ``cpu_cores`` (the mask at capture) says 1, which the overlap and pipelining what-ifs read
    (``analysis.resources``). With more ranks than cores, ranks share cores round-robin.

    Returns:
        The core.
    """
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


@contextmanager
def huge_page_malloc(enabled: bool = True) -> Iterator[None]:
    """Spawned ranks' glibc malloc backs its mappings with transparent huge pages (while inside).

    Why: glibc returns every freed buffer above its mmap threshold to the OS, so each large op of a
    CPU rank faults its output's pages in again, 4 KiB at a time; PyTorch's CUDA caching allocator
    never does that on a GPU rank. On the 2-vCPU VM of benchmarks/README.md (3 us per fault) that
    was 14 ms of a 73 ms 512-token demo step, and it made 4 small chunks look 8 ms faster than one
    big one. Spawned children read ``GLIBC_TUNABLES`` at start, so it is set in this process's
    environment around the spawn and restored after; a value of the user's own is kept, the tunable
    appended. Needs THP in ``madvise`` or ``always`` mode; elsewhere glibc ignores it.
    """
    if not enabled:
        yield
        return
    old = os.environ.get("GLIBC_TUNABLES")
    if old is not None and "glibc.malloc.hugetlb" in old:
        yield
        return
    os.environ["GLIBC_TUNABLES"] = HUGE_PAGE_TUNABLE if not old else f"{old}:{HUGE_PAGE_TUNABLE}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = old


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

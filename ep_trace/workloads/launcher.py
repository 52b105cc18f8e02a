"""Multi-rank launcher: torch.multiprocessing spawn + gloo on loopback with a free port."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from ep_trace.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "free_port",
    "spawn_ranks",
    "init_rank",
    "pin_to_core",
    "huge_page_malloc",
    "find_jemalloc",
    "rank_allocator",
    "check_allocator",
    "loaded_allocator",
    "Progress",
    "HUGE_PAGE_TUNABLE",
    "JEMALLOC_CONF",
    "ALLOCATORS",
]

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
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment (which spawned children read at exec), restore after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_allocator(allocator: str) -> None:
    """Raise :class:`ConfigError` unless ``allocator`` is one of :data:`ALLOCATORS`."""
    if allocator not in ALLOCATORS:
        raise ConfigError(f"--allocator: {allocator!r} is not one of {', '.join(ALLOCATORS)}")


@contextmanager
def huge_page_malloc(enabled: bool = True) -> Iterator[None]:
    """Spawned ranks' glibc malloc backs its mappings with transparent huge pages (while inside).

    The glibc fallback of :func:`rank_allocator`: a freed multi-MB buffer is still faulted in again
    by the next op, but 2 MiB at a time instead of 4 KiB (on the 2-vCPU VM of benchmarks/README.md,
    2 faults of 6-7 ms each per 4 MB buffer against 1 024 of 3-30 us). Spawned children read
    ``GLIBC_TUNABLES`` at start, so it is set in this process's environment around the spawn and
    restored after; a value of the user's own is kept, the tunable appended. Needs THP in
    ``madvise`` or ``always`` mode; elsewhere glibc ignores it.
    """
    if not enabled:
        yield
        return
    old = os.environ.get("GLIBC_TUNABLES")
    if old is not None and "glibc.malloc.hugetlb" in old:
        yield
        return
    with _environ({"GLIBC_TUNABLES": HUGE_PAGE_TUNABLE if not old else f"{old}:{HUGE_PAGE_TUNABLE}"}):
        yield


#: jemalloc options for the ranks: never hand freed pages back to the OS (no dirty / muzzy decay), so a
#: buffer freed in one step is reused without page faults in the next, as PyTorch's CUDA caching
#: allocator reuses its blocks on a GPU rank (jemalloc's default returns them after 10 s of decay).
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"

#: ``--allocator`` choices: ``auto`` (jemalloc when the library is found, else glibc), ``jemalloc``, ``glibc``.
ALLOCATORS = ("auto", "jemalloc", "glibc")

# Where distributions put libjemalloc (Debian / Ubuntu multiarch, Fedora / RHEL, source builds);
# conda's jemalloc package puts it under the environment's lib/.
_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def find_jemalloc() -> Path | None:
    """The jemalloc shared library to preload into the ranks, or None when none is installed.

    ``EP_TRACE_JEMALLOC`` (a path) wins; then ``libjemalloc.so.2`` / ``libjemalloc.so`` in the Python
    environment's ``lib/`` and the system library directories (Debian: ``apt install libjemalloc2``).
    Linux only: the ranks are preloaded with ``LD_PRELOAD``.
    """
    if not sys.platform.startswith("linux"):
        return None
    env = os.environ.get("EP_TRACE_JEMALLOC")
    if env:
        return Path(env) if Path(env).is_file() else None
    for d in (str(Path(sys.prefix) / "lib"), *_LIB_DIRS):
        for name in ("libjemalloc.so.2", "libjemalloc.so"):
            p = Path(d) / name
            if p.is_file():
                return p
    return None


def _user_preloads_malloc() -> bool:
    return any("malloc" in Path(p).name for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split())


@contextmanager
def rank_allocator(allocator: str = "auto", huge_pages: bool = True) -> Iterator[str]:
    """Spawned ranks allocate the way a GPU rank does: freed buffers are reused, not faulted in again.

    Why: PyTorch's CPU tensors come from glibc ``posix_memalign``. A freed multi-MB buffer is either
    unmapped (above the mmap threshold) or left in a heap hole that the next aligned request of the
    same size does not fit (its alignment padding makes it larger), so every large op of a CPU rank
    faults its output's pages in again. On the 2-vCPU VM of benchmarks/README.md that was 1 024
    faults and 2-30 ms per 4 MB ``aten::mul`` (``getrusage`` minflt / sys time, 2048-token demo),
    against 0.3-0.5 ms with jemalloc. Raising glibc's thresholds does not help (``mmap_threshold``
    above 32 MiB is ignored, and the padding still defeats reuse). A GPU rank's caching allocator
    never does this, so a CPU stand-in of one should not either.

    ``jemalloc`` (``auto`` when :func:`find_jemalloc` finds it): ``LD_PRELOAD`` of the library with
    :data:`JEMALLOC_CONF`; ``glibc``: glibc's malloc, on transparent huge pages when ``huge_pages``
    (:func:`huge_page_malloc`: 2 faults per 4 MB instead of 1 024, each dearer). An ``LD_PRELOAD``
    of the user's own that names an allocator (jemalloc, tcmalloc, mimalloc) is kept as it is.
    The environment is set in this process around the spawn (children read it at exec) and
    restored after.

    Yields:
        What the ranks will use: ``jemalloc``, ``glibc`` or ``preloaded`` (the user's own).

    Raises:
        ConfigError: ``allocator`` is not one of :data:`ALLOCATORS`, or ``jemalloc`` was asked for
            and no library was found.
    """
    check_allocator(allocator)
    if _user_preloads_malloc():
        yield "preloaded"
        return
    lib = find_jemalloc() if allocator != "glibc" else None
    if lib is None:
        if allocator == "jemalloc":
            raise ConfigError(
                "--allocator jemalloc: no libjemalloc found; install it (Debian: apt install libjemalloc2) "
                "or set EP_TRACE_JEMALLOC to its path"
            )
        if allocator == "auto":
            logger.info("no libjemalloc found: the ranks use glibc malloc (op times include page faults)")
        with huge_page_malloc(huge_pages):
            yield "glibc"
        return
    preload, conf = os.environ.get("LD_PRELOAD"), os.environ.get("MALLOC_CONF")
    # The user's MALLOC_CONF comes last: jemalloc applies options left to right, so theirs win.
    with _environ(
        {
            "LD_PRELOAD": " ".join(p for p in (str(lib), preload) if p),
            "MALLOC_CONF": ",".join(p for p in (JEMALLOC_CONF, conf) if p),
        }
    ):
        yield "jemalloc"


def loaded_allocator() -> str:
    """The allocator of this process, as its memory map shows it: ``jemalloc``, ``tcmalloc``, ``mimalloc`` or ``glibc``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc" if sys.platform.startswith("linux") else "system"
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if f"lib{name}" in maps:
            return name
    return "glibc"


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

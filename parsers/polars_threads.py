"""The size of polars' thread pool, chosen by the command line before polars loads.

polars (2.1) sizes its rayon pool once, when its library loads, from ``POLARS_MAX_THREADS``
(default: every CPU). Each eager query run from Python is handed to that pool and the Python
thread sleeps until it is done: two context switches per query however small. A rank file of a few
MB costs ~500 such queries, so on 1,024 small rank files a 2-thread pool made 0.94-1.0 M context
switches and 21.5-23.0 CPU-s, a 1-thread pool 74 k and 19.1 CPU-s, with the same wall time
(19.0 vs 18.0-19.5 s, benchmarks/README.md, "polars threads"). The parallelism that pays for
ingest is across files and slices (the readers' own threads and ``--jobs`` worker processes), not
inside one small query.

So ``ep-trace analyze|ingest --jobs N`` means N cores: :func:`configure_threads` gives polars N
threads in the driver (what the cross-rank analysis uses), and :func:`worker_init` gives each of
the N reader processes one (N x N threads would contend for N cores); numpy's OpenBLAS gets N
too (``OPENBLAS_NUM_THREADS``; workers inherit it). A ``POLARS_MAX_THREADS`` or
``OPENBLAS_NUM_THREADS`` set by the user is kept, in the driver and in the workers. Library callers are not affected: only
the command line calls :func:`configure_threads`.
"""

from __future__ import annotations

import os
import sys

__all__ = ["available_cpus", "configure_threads", "worker_init", "worker_threads"]

_VAR = "POLARS_MAX_THREADS"
_BLAS = "OPENBLAS_NUM_THREADS"
#: Set beside ``POLARS_MAX_THREADS`` when :func:`configure_threads` chose it (so that workers,
#: which inherit both, know the value is not the user's).
_MARK = "EP_TRACE_CHOSE_POLARS_THREADS"


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the platform has one (a container's
    cpuset, a pinned rank), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def configure_threads(jobs: int) -> bool:
    """Give polars ``min(jobs, CPUs available)`` threads, unless it is loaded or the user chose.

    Args:
        jobs: The ``--jobs`` value (>= 1).

    Returns:
        True when this call set ``POLARS_MAX_THREADS``.
    """
    n = str(max(1, min(jobs, available_cpus())))
    if "numpy" not in sys.modules and _BLAS not in os.environ:
        # numpy's OpenBLAS starts one thread per CPU at import, which spin after each call (0.8% of
        # the CPU of a 1,024-rank ingest in `blas_thread_server`); the same N as polars
        os.environ[_BLAS] = n
    if "polars" in sys.modules or (_VAR in os.environ and _MARK not in os.environ):
        return False
    os.environ[_VAR] = n
    os.environ[_MARK] = "1"
    return True


def worker_threads() -> str | None:
    """The ``POLARS_MAX_THREADS`` a reader worker process should get: ``"1"`` when the command
    line chose the driver's value, None when the user did (or nobody)."""
    return "1" if _MARK in os.environ else None


def worker_init(threads: str | None) -> None:
    """Process-pool initializer: set the worker's ``POLARS_MAX_THREADS`` before it loads polars.

    A spawned worker imports its parent's main module (the ``ep-trace`` script, which does not
    import polars) before the initializer runs, and polars only when the first task arrives."""
    if threads is not None:
        os.environ[_VAR] = threads

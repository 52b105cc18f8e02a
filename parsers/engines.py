"""Where rank files are decoded: here, in a local process pool, on Ray, or on any Executor.

The readers take a :class:`concurrent.futures.Executor` (only ``submit`` is used), so any engine
with that interface works: :func:`local_executor` (spawn processes on this machine),
:class:`RayExecutor` (one Ray task per big rank file, small files batched; ``pip install 'ep-trace[ray]'``), or
Dask's ``distributed.Client(...).get_executor()``. Tasks are :func:`ep_trace.parsers.read_pool.decode_batch`
calls on plain picklable specs; workers must have ep-trace installed (Ray: the same virtual
environment, or ``runtime_env={"pip": ["ep-trace"]}``) and, for ``ingest``, the output directory
must be on storage every worker can write (a shared filesystem; see docs/scale.md).

:func:`choose_workers` decides whether a local pool pays at all: a spawned worker costs ~1-2 s of
CPU before it decodes anything (importing polars and the readers), so for a few small files
``jobs=N`` runs in this process instead and is never slower than ``jobs=1``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

from ep_trace.parsers import polars_threads

__all__ = [
    "ENGINES",
    "RayExecutor",
    "choose_workers",
    "free_cpus",
    "local_executor",
    "make_executor",
]

log = logging.getLogger(__name__)

ENGINES: tuple[str, ...] = ("local", "ray")
#: CPU seconds a spawned worker spends before its first file (import of polars + readers), measured
#: 1.0-1.6 s on the project machine; a pool of N is used only when the work saves more than that.
SPAWN_CPU_S = 1.5
#: Rank files of at least this much JSON get one Ray task each (:class:`RayExecutor`); smaller
#: ones are batched. Measured on 1,024 param DLRM ranks (0.92 MB each) on a local 2-CPU Ray,
#: ``ingest``: one task per file 52-55 CPU-s / 60-63 s wall, batches 27 CPU-s / 34-43 s (median
#: of 3, load 7-11; benchmarks/README.md): each task costs ~25 ms of CPU more than a file of a
#: batch (Ray's task round trip, a Parquet partition per table, the per-file fixed cost that a
#: batch's one plan amortises). From 8 MB (~0.08 CPU-s of decode) that is <= 30% of the file's
#: own work, and big files gain from their own task: no waiting on a batch, one partition each.
RAY_ALONE_BYTES = 8 << 20


def free_cpus() -> int:
    """CPUs this process can use now: the machine's (its affinity mask where known) less the
    1-minute load average of everything else (this process counts 1 of it), at least 1.

    A pool sized to idle CPUs that other jobs hold is slower than no pool: measured on the shared
    2-core machine at load 6, ``--jobs 2`` took 33 s where ``--jobs 1`` took 24 s (1,024 ranks)."""
    n = polars_threads.available_cpus()
    try:
        others = max(0.0, os.getloadavg()[0] - 1.0)
    except OSError:  # no load average on this platform
        others = 0.0
    return max(1, min(n, round(n - others)))


def choose_workers(jobs: int, est_cpu_s: float, n_batches: int) -> int:
    """Worker processes worth starting for ``est_cpu_s`` of decode work in ``n_batches`` batches.

    With N > 1 workers the wall time is about ``SPAWN_CPU_S + est / N`` (they start in parallel),
    with none ``est``: the N (at most ``jobs``, the batches and the free CPUs, :func:`free_cpus`)
    that minimises it."""
    cap = min(jobs, n_batches, free_cpus())

    def cost(n: int) -> float:
        return est_cpu_s if n == 1 else SPAWN_CPU_S + est_cpu_s / n

    return min(range(1, max(cap, 1) + 1), key=cost)


def local_executor(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes (spawn, not fork: polars' thread pool must not be
    forked mid-use); one polars thread each when the command line sized the pools
    (:mod:`ep_trace.parsers.polars_threads`)."""
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=polars_threads.worker_init,
        initargs=(polars_threads.worker_threads(),),
    )


class _TaskFuture(Future[Any]):
    """The future of a Ray task, which cannot be cancelled from here once submitted.

    ``ObjectRef.future()`` accepts ``cancel()`` but the task still runs on the cluster (and an
    ingest task still writes its partitions); a cancelled future is also never "done" for
    :func:`concurrent.futures.wait`. So this one refuses ``cancel()``, and callers wait for it."""

    def __init__(self, inner: Future[Any]) -> None:
        super().__init__()
        inner.add_done_callback(self._copy)

    def _copy(self, inner: Future[Any]) -> None:
        exc = inner.exception()
        if exc is not None:
            self.set_exception(exc)
        else:
            self.set_result(inner.result())

    def cancel(self) -> bool:
        return False


class RayExecutor(Executor):
    """``concurrent.futures.Executor`` over Ray tasks: ``submit(fn, ...)`` runs ``fn`` as a Ray task
    (1 CPU, no retries: a bad file fails the same way every time) and returns its future.

    The readers ask it for :attr:`alone_bytes`: every rank file of at least that much JSON is a
    task of its own (decode -> its tables or Parquet partitions), the smaller files are batched as
    on a local pool (:data:`RAY_ALONE_BYTES`: one task per small file cost twice the CPU).

    Args:
        address: Ray cluster to join (``'auto'``, ``'ray://head:10001'``); None = ``RAY_ADDRESS`` or a
            new local Ray.
        num_cpus: CPUs of a new local Ray (ignored when joining a cluster).
        runtime_env: Passed to ``ray.init`` (e.g. ``{"pip": ["ep-trace"]}`` on a bare cluster); when
            the command line sized polars' pools (:mod:`ep_trace.parsers.polars_threads`), its
            ``env_vars`` also give each task one polars thread.
        alone_bytes: Files of at least this many estimated JSON bytes get one task each; 0: one
            task per file whatever its size; None: batches only (the local pool's plan).

    Raises:
        ImportError: Ray is not installed (``pip install 'ep-trace[ray]'``).
    """

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        runtime_env: dict[str, Any] | None = None,
        alone_bytes: int | None = RAY_ALONE_BYTES,
    ) -> None:
        import ray

        #: Rank files of at least this many JSON bytes get one task each (read by the reader's
        #: batch planner, ``read_pool.plan_batches``); smaller ones are batched. 0: one task per file.
        self.alone_bytes = alone_bytes
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if address is None and num_cpus is not None:
                kw["num_cpus"] = num_cpus
            threads = polars_threads.worker_threads()
            if threads is not None:  # one polars thread per 1-CPU task, as in a local pool
                env = dict(runtime_env or {})
                env_vars = dict(env.get("env_vars") or {})
                env_vars.setdefault("POLARS_MAX_THREADS", threads)
                runtime_env = {**env, "env_vars": env_vars}
            if runtime_env is not None:
                kw["runtime_env"] = runtime_env
            ray.init(address=address, **kw)
        self._remote: dict[Callable[..., Any], Any] = {}

    @property
    def workers(self) -> int:
        """CPUs of the cluster (tasks that can run at once)."""
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        return _TaskFuture(remote.remote(*args, **kwargs).future())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns = False


def make_executor(engine: str, jobs: int = 1, address: str | None = None) -> Executor | None:
    """The executor for ``--engine`` / ``--jobs``: None for ``local`` (the reader then chooses the
    pool size from the work, see :func:`choose_workers`), a :class:`RayExecutor` for ``ray``.

    Raises:
        ConfigError: unknown engine, or Ray not installed.
    """
    from ep_trace.errors import ConfigError

    if engine == "local":
        if address is not None:
            raise ConfigError("--address: only with --engine ray")
        return None
    if engine != "ray":
        raise ConfigError(f"--engine: unknown engine {engine!r}; use local or ray")
    try:
        return RayExecutor(address=address, num_cpus=jobs if jobs > 1 else None)
    except ImportError:
        raise ConfigError("--engine ray: Ray is not installed; pip install 'ep-trace[ray]'") from None
    except Exception as exc:  # noqa: BLE001 - ray.init raises a bare Exception (e.g. node start-up timeout)
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"--engine ray: could not start or join {where} ({first[:160]}); check --address / RAY_ADDRESS, or use --engine local"
        ) from None

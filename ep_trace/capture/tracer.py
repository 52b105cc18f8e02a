"""``Tracer``: torch.profiler around training steps, writing a Kineto trace and a sidecar per rank.

Two ways to mark steps::

    with Tracer("traces") as t:          # profiler runs for the whole block
        for batch in data:
            train_step(batch)
            t.step()                     # ends ProfilerStep#N, begins #N+1 (torch.profiler semantics)

    tracer = Tracer("traces")
    for batch in data:
        with tracer.step():              # one ProfilerStep#N exactly around the body
            train_step(batch)
    tracer.close()                       # stops the profiler, writes the trace

Files per rank: ``rank{r}.pt.trace.json.gz`` (standard Kineto chrome trace, opens in Perfetto /
TensorBoard) and ``rank{r}.ep.jsonl`` (docs/sidecar.md). ``ProfilerStep#N`` ranges are opened by
the Tracer itself with ``record_function`` -- the same range torch.profiler's ``prof.step()`` emits --
so that the scope form gets no empty trailing step; the sidecar ``step`` is the same N.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from ep_trace.capture import concrete
from ep_trace.capture.sidecar import SidecarWriter, _pop, _push, sidecar_path, trace_path
from ep_trace.errors import ConfigError, MissingDependencyError

__all__ = ["Tracer", "require_torch"]

logger = logging.getLogger(__name__)


def require_torch() -> Any:
    """Import torch, or raise :class:`MissingDependencyError` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            "torch is needed to capture traces (analysis works without it); install it: pip install 'torch>=2.4' "
            "(or the [capture] extra: pip install '.[capture]' in a checkout)"
        ) from None
    return torch


def _cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count: a launcher that
    pins ranks to cores, or a container's cpuset, gives each rank fewer than ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _dist_info() -> tuple[int, int, str | None]:
    """(rank, world_size, backend); (0, 1, None) when torch.distributed is absent or not initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    return 0, 1, None


def _job_id(explicit: str | None, backend: str | None) -> str:
    """One id for all ranks of a run: explicit > $EP_TRACE_JOB_ID > $TORCHELASTIC_RUN_ID > broadcast."""
    for candidate in (explicit, os.environ.get("EP_TRACE_JOB_ID"), os.environ.get("TORCHELASTIC_RUN_ID")):
        if candidate:
            return str(candidate)
    job = uuid.uuid4().hex
    if backend is not None:
        import torch.distributed as dist

        # Collective: every rank constructing a Tracer takes part (documented on Tracer).
        box = [job]
        dist.broadcast_object_list(box, src=0)
        job = str(box[0])
    return job


class _StepScope:
    """What :meth:`Tracer.step` returns; as a context manager it bounds exactly one step."""

    __slots__ = ("_tracer", "number", "_after_initial")

    def __init__(self, tracer: Tracer, number: int, after_initial: bool) -> None:
        self._tracer = tracer
        self.number = number
        self._after_initial = after_initial

    def __enter__(self) -> Tracer:
        if self._after_initial:
            # `with Tracer() as t: with t.step(): ...`: step() already closed the step that __enter__
            # opened, empty. Ranges cannot be withdrawn from Kineto, so say what happened.
            logger.warning(
                "ep-trace: ProfilerStep#%d is empty: inside `with Tracer(...) as t` call t.step() at the end "
                "of each step; use `with tracer.step():` on a Tracer that you close() yourself",
                self.number - 1,
            )
        return self._tracer

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        t = self._tracer
        if t._open_step == self.number:
            t._end_step()
        if exc_type is not None:
            # Write what was captured before the exception propagates (it is never swallowed).
            t._stop_quietly()


class Tracer:
    """Profile training steps of one rank and write ``rank{r}.pt.trace.json.gz`` + ``rank{r}.ep.jsonl``.

    Rank and world size come from torch.distributed when it is initialised, else rank 0 of 1.
    CPU activity is always recorded, CUDA when ``torch.cuda.is_available()``; ``record_shapes`` is on
    by default because gloo split sizes exist only in the ``Concrete Inputs`` it records.

    Args:
        out_dir: Trace directory (created). Existing files of the same rank are overwritten.
        job_id: Id shared by all ranks of the run. Default: ``$EP_TRACE_JOB_ID``,
            ``$TORCHELASTIC_RUN_ID``, else rank 0's random id broadcast to all ranks -- a collective,
            so then every rank of the default group must construct and start its Tracer.
        first_step: Number of the first ``ProfilerStep#N``.
        record_shapes: Passed to ``torch.profiler.profile``.
        with_stack: Passed to ``torch.profiler.profile``.
        meta: Extra ``meta`` keys of docs/sidecar.md known up front (``num_experts``, ``top_k``,
            ``placement``, ``redundant_experts``, ``hidden_size``, ``dtype``, ``ep_group_ranks``,
            ``device``). A ``host`` given here also names the host in the Kineto trace's header
            (``host_name``): an emulated node.
        concrete_inputs: Let torch record every op's ``Concrete Inputs`` (its default). False
            records them only inside :func:`ep_trace.capture.concrete.collective_inputs` blocks: on
            torch 2.13.0+cpu, with the recording on, 4 MB CPU ops ran ~40x slower and memory was not
            reused while profiling (:mod:`ep_trace.capture.concrete`); wrap your gloo all-to-alls in that block, or record
            their splits with :func:`ep_trace.record_a2a`.
        backend: ``"kineto"`` (torch.profiler, writes ``rank{r}.pt.trace.json.gz``) or ``"cupti"``
            (:class:`ep_trace.capture.cupti.collector.CuptiCollector`, writes ``rank{r}.ep-events.parquet``;
            needs the ``cupti`` extra and a GPU).

    Raises:
        ConfigError: ``out_dir`` exists and is not a directory, or an unknown ``backend``.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        job_id: str | None = None,
        first_step: int = 0,
        record_shapes: bool = True,
        with_stack: bool = False,
        meta: dict[str, Any] | None = None,
        backend: str = "kineto",
        concrete_inputs: bool = True,
    ) -> None:
        if backend not in ("kineto", "cupti"):
            raise ConfigError(f"backend: unknown backend {backend!r}; use 'kineto' or 'cupti'")
        self._backend = backend
        self._cupti: Any = None
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ConfigError(f"out_dir: {self.out_dir} exists and is not a directory; choose a directory path")
        self._job_id = job_id
        self._next_step = int(first_step)
        self._record_shapes = record_shapes
        self._with_stack = with_stack
        self._concrete_inputs = concrete_inputs
        self._suppressed = False
        self._extra_meta = dict(meta or {})
        self._prof: Any = None
        self._writer: SidecarWriter | None = None
        self._step_rec: Any = None
        self._open_step: int | None = None
        self._initial_step_open = False  # the step __enter__ opened is still open
        self.rank = 0
        self.world_size = 1
        self.trace_file: Path | None = None
        self.sidecar_file: Path | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the profiler is collecting."""
        return self._prof is not None

    def start(self) -> Tracer:
        """Start the profiler and open the sidecar (idempotent). Returns ``self``."""
        if self._prof is not None:
            return self
        torch = require_torch()
        from torch.profiler import ProfilerActivity, profile

        import ep_trace

        rank, world, backend = _dist_info()
        self.rank, self.world_size = rank, world
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cuda = torch.cuda.is_available()
        meta: dict[str, Any] = {
            "rank": rank,
            "world_size": world,
            "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
            "host": socket.gethostname(),
            "backend": backend,
            "device": f"cuda:{torch.cuda.current_device()}" if cuda else "cpu",
            "cpu_cores": _cpu_cores(),
            "host_cores": os.cpu_count(),
            "job_id": _job_id(self._job_id, backend),
            "ep_group_ranks": list(range(world)),
            "num_experts": None,
            "top_k": None,
            "placement": None,
            "hidden_size": None,
            "dtype": None,
            "ep_trace_version": ep_trace.__version__,
            "torch_version": str(torch.__version__),
        }
        meta.update(self._extra_meta)
        self.trace_file = trace_path(self.out_dir, rank)
        self.sidecar_file = sidecar_path(self.out_dir, rank)
        if self._backend == "cupti":  # before the sidecar opens: no cupti-python / GPU -> clear error, no files
            from ep_trace.capture.cupti.collector import CuptiCollector

            self._cupti = CuptiCollector(self.out_dir, rank, world_size=world, job_id=meta["job_id"]).start()
            self.trace_file = self._cupti.path
        self._writer = SidecarWriter(self.sidecar_file, meta, first_step=self._next_step)
        if self._backend == "cupti":
            self._prof = self._cupti
            _push(self._writer)
            return self
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        if self._record_shapes and not self._concrete_inputs:
            self._suppressed = concrete.suppress()
        prof = profile(activities=activities, record_shapes=self._record_shapes, with_stack=self._with_stack)
        prof.start()
        self._prof = prof
        # Kineto copies this into the trace's top level, so a trace file alone names its job and rank.
        prof.add_metadata_json(
            "ep_trace",
            json.dumps({"job_id": meta["job_id"], "rank": rank, "world_size": world, "version": ep_trace.__version__}),
        )
        if "host" in self._extra_meta:
            # A host the caller names (an emulated node: ep-trace demo --nodes) replaces the machine's
            # name in the trace header too; torch 2.13 writes its own ``host_name`` there, and a key
            # added after start wins (the header keeps one).
            prof.add_metadata_json("host_name", json.dumps(str(meta["host"])))
        _push(self._writer)
        return self

    def stop(self) -> None:
        """End the open step, stop the profiler and write both files (idempotent)."""
        if self._prof is None:
            return
        prof, writer = self._prof, self._writer
        self._prof = None
        try:
            if self._open_step is not None:
                self._end_step()
            prof.stop()  # CuptiCollector.stop() writes rank{r}.ep-events.parquet
            if prof is not self._cupti:
                assert self.trace_file is not None
                prof.export_chrome_trace(str(self.trace_file))  # torch gzips when the path ends in .gz
        finally:
            if self._suppressed:
                self._suppressed = False
                concrete.restore()
            if writer is not None:
                _pop(writer)
                writer.close()

    close = stop

    def _stop_quietly(self) -> None:
        """Stop while another exception propagates: log a failure instead of masking the original."""
        try:
            self.stop()
        except Exception:
            logger.exception("ep-trace: could not write the trace of rank %d to %s", self.rank, self.out_dir)

    def __enter__(self) -> Tracer:
        self.start()
        self._begin_step()
        self._initial_step_open = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.stop()
        else:
            self._stop_quietly()  # the exception is re-raised by returning None

    # -- steps ---------------------------------------------------------------------------------
    @property
    def current_step(self) -> int | None:
        """Number of the open ``ProfilerStep#N``, or ``None`` between steps."""
        return self._open_step

    def step(self) -> _StepScope:
        """End the open step (if any) and begin the next one.

        Called bare at the end of each step inside ``with Tracer(...)``; or used as
        ``with tracer.step():`` around one step (the step then ends with the block). Starts the
        profiler when it is not running yet.
        """
        if self._prof is None:
            self.start()
        after_initial = self._open_step is not None and self._initial_step_open
        if self._open_step is not None:
            self._end_step()
        number = self._begin_step()
        return _StepScope(self, number, after_initial)

    def _begin_step(self) -> int:
        from torch.autograd.profiler import record_function

        number = self._next_step
        self._next_step += 1
        assert self._writer is not None
        self._writer.begin_step(number)
        self._step_rec = record_function(f"ProfilerStep#{number}")
        self._step_rec.__enter__()
        self._open_step = number
        return number

    def _end_step(self) -> None:
        self._initial_step_open = False
        rec, self._step_rec = self._step_rec, None
        number, self._open_step = self._open_step, None
        if rec is not None:
            rec.__exit__(None, None, None)
        if self._cupti is not None and number is not None:
            self._cupti.step_end(number)  # flush CUPTI buffers: one Parquet row group per step
        if self._writer is not None:
            self._writer.end_step(time.time_ns())

"""``stage()``: tag a range of an MoE layer so Kineto and Nsight both see it.

``stage("dispatch", layer=3)`` opens a ``torch.autograd.profiler.record_function`` range named by
:func:`ep_trace.stage_names.format_stage_name` (``ep:dispatch:l3:fwd``) and, when CUDA is
available and an Nsight Systems collector is attached (its injection variables are set in the
process), an NVTX range with the same name. ``EP_TRACE_NVTX=1`` forces NVTX ranges on a CUDA machine
(e.g. for another NVTX collector), ``EP_TRACE_NVTX=0`` turns them off; read once, at the first call.

Cost: when neither a profiler nor an NVTX collector is active, a call is one cached name lookup and
one C++ flag check (measured in ``benchmarks/stage_overhead.py``; figures in benchmarks/README.md).
torch is imported on first use, never at module import.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from ep_trace.stage_names import format_stage_name

__all__ = ["stage", "stage_name"]

F = TypeVar("F", bound=Callable[..., Any])

# Environment variables set by Nsight Systems (nsys launch/profile) in the profiled process: the CUDA
# injection library is how nsys attaches its NVTX collector. Without a collector an NVTX push/pop is
# a wasted Python -> C call, so we skip it.
_NSYS_ENV = ("NSYS_PROFILING_SESSION_ID", "CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH")


class _Hooks(NamedTuple):
    profiler_enabled: Callable[[], bool]
    enter: Callable[[str, str | None], Any]
    exit: Callable[[Any], None]
    no_torch_function: Callable[[], Any]
    nvtx_push: Callable[[str], Any] | None
    nvtx_pop: Callable[[], Any] | None


def _nvtx_wanted() -> bool:
    """NVTX ranges on CUDA machines: ``$EP_TRACE_NVTX`` = 1 / 0 forces on / off, else on under nsys."""
    forced = os.environ.get("EP_TRACE_NVTX", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return any(os.environ.get(k) for k in _NSYS_ENV)


# Resolved once on first use (importing ep_trace must not import torch). A module slot rather than
# functools.cache: this is on the per-call path, and a global read is cheaper than a cached call.
_HOOKS: list[_Hooks] = []


def _hooks() -> _Hooks:
    """The torch entry points used per call, resolved lazily."""
    if _HOOKS:
        return _HOOKS[0]
    import torch

    # The same two ops torch.autograd.profiler.record_function.__enter__/__exit__ call (torch 2.x);
    # calling them directly skips record_function's object construction and CUPTI-monitor checks.
    enter = torch.ops.profiler._record_function_enter_new
    exit_op = torch.ops.profiler._record_function_exit._RecordFunction
    push = pop = None
    if torch.cuda.is_available() and _nvtx_wanted():
        push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    hooks = _Hooks(
        torch._C._autograd._profiler_enabled, enter, exit_op, torch._C.DisableTorchFunctionSubclass, push, pop
    )
    _HOOKS.append(hooks)
    return hooks


# The running CUPTI collector, if any: ep_trace.capture.cupti.collector.CuptiCollector.start() appends itself,
# stop() removes it. A module slot, so a stage() call costs one global read when none runs.
_CUPTI: list[Any] = []

# (stage, layer, microbatch, phase) -> range name. Bounded: cleared when it grows past _NAMES_MAX.
_NAMES: dict[tuple[str, int | None, int | None, str], str] = {}
_NAMES_MAX = 4096


def stage_name(name: str, layer: int | None = None, microbatch: int | None = None, phase: str = "fwd") -> str:
    """Cached :func:`~ep_trace.stage_names.format_stage_name` (raises ``ConfigError`` on bad input)."""
    key = (name, layer, microbatch, phase)
    out = _NAMES.get(key)
    if out is None:
        out = format_stage_name(name, layer, microbatch, phase)
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        _NAMES[key] = out
    return out


class stage:  # noqa: N801 - used like a function: `with stage("dispatch", layer=0):`
    """Context manager and decorator that records one ep-trace stage range.

    Args:
        name: Stage from :data:`ep_trace.stage_names.STAGES` (``route``, ``permute``, ``dispatch``,
            ``expert``, ``combine``, ``unpermute``, ``shared_expert``, ``attn``).
        layer: MoE layer index, or ``None``.
        microbatch: Micro-batch index, or ``None``.
        phase: ``"fwd"`` or ``"bwd"``.

    Raises:
        ConfigError: unknown stage or phase (raised at construction, profiler active or not).

    Example:
        >>> with stage("dispatch", layer=3):            # doctest: +SKIP
        ...     dist.all_to_all_single(out, inp, out_splits, in_splits)
        >>> @stage("expert", layer=0)                   # doctest: +SKIP
        ... def experts(x): ...
    """

    __slots__ = ("name", "_rec", "_nvtx")

    def __init__(self, name: str, layer: int | None = None, microbatch: int | None = None, phase: str = "fwd") -> None:
        # Inlined stage_name(): this constructor is the bulk of the cost when nothing is recording.
        self.name = _NAMES.get((name, layer, microbatch, phase)) or stage_name(name, layer, microbatch, phase)
        self._rec: Any = None
        self._nvtx = False

    def __enter__(self) -> stage:
        h = _HOOKS[0] if _HOOKS else _hooks()
        if h.profiler_enabled():
            self._rec = h.enter(self.name, None)
        if h.nvtx_push is not None:
            h.nvtx_push(self.name)
            self._nvtx = True
        if _CUPTI:  # CUPTI backend: CUDA calls inside carry this range's external correlation id
            _CUPTI[0].range_push(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        if _CUPTI:
            _CUPTI[0].range_pop()
        rec = self._rec
        if rec is not None:
            self._rec = None
            h = _HOOKS[0]
            # As record_function.__exit__ does: without this, passing the ScriptObject handle goes
            # through __torch_function__ dispatch, which more than doubles the cost (pytorch#76410).
            with h.no_torch_function():
                h.exit(rec)
        if self._nvtx:
            self._nvtx = False
            _HOOKS[0].nvtx_pop()  # type: ignore[misc]

    def __call__(self, func: F) -> F:
        """Decorate ``func`` so that every call runs inside a fresh range of this stage."""
        name = self.name

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # A fresh object per call: recursion and threads never share the open-range handle.
            s = stage.__new__(stage)
            s.name, s._rec, s._nvtx = name, None, False
            with s:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

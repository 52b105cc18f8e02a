"""Warm-up: one-time start-up before a rank's first device work, left out of its steady-state step.

A trace's first step pays for things that never recur: lazy CUDA / HIP initialisation inside the first
op (``torch.cuda._lazy_init``: context creation, module loading), first-call compilation
(``torch.compile``'s Dynamo / Inductor, Triton's JIT and its ``cuModuleLoadData``), the profiler's own
start-up. Counted in the step, the device "idles" hundreds of milliseconds waiting for a host that is
not slow, only starting. Rules, per rank, on its first step (after the windows of
:mod:`ep_trace.analysis.step_work`):

1. **Whole-trace step** (no step marker, no user range: :mod:`ep_trace.analysis.user_steps`): the
   step runs from the first device work to the end of the last; what precedes is warm-up, what
   follows tear-down.
2. **Slow lead**: with at least 3 training steps (not serving iterations, whose first may be a
   prefill), the first step's lead (its window's start to its first device work) beyond
   :data:`~ep_trace.analysis.steps.WARMUP_FACTOR` x the median lead of the rank's other steps: the
   excess is warm-up.
3. **Start-up calls**: the first step's lead holds a one-time start-up call (:data:`STARTUP_RE`: a
   Python frame of ``torch.cuda._lazy_init``, Dynamo's ``_compile``, Inductor's ``compile_fx``,
   Triton's ``compile``; a ``cuModuleLoad*`` / ``cuLibraryLoad*`` / ``hipModuleLoad*`` module load)
   of at least :data:`STARTUP_MIN_NS`: the lead up to the end of the last such call is warm-up
   (whatever the number of steps).

The warm-up is cut from the front of the step window (``start_ns`` moves, ``warmup_ns`` says by how
much) and never past the step's first device work; a note names it. Rules 2 and 3 cut only a lead of
at least :data:`MIN_SHARE` of the rank's median step (less is the steps' own noise).
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.steps import WARMUP_FACTOR

__all__ = ["MIN_SHARE", "STARTUP_MIN_NS", "STARTUP_RE", "trim_warmup"]

#: A start-up call counts from this length: torch calls ``_lazy_init`` before every CUDA call, a µs
#: no-op once initialised (72 of them, 0.6-2 µs each, in AMD-AGI/TraceLens' MI300X vLLM piecewise
#: trace); the first, real one takes hundreds of ms.
STARTUP_MIN_NS = 1_000_000

#: Rules 2 and 3 name a warm-up only from this share of the rank's median step length.
MIN_SHARE = 0.01

#: Host rows of one-time start-up. Python frames ("<file>(<line>): <function>", torch's Python tracer):
#: pytorch/pytorch torch/cuda/__init__.py ``_lazy_init``; torch/_dynamo/convert_frame.py ``_compile``;
#: torch/_inductor/compile_fx.py ``compile_fx``; triton-lang/triton python/triton/compiler/compiler.py
#: ``compile``. Module loads (CUDA driver API, HIP): a kernel's first launch loads its module
#: (Triton's driver calls cuModuleLoadData; CUDA 12 lazy loading cuLibraryLoadData).
STARTUP_RE = (
    r"(?:torch/cuda/__init__\.py\(\d+\): _lazy_init|torch/_dynamo/convert_frame\.py\(\d+\): _compile"
    r"|torch/_inductor/compile_fx\.py\(\d+\): compile_fx|triton/compiler/compiler\.py\(\d+\): compile)$"
    r"|^(?:cuModuleLoad\w*|cuLibraryLoad\w*|hipModuleLoad\w*)$"
)


def trim_warmup(windows: pl.DataFrame, act: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``windows`` (step windows) with each rank's warm-up cut from its first step (module rules).

    Args:
        windows: Step windows of the ranks of ``events`` (:func:`~ep_trace.analysis.step_work.device_windows`).
        act: Their device activity with ``step`` (:func:`~ep_trace.analysis.step_work.assign_activity`).
        events: Their canonical events (the start-up calls).

    Returns:
        ``windows`` plus ``warmup_ns`` (0 where none) and ``teardown_ns`` (whole-trace steps only);
        ``start_ns`` / ``end_ns`` trimmed.
    """
    if windows.is_empty():
        return windows.with_columns(pl.lit(0, pl.Int64).alias("warmup_ns"), pl.lit(0, pl.Int64).alias("teardown_ns"))
    work = (
        act.filter(pl.col("step").is_not_null())
        .group_by(pl.col("rank").cast(windows.schema["rank"]), "step")
        .agg(pl.col("start_ns").min().alias("_first"), pl.col("end_ns").max().alias("_last"))
    )
    w = windows.join(work, on=["rank", "step"], how="left").sort("rank", "start_ns", "step")
    lead = (pl.col("_first") - pl.col("start_ns")).clip(0)
    first = pl.int_range(pl.len()).over("rank") == 0
    others = pl.when(~first).then(lead).median().over("rank")
    # like the first-step rule of steps.select_steps: training steps, at least 3 of them (a serving
    # trace's first iteration may be a prefill whose host scheduling is longer, not start-up)
    repeat = (pl.len().over("rank") >= 3) & (pl.col("method") != "iteration")
    slow = pl.when(first & repeat & (lead > WARMUP_FACTOR * others)).then(lead - others).otherwise(0)
    startup = _startup_end(events, windows)
    w = w.join(startup, on="rank", how="left").with_columns(
        pl.when(first & (pl.col("_su") > pl.col("start_ns")))
        .then(pl.min_horizontal("_su", "_first") - pl.col("start_ns"))
        .otherwise(0)
        .alias("_calls")
    )
    whole = pl.col("method") == "whole_trace"
    found = pl.max_horizontal(slow.fill_null(0), pl.col("_calls").fill_null(0))
    # a lead within the steps' noise is no warm-up (sample_traces: ~1 ms of a 130-930 ms step)
    found = pl.when(found >= MIN_SHARE * (pl.col("end_ns") - pl.col("start_ns")).median().over("rank")).then(found)
    cut = pl.when(whole).then(lead).otherwise(found.fill_null(0))
    tail = pl.when(whole).then((pl.col("end_ns") - pl.col("_last")).clip(0)).otherwise(0)
    w = w.with_columns(
        cut.fill_null(0).cast(pl.Int64).alias("warmup_ns"), tail.fill_null(0).cast(pl.Int64).alias("teardown_ns")
    )
    w = w.with_columns(
        (pl.col("start_ns") + pl.col("warmup_ns")).alias("start_ns"),
        (pl.col("end_ns") - pl.col("teardown_ns")).alias("end_ns"),
    )
    return w.select(*windows.columns, "warmup_ns", "teardown_ns").sort("rank", "step")


def _startup_end(events: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per rank: the end of the last start-up call (:data:`STARTUP_RE`) before its first device work."""
    dev = events.filter(pl.col("kind").is_in(["gpu_kernel", "gpu_memcpy", "gpu_memset"]))
    first_dev = dev.group_by("rank").agg(pl.col("start_ns").min().alias("_fd"))
    # the length test first: the regex then runs on the few host rows of a millisecond or more
    long = events.filter(
        pl.col("kind").is_in(["python_frame", "runtime", "cpu_op", "cpu_annotation"])
        & (pl.col("end_ns") - pl.col("start_ns") >= STARTUP_MIN_NS)
    )
    calls = long.filter(pl.col("name").str.contains(STARTUP_RE)).select("rank", "start_ns", "end_ns")
    if calls.is_empty():
        return pl.DataFrame(schema={"rank": windows.schema["rank"], "_su": pl.Int64})
    return (
        calls.join(first_dev, on="rank", how="left")
        .filter(pl.col("_fd").is_null() | (pl.col("start_ns") < pl.col("_fd")))
        .group_by("rank")
        .agg(pl.col("end_ns").max().alias("_su"))
        .with_columns(pl.col("rank").cast(windows.schema["rank"]))
    )

"""Pass 1 of :func:`~ep_trace.analysis.engine.analyze`: the steps to analyse.

The first per-rank pass (:func:`~ep_trace.analysis.rank_pass.first_pass`) gives every step window;
this pass applies ``--steps`` or the default selection (:func:`~ep_trace.analysis.steps.select_steps`)
and says, in notes, what the windows are made of.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis import rank_pass
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.finding_common import fmt_ns, rank_list
from ep_trace.analysis.steps import select_steps
from ep_trace.errors import NothingToAnalyzeError
from ep_trace.schema import TraceTables

__all__ = ["StepPass", "step_pass"]


@dataclass(frozen=True)
class StepPass:
    """The analysed steps.

    Attributes:
        first: The first per-rank pass (every step's window, activity per step, mode, blocking calls).
        windows: The analysed ``(rank, step)`` windows (``step_windows`` columns).
        notes: What the windows are made of and which steps were left out.
    """

    first: rank_pass.FirstPass
    windows: pl.DataFrame
    notes: tuple[str, ...]


def step_pass(tables: TraceTables, blocks: rank_pass.Blocks, config: AnalysisConfig) -> StepPass:
    """Step windows of every rank, then the steps to analyse.

    Raises:
        NothingToAnalyzeError: no profiler step in ``config.steps``.
    """
    first = rank_pass.first_pass(tables, blocks, config.steps)
    windows = first.all_windows
    if config.steps is not None:
        windows = windows.filter(pl.col("step").is_between(config.steps[0], config.steps[1]))
    if windows.is_empty():
        assert config.steps is not None  # the unfiltered windows are never empty for a non-empty trace
        lo, hi = config.steps
        raise NothingToAnalyzeError(
            f"--steps {lo}:{hi}: no profiler step in that range; the trace has steps {_step_list(first.all_windows)}"
        )
    notes = _window_notes(windows, first.all_windows)
    if config.steps is None:
        windows, dropped = select_steps(windows, first.active_steps)
        notes += dropped
    return StepPass(first, windows, tuple(notes))


def _window_notes(windows: pl.DataFrame, all_windows: pl.DataFrame) -> list[str]:
    notes: list[str] = []
    if (windows["method"] == "whole_trace").any():
        notes.append(
            "some ranks have no ProfilerStep rows and no user range holding most of their device work: the whole "
            "trace (from the first device work to the end of the last) is analysed as step 0 there"
        )
    if (windows["method"] == "user_range").any():
        notes += _user_range_notes(windows)
    if (windows["method"] == "iteration").any():
        notes.append(
            "steps are the serving engine's iterations (vLLM execute_context_* ranges, SGLang step[...] ranges or "
            "Scheduler.run_batch frames, TensorRT-LLM _forward_step ranges; no ProfilerStep rows)"
        )
        notes += _iteration_count_note(all_windows)
    notes += _warmup_notes(windows)
    notes += _past_host_note(windows)
    return notes


def _user_range_notes(windows: pl.DataFrame) -> list[str]:
    per = (
        windows.filter(pl.col("method") == "user_range")
        .group_by("marker")
        .agg(pl.col("rank").unique().sort(), pl.len().alias("n"))
        .sort("marker")
    )
    return [
        f"ranks {rank_list(r['rank'])} have no ProfilerStep rows: their steps are the {r['n']} ranges "
        f"{r['marker']!r}, which hold most of their device work (docs/metrics.md, Steps; --steps 0 analyses the "
        "whole trace instead)"
        for r in per.iter_rows(named=True)
    ]


def _warmup_notes(windows: pl.DataFrame) -> list[str]:
    if "warmup_ns" not in windows.columns:
        return []
    w = windows.filter((pl.col("warmup_ns") > 0) | (pl.col("teardown_ns") > 0)).sort("rank", "step")
    out = []
    for r in w.iter_rows(named=True):
        parts = []
        if r["warmup_ns"] > 0:
            parts.append(
                f"{fmt_ns(r['warmup_ns'])} before its first device work is warm-up (one-time start-up: lazy CUDA / "
                "HIP init, first-call compilation, profiler start-up)"
            )
        if r["teardown_ns"] > 0:
            parts.append(f"{fmt_ns(r['teardown_ns'])} after its last is tear-down")
        what = " and ".join(parts)
        out.append(f"rank {r['rank']}, step {r['step']}: {what}; left out of the steady-state step")
    return out if len(out) <= 8 else [*out[:7], f"... warm-up cut on {len(out) - 7} more ranks"]


def _past_host_note(windows: pl.DataFrame) -> list[str]:
    """How far device work launched in a step ran past its host range (the step window's end)."""
    past = windows.select((pl.col("end_ns") - pl.col("host_end_ns")).clip(0).alias("_p"), "rank", "step")
    worst = past.sort("_p", descending=True).head(1)
    if worst.is_empty() or int(worst["_p"][0]) <= 0:
        return []
    n = int((past["_p"] > 0).sum())
    r = worst.row(0, named=True)
    return [
        f"device work launched in {n} of {windows.height} (rank, step) host ranges ran past their end (at most "
        f"{fmt_ns(r['_p'])}, rank {r['rank']} step {r['step']}): each step's window runs to the end of the work it "
        "launched, and work launched while the previous step's still ran starts when that ends (docs/metrics.md, Steps)"
    ]


def _iteration_count_note(windows: pl.DataFrame) -> list[str]:
    """A note when ranks hold different numbers of serving iterations: steps are paired by number.

    vLLM runs ``execute_dummy_batch`` on an idle data-parallel rank (to keep the EP all-to-alls in
    step) without ``annotate_profile`` (vllm/v1/worker/gpu_worker.py), so such a rank has fewer
    iteration ranges than the busy ones, and its step N is not theirs. With Python frames in the trace
    (vLLM's default) the dummy batches are steps (``parsers/serving_steps.py``) and the counts agree;
    this note is for traces taken with ``with_stack`` off.
    """
    it = windows.filter(pl.col("method") == "iteration").group_by("rank").agg(pl.len().alias("n")).sort("rank")
    if it.height < 2 or it["n"].n_unique() == 1:
        return []
    lo, hi = it.row(int(it["n"].arg_min() or 0), named=True), it.row(int(it["n"].arg_max() or 0), named=True)
    return [
        f"ranks hold different numbers of serving iterations (rank {lo['rank']}: {lo['n']}, rank {hi['rank']}: "
        f"{hi['n']}; vLLM's idle data-parallel ranks run unannotated dummy batches, seen only with Python "
        "frames in the trace, i.e. with_stack on): steps are paired across "
        "ranks by number, so cross-rank per-step figures can pair different iterations (collectives with a "
        "sequence number are still matched call by call, others by their order in the step)"
    ]


def _step_list(windows: pl.DataFrame, limit: int = 12) -> str:
    """``'0-3'`` / ``'0, 2, 5'`` / ``'0, 1, ... 99 (100 steps)'``: the steps present, for an error line."""
    steps = sorted(int(s) for s in windows["step"].unique())
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}-{steps[-1]} (choose FIRST:LAST within them)"
    if len(steps) > limit:
        shown = ", ".join(map(str, steps[: limit - 1])) + f", ... {steps[-1]} ({len(steps)} steps)"
    else:
        shown = ", ".join(map(str, steps))
    return f"{shown} (choose FIRST:LAST within them)"

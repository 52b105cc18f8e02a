"""Steps of serving traces: per-iteration annotations where the profiler wrote no ``ProfilerStep``.

torch.profiler writes ``ProfilerStep#N`` only when the caller runs ``profiler.step()``; training
loops do (torchtitan, Megatron-LM, Lightning), serving engines do not. vLLM's worker profiler
(``vllm/profiler/wrapper.py``: ``torch.profiler.profile(...)`` started and stopped around the
requests, its own ``WorkerProfiler.step()`` only counts iterations) annotates every model iteration
instead: ``Worker.annotate_profile`` (``vllm/v1/worker/gpu_worker.py``) wraps each
``execute_model`` in ``record_function`` (torch profiler) or ``torch.cuda.nvtx.range`` (``cuda``
profiler, for Nsight) named from the scheduler's batch::

    execute_context_<ctx requests>(<ctx tokens>)_generation_<gen requests>(<gen tokens>)

(some vLLM versions and forks write more figures inside the parentheses: ``(sq12sk4096...)``).
Without steps the whole trace would be one step; with them a serving trace gets per-iteration
figures, P50 / P99 over iterations and the warm-up rule, like a training trace.

Rule: on a rank whose events hold no ``ProfilerStep#N`` row, the annotation rows matching
:data:`ITERATION_MARKERS` become its steps: ``seq`` = 1, 2, ... in start order, numbered per (rank,
kind) so that the host range and its GPU copy (Kineto's ``gpu_user_annotation``) of one iteration
get the same number, as ``ProfilerStep`` rows do. A rank with ``ProfilerStep`` rows keeps them only.
"""

from __future__ import annotations

import polars as pl

__all__ = ["ITERATION_MARKERS", "with_iteration_steps"]

#: Per-iteration range names of serving engines (regexes, anchored), with their source.
ITERATION_MARKERS: dict[str, str] = {
    # vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.annotate_profile
    "vllm": r"^execute_context_\d+\([^)]*\)_generation_\d+\([^)]*\)$",
}
_PATTERN = "|".join(f"(?:{p})" for p in ITERATION_MARKERS.values())
_PREFIXES = ("execute_context_",)  # a literal test first: the regex runs on those rows only
_KINDS = ("cpu_annotation", "gpu_annotation")


def with_iteration_steps(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with ``seq`` set on the iteration annotations of ranks that have no ``ProfilerStep``.

    Args:
        events: Canonical events of one or more ranks (``rank``, ``kind``, ``name``, ``start_ns``, ``seq``).

    Returns:
        The same rows in the same order; unchanged when no rank qualifies (the common case costs one
        ``starts_with`` over the annotation rows).
    """
    if events.is_empty() or "seq" not in events.columns:
        return events
    # a literal prefix test on the annotation rows first: the regex and the rest run on those only
    starts = pl.any_horizontal(*[pl.col("name").str.starts_with(p) for p in _PREFIXES])
    cand = events.select((pl.col("kind").is_in(_KINDS) & starts).fill_null(False)).to_series()
    if not cand.any():
        return events
    stepped = events.filter(pl.col("seq").is_not_null()).get_column("rank").unique()
    rows = (
        events.with_row_index("_row")
        .filter(cand)
        .filter(~pl.col("rank").is_in(stepped.implode()) & pl.col("name").str.contains(_PATTERN))
        .select("_row", "rank", "kind", "start_ns")
    )
    if rows.is_empty():
        return events
    numbered = rows.sort("rank", "kind", "start_ns", "_row").with_columns(
        (pl.int_range(pl.len()).over("rank", "kind") + 1).cast(pl.Int64).alias("_seq")
    )
    seq = events.get_column("seq").cast(pl.Int64).scatter(numbered["_row"], numbered["_seq"])
    return events.with_columns(seq.alias("seq").cast(events.schema["seq"]))

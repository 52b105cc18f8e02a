"""Step windows: one row per (rank, step) from the ``ProfilerStep#N`` rows (``events.seq``), or
from a serving engine's per-iteration annotations where ingest numbered them (``seq`` too).

A trace without ``ProfilerStep`` rows on a rank gets one whole-trace step ``0`` spanning its
events, and the caller is told (``method`` column) so the report can say so.
"""

from __future__ import annotations

import polars as pl

__all__ = ["step_windows", "assign_step"]


def step_windows(events: pl.DataFrame, steps: tuple[int, int] | None = None) -> pl.DataFrame:
    """Per (rank, step) host window of the profiler step.

    Args:
        events: Canonical events table.
        steps: Inclusive ``(first, last)`` step filter; ``None`` keeps all.

    Returns:
        Columns ``rank, step, start_ns, end_ns, tid, method`` (``method`` is ``'profiler_step'``,
        ``'iteration'`` (a serving engine's per-iteration annotation, e.g. vLLM's
        ``execute_context_...``: :mod:`ep_trace.parsers.serving_steps`) or ``'whole_trace'``). When a
        rank has duplicate rows for one step (a CPU and a GPU copy of the annotation) the host one
        (``cpu_*`` kinds first) wins.
    """
    prof = (
        events.filter(pl.col("seq").is_not_null())
        .with_columns(pl.col("kind").is_in(["gpu_annotation"]).alias("_dev"))
        .sort(["rank", "seq", "_dev", "start_ns"])
        .unique(["rank", "seq"], keep="first", maintain_order=True)
        .select(
            "rank",
            pl.col("seq").alias("step"),
            "start_ns",
            "end_ns",
            "tid",
            # serving traces: per-iteration annotations numbered at ingest (parsers/serving_steps.py)
            pl.when(pl.col("name").str.starts_with("ProfilerStep#"))
            .then(pl.lit("profiler_step"))
            .otherwise(pl.lit("iteration"))
            .alias("method"),
        )
    )
    have = prof["rank"].unique()
    whole = (
        events.filter(~pl.col("rank").is_in(have.implode()))
        .group_by("rank")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .select(
            "rank",
            pl.lit(0, pl.Int64).alias("step"),
            "start_ns",
            "end_ns",
            pl.lit(None, pl.Int64).alias("tid"),
            pl.lit("whole_trace").alias("method"),
        )
    )
    out = pl.concat([prof, whole]).sort(["rank", "step"])
    if steps is not None:
        out = out.filter(pl.col("step").is_between(steps[0], steps[1]))
    return out


def assign_step(df: pl.DataFrame, windows: pl.DataFrame, at: str, out: str = "step") -> pl.DataFrame:
    """Give each row the step whose host window contains ``df[at]`` (null when none does).

    Args:
        df: Frame with ``rank`` and the time column ``at`` (epoch ns).
        windows: Output of :func:`step_windows`.
        at: Name of the time column used (a launch time, a host start).
        out: Name of the added step column.
    """
    w = windows.select(
        "rank", pl.col("step").alias(out), pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we")
    ).sort("_ws")
    has_t = df.filter(pl.col(at).is_not_null()).sort(at)
    no_t = df.filter(pl.col(at).is_null()).with_columns(pl.lit(None, pl.Int64).alias(out))
    joined = has_t.join_asof(w, left_on=at, right_on="_ws", by="rank", strategy="backward", check_sortedness=False)
    joined = joined.with_columns(
        pl.when(pl.col(at) <= pl.col("_we")).then(pl.col(out)).otherwise(None).alias(out)
    ).drop(["_ws", "_we"])
    return pl.concat([joined, no_t.select(joined.columns)], how="vertical_relaxed")


#: A first step longer than this multiple of the median of the other steps is warm-up.
WARMUP_FACTOR = 1.5


def select_steps(windows: pl.DataFrame, active_steps: pl.Series) -> tuple[pl.DataFrame, list[str]]:
    """The default step selection (only when ``--steps`` is not given; ``--steps`` overrides it).

    Rules, in order: trailing steps with no device / compute activity on any rank are dropped (a
    profiler schedule's last, empty ``ProfilerStep``); with at least 3 steps left, a first step
    longer than :data:`WARMUP_FACTOR` x the median of the other steps (median over ranks per step)
    is warm-up (allocator growth, lazy init, first-call autotuning) and dropped; not on a serving
    trace's iterations (``method`` ``'iteration'``), where a long first one is a prefill.

    Args:
        windows: :func:`step_windows` output.
        active_steps: Steps that hold activity on some rank.

    Returns:
        ``(windows, notes)``: the kept windows and one note per rule that dropped a step.
    """
    notes: list[str] = []
    steps = sorted(int(s) for s in windows["step"].unique())
    active = {int(s) for s in active_steps.drop_nulls()}
    while len(steps) > 1 and steps[-1] not in active:
        notes.append(
            f"step {steps[-1]} holds no activity on any rank (empty trailing step): left out (--steps overrides)"
        )
        steps.pop()
    # a serving trace's first iteration is often a prefill, longer than the decodes after it by the
    # work it does, not warm-up: the rule is for training steps, which repeat the same work
    serving = bool((windows["method"] == "iteration").any())
    if len(steps) >= 3 and not serving:
        per = (
            windows.filter(pl.col("step").is_in(steps))
            .group_by("step")
            .agg((pl.col("end_ns") - pl.col("start_ns")).median().alias("_t"))
            .sort("step")
        )
        first, rest = float(per["_t"][0]), per["_t"][1:]
        med = float(rest.median() or 0.0)  # type: ignore[arg-type]  # a numeric column
        if med > 0 and first > WARMUP_FACTOR * med:
            notes.append(
                f"step {steps[0]} is warm-up ({first / med:.3g}x the median of the other steps): left out "
                "(--steps overrides)"
            )
            steps = steps[1:]
    return windows.filter(pl.col("step").is_in(steps)), notes

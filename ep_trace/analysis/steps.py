"""Step windows: one row per (rank, step) from the ``ProfilerStep#N`` rows (``events.seq``), or
from a serving engine's per-iteration annotations where ingest numbered them (``seq`` too).

A trace without ``ProfilerStep`` rows on a rank gets one whole-trace step ``0`` spanning its
events, and the caller is told (``method`` column) so the report can say so.

Each window has two spans: the **host range** of its marker (``host_start_ns, host_end_ns``: the
range in which the step *launched* its work; device work is assigned by launch time inside it) and
the **step window** (``start_ns, end_ns``), which :mod:`ep_trace.analysis.step_work` widens to the end
of the device work the step launched. Here both start as the host range; the GPU copy of the marker
(Kineto's ``gpu_user_annotation`` of the same step: a ``ProfilerStep#N``, vLLM's
``execute_context_...`` or SGLang's ``step[DECODE bs=16]`` range) is kept as the step's device
envelope (``env_start_ns, env_end_ns``; null without one).
"""

from __future__ import annotations

import polars as pl

__all__ = ["step_windows", "assign_step", "select_steps", "phase_expr", "phase_table", "PHASES"]

#: Serving iteration phases (``phase`` column; null where the trace does not say).
PHASES = ("prefill", "decode", "mixed", "idle")

# SGLang's per-forward range, step[<ForwardMode name> bs=<n>...] (python/sglang/srt/utils/profile_utils.py
# build_step_span_name: "step[EXTEND bs=.. toks=..]" or f"step[{mode.name} bs={bs}]"; ForwardMode in
# python/sglang/srt/model_executor/forward_batch_info.py): EXTEND is a prefill (chunked or not), DECODE
# and TARGET_VERIFY (speculative decoding's verify pass) decode, MIXED a chunked prefill batched with
# decodes, IDLE an attention-DP rank without requests that still joins the MoE all-to-alls
_SGLANG_MODE = r"^step\[([A-Z_]+) bs=\d+"
_SGLANG_PHASE = {"EXTEND": "prefill", "DECODE": "decode", "TARGET_VERIFY": "decode", "MIXED": "mixed", "IDLE": "idle"}
# vLLM's execute_context_<ctx requests>(<ctx tokens>)_generation_<gen requests>(<gen tokens>)
# (vllm/v1/worker/gpu_worker.py Worker.annotate_profile): context requests are prefills, generation
# requests decodes; both in one batch is a mixed (chunked-prefill) iteration
# (and its detailed variant execute_<tokens>_context_<n>(...)_generation_<m>(...), AMD-AGI/TraceLens
# TraceLens/TraceUtils/annotation_utils.py); ROCm/ATOM's prefill[...] / decode[...] say it outright
_VLLM_COUNTS = r"^execute_(?:\d+_)?context_(\d+)\([^)]*\)_generation_(\d+)\("
_ATOM = r"^(prefill|decode)\[bs="


def phase_expr(name: pl.Expr) -> pl.Expr:
    """``prefill`` / ``decode`` / ``mixed`` / ``idle`` of a serving iteration from its marker's name,
    null where the name does not say (ProfilerStep, frames, TensorRT-LLM's ``_forward_step``, the
    first vLLM V1 ``execute_new_<n>_cached_<m>`` ranges: a cached request may still be prefilling).
    vLLM's ``execute_dummy_batch`` frame (an idle data-parallel rank's forward) is ``idle``."""
    mode = name.str.extract(_SGLANG_MODE, 1).replace_strict(_SGLANG_PHASE, default=None, return_dtype=pl.Utf8)
    ctx = name.str.extract(_VLLM_COUNTS, 1).cast(pl.Int64)
    gen = name.str.extract(_VLLM_COUNTS, 2).cast(pl.Int64)
    vllm = (
        pl.when((ctx > 0) & (gen > 0))
        .then(pl.lit("mixed"))
        .when(ctx > 0)
        .then(pl.lit("prefill"))
        .when(gen > 0)
        .then(pl.lit("decode"))
        .when(ctx.is_not_null())
        .then(pl.lit("idle"))
    )
    dummy = pl.when(name.str.ends_with("): execute_dummy_batch")).then(pl.lit("idle"))
    return pl.coalesce(mode, vllm, name.str.extract(_ATOM, 1), dummy)


def step_windows(events: pl.DataFrame, steps: tuple[int, int] | None = None) -> pl.DataFrame:
    """Per (rank, step) host window of the profiler step (the step window starts as the host range).

    Args:
        events: Canonical events table.
        steps: Inclusive ``(first, last)`` step filter; ``None`` keeps all.

    Returns:
        Columns ``rank, step, start_ns, end_ns, host_start_ns, host_end_ns, env_start_ns, env_end_ns,
        tid, method, phase, marker`` (``method`` is ``'profiler_step'``, ``'iteration'`` (a serving
        engine's per-iteration annotation, e.g. vLLM's ``execute_context_...``:
        :mod:`ep_trace.parsers.serving_steps`) or ``'whole_trace'`` (:mod:`ep_trace.analysis.user_steps`
        adds ``'user_range'``); ``phase``: :func:`phase_expr`; ``marker``: the marker row's name).
        When a rank has duplicate rows for one step (a CPU and a GPU copy of the annotation) the host
        one (``cpu_*`` kinds first) is the host range and the GPU copies make the envelope.
    """
    marked = events.filter(pl.col("seq").is_not_null()).with_columns(
        pl.col("kind").is_in(["gpu_annotation"]).alias("_dev")
    )
    env = (
        marked.filter(pl.col("_dev"))
        .group_by("rank", "seq")
        .agg(pl.col("start_ns").min().alias("env_start_ns"), pl.col("end_ns").max().alias("env_end_ns"))
    )
    prof = (
        marked.sort(["rank", "seq", "_dev", "start_ns"])
        .unique(["rank", "seq"], keep="first", maintain_order=True)
        .join(env, on=["rank", "seq"], how="left")
        .select(
            "rank",
            pl.col("seq").alias("step"),
            "start_ns",
            "end_ns",
            pl.col("start_ns").alias("host_start_ns"),
            pl.col("end_ns").alias("host_end_ns"),
            # a GPU copy without its host row (the host range fell outside the trace) is no envelope
            pl.when(~pl.col("_dev")).then(pl.col("env_start_ns")).alias("env_start_ns"),
            pl.when(~pl.col("_dev")).then(pl.col("env_end_ns")).alias("env_end_ns"),
            "tid",
            # serving traces: per-iteration annotations numbered at ingest (parsers/serving_steps.py)
            pl.when(pl.col("name").str.starts_with("ProfilerStep#"))
            .then(pl.lit("profiler_step"))
            .otherwise(pl.lit("iteration"))
            .alias("method"),
            phase_expr(pl.col("name")).alias("phase"),
            pl.col("name").alias("marker"),
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
            pl.col("start_ns").alias("host_start_ns"),
            pl.col("end_ns").alias("host_end_ns"),
            pl.lit(None, pl.Int64).alias("env_start_ns"),
            pl.lit(None, pl.Int64).alias("env_end_ns"),
            pl.lit(None, pl.Int64).alias("tid"),
            pl.lit("whole_trace").alias("method"),
            pl.lit(None, pl.Utf8).alias("phase"),
            pl.lit(None, pl.Utf8).alias("marker"),
        )
    )
    out = pl.concat([prof, whole], how="vertical_relaxed").sort(["rank", "step"])
    if steps is not None:
        out = out.filter(pl.col("step").is_between(steps[0], steps[1]))
    return out


def assign_step(
    df: pl.DataFrame, windows: pl.DataFrame, at: str, out: str = "step", span: str = "host"
) -> pl.DataFrame:
    """Give each row the step whose window contains ``df[at]`` (null when none does).

    Args:
        df: Frame with ``rank`` and the time column ``at`` (epoch ns).
        windows: Output of :func:`step_windows` (or any frame with ``rank, step, start_ns, end_ns``).
        at: Name of the time column used (a launch time, a host start).
        out: Name of the added step column.
        span: ``'host'``: the host range (``host_start_ns, host_end_ns`` where the frame has them):
            for host times (a launch, a host range's start); ``'step'``: the step window
            (``start_ns, end_ns``): for device times without a launch. Where windows overlap (an
            overlap scheduler's device work), the latest-starting window containing the time wins.
    """
    lo, hi = (
        ("host_start_ns", "host_end_ns")
        if span == "host" and "host_start_ns" in windows.columns
        else ("start_ns", "end_ns")
    )
    w = windows.select("rank", pl.col("step").alias(out), pl.col(lo).alias("_ws"), pl.col(hi).alias("_we")).sort("_ws")
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


def phase_table(steps: pl.DataFrame) -> pl.DataFrame:
    """Per serving phase (prefill / decode / mixed / idle: :func:`phase_expr`), the step figures kept
    apart: a prefill and a decode are different EP workloads (tokens per all-to-all differ by orders of
    magnitude), so a P50 over both describes neither.

    Args:
        steps: ``Analysis.steps`` (one row per rank and step, with ``phase``).

    Returns:
        Columns ``phase, n_steps`` (distinct steps), ``step_time_p50_ns, step_time_max_ns,
        compute_p50_ns, comm_p50_ns, exposed_comm_p50_ns`` (P50 / max over the phase's (rank, step)
        rows, ns), ``busy_share_p50`` (P50 of (compute + comm - overlap) / step time); one row per
        phase present, none when no step has a phase.
    """
    if "phase" not in steps.columns or steps["phase"].null_count() == steps.height:
        return pl.DataFrame(schema={"phase": pl.Utf8, "n_steps": pl.UInt32})
    busy = (pl.col("compute_ns") + pl.col("comm_ns") - pl.col("overlapped_ns")) / pl.col("step_time_ns")
    return (
        steps.filter(pl.col("phase").is_not_null())
        .group_by("phase")
        .agg(
            pl.col("step").n_unique().alias("n_steps"),
            pl.col("step_time_ns").median().round(0).cast(pl.Int64).alias("step_time_p50_ns"),
            pl.col("step_time_ns").max().alias("step_time_max_ns"),
            pl.col("compute_ns").median().round(0).cast(pl.Int64).alias("compute_p50_ns"),
            pl.col("comm_ns").median().round(0).cast(pl.Int64).alias("comm_p50_ns"),
            pl.col("exposed_comm_ns").median().round(0).cast(pl.Int64).alias("exposed_comm_p50_ns"),
            busy.filter(pl.col("step_time_ns") > 0).median().round(4).alias("busy_share_p50"),
        )
        .with_columns(pl.col("phase").replace_strict(PHASES, list(range(len(PHASES))), default=9).alias("_o"))
        .sort("_o")
        .drop("_o")
    )

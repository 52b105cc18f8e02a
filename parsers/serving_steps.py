"""Steps of serving traces: per-iteration annotations where the profiler wrote no ``ProfilerStep``.

torch.profiler writes ``ProfilerStep#N`` only when the caller runs ``profiler.step()``; training
loops do (torchtitan, Megatron-LM, Lightning), serving engines do not. vLLM's worker profiler
(``vllm/profiler/wrapper.py``: ``torch.profiler.profile(...)`` started and stopped around the
requests, its own ``WorkerProfiler.step()`` only counts iterations) annotates every model iteration
instead: ``Worker.annotate_profile`` (``vllm/v1/worker/gpu_worker.py``) wraps each
``execute_model`` in ``record_function`` (torch profiler) or ``torch.cuda.nvtx.range`` (``cuda``
profiler, for Nsight) named from the scheduler's batch::

    execute_context_<ctx requests>(<ctx tokens>)_generation_<gen requests>(<gen tokens>)

(some vLLM versions and forks write more figures inside the parentheses: ``(sq12sk4096...)``; the
first V1 releases wrote ``execute_new_<new requests>_cached_<cached requests>``; the V1 releases
before them and V0 wrote no range at all). vLLM's profiler records Python frames by default
(``with_stack`` True: ``VLLM_TORCH_PROFILER_WITH_STACK``, later ``ProfilerConfig.torch_profiler_with_stack``),
so the worker's own frames mark its iterations too: ``Worker.execute_model`` once per scheduled batch,
and ``Worker.execute_dummy_batch`` once per iteration of an idle data-parallel rank
(``DPEngineCoreProc.run_busy_loop``, vllm/v1/engine/core.py: a rank without requests runs a dummy
forward while other ranks have work, to take part in the MoE all-to-alls). The annotation does not
wrap the dummy batch, so such a rank's frames, not its annotations, are its steps.
SGLang wraps each model forward in ``record_function("step[DECODE bs=16]")`` (the forward mode and
batch size; Kineto writes its GPU copy over the kernels it launched, CUDA-graph replays included);
releases before that wrote no iteration range, but their profiler records Python frames by default,
and ``Scheduler.run_batch`` runs once per iteration: its frame is the step there. TensorRT-LLM's
PyTorch backend marks each engine forward with the NVTX range ``_forward_step`` (Nsight traces).
Without steps the whole trace would be one step; with them a serving trace gets per-iteration
figures, P50 / P99 over iterations and the warm-up rule, like a training trace.

Rule: on a rank whose events hold no ``ProfilerStep#N`` row, the annotation rows matching
:data:`ITERATION_MARKERS` become its steps: ``seq`` = 1, 2, ... in start order, numbered per (rank,
kind) so that the host range and its GPU copy (Kineto's ``gpu_user_annotation``) of one iteration
get the same number, as ``ProfilerStep`` rows do. A rank with ``ProfilerStep`` rows keeps them only.
The frames (:data:`FRAME_MARKERS`: vLLM's worker, SGLang's ``run_batch``) are a rank's steps instead
when it has no annotation marker (the releases without one) or when it ran a vLLM dummy batch (its
annotations miss those iterations); a frame nested in another marker frame of its thread is not a
step of its own.
"""

from __future__ import annotations

import polars as pl

__all__ = ["FRAME_MARKERS", "ITERATION_MARKERS", "with_iteration_steps"]

#: Per-iteration rows of serving engines: ``name -> (regex, literal the name contains, event kinds)``.
ITERATION_MARKERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.annotate_profile (record_function or NVTX,
    # Kineto also writes the GPU copy of the range)
    # (the detailed variant some builds write, with the batch's token count first and the roofline sums
    # inside the parentheses: "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785...)",
    # AMD-AGI/TraceLens TraceLens/TraceUtils/annotation_utils.py VLLM_DETAILED_PATTERN; seen in its
    # MI300X vLLM and SGLang traces, tests/traces/inference/)
    "vllm": (
        r"^execute_(?:\d+_)?context_\d+\([^)]*\)_generation_\d+\([^)]*\)$",
        "execute_",
        ("cpu_annotation", "gpu_annotation"),
    ),
    # the same method in the first vLLM V1 releases named the range from the scheduler's new and
    # cached requests: f"execute_new_{num_new}_cached_{num_cached}" (vllm/v1/worker/gpu_worker.py)
    "vllm_v1_early": (r"^execute_new_\d+_cached_\d+$", "execute_new_", ("cpu_annotation", "gpu_annotation")),
    # sgl-project/sglang ModelRunner.forward wraps every forward in record_function(build_step_span_name(...))
    # (python/sglang/srt/model_executor/model_runner.py, python/sglang/srt/utils/profile_utils.py):
    # "step[DECODE bs=32]", "step[EXTEND bs=4 toks=2048]", "step[MIXED bs=..]", "step[TARGET_VERIFY bs=..]",
    # detailed annotations append figures inside the brackets; a draft worker's forward is
    # "draft step[...]", not an iteration of its own (the regex is anchored)
    "sglang_step": (r"^step\[[A-Z_]+ bs=\d+[^\]]*\]$", "step[", ("cpu_annotation", "gpu_annotation")),
    # ROCm/ATOM (AMD's inference engine) names each forward "prefill[bs=2 tok=14721 ctx=[7803, 6918]]" or
    # "decode[bs=64 tok=64 d=64]" (AMD-AGI/TraceLens TraceLens/TraceUtils/annotation_utils.py ATOM_NATIVE_PATTERN)
    "atom": (r"^(?:prefill|decode)\[bs=[^\]]*(?:\][^\]]*)?\]$", "[bs=", ("cpu_annotation", "gpu_annotation")),
    # NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/model_engine.py: @nvtx_range("_forward_step") on
    # the engine's forward, once per iteration (an NVTX range: Nsight traces; its torch profiler,
    # py_executor.py _profiler, neither steps nor records NVTX). A speculative-decoding draft engine's
    # forward is one more range per iteration.
    "trtllm": (r"^_forward_step$", "_forward_step", ("cpu_annotation",)),
}

#: Worker / scheduler frames (Python tracer, kind python_frame): steps where the annotations are missing
#: or incomplete (see the module rule). vllm-project/vllm vllm/v1/worker/gpu_worker.py ``Worker.execute_model``
#: / ``Worker.execute_dummy_batch``; V0: vllm/worker/worker_base.py ``LocalOrDistributedWorkerBase.execute_model``.
FRAME_MARKERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "vllm_worker": (
        r"vllm/v1/worker/gpu_worker\.py\(\d+\): (?:execute_model|execute_dummy_batch)$",
        "gpu_worker.py(",
        ("python_frame",),
    ),
    "vllm_v0_worker": (r"vllm/worker/worker_base\.py\(\d+\): execute_model$", "worker_base.py(", ("python_frame",)),
    # sgl-project/sglang python/sglang/srt/managers/scheduler.py: event_loop_normal / event_loop_overlap
    # call Scheduler.run_batch once per iteration; SGLang's profiler records Python frames by default
    # (scheduler_profiler_mixin.py: with_stack True), which torch's Python tracer names
    # "<co_filename>(<line>): <function>" (torch/csrc/autograd/profiler_python.cpp), kind python_frame
    # here: the steps of SGLang releases before the step[...] range
    "sglang": (r"sglang/srt/managers/scheduler\.py\(\d+\): run_batch$", "scheduler.py(", ("python_frame",)),
}

_DUMMY = "): execute_dummy_batch"
_ALL = {**ITERATION_MARKERS, **FRAME_MARKERS}


def _candidates(events: pl.DataFrame) -> pl.Series:
    """Rows that may be markers: a literal test per marker on the rows of its kinds (the regexes run
    on the candidates only)."""
    kind, name = events.get_column("kind"), events.get_column("name")
    cand = pl.repeat(False, events.height, eager=True)
    rows_of: dict[tuple[str, ...], pl.Series] = {}  # the two vLLM markers share their kinds: one pass
    for _, lit, kinds in _ALL.values():
        if kinds not in rows_of:
            rows_of[kinds] = kind.is_in(kinds).arg_true()  # the literal test on those rows only
        rows = rows_of[kinds]
        hit = rows.filter(name.gather(rows).str.contains(lit, literal=True).fill_null(False))
        if hit.len():
            cand = cand.scatter(hit, True)
    return cand


def _is_marker(markers: dict[str, tuple[str, str, tuple[str, ...]]]) -> pl.Expr:
    return pl.any_horizontal(
        *[pl.col("kind").is_in(kinds) & pl.col("name").str.contains(rx) for rx, _, kinds in markers.values()]
    )


def _outermost(frames: pl.DataFrame) -> pl.DataFrame:
    """Frames not nested in an earlier marker frame of the same (rank, thread): a V0 speculative
    decoding worker calls its scorer's ``execute_model`` inside its own."""
    if frames.height < 2 or "end_ns" not in frames.columns:
        return frames
    by = ["rank", "tid"] if "tid" in frames.columns else ["rank"]
    prev_end = pl.col("end_ns").cum_max().shift(1).over(by)
    return frames.sort([*by, "start_ns", "_row"]).filter(prev_end.is_null() | (pl.col("start_ns") >= prev_end))


def _one_family(rows: pl.DataFrame) -> pl.DataFrame:
    """Each rank's annotation markers of one family only, the first of :data:`ITERATION_MARKERS` present:
    a build may write two per forward (AMD's MI300X SGLang traces hold vLLM's detailed
    ``execute_..._context_...`` range around SGLang's ``step[DECODE bs=32]``), which would number
    the iterations twice."""
    fam = pl.lit(None, pl.Int32)
    for i, (rx, _, kinds) in reversed(list(enumerate(ITERATION_MARKERS.values()))):
        fam = (
            pl.when(pl.col("kind").is_in(kinds) & pl.col("name").str.contains(rx))
            .then(pl.lit(i, pl.Int32))
            .otherwise(fam)
        )
    rows = rows.with_columns(fam.alias("_fam"))
    first = pl.col("_fam").min().over("rank")
    return rows.filter(pl.col("_fam").is_null() | (pl.col("_fam") == first)).drop("_fam")


def _per_rank_choice(rows: pl.DataFrame) -> pl.DataFrame:
    """Keep each rank's frame markers or its annotation markers (the module rule), never both."""
    rows = _one_family(rows)
    frame = rows.filter(pl.col("_frame"))
    if frame.is_empty():
        return rows
    per = rows.group_by("rank").agg(
        (~pl.col("_frame")).any().alias("_ann"),
        (pl.col("_frame") & pl.col("name").str.ends_with(_DUMMY)).any().alias("_dummy"),
    )
    use_frames = per.filter(~pl.col("_ann") | pl.col("_dummy"))["rank"]
    ann = rows.filter(~pl.col("_frame") & ~pl.col("rank").is_in(use_frames.implode()))
    fr = _outermost(frame.filter(pl.col("rank").is_in(use_frames.implode())))
    return pl.concat([ann, fr.select(ann.columns)])


def with_iteration_steps(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with ``seq`` set on the iteration annotations of ranks that have no ``ProfilerStep``.

    Args:
        events: Canonical events of one or more ranks (``rank``, ``kind``, ``name``, ``start_ns``, ``seq``).

    Returns:
        The same rows in the same order; unchanged when no rank qualifies (the common case costs one
        literal ``contains`` per marker over the rows of its kinds).
    """
    if events.is_empty() or "seq" not in events.columns:
        return events
    cand = _candidates(events)
    if not cand.any():
        return events
    stepped = events.filter(pl.col("seq").is_not_null()).get_column("rank").unique()
    extra = [c for c in ("tid", "end_ns") if c in events.columns]
    rows = (
        events.with_row_index("_row")
        .filter(cand)
        .filter(~pl.col("rank").is_in(stepped.implode()) & _is_marker(_ALL))
        .select("_row", "rank", "kind", "name", "start_ns", *extra)
        .with_columns(_is_marker(FRAME_MARKERS).alias("_frame"))
    )
    if rows.is_empty():
        return events
    rows = _per_rank_choice(rows)
    numbered = rows.sort("rank", "kind", "start_ns", "_row").with_columns(
        (pl.int_range(pl.len()).over("rank", "kind") + 1).cast(pl.Int64).alias("_seq")
    )
    seq = events.get_column("seq").cast(pl.Int64).scatter(numbered["_row"], numbered["_seq"])
    return events.with_columns(seq.alias("seq").cast(events.schema["seq"]))

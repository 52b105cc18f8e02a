"""Serving traces without ProfilerStep: vLLM's per-iteration annotations become the steps."""

from __future__ import annotations

import polars as pl

import ep_trace
from ep_trace.parsers.serving_steps import with_iteration_steps


def _vllm_iteration(kt, ts: float, name: str, ext: int, corr: int, kernel_us: float) -> list[dict]:
    """vLLM's Worker.annotate_profile range (host + its GPU copy) around one kernel launch."""
    return [
        kt.x("user_annotation", name, ts, 900),
        kt.x("gpu_user_annotation", name, ts + 20, kernel_us + 10, pid=0, tid=7),
        kt.x("cpu_op", "aten::mm", ts + 5, 30, **{"External id": ext}),
        kt.x("cuda_runtime", "cudaLaunchKernel", ts + 10, 5, correlation=corr, **{"External id": ext}),
        kt.x(
            "kernel", "ampere_sgemm_128x64_nn", ts + 25, kernel_us, pid=0, tid=7, correlation=corr, stream=7, device=0
        ),
    ]


def test_vllm_iterations_are_the_steps_of_a_trace_without_profiler_steps(kt, tmp_path):
    names = [
        "execute_context_1(512)_generation_0(0)",  # prefill
        "execute_context_0(0)_generation_1(1)",
        "execute_context_0(0)_generation_1(1)",
    ]
    ev = []
    for i, (n, ts) in enumerate(zip(names, (1_000, 3_500, 4_500), strict=True)):
        ev += _vllm_iteration(kt, ts, n, 10 + i, 100 + i, kernel_us=400 if i == 0 else 100)
    ev[0]["dur"] = 2_000  # the prefill's host range: 2.2x the decodes' (the warm-up rule's factor is 1.5)
    kt.write_trace(tmp_path / "rank0.pt.trace.json", ev, world_size=1)
    a = ep_trace.load([tmp_path])
    steps = a.steps.sort("step")
    assert steps["step"].to_list() == [1, 2, 3]
    # the host range of each iteration
    assert steps["step_time_ns"].to_list() == [2_000_000, 900_000, 900_000]
    assert any("serving engine's iterations" in n for n in a.notes)
    assert not any("warm-up" in n for n in a.notes)  # a long first iteration is a prefill, kept
    assert not any("whole trace is analysed as step 0" in n for n in a.notes)


def test_early_vllm_v1_iteration_names_are_steps_too(kt, tmp_path):
    """The first vLLM V1 releases named the range execute_new_<n>_cached_<m> (gpu_worker.py)."""
    names = ["execute_new_2_cached_0", "execute_new_0_cached_2", "execute_new_0_cached_2"]
    ev = []
    for i, (n, ts) in enumerate(zip(names, (1_000, 3_500, 4_500), strict=True)):
        ev += _vllm_iteration(kt, ts, n, 10 + i, 100 + i, kernel_us=100)
    kt.write_trace(tmp_path / "rank0.pt.trace.json", ev, world_size=1)
    a = ep_trace.load([tmp_path])
    assert a.steps.sort("step")["step"].to_list() == [1, 2, 3]
    assert a.steps["step_time_ns"].to_list() == [900_000] * 3


def test_ranks_with_different_iteration_counts_say_steps_pair_by_number(kt, tmp_path):
    """vLLM's idle data-parallel ranks run dummy batches without an annotation: fewer iterations."""
    for rank, n in ((0, 3), (1, 2)):
        ev = []
        for i in range(n):
            ev += _vllm_iteration(kt, 1_000 + 1_500 * i, "execute_context_0(0)_generation_1(1)", 10 + i, 100 + i, 100)
        kt.write_trace(tmp_path / f"rank{rank}.pt.trace.json", ev, rank=rank, world_size=2)
    a = ep_trace.load([tmp_path])
    assert (
        "ranks hold different numbers of serving iterations (rank 1: 2, rank 0: 3; vLLM's idle data-parallel "
        "ranks run unannotated dummy batches, seen only with Python frames in the trace, i.e. with_stack on): "
        "steps are paired across ranks by number, so cross-rank per-step "
        "figures can pair different iterations (collectives with a sequence number are still matched call by "
        "call, others by their order in the step)"
    ) in a.notes
    kt.write_trace(
        tmp_path / "rank1.pt.trace.json",
        ev + _vllm_iteration(kt, 9_000, "execute_context_0(0)_generation_1(1)", 30, 300, 100),
        rank=1,
        world_size=2,
    )
    assert not any("different numbers of serving iterations" in n for n in ep_trace.load([tmp_path]).notes)


def test_profiler_steps_win_and_other_ranks_are_left_alone():
    ev = pl.DataFrame(
        {
            "rank": [0, 0, 0, 1, 1, 1],
            "kind": [
                "cpu_annotation",
                "cpu_annotation",
                "gpu_annotation",
                "cpu_annotation",
                "cpu_annotation",
                "cpu_op",
            ],
            "name": [
                "execute_context_0(0)_generation_4(4)",
                "execute_context_0(0)_generation_4(4)",
                "execute_context_0(0)_generation_4(4)",
                "ProfilerStep#7",
                "execute_context_0(0)_generation_2(2)",
                "execute_context_0(0)_generation_2(2)",  # an op of that name is no annotation
            ],
            "start_ns": [200, 100, 150, 0, 10, 20],
            "seq": [None, None, None, 7, None, None],
        },
        schema_overrides={"seq": pl.Int64},
    )
    got = with_iteration_steps(ev)
    # rank 0: numbered by start per kind (the GPU copy of the first iteration is its step 1 too);
    # rank 1 has a ProfilerStep row: its annotations are no steps
    assert got["seq"].to_list() == [2, 1, 1, 7, None, None]
    assert got.drop("seq").equals(ev.drop("seq"))


def test_names_that_only_look_like_markers_are_not_steps():
    ev = pl.DataFrame(
        {
            "rank": [0, 0],
            "kind": ["cpu_annotation", "cpu_annotation"],
            "name": ["execute_context_stuff", "execute_context_1(3)_generation_0(0)_x"],
            "start_ns": [0, 10],
            "seq": [None, None],
        },
        schema_overrides={"seq": pl.Int64},
    )
    assert with_iteration_steps(ev)["seq"].null_count() == 2


def test_sglang_run_batch_frames_are_the_steps():
    frame = "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py(2104): run_batch"
    ev = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0],
            "kind": ["python_frame", "python_frame", "python_frame", "cpu_annotation"],
            "category": ["python_function"] * 3 + ["user_annotation"],
            "name": [frame, frame, frame.replace("run_batch", "process_batch_result"), frame],
            "start_ns": [500, 100, 200, 300],
            "seq": [None, None, None, None],
        },
        schema_overrides={"seq": pl.Int64},
    )
    # the run_batch frames (python_function rows, kind python_frame) in start order; another frame and an
    # annotation that happens to hold the text are not steps
    assert with_iteration_steps(ev)["seq"].to_list() == [2, 1, None, None]


def test_trtllm_forward_step_ranges_are_the_steps():
    ev = pl.DataFrame(
        {
            "rank": [0, 0, 0],
            "kind": ["cpu_annotation"] * 3,
            "name": ["_forward_step", "_forward_step_inter_pp", "_forward_step"],
            "start_ns": [10, 0, 50],
            "seq": [None, None, None],
        },
        schema_overrides={"seq": pl.Int64},
    )
    assert with_iteration_steps(ev)["seq"].to_list() == [1, None, 2]


_WORKER = "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py({line}): {fn}"


def _frames(rank: int, names: list[str], starts: list[int], ends: list[int], tid: int = 5) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "rank": [rank] * len(names),
            "kind": ["cpu_annotation" if n.startswith("execute_") else "python_frame" for n in names],
            "category": ["user_annotation" if n.startswith("execute_") else "python_function" for n in names],
            "name": names,
            "start_ns": starts,
            "end_ns": ends,
            "tid": [tid] * len(names),
            "seq": [None] * len(names),
        },
        schema_overrides={"seq": pl.Int64},
    )


def test_vllm_worker_frames_are_the_steps_of_releases_without_an_annotation():
    """vLLM V1 releases before annotate_profile (and V0) wrote no iteration range; the profiler's
    default with_stack=True still records Worker.execute_model's frame once per iteration."""
    em = _WORKER.format(line=281, fn="execute_model")
    other = _WORKER.format(line=300, fn="profile")
    ev = _frames(0, [em, em, other, em], [300, 100, 50, 200], [390, 190, 60, 290])
    assert with_iteration_steps(ev)["seq"].to_list() == [3, 1, None, 2]


def test_an_idle_data_parallel_rank_takes_its_dummy_batches_as_steps():
    """An idle DP rank runs Worker.execute_dummy_batch once per iteration (DPEngineCoreProc.run_busy_loop),
    outside annotate_profile: its worker frames are its steps, while a busy rank keeps its annotations."""
    em = _WORKER.format(line=281, fn="execute_model")
    dummy = _WORKER.format(line=330, fn="execute_dummy_batch")
    ann = "execute_context_0(0)_generation_1(1)"
    busy = _frames(0, [em, ann, em, ann, em, ann], [0, 5, 100, 105, 200, 205], [90, 85, 190, 185, 290, 285])
    idle = _frames(1, [em, ann, dummy, dummy], [0, 5, 100, 200], [90, 85, 190, 290])
    out = with_iteration_steps(pl.concat([busy, idle]))
    # rank 0: the annotations (1, 2, 3), not its frames; rank 1: its frames, the execute_model one
    # holding the annotation and two dummy batches, so both ranks have 3 steps
    assert out["seq"].to_list() == [None, 1, None, 2, None, 3] + [1, None, 2, 3]


def test_a_worker_frame_nested_in_another_is_not_a_step():
    """V0's speculative decoding worker calls its scorer's execute_model inside its own."""
    v0 = "/opt/vllm/vllm/worker/worker_base.py(410): execute_model"
    ev = _frames(0, [v0, v0, v0], [0, 10, 100], [90, 50, 190])
    assert with_iteration_steps(ev)["seq"].to_list() == [1, None, 2]


def test_idle_rank_dummy_batches_pair_the_iterations_in_a_kineto_trace(kt, tmp_path):
    """End to end: a busy rank's 3 annotated iterations, an idle rank's 3 dummy batches (with_stack on):
    3 steps each and no note about different iteration counts."""
    dummy = _WORKER.format(line=330, fn="execute_dummy_batch")
    busy: list[dict] = []
    idle: list[dict] = []
    for i in range(3):
        ts = 1_000 + 1_500 * i
        busy += _vllm_iteration(kt, ts, "execute_context_0(0)_generation_1(1)", 10 + i, 100 + i, 100)
        idle += [kt.x("python_function", dummy, ts, 950)]
        idle += _vllm_iteration(kt, ts, "unrelated", 20 + i, 200 + i, 100)[2:]  # its launch and kernel
    kt.write_trace(tmp_path / "rank0.pt.trace.json", busy, rank=0, world_size=2)
    kt.write_trace(tmp_path / "rank1.pt.trace.json", idle, rank=1, world_size=2)
    a = ep_trace.load([tmp_path])
    assert a.steps.group_by("rank").agg(pl.len()).sort("rank")["len"].to_list() == [3, 3]
    assert a.steps.filter(pl.col("rank") == 1).sort("step")["step_time_ns"].to_list() == [950_000] * 3
    assert not any("different numbers of serving iterations" in n for n in a.notes)

"""A step is the work it launched: synthetic Kineto traces whose answers are known exactly (graph replay
under an overlap scheduler, device work past the host step, HIP graphs, phases, warm-up, user ranges,
the 2021 schema, the host-bound threshold). Builders and the real names they use: ``kineto_json.py``."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

import ep_trace
from ep_trace.analysis import analyze
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.finding_host import HOST_BOUND_SHARE
from ep_trace.parsers import read_trace_dir
from ep_trace.reports.html_sections import phases_html

from .kineto_json import AMD_KERNELS, NV_KERNELS, Trace, us

US = 1_000


def _replay(t0: float, n: int = 4, each: float = 200, kernels: tuple[str, ...] = NV_KERNELS) -> list:
    return [(kernels[i % len(kernels)], t0 + i * each, t0 + (i + 1) * each) for i in range(n)]


def _sglang_overlap(tmp_path):
    """SGLang decode under the overlap scheduler, each iteration one cudaGraphLaunch of 4 back-to-back
    200 µs kernels. Iteration 2's host range (500-700 µs) runs while iteration 1's replay (200-1000 µs)
    does; its input copy (stream 30, 530-540 µs) runs during that replay too. Iteration 3 replays one
    150 µs kernel at 1850 µs, its launch queued since 1620 µs (the device finishing iteration 2)."""
    t = Trace()
    t.annotation("step[DECODE bs=16]", 100, 200, gpu=(200, 1000))
    t.launch("cudaGraphLaunch", 150, 20, _replay(200))
    t.annotation("step[DECODE bs=16]", 500, 200, gpu=(1000, 1800))
    t.launch("cudaMemcpyAsync", 520, 5, [("Memcpy HtoD (Pinned -> Device)", 530, 540)], stream=30)
    t.launch("cudaGraphLaunch", 600, 20, _replay(1000))
    t.annotation("step[DECODE bs=16]", 1500, 200, gpu=(1850, 2000))
    t.launch("cudaGraphLaunch", 1600, 20, [(NV_KERNELS[0], 1850, 2000)])
    return t.write(tmp_path / "rank0.pt.trace.json.gz")


def test_overlap_scheduler_steps_are_the_work_each_launched(tmp_path):
    a = ep_trace.load([_sglang_overlap(tmp_path)])
    st = a.steps.sort("step")
    assert st["step"].to_list() == [1, 2, 3]  # the last iteration holds work: never dropped as empty
    assert st["phase"].to_list() == ["decode"] * 3
    # windows: [100, 1000], then from the end of the previous iteration's work to the end of its own
    assert [(s - us(0), e - us(0)) for s, e in st.select("start_ns", "end_ns").rows()] == [
        (100 * US, 1000 * US),
        (1000 * US, 1800 * US),
        (1800 * US, 2000 * US),
    ]
    assert st["compute_ns"].to_list() == [800 * US, 800 * US, 150 * US]
    assert (st["compute_ns"] <= st["step_time_ns"]).all()
    # iteration 2's input copy ran during iteration 1's replay: it counts in step 1's window
    bd = a.breakdown.sort("step")
    assert bd["copy_ns"].to_list() == [0, 0, 0]  # under the replay's kernels: hidden, not idle
    # step 1: 80 µs before its launch returned (+10 µs dispatch) is the host's, then 20 µs queued;
    # step 3: the 50 µs before its kernel were queued since 1630 µs: the device finished iteration 2
    cp = a.critical_path
    by = dict(cp.group_by("cause").agg((pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows())
    assert by["launch_gap"] == 80 * US and by["queued"] == (20 + 50) * US
    # 80 µs of host wait in 1,900 µs of steps: under the host-bound threshold, no such finding
    assert all(f.kind != "host_bound" for f in a.findings)
    ph = a.summary()["phases"]
    assert [(p["phase"], p["n_steps"]) for p in ph] == [("decode", 3)]


def test_device_work_past_the_host_step_extends_the_window(tmp_path):
    """DeepEP's training trace shape: ProfilerStep#1 ends at 1,000 µs on the host, the kernels it launched
    run until 1,300 µs (the device trails the host); the step is 1,300 µs and holds all of them."""
    t = Trace()
    t.annotation("ProfilerStep#1", 0, 1000)
    t.launch("cudaLaunchKernel", 100, 5, [(NV_KERNELS[0], 150, 600)])
    t.launch("cudaLaunchKernel", 900, 5, [(NV_KERNELS[2], 600, 1300)])
    a = ep_trace.load([t.write(tmp_path / "rank0.pt.trace.json.gz")])
    (s,) = a.steps.iter_rows(named=True)
    assert (s["host_start_ns"], s["host_end_ns"]) == (us(0), us(1000))
    assert (s["start_ns"], s["end_ns"], s["step_time_ns"]) == (us(0), us(1300), 1300 * US)
    assert s["compute_ns"] == 1150 * US <= s["step_time_ns"]
    assert any("ran past their end (at most 300 µs, rank 0 step 1)" in n for n in a.notes)


def _host_bound_graphs(tmp_path, call: str, kernels: tuple[str, ...], runtime: str):
    """Three iterations, each 450 µs of host work (``aten::index_put_``) before one graph launch of 4
    back-to-back 25 µs kernels: the device waits for its host before every replay."""
    t = Trace()
    for i in range(3):
        t0 = 1000 * i
        t.annotation("step[DECODE bs=16]", t0, 500, gpu=(t0 + 470, t0 + 570))
        t.x("cpu_op", "aten::index_put_", t0 + 5, 440)
        t.launch(runtime if call == "eager" else call, t0 + 450, 10, _replay(t0 + 470, 4, 25, kernels))
    return t.write(tmp_path / "rank0.pt.trace.json.gz")


def test_cuda_graph_replay_remedy_says_what_is_left(tmp_path):
    a = ep_trace.load([_host_bound_graphs(tmp_path, "cudaGraphLaunch", NV_KERNELS, "cudaLaunchKernel")])
    top = a.findings[0]
    assert top.kind == "host_bound" and top.evidence["graph_launches"] == 3
    g = top.evidence["graph_replay"]
    assert g["platform"] == "cuda" and g["kernel_share"] == 1.0
    # per step: [start, first replayed kernel) is host work before the launch (its 460 µs host range
    # before the launch returned, plus the 10 µs dispatch), nothing between or inside the replays
    assert g["before_launch_ns_per_step"] == 470 * US
    assert g["between_replays_ns_per_step"] == g["inside_replays_ns_per_step"] == 0
    assert "the step already replays CUDA graphs (100% of its kernel time)" in top.remedy
    assert "host work before the launch (470 µs per step" in top.remedy
    assert "Capture the step in a" not in top.remedy and len(top.remedy) <= 512


def test_hip_graph_replay_is_never_told_to_capture_a_cuda_graph(tmp_path):
    a = ep_trace.load([_host_bound_graphs(tmp_path, "hipGraphLaunch", AMD_KERNELS, "hipLaunchKernel")])
    top = a.findings[0]
    assert top.kind == "host_bound" and top.evidence["graph_replay"]["platform"] == "hip"
    assert "the step already replays HIP graphs" in top.remedy and "CUDA graph" not in top.remedy
    assert "HIP graphs / fewer launches" in top.evidence["saving_rule"]


def test_eager_hip_step_is_told_to_capture_a_hip_graph(tmp_path):
    a = ep_trace.load([_host_bound_graphs(tmp_path, "eager", AMD_KERNELS, "hipLaunchKernel")])
    top = a.findings[0]
    assert top.kind == "host_bound" and top.evidence["graph_launches"] == 0
    assert "Capture the step in a HIP graph" in top.remedy and "CUDA graph" not in top.remedy


@pytest.mark.parametrize(("gap_us", "finding"), [(2, False), (15, True)])
def test_host_bound_threshold_is_one_share_of_the_step(tmp_path, gap_us, finding):
    """10 kernels of 30 µs per ProfilerStep, each starting ``gap_us`` after the previous one ended (its
    launch returned just in time), the step ending with the last: the device waits (10 + 10 x gap) µs of
    each (10 + 10 x (gap + 30)) µs step for its host, 9.1 % or 34.8 %: under or over the one threshold."""
    t = Trace()
    for step in range(3):
        t0 = 1000 * step
        t.annotation(f"ProfilerStep#{step + 1}", t0, 10 + 10 * (gap_us + 30))
        end = t0 + 10
        for _ in range(10):
            s = end + gap_us
            t.launch("cudaLaunchKernel", s - 12, 2, [(NV_KERNELS[0], s, s + 30)])
            end = s + 30
    a = ep_trace.load([t.write(tmp_path / "rank0.pt.trace.json.gz")])
    hb = [f for f in a.findings if f.kind == "host_bound"]
    assert bool(hb) is finding
    lg = a.critical_path.filter(pl.col("cause") == "launch_gap").select((pl.col("end_ns") - pl.col("start_ns")).sum())
    share = int(lg.item()) / int(a.steps["step_time_ns"].sum())
    assert share == pytest.approx((10 + 10 * gap_us) / (10 + 10 * (gap_us + 30)))
    assert (share >= HOST_BOUND_SHARE) is finding
    if finding:
        assert hb[0].evidence["share_of_step"] == pytest.approx(share, abs=1e-4)


def test_serving_phases_are_kept_apart(tmp_path):
    t = Trace()
    names = [
        "execute_context_1(512)_generation_0(0)",
        "execute_context_0(0)_generation_4(4)",
        "execute_context_1(128)_generation_3(3)",
        "execute_context_0(0)_generation_4(4)",
    ]
    lens = [600, 100, 300, 100]
    t0 = 0
    for name, k in zip(names, lens, strict=True):
        t.annotation(name, t0, 50, gpu=(t0 + 20, t0 + 20 + k))
        t.launch("cudaLaunchKernel", t0 + 5, 5, [(NV_KERNELS[0], t0 + 20, t0 + 20 + k)])
        t0 += 1000
    a = ep_trace.load([t.write(tmp_path / "rank0.pt.trace.json.gz")])
    assert a.steps.sort("step")["phase"].to_list() == ["prefill", "decode", "mixed", "decode"]
    ph = {p["phase"]: p for p in a.summary()["phases"]}
    assert list(ph) == ["prefill", "decode", "mixed"]
    assert (ph["prefill"]["n_steps"], ph["decode"]["n_steps"], ph["mixed"]["n_steps"]) == (1, 2, 1)
    assert ph["prefill"]["compute_p50_ns"] == 600 * US and ph["decode"]["compute_p50_ns"] == 100 * US
    html = phases_html(a)  # the report's per-phase table, after the per-rank one
    assert html.count("<tr>") == 4 and ">prefill</td><td>1</td><td>620 µs</td><td>620 µs</td><td>600 µs</td>" in html


def test_lazy_init_before_the_first_kernel_is_warm_up(tmp_path):
    """One ProfilerStep whose first op initialises CUDA lazily (421 ms in torch.cuda._lazy_init) before the
    first kernel: warm-up, cut from the step."""
    t = Trace()
    t.annotation("ProfilerStep#1", 0, 422_000)
    t.x("python_function", "torch/cuda/__init__.py(382): _lazy_init", 10, 421_000)
    t.launch("cudaLaunchKernel", 421_020, 5, [(NV_KERNELS[0], 421_030, 421_500)])
    t.launch("cudaLaunchKernel", 421_600, 5, [(NV_KERNELS[1], 421_610, 421_990)])
    a = ep_trace.load([t.write(tmp_path / "rank0.pt.trace.json.gz")])
    (s,) = a.steps.iter_rows(named=True)
    assert s["start_ns"] == us(421_010) and s["step_time_ns"] == 990 * US
    assert (
        "rank 0, step 1: 421 ms before its first device work is warm-up (one-time start-up: lazy CUDA / HIP init, "
        "first-call compilation, profiler start-up); left out of the steady-state step"
    ) in a.notes


def test_user_range_is_the_step_and_steps_0_keeps_the_whole_trace(tmp_path):
    """No ProfilerStep: the user wrapped the model in record_function('model_forward'); 900 µs of profiler
    start-up and input preparation on the host precede it."""
    t = Trace()
    t.x("cpu_op", "aten::to", 100, 5)
    t.launch("cudaMemcpyAsync", 101, 3, [("Memcpy HtoD (Pageable -> Device)", 104, 110)])
    t.annotation("model_forward", 1000, 600, gpu=(1010, 1600))
    for i in range(6):
        t.launch("cudaLaunchKernel", 1000 + 100 * i, 5, [(NV_KERNELS[i % 4], 1010 + 100 * i, 1100 + 100 * i)])
    path = t.write(tmp_path / "rank0.pt.trace.json.gz")
    a = ep_trace.load([path])
    (s,) = a.steps.iter_rows(named=True)
    assert s["step"] == 1 and (s["start_ns"], s["end_ns"]) == (us(1000), us(1600))
    assert (
        "ranks 0 have no ProfilerStep rows: their steps are the 1 ranges 'model_forward', which hold most of their "
        "device work (docs/metrics.md, Steps; --steps 0 analyses the whole trace instead)"
    ) in a.notes
    whole = analyze(read_trace_dir(tmp_path), AnalysisConfig(steps=(0, 0)))
    (w,) = whole.steps.iter_rows(named=True)
    # the whole trace from the first device work (the copy at 104 µs) to the end of the last
    assert w["step"] == 0 and (w["start_ns"], w["end_ns"]) == (us(104), us(1600))


def test_2021_schema_rows_are_device_work(tmp_path):
    """torch 1.8 / 1.9 Kineto (pytorch/kineto libkineto/src/output_json.cpp before 2021-06 / 2022-04):
    Operator, Runtime, Kernel, Memcpy, Memset, User categories, string tids, absolute epoch µs."""
    t0 = 1_623_142_623_460_172
    ev = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 25738, "tid": "25738", "ts": t0, "dur": 1000},
        {"ph": "X", "cat": "Operator", "name": "aten::conv2d", "pid": 25738, "tid": "25738", "ts": t0 + 10, "dur": 50},
        {
            "ph": "X",
            "cat": "Runtime",
            "name": "cudaLaunchKernel",
            "pid": 25738,
            "tid": "25738",
            "ts": t0 + 20,
            "dur": 5,
            "args": {"correlation": 7, "external id": 3},
        },
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "volta_scudnn_128x64_relu_medium_nn_v1",
            "pid": 0,
            "tid": "stream 7",
            "ts": t0 + 30,
            "dur": 400,
            "args": {"correlation": 7, "stream": 7, "device": 0},
        },
        {
            "ph": "X",
            "cat": "Runtime",
            "name": "cudaMemcpyAsync",
            "pid": 25738,
            "tid": "25738",
            "ts": t0 + 60,
            "dur": 5,
            "args": {"correlation": 8},
        },
        {
            "ph": "X",
            "cat": "Memcpy",
            "name": "Memcpy HtoD (Pageable -> Device)",
            "pid": 0,
            "tid": "stream 7",
            "ts": t0 + 440,
            "dur": 20,
            "args": {"correlation": 8, "stream": 7, "bytes": 19267584},
        },
        {"ph": "X", "cat": "User", "name": "forward", "pid": 0, "tid": "stream 7 user", "ts": t0 + 30, "dur": 400},
    ]
    path = tmp_path / "worker0.pt.trace.json.gz"
    path.write_bytes(
        gzip.compress(json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": ev}).encode())
    )
    a = ep_trace.load([path])
    kinds = dict(a.tables.events.group_by("category").agg(pl.col("kind").first().cast(pl.Utf8)).iter_rows())
    assert kinds == {
        "Operator": "cpu_op",
        "Runtime": "runtime",
        "Kernel": "gpu_kernel",
        "Memcpy": "gpu_memcpy",
        "User": "gpu_annotation",
    }
    assert a.tables.events.filter(pl.col("kind") == "gpu_memcpy")["bytes"].to_list() == [19267584]
    (s,) = a.steps.iter_rows(named=True)
    assert s["step"] == 5 and s["compute_ns"] == 400 * US and s["step_time_ns"] == 1000 * US
    assert a.rank_summary["mode"].to_list() == ["gpu"]

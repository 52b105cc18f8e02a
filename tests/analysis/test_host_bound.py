"""Host-bound GPU steps: the device gap floor, the ``no_launch_gaps`` what-if and its finding."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

import ep_trace
from ep_trace.analysis import analyze
from ep_trace.analysis.finding_common import fmt_ns
from ep_trace.analysis.launch_floor import MIN_QUEUED_PAIRS, device_gap_floor
from ep_trace.analysis.result import Finding
from ep_trace.reports import digest

from .conftest import T0, build

US = 1_000


def _kernels(rank: int, spans: list[tuple[int, int, int]], eid0: int = 0, stream: int = 7) -> list[dict]:
    """Kernels ``(launch_end_us, start_us, end_us)`` with their cudaLaunchKernel rows (1 µs each)."""
    out = []
    for i, (le, s, e) in enumerate(spans):
        lid = eid0 + 2 * i
        out.append(
            {
                "rank": rank,
                "event_id": lid,
                "kind": "runtime",
                "name": "cudaLaunchKernel",
                "tid": 1,
                "start_ns": T0 + (le - 1) * US,
                "end_ns": T0 + le * US,
            }
        )
        out.append(
            {
                "rank": rank,
                "event_id": lid + 1,
                "kind": "gpu_kernel",
                "name": f"gemm_{i}",
                "stream": stream,
                "start_ns": T0 + s * US,
                "end_ns": T0 + e * US,
                "launch_id": lid,
            }
        )
    return out


def _step(rank: int, end_us: int, eid: int) -> dict:
    return {
        "rank": rank,
        "event_id": eid,
        "kind": "cpu_annotation",
        "name": "ProfilerStep#1",
        "tid": 1,
        "start_ns": T0,
        "end_ns": T0 + end_us * US,
        "seq": 1,
    }


def test_device_gap_floor_is_the_queued_pairs_25th_percentile():
    # 12 queued pairs (launched while the previous kernel ran): 9 with a 2 µs gap, 3 gated 50 µs by
    # another stream; then 4 pairs launched late (host-bound): ignored, whatever their gap
    spans, t = [], 0
    for i in range(13):
        gap = 50 if i in (4, 8, 12) else 2
        s = t + (gap if i else 0)
        spans.append((s - 5 if i else 0, s, s + 10))
        t = s + 10
    for _ in range(4):
        spans.append((t + 100, t + 101, t + 111))
        t += 111
    tables = build([{"rank": 0, "world_size": 1}], [_step(0, t + 10, 10_000), *_kernels(0, spans)], [])
    assert device_gap_floor(tables.events) == {0: pytest.approx(2 * US)}


def test_device_gap_floor_needs_enough_queued_pairs():
    spans = [(0, 0, 10)] + [(10 * i + 5, 10 * i + 12, 10 * i + 20) for i in range(1, MIN_QUEUED_PAIRS)]
    tables = build([{"rank": 0, "world_size": 1}], [_step(0, 200, 10_000), *_kernels(0, spans)], [])
    assert device_gap_floor(tables.events) == {}  # MIN_QUEUED_PAIRS - 1 pairs: no floor


def _host_bound_job(graphs: bool = False):
    """One GPU rank, a 1,000 µs step: 10 kernels of 10 µs, each launched 90 µs after the previous
    ended while the host runs ``aten::index_put_`` (the device waits for a busy host)."""
    spans = [(100 * i + 89, 100 * i + 90, 100 * i + 100) for i in range(10)]
    ev = [_step(0, 1000, 10_000), *_kernels(0, spans)]
    ev += [
        {
            "rank": 0,
            "event_id": 20_000 + i,
            "kind": "cpu_op",
            "name": "aten::index_put_",
            "tid": 1,
            "start_ns": T0 + (100 * i) * US,
            "end_ns": T0 + (100 * i + 88) * US,
        }
        for i in range(10)
    ]
    if graphs:
        ev.append(
            {
                "rank": 0,
                "event_id": 30_000,
                "kind": "runtime",
                "name": "cudaGraphLaunch",
                "tid": 1,
                "start_ns": T0 + 5 * US,
                "end_ns": T0 + 6 * US,
            }
        )
    return build([{"rank": 0, "world_size": 1}], ev, [])


def test_host_bound_step_is_the_verdict_with_its_simulated_saving():
    a = analyze(_host_bound_job())
    w = dict(a.whatif.select("scenario", "saving_ns").iter_rows())
    # no queued pair: no floor, every launch gap goes: the step shrinks to its 10 x 10 µs of kernels
    assert w["no_launch_gaps"] == 900 * US
    top = a.findings[0]
    assert top.kind == "host_bound" and top.ranks == (0,) and top.est_saving_ns == 900 * US
    assert top.title == (
        "Rank 0's device waits for its host 900 µs per step on the critical path, outside blocking calls; a device "
        "that never waits for the host would save 900 µs per step (simulated bound)."
    )
    assert top.evidence["host_ranges_in_gaps_ns"] == {"aten::index_put_": 880 * US}
    assert "Capture the step in a CUDA graph" in top.remedy and len(top.remedy) <= 512
    assert top.remedy.endswith("The host was inside aten::index_put_ during those gaps.")


def test_host_bound_remedy_when_the_step_already_replays_cuda_graphs():
    top = analyze(_host_bound_job(graphs=True)).findings[0]
    assert top.kind == "host_bound" and top.evidence["graph_launches"] == 1
    assert "The step already replays CUDA graphs" in top.remedy and "Capture the step in a CUDA graph" not in top.remedy
    assert len(top.remedy) <= 512  # the report's display limit (cli/outputs.DISPLAY_CHARS)


def test_whole_trace_step_runs_from_the_first_device_work_and_is_judged_by_the_same_rule():
    # no ProfilerStep, no user range: the whole-trace step starts at the first kernel (the 90 µs of host
    # work before it are warm-up) and ends with the last; its 9 gaps of 90 µs between kernels are host-bound
    t = _host_bound_job()
    ev = t.events.filter(pl.col("name") != "ProfilerStep#1")
    a = analyze(dataclasses.replace(t, events=ev))
    assert a.steps["step_time_ns"].to_list() == [910 * US]
    assert (
        "rank 0, step 0: 90.0 µs before its first device work is warm-up (one-time start-up: lazy CUDA / HIP "
        "init, first-call compilation, profiler start-up); left out of the steady-state step" in a.notes
    )
    top = a.findings[0]
    assert top.kind == "host_bound" and top.est_saving_ns == 810 * US
    assert top.evidence["share_of_step"] == round(810 / 910, 4)


def test_a_negligible_top_finding_does_not_head_the_verdict():
    a = analyze(_host_bound_job())
    tiny = Finding(
        "host_stall", "low", "Rank 0's device is idle 5.00 µs per step while the host blocks.", 5 * US, {}, "x"
    )
    v = digest.verdict(dataclasses.replace(a, findings=(tiny,)))
    assert v.headline.startswith("No EP bottleneck worth 1.0% of the step: rank 0's step (P50 1.00 ms) is ")
    assert v.detail == (
        "The largest simulated saving is 5.00 µs per step (0.5% of the mean step): Rank 0's device is idle 5.00 µs "
        "per step while the host blocks."
    )
    assert v.severity == "none"


# --- real traces (../shared/external) ------------------------------------------------------------


def test_real_ddp_trace_is_host_bound_not_a_27_us_stall(external_dir):
    # HTA's nccl_data: 222 ms steps of which HTA reports 77.8 % idle while the host runs
    # DistributedDataParallel.forward / the optimizer on the CPU; the top finding was a 27 µs host stall
    a = ep_trace.load([external_dir / "kineto" / "hta_nccl_metadata"])
    top = a.findings[0]
    assert top.kind == "host_bound" and top.ranks == (0,)
    step = float(a.rank_summary["step_time_ns"].median())
    assert 0.70 < top.est_saving_ns / step < 0.85  # HTA idle 77.8 %
    assert "DistributedDataParallel.forward" in top.evidence["host_ranges_in_gaps_ns"]


def test_real_blocking_memcpy_is_copy_time_not_a_stall(external_dir):
    # pipit's saxpy: 15 blocking cudaMemcpy calls whose H2D copies run 286 ms; only 1.37 ms of
    # device idle under them is stall (host_stalls.stall_ns), and that is what removing them saves.
    # No step marker: the whole-trace step runs from the first copy to the end of the last (823 ms of
    # MPI_Init and start-up before it are warm-up), so the first call's 102 µs of stall before its
    # copy began is not in the step, nor the last call's 97.9 µs after its copy (the device idle then is
    # tear-down)
    a = ep_trace.load([external_dir / "nsys" / "pipit_saxpy"])
    w = dict(a.whatif.select("scenario", "saving_ns").iter_rows())
    inside = a.host_stalls.filter(pl.col("step").is_not_null())
    assert a.host_stalls.height == 15 and inside.height == 14
    end = int(a.steps["end_ns"][0])
    past_end = int(inside.select((pl.col("end_ns") - end).clip(0).sum()).item())
    assert past_end == 97_852
    stall = int(inside["stall_ns"].sum()) - past_end
    assert w["no_host_stalls"] == stall and stall < 2_000_000


def test_real_single_rank_comm_says_wait_cannot_be_measured(external_dir):
    # HTA's cpu_only rank 34: 85 % of the step in gloo all-reduce, the job's other ranks absent
    a = ep_trace.load([external_dir / "kineto" / "edge_cases" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"])
    v = digest.verdict(a)
    assert v.headline == (
        "Rank 34's step (P50 210 ms) is 85.1% communication that nothing hides; the other ranks of its groups are "
        "not in the trace set, so how much of it is waiting for them cannot be measured and no saving is simulated"
    )
    assert "No EP bottleneck" not in v.headline and not a.findings


def test_device_gap_floor_from_cuda_graph_kernels():
    # a cudaGraphLaunch replays 10 kernels 1.5 µs apart: every kernel links to the one launch call,
    # which returned before the first ran, so all 9 pairs are queued
    launch = {
        "rank": 0,
        "event_id": 0,
        "kind": "runtime",
        "name": "cudaGraphLaunch",
        "tid": 1,
        "start_ns": T0,
        "end_ns": T0 + 5 * US,
    }
    kernels = [
        {
            "rank": 0,
            "event_id": 1 + i,
            "kind": "gpu_kernel",
            "name": f"k{i}",
            "stream": 7,
            "start_ns": T0 + 10 * US + i * 11_500,
            "end_ns": T0 + 10 * US + i * 11_500 + 10 * US,
            "launch_id": 0,
        }
        for i in range(10)
    ]
    tables = build([{"rank": 0, "world_size": 1}], [_step(0, 200, 10_000), launch, *kernels], [])
    assert device_gap_floor(tables.events) == {0: pytest.approx(1_500)}


def test_host_bound_title_names_every_rank_whose_gaps_the_saving_removes():
    # two independent GPU ranks (no collective): rank 0 as above (900 µs of gaps in a 1,000 µs step),
    # rank 1 with 40 µs gaps (400 µs in a 500 µs step). The what-if removes both ranks' gaps and its
    # saving is the mean over ranks (650 µs), more than the named rank's would be on its own in a
    # 2-rank mean (450 µs): the title must say that the saving is all ranks'.
    spans1 = [(50 * i + 39, 50 * i + 40, 50 * i + 50) for i in range(10)]
    ev = [_step(0, 1000, 10_000), *_kernels(0, [(100 * i + 89, 100 * i + 90, 100 * i + 100) for i in range(10)])]
    ev += [_step(1, 500, 10_001), *_kernels(1, spans1, eid0=100)]
    a = analyze(build([{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}], ev, []))
    top = next(f for f in a.findings if f.kind == "host_bound")
    assert top.ranks == (0,) and top.est_saving_ns == 650 * US
    assert top.title == (
        "Rank 0's device waits for its host 900 µs per step on the critical path, outside blocking calls (the most "
        "of 2 GPU ranks); devices that never wait for their hosts would save 650 µs per step (simulated bound, all "
        "2 ranks)."
    )


def test_cpu_rank_host_stall_speaks_of_the_compute_thread_not_a_device(samples_dir):
    """A gloo rank has no device to idle: the stall is its compute thread blocked in the count exchange."""
    a = ep_trace.load(samples_dir / "balanced")
    f = next(f for f in a.findings if f.kind == "host_stall")
    assert a.rank_summary.filter(pl.col("rank") == f.ranks[0])["mode"].to_list() == ["cpu"]
    assert "device" not in f.title
    p50 = f.evidence["stall_p50_ns_per_step"]
    # the saving is the what-if's, which removes the blocking calls of every rank: the title says so
    assert f.evidence["whatif"]["ranks"] == [0, 1, 2, 3]
    assert f.title == (
        f"Rank {f.ranks[0]}'s compute thread blocks {fmt_ns(p50)} per step in the count exchange after the last rank "
        f"arrived (the most of 4 ranks); removing the blocking calls on all 4 ranks saves {fmt_ns(f.est_saving_ns)} "
        "per step (simulated)."
    )

"""Device activity of accelerators other than CUDA is device work; unknown activity types are named."""

from __future__ import annotations

from pathlib import Path

import ep_trace
from ep_trace.parsers.kineto import read_kineto_file

from .conftest import write_trace, x


def _mtia_trace(path: Path) -> Path:
    ev = [
        x("cpu_op", "aten::topk", 10, 8),
        x("mtia_runtime", "mtiaLaunchKernel", 11, 1, correlation=1),
        x(
            "mtia_ccp_events",
            "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(X)",
            30,
            6,
            pid=0,
            tid=3,
            correlation=1,
        ),
        x("cpu_op", "aten::mm", 20, 8),
        x("mtia_runtime", "mtiaLaunchKernel", 21, 1, correlation=2),
        x("mtia_ccp_events", "mtia_fc_gemm", 40, 20, pid=0, tid=3, correlation=2),
        x("foo_device_op", "npu_kernel_a", 50, 3, pid=0, tid=9),
        x("foo_device_op", "npu_kernel_b", 55, 3, pid=0, tid=9),
    ]
    return write_trace(path, ev, rank=0, world_size=1)


def test_mtia_device_rows_are_device_work(tmp_path: Path):
    p = _mtia_trace(tmp_path / "rank0.pt.trace.json")
    t, _ = read_kineto_file(p)
    k = t.events.filter(t.events["kind"] == "gpu_kernel")
    assert k.height == 2 and k["launch_id"].null_count() == 0
    assert t.ranks["device"].to_list() == ["mtia:0"]
    assert [i.message for i in t.load_report] == [
        "2 rows of activity type 'foo_device_op' are not analysed (unknown to ep-trace; kept as kind 'other')"
    ]
    a = ep_trace.load([p])
    assert a.rank_summary["mode"].to_list() == ["gpu"]  # not analysed as a CPU rank
    assert a.rank_summary["compute_ns"].to_list() == [26_000]
    assert a.stages.select("stage", "busy_ns").rows() == [("route", 6_000)]

"""CuptiCollector on CPU: the cupti-python stand-in of conftest.py (``fake``) drives the real collector."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from ep_trace.capture.cupti import collector as col
from ep_trace.errors import ConfigError, EpTraceError, MissingDependencyError
from ep_trace.parsers.cupti import read_cupti


def test_collector_end_to_end(fake: Any, tmp_path: Path) -> None:
    c = col.CuptiCollector(tmp_path, rank=2, world_size=4, job_id="job-7")
    before = time.time_ns()
    c.start()
    assert col.active() is c
    assert sorted(fake.enabled) == [1, 2, 4, 5, 10, 39]
    # Kineto's mute list: cudaGetDevice; cuCtxGetCurrent, cuDevicePrimaryCtxGetState, cuKernelGetAttribute
    assert fake.muted == [("runtime", 17, 0), ("driver", 304, 0), ("driver", 392, 0), ("driver", 686, 0)]
    # step 0: one kernel inside a dispatch stage, one outside
    c.range_push("ep:dispatch:l0:fwd")
    fake.launch("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 300, stream=13, driver=True)
    c.range_pop()
    fake.launch("reduce_kernel", 40)
    assert c.step_end(0) == 6  # 2 launches + 2 kernels + stage range + ProfilerStep#0
    # step 1: nested ranges -> the innermost id wins
    c.range_push("ep:expert:l0:fwd")
    c.range_push("ep:combine:l0:fwd")
    fake.launch("gemm", 500)
    c.range_pop()
    fake.launch("gemm_tail", 50)
    c.range_pop()
    c.step_end(1)
    path = c.stop()
    after = time.time_ns()
    assert col.active() is None and fake.enabled == [] and fake.stack == []
    assert c.stop() == path  # idempotent

    assert path == tmp_path / "rank2.ep-events.parquet"
    assert pq.ParquetFile(path).num_row_groups == 2  # one per step
    t = read_cupti(path)
    r = t.ranks.row(0, named=True)
    assert (r["rank"], r["world_size"], r["job_id"], r["format"], r["rank_source"]) == (
        2,
        4,
        "job-7",
        "cupti",
        "cupti_metadata",
    )
    ev = t.events
    assert ev["event_id"].to_list() == list(range(ev.height)) and ev.height == 13  # 6 (step 0) + 7 (step 1)
    # CUPTI time was mapped to epoch ns with the measured offset
    assert before <= ev["start_ns"].min() and ev["end_ns"].max() <= after + 10_000
    names = dict(zip(ev["name"], ev["event_id"], strict=False))
    k = {row["name"]: row for row in ev.filter(pl.col("kind") == "gpu_kernel").iter_rows(named=True)}
    nccl = k["ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"]
    assert nccl["op_id"] == names["ep:dispatch:l0:fwd"] and nccl["stream"] == 13
    assert ev.row(nccl["launch_id"], named=True)["name"] == "cuLaunchKernelEx"
    assert k["reduce_kernel"]["op_id"] is None
    assert k["gemm"]["op_id"] == names["ep:combine:l0:fwd"]
    assert k["gemm_tail"]["op_id"] == names["ep:expert:l0:fwd"]
    steps = ev.filter(pl.col("name").str.starts_with("ProfilerStep#")).select("name", "seq").rows()
    assert steps == [("ProfilerStep#0", 0), ("ProfilerStep#1", 1)]
    assert [i.message for i in t.load_report] == [
        "CUPTI capture records no host collective ops: collectives and split lists come from the sidecar only"
    ]


def test_missing_cupti_message_word_for_word(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti -> ImportError
    with pytest.raises(MissingDependencyError) as ei:
        col.CuptiCollector(tmp_path, 0).start()
    assert str(ei.value) == (
        "cupti backend: cupti-python is not installed; install it with `pip install 'ep-trace[cupti]'` "
        "(needs an NVIDIA driver) or use Tracer(..., backend='kineto')"
    )
    assert ei.value.exit_code == 2
    assert col.active() is None and not list(tmp_path.iterdir())


def test_missing_gpu_message_word_for_word(fake: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(col, "_cuda_device_count", lambda: 0)
    with pytest.raises(MissingDependencyError) as ei:
        col.CuptiCollector(tmp_path, 0).start()
    assert str(ei.value) == (
        "cupti backend: no CUDA GPU is visible to this process (torch.cuda.device_count() == 0); run on a GPU node "
        "(check CUDA_VISIBLE_DEVICES) or use Tracer(..., backend='kineto'), which also traces CPU-only runs"
    )
    assert fake.enabled == []


def test_real_device_count_on_this_machine() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert col._cuda_device_count() == 0


def test_cupti_refuses_to_start(fake: Any, tmp_path: Path) -> None:
    fake.fail_enable = True
    with pytest.raises(EpTraceError) as ei:
        col.CuptiCollector(tmp_path, 0).start()
    assert str(ei.value) == (
        "cupti backend: CUPTI refused to start (RuntimeError: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED); another "
        "CUPTI client (Nsight Systems, a running torch.profiler) may own the activity API: stop it or use backend='kineto'"
    )


def test_one_collector_per_process(fake: Any, tmp_path: Path) -> None:
    with col.CuptiCollector(tmp_path, 0):
        with pytest.raises(ConfigError, match="already running"):
            col.CuptiCollector(tmp_path, 1).start()
    with pytest.raises(ConfigError, match="call start"):
        col.CuptiCollector(tmp_path, 0).step_end(0)


def test_import_without_cupti_python_in_subprocess(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['cupti'] = None\n"
        "import ep_trace, ep_trace.capture.cupti, ep_trace.capture.cupti.collector as c, ep_trace.parsers.cupti\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "try:\n    c.CuptiCollector(sys.argv[1], 0).start()\n"
        "except ep_trace.errors.MissingDependencyError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ERR " + col.NO_CUPTI_MESSAGE


def test_keep_raw_reproduces_the_file(fake: Any, tmp_path: Path) -> None:
    """Raw records saved as test data (what gpu_check.sh does) convert back to exactly the file's events."""
    from ep_trace.capture.cupti.convert import records_to_events

    c = col.CuptiCollector(tmp_path, 0, col.CuptiConfig(keep_raw=True, driver_api=False, memcpy=False, memset=False))
    c.start()
    assert sorted(fake.enabled) == [5, 10, 39]
    c.range_push("ep:route:l1:bwd")
    fake.launch("topk_kernel", 70)
    fake.launch("softmax_kernel", 30)
    c.range_pop()
    c.step_end(4)
    c.stop()
    assert [r["kind"] for r in c.raw["records"]] == [5, 39, 10, 5, 39, 10]
    assert [r["name"] for r in c.raw["ranges"]] == ["ep:route:l1:bwd", "ProfilerStep#4"]
    again = records_to_events(c.raw["records"], rank=0, ranges=c.raw["ranges"], clock_offset_ns=c.clock_offset_ns)
    assert again.equals(read_cupti(c.path).events)
    # the second launch (10 ns after the first) precedes the first kernel (20 ns after its launch)
    assert again["name"].to_list() == [
        "ProfilerStep#4",
        "ep:route:l1:bwd",
        "cudaLaunchKernel",
        "cudaLaunchKernel",
        "topk_kernel",
        "softmax_kernel",
    ]
    assert again.filter(pl.col("kind") == "gpu_kernel").select("launch_id", "op_id").rows() == [(2, 1), (3, 1)]


def test_unwritable_out_dir_rolls_back(fake: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError) as ei:
        col.CuptiCollector(blocker / "sub", 0).start()  # a file where the directory should be
    assert str(ei.value) == (
        f"out_dir: cannot write {blocker / 'sub' / 'rank0.ep-events.parquet'} (Not a directory); choose a writable directory"
    )
    assert col.active() is None and fake.enabled == []
    c = col.CuptiCollector(tmp_path / "new" / "dir", 1).start()  # missing directories are created
    assert c.stop() == tmp_path / "new" / "dir" / "rank1.ep-events.parquet"

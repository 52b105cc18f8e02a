"""Tracer, stage() and the sidecar writer in one process (torch.distributed not initialised)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import polars as pl
import pytest
import torch

from ep_trace import Tracer, record_a2a, record_routing, stage
from ep_trace.capture.routing import reserve_a2a_call
from ep_trace.capture.sidecar import active_writer
from ep_trace.errors import ConfigError


def _events(trace: Path) -> list[dict]:
    with gzip.open(trace, "rt") as f:  # must be valid gzip + JSON
        return json.load(f)["traceEvents"]


def _names(trace: Path, prefix: str) -> list[str]:
    return [e["name"] for e in _events(trace) if e.get("ph") == "X" and e["name"].startswith(prefix)]


def _sidecar(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _work(layer: int) -> None:
    with stage("expert", layer=layer):
        torch.randn(32, 32) @ torch.randn(32, 32)


def test_loop_form_writes_both_files_as_rank0_of_1(tmp_path: Path) -> None:
    with Tracer(tmp_path / "t", job_id="job-1") as t:
        for i in range(2):
            _work(i)
            record_routing(i, torch.tensor([[0, 1], [1, 2], [1, 0]]), 4, [0, 0, 0, 0])
            t.step()
    files = sorted(p.name for p in (tmp_path / "t").iterdir())
    assert files == ["rank0.ep.jsonl", "rank0.pt.trace.json.gz"]
    trace = tmp_path / "t" / "rank0.pt.trace.json.gz"
    # torch.profiler semantics: the last t.step() opens ProfilerStep#2, closed empty at exit.
    assert _names(trace, "ProfilerStep#") == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert _names(trace, "ep:") == ["ep:expert:l0:fwd", "ep:expert:l1:fwd"]
    recs = _sidecar(tmp_path / "t" / "rank0.ep.jsonl")
    meta = recs[0]
    assert meta["type"] == "meta" and meta["v"] == 1
    assert (meta["rank"], meta["world_size"], meta["local_rank"], meta["backend"], meta["job_id"]) == (
        0,
        1,
        0,
        None,
        "job-1",
    )
    assert meta["ep_group_ranks"] == [0] and meta["device"] == "cpu"
    assert meta["torch_version"] == torch.__version__ and meta["ep_trace_version"] == "0.1.0"
    assert recs[1] == {
        "type": "meta", "v": 1, "num_experts": 4, "top_k": 2, "placement": [[0], [0], [0], [0]], "redundant_experts": 0,
    }  # fmt: skip
    routing = [r for r in recs if r["type"] == "routing"]
    assert [(r["step"], r["layer"], r["expert_counts"], r["tokens"]) for r in routing] == [
        (0, 0, [2, 3, 1, 0], 3),
        (1, 1, [2, 3, 1, 0], 3),
    ]
    ends = [r for r in recs if r["type"] == "step_end"]
    assert [r["step"] for r in ends] == [0, 1, 2]
    assert ends[0]["time_ns"] <= ends[1]["time_ns"] <= ends[2]["time_ns"]


def test_scope_form_gives_exactly_the_steps(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path, first_step=5)
    for i in range(3):
        with tracer.step() as t:
            assert t is tracer and tracer.current_step == 5 + i
            _work(0)
        assert tracer.current_step is None
    tracer.close()
    tracer.close()  # idempotent
    trace = tmp_path / "rank0.pt.trace.json.gz"
    assert _names(trace, "ProfilerStep#") == ["ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"]
    assert [r["step"] for r in _sidecar(tmp_path / "rank0.ep.jsonl") if r["type"] == "step_end"] == [5, 6, 7]
    # Each stage range lies inside its step range.
    ev = {e["name"]: e for e in _events(trace) if e.get("ph") == "X" and e["name"].startswith("ProfilerStep")}
    ranges = [e for e in _events(trace) if e.get("name") == "ep:expert:l0:fwd"]
    for r, s in zip(ranges, ("ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"), strict=True):
        assert ev[s]["ts"] <= r["ts"] and r["ts"] + r["dur"] <= ev[s]["ts"] + ev[s]["dur"]


def test_exception_writes_trace_and_is_reraised(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError):
        with Tracer(tmp_path) as t:
            _work(0)
            t.step()
            _work(1)
            1 / 0  # noqa: B018
    assert active_writer() is None
    trace = tmp_path / "rank0.pt.trace.json.gz"
    assert _names(trace, "ep:") == ["ep:expert:l0:fwd", "ep:expert:l1:fwd"]
    assert [r["step"] for r in _sidecar(tmp_path / "rank0.ep.jsonl") if r["type"] == "step_end"] == [0, 1]


def test_exception_in_scope_form_stops_and_writes(tmp_path: Path) -> None:
    tracer = Tracer(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        with tracer.step():
            _work(2)
            raise RuntimeError("boom")
    assert not tracer.running
    assert _names(tmp_path / "rank0.pt.trace.json.gz", "ep:") == ["ep:expert:l2:fwd"]


def test_a2a_records_and_call_ordinals(tmp_path: Path) -> None:
    with Tracer(tmp_path) as t:
        c0 = reserve_a2a_call()  # an async call issued first, recorded after a sync one
        record_a2a("count", [2, 2], [2, 2], layer=0, row_bytes=8, start_ns=1, end_ns=2, group_ranks=[0, 1])
        record_a2a(
            "dispatch",
            [3, 0],
            [1, 4],
            layer=0,
            row_bytes=1024,
            start_ns=3,
            end_ns=9,
            group_ranks=[0, 1],
            call=c0,
            microbatch=1,
        )
        t.step()
        record_a2a("combine", [1], [3], layer=1, row_bytes=4, start_ns=10, end_ns=11)  # group from meta: [0]
    a2a = [r for r in _sidecar(tmp_path / "rank0.ep.jsonl") if r["type"] == "a2a"]
    assert [(r["step"], r["direction"], r["call"], r["microbatch"], r["phase"]) for r in a2a] == [
        (0, "count", 1, 0, "fwd"),
        (0, "dispatch", 0, 1, "fwd"),
        (1, "combine", 0, 0, "fwd"),
    ]
    assert a2a[1]["send_splits"] == [3, 0] and a2a[1]["recv_splits"] == [1, 4] and a2a[1]["row_bytes"] == 1024
    assert a2a[2]["group_ranks"] == [0] and (a2a[2]["start_ns"], a2a[2]["end_ns"]) == (10, 11)


def test_recording_is_a_noop_without_tracer_and_validates_with_one(tmp_path: Path) -> None:
    assert active_writer() is None
    record_routing(0, torch.zeros(2, 1, dtype=torch.int64), 4)  # nothing to write to: no error
    record_a2a("nonsense", [1], [1], layer=0, row_bytes=1, start_ns=0, end_ns=0)
    assert reserve_a2a_call() is None
    with Tracer(tmp_path):
        with pytest.raises(ConfigError, match="direction: unknown all-to-all direction 'nonsense'"):
            record_a2a("nonsense", [1], [1], layer=0, row_bytes=1, start_ns=0, end_ns=0)
        with pytest.raises(ConfigError, match="phase: unknown phase 'sideways'"):
            record_a2a("count", [1], [1], layer=0, row_bytes=1, start_ns=0, end_ns=0, phase="sideways")
        with pytest.raises(ConfigError, match="lengths 2/1 differ from the group size 1"):
            record_a2a("count", [1, 1], [1], layer=0, row_bytes=1, start_ns=0, end_ns=0)
        with pytest.raises(ConfigError, match="placement: has 2 entries for 4 experts"):
            record_routing(0, torch.zeros(2, 1, dtype=torch.int64), 4, placement=[0, 0])
        with pytest.raises(ConfigError, match="expert_counts: negative entry"):
            record_routing(0, torch.zeros(2, 1, dtype=torch.int64), 2, expert_counts=[3, -1])
        with pytest.raises(ConfigError) as e:
            record_routing(0, torch.zeros(4, 2, dtype=torch.int64), 2, expert_counts=[5, 1], dropped=1)
        assert str(e.value) == (
            "expert_counts: sum to 6, not tokens x top_k - dropped + padded = 4 x 2 - 1 + 0 = 7; pass the counts "
            "of the assignments dispatched, with the drops / padding"
        )


def test_capacity_drops_and_padding_are_recorded_and_read_back(tmp_path: Path) -> None:
    """A router that drops 3 of its 8 assignments and pads 1 (capacity): the sidecar says so and the
    analysis' conservation check accepts it (parsers/sidecar_checks.py, analysis/ep_invariants.py)."""
    import ep_trace

    with Tracer(tmp_path) as t:
        for _ in range(2):
            torch.ones(8).sum()
            record_routing(0, torch.zeros(4, 2, dtype=torch.int64), 2, expert_counts=[5, 1], dropped=3, padded=1)
            t.step()
    lines = [json.loads(x) for x in next(tmp_path.glob("rank0.ep.jsonl")).read_text().splitlines()]
    rec = next(x for x in lines if x["type"] == "routing")
    assert (rec["expert_counts"], rec["tokens"], rec["top_k"], rec["dropped"], rec["padded"]) == ([5, 1], 4, 2, 3, 1)
    a = ep_trace.load(tmp_path)
    rc = a.tables.routing_counts.filter(pl.col("step") == rec["step"]).sort("expert")
    assert rc.select("count", "tokens", "top_k", "dropped", "padded").rows() == [(5, 4, 2, 3, 1), (1, 4, 2, 3, 1)]
    cons = a.ep_invariants.filter(pl.col("check") == "assignment_conservation").row(0, named=True)
    assert (
        cons["detail"] == "2 routing decisions: Σ counts = tokens × top_k − dropped + padded in 2, 6 dropped, 2 padding"
    )
    assert cons["status"] == "ok"


def test_out_dir_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        Tracer(f)


def test_stage_names_errors_and_decorator(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="stage: unknown stage 'dispath'"):
        stage("dispath")
    with pytest.raises(ConfigError, match="phase: unknown phase 'fw'"):
        stage("expert", phase="fw")
    assert stage("combine", layer=3, microbatch=1, phase="bwd").name == "ep:combine:l3:mb1:bwd"

    @stage("permute", layer=1)
    def permute(n: int) -> int:
        return n if n == 0 else permute(n - 1) + 1  # recursion: nested ranges of the same stage

    with stage("route"):  # no profiler: just runs
        assert permute(2) == 2
    with Tracer(tmp_path) as t:
        assert permute(2) == 2
        t.step()
    assert _names(tmp_path / "rank0.pt.trace.json.gz", "ep:") == ["ep:permute:l1:fwd"] * 3


_KILLED = textwrap.dedent(
    """
    import os, sys, torch
    from ep_trace import Tracer, record_routing
    tracer = Tracer(sys.argv[1])
    for s in range(3):
        with tracer.step():
            record_routing(0, torch.tensor([[s % 4]]), 4)
            if s == 2:
                os._exit(9)  # killed mid-step: no close(), no atexit, no flush
    """
)


def test_sidecar_keeps_finished_steps_when_killed(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(tmp_path)], timeout=120, capture_output=True)
    assert proc.returncode == 9
    recs = _sidecar(tmp_path / "rank0.ep.jsonl")
    assert [(r["type"], r.get("step")) for r in recs] == [
        ("meta", None),
        ("meta", None),  # num_experts / top_k learnt from the first record_routing
        ("routing", 0),
        ("step_end", 0),
        ("routing", 1),
        ("step_end", 1),
    ]
    assert not (tmp_path / "rank0.pt.trace.json.gz").exists()  # Kineto writes only at stop


def test_scope_form_inside_entered_tracer_warns_about_the_empty_first_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Tracer(tmp_path) as t:
        for _ in range(2):
            with t.step():
                _work(0)
    assert [r.getMessage() for r in caplog.records if r.name == "ep_trace.capture.tracer"] == [
        "ep-trace: ProfilerStep#0 is empty: inside `with Tracer(...) as t` call t.step() at the end of each step; "
        "use `with tracer.step():` on a Tracer that you close() yourself"
    ]
    assert _names(tmp_path / "rank0.pt.trace.json.gz", "ProfilerStep#") == [
        "ProfilerStep#0",
        "ProfilerStep#1",
        "ProfilerStep#2",
    ]


@pytest.mark.parametrize(
    "env,expected",
    [({}, False), ({"NSYS_PROFILING_SESSION_ID": "7"}, True), ({"EP_TRACE_NVTX": "1"}, True),
     ({"EP_TRACE_NVTX": "0", "CUDA_INJECTION64_PATH": "/x.so"}, False)],
)  # fmt: skip
def test_nvtx_only_with_a_collector(monkeypatch: pytest.MonkeyPatch, env: dict, expected: bool) -> None:
    from ep_trace.capture import stages

    for k in ("EP_TRACE_NVTX", *stages._NSYS_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert stages._nvtx_wanted() is expected
    if not torch.cuda.is_available():
        assert stages._hooks().nvtx_push is None  # CPU machine: never NVTX


def test_capture_names_import_without_torch() -> None:
    code = (
        "import sys; import ep_trace; ep_trace.Tracer; ep_trace.stage; ep_trace.record_routing; ep_trace.record_a2a; "
        "import ep_trace.workloads.demo, ep_trace.workloads.truth; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"  # torch is imported on first use, never at import

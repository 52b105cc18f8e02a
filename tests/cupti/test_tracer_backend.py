"""Tracer(..., backend="cupti") + stage() with the cupti-python stand-in of conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ep_trace.capture.cupti import collector as col

pytest.importorskip("torch")
from ep_trace.capture.stages import stage  # noqa: E402
from ep_trace.capture.tracer import Tracer  # noqa: E402
from ep_trace.errors import ConfigError, MissingDependencyError  # noqa: E402
from ep_trace.parsers import read_trace_dir  # noqa: E402


def test_tracer_cupti_backend(fake: Any, tmp_path: Path) -> None:
    f = fake
    t = Tracer(tmp_path, backend="cupti", job_id="j")
    for _ in range(2):
        with t.step():
            with stage("dispatch", 0):
                f.launch("ncclDevKernel_SendRecv(x)", 100, stream=13)
            with stage("expert", 0):
                f.launch("gemm", 300)
    t.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.ep-events.parquet", "rank0.ep.jsonl"]
    tables = read_trace_dir(tmp_path)
    assert tables.ranks.select("format", "has_sidecar", "job_id").rows() == [("cupti", True, "j")]
    ev = tables.events
    names = dict(zip(ev["event_id"], ev["name"], strict=False))
    k = ev.filter(pl.col("kind") == "gpu_kernel")
    assert [(n, names[o]) for n, o in k.select("name", "op_id").rows()] == [
        ("ncclDevKernel_SendRecv(x)", "ep:dispatch:l0:fwd"),
        ("gemm", "ep:expert:l0:fwd"),
        ("ncclDevKernel_SendRecv(x)", "ep:dispatch:l0:fwd"),
        ("gemm", "ep:expert:l0:fwd"),
    ]
    assert ev.filter(pl.col("name").str.starts_with("ProfilerStep#"))["seq"].to_list() == [0, 1]
    assert col.active() is None


def test_tracer_cupti_backend_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="backend: unknown backend 'bogus'; use 'kineto' or 'cupti'"):
        Tracer(tmp_path, backend="bogus")
    monkeypatch.setitem(sys.modules, "cupti", None)
    with pytest.raises(MissingDependencyError, match="cupti-python is not installed"):
        Tracer(tmp_path / "t", backend="cupti", job_id="j").start()
    assert not (tmp_path / "t" / "rank0.ep.jsonl").exists()

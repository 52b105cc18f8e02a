"""Concrete Inputs recorded only where asked (ep_trace.capture.concrete), read back from the trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch

from ep_trace import Tracer
from ep_trace.capture.concrete import collective_inputs


def _concrete(trace: Path, name: str) -> list[list[str]]:
    with gzip.open(trace, "rt") as f:
        ev = json.load(f)["traceEvents"]
    return [e["args"].get("Concrete Inputs") for e in ev if e.get("ph") == "X" and e["name"] == name]


def _ops() -> None:
    x = torch.ones(4, 4)
    torch.sum(x, dim=[0])  # aten::sum: its dim list is a concrete input (a scalar list)
    with collective_inputs():
        torch.amax(x, dim=[1])  # aten::amax, inside the block


def test_off_records_only_inside_the_block_and_restores_torchs_default(tmp_path: Path) -> None:
    with Tracer(tmp_path / "off", job_id="j", concrete_inputs=False):
        _ops()
    trace = tmp_path / "off" / "rank0.pt.trace.json.gz"
    # scalar lists (a collective's split sizes, these dims) only inside the block; plain scalars always
    assert _concrete(trace, "aten::sum") == [["", "", "False", ""]]
    assert _concrete(trace, "aten::amax") == [["", "[1]", "False"]]
    # after the Tracer stops, torch records them everywhere again (its default), and so does a
    # Tracer with the default setting
    with Tracer(tmp_path / "on", job_id="j"):
        _ops()
    trace = tmp_path / "on" / "rank0.pt.trace.json.gz"
    assert _concrete(trace, "aten::sum") == [["", "[0]", "False", ""]]
    assert _concrete(trace, "aten::amax") == [["", "[1]", "False"]]

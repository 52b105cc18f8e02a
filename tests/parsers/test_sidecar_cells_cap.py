"""The routing-cells cap of a sidecar (``parsers.sidecar_checks.MAX_ROUTING_CELLS``), word for word, on
the balanced sample's rank 0: 48 expert counts (``routing`` records) and 144 split entries (``a2a``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ep_trace.parsers.sidecar_checks as sck
from ep_trace.errors import ResourceLimitError
from ep_trace.parsers.kineto import read_kineto
from ep_trace.parsers.sidecar import read_sidecar

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "balanced"
SC = "sample_traces/balanced/rank0.ep.jsonl"
FIX = "analyse fewer steps (a shorter profiler window), or split the run"


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        (47, f"{SC}: line 24: more than 47 expert counts; {FIX}"),
        (143, f"{SC}: line 27: more than 143 split entries; {FIX}"),
        (191, f"{SC}: more than 191 expert counts and split entries; analyse fewer steps"),
    ],
)
def test_each_cap_names_what_it_counted(monkeypatch: pytest.MonkeyPatch, cap: int, message: str) -> None:
    monkeypatch.chdir(SAMPLE.parents[1])
    t, sc = read_kineto(str(SAMPLE / "rank0.pt.trace.json.gz")), read_sidecar(SC)
    monkeypatch.setattr(sck, "MAX_ROUTING_CELLS", cap)
    with pytest.raises(ResourceLimitError) as exc:
        sck.check_sidecar(t, sc)
    assert str(exc.value) == message


def test_at_the_cap_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(SAMPLE.parents[1])
    monkeypatch.setattr(sck, "MAX_ROUTING_CELLS", 48 + 144)
    sck.check_sidecar(read_kineto(str(SAMPLE / "rank0.pt.trace.json.gz")), read_sidecar(SC))

"""The robustness contract under fuzzing: only our own one-line error (exit 2), or exit 0 / 1 with
sane numbers (no negative times, waits <= step time, overlap in [0, 1], and every invariant of
ep_trace.analysis.invariants on the analysis and its published summary), no hang (60 s per case),
bounded memory (4 GB address space per worker).

CI runs 6 seeded cases of each of the 23 mutation classes (tests/robustness/attacks.py) on two
worker processes, plus hypothesis-generated events in process (the classes of issue 40:
test_campaign.py); ``pytest --fuzz-long`` (or ``python tests/robustness/fuzz.py --cases 10000``) runs
the long campaign over every class of tests/robustness/campaign.py.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzz  # noqa: E402
from fuzz_worker import insane  # noqa: E402

from ep_trace.errors import EpTraceError  # noqa: E402


def _check(result: dict[str, Any]) -> None:
    assert result["violations"] == [], fuzz.table(result) + "\n" + json.dumps(result["violations"], indent=1)
    for cls, counts in result["counts"].items():
        assert sum(counts.values()) > 0, cls


def test_fuzz_contract_ci(tmp_path: Path) -> None:
    """138 cases: every class x 6 seeds (odd seeds with --keep-going)."""
    result = fuzz.run_campaign(6, tmp_path, workers=2, seed0=0)
    _check(result)
    assert result["cases"] >= 120


@pytest.mark.skipif("not config.getoption('--fuzz-long')")
def test_fuzz_contract_long(tmp_path: Path) -> None:
    """Every class of tests/robustness/campaign.py (issue 40's included), >= 10,000 cases."""
    import campaign

    classes = list(campaign.CLASSES)
    result = fuzz.run_campaign(-(-10_000 // len(classes)), tmp_path, classes=classes, workers=2, seed0=1000)
    print(fuzz.table(result))
    _check(result)


def test_insane_numbers_are_detected() -> None:
    good = {"overall": {"step_time_ns": 100, "barrier_wait_ns": 50}, "ranks": [{"rank": 0, "step_time_ns": 100}]}
    assert insane(good) is None
    wait = {"ranks": [{"rank": 1, "step_time_ns": 127_000_000, "barrier_wait_ns": 236_600_000}]}
    assert insane(wait) == "barrier_wait_ns=236600000 > step_time_ns=127000000 (rank 1)"
    assert insane({"overall": {"exposed_comm_ns": -7}}) == ".overall.exposed_comm_ns=-7 < 0"
    # a what-if may be slower than the measured step; a finding never saves a negative time
    assert insane({"whatif": [{"scenario": "chunked_pipeline", "saving_ns": -5, "predicted_step_ns": 9}]}) is None
    assert insane({"findings": [{"est_saving_ns": -5}]}) == ".findings[0].est_saving_ns=-5 < 0"
    assert insane({"ranks": [{"overlap_efficiency": 1.5}]}) == ".ranks[0].overlap_efficiency=1.5 not in [0, 1]"
    assert insane({"x": float("nan")}) == ".x=nan"


_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["a", "correlation", "External id"]), st.integers(), max_size=2),
)
_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "i", "M", 3]),
        "cat": st.one_of(st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "user_annotation"]), _value),
        "name": st.one_of(
            st.sampled_from(["aten::mm", "ProfilerStep#1", "c10d::allreduce_", "nccl:all_reduce"]), _value
        ),
        "ts": st.one_of(st.floats(min_value=0, max_value=1e7), _value),
        "dur": st.one_of(st.floats(min_value=0, max_value=1e6), _value),
        "pid": st.one_of(st.integers(0, 10), _value),
        "tid": st.one_of(st.integers(0, 10), _value),
        "args": _value,
    }
)
_header = st.fixed_dictionaries(
    {
        "distributedInfo": st.one_of(
            st.fixed_dictionaries(
                {"rank": st.one_of(st.integers(0, 3), _value), "world_size": st.one_of(st.integers(1, 4), _value)}
            ),
            _value,
        ),
        "baseTimeNanoseconds": st.one_of(st.just(1_700_000_000_000_000_000), _value),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, min_size=1, max_size=12), header=_header, gz=st.booleans())
def test_read_kineto_generated_events(
    tmp_path: Path, events: list[dict[str, Any]], header: dict[str, Any], gz: bool
) -> None:
    """Any JSON value in any event field or header key: tables that validate, or our one-line error."""
    from ep_trace.parsers import read_trace_dir

    doc = dict(header, traceEvents=events)
    text = json.dumps(doc).encode()
    p = tmp_path / ("rank0.pt.trace.json.gz" if gz else "rank0.pt.trace.json")
    p.write_bytes(gzip.compress(text) if gz else text)
    try:
        t = read_trace_dir(p)
    except EpTraceError as exc:
        assert "\n" not in str(exc)
        return
    t.validate()
    if t.events.height:
        assert (t.events["end_ns"] >= t.events["start_ns"]).all()
        assert int(t.events["end_ns"].max()) - int(t.events["start_ns"].min()) <= 7 * 86_400 * 10**9

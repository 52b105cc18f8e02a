"""A rank off its host's clock (issue 40): aligned on its own from matched calls, or refused naming it;
never a barrier wait longer than the step. The causality tolerance is the clock error between clock
domains, not the end spread of one host's ranks."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from ep_trace import load
from ep_trace.analysis import analyze
from ep_trace.analysis.clocks import uncertainty
from ep_trace.errors import BadInputError

from .conftest import T0, gpu_job

BALANCED = Path(__file__).resolve().parents[2] / "sample_traces" / "balanced"
STARTS = [200_000, 250_000, 300_000, 500_000]


def _shift_rank(src: Path, dst: Path, rank: int, shift_us: float) -> Path:
    """A copy of a demo trace set whose rank ``rank`` has every timestamp moved by ``shift_us``."""
    shutil.copytree(src, dst)
    p = dst / f"rank{rank}.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(p.read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and "ts" in e:
            e["ts"] += shift_us
    p.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    return dst


@pytest.fixture(scope="module")
def balanced():
    return load(BALANCED)


@pytest.mark.parametrize(("shift_us", "moved"), [(50_000, "-50.1 ms"), (3.6e9, "-3,600.0 s")])
def test_a_shifted_rank_is_aligned_on_its_own(tmp_path, balanced, shift_us, moved):
    a = load(_shift_rank(BALANCED, tmp_path / "t", 1, shift_us))
    # rank 1 (host vm, shared with ranks 0, 2, 3) gets a clock domain of its own, moved back
    clock = {h: (o, n, al) for h, o, n, al in a.clock.select("host", "offset_ns", "n_calls", "aligned").iter_rows()}
    assert set(clock) == {"vm", "vm/rank1"} and clock["vm/rank1"][1:] == (18, True)
    assert abs(clock["vm/rank1"][0] + shift_us * 1000) < 200_000  # within 0.2 ms of the shift
    size = "50.0 ms" if shift_us == 50_000 else "3,600.0 s"
    assert (
        f"rank 1: its collectives end {size} from those of the other ranks of host vm, whose clock it shares "
        f"(median over 18 matched calls; on one clock they end within 6.4 ms of each other): its clock is moved "
        f"by {moved} on its own (its own clock domain)"
    ) in a.notes
    # the waits are those of the unshifted set (within the alignment error), each below the step
    got = a.rank_summary.sort("rank")
    ref = balanced.rank_summary.sort("rank")
    for w, w0, st in zip(got["barrier_wait_ns"], ref["barrier_wait_ns"], got["step_time_ns"], strict=True):
        assert abs(w - w0) < 1_000_000 and 0 <= w <= st
    assert a.calls["valid"].all()


def _one_host_job(shift_ns: int) -> pl.DataFrame:
    """:func:`gpu_job` with all 4 ranks on host A and rank 3's every time moved by ``shift_ns``."""
    t = gpu_job(STARTS, 600_000)
    sh = {"rank": 3}
    ranks = t.ranks.with_columns(pl.lit("A").alias("host"))

    def move(df: pl.DataFrame, cols: tuple[str, ...]) -> pl.DataFrame:
        on3 = pl.col("rank") == sh["rank"]
        return df.with_columns(pl.when(on3).then(pl.col(c) + shift_ns).otherwise(pl.col(c)).alias(c) for c in cols)

    ev = move(t.events, ("start_ns", "end_ns"))
    co = move(t.collectives, ("start_ns", "end_ns", "cpu_start_ns", "cpu_end_ns"))
    return type(t)(**{**t.__dict__, "ranks": ranks, "events": ev, "collectives": co})


def test_a_shifted_rank_with_too_few_calls_is_refused_naming_it():
    with pytest.raises(BadInputError) as exc:
        analyze(_one_host_job(5_000_000))
    assert str(exc.value) == (
        "rank 3: its collectives end 5.0 ms from those of the other ranks of host A, whose clock it shares "
        "(median over 1 matched calls; on one clock they end within 100.0 µs of each other): its timestamps are "
        "shifted, or its calls are paired with the wrong calls of its peers (a collective renamed or missing on "
        "that rank), and 1 calls are too few to align its clock (8 needed); fix the rank's trace (its clock: "
        "baseTimeNanoseconds / the nsys session start; its collectives) or analyse the job without it"
    )


def test_alignment_off_refuses_a_shifted_rank():
    from ep_trace.analysis import AnalysisConfig

    with pytest.raises(BadInputError, match=r"^rank 3: .*clock alignment is off \(align_clocks=False\); turn it on"):
        analyze(_one_host_job(5_000_000), AnalysisConfig(align_clocks=False, min_clock_calls=1))


def test_a_small_shift_inside_the_call_window_is_left_alone():
    # 30 µs < 2 x the 100 µs window + 10 µs: a shared clock can look like that; waits stay bounded
    a = analyze(_one_host_job(30_000))
    assert a.clock["host"].to_list() == ["A"]
    st = a.steps.sort("rank")
    assert (st["barrier_wait_ns"] <= st["step_time_ns"]).all()


def test_one_clock_has_no_uncertainty_between_domains():
    cr = pl.DataFrame({"match_id": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "end_ns": [T0, T0 + 5_000_000, T0, T0 + 9]})
    one = pl.DataFrame({"rank": [0, 1], "host": ["a", "a"]})
    two = pl.DataFrame({"rank": [0, 1], "host": ["a", "b"]})
    assert uncertainty(cr, one) == 0  # the spread of one host's ends is no clock error
    assert uncertainty(cr, two) == 2_500_004  # median over the 2 calls of |5 ms|, |9 ns|


def test_a_clock_that_jumps_mid_trace_is_refused(tmp_path):
    # rank 1's clock jumps 50 ms forward after its first half: no single offset fits its calls
    dst = tmp_path / "t"
    shutil.copytree(BALANCED, dst)
    p = dst / "rank1.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(p.read_bytes()))
    ts = sorted(e["ts"] for e in doc["traceEvents"] if isinstance(e, dict) and "ts" in e)
    mid = ts[len(ts) // 2]
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and e.get("ts", -1) >= mid:
            e["ts"] += 50_000
    p.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    with pytest.raises(BadInputError, match=r"^rank 1: .* and still .* after moving its clock by .*its clock jumps"):
        load(dst)

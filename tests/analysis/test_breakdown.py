"""The per-rank step time breakdown (analysis/breakdown.py): exact answers, properties, real traces."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.analysis.breakdown import BREAKDOWN_PARTS, step_breakdown, top_kernels, top_ops

T0 = 1_000_000_000


def _iv(rows: list[tuple], cols: tuple[str, ...] = ("rank", "step", "start_ns", "end_ns")) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=dict.fromkeys(cols, pl.Int64), orient="row")


def _act(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, "step": pl.Int64, "cls": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )


def test_golden_breakdown_exact_parts():
    # step [0, 100): compute [0, 40), comm [30, 70) (wait [40, 55) inside it), host call [75, 90) with
    # a memcpy [80, 85) under it (the copy's time, not a stall), nothing in [90, 100)
    win = _iv([(0, 1, T0, T0 + 100)])
    act = _act([(0, 1, "compute", T0, T0 + 40), (0, 1, "comm", T0 + 30, T0 + 70), (0, 1, "memory", T0 + 80, T0 + 85)])
    waits = _iv([(0, 1, T0 + 40, T0 + 55)])
    stalls = _iv([(0, 1, T0 + 75, T0 + 90)])
    b = step_breakdown(win, act, waits, stalls).row(0, named=True)
    assert b == {
        "rank": 0,
        "step": 1,
        "compute_ns": 30,
        "overlapped_comm_ns": 10,
        "exposed_comm_ns": 15,
        "barrier_wait_ns": 15,
        "copy_ns": 5,
        "host_stall_ns": 10,
        "idle_ns": 15,
        "step_time_ns": 100,
    }


def test_intervals_are_clipped_to_the_step_and_unassigned_rows_ignored():
    win = _iv([(0, 0, T0, T0 + 50), (0, 1, T0 + 50, T0 + 100)])
    # a step-0 kernel running past its window is cut at 50; a row without a step is not counted
    act = _act([(0, 0, "compute", T0 + 10, T0 + 70), (0, None, "compute", T0 + 60, T0 + 99)])
    b = step_breakdown(win, act, _iv([]), _iv([])).sort("step")
    assert b["compute_ns"].to_list() == [40, 0]
    assert b["idle_ns"].to_list() == [10, 50]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["compute", "comm", "memory", "wait", "stall"]), st.integers(-20, 120), st.integers(1, 60)
        ),
        max_size=25,
    )
)
def test_parts_are_non_negative_and_sum_to_the_step(rows):
    win = _iv([(0, 0, T0, T0 + 100)])
    act = _act([(0, 0, c, T0 + s, T0 + s + d) for c, s, d in rows if c in ("compute", "comm", "memory")])
    waits = _iv([(0, 0, T0 + s, T0 + s + d) for c, s, d in rows if c == "wait"])
    stalls = _iv([(0, 0, T0 + s, T0 + s + d) for c, s, d in rows if c == "stall"])
    b = step_breakdown(win, act, waits, stalls).row(0, named=True)
    assert all(b[p] >= 0 for p in BREAKDOWN_PARTS)
    assert sum(b[p] for p in BREAKDOWN_PARTS) == b["step_time_ns"] == 100


def test_top_kernels_carry_their_stage():
    act = pl.DataFrame(
        {
            "rank": [0, 0, 0],
            "step": [0, 0, 0],
            "cls": ["compute", "compute", "comm"],
            "name": ["gemm", "gemm", "nccl"],
            "start_ns": [10, 30, 50],
            "end_ns": [25, 45, 90],
            "anchor_ns": [5, 28, 48],
        }
    )
    stages = pl.DataFrame(
        {"rank": [0, 0], "cpu_start_ns": [0, 46], "cpu_end_ns": [29, 60], "stage": ["expert", "dispatch"]}
    )
    tk = top_kernels(act, stages)
    assert tk.rows() == [(0, "nccl", "dispatch", 40, 1), (0, "gemm", "expert", 30, 2)]
    ev = pl.DataFrame(
        {
            "rank": [0, 0],
            "kind": ["cpu_op", "cpu_op"],
            "name": ["aten::mm", "aten::mm"],
            "start_ns": [1, 500],
            "end_ns": [9, 600],
        }
    )
    win = pl.DataFrame({"rank": [0], "step": [0], "start_ns": [0], "end_ns": [100]})
    assert top_ops(ev, win, stages).rows() == [(0, "aten::mm", "expert", 8, 1)]  # the op outside the step is left out


def test_top_rows_stage_ties_and_order():
    """Per (rank, name) the stage with most time wins; equal times go to the first stage by name,
    a stage beats no stage; rows by rank, then total time (descending), then name; ``n`` per rank."""
    from ep_trace.analysis.breakdown import _top

    rows = [
        (0, "a", "expert", 0, 10),
        (0, "a", "dispatch", 20, 30),  # a: expert 10 = dispatch 10 -> dispatch (by name)
        (0, "a", None, 40, 60),  # ... and the null stage has more time (20): still null wins on time
        (0, "b", None, 0, 5),
        (0, "b", "combine", 10, 15),  # b: combine 5 = null 5 -> combine (a stage beats none)
        (0, "c", "expert", 0, 45),
        (1, "a", "route", 0, 7),
        (1, "z", None, 0, 7),  # rank 1: equal totals ordered by name
    ]
    df = pl.DataFrame(
        rows,
        schema={"rank": pl.Int32, "name": pl.Utf8, "stage": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64},
        orient="row",
    )
    assert _top(df, 2).rows() == [
        (0, "c", "expert", 45, 1),
        (0, "a", None, 40, 3),
        (1, "a", "route", 7, 1),
        (1, "z", None, 7, 1),
    ]
    assert _top(df, 5).filter(pl.col("name") == "b").rows() == [(0, "b", "combine", 10, 2)]


@pytest.mark.parametrize(
    "rel",
    ["kineto/param_dlrm_8rank", "nsys/nsys_ai_2gpu/mfu_2gpu_before.sqlite", "kineto/hta_torchrec_pair"],
)
def test_real_traces_breakdown_is_consistent(external_dir, rel):
    import ep_trace

    a = ep_trace.load(external_dir / rel)
    b = a.breakdown
    assert b is not None and b.height == a.steps.height
    assert (b.select(pl.sum_horizontal(*BREAKDOWN_PARTS)).to_series() == b["step_time_ns"]).all()
    assert b.select(pl.min_horizontal(*BREAKDOWN_PARTS)).to_series().min() >= 0
    j = b.join(a.steps, on=["rank", "step"], suffix="_s")
    # the two comm parts and the overlap are the same sets as the steps table measures
    assert (j["overlapped_comm_ns"] <= j["overlapped_ns"]).all()
    assert (j["exposed_comm_ns"] + j["barrier_wait_ns"] <= j["exposed_comm_ns_s"] + j["barrier_wait_ns_s"]).all()
    assert a.top_kernels is not None and a.top_kernels.height > 0
    assert a.top_ops is not None


def test_demo_sample_breakdown_matches_steps(samples_dir):
    import ep_trace

    a = ep_trace.load(samples_dir / "skewed_straggler")
    j = a.breakdown.join(a.steps, on=["rank", "step"], suffix="_s")
    # CPU (gloo) run: every wait span lies inside C, so wait + exposed transfer = |C \ K| exactly
    assert (j["exposed_comm_ns"] + j["barrier_wait_ns"] == j["exposed_comm_ns_s"]).all()
    assert (j["overlapped_comm_ns"] == j["overlapped_ns"]).all()
    assert (j["barrier_wait_ns"] == j["barrier_wait_ns_s"]).all()
    top = a.top_kernels.filter(pl.col("rank") == 0)
    assert "expert" in top["stage"].to_list()


def test_summary_breakdown_per_rank_sums_to_the_step(samples_dir):
    import ep_trace

    a = ep_trace.load(samples_dir / "skewed_straggler")
    rows = a.summary()["breakdown"]
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    parts = ("compute_ns", "overlapped_comm_ns", "exposed_comm_ns", "barrier_wait_ns", "host_stall_ns", "idle_ns")
    for r in rows:
        assert r["n_steps"] == a.steps.filter(a.steps["rank"] == r["rank"]).height
        assert abs(sum(r[p] for p in parts) - r["step_time_ns"]) <= len(parts)  # means rounded to 1 ns each
        assert min(r[p] for p in parts) >= 0

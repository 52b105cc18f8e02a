"""CPU (gloo) ranks: what counts as compute while a collective is in flight."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis import analyze

from .conftest import T0, build


def _gloo_rank(extra_ops: list[dict]) -> dict:
    """One gloo rank, one step [0, 1000 µs]: a custom autograd wrapper op [100, 600] µs encloses the
    caller's c10d::alltoall_base_ [110, 120] µs; the gloo worker transfers [110, 500] µs and the
    wrapper's remaining self time is work.wait() (no op of its own in gloo traces)."""
    us = 1_000
    ev = [
        {
            "kind": "cpu_annotation",
            "name": "ProfilerStep#0",
            "tid": 1,
            "start_ns": T0,
            "end_ns": T0 + 1000 * us,
            "seq": 0,
        },
        {"kind": "cpu_op", "name": "_A2ABackward", "tid": 1, "start_ns": T0 + 100 * us, "end_ns": T0 + 600 * us},
        {
            "kind": "cpu_op",
            "name": "c10d::alltoall_base_",
            "tid": 1,
            "start_ns": T0 + 110 * us,
            "end_ns": T0 + 120 * us,
        },
        {
            "kind": "comm_worker",
            "name": "gloo:all_to_all",
            "tid": 2,
            "start_ns": T0 + 110 * us,
            "end_ns": T0 + 500 * us,
            "coll_id": 0,
        },
        {"kind": "cpu_op", "name": "aten::mm", "tid": 1, "start_ns": T0 + 700 * us, "end_ns": T0 + 900 * us},
        *extra_ops,
    ]
    for e in ev:
        e["rank"] = 0
    coll = {
        "rank": 0,
        "coll_id": 0,
        "ordinal": 0,
        "op_id": 2,
        "cpu_start_ns": T0 + 110 * us,
        "cpu_end_ns": T0 + 120 * us,
        "start_ns": T0 + 110 * us,
        "end_ns": T0 + 500 * us,
    }
    return {"ranks": [{"rank": 0, "world_size": 1, "host": "h"}], "events": ev, "colls": [coll]}


def test_wrapper_waiting_on_a_collective_is_not_compute() -> None:
    job = _gloo_rank([])
    a = analyze(build(job["ranks"], job["events"], job["colls"]))
    row = a.steps.filter(pl.col("rank") == 0).row(0, named=True)
    assert row["comm_ns"] == 390_000  # [110, 500] µs
    assert row["compute_ns"] == 200_000  # aten::mm only; the wrapper's wait is not compute
    assert row["overlapped_ns"] == 0
    assert row["exposed_comm_ns"] == 390_000


def test_real_compute_during_the_transfer_is_overlap() -> None:
    us = 1_000
    # a chunked pipeline: the next chunk's GEMM runs on the caller thread while the worker transfers
    mm = {"kind": "cpu_op", "name": "aten::mm", "tid": 1, "start_ns": T0 + 300 * us, "end_ns": T0 + 400 * us}
    job = _gloo_rank([])
    job["events"] = [e for e in job["events"] if e["name"] != "_A2ABackward"] + [{**mm, "rank": 0}]
    a = analyze(build(job["ranks"], job["events"], job["colls"]))
    row = a.steps.filter(pl.col("rank") == 0).row(0, named=True)
    assert row["overlapped_ns"] == 100_000
    assert row["exposed_comm_ns"] == 290_000

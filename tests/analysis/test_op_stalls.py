"""Stalled op calls of CPU ranks' permute / unpermute: golden frames whose answer is known."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.op_stalls import STALL_SCHEMA, stage_op_stalls, stall_share

US = 1_000


def _ev(rows: list[tuple[int, int, str, int, int]]) -> pl.DataFrame:
    """rows = (rank, tid, name, start_us, end_us) of cpu_op events."""
    return pl.DataFrame(
        [(r, t, "cpu_op", n, s * US, e * US) for r, t, n, s, e in rows],
        schema={
            "rank": pl.Int32,
            "tid": pl.Int64,
            "kind": pl.Utf8,
            "name": pl.Utf8,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
        orient="row",
    )


def _stages(rows: list[tuple[int, int | None, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(r, st, stage, s * US, e * US) for r, st, stage, s, e in rows],
        schema={"rank": pl.Int32, "step": pl.Int64, "stage": pl.Utf8, "cpu_start_ns": pl.Int64, "cpu_end_ns": pl.Int64},
        orient="row",
    )


# Two ranks permute the same rows in 2 steps. Rank 0: index_select 100 us each time. Rank 1: one
# 100 us call, one 5,000 us call (a stall of 4,900 us over rank 0's median), an empty_like of
# 3,000 us (its usual time on rank 0 is 10 us) holding a nested empty_strided (not top-level:
# counted once), a 500 us index_select in a third window (5x: slow, not a stall) and a 900 us empty
# (90x its 10 us, but under the 1 ms floor). A permute window outside the analysed steps (step null)
# holds a 9 ms call that is not counted.
STAGES = _stages(
    [
        (0, 0, "permute", 0, 1_000),
        (0, 1, "permute", 10_000, 11_000),
        (1, 0, "permute", 0, 10_000),
        (1, 1, "permute", 20_000, 30_000),
        (1, 2, "permute", 40_000, 41_000),
        (1, None, "permute", 50_000, 60_000),
        (0, 0, "expert", 1_000, 9_000),
    ]
)
EV = _ev(
    [
        (0, 1, "aten::index_select", 0, 100),
        (0, 1, "aten::empty_like", 200, 210),
        (0, 1, "aten::empty", 300, 310),
        (0, 1, "aten::index_select", 10_000, 10_100),
        (0, 1, "aten::empty_like", 10_200, 10_210),
        (0, 1, "aten::mm", 1_000, 9_000),  # expert stage: not looked at
        (1, 1, "aten::index_select", 0, 100),
        (1, 1, "aten::empty_like", 200, 3_200),
        (1, 1, "aten::empty_strided", 210, 3_190),
        (1, 1, "aten::empty", 4_000, 4_900),
        (1, 1, "aten::index_select", 20_000, 25_000),
        (1, 1, "aten::empty_like", 26_000, 26_010),
        (1, 1, "aten::index_select", 40_000, 40_500),
        (1, 1, "aten::index_select", 50_000, 59_000),
    ]
)


def test_golden_stalls_against_the_fastest_ranks_median() -> None:
    got = stage_op_stalls(EV, STAGES, frozenset({0, 1}))
    assert got.schema == pl.Schema(STALL_SCHEMA)
    rows = {r["rank"]: r for r in got.iter_rows(named=True)}
    assert rows[0] == {
        "rank": 0, "stage": "permute", "busy_ns": 230 * US, "stall_ns": 0, "stall_calls": 0, "top_op": None,
    }  # fmt: skip
    # rank 1: index_select 5,000 - 100 (rank 0's median) and empty_like 3,000 - 10; its 500 us call,
    # its 900 us empty, the nested empty_strided and the call outside the analysed steps are no stalls
    assert rows[1] == {
        "rank": 1,
        "stage": "permute",
        "busy_ns": (100 + 3_000 + 900 + 5_000 + 10 + 500) * US,
        "stall_ns": (4_900 + 2_990) * US,
        "stall_calls": 2,
        "top_op": "aten::index_select",
    }
    share = stall_share(got)
    assert share[0] == 0.0 and abs(share[1] - 7_890 / 9_510) < 1e-12


def test_gpu_ranks_and_no_stages_give_no_rows() -> None:
    assert stage_op_stalls(EV, STAGES, frozenset()).is_empty()
    assert stage_op_stalls(EV, STAGES.filter(pl.col("stage") == "expert"), frozenset({0, 1})).is_empty()
    assert stall_share(pl.DataFrame(schema=STALL_SCHEMA)) == {}

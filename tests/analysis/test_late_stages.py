"""Where a straggler's lateness lies (analysis.late_stages), on tiny stage tables with known answers."""

from __future__ import annotations

import polars as pl

import ep_trace
from ep_trace.analysis.late_stages import late_stages

MS = 1_000_000


def _stages(rows: list[tuple[int, int, str, int, int, int]]) -> pl.DataFrame:
    """rows: (rank, step, stage, host range ms, device window ms, busy ms); comm only in dispatch."""
    return pl.DataFrame(
        {
            "rank": [r[0] for r in rows],
            "step": [r[1] for r in rows],
            "stage": [r[2] for r in rows],
            "cpu_start_ns": [0 for _ in rows],
            "cpu_end_ns": [r[3] * MS for r in rows],
            "window_ns": [r[4] * MS for r in rows],
            "busy_ns": [r[5] * MS for r in rows],
            "comm_ns": [r[4] * MS if r[2] == "dispatch" else 0 for r in rows],
        },
        schema_overrides={"rank": pl.Int32},
    )


def _three_ranks(sleep_ms: int) -> pl.DataFrame:
    rows = []
    for step in (0, 1):
        for rank in (0, 1, 2):
            expert = 10 + (sleep_ms if rank == 2 else 0)
            rows += [
                (rank, step, "permute", 2, 2, 2),
                (rank, step, "dispatch", 5 if rank == 2 else 5 + sleep_ms, 5, 1),  # the others wait here
                (rank, step, "expert", expert, 10, 10),
            ]
    return _stages(rows)


def test_a_sleep_in_the_expert_stage_is_its_excess_and_idle():
    late = late_stages(_three_ranks(30), pl.DataFrame(), 2, frozenset({0, 1, 2}))
    assert late.rows() == [("expert", 30 * MS, 30 * MS)]  # dispatch (where the others wait) is left out


def test_gpu_ranks_read_the_device_window_not_the_host_range():
    # same table, GPU ranks: the device windows are equal, so no stage is late
    assert late_stages(_three_ranks(30), pl.DataFrame(), 2).is_empty()


def test_more_tokens_are_not_lateness():
    # rank 2 receives twice the rows and takes twice the expert time: no excess
    rows = [(r, s, "expert", 20 if r == 2 else 10, 0, 20 if r == 2 else 10) for s in (0, 1) for r in (0, 1, 2)]
    load = pl.DataFrame(
        {"rank": [0, 1, 2] * 2, "step": [0, 0, 0, 1, 1, 1], "recv_rows": [100, 100, 200] * 2},
        schema_overrides={"rank": pl.Int32},
    )
    assert late_stages(_stages(rows), load, 2, frozenset({0, 1, 2})).is_empty()
    # without the counts the same 10 ms per step is excess, all of it in ops (not idle)
    assert late_stages(_stages(rows), pl.DataFrame(), 2, frozenset({0, 1, 2})).rows() == [("expert", 10 * MS, 0)]


def test_a_single_rank_has_no_reference():
    assert late_stages(_stages([(0, 0, "expert", 5, 5, 5)]), pl.DataFrame(), 0, frozenset({0})).is_empty()


def test_straggler_remedy_points_at_the_idle_expert_stage(samples_dir):
    """sample_traces/skewed_straggler: rank 2 sleeps 30 ms in each of its 2 expert stages."""
    a = ep_trace.load(samples_dir / "skewed_straggler")
    f = next(f for f in a.findings if f.kind == "straggler_wait")
    assert f.ranks == (2,)
    late = f.evidence["late_by_stage_ns_per_step"]
    idle = f.evidence["late_idle_ns_per_step"]
    assert next(iter(late)) == "expert" and 55 * MS <= idle["expert"] <= 65 * MS  # the 2 x 30 ms sleep
    assert f.remedy.startswith(
        "Rank 2's extra time is in its expert stage: 77.8 ms per step above the other ranks' (scaled to its load), "
        "61.5 ms of it with none of the stage's ops running: look there for a sleep, a lock, a blocking call"
    )
    # rank 2's transfers are longer than the others' here: the network is not ruled out
    assert "not the network" not in f.remedy

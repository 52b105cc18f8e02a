"""The EP invariants on routing counts and count matrices whose violations are placed by hand."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.ep_invariants import ep_invariants
from ep_trace.analysis.placement import Placement

# 2 ranks, 4 experts, rank r holds experts 2r, 2r+1; C[src][e] with 8 tokens x top-2 per rank
C = [[6, 4, 3, 3], [1, 2, 5, 8]]
OWN = Placement(((0,), (0,), (1,), (1,)), (0, 1))


def _rc(
    counts: list[list[int]], tokens: int | None = 8, dropped: int | None = None, padded: int | None = None
) -> pl.DataFrame:
    rows = [(r, 0, 0, 0, e, c, tokens, 2, dropped, padded) for r, row in enumerate(counts) for e, c in enumerate(row)]
    return pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int32,
            "step": pl.Int64,
            "layer": pl.Int32,
            "microbatch": pl.Int32,
            "expert": pl.Int32,
            "count": pl.Int64,
            "tokens": pl.Int64,
            "top_k": pl.Int32,
            "dropped": pl.Int64,
            "padded": pl.Int64,
        },
        orient="row",
    )


def _cm(rows: dict[tuple[int, int], int]) -> pl.DataFrame:
    return pl.DataFrame(
        [(0, 0, 0, "dispatch", 0, s, d, n, 1024, "sidecar") for (s, d), n in rows.items()],
        schema={
            "step": pl.Int64,
            "layer": pl.Int32,
            "microbatch": pl.Int32,
            "direction": pl.Utf8,
            "call": pl.Int64,
            "src": pl.Int32,
            "dst": pl.Int32,
            "rows": pl.Int64,
            "row_bytes": pl.Int64,
            "source": pl.Utf8,
        },
        orient="row",
    )


NO_VIOL = pl.DataFrame(
    schema={
        "step": pl.Int64,
        "call": pl.Int64,
        "src": pl.Int32,
        "dst": pl.Int32,
        "sent": pl.Int64,
        "received": pl.Int64,
    }
)
GOOD = {(0, 0): 10, (0, 1): 6, (1, 0): 3, (1, 1): 13}


def _owners(placement: Placement, step: int = 0) -> pl.DataFrame:
    """The placement in force at (step, layer 0)."""
    return placement.frame().with_columns(pl.lit(step, pl.Int64).alias("step"), pl.lit(0, pl.Int32).alias("layer"))


def _check(
    rc: pl.DataFrame, cm: pl.DataFrame, placement: Placement | None = OWN, recorded: bool = True
) -> dict[str, dict]:
    out = ep_invariants(rc, cm, NO_VIOL, _owners(placement) if placement is not None and recorded else None, 8)
    return {r["check"]: r for r in out.iter_rows(named=True)}


def test_all_hold():
    r = _check(_rc(C), _cm(GOOD))
    assert {k: v["status"] for k, v in r.items()} == {
        "assignment_conservation": "ok",
        "ownership": "ok",
        "split_consistency": "ok",
    }
    assert r["assignment_conservation"]["detail"] == (
        "2 routing decisions: Σ counts = tokens × top_k in 2; 2 (step, layer, rank) dispatches: rows sent = Σ counts in 2"
    )
    assert r["ownership"]["checked"] == 4


def test_a_decision_with_more_assignments_than_tokens_times_top_k():
    r = _check(_rc(C, tokens=7), _cm(GOOD))["assignment_conservation"]
    assert (r["status"], r["violations"]) == ("violated", 2)
    assert "first off: rank 0 step 0 layer 0: 16 assignments for 7 tokens × top-2" in r["detail"]


def test_dropped_and_padded_rows_are_counted_and_named():
    # rank 0 (8 tokens x top-2 = 16 assignments) dropped 2 of expert 2's and padded 1 row for it: its
    # counts hold the 15 it dispatched (docs/sidecar.md), 2 + 3 of them to rank 1
    rows = dict(GOOD)
    rows[(0, 1)] = 6 - 2 + 1
    rc = pl.concat(
        [
            _rc([[6, 4, 2, 3], [0] * 4], dropped=2, padded=1).filter(pl.col("rank") == 0),
            _rc(C).filter(pl.col("rank") == 1),
        ]
    )
    r = _check(rc, _cm(rows), None, False)["assignment_conservation"]
    assert r["status"] == "ok"
    assert r["detail"] == (
        "2 routing decisions: Σ counts = tokens × top_k − dropped + padded in 2, 2 dropped, 1 padding; "
        "2 (step, layer, rank) dispatches: rows sent = Σ counts in 2"
    )
    # the same counts read without the drops: 15 assignments for 8 tokens x top-2
    r = _check(rc.with_columns(pl.lit(None, pl.Int64).alias("dropped")), _cm(rows), None, False)
    r = r["assignment_conservation"]
    assert r["status"] == "violated"
    assert "first off: rank 0 step 0 layer 0: 15 assignments for 8 tokens × top-2 + 1 padding" in r["detail"]


def test_a_lost_assignment_breaks_conservation():
    rows = dict(GOOD)
    rows[(1, 1)] = 12
    r = _check(_rc(C), _cm(rows))["assignment_conservation"]
    assert r["status"] == "violated"
    assert "first off: rank 1 step 0 layer 0 sent 15 rows for 16 assignments" in r["detail"]


def test_rows_to_a_rank_that_does_not_hold_the_expert():
    # rank 0 sends its e2 rows (3) to itself instead of rank 1: totals still match, ownership does not
    rows = {(0, 0): 13, (0, 1): 3, (1, 0): 3, (1, 1): 13}
    r = _check(_rc(C), _cm(rows))
    assert r["assignment_conservation"]["status"] == "ok"
    assert r["ownership"]["status"] == "violated" and r["ownership"]["violations"] == 2
    assert (
        "first off: step 0 layer 0: rank 0 sent 13 rows to rank 0, whose experts were assigned 10..10"
        in r["ownership"]["detail"]
    )


def test_replicas_bound_the_rows_instead():
    both = Placement(((0, 1), (0,), (1,), (1,)), (0, 1))  # e0 on both ranks: rank 0's 6 may go either way
    rows = {(0, 0): 7, (0, 1): 9, (1, 0): 2, (1, 1): 14}
    assert _check(_rc(C), _cm(rows), both)["ownership"]["status"] == "ok"


def test_not_checkable_without_counts_or_placement():
    r = _check(_rc(C).head(0), _cm(GOOD))
    assert r["assignment_conservation"]["status"] == "not_checked" and r["ownership"]["status"] == "not_checked"
    r = _check(_rc(C), _cm(GOOD), OWN, recorded=False)
    assert r["ownership"]["detail"] == "no expert placement recorded (sidecar meta.placement or a routing dump's map)"


def test_each_step_is_checked_against_the_placement_in_force_at_it():
    # step 0 runs OWN; from step 1 the layer is re-placed (a placement record): e2 moves to rank 0
    moved = Placement(((0,), (0,), (0,), (1,)), (0, 1))
    rc = pl.concat([_rc(C), _rc(C).with_columns(pl.lit(1, pl.Int64).alias("step"))])
    step1 = {(0, 0): 13, (0, 1): 3, (1, 0): 8, (1, 1): 8}  # rank 1's 5 e2 rows now go to rank 0
    cm = pl.concat([_cm(GOOD), _cm(step1).with_columns(pl.lit(1, pl.Int64).alias("step"))])
    owners = pl.concat([_owners(OWN, 0), _owners(moved, 1)])
    out = {r["check"]: r for r in ep_invariants(rc, cm, NO_VIOL, owners, 8).iter_rows(named=True)}
    assert (out["ownership"]["status"], out["ownership"]["checked"]) == ("ok", 8)
    # the same rows judged against the placement at the start: step 1's e2 rows are off
    stale = pl.concat([_owners(OWN, 0), _owners(OWN, 1)])
    out = {r["check"]: r for r in ep_invariants(rc, cm, NO_VIOL, stale, 8).iter_rows(named=True)}
    assert (out["ownership"]["status"], out["ownership"]["violations"]) == ("violated", 4)
    assert (
        "first off: step 1 layer 0: rank 0 sent 13 rows to rank 0, whose experts were assigned 10..10"
        in (out["ownership"]["detail"])
    )

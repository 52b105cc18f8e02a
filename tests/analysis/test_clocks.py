"""Clock alignment across hosts: only from at least MIN_CALLS matched calls, residual shown."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.clocks import MIN_CALLS, estimate_offsets, residuals

T0 = 1_700_000_000_000_000_000
SKEW = 3_250_000  # host b's clock runs 3.25 ms ahead


def _calls(n: int) -> pl.DataFrame:
    rows = []
    for c in range(n):
        end = T0 + c * 1_000_000
        jitter = [0, 400, -300, 200][c % 4]  # per-call end spread between the ranks, ns
        rows += [
            {"match_id": c, "rank": 0, "end_ns": end},
            {"match_id": c, "rank": 1, "end_ns": end + jitter},
            {"match_id": c, "rank": 2, "end_ns": end + SKEW},
            {"match_id": c, "rank": 3, "end_ns": end + SKEW - jitter},
        ]
    return pl.DataFrame(rows)


RANKS = pl.DataFrame({"rank": [0, 1, 2, 3], "host": ["a", "a", "b", "b"]})


def test_enough_calls_align_and_the_residual_is_the_spread():
    cr = _calls(MIN_CALLS)
    off = estimate_offsets(cr, RANKS)
    # per call d = median(b) - median(a) = SKEW - jitter; the median over calls of the jitter is 100 ns
    assert off.sort("host").rows() == [("a", 0, MIN_CALLS, True), ("b", -(SKEW - 100), MIN_CALLS, True)]
    shift = RANKS.join(off, on="host").select("rank", "offset_ns")
    aligned = cr.join(shift, on="rank").with_columns(pl.col("end_ns") + pl.col("offset_ns"))
    res = residuals(aligned, RANKS).sort("host")
    # after alignment what is left is the jitter (at most 400 ns) and the 100 ns estimate error
    assert res["host"].to_list() == ["a", "b"]
    assert all(0 < r <= 500 for r in res["residual_ns"].to_list())


def test_too_few_calls_keep_the_recorded_clock():
    off = estimate_offsets(_calls(MIN_CALLS - 1), RANKS)
    assert off.sort("host").rows() == [("a", 0, MIN_CALLS - 1, True), ("b", 0, MIN_CALLS - 1, False)]
    assert estimate_offsets(_calls(20), RANKS, enabled=False)["offset_ns"].to_list() == [0, 0]

"""Property test: ``innermost_enclosing`` (the containment link of old traces, and the stage range
of an all-to-all) equals a brute-force scan on random properly nested host ops."""

from __future__ import annotations

import random

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.parsers.kineto_links import innermost_enclosing


def _nested(rng: random.Random, lo: int, hi: int, depth: int, out: list[tuple[int, int, int]]) -> None:
    """Disjoint sibling intervals inside [lo, hi] (a child may share its parent's start or end), recursively."""
    t = lo
    while t < hi and depth < 4 and rng.random() < 0.8:
        s = rng.randint(t, hi)
        e = rng.randint(s, min(hi, s + (hi - lo) // 2 + 1))
        out.append((s, e, depth))
        _nested(rng, s, e, depth + 1, out)
        t = e + 1 + rng.randint(0, 3)  # strictly after the sibling: no point is in two siblings


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), threads=st.integers(1, 3))
def test_innermost_enclosing_equals_brute_force(seed, threads):
    rng = random.Random(seed)
    ops, points = [], []
    for tid in range(threads):
        ivs: list[tuple[int, int, int]] = []
        _nested(rng, 0, 200, 0, ivs)
        ops += [(7, tid, s, e, d) for s, e, d in ivs]
        points += [(7, tid, rng.randint(-5, 205)) for _ in range(25)]
    ops_df = (
        pl.DataFrame(
            ops,
            schema={"pid": pl.Int64, "tid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "d": pl.Int64},
            orient="row",
        )
        .with_row_index("op")
        .with_columns(pl.col("op").cast(pl.Int64))
    )
    pts = pl.DataFrame(points, schema={"pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64}, orient="row").with_row_index(
        "i"
    )
    got = dict(innermost_enclosing(pts, ops_df.drop("d")).select("i", "op").iter_rows())
    for i, pid, tid, t in pts.iter_rows():
        inside = [
            r
            for r in ops_df.iter_rows(named=True)
            if r["pid"] == pid and r["tid"] == tid and r["start_ns"] <= t <= r["end_ns"]
        ]
        want = max(inside, key=lambda r: r["d"])["op"] if inside else None
        assert got[i] == want, (t, inside)

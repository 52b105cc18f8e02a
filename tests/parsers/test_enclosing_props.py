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


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.integers(-3, 40), st.integers(0, 12)), min_size=1, max_size=40
    ),  # (thread, start, duration): overlapping, equal and zero-length intervals, not nested
    ts=st.lists(st.integers(-5, 60), min_size=1, max_size=20),
    offset=st.sampled_from([0, 1_700_000_000_000_000_000]),  # epoch ns: the packed key stays exact
)
def test_packed_enclosing_equals_asof_path_on_any_intervals(ops, ts, offset):
    """The numpy path (one packed key, binary searches) gives the as-of join path's answer on every
    input it accepts, improperly nested ops included (old traces have some: hta_torchrec16_rank0)."""
    from unittest import mock

    from ep_trace.parsers import kineto_links

    ops_df = pl.DataFrame(
        {
            "pid": [1] * len(ops),
            "tid": [t for t, _, _ in ops],
            "start_ns": [offset + s for _, s, _ in ops],
            "end_ns": [offset + s + d for _, s, d in ops],
            "op": [100 + i for i in range(len(ops))],
        }
    )
    pts = pl.DataFrame({"pid": [1] * len(ts), "tid": [i % 4 for i in range(len(ts))], "t": [offset + t for t in ts]})
    pts = pts.with_row_index("i")
    assert kineto_links._packed_enclosing(pts.sort("t"), ops_df, ["pid", "tid"]) is not None
    got = innermost_enclosing(pts, ops_df)
    with mock.patch.object(kineto_links, "_packed_enclosing", lambda *a: None):
        want = innermost_enclosing(pts, ops_df)
    assert got.equals(want), (got, want)
    # the thread numbers link_events passes (the points' threads; ops of other threads dropped)
    threads = pts.select("pid", "tid").unique(maintain_order=True).with_row_index("_g")
    numbered = innermost_enclosing(
        pts.join(threads, on=["pid", "tid"], how="left", maintain_order="left"),
        ops_df.join(threads, on=["pid", "tid"], how="inner", maintain_order="left"),
        thread_ids="_g",
    )
    assert dict(numbered.select("i", "op").iter_rows()) == dict(got.select("i", "op").iter_rows())

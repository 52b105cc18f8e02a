"""Interval algebra: exact small cases and hypothesis properties against a per-nanosecond reference."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.analysis.intervals import intersect, overlap_lengths, overlay, subtract, union, union_length


def _frame(ivs: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        {"g": [g for g, _, _ in ivs], "start_ns": [s for _, s, _ in ivs], "end_ns": [e for _, _, e in ivs]},
        schema={"g": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64},
    )


def _mask(ivs, g: int, n: int) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    for gg, s, e in ivs:
        if gg == g and e > s:
            m[s:e] = True
    return m


def _mask_of(df: pl.DataFrame, g: int, n: int) -> np.ndarray:
    return _mask([(r["g"], r["start_ns"], r["end_ns"]) for r in df.iter_rows(named=True)], g, n)


def test_union_exact():
    u = union(_frame([(0, 0, 10), (0, 5, 12), (0, 12, 15), (0, 20, 25), (1, 3, 4), (0, 30, 30)]), ["g"]).sort(
        "g", "start_ns"
    )
    assert u.rows() == [(0, 0, 15), (0, 20, 25), (1, 3, 4)]
    assert union_length(_frame([(0, 0, 10), (0, 5, 12)]), []).item() == 12


def test_overlap_exact():
    comm = _frame([(0, 0, 100), (0, 200, 300)])
    comp = _frame([(0, 50, 250)])
    r = overlap_lengths(comm, comp, ["g"]).row(0, named=True)
    assert r == {"g": 0, "a_ns": 200, "b_ns": 200, "both_ns": 100, "a_only_ns": 100}
    assert intersect(comm, comp, ["g"]).rows() == [(0, 50, 100), (0, 200, 250)]
    assert subtract(comm, comp, ["g"]).rows() == [(0, 0, 50), (0, 250, 300)]


ivl = st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 25)).map(lambda t: (t[0], t[1], t[1] + t[2]))


@settings(max_examples=100, deadline=None)
@given(st.lists(ivl, max_size=25), st.lists(ivl, max_size=25))
def test_algebra_matches_per_ns_reference(a, b):
    n = 100
    fa, fb = _frame(a), _frame(b)
    lens = {r["g"]: r for r in overlap_lengths(fa, fb, ["g"]).iter_rows(named=True)}
    seg = overlay(fa, fb, ["g"])
    for g in range(3):
        ma, mb = _mask(a, g, n), _mask(b, g, n)
        r = lens.get(g, {"a_ns": 0, "b_ns": 0, "both_ns": 0, "a_only_ns": 0})
        assert r["a_ns"] == ma.sum()
        assert r["b_ns"] == mb.sum()
        assert r["both_ns"] == (ma & mb).sum()
        assert r["a_only_ns"] == (ma & ~mb).sum()
        assert (_mask_of(union(fa, ["g"]), g, n) == ma).all()
        assert (_mask_of(intersect(fa, fb, ["g"]), g, n) == (ma & mb)).all()
        assert (_mask_of(subtract(fa, fb, ["g"]), g, n) == (ma & ~mb)).all()
        only_b = seg.filter(pl.col("state") == 2)
        assert (_mask_of(only_b, g, n) == (mb & ~ma)).all()
    u = union(fa, ["g"]).sort("g", "start_ns")
    # disjoint and non-touching within a group
    for g in range(3):
        ug = u.filter(pl.col("g") == g)
        assert (ug["start_ns"][1:].to_numpy() > ug["end_ns"][:-1].to_numpy()).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(ivl, max_size=15), st.lists(ivl, max_size=15))
def test_range_join_matches_cross_join(a, b):
    from ep_trace.analysis.intervals import range_join

    fa = _frame(a).with_row_index("i")
    fb = _frame(b).rename({"start_ns": "s2", "end_ns": "e2"}).with_row_index("j")
    got = sorted(range_join(fa, fb, ("start_ns", "end_ns"), ("s2", "e2"), by=("g",)).select("i", "j").rows())
    want = sorted(
        (i, j) for i, (g, s, e) in enumerate(a) for j, (g2, s2, e2) in enumerate(b) if g == g2 and s <= e2 and e >= s2
    )
    assert got == want


def _pairs_reference(a, b):
    return sorted(
        (i, j)
        for i, (g, s, e) in enumerate(a)
        for j, (g2, s2, e2) in enumerate(b)
        if g == g2 and None not in (s, e, s2, e2) and s <= e2 and e >= s2
    )


# spans that may end before they start (the inequality-join path) or have a null end
raw_ivl = st.tuples(st.integers(0, 2), st.integers(0, 60), st.one_of(st.none(), st.integers(-10, 25))).map(
    lambda t: (t[0], t[1], None if t[2] is None else t[1] + t[2])
)


@settings(max_examples=40, deadline=None)
@given(st.lists(raw_ivl, max_size=15), st.lists(raw_ivl, max_size=15), st.booleans())
def test_range_join_any_spans_and_string_keys(a, b, as_str):
    """Negative and null spans, and non-integer ``by`` keys (the keys-join path), give the same pairs
    as the cross-join reference; the output is ordered by left row, then right row."""
    from ep_trace.analysis.intervals import range_join

    fa = _frame(a).with_row_index("i")
    fb = _frame(b).rename({"start_ns": "s2", "end_ns": "e2"}).with_row_index("j")
    if as_str:
        fa, fb = fa.with_columns(pl.col("g").cast(pl.Utf8)), fb.with_columns(pl.col("g").cast(pl.Utf8))
    got = range_join(fa, fb, ("start_ns", "end_ns"), ("s2", "e2"), by=("g",)).select("i", "j").rows()
    want = _pairs_reference(a, b)
    assert sorted(got) == want
    if not any(s is None or e is None or e < s for _, s, e in a + b):
        assert got == want


def test_range_join_point_in_span_and_null_keys():
    from ep_trace.analysis.intervals import range_join

    left = pl.DataFrame({"g": [0, 0, None, 1], "t": [5, 10, 7, 3]}, schema={"g": pl.Int32, "t": pl.Int64})
    right = pl.DataFrame(
        {"g": [0, None, 1], "s": [5, 0, 4], "e": [10, 9, 8], "k": ["a", "b", "c"]},
        schema={"g": pl.Int32, "s": pl.Int64, "e": pl.Int64, "k": pl.Utf8},
    )
    out = range_join(left, right, ("t", "t"), ("s", "e"), by=("g",))
    assert out.columns == ["g", "t", "s", "e", "k"]
    # both ends of a span included; a null key matches a null key
    assert out.rows() == [(0, 5, 5, 10, "a"), (0, 10, 5, 10, "a"), (None, 7, 0, 9, "b")]

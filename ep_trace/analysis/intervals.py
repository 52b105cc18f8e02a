"""Interval algebra over polars frames: union, overlay, intersection and difference per group.

Every function takes frames with ``start_ns`` / ``end_ns`` (int64 ns, half-open ``[start, end)``)
plus grouping columns ``by`` and works for all groups at once with a sort + cumulative sweep
(no Python loop over intervals). Zero-length and negative intervals are ignored.

The sweep is HTA's (+1/-1 for A, +2/-2 for B, running sum 3 = both), applied to the *merged*
unions so that the running sum only takes the values 0..3.
"""

from __future__ import annotations

from typing import Literal, cast

import numpy as np
import polars as pl

__all__ = [
    "union",
    "union_length",
    "overlay",
    "overlap_lengths",
    "segment_lengths",
    "intersect",
    "subtract",
    "clip",
    "range_join",
    "top_level_cpu_ops",
]

_S, _E = "start_ns", "end_ns"
_G = "__g"


def _grouped(df: pl.DataFrame, by: list[str]) -> tuple[pl.DataFrame, list[str]]:
    if by:
        return df, by
    return df.with_columns(pl.lit(0, dtype=pl.Int8).alias(_G)), [_G]


def _strip(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    return df if by else df.drop(_G)


def union(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Merge overlapping or touching intervals within each group.

    Args:
        df: Frame with ``by`` columns and ``start_ns`` / ``end_ns`` (ns).
        by: Grouping columns (may be empty).

    Returns:
        Disjoint, sorted intervals: columns ``by + [start_ns, end_ns]``.
    """
    lf = df.lazy().select([*by, _S, _E])
    g = by if by else [_G]
    if not by:
        lf = lf.with_columns(pl.lit(0, dtype=pl.Int8).alias(_G))
    d = lf.filter(pl.col(_E) > pl.col(_S)).sort([*g, _S]).collect()  # one query
    fast = _union_sorted(d, g)
    if fast is not None:
        return _strip(fast, by)
    out = (
        d.with_columns(pl.col(_E).cum_max().shift(1).over(g).alias("__pm"))
        .with_columns((pl.col("__pm").is_null() | (pl.col(_S) > pl.col("__pm"))).cum_sum().over(g).alias("__seg"))
        .group_by([*g, "__seg"], maintain_order=True)
        .agg(pl.col(_S).min(), pl.col(_E).max())
        .drop("__seg")
    )
    return _strip(out, by)


def _union_sorted(d: pl.DataFrame, g: list[str]) -> pl.DataFrame | None:
    """:func:`union` of positive intervals sorted by ``g + [start_ns]``, as one numpy sweep.

    The group index (a running count of changes in ``g``) is packed into the high bits of the
    time, so one running maximum of the packed ends never carries an end across groups: a row
    opens a segment when it opens a group or starts after every earlier end of its group. Same
    rows as the polars form below (two window functions and a group-by: ~1.5-2x slower on the
    45 k device intervals of a block of 160 param DLRM ranks). ``None`` (use that form) when the
    times are not int64, span >= 2**46 ns or there are >= 2**16 groups.
    """
    if d.is_empty() or d.schema[_S] != pl.Int64 or d.schema[_E] != pl.Int64:
        return None if not d.is_empty() else d
    s, e = d[_S].to_numpy(), d[_E].to_numpy()
    if any(d[c].has_nulls() for c in g):
        changed = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in g]).fill_null(True)
        new_group = d.select(changed).to_series().to_numpy()
    else:
        new_group = np.zeros(d.height, dtype=bool)
        new_group[0] = True
        for c in g:
            a = d[c].to_numpy()
            new_group[1:] |= a[1:] != a[:-1]
    gi = np.cumsum(new_group, dtype=np.int64)
    t0 = int(s.min())
    if int(e.max()) - t0 >= 1 << _SHIFT or int(gi[-1]) >= 1 << (62 - _SHIFT):
        return None
    base = gi << _SHIFT
    ends = base + (e - t0)
    prev = np.empty_like(ends)
    prev[0] = -1
    np.maximum.accumulate(ends[:-1], out=prev[1:])
    idx = np.flatnonzero(new_group | (base + (s - t0) > prev))
    out = d[idx]
    out.replace_column(out.get_column_index(_E), pl.Series(_E, np.maximum.reduceat(e, idx), dtype=pl.Int64))
    return out


def union_length(df: pl.DataFrame, by: list[str], name: str = "length_ns") -> pl.DataFrame:
    """|union| per group, ns. Groups without a positive-length interval are absent."""
    u, g = _grouped(union(df, by), by)
    out = u.group_by(g, maintain_order=True).agg((pl.col(_E) - pl.col(_S)).sum().alias(name))
    return _strip(out, by)


def overlay(a: pl.DataFrame, b: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Split the timeline of each group into segments covered by A only, B only, or both.

    Returns:
        Columns ``by + [start_ns, end_ns, state]``; ``state`` 1 = A only, 2 = B only, 3 = A and B.
        Segments are disjoint; uncovered time is absent.
    """
    ua, g = _grouped(union(a, by), by)
    ub, _ = _grouped(union(b, by), by)
    pts = pl.concat(
        [
            ua.select([*g, pl.col(_S).alias("t"), pl.lit(1, pl.Int8).alias("d")]),
            ua.select([*g, pl.col(_E).alias("t"), pl.lit(-1, pl.Int8).alias("d")]),
            ub.select([*g, pl.col(_S).alias("t"), pl.lit(2, pl.Int8).alias("d")]),
            ub.select([*g, pl.col(_E).alias("t"), pl.lit(-2, pl.Int8).alias("d")]),
        ]
    ).sort([*g, "t"])
    # no window per group: each group's deltas sum to 0, so the running sum over the sorted frame is
    # the group's own; and a group's last point has state 0 (filtered), so the next row's time is
    # never read across groups
    seg = (
        pts.with_columns(
            pl.col("d").cast(pl.Int32).cum_sum().alias("state"),
            pl.col("t").shift(-1).alias("t_next"),
        )
        .filter((pl.col("state") > 0) & (pl.col("t_next") > pl.col("t")))
        .select([*g, pl.col("t").alias(_S), pl.col("t_next").alias(_E), pl.col("state").cast(pl.Int8)])
    )
    return _strip(seg, by)


def overlap_lengths(a: pl.DataFrame, b: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group: |A|, |B|, |A ∩ B|, |A \\ B| in ns (zeros where a side is empty).

    Returns:
        Columns ``by + [a_ns, b_ns, both_ns, a_only_ns]`` for every group present in A or B.
    """
    return segment_lengths(overlay(a, b, by), by)


def segment_lengths(segments: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """:func:`overlap_lengths` from an :func:`overlay` already computed (for callers that also need
    its segments, e.g. the A \\ B intervals: ``union(segments.filter(state == 1), by)``)."""
    seg, g = _grouped(segments, by)
    ln = pl.col(_E) - pl.col(_S)
    st = pl.col("state")
    return _strip(
        seg.group_by(g, maintain_order=True).agg(
            ln.filter(st.is_in([1, 3])).sum().alias("a_ns"),
            ln.filter(st.is_in([2, 3])).sum().alias("b_ns"),
            ln.filter(st == 3).sum().alias("both_ns"),
            ln.filter(st == 1).sum().alias("a_only_ns"),
        ),
        by,
    )


def intersect(a: pl.DataFrame, b: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Intervals of A ∩ B per group (disjoint, sorted)."""
    return union(overlay(a, b, by).filter(pl.col("state") == 3), by)


def subtract(a: pl.DataFrame, b: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Intervals of A \\ B per group (disjoint, sorted)."""
    return union(overlay(a, b, by).filter(pl.col("state") == 1), by)


def clip(df: pl.DataFrame, windows: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """Clip intervals to the windows they fall in (inner join on ``on``; window columns ``w_start`` /
    ``w_end``); intervals outside every window are dropped, those spanning a boundary are cut."""
    return (
        df.join(windows, on=on, how="inner")
        .with_columns(
            pl.max_horizontal(_S, "w_start").alias(_S),
            pl.min_horizontal(_E, "w_end").alias(_E),
        )
        .filter(pl.col(_E) > pl.col(_S))
        .drop(["w_start", "w_end"])
    )


_SHIFT = 46  # 2**46 ns = 19.5 h of trace per rank in the packed join key


def top_level_cpu_ops(ev: pl.DataFrame, cols: tuple[str, ...] = ()) -> pl.DataFrame:
    """The ``cpu_op`` rows not nested in an earlier op of their (rank, thread), sorted by
    (rank, tid, start): ``rank, tid, start_ns, end_ns`` and ``cols``.

    An op starting before the latest end among its thread's earlier ops is inside one of them
    (host ops nest, they do not overlap), so this keeps one row per outermost call: a Python-level
    op with its dispatcher children counted once.
    """
    ops = ev.filter(pl.col("kind") == "cpu_op").select("rank", "tid", *cols, _S, _E).sort("rank", "tid", _S)
    prev_end = pl.col(_E).cum_max().shift(1).over(["rank", "tid"])
    return ops.filter(prev_end.is_null() | (pl.col(_S) >= prev_end))


def _expand(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concat(arange(lo[i], lo[i] + counts[i]) for i)`` without a Python loop."""
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts - lo, counts)


def _starts_within(
    lo_t: np.ndarray, hi_t: np.ndarray, points: np.ndarray, lo_side: Literal["left", "right"]
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(span, point)`` of every point inside a span, ``lo_t[span] <= point <= hi_t[span]``
    (``lo_side="right"``: ``lo_t[span] < point``), sorted by span: two binary searches per span over
    the sorted points."""
    order = np.argsort(points, kind="stable")
    ordered = points[order]
    lo = np.searchsorted(ordered, lo_t, lo_side)
    n = np.searchsorted(ordered, hi_t, "right") - lo
    return np.repeat(np.arange(lo_t.size, dtype=np.int64), n), order[_expand(lo, n)]


def _pairs(ls: np.ndarray, le: np.ndarray, rs: np.ndarray, re: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(i, j)`` of all pairs with ``ls[i] <= re[j]`` and ``le[i] >= rs[j]``, sorted by ``(i, j)``.

    Every span must have ``start <= end``. A pair either has the right span start inside the left
    one (``ls <= rs <= le``) or the left span start inside the right one (``rs < ls <= re``): two
    disjoint point-in-span queries, each a pair of binary searches over the sorted starts, so the
    cost is ``O((n + m) log + pairs)`` however the spans nest (polars' IEJoin scans a bit array per
    row: quadratic in the rows of a block).
    """
    i_a, j_a = _starts_within(ls, le, rs, "left")  # ls <= rs <= le
    j_b, i_b = _starts_within(rs, re, ls, "right")  # rs < ls <= re
    i, j = np.concatenate([i_a, i_b]), np.concatenate([j_a, j_b])
    order = np.lexsort((j, i))
    return i[order], j[order]


def _dense_ids(left: pl.DataFrame, right: pl.DataFrame, cols: list[str]) -> tuple[pl.Series, pl.Series, int]:
    """A dense int64 id of the ``by`` values of each row of ``left`` and ``right`` (null matches null),
    and the number of ids. One integer column without nulls needs no join: its value minus the minimum."""
    if len(cols) == 1 and left.schema[cols[0]].is_integer() and right.schema[cols[0]].is_integer():
        a, b = left.get_column(cols[0]), right.get_column(cols[0])
        if not a.has_nulls() and not b.has_nulls():
            lo = min(cast(int, a.min()), cast(int, b.min()))
            hi = max(cast(int, a.max()), cast(int, b.max()))
            return a.cast(pl.Int64) - lo, b.cast(pl.Int64) - lo, hi - lo + 1
    keys = (
        pl.concat([left.select(cols), right.select(cols)])
        .unique()
        .with_row_index("__gid")
        .with_columns(pl.col("__gid").cast(pl.Int64))
    )
    ga = left.select(cols).join(keys, on=cols, how="left", nulls_equal=True, maintain_order="left")["__gid"]
    gb = right.select(cols).join(keys, on=cols, how="left", nulls_equal=True, maintain_order="left")["__gid"]
    return ga, gb, keys.height


def range_join(
    left: pl.DataFrame,
    right: pl.DataFrame,
    left_span: tuple[str, str],
    right_span: tuple[str, str],
    by: tuple[str, ...] = ("rank",),
) -> pl.DataFrame:
    """All (left, right) row pairs with equal ``by`` values whose spans overlap or touch.

    ``left_span`` may name the same column twice for a point (``(t, t)``: the point lies inside the
    right span, ends included). The ``by`` values become a dense id packed into the high bits of the
    time, so one sorted key orders groups and times at once; the pairs are then found with binary
    searches over the sorted span starts (:func:`_pairs`). Spans with a null end never match;
    spans ending before they start, or keys that do not fit in 64 bits, take polars' inequality
    join instead (same pairs). Null ``by`` values match null.

    Args:
        left: Frame with the ``by`` columns and the two span columns (epoch ns).
        right: Frame with the ``by`` columns and its span columns; other column names must not clash.
        left_span: (start, end) column names in ``left``.
        right_span: (start, end) column names in ``right``.
        by: Equality columns (present in both; kept once, from ``left``).

    Returns:
        The joined pairs (columns of both frames, ``by`` once), ordered by left row, then right row
        (the inequality-join fallback: polars' order).
    """
    cols = list(by)
    if left.is_empty() or right.is_empty():
        return left.join(right.drop(cols), how="cross").head(0)
    ga, gb, n_ids = _dense_ids(left, right, cols)
    li, ls, le = _spans(left, left_span)
    ri, rs, re = _spans(right, right_span)
    if li.size == 0 or ri.size == 0:  # one side's spans all have a null end: nothing matches
        return left.join(right.drop(cols), how="cross").head(0)
    t0, t1 = min(int(ls.min()), int(rs.min())), max(int(le.max()), int(re.max()))
    negative = bool((le < ls).any() or (re < rs).any())
    if negative or t1 - t0 >= 1 << _SHIFT or n_ids >= 1 << (62 - _SHIFT):
        return _range_join_iejoin(left, right, left_span, right_span, cols, ga, gb)
    # the dense id in the high bits: one int64 key orders groups, then times
    lg, rg = ga.to_numpy()[li] << _SHIFT, gb.to_numpy()[ri] << _SHIFT
    i, j = _pairs(lg + (ls - t0), lg + (le - t0), rg + (rs - t0), rg + (re - t0))
    return pl.concat([left[li[i]], right.drop(cols)[ri[j]]], how="horizontal")


def _spans(df: pl.DataFrame, span: tuple[str, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indices, starts and ends (int64) of the rows whose two span columns are both set (a null
    time never compares true, as in polars' join)."""
    s, e = df.get_column(span[0]), df.get_column(span[1])
    if not s.has_nulls() and not e.has_nulls():
        return np.arange(df.height, dtype=np.int64), s.to_numpy().astype(np.int64), e.to_numpy().astype(np.int64)
    keep = (s.is_not_null() & e.is_not_null()).to_numpy()
    idx = np.flatnonzero(keep).astype(np.int64)
    return idx, s.fill_null(0).to_numpy().astype(np.int64)[idx], e.fill_null(0).to_numpy().astype(np.int64)[idx]


def _range_join_iejoin(
    left: pl.DataFrame,
    right: pl.DataFrame,
    left_span: tuple[str, str],
    right_span: tuple[str, str],
    cols: list[str],
    ga: pl.Series,
    gb: pl.Series,
) -> pl.DataFrame:
    """:func:`range_join` by polars' inequality join (any spans, any key range); same pairs."""
    a = left.with_columns(ga.alias("__gid"))
    b = right.drop(cols).with_columns(gb.alias("__gid_r"))
    out = a.join_where(
        b,
        pl.col("__gid") == pl.col("__gid_r"),
        pl.col(left_span[0]) <= pl.col(right_span[1]),
        pl.col(left_span[1]) >= pl.col(right_span[0]),
    )
    return out.drop(["__gid", "__gid_r"])

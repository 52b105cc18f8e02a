"""The batch's one start-order sort (``kineto_batch._start_order``) serves the duplicate check and
the final sort: the rows kept, the load-report counts and the final row order equal the plain
path's (every row hashed by ``validate.first_copies``, then a stable sort by file, start, event_id)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from ep_trace.parsers import validate
from ep_trace.parsers.kineto_batch import FILE, _drop_duplicates, _sort_columns, _start_order

_ROW = st.tuples(
    st.integers(0, 2),  # file
    st.integers(0, 4),  # start_ns (ties: copies and plain neighbours)
    st.integers(0, 1),  # dur
    st.sampled_from(["a", "b"]),  # name
    st.sampled_from([None, 3]),  # correlation
)


def _frame(rows: list[tuple[int, int, int, str, int | None]], shuffle_ids: bool) -> pl.DataFrame:
    rows = sorted(rows, key=lambda r: r[0])  # files are concatenated in order
    ids = list(range(len(rows)))
    if shuffle_ids:
        ids.reverse()  # rows not in event_id order: the sort needs event_id as a key
    return pl.DataFrame(
        {
            "event_id": pl.Series(ids, dtype=pl.Int64),
            "category": ["cpu_op"] * len(rows),
            "name": [r[3] for r in rows],
            "pid_raw": pl.Series([1] * len(rows), dtype=pl.Int64),
            "tid_raw": pl.Series([2] * len(rows), dtype=pl.Int64),
            "start_ns": pl.Series([r[1] for r in rows], dtype=pl.Int64),
            "end_ns": pl.Series([r[1] + r[2] for r in rows], dtype=pl.Int64),
            "correlation": pl.Series([r[4] for r in rows], dtype=pl.Int64),
            "external_id": pl.Series([None] * len(rows), dtype=pl.Int64),
            FILE: pl.Series([r[0] for r in rows], dtype=pl.Int32),
        }
    )


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_ROW, min_size=0, max_size=40), shuffle_ids=st.booleans())
def test_start_order_dedupe_and_sort_equal_the_plain_path(rows, shuffle_ids):
    ev = _frame(rows, shuffle_ids)
    files = [SimpleNamespace(path=Path(f"rank{i}.json"), rank=i) for i in range(3)]
    key = [*validate.RAW_DUPLICATE_KEY, FILE]
    # the plain path
    want_issues: list[list[str]] = [[] for _ in files]
    want = ev
    if ev.height >= 2:
        first = validate.first_copies(ev, key)
        for fi in range(3):
            n = int((~first).filter(ev[FILE] == fi).sum())
            if n:
                want_issues[fi].append(validate.duplicate_issue(files[fi].path, fi, n).message)
        want = ev.filter(first)
    want = want.sort(FILE, "start_ns", "event_id", maintain_order=True)
    # the one-sort path
    issues: list[list] = [[] for _ in files]
    order = _start_order(ev)
    assert (order is None) == (ev.height < 2 or (shuffle_ids and ev.height > 1 and ev[FILE].n_unique() < ev.height))
    kept, order = _drop_duplicates(ev, files, issues, order)  # type: ignore[arg-type]
    got = _sort_columns([kept], FILE, "start_ns", "event_id", order=order)
    assert_frame_equal(got, want)
    assert [[i.message for i in f] for f in issues] == want_issues


def test_copies_apart_in_row_order_are_found():
    """Two copies with another row between them in start order (same start, other name) and a
    plain tie: one copy dropped, named in the load report, the rest in (start, event_id) order."""
    ev = _frame([(0, 5, 1, "a", 3), (0, 5, 1, "b", 3), (0, 1, 0, "a", None), (0, 5, 1, "a", 3)], False)
    issues: list[list] = [[]]
    files = [SimpleNamespace(path=Path("rank0.json"), rank=0)]
    kept, order = _drop_duplicates(ev, files, issues, _start_order(ev))  # type: ignore[arg-type]
    got = _sort_columns([kept], FILE, "start_ns", "event_id", order=order)
    assert got["event_id"].to_list() == [2, 0, 1]
    assert [i.message for i in issues[0]] == [
        "1 duplicate events (same rank, name, stream, start and end) dropped; their time would have been counted twice"
    ]

"""The column-at-a-time concat and sort of kineto.py (they bound peak memory) give exactly what
``pl.concat`` / ``DataFrame.sort`` give, on golden frames and on random ones."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from ep_trace.parsers.kineto import _concat_columns
from ep_trace.parsers.kineto_batch import _sort_columns


def _frame(n: int, seed: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "event_id": pl.Series(range(seed, seed + n), dtype=pl.Int64),
            "name": [f"op_{(i * 7 + seed) % 5}" * (1 + i % 3) for i in range(n)],  # some > 12 bytes (not inlined)
            "ts": [float((i * 13 + seed) % 9) for i in range(n)],
            "bytes": pl.Series([None] * n, dtype=pl.Int64),
            "corr": pl.Series([i if i % 2 else None for i in range(n)], dtype=pl.Int64),
        }
    )


def test_concat_columns_equals_concat_and_empties_the_list() -> None:
    frames = [_frame(3, 0), _frame(5, 10), _frame(1, 20)]
    want = pl.concat(frames)
    got = _concat_columns(frames)
    assert frames == []
    assert_frame_equal(got, want)
    assert all(got[c].n_chunks() == 1 for c in got.columns)


def test_concat_columns_of_nothing() -> None:
    assert _concat_columns([]).height == 0


def test_sort_columns_golden() -> None:
    df = pl.DataFrame(
        {
            "start_ns": [5, 1, 5, 3],
            "event_id": [9, 8, 2, 7],
            "name": ["e", "b", "a", "c"],
            "device": pl.Series([None] * 4, dtype=pl.Int32),
        }
    )
    holder = [df]
    got = _sort_columns(holder, "start_ns", "event_id")
    assert holder == []
    assert got.to_dict(as_series=False) == {
        "start_ns": [1, 3, 5, 5],
        "event_id": [8, 7, 2, 9],
        "name": ["b", "c", "a", "e"],
        "device": [None] * 4,
    }
    assert got.schema == df.schema


def test_sort_columns_on_rows_in_event_id_order() -> None:
    """The one-key path (rows already in event_id order): ties on start_ns in event_id order."""
    df = pl.DataFrame({"start_ns": [7, 3, 7, 3, 1, 7], "event_id": [0, 1, 2, 5, 6, 9], "name": list("abcdef")})
    got = _sort_columns([df], "start_ns", "event_id")
    assert_frame_equal(got, df.sort("start_ns", "event_id"))
    assert got["event_id"].to_list() == [6, 1, 5, 0, 2, 9]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 5), st.integers(-3, 3), st.sampled_from(["a", "a-much-longer-name", None])),
        min_size=1,
        max_size=60,
    ),
    parts=st.integers(1, 4),
)
def test_concat_then_sort_equals_polars(rows, parts):
    df = pl.DataFrame(
        {
            "start_ns": [r[0] for r in rows],
            "event_id": [r[1] for r in rows],
            "name": [r[2] for r in rows],
            "empty": pl.Series([None] * len(rows), dtype=pl.Int64),
        },
        schema={"start_ns": pl.Int64, "event_id": pl.Int64, "name": pl.Utf8, "empty": pl.Int64},
    )
    step = max(1, len(rows) // parts)
    frames = [df.slice(i, step) for i in range(0, len(rows), step)]
    got = _sort_columns([_concat_columns(frames)], "start_ns", "event_id")
    assert_frame_equal(got, df.sort("start_ns", "event_id", maintain_order=True))

"""``validate.first_copies`` (the duplicate-event check before links and collectives) equals the
plain first-distinct mask of the full key, with and without copies."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.parsers import validate

_ROW = st.tuples(
    st.sampled_from(["cpu_op", "kernel"]), st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 3)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ROW, max_size=30))
def test_first_copies_equals_first_distinct_of_the_key(rows):
    df = pl.DataFrame(
        rows, schema={"cat": pl.Utf8, "name": pl.Utf8, "tid": pl.Int64, "start_ns": pl.Int64}, orient="row"
    )
    key = ["cat", "name", "tid", "start_ns"]
    want = df.select(pl.struct(key).is_first_distinct()).to_series().to_list() if df.height else []
    assert validate.first_copies(df, key).to_list() == want

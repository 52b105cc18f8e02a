"""``kineto_keys``: packed (file, id) keys join as the two columns do, and ``first_rows`` equals
``unique(keep="first")`` + a left join, on dense, sparse, repeated, null and extreme keys."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.parsers.kineto_keys import first_rows, key_packs

_I64 = (-(2**63), 2**63 - 1)


def _reference(build: list[int | None], probe: list[int | None]) -> list[int | None]:
    first: dict[int, int] = {}
    for i, k in enumerate(build):
        if k is not None:
            first.setdefault(k, i)
    return [first.get(k) if k is not None else None for k in probe]


_KEYS = st.one_of(
    st.lists(st.one_of(st.none(), st.integers(0, 30)), max_size=40),  # dense, repeated: the table
    st.lists(st.one_of(st.none(), st.integers(*_I64)), max_size=12),  # spread: the join
    st.lists(st.sampled_from([None, _I64[0], _I64[0] + 1, _I64[1], 0]), max_size=10),  # extremes
)


@settings(max_examples=300, deadline=None)
@given(build=_KEYS, probe=_KEYS)
def test_first_rows_equals_unique_first_and_left_join(build, probe):
    got = first_rows(pl.Series(build, dtype=pl.Int64), pl.Series(probe, dtype=pl.Int64))
    assert got.dtype == pl.UInt32
    assert got.to_list() == _reference(build, probe)


def test_first_rows_on_struct_keys_takes_the_join():
    b = pl.Series([{"f": 0, "v": 1}, {"f": 1, "v": 1}, {"f": 0, "v": 1}])
    p = pl.Series([{"f": 0, "v": 1}, {"f": 2, "v": 1}, {"f": 1, "v": 1}])
    assert first_rows(b, p).to_list() == [0, None, 1]


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(-50, 50) | st.integers(*_I64))),
        min_size=1,
        max_size=30,
    )
)
def test_packed_keys_join_as_the_two_columns(rows):
    """Equal keys exactly for equal (file, id) pairs, null for a null id, whichever the packing
    (int64, or struct when the ids span too much)."""
    df = pl.DataFrame(rows, schema={"_file": pl.Int32, "id": pl.Int64}, orient="row")
    pack = key_packs(df, {"d": ["id"]}, "_file")["d"]
    keyed = df.with_columns(pack.key("id").alias("_k"))
    pairs = keyed.rows()
    for f1, i1, k1 in pairs:
        for f2, i2, k2 in pairs:
            if i1 is None or i2 is None:
                continue
            assert (k1 == k2) == ((f1, i1) == (f2, i2))
    assert all((k is None) == (i is None) for _, i, k in pairs)
    one = key_packs(df, {"d": ["id"]}, None)["d"]
    assert df.select(one.key("id")).to_series().to_list() == df["id"].to_list()

"""Per-rank passes over blocks of ranks (``ep_trace.analysis.rank_pass``) and events left on disk.

The analysis must not depend on how the ranks are cut into blocks, nor on whether the events are in
memory or a lazy scan of an ingest directory: every frame of the :class:`Analysis` and the summary
are compared between one block of all ranks, one block per rank, and the Parquet partitions.
"""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ep_trace.analysis import AnalysisConfig, analyze
from ep_trace.analysis.rank_pass import _own_strings, drain_blocks, rank_blocks
from ep_trace.errors import TraceFormatError
from ep_trace.parsers import read_trace_dir
from ep_trace.parsers.parquet_io import ingest_to
from ep_trace.parsers.parquet_read import read_parquet, table_files
from ep_trace.schema import TraceTables, conform

from .conftest import T0


def _frames(a: object) -> dict[str, pl.DataFrame]:
    out = {}
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        v = getattr(a, f.name)
        if isinstance(v, pl.DataFrame):
            out[f.name] = v
    return out


def _assert_same(a, b) -> None:
    assert a.summary() == b.summary()
    assert a.notes == b.notes and a.detection_method == b.detection_method
    assert [f.title for f in a.findings] == [f.title for f in b.findings]
    fa, fb = _frames(a), _frames(b)
    assert fa.keys() == fb.keys()
    for name, x in fa.items():
        y = fb[name]
        assert x.schema == y.schema, name
        # rows of different ranks may interleave differently; within a rank the order is the same
        keys = [c for c, t in x.schema.items() if not isinstance(t, (pl.List, pl.Struct))]
        assert_frame_equal(
            x.sort(keys, nulls_last=True), y.sort(keys, nulls_last=True), check_exact=False, rel_tol=1e-9
        )
    ta, tb = a.tables.stages, b.tables.stages
    assert_frame_equal(ta.sort(ta.columns, nulls_last=True), tb.sort(tb.columns, nulls_last=True))


@pytest.mark.parametrize("rel", ["external:kineto/param_dlrm_8rank", "samples:skewed_straggler", "samples:backward"])
def test_one_rank_per_block_equals_all_ranks_at_once(rel, external_dir, samples_dir):
    root, sub = rel.split(":")
    tables = read_trace_dir((external_dir if root == "external" else samples_dir) / sub)
    whole = analyze(tables, AnalysisConfig(block_events=1 << 40))
    assert len(rank_blocks(tables, 1 << 40)[0]) == 1
    per_rank = analyze(tables, AnalysisConfig(block_events=1))
    assert len(rank_blocks(tables, 1)[0]) == tables.ranks.height > 1
    _assert_same(whole, per_rank)


def test_steps_filter_per_block(samples_dir):
    tables = read_trace_dir(samples_dir / "skewed_straggler")
    cfg = AnalysisConfig(steps=(1, 2))
    _assert_same(analyze(tables, cfg), analyze(tables, dataclasses.replace(cfg, block_events=1)))


def test_events_on_disk_equal_events_in_memory(tmp_path, external_dir):
    src = external_dir / "kineto" / "param_dlrm_8rank"
    ingest_to(src, tmp_path / "t")
    lazy = read_parquet(tmp_path / "t", lazy_events=True)
    assert lazy.events_scan is not None and lazy.events.height == 0
    mem = read_trace_dir(src)
    assert lazy.n_events() == mem.n_events() == mem.events.height
    assert_frame_equal(lazy.table("events"), mem.events)
    ref = analyze(mem, AnalysisConfig())
    _assert_same(ref, analyze(lazy, AnalysisConfig()))
    _assert_same(ref, analyze(lazy, AnalysisConfig(block_events=5_000)))


def test_load_with_cache_keeps_events_on_disk(tmp_path, external_dir):
    import ep_trace

    src = external_dir / "kineto" / "param_dlrm_8rank"
    first = ep_trace.load(src, cache=tmp_path / "cache")  # a miss: streamed into the cache entry
    again = ep_trace.load(src, cache=tmp_path / "cache")  # a hit
    ref = ep_trace.load(src)
    assert ref.tables.events_scan is None
    for a in (first, again):
        assert a.tables.events_scan is not None and a.tables.events.height == 0
        _assert_same(ref, a)


def test_rank_blocks_known_answer():
    counts = {0: 3, 1: 1, 2: 2, 3: 5, 7: 1}
    rows = [
        {"rank": r, "event_id": i, "kind": "cpu_op", "name": "op", "start_ns": T0 + i, "end_ns": T0 + i + 1}
        for r, n in counts.items()
        for i in range(n)
    ]
    ev = conform("events", pl.DataFrame(rows))
    t = TraceTables(
        ranks=conform("ranks", pl.DataFrame({"rank": [0]})),
        events=ev,
        collectives=conform("collectives", pl.DataFrame({"rank": []})),
    )
    # consecutive ranks up to 4 events; a rank is never split (rank 3 alone holds 5)
    assert rank_blocks(t, 4) == (((0, 1), (2, 2), (3, 3), (7, 7)), 12)
    assert rank_blocks(t, 100) == (((0, 7),), 12)
    assert rank_blocks(t.__class__(t.ranks, ev.clear(), t.collectives), 4) == ((), 0)


def test_bad_partition_names_its_file(tmp_path, external_dir):
    ingest_to(external_dir / "kineto" / "param_dlrm_8rank", tmp_path / "t")
    part = table_files(tmp_path / "t", "events")[0]
    ev = pl.read_parquet(part)
    ev.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(pl.col("start_ns") - 1).otherwise(pl.col("end_ns")).alias("end_ns")
    ).write_parquet(part)
    with pytest.raises(TraceFormatError) as exc:
        read_parquet(tmp_path / "t", lazy_events=True)
    assert str(part) in str(exc.value) and "events[3]" in str(exc.value)


def test_own_strings_keeps_values_nulls_and_order():
    long = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>" * 3
    df = pl.DataFrame({"name": [long, None, "x", long, "", "x"], "n": [1, 2, 3, 4, 5, 6]})
    out = _own_strings(df.filter(pl.col("n") != 3))
    assert out.schema == df.schema
    assert out.to_dicts() == df.filter(pl.col("n") != 3).to_dicts()
    assert _own_strings(df.head(0)).schema == df.schema
    assert _own_strings(pl.DataFrame({"name": [None, None]}, schema={"name": pl.Utf8}))["name"].null_count() == 2


def _text_bytes(s: pl.Series) -> int:
    """Bytes of the data buffers behind a String column (views and validity left out)."""
    arr = s.to_arrow(compat_level=pl.CompatLevel.newest())
    return sum(b.size for b in arr.buffers()[2:] if b is not None)


def test_own_strings_rows_share_one_copy_of_each_distinct_text():
    # 2,000 rows of two 2 kB names, cut out of a frame with more text: each distinct text stored
    # once (a Categorical round trip copied every row's text: 4 MB; a plain filter keeps every buffer)
    a, b = "a" * 2_000, "b" * 2_000
    df = pl.DataFrame({"name": [a, b] * 1_000 + ["c" * 2_000] * 1_000, "i": range(3_000)})
    s = _own_strings(df.filter(pl.col("i") < 2_000))["name"]
    assert s.to_list() == [a, b] * 1_000
    assert _text_bytes(s) == 4_000
    assert _text_bytes(s.cast(pl.Categorical()).cast(pl.Utf8)) >= 4_000_000


def test_drain_blocks_yields_each_block_once_in_order():
    df = pl.DataFrame({"rank": [0, 0, 1, 2, 2, 3], "v": [1, 2, 3, 4, 5, 6]})
    parts = list(drain_blocks(df, ((0, 1), (2, 2), (3, 3))))
    assert [p["v"].to_list() for p in parts] == [[1, 2, 3], [4, 5], [6]]
    (whole,) = drain_blocks(df, ((0, 3),))
    assert_frame_equal(whole, df)

"""Cost of one more pipeline chunk per rank (analysis.chunk_cost), on hand-built timelines."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.chunk_cost import per_chunk_cost

KIND = pl.Enum(["gpu_kernel", "cpu_op", "cpu_annotation"])


def _ev(rows: list[tuple[int, str, int, int, int, int | None, int | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int32,
            "kind": KIND,
            "tid": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "stream": pl.Int64,
            "coll_id": pl.Int64,
        },
        orient="row",
    )


def _stages(rows: list[tuple[int, int, str, int, int]], host: bool) -> pl.DataFrame:
    cols = ("cpu_start_ns", "cpu_end_ns") if host else ("start_ns", "end_ns")
    other = ("start_ns", "end_ns") if host else ("cpu_start_ns", "cpu_end_ns")
    return pl.DataFrame(
        [(r, 0, ly, s, a, b, None, None) for r, ly, s, a, b in rows],
        schema={
            "rank": pl.Int32,
            "step": pl.Int64,
            "layer": pl.Int32,
            "stage": pl.Utf8,
            cols[0]: pl.Int64,
            cols[1]: pl.Int64,
            other[0]: pl.Int64,
            other[1]: pl.Int64,
        },
        orient="row",
    )


def test_cpu_rank_top_level_ops_times_the_cheap_interval():
    # region 0..1000 ns (dispatch 0..100, expert 100..900, combine 900..1000): four top-level ops
    # starting at 0, 10, 20, 500 (the one at 20 is a 480 ns GEMM), one nested op (not counted), one
    # op outside the region. Intervals 10, 10, 480 -> 25th percentile 10 ns; 4 ops -> 40 ns per chunk
    ev = _ev(
        [
            (0, "cpu_op", 1, 0, 5, None, None),
            (0, "cpu_op", 1, 10, 15, None, None),
            (0, "cpu_op", 1, 20, 500, None, None),
            (0, "cpu_op", 1, 30, 40, None, None),  # nested in the GEMM
            (0, "cpu_op", 1, 500, 510, None, None),
            (0, "cpu_op", 1, 2000, 2010, None, None),  # outside
        ]
    )
    st = _stages([(0, 0, "dispatch", 0, 100), (0, 0, "expert", 100, 900), (0, 0, "combine", 900, 1000)], host=True)
    assert per_chunk_cost(ev, st, {0: "cpu"}) == {0: 40.0}


def test_gpu_rank_kernels_times_the_median_launch_gap():
    # three compute kernels in the region with idle gaps 4 and 6 ns -> median 5; one comm kernel ignored
    ev = _ev(
        [
            (1, "gpu_kernel", 7, 0, 100, 7, None),
            (1, "gpu_kernel", 7, 104, 300, 7, None),
            (1, "gpu_kernel", 7, 306, 400, 7, None),
            (1, "gpu_kernel", 9, 50, 350, 9, 3),
        ]
    )
    st = _stages([(1, 0, "dispatch", 0, 60), (1, 0, "expert", 60, 400), (1, 0, "combine", 380, 400)], host=False)
    assert per_chunk_cost(ev, st, {1: "gpu"}) == {1: 15.0}


def test_no_region_stages_no_cost():
    ev = _ev([(0, "cpu_op", 1, 0, 5, None, None)])
    st = _stages([(0, 0, "route", 0, 100)], host=True)
    assert per_chunk_cost(ev, st, {0: "cpu"}) == {}


def _calls(rows: list[tuple[int, str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(r, d, s, e, s + 1, e + 50, 0) for r, d, s, e in rows],
        schema={
            "rank": pl.Int32,
            "direction": pl.Utf8,
            "cpu_start_ns": pl.Int64,
            "cpu_end_ns": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "layer": pl.Int32,  # the stages table has one too: the join must not trip over it
        },
        orient="row",
    )


# one CPU rank, region 0..1000: cheap ops A 0, B 10, C 20, the count exchange posted 30..70, F 160,
# G 170, the dispatch posted 180..200, a GEMM D 300..800, E 810, the combine posted 900..960
_SEQ = [(0, 5), (10, 15), (20, 25), (30, 70), (160, 165), (170, 175), (180, 200), (300, 800), (810, 815), (900, 960)]
_CALLS = [(0, "count", 30, 70), (0, "dispatch", 180, 200), (0, "combine", 900, 960)]
_ST = [(0, 0, "dispatch", 0, 300), (0, 0, "expert", 300, 900), (0, 0, "combine", 900, 1000)]


def test_cpu_rank_prices_each_extra_call_at_its_post():
    # intervals 10 x 5, 90, 120, 130, 510 -> p25 10 ns for the 7 ops that post no call = 70 ns; an
    # extra call costs the host its post, read off the smallest message (the count exchange: 40 ns);
    # two calls per extra chunk -> 70 + 2 x 40
    ev = _ev([(0, "cpu_op", 1, s, e, None, None) for s, e in _SEQ])
    st = _stages(_ST, host=True)
    assert per_chunk_cost(ev, st, {0: "cpu"}, _calls(_CALLS)) == {0: 150.0}
    # without the collectives table every op, the calls' included, is priced at the p25
    assert per_chunk_cost(ev, st, {0: "cpu"}) == {0: 100.0}


def test_cpu_rank_without_a_count_exchange_takes_the_median_call():
    # no count exchange: the median post of the calls there are, median(20, 60) = 40; the count op
    # (30..70) is now an ordinary op: 8 ops x 10 + 2 x 40
    ev = _ev([(0, "cpu_op", 1, s, e, None, None) for s, e in _SEQ])
    st = _stages(_ST, host=True)
    assert per_chunk_cost(ev, st, {0: "cpu"}, _calls(_CALLS[1:])) == {0: 160.0}

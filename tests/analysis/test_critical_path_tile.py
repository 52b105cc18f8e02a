"""The critical path's tiling of a walk (``_segments`` + ``_tile``), on walks whose answer is known."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.critical_path import _segments, _tile

WORK = pl.DataFrame(
    {
        "node": [7, 7, 9],
        "rank": [1, 1, 2],
        "start_ns": [10, 40, 35],
        "end_ns": [30, 60, 50],
        "cause": ["compute", "launch_gap", "host_stall"],
        "stage": ["expert", None, None],
    }
)


def _rows(walks: list) -> list[tuple]:
    out = _tile(_segments(WORK, walks), walks).sort("step", "start_ns")
    return [tuple(r) for r in out.iter_rows()]


def test_segments_are_clipped_cut_at_the_latest_end_and_holes_filled() -> None:
    # window 0..100 of rank 1; node 7's pieces (10-30 expert, 40-60 launch gap), node 9's (35-50), one
    # explicit transfer 55-80 and one segment wholly inside another (45-50: dropped)
    walk = (3, 1, 0, 100, [(1, 55, 80, "transfer", None, "all_to_all"), 7, 9, (2, 45, 50, "copy", None, "x")])
    assert _rows([walk]) == [
        (3, 1, 0, 10, "unexplained", None, "not explained by the graph"),
        (3, 1, 10, 30, "compute", "expert", "expert"),
        (3, 1, 30, 35, "unexplained", None, "not explained by the graph"),
        (3, 2, 35, 50, "host_stall", None, "host_stall"),
        (3, 1, 50, 60, "launch_gap", None, "launch_gap"),  # cut at node 9's end
        (3, 1, 60, 80, "transfer", None, "all_to_all"),
        (3, 1, 80, 100, "unexplained", None, "not explained by the graph"),
    ]


def test_window_clips_both_ends_and_ties_keep_the_walk_order() -> None:
    # window 20..45: node 7's first piece clipped to 20-30, its second to 40-45; an explicit segment that
    # starts at 20 too, met first in the walk, wins the tie; node 9 after it starts at 35
    walk = (5, 1, 20, 45, [(1, 0, 25, "transfer", None, "first"), 7, 9])
    assert _rows([walk]) == [
        (5, 1, 20, 25, "transfer", None, "first"),
        (5, 1, 25, 30, "compute", "expert", "expert"),
        (5, 1, 30, 35, "unexplained", None, "not explained by the graph"),
        (5, 2, 35, 45, "host_stall", None, "host_stall"),
    ]


def test_a_walk_without_segments_is_unexplained_and_walks_stay_apart() -> None:
    walks = [(1, 0, 100, 200, []), (2, 1, 0, 30, [7])]
    assert _rows(walks) == [
        (1, 0, 100, 200, "unexplained", None, "not explained by the graph"),
        (2, 1, 0, 10, "unexplained", None, "not explained by the graph"),
        (2, 1, 10, 30, "compute", "expert", "expert"),  # node 7's second piece (40-60) is past the window
    ]

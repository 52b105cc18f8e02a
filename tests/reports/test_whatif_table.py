"""The what-if table of the report and the terminal (reports.whatif_table)."""

from __future__ import annotations

import dataclasses

import polars as pl
from fake_analysis import make_fake_analysis

from ep_trace.analysis.whatif import WHATIF_SCHEMA
from ep_trace.reports.whatif_table import whatif_rows


def test_rows_all_last_and_slower_reads_slower():
    a = make_fake_analysis(n_ranks=2)
    wf = pl.DataFrame(
        [
            ("all", 40_000_000, 10_000_000, [0, 1], None),
            ("chunked_pipeline", 51_770_000, -1_770_000, [0, 1], 2),
            ("fp8_dispatch", 46_200_000, 3_800_000, [0, 1], None),
        ],
        schema=WHATIF_SCHEMA,
        orient="row",
    )
    rows = whatif_rows(dataclasses.replace(a, whatif=wf))
    assert rows[0] == [
        "as measured",
        "the step replayed unedited (median over steps of the mean over ranks): the baseline of every row",
        "50.0 ms",
        "–",
        "–",
        "0, 1",
    ]
    rows = rows[1:]
    assert [r[0] for r in rows] == ["chunked_pipeline", "fp8_dispatch", "all"]
    assert rows[0][1].startswith("dispatch / experts / combine pipelined over 2 chunks (the best k); slower: ")
    assert rows[0][3] == "1.77 ms slower" and rows[0][4] == "-3.5%"
    assert rows[1][2:5] == ["46.2 ms", "3.80 ms", "7.6%"]
    assert rows[2][1].endswith("(do not add the rows)") and rows[2][5] == "0, 1"
    assert whatif_rows(dataclasses.replace(a, whatif=wf.clear())) == []


def test_slower_rows_say_why():
    """A what-if that lengthens the step names its reason: balancing that moves tokens onto the late
    rank (the README example: measured 8.9 ms slower, benchmarks/README.md), or chunks that cost more
    than they hide."""
    a = make_fake_analysis(n_ranks=4)
    wf = pl.DataFrame(
        [
            ("no_straggler", 69_000_000, 38_000_000, [2], None),
            ("balanced_routing", 117_000_000, -9_500_000, [0, 1], None),
            ("chunked_pipeline", 109_000_000, -1_800_000, [0, 1, 2, 3], 2),
            ("fp8_dispatch", 106_900_000, 500_000, [0, 1, 2, 3], None),
        ],
        schema=WHATIF_SCHEMA,
        orient="row",
    )
    rows = {r[0]: r for r in whatif_rows(dataclasses.replace(a, whatif=wf))}
    assert rows["balanced_routing"][1] == (
        "each rank's expert work scaled to the mean load; slower: balancing gives more tokens to rank 2, "
        "the late rank, which then arrives later still"
    )
    assert rows["chunked_pipeline"][1] == (
        "dispatch / experts / combine pipelined over 2 chunks (the best k); slower: each extra chunk's two "
        "collective calls and re-issued ops cost more than pipelining hides on these ranks"
    )
    assert "slower" not in rows["fp8_dispatch"][1] and "slower" not in rows["no_straggler"][1]
    no_late = wf.filter(pl.col("scenario") == "balanced_routing")
    (row,) = whatif_rows(dataclasses.replace(a, whatif=no_late))[1:]
    assert row[1].endswith("; slower: the ranks that receive tokens finish later than the heavy ranks did")


def test_terminal_keeps_the_reason():
    from rich.console import Console, Group

    from ep_trace.reports.terminal import summary_renderables

    a = make_fake_analysis(n_ranks=4)
    wf = pl.DataFrame(
        [
            ("no_straggler", 69_000_000, 38_000_000, [2], None),
            ("balanced_routing", 117_000_000, -9_500_000, [0, 1], None),
        ],
        schema=WHATIF_SCHEMA,
        orient="row",
    )
    con = Console(record=True, width=200)
    con.print(Group(*summary_renderables(dataclasses.replace(a, whatif=wf))))
    assert (
        "balanced_routing is slower: balancing gives more tokens to rank 2, the late rank, which then arrives later "
        "still" in con.export_text()
    )

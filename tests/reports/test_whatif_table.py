"""The what-if table of the report and the terminal (reports.whatif_table)."""

from __future__ import annotations

import dataclasses

import polars as pl
from fake_analysis import make_fake_analysis

from ep_trace.analysis.whatif import WHATIF_SCHEMA
from ep_trace.analysis.whatif_checks import RERUN_CHECKS, check_text
from ep_trace.reports.whatif_table import WHATIF_HEADERS, check_notes, whatif_rows


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
        "–",
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


def test_terminal_never_cuts_a_scenario_name():
    """In an 80-column terminal the what-if names stay whole ("chunked_pipel…" was cut); the rank
    list folds instead."""
    from rich.console import Console, Group

    from ep_trace.reports.terminal import summary_renderables

    a = make_fake_analysis(n_ranks=4)
    wf = pl.DataFrame(
        [
            ("balanced_routing", 117_000_000, -9_500_000, [0, 1], None),
            ("chunked_pipeline", 109_000_000, -1_800_000, [0, 1, 2, 3], 2),
            ("all", 60_000_000, 47_000_000, [0, 1, 2, 3], None),
        ],
        schema=WHATIF_SCHEMA,
        orient="row",
    )
    con = Console(record=True, width=80)
    con.print(Group(*summary_renderables(dataclasses.replace(a, whatif=wf))))
    lines = con.export_text().splitlines()
    assert any(ln.startswith(" chunked_pipeline │") for ln in lines)
    assert any(ln.startswith(" balanced_routing │") for ln in lines)


def test_rerun_column_gives_the_measured_error_or_says_unchecked():
    """Every saving the report shows says how well that what-if has matched a rerun
    (ep_trace.analysis.whatif_checks), or that it has not been checked; the bound ``all`` is no
    scenario a rerun removes."""
    a = make_fake_analysis(n_ranks=2)
    wf = pl.DataFrame(
        [
            ("no_straggler", 40_000_000, 10_000_000, [1], None),
            ("chunked_pipeline", 51_770_000, -1_770_000, [0, 1], 4),
            ("fp8_dispatch", 46_200_000, 3_800_000, [0, 1], None),
            ("all", 38_000_000, 12_000_000, [0, 1], None),
        ],
        schema=WHATIF_SCHEMA,
        orient="row",
    )
    rows = {r[0]: r for r in whatif_rows(dataclasses.replace(a, whatif=wf))}
    assert all(len(r) == len(WHATIF_HEADERS) for r in rows.values())
    assert WHATIF_HEADERS[-1] == "checked against a rerun"
    assert rows["no_straggler"][6] == check_text("no_straggler")
    lo, hi = RERUN_CHECKS["no_straggler"].error_lo_pct, RERUN_CHECKS["no_straggler"].error_hi_pct
    assert rows["no_straggler"][6].startswith(f"{lo:.0f}-{hi:.0f} % error (--straggler 1:30 vs none on 2 ranks")
    assert rows["chunked_pipeline"][6].endswith("at 8 chunks 0.76-0.89x: read the saving to about ±30 %")
    assert rows["fp8_dispatch"][6] == "not checked against a rerun"
    assert rows["all"][6] == "not checked (a bound)"
    notes = check_notes(dataclasses.replace(a, whatif=wf))
    assert notes[0] == (
        "checked against reruns (gloo demo pairs, benchmarks/README.md): "
        f"no_straggler {lo:.0f}-{hi:.0f} %, chunked_pipeline "
        f"{RERUN_CHECKS['chunked_pipeline'].error_lo_pct:.0f}-{RERUN_CHECKS['chunked_pipeline'].error_hi_pct:.0f} % error"
    )
    assert notes[1].startswith("chunked_pipeline: at 4 chunks and 2048 tokens 1.4-12.7 % in 4 of 4 sets; at 512 tokens")
    assert notes[2] == "not checked against a rerun: fp8_dispatch"
    assert check_notes(dataclasses.replace(a, whatif=wf.clear())) == []


def test_rerun_figures_match_the_benchmark_readme():
    """The error ranges the report prints are the ones benchmarks/README.md publishes (one place to
    update: whatif_checks), and every range is ordered."""
    import pathlib

    readme = (pathlib.Path(__file__).parents[2] / "benchmarks" / "README.md").read_text()
    for c in RERUN_CHECKS.values():
        assert 0 <= c.error_lo_pct <= c.error_hi_pct
        assert f"{c.error_lo_pct:.1f}" in readme and f"{c.error_hi_pct:.1f}" in readme, c.scenario

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
    assert rows[0][1] == "dispatch / experts / combine pipelined over 2 chunks (the best k)"
    assert rows[0][3] == "1.77 ms slower" and rows[0][4] == "-3.5%"
    assert rows[1][2:5] == ["46.2 ms", "3.80 ms", "7.6%"]
    assert rows[2][1].endswith("(do not add the rows)") and rows[2][5] == "0, 1"
    assert whatif_rows(dataclasses.replace(a, whatif=wf.clear())) == []

"""A CUPTI events file through the directory reader and the analysis: known stage windows by hand."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from ep_trace.analysis import analyze
from ep_trace.capture.cupti.convert import records_to_events
from ep_trace.capture.cupti.writer import EventsWriter, events_path
from ep_trace.parsers import read_trace_dir

DATA = Path(__file__).resolve().parents[1] / "data" / "cupti" / "moe_step_records.json"
B = 1_764_400_000_000_000_000 + 250


def test_cupti_dir_to_stage_windows(tmp_path: Path) -> None:
    doc = json.loads(DATA.read_text())
    ev = records_to_events(doc["records"], rank=0, ranges=doc["ranges"], clock_offset_ns=doc["clock_offset_ns"])
    w = EventsWriter(events_path(tmp_path, 0), {"rank": 0, "world_size": 1, "job_id": "j"})
    w.write(ev)
    w.close()
    tables = read_trace_dir(tmp_path)
    assert tables.ranks["format"].to_list() == ["cupti"]
    a = analyze(tables)
    # dispatch: fill kernel [1500,2500] + DtoH [3000,3200] + NCCL SendRecv [4000,8000] (launched in the range);
    # expert: memset [9800,9900] + GEMM [10500,18000]. The reduce kernel launched outside any stage is not attributed.
    st = a.stages.select(
        "step",
        "stage",
        (pl.col("start_ns") - B).alias("s"),
        (pl.col("end_ns") - B).alias("e"),
        "window_ns",
        "busy_ns",
        "comm_ns",
        "exposed_comm_ns",
    ).sort("s")
    assert st.rows() == [
        (3, "dispatch", 1500, 8000, 6500, 5200, 4000, 4000),
        (3, "expert", 9800, 18000, 8200, 7600, 0, 0),
    ]
    step = a.steps.row(0, named=True)
    # compute = non-comm kernels 1000 + 7500 + 500; comm = the NCCL kernel.
    assert (step["step"], step["step_time_ns"], step["comm_ns"], step["compute_ns"], step["overlapped_ns"]) == (
        3,
        21500,
        4000,
        9000,
        0,
    )

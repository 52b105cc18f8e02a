"""compare (digests from analyses and from summary dicts) and annotate (Chrome trace tracks)."""

from __future__ import annotations

import gzip

import orjson
import polars as pl
import pytest
from fake_analysis import make_fake_analysis

from ep_trace.cli.outputs import write_annotated
from ep_trace.errors import BadInputError
from ep_trace.reports.annotate import ANALYSIS_PID, TRACK_TIDS, annotated_trace
from ep_trace.reports.compare import (
    compare_runs,
    comparison_to_dict,
    digest_analysis,
    digest_summary,
    headline,
    render_compare_html,
)


def test_compare_straggler_fixed():
    a = digest_analysis(make_fake_analysis(straggler=2, straggler_ms=2.0), "before")
    b = digest_analysis(make_fake_analysis(straggler=None), "after")
    c = compare_runs(a, b)
    assert a.step_stat == "mean" and c.step_stat == "mean"
    assert a.step_time_ns() == 5_078_000 and b.step_time_ns() == 3_078_000 and c.step_delta_ns == -2_000_000
    st = {r["stage"]: r for r in c.stages.iter_rows(named=True)}
    # dispatch window: 3 waiting ranks lose 2 x 1 ms each -> mean over ranks -1.5 ms; expert: rank 2 -2 ms -> -0.5 ms.
    assert st["dispatch"]["delta_ns"] == -1_500_000 and st["dispatch"]["change"] == "better"
    assert st["expert"]["delta_ns"] == -500_000 and st["route"]["change"] == "same"
    assert c.explained_ns == -2_000_000
    f = {r["kind"]: r["status"] for r in c.findings.iter_rows(named=True)}
    assert f == {"straggler_wait": "resolved", "routing_imbalance": "same", "exposed_comm": "same"}
    assert headline(c).startswith(
        "B is 2.00 ms faster per step than A (-39.4%: 5.08 ms → 3.08 ms, mean step of the slowest rank). "
        "Largest stage change: dispatch -1.50 ms."
    )
    d = comparison_to_dict(c)
    assert d["unexplained_ns"] == 0
    # every step of the fake runs is identical: no step-to-step spread, so any change is beyond noise
    assert d["step_time_ns"] == {
        "a": 5_078_000.0,
        "b": 3_078_000.0,
        "delta": -2_000_000.0,
        "statistic": "mean",
        "noise": 0.0,
        "within_noise": False,
    }
    assert "Plotly.newPlot(" in render_compare_html(c)


def test_digest_summary_from_json_dict():
    s = {
        "schema_version": 1,
        "ranks": [
            {
                "rank": 0,
                "step_time_ns": 10_000,
                "comm_ns": 4000,
                "exposed_comm_ns": 1000,
                "barrier_wait_ns": 500,
                "transfer_ns": 3500,
            },
            {
                "rank": 1,
                "step_time_ns": 12_000,
                "comm_ns": 4000,
                "exposed_comm_ns": 3000,
                "barrier_wait_ns": 0,
                "transfer_ns": 3500,
            },
        ],
        "stages": [
            {"rank": 0, "stage": "dispatch", "busy_ns": 100, "window_ns": 300},
            {"rank": 1, "stage": "dispatch", "busy_ns": 100, "window_ns": 100},
        ],
        "findings": [{"kind": "exposed_comm", "severity": "low", "title": "t", "est_saving_ns": 2000}],
    }
    d = digest_summary(s, "s.json")
    assert d.step_stat == "P50" and d.step_time_ns() == 12_000  # no step_time_mean_ns in this summary
    assert d.stages.row(0) == ("dispatch", 100.0, 200.0, None, 0)  # a summary has no steps: no stage noise
    assert d.findings["est_saving_ns"].to_list() == [2000]
    with pytest.raises(BadInputError, match=r"^x\.json: not an ep-trace summary"):
        digest_summary({"foo": 1}, "x.json")


def test_annotated_trace_has_tracks_and_events():
    a = make_fake_analysis()
    doc = orjson.loads(annotated_trace(a, 0))
    evs = doc["traceEvents"]
    x = [e for e in evs if e["ph"] == "X"]
    orig = [e for e in x if e["pid"] != ANALYSIS_PID]
    extra = [e for e in x if e["pid"] == ANALYSIS_PID]
    assert len(orig) == a.tables.events.filter(a.tables.events["rank"] == 0).height == 36
    tracks = {e["args"]["track"] for e in extra}
    assert tracks == {"stage", "comm", "wait", "transfer", "exposed_comm"}
    waits = [e for e in extra if e["tid"] == TRACK_TIDS["wait"]]
    assert len(waits) == 6 and all(e["dur"] == 1000.0 for e in waits)  # 3 steps x 2 dispatches, 1 ms each, in µs
    assert {e["name"] for e in waits} == {"wait for rank 2"}
    stages = [e for e in extra if e["tid"] == TRACK_TIDS["stage"]]
    assert len(stages) == 36 and stages[0]["name"] == "ep:route:l0:fwd"  # 3 steps x 2 layers x 6 stages
    first = min(orig, key=lambda e: e["ts"])
    assert (
        first["ts"] == 0.0
        and first["name"] == "ep:route:l0:fwd"
        and doc["otherData"]["base_time_ns"] == 1_700_000_000_000_000_000
    )
    names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "barrier wait" in names and "exposed comm (not overlapped)" in names


def test_write_annotated(tmp_path):
    paths = write_annotated(make_fake_analysis(), tmp_path)
    assert [p.name for p in paths] == [f"rank{r}.ep-annotated.json.gz" for r in range(4)]
    doc = orjson.loads(gzip.decompress(paths[2].read_bytes()))
    assert not [
        e for e in doc["traceEvents"] if e.get("tid") == TRACK_TIDS["wait"] and e["ph"] == "X"
    ]  # the straggler never waits


def test_annotated_events_move_to_the_aligned_clock():
    import dataclasses

    import polars as pl

    a = make_fake_analysis()
    shifted = dataclasses.replace(a, clock=a.clock.with_columns(pl.lit(5_000, pl.Int64).alias("offset_ns")))
    ev0 = {
        e["name"]: e["ts"]
        for e in orjson.loads(annotated_trace(a, 0))["traceEvents"]
        if e["ph"] == "X" and e["pid"] == 100
    }
    doc = orjson.loads(annotated_trace(shifted, 0, base_ns=1_700_000_000_000_000_000))
    ev1 = {e["name"]: e["ts"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 100}
    assert ev1["ep:route:l0:fwd"] == ev0["ep:route:l0:fwd"] + 5.0  # events get the host offset (5 µs) ...
    comm = [
        e
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e.get("tid") == TRACK_TIDS["comm"] and e["pid"] == ANALYSIS_PID
    ]
    assert min(e["ts"] for e in comm) == 125.0  # ... calls are already aligned: route 50 + permute 75 µs, unshifted


def test_headline_explains_overlapping_stage_windows():
    import dataclasses

    import polars as pl

    a = digest_analysis(make_fake_analysis(straggler=None), "A")
    # B: the step 0.5 ms slower, the dispatch window 2.5 ms longer (identical steps: no noise)
    st = a.stages.with_columns(
        pl.when(pl.col("stage") == "dispatch")
        .then(pl.col("window_ns") + 2.5e6)
        .otherwise(pl.col("window_ns"))
        .alias("window_ns")
    )
    ranks = a.ranks.with_columns(pl.col("step_time_mean_ns") + 5e5)
    b = dataclasses.replace(a, stages=st, ranks=ranks, label="B")
    c = compare_runs(dataclasses.replace(a, pipelined=True), dataclasses.replace(b, pipelined=True))
    assert c.step_delta_ns == 5e5 and c.explained_ns == 2.5e6
    assert (
        "Stage changes sum to +2.50 ms, more than the step-time change: stage windows overlap each other "
        "(pipelined stages), so 2.00 ms of the stage change is concurrent rather than serial." in headline(c)
    )
    # not pipelined: the windows do not overlap, so overlap is not the explanation
    assert (
        "Stage changes sum to +2.50 ms, more than the step-time change of the slowest rank: stage windows are "
        "means over ranks and include the waits of ranks that do not set the step." in headline(compare_runs(a, b))
    )


def test_compare_judges_stages_and_findings_against_their_noise():
    import dataclasses

    a = digest_analysis(make_fake_analysis(straggler=None), "A")
    assert (
        a.stages["n_steps"].to_list() == [3] * a.stages.height
        and a.stages["window_sd_ns"].to_list() == [0.0] * a.stages.height
    )
    # B: dispatch +2 ms and expert +0.2 ms per step; the steps spread by 0.3 ms (sd), 3 steps each:
    # stage noise 2 x sqrt(0.09 / 3 + 0.09 / 3) = 0.49 ms
    st = a.stages.with_columns(
        pl.col("window_ns")
        + pl.when(pl.col("stage") == "dispatch").then(2e6).when(pl.col("stage") == "expert").then(2e5).otherwise(0.0),
        pl.lit(3e5).alias("window_sd_ns"),
    )
    noisy_a = dataclasses.replace(a, stages=a.stages.with_columns(pl.lit(3e5).alias("window_sd_ns")))
    fd = a.findings.with_columns(pl.col("est_saving_ns") + 100_000)  # every saving 0.1 ms larger
    b = dataclasses.replace(noisy_a, stages=st, findings=fd, label="B", step_spread_ns=3e5, n_steps=3)
    c = compare_runs(dataclasses.replace(noisy_a, step_spread_ns=3e5, n_steps=3), b)
    ch = dict(c.stages.select("stage", "change").iter_rows())
    assert ch["dispatch"] == "worse" and ch["expert"] == "within noise" and ch["route"] == "same"
    assert c.stages.filter(pl.col("stage") == "expert")["noise_ns"].item() == pytest.approx(2 * (2 * 9e10 / 3) ** 0.5)
    assert set(c.findings["status"].to_list()) == {"within noise"}  # 0.1 ms < the step noise (0.49 ms)
    assert headline(c).endswith(
        "neither run is better. Stage windows that moved beyond their own spread: dispatch +2.00 ms."
    )
    calm = compare_runs(
        dataclasses.replace(noisy_a, step_spread_ns=3e5, n_steps=3), dataclasses.replace(b, stages=noisy_a.stages)
    )
    assert headline(calm).endswith("No stage window moved beyond its own step-to-step spread either.")


def test_exposed_comm_track_covers_every_step(samples_dir):
    # sample_traces/chunked_overlap: 3 steps with exposed comm on every rank; each step's track
    # lengths sum to that step's exposed_comm_ns (Analysis.exposed_comm, not only the timeline step)
    from ep_trace.analysis import analyze
    from ep_trace.parsers import read_trace_dir
    from ep_trace.reports.annotate import analysis_tracks

    d = samples_dir / "chunked_overlap"
    if not (d / "rank0.pt.trace.json.gz").exists():
        pytest.skip("sample_traces/chunked_overlap not generated yet (ep-trace demo)")
    a = analyze(read_trace_dir(d))
    x = analysis_tracks(a).filter(pl.col("track") == "exposed_comm")
    got = x.group_by("rank", "step").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns")).sort("rank", "step")
    want = (
        a.steps.filter(pl.col("exposed_comm_ns") > 0)
        .select(pl.col("rank").cast(pl.Int32), "step", pl.col("exposed_comm_ns").alias("ns"))
        .sort("rank", "step")
    )
    assert got.height == want.height == 12  # 4 ranks x 3 steps
    assert got.equals(want.cast(got.schema))


def test_compare_within_noise_and_no_common_rank():
    import dataclasses

    a = digest_analysis(make_fake_analysis(straggler=None), "A")
    b = dataclasses.replace(a, label="B", ranks=a.ranks.with_columns(pl.col("step_time_mean_ns") + 1_000_000))
    # 1 ms slower, but the runs' own steps spread by 3 ms (3 steps each): 2 x sqrt(9/3 + 9/3) = 4.9 ms
    noisy_a = dataclasses.replace(a, step_spread_ns=3e6, n_steps=3)
    noisy_b = dataclasses.replace(b, step_spread_ns=3e6, n_steps=3)
    c = compare_runs(noisy_a, noisy_b)
    assert c.noise_ns == pytest.approx(2 * (9e12 / 3 + 9e12 / 3) ** 0.5)
    assert headline(c).startswith("Within noise: B - A = +1.00 ms per step") and "neither run is better" in headline(c)
    assert comparison_to_dict(c)["step_time_ns"]["within_noise"] is True
    quiet = compare_runs(
        dataclasses.replace(a, step_spread_ns=1e4, n_steps=3), dataclasses.replace(b, step_spread_ns=1e4, n_steps=3)
    )
    assert headline(quiet).startswith("B is 1.00 ms slower per step than A")
    other = dataclasses.replace(b, ranks=b.ranks.with_columns(pl.col("rank") + 4))
    h = headline(compare_runs(a, other))
    assert h.startswith(
        "A and B have no rank in common (A: 0, 1, 2, 3; B: 4, 5, 6, 7): the figures compare different ranks."
    )

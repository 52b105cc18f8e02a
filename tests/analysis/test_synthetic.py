"""Exact answers on synthetic canonical tables: overlap, waits, transfer, wait matrix, clocks, stages."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis import AnalysisConfig, analyze

STARTS = [200_000, 250_000, 300_000, 500_000]


def test_gpu_job_exact(synth):
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    st = a.steps.sort("rank")
    assert st["comm_ns"].to_list() == [400_000, 350_000, 300_000, 100_000]
    assert st["compute_ns"].to_list() == [250_000] * 4
    assert st["overlapped_ns"].to_list() == [50_000] * 4
    assert st["exposed_comm_ns"].to_list() == [350_000, 300_000, 250_000, 50_000]
    assert st["barrier_wait_ns"].to_list() == [300_000, 250_000, 200_000, 0]
    assert st["transfer_ns"].to_list() == [100_000] * 4
    assert a.rank_summary["overlap_efficiency"].to_list() == [50 / 400, 50 / 350, 50 / 300, 50 / 100]
    c = a.calls.row(0, named=True)
    assert (c["last_rank"], c["arrival_skew_ns"], c["end_skew_ns"], c["transfer_ns"], c["n_ranks"]) == (
        3,
        300_000,
        0,
        100_000,
        4,
    )
    assert c["lateness_ns"] == 200_000 and c["valid"] and c["link_class"] == "inter_host"
    assert a.wait_matrix.rows() == [("0", 0, 3, 300_000), ("0", 1, 3, 250_000), ("0", 2, 3, 200_000)]
    s = a.stragglers.row(0, named=True)
    assert (s["rank"], s["times_last"], s["induced_wait_ns"]) == (3, 1, 750_000)
    # stage attribution by launch time: the comm kernel launched inside dispatch, the GEMM inside expert
    sg = a.stages.filter(pl.col("rank") == 0).sort("cpu_start_ns")
    assert sg["stage"].to_list() == ["dispatch", "expert"]
    assert sg["busy_ns"].to_list() == [400_000, 250_000]
    assert sg["window_ns"].to_list() == [400_000, 250_000]
    assert sg["comm_ns"].to_list() == [400_000, 0] and sg["exposed_comm_ns"].to_list() == [350_000, 0]
    assert sg["method"].to_list() == ["ep_trace", "ep_trace"] and a.detection_method == "ep_trace"
    kinds = [f.kind for f in a.findings]
    assert "straggler_wait" in kinds and "exposed_comm" in kinds
    summ = a.summary()
    assert summ["straggler"]["rank"] == 3 and summ["schema_version"] == 3


def test_clock_offset_recovered(synth):
    shifted = synth["gpu_job"](STARTS, 600_000, host_shift={"B": 5_000_000})
    # one matched call is below the minimum (8): the recorded clocks are kept, and the notes say so
    kept = analyze(shifted)
    assert kept.clock.select("host", "offset_ns", "n_calls", "aligned").rows() == [
        ("A", 0, 1, True),
        ("B", 0, 1, False),
    ]
    assert (
        "host B: only 1 matched collectives shared with host A (fewer than 8): its recorded clock (nsys UTC epoch / "
        "Kineto baseTimeNanoseconds) is kept, not aligned; cross-host waits carry its residual"
    ) in kept.notes
    a = analyze(shifted, AnalysisConfig(min_clock_calls=1))
    off = dict(a.clock.select("host", "offset_ns").iter_rows())
    assert off == {"A": 0, "B": -5_000_000}
    assert a.clock["residual_ns"].to_list() == [0, 0]
    assert a.wait_matrix.rows() == [("0", 0, 3, 300_000), ("0", 1, 3, 250_000), ("0", 2, 3, 200_000)]
    raw = analyze(shifted, AnalysisConfig(align_clocks=False))
    assert raw.calls["last_rank"][0] == 3 and raw.calls["arrival_skew_ns"][0] == 5_300_000


def test_timeline_intervals_exact(synth):
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    T0 = synth["T0"]
    iv = a.intervals.filter(pl.col("rank") == 0).with_columns(pl.col("start_ns") - T0, pl.col("end_ns") - T0)
    got = {tr: iv.filter(pl.col("track") == tr).select("start_ns", "end_ns").rows() for tr in iv["track"].unique()}
    assert got == {
        "comm": [(200_000, 600_000)],
        "compute": [(550_000, 800_000)],
        "exposed_comm": [(200_000, 550_000)],
        "stage": [(100_000, 400_000), (400_000, 700_000)],
        "wait": [(200_000, 500_000)],
        "transfer": [(500_000, 600_000)],
    }
    assert set(a.intervals["step"]) == {1}


def test_comms_id_matching(synth):
    t = synth["gpu_job"](STARTS, 600_000)
    c = t.collectives.with_columns(
        pl.lit(2**63 + 5, pl.UInt64).alias("comms_id"), pl.lit(None, pl.Utf8).alias("pg_name")
    )
    a = analyze(type(t)(**{**t.__dict__, "collectives": c}))
    assert a.calls.select("key", "pg_name", "last_rank", "valid").rows() == [("comms_id", "ranks:0,1,2,3", 3, True)]


def test_attribution_stays_on_the_launching_thread(synth):
    """A kernel launched by another thread (autograd) while the main thread is inside 'dispatch' is
    not charged to dispatch."""
    from ep_trace.schema import conform

    t = synth["gpu_job"](STARTS, 600_000)
    T0 = synth["T0"]
    extra = conform(
        "events",
        pl.DataFrame(
            [
                {
                    "rank": 0,
                    "event_id": 90,
                    "kind": "runtime",
                    "name": "cudaLaunchKernel",
                    "tid": 2,
                    "start_ns": T0 + 160_000,
                    "end_ns": T0 + 161_000,
                },
                {
                    "rank": 0,
                    "event_id": 91,
                    "kind": "gpu_kernel",
                    "name": "autograd_kernel",
                    "stream": 9,
                    "start_ns": T0 + 900_000,
                    "end_ns": T0 + 950_000,
                    "launch_id": 90,
                },
            ]
        ),
    )
    a = analyze(type(t)(**{**t.__dict__, "events": pl.concat([t.events, extra])}))
    d = a.stages.filter((pl.col("rank") == 0) & (pl.col("stage") == "dispatch")).row(0, named=True)
    assert (d["busy_ns"], d["window_ns"]) == (400_000, 400_000)
    assert a.steps.filter(pl.col("rank") == 0)["compute_ns"].item() == 300_000  # still compute of step 1

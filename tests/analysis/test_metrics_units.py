"""Exact answers for imbalance, alpha-beta, matching safety, CPU overlap, presets and host stalls."""

from __future__ import annotations

import polars as pl
import pytest

from ep_trace.analysis import AnalysisConfig, analyze
from ep_trace.analysis.bandwidth import alpha_beta_fit
from ep_trace.analysis.stages import detect_ranges, load_presets
from ep_trace.errors import ConfigError, NothingToAnalyzeError
from ep_trace.schema import conform

STARTS = [200_000, 250_000, 300_000, 500_000]


def test_alpha_beta_recovered():
    # T = 20 µs + B / (12.5 GB/s), exact, for 6 sizes; a second class with a latency-dominated law
    sizes = [4096, 65536, 262144, 1 << 20, 4 << 20, 16 << 20]
    rows = [
        {"link_class": "inter_host", "bytes_max": b, "transfer_ns": 20_000 + b * 0.08, "valid": True} for b in sizes
    ]
    rows += [
        {"link_class": "intra_host", "bytes_max": b, "transfer_ns": 50_000 + b / 400.0, "valid": True}
        for b in sizes[:4]
    ]
    rows += [{"link_class": "intra_host", "bytes_max": 10, "transfer_ns": 1.0, "valid": False}]
    f = {r["link_class"]: r for r in alpha_beta_fit(pl.DataFrame(rows)).iter_rows(named=True)}
    assert f["inter_host"]["alpha_us"] == pytest.approx(20.0, rel=1e-9)
    assert f["inter_host"]["beta_gbps"] == pytest.approx(12.5, rel=1e-9)
    assert f["inter_host"]["r2"] == pytest.approx(1.0) and f["inter_host"]["n"] == 6
    assert f["inter_host"]["verdict"] == "bandwidth_bound"  # 20 µs < 262144..1 MiB / 12.5 GB/s
    assert f["intra_host"]["alpha_us"] == pytest.approx(50.0) and f["intra_host"]["beta_gbps"] == pytest.approx(400.0)
    assert f["intra_host"]["verdict"] == "latency_bound" and f["intra_host"]["n"] == 4
    one = alpha_beta_fit(pl.DataFrame(rows[:2]))
    assert one["verdict"].to_list() == ["insufficient_data"] and one["alpha_us"].to_list() == [None]


def test_imbalance_from_known_counts(synth):
    # 4 experts on 4 ranks; n_e = [8, 0, 2, 2] summed over two source ranks -> I_e = 8 / 3
    rc = pl.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "step": [1] * 4,
            "layer": [0] * 4,
            "microbatch": [0] * 4,
            "expert": [0, 2, 0, 3],
            "count": [5, 2, 3, 2],
        }
    )
    # dispatch split lists: column sums L = [4+1+0+1, 2+2+0+0, 2+0+5+0, 0+1+1+5] = [6, 4, 7, 7]
    splits = [[4, 2, 2, 0], [1, 2, 0, 1], [0, 0, 5, 1], [1, 0, 0, 5]]
    t = synth["gpu_job"](STARTS, 600_000, splits=splits)
    t = type(t)(**{**t.__dict__, "routing_counts": conform("routing_counts", rc)})
    a = analyze(t)
    r = a.imbalance.row(0, named=True)
    assert r["I_e"] == pytest.approx(8 / 3)
    assert r["I_r"] == pytest.approx(7 / 6)
    assert r["I_r_send"] == pytest.approx(8 / 6)  # row sums [8, 4, 6, 6]
    assert r["local_ratio"] == pytest.approx((4 + 2 + 5 + 5) / 24)
    assert r["cross_node_ratio"] == pytest.approx((2 + 0 + 1 + 0 + 0 + 0 + 1 + 0) / 24)  # host A = {0,1}, B = {2,3}
    assert a.rank_load.sort("rank")["recv_rows"].to_list() == [6, 4, 7, 7]
    assert a.expert_load.sort("expert")["count"].to_list() == [8, 0, 2, 2]
    assert a.split_violations.height == 0
    assert a.calls["bytes_max"][0] == 8 * 1024 and a.call_ranks.sort("rank")["cross_rank_bytes_sent"].to_list() == [
        4096,
        2048,
        1024,
        1024,
    ]


def test_split_violation_listed(synth):
    splits = [[4, 2, 2, 0], [1, 2, 0, 1], [0, 0, 5, 1], [1, 0, 0, 5]]
    t = synth["gpu_job"](STARTS, 600_000, splits=splits)
    c = t.collectives.with_columns(
        pl.when(pl.col("rank") == 2).then(pl.lit([0, 0, 5, 9])).otherwise(pl.col("out_splits")).alias("out_splits")
    )
    a = analyze(type(t)(**{**t.__dict__, "collectives": c}))
    assert a.split_violations.select("src", "dst", "sent", "received").rows() == [(0, 2, 2, 0), (3, 2, 0, 9)]
    assert any(f.kind == "split_inconsistency" for f in a.findings)


def test_missing_call_is_not_mispaired(synth):
    # rank 3 misses the all_to_all: ordinal matching would pair wrong calls -> reported, not matched
    t = synth["gpu_job"](STARTS, 600_000)
    c = t.collectives.filter(pl.col("rank") != 3)
    extra = t.collectives.filter(pl.col("rank") == 0).with_columns(pl.lit(1, pl.Int64).alias("coll_id"))
    c = pl.concat([c, extra])
    a = analyze(type(t)(**{**t.__dict__, "collectives": c}))
    assert a.calls.height == 0 and a.wait_matrix.height == 0
    assert a.misaligned.select("pg_name", "step", "calls_per_rank").rows() == [("0", 1, "0:2,1:1,2:1")]
    assert any(f.kind == "missing_collective" for f in a.findings)


def test_cpu_gloo_overlap(synth):
    """CPU rank: comm = gloo worker range + blocking caller op; compute = main-thread cpu_op minus the caller op."""
    T0 = synth["T0"]
    ev = [
        {
            "rank": 0,
            "kind": "cpu_annotation",
            "name": "ProfilerStep#3",
            "tid": 1,
            "start_ns": T0,
            "end_ns": T0 + 1000,
            "seq": 3,
        },
        {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "tid": 1, "start_ns": T0 + 0, "end_ns": T0 + 300},
        {
            "rank": 0,
            "kind": "cpu_op",
            "name": "c10d::alltoall_base_",
            "tid": 1,
            "start_ns": T0 + 300,
            "end_ns": T0 + 500,
        },
        {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "tid": 1, "start_ns": T0 + 500, "end_ns": T0 + 900},
        {
            "rank": 0,
            "kind": "comm_worker",
            "name": "gloo:all_to_all",
            "tid": 9,
            "start_ns": T0 + 310,
            "end_ns": T0 + 700,
            "coll_id": 0,
        },
    ]
    c = [
        {
            "rank": 0,
            "coll_id": 0,
            "ordinal": 0,
            "cpu_start_ns": T0 + 300,
            "cpu_end_ns": T0 + 500,
            "start_ns": T0 + 310,
            "end_ns": T0 + 700,
        }
    ]
    a = analyze(synth["build"]([{"rank": 0, "world_size": 1}], ev, c))
    s = a.steps.row(0, named=True)
    # C = [300, 700), K = [0, 300) + [500, 900) -> overlap 200, exposed 200
    assert (s["step"], s["comm_ns"], s["compute_ns"], s["overlapped_ns"], s["exposed_comm_ns"]) == (
        3,
        400,
        700,
        200,
        200,
    )
    assert a.rank_summary["mode"].to_list() == ["cpu"] and a.rank_summary["overlap_efficiency"][0] == 0.5


def test_presets_and_user_toml(synth, tmp_path):
    T0 = synth["T0"]
    names = [
        "MoELayer.router_and_preprocess",
        "dispatch(F)",
        "mlp(W)",
        "c10d::alltoall_base_",
        "my_gate",
    ]
    ev = [
        {"rank": 0, "kind": "cpu_annotation", "name": n, "tid": 1, "start_ns": T0 + 10 * i, "end_ns": T0 + 10 * i + 5}
        for i, n in enumerate(names)
    ]
    # a plain all-to-all nested in the dispatch(F) range: the better tier wins in that window only
    ev.append(
        {"rank": 0, "kind": "cpu_op", "name": "c10d::alltoall_base_", "tid": 1, "start_ns": T0 + 11, "end_ns": T0 + 14}
    )
    ev = conform("events", pl.DataFrame([{"event_id": i, **e} for i, e in enumerate(ev)]))
    r = detect_ranges(ev, load_presets()).sort("cpu_start_ns")
    assert r.select("stage", "phase", "method").rows() == [
        ("route", "fwd", "preset:megatron"),
        ("dispatch", "fwd", "preset:paren"),
        ("expert", "bwd", "preset:paren"),
        ("all_to_all", "fwd", "preset:pytorch"),  # no better range overlaps it: it counts
    ]
    f = tmp_path / "p.toml"
    # the user file ADDS to the built-ins (tier 1): its range replaces the framework one where they overlap
    f.write_text(
        "[[preset]]\nname = \"mine\"\npattern = '^my_(?P<stage>gate)$'\n"
        '[[preset]]\nname = "mine"\npattern = \'^mlp\\(W\\)$\'\nstage = "shared_expert"\n'
    )
    r2 = detect_ranges(ev, load_presets(f)).sort("cpu_start_ns")
    assert r2.select("stage", "method").rows() == [
        ("route", "preset:megatron"),
        ("dispatch", "preset:paren"),
        ("shared_expert", "preset:mine"),
        ("all_to_all", "preset:pytorch"),
        ("gate", "preset:mine"),
    ]
    f.write_text("[[preset]]\nname = 'x'\n")
    with pytest.raises(ConfigError, match="--stages"):
        load_presets(f)


def test_kernel_family_fallback_and_gpu_host_stall(synth):
    t = synth["gpu_job"](STARTS, 600_000)
    ev = t.events.filter(~pl.col("name").str.starts_with("ep:")).with_columns(
        pl.when(pl.col("name").str.starts_with("nccl"))
        .then(pl.lit("void deep_ep::intranode::dispatch<8>(int*)"))
        .otherwise(pl.col("name"))
        .alias("name")
    )
    T0 = synth["T0"]
    sync = conform(
        "events",
        pl.DataFrame(
            [
                {
                    "rank": 0,
                    "event_id": 999,
                    "kind": "runtime",
                    "name": "cudaStreamSynchronize",
                    "tid": 1,
                    "start_ns": T0 + 800_000,
                    "end_ns": T0 + 900_000,
                }
            ]
        ),
    )
    a = analyze(type(t)(**{**t.__dict__, "events": pl.concat([ev, sync])}))
    assert a.detection_method == "kernel_family"
    r0 = a.stages.filter(pl.col("rank") == 0).sort("stage")
    assert r0.select("stage", "busy_ns", "method").rows() == [
        ("dispatch", 400_000, "kernel_family"),
        ("expert", 250_000, "kernel_family"),
    ]
    # the device is busy until 800 µs; the sync blocks the host 800..900 µs with the device idle
    hs = a.host_stalls.row(0, named=True)
    assert (hs["rank"], hs["name"], hs["stall_ns"], hs["step"]) == (0, "cudaStreamSynchronize", 100_000, 1)


def test_steps_filter_and_empty(synth):
    t = synth["gpu_job"](STARTS, 600_000)
    with pytest.raises(NothingToAnalyzeError, match="--steps"):
        analyze(t, AnalysisConfig(steps=(5, 9)))
    with pytest.raises(NothingToAnalyzeError):
        analyze(type(t)(**{**t.__dict__, "events": t.events.head(0)}))


def test_progress_callback(synth):
    seen = []
    analyze(synth["gpu_job"](STARTS, 600_000), progress=lambda s, d, n: seen.append((s, d, n)))
    assert seen[0] == ("steps", 0, 9) and seen[-1] == ("done", 9, 9)


def test_seq_matching_survives_a_missing_call(synth):
    """With Seq recorded, a rank that missed one call does not shift the pairing of the others."""
    t = synth["gpu_job"](STARTS, 600_000)
    c = t.collectives.with_columns(pl.lit(7, pl.Int64).alias("seq"))
    # a second call (seq 8) on ranks 0..2 only: rank 3 missed it
    extra = t.collectives.filter(pl.col("rank") < 3).with_columns(
        pl.lit(1, pl.Int64).alias("coll_id"),
        pl.lit(8, pl.Int64).alias("seq"),
        pl.col("start_ns") + 50_000,
        pl.col("end_ns") + 50_000,
    )
    a = analyze(type(t)(**{**t.__dict__, "collectives": pl.concat([c, extra])}))
    assert a.calls.sort("match_id").select("key", "n_ranks", "last_rank", "complete", "valid").rows() == [
        ("seq", 4, 3, True, True),
        ("seq", 3, 2, False, False),
    ]
    assert a.wait_matrix.rows() == [("0", 0, 3, 300_000), ("0", 1, 3, 250_000), ("0", 2, 3, 200_000)]


def test_bad_user_regex(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("[[preset]]\nname = 'x'\npattern = '^(?=look)ahead'\n")
    with pytest.raises(ConfigError, match=r"preset\[0\] pattern .* is not a valid regex"):
        load_presets(f)


def test_summary_keys_are_documented(synth):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "summary.md").read_text()
    s = analyze(synth["gpu_job"](STARTS, 600_000), AnalysisConfig(hta_compatible=True)).summary()
    keys = (
        set(s)
        | set(s["ranks"][0])
        | set(s["stages"][0])
        | set(s["imbalance"])
        | set(s["findings"][0])
        | set(s["overall"])
    )
    keys |= set(s["straggler"]) | set(s["clock"][0])
    missing = sorted(k for k in keys if f"`{k}`" not in doc)
    assert missing == []


def test_frames_follow_frame_docs(synth):
    from ep_trace.analysis.result import FRAME_DOCS
    from ep_trace.schema import SCHEMAS

    a = analyze(synth["gpu_job"](STARTS, 600_000, splits=[[4, 2, 2, 0], [1, 2, 0, 1], [0, 0, 5, 1], [1, 0, 0, 5]]))
    for name, cols in FRAME_DOCS.items():
        df = getattr(a, name)
        want = [c for c in cols if not c.startswith("(")]
        if name == "stages":
            want = [*SCHEMAS["stages"], "comm_ns", "overlapped_ns", "exposed_comm_ns", "tier"]
        if name == "count_matrix":
            want = list(SCHEMAS["routing_matrix"])
        assert sorted(df.columns) == sorted(want), name

"""Verdict hygiene: one test per rule of the findings (ep_trace.analysis.findings docstring)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from ep_trace.analysis import AnalysisConfig, analyze
from ep_trace.analysis.findings import fit_conclusive, fmt_ns, with_findings
from ep_trace.analysis.steps import select_steps

STARTS = [200_000, 250_000, 300_000, 500_000]


def test_three_significant_digits():
    assert [fmt_ns(x) for x in (2_450_857_000, 2_450_857, 53_502_000, 999_700_000, 1234, 12)] == [
        "2.45 s",
        "2.45 ms",
        "53.5 ms",
        "1.00 s",
        "1.23 µs",
        "12 ns",
    ]


def test_alpha_beta_needs_calls_and_r2(synth):
    assert not fit_conclusive({"r2": 0.0, "n": 100})
    assert not fit_conclusive({"r2": 0.95, "n": 3})
    assert not fit_conclusive({"r2": float("nan"), "n": 100})
    assert fit_conclusive({"r2": 0.85, "n": 20})
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    ab = pl.DataFrame(
        {
            "link_class": ["inter_host"],
            "alpha_us": [2796.9],
            "beta_gbps": [1.0],
            "r2": [0.0],
            "n": [40],
            "median_bytes": [64.0],
            "verdict": ["latency_bound"],
        }
    )
    kinds = [f.kind for f in with_findings(dataclasses.replace(a, alpha_beta=ab)).findings]
    assert "small_message_latency" not in kinds
    good = ab.with_columns(pl.lit(0.9).alias("r2"))
    kinds = [f.kind for f in with_findings(dataclasses.replace(a, alpha_beta=good)).findings]
    assert "small_message_latency" in kinds


def test_no_zero_saving_headline(synth):
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    perf = [f for f in a.findings if f.kind not in ("split_inconsistency", "missing_collective")]
    assert perf and all(f.est_saving_ns > 0 for f in perf)
    # the ranking is by simulated saving and every saving is a what-if's
    assert [f.est_saving_ns for f in perf] == sorted((f.est_saving_ns for f in perf), reverse=True)
    w = dict(a.whatif.select("scenario", "saving_ns").iter_rows())
    assert all(f.est_saving_ns == w[f.evidence["whatif"]["scenario"]] for f in perf)


def test_ep_remedies_only_with_ep_traffic(synth):
    t = synth["gpu_job"](STARTS, 600_000)
    ar = t.collectives.with_columns(pl.lit("allreduce").alias("collective"), pl.lit("nccl:all_reduce").alias("op_name"))
    a = analyze(dataclasses.replace(t, collectives=ar))
    text = " ".join(f.remedy + f.title for f in a.findings)
    assert a.findings and "all-to-all" not in text and "DeepEP" not in text and "expert" not in text.lower()
    assert {"fp8_dispatch", "chunked_pipeline", "balanced_routing"}.isdisjoint(set(a.whatif["scenario"]))
    ep = analyze(t)
    assert any("all-to-all" in f.remedy for f in ep.findings)


def test_all_to_all_without_moe_evidence_is_not_ep(synth):
    # the same 4-rank job with its ep: ranges and grouped GEMM renamed: even all-to-alls around
    # attention (sequence parallelism, e.g. the FastVideo AllToAll4D of nsys_ai_2gpu) are no EP traffic
    t = synth["gpu_job"](STARTS, 600_000)
    name = pl.col("name")
    ev = t.events.with_columns(
        pl.when(name.str.starts_with("ep:"))
        .then(pl.lit("AllToAll4D"))
        .when(name == "cutlass_grouped_gemm_kernel")
        .then(pl.lit("ampere_sgemm_128x64_nn"))
        .otherwise(name)
        .alias("name")
    )
    even = t.collectives.with_columns(pl.lit("all_to_all").alias("collective"))  # no split sizes given
    a = analyze(dataclasses.replace(t, events=ev, collectives=even))
    assert set(a.calls["collective"]) == {"all_to_all"} and a.rank_load.is_empty()
    note = "; no MoE routing or expert stage was found, so they are not treated as EP token traffic."
    assert "(TorchRec's TrainPipelineSparseDist)" in next(f for f in a.findings if f.kind == "exposed_comm").remedy
    text = " ".join(f.remedy.replace(note, "") + f.title for f in a.findings)
    assert a.findings and "DeepEP" not in text and "expert" not in text.lower() and "token" not in text
    comm = next(f for f in a.findings if f.kind == "exposed_comm")
    assert comm.remedy.startswith("Overlap the all-to-alls with independent compute")
    assert "not treated as EP token traffic" in comm.remedy
    strag = [f for f in a.findings if f.kind == "straggler_wait"]
    assert strag and "late before the collectives" in strag[0].title
    assert "extra work on that rank" in strag[0].remedy


def test_missing_ranks_no_wait_claims(synth):
    t = synth["gpu_job"](STARTS, 600_000)
    keep = pl.col("rank") < 3  # rank 3 of the group of 4 is not in the trace set
    t3 = dataclasses.replace(
        t, ranks=t.ranks.filter(keep), events=t.events.filter(keep), collectives=t.collectives.filter(keep)
    )
    a = analyze(t3)
    assert any("wait and straggler cannot be measured" in n for n in a.notes)
    kinds = [f.kind for f in a.findings]
    assert "straggler_wait" not in kinds
    for f in a.findings:
        assert "not wait" not in f.title and "waiting for a late rank" not in f.title
    from ep_trace.reports import digest

    assert "cannot be measured" in digest.verdict(a).context


def test_headline_never_contradicts_remedy(synth):
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    for f in a.findings:
        if "barrier wait for a late rank" in f.remedy:
            assert "transfer, not wait" not in f.title
        if "transfer, not wait" in f.title:
            assert "barrier wait" not in f.remedy


def test_setup_barrier_before_first_step_excluded(synth):
    t = synth["gpu_job"](STARTS, 600_000)
    T0 = synth["T0"]
    # a c10d::barrier long before ProfilerStep#1: rank 0 waits 1.6 s in it for rank 1
    rows = []
    for r in range(4):
        s = T0 - 2_000_000_000 + (1_600_000_000 if r == 1 else 0)
        rows.append(
            {
                "rank": r,
                "coll_id": 99,
                "collective": "barrier",
                "op_name": "c10d::barrier",
                "pg_name": "0",
                "group_ranks": [0, 1, 2, 3],
                "group_size": 4,
                "ordinal": 1,
                "cpu_start_ns": s,
                "cpu_end_ns": T0 - 300_000_000,
                "start_ns": s,
                "end_ns": T0 - 300_000_000,
                "n_kernels": 1,
                "splits_truncated": False,
            }
        )
    extra = pl.DataFrame(rows).cast({k: v for k, v in t.collectives.schema.items() if k in rows[0]})
    coll = pl.concat([t.collectives, extra], how="diagonal_relaxed").select(t.collectives.columns)
    with_barrier = analyze(dataclasses.replace(t, collectives=coll.cast(t.collectives.schema)))
    plain = analyze(t)
    assert with_barrier.wait_matrix.rows() == plain.wait_matrix.rows()
    assert with_barrier.stragglers["rank"][0] == plain.stragglers["rank"][0]
    assert any("outside the analysed profiler steps" in n for n in with_barrier.notes)


def _windows(lengths: list[int]) -> pl.DataFrame:
    t, rows = 0, []
    for s, ln in enumerate(lengths):
        rows.append((0, s, t, t + ln, 1, "profiler_step"))
        t += ln
    return pl.DataFrame(rows, schema=["rank", "step", "start_ns", "end_ns", "tid", "method"], orient="row").cast(
        {"rank": pl.Int32, "step": pl.Int64}
    )


def test_warmup_and_empty_trailing_steps():
    w = _windows([300, 100, 110, 105, 5])
    kept, notes = select_steps(w, pl.Series([0, 1, 2, 3]))  # step 4 holds no activity
    assert kept["step"].to_list() == [1, 2, 3]
    assert any("warm-up" in n for n in notes) and any("empty trailing step" in n for n in notes)
    kept, notes = select_steps(_windows([120, 100, 110]), pl.Series([0, 1, 2]))
    assert kept["step"].to_list() == [0, 1, 2] and notes == []


def test_steps_option_overrides_the_step_rules(synth):
    a = analyze(synth["gpu_job"](STARTS, 600_000), AnalysisConfig(steps=(1, 1)))
    assert a.steps["step"].unique().to_list() == [1]


@pytest.mark.parametrize("scenario", ["no_straggler", "full_overlap", "all"])
def test_whatif_rows_exact_on_synthetic_job(synth, scenario):
    # rank 3 arrives 200 µs after the others (lateness outside any expert work): the simulated
    # saving of removing it equals the others' wait it causes on the step end
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    w = dict(a.whatif.select("scenario", "saving_ns").iter_rows())
    assert scenario in w and w[scenario] >= 0
    assert float(a.replay["error_pct"].max()) == 0.0


def _whatif(rows: list[tuple[str, int, int | None]]) -> pl.DataFrame:
    from ep_trace.analysis.whatif import WHATIF_SCHEMA

    return pl.DataFrame(
        [(s, 1_000_000 - sav, sav, [0, 1, 2, 3], k) for s, sav, k in rows], schema=WHATIF_SCHEMA, orient="row"
    )


def test_exposed_comm_without_a_resource_to_overlap_names_fewer_bytes(synth):
    # ranks whose transfers cannot hide (gloo ranks without a spare core): chunking is slower, overlap
    # saves nothing, halving the dispatch bytes saves 30 µs -> the exposed-comm finding says so
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    wf = _whatif([("full_overlap", 0, None), ("fp8_dispatch", 30_000, None), ("chunked_pipeline", -5_000, 2)])
    f = [f for f in with_findings(dataclasses.replace(a, whatif=wf)).findings if f.kind == "exposed_comm"]
    assert len(f) == 1 and f[0].est_saving_ns == 30_000
    assert "overlap cannot hide it on these ranks" in f[0].title and "pipelining" not in f[0].title
    assert f[0].remedy.startswith("Send fewer bytes: dispatch in FP8")
    # where overlap helps, it stays the remedy
    wf = _whatif([("full_overlap", 20_000, None), ("fp8_dispatch", 30_000, None), ("chunked_pipeline", 12_000, 4)])
    f = [f for f in with_findings(dataclasses.replace(a, whatif=wf)).findings if f.kind == "exposed_comm"]
    assert f[0].est_saving_ns == 12_000 and "over 4 chunks" in f[0].title


def test_one_finding_per_whatif(synth):
    # a conclusive bandwidth-bound fit and the exposed-comm fallback both rest on fp8_dispatch: one finding
    a = analyze(synth["gpu_job"](STARTS, 600_000))
    wf = _whatif([("full_overlap", 0, None), ("fp8_dispatch", 30_000, None), ("chunked_pipeline", -5_000, 2)])
    ab = pl.DataFrame(
        {
            "link_class": ["inter_host"],
            "alpha_us": [1.0],
            "beta_gbps": [1.0],
            "r2": [0.99],
            "n": [40],
            "median_bytes": [1e6],
            "verdict": ["bandwidth_bound"],
        }
    )
    found = with_findings(dataclasses.replace(a, whatif=wf, alpha_beta=ab)).findings
    backed = [f.evidence["whatif"]["scenario"] for f in found if "whatif" in f.evidence]
    assert backed.count("fp8_dispatch") == 1


def test_dlrm_embedding_all_to_alls_with_sort_kernels_are_not_ep():
    # param_dlrm_8rank: TorchRec embedding all-to-alls, and DeviceRadixSort kernels that the PyTorch
    # sort family turns into 8 route rows: no MoE, so no EP remedy and no expert-load wording
    import ep_trace
    from ep_trace.analysis.finding_common import has_ep_traffic

    path = Path(__file__).resolve().parents[3] / "shared" / "external" / "kineto" / "param_dlrm_8rank"
    if not path.is_dir():
        pytest.skip("../shared/external is not beside the checkout")
    a = ep_trace.load([path])
    assert set(a.stages["stage"]) == {"all_to_all", "route"} and not has_ep_traffic(a)
    text = " ".join(f.title + " " + f.remedy for f in a.findings)
    for ep_word in ("expert", "DeepEP", "dispatch", "token all-to-all"):
        assert ep_word not in text


def _with_permute(a, busy_ns: int, stalls: pl.DataFrame | None, saving_ns: int):
    """``a`` with rank 0's permute taking ``busy_ns`` in every step and a fused_permute what-if row."""
    steps = a.steps.filter(pl.col("rank") == 0)["step"].unique().sort().to_list()
    extra = pl.DataFrame(
        {"rank": [0] * len(steps), "step": steps, "stage": ["permute"] * len(steps), "busy_ns": [busy_ns] * len(steps)}
    ).cast({"rank": a.stages.schema["rank"], "step": a.stages.schema["step"], "busy_ns": a.stages.schema["busy_ns"]})
    stages = pl.concat([a.stages, extra], how="diagonal_relaxed")
    return dataclasses.replace(a, stages=stages, whatif=_whatif([("fused_permute", saving_ns, None)]), op_stalls=stalls)


def test_pack_unpack_says_how_much_is_stalled_op_calls(synth):
    from ep_trace.analysis.op_stalls import STALL_SCHEMA

    a = analyze(synth["gpu_job"](STARTS, 600_000))
    n = a.steps.filter(pl.col("rank") == 0)["step"].n_unique()
    plain = [
        f for f in with_findings(_with_permute(a, 300_000, None, 150_000)).findings if f.kind == "pack_unpack_overhead"
    ]
    assert plain[0].title == (
        "Permute + unpermute take 300 µs per step on rank 0; fused kernels at half the time save 150 µs per step (simulated)."
    )
    assert plain[0].remedy.startswith("Fuse permute/unpermute")
    stalls = pl.DataFrame(
        [(0, "permute", 300_000 * n, 240_000 * n, 3, "aten::empty_like")], schema=STALL_SCHEMA, orient="row"
    )
    f = [
        f for f in with_findings(_with_permute(a, 300_000, stalls, 30_000)).findings if f.kind == "pack_unpack_overhead"
    ]
    assert f[0].title == (
        f"Permute + unpermute take 300 µs per step on rank 0, 240 µs of it in op calls that ran 10x or more their "
        f"usual time (3 in {n} steps); fused kernels at half the rest save 30.0 µs per step (simulated)."
    )
    assert f[0].remedy.startswith(
        "Most of this is host stalls, not data movement: 3 calls (most in aten::empty_like) took 10x or more"
    )
    assert f[0].evidence["stall_ns_per_step"] == 240_000 and f[0].evidence["stall_top_op"] == "aten::empty_like"

"""Sweep analysis on hand-built runs whose exact answer is known, and its refusal messages word for word."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import hypothesis.strategies as hst
import polars as pl
import pytest
from hypothesis import given, settings

from ep_trace.analysis.sweep import SweepRun, analyze_sweep, fit_line, sweep_dict, sweep_run_from_summary, with_knobs
from ep_trace.errors import BadInputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))
from fake_sweep import PLACEMENT, TOKENS, _latency_runs, _run  # noqa: E402


def test_fit_line_exact_and_undefined_cases():
    f = fit_line([1, 2, 3, 4], [5, 7, 9, 11])
    assert f["alpha"] == pytest.approx(3.0) and f["beta"] == pytest.approx(2.0) and f["r2"] == pytest.approx(1.0)
    assert f["alpha_se"] == pytest.approx(0.0, abs=1e-9) and f["n"] == 4
    two = fit_line([1, 2], [1, 3])
    assert two["alpha"] == pytest.approx(-1.0) and two["r2"] is None and two["alpha_lo"] is None
    assert fit_line([3, 3, 3], [1, 2, 3])["alpha"] is None  # x does not vary: no line
    assert fit_line([1, 2, 3], [4, 4, 4])["r2"] is None  # y does not vary: r² undefined


@settings(max_examples=60, deadline=None)
@given(
    alpha=hst.floats(-1e6, 1e8),
    beta=hst.floats(-1e4, 1e4),
    xs=hst.lists(hst.floats(0, 1e5), min_size=3, max_size=8, unique=True).filter(lambda v: max(v) - min(v) > 1),
)
def test_fit_line_recovers_any_exact_line(alpha, beta, xs):
    f = fit_line(xs, [alpha + beta * x for x in xs])
    scale = abs(alpha) + abs(beta) * max(xs) + 1.0
    assert f["alpha"] == pytest.approx(alpha, abs=1e-6 * scale)
    assert f["beta"] == pytest.approx(beta, abs=1e-6 * scale / max(1.0, max(xs)))
    assert all(
        math.isclose(a, b, abs_tol=1e-6 * scale)
        for a, b in zip(f["fitted"], [alpha + beta * x for x in xs], strict=True)
    )


def test_known_fixed_latency_is_recovered_per_call_and_per_all_to_all():
    r = analyze_sweep(_latency_runs(20.0))
    assert r.knob == "tokens"
    fits = {(f["stage"], f["layer"], f["x"]): f for f in r.fits.to_dicts()}
    comb, disp = fits[("combine", None, "tokens")], fits[("dispatch", None, "tokens")]
    assert comb["alpha_ns"] == pytest.approx(20e6) and comb["beta_ns_per_unit"] == pytest.approx(100.0)
    assert disp["alpha_ns"] == pytest.approx(40e6) and disp["alpha_per_a2a_ns"] == pytest.approx(20e6)
    assert fits[("combine", None, "bytes")]["beta_ns_per_unit"] == pytest.approx(100.0 / 256)
    assert comb["r2"] == pytest.approx(1.0) and comb["n"] == 3 and comb["confidence"] == "medium"
    assert r.verdict is not None and r.verdict.kind == "fixed_latency_bound"
    ev = r.verdict.evidence
    assert ev["operating_point"] == {"label": "t2048", "tokens": 2048.0}
    assert ev["parts_ns"]["fixed_latency_bound"] == pytest.approx(60e6)
    assert ev["parts_ns"]["expert_compute_bound"] == pytest.approx(2048 * 1000)
    assert "cross-node hops" in r.verdict.remedy
    assert r.throughput["monotonic"] is True and r.throughput["peak_label"] == "t2048"
    assert r.residuals.filter(pl.col("stage") == "combine")["residual_ns"].abs().max() < 1e-3


def test_expert_compute_bandwidth_and_imbalance_verdicts():
    compute = [
        _run(
            f"t{x}",
            x,
            dispatch=lambda x: 1e5 + 10 * x,
            combine=lambda x: 1e5 + 10 * x,
            expert_mean=lambda x: 5000 * x,
            expert_max=lambda x: 5100 * x,
        )  # fmt: skip
        for x in TOKENS
    ]
    assert analyze_sweep(compute).verdict.kind == "expert_compute_bound"
    bandwidth = [
        _run(
            f"t{x}",
            x,
            dispatch=lambda x: 1e5 + 8000 * x,
            combine=lambda x: 1e5 + 8000 * x,
            expert_mean=lambda x: 1000 * x,
            expert_max=lambda x: 1100 * x,
        )  # fmt: skip
        for x in TOKENS
    ]
    v = analyze_sweep(bandwidth).verdict
    assert v.kind == "bandwidth_bound" and "FP8" in v.remedy
    # the most loaded rank's share grows with the knob (skew grows with it): max/mean 1.0 -> 2.5
    imb = [
        _run(
            f"t{x}",
            x,
            dispatch=lambda x: 1e5 + 10 * x,
            combine=lambda x: 1e5 + 10 * x,
            expert_mean=lambda x: 1000 * x,
            expert_max=lambda x, s=s: 1000 * x * s,
        )  # fmt: skip
        for x, s in zip(TOKENS, (1.0, 1.8, 2.5), strict=True)
    ]
    v = analyze_sweep(imb).verdict
    assert v.kind == "imbalance_bound" and "replicate" in v.remedy
    assert v.evidence["parts_ns"]["imbalance_bound"] == pytest.approx(2048 * 1000 * 1.5)


def test_non_monotonic_throughput_is_found():
    runs = _latency_runs(1.0)
    slow = runs[1]
    fig = dict(slow.figures)
    fig["tokens_per_s"] = runs[0].figures["tokens_per_s"] * 0.5  # a dip in the middle of the sweep
    runs[1] = SweepRun(slow.label, slow.knobs, slow.identity, slow.conditions, slow.stages, fig)
    thr = analyze_sweep(runs).throughput
    assert thr["monotonic"] is False and thr["peak_label"] == "t2048"
    assert [c["significant"] for c in thr["changes"]] == [True, True]


def test_runs_of_different_jobs_are_refused_word_for_word():
    runs = _latency_runs()
    bad = [runs[0], with_knobs(runs[1], {"hidden": 128}), runs[2]]
    with pytest.raises(BadInputError) as e:
        analyze_sweep(bad, by="tokens")
    assert str(e.value) == (
        "sweep: hidden = 64 in t128 but 128 in t512; a sweep compares runs of one job that differ only in the "
        "swept knob (tokens): drop the run or sweep hidden with --by hidden"
    )
    moved = SweepRun(runs[2].label, runs[2].knobs, {"world_size": 2, "placement": ((0, (1,)),)}, {}, runs[2].stages, {})
    with pytest.raises(BadInputError) as e:
        analyze_sweep([runs[0], runs[1], moved])
    assert str(e.value) == (
        "sweep: placement differs (t128 vs t2048); a sweep compares runs of one job that differ only in the swept "
        "knob (tokens): drop the run"
    )
    bigger = SweepRun("w4", runs[2].knobs, {"world_size": 4, "placement": PLACEMENT}, {}, runs[2].stages, {})
    with pytest.raises(BadInputError) as e:
        analyze_sweep([runs[0], bigger])
    assert str(e.value) == (
        "sweep: world_size = 2 in t128 but 4 in w4; a sweep compares runs of one job that differ only in the "
        "swept knob (tokens): drop the run"
    )


def test_ep_size_sweep_may_change_world_size_and_placement():
    runs = []
    for w in (2, 4, 8):
        r = _run(f"ep{w}", 512, dispatch=lambda x, w=w: 1e6 * w, combine=lambda x, w=w: 1e6 * w,
                 expert_mean=lambda x, w=w: 8e6 / w, expert_max=lambda x, w=w: 8e6 / w,
                 knobs={"ep_size": w}, identity={"world_size": w, "placement": ((0, (w - 1,)),)})  # fmt: skip
        runs.append(r)
    res = analyze_sweep(runs)
    assert res.knob == "ep_size" and res.runs["x"].to_list() == [2.0, 4.0, 8.0]
    f = res.fits.filter((pl.col("stage") == "combine") & pl.col("layer").is_null() & (pl.col("x") == "ep_size"))
    assert f["beta_ns_per_unit"][0] == pytest.approx(1e6)


def test_knob_choice_errors_word_for_word():
    runs = _latency_runs()
    same = [runs[0], SweepRun("copy", runs[0].knobs, runs[0].identity, {}, runs[0].stages, runs[0].figures)]
    with pytest.raises(BadInputError) as e:
        analyze_sweep(same)
    assert str(e.value) == (
        "sweep: the runs do not differ in any knob (tokens, top_k, hidden, ep_size, dtype, chunks); "
        "label each run with --label RUN=KNOB:VALUE"
    )
    two = [runs[0], with_knobs(runs[1], {"chunks": 4})]
    with pytest.raises(BadInputError) as e:
        analyze_sweep(two)
    assert str(e.value) == "sweep: the runs differ in tokens, chunks; pass --by KNOB to choose the swept one"
    with pytest.raises(BadInputError) as e:
        analyze_sweep(runs[:1])
    assert str(e.value) == "sweep: needs at least 2 runs, got 1"
    with pytest.raises(BadInputError) as e:
        analyze_sweep(runs, by="batch")
    assert str(e.value) == "--by: unknown knob 'batch'; use one of tokens, top_k, hidden, ep_size, dtype, chunks"
    unknown = [with_knobs(runs[0], {"tokens": None}), runs[1], runs[2]]
    with pytest.raises(BadInputError) as e:
        analyze_sweep(unknown, by="tokens")
    assert str(e.value) == (
        "sweep: tokens is unknown for t128 (the traces do not say); pass --label RUN=tokens:VALUE for each"
    )


def test_summary_runs_use_windows_per_layer_and_labels():
    summary = {
        "schema_version": 2,  # a newer summary: unknown keys are ignored
        "n_ranks": 2,
        "ranks": [{"rank": 0, "step_time_ns": 30e6, "exposed_comm_ns": 6e6}, {"rank": 1, "step_time_ns": 28e6}],
        "stages": [
            {"rank": 0, "stage": "dispatch", "window_ns": 4e6},
            {"rank": 1, "stage": "dispatch", "window_ns": 5e6},
            {"rank": 0, "stage": "expert", "window_ns": 9e6},
            {"rank": 1, "stage": "expert", "window_ns": 7e6},
        ],
        "imbalance": {"I_r": 1.2},
        "replay": {"error_pct": 1.0},
    }
    s = sweep_run_from_summary(summary, "s.json")
    st = {r["stage"]: r for r in s.stages.to_dicts()}
    assert st["dispatch"]["t_ns"] == 4e6 and st["expert"]["t_ns"] == 9e6 and st["expert"]["t_mean_ns"] == 8e6
    assert st["step"]["t_ns"] == 30e6 and s.figures["exposed_comm_ratio"] == pytest.approx(0.2)
    assert s.figures["I_r"] == 1.2 and s.knobs["tokens"] is None
    labelled = with_knobs(s, {"tokens": 4096})
    assert labelled.figures["tokens_per_s"] == pytest.approx(2 * 4096 / 0.030)
    runs = _latency_runs()
    res = analyze_sweep([*runs, labelled])
    row = res.runs.filter(pl.col("label") == "s.json").row(0, named=True)
    assert row["source"] == "summary" and row["x"] == 4096.0
    assert any("summary runs" in n and "1 MoE layers" in n for n in res.notes)
    with pytest.raises(BadInputError) as e:
        sweep_run_from_summary({"foo": 1}, "x.json")
    assert str(e.value) == (
        "x.json: not an ep-trace summary (no 'schema_version' / 'ranks'); "
        "pass a trace directory or a file written by 'ep-trace analyze --json'"
    )


def test_sweep_json_is_nan_free_and_documented_keys():
    d = sweep_dict(analyze_sweep(_latency_runs()))
    text = json.dumps(d, allow_nan=False)  # raises on NaN / inf
    assert set(d) == {
        "schema_version",
        "knob",
        "fits",
        "runs",
        "residuals",
        "throughput",
        "verdict",
        "notes",
        "records",
    }
    assert {"stage", "layer", "x", "alpha_ns", "beta_ns_per_unit", "r2", "n"} <= set(d["fits"][0])
    assert set(d["verdict"]) == {"kind", "title", "evidence", "remedy"}
    assert d["runs"][0]["knobs"]["tokens"] == 128 and d["runs"][0]["conditions"] == {"skew": "uniform"}
    assert "NaN" not in text

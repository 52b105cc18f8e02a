"""The regression gate of ``ep-trace compare --fail-on-regression`` on saved summaries with known numbers
(golden: every noise, limit and verdict computed by hand below), its selection and its errors, and the
promise that a saved summary gates exactly as its trace directory (real sample traces)."""

from __future__ import annotations

import copy
from typing import get_args

import orjson
import polars as pl
import pytest
from fake_analysis import make_fake_analysis

from ep_trace.analysis.regression_gate import check_threshold, evaluate, history_noise, parse_gates
from ep_trace.analysis.result import FindingKind
from ep_trace.analysis.run_compare import compare_runs
from ep_trace.analysis.run_digest import digest_analysis, digest_summary
from ep_trace.analysis.step_spread import step_spread
from ep_trace.errors import ConfigError
from ep_trace.reports.gate import gate_lines, gate_to_dict, gate_verdict

MS = 1_000_000


def _summary(step1: float, expert: float, exposed: tuple[float, float], wait: tuple[float, float], **kw) -> dict:
    """A schema-3 summary of 2 ranks and 4 steps; rank 1 is the slowest (mean step ``step1``)."""
    return {
        "schema_version": 3,
        "steps": [0, 1, 2, 3],
        "overall": {"step_time_spread_ns": 200_000.0},
        "ranks": [
            {"rank": 0, "step_time_ns": 10 * MS, "exposed_comm_ns": exposed[0], "barrier_wait_ns": wait[0]},
            {"rank": 1, "step_time_ns": step1, "exposed_comm_ns": exposed[1], "barrier_wait_ns": wait[1]},
        ],
        "findings": kw.get("findings", [{"kind": "straggler_wait", "severity": "low", "est_saving_ns": 300_000}]),
        "imbalance": {"I_e": kw.get("I_e", 1.2), "I_r": kw.get("I_r", 1.1)},
        "step_spread": {
            "n_steps": 4,
            "step_time_ns": {"mean": step1, "sd": 200_000.0},
            "ranks": [
                {"rank": 0, "n_steps": 4, "step_time_mean_ns": 10 * MS, "exposed_comm_sd_ns": kw.get("ex_sd0", 1e5)}
                | {"barrier_wait_sd_ns": 1e5, "step_time_sd_ns": 2e5},
                {"rank": 1, "n_steps": 4, "step_time_mean_ns": step1, "exposed_comm_sd_ns": 2e5}
                | {"barrier_wait_sd_ns": 5e4, "step_time_sd_ns": 2e5},
            ],
            "stages": [
                {"stage": "dispatch", "busy_ns": 1.5e6, "window_ns": kw.get("dispatch", 2e6), "window_sd_ns": 1e5}
                | {"n_steps": 4},
                {"stage": "expert", "busy_ns": 3e6, "window_ns": expert, "window_sd_ns": 2e5, "n_steps": 4},
                *kw.get("more_stages", []),
            ],
            "imbalance": {"I_e": {"sd": 0.1, "n": 4}, "I_r": {"sd": 0.05, "n": 4}},
        },
    }


BASE = _summary(10.1e6, 4e6, (1.0e6, 1.2e6), (400_000, 300_000))
# NEW: step +0.8 ms, dispatch +80 µs, expert +0.6 ms, a new attn stage (300 µs), exposed comm 1.2 -> 1.9 ms
# (worst rank 1 -> rank 0), barrier wait 0.4 -> 0.6 ms, I_e 1.2 -> 1.5, I_r 1.1 -> 1.12, the straggler's
# saving 0.3 -> 0.9 ms and a new host_stall finding of 0.1 ms
NEW = _summary(
    10.9e6,
    4.6e6,
    (1.9e6, 1.0e6),
    (600_000, 200_000),
    dispatch=2.08e6,
    ex_sd0=3e5,
    I_e=1.5,
    I_r=1.12,
    more_stages=[{"stage": "attn", "busy_ns": 2e5, "window_ns": 3e5, "window_sd_ns": 1e4, "n_steps": 4}],
    findings=[
        {"kind": "straggler_wait", "severity": "low", "est_saving_ns": 900_000},
        {"kind": "host_stall", "severity": "low", "est_saving_ns": 100_000},
    ],
)


def _gate(base: dict, new: dict, **kw):
    return evaluate(compare_runs(digest_summary(base, "base.json"), digest_summary(new, "new.json")), **kw)


def test_gate_golden_numbers_from_saved_summaries():
    g = _gate(BASE, NEW)
    rows = {r["metric"]: r for r in g.lines.iter_rows(named=True)}
    assert list(rows) == [
        "step_time",
        "stage:dispatch",
        "stage:expert",
        "stage:attn",
        "exposed_comm",
        "barrier_wait",
        "I_e",
        "I_r",
        "finding:host_stall",
        "finding:straggler_wait",
    ]
    step_noise = 2 * (2 * 4e10 / 4) ** 0.5  # 2 SE of two means of 4 steps with sd 0.2 ms each: 282.8 µs
    expected = {
        # metric: (delta, noise, limit, status); 5 % of BASE's step (10.1 ms) = 505 µs
        "step_time": (0.8e6, step_noise, 505_000, "fail"),
        "stage:dispatch": (80_000, 2 * (2 * 1e10 / 4) ** 0.5, 2 * (2 * 1e10 / 4) ** 0.5, "pass"),  # 141 µs > 5 %
        "stage:expert": (0.6e6, 2 * (2 * 4e10 / 4) ** 0.5, 2 * (2 * 4e10 / 4) ** 0.5, "fail"),
        "stage:attn": (3e5, None, 505_000, "pass"),  # absent from BASE: 5 % of BASE's step
        "exposed_comm": (0.7e6, 2 * ((4e10 + 9e10) / 4) ** 0.5, 505_000, "fail"),  # worst rank each side
        "barrier_wait": (200_000, 2 * ((1e10 + 1e10) / 4) ** 0.5, 505_000, "pass"),
        "I_e": (0.3, 2 * (2 * 0.01 / 4) ** 0.5, 2 * (2 * 0.01 / 4) ** 0.5, "fail"),
        "I_r": (0.02, 2 * (2 * 0.0025 / 4) ** 0.5, 2 * (2 * 0.0025 / 4) ** 0.5, "pass"),
        "finding:host_stall": (100_000, step_noise, 505_000, "pass"),  # new: 0 -> 0.1 ms
        "finding:straggler_wait": (600_000, step_noise, 505_000, "fail"),
    }
    for m, (delta, noise, limit, status) in expected.items():
        r = rows[m]
        assert r["delta"] == pytest.approx(delta) and r["status"] == status, m
        assert (r["noise"] is None) if noise is None else r["noise"] == pytest.approx(noise), m
        assert r["limit"] == pytest.approx(limit), m
    assert g.failed == ("step_time", "stage:expert", "exposed_comm", "I_e", "finding:straggler_wait")
    assert rows["stage:attn"]["note"] == (
        "noise unknown (a run with one step, or a summary without step_spread): the threshold alone decides"
    )
    assert rows["exposed_comm"]["reference"] == "base step" and rows["exposed_comm"]["change_pct"] == pytest.approx(
        0.7e6 / 10.1e6 * 100
    )
    assert gate_lines(g)[1:] == [
        "  result  metric                     base      new         change    noise    limit",
        "  FAIL    step_time               10.1 ms  10.9 ms          +7.9%  ±283 µs  +505 µs",
        "  pass    stage:dispatch          2.00 ms  2.08 ms          +4.0%  ±141 µs  +141 µs",
        "  FAIL    stage:expert            4.00 ms  4.60 ms         +15.0%  ±283 µs  +283 µs",
        "  pass    stage:attn                 0 ns   300 µs  +3.0% of step  unknown  +505 µs",
        "  FAIL    exposed_comm            1.20 ms  1.90 ms  +6.9% of step  ±361 µs  +505 µs",
        "  pass    barrier_wait             400 µs   600 µs  +2.0% of step  ±141 µs  +505 µs",
        "  FAIL    I_e                        1.20     1.50         +25.0%    ±0.14    +0.14",
        "  pass    I_r                        1.10     1.12          +1.8%    ±0.07    +0.07",
        "  pass    finding:host_stall         0 ns   100 µs  +1.0% of step  ±283 µs  +505 µs",
        "  FAIL    finding:straggler_wait   300 µs   900 µs  +5.9% of step  ±283 µs  +505 µs",
    ]
    assert gate_verdict(g) == (
        "NEW is worse than BASE beyond the runs' noise and the 5% threshold on 5 of 10 gated metrics: "
        "step_time +800 µs (+7.9%), stage:expert +600 µs (+15.0%), exposed_comm +700 µs (+6.9% of step), "
        "I_e +0.30 (+25.0%), finding:straggler_wait +600 µs (+5.9% of step)"
    )
    d = orjson.loads(orjson.dumps(gate_to_dict(g)))
    assert d["passed"] is False and d["failed"] == list(g.failed) and d["threshold_pct"] == 5.0
    assert d["metrics"][0] == {
        "metric": "step_time",
        "unit": "ns",
        "base": 10.1e6,
        "new": 10.9e6,
        "delta": pytest.approx(0.8e6),
        "change_pct": pytest.approx(0.8e6 / 10.1e6 * 100),
        "noise": pytest.approx(step_noise),
        "reference": "base value",
        "reference_value": 10.1e6,
        "limit": pytest.approx(505_000),
        "status": "fail",
        "note": None,
    }


def test_a_higher_threshold_or_a_narrower_gate_passes():
    assert _gate(BASE, NEW, threshold_pct=30.0).passed  # every delta is under 30 % of its reference
    g = _gate(BASE, NEW, gates=parse_gates(["stage:dispatch,barrier_wait", "I_r"]))
    assert g.lines["metric"].to_list() == ["stage:dispatch", "barrier_wait", "I_r"] and g.passed
    assert gate_verdict(g) == (
        "gate passed: no gated metric is worse beyond the runs' noise and the 5% threshold (3 metrics judged)."
    )
    g = _gate(BASE, NEW, gates=("stages", "findings"))
    assert g.failed == ("stage:expert", "finding:straggler_wait")


def test_identical_runs_pass_and_better_runs_pass():
    assert _gate(BASE, BASE).passed and _gate(NEW, BASE).passed
    assert set(_gate(BASE, BASE).lines["delta"].to_list()) == {0.0}


def test_named_metrics_a_run_lacks_are_na_not_pass():
    no_routing = copy.deepcopy(NEW)
    no_routing["imbalance"] = {"I_e": None, "I_r": None}
    g = _gate(BASE, no_routing, gates=parse_gates(["I_e", "stage:shared_expert", "finding:host_bound"]))
    rows = {r["metric"]: r for r in g.lines.iter_rows(named=True)}
    assert rows["I_e"]["status"] == "n/a" and rows["I_e"]["note"] == "not measured in NEW"
    assert rows["stage:shared_expert"]["status"] == "n/a" and rows["stage:shared_expert"]["note"] == "in neither run"
    # a finding in neither run: no saving on either side, nothing got worse
    assert (rows["finding:host_bound"]["base"], rows["finding:host_bound"]["new"]) == (0.0, 0.0)
    assert rows["finding:host_bound"]["status"] == "pass"
    assert gate_lines(g)[2:4] == [
        "  n/a     I_e                  1.20     –              –        –        –  (not measured in NEW)",
        "  n/a     stage:shared_expert     –     –              –        –        –  (in neither run)",
    ]
    assert gate_verdict(g).endswith("(1 metric judged; 2 n/a).")


def test_summaries_saved_before_schema_3_gate_on_the_threshold_alone():
    old_base, old_new = copy.deepcopy(BASE), copy.deepcopy(NEW)
    for s in (old_base, old_new):
        s["schema_version"] = 2
        del s["step_spread"]
        s["stages"] = [{"rank": r, "stage": "expert", "busy_ns": 3e6, "window_ns": 0} for r in (0, 1)]
    old_base["stages"][0]["window_ns"] = old_base["stages"][1]["window_ns"] = 4e6
    old_new["stages"][0]["window_ns"] = old_new["stages"][1]["window_ns"] = 4.15e6  # +3.75 %: under 5 %
    c = compare_runs(digest_summary(old_base, "a"), digest_summary(old_new, "b"))
    assert c.step_stat == "P50"  # no per-rank mean step before schema 3: the slowest rank's P50 step
    g = evaluate(c)
    rows = {r["metric"]: r for r in g.lines.iter_rows(named=True)}
    assert rows["stage:expert"]["noise"] is None and rows["stage:expert"]["status"] == "pass"
    assert rows["exposed_comm"]["noise"] is None and rows["exposed_comm"]["status"] == "fail"  # 0.7 ms > 505 µs
    assert rows["I_e"]["noise"] is None and rows["I_e"]["limit"] == pytest.approx(0.06)  # 5 % of 1.2
    assert rows["step_time"]["noise"] == pytest.approx(2 * (2 * 4e10 / 4) ** 0.5)  # schema 2 has the step spread
    assert g.failed == ("step_time", "exposed_comm", "I_e", "finding:straggler_wait")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["foo"],
            "--gate: unknown metric 'foo'; use step_time, stages, stage:NAME, exposed_comm, barrier_wait, I_e, I_r, "
            "findings, finding:KIND or all",
        ),
        (["stage:"], "--gate: 'stage:' names no stage; use stage:NAME, e.g. stage:dispatch"),
        (["step_time,finding:"], "--gate: 'finding:' names no finding; use finding:NAME, e.g. finding:straggler_wait"),
        # the kinds are result.FindingKind's, whatever other rules add
        (["finding:slow"], "--gate: unknown finding kind 'slow'; use one of " + ", ".join(get_args(FindingKind))),
    ],
)
def test_bad_gate_names_name_the_option(values, message):
    with pytest.raises(ConfigError) as e:
        parse_gates(values)
    assert str(e.value) == message


def test_gate_names_parse_and_threshold_is_checked():
    assert parse_gates(None) == ("all",) and parse_gates([]) == ("all",)
    assert parse_gates(["step_time, stage:expert", "step_time", "I_e"]) == ("step_time", "stage:expert", "I_e")
    assert check_threshold(0) == 0.0 and check_threshold(12.5) == 12.5
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError) as e:
            check_threshold(bad)
        assert str(e.value) == f"--threshold: must be a percentage >= 0 (e.g. 5 for 5 %), got {bad!r}"


def test_step_spread_of_identical_steps():
    # the fake analysis: 3 identical steps of 4 ranks, rank r's step r µs longer
    fake = make_fake_analysis()
    s = step_spread(fake)
    assert s["n_steps"] == 3 and s["step_time_ns"]["sd"] == 0.0
    r3 = s["ranks"][3]
    assert r3["rank"] == 3 and r3["n_steps"] == 3 and r3["step_time_sd_ns"] == 0.0
    assert r3["step_time_mean_ns"] == float(fake.steps.filter(pl.col("rank") == 3)["step_time_ns"][0])
    assert {st["stage"]: st["window_sd_ns"] for st in s["stages"]} == dict.fromkeys(
        ("combine", "dispatch", "expert", "permute", "route", "unpermute"), 0.0
    )


@pytest.fixture(scope="module")
def samples(samples_dir):
    from ep_trace import load

    return {n: load([samples_dir / n]) for n in ("balanced", "skewed_straggler")}


def test_a_saved_summary_gates_exactly_as_its_trace_directory(samples):
    """Real 4-rank gloo traces: the gate from two trace directories and from their saved (JSON) summaries."""
    dirs = [digest_analysis(samples[n], n) for n in ("balanced", "skewed_straggler")]
    saved = [
        digest_summary(orjson.loads(orjson.dumps(samples[n].summary())), n) for n in ("balanced", "skewed_straggler")
    ]
    from_dirs, from_saved = evaluate(compare_runs(*dirs)), evaluate(compare_runs(*saved))
    assert from_saved.lines.equals(from_dirs.lines)
    assert from_dirs.lines.height >= 12 and from_dirs.lines["noise"].null_count() == 0
    # the committed skewed run (zipf:1.2 routing) is more imbalanced than the balanced one: I_e, I_r fail
    assert {"I_e", "I_r"} <= set(from_dirs.failed)


def _cli(capsys, tmp_path, base: dict, new: dict, *args: str) -> tuple[int, str, str]:
    from ep_trace.cli import main

    (tmp_path / "main.json").write_bytes(orjson.dumps(base))
    (tmp_path / "pr.json").write_bytes(orjson.dumps(new))
    code = main(["compare", str(tmp_path / "main.json"), str(tmp_path / "pr.json"), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_exit_3_names_the_regressed_metrics(capsys, tmp_path):
    code, out, err = _cli(capsys, tmp_path, BASE, NEW, "--fail-on-regression", "--json", str(tmp_path / "g.json"))
    assert code == 3
    assert err == (
        "regression: NEW is worse than BASE beyond the runs' noise and the 5% threshold on 5 of 10 gated metrics: "
        "step_time +800 µs (+7.9%), stage:expert +600 µs (+15.0%), exposed_comm +700 µs (+6.9% of step), "
        "I_e +0.30 (+25.0%), finding:straggler_wait +600 µs (+5.9% of step)\n"
    )
    assert "  FAIL    stage:expert            4.00 ms  4.60 ms         +15.0%  ±283 µs  +283 µs\n" in out
    assert "gate passed" not in out and "Traceback" not in err
    d = orjson.loads((tmp_path / "g.json").read_bytes())  # written before the exit
    assert d["gate"]["failed"] == ["step_time", "stage:expert", "exposed_comm", "I_e", "finding:straggler_wait"]


def test_cli_gate_passes_narrowed_or_above_threshold(capsys, tmp_path):
    code, out, err = _cli(capsys, tmp_path, BASE, NEW, "--fail-on-regression", "--gate", "stage:dispatch,I_r")
    assert code == 0 and err == ""
    assert out.endswith(
        "gate passed: no gated metric is worse beyond the runs' noise and the 5% threshold (2 metrics judged).\n"
    )
    code, out, _ = _cli(capsys, tmp_path, BASE, NEW, "--fail-on-regression", "--threshold", "30")
    assert code == 0 and "the 30% threshold (10 metrics judged)" in out
    # without --fail-on-regression a regression is reported in the JSON only, and the exit code stays 0
    code, out, _ = _cli(capsys, tmp_path, BASE, NEW, "--json", str(tmp_path / "g.json"))
    assert code == 0 and "regression gate" not in out
    assert orjson.loads((tmp_path / "g.json").read_bytes())["gate"]["passed"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gate", "stage"), "error: --gate: unknown metric 'stage'; use step_time, stages, stage:NAME, exposed_comm, barrier_wait, I_e, I_r, findings, finding:KIND or all"),
        (("--threshold", "-5"), "error: --threshold: must be a percentage >= 0 (e.g. 5 for 5 %), got -5.0"),
    ],
)  # fmt: skip
def test_cli_bad_gate_options_exit_2(capsys, tmp_path, args, message):
    code, out, err = _cli(capsys, tmp_path, BASE, NEW, "--fail-on-regression", *args)
    assert code == 2 and err.strip() == message and out == ""


def test_cli_gate_on_real_sample_trace_directories(capsys, samples_dir):
    """The committed samples: zipf:1.2 routing + a 30 ms straggler (NEW) against the balanced run (BASE)."""
    from ep_trace.cli import main

    code = main(
        ["compare", str(samples_dir / "balanced"), str(samples_dir / "skewed_straggler"), "--fail-on-regression"]
    )
    err = capsys.readouterr().err
    assert code == 3 and err.startswith(
        "regression: NEW is worse than BASE beyond the runs' noise and the 5% threshold"
    )
    assert "I_e +1.13 (+102.4%)" in err and "I_r +0.79 (+73.8%)" in err  # routing is deterministic (seed 0)


def test_docs_ci_shows_the_golden_output():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ci.md").read_text()
    shown = re.search(r"## What it prints\n\n```\n(.*?)```", doc, re.S)
    g = _gate(BASE, NEW)
    assert shown is not None and shown.group(1) == "\n".join([*gate_lines(g), "regression: " + gate_verdict(g)]) + "\n"


def test_step_spread_keys_are_documented(samples):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "summary.md").read_text()
    sp = samples["balanced"].summary()["step_spread"]
    keys = set(sp) | set(sp["ranks"][0]) | set(sp["stages"][0]) | set(sp["imbalance"]) | set(sp["step_time_ns"])
    assert sorted(k for k in keys if f"`{k}`" not in doc) == []
    assert sp["n_steps"] == len(samples["balanced"].summary()["steps"]) and sp["imbalance"]["I_e"]["n"] >= 2


def _digest(summary: dict, label: str):
    return digest_summary(summary, label)


# Two earlier runs of BASE's configuration: rank 1 steps 12.1 and 8.1 ms, so the slowest rank steps 12.1 and
# 10.0 ms (rank 0's) beside BASE's 10.1 (sd 1.1846 ms over the three runs); the same expert window (sd 0); one
# lacks the straggler finding (savings 0.3, 0.3, 0 ms).
H1 = _summary(12.1e6, 4e6, (1.0e6, 1.2e6), (400_000, 300_000))
H2 = _summary(8.1e6, 4e6, (1.0e6, 1.2e6), (400_000, 300_000), findings=[])


def test_history_noise_is_the_run_to_run_spread_of_each_metric():
    noise = history_noise(_digest(BASE, "base.json"), [_digest(H1, "h1.json"), _digest(H2, "h2.json")])
    t = 4.303  # Student t, 97.5 %, 2 degrees of freedom (3 runs)
    assert noise.runs == 3
    assert noise.by_metric["step_time"] == pytest.approx(t * 2**0.5 * 1.184624e6, rel=1e-4)  # 7.21 ms
    assert noise.by_metric["stage:expert"] == 0.0
    assert noise.by_metric["finding:straggler_wait"] == pytest.approx(t * 2**0.5 * 173_205.08, rel=1e-4)
    g = _gate(BASE, NEW, run_noise=noise)
    rows = {r["metric"]: r for r in g.lines.iter_rows(named=True)}
    # the step (+0.8 ms) and the straggler's saving (+0.6 ms) are now inside run-to-run noise; the expert
    # window, I_e and exposed comm, steady across the runs, still fail on their within-run noise
    assert rows["step_time"]["status"] == "pass" and rows["step_time"]["limit"] == pytest.approx(7.209e6, rel=1e-3)
    assert rows["step_time"]["note"] == "noise: run-to-run spread over BASE and its earlier runs (--history)"
    assert g.failed == ("stage:expert", "exposed_comm", "I_e") and g.history_runs == 3
    assert rows["stage:expert"]["noise"] == pytest.approx(282_842.7, rel=1e-4) and rows["stage:expert"]["note"] is None
    assert gate_lines(g)[0].startswith(
        "regression gate: a metric fails when NEW - BASE exceeds both the runs' noise (2 standard errors; at "
        "least the run-to-run spread over 3 runs) and 5% of its reference"
    )
    assert gate_to_dict(g)["history_runs"] == 3


def test_history_needs_two_earlier_runs():
    with pytest.raises(ConfigError) as e:
        history_noise(_digest(BASE, "base.json"), [_digest(H1, "h1.json")])
    assert str(e.value) == (
        "--history: give at least 2 earlier runs of BASE's configuration (got 1): the run-to-run spread needs 3 "
        "runs with BASE"
    )


def test_cli_history_widens_the_noise(capsys, tmp_path):
    for name, s in (("h1", H1), ("h2", H2)):
        (tmp_path / f"{name}.json").write_bytes(orjson.dumps(s))
    hist = ["--history", str(tmp_path / "h1.json"), "--history", str(tmp_path / "h2.json")]
    code, out, err = _cli(capsys, tmp_path, BASE, NEW, "--fail-on-regression", *hist)
    assert code == 3
    assert err == (
        "regression: NEW is worse than BASE beyond the runs' noise and the 5% threshold on 3 of 10 gated metrics: "
        "stage:expert +600 µs (+15.0%), exposed_comm +700 µs (+6.9% of step), I_e +0.30 (+25.0%)\n"
    )
    code, out, err = _cli(capsys, tmp_path, BASE, NEW, "--fail-on-regression", *hist[:2])
    message = (
        "error: --history: give at least 2 earlier runs of BASE's configuration (got 1): the run-to-run spread "
        "needs 3 runs with BASE"
    )
    assert code == 2 and out == "" and err.strip() == message

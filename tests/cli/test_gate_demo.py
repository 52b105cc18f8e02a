"""The CI gate on real demo runs made here (slow: seven 2-rank gloo jobs, one after the other, as CI runs
them): an injected straggler and a hot expert in NEW fail it (exit 3, naming the metrics they move); two
runs of one configuration pass it (exit 0) in each of two repeated pairs.

The machine is shared (up to 8 engineers' jobs on 2 cores). Two runs made one after the other see
different machines when other jobs come and go, and no within-run noise covers that: two identical runs
stepped 8.5 and 20.2 ms back to back while another job started (load average 0.5 -> 3.7); launched side by
side at load average 15 (to share the load), 153 and 367 ms, and 122 and 197 ms with each rank pinned.
A failed identical pair is therefore the gate's false alarm only when the machine was not oversubscribed
by others; otherwise the test says so and skips. Even below that load the CI machine's two identical runs
differed by 25 % in the expert stage (2026-12-05, load average 1.7), so the identical pair runs only with
``--validation``; benchmarks/gate_false_alarm.py measures the false-alarm rate over many pairs on a quiet
machine, and tests/reports/test_regression_gate.py checks the gate's rule on saved summaries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ep_trace.cli import main

#: Small and quick: 1 MoE layer, 128 tokens per rank (a ~7 ms step alone), 8 steps (the first may be warm-up).
KNOBS = ["--ranks", "2", "--steps", "8", "--tokens", "128", "--layers", "1", "--seed", "0"]
#: Load average above which other jobs oversubscribe the cores (a 2-rank run itself keeps ~2-3 threads busy).
BUSY = 3.0 * (os.cpu_count() or 1)


def _demo(out: Path, *extra: str) -> Path:
    p = subprocess.run(
        [sys.executable, "-c", "from ep_trace.cli import main; main()", "demo", "--out", str(out), *KNOBS, *extra],
        capture_output=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return out


def _gate(capsys, base: Path, new: Path, *args: str) -> tuple[int, str, str]:
    code = main(["compare", str(base), str(new), "--fail-on-regression", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_gate_catches_an_injected_straggler_and_a_hot_expert(capsys, tmp_path):
    base = _demo(tmp_path / "base")
    # rank 1 sleeps 100 ms in its expert stage (1 layer: 100 ms per step; a sleep costs no CPU, so other
    # jobs do not scale it: at load average 15 a 10 ms sleep was inside the noise of 170-220 ms steps, and
    # 100 ms were 80-100 ms beyond it)
    straggler = _demo(tmp_path / "straggler", "--straggler", "1:100")
    # expert 0 (rank 0's) takes 45 % of the assignments: I_e = 0.45 x 8 = 3.6 against ~1.2 (seeded routing)
    hot = _demo(tmp_path / "hot", "--skew", "hot:0:0.45")
    # main's saved summary against the pull request's traces, as in docs/ci.md
    assert main(["analyze", str(base), "--json", str(tmp_path / "base.json"), "-o", str(tmp_path / "base.html")]) == 0
    capsys.readouterr()
    code, out, err = _gate(capsys, tmp_path / "base.json", straggler)
    assert code == 3, out
    assert err.startswith("regression: NEW is worse than BASE beyond the runs' noise and the 5% threshold on ")
    # the sleep (a host-side delay, no op) is not in the late rank's expert window but in the step, in the
    # other rank's wait for it at the combine, and in the straggler finding's saving
    for metric in ("step_time", "barrier_wait", "finding:straggler_wait"):
        assert f" {metric} +" in err and f" FAIL    {metric} " in out, (metric, out)
    code, out, err = _gate(capsys, base, hot, "--gate", "I_e,I_r,step_time")
    assert code == 3 and " I_e +" in err and " I_r +" in err, out
    assert " FAIL    I_e " in out and " FAIL    I_r " in out


@pytest.mark.slow
def test_gate_passes_two_runs_of_one_configuration(capsys, tmp_path, validation):
    if not validation:
        pytest.skip("two runs made one after the other on this machine: --validation (a quiet machine) only")
    for k in (1, 2):
        load = os.getloadavg()[0]
        a, b = _demo(tmp_path / f"a{k}"), _demo(tmp_path / f"b{k}")
        load = max(load, os.getloadavg()[0])
        code, out, err = _gate(capsys, a, b)
        if code == 3 and load > BUSY:
            pytest.skip(f"pair {k}: the machine was oversubscribed (load average {load:.1f} on {os.cpu_count()} cores)")
        assert code == 0 and err == "", out
        assert "gate passed: no gated metric is worse beyond the runs' noise and the 5% threshold" in out

"""The CI gate on real demo runs made here (slow: 2 x 3 two-rank gloo jobs): two runs of one configuration
pass (exit 0) in each of two repeated pairs, an injected straggler and a hot expert in NEW fail it (exit 3,
naming the metrics they move).

The machine is shared (up to 8 engineers' jobs on 2 cores): two runs made one after the other can see
different loads, which no within-run noise covers (a 2.4x step difference was measured between two
identical back-to-back runs while another job started). The three runs of a batch therefore run at the same
time, so that the load falls on all of them alike; benchmarks/gate_false_alarm.py measures the gate's
false-alarm rate over back-to-back runs on a quiet machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ep_trace.cli import main

#: Small and quick: 1 MoE layer, 128 tokens per rank (a ~7 ms step alone), 8 steps (the first may be warm-up).
KNOBS = ["--ranks", "2", "--steps", "8", "--tokens", "128", "--layers", "1", "--seed", "0"]


def _batch(dirs: dict[str, list[str]], tmp: Path) -> dict[str, Path]:
    """Run the demos ``{name: extra args}`` at the same time; their trace directories."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", "from ep_trace.cli import main; main()", "demo", "--out", str(tmp / name), *KNOBS]
            + extra,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for name, extra in dirs.items()
    }
    for name, p in procs.items():
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, f"demo {name}: {err.decode()[-2000:]}"
    return {name: tmp / name for name in dirs}


def _gate(capsys, base: Path, new: Path, *args: str) -> tuple[int, str, str]:
    code = main(["compare", str(base), str(new), "--fail-on-regression", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_gate_passes_identical_runs_and_catches_a_straggler_and_a_hot_expert(capsys, tmp_path):
    # rank 1 sleeps 100 ms in its expert stage (1 layer: 100 ms per step; a sleep costs no CPU, so the
    # machine's load does not scale it: at load average 15, three batched runs stepped 170-220 ms ± 160 ms
    # (2 SE) and a 10 ms sleep was inside the noise); expert 0 (rank 0's) takes 45 % of the assignments
    # (I_e = 0.45 x 8 = 3.6 against ~1.2 uniform, deterministic with the seed)
    one = _batch({"a1": [], "b1": [], "straggler": ["--straggler", "1:100"]}, tmp_path)
    two = _batch({"a2": [], "b2": [], "hot": ["--skew", "hot:0:0.45"]}, tmp_path)
    for base, new in ((one["a1"], one["b1"]), (two["a2"], two["b2"])):
        code, out, err = _gate(capsys, base, new)
        assert code == 0 and err == "", out
        assert "gate passed: no gated metric is worse beyond the runs' noise and the 5% threshold" in out
    # a trace directory against a saved summary, as CI does (main's summary, the pull request's traces)
    assert main(["analyze", str(one["a1"]), "--json", str(tmp_path / "a1.json"), "-o", str(tmp_path / "a1.html")]) == 0
    capsys.readouterr()
    code, out, err = _gate(capsys, tmp_path / "a1.json", one["straggler"])
    assert code == 3, out
    assert err.startswith("regression: NEW is worse than BASE beyond the runs' noise and the 5% threshold on ")
    # the sleep is in the late rank's expert window (+50 ms as the mean over the 2 ranks); it lengthens the
    # step too (+100 ms), which on a quiet machine is far beyond the noise and at load average 15 may not be
    assert " stage:expert +" in err and " FAIL    stage:expert " in out, out
    code, out, err = _gate(capsys, two["a2"], two["hot"], "--gate", "I_e,I_r,step_time")
    assert code == 3 and "I_e +" in err and "I_r +" in err, out
    assert " FAIL    I_e " in out and " FAIL    I_r " in out

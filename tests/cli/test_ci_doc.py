"""docs/ci.md's GitHub Actions workflow: its ep-trace commands run as written (slow: the benchmark step is a
2-rank demo), the gate passes main's summary against the same run and fails a pull request that made the
routing uneven."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import orjson
import pytest
import yaml

from ep_trace.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "ci.md"


def _workflow() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/ci.md holds one workflow"
    return yaml.safe_load(blocks[0])


def _ep_trace_steps(wf: dict) -> dict[str, list[list[str]]]:
    """``{step name: [ep-trace argv, ...]}`` of the steps that run ep-trace (``\\`` continuations joined)."""
    out: dict[str, list[list[str]]] = {}
    for step in wf["jobs"]["moe-perf"]["steps"]:
        script = step.get("run", "").replace("\\\n", " ")
        cmds = [shlex.split(line)[1:] for line in script.splitlines() if line.strip().startswith("ep-trace ")]
        if cmds:
            out[step["name"]] = cmds
    return out


def test_the_workflow_is_wired_as_the_doc_says():
    wf = _workflow()
    steps = {s.get("name", s.get("uses")): s for s in wf["jobs"]["moe-perf"]["steps"]}
    assert wf["permissions"] == {"contents": "read", "actions": "read"}
    assert steps["Save the summary as main's baseline"]["with"] == {"name": "ep-trace-baseline", "path": "bench.json"}
    fetch = steps["Fetch main's baseline"]["run"]
    assert "--name ep-trace-baseline --dir baseline" in fetch and "--workflow moe-perf.yml --branch main" in fetch
    assert list(_ep_trace_steps(wf)) == ["Benchmark trace", "Summary", "Regression gate"]
    gate = _ep_trace_steps(wf)["Regression gate"][0]
    assert gate[:3] == ["compare", "baseline/bench.json", "bench.json"] and "--fail-on-regression" in gate


@pytest.mark.slow
def test_the_workflow_commands_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cmds = _ep_trace_steps(_workflow())
    for argv in cmds["Benchmark trace"] + cmds["Summary"]:
        assert main(argv) == 0, argv
    assert (tmp_path / "bench_traces").is_dir() and (tmp_path / "bench.html").is_file()
    # "Fetch main's baseline": main's artifact is this very run's summary
    (tmp_path / "baseline").mkdir()
    shutil.copy(tmp_path / "bench.json", tmp_path / "baseline" / "bench.json")
    capsys.readouterr()
    (gate,) = cmds["Regression gate"]
    assert main(gate) == 0
    out = capsys.readouterr().out
    assert "gate passed: no gated metric is worse beyond the runs' noise and the 5% threshold" in out
    assert orjson.loads((tmp_path / "gate.json").read_bytes())["gate"]["passed"] is True
    # a pull request that unbalances the routing: main's baseline routed perfectly evenly (I_e = I_r = 1, the
    # same spread); routing is seeded, so unlike timings on a shared machine this regression is certain
    base = orjson.loads((tmp_path / "bench.json").read_bytes())
    base["imbalance"]["I_e"] = base["imbalance"]["I_r"] = 1.0
    (tmp_path / "baseline" / "bench.json").write_bytes(orjson.dumps(base))
    assert main(gate) == 3
    err = capsys.readouterr().err
    assert err.startswith("regression: NEW is worse than BASE") and " I_e +" in err

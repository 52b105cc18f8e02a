"""The issue-40 classes of the robustness campaign (tests/robustness/campaign.py) and the outcome
classifier (tests/robustness/outcomes.py): the classifier's verdicts on known runs, every class making
a case with a plan, and one seeded case of each class this branch keeps through the worker.

The long campaign (every class, >= 10,000 cases) runs outside the suite::

    python tests/robustness/fuzz.py --cases 10000 --workers 4 --out fuzz_results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import campaign  # noqa: E402
import fuzz  # noqa: E402
from outcomes import classify_cli, classify_summary, control_leak, named  # noqa: E402

SANE = {"ranks": [{"rank": 0, "step_time_ns": 100, "barrier_wait_ns": 5}], "notes": [], "load_report": []}


def test_summaries_are_classified() -> None:
    assert classify_summary(SANE, "any")["outcome"] == "ok"
    # an inconsistent input accepted without a word is a silent wrong number
    assert classify_summary(SANE, "refuse") == {
        "outcome": "wrong",
        "detail": "an inconsistent input accepted without a word",
    }
    skipped = dict(SANE, load_report=[{"file": "rank2.json", "level": "error", "message": "unreadable"}])
    assert classify_summary(skipped, "refuse")["outcome"] == "excluded"
    assert named(dict(SANE, notes=["ranks 3 missing from the trace set: no routing figure claims them"]))
    negative = {"replay": {"per_rank": [{"rank": 0, "replayed_ns": -109_049_548}]}}
    assert classify_summary(negative, "any") == {
        "outcome": "wrong",
        "detail": ".replay.per_rank[0].replayed_ns=-109049548 < 0",
    }
    assert classify_summary({"imbalance": [{"local_ratio": 1.7}]}, "any")["outcome"] == "wrong"


def test_command_lines_are_classified(tmp_path: Path) -> None:
    one = "error: -o in/x.json: is the input file /in/x.json; writing it would destroy the input: choose another path\n"
    assert classify_cli(2, "", one, tmp_path, {"expect": "refuse"})["outcome"] == "error"
    usage = "Usage: ep-trace analyze [OPTIONS] DIRS...\nTry 'ep-trace analyze --help' for help.\n\nError: bad\n"
    assert classify_cli(2, "", usage, tmp_path, {})["outcome"] == "bad_message"
    assert classify_cli(0, "host vm\x9d0;x\x9c\n", "", tmp_path, {})["outcome"] == "bad_message"
    assert classify_cli(0, "", "", tmp_path, {"expect": "refuse"})["outcome"] == "wrong"
    assert classify_cli(1, "", "Traceback (most recent call last):\n  ...\n", tmp_path, {})["outcome"] == "bad_message"
    assert classify_cli(137, "", "", tmp_path, {})["outcome"] == "crash"
    page = tmp_path / "r.html"
    page.write_text('<script type="application/json" id="f-spec">{"x": ["</script><script>"]}</script>')
    # the HTML parser ends the block at the string's "</script>": what is left does not parse
    assert classify_cli(0, "", "", tmp_path, {"html": "r.html"}) == {
        "outcome": "bad_message",
        "detail": "an embedded JSON block that does not parse",
    }
    assert control_leak("ok\tno") == "0x9 at 2: 'ok'" and control_leak("fine é\n") is None


def test_a_changed_input_or_a_joined_trace_is_modified(tmp_path: Path) -> None:
    case = tmp_path / "c"
    (case / "in").mkdir(parents=True)
    (case / "in" / "rank0.pt.trace.json").write_text("{}")
    plan = {"input": "in"}
    before = fuzz.snapshot(case)
    assert fuzz.touched(case, before, plan) is None
    (case / "in" / "summary.json").write_text("{}")  # a name discovery skips: harmless
    (case / "in" / ".r.html").write_text("x")
    assert fuzz.touched(case, before, plan) is None
    (case / "in" / "rank0.pt.trace.json").write_text("{ }")
    assert fuzz.touched(case, before, plan) == "input in/rank0.pt.trace.json changed"
    (case / "in" / "rank0.pt.trace.json").write_text("{}")
    (case / "in" / "report.json").write_text("{}")
    assert fuzz.touched(case, before, plan) == "a trace-named file in/report.json written into the input directory"


@pytest.mark.parametrize("cls", [c for c in campaign.NEW_CLASSES if c != "small_event_bomb"])
def test_every_new_class_makes_a_case_with_a_plan(tmp_path: Path, cls: str) -> None:
    """(small_event_bomb builds a 0.1-1 MB gzip of up to 12 M events once per campaign: not here)"""
    for seed in (0, 1):
        case = campaign.make_case(cls, seed, tmp_path)
        plan = json.loads((case / campaign.PLAN).read_text())
        assert plan["mode"] in ("load", "cli", "cache") and plan["expect"] in ("any", "refuse")
        assert (case / plan["input"]).exists() or plan["mode"] == "cli"
        fuzz._rm(case)


KEPT_HERE = ["usage_errors", "outputs", "long_names", "control_chars", "clocks_times", "renamed_collectives"]


def test_the_classes_this_branch_keeps_pass_one_case_each(tmp_path: Path) -> None:
    """One seeded case of each class kept without the parser checks of issue 40 items 1, 2, 4."""
    assert not set(KEPT_HERE) & campaign.NEEDS_PARSER_CHECKS
    result = fuzz.run_campaign(1, tmp_path, classes=KEPT_HERE, seed0=3, workers=1)
    assert result["violations"] == [], fuzz.table(result) + "\n" + json.dumps(result["violations"], indent=1)
    assert result["cases"] == len(KEPT_HERE)

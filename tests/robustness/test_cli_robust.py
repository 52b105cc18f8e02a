"""CLI plumbing of issue 12: exit codes, Ctrl-C, output checks, --help flags, --version, escapes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ep_trace.cli import main, printable

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "sample_traces" / "balanced"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["analyze", "ingest", "compare", "annotate", "demo"])
def test_boolean_options_are_plain_flags_in_help(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and "<bool>" not in out
    if command in ("analyze", "ingest"):
        assert "--keep-going" in out


def test_keep_going_takes_no_value(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "analyze", str(BALANCED), "--keep-going", "true", "-o", str(tmp_path / "r.html"))
    assert code == 2 and "true: no such file or directory" in err  # 'true' is a path: a flag takes no value
    assert "<bool>" not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from ep_trace import __version__

    code, out, _ = run(capsys, "--version")
    assert (code, out.strip()) == (0, f"ep-trace {__version__}")


def test_ctrl_c_exits_130_with_interrupted_and_no_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ep_trace

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ep_trace, "load", interrupted)
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "analyze", str(BALANCED), "-o", str(out), "--json", str(tmp_path / "s.json"))
    assert code == 130 and err.strip().endswith("interrupted")
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no probe files left


def test_ctrl_c_in_a_real_process(tmp_path: Path) -> None:
    """SIGINT to a running ``ep-trace analyze``: exit 130, 'interrupted', no report file."""
    import signal
    import time

    out = tmp_path / "r.html"
    env = dict(os.environ, EP_TRACE_CACHE_DIR=str(tmp_path / "cache"))
    for delay in (1.0, 2.0, 0.5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "ep_trace", "analyze", str(BALANCED), "-o", str(out), "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        time.sleep(delay)  # inside the imports (__main__ handles that too) or the analysis
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        # -SIGINT: the signal landed in interpreter start-up, before any ep-trace code ran; 0: done
        if proc.returncode not in (0, -signal.SIGINT):
            break
        out.unlink(missing_ok=True)
    else:
        pytest.skip("the signal never landed inside ep-trace (start-up or a finished run)")
    assert proc.returncode == 130 and "interrupted" in err
    assert not out.exists() and not list(tmp_path.glob(".r.html.*"))


@pytest.mark.parametrize("where", ["dir", "file_parent", "json_dir"])
def test_unwritable_outputs_fail_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import ep_trace

    def must_not_run(*a: object, **k: object) -> None:
        raise AssertionError("the analysis ran before the output check")

    monkeypatch.setattr(ep_trace, "load", must_not_run)
    (tmp_path / "plain").write_text("x")
    args = {
        "dir": ["-o", str(tmp_path)],
        "file_parent": ["-o", str(tmp_path / "plain" / "r.html")],
        "json_dir": ["-o", str(tmp_path / "r.html"), "--json", str(tmp_path)],
    }[where]
    code, _, err = run(capsys, "analyze", str(BALANCED), *args)
    expected = {
        "dir": f"error: -o {tmp_path}: is a directory; pass a file name, e.g. {tmp_path / 'report.html'}",
        "file_parent": f"error: -o {tmp_path / 'plain' / 'r.html'}: {tmp_path / 'plain'} is not a directory; "
        "choose a path in a writable directory",
        "json_dir": f"error: --json {tmp_path}: is a directory; pass a file name, e.g. {tmp_path / 'report.html'}",
    }[where]
    assert code == 2 and err.strip() == expected


def test_read_only_output_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    def denied(*a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)  # (root ignores chmod; the probe is what fails)
    code, _, err = run(capsys, "analyze", str(BALANCED), "-o", str(tmp_path / "r.html"))
    assert code == 2
    assert (
        err.strip()
        == f"error: -o {tmp_path / 'r.html'}: cannot write in {tmp_path} (Permission denied); choose a writable directory"
    )


def test_ingest_output_that_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "out"
    f.write_text("x")
    code, _, err = run(capsys, "ingest", str(BALANCED), "-o", str(f))
    assert code == 2 and err.strip() == f"error: -o {f}: exists and is not a directory; pass a directory"


def test_steps_outside_the_trace_lists_the_steps(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "analyze", str(BALANCED), "--steps", "5:9", "-o", str(tmp_path / "r.html"))
    assert code == 1
    assert (
        err.strip()
        == "error: --steps 5:9: no profiler step in that range; the trace has steps 0-2 (choose FIRST:LAST within them)"
    )
    assert not (tmp_path / "r.html").exists()


def test_control_characters_in_file_names_are_escaped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    evil = tmp_path / "rank0\x1b]0;pwned\x07\x1b[2J.pt.trace.json"
    evil.write_text("{not json")
    code, _, err = run(capsys, "analyze", str(evil), "-o", str(tmp_path / "r.html"))
    assert code == 2 and "\x1b" not in err and "\x07" not in err
    assert "rank0\\x1b]0;pwned\\x07\\x1b[2J.pt.trace.json" in err


def test_keep_going_warnings_are_escaped(tmp_path: Path) -> None:
    d = tmp_path / "d"
    shutil.copytree(BALANCED, d)
    bad = d / "rank3.pt.trace.json.gz"
    bad.rename(d / "rank3\x1b[31m.pt.trace.json.gz")
    (d / "rank3\x1b[31m.pt.trace.json.gz").write_bytes(b"\x1f\x8bbroken")
    res = subprocess.run(
        [sys.executable, "-m", "ep_trace", "analyze", str(d), "--keep-going", "-q", "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        env=dict(os.environ, EP_TRACE_CACHE_DIR=str(tmp_path / "cache")),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stderr and "rank3\\x1b[31m.pt.trace.json.gz" in res.stderr


def test_printable() -> None:
    assert printable("a\x1b[2Jb\x07\x9b\n") == "a\\x1b[2Jb\\x07\\x9b\\x0a"
    assert printable("plain ü path") == "plain ü path"


def test_library_and_cli_agree_on_a_bad_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from ep_trace import load
    from ep_trace.errors import EpTraceError

    d = tmp_path / "d"
    shutil.copytree(BALANCED, d)
    os.mkfifo(d / "rank2.pt.trace.json.gz.tmp.json")
    with pytest.raises(EpTraceError) as exc:
        load(d)
    code, _, err = run(capsys, "analyze", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 2 and err.strip() == f"error: {exc.value}"
    assert "is a FIFO (named pipe), not a regular file" in err


def test_fifo_as_the_path_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "analyze", str(fifo), "-o", str(tmp_path / "r.html"))
    assert code == 2
    assert (
        err.strip()
        == f"error: {fifo}: is a FIFO (named pipe), not a regular file; pass the trace file itself (--keep-going skips it)"
    )


def test_compare_checks_its_outputs_first(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "compare", str(BALANCED), str(BALANCED), "-o", str(tmp_path))
    assert code == 2 and err.startswith(f"error: -o {tmp_path}: is a directory")


def test_trace_strings_are_escaped_in_the_terminal_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import gzip
    import json

    d = tmp_path / "d"
    shutil.copytree(BALANCED, d)
    for p in d.glob("rank*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(p.read_bytes()))
        doc["host_name"] = "vm\x1b]0;pwned\x07"
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for p in d.glob("rank*.ep.jsonl"):
        p.write_text(p.read_text().replace('"host":"vm"', '"host":"vm\\u001b]0;pwned\\u0007"'))
    code, out, err = run(capsys, "analyze", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 0, err
    assert "\x1b]0" not in out and "\x07" not in out
    # what the terminal summary renders from: every string of the analysis escaped
    import ep_trace
    from ep_trace.cli.outputs import for_display

    shown = for_display(ep_trace.load(d), escape_controls=True)
    assert set(shown.tables.ranks["host"]) == {"vm\\x1b]0;pwned\\x07"}
    assert set(shown.rank_summary["host"]) == {"vm\\x1b]0;pwned\\x07"} if "host" in shown.rank_summary.columns else True

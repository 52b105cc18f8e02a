"""Terminal and messages (issue 40): C0 / C1 controls and line separators in trace strings never reach
the terminal raw; every exit-2 message is one line, click / typer usage errors included; a trace string
holding "</script>", "<!--" or U+2028 stays inside the report's embedded JSON; rich markup in a trace
string is text."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest

from ep_trace.cli import main, printable

ROOT = Path(__file__).resolve().parents[2]
BALANCED = ROOT / "sample_traces" / "balanced"
#: an 8-bit OSC sequence (``\x9d`` ... ST ``\x9c``: retitles xterm), CSI, NEL and the Unicode separators
EVIL = "k\x9d0;pwned\x9c\x9b2J\x85\u2028\u2029\x1b]0;x\x07"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_printable_escapes_c0_c1_and_line_separators() -> None:
    assert printable(EVIL) == "k\\x9d0;pwned\\x9c\\x9b2J\\x85\\u2028\\u2029\\x1b]0;x\\x07"
    assert printable("plain ü path 東京 é") == "plain ü path 東京 é"  # printable non-ASCII stays
    assert len(printable(EVIL).splitlines()) == 1


def test_a_c1_sequence_in_a_file_name_is_escaped_in_the_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    evil = tmp_path / f"rank0{EVIL}.pt.trace.json"
    evil.write_text("{not json")
    code, _, err = run(capsys, "analyze", str(evil), "-o", str(tmp_path / "r.html"))
    assert code == 2 and len(err.splitlines()) == 1 and err.endswith("\n")
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]", err)
    # (TraceFormatError folds whitespace, U+0085 / U+2028 / U+2029 included, into one space)
    assert "rank0k\\x9d0;pwned\\x9c\\x9b2J \\x1b]0;x\\x07.pt.trace.json" in err


USAGE = [
    (["analyze", "x", "--jobs", "abc"], "error: ep-trace analyze: Invalid value for '-j' / '--jobs': Input should be a valid integer, unable to parse string as an integer; see 'ep-trace analyze --help'"),
    (["analyze"], "error: ep-trace analyze: Missing argument 'dirs'; see 'ep-trace analyze --help'"),
    (["analyze", "x", "--bogus"], "error: ep-trace analyze: No such option: --bogus (Possible options: --jobs, --out); see 'ep-trace analyze --help'"),
    (["bogus"], "error: ep-trace: No such command 'bogus'; see 'ep-trace --help'"),
    (["compare", "a"], "error: ep-trace compare: Missing argument 'b'; see 'ep-trace compare --help'"),
    (["ingest", "x"], "error: ep-trace ingest: Missing option '-o' / '--out'; see 'ep-trace ingest --help'"),
    (["demo", "--ranks", "two"], "error: ep-trace demo: Invalid value for '--ranks': Input should be a valid integer, unable to parse string as an integer; see 'ep-trace demo --help'"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "expected"), USAGE)
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", expected + "\n")


def test_a_usage_error_quoting_a_control_character_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "analyze", "x", "--jobs", "1\u20282\x9b")
    assert code == 2 and len(err.splitlines()) == 1 and "\u2028" not in err and "\x9b" not in err


def test_bare_command_prints_the_help_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 0 and "Usage" in out + err and "analyze" in out + err


def test_an_os_error_no_check_caught_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    import ep_trace

    def refused(*a: object, **k: object) -> None:
        raise OSError(5, "Input/output error", "/mnt/x/rank0.json")

    monkeypatch.setattr(ep_trace, "load", refused)
    code, _, err = run(capsys, "analyze", str(BALANCED), "-o", str(tmp_path / "r.html"))
    assert (code, err) == (
        2,
        "error: /mnt/x/rank0.json: Input/output error; check the path, its permissions and the free space\n",
    )


def test_trace_strings_with_c1_are_escaped_in_the_terminal_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import gzip
    import shutil

    d = tmp_path / "d"
    shutil.copytree(BALANCED, d)
    for p in d.glob("rank*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(p.read_bytes()))
        doc["host_name"] = f"vm{EVIL}"
        for e in doc["traceEvents"]:
            if e.get("name") == "aten::mm":
                e["name"] = f"aten::mm{EVIL}"
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for p in d.glob("rank*.ep.jsonl"):
        p.write_text(p.read_text().replace('"host":"vm"', '"host":' + json.dumps(f"vm{EVIL}")))
    code, out, err = run(capsys, "analyze", str(d), "-o", str(tmp_path / "r.html"))
    assert code == 0, err
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]", out + err)


def test_rich_markup_in_a_finding_title_is_text() -> None:
    from rich.console import Console

    sys.path.insert(0, str(ROOT / "tests" / "reports"))
    from fake_analysis import make_fake_analysis

    from ep_trace.analysis.result import Finding
    from ep_trace.reports.terminal import summary_renderables

    a = make_fake_analysis()
    f = Finding("exposed_comm", "high", "kernel[/] [bold red]X[/bold red] is exposed", 150_000, {}, "fix")
    a = dataclasses.replace(a, findings=(f,))
    con = Console(record=True, width=200)
    for r in summary_renderables(a):
        con.print(r)  # a str cell would raise rich.errors.MarkupError: closing tag '[/]' has nothing to close
    assert "kernel[/] [bold red]X[/bold red] is exposed" in con.export_text()


def test_the_report_json_keeps_script_ends_and_separators_inside() -> None:
    import plotly.graph_objects as go

    from ep_trace.reports.html_page import figure_html

    name = "k</script><script>alert(1)</script><!--<script>\u2028\u2029</SCRIPT >"
    html = figure_html(go.Figure(go.Bar(x=[name], y=[1], name=name)), "fig-x", "none")
    body = re.fullmatch(r'.*<script type="application/json" id="fig-x-spec">(.*?)</script></div>', html, re.S)
    assert body is not None and "<" not in body.group(1)  # no "</script", no "<!--" for the HTML parser
    spec = json.loads(body.group(1))
    assert spec["data"][0]["x"] == [name] and spec["data"][0]["name"] == name

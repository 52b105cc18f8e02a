"""Outputs never touch inputs (issue 40): every output option of every command that resolves to an
input file (a path, a symbolic link, a hard link), lies inside an input read whole, or is named like a
trace inside an input directory is refused before any work, exit 2, one line; no input file changes.
OS errors on outputs (a name longer than the OS allows, a read-only or full disk) are one-line errors."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from ep_trace.cli import main

BALANCED = Path(__file__).resolve().parents[2] / "sample_traces" / "balanced"
LONG = "a" * 300  # > NAME_MAX (255 bytes) of Linux file systems


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


@pytest.fixture()
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of sample_traces/balanced in ``tmp_path/in``, the cwd = ``tmp_path``, and every command's
    work replaced by a failure: a refused output must be refused before it."""
    import ep_trace
    import ep_trace.cli.compare
    import ep_trace.cli.sweep
    import ep_trace.parsers.parquet_io

    d = tmp_path / "in"
    shutil.copytree(BALANCED, d)
    (tmp_path / "link.json.gz").symlink_to(d / "rank0.pt.trace.json.gz")
    os.link(d / "rank1.ep.jsonl", tmp_path / "hard.txt")
    monkeypatch.chdir(tmp_path)

    def must_not_run(*a: object, **k: object) -> None:
        raise AssertionError("work started before the output check")

    monkeypatch.setattr(ep_trace, "load", must_not_run)
    monkeypatch.setattr(ep_trace.parsers.parquet_io, "ingest_to", must_not_run)
    monkeypatch.setattr(ep_trace.cli.compare, "load_run", must_not_run)
    monkeypatch.setattr(ep_trace.cli.sweep, "run_sweep", must_not_run)
    return d


def _refused(capsys: pytest.CaptureFixture[str], job: Path, argv: list[str], message: str) -> None:
    before = _hashes(job.parent)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {message}\n"
    assert _hashes(job.parent) == before  # no file anywhere under tmp_path changed, none was added


IN = "/in"  # placeholder for the resolved input directory in the messages below
KINETO = "is named like a Kineto trace inside the input directory {IN}: the next run on it would read it as a rank; choose another name or directory"
SIDECAR = KINETO.replace("a Kineto trace", "a sidecar")
DESTROY = "is the input file {IN}/rank0.pt.trace.json.gz; writing it would destroy the input: choose another path"
HARD = "is the same file as the input {IN}/rank1.ep.jsonl (a hard link); writing it would destroy the input: choose another path"
INPUT_DIR = (
    "is an input directory; what is written there would change the input of the next run: choose another directory"
)

CASES = {
    "analyze -o input": (["analyze", "in", "-o", "in/rank0.pt.trace.json.gz"], "-o in/rank0.pt.trace.json.gz: " + DESTROY),
    "analyze -o symlink": (["analyze", "in", "-o", "link.json.gz"], "-o link.json.gz: " + DESTROY),
    "analyze -o hard link": (["analyze", "in", "-o", "hard.txt"], "-o hard.txt: " + HARD),
    "analyze --json trace-named": (
        ["analyze", "in", "-o", "r.html", "--json", "in/sub/summary2.json"],
        "--json in/sub/summary2.json: " + KINETO,
    ),
    "analyze --record sidecar-named": (
        ["analyze", "in", "-o", "r.html", "--record", "in/rank7.ep.jsonl"],
        "--record in/rank7.ep.jsonl: " + SIDECAR,
    ),
    "analyze file input, --json sidecar-named beside it": (
        ["analyze", "in/rank0.pt.trace.json.gz", "-o", "r.html", "--json", "in/rank9.ep.jsonl"],
        "--json in/rank9.ep.jsonl: " + SIDECAR,
    ),
    "analyze --stages file": (
        ["analyze", "in", "-o", "stages.toml", "--stages", "stages.toml"],
        "-o stages.toml: is the input file {TMP}/stages.toml; writing it would destroy the input: choose another path",
    ),
    "analyze -o = --json": (["analyze", "in", "-o", "r.html", "--json", "r.html"], "--json r.html: same path as -o; pass different paths"),
    "ingest -o input dir": (["ingest", "in", "-o", "in"], "-o in: " + INPUT_DIR),
    "annotate -o input dir": (["annotate", "in", "-o", "in"], "-o in: " + INPUT_DIR),
    "annotate -o inside input dir": (
        ["annotate", "in", "-o", "in/ann"],
        "-o in/ann (its rank0.ep-annotated.json.gz): " + KINETO,
    ),
    "compare -o input": (["compare", "in", "in", "-o", "in/rank0.pt.trace.json.gz"], "-o in/rank0.pt.trace.json.gz: " + DESTROY),
    "compare --json trace-named": (["compare", "in", "in", "--json", "in/diff.json"], "--json in/diff.json: " + KINETO),
    "sweep --json trace-named": (["sweep", "in", "in", "--json", "in/sweep.json"], "--json in/sweep.json: " + KINETO),
    "sweep -o input": (["sweep", "in", "in", "-o", "in/rank3.ep.jsonl"], "-o in/rank3.ep.jsonl: is the input file {IN}/rank3.ep.jsonl; writing it would destroy the input: choose another path"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_on_an_input_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], job: Path, case: str
) -> None:
    argv, message = CASES[case]
    if case == "analyze --stages file":
        (job.parent / "stages.toml").write_text("")
    _refused(capsys, job, argv, message.format(IN=os.path.realpath(job), TMP=os.path.realpath(job.parent)))


def test_an_ingest_output_is_read_whole(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch) -> None:
    from ep_trace.parsers.parquet_io import ingest

    tables = tmp_path / "tables"
    ingest(BALANCED, tables, use_cache=False)
    monkeypatch.chdir(tmp_path)
    before = _hashes(tables)
    code = main(["analyze", "tables", "-o", "r.html", "--json", "tables/manifest.json"])
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"error: --json tables/manifest.json: is inside the input {os.path.realpath(tables)}, which is read whole "
        "(an ingest output or an Nsight export directory); choose a path outside it\n"
    )
    assert _hashes(tables) == before


def test_outputs_that_do_not_touch_inputs_still_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch
) -> None:
    """A hidden name or summary.json (names discovery skips) in the input directory, and an ingest output
    inside it (Parquet tables: no trace names), are no inputs: written, and the inputs are unchanged."""
    d = tmp_path / "in"
    shutil.copytree(BALANCED, d)
    monkeypatch.chdir(tmp_path)
    before = _hashes(d)
    code = main(["analyze", "in", "-q", "-o", "in/.report.html", "--json", "in/summary.json"])
    assert code == 0, capsys.readouterr().err
    code = main(["ingest", "in", "-q", "-o", "in/tables"])
    assert code == 0, capsys.readouterr().err
    after = _hashes(d)
    assert {k: v for k, v in after.items() if k in before} == before
    assert {".report.html", "summary.json", "tables/manifest.json"} <= set(after)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["analyze", "in", "-o", f"{LONG}.html"], "-o"),
        (["analyze", "in", "-o", "r.html", "--json", f"{LONG}.json"], "--json"),
        (["analyze", "in", "-o", "r.html", "--record", f"d/{LONG}/r.yaml"], "--record"),
        (["compare", "in", "in", "--json", f"{LONG}.json"], "--json"),
        (["sweep", "in", "in", "-o", f"{LONG}.html"], "-o"),
        (["ingest", "in", "-o", f"{LONG}"], "-o"),
        (["annotate", "in", "-o", f"x/{LONG}"], "-o"),
    ],
)
def test_a_name_longer_than_the_os_allows_is_one_line(
    capsys: pytest.CaptureFixture[str], job: Path, argv: list[str], option: str
) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    path = argv[argv.index(option) + 1]
    fix = "choose another directory" if argv[0] in ("ingest", "annotate") else "choose a shorter name"
    assert code == 2 and err == f"error: {option} {path}: File name too long; {fix}\n"


@pytest.mark.parametrize(
    ("err_no", "text"), [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")]
)
def test_a_read_only_or_forbidden_directory_is_one_line(
    capsys: pytest.CaptureFixture[str], job: Path, monkeypatch: pytest.MonkeyPatch, err_no: int, text: str
) -> None:
    import tempfile

    def refused(*a: object, **k: object) -> None:
        raise OSError(err_no, text)

    monkeypatch.setattr(tempfile, "mkstemp", refused)  # the probe is what the OS refuses
    code = main(["analyze", "in", "-o", "out/r.html"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: -o out/r.html: cannot write in . ({text}); choose a writable directory\n"


def test_a_full_disk_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ep_trace.cli import outputs
    from ep_trace.errors import OutputError

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", full)
    with pytest.raises(OutputError) as exc:
        outputs.write_atomic(tmp_path / "r.html", b"x" * 100)
    assert (
        str(exc.value)
        == f"{tmp_path / 'r.html'}: cannot write (No space left on device); free space or choose another path"
    )
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


def test_a_name_near_the_limit_is_written(tmp_path: Path) -> None:
    """255 bytes is a legal name: the temporary file beside it must not be longer than the limit."""
    from ep_trace.cli.outputs import check_writable, write_atomic

    p = tmp_path / ("b" * 250 + ".html")
    check_writable(p, "-o")
    write_atomic(p, b"ok")
    assert p.read_bytes() == b"ok"

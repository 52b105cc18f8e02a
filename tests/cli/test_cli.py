"""The analyze / compare / annotate commands through ep_trace.cli.main: exit codes and exact messages."""

from __future__ import annotations

import gzip
import re

import orjson
import pytest

from ep_trace.analysis.whatif_checks import RERUN_CHECKS
from ep_trace.cli import app, main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_command_has_help_with_examples(capsys):
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"analyze", "compare", "annotate"} <= set(names)
    for name in names:
        code, out, _ = _run(capsys, name, "--help")
        assert code == 0, name
        assert re.search(rf"Usage: .*\b{name} \[OPTIONS\]", out), name
        if name in ("analyze", "compare", "annotate", "demo", "ingest"):
            assert "Examples" in out, name


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("x", "error: --steps: expected FIRST:LAST or N (e.g. 2:5), got 'x'"),
        ("5:2", "error: --steps: need 0 <= FIRST <= LAST, got '5:2'"),
        ("1:2:3", "error: --steps: expected FIRST:LAST or N (e.g. 2:5), got '1:2:3'"),
    ],
)
def test_bad_steps_is_a_config_error(capsys, tmp_path, samples_dir, steps, message):
    code, _, err = _run(
        capsys, "analyze", str(samples_dir / "balanced"), "-o", str(tmp_path / "r.html"), "--steps", steps
    )
    assert code == 2 and err.strip() == message


def test_bad_options_name_the_option(capsys, tmp_path, samples_dir):
    code, _, err = _run(
        capsys, "analyze", str(samples_dir / "balanced"), "--format", "perfetto", "-o", str(tmp_path / "r.html")
    )
    assert code == 2 and err.strip() == "error: --format: unknown format 'perfetto'; use auto, kineto or nsys"
    code, _, err = _run(capsys, "analyze", str(samples_dir / "balanced"), "--stages", str(tmp_path / "none.toml"))
    assert (
        code == 2
        and err.strip()
        == f"error: --stages: {tmp_path / 'none.toml'}: no such file; pass a TOML file of stage-name patterns"
    )
    code, _, err = _run(capsys, "analyze", str(tmp_path / "missing"), "-o", str(tmp_path / "r.html"))
    assert code == 2 and err.strip() == f"error: {tmp_path / 'missing'}: no such file or directory; check the path"
    assert not (tmp_path / "r.html").exists()


def test_empty_directory_is_nothing_to_analyze(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "analyze", str(tmp_path / "empty"), "-o", str(tmp_path / "r.html"))
    assert code == 1 and err.strip() == (
        f"error: {tmp_path / 'empty'}: no trace files found; point at a directory of "
        "rank*.pt.trace.json[.gz], *.sqlite / *.nsys-rep or *.ep-events.parquet files"
    )
    assert not (tmp_path / "r.html").exists()


def test_not_a_summary_json(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = _run(capsys, "compare", str(bad), str(bad))
    assert code == 2 and err.startswith(f"error: {bad}: not valid JSON (")
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    code, _, err = _run(capsys, "compare", str(other), str(other))
    assert code == 2 and err.strip() == (
        f"error: {other}: not an ep-trace summary (no 'schema_version' / 'ranks'); "
        "pass a file written by 'ep-trace analyze --json'"
    )


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory, samples_dir):
    """analyze run once on each committed sample (real 4-rank gloo traces)."""
    out = tmp_path_factory.mktemp("analyze")
    res = {}
    for name in ("balanced", "skewed_straggler"):
        code = main(
            ["analyze", str(samples_dir / name), "-o", str(out / f"{name}.html"), "--json", str(out / f"{name}.json")]
        )
        res[name] = code
    return out, res


def test_analyze_real_sample_writes_report_and_summary(analyzed):
    out, codes = analyzed
    assert codes == {"balanced": 0, "skewed_straggler": 0}
    html = (out / "skewed_straggler.html").read_text()
    assert html.count('class="plotly-graph-div ep-fig"') >= 9
    summary = orjson.loads((out / "skewed_straggler.json").read_bytes())
    assert summary["schema_version"] == 3 and [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    assert summary["replay"]["error_pct"] <= 2.0 and summary["whatif"] and summary["critical_path"]["by_cause"]
    assert "sample_traces/skewed_straggler/rank3.pt.trace.json.gz" in html
    # each what-if carries its measured error against reruns, null where unchecked and for the bound
    err = {w["scenario"]: w["rerun_error_pct"] for w in summary["whatif"]}
    assert err["no_straggler"] == [RERUN_CHECKS["no_straggler"].error_lo_pct, RERUN_CHECKS["no_straggler"].error_hi_pct]
    assert err["all"] is None and all(v is None for s, v in err.items() if s not in RERUN_CHECKS)


def test_analyze_terminal_summary(capsys, tmp_path, samples_dir):
    code, out, _ = _run(capsys, "analyze", str(samples_dir / "skewed_straggler"), "-o", str(tmp_path / "r.html"))
    assert code == 0
    assert "verdict" in out and "top findings" in out and "4 ranks, 3 steps analysed" in out
    assert re.search(r"^report: .*r\.html$", out, re.M)


def test_compare_two_saved_summaries(capsys, analyzed, tmp_path):
    out, _ = analyzed
    code, text, _ = _run(
        capsys,
        "compare",
        str(out / "balanced.json"),
        str(out / "skewed_straggler.json"),
        "-o",
        str(tmp_path / "diff.html"),
        "--json",
        str(tmp_path / "diff.json"),
    )
    assert code == 0
    # 3 steps of 176-302 ms each (4 ranks on 2 shared cores): the 65 ms difference is within the runs' spread
    assert re.match(r"(B is [\d.]+ [mµ]?s (faster|slower) per step than A|Within noise: B - A = )", text)
    diff = orjson.loads((tmp_path / "diff.json").read_bytes())
    a = orjson.loads((out / "balanced.json").read_bytes())
    b = orjson.loads((out / "skewed_straggler.json").read_bytes())
    # schema 3 summaries carry each rank's mean step (step_spread.ranks): the statistic of trace directories
    assert diff["step_time_ns"]["statistic"] == "mean"
    step = lambda s: max(r["step_time_mean_ns"] for r in s["step_spread"]["ranks"])  # noqa: E731
    assert diff["step_time_ns"]["delta"] == pytest.approx(step(b) - step(a))
    assert diff["explained_by_stages_ns"] + diff["unexplained_ns"] == pytest.approx(diff["step_time_ns"]["delta"])
    assert {r["stage"] for r in diff["stages"]} >= {"dispatch", "expert", "combine"}
    assert "Plotly.newPlot(" in (tmp_path / "diff.html").read_text()


def test_annotate_writes_perfetto_traces(capsys, tmp_path, samples_dir):
    code, out, _ = _run(capsys, "annotate", str(samples_dir / "skewed_straggler"), "-o", str(tmp_path / "ann"))
    assert code == 0 and out.startswith(f"wrote 4 annotated trace(s) to {tmp_path / 'ann'}")
    doc = orjson.loads(gzip.decompress((tmp_path / "ann" / "rank0.ep-annotated.json.gz").read_bytes()))
    evs = doc["traceEvents"]
    tracks = {e["args"]["track"] for e in evs if e["ph"] == "X" and e["pid"] == 2_000_000}
    assert {"stage", "comm", "wait"} <= tracks
    assert any(e["ph"] == "X" and e["name"].startswith("ProfilerStep#") for e in evs)


def test_annotate_refuses_the_input_directory(capsys, samples_dir):
    d = samples_dir / "balanced"
    code, _, err = _run(capsys, "annotate", str(d), "-o", str(d))
    assert code == 2 and err.strip() == (
        f"error: -o {d}: is an input directory; what is written there would change the input of the next run: "
        "choose another directory"
    )


def test_analyze_external_dlrm_names_rank7_latest_arriver(tmp_path, external_dir):
    from ep_trace.cli.outputs import build_report

    a = build_report(external_dir / "kineto" / "param_dlrm_8rank", tmp_path / "dlrm.html")
    assert a.rank_summary.height == 8
    top = a.stragglers.sort("times_last", descending=True).row(0, named=True)
    assert top["rank"] == 7  # external/README.md: rank 7 starts last in the first four all_to_alls
    html = (tmp_path / "dlrm.html").read_text()
    # the straggler ranking on the page starts with rank 7
    assert re.search(
        r'Straggler ranking</h3><div class="tbl"><table><thead>.*?</thead><tbody><tr><td class="l">7</td>', html
    )


@pytest.mark.hta
def test_with_hta_section(tmp_path, external_dir):
    from ep_trace.cli.outputs import build_report

    build_report(external_dir / "kineto" / "param_dlrm_8rank", tmp_path / "r.html", with_hta=True)
    html = (tmp_path / "r.html").read_text()
    assert "Temporal breakdown per rank" in html and "Idle-time breakdown per rank" in html
    # HTA's own numbers for rank 0 of this trace (idle 6419 µs, compute 1034 µs)
    assert '<tr><td class="l">0</td><td>6419.0</td><td>1034.0</td>' in html


def test_analyze_and_annotate_nsys_input(capsys, tmp_path, external_dir):
    src = external_dir / "nsys" / "nsys_ai_2gpu" / "mfu_2gpu_before.sqlite"
    code, out, _ = _run(
        capsys, "analyze", str(src), "-o", str(tmp_path / "n.html"), "--json", str(tmp_path / "n.json"), "-q"
    )
    assert code == 0
    summary = orjson.loads((tmp_path / "n.json").read_bytes())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert '<td class="l">nsys</td>' in (tmp_path / "n.html").read_text()
    code, out, _ = _run(capsys, "annotate", str(src), "-o", str(tmp_path / "ann"))
    assert code == 0 and sorted(p.name for p in (tmp_path / "ann").iterdir()) == [
        "rank0.ep-annotated.json.gz",
        "rank1.ep-annotated.json.gz",
    ]
    doc = orjson.loads(gzip.decompress((tmp_path / "ann" / "rank1.ep-annotated.json.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= 1_000_000 and e["pid"] < 2_000_000]
    assert kernels and all(e["dur"] >= 0 for e in kernels)


def test_analyze_several_directories_of_one_job(capsys, tmp_path, samples_dir):
    import shutil

    a, b = tmp_path / "node0", tmp_path / "node1"
    for d, ranks in ((a, (0, 1)), (b, (2, 3))):
        d.mkdir()
        for r in ranks:
            for suffix in ("pt.trace.json.gz", "ep.jsonl"):
                shutil.copy(samples_dir / "balanced" / f"rank{r}.{suffix}", d)
    code, _, _ = _run(
        capsys, "analyze", str(a), str(b), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json"), "-q"
    )
    assert code == 0
    two = orjson.loads((tmp_path / "s.json").read_bytes())
    assert [r["rank"] for r in two["ranks"]] == [0, 1, 2, 3]
    # the two cached directories are merged lazily (events left on disk): the same summary as one
    # directory of the four ranks
    both = tmp_path / "all"
    both.mkdir()
    for d in (a, b):
        for f in d.iterdir():
            shutil.copy(f, both)
    assert (
        _run(capsys, "analyze", str(both), "-o", str(tmp_path / "r1.html"), "--json", str(tmp_path / "s1.json"), "-q")[
            0
        ]
        == 0
    )
    assert orjson.loads((tmp_path / "s1.json").read_bytes()) == two
    code, _, err = _run(capsys, "analyze", str(a), str(a), "-o", str(tmp_path / "r2.html"))
    assert (
        code == 2
        and err.strip() == f"error: {a}: rank 0 is also in {a}; pass directories of one job with disjoint ranks"
    )


def test_with_hta_missing_dependency_message(capsys, tmp_path, samples_dir, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)  # import fails as if the extra were absent
    code, _, err = _run(capsys, "analyze", str(samples_dir / "balanced"), "-o", str(tmp_path / "r.html"), "--with-hta")
    assert code == 2
    assert err.strip() == (
        "error: --with-hta: holistictraceanalysis is not installed (hta.trace_analysis missing); "
        "install it with: pip install 'ep-trace[hta]'"
    )
    assert not (tmp_path / "r.html").exists()


def test_build_report_reports_progress(tmp_path, samples_dir):
    from ep_trace.cli.outputs import build_report

    seen: list[tuple[str, int, int]] = []
    build_report(samples_dir / "balanced", tmp_path / "r.html", progress=lambda s, d, t: seen.append((s, d, t)))
    stages = list(dict.fromkeys(s for s, _, _ in seen))
    assert stages[0] == "read" and stages[-1] == "render"
    assert ("read", 4, 4) in seen and seen[-1] == ("render", 9, 9)


def test_analyze_reuses_the_ingest_cache_and_accepts_an_ingest_directory(capsys, tmp_path, samples_dir, monkeypatch):
    # a second analyze of an unchanged directory reads the cached tables (no parsing), with the same
    # summary; --no-cache parses; an `ep-trace ingest` output directory is analysed as it is
    from ep_trace.parsers import dispatch

    src = samples_dir / "balanced"
    cache = tmp_path / "cache"
    monkeypatch.setenv("EP_TRACE_CACHE_DIR", str(cache))
    first, again = tmp_path / "a.json", tmp_path / "b.json"
    assert _run(capsys, "analyze", str(src), "-o", str(tmp_path / "a.html"), "--json", str(first), "-q")[0] == 0
    assert len(list(cache.iterdir())) == 1
    real = dispatch.read_batches
    monkeypatch.setattr(dispatch, "read_batches", lambda *a, **k: pytest.fail("parsed although cached"))
    assert _run(capsys, "analyze", str(src), "-o", str(tmp_path / "b.html"), "--json", str(again), "-q")[0] == 0
    assert orjson.loads(again.read_bytes()) == orjson.loads(first.read_bytes())
    with pytest.raises(pytest.fail.Exception, match="parsed although cached"):
        main(["analyze", str(src), "-o", str(tmp_path / "c.html"), "-q", "--no-cache"])
    monkeypatch.setattr(dispatch, "read_batches", real)
    tables = tmp_path / "tables"
    assert _run(capsys, "ingest", str(src), "-o", str(tables))[0] == 0
    monkeypatch.setattr(dispatch, "read_batches", lambda *a, **k: pytest.fail("parsed an ingest directory"))
    third = tmp_path / "c.json"
    assert _run(capsys, "analyze", str(tables), "-o", str(tmp_path / "d.html"), "--json", str(third), "-q")[0] == 0
    assert orjson.loads(third.read_bytes())["ranks"] == orjson.loads(first.read_bytes())["ranks"]


def test_no_cache_spills_to_a_scratch_directory_removed_on_exit(capsys, tmp_path, samples_dir, monkeypatch):
    # --no-cache parses again but still streams the events to disk (read back a block of ranks at a
    # time), in a scratch directory that is gone when the command returns; no cache entry is kept
    import tempfile

    import ep_trace

    cache, scratch = tmp_path / "cache", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("EP_TRACE_CACHE_DIR", str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen = []
    real_load = ep_trace.load

    def spy(*a, **k):
        seen.append(k.get("cache"))
        assert list(scratch.iterdir())  # the scratch root exists while the analysis runs
        return real_load(*a, **k)

    monkeypatch.setattr(ep_trace, "load", spy)
    src = samples_dir / "balanced"
    out = tmp_path / "a.json"
    assert (
        _run(capsys, "analyze", str(src), "-o", str(tmp_path / "a.html"), "--json", str(out), "-q", "--no-cache")[0]
        == 0
    )
    assert len(seen) == 1 and seen[0] is not True and seen[0] is not False and seen[0].parent == scratch
    assert list(scratch.iterdir()) == [] and not cache.exists()
    assert orjson.loads(out.read_bytes())["ranks"]

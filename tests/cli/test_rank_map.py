"""``--rank-map`` on analyze / ingest / annotate / compare: an explicit map beats the ranks in the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ep_trace.cli import main
from ep_trace.cli.rank_map import parse_rank_map
from ep_trace.errors import ConfigError

BASE = 1_700_000_000_000_000_000


def _trace(path: Path) -> Path:
    # both files claim rank 0 (e.g. two single-GPU processes profiled without a process group)
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 11,
            "dur": 1,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "sm90_xmma_gemm_bf16",
            "pid": 0,
            "tid": 7,
            "ts": 20,
            "dur": 30,
            "args": {"correlation": 1, "stream": 7, "device": 0},
        },
    ]
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 0, "world_size": 2},
        "baseTimeNanoseconds": BASE,
        "traceEvents": ev,
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture()
def job(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    _trace(d / "gpu-a.pt.trace.json")
    _trace(d / "gpu-b.pt.trace.json")
    return d


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_analyze_and_ingest_with_repeated_rank_map(capsys, job: Path, tmp_path: Path):
    code, _, err = _run(capsys, "analyze", str(job), "-o", str(tmp_path / "r.html"), "-q")
    assert code == 2 and "rank 0 appears in two files" in err
    a, b = job / "gpu-a.pt.trace.json", job / "gpu-b.pt.trace.json"
    out_json = tmp_path / "s.json"
    code, _, err = _run(
        capsys,
        "analyze",
        str(job),
        "-o",
        str(tmp_path / "r.html"),
        "--json",
        str(out_json),
        "-q",
        "--rank-map",
        f"1={a}",
        "--rank-map",
        f"0={b}",
    )
    assert code == 0, err
    s = json.loads(out_json.read_text())
    assert s["n_ranks"] == 2 and [r["rank"] for r in s["ranks"]] == [0, 1]
    code, _, err = _run(
        capsys, "ingest", str(job), "-o", str(tmp_path / "t"), "-q", "--rank-map", f"1={a}", "--rank-map", f"0={b}"
    )
    assert code == 0, err
    from ep_trace.parsers import read_parquet

    r = read_parquet(tmp_path / "t").ranks.sort("rank")
    assert [(x, Path(f).name, s) for x, f, s in r.select("rank", "source_file", "rank_source").rows()] == [
        (0, "gpu-b.pt.trace.json", r["rank_source"][0]),
        (1, "gpu-a.pt.trace.json", r["rank_source"][1]),
    ]


def test_rank_map_file_and_annotate_compare(capsys, job: Path, tmp_path: Path):
    f = tmp_path / "ranks.txt"
    f.write_text(f"# rank=path\n0={job / 'gpu-a.pt.trace.json'}\n1=gpu-b.pt.trace.json  # by name\n")
    code, _, err = _run(capsys, "annotate", str(job), "-o", str(tmp_path / "ann"), "--rank-map", str(f))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "ann").iterdir()) == [
        "rank0.ep-annotated.json.gz",
        "rank1.ep-annotated.json.gz",
    ]
    code, _, err = _run(capsys, "compare", str(job), str(job), "--rank-map", str(f))
    assert code == 0, err


def test_bad_rank_maps_are_one_line_config_errors(capsys, job: Path, tmp_path: Path):
    code, _, err = _run(capsys, "analyze", str(job), "-o", str(tmp_path / "r.html"), "--rank-map", "a.json")
    assert code == 2
    assert err.strip().endswith(
        "--rank-map: a.json: no such file; use R=PATH (e.g. 0=node0/report_a.sqlite), pid:PID=R, or a file of such lines"
    )
    with pytest.raises(ConfigError) as e:
        parse_rank_map(["x=a.json"])
    assert str(e.value) == (
        "--rank-map: 'x=a.json' is not a rank mapping; use R=PATH (e.g. 0=node0/report_a.sqlite), pid:PID=R, "
        "or a file of such lines"
    )
    with pytest.raises(ConfigError, match=r"--rank-map: a.json is given ranks 0 and 1; give each file one rank"):
        parse_rank_map(["0=a.json", "1=a.json"])
    with pytest.raises(ConfigError, match=r"--rank-map: rank 0 is given to a.json and b.json; give each rank one file"):
        parse_rank_map(["0=a.json", "0=b.json"])
    assert parse_rank_map(["pid:3001=1"]) == {"3001": 1}
    assert parse_rank_map(None) is None

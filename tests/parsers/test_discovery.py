"""Trace-directory discovery: subdirectories (TensorBoard plugins/profile/<run>/, per-run folders),
non-trace files skipped with one warning each, files of different jobs or runs refused naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ep_trace.errors import RankConflictError, TraceFormatError
from ep_trace.parsers.dispatch import discover, read_trace_dir

from .conftest import write_trace, x


def _ev() -> list[dict]:
    return [
        x("cpu_op", "aten::mm", 10, 5),
        x("cuda_runtime", "cudaLaunchKernel", 11, 1, correlation=1),
        x("kernel", "sm90_xmma_gemm", 20, 30, pid=0, tid=7, correlation=1, stream=7, device=0),
    ]


def test_tensorboard_log_dir_is_searched_recursively(tmp_path: Path):
    run = tmp_path / "logs" / "plugins" / "profile" / "2026_12_01_09_00_00"
    run.mkdir(parents=True)
    write_trace(run / "host-a_101.pt.trace.json.gz", _ev(), rank=0)
    write_trace(run / "host-a_102.pt.trace.json.gz", _ev(), rank=1)
    (tmp_path / "logs" / "events.out.tfevents.1").write_bytes(b"\x00")  # no trace type: left out silently
    inputs, _ = discover(tmp_path / "logs")
    assert [(p.relative_to(tmp_path).as_posix(), f) for p, f in inputs] == [
        ("logs/plugins/profile/2026_12_01_09_00_00/host-a_101.pt.trace.json.gz", "kineto"),
        ("logs/plugins/profile/2026_12_01_09_00_00/host-a_102.pt.trace.json.gz", "kineto"),
    ]
    t = read_trace_dir(tmp_path / "logs")
    assert t.ranks["rank"].to_list() == [0, 1] and t.load_report == ()


def test_stray_json_is_skipped_with_one_warning_but_an_error_when_named(tmp_path: Path):
    d = tmp_path / "job"
    d.mkdir()
    write_trace(d / "rank0.pt.trace.json", _ev(), rank=0)
    (d / "config.json").write_text(json.dumps({"lr": 0.1}))
    (d / "sub").mkdir()
    (d / "sub" / "hparams.json").write_text(json.dumps({"experts": 64}))
    t = read_trace_dir(d)
    assert [(Path(i.file).name, i.level, i.message) for i in t.load_report] == [
        (
            "config.json",
            "warning",
            "skipped, not a trace file: not a Chrome/Kineto trace: no 'traceEvents' list (top level: ['lr'])",
        ),
        (
            "hparams.json",
            "warning",
            "skipped, not a trace file: not a Chrome/Kineto trace: no 'traceEvents' list (top level: ['experts'])",
        ),
        ("job", "warning", "world size 2 but no trace file for 1 rank (1): every figure covers rank 0 only"),
    ]
    with pytest.raises(TraceFormatError, match="config.json: not a Chrome/Kineto trace"):
        read_trace_dir(d / "config.json")


def test_two_runs_in_one_tree_are_refused_naming_the_folders(tmp_path: Path):
    for run in ("run1", "run2"):
        (tmp_path / run).mkdir()
        write_trace(tmp_path / run / "rank0.pt.trace.json", _ev(), rank=0)
    with pytest.raises(RankConflictError) as e:
        read_trace_dir(tmp_path)
    a, b = tmp_path / "run1", tmp_path / "run2"
    assert str(e.value) == (
        f"rank 0 appears in two files: {a / 'rank0.pt.trace.json'} and {b / 'rank0.pt.trace.json'}; "
        f"they are in different folders ({a}, {b}): point at one run's folder"
    )


def test_files_of_different_world_sizes_list_every_group(tmp_path: Path):
    write_trace(tmp_path / "rank0.pt.trace.json", _ev(), rank=0, world_size=2)
    write_trace(tmp_path / "rank1.pt.trace.json", _ev(), rank=1, world_size=2)
    write_trace(tmp_path / "rank2.pt.trace.json", _ev(), rank=2, world_size=4)
    with pytest.raises(RankConflictError) as e:
        read_trace_dir(tmp_path)
    f = [str(tmp_path / f"rank{r}.pt.trace.json") for r in range(3)]
    assert str(e.value) == (
        f"files from different jobs: world sizes differ (2: {f[0]}, {f[1]}; 4: {f[2]}); put one job per directory"
    )


def _chrome(path: Path, events: list[dict]) -> Path:
    """Another tool's Chrome trace: no Kineto key, no Kineto category (SGLang's request spans)."""
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def test_another_tools_chrome_trace_is_not_a_rank(tmp_path: Path):
    """SGLang writes ``<id>-TP-<r>-perfetto.json.gz`` request spans beside its torch traces: read as a
    rank it took rank 0 from no evidence and clashed with the real rank 0 (or its sidecar)."""
    d = tmp_path / "sglang"
    d.mkdir()
    write_trace(d / "1733000000.1-TP-0.trace.json.gz", _ev(), rank=0)
    write_trace(d / "1733000000.1-TP-1.trace.json.gz", _ev(), rank=1)
    spans = [x("request", "req 7", 10, 50), x("scheduler", "run_batch", 12, 3)]
    _chrome(d / "1733000000.1-TP-0-perfetto.json", spans)
    t = read_trace_dir(d)
    assert t.ranks["rank"].to_list() == [0, 1]
    assert [(Path(i.file).name, i.level, i.message) for i in t.load_report] == [
        (
            "1733000000.1-TP-0-perfetto.json",
            "warning",
            "skipped, not a trace file: not a Chrome/Kineto trace of torch.profiler: no Kineto key (schemaVersion, "
            "distributedInfo, deviceProperties, ...) and none of its event categories (cpu_op, kernel, ...; this "
            "file has: request, scheduler)",
        )
    ]
    with pytest.raises(TraceFormatError) as e:
        read_trace_dir(d / "1733000000.1-TP-0-perfetto.json")
    assert str(e.value).endswith(
        "1733000000.1-TP-0-perfetto.json: not a Chrome/Kineto trace of torch.profiler: no Kineto key "
        "(schemaVersion, distributedInfo, deviceProperties, ...) and none of its event categories (cpu_op, "
        "kernel, ...; this file has: request, scheduler); pass the torch.profiler traces (*.pt.trace.json[.gz]) "
        "and move other tools' Chrome traces out of the directory"
    )


def test_a_bare_kineto_file_is_still_read(tmp_path: Path):
    """Keys stripped by a post-processing tool: a Kineto category, or torch's own file name, is enough."""
    d = tmp_path / "bare"
    d.mkdir()
    _chrome(d / "rank0.json", _ev())  # categories cpu_op / kernel, no key
    _chrome(d / "rank1.pt.trace.json", [x("my_tool", "step", 10, 5)])  # torch.profiler's file name
    t = read_trace_dir(d)
    assert t.ranks["rank"].to_list() == [0, 1]


def test_sglang_per_stage_files_of_one_rank_say_why(tmp_path: Path):
    d = tmp_path / "by_stage"
    d.mkdir()
    write_trace(d / "1733000000.1-TP-0-EXTEND.trace.json.gz", _ev(), rank=0)
    write_trace(d / "1733000000.1-TP-0-DECODE.trace.json.gz", _ev(), rank=0)
    with pytest.raises(RankConflictError) as e:
        read_trace_dir(d)
    assert str(e.value) == (
        f"rank 0 appears in two files: {d / '1733000000.1-TP-0-DECODE.trace.json.gz'} and "
        f"{d / '1733000000.1-TP-0-EXTEND.trace.json.gz'}; SGLang's profile_by_stage writes one file per forward "
        "stage (-EXTEND, -DECODE): analyse one stage per directory"
    )

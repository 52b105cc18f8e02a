"""`ep-trace sweep`, `ep-trace analyze --record` and `ep-trace demo --sweep` parsing, on the committed samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ep_trace.cli import main
from ep_trace.cli.demo import parse_sweep
from ep_trace.cli.sweep import parse_labels
from ep_trace.errors import ConfigError

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_analyze_record_writes_yaml_with_nulls_for_what_traces_cannot_give(tmp_path, capsys):
    rec_path = tmp_path / "run.yaml"
    assert (
        main(["analyze", str(SAMPLES / "balanced"), "-o", str(tmp_path / "r.html"), "-q", "--record", str(rec_path)])
        == 0
    )
    assert capsys.readouterr().out.rstrip().endswith(f"run record: {rec_path}")
    rec = yaml.safe_load(rec_path.read_text())
    assert list(rec) == ["schema_version", "run", "model", "hardware", "parallelism", "path", "workload",
                         "performance", "communication", "status"]  # fmt: skip
    assert rec["model"] == {"experts": 8, "top_k": 2, "hidden": 256, "dtype": "float32", "moe_layers": 2}
    assert rec["hardware"]["ranks"] == 4 and rec["hardware"]["hosts"] == 1 and rec["hardware"]["gpus_per_host"] == 0
    assert rec["hardware"]["interconnect"] is None and rec["parallelism"]["tp_size"] is None
    assert rec["parallelism"] == {"ep_size": 4, "tp_size": None, "cross_node_hops_per_a2a": 0}
    assert rec["path"]["a2a_backend"] == "gloo" and rec["path"]["kernel_family"] == "gloo"
    assert rec["path"]["a2a_ops"] == ["c10d::alltoall_base_"] and rec["path"]["fused_moe"] is False
    assert rec["workload"]["tokens_per_rank"] == 512 and rec["workload"]["tokens_per_step"] == 2048
    assert rec["workload"]["batch"] is None and rec["workload"]["chunks"] == 1
    assert rec["performance"]["step_time_ns"] > 0 and rec["performance"]["tokens_per_s"] > 0
    assert rec["communication"]["a2a_calls_per_layer"] == 3.0  # count exchange + dispatch + combine
    assert 0 <= rec["communication"]["exposed_comm_ratio"] <= 1
    assert rec["status"]["holds_for"] == {"tokens": 512, "top_k": 2, "hidden": 256, "ep_size": 4,
                                          "dtype": "float32", "chunks": 1}  # fmt: skip
    assert rec["status"]["verdict"]["kind"]


def test_backward_sample_record_says_training(tmp_path):
    rec_path = tmp_path / "run.yaml"
    assert (
        main(["analyze", str(SAMPLES / "backward"), "-o", str(tmp_path / "r.html"), "-q", "--record", str(rec_path)])
        == 0
    )
    assert yaml.safe_load(rec_path.read_text())["workload"]["phase"] == "training"


def test_sweep_over_chunks_of_the_samples(tmp_path, capsys):
    out, js, recs = tmp_path / "sweep.html", tmp_path / "sweep.json", tmp_path / "records"
    argv = ["sweep", str(SAMPLES / "balanced"), str(SAMPLES / "chunked_overlap"), "-o", str(out), "--json", str(js),
            "--records", str(recs)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    # chunks does not change the bytes moved: α and β cannot be split, and the all-to-alls dominate
    assert (
        text.startswith("no verdict: chunks does not change the bytes an all-to-all moves")
        and f"sweep report: {out}" in text
    )
    d = json.loads(js.read_text())
    assert d["knob"] == "chunks" and [r["x"] for r in d["runs"]] == [1.0, 4.0]
    assert {f["stage"] for f in d["fits"]} >= {"dispatch", "combine", "expert", "moe_layer", "step"}
    assert all(f["n"] == 2 and f["r2"] is None for f in d["fits"])  # 2 runs: a line, no r²
    assert d["verdict"] is None
    assert sorted(p.name for p in recs.iterdir()) == ["balanced.yaml", "chunked_overlap.yaml"]
    assert out.stat().st_size > 1_000_000  # plotly embedded once


def test_sweep_refuses_runs_that_differ_in_nothing_or_in_two_things(tmp_path, capsys):
    argv = ["sweep", str(SAMPLES / "balanced"), str(SAMPLES / "skewed_straggler"), "-o", str(tmp_path / "s.html")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: sweep: the runs do not differ in any knob (tokens, top_k, hidden, ep_size, dtype, chunks); "
        "label each run with --label RUN=KNOB:VALUE"
    )
    # swept tokens (labelled) while the traces say chunks differ too: not one job's sweep
    argv = ["sweep", str(SAMPLES / "balanced"), str(SAMPLES / "chunked_overlap"), "--by", "tokens",
            "--label", "balanced=tokens:512", "--label", "chunked_overlap=tokens:1024", "-o", str(tmp_path / "s.html")]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: sweep: chunks = 1 in balanced but 4 in chunked_overlap; a sweep compares runs of one job "
        "that differ only in the swept knob (tokens): drop the run or sweep chunks with --by chunks"
    )
    assert not (tmp_path / "s.html").exists()


def test_sweep_with_labels_on_a_summary_and_a_trace_dir(tmp_path, capsys):
    summary = tmp_path / "chunked.json"
    assert (
        main(
            ["analyze", str(SAMPLES / "chunked_overlap"), "-o", str(tmp_path / "r.html"), "-q", "--json", str(summary)]
        )
        == 0
    )
    js = tmp_path / "sweep.json"
    argv = ["sweep", str(SAMPLES / "balanced"), str(summary), "--label", f"{summary.name}=chunks:4",
            "-o", str(tmp_path / "s.html"), "--json", str(js)]  # fmt: skip
    assert main(argv) == 0
    d = json.loads(js.read_text())
    assert [r["source"] for r in d["runs"]] == ["trace", "summary"]
    assert any("summary runs" in n for n in d["notes"]) and d["records"][1] is None


def test_label_and_sweep_option_errors_word_for_word():
    runs = [Path("a/r1"), Path("a/r2")]
    assert parse_labels(["r1=tokens:128", "a/r2=dtype:bfloat16"], runs) == {
        Path("a/r1"): {"tokens": 128},
        Path("a/r2"): {"dtype": "bfloat16"},
    }
    with pytest.raises(ConfigError) as e:
        parse_labels(["r1=tokens"], runs)
    assert str(e.value) == "--label: expected RUN=KNOB:VALUE (e.g. runs/a=tokens:512), got 'r1=tokens'"
    with pytest.raises(ConfigError) as e:
        parse_labels(["r1=batch:4"], runs)
    assert str(e.value) == (
        "--label: unknown knob 'batch' in 'r1=batch:4'; use one of tokens, top_k, hidden, ep_size, dtype, chunks, "
        "experts, moe_layers"
    )
    with pytest.raises(ConfigError) as e:
        parse_labels(["r3=tokens:1"], runs)
    assert str(e.value) == "--label: 'r3' is not one of the runs given (a/r1, a/r2)"
    assert parse_sweep(["tokens=128,512", "skew=uniform,hot:0:0.4"]) == [
        ("tokens", [128, 512]),
        ("skew", ["uniform", "hot:0:0.4"]),
    ]
    with pytest.raises(ConfigError) as e:
        parse_sweep(["skew=uniform,zipf:1.2"])
    assert str(e.value) == (
        "--sweep: the first knob is the fitted x and must be one of tokens, top_k, hidden, chunks, ranks; "
        "got skew (vary it alongside, in a second --sweep)"
    )
    with pytest.raises(ConfigError) as e:
        parse_sweep(["tokens=128,512", "skew=uniform"])
    assert (
        str(e.value) == "--sweep: every swept knob needs the same number of values, at least 2 (got tokens: 2, skew: 1)"
    )
    with pytest.raises(ConfigError) as e:
        parse_sweep(["tokens=a,b"])
    assert str(e.value) == "--sweep: tokens: values must be numbers, got 'a,b'"


def test_demo_sweep_validates_every_configuration_before_running(tmp_path, capsys):
    argv = ["demo", "--out", str(tmp_path), "--sweep", "chunks=1,4", "--link-latency-ms", "20"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --link-latency-ms: needs --chunks 1 (a host-side delay would stall the pipelined GEMMs too), "
        "got --chunks 4"
    )
    assert not any(tmp_path.iterdir())  # nothing ran


def test_record_of_a_third_party_gpu_trace_leaves_unknowns_null(tmp_path, external_dir):
    rec_path = tmp_path / "dlrm.yaml"
    src = external_dir / "kineto" / "param_dlrm_8rank"
    assert main(["analyze", str(src), "-o", str(tmp_path / "r.html"), "-q", "--record", str(rec_path)]) == 0
    rec = yaml.safe_load(rec_path.read_text())
    assert rec["hardware"] == {"ranks": 8, "hosts": None, "gpus_per_host": None, "device": "gpu", "interconnect": None}
    assert rec["path"]["kernel_family"] == "nccl" and rec["path"]["a2a_ops"] == ["c10d::alltoall_base_"]
    assert rec["model"] == {"experts": None, "top_k": None, "hidden": None, "dtype": None, "moe_layers": None}
    assert rec["workload"]["tokens_per_rank"] is None and rec["performance"]["tokens_per_s"] is None
    assert rec["performance"]["step_time_ns"] > 0


def test_link_latency_knob_is_validated_word_for_word():
    from ep_trace.workloads.demo import DemoConfig

    with pytest.raises(ConfigError) as e:
        DemoConfig(link_latency_ms=-1.0)
    assert str(e.value) == "--link-latency-ms: must be a finite number of ms >= 0, got -1.0"
    with pytest.raises(ConfigError) as e:
        DemoConfig(link_latency_ms=float("nan"))
    assert str(e.value) == "--link-latency-ms: must be a finite number of ms >= 0, got nan"
    meta = DemoConfig(tokens=64, link_latency_ms=20, skew="hot:1:0.4").workload_meta()
    assert meta == {"name": "ep_trace.workloads.demo", "tokens": 64, "layers": 2, "steps": 8, "chunks": 1,
                    "skew": "hot:1:0.4", "straggler": None, "link_latency_ms": 20.0, "backward": False, "huge_pages": True,
                    "seed": 0, "phase": "forward"}  # fmt: skip

"""DemoConfig validation, the `ep-trace demo` command, and one real chunked multi-rank demo run."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import orjson
import polars as pl
import pytest

from ep_trace.cli import main
from ep_trace.errors import ConfigError
from ep_trace.workloads.comm_priority import realtime_permitted
from ep_trace.workloads.demo import DemoConfig, run_demo
from ep_trace.workloads.knobs import SkewSpec, Straggler, skew_probabilities
from ep_trace.workloads.launcher import find_jemalloc
from ep_trace.workloads.truth import layer_truth

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_missing_jemalloc_fails_before_the_out_dir_is_made(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EP_TRACE_JEMALLOC", str(tmp_path / "absent.so"))
    with pytest.raises(ConfigError, match=r"^--allocator jemalloc: no libjemalloc found"):
        run_demo(DemoConfig(ranks=2, allocator="jemalloc"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"top_k": 9}, "--top-k: 9 is larger than --experts 8"),
        ({"ranks": 0}, "--ranks: must be an integer >= 1, got 0"),
        ({"ranks": 3}, "--experts: 8 is not a multiple of --ranks 3 (each rank owns E/W experts)"),
        ({"tokens": 0}, "--tokens: must be an integer >= 1, got 0"),
        ({"chunks": 0}, "--chunks: must be an integer >= 1, got 0"),
        ({"comm_priority": "high"}, "--comm-priority: 'high' is not one of auto, realtime, normal"),
        (
            {"skew": "foo"},
            "--skew: unknown spec 'foo'; use uniform, zipf:EXPONENT (e.g. zipf:1.2), hot:EXPERT:SHARE (e.g. hot:3:0.5), "
            "hotset:E1,E2,...:SHARE, hotrank:RANK:SHARE, spread:N:SHARE, rotate:N:SHARE, cold-rank:RANK, "
            "affinity:OFFSET:SHARE or burst:EVERY:SPEC (docs/capture.md)",
        ),
        ({"skew": "zipf:-1"}, "--skew: zipf exponent must be > 0, got -1"),
        ({"skew": "zipf:x"}, "--skew: exponent 'x' in 'zipf:x' is not a number"),
        ({"skew": "hot:8:0.2"}, "--skew: hot expert 8 is not an expert id in 0..7 (--experts 8)"),
        (
            {"skew": "hot:3:0.7"},
            "--skew: hot share 0.7 must be in (0, 1/top_k] = (0, 0.5] (--top-k 2: a token picks an expert at most once)",
        ),
        ({"straggler": "7:30"}, "--straggler: rank 7 is out of range 0..3 (--ranks 4)"),
        ({"straggler": "2"}, "--straggler: expected RANK:MS (e.g. 2:30), got '2'"),
        ({"straggler": "2:-5"}, "--straggler: delay must be a finite number of ms >= 0, got -5"),
        ({"backend": "mpi"}, "--backend: unknown backend 'mpi'; use gloo or nccl"),
        ({"allocator": "tcmalloc"}, "--allocator: 'tcmalloc' is not one of auto, jemalloc, glibc"),
        (
            {"backward": True, "chunks": 2},
            "--backward: needs --chunks 1 (the chunked pipeline is forward-only), got --chunks 2",
        ),
        ({"alt_chunks": -1}, "--alt-chunks: must be an integer >= 0, got -1"),
        ({"alt_skew": "zipf:x"}, "--alt-skew: exponent 'x' in 'zipf:x' is not a number"),
        ({"alt_skew": "hot:8:0.2"}, "--alt-skew: hot expert 8 is not an expert id in 0..7 (--experts 8)"),
        (
            {"backward": True, "alt_chunks": 4},
            "--backward: needs --chunks 1 (the chunked pipeline is forward-only), got --alt-chunks 4",
        ),
        (
            {"link_latency_ms": 5.0, "alt_chunks": 4},
            "--link-latency-ms: needs --chunks 1 (a host-side delay would stall the pipelined GEMMs too), "
            "got --alt-chunks 4",
        ),
    ],
)
def test_bad_knobs_name_the_option(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        DemoConfig(**kwargs)
    assert str(exc.value).startswith(message)


def test_nccl_without_gpus_is_a_config_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() >= 4:
        pytest.skip("this machine has 4 GPUs")
    with pytest.raises(
        ConfigError, match=r"^--backend: nccl needs one CUDA device per rank: --ranks 4 but \d device\(s\) visible$"
    ):
        run_demo(DemoConfig(backend="nccl"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_alt_chunks_alternate_by_step() -> None:
    # even steps (A) run --chunks, odd steps (B) --alt-chunks; the warm-up steps -1 / -2 run both paths
    cfg = DemoConfig(chunks=1, alt_chunks=4)
    assert [cfg.chunks_at(s) for s in (-2, -1, 0, 1, 2, 3)] == [1, 4, 1, 4, 1, 4]
    assert cfg.workload_meta()["alt_chunks"] == 4 and cfg.max_chunks == 4
    plain = DemoConfig(chunks=2)
    assert [plain.chunks_at(s) for s in (0, 1)] == [2, 2] and "alt_chunks" not in plain.workload_meta()


def test_alt_skew_alternates_by_step() -> None:
    import torch

    from ep_trace.workloads.demo import routing_bias

    cfg = DemoConfig(skew="hot:1:0.45", alt_skew="uniform")
    assert [cfg.skew_at(s).kind for s in (0, 1, 2, 3)] == ["hot", "uniform", "hot", "uniform"]
    assert cfg.workload_meta()["alt_skew"] == "uniform" and "alt_skew" not in DemoConfig().workload_meta()
    # the hot expert's share is realised on the even steps only
    share = [
        float((torch.topk(routing_bias(cfg, 0, s, 0), cfg.top_k).indices == 1).float().sum()) / (cfg.tokens * cfg.top_k)
        for s in (0, 1)
    ]
    assert abs(share[0] - 0.45) < 0.05 and abs(share[1] - 1 / cfg.experts) < 0.05


def test_knob_parsing() -> None:
    cfg = DemoConfig(skew="zipf:1.2", straggler="2:30")
    assert cfg.skew_spec == SkewSpec("zipf", exponent=1.2) and str(cfg.skew_spec) == "zipf:1.2"
    assert cfg.straggler_spec == Straggler(2, 30.0)
    assert cfg.placement == [[0], [0], [1], [1], [2], [2], [3], [3]]
    assert DemoConfig(skew="HOT:3:0.5").skew_spec == SkewSpec("hot", expert=3, share=0.5)
    assert DemoConfig(straggler=None).straggler_spec is None
    p = skew_probabilities(SkewSpec("zipf", exponent=1.0), 4)
    assert p == pytest.approx([12 / 25, 6 / 25, 4 / 25, 3 / 25])
    assert skew_probabilities(SkewSpec("hot", expert=1, share=0.4), 3) == pytest.approx([0.3, 0.4, 0.3])


def test_cli_bad_knobs_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--top-k", "9"]) == 2
    assert capsys.readouterr().err == "error: --top-k: 9 is larger than --experts 8\n"
    f = tmp_path / "file"
    f.write_text("")
    assert main(["demo", "--out", str(f)]) == 2
    assert capsys.readouterr().err == f"error: --out: {f} exists and is a file; give a directory path\n"


def test_cli_passes_knobs_and_shows_progress(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seen = {}

    def fake_run_demo(cfg: DemoConfig, out: Path, progress=None) -> Path:  # noqa: ANN001
        seen["cfg"], seen["out"] = cfg, out
        for s in ("start", "step", "write"):
            progress(s, 1, 1)
        # real traces, so that the report step after the run has something true to analyze
        shutil.copytree(SAMPLES / "balanced", out, ignore=shutil.ignore_patterns("README.md"))
        return Path(out)

    monkeypatch.setattr("ep_trace.workloads.demo.run_demo", fake_run_demo)
    argv = ["demo", "--out", str(tmp_path / "d"), "--ranks", "2", "--experts", "4", "--top-k", "1", "--hidden", "8",
            "--tokens", "5", "--layers", "1", "--steps", "2", "--skew", "hot:3:0.5", "--straggler", "1:4", "--chunks", "2",
            "--pin-cores", "--allocator", "glibc", "--no-huge-pages", "--comm-priority", "normal"]  # fmt: skip
    assert main(argv) == 0
    assert seen["cfg"] == DemoConfig(
        2,
        4,
        1,
        8,
        5,
        1,
        2,
        "hot:3:0.5",
        "1:4",
        2,
        0,
        "gloo",
        False,
        pin_cores=True,
        allocator="glibc",
        huge_pages=False,
        comm_priority="normal",
    )
    assert seen["out"] == tmp_path / "d"
    out = capsys.readouterr().out
    assert out.startswith(f"wrote 2 ranks x 2 steps to {tmp_path / 'd'}\n")
    # the demo ends with the report beside the traces, like `ep-trace analyze` would write it
    assert out.endswith(f"report: {tmp_path / 'd' / 'report.html'}\nsummary: {tmp_path / 'd' / 'summary.json'}\n")
    assert (tmp_path / "d" / "report.html").stat().st_size > 1_000_000  # plotly.js embedded once
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]


# --- one real run: 2 ranks, chunked pipeline, hot expert, straggler --------------------------------

CFG = DemoConfig(
    ranks=2,
    experts=4,
    top_k=2,
    hidden=32,
    tokens=96,
    layers=2,
    steps=2,
    skew="hot:1:0.5",
    straggler="1:20",
    chunks=3,
    seed=3,
    pin_cores=True,
)


@pytest.fixture(scope="module")
def chunked_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    out = tmp_path_factory.mktemp("demo") / "traces"
    out.mkdir()
    (out / "rank7.ep.jsonl").write_text("stale")  # a file of an earlier, larger run
    calls: list = []
    assert run_demo(CFG, out, progress=lambda *a: calls.append(a)) == out
    return out, calls


def _trace(out: Path, r: int) -> list[dict]:
    with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rt") as f:
        return json.load(f)["traceEvents"]


def _sidecar(out: Path, r: int) -> list[dict]:
    return [orjson.loads(x) for x in (out / f"rank{r}.ep.jsonl").read_bytes().splitlines()]


@pytest.mark.slow
def test_run_writes_one_pair_per_rank_and_reports_progress(chunked_run: tuple[Path, list]) -> None:
    out, calls = chunked_run
    assert sorted(p.name for p in out.iterdir()) == [
        "rank0.ep.jsonl",
        "rank0.pt.trace.json.gz",
        "rank1.ep.jsonl",
        "rank1.pt.trace.json.gz",
    ]
    assert calls[0] == ("start", 0, 2) and calls[-1] == ("write", 2, 2)
    assert [c for c in calls if c[0] == "step"] == [("step", 1, 2), ("step", 2, 2)]
    metas = [_sidecar(out, r)[0] for r in (0, 1)]
    assert metas[0]["job_id"] == metas[1]["job_id"] and len(metas[0]["job_id"]) == 32
    assert [
        (m["rank"], m["world_size"], m["backend"], m["num_experts"], m["top_k"], m["hidden_size"]) for m in metas
    ] == [
        (0, 2, "gloo", 4, 2, 32),
        (1, 2, "gloo", 4, 2, 32),
    ]
    assert metas[0]["placement"] == [[0], [0], [1], [1]]
    # --pin-cores: each rank's affinity mask at capture is one core, which the what-ifs read
    assert [m["cpu_cores"] for m in metas] == [1, 1]
    assert [(m["workload"]["pin_cores"], m["workload"]["huge_pages"]) for m in metas] == [(True, True)] * 2
    # the allocator the rank really ran on (its memory map), not the one asked for
    want = "glibc" if find_jemalloc() is None else "jemalloc"
    assert [m["workload"]["allocator"] for m in metas] == [want] * 2
    # gloo's transfer threads run at real-time priority where the process may (--comm-priority auto)
    prio = "realtime" if realtime_permitted() else "normal"
    assert [m["workload"]["comm_threads"] for m in metas] == [prio] * 2


@pytest.mark.slow
def test_hot_expert_gets_its_share(chunked_run: tuple[Path, list]) -> None:
    # hot:1:0.5 with top-2: every token must pick expert 1 -> exactly 96 per rank and step.
    truth = layer_truth(chunked_run[0])
    assert [(t.step, t.layer) for t in truth] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for t in truth:
        assert t.expert_counts[1] == 2 * 96 and sum(t.expert_counts) == 2 * 96 * 2
        assert t.imbalance_expert == pytest.approx(2.0)
        assert sum(map(sum, t.count_matrix)) == 2 * 96 * 2


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_chunked_a2a_sidecar_matches_trace_ops(chunked_run: tuple[Path, list], rank: int) -> None:
    out = chunked_run[0]
    ev = _trace(out, rank)
    steps = {e["name"]: e for e in ev if e["name"].startswith("ProfilerStep#")}
    assert sorted(steps) == ["ProfilerStep#0", "ProfilerStep#1"]
    ops = sorted((e for e in ev if e["name"] == "c10d::alltoall_base_"), key=lambda e: e["ts"])
    recs = [r for r in _sidecar(out, rank) if r["type"] == "a2a"]
    for n, st in enumerate(("ProfilerStep#0", "ProfilerStep#1")):
        s = steps[st]
        in_step = [e for e in ops if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        mine = sorted((r for r in recs if r["step"] == n), key=lambda r: r["call"])
        assert [r["call"] for r in mine] == list(range(14))  # 2 layers x (1 count + 3 dispatch + 3 combine)
        order = [(r["direction"], r["microbatch"]) for r in mine[:7]]
        assert order == [
            ("count", 0),
            ("dispatch", 0),
            ("dispatch", 1),
            ("combine", 0),
            ("dispatch", 2),
            ("combine", 1),
            ("combine", 2),
        ]
        assert len(in_step) == 14
        for op, r in zip(in_step, mine, strict=True):
            ci = op["args"][
                "Concrete Inputs"
            ]  # (out, in, pg, output_split_sizes, input_split_sizes, async_op, timeout)
            assert json.loads(ci[3]) == r["recv_splits"] and json.loads(ci[4]) == r["send_splits"]
            assert ci[5] == ("False" if r["direction"] == "count" else "True")
    names = {e["name"] for e in ev if e["name"].startswith("ep:")}
    assert {
        f"ep:{s}:l{l}:mb{c}:fwd" for s in ("dispatch", "expert", "combine") for l in (0, 1) for c in range(3)
    } <= names
    assert {"ep:dispatch:l0:fwd", "ep:route:l1:fwd", "ep:permute:l0:fwd", "ep:unpermute:l1:fwd"} <= names


@pytest.mark.slow
def test_straggler_delay_is_in_its_expert_ranges(chunked_run: tuple[Path, list]) -> None:
    out = chunked_run[0]
    expert_ms = []
    for r in (0, 1):
        expert_ms.append(sum(e["dur"] for e in _trace(out, r) if e["name"].startswith("ep:expert:")) / 1000)
    # rank 1 sleeps 20 ms per layer and step: 2 x 2 x 20 = 80 ms at least.
    assert expert_ms[1] >= 80.0 and expert_ms[1] > expert_ms[0] + 40.0


_NO_TORCH = """
import sys
sys.modules["torch"] = None  # import torch -> ImportError, as on a machine without it
from ep_trace.cli import main
print("rc", main(["demo", "--top-k", "9"]))
print("rc", main(["demo", "--out", sys.argv[1]]))
"""


def test_demo_without_torch_validates_then_names_the_missing_extra(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(tmp_path / "d")], capture_output=True, text=True, timeout=60
    )
    assert p.stdout.splitlines() == ["rc 2", "rc 2"]
    assert p.stderr.splitlines() == [
        "error: --top-k: 9 is larger than --experts 8",
        "error: torch is needed to capture traces (analysis works without it); install it: pip install 'torch>=2.4' (or the [capture] extra: pip install '.[capture]' in a checkout)",
    ]
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_backward_run_has_bwd_ranges_and_transposed_a2a(tmp_path: Path) -> None:
    cfg = DemoConfig(ranks=2, experts=4, hidden=16, tokens=40, layers=2, steps=1, backward=True, seed=1)
    run_demo(cfg, tmp_path)
    for rank in (0, 1):
        ev = _trace(tmp_path, rank)
        bwd = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e["name"].endswith(":bwd"))
        order = ["unpermute", "combine", "expert", "dispatch", "permute", "route"]
        # Reverse data path, last layer first, one range each, never overlapping.
        assert [n for _, _, n in bwd] == [f"ep:{s}:l{layer}:bwd" for layer in (1, 0) for s in order]
        assert all(a[1] <= b[0] for a, b in zip(bwd, bwd[1:], strict=False))
        a2a = sorted((r for r in _sidecar(tmp_path, rank) if r["type"] == "a2a"), key=lambda r: r["call"])
        assert [(r["layer"], r["direction"], r["phase"]) for r in a2a] == [
            (0, "count", "fwd"), (0, "dispatch", "fwd"), (0, "combine", "fwd"),
            (1, "count", "fwd"), (1, "dispatch", "fwd"), (1, "combine", "fwd"),
            (1, "combine", "bwd"), (1, "dispatch", "bwd"), (0, "combine", "bwd"), (0, "dispatch", "bwd"),
        ]  # fmt: skip
        fwd = {(r["layer"], r["direction"]): r for r in a2a if r["phase"] == "fwd"}
        for r in (x for x in a2a if x["phase"] == "bwd"):
            f = fwd[(r["layer"], r["direction"])]
            assert (r["send_splits"], r["recv_splits"]) == (f["recv_splits"], f["send_splits"])
        ops = sorted((e for e in ev if e["name"] == "c10d::alltoall_base_"), key=lambda e: e["ts"])
        assert [json.loads(op["args"]["Concrete Inputs"][4]) for op in ops] == [r["send_splits"] for r in a2a]


def test_routing_bias_realises_the_skew() -> None:
    import torch

    from ep_trace.workloads.demo import routing_bias

    # top-1: Gumbel-max over log p samples expert e with probability exactly p_e.
    cfg = DemoConfig(ranks=1, experts=4, top_k=1, tokens=40_000, skew="zipf:1.0")
    freq = torch.bincount(routing_bias(cfg, 0, 0, 0).argmax(1), minlength=4) / 40_000
    assert freq.tolist() == pytest.approx([12 / 25, 6 / 25, 4 / 25, 3 / 25], abs=0.01)
    # hot:2:0.5 with top-2: expert 2 is in every token's top-2 -> exactly half of all assignments.
    cfg = DemoConfig(ranks=1, experts=4, top_k=2, tokens=1000, skew="hot:2:0.5")
    top2 = routing_bias(cfg, 0, 1, 0).topk(2, dim=1).indices
    assert int((top2 == 2).sum()) == 1000
    # Deterministic from (seed, rank, step, layer); different ranks get different noise.
    assert torch.equal(routing_bias(cfg, 0, 1, 0), routing_bias(cfg, 0, 1, 0))
    assert not torch.equal(
        routing_bias(cfg, 0, 1, 0), routing_bias(DemoConfig(ranks=2, experts=4, tokens=1000, skew="hot:2:0.5"), 1, 1, 0)
    )


def test_with_stack_frames_leave_synchronous_gloo_calls_exposed(tmp_path: Path) -> None:
    """A real 2-rank run with Python frames (vLLM's and SGLang's profiler default): the frames are
    kind python_frame, and the synchronous gloo all-to-alls stay exposed (the caller's
    ``<built-in method wait ...>`` frame covers each transfer; read as compute it made them 'overlapped')."""
    import ep_trace

    cfg = DemoConfig(ranks=2, experts=4, hidden=16, tokens=40, layers=2, steps=3, seed=1, with_stack=True)
    run_demo(cfg, tmp_path)
    a = ep_trace.load([tmp_path])
    ev = a.tables.scan_events().select("kind", "name").collect()
    frames = ev.filter(pl.col("kind") == "python_frame")
    assert frames.height > 100 and frames["name"].str.contains("wait").any()
    assert a.rank_summary["overlap_efficiency"].fill_null(0.0).to_list() == [0.0, 0.0]
    assert (a.steps["overlapped_ns"] == 0).all() and (a.steps["exposed_comm_ns"] > 0).all()
    assert set(a.stages["stage"].unique()) >= {"route", "permute", "dispatch", "expert", "combine", "unpermute"}

"""The committed sample traces: layout, size, Kineto/sidecar agreement and README ground truth."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import orjson
import pytest

from ep_trace.stage_names import parse_stage_name
from ep_trace.workloads.truth import format_truth_table, layer_truth, read_sidecar

SAMPLES = ("balanced", "skewed_straggler", "chunked_overlap", "backward")
COMMANDS = {
    "balanced": "ep-trace demo --out sample_traces/balanced",
    "skewed_straggler": "ep-trace demo --out sample_traces/skewed_straggler --skew zipf:1.2 --straggler 2:30",
    "chunked_overlap": "ep-trace demo --out sample_traces/chunked_overlap --chunks 4",
    "backward": "ep-trace demo --out sample_traces/backward --backward",
}
#: all-to-alls per rank and step: 2 layers x (count + dispatch + combine), chunked: x (1 + 4 + 4).
A2A_PER_STEP = {"balanced": 6, "skewed_straggler": 6, "chunked_overlap": 18, "backward": 10}
#: ep: ranges per rank and step: 6 per layer; chunked: route, permute, unpermute, count exchange,
#: 4 x expert and 4 x 2 (launch, wait) for dispatch and for combine = 24 per layer.
RANGES_PER_STEP = {"balanced": 12, "skewed_straggler": 12, "chunked_overlap": 48, "backward": 24}
# Required keys and types per sidecar record type (docs/sidecar.md, v1).
SCHEMA = {
    "meta": {"rank": int, "world_size": int, "local_rank": int, "host": str, "backend": (str, type(None)), "device": str,
             "job_id": str, "ep_group_ranks": list, "num_experts": (int, type(None)), "top_k": (int, type(None)),
             "placement": (list, type(None)), "hidden_size": (int, type(None)), "dtype": (str, type(None)),
             "ep_trace_version": str, "torch_version": str},
    "routing": {"step": int, "layer": int, "microbatch": int, "expert_counts": list, "tokens": int, "top_k": int},
    "a2a": {"step": int, "layer": int, "microbatch": int, "direction": str, "call": int, "send_splits": list,
            "recv_splits": list, "row_bytes": int, "group_ranks": list, "start_ns": int, "end_ns": int},
    "step_end": {"step": int, "time_ns": int},
}  # fmt: skip


def test_sample_dirs_are_complete_and_small(samples_dir: Path) -> None:
    total = sum(p.stat().st_size for p in samples_dir.rglob("*") if p.is_file())
    assert total < 3 * 1024 * 1024
    for name in SAMPLES:
        files = sorted(p.name for p in (samples_dir / name).iterdir())
        assert files == ["README.md"] + [f"rank{r}.{ext}" for r in range(4) for ext in ("ep.jsonl", "pt.trace.json.gz")]


@pytest.mark.parametrize("name", SAMPLES)
def test_sidecar_follows_the_documented_schema(samples_dir: Path, name: str) -> None:
    job_ids = set()
    for r in range(4):
        lines = (samples_dir / name / f"rank{r}.ep.jsonl").read_bytes().splitlines()
        recs = [orjson.loads(x) for x in lines]
        assert recs[0]["type"] == "meta" and recs[0]["rank"] == r and recs[0]["world_size"] == 4
        for rec in recs:
            assert rec["v"] == 1
            spec = SCHEMA[rec["type"]]
            required = spec if rec["type"] != "meta" or rec is recs[0] else {}
            for key, typ in required.items():
                assert isinstance(rec[key], typ), (name, r, rec["type"], key)
        job_ids.add(recs[0]["job_id"])
        counts = {}
        for t in ("routing", "a2a", "step_end"):
            counts[t] = sum(1 for x in recs if x["type"] == t)
        assert counts == {"routing": 6, "a2a": 3 * A2A_PER_STEP[name], "step_end": 3}
        assert recs[-1] == {"type": "step_end", "v": 1, "step": 2, "time_ns": recs[-1]["time_ns"]}
        for a in (x for x in recs if x["type"] == "a2a"):
            assert a["row_bytes"] == (8 if a["direction"] == "count" else 256 * 4)
            assert a["group_ranks"] == [0, 1, 2, 3] and a["start_ns"] <= a["end_ns"]
    assert len(job_ids) == 1


@pytest.mark.parametrize("name", SAMPLES)
def test_split_lists_agree_across_ranks(samples_dir: Path, name: str) -> None:
    recs = {
        r: [x for x in read_sidecar(samples_dir / name / f"rank{r}.ep.jsonl") if x["type"] == "a2a"] for r in range(4)
    }
    for i in range(4):
        for a in recs[i]:
            for j in range(4):
                peer = next(b for b in recs[j] if (b["step"], b["call"]) == (a["step"], a["call"]))
                assert peer["direction"] == a["direction"]
                assert a["send_splits"][j] == peer["recv_splits"][i]


@pytest.mark.parametrize("name", SAMPLES)
def test_kineto_trace_matches_sidecar(samples_dir: Path, name: str) -> None:
    for r in range(4):
        with gzip.open(samples_dir / name / f"rank{r}.pt.trace.json.gz", "rt") as f:
            doc = json.load(f)
        assert doc["distributedInfo"]["rank"] == r and doc["distributedInfo"]["backend"] == "gloo"
        side = read_sidecar(samples_dir / name / f"rank{r}.ep.jsonl")
        assert doc["ep_trace"]["job_id"] == side[0]["job_id"] and doc["ep_trace"]["rank"] == r
        ev = doc["traceEvents"]
        steps = sorted((e for e in ev if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        assert [e["name"] for e in steps] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
        stages = [parse_stage_name(e["name"]) for e in ev if e["name"].startswith("ep:")]
        assert len(stages) == 3 * RANGES_PER_STEP[name] and all(s is not None for s in stages)
        assert sum(s.phase == "bwd" for s in stages) == (3 * 12 if name == "backward" else 0)
        assert sum(1 for e in ev if e["name"] == "gloo:all_to_all") == 3 * A2A_PER_STEP[name]
        ops = sorted((e for e in ev if e["name"] == "c10d::alltoall_base_"), key=lambda e: e["ts"])
        for n, s in enumerate(steps):
            in_step = [e for e in ops if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            a2a = sorted((x for x in side if x["type"] == "a2a" and x["step"] == n), key=lambda x: x["call"])
            assert len(in_step) == len(a2a) == A2A_PER_STEP[name]
            for op, rec in zip(in_step, a2a, strict=True):
                ci = op["args"]["Concrete Inputs"]
                assert (json.loads(ci[3]), json.loads(ci[4])) == (rec["recv_splits"], rec["send_splits"])
                assert ci[5] == str(name == "chunked_overlap" and rec["direction"] != "count")


@pytest.mark.parametrize("name", SAMPLES)
def test_readme_states_command_and_exact_ground_truth(samples_dir: Path, name: str) -> None:
    text = (samples_dir / name / "README.md").read_text()
    assert f"```\n{COMMANDS[name]}\n```" in text
    assert format_truth_table(layer_truth(samples_dir / name)) in text


def test_skewed_sample_has_the_expected_imbalance_and_straggler(samples_dir: Path) -> None:
    skewed = layer_truth(samples_dir / "skewed_straggler")
    balanced = layer_truth(samples_dir / "balanced")
    assert min(t.imbalance_expert for t in skewed) > 2.0 > 1.2 > max(t.imbalance_expert for t in balanced)
    assert all(t.rank_load.index(max(t.rank_load)) == 0 for t in skewed)  # experts 0, 1 live on rank 0
    # Chunking changes how rows travel, not where: same routing and count matrices as balanced.
    assert layer_truth(samples_dir / "chunked_overlap") == balanced
    assert layer_truth(samples_dir / "backward") == balanced
    text = (samples_dir / "skewed_straggler" / "README.md").read_text()
    assert "Straggler: **rank 2**" in text
    arrivals = re.search(r"= \[([\d, ]+)\]\.", text)
    assert arrivals is not None and arrivals.group(1).count("2") >= 4


@pytest.mark.hta
def test_hta_reads_the_sample_as_a_standard_kineto_trace(samples_dir: Path) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    a = hta.TraceAnalysis(trace_dir=str(samples_dir / "skewed_straggler"))
    assert sorted(a.t.traces) == [0, 1, 2, 3]  # rank from distributedInfo; sidecars and README ignored
    symbols = a.t.symbol_table.get_sym_table()
    for r in range(4):
        names = {symbols[i] for i in a.t.get_trace(r)["name"].unique()}
        assert {"ep:expert:l0:fwd", "ep:combine:l1:fwd", "gloo:all_to_all", "c10d::alltoall_base_"} <= names

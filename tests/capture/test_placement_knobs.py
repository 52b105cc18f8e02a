"""The demo's placement, node and routing-workload knobs without spawning ranks.

Placement files and knobs are refused with one-line messages (word for word); the replica rule's
count formula (ep_trace.expert_placement) agrees with the vectorised choice the ranks run
(ep_trace.workloads.expert_slots); the emulated link's delay is the documented formula; each routing
workload realises its expert-load shape (20 000 tokens, so a share is known to about 0.01).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
import torch

from ep_trace.cli import main
from ep_trace.errors import ConfigError
from ep_trace.expert_placement import ExpertPlacement, contiguous_placement, read_placement
from ep_trace.workloads.config import DemoConfig
from ep_trace.workloads.expert_slots import slot_map
from ep_trace.workloads.inputs import routing_bias
from ep_trace.workloads.knobs import SkewSpec, skew_probabilities
from ep_trace.workloads.links import LinkDelay, node_blocks

HINT = '{"num_experts": E, "ranks": [[expert ids of rank 0], [expert ids of rank 1], ...]}'


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "{",
            "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); expected " + HINT,
        ),
        ("[1, 2]", "expected an object " + HINT),
        ('{"ranks": [[0]]}', "expected an object " + HINT),
        ('{"num_experts": 0, "ranks": [[], []]}', "num_experts must be an integer >= 1, got 0"),
        ('{"num_experts": 6, "ranks": [[0], [1]]}', "num_experts is 6 but --experts is 4"),
        ('{"num_experts": 4, "ranks": [[0, 1, 2, 3]]}', "lists 1 ranks but --ranks is 2"),
        ('{"num_experts": 4, "ranks": [[0, "a"], [2, 3]]}', 'rank 0 lists "a", not an expert id; expected ' + HINT),
        ('{"num_experts": 4, "ranks": [[0, true], [2, 3]]}', "rank 0 lists true, not an expert id; expected " + HINT),
        ('{"num_experts": 4, "ranks": [[0, 1], 5]}', "rank 1 is 5, not a list of expert ids; expected " + HINT),
        ('{"num_experts": 4, "ranks": [[0, 1], [2, 4]]}', "rank 1 lists expert 4, outside 0..3 (num_experts 4)"),
        (
            '{"num_experts": 4, "ranks": [[0, 1, 1], [2, 3]]}',
            "rank 0 lists expert 1 twice (a replica goes on another rank)",
        ),
        (
            '{"num_experts": 4, "ranks": [[0, 1, 2], []]}',
            "expert 3 is on no rank; every expert needs at least one rank",
        ),
        (
            '{"num_experts": 4, "ranks": [[0], [2]]}',
            "experts 1, 3 (2) are on no rank; every expert needs at least one rank",
        ),
    ],
)
def test_bad_placement_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "p.json"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_placement(f, "--placement", num_experts=4, world_size=2)
    assert str(e.value) == f"--placement {f}: {message}"


def test_placement_file_reads_replicas_and_an_empty_rank(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text('{"num_experts": 4, "ranks": [[3, 0, 1], [1, 2, 3], []], "framework": "ignored"}')
    p = read_placement(f, "--placement", num_experts=4, world_size=3)
    assert p == ExpertPlacement(4, ((3, 0, 1), (1, 2, 3), ()))
    assert p.holders == [[0], [0, 1], [1], [0, 1]] and p.redundant_experts == 2
    assert p.to_json() == {"num_experts": 4, "ranks": [[3, 0, 1], [1, 2, 3], []]}
    assert contiguous_placement(4, 2).holders == [[0], [0], [1], [1]]
    assert contiguous_placement(4, 2).redundant_experts == 0
    with pytest.raises(
        ConfigError, match=r"^--placement .*absent.json: cannot read the file \(No such file or directory\)$"
    ):
        read_placement(tmp_path / "absent.json", "--placement")


def test_replica_rule_counts() -> None:
    # expert 1 on ranks 0, 1 (node 0) and 2 (node 1); expert 3 on ranks 1 and 3 (node 1)
    p = ExpertPlacement(4, ((0, 1), (1, 2, 3), (1,), (3,)))
    nodes = (0, 0, 1, 1)
    assert p.candidates(1, 0, nodes) == [0, 1] and p.candidates(1, 3, nodes) == [2]
    assert p.candidates(3, 0, nodes) == [1] and p.candidates(3, 2, nodes) == [3] and p.candidates(1, 3) == [0, 1, 2]
    # rank 0 sends 5 rows to expert 1: 3 to rank 0, 2 to rank 1 (the i-th to candidate i mod 2)
    assert p.dispatch_rows(0, [1, 5, 0, 2], nodes) == [1 + 3, 2 + 2, 0, 0]
    assert p.dispatch_rows(3, [1, 5, 0, 2], nodes) == [1, 0, 5, 2]
    assert p.dispatch_rows(3, [1, 5, 0, 2]) == [1 + 2, 2 + 1, 1, 1]  # one node: 5 rows over 3 replicas: 2, 2, 1


@pytest.mark.parametrize("nodes", [None, (0, 0, 1, 1)])
@pytest.mark.parametrize("src", [0, 2, 3])
def test_vectorised_choice_matches_the_count_formula(nodes: tuple[int, ...] | None, src: int) -> None:
    """The ranks' torch choice (expert_slots) and the rule's count formula (expert_placement) agree exactly."""
    p = ExpertPlacement(6, ((0, 1, 5), (1, 2, 5, 0), (3, 4, 5), (0,)))
    ids = torch.randint(0, 6, (301, 2), generator=torch.Generator().manual_seed(src))
    ids[:, 1] = (ids[:, 0] + 1 + ids[:, 1] % 5) % 6  # two distinct experts per token
    sm = slot_map(p, src, nodes)
    phys = sm.assign(ids.reshape(-1))
    assert sm.slot_expert[phys].tolist() == ids.reshape(-1).tolist()  # every assignment to a copy of its expert
    rows = sm.rows_per_rank(torch.bincount(phys, minlength=sm.num_slots)).tolist()
    assert rows == p.dispatch_rows(src, torch.bincount(ids.reshape(-1), minlength=6).tolist(), nodes)
    assert slot_map(contiguous_placement(8, 4), 1).identity and not sm.identity


def test_cross_node_delay_model() -> None:
    assert node_blocks(4, 2) == (0, 0, 1, 1) and node_blocks(6, 3) == (0, 0, 1, 1, 2, 2)
    link = LinkDelay(me=1, node_of=(0, 0, 1, 1), cross_latency_ms=2.0, cross_gbps=8.0)
    # sends 10 + 30 rows to node 1, receives 5 + 5: max(40, 10) rows x 1000 B at 8 Gbit/s (1 GB/s) = 40 us
    assert link.cross_node_ns([7, 0, 10, 30], [7, 9, 5, 5], 1000) == 2_000_000 + 40_000
    assert link.cross_node_ns([7, 3, 0, 0], [7, 9, 0, 0], 1000) == 0  # nothing crosses: no latency either
    assert LinkDelay(1, (0, 0, 1, 1), cross_latency_ms=2.0).cross_node_ns([0, 0, 1, 0], [0] * 4, 8) == 2_000_000
    assert not LinkDelay(0, (0, 0), cross_latency_ms=2.0).emulates_nodes  # one node: nothing crosses
    slept, asked = LinkDelay(0, (0, 1), cross_gbps=1.0).wait([0, 1], [0, 0], 125)  # 1000 bits at 1 Gbit/s
    assert asked == 1_000 and slept is not None and slept >= 1_000
    assert LinkDelay(0, (0, 1), cross_gbps=1.0).wait([3, 0], [3, 0], 125) == (None, 0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"nodes": 3},
            "--nodes: 3 does not divide --ranks 4 (an emulated node is a contiguous block of --ranks / --nodes ranks)",
        ),
        ({"nodes": 0}, "--nodes: must be an integer >= 1, got 0"),
        ({"cross_node_latency_ms": -1.0}, "--cross-node-latency-ms: must be a finite number of ms >= 0, got -1.0"),
        (
            {"cross_node_gbps": float("inf")},
            "--cross-node-gbps: must be a finite number of Gbit/s (0 = unlimited) >= 0, got inf",
        ),
        (
            {"cross_node_gbps": 5.0},
            "--cross-node-gbps: needs --nodes 2 or more (with one node no pair of ranks crosses nodes)",
        ),
        (
            {"nodes": 2, "cross_node_latency_ms": 2.0, "chunks": 2},
            "--cross-node-latency-ms: needs --chunks 1 (a host-side delay would stall the pipelined GEMMs too), got --chunks 2",
        ),
        (
            {"experts": 6},
            "--experts: 6 is not a multiple of --ranks 4 (each rank owns E/W experts); give a --placement file for any other layout",
        ),
        ({"skew": "hotset:1,9:0.5"}, "--skew: hotset expert 9 is not an expert id in 0..7 (--experts 8)"),
        ({"skew": "hotset:1,1:0.5"}, "--skew: hotset lists expert 1 twice"),
        ({"skew": "hotset:1.5:0.5"}, "--skew: expert 1.5 in 'hotset:1.5:0.5' is not an integer"),
        ({"skew": "hotset:1:1.5"}, "--skew: hotset share 1.5 must be in (0, 1]"),
        (
            {"skew": "hotset:1:0.9"},
            "--skew: 'hotset:1:0.9' gives expert 1 a share of 0.9, more than 1/top_k = 0.5 (--top-k 2: a token picks "
            "an expert at most once); choose a smaller share or more experts",
        ),
        (
            {"skew": "hotset:0,1,2,3,4,5,6,7:0.5"},
            "--skew: 'hotset:0,1,2,3,4,5,6,7:0.5': the hot set covers all 8 experts; leave some out",
        ),
        ({"skew": "hotrank:4:0.5"}, "--skew: hotrank rank 4 is out of range 0..3 (--ranks 4)"),
        ({"skew": "spread:0:0.5"}, "--skew: spread count 0 must be in 1..7 (--experts 8)"),
        ({"skew": "rotate:8:0.5"}, "--skew: rotate count 8 must be in 1..7 (--experts 8)"),
        (
            {"skew": "cold-rank:0", "top_k": 7},
            "--skew: 'cold-rank:0' leaves 6 experts with tokens, fewer than --top-k 7 (a token picks top_k distinct experts)",
        ),
        ({"skew": "burst:0:hot:1:0.3"}, "--skew: burst period 0 must be an integer >= 1"),
        ({"skew": "burst:2:burst:2:uniform"}, "--skew: burst cannot nest another burst in 'burst:2:burst:2:uniform'"),
        ({"skew": "affinity:x:0.5"}, "--skew: offset 'x' in 'affinity:x:0.5' is not a number; use uniform"),
        ({"alt_skew": "spread:9:0.4"}, "--alt-skew: spread count 9 must be in 1..7 (--experts 8)"),
    ],
)
def test_bad_knobs_name_the_option(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        DemoConfig(**kwargs)
    assert str(exc.value).startswith(message)
    assert "\n" not in str(exc.value)


def test_alt_placement_file_errors_name_their_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "p.json"
    f.write_text('{"num_experts": 8, "ranks": [[0, 1], [2, 3]]}')
    with pytest.raises(ConfigError) as e:
        DemoConfig(alt_placement_file=str(f))
    assert str(e.value) == f"--alt-placement {f}: lists 2 ranks but --ranks is 4"
    assert main(["demo", "--ranks", "2", "--placement", str(f), "--experts", "4"]) == 2
    assert capsys.readouterr().err == f"error: --placement {f}: num_experts is 8 but --experts is 4\n"


def test_placement_knobs_reach_the_config_and_its_meta(tmp_path: Path) -> None:
    f, g = tmp_path / "a.json", tmp_path / "b.json"
    f.write_text('{"num_experts": 6, "ranks": [[0, 1, 2, 5], [3, 4, 5]]}')
    g.write_text('{"num_experts": 6, "ranks": [[0, 1, 2], [3, 4, 5]]}')
    cfg = DemoConfig(
        ranks=2, experts=6, placement_file=str(f), alt_placement_file=str(g), nodes=2, cross_node_gbps=10.0
    )
    assert cfg.placement == [[0], [0], [0], [1], [1], [0, 1]]
    assert [cfg.placement_at(s).redundant_experts for s in (-2, -1, 0, 1)] == [1, 0, 1, 0]
    meta = cfg.workload_meta()
    assert {k: meta[k] for k in meta if k.startswith(("placement", "alt_placement", "alt_redundant", "nodes", "cross"))} == {
        "placement_file": str(f), "alt_placement_file": str(g), "alt_placement": [[0], [0], [0], [1], [1], [1]],
        "alt_redundant_experts": 0, "nodes": 2, "cross_node_latency_ms": 0.0, "cross_node_gbps": 10.0,
    }  # fmt: skip
    assert cfg.node_of == (0, 1)
    # hotrank / cold-rank / affinity read the experts of --placement's ranks
    assert DemoConfig(ranks=2, experts=6, placement_file=str(f), skew="hotrank:1:0.6").skew_spec.experts == (3, 4, 5)
    plain = DemoConfig().workload_meta()
    assert not {"placement_file", "alt_placement", "nodes"} & set(plain)


def test_skew_specs_print_canonically() -> None:
    for text in ("hotset:1,3:0.5", "hotrank:2:0.6", "spread:4:0.6", "rotate:2:0.5", "cold-rank:1",
                 "affinity:2:0.8", "burst:3:hot:1:0.4", "burst:2:hotset:0,5:0.6"):  # fmt: skip
        assert str(DemoConfig(skew=text).skew_spec) == text
    assert DemoConfig(skew="spread:4:0.6").skew_spec.experts == (0, 2, 4, 6)
    assert DemoConfig(skew="cold-rank:1").skew_spec == SkewSpec("cold-rank", rank=1, experts=(2, 3))


def _shares(cfg: DemoConfig, rank: int, step: int) -> list[float]:
    top = torch.topk(routing_bias(cfg, rank, step, 0), cfg.top_k).indices
    assert (top.sort(1).values.diff(1) > 0).all()  # k distinct experts per token
    return (torch.bincount(top.reshape(-1), minlength=cfg.experts) / top.numel()).tolist()


@pytest.mark.parametrize(
    "skew,rank,step,want",
    [
        ("hotset:1,6:0.5", 0, 0, [1 / 12, 0.25, 1 / 12, 1 / 12, 1 / 12, 1 / 12, 0.25, 1 / 12]),
        ("hotrank:3:0.8", 1, 0, [0.2 / 6] * 6 + [0.4, 0.4]),  # rank 3 holds experts 6, 7: 80 % of the load
        ("spread:4:0.8", 0, 0, [0.2, 0.05] * 4),  # experts 0, 2, 4, 6: hot, and one per rank: ranks stay even
        ("rotate:2:0.8", 0, 0, [0.4, 0.4] + [0.2 / 6] * 6),
        ("rotate:2:0.8", 0, 3, [0.2 / 6] * 6 + [0.4, 0.4]),  # the hot pair moved 2 experts per step
        ("cold-rank:1", 2, 0, [1 / 6, 1 / 6, 0.0, 0.0, 1 / 6, 1 / 6, 1 / 6, 1 / 6]),
        ("affinity:2:0.9", 1, 0, [0.1 / 6] * 6 + [0.45, 0.45]),  # rank 1 prefers rank 3's experts
        ("affinity:2:0.9", 2, 1, [0.45, 0.45] + [0.1 / 6] * 6),  # rank 2 prefers rank 0's
        ("burst:2:hotset:5:0.5", 0, 2, [0.5 / 7] * 5 + [0.5] + [0.5 / 7] * 2),
        ("burst:2:hotset:5:0.5", 0, 3, [1 / 8] * 8),  # between bursts: uniform
    ],
)
def test_routing_workload_load_shapes(skew: str, rank: int, step: int, want: list[float]) -> None:
    cfg = DemoConfig(ranks=4, experts=8, top_k=2, tokens=20_000, skew=skew)
    assert skew_probabilities(cfg.skew_spec, 8, step, rank) == pytest.approx(want, abs=1e-12)
    got = _shares(cfg, rank, step)
    assert got == pytest.approx(want, abs=0.012)
    if skew == "cold-rank:1":
        assert got[2] == got[3] == 0.0  # exactly none, not just few


def test_tracer_meta_host_names_the_host_in_both_files(tmp_path: Path) -> None:
    """An emulated node's name reaches the Kineto header (where the ingest reads hosts first) and the sidecar;
    ``record_routing`` declares the replicas of the placement it is given, and a layer's change of
    placement is a ``placement`` record (the meta keeps the first)."""
    from ep_trace.capture.routing import record_routing
    from ep_trace.capture.tracer import Tracer

    ids = torch.tensor([[0, 1], [1, 2]])
    with Tracer(tmp_path, job_id="j", meta={"host": "node7", "local_rank": 1}) as t:
        record_routing(0, ids, 3, [[0], [0, 1], [0, 1, 2]])
        record_routing(1, ids, 3, [[0], [0, 1], [0, 1, 2]])
        t.step()
        record_routing(0, ids, 3, [[0], [0, 1], [0, 1, 2]])  # unchanged: nothing but the routing record
        record_routing(1, ids, 3, [[0], [0], [0]])  # layer 1 changes at step 1
        t.step()
        record_routing(1, ids, 3, [[0], [0], [0]])
    with gzip.open(tmp_path / "rank0.pt.trace.json.gz", "rt") as f:
        assert json.load(f)["host_name"] == "node7"
    recs = [orjson.loads(x) for x in (tmp_path / "rank0.ep.jsonl").read_bytes().splitlines()]
    assert (recs[0]["host"], recs[0]["local_rank"]) == ("node7", 1)
    updates = [r for r in recs[1:] if r["type"] == "meta"]
    assert len(updates) == 1 and updates[0]["placement"] == [[0], [0, 1], [0, 1, 2]]
    assert updates[0]["redundant_experts"] == 3
    changes = [r for r in recs if r["type"] == "placement"]
    assert changes == [
        {"type": "placement", "v": 1, "step": 1, "layer": 1, "placement": [[0], [0], [0]], "redundant_experts": 0}
    ]


def test_demo_help_names_every_routing_workload_and_the_placement_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: no word is wrapped apart
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("hotset:E1,E2,...:SHARE", "hotrank:RANK:SHARE", "spread:N:SHARE", "rotate:N:SHARE", "cold-rank:RANK",
                 "affinity:OFFSET:SHARE", "burst:EVERY:SPEC", '"ranks": [[expert ids of rank 0], ...]', "--alt-placement",
                 "--nodes", "--cross-node-latency-ms", "--cross-node-gbps"):  # fmt: skip
        assert word in out, word

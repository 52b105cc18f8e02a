"""Real demo runs of placements and emulated nodes (spawned gloo ranks, tiny sizes).

* A/B of placements in one run (2 ranks): even steps run contiguous blocks, odd steps a placement that
  replicates the hot expert; every dispatch row count is what the replica rule gives for the rank's own
  routing counts, and the sidecar says which placement each step ran (a ``placement`` record per flip).
* 4 ranks on 2 emulated nodes with a cross-node latency and NIC bandwidth: the hosts are the nodes in
  both files, and every all-to-all's injected delay is the documented formula of its cross-node bytes,
  0 where nothing crossed (node-local routing on even steps), and really slept.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import polars as pl
import pytest

import ep_trace
from ep_trace.workloads.demo import DemoConfig, run_demo
from ep_trace.workloads.truth import layer_truth

pytestmark = pytest.mark.slow


def _sidecar(out: Path, r: int) -> list[dict]:
    return [orjson.loads(x) for x in (out / f"rank{r}.ep.jsonl").read_bytes().splitlines()]


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DemoConfig]:
    d = tmp_path_factory.mktemp("ab")
    alt = d / "replicated.json"
    alt.write_text('{"num_experts": 4, "ranks": [[0, 1], [1, 2, 3]]}')
    cfg = DemoConfig(
        ranks=2, experts=4, top_k=2, hidden=16, tokens=48, layers=1, steps=4, skew="hot:1:0.5",
        alt_placement_file=str(alt), seed=2,
    )  # fmt: skip
    run_demo(cfg, d / "traces")
    return d / "traces", cfg


def test_ab_sidecar_says_which_placement_each_step_ran(ab_run: tuple[Path, DemoConfig]) -> None:
    out, cfg = ab_run
    for r in (0, 1):
        meta = _sidecar(out, r)[0]
        assert (meta["placement"], meta["redundant_experts"]) == ([[0], [0], [1], [1]], 0)
        wl = meta["workload"]
        assert (wl["alt_placement"], wl["alt_redundant_experts"]) == ([[0], [0, 1], [1], [1]], 1)
        assert wl["alt_placement_file"] == cfg.alt_placement_file
        # no later meta record flips the placement: each flip is a placement record of its step
        recs = _sidecar(out, r)
        assert all(x.get("placement", meta["placement"]) == meta["placement"] for x in recs if x["type"] == "meta")
        flips = [
            (x["step"], x["layer"], x["placement"], x["redundant_experts"]) for x in recs if x["type"] == "placement"
        ]
        assert flips == [(s, 0, cfg.placement_at(s).holders, s % 2) for s in (1, 2, 3)]


def test_ab_dispatch_rows_follow_the_replica_rule(ab_run: tuple[Path, DemoConfig]) -> None:
    out, cfg = ab_run
    for r in (0, 1):
        recs = _sidecar(out, r)
        counts = {x["step"]: x["expert_counts"] for x in recs if x["type"] == "routing"}
        assert sorted(counts) == [0, 1, 2, 3]
        for x in recs:
            if x["type"] != "a2a":
                continue
            if x["direction"] == "count":  # one count per physical slot of each destination
                assert x["send_splits"] == ([2, 2] if x["step"] % 2 == 0 else [2, 3])
            elif x["direction"] == "dispatch":
                want = cfg.placement_at(x["step"]).dispatch_rows(r, counts[x["step"]])
                assert x["send_splits"] == want, (r, x["step"])
    truth = {t.step: t for t in layer_truth(out)}
    for s in (0, 2):  # every token picks the hot expert 1: rank 0 computes it alone, then shares it with rank 1
        assert truth[s].expert_counts[1] == 2 * 48
        assert truth[s].rank_load[0] - truth[s].rank_load[1] > 30  # about 96 + 32 against 64
        assert (
            abs(truth[s + 1].rank_load[0] - truth[s + 1].rank_load[1]) < truth[s].rank_load[0] - truth[s].rank_load[1]
        )
    a = ep_trace.load([out])  # the analysis takes a run with replicas and placement records
    assert set(a.steps["step"].unique().to_list()) >= {1, 2, 3}  # (step 0 may go to the warm-up rule)
    # each step's rows are checked against the placement it ran (odd steps: the replicated one)
    own = a.ep_invariants.filter(pl.col("check") == "ownership").row(0, named=True)
    assert (own["status"], own["violations"]) == ("ok", 0)
    assert own["checked"] == 4 * a.steps["step"].n_unique()  # 2 x 2 pairs per analysed step


@pytest.fixture(scope="module")
def nodes_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DemoConfig]:
    d = tmp_path_factory.mktemp("nodes") / "traces"
    cfg = DemoConfig(
        ranks=4, experts=8, top_k=2, hidden=16, tokens=32, layers=1, steps=2, nodes=2, cross_node_latency_ms=3.0,
        cross_node_gbps=0.5, skew="affinity:0:1", alt_skew="uniform", seed=4,
    )  # fmt: skip
    run_demo(cfg, d)
    return d, cfg


def test_emulated_nodes_are_the_hosts(nodes_run: tuple[Path, DemoConfig]) -> None:
    out, _ = nodes_run
    metas = [_sidecar(out, r)[0] for r in range(4)]
    assert [(m["host"], m["local_rank"]) for m in metas] == [("node0", 0), ("node0", 1), ("node1", 0), ("node1", 1)]
    wl = metas[0]["workload"]
    assert (wl["nodes"], wl["cross_node_latency_ms"], wl["cross_node_gbps"]) == (2, 3.0, 0.5)
    assert wl["physical_host"] and wl["physical_host_cores"] >= 1
    for r in range(4):
        with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rt") as f:
            assert json.load(f)["host_name"] == f"node{r // 2}"
    a = ep_trace.load([out])
    assert a.tables.ranks.sort("rank")["host"].to_list() == ["node0", "node0", "node1", "node1"]


def _expected_ns(rank: int, rec: dict) -> float:
    """α once per call with cross-node bytes + max(sent, received) cross-node bytes at 0.5 Gbit/s."""
    node = [0, 0, 1, 1]
    out = sum(n for j, n in enumerate(rec["send_splits"]) if node[j] != node[rank]) * rec["row_bytes"]
    inc = sum(n for j, n in enumerate(rec["recv_splits"]) if node[j] != node[rank]) * rec["row_bytes"]
    return 0.0 if out == inc == 0 else 3e6 + max(out, inc) * 8 / 0.5


def test_cross_node_delays_only_where_bytes_cross(nodes_run: tuple[Path, DemoConfig]) -> None:
    out, _ = nodes_run
    crossed = {0: 0, 1: 0}
    for r in range(4):
        for rec in (x for x in _sidecar(out, r) if x["type"] == "a2a"):
            want = _expected_ns(r, rec)
            assert rec["cross_node_delay_ns"] == pytest.approx(want, abs=1), (r, rec)
            if want:
                assert rec["link_delay_ns"] >= rec["cross_node_delay_ns"]  # really slept (late on a busy machine)
                crossed[rec["step"]] += rec["direction"] != "count"
            else:
                assert "link_delay_ns" not in rec
            if rec["direction"] == "count":  # the count exchange always crosses: every pair swaps counts
                assert want >= 3e6
            elif rec["step"] == 0:  # affinity:0:1 keeps every token on its own rank: nothing crosses
                assert rec["send_splits"][r] == sum(rec["send_splits"]) and want == 0
    assert crossed == {0: 0, 1: 8}  # uniform routing on step 1: every rank's dispatch and combine cross

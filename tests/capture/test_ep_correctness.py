"""EP MoE correctness on real gloo ranks: groups of 1, 2 and 4 ranks vs the single-process dense MoE.

One spawned run (tests/capture/ep_worker.py, 4 processes) serves every test of this module. Besides
the contiguous placement, placements with replicas (an expert on three ranks, a rank holding none,
ranks on two emulated nodes) must give the same output, send every assignment once to a rank that
holds its expert, and pick the replica the rule of ep_trace.expert_placement names (checked here by
a plain loop over the assignments, not by the code under test).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ep_trace.workloads.moe import dense_moe_forward, dense_slot_outputs, make_layer_weights, route

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import ep_worker as W  # noqa: E402

pytestmark = pytest.mark.slow

CASES = [(g, s, None) for g in W.GROUPS for s in W.SCENARIOS] + W.placed_cases()


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ep")
    subprocess.run([sys.executable, str(HERE / "ep_worker.py"), str(out)], check=True, timeout=300)
    return out


def _load(out: Path, group: str, scen: str, placement: str | None = None) -> list[dict]:
    """Per-rank results in group-local order."""
    tag = "" if placement is None else f"@{placement}"
    return [torch.load(out / f"{group}-{scen}{tag}-r{r}.pt") for r in W.GROUPS[group]]


def _held(group: str, placement: str | None) -> tuple[list[list[int]], tuple[int, ...] | None]:
    """Experts of each group-local rank and the node of each (None: one node)."""
    if placement is None:
        L = W.E // len(W.GROUPS[group])
        return [list(range(r * L, (r + 1) * L)) for r in range(len(W.GROUPS[group]))], None
    return W.PLACEMENTS[placement][group]


def _expected_receiver(
    ids: torch.Tensor, src: int, held: list[list[int]], node_of: tuple[int, ...] | None
) -> list[int]:
    """The rank each assignment of ``src`` (flat, token-major) must go to, by the replica rule, one by one."""
    seen: dict[int, int] = {}
    out = []
    for e in ids.reshape(-1).tolist():
        holders = [r for r, h in enumerate(held) if e in h]
        near = [r for r in holders if node_of is not None and node_of[r] == node_of[src]]
        cand = near or holders
        out.append(cand[seen.get(e, 0) % len(cand)])
        seen[e] = seen.get(e, 0) + 1
    return out


def test_tracer_under_distributed_shares_rank0_job_id(ep_run: Path) -> None:
    traced = ep_run / "traced"
    assert sorted(p.name for p in traced.iterdir()) == [
        f"rank{r}.{x}" for r in range(4) for x in ("ep.jsonl", "pt.trace.json.gz")
    ]
    metas = [json.loads((traced / f"rank{r}.ep.jsonl").read_text().splitlines()[0]) for r in range(4)]
    assert [(m["rank"], m["world_size"], m["backend"], m["local_rank"]) for m in metas] == [
        (r, 4, "gloo", r) for r in range(4)
    ]
    assert len({m["job_id"] for m in metas}) == 1 and len(metas[0]["job_id"]) == 32
    # No autograd Function ranges (`_A2A`, `...Backward`) around the collectives of a forward-only
    # run: trace analysis would count those wrappers as compute overlapping the communication.
    with gzip.open(traced / "rank2.pt.trace.json.gz", "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"]}
    assert "c10d::alltoall_base_" in names and not {n for n in names if "A2A" in n or n.startswith("autograd::")}
    a2a = [json.loads(x) for x in (traced / "rank2.ep.jsonl").read_text().splitlines()]
    assert [(r["type"], r.get("direction")) for r in a2a[1:]] == [
        ("a2a", "count"),
        ("a2a", "dispatch"),
        ("a2a", "combine"),
        ("step_end", None),
    ]


def test_worker_wrote_every_case(ep_run: Path) -> None:
    plain = sum(len(r) for r in W.GROUPS.values()) * (len(W.SCENARIOS) + 1)
    placed = sum(len(W.GROUPS[g]) * (len(W.PLACED_SCENARIOS) + 1) for per in W.PLACEMENTS.values() for g in per)
    assert len(list(ep_run.glob("*.pt"))) == plain + placed == 49 + 50


@pytest.mark.parametrize("group,scen,placement", CASES)
def test_ep_output_equals_dense_moe(ep_run: Path, group: str, scen: str, placement: str | None) -> None:
    res = _load(ep_run, group, scen, placement)
    weights = make_layer_weights(W.H, W.FFN, W.E, seed=7, layer=0)
    x = torch.cat([r["x"] for r in res])
    ids = torch.cat([r["ids"] for r in res])
    gate = torch.cat([r["gate"] for r in res])
    dense = dense_moe_forward(x, weights, ids, gate)
    slots = dense_slot_outputs(x, weights, ids)
    off = 0
    for r in res:
        t = r["x"].shape[0]
        assert r["y"].shape == (t, W.H)
        torch.testing.assert_close(r["y"], dense[off : off + t], rtol=1e-5, atol=1e-5)
        # Combine lands on the right token *and* top-k slot: compare each slot before weighting.
        torch.testing.assert_close(r["slot_out"], slots[off : off + t], rtol=1e-5, atol=1e-5)
        off += t
    assert off == x.shape[0] == sum(W.tokens_of(scen, g) for g in W.GROUPS[group])


@pytest.mark.parametrize("group,scen,placement", CASES)
def test_every_assignment_sent_once_to_its_owner(ep_run: Path, group: str, scen: str, placement: str | None) -> None:
    res = _load(ep_run, group, scen, placement)
    granks = W.GROUPS[group]
    held, node_of = _held(group, placement)
    # Expected assignments: (global src rank << 32) + flat position -> (chosen expert, receiving rank).
    expected = {}
    for lsrc, (g, r) in enumerate(zip(granks, res, strict=True)):
        dst = _expected_receiver(r["ids"], lsrc, held, node_of)
        for pos, e in enumerate(r["ids"].reshape(-1).tolist()):
            expected[(g << 32) + pos] = (e, dst[pos])
    received: list[int] = []
    for lrank, r in enumerate(res):
        tags, experts = r["recv_tags"].tolist(), r["recv_experts"].tolist()
        assert len(tags) == len(experts) == sum(r["recv_splits"])
        for tag, e in zip(tags, experts, strict=True):
            assert expected[tag][0] == e  # the row arrived tagged with the expert its router chose
            assert e in held[lrank]  # ... at a rank holding that expert
            assert expected[tag][1] == lrank  # ... the replica the rule names
        received += tags
    assert sorted(received) == sorted(expected)  # every assignment exactly once
    # Split consistency: what i sends to j is what j receives from i.
    for i, ri in enumerate(res):
        for j, rj in enumerate(res):
            assert ri["send_splits"][j] == rj["recv_splits"][i]


def test_replicas_share_the_load_and_prefer_the_node(ep_run: Path) -> None:
    """Expert 0 lives on ranks 0, 1 (node 0) and 3 (node 1): node-0 sources split it evenly over ranks 0
    and 1, node-1 sources send it all to rank 3; a rank holding no expert receives nothing."""
    res = _load(ep_run, "g4", "random", "replicated")
    src_of = {
        lrank: sorted(set((r["recv_tags"][r["recv_experts"] == 0] >> 32).tolist())) for lrank, r in enumerate(res)
    }
    assert src_of == {0: [0, 1], 1: [0, 1], 2: [], 3: [2, 3]}
    n0 = [int((r["recv_experts"] == 0).sum()) for r in res]
    assert n0[0] > 0 and abs(n0[0] - n0[1]) <= 2  # at most one row apart per source
    assert n0[3] == sum(int((r["ids"] == 0).sum()) for r in res[2:])
    empty = _load(ep_run, "g4", "ragged", "empty_rank")
    assert sum(empty[2]["recv_splits"]) == 0 and sum(empty[2]["send_splits"]) == 3 * W.tokens_of("ragged", 2)


def test_degenerate_routing_shapes(ep_run: Path) -> None:
    g4 = {s: _load(ep_run, "g4", s) for s in ("all_local", "one_remote", "empty_expert", "ragged")}
    for lrank, r in enumerate(g4["all_local"]):  # nothing leaves the rank
        t = W.tokens_of("all_local", W.GROUPS["g4"][lrank])
        assert r["send_splits"] == [2 * t if j == lrank else 0 for j in range(4)]
        assert r["recv_splits"] == r["send_splits"]
    for lrank, r in enumerate(g4["one_remote"]):  # everything to the next rank, nothing kept
        t = W.tokens_of("one_remote", W.GROUPS["g4"][lrank])
        assert r["send_splits"] == [t if j == (lrank + 1) % 4 else 0 for j in range(4)]
        src = (lrank - 1) % 4
        assert r["recv_splits"] == [W.tokens_of("one_remote", src) if j == src else 0 for j in range(4)]
    assert all(1 not in r["recv_experts"].tolist() for r in g4["empty_expert"])
    assert 1 not in torch.cat([r["ids"] for r in g4["empty_expert"]]).tolist()
    assert [r["x"].shape[0] for r in g4["ragged"]] == [1, 13, 37, 5]
    assert sum(sum(r["recv_splits"]) for r in g4["ragged"]) == 3 * (1 + 13 + 37 + 5)


GRAD_CASES = [(g, None) for g in W.GROUPS] + [(g, p) for p, per in W.PLACEMENTS.items() for g in per]


@pytest.mark.parametrize("group,placement", GRAD_CASES)
def test_ep_backward_equals_dense_backward(ep_run: Path, group: str, placement: str | None) -> None:
    """Gradients through the differentiable all-to-alls equal the dense MoE's (tokens, router, experts).

    With replicas each copy of an expert gets the gradient of the rows it computed: the copies' sum
    is the dense gradient of that expert.
    """
    tag = "" if placement is None else f"@{placement}"
    res = [torch.load(ep_run / f"{group}-grad{tag}-r{r}.pt") for r in W.GROUPS[group]]
    full = make_layer_weights(W.H, W.FFN, W.E, seed=7, layer=0)
    router, w1, w2 = (t.clone().requires_grad_(True) for t in (full.router, full.w1, full.w2))
    dense_w = type(full)(router, w1, w2, 0)
    xs = [r["x"].clone().requires_grad_(True) for r in res]
    loss = 0
    for xr, r in zip(xs, res, strict=True):
        bias = torch.randn(xr.shape[0], W.E, generator=torch.Generator().manual_seed(r["bias_seed"]))
        ids, gate = route(xr, router, 2, bias)
        assert torch.equal(ids, r["ids"])  # same routing decision as the rank made
        y = dense_moe_forward(xr, dense_w, ids, gate)
        torch.testing.assert_close(y.detach(), r["y"], rtol=1e-5, atol=1e-5)
        loss = loss + (y * r["r"]).sum()
    loss.backward()
    gw1, gw2 = torch.zeros_like(w1), torch.zeros_like(w2)
    for xr, r in zip(xs, res, strict=True):
        torch.testing.assert_close(r["gx"], xr.grad, rtol=1e-4, atol=1e-5)
        for slot, e in enumerate(r["experts"]):
            gw1[e] += r["gw1"][slot]
            gw2[e] += r["gw2"][slot]
    torch.testing.assert_close(gw1, w1.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw2, w2.grad, rtol=1e-4, atol=1e-5)
    # Each rank's router copy sees only its own tokens: the sum over ranks is the dense gradient.
    torch.testing.assert_close(sum(r["grouter"] for r in res), router.grad, rtol=1e-4, atol=1e-5)
    assert float(router.grad.abs().sum()) > 0 and float(w1.grad.abs().sum()) > 0

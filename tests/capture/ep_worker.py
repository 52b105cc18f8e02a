"""Standalone script: run the EP MoE forward on 4 gloo ranks in sub-groups of 1, 2 and 4 ranks.

Run as ``python ep_worker.py OUT_DIR``; writes ``OUT_DIR/{group}-{scenario}-r{rank}.pt`` with the
inputs, outputs and :class:`EpDebug` evidence of every rank, and ``{group}-{scenario}@{placement}-r{rank}.pt``
for the placements with replicas of :data:`PLACEMENTS`. The test compares them against the
single-process dense MoE. A script (not a test-module function) because spawned children must be
able to import the worker function, which pytest's importlib mode does not allow.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ep_trace.capture.tracer import Tracer
from ep_trace.expert_placement import ExpertPlacement
from ep_trace.workloads.expert_slots import slot_map
from ep_trace.workloads.launcher import init_rank, spawn_ranks
from ep_trace.workloads.moe import ep_moe_forward, held_experts, local_experts, make_layer_weights, route

WORLD = 4
E, H, FFN = 8, 16, 32
#: Group name -> global ranks (group-local order = sorted). Non-zero first ranks test the mapping.
GROUPS = {"g1": [3], "g2": [1, 2], "g4": [0, 1, 2, 3]}
#: Scenario name -> (top_k, chunks); token counts and routing are built in _inputs.
SCENARIOS = {
    "random": (2, 1),
    "random_chunked": (2, 3),
    "all_local": (2, 1),
    "one_remote": (1, 1),
    "empty_expert": (2, 2),
    "ragged": (3, 1),
}


#: Placement name -> group -> (experts of each group-local rank, node of each group-local rank or None).
#: ``replicated``: experts 0 and 7 on three ranks each, ranks holding 2 to 4 experts; on 2 nodes in g4,
#: so a source prefers the replicas of its node. ``empty_rank``: rank 2 holds nothing, rank 3 everything.
PLACEMENTS: dict[str, dict[str, tuple[list[list[int]], tuple[int, ...] | None]]] = {
    "replicated": {
        "g2": ([[0, 1, 2, 3, 7], [4, 5, 6, 7, 0]], None),
        "g4": ([[0, 1, 7], [2, 3, 7, 0], [4, 5, 7], [6, 0]], (0, 0, 1, 1)),
    },
    "empty_rank": {"g4": ([[0, 1, 2, 3], [4, 5, 6, 7], [], list(range(8))], (0, 0, 1, 1))},
}
#: Scenarios run under each placement of PLACEMENTS.
PLACED_SCENARIOS = ("random", "random_chunked", "one_remote", "ragged")


def placed_cases() -> list[tuple[str, str, str]]:
    """``(group, scenario, placement)`` of every run under a placement with replicas."""
    return [(g, s, p) for p, per in PLACEMENTS.items() for g in per for s in PLACED_SCENARIOS]


def tokens_of(scenario: str, grank: int) -> int:
    """Tokens of a rank: never a multiple of anything useful; ``ragged`` has a 1-token rank."""
    if scenario == "ragged":
        return [1, 13, 37, 5][grank]
    return 37 + 2 * grank


def _inputs(scenario: str, grank: int, lrank: int, gsize: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k, _ = SCENARIOS[scenario]
    L = E // gsize
    g = torch.Generator().manual_seed(1000 * grank + len(scenario))
    T = tokens_of(scenario, grank)
    x = torch.randn(T, H, generator=g)
    w = make_layer_weights(H, FFN, E, seed=7, layer=0)
    if scenario in ("random", "random_chunked", "ragged"):
        ids, gate = route(x, w.router, k, torch.randn(T, E, generator=g))
        return x, ids, gate
    if scenario == "all_local":  # both slots on this rank's own experts (distinct when L >= 2)
        base = lrank * L
        first = base + torch.randint(0, L, (T,), generator=g)
        second = base + (first - base + 1) % L  # L >= 2 in every group here
        ids = torch.stack([first, second], 1)
    elif scenario == "one_remote":  # every token to one expert of the next group-local rank
        dst = (lrank + 1) % gsize
        ids = (dst * L + torch.randint(0, L, (T, 1), generator=g)).to(torch.int64)
    else:  # empty_expert: expert 1 is never chosen
        allowed = torch.tensor([e for e in range(E) if e != 1])
        pick = torch.stack([torch.randperm(len(allowed), generator=g)[:k] for _ in range(T)])
        ids = allowed[pick]
    gate = torch.softmax(torch.randn(T, ids.shape[1], generator=g), -1)
    return x, ids.to(torch.int64), gate


def _grad_case(
    name: str, group: object, rank: int, lrank: int, gsize: int, out_dir: str, placement: str | None = None
) -> None:
    """Backward through the EP layer: loss = sum(y * R) with R fixed per rank; save every gradient."""
    L = E // gsize
    full = make_layer_weights(H, FFN, E, seed=7, layer=0)
    slots = None
    if placement is None:
        w = local_experts(full, lrank * L, L)
    else:
        lists, node_of = PLACEMENTS[placement][name]
        pl = ExpertPlacement(E, tuple(tuple(r) for r in lists))
        w, slots = held_experts(full, pl.ranks[lrank]), slot_map(pl, lrank, node_of)
    router, w1, w2 = (t.clone().requires_grad_(True) for t in (w.router, w.w1, w.w2))
    w = type(w)(router, w1, w2, w.first_expert, w.expert_ids)
    x, _, _ = _inputs("random", rank, lrank, gsize)
    x = x.requires_grad_(True)
    g = torch.Generator().manual_seed(77 + rank)
    ids, gate = route(x, router, 2, torch.randn(x.shape[0], E, generator=g))
    y = ep_moe_forward(x, w, ids, gate, num_experts=E, group=group, slots=slots)
    r = torch.randn(y.shape, generator=g)
    (y * r).sum().backward()
    torch.save(
        {"x": x.detach(), "ids": ids, "r": r, "bias_seed": 77 + rank, "y": y.detach(), "gx": x.grad,
         "grouter": router.grad, "gw1": w1.grad, "gw2": w2.grad, "experts": list(w.global_ids)},
        f"{out_dir}/{name}-grad{'' if placement is None else '@' + placement}-r{rank}.pt",
    )  # fmt: skip


def _placed_cases(name: str, group: object, rank: int, lrank: int, gsize: int, out_dir: str) -> None:
    """Every scenario of PLACED_SCENARIOS under each placement of PLACEMENTS that covers this group."""
    full = make_layer_weights(H, FFN, E, seed=7, layer=0)
    for pname, per_group in PLACEMENTS.items():
        if name not in per_group:
            continue
        lists, node_of = per_group[name]
        pl = ExpertPlacement(E, tuple(tuple(r) for r in lists))
        w, slots = held_experts(full, pl.ranks[lrank]), slot_map(pl, lrank, node_of)
        for scen in PLACED_SCENARIOS:
            x, ids, gate = _inputs(scen, rank, lrank, gsize)
            chunks = SCENARIOS[scen][1]
            y, dbg = ep_moe_forward(x, w, ids, gate, num_experts=E, group=group, chunks=chunks, slots=slots, debug=True)
            torch.save(
                {
                    "x": x, "ids": ids, "gate": gate, "y": y,
                    "send_splits": dbg.send_splits, "recv_splits": dbg.recv_splits,
                    "recv_tags": dbg.recv_tags, "recv_experts": dbg.recv_experts, "slot_out": dbg.slot_out,
                },
                f"{out_dir}/{name}-{scen}@{pname}-r{rank}.pt",
            )  # fmt: skip
        _grad_case(name, group, rank, lrank, gsize, out_dir, pname)


def worker(rank: int, port: int, q: object, out_dir: str) -> None:
    """One rank: every group it belongs to, every scenario."""
    init_rank(rank, WORLD, port)
    try:
        groups = {name: dist.new_group(ranks) for name, ranks in GROUPS.items()}  # collective, all ranks
        for name, ranks in GROUPS.items():
            if rank not in ranks:
                continue
            group, gsize, lrank = groups[name], len(ranks), ranks.index(rank)
            L = E // gsize
            w = local_experts(make_layer_weights(H, FFN, E, seed=7, layer=0), lrank * L, L)
            for scen, (_k, chunks) in SCENARIOS.items():
                x, ids, gate = _inputs(scen, rank, lrank, gsize)
                y, dbg = ep_moe_forward(x, w, ids, gate, num_experts=E, group=group, chunks=chunks, debug=True)
                torch.save(
                    {
                        "x": x, "ids": ids, "gate": gate, "y": y,
                        "send_splits": dbg.send_splits, "recv_splits": dbg.recv_splits,
                        "recv_tags": dbg.recv_tags, "recv_experts": dbg.recv_experts, "slot_out": dbg.slot_out,
                    },
                    f"{out_dir}/{name}-{scen}-r{rank}.pt",
                )  # fmt: skip
            _grad_case(name, group, rank, lrank, gsize, out_dir)
            _placed_cases(name, group, rank, lrank, gsize, out_dir)
        # Tracer under torch.distributed with no job id given: rank 0's id is broadcast to all.
        os.environ.pop("EP_TRACE_JOB_ID", None)
        os.environ.pop("TORCHELASTIC_RUN_ID", None)
        with Tracer(f"{out_dir}/traced"):
            x, ids, gate = _inputs("random", rank, rank, WORLD)
            w = local_experts(make_layer_weights(H, FFN, E, seed=7, layer=0), rank * (E // WORLD), E // WORLD)
            ep_moe_forward(x, w, ids, gate, num_experts=E, group=groups["g4"])
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(worker, WORLD, (sys.argv[1],))

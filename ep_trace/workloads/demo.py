"""The demo run: W ranks of the reference EP MoE model under :class:`ep_trace.Tracer`.

``run_demo(DemoConfig(...), out_dir)`` spawns the ranks (gloo on loopback), runs one untraced
warm-up step (gloo connects lazily on the first collective), then ``steps`` traced steps of
``layers`` MoE layers, and writes ``rank{r}.pt.trace.json.gz`` + ``rank{r}.ep.jsonl`` per rank.

Everything is deterministic from ``seed``: weights from ``(seed, layer)``, tokens and routing noise
from ``(seed, rank, step, layer)`` (:mod:`ep_trace.workloads.inputs`). The knobs are
:class:`ep_trace.workloads.config.DemoConfig`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ep_trace.errors import ConfigError
from ep_trace.workloads.comm_priority import prioritize_comm_threads, require_permission
from ep_trace.workloads.config import MAX_RANKS, DemoConfig
from ep_trace.workloads.inputs import routing_bias, step_tokens
from ep_trace.workloads.launcher import (
    Progress,
    init_rank,
    loaded_allocator,
    pin_to_core,
    rank_allocator,
    spawn_ranks,
)

__all__ = ["DemoConfig", "RankModel", "build_rank_model", "run_demo", "routing_bias", "MAX_RANKS"]

logger = logging.getLogger(__name__)


def _device(cfg: DemoConfig, rank: int) -> Any:
    import torch

    return torch.device(f"cuda:{rank}") if cfg.backend == "nccl" else torch.device("cpu")


@dataclass(frozen=True)
class RankModel:
    """What one rank holds for the run: its experts' weights and slot map per placement, and its link delays.

    Attributes:
        weights: ``weights[i][layer]``: the experts rank holds under placement i (0: ``--placement``,
            1: ``--alt-placement``), every layer.
        slots: ``slots[i]``: placement i's physical slots seen from this rank.
        link: The delays added before its all-to-alls, or None.
    """

    weights: tuple[tuple[Any, ...], ...]
    slots: tuple[Any, ...]
    link: Any


def build_rank_model(cfg: DemoConfig, rank: int) -> RankModel:
    """Weights (deterministic from ``(seed, layer)``), slot maps and link delays of ``rank``."""
    from ep_trace.workloads.expert_slots import slot_map
    from ep_trace.workloads.links import LinkDelay
    from ep_trace.workloads.moe import MoEWeights, held_experts, make_layer_weights

    dev = _device(cfg, rank)
    places = [cfg.placement_spec] + ([cfg.alt_placement_spec] if cfg.alt_placement_spec is not None else [])
    full = [make_layer_weights(cfg.hidden, 2 * cfg.hidden, cfg.experts, seed=cfg.seed, layer=ly) for ly in range(cfg.layers)]  # fmt: skip
    weights = []
    for p in places:
        per_layer = []
        for w in full:
            h = held_experts(w, p.ranks[rank])
            router, w1, w2 = (t.to(dev).requires_grad_(cfg.backward) for t in (h.router, h.w1, h.w2))
            per_layer.append(MoEWeights(router, w1, w2, 0, h.expert_ids))
        weights.append(tuple(per_layer))
    node_of = cfg.node_of
    link = LinkDelay(rank, node_of, cfg.link_latency_ms, cfg.cross_node_latency_ms, cfg.cross_node_gbps)
    return RankModel(
        tuple(weights),
        tuple(slot_map(p, rank, node_of, dev) for p in places),
        link if link.active else None,
    )


def model_step(cfg: DemoConfig, model: RankModel, rank: int, step: int, straggle_ms: float) -> Any:
    """One forward step of ``cfg.layers`` residual MoE layers on this rank; returns the activations."""
    import torch.distributed as dist

    from ep_trace.capture.routing import record_routing
    from ep_trace.capture.stages import stage
    from ep_trace.workloads.autograd import bwd_region
    from ep_trace.workloads.moe import ep_moe_forward, route

    dev = _device(cfg, rank)
    alt = int(cfg.alt_placement_spec is not None and step % 2 == 1)
    weights, slots = model.weights[alt], model.slots[alt]
    h = step_tokens(cfg, rank, step).to(dev).requires_grad_(cfg.backward)
    ranks = list(range(dist.get_world_size()))
    for layer, w in enumerate(weights):
        r_in, r_out = bwd_region("route", layer)
        with stage("route", layer):
            ids, gate = route(r_in(h), w.router, cfg.top_k, routing_bias(cfg, rank, step, layer).to(dev))
            gate = r_out(gate)
            # the step's placement: meta.placement is --placement's; each flip of an A/B is a placement record
            held = cfg.placement_at(step).holders
            record_routing(layer, ids, cfg.experts, held, hidden_size=cfg.hidden, dtype=h.dtype, group_ranks=ranks)
        y = ep_moe_forward(
            h, w, ids, gate, num_experts=cfg.experts, layer=layer, chunks=cfg.chunks_at(step), straggle_ms=straggle_ms,
            link=model.link, slots=slots,
        )  # fmt: skip
        h = h + y
    if cfg.backward:
        (h * h).mean().backward()  # gradients are dropped: the demo measures, it does not train
        for w in weights:
            for t in (w.router, w.w1, w.w2):
                t.grad = None
    return h.detach()


@contextlib.contextmanager
def _quiet_stderr_fd() -> Iterator[None]:
    """Silence fd 2 of this rank around profiler start / stop.

    Kineto (torch 2.13) prints ``USDT: ... profiler_start`` / ``profiler_stop`` lines to fd 2 from C++
    at every start and stop, at any KINETO_LOG_LEVEL; with W ranks they would tear the progress bar.
    Python exceptions are unaffected (they propagate to the parent through torch.multiprocessing).
    """
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _rank_meta(cfg: DemoConfig, rank: int, dev: Any, comm_threads: str) -> dict[str, Any]:
    """The sidecar ``meta`` keys the demo knows up front (docs/sidecar.md).

    With ``--nodes N`` (N > 1) the rank's host is its emulated node ``node<n>`` (in the Kineto trace's
    ``host_name`` too: the Tracer writes both), its ``local_rank`` its index in the node, and
    ``host_cores`` the node's share of the machine's cores (at least 1), so that every analysis that
    groups ranks by host sees the emulated nodes; the machine is in ``workload.physical_host``.
    """
    workload = {**cfg.workload_meta(), "allocator": loaded_allocator(), "comm_threads": comm_threads}
    meta: dict[str, Any] = {
        "num_experts": cfg.experts,
        "top_k": cfg.top_k,
        "placement": cfg.placement,
        "redundant_experts": cfg.placement_spec.redundant_experts,
        "hidden_size": cfg.hidden,
        "dtype": "float32",
        "device": str(dev),
        "workload": workload,
    }
    if cfg.nodes > 1:
        per = cfg.ranks // cfg.nodes
        cores = os.cpu_count() or 1
        meta |= {"host": f"node{cfg.node_of[rank]}", "local_rank": rank % per, "host_cores": max(1, cores * per // cfg.ranks)}  # fmt: skip
        workload |= {"physical_host": socket.gethostname(), "physical_host_cores": cores}
    return meta


def _rank_main(rank: int, port: int, q: Any, cfg: DemoConfig, out_dir: str, job_id: str) -> None:
    """Body of one spawned rank."""
    import torch.distributed as dist

    from ep_trace.capture.tracer import Tracer

    if cfg.pin_cores:
        pin_to_core(rank)  # before init_rank starts gloo's threads: they inherit the mask
    init_rank(rank, cfg.ranks, port, backend=cfg.backend)
    try:
        model = build_rank_model(cfg, rank)
        strag = cfg.straggler_spec
        straggle_ms = strag.ms if strag is not None and strag.rank == rank else 0.0
        model_step(cfg, model, rank, -1, straggle_ms)  # warm-up: gloo pairs connect on first use
        if cfg.alt_chunks or cfg.alt_placement_spec is not None:
            model_step(cfg, model, rank, -2, straggle_ms)  # and the other side's path once
        comm_threads = prioritize_comm_threads(cfg.comm_priority)  # gloo's threads exist by now
        q.put(("ready", rank))
        meta = _rank_meta(cfg, rank, _device(cfg, rank), comm_threads)
        # concrete inputs only for the all-to-alls (their split lists): the recording of every op's
        # arguments kept op outputs alive on torch 2.13 (ep_trace.capture.concrete)
        tracer = Tracer(out_dir, job_id=job_id, meta=meta, with_stack=cfg.with_stack, concrete_inputs=False)
        with _quiet_stderr_fd():
            tracer.start()
        try:
            # Profiler start-up takes a different time on each rank; align the ranks before step 0
            # so that the first all-to-all does not absorb the start-up skew as fake barrier wait.
            dist.barrier()
            for s in range(cfg.steps):
                with tracer.step():
                    model_step(cfg, model, rank, s, straggle_ms)
                if rank == 0:
                    q.put(("step", s + 1))
        finally:
            with _quiet_stderr_fd():
                tracer.close()
        q.put(("written", rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _prepare_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out: {out_dir} exists and is a file; give a directory path")
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [*out_dir.glob("rank*.pt.trace.json.gz"), *out_dir.glob("rank*.ep.jsonl")]
    for p in stale:  # files of an earlier run with more ranks would make a mixed directory
        p.unlink()
    if stale:
        logger.info("removed %d trace files of an earlier run from %s", len(stale), out_dir)


def run_demo(config: DemoConfig, out_dir: str | Path, progress: Progress | None = None) -> Path:
    """Run the demo and write its trace directory.

    Args:
        config: The knobs.
        out_dir: Trace directory (created; earlier ``rank*`` trace files in it are removed).
        progress: Optional ``progress(stage, done, total)``; stages ``start`` (ranks ready),
            ``step`` (traced steps done) and ``write`` (ranks whose files are written).

    Returns:
        The trace directory.

    Raises:
        ConfigError: ``out_dir`` is a file, ``nccl`` without one CUDA device per rank,
            ``allocator="jemalloc"`` without the library, or ``comm_priority="realtime"`` without
            the permission.
        MissingDependencyError: torch is not installed.
    """
    out = Path(out_dir)
    from ep_trace.capture.tracer import require_torch

    torch = require_torch()
    if config.backend == "nccl":
        n = torch.cuda.device_count()
        if n < config.ranks:
            raise ConfigError(
                f"--backend: nccl needs one CUDA device per rank: --ranks {config.ranks} but {n} device(s) visible"
            )
    # the allocator and the priority first: a missing jemalloc or permission fails before anything is written
    require_permission(config.comm_priority)
    with rank_allocator(config.allocator, config.huge_pages):
        _prepare_out_dir(out)
        _spawn(config, out, progress)
    return out


def _spawn(config: DemoConfig, out: Path, progress: Progress | None) -> None:
    """Spawn the ranks into ``out`` and relay their progress messages."""
    counts = {"ready": 0, "written": 0}

    def on_message(msg: Any) -> None:
        kind, value = msg
        if progress is None:
            return
        if kind == "step":
            progress("step", int(value), config.steps)
        else:
            counts[kind] += 1
            progress("start" if kind == "ready" else "write", counts[kind], config.ranks)

    if progress is not None:
        progress("start", 0, config.ranks)
    spawn_ranks(_rank_main, config.ranks, (config, str(out), uuid.uuid4().hex), on_message)

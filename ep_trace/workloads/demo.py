"""The demo run: W ranks of the reference EP MoE model under :class:`ep_trace.Tracer`.

``run_demo(DemoConfig(...), out_dir)`` spawns the ranks (gloo on loopback), runs one untraced
warm-up step (gloo connects lazily on the first collective), then ``steps`` traced steps of
``layers`` MoE layers, and writes ``rank{r}.pt.trace.json.gz`` + ``rank{r}.ep.jsonl`` per rank.

Everything is deterministic from ``seed``: weights from ``(seed, layer)``, tokens and routing noise
from ``(seed, rank, step, layer)``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ep_trace.errors import ConfigError
from ep_trace.workloads.comm_priority import check_comm_priority, prioritize_comm_threads, require_permission
from ep_trace.workloads.knobs import SkewSpec, Straggler, parse_skew, parse_straggler, skew_probabilities
from ep_trace.workloads.launcher import (
    Progress,
    check_allocator,
    init_rank,
    loaded_allocator,
    pin_to_core,
    rank_allocator,
    spawn_ranks,
)

__all__ = ["DemoConfig", "run_demo", "routing_bias", "MAX_RANKS"]

logger = logging.getLogger(__name__)

#: Most ranks the demo spawns on one machine (each is a full Python + torch process).
MAX_RANKS = 64


def _at_least(value: int, minimum: int, option: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{option}: must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class DemoConfig:
    """Knobs of the demo; validated on construction (errors name the CLI option).

    Attributes:
        ranks: EP world size (processes).
        experts: Routed experts E (a multiple of ``ranks``; rank r owns ``r*E/W .. (r+1)*E/W - 1``).
        top_k: Experts per token.
        hidden: Hidden size H (expert FFN size is 2*H).
        tokens: Tokens per rank per step.
        layers: MoE layers per step.
        steps: Traced steps (default 8: with 3, the warm-up rule often leaves 2 steps, and the README
            example's no_straggler saving, a median over steps, spread 3.5-30.7 ms over 5 runs on a
            2-vCPU VM; with 8, 16.6-42.0 ms over 8 runs, the straggler heading every verdict).
        skew: ``uniform`` | ``zipf:EXP`` | ``hot:EXPERT:SHARE``.
        straggler: ``RANK:MS``: that rank sleeps MS ms inside each of its expert stages, or ``None``.
        chunks: Pipeline chunks for dispatch / expert / combine (1 = none).
        seed: Seed of weights, tokens and routing noise.
        backend: ``gloo`` (CPU tensors) or ``nccl`` (one CUDA device per rank, ``cuda:<rank>``).
        backward: Also run the backward pass of each step (loss = mean of squared activations):
            transposed all-to-alls and ``phase="bwd"`` stage ranges. Needs ``chunks == 1``.
        link_latency_ms: Fixed delay added to every all-to-all (count exchange, dispatch, combine;
            forward and backward), a stand-in for a cross-node hop whose size is known, so that a
            sweep's fitted per-call α can be checked against it. Needs ``chunks == 1``.
        alt_chunks: When > 0, the odd traced steps (1, 3, ...) run this many chunks instead of
            ``chunks``: an A/B of pipelining inside one run, so that both sides share the run's
            machine state (thread placement, load) and only the chunking differs. Used by
            ``benchmarks/whatif_validate.py``, where run-to-run spread of separate runs on shared
            cores was larger than the saving at stake. 0 = off.
        alt_skew: When set, the odd traced steps route with this skew spec instead of ``skew``
            (the same in-run A/B for routing imbalance). ``None`` = off.
        with_stack: Record Python call frames (``torch.profiler`` ``with_stack=True``, the default of
            vLLM's and SGLang's profilers), so that the traces have the frames theirs have.
        pin_cores: Pin rank r to core ``r mod cores`` of the affinity mask
            (:func:`ep_trace.workloads.launcher.pin_to_core`): each rank owns a core as it would a GPU.
            Used by ``benchmarks/whatif_validate.py``; off by default (ranks float over the cores).
        allocator: The ranks' memory allocator (:func:`ep_trace.workloads.launcher.rank_allocator`):
            ``auto`` (jemalloc, never returning freed pages to the OS, when installed; else glibc),
            ``jemalloc`` (an error when not installed) or ``glibc``. With glibc each large op of a CPU
            rank faults its output in again, which a GPU caching allocator never does.
        huge_pages: With glibc malloc, back its mappings with transparent huge pages
            (:func:`ep_trace.workloads.launcher.huge_page_malloc`): fewer, dearer page faults.
        comm_priority: gloo's transfer threads on ``SCHED_FIFO`` so that an all-to-all in flight is
            not queued behind the compute threads (:mod:`ep_trace.workloads.comm_priority`):
            ``auto`` (where the process may), ``realtime`` (an error where it may not) or ``normal``.
    """

    ranks: int = 4
    experts: int = 8
    top_k: int = 2
    hidden: int = 256
    tokens: int = 512
    layers: int = 2
    steps: int = 8
    skew: str = "uniform"
    straggler: str | None = None
    chunks: int = 1
    seed: int = 0
    backend: str = "gloo"
    backward: bool = False
    link_latency_ms: float = 0.0
    alt_chunks: int = 0
    alt_skew: str | None = None
    with_stack: bool = False
    pin_cores: bool = False
    allocator: str = "auto"
    huge_pages: bool = True
    comm_priority: str = "auto"
    skew_spec: SkewSpec = field(init=False, repr=False, compare=False)
    alt_skew_spec: SkewSpec | None = field(init=False, repr=False, compare=False)
    straggler_spec: Straggler | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _at_least(self.ranks, 1, "--ranks")
        if self.ranks > MAX_RANKS:
            raise ConfigError(f"--ranks: {self.ranks} processes is more than the demo supports ({MAX_RANKS})")
        _at_least(self.experts, 1, "--experts")
        _at_least(self.top_k, 1, "--top-k")
        _at_least(self.hidden, 1, "--hidden")
        _at_least(self.tokens, 1, "--tokens")
        _at_least(self.layers, 1, "--layers")
        _at_least(self.steps, 1, "--steps")
        _at_least(self.chunks, 1, "--chunks")
        _at_least(self.alt_chunks, 0, "--alt-chunks")
        _at_least(self.seed, 0, "--seed")
        check_allocator(self.allocator)
        check_comm_priority(self.comm_priority)
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(f"--backend: unknown backend {self.backend!r}; use gloo or nccl")
        got = f"--chunks {self.chunks}" if self.chunks > 1 else f"--alt-chunks {self.alt_chunks}"
        if self.backward and self.max_chunks > 1:
            raise ConfigError(f"--backward: needs --chunks 1 (the chunked pipeline is forward-only), got {got}")
        lat = self.link_latency_ms
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not math.isfinite(lat) or lat < 0:
            raise ConfigError(f"--link-latency-ms: must be a finite number of ms >= 0, got {lat!r}")
        if lat > 0 and self.max_chunks > 1:
            raise ConfigError(
                f"--link-latency-ms: needs --chunks 1 (a host-side delay would stall the pipelined GEMMs too), got {got}"
            )
        if self.top_k > self.experts:
            raise ConfigError(f"--top-k: {self.top_k} is larger than --experts {self.experts}")
        if self.experts % self.ranks:
            raise ConfigError(
                f"--experts: {self.experts} is not a multiple of --ranks {self.ranks} (each rank owns E/W experts)"
            )
        object.__setattr__(self, "skew_spec", parse_skew(self.skew, self.experts, self.top_k))
        alt = None if self.alt_skew is None else parse_skew(self.alt_skew, self.experts, self.top_k, "--alt-skew")
        object.__setattr__(self, "alt_skew_spec", alt)
        object.__setattr__(self, "straggler_spec", parse_straggler(self.straggler, self.ranks))

    @property
    def max_chunks(self) -> int:
        """The most chunks any step runs."""
        return max(self.chunks, self.alt_chunks)

    def chunks_at(self, step: int) -> int:
        """Chunks of traced step ``step`` (``alt_chunks`` on odd steps when set; warm-up steps < 0 too)."""
        return self.alt_chunks if self.alt_chunks and step % 2 else self.chunks

    def skew_at(self, step: int) -> SkewSpec:
        """Skew of traced step ``step`` (``alt_skew`` on odd steps when set)."""
        return self.alt_skew_spec if self.alt_skew_spec is not None and step % 2 else self.skew_spec

    @property
    def experts_per_rank(self) -> int:
        """L = E / W."""
        return self.experts // self.ranks

    @property
    def placement(self) -> list[list[int]]:
        """``placement[e]`` = ranks holding expert e (contiguous blocks, no replicas)."""
        return [[e // self.experts_per_rank] for e in range(self.experts)]

    def workload_meta(self) -> dict[str, Any]:
        """The ``workload`` object of the sidecar ``meta`` record (docs/sidecar.md): the demo's knobs."""
        return {
            "name": "ep_trace.workloads.demo",
            "tokens": self.tokens,
            "layers": self.layers,
            "steps": self.steps,
            "chunks": self.chunks,
            **({"alt_chunks": self.alt_chunks} if self.alt_chunks else {}),
            **({"alt_skew": str(self.alt_skew_spec)} if self.alt_skew_spec is not None else {}),
            "skew": str(self.skew_spec),
            "straggler": None
            if self.straggler_spec is None
            else f"{self.straggler_spec.rank}:{self.straggler_spec.ms:g}",
            "link_latency_ms": float(self.link_latency_ms),
            "backward": self.backward,
            **({"with_stack": True} if self.with_stack else {}),
            **({"pin_cores": True} if self.pin_cores else {}),
            "huge_pages": self.huge_pages,
            "seed": self.seed,
            "phase": "training" if self.backward else "forward",
        }


def _seed(*parts: int) -> int:
    # A fixed mixing of the parts (Python's hash() of ints is stable, but be explicit).
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def routing_bias(cfg: DemoConfig, rank: int, step: int, layer: int) -> Any:
    """``[tokens, E]`` selection bias realising ``cfg.skew`` (Gumbel-top-k over the target distribution).

    Adding Gumbel noise to ``log p_e`` and taking the top k samples k distinct experts with
    probabilities p (without replacement). ``hot:E:S`` instead forces expert E into a token's top-k
    with probability ``S * k`` (so E gets the fraction S of all assignments) and routes the rest
    uniformly.
    """
    import torch

    g = torch.Generator().manual_seed(_seed(cfg.seed, rank, step, layer))
    u = torch.rand(cfg.tokens, cfg.experts, generator=g).clamp_(1e-12, 1 - 1e-7)
    gumbel = -torch.log(-torch.log(u))
    sk = cfg.skew_at(step)
    if sk.kind == "hot":
        force = torch.rand(cfg.tokens, generator=g) < min(1.0, sk.share * cfg.top_k)
        gumbel[:, sk.expert] += force.to(gumbel.dtype) * 1e4 - (~force).to(gumbel.dtype) * 1e4
        return gumbel
    logp = torch.tensor([math.log(p) for p in skew_probabilities(sk, cfg.experts)])
    return gumbel + logp


def _tokens(cfg: DemoConfig, rank: int, step: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(_seed(cfg.seed, rank, step, 1 << 20))
    return torch.randn(cfg.tokens, cfg.hidden, generator=g)


def _device(cfg: DemoConfig, rank: int) -> Any:
    import torch

    return torch.device(f"cuda:{rank}") if cfg.backend == "nccl" else torch.device("cpu")


def model_step(cfg: DemoConfig, weights: list[Any], rank: int, step: int, straggle_ms: float) -> Any:
    """One forward step of ``cfg.layers`` residual MoE layers on this rank; returns the activations."""
    import torch.distributed as dist

    from ep_trace.capture.routing import record_routing
    from ep_trace.capture.stages import stage
    from ep_trace.workloads.autograd import bwd_region
    from ep_trace.workloads.moe import ep_moe_forward, route

    dev = _device(cfg, rank)
    h = _tokens(cfg, rank, step).to(dev).requires_grad_(cfg.backward)
    ranks = list(range(dist.get_world_size()))
    for layer, w in enumerate(weights):
        r_in, r_out = bwd_region("route", layer)
        with stage("route", layer):
            ids, gate = route(r_in(h), w.router, cfg.top_k, routing_bias(cfg, rank, step, layer).to(dev))
            gate = r_out(gate)
            record_routing(
                layer, ids, cfg.experts, cfg.placement, hidden_size=cfg.hidden, dtype=h.dtype, group_ranks=ranks
            )
        y = ep_moe_forward(
            h, w, ids, gate, num_experts=cfg.experts, layer=layer, chunks=cfg.chunks_at(step), straggle_ms=straggle_ms,
            link_latency_ms=cfg.link_latency_ms,
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


def _rank_main(rank: int, port: int, q: Any, cfg: DemoConfig, out_dir: str, job_id: str) -> None:
    """Body of one spawned rank."""
    import torch.distributed as dist

    from ep_trace.capture.tracer import Tracer
    from ep_trace.workloads.moe import MoEWeights, local_experts, make_layer_weights

    if cfg.pin_cores:
        pin_to_core(rank)  # before init_rank starts gloo's threads: they inherit the mask
    init_rank(rank, cfg.ranks, port, backend=cfg.backend)
    try:
        L, dev = cfg.experts_per_rank, _device(cfg, rank)
        weights = []
        for layer in range(cfg.layers):
            w = local_experts(
                make_layer_weights(cfg.hidden, 2 * cfg.hidden, cfg.experts, seed=cfg.seed, layer=layer), rank * L, L
            )
            router, w1, w2 = (t.to(dev).requires_grad_(cfg.backward) for t in (w.router, w.w1, w.w2))
            weights.append(MoEWeights(router, w1, w2, w.first_expert))
        strag = cfg.straggler_spec
        straggle_ms = strag.ms if strag is not None and strag.rank == rank else 0.0
        model_step(cfg, weights, rank, -1, straggle_ms)  # warm-up: gloo pairs connect on first use
        if cfg.alt_chunks:
            model_step(cfg, weights, rank, -2, straggle_ms)  # and the other side's path once
        comm_threads = prioritize_comm_threads(cfg.comm_priority)  # gloo's threads exist by now
        q.put(("ready", rank))
        meta = {
            "num_experts": cfg.experts,
            "top_k": cfg.top_k,
            "placement": cfg.placement,
            "hidden_size": cfg.hidden,
            "dtype": "float32",
            "device": str(dev),
            "workload": {**cfg.workload_meta(), "allocator": loaded_allocator(), "comm_threads": comm_threads},
        }
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
                    model_step(cfg, weights, rank, s, straggle_ms)
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

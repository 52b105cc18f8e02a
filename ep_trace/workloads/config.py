"""The knobs of the demo run (:class:`DemoConfig`), validated on construction; no torch.

Errors are one line naming the CLI option (``--placement p.json: expert 5 is on no rank; ...``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ep_trace.errors import ConfigError
from ep_trace.expert_placement import ExpertPlacement, contiguous_placement, read_placement
from ep_trace.workloads.comm_priority import check_comm_priority
from ep_trace.workloads.knobs import SkewSpec, Straggler, parse_skew, parse_straggler
from ep_trace.workloads.launcher import check_allocator
from ep_trace.workloads.links import node_blocks

__all__ = ["DemoConfig", "MAX_RANKS"]

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
        experts: Routed experts E (without ``placement_file`` a multiple of ``ranks``: rank r owns
            ``r*E/W .. (r+1)*E/W - 1``).
        top_k: Experts per token.
        hidden: Hidden size H (expert FFN size is 2*H).
        tokens: Tokens per rank per step.
        layers: MoE layers per step.
        steps: Traced steps (default 8: with 3, the warm-up rule often leaves 2 steps, and the README
            example's no_straggler saving, a median over steps, spread 3.5-30.7 ms over 5 runs on a
            2-vCPU VM; with 8, 16.6-42.0 ms over 8 runs, the straggler heading every verdict).
        skew: The routing workload (:mod:`ep_trace.workloads.knobs`: ``uniform``, ``zipf:EXP``,
            ``hot:EXPERT:SHARE``, ``hotset:...``, ``hotrank:...``, ``spread:...``, ``rotate:...``,
            ``cold-rank:R``, ``affinity:...``, ``burst:EVERY:SPEC``).
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
        placement_file: A placement file (:mod:`ep_trace.expert_placement`:
            ``{"num_experts": E, "ranks": [[...], ...]}``, replicas allowed) the ranks run instead of
            contiguous blocks; ``None`` = contiguous.
        alt_placement_file: When set, the odd traced steps run this placement instead (an in-run A/B
            of placements: both sides share the run's machine state and routing). ``None`` = off.
        nodes: Emulated nodes: the ranks in ``nodes`` contiguous blocks (must divide ``ranks``); each
            rank's sidecar and trace name its node ``node<n>`` as the host (:mod:`ep_trace.workloads.links`).
        cross_node_latency_ms: Latency A of each all-to-all call that moves bytes between nodes.
        cross_node_gbps: Bandwidth G (Gbit/s) of each rank's emulated NIC for cross-node bytes (0 = unlimited).
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
    placement_file: str | None = None
    alt_placement_file: str | None = None
    nodes: int = 1
    cross_node_latency_ms: float = 0.0
    cross_node_gbps: float = 0.0
    placement_spec: ExpertPlacement = field(init=False, repr=False, compare=False)
    alt_placement_spec: ExpertPlacement | None = field(init=False, repr=False, compare=False)
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
        _finite_ms(self.link_latency_ms, "--link-latency-ms", "ms")
        if self.link_latency_ms > 0:
            self._needs_one_chunk("--link-latency-ms", got)
        self._check_nodes(got)
        if self.top_k > self.experts:
            raise ConfigError(f"--top-k: {self.top_k} is larger than --experts {self.experts}")
        self._read_placements()
        groups = self.placement_spec.ranks
        object.__setattr__(self, "skew_spec", parse_skew(self.skew, self.experts, self.top_k, rank_experts=groups))
        alt = (
            None
            if self.alt_skew is None
            else parse_skew(self.alt_skew, self.experts, self.top_k, "--alt-skew", rank_experts=groups)
        )
        object.__setattr__(self, "alt_skew_spec", alt)
        object.__setattr__(self, "straggler_spec", parse_straggler(self.straggler, self.ranks))

    def _needs_one_chunk(self, option: str, got: str) -> None:
        if self.max_chunks > 1:
            raise ConfigError(
                f"{option}: needs --chunks 1 (a host-side delay would stall the pipelined GEMMs too), got {got}"
            )

    def _check_nodes(self, got: str) -> None:
        _at_least(self.nodes, 1, "--nodes")
        if self.ranks % self.nodes:
            raise ConfigError(
                f"--nodes: {self.nodes} does not divide --ranks {self.ranks} "
                "(an emulated node is a contiguous block of --ranks / --nodes ranks)"
            )
        _finite_ms(self.cross_node_latency_ms, "--cross-node-latency-ms", "ms")
        _finite_ms(self.cross_node_gbps, "--cross-node-gbps", "Gbit/s (0 = unlimited)")
        for option, v in (("--cross-node-latency-ms", self.cross_node_latency_ms), ("--cross-node-gbps", self.cross_node_gbps)):  # fmt: skip
            if v > 0 and self.nodes < 2:
                raise ConfigError(f"{option}: needs --nodes 2 or more (with one node no pair of ranks crosses nodes)")
            if v > 0:
                self._needs_one_chunk(option, got)

    def _read_placements(self) -> None:
        if self.placement_file is None:
            if self.experts % self.ranks:
                raise ConfigError(
                    f"--experts: {self.experts} is not a multiple of --ranks {self.ranks} (each rank owns E/W "
                    "experts); give a --placement file for any other layout"
                )
            main = contiguous_placement(self.experts, self.ranks)
        else:
            main = read_placement(self.placement_file, "--placement", num_experts=self.experts, world_size=self.ranks)
        alt = (
            None
            if self.alt_placement_file is None
            else read_placement(
                self.alt_placement_file, "--alt-placement", num_experts=self.experts, world_size=self.ranks
            )
        )
        object.__setattr__(self, "placement_spec", main)
        object.__setattr__(self, "alt_placement_spec", alt)

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

    def placement_at(self, step: int) -> ExpertPlacement:
        """Placement of traced step ``step`` (``alt_placement_file``'s on odd steps when set; warm-up steps < 0 too)."""
        return self.alt_placement_spec if self.alt_placement_spec is not None and step % 2 else self.placement_spec

    @property
    def placement(self) -> list[list[int]]:
        """``placement[e]`` = ranks holding expert e under ``placement_file`` (the sidecar's ``meta.placement``)."""
        return self.placement_spec.holders

    @property
    def node_of(self) -> tuple[int, ...]:
        """Emulated node of each rank."""
        return node_blocks(self.ranks, self.nodes)

    def _placement_meta(self) -> dict[str, Any]:
        """The placement and node keys of :meth:`workload_meta` (only those set)."""
        out: dict[str, Any] = {}
        if self.placement_file is not None:
            out["placement_file"] = str(self.placement_file)
        if self.alt_placement_spec is not None:
            out["alt_placement_file"] = str(self.alt_placement_file)
            out["alt_placement"] = self.alt_placement_spec.holders
            out["alt_redundant_experts"] = self.alt_placement_spec.redundant_experts
        if self.nodes > 1:
            out["nodes"] = self.nodes
            out["cross_node_latency_ms"] = float(self.cross_node_latency_ms)
            out["cross_node_gbps"] = float(self.cross_node_gbps)
        return out

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
            **self._placement_meta(),
        }


def _finite_ms(v: float, option: str, unit: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"{option}: must be a finite number of {unit} >= 0, got {v!r}")

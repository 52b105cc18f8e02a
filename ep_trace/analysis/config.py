"""Analysis configuration: a frozen dataclass passed in, never global state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ep_trace.analysis.topology import TopologySpec

__all__ = ["AnalysisConfig", "LinkCost", "LinkDefaults", "TopologySpec"]


@dataclass(frozen=True)
class LinkCost:
    """One link class's α–β cost: a transfer of B bytes takes ``alpha_us`` µs + B / ``beta_gbps`` GB/s."""

    alpha_us: float
    beta_gbps: float


@dataclass(frozen=True)
class LinkDefaults:
    """The α–β costs the placement what-ifs use for a link class the trace cannot fit (docs/placement.md).

    The defaults describe an H100 node: a device-local copy (``same_rank``, HBM), NVLink between the
    GPUs of a node (``same_node``: NVLink 4 moves 450 GB/s per direction, an all-to-all reaches about a
    third of it) and one 400 Gb/s NIC per GPU across nodes (``cross_node``: 50 GB/s line rate, about
    40 achieved). Set them for your cluster: ``AnalysisConfig(link_defaults=LinkDefaults(...))``.
    """

    same_rank: LinkCost = LinkCost(0.0, 1000.0)
    same_node: LinkCost = LinkCost(10.0, 150.0)
    cross_node: LinkCost = LinkCost(20.0, 40.0)

    def of(self, link_class: str) -> LinkCost:
        """The cost of ``link_class`` (one of ``topology.LINK_CLASSES``)."""
        return getattr(self, link_class)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class AnalysisConfig:
    """Knobs of :func:`ep_trace.analysis.analyze`.

    Attributes:
        steps: Inclusive range ``(first, last)`` of profiler steps to analyze; ``None`` = all.
        stage_presets: A user TOML file of extra stage-name patterns (merged over the built-ins).
        hta_compatible: Also compute overlap with HTA's classification and step filter.
        align_clocks: Estimate and apply per-host clock offsets from matched collectives.
        min_clock_calls: Matched calls a host must share with the reference host before its clock
            is moved (fewer: the recorded clock is kept and the report says so).
        representative_step: Step shown in the report timeline; ``None`` = the median-length step.
        max_timeline_ranks: Ranks drawn in the timeline before sampling (large jobs stay openable).
        whatif_chunks: Chunk counts the ``chunked_pipeline`` what-if tries (it reports the best).
        block_events: Events per block of the per-rank passes (:mod:`ep_trace.analysis.rank_pass`):
            consecutive ranks are analysed together up to about this many events. Larger blocks
            pay polars' fixed cost per query fewer times; smaller ones hold less memory. The
            result does not depend on it.
        topology: Which ranks share a node, when the traces do not say (``--topology``); None =
            from the traces (:mod:`ep_trace.analysis.topology`).
        link_defaults: α–β costs per link class for the classes the trace's transfers cannot fit.
        replica_budget: Extra expert replicas each rank may hold in the ``placement`` and
            ``node_local`` what-ifs (memory for that many more experts per rank).
        node_local_slack: ``node_local`` keeps every rank's expert load within (1 + slack) x the
            larger of the mean load and the ``placement`` proposal's largest load.
    """

    steps: tuple[int, int] | None = None
    stage_presets: Path | None = None
    hta_compatible: bool = False
    align_clocks: bool = True
    min_clock_calls: int = 8
    representative_step: int | None = None
    max_timeline_ranks: int = 16
    whatif_chunks: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    block_events: int = 400000
    topology: TopologySpec | None = None
    link_defaults: LinkDefaults = field(default_factory=LinkDefaults)
    replica_budget: int = 1
    node_local_slack: float = 0.1

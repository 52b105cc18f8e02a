"""Analysis configuration: a frozen dataclass passed in, never global state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["AnalysisConfig"]


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

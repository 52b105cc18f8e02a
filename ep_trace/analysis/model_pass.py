"""Pass 8 of :func:`~ep_trace.analysis.engine.analyze`: the causal model of the step and its what-ifs.

The step graph across ranks (:mod:`~ep_trace.analysis.graph`) is built from the activity, replayed
and edited (:mod:`~ep_trace.analysis.whatif`); only its small frames are kept (replay error,
critical path, what-if rows), with notes on what the overlap what-ifs could assume.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import polars as pl

from ep_trace.analysis import graph, rank_pass, whatif
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.finding_common import fmt_ns, rank_list
from ep_trace.analysis.match_pass import MatchPass
from ep_trace.analysis.op_stalls import stall_share
from ep_trace.analysis.resources import UNKNOWN_CORES_NOTE, transfer_hiding
from ep_trace.schema import TraceTables

__all__ = ["ModelPass", "model_pass"]


@dataclass(frozen=True)
class ModelPass:
    """Attributes: the :class:`~ep_trace.analysis.result.Analysis` frames ``replay``, ``critical_path``,
    ``whatif``, ``op_stalls``; and the notes on the overlap what-ifs' assumptions."""

    replay: pl.DataFrame
    critical_path: pl.DataFrame
    whatif: pl.DataFrame
    op_stalls: pl.DataFrame
    notes: tuple[str, ...]


@dataclass(frozen=True)
class RankFacts:
    """What the model needs of the per-rank passes once the activity is gone.

    Attributes:
        mode: ``rank -> 'gpu' | 'cpu'``.
        gap_floor: ``rank -> ns``, the device's back-to-back launch gap.
    """

    mode: dict[int, str]
    gap_floor: dict[int, float]


def model_pass(
    tables: TraceTables,
    blocks: rank_pass.Blocks,
    config: AnalysisConfig,
    facts: RankFacts,
    windows: pl.DataFrame,
    m: MatchPass,
    graph_act: Iterator[pl.DataFrame],
    stage_df: pl.DataFrame,
    stalls: pl.DataFrame,
    rank_load: pl.DataFrame,
) -> ModelPass:
    """Build the step graph (consuming ``graph_act``, a block at a time), replay it, run the what-ifs."""
    mode = facts.mode
    gpu_ranks = [r for r, md in mode.items() if md == "gpu"]
    unmatched = m.matched.filter(pl.col("match_id").is_null()).select(
        "rank", "step", "collective", "start_ns", "end_ns"
    )
    g = graph.build_graph(
        windows,
        m.rank_offsets,
        m.calls,
        m.call_ranks,
        graph_act,
        stage_df,
        stalls.filter(pl.col("rank").is_in(gpu_ranks)),
        unmatched,
        rank_blocks=blocks,
    )
    hiding, unknown_cores = transfer_hiding(tables.ranks, mode)
    cpu_ranks = frozenset(r for r, md in mode.items() if md != "gpu")
    stall_df = rank_pass.op_stalls(tables, blocks, stage_df, cpu_ranks)
    model = whatif.model(
        g,
        rank_load,
        config.whatif_chunks,
        hiding,
        lambda: rank_pass.chunk_cost(tables, blocks, stage_df, mode),
        # every GPU rank, whatever its step source: a whole-trace step runs from the first device work to
        # the end of the last (its start-up and tear-down are cut: ep_trace.analysis.warmup)
        frozenset(gpu_ranks),
        facts.gap_floor if gpu_ranks else None,
        stall_share(stall_df),
    )
    notes = _overlap_notes(model.whatif, hiding, unknown_cores) + _queued_note(model.critical_path, windows)
    return ModelPass(model.replay, model.critical_path, model.whatif, stall_df, tuple(notes))


def _queued_note(cp: pl.DataFrame, windows: pl.DataFrame) -> list[str]:
    """A note when the critical path holds device idle whose next work was already queued
    (:mod:`ep_trace.analysis.queued`) for at least a tenth of the step: it is neither host-bound nor
    a host stall, and the trace cannot say what the device waited for."""
    if cp is None or cp.is_empty():
        return []
    q = int(cp.filter(pl.col("cause") == "queued").select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)
    n = max(int(cp["step"].n_unique()), 1)
    step = float(cast(float, (windows["end_ns"] - windows["start_ns"]).median()) or 0.0)
    if step <= 0 or q / n < 0.1 * step:
        return []
    return [
        f"the device is idle {fmt_ns(q / n)} per step on the critical path ({q / n / step:.0%} of the step) with its "
        "next work already launched: it waited on a dependency, another stream or work outside the trace, not on "
        "its host (neither host-bound nor a host stall; cause 'queued' of the critical path)"
    ]


def _overlap_notes(whatif_rows: pl.DataFrame, hiding: dict[int, float], unknown_cores: list[int]) -> list[str]:
    """What the overlap / pipelining what-ifs could not assume about the ranks' cores."""
    notes: list[str] = []
    overlap_rows = whatif_rows.filter(pl.col("scenario").is_in(["full_overlap", "chunked_pipeline"])).height > 0
    if overlap_rows and unknown_cores:
        notes.append(UNKNOWN_CORES_NOTE.format(ranks=rank_list(unknown_cores)))
    short = sorted(r for r, h in hiding.items() if h < 1.0)
    if overlap_rows and short:
        notes.append(
            f"CPU ranks {rank_list(short)} have fewer than 2 cores each (cpu_cores, host_cores, ranks per host), so gloo's transfer thread has no "
            "spare core: the overlap and pipelining what-ifs keep the transfers' CPU time in the step"
        )
    return notes

"""The analysis pipeline: canonical tables in, :class:`~ep_trace.analysis.result.Analysis` out.

:func:`analyze` is a sequence of named passes, each in its own module, each a vectorised polars pass:

1. steps (:mod:`~ep_trace.analysis.step_pass`): step windows, the steps to analyse;
2. activity and 3. stages (:func:`~ep_trace.analysis.rank_pass.second_pass`): device activity
   (comm / compute), true overlap per (rank, step), stage attribution, top ops and kernels;
4. matching (:mod:`~ep_trace.analysis.match_pass`): collectives matched across ranks, clocks aligned;
5. waits (:mod:`~ep_trace.analysis.wait_pass`): wait matrix, stragglers, the step table;
6. load (:mod:`~ep_trace.analysis.load_pass`): expert / rank load, imbalance, α–β; then topology,
   link costs, EP invariants and the placement plan (:mod:`~ep_trace.analysis.placement_pass`);
7. timeline (:mod:`~ep_trace.analysis.timeline_pass`): host stalls, timeline, breakdown;
8. model (:mod:`~ep_trace.analysis.model_pass`): the step graph, its replay and the what-ifs;
9. findings (:mod:`~ep_trace.analysis.findings`): ranked findings with their savings;
10. invariants (:mod:`~ep_trace.analysis.invariants`): a finding or figure that breaks a physical
    invariant is withheld, with a line saying why.

The per-rank passes read the events a block of ranks at a time (:mod:`~ep_trace.analysis.rank_pass`);
nothing here holds every rank's events or their intermediates at once, and each pass' large inputs are
dropped (``del``) as soon as the last pass that reads them is done: the analysis' memory peak is the
step graph's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import polars as pl

from ep_trace.analysis import findings, invariants, rank_coverage, rank_pass
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.load_pass import load_pass
from ep_trace.analysis.match_pass import match_pass
from ep_trace.analysis.model_pass import RankFacts, model_pass
from ep_trace.analysis.placement_pass import placement_pass, proposals
from ep_trace.analysis.placement_plan import PER_RANK_SCHEMA
from ep_trace.analysis.result import Analysis
from ep_trace.analysis.step_pass import step_pass
from ep_trace.analysis.timeline_pass import timeline_pass
from ep_trace.analysis.wait_pass import wait_pass
from ep_trace.errors import NothingToAnalyzeError
from ep_trace.schema import STAGES as STAGES_SCHEMA
from ep_trace.schema import TraceTables

__all__ = ["analyze"]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


def analyze(tables: TraceTables, config: AnalysisConfig, progress: Progress | None = None) -> Analysis:
    """Run every analysis over ``tables``.

    Args:
        tables: Validated canonical tables (one trace set).
        config: Analysis knobs.
        progress: Optional ``progress(stage, done, total)`` callback.

    Returns:
        The frozen :class:`Analysis`.

    Raises:
        NothingToAnalyzeError: no events, or no profiler step in ``config.steps``.
    """
    total = 9
    say = progress or (lambda stage, done, tot: None)
    blocks, n_events = rank_pass.rank_blocks(tables, config.block_events)
    if n_events == 0:
        raise NothingToAnalyzeError(
            "the trace set holds no events; profile at least one step (check the profiler schedule)"
        )
    say("steps", 0, total)
    sp = step_pass(tables, blocks, config)
    first, windows, step_notes = sp.first, sp.windows, sp.notes
    del sp
    say("overlap", 1, total)
    say("stages", 2, total)
    second = rank_pass.second_pass(tables, blocks, first, windows, config)
    stage_df = second.stages
    say("matching", 3, total)
    m = match_pass(tables.collectives, tables.ranks, windows, stage_df, config)
    say("waits", 4, total)
    w = wait_pass(m, windows, second.overlap, tables.ranks, first.mode)
    say("imbalance", 5, total)
    ld = load_pass(tables, m)
    pp = placement_pass(tables, m, ld, sorted(int(x) for x in windows["step"].unique()), config)
    say("bandwidth", 6, total)
    tl = timeline_pass(blocks, first, second, windows, m, w, config)
    facts = RankFacts(first.mode, first.gap_floor)
    # the blocking host calls (512 k rows over 4,096 param DLRM ranks) are read only by the stalls:
    # freed before the step graph, the analysis' peak; the graph then takes the activity's only copy,
    # a block at a time (rank_pass.drain_blocks), and frees each block as its work pieces grow
    del first
    graph_act = rank_pass.drain_blocks(second.activity, blocks)
    detection, top_ops, top_kernels = second.detection, second.top_ops, second.top_kernels
    coverage, unassigned = second.coverage, second.unassigned
    del second
    say("model", 7, total)
    md = model_pass(
        tables, blocks, config, facts, windows, m, graph_act, stage_df, tl.host_stalls, ld.rank_load, pp.inputs
    )
    say("findings", 8, total)
    hta = rank_pass.hta_overlap(tables, blocks) if config.hta_compatible else None
    filled = dataclasses.replace(tables, stages=stage_df.select(list(STAGES_SCHEMA)).cast(STAGES_SCHEMA))
    partial = Analysis(
        config=config,
        tables=filled,
        rank_summary=w.rank_summary,
        steps=w.steps,
        stages=stage_df.drop("sid"),
        calls=m.calls,
        call_ranks=m.call_ranks,
        wait_matrix=w.wait_matrix,
        stragglers=w.stragglers,
        group_stragglers=w.group_stragglers,
        expert_load=ld.expert_load,
        rank_load=ld.rank_load,
        imbalance=ld.imbalance,
        count_matrix=ld.count_matrix,
        split_violations=ld.split_violations,
        alpha_beta=ld.alpha_beta,
        host_stalls=tl.host_stalls,
        clock=m.clock,
        intervals=tl.intervals,
        exposed_comm=tl.exposed_comm,
        findings=(),
        detection_method=detection,
        hta_overlap=hta,
        load_report=tables.load_report,
        notes=step_notes + m.notes + pp.notes + md.notes + rank_coverage.coverage_notes(tables),
        misaligned=m.misaligned,
        replay=md.replay,
        critical_path=md.critical_path,
        whatif=md.whatif,
        breakdown=tl.breakdown,
        top_kernels=top_kernels,
        top_ops=top_ops,
        op_stalls=md.op_stalls,
        topology=pp.topology,
        link_costs=pp.link_costs,
        link_bytes=pp.link_bytes,
        ep_invariants=pp.ep_invariants,
        placement=pp.plan.per_rank if pp.plan is not None else pl.DataFrame(schema=PER_RANK_SCHEMA),
        placement_proposals=proposals(pp.plan, config.replica_budget),
        stage_coverage=coverage,
        unassigned_kernels=unassigned,
    )
    out = invariants.enforce(findings.with_findings(partial))
    log.debug(
        "analysed %d ranks, %d matched calls, %d findings", w.rank_summary.height, m.calls.height, len(out.findings)
    )
    say("done", total, total)
    return out

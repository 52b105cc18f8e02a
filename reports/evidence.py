"""Where the evidence of each finding is: the report section and a time window in the annotated trace.

Every finding gets an id (``F1``, ``F2`` … in ranked order, as the report lists them), the report
section that shows its numbers, and a window: the representative step (the step the timeline
draws) on the finding's first rank (else the slowest rank), on that rank's own clock, i.e. the
timestamps of its original trace file. ``ep-trace annotate`` writes the same window as a slice
named ``F<n>: <title>`` on the "ep-trace findings" track, so in Perfetto the search box finds it
(docs/annotate.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis.result import Analysis, Finding
from ep_trace.reports import digest

__all__ = ["Evidence", "SECTION_OF_KIND", "finding_evidence", "representative_step"]

#: Finding kind -> report section id holding its figure or table.
SECTION_OF_KIND: dict[str, str] = {
    "exposed_comm": "overlap",
    "straggler_wait": "wait",
    "routing_imbalance": "routing",
    "host_stall": "stalls",
    "host_bound": "breakdown",
    "small_message_latency": "alphabeta",
    "bandwidth_bound": "alphabeta",
    "pack_unpack_overhead": "stages",
    "split_inconsistency": "load",
    "missing_collective": "load",
    "dominant_stage": "breakdown",
}


@dataclass(frozen=True)
class Evidence:
    """The evidence of one finding.

    Attributes:
        fid: ``F1``, ``F2`` … (ranked order).
        finding: The finding.
        section: Report section id (``#<section>``).
        rank: Rank whose trace holds the window (None when the run has no steps).
        step: Profiler step of the window.
        start_ns: Window start, the rank's own clock (= its trace file's timestamps), epoch ns.
        end_ns: Window end.
        since_trace_start_ms: Window start in ms after the rank's first event (what Perfetto shows).
    """

    fid: str
    finding: Finding
    section: str
    rank: int | None
    step: int | None
    start_ns: int | None
    end_ns: int | None
    since_trace_start_ms: float | None


def representative_step(analysis: Analysis) -> int | None:
    """The step the report's timeline draws: configured, else the median-length step (by its slowest rank)."""
    if analysis.config.representative_step is not None:
        return analysis.config.representative_step
    st = analysis.steps
    if st.height == 0:
        return None
    per = st.group_by("step").agg(pl.col("step_time_ns").max()).sort("step_time_ns", "step")
    return int(per["step"][(per.height - 1) // 2])


def finding_evidence(analysis: Analysis) -> list[Evidence]:
    """One :class:`Evidence` per finding, in the report's ranked order."""
    step = representative_step(analysis)
    st = analysis.steps
    slowest = None
    if st.height:
        slowest = int(st.sort("step_time_ns", descending=True)["rank"][0])
    starts = dict(analysis.tables.ranks.select("rank", "trace_start_ns").iter_rows())
    out = []
    for i, f in enumerate(digest.ranked_findings(analysis)):
        rank = int(f.ranks[0]) if f.ranks else slowest
        win = st.filter((pl.col("rank") == rank) & (pl.col("step") == step)) if rank is not None else st.head(0)
        if win.height == 0 and rank is not None:
            win = st.filter(pl.col("rank") == rank).sort("step").head(1)
        s = int(win["start_ns"][0]) if win.height else None
        e = int(win["end_ns"][0]) if win.height else None
        t0 = starts.get(rank) if rank is not None else None
        since = (s - t0) / 1e6 if s is not None and t0 is not None else None
        out.append(
            Evidence(
                fid=f"F{i + 1}",
                finding=f,
                section=SECTION_OF_KIND.get(f.kind, "breakdown"),
                rank=rank,
                step=int(win["step"][0]) if win.height else None,
                start_ns=s,
                end_ns=e,
                since_trace_start_ms=since,
            )
        )
    return out

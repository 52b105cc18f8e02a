"""The HTML report: one self-contained, offline file rendered from an :class:`Analysis`.

:func:`render_report` assembles the page: the verdict, then the sections in a fixed order, each
built from the figures (``stage_figures``, ``timeline``, ``routing_figures``, ``comm_figures``,
``breakdown_figures``) and the section builders of :mod:`ep_trace.reports.html_sections`, inside
the page shell of :mod:`ep_trace.reports.html_page` (plotly.js embedded once, no CDN). Nothing
here reads a trace format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from ep_trace.analysis.result import Analysis
from ep_trace.reports import breakdown_figures, comm_figures, digest, routing_figures, stage_figures, timeline
from ep_trace.reports.coverage_section import coverage_html
from ep_trace.reports.figure_style import n_ranks
from ep_trace.reports.html_page import Section, esc, figure_html, page
from ep_trace.reports.html_sections import (
    alpha_beta_table,
    definitions_html,
    findings_html,
    host_stalls_html,
    hta_overlap_html,
    imbalance_table,
    load_report_html,
    phases_html,
    rank_table_html,
    routing_coverage_html,
    stragglers_html,
    top_html,
    whatif_html,
    withheld_html,
)
from ep_trace.reports.placement_section import invariants_html, placement_html
from ep_trace.reports.units import fmt_ns

__all__ = ["render_report"]


_BREAKDOWN_CAPTION = (
    "compute = compute alone (K \\ C); overlapped comm = communication hidden under compute (C ∩ K); barrier wait = "
    "inside a collective waiting for the last peer (W \\ K); exposed comm = transfer nothing hides (C \\ (K ∪ W)); "
    "copy = device memcpy / memset alone (M \\ (C ∪ K ∪ W)); host stall = device idle while the host blocks; idle = "
    "nothing measured runs. C, K, W, M = union of the rank's comm, compute, wait and copy intervals; the parts add up "
    "to the step (docs/metrics.md)."
)
_CAPTIONS = {
    "overlap": "C = union of a rank's communication intervals, K = union of its compute intervals: |C ∩ K| is "
    "communication hidden under compute (overlapped), |C \\ K| communication nothing hides (exposed).",
    "count": "C[i][j] = rows rank i sends to rank j in dispatch, mean per step. 'vs mean' colours each cell by its "
    "deviation from the mean cell (blue below, red above).",
    "expert_load": "n_e = assignments routed to expert e per step (top-k counts each token k times); dotted line = mean.",
    "imbalance": "I_e = max_e n_e / mean_e n_e (n_e = assignments to expert e); I_r = max_r L_r / mean_r L_r "
    "(L_r = rows rank r receives in dispatch). 1 = perfectly balanced; bars are the P50 over steps, whiskers the max.",
    "wait": "Barrier wait = a − s_r: time from the rank's start of a collective to the last peer's arrival; "
    "transfer = the rest of the collective (wait-free).",
    "wait_matrix": "M[i][j] = total time rank i waited for rank j inside collectives (j arrived last), summed over "
    "the process groups i and j share (the JSON's wait_matrix and groups give each group apart).",
    "alpha_beta": "α–β model: T = α + B/β per call, α = fixed latency per call (µs), β = bandwidth (GB/s), B = bytes. "
    f"The fitted line is drawn only when it explains the scatter (r² ≥ {comm_figures.MIN_FIT_R2}); else the fit is inconclusive.",
}


def render_report(
    analysis: Analysis,
    title: str = "ep-trace report",
    sources: Sequence[str] = (),
    extra_sections: Sequence[Section] = (),
    progress: Callable[[str, int, int], None] | None = None,
) -> str:
    """Render the full report page.

    Order: the EP invariants, verdict (first under the title) + findings with their evidence; where the time goes
    (per-rank breakdown beside the stage breakdown, top kernels and CPU ops); timeline of one step
    (with the critical path when the analysis has one); routing (count matrix, expert load, I_e / I_r
    per layer); placement and topology (link classes, proposals); overlap; barrier wait (per rank, wait matrix, stragglers, per-rank step-time table);
    α–β fit; host stalls; load report; ``extra_sections``; metric definitions.

    Args:
        analysis: The analysis to show.
        title: Page title.
        sources: Input directories / files, shown under the title.
        extra_sections: Sections inserted before the definitions.
        progress: Optional callback ``progress(stage, done, total)``.

    Returns:
        The HTML document as a string.
    """
    ss = digest.step_stats(analysis)
    v = digest.verdict(analysis)
    sel = timeline.timeline_selection(analysis)
    notes: list[str] = []
    steps_total = 9
    tick = (lambda i: progress("render", i, steps_total)) if progress else (lambda i: None)

    sections: list[tuple[str, str, str]] = []
    verdict_html = (
        f'<div class="verdict {esc(v.severity)}" id="verdict">{invariants_html(analysis)}'
        f'<div class="headline" elementtiming="verdict">{esc(v.headline)}</div>'
        f'<div class="detail">{esc(v.detail)}</div><div class="context">{esc(v.context)}</div></div>'
    )
    sections.append(
        (
            "findings",
            "Findings and their evidence",
            findings_html(analysis, ss.mean_ns) + withheld_html(analysis) + whatif_html(analysis),
        )
    )
    tick(1)
    sentence = breakdown_figures.breakdown_sentence(analysis)
    left = (f'<p class="note">{esc(sentence)}</p>' if sentence else "") + figure_html(
        breakdown_figures.time_breakdown(analysis),
        "fig-breakdown",
        "No step windows, so no per-rank breakdown.",
        _BREAKDOWN_CAPTION,
    )
    right = '<div id="stages"></div>' + figure_html(
        stage_figures.stage_breakdown(analysis),
        "fig-stages",
        "No EP stages detected: the trace has no ep-trace stage ranges and no preset matched, so there is no stage breakdown.",
        "Busy = device time of the stage; window = first start to last end. A window much longer than busy time is idle "
        "or waiting.",
    )
    tops = f'<div class="pair"><div>{top_html(analysis, "kernels")}</div><div>{top_html(analysis, "ops")}</div></div>'
    sections.append(
        ("breakdown", "Where the time goes", f'<div class="pair"><div>{left}</div><div>{right}</div></div>{tops}')
    )
    sections.append(("coverage", "Stage coverage: the MoE time whose stage was found", coverage_html(analysis)))
    tick(2)
    tl_note = ""
    if sel.sampled:
        tl_note = (
            f'<p class="note">{len(sel.ranks)} of {sel.n_ranks_total} ranks drawn (the stragglers, the rank that waits most, '
            "and evenly spaced ranks) to keep the page light.</p>"
        )
        notes.append(f"Timeline: {len(sel.ranks)} of {sel.n_ranks_total} ranks drawn.")
    if sel.min_interval_ns:
        tl_note += f'<p class="note">Intervals shorter than {fmt_ns(sel.min_interval_ns)} are not drawn.</p>'
        notes.append(f"Timeline: intervals shorter than {fmt_ns(sel.min_interval_ns)} left out.")
    has_cp = breakdown_figures.critical_path_of(analysis, sel.step) is not None
    sections.append(
        (
            "timeline",
            "Timeline of a representative step",
            '<p class="note">The step whose slowest-rank length is the median. Stage rows use the stage colours; grey = '
            "communication; rose = waiting for the last arriver inside a collective; wine = communication not hidden "
            "under compute (exposed)."
            + (" The top row is the critical path: what set the step's length, coloured by cause." if has_cp else "")
            + "</p>"
            + tl_note
            + figure_html(timeline.step_timeline(analysis, sel), "fig-timeline", "No intervals to draw for this step."),
        )
    )
    tick(3)
    no_routing = "No routing data: the traces carry neither an ep-trace sidecar nor all-to-all split sizes, so expert load and the count matrix are unknown."
    if analysis.count_matrix.height or analysis.expert_load.height:
        n_r = n_ranks(analysis)
        if n_r > 64:
            notes.append(f"Count matrix: {n_r} ranks binned into groups of {-(-n_r // 64)}.")
        routing = (
            routing_coverage_html(analysis)
            + figure_html(
                routing_figures.count_matrix_heatmap(analysis),
                "fig-count-matrix",
                "No count matrix (no split sizes recorded).",
                _CAPTIONS["count"],
            )
            + figure_html(
                routing_figures.expert_load_bars(analysis),
                "fig-expert-load",
                "No per-expert counts (no ep-trace sidecar routing records).",
                _CAPTIONS["expert_load"],
            )
            + figure_html(
                routing_figures.imbalance_per_layer(analysis),
                "fig-imbalance",
                "No imbalance figures.",
                _CAPTIONS["imbalance"],
            )
            + imbalance_table(analysis)
        )
    else:
        routing = f'<p class="note">{esc(no_routing)}</p>'
    sections.append(("routing", "Routing: count matrix and expert load", routing))
    placement = placement_html(analysis)
    if placement:
        sections.append(("placement", "Placement and topology: where experts live, what crosses nodes", placement))
    tick(4)
    ov_sentence = comm_figures.overlap_sentence(analysis)
    if ov_sentence is not None:
        overlap = f'<p class="note"><b>{esc(ov_sentence)}</b></p><p class="caption">{esc(_CAPTIONS["overlap"])}</p>'
    else:
        overlap = figure_html(
            comm_figures.overlap_per_rank(analysis),
            "fig-overlap-rank",
            "No communication intervals found.",
            _CAPTIONS["overlap"],
        ) + figure_html(
            comm_figures.overlap_per_stage(analysis),
            "fig-overlap-stage",
            "No EP stage carries communication, so there is no per-stage overlap.",
        )
    sections.append(("overlap", "Overlap: how much communication is hidden", overlap + hta_overlap_html(analysis)))
    tick(5)
    sections.append(
        (
            "wait",
            "Barrier wait and stragglers",
            figure_html(
                comm_figures.barrier_wait_per_rank(analysis),
                "fig-wait-rank",
                "No matched collectives, so no barrier wait.",
                _CAPTIONS["wait"],
            )
            + figure_html(
                comm_figures.wait_matrix_heatmap(analysis),
                "fig-wait-matrix",
                "Nobody waited: the wait matrix is all zero.",
                _CAPTIONS["wait_matrix"],
            )
            + stragglers_html(analysis)
            + "<h3>Per-rank step time and communication</h3>"
            + rank_table_html(analysis)
            + phases_html(analysis),
        )
    )
    tick(6)
    sections.append(
        (
            "alphabeta",
            "Message size and bandwidth (α–β fit)",
            figure_html(
                comm_figures.alpha_beta_scatter(analysis),
                "fig-alpha-beta",
                "No matched calls with known bytes, so no α–β fit.",
                _CAPTIONS["alpha_beta"],
            )
            + alpha_beta_table(analysis),
        )
    )
    sections.append(("stalls", "Host stalls", host_stalls_html(analysis)))
    tick(7)
    sections.append(("load", "Load report: what was read, skipped, guessed", load_report_html(analysis, notes)))
    for sec in extra_sections:
        sections.append((sec.anchor, sec.title, sec.body_html))
    sections.append(("definitions", "Metric definitions", definitions_html()))
    tick(8)
    nav = "<nav>" + "".join(f'<a href="#{a}">{esc(t.split(":")[0])}</a>' for a, t, _ in sections) + "</nav>"
    body = nav + "".join(f'<section id="{a}"><h2>{esc(t)}</h2>{b}</section>' for a, t, b in sections)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = (f"{', '.join(sources)} · " if sources else "") + f"generated {stamp}"
    out = page(title, body, subtitle, lead=verdict_html)
    tick(9)
    return out

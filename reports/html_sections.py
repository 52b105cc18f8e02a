"""The analysis report's section builders: each returns the HTML of one block of the page.

Findings with their evidence, the simulated what-ifs, the per-rank step-time table, the
imbalance table, the straggler ranking, host stalls, the α–β fit table, the HTA-compatible
overlap, the unmatched collectives, the load report, the top kernels / CPU ops and the metric
definitions (:data:`METRIC_DEFINITIONS`). :func:`ep_trace.reports.html.render_report` places
them; the figures come from the ``*_figures`` modules. Every builder reads an
:class:`~ep_trace.analysis.result.Analysis` only.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from ep_trace.analysis.rank_coverage import ranks_phrase, routing_missing_ranks
from ep_trace.analysis.result import Analysis
from ep_trace.analysis.steps import phase_table
from ep_trace.reports import breakdown_figures, comm_figures, digest
from ep_trace.reports.evidence import Evidence, finding_evidence
from ep_trace.reports.html_page import LEFT_CLASS, esc, table_html
from ep_trace.reports.units import fmt_ns, fmt_pct, fmt_ratio, is_missing
from ep_trace.reports.whatif_table import WHATIF_HEADERS, whatif_rows

__all__ = [
    "METRIC_DEFINITIONS",
    "findings_html",
    "whatif_html",
    "rank_table_html",
    "phases_html",
    "imbalance_table",
    "stragglers_html",
    "withheld_html",
    "host_stalls_html",
    "alpha_beta_table",
    "hta_overlap_html",
    "load_report_html",
    "routing_coverage_html",
    "definitions_html",
    "top_html",
]

#: (metric, definition) pairs shown at the end of the page; they follow DESIGN.md §5 / docs/metrics.md.
METRIC_DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "Step time",
        "Length of a profiler step (ProfilerStep#N) on one rank. The job's step time is that of its slowest rank; "
        "P50/P95/P99/max are taken over steps.",
    ),
    (
        "Stage window / busy",
        "For rank r, step s, layer l, stage k: window = first start → last end of the device work "
        "attributed to the stage (launched inside its CPU range); busy = |union of those device intervals|. "
        "On CPU-only traces the 'device' is the compute thread plus the communication worker threads.",
    ),
    (
        "Overlap, exposed comm",
        "C = union of a rank's communication intervals, K = union of its compute intervals. "
        "overlapped = |C ∩ K|, exposed comm = |C \\ K|, overlap efficiency = |C ∩ K| / |C|. Only measured concurrent intervals count.",
    ),
    (
        "Barrier wait, transfer",
        "Collectives are matched across ranks (process group + sequence number, or ordinal). "
        "For a call with per-rank start s_r and end e_r, the last arrival is a = max_r s_r; rank r waits for a_r = a, or, in an "
        "all-to-allv, for the last of the peers it exchanges rows with; wait_r = a_r − s_r; "
        "transfer_r = e_r − max(s_r, a_r). A collective's duration includes this wait, so the straggler is the rank with the shortest comm time.",
    ),
    (
        "Wait matrix, straggler ranking",
        "M[i][j] = total time rank i waited for rank j (the last of the peers i exchanges with). "
        "Stragglers are ranked by their median lateness per step (how much later than the second-last rank they arrive); "
        "times last = calls where the rank arrived last, induced wait = the others' total wait for it.",
    ),
    (
        "Clock uncertainty",
        "Ranks on one host share a clock; across hosts a per-host offset is estimated from matched collective end "
        "times and applied. The residual spread is the uncertainty of every wait figure.",
    ),
    (
        "I_e (expert imbalance)",
        "n_e = assignments routed to expert e (top-k counted k times); I_e = max_e n_e / mean_e n_e, "
        "mean over all experts, empty ones included. 1 = perfectly balanced.",
    ),
    (
        "I_r (rank imbalance)",
        "L_r = rows received by rank r in dispatch (column sums of the count matrix); I_r = max_r L_r / mean_r L_r. "
        "The slowest rank's expert GEMM sets the pace, so I_r bounds the time lost to routing.",
    ),
    (
        "Count matrix, local ratio",
        "C[i][j] = rows sent from rank i to rank j per (step, layer, direction); local ratio = trace(C) / sum(C). "
        "Rank i's send split to j must equal rank j's receive split from i; violations are listed, never hidden.",
    ),
    (
        "Bytes, bandwidth, α–β fit",
        "bytes = rows × row bytes. Achieved bandwidth uses the wait-free transfer time. "
        "T = α + B/β is fitted per link class (intra-host, inter-host): a large α share means latency-bound, else bandwidth-bound.",
    ),
    (
        "EP invariants",
        "Assignment conservation: each routing decision assigns tokens × top-k slots, and every assignment is "
        "dispatched once (dropped and padding rows counted and named). Ownership: each expert's rows land on a rank "
        "that holds it under the recorded placement. Split consistency: as above. Stated before any performance figure.",
    ),
    (
        "Link classes, placement",
        "Each (source, destination) pair is same rank, same node or cross node (host names, the launcher, or "
        "--topology). A call's transfer costs α of its farthest class + Σ bytes / β per class, fitted from the trace's "
        "all-to-alls (else defaults). A placement maps experts to ranks (replicas: a source's rows go to the copies on "
        "its node first, split evenly); the placement and node_local what-ifs re-price expert work per row and the "
        "transfers per class for the proposed placement, and replay the step.",
    ),
    (
        "Host stall",
        "Device idle on the critical path while the host blocks (e.g. cudaStreamSynchronize, a D2H copy of the counts "
        "before the token all-to-all).",
    ),
    (
        "Estimated saving",
        "Step time saved per step by the remedy of a finding: imbalance → max replaced by mean; full overlap → exposed "
        "comm removed; straggler fixed → induced wait removed; FP8 dispatch → dispatch bytes halved.",
    ),
)


def _evidence_cell(ev: Evidence) -> str:
    """HTML: link to the report section, and where the window is in the annotated trace."""
    link = f'<a href="#{ev.section}">{esc(ev.section)} section</a>'
    if ev.rank is None or ev.start_ns is None or ev.end_ns is None:
        return link
    since = f" at {ev.since_trace_start_ms:.3f} ms" if ev.since_trace_start_ms is not None else ""
    return (
        f"{link}<br>trace: <code>rank{ev.rank}.ep-annotated.json.gz</code>, step {ev.step}{since} "
        f"(+{fmt_ns(ev.end_ns - ev.start_ns)}); in Perfetto search <code>{ev.fid}</code>"
    )


def findings_html(analysis: Analysis, mean_step: float | None) -> str:
    """The findings table: severity, saving per step (ns and share of ``mean_step`` ns), remedy, evidence."""
    evidence = finding_evidence(analysis)
    if not evidence:
        return '<p class="note">No findings.</p>'
    head = ["id", "severity", "finding", "saving / step", "of mean step", "remedy", "ranks", "layers", "evidence"]
    th = "".join(f"<th{LEFT_CLASS if i in (0, 1, 2, 5, 8) else ''}>{esc(h)}</th>" for i, h in enumerate(head))
    rows = []
    for ev in evidence:
        f = ev.finding
        share = fmt_pct(f.est_saving_ns / mean_step) if mean_step else "–"
        sev = f' class="l sev-{esc(f.severity)}"' if f.severity in ("high", "medium") else LEFT_CLASS
        rows.append(
            f'<tr id="finding-{ev.fid}"><td{LEFT_CLASS}>{ev.fid}</td><td{sev}>{esc(f.severity)}</td>'
            f'<td class="l wide">{esc(f.title)}</td><td>{esc(fmt_ns(f.est_saving_ns))}</td><td>{esc(share)}</td>'
            f'<td class="l wide">{esc(f.remedy)}</td><td>{esc(", ".join(map(str, f.ranks)) or "all")}</td>'
            f'<td>{esc(", ".join(map(str, f.layers)) or "all")}</td><td class="l wide">{_evidence_cell(ev)}</td></tr>'
        )
    note = (
        '<p class="note">Evidence: the report section with the numbers, and the time window in the annotated '
        "trace (<code>ep-trace annotate DIR -o OUT</code>; open the file in ui.perfetto.dev and type the id, "
        'e.g. F1, in the search box: the slice on the "ep-trace findings" track marks the window; see docs/annotate.md).</p>'
    )
    return f'<div class="tbl"><table><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>' + note


def withheld_html(analysis: Analysis) -> str:
    """One line per finding or group of figures withheld for breaking an invariant (empty when none)."""
    return "".join(f'<p class="note withheld">{esc(line)}</p>' for line in digest.withheld_lines(analysis))


def whatif_html(analysis: Analysis) -> str:
    """The simulated what-if table (empty string when the analysis has none)."""
    rows = whatif_rows(analysis)
    if not rows:
        return ""
    return (
        '<h3 id="whatif">Simulated what-ifs</h3><p class="note">Each row edits the step graph and replays it '
        "(the measured step is replayed first, so the rows compare like with like). The savings overlap: the "
        "<code>all</code> row is what every fix at once would give.</p>"
        + table_html(WHATIF_HEADERS, rows, left=(0, 1, 5, 6))
    )


def rank_table_html(analysis: Analysis, max_rows: int = 64) -> str:
    """Per-rank step time and communication; beyond ``max_rows`` ranks, those with the longest max step."""
    rt = digest.rank_table(analysis)
    if rt.height == 0:
        return '<p class="note">No per-rank data.</p>'
    note = ""
    if rt.height > max_rows:
        rt = rt.sort("step_max_ns", descending=True, nulls_last=True).head(max_rows)
        note = (
            f'<p class="note">The {max_rows} ranks with the longest max step are shown; the JSON summary has all.</p>'
        )
    rows = [
        [
            r["rank"],
            r["host"] or "–",
            fmt_ns(r["step_p50_ns"]),
            fmt_ns(r["step_p95_ns"]),
            fmt_ns(r["step_p99_ns"]),
            fmt_ns(r["step_max_ns"]),
            fmt_ns(r["comm_ns"]),
            fmt_ns(r["exposed_comm_ns"]),
            fmt_ns(r["exposed_p99_ns"]),
            fmt_pct(r["overlap_efficiency"]),
            fmt_ns(r["barrier_wait_ns"]),
            fmt_ns(r["wait_p99_ns"]),
            fmt_ns(r["transfer_ns"]),
        ]
        for r in rt.iter_rows(named=True)
    ]
    return note + table_html(
        [
            "rank",
            "host",
            "step P50",
            "P95",
            "P99",
            "max",
            "comm / step",
            "exposed / step",
            "exposed P99",
            "overlap eff.",
            "wait / step",
            "wait P99",
            "transfer / step",
        ],
        rows,
        left=2,
    )


def phases_html(analysis: Analysis) -> str:
    """Per serving phase (prefill / decode / mixed / idle) the step figures kept apart; empty without phases."""
    ph = phase_table(analysis.steps)
    if ph.is_empty():
        return ""
    rows = [
        [
            r["phase"],
            r["n_steps"],
            fmt_ns(r["step_time_p50_ns"]),
            fmt_ns(r["step_time_max_ns"]),
            fmt_ns(r["compute_p50_ns"]),
            fmt_ns(r["comm_p50_ns"]),
            fmt_ns(r["exposed_comm_p50_ns"]),
            fmt_pct(r["busy_share_p50"]),
        ]
        for r in ph.iter_rows(named=True)
    ]
    head = ["phase", "steps", "step P50", "max", "compute P50", "comm P50", "exposed P50", "busy P50"]
    return (
        '<p class="note">Serving iterations by phase (a prefill and a decode are different EP workloads):</p>'
        + table_html(head, rows, left=1)
    )


def imbalance_table(analysis: Analysis) -> str:
    """I_e, I_r (P50 and max over steps) and the local ratio per layer (empty string without routing data)."""
    imb = analysis.imbalance
    if imb.height == 0:
        return ""
    agg = (
        imb.group_by("layer")
        .agg(
            pl.col("I_e").median().alias("ie50"),
            pl.col("I_e").max().alias("iemax"),
            pl.col("I_r").median().alias("ir50"),
            pl.col("I_r").max().alias("irmax"),
            pl.col("local_ratio").median().alias("local"),
        )
        .sort("layer")
    )
    rows = [
        [
            r["layer"],
            fmt_ratio(r["ie50"]),
            fmt_ratio(r["iemax"]),
            fmt_ratio(r["ir50"]),
            fmt_ratio(r["irmax"]),
            fmt_pct(r["local"]),
        ]
        for r in agg.iter_rows(named=True)
    ]
    return table_html(["layer", "I_e P50", "I_e max", "I_r P50", "I_r max", "local ratio"], rows)


def stragglers_html(analysis: Analysis, top: int = 10) -> str:
    """The ``top`` ranks by wait induced on the others, with how often they arrived last."""
    sg = analysis.stragglers
    if sg.height == 0:
        return '<p class="note">No matched collectives, so no straggler ranking.</p>'
    sg = sg.sort("induced_wait_ns", "times_last", descending=True).head(top)
    rows = [[r["rank"], r["times_last"], fmt_ns(r["induced_wait_ns"])] for r in sg.iter_rows(named=True)]
    return "<h3>Straggler ranking</h3>" + table_html(["rank", "times last", "wait induced on others (total)"], rows)


def _all_cpu(analysis: Analysis) -> bool:
    rs = analysis.rank_summary
    return rs.height > 0 and "mode" in rs.columns and bool((rs["mode"] == "cpu").all())


def host_stalls_html(analysis: Analysis, top: int = 15) -> str:
    """The ``top`` longest host stalls and the rank with the most stall time."""
    hs = analysis.host_stalls
    cpu = _all_cpu(analysis)
    # CPU-only (gloo) runs have no device: the idle resource is the compute thread
    idle = "compute thread idle" if cpu else "device idle"
    if hs.height == 0:
        what = "the compute thread idle" if cpu else "the device idle"
        return f'<p class="note">No host stalls found (nothing left {what} while the host blocks inside a stage).</p>'
    tot = hs.group_by("rank").agg(pl.col("stall_ns").sum()).sort("stall_ns", descending=True)
    worst = hs.sort("stall_ns", descending=True).head(top)
    rows = [
        [r["rank"], r["step"], r["layer"], r["stage"], r["name"], fmt_ns(r["stall_ns"])]
        for r in worst.iter_rows(named=True)
    ]
    head = f'<p class="note">{hs.height} stalls; most on rank {tot["rank"][0]} ({fmt_ns(tot["stall_ns"][0])} total). Longest {min(top, hs.height)}:</p>'
    return head + table_html(["rank", "step", "layer", "stage", "blocking call", idle], rows, left=5)


def alpha_beta_table(analysis: Analysis) -> str:
    """α (µs), β (GB/s), r² and verdict per link class (empty string without a fit)."""
    ab = analysis.alpha_beta
    if ab.height == 0:
        return ""
    rows = [
        [
            r["link_class"],
            "–" if is_missing(r["alpha_us"]) else f"{r['alpha_us']:.1f} µs",
            "–" if is_missing(r["beta_gbps"]) else f"{r['beta_gbps']:.2f} GB/s",
            "–" if is_missing(r["r2"]) else f"{r['r2']:.3f}",
            r["n"],
            str(r["verdict"]).replace("_", " ")
            if comm_figures.alpha_beta_conclusive(r) or r["verdict"] == "insufficient_data"
            else f"inconclusive (r² < {comm_figures.MIN_FIT_R2})",
        ]
        for r in ab.iter_rows(named=True)
    ]
    return table_html(["link class", "α (latency)", "β (bandwidth)", "r²", "calls", "verdict"], rows, left=1)


def hta_overlap_html(analysis: Analysis) -> str:
    """``--hta-compatible``: HTA's overlap figure beside ep-trace's own, per rank."""
    ho = analysis.hta_overlap
    if ho is None or ho.height == 0:
        return ""
    ours = dict(analysis.rank_summary.select("rank", "overlap_efficiency").iter_rows())
    rows = [
        [
            r["rank"],
            f"{r['comp_comm_overlap_pctg']:.1f}%" if r.get("comp_comm_overlap_pctg") is not None else "–",
            fmt_pct(ours.get(r["rank"])),
        ]
        for r in ho.sort("rank").iter_rows(named=True)
    ]
    return (
        "<h3>HTA-compatible overlap (--hta-compatible)</h3>"
        '<p class="note">HTA counts the share of communication kernel time overlapped by compute kernels, with its own '
        "name-based classification and step filter; ep-trace's overlap efficiency is |C ∩ K| / |C|.</p>"
        + table_html(["rank", "HTA comp/comm overlap", "ep-trace overlap efficiency"], rows)
    )


def _misaligned_html(analysis: Analysis) -> str:
    mis = analysis.misaligned
    if mis is None or mis.height == 0:
        return ""
    rows = [
        [r.get("pg_name"), r.get("step"), r.get("calls_per_rank"), r.get("reason")]
        for r in mis.head(30).iter_rows(named=True)
    ]
    return (
        "<h3>Collectives not matched across ranks</h3>"
        '<p class="note">These calls are left out of every wait figure rather than paired wrongly.</p>'
        + table_html(["process group", "step", "calls per rank", "reason"], rows, left=4)
    )


def routing_coverage_html(analysis: Analysis) -> str:
    """The caveat above the routing figures when they count the routing of some ranks only."""
    lack = routing_missing_ranks(analysis.tables)
    if not lack:
        return ""
    n = analysis.tables.ranks.height
    return (
        f'<p class="note"><b>Partial routing</b>: these figures count the routing of {n - len(lack)} of {n} ranks; '
        f"{esc(ranks_phrase(lack))} no sidecar routing records (see the load report).</p>"
    )


def load_report_html(analysis: Analysis, notes: Sequence[str]) -> str:
    """What was read, skipped or guessed: inputs, ranks, split checks, clock alignment, plus ``notes``."""
    parts = [f"<p>Stage detection method: <b>{esc(analysis.detection_method)}</b>.</p>"]
    issues = list(analysis.load_report) or list(analysis.tables.load_report)
    if issues:
        rows = [[i.level, i.rank if i.rank is not None else "–", i.file, i.message] for i in issues]
        parts.append(
            "<h3>Skipped or flagged inputs</h3>" + table_html(["level", "rank", "file", "what happened"], rows, left=4)
        )
    else:
        parts.append('<p class="note">Every input file was read without caveats.</p>')
    rk = analysis.tables.ranks
    if rk.height:
        shown = rk.sort("rank").head(64)
        rows = [
            [
                r["rank"],
                r["host"] or "–",
                r["format"],
                r["rank_source"],
                "yes" if r["has_sidecar"] else "no",
                r["source_file"],
            ]
            for r in shown.iter_rows(named=True)
        ]
        more = f'<p class="note">{rk.height - 64} more ranks not listed.</p>' if rk.height > 64 else ""
        parts.append(
            "<h3>Ranks read</h3>"
            + table_html(["rank", "host", "format", "rank from", "sidecar", "file"], rows, left=6)
            + more
        )
    coll = analysis.tables.collectives
    if coll.height and "splits_truncated" in coll.columns:
        n_tr = int(coll["splits_truncated"].sum())
        if n_tr:
            parts.append(
                f"<p>{n_tr} collective calls have split lists truncated by Kineto (beyond 30 ranks) and no sidecar: "
                "their count-matrix rows are missing.</p>"
            )
    if analysis.split_violations.height:
        parts.append(
            f"<p><b>{analysis.split_violations.height} split inconsistencies</b>: a rank's send split differs from its "
            "peer's receive split.</p>"
        )
        sv = analysis.split_violations.head(20)
        parts.append(table_html(["step", "call", "src", "dst", "sent", "received"], [list(r) for r in sv.iter_rows()]))
    ck = analysis.clock
    if ck.height:
        worst = ck["residual_ns"].max()
        parts.append(
            f"<p>Clock alignment: {ck.height} host(s); residual uncertainty of wait figures up to {fmt_ns(worst)}.</p>"
        )
        rows = [
            [r["host"], fmt_ns(r["offset_ns"], signed=True), fmt_ns(r["residual_ns"])]
            for r in ck.head(64).iter_rows(named=True)
        ]
        parts.append(table_html(["host", "offset applied", "residual"], rows))
    parts.append(_misaligned_html(analysis))
    all_notes = list(analysis.notes) + list(notes)
    if all_notes:
        parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in all_notes) + "</ul>")
    return "".join(parts)


def definitions_html() -> str:
    """The :data:`METRIC_DEFINITIONS` as a definition list."""
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in METRIC_DEFINITIONS) + "</dl>"


def top_html(analysis: Analysis, which: str) -> str:
    """The top kernels (``which="kernels"``) or CPU ops (``"ops"``) by time per rank per step."""
    frame = analysis.top_kernels if which == "kernels" else analysis.top_ops
    t = breakdown_figures.top_table(frame, analysis)
    what = "kernels (CPU ranks: compute ops and comm ranges)" if which == "kernels" else "CPU ops (inclusive time)"
    if t.height == 0:
        return f'<p class="note">No {esc(what)} in the analysed steps.</p>'
    rows = [
        [
            r["name"],
            r["stage"] or "–",
            fmt_ns(r["per_rank_step_ns"]),
            f"{r['count_per_step']:.3g}",
            f"r{r['max_rank']} ({fmt_ns(r['max_rank_ns'])})",
        ]
        for r in t.iter_rows(named=True)
    ]
    title = "Top kernels" if which == "kernels" else "Top CPU ops"
    return (
        f'<h3 class="figtitle">{title} by time</h3><p class="note">Top {t.height} {esc(what)}: time per rank per step '
        "(mean over ranks), calls per rank per step, the stage they were launched in, and the rank where they cost most.</p>"
        + table_html(["name", "stage", "time / rank / step", "calls / step", "worst rank (per step)"], rows, left=2)
    )

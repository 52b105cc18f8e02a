"""The HTML report: one self-contained, offline file rendered from an :class:`Analysis`.

plotly.js is embedded once in ``<head>`` (``plotly.offline.get_plotlyjs()``, no CDN) and every
figure is a ``fig.to_html(full_html=False, include_plotlyjs=False)`` fragment. Section order is
fixed (verdict first); see :func:`render_report`. Nothing here reads a trace format.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.reports import breakdown_figures, digest, figures
from ep_trace.reports.evidence import Evidence, finding_evidence
from ep_trace.reports.units import fmt_ns, fmt_pct, fmt_ratio, is_missing
from ep_trace.reports.whatif_table import WHATIF_HEADERS, whatif_rows

log = logging.getLogger(__name__)

__all__ = [
    "Section",
    "plotly_bundle",
    "CARTESIAN_TRACES",
    "render_report",
    "page",
    "table_html",
    "figure_html",
    "METRIC_DEFINITIONS",
]


@dataclass(frozen=True)
class Section:
    """An extra section appended before the definitions (e.g. the HTA cross-check).

    Attributes:
        anchor: HTML id.
        title: Heading.
        body_html: Trusted HTML body (built with :func:`table_html` / :func:`figure_html`).
    """

    anchor: str
    title: str
    body_html: str


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

_CSS = """
*{box-sizing:border-box}
html,body{max-width:100%;overflow-x:hidden}
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1400px;margin:0 auto;padding:12px clamp(8px,2.5vw,24px) 48px}
h1{font-size:20px;margin:6px 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3.figtitle{font-size:15px;margin:14px 0 2px;font-weight:600}
.sub{color:#666;font-size:13px;overflow-wrap:anywhere}.note{color:#555;font-size:13px;margin:4px 0 8px}
.caption{color:#444;font-size:12.5px;margin:2px 0 12px;font-style:italic}
.verdict{border-left:6px solid #999;background:#fff;padding:12px 16px;margin:10px 0;box-shadow:0 1px 2px #0001}
.verdict.high{border-color:#B2182B}.verdict.medium{border-color:#E69F00}.verdict.low{border-color:#DDCC77}.verdict.none{border-color:#117733}
.verdict .headline{font-size:20px;font-weight:600;overflow-wrap:anywhere}.verdict .detail{margin-top:6px}.verdict .context{margin-top:6px;color:#555;font-size:13px}
.tbl{max-width:100%;overflow-x:auto;-webkit-overflow-scrolling:touch;margin:6px 0}
table{border-collapse:collapse;font-size:13px;background:#fff}th,td{border:1px solid #e3e3e3;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f0f0f0}td.l,th.l{text-align:left}td.wide{min-width:16em}.sev-high{color:#B2182B;font-weight:600}.sev-medium{color:#A86B00;font-weight:600}
nav{display:flex;flex-wrap:wrap;gap:4px 12px;margin:6px 0}nav a{font-size:13px}
.fig{background:#fff;margin:4px 0;box-shadow:0 1px 2px #0001;max-width:100%;overflow:hidden}
.pair{display:flex;flex-wrap:wrap;gap:12px}.pair>div{flex:1 1 520px;min-width:0;max-width:100%}
dl dt{font-weight:600;margin-top:8px}dl dd{margin-left:16px}
"""


_L = ' class="l"'


def _e(x: object) -> str:
    return "–" if x is None else html.escape(str(x))


def table_html(
    headers: Sequence[str], rows: Sequence[Sequence[object]], left: int | Sequence[int] = 1, cls: str = ""
) -> str:
    """A plain HTML table. Cells are escaped.

    Args:
        headers: Column headings.
        rows: Cell values (``str()`` is applied).
        left: Left-aligned (text) columns: the first ``left`` columns, or the given column indices.
        cls: CSS class of the table.

    Wrapped in a ``div.tbl`` that scrolls sideways on narrow screens (the page itself never does).
    """
    lefts = set(range(left)) if isinstance(left, int) else set(left)
    th = "".join(f"<th{_L if i in lefts else ''}>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{_L if i in lefts else ''}>{_e(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows
    )
    table = f"<table{f' class={cls!r}' if cls else ''}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="tbl">{table}</div>'


def figure_html(fig: go.Figure | None, div_id: str, missing: str, caption: str = "") -> str:
    """A figure placeholder plus its JSON spec, or the ``missing`` sentence when ``fig`` is None.

    The figure is drawn by the page's renderer script (see :func:`page`), one figure per browser
    task, so the verdict and the first figures show while the rest are still being drawn. The
    plotly title becomes an HTML heading above the plot, and the plot keeps an empty top margin,
    so plotly's toolbar (top right) never covers a title or a legend (legends sit below the plot).

    Args:
        fig: The figure, or None.
        div_id: HTML id of the plot.
        missing: The sentence shown instead of an empty figure.
        caption: One line under the figure explaining its notation.
    """
    if fig is None:
        return f'<p class="note">{_e(missing)}</p>'
    fig = go.Figure(fig)  # a copy: the caller's figure keeps its title
    title = fig.layout.title.text if fig.layout.title and fig.layout.title.text else ""
    fig.update_layout(title_text=None, margin={"t": 34})
    height = fig.layout.height or 400
    # "</" inside a <script> block would end it early; JSON allows the escaped form "<\/".
    spec = fig.to_json().replace("</", "<\\/")
    head = f'<h3 class="figtitle">{_e(title)}</h3>' if title else ""
    cap = f'<p class="caption">{_e(caption)}</p>' if caption else ""
    return (
        f'{head}<div class="fig"><div id="{div_id}" class="plotly-graph-div ep-fig" style="height:{height}px;width:100%"></div>'
        f'<script type="application/json" id="{div_id}-spec">{spec}</script></div>{cap}'
    )


#: Draws every ``div.ep-fig`` in document order, one per task (setTimeout) so the browser paints in
#: between; marks ``ep-plotly-ready`` / ``ep-first-figure`` / ``ep-all-figures`` (performance API)
#: and sets ``body[data-figures-rendered]`` when done (the browser test waits on it). plotly.js
#: comes as inert text (``script type="text/plain"``): it is compiled only after the first frame
#: with the verdict has been painted (requestAnimationFrame, then a task), so the verdict never
#: waits for the 4.8 MB bundle, whatever the HTML parser does.
_RENDERER = """
(function () {
  var figs = Array.prototype.slice.call(document.querySelectorAll("div.ep-fig"));
  var config = {displaylogo: false, responsive: true};
  function draw(i) {
    if (i >= figs.length) {
      performance.mark("ep-all-figures");
      document.body.setAttribute("data-figures-rendered", String(figs.length));
      return;
    }
    var div = figs[i];
    var t0 = performance.now();
    var spec = JSON.parse(document.getElementById(div.id + "-spec").textContent);
    Plotly.newPlot(div, spec.data, spec.layout, config).then(function () {
      performance.measure(div.id, {start: t0, end: performance.now()});
      if (i === 0) { performance.mark("ep-first-figure"); }
      setTimeout(function () { draw(i + 1); }, 0);
    });
  }
  function start() {
    var src = document.getElementById("ep-plotly-src");
    (0, eval)(src.textContent);  // global scope, as a classic <script> would run it
    src.textContent = "";
    performance.mark("ep-plotly-ready");
    draw(0);
  }
  requestAnimationFrame(function () { setTimeout(start, 0); });
})();
"""


def _evidence_cell(ev: Evidence) -> str:
    """HTML: link to the report section, and where the window is in the annotated trace."""
    link = f'<a href="#{ev.section}">{_e(ev.section)} section</a>'
    if ev.rank is None or ev.start_ns is None or ev.end_ns is None:
        return link
    since = f" at {ev.since_trace_start_ms:.3f} ms" if ev.since_trace_start_ms is not None else ""
    return (
        f"{link}<br>trace: <code>rank{ev.rank}.ep-annotated.json.gz</code>, step {ev.step}{since} "
        f"(+{fmt_ns(ev.end_ns - ev.start_ns)}); in Perfetto search <code>{ev.fid}</code>"
    )


def _findings_html(analysis: Analysis, mean_step: float | None) -> str:
    evidence = finding_evidence(analysis)
    if not evidence:
        return '<p class="note">No findings.</p>'
    head = ["id", "severity", "finding", "saving / step", "of mean step", "remedy", "ranks", "layers", "evidence"]
    th = "".join(f"<th{_L if i in (0, 1, 2, 5, 8) else ''}>{_e(h)}</th>" for i, h in enumerate(head))
    rows = []
    for ev in evidence:
        f = ev.finding
        share = fmt_pct(f.est_saving_ns / mean_step) if mean_step else "–"
        sev = f' class="l sev-{_e(f.severity)}"' if f.severity in ("high", "medium") else _L
        rows.append(
            f'<tr id="finding-{ev.fid}"><td{_L}>{ev.fid}</td><td{sev}>{_e(f.severity)}</td>'
            f'<td class="l wide">{_e(f.title)}</td><td>{_e(fmt_ns(f.est_saving_ns))}</td><td>{_e(share)}</td>'
            f'<td class="l wide">{_e(f.remedy)}</td><td>{_e(", ".join(map(str, f.ranks)) or "all")}</td>'
            f'<td>{_e(", ".join(map(str, f.layers)) or "all")}</td><td class="l wide">{_evidence_cell(ev)}</td></tr>'
        )
    note = (
        '<p class="note">Evidence: the report section with the numbers, and the time window in the annotated '
        "trace (<code>ep-trace annotate DIR -o OUT</code>; open the file in ui.perfetto.dev and type the id, "
        'e.g. F1, in the search box: the slice on the "ep-trace findings" track marks the window; see docs/annotate.md).</p>'
    )
    return f'<div class="tbl"><table><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>' + note


def _whatif_html(analysis: Analysis) -> str:
    rows = whatif_rows(analysis)
    if not rows:
        return ""
    return (
        '<h3 id="whatif">Simulated what-ifs</h3><p class="note">Each row edits the step graph and replays it '
        "(the measured step is replayed first, so the rows compare like with like). The savings overlap: the "
        "<code>all</code> row is what every fix at once would give.</p>"
        + table_html(WHATIF_HEADERS, rows, left=(0, 1, 5))
    )


def _rank_table_html(analysis: Analysis, max_rows: int = 64) -> str:
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


def _imbalance_table(analysis: Analysis) -> str:
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


def _stragglers_html(analysis: Analysis, top: int = 10) -> str:
    sg = analysis.stragglers
    if sg.height == 0:
        return '<p class="note">No matched collectives, so no straggler ranking.</p>'
    sg = sg.sort("induced_wait_ns", "times_last", descending=True).head(top)
    rows = [[r["rank"], r["times_last"], fmt_ns(r["induced_wait_ns"])] for r in sg.iter_rows(named=True)]
    return "<h3>Straggler ranking</h3>" + table_html(["rank", "times last", "wait induced on others (total)"], rows)


def _all_cpu(analysis: Analysis) -> bool:
    rs = analysis.rank_summary
    return rs.height > 0 and "mode" in rs.columns and bool((rs["mode"] == "cpu").all())


def _host_stalls_html(analysis: Analysis, top: int = 15) -> str:
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


def _alpha_beta_table(analysis: Analysis) -> str:
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
            if figures.alpha_beta_conclusive(r) or r["verdict"] == "insufficient_data"
            else f"inconclusive (r² < {figures.MIN_FIT_R2})",
        ]
        for r in ab.iter_rows(named=True)
    ]
    return table_html(["link class", "α (latency)", "β (bandwidth)", "r²", "calls", "verdict"], rows, left=1)


def _hta_overlap_html(analysis: Analysis) -> str:
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


def _load_report_html(analysis: Analysis, notes: Sequence[str]) -> str:
    parts = [f"<p>Stage detection method: <b>{_e(analysis.detection_method)}</b>.</p>"]
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
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in all_notes) + "</ul>")
    return "".join(parts)


def _definitions_html() -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in METRIC_DEFINITIONS) + "</dl>"


def _top_html(analysis: Analysis, which: str) -> str:
    frame = analysis.top_kernels if which == "kernels" else analysis.top_ops
    t = breakdown_figures.top_table(frame, analysis)
    what = "kernels (CPU ranks: compute ops and comm ranges)" if which == "kernels" else "CPU ops (inclusive time)"
    if t.height == 0:
        return f'<p class="note">No {_e(what)} in the analysed steps.</p>'
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
        f'<h3 class="figtitle">{title} by time</h3><p class="note">Top {t.height} {_e(what)}: time per rank per step '
        "(mean over ranks), calls per rank per step, the stage they were launched in, and the rank where they cost most.</p>"
        + table_html(["name", "stage", "time / rank / step", "calls / step", "worst rank (per step)"], rows, left=2)
    )


_BREAKDOWN_CAPTION = (
    "compute = compute alone (K \\ C); overlapped comm = communication hidden under compute (C ∩ K); barrier wait = "
    "inside a collective waiting for the last peer (W \\ K); exposed comm = transfer nothing hides (C \\ (K ∪ W)); "
    "host stall = device idle while the host blocks; idle = nothing measured runs. C, K, W = union of the rank's "
    "comm, compute and wait intervals; the six parts add up to the step (docs/metrics.md)."
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
    "wait_matrix": "M[i][j] = total time rank i waited for rank j inside collectives (j arrived last).",
    "alpha_beta": "α–β model: T = α + B/β per call, α = fixed latency per call (µs), β = bandwidth (GB/s), B = bytes. "
    f"The fitted line is drawn only when it explains the scatter (r² ≥ {figures.MIN_FIT_R2}); else the fit is inconclusive.",
}


_CARTESIAN = Path(__file__).with_name("plotly-cartesian.min.js")
#: Trace types the report draws; all are in plotly.js' "cartesian" partial bundle.
CARTESIAN_TRACES = frozenset({"bar", "scatter", "heatmap", "box", "histogram", "histogram2d", "contour"})


@lru_cache(maxsize=1)
def plotly_bundle() -> str:
    """plotly.js for the page: the "cartesian" partial bundle (bar, scatter, heatmap, … 1.5 MB,
    vendored from npm ``plotly.js-cartesian-dist-min``, MIT, ``reports/plotly-cartesian.LICENSE.txt``)
    when its version is the one plotly.py writes figures for, else plotly.py's full 4.8 MB bundle.
    The partial bundle compiles ~3x faster, which is most of the time to the first figure."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if _CARTESIAN.exists():
        text = _CARTESIAN.read_text(encoding="utf-8")
        m = re.search(r"plotly\.js \(cartesian - minified\) v(\d+\.\d+\.\d+)", text[:400])
        if m and m.group(1) == get_plotlyjs_version():
            return text
        log.debug(
            "plotly-cartesian.min.js is v%s, plotly.py wants %s: full bundle", m and m.group(1), get_plotlyjs_version()
        )
    return get_plotlyjs()


def page(title: str, body: str, subtitle: str = "", lead: str = "") -> str:
    """Wrap ``body`` into a complete offline HTML document with plotly.js embedded once.

    ``lead`` (the verdict) comes right under the title, before the subtitle and the navigation.
    plotly.js (about 4.8 MB) sits at the end of ``<body>`` as inert text, compiled by the renderer
    script after the verdict has painted; the renderer then draws the figures.
    """
    sub = f'<div class="sub">{_e(subtitle)}</div>' if subtitle else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
        f"<body><main><h1>{_e(title)}</h1>{lead}{sub}{body}</main>"
        f'<script type="text/plain" id="ep-plotly-src">{plotly_bundle()}</script>'
        f'<script type="text/javascript">{_RENDERER}</script></body></html>'
    )


def render_report(
    analysis: Analysis,
    title: str = "ep-trace report",
    sources: Sequence[str] = (),
    extra_sections: Sequence[Section] = (),
    progress: Callable[[str, int, int], None] | None = None,
) -> str:
    """Render the full report page.

    Order: verdict (first under the title) + findings with their evidence; where the time goes
    (per-rank breakdown beside the stage breakdown, top kernels and CPU ops); timeline of one step
    (with the critical path when the analysis has one); routing (count matrix, expert load, I_e / I_r
    per layer); overlap; barrier wait (per rank, wait matrix, stragglers, per-rank step-time table);
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
    sel = figures.timeline_selection(analysis)
    notes: list[str] = []
    steps_total = 9
    tick = (lambda i: progress("render", i, steps_total)) if progress else (lambda i: None)

    sections: list[tuple[str, str, str]] = []
    verdict_html = (
        f'<div class="verdict {_e(v.severity)}" id="verdict"><div class="headline" elementtiming="verdict">{_e(v.headline)}</div>'
        f'<div class="detail">{_e(v.detail)}</div><div class="context">{_e(v.context)}</div></div>'
    )
    sections.append(
        ("findings", "Findings and their evidence", _findings_html(analysis, ss.mean_ns) + _whatif_html(analysis))
    )
    tick(1)
    sentence = breakdown_figures.breakdown_sentence(analysis)
    left = (f'<p class="note">{_e(sentence)}</p>' if sentence else "") + figure_html(
        breakdown_figures.time_breakdown(analysis),
        "fig-breakdown",
        "No step windows, so no per-rank breakdown.",
        _BREAKDOWN_CAPTION,
    )
    right = '<div id="stages"></div>' + figure_html(
        figures.stage_breakdown(analysis),
        "fig-stages",
        "No EP stages detected: the trace has no ep-trace stage ranges and no preset matched, so there is no stage breakdown.",
        "Busy = device time of the stage; window = first start to last end. A window much longer than busy time is idle "
        "or waiting.",
    )
    tops = f'<div class="pair"><div>{_top_html(analysis, "kernels")}</div><div>{_top_html(analysis, "ops")}</div></div>'
    sections.append(
        ("breakdown", "Where the time goes", f'<div class="pair"><div>{left}</div><div>{right}</div></div>{tops}')
    )
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
            + figure_html(figures.step_timeline(analysis, sel), "fig-timeline", "No intervals to draw for this step."),
        )
    )
    tick(3)
    no_routing = "No routing data: the traces carry neither an ep-trace sidecar nor all-to-all split sizes, so expert load and the count matrix are unknown."
    if analysis.count_matrix.height or analysis.expert_load.height:
        n_r = figures.n_ranks(analysis)
        if n_r > 64:
            notes.append(f"Count matrix: {n_r} ranks binned into groups of {-(-n_r // 64)}.")
        routing = (
            figure_html(
                figures.count_matrix_heatmap(analysis),
                "fig-count-matrix",
                "No count matrix (no split sizes recorded).",
                _CAPTIONS["count"],
            )
            + figure_html(
                figures.expert_load_bars(analysis),
                "fig-expert-load",
                "No per-expert counts (no ep-trace sidecar routing records).",
                _CAPTIONS["expert_load"],
            )
            + figure_html(
                figures.imbalance_per_layer(analysis), "fig-imbalance", "No imbalance figures.", _CAPTIONS["imbalance"]
            )
            + _imbalance_table(analysis)
        )
    else:
        routing = f'<p class="note">{_e(no_routing)}</p>'
    sections.append(("routing", "Routing: count matrix and expert load", routing))
    tick(4)
    ov_sentence = figures.overlap_sentence(analysis)
    if ov_sentence is not None:
        overlap = f'<p class="note"><b>{_e(ov_sentence)}</b></p><p class="caption">{_e(_CAPTIONS["overlap"])}</p>'
    else:
        overlap = figure_html(
            figures.overlap_per_rank(analysis),
            "fig-overlap-rank",
            "No communication intervals found.",
            _CAPTIONS["overlap"],
        ) + figure_html(
            figures.overlap_per_stage(analysis),
            "fig-overlap-stage",
            "No EP stage carries communication, so there is no per-stage overlap.",
        )
    sections.append(("overlap", "Overlap: how much communication is hidden", overlap + _hta_overlap_html(analysis)))
    tick(5)
    sections.append(
        (
            "wait",
            "Barrier wait and stragglers",
            figure_html(
                figures.barrier_wait_per_rank(analysis),
                "fig-wait-rank",
                "No matched collectives, so no barrier wait.",
                _CAPTIONS["wait"],
            )
            + figure_html(
                figures.wait_matrix_heatmap(analysis),
                "fig-wait-matrix",
                "Nobody waited: the wait matrix is all zero.",
                _CAPTIONS["wait_matrix"],
            )
            + _stragglers_html(analysis)
            + "<h3>Per-rank step time and communication</h3>"
            + _rank_table_html(analysis),
        )
    )
    tick(6)
    sections.append(
        (
            "alphabeta",
            "Message size and bandwidth (α–β fit)",
            figure_html(
                figures.alpha_beta_scatter(analysis),
                "fig-alpha-beta",
                "No matched calls with known bytes, so no α–β fit.",
                _CAPTIONS["alpha_beta"],
            )
            + _alpha_beta_table(analysis),
        )
    )
    sections.append(("stalls", "Host stalls", _host_stalls_html(analysis)))
    tick(7)
    sections.append(("load", "Load report: what was read, skipped, guessed", _load_report_html(analysis, notes)))
    for sec in extra_sections:
        sections.append((sec.anchor, sec.title, sec.body_html))
    sections.append(("definitions", "Metric definitions", _definitions_html()))
    tick(8)
    nav = "<nav>" + "".join(f'<a href="#{a}">{_e(t.split(":")[0])}</a>' for a, t, _ in sections) + "</nav>"
    body = nav + "".join(f'<section id="{a}"><h2>{_e(t)}</h2>{b}</section>' for a, t, b in sections)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = (f"{', '.join(sources)} · " if sources else "") + f"generated {stamp}"
    out = page(title, body, subtitle, lead=verdict_html)
    tick(9)
    return out

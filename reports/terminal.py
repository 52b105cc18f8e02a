"""The short terminal summary of ``ep-trace analyze``: rich renderables (the CLI prints them)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ep_trace.analysis.rank_coverage import coverage_notes
from ep_trace.analysis.result import Analysis
from ep_trace.reports import digest
from ep_trace.reports.coverage_section import coverage_lines
from ep_trace.reports.placement_section import invariants_line
from ep_trace.reports.units import fmt_ns, fmt_pct
from ep_trace.reports.whatif_table import check_notes, slower_notes, whatif_rows

__all__ = ["summary_renderables"]

_STYLE = {"high": "bold red", "medium": "bold yellow", "low": "yellow", "none": "green"}


def summary_renderables(analysis: Analysis, max_findings: int = 5, max_ranks: int = 16) -> list[RenderableType]:
    """Verdict panel, top findings with savings, and the per-rank table (slowest ranks first beyond ``max_ranks``).

    Args:
        analysis: The analysis.
        max_findings: Findings listed.
        max_ranks: Ranks listed; with more ranks the ones with the longest max step are kept.

    Returns:
        Renderables for ``rich.console.Console.print``.
    """
    v = digest.verdict(analysis)
    ss = digest.step_stats(analysis)
    head = Group(Text(v.headline, style=_STYLE.get(v.severity, "")), Text(v.detail), Text(v.context, style="dim"))
    out: list[RenderableType] = []
    inv, bad = invariants_line(analysis)
    if inv:  # before any performance figure: a silent mis-routing is worse than a slow layer
        out.append(Text(inv, style="bold red" if bad else "green"))
    out.append(Panel(head, title="verdict", title_align="left", border_style=_STYLE.get(v.severity, "")))
    out += [Text(text, style=style) for text, style in coverage_lines(analysis)]
    found = digest.ranked_findings(analysis)
    if found:
        t = Table(title="top findings", title_justify="left", show_edge=False)
        t.add_column("severity")
        t.add_column("finding", overflow="fold")
        t.add_column("saving/step", justify="right")
        t.add_column("of mean step", justify="right")
        for f in found[:max_findings]:
            t.add_row(
                Text(f.severity, style=_STYLE.get(f.severity, "")),
                Text(f.title),  # a Text, not a str: a trace name holding "[/]" is no rich markup
                fmt_ns(f.est_saving_ns),
                fmt_pct(f.est_saving_ns / ss.mean_ns) if ss.mean_ns else "–",
            )
        out.append(t)
    out += [Text(line, style="yellow") for line in digest.withheld_lines(analysis)]
    wrows = whatif_rows(analysis)
    if wrows:
        t = Table(
            title="simulated what-ifs (savings overlap: 'all' is every fix at once)",
            title_justify="left",
            show_edge=False,
        )
        # the scenario name is what a user types into --whatif / searches the docs for: never cut it
        # ("chunked_pipel…" in an 80-column terminal); the rank list folds instead
        t.add_column("what-if", no_wrap=True, min_width=max(len(r[0]) for r in wrows))
        for c in ("predicted step", "saving/step", "of replayed step"):
            t.add_column(c, justify="right")
        t.add_column("ranks", overflow="fold")
        for r in wrows:
            t.add_row(r[0], r[2], r[3], r[4], r[5])
        out.append(t)
        out += [Text(line) for line in slower_notes(analysis)]  # the table has no "what it changes" column
        out += [Text(line, style="dim") for line in check_notes(analysis)]
    rt = digest.rank_table(analysis)
    if rt.height:
        title = "per rank: step time over steps; exposed comm and barrier wait as mean per step"
        if rt.height > max_ranks:
            rt = rt.sort("step_max_ns", descending=True, nulls_last=True).head(max_ranks).sort("rank")
            title += f"; {max_ranks} slowest of {digest.rank_table(analysis).height} ranks"
        t = Table(title=title, title_justify="left", show_edge=False)
        for c in ("rank", "step P50", "P99", "max", "exposed comm", "overlap", "wait"):
            t.add_column(c, justify="right")
        for r in rt.iter_rows(named=True):
            t.add_row(
                str(r["rank"]),
                fmt_ns(r["step_p50_ns"]),
                fmt_ns(r["step_p99_ns"]),
                fmt_ns(r["step_max_ns"]),
                fmt_ns(r["exposed_comm_ns"]),
                fmt_pct(r["overlap_efficiency"]),
                fmt_ns(r["barrier_wait_ns"]),
            )
        out.append(t)
    out.extend(_assumed_ranks(analysis))
    out.extend(Text(n, style="yellow") for n in coverage_notes(analysis.tables))  # ranks the figures leave out
    return out


#: rank_source values that are a guess, not evidence read from the trace (parsers/nsys_ranks.py)
_GUESSED = {"assumed": "no rank evidence", "default": "no rank evidence", "process_order": "process order"}


def _assumed_ranks(analysis: Analysis) -> list[RenderableType]:
    """One line naming the ranks whose number was assumed, so nobody reads them as measured."""
    rk = analysis.tables.ranks
    if "rank_source" not in rk.columns:
        return []
    g = rk.filter(rk["rank_source"].is_in(list(_GUESSED)))
    if g.height == 0:
        return []
    items = ", ".join(
        f"rank {r} ({f}: {_GUESSED[s]})" for r, f, s in g.select("rank", "source_file", "rank_source").rows()
    )
    return [Text(f"ranks assumed, not read from the trace: {items}; pass --rank-map to set them", style="yellow")]

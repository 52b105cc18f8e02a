"""``--with-hta``: HTA's own temporal and idle-time breakdowns as a report section.

Computed by holistictraceanalysis (import name ``hta``, the ``ep-trace[hta]`` extra) on the same
Kineto files the analysis read (``analysis.tables.ranks.source_file``), not re-implemented, so a
reader can check ep-trace against a tool they already trust.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable
from pathlib import Path

import polars as pl

from ep_trace.analysis.result import Analysis
from ep_trace.errors import MissingDependencyError
from ep_trace.reports.html_page import Section, table_html

__all__ = ["HtaBreakdown", "hta_breakdown", "hta_section"]

log = logging.getLogger(__name__)

HtaBreakdown = tuple[pl.DataFrame, pl.DataFrame]


def _import_hta() -> type:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        raise MissingDependencyError(
            f"--with-hta: holistictraceanalysis is not installed ({exc.name or 'hta'} missing); "
            "install it with: pip install 'ep-trace[hta]'"
        ) from exc
    return TraceAnalysis


def hta_breakdown(analysis: Analysis) -> HtaBreakdown:
    """Run HTA's ``get_temporal_breakdown`` and ``get_idle_time_breakdown`` on the analysed Kineto files.

    Returns:
        ``(temporal, idle)`` polars frames exactly as HTA returns them (times in µs as HTA reports
        them; ``*_pctg`` in percent).

    Raises:
        MissingDependencyError: ``hta`` is not installed.
        NothingToAnalyzeError: none of the analysed ranks came from a Kineto file.
    """
    from ep_trace.errors import NothingToAnalyzeError

    trace_analysis = _import_hta()
    rk = analysis.tables.ranks.filter(pl.col("format") == "kineto")
    if rk.height == 0:
        raise NothingToAnalyzeError(
            "--with-hta: HTA reads Kineto traces only and none of the inputs is a Kineto trace; drop --with-hta"
        )
    # HTA joins relative paths onto its default trace_dir, so hand it absolute ones.
    files = {int(r): str(Path(f).resolve()) for r, f in rk.select("rank", "source_file").iter_rows()}
    hta_log = logging.getLogger("hta")
    old = hta_log.level
    # HTA 0.5.0 logs every parsed file at WARNING (also from its forked parser processes, which
    # inherit this level) and prints progress with print(); keep the library silent.
    hta_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ta = trace_analysis(trace_files=files)
            temporal = ta.get_temporal_breakdown(visualize=False)
            idle, _ = ta.get_idle_time_breakdown(ranks=sorted(files), visualize=False)  # HTA defaults to rank 0 only
    finally:
        hta_log.setLevel(old)
    return pl.from_pandas(temporal), pl.from_pandas(idle)


def hta_section(analysis: Analysis, progress: Callable[[str, int, int], None] | None = None) -> Section:
    """The report section with HTA's breakdowns; on an HTA failure the section says why (never a crash).

    Raises:
        MissingDependencyError: ``hta`` is not installed (the user asked for it explicitly).
    """
    if progress:
        progress("hta", 0, 1)
    try:
        temporal, idle = hta_breakdown(analysis)
    except MissingDependencyError:
        raise
    except Exception as exc:  # HTA's own limits (e.g. CPU-only traces) must not lose the whole report
        log.warning("HTA failed on these traces: %s", exc)
        body = f'<p class="note">HolisticTraceAnalysis could not analyse these traces: {type(exc).__name__}: {exc}</p>'
        return Section("hta", "HTA cross-check (HolisticTraceAnalysis)", body)
    if progress:
        progress("hta", 1, 1)
    parts = [
        '<p class="note">Computed by HolisticTraceAnalysis on the same Kineto files (its own GPU-kernel '
        "classification; times in µs as HTA reports them).</p>",
        "<h3>Temporal breakdown per rank</h3>",
    ]
    parts.append(table_html(temporal.columns, [list(r) for r in temporal.iter_rows()]))
    if idle.height:
        idle_tot = idle.group_by("rank", "idle_category").agg(pl.col("idle_time").sum()).sort("rank", "idle_category")
        piv = idle_tot.pivot(on="idle_category", index="rank", values="idle_time").fill_null(0).sort("rank")
        parts.append("<h3>Idle-time breakdown per rank (µs, summed over streams)</h3>")
        parts.append(table_html(piv.columns, [list(r) for r in piv.iter_rows()]))
    return Section("hta", "HTA cross-check (HolisticTraceAnalysis)", "".join(parts))

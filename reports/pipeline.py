"""Library entry point of ``ep-trace analyze`` and the demo: ingest + analyze + write the report."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import orjson

from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.result import Analysis
from ep_trace.errors import NothingToAnalyzeError, RankConflictError
from ep_trace.schema import TraceTables

__all__ = ["load_analysis", "build_report", "write_summary_json"]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


def _merge(parts: Sequence[TraceTables], paths: Sequence[Path]) -> TraceTables:
    """Merge the tables of several directories of one job (e.g. one directory per node)."""
    from ep_trace.parsers.dispatch import merge_tables

    if len(parts) == 1:
        return parts[0]
    seen: dict[int, Path] = {}
    for t, p in zip(parts, paths):
        for r in t.ranks["rank"].to_list():
            if r in seen:
                raise RankConflictError(f"{p}: rank {r} is also in {seen[r]}; pass directories of one job with disjoint ranks")
            seen[r] = p
    return merge_tables(list(parts))


def load_analysis(
    trace_dirs: Sequence[str | Path],
    config: AnalysisConfig = AnalysisConfig(),
    fmt: Literal["auto", "kineto", "nsys"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Progress | None = None,
) -> Analysis:
    """Ingest one or more trace directories (or files) of one job and analyze them.

    Args:
        trace_dirs: Directories (or single trace files); several = one job split over directories.
        config: Analysis knobs.
        fmt: Input format, ``'auto'`` detects it per file.
        on_error: ``'skip'`` keeps going past unreadable ranks (listed in the load report).
        progress: Optional callback ``progress(stage, done, total)``.

    Raises:
        NothingToAnalyzeError: the inputs hold no events (exit code 1).
        BadInputError: unreadable input (exit code 2).
    """
    from ep_trace.analysis import analyze
    # parsers/dispatch.py owns directory reading (ep_trace.parsers re-exports it).
    from ep_trace.parsers.dispatch import read_trace_dir

    paths = [Path(p) for p in trace_dirs]
    parts = [read_trace_dir(p, format=fmt, on_error=on_error, progress=progress) for p in paths]
    tables = _merge(parts, paths)
    if tables.events.height == 0:
        names = ", ".join(map(str, paths))
        raise NothingToAnalyzeError(f"{names}: no trace events found; point ep-trace at a directory of rank*.pt.trace.json.gz or *.sqlite files")
    return analyze(tables, config, progress=progress)


def write_summary_json(analysis: Analysis, path: str | Path) -> Path:
    """Write ``analysis.summary()`` (documented in docs/summary.md) as indented JSON; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(orjson.dumps(analysis.summary(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    return p


def build_report(
    trace_dirs: Sequence[str | Path] | str | Path,
    out_html: str | Path,
    json_path: str | Path | None = None,
    config: AnalysisConfig = AnalysisConfig(),
    fmt: Literal["auto", "kineto", "nsys"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Progress | None = None,
    with_hta: bool = False,
) -> Analysis:
    """Ingest + analyze + write the HTML report (and optionally the JSON summary).

    Args:
        trace_dirs: One trace directory, or several of one job.
        out_html: Where to write the self-contained HTML report.
        json_path: Where to write the JSON summary; ``None`` = not written.
        config: Analysis knobs.
        fmt: ``'auto' | 'kineto' | 'nsys'``.
        on_error: ``'raise'`` or ``'skip'`` unreadable ranks (they are named in the report).
        progress: Optional callback ``progress(stage, done, total)``.
        with_hta: Add HTA's temporal / idle-time breakdown section (needs the ``hta`` extra).

    Returns:
        The :class:`Analysis` shown in the report.
    """
    from ep_trace.reports.html import render_report

    dirs = [trace_dirs] if isinstance(trace_dirs, (str, Path)) else list(trace_dirs)
    analysis = load_analysis(dirs, config, fmt, on_error, progress)
    extra = []
    if with_hta:
        from ep_trace.reports.hta_section import hta_section

        extra.append(hta_section(analysis, progress))
    title = "ep-trace report: " + ", ".join(Path(d).name or str(d) for d in dirs)
    page = render_report(analysis, title=title, sources=[str(d) for d in dirs], extra_sections=extra, progress=progress)
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    log.info("wrote %s (%d bytes)", out, len(page))
    if json_path is not None:
        write_summary_json(analysis, json_path)
    return analysis

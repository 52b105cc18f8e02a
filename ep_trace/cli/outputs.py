"""The files the commands write: the HTML report and the JSON summary (only the CLI writes files)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal

import orjson

from ep_trace.analysis import Analysis, AnalysisConfig

__all__ = ["build_report", "write_json", "write_report"]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]
_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def write_json(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` as indented JSON (numpy values and non-string keys allowed); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(orjson.dumps(obj, option=_JSON_OPTIONS))
    return p


def write_report(
    analysis: Analysis,
    out_html: str | Path,
    json_path: str | Path | None = None,
    sources: Sequence[str | Path] = (),
    progress: Progress | None = None,
    with_hta: bool = False,
) -> Path:
    """Render ``analysis`` and write the self-contained HTML report (and the JSON summary).

    Args:
        analysis: What :func:`ep_trace.load` returned.
        out_html: Where to write the HTML page.
        json_path: Where to write ``analysis.summary()`` (docs/summary.md); ``None`` = not written.
        sources: The trace directories, named in the title and the load report.
        progress: Optional callback ``progress(stage, done, total)``.
        with_hta: Add HTA's temporal / idle-time breakdown section (needs the ``hta`` extra).
    """
    from ep_trace.reports.html import render_report

    extra = []
    if with_hta:
        from ep_trace.reports.hta_section import hta_section

        extra.append(hta_section(analysis, progress))
    title = "ep-trace report: " + ", ".join(Path(d).name or str(d) for d in sources)
    page = render_report(
        analysis, title=title, sources=[str(d) for d in sources], extra_sections=extra, progress=progress
    )
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    log.info("wrote %s (%d bytes)", out, len(page))
    if json_path is not None:
        write_json(analysis.summary(), json_path)
    return out


def build_report(
    trace_dirs: Sequence[str | Path] | str | Path,
    out_html: str | Path,
    json_path: str | Path | None = None,
    config: AnalysisConfig | None = None,
    fmt: Literal["auto", "kineto", "nsys"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Progress | None = None,
    with_hta: bool = False,
    jobs: int = 1,
    executor: Executor | None = None,
) -> Analysis:
    """:func:`ep_trace.load` then :func:`write_report`: what ``ep-trace analyze`` does; returns the analysis."""
    from ep_trace import load

    dirs = [trace_dirs] if isinstance(trace_dirs, (str, Path)) else list(trace_dirs)
    analysis = load(dirs, config, format=fmt, on_error=on_error, progress=progress, jobs=jobs, executor=executor)
    write_report(analysis, out_html, json_path, sources=dirs, progress=progress, with_hta=with_hta)
    return analysis

"""The files the commands write: the HTML report and the JSON summary (only the CLI writes files).

Every output is checked before any work (:func:`check_writable`: a directory, a missing or
read-only parent fails in a second, not after a ten-minute analysis) and written atomically
(:func:`write_atomic`: a temporary file in the same directory, ``fsync``, ``os.replace``), so an
interrupted or failed run leaves either the previous file or the complete new one, never half.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
import polars as pl

from ep_trace.analysis import Analysis, AnalysisConfig
from ep_trace.cli.output_guard import Output, check_name_lengths, check_outputs, check_writable, tmp_prefix
from ep_trace.cli.safe_text import CONTROL_PATTERN, printable, printable_expr
from ep_trace.errors import OutputError

if TYPE_CHECKING:
    from ep_trace.reports.annotate import OriginalTrace

__all__ = [
    "build_report",
    "check_name_lengths",
    "check_writable",
    "write_atomic",
    "write_json",
    "write_report",
    "write_yaml",
]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]
_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same directory and ``os.replace``.

    Readers (and an interrupted run) see the old file or the whole new one, never a prefix.

    Raises:
        OutputError: the directory is not writable or the disk is full (the temporary file is removed).
    """
    p = Path(path)
    tmp: str | None = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(p), suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise OutputError(f"{p}: cannot write ({exc.strerror or exc}); free space or choose another path") from None
    finally:
        if tmp is not None:  # failed or interrupted (KeyboardInterrupt) before the rename
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


#: Longest string shown in the report / summary (characters); longer ones keep their head and tail
#: around an ellipsis (the tail is kept: templated kernel names differ at the end). The Parquet
#: tables (``ep-trace ingest``) keep the full names.
DISPLAY_CHARS = 512


def _shorten(text: str, limit: int = DISPLAY_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = (limit * 2) // 3
    return f"{text[:head]}…{text[len(text) - (limit - head - 1) :]}"


def _shorten_frame(df: pl.DataFrame, limit: int, escape: bool) -> pl.DataFrame:
    cols = [c for c, t in df.schema.items() if t == pl.Utf8]
    if not cols or df.height == 0:
        return df
    longest = df.select(pl.col(c).str.len_bytes().max() for c in cols).row(0)
    # (bytes >= chars: a column whose values all fit in ``limit`` bytes has nothing to shorten)
    long_cols = [c for c, n in zip(cols, longest, strict=True) if n is not None and n > limit]
    head = (limit * 2) // 3
    tail = limit - head - 1
    fixes = []
    for c in long_cols:
        # each distinct long value shortened once, then mapped: the 2.5 M-row events table of 1,024
        # param DLRM ranks (a few long kernel names) is not rewritten row by row (101 -> 45 ms)
        long = df.lazy().select(c).filter(pl.col(c).str.len_bytes() > limit).unique().collect()
        short = pl.when(pl.col(c).str.len_chars() > limit).then(
            pl.col(c).str.head(head) + "…" + pl.col(c).str.tail(tail)
        )
        m = long.select(c, short.otherwise(pl.col(c)).alias("_short")).filter(pl.col("_short") != pl.col(c))
        if m.height:
            fixes.append(pl.col(c).replace(m[c], m["_short"]))
    if fixes:
        df = df.with_columns(fixes)
    if escape:
        bad = [c for c in cols if df.select(pl.col(c).str.contains(CONTROL_PATTERN).any()).item()]
        if bad:
            df = df.with_columns(printable_expr(c) for c in bad)
    return df


def _shorten_value(v: Any, limit: int, escape: bool = False) -> Any:
    if isinstance(v, str):
        v = _shorten(v, limit)
        return printable(v) if escape else v
    if isinstance(v, pl.DataFrame):
        return _shorten_frame(v, limit, escape)
    if isinstance(v, dict):
        return {_shorten_value(k, limit, escape): _shorten_value(x, limit, escape) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_shorten_value(x, limit, escape) for x in v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        changes = {f.name: _shorten_value(getattr(v, f.name), limit, escape) for f in dataclasses.fields(v) if f.init}
        return dataclasses.replace(v, **changes)
    return v


def for_display(analysis: Analysis, limit: int = DISPLAY_CHARS, escape_controls: bool = False) -> Analysis:
    """A copy of ``analysis`` whose strings (host and kernel names, file names in the load report,
    finding text) are at most ``limit`` characters, for the report and the summary: a 30 MB host
    name made a 99 MB report. Numbers are untouched (the analysis grouped by the full names).

    ``escape_controls`` (the terminal summary) also escapes control characters (``\\x1b``): a
    trace string must not drive the terminal. HTML and JSON escape them by themselves.
    """
    return _shorten_value(analysis, limit, escape_controls)  # type: ignore[no-any-return]


def display_safe(obj: Any) -> Any:
    """A copy of ``obj`` (an analysis result, a sweep, a dict / list / frame / dataclass of them) whose
    strings are shortened and control-escaped as for the terminal summary (:func:`for_display`)."""
    return _shorten_value(obj, DISPLAY_CHARS, True)


def write_annotated(
    analysis: Analysis,
    out_dir: str | Path,
    ranks: Sequence[int] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    originals: Mapping[int, OriginalTrace] | None = None,
) -> list[Path]:
    """Write ``rank{r}.ep-annotated.json.gz`` per rank into ``out_dir`` (each atomically); the paths."""
    from ep_trace.reports.annotate import annotated_traces

    out = Path(out_dir)
    return [
        write_atomic(out / name, data)
        for name, data in annotated_traces(analysis, ranks=ranks, progress=progress, originals=originals)
    ]


def write_json(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` as indented JSON (numpy values and non-string keys allowed), atomically."""
    return write_atomic(path, orjson.dumps(obj, option=_JSON_OPTIONS))


def write_yaml(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` (plain dicts / lists / scalars) as block-style YAML in key order, atomically."""
    import yaml

    text = yaml.safe_dump(obj, sort_keys=False, allow_unicode=True, width=120)
    return write_atomic(path, text.encode("utf-8"))


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

    analysis = for_display(analysis)
    extra = []
    if with_hta:
        from ep_trace.reports.hta_section import hta_section

        extra.append(hta_section(analysis, progress))
    title = "ep-trace report: " + ", ".join(Path(d).name or str(d) for d in sources)
    page = render_report(
        analysis, title=title, sources=[str(d) for d in sources], extra_sections=extra, progress=progress
    )
    summary = orjson.dumps(analysis.summary(), option=_JSON_OPTIONS) if json_path is not None else None
    out = write_atomic(out_html, page.encode("utf-8"))
    log.info("wrote %s (%d bytes)", out, len(page))
    if json_path is not None and summary is not None:
        write_atomic(json_path, summary)
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
    rank_map: Mapping[object, int] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
    cache: bool | Path = False,
) -> Analysis:
    """:func:`ep_trace.load` then :func:`write_report`: what ``ep-trace analyze`` does; returns the analysis.

    ``cache``: reuse / write the Parquet cache of each trace directory (``ep_trace.load(cache=...)``:
    True the default root, a path that root)."""
    from ep_trace import load

    dirs = [trace_dirs] if isinstance(trace_dirs, (str, Path)) else list(trace_dirs)
    check_outputs(
        dirs, Output("-o", Path(out_html)), Output("--json", Path(json_path)) if json_path is not None else None
    )
    analysis = load(
        dirs,
        config,
        format=fmt,
        on_error=on_error,
        progress=progress,
        rank_map=rank_map,
        jobs=jobs,
        executor=executor,
        cache=cache,
    )
    write_report(analysis, out_html, json_path, sources=dirs, progress=progress, with_hta=with_hta)
    return analysis

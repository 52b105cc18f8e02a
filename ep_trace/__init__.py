"""ep-trace: where the time of an expert-parallel MoE layer goes, on which rank, and why.

The four layers, each usable alone (docs/architecture.md):

* capture (needs torch): :class:`Tracer`, :func:`stage`, :func:`record_routing`, :func:`record_a2a`
  (``ep_trace.capture``);
* ingest (no torch): :func:`read_trace_dir` (``ep_trace.parsers``) -> :class:`TraceTables`;
* analyze (no torch): :func:`analyze` (``ep_trace.analysis``) -> :class:`Analysis`;
* present: ``ep_trace.reports`` renders an :class:`Analysis`; the ``ep-trace`` CLI writes files.

:func:`load` is the one way through ingest and analysis, used by the CLI, notebooks and tests.
Names are resolved lazily so that ``import ep_trace`` never imports torch (nor polars).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from ep_trace.analysis import Analysis, AnalysisConfig, analyze
    from ep_trace.capture import Tracer, record_a2a, record_routing, stage
    from ep_trace.errors import EpTraceError
    from ep_trace.parsers import read_trace_dir
    from ep_trace.schema import TraceTables

from ep_trace.parsers import allocator as _allocator

# Before any ep_trace module imports polars: jemalloc reads its options when polars loads.
_allocator.configure()

__version__ = "0.1.0"

_LAZY = {
    "Tracer": "ep_trace.capture",
    "stage": "ep_trace.capture",
    "record_routing": "ep_trace.capture",
    "record_a2a": "ep_trace.capture",
    "read_trace_dir": "ep_trace.parsers",
    "analyze": "ep_trace.analysis",
    "AnalysisConfig": "ep_trace.analysis",
    "Analysis": "ep_trace.analysis",
    "TraceTables": "ep_trace.schema",
    "EpTraceError": "ep_trace.errors",
}

__all__ = [
    "Analysis",
    "AnalysisConfig",
    "EpTraceError",
    "TraceTables",
    "Tracer",
    "__version__",
    "analyze",
    "load",
    "read_trace_dir",
    "record_a2a",
    "record_routing",
    "stage",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'ep_trace' has no attribute {name!r}")
    return getattr(import_module(mod), name)


def load(
    paths: str | Path | Sequence[str | Path],
    config: AnalysisConfig | None = None,
    *,
    format: Literal["auto", "kineto", "nsys"] = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Callable[[str, int, int], None] | None = None,
    rank_map: Mapping[object, int] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
    cache: bool | str | Path = False,
    routing: Sequence[str | Path] = (),
) -> Analysis:
    """Read the trace directories (or files) of one job and analyze them: ingest, then analysis.

    Args:
        paths: One trace directory or file, or several of one job (e.g. one per node; ranks disjoint).
        config: Analysis knobs (:class:`AnalysisConfig`; defaults when ``None``).
        format: Input format, ``'auto'`` detects it per file.
        on_error: ``'skip'`` keeps going past unreadable ranks (named in the load report).
        progress: Optional callback ``progress(stage, done, total)``.
        rank_map: ``{file name | path: rank}`` overriding the rank found in each file.
        jobs: Worker processes at most for reading the rank files (fewer when the files are too
            few or small to repay a worker's start-up; see ``ep_trace.parsers.engines``).
        executor: Read the rank files on this ``concurrent.futures.Executor`` instead (e.g.
            ``ep_trace.parsers.engines.RayExecutor()`` or a Dask ``Client.get_executor()``); the
            cross-rank analysis runs here. An ``ep-trace ingest`` output directory in ``paths`` is
            read back without parsing.
        cache: Keep the parsed tables of each trace directory in a Parquet cache and reuse them
            while its files are unchanged (``True``: ``$EP_TRACE_CACHE_DIR`` or
            ``~/.cache/ep-trace``; a path: that cache root). Re-analysing 1,024 small ranks then
            reads the Parquet tables (~3.8 CPU-s with the analysis) instead of parsing ~11 CPU-s of JSON. Off by default
            (the library writes no file unless asked); ``ep-trace analyze`` turns it on.
        routing: Frameworks' routing dumps (files or directories: Megatron-Core router traces, SGLang
            expert distribution records, vLLM EPLB state; ``ep_trace.parsers.routing_dumps``) whose
            per-(rank, expert) counts stand in for ranks without sidecar routing records.

    Returns:
        The frozen :class:`Analysis` (all times int64 ns).

    Raises:
        NothingToAnalyzeError: the inputs hold no events (exit code 1).
        BadInputError: unreadable input (exit code 2).
    """
    from ep_trace.analysis import AnalysisConfig, analyze
    from ep_trace.errors import NothingToAnalyzeError
    from ep_trace.parsers import read_trace_dirs

    dirs = [paths] if isinstance(paths, (str, Path)) else list(paths)
    reader = None
    if cache is not False:
        from functools import partial

        from ep_trace.parsers import default_cache_dir, load_trace_dir

        reader = partial(
            load_trace_dir,
            cache_dir=default_cache_dir() if cache is True else Path(cache),
            format=format,
            on_error=on_error,
            progress=progress,
            rank_map=rank_map,
            jobs=jobs,
            executor=executor,
        )
    tables = read_trace_dirs(dirs, format, on_error, progress, rank_map, jobs, executor, reader)
    if routing:
        from ep_trace.parsers.routing_dumps import with_routing_dumps

        tables = with_routing_dumps(tables, [Path(p) for p in routing])
    if tables.n_events() == 0:
        names = ", ".join(map(str, dirs))
        raise NothingToAnalyzeError(
            f"{names}: no trace events found; point ep-trace at a directory of rank*.pt.trace.json.gz or *.sqlite files"
        )
    return analyze(tables, config or AnalysisConfig(), progress=progress)

"""Trace directory -> one set of canonical tables: format detection, per-file dispatch, merge.

Formats, detected per entry of the directory (not recursive):

=====================================================  ==========================================
entry                                                  reader
=====================================================  ==========================================
``*.json``, ``*.json.gz`` (incl. ``*.pt.trace.json``)  :func:`ep_trace.parsers.kineto.read_kineto`
``*.sqlite``, ``*.nsys-rep``, an nsys parquetdir       ``ep_trace.parsers.nsys.read_nsys`` (lazy)
``*.ep-events.parquet``                                ``ep_trace.parsers.cupti.read_cupti`` (lazy)
``rank{r}.ep.jsonl``                                   sidecar, merged into rank r (any format)
=====================================================  ==========================================

Files are read one at a time (bounded memory). The merge rejects, naming the files
(:class:`~ep_trace.errors.RankConflictError`): one rank in two files, different world sizes,
backends, default process groups (``distributedInfo.pg_config``) or ``job_id`` (sidecar / ep-trace
trace header), and a rank outside its world size. With ``on_error="skip"`` a file that cannot be
read is left out and listed in ``load_report`` (level ``error``) instead of raising; conflicts still
raise, since they would mix jobs; so do sidecars of one job that disagree on the experts or their
placement (:mod:`ep_trace.parsers.rank_set`). Ranks of the world with no trace file, and ranks with
no sidecar when others have one, are named in ``load_report`` as warnings. Without any sidecar,
``routing_matrix`` is built from all_to_allv split lists (:mod:`ep_trace.parsers.routing_splits`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import polars as pl

from ep_trace import schema
from ep_trace.errors import (
    BadInputError,
    ConfigError,
    EpTraceError,
    NothingToAnalyzeError,
    RankConflictError,
    TraceFormatError,
)
from ep_trace.parsers import validate
from ep_trace.parsers.engines import choose_workers, local_executor
from ep_trace.parsers.kineto import rank_from_file_name
from ep_trace.parsers.parquet_read import is_ingest_dir, read_parquet
from ep_trace.parsers.rank_set import check_sidecar_agreement, coverage_issues, is_coverage_issue
from ep_trace.parsers.read_pool import (
    NOT_A_TRACE,
    BatchResult,
    BatchSpec,
    estimated_cpu_s,
    plan_batches,
    read_sidecar_checked,
    run_batches,
)

__all__ = [
    "Format",
    "FORMATS",
    "ReadRun",
    "check_format",
    "detect_format",
    "discover",
    "merge_tables",
    "read_batches",
    "read_trace_dir",
    "splits_routing",
]

log = logging.getLogger(__name__)

Format = Literal["auto", "kineto", "nsys", "cupti"]
FORMATS: tuple[str, ...] = ("auto", "kineto", "nsys", "cupti")


def check_format(fmt: str, allowed: tuple[str, ...] = FORMATS) -> str:
    """Validate a ``--format`` value against ``allowed``; returns it.

    Raises:
        ConfigError: naming the option and the allowed values.
    """
    if fmt not in allowed:
        raise ConfigError(f"--format: unknown format {fmt!r}; use {', '.join(allowed[:-1])} or {allowed[-1]}")
    return fmt


Progress = Callable[[str, int, int], None]

_SIDECAR_RE = re.compile(r"^rank(\d+)\.ep\.jsonl$")
#: The stage suffix of SGLang's per-stage traces (``<id>-TP-<t>-EXTEND.trace.json.gz``; the stage is a
#: ``ForwardMode`` name: python/sglang/srt/managers/scheduler_profiler_mixin.py, ``stop_profile(stage)``).
_SGLANG_STAGE_RE = re.compile(r"-(?:EXTEND|DECODE|MIXED|IDLE|PREFILL)(?=\.trace\.json)")
_NSYS_DIR_MARKERS = (
    "StringIds.parquet",
    "CUPTI_ACTIVITY_KIND_KERNEL.parquet",
    "META_DATA_EXPORT.parquet",
    "TARGET_INFO_SESSION_START_TIME.parquet",
)
_TABLES: tuple[schema.TableName, ...] = (
    "ranks",
    "events",
    "collectives",
    "routing_counts",
    "routing_matrix",
    "placement",
    "stages",
)


def detect_format(path: Path) -> str | None:
    """'kineto', 'nsys', 'cupti', 'sidecar' or None (not a trace input) for one directory entry."""
    name = path.name
    if name.startswith("."):
        return None
    if path.is_dir():
        return "nsys" if any((path / m).exists() for m in _NSYS_DIR_MARKERS) else None
    if _SIDECAR_RE.match(name):
        return "sidecar"
    if name.endswith((".json", ".json.gz")):
        return None if name in ("load_report.json", "manifest.json", "summary.json") else "kineto"
    if name.endswith((".sqlite", ".nsys-rep")):
        return "nsys"
    if name.endswith(".ep-events.parquet"):
        return "cupti"
    return None


def _format_by_name(name: str) -> str | None:
    if name.endswith((".json", ".json.gz")) and name not in ("load_report.json", "manifest.json", "summary.json"):
        return "kineto"
    if name.endswith(".sqlite"):
        return "nsys"
    if name.endswith(".ep-events.parquet"):
        return "cupti"
    return None


def _walk(root: Path) -> list[Path]:
    """Every entry under ``root``, depth first in name order; hidden entries and nsys parquet
    directories (inputs themselves) are not descended into."""
    out: list[Path] = []
    for e in sorted(root.iterdir()):
        if e.name.startswith("."):
            continue
        out.append(e)
        if e.is_dir() and detect_format(e) is None and _format_by_name(e.name) is None:
            out.extend(_walk(e))
    return out


def discover(path: str | Path, format: Format = "auto") -> tuple[list[tuple[Path, str]], dict[int, Path]]:
    """Trace inputs and sidecars of a directory tree (or a single file).

    Subdirectories are searched too: a TensorBoard log directory keeps its traces in
    ``plugins/profile/<run>/<host>.pt.trace.json.gz``, launchers write one folder per run or node.
    Files of no trace type (``README.md``, ``*.pb``) are left out here; JSON files that turn out not to
    be traces are skipped with a warning by :func:`read_trace_dir`.

    Returns:
        ``([(file, format), ...] in path order, {rank: sidecar path})``.

    Raises:
        TraceFormatError: the path does not exist, or is a file of no known trace format.
        NothingToAnalyzeError: the directory tree holds no input of the requested format.
        ConfigError: unknown ``format``.
    """
    check_format(format)
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(p, "no such file or directory", "check the path")
    single = p.is_file() or detect_format(p) == "nsys"
    entries = [p] if single else _walk(p)
    inputs = []
    for e in entries:
        fmt = detect_format(e)
        if fmt is None and e.is_dir() and not e.name.startswith("."):
            # a directory named like a trace file (rank3.pt.trace.json.gz/): an input that
            # read_one refuses, naming it, instead of a rank silently missing (issue 12)
            fmt = _format_by_name(e.name)
        if fmt in ("kineto", "nsys", "cupti") and format in ("auto", fmt):
            inputs.append((e, fmt))
    sidecars: dict[int, Path] = {}
    side_entries = (sorted(p.parent.iterdir()) if p.is_file() else []) if single else entries
    for e in side_entries:
        m = _SIDECAR_RE.match(e.name)
        if m:  # a directory of that name is refused by read_sidecar, naming it
            sidecars[int(m.group(1))] = e
    if not inputs:
        want = "trace files" if format == "auto" else f"{format} files"
        fix = "point at a directory of rank*.pt.trace.json[.gz], *.sqlite / *.nsys-rep or *.ep-events.parquet files"
        if p.is_dir():  # readable, but nothing in it to analyze (exit code 1, not bad input)
            raise NothingToAnalyzeError(f"{p}: no {want} found; {fix}")
        raise TraceFormatError(p, f"no {want} found", fix)
    return inputs, sidecars


def _check_job(parts: list[tuple[pl.DataFrame, object | None]], ranks: pl.DataFrame) -> None:
    """Reject duplicate ranks and mixed jobs, naming the files.

    ``parts``: each file's ranks rows and info; ``ranks``: those rows concatenated.
    """
    # a rank no evidence gave (nsys 'assumed', Kineto 'default'): never several files at rank 0
    assumed = ranks.filter(pl.col("rank_source").is_in(["assumed", "default"]))
    if assumed.height > 1:
        from ep_trace.parsers.nsys_ranks import LOOKED_FOR

        looked = []
        if (assumed["format"] == "nsys").any():
            looked.append(LOOKED_FOR)
        if (assumed["format"] != "nsys").any():
            looked.append("distributedInfo.rank and 'rank<N>' / 'worker<N>' in the file name (Kineto)")
        files = ", ".join(assumed["source_file"].to_list())
        raise RankConflictError(
            f"{assumed.height} files carry no rank ({files}); looked for: {'; '.join(looked)}; "
            "pass --rank-map R=PATH for each file (or --rank-map FILE)"
        )
    seen: dict[int, str] = {}
    for t, _ in parts:
        for r, f in t.select("rank", "source_file").iter_rows():
            if r in seen:
                da, db = Path(seen[r]).parent, Path(f).parent
                stages = {_SGLANG_STAGE_RE.sub("", Path(x).name) for x in (seen[r], f)}
                where = (
                    f"; they are in different folders ({da}, {db}): point at one run's folder"
                    if da != db
                    else (
                        "; SGLang's profile_by_stage writes one file per forward stage (-EXTEND, -DECODE): "
                        "analyse one stage per directory"
                        if len(stages) == 1 and _SGLANG_STAGE_RE.search(Path(f).name)
                        else "; keep one file per rank (or pass --rank-map)"
                    )
                )
                raise RankConflictError(f"rank {r} appears in two files: {seen[r]} and {f}{where}")
            seen[r] = f
    for col, what in (("world_size", "world sizes"), ("job_id", "job ids"), ("backend", "backends")):
        vals = (
            ranks.filter(pl.col(col).is_not_null())
            .group_by(col, maintain_order=True)
            .agg(pl.col("source_file").unique(maintain_order=True))
        )
        if vals.height > 1:
            groups = "; ".join(f"{v}: {', '.join(str(f) for f in fs)}" for v, fs in vals.iter_rows())
            raise RankConflictError(f"files from different jobs: {what} differ ({groups}); put one job per directory")
    bad = ranks.filter(pl.col("world_size").is_not_null() & (pl.col("rank") >= pl.col("world_size")))
    if bad.height:
        r = bad.row(0, named=True)
        raise RankConflictError(
            f"{r['source_file']}: rank {r['rank']} is outside world size {r['world_size']}; the file is from another job "
            "or its rank is wrong: pass --rank-map R=PATH to set its rank, or remove it"
        )
    pgs: dict[tuple[Any, ...], str] = {}
    for _, info in parts:
        pg = getattr(info, "default_pg", None)
        if pg is not None:
            pgs.setdefault(pg, str(getattr(info, "path", "?")))
    if len(pgs) > 1:
        (pa, fa), (pb, fb) = list(pgs.items())[:2]
        raise RankConflictError(
            f"files from different jobs: default process groups differ ({fa}: size {pa[0]}, {fb}: size {pb[0]}); put one job per directory"
        )


def merge_tables(
    parts: list[schema.TraceTables], extra_issues: tuple[schema.LoadIssue, ...] = ()
) -> schema.TraceTables:
    """Concatenate per-rank tables (already checked for conflicts) into one validated set."""
    if not parts:
        raise TraceFormatError("<inputs>", "no rank could be read", "see the load report for why each file was skipped")
    # parts whose events stay on disk (the ingest cache) are merged lazily: one scan over all of them,
    # the analysis then reads a block of ranks at a time as for one directory
    lazy = all(p.events_scan is not None for p in parts)
    names = [n for n in _TABLES if not (lazy and n == "events")]
    cat = {n: pl.concat([p.table(n) for p in parts], how="vertical") for n in names}
    cat["placement"] = cat["placement"].unique(maintain_order=True)
    cat["ranks"] = cat["ranks"].sort("rank")
    issues = tuple(i for p in parts for i in p.load_report) + extra_issues
    if not lazy:
        return schema.TraceTables(**cat, load_report=issues).validate("<merged>")  # type: ignore[arg-type]
    for n in names:  # (each part's events were validated as they were read)
        schema.validate(n, cat[n], "<merged>")  # type: ignore[arg-type]
    scan = pl.concat([p.scan_events() for p in parts], how="vertical")
    return schema.TraceTables(**cat, events=schema.empty("events"), events_scan=scan, load_report=issues)  # type: ignore[arg-type]


@dataclass
class ReadRun:
    """What :func:`read_batches` gathered: the batch results (tables when read in memory), the
    load-report issues in the order the serial reader gives them, and the ranks rows of every rank."""

    results: list[BatchResult]
    issues: tuple[schema.LoadIssue, ...]
    ranks: pl.DataFrame


def read_batches(
    path: str | Path,
    format: Format = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Progress | None = None,
    rank_map: Mapping[object, int] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
    out_dir: str | Path | None = None,
) -> ReadRun:
    """Decode every input of ``path`` in batches (:mod:`ep_trace.parsers.read_pool`) and check the job.

    ``out_dir`` given: each batch writes its Parquet partitions there and no tables come back.
    ``executor`` None and ``jobs > 1``: a local process pool of the size the work pays for
    (:func:`ep_trace.parsers.engines.choose_workers`).

    Raises:
        TraceFormatError, BadInputError, RankConflictError: as :func:`read_trace_dir`.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():  # a FIFO or a device given as the path: refused, never opened
        validate.check_input_path(p)
    try:
        inputs, sidecar_paths = discover(path, format)
    except OSError as exc:  # a directory without read permission, an I/O error while listing it
        raise validate.os_error(exc.filename or path, exc, "cannot list") from None
    own: Executor | None = None
    if executor is None and jobs > 1:
        workers = choose_workers(jobs, estimated_cpu_s(inputs), len(inputs))
        if workers > 1:
            own = executor = local_executor(workers)
        log.info("%s: %d files, %d worker process(es)", path, len(inputs), workers)
        batches = plan_batches(inputs, workers)
    else:
        workers = getattr(executor, "workers", None) or getattr(executor, "_max_workers", None) or 1
        # an engine may ask for one task per big file (RayExecutor.alone_bytes; None elsewhere)
        batches = plan_batches(
            inputs, workers if executor is not None else 1, alone_bytes=getattr(executor, "alone_bytes", None)
        )
    specs = [
        BatchSpec(
            index=i,
            files=tuple((str(inputs[j][0]), inputs[j][1]) for j in b),
            rank_map=dict(rank_map) if rank_map else None,
            sidecars={r: str(p) for r, p in sidecar_paths.items()},
            on_error=on_error,
            out_dir=None if out_dir is None else str(out_dir),
        )
        for i, b in enumerate(batches)
    ]
    named = p.is_file()
    results: list[BatchResult] = []
    not_traces: list[schema.LoadIssue] = []
    skipped: list[schema.LoadIssue] = []
    sc_errors: list[schema.LoadIssue] = []
    ranks_of: list[tuple[pl.DataFrame, object | None]] = []
    used: set[int] = set()
    try:
        for res in run_batches(specs, executor, in_flight=2 * workers, progress=progress, n_files=len(inputs)):
            for fr in res.files:
                err = fr.exception()
                if err is None:
                    ranks_of.append((fr.ranks, fr.info))  # type: ignore[arg-type]
                    continue
                if not named and isinstance(err, TraceFormatError) and str(err.problem).startswith(NOT_A_TRACE):
                    not_traces.append(
                        schema.LoadIssue(fr.path, None, "warning", f"skipped, not a trace file: {err.problem}")
                    )
                    log.warning("skipped %s: not a trace file", fr.path)
                    continue
                if on_error != "skip":
                    raise err
                skipped.append(
                    schema.LoadIssue(fr.path, rank_from_file_name(Path(fr.path).name), "error", f"skipped: {err}")
                )
                log.warning("skipped %s: %s", fr.path, err)
            sc_errors.extend(res.sidecar_issues)
            used.update(res.sidecar_ranks)
            results.append(res)
    finally:
        if own is not None:
            own.shutdown(wait=True, cancel_futures=True)
    warnings = []
    for r, sp in sidecar_paths.items():
        if r in used:
            continue
        try:  # read anyway: a broken sidecar is reported as before, even without its trace file
            read_sidecar_checked(sp, r)
        except EpTraceError as exc:
            if on_error != "skip":
                raise
            sc_errors.append(schema.LoadIssue(str(sp), r, "error", f"sidecar left out: {exc}"))
            log.warning("left out %s: %s", sp, exc)
            continue
        warnings.append(schema.LoadIssue(str(sp), r, "warning", f"sidecar of rank {r} has no trace file; ignored"))
    issues = [i for res in results for i in res.issues] + not_traces + skipped + sc_errors + warnings
    if not ranks_of:  # every file was skipped (on_error="skip"): nothing true can be said
        first = skipped[0].message.removeprefix("skipped: ") if skipped else "no readable trace"
        raise BadInputError(f"{path}: no readable trace file ({len(skipped)} skipped); the first: {first}")
    ranks = pl.concat([r for r, _ in ranks_of], how="diagonal_relaxed")
    _check_job(ranks_of, ranks)
    validate.check_job_clocks(ranks)
    check_sidecar_agreement([f for res in results for f in res.sidecar_facts])
    issues += coverage_issues(path, ranks, sidecar_paths)  # ranks of the world / with a sidecar not read
    return ReadRun(results, tuple(issues), ranks)


def splits_routing(parts: list[pl.DataFrame | None]) -> pl.DataFrame:
    """The routing matrix derived from all_to_allv splits, from per-batch pieces: the same rows, in
    the same order (by source rank, then call time), as one derivation over all ranks."""
    got = [p for p in parts if p is not None and p.height]
    if not got:
        return schema.empty("routing_matrix")
    rm = pl.concat(got).sort("src", maintain_order=True)
    return schema.validate("routing_matrix", schema.conform("routing_matrix", rm), "<splits>")


def read_trace_dir(
    path: str | Path,
    format: Format = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Progress | None = None,
    rank_map: Mapping[object, int] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
) -> schema.TraceTables:
    """Read every trace file of a directory (or one file) into one set of canonical tables.

    An ``ep-trace ingest`` output directory (``manifest.json`` + Parquet tables) is read back as it
    is (:func:`ep_trace.parsers.parquet_io.read_parquet`; the other options do not apply).

    Args:
        path: A trace directory or a single trace file (its directory's sidecars are used).
        format: ``auto`` (per file, by name) or only ``kineto`` / ``nsys`` / ``cupti`` files.
        on_error: ``raise`` on the first unreadable file, or ``skip`` it and list it in
            ``load_report`` (level ``error``).
        progress: Optional ``progress(stage, done, total)``; stage ``read`` counts files.
        rank_map: ``{file name | path: rank}`` overriding the rank found in each file (nsys: also
            ``{pid: rank}``).
        jobs: Worker processes at most (1 = here, one file after another); fewer are started when
            the files are too few or small to repay a worker's start-up (never slower than 1).
        executor: Run the batches there instead (``concurrent.futures.Executor``: a
            :class:`~ep_trace.parsers.engines.RayExecutor`, a Dask ``Client.get_executor()`` ...);
            ``jobs`` is then ignored.

    Returns:
        Validated :class:`~ep_trace.schema.TraceTables` of all ranks.

    Raises:
        TraceFormatError: a bad file (``on_error='raise'``), or nothing readable.
        RankConflictError: duplicate ranks or files of different jobs.
    """
    if is_ingest_dir(path):
        return read_parquet(path)
    run = read_batches(path, format, on_error, progress, rank_map, jobs, executor)
    parts = [r.tables for r in run.results if r.tables is not None]
    out = merge_tables(parts, run.issues)
    if out.routing_matrix.height == 0:
        out = replace(out, routing_matrix=splits_routing([r.splits_routing for r in run.results]))
    return out


def read_trace_dirs(
    paths: Sequence[str | Path],
    format: Format = "auto",
    on_error: Literal["raise", "skip"] = "raise",
    progress: Progress | None = None,
    rank_map: Mapping[object, int] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
    reader: Callable[[Path], schema.TraceTables] | None = None,
) -> schema.TraceTables:
    """Read several trace directories (or files) of one job, e.g. one directory per node.

    Each path is read with :func:`read_trace_dir` (or ``reader(path)``, e.g.
    :func:`ep_trace.parsers.parquet_io.load_trace_dir` with the other options bound: the ingest
    cache); the ranks of different paths must be disjoint.

    Raises:
        RankConflictError: a rank appears under two paths.
        TraceFormatError: as :func:`read_trace_dir`.
    """
    dirs = [Path(p) for p in paths]
    if reader is not None:
        parts = [reader(p) for p in dirs]
    else:
        parts = [read_trace_dir(p, format, on_error, progress, rank_map, jobs, executor) for p in dirs]
    if len(parts) == 1:
        return parts[0]
    seen: dict[int, Path] = {}
    for tables, p in zip(parts, dirs, strict=False):
        for r in tables.ranks["rank"].to_list():
            if r in seen:
                raise RankConflictError(
                    f"{p}: rank {r} is also in {seen[r]}; pass directories of one job with disjoint ranks"
                )
            seen[r] = p
    validate.check_job_clocks(pl.concat([t.ranks for t in parts]))
    out = merge_tables(parts)
    # coverage is a property of the whole job: each directory's own warnings are said again over the union
    kept = tuple(i for i in out.load_report if not is_coverage_issue(i))
    return replace(out, load_report=kept + tuple(coverage_issues(", ".join(map(str, dirs)), out.ranks)))

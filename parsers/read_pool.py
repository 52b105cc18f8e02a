"""Reading the files of a trace directory in batches, here or on an executor.

The rank files are cut into *batches* (:func:`plan_batches`): consecutive files of about
:data:`BATCH_BYTES` of estimated JSON, a big file alone. One batch is one task
(:func:`decode_batch`): read each file with its format's reader, merge its sidecars, concatenate
the batch's tables, derive its all_to_allv routing, and either return the tables (in-memory reads)
or write them as one Parquet partition per table under ``out_dir`` (``<table>/part-<i>.parquet``,
streaming ingest) and return only the small per-file results (ranks rows, job info, issues).
Batching is what keeps the per-task cost (a process hop, a pickle, seven Parquet files) from
growing with the number of small rank files.

Where a batch runs is the caller's choice: ``executor=None`` runs them one after another in this
process; any :class:`concurrent.futures.Executor` runs them there, e.g. a spawn
``ProcessPoolExecutor`` (:func:`ep_trace.parsers.engines.local_executor`, what ``jobs=N`` uses),
:class:`ep_trace.parsers.engines.RayExecutor`, or a Dask ``Client.get_executor()``. Errors come
back as values (exceptions pickle through their message only), in input order, so the caller
raises the first one or skips the files (``on_error``) exactly as in the serial case. As with any
spawn pool, a script that reads with ``jobs=N`` at import time needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.errors import EpTraceError, TraceFormatError
from ep_trace.parsers.input_guard import NOT_A_TRACE, guarded, rank_for
from ep_trace.parsers.kineto_files import read_kineto_files
from ep_trace.parsers.sidecar import Sidecar, merge_sidecar, read_sidecar
from ep_trace.parsers.sidecar_checks import check_sidecar, sidecar_facts

__all__ = [
    "BATCH_BYTES",
    "BatchSpec",
    "BatchResult",
    "FileResult",
    "decode_batch",
    "plan_batches",
    "read_kineto_files",
    "read_one",
    "run_batches",
    "split_by_rank",
]

log = logging.getLogger(__name__)

Result = tuple[schema.TraceTables, object | None]

#: Estimated JSON bytes per batch. Small rank files are grouped up to this much; a bigger file is a
#: batch of its own. 32 MB of JSON decodes in ~0.5 CPU-s and becomes ~30 MB of tables, so the
#: batch overhead stays < 5% and a worker holds at most ~2 batches.
BATCH_BYTES = 32 << 20
#: At most this many files per batch (bounds the batch's tables when files are tiny).
BATCH_FILES = 128
#: JSON bytes per byte of a ``.json.gz`` rank file (Kineto JSON compresses 10-18x; low = more batches).
_GZ_RATIO = 10
_TABLES = ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement", "stages")


def read_one(path: Path, fmt: str, rank_map: Mapping[object, int] | None) -> Result:
    """Read one input and validate its tables (:mod:`ep_trace.parsers.validate`).

    The path is checked before any byte is read (a FIFO, a device, a directory where a file is
    expected, a dangling link); any failure of the reader, an OS error or a decoder's own exception,
    comes out as one :class:`~ep_trace.errors.TraceFormatError` line, so ``on_error='skip'`` can
    leave the file out whatever the cause.

    Raises:
        TraceFormatError: the file cannot be read or fails validation.
    """
    from ep_trace.parsers import validate

    validate.check_input_path(path, expect_dir=fmt == "nsys" and path.is_dir())
    tables, info = guarded(path, lambda: _read(path, fmt, rank_map))
    return validate.validate_file(path, tables), info


def _read(path: Path, fmt: str, rank_map: Mapping[object, int] | None) -> Result:
    """The format's reader (Nsight and CUPTI readers imported lazily)."""
    rank = rank_for(path, rank_map)
    if fmt == "kineto":
        from ep_trace.parsers.kineto import read_kineto_file

        return read_kineto_file(path, rank)
    if fmt == "nsys":
        from ep_trace.parsers.nsys import read_nsys  # lazy: another format's reader

        return read_nsys(path, rank=rank, rank_map=rank_map), None
    from ep_trace.parsers.cupti import read_cupti  # lazy

    return read_cupti(path), None


def split_by_rank(t: schema.TraceTables) -> list[schema.TraceTables]:
    """One file's tables (an Nsight report may hold several ranks) as one set per rank."""
    ranks = t.ranks["rank"].to_list()
    if len(ranks) == 1:
        return [t]
    out = []
    for i, r in enumerate(ranks):
        sel = {name: t.table(name).filter(pl.col("rank") == r) for name in ("events", "collectives", "routing_counts")}
        out.append(
            schema.TraceTables(
                ranks=t.ranks.slice(i, 1),
                events=sel["events"],
                collectives=sel["collectives"],
                routing_counts=sel["routing_counts"],
                load_report=t.load_report if i == 0 else (),
            )
        )
    return out


@dataclass(frozen=True)
class BatchSpec:
    """One task: consecutive input files and what to do with their tables.

    Attributes:
        index: Batch number (its partition file is ``part-<index>.parquet``).
        files: ``(path, format)`` of each file, in input order.
        rank_map: As for ``read_trace_dir``.
        sidecars: ``{rank: sidecar path}`` of the whole directory (merged into the ranks read here).
        on_error: ``'raise'`` stops the batch at its first bad file; ``'skip'`` reads on.
        out_dir: Write the tables there (one partition per table) instead of returning them.
    """

    index: int
    files: tuple[tuple[str, str], ...]
    rank_map: Mapping[object, int] | None = None
    sidecars: Mapping[int, str] = field(default_factory=dict)
    on_error: str = "raise"
    out_dir: str | None = None


@dataclass
class FileResult:
    """What one input file gave: its ranks rows and job info, or the error (as constructor args)."""

    path: str
    ranks: pl.DataFrame | None = None
    info: object | None = None
    error: EpTraceError | None = None
    error_args: tuple[Any, ...] | None = None  # TraceFormatError(path, problem, fix, record)
    error_cls: type[TraceFormatError] = TraceFormatError  # or a subclass with that constructor

    def exception(self) -> EpTraceError | None:
        """The file's error, rebuilt (TraceFormatError pickles through its formatted message only)."""
        if self.error_args is not None:
            return self.error_cls(*self.error_args)
        return self.error


@dataclass
class BatchResult:
    """The outcome of :func:`decode_batch`.

    Attributes:
        index: The batch's number.
        files: One result per file read (a ``raise`` batch stops after the first error).
        issues: The read files' load reports.
        sidecar_issues: Sidecar errors of this batch (``skip``).
        sidecar_ranks: Ranks whose sidecar was merged here.
        sidecar_facts: ``(rank, sidecar path, facts)`` of each merged sidecar: what every sidecar of
            the job must agree on (:func:`ep_trace.parsers.sidecar_checks.sidecar_facts`).
        tables: The batch's merged tables (in-memory reads), else None.
        splits_routing: Routing derived from all_to_allv splits, used when no rank has a sidecar.
        rows: Rows per table written or returned.
    """

    index: int
    files: list[FileResult]
    issues: list[schema.LoadIssue]
    sidecar_issues: list[schema.LoadIssue]
    sidecar_ranks: list[int]
    tables: schema.TraceTables | None
    splits_routing: pl.DataFrame | None
    rows: dict[str, int]
    sidecar_facts: list[tuple[int, str, tuple[Any, ...]]] = field(default_factory=list)


def read_sidecar_checked(sp: Path, r: int) -> Sidecar:
    """Read one sidecar, refusing non-files and turning OS / decoder failures into the one-line error."""
    from ep_trace.parsers import validate

    validate.check_input_path(sp)
    try:
        sc = read_sidecar(sp)
    except EpTraceError:
        raise
    except OSError as exc:
        raise validate.os_error(sp, exc) from None
    except Exception as exc:  # noqa: BLE001 - the one-line contract
        raise validate.unexpected_error(sp, exc) from None
    if sc.rank is not None and sc.rank != r:
        raise TraceFormatError(
            sp, f"meta.rank is {sc.rank} but the file name says rank {r}", "rename the file or re-capture"
        )
    return sc


def _merge_sidecar_checked(t: schema.TraceTables, sc: Sidecar) -> schema.TraceTables:
    """:func:`merge_sidecar` after the identity check, with the merged rows range-checked (blamed on the sidecar)."""
    from ep_trace.parsers import validate

    validate.check_sidecar_identity(t, sc)
    check_sidecar(t, sc)  # consistency with itself and its trace, before any table is built from it
    try:
        out = merge_sidecar(t, sc)
    except EpTraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a field of the wrong type in some record
        raise validate.unexpected_error(sc.path, exc) from None
    validate.check_tables(sc.path, out)
    return out


def _read_file(
    path: Path, fmt: str, spec: BatchSpec, result: Result | None = None
) -> tuple[list[schema.TraceTables], FileResult, list[tuple[int, schema.LoadIssue | tuple[str, tuple[Any, ...]]]]]:
    """One file (or its already read ``result``): its per-rank tables with sidecars merged; per
    sidecar, its error (``skip``; else raised) or its path and facts."""
    tables, info = result if result is not None else read_one(path, fmt, spec.rank_map)
    out: list[schema.TraceTables] = []
    sc_issues: list[tuple[int, schema.LoadIssue | tuple[str, tuple[Any, ...]]]] = []
    for t in split_by_rank(tables):
        r = int(t.ranks["rank"][0])
        sp = spec.sidecars.get(r)
        if sp is not None:
            try:
                sc = read_sidecar_checked(Path(sp), r)
                t = _merge_sidecar_checked(t, sc)
            except EpTraceError as exc:
                if spec.on_error != "skip":
                    raise
                sc_issues.append((r, schema.LoadIssue(str(sp), r, "error", f"sidecar left out: {exc}")))
                log.warning("left out %s: %s", sp, exc)
            else:
                sc_issues.append((r, (str(sp), sidecar_facts(sc))))
        out.append(t)
    ranks = pl.concat([t.ranks for t in out]) if out else tables.ranks
    return out, FileResult(str(path), ranks=ranks, info=info), sc_issues


def _kineto_ahead(spec: BatchSpec) -> dict[int, Result | EpTraceError]:
    """Results of the batch's Kineto files read together (:func:`read_kineto_files`), by position
    in ``spec.files``; other formats are read one by one in :func:`decode_batch`."""
    idx = [i for i, (_, fmt) in enumerate(spec.files) if fmt == "kineto"]
    if len(idx) < 2:
        return {}
    got = read_kineto_files([Path(spec.files[i][0]) for i in idx], spec.rank_map, spec.on_error != "skip")
    return dict(zip(idx, got, strict=False))


def _concat(parts: list[schema.TraceTables]) -> dict[str, pl.DataFrame]:
    return {n: pl.concat([p.table(n) for p in parts], how="vertical") for n in _TABLES}  # type: ignore[arg-type]


def _with_kernel_collectives(parts: list[schema.TraceTables]) -> dict[str, pl.DataFrame]:
    """The parts' tables concatenated, with the EP / custom all-reduce kernel collectives
    (:func:`ep_trace.parsers.kernel_collectives.with_kernel_collectives`, per rank: ids are per rank).

    One call on the batch when each part is one rank of its own (it is keyed by rank), then each
    part's new calls moved back behind its own calls: the rows of a call per part, in part order.
    """
    from ep_trace.parsers.kernel_collectives import with_kernel_collectives

    ranks = [int(t.ranks["rank"][0]) if t.ranks.height == 1 else None for t in parts]
    if len(parts) < 2 or None in ranks or len(set(ranks)) != len(ranks):
        return _concat([with_kernel_collectives(t) for t in parts])
    cat = _concat(parts)
    n_before = cat["collectives"].height
    done = with_kernel_collectives(schema.TraceTables(**cat, load_report=()))  # type: ignore[arg-type]
    cat["events"] = done.events
    colls = done.collectives
    if colls.height > n_before:  # new rows were appended after all parts' rows: back to their part
        order = {r: i for i, r in enumerate(ranks)}
        part = pl.col("rank").replace_strict(order, return_dtype=pl.Int64)
        colls = colls.with_row_index("_row").sort(part, "_row").drop("_row")
    cat["collectives"] = colls
    return cat


def decode_batch(spec: BatchSpec) -> BatchResult:
    """Run one batch (in any process): see the module doc. Never raises for bad input."""
    from ep_trace.parsers.routing_splits import routing_from_splits
    from ep_trace.parsers.serving_steps import with_iteration_steps

    files: list[FileResult] = []
    parts: list[schema.TraceTables] = []
    sc_issues: list[schema.LoadIssue] = []
    used: list[int] = []
    facts: list[tuple[int, str, tuple[Any, ...]]] = []
    ahead = _kineto_ahead(spec)
    for i, (p, fmt) in enumerate(spec.files):
        try:
            got = ahead.pop(i, None)
            if isinstance(got, EpTraceError):
                raise got
            tabs, res, scs = _read_file(Path(p), fmt, spec, got)
        except TraceFormatError as exc:
            args = (exc.path, exc.problem, exc.fix, exc.record)
            files.append(FileResult(p, error_args=args, error_cls=type(exc)))
            if str(exc.problem).startswith(NOT_A_TRACE):  # a stray config JSON: the driver skips it, go on
                continue
        except EpTraceError as exc:
            files.append(FileResult(p, error=exc))
        else:
            files.append(res)
            parts.extend(tabs)
            for r, merged in scs:
                used.append(r)
                if isinstance(merged, schema.LoadIssue):
                    sc_issues.append(merged)
                else:
                    facts.append((r, merged[0], merged[1]))
            continue
        if spec.on_error != "skip":
            break
    issues = [i for t in parts for i in t.load_report]
    if not parts:
        return BatchResult(spec.index, files, issues, sc_issues, used, None, None, {}, facts)
    cat = _with_kernel_collectives(parts)
    del parts
    # serving traces have no ProfilerStep: their per-iteration annotations become the steps (before
    # the splits' routing, which takes each call's step from them)
    cat["events"] = with_iteration_steps(cat["events"])
    splits = None
    if cat["routing_matrix"].height == 0:  # else some rank has a sidecar and splits are not used
        splits = routing_from_splits(cat["collectives"], cat["events"])
    rows = {n: df.height for n, df in cat.items()}
    if spec.out_dir is None:
        tables = schema.TraceTables(**cat, load_report=())  # type: ignore[arg-type]
        return BatchResult(spec.index, files, issues, sc_issues, used, tables, splits, rows, facts)
    out = Path(spec.out_dir)
    for name, df in [*cat.items(), ("_splits", splits)]:
        if df is not None and df.height:
            d = out / name
            d.mkdir(parents=True, exist_ok=True)
            df.write_parquet(d / f"part-{spec.index:06d}.parquet", compression="zstd", statistics=True)
    return BatchResult(spec.index, files, issues, sc_issues, used, None, None, rows, facts)


def _json_bytes(path: Path) -> int:
    """Estimated decoded size of an input (drives batching only; an unreadable path counts 0 and is
    refused, naming it, by its reader's path check)."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        size = path.stat().st_size
    except OSError:
        return 0
    return size * _GZ_RATIO if path.name.endswith(".gz") else size


def plan_batches(
    inputs: list[tuple[Path, str]],
    workers: int = 1,
    batch_bytes: int | None = None,
    batch_files: int | None = None,
    alone_bytes: int | None = None,
) -> list[list[int]]:
    """Group input indices into batches of consecutive files.

    Args:
        inputs: ``(path, format)`` per file.
        workers: Tasks that will run at once; batches are made small enough that there are at least
            ~4 per worker (load balance), but never below one file.
        batch_bytes: Estimated JSON bytes per batch at most (a bigger file is alone); default
            :data:`BATCH_BYTES`.
        batch_files: Files per batch at most; default :data:`BATCH_FILES`.
        alone_bytes: A file of at least this many estimated JSON bytes is a batch of its own
            whatever ``batch_bytes`` (0: every file alone, one task per file); None: no such rule.

    Returns:
        Lists of indices into ``inputs``, in order, covering every file once.
    """
    sizes = [_json_bytes(p) for p, _ in inputs]
    batch_bytes = BATCH_BYTES if batch_bytes is None else batch_bytes
    batch_files = BATCH_FILES if batch_files is None else batch_files
    if workers > 1:
        batch_bytes = max(1, min(batch_bytes, sum(sizes) // (4 * workers)))
    batches: list[list[int]] = []
    cur: list[int] = []
    acc = 0
    for i, s in enumerate(sizes):
        if alone_bytes is not None and s >= alone_bytes:
            if cur:
                batches.append(cur)
                cur, acc = [], 0
            batches.append([i])
            continue
        if cur and (acc + s > batch_bytes or len(cur) >= batch_files):
            batches.append(cur)
            cur, acc = [], 0
        cur.append(i)
        acc += s
    if cur:
        batches.append(cur)
    return batches


#: Fixed CPU seconds per rank file once its batch is read in one plan (:mod:`ep_trace.parsers.kineto_batch`);
#: was 0.035 when every file ran its own ~200 small queries (benchmarks/README.md, rank scaling).
FILE_CPU_S = 0.005
#: Bytes of JSON read per CPU second (decode + tables), measured on the project machine.
JSON_BYTES_PER_CPU_S = 70e6


def estimated_cpu_s(inputs: list[tuple[Path, str]]) -> float:
    """Rough read CPU time of the inputs: :data:`FILE_CPU_S` per file plus
    :data:`JSON_BYTES_PER_CPU_S` (param DLRM ranks, 0.92 MB: 15 ms estimated, 15.7 ms measured);
    used to decide whether a pool pays."""
    return sum(FILE_CPU_S + _json_bytes(p) / JSON_BYTES_PER_CPU_S for p, _ in inputs)


def run_batches(
    specs: list[BatchSpec],
    executor: Executor | None = None,
    in_flight: int = 4,
    progress: Callable[[str, int, int], None] | None = None,
    n_files: int | None = None,
) -> Iterator[BatchResult]:
    """Yield the result of every batch, in order; at most ``in_flight`` submitted ahead (memory).

    Args:
        specs: The batches.
        executor: Where to run them (None: here, one after another).
        in_flight: Batches submitted but not yet consumed, at most.
        progress: ``progress('read', files done, files)``.
        n_files: Total files (for progress).
    """
    total = n_files if n_files is not None else sum(len(s.files) for s in specs)
    done = 0
    say = progress or (lambda *a: None)
    say("read", 0, total)
    if executor is None:
        for s in specs:
            res = decode_batch(s)
            done += len(s.files)
            say("read", done, total)
            yield res
        return
    pending: deque[Future[BatchResult]] = deque()
    todo = iter(specs)
    try:
        for s in todo:
            pending.append(executor.submit(decode_batch, s))
            if len(pending) >= in_flight:
                res = pending.popleft().result()
                done += len(specs[res.index].files) if res.index < len(specs) else 0
                say("read", done, total)
                yield res
        while pending:
            res = pending.popleft().result()
            done += len(specs[res.index].files) if res.index < len(specs) else 0
            say("read", done, total)
            yield res
    finally:
        # on an error: no task may outlive the read (an ingest task would still write partitions
        # into the output directory); cancel what has not started, wait for the rest
        wait([fut for fut in pending if not fut.cancel()])

"""Reading the files of a trace directory: one at a time, or in a bounded pool of processes.

``jobs=1`` (default) reads the files one after another in this process: peak memory is one file's
decode plus the tables already read. ``jobs=N`` reads up to N files at once in N spawned worker
processes (each holding one file at a time) and returns their tables to this process; decoding is
Python-bound (the GIL), so threads would not help. Results come back in input order, errors as
values so the caller decides between raising and skipping. As with any ``spawn`` pool, a script
that calls ``read_trace_dir(..., jobs=N)`` at import time needs an ``if __name__ == "__main__":``
guard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ep_trace import schema
from ep_trace.errors import EpTraceError, TraceFormatError

__all__ = ["read_one", "read_files"]

Result = tuple[schema.TraceTables, object | None]


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
    try:
        tables, info = _read(path, fmt, rank_map)
    except EpTraceError:
        raise
    except OSError as exc:
        raise validate.os_error(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - MemoryError, RecursionError included: the one-line contract
        raise validate.unexpected_error(path, exc) from None
    return validate.validate_file(path, tables), info


def _read(path: Path, fmt: str, rank_map: Mapping[object, int] | None) -> Result:
    """The format's reader (Nsight and CUPTI readers imported lazily)."""
    rank = None
    if rank_map:
        # the path as discovered, its absolute form (--rank-map R=PATH keys both), then the bare name
        for key in (str(path), str(path.resolve()), path, path.name):
            if key in rank_map:
                rank = int(rank_map[key])
                break
    if fmt == "kineto":
        from ep_trace.parsers.kineto import read_kineto_file

        return read_kineto_file(path, rank)
    if fmt == "nsys":
        from ep_trace.parsers.nsys import read_nsys  # lazy: another format's reader

        return read_nsys(path, rank=rank, rank_map=rank_map), None
    from ep_trace.parsers.cupti import read_cupti  # lazy

    return read_cupti(path), None


def _worker(path: str, fmt: str, rank_map: Mapping[object, int] | None) -> tuple[str, Any]:
    # TraceFormatError's constructor takes (path, problem, fix, record): rebuilt in the parent,
    # since exceptions pickle through their formatted message only.
    try:
        return "ok", read_one(Path(path), fmt, rank_map)
    except TraceFormatError as exc:
        return "tfe", (exc.path, exc.problem, exc.fix, exc.record)
    except EpTraceError as exc:
        return "err", exc


def read_files(
    inputs: list[tuple[Path, str]],
    rank_map: Mapping[object, int] | None,
    jobs: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
) -> Iterator[tuple[Path, Result | EpTraceError]]:
    """Yield ``(file, (tables, info))`` or ``(file, error)`` for every input, in input order."""
    n = len(inputs)
    if jobs <= 1 or n <= 1:
        for i, (f, fmt) in enumerate(inputs):
            if progress:
                progress("read", i, n)
            try:
                yield f, read_one(f, fmt, rank_map)
            except EpTraceError as exc:
                yield f, exc
        if progress:
            progress("read", n, n)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: polars' thread pool must not be forked mid-use.
    with ProcessPoolExecutor(max_workers=min(jobs, n), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_worker, str(f), fmt, dict(rank_map) if rank_map else None) for f, fmt in inputs]
        for i, ((f, _), fut) in enumerate(zip(inputs, futures, strict=False)):
            if progress:
                progress("read", i, n)
            kind, value = fut.result()
            yield f, (TraceFormatError(*value) if kind == "tfe" else value)
    if progress:
        progress("read", n, n)

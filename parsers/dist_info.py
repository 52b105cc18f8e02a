"""A Kineto trace's own account of its rank: ``distributedInfo`` and the ``ep_trace`` header, checked.

Part of the validation layer (:mod:`ep_trace.parsers.validate`), called by
:func:`ep_trace.parsers.kineto.decode_kineto_file` once the header is decoded. Before, a value of
the wrong type was dropped without a word (a world size given as the string ``"4"`` left the job
with no world size at all) and a rank's self-contradictions were analysed as if whole (issue 40).
Refused, naming the file, ``distributedInfo`` and the fix (``--keep-going`` leaves the file out):

* ``distributedInfo`` that is not an object; ``rank`` / ``world_size`` that are not integers
  (a bool or a string included), a world size below 1 (a negative rank is named by
  :func:`ep_trace.parsers.validate.check_tables`);
* ``rank >= world_size`` (unless ``--rank-map`` gives the file a rank inside the world);
* ``ep_trace.rank`` / ``ep_trace.world_size`` (written by ep-trace's Tracer, docs/sidecar.md)
  disagreeing with ``distributedInfo`` (unless ``--rank-map`` settles the rank);
* ``pg_config``: a process group listing a rank outside the world or more ranks than its
  ``pg_size``; the default group (``pg_desc`` ``default_pg`` / ``pg_name`` ``"0"``) not of the
  world's size, or, fully listed, without the file's own rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from ep_trace.errors import TraceFormatError

__all__ = ["check_distributed_info"]

_DAMAGED = "the trace header is damaged; re-export the trace (--keep-going skips it)"
_RANK_FIX = (
    "the file is from another job or its rank is wrong; pass --rank-map R=PATH to set its rank (--keep-going skips it)"
)
_PG_FIX = "the trace header is damaged or from another job; re-export the trace (--keep-going skips it)"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fail(path: Path, problem: str, fix: str, record: str = "distributedInfo") -> NoReturn:
    raise TraceFormatError(path, problem, fix, record=record)


def _typed(path: Path, info: dict[str, Any], key: str, lo: int | None) -> int | None:
    v = info.get(key)
    if v is None:
        return None
    if not _is_int(v):
        _fail(path, f"'{key}' is {str(v)[:40]!r} ({type(v).__name__}), not an integer", _DAMAGED)
    if lo is not None and v < lo:
        _fail(path, f"'{key}' is {v}; it must be at least {lo}", _DAMAGED)
    return int(v)


def check_distributed_info(path: Path, header: dict[str, Any], mapped_rank: int | None) -> None:
    """The checks of the module doc on one trace's header.

    Args:
        path: The trace file (named in the error).
        header: Its top-level keys but ``traceEvents``.
        mapped_rank: The rank ``--rank-map`` gives the file, or None.

    Raises:
        TraceFormatError: the first violation.
    """
    info = header.get("distributedInfo")
    if info is None:
        return
    if not isinstance(info, dict):
        _fail(path, f"'distributedInfo' is a {type(info).__name__}, not an object", _DAMAGED, record="header")
    rank = _typed(path, info, "rank", None)  # (a negative rank: validate.check_tables names it)
    ws = _typed(path, info, "world_size", 1)
    if ws is not None and rank is not None and rank >= ws and (mapped_rank is None or mapped_rank >= ws):
        _fail(path, f"'rank' {rank} is not below 'world_size' {ws}", _RANK_FIX)
    ep = header.get("ep_trace")
    if isinstance(ep, dict):
        er, ews = ep.get("rank"), ep.get("world_size")
        if mapped_rank is None and rank is not None and _is_int(er) and er != rank:
            _fail(
                path,
                f"'rank' {rank} disagrees with the ep_trace header's rank {er}",
                "one of them was edited, or the file comes from another rank: pass --rank-map R=PATH to say "
                "which rank it is (--keep-going skips it)",
            )
        if ws is not None and _is_int(ews) and ews != ws:
            _fail(path, f"'world_size' {ws} disagrees with the ep_trace header's world size {ews}", _PG_FIX)
    if ws is not None:
        _check_pgs(path, info.get("pg_config"), ws, mapped_rank if mapped_rank is not None else rank)


def _check_pgs(path: Path, pgs: object, ws: int, rank: int | None) -> None:
    """The process groups of ``pg_config`` against the world (see the module doc)."""
    from ep_trace.parsers.splits import parse_int_list

    if not isinstance(pgs, list):
        return
    for pg in pgs:
        if not isinstance(pg, dict):
            continue
        name = str(pg.get("pg_name"))[:40]
        raw = pg.get("pg_size")
        size = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
        parsed = parse_int_list(pg.get("ranks"))
        known = [v for v in parsed.values if v is not None] if parsed is not None else []
        default = pg.get("pg_desc") == "default_pg" or name == "0"
        if default and size is not None and size != ws:
            _fail(path, f"the default process group has {size} ranks but 'world_size' is {ws}", _PG_FIX)
        bad = next((v for v in known if v < 0 or v >= ws), None)
        if bad is not None:
            _fail(path, f"process group {name!r} of 'pg_config' lists rank {bad}, outside world size {ws}", _PG_FIX)
        if size is not None and (size < 1 or size > ws):
            _fail(path, f"process group {name!r} of 'pg_config' has pg_size {size}, outside [1, {ws}]", _PG_FIX)
        whole = parsed is not None and not parsed.truncated and bool(known)
        if whole and size is not None and len(known) > size:
            _fail(
                path, f"process group {name!r} of 'pg_config' lists {len(known)} ranks but pg_size is {size}", _PG_FIX
            )
        if default and whole and rank is not None and rank not in known:
            _fail(path, f"the default process group ({len(known)} ranks) does not hold the file's rank {rank}", _PG_FIX)

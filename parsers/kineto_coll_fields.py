"""Fields of one collective call from its launching evidence, computed once per distinct signature.

The fields of a call (type, group, sizes, splits, dtype; see :mod:`ep_trace.parsers.kineto_collectives`
for the order of trust) depend only on a few ``args`` values of its member ops, and most calls of a
trace repeat a handful of them (``gloo1_50mb``: 1,976 calls, 23 distinct signatures): the builder
computes them once per signature (:func:`call_signature`) and gathers them per call. ``Seq`` and
``Comms Id``, which change with every call, are read per call (:func:`per_call`).

The signature is the orjson text of exactly the keys :func:`fields_from` reads (``_META_KEYS`` ...;
``tests/parsers/test_kineto_coll_fields.py`` proves the lists complete by recording every key read).
orjson text tells ``1`` / ``1.0`` / ``true`` apart; the one collision it has, NaN and None both
written ``null`` (a NaN reaches here only through the stdlib-json fallback of
:mod:`ep_trace.parsers.kineto_json`), is avoided by not memoising any signature containing ``null``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ep_trace.errors import TraceFormatError
from ep_trace.parsers.collective_names import normalise_collective
from ep_trace.parsers.splits import itemsize, parse_int_list, prod

__all__ = [
    "FILE",
    "META_KEYS",
    "OP_KEYS",
    "CallRows",
    "call_signature",
    "dist_key",
    "fields_from",
    "per_call",
    "without_per_call",
]

#: Column of the events frame telling the files of a batch apart (0, 1, ... in input order).
FILE = "_file"

#: ``record_param_comms`` keys :func:`fields_from` reads, less the per-call ``Seq`` / ``Comms Id``.
META_KEYS = (
    "Collective name",
    "Process Group Name",
    "Process Group ID",
    "Process Group Description",
    "Process Group Ranks",
    "Group size",
    "Global rank start",
    "Global rank stride",
    "In split size",
    "Out split size",
    "In msg nelems",
    "In msg size",
    "Out msg nelems",
    "Out msg size",
    "dtype",
    "Dst Rank",
    "Src Rank",
)
#: Keys read from the dispatcher op / functional op / title args, by member kind.
OP_KEYS = {
    "c10d": ("Input Dims", "Input type", "Concrete Inputs"),
    "func": ("Concrete Inputs",),
    "title": ("Input Dims", "Input type"),
}
_C10D_KEYS, _FUNC_KEYS, _TITLE_KEYS = OP_KEYS["c10d"], OP_KEYS["func"], OP_KEYS["title"]
_PER_CALL = frozenset({"Seq", "Comms Id"})
_EMPTY: dict[str, Any] = {}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def call_signature(
    meta: dict[str, Any],
    names: tuple[str | None, str | None, str | None],
    c10d: dict[str, Any],
    func: dict[str, Any],
    title: dict[str, Any],
) -> tuple[Any, ...] | None:
    """Hashable key of everything :func:`fields_from` reads, or None when it must not be shared.

    Args:
        meta: The call's ``record_param_comms`` metadata (``{}`` if none).
        names: Names of its first c10d / functional / title member (None where absent).
        c10d: Kept args of the first c10d member (``{}`` where absent); ``func`` / ``title`` alike.
    """
    try:
        text = orjson.dumps(
            (
                {k: meta[k] for k in META_KEYS if k in meta} if meta else _EMPTY,
                {k: c10d[k] for k in _C10D_KEYS if k in c10d} if c10d else _EMPTY,
                {k: func[k] for k in _FUNC_KEYS if k in func} if func else _EMPTY,
                {k: title[k] for k in _TITLE_KEYS if k in title} if title else _EMPTY,
            )
        )
    except (orjson.JSONEncodeError, TypeError):  # an int beyond 64 bits (stdlib-json fallback): no sharing
        return None
    if b"null" in text:  # explicit null or NaN: both read as null, so not shared
        return None
    return (*names, bool(func), text)


def dist_key(dist: dict[str, Any], file: int) -> tuple[Any, ...]:
    """What :func:`fields_from` reads of a file's ``distributedInfo`` (``world_size``, ``pg_config``),
    hashable, so that the ranks of a batch share signatures; the file itself where it cannot be
    written exactly (see the module doc)."""
    try:
        text = orjson.dumps({k: dist[k] for k in ("world_size", "pg_config") if k in dist})
    except (orjson.JSONEncodeError, TypeError):
        return ("file", file)
    return ("file", file) if b"null" in text else ("dist", text)


def per_call(meta: dict[str, Any], event: int | None, source: str) -> tuple[int | None, int | None]:
    """``(seq, comms_id)`` of one call; ``Comms Id`` checked as :func:`fields_from` checks it."""
    comms_id = meta.get("Comms Id")
    if comms_id is not None and not (isinstance(comms_id, int) and 0 <= comms_id < 2**64):
        raise TraceFormatError(
            source,
            f"'Comms Id' {str(comms_id)[:30]} is not an unsigned 64-bit integer",
            "the trace is corrupt; re-export it",
            record=f"traceEvents[{event if event is not None else '?'}]",
        )
    return _int(meta.get("Seq")), comms_id


def without_per_call(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` less ``Seq`` / ``Comms Id`` (the shared fields must not carry one call's values)."""
    return {k: v for k, v in meta.items() if k not in _PER_CALL} if meta else meta


def _group_ranks(m: dict[str, Any], size: int | None, dist: dict[str, Any], pg_name: str | None) -> list[int] | None:
    parsed = parse_int_list(m.get("Process Group Ranks"), size)
    if parsed is not None and parsed.values and not parsed.truncated:
        return list(parsed.values)  # type: ignore[arg-type]
    start, stride = _int(m.get("Global rank start")), _int(m.get("Global rank stride"))
    if size and start is not None and stride:
        return [start + j * stride for j in range(size)]
    for pg in dist.get("pg_config") or []:
        if isinstance(pg, dict) and pg_name is not None and str(pg.get("pg_name")) == pg_name:
            full = parse_int_list(pg.get("ranks"))
            if full is not None and full.values and not full.truncated:
                return list(full.values)  # type: ignore[arg-type]
    return None


def _splits(v: Any, size: int | None) -> tuple[list[int | None] | None, bool]:
    parsed = parse_int_list(v, size)
    if parsed is None or not parsed.values:
        return None, False
    return list(parsed.values), parsed.truncated


def fields_from(
    meta: dict[str, Any],
    launcher: dict[str, Any] | None,
    by: dict[str, Any],
    kept: dict[int, dict[str, Any]],
    dist: dict[str, Any],
    world: int | None,
    source: str,
) -> dict[str, Any]:
    """Fields of one call (collectives columns) from its metadata and member ops.

    Args:
        meta: ``record_param_comms`` metadata (or a kernel's copy of it; ``{}`` if none).
        launcher: The launching op (``name``, ``event_id``), for error messages only.
        by: First member op per kind (``c10d`` / ``func`` / ``rpc`` / ``title``; dicts with
            ``name`` and ``event_id``) or None.
        kept: Kept args of the file, by event_id.
        dist: The file's ``distributedInfo``.
        world: Its world size, if known.
        source: File name for error messages.
    """
    ctype = "unknown"
    for cand in (
        meta.get("Collective name"),
        by.get("c10d") and by["c10d"]["name"],
        by.get("title") and by["title"]["name"],
        by.get("func") and by["func"]["name"],
    ):
        if cand and normalise_collective(cand) != "unknown":
            ctype = normalise_collective(cand)
            break
    pg_name = meta.get("Process Group Name")
    if pg_name is None and meta.get("Process Group ID") is not None:
        pg_name = str(meta["Process Group ID"])
    size = _int(meta.get("Group size"))
    in_splits, in_tr = _splits(meta.get("In split size"), size)
    out_splits, out_tr = _splits(meta.get("Out split size"), size)
    splits_source = "kineto" if (in_splits or out_splits) else None
    in_dims = out_dims = None
    dtype = meta.get("dtype")
    c10d_args = kept.get(by["c10d"]["event_id"], {}) if by.get("c10d") else {}
    func_args = kept.get(by["func"]["event_id"], {}) if by.get("func") else {}
    title_args = kept.get(by["title"]["event_id"], {}) if by.get("title") else {}
    dims = c10d_args.get("Input Dims") or []
    types = c10d_args.get("Input type") or []
    if by.get("c10d") and normalise_collective(by["c10d"]["name"]) == "all_to_all":
        ci = c10d_args.get("Concrete Inputs") or []
        if not in_splits and len(ci) > 4:  # (output, input, pg, output_split_sizes, input_split_sizes, ...)
            out_splits, out_tr = _splits(ci[3], size)
            in_splits, in_tr = _splits(ci[4], size)
            splits_source = "concrete_inputs" if (in_splits or out_splits) else None
        if len(dims) > 1:
            out_dims, in_dims = dims[0], dims[1]
        if dtype is None and len(types) > 1 and types[1]:
            dtype = types[1]
    if not in_splits and func_args:
        ci = func_args.get("Concrete Inputs") or []  # (input, output_split_sizes, input_split_sizes, group)
        if len(ci) > 2:
            out_splits, out_tr = _splits(ci[1], size)
            in_splits, in_tr = _splits(ci[2], size)
            splits_source = "concrete_inputs" if (in_splits or out_splits) else None
    for a in (c10d_args, title_args):
        d = a.get("Input Dims") or []
        if in_dims is None and d and prod(d[0]) is not None:
            in_dims = d[0]
            t = a.get("Input type") or []
            if dtype is None and t and t[0]:
                dtype = t[0]
    if ctype == "all_to_all" and (in_splits or out_splits):
        ctype = "all_to_allv"
    if size is None:
        size = len(in_splits) if in_splits and not in_tr else len(out_splits) if out_splits and not out_tr else None
    group_ranks = _group_ranks(meta, size, dist, pg_name)
    if group_ranks is None and size is not None and world is not None and size == world:
        group_ranks = list(range(world))  # the whole world: group-local order is rank order
    in_nelems = _int(meta.get("In msg nelems", meta.get("In msg size"))) or prod(in_dims)
    out_nelems = _int(meta.get("Out msg nelems", meta.get("Out msg size"))) or prod(out_dims)
    isz = itemsize(dtype)
    row_bytes = None
    if isz and in_dims:
        row_bytes = (prod(in_dims[1:]) or 1) * isz if len(in_dims) > 1 else isz
    elif isz and in_nelems and in_splits and not in_tr:
        total = sum(in_splits)  # type: ignore[arg-type]
        if total and in_nelems % total == 0:
            row_bytes = in_nelems // total * isz
    seq, comms_id = per_call(meta, launcher["event_id"] if launcher else None, source)
    peer = _int(meta.get("Dst Rank")) if ctype == "send" else _int(meta.get("Src Rank")) if ctype == "recv" else None
    title = by.get("title")
    backend = (
        "gloo"
        if title and title["name"].startswith("gloo:")
        else "nccl"
        if (meta or (title and title["name"].startswith("nccl:")))
        else None
    )
    return dict(
        collective=ctype,
        backend=backend,
        pg_name=pg_name,
        pg_desc=meta.get("Process Group Description"),
        group_ranks=group_ranks,
        group_size=size,
        seq=seq,
        comms_id=comms_id,
        in_splits=in_splits,
        out_splits=out_splits,
        splits_truncated=bool(in_tr or out_tr),
        splits_source=splits_source,
        in_nelems=in_nelems,
        out_nelems=out_nelems,
        dtype=dtype,
        row_bytes=row_bytes,
        peer_rank=peer,
    )


@dataclass
class CallRows:
    """The collective calls of a batch as columns (Python lists, one entry per call); their fields
    shared per signature in ``sigs`` (``sig``: the index of each call's)."""

    sigs: list[dict[str, Any]]
    sig: list[int]
    file: list[int]
    op_name: list[str | None]
    op_id: list[int | None]
    cpu_start_ns: list[int | None]
    cpu_end_ns: list[int | None]
    seq: list[int | None]
    comms_id: list[int | None]
    gloo: set[int]  # calls paired with a gloo worker range (backend 'gloo')

    def add(self, fields: dict[str, Any], file: int, op_name: str) -> int:
        """Append a call with no CPU op (fields of its own); return its index."""
        self.sigs.append(fields)
        self.sig.append(len(self.sigs) - 1)
        self.file.append(file)
        self.op_name.append(op_name)
        self.op_id.append(None)
        self.cpu_start_ns.append(None)
        self.cpu_end_ns.append(None)
        self.seq.append(fields["seq"])
        self.comms_id.append(fields["comms_id"])
        return len(self.sig) - 1

    def field(self, i: int, name: str) -> Any:
        return self.sigs[self.sig[i]][name]

"""Kineto rank files -> canonical tables, many files in one plan (the per-file half is in kineto.py).

A small rank file (param DLRM: 0.92 MB, 3,290 events) cost ~37 ms of CPU to read one at a time, two
thirds of it in ~200 small polars queries (kinds, linking, nesting depths, collectives, sorting,
schema checks), each with ~0.1-0.5 ms of fixed overhead whatever its size. Here the decoded files of
a batch (:func:`ep_trace.parsers.kineto.decode_kineto_file`, one per file) are concatenated once
with a file column (:data:`FILE`, 0, 1, ... in input order) and every step after the decode runs
once per batch, keyed by that column: ids (``event_id``, ``correlation``, ``External id``) and
threads are per file, so every join, as-of join and window carries it. The result is the same,
table for table and row for row, as reading each file alone (``tests/parsers/test_kineto_batch.py``
checks it on every real trace); one file is a batch of one (:func:`ep_trace.parsers.kineto.read_kineto_file`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl

from ep_trace import schema
from ep_trace.parsers import validate
from ep_trace.parsers.kineto_collectives import FILE, FileContext, build_collectives
from ep_trace.parsers.kineto_keys import first_rows, key_packs
from ep_trace.parsers.kineto_links import link_events

__all__ = ["FILE", "KINETO_CATEGORIES", "MEMORY_CATEGORIES", "Decoded", "finish_files"]

log = logging.getLogger(__name__)

_KIND_OF_CAT = {
    "kernel": "gpu_kernel",
    "gpu_memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "gpu_user_annotation": "gpu_annotation",
    "user_annotation": "cpu_annotation",
    "cpu_op": "cpu_op",
    "python_function": "python_frame",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    # other accelerators (pytorch/kineto libkineto/include/ActivityType.h): MTIA device ops are
    # mtia_ccp_events, XPU kernels already come as "kernel"; host-side launch APIs of MTIA, XPU,
    # HPU and PrivateUse1 backends are the runtime rows that launch them
    "mtia_ccp_events": "gpu_kernel",
    "mtia_runtime": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
    "hpu_op": "runtime",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
    # the first Kineto releases (torch 1.8-1.11) wrote capitalised categories of their own:
    # pytorch/kineto libkineto/src/output_json.cpp wrote "Operator" (CPU ops, until 6f9c0eef,
    # 2021-06-08), "User" (GPU user annotations on "stream N user", idem), "Runtime" (until bc4eaef5,
    # 2021-11-18), "Kernel", "Memcpy", "Memset" (until 1679e50e, 2022-04-08); between 6f9c0eef and
    # 3db5c597 (2022-05-06) libkineto/src/ActivityType.cpp spelt the GPU annotation
    # "gpu_user_Annotation". Real example: the June-2021 tb_plugin samples of pytorch/kineto
    # (tests/data/kineto_2021/, ProfilerStep#N as "Operator" rows)
    "Operator": "cpu_op",
    "User": "gpu_annotation",
    "gpu_user_Annotation": "gpu_annotation",
    "Runtime": "runtime",
    "Kernel": "gpu_kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
}
#: Categories of copy / memset rows, whose ``args.bytes`` the decoders keep (the 2021 spellings too).
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset")
#: Device-name prefix of a rank whose device rows carry one of these categories (else ``cuda``).
_DEVICE_PREFIX = {"mtia_ccp_events": "mtia"}
#: Categories kept as kind ``other`` on purpose (trace spans, profiler overhead, syncs, counters):
#: any other unknown category is named in the load report with its row count.
_KNOWN_OTHER = frozenset(
    {
        "Trace",
        "overhead",
        "cuda_sync",
        "cuda_event",
        "cpu_instant_event",
        "external_correlation",
        "mtia_insight",
        "mtia_counters",
        "hardware_counters",
        "cuda_profiler_range",
        "xpu_scope_profiler",
        "xpu_sync",
        "glow_runtime",
        "collective_comm",
    }
)
_GPU_KINDS = ("gpu_kernel", "gpu_memcpy", "gpu_memset", "gpu_annotation")
#: Every event category torch.profiler writes (mapped or kept as ``other`` on purpose), the
#: capitalised ones of the first Kineto releases included: a JSON with none of them and no Kineto
#: key is not a Kineto trace.
KINETO_CATEGORIES = frozenset(_KIND_OF_CAT) | _KNOWN_OTHER


@dataclass
class Decoded:
    """One decoded Kineto file (:func:`ep_trace.parsers.kineto.decode_kineto_file`), before its tables.

    Attributes:
        path: The file.
        rank: Rank of its rows.
        header: Top-level keys of the trace other than ``traceEvents``.
        dist: ``distributedInfo`` (may be empty).
        kept_args: ``args`` of the events the collective builder reads, by event_id.
        ev: Raw event columns with ``start_ns`` / ``end_ns`` (``pid_raw``, ``tid_raw``, ...).
        issues: Load-report lines so far (rank source).
        info: The file's :class:`~ep_trace.parsers.kineto.KinetoFileInfo`.
    """

    path: Path
    rank: int
    header: dict[str, Any]
    dist: dict[str, Any]
    kept_args: dict[int, dict[str, Any]]
    ev: pl.DataFrame
    issues: list[schema.LoadIssue]
    info: Any


_KIND_DTYPE = pl.Enum(schema.EVENT_KINDS)


def _kind_of_category(cat: pl.Series) -> pl.Series:
    """``kind`` of each row from its Categorical ``category``: the few distinct categories mapped
    in Python, then one table lookup per row by category code (a ``replace_strict`` of the strings
    hashed every row: 2.9 ms against 0.8 per 188k events)."""
    kinds = _KIND_DTYPE.categories.to_list()
    other = kinds.index("other")
    uniq = cat.unique()
    codes = uniq.to_physical()
    top = cast("int | None", codes.max())
    if top is None or int(top) > max(1 << 16, 4 * cat.len()):  # (a huge global category table: by name)
        return cat.replace_strict(_KIND_OF_CAT, default="other", return_dtype=_KIND_DTYPE)
    lut = np.full(int(top) + 2, other, dtype=np.uint8)  # the last slot: a null category (-> other)
    for code, name in zip(codes.to_list(), uniq.to_list(), strict=True):
        if code is not None:
            lut[code] = kinds.index(_KIND_OF_CAT.get(name, "other"))
    phys = cat.to_physical().fill_null(len(lut) - 1).to_numpy()
    return pl.Series("kind", lut[phys]).cat.to(_KIND_DTYPE)


def _kind_expr(ev: pl.DataFrame) -> pl.Expr:
    """``kind`` from ``category`` (Categorical); ``gloo:*`` user annotations on a thread that issues
    no collective itself become comm_worker.

    ProcessGroupGloo runs the transfer on its own worker threads (torch 2.x, verified 2.13 and the
    2024 ``rank-34`` trace); the caller thread holds ``ProfilerStep#`` / ``c10d::*`` ops instead.
    """
    # the schema's Enum from the start (1 byte per row): conform then has no string cast and no
    # check to run, and the link / collective filters compare bytes, not strings
    kind = pl.lit(_kind_of_category(ev.get_column("category")))
    # the name test on the user annotations only (a few hundred rows), not on every name
    annotations = (ev.get_column("category") == "user_annotation").fill_null(False).arg_true()
    gloo = ev.get_column("name").gather(annotations).str.starts_with("gloo:").fill_null(False)
    if not gloo.any():
        return kind.alias("kind")
    thread = [FILE, "pid", "tid"]
    caller = (
        ev.select(*thread, "name")
        .filter(
            pl.col("name").str.starts_with("ProfilerStep#")
            | pl.col("name").str.starts_with("c10d::")
            | (pl.col("name") == "record_param_comms")
        )
        .select(thread)
        .unique()
        .with_columns(pl.lit(True).alias("_caller"))
    )
    # only the gloo rows' threads are looked up (a join of every row's thread cost ~3 ms per 157k events)
    rows = annotations.filter(gloo)
    on_caller = (
        ev.select(thread)
        .gather(rows)
        .join(caller, on=thread, how="left", nulls_equal=True, maintain_order="left")["_caller"]
    )
    is_worker = pl.repeat(False, ev.height, eager=True).scatter(rows, on_caller.is_null())
    worker = pl.lit("comm_worker", dtype=_KIND_DTYPE)
    return pl.when(is_worker).then(worker).otherwise(kind).alias("kind")


def _start_order(ev: pl.DataFrame) -> pl.Series | None:
    """The rows' order by (file, start_ns, event_id), stable, computed before the links: rows are
    never reordered or dropped after the duplicate check, so this one sort serves both the check
    (copies share their start: they are neighbours here) and the final sort. None when the rows
    are not in (file, event_id) order (then event_id must be a key of the sort: it is done later)."""
    if ev.height < 2:
        return None
    one_file = ev.get_column(FILE)[0] == ev.get_column(FILE)[-1]  # (files are concatenated in order)
    if one_file:
        if not ev.get_column("event_id").is_sorted():
            return None
        # rows in event_id order: a stable sort by start breaks its ties by event_id (one key, not three)
        return ev.select(pl.arg_sort_by("start_ns", maintain_order=True)).to_series()
    f, e = pl.col(FILE), pl.col("event_id")
    if not ev.select(((f.diff() > 0) | ((f.diff() == 0) & (e.diff() >= 0))).all()).item():
        return None
    return ev.select(pl.arg_sort_by(FILE, "start_ns", maintain_order=True)).to_series()


def _drop_duplicates(
    ev: pl.DataFrame, files: Sequence[Decoded], issues: list[list[schema.LoadIssue]], order: pl.Series | None
) -> tuple[pl.DataFrame, pl.Series | None]:
    """:func:`ep_trace.parsers.validate.drop_duplicate_rows` per file (copies never span two files);
    with ``order`` (:func:`_start_order`) only the rows sharing their (file, start) with a
    neighbour in that order are checked (a copy shares it), and ``order`` is returned for the
    rows kept (hashing every row's numbers cost 6.6 ms per 188k events)."""
    if ev.height < 2:
        return ev, order
    key = [*validate.RAW_DUPLICATE_KEY, FILE]
    if order is None:
        first = validate.first_copies(ev, key)
        if bool(first.all()):
            return ev, None
        return _drop_rows(ev, ~first, files, issues), None
    by_start = ev.select(pl.col(FILE, "start_ns").gather(order))
    same = by_start.select(
        pl.all_horizontal(pl.col(c).eq_missing(pl.col(c).shift(1)) for c in (FILE, "start_ns")).fill_null(False)
    ).to_series()
    tied = same | same.shift(-1, fill_value=False)
    if not tied.any():
        return ev, order
    rows = order.filter(tied).sort()  # (row order: the first copy is the earliest row)
    first = validate.first_copies(ev[rows], key)
    if bool(first.all()):
        return ev, order
    dup = pl.repeat(False, ev.height, eager=True).scatter(rows.filter(~first), True)
    keep = (~dup).to_numpy()
    o = order.to_numpy()
    new_row = np.cumsum(keep) - 1  # a kept row's index once the copies are dropped
    return _drop_rows(ev, dup, files, issues), pl.Series(new_row[o[keep[o]]])


def _drop_rows(
    ev: pl.DataFrame, dup: pl.Series, files: Sequence[Decoded], issues: list[list[schema.LoadIssue]]
) -> pl.DataFrame:
    """``ev`` without the ``dup`` rows, each file's count in its load report."""
    dups = ev.select(FILE).with_columns(dup.alias("_dup")).group_by(FILE).agg(pl.col("_dup").sum())
    for fi, n in dups.filter(pl.col("_dup") > 0).sort(FILE).iter_rows():
        d = files[fi]
        issues[fi].append(validate.duplicate_issue(d.path, d.rank, int(n)))
    return ev.filter(~dup)


def _sort_columns(
    holder: list[pl.DataFrame], *by: str, order: pl.Series | None = None, constant: tuple[str, ...] = ()
) -> pl.DataFrame:
    """The frame in ``holder`` sorted by ``by`` (stable), or put in ``order`` (row indices), gathered
    column by column, each released once gathered, so the peak holds the events once plus one
    column instead of twice. The frame is taken out of ``holder`` (emptied): a plain argument would
    stay referenced by the caller and keep every source column alive. ``constant`` columns (one
    value throughout, e.g. the rank of a one-file batch) are repeated, not gathered."""
    ev = holder.pop()
    if order is None:
        keys = list(by)
        if keys[-1] == "event_id" and ev.get_column("event_id").is_sorted():
            # rows already in event_id order: a stable sort by the other keys breaks their ties by
            # event_id too (35% cheaper than one more key)
            keys = keys[:-1]
        fk = ev.get_column(FILE) if keys[0] == FILE else None
        if len(keys) == 2 and fk is not None and fk.min() == fk.max():
            keys = keys[1:]  # one file: its constant key would only make a two-key (row-encoded) sort
        order = ev.select(pl.arg_sort_by(*keys, maintain_order=True)).to_series()
    names = ev.columns
    # the columns as a plain list, the frame released: dropping a column from the frame makes a new
    # frame each time (1.2 ms over 19 columns); clearing a list slot costs nothing
    cols: list[pl.Series | None] = [*ev.get_columns()]
    del ev
    out, empty = [], []
    for j, name in enumerate(names):
        col = cols[j]
        assert col is not None
        if col.null_count() == col.len():  # stays a constant column (e.g. device on CPU traces)
            empty.append(pl.lit(None, dtype=col.dtype).alias(name))
        elif name in constant and col.len():
            empty.append(pl.lit(col[0], dtype=col.dtype).alias(name))
        else:
            out.append(col.gather(order))
        cols[j] = col = None
    return pl.DataFrame(out).with_columns(empty).select(names)


def _step_seq(name: pl.Series) -> pl.Series:
    """The step number of ``ProfilerStep#<n>`` rows (null elsewhere), the regex run on those rows
    only (on every name it cost 4.1 ms per 190k events; the rows are a handful)."""
    rows = name.str.starts_with("ProfilerStep#").arg_true()
    seq = name.gather(rows).str.extract(r"^ProfilerStep#(\d+)$").cast(pl.Int64)
    return pl.repeat(None, name.len(), dtype=pl.Int64, eager=True).scatter(rows, seq)


def _per_file(df: pl.DataFrame, n_files: int) -> list[int]:
    """Rows of each file in ``df`` (sorted by :data:`FILE`), as a list indexed by file."""
    counts = dict(df.group_by(FILE).len().iter_rows()) if df.height else {}
    return [int(counts.get(i, 0)) for i in range(n_files)]


def finish_files(files: Sequence[Decoded]) -> list[tuple[schema.TraceTables, Any]]:
    """Every step after the decode, for the files of a batch at once; one result per file, in order.

    Returns:
        ``(tables, info)`` per file, ``tables`` validated (schema) as the one-file reader returns them.

    Raises:
        TraceFormatError: bad input; with several files the message may not name the right file,
            so callers read each file alone when a batch fails (:mod:`ep_trace.parsers.read_pool`).
    """
    n = len(files)
    src = str(files[0].path) if n == 1 else "<batch>"
    issues = [list(d.issues) for d in files]
    framed = [d.ev.with_columns(pl.lit(i, dtype=pl.Int32).alias(FILE)) for i, d in enumerate(files)]
    ev = framed[0] if n == 1 else pl.concat(framed, how="vertical", rechunk=True)
    del framed
    order = _start_order(ev)
    ev, order = _drop_duplicates(ev, files, issues, order)  # before links / collectives

    # Categorical from here on (the schema's type): the kind lookup, the category tests of the
    # links and the sort then work on 4-byte codes, and conform has no cast left to do
    ev = ev.rename({"pid_raw": "pid", "tid_raw": "tid"}).with_columns(pl.col("category").cast(pl.Categorical))
    if ev["name"].null_count():
        ev = ev.with_columns(pl.col("name").fill_null(""))
    ev = ev.with_columns(_kind_expr(ev))
    unknown = (
        ev.filter((pl.col("kind") == "other") & ~pl.col("category").is_in(list(_KNOWN_OTHER)))
        .group_by(FILE, "category")
        .len()
        .sort(FILE, "category", nulls_last=True)
    )
    for fi, cat_name, cnt in unknown.iter_rows():
        d = files[fi]
        issues[fi].append(
            schema.LoadIssue(
                str(d.path),
                d.rank,
                "warning",
                f"{cnt} rows of activity type {cat_name!r} are not analysed (unknown to ep-trace; kept as kind 'other')",
            )
        )
    present = set(ev.filter(pl.col("category").is_in(list(_DEVICE_PREFIX))).select(FILE, "category").unique().rows())
    prefix = [next((p for c, p in _DEVICE_PREFIX.items() if (i, c) in present), "cuda") for i in range(n)]
    gpu = pl.col("kind").is_in(_GPU_KINDS)
    rank_of = {i: d.rank for i, d in enumerate(files)}
    rank = (
        pl.lit(files[0].rank, dtype=pl.Int32) if n == 1 else pl.col(FILE).replace_strict(rank_of, return_dtype=pl.Int32)
    )
    ev = ev.with_columns(
        rank.alias("rank"),
        pl.when(gpu).then(pl.col("pid")).cast(pl.Int32).alias("device"),
        pl.when(gpu).then(pl.col("tid")).alias("stream"),
        _step_seq(ev.get_column("name")).alias("seq"),
    )
    ev = link_events(ev, FILE)
    ctx = [FileContext(d.kept_args, d.rank, d.dist, str(d.path)) for d in files]
    colls, coll_of_event = build_collectives(ev, ctx)
    if coll_of_event.height:
        ek = key_packs(ev, {"event": ["event_id"]}, FILE, n)["event"].key
        row = first_rows(coll_of_event.select(ek("event_id")).to_series(), ev.select(ek("event_id")).to_series())
        ev = ev.with_columns(coll_of_event.get_column("coll_id").gather(row))
    holder = [ev]
    del ev
    ev = _sort_columns(holder, FILE, "start_ns", "event_id", order=order, constant=(FILE, "rank") if n == 1 else ())
    n_events = _per_file(ev, n)
    per_file = ev.group_by(FILE).agg(
        pl.col("start_ns").min().alias("lo"),
        pl.col("end_ns").max().alias("hi"),
        pl.col("device").filter(pl.col("kind") == "gpu_kernel").drop_nulls().mode().min().alias("dev"),
    )
    stats = {r[0]: r[1:] for r in per_file.iter_rows()}
    events_df = schema.validate("events", schema.conform("events", ev), src)
    del ev
    n_colls = _per_file(colls, n)
    colls_df = schema.validate("collectives", schema.conform("collectives", colls), src)

    rows = []
    for i, d in enumerate(files):
        lo, hi, dev = stats[i]
        ws, backend, host = d.dist.get("world_size"), d.dist.get("backend"), d.header.get("host_name")
        ep = d.header.get("ep_trace")
        jid = ep.get("job_id") if isinstance(ep, dict) else None
        rows.append(
            {
                "rank": d.rank,
                "world_size": ws if isinstance(ws, int) else None,
                "host": host if isinstance(host, str) else None,
                "device": f"{prefix[i]}:{int(dev)}" if dev is not None else "cpu",
                "backend": backend if isinstance(backend, str) else None,
                "source_file": str(d.path),
                # ep-trace's Tracer writes {"ep_trace": {"job_id": ...}} into the trace header.
                "job_id": str(jid) if jid is not None else None,
                "format": "kineto",
                "trace_start_ns": lo,
                "trace_end_ns": hi,
                "clock_offset_ns": 0,
                "rank_source": d.info.rank_source,
                "has_sidecar": False,
            }
        )
    ranks_df = schema.validate("ranks", schema.conform("ranks", pl.DataFrame(rows)), src)
    out = []
    e0 = c0 = 0
    for i, d in enumerate(files):
        tables = schema.TraceTables(
            ranks=ranks_df.slice(i, 1),
            events=events_df.slice(e0, n_events[i]),
            collectives=colls_df.slice(c0, n_colls[i]),
            load_report=tuple(issues[i]),
        )
        e0 += n_events[i]
        c0 += n_colls[i]
        out.append((tables, d.info))
    return out

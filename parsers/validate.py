"""The validation layer at the parser boundary: what every reader's tables must satisfy.

The format readers (Kineto, Nsight, CUPTI) decode; this module decides whether what they decoded
can be trusted, in one place and with one vocabulary of errors, so the analysis never sees a value
it would turn into a wrong number. It is called by :mod:`ep_trace.parsers.read_pool` on every file
right after its reader returns, and by :mod:`ep_trace.parsers.dispatch` after a sidecar is merged
and once all ranks of a job are read. All checks are polars expressions over whole columns (one
``select`` per table); the cost is measured in ``benchmarks/README.md`` (validation overhead).

Checks (each failure is one :class:`~ep_trace.errors.TraceFormatError` line naming the file, the
record and the fix):

* the input itself, before any byte is read (:func:`check_input_path`): a directory where a file is
  expected, a FIFO, socket or device file, a dangling symlink, a symlink loop, no permission;
  OS errors met while reading become the same kind of line (:func:`os_error`);
* ``ranks``: rank >= 0 (``< world_size`` is checked per job, naming the file), world size in
  ``[1, MAX_WORLD_SIZE]``;
* times (:func:`check_times`): every ``start_ns`` / ``end_ns`` inside ``±2^62`` ns (epoch ns up to
  year 2116: a sum of two such values cannot wrap int64, so later differences and sums are exact),
  and a file's events spanning at most :data:`MAX_SPAN_NS` (a 63-year ``dur``, a ``ts`` of another
  clock, a garbled ``baseTimeNanoseconds`` are all caught as "outside the trace's own window",
  naming the event farthest from the file's median start);
* counts: routing counts, split lists, bytes, rows and ``n_kernels`` >= 0; expert ids >= 0; group
  ranks, routing src / dst and placement ranks in ``[0, world_size)``;
* duplicates (:func:`drop_duplicate_events`): events equal in rank, kind, name, pid, tid, stream,
  start, end, correlation and external id (a trace written twice into one file, a merge tool run twice) are dropped, keeping
  the first, and counted in the load report: a duplicated span would count its time twice;
* identity (:func:`check_sidecar_identity`): a sidecar's ``job_id``, ``world_size`` and rank must
  match its trace and its records must fall inside the trace's time window;
* job clocks (:func:`check_job_clocks`): the ranks of one job must start within
  :data:`MAX_RANK_SKEW_NS` of each other (one rank without ``baseTimeNanoseconds`` would otherwise
  wait "19 years" per step).

The input-before-reading checks and the resource caps (decompressed bytes per file, string length
of decoded names; environment variables raise them) live in :mod:`ep_trace.parsers.input_guard` and
are re-exported here. The other parts of the layer, one concept a module (issue 40):
:mod:`~ep_trace.parsers.json_guard` (JSON nesting depth, data after the document, events per byte,
before any decoder), :mod:`~ep_trace.parsers.sqlite_guard` (SQLite opened read-only, tables only, a
step budget per statement), :mod:`~ep_trace.parsers.sidecar_checks` (a sidecar's consistency with
itself and its trace), :mod:`~ep_trace.parsers.dist_info` (a Kineto trace's own rank account) and
:mod:`~ep_trace.parsers.rank_set` (sidecars of a job agree; ranks missing from the world or without
a sidecar named).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from ep_trace import schema
from ep_trace.errors import TraceFormatError
from ep_trace.parsers.input_guard import (
    INFLATE_FLOOR,
    INFLATE_MAX,
    INFLATE_RATIO,
    MAX_STRING_BYTES,
    check_inflated,
    check_input_path,
    check_string_table,
    check_strings,
    guarded,
    inflate_limit,
    os_error,
    rank_for,
    text_series,
    unexpected_error,
)

__all__ = [
    "guarded",
    "rank_for",
    "MAX_SPAN_NS",
    "MAX_RANK_SKEW_NS",
    "MAX_WORLD_SIZE",
    "TIME_LIMIT_NS",
    "INFLATE_RATIO",
    "INFLATE_FLOOR",
    "INFLATE_MAX",
    "MAX_STRING_BYTES",
    "check_input_path",
    "os_error",
    "unexpected_error",
    "inflate_limit",
    "check_inflated",
    "check_strings",
    "text_series",
    "check_string_table",
    "check_times",
    "check_tables",
    "drop_duplicate_events",
    "drop_duplicate_rows",
    "duplicate_issue",
    "first_copies",
    "check_sidecar_identity",
    "check_job_clocks",
    "validate_file",
]

#: Longest a single trace file may span (first start to last end): 7 days. A profiler window is
#: seconds to minutes; a week leaves room for long nsys sessions while a 63-year ``dur`` or a ``ts``
#: of another clock is refused.
MAX_SPAN_NS = 7 * 86_400 * 10**9
#: Ranks of one job must start within this of each other (1 day): hosts disagree by ms to s, a
#: missing ``baseTimeNanoseconds`` moves a rank by decades.
MAX_RANK_SKEW_NS = 86_400 * 10**9
#: Largest accepted world size (and rank + 1).
MAX_WORLD_SIZE = 1 << 20
#: Every time must satisfy ``|t| < TIME_LIMIT_NS`` (2^62 ns ~ year 2116 as epoch ns), so that the sum
#: or difference of two times never wraps int64.
TIME_LIMIT_NS = 1 << 62


# --- tables ------------------------------------------------------------------------------------


def _record(df: pl.DataFrame, table: str, row: int) -> str:
    """``traceEvents[event_id]`` for Kineto events (event_id is the index in the file), else ``table[row]``."""
    if table == "events" and "event_id" in df.columns:
        return f"event {int(df['event_id'][row])}"
    return f"{table}[{row}]"


def _first_bad(df: pl.DataFrame, bad: pl.Expr) -> int | None:
    idx = df.select(bad.fill_null(False).arg_max().alias("i"), bad.fill_null(False).any().alias("a")).row(0)
    return int(idx[0]) if idx[1] else None


def check_times(path: str | Path, df: pl.DataFrame, table: str, span: bool = True) -> None:
    """``start_ns`` / ``end_ns`` of one file: inside ``±TIME_LIMIT_NS`` and spanning <= ``MAX_SPAN_NS``
    (``span=False``: the range only, for the union of several files whose spans are checked apart).

    Raises:
        TraceFormatError: naming the event farthest outside the file's own window.
    """
    if df.height == 0 or "start_ns" not in df.columns:
        return
    s, e = pl.col("start_ns"), pl.col("end_ns")
    stats = df.select(
        s.min().alias("lo"),
        e.max().alias("hi"),
        s.median().alias("mid"),
        ((s.abs() >= TIME_LIMIT_NS) | (e.abs() >= TIME_LIMIT_NS)).any().alias("huge"),
    ).row(0, named=True)
    if stats["huge"]:
        i = _first_bad(df, (s.abs() >= TIME_LIMIT_NS) | (e.abs() >= TIME_LIMIT_NS))
        assert i is not None
        r = df.row(i, named=True)
        raise TraceFormatError(
            path,
            f"time out of range (start_ns={r['start_ns']}, end_ns={r['end_ns']}; |t| must be < 2^62 ns)",
            "the timestamps or baseTimeNanoseconds are corrupt; re-export the trace",
            record=_record(df, table, i),
        )
    if not span or stats["hi"] - stats["lo"] <= MAX_SPAN_NS:
        return
    mid = int(stats["mid"])
    far = pl.max_horizontal((s - mid).abs(), (e - mid).abs())
    i = int(df.select(far.arg_max()).item())
    r = df.row(i, named=True)
    days = (stats["hi"] - stats["lo"]) / 86_400e9
    raise TraceFormatError(
        path,
        f"events span {days:,.1f} days (more than {MAX_SPAN_NS // 86_400_000_000_000} days); this one lies "
        f"outside the trace's own window (start_ns={r['start_ns']}, end_ns={r['end_ns']}, median start {mid})",
        "its ts / dur or the file's baseTimeNanoseconds is corrupt; re-export the trace",
        record=_record(df, table, i),
    )


def _list_bad(col: str, lo: int | None, hi: int | None) -> pl.Expr:
    conds = []
    if lo is not None:
        conds.append(pl.col(col).list.min() < lo)
    if hi is not None:
        conds.append(pl.col(col).list.max() >= hi)
    return pl.any_horizontal(conds).fill_null(False)


def check_tables(path: str | Path, t: schema.TraceTables, world_size: int | None = None, span: bool = True) -> None:
    """Range checks of every table of one file (or one rank after its sidecar merge).

    Args:
        path: File named in the error.
        t: The tables.
        world_size: World size to check ranks against; default the tables' own ``ranks.world_size``.
        span: Check the events' span (:func:`check_times`); False for several files at once.

    Raises:
        TraceFormatError: the first offending record.
    """
    ranks = t.ranks
    ws_vals = ranks["world_size"].drop_nulls()
    ws = world_size if world_size is not None else (int(ws_vals.max()) if ws_vals.len() else None)  # type: ignore[arg-type]
    if ranks.height:
        bad = _first_bad(ranks, (pl.col("world_size") < 1) | (pl.col("world_size") > MAX_WORLD_SIZE))
        if bad is not None:
            raise TraceFormatError(
                path,
                f"world_size {ranks['world_size'][bad]} is not in [1, {MAX_WORLD_SIZE}]",
                "the trace metadata is corrupt; pass rank_map or re-export",
                record=f"ranks[{bad}]",
            )
        # rank >= world_size is a job-level conflict, named by dispatch._check_job
        bad = _first_bad(ranks, (pl.col("rank") < 0) | (pl.col("rank") >= MAX_WORLD_SIZE))
        if bad is not None:
            r = ranks.row(bad, named=True)
            raise TraceFormatError(
                path,
                f"rank {r['rank']} is outside [0, {MAX_WORLD_SIZE})",
                "the rank metadata is corrupt or from another job; pass rank_map to set the rank",
                record=f"ranks[{bad}]",
            )
    check_times(path, t.events, "events", span)
    check_strings(path, t.events, "events", ("name", "category", "domain"))
    check_strings(path, t.ranks, "ranks", ("host", "device", "backend", "job_id"))
    checks: list[tuple[str, pl.DataFrame, pl.Expr, str]] = [
        ("events", t.events, pl.col("bytes") < 0, "negative bytes"),
        ("collectives", t.collectives, pl.col("n_kernels") < 0, "negative n_kernels"),
        ("collectives", t.collectives, _list_bad("in_splits", 0, None), "negative input split"),
        ("collectives", t.collectives, _list_bad("out_splits", 0, None), "negative output split"),
        ("collectives", t.collectives, (pl.col("group_size") < 0), "negative group size"),
        ("collectives", t.collectives, (pl.col("in_nelems") < 0) | (pl.col("out_nelems") < 0), "negative nelems"),
        ("collectives", t.collectives, pl.col("row_bytes") < 0, "negative row_bytes"),
        ("routing_counts", t.routing_counts, pl.col("count") < 0, "negative expert count"),
        ("routing_counts", t.routing_counts, (pl.col("expert") < 0) | (pl.col("step") < 0), "negative expert / step"),
        ("routing_matrix", t.routing_matrix, pl.col("rows") < 0, "negative rows in an all-to-all split"),
        ("routing_matrix", t.routing_matrix, (pl.col("src") < 0) | (pl.col("dst") < 0), "negative rank"),
        ("placement", t.placement, (pl.col("expert") < 0) | (pl.col("rank") < 0), "negative expert / rank"),
    ]
    if ws is not None:
        checks += [
            ("collectives", t.collectives, _list_bad("group_ranks", 0, ws), f"group rank outside [0, {ws})"),
            (
                "routing_matrix",
                t.routing_matrix,
                (pl.col("src") >= ws) | (pl.col("dst") >= ws),
                f"rank outside [0, world size {ws})",
            ),
            ("placement", t.placement, pl.col("rank") >= ws, f"expert placed on a rank outside [0, world size {ws})"),
        ]
    for table, df, bad_expr, what in checks:
        if df.height == 0:
            continue
        i = _first_bad(df, bad_expr)
        if i is not None:
            row = {k: v for k, v in df.row(i, named=True).items() if v is not None}
            shown = ", ".join(f"{k}={str(v)[:40]}" for k, v in list(row.items())[:6])
            raise TraceFormatError(
                path, f"{what} ({shown})", "the file is corrupt; re-capture it or remove it", record=f"{table}[{i}]"
            )


#: Columns two copies of one record share: a copy repeats its ids too (see drop_duplicate_events).
RAW_DUPLICATE_KEY = ("category", "name", "pid_raw", "tid_raw", "start_ns", "end_ns", "correlation", "external_id")


def first_copies(ev: pl.DataFrame, key: list[str]) -> pl.Series:
    """Boolean mask: True for the first row of every group equal in ``key`` (the rows to keep).

    Two passes: numeric key columns only first (cheap hashing: ~50 ms per 700k events), then the
    full key (strings included, ~10x the cost) on the few rows whose numbers collide.
    """
    numeric = [c for c in key if ev.schema[c].is_numeric()]
    if not numeric:
        return ev.select(pl.struct(key).is_first_distinct()).to_series()
    h = ev.select(pl.struct(numeric).hash()).to_series()  # (a u64 column: fast)
    if h.n_unique() == h.len():  # no two rows share a hash (the usual case): counting is 2.5x cheaper
        return pl.repeat(True, ev.height, eager=True)
    collide = h.is_duplicated()
    sub = ev.with_row_index("_row").filter(collide)
    drop = sub.filter(~pl.struct(key).is_first_distinct())["_row"]
    if drop.len() == 0:
        return pl.repeat(True, ev.height, eager=True)
    return pl.int_range(ev.height, eager=True).is_in(drop.implode()).not_()


def drop_duplicate_rows(
    ev: pl.DataFrame, path: str | Path, rank: int | None, key: tuple[str, ...] = RAW_DUPLICATE_KEY
) -> tuple[pl.DataFrame, schema.LoadIssue | None]:
    """Drop copies of a decoded event (keep the first) *before* links and collectives are built.

    Called by a reader right after its times are known (Kineto: ``kineto.read_kineto_file``): a
    copied ``c10d::*`` op or gloo worker range would otherwise become a second collective and shift
    the pairing of every later call. Returns the frame and the load-report line (None: no copies).
    """
    if ev.height < 2:
        return ev, None
    first = first_copies(ev, list(key))
    n_dup = int(first.len() - first.sum())
    if n_dup == 0:
        return ev, None
    return ev.filter(first), duplicate_issue(path, rank, n_dup)


def duplicate_issue(path: str | Path, rank: int | None, n_dup: int) -> schema.LoadIssue:
    """The load-report line of ``n_dup`` duplicate events dropped from one file."""
    return schema.LoadIssue(
        str(path),
        rank,
        "warning",
        f"{n_dup} duplicate events (same rank, name, stream, start and end) dropped; "
        "their time would have been counted twice",
    )


def drop_duplicate_events(t: schema.TraceTables, path: str | Path) -> schema.TraceTables:
    """Drop events equal in rank, kind, name, pid, tid, stream, start, end and ids (keep the first).

    A duplicated span counts its time twice (50 copies of one event made a 236.6 ms wait in a
    127 ms step), and a copied ``c10d::*`` op became a second collective that shifted every later
    call's ordinal. So references follow the drop: ``launch_id`` / ``op_id`` pointing at a copy
    point at its original, collectives launched by a copy are dropped and the ordinals of the
    rank's remaining calls renumbered (same rule as the readers: by ``cpu_start_ns`` per
    ``pg_name``). The count dropped goes into the load report as a warning.
    """
    ev = t.events
    if ev.height < 2:
        return t
    # correlation / External id in the key: zero-length runtime calls of one thread often share a
    # µs timestamp in 2022-2023 traces (cudaPeekAtLastError pairs in hta_trace_diff) yet are distinct
    # records with their own ids; a copied record repeats its ids too.
    key = ["rank", "kind", "name", "pid", "tid", "stream", "start_ns", "end_ns", "correlation", "external_id"]
    first = first_copies(ev, key)
    n_dup = int(first.len() - first.sum())
    if n_dup == 0:
        return t
    canon = ev.select("rank", "event_id", pl.col("event_id").first().over(key).alias("_canon")).filter(
        pl.col("event_id") != pl.col("_canon")
    )
    dropped = canon.select("rank", "event_id")
    kept = ev.filter(first)
    for ref in ("launch_id", "op_id"):
        m = canon.select("rank", pl.col("event_id").alias(ref), pl.col("_canon").alias("_to"))
        kept = (
            kept.join(m, on=["rank", ref], how="left", maintain_order="left")
            .with_columns(pl.coalesce("_to", ref).alias(ref))
            .drop("_to")
        )
    colls = t.collectives
    if colls.height:
        by_op = colls.join(dropped.rename({"event_id": "op_id"}), on=["rank", "op_id"], how="semi")
        # calls without a launching op (gloo worker ranges) made only of copies
        only_copies = (
            ev.filter(~first & pl.col("coll_id").is_not_null())
            .select("rank", "coll_id")
            .unique()
            .join(
                kept.filter(pl.col("coll_id").is_not_null()).select("rank", "coll_id"),
                on=["rank", "coll_id"],
                how="anti",
            )
        )
        by_range = colls.filter(pl.col("op_id").is_null()).join(only_copies, on=["rank", "coll_id"], how="semi")
        gone = pl.concat([by_op, by_range]).unique(["rank", "coll_id"])
        if gone.height:
            colls = colls.join(gone.select("rank", "coll_id"), on=["rank", "coll_id"], how="anti")
            order = pl.struct("cpu_start_ns", "start_ns", "coll_id").rank("ordinal").over(["rank", "pg_name"])
            colls = colls.with_columns((order - 1).cast(pl.Int64).alias("ordinal"))
            kept = kept.with_columns(
                pl.when(
                    pl.struct("rank", "coll_id").is_in(gone.select(pl.struct("rank", "coll_id")).to_series().implode())
                )
                .then(None)
                .otherwise(pl.col("coll_id"))
                .alias("coll_id")
            )
    ranks = sorted(set(dropped["rank"].to_list()))
    issue = schema.LoadIssue(
        str(path),
        ranks[0] if len(ranks) == 1 else None,
        "warning",
        f"{n_dup} duplicate events (same rank, name, stream, start and end) dropped; "
        "their time would have been counted twice",
    )
    return replace(
        t,
        events=schema.validate("events", kept.select(ev.columns), str(path)),
        collectives=schema.validate("collectives", colls, str(path)),
        load_report=t.load_report + (issue,),
    )


def validate_file(path: str | Path, t: schema.TraceTables) -> schema.TraceTables:
    """Everything checked on one file's tables right after its reader returns: ranges, times,
    string lengths, then duplicate events dropped (counted in the load report)."""
    check_tables(path, t)
    if t.ranks.height and (t.ranks["format"] == "kineto").all():
        return t  # the Kineto reader drops copies itself, before links and collectives
    return drop_duplicate_events(t, path)


# --- identity: sidecars and the ranks of one job -----------------------------------------------


def check_sidecar_identity(trace: schema.TraceTables, sidecar: Any) -> None:
    """A sidecar must belong to its trace: same ``job_id``, ``world_size`` and rank, and its records'
    host times inside the trace's window (a killed rerun leaves new sidecars beside an old trace).

    Args:
        trace: One rank's tables (before the merge).
        sidecar: Its :class:`~ep_trace.parsers.sidecar.Sidecar`.

    Raises:
        RankConflictError: naming both files.
    """
    from ep_trace.errors import RankConflictError

    r = trace.ranks.row(0, named=True)
    tf, sf = r["source_file"], sidecar.path
    meta = sidecar.meta
    for key, label in (("job_id", "job id"), ("world_size", "world size")):
        a, b = r.get(key), meta.get(key)
        if a is not None and b is not None and str(a) != str(b):
            raise RankConflictError(
                f"{sf}: sidecar {label} {str(b)[:80]!r} differs from its trace {tf} ({str(a)[:80]!r}); "
                "the sidecar is from another run: remove it or re-capture (--keep-going leaves it out)"
            )
    if sidecar.rank is not None and sidecar.rank != r["rank"]:
        raise RankConflictError(
            f"{sf}: sidecar of rank {sidecar.rank} merged into {tf} (rank {r['rank']}); rename the file or re-capture"
        )
    lo, hi = r.get("trace_start_ns"), r.get("trace_end_ns")
    times = [
        v
        for rec in sidecar.a2a
        for v in (rec.get("start_ns"), rec.get("end_ns"))
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    if lo is None or hi is None or not times or r.get("format") != "kineto":
        return
    # the a2a windows are time.time_ns() around the call, nominally Kineto's epoch clock, but the
    # sidecar merge tolerates skew (it pairs calls by order when no window matches, e.g. an hour off:
    # tests/parsers/test_dispatch.py); a record a day away from the trace is from another run.
    slack = MAX_RANK_SKEW_NS
    t_lo, t_hi = min(times), max(times)
    if t_hi < lo - slack or t_lo > hi + slack:
        raise RankConflictError(
            f"{sf}: sidecar records ({t_lo}..{t_hi} ns) lie outside the time window of its trace {tf} "
            f"({lo}..{hi} ns); the sidecar is from another run: remove it or re-capture (--keep-going leaves it out)"
        )


def check_job_clocks(ranks: pl.DataFrame) -> None:
    """The ranks of one job must start within :data:`MAX_RANK_SKEW_NS` of each other.

    Raises:
        RankConflictError: naming the earliest and the latest file.
    """
    from ep_trace.errors import RankConflictError

    have = ranks.filter(pl.col("trace_start_ns").is_not_null())
    if have.height < 2:
        return
    i_lo, i_hi = have["trace_start_ns"].arg_min(), have["trace_start_ns"].arg_max()
    assert i_lo is not None and i_hi is not None
    lo, hi = have.row(int(i_lo), named=True), have.row(int(i_hi), named=True)
    gap = hi["trace_start_ns"] - lo["trace_start_ns"]
    if gap > MAX_RANK_SKEW_NS:
        raise RankConflictError(
            f"{hi['source_file']} (rank {hi['rank']}) starts {gap / 86_400e9:,.1f} days after "
            f"{lo['source_file']} (rank {lo['rank']}); one of them has a missing or shifted "
            "baseTimeNanoseconds or is from another job: fix or remove it (--keep-going does not mix clocks)"
        )

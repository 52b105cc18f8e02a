"""Device activity of every rank, classified as communication, compute or memory.

Two regimes, chosen per rank:

* **GPU ranks** (the rank has ``gpu_kernel`` rows): comm = kernels the comm classifier
  (:mod:`ep_trace.comm_classifier`) recognises or that the parser linked to a collective
  (``coll_id``); compute = every other kernel; ``gpu_memcpy`` / ``gpu_memset`` are ``memory``
  (neither C nor K, as in HTA; copy engines do not occupy SMs). The anchor of a device interval is
  the start of the runtime call that launched it (``launch_id``), or its own start without one;
  ``launch_end_ns`` is that call's end (null without one): work that sat queued after it was launched
  waited for the device, not the host (:mod:`ep_trace.analysis.graph`, cause ``queued``).
* **CPU ranks** (gloo): the "device" is the compute thread plus the comm workers. comm = the gloo
  worker ranges (``comm_worker``) plus the caller-side collective op range (``c10d::alltoall_base_``
  blocks the caller until the transfer is done, so the caller is communicating, not computing);
  compute = the union of ``cpu_op`` ranges on the compute thread (the thread of ``ProfilerStep``)
  minus the collective op ranges, leaving out the ops that enclose a collective call (their self
  time is a blocking ``work.wait()`` that gloo records as no op of its own). Anchors: the collective's host start for comm, the start for
  compute.

Every interval also carries ``anchor_tid``, the host thread of its anchor (the launching thread,
the thread of the collective op, the compute thread): stage attribution only looks at ranges of
that thread, so a kernel launched by the autograd thread is never charged to a range that happens
to be open on the main thread.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import subtract
from ep_trace.comm_classifier import is_comm_expr

__all__ = ["device_activity", "ACT_COLS"]

ACT_COLS = [
    "rank",
    "cls",
    "name",
    "start_ns",
    "end_ns",
    "anchor_ns",
    "anchor_tid",
    "coll_id",
    "stream",
    "launch_end_ns",
]


def _gpu(ev: pl.DataFrame, gpu_ranks: pl.Series) -> pl.DataFrame:
    # lazy: only the columns read below are gathered, not every column of the events table
    dev = (
        ev.lazy()
        .filter(
            pl.col("rank").is_in(gpu_ranks.implode()) & pl.col("kind").is_in(["gpu_kernel", "gpu_memcpy", "gpu_memset"])
        )
        .select("rank", "kind", "name", "start_ns", "end_ns", "launch_id", "coll_id", "stream")
        .collect()
    )
    launches = (
        ev.lazy()
        .filter(pl.col("kind") == "runtime")
        .select(
            "rank",
            pl.col("event_id").alias("launch_id"),
            pl.col("start_ns").alias("_launch_ns"),
            pl.col("end_ns").alias("launch_end_ns"),
            pl.col("tid").alias("anchor_tid"),
        )
        .collect()
    )
    dev = dev.join(launches, on=["rank", "launch_id"], how="left")
    # classify each distinct kernel name once (a trace repeats a few hundred names millions of times)
    names = dev.select(pl.col("name").unique()).with_columns(is_comm_expr(pl.col("name")).alias("_comm"))
    dev = dev.join(names, on="name", how="left")
    cls = (
        pl.when(pl.col("kind") != "gpu_kernel")
        .then(pl.lit("memory"))
        .when(pl.col("_comm") | pl.col("coll_id").is_not_null())
        .then(pl.lit("comm"))
        .otherwise(pl.lit("compute"))
    )
    return dev.select(
        "rank",
        cls.alias("cls"),
        "name",
        "start_ns",
        "end_ns",
        pl.coalesce("_launch_ns", "start_ns").alias("anchor_ns"),
        "anchor_tid",
        "coll_id",
        "stream",
        "launch_end_ns",
    )


def compute_threads(ev: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The compute thread of every rank: the ``ProfilerStep`` thread, else the busiest cpu_op thread."""
    step_tid = windows.filter(pl.col("tid").is_not_null()).group_by("rank").agg(pl.col("tid").first())
    busiest = (
        ev.filter(pl.col("kind") == "cpu_op")
        .group_by(["rank", "tid"])
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_d"))
        .sort(["rank", "_d", "tid"], descending=[False, True, False])
        .unique("rank", keep="first")
        .select("rank", "tid")
    )
    return pl.concat([step_tid, busiest.join(step_tid, on="rank", how="anti")])


def _without_collective_wrappers(ops: pl.DataFrame, callers: pl.DataFrame) -> pl.DataFrame:
    """Drop the ops that enclose a collective call on the same thread.

    Such a wrapper (a custom autograd Function around an all-to-all: ``_A2A``, ``autograd::engine::
    evaluate_function: _A2ABackward``) spends its self time in ``work.wait()``, which gloo records
    as no op of its own (torch 2.13): counting it as compute would turn a synchronous all-to-all
    into "overlap". Its real compute children are ops of their own and stay.
    """
    starts = (
        callers.filter(pl.col("anchor_tid").is_not_null())
        .select("rank", pl.col("anchor_tid").alias("tid"), pl.col("start_ns").alias("_cs"))
        .sort("_cs")
        .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(["rank", "tid"]).alias("_n"))
    )
    if starts.height == 0:
        return ops
    ops = ops.with_row_index("_row").with_columns(pl.col("end_ns").alias("_end"))
    before = ops.sort("start_ns").join_asof(
        starts.rename({"_n": "_n0"}),
        left_on="start_ns",
        right_on="_cs",
        by=["rank", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    upto = before.sort("_end").join_asof(
        starts.rename({"_n": "_n1", "_cs": "_ce"}),
        left_on="_end",
        right_on="_ce",
        by=["rank", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    # collectives starting in [start, end]: those counted by `end` minus those before `start`
    # (an op that *starts with* the collective, i.e. the collective op itself, is subtracted later)
    inside = pl.col("_n1").fill_null(0) - pl.col("_n0").fill_null(0)
    keep = upto.filter(inside == 0).get_column("_row")
    return ops.filter(pl.col("_row").is_in(keep.implode())).drop("_row", "_end")


def _cpu(ev: pl.DataFrame, coll: pl.DataFrame, cpu_ranks: pl.Series, windows: pl.DataFrame) -> pl.DataFrame:
    ev = ev.filter(pl.col("rank").is_in(cpu_ranks.implode()))
    coll = coll.filter(pl.col("rank").is_in(cpu_ranks.implode()))
    # the caller's thread anchors the collective (its op row), so attribution stays on that thread
    op_tid = ev.select("rank", pl.col("event_id").alias("op_id"), pl.col("tid").alias("_otid"))
    coll = coll.join(op_tid, on=["rank", "op_id"], how="left")
    workers = ev.filter(pl.col("kind") == "comm_worker").join(
        coll.select("rank", "coll_id", pl.col("cpu_start_ns").alias("_cs"), "_otid"), on=["rank", "coll_id"], how="left"
    )
    w = workers.select(
        "rank",
        pl.lit("comm").alias("cls"),
        "name",
        "start_ns",
        "end_ns",
        pl.coalesce("_cs", "start_ns").alias("anchor_ns"),
        pl.col("_otid").alias("anchor_tid"),
        "coll_id",
        pl.lit(None, pl.Int64).alias("stream"),
        pl.lit(None, pl.Int64).alias("launch_end_ns"),
    )
    callers = coll.filter(pl.col("cpu_start_ns").is_not_null() & pl.col("cpu_end_ns").is_not_null()).select(
        "rank",
        pl.lit("comm").alias("cls"),
        pl.col("op_name").alias("name"),
        pl.col("cpu_start_ns").alias("start_ns"),
        pl.col("cpu_end_ns").alias("end_ns"),
        pl.col("cpu_start_ns").alias("anchor_ns"),
        pl.col("_otid").alias("anchor_tid"),
        "coll_id",
        pl.lit(None, pl.Int64).alias("stream"),
        pl.lit(None, pl.Int64).alias("launch_end_ns"),
    )
    tids = compute_threads(ev, windows)
    ops = _without_collective_wrappers(
        ev.filter(pl.col("kind") == "cpu_op").join(tids, on=["rank", "tid"], how="semi"), callers
    )
    pieces = subtract(ops.select("rank", "start_ns", "end_ns"), callers.select("rank", "start_ns", "end_ns"), ["rank"])
    k = pieces.join(tids, on="rank", how="left").select(
        "rank",
        pl.lit("compute").alias("cls"),
        pl.lit("cpu compute").alias("name"),
        "start_ns",
        "end_ns",
        pl.col("start_ns").alias("anchor_ns"),
        pl.col("tid").alias("anchor_tid"),
        pl.lit(None, pl.Int64).alias("coll_id"),
        pl.lit(None, pl.Int64).alias("stream"),
        pl.lit(None, pl.Int64).alias("launch_end_ns"),
    )
    return pl.concat([w, callers, k], how="vertical_relaxed")


def device_activity(
    events: pl.DataFrame, collectives: pl.DataFrame, windows: pl.DataFrame
) -> tuple[pl.DataFrame, dict[int, str]]:
    """Classified device intervals of every rank.

    Args:
        events: Canonical events table.
        collectives: Canonical collectives table.
        windows: Step windows (:func:`ep_trace.analysis.steps.step_windows`).

    Returns:
        ``(activity, mode)``: activity has columns :data:`ACT_COLS` (``cls`` in ``comm`` /
        ``compute`` / ``memory``; times epoch ns); ``mode`` maps rank -> ``'gpu'`` or ``'cpu'``.
    """
    ranks = events["rank"].unique()
    gpu_ranks = events.filter(pl.col("kind") == "gpu_kernel")["rank"].unique()
    cpu_ranks = ranks.filter(~ranks.is_in(gpu_ranks.implode()))
    parts = []
    if gpu_ranks.len():
        parts.append(_gpu(events, gpu_ranks))
    if cpu_ranks.len():
        parts.append(_cpu(events, collectives, cpu_ranks, windows))
    mode = {int(r): "gpu" for r in gpu_ranks} | {int(r): "cpu" for r in cpu_ranks}
    if not parts:
        return pl.DataFrame(
            schema={
                "rank": pl.Int32,
                "cls": pl.Utf8,
                "name": pl.Utf8,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
                "anchor_ns": pl.Int64,
                "anchor_tid": pl.Int64,
                "coll_id": pl.Int64,
                "stream": pl.Int64,
                "launch_end_ns": pl.Int64,
            }
        ), mode
    act = pl.concat(parts, how="vertical_relaxed").with_columns(pl.col("rank").cast(pl.Int32))
    return act.filter(pl.col("end_ns") > pl.col("start_ns")), mode

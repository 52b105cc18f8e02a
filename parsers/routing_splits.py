"""Count matrix from collective split lists, for trace directories without an ep-trace sidecar.

Without a sidecar each token all-to-all(v) must be labelled dispatch or combine from the trace:

1. By the stage range around it: when the call's host op runs inside an ep-trace stage range
   (``ep:dispatch:l3:mb1:fwd``, :mod:`ep_trace.stage_names`) on its thread, the range names the
   direction, the layer and the micro-batch, exactly as the sidecar would.
2. Otherwise by structure, per rank and profiler step, in host order: a call whose send splits equal
   the receive splits of an earlier dispatch not yet combined is the combine of the earliest such
   dispatch (combine returns exactly what dispatch delivered; first in, first out, which also pairs
   chunked pipelines ``d0 d1 c0 d2 c1 ...``); every other call is a dispatch. When routing is
   symmetric (each send list equals its receive list) chunked dispatches are indistinguishable from
   combines this way; only the stage ranges (or the sidecar) can tell them apart.

Left out: calls with integer dtypes (count exchanges: split sizes, not tokens); truncated lists
(``splits_truncated``), rather than guessed; and the backward pass's transposed all-to-alls, which
carry gradients back along the same routes (a ``:bwd`` stage range, or a host op inside torch's
``autograd::engine::evaluate_function:`` range) -- as in the sidecar path. ``layer`` is None and
``call`` is the ordinal of the call within (step, direction) when no stage range names the layer.
``source = 'splits'``.
"""

from __future__ import annotations

import polars as pl

from ep_trace import schema
from ep_trace.dtypes import INTEGER_DTYPES
from ep_trace.parsers.kineto_links import innermost_enclosing
from ep_trace.stage_names import STAGE_NAME_RE

__all__ = ["routing_from_splits"]

_THREAD = ("rank", "pid", "tid")
# torch's autograd engine wraps every backward node in this CPU op (torch 1.x-2.13)
_BACKWARD_OP = "autograd::engine::evaluate_function:"


def _enclosing(points: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """``coll_id``, ``rank`` and the innermost of ``ranges`` (``op`` = its event_id) around each point."""
    got = innermost_enclosing(
        points, ranges.select(*_THREAD, "start_ns", "end_ns", pl.col("event_id").alias("op")), key=_THREAD
    )
    return got.select("rank", "coll_id", "op")


def _labels(calls: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Per call (rank, coll_id): ``ep_stage``, ``ep_layer``, ``ep_mb``, ``ep_phase`` of the innermost
    ep-trace stage range around its host op, and ``in_backward`` (inside autograd's engine)."""
    # lazy selections: only the few columns needed are read from the (possibly 10M-row) events frame
    lev = events.lazy()
    ops = lev.select("rank", pl.col("event_id").alias("op_id"), *_THREAD[1:], pl.col("start_ns").alias("t"))
    host = lev.filter(pl.col("kind").is_in(["cpu_op", "cpu_annotation"])).select(
        "rank", "event_id", "name", *_THREAD[1:], "start_ns", "end_ns"
    )
    points, stage_ranges, bwd_ranges = pl.collect_all(
        [
            calls.lazy().select("rank", "coll_id", "op_id").join(ops, on=["rank", "op_id"], how="inner").drop("op_id"),
            host.filter(pl.col("name").str.starts_with("ep:") & pl.col("name").str.contains(STAGE_NAME_RE.pattern)),
            host.filter(pl.col("name").str.starts_with(_BACKWARD_OP)),
        ]
    )
    stage = (
        _enclosing(points, stage_ranges)
        .join(
            stage_ranges.select(
                "rank",
                pl.col("event_id").alias("op"),
                pl.col("name").str.extract_groups(STAGE_NAME_RE.pattern).alias("_g"),
            ),
            on=["rank", "op"],
            how="left",
        )
        .select(
            "rank",
            "coll_id",
            pl.col("_g").struct.field("stage").alias("ep_stage"),
            pl.col("_g").struct.field("layer").cast(pl.Int32).alias("ep_layer"),
            pl.col("_g").struct.field("microbatch").cast(pl.Int32).alias("ep_mb"),
            pl.col("_g").struct.field("phase").alias("ep_phase"),
        )
    )
    bwd = _enclosing(points, bwd_ranges).select("rank", "coll_id", pl.col("op").is_not_null().alias("in_backward"))
    return stage.join(bwd, on=["rank", "coll_id"], how="left")


def _fifo_directions(in_splits: list[list[int]], out_splits: list[list[int] | None]) -> list[str]:
    """Structural rule 2 of the module doc for the calls of one (rank, step), in host order.

    A plain loop over calls (tens per step), not over events."""
    open_: list[tuple[int, ...] | None] = []  # receive splits of dispatches not yet combined
    out = []
    for send, recv in zip(in_splits, out_splits, strict=False):
        key = tuple(send)
        j = next((i for i, o in enumerate(open_) if o == key), None)
        if j is None:
            out.append("dispatch")
            open_.append(tuple(recv) if recv is not None else None)
        else:
            out.append("combine")
            del open_[j]
    return out


def routing_from_splits(collectives: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``routing_matrix`` rows (source 'splits') from the all_to_allv calls of one or more ranks.

    Args:
        collectives: Canonical collectives table.
        events: Canonical events table (its ``ProfilerStep#N`` rows give the step of each call, its
            stage ranges the direction, layer and micro-batch where present).

    Returns:
        A conformed ``routing_matrix`` frame (possibly empty).
    """
    c = collectives.filter(
        (pl.col("collective") == "all_to_allv")
        & pl.col("in_splits").is_not_null()
        & ~pl.col("splits_truncated")
        & pl.col("group_ranks").is_not_null()
        & (pl.col("in_splits").list.len() == pl.col("group_ranks").list.len())
        & (pl.col("dtype").is_null() | ~pl.col("dtype").is_in(sorted(INTEGER_DTYPES)))
    )
    if c.height == 0:
        return schema.empty("routing_matrix")
    steps = (
        events.filter(pl.col("seq").is_not_null())
        .select("rank", pl.col("start_ns").alias("_s0"), pl.col("end_ns").alias("_s1"), pl.col("seq").alias("step"))
        .sort("_s0")
    )
    t = pl.coalesce("cpu_start_ns", "start_ns").alias("_t")
    c = (
        c.with_columns(t)
        .sort("_t")
        .join_asof(steps, left_on="_t", right_on="_s0", by="rank", strategy="backward", check_sortedness=False)
    )
    c = c.with_columns(pl.when(pl.col("_t") <= pl.col("_s1")).then(pl.col("step")).otherwise(-1).alias("step"))
    c = c.join(_labels(c, events), on=["rank", "coll_id"], how="left")
    c = c.filter((pl.col("ep_phase").fill_null("fwd") == "fwd") & ~pl.col("in_backward").fill_null(False))
    if c.height == 0:
        return schema.empty("routing_matrix")
    c = c.sort("rank", "_t")
    named = pl.col("ep_stage").is_in(["dispatch", "combine"]).fill_null(False)
    rest = c.filter(~named).select("rank", "coll_id", "step", "in_splits", "out_splits")
    fifo = [
        pl.DataFrame(
            {
                "rank": g["rank"],
                "coll_id": g["coll_id"],
                "_fifo": _fifo_directions(g["in_splits"].to_list(), g["out_splits"].to_list()),
            }
        )
        for g in rest.partition_by("rank", "step", maintain_order=True)
    ]
    if fifo:
        c = c.join(pl.concat(fifo), on=["rank", "coll_id"], how="left")
    else:
        c = c.with_columns(pl.lit(None, dtype=pl.Utf8).alias("_fifo"))
    c = c.with_columns(
        pl.when(named).then(pl.col("ep_stage")).otherwise(pl.col("_fifo")).alias("direction"),
        pl.when(named).then(pl.col("ep_layer")).alias("layer"),
        pl.when(named).then(pl.col("ep_mb")).otherwise(0).fill_null(0).cast(pl.Int32).alias("microbatch"),
    )
    # as in the sidecar path: call 0 when the layer is known, else the ordinal within (step, direction)
    c = c.with_columns(
        pl.when(pl.col("layer").is_null())
        .then(pl.int_range(pl.len()).over("rank", "step", "direction", "layer"))
        .otherwise(0)
        .cast(pl.Int64)
        .alias("call"),
    )
    df = c.select(
        "step",
        "layer",
        "microbatch",
        "direction",
        "call",
        "row_bytes",
        pl.col("rank").alias("src"),
        pl.col("in_splits").alias("rows"),
        pl.col("group_ranks").alias("dst"),
    ).explode("rows", "dst")
    return schema.conform("routing_matrix", df.with_columns(pl.lit("splits").alias("source")))

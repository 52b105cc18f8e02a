"""The ops of an MoE layer (tier ``cpu_op``): items of MoE windows, and windows found from ops alone.

The ``[[cpu_op]]`` rows of the knowledge table give each ``aten::`` op a role: ``route`` (``topk``),
``route_aux`` (``softmax``, ``sigmoid``: routing only beside a top-k), ``permute`` (``one_hot``,
``sort``, ``argsort``, ``bincount``, ``histc``, ``where``, ``index``, ``index_select``, ``gather``),
``unpermute`` (``index_add_``, ``scatter_add_``, ``scatter``) and ``expert`` (``linear``, ``mm``,
``bmm``, ``_grouped_mm``: the gate when it runs before the routing).

An op's kernels are the ones it launched (launch -> correlation -> the innermost op enclosing the
launch on the launching thread); so that a whole call counts once, only the *top-level* ops of a
window are its items: an ``aten::linear`` is one item, not also its ``aten::matmul`` and ``aten::mm``.

Windows from ops alone (no module frame, no framework range: CPU-only traces of plain PyTorch MoE,
eager GPU traces without ``with_stack``): on each thread, every top-level ``topk`` opens one, with the
softmax / sigmoid and the linear (the gate) right before it; it runs to the last ``unpermute`` op
before the next ``topk`` (none: to the last expert GEMM), and counts only when an expert GEMM and an
op that moves tokens (a permute or unpermute op) run after the ``topk`` in it: a ``topk`` that samples
tokens, or one followed by a GEMM and nothing that routes tokens, opens no window.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join
from ep_trace.knowledge import first_match_expr, rows

__all__ = ["op_items", "top_level", "items_in", "op_windows"]

_ROLES = tuple((r.stage, r.pattern) for r in rows("cpu_op"))


def op_items(events: pl.DataFrame) -> pl.DataFrame:
    """CPU ops with their role: ``rank, tid, oid, name, role, start_ns, end_ns`` (role null = other)."""
    ops = (
        events.lazy()
        .filter(pl.col("kind") == "cpu_op")
        .select("rank", "tid", pl.col("event_id").alias("oid"), "name", "start_ns", "end_ns")
        .collect()
    )
    roles = ops.select(pl.col("name").unique()).with_columns(first_match_expr(pl.col("name"), _ROLES).alias("role"))
    return ops.join(roles, on="name", how="left")


def top_level(items: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The items not enclosed by an earlier item of the same group (``by``): the outermost calls."""
    it = items.sort([*by, "start_ns", "end_ns"], descending=[False] * len(by) + [False, True])
    prev_end = pl.col("end_ns").cum_max().shift(1).over(by)
    return it.filter(prev_end.is_null() | (pl.col("end_ns") > prev_end) | (pl.col("start_ns") >= prev_end))


def items_in(items: pl.DataFrame, windows: pl.DataFrame, exclude: pl.DataFrame | None = None) -> pl.DataFrame:
    """The top-level items of each window: those starting inside it on its thread, outside the spans of
    ``exclude`` (its child module frames: their ops belong to the child), not the window's own op.

    Args:
        items: ``rank, tid, start_ns, end_ns`` plus payload columns (no ``wid``).
        windows: ``wid, rank, tid, start_ns, end_ns``.
        exclude: ``wid, rank, tid, start_ns, end_ns`` spans whose items are left out.

    Returns:
        ``items`` rows with ``wid``.
    """
    w = windows.select("wid", "rank", "tid", pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"))
    j = range_join(items, w, ("start_ns", "start_ns"), ("_ws", "_we"), by=("rank", "tid"))
    j = j.filter(
        (pl.col("end_ns") <= pl.col("_we"))
        & ~((pl.col("start_ns") == pl.col("_ws")) & (pl.col("end_ns") == pl.col("_we")))
    )
    if exclude is not None and not exclude.is_empty():
        x = exclude.select(
            pl.col("wid").alias("_xw"), "rank", "tid", pl.col("start_ns").alias("_xs"), pl.col("end_ns").alias("_xe")
        )
        keys = j.with_row_index("_k")
        inside = range_join(
            keys.select("_k", "wid", "rank", "tid", "start_ns"),
            x,
            ("start_ns", "start_ns"),
            ("_xs", "_xe"),
            by=("rank", "tid"),
        )
        # half-open spans: an op starting where a child frame ends is the block's own
        drop = inside.filter((pl.col("_xw") == pl.col("wid")) & (pl.col("start_ns") < pl.col("_xe")))["_k"]
        j = keys.filter(~pl.col("_k").is_in(drop.implode())).drop("_k")
    return top_level(j.drop("_ws", "_we"), ["wid"])


def op_windows(ops: pl.DataFrame, taken: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Windows found from ops alone (the module doc's rule), on ops outside the ``taken`` windows.

    Args:
        ops: :func:`op_items`.
        taken: ``rank, tid, start_ns, end_ns`` of the windows already found (blocks, containers).

    Returns:
        ``(windows, items)``: windows ``wid, rank, tid, start_ns, end_ns`` (``wid`` from 0) and their
        items ``wid, rank, tid, start_ns, end_ns, role``.
    """
    if not bool((ops.get_column("role") == "route").any()):
        # every window opens at a routing op (``_k`` below counts them): with none there is no window,
        # and a trace without MoE skips the sort of all its CPU ops (0.23 s of an_dlrm8's 2.6 s analysis)
        ops = ops.head(0)
    top = top_level(ops, ["rank", "tid"])
    if not taken.is_empty():
        t = taken.select("rank", "tid", pl.col("start_ns").alias("_ts"), pl.col("end_ns").alias("_te"))
        inside = range_join(
            top.select("rank", "tid", "oid", "start_ns"),
            t,
            ("start_ns", "start_ns"),
            ("_ts", "_te"),
            by=("rank", "tid"),
        )
        top = top.filter(~pl.col("oid").is_in(inside["oid"].implode()))
    top = top.sort("rank", "tid", "start_ns").with_columns(pl.int_range(pl.len()).over("rank", "tid").alias("_i"))
    role = pl.col("role").fill_null("")  # an op without a role is "other": never null in the window logic
    g = ["rank", "tid"]
    # the gate and the score function right before each topk belong to its window
    lead = (
        ((role == "route_aux") & (role.shift(-1).over(g) == "route"))
        | ((role == "expert") & (role.shift(-1).over(g) == "route"))
        | ((role == "expert") & (role.shift(-1).over(g) == "route_aux") & (role.shift(-2).over(g) == "route"))
    )
    opened = (role == "route").cast(pl.Int32).cum_sum().over(g)
    ahead = pl.when(lead).then(1).otherwise(0)
    top = top.with_columns((opened + ahead).alias("_k")).filter(pl.col("_k") > 0)
    k = [*g, "_k"]
    top = top.with_columns(
        pl.when(role == "route").then(pl.col("_i")).min().over(k).alias("_t"),
        pl.when(role == "unpermute").then(pl.col("_i")).max().over(k).alias("_u"),
        pl.when(role == "expert").then(pl.col("_i")).max().over(k).alias("_x"),
    )
    # an expert GEMM and a token move (permute / unpermute op) after the topk; the window ends at its
    # last unpermute op (else its last GEMM)
    after = pl.col("_i") > pl.col("_t")

    def seen(cond: pl.Expr) -> pl.Expr:
        return pl.when(cond & after).then(1).otherwise(0).sum().over(k) > 0

    moved = seen(role.is_in(["permute", "unpermute"]))
    last = pl.coalesce(pl.col("_u"), pl.col("_x"))
    items = top.filter(seen(role == "expert") & moved & (pl.col("_i") <= last))
    windows = (
        items.group_by(k)
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .sort(k)
        .with_row_index("wid")
        .with_columns(pl.col("wid").cast(pl.Int64))
    )
    items = items.join(windows.select(*k, "wid"), on=k).select("wid", "rank", "tid", "start_ns", "end_ns", "role")
    return windows.select("wid", "rank", "tid", "start_ns", "end_ns"), items

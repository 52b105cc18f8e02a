"""The dependency graph of each profiler step across ranks: the causal model behind the verdict.

Nodes (one row each in :attr:`StepGraph.nodes`, times on the aligned clock):

* **call** — a rank's part in a matched, valid collective instance (``analysis.matching``): the
  rank starts it at ``s_r``; no rank leaves before the last arrival it depends on (``a_r``: the
  call's last start, or the last start among the peers it exchanges rows with for an all-to-allv);
  it then spends its measured wait-free transfer ``e_r - max(s_r, a_r)``. This is the only
  cross-rank edge: on GPU ranks it joins the ranks' comm kernels, on CPU ranks (gloo) the worker
  ranges (``analysis.activity``).
* **local** — communication that cannot be joined across ranks (a call missing ranks of its group,
  a non-causal or unmatched one): it keeps its measured length and synchronises nothing.
* **end** — the rank's step end (the ``ProfilerStep`` host range end).

Each call / local / end node has one same-rank predecessor: the node of that rank and step with
the latest end at or before its start (the step start when none), i.e. stream / thread order of
the comm with overlapping comm on other streams left independent. The time between the
predecessor's end and the node's start is the node's **lead gap**: work the rank does before it can
start the node. Lead gaps are measured edges, decomposed into ``compute`` per stage and layer (the
rank's compute intervals, coalesced: one piece per contiguous compute run and stage, never one node
per kernel), ``copy`` (device memcpy / memset where no kernel computes), ``host_stall`` (blocking
host calls while the device idles, ``analysis.host_stalls``) and ``launch_gap`` (none of these:
launch latency, Python, idle) in :attr:`StepGraph.work`.

Replaying the graph with the measured gaps and transfers reproduces every measured start, end and
step end (:mod:`ep_trace.analysis.replay`); edits of the gaps and transfers are the what-ifs
(:mod:`ep_trace.analysis.whatif`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ep_trace.analysis.intervals import range_join, union
from ep_trace.analysis.queued import split_at_launch

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["StepGraph", "build_graph", "WORK_SCHEMA"]

_NODE_SCHEMA: dict[str, PolarsDataType] = {
    "node": pl.Int64,
    "rank": pl.Int32,
    "step": pl.Int64,
    "kind": pl.Utf8,
    "match_id": pl.Int64,
    "collective": pl.Utf8,
    "direction": pl.Utf8,
    "layer": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "arrival_ns": pl.Int64,
    "transfer_ns": pl.Int64,
    "full": pl.Boolean,
    "waited_for": pl.Int32,
    "slack_ns": pl.Int64,
}
_COLS: dict[str, PolarsDataType] = {k: v for k, v in _NODE_SCHEMA.items() if k != "node"}


@dataclass(frozen=True)
class StepGraph:
    """The per-step dependency graph of a trace set.

    Attributes:
        nodes: One row per node: ``node`` (id, row order), ``rank, step, kind`` ('call' | 'local' |
            'end'), ``match_id``, ``collective, direction, layer``, ``start_ns, end_ns`` (aligned
            clock; the step end for 'end' nodes), ``arrival_ns`` (a_r of a call), ``transfer_ns``
            (wait-free transfer of a call; the measured length of a local node; 0 for 'end'),
            ``full`` (a_r is the call's last start, so every rank of the call is a dependency),
            ``waited_for`` (the rank that arrived at a_r), ``slack_ns`` (<= 0: the rank ended that
            long before a_r, within the clock tolerance; its replayed arrival is a_r + slack), ``pred`` (same-rank predecessor node,
            -1 = the step start), ``peer`` (node of ``waited_for`` in the same call, -1 if none),
            ``gap_ns`` (lead gap), ``group`` (nodes joined by one call share it).
        starts: ``rank, step, start_ns, end_ns`` (aligned step windows; ``rs`` = row index).
        work: Decomposition of the lead gaps (:data:`WORK_SCHEMA`): ``node, rank, cause`` (an Enum of
            :data:`WORK_CAUSES`: 'compute' | 'copy' | 'host_stall' | 'launch_gap' | 'queued'), ``stage``
            (nullable Categorical), ``layer`` (nullable),
            ``start_ns, end_ns`` (aligned, disjoint within a node; they tile its gap). A piece's
            step is its node's (``nodes["step"][node]``).
    """

    nodes: pl.DataFrame
    starts: pl.DataFrame
    work: pl.DataFrame


def _call_nodes(calls: pl.DataFrame, call_ranks: pl.DataFrame) -> pl.DataFrame:
    """call / local nodes from the matched calls (aligned clock)."""
    info = calls.select("match_id", "collective", "direction", "layer", "valid", pl.col("arrival_ns").alias("_ga"))
    cr = call_ranks.filter(pl.col("step").is_not_null()).join(info, on="match_id", how="inner")
    sync = pl.col("valid")
    # a rank that ended before the last arrival (within the clock tolerance the call was accepted
    # with: the aligned clocks are off by that much) left that much "early": kept as a negative
    # slack on its arrival so that the replay reproduces it instead of pushing the rank late
    slack = (pl.col("end_ns") - pl.col("arrival_ns")).clip(upper_bound=0)
    return cr.select(
        "rank",
        "step",
        pl.when(sync).then(pl.lit("call")).otherwise(pl.lit("local")).alias("kind"),
        "match_id",
        "collective",
        "direction",
        "layer",
        "start_ns",
        # a zero-length call still orders strictly after its predecessor (1 ns, below any clock)
        pl.max_horizontal("end_ns", pl.col("start_ns") + 1).alias("end_ns"),
        pl.when(sync).then(pl.col("arrival_ns")).otherwise(pl.col("start_ns")).alias("arrival_ns"),
        pl.when(sync)
        .then((pl.col("end_ns") - pl.max_horizontal("start_ns", pl.col("arrival_ns") + slack)).clip(0))
        .otherwise(pl.max_horizontal(pl.col("end_ns") - pl.col("start_ns"), pl.lit(1)))
        .alias("transfer_ns"),
        (sync & (pl.col("arrival_ns") >= pl.col("_ga"))).alias("full"),
        pl.when(sync).then(pl.col("waited_for")).otherwise(pl.col("rank")).alias("waited_for"),
        pl.when(sync).then(slack).otherwise(0).alias("slack_ns"),
    )


#: Values of ``StepGraph.work.cause``.
WORK_CAUSES = ("compute", "copy", "host_stall", "launch_gap", "queued")
#: Columns of ``StepGraph.work``: 33 bytes a piece (2.3 M pieces over 4,096 param DLRM ranks: ~76 MB,
#: the largest table of the analysis). An Enum / a Categorical: 1 / 4 bytes a row where a String
#: costs 16, compared with literals as strings are; ``node`` fits 32 bits (one node per call and
#: rank), and the piece's rank and step are its node's (a gap is tiled with its own rank's work):
#: no ``step`` column (8 bytes a piece), read through ``node`` from ``nodes`` where needed.
WORK_SCHEMA: dict[str, PolarsDataType] = {
    "node": pl.Int32,
    "rank": pl.Int32,
    "cause": pl.Enum(WORK_CAUSES),
    "stage": pl.Categorical(),
    "layer": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}


def build_graph(
    windows: pl.DataFrame,
    offsets: pl.DataFrame,
    calls: pl.DataFrame,
    call_ranks: pl.DataFrame,
    activity: pl.DataFrame | Iterator[pl.DataFrame],
    stages: pl.DataFrame,
    stalls: pl.DataFrame,
    unmatched: pl.DataFrame | None = None,
    rank_blocks: Sequence[tuple[int, int]] = (),
) -> StepGraph:
    """Build the dependency graph of every analysed step.

    Args:
        windows: Step windows (``rank, step, start_ns, end_ns``; the rank's own clock).
        offsets: ``rank, offset_ns`` (clock alignment added to the rank's times).
        calls: ``Analysis.calls``.
        call_ranks: ``Analysis.call_ranks`` (aligned clock).
        activity: Device activity (``analysis.activity``; own clock) with ``cls``; or an iterator of
            its rows per rank block, in ``rank_blocks`` order (one frame for all ranks when
            ``rank_blocks`` has at most one block): each block's rows are read once, so a caller that
            keeps no other reference (:func:`ep_trace.analysis.rank_pass.drain_blocks`) frees them as
            the work pieces grow.
        stages: Stage rows (own clock): ``rank, stage, layer, cpu_start_ns, cpu_end_ns, start_ns, end_ns``.
        stalls: Host stalls (own clock): ``rank, start_ns, end_ns`` (the device-idle blocking calls).
        unmatched: Collectives that could not be matched (``rank, step, collective, start_ns,
            end_ns``; own clock): kept as local nodes.
        rank_blocks: Inclusive rank ranges (:func:`ep_trace.analysis.rank_pass.rank_blocks`): the
            work pieces (rank-local: a node's gap is tiled with its own rank's activity) are built
            one block at a time, so their intermediates never hold every rank's activity at once.
            Empty: all ranks together. The result is the same.

    Returns:
        The :class:`StepGraph`.
    """
    off = offsets.select(pl.col("rank").cast(pl.Int32), pl.col("offset_ns").fill_null(0))
    starts = (
        windows.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), "start_ns", "end_ns")
        .join(off, on="rank", how="left")
        .select(
            "rank",
            "step",
            (pl.col("start_ns") + pl.col("offset_ns").fill_null(0)).alias("start_ns"),
            (pl.col("end_ns") + pl.col("offset_ns").fill_null(0)).alias("end_ns"),
        )
        .sort("rank", "step")
    )
    parts = [_call_nodes(calls, call_ranks)] if calls.height else []
    if unmatched is not None and unmatched.height:
        u = unmatched.filter(pl.col("step").is_not_null()).join(off, on="rank", how="left")
        s = pl.col("start_ns") + pl.col("offset_ns").fill_null(0)
        e = pl.col("end_ns") + pl.col("offset_ns").fill_null(0)
        parts.append(
            u.select(
                pl.col("rank").cast(pl.Int32),
                pl.col("step").cast(pl.Int64),
                pl.lit("local").alias("kind"),
                pl.lit(None, pl.Int64).alias("match_id"),
                "collective",
                pl.lit(None, pl.Utf8).alias("direction"),
                pl.lit(None, pl.Int32).alias("layer"),
                s.alias("start_ns"),
                pl.max_horizontal(e, s + 1).alias("end_ns"),
                s.alias("arrival_ns"),
                pl.max_horizontal(e - s, pl.lit(1)).alias("transfer_ns"),
                pl.lit(False).alias("full"),
                pl.col("rank").cast(pl.Int32).alias("waited_for"),
                pl.lit(0, pl.Int64).alias("slack_ns"),
            )
        )
    comm = (
        pl.concat([p.cast(pl.Schema(_COLS), strict=False) for p in parts]).join(
            starts.select("rank", "step"), on=["rank", "step"], how="semi"
        )
        if parts
        else pl.DataFrame(schema=_COLS)
    )
    ends = starts.select(
        "rank",
        "step",
        pl.lit("end").alias("kind"),
        pl.lit(None, pl.Int64).alias("match_id"),
        pl.lit(None, pl.Utf8).alias("collective"),
        pl.lit(None, pl.Utf8).alias("direction"),
        pl.lit(None, pl.Int32).alias("layer"),
        pl.col("end_ns").alias("start_ns"),
        "end_ns",
        pl.col("end_ns").alias("arrival_ns"),
        pl.lit(0, pl.Int64).alias("transfer_ns"),
        pl.lit(False).alias("full"),
        pl.col("rank").alias("waited_for"),
        pl.lit(0, pl.Int64).alias("slack_ns"),
    )
    nodes = (
        pl.concat([comm.select(list(_COLS)), ends.cast(pl.Schema(_COLS))])
        .sort(["rank", "step", "start_ns", "end_ns"])
        .with_row_index("node")
        .with_columns(pl.col("node").cast(pl.Int64))
    )
    nodes = _link(nodes, starts)

    def of(df: pl.DataFrame, b: tuple[int, int]) -> pl.DataFrame:
        return df.filter(pl.col("rank").is_between(b[0], b[1]))

    def act_of(b: tuple[int, int] | None) -> pl.DataFrame:
        """The activity of block ``b`` (None: all ranks): the iterator's next frame, or a filter."""
        if isinstance(activity, Iterator):
            return next(activity)
        return activity if b is None else of(activity, b)

    if len(rank_blocks) > 1:
        # node ids grow with the rank (nodes are sorted by rank first): the blocks' works, each sorted
        # by node, concatenate in node order

        work = pl.concat(
            [_work(of(nodes, b), starts, off, act_of(b), of(stages, b), of(stalls, b)) for b in rank_blocks]
        )
    else:
        work = _work(nodes, starts, off, act_of(None), stages, stalls)
    return StepGraph(nodes=nodes, starts=starts, work=work)


def _link(nodes: pl.DataFrame, starts: pl.DataFrame) -> pl.DataFrame:
    """pred (latest same-rank end at or before the start), lead gap, peer node, call group."""
    comm = nodes.filter(pl.col("kind") != "end").select(
        "rank", "step", pl.col("node").alias("pred"), pl.col("end_ns").alias("_pe")
    )
    q = nodes.select("node", "rank", "step", "start_ns").sort("start_ns")
    j = q.join_asof(
        comm.sort("_pe"),
        left_on="start_ns",
        right_on="_pe",
        by=["rank", "step"],
        strategy="backward",
        check_sortedness=False,
    ).select("node", "pred", "_pe")
    st = starts.select("rank", "step", pl.col("start_ns").alias("_ss"))
    out = nodes.join(j, on="node", how="left").join(st, on=["rank", "step"], how="left")
    out = out.with_columns(
        pl.col("pred").fill_null(-1),
        (pl.col("start_ns") - pl.coalesce("_pe", "_ss")).alias("gap_ns"),
    ).drop("_pe", "_ss")
    peers = out.filter(pl.col("kind") == "call").select(
        "match_id", pl.col("rank").alias("waited_for"), pl.col("node").alias("peer")
    )
    out = out.join(peers, on=["match_id", "waited_for"], how="left").with_columns(pl.col("peer").fill_null(-1))
    grp = pl.when(pl.col("kind") == "call").then(pl.col("match_id")).otherwise(-1 - pl.col("node"))
    out = out.with_columns(grp.alias("_g"))
    gid = out.select("_g").unique().sort("_g").with_row_index("group").with_columns(pl.col("group").cast(pl.Int64))
    return out.join(gid, on="_g").drop("_g").sort("node")


def _within(iv: pl.DataFrame, free: pl.DataFrame) -> pl.DataFrame:
    """The parts of ``iv`` (``node, rank, start_ns, end_ns``) inside the ``free`` spans of the same node."""
    j = range_join(
        iv,
        free.rename({"start_ns": "f_s", "end_ns": "f_e"}).drop("rank"),
        ("start_ns", "end_ns"),
        ("f_s", "f_e"),
        by=("node",),
    )
    return union(
        j.select(
            "node",
            "rank",
            pl.max_horizontal("start_ns", "f_s").alias("start_ns"),
            pl.min_horizontal("end_ns", "f_e").alias("end_ns"),
        ).filter(pl.col("end_ns") > pl.col("start_ns")),
        ["node", "rank"],
    )


def _work(
    nodes: pl.DataFrame,
    starts: pl.DataFrame,
    off: pl.DataFrame,
    activity: pl.DataFrame,
    stages: pl.DataFrame,
    stalls: pl.DataFrame,
) -> pl.DataFrame:
    """Tile every lead gap with compute / copy / host_stall / launch_gap pieces, split by stage windows."""
    schema = WORK_SCHEMA
    g = nodes.filter(pl.col("gap_ns") > 0).select(
        "node", "rank", "step", (pl.col("start_ns") - pl.col("gap_ns")).alias("g_s"), pl.col("start_ns").alias("g_e")
    )
    if g.is_empty():
        return pl.DataFrame(schema=schema)
    to_aligned = lambda df: (  # noqa: E731
        df.join(off, on="rank", how="left").with_columns(
            pl.col("start_ns") + pl.col("offset_ns").fill_null(0), pl.col("end_ns") + pl.col("offset_ns").fill_null(0)
        )
    ).drop("offset_ns")
    comp = union(
        to_aligned(
            activity.filter(pl.col("cls") == "compute").select(pl.col("rank").cast(pl.Int32), "start_ns", "end_ns")
        ),
        ["rank"],
    )
    mem = union(
        to_aligned(
            activity.filter(pl.col("cls") == "memory").select(pl.col("rank").cast(pl.Int32), "start_ns", "end_ns")
        ),
        ["rank"],
    )
    stl = to_aligned(stalls.select(pl.col("rank").cast(pl.Int32), "start_ns", "end_ns"))

    def clip_to_gaps(iv: pl.DataFrame) -> pl.DataFrame:
        j = range_join(g, iv.rename({"start_ns": "i_s", "end_ns": "i_e"}), ("g_s", "g_e"), ("i_s", "i_e"))
        return j.select(
            "node",
            "rank",
            pl.max_horizontal("g_s", "i_s").alias("start_ns"),
            pl.min_horizontal("g_e", "i_e").alias("end_ns"),
        ).filter(pl.col("end_ns") > pl.col("start_ns"))

    spans = g.select("node", "rank", pl.col("g_s").alias("start_ns"), pl.col("g_e").alias("end_ns"))
    c = clip_to_gaps(comp)  # disjoint within a node: the rank's compute union, clipped
    # device copies / memsets where no kernel computes: device work too (a blocking cudaMemcpy's H2D
    # copy is the copy's time, not a stall: nsys pipit_saxpy, 286 ms of copies under 15 cudaMemcpy)
    cp = _within(clip_to_gaps(mem), _holes(spans, c, "node")) if mem.height else c.head(0)
    dev = union(pl.concat([c, cp.select(c.columns)]), ["node", "rank"]) if cp.height else c
    # device idle whose next work was already launched is the device's own wait (queued), even under a
    # blocking host call: the call waits for that same queue (an MI300X SGLang decode trace: a 463 ms
    # hipMemcpyWithStream behind a hipStreamWaitEvent; removing the call would start nothing sooner)
    free, queued = split_at_launch(_holes(spans, dev, "node"), activity, off)
    if stl.height:
        # stall = blocking call with no device work (or queued work) under it
        h = _within(clip_to_gaps(stl), free)
    else:
        h = c.head(0)
    busy = union(pl.concat([dev, h.select(c.columns), queued.select(c.columns)]), ["node", "rank"])
    idle = _holes(spans, busy, "node")
    pieces = pl.concat(
        [
            c.with_columns(pl.lit("compute").alias("cause")),
            cp.select(c.columns).with_columns(pl.lit("copy").alias("cause")),
            h.select(c.columns).with_columns(pl.lit("host_stall").alias("cause")),
            idle.select(c.columns).with_columns(pl.lit("launch_gap").alias("cause")),
            queued.select(c.columns).with_columns(pl.lit("queued").alias("cause")),
        ]
    ).with_row_index("pid")
    # stage windows: host ranges on CPU ranks, device windows on GPU ranks (where the stage has work)
    win = to_aligned(
        stages.select(
            pl.col("rank").cast(pl.Int32),
            "stage",
            pl.col("layer").cast(pl.Int32),
            pl.coalesce("start_ns", "cpu_start_ns").alias("start_ns"),
            pl.coalesce("end_ns", "cpu_end_ns").alias("end_ns"),
        )
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
    if win.height:
        j = range_join(pieces, win.rename({"start_ns": "w_s", "end_ns": "w_e"}), ("start_ns", "end_ns"), ("w_s", "w_e"))
        staged = (
            j.select(
                "pid",
                "node",
                "rank",
                "cause",
                "stage",
                "layer",
                pl.max_horizontal("start_ns", "w_s").alias("start_ns"),
                pl.min_horizontal("end_ns", "w_e").alias("end_ns"),
                "w_s",
                "w_e",
            )
            .filter(pl.col("end_ns") > pl.col("start_ns"))
            # overlapping windows: the stage whose part of the piece starts first keeps the shared
            # time; where several start together (the piece began inside all of them) the innermost
            # window wins (latest start, then earliest end), then stage and layer: a total order, so
            # the range join's output order (not deterministic) cannot decide. An expert GEMM of
            # chunk c inside chunk c+1's in-flight dispatch window is expert work
            .sort(
                ["pid", "start_ns", "w_s", "w_e", "stage", "layer"],
                descending=[False, False, True, False, False, False],
                nulls_last=True,
            )
            .with_columns(pl.col("end_ns").cum_max().shift(1).over("pid").alias("_pe"))
            .with_columns(pl.max_horizontal("start_ns", pl.col("_pe").fill_null(0)).alias("start_ns"))
            .filter(pl.col("end_ns") > pl.col("start_ns"))
            .drop("_pe", "w_s", "w_e")
        )
        rest = _holes(
            pieces.select("pid", "rank", "start_ns", "end_ns"),
            staged.select("pid", "rank", "start_ns", "end_ns"),
            "pid",
        ).join(pieces.select("pid", "node", "cause"), on="pid")
        out = pl.concat(
            [
                staged.drop("pid"),
                rest.select(
                    "node",
                    "rank",
                    "cause",
                    pl.lit(None, pl.Utf8).alias("stage"),
                    pl.lit(None, pl.Int32).alias("layer"),
                    "start_ns",
                    "end_ns",
                ),
            ]
        )
    else:
        out = pieces.select(
            "node",
            "rank",
            "cause",
            pl.lit(None, pl.Utf8).alias("stage"),
            pl.lit(None, pl.Int32).alias("layer"),
            "start_ns",
            "end_ns",
        )
    return out.select(list(schema)).cast(pl.Schema(schema)).sort("node", "start_ns")


def _holes(spans: pl.DataFrame, pieces: pl.DataFrame, key: str) -> pl.DataFrame:
    """Parts of each span (one row per ``key``) not covered by its pieces (disjoint, inside the span).

    One sort and a shift per key instead of a general interval difference (``intervals.subtract``
    over millions of one-interval groups costs seconds): the holes are the spaces between consecutive
    pieces, before the first and after the last.
    """
    p = pieces.select(key, "start_ns", "end_ns").sort(key, "start_ns")
    sp = spans.select(key, "rank", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e"))
    inner = (
        # (sorted by key: the previous row's end where it is of the same key; no window per key)
        p.with_columns(pl.when(pl.col(key) == pl.col(key).shift(1)).then(pl.col("end_ns").shift(1)).alias("_pe"))
        .join(sp, on=key)
        .select(key, "rank", pl.coalesce("_pe", "_s").alias("start_ns"), pl.col("start_ns").alias("end_ns"))
    )
    last = p.group_by(key).agg(pl.col("end_ns").max().alias("_le"))
    tail = sp.join(last, on=key, how="left").select(
        key, "rank", pl.coalesce("_le", "_s").alias("start_ns"), pl.col("_e").alias("end_ns")
    )
    return pl.concat([inner, tail]).filter(pl.col("end_ns") > pl.col("start_ns")).sort(key, "start_ns")


def level_order(nodes: pl.DataFrame) -> np.ndarray:
    """Topological level of every node (row order = ``node``): a call group after all its preds.

    Nodes of one call group share a level; a node's level exceeds its predecessor's. Iterates
    ``depth`` vectorised passes (depth = calls per rank and step).
    """
    pred = nodes["pred"].to_numpy()
    group = nodes["group"].to_numpy()
    n = pred.size
    lvl = np.zeros(n, dtype=np.int64)
    has = pred >= 0
    for _ in range(n + 1):
        need = np.zeros(n, dtype=np.int64)
        need[has] = lvl[pred[has]] + 1
        gl = np.zeros(int(group.max()) + 1 if n else 0, dtype=np.int64)
        np.maximum.at(gl, group, need)
        new = gl[group]
        if np.array_equal(new, lvl):
            break
        lvl = new
    return lvl

"""Discrete-event replay of a :class:`~ep_trace.analysis.graph.StepGraph`.

One pass over the nodes in topological level order (a call's ranks share a level; each level is one
vectorised numpy step, so the loop runs once per collective *position*, not per event):

* a node starts after its same-rank predecessor plus its lead gap: ``s = end(pred) + gap``
  (the step start for the first node);
* a call: its rank may leave at ``sync = max(s, a)`` where ``a`` is the latest start among the
  ranks it depends on (every rank of the call when its measured ``a_r`` was the call's last start,
  else the peer it waited for); it ends at ``sync + transfer``;
* a local node ends at ``s + measured length``; the step end is ``end(pred) + gap``.

With the measured gaps and transfers the replay reproduces the measured timeline exactly (a rank
that ended a call before its last arrival, within the clock tolerance, keeps that as a negative
slack on its arrival); :func:`replay_error` reports the error per rank and step. With ``overlap=True`` a transfer runs
behind the work that follows it: the next node starts at ``max(sync + gap, end)`` (the
``full_overlap`` what-if); a per-node hidden fraction ``h`` keeps ``(1 - h) x transfer`` in front of
the next node (a gloo transfer on a rank without a spare core: its CPU time cannot hide).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ep_trace.analysis.graph import StepGraph, level_order

__all__ = ["Replay", "replay", "replay_error", "prepare"]


@dataclass(frozen=True)
class Prepared:
    """numpy views of a graph (row order = node id) shared by every replay of it."""

    pred: np.ndarray
    group: np.ndarray
    peer: np.ndarray
    full: np.ndarray
    sync: np.ndarray
    is_end: np.ndarray
    rs: np.ndarray
    step_start: np.ndarray
    gap: np.ndarray
    transfer: np.ndarray
    slack: np.ndarray
    levels: list[np.ndarray]
    end_nodes: np.ndarray
    t0: int  # times are relative to it: float64 keeps ns exact only below 2**53 (epoch ns are ~2**60)


@dataclass(frozen=True)
class Replay:
    """Replayed times (ns after ``t0`` on the aligned clock; float64) of every node and (rank, step) end."""

    start: np.ndarray
    arrival: np.ndarray
    end: np.ndarray
    step_end: np.ndarray  # per row of StepGraph.starts
    t0: int


def prepare(g: StepGraph) -> Prepared:
    """Arrays and level order of ``g`` (computed once, reused by every what-if)."""
    n = g.nodes
    rs_key = g.starts.select("rank", "step").with_row_index("rs").with_columns(pl.col("rs").cast(pl.Int64))
    rs = n.select("node", "rank", "step").join(rs_key, on=["rank", "step"], how="left").sort("node")["rs"].to_numpy()
    kind = n["kind"].to_numpy()
    is_end = kind == "end"
    lvl = level_order(n)
    lvl = np.where(is_end, -1, lvl)
    comm_idx = np.flatnonzero(~is_end)
    order = comm_idx[np.argsort(lvl[comm_idx], kind="stable")]
    bounds = np.flatnonzero(np.diff(lvl[order])) + 1
    levels = np.split(order, bounds) if order.size else []
    end_nodes = np.full(g.starts.height, -1, dtype=np.int64)
    ei = np.flatnonzero(is_end)
    end_nodes[rs[ei]] = ei
    t0 = int(g.starts["start_ns"].to_numpy().min()) if g.starts.height else 0
    return Prepared(
        pred=n["pred"].to_numpy().astype(np.int64),
        group=n["group"].to_numpy().astype(np.int64),
        peer=n["peer"].to_numpy().astype(np.int64),
        full=n["full"].to_numpy().astype(bool),
        sync=kind == "call",
        is_end=is_end,
        rs=rs.astype(np.int64),
        step_start=(g.starts["start_ns"].to_numpy() - t0).astype(np.float64),
        gap=n["gap_ns"].to_numpy().astype(np.float64),
        transfer=n["transfer_ns"].to_numpy().astype(np.float64),
        slack=n["slack_ns"].to_numpy().astype(np.float64),
        levels=levels,
        end_nodes=end_nodes,
        t0=t0,
    )


def replay(
    p: Prepared,
    gap: np.ndarray | None = None,
    transfer: np.ndarray | None = None,
    overlap: bool | np.ndarray = False,
) -> Replay:
    """Replay with (possibly edited) lead gaps and transfers.

    Args:
        p: :func:`prepare` output.
        gap: Lead gap per node, ns (default: measured).
        transfer: Transfer (call) / length (local) per node, ns (default: measured).
        overlap: Transfers run behind the following work (``full_overlap``). ``True`` hides every
            transfer; an array gives the hidden fraction per node (0..1): the rest of the transfer still
            occupies the rank before its next work (a CPU-executed transfer competing for the cores).

    Returns:
        The replayed :class:`Replay`.
    """
    gap = p.gap if gap is None else gap
    tr = p.transfer if transfer is None else transfer
    nn = p.pred.size
    hide: np.ndarray | None
    if isinstance(overlap, np.ndarray):
        hide = np.clip(overlap.astype(np.float64), 0.0, 1.0)
    else:
        hide = np.ones(nn) if overlap else None
    s = np.zeros(nn)
    a = np.zeros(nn)
    e = np.zeros(nn)
    base = np.zeros(nn)  # what the next node of the rank waits for: e, or the sync point with overlap
    gmax = np.full(int(p.group.max()) + 1 if nn else 0, -np.inf)
    for idx in p.levels:
        pr = p.pred[idx]
        has = pr >= 0
        start0 = p.step_start[p.rs[idx]]
        pb = np.where(has, base[np.maximum(pr, 0)], start0)
        st = pb + gap[idx]
        if hide is not None:
            st = np.maximum(st, np.where(has, e[np.maximum(pr, 0)], start0))
        s[idx] = st
        grp = p.group[idx]
        np.maximum.at(gmax, grp, st)
        pe = p.peer[idx]
        arr = np.where(p.full[idx], gmax[grp], np.where(pe >= 0, s[np.maximum(pe, 0)], st)) + p.slack[idx]
        arr = np.where(p.sync[idx], np.maximum(arr, st), st)
        a[idx] = arr
        e[idx] = arr + tr[idx]
        base[idx] = e[idx] if hide is None else arr + (1.0 - hide[idx]) * tr[idx]
    en = p.end_nodes
    ok = en >= 0
    step_end = np.full(en.size, np.nan)
    pr = p.pred[en[ok]]
    has = pr >= 0
    start0 = p.step_start[ok]
    se = np.where(has, base[np.maximum(pr, 0)], start0) + gap[en[ok]]
    if hide is not None:
        se = np.maximum(se, np.where(has, e[np.maximum(pr, 0)], start0))
    step_end[ok] = se
    s[en[ok]] = se
    a[en[ok]] = se
    e[en[ok]] = se
    return Replay(start=s, arrival=a, end=e, step_end=step_end, t0=p.t0)


def step_times(g: StepGraph, r: Replay) -> pl.DataFrame:
    """``rank, step, replayed_ns`` (replayed step end - step start)."""
    return g.starts.select("rank", "step").with_columns(
        pl.Series("replayed_ns", np.rint(r.step_end - (g.starts["start_ns"].to_numpy() - r.t0)).astype(np.int64))
    )


def replay_error(g: StepGraph, r: Replay) -> pl.DataFrame:
    """Per (rank, step): ``measured_ns, replayed_ns, error_pct`` (|replayed - measured| / measured, %)."""
    m = g.starts.select("rank", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("measured_ns"))
    return (
        m.join(step_times(g, r), on=["rank", "step"])
        .with_columns(
            pl.when(pl.col("measured_ns") > 0)
            .then(100.0 * (pl.col("replayed_ns") - pl.col("measured_ns")).abs() / pl.col("measured_ns"))
            .otherwise(0.0)
            .alias("error_pct")
        )
        .select("rank", "step", "measured_ns", "replayed_ns", "error_pct")
        .sort("rank", "step")
    )

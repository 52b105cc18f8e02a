"""The critical path of each profiler step: the chain of work and waits across ranks that set its length.

Walk back from the end of the step on its critical rank (the rank with the longest step): a step
end or a call starts after its lead gap (work tiled into compute per stage / host stall / launch
gap by :mod:`ep_trace.analysis.graph`) on its own rank; a call whose rank waited (``a_r > s_r``)
was released by the last arriver it depended on, so the path jumps to that rank's start of the
same call and continues with that rank's lead gap. The wait itself is never on the path: the work
that caused it is. Two causes come from the edges of the step: where the path reaches the step
start of a rank that entered the step later than the critical rank, the critical rank's time before
that is ``barrier_wait`` (it waited for a rank still in its previous step); time the walk cannot
account for (clipped transfers within the clock tolerance) is ``unexplained``, never forced.
Segments tile the critical rank's step window, so ``by_cause`` sums to its step length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ep_trace.analysis.graph import StepGraph

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["critical_path", "CP_SCHEMA", "CAUSES", "composition"]

CAUSES = ("compute", "copy", "transfer", "barrier_wait", "host_stall", "launch_gap", "queued", "unexplained")
CP_SCHEMA: dict[str, PolarsDataType] = {
    "step": pl.Int64,
    "seq": pl.Int32,
    "rank": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "cause": pl.Utf8,
    "stage": pl.Utf8,
    "name": pl.Utf8,
}


def critical_path(g: StepGraph) -> pl.DataFrame:
    """Critical path segments of every step (measured timeline, aligned clock).

    Args:
        g: The step graph.

    Returns:
        Frame with :data:`CP_SCHEMA` columns, sorted by ``step, seq``.
    """
    n = g.nodes
    if n.is_empty():
        return pl.DataFrame(schema=CP_SCHEMA)
    kind = n["kind"].to_numpy()
    rank = n["rank"].to_numpy()
    step = n["step"].to_numpy()
    s = n["start_ns"].to_numpy()
    a = n["arrival_ns"].to_numpy() + n["slack_ns"].to_numpy()
    e = n["end_ns"].to_numpy()
    pred = n["pred"].to_numpy()
    peer = n["peer"].to_numpy()
    full = n["full"].to_numpy()
    group = n["group"].to_numpy()
    coll = n["collective"].fill_null("").to_list()
    direc = n["direction"].to_list()
    # the last arriver of each call group (for calls whose a_r is the call's last start)
    order = np.lexsort((s, group))
    last_of_group = np.zeros(int(group.max()) + 1, dtype=np.int64)
    last_of_group[group[order]] = order  # later rows overwrite: the latest start wins
    starts = g.starts
    st_start = {(int(r), int(t)): int(x) for r, t, x in starts.select("rank", "step", "start_ns").iter_rows()}
    end_node: dict[tuple[int, int], int] = {(int(rank[i]), int(step[i])): int(i) for i in np.flatnonzero(kind == "end")}
    lengths = starts.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_l")).sort(
        ["step", "_l", "rank"], descending=[False, True, False]
    )
    crit = lengths.unique("step", keep="first", maintain_order=True)
    # the walk first, the work pieces after: the walk visits few nodes (a chain per step), so only
    # their pieces are read (every piece's columns as arrays cost ~65 MB of the peak over 4,096
    # param DLRM ranks, 2.3 M pieces); an int in a step's list stands for that node's pieces, in
    # the order the walk met them (``_tile`` sorts stably: the order decides ties)
    walks: list[tuple[int, int, int, int, list[_Seg | int]]] = []
    for stp, rho, t_lo, t_hi in crit.select("step", "rank", "start_ns", "end_ns").iter_rows():
        seg: list[_Seg | int] = []
        cur: int | None = end_node.get((int(rho), int(stp)))
        guard = 0
        while cur is not None and guard < n.height + 1:
            guard += 1
            i = int(cur)
            if kind[i] != "end":
                lbl = coll[i] + (f" ({direc[i]})" if direc[i] else "")
                if kind[i] == "local":
                    seg.append(
                        (int(rank[i]), int(s[i]), int(e[i]), "transfer", None, lbl + " (not joined across ranks)")
                    )
                else:
                    cause = "host_stall" if direc[i] == "count" else "transfer"
                    seg.append((int(rank[i]), int(max(s[i], a[i])), int(e[i]), cause, None, lbl))
                    if a[i] > s[i]:  # released by the last arriver it depended on
                        j = int(last_of_group[group[i]]) if full[i] else int(peer[i])
                        if j >= 0 and j != i:
                            i = j
            seg.append(i)
            if pred[i] >= 0:
                cur = int(pred[i])
                if e[cur] <= t_lo:
                    break
                continue
            q0 = st_start.get((int(rank[i]), int(stp)), t_lo)
            if q0 > t_lo:
                seg.append(
                    (int(rho), int(t_lo), int(q0), "barrier_wait", None, f"rank {int(rank[i])} not yet in the step")
                )
            break
        walks.append((int(stp), int(rho), int(t_lo), int(t_hi), seg))
    pieces = _pieces(g.work, {x for *_, seg in walks for x in seg if isinstance(x, int)})
    rows: list[tuple[int, int, int, int, str, str | None, str]] = []
    for stp, rho, t_lo, t_hi, seg in walks:
        full_seg = [p for x in seg for p in (pieces.get(x, []) if isinstance(x, int) else [x])]
        rows += _tile(stp, full_seg, t_lo, t_hi, rho)
    if not rows:
        return pl.DataFrame(schema=CP_SCHEMA)
    out = pl.DataFrame(rows, schema={c: t for c, t in CP_SCHEMA.items() if c != "seq"}, orient="row")
    return (
        out.sort("step", "start_ns")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int32).over("step").alias("seq"))
        .select(list(CP_SCHEMA))
        .cast(pl.Schema(CP_SCHEMA))
    )


_Seg = tuple[int, int, int, str, str | None, str]


def _pieces(work: pl.DataFrame, nodes: set[int]) -> dict[int, list[_Seg]]:
    """The work pieces of ``nodes`` as path segments, per node in ``start_ns`` order (the work's row order)."""
    w = work.filter(pl.col("node").is_in(sorted(nodes)))
    out: dict[int, list[_Seg]] = {}
    for node, rank, start, end, cause, stage in w.select(
        "node", "rank", "start_ns", "end_ns", pl.col("cause").cast(pl.Utf8), pl.col("stage").cast(pl.Utf8)
    ).iter_rows():
        out.setdefault(int(node), []).append((int(rank), int(start), int(end), str(cause), stage, stage or cause))
    return out


def _tile(
    stp: int, seg: list[tuple[int, int, int, str, str | None, str]], t_lo: int, t_hi: int, rho: int
) -> list[tuple[int, int, int, int, str, str | None, str]]:
    """Clip to the critical rank's window, drop overlaps, fill holes with ``unexplained``."""
    seg = sorted(((r, max(a, t_lo), min(b, t_hi), c, st, nm) for r, a, b, c, st, nm in seg), key=lambda x: x[1])
    out: list[tuple[int, int, int, int, str, str | None, str]] = []
    t = t_lo
    for r, a, b, c, st, nm in seg:
        a = max(a, t)
        if b <= a:
            continue
        if a > t:
            out.append((stp, rho, t, a, "unexplained", None, "not explained by the graph"))
        out.append((stp, r, a, b, c, st, nm))
        t = b
    if t < t_hi:
        out.append((stp, rho, t, t_hi, "unexplained", None, "not explained by the graph"))
    return out


def composition(cp: pl.DataFrame, step: int) -> dict[str, object]:
    """``total_ns``, ``by_cause``, ``by_stage`` (compute per stage included) and ``by_rank`` of one step."""
    p = cp.filter(pl.col("step") == step).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_d"))
    by_cause = {c: 0 for c in CAUSES}
    for c, d in p.group_by("cause").agg(pl.col("_d").sum()).iter_rows():
        by_cause[str(c)] = int(d)
    by_stage = {
        str(st if st is not None else "(none)"): int(d)
        for st, d in p.group_by("stage").agg(pl.col("_d").sum()).sort("_d", descending=True).iter_rows()
    }
    comp = p.filter(pl.col("cause") == "compute")
    compute_by_stage = {
        str(st if st is not None else "(none)"): int(d)
        for st, d in comp.group_by("stage").agg(pl.col("_d").sum()).sort("_d", descending=True).iter_rows()
    }
    by_rank = {int(r): int(d) for r, d in p.group_by("rank").agg(pl.col("_d").sum()).sort("rank").iter_rows()}
    return {
        "step": int(step),
        "total_ns": int(p["_d"].sum()) if p.height else 0,
        "by_cause": by_cause,
        "by_stage": by_stage,
        "compute_by_stage": compute_by_stage,
        "by_rank": by_rank,
    }

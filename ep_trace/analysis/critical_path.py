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
    walks: list[_Walk] = []
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
    out = _tile(_segments(g.work, walks), walks)
    if out.is_empty():
        return pl.DataFrame(schema=CP_SCHEMA)
    return (
        out.sort("step", "start_ns")
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int32).over("step").alias("seq"))
        .select(list(CP_SCHEMA))
        .cast(pl.Schema(CP_SCHEMA))
    )


_Seg = tuple[int, int, int, str, str | None, str]
_Walk = tuple[int, int, int, int, list[_Seg | int]]
#: The columns of a tiled segment: :data:`CP_SCHEMA` less ``seq`` (numbered once the steps are tiled).
_TILED = {c: t for c, t in CP_SCHEMA.items() if c != "seq"}
#: A walk's segments before tiling: ``wi`` (walk), ``pos`` (its place in the walk), ``sub`` (a piece's
#: place in its node's work, the work's row order), then the segment's own columns (``_TILED`` less ``step``).
_SEG_SCHEMA: dict[str, PolarsDataType] = {
    "wi": pl.Int64,
    "pos": pl.Int64,
    "sub": pl.Int64,
    **{c: t for c, t in _TILED.items() if c != "step"},
}


def _segments(work: pl.DataFrame, walks: list[_Walk]) -> pl.DataFrame:
    """Every walk's segments (:data:`_SEG_SCHEMA`): the explicit ones as they are, a node's as its work
    pieces (only the walked nodes' pieces are read), each piece named by its stage, else its cause."""
    refs = [(wi, pos, x) for wi, (*_, seg) in enumerate(walks) for pos, x in enumerate(seg) if isinstance(x, int)]
    own = [
        (wi, pos, 0, *x) for wi, (*_, seg) in enumerate(walks) for pos, x in enumerate(seg) if not isinstance(x, int)
    ]
    parts = [pl.DataFrame(own, schema=_SEG_SCHEMA, orient="row")]
    if refs:
        r = pl.DataFrame(refs, schema={"wi": pl.Int64, "pos": pl.Int64, "node": pl.Int64}, orient="row")
        w = (
            work.lazy()
            .filter(pl.col("node").is_in(r["node"].unique().implode()))
            .select(
                pl.col("node").cast(pl.Int64),
                "rank",
                "start_ns",
                "end_ns",
                pl.col("cause").cast(pl.Utf8),
                pl.col("stage").cast(pl.Utf8),
            )
            .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("node").alias("sub"))
        )
        parts.append(
            r.lazy()
            .join(w, on="node", how="inner")
            .select(
                "wi",
                "pos",
                "sub",
                "rank",
                "start_ns",
                "end_ns",
                "cause",
                "stage",
                pl.coalesce("stage", "cause").alias("name"),
            )
            .cast(pl.Schema(_SEG_SCHEMA))
            .collect()
        )
    return pl.concat(parts, how="vertical")


def _tile(seg: pl.DataFrame, walks: list[_Walk]) -> pl.DataFrame:
    """Clip each walk's segments to its critical rank's window, sort them by start (ties in walk order),
    cut each at the latest end before it (a segment left empty is dropped), and fill the holes and the
    tail with ``unexplained``: ``step, rank, start_ns, end_ns, cause, stage, name``, tiling each window."""
    win = pl.DataFrame(
        [(wi, stp, rho, lo, hi) for wi, (stp, rho, lo, hi, _) in enumerate(walks)],
        schema={"wi": pl.Int64, "step": pl.Int64, "rho": pl.Int32, "_lo": pl.Int64, "_hi": pl.Int64},
        orient="row",
    )
    hole = {
        "cause": pl.lit("unexplained"),
        "stage": pl.lit(None, pl.Utf8),
        "name": pl.lit("not explained by the graph"),
    }
    cols = list(_TILED)
    s = (
        seg.join(win, on="wi", how="inner")
        .with_columns(
            pl.max_horizontal("start_ns", "_lo").alias("start_ns"), pl.min_horizontal("end_ns", "_hi").alias("end_ns")
        )
        .sort("wi", "start_ns", "pos", "sub")
        # the time tiled before each segment: the window start, or the latest end of the segments before it
        # (a dropped segment never ends later than that, so the maximum over all of them is the same)
        .with_columns(pl.max_horizontal(pl.col("end_ns").cum_max().shift(1).over("wi"), "_lo").alias("_t"))
        .with_columns(pl.max_horizontal("start_ns", "_t").alias("start_ns"))
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
    holes = s.filter(pl.col("start_ns") > pl.col("_t")).select(
        "step", pl.col("rho").alias("rank"), pl.col("_t").alias("start_ns"), pl.col("start_ns").alias("end_ns"), **hole
    )
    ends = s.group_by("wi").agg(pl.col("end_ns").max().alias("_t"))
    tails = (
        win.join(ends, on="wi", how="left")
        .with_columns(pl.max_horizontal("_t", "_lo").alias("_t"))
        .filter(pl.col("_t") < pl.col("_hi"))
        .select(
            "step", pl.col("rho").alias("rank"), pl.col("_t").alias("start_ns"), pl.col("_hi").alias("end_ns"), **hole
        )
    )
    return pl.concat([s.select(cols), holes.select(cols), tails.select(cols)], how="vertical_relaxed")


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

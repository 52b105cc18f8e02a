"""Where every nanosecond of a step goes, per rank, with or without ep-trace hooks.

The step window of rank r, step s (the host ``ProfilerStep#N`` range, ``steps.start_ns`` →
``end_ns``) is cut into disjoint elementary segments by the boundaries of four interval sets, all
clipped to the window (device work of the step, assigned by its launch time, as ``steps``):

* K = union of the rank's compute intervals, C = union of its communication intervals
  (:mod:`ep_trace.analysis.activity`),
* W = barrier-wait spans ``[s_r, min(a_r, e_r))`` of the rank's valid matched collectives,
* H = blocking host calls (:mod:`ep_trace.analysis.host_stalls`), M = the rank's memcpy / memset
  activity (a blocking ``cudaMemcpy`` with its copy running is the copy's time, not a stall, as
  ``host_stalls.stall_ns`` counts it; nsys ``pipit_saxpy``: 286 ms of copies under 15 calls).

Each segment gets exactly one part, in this priority (so the parts add up to the step exactly):

=====================  =======================================================================
``overlapped_comm_ns``  C ∩ K: communication hidden under compute
``compute_ns``          K \\ C: compute alone
``barrier_wait_ns``     W \\ K: inside a collective, waiting for the last peer to arrive
``exposed_comm_ns``     C \\ (K ∪ W): communication (transfer) nothing hides
``copy_ns``             M \\ (C ∪ K ∪ W): device copies / memsets alone (HTA counts them non-compute)
``host_stall_ns``       H \\ (C ∪ K ∪ W ∪ M): device idle while the host blocks
``idle_ns``             the rest: nothing measured runs (launch gaps, data loading)
=====================  =======================================================================

``barrier_wait_ns + exposed_comm_ns`` equals ``steps.exposed_comm_ns`` (|C \\ K|) whenever the
wait spans lie inside C, which they do by construction (a wait starts at the rank's own
collective start). Memory copies (``gpu_memcpy`` / ``gpu_memset``) are neither C nor K, as in HTA,
but their own part M.

Also here: the top device kernels and the top CPU ops by total time, with the EP stage they were
launched in (the innermost stage host range containing the launch / op start).
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import clip, range_join, union

__all__ = ["BREAKDOWN_PARTS", "step_breakdown", "top_kernels", "top_ops"]

#: Parts of the step, in display order (they sum to ``step_time_ns``).
BREAKDOWN_PARTS: tuple[str, ...] = (
    "compute_ns",
    "overlapped_comm_ns",
    "exposed_comm_ns",
    "barrier_wait_ns",
    "copy_ns",
    "host_stall_ns",
    "idle_ns",
)
_SETS = ("k", "c", "w", "h", "m")
_KEY = ["rank", "step"]


def _deltas(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """+1 at each start, -1 at each end of the disjoint intervals of one set, in column ``d_<name>``."""
    u = union(df, _KEY)
    zeros = [pl.lit(0, pl.Int32).alias(f"d_{s}") for s in _SETS if s != name]
    up = u.select(*_KEY, pl.col("start_ns").alias("t"), pl.lit(1, pl.Int32).alias(f"d_{name}"), *zeros)
    down = u.select(*_KEY, pl.col("end_ns").alias("t"), pl.lit(-1, pl.Int32).alias(f"d_{name}"), *zeros)
    return pl.concat([up, down]).select(*_KEY, "t", *[f"d_{s}" for s in _SETS])


def step_breakdown(
    windows: pl.DataFrame,
    activity: pl.DataFrame,
    waits: pl.DataFrame,
    stalls: pl.DataFrame,
) -> pl.DataFrame:
    """The per-(rank, step) time breakdown (see the module docstring for the definitions).

    Args:
        windows: ``rank, step, start_ns, end_ns`` step windows (epoch ns, the rank's own clock).
        activity: Device activity with ``rank, step, cls ('comm' | 'compute' | 'memory'), start_ns, end_ns``.
        waits: ``rank, step, start_ns, end_ns`` barrier-wait spans, the rank's own clock.
        stalls: ``rank, step, start_ns, end_ns`` blocking host calls, the rank's own clock.

    Returns:
        Columns ``rank, step, compute_ns, overlapped_comm_ns, exposed_comm_ns, barrier_wait_ns,
        copy_ns, host_stall_ns, idle_ns, step_time_ns`` (int64 ns; the seven parts sum to ``step_time_ns``).
    """
    w = windows.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), "start_ns", "end_ns").with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("step_time_ns")
    )
    win = w.select(*_KEY, pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end"))

    def prep(df: pl.DataFrame) -> pl.DataFrame:
        d = df.filter(pl.col("step").is_not_null()).select(
            pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), "start_ns", "end_ns"
        )
        return clip(d, win, _KEY)

    sets = {
        "k": prep(activity.filter(pl.col("cls") == "compute")),
        "c": prep(activity.filter(pl.col("cls") == "comm")),
        "w": prep(waits),
        "h": prep(stalls),
        "m": prep(activity.filter(pl.col("cls") == "memory")),
    }
    pts = pl.concat([_deltas(df, s) for s, df in sets.items()])
    seg = (
        pts.group_by(*_KEY, "t")
        .agg(pl.col(f"d_{s}").sum() for s in _SETS)
        .sort(*_KEY, "t")
        # no window per (rank, step): each key's deltas sum to 0 per set, so the running sums over
        # the sorted frame are the key's own; at a key's last point every set is closed (no part,
        # dropped below), so the next row's time is never read across keys
        .with_columns(pl.col(f"d_{s}").cum_sum().alias(s) for s in _SETS)
        .with_columns((pl.col("t").shift(-1) - pl.col("t")).alias("len"))
        .filter(pl.col("len") > 0)
    )
    k, c, wt, h, m = (pl.col(s) > 0 for s in _SETS)
    part = (
        pl.when(k & c)
        .then(pl.lit("overlapped_comm_ns"))
        .when(k)
        .then(pl.lit("compute_ns"))
        .when(wt)
        .then(pl.lit("barrier_wait_ns"))
        .when(c)
        .then(pl.lit("exposed_comm_ns"))
        .when(m)
        .then(pl.lit("copy_ns"))
        .when(h)
        .then(pl.lit("host_stall_ns"))
        .otherwise(None)
    )
    per = seg.with_columns(part.alias("part")).filter(pl.col("part").is_not_null())
    sums = per.group_by(*_KEY).agg(
        pl.col("len").filter(pl.col("part") == p).sum().cast(pl.Int64).alias(p) for p in BREAKDOWN_PARTS[:-1]
    )
    out = w.join(sums, on=_KEY, how="left").with_columns(pl.col(p).fill_null(0) for p in BREAKDOWN_PARTS[:-1])
    measured = pl.sum_horizontal(*BREAKDOWN_PARTS[:-1])
    return (
        out.with_columns((pl.col("step_time_ns") - measured).alias("idle_ns"))
        .select(*_KEY, *BREAKDOWN_PARTS, "step_time_ns")
        .sort(_KEY)
    )


def _with_stage(df: pl.DataFrame, at: str, stages: pl.DataFrame) -> pl.DataFrame:
    """Attach the innermost stage whose host range contains ``df[at]`` (``stage`` null when none)."""
    s = df.with_row_index("_i")
    if stages.is_empty() or s.is_empty():
        return s.with_columns(pl.lit(None, pl.Utf8).alias("stage")).drop("_i")
    rng = stages.select(pl.col("rank").cast(s.schema["rank"]), "cpu_start_ns", "cpu_end_ns", "stage")
    j = range_join(_in_some(s.select("_i", "rank", at), at, rng), rng, (at, at), ("cpu_start_ns", "cpu_end_ns"))
    # innermost = latest start, then shortest; ties by name: a total order, not the join's output order
    j = (
        j.sort(["cpu_start_ns", "cpu_end_ns", "stage"], descending=[True, False, False], nulls_last=True)
        .unique("_i", keep="first")
        .select("_i", "stage")
    )
    return s.join(j, on="_i", how="left").drop("_i")


def _in_some(points: pl.DataFrame, at: str, rng: pl.DataFrame) -> pl.DataFrame:
    """The points lying in some closed range ``[cpu_start_ns, cpu_end_ns]`` of their rank.

    An as-of join against the ranges merged per rank (disjoint), so the interval join that picks
    each point's stage only sees those points: on 1,024 param DLRM ranks 10 k of 1.7 M CPU ops.
    """
    g = ["rank"]
    r = rng.select(*g, "cpu_start_ns", "cpu_end_ns").drop_nulls().sort([*g, "cpu_start_ns"])
    prev = pl.col("cpu_end_ns").cum_max().shift(1).over(g)
    seg = (prev.is_null() | (pl.col("cpu_start_ns") > prev)).cum_sum().over(g)
    merged = (
        r.with_columns(seg.alias("_seg"))
        .group_by([*g, "_seg"])
        .agg(pl.col("cpu_start_ns").min().alias("_ms"), pl.col("cpu_end_ns").max().alias("_me"))
        .drop("_seg")
        .sort("_ms")
    )
    hit = (
        points.filter(pl.col(at).is_not_null())
        .sort(at)
        .join_asof(merged, left_on=at, right_on="_ms", by=g, strategy="backward", check_sortedness=False)
    )
    return hit.filter(pl.col(at) <= pl.col("_me")).drop("_ms", "_me")


def _top(df: pl.DataFrame, n: int) -> pl.DataFrame:
    """Per (rank, name): total, count and the stage holding most of its time; top ``n`` per rank."""
    # one pass over the rows (250 k ops a block of param DLRM ranks); the rest reads the per-stage sums
    per = df.group_by("rank", "name", "stage").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("_sd"), pl.len().alias("_n")
    )
    # per (rank, name): the totals, and the stage with most of the time (ties: by stage, null last)
    top_stage = pl.col("stage").sort_by(["_sd", "stage"], descending=[True, False], nulls_last=True).first()
    tot = per.group_by("rank", "name").agg(
        pl.col("_sd").sum().cast(pl.Int64).alias("total_ns"), pl.col("_n").sum().alias("count"), top_stage
    )
    return (
        tot.sort(["rank", "total_ns", "name"], descending=[False, True, False])
        .group_by("rank", maintain_order=True)
        .head(n)
        .select(pl.col("rank").cast(pl.Int32), "name", "stage", "total_ns", pl.col("count").cast(pl.Int64))
    )


def top_kernels(activity: pl.DataFrame, stages: pl.DataFrame, n: int = 20) -> pl.DataFrame:
    """The ``n`` device intervals (kernels; on CPU ranks the compute ops and comm ranges) with the
    most total time per rank, inside analysed steps.

    Args:
        activity: Device activity (``rank, step, cls, name, start_ns, end_ns, anchor_ns``).
        stages: Stage rows (``rank, cpu_start_ns, cpu_end_ns, stage``): the stage is the innermost
            stage host range containing the kernel's launch; per name, the stage with most of its time.
        n: Rows kept per rank.

    Returns:
        Columns ``rank, name, stage, total_ns, count``, by rank then total time (descending).
    """
    a = activity.filter(pl.col("step").is_not_null() & pl.col("cls").is_in(["comm", "compute"]))
    a = a.select("rank", "name", "start_ns", "end_ns", "anchor_ns")
    return _top(_with_stage(a, "anchor_ns", stages), n)


def top_ops(events: pl.DataFrame, windows: pl.DataFrame, stages: pl.DataFrame, n: int = 20) -> pl.DataFrame:
    """The ``n`` CPU ops (``kind == 'cpu_op'``) with the most inclusive time per rank, inside the
    step windows (an op counts in full when it starts inside one). Inclusive: a parent op's time
    contains its children's, as in the profiler's own table.

    Returns:
        Columns ``rank, name, stage, total_ns, count``.
    """
    ops = events.lazy().filter(pl.col("kind") == "cpu_op").select("rank", "name", "start_ns", "end_ns").collect()
    # the host ranges: ops are host work (the step windows of an overlap scheduler overlap)
    lo, hi = ("host_start_ns", "host_end_ns") if "host_start_ns" in windows.columns else ("start_ns", "end_ns")
    w = windows.select("rank", pl.col(lo).alias("_ws"), pl.col(hi).alias("_we"))
    if _disjoint(w):
        # one as-of join (the last window starting at or before the op's start) instead of an
        # interval join: 3.1 -> ~0.5 CPU-s on 1,024 param DLRM ranks (1.7 M ops)
        w = w.with_columns(pl.col("rank").cast(ops.schema["rank"])).sort("_ws")
        hit = ops.sort("start_ns").join_asof(
            w, left_on="start_ns", right_on="_ws", by="rank", strategy="backward", check_sortedness=False
        )
        ops = hit.filter(pl.col("start_ns") <= pl.col("_we")).select("rank", "name", "start_ns", "end_ns")
    else:
        inside = range_join(ops.with_row_index("_o"), w, ("start_ns", "start_ns"), ("_ws", "_we"))
        ops = inside.unique("_o").select("rank", "name", "start_ns", "end_ns")
    return _top(_with_stage(ops, "start_ns", stages), n)


def _disjoint(w: pl.DataFrame) -> bool:
    """True when no two windows of a rank overlap (touching ends allowed): step windows are."""
    prev_end = pl.col("_we").shift(1).over("rank", order_by="_ws")
    return not w.select((pl.col("_ws") < prev_end).fill_null(False).any()).item()

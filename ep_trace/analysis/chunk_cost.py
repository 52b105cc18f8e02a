"""What one more pipeline chunk costs a rank: the fixed part of re-issuing the chunked region's ops.

A chunked dispatch -> expert -> combine pipeline runs the region's op sequence once per chunk, on
fewer rows. The size-dependent part of the work splits over the chunks; the fixed part per op (the
host's dispatcher / Python / launch cost on a CPU rank, the launch gap between kernels on a GPU rank)
is paid again by every extra chunk. Measured from the 1-chunk trace, per rank:

    cost per extra chunk = (ops issued in one region instance) x (fixed cost per op)
                           + 2 x (host cost of posting one collective call)   [CPU ranks]

* **CPU ranks**: ops = top-level ``cpu_op`` rows (not nested in another op) inside the region's host
  window (first dispatch range start to last combine range end of the layer) that post no
  collective; fixed cost per op = the 25th percentile of the start-to-start interval of consecutive
  top-level ops there (the cheap ops, whose interval is almost all fixed cost: a view or an empty is
  ~4-8 µs of eager-mode overhead on CPU, where a GEMM's interval is its data). The ops that post a
  collective (``c10d::alltoall_base_``: build the work, enqueue it for gloo's worker) are priced at
  their own host window, read off the smallest message (the count exchange): that work does not
  shrink with the message, and each extra chunk posts two more calls. Priced at the p25 like the
  other ops (before stop 25), a call cost ~5 µs instead of the 100-170 µs measured.
* **GPU ranks**: ops = compute kernels (no ``coll_id``) inside the region's device window; fixed cost
  = the median idle gap between consecutive ones on their stream (launch latency where the host
  falls behind, ~1 µs where it runs ahead).

``whatif._overhead`` adds the calls' fixed transfer latency (the count exchange's wait-free transfer).

Checked against the demo's pipelined path (benchmarks/README.md, "Stop 25", "Stop 26"; 2 gloo ranks,
jemalloc, gloo's threads on SCHED_FIFO, chunk-major buffers: no gather / scatter per chunk), in-run
A/B, median of neighbouring-step differences, four sets: 4 chunks at 2048 tokens cost 0.96-1.15x the
prediction (1.4-12.7 % error), at 512 tokens 1.12-1.30x (10.5-23.1 %), 8 chunks (three sets)
0.76-0.89x (12.9-32.2 % over): sub-linear in k as measured, linear in the model. The model's terms
are off in both directions and cancel at 2048 tokens: it re-issues all of the region's ops per chunk
(55 top-level ops per layer in the demo; an extra chunk adds ~30) at the p25 interval (~6 µs), but
the ops an extra chunk does add include ~1.2 GEMM pairs cut out of an expert's rows, 80-115 µs of op
time each at M <= 128 (stop 26, per-op-name totals of one in-run trace per size), plus host time
between the extra calls' ops (stage ranges, sidecar records); a 1-chunk trace, running every op at
one size, shows neither. Pricing
each call at its whole host envelope (the Python before and after the post too) was tried and not
adopted: 4-9 % at 512 tokens but 19-42 % and 46-70 % over at 2048 tokens and 8 chunks.
History: before stop 25 the measured cost was 1.5-2.1x the prediction at k = 4. Most of that gap was
the demo, not the model: gloo's threads, on the fair scheduler, waited for a slice behind the ranks'
compute (:mod:`ep_trace.workloads.comm_priority`), and the pipelined path gathered / scattered each
chunk's rows (2048 tokens: ~1 ms per layer). The report prints the measured error next to this
what-if (:mod:`ep_trace.analysis.whatif_checks`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ep_trace.analysis.intervals import range_join, top_level_cpu_ops

__all__ = ["per_chunk_cost", "REGION_STAGES"]

#: Stages a chunked pipeline repeats per chunk.
REGION_STAGES = ("dispatch", "expert", "combine")


def _regions(stages: pl.DataFrame, start: str, end: str) -> pl.DataFrame:
    """One window per (rank, step, layer) over its region stages (``_rs``, ``_re``, ``_rid``)."""
    return (
        stages.filter(pl.col("stage").is_in(REGION_STAGES) & pl.col(start).is_not_null() & pl.col(end).is_not_null())
        .group_by(["rank", "step", "layer"])
        .agg(pl.col(start).min().alias("_rs"), pl.col(end).max().alias("_re"))
        .with_row_index("_rid")
    )


def _cost(inside: pl.DataFrame, fixed: float | None) -> float:
    if inside.is_empty() or fixed is None or not np.isfinite(fixed):
        return 0.0
    n = np.median(inside.group_by("_rid").agg(pl.len().alias("_n"))["_n"].to_numpy())
    return float(n) * max(fixed, 0.0)


def _call_issue(inside: pl.DataFrame, calls: pl.DataFrame) -> tuple[dict[int, float], pl.DataFrame]:
    """Host time of posting one collective call per rank, ns, and the region's ops that are not calls.

    A call's op (``c10d::alltoall_base_`` ...) on the issuing thread builds and posts the call; with
    an async backend it returns before the transfer, and that work does not shrink with a smaller
    message, so each extra chunk pays it whole. Read off the calls inside the regions with the
    smallest message (the count exchange when recorded, else all of them): the median host window.
    """
    c = calls.select("rank", "direction", pl.col("cpu_start_ns").alias("start_ns")).drop_nulls(["start_ns"])
    j = inside.join(c, on=["rank", "start_ns"], how="inner")
    if j.is_empty():
        return {}, inside
    dur = (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)
    is_count = pl.col("direction") == "count"
    per = j.group_by("rank").agg(
        pl.when(is_count.any()).then(dur.filter(is_count).median()).otherwise(dur.median()).alias("_i")
    )
    rest = inside.join(c.select("rank", "start_ns"), on=["rank", "start_ns"], how="anti")
    return {int(r): float(v) for r, v in per.iter_rows() if v is not None}, rest


def _cpu_rank_cost(ev: pl.DataFrame, regions: pl.DataFrame, calls: pl.DataFrame | None) -> dict[int, float]:
    top = top_level_cpu_ops(ev)
    if top.is_empty() or regions.is_empty():
        return {}
    inside = range_join(top, regions, ("start_ns", "end_ns"), ("_rs", "_re")).filter(
        (pl.col("start_ns") >= pl.col("_rs")) & (pl.col("end_ns") <= pl.col("_re"))
    )
    step = (
        inside.sort("rank", "tid", "_rid", "start_ns")
        .with_columns((pl.col("start_ns").shift(-1) - pl.col("start_ns")).over(["rank", "tid", "_rid"]).alias("_dt"))
        .filter(pl.col("_dt").is_not_null())
    )
    fixed = step.group_by("rank").agg(pl.col("_dt").quantile(0.25).alias("_f"))
    f = dict(fixed.iter_rows())
    # the ops that post a collective are priced at their own host window, the others at the p25
    issue, ops = _call_issue(inside, calls) if calls is not None else ({}, inside)
    return {int(r): _cost(g, f.get(r)) + 2.0 * issue.get(int(r), 0.0) for (r,), g in ops.group_by(["rank"])}


def _gpu_rank_cost(ev: pl.DataFrame, regions: pl.DataFrame) -> dict[int, float]:
    k = ev.filter((pl.col("kind") == "gpu_kernel") & pl.col("coll_id").is_null()).select(
        "rank", "stream", "start_ns", "end_ns"
    )
    if k.is_empty() or regions.is_empty():
        return {}
    inside = range_join(k, regions, ("start_ns", "end_ns"), ("_rs", "_re")).filter(
        (pl.col("start_ns") >= pl.col("_rs")) & (pl.col("end_ns") <= pl.col("_re"))
    )
    gaps = (
        inside.sort("rank", "stream", "_rid", "start_ns")
        .with_columns(
            (pl.col("start_ns").shift(-1) - pl.col("end_ns")).over(["rank", "stream", "_rid"]).clip(0).alias("_g")
        )
        .filter(pl.col("_g").is_not_null())
    )
    f = dict(gaps.group_by("rank").agg(pl.col("_g").median()).iter_rows())
    return {int(r): _cost(g, f.get(r)) for (r,), g in inside.group_by(["rank"])}


def per_chunk_cost(
    ev: pl.DataFrame, stages: pl.DataFrame, mode: dict[int, str], calls: pl.DataFrame | None = None
) -> dict[int, float]:
    """Fixed cost of one extra chunk of the dispatch -> expert -> combine region per rank, ns.

    Args:
        ev: Events (aligned clock is not needed: every time compared is the rank's own).
        stages: ``Analysis.stages`` (``cpu_start_ns``/``cpu_end_ns`` host windows, ``start_ns``/``end_ns``
            device windows).
        mode: ``rank -> 'gpu' | 'cpu'``.
        calls: The ``collectives`` table (``rank, direction, cpu_start_ns``): on CPU ranks the two
            extra calls are priced at the host window of the ops that post them; without it every op
            of the region, the calls' included, is priced at the p25 interval.

    Returns:
        ``rank -> ns``; ranks without region stages are absent (their chunks cost only the calls).
    """
    if stages.is_empty():
        return {}
    cpu = [r for r, m in mode.items() if m != "gpu"]
    gpu = [r for r, m in mode.items() if m == "gpu"]
    out: dict[int, float] = {}
    if cpu:
        st = stages.filter(pl.col("rank").is_in(cpu))
        cc = None if calls is None else calls.filter(pl.col("rank").is_in(cpu))
        out |= _cpu_rank_cost(ev.filter(pl.col("rank").is_in(cpu)), _regions(st, "cpu_start_ns", "cpu_end_ns"), cc)
    if gpu:
        st = stages.filter(pl.col("rank").is_in(gpu))
        out |= _gpu_rank_cost(ev.filter(pl.col("rank").is_in(gpu)), _regions(st, "start_ns", "end_ns"))
    return out

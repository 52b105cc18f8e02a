"""What one more pipeline chunk costs a rank: the fixed part of re-issuing the chunked region's ops.

A chunked dispatch -> expert -> combine pipeline runs the region's op sequence once per chunk, on
fewer rows. The size-dependent part of the work splits over the chunks; the fixed part per op (the
host's dispatcher / Python / launch cost on a CPU rank, the launch gap between kernels on a GPU rank)
is paid again by every extra chunk. Measured from the 1-chunk trace, per rank:

    cost per extra chunk = (ops issued in one region instance) x (fixed cost per op)

* **CPU ranks**: ops = top-level ``cpu_op`` rows (not nested in another op) inside the region's host
  window (first dispatch range start to last combine range end of the layer); fixed cost per op =
  the 25th percentile of the start-to-start interval of consecutive top-level ops there (the cheap
  ops, whose interval is almost all fixed cost: a view or an empty is ~4-8 µs of eager-mode overhead
  on CPU, where a GEMM's interval is its data).
* **GPU ranks**: ops = compute kernels (no ``coll_id``) inside the region's device window; fixed cost
  = the median idle gap between consecutive ones on their stream (launch latency where the host
  falls behind, ~1 µs where it runs ahead).

On the 2-vCPU VM of benchmarks/README.md (stop 22: 2 gloo ranks on jemalloc) this gives 0.5-0.8 ms
per extra chunk and layer, and the two extra calls (``whatif._overhead``) 0.3-0.6 ms more. Measured
(in-run A/B): 2.1 ms per extra chunk and layer at 512 tokens with 4 chunks, 1.7 ms at 2048 tokens,
1.5 ms with 8 chunks, so the model under-counts at k = 4 (52 % / 31 % error) and meets k = 8 (5 %).
At 512 tokens the ops' own time accounts for 1.0 ms of the 2.1 (small ops barely shrink with their
rows: ``index_put_`` 80 -> 59 us at a quarter of the rows); the rest is host time between ops,
most of it waits on the async transfers, which a 1-chunk trace cannot show. Stop 23: the ops do
not have a larger fixed cost than this estimate. Timed alone, the demo's expert stage costs only
+0.26 ms per extra chunk at k = 4 (a ``[12, 256] x [256, 512]`` GEMM 70 us, against 160-176 us in the
pipelined steps). The pipelined steps took longer than that (the expert stage +2.6-3.9 ms per layer in the
in-run trace). Stop 24 ruled out the transfers as the cause: an async all-to-all beside the compute
costs the posting thread 0.36-0.83x the same call run synchronous (``benchmarks/async_handoff.py
--beside``; gloo's waits block, they do not spin), and the cores were 97-99 % busy on both sides of
the pair, so the extra time is extra CPU time on the main threads, not waiting. Pinning each rank to its own
core cut the measured cost (separate runs: +2.5 ms per step against +9.5 unpinned) but not the
in-run pair's error (46 % at k = 4). Core migrations (6 vs 10 per step) do not explain it, and in one
window the GEMMs paid no more for chunking than the expert stage alone (``benchmarks/chunk_corun.py``,
which itself read +1.5 to +4.2 ms per step at k = 4 as the VM's speed drifted). Where the rest goes
is not settled, and a 1-chunk trace does not show it. The
report prints the measured error next to this what-if (:mod:`ep_trace.analysis.whatif_checks`).
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


def _cpu_rank_cost(ev: pl.DataFrame, regions: pl.DataFrame) -> dict[int, float]:
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
    return {int(r): _cost(g, f.get(r)) for (r,), g in inside.group_by(["rank"])}


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


def per_chunk_cost(ev: pl.DataFrame, stages: pl.DataFrame, mode: dict[int, str]) -> dict[int, float]:
    """Fixed cost of one extra chunk of the dispatch -> expert -> combine region per rank, ns.

    Args:
        ev: Events (aligned clock is not needed: every time compared is the rank's own).
        stages: ``Analysis.stages`` (``cpu_start_ns``/``cpu_end_ns`` host windows, ``start_ns``/``end_ns``
            device windows).
        mode: ``rank -> 'gpu' | 'cpu'``.

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
        out |= _cpu_rank_cost(ev.filter(pl.col("rank").is_in(cpu)), _regions(st, "cpu_start_ns", "cpu_end_ns"))
    if gpu:
        st = stages.filter(pl.col("rank").is_in(gpu))
        out |= _gpu_rank_cost(ev.filter(pl.col("rank").is_in(gpu)), _regions(st, "start_ns", "end_ns"))
    return out

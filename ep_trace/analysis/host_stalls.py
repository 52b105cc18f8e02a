"""Host stalls: the device (GPU ranks) or the compute thread (CPU ranks) is idle while the host blocks inside a stage.

GPU ranks: blocking host calls — runtime ``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` /
``cudaEventSynchronize`` / synchronous ``cudaMemcpy`` (nsys and Kineto runtime rows), and the ops
``aten::_local_scalar_dense`` / ``aten::item`` (``.item()``, a D2H copy + sync). stall = the part of
the call during which no device interval of the rank runs.

CPU ranks (gloo): the count exchange before the token all-to-all — collectives with
``direction == 'count'`` (sidecar) — during which the compute thread does nothing; the blocking span
is from the later of the caller op's start and the call's last arrival (the wait before the last
arrival is barrier wait, charged to the straggler) to the end of the worker transfer; stall = the part
of it not covered by compute.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join, union
from ep_trace.analysis.queued import queued_spans

__all__ = ["host_stalls", "BLOCKING_RE"]

#: Host calls that block until the device (or a D2H copy) finishes. HIP's spell the same calls ``hip*``
#: (ROCm/HIP include/hip/hip_runtime_api.h); ``hipMemcpyWithStream`` is synchronous and is what PyTorch
#: on ROCm calls for a blocking copy (pytorch/pytorch c10/cuda/CUDAFunctions.h ``memcpy_and_sync``;
#: AMD-AGI/TraceLens' MI300X SGLang decode trace: a 463 ms ``aten::copy_`` D2H under it).
BLOCKING_RE = (
    r"^(?:cuda(?:Stream|Device|Event)Synchronize|cudaMemcpy(?:_v\d+)?$|cudaMemcpy2D|cuStreamSynchronize"
    r"|cuCtxSynchronize|hip(?:Stream|Device|Event)Synchronize|hipMemcpy(?:WithStream|DtoH|HtoD)?$|hipMemcpy2D"
    r"|aten::_local_scalar_dense$|aten::item$)"
)


def host_stalls(
    events: pl.DataFrame,
    coll: pl.DataFrame,
    act: pl.DataFrame,
    mode: dict[int, str],
    arrivals: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Blocking host calls and the device idle time under each.

    Args:
        events: Canonical events.
        coll: Collectives with ``step`` (from matching).
        act: Device activity with ``cls``.
        mode: rank -> 'gpu' / 'cpu'.
        arrivals: ``rank, coll_id, arrival_ns`` — the last arrival of the matched call on the rank's
            own clock; on CPU the stall starts there (the wait before it is barrier wait, already
            charged to the straggler).

    Returns:
        Columns ``rank, name, start_ns, end_ns, stall_ns``.
    """
    gpu = [r for r, m in mode.items() if m == "gpu"]
    cpu = [r for r, m in mode.items() if m == "cpu"]
    blk_gpu = events.filter(
        pl.col("rank").is_in(gpu)
        & pl.col("kind").is_in(["runtime", "cpu_op"])
        & pl.col("name").str.contains(BLOCKING_RE)
    ).select("rank", "name", "start_ns", "end_ns")
    busy_gpu = act.filter(pl.col("rank").is_in(gpu))
    # device idle with its next work already queued is the device's own wait, not the call's
    # (ep_trace.analysis.queued): counted as covered, like device work
    if "launch_end_ns" in busy_gpu.columns and busy_gpu.height:
        busy_gpu = pl.concat([busy_gpu.select("rank", "start_ns", "end_ns"), queued_spans(busy_gpu)])
    # gloo: the caller op returns once the work is queued; the caller then waits for the worker, so
    # the blocking span runs from the op start to the end of the worker's transfer
    cc = coll.filter(
        pl.col("rank").is_in(cpu) & (pl.col("direction") == "count") & pl.col("cpu_start_ns").is_not_null()
    )
    if arrivals is not None:
        cc = cc.join(arrivals, on=["rank", "coll_id"], how="left")
    else:
        cc = cc.with_columns(pl.lit(None, pl.Int64).alias("arrival_ns"))
    blk_cpu = cc.select(
        "rank",
        pl.col("op_name").alias("name"),
        pl.max_horizontal("cpu_start_ns", "arrival_ns").alias("start_ns"),
        pl.max_horizontal("cpu_end_ns", "end_ns").alias("end_ns"),
    )
    busy_cpu = act.filter(pl.col("rank").is_in(cpu) & (pl.col("cls") == "compute"))
    blk = pl.concat([blk_gpu, blk_cpu]).filter(pl.col("end_ns") > pl.col("start_ns")).with_row_index("bid")
    busy = union(
        pl.concat([busy_gpu.select("rank", "start_ns", "end_ns"), busy_cpu.select("rank", "start_ns", "end_ns")]),
        ["rank"],
    )
    # device time under each blocking call: the length of (call span ∩ busy span), summed per call
    covered = (pl.min_horizontal("end_ns", "b_e") - pl.max_horizontal("start_ns", "b_s")).clip(0)
    spans = busy.rename({"start_ns": "b_s", "end_ns": "b_e"})
    cov = range_join(blk, spans, ("start_ns", "end_ns"), ("b_s", "b_e")).group_by("bid").agg(covered.sum().alias("_c"))
    stall = pl.col("end_ns") - pl.col("start_ns") - pl.col("_c").fill_null(0)
    return (
        blk.join(cov, on="bid", how="left")
        .select("rank", "name", "start_ns", "end_ns", stall.alias("stall_ns"))
        .filter(pl.col("stall_ns") > 0)
        .sort(["rank", "start_ns"])
    )

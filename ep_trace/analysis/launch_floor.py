"""The device's own gap between kernels: what is left of a launch gap when the host keeps ahead.

``no_launch_gaps`` (:mod:`ep_trace.analysis.whatif`) shortens the device-idle gaps that wait for a
busy host. Even a host that is far ahead (a CUDA graph, a deep launch queue) leaves the device a
small gap between consecutive kernels: the front end's dispatch of the next one. The trace measures
it where the host *was* ahead: consecutive kernels on one stream whose second launch call had
returned before the first kernel ended (it sat queued), so the gap between them is the device's
alone. The what-if keeps that floor per gap instead of removing gaps entirely.

Measured per rank as the 25th percentile over such queued pairs, not the median: a queued kernel can
also wait for an event of another stream (``cudaStreamWaitEvent``), which gives the pairs a long tail
(``hta_torchrec_pair``: median 45-53 µs, 25th percentile 9 µs; ``hta_nccl_metadata``: 1.09 µs, a
tight distribution around the front end's ~1 µs). A rank with fewer than
:data:`MIN_QUEUED_PAIRS` of them gets no floor (the edit is then the bound: gaps removed).
"""

from __future__ import annotations

import polars as pl

__all__ = ["device_gap_floor", "MIN_QUEUED_PAIRS"]

#: Queued kernel pairs needed before a rank's floor is trusted.
MIN_QUEUED_PAIRS = 8


def device_gap_floor(events: pl.DataFrame) -> dict[int, float]:
    """Device gap between back-to-back queued kernels (25th percentile), ns, per rank.

    Args:
        events: The canonical ``events`` table (``kind``, ``launch_id`` linking a kernel to its
            runtime launch call, ``stream``, ``start_ns``, ``end_ns``).

    Returns:
        ``rank -> floor ns`` for the ranks with at least :data:`MIN_QUEUED_PAIRS` queued pairs.
    """
    # lazy: only the columns read are gathered, not every column of the events table
    k = (
        events.lazy()
        .filter((pl.col("kind") == "gpu_kernel") & pl.col("stream").is_not_null())
        .select("rank", "device", "stream", "start_ns", "end_ns", "launch_id")
        .collect()
    )
    if k.is_empty():
        return {}
    launches = (
        events.lazy()
        .filter(pl.col("kind") == "runtime")
        .select("rank", pl.col("event_id").alias("launch_id"), pl.col("end_ns").alias("_launch_end"))
        .collect()
    )
    by = ["rank", "device", "stream"]
    pairs = (
        k.join(launches, on=["rank", "launch_id"], how="left")
        .sort([*by, "start_ns"])
        .with_columns(
            pl.col("end_ns").shift(1).over(by).alias("_prev_end"),
        )
        .filter(
            pl.col("_prev_end").is_not_null()
            & pl.col("_launch_end").is_not_null()
            & (pl.col("_launch_end") <= pl.col("_prev_end"))  # queued before the previous kernel ended
            & (pl.col("start_ns") >= pl.col("_prev_end"))  # not concurrent
        )
        .with_columns((pl.col("start_ns") - pl.col("_prev_end")).alias("_gap"))
    )
    per = pairs.group_by("rank").agg(
        pl.col("_gap").quantile(0.25, interpolation="linear").alias("_f"), pl.len().alias("_n")
    )
    per = per.filter(pl.col("_n") >= MIN_QUEUED_PAIRS)
    return {int(r): float(f) for r, f in per.select("rank", "_f").iter_rows()}

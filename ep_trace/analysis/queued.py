"""Queued device idle: the device is idle although its next work was already launched.

A device-idle span ends when the next device work starts. When that work's launch call had returned
before the span ended, the work sat in the device queue: the device waited on something other than its
host (an event of another stream, a dependency, or work outside the trace: AMD-AGI/TraceLens' MI300X
vLLM decode trace replays a HIP graph whose input copies start 7.8 ms after their ``hipMemcpyAsync``
returned; in its SGLang decode trace a ``hipStreamWaitEvent`` keeps the queued work waiting 463 ms while
the host blocks in a ``hipMemcpyWithStream``). Such time is neither a launch gap (the host was not
late) nor a host stall (ending the blocking call would start nothing sooner). Only the part of an idle
span before the next work's launch returned (plus :data:`DISPATCH_NS`) is the host's.

Work without a linked launch (``launch_end_ns`` null) splits nothing: its span stays the host's.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import union

__all__ = ["split_at_launch", "queued_spans", "END_TOL_NS", "DISPATCH_NS"]

#: An idle span ends at the start of the work that ends it, up to this clock rounding, ns.
END_TOL_NS = 1_000
#: A launch takes effect a little after its call returns (the device front end's dispatch); work waits
#: queued only beyond this, ns: about twice the device gap floors measured on the real traces (1.1-9 µs,
#: :mod:`ep_trace.analysis.launch_floor`), so a host-bound step's gaps stay the host's whole.
DISPATCH_NS = 10_000


def split_at_launch(
    idle: pl.DataFrame, activity: pl.DataFrame, offsets: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split idle spans at the launch end of the work that ends each.

    Args:
        idle: Idle spans ``rank, start_ns, end_ns`` (and any key columns, kept), on the clock of
            ``activity`` plus ``offsets``.
        activity: Device activity ``rank, start_ns, launch_end_ns`` (own clock).
        offsets: ``rank, offset_ns`` added to the activity's times (the aligned clock); None: none.

    Returns:
        ``(host_part, queued)``: both with ``idle``'s columns, pieces of positive length.
    """
    if "launch_end_ns" not in activity.columns or idle.is_empty():
        return idle, idle.head(0)
    rank_t = idle.schema["rank"]
    nxt = activity.filter(pl.col("launch_end_ns").is_not_null()).select(
        pl.col("rank").cast(rank_t), "start_ns", "launch_end_ns"
    )
    off = pl.lit(0, pl.Int64)
    if offsets is not None:
        nxt = nxt.join(offsets.with_columns(pl.col("rank").cast(rank_t)), on="rank", how="left")
        off = pl.col("offset_ns").fill_null(0)
    nxt = nxt.select("rank", (pl.col("start_ns") + off).alias("_ns"), (pl.col("launch_end_ns") + off).alias("_le"))
    cols = idle.columns
    h = idle.sort("end_ns").join_asof(
        nxt.sort("_ns"), left_on="end_ns", right_on="_ns", by="rank", strategy="forward", check_sortedness=False
    )
    ends_it = (pl.col("_ns") - pl.col("end_ns")).abs() <= END_TOL_NS
    ready = pl.col("_le") + DISPATCH_NS
    cut = pl.when(ends_it & (ready < pl.col("end_ns"))).then(pl.max_horizontal("start_ns", ready))
    h = h.with_columns(cut.fill_null(pl.col("end_ns")).alias("_q"))
    host = h.with_columns(pl.col("_q").alias("end_ns")).filter(pl.col("end_ns") > pl.col("start_ns"))
    queued = h.with_columns(pl.col("_q").alias("start_ns")).filter(pl.col("end_ns") > pl.col("start_ns"))
    return host.select(cols), queued.select(cols)


def queued_spans(act: pl.DataFrame) -> pl.DataFrame:
    """The queued idle spans of each rank's device timeline (``rank, start_ns, end_ns``, own clock).

    Args:
        act: Device activity of GPU ranks (``rank, start_ns, end_ns, launch_end_ns``).
    """
    busy = union(act.select("rank", "start_ns", "end_ns"), ["rank"]).sort("rank", "start_ns")
    prev_end = pl.col("end_ns").shift(1).over("rank")
    gaps = busy.select("rank", prev_end.alias("start_ns"), pl.col("start_ns").alias("end_ns")).filter(
        pl.col("start_ns").is_not_null() & (pl.col("end_ns") > pl.col("start_ns"))
    )
    return split_at_launch(gaps, act)[1]

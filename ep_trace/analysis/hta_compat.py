"""HTA-compatible comm/compute overlap: HolisticTraceAnalysis 0.5.0 ``get_comm_comp_overlap``.

Reproduces, on the canonical tables, what ``hta/analyzers/communication_analysis.py`` computes so
that the two figures can be compared on the same file:

* GPU events = kernels, memcpy and memset rows (HTA: rows with a stream);
* step filter (``Trace._filter_irrelevant_gpu_kernels``): when the trace set holds more than one
  distinct ``ProfilerStep`` name, keep only device rows whose launching runtime call starts before
  the start of the rank's last ``ProfilerStep`` (no filter with a single step name);
* µs rounding (``round_down_time_stamps``): start = ceil(µs), end = floor(µs) (a no-op on integer-µs
  traces, where HTA does not round either);
* classification by name (``hta/utils/utils.py``): communication = ``^nccl.*Kernel``; computation =
  not ``^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)``; memory copies are neither;
* overlap = |∪comm ∩ ∪comp| / |∪comm|, reported as a percentage rounded to 2 decimals (NaN -> null
  when a rank has no communication kernel).

Known departure: HTA finds the rank with a regex over the raw file and falls back to rank 0; here the
rank is the parser's.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import overlap_lengths

__all__ = ["hta_overlap", "HTA_COMM_RE", "HTA_NOT_COMPUTE_RE"]

HTA_COMM_RE = r"^nccl.*Kernel"
HTA_NOT_COMPUTE_RE = r"^(?:nccl.*Kernel|.*Memcpy|Memset|.*Sync)"


def hta_overlap(events: pl.DataFrame, multi_step: bool | None = None) -> pl.DataFrame:
    """Per rank: ``rank, comm_us, overlap_us, comp_comm_overlap_pctg`` as HTA 0.5.0 computes them.

    ``multi_step``: whether the whole trace set holds more than one ``ProfilerStep`` name (HTA's
    step filter), when ``events`` are only some of its ranks; None: counted on ``events``."""
    dev = events.filter(pl.col("kind").is_in(["gpu_kernel", "gpu_memcpy", "gpu_memset"]))
    steps = events.filter(pl.col("seq").is_not_null())
    if steps["seq"].n_unique() > 1 if multi_step is None else multi_step:
        rt = events.filter(pl.col("kind") == "runtime")
        by_id = dev.join(
            rt.select("rank", pl.col("event_id").alias("launch_id"), pl.col("start_ns").alias("_l")),
            on=["rank", "launch_id"],
            how="left",
        )
        by_corr = (
            rt.filter(pl.col("correlation").is_not_null())
            .select("rank", "correlation", pl.col("start_ns").alias("_lc"))
            .unique(["rank", "correlation"])
        )
        dev = by_id.join(by_corr, on=["rank", "correlation"], how="left").with_columns(
            pl.coalesce("_l", "_lc").alias("_launch")
        )
        last = steps.group_by("rank").agg(((pl.col("start_ns") + 999) // 1000).max().alias("_last_us"))
        dev = dev.join(last, on="rank", how="left").filter(((pl.col("_launch") + 999) // 1000) < pl.col("_last_us"))
    d = dev.select(
        "rank",
        "name",
        ((pl.col("start_ns") + 999) // 1000).alias("start_ns"),  # ceil to µs (kept in µs units)
        (pl.col("end_ns") // 1000).alias("end_ns"),  # floor to µs
    )
    names = d.select(pl.col("name").unique()).with_columns(
        pl.col("name").str.contains(HTA_COMM_RE).alias("_comm"),
        ~pl.col("name").str.contains(HTA_NOT_COMPUTE_RE).alias("_comp"),
    )
    d = d.join(names, on="name", how="left")
    comm = d.filter(pl.col("_comm"))
    comp = d.filter(pl.col("_comp"))
    ov = overlap_lengths(comm, comp, ["rank"])
    ranks = events.select(pl.col("rank").unique().sort())
    return ranks.join(ov, on="rank", how="left").select(
        "rank",
        pl.col("a_ns").fill_null(0).alias("comm_us"),
        pl.col("both_ns").fill_null(0).alias("overlap_us"),
        pl.when(pl.col("a_ns") > 0)
        .then((100.0 * pl.col("both_ns") / pl.col("a_ns")).round(2))
        .alias("comp_comm_overlap_pctg"),
    )

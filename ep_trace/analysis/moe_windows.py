"""MoE windows: which activity lies inside an MoE layer, found by a higher tier (stage_tiers.py).

An activity row lies in an MoE window when its launch falls in a host window of the layer (a framework
MoE op or range, an ``nn.Module`` MoE block, an op window: the containers; or the span from a layer's
first to its last stage range with a layer number), CPU compute pieces clipped to those windows; or,
for a layer found by its kernel families alone (a CUDA-graph replay runs no host op), when the
previous and the next family kernel on its stream belong to that one layer. The name-token tier and
the coverage (``stage_coverage.py``) read these windows: ``mw`` (window id) and ``layer``.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join

__all__ = ["MOE_STAGES", "host_windows", "assign_windows", "sandwiched", "device_mw"]

#: Stages that make up an MoE layer (attention is not one).
MOE_STAGES = ("route", "permute", "dispatch", "expert", "combine", "unpermute", "shared_expert", "all_to_all")


def host_windows(cont: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """MoE host windows: the containers (framework MoE ops, module blocks, op windows) and, for layers
    found by stage ranges, the span from a layer's first MoE range to its last one:
    ``mw, rank, layer, cpu_start_ns, cpu_end_ns``."""
    c = cont.select(
        ("c" + pl.col("cid").cast(pl.Utf8)).alias("mw"),
        "rank",
        pl.col("c_layer").alias("layer"),
        "cpu_start_ns",
        "cpu_end_ns",
    )
    r = (
        ranges.filter(pl.col("stage").is_in(MOE_STAGES) & pl.col("layer").is_not_null())
        .group_by("rank", "step", "layer")
        .agg(pl.col("cpu_start_ns").min(), pl.col("cpu_end_ns").max())
        .sort("rank", "cpu_start_ns")
        .with_row_index("_i")
        .select(("r" + pl.col("_i").cast(pl.Utf8)).alias("mw"), "rank", "layer", "cpu_start_ns", "cpu_end_ns")
    )
    return pl.concat([c, r.cast({"layer": pl.Int32})], how="vertical_relaxed")


def assign_windows(x: pl.DataFrame, host: pl.DataFrame, cpu: list[int]) -> pl.DataFrame:
    """``x`` (activity rows) with the MoE host window ``mw`` and ``layer`` each lies in (null = none):
    device work by its launch inside the window, CPU compute pieces clipped to the windows they overlap."""
    x = x.with_row_index("_x")
    on_cpu = pl.col("rank").is_in(cpu) & (pl.col("cls") == "compute")
    g, c = x.filter(~on_cpu), x.filter(on_cpu)
    hs = host.select("mw", "rank", "layer", pl.col("cpu_start_ns").alias("_hs"), pl.col("cpu_end_ns").alias("_he"))
    by_host = range_join(g.select("_x", "rank", "anchor_ns"), hs, ("anchor_ns", "anchor_ns"), ("_hs", "_he"))
    g = g.join(by_host.select("_x", "mw", "layer").unique("_x", keep="first"), on="_x", how="left")
    if c.height:
        cj = (
            range_join(c, hs, ("start_ns", "end_ns"), ("_hs", "_he"))
            .with_columns(
                pl.max_horizontal("start_ns", "_hs").alias("start_ns"),
                pl.min_horizontal("end_ns", "_he").alias("end_ns"),
            )
            .filter(pl.col("end_ns") > pl.col("start_ns"))
        )
        c = pl.concat([cj.drop("_hs", "_he"), c.join(cj.select("_x"), on="_x", how="anti")], how="diagonal_relaxed")
    return pl.concat([g, c], how="diagonal_relaxed").drop("_x")


def device_mw(rank: pl.Expr, step: pl.Expr, layer: pl.Expr) -> pl.Expr:
    return pl.concat_str([pl.lit("d"), rank, step, layer], separator=":")


def sandwiched(rest: pl.DataFrame, fam: pl.DataFrame) -> pl.DataFrame:
    """MoE windows on the device, for layers found by their family kernels alone (a CUDA-graph replay
    runs no host op): a kernel outside every host window whose previous and next family kernels on its
    stream (within the step) belong to one MoE layer lies in that layer's window.

    Args:
        rest: Unclaimed activity with ``mw`` / ``layer`` from the host windows.
        fam: The family kernels with ``layer``, ``cid`` (their container) and ``stream``.
    """
    if fam.is_empty() or rest.is_empty():
        return rest
    lab = fam.filter(pl.col("cid").is_null() & pl.col("layer").is_not_null() & pl.col("step").is_not_null())
    free = rest.with_row_index("_x").filter(pl.col("mw").is_null() & pl.col("stream").is_not_null())
    k = pl.concat(
        [
            lab.select(
                "rank",
                "step",
                "stream",
                "start_ns",
                pl.col("layer").cast(pl.Int32),
                pl.lit(None, pl.UInt32).alias("_x"),
            ),
            free.select("rank", "step", "stream", "start_ns", pl.lit(None, pl.Int32).alias("layer"), "_x"),
        ]
    ).sort("rank", "stream", "start_ns")
    by = ["rank", "stream", "step"]
    prev, nxt = pl.col("layer").forward_fill().over(by), pl.col("layer").backward_fill().over(by)
    hit = (
        k.with_columns(prev.alias("_p"), nxt.alias("_n"))
        .filter(pl.col("_x").is_not_null() & (pl.col("_p") == pl.col("_n")))
        .select("_x", pl.col("_p").alias("_l"))
    )
    out = rest.with_row_index("_x").join(hit, on="_x", how="left")
    mw = device_mw(pl.col("rank"), pl.col("step"), pl.col("_l"))
    return out.with_columns(
        pl.when(pl.col("_l").is_not_null()).then(mw).otherwise(pl.col("mw")).alias("mw"),
        pl.coalesce("layer", "_l").alias("layer"),
    ).drop("_x", "_l")

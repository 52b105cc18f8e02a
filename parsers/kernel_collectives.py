"""Collectives built from communication kernels that no collective op launched.

NCCL / RCCL / gloo calls reach the trace as a collective op (``c10d::alltoall_base_``, an NCCL NVTX
range) that the Kineto and Nsight parsers turn into ``collectives`` rows. EP libraries and
custom all-reduces do not: DeepEP, pplx-kernels, MORI and TensorRT-LLM all-to-all kernels, torch
symmetric-memory and vLLM / SGLang custom all-reduce kernels are launched from C++ bindings, so
without this step their time would count as communication but no call would be matched, waited on
or overlapped per call.

NCCL kernels normally reach the trace under a collective op; vLLM's ``PyNcclCommunicator``
(vllm/distributed/device_communicators/pynccl.py) calls NCCL through ctypes, so its calls have no op
and no ``record_param_comms`` in a Kineto trace, only the kernel (vLLM's default expert-parallel
backend, ``allgather_reducescatter``: ``AgRsAll2AllManager`` in
vllm/distributed/device_communicators/all2all.py, dispatches with ``all_gatherv`` and combines with
``reduce_scatterv`` through it). Such a kernel is one call too: its type is read from the kernel
name (``ncclDevKernel_<Coll>_...``, ``ncclKernel_<Coll>_...``, NVIDIA/nccl src/device/generate.py),
its process group is ``nccl:<type>`` (calls are matched by their order among the rank's calls of
that type in the step; a count that differs between ranks leaves the group unmatched, as for any
ordinal match).

One row per call per rank: every such kernel is one call, except that a DeepEP notify kernel
(``notify_dispatch``, ``cached_notify_dispatch``, ``cached_notify_combine``, ``cached_notify``,
``clean_low_latency_buffer``; deepseek-ai/DeepEP csrc/kernels/legacy/*.cu) only exchanges the counts
of the dispatch / combine kernel that follows it on the rank, so it joins that call. Type: the
launching op's name when it names a collective (``vllm::all_reduce``,
``symm_mem::two_shot_all_reduce_``), else the family's (:data:`ep_trace.comm_classifier.FAMILY_COLLECTIVE`).
``pg_name`` is the family, so calls are matched across ranks by their order within the family and
step; ``direction`` is ``dispatch`` / ``combine`` where the kernel family says so.
"""

from __future__ import annotations

import polars as pl

from ep_trace import schema
from ep_trace.comm_classifier import FAMILY_COLLECTIVE, comm_family_expr
from ep_trace.parsers.collective_names import normalise_collective

__all__ = ["with_kernel_collectives", "KERNEL_COLLECTIVE_FAMILIES"]

#: Families whose kernels become collectives here. NCCL kernels come from their ops / ranges, and
#: here only when no op or range claimed them (``coll_id`` still null).
KERNEL_COLLECTIVE_FAMILIES = (*FAMILY_COLLECTIVE, "nccl")

#: The collective token of an NCCL kernel name: ``ncclDevKernel_AllGather_RING_LL``,
#: ``ncclKernel_ReduceScatter_RING_LL_Sum_half`` (< 2.19), ``ncclAllReduceRingLLKernel_sum_f32`` (< 2.4).
_NCCL_COLL = r"^(?:void\s+)?(?:::)?nccl(?:Dev)?Kernel_([A-Za-z]+)|^(?:void\s+)?(?:::)?nccl((?:All)?(?:Gather|Reduce|ReduceScatter|Broadcast|SendRecv))(?:Ring|Tree|CollNet)"
_NCCL_TYPE = {
    "allgather": "allgather",
    "reducescatter": "reduce_scatter",
    "allreduce": "allreduce",
    "broadcast": "broadcast",
}

_NOTIFY = r"::(?:notify_dispatch|cached_notify_dispatch|cached_notify_combine|cached_notify|clean_low_latency_buffer|barrier)\b"
_DISPATCH = r"(?i)dispatch"
_COMBINE = r"(?i)combine"


def with_kernel_collectives(tables: schema.TraceTables) -> schema.TraceTables:
    """Add a ``collectives`` row per EP / custom all-reduce call and link its kernels (``coll_id``).

    Args:
        tables: Validated canonical tables.

    Returns:
        The tables with the new rows (unchanged when no such kernel is unlinked).
    """
    from dataclasses import replace

    ev = tables.events
    k = ev.filter((pl.col("kind") == "gpu_kernel") & pl.col("coll_id").is_null()).select(
        "rank", "event_id", "name", "start_ns", "end_ns", "op_id"
    )
    if k.is_empty():
        return tables
    fam = k.select(pl.col("name").unique()).with_columns(comm_family_expr(pl.col("name")).alias("_fam"))
    k = k.join(fam, on="name").filter(pl.col("_fam").is_in(KERNEL_COLLECTIVE_FAMILIES))
    if k.is_empty():
        return tables
    notify = (pl.col("_fam") == "deepep") & pl.col("name").str.contains(_NOTIFY)
    k = k.sort(["rank", "start_ns"]).with_columns(notify.alias("_notify"))
    # a notify kernel joins the next non-notify kernel of its family on the rank
    k = k.with_columns(
        (~pl.col("_notify")).cast(pl.Int64).cum_sum().over(["rank", "_fam"]).alias("_n"),
    ).with_columns(pl.when(pl.col("_notify")).then(pl.col("_n") + 1).otherwise(pl.col("_n")).alias("_call"))
    ops = ev.select("rank", pl.col("event_id").alias("op_id"), pl.col("name").alias("_op"), "start_ns", "end_ns")
    ops = ops.rename({"start_ns": "_ops", "end_ns": "_ope"})
    k = k.join(ops, on=["rank", "op_id"], how="left")
    base = (
        tables.collectives.group_by("rank").agg(pl.col("coll_id").max().alias("_base"))
        if tables.collectives.height
        else pl.DataFrame(schema={"rank": pl.Int32, "_base": pl.Int64})
    )
    calls = (
        k.group_by(["rank", "_fam", "_call"])
        .agg(
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.len().cast(pl.Int32).alias("n_kernels"),
            pl.col("event_id"),
            pl.col("name").filter(~pl.col("_notify")).first().alias("_main"),
            pl.col("name").first().alias("_first"),
            pl.col("_op").filter(~pl.col("_notify")).first(),
            pl.col("op_id").filter(~pl.col("_notify")).first(),
            pl.col("_ops").filter(~pl.col("_notify")).first().alias("cpu_start_ns"),
            pl.col("_ope").filter(~pl.col("_notify")).first().alias("cpu_end_ns"),
        )
        .sort(["rank", "start_ns"])
        .join(base, on="rank", how="left")
        .with_columns(
            (pl.col("_base").fill_null(-1) + 1 + pl.int_range(pl.len()).over("rank")).cast(pl.Int64).alias("coll_id"),
            pl.coalesce("_main", "_first").alias("_kname"),
        )
    )
    op_types = {n: normalise_collective(n) for n in calls["_op"].drop_nulls().unique().to_list()}
    op_type = pl.col("_op").replace_strict(op_types, default="unknown", return_dtype=pl.Utf8)
    fam_type = pl.col("_fam").replace_strict(FAMILY_COLLECTIVE, default="unknown", return_dtype=pl.Utf8)
    token = pl.coalesce(
        pl.col("_kname").str.extract(_NCCL_COLL, 1), pl.col("_kname").str.extract(_NCCL_COLL, 2)
    ).str.to_lowercase()
    # Reduce, SendRecv (a point-to-point or a grouped all-to-all: the kernel cannot tell) stay unknown
    nccl_type = token.replace_strict(_NCCL_TYPE, default="unknown", return_dtype=pl.Utf8)
    fam_type = pl.when(pl.col("_fam") == "nccl").then(nccl_type).otherwise(fam_type)
    direction = (
        pl.when(pl.col("_fam").is_in(["deepep", "pplx", "mori", "trtllm_moe_a2a"]))
        .then(
            pl.when(pl.col("_kname").str.contains(_DISPATCH))
            .then(pl.lit("dispatch"))
            .when(pl.col("_kname").str.contains(_COMBINE))
            .then(pl.lit("combine"))
        )
        .otherwise(None)
    )
    rows = calls.with_columns(
        pl.when(op_type != "unknown").then(op_type).otherwise(fam_type).alias("collective"),
        pl.coalesce("_op", "_kname").alias("op_name"),
        pl.col("_fam").alias("backend"),
    ).with_columns(
        pl.when(pl.col("_fam") == "nccl")
        .then(pl.format("nccl:{}", pl.col("collective")))
        .otherwise(pl.col("_fam"))
        .alias("pg_name"),
    )
    rows = rows.with_columns(
        pl.int_range(pl.len()).over(["rank", "pg_name"]).cast(pl.Int64).alias("ordinal"),
        pl.lit(False).alias("splits_truncated"),
        direction.alias("direction"),
    )
    new_coll = schema.conform("collectives", rows)
    link = rows.select("rank", pl.col("coll_id").alias("_cid"), "event_id").explode("event_id")
    events = (
        ev.join(link, on=["rank", "event_id"], how="left")
        .with_columns(pl.coalesce("coll_id", "_cid").alias("coll_id"))
        .drop("_cid")
    )
    coll = pl.concat([tables.collectives, new_coll], how="vertical")
    return replace(tables, events=schema.conform("events", events), collectives=coll)

"""Collectives from nsys input: comm kernels grouped into calls through the NVTX ranges of their launch.

Why not the kernel name: one ``ncclDevKernel_SendRecv`` (NCCL >= 2.19) or
``ncclKernel_SendRecv_*`` serves all-to-all, p2p and grouped all-reduce / all-gather
(NVIDIA/nccl#739; HTA's torchrec traces). The collective type comes from the enclosing ranges of
the *launch*: PyTorch's ranges (``nccl:all_to_all``, ``c10d::alltoall_base_`` ...) when the job ran
with NVTX / ``emit_nvtx``, else NCCL's own NVTX API ranges (``ncclAllReduce``; for grouped p2p the
launch sits inside ``ncclGroupEnd`` and the ``ncclSend`` / ``ncclRecv`` ranges since the matching
``ncclGroupStart`` on the same thread tell what the group held).

One call = the innermost enclosing range that names a collective (several kernels launched under
one ``nccl:all_to_all`` are one call); without such a range, the enclosing ``ncclGroupEnd`` (or other
NCCL API range); without any, the kernel alone (collective ``unknown``). No split sizes: nsys has
none (NCCL payload blobs are undocumented); the dispatcher merges an ep-trace sidecar when present.
"""

from __future__ import annotations

import polars as pl

from ep_trace.parsers.collective_names import collective_range_types
from ep_trace.parsers.nsys_project import enclosing_pairs

__all__ = ["group_collectives"]

#: NCCL API range names (registered strings of NCCL's NVTX domain) that can enclose a launch.
_NCCL_API = r"^nccl[A-Z]\w*$"

_BACKEND = {
    "nccl": "nccl",
    "rccl": "rccl",
    "msccl": "msccl",
    "deepep": "deepep",
    "pplx": "pplx",
    "nvshmem": "nvshmem",
    "trtllm_moe_a2a": "trtllm",
    "custom_allreduce": "custom_allreduce",
}


def _group_contents(ranges: pl.DataFrame) -> pl.DataFrame:
    """Per ``ncclGroupEnd`` range: numbers of ``ncclSend`` / ``ncclRecv`` since the matching
    ``ncclGroupStart`` on the same thread (columns ``_range``, ``n_send``, ``n_recv``)."""
    api = ranges.filter(pl.col("name").str.contains(r"^nccl(?:GroupStart|GroupEnd|Send|Recv)$")).sort("_gtid", "_rs")
    api = api.with_columns(_g=(pl.col("name") == "ncclGroupStart").cum_sum().over("_gtid"))
    counts = api.group_by("_gtid", "_g").agg(
        (pl.col("name") == "ncclSend").sum().alias("n_send"), (pl.col("name") == "ncclRecv").sum().alias("n_recv")
    )
    return (
        api.filter(pl.col("name") == "ncclGroupEnd")
        .join(counts, on=["_gtid", "_g"], how="left")
        .select("_uid", pl.col("n_send").cast(pl.Int64), pl.col("n_recv").cast(pl.Int64))
        .rename({"_uid": "_range"})
    )


def group_collectives(
    comm_ops: pl.DataFrame, ranges: pl.DataFrame, pairs: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Group comm kernels into collective calls.

    Args:
        comm_ops: One row per comm kernel: ``_uid``, ``_proc``, ``_gtid`` / ``_ls`` / ``_le``
            (launch thread, start, end; null without a launch), ``start``, ``end``, ``family``,
            ``short_name``.
        ranges: Projectable NVTX ranges: ``_uid``, ``_gtid``, ``_rs``, ``_re``, ``name``.
        pairs: :func:`enclosing_pairs` of ``comm_ops`` (or a superset) when already computed.

    Returns:
        ``(calls, members)``: calls with ``_call`` (the call key: the call range's ``_uid`` or the
        kernel's), ``_proc``, ``collective``, ``op_name``, ``backend``, ``group_size``, ``_op_uid``,
        ``cpu_start``, ``cpu_end``, ``start``, ``end``, ``n_kernels``; members map kernel
        ``_uid`` -> ``_call``.
    """
    if pairs is None:
        launched = comm_ops.filter(pl.col("_ls").is_not_null())
        pairs = enclosing_pairs(
            launched.select("_uid", "_gtid", "_ls", "_le"), ranges.select("_uid", "_gtid", "_rs", "_re")
        )
    pairs = pairs.filter(pl.col("_op").is_in(comm_ops["_uid"].implode()))
    groups = _group_contents(ranges)
    named = pairs.join(ranges.select(pl.col("_uid").alias("_range"), "name"), on="_range")
    named = named.with_columns(
        collective_range_types(named["name"]).alias("_type"), pl.col("name").str.contains(_NCCL_API).alias("_api")
    )
    order = ["_op", "_rs", "_re", "_range"]
    desc = [False, True, False, True]
    typed = named.filter(pl.col("_type").is_not_null()).sort(order, descending=desc).unique("_op", keep="first")
    api = (
        named.filter(pl.col("_api") & ~pl.col("_op").is_in(typed["_op"].implode()))
        .sort(order, descending=desc)
        .unique("_op", keep="first")
        .join(groups, on="_range", how="left")
        .with_columns(
            pl.when((pl.col("n_send") > 0) & (pl.col("n_recv") == 0))
            .then(pl.lit("send"))
            .when((pl.col("n_recv") > 0) & (pl.col("n_send") == 0))
            .then(pl.lit("recv"))
            .otherwise(pl.lit("unknown"))
            .alias("_type")
        )
    )
    # Group size of a PyTorch all-to-all over NCCL: one ncclSend per peer, self included.
    sends = (
        named.filter(pl.col("name") == "ncclGroupEnd")
        .sort(order, descending=desc)
        .unique("_op", keep="first")
        .join(groups, on="_range")
        .select("_op", pl.col("n_send").alias("_n_send"))
    )
    cols = ["_op", "_range", "_rs", "_re", "name", "_type"]
    ctx = pl.concat([typed.select(cols), api.select(cols)]).join(sends, on="_op", how="left")
    members = comm_ops.join(ctx.rename({"_op": "_uid"}), on="_uid", how="left").with_columns(
        pl.coalesce("_range", "_uid").alias("_call"),
        pl.col("_type").fill_null("unknown"),
        pl.coalesce("name", "short_name").alias("op_name"),
    )
    calls = members.group_by("_call").agg(
        pl.col("_proc").first(),
        pl.col("_type").first().alias("collective"),
        pl.col("op_name").first(),
        pl.col("family").first().replace_strict(_BACKEND, default=None, return_dtype=pl.Utf8).alias("backend"),
        pl.when(pl.col("_type").first() == "all_to_all").then(pl.col("_n_send").max()).alias("group_size"),
        pl.col("_range").first().alias("_op_uid"),
        pl.col("_rs").first().alias("cpu_start"),
        pl.col("_re").first().alias("cpu_end"),
        pl.col("start").min(),
        pl.col("end").max(),
        pl.len().alias("n_kernels"),
    )
    return calls, members.select("_uid", "_call")

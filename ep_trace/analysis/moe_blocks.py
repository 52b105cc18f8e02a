"""MoE blocks from ``nn.Module`` Python frames (tier ``module``), name-independent.

With ``with_stack=True`` (vLLM's and SGLang's default; Megatron's ``--pytorch-profiler-collect-callstack``)
torch's stack tracer writes every module call as a Python frame named ``nn.Module: <Class>_<n>``
(``torch/csrc/autograd/profiler_python.cpp``; ``<n>`` numbers the instances of a class), nested by
call. A kernel belongs to the module frames enclosing its launch on the launching thread (launch ->
correlation -> the runtime call's time and thread, :mod:`ep_trace.analysis.activity`).

A module frame is an MoE block when its class name says so (the ``block`` rows of the knowledge
table's ``[[module]]`` section: ``...MoE``, ``...SparseMoeBlock``, ``...MoELayer``, ``...SparseMLP``),
or when its children are a router and experts:

* experts: children whose class says so (``FusedMoE``, ``...Experts``, ``GroupedMLP``, ...), or several
  instances of one class that each run at least two linear modules (an ``nn.ModuleList`` of FFNs:
  Switch Transformer's ``FeedForward``\\ s, HF Mixtral's ``MixtralBlockSparseTop2MLP``\\ s);
* a router: a child whose class says so (``SwitchGate``, ``TopKRouter``, ...), or a linear child called
  before the first expert (vLLM's gpt-oss ``MLPBlock``: ``Linear`` router, ``FusedMoE`` experts), for
  experts found by repetition only when a ``topk`` op runs in the block too.

The outermost block of nested ones is the layer. An experts module outside every block (its class
says ``Experts`` / ``FusedMoE`` / ``GroupedMLP`` ..., its parent was not recognised) is a layer of its
own whose work is all expert work (:func:`lone_experts`). Its children then become items of the layer's
segments (:mod:`ep_trace.analysis.moe_segments`): router -> ``route``, experts -> ``expert``, shared
expert -> ``shared``; other children and the block's own top-level ops fill the gaps by position.
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join
from ep_trace.knowledge import first_match_expr, rows

__all__ = ["module_frames", "moe_blocks", "block_children", "lone_experts"]

_MOD = r"^nn\.Module: (.+?)(?:_\d+)?$"
_ROLES = tuple((r.stage, r.pattern) for r in rows("module"))


def module_frames(events: pl.DataFrame) -> pl.DataFrame:
    """``nn.Module`` frames: ``rank, tid, fid, cls, role, start_ns, end_ns, parent`` (innermost
    enclosing module frame on the same thread, null at the top) and ``n_linear`` (linear-module
    frames inside it)."""
    f = (
        events.lazy()
        .filter((pl.col("kind") == "python_frame") & pl.col("name").str.starts_with("nn.Module: "))
        .select("rank", "tid", pl.col("event_id").alias("fid"), "name", "start_ns", "end_ns")
        .collect()
    )
    if f.is_empty():
        return f.drop("name").with_columns(
            pl.lit(None, pl.Utf8).alias("cls"),
            pl.lit(None, pl.Utf8).alias("role"),
            pl.lit(None, pl.Int64).alias("parent"),
            pl.lit(0, pl.UInt32).alias("n_linear"),
        )
    cls = f.select(pl.col("name").unique()).with_columns(pl.col("name").str.extract(_MOD, 1).alias("cls"))
    cls = cls.with_columns(first_match_expr(pl.col("cls"), _ROLES).alias("role"))
    f = f.join(cls, on="name", how="left").drop("name")
    pairs = range_join(
        f.select("rank", "tid", "fid", "start_ns", "end_ns"),
        f.select(
            "rank",
            "tid",
            pl.col("fid").alias("pfid"),
            pl.col("start_ns").alias("_ps"),
            pl.col("end_ns").alias("_pe"),
        ),
        ("start_ns", "start_ns"),
        ("_ps", "_pe"),
        by=("rank", "tid"),
    ).filter((pl.col("pfid") != pl.col("fid")) & (pl.col("_pe") >= pl.col("end_ns")))
    parent = (
        pairs.sort(["fid", "_ps", "_pe", "pfid"], descending=[False, True, False, False])
        .unique("fid", keep="first")
        .select("fid", pl.col("pfid").alias("parent"))
    )
    linear = pairs.filter(pl.col("fid").is_in(f.filter(pl.col("role") == "linear")["fid"].implode()))
    n_linear = linear.group_by("pfid").agg(pl.len().alias("n_linear")).rename({"pfid": "fid"})
    return (
        f.join(parent, on="fid", how="left")
        .join(n_linear, on="fid", how="left")
        .with_columns(pl.col("n_linear").fill_null(0))
    )


def block_children(frames: pl.DataFrame, topk_blocks: pl.Series) -> pl.DataFrame:
    """The children of every candidate block with their ``item`` role (``router``, ``expert``, ``shared``,
    ``other``) and whether their parent ``is_block`` (the rules of the module doc).

    Args:
        frames: :func:`module_frames`.
        topk_blocks: ``fid`` of the frames inside which a ``topk`` op runs.
    """
    ch = frames.filter(pl.col("parent").is_not_null()).rename({"parent": "bid"})
    grp = (
        ch.filter(pl.col("role").is_null())
        .group_by("bid", "cls")
        .agg(pl.col("fid").n_unique().alias("_n"), pl.col("n_linear").max().alias("_nl"))
        .filter((pl.col("_n") >= 2) & (pl.col("_nl") >= 2))
        .select("bid", "cls", pl.lit(True).alias("_grp"))
    )
    ch = ch.join(grp, on=["bid", "cls"], how="left").with_columns(pl.col("_grp").fill_null(False))
    named = pl.col("role") == "experts"
    expert = named | pl.col("_grp")
    ch = ch.with_columns(
        expert.alias("_exp"),
        pl.when(expert).then(pl.col("start_ns")).min().over("bid").alias("_e0"),
        named.any().over("bid").alias("_named"),
        pl.col("_grp").any().over("bid").alias("_rep"),
    )
    before = pl.col("start_ns") < pl.col("_e0")
    router = (pl.col("role") == "router") & before.fill_null(True)
    gate = (pl.col("role") == "linear") & before.fill_null(False)
    ch = ch.with_columns(router.alias("_router"), gate.alias("_gate"))
    has_router = pl.col("_router").any().over("bid")
    has_gate = pl.col("_gate").any().over("bid")
    topk = pl.col("bid").is_in(topk_blocks.implode())
    is_block = (pl.col("_named") & (has_router | has_gate)) | (pl.col("_rep") & (has_router | (has_gate & topk)))
    item = (
        pl.when(pl.col("_exp"))
        .then(pl.lit("expert"))
        .when(pl.col("role") == "shared")
        .then(pl.lit("shared"))
        .when(pl.col("_router") | pl.col("_gate"))
        .then(pl.lit("route"))
        .otherwise(pl.lit("other"))
    )
    return ch.with_columns(item.alias("cat"), is_block.alias("is_block")).select(
        "rank", "tid", "bid", "fid", "cls", "cat", "start_ns", "end_ns", "is_block"
    )


def _outermost(f: pl.DataFrame, outer: pl.DataFrame) -> pl.DataFrame:
    """The frames of ``f`` (``rank, tid, bid, ...``) not inside another frame of ``outer`` on their thread
    (of two frames with the same span, the one with the smaller id is the outer one)."""
    cols = ["rank", "tid", "bid", "start_ns", "end_ns"]
    o = outer.select(
        "rank", "tid", pl.col("bid").alias("_ob"), pl.col("start_ns").alias("_os"), pl.col("end_ns").alias("_oe")
    )
    inner = range_join(f.select(cols), o, ("start_ns", "end_ns"), ("_os", "_oe"), by=("rank", "tid")).filter(
        (pl.col("_ob") != pl.col("bid"))
        & (pl.col("_os") <= pl.col("start_ns"))
        & (pl.col("_oe") >= pl.col("end_ns"))
        & ((pl.col("_os") < pl.col("start_ns")) | (pl.col("_oe") > pl.col("end_ns")) | (pl.col("_ob") < pl.col("bid")))
    )["bid"]
    return f.filter(~pl.col("bid").is_in(inner.implode())).select("rank", "tid", "bid", "cls", "start_ns", "end_ns")


def moe_blocks(frames: pl.DataFrame, children: pl.DataFrame) -> pl.DataFrame:
    """The outermost MoE blocks: ``rank, tid, bid, cls, start_ns, end_ns``.

    Args:
        frames: :func:`module_frames`.
        children: :func:`block_children`.
    """
    by_children = children.filter(pl.col("is_block")).select("bid").unique()
    by_name = frames.filter(pl.col("role") == "block").select(pl.col("fid").alias("bid"))
    ids = pl.concat([by_children, by_name]).unique()
    b = frames.join(ids.rename({"bid": "fid"}), on="fid", how="semi").rename({"fid": "bid"})
    return _outermost(b, b)


def lone_experts(frames: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """The outermost experts-role frames outside every block: ``rank, tid, bid, cls, start_ns, end_ns``."""
    e = frames.filter(pl.col("role") == "experts").rename({"fid": "bid"})
    cols = ["rank", "tid", "bid", "start_ns", "end_ns"]
    return _outermost(e, pl.concat([blocks.select(cols), e.select(cols)]))

"""Kernel-family stage detection for the device kernels no stage range claimed.

Input: every device kernel of the analysed steps, the ids of those already attributed to a stage
range (:func:`ep_trace.analysis.stages.attribute`) and the MoE layer ranges ("containers", e.g.
vLLM's ``vllm::moe_forward`` op or TraceLens' ``MoE[...]`` range). Per rank, in device start order:

1. each kernel gets the stage of its family (the kernel rows of the knowledge table,
   :mod:`ep_trace.knowledge`; a user ``--stages`` file's ``[[kernel]]`` rows first);
2. context rules (each tested in ``tests/analysis/test_stage_families.py``):

   * a plain GEMM is expert work only inside a container and after a routing kernel of that
     container (the gate GEMM before routing is not); elsewhere it gets no stage;
   * a PyTorch index_select / gather / scatter inside a container after routing is expert work before
     the container's first expert kernel (a plain-PyTorch MoE gathers the selected experts' weights,
     ``w1[expert_ids]``, or the tokens right before its batched GEMMs: TraceLens' ``aten::index``
     before ``expert_ffn[...]``) and unpermute after it; elsewhere it gets no stage;
   * a softmax is routing inside a container, or outside one when it falls in one contiguous group
     with a top-k / sort kernel; else it gets no stage;
   * a notify kernel (DeepEP ``notify_dispatch``, ``cached_notify``, ...) is communication of the
     *next* DeepEP dispatch / combine kernel on the rank (the previous one when none follows);
   * an NCCL all-gather / reduce-scatter / broadcast / reduce / send-recv kernel inside a container is the ``dispatch``
     before the container's first expert kernel and the ``combine`` after it (vLLM's default EP
     backend); outside a container (a CUDA-graph replay) only right next to the MoE block
     (:func:`_with_edge_roles`), else no stage;
   * an all-reduce kernel is the ``combine`` of the MoE layer it directly follows: inside a container
     after its expert kernels, right after the container, or (no container) right after an expert /
     unpermute kernel, pointwise kernels and other all-reduces skipped (:func:`_with_allreduce_edges`:
     the tensor-parallel MoE output all-reduce of vLLM and SGLang), else no stage;
   * a kernel already attributed to a range (an attention range, an ep-trace range) keeps that
     stage: a grouped GEMM inside an attention range is attention, never expert work;

3. contiguous groups: consecutive kernels of one stage (in the same step and container, with no
   kernel of another stage or of a range in between) form one stage row whose window runs from the
   first kernel's start to the last kernel's end, not over the whole step;
4. layers: the container's ``(?P<layer>)`` group, else the container's ordinal within the step;
   without containers, the ordinal within the step of the group that opens an MoE block (the first
   of route, dispatch, expert that the rank has).
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.intervals import range_join
from ep_trace.analysis.kernel_families import POINTWISE, stage_table
from ep_trace.comm_classifier import FAMILY_COLLECTIVE
from ep_trace.knowledge import Row, first_match_expr, kernel_rows

__all__ = [
    "family_label_expr",
    "container_index",
    "family_rows",
    "family_ranges",
    "layers_from_containers",
    "kernel_call_directions",
]

_RANGE = "__range"
#: Which side of an MoE block an NCCL collective without a range may join (the ``edge`` of the
#: ``ep_collective`` rows: an all-gather / broadcast opens it, a reduce-scatter / reduce closes it).
_EDGES = tuple((r.edge, r.pattern) for r in kernel_rows() if r.stage == "ep_collective")


def family_label_expr(name: pl.Expr, extra: tuple[Row, ...] = ()) -> pl.Expr:
    """Polars expression: the family stage of a kernel name (``notify`` / ``gemm`` / ``route_aux`` unresolved).

    Args:
        name: Kernel names (evaluate on distinct names: every row's regex runs on each).
        extra: User ``[[kernel]]`` rows, tried before the built-in ones.
    """
    return first_match_expr(name, stage_table(extra))


def container_index(containers: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Containers with ``cid`` (unique id), ``step`` and ``c_layer`` (name group, else ordinal in the step)."""
    from ep_trace.analysis.steps import assign_step

    c = assign_step(containers.sort(["rank", "cpu_start_ns"]), windows, "cpu_start_ns").with_row_index("cid")
    return c.with_columns(
        pl.coalesce(
            pl.col("layer"), pl.int_range(pl.len(), dtype=pl.Int32).over(["rank", "step"], order_by="cpu_start_ns")
        ).alias("c_layer")
    )


def _with_container(k: pl.DataFrame, cont: pl.DataFrame) -> pl.DataFrame:
    if cont.is_empty():
        return k.with_columns(pl.lit(None, pl.UInt32).alias("cid"), pl.lit(None, pl.Int32).alias("c_layer"))
    j = range_join(
        k.select("rank", "aid", "anchor_ns"),
        cont.select("rank", "cid", "c_layer", pl.col("cpu_start_ns").alias("_cs"), pl.col("cpu_end_ns").alias("_ce")),
        ("anchor_ns", "anchor_ns"),
        ("_cs", "_ce"),
    ).select("aid", "cid", "c_layer")
    return k.join(j.unique("aid"), on="aid", how="left")


def _with_edge_roles(k: pl.DataFrame) -> pl.DataFrame:
    """``_edge``: the role of an ``ep_collective`` kernel outside any MoE range, from its neighbours.

    A CUDA-graph replay (vLLM's decode) runs no host op, so no ``vllm::moe_forward`` range holds the
    layer. There an all-gather / broadcast kernel is the ``dispatch`` only when the next kernel of
    the rank that is not such a collective is a routing kernel (vLLM gathers the tokens and router
    logits, then runs top-k), and a reduce-scatter / reduce kernel is the ``combine`` only when the
    previous one is an expert or unpermute kernel; pointwise kernels (``_pw``) are skipped, and any
    other kernel without a family in between (a norm, an attention kernel, the LM head) breaks the
    adjacency, so data- and tensor-parallel collectives stay without a stage.
    """
    if not bool((k.get_column("_fam") == "ep_collective").any()):
        return k.with_columns(pl.lit(None, pl.Utf8).alias("_edge"))
    coll = pl.col("_fam") == "ep_collective"
    # the kernel-name tests run once per distinct collective kernel name, not per launch
    side = first_match_expr(pl.col("name"), _EDGES)
    kinds = (
        k.filter(coll)
        .select(pl.col("name").unique())
        .with_columns((side == "gather").fill_null(False).alias("_g"), (side == "scatter").fill_null(False).alias("_s"))
    )
    k = k.join(kinds, on="name", how="left").sort(["rank", "start_ns"])
    # pointwise kernels do not break the adjacency (SGLang's routed-scaling multiply and shared-expert
    # add run between the experts and the reduce-scatter of its data-parallel attention)
    lab = pl.when(coll | pl.col("_pw")).then(None).otherwise(pl.col("_fam").fill_null(""))
    nxt = lab.shift(-1).backward_fill().over(["rank", "step"])
    prv = lab.shift(1).forward_fill().over(["rank", "step"])
    edge = (
        pl.when(coll & pl.col("_g") & nxt.is_in(["route", "route_aux"]))
        .then(pl.lit("dispatch"))
        .when(coll & pl.col("_s") & prv.is_in(["expert", "unpermute"]))
        .then(pl.lit("combine"))
        .otherwise(None)
    )
    return k.with_columns(edge.alias("_edge")).drop("_g", "_s")


def _with_allreduce_edges(k: pl.DataFrame, cont: pl.DataFrame) -> pl.DataFrame:
    """The kernels with a family, their MoE range (``cid``, ``c_layer``), and the MoE layer an
    ``ep_allreduce`` kernel outside any MoE range directly follows.

    The previous kernel of the rank in the step, skipping pointwise kernels and other all-reduce
    kernels (vLLM reduces a shared-expert layer's two outputs one after the other): when it belongs
    to an MoE range and has a stage or family, the all-reduce joins that range (``cid``,
    ``c_layer``: vLLM's all-reduce runs right after ``vllm::moe_forward`` returns); when there is no
    range (a CUDA-graph replay) and it is an expert or unpermute kernel on the same stream, ``_edge``
    is ``combine``.
    Anything else in between (a norm, an attention kernel, a GEMM outside the range) breaks the
    adjacency, so the attention's and dense MLPs' all-reduces get no stage. Only then does every
    kernel, not only those with a family, need its range (the unlabelled ones break the adjacency).
    """
    ar = (pl.col("_fam") == "ep_allreduce").fill_null(False)
    labelled = pl.col("_fam").is_not_null()
    if not bool(k.select(ar.any()).item()):
        return _with_container(k.filter(labelled), cont)
    k = _with_container(k, cont).sort(["rank", "start_ns"]).with_row_index("_ri")
    # (the comparisons are null where _fam is: a kernel without a family is never skipped)
    skip = ar | pl.col("_pw")
    prev_i = pl.when(~skip).then(pl.col("_ri")).shift(1).forward_fill().over(["rank", "step"])
    k = k.with_columns(prev_i.alias("_pi"))
    prev = k.select(
        pl.col("_ri").alias("_pi"),
        pl.col("cid").alias("_pcid"),
        pl.col("c_layer").alias("_pcl"),
        pl.col("_fam").alias("_pf"),
        pl.col("stream").alias("_pst"),
    )
    k = k.join(prev, on="_pi", how="left")
    outside = ar & pl.col("cid").is_null()
    adopt = outside & pl.col("_pcid").is_not_null() & pl.col("_pf").is_not_null()
    # without a range, only an all-reduce queued behind the expert work on its stream (vLLM's and
    # SGLang's run on the compute stream); a data-parallel gradient all-reduce runs on NCCL's own
    # stream next to the backward kernels, whatever kernel started before it
    same_stream = (pl.col("stream") == pl.col("_pst")).fill_null(False)
    edge = outside & pl.col("_pcid").is_null() & pl.col("_pf").is_in(["expert", "unpermute"]) & same_stream
    return (
        k.with_columns(
            pl.when(adopt).then(pl.col("_pcid")).otherwise(pl.col("cid")).alias("cid"),
            pl.when(adopt).then(pl.col("_pcl")).otherwise(pl.col("c_layer")).alias("c_layer"),
            pl.when(edge).then(pl.lit("combine")).otherwise(pl.col("_edge")).alias("_edge"),
        )
        .filter(labelled)
        .drop("_ri", "_pi", "_pcid", "_pcl", "_pf", "_pst")
    )


def family_rows(
    act: pl.DataFrame, attributed: pl.Series, cont: pl.DataFrame, extra: tuple[Row, ...] = ()
) -> pl.DataFrame:
    """Device kernels of the analysed steps with their resolved family ``stage`` and contiguous-group ``run``.

    Args:
        act: Device activity with ``step`` and ``aid``.
        attributed: ``aid`` of the rows a stage range already claimed.
        cont: Output of :func:`container_index`.
        extra: User ``[[kernel]]`` rows (``--stages``), tried before the built-in ones.

    Returns:
        The unclaimed kernels that got a stage, with ``stage, run, cid, c_layer`` added.
    """
    k = act.filter(pl.col("step").is_not_null() & (pl.col("cls") != "memory"))
    # one regex pass per distinct name: the family, and whether the MoE-edge rules skip the kernel
    label = family_label_expr(pl.col("name"), extra)
    names = k.select(pl.col("name").unique()).with_columns(
        pl.when(label != "pointwise").then(label).alias("_fam"), pl.col("name").str.contains(POINTWISE).alias("_pw")
    )
    k = k.join(names, on="name", how="left")
    claimed = pl.col("aid").is_in(attributed.implode())
    k = k.with_columns(pl.when(claimed).then(pl.lit(_RANGE)).otherwise(pl.col("_fam")).alias("_fam"))
    k = _with_edge_roles(k)
    k = _with_allreduce_edges(k, cont).drop("_pw").sort(["rank", "start_ns"])
    in_c = pl.col("cid").is_not_null()
    # routing seen earlier in the same container (rank, container): cum max over the container's rows
    routed = pl.col("_fam").is_in(["route", "route_aux"]).cast(pl.Int8).cum_max().over(["rank", "cid"]).cast(pl.Boolean)
    next_dc = pl.when(pl.col("_fam").is_in(["dispatch", "combine"])).then(pl.col("_fam")).backward_fill().over("rank")
    prev_dc = pl.when(pl.col("_fam").is_in(["dispatch", "combine"])).then(pl.col("_fam")).forward_fill().over("rank")
    gemm_expert = (pl.col("_fam") == "gemm") & in_c & routed
    k = k.with_columns(gemm_expert.alias("_gx"))
    expert_seen = (
        ((pl.col("_fam") == "expert") | pl.col("_gx")).cast(pl.Int8).cum_max().over(["rank", "cid"]).cast(pl.Boolean)
    )
    k = k.with_columns(
        pl.when(pl.col("_fam") == "gemm")
        .then(pl.when(pl.col("_gx")).then(pl.lit("expert")).otherwise(None))
        .when(pl.col("_fam") == "gather")
        .then(
            pl.when(in_c & routed & expert_seen)
            .then(pl.lit("unpermute"))
            .when(in_c & routed)
            .then(pl.lit("expert"))
            .otherwise(None)
        )
        .when(pl.col("_fam") == "notify")
        .then(pl.coalesce(next_dc, prev_dc))
        .when((pl.col("_fam") == "route_aux") & in_c)
        .then(pl.lit("route"))
        .when(pl.col("_fam") == "ep_allreduce")
        .then(pl.when(in_c & expert_seen).then(pl.lit("combine")).when(~in_c).then(pl.col("_edge")))
        .when(pl.col("_fam") == "ep_collective")
        .then(
            pl.when(in_c & expert_seen)
            .then(pl.lit("combine"))
            .when(in_c)
            .then(pl.lit("dispatch"))
            .otherwise(pl.col("_edge"))  # no container (a CUDA-graph replay): only right next to the MoE block
        )
        .otherwise(pl.col("_fam"))
        .alias("_lab"),
        (pl.col("_fam") == "route_aux").alias("_aux"),
    ).filter(pl.col("_lab").is_not_null())
    # contiguous groups: a new run where the stage, the step or the container changes
    key_change = (
        (pl.col("_lab") != pl.col("_lab").shift(1).over("rank"))
        | (pl.col("step") != pl.col("step").shift(1).over("rank"))
        | (pl.col("cid").fill_null(-1) != pl.col("cid").fill_null(-1).shift(1).over("rank"))
    ).fill_null(True)
    k = k.with_columns(key_change.cast(pl.Int64).cum_sum().over("rank").alias("run"))
    fam = k.filter(pl.col("_lab") != _RANGE)
    # a softmax outside a container is routing only in a group with a real top-k / sort kernel
    keep = (pl.col("cid").is_not_null() | (~pl.col("_aux")).any()).over(["rank", "run"])
    fam = fam.filter(keep)
    return fam.rename({"_lab": "stage"}).drop(["_fam", "_aux", "_gx", "_edge"])


def family_ranges(fam: pl.DataFrame) -> pl.DataFrame:
    """One stage row per contiguous group of :func:`family_rows` (``sid`` offset by 2**40 to stay unique).

    Layer: the container's, else the ordinal within (rank, step) of the groups that open an MoE block
    (the first of ``route``, ``dispatch``, ``expert`` the rank has).
    """
    g = (
        fam.group_by(["rank", "run"])
        .agg(
            pl.col("step").first(),
            pl.col("stage").first(),
            pl.col("c_layer").first(),
            pl.col("anchor_ns").min().alias("cpu_start_ns"),
            pl.col("anchor_ns").max().alias("cpu_end_ns"),
            pl.col("start_ns").min().alias("_s"),
        )
        .sort(["rank", "_s"])
    )
    present = g.group_by("rank").agg(pl.col("stage").unique().alias("_st"))
    opener = present.select(
        "rank",
        pl.when(pl.col("_st").list.contains("route"))
        .then(pl.lit("route"))
        .when(pl.col("_st").list.contains("dispatch"))
        .then(pl.lit("dispatch"))
        .otherwise(pl.lit("expert"))
        .alias("_open"),
    )
    g = g.join(opener, on="rank", how="left")
    ordinal = (pl.col("stage") == pl.col("_open")).cast(pl.Int32).cum_sum().over(["rank", "step"]) - 1
    g = g.sort(["rank", "_s"]).with_columns(
        pl.coalesce(pl.col("c_layer"), pl.when(ordinal >= 0).then(ordinal)).cast(pl.Int32).alias("layer")
    )
    return (
        g.with_row_index("sid")
        .with_columns(
            (pl.col("sid").cast(pl.Int64) + (1 << 40)).alias("sid"),
            pl.lit(None, pl.Int32).alias("microbatch"),
            pl.lit("fwd").alias("phase"),
            pl.lit("kernel_family").alias("method"),
        )
        .select(
            "sid",
            "rank",
            "run",
            "step",
            "stage",
            "layer",
            "microbatch",
            "phase",
            "cpu_start_ns",
            "cpu_end_ns",
            "method",
        )
    )


def layers_from_containers(ranges: pl.DataFrame, cont: pl.DataFrame) -> pl.DataFrame:
    """Fill a null ``layer`` of a stage range from the container that holds its host start."""
    if cont.is_empty() or ranges.is_empty():
        return ranges
    j = (
        range_join(
            ranges.select("rank", "sid", "cpu_start_ns"),
            cont.select("rank", "c_layer", pl.col("cpu_start_ns").alias("_cs"), pl.col("cpu_end_ns").alias("_ce")),
            ("cpu_start_ns", "cpu_start_ns"),
            ("_cs", "_ce"),
        )
        .select("sid", "c_layer")
        .unique("sid")
    )
    return (
        ranges.join(j, on="sid", how="left")
        .with_columns(pl.coalesce("layer", "c_layer").cast(pl.Int32).alias("layer"))
        .drop("c_layer")
    )


def kernel_call_directions(coll: pl.DataFrame, stage_rows: pl.DataFrame) -> pl.DataFrame:
    """``direction`` and ``layer`` of the calls built from bare kernels, from their stage.

    Such a call (``pg_name`` ``nccl:<type>`` or a kernel family such as ``custom_allreduce``,
    :mod:`ep_trace.parsers.kernel_collectives`) has no op or sidecar that names its role; when its
    device span lies inside a ``dispatch`` / ``combine`` stage row of its rank (the ``ep_collective``
    and ``ep_allreduce`` family rules above) it is that stage's call, so the what-ifs that edit
    dispatch or combine transfers (``fp8_dispatch``, ``chunked_pipeline``) see it.

    Args:
        coll: ``collectives`` rows (epoch ns).
        stage_rows: Stage rows (``rank, stage, layer, start_ns, end_ns`` device windows).

    Returns:
        ``coll`` with those two columns filled where they were null; other rows unchanged.
    """
    from_kernels = pl.col("pg_name").str.starts_with("nccl:") | pl.col("pg_name").is_in(list(FAMILY_COLLECTIVE))
    need = coll.filter(from_kernels.fill_null(False) & pl.col("direction").is_null()).select(
        "rank", "coll_id", "start_ns", "end_ns"
    )
    st = stage_rows.filter(
        pl.col("stage").is_in(["dispatch", "combine"])
        & pl.col("start_ns").is_not_null()
        & pl.col("end_ns").is_not_null()
    ).select(
        pl.col("rank").cast(coll.schema["rank"]),
        pl.col("stage").alias("_dir"),
        pl.col("layer").cast(pl.Int32).alias("_layer"),
        pl.col("start_ns").alias("_ss"),
        pl.col("end_ns").alias("_se"),
    )
    if need.is_empty() or st.is_empty():
        return coll
    hit = (
        range_join(need, st, ("start_ns", "end_ns"), ("_ss", "_se"))
        .filter((pl.col("start_ns") >= pl.col("_ss")) & (pl.col("end_ns") <= pl.col("_se")))
        .unique(["rank", "coll_id"], keep="first")
        .select("rank", "coll_id", "_dir", "_layer")
    )
    return (
        coll.join(hit, on=["rank", "coll_id"], how="left")
        .with_columns(
            pl.coalesce("direction", "_dir").alias("direction"), pl.coalesce("layer", "_layer").alias("layer")
        )
        .drop("_dir", "_layer")
    )

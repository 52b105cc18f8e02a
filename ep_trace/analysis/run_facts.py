"""What one run *was*: its knobs (tokens, top-k, hidden, EP size, dtype, chunks) and per-stage times.

Shared by the run record (:mod:`ep_trace.analysis.run_record`) and the sweep analysis
(:mod:`ep_trace.analysis.sweep`). Every value is read from the traces (canonical tables, the sidecar's
``meta`` as merged into ``ranks``) or from the sidecar's optional ``workload`` object (docs/sidecar.md),
which the caller passes in; what neither holds is ``None``, never guessed.

Stage time of one stage execution ("call": one stage range of one MoE layer in one step, micro-batch
chunks summed):

* GPU ranks: the stage window (first start -> last end of its attributed device work);
* CPU ranks (gloo): the host range itself (``cpu_end_ns - cpu_start_ns``): the calling thread *is*
  the device there, and host time inside the range outside any op (a blocking wait, an injected
  link delay, Python) is part of what the stage costs.

Across ranks, per (step, layer): dispatch / combine take the *minimum* over ranks (a collective's
duration includes waiting for the last arriver, so the rank that waited least shows the wait-free
cost of the call: DESIGN.md §5), expert takes the maximum (the slowest rank's GEMMs set the pace) and
keeps the mean beside it, the whole MoE layer and the step take the maximum. Then the median over
steps, with the quartiles as the run's own noise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from ep_trace.analysis.finding_common import rank_modes

if TYPE_CHECKING:
    from ep_trace.analysis.result import Analysis

__all__ = ["KNOBS", "NUMERIC_KNOBS", "SWEEP_STAGES", "run_knobs", "run_identity", "stage_times", "step_figures"]

#: Knobs a sweep can vary (docs/sweep.md).
KNOBS: tuple[str, ...] = ("tokens", "top_k", "hidden", "ep_size", "dtype", "chunks")
#: Knobs with numeric values (a fit's x axis).
NUMERIC_KNOBS: tuple[str, ...] = ("tokens", "top_k", "hidden", "ep_size", "chunks")
#: Stages the sweep fits, in display order; ``moe_layer`` = route start -> unpermute end of one layer.
SWEEP_STAGES: tuple[str, ...] = ("dispatch", "combine", "expert", "moe_layer", "step")

_COMM_STAGES = ("dispatch", "combine")
_LAYER_STAGES = ("route", "permute", "dispatch", "expert", "combine", "unpermute", "shared_expert")
#: all-to-all directions (sidecar ``a2a.direction``) made inside each stage.
_A2A_OF_STAGE = {"dispatch": ("count", "dispatch"), "combine": ("combine",)}

_TIMES_SCHEMA = {
    "stage": pl.Utf8,
    "layer": pl.Int32,
    "t_ns": pl.Float64,
    "t_p25_ns": pl.Float64,
    "t_p75_ns": pl.Float64,
    "t_best_ns": pl.Float64,
    "t_mean_ns": pl.Float64,
    "n": pl.Int64,
    "a2a_calls": pl.Float64,
    "bytes": pl.Float64,
    "bytes_mean": pl.Float64,
}


def _first(series: pl.Series) -> Any:
    s = series.drop_nulls()
    return s[0] if s.len() else None


def tokens_per_rank(a: Analysis) -> float | int | None:
    """Median over (rank, step) of the tokens one rank routes per step (first MoE layer), or None.

    From the sidecar's per-expert routing counts: tokens = Σ_e n_e / top_k (top-k counts each token k
    times), summed over micro-batches.
    """
    rc = a.tables.routing_counts
    top_k = _first(a.tables.ranks["top_k"]) if a.tables.ranks.height else None
    if rc.height == 0 or not top_k:
        return None
    first = rc["layer"].min()
    per = rc.filter(pl.col("layer") == first).group_by("rank", "step").agg(pl.col("count").sum())
    t = float(per["count"].median()) / float(top_k)  # type: ignore[arg-type]
    return int(t) if t.is_integer() else t


def run_knobs(a: Analysis, workload: dict[str, Any] | None = None) -> dict[str, Any]:
    """The knobs of one run (keys :data:`KNOBS` plus ``experts``, ``moe_layers``): traces first, then ``workload``.

    Args:
        a: The run's analysis.
        workload: The sidecar ``meta.workload`` object, when the run has one (docs/sidecar.md).

    Returns:
        ``{knob: value or None}``; ``tokens`` is per rank per step.
    """
    wl = workload or {}
    r = a.tables.ranks
    ep_groups = r["ep_group_ranks"].drop_nulls() if r.height else pl.Series([], dtype=pl.List(pl.Int32))
    a2a = a.tables.collectives.filter(pl.col("collective").is_in(["all_to_all", "all_to_allv"]))
    ep_size: int | None = None
    if ep_groups.len():
        ep_size = int(ep_groups.list.len().max())  # type: ignore[arg-type]
    elif a2a.height and a2a["group_size"].drop_nulls().len():
        ep_size = int(a2a["group_size"].max())  # type: ignore[arg-type]
    st = a.stages
    # MoE layers are the layers with expert work: an all-to-all alone (e.g. DLRM's embedding exchange,
    # whose dispatch-like stage gets a layer from the block order) is no MoE layer
    experts_st = st.filter(pl.col("stage") == "expert") if st.height else st
    layers = experts_st["layer"].drop_nulls().n_unique() if experts_st.height else 0
    chunks = None
    disp = st.filter((pl.col("stage") == "dispatch") & pl.col("microbatch").is_not_null()) if st.height else st
    if disp.height:
        chunks = int(disp["microbatch"].cast(pl.Int64).max() or 0) + 1  # type: ignore[arg-type]
    elif st.height and (st["stage"] == "dispatch").any():
        chunks = 1
    tokens = tokens_per_rank(a)
    hidden = _first(r["hidden_size"]) if r.height else None
    top_k = _first(r["top_k"]) if r.height else None
    return {
        "tokens": tokens if tokens is not None else wl.get("tokens"),
        "top_k": int(top_k) if top_k is not None else None,
        "hidden": int(hidden) if hidden is not None else None,
        "ep_size": ep_size,
        "dtype": _first(r["dtype"]) if r.height else None,
        "chunks": chunks if chunks is not None else wl.get("chunks"),
        "experts": _first(r["num_experts"]) if r.height else None,
        "moe_layers": layers or wl.get("layers"),
    }


def run_identity(a: Analysis) -> dict[str, Any]:
    """What makes two runs the same job: world size and expert placement at the start (the model is in
    :func:`run_knobs`; a layer re-placed during the run, ``first_step`` set, does not make another job)."""
    p = a.tables.placement.filter(pl.col("first_step").is_null())
    placement = None
    if p.height:
        placement = tuple(
            (int(e), tuple(sorted(int(x) for x in rk)))
            for e, rk in p.group_by("expert").agg(pl.col("rank")).sort("expert").iter_rows()
        )
    return {"world_size": a.rank_summary.height or None, "placement": placement}


def _stage_rows(a: Analysis) -> pl.DataFrame:
    """Per (rank, step, layer, stage): the stage time of one execution (chunks summed), fwd only."""
    st = a.stages
    if st.height == 0:
        return pl.DataFrame(
            schema={"rank": pl.Int32, "step": pl.Int64, "layer": pl.Int32, "stage": pl.Utf8, "t": pl.Int64}
        )
    mode = rank_modes(a)
    cpu_ranks = [r for r, m in mode.items() if m == "cpu"]
    fwd = st.filter((pl.col("phase").is_null() | (pl.col("phase") == "fwd")) & pl.col("step").is_not_null())
    is_cpu = pl.col("rank").is_in(cpu_ranks)
    t = pl.when(is_cpu).then(pl.col("cpu_end_ns") - pl.col("cpu_start_ns")).otherwise(pl.col("window_ns"))
    per = (
        fwd.filter(pl.col("stage").is_in(["dispatch", "combine", "expert"]))
        .group_by("rank", "step", "layer", "stage")
        .agg(t.sum().alias("t"))
    )
    lay = fwd.filter(pl.col("stage").is_in(_LAYER_STAGES) & pl.col("layer").is_not_null())
    begin = pl.when(is_cpu).then(pl.col("cpu_start_ns")).otherwise(pl.col("start_ns"))
    end = pl.when(is_cpu).then(pl.col("cpu_end_ns")).otherwise(pl.col("end_ns"))
    layer = (
        lay.group_by("rank", "step", "layer")
        .agg((end.max() - begin.min()).alias("t"))
        .with_columns(pl.lit("moe_layer").alias("stage"))
        .select("rank", "step", "layer", "stage", "t")
    )
    return pl.concat([per.select("rank", "step", "layer", "stage", "t"), layer], how="vertical_relaxed")


def stage_times(a: Analysis) -> pl.DataFrame:
    """Per (stage, layer) the run's time of one stage execution (module doc), plus ``layer = None`` rows.

    Returns:
        Columns ``stage, layer, t_ns`` (median over steps), ``t_p25_ns, t_p75_ns`` (quartiles over
        steps), ``t_best_ns`` (the fastest call: other processes' interference only adds time, so the
        best of N is the least disturbed estimate of the call's own cost; the sweep fits it), ``t_mean_ns`` (expert: median over steps of the mean over ranks; else = ``t_ns``),
        ``n`` (steps), ``a2a_calls`` (all-to-all calls per execution, dispatch / combine),
        ``bytes`` (max over ranks of the bytes one rank sends or receives per execution, summed over its
        token all-to-alls), ``bytes_mean`` (the mean over ranks of the bytes sent: what a balanced
        routing would give every rank). ``layer = None`` rows: all layers pooled (median over every (step, layer)
        call; ``n`` calls; counts and bytes the mean over layers); the step: one row, layer None.
    """
    rows = _stage_rows(a)
    if rows.height == 0 and a.steps.height == 0:
        return pl.DataFrame(schema=_TIMES_SCHEMA)
    # comm stages: the rank that waited least (min); the rest: the slowest rank (max)
    is_comm = pl.col("stage").first().is_in(_COMM_STAGES)
    per_step = rows.group_by("step", "layer", "stage").agg(
        pl.when(is_comm).then(pl.col("t").min()).otherwise(pl.col("t").max()).cast(pl.Float64).alias("t"),
        pl.col("t").mean().alias("t_mean"),
    )
    steps = a.steps
    if steps.height:
        step_rows = (
            steps.group_by("step")
            .agg(
                pl.col("step_time_ns").max().cast(pl.Float64).alias("t"), pl.col("step_time_ns").mean().alias("t_mean")
            )
            .with_columns(pl.lit(None, pl.Int32).alias("layer"), pl.lit("step").alias("stage"))
        )
        per_step = pl.concat([per_step, step_rows.select(per_step.columns)], how="vertical_relaxed")
    agg = per_step.group_by("stage", "layer").agg(
        pl.col("t").median().alias("t_ns"),
        pl.col("t").quantile(0.25, "linear").alias("t_p25_ns"),
        pl.col("t").quantile(0.75, "linear").alias("t_p75_ns"),
        pl.col("t").min().alias("t_best_ns"),
        pl.col("t_mean").median().alias("t_mean_ns"),
        pl.len().cast(pl.Int64).alias("n"),
    )
    calls = a.calls
    extra = pl.DataFrame(
        schema={
            "stage": pl.Utf8,
            "layer": pl.Int32,
            "a2a_calls": pl.Float64,
            "bytes": pl.Float64,
            "bytes_mean": pl.Float64,
        }
    )
    if calls.height and "direction" in calls.columns:
        parts = []
        for stage, dirs in _A2A_OF_STAGE.items():
            c = calls.filter(pl.col("direction").is_in(dirs) & pl.col("step").is_not_null())
            if c.height == 0:
                continue
            tok = pl.col("direction") != "count"
            parts.append(
                c.group_by("step", "layer")
                .agg(
                    pl.len().alias("calls"),
                    pl.col("bytes_max").filter(tok).sum().alias("bytes"),
                    (pl.col("logical_bytes") / pl.col("n_ranks")).filter(tok).sum().alias("bytes_mean"),
                )
                .group_by("layer")
                .agg(
                    pl.col("calls").median().alias("a2a_calls"),
                    pl.col("bytes").median().alias("bytes"),
                    pl.col("bytes_mean").median().alias("bytes_mean"),
                )
                .with_columns(pl.lit(stage).alias("stage"))
                .select(
                    "stage",
                    pl.col("layer").cast(pl.Int32),
                    "a2a_calls",
                    pl.col("bytes").cast(pl.Float64),
                    pl.col("bytes_mean").cast(pl.Float64),
                )
            )
        if parts:
            extra = pl.concat(parts)
    per_layer = agg.join(extra, on=["stage", "layer"], how="left", nulls_equal=True)
    layered = per_layer.filter(pl.col("layer").is_not_null())
    # all layers: the median over every (step, layer) call pooled (more samples than one layer's steps,
    # so a call stretched by the OS scheduler on a loaded machine moves it less), counts / bytes averaged
    pooled = (
        per_step.filter(pl.col("layer").is_not_null())
        .group_by("stage")
        .agg(
            pl.col("t").median().alias("t_ns"),
            pl.col("t").quantile(0.25, "linear").alias("t_p25_ns"),
            pl.col("t").quantile(0.75, "linear").alias("t_p75_ns"),
            pl.col("t").min().alias("t_best_ns"),
            pl.col("t_mean").median().alias("t_mean_ns"),
            pl.len().cast(pl.Int64).alias("n"),
        )
    )
    counts = layered.group_by("stage").agg(
        pl.col("a2a_calls").mean(), pl.col("bytes").mean(), pl.col("bytes_mean").mean()
    )
    mean_rows = pooled.join(counts, on="stage", how="left").with_columns(pl.lit(None, pl.Int32).alias("layer"))
    unlayered = per_layer.filter(pl.col("layer").is_null() & ~pl.col("stage").is_in(mean_rows["stage"].implode()))
    out = pl.concat(
        [
            layered.select(_TIMES_SCHEMA.keys()),
            mean_rows.select(_TIMES_SCHEMA.keys()),
            unlayered.select(_TIMES_SCHEMA.keys()),
        ],
        how="vertical_relaxed",
    ).cast(_TIMES_SCHEMA)  # type: ignore[arg-type]
    return out.sort("stage", "layer", nulls_last=True)


def step_figures(a: Analysis, tokens: float | int | None) -> dict[str, Any]:
    """Step time (median over steps of the slowest rank), its quartiles, tokens/s, exposed-comm ratio.

    Args:
        a: The run.
        tokens: Tokens per rank per step (:func:`tokens_per_rank`); None leaves tokens/s None.

    Returns:
        ``step_time_ns, step_p25_ns, step_p75_ns, tokens_per_step`` (all ranks), ``tokens_per_s``,
        ``exposed_comm_ratio`` (max over ranks of mean exposed comm / mean step time), ``I_r``.
    """
    s = a.steps
    out: dict[str, Any] = dict.fromkeys(
        ("step_time_ns", "step_p25_ns", "step_p75_ns", "tokens_per_step", "tokens_per_s", "exposed_comm_ratio", "I_r")
    )
    if s.height:
        mx = s.group_by("step").agg(pl.col("step_time_ns").max())["step_time_ns"]
        out["step_time_ns"] = float(mx.median())  # type: ignore[arg-type]
        out["step_p25_ns"] = float(mx.quantile(0.25, "linear"))  # type: ignore[arg-type]
        out["step_p75_ns"] = float(mx.quantile(0.75, "linear"))  # type: ignore[arg-type]
        ratio = s.group_by("rank").agg((pl.col("exposed_comm_ns").sum() / pl.col("step_time_ns").sum()).alias("x"))
        out["exposed_comm_ratio"] = float(ratio["x"].max())  # type: ignore[arg-type]
        n_ranks = s["rank"].n_unique()
        if tokens is not None:
            out["tokens_per_step"] = tokens * n_ranks
            if out["step_time_ns"]:
                out["tokens_per_s"] = out["tokens_per_step"] / (out["step_time_ns"] / 1e9)
    imb = a.imbalance
    if imb.height and "L_max" in imb.columns and imb["L_mean"].drop_nulls().len():
        lm = float(imb["L_mean"].sum())
        out["I_r"] = float(imb["L_max"].sum()) / lm if lm else None
    return out

"""The analysis pipeline: canonical tables in, :class:`~ep_trace.analysis.result.Analysis` out.

Order: step windows -> device activity (comm / compute) -> true overlap per (rank, step) -> stage
attribution -> collective matching -> clock alignment -> waits, stragglers -> imbalance -> alpha-beta
-> host stalls -> findings. Every step is a vectorised polars pass; see the module of each step.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import cast

import polars as pl

from ep_trace.analysis import (
    bandwidth,
    clocks,
    findings,
    graph,
    imbalance,
    matching,
    rank_pass,
    rank_tables,
    stage_families,
    whatif,
)
from ep_trace.analysis.breakdown import step_breakdown
from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.finding_common import rank_list
from ep_trace.analysis.host_stalls import host_stalls
from ep_trace.analysis.intervals import range_join, union
from ep_trace.analysis.op_stalls import stall_share
from ep_trace.analysis.resources import UNKNOWN_CORES_NOTE, transfer_hiding
from ep_trace.analysis.result import Analysis
from ep_trace.analysis.steps import assign_step, select_steps
from ep_trace.errors import NothingToAnalyzeError
from ep_trace.schema import STAGES as STAGES_SCHEMA
from ep_trace.schema import TraceTables

__all__ = ["analyze"]

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]
_TOL_FLOOR_NS = 10_000  # 10 µs: below any collective's launch jitter, above µs rounding of old traces


def _iteration_count_note(windows: pl.DataFrame) -> list[str]:
    """A note when ranks hold different numbers of serving iterations: steps are paired by number.

    vLLM runs ``execute_dummy_batch`` on an idle data-parallel rank (to keep the EP all-to-alls in
    step) without ``annotate_profile`` (vllm/v1/worker/gpu_worker.py), so such a rank has fewer
    iteration ranges than the busy ones, and its step N is not theirs. With Python frames in the trace
    (vLLM's default) the dummy batches are steps (``parsers/serving_steps.py``) and the counts agree;
    this note is for traces taken with ``with_stack`` off.
    """
    it = windows.filter(pl.col("method") == "iteration").group_by("rank").agg(pl.len().alias("n")).sort("rank")
    if it.height < 2 or it["n"].n_unique() == 1:
        return []
    lo, hi = it.row(int(it["n"].arg_min() or 0), named=True), it.row(int(it["n"].arg_max() or 0), named=True)
    return [
        f"ranks hold different numbers of serving iterations (rank {lo['rank']}: {lo['n']}, rank {hi['rank']}: "
        f"{hi['n']}; vLLM's idle data-parallel ranks run unannotated dummy batches, seen only with Python "
        "frames in the trace, i.e. with_stack on): steps are paired across "
        "ranks by number, so cross-rank per-step figures can pair different iterations (collectives with a "
        "sequence number are still matched call by call, others by their order in the step)"
    ]


def _step_list(windows: pl.DataFrame, limit: int = 12) -> str:
    """``'0-3'`` / ``'0, 2, 5'`` / ``'0, 1, ... 99 (100 steps)'``: the steps present, for an error line."""
    steps = sorted(int(s) for s in windows["step"].unique())
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}-{steps[-1]} (choose FIRST:LAST within them)"
    if len(steps) > limit:
        shown = ", ".join(map(str, steps[: limit - 1])) + f", ... {steps[-1]} ({len(steps)} steps)"
    else:
        shown = ", ".join(map(str, steps))
    return f"{shown} (choose FIRST:LAST within them)"


def analyze(tables: TraceTables, config: AnalysisConfig, progress: Progress | None = None) -> Analysis:
    """Run every analysis over ``tables``.

    Args:
        tables: Validated canonical tables (one trace set).
        config: Analysis knobs.
        progress: Optional ``progress(stage, done, total)`` callback.

    Returns:
        The frozen :class:`Analysis`.

    Raises:
        NothingToAnalyzeError: no events, or no profiler step in ``config.steps``.
    """
    total = 9
    say = progress or (lambda stage, done, tot: None)
    coll, ranks = tables.collectives, tables.ranks
    blocks, n_events = rank_pass.rank_blocks(tables, config.block_events)
    if n_events == 0:
        raise NothingToAnalyzeError(
            "the trace set holds no events; profile at least one step (check the profiler schedule)"
        )
    say("steps", 0, total)
    # the per-rank passes read the events a block of ranks at a time (rank_pass); nothing below
    # holds every rank's events or their intermediates at once
    first_pass = rank_pass.first_pass(tables, blocks, config.steps)
    windows = first_pass.all_windows
    if config.steps is not None:
        windows = windows.filter(pl.col("step").is_between(config.steps[0], config.steps[1]))
    if windows.is_empty():
        assert config.steps is not None  # the unfiltered windows are never empty for a non-empty trace
        first, last = config.steps
        raise NothingToAnalyzeError(
            f"--steps {first}:{last}: no profiler step in that range; the trace has steps "
            f"{_step_list(first_pass.all_windows)}"
        )
    notes: list[str] = []
    if (windows["method"] == "whole_trace").any():
        notes.append("some ranks have no ProfilerStep rows: the whole trace is analysed as step 0 there")
    if (windows["method"] == "iteration").any():
        notes.append(
            "steps are the serving engine's iterations (vLLM execute_context_* ranges, SGLang Scheduler.run_batch "
            "frames, TensorRT-LLM _forward_step ranges; no ProfilerStep rows)"
        )
        notes += _iteration_count_note(first_pass.all_windows)

    say("overlap", 1, total)
    mode = first_pass.mode
    if config.steps is None:
        windows, dropped = select_steps(windows, first_pass.active_steps)
        notes += dropped

    say("stages", 2, total)
    second = rank_pass.second_pass(tables, blocks, first_pass, windows, config)
    ov, exposed_iv, stage_df, detection = second.overlap, second.exposed_iv, second.stages, second.detection
    ops, kernels = second.top_ops, second.top_kernels
    act = second.activity  # rank, cls, start_ns, end_ns, step: what the cross-rank passes read

    say("matching", 3, total)
    world = max(ranks.height, int(cast(int, ranks["world_size"].max()) or 0) if ranks.height else 0)
    coll = stage_families.kernel_call_directions(coll, stage_df)  # vLLM's PyNccl EP calls: their stage
    matched, misaligned = matching.match_collectives(coll, windows, world)
    n_setup = int(matched.filter(pl.col("step").is_null())["coll_id"].len())
    if n_setup:
        # setup collectives (a c10d::barrier before the first ProfilerStep, ...) are not part of any
        # analysed step: they would dominate every wait figure (1.61 s of 2.82 s in a skewed demo)
        notes.append(f"{n_setup} collective rows outside the analysed profiler steps (setup barriers...): left out")
    matched = matched.filter(pl.col("step").is_not_null())
    base = ranks.select("rank", pl.col("clock_offset_ns").alias("offset_ns"))
    calls0, cr0 = matching.measure_calls(matched, ranks, base, tol_ns=1 << 62)
    ok0 = calls0.filter(pl.col("complete") & (pl.col("n_ranks") > 1))["match_id"]
    cr0 = cr0.filter(pl.col("match_id").is_in(ok0.implode()))
    host_off = clocks.estimate_offsets(cr0, ranks, config.align_clocks, config.min_clock_calls)
    if config.align_clocks and host_off.height > 1:
        for h, n in host_off.filter(~pl.col("aligned")).select("host", "n_calls").iter_rows():
            notes.append(
                f"host {h}: only {n} matched collectives shared with host {host_off['host'][0]} (fewer than "
                f"{config.min_clock_calls}): its recorded clock (nsys UTC epoch / Kineto baseTimeNanoseconds) is kept, "
                "not aligned; cross-host waits carry its residual"
            )
    rank_off = clocks.rank_offsets(ranks, host_off)
    # cr0 times carry the parsers' offsets only; move them to the aligned clock
    cr0a = (
        cr0.join(base.rename({"offset_ns": "_b"}), on="rank")
        .join(rank_off.rename({"offset_ns": "_o"}), on="rank")
        .with_columns(pl.col("end_ns") - pl.col("_b") + pl.col("_o"))
    )
    resid = clocks.residuals(cr0a, ranks)
    tol = _TOL_FLOOR_NS + int(cast(int, resid["residual_ns"].max()) or 0) if resid.height else _TOL_FLOOR_NS
    calls, call_ranks = matching.measure_calls(matched, ranks, rank_off, tol_ns=tol)
    clock = host_off.join(resid, on="host", how="left").with_columns(pl.col("residual_ns").fill_null(0))
    # every wait figure carries the clock uncertainty of its rank's host
    unc = (
        ranks.select("rank", pl.col("host").fill_null("<unknown>"))
        .join(clock.select("host", "residual_ns"), on="host", how="left")
        .select("rank", pl.col("residual_ns").fill_null(0).alias("uncertainty_ns"))
    )
    call_ranks = call_ranks.join(unc, on="rank", how="left")
    valid_ids = calls.filter(pl.col("valid"))["match_id"]
    vcr = call_ranks.filter(pl.col("match_id").is_in(valid_ids.implode())).join(
        calls.select("match_id", "last_rank"), on="match_id"
    )
    if calls.height and not calls["complete"].all():
        notes.append(
            f"{int((~calls['complete']).sum())} matched calls miss ranks of their group (not in the trace set): "
            "wait and straggler cannot be measured for them (no wait / transfer split is claimed); left out of wait figures"
        )
    if calls.height and not calls["causal"].all():
        notes.append(
            f"{int((~calls['causal']).sum())} matched calls end on some rank before the last rank arrived "
            f"(beyond the {tol} ns clock uncertainty): likely mis-paired, left out of wait figures"
        )

    say("waits", 4, total)
    wait_matrix = (
        vcr.filter(pl.col("rank") != pl.col("waited_for"))
        .group_by(["rank", "waited_for"])
        .agg(pl.col("wait_ns").sum())
        .select(pl.col("rank").alias("waiter"), "waited_for", "wait_ns")
        .sort(["waiter", "waited_for"])
    )
    stragglers = rank_tables.stragglers(ranks, calls.filter(pl.col("valid")), vcr, windows["step"])
    per_step_wait = vcr.group_by(["rank", "step"]).agg(
        pl.col("wait_ns").sum().alias("barrier_wait_ns"), pl.col("transfer_ns").sum()
    )
    steps_df = (
        windows.select(
            "rank", "step", "start_ns", "end_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("step_time_ns")
        )
        .join(ov, on=["rank", "step"], how="left")
        .join(per_step_wait, on=["rank", "step"], how="left", nulls_equal=True)
        .select(
            "rank",
            "step",
            "start_ns",
            "end_ns",
            "step_time_ns",
            pl.col("a_ns").fill_null(0).alias("comm_ns"),
            pl.col("b_ns").fill_null(0).alias("compute_ns"),
            pl.col("both_ns").fill_null(0).alias("overlapped_ns"),
            pl.col("a_only_ns").fill_null(0).alias("exposed_comm_ns"),
            pl.col("barrier_wait_ns").fill_null(0),
            pl.col("transfer_ns").fill_null(0),
        )
        .sort(["rank", "step"])
    )
    rank_summary = rank_tables.with_uncertainty(rank_tables.rank_summary(steps_df, ranks, mode), call_ranks)

    say("imbalance", 5, total)
    n_exp = ranks["num_experts"].max() if ranks.height else None
    el = imbalance.expert_load(tables.routing_counts, cast("int | None", n_exp))
    cm = imbalance.count_matrix(tables.routing_matrix, matched)
    rl = imbalance.rank_load(cm, sorted(int(r) for r in ranks["rank"]))
    imb = imbalance.imbalance_table(el, rl, cm, ranks)
    viol = imbalance.split_violations(matched)

    say("bandwidth", 6, total)
    ab = bandwidth.alpha_beta_fit(calls)
    arrivals = (
        matched.filter(pl.col("match_id").is_not_null())
        .select("rank", "coll_id", "match_id")
        .join(calls.select("match_id", "arrival_ns"), on="match_id")
        .join(rank_off, on="rank")
        .select("rank", "coll_id", (pl.col("arrival_ns") - pl.col("offset_ns")).alias("arrival_ns"))
    )
    stalls = rank_pass.by_block(
        blocks, lambda b, m, a, r: host_stalls(b, m, a, mode, r), first_pass.blocking, matched, act, arrivals
    )
    # the blocking host calls (512 k rows over 4,096 param DLRM ranks) are read only by the stalls:
    # freed before the step graph, the analysis' peak
    gap_floor = first_pass.gap_floor
    del first_pass
    stalls = _locate(assign_step(stalls, windows, "start_ns"), stage_df)

    # the per-rank rows that read the activity, before the step graph: the graph then takes the
    # activity's only copy, a block at a time (rank_pass.drain_blocks), and frees each block as its
    # work pieces grow (-33 MB at the 4,096-rank peak)
    intervals = _intervals(steps_df, act, exposed_iv, stage_df, call_ranks, calls, rank_off, config, stragglers)
    # every step's exposed comm, as steps.exposed_comm_ns measures it (compute of the same step)
    exposed_comm = (
        second.exposed_union.join(rank_off, on="rank", how="left")
        .select(
            pl.col("rank").cast(pl.Int32),
            pl.col("step").cast(pl.Int64),
            (pl.col("start_ns") + pl.col("offset_ns").fill_null(0)).alias("start_ns"),
            (pl.col("end_ns") + pl.col("offset_ns").fill_null(0)).alias("end_ns"),
        )
        .sort("rank", "start_ns")
    )
    # the barrier-wait spans on each rank's own clock (the step windows' clock)
    wait_spans = vcr.join(rank_off, on="rank", how="left").select(
        "rank",
        "step",
        (pl.col("start_ns") - pl.col("offset_ns").fill_null(0)).alias("start_ns"),
        (pl.min_horizontal("arrival_ns", "end_ns") - pl.col("offset_ns").fill_null(0)).alias("end_ns"),
    )
    breakdown = rank_pass.by_block(blocks, step_breakdown, windows, act, wait_spans, stalls)
    graph_act = rank_pass.drain_blocks(act, blocks)
    del act, second

    say("model", 7, total)
    gpu_ranks = [r for r, m in mode.items() if m == "gpu"]
    unmatched = matched.filter(pl.col("match_id").is_null()).select("rank", "step", "collective", "start_ns", "end_ns")
    g = graph.build_graph(
        windows,
        rank_off,
        calls,
        call_ranks,
        graph_act,
        stage_df,
        stalls.filter(pl.col("rank").is_in(gpu_ranks)),
        unmatched,
        rank_blocks=blocks,
    )
    hiding, unknown_cores = transfer_hiding(tables.ranks, mode)
    cpu_ranks = frozenset(r for r, m in mode.items() if m != "gpu")
    stall_df = rank_pass.op_stalls(tables, blocks, stage_df, cpu_ranks)
    model = whatif.model(
        g,
        rl,
        config.whatif_chunks,
        hiding,
        lambda: rank_pass.chunk_cost(tables, blocks, stage_df, mode),
        # a whole-trace window holds start-up and tear-down, whose device idle is no step's host overhead
        frozenset(gpu_ranks).intersection(windows.filter(pl.col("method") != "whole_trace")["rank"].to_list()),
        gap_floor if gpu_ranks else None,
        stall_share(stall_df),
    )
    # only the model's small frames are kept: the graph's node and work tables are freed here
    replayed, critical, whatif_rows = model.replay, model.critical_path, model.whatif
    del model, g
    overlap_rows = whatif_rows.filter(pl.col("scenario").is_in(["full_overlap", "chunked_pipeline"])).height > 0
    if overlap_rows and unknown_cores:
        notes.append(UNKNOWN_CORES_NOTE.format(ranks=rank_list(unknown_cores)))
    short = sorted(r for r, h in hiding.items() if h < 1.0)
    if overlap_rows and short:
        notes.append(
            f"CPU ranks {rank_list(short)} have fewer than 2 cores each (cpu_cores, host_cores, ranks per host), so gloo's transfer thread has no "
            "spare core: the overlap and pipelining what-ifs keep the transfers' CPU time in the step"
        )

    say("findings", 8, total)
    hta = None
    if config.hta_compatible:
        hta = rank_pass.hta_overlap(tables, blocks)
    filled = dataclasses.replace(tables, stages=stage_df.select(list(STAGES_SCHEMA)).cast(STAGES_SCHEMA))
    partial = Analysis(
        config=config,
        tables=filled,
        rank_summary=rank_summary,
        steps=steps_df,
        stages=stage_df.drop("sid"),
        calls=calls,
        call_ranks=call_ranks,
        wait_matrix=wait_matrix,
        stragglers=stragglers,
        expert_load=el,
        rank_load=rl,
        imbalance=imb,
        count_matrix=cm,
        split_violations=viol,
        alpha_beta=ab,
        host_stalls=stalls,
        clock=clock,
        intervals=intervals,
        exposed_comm=exposed_comm,
        findings=(),
        detection_method=detection,
        hta_overlap=hta,
        load_report=tables.load_report,
        notes=tuple(notes),
        misaligned=misaligned,
        replay=replayed,
        critical_path=critical,
        whatif=whatif_rows,
        breakdown=breakdown,
        top_kernels=kernels,
        top_ops=ops,
        op_stalls=stall_df,
    )
    out = findings.with_findings(partial)
    log.debug("analysed %d ranks, %d matched calls, %d findings", rank_summary.height, calls.height, len(out.findings))
    say("done", total, total)
    return out


def _locate(stalls: pl.DataFrame, stage_df: pl.DataFrame) -> pl.DataFrame:
    """Attach the innermost stage whose host range contains the stall start."""
    cols = ["rank", "step", "layer", "stage", "name", "start_ns", "end_ns", "stall_ns"]
    if stalls.is_empty():
        return stalls.with_columns(pl.lit(None, pl.Int32).alias("layer"), pl.lit(None, pl.Utf8).alias("stage")).select(
            cols
        )
    s = stalls.with_row_index("_i")
    j = range_join(
        s,
        stage_df.select("rank", "cpu_start_ns", "cpu_end_ns", "layer", "stage"),
        ("start_ns", "start_ns"),
        ("cpu_start_ns", "cpu_end_ns"),
    )
    j = (
        j.sort(
            ["cpu_start_ns", "cpu_end_ns", "stage", "layer"], descending=[True, False, False, False], nulls_last=True
        )
        .unique("_i", keep="first")
        .select("_i", "layer", "stage")
    )
    return s.join(j, on="_i", how="left").sort(["rank", "start_ns"]).select(cols)


def _intervals(
    steps_df: pl.DataFrame,
    act: pl.DataFrame,
    exposed_iv: pl.DataFrame,
    stage_df: pl.DataFrame,
    call_ranks: pl.DataFrame,
    calls: pl.DataFrame,
    rank_off: pl.DataFrame,
    config: AnalysisConfig,
    stragglers: pl.DataFrame,
) -> pl.DataFrame:
    """Timeline rows of the representative step (clock-aligned), for at most ``max_timeline_ranks`` ranks."""
    if steps_df.is_empty():
        return pl.DataFrame(
            schema={
                "rank": pl.Int32,
                "step": pl.Int64,
                "track": pl.Utf8,
                "name": pl.Utf8,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
            }
        )
    med = steps_df.group_by("step").agg(pl.col("step_time_ns").median().alias("m")).sort("m")
    rep = (
        config.representative_step
        if config.representative_step is not None
        else int(med["step"][(med.height - 1) // 2])
    )
    ranks = sorted(steps_df["rank"].unique().to_list())
    n = config.max_timeline_ranks
    if len(ranks) > n:
        keep = {ranks[round(i * (len(ranks) - 1) / max(n - 2, 1))] for i in range(n - 1)}
        keep.add(int(stragglers["rank"][0]))
        ranks = sorted(keep)
    a = act.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks))
    parts = [
        union(a.filter(pl.col("cls") == c), ["rank"]).with_columns(pl.lit(c).alias("track"), pl.lit(c).alias("name"))
        for c in ("comm", "compute")
    ]
    w = steps_df.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks)).select(
        "rank", pl.col("start_ns").alias("w_start"), pl.col("end_ns").alias("w_end")
    )
    dev_w = a.group_by("rank").agg(pl.col("start_ns").min().alias("_s"), pl.col("end_ns").max().alias("_e"))
    w = w.join(dev_w, on="rank", how="left").select(
        "rank", pl.min_horizontal("w_start", "_s").alias("w_start"), pl.max_horizontal("w_end", "_e").alias("w_end")
    )
    x = (
        exposed_iv.join(w, on="rank")
        .filter((pl.col("end_ns") > pl.col("w_start")) & (pl.col("start_ns") < pl.col("w_end")))
        .select("rank", "start_ns", "end_ns")
    )
    parts.append(x.with_columns(pl.lit("exposed_comm").alias("track"), pl.lit("exposed comm").alias("name")))
    st = stage_df.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks)).select(
        "rank",
        pl.col("cpu_start_ns").alias("start_ns"),
        pl.col("cpu_end_ns").alias("end_ns"),
        pl.lit("stage").alias("track"),
        pl.concat_str([pl.col("stage"), pl.col("layer").cast(pl.Utf8).fill_null("-")], separator=":l").alias("name"),
    )
    parts.append(st)
    out = pl.concat([p.select("rank", "track", "name", "start_ns", "end_ns") for p in parts], how="vertical_relaxed")
    out = (
        out.join(rank_off, on="rank", how="left")
        .with_columns(pl.col("start_ns") + pl.col("offset_ns"), pl.col("end_ns") + pl.col("offset_ns"))
        .drop("offset_ns")
    )
    cr = call_ranks.filter((pl.col("step") == rep) & pl.col("rank").is_in(ranks)).join(
        calls.select("match_id", "arrival_ns", "collective"), on="match_id"
    )
    waits = cr.select(
        "rank", pl.lit("wait").alias("track"), "collective", pl.col("start_ns"), pl.col("arrival_ns").alias("end_ns")
    )
    trans = cr.select(
        "rank",
        pl.lit("transfer").alias("track"),
        "collective",
        pl.max_horizontal("start_ns", "arrival_ns").alias("start_ns"),
        "end_ns",
    )
    out = pl.concat(
        [out, waits.rename({"collective": "name"}), trans.rename({"collective": "name"})], how="vertical_relaxed"
    )
    return (
        out.filter(pl.col("end_ns") > pl.col("start_ns"))
        .with_columns(pl.lit(rep, pl.Int64).alias("step"))
        .select(pl.col("rank").cast(pl.Int32), "step", "track", "name", "start_ns", "end_ns")
        .sort(["rank", "track", "start_ns"])
    )

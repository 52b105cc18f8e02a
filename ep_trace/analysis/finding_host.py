"""The host-bound finding: a GPU rank whose device waits for a host that is busy, not blocked.

A *launch gap* of the step graph (:mod:`ep_trace.analysis.graph`) is device idle time that is
neither a kernel nor a blocking host call: the host had not launched the next kernel yet (Python,
framework overhead, data loading, a CPU-side optimizer). On the critical path such gaps set the
step length; the ``no_launch_gaps`` what-if removes them on GPU ranks (the bound of CUDA-graph
capture and fewer launches), and its saving is the finding's.

The evidence names what the host was doing during those gaps: the host ops and annotations that
overlap them, by overlap time (nested ranges each count their own overlap, so the figures are "time
inside X", not a partition).
"""

from __future__ import annotations

from typing import Any, cast

import polars as pl

from ep_trace.analysis.clocks import rank_offsets
from ep_trace.analysis.finding_common import fmt_ns, severity
from ep_trace.analysis.finding_common import wf as _wf
from ep_trace.analysis.finding_common import wf_ev as _wf_ev
from ep_trace.analysis.intervals import range_join
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["host_bound", "host_ops_in_gaps"]

#: Host ranges that span the whole step, a phase or an ep-trace stage (``ep:<stage>:...``, whose time
#: the critical path already gives by stage) say nothing about what kept the host busy.
_WRAPPERS = ("ProfilerStep#", "## ", "ep:")


def host_ops_in_gaps(a: Analysis, ev: pl.DataFrame, rank: int, gaps: pl.DataFrame, top: int = 5) -> dict[str, int]:
    """Host ranges of ``rank`` that overlap its launch gaps, by overlap time, ns (largest first).

    Args:
        a: The analysis (its ranks table and clock offsets).
        ev: The rank's events (recorded clock).
        rank: The rank.
        gaps: ``start_ns, end_ns`` of the gaps on the aligned clock (critical-path segments).
        top: How many names to return.

    Returns:
        ``name -> overlap ns`` of the ``top`` host ops / annotations (step-wide wrappers excluded).
    """
    off_row = rank_offsets(a.tables.ranks.filter(pl.col("rank") == rank), a.clock)["offset_ns"]
    off = int(cast(int, off_row[0])) if off_row.len() else 0
    ops = ev.filter(
        pl.col("kind").is_in(["cpu_op", "cpu_annotation"])
        & ~pl.any_horizontal(*[pl.col("name").str.starts_with(w) for w in _WRAPPERS])
    ).select(
        pl.col("rank").cast(pl.Int32),
        "name",
        (pl.col("start_ns") + off).alias("o_start"),
        (pl.col("end_ns") + off).alias("o_end"),
    )
    g = gaps.select(pl.lit(rank, pl.Int32).alias("rank"), "start_ns", "end_ns")
    if ops.is_empty() or g.is_empty():
        return {}
    j = range_join(g, ops, ("start_ns", "end_ns"), ("o_start", "o_end"))
    ov = (
        j.with_columns((pl.min_horizontal("end_ns", "o_end") - pl.max_horizontal("start_ns", "o_start")).alias("_ov"))
        .filter(pl.col("_ov") > 0)
        .group_by("name")
        .agg(pl.col("_ov").sum())
        .sort(["_ov", "name"], descending=[True, False])
        .head(top)
    )
    return {str(n): int(v) for n, v in ov.iter_rows()}


def host_bound(a: Analysis, step_ns: float) -> list[Finding]:
    """The ``host_bound`` finding from the ``no_launch_gaps`` what-if (GPU ranks only), or none."""
    r = _wf(a, "no_launch_gaps")
    cp = a.critical_path
    if r is None or int(r["saving_ns"]) <= 0 or cp is None or cp.is_empty():
        return []
    saving = int(r["saving_ns"])
    gpu = [int(x) for x in r["ranks"]]
    lg = cp.filter((pl.col("cause") == "launch_gap") & pl.col("rank").is_in(gpu))
    if lg.is_empty():
        return []
    n_steps = max(int(cp["step"].n_unique()), 1)
    per = (
        lg.group_by("rank")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_d"))
        .sort(["_d", "rank"], descending=[True, False])
    )
    rank, total = (int(x) for x in per.row(0))
    per_step = total / n_steps
    mine = lg.filter(pl.col("rank") == rank).select("start_ns", "end_ns")
    rank_ev = a.tables.scan_events().filter(pl.col("rank") == rank).collect()  # the events may stay on disk
    busy = host_ops_in_gaps(a, rank_ev, rank, mine)
    share = per_step / step_ns if step_ns > 0 else 0.0
    ev: dict[str, Any] = {
        "rank": rank,
        "launch_gap_on_path_ns_per_step": int(per_step),
        "launch_gaps_on_path": int(mine.height),
        "share_of_step": round(share, 4),
        "host_ranges_in_gaps_ns": busy,
        "whatif": _wf_ev(r),
        "saving_rule": "simulated: launch gaps of the GPU ranks removed (the bound of CUDA graphs / fewer launches)",
    }
    # the remedy stays under the report's 512-character display limit (cli/outputs.DISPLAY_CHARS)
    doing = ", ".join(n if len(n) <= 60 else n[:57] + "..." for n in list(busy)[:3])
    where = f" The host was inside {doing} during those gaps." if doing else ""
    graphs = rank_ev.filter((pl.col("kind") == "runtime") & pl.col("name").str.starts_with("cudaGraphLaunch")).height
    ev["cuda_graph_launches"] = int(graphs)
    capture = (
        "The step already replays CUDA graphs: capture more of it (full, not piecewise; the batch sizes that run eager)"
        if graphs
        else "Capture the step in a CUDA graph (torch.compile mode='reduce-overhead', or the serving engine's)"
    )
    # serving engines overlap the next batch's host work (scheduling, input preparation, sampling
    # bookkeeping) with the device: vLLM --async-scheduling (vllm-project/vllm#27679), SGLang's
    # zero-overhead overlap scheduler (lmsys.org/blog/2024-12-04-sglang-v0-4), TensorRT-LLM's overlap
    # scheduler (on unless disable_overlap_scheduler; nvidia.github.io/TensorRT-LLM/features/overlap-scheduler)
    remedy = (
        f"Host-bound: keep the device fed. {capture}; fuse small kernels; move Python, data loading and per-step host "
        "work (logging, .cpu(), a CPU-side optimizer) off the critical path; in serving, overlap scheduling with the "
        "device (vLLM --async-scheduling, the SGLang / TensorRT-LLM overlap schedulers)."
    )
    remedy += where if len(remedy) + len(where) <= 512 else ""
    # The what-if removes the launch gaps of every GPU rank, and its saving is the mean over ranks: with
    # several ranks it can exceed the named rank's on-path gaps (param_dlrm_8rank: rank 7 7.20 ms on
    # the path, 10.9 ms saved), so the title says whose gaps the saving removes.
    waits = (
        f"Rank {rank}'s device waits for its host {fmt_ns(per_step)} per step on the critical path, outside "
        "blocking calls"
    )
    title = (
        f"{waits} (the most of {len(gpu)} GPU ranks); devices that never wait for their hosts would save "
        f"{fmt_ns(saving)} per step (simulated bound, all {len(gpu)} ranks)."
        if len(gpu) > 1
        else f"{waits}; a device that never waits for the host would save {fmt_ns(saving)} per step (simulated bound)."
    )
    return [
        Finding(
            "host_bound",
            severity(saving, step_ns),
            title,
            saving,
            ev,
            remedy,
            (rank,),
        )
    ]

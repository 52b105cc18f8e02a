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
from ep_trace.analysis.graph_replay import GraphReplay, graph_replay, split_gaps
from ep_trace.analysis.intervals import range_join
from ep_trace.analysis.result import Analysis, Finding

__all__ = ["host_bound", "host_ops_in_gaps", "HOST_BOUND_SHARE"]

#: Host ranges that span the whole step, a phase or an ep-trace stage (``ep:<stage>:...``, whose time
#: the critical path already gives by stage) say nothing about what kept the host busy: the step
#: markers of training and serving (parsers/serving_steps.py: SGLang's ``step[...]``, vLLM's
#: ``execute_...``, ATOM's ``prefill[`` / ``decode[``) included.
_WRAPPERS = ("ProfilerStep#", "## ", "ep:", "step[", "execute_", "prefill[", "decode[")


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
    off = _offset(a, rank)
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


#: The host-bound rule's one threshold: a GPU rank is host-bound when its device waits for a busy
#: host (launch gaps on the critical path, outside blocking calls) at least this share of the step.
#: The same on every trace, whatever the workload; the finding's saving is the ``no_launch_gaps``
#: what-if's (docs/metrics.md, *Host-bound*).
HOST_BOUND_SHARE = 0.10


def host_bound(a: Analysis, step_ns: float) -> list[Finding]:
    """The ``host_bound`` finding (GPU ranks only): the rank whose device waits longest for its host
    on the critical path, when that is at least :data:`HOST_BOUND_SHARE` of the step; its saving from
    the ``no_launch_gaps`` what-if."""
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
    share = per_step / step_ns if step_ns > 0 else 0.0
    if share < HOST_BOUND_SHARE:
        return []
    mine = lg.filter(pl.col("rank") == rank).select("step", "start_ns", "end_ns")
    rank_ev = a.tables.scan_events().filter(pl.col("rank") == rank).collect()  # the events may stay on disk
    busy = host_ops_in_gaps(a, rank_ev, rank, mine)
    gr = graph_replay(rank_ev, a.steps.filter(pl.col("rank") == rank))
    ev: dict[str, Any] = {
        "rank": rank,
        "launch_gap_on_path_ns_per_step": int(per_step),
        "launch_gaps_on_path": int(mine.height),
        "share_of_step": round(share, 4),
        "threshold_share": HOST_BOUND_SHARE,
        "host_ranges_in_gaps_ns": busy,
        "graph_launches": gr.launches,
        "whatif": _wf_ev(r),
        "saving_rule": f"simulated: launch gaps of the GPU ranks removed (the bound of {gr.graph_name}s / fewer launches)",
    }
    if gr.launches:
        split = split_gaps(mine, gr.spans, _offset(a, rank))
        ev["graph_replay"] = {
            "platform": gr.platform,
            "kernel_share": round(gr.kernel_share, 4),
            **{f"{k[:-3]}_ns_per_step": int(v / n_steps) for k, v in split.items()},
        }
    title = _title(rank, per_step, saving, len(gpu))
    return [Finding("host_bound", severity(saving, step_ns), title, saving, ev, _remedy(gr, ev, busy), (rank,))]


def _offset(a: Analysis, rank: int) -> int:
    off_row = rank_offsets(a.tables.ranks.filter(pl.col("rank") == rank), a.clock)["offset_ns"]
    return int(cast(int, off_row[0])) if off_row.len() else 0


def _title(rank: int, per_step: float, saving: int, n_gpu: int) -> str:
    # The what-if removes the launch gaps of every GPU rank, and its saving is the mean over ranks: with
    # several ranks it can exceed the named rank's on-path gaps (param_dlrm_8rank: rank 7 7.20 ms on
    # the path, 10.9 ms saved), so the title says whose gaps the saving removes.
    waits = (
        f"Rank {rank}'s device waits for its host {fmt_ns(per_step)} per step on the critical path, outside "
        "blocking calls"
    )
    if n_gpu > 1:
        return (
            f"{waits} (the most of {n_gpu} GPU ranks); devices that never wait for their hosts would save "
            f"{fmt_ns(saving)} per step (simulated bound, all {n_gpu} ranks)."
        )
    return f"{waits}; a device that never waits for the host would save {fmt_ns(saving)} per step (simulated bound)."


def _remedy(gr: GraphReplay, ev: dict[str, Any], busy: dict[str, int]) -> str:
    """The remedy: what is left when the step already replays graphs (never "capture it"), else capture
    it in the platform's graph; under the report's 512-character display limit (cli/outputs.DISPLAY_CHARS).

    Serving engines overlap the next batch's host work (scheduling, input preparation, sampling
    bookkeeping) with the device: vLLM --async-scheduling (vllm-project/vllm#27679), SGLang's zero-overhead
    overlap scheduler (lmsys.org/blog/2024-12-04-sglang-v0-4), TensorRT-LLM's overlap scheduler (on unless
    disable_overlap_scheduler; nvidia.github.io/TensorRT-LLM/features/overlap-scheduler).
    """
    overlap = "vLLM --async-scheduling, the SGLang / TensorRT-LLM overlap schedulers"
    if gr.launches and gr.spans.height:
        g = ev["graph_replay"]
        remedy = (
            f"Host-bound: the step already replays {gr.graph_name}s ({g['kernel_share']:.0%} of its kernel time); "
            f"what is left is host work before the launch ({fmt_ns(g['before_launch_ns_per_step'])} per step: "
            f"overlap it with the previous step's device work, in serving the overlap schedulers: {overlap}) and "
            f"gaps between replays ({fmt_ns(g['between_replays_ns_per_step'])} per step: capture more of the step, "
            "full graphs rather than piecewise)."
        )
    else:
        if gr.launches:  # launches whose kernels the trace does not link
            capture = (
                f"The step already replays {gr.graph_name}s: capture more of it (full, not piecewise; the batch "
                "sizes that run eager)"
            )
        elif gr.platform == "hip":
            capture = "Capture the step in a HIP graph (torch.cuda.graphs on ROCm, or the serving engine's graph mode)"
        else:
            capture = "Capture the step in a CUDA graph (torch.compile mode='reduce-overhead', or the serving engine's)"
        remedy = (
            f"Host-bound: keep the device fed. {capture}; fuse small kernels; move Python, data loading and per-step "
            "host work (logging, .cpu(), a CPU-side optimizer) off the critical path; in serving, overlap scheduling "
            f"with the device ({overlap})."
        )
    doing = ", ".join(n if len(n) <= 60 else n[:57] + "..." for n in list(busy)[:3])
    where = f" The host was inside {doing} during those gaps." if doing else ""
    return remedy + where if len(remedy) + len(where) <= 512 else remedy

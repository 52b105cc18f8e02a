"""Graph replay on CUDA and ROCm: which device work a rank replays from a CUDA / HIP graph, and what
is left of its host-bound gaps when it does.

A graph launch is one host call (``cudaGraphLaunch`` of the CUDA runtime, ``cuGraphLaunch`` of the
driver API, ``hipGraphLaunch`` of HIP; nsys names carry a ``_v10000`` / ``_ptsz`` style suffix, HIP a
``_spt`` one) that replays every kernel of the graph: CUPTI and roctracer give each replayed kernel the
correlation id of that launch (Kineto draws one flow from the launch to each kernel; XLA's ROCm
collector, xla/backends/profiler/gpu/rocm_collector.cc: "a single hipGraphLaunch can produce many
kernel-dispatch records sharing one correlation_id"), so the parsers link every replayed kernel to the
launch row (``launch_id``). Kineto since pytorch/kineto#1276 (2026) also writes ``graph id`` / ``graph
node id`` on such kernels, and PyTorch's graph-node annotations (``torch.cuda.graph(...,
enable_annotations=True)`` / ``mark_kernels``, torch/cuda/_annotate_cuda_graph_trace.py) put a name
on each node after the fact; the link to the launch is what every era has.

A step replayed from a graph is captured already: telling its user to capture it is wrong. What is
left of the device's waiting is, per step, on the critical path:

* **before the launch**: device idle before the step's first replayed kernel: the host's work before
  it calls the graph (a serving engine's scheduling and input preparation, a training loop's data
  and optimizer steps), which an overlap scheduler hides behind the previous step's device work;
* **between replays**: idle between the end of one replay and the start of the next (piecewise
  graphs with eager work between them, or several graphs per step): capturing more of the step
  removes it;
* **inside replays**: gaps between a replay's own kernels: the device front end and graph
  dependencies, not the host;
* **after the replays**: idle after the step's last replayed kernel (eager work after the graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ep_trace.analysis.intervals import range_join

__all__ = ["GRAPH_LAUNCH_RE", "GraphReplay", "graph_replay", "split_gaps", "platform_of"]

#: Host calls that replay a device graph (CUDA runtime / driver, HIP), version suffixes allowed.
GRAPH_LAUNCH_RE = r"^(?:cuda|cu|hip)GraphLaunch(?:_\w+)?$"


@dataclass(frozen=True)
class GraphReplay:
    """What one rank replays from graphs.

    Attributes:
        platform: ``'hip'`` when the rank's runtime calls are HIP's (ROCm), else ``'cuda'``.
        launches: Graph launch calls in the analysed steps.
        kernel_share: Share of the rank's kernel time (sum of durations) replayed from graphs, 0..1.
        spans: One row per graph launch: ``step, start_ns, end_ns`` (first replayed kernel's start to
            the last one's end, own clock).
    """

    platform: str
    launches: int
    kernel_share: float
    spans: pl.DataFrame

    @property
    def graph_name(self) -> str:
        """``'HIP graph'`` on ROCm, else ``'CUDA graph'``."""
        return "HIP graph" if self.platform == "hip" else "CUDA graph"


def platform_of(ev: pl.DataFrame) -> str:
    """``'hip'`` when most of the rank's runtime calls are HIP's (``hip*`` names: ROCm), else ``'cuda'``."""
    rt = ev.filter(pl.col("kind") == "runtime").get_column("name")
    if rt.is_empty():
        return "cuda"
    return "hip" if rt.str.starts_with("hip").mean() > 0.5 else "cuda"  # type: ignore[operator]


def graph_replay(ev: pl.DataFrame, windows: pl.DataFrame) -> GraphReplay:
    """The graph replays of one rank's events inside the analysed step windows.

    Args:
        ev: The rank's events (own clock): ``kind, name, event_id, launch_id, start_ns, end_ns``.
        windows: The rank's analysed step windows (``step, host_start_ns, host_end_ns``).
    """
    launches = ev.filter((pl.col("kind") == "runtime") & pl.col("name").str.contains(GRAPH_LAUNCH_RE)).select(
        pl.col("event_id").alias("launch_id"), pl.col("start_ns").alias("_ls")
    )
    lo, hi = ("host_start_ns", "host_end_ns") if "host_start_ns" in windows.columns else ("start_ns", "end_ns")
    w = windows.select("step", pl.col(lo).alias("_ws"), pl.col(hi).alias("_we")).sort("_ws")
    launches = (
        launches.sort("_ls")
        .join_asof(w, left_on="_ls", right_on="_ws", strategy="backward")
        .filter(pl.col("_ls") <= pl.col("_we"))
    )
    kernels = ev.filter(pl.col("kind") == "gpu_kernel").select("launch_id", "start_ns", "end_ns")
    replayed = kernels.join(launches.select("launch_id", "step"), on="launch_id", how="inner")
    total = int(kernels.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)
    mine = int(replayed.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)
    spans = replayed.group_by("launch_id", "step").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    return GraphReplay(
        platform_of(ev),
        int(launches.height),
        mine / total if total else 0.0,
        spans.select("step", "start_ns", "end_ns").sort("step", "start_ns"),
    )


def split_gaps(gaps: pl.DataFrame, spans: pl.DataFrame, offset_ns: int = 0) -> dict[str, int]:
    """Launch-gap time of one rank split by where it lies against its graph replays (module list).

    Args:
        gaps: Critical-path launch-gap pieces ``step, start_ns, end_ns`` (aligned clock).
        spans: :attr:`GraphReplay.spans` (own clock).
        offset_ns: The rank's clock offset (aligned = own + offset).

    Returns:
        ``before_launch_ns, between_replays_ns, inside_replays_ns, after_replays_ns`` (totals over the
        gaps, ns): only for the steps that replay a graph (the rest: ``not_replayed_ns``).
    """
    sp = spans.select(
        "step", (pl.col("start_ns") + offset_ns).alias("s_s"), (pl.col("end_ns") + offset_ns).alias("s_e")
    )
    first_last = sp.group_by("step").agg(pl.col("s_s").min().alias("_first"), pl.col("s_e").max().alias("_last"))
    g = gaps.select("step", "start_ns", "end_ns").with_row_index("_g")
    inside = (
        range_join(g, sp, ("start_ns", "end_ns"), ("s_s", "s_e"), by=("step",))
        .select(
            "_g",
            (pl.min_horizontal("end_ns", "s_e") - pl.max_horizontal("start_ns", "s_s")).clip(0).alias("_in"),
        )
        .group_by("_g")
        .agg(pl.col("_in").sum())
    )
    g = g.join(first_last, on="step", how="left").join(inside, on="_g", how="left")
    length = pl.col("end_ns") - pl.col("start_ns")
    before = (pl.min_horizontal("end_ns", "_first") - pl.col("start_ns")).clip(0)
    after = (pl.col("end_ns") - pl.max_horizontal("start_ns", "_last")).clip(0)
    in_ = pl.col("_in").fill_null(0)
    replayed = pl.col("_first").is_not_null()
    out = g.select(
        pl.when(replayed).then(before).otherwise(0).sum().alias("before_launch_ns"),
        pl.when(replayed).then(length - before - after - in_).otherwise(0).clip(0).sum().alias("between_replays_ns"),
        pl.when(replayed).then(in_).otherwise(0).sum().alias("inside_replays_ns"),
        pl.when(replayed).then(after).otherwise(0).sum().alias("after_replays_ns"),
        pl.when(replayed).then(0).otherwise(length).sum().alias("not_replayed_ns"),
    )
    return {k: int(v or 0) for k, v in out.row(0, named=True).items()}

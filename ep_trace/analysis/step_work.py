"""A step is the work it launched: the step window runs to the end of the device work issued in it.

A step's host range (``ProfilerStep#N``, a serving iteration's range or frame, a user range) is where
the host *launched* its work; the device runs that work later, often past the range's end: a CUDA /
HIP graph replay is one ``cudaGraphLaunch`` that returns at once while its kernels run for
milliseconds, and a host that runs ahead of its device (every async training loop) ends step N's
range while N's kernels are still queued. Measured on the host range alone, such a step holds more
device work than time (DeepSeek's DeepEP training trace: 124 ms of compute launched in a 112 ms
``ProfilerStep#1``).

So every step gets a **step window** (``start_ns, end_ns``) besides its host range:

* **Device work belongs to the step that launched it**: a kernel / copy / memset linked to its
  runtime launch call (``launch_id``; a graph replay's kernels all link to their ``cudaGraphLaunch`` /
  ``hipGraphLaunch``) is in the step whose host range holds the launch's start. Work without a linked
  launch (its anchor is its own start) is in the step *window* holding its start.
* **End** = the latest of the host range's end, the end of the work it launched and the end of its
  GPU envelope (the ``gpu_user_annotation`` copy of the step's marker, e.g. SGLang's
  ``step[DECODE bs=16]``, which Kineto draws over the kernels the range launched).
* **Start** = the host range's start, or, when the previous step's device work was still running
  then (an overlap scheduler launches iteration N+1 while N runs: SGLang's ``event_loop_overlap``,
  vLLM's async scheduling, TensorRT-LLM's overlap scheduler; or a training host that runs ahead of
  its device), the end of that work: until then the device was busy with step N-1, whose window holds
  that time. The windows of a rank's steps so tile its device timeline, and a step's length is the
  device time its work took, not the host's.
* Work a step launched that ran while the previous step's work still did (on another stream: a
  training pipeline's copies and input kernels of the next batch, ``hta_torchrec16_rank0``: 4.6 ms of
  step N+1 during the 160 ms by which its device trails the host) is split at the window's start:
  the part before it counts in the previous step's window, where it ran concurrently.

On a CPU rank (gloo) there is no device queue: a comm worker range runs the collective its op posted
at once, while the step that posted it still runs (a step ends with its collectives waited). A worker
range linked to an op of an earlier step that it starts after (the trace's names pair the k-th worker
range with the wrong op: a collective renamed or missing on one rank, issue 40) is anchored at its own
start instead: a mis-link never stretches a step over the steps after it.

Every interval assigned to a step lies inside its window, so its compute and comm unions never
exceed the step. A step that launched nothing and whose host range lies inside the previous step's
device work gets an empty window (length 0).
"""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.steps import assign_step

__all__ = ["assign_activity", "device_windows"]


def _linked() -> pl.Expr:
    """Activity rows whose anchor is a launch call (GPU work with a linked runtime row, CPU comm
    anchored at its collective op): the others are anchored at their own start."""
    return pl.col("anchor_ns") != pl.col("start_ns")


def _plausible_links(act: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """``act`` with the implausible links of CPU work undone (module rules): a row without a device
    stream whose anchor's step host range ended before the row started is anchored at its start."""
    cpu_linked = _linked() & pl.col("stream").is_null()
    if not bool(act.select(cpu_linked.any()).item()):
        return act
    hi = "host_end_ns" if "host_end_ns" in windows.columns else "end_ns"
    ends = windows.select("rank", "step", pl.col(hi).alias("_he"))
    a = assign_step(act.with_row_index("_r"), windows, "anchor_ns", out="_as")
    a = a.join(ends.rename({"step": "_as"}), on=["rank", "_as"], how="left")
    late = cpu_linked & pl.col("_he").is_not_null() & (pl.col("start_ns") > pl.col("_he"))
    return (
        a.with_columns(pl.when(late).then(pl.col("start_ns")).otherwise(pl.col("anchor_ns")).alias("anchor_ns"))
        .sort("_r")
        .select(act.columns)
    )


def assign_activity(act: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """``act`` (:func:`~ep_trace.analysis.activity.device_activity`) with ``step``: launched work by
    its launch in the host range, the rest by its start in the step window (module rules).

    Launched work that started before its step's window (it ran while the previous step's work still
    did: a side stream's copies of the next batch) is split at the window's start: the part before
    it counts in the window where it ran. Every row then lies inside its step's window.
    """
    a = _plausible_links(act, windows).with_row_index("_r")
    linked = assign_step(a.filter(_linked()), windows, "anchor_ns")
    rest = assign_step(a.filter(~_linked()), windows, "start_ns", span="step")
    out = pl.concat([linked, rest.select(linked.columns)])
    ws = windows.select(pl.col("rank").cast(out.schema["rank"]), "step", pl.col("start_ns").alias("_win_s"))
    out = out.join(ws, on=["rank", "step"], how="left")
    early = pl.col("start_ns") < pl.col("_win_s")
    if not bool(out.select(early.fill_null(False).any()).item()):
        return out.sort("_r").drop("_r", "_win_s")
    split = out.filter(early)
    before = assign_step(
        split.drop("step").with_columns(pl.min_horizontal("end_ns", "_win_s").alias("end_ns")),
        windows,
        "start_ns",
        span="step",
    )
    after = split.filter(pl.col("end_ns") > pl.col("_win_s")).with_columns(pl.col("_win_s").alias("start_ns"))
    parts = [out.filter(~early.fill_null(False)), before.select(out.columns), after]
    return pl.concat(parts).sort("_r", "start_ns").drop("_r", "_win_s")


def device_windows(windows: pl.DataFrame, act: pl.DataFrame) -> pl.DataFrame:
    """The step windows of :func:`~ep_trace.analysis.steps.step_windows` widened to the work each
    step launched (module rules).

    Args:
        windows: Host windows (``start_ns, end_ns`` equal to the host range, ``env_*`` envelopes).
        act: Device activity of the same ranks (``rank, start_ns, end_ns, anchor_ns``).

    Returns:
        ``windows`` with ``start_ns, end_ns`` the step windows (same rows, sorted by rank and step).
    """
    if windows.is_empty():
        return windows
    act = _plausible_links(act, windows)
    launched = (
        assign_step(act.filter(_linked()).select("rank", "start_ns", "end_ns", "anchor_ns"), windows, "anchor_ns")
        .filter(pl.col("step").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("start_ns").min().alias("_w_lo"), pl.col("end_ns").max().alias("_w_hi"))
    )
    w = windows.join(launched, on=["rank", "step"], how="left").sort("rank", "host_start_ns", "step")
    own_end = pl.max_horizontal("host_end_ns", "_w_hi", "env_end_ns")
    w = w.with_columns(own_end.alias("_e0"))
    prev_end = pl.col("_e0").cum_max().shift(1).over("rank")
    # a kernel may start a few µs before its launch's recorded start (CUPTI clock skew, kineto#1380)
    own_start = pl.min_horizontal("host_start_ns", "_w_lo", "env_start_ns")
    start = pl.max_horizontal(own_start, prev_end)
    w = w.with_columns(start.alias("start_ns")).with_columns(pl.max_horizontal("_e0", "start_ns").alias("end_ns"))
    w = w.drop("_w_lo", "_w_hi", "_e0")
    # work without a linked launch joins the window holding its start; its end widens the window
    rest = (
        assign_step(act.filter(~_linked()).select("rank", "start_ns", "end_ns"), w, "start_ns", span="step")
        .filter(pl.col("step").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("end_ns").max().alias("_r_hi"))
    )
    w = w.join(rest, on=["rank", "step"], how="left")
    w = w.with_columns(pl.max_horizontal("end_ns", "_r_hi").alias("end_ns")).drop("_r_hi")
    return w.select(windows.columns).sort("rank", "step")

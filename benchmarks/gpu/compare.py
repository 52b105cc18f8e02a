"""Pure checks of the GPU verification (polars only): kernel lists of two backends, annotation spans.

Used by ``benchmarks/gpu/check.py`` on the GPU machine and tested on CPU (``tests/cupti``) with the
synthetic CUPTI records and a real CUDA Kineto trace from ``shared/external``. Every function takes
canonical ``events`` frames (``ep_trace.schema.EVENTS``) and returns plain dicts / frames.

Kineto and the CUPTI collector cannot trace the same process at once (both own CUPTI's activity
buffers), so the kernel lists are compared between two runs of the same steps: per step, the
multiset of kernel names must be equal, and for steps whose kernel sequences are equal the kernels
are paired in order and their durations and start offsets (from the step's first kernel) compared.
"""

from __future__ import annotations

from typing import Any

import polars as pl

__all__ = ["step_kernels", "compare_kernel_lists", "expected_envelopes", "check_gpu_annotations", "stage_durations"]


def _launch_start(events: pl.DataFrame) -> pl.DataFrame:
    """GPU kernels with the start of their launch (kernel start when no launch row is linked)."""
    launches = events.filter(pl.col("kind") == "runtime").select(
        pl.col("event_id").alias("launch_id"), pl.col("start_ns").alias("launch_ns"), pl.col("tid").alias("launch_tid")
    )
    return (
        events.filter(pl.col("kind") == "gpu_kernel")
        .join(launches, on="launch_id", how="left")
        .with_columns(pl.coalesce("launch_ns", "start_ns").alias("launch_ns"))
    )


def step_kernels(events: pl.DataFrame) -> pl.DataFrame:
    """Kernels per profiler step: the step whose ``ProfilerStep#N`` range holds the kernel's launch.

    Returns:
        Columns ``step`` (N), ``name``, ``stream``, ``start_ns``, ``end_ns``, ``dur_ns``,
        ``rel_start_ns`` (start minus the step's first kernel start), ``idx`` (order in the step).
    """
    steps = (
        events.filter((pl.col("kind") == "cpu_annotation") & pl.col("name").str.starts_with("ProfilerStep#"))
        .select(pl.col("seq").alias("step"), pl.col("start_ns").alias("s0"), pl.col("end_ns").alias("s1"))
        .sort("s0")
    )
    k = _launch_start(events).sort("launch_ns")
    k = k.join_asof(steps, left_on="launch_ns", right_on="s0", strategy="backward").filter(
        pl.col("step").is_not_null() & (pl.col("launch_ns") <= pl.col("s1"))
    )
    return (
        k.sort(["step", "start_ns", "stream"])
        .with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
            (pl.col("start_ns") - pl.col("start_ns").min().over("step")).alias("rel_start_ns"),
            pl.int_range(pl.len()).over("step").alias("idx"),
        )
        .select("step", "idx", "name", "stream", "start_ns", "end_ns", "dur_ns", "rel_start_ns")
    )


def compare_kernel_lists(a: pl.DataFrame, b: pl.DataFrame) -> dict[str, Any]:
    """Compare the per-step kernels of two backends (frames from :func:`step_kernels`).

    Steps are aligned by ordinal (the i-th step of ``a`` with the i-th of ``b``) over the steps both have.

    Returns:
        ``steps`` compared, ``kernels_a`` / ``kernels_b`` in them, ``same_multiset_steps`` (steps whose
        kernel-name multisets are equal), ``same_sequence_steps`` (equal name order), and over the
        kernels paired in equal-sequence steps: ``median_abs_dur_diff_ns``, ``p95_abs_dur_diff_ns``,
        ``median_abs_rel_start_diff_ns``, ``p95_abs_rel_start_diff_ns``, ``median_dur_ratio`` (b / a).
    """

    def ordinal(df: pl.DataFrame) -> pl.DataFrame:
        order = df.select("step").unique().sort("step").with_row_index("ord")
        return df.join(order, on="step").with_columns(pl.col("ord").cast(pl.Int64))

    a, b = ordinal(a), ordinal(b)
    n = min(a["ord"].max() + 1 if a.height else 0, b["ord"].max() + 1 if b.height else 0)
    a, b = a.filter(pl.col("ord") < n), b.filter(pl.col("ord") < n)
    ms_a = a.group_by("ord", "name").len()
    ms_b = b.group_by("ord", "name").len()
    diff = ms_a.join(ms_b, on=["ord", "name"], how="full", coalesce=True).filter(
        pl.col("len").fill_null(0) != pl.col("len_right").fill_null(0)
    )
    bad_steps = set(diff["ord"].to_list())
    seq_a = a.group_by("ord").agg(pl.col("name").sort_by("idx").alias("names"))
    seq_b = b.group_by("ord").agg(pl.col("name").sort_by("idx").alias("names_b"))
    same_seq = seq_a.join(seq_b, on="ord").filter(pl.col("names") == pl.col("names_b"))["ord"]
    paired = a.filter(pl.col("ord").is_in(same_seq.implode())).join(
        b.select("ord", "idx", pl.col("dur_ns").alias("dur_b"), pl.col("rel_start_ns").alias("rel_b")),
        on=["ord", "idx"],
    )
    d = paired.select(
        (pl.col("dur_b") - pl.col("dur_ns")).abs().alias("dd"),
        (pl.col("rel_b") - pl.col("rel_start_ns")).abs().alias("ds"),
        (pl.col("dur_b") / pl.col("dur_ns")).alias("ratio"),
    )

    def q(col: str, p: float) -> int | None:
        return None if d.height == 0 else int(d[col].quantile(p, "nearest"))

    return {
        "steps": int(n),
        "kernels_a": a.height,
        "kernels_b": b.height,
        "same_multiset_steps": int(n) - len(bad_steps),
        "same_sequence_steps": same_seq.len(),
        "paired_kernels": paired.height,
        "median_abs_dur_diff_ns": q("dd", 0.5),
        "p95_abs_dur_diff_ns": q("dd", 0.95),
        "median_abs_rel_start_diff_ns": q("ds", 0.5),
        "p95_abs_rel_start_diff_ns": q("ds", 0.95),
        "median_dur_ratio": None if d.height == 0 else float(d["ratio"].drop_nans().median()),
    }


def expected_envelopes(events: pl.DataFrame, pattern: str = r"^ep:") -> pl.DataFrame:
    """Per host range matching ``pattern`` and stream: first start / last end of the kernels launched
    inside it (launch start within the range, same thread) -- what Kineto's ``gpu_user_annotation``
    should span (kineto.md section 7: an envelope of the GPU ops launched inside the range).

    Returns:
        Columns ``range_id``, ``name``, ``stream``, ``exp_start_ns``, ``exp_end_ns``, ``n_kernels``.
    """
    ranges = events.filter((pl.col("kind") == "cpu_annotation") & pl.col("name").str.contains(pattern)).select(
        pl.col("event_id").alias("range_id"),
        "name",
        pl.col("tid").alias("r_tid"),
        pl.col("start_ns").alias("r0"),
        pl.col("end_ns").alias("r1"),
    )
    k = _launch_start(events).select("stream", "start_ns", "end_ns", "launch_ns", "launch_tid")
    hits = k.join_where(
        ranges,
        pl.col("launch_ns") >= pl.col("r0"),
        pl.col("launch_ns") <= pl.col("r1"),
    ).filter(pl.col("launch_tid").is_null() | pl.col("r_tid").is_null() | (pl.col("launch_tid") == pl.col("r_tid")))
    # Only the innermost matching range gets the kernel (Kineto attributes to the innermost range).
    hits = hits.sort("r0", descending=True).unique(["stream", "start_ns", "end_ns", "launch_ns"], keep="first")
    return (
        hits.group_by("range_id", "name", "stream")
        .agg(
            pl.col("start_ns").min().alias("exp_start_ns"),
            pl.col("end_ns").max().alias("exp_end_ns"),
            pl.len().alias("n_kernels"),
        )
        .sort("exp_start_ns")
    )


def check_gpu_annotations(events: pl.DataFrame, pattern: str = r"^ep:") -> dict[str, Any]:
    """Check Kineto ``gpu_annotation`` spans against the envelopes of :func:`expected_envelopes`.

    Returns:
        ``spans`` (gpu_annotation rows matching ``pattern``), ``envelopes`` (expected), ``matched``
        (envelopes with a span of the same name and stream holding their midpoint), ``start_dev_ns``
        and ``end_dev_ns`` (min / max of span minus envelope boundaries; Kineto widens spans for
        display), ``names`` (matched count per name).
    """
    env = expected_envelopes(events, pattern)
    spans = events.filter((pl.col("kind") == "gpu_annotation") & pl.col("name").str.contains(pattern)).select(
        pl.col("name").alias("s_name"),
        pl.col("stream").alias("s_stream"),
        pl.col("start_ns").alias("s0"),
        pl.col("end_ns").alias("s1"),
    )
    m = env.with_columns(((pl.col("exp_start_ns") + pl.col("exp_end_ns")) // 2).alias("mid")).join_where(
        spans,
        pl.col("name") == pl.col("s_name"),
        pl.col("stream") == pl.col("s_stream"),
        pl.col("s0") <= pl.col("mid"),
        pl.col("s1") >= pl.col("mid"),
    )
    m = m.with_columns(
        (pl.col("s0") - pl.col("exp_start_ns")).alias("sd"), (pl.col("s1") - pl.col("exp_end_ns")).alias("ed")
    ).unique(["range_id", "stream"])
    return {
        "spans": spans.height,
        "envelopes": env.height,
        "matched": m.height,
        "start_dev_ns": [int(m["sd"].min()), int(m["sd"].max())] if m.height else None,
        "end_dev_ns": [int(m["ed"].min()), int(m["ed"].max())] if m.height else None,
        "names": dict(sorted(m.group_by("name").len().iter_rows())),
    }


def stage_durations(events: pl.DataFrame, pattern: str = r"^ep:") -> pl.DataFrame:
    """Median envelope duration per stage range name, from launch-time attribution.

    Works on both backends (Kineto: launch containment; CUPTI: the same, its ``stage()`` ranges are
    host ``cpu_annotation`` rows too), so the two can be compared name by name.

    Returns:
        Columns ``name``, ``n`` (range x stream envelopes), ``median_ns``.
    """
    env = expected_envelopes(events, pattern)
    return (
        env.group_by("name")
        .agg(
            pl.len().alias("n"),
            (pl.col("exp_end_ns") - pl.col("exp_start_ns")).median().cast(pl.Int64).alias("median_ns"),
        )
        .sort("name")
    )

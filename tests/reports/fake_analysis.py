"""A realistic :class:`~ep_trace.analysis.result.Analysis` built directly (no parser, no engine).

The report is developed and unit-tested against these frames, whose values are known exactly:

* every step of every rank lasts ``step_ms`` (+ ``straggler_ms`` on no rank: the others wait);
* each (step, layer) has three matched all-to-alls: count, dispatch, combine; the straggler rank
  arrives last in every dispatch, so every other rank waits ``straggler_ms / layers`` ms there;
* expert 0 is hot (``hot_share`` of the assignments), the rest uniform.

Columns follow ``FRAME_DOCS`` of ``ep_trace/analysis/result.py``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ep_trace.analysis.config import AnalysisConfig
from ep_trace.analysis.result import Analysis, Finding
from ep_trace.schema import LoadIssue, TraceTables, conform, empty
from ep_trace.stage_names import format_stage_name

MS = 1_000_000
T0 = 1_700_000_000_000_000_000  # epoch ns
STAGE_ORDER = ("route", "permute", "dispatch", "expert", "combine", "unpermute")
# Stage durations in µs of one layer (busy on the device); windows are 10% longer.
STAGE_US = {"route": 40, "permute": 60, "dispatch": 300, "expert": 500, "combine": 280, "unpermute": 50}


def _frame(data: dict, schema: dict) -> pl.DataFrame:
    return pl.DataFrame(data, schema=schema)


def make_fake_analysis(
    n_ranks: int = 4,
    steps: int = 3,
    layers: int = 2,
    experts: int = 8,
    ranks_per_host: int = 8,
    straggler: int | None = 2,
    straggler_ms: float = 2.0,
    hot_share: float = 0.4,
    tokens: int = 512,
    top_k: int = 2,
    with_routing: bool = True,
    with_events: bool = True,
    findings: bool = True,
) -> Analysis:
    """Build an :class:`Analysis` with exact, documented values (see the module docstring)."""
    ranks = np.arange(n_ranks, dtype=np.int32)
    hosts = [f"node{r // ranks_per_host}" for r in ranks]
    layer_us = sum(STAGE_US.values())  # 1230 µs
    step_ns = int(layers * layer_us * 1000 * 1.25 + (straggler_ms * MS if straggler is not None else 0))
    gap_ns = 1 * MS
    wait_per_layer = int(straggler_ms * MS / layers) if straggler is not None else 0

    # ---- stages + intervals --------------------------------------------------------------------
    st_rows: dict[str, list] = {k: [] for k in ("rank", "step", "layer", "stage", "start_ns", "end_ns", "busy_ns")}
    iv_rows: dict[str, list] = {k: [] for k in ("rank", "step", "track", "name", "start_ns", "end_ns")}
    cr_rows: dict[str, list] = {
        k: [] for k in ("match_id", "rank", "start_ns", "end_ns", "wait_ns", "transfer_ns", "bytes_sent", "bytes_recv")
    }
    call_rows: dict[str, list] = {
        k: []
        for k in (
            "match_id",
            "step",
            "layer",
            "direction",
            "last_rank",
            "arrival_ns",
            "arrival_skew_ns",
            "transfer_ns",
            "bytes_max",
            "link_class",
        )
    }
    match_id = 0
    for s in range(steps):
        s0 = T0 + s * (step_ns + gap_ns)
        for li in range(layers):
            t = s0 + li * int(layer_us * 1250)
            for stage in STAGE_ORDER:
                dur = STAGE_US[stage] * 1000
                for r in ranks:
                    extra = 0
                    if stage == "expert" and straggler is not None and r == straggler:
                        extra = wait_per_layer  # the straggler computes longer
                    wait = wait_per_layer if (stage == "dispatch" and straggler is not None and r != straggler) else 0
                    start = t
                    end = t + dur + extra + wait
                    st_rows["rank"].append(int(r))
                    st_rows["step"].append(s)
                    st_rows["layer"].append(li)
                    st_rows["stage"].append(stage)
                    st_rows["start_ns"].append(start)
                    st_rows["end_ns"].append(end)
                    st_rows["busy_ns"].append(dur + extra)
                    iv_rows["rank"].append(int(r))
                    iv_rows["step"].append(s)
                    iv_rows["track"].append("stage")
                    iv_rows["name"].append(format_stage_name(stage, li))
                    iv_rows["start_ns"].append(start)
                    iv_rows["end_ns"].append(end)
                if stage in ("dispatch", "combine"):
                    # the all-to-all: last arriver = straggler (in dispatch), everyone else waits.
                    for direction in ("count", stage) if stage == "dispatch" else (stage,):
                        xfer = dur // 2
                        arrival = t + (wait_per_layer if direction == "dispatch" else 0)
                        call_rows["match_id"].append(match_id)
                        call_rows["step"].append(s)
                        call_rows["layer"].append(li)
                        call_rows["direction"].append(direction)
                        last = straggler if (direction == "dispatch" and straggler is not None) else n_ranks - 1
                        call_rows["last_rank"].append(int(last))
                        call_rows["arrival_ns"].append(arrival)
                        call_rows["arrival_skew_ns"].append(arrival - t)
                        call_rows["transfer_ns"].append(xfer)
                        nbytes = 64 * n_ranks if direction == "count" else tokens * top_k * 256 * 4 // max(n_ranks, 1)
                        call_rows["bytes_max"].append(nbytes)
                        call_rows["link_class"].append("intra_host" if n_ranks <= ranks_per_host else "inter_host")
                        for r in ranks:
                            start = t if (direction != "dispatch" or r != straggler) else arrival
                            w = arrival - start
                            cr_rows["match_id"].append(match_id)
                            cr_rows["rank"].append(int(r))
                            cr_rows["start_ns"].append(start)
                            cr_rows["end_ns"].append(arrival + xfer)
                            cr_rows["wait_ns"].append(w)
                            cr_rows["transfer_ns"].append(xfer)
                            cr_rows["bytes_sent"].append(nbytes)
                            cr_rows["bytes_recv"].append(nbytes)
                            iv_rows["rank"].append(int(r))
                            iv_rows["step"].append(s)
                            iv_rows["track"].append("comm")
                            iv_rows["name"].append(f"all_to_all:{direction}")
                            iv_rows["start_ns"].append(start)
                            iv_rows["end_ns"].append(arrival + xfer)
                            if w:
                                iv_rows["rank"].append(int(r))
                                iv_rows["step"].append(s)
                                iv_rows["track"].append("wait")
                                iv_rows["name"].append(f"wait for rank {last}")
                                iv_rows["start_ns"].append(start)
                                iv_rows["end_ns"].append(arrival)
                            iv_rows["rank"].append(int(r))
                            iv_rows["step"].append(s)
                            iv_rows["track"].append("exposed_comm")
                            iv_rows["name"].append("exposed comm")
                            iv_rows["start_ns"].append(start + xfer // 2)
                            iv_rows["end_ns"].append(arrival + xfer)
                        match_id += 1
                t += int(dur * 1.25)

    stages = pl.DataFrame(st_rows).with_columns(
        pl.col("rank").cast(pl.Int32),
        pl.col("step").cast(pl.Int64),
        pl.col("layer").cast(pl.Int32),
        pl.lit(0, pl.Int32).alias("microbatch"),
        pl.lit("fwd").alias("phase"),
        pl.col("start_ns").alias("cpu_start_ns"),
        pl.col("end_ns").alias("cpu_end_ns"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("window_ns"),
        pl.lit("ep_trace").alias("method"),
    )
    stages = (
        conform("stages", stages)
        .with_columns(
            pl.when(pl.col("stage").is_in(["dispatch", "combine"]))
            .then(pl.col("window_ns"))
            .otherwise(0)
            .alias("comm_ns"),
        )
        .with_columns(
            (pl.col("comm_ns") // 4).alias("overlapped_ns"),
        )
        .with_columns((pl.col("comm_ns") - pl.col("overlapped_ns")).alias("exposed_comm_ns"))
    )

    intervals = pl.DataFrame(
        iv_rows,
        schema={
            "rank": pl.Int32,
            "step": pl.Int64,
            "track": pl.Utf8,
            "name": pl.Utf8,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
        },
    )
    call_ranks = pl.DataFrame(
        cr_rows,
        schema={
            "match_id": pl.Int64,
            "rank": pl.Int32,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "wait_ns": pl.Int64,
            "transfer_ns": pl.Int64,
            "bytes_sent": pl.Int64,
            "bytes_recv": pl.Int64,
        },
    )
    call_ranks = call_ranks.with_columns(pl.col("bytes_sent").alias("cross_rank_bytes_sent"))
    calls = pl.DataFrame(
        call_rows,
        schema={
            "match_id": pl.Int64,
            "step": pl.Int64,
            "layer": pl.Int32,
            "direction": pl.Utf8,
            "last_rank": pl.Int32,
            "arrival_ns": pl.Int64,
            "arrival_skew_ns": pl.Int64,
            "transfer_ns": pl.Int64,
            "bytes_max": pl.Int64,
            "link_class": pl.Utf8,
        },
    )
    calls = calls.with_columns(
        pl.lit("all_to_allv").alias("collective"),
        pl.lit("0").alias("pg_name"),
        pl.lit("seq").alias("key"),
        pl.lit(n_ranks, pl.Int32).alias("n_ranks"),
        pl.lit(0, pl.Int64).alias("end_skew_ns"),
    ).select(
        "match_id",
        "collective",
        "pg_name",
        "key",
        "step",
        "layer",
        "direction",
        "n_ranks",
        "last_rank",
        "arrival_ns",
        "arrival_skew_ns",
        "end_skew_ns",
        "transfer_ns",
        "bytes_max",
        "link_class",
    )

    # ---- steps / rank_summary ------------------------------------------------------------------
    comm_per = (
        call_ranks.join(calls.select("match_id", "step"), on="match_id")
        .group_by("rank", "step")
        .agg(
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("comm_ns"),
            pl.col("wait_ns").sum().alias("barrier_wait_ns"),
            pl.col("transfer_ns").sum().alias("transfer_ns"),
        )
    )
    steps_df = (
        pl.DataFrame(
            {
                "rank": np.repeat(ranks, steps),
                "step": np.tile(np.arange(steps, dtype=np.int64), n_ranks),
            }
        )
        .with_columns(
            (pl.lit(T0) + pl.col("step") * (step_ns + gap_ns)).alias("start_ns"),
        )
        .with_columns(
            (pl.col("start_ns") + step_ns + pl.col("rank").cast(pl.Int64) * 1000).alias("end_ns"),
        )
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("step_time_ns"))
        .join(comm_per, on=["rank", "step"], how="left")
    )
    steps_df = (
        steps_df.with_columns(
            (pl.col("step_time_ns") - pl.col("comm_ns")).alias("compute_ns"),
            (pl.col("comm_ns") // 4).alias("overlapped_ns"),
        )
        .with_columns((pl.col("comm_ns") - pl.col("overlapped_ns")).alias("exposed_comm_ns"))
        .select(
            "rank",
            "step",
            "start_ns",
            "end_ns",
            "step_time_ns",
            "comm_ns",
            "compute_ns",
            "overlapped_ns",
            "exposed_comm_ns",
            "barrier_wait_ns",
            "transfer_ns",
        )
    )
    host_df = pl.DataFrame({"rank": ranks, "host": hosts})
    rank_summary = (
        steps_df.group_by("rank")
        .agg(
            pl.col("step_time_ns").median().cast(pl.Int64).alias("step_time_ns"),
            pl.col("step_time_ns").max().alias("step_time_max_ns"),
            pl.col("comm_ns").mean().cast(pl.Int64),
            pl.col("compute_ns").mean().cast(pl.Int64),
            pl.col("exposed_comm_ns").mean().cast(pl.Int64),
            (pl.col("overlapped_ns").sum() / pl.col("comm_ns").sum()).alias("overlap_efficiency"),
            pl.col("barrier_wait_ns").mean().cast(pl.Int64),
            pl.col("transfer_ns").mean().cast(pl.Int64),
        )
        .join(host_df, on="rank")
        .sort("rank")
        .select(
            "rank",
            "host",
            "step_time_ns",
            "step_time_max_ns",
            "comm_ns",
            "compute_ns",
            "exposed_comm_ns",
            "overlap_efficiency",
            "barrier_wait_ns",
            "transfer_ns",
        )
    )

    # ---- wait matrix / stragglers --------------------------------------------------------------
    wm = call_ranks.join(calls.select("match_id", "last_rank"), on="match_id").filter(pl.col("wait_ns") > 0)
    wait_matrix = (
        wm.group_by(
            pl.lit("0").alias("pg_name"), pl.col("rank").alias("waiter"), pl.col("last_rank").alias("waited_for")
        )
        .agg(pl.col("wait_ns").sum())
        .sort("waiter", "waited_for")
    )
    stragglers = (
        calls.group_by(pl.col("last_rank").alias("rank"))
        .agg(pl.len().cast(pl.Int64).alias("times_last"))
        .join(
            wait_matrix.group_by(pl.col("waited_for").alias("rank")).agg(
                pl.col("wait_ns").sum().alias("induced_wait_ns")
            ),
            on="rank",
            how="left",
        )
        .with_columns(pl.col("induced_wait_ns").fill_null(0))
        .sort("induced_wait_ns", descending=True)
    )

    # ---- routing -------------------------------------------------------------------------------
    if with_routing:
        per_rank_assign = tokens * top_k
        share = np.full(experts, (1 - hot_share) / (experts - 1))
        share[0] = hot_share
        counts = np.round(share * per_rank_assign).astype(np.int64)
        el_rows = {"step": [], "layer": [], "expert": [], "count": []}
        cm_rows = {"step": [], "layer": [], "src": [], "dst": [], "rows": []}
        owner = np.arange(experts) * n_ranks // experts
        for s in range(steps):
            for li in range(layers):
                for e in range(experts):
                    el_rows["step"].append(s)
                    el_rows["layer"].append(li)
                    el_rows["expert"].append(e)
                    el_rows["count"].append(int(counts[e]) * n_ranks)
                per_dst = np.bincount(owner, weights=counts, minlength=n_ranks).astype(np.int64)
                for src in range(n_ranks):
                    for dst in range(n_ranks):
                        cm_rows["step"].append(s)
                        cm_rows["layer"].append(li)
                        cm_rows["src"].append(src)
                        cm_rows["dst"].append(dst)
                        cm_rows["rows"].append(int(per_dst[dst]))
        expert_load = pl.DataFrame(
            el_rows, schema={"step": pl.Int64, "layer": pl.Int32, "expert": pl.Int32, "count": pl.Int64}
        )
        cm = pl.DataFrame(cm_rows).with_columns(
            pl.lit(0).alias("microbatch"),
            pl.lit("dispatch").alias("direction"),
            pl.lit(0).alias("call"),
            pl.lit(256 * 4).alias("row_bytes"),
            pl.lit("sidecar").alias("source"),
        )
        count_matrix = conform("routing_matrix", cm)
        rank_load = (
            cm.group_by("step", "layer", pl.col("dst").alias("rank"))
            .agg(pl.col("rows").sum().alias("recv_rows"))
            .join(
                cm.group_by("step", "layer", pl.col("src").alias("rank")).agg(pl.col("rows").sum().alias("send_rows")),
                on=["step", "layer", "rank"],
            )
            .with_columns(pl.col("rank").cast(pl.Int32), pl.col("layer").cast(pl.Int32))
            .sort("step", "layer", "rank")
        )
        i_e = float(counts.max() / counts.mean())
        per_dst = np.bincount(owner, weights=counts, minlength=n_ranks)
        i_r = float(per_dst.max() / per_dst.mean())
        imbalance = pl.DataFrame(
            {
                "step": np.repeat(np.arange(steps, dtype=np.int64), layers),
                "layer": np.tile(np.arange(layers, dtype=np.int32), steps),
            }
        ).with_columns(
            pl.lit(i_e).alias("I_e"),
            pl.lit(i_r).alias("I_r"),
            pl.lit(1.0).alias("I_r_send"),
            pl.lit(1.0 / n_ranks).alias("local_ratio"),
            pl.lit(0.0 if n_ranks <= ranks_per_host else 1 - ranks_per_host / n_ranks).alias("cross_node_ratio"),
        )
    else:
        expert_load = pl.DataFrame(schema={"step": pl.Int64, "layer": pl.Int32, "expert": pl.Int32, "count": pl.Int64})
        count_matrix = empty("routing_matrix")
        rank_load = pl.DataFrame(
            schema={"step": pl.Int64, "layer": pl.Int32, "rank": pl.Int32, "recv_rows": pl.Int64, "send_rows": pl.Int64}
        )
        imbalance = pl.DataFrame(
            schema={
                "step": pl.Int64,
                "layer": pl.Int32,
                "I_e": pl.Float64,
                "I_r": pl.Float64,
                "I_r_send": pl.Float64,
                "local_ratio": pl.Float64,
                "cross_node_ratio": pl.Float64,
            }
        )

    split_violations = pl.DataFrame(
        schema={
            "step": pl.Int64,
            "call": pl.Int64,
            "src": pl.Int32,
            "dst": pl.Int32,
            "sent": pl.Int64,
            "received": pl.Int64,
        }
    )
    alpha_beta = pl.DataFrame(
        {
            "link_class": ["intra_host"],
            "alpha_us": [25.0],
            "beta_gbps": [12.5],
            "r2": [0.97],
            "n": [calls.height],
            "verdict": ["latency_bound"],
        }
    )
    host_stalls = pl.DataFrame(
        {
            "rank": [0],
            "step": [0],
            "layer": [0],
            "stage": ["dispatch"],
            "name": ["cudaStreamSynchronize"],
            "start_ns": [T0 + 100_000],
            "end_ns": [T0 + 150_000],
            "stall_ns": [50_000],
        },
        schema_overrides={"rank": pl.Int32, "step": pl.Int64, "layer": pl.Int32},
    )
    n_hosts = len(set(hosts))
    clock = pl.DataFrame(
        {"host": sorted(set(hosts)), "offset_ns": [0] * n_hosts, "residual_ns": [0 if n_hosts == 1 else 3000] * n_hosts}
    )

    # ---- tables --------------------------------------------------------------------------------
    ranks_tbl = conform(
        "ranks",
        pl.DataFrame(
            {
                "rank": ranks,
                "world_size": [n_ranks] * n_ranks,
                "host": hosts,
                "local_rank": ranks % ranks_per_host,
                "device": ["cpu"] * n_ranks,
                "backend": ["gloo"] * n_ranks,
                "source_file": [f"rank{r}.pt.trace.json.gz" for r in ranks],
                "format": ["kineto"] * n_ranks,
                "trace_start_ns": [T0] * n_ranks,
                "trace_end_ns": [T0 + steps * (step_ns + gap_ns)] * n_ranks,
                "clock_offset_ns": [0] * n_ranks,
                "rank_source": ["distributedInfo"] * n_ranks,
                "has_sidecar": [True] * n_ranks,
                "num_experts": [experts] * n_ranks,
                "top_k": [top_k] * n_ranks,
            }
        ),
    )
    if with_events:
        ev = stages.select("rank", "step", "layer", "stage", "start_ns", "end_ns").with_row_index("event_id")
        events = conform(
            "events",
            ev.with_columns(
                pl.lit("cpu_annotation").alias("kind"),
                pl.struct("stage", "layer")
                .map_elements(lambda d: format_stage_name(d["stage"], d["layer"]), return_dtype=pl.Utf8)
                .alias("name"),
                pl.lit("user_annotation").alias("category"),
                pl.lit(100).alias("pid"),
                pl.lit(100).alias("tid"),
                pl.col("event_id").cast(pl.Int64),
            ),
        )
    else:
        events = empty("events")
    tables = TraceTables(ranks=ranks_tbl, events=events, collectives=empty("collectives"), routing_matrix=count_matrix)

    find: tuple[Finding, ...] = ()
    if findings:
        find = tuple(
            f
            for f in (
                Finding(
                    "straggler_wait",
                    "high",
                    f"Rank {straggler} arrives last in every dispatch; the other ranks wait {straggler_ms:.1f} ms per step",
                    int(straggler_ms * MS),
                    {"straggler": straggler, "wait_ms": straggler_ms},
                    f"Find why rank {straggler} computes longer (expert load, thermal, host contention)",
                    ranks=(straggler,) if straggler is not None else (),
                )
                if straggler is not None
                else None,
                Finding(
                    "routing_imbalance",
                    "medium",
                    f"Expert 0 receives {hot_share:.0%} of the assignments (I_e = {counts.max() / counts.mean():.2f})"
                    if with_routing
                    else "routing",
                    400_000,
                    {"I_e": 3.2},
                    "Replicate the hot expert or re-place experts",
                    layers=tuple(range(layers)),
                )
                if with_routing
                else None,
                Finding(
                    "exposed_comm",
                    "low",
                    "75% of all-to-all time is exposed (not overlapped with compute)",
                    150_000,
                    {"exposed_ms": 0.15},
                    "Chunk dispatch-GEMM-combine so communication overlaps compute",
                ),
            )
            if f is not None
        )

    # ---- breakdown / top kernels (exact from the steps table: no host stalls in this job) ------
    breakdown = steps_df.select(
        pl.col("rank").cast(pl.Int32),
        pl.col("step").cast(pl.Int64),
        (pl.col("compute_ns") - pl.col("overlapped_ns")).alias("compute_ns"),
        pl.col("overlapped_ns").alias("overlapped_comm_ns"),
        (pl.col("exposed_comm_ns") - pl.col("barrier_wait_ns")).clip(0).alias("exposed_comm_ns"),
        pl.min_horizontal("barrier_wait_ns", "exposed_comm_ns").alias("barrier_wait_ns"),
        pl.lit(0, pl.Int64).alias("copy_ns"),
        pl.lit(0, pl.Int64).alias("host_stall_ns"),
        (pl.col("step_time_ns") - pl.col("compute_ns") - pl.col("exposed_comm_ns")).alias("idle_ns"),
        "step_time_ns",
    )
    top_kernels = pl.DataFrame(
        {
            "rank": np.repeat(ranks, 2),
            "name": ["grouped_gemm", "ncclDevKernel_AllToAll"] * n_ranks,
            "stage": ["expert", "dispatch"] * n_ranks,
            "total_ns": np.tile([500_000 * layers * steps, 300_000 * layers * steps], n_ranks).astype(np.int64),
            "count": np.full(2 * n_ranks, layers * steps, dtype=np.int64),
        },
        schema_overrides={"rank": pl.Int32},
    )
    top_ops = top_kernels.with_columns(
        pl.col("name").replace({"grouped_gemm": "aten::mm", "ncclDevKernel_AllToAll": "c10d::alltoall_base_"})
    )

    return Analysis(
        config=AnalysisConfig(),
        tables=tables,
        rank_summary=rank_summary,
        steps=steps_df,
        stages=stages,
        calls=calls,
        call_ranks=call_ranks,
        wait_matrix=wait_matrix,
        stragglers=stragglers,
        expert_load=expert_load,
        rank_load=rank_load,
        imbalance=imbalance,
        count_matrix=count_matrix,
        split_violations=split_violations,
        alpha_beta=alpha_beta,
        host_stalls=host_stalls,
        clock=clock,
        intervals=intervals,
        findings=find,
        detection_method="ep_trace",
        load_report=(LoadIssue("rank9.pt.trace.json.gz", 9, "error", "truncated gzip stream: rank skipped"),)
        if n_ranks > 8
        else (),
        notes=("synthetic analysis for tests",),
        breakdown=breakdown,
        top_kernels=top_kernels,
        top_ops=top_ops,
    )

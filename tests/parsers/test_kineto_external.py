"""Every Kineto trace of ../shared/external/kineto against an independent brute-force scan.

The scan uses the plain ``json`` module and ``decimal`` (no ep-trace code): counts of kernels,
streams and host threads, exact start/end times of every kernel, and the collective calls (outermost
``c10d::`` op, or ``nccl:``/``gloo:`` title outside any, per thread; ``gloo:`` ranges on worker
threads) with their type. Known answers from external/README.md are pinned too.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from ep_trace.parsers import read_kineto, read_trace_dir

from .decoder_paths import decoder  # noqa: F401 - the fixture, used by pytestmark

pytestmark = pytest.mark.usefixtures("decoder")

FILES = [
    "param_dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz",
    "param_dlrm_8rank/worker7_step_12.1694128201553.pt.trace.json.gz",
    "hta_torchrec_pair/sampled_rank-0.json.gz",
    "hta_torchrec_pair/sampled_rank-1.json.gz",
    "hta_nccl_metadata/nccl_data.json.gz",
    "hta_torchrec16_rank0/rank0.json.gz",
    "edge_cases/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "edge_cases/distributed_info_not_found.json.gz",
]

_TYPE = {
    "alltoall_base_": "all_to_all",
    "all_to_all": "all_to_all",
    "allreduce_": "allreduce",
    "all_reduce": "allreduce",
    "_allgather_base_": "allgather",
    "_all_gather_base": "allgather",
    "_reduce_scatter_base_": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
}


def _scan(path: Path) -> dict:
    doc = json.loads(gzip.open(path).read())
    base = doc.get("baseTimeNanoseconds", 0)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]

    def ns(v) -> int:
        return int((Decimal(repr(v)) * 1000).to_integral_value())

    kernels = [e for e in xs if e.get("cat") == "kernel"]
    dev_cats = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
    host_cats = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"}
    # collective calls, brute force O(n^2) over the few markers
    marks = [
        e
        for e in xs
        if e.get("cat") in ("cpu_op", "user_annotation")
        and (e["name"].startswith("c10d::") or e["name"][:5] in ("nccl:", "gloo:"))
        and "wait" not in e["name"]
    ]
    callers = {
        (e["pid"], e["tid"]) for e in xs if e["name"].startswith(("c10d::", "ProfilerStep#", "record_param_comms"))
    }
    calls = []
    for e in marks:
        inside = any(
            o is not e
            and (o["pid"], o["tid"]) == (e["pid"], e["tid"])
            and o["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
            for o in marks
        )
        if not inside:
            calls.append((e["ts"], _TYPE[e["name"].split(":")[-1]]))
    return {
        "doc": doc,
        "n_x": len(xs),
        "kernels": len(kernels),
        "kernel_times": sorted((base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"])) for e in kernels),
        "streams": len({e["tid"] for e in xs if e.get("cat") in dev_cats}),
        "threads": len({(e["pid"], e["tid"]) for e in xs if e.get("cat") in host_cats}),
        "calls": [t for _, t in sorted(calls)],
        "worker_calls": sum(1 for e in marks if (e["pid"], e["tid"]) not in callers),
    }


@pytest.mark.parametrize("rel", FILES)
def test_matches_brute_force_scan(external_dir, rel):
    path = external_dir / "kineto" / rel
    want = _scan(path)
    t = read_kineto(path)
    ev = t.events
    assert ev.height == want["n_x"]
    k = ev.filter(pl.col("kind") == "gpu_kernel")
    assert k.height == want["kernels"]
    assert sorted(k.select("start_ns", "end_ns").iter_rows()) == want["kernel_times"]
    assert (
        ev.filter(pl.col("kind").is_in(["gpu_kernel", "gpu_memcpy", "gpu_memset", "gpu_annotation"]))[
            "stream"
        ].n_unique()
        == want["streams"]
        or want["streams"] == 0
    )
    assert (
        ev.filter(pl.col("kind").is_in(["cpu_op", "cpu_annotation", "runtime", "comm_worker"]))
        .select("pid", "tid")
        .unique()
        .height
        == want["threads"]
    )
    got = t.collectives.sort(pl.coalesce("cpu_start_ns", "start_ns"))["collective"].to_list()
    assert sorted(got) == sorted(want["calls"]) and len(got) == len(want["calls"])
    assert t.events.filter(pl.col("kind") == "comm_worker").height == want["worker_calls"]
    dist = want["doc"].get("distributedInfo", {})
    assert t.ranks["rank"][0] == dist.get("rank", 0)
    assert t.ranks["world_size"][0] == dist.get("world_size")


def test_param_dlrm_8rank_known_answers(external_dir):
    t = read_trace_dir(external_dir / "kineto" / "param_dlrm_8rank")
    assert t.ranks["rank"].to_list() == list(range(8)) and set(t.ranks["world_size"]) == {8}
    c = t.collectives
    assert c.group_by("rank").len()["len"].to_list() == [8] * 8
    seq = c.filter(pl.col("rank") == 0).sort("start_ns")["collective"].to_list()
    assert seq == ["all_to_all"] * 4 + ["allreduce", "all_to_all", "allreduce", "allreduce"]
    for r in range(8):  # same sequence of device activity on every rank
        assert c.filter(pl.col("rank") == r).sort("start_ns")["collective"].to_list() == seq
    first = c.filter(pl.col("ordinal") == 0).sort("rank")
    assert ((first["end_ns"] - first["start_ns"]) // 1000).to_list() == [2146, 7635, 518, 6132, 4882, 4679, 514, 10]
    assert first["start_ns"].max() - first["start_ns"].min() == 7_624_000
    assert first["end_ns"].max() - first["end_ns"].min() == 2_000
    assert first["start_ns"].arg_max() == 7
    # link by containment: External id == correlation, no CPU op has it
    nccl = t.events.filter(pl.col("name").str.starts_with("ncclKernel"))
    ops = t.events.select("rank", pl.col("event_id").alias("op_id"), pl.col("name").alias("op"))
    linked = nccl.join(ops, on=["rank", "op_id"], how="left")
    assert linked.height == 64 and linked["op"].null_count() == 0
    assert linked.group_by("op").len().sort("op").rows() == [("nccl:all_reduce", 24), ("nccl:all_to_all", 40)]
    assert (nccl["external_id"] == nccl["correlation"]).all() and nccl["coll_id"].null_count() == 0


def test_torchrec16_sendrecv_kernels_serve_every_collective(external_dir):
    t = read_kineto(external_dir / "kineto" / "hta_torchrec16_rank0" / "rank0.json.gz")
    k = t.events.filter(pl.col("name").str.starts_with("ncclKernel"))
    assert k.height == 80 and set(k["name"].str.slice(0, 24)) == {"ncclKernel_SendRecv_RING"}
    assert k.group_by("stream").len().sort("stream").rows() == [(84, 36), (285, 22), (363, 22)]
    per_type = (
        k.join(t.collectives.select("coll_id", "collective"), on="coll_id", how="left")
        .group_by("collective")
        .len()
        .sort("collective")
    )
    assert per_type.rows() == [
        (None, 5),
        ("all_to_all", 45),
        ("allgather", 10),
        ("allreduce", 10),
        ("reduce_scatter", 10),
    ]
    assert k.filter(pl.col("coll_id").is_null())["launch_id"].null_count() == 5  # no launch in the window


def test_nccl_metadata_trace(external_dir):
    t = read_kineto(external_dir / "kineto" / "hta_nccl_metadata" / "nccl_data.json.gz")
    c = t.collectives
    assert c.group_by("collective").len().sort("collective").rows() == [
        ("allreduce", 15),
        ("broadcast", 6),
    ]  # 6 waits dropped
    assert set(c["pg_name"]) == {"0"} and set(c["pg_desc"]) == {"default_pg"}
    assert c["group_ranks"].to_list() == [[0, 1]] * 21 and set(c["group_size"]) == {2}
    assert c["seq"].null_count() == 21 and c["comms_id"].null_count() == 21
    first_ar = c.filter(pl.col("collective") == "allreduce").row(0, named=True)
    assert (first_ar["in_nelems"], first_ar["out_nelems"], first_ar["dtype"], first_ar["in_splits"]) == (
        2049000,
        2049000,
        "Float",
        None,
    )
    k = t.events.filter(pl.col("name").str.starts_with("ncclKernel"))
    names = t.events.select(pl.col("event_id").alias("op_id"), pl.col("name").alias("op"))
    assert set(k.join(names, on="op_id")["op"]) == {"record_param_comms"}  # direct External id link (2024)
    assert (k["external_id"] != k["correlation"]).all() and set(k["stream"]) == {40}
    assert t.events.filter(pl.col("kind") == "gpu_annotation").height == 30
    assert t.ranks["trace_start_ns"][0] > 1711964646000000000  # baseTimeNanoseconds applied


def test_gloo_edge_case_rank34(external_dir):
    t = read_kineto(external_dir / "kineto" / "edge_cases" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert (t.ranks["rank"][0], t.ranks["world_size"][0], t.ranks["backend"][0], t.ranks["device"][0]) == (
        34,
        300,
        "gloo",
        "cpu",
    )
    w = t.events.filter(pl.col("kind") == "comm_worker")
    assert w.height == 10 and set(w["tid"]) == {3553, 3554}
    c = t.collectives
    assert c.height == 10 and set(c["collective"]) == {"allreduce"} and set(c["backend"]) == {"gloo"}
    assert sorted(set(c["in_nelems"])) == [321271, 2082411]
    durs = (c["end_ns"] - c["start_ns"]) // 1_000_000
    assert durs.min() == 156 and durs.max() == 380


def test_distributed_info_missing(external_dir, tmp_path):
    p = external_dir / "kineto" / "edge_cases" / "distributed_info_not_found.json.gz"
    t = read_kineto(p)
    assert t.ranks["rank_source"][0] == "default" and t.load_report[0].level == "warning"
    assert t.collectives.height == 6 and set(t.collectives["collective"]) == {"all_to_all"}
    assert set(t.collectives["n_kernels"]) == {0}  # CPU-only: host interval kept
    t3 = read_trace_dir(p, rank_map={p.name: 3})
    assert t3.ranks.select("rank", "rank_source").row(0) == (3, "rank_map")

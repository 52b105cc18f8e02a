"""Golden tests of CUPTI record conversion (synthetic records in the cupti-python layout)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ep_trace.capture.cupti.convert import records_to_events
from ep_trace.schema import EVENTS, validate

DATA = Path(__file__).resolve().parents[1] / "data" / "cupti" / "moe_step_records.json"
B = 1_764_400_000_000_000_000
OFF = 250


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def events(doc: dict) -> pl.DataFrame:
    return records_to_events(
        doc["records"], rank=doc["rank"], ranges=doc["ranges"], clock_offset_ns=doc["clock_offset_ns"]
    )


def test_schema_and_order(events: pl.DataFrame) -> None:
    assert events.schema == EVENTS
    validate("events", events, "golden")
    # 20 records (1 without timestamps dropped, 7 external-correlation records are links, not rows)
    # + 3 ranges = 16 rows, ids 0..15 in start order.
    assert events["event_id"].to_list() == list(range(16))
    assert events["name"].to_list() == [
        "ProfilerStep#3",
        "ep:dispatch:l0:fwd",
        "cudaLaunchKernel",
        events["name"][3],
        "cudaMemcpyAsync",
        "cudaStreamSynchronize",
        "Memcpy DtoH (Device -> Pinned)",
        "cuLaunchKernelEx",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        "ep:expert:l0:fwd",
        "cudaMemsetAsync",
        "Memset (Device)",
        "cudaLaunchKernel",
        "ampere_sgemm_128x64_tn",
        "cudaLaunchKernel",
        events["name"][15],
    ]
    assert events["name"][3].startswith("void at::native::vectorized_elementwise_kernel<4")
    assert events["kind"].to_list() == [
        "cpu_annotation",
        "cpu_annotation",
        "runtime",
        "gpu_kernel",
        "runtime",
        "runtime",
        "gpu_memcpy",
        "runtime",
        "gpu_kernel",
        "cpu_annotation",
        "runtime",
        "gpu_memset",
        "runtime",
        "gpu_kernel",
        "runtime",
        "gpu_kernel",
    ]
    assert events["category"].to_list()[:9] == [
        "user_annotation",
        "user_annotation",
        "cuda_runtime",
        "kernel",
        "cuda_runtime",
        "cuda_runtime",
        "gpu_memcpy",
        "cuda_driver",
        "kernel",
    ]


def test_exact_times_with_clock_offset(events: pl.DataFrame) -> None:
    rel = events.select((pl.col("start_ns") - B - OFF).alias("s"), (pl.col("end_ns") - B - OFF).alias("e"))
    assert rel["s"].to_list() == [
        500,
        1000,
        1100,
        1500,
        2600,
        2950,
        3000,
        3500,
        4000,
        9500,
        9600,
        9800,
        10000,
        10500,
        20500,
        21000,
    ]
    assert rel["e"].to_list() == [
        22000,
        9000,
        1400,
        2500,
        2900,
        3300,
        3200,
        3800,
        8000,
        20000,
        9700,
        9900,
        10300,
        18000,
        20800,
        21500,
    ]


def test_launch_links_by_correlation(events: pl.DataFrame) -> None:
    dev = events.filter(pl.col("kind").cast(pl.Utf8).str.starts_with("gpu_"))  # kind is an Enum
    assert dev.select("event_id", "correlation", "launch_id").rows() == [
        (3, 101, 2),
        (6, 102, 4),
        (8, 104, 7),  # NCCL kernel launched through the driver API (cuLaunchKernelEx)
        (11, 105, 10),
        (13, 106, 12),
        (15, 107, 14),
    ]
    # Runtime rows never carry launch_id; host rows never carry device/stream.
    assert events.filter(pl.col("kind") == "runtime")["launch_id"].null_count() == 7
    assert dev["device"].to_list() == [0] * 6
    assert dev["stream"].to_list() == [7, 7, 13, 7, 7, 7]
    assert dev["pid"].to_list() == [4242] * 6 and dev["tid"].null_count() == 6
    assert dev.filter(pl.col("kind") != "gpu_kernel")["bytes"].to_list() == [64, 1024]


def test_stage_attribution_through_external_correlation(events: pl.DataFrame) -> None:
    """external id pushed by range_push -> CUDA call -> kernel; op_id = the stage range row."""
    by_name = {r["name"]: r for r in events.iter_rows(named=True)}
    dispatch, expert = by_name["ep:dispatch:l0:fwd"], by_name["ep:expert:l0:fwd"]
    assert (dispatch["external_id"], expert["external_id"]) == (1, 2)
    attributed = events.filter(pl.col("op_id").is_not_null()).select("event_id", "op_id", "external_id").rows()
    assert attributed == [
        (2, 1, 1),
        (3, 1, 1),
        (4, 1, 1),
        (5, 1, 1),
        (6, 1, 1),
        (7, 1, 1),
        (8, 1, 1),
        (10, 9, 2),
        (11, 9, 2),
        (12, 9, 2),
        (13, 9, 2),
    ]
    # The reduce kernel was launched outside any stage; Kineto's CUSTOM0 id 777 is not ours.
    reduce_k = events.row(15, named=True)
    assert (reduce_k["op_id"], reduce_k["external_id"]) == (None, None)
    assert 777 not in events["external_id"].to_list()
    assert events.filter(pl.col("name") == "ProfilerStep#3")["seq"].to_list() == [3]


def test_correlation_ids_collide_across_processes() -> None:
    """CUPTI correlation ids are per process: the link key is (process, correlation)."""
    recs = []
    for pid, t0 in ((100, 0), (200, 50)):
        recs += [
            {
                "kind": 5,
                "cbid": 211,
                "name": "cudaLaunchKernel_v7000",
                "start": 1000 + t0,
                "end": 1010 + t0,
                "process_id": pid,
                "thread_id": pid + 1,
                "correlation_id": 7,
            },
            {
                "kind": 10,
                "name": f"k{pid}",
                "start": 2000 + t0,
                "end": 2100 + t0,
                "device_id": pid // 100,
                "stream_id": 7,
                "correlation_id": 7,
                "process_id": pid,
            },
            {"kind": 39, "external_kind": 5, "external_id": pid, "correlation_id": 7, "process_id": pid},
        ]
    ev = records_to_events(recs, rank=0, event_id_base=10)
    assert ev.select("event_id", "name", "pid", "launch_id", "external_id").rows() == [
        (10, "cudaLaunchKernel", 100, None, 100),
        (11, "cudaLaunchKernel", 200, None, 200),
        (12, "k100", 100, 10, 100),
        (13, "k200", 200, 11, 200),
    ]


def test_runtime_preferred_over_driver_and_unnamed_api() -> None:
    recs = [
        {"kind": 5, "cbid": 211, "start": 10, "end": 40, "process_id": 1, "thread_id": 1, "correlation_id": 3},
        {"kind": 4, "cbid": 307, "start": 20, "end": 30, "process_id": 1, "thread_id": 1, "correlation_id": 3},
        {
            "kind": 10,
            "name": "k",
            "start": 50,
            "end": 60,
            "device_id": 0,
            "stream_id": 7,
            "correlation_id": 3,
            "process_id": 1,
        },
        {"kind": 22, "start": 1, "end": 2},  # MEMCPY2 (peer copies) is not collected: ignored, not an error
    ]
    ev = records_to_events(recs, rank=5)
    assert ev.select("name", "launch_id").rows() == [
        ("cuda_runtime_cbid_211", None),
        ("cuda_driver_cbid_307", None),
        ("k", 0),
    ]
    assert ev["rank"].unique().to_list() == [5]


def test_empty_batch() -> None:
    ev = records_to_events([], rank=0)
    assert ev.height == 0 and ev.schema == EVENTS
